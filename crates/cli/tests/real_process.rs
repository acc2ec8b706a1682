//! Tests that run the real `braid` binary as a separate process.

// A panic in a test is a failed assertion, not a crash on outside data.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use braid_client::{Client, Consumer, ConsumerConfig, Producer, ProducerConfig};
use braid_proto::client::TopicSettings;

const BRAID: &str = env!("CARGO_BIN_EXE_braid");

/// `braid server` on ephemeral loopback ports with `shards` shards in `data_dir`.
fn server_command(data_dir: &Path, shards: u32) -> Command {
    let mut command = Command::new(BRAID);
    command
        .args([
            "server",
            "--client-addr",
            "127.0.0.1:0",
            "--http-addr",
            "127.0.0.1:0",
        ])
        .arg("--shards")
        .arg(shards.to_string())
        .arg("--data-dir")
        .arg(data_dir);
    command
}

/// The client address a starting `braid server` child prints on standard output:
/// "braid listening: client ADDR http ADDR".
fn listening_addr(child: &mut Child) -> SocketAddr {
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    line.split_whitespace()
        .nth(3)
        .expect("the listening line")
        .parse()
        .unwrap()
}

/// A `braid server` child process on ephemeral ports.
struct Server {
    child: Child,
    client: SocketAddr,
}

impl Server {
    fn start(data_dir: &Path) -> Self {
        Self::start_with(data_dir, 2, "warn", Stdio::inherit())
    }

    /// With `shards` shards, logging at `level` to `stderr`.
    fn start_with(data_dir: &Path, shards: u32, level: &str, stderr: Stdio) -> Self {
        let mut child = server_command(data_dir, shards)
            .env("BRAID_LOG", level)
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .unwrap();
        let client = listening_addr(&mut child);
        Self { child, client }
    }

    /// SIGKILL: no shutdown, no flush, no clean close.
    fn kill_9(mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }

    /// SIGTERM and wait for a clean exit.
    fn terminate(mut self) -> std::process::ExitStatus {
        let status = Command::new("kill")
            .arg("-TERM")
            .arg(self.child.id().to_string())
            .status()
            .unwrap();
        assert!(status.success());
        self.child.wait().unwrap()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn fast_group() -> ConsumerConfig {
    ConsumerConfig {
        heartbeat_interval: Duration::from_millis(50),
        auto_commit: None,
        ..ConsumerConfig::default()
    }
}

/// Every record the node acknowledged under fsync=always is there after `kill -9`, and
/// so are committed group offsets.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_loses_no_acknowledged_record_or_committed_offset() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let client = Client::connect(server.client).await.unwrap();
    client.create_stream("s").await.unwrap();
    let settings = TopicSettings {
        partitions: 3,
        fsync: braid_proto::client::FSYNC_ALWAYS,
        ..TopicSettings::default()
    };
    client.create_topic("s", "t", settings).await.unwrap();

    // A group reads the first records and commits.
    let producer = Producer::new(&client, "s", "t", ProducerConfig::default())
        .await
        .unwrap();
    let first: Vec<_> = (0..300u32)
        .map(|i| producer.send(Some(&i.to_be_bytes()), format!("v{i}").as_bytes()))
        .collect();
    for send in first {
        send.await.unwrap();
    }
    let mut group = Consumer::join_group(&client, "s", "t", "g", "m", fast_group())
        .await
        .unwrap();
    let mut read = 0;
    while read < 300 {
        read += group.poll(Duration::from_millis(100)).await.unwrap().len();
    }
    group.commit().await.unwrap();
    let committed = group.positions().clone();

    // Producers keep going; whatever is acknowledged before the kill must survive.
    let acked: std::sync::Arc<std::sync::Mutex<Vec<(u32, u64, String)>>> = Default::default();
    let writer = {
        let acked = std::sync::Arc::clone(&acked);
        let producer = producer.clone();
        tokio::spawn(async move {
            for round in 0u32.. {
                let sends: Vec<_> = (0..50u32)
                    .map(|i| {
                        let value = format!("r{round}-{i}");
                        (
                            value.clone(),
                            producer.send(Some(&(round * 50 + i).to_be_bytes()), value.as_bytes()),
                        )
                    })
                    .collect();
                for (value, send) in sends {
                    match send.await {
                        Ok(meta) => {
                            acked
                                .lock()
                                .unwrap()
                                .push((meta.partition, meta.offset, value))
                        }
                        Err(_) => return,
                    }
                }
            }
        })
    };
    tokio::time::sleep(Duration::from_millis(700)).await;
    server.kill_9();
    let _ = writer.await;
    let acked = acked.lock().unwrap().clone();
    assert!(
        acked.len() > 50,
        "the writer got acknowledgements before the kill: {}",
        acked.len()
    );

    let server = Server::start(dir.path());
    let client = Client::connect(server.client).await.unwrap();
    let mut all = Consumer::all_partitions(&client, "s", "t", ConsumerConfig::default())
        .await
        .unwrap();
    let info = client.describe_topic("s", "t").await.unwrap();
    let ends: BTreeMap<u32, u64> = info
        .partitions
        .iter()
        .map(|p| (p.id, p.high_watermark))
        .collect();
    let mut stored: BTreeMap<(u32, u64), String> = BTreeMap::new();
    while all.positions().iter().any(|(p, o)| *o < ends[p]) {
        for r in all.poll(Duration::from_millis(100)).await.unwrap() {
            stored.insert(
                (r.partition, r.offset),
                String::from_utf8(r.value.unwrap()).unwrap(),
            );
        }
    }
    for (partition, offset, value) in &acked {
        assert_eq!(
            stored.get(&(*partition, *offset)),
            Some(value),
            "acknowledged record {partition}/{offset}"
        );
    }
    let description = client.describe_group("s", "g").await.unwrap();
    for o in description.offsets {
        assert_eq!(
            o.committed,
            committed.get(&o.partition).copied(),
            "committed offset of partition {}",
            o.partition
        );
    }
    assert!(server.terminate().success(), "SIGTERM exits 0");
}

/// The README's tour, run line by line against a real node, so it cannot drift.
#[test]
fn readme_tour_runs() {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../README.md")).unwrap();
    let tour: Vec<&str> = readme
        .split("```sh tour\n")
        .nth(1)
        .expect("README has a ```sh tour block")
        .split("```")
        .next()
        .unwrap()
        .lines()
        .filter(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#'))
        .collect();
    assert!(tour.len() >= 4, "{tour:?}");
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path());
    let bin_dir = Path::new(BRAID).parent().unwrap();
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut transcript = String::new();
    for line in &tour {
        let output = Command::new("sh")
            .arg("-c")
            .arg(line)
            .env("PATH", &path)
            .env("BRAID_ADDR", server.client.to_string())
            .env("BRAID_LOG", "warn")
            .current_dir(dir.path())
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            output.status.success(),
            "`{line}` failed:\n{stdout}\n{stderr}"
        );
        transcript.push_str(&format!("$ {line}\n{stdout}{stderr}"));
    }
    // What the README promises the tour shows.
    for expected in [
        "created stream shop",
        "produced 3 records",
        "alice\tapple",
        "alice\tplum",
        "bob\tpear",
        "billing",
    ] {
        assert!(
            transcript.contains(expected),
            "missing {expected:?} in:\n{transcript}"
        );
    }
    // alice's records keep their order: one key, one partition.
    let apple = transcript.find("alice\tapple").unwrap();
    let plum = transcript.find("alice\tplum").unwrap();
    assert!(apple < plum);
}

/// The README's secured tour, as one script against a real `braid server` started with
/// its `secure.toml` and certificates made here.
#[test]
fn readme_secured_tour_runs() {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../README.md")).unwrap();
    let block = |tag: &str| -> String {
        readme
            .split(tag)
            .nth(1)
            .unwrap_or_else(|| panic!("README has a {tag} block"))
            .split("```")
            .next()
            .unwrap()
            .to_owned()
    };
    let config = block("```toml\nauthentication");
    let script = block("```sh secure-tour\n");
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("secure.toml"),
        format!("authentication{config}"),
    )
    .unwrap();
    {
        use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair};
        let ca_key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca = params.self_signed(&ca_key).unwrap();
        let key = KeyPair::generate().unwrap();
        let node = CertificateParams::new(vec!["localhost".to_owned()])
            .unwrap()
            .signed_by(&key, &ca, &ca_key)
            .unwrap();
        std::fs::write(dir.path().join("ca.pem"), ca.pem()).unwrap();
        std::fs::write(dir.path().join("node.pem"), node.pem()).unwrap();
        std::fs::write(dir.path().join("node-key.pem"), key.serialize_pem()).unwrap();
    }
    let mut child = Command::new(BRAID)
        .args(["server", "--config", "secure.toml"])
        .args(["--client-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"])
        .args(["--shards", "1"])
        .env("BRAID_LOG", "warn")
        .current_dir(dir.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let client = listening_addr(&mut child).to_string();
    let bin_dir = Path::new(BRAID).parent().unwrap();
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let output = Command::new("sh")
        .arg("-ec")
        .arg(&script)
        .env("PATH", &path)
        .env("BRAID_ADDR", &client)
        .env("BRAID_LOG", "warn")
        .env_remove("BRAID_PASSWORD")
        .current_dir(dir.path())
        .output()
        .unwrap();
    child.kill().unwrap();
    child.wait().unwrap();
    let transcript = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(output.status.success(), "the tour failed:\n{transcript}");
    for expected in [
        "created stream vault",
        "created user app",
        "granted write on stream:vault to app",
        "stream:vault",
        "produced 1 records",
        "PermissionDenied",
        "app may not read: refused",
        "changed the password of app",
        "AuthenticationFailed",
        "the old password: refused",
    ] {
        assert!(
            transcript.contains(expected),
            "missing {expected:?} in:\n{transcript}"
        );
    }
}

/// Logs carried ANSI colour codes when standard error was a file or a pipe (journald,
/// a log file). Colour is for terminals only.
#[test]
fn logs_to_a_file_carry_no_colour_codes() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("braid.log");
    let stderr = Stdio::from(std::fs::File::create(&log).unwrap());
    let server = Server::start_with(&dir.path().join("data"), 1, "info", stderr);
    assert!(server.terminate().success());
    let written = std::fs::read_to_string(&log).unwrap();
    assert!(!written.is_empty(), "the server logged at info");
    assert!(
        !written.contains('\u{1b}'),
        "no escape codes in:\n{written}"
    );
}

/// A client command whose reader went away (`braid ... | head`) ends by SIGPIPE, as
/// other command-line tools do; it panicked in `println!` before.
#[test]
fn a_closed_output_pipe_ends_a_command_quietly() {
    use std::os::unix::process::ExitStatusExt;
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("data"));
    let mut child = Command::new(BRAID)
        .args(["--addr", &server.client.to_string(), "cluster", "status"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let output = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.signal(), Some(libc::SIGPIPE), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

/// A CLI error is one line, whatever the environment: with RUST_BACKTRACE set, as many
/// shells have it, every error printed a stack trace of some 30 frames (found by
/// review).
#[test]
fn a_cli_error_is_one_line_even_with_rust_backtrace_set() {
    // Nothing listens on port 1 of loopback.
    let output = Command::new(BRAID)
        .args(["--addr", "127.0.0.1:1", "stream", "list"])
        .env("RUST_BACKTRACE", "1")
        .env_remove("BRAID_ADDR")
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "{stderr}");
    assert!(
        lines[0].starts_with("Error: connecting to 127.0.0.1:1"),
        "{stderr}"
    );
}

/// An outside review of issue 24: a single node whose newest segment was deleted
/// refuses the partition, but `braid consume` (without `--follow`) read the 175 records
/// its log still held, stopped at the log's end as if that were the partition's, and
/// exited 0, while 25 acknowledged records were gone. It now reads what is intact and
/// fails at the end, naming the refusal; `ListOffsets` latest is refused too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consuming_a_refused_partition_to_its_end_fails_instead_of_stopping_short() {
    consume_after_losing_a_segment(|segments| segments.len() - 1).await;
}

/// The same review: a segment deleted from the middle of a single node's partition made
/// it serve nothing at all, though every segment before the gap was whole. It serves
/// the records before the gap and fails there, naming the refusal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_partition_missing_a_middle_segment_serves_the_records_before_it() {
    consume_after_losing_a_segment(|segments| segments.len() / 2).await;
}

/// Fills a single node's partition of small segments, deletes the one `which` picks
/// with the node stopped, restarts it: `braid consume` prints exactly the records
/// before the lost segment, then fails naming the refusal.
async fn consume_after_losing_a_segment(which: fn(&[std::path::PathBuf]) -> usize) {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start_with(dir.path(), 1, "error", Stdio::null());
    let client = Client::connect(server.client).await.unwrap();
    client.create_stream("s").await.unwrap();
    let settings = TopicSettings {
        partitions: 1,
        fsync: braid_proto::client::FSYNC_ALWAYS,
        segment_bytes: 8_192,
        max_batch_bytes: 4_096,
        ..TopicSettings::default()
    };
    client.create_topic("s", "t", settings).await.unwrap();
    let producer = Producer::new(&client, "s", "t", ProducerConfig::default())
        .await
        .unwrap();
    for i in 0..300u32 {
        let value = format!("value-{i}-{}", "z".repeat(60));
        producer.send(None, value.as_bytes()).await.unwrap();
    }
    drop(producer);
    drop(client);
    assert!(server.terminate().success());
    let partition = dir.path().join("partitions").join("0").join("0");
    let mut segments: Vec<_> = std::fs::read_dir(&partition)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "log"))
        .collect();
    segments.sort();
    assert!(segments.len() >= 3, "{segments:?}");
    let lost = &segments[which(&segments)];
    let lost_base: usize = lost.file_stem().unwrap().to_str().unwrap().parse().unwrap();
    assert!(lost_base > 0, "{lost:?}");
    std::fs::remove_file(lost).unwrap();
    let server = Server::start_with(dir.path(), 1, "off", Stdio::null());
    let client = Client::connect(server.client).await.unwrap();
    let latest = client
        .list_offset("s", "t", 0, braid_proto::client::OffsetSpec::Latest)
        .await
        .unwrap_err();
    assert_eq!(
        latest.code(),
        Some(braid_proto::client::ErrorCode::StorageError)
    );
    let output = Command::new(BRAID)
        .args(["consume", "s", "t"])
        .env("BRAID_ADDR", server.client.to_string())
        .env("BRAID_LOG", "off")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    let read = stdout.lines().count();
    assert!(
        !output.status.success(),
        "read {read} records and succeeded"
    );
    assert_eq!(read, lost_base, "the records before the lost segment");
    assert!(stderr.contains("refused"), "{stderr}");
}
