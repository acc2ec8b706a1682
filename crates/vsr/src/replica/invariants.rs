//! What must hold after every step. The few that keep agreement and cost nothing (a
//! view, a commit, never goes back; nothing applied beyond the commit; the durable view
//! never ahead of the view) are asserted in every build, release too: a replica that
//! breaks one stops rather than acknowledge or apply on a broken state. The rest, which
//! walk the journal, are checked in debug builds and with the `invariants` feature (on in
//! the simulator's release runs); see the `invariant!` macro.

use super::{Replica, Status};
use crate::state::StateMachine;

/// What a step may only move forward.
#[derive(Debug, Clone, Copy)]
pub(super) struct Progress {
    view: u64,
    commit_min: u64,
    commit_max: u64,
}

impl<S: StateMachine> Replica<S> {
    pub(super) fn progress(&self) -> Progress {
        Progress {
            view: self.view,
            commit_min: self.commit_min,
            commit_max: self.commit_max,
        }
    }

    /// The agreement invariants checked in every build, after every step.
    pub(super) fn check_progress(&self, before: Progress) {
        let group = self.config.group;
        let replica = self.config.replica;
        assert!(
            self.view >= before.view,
            "g{group}r{replica}: view went back from {} to {}",
            before.view,
            self.view
        );
        assert!(
            self.commit_min >= before.commit_min && self.commit_max >= before.commit_max,
            "g{group}r{replica}: commit went back from {}/{} to {}/{}",
            before.commit_min,
            before.commit_max,
            self.commit_min,
            self.commit_max
        );
        assert!(
            self.commit_min <= self.commit_max,
            "g{group}r{replica}: applied {} beyond commit {}",
            self.commit_min,
            self.commit_max
        );
        assert!(
            self.durable.view <= self.view && self.log_view <= self.view,
            "g{group}r{replica}: durable view {} or log view {} ahead of view {}",
            self.durable.view,
            self.log_view,
            self.view
        );
    }

    pub(super) fn check_invariants(&self) {
        invariant!(self.commit_min <= self.commit_max, "applied beyond commit");
        invariant!(self.durable.view <= self.view, "durable view ahead of view");
        invariant!(
            self.durable.log_view <= self.durable.view,
            "durable log view ahead of durable view"
        );
        invariant!(self.log_view <= self.view, "log view ahead of view");
        invariant!(
            self.checkpoint_op <= self.commit_min,
            "checkpoint beyond applied"
        );
        invariant!(
            self.status() != Status::Normal || self.log_view == self.view,
            "normal in view {} with log view {}",
            self.view,
            self.log_view
        );
        invariant!(
            self.journal.contains_key(&self.commit_min),
            "no anchor at the applied op {}",
            self.commit_min
        );
        for (op, entry) in &self.journal {
            invariant!(
                entry.header.op == *op && entry.header.group == self.config.group,
                "journal slot {op} holds op {} of group {}",
                entry.header.op,
                entry.header.group
            );
            invariant!(*op <= self.op, "journal entry {op} above op {}", self.op);
        }
        // The log this view vouches for is one chain: adjacent canonical entries link.
        for ((below_op, below), (above_op, above)) in
            self.journal.iter().zip(self.journal.iter().skip(1))
        {
            if *above_op == below_op + 1 && below.canonical && above.canonical {
                invariant!(
                    above.header.parent == below.header.checksum,
                    "g{}r{} v{} {:?}: canonical op {above_op} ({:x}, view {}) does not chain to canonical op {below_op} ({:x}, view {})",
                    self.config.group,
                    self.config.replica,
                    self.view,
                    self.status(),
                    above.header.checksum >> 112,
                    above.header.view,
                    below.header.checksum >> 112,
                    below.header.view
                );
            }
        }
        if self.is_primary() {
            for (op, acks) in self.prepare_oks.iter() {
                invariant!(
                    *op > self.commit_max && *op <= self.op,
                    "primary counts acks for op {op} outside ({}, {}]",
                    self.commit_max,
                    self.op
                );
                invariant!(
                    acks.iter()
                        .all(|r| *r < self.config.replica_count && *r != self.config.replica),
                    "an ack from outside the group counted for op {op}"
                );
            }
            for op in (self.commit_max + 1)..=self.op {
                invariant!(
                    self.journal
                        .get(&op)
                        .is_some_and(|e| e.body.is_some() && e.canonical),
                    "g{}r{} v{}: primary lacks its own uncommitted op {op} (commit {}, op {})",
                    self.config.group,
                    self.config.replica,
                    self.view,
                    self.commit_max,
                    self.op
                );
            }
        }
    }
}
