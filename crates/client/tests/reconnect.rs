//! A producer rides through a restart of its node: it reconnects, sends again what was
//! not answered, and every acknowledged record is there afterwards, once, each key's
//! records in order (its session answers a resent batch that was stored).

// A panic in a test is a failed assertion, not a crash on outside data.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use braid_client::{Client, Consumer, ConsumerConfig, Producer, ProducerConfig, StartFrom};
use braid_node::{FsyncSetting, Node};

/// A node (fsync always) in `dir` with topic `s/t` of 4 partitions, and a client.
async fn node_with_topic(dir: &std::path::Path) -> (braid_node::NodeConfig, Node, Client) {
    let config = common::config(dir, FsyncSetting::Always);
    let node = Node::start(config.clone()).unwrap();
    let client = Client::connect(node.client_addr()).await.unwrap();
    common::create_topic(&client, "s", "t", 4).await;
    (config, node, client)
}

/// Stops `node` gracefully and starts it again on the same address and directory.
async fn restart(node: Node, config: &braid_node::NodeConfig) -> Node {
    let addr = node.client_addr();
    node.shutdown();
    tokio::time::sleep(Duration::from_millis(200)).await;
    Node::start(braid_node::NodeConfig {
        client_addr: addr,
        ..config.clone()
    })
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_producer_rides_through_a_restart_of_its_node() {
    let dir = tempfile::tempdir().unwrap();
    let (config, node, client) = node_with_topic(dir.path()).await;
    let addr = node.client_addr();
    let producer = Producer::new(
        &client,
        "s",
        "t",
        ProducerConfig {
            linger: Duration::from_millis(1),
            ..ProducerConfig::default()
        },
    )
    .await
    .unwrap();

    // Keys k0..k15, values counting up per key. Halfway the sender tells the test and
    // waits until the restart has begun, then sends on while the node goes and comes
    // back: whatever the machine's speed, records are in flight across the restart.
    let halfway = Arc::new(tokio::sync::Notify::new());
    let restarting = Arc::new(AtomicBool::new(false));
    let sender = {
        let producer = producer.clone();
        let (halfway, restarting) = (Arc::clone(&halfway), Arc::clone(&restarting));
        tokio::spawn(async move {
            let mut acked = Vec::new();
            let mut pending = Vec::new();
            for i in 0..20_000u32 {
                let key = format!("k{}", i % 16);
                let value = format!("{}:{}", key, i / 16);
                pending.push((
                    value.clone(),
                    producer.send(Some(key.as_bytes()), value.as_bytes()),
                ));
                if pending.len() == 200 {
                    for (value, answer) in pending.drain(..) {
                        answer
                            .await
                            .expect("a record acknowledged after the restart");
                        acked.push(value);
                    }
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
                if i == 10_000 {
                    halfway.notify_one();
                    while !restarting.load(Ordering::Acquire) {
                        tokio::time::sleep(Duration::from_millis(1)).await;
                    }
                }
            }
            producer.flush();
            for (value, answer) in pending {
                answer
                    .await
                    .expect("a record acknowledged after the restart");
                acked.push(value);
            }
            acked
        })
    };
    halfway.notified().await;
    // A restart on the same address, while records are in flight.
    restarting.store(true, Ordering::Release);
    let node = restart(node, &config).await;
    let acked = tokio::time::timeout(Duration::from_secs(60), sender)
        .await
        .expect("the producer resumed")
        .unwrap();
    assert_eq!(acked.len(), 20_000);
    assert!(
        producer.retried_batches() > 0,
        "the restart never made the producer resend (the test tested nothing)"
    );

    // Read everything back: every acknowledged value is there, once, each key's
    // values in order.
    let reader = Client::connect(addr).await.unwrap();
    let mut consumer = Consumer::assigned(
        &reader,
        "s",
        "t",
        &[0, 1, 2, 3],
        ConsumerConfig {
            start_from: StartFrom::Earliest,
            ..ConsumerConfig::default()
        },
    )
    .await
    .unwrap();
    let mut seen = HashSet::new();
    let mut duplicates = 0usize;
    let mut last_per_key: BTreeMap<String, u32> = BTreeMap::new();
    while seen.len() < acked.len() {
        let records = consumer.poll(Duration::from_secs(2)).await.unwrap();
        assert!(
            !records.is_empty(),
            "{} of {} read back",
            seen.len(),
            acked.len()
        );
        for record in records {
            let value = String::from_utf8(record.value.unwrap()).unwrap();
            if !seen.insert(value.clone()) {
                duplicates += 1;
                continue;
            }
            let (key, n) = value.split_once(':').unwrap();
            let n: u32 = n.parse().unwrap();
            if let Some(last) = last_per_key.insert(key.to_owned(), n) {
                assert!(n > last, "{key}: {n} after {last}");
            }
        }
    }
    for value in &acked {
        assert!(seen.contains(value), "acknowledged {value} is missing");
    }
    assert_eq!(duplicates, 0, "records stored twice");
    eprintln!(
        "resent {} batches; {duplicates} records stored twice",
        producer.retried_batches()
    );
    node.shutdown();
}

/// A group consumer rides through a restart of its node: its polls return nothing
/// while the node is away, it reconnects, joins again (the node forgot the group's
/// members) and reads on from the committed offsets: every record is read, each key's
/// records in order (those after the last commit are read again, at least once).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_consumer_rides_through_a_restart_of_its_node() {
    let dir = tempfile::tempdir().unwrap();
    let (config, node, client) = node_with_topic(dir.path()).await;
    let addr = node.client_addr();
    // Small batches, so the consumer needs many fetches and the restart falls among them.
    let small = ProducerConfig {
        batch_bytes: 1024,
        ..ProducerConfig::default()
    };
    let producer = Producer::new(&client, "s", "t", small).await.unwrap();
    let total = 5_000u32;
    let mut answers = Vec::new();
    for i in 0..total {
        let key = format!("k{}", i % 8);
        answers.push(producer.send(Some(key.as_bytes()), format!("{key}:{}", i / 8).as_bytes()));
    }
    producer.flush();
    for answer in answers {
        answer.await.unwrap();
    }
    let reader = Client::connect(addr).await.unwrap();
    let mut consumer = Consumer::join_group(
        &reader,
        "s",
        "t",
        "g",
        "member-1",
        ConsumerConfig {
            auto_commit: Some(Duration::from_millis(100)),
            fetch_bytes_max: 4096,
            heartbeat_interval: Duration::from_millis(100),
            ..ConsumerConfig::default()
        },
    )
    .await
    .unwrap();
    let mut seen = HashSet::new();
    let mut again = 0usize;
    let mut last_per_key: BTreeMap<String, u32> = BTreeMap::new();
    let mut restarted = None;
    let mut node = Some(node);
    let started = std::time::Instant::now();
    while seen.len() < total as usize {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "{} of {total} read",
            seen.len()
        );
        if restarted.is_none() && !seen.is_empty() {
            restarted = Some(restart(node.take().unwrap(), &config).await);
        }
        let records = consumer
            .poll(Duration::from_millis(500))
            .await
            .expect("a poll rides through the restart");
        for record in records {
            let value = String::from_utf8(record.value.unwrap()).unwrap();
            let (key, n) = value.split_once(':').unwrap();
            let n: u32 = n.parse().unwrap();
            if !seen.insert(value.clone()) {
                again += 1;
                continue;
            }
            if let Some(last) = last_per_key.insert(key.to_owned(), n) {
                assert!(n > last, "{key}: {n} after {last}");
            }
        }
    }
    assert!(restarted.is_some(), "the node never restarted");
    eprintln!("{again} records read again after the restart");
    drop(consumer);
    restarted.unwrap().shutdown();
}
