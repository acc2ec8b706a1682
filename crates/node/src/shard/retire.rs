//! A shard's part of the retirement of ended client sessions: the walk shard 0 starts
//! on every shard (`crate::retirement`), stepped on the shard's timer, and the
//! catching up of partitions that owe a retirement.

use std::sync::Arc;

use tokio::sync::oneshot;

use super::Shard;
use crate::layout::PartitionKey;
use crate::retirement::{RetireBatch, Walk};

/// How often (in shard ticks) a walk looks at its copies again.
pub(super) const RETIRE_EVERY_TICKS: u64 = 5;

/// A walk running on this shard, and who waits for its debt.
#[derive(Debug)]
pub(super) struct ShardWalk {
    walk: Walk,
    done: oneshot::Sender<Vec<PartitionKey>>,
}

impl Shard {
    /// Barriers a shard's walk keeps waiting at once: each wakes its partition's
    /// files, so half the files the shard keeps open.
    fn barrier_budget(&self) -> usize {
        (self.shared.config.open_logs_per_shard / 2).max(1)
    }

    /// Starts a walk of `batch` over this shard's copies; `done` gets its debt.
    pub(super) fn start_walk(
        &mut self,
        batch: Arc<RetireBatch>,
        done: oneshot::Sender<Vec<PartitionKey>>,
        now_ms: u64,
    ) {
        let skipped = self.layout.borrow().created_above(batch.watermark);
        let copies = self.groups.copies();
        let listed = copies.len();
        let copies: Vec<PartitionKey> = copies
            .into_iter()
            .filter(|key| !skipped.contains(key))
            .collect();
        tracing::debug!(
            watermark = batch.watermark,
            listed,
            skipped = listed - copies.len(),
            "retirement walk starts"
        );
        let walk = Walk::start(batch, copies, now_ms);
        self.walk = Some(ShardWalk { walk, done });
        self.step_retirement(now_ms);
    }

    /// Looks at the walk's copies not yet proven, proposes the barriers they need,
    /// and brings the partitions that owe a retirement up to it.
    pub(super) fn step_retirement(&mut self, now_ms: u64) {
        let layout = Arc::clone(&self.layout.borrow());
        let mut proposed = self.groups.catch_up(layout.debts(), |s| layout.is_open(s));
        let budget = self.barrier_budget();
        if let Some(shard_walk) = self.walk.as_mut() {
            let batch = Arc::clone(shard_walk.walk.batch());
            let groups = &self.groups;
            let retires = |s: u64| batch.sessions.contains(&s) || layout.is_retired(s);
            let ended = |s: u64| layout.is_ended(s);
            let watermark = batch.watermark;
            let budget = budget.saturating_sub(groups.barriers_waiting());
            let barriers = shard_walk.walk.step(
                |key| groups.copy_state(key, watermark, retires, ended),
                now_ms,
                budget,
                layout.ended_through(),
            );
            for (key, barrier) in barriers {
                proposed += u64::from(self.groups.retire(key, barrier));
            }
            let unproven = shard_walk.walk.unproven() as u64;
            self.metrics()
                .retirement_unproven
                .store(unproven, std::sync::atomic::Ordering::Relaxed);
            if let Some(debt) = self.walk.as_ref().and_then(|w| w.walk.finished()) {
                let debt = debt.to_vec();
                crate::metrics::add(&self.metrics().retirement_debt, debt.len() as u64);
                if let Some(done) = self.walk.take().map(|w| w.done) {
                    let _ = done.send(debt);
                }
            }
        }
        if proposed > 0 {
            crate::metrics::add(&self.metrics().retirement_barriers, proposed);
            let moved = self.groups.flush();
            self.apply_moved(moved);
        }
    }
}
