//! The metadata group on three in-process nodes over the real replica bus: a change
//! made through any node is on every node, the group outlives its primary's stop, and
//! the stopped node catches up when it comes back.

// A panic in a test is a failed assertion, not a crash on outside data.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use braid_client::Client;
use braid_node::FsyncSetting;
use common::{start_cluster, Member};

async fn streams_on(addr: SocketAddr) -> Vec<String> {
    match common::direct(addr).await {
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
    let mut members = start_cluster(3, FsyncSetting::Always);
    // A change through each node, backups included: each is forwarded to the primary.
    for (i, member) in members.iter().enumerate() {
        let client = common::direct(member.config.client_addr).await.unwrap();
        client.create_stream(&format!("s{i}")).await.unwrap();
        // The node that took it has applied it before it answered.
        assert!(streams_on(member.config.client_addr)
            .await
            .contains(&format!("s{i}")));
    }
    until_everywhere(&members, &["s0", "s1", "s2"]).await;
    // The bus's counters are in /metrics: bundles to both peers came up, frames flowed.
    let http = members[1].node.as_ref().unwrap().http_addr();
    assert!(common::metric(http, "braid_bus_bundles_up_total").await >= 2);
    assert!(common::metric(http, "braid_bus_frames_received_total").await > 0);
    // Present (a start race, a peer dialled before it listened, may count one).
    common::metric(http, "braid_bus_handshake_failures_total").await;
    // A second create of the same name is refused, wherever it comes in.
    let client = Client::connect(members[2].config.client_addr)
        .await
        .unwrap();
    assert!(client.create_stream("s0").await.is_err());

    // Member 0 leads view 0; stop it and change through the others.
    members[0].stop();
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
    members[0].start();
    until_everywhere(&members, &["s0", "s1", "s2", "after"]).await;
    let client = Client::connect(members[0].config.client_addr)
        .await
        .unwrap();
    client.create_stream("back").await.unwrap();
    until_everywhere(&members, &["after", "back"]).await;
    for member in &mut members {
        member.stop();
    }
}

/// Issue 24, finding 7: a restarted member answered from empty metadata for about
/// 200 ms (`ListStreams` empty, `StreamNotFound` to producers) before its metadata
/// replica caught up. It now answers `NotLeader` until then: every answer it gives
/// right after its start is a refusal or the whole list, never less.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_member_serves_nothing_before_its_metadata_caught_up() {
    let mut members = start_cluster(3, FsyncSetting::Always);
    let client = Client::connect(members[0].addr()).await.unwrap();
    let names: Vec<String> = (0..300).map(|i| format!("s{i}")).collect();
    for name in &names {
        client.create_stream(name).await.unwrap();
    }
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    until_everywhere(&members, &refs).await;
    for round in 0..3 {
        let id = 1 + round % 2;
        members[id].stop();
        members[id].start();
        let (mut refused, mut whole) = (0, 0);
        let deadline = Instant::now() + Duration::from_secs(3);
        while Instant::now() < deadline {
            let Ok(direct) = common::direct(members[id].addr()).await else {
                continue;
            };
            match direct.list_streams().await {
                Ok(streams) => {
                    assert_eq!(
                        streams.len(),
                        names.len(),
                        "round {round}: member {id} answered from metadata that lags"
                    );
                    whole += 1;
                }
                Err(err) => {
                    assert!(err.to_string().contains("catching up"), "{err}");
                    refused += 1;
                }
            }
        }
        println!("round {round}: member {id}: {refused} refused, then {whole} whole lists");
        assert!(whole > 0, "it served again once caught up");
    }
}
