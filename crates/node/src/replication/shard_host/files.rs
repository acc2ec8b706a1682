//! A group's files as the host holds them: awake, or asleep while the group is idle,
//! and their waking.

use std::collections::{BTreeMap, BTreeSet};

use braid_storage::OpenLogLru;

use super::{CheckpointStore, HostError, Journal};

/// One group's files: in use, or asleep while the group is idle (see
/// [`ShardHost::sleep_idle`]). Each boxed: a B-tree leaf has room for eleven values,
/// and a partition's journal is large (a heap profile of 10,000 idle partitions found
/// 1.7 KB per group when they were held inline).
#[derive(Debug)]
pub(super) enum GroupFiles<J: Journal> {
    Awake(Box<AwakeFiles<J>>),
    Asleep(Box<AsleepFiles<J>>),
}

#[derive(Debug)]
pub(super) struct AwakeFiles<J> {
    pub(super) journal: J,
    pub(super) checkpoints: CheckpointStore,
}

#[derive(Debug)]
pub(super) struct AsleepFiles<J: Journal> {
    pub(super) journal: J::Asleep,
    pub(super) checkpoints: CheckpointStore,
}

impl<J: Journal> GroupFiles<J> {
    pub(super) fn awake(&mut self) -> Option<&mut AwakeFiles<J>> {
        match self {
            Self::Awake(files) => Some(files),
            Self::Asleep(_) => None,
        }
    }
}

/// `group`'s files, woken if they sleep (and counted used since the last
/// [`ShardHost::sleep_idle`], and the most recently used against the budget of open
/// files). A free function over the host's fields, so that a turn
/// can hold them beside the states table.
pub(super) fn awake_files<'a, J: Journal>(
    files: &'a mut BTreeMap<u64, GroupFiles<J>>,
    sleep: &mut SleepCounts,
    group: u64,
) -> Result<&'a mut AwakeFiles<J>, HostError> {
    sleep.used.insert(group);
    wake_files(files, sleep, group)
}

/// As [`awake_files`], not counted a use.
pub(super) fn wake_files<'a, J: Journal>(
    files: &'a mut BTreeMap<u64, GroupFiles<J>>,
    sleep: &mut SleepCounts,
    group: u64,
) -> Result<&'a mut AwakeFiles<J>, HostError> {
    if let Some(GroupFiles::Asleep(_)) = files.get(&group) {
        let Some(GroupFiles::Asleep(asleep)) = files.remove(&group) else {
            return Err(HostError::UnknownGroup(group));
        };
        let AsleepFiles {
            journal,
            checkpoints,
        } = *asleep;
        // A lone replica has no peer to take a checkpoint from: copies changed while
        // asleep are found now, as its start would find them, not after it took
        // writes that start then refuses. (A member's next checkpoint writes over a
        // damaged copy, and a restart takes a peer's.)
        if sleep.lone {
            checkpoints.check_as_left().map_err(|err| {
                let reason = format!("checkpoint: {err}");
                if HostError::from(err).is_out_of_descriptors() {
                    HostError::WakeWithoutDescriptors { group, reason }
                } else {
                    HostError::WakeRefused { group, reason }
                }
            })?;
        }
        // On an error the group's files are gone from the host: the group is opened
        // again from them (see `ShardHost::take_reopen`).
        let journal = J::wake(group, journal).map_err(|err| {
            let reason = err.to_string();
            if err.is_out_of_descriptors() {
                HostError::WakeWithoutDescriptors { group, reason }
            } else {
                HostError::WakeRefused { group, reason }
            }
        })?;
        sleep.woken += 1;
        files.insert(
            group,
            GroupFiles::Awake(Box::new(AwakeFiles {
                journal,
                checkpoints,
            })),
        );
    }
    let files = files
        .get_mut(&group)
        .and_then(GroupFiles::awake)
        .ok_or(HostError::UnknownGroup(group))?;
    sleep.touch(group);
    Ok(files)
}

/// The host's bookkeeping of sleeping files.
#[derive(Debug)]
pub(super) struct SleepCounts {
    /// Groups whose files were used since the last [`ShardHost::sleep_idle`].
    pub(super) used: BTreeSet<u64>,
    /// Files put to sleep and woken since the host started (for `/metrics`).
    pub(super) slept: u64,
    pub(super) woken: u64,
    /// The host's groups are lone replicas (a single node): a wake also checks the
    /// checkpoint copies, which no peer could restore.
    pub(super) lone: bool,
    /// The groups that used their files since they were last released or woken, by
    /// their last use, at most the budget of them (see `ShardHost::set_open_budget`).
    open: OpenLogLru<u64>,
    /// Groups past the budget, to release at the end of the step or wake.
    over: BTreeSet<u64>,
    /// Groups whose files the budget released since the host started.
    pub(super) released: u64,
    /// Most groups one idle pass puts to sleep (see `ShardHost::set_sleeps_per_pass`).
    pub(super) per_pass: usize,
    /// The idle pass goes on from the group after this one, so each idle group gets
    /// its turn.
    pub(super) cursor: u64,
}

/// Most groups one idle pass puts to sleep: a sleep after writes is a clean close,
/// four syncs one after another on the shard's thread (about 1 ms here), and a pass
/// that slept every idle group of a retirement walk over thousands of partitions held
/// the shard for most of each second. The rest wait for the next passes with their
/// descriptors let go by the budget.
pub(crate) const SLEEPS_PER_PASS: usize = 64;

impl Default for SleepCounts {
    fn default() -> Self {
        Self {
            used: BTreeSet::new(),
            slept: 0,
            woken: 0,
            lone: false,
            open: OpenLogLru::new(usize::MAX),
            over: BTreeSet::new(),
            released: 0,
            per_pass: SLEEPS_PER_PASS,
            cursor: 0,
        }
    }
}

impl SleepCounts {
    /// Keeps at most `budget` of the groups' files open; `awake` are those awake now.
    pub(super) fn set_budget(&mut self, budget: usize, awake: Vec<u64>) {
        self.open = OpenLogLru::new(budget);
        for group in awake {
            self.touch(group);
        }
    }

    /// Marks `group` the most recently used; the least recently used one past the
    /// budget is to be released.
    pub(super) fn touch(&mut self, group: u64) {
        self.over.remove(&group);
        if let Some(evicted) = self.open.touch(&group) {
            self.over.insert(evicted);
        }
    }

    /// The groups past the budget (none used again since it evicted them).
    pub(super) fn take_over(&mut self) -> Vec<u64> {
        std::mem::take(&mut self.over).into_iter().collect()
    }

    /// `group`'s files went to sleep, or the group went.
    pub(super) fn forget(&mut self, group: u64) {
        self.open.remove(&group);
        self.over.remove(&group);
    }

    /// Every group went (a stop takes the journals).
    pub(super) fn forget_all(&mut self) {
        self.open = OpenLogLru::new(self.open.capacity());
        self.over.clear();
    }
}
