//! A three-member cluster of real `braid server` processes under load, and the checks
//! the fault runs make after each fault: every acknowledged record at its offset, in
//! each producer's order, records stored twice counted, and every group at one commit
//! point on all members.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
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
    /// Where each member's log file ended when it was last started.
    log_marks: Vec<usize>,
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
            log_marks: vec![0; usize::from(NODES)],
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

    /// Member `id`'s data directory.
    pub(crate) fn data_dir(&self, id: u8) -> PathBuf {
        self.root.path().join(format!("node-{id}"))
    }

    /// Starts member `id` (again), its output appended to `node-ID.log`.
    pub(crate) fn spawn(&mut self, id: u8) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.root.path().join(format!("node-{id}.log")))
            .unwrap();
        self.log_marks[usize::from(id)] = log.metadata().unwrap().len() as usize;
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
        let dir = self.root.path().join(format!("node-{id}"));
        if !dir.join("identity").exists() {
            // The first start of a new cluster's member (a member of several refuses an
            // empty directory it is not told is new).
            command.arg("--init");
        }
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

    /// Copies member `id`'s data directory (it is stopped) to `node-ID.as-stopped`,
    /// replacing the last copy: the evidence if its next start fails (a failed start
    /// may already have repaired or cut some of its files).
    pub(crate) fn keep_copy(&self, id: u8) {
        let copy = self.root.path().join(format!("node-{id}.as-stopped"));
        let _ = std::fs::remove_dir_all(&copy);
        copy_dir(&self.root.path().join(format!("node-{id}")), &copy);
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

    /// Member `id`'s process has exited (it is a zombie not yet waited for).
    fn exited(&self, id: u8) -> bool {
        let Some(child) = &self.children[usize::from(id)] else {
            return false;
        };
        // /proc/PID/stat: "PID (COMM) STATE ...".
        std::fs::read_to_string(format!("/proc/{}/stat", child.id()))
            .ok()
            .and_then(|stat| {
                let (_, rest) = stat.rsplit_once(')')?;
                rest.split_whitespace().next().map(|state| state == "Z")
            })
            .unwrap_or(false)
    }

    /// What member `id` logged since it was last started, without the frames of a
    /// backtrace.
    pub(crate) fn start_error(&self, id: u8) -> String {
        let log =
            std::fs::read(self.root.path().join(format!("node-{id}.log"))).unwrap_or_default();
        let since = log
            .get(self.log_marks[usize::from(id)]..)
            .unwrap_or_default();
        String::from_utf8_lossy(since)
            .lines()
            .take_while(|l| !l.starts_with("Stack backtrace"))
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Waits until member `id` answers `/ready` with 200, or its process exits (the
    /// error: what it logged since its start); panics if neither comes `within`.
    pub(crate) async fn until_ready_or_exited(
        &mut self,
        id: u8,
        within: Duration,
    ) -> Result<(), String> {
        let deadline = Instant::now() + within;
        loop {
            let answer = http_get(self.http_addr(id), "/ready").await;
            if let Some((200, _)) = answer {
                return Ok(());
            }
            if self.exited(id) {
                if let Some(mut child) = self.children[usize::from(id)].take() {
                    child.wait().unwrap();
                }
                return Err(self.start_error(id));
            }
            if Instant::now() >= deadline {
                self.never_caught_up(id, answer).await;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Fails the test for member `id`, not ready by its deadline: its `/replication`
    /// rows and log in the message, its data directory kept in the temporary
    /// directory (the test's own root goes with it).
    async fn never_caught_up(&self, id: u8, answer: Option<(u16, String)>) -> ! {
        let rows = http_get(self.http_addr(id), "/replication").await;
        let kept = std::env::temp_dir().join(format!(
            "braid-never-caught-up-{}-node-{id}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&kept);
        copy_dir(&self.root.path().join(format!("node-{id}")), &kept);
        panic!(
            "member {id} never caught up: {answer:?} {rows:?}\n{}\n(its data directory is kept in {})",
            self.log_tail(id, 30),
            kept.display()
        );
    }

    /// Waits until member `id` answers `/ready` with 200 (every group caught up).
    pub(crate) async fn until_ready(&self, id: u8, within: Duration) {
        let deadline = Instant::now() + within;
        loop {
            let answer = http_get(self.http_addr(id), "/ready").await;
            if let Some((200, _)) = answer {
                return;
            }
            if self.exited(id) {
                panic!(
                    "member {id} exited while starting:\n{}",
                    self.start_error(id)
                );
            }
            if Instant::now() >= deadline {
                self.never_caught_up(id, answer).await;
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
        self.stop_and_compare_partition_logs().values().sum()
    }

    /// As [`Cluster::stop_and_compare_logs`], partition by partition: every member
    /// holds the same partitions, and in each the same records (offset and value);
    /// returns the records of each partition (keyed by topic id and partition).
    pub(crate) fn stop_and_compare_partition_logs(&mut self) -> BTreeMap<(u32, u32), usize> {
        for id in 0..NODES {
            if self.children[usize::from(id)].is_some() {
                self.stop(id, "TERM");
            }
        }
        let logs: Vec<BTreeMap<(u32, u32), Vec<Record>>> = (0..NODES)
            .map(|id| member_partition_records(&self.root.path().join(format!("node-{id}"))))
            .collect();
        for (id, log) in logs.iter().enumerate().skip(1) {
            let theirs: Vec<_> = log.keys().collect();
            let ours: Vec<_> = logs[0].keys().collect();
            assert_eq!(
                theirs, ours,
                "member {id} holds other partitions (topic, partition) than member 0"
            );
            for (partition, records) in log {
                let first = &logs[0][partition];
                if let Some(at) =
                    (0..records.len().max(first.len())).find(|i| records.get(*i) != first.get(*i))
                {
                    panic!(
                        "member {id}'s log of partition {partition:?} differs from member 0's at record {at}:\n{}\nthe members' logs:\n{}",
                        describe_difference(records, first, at),
                        (0..NODES)
                            .map(|m| format!("member {m}:\n{}", self.log_tail(m, 30)))
                            .collect::<Vec<_>>()
                            .join("\n")
                    );
                }
            }
        }
        logs[0].iter().map(|(p, r)| (*p, r.len())).collect()
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

/// Copies directory `from` to `to`, recursively.
fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap().flatten() {
        let path = entry.path();
        let target = to.join(entry.file_name());
        if path.is_dir() {
            copy_dir(&path, &target);
        } else {
            std::fs::copy(&path, &target).unwrap();
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
    pub(crate) partition: u32,
    pub(crate) offset: u64,
    pub(crate) value: String,
}

/// How the load's producers key their records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Keys {
    /// Producer `p` keys every record `[p]`: each writes one partition.
    OnePerProducer,
    /// Each record is keyed by its value (`p-seq`): every producer writes every
    /// partition.
    Spread,
}

/// Producers writing keyed records until told to stop, one send at a time each.
pub(crate) struct Load {
    stop: Arc<AtomicBool>,
    paused: Arc<AtomicBool>,
    in_flight: Arc<AtomicUsize>,
    acked: Arc<Mutex<Vec<Acked>>>,
    failed: Arc<Mutex<u64>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Load {
    /// Four producers, each on the partition of its own key.
    pub(crate) async fn start(client: &Client) -> Self {
        Self::start_with(client, PRODUCERS, Keys::OnePerProducer).await
    }

    /// `producers` producers keying their records as `keys` says.
    pub(crate) async fn start_with(client: &Client, producers: usize, keys: Keys) -> Self {
        Self::start_numbered(client, producers, keys, 0).await
    }

    /// As [`Load::start_with`], the producers numbered from `first` (each writes the
    /// values `p-0`, `p-1`, ... of its number `p`).
    pub(crate) async fn start_numbered(
        client: &Client,
        producers: usize,
        keys: Keys,
        first: usize,
    ) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let paused = Arc::new(AtomicBool::new(false));
        let in_flight = Arc::new(AtomicUsize::new(0));
        let acked = Arc::new(Mutex::new(Vec::new()));
        let failed = Arc::new(Mutex::new(0));
        let mut tasks = Vec::new();
        for p in first..first + producers {
            let config = ProducerConfig {
                linger: Duration::from_millis(1),
                ..ProducerConfig::default()
            };
            let producer = Producer::new(client, "s", "t", config).await.unwrap();
            let (stop, paused, in_flight) = (stop.clone(), paused.clone(), in_flight.clone());
            let (acked, failed) = (acked.clone(), failed.clone());
            tasks.push(tokio::spawn(async move {
                let mut seq = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    // Counted in flight before the pause is looked at: a pause that
                    // sees none in flight sees every later send paused.
                    in_flight.fetch_add(1, Ordering::SeqCst);
                    if paused.load(Ordering::SeqCst) {
                        in_flight.fetch_sub(1, Ordering::SeqCst);
                        tokio::time::sleep(Duration::from_millis(10)).await;
                        continue;
                    }
                    let value = format!("{p}-{seq}");
                    let key = match keys {
                        Keys::OnePerProducer => vec![p as u8],
                        Keys::Spread => value.clone().into_bytes(),
                    };
                    let sent = Instant::now();
                    match producer.send(Some(&key), value.as_bytes()).await {
                        Ok(stored) => acked.lock().unwrap().push(Acked {
                            sent,
                            acked: Instant::now(),
                            partition: stored.partition,
                            offset: stored.offset,
                            value,
                        }),
                        Err(_) => *failed.lock().unwrap() += 1,
                    }
                    in_flight.fetch_sub(1, Ordering::SeqCst);
                    seq += 1;
                }
            }));
        }
        Self {
            stop,
            paused,
            in_flight,
            acked,
            failed,
            tasks,
        }
    }

    /// Stops new sends and waits until every send started is answered (a send is
    /// retried for at most the producer's 30 s).
    pub(crate) async fn pause(&self) {
        self.paused.store(true, Ordering::SeqCst);
        let deadline = Instant::now() + Duration::from_secs(60);
        while self.in_flight.load(Ordering::SeqCst) > 0 {
            assert!(Instant::now() < deadline, "a send was never answered");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Sends again after [`Load::pause`].
    pub(crate) fn resume(&self) {
        self.paused.store(false, Ordering::SeqCst);
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

    /// Stops the producers and waits up to 30 s in all for their last sends (after
    /// every member was killed at once, a send may still be retrying then).
    pub(crate) async fn finish(self) -> (Vec<Acked>, u64) {
        self.stop.store(true, Ordering::Relaxed);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        for task in self.tasks {
            let _ = tokio::time::timeout_at(deadline, task).await;
        }
        let acked = self.acked.lock().unwrap().clone();
        let failed = *self.failed.lock().unwrap();
        (acked, failed)
    }
}

/// `cluster` with its topic and the four producers writing for `warm_up`.
pub(crate) async fn under_load(cluster: Cluster, warm_up: Duration) -> (Cluster, Client, Load) {
    let client = connect(&cluster).await;
    create_topic(&client, 1).await;
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

/// Stream `s` and its topic `t` of `partitions` partitions.
pub(crate) async fn create_topic(client: &Client, partitions: u32) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while client.create_stream("s").await.is_err() {
        assert!(Instant::now() < deadline, "the stream was never created");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let settings = TopicSettings {
        partitions,
        ..TopicSettings::default()
    };
    client.create_topic("s", "t", settings).await.unwrap();
}

/// The member leading the partition now, as the members themselves say: the primary
/// of the newest view any member is normal in (a client's map may lag a failover).
pub(crate) async fn partition_primary(cluster: &Cluster) -> u8 {
    primary_of(cluster, 0).await
}

/// The partition of a replication group, `None` for the metadata's group 0.
pub(crate) fn group_partition(group: u64) -> Option<u32> {
    // 1 << 63 | topic id << 32 | partition.
    (group >> 63 == 1).then_some((group & 0xffff_ffff) as u32)
}

/// Each group's primary, as the members say: the primary of the newest view any
/// member is normal in.
pub(crate) async fn group_primaries(cluster: &Cluster) -> BTreeMap<u64, u8> {
    let mut newest: BTreeMap<u64, (u64, u8)> = BTreeMap::new();
    for id in 0..NODES {
        let Some((_, body)) = http_get(cluster.http_addr(id), "/replication").await else {
            continue;
        };
        for row in replication_rows(&body) {
            let normal = row["status"] == "normal";
            if let (true, Some(group), Some(view), Some(primary)) = (
                normal,
                row["group"].as_u64(),
                row["view"].as_u64(),
                row["primary"].as_u64(),
            ) {
                let known = newest.get(&group).is_some_and(|(v, _)| *v >= view);
                if !known {
                    newest.insert(group, (view, primary as u8));
                }
            }
        }
    }
    newest.into_iter().map(|(g, (_, p))| (g, p)).collect()
}

/// The member leading `partition` of the (one) topic now, as [`group_primaries`].
pub(crate) async fn primary_of(cluster: &Cluster, partition: u32) -> u8 {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let primaries = group_primaries(cluster).await;
        let found = primaries
            .iter()
            .find(|(g, _)| group_partition(**g) == Some(partition));
        if let Some((_, primary)) = found {
            return *primary;
        }
        assert!(
            Instant::now() < deadline,
            "no member leads partition {partition}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// What [`check_partitions`] read back.
pub(crate) struct Stored {
    /// Records read, over all partitions (copies stored twice included).
    pub(crate) records: usize,
    /// Values stored more than once.
    pub(crate) twice: usize,
    /// Records read per partition.
    pub(crate) per_partition: Vec<usize>,
    /// Every value read, at its (partition, offset).
    pub(crate) at: HashMap<(u32, u64), String>,
}

/// Reads the partition whole; asserts every acknowledged record is at its offset and
/// each producer's records are stored in the order it sent them; returns (records
/// stored, values stored twice).
pub(crate) async fn check_everything_acknowledged_is_there(
    client: &Client,
    acked: &[Acked],
) -> (usize, usize) {
    let stored = check_partitions(client, acked, 1).await;
    (stored.records, stored.twice)
}

/// Reads partitions `0..partitions` whole; asserts every acknowledged record is at its
/// partition and offset, and each producer's records are stored in each partition in
/// the order it sent them.
pub(crate) async fn check_partitions(client: &Client, acked: &[Acked], partitions: u32) -> Stored {
    let mut stored = Stored {
        records: 0,
        twice: 0,
        per_partition: Vec::new(),
        at: HashMap::new(),
    };
    for partition in 0..partitions {
        let order = read_partition(client, partition, &mut stored.at).await;
        stored.records += order.len();
        stored.per_partition.push(order.len());
        // Per producer, the first copy of each value comes in send order.
        let mut seen = std::collections::HashSet::new();
        let mut last: HashMap<String, u64> = HashMap::new();
        for value in &order {
            if !seen.insert(value.clone()) {
                stored.twice += 1;
                continue;
            }
            let (p, seq) = value.split_once('-').unwrap();
            let seq: u64 = seq.parse().unwrap();
            if let Some(prev) = last.insert(p.to_string(), seq) {
                assert!(
                    seq > prev,
                    "producer {p}: {seq} stored after {prev} in partition {partition}"
                );
            }
        }
    }
    for a in acked {
        if stored.at.get(&(a.partition, a.offset)) != Some(&a.value) {
            let elsewhere: Vec<(u32, u64)> = stored
                .at
                .iter()
                .filter(|(_, v)| **v == a.value)
                .map(|(at, _)| *at)
                .collect();
            let around: Vec<(u64, Option<&String>)> = (a.offset.saturating_sub(3)..a.offset + 4)
                .map(|o| (o, stored.at.get(&(a.partition, o))))
                .collect();
            panic!(
                "acknowledged {} at partition {} offset {} is not there ({} records stored in it): stored at {elsewhere:?}; around it {around:?}",
                a.value,
                a.partition,
                a.offset,
                stored.per_partition[a.partition as usize],
            );
        }
    }
    stored
}

/// Reads `partition` whole into `at`; returns its values in offset order.
async fn read_partition(
    client: &Client,
    partition: u32,
    at: &mut HashMap<(u32, u64), String>,
) -> Vec<String> {
    let mut offset = 0;
    let mut order = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let fetched = match client
            .fetch("s", "t", partition, offset, 4 << 20, 500)
            .await
        {
            Ok(f) => f,
            Err(_) => {
                assert!(
                    Instant::now() < deadline,
                    "partition {partition} could not be read"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let mut records = std::collections::VecDeque::new();
        braid_client::decode_records(partition, offset, &fetched.batches, &mut records).unwrap();
        if records.is_empty() && offset >= fetched.high_watermark {
            return order;
        }
        for record in records {
            offset = record.offset + 1;
            let value = String::from_utf8(record.value.unwrap().to_vec()).unwrap();
            order.push(value.clone());
            at.insert((partition, record.offset), value);
        }
    }
}

/// A record as a log holds it: its offset and value.
type Record = (u64, Option<Vec<u8>>);

/// Every record (offset, value) in the partition logs under a member's data directory
/// (`partitions/TOPIC/PARTITION/*.log`), per (topic id, partition), segment by segment
/// in offset order.
fn member_partition_records(data_dir: &Path) -> BTreeMap<(u32, u32), Vec<Record>> {
    let mut segments: BTreeMap<(u32, u32), Vec<PathBuf>> = BTreeMap::new();
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
                let number = |p: Option<&Path>| -> u32 {
                    p.and_then(Path::file_name)
                        .and_then(|n| n.to_str())
                        .and_then(|n| n.parse().ok())
                        .unwrap_or_else(|| panic!("a segment outside TOPIC/PARTITION: {path:?}"))
                };
                let partition_dir = path.parent();
                let key = (
                    number(partition_dir.and_then(Path::parent)),
                    number(partition_dir),
                );
                segments.entry(key).or_default().push(path);
            }
        }
    }
    segments
        .into_iter()
        .map(|(key, mut paths)| {
            // Named by base offset, zero-padded: in name order is in offset order.
            paths.sort();
            let mut records = std::collections::VecDeque::new();
            for segment in paths {
                let bytes = std::fs::read(&segment).unwrap();
                braid_client::decode_records(key.1, 0, &bytes, &mut records)
                    .unwrap_or_else(|e| panic!("{}: {e}", segment.display()));
            }
            let records = records.into_iter().map(|r| (r.offset, r.value)).collect();
            (key, records)
        })
        .collect()
}

/// Where two members' logs of a partition part, from record `at` on: the offsets and
/// values each holds that the other does not there, and where the other holds them.
fn describe_difference(theirs: &[Record], ours: &[Record], at: usize) -> String {
    let span = |log: &[Record]| log.first().map(|f| (f.0, log[log.len() - 1].0));
    let mut out = vec![format!(
        "it holds {} records (offsets {:?}), member 0 {} (offsets {:?})",
        theirs.len(),
        span(theirs),
        ours.len(),
        span(ours)
    )];
    for (name, other, a, b) in [
        ("it", "member 0", theirs, ours),
        ("member 0", "it", ours, theirs),
    ] {
        out.push(differing_run(name, other, a, b, at));
    }
    out.join("\n")
}

/// The run of `a`'s records from record `at` on that `b` does not hold at the same
/// offset, summarised.
fn differing_run(name: &str, other: &str, a: &[Record], b: &[Record], at: usize) -> String {
    let show = |v: &Option<Vec<u8>>| {
        v.as_deref()
            .map(|v| String::from_utf8_lossy(v).into_owned())
    };
    let b_at: HashMap<u64, &Option<Vec<u8>>> = b.iter().map(|(o, v)| (*o, v)).collect();
    let mut b_where: HashMap<&Option<Vec<u8>>, u64> = HashMap::new();
    for (o, v) in b {
        b_where.entry(v).or_insert(*o);
    }
    let run: Vec<&Record> = a
        .iter()
        .skip(at)
        .take_while(|(o, v)| b_at.get(o) != Some(&v))
        .collect();
    let (Some(first), Some(last)) = (run.first(), run.last()) else {
        return format!("{name} holds nothing from record {at} on that {other} lacks");
    };
    format!(
        "{name} holds at offsets {}..={} ({} records, values {:?} to {:?}) what {other} does not hold there; {other} holds those values at offsets {:?} to {:?}, and at offset {} it holds {:?}",
        first.0,
        last.0,
        run.len(),
        show(&first.1),
        show(&last.1),
        b_where.get(&first.1),
        b_where.get(&last.1),
        first.0,
        b_at.get(&first.0).map(|v| show(v))
    )
}
