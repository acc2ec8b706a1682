//! Damage at rest in real processes (ignored in CI; `scripts/damage-suite.sh` runs
//! them), issue 24's test list: one member of a 3-node cluster is stopped, one kind of
//! file of its data directory is damaged (a flipped bit in the middle, then, in a
//! second pass, the file deleted), and it is started again. Every kind in turn, with
//! more acknowledged records written between rounds. After each round every
//! acknowledged record is read back at its partition and offset, and at the end each
//! member's log of every partition is the same on disk, record by record: the damaged
//! member repaired what it lost. A member that refuses to start must name what is
//! damaged; its refusal is reported, the file put back, and the run goes on.

// A panic in a test is a failed assertion, not a crash on outside data.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::time::Duration;

use braid_client::Client;

mod support;
use support::cluster::{check_partitions, connect, create_topic, Acked, Cluster, Keys, Load};

/// Partitions of the topic.
const PARTITIONS: u32 = 2;
/// The member whose files are damaged.
const VICTIM: u8 = 1;

/// A kind of file in a member's data directory, and how to find one.
struct Kind {
    name: &'static str,
    /// Whether `path` (relative to the data directory) is of this kind.
    matches: fn(&str) -> bool,
}

const KINDS: &[Kind] = &[
    Kind {
        name: "partition segment (.log)",
        matches: |p| p.starts_with("partitions/") && p.ends_with(".log"),
    },
    Kind {
        name: "partition offset index (.index)",
        matches: |p| p.starts_with("partitions/") && p.ends_with(".index"),
    },
    Kind {
        name: "partition time index (.timeindex)",
        matches: |p| p.starts_with("partitions/") && p.ends_with(".timeindex"),
    },
    Kind {
        name: "partition recovery-point",
        matches: |p| p.starts_with("partitions/") && p.ends_with("/recovery-point"),
    },
    Kind {
        name: "partition vsr.journal",
        matches: |p| p.starts_with("partitions/") && p.ends_with("/vsr.journal"),
    },
    Kind {
        name: "partition checkpoint",
        matches: |p| p.starts_with("partitions/") && p.contains(".checkpoint."),
    },
    Kind {
        name: "partition states table",
        matches: |p| p.starts_with("replication/shard-"),
    },
    Kind {
        name: "metadata journal",
        matches: |p| p == "metadata/group-0.journal",
    },
    Kind {
        name: "metadata checkpoint",
        matches: |p| p.starts_with("metadata/group-0.checkpoint."),
    },
    Kind {
        name: "metadata states table",
        matches: |p| p.starts_with("metadata/shard-0."),
    },
];

/// Every file under `dir`, as paths relative to it, sorted.
fn files(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut dirs = vec![dir.to_path_buf()];
    while let Some(d) = dirs.pop() {
        for entry in std::fs::read_dir(&d).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() {
                dirs.push(path);
            } else {
                let relative = path
                    .strip_prefix(dir)
                    .unwrap()
                    .to_string_lossy()
                    .into_owned();
                out.push(relative);
            }
        }
    }
    out.sort();
    out
}

/// The first non-empty file of `kind` in `dir`.
fn file_of(dir: &Path, kind: &Kind) -> Option<PathBuf> {
    files(dir)
        .into_iter()
        .filter(|p| (kind.matches)(p))
        .map(|p| dir.join(p))
        .find(|p| std::fs::metadata(p).is_ok_and(|m| m.len() > 0))
}

/// What happened to the member after the damage.
#[derive(Debug)]
enum Outcome {
    /// It started, caught up, and the cluster served every acknowledged record.
    Repaired,
    /// It refused to start, saying this.
    Refused(String),
    /// No file of the kind existed.
    Absent,
}

/// How the files are damaged.
#[derive(Debug, Clone, Copy)]
enum Damage {
    /// One bit flipped in the middle of the file.
    Flip,
    /// The file deleted.
    Delete,
}

struct Run {
    cluster: Cluster,
    client: Client,
    acked: Vec<Acked>,
    rounds: usize,
}

impl Run {
    async fn start() -> Self {
        let cluster = Cluster::start("always");
        let client = connect(&cluster).await;
        create_topic(&client, PARTITIONS).await;
        let mut run = Self {
            cluster,
            client,
            acked: Vec::new(),
            rounds: 0,
        };
        run.write(Duration::from_secs(3)).await;
        run
    }

    /// Two producers on every partition for `how_long` (numbered apart from every
    /// earlier round's, so that every value is written once).
    async fn write(&mut self, how_long: Duration) {
        self.rounds += 1;
        let load = Load::start_numbered(&self.client, 2, Keys::Spread, 2 * self.rounds).await;
        tokio::time::sleep(how_long).await;
        let (acked, _failed) = load.finish().await;
        assert!(!acked.is_empty(), "the producers made progress");
        self.acked.extend(acked);
    }

    /// Damages the victim's first file of `kind` while it is stopped, starts it again
    /// and checks the cluster; a refusal puts the file back and starts it again.
    async fn round(&mut self, kind: &Kind, damage: Damage) -> Outcome {
        self.cluster.until_logs_agree(Duration::from_secs(60)).await;
        self.cluster.stop(VICTIM, "TERM");
        let dir = self.cluster.data_dir(VICTIM);
        let Some(path) = file_of(&dir, kind) else {
            self.cluster.spawn(VICTIM);
            self.cluster
                .until_ready(VICTIM, Duration::from_secs(60))
                .await;
            return Outcome::Absent;
        };
        let original = std::fs::read(&path).unwrap();
        match damage {
            Damage::Flip => {
                let mut bytes = original.clone();
                let at = bytes.len() / 2;
                bytes[at] ^= 0x08;
                std::fs::write(&path, &bytes).unwrap();
            }
            Damage::Delete => std::fs::remove_file(&path).unwrap(),
        }
        println!(
            "{damage:?} {} ({} bytes)",
            path.strip_prefix(&dir).unwrap().display(),
            original.len()
        );
        self.cluster.spawn(VICTIM);
        let outcome = match self
            .cluster
            .until_ready_or_exited(VICTIM, Duration::from_secs(60))
            .await
        {
            Ok(()) => Outcome::Repaired,
            Err(error) => {
                std::fs::write(&path, &original).unwrap();
                self.cluster.spawn(VICTIM);
                self.cluster
                    .until_ready(VICTIM, Duration::from_secs(60))
                    .await;
                Outcome::Refused(error)
            }
        };
        self.cluster.until_logs_agree(Duration::from_secs(90)).await;
        check_partitions(&self.client, &self.acked, PARTITIONS).await;
        self.write(Duration::from_secs(1)).await;
        outcome
    }
}

/// Issue 24: "flip a bit in every kind of file of one member, and delete each kind, one
/// at a time, with the member stopped; restart it: the cluster serves every
/// acknowledged record, the damaged member repairs and is caught up". A refusal is
/// allowed only where it names the damage; it is reported in the table printed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a long real-process damage run: scripts/damage-suite.sh"]
async fn damage_to_any_file_of_a_stopped_member_is_repaired_and_loses_nothing() {
    let mut run = Run::start().await;
    let mut table = Vec::new();
    for damage in [Damage::Flip, Damage::Delete] {
        for kind in KINDS {
            let outcome = run.round(kind, damage).await;
            println!("{damage:?} {}: {outcome:?}", kind.name);
            table.push((damage, kind.name, outcome));
        }
    }
    let stored = check_partitions(&run.client, &run.acked, PARTITIONS).await;
    let on_disk = run.cluster.stop_and_compare_partition_logs();
    println!(
        "damage at rest, one member, {} rounds: {} acknowledged, all there ({} stored, {} twice); every member's logs the same on disk: {on_disk:?}",
        table.len(),
        run.acked.len(),
        stored.records,
        stored.twice
    );
    for (damage, kind, outcome) in &table {
        println!("| {damage:?} | {kind} | {outcome:?} |");
    }
    for (damage, kind, outcome) in &table {
        if let Outcome::Refused(why) = outcome {
            assert!(
                why.contains("damaged") || why.contains("missing") || why.contains("rejoin"),
                "{damage:?} {kind}: the refusal does not say what is damaged:\n{why}"
            );
        }
    }
}

/// A lone `braid server` on ephemeral loopback ports.
struct Lone {
    child: std::process::Child,
    client: std::net::SocketAddr,
}

impl Lone {
    /// Starts it on `dir`, its log in `log`; `Err` with its log when it exits instead.
    fn start(dir: &Path, log: &Path) -> Result<Self, String> {
        use std::io::BufRead;
        let stderr = std::fs::File::create(log).unwrap();
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_braid"))
            .args([
                "server",
                "--client-addr",
                "127.0.0.1:0",
                "--http-addr",
                "127.0.0.1:0",
                "--fsync",
                "always",
            ])
            .arg("--data-dir")
            .arg(dir)
            .env("BRAID_LOG", "warn")
            .env("RUST_BACKTRACE", "0")
            .stdout(std::process::Stdio::piped())
            .stderr(stderr)
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        match line.split_whitespace().nth(3).and_then(|a| a.parse().ok()) {
            Some(client) => Ok(Self { child, client }),
            None => {
                child.wait().unwrap();
                Err(std::fs::read_to_string(log).unwrap())
            }
        }
    }

    fn stop(mut self) {
        support::signal(self.child.id(), "TERM");
        self.child.wait().unwrap();
    }
}

impl Drop for Lone {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What a lone node did after the damage.
#[derive(Debug)]
enum LoneOutcome {
    /// It refused to start, saying this.
    Refused(String),
    /// It started: `served` of the records were read back (each at its offset), a read
    /// was refused with this error (if any), and the next produce was stored at this
    /// offset (or refused with this error).
    Started {
        served: usize,
        read_refused: Option<String>,
        next: Result<u64, String>,
    },
    Absent,
}

/// Values written to a lone node's one partition, one per offset.
const LONE_RECORDS: u64 = 600;

/// One round on a fresh lone node: write, stop, damage `kind`, start, check.
async fn lone_round(root: &Path, round: usize, kind: &Kind, damage: Damage) -> LoneOutcome {
    let dir = root.join(format!("lone-{round}"));
    let log = root.join(format!("lone-{round}.log"));
    let node = Lone::start(&dir, &log).unwrap();
    let client = Client::connect(&node.client.to_string()).await.unwrap();
    create_topic(&client, 1).await;
    let producer = braid_client::Producer::new(&client, "s", "t", Default::default())
        .await
        .unwrap();
    for i in 0..LONE_RECORDS {
        let stored = producer
            .send(Some(b"k"), format!("v{i}").as_bytes())
            .await
            .unwrap();
        assert_eq!(stored.offset, i);
    }
    drop(producer);
    drop(client);
    node.stop();
    let Some(path) = file_of(&dir, kind) else {
        return LoneOutcome::Absent;
    };
    match damage {
        Damage::Flip => {
            let mut bytes = std::fs::read(&path).unwrap();
            let at = bytes.len() / 2;
            bytes[at] ^= 0x08;
            std::fs::write(&path, &bytes).unwrap();
        }
        Damage::Delete => std::fs::remove_file(&path).unwrap(),
    }
    let node = match Lone::start(&dir, &log) {
        Ok(node) => node,
        Err(log) => {
            let last: Vec<&str> = log.lines().rev().take(3).collect();
            let last: Vec<&str> = last.into_iter().rev().collect();
            return LoneOutcome::Refused(last.join(" / "));
        }
    };
    let client = Client::connect(&node.client.to_string()).await.unwrap();
    let mut served = 0usize;
    let mut read_refused = None;
    let mut offset = 0u64;
    loop {
        let fetched = match client.fetch("s", "t", 0, offset, 1 << 20, 0).await {
            Ok(fetched) => fetched,
            Err(error) => {
                read_refused = Some(error.to_string());
                break;
            }
        };
        let mut records = std::collections::VecDeque::new();
        braid_client::decode_records(0, offset, &fetched.batches, &mut records).unwrap();
        if records.is_empty() {
            break;
        }
        for record in records {
            let value = String::from_utf8(record.value.unwrap().to_vec()).unwrap();
            assert_eq!(
                value,
                format!("v{}", record.offset),
                "{damage:?} {}: a lone node served another record at offset {}",
                kind.name,
                record.offset
            );
            served += 1;
            offset = record.offset + 1;
        }
    }
    let next = match braid_client::Producer::new(&client, "s", "t", Default::default()).await {
        Ok(producer) => producer
            .send(Some(b"k"), b"after")
            .await
            .map(|s| s.offset)
            .map_err(|e| e.to_string()),
        Err(error) => Err(error.to_string()),
    };
    node.stop();
    LoneOutcome::Started {
        served,
        read_refused,
        next,
    }
}

/// Issue 24: "the same on a single node: a clear refusal every time, never silent loss
/// or reuse". Each kind of file of a lone node that acknowledged 600 records, damaged
/// (a flipped bit, then deleted) on a fresh node each time: the node refuses to start,
/// or serves every record at its offset, or refuses the read at the damage; it never
/// serves another record, never serves fewer without an error, and never stores a new
/// record at an offset it acknowledged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a long real-process damage run: scripts/damage-suite.sh"]
async fn damage_to_any_file_of_a_lone_node_is_refused_never_lost_or_reused() {
    let root = tempfile::tempdir().unwrap();
    let mut table = Vec::new();
    let mut round = 0;
    for damage in [Damage::Flip, Damage::Delete] {
        for kind in KINDS {
            round += 1;
            let outcome = lone_round(root.path(), round, kind, damage).await;
            println!("{damage:?} {}: {outcome:?}", kind.name);
            table.push((damage, kind.name, outcome));
        }
    }
    for (damage, kind, outcome) in &table {
        println!("| {damage:?} | {kind} | {outcome:?} |");
    }
    for (damage, kind, outcome) in &table {
        if let LoneOutcome::Refused(why) = outcome {
            assert!(
                ["damaged", "corrupt", "gone"]
                    .iter()
                    .any(|w| why.contains(w)),
                "{damage:?} {kind}: the refusal does not name the damage:\n{why}"
            );
        }
        if let LoneOutcome::Started {
            served,
            read_refused,
            next,
        } = outcome
        {
            assert!(
                *served as u64 == LONE_RECORDS || read_refused.is_some(),
                "{damage:?} {kind}: {served} of {LONE_RECORDS} records served and no error: silent loss"
            );
            if let Ok(offset) = next {
                assert!(
                    *offset >= LONE_RECORDS,
                    "{damage:?} {kind}: a new record stored at offset {offset}, which was acknowledged before"
                );
            }
        }
    }
}
