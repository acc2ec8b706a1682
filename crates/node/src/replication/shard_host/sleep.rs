//! A group's files go to sleep while the group is idle: what they hold in memory goes
//! and their descriptors close, and the next step that needs them wakes them, checked
//! to be as they were left. Past the shard's budget of groups using their files, the
//! least recently used lets its descriptors go at once, its journal staying in memory
//! until the idle pass puts it to sleep.
//!
//! The budget counts every use: a client's produce or fetch, a peer's prepare, a
//! commit, a repair, a state transfer, a retirement walk's barrier, the scrub's look.
//! (Until 2026-12-08 only a client's produce or fetch was counted, by the shard: at
//! 30,000 partitions written on three processes, backups woken by prepares and
//! barriers faster than idle files slept held every member past its 20,000
//! descriptors, and 350,000 to 550,000 opens per member were refused. The least
//! recently used group lets its descriptors go rather than sleeping whole: a sleep
//! after a write is a clean close, a few syncs, which would run inside the wake that
//! passed the budget; the seed's 30,000-partition retirement took the same time either
//! way, within noise.)

use super::files::{awake_files, wake_files, AsleepFiles, AwakeFiles, GroupFiles};
use super::{HostError, Journal, ShardHost};
use braid_vsr::StateMachine;

impl<S: StateMachine, J: Journal> ShardHost<S, J> {
    /// Keeps at most `budget` groups' files open (at least one): past it, the least
    /// recently used group lets its descriptors go ([`Journal::release_files`]), to be
    /// opened again by its next use. A partition's open files are up to three
    /// descriptors (a log segment being written, one being read, the header journal).
    pub(crate) fn set_open_budget(&mut self, budget: usize) {
        let awake: Vec<u64> = self
            .files
            .iter()
            .filter(|(_, files)| matches!(files, GroupFiles::Awake(_)))
            .map(|(group, _)| *group)
            .collect();
        self.sleep.set_budget(budget, awake);
        self.release_over_budget();
    }

    /// Lets go the descriptors of the groups past the budget of open ones (see
    /// [`ShardHost::set_open_budget`]). Called at the end of each step and wake, never
    /// in the middle of a turn or while a caller holds a journal. A failure (an index
    /// that could not be written) leaves what it could not release open, and the log
    /// refuses writes if it lost one (the shard reports it at its next write).
    pub(crate) fn release_over_budget(&mut self) {
        for group in self.sleep.take_over() {
            let Some(files) = self.files.get_mut(&group).and_then(GroupFiles::awake) else {
                continue;
            };
            match files.journal.release_files() {
                Ok(()) => self.sleep.released += 1,
                Err(err) => tracing::warn!(group, %err, "releasing a partition's files"),
            }
        }
    }

    /// Groups whose descriptors the budget let go since the host started.
    pub(crate) fn released_over_budget(&self) -> u64 {
        self.sleep.released
    }

    /// Puts to sleep the files of groups not used since the last call whose journal
    /// [`Journal::can_sleep`], at most [`SLEEPS_PER_PASS`](super::files::SLEEPS_PER_PASS)
    /// of them (the simulator draws fewer), going
    /// on from where the last pass stopped: what they hold in memory goes, and the next
    /// step that needs them opens them again, checked to be as they were left. The
    /// idle groups left for a later pass keep their journals, their descriptors let go
    /// by the budget.
    ///
    /// A group whose files cannot be closed as left is dropped, to be opened again
    /// ([`ShardHost::take_reopen`]).
    ///
    /// # Errors
    /// None today.
    pub(crate) fn sleep_idle(&mut self) -> Result<usize, HostError> {
        let used = std::mem::take(&mut self.sleep.used);
        let cursor = self.sleep.cursor;
        let idle = |(group, files): (&u64, &GroupFiles<J>)| {
            let idle = !used.contains(group)
                && matches!(files, GroupFiles::Awake(f) if f.journal.can_sleep());
            idle.then_some(*group)
        };
        let after = self
            .files
            .range(cursor.saturating_add(1)..)
            .filter_map(idle);
        let from_start = self.files.range(..=cursor).filter_map(idle);
        let idle: Vec<u64> = after.chain(from_start).take(self.sleep.per_pass).collect();
        if let Some(last) = idle.last() {
            self.sleep.cursor = *last;
        }
        Ok(self.sleep_now(&idle))
    }

    /// Most groups one idle pass puts to sleep (at least one; the node's is
    /// [`SLEEPS_PER_PASS`](super::files::SLEEPS_PER_PASS)).
    #[cfg(test)]
    pub(crate) fn set_sleeps_per_pass(&mut self, count: usize) {
        self.sleep.per_pass = count.max(1);
    }

    /// Puts to sleep the files of `groups` that are awake and whose journal
    /// [`Journal::can_sleep`], used lately or not: a start puts the partitions it
    /// opened to sleep at once, so that it never holds every one awake together (what
    /// they held freed between the ones that stay would stay resident, fragments).
    /// Returns how many went to sleep.
    pub(crate) fn sleep_now(&mut self, groups: &[u64]) -> usize {
        let mut slept = 0;
        for group in groups {
            if !matches!(self.files.get(group), Some(GroupFiles::Awake(files)) if files.journal.can_sleep())
            {
                continue;
            }
            let Some(GroupFiles::Awake(awake)) = self.files.remove(group) else {
                continue;
            };
            let AwakeFiles {
                journal,
                checkpoints,
            } = *awake;
            let journal = match journal.sleep() {
                Ok(journal) => journal,
                Err(err) => {
                    // Its files could not be closed as left (one removed under it, a
                    // failed sync, an open refused a descriptor): the journal is gone,
                    // and the group is opened again from its files, alone.
                    let reason = format!("closing its idle files: {err}");
                    if err.is_out_of_descriptors() {
                        self.drop_unchanged(*group, reason);
                    } else {
                        self.drop_for_reopen(*group, reason);
                    }
                    continue;
                }
            };
            self.sleep.forget(*group);
            self.files.insert(
                *group,
                GroupFiles::Asleep(Box::new(AsleepFiles {
                    journal,
                    checkpoints,
                })),
            );
            slept += 1;
        }
        self.sleep.slept += slept as u64;
        slept
    }

    /// Files put to sleep and woken since the host started.
    pub(crate) fn sleep_counts(&self) -> (u64, u64) {
        (self.sleep.slept, self.sleep.woken)
    }

    /// Wakes `group`'s files if they sleep (see [`ShardHost::sleep_idle`]). Files
    /// not as they were left drop the group, to be opened again from them
    /// ([`ShardHost::take_reopen`]): it has no journal until then.
    ///
    /// # Errors
    /// Never today; kept for a wake that fails the shard's groups.
    pub(crate) fn wake(&mut self, group: u64) -> Result<(), HostError> {
        self.wake_counted(group, true)
    }

    /// As [`ShardHost::wake`], not counted a use: files woken for a look (the scrub)
    /// go back to sleep at the next [`ShardHost::sleep_idle`].
    ///
    /// # Errors
    /// As [`ShardHost::wake`].
    pub(crate) fn wake_for_a_look(&mut self, group: u64) -> Result<(), HostError> {
        self.wake_counted(group, false)
    }

    /// [`ShardHost::wake`] if `used`, else [`ShardHost::wake_for_a_look`].
    fn wake_counted(&mut self, group: u64, used: bool) -> Result<(), HostError> {
        if !self.files.contains_key(&group) {
            return Ok(());
        }
        let woken = if used {
            awake_files(&mut self.files, &mut self.sleep, group).map(|_| ())
        } else {
            wake_files(&mut self.files, &mut self.sleep, group).map(|_| ())
        };
        if let Err(err) = woken {
            return self.found_changed(group, err);
        }
        self.release_over_budget();
        Ok(())
    }
}
