//! What the bus's socket tests share: a config, a cluster of buses on loopback, waits,
//! a peer in another process, and certificates.

#![allow(dead_code)] // each test file uses a different part of it

use std::time::{Duration, Instant};

use braid_bus::{Bus, BusConfig, Delivery};
use tokio::net::TcpListener;
use tokio::sync::mpsc::UnboundedReceiver;

#[path = "../../src/test_certificates.rs"]
mod test_certificates;

pub(crate) const GRACE: Duration = Duration::from_millis(1_000);

pub(crate) fn config(
    replica: u8,
    addresses: &[std::net::SocketAddr],
    shards: u16,
    links: u16,
) -> BusConfig {
    BusConfig {
        cluster: 7,
        replica,
        addresses: addresses.to_vec(),
        shards,
        links,
        skip_shard_zero: true,
        keys: braid_bus::LinkKeys::Shared(b"cluster secret".to_vec()),
        handshake_grace: GRACE,
        heartbeat_timeout: Duration::from_secs(2),
        queue_frames_max: 4096,
        frame_bytes_max: 1 << 20,
        delivery_bytes_max: 64 << 20,
        incarnation: 0,
        backoff: Duration::from_millis(20),
        tls: None,
    }
}

pub(crate) async fn listeners(n: usize) -> (Vec<TcpListener>, Vec<std::net::SocketAddr>) {
    let mut listeners = Vec::new();
    let mut addresses = Vec::new();
    for _ in 0..n {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        addresses.push(listener.local_addr().unwrap());
        listeners.push(listener);
    }
    (listeners, addresses)
}

pub(crate) async fn cluster(shards: &[u16], links: u16) -> Vec<(Bus, UnboundedReceiver<Delivery>)> {
    cluster_with(shards, links, |_| {}).await
}

pub(crate) async fn wait_until(what: &str, cond: impl Fn() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(
            start.elapsed() < Duration::from_secs(15),
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

pub(crate) async fn all_up<R>(nodes: &[(Bus, R)]) {
    wait_until("every bundle up", || {
        nodes.iter().all(|(bus, _)| {
            (0..nodes.len() as u8)
                .filter(|p| *p != bus.replica())
                .all(|p| bus.bundle_up(p))
        })
    })
    .await;
}

pub(crate) fn certificates() -> braid_bus::TlsConfig {
    let (certificate, private_key, ca) = test_certificates::replica_certificates();
    braid_bus::TlsConfig {
        certificate_chain: vec![certificate],
        private_key,
        ca_certificates: vec![ca],
        server_name: "braid-replica".to_owned(),
    }
}

/// Resident memory of process `pid`, from `/proc`.
pub(crate) fn resident_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    let kib: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kib * 1024
}

/// Starts `braid-bus-peer` as replica 1 (2 links) dialed by `own`; returns the child and
/// the address it listens on.
pub(crate) fn spawn_peer(
    own: std::net::SocketAddr,
    heartbeat: Duration,
    extra: &[&str],
) -> (std::process::Child, std::net::SocketAddr) {
    use std::io::BufRead;
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_braid-bus-peer"))
        .args(["--replica", "1", "--links", "2", "--heartbeat-ms"])
        .arg(heartbeat.as_millis().to_string())
        .args(extra)
        .arg("--peer")
        .arg(own.to_string())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let peer = line
        .trim()
        .strip_prefix("listening ")
        .unwrap()
        .parse()
        .unwrap();
    (child, peer)
}

/// A cluster whose nodes' configs `adjust` changes before they start.
pub(crate) async fn cluster_with(
    shards: &[u16],
    links: u16,
    adjust: impl Fn(&mut BusConfig),
) -> Vec<(Bus, UnboundedReceiver<Delivery>)> {
    let (ls, addresses) = listeners(shards.len()).await;
    ls.into_iter()
        .enumerate()
        .map(|(i, l)| {
            let mut c = config(i as u8, &addresses, shards[i], links);
            adjust(&mut c);
            Bus::start(c, l).unwrap()
        })
        .collect()
}

/// SIGSTOPs the process `pid` and returns how long until `lost` holds.
pub(crate) async fn stop_and_time_the_loss(
    pid: &str,
    what: &str,
    lost: impl Fn() -> bool,
) -> Duration {
    assert!(std::process::Command::new("kill")
        .args(["-STOP", pid])
        .status()
        .unwrap()
        .success());
    let stopped = Instant::now();
    wait_until(what, lost).await;
    stopped.elapsed()
}

/// Handshakes `bus` counted as failed, for any reason.
pub(crate) fn handshake_failures(bus: &Bus) -> u64 {
    bus.metrics()
        .handshake_failures
        .lock()
        .unwrap()
        .values()
        .sum::<u64>()
}
