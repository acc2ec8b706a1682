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

/// Issue 24, finding 13: a node whose `partitions/` directory, metadata journal or
/// metadata states were lost started as an empty node without a word. Each is now
/// refused by name, and the directory restored is served again.
/// Issue 24: a directory that once held data knows it. (An outside review deleted a
/// single node's partition states table, `replication/shard-N.*`, and it started as if
/// its partitions had never voted.)
#[test]
fn a_started_directory_that_lost_its_metadata_or_partitions_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    Node::start(config(dir.path())).unwrap().shutdown();
    let identity = std::fs::read_to_string(dir.path().join("identity")).unwrap();
    assert!(identity.contains("initialized = true"), "{identity}");
    for gone in [
        "partitions",
        "metadata/group-0.journal",
        "metadata/shard-0",
        "replication/shard-0",
    ] {
        let aside = tempfile::tempdir().unwrap();
        let moved: Vec<String> = if gone.ends_with("/shard-0") {
            vec![format!("{gone}.0"), format!("{gone}.1")]
        } else {
            vec![gone.into()]
        };
        for (i, path) in moved.iter().enumerate() {
            std::fs::rename(dir.path().join(path), aside.path().join(i.to_string())).unwrap();
        }
        let refused = Node::start(config(dir.path())).unwrap_err();
        let text = refused.to_string();
        assert!(text.contains(gone), "{gone}: {text}");
        assert!(text.contains("backup"), "{text}");
        assert!(
            !dir.path().join(&moved[0]).exists(),
            "nothing was recreated"
        );
        for (i, path) in moved.iter().enumerate() {
            std::fs::rename(aside.path().join(i.to_string()), dir.path().join(path)).unwrap();
        }
        Node::start(config(dir.path())).unwrap().shutdown();
    }
}

/// Issue 24, finding 4: a member whose directory was wiped and restarted as before
/// (without `--rejoin`) started as a new member, and the cluster then lost 99
/// acknowledged records. A member of a cluster of several now refuses an empty
/// directory unless told it is new (`--init`) or lost its data (`--rejoin`); a
/// directory it claimed before needs neither.
#[test]
fn a_cluster_member_refuses_an_empty_directory_unless_told_new_or_rejoining() {
    let two = |node_id: u8, init: bool, rejoin: bool| {
        let mut cluster = member_of("prod");
        cluster.node_id = node_id;
        cluster.members.push(MemberSettings {
            id: 1,
            replica_addr: "127.0.0.1:7391".parse().unwrap(),
            client_addr: "127.0.0.1:7371".parse().unwrap(),
        });
        cluster.members.push(MemberSettings {
            id: 2,
            replica_addr: "127.0.0.1:7392".parse().unwrap(),
            client_addr: "127.0.0.1:7372".parse().unwrap(),
        });
        cluster.init = init;
        cluster.rejoin = rejoin;
        cluster
    };
    let dir = tempfile::tempdir().unwrap();
    let refused = Node::start(NodeConfig {
        cluster: Some(two(1, false, false)),
        ..config(dir.path())
    })
    .unwrap_err()
    .to_string();
    assert!(
        refused.contains("--init") && refused.contains("--rejoin"),
        "{refused}"
    );
    assert!(
        !dir.path().join("identity").exists(),
        "nothing claimed: the same command with a flag still works"
    );
    for (init, rejoin) in [(true, false), (false, true)] {
        let dir = tempfile::tempdir().unwrap();
        let cluster = two(1, init, rejoin);
        let started = Node::start(NodeConfig {
            cluster: Some(cluster),
            shutdown_grace_ms: 100,
            ..config(dir.path())
        });
        assert!(
            started.is_ok(),
            "init {init} rejoin {rejoin}: {:?}",
            started.err()
        );
        started.unwrap().shutdown();
        // Claimed: later starts need no flag.
        Node::start(NodeConfig {
            cluster: Some(two(1, false, false)),
            shutdown_grace_ms: 100,
            ..config(dir.path())
        })
        .unwrap()
        .shutdown();
    }
}

/// A partition belongs to the shard its key hashes to among `shards`: started with
/// another count, a shard would open partitions whose states its table never held, and
/// their replicas would forget the views they voted in. The count a directory was made
/// with is kept, and another one is refused, naming it.
#[test]
fn a_directory_started_with_another_shard_count_is_refused_naming_its_own() {
    let dir = tempfile::tempdir().unwrap();
    let two = NodeConfig {
        shards: 2,
        ..config(dir.path())
    };
    Node::start(two.clone()).unwrap().shutdown();
    for shards in [1, 3] {
        let refused = Node::start(NodeConfig {
            shards,
            ..two.clone()
        })
        .unwrap_err();
        assert!(matches!(refused, StartError::ShardCount(_)), "{refused}");
        assert!(refused.to_string().contains("--shards 2"), "{refused}");
    }
    Node::start(two).unwrap().shutdown();
}
