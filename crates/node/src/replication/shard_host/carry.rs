//! A turn's outputs carried out: each group's writes, its messages held until the
//! turn's writes are synced, and a group whose files were found changed dropped alone.

use std::collections::BTreeSet;

use braid_vsr::{Input, Message, Output, ReplicaId, StateMachine};

use super::{awake_files, Effects, GroupFiles, HostError, Journal, ShardHost};

impl<S: StateMachine, J: Journal> ShardHost<S, J> {
    pub(super) fn carry_out(
        &mut self,
        now: u64,
        mut out: Vec<(u64, Output)>,
    ) -> Result<Effects, HostError> {
        self.touched.extend(out.iter().map(|(group, _)| *group));
        self.marks.extend(out.iter().map(|(group, _)| *group));
        let mut effects = Effects::default();
        // Groups whose files were found changed at a wake in this turn: dropped, with
        // everything they asked (as a crash of that group alone would), for a reopen.
        let mut dropped = BTreeSet::new();
        // At least once: a state the host staged itself (a new group's, a restamp)
        // is written even in a turn without outputs.
        loop {
            let mut written = Vec::new();
            let mut held = Vec::new();
            let mut touched = Vec::new();
            for (group, output) in out.drain(..) {
                if dropped.contains(&group) {
                    continue;
                }
                if !self.files.contains_key(&group) {
                    return Err(HostError::UnknownGroup(group));
                }
                let carried = self.carry_one(group, output, &mut effects, &mut held, &mut touched);
                match carried {
                    Ok(()) => {}
                    // Its files changed under it (found at a wake, or damage met in
                    // use): the group alone is dropped, with everything it asked (as a
                    // crash of that group alone would), and opened again from them.
                    Err(err) => {
                        self.found_changed(group, err)?;
                        dropped.insert(group);
                    }
                }
            }
            // Written means synced: each journal written to once, the states of every
            // group once, for the whole turn.
            touched.sort_unstable();
            touched.dedup();
            for group in touched {
                let Some(files) = self.files.get_mut(&group).and_then(GroupFiles::awake) else {
                    continue;
                };
                match files.journal.sync() {
                    Ok(synced) => {
                        for (op, checksum) in synced {
                            written.push((group, Input::JournalWritten { op, checksum }));
                        }
                        if files.journal.has_unsynced() && !effects.unsynced.contains(&group) {
                            effects.unsynced.push(group);
                        }
                    }
                    // Its journal's file could not be opened again (a descriptor
                    // refused): dropped alone, as above.
                    Err(err) => {
                        self.found_changed(group, err)?;
                        dropped.insert(group);
                    }
                }
            }
            // A group dropped in this turn writes nothing it staged: its state may
            // rest on journal writes that were not synced (a new log view over a
            // truncation), as for a crash of that group alone.
            for group in &dropped {
                self.states.unstage(*group);
            }
            for (group, state) in self.states.write_staged()? {
                // A state staged outside a turn for a group not held (one that an
                // open restarted as lost, then failed to open: it waits to be opened
                // again) is durable, and told to no replica.
                if self.files.contains_key(&group) {
                    written.push((group, Input::StateWritten(state)));
                }
            }
            effects.sends.extend(held);
            if !dropped.is_empty() {
                written.retain(|(group, _)| !dropped.contains(group));
                effects
                    .sends
                    .retain(|(group, _, _)| !dropped.contains(group));
                effects
                    .replies
                    .retain(|(group, _)| !dropped.contains(group));
                effects
                    .applied
                    .retain(|(group, _, _)| !dropped.contains(group));
                effects.unsynced.retain(|group| !dropped.contains(group));
            }
            for (group, input) in written {
                self.node
                    .step(now, group, input, &mut out)
                    .map_err(|e| HostError::UnknownGroup(e.0))?;
            }
            if out.is_empty() {
                break;
            }
        }
        // Past the budget of open files, only now that the turn's writes are synced.
        self.release_over_budget();
        Ok(effects)
    }

    /// Carries out one of `group`'s outputs of a turn: its writes, its messages held
    /// for after the turn's syncs (`held`), its journal marked for them (`touched`).
    ///
    /// # Errors
    /// A disk operation failed, or its files were found changed
    /// ([`HostError::is_found_changed`]).
    fn carry_one(
        &mut self,
        group: u64,
        output: Output,
        effects: &mut Effects,
        held: &mut Vec<(u64, ReplicaId, Message)>,
        touched: &mut Vec<u64>,
    ) -> Result<(), HostError> {
        // Woken only for what needs them: a message or an answer does not.
        match output {
            Output::Send { to, message } => {
                match message {
                    Message::RequestPrepare { .. } => self.repairs.prepares += 1,
                    Message::RequestSnapshot { .. } => self.repairs.snapshots += 1,
                    _ => {}
                }
                held.push((group, to, message));
            }
            Output::Reply(reply) => effects.replies.push((group, reply)),
            Output::WriteJournal(prepare) => {
                awake_files(&mut self.files, &mut self.sleep, group)?
                    .journal
                    .write_prepare(&prepare)?;
                touched.push(group);
                if let Some(ops) = self.damaged_ops.get_mut(&group) {
                    if ops.remove(&prepare.header.op) {
                        self.repairs.damage_rewritten += 1;
                    }
                    if ops.is_empty() {
                        self.damaged_ops.remove(&group);
                    }
                }
            }
            Output::WriteHeader(header) => {
                awake_files(&mut self.files, &mut self.sleep, group)?
                    .journal
                    .write_header(&header)?;
                touched.push(group);
            }
            Output::SendFromJournal { to, op, checksum } => {
                if let Some(prepare) = awake_files(&mut self.files, &mut self.sleep, group)?
                    .journal
                    .prepare(op, checksum)?
                {
                    held.push((group, to, Message::Prepare(prepare)));
                }
            }
            Output::TruncateJournal { op } => {
                awake_files(&mut self.files, &mut self.sleep, group)?
                    .journal
                    .truncate(op)?;
                touched.push(group);
            }
            Output::PruneJournal { op } => {
                awake_files(&mut self.files, &mut self.sleep, group)?
                    .journal
                    .prune(op)?;
                touched.push(group);
            }
            Output::WriteState(state) => {
                // The shell simulator's seed 7533 (damage, four times the
                // faults): a backup installed a new view whose newest two ops
                // came whole, its state with the new log view was synced but
                // their records were not, and after a power loss it voted that
                // view's log ended two ops earlier: a committed, acknowledged
                // batch was dropped.
                if self.states.get(group).map(|s| s.log_view) != Some(state.log_view) {
                    awake_files(&mut self.files, &mut self.sleep, group)?
                        .journal
                        .log_view_rests_on_writes();
                    // Synced in this turn, before the state: a new log view with no
                    // record written in its turn left the journal waiting for a sync
                    // nothing made, and its files never slept again (an outside review
                    // of issue 24: after a restart every partition of a single node
                    // kept its segments open, 388 descriptors for 300 partitions).
                    touched.push(group);
                }
                self.states.stage(group, state);
            }
            Output::WriteCheckpoint(checkpoint) => {
                awake_files(&mut self.files, &mut self.sleep, group)?
                    .checkpoints
                    .write(&checkpoint)?;
                awake_files(&mut self.files, &mut self.sleep, group)?
                    .journal
                    .checkpointed(&checkpoint)?;
            }
            Output::Applied {
                op,
                checksum,
                result,
                executed,
                ..
            } => {
                let ran = result.as_deref().ok().filter(|_| executed);
                awake_files(&mut self.files, &mut self.sleep, group)?
                    .journal
                    .applied(op, checksum, ran)?;
                effects.applied.push((group, op, result));
            }
            Output::Evicted { .. } => {}
        }
        Ok(())
    }
}
