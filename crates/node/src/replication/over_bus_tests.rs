//! The metadata group replicated by three in-process nodes over the real replica bus
//! (TCP on 127.0.0.1, the authenticated hello), each with its own data directory: one
//! node stops and comes back, then the primary stops, and every acknowledged op ends
//! on all three.

use std::collections::HashMap;
use std::time::Duration;

use braid_bus::{Bus, BusConfig};
use braid_vsr::{Config, Input, Message, Reply, Request, Status};
use tokio::sync::{mpsc, oneshot, watch};

use super::machine::MetadataMachine;
use super::shard_host::{Effects, ShardHost};
use super::wire;
use crate::metadata::{op, MetaOp, Metadata};

/// What the test asks a node.
enum Ask {
    Request(Message, oneshot::Sender<Reply>),
    Status(oneshot::Sender<(Status, bool, Metadata, u64)>),
}

struct NodeHandle {
    asks: mpsc::Sender<Ask>,
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

fn bus_config(replica: u8, addresses: &[std::net::SocketAddr]) -> BusConfig {
    BusConfig {
        cluster: 42,
        replica,
        addresses: addresses.to_vec(),
        shards: 1,
        links: 1,
        skip_shard_zero: false,
        keys: braid_bus::LinkKeys::Shared(b"a cluster secret of some length".to_vec()),
        handshake_grace: Duration::from_secs(1),
        heartbeat_timeout: Duration::from_secs(2),
        queue_frames_max: 4096,
        frame_bytes_max: 1 << 20,
        delivery_bytes_max: 64 << 20,
        incarnation: 0,
        backoff: Duration::from_millis(20),
        tls: None,
    }
}

/// Runs one node: its bus, its group host, a 5 ms tick.
async fn start(
    replica: u8,
    dir: std::path::PathBuf,
    addresses: Vec<std::net::SocketAddr>,
) -> NodeHandle {
    let listener = loop {
        // The address of a stopped node may take a moment to be free again.
        match tokio::net::TcpListener::bind(addresses[replica as usize]).await {
            Ok(listener) => break listener,
            Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    };
    let (bus, mut deliveries) = Bus::start(bus_config(replica, &addresses), listener).unwrap();
    let config = Config::new(0, replica, 3, u64::from(replica) + 1);
    let mut host = ShardHost::open(&dir, 0).unwrap();
    host.add_group(config, MetadataMachine::default()).unwrap();
    let (asks, mut asked) = mpsc::channel::<Ask>(64);
    let (stop, mut stopped) = watch::channel(false);
    let task = tokio::spawn(async move {
        let mut waiting: HashMap<(u64, u64), oneshot::Sender<Reply>> = HashMap::new();
        let mut ticker = tokio::time::interval(Duration::from_millis(5));
        let mut now = 0u64;
        let carry =
            |effects: Effects, waiting: &mut HashMap<(u64, u64), oneshot::Sender<Reply>>| {
                for (group, to, message) in effects.sends {
                    // A full or down link drops the frame: consensus retransmits.
                    let _ = bus.send(0, to, wire::frame(group, &message));
                }
                for (_, reply) in effects.replies {
                    // Matched by (register?, request number): one client per test.
                    if let Some(waiter) =
                        waiting.remove(&(u64::from(reply.register), reply.request))
                    {
                        let _ = waiter.send(reply);
                    }
                }
            };
        loop {
            let input = tokio::select! {
                _ = stopped.changed() => break,
                _ = ticker.tick() => {
                    now += 1;
                    Input::Tick
                }
                Some(delivery) = deliveries.recv() => match wire::message(&delivery) {
                    Ok((_, message)) => Input::Message(message),
                    Err(err) => panic!("a bad frame between honest nodes: {err}"),
                },
                Some(ask) = asked.recv() => match ask {
                    Ask::Request(message, reply) => {
                        if let Message::Request(r) = &message {
                            waiting.insert((u64::from(r.session == 0), r.request), reply);
                        }
                        Input::Message(message)
                    }
                    Ask::Status(answer) => {
                        let Some(replica) = host.replica(0) else { continue };
                        let state = replica.state().machine().state().clone();
                        let _ = answer.send((replica.status(), replica.is_primary(), state, replica.view()));
                        continue;
                    }
                },
            };
            let effects = match input {
                Input::Tick => host.tick(now).unwrap(),
                input => host.step(now, vec![(0, input)]).unwrap(),
            };
            carry(effects, &mut waiting);
        }
    });
    NodeHandle { asks, stop, task }
}

impl NodeHandle {
    async fn status(&self) -> Option<(Status, bool, Metadata, u64)> {
        let (tx, rx) = oneshot::channel();
        self.asks.send(Ask::Status(tx)).await.ok()?;
        rx.await.ok()
    }

    async fn stop(self) {
        let _ = self.stop.send(true);
        let _ = self.task.await;
    }
}

struct Cluster {
    dirs: Vec<tempfile::TempDir>,
    addresses: Vec<std::net::SocketAddr>,
    nodes: Vec<Option<NodeHandle>>,
    client: u64,
    session: u64,
    next: u64,
}

impl Cluster {
    async fn primary(&self) -> usize {
        for _ in 0..2_000 {
            for (i, node) in self.nodes.iter().enumerate() {
                if let Some(node) = node {
                    if let Some((Status::Normal, true, _, _)) = node.status().await {
                        return i;
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        panic!("no primary");
    }

    /// Sends `body` (with `request`) to the primary until it answers.
    async fn request(&mut self, session: u64, request: u64, body: Vec<u8>) -> Reply {
        for _ in 0..50 {
            let primary = self.primary().await;
            let message = Message::Request(Request {
                client: self.client,
                session,
                request,
                body: body.clone().into(),
            });
            let (tx, rx) = oneshot::channel();
            let Some(node) = &self.nodes[primary] else {
                continue;
            };
            if node.asks.send(Ask::Request(message, tx)).await.is_err() {
                continue;
            }
            if let Ok(Ok(reply)) = tokio::time::timeout(Duration::from_secs(2), rx).await {
                return reply;
            }
        }
        panic!("request {request} never answered");
    }

    async fn propose(&mut self, op: &MetaOp) -> Reply {
        let request = self.next;
        self.next += 1;
        self.request(
            self.session,
            request,
            MetadataMachine::input(std::slice::from_ref(op)),
        )
        .await
    }

    async fn restart(&mut self, i: usize) {
        if let Some(node) = self.nodes[i].take() {
            node.stop().await;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        let dir = self.dirs[i].path().to_owned();
        self.nodes[i] = Some(start(i as u8, dir, self.addresses.clone()).await);
    }
}

#[tokio::test]
async fn the_metadata_group_replicates_over_the_bus_through_restarts() {
    let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    // Reserve three loopback addresses.
    let mut addresses = Vec::new();
    for _ in 0..3 {
        let probe = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        addresses.push(probe.local_addr().unwrap());
    }
    let mut nodes = Vec::new();
    for (i, dir) in dirs.iter().enumerate() {
        nodes.push(Some(
            start(i as u8, dir.path().to_owned(), addresses.clone()).await,
        ));
    }
    let mut cluster = Cluster {
        dirs,
        addresses,
        nodes,
        client: 77,
        session: 0,
        next: 1,
    };
    cluster.session = cluster.request(0, 1, Vec::new()).await.session;
    for i in 0..30 {
        let reply = cluster
            .propose(&MetaOp::CreateStream(op::CreateStream {
                name: format!("s{i}"),
            }))
            .await;
        MetadataMachine::outcome(&reply.result.unwrap()).unwrap();
        if i == 10 {
            let backup = (cluster.primary().await + 1) % 3;
            cluster.restart(backup).await;
        }
        if i == 20 {
            let primary = cluster.primary().await;
            cluster.restart(primary).await;
        }
    }
    // Every node ends normal with the same 30 streams.
    let mut states = Vec::new();
    let mut views = Vec::new();
    for _ in 0..400 {
        states.clear();
        views.clear();
        for node in cluster.nodes.iter().flatten() {
            if let Some((Status::Normal, _, state, view)) = node.status().await {
                states.push(state);
                views.push(view);
            }
        }
        if states.len() == 3 && states.iter().all(|s| s.streams.len() == 30) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(states.len(), 3, "every node normal");
    assert!(
        views.iter().all(|v| *v > 0),
        "the primary's restart changed the view: {views:?}"
    );
    assert!(
        states
            .iter()
            .all(|s| s.streams.len() == 30 && s == &states[0]),
        "the nodes disagree: {:?}",
        states.iter().map(|s| s.streams.len()).collect::<Vec<_>>()
    );
    for node in cluster.nodes.into_iter().flatten() {
        node.stop().await;
    }
}
