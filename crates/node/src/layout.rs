//! The routing view every shard holds: which topics exist, their settings and
//! partitions, and which shard owns each partition.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use braid_proto::client::{TopicSettings, FSYNC_ALWAYS, FSYNC_INTERVAL, RETENTION_FOREVER};
use braid_storage::{FsyncPolicy, LogConfig};

use crate::metadata::{Metadata, PartitionMeta};

/// A partition's identity inside a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct PartitionKey {
    pub(crate) topic_id: u32,
    pub(crate) partition: u32,
}

impl PartitionKey {
    /// The shard that owns the partition: fixed by hash, the same on every node.
    pub(crate) fn shard(self, shards: usize) -> usize {
        let mut bytes = [0u8; 8];
        bytes[..4].copy_from_slice(&self.topic_id.to_be_bytes());
        bytes[4..].copy_from_slice(&self.partition.to_be_bytes());
        braid_proto::hash::murmur3_x86_32(&bytes, 0) as usize % shards.max(1)
    }

    /// The partition's directory.
    pub(crate) fn dir(self, data_dir: &Path) -> PathBuf {
        data_dir
            .join("partitions")
            .join(self.topic_id.to_string())
            .join(self.partition.to_string())
    }
}

/// A stored retention setting as the log takes it: 0 (how "no limit" is stored) and
/// [`RETENTION_FOREVER`] are no limit. A topic stored before the ranges were checked may
/// hold any other value; the log's arithmetic takes every `u64`, so such a limit just
/// never comes.
fn retention_limit(stored: u64) -> Option<u64> {
    (stored != 0 && stored != RETENTION_FOREVER).then_some(stored)
}

/// One topic as the shards see it.
#[derive(Debug, Clone)]
pub(crate) struct TopicRoute {
    pub(crate) id: u32,
    pub(crate) name: String,
    pub(crate) settings: TopicSettings,
    pub(crate) partitions: Vec<PartitionMeta>,
}

impl TopicRoute {
    /// Partition `id`: where it usually is (ids are dense from 0 until splits and
    /// merges add more), else found by a walk. Asked on every produce and fetch.
    pub(crate) fn partition(&self, id: u32) -> Option<&PartitionMeta> {
        match self.partitions.get(id as usize) {
            Some(p) if p.id == id => Some(p),
            _ => self.partitions.iter().find(|p| p.id == id),
        }
    }

    /// The log settings of this topic's partitions on a node with `node`'s settings.
    pub(crate) fn log_config(&self, node: &crate::config::NodeConfig) -> LogConfig {
        let s = &self.settings;
        LogConfig {
            segment_bytes_max: s.segment_bytes,
            fsync: match s.fsync {
                FSYNC_ALWAYS => FsyncPolicy::Always,
                FSYNC_INTERVAL => FsyncPolicy::Interval {
                    interval_ms: s.fsync_interval_ms.max(1),
                },
                _ => FsyncPolicy::Never,
            },
            retention_bytes: retention_limit(s.retention_bytes),
            retention_ms: retention_limit(s.retention_ms),
            write_behind_bytes: node.write_behind_bytes,
            cached_tail_bytes: (node.cached_tail_bytes > 0).then_some(node.cached_tail_bytes),
            recovery: node.recovery.mode(),
            ..LogConfig::default()
        }
    }
}

/// Every topic, by stream, then topic name, and who may use them.
#[derive(Debug, Default)]
pub(crate) struct Layout {
    pub(crate) streams: HashMap<String, HashMap<String, Arc<TopicRoute>>>,
    pub(crate) access: crate::access::Access,
}

impl Layout {
    pub(crate) fn from_metadata(meta: &Metadata) -> Self {
        let mut streams: HashMap<String, HashMap<String, Arc<TopicRoute>>> = meta
            .streams
            .keys()
            .map(|s| (s.clone(), HashMap::new()))
            .collect();
        for (stream, name, t) in meta.topics() {
            let route = TopicRoute {
                id: t.id,
                name: name.to_owned(),
                settings: t.settings,
                partitions: t.partitions.clone(),
            };
            streams
                .entry(stream.to_owned())
                .or_default()
                .insert(name.to_owned(), Arc::new(route));
        }
        Self {
            streams,
            access: crate::access::Access::from_metadata(meta),
        }
    }

    pub(crate) fn topic(&self, stream: &str, topic: &str) -> Option<&Arc<TopicRoute>> {
        self.streams.get(stream)?.get(topic)
    }

    /// Every partition key of the layout with its topic.
    pub(crate) fn partitions(&self) -> impl Iterator<Item = (PartitionKey, &Arc<TopicRoute>)> {
        self.streams
            .values()
            .flat_map(|topics| topics.values())
            .flat_map(|t| {
                t.partitions.iter().map(move |p| {
                    (
                        PartitionKey {
                            topic_id: t.id,
                            partition: p.id,
                        },
                        t,
                    )
                })
            })
    }
}
