//! `NodeStatus` on three in-process nodes, as `braid cluster status` asks it: every
//! member answers for its own replicas and its bundle to each peer; a stopped member
//! does not answer and the others report their bundle to it down; with two of three
//! stopped, the survivor reports the groups it cannot finish a view change in.

// A panic in a test is a failed assertion, not a crash on outside data.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::{Duration, Instant};

use braid_client::{Client, MemberStatus};
use braid_node::FsyncSetting;
use braid_proto::client::{NodeStatus, ReplicaStatus};
use common::start_cluster;

/// Partitions of the test topic; with the metadata, the groups each member holds.
const PARTITIONS: u64 = 4;

/// Asks every member until `done` holds for the answers (or fails after 30 s).
async fn wait_for(
    client: &Client,
    what: &str,
    done: impl Fn(&[MemberStatus]) -> bool,
) -> Vec<MemberStatus> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let statuses = client.member_statuses().await;
        if done(&statuses) {
            return statuses;
        }
        assert!(Instant::now() < deadline, "{what}: {statuses:#?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn answer(statuses: &[MemberStatus], member: u8) -> Option<&NodeStatus> {
    statuses
        .iter()
        .find(|s| s.id == Some(member))
        .and_then(|s| s.status.as_ref().ok())
}

fn bundle_up(status: &NodeStatus, peer: u8) -> Option<bool> {
    status
        .peers
        .iter()
        .find(|p| p.peer == peer)
        .map(|p| p.bundle_up)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_member_reports_its_groups_and_bundles_and_a_stopped_one_shows() {
    let mut members = start_cluster(3, FsyncSetting::Never);
    let client = Client::connect(members[0].addr()).await.unwrap();
    common::create_topic(&client, "s", "t", PARTITIONS as u32).await;
    client.refresh().await.unwrap();

    // All three answer, caught up, every bundle whole; each group has one primary.
    let all = wait_for(&client, "three caught-up members", |statuses| {
        (0..3).all(|m| {
            answer(statuses, m).is_some_and(|s| {
                s.caught_up
                    && s.groups == PARTITIONS + 1
                    && s.peers.len() == 2
                    && s.peers.iter().all(|p| p.bundle_up && p.links_up == p.links)
            })
        })
    })
    .await;
    let led: u64 = (0..3).map(|m| answer(&all, m).unwrap().groups_led).sum();
    assert_eq!(led, PARTITIONS + 1, "each group led once: {all:#?}");
    for m in 0..3 {
        let status = answer(&all, m).unwrap();
        assert_eq!(status.node_id, m);
        assert!(status.behind.is_empty() && status.commit_lag_ops == 0);
        assert!(status
            .peers
            .iter()
            .all(|p| p.peer != m && p.frames_sent > 0));
    }

    // Member 2 stops: it does not answer; the others see its bundle go down and, once
    // its groups moved, are caught up again and lead every group between them.
    members[2].stop();
    let after = wait_for(&client, "member 2 seen down", |statuses| {
        statuses
            .iter()
            .any(|s| s.id == Some(2) && s.status.is_err())
            && (0..2).all(|m| {
                answer(statuses, m).is_some_and(|s| {
                    s.caught_up
                        && bundle_up(s, 2) == Some(false)
                        && bundle_up(s, 1 - m) == Some(true)
                })
            })
            && (0..2)
                .map(|m| answer(statuses, m).map_or(0, |s| s.groups_led))
                .sum::<u64>()
                == PARTITIONS + 1
    })
    .await;
    for m in 0..2 {
        let to_2 = answer(&after, m)
            .unwrap()
            .peers
            .iter()
            .find(|p| p.peer == 2);
        assert!(to_2.is_some_and(|p| p.teardowns >= 1 && p.links_up == 0));
    }
    let http = members[0].http_addr();
    assert_eq!(
        common::metric(http, "braid_bus_peer_up{peer=\"2\"}").await,
        0
    );
    assert_eq!(
        common::metric(http, "braid_bus_peer_up{peer=\"1\"}").await,
        1
    );

    // Member 1 stops too: member 0 alone cannot finish a view change for the groups it
    // does not lead, and names them.
    let survivor = Client::connect(members[0].addr()).await.unwrap();
    members[1].stop();
    let alone = wait_for(&survivor, "member 0 stuck in view changes", |statuses| {
        answer(statuses, 0).is_some_and(|s| {
            !s.caught_up
                && s.groups_in_view_change >= 1
                && s.behind.iter().any(|g| g.status != ReplicaStatus::Normal)
        })
    })
    .await;
    let status = answer(&alone, 0).unwrap();
    assert_eq!(status.behind.len() as u64, status.groups_behind);
    for group in &status.behind {
        assert!(
            group.name == "metadata" || group.name.starts_with("s/t/"),
            "{group:?}"
        );
        if group.status != ReplicaStatus::Normal {
            assert_eq!(group.primary, None, "{group:?}");
        }
    }
    for member in &mut members {
        member.stop();
    }
}
