//! Starting and stopping a node.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use crate::config::{ConfigError, NodeConfig};
use crate::coordinator::MetaService;
use crate::http::HttpServer;
use crate::mailbox::{Control, NodeShared, INBOX_REQUESTS_MAX};
use crate::metadata::{op, MetaOp};
use crate::metrics::ShardMetrics;
use crate::replication::meta_group::{MetaGroup, MetaOpening, Timing};
use crate::shard::Shard;

/// Why a node could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StartError {
    /// The configuration is invalid.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The metadata group could not be opened, or refused an op the start needs.
    #[error("metadata: {0}")]
    Metadata(String),
    /// The replica bus could not start.
    #[error("replica bus: {0}")]
    Bus(String),
    /// A listener could not be bound.
    #[error("binding {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A shard failed to start (for example, a partition could not be opened).
    #[error("shard {shard}: {message}")]
    Shard {
        /// The shard.
        shard: usize,
        /// What failed.
        message: String,
    },
    /// The data directory is another cluster's, another member's or in another format.
    #[error(transparent)]
    DataDir(#[from] crate::identity::IdentityError),
    /// The data directory was made with another shard count.
    #[error(transparent)]
    ShardCount(#[from] crate::ShardCountError),
    /// The bootstrap admin could not be created.
    #[error("bootstrap admin: {0}")]
    Bootstrap(#[from] crate::admin_bootstrap::BootstrapError),
    /// The TLS settings could not be used.
    #[error(transparent)]
    Tls(#[from] crate::tls::TlsError),
    /// A thread or runtime could not be created.
    #[error("starting threads: {0}")]
    Io(#[from] std::io::Error),
}

/// A running node. [`Node::shutdown`] stops it gracefully; dropping it does too.
#[derive(Debug)]
pub struct Node {
    client_addr: SocketAddr,
    http_addr: SocketAddr,
    shared: Arc<NodeShared>,
    threads: Vec<std::thread::JoinHandle<()>>,
    http: Option<HttpServer>,
}

impl Node {
    /// Starts a node: opens the metadata and every partition (recovering after a crash),
    /// binds the listeners (port 0 picks a free port), and starts the shards.
    ///
    /// # Errors
    /// A [`StartError`]; nothing keeps running after one.
    pub fn start(config: NodeConfig) -> Result<Self, StartError> {
        let config = config.resolve()?;
        if let Some(cluster) = config.cluster.as_ref().filter(|c| c.members.len() > 1) {
            // Checked before the directory is claimed: a member that cannot join its
            // peers must not leave a directory behind that says it did.
            cluster.link_keys()?;
        }
        let clustered = config.cluster.as_ref().is_some_and(|c| c.members.len() > 1);
        let lost = crate::identity::check_intact(&config.data_dir, clustered)?;
        let topic_id_floor = crate::data_dir::prepare(&config.data_dir)?;
        let configured = config.cluster.as_ref().map(|c| (c.id.as_str(), c.node_id));
        let rejoin = config.cluster.as_ref().is_some_and(|c| c.rejoin);
        let start = if clustered {
            crate::identity::Start::Told {
                init: config.cluster.as_ref().is_some_and(|c| c.init),
            }
        } else {
            crate::identity::Start::Any
        };
        let identity =
            crate::identity::claim_as(&config.data_dir, configured, start, rejoin, || {
                let mut bytes = [0u8; 8];
                // A single node's cluster name only has to differ from others'.
                let _ = crate::admin_bootstrap::random_bytes(&mut bytes);
                format!("local-{:016x}", u64::from_be_bytes(bytes))
            })?;
        tracing::debug!(
            cluster = identity.cluster_id,
            node = identity.node_id,
            "data directory claimed"
        );
        // Before anything opens: a partition opened by a shard whose states table
        // never held its state would forget its views.
        let replication = config.data_dir.join("replication");
        braid_storage::create_dir_durable(&replication)?;
        crate::replication::shard_count::check(&replication, config.shards, clustered)?;
        let meta = open_metadata(&config, &identity, topic_id_floor, lost.metadata)?;
        crate::identity::mark_initialized(&config.data_dir, &identity)?;
        let bus_start = match &config.cluster {
            Some(cluster) if cluster.members.len() > 1 => Some(bus_start(&config, cluster)?),
            _ => None,
        };
        let tls = crate::tls::acceptor(&config.tls)?;
        let mut stand_in_secret = [0u8; 32];
        crate::admin_bootstrap::random_bytes(&mut stand_in_secret)?;
        let client =
            std::net::TcpListener::bind(config.client_addr).map_err(|source| StartError::Bind {
                addr: config.client_addr,
                source,
            })?;
        let http =
            std::net::TcpListener::bind(config.http_addr).map_err(|source| StartError::Bind {
                addr: config.http_addr,
                source,
            })?;
        let client_addr = client.local_addr()?;
        let http_addr = http.local_addr()?;
        let members = match &config.cluster {
            Some(cluster) => cluster
                .members
                .iter()
                .map(|m| braid_proto::client::ClusterMember {
                    id: m.id,
                    client_addr: m.client_addr.to_string(),
                })
                .collect(),
            None => vec![braid_proto::client::ClusterMember {
                id: 0,
                client_addr: client_addr.to_string(),
            }],
        };
        let cluster = crate::mailbox::ClusterView {
            cluster_id: identity.cluster_id.clone(),
            node_id: identity.node_id,
            members,
        };
        let shards = config.shards;
        let mut inboxes = Vec::new();
        let mut inbox_receivers = Vec::new();
        let mut controls = Vec::new();
        let mut control_receivers = Vec::new();
        for _ in 0..shards {
            let (tx, rx) = mpsc::channel(INBOX_REQUESTS_MAX);
            inboxes.push(tx);
            inbox_receivers.push(rx);
            let (tx, rx) = mpsc::unbounded_channel();
            controls.push(tx);
            control_receivers.push(rx);
        }
        let metrics: Vec<Arc<ShardMetrics>> = (0..shards).map(|_| Arc::default()).collect();
        let fetch_bytes_permits = usize::try_from(config.fetch_bytes_max)
            .unwrap_or(usize::MAX)
            .min(tokio::sync::Semaphore::MAX_PERMITS);
        let frame_bytes_permits = usize::try_from(config.frame_bytes_in_flight_max)
            .unwrap_or(usize::MAX)
            .min(tokio::sync::Semaphore::MAX_PERMITS);
        let strangers = config
            .connections_unauthenticated_max
            .min((config.connections_max / 2).max(1));
        let door = crate::door::Door::new(crate::door::DoorLimits {
            strangers,
            strangers_per_source: config
                .connections_unauthenticated_per_source_max
                .min((strangers / 4).max(1)),
            per_user: config.connections_per_user_max.min(config.connections_max),
        });
        let shared = Arc::new(NodeShared {
            config,
            inboxes,
            controls,
            metrics: metrics.clone(),
            syncer: Arc::new(braid_storage::Syncer::start("braid-sync")?),
            bus: std::sync::OnceLock::new(),
            started: Instant::now(),
            read_buffers: crate::buffers::ReadBuffers::default(),
            fetch_bytes: Arc::new(tokio::sync::Semaphore::new(fetch_bytes_permits)),
            frame_bytes: Arc::new(tokio::sync::Semaphore::new(frame_bytes_permits)),
            fetch_budget_waiting: std::sync::atomic::AtomicUsize::new(0),
            principals: std::sync::Mutex::default(),
            login_slots: std::sync::Mutex::default(),
            connections: std::sync::atomic::AtomicUsize::new(0),
            door: std::sync::Mutex::new(door),
            partitions_published: std::sync::RwLock::default(),
            coordinator: std::sync::atomic::AtomicU8::new(crate::mailbox::NO_MEMBER),
            metadata_caught_up: std::sync::atomic::AtomicBool::new(!clustered),
            new_topics_from: std::sync::atomic::AtomicU32::new(crate::mailbox::TOPICS_UNKNOWN),
            tls,
            stand_in_secret,
            cluster,
            board: crate::replication::status::Board::new(shards),
        });
        let layout = Arc::new(meta.layout());
        let mut meta = Some(meta);
        let mut bus_start = bus_start;
        let opening = partition_groups_opening(&shared.config, &identity, lost.partitions)?;
        let (ready_tx, ready_rx) =
            std::sync::mpsc::channel::<(usize, Result<(), crate::shard::ShardError>)>();
        let mut threads = Vec::new();
        // Every runtime first: the bus places each replica link on its owner shard's.
        let runtimes = (0..shards)
            .map(|_| {
                tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
            })
            .collect::<Result<Vec<_>, _>>()?;
        let handles: Vec<tokio::runtime::Handle> =
            runtimes.iter().map(|r| r.handle().clone()).collect();
        for (id, ((inbox, control), runtime)) in inbox_receivers
            .into_iter()
            .zip(control_receivers)
            .zip(runtimes)
            .enumerate()
        {
            let shared = Arc::clone(&shared);
            let layout = Arc::clone(&layout);
            let meta = if id == 0 { meta.take() } else { None };
            let bus = if id == 0 {
                bus_start.take().map(|b| (b, handles.clone()))
            } else {
                None
            };
            let opening = opening.clone();
            let ready = ready_tx.clone();
            let thread = std::thread::Builder::new()
                .name(format!("braid-shard-{id}"))
                .spawn(move || {
                    let local = tokio::task::LocalSet::new();
                    local.block_on(&runtime, async move {
                        let mut shard = match Shard::new(id, shared, meta, opening) {
                            Ok(shard) => shard,
                            Err(err) => {
                                let _ = ready.send((id, Err(err)));
                                return;
                            }
                        };
                        let mut opened = shard.apply_layout(layout);
                        if let (Ok(()), Some(((config, listener), handles))) = (&opened, bus) {
                            opened = shard.start_bus(config, listener, handles);
                        }
                        let failed = opened.is_err();
                        let _ = ready.send((id, opened));
                        if !failed {
                            shard.run(inbox, control).await;
                        }
                    });
                })?;
            threads.push(thread);
        }
        drop(ready_tx);
        let mut failure = None;
        for _ in 0..shards {
            match ready_rx.recv() {
                Ok((_, Ok(()))) => {}
                Ok((shard, Err(err))) => {
                    failure.get_or_insert(StartError::Shard {
                        shard,
                        message: err.to_string(),
                    });
                }
                Err(_) => {
                    failure.get_or_insert(StartError::Shard {
                        shard: 0,
                        message: "a shard thread died while starting".into(),
                    });
                }
            }
        }
        let mut node = Self {
            client_addr,
            http_addr,
            shared,
            threads,
            http: None,
        };
        if let Some(err) = failure {
            node.stop_shards();
            return Err(err);
        }
        // Every shard made its states table: from now on one gone whole is damage.
        if let Err(err) = crate::replication::shard_count::record(
            &node.shared.config.data_dir.join("replication"),
            shards,
        ) {
            node.stop_shards();
            return Err(err.into());
        }
        let token = node.shared.config.http_token()?;
        node.http = Some(HttpServer::start(http, Arc::clone(&node.shared), token)?);
        let config = &node.shared.config;
        if config.authentication
            && config.tls.cert_file.is_none()
            && !client_addr.ip().is_loopback()
        {
            // Logins are SCRAM (no password crosses), but every record does, in clear.
            tracing::warn!(
                client = %client_addr,
                "authentication is on but TLS is off on a non-loopback address: every \
                 record, and each user's name, crosses the network in clear; configure [tls]"
            );
        }
        let _ = node.shared.controls[0].send(Control::Listener(client));
        tracing::info!(client = %client_addr, http = %http_addr, shards, "node started");
        Ok(node)
    }

    /// The client protocol address (with the port actually bound).
    pub fn client_addr(&self) -> SocketAddr {
        self.client_addr
    }

    /// The HTTP admin address.
    pub fn http_addr(&self) -> SocketAddr {
        self.http_addr
    }

    /// Stops gracefully: no new connections or requests, in-flight requests finish
    /// (within `shutdown_grace_ms`), every partition is synced and closed cleanly, and
    /// the metadata group stops (its journal holds every committed op, synced).
    pub fn shutdown(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        if self.threads.is_empty() {
            return;
        }
        for control in &self.shared.controls {
            let _ = control.send(Control::Drain);
        }
        let grace = Duration::from_millis(self.shared.config.shutdown_grace_ms);
        let started = Instant::now();
        while started.elapsed() < grace {
            let open: u64 = self
                .shared
                .metrics
                .iter()
                .map(|m| {
                    m.connections_active
                        .load(std::sync::atomic::Ordering::Relaxed)
                })
                .sum();
            if open == 0 {
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        if let Some(mut http) = self.http.take() {
            http.stop();
        }
        self.stop_shards();
        tracing::info!("node stopped");
    }

    fn stop_shards(&mut self) {
        let mut waits = Vec::new();
        for control in &self.shared.controls {
            let (done, wait) = std::sync::mpsc::channel();
            if control.send(Control::Shutdown { done }).is_ok() {
                waits.push(wait);
            }
        }
        for wait in waits {
            let _ = wait.recv();
        }
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

/// Opens the metadata group and proposes what the start needs: a topic id floor above
/// the partitions on disk, and the bootstrap admin. A lone replica answers at once; a
/// cluster member's proposals go out once the group has a primary.
fn open_metadata(
    config: &NodeConfig,
    identity: &crate::identity::Identity,
    topic_id_floor: u32,
    lost: bool,
) -> Result<MetaService, StartError> {
    let (members, timing) = groups_shape(config);
    let dir = config.data_dir.join("metadata");
    braid_storage::create_dir_durable(&dir)?;
    let node_id = identity.node_id;
    let opening = MetaOpening {
        node: node_id,
        members,
        timing,
        nonce: nonce()?,
        rejoined: identity.rejoined,
        lost,
        checkpoint_interval: crate::replication::meta_group::CHECKPOINT_INTERVAL,
    };
    let group = MetaGroup::open(&dir, opening).map_err(|e| StartError::Metadata(e.to_string()))?;
    let limits = crate::groups::GroupLimits {
        members: config.group_members_max,
        groups: config.groups_max,
        per_stream: config.groups_per_stream_max,
    };
    let mut meta = MetaService::new(group, limits);
    let mut ops = Vec::new();
    let next_topic_id = meta.group().state().next_topic_id();
    if topic_id_floor > next_topic_id {
        // The metadata forgot topics whose partitions are still on disk (its files were
        // lost): never hand their ids, and so their records, to new topics. A member
        // of a cluster has not recovered its metadata from its peers yet (it knows no
        // topic now, as a rule): the floor is proposed all the same, and changes
        // nothing where the cluster knows those topics, so it is no warning there.
        if members > 1 {
            tracing::debug!(
                floor = topic_id_floor,
                "proposing a topic id floor above the partition directories on disk"
            );
        } else {
            tracing::warn!(
                next_topic_id,
                floor = topic_id_floor,
                "partition directories exist for topic ids the metadata does not know"
            );
        }
        ops.push(MetaOp::RaiseTopicIdFloor(op::RaiseTopicIdFloor {
            floor: topic_id_floor,
        }));
    }
    // In a cluster one member bootstraps the admin, so one password stands.
    if node_id == 0 {
        ops.extend(crate::admin_bootstrap::admin_ops(
            meta.group().state(),
            config,
        )?);
    }
    for op in ops {
        if let Some(Err(err)) = meta.propose_at_start(op) {
            return Err(StartError::Metadata(err.to_string()));
        }
    }
    Ok(meta)
}

/// What each shard opens its partition groups with: their durable states in
/// `DATA_DIR/replication`, this member among the cluster's, the group timings.
fn partition_groups_opening(
    config: &NodeConfig,
    identity: &crate::identity::Identity,
    partitions_lost: bool,
) -> Result<crate::replication::partition_groups::Opening, StartError> {
    let dir = config.data_dir.join("replication");
    braid_storage::create_dir_durable(&dir)?;
    let (members, timing) = groups_shape(config);
    Ok(crate::replication::partition_groups::Opening {
        dir,
        node: identity.node_id,
        members,
        timing,
        nonce: nonce()?,
        // Lost with `partitions/`, every group starts with nothing on disk: untrusted,
        // as after `--rejoin`, since it may have acknowledged ops it no longer holds.
        rejoined: identity.rejoined || partitions_lost,
        open_budget: config.open_logs_per_shard,
    })
}

/// Every group's replica count (all members; one without `[cluster]`) and timings.
fn groups_shape(config: &NodeConfig) -> (u8, Timing) {
    let cluster = config.cluster.as_ref();
    let members = cluster.map_or(1, |c| c.members.len() as u8);
    let heartbeat_timeout_ms = cluster.map_or_else(
        || crate::config::ClusterSettings::default().heartbeat_timeout_ms,
        |c| c.heartbeat_timeout_ms,
    );
    (
        members,
        Timing::from_heartbeat_timeout_ms(heartbeat_timeout_ms),
    )
}

/// A random nonce that makes this process's group sessions its own.
fn nonce() -> Result<u64, StartError> {
    let mut bytes = [0u8; 8];
    crate::admin_bootstrap::random_bytes(&mut bytes)?;
    Ok(u64::from_be_bytes(bytes))
}

/// The replica bus's settings and its bound listener (bound here, so a taken port
/// fails the start).
fn bus_start(
    config: &NodeConfig,
    cluster: &crate::config::ClusterSettings,
) -> Result<(braid_bus::BusConfig, std::net::TcpListener), StartError> {
    let mut members = cluster.members.clone();
    members.sort_by_key(|m| m.id);
    let this = cluster
        .this_member()
        .ok_or_else(|| StartError::Bus("this node is not a member".into()))?;
    let listener =
        std::net::TcpListener::bind(this.replica_addr).map_err(|source| StartError::Bind {
            addr: this.replica_addr,
            source,
        })?;
    let bus = braid_bus::BusConfig {
        cluster: cluster.bus_cluster_id(),
        replica: cluster.node_id,
        addresses: members.iter().map(|m| m.replica_addr).collect(),
        shards: config.shards as u16,
        links: cluster.links_per_peer,
        skip_shard_zero: false,
        keys: cluster.link_keys()?,
        handshake_grace: Duration::from_millis(cluster.heartbeat_timeout_ms.max(1_000)),
        heartbeat_timeout: Duration::from_millis(cluster.heartbeat_timeout_ms),
        queue_frames_max: 4_096,
        frame_bytes_max: config.frame_bytes_max.saturating_add(4_096),
        delivery_bytes_max: 64 << 20,
        backoff: Duration::from_millis(50),
        tls: None,
        incarnation: 0,
    };
    Ok((bus, listener))
}

impl Drop for Node {
    fn drop(&mut self) {
        self.stop();
    }
}
