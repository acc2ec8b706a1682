//! Answers the connection gives from its shard's own view, filtered by what the user
//! may see: the stream list, the cluster map and this node's status.

use braid_proto::client::{
    ClusterInfo, GroupBehind, NodeStatus, PartitionPrimary, PeerBundle, Response, StreamSummary,
    TopicPrimaries, GROUPS_BEHIND_LISTED_MAX,
};

use super::Env;

/// Whether the connection's user may see `stream` (everything, without
/// authentication).
fn sees(env: &Env, layout: &crate::layout::Layout, stream: &str) -> bool {
    if !env.shared.config.authentication {
        return true;
    }
    let login = env.login.borrow();
    login
        .user()
        .is_some_and(|user| layout.access.sees_stream(user, stream))
}

/// The streams this connection may see, by name, from the shard's layout.
pub(super) fn list_streams(env: &Env) -> Response {
    let layout = env.layout.borrow();
    let mut list: Vec<StreamSummary> = layout
        .streams
        .iter()
        .filter(|(name, _)| sees(env, &layout, name))
        .map(|(name, topics)| StreamSummary {
            name: name.clone(),
            topics: topics.len() as u32,
        })
        .collect();
    list.sort_by(|a, b| a.name.cmp(&b.name));
    Response::Streams(list)
}

/// The members and each visible partition's primary, as its owner shard last
/// published it.
pub(super) fn cluster_info(env: &Env) -> Response {
    let layout = env.layout.borrow();
    let cluster = &env.shared.cluster;
    let published = env.shared.partitions_published.read().ok();
    let primary_of = |topic_id: u32, partition: u32| {
        let key = crate::layout::PartitionKey {
            topic_id,
            partition,
        };
        // Not yet published by its shard (just created): a new group starts in view 0,
        // led by the member its group id names.
        let members = u8::try_from(cluster.members.len()).unwrap_or(u8::MAX);
        let group = crate::replication::partition_groups::group_of(key);
        let view_0 = braid_vsr::primary_of(group, 0, members);
        let (primary, view) = published
            .as_ref()
            .and_then(|p| p.get(&key))
            .map_or((Some(view_0), 0), |p| p.primary());
        PartitionPrimary {
            partition,
            primary,
            view,
        }
    };
    let mut topics: Vec<TopicPrimaries> = layout
        .streams
        .iter()
        .filter(|(stream, _)| sees(env, &layout, stream))
        .flat_map(|(stream, topics)| {
            topics.iter().map(move |(topic, route)| TopicPrimaries {
                stream: stream.clone(),
                topic: topic.clone(),
                partitions: route
                    .partitions
                    .iter()
                    .map(|p| primary_of(route.id, p.id))
                    .collect(),
            })
        })
        .collect();
    topics.sort_by(|a, b| (&a.stream, &a.topic).cmp(&(&b.stream, &b.topic)));
    Response::Cluster(ClusterInfo {
        cluster_id: cluster.cluster_id.clone(),
        node_id: cluster.node_id,
        coordinator: if cluster.members.len() <= 1 {
            Some(cluster.node_id)
        } else {
            env.shared.coordinator()
        },
        members: cluster.members.clone(),
        topics,
    })
}

/// This node's replicas summed up, its bundle to each peer, and the first groups it
/// has not caught up on, named when the user may see their stream.
pub(super) fn node_status(env: &Env) -> Response {
    let me = env.shared.cluster.node_id;
    let summary = env.shared.board.summary(me);
    let layout = env.layout.borrow();
    let name_of = |group: u64| match crate::replication::partition_groups::key_of(group) {
        None => "metadata".to_owned(),
        Some(key) => layout
            .streams
            .iter()
            .filter(|(stream, _)| sees(env, &layout, stream))
            .find_map(|(stream, topics)| {
                let (topic, _) = topics.iter().find(|(_, route)| route.id == key.topic_id)?;
                Some(format!("{stream}/{topic}/{}", key.partition))
            })
            .unwrap_or_else(|| format!("topic #{}/{}", key.topic_id, key.partition)),
    };
    let behind = env
        .shared
        .board
        .rows()
        .into_iter()
        .filter(|g| !g.caught_up())
        .take(GROUPS_BEHIND_LISTED_MAX)
        .map(|g| GroupBehind {
            group: g.group,
            name: name_of(g.group),
            status: g.replica_status(),
            view: g.view,
            primary: (g.status == braid_vsr::Status::Normal).then_some(g.primary),
            op: g.op,
            commit_min: g.commit_min,
            commit_max: g.commit_max,
        })
        .collect();
    let peers = env.shared.bus.get().map_or_else(Vec::new, |bus| {
        bus.peers()
            .into_iter()
            .map(|p| PeerBundle {
                peer: p.peer,
                bundle_up: p.bundle_up,
                links_up: p.links_up,
                links: p.links,
                generation: p.generation,
                in_state_ms: p.in_state_for.as_millis() as u64,
                teardowns: p.teardowns,
                frames_sent: p.frames_sent,
                frames_received: p.frames_received,
            })
            .collect()
    });
    Response::Node(NodeStatus {
        node_id: me,
        uptime_ms: env.shared.started.elapsed().as_millis() as u64,
        caught_up: summary.caught_up(),
        groups: summary.groups,
        groups_led: summary.led,
        groups_in_view_change: summary.in_view_change,
        groups_behind: summary.behind,
        commit_lag_ops: summary.commit_lag,
        views_passed: summary.views_passed,
        step_downs: summary.step_downs,
        peers,
        behind,
    })
}
