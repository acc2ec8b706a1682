//! Shard 0's side of the retirement of ended client sessions (seed 001): this node's
//! walk, started on every shard when the metadata holds sessions ended past what the
//! node last reported, and its report; and, on the coordinator, the `FinalizeSession`
//! committed once every member has reported past what is retired.

use std::sync::Arc;

use tokio::sync::oneshot;

use super::{MetaService, Waiter};
use crate::layout::PartitionKey;
use crate::mailbox::{Control, NodeShared};
use crate::metadata::{op, retirement::DEBT_MAX, MetaOp};
use crate::retirement::RetireBatch;

/// A report or finalize not applied this long after it was proposed is proposed
/// again (it was lost with a view change).
const RETRY_AFTER_MS: u64 = 5_000;

/// A walk starts once no session has ended for this long: sessions that end
/// together (a client closing its pool, a deploy) are retired by one walk, not one
/// walk for the first and another for the rest, each barrier on every partition.
const GATHER_QUIET_MS: u64 = 100;

/// ... or once the first session past what this node reported ended this long ago,
/// however many keep ending.
const GATHER_MAX_MS: u64 = 1_000;

/// This node's walk, as shard 0 follows it.
#[derive(Debug, Default)]
pub(super) enum NodeWalk {
    /// No walk runs.
    #[default]
    Idle,
    /// Sessions ended past what this node reported: waiting for the others that end
    /// with them (the newest end op `watermark` first seen at `changed`, the first
    /// at `since`).
    Gathering {
        watermark: u64,
        since: u64,
        changed: u64,
    },
    /// Every shard walks; each answers its debt.
    Walking {
        watermark: u64,
        answers: Vec<oneshot::Receiver<Vec<PartitionKey>>>,
        debt: Vec<PartitionKey>,
    },
    /// The report was proposed at `since`.
    Reporting { watermark: u64, since: u64 },
}

impl MetaService {
    /// On every node: starts a walk when the metadata holds sessions ended past what
    /// this node reported, gathers the shards' answers, and reports. On the
    /// coordinator: finalizes what every member has reported.
    pub(super) fn retire_sessions(&mut self, shared: &Arc<NodeShared>, now: u64) {
        shared.metrics[0].finalize_ops.store(
            self.finalizes_committed,
            std::sync::atomic::Ordering::Relaxed,
        );
        if !shared
            .metadata_caught_up
            .load(std::sync::atomic::Ordering::Relaxed)
        {
            return;
        }
        self.step_node_walk(shared, now);
        self.finalize_if_due(shared, now);
    }

    fn step_node_walk(&mut self, shared: &Arc<NodeShared>, now: u64) {
        let node = shared.cluster.node_id;
        let state = self.group.state();
        let reported = state
            .retirement
            .reports
            .get(&node)
            .map_or(0, |r| r.watermark)
            .max(state.retirement.retired_through);
        let newest_end = state
            .sessions
            .values()
            .filter_map(|s| s.ended_at)
            .max()
            .unwrap_or(0);
        match &mut self.node_walk {
            NodeWalk::Idle => {
                if newest_end > reported {
                    self.node_walk = NodeWalk::Gathering {
                        watermark: newest_end,
                        since: now,
                        changed: now,
                    };
                }
            }
            NodeWalk::Gathering {
                watermark,
                since,
                changed,
            } => {
                if newest_end != *watermark {
                    *watermark = newest_end;
                    *changed = now;
                }
                if newest_end <= reported {
                    self.node_walk = NodeWalk::Idle;
                    return;
                }
                let quiet = now.saturating_sub(*changed) >= GATHER_QUIET_MS;
                if !quiet && now.saturating_sub(*since) < GATHER_MAX_MS {
                    return;
                }
                let watermark = newest_end;
                let sessions = state
                    .sessions
                    .iter()
                    .filter(|(_, s)| s.ended_at.is_some_and(|end| end <= watermark))
                    .map(|(id, _)| *id)
                    .collect();
                let batch = Arc::new(RetireBatch {
                    watermark,
                    sessions,
                });
                let answers = shared
                    .controls
                    .iter()
                    .filter_map(|control| {
                        let (done, answer) = oneshot::channel();
                        let batch = Arc::clone(&batch);
                        control
                            .send(Control::Retire { batch, done })
                            .ok()
                            .map(|()| answer)
                    })
                    .collect();
                tracing::debug!(watermark, "a walk for ended client sessions starts");
                self.node_walk = NodeWalk::Walking {
                    watermark,
                    answers,
                    debt: Vec::new(),
                };
            }
            NodeWalk::Walking {
                watermark,
                answers,
                debt,
            } => {
                let mut lost = false;
                answers.retain_mut(|answer| match answer.try_recv() {
                    Ok(copies) => {
                        debt.extend(copies);
                        false
                    }
                    Err(oneshot::error::TryRecvError::Empty) => true,
                    Err(oneshot::error::TryRecvError::Closed) => {
                        lost = true;
                        false
                    }
                });
                if lost {
                    // A shard went away (the node stops): no report.
                    self.node_walk = NodeWalk::Idle;
                    return;
                }
                if !answers.is_empty() {
                    return;
                }
                let watermark = *watermark;
                let mut debt: Vec<_> = debt
                    .iter()
                    .map(|key| (key.topic_id, key.partition))
                    .collect();
                debt.sort_unstable();
                debt.truncate(DEBT_MAX);
                tracing::debug!(watermark, debt = debt.len(), "a walk ended: reported");
                let report = MetaOp::ReportRetirement(op::ReportRetirement {
                    node,
                    watermark,
                    debt,
                });
                self.node_walk = NodeWalk::Reporting {
                    watermark,
                    since: now,
                };
                self.propose(shared, report, Waiter::Report);
            }
            NodeWalk::Reporting { watermark, since } => {
                if reported >= *watermark || now.saturating_sub(*since) >= RETRY_AFTER_MS {
                    self.node_walk = NodeWalk::Idle;
                }
            }
        }
    }

    fn finalize_if_due(&mut self, shared: &Arc<NodeShared>, now: u64) {
        if self.group.primary() != Some(shared.cluster.node_id) {
            return;
        }
        let retirement = &self.group.state().retirement;
        if let Some((through, since)) = self.finalizing {
            if retirement.retired_through < through && now.saturating_sub(since) < RETRY_AFTER_MS {
                return;
            }
        }
        let mut members: Vec<u8> = shared.cluster.members.iter().map(|m| m.id).collect();
        if members.is_empty() {
            members.push(shared.cluster.node_id);
        }
        let Some(finalize) = retirement.due(members) else {
            return;
        };
        tracing::info!(
            retired_through = finalize.retired_through,
            debt = finalize.debt.len(),
            "every member proved its copies: finalizing ended client sessions"
        );
        self.finalizing = Some((finalize.retired_through, now));
        self.propose(shared, MetaOp::FinalizeSession(finalize), Waiter::Finalize);
    }
}
