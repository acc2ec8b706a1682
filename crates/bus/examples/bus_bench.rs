//! Throughput between two nodes over one bundle, k = 1 against k = 4: 4 shards on the
//! sending node each send frames of `--frame-bytes` (64 KiB by default) as fast as the
//! queues take them (waiting for room, not dropping). Medians of
//! `--runs` runs of `--seconds` each; the ratio k=4 / k=1 is the figure.
//!
//! Each sending shard uses its own `ShardSender` and one shared payload buffer; each
//! receiving shard drains its own deliveries (frames are routed to shards by group).
//! With `--on-shards 1` each node runs one current-thread runtime per shard, on its own
//! thread, and every link lives on its owner shard (as in a node); without it both
//! nodes share one two-worker runtime.
//!
//! ```sh
//! cargo run --release -p braid-bus --example bus_bench -- --seconds 3 --runs 3
//! cargo run --release -p braid-bus --example bus_bench -- --seconds 3 --runs 3 --on-shards 1
//! ```

use std::time::{Duration, Instant};

use std::sync::Arc;

use braid_bus::{Bus, BusConfig, DeliveryRoute, Frame};
use bytes::Bytes;
use tokio::net::TcpListener;

#[path = "../tests/support/shard_threads.rs"]
mod shard_threads;
use shard_threads::ShardThreads;

type Res<T> = Result<T, Box<dyn std::error::Error>>;

const SHARDS: u16 = 4;

fn arg(name: &str, default: u64) -> u64 {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn config(replica: u8, addresses: &[std::net::SocketAddr], links: u16) -> BusConfig {
    BusConfig {
        cluster: 1,
        replica,
        addresses: addresses.to_vec(),
        shards: SHARDS,
        links,
        skip_shard_zero: false,
        keys: braid_bus::LinkKeys::Off,
        handshake_grace: Duration::from_secs(2),
        heartbeat_timeout: Duration::from_secs(5),
        queue_frames_max: 256,
        frame_bytes_max: 1 << 20,
        delivery_bytes_max: 64 << 20,
        incarnation: 0,
        backoff: Duration::from_millis(20),
        tls: None,
    }
}

/// Frames per second and MB/s delivered over `seconds`.
async fn run(links: u16, seconds: u64, on_shards: bool, frame_bytes: usize) -> Res<(f64, f64)> {
    let a_listener = TcpListener::bind("127.0.0.1:0").await?;
    let b_listener = TcpListener::bind("127.0.0.1:0").await?;
    let addresses = [a_listener.local_addr()?, b_listener.local_addr()?];
    // Kept alive for the run; dropping them stops the shard threads.
    let threads = if on_shards {
        Some((
            ShardThreads::start(0, SHARDS)?,
            ShardThreads::start(1, SHARDS)?,
        ))
    } else {
        None
    };
    let (a_shards, b_shards) = match &threads {
        Some((a, b)) => (a.handles.clone(), b.handles.clone()),
        None => (Vec::new(), Vec::new()),
    };
    // Group 1 + s belongs to shard s on both nodes.
    let route: DeliveryRoute =
        Arc::new(|group| (group.saturating_sub(1) % u64::from(SHARDS)) as u16);
    let (a, _ra) = Bus::start_on_shards(
        config(0, &addresses, links),
        a_listener,
        a_shards.clone(),
        Arc::clone(&route),
    )?;
    let (b, rb) = Bus::start_on_shards(
        config(1, &addresses, links),
        b_listener,
        b_shards.clone(),
        route,
    )?;
    while !(a.bundle_up(1) && b.bundle_up(0)) {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let mut senders = Vec::new();
    for shard in 0..SHARDS {
        let mut sending = a.shard_sender(shard);
        let sender = async move {
            // One payload buffer, shared by every frame (as one prepare sent to every
            // peer would be).
            let payload = Bytes::from(vec![7u8; frame_bytes]);
            while Instant::now() < deadline {
                let frame = Frame {
                    group: 1 + u64::from(shard),
                    kind: 1,
                    payload: payload.clone(),
                };
                if sending.send_waiting(1, frame).await.is_err() {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
            }
        };
        // Each shard sends from its own thread when there are shard runtimes.
        senders.push(match a_shards.get(usize::from(shard)) {
            Some(handle) => handle.spawn(sender),
            None => tokio::spawn(sender),
        });
    }
    let start = Instant::now();
    // Each receiving shard drains its own deliveries, on its own thread when there are
    // shard runtimes.
    let mut receivers = Vec::new();
    for (shard, mut deliveries) in rb.into_iter().enumerate() {
        let receiver = async move {
            let (mut frames, mut bytes) = (0u64, 0u64);
            let mut batch = Vec::with_capacity(256);
            while Instant::now() < deadline {
                // Whatever is queued at once, as a shard's event loop would take it.
                let wait = deliveries.recv_many(&mut batch, 256);
                match tokio::time::timeout(Duration::from_millis(100), wait).await {
                    Ok(0) => break,
                    Ok(_) => {
                        frames += batch.len() as u64;
                        bytes += batch
                            .iter()
                            .map(|d| d.frame.payload.len() as u64)
                            .sum::<u64>();
                        batch.clear();
                    }
                    Err(_) => {}
                }
            }
            (frames, bytes)
        };
        receivers.push(match b_shards.get(shard) {
            Some(handle) => handle.spawn(receiver),
            None => tokio::spawn(receiver),
        });
    }
    let (mut frames, mut bytes) = (0u64, 0u64);
    for receiver in receivers {
        let (f, b) = receiver.await?;
        frames += f;
        bytes += b;
    }
    let elapsed = start.elapsed().as_secs_f64();
    if std::env::var("BUS_BENCH_DEBUG").is_ok() {
        let m = a.metrics();
        eprintln!(
            "  sent {} frames, up {}, teardowns {}, failures {:?}, receiver up {}",
            m.frames_sent.load(std::sync::atomic::Ordering::Relaxed),
            m.bundles_up.load(std::sync::atomic::Ordering::Relaxed),
            m.teardowns.load(std::sync::atomic::Ordering::Relaxed),
            m.handshake_failures
                .lock()
                .map(|f| f.clone())
                .unwrap_or_default(),
            b.bundle_up(0)
        );
    }
    for sender in senders {
        sender.abort();
    }
    drop(b);
    Ok((frames as f64 / elapsed, bytes as f64 / elapsed / 1e6))
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(|a, b| a.total_cmp(b));
    values[values.len() / 2]
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Res<()> {
    let seconds = arg("--seconds", 3);
    let runs = arg("--runs", 3) as usize;
    let on_shards = arg("--on-shards", 0) != 0;
    let frame_bytes = arg("--frame-bytes", 64 * 1024) as usize;
    let mut results: Vec<(u16, Vec<(f64, f64)>)> = vec![(1, Vec::new()), (4, Vec::new())];
    for run_index in 0..runs {
        // Alternate the order so neither k always runs on a warmer machine.
        let order: [usize; 2] = if run_index % 2 == 0 { [0, 1] } else { [1, 0] };
        for i in order {
            let links = results[i].0;
            let figure = run(links, seconds, on_shards, frame_bytes).await?;
            eprintln!(
                "run {} k = {links}: {:.0} frames/s, {:.0} MB/s",
                run_index + 1,
                figure.0,
                figure.1
            );
            results[i].1.push(figure);
        }
    }
    let mut medians = Vec::new();
    for (links, figures) in &results {
        let mut fps: Vec<f64> = figures.iter().map(|f| f.0).collect();
        let mut mbs: Vec<f64> = figures.iter().map(|f| f.1).collect();
        let (fps, mbs) = (median(&mut fps), median(&mut mbs));
        println!("k = {links}: {fps:.0} frames/s, {mbs:.0} MB/s ({frame_bytes}-byte frames, {SHARDS} sending shards, median of {runs})");
        medians.push(mbs);
    }
    println!("ratio k=4 / k=1: {:.2}", medians[1] / medians[0]);
    Ok(())
}
