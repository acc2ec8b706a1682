//! The metadata group on three in-process nodes over the real replica bus: a change
//! made through any node is on every node, the group outlives its primary's stop, and
//! the stopped node catches up when it comes back. (Partitions do not replicate yet,
//! so these nodes start with the test-only `unreplicated_partitions`.)

// A panic in a test is a failed assertion, not a crash on outside data.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use braid_client::Client;
use braid_node::{ClusterSettings, MemberSettings, Node, NodeConfig, Secret};

struct Member {
    node: Option<Node>,
    /// Holds the data directory for the test's length.
    _dir: tempfile::TempDir,
    config: NodeConfig,
}

/// Reserves `n` loopback addresses (bound, then released).
fn addresses(n: usize) -> Vec<SocketAddr> {
    let probes: Vec<_> = (0..n)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap())
        .collect();
    probes.iter().map(|p| p.local_addr().unwrap()).collect()
}

fn start_cluster(n: u8) -> Vec<Member> {
    let replica = addresses(n.into());
    let client = addresses(n.into());
    let members: Vec<MemberSettings> = (0..n)
        .map(|id| MemberSettings {
            id,
            replica_addr: replica[usize::from(id)],
            client_addr: client[usize::from(id)],
        })
        .collect();
    (0..n)
        .map(|id| {
            let dir = tempfile::tempdir().unwrap();
            let config = NodeConfig {
                data_dir: dir.path().to_path_buf(),
                client_addr: client[usize::from(id)],
                http_addr: "127.0.0.1:0".parse().unwrap(),
                shards: 2,
                shutdown_grace_ms: 500,
                cluster: Some(ClusterSettings {
                    id: "test".into(),
                    node_id: id,
                    members: members.clone(),
                    heartbeat_timeout_ms: 1_000,
                    secret: Some(Secret("a secret of enough bytes".into())),
                    unreplicated_partitions: true,
                    ..ClusterSettings::default()
                }),
                ..NodeConfig::default()
            };
            Member {
                node: Some(Node::start(config.clone()).unwrap()),
                _dir: dir,
                config,
            }
        })
        .collect()
}

async fn streams_on(addr: SocketAddr) -> Vec<String> {
    match Client::connect(addr).await {
        Ok(client) => client
            .list_streams()
            .await
            .map(|s| s.into_iter().map(|s| s.name).collect())
            .unwrap_or_default(),
        Err(_) => Vec::new(),
    }
}

/// Waits until every listed node lists every stream of `names`.
async fn until_everywhere(members: &[Member], names: &[&str]) {
    let deadline = Instant::now() + Duration::from_secs(20);
    for member in members.iter().filter(|m| m.node.is_some()) {
        loop {
            let streams = streams_on(member.config.client_addr).await;
            if names.iter().all(|n| streams.iter().any(|s| s == n)) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "node {:?} lists {streams:?}, not all of {names:?}",
                member.config.cluster.as_ref().map(|c| c.node_id)
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_through_any_node_is_on_every_node_and_outlives_the_primary() {
    let mut members = start_cluster(3);
    // A change through each node, backups included: each is forwarded to the primary.
    for (i, member) in members.iter().enumerate() {
        let client = Client::connect(member.config.client_addr).await.unwrap();
        client.create_stream(&format!("s{i}")).await.unwrap();
        // The node that took it has applied it before it answered.
        assert!(streams_on(member.config.client_addr)
            .await
            .contains(&format!("s{i}")));
    }
    until_everywhere(&members, &["s0", "s1", "s2"]).await;
    // A second create of the same name is refused, wherever it comes in.
    let client = Client::connect(members[2].config.client_addr)
        .await
        .unwrap();
    assert!(client.create_stream("s0").await.is_err());

    // Member 0 leads view 0; stop it and change through the others.
    members[0].node.take().unwrap().shutdown();
    let started = Instant::now();
    let client = Client::connect(members[1].config.client_addr)
        .await
        .unwrap();
    client.create_stream("after").await.unwrap();
    println!(
        "a change with the primary stopped took {:?}",
        started.elapsed()
    );
    until_everywhere(&members, &["s0", "s1", "s2", "after"]).await;

    // Member 0 comes back on its directory and catches up.
    let config = members[0].config.clone();
    members[0].node = Some(Node::start(config).unwrap());
    until_everywhere(&members, &["s0", "s1", "s2", "after"]).await;
    let client = Client::connect(members[0].config.client_addr)
        .await
        .unwrap();
    client.create_stream("back").await.unwrap();
    until_everywhere(&members, &["after", "back"]).await;
    for member in &mut members {
        if let Some(node) = member.node.take() {
            node.shutdown();
        }
    }
}
