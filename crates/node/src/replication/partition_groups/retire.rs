//! A shard's partition copies as the retirement of ended client sessions sees them
//! (`crate::retirement`): what each holds of a batch, and the barriers its primaries
//! propose.

use braid_vsr::Status;

use super::{group_of, key_of, PartitionGroups};
use crate::layout::PartitionKey;
use crate::replication::partition_machine::barrier::{Barrier, BARRIER_SESSIONS_MAX};
use crate::retirement::CopyState;

impl PartitionGroups {
    /// Every partition copy this shard stores.
    pub(crate) fn copies(&self) -> Vec<PartitionKey> {
        self.host
            .replicas()
            .filter_map(|replica| key_of(replica.config().group))
            .collect()
    }

    /// What `key`'s copy here holds of a batch whose watermark is `watermark` and
    /// whose sessions `retires` names (with those already retired whose entry a copy
    /// still holds). Proven once its applied state has the frontier at or above the
    /// watermark and no entry of such a session: every request of the batch in its
    /// log is before the barrier that raised the frontier (and applied), and every
    /// later one is refused by it, so this holds whatever the copy's lag, on a
    /// primary or a backup. A primary's barrier names the batch's sessions it holds
    /// first, then those that ended after the batch (`ended`): its frontier is the
    /// newest end op, so the next walk finds the copy proven already.
    pub(crate) fn copy_state(
        &self,
        key: PartitionKey,
        watermark: u64,
        retires: impl Fn(u64) -> bool,
        ended: impl Fn(u64) -> bool,
    ) -> CopyState {
        let Some(replica) = self.host.replica(group_of(key)) else {
            // Gone (its topic was deleted): nothing of it is left to retire.
            return CopyState::Proven;
        };
        let slices = replica.state().machine().slices();
        let mut held: Vec<u64> = slices.sessions().filter(|s| retires(*s)).collect();
        if slices.frontier() >= watermark && held.is_empty() {
            return CopyState::Proven;
        }
        if replica.is_primary() && replica.status() == Status::Normal {
            held.extend(slices.sessions().filter(|s| !retires(*s) && ended(*s)));
            CopyState::Holds(held)
        } else {
            CopyState::Waiting
        }
    }

    /// Groups with a barrier queued or in flight.
    pub(crate) fn barriers_waiting(&self) -> usize {
        self.clients.values().filter(|c| c.has_barrier()).count()
    }

    /// Queues `barrier` for `key`'s group, which this node leads; nothing if one is
    /// queued or in flight already. Returns whether it was queued.
    pub(crate) fn retire(&mut self, key: PartitionKey, barrier: Barrier) -> bool {
        let group = group_of(key);
        let queued = self.clients.entry(group).or_default().retire(barrier);
        if queued {
            self.pending.push(group);
        }
        queued
    }

    /// Brings partitions that owe a retirement up to it: each one this node leads
    /// whose frontier is below what it owes gets a barrier naming the sessions whose
    /// entries it holds and that are not open (`open`). Returns the barriers queued.
    pub(crate) fn catch_up(
        &mut self,
        debts: impl Iterator<Item = (PartitionKey, u64)>,
        open: impl Fn(u64) -> bool,
    ) -> u64 {
        let mut barriers = Vec::new();
        for (key, owed) in debts {
            let Some(replica) = self.host.replica(group_of(key)) else {
                continue;
            };
            let slices = replica.state().machine().slices();
            if !replica.is_primary() || slices.frontier() >= owed {
                continue;
            }
            let sessions: Vec<u64> = slices
                .sessions()
                .filter(|s| !open(*s))
                .take(BARRIER_SESSIONS_MAX)
                .collect();
            barriers.push((
                key,
                Barrier {
                    frontier: owed,
                    sessions,
                },
            ));
        }
        barriers
            .into_iter()
            .map(|(key, barrier)| u64::from(self.retire(key, barrier)))
            .sum()
    }
}
