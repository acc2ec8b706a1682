//! The shell of a shard's groups on real disks: a `braid_vsr::Node` of replicas, each
//! group with its [`Journal`] (a [`JournalFile`] for the metadata, the partition log
//! for a partition) and [`CheckpointStore`], all of them with the shard's one
//! [`GroupStates`]. It feeds the replicas their inputs and carries out their outputs
//! in the order the simulator checks:
//!
//! - disk outputs are done in the order given; journal appends, truncations and
//!   prunes go to one file in that order, a checkpoint is synced when written (so a
//!   prune after it never lands without it);
//! - "written" means synced: after each turn every journal written to is synced (a
//!   partition under `fsync = interval` or `never` reports its writes without a sync,
//!   and restarts untrusted) and the staged durable states of all groups are written
//!   once (one `fdatasync` for the lot), and only then do the replicas hear
//!   `JournalWritten` and `StateWritten`;
//! - messages to peers leave only after that sync, so a view-scoped message never
//!   speaks for a view not yet on this disk.
//!
//! No sockets and no clock: the caller moves [`Effects::sends`] to peers, answers
//! [`Effects::replies`], and passes time as `now` (in replica ticks).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use braid_vsr::StateMachine;
use braid_vsr::{
    Checksum, Config, Header, Input, JournalSlot, Message, Node, Persisted, Prepare, Replica,
    ReplicaId, Reply,
};

use super::boot::BootId;
use super::checkpoints::{CheckpointError, CheckpointStore};
use super::journal_file::{clear_untrusted_mark, JournalError, JournalFile};
use super::partition_journal::PartitionJournalError;
use super::shared_path::{FileName, SharedPath};
use super::states::{GroupStates, StatesError};
pub(crate) use error::{caused_by_out_of_descriptors, HostError};
use files::{awake_files, AwakeFiles, GroupFiles, SleepCounts};

/// A group's journal as the host drives it.
pub(crate) trait Journal {
    /// Writes a prepare at its op (replacing what is there); reported by a later sync.
    fn write_prepare(&mut self, prepare: &Prepare) -> Result<(), HostError>;
    /// Writes a header whose body must be repaired.
    fn write_header(&mut self, header: &Header) -> Result<(), HostError>;
    /// Removes entries above `op`.
    fn truncate(&mut self, op: u64) -> Result<(), HostError>;
    /// Removes entries at or below `op`.
    fn prune(&mut self, op: u64) -> Result<(), HostError>;
    /// The prepare at `op` with `checksum`, if held whole.
    fn prepare(&mut self, op: u64, checksum: Checksum) -> Result<Option<Prepare>, HostError>;
    /// Makes the writes so far durable as the group's policy says; returns the ops
    /// to report written.
    fn sync(&mut self) -> Result<Vec<(u64, Checksum)>, HostError>;
    /// Whether writes wait for a sync that runs elsewhere (reported later through
    /// [`ShardHost::step`] with `JournalWritten` inputs).
    fn has_unsynced(&self) -> bool {
        false
    }
    /// The group's next durable state names a new log view: the view's log, every
    /// entry written so far (whole prepares too), must be durable before it, so the
    /// next [`Journal::sync`] makes them so, whatever its batches' syncs wait for. (A
    /// journal whose sync covers every write needs nothing more.)
    fn log_view_rests_on_writes(&mut self) {}
    /// A checkpoint was written (or found at open): a journal whose bodies live
    /// elsewhere may have to fetch what it covers (the partition log).
    fn checkpointed(&mut self, _checkpoint: &braid_vsr::Checkpoint) -> Result<(), HostError> {
        Ok(())
    }
    /// `op` (its prepare's `checksum`) was applied (committed), with `result` if the
    /// state machine ran it: a
    /// journal whose bodies live elsewhere learns how far they are the committed ones,
    /// and checks that the op's body is where the state machine's result places it.
    ///
    /// # Errors
    /// The body is stored elsewhere than the result says (the journal diverged).
    fn applied(
        &mut self,
        _op: u64,
        _checksum: Checksum,
        _result: Option<&[u8]>,
    ) -> Result<(), HostError> {
        Ok(())
    }
    /// The distrust its open reported ([`Opened::tail_cut`]) is durable in the group's
    /// state: evidence the open kept for it (so that a power loss before this point
    /// restarts the group untrusted again) may go.
    fn distrust_persisted(&mut self) -> Result<(), HostError> {
        Ok(())
    }

    /// Closes its files' descriptors until they are next used, keeping everything
    /// else ([`ShardHost::set_open_budget`]): safe at any time between turns.
    ///
    /// # Errors
    /// What had to be written first could not be (what was not is left open).
    fn release_files(&mut self) -> Result<(), HostError> {
        Ok(())
    }

    /// What the journal keeps while its files sleep ([`ShardHost::sleep_idle`]).
    type Asleep: std::fmt::Debug;
    /// Whether its files may sleep now (nothing in flight).
    fn can_sleep(&self) -> bool {
        false
    }
    /// Lets its files go (only when [`Journal::can_sleep`]).
    ///
    /// # Errors
    /// A disk operation failed: the journal is gone.
    fn sleep(self) -> Result<Self::Asleep, HostError>
    where
        Self: Sized;
    /// Group `group`'s journal that went to sleep as `asleep`, its files checked to be
    /// as left.
    ///
    /// # Errors
    /// They are not (damage at rest, a file removed), or IO: the group must restart.
    fn wake(group: u64, asleep: Self::Asleep) -> Result<Self, HostError>
    where
        Self: Sized;
}

/// What a journal held at open.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Opened {
    /// The slots above the prune point.
    pub(crate) slots: Vec<(u64, JournalSlot)>,
    /// What damage was found, if any (its slots are reported damaged; a lone replica
    /// refuses to start, saying this).
    pub(crate) damage: Option<String>,
    /// Every write reported was synced first (false under `fsync = interval` or
    /// `never`; the host then trusts the journal only if its group's state was written
    /// in this boot, or at a clean stop: see [`super::boot`]).
    pub(crate) trusted: bool,
    /// A tail was cut at open (a torn write, or a record or batch that was synced and
    /// reported and then damaged at rest: the two look alike once the sync marker
    /// after it is lost), or the journal file was gone. An op absent, or held as a
    /// header alone, may then have been acknowledged, so the journal is untrusted
    /// above what is known committed whatever the boot stamp says (issue 24, finding
    /// 11).
    pub(crate) tail_cut: bool,
    /// The open found damage at rest (in the journal, or a log cut at damage). The
    /// boot's stamp then vouches for nothing: a crash in the same boot keeps every
    /// write in the page cache, damage does not, and an op it took reads as never
    /// written (under `fsync = never`, reported all the same: the shell simulator's
    /// seed 304327 with damage to sleeping files, committed ops 102 and 103 voted away
    /// after a `kill -9` in the boot that wrote them).
    pub(crate) damaged_at_rest: bool,
}

impl Journal for JournalFile {
    fn write_prepare(&mut self, prepare: &Prepare) -> Result<(), HostError> {
        Ok(JournalFile::write_prepare(self, prepare)?)
    }
    fn write_header(&mut self, header: &Header) -> Result<(), HostError> {
        Ok(JournalFile::write_header(self, header)?)
    }
    fn truncate(&mut self, op: u64) -> Result<(), HostError> {
        Ok(JournalFile::truncate(self, op)?)
    }
    fn prune(&mut self, op: u64) -> Result<(), HostError> {
        Ok(JournalFile::prune(self, op)?)
    }
    fn prepare(&mut self, op: u64, checksum: Checksum) -> Result<Option<Prepare>, HostError> {
        Ok(self.inline_prepare(op, checksum))
    }
    fn sync(&mut self) -> Result<Vec<(u64, Checksum)>, HostError> {
        Ok(JournalFile::sync(self)?)
    }
    fn distrust_persisted(&mut self) -> Result<(), HostError> {
        Ok(clear_untrusted_mark(&self.path())?)
    }
    /// The metadata group's journal never sleeps ([`Journal::can_sleep`] is false).
    type Asleep = Self;
    fn sleep(self) -> Result<Self, HostError> {
        Ok(self)
    }
    fn wake(_group: u64, asleep: Self) -> Result<Self, HostError> {
        Ok(asleep)
    }
}

/// What a turn asks of the caller.
#[derive(Debug, Default)]
pub(crate) struct Effects {
    /// Messages for peers, by group, to send in this order.
    pub(crate) sends: Vec<(u64, ReplicaId, Message)>,
    /// Answers for clients, by group.
    pub(crate) replies: Vec<(u64, Reply)>,
    /// Ops applied, by group and in order, with their results (for observers).
    pub(crate) applied: Vec<(u64, u64, Result<Vec<u8>, braid_vsr::Refusal>)>,
    /// Groups whose journal writes wait for a sync the caller runs elsewhere.
    pub(crate) unsynced: Vec<u64>,
}

/// A shard's replicas with their disks.
#[derive(Debug)]
pub(crate) struct ShardHost<S, J: Journal = JournalFile> {
    dir: PathBuf,
    node: Node<S>,
    files: BTreeMap<u64, GroupFiles<J>>,
    sleep: SleepCounts,
    states: GroupStates,
    /// Groups that start with nothing on disk start untrusted (see
    /// [`ShardHost::start_fresh_untrusted`]).
    fresh_untrusted: bool,
    /// Groups from this id on start trusted all the same: created after every group
    /// this member may have acknowledged ops of before it lost its data
    /// ([`ShardHost::trust_fresh_groups_from`]).
    fresh_trusted_from: u64,
    /// Groups whose files were found lost before they were opened (see
    /// [`ShardHost::restart_as_lost`]).
    lost: BTreeSet<u64>,
    /// Groups stepped, or given outputs to carry out, since [`ShardHost::take_touched`]:
    /// the only ones whose status can have changed.
    touched: BTreeSet<u64>,
    /// Groups stepped, given outputs or whose journal was handed out mutably since
    /// [`ShardHost::take_marks`]: the only ones whose committed end can have moved (a
    /// repair or a copy from a peer moves it outside any step).
    marks: Vec<u64>,
    /// Groups dropped because their files changed while asleep, with why, since
    /// [`ShardHost::take_reopen`].
    reopen: Vec<(u64, String)>,
    /// Groups dropped so, until added again: what this boot wrote of them no longer
    /// vouches for their journals (see [`ShardHost::add_group_with`]).
    changed: BTreeSet<u64>,
    /// Repairs asked of peers since [`ShardHost::take_repairs`].
    repairs: Repairs,
    /// Per group, the ops its open reported damaged, until each is written again.
    damaged_ops: BTreeMap<u64, BTreeSet<u64>>,
}

/// Repairs this shard's replicas asked of their peers (for `/metrics`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Repairs {
    /// Prepares asked for (a missing or damaged entry).
    pub(crate) prepares: u64,
    /// Snapshots asked for (an op nobody's journal still holds).
    pub(crate) snapshots: u64,
    /// Ops an open found damaged, written again from a peer's copy.
    pub(crate) damage_rewritten: u64,
}

impl<S: StateMachine, J: Journal> ShardHost<S, J> {
    /// Opens shard `shard`'s durable states in `dir`; groups are added with
    /// [`ShardHost::add_group`].
    ///
    /// # Errors
    /// The states cannot be read.
    pub(crate) fn open(dir: &Path, shard: usize) -> Result<Self, HostError> {
        Self::open_in_boot(dir, shard, BootId::current())
    }

    /// As [`ShardHost::open`], for a process running in boot `boot` (tests stand for
    /// a reboot with another).
    ///
    /// # Errors
    /// The states cannot be read.
    pub(crate) fn open_in_boot(dir: &Path, shard: usize, boot: BootId) -> Result<Self, HostError> {
        Ok(Self {
            dir: dir.to_owned(),
            node: Node::new(),
            files: BTreeMap::new(),
            sleep: SleepCounts::default(),
            states: GroupStates::open(dir, shard, boot)?,
            fresh_untrusted: false,
            fresh_trusted_from: u64::MAX,
            lost: BTreeSet::new(),
            touched: BTreeSet::new(),
            marks: Vec::new(),
            reopen: Vec::new(),
            changed: BTreeSet::new(),
            repairs: Repairs::default(),
            damaged_ops: BTreeMap::new(),
        })
    }

    /// `group`, when added, restarts as a replica that lost its disk (untrusted from op
    /// 0, abstaining until its peers show it the current view), keeping what files it
    /// still has for repair: a file of it is gone from a directory that once held it.
    /// The loss is made durable in the group's state at once, before the caller
    /// makes its files anew: a crash in between must not leave a new, empty journal
    /// beside the old state, which would restart the group trusted and amnesiac (the
    /// shell simulator's seed 333206: a partition's `vsr.journal` lost while it slept
    /// was made anew, the member crashed before its turn wrote the state, restarted
    /// trusted with nothing, and its votes dropped ops it had acknowledged).
    ///
    /// # Errors
    /// The states table could not be written.
    pub(crate) fn restart_as_lost(&mut self, group: u64) -> Result<(), HostError> {
        self.lost.insert(group);
        self.states
            .write_now(group, Persisted::after_disk_loss().durable)?;
        Ok(())
    }

    /// Refuses a lone replica's start when the states table has a slot damaged in both
    /// copies that names no group: some group's state is lost, no peer holds it, and
    /// which group it was is unknown. (A member of a cluster starts: see
    /// [`ShardHost::state_may_be_lost`].)
    ///
    /// # Errors
    /// [`StatesError::Unattributable`], naming the files and the slot.
    pub(crate) fn refuse_lone_if_unattributable(&self, members: u8) -> Result<(), HostError> {
        match self.states.unattributable() {
            Some(err) if members == 1 => Err(err.into()),
            _ => Ok(()),
        }
    }

    /// Whether `group`, without a state here, may be the group of a slot damaged in
    /// both copies that names no group: then, with its files found, it restarts as a
    /// replica that lost its disk (the outside review of issue 24 found a member that
    /// could not start at all once such a slot was found).
    pub(crate) fn state_may_be_lost(&self, group: u64) -> bool {
        self.states.unattributable().is_some() && !self.has_state(group)
    }

    /// Whether `group` has no state because the shard's states table was missing
    /// whole at open and made anew (both copies deleted, say): made at the shard's
    /// first open, before any group of it, the table is older than every group's
    /// files, so a group whose files exist had its state there, and it is lost.
    pub(crate) fn state_lost_with_its_table(&self, group: u64) -> bool {
        self.states.was_created() && !self.has_state(group)
    }

    /// The states table's files, for an error that names them.
    pub(crate) fn states_files(&self) -> String {
        self.states.files()
    }

    /// An op through which lone replica `group` committed and acknowledged, as its
    /// durable state says: exactly after a clean stop, a little behind after a crash
    /// (a running replica persists its commit every half checkpoint interval). Only
    /// where no crash can leave its journal below it: after a clean stop, or under
    /// `fsync = always` (`synced`). Its files holding less are older
    /// than what it acknowledged (an outside review of issue 24 restored an older
    /// `vsr.journal`: the node cut 60 acknowledged, intact batches from the log and
    /// acknowledged offset 2200 again, without a word).
    pub(crate) fn acknowledged_floor(&self, group: u64, synced: bool) -> Option<u64> {
        let state = self.states.get(group)?;
        let exact = synced || self.states.stamp(group) == Some(super::boot::Stamp::Synced);
        exact.then_some(state.commit)
    }

    /// Whether the host holds `group` (its replica and files, awake or asleep).
    pub(crate) fn holds(&self, group: u64) -> bool {
        self.files.contains_key(&group)
    }

    /// Whether `group` ever wrote a durable state here (its slot in the states table,
    /// proven or damaged): its files existed, and finding none is loss, not a new
    /// group.
    pub(crate) fn has_state(&self, group: u64) -> bool {
        self.states.get(group).is_some() || self.states.damaged_groups().contains(&group)
    }

    /// From now on a group with nothing on disk starts untrusted from op 0: this
    /// member lost its data (its directory was recreated to rejoin), so it may have
    /// acknowledged ops it no longer has, and must never count as "never had" any op
    /// until it is normal in a newer view. (A brand-new member starts trusted: it
    /// acknowledged nothing.)
    pub(crate) fn start_fresh_untrusted(&mut self) {
        self.fresh_untrusted = true;
    }

    /// Groups from `group` on, with nothing on disk, start trusted even after
    /// [`ShardHost::start_fresh_untrusted`]: they were created after this member's
    /// start, so it never acknowledged an op of theirs before it lost its data. (Left
    /// untrusted, a new topic's partition on a rejoined member could not elect a
    /// primary while another member was down: an outside review of issue 24.)
    pub(crate) fn trust_fresh_groups_from(&mut self, group: u64) {
        self.fresh_trusted_from = group;
    }

    /// Adds a group with its opened `journal`, its checkpoints in `checkpoint_dir`
    /// (`group-G.checkpoint.*`): a new replica if nothing was ever written, else a
    /// restart from what was.
    ///
    /// # Errors
    /// A file cannot be read, or what it holds cannot restart the replica.
    pub(crate) fn add_group_with(
        &mut self,
        config: Config,
        machine: S,
        journal: J,
        opened: Opened,
        checkpoint_dir: &Arc<Path>,
    ) -> Result<(), HostError> {
        let group = config.group;
        let start = |reason: String| HostError::Start { group, reason };
        let damaged = |reason: String| HostError::Damaged { group, reason };
        let lone = config.replica_count == 1;
        self.sleep.lone = lone;
        if let Some(damage) = opened.damage.as_ref().filter(|_| lone) {
            // A lone replica's journal holds acknowledged ops no peer can repair.
            // Refused before anything is written (the checkpoint's copy below may cut
            // the log), so that what the damage left is there to read and restore.
            return Err(damaged(damage.clone()));
        }
        let copies_at = SharedPath::new(
            Arc::clone(checkpoint_dir),
            FileName::OfGroup(group, ".checkpoint"),
        );
        let (checkpoints, checkpoint, checkpoint_lost) =
            match CheckpointStore::open(copies_at.clone(), group, self.states.get(group).is_some())
            {
                Ok((store, checkpoint)) => (store, checkpoint, false),
                Err(err @ CheckpointError::Damaged(_)) if lone => {
                    return Err(damaged(err.to_string()))
                }
                Err(CheckpointError::Damaged(reason)) if config.replica_count > 1 => {
                    // The state it restarts from is gone; its peers hold it. It keeps
                    // its views, commit and journal (what it acknowledged is there, so
                    // its votes stand), and installs a peer's checkpoint once its repair
                    // finds the ops below its journal pruned everywhere.
                    tracing::warn!(
                        group,
                        dir = %checkpoint_dir.display(),
                        %reason,
                        "both checkpoint copies are damaged: the group restarts as a \
                         replica that lost its state and takes a peer's"
                    );
                    (CheckpointStore::reset(copies_at)?, None, true)
                }
                Err(err) => return Err(err.into()),
            };
        let mut journal = journal;
        if let Some(checkpoint) = &checkpoint {
            // A crash between a snapshot's install and its prune leaves the journal
            // behind the checkpoint: it learns what the checkpoint covers again.
            journal.checkpointed(checkpoint)?;
        }
        let durable = self.states.get(group);
        // Its view, log view and commit are damaged in both copies of the states table:
        // the views it voted in are unknown, so it restarts as a replica that lost its
        // disk (it abstains until a quorum shows it a view as new as any it may have
        // voted in), keeping its journal and checkpoint, untrusted, for repair. A lost
        // checkpoint alone costs only the state below the journal: its views still
        // vouch for its votes. (Taken as a lost disk, a second member's doubt left the
        // group with one voter: the shell simulator's seeds 1048, 1058 and 1336 at four
        // times the faults waited for ever.) With no durable state either, nothing
        // proves which views it voted in.
        let state_lost = self.states.damaged_groups().contains(&group)
            || (checkpoint_lost && durable.is_none())
            || self.lost.contains(&group);
        if state_lost && lone {
            return Err(damaged(format!(
                "its durable state (view, log view, commit) is damaged in both copies of \
                 the states table in {}",
                self.dir.display()
            )));
        }
        let damaged_ops: BTreeSet<u64> = opened
            .slots
            .iter()
            .filter(|(_, slot)| matches!(slot, JournalSlot::Damaged))
            .map(|(op, _)| *op)
            .collect();
        if !damaged_ops.is_empty() {
            self.damaged_ops.insert(group, damaged_ops);
        }
        let fresh =
            !state_lost && durable.is_none() && checkpoint.is_none() && opened.slots.is_empty();
        let replica = if state_lost {
            let lost = Persisted::after_disk_loss();
            self.states.stage(group, lost.durable);
            let persisted = Persisted {
                checkpoint,
                journal: opened.slots,
                ..lost
            };
            Replica::restart(config, machine, persisted).map_err(|e| start(e.to_string()))?
        } else if fresh
            && self.fresh_untrusted
            && group < self.fresh_trusted_from
            && config.replica_count > 1
        {
            let persisted = Persisted::after_disk_loss();
            // Stamped with this boot, so that its journal's unsynced writes are trusted
            // after a process crash (its state still says "untrusted from 0").
            self.states.stage(group, persisted.durable);
            Replica::restart(config, machine, persisted).map_err(|e| start(e.to_string()))?
        } else if fresh {
            self.states.stage(group, braid_vsr::DurableState::default());
            Replica::new(config, machine).map_err(|e| start(format!("config: {e}")))?
        } else {
            // A replica that never left view 0 may never have written its state: a new
            // replica's state (view 0, nothing committed) is durable from its first step.
            let durable = durable.unwrap_or_default();
            // Its files changed under this process (a reopen): the boot's stamp no
            // longer says its journal kept every write it reported (under `fsync =
            // never` a reported op may have had its batch in a segment since removed,
            // and the open takes it for never written: the shell simulator's seed
            // 303453 with damage to sleeping files, offset 745 acknowledged twice).
            let vouched = !opened.damaged_at_rest
                && !self.changed.contains(&group)
                && self.states.vouches_for(group);
            let trusted = !opened.tail_cut && (opened.trusted || vouched);
            if self.states.stamp(group) == Some(super::boot::Stamp::Synced) {
                // Trusted because it stopped cleanly; from now on its unsynced writes
                // are this boot's, so its next write (this turn's) says so.
                self.states.stage(group, durable);
            }
            let persisted = Persisted {
                durable,
                checkpoint,
                journal: opened.slots,
                journal_trusted: trusted,
            };
            Replica::restart(config, machine, persisted).map_err(|e| start(e.to_string()))?
        };
        if opened.tail_cut {
            // The open may have repaired away what made the journal untrusted (a lost
            // or unreadable file made anew, a cut tail): the distrust is made durable
            // before the group's first step, then the journal's own evidence goes
            // (the shell simulator's seed 90 at four times the faults: a power loss
            // eight ticks after such an open restarted the member trusted with an
            // empty journal, and its vote dropped committed ops).
            if let Some(state) = replica.distrust_to_persist() {
                self.states.write_now(group, state)?;
            }
            journal.distrust_persisted()?;
        }
        self.changed.remove(&group);
        self.node.insert(replica);
        self.files.insert(
            group,
            GroupFiles::Awake(Box::new(AwakeFiles {
                journal,
                checkpoints,
            })),
        );
        self.sleep.touch(group);
        Ok(())
    }

    /// Drops a group (its topic was deleted): its replica, its files' handles and its
    /// durable state (gone with the next states write).
    pub(crate) fn remove_group(&mut self, group: u64) {
        self.changed.remove(&group);
        self.damaged_ops.remove(&group);
        self.node.remove(group);
        self.files.remove(&group);
        self.sleep.forget(group);
        self.states.remove(group);
    }

    /// Takes every group's journal out, dropping the groups (at shutdown). Journals
    /// whose files sleep are not among them: their files were closed when they went
    /// to sleep.
    pub(crate) fn take_journals(&mut self) -> Vec<(u64, J)> {
        // A lone replica's state says what it committed exactly at a clean stop (a
        // running one persists its commit only now and then, a hint): the next start
        // refuses files that hold less, restored from an older backup, before it
        // could give their offsets again (see `add_group_with`).
        for replica in self.node.replicas() {
            let group = replica.config().group;
            if replica.config().replica_count != 1 {
                continue;
            }
            if let Some(mut state) = self.states.get(group) {
                if replica.commit_min() > state.commit {
                    state.commit = replica.commit_min();
                    self.states.stage(group, state);
                }
            }
        }
        self.node = Node::new();
        self.sleep.forget_all();
        std::mem::take(&mut self.files)
            .into_iter()
            .filter_map(|(group, files)| match files {
                GroupFiles::Awake(files) => Some((group, files.journal)),
                GroupFiles::Asleep(_) => None,
            })
            .collect()
    }

    /// An error of `group`'s that [`HostError::is_found_changed`] or
    /// [`HostError::is_out_of_descriptors`] drops the group, to be opened again (its
    /// replica goes; its durable state stays, for the open that follows): one
    /// partition's damage, or an open refused a descriptor, never stops the shard's
    /// other groups. Any other error is returned.
    pub(crate) fn found_changed(&mut self, group: u64, err: HostError) -> Result<(), HostError> {
        if err.is_found_changed() {
            self.drop_for_reopen(group, err.to_string());
            return Ok(());
        }
        if err.is_out_of_descriptors() {
            self.drop_unchanged(group, err.to_string());
            return Ok(());
        }
        Err(err)
    }

    /// Drops `group` after an open of its files was refused a descriptor (`reason`),
    /// to be opened again from them ([`ShardHost::take_reopen`]): nothing in them
    /// changed, so this boot's stamp still vouches for its journal, as for a group that
    /// was never dropped. (Reopened as if its files had changed, a member under
    /// `fsync = never` restarted the group untrusted each time, and three of them left
    /// a group in view changes for ever: the shell simulator's seeds with members out of
    /// descriptors.)
    pub(crate) fn drop_unchanged(&mut self, group: u64, reason: String) {
        let changed = self.changed.contains(&group);
        self.drop_for_reopen(group, reason);
        if !changed {
            self.changed.remove(&group);
        }
    }

    /// Drops `group`, whose files changed under it (`reason`), to be opened again
    /// from them ([`ShardHost::take_reopen`]); its durable state stays.
    pub(crate) fn drop_for_reopen(&mut self, group: u64, reason: String) {
        self.node.remove(group);
        self.damaged_ops.remove(&group);
        self.files.remove(&group);
        self.sleep.forget(group);
        self.changed.insert(group);
        self.reopen.push((group, reason));
    }

    /// The groups dropped since the last call because their files changed while
    /// asleep, with why: the caller opens each again from its files, as a start does
    /// (a member of a cluster repairs what changed from its peers; a lone replica
    /// refuses the damaged partition alone).
    pub(crate) fn take_reopen(&mut self) -> Vec<(u64, String)> {
        std::mem::take(&mut self.reopen)
    }

    /// Records a clean stop after the journals taken by [`ShardHost::take_journals`]
    /// were synced and closed: the next start, in any boot, trusts them, except the
    /// groups in `unsynced` (their close failed).
    ///
    /// # Errors
    /// The states could not be written (the next start trusts what the last batch
    /// said).
    pub(crate) fn record_clean_stop(&mut self, unsynced: &[u64]) -> Result<(), HostError> {
        Ok(self.states.write_stopped(unsynced)?)
    }

    /// The commit heartbeats of the quiescent groups this host leads (see
    /// `braid_vsr::Node::quiet_heartbeats`).
    pub(crate) fn quiet_heartbeats(&self) -> Vec<(u64, Message)> {
        self.node.quiet_heartbeats()
    }

    /// Every group's journal whose files are awake (one asleep has nothing in flight).
    pub(crate) fn journals_mut(&mut self) -> impl Iterator<Item = (u64, &mut J)> {
        self.files
            .iter_mut()
            .filter_map(|(g, f)| f.awake().map(|f| (*g, &mut f.journal)))
    }

    /// Syncs `group`'s journal outside a step (writes made without one, such as a
    /// state transfer's) and reports what it made durable to the replica.
    ///
    /// # Errors
    /// As [`ShardHost::step`].
    pub(crate) fn sync_journal(&mut self, now: u64, group: u64) -> Result<Effects, HostError> {
        let files = match awake_files(&mut self.files, &mut self.sleep, group) {
            Ok(files) => files,
            Err(err) => {
                self.found_changed(group, err)?;
                return Ok(Effects::default());
            }
        };
        let written: Vec<(u64, Input)> = files
            .journal
            .sync()?
            .into_iter()
            .map(|(op, checksum)| (group, Input::JournalWritten { op, checksum }))
            .collect();
        let unsynced = files.journal.has_unsynced();
        let mut effects = self.step(now, written)?;
        if unsynced && !effects.unsynced.contains(&group) {
            effects.unsynced.push(group);
        }
        Ok(effects)
    }

    /// A group's journal, if its files are awake.
    pub(crate) fn journal(&self, group: u64) -> Option<&J> {
        match self.files.get(&group)? {
            GroupFiles::Awake(files) => Some(&files.journal),
            GroupFiles::Asleep(_) => None,
        }
    }

    /// What a group's journal keeps while its files sleep.
    pub(crate) fn journal_asleep(&self, group: u64) -> Option<&J::Asleep> {
        match self.files.get(&group)? {
            GroupFiles::Awake(_) => None,
            GroupFiles::Asleep(files) => Some(&files.journal),
        }
    }

    /// A group's journal, if its files are awake ([`ShardHost::wake`] wakes them).
    pub(crate) fn journal_mut(&mut self, group: u64) -> Option<&mut J> {
        let journal = &mut self.files.get_mut(&group)?.awake()?.journal;
        self.marks.push(group);
        Some(journal)
    }

    /// The first group at or above `from`, or else the lowest group: a cursor over the
    /// groups in turn, without walking them all.
    pub(crate) fn group_from(&self, from: u64) -> Option<u64> {
        match self.files.range(from..).next() {
            Some((group, _)) => Some(*group),
            None => self.files.keys().next().copied(),
        }
    }

    /// Ticks lone replicas (groups of one) until each is normal: it recovers by itself,
    /// and its state reaches every committed op. Many at once share each turn's one
    /// write of the states table (a node of 100,000 partitions restarted with one
    /// `fdatasync` per partition when each recovered alone). Returns what the ticks
    /// asked of the caller (sync jobs to start, above all).
    ///
    /// # Errors
    /// As [`ShardHost::tick`].
    pub(crate) fn recover_lone(
        &mut self,
        groups: &[u64],
        now: &mut u64,
    ) -> Result<Effects, HostError> {
        let mut all = Effects::default();
        for _ in 0..10_000 {
            let normal = groups.iter().all(|group| {
                self.replica(*group).map(Replica::status) == Some(braid_vsr::Status::Normal)
            });
            if normal {
                break;
            }
            *now += 1;
            let effects = self.tick(*now)?;
            all.sends.extend(effects.sends);
            all.replies.extend(effects.replies);
            all.applied.extend(effects.applied);
            for group in effects.unsynced {
                if !all.unsynced.contains(&group) {
                    all.unsynced.push(group);
                }
            }
        }
        Ok(all)
    }

    /// The groups stepped or given outputs since the last call (their status may have
    /// changed; no other group's did).
    pub(crate) fn take_touched(&mut self) -> BTreeSet<u64> {
        std::mem::take(&mut self.touched)
    }

    /// The groups whose committed end may have moved since the last call, each once.
    pub(crate) fn take_marks(&mut self) -> Vec<u64> {
        let mut marks = std::mem::take(&mut self.marks);
        marks.sort_unstable();
        marks.dedup();
        marks
    }

    /// Repairs asked since the last call.
    pub(crate) fn take_repairs(&mut self) -> Repairs {
        std::mem::take(&mut self.repairs)
    }

    /// Every group's replica.
    pub(crate) fn replicas(&self) -> impl Iterator<Item = &Replica<S>> {
        self.node.replicas()
    }

    /// A group's replica.
    pub(crate) fn replica(&self, group: u64) -> Option<&Replica<S>> {
        self.node.replica(group)
    }

    /// Ticks every group whose deadline has come, and carries out what follows.
    ///
    /// # Errors
    /// As [`ShardHost::step`].
    pub(crate) fn tick(&mut self, now: u64) -> Result<Effects, HostError> {
        let mut out = Vec::new();
        self.node.tick(now, &mut out);
        self.carry_out(now, out)
    }

    /// Takes a turn's inputs (for any of the shard's groups) at `now` and carries out
    /// everything they lead to, including the completions of the writes they asked for.
    ///
    /// # Errors
    /// A disk operation failed (the shard's groups must stop: restart the node), or an
    /// input names a group this shard does not hold.
    pub(crate) fn step(
        &mut self,
        now: u64,
        inputs: Vec<(u64, Input)>,
    ) -> Result<Effects, HostError> {
        let mut out = Vec::new();
        for (group, input) in inputs {
            self.touched.insert(group);
            self.marks.push(group);
            self.node
                .step(now, group, input, &mut out)
                .map_err(|e| HostError::UnknownGroup(e.0))?;
        }
        self.carry_out(now, out)
    }
}

mod carry;
mod error;
mod file_journal;
mod files;
mod sleep;
#[cfg(test)]
mod tests;
