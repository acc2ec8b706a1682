//! A three-member cluster of real `braid server` processes under load, and the checks
//! the fault runs make after each fault: every acknowledged record at its offset, in
//! each producer's order, records stored twice counted, and every group at one commit
//! point on all members.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use braid_client::{Client, ConnectOptions, Producer, ProducerConfig};
use braid_proto::client::TopicSettings;

use super::netns::Netns;
use super::{free_base, http_get, signal};

const BRAID: &str = env!("CARGO_BIN_EXE_braid");
/// Members of the cluster.
pub(crate) const NODES: u8 = 3;
/// Producers of the load.
const PRODUCERS: usize = 4;

/// Where the members listen: loopback ports from a free block, or one network
/// namespace each (fixed ports on each member's own address).
enum Net {
    Loopback { base: u16 },
    Namespaces(Netns),
}

/// Three `braid server` children on one directory tree.
pub(crate) struct Cluster {
    root: tempfile::TempDir,
    net: Net,
    fsync: &'static str,
    children: Vec<Option<Child>>,
}

impl Cluster {
    /// Three members on 127.0.0.1.
    pub(crate) fn start(fsync: &'static str) -> Self {
        Self::start_on(Net::Loopback { base: free_base() }, fsync)
    }

    /// Three members, each in its namespace of `netns`.
    pub(crate) fn start_in(netns: Netns, fsync: &'static str) -> Self {
        Self::start_on(Net::Namespaces(netns), fsync)
    }

    fn start_on(net: Net, fsync: &'static str) -> Self {
        let root = tempfile::tempdir().unwrap();
        std::fs::write(
            root.path().join("secret"),
            "a fault-suite secret of enough bytes",
        )
        .unwrap();
        let mut cluster = Self {
            root,
            net,
            fsync,
            children: (0..NODES).map(|_| None).collect(),
        };
        for id in 0..NODES {
            cluster.spawn(id);
        }
        cluster
    }

    /// The namespaces the members run in, if they do.
    pub(crate) fn netns(&self) -> Option<&Netns> {
        match &self.net {
            Net::Namespaces(netns) => Some(netns),
            Net::Loopback { .. } => None,
        }
    }

    /// Member `id`'s address, and the port of `kind` (0 client, 1 HTTP, 2 replica).
    fn addr(&self, id: u8, kind: u16) -> SocketAddr {
        match &self.net {
            Net::Loopback { base } => {
                SocketAddr::from(([127, 0, 0, 1], base + 10 * kind + u16::from(id)))
            }
            Net::Namespaces(netns) => SocketAddr::from((netns.addr(id), 7070 + 10 * kind)),
        }
    }

    pub(crate) fn client_addr(&self, id: u8) -> SocketAddr {
        self.addr(id, 0)
    }

    pub(crate) fn http_addr(&self, id: u8) -> SocketAddr {
        self.addr(id, 1)
    }

    pub(crate) fn seeds(&self) -> Vec<String> {
        (0..NODES)
            .map(|id| self.client_addr(id).to_string())
            .collect()
    }

    /// Starts member `id` (again), its output appended to `node-ID.log`.
    pub(crate) fn spawn(&mut self, id: u8) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.root.path().join(format!("node-{id}.log")))
            .unwrap();
        let mut command = match &self.net {
            Net::Loopback { .. } => Command::new(BRAID),
            Net::Namespaces(netns) => {
                // `ip netns exec` execs the server: the child's pid is the server's.
                let mut command = Command::new("ip");
                command.args(["netns", "exec", netns.name(id), BRAID]);
                // Not loopback: the node asks to be told that no login is wanted.
                command.env("BRAID_ALLOW_UNAUTHENTICATED", "true");
                command
            }
        };
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
            let replica = self.addr(member, 2);
            let client = self.client_addr(member);
            command
                .arg("--member")
                .arg(format!("{member}={replica}/{client}"));
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
    pub(crate) fn stop(&mut self, id: u8, sig: &str) {
        let mut child = self.children[usize::from(id)].take().expect("running");
        signal(child.id(), sig);
        child.wait().unwrap();
    }

    /// SIGKILL to every member in one `kill`, and waits for them.
    pub(crate) fn kill_all_at_once(&mut self) {
        let pids: Vec<u32> = self.children.iter().flatten().map(Child::id).collect();
        let status = Command::new("kill")
            .arg("-KILL")
            .args(pids.iter().map(u32::to_string))
            .status()
            .unwrap();
        assert!(status.success());
        for child in self.children.iter_mut() {
            if let Some(mut child) = child.take() {
                child.wait().unwrap();
            }
        }
    }

    /// The last lines member `id` logged.
    pub(crate) fn log_tail(&self, id: u8, lines: usize) -> String {
        let log = std::fs::read_to_string(self.root.path().join(format!("node-{id}.log")))
            .unwrap_or_default();
        let mut tail: Vec<&str> = log.lines().rev().take(lines).collect();
        tail.reverse();
        tail.join("\n")
    }

    /// Waits until member `id` answers `/ready` with 200 (every group caught up).
    pub(crate) async fn until_ready(&self, id: u8, within: Duration) {
        let deadline = Instant::now() + within;
        loop {
            let answer = http_get(self.http_addr(id), "/ready").await;
            if let Some((200, _)) = answer {
                return;
            }
            if Instant::now() >= deadline {
                let rows = http_get(self.http_addr(id), "/replication").await;
                panic!(
                    "member {id} never caught up: {answer:?} {rows:?}\n{}",
                    self.log_tail(id, 30)
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Stops every member cleanly, then reads each one's partition logs from its data
    /// directory and asserts they hold the same records at the same offsets (a replica
    /// that serves reads later must not hold what another does not); returns the
    /// records compared per member. `/replication` compares VSR headers; this compares
    /// the bytes a consumer would read.
    pub(crate) fn stop_and_compare_logs(&mut self) -> usize {
        for id in 0..NODES {
            if self.children[usize::from(id)].is_some() {
                self.stop(id, "TERM");
            }
        }
        let logs: Vec<Vec<(u64, Option<Vec<u8>>)>> = (0..NODES)
            .map(|id| member_records(&self.root.path().join(format!("node-{id}"))))
            .collect();
        for (id, log) in logs.iter().enumerate().skip(1) {
            if let Some(at) =
                (0..log.len().max(logs[0].len())).find(|i| log.get(*i) != logs[0].get(*i))
            {
                panic!(
                    "member {id}'s log differs from member 0's at record {at}: {:?} against {:?}",
                    log.get(at)
                        .map(|(o, v)| (o, v.as_deref().map(String::from_utf8_lossy))),
                    logs[0]
                        .get(at)
                        .map(|(o, v)| (o, v.as_deref().map(String::from_utf8_lossy)))
                );
            }
        }
        logs[0].len()
    }

    /// Every member's `/replication` rows and last log lines, for a failure message.
    pub(crate) async fn dump(&self) -> String {
        let mut out = Vec::new();
        for id in 0..NODES {
            let rows = http_get(self.http_addr(id), "/replication").await;
            out.push(format!(
                "member {id}: {}\n{}",
                rows.map_or_else(|| "no answer".to_string(), |(_, body)| body),
                self.log_tail(id, 10)
            ));
        }
        out.join("\n")
    }

    /// Member `id`'s `/replication` rows (none if it does not answer).
    pub(crate) async fn rows(&self, id: u8) -> Vec<serde_json::Value> {
        let body = http_get(self.http_addr(id), "/replication").await;
        replication_rows(&body.map(|(_, b)| b).unwrap_or_default())
    }

    /// Waits until every member reports each group at the same commit point, op and
    /// checksum; returns the number of groups compared.
    pub(crate) async fn until_logs_agree(&self, within: Duration) -> usize {
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
        if std::thread::panicking() {
            // A failed run's data directories and logs are the evidence: kept.
            let root = std::mem::replace(&mut self.root, tempfile::tempdir().unwrap());
            eprintln!(
                "the members' data and logs are kept in {}",
                root.keep().display()
            );
        }
    }
}

/// The rows of a `/replication` body (none if it does not parse).
pub(crate) fn replication_rows(body: &str) -> Vec<serde_json::Value> {
    serde_json::from_str::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v.get("groups").and_then(|g| g.as_array()).cloned())
        .unwrap_or_default()
}

/// (group, commit_min, checksum) of every row of a `/replication` body.
pub(crate) fn commit_points(body: &str) -> Vec<(u64, u64, String)> {
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
pub(crate) struct Acked {
    pub(crate) sent: Instant,
    pub(crate) acked: Instant,
    pub(crate) offset: u64,
    pub(crate) value: String,
}

/// Four producers writing keyed records until told to stop.
pub(crate) struct Load {
    stop: Arc<AtomicBool>,
    acked: Arc<Mutex<Vec<Acked>>>,
    failed: Arc<Mutex<u64>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Load {
    pub(crate) async fn start(client: &Client) -> Self {
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

    pub(crate) fn acked(&self) -> usize {
        self.acked.lock().unwrap().len()
    }

    /// The first acknowledgement of a record sent after `since`, waited for.
    pub(crate) async fn first_ack_after(&self, since: Instant, within: Duration) -> Duration {
        match self.try_first_ack_after(since, within).await {
            Some(after) => after,
            None => panic!("no produce acknowledged after the fault"),
        }
    }

    /// As [`Load::first_ack_after`], `None` if none came within `within`.
    pub(crate) async fn try_first_ack_after(
        &self,
        since: Instant,
        within: Duration,
    ) -> Option<Duration> {
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
                return Some(at - since);
            }
            if Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    pub(crate) async fn finish(self) -> (Vec<Acked>, u64) {
        self.stop.store(true, Ordering::Relaxed);
        for task in self.tasks {
            let _ = tokio::time::timeout(Duration::from_secs(30), task).await;
        }
        let acked = self.acked.lock().unwrap().clone();
        let failed = *self.failed.lock().unwrap();
        (acked, failed)
    }
}

/// `cluster` with its topic and the four producers writing for `warm_up`.
pub(crate) async fn under_load(cluster: Cluster, warm_up: Duration) -> (Cluster, Client, Load) {
    let client = connect(&cluster).await;
    create_topic(&client).await;
    let load = Load::start(&client).await;
    tokio::time::sleep(warm_up).await;
    (cluster, client, load)
}

pub(crate) async fn connect(cluster: &Cluster) -> Client {
    let seeds = cluster.seeds();
    let seeds: Vec<&str> = seeds.iter().map(String::as_str).collect();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok(client) = Client::connect_cluster(&seeds, &ConnectOptions::default()).await {
            if client.cluster_info().await.is_ok() {
                return client;
            }
        }
        if Instant::now() >= deadline {
            let logs: Vec<String> = (0..NODES)
                .map(|id| format!("member {id}:\n{}", cluster.log_tail(id, 15)))
                .collect();
            panic!("the cluster never answered\n{}", logs.join("\n"));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

pub(crate) async fn create_topic(client: &Client) {
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
pub(crate) async fn partition_primary(cluster: &Cluster) -> u8 {
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
pub(crate) async fn check_everything_acknowledged_is_there(
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
        if stored.get(&a.offset) != Some(&a.value) {
            let elsewhere: Vec<u64> = stored
                .iter()
                .filter(|(_, v)| **v == a.value)
                .map(|(o, _)| *o)
                .collect();
            let around: Vec<(u64, Option<&String>)> = (a.offset.saturating_sub(3)..a.offset + 4)
                .map(|o| (o, stored.get(&o)))
                .collect();
            panic!(
                "acknowledged {} at offset {} is not there ({} records stored, high watermark {}): stored at {elsewhere:?}; around it {around:?}",
                a.value,
                a.offset,
                stored.len(),
                offset
            );
        }
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

/// Every record (offset, value) in the partition logs under a member's data directory,
/// segment by segment in offset order.
fn member_records(data_dir: &std::path::Path) -> Vec<(u64, Option<Vec<u8>>)> {
    let mut segments = Vec::new();
    let mut dirs = vec![data_dir.join("partitions")];
    while let Some(dir) = dirs.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "log") {
                segments.push(path);
            }
        }
    }
    segments.sort();
    let mut records = std::collections::VecDeque::new();
    for segment in segments {
        let bytes = std::fs::read(&segment).unwrap();
        braid_client::decode_records(0, 0, &bytes, &mut records)
            .unwrap_or_else(|e| panic!("{}: {e}", segment.display()));
    }
    records.into_iter().map(|r| (r.offset, r.value)).collect()
}
