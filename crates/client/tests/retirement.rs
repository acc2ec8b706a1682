//! Ended client sessions retired in batches across three in-process nodes over the
//! real replica bus: every member walks its copies and reports, the coordinator
//! finalizes through the lowest watermark once every member has reported, and a
//! member that is down holds the batch back until it is back and has proven its
//! copies.

// A panic in a test is a failed assertion, not a crash on outside data.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::{Duration, Instant};

use braid_client::{Client, Producer, ProducerConfig};
use braid_node::FsyncSetting;
use common::start_cluster;

const PARTITIONS: u32 = 6;

/// Sends a record under each of 40 keys (every partition gets some) and waits for
/// every acknowledgement; returns the producer's session.
async fn write_everywhere(client: &Client) -> u64 {
    let producer = Producer::new(client, "s", "t", ProducerConfig::default())
        .await
        .unwrap();
    let answers: Vec<_> = (0..40)
        .map(|key| producer.send(Some(format!("k{key}").as_bytes()), b"v"))
        .collect();
    for answer in answers {
        answer.await.unwrap();
    }
    let session = producer
        .session()
        .expect("an idempotent producer holds one");
    drop(producer);
    session
}

/// `keeper`'s heartbeat answer: the op through which ended sessions are retired.
async fn retired_through(client: &Client, keeper: u64) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match client.session_heartbeat(keeper).await {
            Ok(retired) => return retired,
            Err(err) => assert!(Instant::now() < deadline, "no heartbeat answer: {err}"),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits (60 s at most) until `session`, the last of those ended, is retired (its
/// heartbeat finds it gone, not ended), and with it every one ended before it;
/// `keeper`'s heartbeat then says retired through an op past its id.
async fn until_retired(client: &Client, keeper: u64, session: u64) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match client.session_heartbeat(session).await {
            Err(err) if err.to_string().contains("does not exist") => break,
            Err(err) if err.code() == Some(braid_proto::client::ErrorCode::SessionNotFound) => {}
            // A coordinator being chosen: asked again.
            Err(_) | Ok(_) => {}
        }
        assert!(
            Instant::now() < deadline,
            "session {session} not retired in 60 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let retired = retired_through(client, keeper).await;
    assert!(retired > session, "retired through {retired}");
}

/// Registers a session and stores its request 0 (one record) in each of
/// `partitions`; a member that has not applied the register yet answers Busy for a
/// moment. Returns the session.
async fn session_writing_to(
    client: &Client,
    partitions: std::ops::Range<u32>,
    value: &[u8],
) -> u64 {
    let session = client
        .register_session(Duration::from_secs(60))
        .await
        .unwrap();
    let mut builder = braid_proto::BatchBuilder::new(0);
    builder.push(None, Some(value), &[], 0);
    builder.producer(session as i64, -1, 0);
    let batch = builder.finish();
    for partition in partitions {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match client.produce("s", "t", partition, &batch).await {
                Ok(_) => break,
                Err(err) if err.code() == Some(braid_proto::client::ErrorCode::Busy) => {
                    assert!(Instant::now() < deadline, "{err}");
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                Err(err) => panic!("{err}"),
            }
        }
    }
    session
}

/// Retirement barriers the members' primaries proposed, in all.
async fn barriers(members: &[common::Member]) -> u64 {
    let mut barriers = 0;
    for member in members {
        barriers += common::metric(member.http_addr(), "braid_retirement_barriers_total").await;
    }
    barriers
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ended_sessions_retire_once_every_member_has_proven_its_copies() {
    let mut members = start_cluster(3, FsyncSetting::Always);
    let client = Client::connect(members[0].addr()).await.unwrap();
    common::create_topic(&client, "s", "t", PARTITIONS).await;
    let keeper = client
        .register_session(Duration::from_secs(60))
        .await
        .unwrap();
    let first = write_everywhere(&client).await;
    members[2].stop();
    let second = write_everywhere(&client).await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(
        retired_through(&client, keeper).await,
        0,
        "member 2 is down: its copies are unproven, nothing is retired"
    );
    members[2].start();
    // The producers ended their sessions when dropped, the second last.
    until_retired(&client, keeper, second).await;
    let barriers = barriers(&members).await;
    assert!(
        barriers >= u64::from(PARTITIONS),
        "every partition took a barrier: {barriers}"
    );
    for session in [first, second] {
        let err = client.session_heartbeat(session).await.unwrap_err();
        assert!(err.to_string().contains("retired"), "{err}");
    }
}

/// The coordinator stops right after the sessions end (a metadata view change amid
/// the reports and the finalize): once it is back, the new coordinator finalizes
/// them, and a batch of more than 128 sessions on one partition takes more than one
/// barrier there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_of_130_sessions_retires_across_a_coordinator_failover() {
    let mut members = start_cluster(3, FsyncSetting::Always);
    let client = Client::connect(members[0].addr()).await.unwrap();
    common::create_topic(&client, "s", "t", 1).await;
    let keeper = client
        .register_session(Duration::from_secs(60))
        .await
        .unwrap();
    let mut sessions = Vec::new();
    for i in 0..130 {
        sessions.push(session_writing_to(&client, 0..1, format!("v{i}").as_bytes()).await);
    }
    let coordinator = client.cluster_info().await.unwrap().coordinator.unwrap();
    for session in &sessions {
        client.end_session(*session).await.unwrap();
    }
    members[usize::from(coordinator)].stop();
    tokio::time::sleep(Duration::from_secs(1)).await;
    members[usize::from(coordinator)].start();
    until_retired(&client, keeper, *sessions.last().unwrap()).await;
    let barriers = barriers(&members).await;
    assert!(barriers >= 2, "130 sessions need two barriers: {barriers}");
    let mut builder = braid_proto::BatchBuilder::new(0);
    builder.push(None, Some(b"late"), &[], 0);
    builder.producer(sessions[0] as i64, -1, 1);
    let late = client
        .produce("s", "t", 0, &builder.finish())
        .await
        .unwrap_err();
    assert!(late.to_string().contains("retired"), "{late}");
}

/// Sessions that end together are one batch: the walks wait for the ends to stop
/// (100 ms) before they start, so each partition takes one barrier for all of them,
/// not one for the first to end and another for the rest, and one FinalizeSession
/// retires them all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_that_end_together_take_one_barrier_per_partition() {
    let members = start_cluster(3, FsyncSetting::Always);
    let client = Client::connect(members[0].addr()).await.unwrap();
    common::create_topic(&client, "s", "t", PARTITIONS).await;
    let keeper = client
        .register_session(Duration::from_secs(60))
        .await
        .unwrap();
    let mut sessions = Vec::new();
    for _ in 0..8 {
        sessions.push(session_writing_to(&client, 0..PARTITIONS, b"v").await);
    }
    let before = barriers(&members).await;
    // One after another, 30 ms apart, as clients closing one by one would: each
    // end is a committed op of its own, and the walks look every 10 ms.
    let mut gap = Duration::ZERO;
    let mut last = Instant::now();
    for (i, session) in sessions.iter().enumerate() {
        if i > 0 {
            tokio::time::sleep(Duration::from_millis(30)).await;
        }
        client.end_session(*session).await.unwrap();
        gap = gap.max(last.elapsed());
        last = Instant::now();
    }
    until_retired(&client, keeper, *sessions.last().unwrap()).await;
    let barriers = barriers(&members).await - before;
    if gap < Duration::from_millis(80) {
        assert_eq!(
            barriers,
            u64::from(PARTITIONS),
            "one barrier per partition for the 8 sessions"
        );
    } else {
        // A stalled machine let the walk start between two ends: two walks, still
        // never a barrier per session.
        assert!(barriers <= 2 * u64::from(PARTITIONS), "{barriers} barriers");
    }
    for session in &sessions {
        let err = client.session_heartbeat(*session).await.unwrap_err();
        assert!(err.to_string().contains("retired"), "{err}");
    }
}
