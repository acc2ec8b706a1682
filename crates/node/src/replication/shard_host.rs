//! The shell of a shard's groups on real disks: a `braid_vsr::Node` of replicas, each
//! group with its [`JournalFile`] and [`CheckpointStore`], all of them with the shard's
//! one [`GroupStates`]. It feeds the replicas their inputs and carries out their outputs
//! in the order the simulator checks:
//!
//! - disk outputs are done in the order given; journal appends, truncations and
//!   prunes go to one file in that order, a checkpoint is synced when written (so a
//!   prune after it never lands without it);
//! - "written" means synced: after each turn every journal written to is synced and
//!   the staged durable states of all groups are written once (one `fdatasync` for the
//!   lot), and only then do the replicas hear `JournalWritten` and `StateWritten`;
//! - messages to peers leave only after that sync, so a view-scoped message never
//!   speaks for a view not yet on this disk.
//!
//! No sockets and no clock: the caller moves [`Effects::sends`] to peers, answers
//! [`Effects::replies`], and passes time as `now` (in replica ticks).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use braid_vsr::StateMachine;
use braid_vsr::{Config, Input, Message, Node, Output, Persisted, Replica, ReplicaId, Reply};

use super::checkpoints::{CheckpointError, CheckpointStore};
use super::journal_file::{JournalError, JournalFile};
use super::states::{GroupStates, StatesError};

/// Why the shard's groups cannot go on. Every one stops them: after a failed write,
/// what reached the disk is unknown until a restart reads it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub(crate) enum HostError {
    #[error(transparent)]
    Journal(#[from] JournalError),
    #[error(transparent)]
    States(#[from] StatesError),
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    #[error("group {group}: {reason}")]
    Start { group: u64, reason: String },
    #[error("no group {0} on this shard")]
    UnknownGroup(u64),
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
}

/// One group's files.
#[derive(Debug)]
struct GroupFiles {
    journal: JournalFile,
    checkpoints: CheckpointStore,
}

/// A shard's replicas with their disks.
#[derive(Debug)]
pub(crate) struct ShardHost<S> {
    dir: PathBuf,
    node: Node<S>,
    files: BTreeMap<u64, GroupFiles>,
    states: GroupStates,
}

impl<S: StateMachine> ShardHost<S> {
    /// Opens shard `shard`'s durable states in `dir`; groups are added with
    /// [`ShardHost::add_group`].
    ///
    /// # Errors
    /// The states cannot be read.
    pub(crate) fn open(dir: &Path, shard: usize) -> Result<Self, HostError> {
        Ok(Self {
            dir: dir.to_owned(),
            node: Node::new(),
            files: BTreeMap::new(),
            states: GroupStates::open(dir, shard)?,
        })
    }

    /// Opens a group's files (`group-G.journal`, `group-G.checkpoint.*`): a new
    /// replica if nothing was ever written, else a restart from what was.
    ///
    /// # Errors
    /// A file cannot be read, or what it holds cannot restart the replica.
    pub(crate) fn add_group(&mut self, config: Config, machine: S) -> Result<(), HostError> {
        let group = config.group;
        let start = |reason: String| HostError::Start { group, reason };
        let dir = &self.dir;
        let (journal, recovered) = JournalFile::open(&dir.join(format!("group-{group}.journal")))?;
        let (checkpoints, checkpoint) =
            CheckpointStore::open(dir, &format!("group-{group}.checkpoint"))?;
        let durable = self.states.get(group);
        if config.replica_count == 1 && recovered.damaged_at.is_some() {
            // A lone replica's journal holds acknowledged ops no peer can repair.
            return Err(start(
                "its journal is damaged and it has no peer to repair it from".into(),
            ));
        }
        let replica = if durable.is_none() && checkpoint.is_none() && recovered.slots.is_empty() {
            Replica::new(config, machine).map_err(|e| start(format!("config: {e}")))?
        } else {
            // A replica that never left view 0 never wrote its state: a new replica's
            // state (view 0, nothing committed) is durable from its first step.
            let persisted = Persisted {
                durable: durable.unwrap_or_default(),
                checkpoint,
                journal: recovered.slots,
                // Every journal write is synced before it is reported written.
                journal_trusted: true,
            };
            Replica::restart(config, machine, persisted).map_err(|e| start(e.to_string()))?
        };
        self.node.insert(replica);
        self.files.insert(
            group,
            GroupFiles {
                journal,
                checkpoints,
            },
        );
        Ok(())
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
            self.node
                .step(now, group, input, &mut out)
                .map_err(|e| HostError::UnknownGroup(e.0))?;
        }
        self.carry_out(now, out)
    }

    fn carry_out(&mut self, now: u64, mut out: Vec<(u64, Output)>) -> Result<Effects, HostError> {
        let mut effects = Effects::default();
        while !out.is_empty() {
            let mut written = Vec::new();
            let mut held = Vec::new();
            let mut touched = Vec::new();
            for (group, output) in out.drain(..) {
                let files = self
                    .files
                    .get_mut(&group)
                    .ok_or(HostError::UnknownGroup(group))?;
                match output {
                    Output::Send { to, message } => held.push((group, to, message)),
                    Output::Reply(reply) => effects.replies.push((group, reply)),
                    Output::WriteJournal(prepare) => {
                        files.journal.write_prepare(&prepare)?;
                        touched.push(group);
                        written.push((
                            group,
                            Input::JournalWritten {
                                op: prepare.header.op,
                                checksum: prepare.header.checksum,
                            },
                        ));
                    }
                    Output::WriteHeader(header) => {
                        files.journal.write_header(&header)?;
                        touched.push(group);
                    }
                    Output::SendFromJournal { to, op, checksum } => {
                        if let Some(prepare) = files.journal.prepare(op, checksum) {
                            held.push((group, to, Message::Prepare(prepare.clone())));
                        }
                    }
                    Output::TruncateJournal { op } => {
                        files.journal.truncate(op)?;
                        touched.push(group);
                    }
                    Output::PruneJournal { op } => {
                        files.journal.prune(op)?;
                        touched.push(group);
                    }
                    Output::WriteState(state) => self.states.stage(group, state),
                    Output::WriteCheckpoint(checkpoint) => files.checkpoints.write(&checkpoint)?,
                    Output::Applied { op, result, .. } => effects.applied.push((group, op, result)),
                    Output::Evicted { .. } => {}
                }
            }
            // Written means synced: each journal written to once, the states of every
            // group once, for the whole turn.
            touched.sort_unstable();
            touched.dedup();
            for group in touched {
                if let Some(files) = self.files.get_mut(&group) {
                    files.journal.sync()?;
                }
            }
            for (group, state) in self.states.write_staged()? {
                written.push((group, Input::StateWritten(state)));
            }
            effects.sends.extend(held);
            for (group, input) in written {
                self.node
                    .step(now, group, input, &mut out)
                    .map_err(|e| HostError::UnknownGroup(e.0))?;
            }
        }
        Ok(effects)
    }
}

#[cfg(test)]
mod tests;
