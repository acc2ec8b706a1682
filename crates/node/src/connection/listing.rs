//! Answers the connection gives from its shard's own view, filtered by what the user
//! may see: the stream list and the cluster map.

use braid_proto::client::{ClusterInfo, PartitionPrimary, Response, StreamSummary, TopicPrimaries};

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
    let primaries = env.shared.primaries.read().ok();
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
        let (primary, view) = primaries
            .as_ref()
            .and_then(|p| p.get(&key))
            .map_or((Some(view_0), 0), |p| {
                crate::partition::unpack_primary(p.load(std::sync::atomic::Ordering::Relaxed))
            });
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
