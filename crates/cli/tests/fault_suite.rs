//! The long real-process fault runs (ignored in CI; `scripts/fault-suite.sh` runs them):
//! three `braid server` processes on loopback under four SDK producers, then
//! (a) 20 SIGKILLs of the partition's primary, each restarted, with the time from the
//! kill to the first acknowledgement of a record sent after it (p50 and max);
//! (b) rolling restarts (stop, start, wait for `/ready`) of all three under
//! `fsync = never`, once with SIGTERM and once with SIGKILL;
//! (c) SIGKILL of all three at once under `fsync = always`, then a restart.
//! After each: every acknowledged record is read back at its offset, records stored
//! twice are counted, and each group's commit point (op and checksum) is the same on
//! every member.

// A panic in a test is a failed assertion, not a crash on outside data.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use braid_client::{Client, ConnectOptions, Producer, ProducerConfig};
use braid_proto::client::TopicSettings;

mod support;
use support::{free_base, http_get, signal};

const BRAID: &str = env!("CARGO_BIN_EXE_braid");
const NODES: u8 = 3;
const PRODUCERS: usize = 4;

/// Three `braid server` children on one directory tree.
struct Cluster {
    root: tempfile::TempDir,
    base: u16,
    fsync: &'static str,
    children: Vec<Option<Child>>,
}

impl Cluster {
    fn start(fsync: &'static str) -> Self {
        let root = tempfile::tempdir().unwrap();
        std::fs::write(
            root.path().join("secret"),
            "a fault-suite secret of enough bytes",
        )
        .unwrap();
        let mut cluster = Self {
            root,
            base: free_base(),
            fsync,
            children: (0..NODES).map(|_| None).collect(),
        };
        for id in 0..NODES {
            cluster.spawn(id);
        }
        cluster
    }

    fn client_addr(&self, id: u8) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.base + u16::from(id)))
    }

    fn http_addr(&self, id: u8) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.base + 10 + u16::from(id)))
    }

    fn seeds(&self) -> Vec<String> {
        (0..NODES)
            .map(|id| self.client_addr(id).to_string())
            .collect()
    }

    fn spawn(&mut self, id: u8) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.root.path().join(format!("node-{id}.log")))
            .unwrap();
        let mut command = Command::new(BRAID);
        command
            .arg("server")
            .arg("--data-dir")
            .arg(self.root.path().join(format!("node-{id}")))
            .arg("--client-addr")
            .arg(self.client_addr(id).to_string())
            .arg("--http-addr")
            .arg(self.http_addr(id).to_string())
            .args(["--cluster-id", "faults", "--node-id"])
            .arg(id.to_string())
            .arg("--cluster-secret-file")
            .arg(self.root.path().join("secret"))
            .args(["--fsync", self.fsync]);
        for member in 0..NODES {
            let replica = self.base + 20 + u16::from(member);
            let client = self.client_addr(member);
            command
                .arg("--member")
                .arg(format!("{member}=127.0.0.1:{replica}/{client}"));
        }
        let child = command
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        self.children[usize::from(id)] = Some(child);
    }

    /// Sends `sig` to member `id` and waits for it to exit.
    fn stop(&mut self, id: u8, sig: &str) {
        let mut child = self.children[usize::from(id)].take().expect("running");
        signal(child.id(), sig);
        child.wait().unwrap();
    }

    /// Waits until member `id` answers `/ready` with 200 (every group caught up).
    async fn until_ready(&self, id: u8, within: Duration) {
        let deadline = Instant::now() + within;
        loop {
            let answer = http_get(self.http_addr(id), "/ready").await;
            if let Some((200, _)) = answer {
                return;
            }
            if Instant::now() >= deadline {
                let log = std::fs::read_to_string(self.root.path().join(format!("node-{id}.log")))
                    .unwrap_or_default();
                let tail: Vec<&str> = log.lines().rev().take(30).collect();
                let rows = http_get(self.http_addr(id), "/replication").await;
                panic!(
                    "member {id} never caught up: {answer:?} {rows:?}\n{}",
                    tail.join("\n")
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits until every member reports each group at the same commit point, op and
    /// checksum; returns the number of groups compared.
    async fn until_logs_agree(&self, within: Duration) -> usize {
        let deadline = Instant::now() + within;
        loop {
            let mut points = Vec::new();
            for id in 0..NODES {
                let body = http_get(self.http_addr(id), "/replication").await;
                points.push(body.map(|(_, b)| commit_points(&b)).unwrap_or_default());
            }
            if !points[0].is_empty() && points.iter().all(|p| *p == points[0]) {
                return points[0].len();
            }
            assert!(
                Instant::now() < deadline,
                "commit points never agreed: {points:?}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for child in self.children.iter_mut().flatten() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The rows of a `/replication` body (none if it does not parse).
fn replication_rows(body: &str) -> Vec<serde_json::Value> {
    serde_json::from_str::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v.get("groups").and_then(|g| g.as_array()).cloned())
        .unwrap_or_default()
}

/// (group, commit_min, checksum) of every row of a `/replication` body.
fn commit_points(body: &str) -> Vec<(u64, u64, String)> {
    replication_rows(body)
        .iter()
        .map(|row| {
            (
                row["group"].as_u64().unwrap_or(u64::MAX),
                row["commit_min"].as_u64().unwrap_or(0),
                row["commit_checksum"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect()
}

/// A send: when it started, when it was acknowledged, and where it was stored.
#[derive(Debug, Clone)]
struct Acked {
    sent: Instant,
    acked: Instant,
    offset: u64,
    value: String,
}

/// Four producers writing keyed records until told to stop.
struct Load {
    stop: Arc<AtomicBool>,
    acked: Arc<Mutex<Vec<Acked>>>,
    failed: Arc<Mutex<u64>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Load {
    async fn start(client: &Client) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let acked = Arc::new(Mutex::new(Vec::new()));
        let failed = Arc::new(Mutex::new(0));
        let mut tasks = Vec::new();
        for p in 0..PRODUCERS {
            let config = ProducerConfig {
                linger: Duration::from_millis(1),
                ..ProducerConfig::default()
            };
            let producer = Producer::new(client, "s", "t", config).await.unwrap();
            let (stop, acked, failed) = (stop.clone(), acked.clone(), failed.clone());
            tasks.push(tokio::spawn(async move {
                let mut seq = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let value = format!("{p}-{seq}");
                    let sent = Instant::now();
                    match producer.send(Some(&[p as u8]), value.as_bytes()).await {
                        Ok(stored) => acked.lock().unwrap().push(Acked {
                            sent,
                            acked: Instant::now(),
                            offset: stored.offset,
                            value,
                        }),
                        Err(_) => *failed.lock().unwrap() += 1,
                    }
                    seq += 1;
                }
            }));
        }
        Self {
            stop,
            acked,
            failed,
            tasks,
        }
    }

    fn acked(&self) -> usize {
        self.acked.lock().unwrap().len()
    }

    /// The first acknowledgement of a record sent after `since`, waited for.
    async fn first_ack_after(&self, since: Instant, within: Duration) -> Duration {
        let deadline = since + within;
        loop {
            let first = self
                .acked
                .lock()
                .unwrap()
                .iter()
                .filter(|a| a.sent > since)
                .map(|a| a.acked)
                .min();
            if let Some(at) = first {
                return at - since;
            }
            assert!(
                Instant::now() < deadline,
                "no produce acknowledged after the fault"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    async fn finish(self) -> (Vec<Acked>, u64) {
        self.stop.store(true, Ordering::Relaxed);
        for task in self.tasks {
            let _ = tokio::time::timeout(Duration::from_secs(30), task).await;
        }
        let acked = self.acked.lock().unwrap().clone();
        let failed = *self.failed.lock().unwrap();
        (acked, failed)
    }
}

async fn connect(cluster: &Cluster) -> Client {
    let seeds = cluster.seeds();
    let seeds: Vec<&str> = seeds.iter().map(String::as_str).collect();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok(client) = Client::connect_cluster(&seeds, &ConnectOptions::default()).await {
            if client.cluster_info().await.is_ok() {
                return client;
            }
        }
        assert!(Instant::now() < deadline, "the cluster never answered");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn create_topic(client: &Client) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while client.create_stream("s").await.is_err() {
        assert!(Instant::now() < deadline, "the stream was never created");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let settings = TopicSettings {
        partitions: 1,
        ..TopicSettings::default()
    };
    client.create_topic("s", "t", settings).await.unwrap();
}

/// The member leading the partition now, as the members themselves say: the primary
/// of the newest view any member is normal in (a client's map may lag a failover).
async fn partition_primary(cluster: &Cluster) -> u8 {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let mut newest: Option<(u64, u8)> = None;
        for id in 0..NODES {
            let Some((_, body)) = http_get(cluster.http_addr(id), "/replication").await else {
                continue;
            };
            for row in replication_rows(&body) {
                // Group 0 is the metadata; the topic's one partition is the other.
                let partition = row["group"].as_u64().is_some_and(|g| g != 0);
                let normal = row["status"] == "normal";
                if let (true, true, Some(view), Some(primary)) = (
                    partition,
                    normal,
                    row["view"].as_u64(),
                    row["primary"].as_u64(),
                ) {
                    if newest.is_none_or(|(v, _)| view > v) {
                        newest = Some((view, primary as u8));
                    }
                }
            }
        }
        if let Some((_, primary)) = newest {
            return primary;
        }
        assert!(Instant::now() < deadline, "no member leads the partition");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Reads the partition whole; asserts every acknowledged record is at its offset and
/// each producer's records are stored in the order it sent them; returns (records
/// stored, values stored twice).
async fn check_everything_acknowledged_is_there(
    client: &Client,
    acked: &[Acked],
) -> (usize, usize) {
    let mut stored: HashMap<u64, String> = HashMap::new();
    let mut offset = 0;
    let mut order = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let fetched = match client.fetch("s", "t", 0, offset, 4 << 20, 500).await {
            Ok(f) => f,
            Err(_) => {
                assert!(Instant::now() < deadline, "the partition could not be read");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let mut records = std::collections::VecDeque::new();
        braid_client::decode_records(0, offset, &fetched.batches, &mut records).unwrap();
        if records.is_empty() && offset >= fetched.high_watermark {
            break;
        }
        for record in records {
            offset = record.offset + 1;
            let value = String::from_utf8(record.value.unwrap().to_vec()).unwrap();
            order.push(value.clone());
            stored.insert(record.offset, value);
        }
    }
    for a in acked {
        assert_eq!(
            stored.get(&a.offset),
            Some(&a.value),
            "acknowledged {} at offset {} is not there",
            a.value,
            a.offset
        );
    }
    // Per producer, the first copy of each value comes in send order.
    let mut seen = std::collections::HashSet::new();
    let mut last: HashMap<String, u64> = HashMap::new();
    let mut twice = 0;
    for value in &order {
        if !seen.insert(value.clone()) {
            twice += 1;
            continue;
        }
        let (p, seq) = value.split_once('-').unwrap();
        let seq: u64 = seq.parse().unwrap();
        if let Some(prev) = last.insert(p.to_string(), seq) {
            assert!(seq > prev, "producer {p}: {seq} stored after {prev}");
        }
    }
    (order.len(), twice)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a long real-process fault run: scripts/fault-suite.sh"]
async fn twenty_kills_of_the_primary_under_four_producers() {
    let mut cluster = Cluster::start("never");
    let client = connect(&cluster).await;
    create_topic(&client).await;
    let load = Load::start(&client).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut resumed = Vec::new();
    for kill in 0..20 {
        let victim = partition_primary(&cluster).await;
        cluster.stop(victim, "KILL");
        // From its death (sends before it may still have been answered by it).
        let killed = Instant::now();
        let after = load.first_ack_after(killed, Duration::from_secs(30)).await;
        println!("kill {kill}: member {victim}, first acknowledgement after {after:?}");
        resumed.push(after);
        cluster.spawn(victim);
        cluster.until_ready(victim, Duration::from_secs(60)).await;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let (acked, failed) = load.finish().await;
    let groups = cluster.until_logs_agree(Duration::from_secs(30)).await;
    let (stored, twice) = check_everything_acknowledged_is_there(&client, &acked).await;
    resumed.sort();
    println!(
        "20 kills: produce resumed p50 {:?}, max {:?}; {} acknowledged, {failed} sends failed, {stored} stored, {twice} stored twice; {groups} groups at one commit point on all members",
        percentile(&resumed, 0.5),
        resumed[resumed.len() - 1],
        acked.len()
    );
    assert!(acked.len() > 1_000, "the producers made progress");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a long real-process fault run: scripts/fault-suite.sh"]
async fn a_rolling_restart_under_fsync_never_loses_nothing() {
    // Clean stops: each records its partitions synced, so they restart trusted.
    rolling_restart("TERM").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a long real-process fault run: scripts/fault-suite.sh"]
async fn a_rolling_kill_9_under_fsync_never_loses_nothing() {
    // Crashes in the same boot: the page cache kept every write the killed process
    // reported, and the states' boot stamp says so, so each restarts trusted (were it
    // untrusted, two untrusted members could form no view).
    rolling_restart("KILL").await;
}

/// Stops each member in turn with `signal` under `fsync = never` and load, restarts
/// it and waits for it to be caught up before the next.
async fn rolling_restart(signal: &str) {
    let mut cluster = Cluster::start("never");
    let client = connect(&cluster).await;
    create_topic(&client).await;
    let load = Load::start(&client).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    for id in 0..NODES {
        let before = load.acked();
        cluster.stop(id, signal);
        cluster.spawn(id);
        cluster.until_ready(id, Duration::from_secs(60)).await;
        let body = http_get(cluster.http_addr(id), "/replication").await;
        let rows = replication_rows(&body.map(|(_, b)| b).unwrap_or_default());
        let untrusted: Vec<_> = rows.iter().filter(|r| r["trusted"] != true).collect();
        assert!(
            !rows.is_empty() && untrusted.is_empty(),
            "member {id} restarted in the same boot with untrusted groups: {untrusted:?}"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
        println!(
            "restarted member {id} (SIG{signal}): {} acknowledged meanwhile",
            load.acked() - before
        );
    }
    let (acked, failed) = load.finish().await;
    let groups = cluster.until_logs_agree(Duration::from_secs(30)).await;
    let (stored, twice) = check_everything_acknowledged_is_there(&client, &acked).await;
    println!(
        "rolling restart (SIG{signal}, fsync = never): {} acknowledged, {failed} sends failed, {stored} stored, {twice} stored twice; {groups} groups agree",
        acked.len()
    );
    assert_eq!(failed, 0, "the SDK rides through a rolling restart");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a long real-process fault run: scripts/fault-suite.sh"]
async fn sigkill_of_every_member_at_once_under_fsync_always_loses_nothing() {
    let mut cluster = Cluster::start("always");
    let client = connect(&cluster).await;
    create_topic(&client).await;
    let load = Load::start(&client).await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    // All three at once: no member outlives the others long enough to flush.
    let pids: Vec<u32> = cluster
        .children
        .iter()
        .map(|c| c.as_ref().unwrap().id())
        .collect();
    let status = Command::new("kill")
        .arg("-KILL")
        .args(pids.iter().map(u32::to_string))
        .status()
        .unwrap();
    assert!(status.success());
    for child in cluster.children.iter_mut() {
        child.take().unwrap().wait().unwrap();
    }
    let (acked, failed) = load.finish().await;
    for id in 0..NODES {
        cluster.spawn(id);
    }
    for id in 0..NODES {
        cluster.until_ready(id, Duration::from_secs(60)).await;
    }
    let client = connect(&cluster).await;
    let groups = cluster.until_logs_agree(Duration::from_secs(30)).await;
    let (stored, twice) = check_everything_acknowledged_is_there(&client, &acked).await;
    println!(
        "kill -9 of all three under fsync = always: {} acknowledged before the kill, all there; {failed} sends failed, {stored} stored, {twice} stored twice; {groups} groups agree",
        acked.len()
    );
    assert!(!acked.is_empty());
}
