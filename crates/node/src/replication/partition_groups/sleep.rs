//! A shard's partitions whose files sleep while idle (see `ShardHost::sleep_idle`):
//! what is asked of them without waking them, and their waking.

use super::{group_of, PartitionGroups};
use crate::layout::PartitionKey;
use crate::replication::partition_journal::{PartitionAsleep, PartitionJournal};

impl PartitionGroups {
    /// `group`'s journal, its files woken if they sleep; `None` if they changed while
    /// asleep (the group is dropped, to be opened again: [`PartitionGroups::take_reopen`]).
    pub(super) fn woken(&mut self, group: u64) -> Option<&mut PartitionJournal> {
        if let Err(err) = self.host.wake(group) {
            self.fail(err);
            return None;
        }
        self.host.journal_mut(group)
    }

    /// Where the partition's log starts, its files woken or not.
    pub(crate) fn log_start(&mut self, key: PartitionKey) -> Option<u64> {
        let group = group_of(key);
        match self.host.journal_mut(group) {
            Some(journal) => Some(journal.log().start_offset()),
            None => self
                .host
                .journal_asleep(group)
                .map(PartitionAsleep::log_start),
        }
    }

    /// Whether retention could delete a segment of the partition's log at `now_ms`
    /// (awake, with sealed segments; asleep, when its oldest segment is due), its files
    /// not woken to find out.
    pub(crate) fn retention_may_apply(&mut self, key: PartitionKey, now_ms: u64) -> bool {
        let group = group_of(key);
        match self.host.journal_mut(group) {
            Some(journal) => journal.log().segment_count() > 1,
            None => self
                .host
                .journal_asleep(group)
                .is_some_and(|asleep| asleep.retention_may_apply(now_ms)),
        }
    }

    /// Puts the files of partitions just opened from disk to sleep at once (those with
    /// nothing in flight): a start opens thousands, and holding them all awake until the
    /// first pass left what they held freed in fragments between what stays, resident
    /// (10,000 idle partitions: 2.35 to 2.39 KB per partition per member after a restart,
    /// 2.19 to 2.24 KB with this; 2.0 KB before the restart).
    pub(crate) fn sleep_opened(&mut self, keys: impl IntoIterator<Item = PartitionKey>) {
        let groups: Vec<u64> = keys.into_iter().map(group_of).collect();
        self.host.sleep_now(&groups);
    }

    /// Puts idle partitions' files to sleep every `ticks` ticks (at least 1).
    #[cfg(test)]
    pub(crate) fn set_sleep_ticks(&mut self, ticks: u64) {
        self.sleep_ticks = ticks.max(1);
    }

    /// Ticks between two wakes of sleeping groups for the scrub's look (a simulator
    /// run's: 1 looks at one every tick, as the node did before the wait).
    #[cfg(test)]
    pub(crate) fn set_scrub_wake_ticks(&mut self, ticks: u64) {
        self.scrub_wake_ticks = ticks.max(1);
    }

    /// Whole scrub passes over a partition's log since its journal was opened, and
    /// whether a damaged batch found waits for repair (the simulator's convergence).
    #[cfg(test)]
    pub(crate) fn scrubbed(&self, key: PartitionKey) -> Option<(u64, bool)> {
        let group = group_of(key);
        match self.host.journal(group) {
            Some(journal) => Some(journal.scrubbed()),
            None => self
                .host
                .journal_asleep(group)
                .map(PartitionAsleep::scrubbed),
        }
    }

    /// Whether a copy from a peer (repair or state transfer) is rebuilding the
    /// partition's log (files asleep: never).
    #[cfg(test)]
    pub(crate) fn copying(&self, key: PartitionKey) -> bool {
        self.host
            .journal(group_of(key))
            .is_some_and(|journal| journal.behind().is_some())
    }

    /// Files put to sleep and woken since the shard started.
    #[cfg(test)]
    pub(crate) fn sleep_counts(&self) -> (u64, u64) {
        self.host.sleep_counts()
    }

    /// Partitions' files released for the budget of open ones since the shard started.
    #[cfg(test)]
    pub(crate) fn released_over_budget(&self) -> u64 {
        self.host.released_over_budget()
    }

    /// Files put to sleep, woken, and released for the budget of open ones since the
    /// last call (for the metrics).
    pub(crate) fn take_sleep_counts(&mut self) -> (u64, u64, u64) {
        let (slept, woken) = self.host.sleep_counts();
        let now = (slept, woken, self.host.released_over_budget());
        let taken = self.sleep_counts_taken;
        self.sleep_counts_taken = now;
        (now.0 - taken.0, now.1 - taken.1, now.2 - taken.2)
    }

    /// Keeps at most `budget` partitions' files open at once (at least one; see
    /// `ShardHost::set_open_budget`): every use counts, whatever asked for it.
    pub(crate) fn set_open_budget(&mut self, budget: usize) {
        self.host.set_open_budget(budget);
    }

    /// Puts at most `count` idle partitions' files to sleep a pass (at least one; see
    /// `ShardHost::sleep_idle`).
    #[cfg(test)]
    pub(crate) fn set_sleeps_per_pass(&mut self, count: usize) {
        self.host.set_sleeps_per_pass(count);
    }

    /// The journal of a partition (the simulator's reports).
    #[cfg(test)]
    pub(crate) fn journal(&self, key: PartitionKey) -> Option<&PartitionJournal> {
        self.host.journal(group_of(key))
    }
}
