//! `braid cluster local 3` as a real process tree: three `braid server` children on
//! loopback; the SDK produces through them, the member leading the partition is
//! killed with SIGKILL, produces go on at the new primary, every acknowledged record
//! is read back in order, and Ctrl-C (SIGINT) stops the rest. `braid cluster status`
//! shows every bundle up before the kill, and the killed member unreachable with the
//! bundles to it down after.

// A panic in a test is a failed assertion, not a crash on outside data.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use braid_client::{Client, Producer, ProducerConfig};
use braid_proto::client::TopicSettings;

mod support;
use support::{free_base, signal};

const BRAID: &str = env!("CARGO_BIN_EXE_braid");

/// Runs `braid cluster status` against every member until its output satisfies
/// `done` (or fails after 30 s).
fn status_until(seeds: &[&str], what: &str, done: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let mut command = Command::new(BRAID);
        for seed in seeds {
            command.args(["--addr", seed]);
        }
        let output = command.args(["cluster", "status"]).output().unwrap();
        let text = String::from_utf8_lossy(&output.stdout).into_owned();
        if output.status.success() && done(&text) {
            return text;
        }
        assert!(Instant::now() < deadline, "{what}:\n{text}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The bundle rows (`FROM -> TO  STATE ...`) of a `braid cluster status` output.
fn bundle_rows(text: &str) -> Vec<(u8, u8, String)> {
    text.lines()
        .filter_map(|line| {
            let mut words = line.split_whitespace();
            let from = words.next()?.parse().ok()?;
            (words.next()? == "->").then_some(())?;
            let to = words.next()?.parse().ok()?;
            Some((from, to, words.next()?.to_owned()))
        })
        .collect()
}

/// The pid of `braid server --node-id ID`, a child of `parent`.
fn node_pid(parent: u32, id: u8) -> Option<u32> {
    let children =
        std::fs::read_to_string(format!("/proc/{parent}/task/{parent}/children")).ok()?;
    children
        .split_whitespace()
        .filter_map(|pid| pid.parse::<u32>().ok())
        .find(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|raw| {
                let args: Vec<String> = raw
                    .split(|b| *b == 0)
                    .map(|a| String::from_utf8_lossy(a).into_owned())
                    .collect();
                args.windows(2)
                    .any(|w| w[0] == "--node-id" && w[1] == id.to_string())
            })
        })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_local_cluster_rides_through_a_kill_of_the_primary() {
    let dir = tempfile::tempdir().unwrap();
    let base = free_base();
    let mut cluster: Child = Command::new(BRAID)
        .args(["cluster", "local", "3", "--base-port"])
        .arg(base.to_string())
        .arg("--data-dir")
        .arg(dir.path())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let seeds: Vec<String> = (0..3).map(|i| format!("127.0.0.1:{}", base + i)).collect();
    let seeds: Vec<&str> = seeds.iter().map(String::as_str).collect();
    let options = braid_client::ConnectOptions::default();
    let deadline = Instant::now() + Duration::from_secs(60);
    let client = loop {
        if let Ok(client) = Client::connect_cluster(&seeds, &options).await {
            if client.create_stream("s").await.is_ok() {
                break client;
            }
        }
        assert!(
            Instant::now() < deadline,
            "the local cluster never answered"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let settings = TopicSettings {
        partitions: 1,
        ..TopicSettings::default()
    };
    client.create_topic("s", "t", settings).await.unwrap();
    let config = ProducerConfig {
        linger: Duration::from_millis(1),
        ..ProducerConfig::default()
    };
    let producer = Producer::new(&client, "s", "t", config).await.unwrap();
    let mut acked = Vec::new();
    for n in 0..100u32 {
        let stored = producer
            .send(None, format!("{n}").as_bytes())
            .await
            .unwrap();
        acked.push((stored.offset, n));
    }
    let all_up = status_until(&seeds, "every bundle up", |text| {
        let rows = bundle_rows(text);
        rows.len() == 6 && rows.iter().all(|(_, _, state)| state == "up")
    });
    assert_eq!(all_up.matches("caught up").count(), 3, "{all_up}");
    // SIGKILL the member leading the partition.
    client.refresh().await.unwrap();
    let info = client.cluster_info().await.unwrap();
    let primary = info
        .topics
        .iter()
        .find(|t| t.topic == "t")
        .and_then(|t| t.partitions.first())
        .and_then(|p| p.primary)
        .unwrap();
    let pid = node_pid(cluster.id(), primary).expect("the primary's process");
    signal(pid, "KILL");
    let killed = Instant::now();
    let stored = producer.send(None, b"100").await.unwrap();
    println!(
        "first produce acknowledged {:?} after SIGKILL of the primary (member {primary})",
        killed.elapsed()
    );
    acked.push((stored.offset, 100));
    for n in 101..200u32 {
        let stored = producer
            .send(None, format!("{n}").as_bytes())
            .await
            .unwrap();
        acked.push((stored.offset, n));
    }
    let shown = status_until(&seeds, "the killed member shown down", |text| {
        let rows = bundle_rows(text);
        rows.len() == 4
            && rows
                .iter()
                .all(|(_, to, state)| (state == "down") == (*to == primary))
    });
    assert!(
        shown.contains(&format!("member {primary} (")) && shown.contains("unreachable"),
        "{shown}"
    );
    // Every acknowledged record, at the offset it was acknowledged with.
    let mut read = Vec::new();
    let mut offset = 0;
    while read.len() < acked.len() {
        let fetched = client
            .fetch("s", "t", 0, offset, 1 << 20, 1_000)
            .await
            .unwrap();
        let mut records = std::collections::VecDeque::new();
        braid_client::decode_records(0, offset, &fetched.batches, &mut records).unwrap();
        for record in records {
            offset = record.offset + 1;
            read.push((record.offset, record.value.unwrap()));
        }
        assert!(
            fetched.high_watermark >= offset,
            "reads stop at the high watermark"
        );
    }
    for (offset, n) in &acked {
        let value = read
            .iter()
            .find(|(o, _)| o == offset)
            .map(|(_, v)| v.clone())
            .unwrap_or_else(|| panic!("acknowledged offset {offset} missing"));
        assert_eq!(value, n.to_string().into_bytes(), "offset {offset}");
    }
    // Ctrl-C stops the cluster, children included.
    signal(cluster.id(), "INT");
    let stopped = cluster.wait().unwrap();
    assert!(stopped.success(), "cluster local exited with {stopped}");
    for id in 0..3 {
        assert!(node_pid(cluster.id(), id).is_none());
    }
}
