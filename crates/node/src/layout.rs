//! The routing view every shard holds: which topics exist, their settings and
//! partitions, and which shard owns each partition.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use braid_proto::client::{TopicSettings, FSYNC_ALWAYS, FSYNC_INTERVAL, RETENTION_FOREVER};
use braid_storage::{FsyncPolicy, LogConfig};

use crate::access::{Access, UserAccess};
use crate::metadata::{Metadata, PartitionMeta, TopicMeta, Touch};

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
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TopicRoute {
    pub(crate) id: u32,
    pub(crate) name: String,
    pub(crate) settings: TopicSettings,
    pub(crate) partitions: Vec<PartitionMeta>,
}

impl TopicRoute {
    /// The route of topic `name` as its metadata says.
    pub(crate) fn of(name: &str, topic: &TopicMeta) -> Self {
        Self {
            id: topic.id,
            name: name.to_owned(),
            settings: topic.settings,
            partitions: topic.partitions.clone(),
        }
    }

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

/// The routes of one stream's topics, by name.
pub(crate) type StreamRoutes = HashMap<String, Arc<TopicRoute>>;

/// Every topic, by stream, then topic name, and who may use them.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Layout {
    pub(crate) streams: HashMap<String, StreamRoutes>,
    pub(crate) access: Access,
    /// Client sessions the metadata holds: whether each has ended.
    sessions: HashMap<u64, bool>,
    /// The user each owned client session belongs to.
    owners: HashMap<u64, Arc<str>>,
    /// The metadata op this layout was built at or after: a session id above it may
    /// be registered and not yet known here.
    metadata_op: u64,
    /// The newest end op among the client sessions this layout has seen end: a
    /// retirement barrier raises a partition's frontier to it (never lowered).
    ended_through: u64,
    /// Partitions that owe the retirement of ended sessions, and through which op.
    debts: HashMap<PartitionKey, u64>,
}

/// What a layout changes by after committed ops: each part they touched, as the
/// metadata has it now (`None`: gone). Built, and applied, in what it holds, not in
/// what exists: 20,000 stream creates once cost more as the metadata grew, each
/// rebuilding the whole layout for every shard to walk.
#[derive(Debug, Default)]
pub(crate) struct LayoutChange {
    streams: Vec<(String, Option<StreamRoutes>)>,
    topics: Vec<(String, String, Option<Arc<TopicRoute>>)>,
    users: Vec<(String, Option<UserAccess>)>,
    /// Each session touched: whether it has ended and whose it is, or `None`
    /// (retired).
    sessions: Vec<(u64, Option<SessionState>)>,
    /// The partitions that owe a retirement, if they changed: the whole new set.
    debts: Option<HashMap<PartitionKey, u64>>,
    metadata_op: u64,
    /// The newest end op among the sessions touched (0: none ended).
    ended_through: u64,
}

/// A client session as a layout change carries it: whether it has ended, and its
/// owner.
type SessionState = (bool, Option<Arc<str>>);

/// The partitions that owe a retirement, as the layout keys them.
fn debts_of(meta: &Metadata) -> HashMap<PartitionKey, u64> {
    meta.retirement
        .debts
        .iter()
        .map(|((topic_id, partition), owed)| {
            let key = PartitionKey {
                topic_id: *topic_id,
                partition: *partition,
            };
            (key, *owed)
        })
        .collect()
}

impl LayoutChange {
    /// The change that brings a layout of the metadata before the ops that made
    /// `touched` to `meta`.
    pub(crate) fn of(meta: &Metadata, touched: &BTreeSet<Touch>) -> Self {
        let mut change = Self {
            metadata_op: meta.applied_op(),
            ..Self::default()
        };
        for touch in touched {
            match touch {
                Touch::Stream(name) => {
                    let routes = meta.streams.get(name).map(|s| {
                        s.topics
                            .iter()
                            .map(|(topic, t)| (topic.clone(), Arc::new(TopicRoute::of(topic, t))))
                            .collect()
                    });
                    change.streams.push((name.clone(), routes));
                }
                // The stream's routes above hold its topics as they are now.
                Touch::Topic { stream, .. } if touched.contains(&Touch::Stream(stream.clone())) => {
                }
                Touch::Topic { stream, topic } => {
                    let route = meta.topic(stream, topic).ok();
                    let route = route.map(|t| Arc::new(TopicRoute::of(topic, t)));
                    change.topics.push((stream.clone(), topic.clone(), route));
                }
                Touch::User(name) => {
                    let access = meta.users.get(name).map(UserAccess::of);
                    change.users.push((name.clone(), access));
                }
                Touch::Session(id) => {
                    let state = meta.sessions.get(id).map(|s| {
                        change.ended_through = change.ended_through.max(s.ended_at.unwrap_or(0));
                        let owner = meta.session_owners.get(id).map(|u| Arc::from(u.as_str()));
                        (s.ended_at.is_some(), owner)
                    });
                    change.sessions.push((*id, state));
                }
                Touch::Debts => change.debts = Some(debts_of(meta)),
            }
        }
        change
    }

    /// Whether a user's credential or grants changed (connections check their logins).
    pub(crate) fn changes_access(&self) -> bool {
        !self.users.is_empty()
    }
}

/// What a shard's layout moves by.
#[derive(Debug, Clone)]
pub(crate) enum LayoutUpdate {
    /// A layout to take whole (at start, and after a metadata checkpoint was installed).
    Whole(Arc<Layout>),
    /// A change to the layout the shard has.
    Change(Arc<LayoutChange>),
}

/// A topic's route before and after a change (`None`: it is not there).
type RoutePair<'a> = (Option<&'a Arc<TopicRoute>>, Option<&'a Arc<TopicRoute>>);

/// The partition keys of a topic route.
fn keys_of(route: &TopicRoute) -> impl Iterator<Item = PartitionKey> + '_ {
    route.partitions.iter().map(|p| PartitionKey {
        topic_id: route.id,
        partition: p.id,
    })
}

impl Layout {
    pub(crate) fn from_metadata(meta: &Metadata) -> Self {
        let mut streams: HashMap<String, StreamRoutes> = meta
            .streams
            .keys()
            .map(|s| (s.clone(), HashMap::new()))
            .collect();
        for (stream, name, t) in meta.topics() {
            streams
                .entry(stream.to_owned())
                .or_default()
                .insert(name.to_owned(), Arc::new(TopicRoute::of(name, t)));
        }
        Self {
            streams,
            access: Access::from_metadata(meta),
            sessions: meta
                .sessions
                .iter()
                .map(|(id, s)| (*id, s.ended_at.is_some()))
                .collect(),
            owners: meta
                .session_owners
                .iter()
                .map(|(id, user)| (*id, Arc::from(user.as_str())))
                .collect(),
            metadata_op: meta.applied_op(),
            ended_through: meta
                .sessions
                .values()
                .filter_map(|s| s.ended_at)
                .fold(meta.retirement.retired_through, u64::max),
            debts: debts_of(meta),
        }
    }

    /// A produce of `tag`'s session to `key`, checked before it reaches its
    /// partition: what it was checked against (the partition's primary judges it by
    /// that, see `group_client`), or why it is refused: the session ended or is
    /// unknown (`SessionNotFound`), or is newer than what this member's metadata has
    /// applied (`Busy`: it will know it in a moment).
    pub(crate) fn session_check(
        &self,
        tag: crate::replication::partition_machine::slices::SessionTag,
        key: PartitionKey,
    ) -> Result<crate::replication::group_client::Checked, crate::error::NodeError> {
        match self.session_refusal(tag) {
            Some(refusal) => Err(refusal),
            None => Ok(crate::replication::group_client::Checked {
                metadata_op: self.metadata_op,
                owed: self.owed(key),
            }),
        }
    }

    /// Refuses `user` a session of another user (`client_sessions::owner_refusal`).
    pub(crate) fn owner_refusal(
        &self,
        session: u64,
        user: Option<&str>,
    ) -> Option<crate::error::NodeError> {
        let owner = self.owners.get(&session).map(|o| &**o);
        crate::client_sessions::owner_refusal(session, owner, user)
    }

    /// Whether `session` was retired: at or below the op this layout is of, and
    /// forgotten.
    pub(crate) fn is_retired(&self, session: u64) -> bool {
        session <= self.metadata_op && !self.sessions.contains_key(&session)
    }

    /// Whether `session` has ended (and is not retired yet).
    pub(crate) fn is_ended(&self, session: u64) -> bool {
        self.sessions.get(&session) == Some(&true)
    }

    /// The newest end op among the sessions this layout has seen end.
    pub(crate) fn ended_through(&self) -> u64 {
        self.ended_through
    }

    /// Whether `session` is open.
    pub(crate) fn is_open(&self, session: u64) -> bool {
        self.sessions.get(&session) == Some(&false)
    }

    /// The partitions that owe a retirement, and through which op.
    pub(crate) fn debts(&self) -> impl Iterator<Item = (PartitionKey, u64)> + '_ {
        self.debts.iter().map(|(key, owed)| (*key, *owed))
    }

    /// The metadata op through which `key` owes the retirement of ended sessions (0:
    /// none).
    pub(crate) fn owed(&self, key: PartitionKey) -> u64 {
        self.debts.get(&key).copied().unwrap_or(0)
    }

    fn session_refusal(
        &self,
        tag: crate::replication::partition_machine::slices::SessionTag,
    ) -> Option<crate::error::NodeError> {
        use crate::error::NodeError;
        use braid_proto::client::ErrorCode;
        match self.sessions.get(&tag.session) {
            Some(false) => None,
            Some(true) => Some(NodeError::new(
                ErrorCode::SessionNotFound,
                format!(
                    "client session {} has ended: register a new one",
                    tag.session
                ),
            )),
            None if tag.session > self.metadata_op => Some(NodeError::new(
                ErrorCode::Busy,
                format!(
                    "this member has not yet applied the registration of client session \
                     {}; retry",
                    tag.session
                ),
            )),
            None => Some(NodeError::new(
                ErrorCode::SessionNotFound,
                format!(
                    "client session {} does not exist (never registered, or retired): \
                     register a new one",
                    tag.session
                ),
            )),
        }
    }

    /// Each topic `change` touches: its route here and in the change.
    fn touched_routes<'a>(&'a self, change: &'a LayoutChange) -> Vec<RoutePair<'a>> {
        let mut pairs = Vec::new();
        for (stream, routes) in &change.streams {
            let before = self.streams.get(stream);
            for (topic, route) in before.into_iter().flatten() {
                let after = routes.as_ref().and_then(|r| r.get(topic));
                pairs.push((Some(route), after));
            }
            for (topic, route) in routes.iter().flatten() {
                if before.is_none_or(|b| !b.contains_key(topic)) {
                    pairs.push((None, Some(route)));
                }
            }
        }
        for (stream, topic, route) in &change.topics {
            pairs.push((self.topic(stream, topic), route.as_ref()));
        }
        pairs
    }

    /// The partitions applying `change` adds, with their topics.
    pub(crate) fn added_by(&self, change: &LayoutChange) -> Vec<(PartitionKey, Arc<TopicRoute>)> {
        let mut added = Vec::new();
        for (before, after) in self.touched_routes(change) {
            let Some(after) = after else { continue };
            let old: HashSet<PartitionKey> = before.into_iter().flat_map(|r| keys_of(r)).collect();
            added.extend(
                keys_of(after)
                    .filter(|key| !old.contains(key))
                    .map(|key| (key, Arc::clone(after))),
            );
        }
        added
    }

    /// The partitions applying `change` removes.
    pub(crate) fn removed_by(&self, change: &LayoutChange) -> Vec<PartitionKey> {
        let mut removed = Vec::new();
        for (before, after) in self.touched_routes(change) {
            let Some(before) = before else { continue };
            let new: HashSet<PartitionKey> = after.into_iter().flat_map(|r| keys_of(r)).collect();
            removed.extend(keys_of(before).filter(|key| !new.contains(key)));
        }
        removed
    }

    /// Applies `change`.
    pub(crate) fn apply(&mut self, change: &LayoutChange) {
        for (stream, routes) in &change.streams {
            match routes {
                Some(routes) => {
                    self.streams.insert(stream.clone(), routes.clone());
                }
                None => {
                    self.streams.remove(stream);
                }
            }
        }
        for (stream, topic, route) in &change.topics {
            let Some(routes) = self.streams.get_mut(stream) else {
                continue;
            };
            match route {
                Some(route) => {
                    routes.insert(topic.clone(), Arc::clone(route));
                }
                None => {
                    routes.remove(topic);
                }
            }
        }
        for (user, access) in &change.users {
            self.access.set(user, access.clone());
        }
        for (id, state) in &change.sessions {
            match state {
                Some((ended, owner)) => {
                    self.sessions.insert(*id, *ended);
                    match owner {
                        Some(owner) => self.owners.insert(*id, Arc::clone(owner)),
                        None => self.owners.remove(id),
                    };
                }
                None => {
                    self.sessions.remove(id);
                    self.owners.remove(id);
                }
            }
        }
        if let Some(debts) = &change.debts {
            self.debts.clone_from(debts);
        }
        self.metadata_op = self.metadata_op.max(change.metadata_op);
        self.ended_through = self.ended_through.max(change.ended_through);
    }

    pub(crate) fn topic(&self, stream: &str, topic: &str) -> Option<&Arc<TopicRoute>> {
        self.streams.get(stream)?.get(topic)
    }

    /// The partitions created by a metadata op above `op`: no client session ended at
    /// or below it ever reached them (its requests were checked against a layout that
    /// knew of its end before it knew of them), so a retirement walk skips them.
    pub(crate) fn created_above(&self, op: u64) -> HashSet<PartitionKey> {
        self.partitions()
            .filter(|(key, topic)| {
                topic
                    .partition(key.partition)
                    .is_some_and(|p| p.created_op > op)
            })
            .map(|(key, _)| key)
            .collect()
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::replication::machine::tests::op;
    use proptest::prelude::*;

    fn keys(layout: &Layout) -> BTreeSet<PartitionKey> {
        layout.partitions().map(|(key, _)| key).collect()
    }

    proptest! {
        /// A layout changed by what batches of ops touched is the layout built whole
        /// from the metadata after them, and the partitions each change adds and
        /// removes are exactly the difference (what a shard opens and drops).
        #[test]
        fn a_change_brings_a_layout_to_the_metadata_after_it(
            batches in prop::collection::vec(prop::collection::vec(op(), 1..5), 1..40)
        ) {
            let mut meta = Metadata::default();
            let mut layout = Layout::from_metadata(&meta);
            for batch in batches {
                let mut touched = BTreeSet::new();
                for op in &batch {
                    let touches = meta.touches(op);
                    if meta.apply(op).is_ok() {
                        touched.extend(touches);
                    }
                }
                let change = LayoutChange::of(&meta, &touched);
                let whole = Layout::from_metadata(&meta);
                let added: BTreeSet<_> = layout.added_by(&change).into_iter().map(|(k, _)| k).collect();
                let removed: BTreeSet<_> = layout.removed_by(&change).into_iter().collect();
                let expected: BTreeSet<_> = keys(&whole).difference(&keys(&layout)).copied().collect();
                prop_assert_eq!(added, expected);
                let expected: BTreeSet<_> = keys(&layout).difference(&keys(&whole)).copied().collect();
                prop_assert_eq!(removed, expected);
                layout.apply(&change);
                prop_assert_eq!(&layout, &whole);
            }
        }
    }

    /// A retirement walk skips the partitions created above its watermark, and only
    /// those: a topic's partitions keep the op that created them.
    #[test]
    fn partitions_created_above_an_op_are_the_later_topics() {
        use crate::metadata::{op as meta_op, MetaOp};
        let topic = |name: &str, partitions| {
            MetaOp::CreateTopic(meta_op::CreateTopic {
                stream: "s".into(),
                name: name.into(),
                settings: TopicSettings {
                    partitions,
                    ..TopicSettings::default()
                },
            })
        };
        let mut meta = Metadata::default();
        let ops = [
            MetaOp::CreateStream(meta_op::CreateStream { name: "s".into() }),
            topic("early", 2),
            topic("late", 3),
        ];
        for (at, op) in ops.iter().enumerate() {
            meta.begin_op(at as u64 + 10);
            meta.apply(op).unwrap();
        }
        let layout = Layout::from_metadata(&meta);
        let late = layout.topic("s", "late").unwrap().id;
        let above = layout.created_above(11);
        assert_eq!(above.len(), 3);
        assert!(above.iter().all(|key| key.topic_id == late));
        assert_eq!(layout.created_above(12), HashSet::new());
        assert_eq!(layout.created_above(10).len(), 5);
    }
}
