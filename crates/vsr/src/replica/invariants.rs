//! What must hold after every step. Checked in debug builds and with the `invariants`
//! feature (on in the simulator's release runs); see the `invariant!` macro.

use super::{Replica, Status};
use crate::state::StateMachine;

impl<S: StateMachine> Replica<S> {
    pub(super) fn check_invariants(&self) {
        invariant!(self.commit_min <= self.commit_max, "applied beyond commit");
        invariant!(self.durable.view <= self.view, "durable view ahead of view");
        invariant!(
            self.durable.log_view <= self.durable.view,
            "durable log view ahead of durable view"
        );
        invariant!(self.log_view <= self.view, "log view ahead of view");
        invariant!(
            self.checkpoint.op <= self.commit_min,
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
            for (op, acks) in &self.prepare_oks {
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
