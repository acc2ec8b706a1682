//! Client sessions end to end, in process on port 0: a session's produce sent again is
//! answered with the offsets it was stored at and stored once, across a restart; an
//! out-of-order or forgotten request is refused by type; a quiet session is ended by
//! the coordinator; the SDK's producer holds a session and numbers its batches.

// A panic in a test is a failed assertion, not a crash on outside data.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use braid_client::{Client, ClientError, Producer, ProducerConfig};
use braid_node::FsyncSetting;
use braid_proto::client::{ErrorCode, ErrorDetail};
use common::TestNode;

/// A batch of `records` values `{tag}-{i}`, numbered `request` in `session`.
fn tagged(session: u64, request: i32, tag: &str, records: usize) -> Vec<u8> {
    let mut builder = braid_proto::BatchBuilder::new(1_000);
    for i in 0..records {
        builder.push(None, Some(format!("{tag}-{i}").as_bytes()), &[], 1_000);
    }
    builder.producer(session as i64, -1, request);
    builder.finish()
}

fn detail(err: &ClientError) -> Vec<ErrorDetail> {
    match err {
        ClientError::Server { details, .. } => details.clone(),
        other => panic!("not a server error: {other:?}"),
    }
}

/// The values a partition holds, in offset order.
async fn values(client: &Client, partition: u32) -> Vec<String> {
    let fetched = client
        .fetch("s", "t", partition, 0, 1 << 20, 0)
        .await
        .unwrap();
    let mut out = Vec::new();
    let mut bytes = &fetched.batches[..];
    while !bytes.is_empty() {
        let (batch, used) = braid_proto::RecordBatch::validate(bytes).unwrap();
        for record in batch.records() {
            let record = record.unwrap();
            out.push(String::from_utf8(record.value.unwrap().to_vec()).unwrap());
        }
        bytes = &bytes[used..];
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sessions_request_sent_again_is_answered_its_offsets_and_stored_once() {
    let mut node = TestNode::start(FsyncSetting::Always);
    let client = Client::connect(node.addr()).await.unwrap();
    common::create_topic(&client, "s", "t", 2).await;
    let session = client
        .register_session(Duration::from_secs(30))
        .await
        .unwrap();
    assert!(session > 0);
    let other = client
        .register_session(Duration::from_secs(30))
        .await
        .unwrap();
    assert!(other > session, "ids only grow: {session} then {other}");

    let first = tagged(session, 0, "a", 3);
    assert_eq!(client.produce("s", "t", 0, &first).await.unwrap(), (0, 2));
    assert_eq!(
        client.produce("s", "t", 0, &first).await.unwrap(),
        (0, 2),
        "the same request again: its offsets, nothing stored"
    );
    // The same number with other records is refused: nothing of it is stored, and it
    // is never answered as if it were.
    let reused = client
        .produce("s", "t", 0, &tagged(session, 0, "z", 2))
        .await
        .unwrap_err();
    assert_eq!(reused.code(), Some(ErrorCode::InvalidBatch), "{reused}");
    // Another session's request 0 is its own; the next of the first takes 1.
    assert_eq!(
        client
            .produce("s", "t", 0, &tagged(other, 0, "b", 1))
            .await
            .unwrap(),
        (3, 3)
    );
    let gap = client
        .produce("s", "t", 0, &tagged(session, 2, "c", 1))
        .await
        .unwrap_err();
    assert_eq!(gap.code(), Some(ErrorCode::RequestOutOfOrder));
    assert_eq!(detail(&gap), [ErrorDetail::ExpectedRequest { request: 1 }]);
    assert_eq!(
        client
            .produce("s", "t", 0, &tagged(session, 1, "c", 1))
            .await
            .unwrap(),
        (4, 4)
    );
    // The numbering is per partition.
    assert_eq!(
        client
            .produce("s", "t", 1, &tagged(session, 0, "d", 1))
            .await
            .unwrap(),
        (0, 0)
    );
    // Eight requests are remembered; an older one is refused as stored before.
    for request in 2..=9 {
        client
            .produce(
                "s",
                "t",
                0,
                &tagged(session, request, &format!("e{request}"), 1),
            )
            .await
            .unwrap();
    }
    let older = client.produce("s", "t", 0, &first).await.unwrap_err();
    assert_eq!(older.code(), Some(ErrorCode::DuplicateRequest));
    assert_eq!(detail(&older), [ErrorDetail::LastRequest { request: 9 }]);
    let kept = client
        .produce("s", "t", 0, &tagged(session, 2, "e2", 1))
        .await
        .unwrap();
    assert_eq!(kept, (5, 5), "request 2 is within the last eight");

    // Each resend answered from an entry is counted (shards add their counts at
    // their next tick).
    let mut answered = 0;
    for _ in 0..50 {
        answered = common::metric(node.http_addr(), "braid_produce_resends_answered_total").await;
        if answered >= 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(answered, 2, "request 0 once, request 2 once");

    // A restart rebuilds the entries from the log and checkpoint.
    drop(client);
    node.restart();
    let client = Client::connect(node.addr()).await.unwrap();
    assert_eq!(
        client
            .produce("s", "t", 0, &tagged(session, 9, "e9", 1))
            .await
            .unwrap(),
        (12, 12)
    );
    assert_eq!(
        client
            .produce("s", "t", 0, &tagged(session, 10, "f", 1))
            .await
            .unwrap(),
        (13, 13)
    );
    let stored = values(&client, 0).await;
    let mut unique = stored.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(
        unique.len(),
        stored.len(),
        "nothing stored twice: {stored:?}"
    );
    assert_eq!(stored.len(), 14);

    // A batch that names a session without a number is refused whole.
    let mut half = braid_proto::BatchBuilder::new(1_000);
    half.push(None, Some(b"x"), &[], 1_000);
    half.producer(session as i64, -1, -1);
    let refused = client
        .produce("s", "t", 0, &half.finish())
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Some(ErrorCode::InvalidBatch));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_lives_on_heartbeats_and_ends_when_told_or_quiet() {
    let node = TestNode::start(FsyncSetting::Always);
    let client = Client::connect(node.addr()).await.unwrap();
    let too_short = client
        .register_session(Duration::from_millis(500))
        .await
        .unwrap_err();
    assert_eq!(too_short.code(), Some(ErrorCode::InvalidArgument));

    let ended = client
        .register_session(Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!(client.session_heartbeat(ended).await.unwrap(), 0);
    client.end_session(ended).await.unwrap();
    client.end_session(ended).await.unwrap();
    assert_eq!(
        client.session_heartbeat(ended).await.unwrap_err().code(),
        Some(ErrorCode::SessionNotFound)
    );
    assert_eq!(
        client.end_session(ended + 1_000).await.unwrap_err().code(),
        Some(ErrorCode::SessionNotFound)
    );
    // A produce names a session the metadata holds open, or is refused before its
    // partition sees it: an ended one for good, one newer than this member's
    // metadata as busy (it may be registered and not yet applied here).
    common::create_topic(&client, "s", "t", 1).await;
    let refused = client
        .produce("s", "t", 0, &tagged(ended, 0, "x", 1))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Some(ErrorCode::SessionNotFound));
    let unknown = client
        .produce("s", "t", 0, &tagged(1 << 40, 0, "x", 1))
        .await
        .unwrap_err();
    assert_eq!(unknown.code(), Some(ErrorCode::Busy), "{unknown}");
    assert!(client
        .fetch("s", "t", 0, 0, 1 << 20, 0)
        .await
        .unwrap()
        .batches
        .is_empty());

    let kept = client
        .register_session(Duration::from_millis(1_000))
        .await
        .unwrap();
    let quiet = client
        .register_session(Duration::from_millis(1_000))
        .await
        .unwrap();
    for _ in 0..6 {
        tokio::time::sleep(Duration::from_millis(300)).await;
        client.session_heartbeat(kept).await.unwrap();
    }
    assert_eq!(
        client.session_heartbeat(quiet).await.unwrap_err().code(),
        Some(ErrorCode::SessionNotFound),
        "1.8 s without a heartbeat"
    );
    client.session_heartbeat(kept).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_producer_holds_a_session_and_numbers_each_partitions_batches() {
    let node = TestNode::start(FsyncSetting::Always);
    let client = Client::connect(node.addr()).await.unwrap();
    common::create_topic(&client, "s", "t", 2).await;
    let config = ProducerConfig {
        session_timeout: Duration::from_millis(1_500),
        ..ProducerConfig::default()
    };
    let producer = Producer::new(&client, "s", "t", config).await.unwrap();
    let first_session = producer.session().unwrap();
    // The cluster ends the session (as if the producer had been cut off past its
    // timeout): the producer registers a new one and numbers from 0 again.
    client.end_session(first_session).await.unwrap();
    let mut session = first_session;
    for _ in 0..100 {
        tokio::time::sleep(Duration::from_millis(50)).await;
        session = producer.session().unwrap();
        if session != first_session {
            break;
        }
    }
    assert!(
        session > first_session,
        "a new session replaced the ended one"
    );
    let mut sends = Vec::new();
    for i in 0..200 {
        let key = format!("k{}", i % 7);
        sends.push(producer.send(Some(key.as_bytes()), format!("v{i}").as_bytes()));
        if i % 50 == 49 {
            producer.flush();
        }
    }
    producer.flush();
    for send in sends {
        send.await.unwrap();
    }
    // Every stored batch is the session's, numbered 0, 1, 2, ... per partition.
    for partition in 0..2 {
        let fetched = client
            .fetch("s", "t", partition, 0, 1 << 20, 0)
            .await
            .unwrap();
        let mut bytes = &fetched.batches[..];
        let mut next = 0;
        while !bytes.is_empty() {
            let (batch, used) = braid_proto::RecordBatch::validate(bytes).unwrap();
            let header = batch.header();
            assert_eq!(header.producer_id, session as i64);
            assert_eq!(header.base_sequence, next);
            next += 1;
            bytes = &bytes[used..];
        }
        assert!(next > 0, "partition {partition} took batches");
    }
    // Dropping the producer ends its session.
    drop(producer);
    let mut ended = false;
    for _ in 0..50 {
        tokio::time::sleep(Duration::from_millis(20)).await;
        if client.session_heartbeat(session).await.is_err() {
            ended = true;
            break;
        }
    }
    assert!(ended, "the session ended with its producer");
}

/// Ended sessions are retired in one batch: a walk proves every partition free of
/// them (barriers forget the entries the partitions held), the metadata forgets them,
/// an open session's heartbeat says through which op, and the open session's entries
/// stay (its retry is still answered its offsets).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ended_sessions_are_retired_in_a_batch_and_forgotten() {
    let node = TestNode::start(FsyncSetting::Always);
    let client = Client::connect(node.addr()).await.unwrap();
    common::create_topic(&client, "s", "t", 4).await;
    let keeper = client
        .register_session(Duration::from_secs(30))
        .await
        .unwrap();
    let kept = tagged(keeper, 0, "k", 1);
    let offsets = client.produce("s", "t", 0, &kept).await.unwrap();
    let mut ended = Vec::new();
    for i in 0..3 {
        let session = client
            .register_session(Duration::from_secs(30))
            .await
            .unwrap();
        for partition in 0..4 {
            let batch = tagged(session, 0, &format!("e{i}"), 2);
            client.produce("s", "t", partition, &batch).await.unwrap();
        }
        ended.push(session);
    }
    assert_eq!(client.session_heartbeat(keeper).await.unwrap(), 0);
    for session in &ended {
        client.end_session(*session).await.unwrap();
    }
    // Ended one after the other: once the last is retired, all are (its heartbeat
    // then finds it gone, not ended).
    let last = *ended.last().unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !client
        .session_heartbeat(last)
        .await
        .unwrap_err()
        .to_string()
        .contains("does not exist")
    {
        assert!(std::time::Instant::now() < deadline, "not retired in 30 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let retired = client.session_heartbeat(keeper).await.unwrap();
    assert!(retired > last, "through an end op past its id: {retired}");
    for session in &ended {
        let err = client
            .produce("s", "t", 1, &tagged(*session, 1, "late", 1))
            .await
            .unwrap_err();
        assert_eq!(err.code(), Some(ErrorCode::SessionNotFound), "{err}");
        assert!(err.to_string().contains("retired"), "{err}");
    }
    let barriers = common::metric(node.http_addr(), "braid_retirement_barriers_total").await;
    assert!(
        (4..=12).contains(&barriers),
        "a barrier per partition that held entries (one more at most per walk): {barriers}"
    );
    assert_eq!(
        client.produce("s", "t", 0, &kept).await.unwrap(),
        offsets,
        "the open session's entry stays"
    );
}
