//! A bus node in a process of its own, for tests that stop and resume a peer:
//! `braid-bus-peer --replica 1 --peer 127.0.0.1:PORT --links K --heartbeat-ms MS`.
//! It binds 127.0.0.1:0, prints `listening ADDR`, and discards what arrives; with
//! `--hold` it keeps every delivery instead (a node that never drains).

use std::time::Duration;

use braid_bus::{Bus, BusConfig};

fn arg(name: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .cloned()
}

// One thread is plenty for a peer that only discards; it also builds without the
// multi-thread runtime feature, which only the tests and examples enable.
#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let replica: u8 = arg("--replica").ok_or("--replica")?.parse()?;
    let peer: std::net::SocketAddr = arg("--peer").ok_or("--peer")?.parse()?;
    let links: u16 = arg("--links").map_or(Ok(1), |v| v.parse())?;
    let heartbeat_ms: u64 = arg("--heartbeat-ms").map_or(Ok(1000), |v| v.parse())?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let own = listener.local_addr()?;
    println!("listening {own}");
    let mut addresses = vec![peer; 2];
    addresses[usize::from(replica)] = own;
    let config = BusConfig {
        cluster: 7,
        replica,
        addresses,
        shards: 4,
        links,
        skip_shard_zero: true,
        keys: braid_bus::LinkKeys::Shared(b"cluster secret".to_vec()),
        handshake_grace: Duration::from_millis(1000),
        heartbeat_timeout: Duration::from_millis(heartbeat_ms),
        queue_frames_max: 1024,
        frame_bytes_max: 1 << 20,
        delivery_bytes_max: 64 << 20,
        incarnation: 0,
        backoff: Duration::from_millis(20),
        tls: None,
    };
    let hold = std::env::args().any(|a| a == "--hold");
    let (_bus, mut deliveries) = Bus::start(config, listener)?;
    let mut held = Vec::new();
    while let Some(delivery) = deliveries.recv().await {
        if hold {
            held.push(delivery);
        }
    }
    Ok(())
}
