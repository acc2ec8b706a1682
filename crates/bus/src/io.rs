//! The tokio shell around the pure bus pieces: sockets, dialing, accepting, link tasks,
//! bounded queues and metrics. Every decision (placement, admission, bundle state) is
//! made by the pure types; this module only moves bytes and events. It holds the
//! settings and the `Bus` handle; `peer` runs each peer's bundle, `link` each link's
//! reader and writer (with the delivery budget and pings), `dial` and `admission` the
//! two ends of a handshake, and `metrics` the counters.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinHandle;

use crate::bundle::{Backoff, Bundle, BundleAction};
use crate::frame::{
    Frame, FrameError, FRAME_HEADER_BYTES, KIND_BUS_RESERVED, KIND_LINK_TAKEN, KIND_PING,
};
use crate::handshake::{
    accept_preamble, AcceptorAwaitHello, DialerAwaitReply, HandshakeConfig, Refusal, CONFIRM_BYTES,
    HELLO_BYTES, PREAMBLE_BYTES, REPLY_BYTES,
};
use crate::placement::{LayoutError, LinkLayout, INBOUND_HANDSHAKES_MAX, METADATA_LINK};

/// Bytes each delivery is charged beyond its frame, for the memory a queued delivery
/// holds besides its payload.
pub const DELIVERY_OVERHEAD_BYTES: usize = 128;

/// Most bytes a link's writer gathers into one write.
const WRITE_BATCH_BYTES_MAX: usize = 1 << 20;

/// Settings of one node's bus.
#[derive(Debug, Clone)]
pub struct BusConfig {
    /// The cluster id.
    pub cluster: u64,
    /// This node's replica id.
    pub replica: u8,
    /// Every node's replica address, by replica id.
    pub addresses: Vec<SocketAddr>,
    /// This node's shard count.
    pub shards: u16,
    /// Links per peer (k).
    pub links: u16,
    /// Keep links off shard 0 while its range has another shard.
    pub skip_shard_zero: bool,
    /// What the handshake's MACs are keyed with (a key per pair of members, or one
    /// cluster secret, or none).
    pub keys: crate::handshake::LinkKeys,
    /// One admission deadline for preamble and handshake; also how long a bundle may
    /// stay incomplete.
    pub handshake_grace: Duration,
    /// TCP_USER_TIMEOUT of replica sockets: a peer that stopped acknowledging loses its
    /// links after this long.
    pub heartbeat_timeout: Duration,
    /// Frames each link queues before new ones are dropped (and counted).
    pub queue_frames_max: usize,
    /// Largest frame accepted, on receipt and at `send`.
    pub frame_bytes_max: u32,
    /// Bytes of received frames each receiving shard may hold undelivered or
    /// unprocessed (each frame counted with `DELIVERY_OVERHEAD_BYTES` more). When a
    /// shard does not drain its deliveries, the links reading frames for it stop
    /// reading their sockets and TCP pushes back on the peers.
    pub delivery_bytes_max: usize,
    /// Redial backoff.
    pub backoff: Duration,
    /// Mutual TLS on replica links (after the preamble, before the hello); `None`
    /// sends the handshake and frames in the clear.
    pub tls: Option<TlsConfig>,
    /// This process's incarnation, named in every hello so a peer starts a restarted
    /// node a fresh bundle. `Bus::start` replaces it with a fresh random value when it
    /// is 0 (the usual case); a test may set it.
    pub incarnation: u64,
}

/// Certificates for mutual TLS between nodes. Every node presents a certificate for
/// `server_name` signed by one of `ca_certificates`, and accepts only such peers.
#[derive(Debug, Clone)]
pub struct TlsConfig {
    /// The node's certificate chain, DER, leaf first.
    pub certificate_chain: Vec<Vec<u8>>,
    /// The node's private key, PKCS#8 DER.
    pub private_key: Vec<u8>,
    /// The certificate authorities replica certificates are signed by, DER.
    pub ca_certificates: Vec<Vec<u8>>,
    /// The name replica certificates carry.
    pub server_name: String,
}

/// Why the bus could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StartError {
    /// The link layout cannot run.
    #[error(transparent)]
    Layout(#[from] LayoutError),
    /// The TLS settings are unusable.
    #[error("TLS: {0}")]
    Tls(String),
    /// The shard runtimes given do not match the configured shard count.
    #[error("{got} shard runtimes for {expected} shards")]
    Shards {
        /// The configured shard count.
        expected: u16,
        /// Runtimes given.
        got: usize,
    },
}

/// Which runtime each link lives on: the owner shard's, when the bus runs on shards.
struct Placement {
    layout: LinkLayout,
    replica: u8,
    shards: Vec<tokio::runtime::Handle>,
}

impl Placement {
    /// The peer's slot among this node's peers (ids in order, this node left out).
    fn slot(&self, peer: u8) -> u8 {
        if peer > self.replica {
            peer - 1
        } else {
            peer
        }
    }

    /// The owner shard's runtime for `link` to `peer`, if the bus runs on shards.
    fn owner(&self, link: u16, peer: u8) -> Option<&tokio::runtime::Handle> {
        let shard = self.layout.link_owner(link, self.slot(peer));
        self.shards.get(usize::from(shard))
    }

    fn spawn<F>(&self, link: u16, peer: u8, task: F) -> JoinHandle<F::Output>
    where
        F: std::future::Future + Send + 'static,
        F::Output: Send + 'static,
    {
        match self.owner(link, peer) {
            Some(handle) => handle.spawn(task),
            None => tokio::spawn(task),
        }
    }
}

/// Anything a link can run over: plain TCP or TLS.
trait LinkStream: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send> LinkStream for T {}
type BoxStream = Box<dyn LinkStream>;

/// Built once at start: the two TLS roles.
#[derive(Clone)]
struct Tls {
    connector: tokio_rustls::TlsConnector,
    acceptor: tokio_rustls::TlsAcceptor,
    server_name: rustls::pki_types::ServerName<'static>,
}

fn build_tls(config: &TlsConfig) -> Result<Tls, StartError> {
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};
    let bad = |e: &dyn std::fmt::Display| StartError::Tls(e.to_string());
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    for ca in &config.ca_certificates {
        roots
            .add(CertificateDer::from(ca.clone()))
            .map_err(|e| bad(&e))?;
    }
    let roots = std::sync::Arc::new(roots);
    let chain: Vec<CertificateDer<'static>> = config
        .certificate_chain
        .iter()
        .map(|c| CertificateDer::from(c.clone()))
        .collect();
    let key = || PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(config.private_key.clone()));
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        std::sync::Arc::clone(&roots),
        std::sync::Arc::clone(&provider),
    )
    .build()
    .map_err(|e| bad(&e))?;
    let server = rustls::ServerConfig::builder_with_provider(std::sync::Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .map_err(|e| bad(&e))?
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain.clone(), key())
        .map_err(|e| bad(&e))?;
    let client = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| bad(&e))?
        .with_root_certificates(roots)
        .with_client_auth_cert(chain, key())
        .map_err(|e| bad(&e))?;
    let server_name = ServerName::try_from(config.server_name.clone()).map_err(|e| bad(&e))?;
    Ok(Tls {
        connector: tokio_rustls::TlsConnector::from(std::sync::Arc::new(client)),
        acceptor: tokio_rustls::TlsAcceptor::from(std::sync::Arc::new(server)),
        server_name,
    })
}

/// The shard a received frame of `group` belongs to: the node's placement rule, the same
/// on every node. The bus hands each frame to that shard's receiver.
pub type DeliveryRoute = Arc<dyn Fn(u64) -> u16 + Send + Sync>;

/// A frame that arrived, with where it came from.
#[derive(Debug)]
pub struct Delivery {
    /// The sending replica.
    pub peer: u8,
    /// The link it came over.
    pub link: u16,
    /// The frame.
    pub frame: Frame,
    /// The name of the thread that read it (the link owner shard's, when the bus runs
    /// on shards).
    pub read_on: Option<Arc<str>>,
    /// The frame's share of `delivery_bytes_max`, returned when the delivery is dropped:
    /// a consumer that keeps deliveries keeps links from reading.
    _budget: BudgetShare,
}

/// A bundle to a peer came up or went down. Consensus retransmits at once on `up`
/// instead of waiting for a timeout: frames queued to the old generation may be lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BundleEvent {
    /// The peer.
    pub peer: u8,
    /// The bundle's generation.
    pub generation: u32,
    /// Whether it came up (else it went down).
    pub up: bool,
}

/// Bundle events buffered per subscriber; a slower one misses the oldest (it can still
/// read `Bus::bundle_up`).
const BUNDLE_EVENTS_BUFFERED: usize = 256;

/// Why a frame was not queued.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SendError {
    /// The bundle to that peer is not complete.
    #[error("bundle to replica {0} is down")]
    BundleDown(u8),
    /// The link's queue is full: the frame was dropped (consensus retransmits).
    #[error("queue full: frame dropped")]
    QueueFull,
    /// The link to that peer closed while the frame was being queued (a teardown): it
    /// was dropped and counted in `frames_lost_at_teardown`.
    #[error("link to replica {0} closed: frame dropped")]
    LinkClosed(u8),
    /// The frame is larger than `frame_bytes_max`: the peer would refuse it and close
    /// the link, so it is refused here.
    #[error("frame of {bytes} bytes exceeds the limit of {max}")]
    FrameTooLarge {
        /// The frame's length field (bytes after the length).
        bytes: u64,
        /// The limit.
        max: u32,
    },
    /// No such peer.
    #[error("no peer {0}")]
    NoPeer(u8),
    /// Frame kinds from `KIND_BUS_RESERVED` up belong to the bus.
    #[error("frame kind {0:#x} is reserved for the bus")]
    ReservedKind(u8),
}

enum PeerEvent {
    LinkUp {
        link: u16,
        generation: u32,
        incarnation: u64,
        stream: BoxStream,
    },
    LinkClosed {
        link: u16,
        generation: u32,
    },
    Kill(u16),
}

/// The queue of each link to a peer, while the link is up.
type LinkQueues = Vec<Option<mpsc::Sender<Frame>>>;

struct Peer {
    complete: AtomicBool,
    /// Moves whenever `queues` changes, so a shard's cached queue handles are reloaded
    /// only then: the send path takes the lock once per bundle generation, not per frame.
    epoch: AtomicU64,
    bundle_events: tokio::sync::broadcast::Sender<BundleEvent>,
    queues: Mutex<LinkQueues>,
    events: mpsc::UnboundedSender<PeerEvent>,
    /// Generation, teardowns and when the bundle last went up or down (see `status`).
    record: Mutex<status::PeerRecord>,
}

/// A node's replica bus.
#[derive(Debug)]
pub struct Bus {
    bundle_events: tokio::sync::broadcast::Sender<BundleEvent>,
    layout: LinkLayout,
    replica: u8,
    frame_bytes_max: u32,
    peers: Vec<Option<Arc<PeerHandle>>>,
    metrics: Arc<BusMetrics>,
    tasks: Vec<JoinHandle<()>>,
    local: SocketAddr,
}

/// The shared part of a peer (public only through [`Bus`]).
#[derive(Debug)]
pub struct PeerHandle {
    inner: Peer,
}

impl std::fmt::Debug for Peer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Peer")
            .field("complete", &self.complete)
            .finish()
    }
}

fn random_nonce() -> [u8; 16] {
    use std::hash::{BuildHasher, Hasher};
    // RandomState is seeded from the OS's randomness per instance: enough for a nonce
    // that must not repeat, without another dependency.
    let mut out = [0u8; 16];
    for chunk in out.chunks_mut(8) {
        let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
        hasher.write_u64(0);
        chunk.copy_from_slice(&hasher.finish().to_be_bytes());
    }
    out
}

fn tune(stream: &TcpStream, heartbeat_timeout: Duration) {
    let _ = stream.set_nodelay(true);
    // TCP_USER_TIMEOUT exists on Linux, Android and Fuchsia only; elsewhere a dead peer
    // is found by the heartbeat timeout of consensus.
    #[cfg(any(target_os = "linux", target_os = "android", target_os = "fuchsia"))]
    {
        let socket = socket2::SockRef::from(stream);
        let _ = socket.set_tcp_user_timeout(Some(heartbeat_timeout));
    }
    #[cfg(not(any(target_os = "linux", target_os = "android", target_os = "fuchsia")))]
    let _ = heartbeat_timeout;
}

/// Connects to `addr` from this node's own replica address (its IP, any port), so the
/// acceptor sees the address it knows this node by.
async fn connect_from(own: Option<SocketAddr>, addr: SocketAddr) -> std::io::Result<TcpStream> {
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    if let Some(own) =
        own.filter(|own| !own.ip().is_unspecified() && own.is_ipv4() == addr.is_ipv4())
    {
        socket.bind(SocketAddr::new(own.ip(), 0))?;
    }
    socket.connect(addr).await
}

/// Whether an inbound socket comes from the IP of a configured peer.
fn from_a_peer(config: &BusConfig, remote: SocketAddr) -> bool {
    config
        .addresses
        .iter()
        .enumerate()
        .any(|(id, addr)| id != usize::from(config.replica) && addr.ip() == remote.ip())
}

fn handshake_config(config: &BusConfig) -> HandshakeConfig {
    HandshakeConfig {
        cluster: config.cluster,
        replica: config.replica,
        replica_count: config.addresses.len() as u8,
        links: config.links,
        capabilities: crate::handshake::CAPABILITY_LIGHT_FRAMES,
        keys: config.keys.clone(),
        incarnation: config.incarnation,
    }
}

impl Bus {
    /// Starts the bus on `listener` (bound to this node's replica address): accepts
    /// links, dials the peers with a higher id, and delivers every frame that arrives
    /// to the returned receiver.
    ///
    /// # Errors
    /// [`StartError`] if the link layout cannot run or the TLS settings are unusable.
    pub fn start(
        config: BusConfig,
        listener: TcpListener,
    ) -> Result<(Self, mpsc::UnboundedReceiver<Delivery>), StartError> {
        let (bus, mut receivers) = Self::start_inner(config, listener, Vec::new(), None)?;
        let deliveries = receivers.pop().ok_or(StartError::Shards {
            expected: 1,
            got: 0,
        })?;
        Ok((bus, deliveries))
    }

    /// As [`Bus::start`], with one runtime per shard: each link (its dial, its
    /// handshake, its reader and writer) runs on its owner shard's runtime; the runtime
    /// `start_on_shards` is called on (shard 0's) accepts, reads the preamble and hands
    /// the socket over. Each shard gets its own receiver: a frame goes to the one
    /// `route` names for its group, so no shard reads another's frames from a shared
    /// channel.
    ///
    /// # Errors
    /// As [`Bus::start`], and [`StartError::Shards`] if the runtimes do not match the
    /// shard count.
    pub fn start_on_shards(
        config: BusConfig,
        listener: TcpListener,
        shards: Vec<tokio::runtime::Handle>,
        route: DeliveryRoute,
    ) -> Result<(Self, Vec<mpsc::UnboundedReceiver<Delivery>>), StartError> {
        Self::start_inner(config, listener, shards, Some(route))
    }

    fn start_inner(
        config: BusConfig,
        listener: TcpListener,
        shards: Vec<tokio::runtime::Handle>,
        route: Option<DeliveryRoute>,
    ) -> Result<(Self, Vec<mpsc::UnboundedReceiver<Delivery>>), StartError> {
        if !shards.is_empty() && shards.len() != usize::from(config.shards) {
            return Err(StartError::Shards {
                expected: config.shards,
                got: shards.len(),
            });
        }
        let mut config = config;
        if config.incarnation == 0 {
            let nonce = random_nonce();
            let mut word = [0u8; 8];
            word.copy_from_slice(&nonce[..8]);
            config.incarnation = u64::from_be_bytes(word).max(1);
        }
        let tls = Arc::new(match &config.tls {
            Some(settings) => Some(build_tls(settings)?),
            None => None,
        });
        let peers_count = config.addresses.len().saturating_sub(1);
        let layout = LinkLayout::new(
            config.shards,
            config.links,
            config.skip_shard_zero,
            peers_count,
        )?;
        let undersized = layout.undersized_links(peers_count);
        if !undersized.is_empty() {
            tracing::warn!(
                shards = config.shards,
                links = config.links,
                peers = peers_count,
                ?undersized,
                "replica links share owner shards: each shard range needs as many usable shards as peers"
            );
        }
        let metrics = Arc::new(BusMetrics::new(
            config.addresses.len(),
            config.links,
            config.shards,
        ));
        let placement = Arc::new(Placement {
            layout,
            replica: config.replica,
            shards,
        });
        // Each channel is unbounded in count but not in bytes: every delivery holds its
        // share of its shard's budget until the consumer drops it.
        let receiving_shards = if route.is_some() {
            usize::from(config.shards.max(1))
        } else {
            1
        };
        let mut targets = Vec::new();
        let mut deliveries = Vec::new();
        for _ in 0..receiving_shards {
            let (channel, receiver) = mpsc::unbounded_channel();
            targets.push(DeliveryTarget {
                channel,
                budget: Arc::new(DeliveryBudget {
                    held: AtomicUsize::new(0),
                    max: config.delivery_bytes_max.max(1),
                    waiting: AtomicUsize::new(0),
                    freed: tokio::sync::Notify::new(),
                }),
            });
            deliveries.push(receiver);
        }
        let deliver = Deliver {
            targets: Arc::new(targets),
            route,
        };
        let config = Arc::new(config);
        let local = listener
            .local_addr()
            .unwrap_or_else(|_| SocketAddr::from(([127, 0, 0, 1], 0)));
        let mut peers = Vec::new();
        let mut tasks = Vec::new();
        let mut receivers = Vec::new();
        let (bundle_events, _) = tokio::sync::broadcast::channel(BUNDLE_EVENTS_BUFFERED);
        for id in 0..config.addresses.len() as u8 {
            if id == config.replica {
                peers.push(None);
                receivers.push(None);
                continue;
            }
            let (events, rx) = mpsc::unbounded_channel();
            let handle = Arc::new(PeerHandle {
                inner: Peer {
                    complete: AtomicBool::new(false),
                    epoch: AtomicU64::new(0),
                    bundle_events: bundle_events.clone(),
                    queues: Mutex::new(vec![None; usize::from(config.links)]),
                    events,
                    record: Mutex::new(status::PeerRecord::new()),
                },
            });
            peers.push(Some(Arc::clone(&handle)));
            receivers.push(Some((handle, rx)));
        }
        let peer_list: Arc<Vec<Option<Arc<PeerHandle>>>> = Arc::new(peers.clone());
        for (id, slot) in receivers.into_iter().enumerate() {
            if let Some((handle, rx)) = slot {
                let task = tokio::spawn(manage_peer(
                    Arc::clone(&config),
                    Arc::clone(&tls),
                    Arc::clone(&placement),
                    id as u8,
                    handle,
                    rx,
                    Arc::clone(&metrics),
                    deliver.clone(),
                ));
                tasks.push(task);
            }
        }
        tasks.push(tokio::spawn(accept_loop(
            Arc::clone(&config),
            Arc::clone(&tls),
            Arc::clone(&placement),
            listener,
            peer_list,
            Arc::clone(&metrics),
        )));
        let bus = Self {
            bundle_events,
            layout,
            replica: config.replica,
            frame_bytes_max: config.frame_bytes_max,
            peers,
            metrics,
            tasks,
            local,
        };
        Ok((bus, deliveries))
    }

    /// The address the bus listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// The counters.
    pub fn metrics(&self) -> &BusMetrics {
        &self.metrics
    }

    /// The counters, shared (for an exporter on another thread).
    pub fn metrics_handle(&self) -> Arc<BusMetrics> {
        Arc::clone(&self.metrics)
    }

    /// The link layout.
    pub fn layout(&self) -> &LinkLayout {
        &self.layout
    }

    fn peer(&self, peer: u8) -> Result<&Peer, SendError> {
        self.peers
            .get(usize::from(peer))
            .and_then(|p| p.as_ref())
            .map(|p| &p.inner)
            .ok_or(SendError::NoPeer(peer))
    }

    /// (frames sent, bytes sent, frames received, bytes received) over the links
    /// `shard` owns: the per-shard view of the per-link counters.
    pub fn shard_link_counts(&self, shard: u16) -> (u64, u64, u64, u64) {
        let links = self.layout.links();
        let mut total = (0, 0, 0, 0);
        for (slot, peer) in (0..self.peers.len() as u8)
            .filter(|p| *p != self.replica)
            .enumerate()
        {
            for link in 0..links {
                if self.layout.link_owner(link, slot as u8) != shard {
                    continue;
                }
                let (a, b, c, d) = self.metrics.link_counts(peer, link, links);
                total = (total.0 + a, total.1 + b, total.2 + c, total.3 + d);
            }
        }
        total
    }

    /// Bundle up and down events from now on, for every peer.
    pub fn subscribe(&self) -> tokio::sync::broadcast::Receiver<BundleEvent> {
        self.bundle_events.subscribe()
    }

    /// Whether the bundle to `peer` is complete.
    pub fn bundle_up(&self, peer: u8) -> bool {
        self.peer(peer)
            .is_ok_and(|p| p.complete.load(Ordering::Acquire))
    }

    /// Queues a frame from `shard` to `peer` on the link of the shard's range; never
    /// blocks: a full queue drops the frame and counts it. This looks the link's queue
    /// up under the peer's lock; a shard's hot path uses its own [`ShardSender`].
    ///
    /// # Errors
    /// [`SendError`].
    pub fn send(&self, shard: u16, peer: u8, frame: Frame) -> Result<(), SendError> {
        let queue = self.queue(shard, peer, &frame)?;
        self.metrics.try_queue(&queue, shard, peer, frame)
    }

    /// As [`Bus::send`], but waits for room in the link's queue instead of dropping:
    /// for callers that want backpressure (bulk transfer, benchmarks) rather than the
    /// drop-and-retransmit that consensus prefers.
    ///
    /// # Errors
    /// [`SendError::BundleDown`] or [`SendError::NoPeer`].
    pub async fn send_waiting(&self, shard: u16, peer: u8, frame: Frame) -> Result<(), SendError> {
        let queue = self.queue(shard, peer, &frame)?;
        self.metrics.queue_waiting(&queue, peer, frame).await
    }

    /// A handle for `shard`'s own sends: it keeps its links' queues and looks them up
    /// again only when a bundle's generation changes, so sends from different shards
    /// share no lock. Cloning a frame shares its payload, so one prepare goes to every
    /// peer as one buffer.
    pub fn shard_sender(&self, shard: u16) -> ShardSender {
        ShardSender {
            shard,
            peers: self.peers.clone(),
            cached: vec![None; self.peers.len()],
            layout: self.layout,
            frame_bytes_max: self.frame_bytes_max,
            metrics: Arc::clone(&self.metrics),
        }
    }

    /// The queue of the link `frame` from `shard` takes to `peer`: link 0 for metadata,
    /// else the shard range's link; refused (and counted) while the bundle is down.
    fn queue(&self, shard: u16, peer: u8, frame: &Frame) -> Result<mpsc::Sender<Frame>, SendError> {
        let link = admit_frame(
            &self.layout,
            self.frame_bytes_max,
            &self.metrics,
            shard,
            frame,
        )?;
        let p = self.peer(peer)?;
        let queue = if p.complete.load(Ordering::Acquire) {
            p.queues
                .lock()
                .ok()
                .and_then(|q| q.get(usize::from(link)).cloned().flatten())
        } else {
            None
        };
        queue.ok_or_else(|| self.metrics.bundle_down(shard, peer))
    }

    /// Closes one link to `peer` (as a failure would): the whole bundle is torn down on
    /// both sides and dialed again.
    pub fn kill_link(&self, peer: u8, link: u16) {
        if let Ok(p) = self.peer(peer) {
            let _ = p.events.send(PeerEvent::Kill(link));
        }
    }

    /// This node's replica id.
    pub fn replica(&self) -> u8 {
        self.replica
    }
}

/// The link a frame from `shard` takes (link 0 for the metadata group, else the shard
/// range's), once it passes the checks every send makes: not a bus kind, not too large.
fn admit_frame(
    layout: &LinkLayout,
    frame_bytes_max: u32,
    metrics: &BusMetrics,
    shard: u16,
    frame: &Frame,
) -> Result<u16, SendError> {
    if frame.kind >= KIND_BUS_RESERVED {
        return Err(SendError::ReservedKind(frame.kind));
    }
    let bytes = frame.length_field();
    if bytes > u64::from(frame_bytes_max) {
        metrics
            .frames_refused_too_large
            .fetch_add(1, Ordering::Relaxed);
        return Err(SendError::FrameTooLarge {
            bytes,
            max: frame_bytes_max,
        });
    }
    Ok(if frame.group == 0 {
        METADATA_LINK
    } else {
        layout.range_of(shard)
    })
}

/// One shard's handle for sending (see [`Bus::shard_sender`]). Owned by its shard:
/// sending takes `&mut self`.
#[derive(Debug)]
pub struct ShardSender {
    shard: u16,
    peers: Vec<Option<Arc<PeerHandle>>>,
    /// Per peer: the epoch the queues were loaded at, and the queue of each link.
    cached: Vec<Option<(u64, LinkQueues)>>,
    layout: LinkLayout,
    frame_bytes_max: u32,
    metrics: Arc<BusMetrics>,
}

impl ShardSender {
    /// As [`Bus::send`], from this handle's shard.
    ///
    /// # Errors
    /// [`SendError`].
    pub fn send(&mut self, peer: u8, frame: Frame) -> Result<(), SendError> {
        let link = self.refresh(peer, &frame)?;
        match cached_queue(&self.cached, peer, link) {
            Some(queue) => self.metrics.try_queue(queue, self.shard, peer, frame),
            None => Err(self.metrics.bundle_down(self.shard, peer)),
        }
    }

    /// As [`Bus::send_waiting`], from this handle's shard.
    ///
    /// # Errors
    /// [`SendError::BundleDown`] or [`SendError::NoPeer`].
    pub async fn send_waiting(&mut self, peer: u8, frame: Frame) -> Result<(), SendError> {
        let link = self.refresh(peer, &frame)?;
        match cached_queue(&self.cached, peer, link) {
            Some(queue) => self.metrics.queue_waiting(queue, peer, frame).await,
            None => Err(self.metrics.bundle_down(self.shard, peer)),
        }
    }

    /// Admits `frame` and returns its link, first reloading the peer's queues if its
    /// epoch moved (a link installed or a bundle torn down).
    fn refresh(&mut self, peer: u8, frame: &Frame) -> Result<u16, SendError> {
        let link = admit_frame(
            &self.layout,
            self.frame_bytes_max,
            &self.metrics,
            self.shard,
            frame,
        )?;
        let index = usize::from(peer);
        let p = &self
            .peers
            .get(index)
            .and_then(|p| p.as_ref())
            .ok_or(SendError::NoPeer(peer))?
            .inner;
        if !p.complete.load(Ordering::Acquire) {
            return Err(self.metrics.bundle_down(self.shard, peer));
        }
        let epoch = p.epoch.load(Ordering::Acquire);
        let cached = &mut self.cached[index];
        if cached.as_ref().is_none_or(|(at, _)| *at != epoch) {
            let queues = p.queues.lock().map(|q| q.clone()).unwrap_or_default();
            *cached = Some((epoch, queues));
        }
        Ok(link)
    }
}

/// A shard's cached queue of `link` to `peer`, borrowed: no handle is cloned per send.
fn cached_queue(
    cached: &[Option<(u64, LinkQueues)>],
    peer: u8,
    link: u16,
) -> Option<&mpsc::Sender<Frame>> {
    cached
        .get(usize::from(peer))?
        .as_ref()?
        .1
        .get(usize::from(link))?
        .as_ref()
}

impl BusMetrics {
    /// Queues without waiting; a full queue drops the frame, a closed one loses it,
    /// each counted.
    fn try_queue(
        &self,
        queue: &mpsc::Sender<Frame>,
        shard: u16,
        peer: u8,
        frame: Frame,
    ) -> Result<(), SendError> {
        queue.try_send(frame).map_err(|err| match err {
            mpsc::error::TrySendError::Full(_) => {
                self.frames_dropped.fetch_add(1, Ordering::Relaxed);
                self.shard_failed(shard, 0);
                SendError::QueueFull
            }
            mpsc::error::TrySendError::Closed(_) => {
                self.frames_lost_at_teardown.fetch_add(1, Ordering::Relaxed);
                self.shard_failed(shard, 2);
                SendError::LinkClosed(peer)
            }
        })
    }

    async fn queue_waiting(
        &self,
        queue: &mpsc::Sender<Frame>,
        peer: u8,
        frame: Frame,
    ) -> Result<(), SendError> {
        queue.send(frame).await.map_err(|_| {
            self.frames_lost_at_teardown.fetch_add(1, Ordering::Relaxed);
            SendError::LinkClosed(peer)
        })
    }

    /// Counts a send refused while the bundle is down.
    fn bundle_down(&self, shard: u16, peer: u8) -> SendError {
        self.frames_refused_bundle_down
            .fetch_add(1, Ordering::Relaxed);
        self.shard_failed(shard, 1);
        SendError::BundleDown(peer)
    }
}

impl Drop for Bus {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

mod admission;
mod dial;
mod link;
mod metrics;
mod peer;
mod status;

use admission::accept_loop;
use dial::dial;
use link::{spawn_link, BudgetShare, Deliver, DeliveryBudget, DeliveryTarget};
use metrics::reason;
pub use metrics::BusMetrics;
use peer::{manage_peer, LinkTasks};
pub use status::{BusView, PeerStatus};
