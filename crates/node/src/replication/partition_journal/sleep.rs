//! A quiescent partition's files let go: its log closed cleanly and its header journal
//! released, kept as the little that reopening them checks and restores. An idle
//! partition held about 870 bytes of them (a heap profile of 10,000 idle partitions).

use std::sync::Arc;

use super::*;
use crate::replication::journal_file::JournalAsleep;
use crate::replication::shared_path::{FileName, SharedPath};
use crate::replication::status::JournalProgress;

/// A partition journal whose files sleep ([`PartitionJournal::sleep`]).
#[derive(Debug)]
pub(crate) struct PartitionAsleep {
    dir: Arc<Path>,
    config: Arc<LogConfig>,
    tag: i32,
    /// The log's offsets when it was closed: it must hold the same when reopened.
    log_start: u64,
    log_next: u64,
    /// Which segment files it had ([`braid_storage::PartitionLog::segments_crc`]).
    log_segments: u32,
    /// When retention would delete a segment (`PartitionLog::retention_due_ms`,
    /// `u64::MAX` for never): a sleeping log gains nothing, so only the clock brings
    /// it closer.
    retention_due_ms: u64,
    index: JournalAsleep,
    tip: u64,
    applied_end: u64,
    scrub_cursor: u64,
    scrub_passes: u64,
    tip_log_end: Option<u64>,
    next_sync: u64,
    off_thread: bool,
}

impl PartitionJournal {
    /// Whether the journal may sleep: nothing in flight (no prepare waiting, no write
    /// to report, no sync running), no copy or repair running, nothing written that a
    /// sync has not covered, and neither file poisoned.
    pub(crate) fn can_sleep(&self) -> bool {
        self.in_flight.is_none()
            && self.behind.is_none()
            // Damage waiting for retention too: asleep, the scrub would find it again
            // at each wake and ask the peers again (the shell simulator's seed 309434).
            && self.damaged_at.is_none()
            // Under `fsync = always` the turn's sync makes a change to the header
            // journal durable; under `interval` and `never` nothing does but the sleep.
            && (!self.index_changed_unsynced || !self.trusted())
            && self.index.can_sleep()
            && self.log.poisoned().is_none()
    }

    /// Lets the files go (the journal must [`PartitionJournal::can_sleep`]): the log is
    /// closed cleanly (synced, its clean-shutdown marker written, so that reopening it
    /// walks nothing), the header journal released, synced first under `fsync =
    /// interval` or `never` (a clean stop of the node counts a sleeping journal as
    /// closed).
    ///
    /// # Errors
    /// Closing the log failed (its sync, above all): the journal is gone, and the
    /// holder must restart the group from its files.
    pub(crate) fn sleep(mut self) -> Result<PartitionAsleep, PartitionJournalError> {
        debug_assert!(self.can_sleep());
        // An index that cannot be read now is due at once: retention's own pass, which
        // wakes the files, meets the error and reports it.
        let retention_due_ms = self
            .log
            .retention_due_ms(self.index.pruned().1.unwrap_or(0))
            .unwrap_or(0);
        let mut index = self.index;
        if self.log.config().fsync != braid_storage::FsyncPolicy::Always {
            index.sync_data_only()?;
        }
        let asleep = PartitionAsleep {
            dir: Arc::clone(self.log.shared_dir()),
            config: Arc::clone(self.log.shared_config()),
            tag: self.log.tag(),
            log_start: self.log.start_offset(),
            log_next: self.log.next_offset(),
            log_segments: self.log.segments_crc(),
            retention_due_ms,
            index: index.sleep(),
            tip: self.tip,
            applied_end: self.applied_end,
            scrub_cursor: self.scrub_cursor,
            scrub_passes: self.scrub_passes,
            tip_log_end: self.tip_log_end,
            next_sync: self.next_sync,
            off_thread: self.off_thread,
        };
        self.log.close()?;
        Ok(asleep)
    }

    /// Group `group`'s journal that went to sleep as `asleep`, its files opened again
    /// and checked to be as they were left.
    ///
    /// # Errors
    /// A file is not as it was left (damage at rest, or a file removed), or IO: the
    /// holder must restart the group, whose open finds and repairs what changed.
    pub(crate) fn wake(
        group: u64,
        asleep: PartitionAsleep,
        now_ms: u64,
    ) -> Result<Self, PartitionJournalError> {
        let PartitionAsleep {
            dir,
            config,
            tag,
            log_start,
            log_next,
            log_segments,
            retention_due_ms: _,
            index,
            tip,
            applied_end,
            scrub_cursor,
            scrub_passes,
            tip_log_end,
            next_sync,
            off_thread,
        } = asleep;
        let log = PartitionLog::reopen_closed(
            Arc::clone(&dir),
            tag,
            config,
            now_ms,
            (log_start, log_next),
            log_segments,
        )?;
        let path = SharedPath::new(Arc::clone(&dir), FileName::Fixed(JOURNAL_FILE));
        // Damage the open cuts may hide reported ops: the mark is made first, as at a
        // restart, so the group's restart distrusts the journal. A lone replica's open
        // changes nothing it finds damaged, as at its start, so that the start that
        // follows names the same file and byte (an outside review of issue 24: a bit
        // flipped in a sleeping partition's `vsr.journal` was rewritten away at the
        // wake, and the refusal then named only "op 1").
        let lone = log.config().recovery != braid_storage::RecoveryMode::TruncateAtDamage;
        let reported_unsynced = log.config().fsync != braid_storage::FsyncPolicy::Always;
        let index = JournalFile::wake(path, group, &index, lone, reported_unsynced, || {
            open::mark_untrusted(&dir)
        })?;
        Ok(Self {
            index,
            log,
            in_flight: None,
            tip,
            off_thread,
            next_sync,
            behind: None,
            applied_end,
            scrub_cursor,
            scrub_passes,
            damaged_at: None,
            damage_expired_below: None,
            index_changed_unsynced: false,
            tip_log_end,
        })
    }
}

impl PartitionAsleep {
    /// As [`PartitionJournal::progress`]: nothing waits and no copy runs.
    pub(crate) fn progress(&self) -> JournalProgress {
        JournalProgress {
            tip: self.tip,
            waiting: 0,
            copying: None,
        }
    }

    /// As [`PartitionJournal::scrubbed`]: no damage waits (a journal with damage
    /// waiting does not sleep).
    #[cfg(test)]
    pub(crate) fn scrubbed(&self) -> (u64, bool) {
        (self.scrub_passes, false)
    }

    /// Where its log starts.
    pub(crate) fn log_start(&self) -> u64 {
        self.log_start
    }

    /// Whether retention would delete a segment of its log at `now_ms` (waking it is
    /// for those alone: an idle partition with sealed segments under the default
    /// retention by age is not woken every check until its oldest segment expires).
    pub(crate) fn retention_may_apply(&self, now_ms: u64) -> bool {
        self.retention_due_ms != u64::MAX && now_ms >= self.retention_due_ms
    }

    /// As [`PartitionJournal::committed_end`].
    pub(crate) fn committed_end(&self) -> u64 {
        self.applied_end.min(self.log_next).max(self.log_start)
    }
}
