//! The tokio shell around the pure bus pieces: sockets, dialing, accepting, link tasks,
//! bounded queues and metrics. Every decision (placement, admission, bundle state) is
//! made by the pure types; this module only moves bytes and events.
//!
//! This first shell runs on one tokio runtime per node; placing each link on its owner
//! shard's runtime comes with the node integration. TLS is not wired yet.

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
    /// The cluster secret; `None` turns the handshake MAC off.
    pub secret: Option<Vec<u8>>,
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
    /// Bytes of received frames the node may hold undelivered or unprocessed (each frame
    /// counted with `DELIVERY_OVERHEAD_BYTES` more). When the consumer does not drain
    /// deliveries, links stop reading their sockets and TCP pushes back on the peers.
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

/// Counters of a node's bus.
#[derive(Debug)]
pub struct BusMetrics {
    /// Bundles that came up (a counter).
    pub bundles_up: AtomicU64,
    /// Bundles complete now (a gauge).
    pub bundles_complete: AtomicU64,
    /// Complete bundles torn down.
    pub teardowns: AtomicU64,
    /// Incomplete bundles torn down (a link closed, or the grace ran out, before all k
    /// were up).
    pub incomplete_teardowns: AtomicU64,
    /// Links closed because the peer sent nothing, not even a ping, for a heartbeat
    /// timeout (a half-open link).
    pub links_closed_silent: AtomicU64,
    /// Links closed for a frame that failed its checksum.
    pub frame_checksum_errors: AtomicU64,
    /// Links closed for a frame whose length was above `frame_bytes_max` or below its
    /// header.
    pub frame_length_errors: AtomicU64,
    /// Inbound sockets refused at the preamble.
    pub preamble_refusals: AtomicU64,
    /// Handshakes that failed, by reason.
    pub handshake_failures: Mutex<BTreeMap<String, u64>>,
    /// Frames dropped because a link queue was full.
    pub frames_dropped: AtomicU64,
    /// Frames `send` accepted that a teardown then lost (queued, or written by a link
    /// that closed before they were flushed). Consensus retransmits them.
    pub frames_lost_at_teardown: AtomicU64,
    /// Frames refused at `send` for exceeding `frame_bytes_max`.
    pub frames_refused_too_large: AtomicU64,
    /// Times a link stopped reading because the delivery budget was spent.
    pub delivery_waits: AtomicU64,
    /// Frames not sent because the bundle was not complete.
    pub frames_refused_bundle_down: AtomicU64,
    /// Frames sent.
    pub frames_sent: AtomicU64,
    /// Bytes sent.
    pub bytes_sent: AtomicU64,
    /// Frames received.
    pub frames_received: AtomicU64,
    /// Bytes received.
    pub bytes_received: AtomicU64,
    /// Per link (index `peer * k + link`): frames sent, bytes sent, frames received,
    /// bytes received.
    pub per_link: Vec<[AtomicU64; 4]>,
}

impl BusMetrics {
    fn new(replicas: usize, links: u16) -> Self {
        let zero = || AtomicU64::new(0);
        Self {
            bundles_up: zero(),
            bundles_complete: zero(),
            teardowns: zero(),
            incomplete_teardowns: zero(),
            links_closed_silent: zero(),
            frame_checksum_errors: zero(),
            frame_length_errors: zero(),
            preamble_refusals: zero(),
            handshake_failures: Mutex::new(BTreeMap::new()),
            frames_dropped: zero(),
            frames_lost_at_teardown: zero(),
            frames_refused_too_large: zero(),
            delivery_waits: zero(),
            frames_refused_bundle_down: zero(),
            frames_sent: zero(),
            bytes_sent: zero(),
            frames_received: zero(),
            bytes_received: zero(),
            per_link: (0..replicas * usize::from(links))
                .map(|_| [zero(), zero(), zero(), zero()])
                .collect(),
        }
    }

    fn link(&self, peer: u8, link: u16, links: u16) -> Option<&[AtomicU64; 4]> {
        self.per_link
            .get(usize::from(peer) * usize::from(links) + usize::from(link))
    }

    /// (frames sent, bytes sent, frames received, bytes received) of one link.
    pub fn link_counts(&self, peer: u8, link: u16, links: u16) -> (u64, u64, u64, u64) {
        self.link(peer, link, links).map_or((0, 0, 0, 0), |c| {
            let get = |i: usize| c[i].load(Ordering::Relaxed);
            (get(0), get(1), get(2), get(3))
        })
    }

    fn failed(&self, reason: &str) {
        if let Ok(mut map) = self.handshake_failures.lock() {
            *map.entry(reason.to_owned()).or_insert(0) += 1;
        }
    }

    /// Handshake failures counted under `reason`.
    pub fn handshake_failures_for(&self, reason: &str) -> u64 {
        self.handshake_failures
            .lock()
            .map_or(0, |m| m.get(reason).copied().unwrap_or(0))
    }
}

fn reason(refusal: &Refusal) -> &'static str {
    match refusal {
        Refusal::BadMagic | Refusal::Version(_) => "preamble",
        Refusal::UnknownReplica(_) => "unknown_replica",
        Refusal::NoSuchLink { .. } => "no_such_link",
        Refusal::Malformed => "malformed",
        Refusal::Cluster { .. } => "cluster",
        Refusal::PreambleMismatch => "preamble_mismatch",
        Refusal::LinkCount { .. } => "link_count",
        Refusal::BadMac => "bad_mac",
        Refusal::StaleGeneration { .. } => "stale_generation",
        Refusal::Timeout => "timeout",
        Refusal::WrongDialer { .. } => "wrong_dialer",
    }
}

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

struct Peer {
    complete: AtomicBool,
    bundle_events: tokio::sync::broadcast::Sender<BundleEvent>,
    queues: Mutex<Vec<Option<mpsc::Sender<Frame>>>>,
    events: mpsc::UnboundedSender<PeerEvent>,
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
        secret: config.secret.clone(),
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
        Self::start_on_shards(config, listener, Vec::new())
    }

    /// As [`Bus::start`], with one runtime per shard: each link (its dial, its
    /// handshake, its reader and writer) runs on its owner shard's runtime; the runtime
    /// `start_on_shards` is called on (shard 0's) accepts, reads the preamble and hands
    /// the socket over.
    ///
    /// # Errors
    /// As [`Bus::start`], and [`StartError::Shards`] if the runtimes do not match the
    /// shard count.
    pub fn start_on_shards(
        config: BusConfig,
        listener: TcpListener,
        shards: Vec<tokio::runtime::Handle>,
    ) -> Result<(Self, mpsc::UnboundedReceiver<Delivery>), StartError> {
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
        let metrics = Arc::new(BusMetrics::new(config.addresses.len(), config.links));
        let placement = Arc::new(Placement {
            layout,
            replica: config.replica,
            shards,
        });
        let (deliver, deliveries) = mpsc::unbounded_channel();
        // The channel is unbounded in count but not in bytes: every delivery holds its
        // share of this budget until the consumer drops it.
        let deliver = Deliver {
            channel: deliver,
            budget: Arc::new(DeliveryBudget {
                held: AtomicUsize::new(0),
                max: config.delivery_bytes_max.max(1),
                waiting: AtomicUsize::new(0),
                freed: tokio::sync::Notify::new(),
            }),
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
                    bundle_events: bundle_events.clone(),
                    queues: Mutex::new(vec![None; usize::from(config.links)]),
                    events,
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
    /// blocks: a full queue drops the frame and counts it.
    ///
    /// # Errors
    /// [`SendError`].
    pub fn send(&self, shard: u16, peer: u8, frame: Frame) -> Result<(), SendError> {
        let queue = self.queue(shard, peer, &frame)?;
        queue.try_send(frame).map_err(|err| match err {
            mpsc::error::TrySendError::Full(_) => {
                self.metrics.frames_dropped.fetch_add(1, Ordering::Relaxed);
                SendError::QueueFull
            }
            mpsc::error::TrySendError::Closed(_) => {
                self.metrics
                    .frames_lost_at_teardown
                    .fetch_add(1, Ordering::Relaxed);
                SendError::LinkClosed(peer)
            }
        })
    }

    /// As [`Bus::send`], but waits for room in the link's queue instead of dropping:
    /// for callers that want backpressure (bulk transfer, benchmarks) rather than the
    /// drop-and-retransmit that consensus prefers.
    ///
    /// # Errors
    /// [`SendError::BundleDown`] or [`SendError::NoPeer`].
    pub async fn send_waiting(&self, shard: u16, peer: u8, frame: Frame) -> Result<(), SendError> {
        let queue = self.queue(shard, peer, &frame)?;
        queue.send(frame).await.map_err(|_| {
            self.metrics
                .frames_lost_at_teardown
                .fetch_add(1, Ordering::Relaxed);
            SendError::LinkClosed(peer)
        })
    }

    /// The queue of the link `frame` from `shard` takes to `peer`: link 0 for metadata,
    /// else the shard range's link; refused (and counted) while the bundle is down.
    fn queue(&self, shard: u16, peer: u8, frame: &Frame) -> Result<mpsc::Sender<Frame>, SendError> {
        if frame.kind >= KIND_BUS_RESERVED {
            return Err(SendError::ReservedKind(frame.kind));
        }
        let bytes = frame.length_field();
        if bytes > u64::from(self.frame_bytes_max) {
            self.metrics
                .frames_refused_too_large
                .fetch_add(1, Ordering::Relaxed);
            return Err(SendError::FrameTooLarge {
                bytes,
                max: self.frame_bytes_max,
            });
        }
        let link = if frame.group == 0 {
            METADATA_LINK
        } else {
            self.layout.range_of(shard)
        };
        let p = self.peer(peer)?;
        let queue = if p.complete.load(Ordering::Acquire) {
            p.queues
                .lock()
                .ok()
                .and_then(|q| q.get(usize::from(link)).cloned().flatten())
        } else {
            None
        };
        queue.ok_or_else(|| {
            self.metrics
                .frames_refused_bundle_down
                .fetch_add(1, Ordering::Relaxed);
            SendError::BundleDown(peer)
        })
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

impl Drop for Bus {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

struct LinkTasks {
    reader: JoinHandle<()>,
    writer: JoinHandle<()>,
}

impl LinkTasks {
    fn abort(self) {
        drop(self);
    }
}

/// A link's tasks end with their manager, so a dropped bus leaves no socket behind on
/// any shard.
impl Drop for LinkTasks {
    fn drop(&mut self) {
        self.reader.abort();
        self.writer.abort();
    }
}

#[allow(clippy::too_many_arguments)] // the parts one peer's manager needs
async fn manage_peer(
    config: Arc<BusConfig>,
    tls: Arc<Option<Tls>>,
    placement: Arc<Placement>,
    peer: u8,
    handle: Arc<PeerHandle>,
    mut events: mpsc::UnboundedReceiver<PeerEvent>,
    metrics: Arc<BusMetrics>,
    deliver: Deliver,
) {
    let start = Instant::now();
    let now = || start.elapsed().as_millis() as u64;
    let backoff = Backoff {
        first: config.backoff.as_millis().max(1) as u64,
        max: (config.backoff.as_millis().max(1) as u64) * 32,
    };
    let mut bundle = Bundle::new(
        config.links,
        config.replica < peer,
        config.handshake_grace.as_millis() as u64,
        backoff,
        now(),
    );
    let mut links: Vec<Option<LinkTasks>> = (0..config.links).map(|_| None).collect();
    let peer_state = &handle.inner;
    let mut actions = Vec::new();
    let mut teardowns_seen = 0;
    // The generation that last came up, named in its down event.
    let mut up_generation = 0;
    loop {
        let wait = bundle
            .next_deadline()
            .map_or(Duration::from_millis(50), |d| {
                Duration::from_millis(d.saturating_sub(now()).min(50))
            });
        let mut install = None;
        tokio::select! {
            event = events.recv() => match event {
                None => return,
                Some(PeerEvent::LinkUp { link, generation, incarnation, stream }) => {
                    match bundle.on_link_up(now(), link, generation, incarnation, &mut actions) {
                        Ok(()) => install = Some((link, generation, stream)),
                        Err(_) => metrics.failed("stale_generation"),
                    }
                }
                Some(PeerEvent::LinkClosed { link, generation }) => bundle.on_link_closed(now(), link, generation, &mut actions),
                Some(PeerEvent::Kill(link)) => {
                    let generation = bundle.generation();
                    if let Some(tasks) = links.get_mut(usize::from(link)).and_then(Option::take) {
                        tasks.abort();
                    }
                    bundle.on_link_closed(now(), link, generation, &mut actions);
                }
            },
            () = tokio::time::sleep(wait) => bundle.on_tick(now(), &mut actions),
        }
        // Teardowns first, then the new link, then "up": a frame queued as soon as the
        // bundle is up finds every link's queue in place.
        let up = actions.contains(&BundleAction::Up);
        let down = actions.contains(&BundleAction::Down);
        let teardowns = bundle.teardowns();
        if teardowns > teardowns_seen {
            let incomplete = teardowns - teardowns_seen - u64::from(down);
            metrics
                .incomplete_teardowns
                .fetch_add(incomplete, Ordering::Relaxed);
            teardowns_seen = teardowns;
        }
        for action in actions.drain(..) {
            match action {
                BundleAction::CloseAll => {
                    peer_state.complete.store(false, Ordering::Release);
                    if let Ok(mut queues) = peer_state.queues.lock() {
                        queues.iter_mut().for_each(|q| *q = None);
                    }
                    for tasks in links.iter_mut().filter_map(Option::take) {
                        tasks.abort();
                    }
                }
                BundleAction::Down => {
                    peer_state.complete.store(false, Ordering::Release);
                    metrics.teardowns.fetch_add(1, Ordering::Relaxed);
                    metrics.bundles_complete.fetch_sub(1, Ordering::Relaxed);
                    let _ = peer_state.bundle_events.send(BundleEvent {
                        peer,
                        generation: up_generation,
                        up: false,
                    });
                }
                BundleAction::Dial { link, generation } => {
                    placement.spawn(
                        link,
                        peer,
                        dial(
                            Arc::clone(&config),
                            Arc::clone(&tls),
                            peer,
                            link,
                            generation,
                            handle.inner.events.clone(),
                            Arc::clone(&metrics),
                        ),
                    );
                }
                BundleAction::Up => {}
            }
        }
        if let Some((link, generation, stream)) = install {
            let (queue, frames) = mpsc::channel(config.queue_frames_max.max(1));
            if let Ok(mut queues) = peer_state.queues.lock() {
                if let Some(slot) = queues.get_mut(usize::from(link)) {
                    *slot = Some(queue);
                }
            }
            let tasks = spawn_link(
                &config,
                &placement,
                peer,
                link,
                generation,
                stream,
                frames,
                handle.inner.events.clone(),
                Arc::clone(&metrics),
                deliver.clone(),
                config.replica > peer,
            );
            if let Some(old) = links
                .get_mut(usize::from(link))
                .and_then(|slot| slot.replace(tasks))
            {
                old.abort();
            }
        }
        if up {
            peer_state.complete.store(true, Ordering::Release);
            metrics.bundles_up.fetch_add(1, Ordering::Relaxed);
            metrics.bundles_complete.fetch_add(1, Ordering::Relaxed);
            up_generation = bundle.generation();
            let _ = peer_state.bundle_events.send(BundleEvent {
                peer,
                generation: up_generation,
                up: true,
            });
        }
    }
}

#[allow(clippy::too_many_arguments)] // the parts of one link
fn spawn_link(
    config: &BusConfig,
    placement: &Placement,
    peer: u8,
    link: u16,
    generation: u32,
    stream: BoxStream,
    frames: mpsc::Receiver<Frame>,
    events: mpsc::UnboundedSender<PeerEvent>,
    metrics: Arc<BusMetrics>,
    deliver: Deliver,
    announce: bool,
) -> LinkTasks {
    let (mut reader, mut writer) = tokio::io::split(stream);
    let max = config.frame_bytes_max;
    let silence_max = config.heartbeat_timeout.max(Duration::from_millis(30));
    let ping_every = silence_max / 3;
    let links = config.links;
    let read_events = events.clone();
    let read_metrics = Arc::clone(&metrics);
    let reader = placement.spawn(link, peer, async move {
        let mut buf = Vec::with_capacity(64 * 1024);
        let mut chunk = vec![0u8; 64 * 1024];
        // The reading thread's name, looked up again only when the task moves threads.
        let mut thread: Option<(std::thread::ThreadId, Option<Arc<str>>)> = None;
        loop {
            let current = std::thread::current();
            if thread.as_ref().is_none_or(|(id, _)| *id != current.id()) {
                thread = Some((current.id(), current.name().map(Arc::from)));
            }
            let read_on = thread.as_ref().and_then(|(_, name)| name.clone());
            // Decode every whole frame in the buffer, then drop their bytes in one move.
            let mut consumed = 0;
            loop {
                match Frame::decode(&buf[consumed..], max) {
                    Ok(Some((frame, used))) if frame.kind >= KIND_BUS_RESERVED => {
                        consumed += used; // the bus's own; nothing to deliver
                    }
                    Ok(Some((frame, used))) => {
                        consumed += used;
                        read_metrics.frames_received.fetch_add(1, Ordering::Relaxed);
                        read_metrics
                            .bytes_received
                            .fetch_add(used as u64, Ordering::Relaxed);
                        if let Some(c) = read_metrics.link(peer, link, links) {
                            c[2].fetch_add(1, Ordering::Relaxed);
                            c[3].fetch_add(used as u64, Ordering::Relaxed);
                        }
                        // Wait for budget: while the consumer holds too much, this link
                        // stops reading and TCP pushes back on the peer.
                        let Some(budget) = deliver.budget_for(used, &read_metrics).await else {
                            return;
                        };
                        let _ = deliver.channel.send(Delivery {
                            peer,
                            link,
                            frame,
                            read_on: read_on.clone(),
                            _budget: budget,
                        });
                    }
                    Ok(None) => {
                        buf.drain(..consumed);
                        break;
                    }
                    Err(err) => {
                        let err: FrameError = err;
                        let counter = match err {
                            FrameError::Checksum { .. } => &read_metrics.frame_checksum_errors,
                            _ => &read_metrics.frame_length_errors,
                        };
                        counter.fetch_add(1, Ordering::Relaxed);
                        tracing::warn!(peer, link, %err, "closing a replica link");
                        let _ = read_events.send(PeerEvent::LinkClosed { link, generation });
                        return;
                    }
                }
            }
            // A live peer writes at least a ping every third of the heartbeat timeout;
            // silence for a whole one is a half-open link (a blackholed or stopped
            // peer that TCP_USER_TIMEOUT cannot see while we send nothing).
            match tokio::time::timeout(silence_max, reader.read(&mut chunk)).await {
                Err(_) => {
                    read_metrics
                        .links_closed_silent
                        .fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(peer, link, "closing a silent replica link");
                    let _ = read_events.send(PeerEvent::LinkClosed { link, generation });
                    return;
                }
                Ok(Ok(0) | Err(_)) => {
                    let _ = read_events.send(PeerEvent::LinkClosed { link, generation });
                    return;
                }
                Ok(Ok(n)) => buf.extend_from_slice(&chunk[..n]),
            }
        }
    });
    let writer = placement.spawn(link, peer, async move {
        // Whatever is still queued when this task ends (a teardown aborts it) is lost.
        let mut frames = CountedQueue {
            frames,
            metrics: Arc::clone(&metrics),
        };
        let frames = &mut frames.frames;
        let mut bytes = Vec::new();
        if announce {
            // The acceptor tells the dialer it took this link into the bundle.
            let taken = Frame {
                group: 0,
                kind: KIND_LINK_TAKEN,
                payload: Vec::new(),
            };
            taken.encode(&mut bytes);
            if writer.write_all(&bytes).await.is_err() || writer.flush().await.is_err() {
                let _ = events.send(PeerEvent::LinkClosed { link, generation });
                return;
            }
        }
        loop {
            let frame = match tokio::time::timeout(ping_every, frames.recv()).await {
                Ok(Some(frame)) => frame,
                Ok(None) => break,
                Err(_) => {
                    // Idle: a ping tells the peer this side is alive.
                    bytes.clear();
                    ping().encode(&mut bytes);
                    if writer.write_all(&bytes).await.is_err() || writer.flush().await.is_err() {
                        let _ = events.send(PeerEvent::LinkClosed { link, generation });
                        return;
                    }
                    continue;
                }
            };
            bytes.clear();
            frame.encode(&mut bytes);
            let mut count = 1u64;
            // Batch what is already queued into one write, but only up to a bound:
            // senders that keep the queue full must not keep the writer from writing.
            while bytes.len() < WRITE_BATCH_BYTES_MAX {
                let Ok(more) = frames.try_recv() else { break };
                more.encode(&mut bytes);
                count += 1;
            }
            // Flush every batch: a TLS writer buffers ciphertext until flushed, and a
            // batch left there would wait for the next send.
            if writer.write_all(&bytes).await.is_err() || writer.flush().await.is_err() {
                // The batch never made it whole; what is still queued is counted when
                // the queue is dropped.
                metrics
                    .frames_lost_at_teardown
                    .fetch_add(count, Ordering::Relaxed);
                let _ = events.send(PeerEvent::LinkClosed { link, generation });
                return;
            }
            metrics.frames_sent.fetch_add(count, Ordering::Relaxed);
            metrics
                .bytes_sent
                .fetch_add(bytes.len() as u64, Ordering::Relaxed);
            if let Some(c) = metrics.link(peer, link, links) {
                c[0].fetch_add(count, Ordering::Relaxed);
                c[1].fetch_add(bytes.len() as u64, Ordering::Relaxed);
            }
        }
    });
    LinkTasks { reader, writer }
}

async fn dial(
    config: Arc<BusConfig>,
    tls: Arc<Option<Tls>>,
    peer: u8,
    link: u16,
    generation: u32,
    events: mpsc::UnboundedSender<PeerEvent>,
    metrics: Arc<BusMetrics>,
) {
    let closed = PeerEvent::LinkClosed { link, generation };
    let Some(addr) = config.addresses.get(usize::from(peer)).copied() else {
        return;
    };
    let attempt = async {
        let own = config.addresses.get(usize::from(config.replica)).copied();
        let mut tcp = connect_from(own, addr).await.map_err(|_| "connect")?;
        tune(&tcp, config.heartbeat_timeout);
        let (state, hello) = DialerAwaitReply::start(
            handshake_config(&config),
            peer,
            link,
            generation,
            random_nonce(),
        );
        // The preamble goes in the clear: it tells the acceptor which shard takes over.
        tcp.write_all(&hello[..PREAMBLE_BYTES])
            .await
            .map_err(|_| "io")?;
        let mut stream: BoxStream = match tls.as_ref() {
            Some(tls) => Box::new(
                tls.connector
                    .connect(tls.server_name.clone(), tcp)
                    .await
                    .map_err(|_| "tls")?,
            ),
            None => Box::new(tcp),
        };
        stream
            .write_all(&hello[PREAMBLE_BYTES..])
            .await
            .map_err(|_| "io")?;
        stream.flush().await.map_err(|_| "io")?;
        let mut reply = [0u8; REPLY_BYTES];
        stream.read_exact(&mut reply).await.map_err(|_| "io")?;
        let (established, confirm) = state.on_reply(&reply).map_err(|r| reason(&r))?;
        stream.write_all(&confirm).await.map_err(|_| "io")?;
        stream.flush().await.map_err(|_| "io")?;
        // The link is up only once the acceptor took it into its bundle.
        let mut taken = [0u8; FRAME_HEADER_BYTES];
        stream
            .read_exact(&mut taken)
            .await
            .map_err(|_| "not_taken")?;
        match Frame::decode(&taken, config.frame_bytes_max) {
            Ok(Some((frame, _))) if frame.kind == KIND_LINK_TAKEN => {}
            _ => return Err("not_taken"),
        }
        Ok::<(BoxStream, u64), &'static str>((stream, established.peer_incarnation))
    };
    match tokio::time::timeout(config.handshake_grace, attempt).await {
        Ok(Ok((stream, incarnation))) => {
            let _ = events.send(PeerEvent::LinkUp {
                link,
                generation,
                incarnation,
                stream,
            });
        }
        Ok(Err(why)) => {
            metrics.failed(why);
            let _ = events.send(closed);
        }
        Err(_) => {
            metrics.failed("timeout");
            let _ = events.send(closed);
        }
    }
}

async fn accept_loop(
    config: Arc<BusConfig>,
    tls: Arc<Option<Tls>>,
    placement: Arc<Placement>,
    listener: TcpListener,
    peers: Arc<Vec<Option<Arc<PeerHandle>>>>,
    metrics: Arc<BusMetrics>,
) {
    let slots = Arc::new(Semaphore::new(INBOUND_HANDSHAKES_MAX));
    let pending = Arc::new(Mutex::new(std::collections::BTreeSet::new()));
    loop {
        let Ok((stream, remote)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(20)).await;
            continue;
        };
        // Only configured peers' addresses take an admission slot: a flood from
        // elsewhere cannot crowd out a real peer.
        if !from_a_peer(&config, remote) {
            metrics.failed("unknown_address");
            continue;
        }
        let Ok(slot) = Arc::clone(&slots).try_acquire_owned() else {
            metrics.failed("too_many_handshakes");
            continue;
        };
        let config = Arc::clone(&config);
        let tls = Arc::clone(&tls);
        let placement = Arc::clone(&placement);
        let peers = Arc::clone(&peers);
        let metrics = Arc::clone(&metrics);
        tokio::spawn(admit(
            Admission {
                config,
                tls,
                peers,
                metrics,
                _slot: slot,
                pending: Arc::clone(&pending),
                claim: None,
            },
            placement,
            stream,
            remote,
        ));
    }
}

/// What one inbound socket's admission needs, wherever it runs; holding it holds one
/// of the [`INBOUND_HANDSHAKES_MAX`] slots.
struct Admission {
    config: Arc<BusConfig>,
    tls: Arc<Option<Tls>>,
    peers: Arc<Vec<Option<Arc<PeerHandle>>>>,
    metrics: Arc<BusMetrics>,
    _slot: OwnedSemaphorePermit,
    /// The (replica, link) admissions in progress: one at a time each.
    pending: Arc<Mutex<std::collections::BTreeSet<(u8, u16)>>>,
    /// The (replica, link) this admission holds, released when it ends.
    claim: Option<(u8, u16)>,
}

impl Admission {
    /// Claims `(replica, link)`; false if another admission of it is in progress.
    fn claim(&mut self, replica: u8, link: u16) -> bool {
        let Ok(mut pending) = self.pending.lock() else {
            return false;
        };
        if !pending.insert((replica, link)) {
            return false;
        }
        self.claim = Some((replica, link));
        true
    }
}

impl Drop for Admission {
    fn drop(&mut self) {
        if let (Some(claim), Ok(mut pending)) = (self.claim, self.pending.lock()) {
            pending.remove(&claim);
        }
    }
}

/// The preamble's own deadline, inside the admission's: a socket that connects and
/// sends nothing is closed long before a grace.
fn preamble_deadline(grace: Duration) -> Duration {
    (grace / 4)
        .clamp(Duration::from_millis(50), Duration::from_secs(1))
        .min(grace)
}

/// Runs admission for one inbound socket under one deadline: the preamble here (the
/// accepting shard), the rest on the link's owner shard.
async fn admit(
    mut admission: Admission,
    placement: Arc<Placement>,
    mut tcp: TcpStream,
    remote: SocketAddr,
) {
    let accepted = Instant::now();
    let deadline = tokio::time::Instant::now() + admission.config.handshake_grace;
    let preamble_by =
        tokio::time::Instant::now() + preamble_deadline(admission.config.handshake_grace);
    let config = Arc::clone(&admission.config);
    let metrics = Arc::clone(&admission.metrics);
    let grace_ms = config.handshake_grace.as_millis() as u64;
    tune(&tcp, config.heartbeat_timeout);
    let mut preamble = [0u8; PREAMBLE_BYTES];
    if tokio::time::timeout_at(preamble_by, tcp.read_exact(&mut preamble))
        .await
        .map_or(true, |r| r.is_err())
    {
        metrics.preamble_refusals.fetch_add(1, Ordering::Relaxed);
        metrics.failed("timeout");
        return;
    }
    let now = accepted.elapsed().as_millis() as u64;
    let awaiting = match accept_preamble(handshake_config(&config), &preamble, now, grace_ms) {
        Ok(awaiting) => awaiting,
        Err(refusal) => {
            metrics.preamble_refusals.fetch_add(1, Ordering::Relaxed);
            metrics.failed(reason(&refusal));
            return;
        }
    };
    let peer = awaiting.preamble().replica;
    let link = u16::from(awaiting.preamble().link);
    // The preamble's replica must be the one at that address.
    let known = config.addresses.get(usize::from(peer)).map(SocketAddr::ip);
    if known.is_some_and(|ip| !ip.is_unspecified() && ip != remote.ip()) {
        metrics.preamble_refusals.fetch_add(1, Ordering::Relaxed);
        metrics.failed("address_mismatch");
        return;
    }
    if !admission.claim(peer, link) {
        metrics.preamble_refusals.fetch_add(1, Ordering::Relaxed);
        metrics.failed("admission_pending");
        return;
    }
    let Some(owner) = placement.owner(link, peer) else {
        finish_admission(admission, awaiting, tcp, accepted, deadline).await;
        return;
    };
    // Hand the socket to the owner shard: it is re-registered with that runtime's
    // reactor, so every later read and write of this link happens there.
    let std = match tcp.into_std() {
        Ok(std) => std,
        Err(_) => {
            metrics.failed("handoff");
            return;
        }
    };
    owner.spawn(async move {
        match TcpStream::from_std(std) {
            Ok(tcp) => finish_admission(admission, awaiting, tcp, accepted, deadline).await,
            Err(_) => admission.metrics.failed("handoff"),
        }
    });
}

/// TLS, hello, reply and confirm for an accepted preamble, then the link goes to its
/// peer's manager; all under the deadline set at accept.
async fn finish_admission(
    admission: Admission,
    awaiting: AcceptorAwaitHello,
    tcp: TcpStream,
    accepted: Instant,
    deadline: tokio::time::Instant,
) {
    let now = || accepted.elapsed().as_millis() as u64;
    let peer = awaiting.preamble().replica;
    let link = u16::from(awaiting.preamble().link);
    let rest = async {
        let mut stream: BoxStream = match admission.tls.as_ref() {
            Some(tls) => Box::new(tls.acceptor.accept(tcp).await.map_err(|_| "tls")?),
            None => Box::new(tcp),
        };
        let mut hello = [0u8; HELLO_BYTES];
        stream
            .read_exact(&mut hello)
            .await
            .map_err(|_| "malformed")?;
        let (confirming, reply) = awaiting
            .on_hello(&hello, random_nonce(), now())
            .map_err(|r| reason(&r))?;
        stream.write_all(&reply).await.map_err(|_| "malformed")?;
        stream.flush().await.map_err(|_| "malformed")?;
        let mut confirm = [0u8; CONFIRM_BYTES];
        stream
            .read_exact(&mut confirm)
            .await
            .map_err(|_| "malformed")?;
        let established = confirming
            .on_confirm(&confirm, now())
            .map_err(|r| reason(&r))?;
        Ok::<_, &'static str>((stream, established))
    };
    match tokio::time::timeout_at(deadline, rest).await {
        Ok(Ok((stream, established))) => {
            if let Some(Some(handle)) = admission.peers.get(usize::from(peer)) {
                let _ = handle.inner.events.send(PeerEvent::LinkUp {
                    link,
                    generation: established.generation,
                    incarnation: established.peer_incarnation,
                    stream,
                });
            }
        }
        Ok(Err(why)) => admission.metrics.failed(why),
        Err(_) => admission.metrics.failed("timeout"),
    }
}

/// Where links deliver frames: the consumer's channel and the byte budget it shares.
#[derive(Debug, Clone)]
struct Deliver {
    channel: mpsc::UnboundedSender<Delivery>,
    budget: Arc<DeliveryBudget>,
}

/// Bytes of deliveries held, against `delivery_bytes_max`. One atomic add to take a
/// share and one to give it back: a semaphore's release takes a lock per frame.
#[derive(Debug)]
struct DeliveryBudget {
    held: AtomicUsize,
    max: usize,
    /// Links waiting for room: a release notifies only when there are some.
    waiting: AtomicUsize,
    freed: tokio::sync::Notify,
}

/// A delivery's share of the budget, given back when the delivery is dropped.
#[derive(Debug)]
struct BudgetShare {
    budget: Arc<DeliveryBudget>,
    bytes: usize,
}

impl Drop for BudgetShare {
    fn drop(&mut self) {
        self.budget.held.fetch_sub(self.bytes, Ordering::SeqCst);
        if self.budget.waiting.load(Ordering::SeqCst) > 0 {
            self.budget.freed.notify_waiters();
        }
    }
}

impl Deliver {
    /// A share of the budget for a frame of `bytes`, waiting while the consumer holds
    /// the rest (a lone frame larger than the budget passes when nothing else is held);
    /// `None` never, kept for the shape of the call.
    async fn budget_for(&self, bytes: usize, metrics: &BusMetrics) -> Option<BudgetShare> {
        let wanted = bytes + DELIVERY_OVERHEAD_BYTES;
        let budget = &self.budget;
        let mut waited = false;
        loop {
            let held = budget.held.load(Ordering::SeqCst);
            if held == 0 || held + wanted <= budget.max {
                if budget
                    .held
                    .compare_exchange(held, held + wanted, Ordering::SeqCst, Ordering::SeqCst)
                    .is_ok()
                {
                    return Some(BudgetShare {
                        budget: Arc::clone(budget),
                        bytes: wanted,
                    });
                }
                continue;
            }
            if !waited {
                metrics.delivery_waits.fetch_add(1, Ordering::Relaxed);
                waited = true;
            }
            // Announce the wait, register for the next release, then look again: a
            // release that came before the registration is seen by the look.
            budget.waiting.fetch_add(1, Ordering::SeqCst);
            let freed = budget.freed.notified();
            tokio::pin!(freed);
            freed.as_mut().enable();
            let held = budget.held.load(Ordering::SeqCst);
            if held != 0 && held + wanted > budget.max {
                freed.await;
            }
            budget.waiting.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

/// A link's queue that counts the frames still in it when it is dropped: frames `send`
/// accepted that a teardown loses.
struct CountedQueue {
    frames: mpsc::Receiver<Frame>,
    metrics: Arc<BusMetrics>,
}

impl Drop for CountedQueue {
    fn drop(&mut self) {
        self.frames.close();
        let mut lost = 0u64;
        while self.frames.try_recv().is_ok() {
            lost += 1;
        }
        self.metrics
            .frames_lost_at_teardown
            .fetch_add(lost, Ordering::Relaxed);
    }
}

/// The frame an idle link's writer sends every third of the heartbeat timeout.
fn ping() -> Frame {
    Frame {
        group: 0,
        kind: KIND_PING,
        payload: Vec::new(),
    }
}
