//! A client used as an attacker: what one connection may hold, and what the others
//! keep. A real node in-process on port 0.

// A panic in a test is a failed assertion, not a crash on outside data.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::{Duration, Instant};

use braid_client::Client;
use braid_node::FsyncSetting;
use braid_proto::client::Request;
use common::TestNode;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

/// Resident memory of this process (the node runs in it), from `/proc`.
fn resident_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace()
        .nth(1)
        .unwrap()
        .parse::<u64>()
        .unwrap()
        * 1024
}

fn batch(records: usize, value_bytes: usize) -> Vec<u8> {
    let mut builder = braid_proto::BatchBuilder::new(1_000);
    let value = vec![7u8; value_bytes];
    for _ in 0..records {
        builder.push(None, Some(&value), &[], 1_000);
    }
    builder.finish()
}

/// The p99 of `count` produce round trips of one small batch, one at a time.
async fn produce_p99(client: &Client, count: usize) -> Duration {
    let small = batch(1, 100);
    let mut latencies = Vec::with_capacity(count);
    for _ in 0..count {
        let start = Instant::now();
        client.produce("s", "other", 0, &small).await.unwrap();
        latencies.push(start.elapsed());
    }
    latencies.sort();
    latencies[count * 99 / 100]
}

/// The review's attack: 200 fetches of 8 MiB sent in one write, answers never read,
/// took the node from 7 MB to 1.55 GB. A connection now holds a bounded number of
/// requests and bytes in flight and stops being read beyond them, so the node stays far
/// under 200 MB more, and another client's produce latency stays where it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unread_fetches_hold_bounded_memory_and_others_keep_their_latency() {
    let node = TestNode::start(FsyncSetting::Never);
    let client = Client::connect(node.addr()).await.unwrap();
    common::create_topic(&client, "s", "t", 1).await;
    let settings = braid_proto::client::TopicSettings {
        partitions: 1,
        ..Default::default()
    };
    client.create_topic("s", "other", settings).await.unwrap();
    // 8 MiB of records, so every fetch of 8 MiB is answered with 8 MiB.
    for _ in 0..16 {
        client
            .produce("s", "t", 0, &batch(500, 1000))
            .await
            .unwrap();
    }
    let quiet = produce_p99(&client, 200).await;
    let before = resident_bytes();
    let mut attack = Vec::new();
    for id in 1..=200u64 {
        Request::Fetch {
            stream: "s",
            topic: "t",
            partition: 0,
            offset: 0,
            max_bytes: 8 << 20,
            max_wait_ms: 0,
        }
        .encode(id, &mut attack);
    }
    let mut attacker = TcpStream::connect(node.addr()).await.unwrap();
    attacker.write_all(&attack).await.unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let attacked = produce_p99(&client, 200).await;
    let grown = resident_bytes().saturating_sub(before);
    eprintln!(
        "resident memory grew by {} MiB; another client's produce p99 {quiet:?} quiet, {attacked:?} under attack",
        grown >> 20
    );
    assert!(grown < 200 << 20, "the node grew by {grown} bytes");
    assert!(
        attacked < quiet * 10 + Duration::from_millis(50),
        "p99 {attacked:?} under attack against {quiet:?}"
    );
    drop(attacker);
}

/// A client that reads no answers holds its budget shares only until its answers make
/// no progress for `connection_write_timeout_ms`: then it is closed and the shares go
/// back. Here one connection's share is the node's whole fetch budget, so another
/// client's fetch waits for exactly that close.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_reads_nothing_is_closed_and_releases_its_budget() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = common::config(dir.path(), FsyncSetting::Never);
    config.connection_write_timeout_ms = 300;
    config.connection_fetch_bytes_max = 8 << 20;
    config.fetch_bytes_max = 8 << 20;
    let node = braid_node::Node::start(config).unwrap();
    let client = Client::connect(node.client_addr()).await.unwrap();
    common::create_topic(&client, "s", "t", 1).await;
    for _ in 0..16 {
        client
            .produce("s", "t", 0, &batch(500, 1000))
            .await
            .unwrap();
    }
    let mut attack = Vec::new();
    for id in 1..=50u64 {
        Request::Fetch {
            stream: "s",
            topic: "t",
            partition: 0,
            offset: 0,
            max_bytes: 8 << 20,
            max_wait_ms: 0,
        }
        .encode(id, &mut attack);
    }
    let mut attacker = TcpStream::connect(node.client_addr()).await.unwrap();
    attacker.write_all(&attack).await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let start = Instant::now();
    let fetched = tokio::time::timeout(
        Duration::from_secs(10),
        client.fetch("s", "t", 0, 0, 1 << 20, 0),
    )
    .await
    .expect("the budget came back")
    .unwrap();
    assert!(!fetched.batches.is_empty());
    eprintln!(
        "another client's fetch waited {:?} for the stalled one's close",
        start.elapsed()
    );
    // The attacker was closed: reading now drains what was sent, then ends.
    let mut sink = vec![0u8; 1 << 20];
    let closed = tokio::time::timeout(Duration::from_secs(10), async {
        use tokio::io::AsyncReadExt;
        loop {
            match attacker.read(&mut sink).await {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
        }
    })
    .await;
    assert!(closed.is_ok(), "the stalled connection was closed");
    node.shutdown();
}
