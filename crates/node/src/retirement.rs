//! Retiring ended client sessions in batches (seed 001), one shard's part of a
//! node's walk. Pure: the copies come in as what the shard sees of them, the time as
//! milliseconds, and out go the barriers to propose and, at the end, the copies that
//! could not be proven (debt).
//!
//! A walk proves a *batch*: its watermark is the highest end op among the ended
//! sessions the metadata holds when the walk starts, and the batch is every ended
//! session at or below it. The shard lists its stored copies once, when the walk
//! starts; a topic created or deleted during the walk does not restart it (a copy
//! created after the watermark holds no entry of the batch: every request to it was
//! checked against metadata that knew the batch ended, and gets its barrier like any
//! other). A copy is proven once its applied state has its frontier at or above the
//! watermark and no session of the batch holds an entry there: the barrier that
//! raised the frontier comes, in the log, after every request of the batch the
//! partition took, and the frontier refuses every later one (each was checked
//! against metadata older than its session's end). A primary whose copy is not
//! proven proposes a barrier with the watermark as frontier, naming at most 128 of
//! the sessions whose entries it holds; a backup waits for its primary's barrier to
//! be applied, however far behind it is. When the whole walk proved nothing for
//! [`UNPROVABLE_AFTER_MS`], what is left is debt.

use std::collections::BTreeSet;
use std::sync::Arc;

use crate::layout::PartitionKey;
use crate::replication::partition_machine::barrier::{Barrier, BARRIER_SESSIONS_MAX};

/// A walk that proved nothing for this long gives what it has not proven up as debt.
pub(crate) const UNPROVABLE_AFTER_MS: u64 = 2_000;

/// The sessions one walk retires.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RetireBatch {
    /// The highest end op among them.
    pub(crate) watermark: u64,
    /// Every session ended at or below the watermark, by id.
    pub(crate) sessions: BTreeSet<u64>,
}

/// What a shard sees of one stored copy, for a batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum CopyState {
    /// Its frontier is at or above the watermark and no session of the batch holds
    /// an entry in it.
    Proven,
    /// This node's replica is the primary and the copy is not proven: a barrier
    /// raises its frontier and removes the entries of these sessions of the batch
    /// (in id order; none if it holds none).
    Holds(Vec<u64>),
    /// Not proven, and nothing this node can do but wait: a backup whose primary's
    /// barrier is not applied here yet, a group without a primary.
    Waiting,
}

/// One shard's part of a node's walk.
#[derive(Debug)]
pub(crate) struct Walk {
    batch: Arc<RetireBatch>,
    unproven: BTreeSet<PartitionKey>,
    last_progress_ms: u64,
    /// The copies given up as unprovable, once the walk ended.
    debt: Option<Vec<PartitionKey>>,
}

impl Walk {
    /// Starts a walk of `batch` over the copies stored here now.
    pub(crate) fn start(
        batch: Arc<RetireBatch>,
        copies: impl IntoIterator<Item = PartitionKey>,
        now_ms: u64,
    ) -> Self {
        Self {
            batch,
            unproven: copies.into_iter().collect(),
            last_progress_ms: now_ms,
            debt: None,
        }
    }

    /// The batch this walk proves.
    pub(crate) fn batch(&self) -> &Arc<RetireBatch> {
        &self.batch
    }

    /// Looks at every copy not yet proven (`look` says what it is now) at `now_ms`:
    /// the barriers to propose, one per copy this node leads that is not proven, at
    /// most `budget` (a barrier wakes its partition's files: a walk over thousands of
    /// sleeping partitions proposes them a few at a time, never all at once). A copy
    /// that is proven stays proven (nothing of the batch can come back). Each barrier
    /// raises the frontier to `ended_through`, the newest end op this node knows, or
    /// to the watermark if that is higher: sessions that ended while this walk ran are
    /// then proven gone by the same barrier, and the next walk finds the copy done.
    pub(crate) fn step(
        &mut self,
        mut look: impl FnMut(PartitionKey) -> CopyState,
        now_ms: u64,
        budget: usize,
        ended_through: u64,
    ) -> Vec<(PartitionKey, Barrier)> {
        if self.debt.is_some() {
            return Vec::new();
        }
        let mut barriers = Vec::new();
        let before = self.unproven.len();
        let frontier = self.batch.watermark.max(ended_through);
        self.unproven.retain(|key| match look(*key) {
            CopyState::Proven => false,
            CopyState::Holds(_) if barriers.len() >= budget => true,
            CopyState::Holds(sessions) => {
                let sessions: Vec<u64> = sessions.into_iter().take(BARRIER_SESSIONS_MAX).collect();
                barriers.push((*key, Barrier { frontier, sessions }));
                true
            }
            CopyState::Waiting => true,
        });
        if self.unproven.len() < before {
            self.last_progress_ms = now_ms;
        }
        if self.unproven.is_empty()
            || now_ms.saturating_sub(self.last_progress_ms) >= UNPROVABLE_AFTER_MS
        {
            self.debt = Some(std::mem::take(&mut self.unproven).into_iter().collect());
        }
        barriers
    }

    /// The copies not proven yet.
    pub(crate) fn unproven(&self) -> usize {
        self.unproven.len()
    }

    /// The copies given up as debt, once the walk has ended (all proven: empty).
    pub(crate) fn finished(&self) -> Option<&[PartitionKey]> {
        self.debt.as_deref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn key(partition: u32) -> PartitionKey {
        PartitionKey {
            topic_id: 1,
            partition,
        }
    }

    fn batch(watermark: u64, sessions: &[u64]) -> Arc<RetireBatch> {
        Arc::new(RetireBatch {
            watermark,
            sessions: sessions.iter().copied().collect(),
        })
    }

    /// A primary holding entries gets a barrier each look until it is applied; a
    /// backup waits; once every copy is proven the walk ends with no debt.
    #[test]
    fn copies_are_proven_by_barriers_and_the_walk_ends_with_no_debt() {
        let mut walk = Walk::start(batch(40, &[7, 9]), (0..3).map(key), 0);
        let mut states: HashMap<u32, CopyState> = HashMap::from([
            (0, CopyState::Proven),
            (1, CopyState::Holds(vec![7, 9])),
            (2, CopyState::Waiting),
        ]);
        let barriers = walk.step(|k| states[&k.partition].clone(), 10, 8, 0);
        assert_eq!(
            barriers,
            vec![(
                key(1),
                Barrier {
                    frontier: 40,
                    sessions: vec![7, 9]
                }
            )]
        );
        assert_eq!(walk.finished(), None);
        states.insert(0, CopyState::Holds(vec![7]));
        states.insert(1, CopyState::Proven);
        let barriers = walk.step(|k| states[&k.partition].clone(), 1_500, 8, 0);
        assert!(barriers.is_empty(), "a proven copy is not looked at again");
        states.insert(2, CopyState::Proven);
        walk.step(|k| states[&k.partition].clone(), 3_000, 8, 0);
        assert_eq!(walk.finished(), Some(&[][..]));
    }

    /// Only a whole walk that proved nothing for 2 s gives up, and then every copy
    /// left is debt; a barrier names at most 128 sessions.
    #[test]
    fn a_walk_that_proves_nothing_for_two_seconds_leaves_debt() {
        let many: Vec<u64> = (1..=300).collect();
        let mut walk = Walk::start(batch(400, &many), (0..4).map(key), 0);
        let mut proven = 0;
        let look = |k: PartitionKey, proven: u32| {
            if k.partition < proven {
                CopyState::Proven
            } else if k.partition == 3 {
                CopyState::Holds(many.clone())
            } else {
                CopyState::Waiting
            }
        };
        let barriers = walk.step(|k| look(k, proven), 0, 8, 0);
        assert_eq!(barriers[0].1.sessions.len(), BARRIER_SESSIONS_MAX);
        proven = 1;
        walk.step(|k| look(k, proven), 1_900, 8, 0);
        walk.step(|k| look(k, proven), 3_800, 8, 0);
        assert_eq!(walk.finished(), None, "it proved one 1.9 s ago");
        walk.step(|k| look(k, proven), 3_900, 8, 0);
        assert_eq!(walk.finished(), Some(&[key(1), key(2), key(3)][..]));
        assert!(walk.step(|k| look(k, proven), 4_000, 8, 0).is_empty());
    }

    /// At most `budget` barriers a look: the others wait for a later one.
    #[test]
    fn a_look_proposes_at_most_its_budget_of_barriers() {
        let mut walk = Walk::start(batch(40, &[7]), (0..10).map(key), 0);
        let barriers = walk.step(|_| CopyState::Holds(vec![7]), 0, 3, 0);
        assert_eq!(barriers.len(), 3);
        assert_eq!(walk.unproven(), 10);
        let barriers = walk.step(
            |k| {
                if k.partition < 3 {
                    CopyState::Proven
                } else {
                    CopyState::Holds(vec![7])
                }
            },
            50,
            3,
            0,
        );
        assert_eq!(
            barriers
                .iter()
                .map(|(k, _)| k.partition)
                .collect::<Vec<_>>(),
            [3, 4, 5]
        );
    }

    /// A barrier raises the frontier to the newest end op the node knows when that is
    /// above the watermark (sessions that ended during the walk), never below it.
    #[test]
    fn a_barrier_raises_the_frontier_to_the_newest_end_op() {
        let mut walk = Walk::start(batch(40, &[7]), (0..2).map(key), 0);
        let barriers = walk.step(|_| CopyState::Holds(vec![7, 9]), 0, 1, 55);
        assert_eq!(
            barriers,
            vec![(
                key(0),
                Barrier {
                    frontier: 55,
                    sessions: vec![7, 9]
                }
            )]
        );
        let barriers = walk.step(|_| CopyState::Holds(vec![7]), 10, 1, 30);
        assert_eq!(barriers[0].1.frontier, 40, "never below the watermark");
    }
}
