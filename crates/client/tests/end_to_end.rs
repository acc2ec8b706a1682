//! End to end, in process on port 0: topics, producers, a consumer group.

// A panic in a test is a failed assertion, not a crash on outside data.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use braid_client::{Client, ClientError, Consumer, ConsumerConfig, Producer, ProducerConfig};
use braid_node::FsyncSetting;
use braid_proto::client::{ErrorCode, TopicSettings};
use common::TestNode;

/// A consumed record: partition, offset, key, value.
type Seen = (u32, u64, String, String);

const PRODUCERS: usize = 4;
const RECORDS_PER_PRODUCER: usize = 25_000;
const KEYS: usize = 200;

fn fast_group_config() -> ConsumerConfig {
    ConsumerConfig {
        heartbeat_interval: Duration::from_millis(50),
        session_timeout: Duration::from_millis(1_500),
        auto_commit: Some(Duration::from_millis(200)),
        ..ConsumerConfig::default()
    }
}

async fn produce_keyed(
    client: &Client,
    producer_id: usize,
    count: usize,
) -> Vec<(String, u32, u64)> {
    let producer = Producer::new(client, "shop", "orders", ProducerConfig::default())
        .await
        .unwrap();
    let mut sends = Vec::with_capacity(count);
    for i in 0..count {
        let key = format!("key-{}", (producer_id * 7 + i) % KEYS);
        let value = format!("{producer_id}:{i}");
        sends.push((
            key.clone(),
            producer.send(Some(key.as_bytes()), value.as_bytes()),
        ));
    }
    producer.flush();
    let mut stored = Vec::with_capacity(count);
    for (key, send) in sends {
        let meta = send.await.unwrap();
        stored.push((key, meta.partition, meta.offset));
    }
    stored
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keyed_records_are_consumed_exactly_once_in_key_order_by_a_group() {
    let node = TestNode::start(FsyncSetting::Never);
    let client = Client::connect(node.addr()).await.unwrap();
    client.create_stream("shop").await.unwrap();
    let settings = TopicSettings {
        partitions: 8,
        ..TopicSettings::default()
    };
    client
        .create_topic("shop", "orders", settings)
        .await
        .unwrap();
    assert_eq!(
        client
            .create_topic("shop", "orders", settings)
            .await
            .unwrap_err()
            .code(),
        Some(ErrorCode::TopicExists)
    );

    let mut tasks = Vec::new();
    for p in 0..PRODUCERS {
        let client = Client::connect(node.addr()).await.unwrap();
        tasks.push(tokio::spawn(async move {
            produce_keyed(&client, p, RECORDS_PER_PRODUCER).await
        }));
    }
    let mut produced = Vec::new();
    for task in tasks {
        produced.extend(task.await.unwrap());
    }
    assert_eq!(produced.len(), PRODUCERS * RECORDS_PER_PRODUCER);
    // Every key lives in exactly one partition.
    let mut key_partition: HashMap<String, u32> = HashMap::new();
    for (key, partition, _) in &produced {
        assert_eq!(
            *key_partition.entry(key.clone()).or_insert(*partition),
            *partition
        );
    }

    // Three members; each consumes until the group has seen everything.
    let total = produced.len();
    let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
    let mut members = Vec::new();
    for m in 0..3 {
        let client = Client::connect(node.addr()).await.unwrap();
        let seen = Arc::clone(&seen);
        members.push(tokio::spawn(async move {
            let mut consumer = Consumer::join_group(
                &client,
                "shop",
                "orders",
                "billing",
                &format!("m{m}"),
                fast_group_config(),
            )
            .await
            .unwrap();
            let deadline = Instant::now() + Duration::from_secs(60);
            while seen.lock().unwrap().len() < total && Instant::now() < deadline {
                for record in consumer.poll(Duration::from_millis(100)).await.unwrap() {
                    let key = String::from_utf8(record.key.unwrap()).unwrap();
                    let value = String::from_utf8(record.value.unwrap()).unwrap();
                    seen.lock()
                        .unwrap()
                        .push((record.partition, record.offset, key, value));
                }
            }
            consumer.close().await.unwrap();
        }));
        // Let the group rebalance while records flow.
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    for member in members {
        member.await.unwrap();
    }
    let seen = seen.lock().unwrap().clone();
    let unique: HashSet<(u32, u64)> = seen.iter().map(|r| (r.0, r.1)).collect();
    assert_eq!(unique.len(), total, "every record consumed");
    assert_eq!(seen.len(), total, "no record consumed twice");
    // Per key, values from one producer arrive in the order they were sent.
    let mut last: HashMap<(String, String), u64> = HashMap::new();
    let mut ordered = seen.clone();
    ordered.sort_by_key(|r| (r.0, r.1));
    for (_, _, key, value) in &ordered {
        let (producer, index) = value.split_once(':').unwrap();
        let index: u64 = index.parse().unwrap();
        if let Some(prev) = last.insert((key.clone(), producer.to_owned()), index) {
            assert!(
                prev < index,
                "key {key} from producer {producer}: {prev} then {index}"
            );
        }
    }
    // Lag reaches zero: the group committed the end of every partition.
    let description = client.describe_group("shop", "billing").await.unwrap();
    for offsets in &description.offsets {
        assert_eq!(
            offsets.committed,
            Some(offsets.high_watermark),
            "partition {}",
            offsets.partition
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_that_stops_heartbeating_loses_its_partitions_and_nothing_is_lost() {
    let node = TestNode::start(FsyncSetting::Never);
    let client = Client::connect(node.addr()).await.unwrap();
    client.create_stream("shop").await.unwrap();
    let settings = TopicSettings {
        partitions: 4,
        ..TopicSettings::default()
    };
    client
        .create_topic("shop", "orders", settings)
        .await
        .unwrap();
    let produced = produce_keyed(&client, 0, 2_000).await;

    let config = ConsumerConfig {
        auto_commit: None,
        ..fast_group_config()
    };
    let mut quitter = Consumer::join_group(&client, "shop", "orders", "g", "quitter", config)
        .await
        .unwrap();
    let mut stayer = Consumer::join_group(&client, "shop", "orders", "g", "stayer", config)
        .await
        .unwrap();
    let mut seen = HashSet::new();
    // Both consume a little; the quitter commits some of what it read, then goes silent.
    for _ in 0..10 {
        for r in quitter.poll(Duration::from_millis(20)).await.unwrap() {
            seen.insert((r.partition, r.offset));
        }
        for r in stayer.poll(Duration::from_millis(20)).await.unwrap() {
            seen.insert((r.partition, r.offset));
        }
    }
    // An asynchronous commit: sent at once, awaited later.
    let pending_commit = quitter.commit_async();
    pending_commit.await.unwrap();
    let quitter_had: Vec<u32> = quitter.positions().keys().copied().collect();
    assert!(!quitter_had.is_empty());
    // No more polls from the quitter; more records arrive in every partition.
    let more = produce_keyed(&client, 1, 2_000).await;
    let total = produced.len() + more.len();
    // Its session expires and the stayer takes over its partitions from their
    // committed offsets.
    let deadline = Instant::now() + Duration::from_secs(20);
    while (seen.len() < total || stayer.positions().len() < 4) && Instant::now() < deadline {
        for r in stayer.poll(Duration::from_millis(50)).await.unwrap() {
            seen.insert((r.partition, r.offset));
        }
    }
    assert_eq!(seen.len(), total, "no record lost when a member dies");
    assert!(quitter_had
        .iter()
        .all(|p| stayer.positions().contains_key(p)));
    let err = quitter.commit().await;
    assert!(
        matches!(
            err,
            Err(ClientError::Server {
                code: ErrorCode::UnknownMember | ErrorCode::NotAssigned,
                ..
            }) | Ok(())
        ),
        "{err:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_calls_list_describe_and_delete() {
    let node = TestNode::start(FsyncSetting::Always);
    let client = Client::connect(node.addr()).await.unwrap();
    client.ping().await.unwrap();
    client.create_stream("a").await.unwrap();
    assert_eq!(
        client.create_stream("a").await.unwrap_err().code(),
        Some(ErrorCode::StreamExists)
    );
    assert_eq!(
        client.create_stream("bad name").await.unwrap_err().code(),
        Some(ErrorCode::InvalidArgument)
    );
    client
        .create_topic(
            "a",
            "t",
            TopicSettings {
                partitions: 3,
                ..TopicSettings::default()
            },
        )
        .await
        .unwrap();
    let info = client.describe_topic("a", "t").await.unwrap();
    assert_eq!(info.partitions.len(), 3);
    assert_eq!(info.partitions[0].hash_start, 0);
    assert_eq!(info.partitions[2].hash_end, 0xffff);
    assert_eq!(
        info.settings.fsync,
        braid_proto::client::FSYNC_ALWAYS,
        "node default filled in"
    );
    let (base, last) = client.produce("a", "t", 1, &sample_batch(3)).await.unwrap();
    assert_eq!((base, last), (0, 2));
    assert_eq!(
        client.describe_topic("a", "t").await.unwrap().partitions[1].high_watermark,
        3
    );
    assert_eq!(client.list_topics("a").await.unwrap().len(), 1);
    assert_eq!(client.list_streams().await.unwrap()[0].topics, 1);
    client.delete_topic("a", "t").await.unwrap();
    assert_eq!(
        client
            .produce("a", "t", 1, &sample_batch(1))
            .await
            .unwrap_err()
            .code(),
        Some(ErrorCode::TopicNotFound)
    );
    client.delete_stream("a").await.unwrap();
    assert!(client.list_streams().await.unwrap().is_empty());
    // The deleted topic's data is gone from disk.
    let partitions = node.dir.path().join("partitions");
    let left = std::fs::read_dir(&partitions)
        .map(|d| d.count())
        .unwrap_or(0);
    assert_eq!(left, 0);
}

/// Keyless records, so they may go to any partition.
fn sample_batch(records: usize) -> Vec<u8> {
    let mut builder = braid_proto::BatchBuilder::new(1_000);
    for i in 0..records {
        builder.push(
            None,
            Some(format!("v{i}").as_bytes()),
            &[],
            1_000 + i as i64,
        );
    }
    builder.finish()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fetch_long_polls_until_data_commits() {
    let node = TestNode::start(FsyncSetting::Always);
    let client = Client::connect(node.addr()).await.unwrap();
    common::create_topic(&client, "s", "t", 1).await;
    let waiting = {
        let client = client.clone();
        tokio::spawn(async move {
            let started = Instant::now();
            let fetched = client.fetch("s", "t", 0, 0, 1 << 20, 5_000).await.unwrap();
            (started.elapsed(), fetched)
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    client.produce("s", "t", 0, &sample_batch(2)).await.unwrap();
    let (waited, fetched) = waiting.await.unwrap();
    assert!(
        waited >= Duration::from_millis(150),
        "it waited for the produce: {waited:?}"
    );
    assert!(
        waited < Duration::from_secs(4),
        "it did not wait for the timeout: {waited:?}"
    );
    assert_eq!(fetched.high_watermark, 2);
    assert!(!fetched.batches.is_empty());
    // At the end with nothing coming, the wait ends empty.
    let empty = client.fetch("s", "t", 0, 2, 1 << 20, 100).await.unwrap();
    assert!(empty.batches.is_empty());
    assert_eq!(
        client
            .fetch("s", "t", 0, 99, 1 << 20, 0)
            .await
            .unwrap_err()
            .code(),
        Some(ErrorCode::OffsetOutOfRange)
    );
}

/// A node that does not replicate is a cluster of one: it names itself the only member,
/// at the address it listens on, and the primary of every partition.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_info_of_a_single_node_names_it_the_primary_of_everything() {
    let node = common::TestNode::start(braid_node::FsyncSetting::Never);
    let client = braid_client::Client::connect(node.addr()).await.unwrap();
    common::create_topic(&client, "s", "t", 3).await;
    common::create_topic(&client, "r", "u", 1).await;
    let info = client.cluster_info().await.unwrap();
    assert!(info.cluster_id.starts_with("local-"), "{}", info.cluster_id);
    assert_eq!(info.node_id, 0);
    assert_eq!(info.members.len(), 1);
    assert_eq!(info.members[0].client_addr, node.addr().to_string());
    let topics: Vec<(&str, &str, usize)> = info
        .topics
        .iter()
        .map(|t| (t.stream.as_str(), t.topic.as_str(), t.partitions.len()))
        .collect();
    assert_eq!(topics, [("r", "u", 1), ("s", "t", 3)]);
    assert!(info
        .topics
        .iter()
        .all(|t| t.partitions.iter().all(|p| p.primary == Some(0))));
    // The same cluster id on every answer: it is the data directory's.
    assert_eq!(
        client.cluster_info().await.unwrap().cluster_id,
        info.cluster_id
    );
}

/// Issue 26: a member belongs to its client session. Ending the session (its client
/// closed it, or it timed out) takes the member out of its group at once, and a join
/// with a session that is not open is refused. The SDK's consumer registers one for
/// its membership and ends it on close.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_leaves_its_group_when_its_client_session_ends() {
    use braid_proto::client::{Request, Response};
    let node = TestNode::start(FsyncSetting::Never);
    let client = Client::connect(node.addr()).await.unwrap();
    client.create_stream("shop").await.unwrap();
    let settings = TopicSettings {
        partitions: 2,
        ..TopicSettings::default()
    };
    client
        .create_topic("shop", "orders", settings)
        .await
        .unwrap();
    let members = || async {
        match client
            .call(&Request::DescribeGroup {
                stream: "shop",
                group: "g",
            })
            .await
        {
            Ok(Response::Group(group)) => group.members.iter().map(|m| m.name.clone()).collect(),
            Err(err) if err.code() == Some(ErrorCode::GroupNotFound) => Vec::new(),
            other => panic!("not a group: {other:?}"),
        }
    };
    let session = client
        .register_session(Duration::from_secs(30))
        .await
        .unwrap();
    let join = |member_name, session| Request::JoinGroup {
        stream: "shop",
        group: "g",
        topic: "orders",
        member_name,
        session_timeout_ms: 30_000,
        session,
    };
    client.call(&join("raw", session)).await.unwrap();
    let consumer = Consumer::join_group(&client, "shop", "orders", "g", "sdk", fast_group_config())
        .await
        .unwrap();
    assert_eq!(members().await, ["raw", "sdk"]);
    client.end_session(session).await.unwrap();
    assert_eq!(members().await, ["sdk"], "the ended session's member left");
    let refused = client.call(&join("late", session)).await.unwrap_err();
    assert_eq!(
        refused.code(),
        Some(ErrorCode::SessionNotFound),
        "{refused}"
    );
    consumer.close().await.unwrap();
    assert!(members().await.is_empty());
}
