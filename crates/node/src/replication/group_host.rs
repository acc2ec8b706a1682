//! The shell of one small group (the metadata, group 0) on real disks: it feeds a
//! `braid_vsr::Replica` its inputs and carries out its outputs against a
//! [`JournalFile`], the shard's [`GroupStates`] and a [`CheckpointStore`], in the order
//! the simulator checks:
//!
//! - disk outputs are done in the order given; journal appends, truncations and
//!   prunes go to one file in that order, a checkpoint is synced when written (so a
//!   prune after it never lands without it);
//! - "written" means synced: after each step the journal is synced and the staged
//!   durable states written, and only then does the replica hear `JournalWritten` and
//!   `StateWritten`;
//! - messages to peers leave only after that sync, so a view-scoped message never
//!   speaks for a view not yet on this disk.
//!
//! No sockets and no clock: the caller moves [`Effects::sends`] to peers, answers
//! [`Effects::replies`], and passes time as `now` (in replica ticks).

// Group 0's shard runs this once the node is wired to it; until then only the tests do.
#![cfg_attr(not(test), allow(dead_code))]

use std::path::Path;

use braid_vsr::{
    Config, Input, Message, Output, Persisted, Replica, ReplicaId, Reply, StateMachine,
};

use super::checkpoints::{CheckpointError, CheckpointStore};
use super::journal_file::{JournalError, JournalFile};
use super::states::{GroupStates, StatesError};

/// Why the group cannot go on. Every one stops the group: after a failed write,
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
}

/// What a step asks of the caller.
#[derive(Debug, Default)]
pub(crate) struct Effects {
    /// Messages for peers, to send in this order.
    pub(crate) sends: Vec<(ReplicaId, Message)>,
    /// Answers for clients.
    pub(crate) replies: Vec<Reply>,
    /// Ops applied, in order, with their results (for observers: the layout).
    pub(crate) applied: Vec<(u64, Result<Vec<u8>, braid_vsr::Refusal>)>,
}

/// One group's replica with its disks.
#[derive(Debug)]
pub(crate) struct GroupHost<S> {
    replica: Replica<S>,
    journal: JournalFile,
    states: GroupStates,
    checkpoints: CheckpointStore,
}

impl<S: StateMachine> GroupHost<S> {
    /// Opens the group's files in `dir` (`group-G.journal`, `group-G.checkpoint.*`, the
    /// shard's states): a new replica if nothing was ever written, else a restart from
    /// what was.
    ///
    /// # Errors
    /// A file cannot be read, or what it holds cannot restart the replica.
    pub(crate) fn open(dir: &Path, config: Config, machine: S) -> Result<Self, HostError> {
        let group = config.group;
        let start = |reason: String| HostError::Start { group, reason };
        let (journal, recovered) = JournalFile::open(&dir.join(format!("group-{group}.journal")))?;
        let states = GroupStates::open(dir, 0)?;
        let (checkpoints, checkpoint) =
            CheckpointStore::open(dir, &format!("group-{group}.checkpoint"))?;
        let durable = states.get(group);
        if config.replica_count == 1 && recovered.damaged_at.is_some() {
            // A lone replica's journal holds acknowledged ops no peer can repair.
            return Err(start(
                "its journal is damaged and it has no peer to repair it from".into(),
            ));
        }
        if durable.is_none() && checkpoint.is_none() && recovered.slots.is_empty() {
            let replica =
                Replica::new(config, machine).map_err(|e| start(format!("config: {e}")))?;
            return Ok(Self {
                replica,
                journal,
                states,
                checkpoints,
            });
        }
        // A replica that never left view 0 never wrote its state: a new replica's state
        // (view 0, nothing committed) is durable from its first step.
        let durable = durable.unwrap_or_default();
        let persisted = Persisted {
            durable,
            checkpoint,
            journal: recovered.slots,
            // Every journal write is synced before it is reported written.
            journal_trusted: true,
        };
        let replica =
            Replica::restart(config, machine, persisted).map_err(|e| start(e.to_string()))?;
        Ok(Self {
            replica,
            journal,
            states,
            checkpoints,
        })
    }

    /// The replica.
    pub(crate) fn replica(&self) -> &Replica<S> {
        &self.replica
    }

    /// Takes `input` at `now` and carries out everything it leads to, including the
    /// completions of the writes it asked for.
    ///
    /// # Errors
    /// A disk operation failed: the group must stop (restart the node).
    pub(crate) fn step(&mut self, now: u64, input: Input) -> Result<Effects, HostError> {
        let mut effects = Effects::default();
        let mut inputs = vec![input];
        let mut out = Vec::new();
        while !inputs.is_empty() {
            for input in std::mem::take(&mut inputs) {
                self.replica.step(now, input, &mut out);
            }
            let mut written = Vec::new();
            let mut held = Vec::new();
            for output in out.drain(..) {
                match output {
                    Output::Send { to, message } => held.push((to, message)),
                    Output::Reply(reply) => effects.replies.push(reply),
                    Output::WriteJournal(prepare) => {
                        self.journal.write_prepare(&prepare)?;
                        written.push(Input::JournalWritten {
                            op: prepare.header.op,
                            checksum: prepare.header.checksum,
                        });
                    }
                    Output::WriteHeader(header) => self.journal.write_header(&header)?,
                    Output::SendFromJournal { to, op, checksum } => {
                        if let Some(prepare) = self.journal.prepare(op, checksum) {
                            held.push((to, Message::Prepare(prepare.clone())));
                        }
                    }
                    Output::TruncateJournal { op } => self.journal.truncate(op)?,
                    Output::PruneJournal { op } => self.journal.prune(op)?,
                    Output::WriteState(state) => {
                        self.states.stage(self.replica.config().group, state)
                    }
                    Output::WriteCheckpoint(checkpoint) => self.checkpoints.write(&checkpoint)?,
                    Output::Applied { op, result, .. } => effects.applied.push((op, result)),
                    Output::Evicted { .. } => {}
                }
            }
            // Written means synced: one journal sync and one states write for the turn.
            self.journal.sync()?;
            for (_, state) in self.states.write_staged()? {
                written.push(Input::StateWritten(state));
            }
            effects.sends.extend(held);
            inputs = written;
        }
        Ok(effects)
    }
}

#[cfg(test)]
mod tests;
