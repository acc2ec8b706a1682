//! A partition whose files changed while they slept (damage at rest, a file removed
//! or replaced) is opened again from them, alone, as a start opens it: a member of a
//! cluster repairs what changed from its peers, a single node refuses that partition
//! and serves the others. (Until 2026-12-06 the first use of such a partition stopped
//! every partition group of its shard until the node was restarted, and a cluster
//! member kept leading the stopped groups: an outside review's finding.) A single node
//! that meets damage in a partition's log in use (a read, the scrub) refuses it so.
//!
//! A partition whose files could not be opened for want of a file descriptor (EMFILE,
//! ENFILE: at a wake, a segment's roll, or the reopen itself) is opened again every
//! [`REOPEN_RETRY_MS`] until it can be, answering `Busy` meanwhile: nothing on disk
//! changed, and the shard's other partitions go on. (Until 2026-12-07 the reopen that
//! followed such a wake, refused a descriptor too, stopped every partition group of the
//! shard until a restart.)

use std::sync::Arc;

use braid_proto::client::ErrorCode;

use super::Shard;
use crate::error::NodeError;
use crate::layout::PartitionKey;
use crate::mailbox::now_ms;
use crate::metrics::add;
use crate::replication::partition_groups::Dropped;

/// How long a partition whose open was refused a file descriptor waits before the
/// next try.
pub(super) const REOPEN_RETRY_MS: u64 = 250;

/// A partition whose files could not be opened for want of a descriptor.
#[derive(Debug)]
pub(super) struct WaitingReopen {
    /// When to try again (ms since the epoch).
    due_ms: u64,
    /// The open's error, for the clients answered meanwhile.
    reason: String,
}

impl Shard {
    /// Opens again every partition whose group its files' wake dropped, and refuses
    /// every one dropped for damage a lone node met in use.
    pub(super) fn reopen_changed_files(&mut self) {
        let reopen = self.groups.take_reopen();
        if reopen.is_empty() {
            return;
        }
        for (key, dropped) in reopen {
            // One waiting for descriptors is tried again when its wait is over.
            if !self.reopen_waiting.contains_key(&key) {
                self.reopen(key, &dropped);
            }
        }
        self.partitions_changed();
    }

    /// Opens again the partitions whose wait for file descriptors is over.
    pub(super) fn retry_waiting_reopens(&mut self, now_ms: u64) {
        let due: Vec<(PartitionKey, String)> = self
            .reopen_waiting
            .iter()
            .filter(|(_, waiting)| waiting.due_ms <= now_ms)
            .map(|(key, waiting)| (*key, waiting.reason.clone()))
            .collect();
        if due.is_empty() {
            return;
        }
        for (key, reason) in due {
            self.reopen(key, &Dropped::Reopen(reason));
        }
        self.partitions_changed();
    }

    /// What a request for partition `key` is answered while it waits for file
    /// descriptors to be opened again: `Busy`, naming why (a producer retries it).
    pub(super) fn waiting_for_descriptors(&self, key: PartitionKey) -> Option<NodeError> {
        self.reopen_waiting.get(&key).map(|waiting| {
            NodeError::new(
                ErrorCode::Busy,
                format!(
                    "the partition's files could not be opened for want of a file \
                     descriptor, and are tried again every {REOPEN_RETRY_MS} ms (raise the \
                     node's descriptor limit, ulimit -n): {}",
                    waiting.reason
                ),
            )
        })
    }

    fn reopen(&mut self, key: PartitionKey, dropped: &Dropped) {
        let topic = self
            .layout
            .borrow()
            .partitions()
            .find(|(k, _)| *k == key)
            .map(|(_, topic)| Arc::clone(topic));
        let Some(topic) = topic else {
            // Its topic went while the group was dropped: nothing to open.
            return;
        };
        let retried = self.reopen_waiting.remove(&key).is_some();
        // Its readers' view starts again from what the open (or the refusal) finds.
        self.partitions.remove(&key);
        if let Ok(mut published) = self.shared.partitions_published.write() {
            published.remove(&key);
        }
        let reason = match dropped {
            Dropped::Reopen(reason) => reason,
            Dropped::Refuse(damage) => {
                self.refuse(key, &topic, damage);
                return;
            }
        };
        if !retried {
            tracing::warn!(
                topic = %topic.name,
                partition = key.partition,
                %reason,
                "a partition's files changed while they slept, or could not be opened: it \
                 is opened again from them (a cluster member repairs them from its peers; a \
                 single node refuses the partition if they are damaged)"
            );
        }
        let opened = self
            .open_partition(key, &topic)
            .and_then(|()| self.settle_opened(&[(key, Arc::clone(&topic))]));
        match opened {
            Ok(()) => {
                if retried {
                    tracing::info!(
                        topic = %topic.name,
                        partition = key.partition,
                        "a partition that waited for file descriptors is open again"
                    );
                }
            }
            Err(err) if err.is_out_of_descriptors() => {
                // Half opened, its group is dropped again: nothing of it stays awake.
                self.partitions.remove(&key);
                if let Ok(mut published) = self.shared.partitions_published.write() {
                    published.remove(&key);
                }
                self.groups.drop_half_opened(key);
                add(&self.metrics().opens_without_descriptors, 1);
                if !retried {
                    tracing::error!(
                        topic = %topic.name,
                        partition = key.partition,
                        %err,
                        "a partition's files could not be opened for want of a file \
                         descriptor: it answers Busy and is opened again every {REOPEN_RETRY_MS} \
                         ms, while the others serve; raise the descriptor limit (ulimit -n)"
                    );
                }
                self.reopen_waiting.insert(
                    key,
                    WaitingReopen {
                        due_ms: now_ms() + REOPEN_RETRY_MS,
                        reason: err.to_string(),
                    },
                );
            }
            Err(err) => {
                // Not openable at all (a disk that fails, say): as at a start, the
                // shard's groups cannot go on with it.
                self.groups.stop(err.to_string());
            }
        }
    }
}
