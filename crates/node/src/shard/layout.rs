//! How a shard takes a new layout: the partitions it adds are opened a chunk at a time
//! between the turns of the shard's loop, and the shard routes by the layout before
//! until the last chunk is open, so no client reaches a topic whose partitions are half
//! opened; then the partitions it removes are dropped with their files. A change costs
//! what it changes ([`crate::layout::LayoutChange`]); only the start and an installed metadata
//! checkpoint bring a whole layout, which is compared with everything the shard holds.

use std::collections::HashSet;
use std::sync::Arc;

use super::{Shard, ShardError};
use crate::layout::{Layout, LayoutUpdate, PartitionKey, TopicRoute};

/// Partitions a shard opens, and recovers, together: their files are open until then
/// (two descriptors each).
pub(super) const OPENED_TOGETHER: usize = 256;

/// Partitions of a new layout a shard opens at a time: a chunk takes some tens of
/// milliseconds (its directories' syncs are shared by the chunk), and the next waits as
/// long as it took ([`Shard::apply_step`]), so a large create takes at most half of
/// the shard's time and requests are served between. (An idle shard waits too: telling
/// idle from busy by the requests queued at the instant a chunk ends went wrong, the
/// connections having had no turn to queue theirs, and the data path fell to 2%.)
const OPENED_PER_CHUNK: usize = 32;

/// A layout update queued on a shard, and how far its application is.
pub(super) struct Applying {
    update: LayoutUpdate,
    done: Option<tokio::sync::oneshot::Sender<Result<(), ShardError>>>,
    plan: Option<LayoutPlan>,
    /// Once it routes: the partitions it took away, still to drop.
    dropping: Option<Vec<PartitionKey>>,
}

/// The partitions an update still has to open on a shard, taken from the back.
struct LayoutPlan {
    found: Vec<(PartitionKey, Arc<TopicRoute>)>,
    created: Vec<(PartitionKey, Arc<TopicRoute>)>,
    /// Whether it opens any: the board then needs every row again.
    opens: bool,
}

impl Shard {
    /// Opens the partitions of `layout` this shard owns and drops those it no longer
    /// has (their topic was deleted: the data goes too), all at once (at start, before
    /// the shard serves).
    pub(crate) fn apply_layout(&mut self, layout: Arc<Layout>) -> Result<(), ShardError> {
        let update = LayoutUpdate::Whole(layout);
        let mut plan = self.plan_layout(&update);
        // No more at once than the open-log budget: a start held 256 partitions' files
        // open per shard whatever the budget, and a node sized by it (descriptors at
        // least twice the budget, docs/operations.md) failed to start with "Too many
        // open files" (an outside review of issue 24, 300 partitions, a budget of 20).
        let together = OPENED_TOGETHER.min(self.shared.config.open_logs_per_shard.max(1));
        while !self.open_some(&mut plan, together)? {}
        let gone = self.finish_layout(update, plan.opens);
        for key in gone {
            self.drop_partition(key);
        }
        Ok(())
    }

    /// Queues `update` to be applied a chunk of partitions at a time between the turns
    /// of the shard's loop ([`Shard::apply_step`]), after those queued before it, and
    /// takes its first step. `done` hears when it is whole. Until then the shard keeps
    /// routing by the layout before, so no client reaches a topic whose partitions are
    /// half opened, and its produces and fetches go on between the chunks (a topic of
    /// 10,000 partitions held them for 16.8 s when it was opened in one go).
    pub(crate) fn queue_layout(
        &mut self,
        update: LayoutUpdate,
        done: Option<tokio::sync::oneshot::Sender<Result<(), ShardError>>>,
    ) {
        self.applying.push_back(Applying {
            update,
            done,
            plan: None,
            dropping: None,
        });
        if self.applying.len() == 1 {
            self.apply_step();
        }
    }

    /// Whether a queued layout still has partitions to open or to drop.
    pub(crate) fn applying(&self) -> bool {
        !self.applying.is_empty()
    }

    /// After a turn of requests or frames: takes a step of the queued layouts if one
    /// is due.
    pub(super) fn apply_if_due(&mut self) {
        if self.applying() && tokio::time::Instant::now() >= self.apply_resume {
            self.apply_step();
        }
    }

    /// Opens the next chunk of the oldest queued update's partitions, and applies it
    /// once none is left; updates that open nothing on this shard apply at once.
    pub(crate) fn apply_step(&mut self) {
        while let Some(mut applying) = self.applying.pop_front() {
            let started = tokio::time::Instant::now();
            if let Some(gone) = applying.dropping.as_mut() {
                // Routed no more; their groups and files go a chunk at a time (a
                // stream of 3,000 partitions dropped at once held another stream's
                // produces for a second), and the change is done once they are gone.
                for _ in 0..OPENED_PER_CHUNK {
                    let Some(key) = gone.pop() else { break };
                    self.drop_partition(key);
                }
                self.partitions_changed();
                self.apply_resume = tokio::time::Instant::now() + started.elapsed();
                if gone.is_empty() {
                    if let Some(done) = applying.done {
                        let _ = done.send(Ok(()));
                    }
                } else {
                    self.applying.push_front(applying);
                }
                return;
            }
            // Planned when it comes first: against the layout the ones before made.
            let mut plan = match applying.plan.take() {
                Some(plan) => plan,
                None => self.plan_layout(&applying.update),
            };
            let result = self.open_some(&mut plan, OPENED_PER_CHUNK);
            if plan.opens {
                // The next chunk waits as long as this one took: the data path keeps half.
                self.apply_resume = tokio::time::Instant::now() + started.elapsed();
            }
            let result = match result {
                Ok(false) => {
                    applying.plan = Some(plan);
                    self.applying.push_front(applying);
                    return;
                }
                Ok(true) => {
                    let gone = self.finish_layout(applying.update.clone(), plan.opens);
                    if !gone.is_empty() {
                        applying.dropping = Some(gone);
                        self.applying.push_front(applying);
                        if plan.opens {
                            return;
                        }
                        continue;
                    }
                    Ok(())
                }
                Err(err) => {
                    tracing::error!(shard = self.id, %err, "applying the topic layout");
                    Err(err)
                }
            };
            if let Some(done) = applying.done {
                let _ = done.send(result);
            }
            if plan.opens {
                return;
            }
        }
    }

    /// What applying `update` takes on this shard: its partitions not open yet, those
    /// with files first.
    fn plan_layout(&self, update: &LayoutUpdate) -> LayoutPlan {
        let shards = self.shared.shards();
        let added: Vec<(PartitionKey, Arc<TopicRoute>)> = match update {
            LayoutUpdate::Whole(layout) => layout
                .partitions()
                .map(|(key, topic)| (key, Arc::clone(topic)))
                .collect(),
            LayoutUpdate::Change(change) => self.layout.borrow().added_by(change),
        };
        let mut found = Vec::new();
        let mut created = Vec::new();
        for (key, topic) in added {
            if key.shard(shards) != self.id
                || self.partitions.contains_key(&key)
                || self.refused.contains_key(&key)
            {
                continue;
            }
            if key.dir(self.shared.data_dir()).exists() {
                found.push((key, topic));
            } else {
                created.push((key, topic));
            }
        }
        // Taken from the back: reversed, so they open in the layout's order.
        found.reverse();
        created.reverse();
        let opens = !found.is_empty() || !created.is_empty();
        LayoutPlan {
            found,
            created,
            opens,
        }
    }

    /// Opens up to `count` partitions of `plan`; true once none is left.
    fn open_some(&mut self, plan: &mut LayoutPlan, count: usize) -> Result<bool, ShardError> {
        if !plan.found.is_empty() {
            let chunk: Vec<_> = (0..count).map_while(|_| plan.found.pop()).collect();
            for (key, topic) in &chunk {
                self.open_partition(*key, topic)?;
            }
            self.settle_opened(&chunk)?;
            self.groups.sleep_opened(chunk.iter().map(|(key, _)| *key));
        } else if !plan.created.is_empty() {
            let chunk: Vec<_> = (0..count).map_while(|_| plan.created.pop()).collect();
            // New partitions: their directories' syncs, several per partition and each
            // an ext4 journal commit, are made once for the chunk, before their groups
            // write a state (a state on disk says the files are). Nothing in them is
            // acknowledged before this returns.
            let opened = braid_storage::disk::with_dir_syncs_deferred(
                || -> std::io::Result<Result<(), ShardError>> {
                    for (key, topic) in &chunk {
                        if let Err(err) = self.open_partition(*key, topic) {
                            return Ok(Err(err));
                        }
                    }
                    Ok(Ok(()))
                },
            );
            opened.map_err(ShardError::DirSync)??;
            self.settle_opened(&chunk)?;
        }
        Ok(plan.found.is_empty() && plan.created.is_empty())
    }

    /// Routes by `update` from now on, and gives the partitions it takes away (a whole
    /// layout, at start, drops them at once and gives none).
    fn finish_layout(&mut self, update: LayoutUpdate, opened: bool) -> Vec<PartitionKey> {
        let shards = self.shared.shards();
        let gone: Vec<PartitionKey> = match &update {
            LayoutUpdate::Whole(layout) => {
                let wanted: HashSet<PartitionKey> = layout
                    .partitions()
                    .map(|(key, _)| key)
                    .filter(|key| key.shard(shards) == self.id)
                    .collect();
                self.partitions
                    .keys()
                    .chain(self.refused.keys())
                    .filter(|k| !wanted.contains(k))
                    .copied()
                    .collect()
            }
            LayoutUpdate::Change(change) => self
                .layout
                .borrow()
                .removed_by(change)
                .into_iter()
                .filter(|k| self.partitions.contains_key(k) || self.refused.contains_key(k))
                .collect(),
        };
        let (access, gone) = match update {
            LayoutUpdate::Whole(layout) => {
                let dropped = !gone.is_empty();
                for key in gone {
                    self.drop_partition(key);
                }
                if dropped {
                    self.partitions_changed();
                }
                *self.layout.borrow_mut() = layout;
                (true, Vec::new())
            }
            LayoutUpdate::Change(change) => {
                // In place: connections hold the layout only within a call.
                Arc::make_mut(&mut *self.layout.borrow_mut()).apply(&change);
                (change.changes_access(), gone)
            }
        };
        if opened {
            self.partitions_changed();
        }
        if access {
            self.access_changed
                .send_modify(|generation| *generation += 1);
        }
        gone
    }

    /// Publishes the partition counts, and the board's rows in full next time.
    pub(super) fn partitions_changed(&mut self) {
        self.metrics().partitions.store(
            self.partitions.len() as u64,
            std::sync::atomic::Ordering::Relaxed,
        );
        self.metrics().partitions_refused.store(
            self.refused.len() as u64,
            std::sync::atomic::Ordering::Relaxed,
        );
        self.layout_changed = true;
    }

    /// Drops a partition whose topic is gone, with its files.
    fn drop_partition(&mut self, key: PartitionKey) {
        self.partitions.remove(&key);
        self.refused.remove(&key);
        self.groups.remove(key);
        if let Ok(mut published) = self.shared.partitions_published.write() {
            published.remove(&key);
        }
        self.dirty.remove(&key);
        let dir = key.dir(self.shared.data_dir());
        if let Err(err) = std::fs::remove_dir_all(&dir) {
            tracing::warn!(dir = %dir.display(), %err, "could not remove a deleted partition");
        }
        if let Some(parent) = dir.parent() {
            let _ = std::fs::remove_dir(parent);
        }
    }
}
