//! A partition whose files changed while they slept (damage at rest, a file removed
//! or replaced) is opened again from them, alone, as a start opens it: a member of a
//! cluster repairs what changed from its peers, a single node refuses that partition
//! and serves the others. (Until 2026-12-06 the first use of such a partition stopped
//! every partition group of its shard until the node was restarted, and a cluster
//! member kept leading the stopped groups: an outside review's finding.) A single node
//! that meets damage in a partition's log in use (a read, the scrub) refuses it so.

use std::sync::Arc;

use super::Shard;
use crate::layout::PartitionKey;
use crate::replication::partition_groups::Dropped;

impl Shard {
    /// Opens again every partition whose group its files' wake dropped, and refuses
    /// every one dropped for damage a lone node met in use.
    pub(super) fn reopen_changed_files(&mut self) {
        let reopen = self.groups.take_reopen();
        if reopen.is_empty() {
            return;
        }
        for (key, dropped) in reopen {
            self.reopen(key, &dropped);
        }
        self.partitions_changed();
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
        tracing::warn!(
            topic = %topic.name,
            partition = key.partition,
            %reason,
            "a partition's files changed while they slept: it is opened again from them \
             (a cluster member repairs them from its peers; a single node refuses the \
             partition if they are damaged)"
        );
        let opened = self
            .open_partition(key, &topic)
            .and_then(|()| self.settle_opened(&[(key, topic)]));
        if let Err(err) = opened {
            // Not openable at all (a disk that fails, say): as at a start, the shard's
            // groups cannot go on with it.
            self.groups.stop(err.to_string());
        }
    }
}
