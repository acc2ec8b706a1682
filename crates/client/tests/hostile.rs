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

/// The tests here measure this process's memory and CPU: one at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

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
    let _serial = SERIAL.lock().await;
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
    let _serial = SERIAL.lock().await;
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

/// CPU time of this process (user + system), from `/proc`.
fn cpu_time() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
    let fields: Vec<&str> = stat
        .rsplit(')')
        .next()
        .unwrap()
        .split_whitespace()
        .collect();
    // utime and stime are fields 14 and 15 of the whole line: 12 and 13 after the name.
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    Duration::from_millis(ticks * 10)
}

/// `braid_connections_active` from the node's `/metrics`.
async fn active_connections(http: std::net::SocketAddr) -> u64 {
    use tokio::io::AsyncReadExt;
    let mut stream = TcpStream::connect(http).await.unwrap();
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut text = String::new();
    stream.read_to_string(&mut text).await.unwrap();
    text.lines()
        .find(|l| l.starts_with("braid_connections_active "))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap()
}

/// A client that went away while its fetch waited kept its connection open until the
/// wait timed out (up to 60 s). The close is noticed at once now.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_gone_during_a_waiting_fetch_is_noticed_at_once() {
    let _serial = SERIAL.lock().await;
    let node = TestNode::start(FsyncSetting::Never);
    let client = Client::connect(node.addr()).await.unwrap();
    common::create_topic(&client, "s", "t", 1).await;
    let mut waiting = Vec::new();
    Request::Fetch {
        stream: "s",
        topic: "t",
        partition: 0,
        offset: 0,
        max_bytes: 1 << 20,
        max_wait_ms: 60_000,
    }
    .encode(1, &mut waiting);
    let mut gone = TcpStream::connect(node.addr()).await.unwrap();
    gone.write_all(&waiting).await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(active_connections(node.http_addr()).await, 2);
    drop(gone);
    let start = Instant::now();
    while active_connections(node.http_addr()).await > 1 {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "the gone client's connection is still open"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    eprintln!(
        "a gone client's connection closed {:?} after it left",
        start.elapsed()
    );
}

/// 40,000 waiting fetches on one partition cost 5.3 s of CPU (each registration walked
/// every waiter) and delayed a produce on it by seconds. With 100,000 waiting (limits
/// raised for the test), registration is O(1) and a produce's p99 stays put.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_thousand_waiting_fetches_leave_a_produce_p99_unchanged() {
    let _serial = SERIAL.lock().await;
    const WAITERS: u64 = 100_000;
    let dir = tempfile::tempdir().unwrap();
    let mut config = common::config(dir.path(), FsyncSetting::Never);
    config.connection_requests_max = 200_000;
    config.connection_waiting_fetches_max = 200_000;
    config.connection_fetch_bytes_max = 1 << 30;
    config.fetch_bytes_max = 1 << 30;
    let node = braid_node::Node::start(config).unwrap();
    let client = Client::connect(node.client_addr()).await.unwrap();
    common::create_topic(&client, "s", "other", 1).await;
    let quiet = produce_p99(&client, 200).await;
    let end = client
        .list_offset("s", "other", 0, braid_proto::client::OffsetSpec::Latest)
        .await
        .unwrap()
        .unwrap();
    let mut requests = Vec::new();
    for id in 1..=WAITERS {
        Request::Fetch {
            stream: "s",
            topic: "other",
            partition: 0,
            offset: end,
            max_bytes: 1,
            max_wait_ms: 30_000,
        }
        .encode(id, &mut requests);
    }
    let cpu_before = cpu_time();
    let mut waiters = TcpStream::connect(node.client_addr()).await.unwrap();
    waiters.write_all(&requests).await.unwrap();
    // Let the node take them all (each is answered only at the next commit).
    tokio::time::sleep(Duration::from_secs(3)).await;
    let registering = cpu_time().saturating_sub(cpu_before);
    let attacked = produce_p99(&client, 200).await;
    eprintln!(
        "{WAITERS} waiting fetches registered with {registering:?} of CPU (the test's writes included); \
         produce p99 {quiet:?} without them, {attacked:?} with them"
    );
    assert!(
        attacked < quiet * 10 + Duration::from_millis(50),
        "p99 {attacked:?} with waiters against {quiet:?}"
    );
    drop(waiters);
    node.shutdown();
}

/// A connection parks at most `connection_waiting_fetches_max` fetches; the rest are
/// answered at once (empty at the end of the log), not refused and not parked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fetches_beyond_the_waiting_limit_are_answered_at_once() {
    use braid_proto::client::{frame_length, split_response, RESPONSE_HEADER_BYTES};
    use tokio::io::AsyncReadExt;
    let _serial = SERIAL.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let mut config = common::config(dir.path(), FsyncSetting::Never);
    config.connection_waiting_fetches_max = 2;
    let node = braid_node::Node::start(config).unwrap();
    let client = Client::connect(node.client_addr()).await.unwrap();
    common::create_topic(&client, "s", "t", 1).await;
    let mut requests = Vec::new();
    for id in 1..=5u64 {
        Request::Fetch {
            stream: "s",
            topic: "t",
            partition: 0,
            offset: 0,
            max_bytes: 1024,
            max_wait_ms: 30_000,
        }
        .encode(id, &mut requests);
    }
    let mut raw = TcpStream::connect(node.client_addr()).await.unwrap();
    raw.write_all(&requests).await.unwrap();
    let mut buf = Vec::new();
    let mut answered = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(2);
    while Instant::now() < deadline && answered.len() < 4 {
        while let Ok(Some(total)) = frame_length(&buf, RESPONSE_HEADER_BYTES, 1 << 20) {
            let frame: Vec<u8> = buf.drain(..total).collect();
            let (header, _) = split_response(&frame).unwrap();
            assert_eq!(header.status, 0, "answered, not refused");
            answered.push(header.request_id);
        }
        let mut chunk = [0u8; 4096];
        if let Ok(Ok(n)) =
            tokio::time::timeout(Duration::from_millis(100), raw.read(&mut chunk)).await
        {
            buf.extend_from_slice(&chunk[..n]);
        }
    }
    assert_eq!(
        answered,
        vec![3, 4, 5],
        "the two first wait, the three after do not"
    );
    node.shutdown();
}

/// `JoinGroup` accepted names the doc forbids (`../../etc`, spaces, newlines): the group
/// could be joined but never committed to. Every name is checked at decode now, and a
/// bad one, of any length or character, is `InvalidArgument`; nothing is created.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_names_are_refused_at_decode_with_one_code() {
    use braid_proto::client::{
        error_code, frame_length, split_response, ErrorCode, RESPONSE_HEADER_BYTES,
    };
    use tokio::io::AsyncReadExt;
    let _serial = SERIAL.lock().await;
    let node = TestNode::start(FsyncSetting::Never);
    let client = Client::connect(node.addr()).await.unwrap();
    common::create_topic(&client, "s", "t", 1).await;
    let long = "g".repeat(250);
    let names = ["../../etc", "a b", "new\nline", "", long.as_str()];
    let mut requests = Vec::new();
    for (i, group) in names.iter().enumerate() {
        Request::JoinGroup {
            stream: "s",
            group,
            topic: "t",
            member_name: "m",
            session_timeout_ms: 10_000,
        }
        .encode(i as u64 + 1, &mut requests);
    }
    let mut raw = TcpStream::connect(node.addr()).await.unwrap();
    raw.write_all(&requests).await.unwrap();
    let mut buf = Vec::new();
    let mut codes = Vec::new();
    loop {
        while let Ok(Some(total)) = frame_length(&buf, RESPONSE_HEADER_BYTES, 1 << 20) {
            let frame: Vec<u8> = buf.drain(..total).collect();
            let (header, _) = split_response(&frame).unwrap();
            codes.push(error_code(header.status));
        }
        if codes.len() == names.len() {
            break;
        }
        let mut chunk = [0u8; 4096];
        let n = tokio::time::timeout(Duration::from_secs(5), raw.read(&mut chunk))
            .await
            .unwrap()
            .unwrap();
        assert_ne!(n, 0, "the connection goes on after a bad name");
        buf.extend_from_slice(&chunk[..n]);
    }
    assert!(
        codes.iter().all(|c| *c == ErrorCode::InvalidArgument),
        "{codes:?}"
    );
    assert!(client.list_groups("s").await.unwrap().is_empty());
}
