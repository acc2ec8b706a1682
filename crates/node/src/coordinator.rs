//! Shard 0's metadata service: the metadata group (group 0, replicated with VSR) and
//! the consumer group coordinator. A change is proposed to the group and acknowledged
//! once committed (on a quorum's disks) and applied here; every node applies every
//! committed op and publishes the new topic layout to its shards, and a reply waits
//! until all of this node's shards have it, so a client that created a topic can
//! produce to it at once on any connection to this node.

use std::collections::HashMap;
use std::sync::Arc;

use braid_proto::client::{
    ErrorCode, Grant, PartitionInfo, Response, TopicInfo, TopicSettings, TopicSummary, UserSummary,
    FSYNC_ALWAYS, FSYNC_DEFAULT, FSYNC_INTERVAL, FSYNC_NEVER, RETENTION_FOREVER,
};
use tokio::sync::oneshot;

use crate::admin::AdminRequest;
use crate::config::{FsyncSetting, TopicDefaults};
use crate::error::NodeError;
use crate::groups::GroupCoordinator;
use crate::layout::{Layout, LayoutChange, LayoutUpdate, PartitionKey};
use crate::mailbox::{Control, NodeShared, ShardRequest};
use crate::metadata::{op, MetaOp, TopicMeta};
use crate::replication::machine::LayoutNews;
use crate::replication::meta_group::{MetaGroup, Turn};

mod consumer_groups;
mod retire;
mod sessions;

type Reply = oneshot::Sender<Result<Response, NodeError>>;

/// Who waits for a proposal's outcome.
#[derive(Debug)]
pub(crate) enum Waiter {
    /// A client, answered `Empty` once it applied.
    Plain(Reply),
    /// A client registering a session, answered the session's id (the op's number).
    Register { reply: Reply, timeout_ms: u32 },
    /// The coordinator itself, ending a session that went quiet.
    Expiry(u64),
    /// This node's report of a walk: nobody waits (one lost is proposed again).
    Report,
    /// The coordinator's finalize: counted once committed.
    Finalize,
    /// A member joining a group, answered its grant (its id is the op's number).
    Join {
        reply: Reply,
        stream: String,
        group: String,
    },
    /// The coordinator's leave of a member that went quiet: nobody waits.
    Quiet,
}

// The protocol states the storage's segment sizes as its range.
const _: () = assert!(
    braid_proto::client::SEGMENT_BYTES_MIN == braid_storage::SEGMENT_BYTES_MIN
        && braid_proto::client::SEGMENT_BYTES_MAX == braid_storage::SEGMENT_BYTES_MAX
);

/// Shortest and longest session timeouts a member may ask for (ms).
const SESSION_TIMEOUT_MS_MIN: u32 = 100;
const SESSION_TIMEOUT_MS_MAX: u32 = 300_000;

/// The metadata group and group coordinator, owned by shard 0.
#[derive(Debug)]
pub(crate) struct MetaService {
    group: MetaGroup<Waiter>,
    groups: GroupCoordinator,
    /// When each client session was last heard from (on the coordinator).
    liveness: crate::client_sessions::Liveness,
    /// The barrier that ends the catching up at start was sent to the shards.
    caught_up_barrier_sent: bool,
    /// This node's walk retiring ended client sessions.
    node_walk: retire::NodeWalk,
    /// On the coordinator: the finalize proposed last, through which op and when.
    finalizing: Option<(u64, u64)>,
    /// FinalizeSession ops this node committed as the coordinator (for the metrics).
    finalizes_committed: u64,
    /// When the coordinator last looked for group members that went quiet.
    members_looked_ms: u64,
}

/// Why a topic's resolved sizes cannot stand, naming the setting and its value (an
/// outside review of issue 24: a `segment_bytes` below the default `max_batch_bytes`
/// was refused with a message that named neither value).
fn invalid_sizes(settings: &TopicSettings, frame_bytes_max: u32) -> Option<String> {
    let (segment, batch) = (settings.segment_bytes, settings.max_batch_bytes);
    if !(braid_storage::SEGMENT_BYTES_MIN..=braid_storage::SEGMENT_BYTES_MAX).contains(&segment) {
        return Some(format!(
            "segment_bytes {segment} must be {} to {}",
            braid_storage::SEGMENT_BYTES_MIN,
            braid_storage::SEGMENT_BYTES_MAX
        ));
    }
    if u64::from(batch) > u64::from(segment) {
        return Some(format!(
            "max_batch_bytes {batch} must not exceed segment_bytes {segment} (a batch is \
             stored whole in one segment): give a smaller max_batch_bytes with it"
        ));
    }
    let frame_room = u64::from(frame_bytes_max).saturating_sub(1024);
    if u64::from(batch) > frame_room {
        return Some(format!(
            "max_batch_bytes {batch} must be at most {frame_room} (the node's \
             frame_bytes_max {frame_bytes_max} less 1 KiB for the request around it)"
        ));
    }
    None
}

/// Fills the settings a creator left at 0 with the node's defaults, giving the form the
/// topic is stored in. A retention setting of [`RETENTION_FOREVER`] (the wire's and
/// the config's "no limit") is stored as 0, which has always meant no limit in a
/// stored topic: a node of an older version that applies the op keeps the data too.
/// [`reported_settings`] turns it back.
pub(crate) fn resolve_settings(settings: TopicSettings, defaults: &TopicDefaults) -> TopicSettings {
    let or = |value: u64, default: u64| if value == 0 { default } else { value };
    let retention = |value: u64, default: u64| match or(value, default) {
        RETENTION_FOREVER => 0,
        resolved => resolved,
    };
    TopicSettings {
        partitions: settings.partitions,
        fsync: match settings.fsync {
            FSYNC_DEFAULT => match defaults.fsync {
                FsyncSetting::Always => FSYNC_ALWAYS,
                FsyncSetting::Interval => FSYNC_INTERVAL,
                FsyncSetting::Never => FSYNC_NEVER,
            },
            other => other,
        },
        fsync_interval_ms: or(settings.fsync_interval_ms, defaults.fsync_interval_ms),
        retention_bytes: retention(settings.retention_bytes, defaults.retention_bytes),
        retention_ms: retention(settings.retention_ms, defaults.retention_ms),
        max_batch_bytes: or(
            settings.max_batch_bytes.into(),
            defaults.max_batch_bytes.into(),
        ) as u32,
        segment_bytes: or(settings.segment_bytes.into(), defaults.segment_bytes.into()) as u32,
    }
}

/// A stored topic's settings as a TopicInfo states them: every default filled in, and
/// no retention limit (stored as 0) as [`RETENTION_FOREVER`], since 0 on the wire is
/// "the node's default".
pub(crate) fn reported_settings(stored: TopicSettings) -> TopicSettings {
    let forever_if_none = |value: u64| if value == 0 { RETENTION_FOREVER } else { value };
    TopicSettings {
        retention_bytes: forever_if_none(stored.retention_bytes),
        retention_ms: forever_if_none(stored.retention_ms),
        ..stored
    }
}

fn shutting_down() -> NodeError {
    NodeError::new(ErrorCode::ShuttingDown, "node is shutting down")
}

/// Asks every shard for (start offset, high watermark) of `keys`.
async fn gather_offsets(
    shared: Arc<NodeShared>,
    keys: Vec<PartitionKey>,
) -> HashMap<PartitionKey, (u64, u64)> {
    let shards = shared.shards();
    let mut by_shard: Vec<Vec<PartitionKey>> = vec![Vec::new(); shards];
    for key in keys {
        by_shard[key.shard(shards)].push(key);
    }
    let mut waits = Vec::new();
    for (shard, keys) in by_shard.into_iter().enumerate() {
        if keys.is_empty() {
            continue;
        }
        let (reply, wait) = oneshot::channel();
        if shared.inboxes[shard]
            .send(ShardRequest::Offsets { keys, reply })
            .await
            .is_ok()
        {
            waits.push(wait);
        }
    }
    let mut found = HashMap::new();
    for wait in waits {
        if let Ok(list) = wait.await {
            for (key, start, high) in list {
                found.insert(key, (start, high));
            }
        }
    }
    found
}

fn topic_keys(topic: &TopicMeta) -> Vec<PartitionKey> {
    topic
        .partitions
        .iter()
        .map(|p| PartitionKey {
            topic_id: topic.id,
            partition: p.id,
        })
        .collect()
}

impl MetaService {
    pub(crate) fn new(group: MetaGroup<Waiter>, limits: crate::groups::GroupLimits) -> Self {
        Self {
            group,
            groups: GroupCoordinator::new(limits),
            liveness: crate::client_sessions::Liveness::default(),
            caught_up_barrier_sent: false,
            node_walk: retire::NodeWalk::Idle,
            finalizing: None,
            finalizes_committed: 0,
            members_looked_ms: 0,
        }
    }

    pub(crate) fn layout(&self) -> Layout {
        Layout::from_metadata(self.group.state())
    }

    /// Proposes an op the start needs, before the shards run: the outcome if the group
    /// answered at once (a lone replica does), else `None` (it goes out once the group
    /// has a primary, and its outcome is only logged).
    pub(crate) fn propose_at_start(&mut self, op: MetaOp) -> Option<Result<(), NodeError>> {
        let (reply, mut answer) = oneshot::channel();
        let turn = self.group.propose(op, Waiter::Plain(reply));
        for (waiter, outcome) in turn.answered {
            if let Some((reply, answer)) = self.settle(waiter, outcome) {
                let _ = reply.send(answer);
            }
        }
        answer.try_recv().ok().map(|r| r.map(|_| ()))
    }

    /// Sends and receives the group's frames through `bus` from now on.
    pub(crate) fn attach_bus(&mut self, bus: braid_bus::Bus) {
        self.group.attach_bus(bus);
    }

    /// The metadata group (for the node's start and its observers).
    pub(crate) fn group(&self) -> &MetaGroup<Waiter> {
        &self.group
    }

    pub(crate) fn close(self) {
        // Every committed op is in the group's journal, synced: nothing to write.
        drop(self);
    }

    /// The metadata replica now (for the shard's board).
    pub(crate) fn status(&self) -> Option<crate::replication::status::GroupStatus> {
        self.group.status()
    }

    /// Repairs the metadata replica asked of peers since the last call.
    pub(crate) fn take_repairs(&mut self) -> crate::replication::shard_host::Repairs {
        self.group.take_repairs()
    }

    /// A tick of the shard's timer: the group's time, and member expiry.
    pub(crate) fn tick(&mut self, shared: &Arc<NodeShared>, now: u64) {
        let turn = self.group.tick();
        self.finish(shared, turn);
        self.end_quiet_sessions(shared, now);
        self.leave_quiet_members(shared, now);
        self.retire_sessions(shared, now);
        let primary = self.group.primary().unwrap_or(crate::mailbox::NO_MEMBER);
        shared
            .coordinator
            .store(primary, std::sync::atomic::Ordering::Relaxed);
        self.serve_once_caught_up(shared);
        self.note_new_topics(shared);
    }

    /// Tells the shards, once the metadata replica knows it, from which topic id on
    /// every topic was created after this node started (see
    /// [`MetaGroup::new_topics_from`]).
    fn note_new_topics(&mut self, shared: &NodeShared) {
        use std::sync::atomic::Ordering;
        if shared.new_topics_from.load(Ordering::Relaxed) != crate::mailbox::TOPICS_UNKNOWN {
            return;
        }
        if let Some(from) = self.group.new_topics_from() {
            shared.new_topics_from.store(from, Ordering::Release);
            tracing::debug!(from, "topics from this id on were created after the start");
        }
    }

    /// Once the metadata replica has caught up after the start, lets clients in as soon
    /// as every shard has handled the layouts published before now (a barrier behind
    /// them on each shard's control channel).
    fn serve_once_caught_up(&mut self, shared: &Arc<NodeShared>) {
        use std::sync::atomic::Ordering;
        if self.caught_up_barrier_sent || shared.metadata_caught_up.load(Ordering::Relaxed) {
            return;
        }
        if !self.group.status().is_some_and(|s| s.caught_up()) {
            return;
        }
        self.caught_up_barrier_sent = true;
        let barriers: Vec<_> = shared
            .controls
            .iter()
            .filter_map(|control| {
                let (done, wait) = oneshot::channel();
                control.send(Control::Barrier(done)).ok().map(|()| wait)
            })
            .collect();
        let shared = Arc::clone(shared);
        tokio::task::spawn_local(async move {
            for wait in barriers {
                if wait.await.is_err() {
                    return;
                }
            }
            shared.metadata_caught_up.store(true, Ordering::Relaxed);
            tracing::info!("the metadata has caught up: serving clients");
        });
    }

    /// `NotLeader` for a consumer-group call on a member that does not lead the
    /// metadata group: groups are coordinated there alone, so every member of a group
    /// meets the same coordinator (its state moves with the primary: members join
    /// again at the new one, offsets are in the metadata).
    fn not_coordinator(&self, shared: &NodeShared) -> Option<NodeError> {
        if shared.cluster.members.len() <= 1 {
            return None;
        }
        let primary = self.group.primary();
        if primary == Some(shared.cluster.node_id) {
            return None;
        }
        Some(shared.not_leader("consumer groups", primary))
    }

    /// A frame from a peer for the metadata group.
    pub(crate) fn deliver(&mut self, shared: &Arc<NodeShared>, delivery: &braid_bus::Delivery) {
        let turn = self.group.deliver(delivery);
        self.finish(shared, turn);
    }

    /// Proposes `op` to the metadata group; `reply` is answered once it is committed
    /// and in place on this node's shards.
    /// Refuses a create that would pass one of the node's quotas, by this member's
    /// metadata (checked where the change comes in: a change racing another may pass
    /// a quota by what that one adds).
    fn within_quotas(
        &self,
        config: &crate::config::NodeConfig,
        request: &AdminRequest,
    ) -> Result<(), NodeError> {
        let state = self.group.state();
        let refuse = |what: String, setting: &str, max: u32| {
            Err(NodeError::new(
                ErrorCode::QuotaExceeded,
                format!("{what}: {setting} allows {max}"),
            ))
        };
        match request {
            AdminRequest::CommitOffsets { stream, group, .. } => {
                // Offsets outlive their group's members: each stream keeps them for a
                // bounded number of groups (found by review: join, commit, leave in a
                // loop kept 36,000 groups and an 18 MB ListGroups answer).
                let kept = state.stream(stream).map_or(0, |s| s.groups.len());
                let known = state
                    .stream(stream)
                    .is_ok_and(|s| s.groups.contains_key(group));
                if !known && kept >= config.groups_per_stream_max as usize {
                    return refuse(
                        format!("stream {stream} keeps committed offsets of {kept} groups"),
                        "groups_per_stream_max",
                        config.groups_per_stream_max,
                    );
                }
                Ok(())
            }
            AdminRequest::Change(MetaOp::CreateStream(_))
                if state.streams.len() >= config.streams_max as usize =>
            {
                refuse(
                    format!("there are {} streams", state.streams.len()),
                    "streams_max",
                    config.streams_max,
                )
            }
            AdminRequest::CreateTopic {
                stream, settings, ..
            } => {
                let partitions = settings.partitions;
                if partitions > config.topic_partitions_max {
                    return refuse(
                        format!("a topic of {partitions} partitions"),
                        "topic_partitions_max",
                        config.topic_partitions_max,
                    );
                }
                let topics = state.streams.get(stream).map_or(0, |s| s.topics.len());
                if topics >= config.topics_per_stream_max as usize {
                    return refuse(
                        format!("stream {stream} has {topics} topics"),
                        "topics_per_stream_max",
                        config.topics_per_stream_max,
                    );
                }
                let in_stream: usize = state
                    .stream(stream)
                    .map_or(0, |s| s.topics.values().map(|t| t.partitions.len()).sum());
                if in_stream + partitions as usize > config.partitions_per_stream_max as usize {
                    return refuse(
                        format!("stream {stream} has {in_stream} partitions and {partitions} more"),
                        "partitions_per_stream_max",
                        config.partitions_per_stream_max,
                    );
                }
                let existing: usize = state.topics().map(|(_, _, t)| t.partitions.len()).sum();
                if existing + partitions as usize > config.partitions_max as usize {
                    return refuse(
                        format!("{existing} partitions and {partitions} more"),
                        "partitions_max",
                        config.partitions_max,
                    );
                }
                Ok(())
            }
            _ => Ok(()),
        }
    }

    pub(crate) fn change(&mut self, shared: &Arc<NodeShared>, op: MetaOp, reply: Reply) {
        self.propose(shared, op, Waiter::Plain(reply));
    }

    fn propose(&mut self, shared: &Arc<NodeShared>, op: MetaOp, waiter: Waiter) {
        let turn = self.group.propose(op, waiter);
        self.finish(shared, turn);
    }

    /// Publishes a changed layout to every shard, and sends the answers of a turn once
    /// every shard has the layout they may depend on.
    fn finish(&mut self, shared: &Arc<NodeShared>, turn: Turn<Waiter>) {
        let mut waits = Vec::new();
        let state = self.group.state();
        // Counted on shard 0, where the metadata service runs.
        let metrics = &shared.metrics[0];
        let update = match turn.layout {
            LayoutNews::Unchanged => None,
            LayoutNews::Whole => {
                crate::metrics::add(&metrics.layout_rebuilds, 1);
                Some(LayoutUpdate::Whole(Arc::new(self.layout())))
            }
            LayoutNews::Touched(touched) => {
                crate::metrics::add(&metrics.layout_changes, 1);
                Some(LayoutUpdate::Change(Arc::new(LayoutChange::of(
                    state, &touched,
                ))))
            }
        };
        if let Some(update) = update {
            for control in &shared.controls {
                let (done, wait) = oneshot::channel();
                let message = Control::Layout {
                    update: update.clone(),
                    done: Some(done),
                };
                if control.send(message).is_ok() {
                    waits.push(wait);
                }
            }
        }
        let answered: Vec<_> = turn
            .answered
            .into_iter()
            .filter_map(|(waiter, outcome)| self.settle(waiter, outcome))
            .collect();
        if answered.is_empty() {
            return;
        }
        let mut barriers = Vec::new();
        if waits.is_empty() {
            // The layout an answer depends on may have gone out in an earlier turn:
            // wait until every shard has handled what was sent before now.
            for control in &shared.controls {
                let (done, wait) = oneshot::channel();
                if control.send(Control::Barrier(done)).is_ok() {
                    barriers.push(wait);
                }
            }
        }
        tokio::task::spawn_local(async move {
            let mut failure = None;
            for wait in waits {
                match wait.await {
                    Ok(Ok(())) => {}
                    Ok(Err(err)) => {
                        failure.get_or_insert(NodeError::from(err));
                    }
                    Err(_) => {
                        failure.get_or_insert(shutting_down());
                    }
                }
            }
            for wait in barriers {
                if wait.await.is_err() {
                    failure.get_or_insert(shutting_down());
                }
            }
            for (reply, outcome) in answered {
                let answer = match (&failure, outcome) {
                    (_, Err(err)) => Err(err),
                    (Some(err), Ok(_)) => Err(err.clone()),
                    (None, Ok(response)) => Ok(response),
                };
                let _ = reply.send(answer);
            }
        });
    }

    pub(crate) fn handle(&mut self, shared: &Arc<NodeShared>, request: AdminRequest, reply: Reply) {
        let defaults = shared.config.topic_defaults;
        if request.is_group_call() {
            if let Some(err) = self.not_coordinator(shared) {
                let _ = reply.send(Err(err));
                let turn = self.group.nudge();
                self.finish(shared, turn);
                return;
            }
            self.groups.enter_epoch(self.group.view());
        }
        if let Err(err) = self.within_quotas(&shared.config, &request) {
            let _ = reply.send(Err(err));
            return;
        }
        match request {
            AdminRequest::Change(op) => self.change(shared, op, reply),
            AdminRequest::RegisterSession { timeout_ms, user } => {
                self.register_session(shared, timeout_ms, user, reply);
            }
            AdminRequest::SessionHeartbeat { session, user } => {
                let answer = self
                    .check_owner(session, user.as_deref())
                    .and_then(|()| self.session_heartbeat(session));
                let _ = reply.send(answer);
            }
            AdminRequest::EndSession { session, user } => {
                match self.check_owner(session, user.as_deref()) {
                    Ok(()) => self.change(shared, op::EndSession { session }.into(), reply),
                    Err(refusal) => {
                        let _ = reply.send(Err(refusal));
                    }
                }
            }
            AdminRequest::CreateTopic {
                stream,
                topic,
                settings,
            } => {
                let settings = resolve_settings(settings, &defaults);
                if let Some(why) = invalid_sizes(&settings, shared.config.frame_bytes_max) {
                    let _ = reply.send(Err(NodeError::new(ErrorCode::InvalidArgument, why)));
                    return;
                }
                let op = MetaOp::CreateTopic(op::CreateTopic {
                    stream,
                    name: topic,
                    settings,
                });
                self.change(shared, op, reply);
            }
            AdminRequest::ListUsers => {
                let users = self
                    .group
                    .state()
                    .users
                    .iter()
                    .map(|(name, user)| UserSummary {
                        name: name.clone(),
                        grants: user
                            .grants
                            .iter()
                            .map(|(resource, permissions)| Grant {
                                resource: resource.clone(),
                                permissions: *permissions,
                            })
                            .collect(),
                    })
                    .collect();
                let _ = reply.send(Ok(Response::Users(users)));
            }
            AdminRequest::ListTopics(stream) => {
                let result = self.group.state().stream(&stream).map(|s| {
                    Response::Topics(
                        s.topics
                            .iter()
                            .map(|(name, t)| TopicSummary {
                                name: name.clone(),
                                partitions: t.partitions.len() as u32,
                            })
                            .collect(),
                    )
                });
                let _ = reply.send(result.map_err(NodeError::from));
            }
            AdminRequest::DescribeTopic { stream, topic } => {
                let meta = match self.group.state().topic(&stream, &topic) {
                    Ok(meta) => meta.clone(),
                    Err(err) => {
                        let _ = reply.send(Err(err.into()));
                        return;
                    }
                };
                let shared = Arc::clone(shared);
                tokio::task::spawn_local(async move {
                    let offsets = gather_offsets(shared, topic_keys(&meta)).await;
                    let partitions = meta
                        .partitions
                        .iter()
                        .map(|p| {
                            let key = PartitionKey {
                                topic_id: meta.id,
                                partition: p.id,
                            };
                            let (start_offset, high_watermark) =
                                offsets.get(&key).copied().unwrap_or((0, 0));
                            PartitionInfo {
                                id: p.id,
                                hash_start: p.hash_start,
                                hash_end: p.hash_end,
                                parents: p.parents.clone(),
                                sealed: p.sealed,
                                start_offset,
                                high_watermark,
                            }
                        })
                        .collect();
                    let _ = reply.send(Ok(Response::Topic(TopicInfo {
                        stream,
                        name: topic,
                        id: meta.id,
                        epoch: meta.epoch,
                        settings: reported_settings(meta.settings),
                        partitions,
                    })));
                });
            }
            AdminRequest::JoinGroup {
                stream,
                group,
                topic,
                member_name,
                session_timeout_ms,
                session,
                user,
            } => match self.check_owner(session, user.as_deref()) {
                Err(refusal) => {
                    let _ = reply.send(Err(refusal));
                }
                Ok(()) => {
                    let join = op::JoinGroup {
                        stream,
                        group,
                        topic,
                        name: member_name,
                        session,
                        timeout_ms: session_timeout_ms,
                        user: user.unwrap_or_default(),
                    };
                    self.join(shared, join, reply);
                }
            },
            AdminRequest::Heartbeat {
                stream,
                group,
                member_id,
                owned,
                user,
            } => {
                let answer = self
                    .check_member_user(&stream, &group, member_id, user.as_deref())
                    .and_then(|()| self.group_heartbeat(&stream, &group, member_id, &owned));
                let _ = reply.send(answer);
            }
            AdminRequest::LeaveGroup {
                stream,
                group,
                member_id,
                user,
            } => match self.check_member_user(&stream, &group, member_id, user.as_deref()) {
                Ok(()) => self.leave(shared, stream, group, member_id, reply),
                Err(refusal) => {
                    let _ = reply.send(Err(refusal));
                }
            },
            AdminRequest::CommitOffsets {
                stream,
                group,
                member_id,
                generation,
                offsets,
                user,
            } => {
                let op = self
                    .check_member_user(&stream, &group, member_id, user.as_deref())
                    .and_then(|()| {
                        self.commit_op(shared, &stream, &group, member_id, generation, offsets)
                    });
                match op {
                    Ok(op) => self.change(shared, op, reply),
                    Err(err) => {
                        let _ = reply.send(Err(err));
                    }
                }
            }
            AdminRequest::FetchOffsets { stream, group } => {
                self.describe_group(shared, stream, group, true, reply);
            }
            AdminRequest::DescribeGroup { stream, group } => {
                self.describe_group(shared, stream, group, false, reply);
            }
            AdminRequest::ListGroups(stream) => {
                let result = self.list_groups(&stream);
                let _ = reply.send(result);
            }
        }
    }
}

/// Refuses a commit of a position beyond what was committed to the log (it would
/// make lag negative and skip records that later arrive), where this member can tell:
/// on a single node, or for a partition this member leads. A backup here learns a
/// commit a heartbeat after the primary, and the consumer read its records from the
/// primary, so a backup's lag is no reason to refuse (issue 24, finding 8: commits
/// refused `OffsetOutOfRange` while the coordinator's replica lagged).
fn refuse_commit_beyond(
    topic_id: u32,
    offsets: &[(u32, u64)],
    cluster: bool,
    high_watermark: impl Fn(&crate::layout::PartitionKey) -> Option<u64>,
    leads: impl Fn(&crate::layout::PartitionKey) -> bool,
) -> Result<(), NodeError> {
    for (partition, offset) in offsets {
        let key = crate::layout::PartitionKey {
            topic_id,
            partition: *partition,
        };
        if cluster && !leads(&key) {
            continue;
        }
        let Some(high_watermark) = high_watermark(&key) else {
            continue;
        };
        if *offset > high_watermark {
            return Err(NodeError::new(
                ErrorCode::OffsetOutOfRange,
                format!(
                    "commit of offset {offset} on partition {partition} is beyond its high watermark {high_watermark}"
                ),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
