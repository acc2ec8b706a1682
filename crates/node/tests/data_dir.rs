//! A node started on a data directory that is not its own refuses with a message that
//! says whose it is.

// A panic in a test is a failed assertion, not a crash on outside data.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use braid_node::{ClusterSettings, MemberSettings, Node, NodeConfig, Secret, StartError};

fn config(dir: &std::path::Path) -> NodeConfig {
    NodeConfig {
        data_dir: dir.to_path_buf(),
        client_addr: "127.0.0.1:0".parse().unwrap(),
        http_addr: "127.0.0.1:0".parse().unwrap(),
        shards: 1,
        ..NodeConfig::default()
    }
}

fn member_of(cluster: &str) -> ClusterSettings {
    ClusterSettings {
        id: cluster.into(),
        node_id: 0,
        members: vec![MemberSettings {
            id: 0,
            replica_addr: "127.0.0.1:7390".parse().unwrap(),
            client_addr: "127.0.0.1:7370".parse().unwrap(),
        }],
        secret: Some(Secret("sixteen bytes at least".into())),
        ..ClusterSettings::default()
    }
}

#[test]
fn a_data_directory_of_another_cluster_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    Node::start(config(dir.path())).unwrap().shutdown();
    let identity = std::fs::read_to_string(dir.path().join("identity")).unwrap();
    assert!(identity.contains("format = 2"), "{identity}");
    // The single node's directory restarts as itself...
    Node::start(config(dir.path())).unwrap().shutdown();
    // ...and is refused to a member of a named cluster, naming both.
    let refused = Node::start(NodeConfig {
        cluster: Some(member_of("prod")),
        ..config(dir.path())
    })
    .unwrap_err();
    assert!(matches!(refused, StartError::DataDir(_)), "{refused}");
    assert!(refused.to_string().contains("\"prod\""), "{refused}");

    let member = tempfile::tempdir().unwrap();
    let prod = NodeConfig {
        cluster: Some(member_of("prod")),
        ..config(member.path())
    };
    Node::start(prod.clone()).unwrap().shutdown();
    Node::start(prod).unwrap().shutdown();
    let staging = Node::start(NodeConfig {
        cluster: Some(member_of("staging")),
        ..config(member.path())
    })
    .unwrap_err();
    assert!(staging.to_string().contains("staging"), "{staging}");
}

#[test]
fn a_cluster_member_without_a_secret_is_refused_before_it_claims_its_directory() {
    let dir = tempfile::tempdir().unwrap();
    let mut cluster = member_of("prod");
    cluster.secret = None;
    for id in 1..3u8 {
        cluster.members.push(MemberSettings {
            id,
            replica_addr: format!("127.0.0.1:{}", 7390 + u16::from(id))
                .parse()
                .unwrap(),
            client_addr: format!("127.0.0.1:{}", 7370 + u16::from(id))
                .parse()
                .unwrap(),
        });
    }
    let refused = Node::start(NodeConfig {
        cluster: Some(cluster),
        ..config(dir.path())
    })
    .unwrap_err();
    assert!(refused.to_string().contains("secret"), "{refused}");
    assert!(
        !dir.path().join("identity").exists(),
        "a refused start claimed the directory"
    );
}
