//! The messages shards exchange and what every shard shares: the one module the
//! shard loop, the connections, the partitions and the metadata service all import,
//! and which imports none of them (so no file cycle runs through them).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use braid_proto::client::{OffsetSpec, Response};
use braid_proto::ValidatedBatch;
use braid_storage::LogRead;
use tokio::sync::{mpsc, oneshot};

use crate::config::NodeConfig;
use crate::error::NodeError;
use crate::layout::PartitionKey;
use crate::metrics::ShardMetrics;

/// Offsets a produce got: (base, last).
pub(crate) type ProduceReply = oneshot::Sender<Result<(u64, u64), NodeError>>;

/// Where a fetch's answer goes.
pub(crate) type FetchReply = oneshot::Sender<Result<FetchOutcome, NodeError>>;

/// Capacity of a shard's request inbox.
pub(crate) const INBOX_REQUESTS_MAX: usize = 1024;

/// What a fetch found.
#[derive(Debug)]
pub(crate) struct FetchOutcome {
    pub(crate) high_watermark: u64,
    pub(crate) start_offset: u64,
    pub(crate) read: LogRead,
}

/// A request to the shard that owns a partition (or, for `Admin`, to shard 0).
#[derive(Debug)]
pub(crate) enum ShardRequest {
    Produce {
        key: PartitionKey,
        batch: ValidatedBatch,
        reply: ProduceReply,
        /// What the door checked the batch's client session against, if it names one.
        checked: crate::replication::group_client::Checked,
    },
    /// Answered at once, or (with `wait`, at the high watermark) parked until the next
    /// commit; the asker stops waiting by dropping its receiver.
    Fetch {
        key: PartitionKey,
        offset: u64,
        max_bytes: u32,
        wait: bool,
        reply: FetchReply,
    },
    ListOffsets {
        key: PartitionKey,
        spec: OffsetSpec,
        reply: oneshot::Sender<Result<Option<u64>, NodeError>>,
    },
    /// (start offset, high watermark) of each partition this shard owns among `keys`.
    Offsets {
        keys: Vec<PartitionKey>,
        reply: oneshot::Sender<Vec<(PartitionKey, u64, u64)>>,
    },
    Admin {
        request: crate::admin::AdminRequest,
        reply: oneshot::Sender<Result<Response, NodeError>>,
    },
}

/// Messages that must not wait behind requests or block their sender.
#[derive(Debug)]
pub(crate) enum Control {
    /// A new client connection, and its place at the door while it has not logged in.
    Connection(std::net::TcpStream, Option<StrangerSlot>),
    Listener(std::net::TcpListener),
    Layout {
        update: crate::layout::LayoutUpdate,
        done: Option<oneshot::Sender<Result<(), crate::shard::ShardError>>>,
    },
    /// This shard's receiver and sender of the replica bus (shard 0 starts it).
    Bus {
        deliveries: mpsc::UnboundedReceiver<braid_bus::Delivery>,
        sender: braid_bus::ShardSender,
        bundles: tokio::sync::broadcast::Receiver<braid_bus::BundleEvent>,
    },
    /// A partition journal's sync job finished (both of its files).
    GroupSynced {
        group: u64,
        job: u64,
        result: Result<(), braid_storage::SyncError>,
    },
    /// Answered once every control sent before it is handled: a metadata reply waits
    /// on it so the layout published before it is in place on every shard.
    Barrier(oneshot::Sender<()>),
    /// Walk this shard's copies for a batch of ended client sessions; answered with
    /// the copies that could not be proven.
    Retire {
        batch: Arc<crate::retirement::RetireBatch>,
        done: oneshot::Sender<Vec<crate::layout::PartitionKey>>,
    },
    Drain,
    Shutdown {
        done: std::sync::mpsc::Sender<()>,
    },
}

/// [`NodeShared::new_topics_from`] before it is known.
pub(crate) const TOPICS_UNKNOWN: u32 = u32::MAX;

/// What every shard knows of the node.
#[derive(Debug)]
pub(crate) struct NodeShared {
    pub(crate) config: NodeConfig,
    pub(crate) inboxes: Vec<mpsc::Sender<ShardRequest>>,
    pub(crate) controls: Vec<mpsc::UnboundedSender<Control>>,
    pub(crate) metrics: Vec<Arc<ShardMetrics>>,
    /// Runs the partition journals' syncs under `fsync = always` off the shards, many
    /// appends to one file per `fdatasync` (group commit).
    pub(crate) syncer: Arc<braid_storage::Syncer>,
    /// The replica bus's counters and peer states, once shard 0 started it
    /// (`/metrics`, `NodeStatus`).
    pub(crate) bus: std::sync::OnceLock<braid_bus::BusView>,
    /// When the node started (`NodeStatus`'s uptime).
    pub(crate) started: std::time::Instant,
    /// Buffers fetches read into, handed back once the answer is written.
    pub(crate) read_buffers: crate::buffers::ReadBuffers,
    /// Fetch-response bytes in flight over the node (`fetch_bytes_max`).
    pub(crate) fetch_bytes: Arc<tokio::sync::Semaphore>,
    /// Fetches waiting for the node's fetch budget now: while there are any, a
    /// connection whose answers do not move is closed sooner.
    pub(crate) fetch_budget_waiting: std::sync::atomic::AtomicUsize,
    /// Each user's (or source address's) share of the fetch budget, while in use.
    pub(crate) principals: std::sync::Mutex<HashMap<String, std::sync::Weak<PrincipalBudget>>>,
    /// Per user being guessed at, the slots of its delayed logins
    /// ([`LOGINS_DELAYED_PER_USER_MAX`]), while in use.
    pub(crate) login_slots:
        std::sync::Mutex<HashMap<String, std::sync::Weak<tokio::sync::Semaphore>>>,
    /// Bytes of client frames being received, over the node
    /// (`frame_bytes_in_flight_max`).
    pub(crate) frame_bytes: Arc<tokio::sync::Semaphore>,
    /// Client connections served now, over every shard (`connections_max`).
    pub(crate) connections: std::sync::atomic::AtomicUsize,
    /// Connections not logged in yet, and recent login failures (authentication on).
    pub(crate) door: std::sync::Mutex<crate::door::Door>,
    /// Each open partition as its owner shard publishes it: its high watermark, for
    /// the group coordinator (a commit beyond it is refused; read per commit, never on
    /// the produce or fetch path), and its primary and view as the owner last saw it
    /// (`ClusterInfo`, refreshed by the owner's timer). Written when partitions open or
    /// go.
    pub(crate) partitions_published:
        std::sync::RwLock<HashMap<PartitionKey, Arc<crate::partition::Published>>>,
    /// The member leading the metadata group, so coordinating consumer groups
    /// ([`NO_MEMBER`] while none is known), published by shard 0's timer.
    pub(crate) coordinator: std::sync::atomic::AtomicU8,
    /// Whether this member's metadata has caught up since the node started (its
    /// replica normal and every op it knows committed applied, and every shard holding
    /// the layout that follows): until then clients are answered `NotLeader`, never
    /// from metadata that lags (an empty stream list, `StreamNotFound`). Set once, by
    /// shard 0; a lone node is caught up when it starts.
    pub(crate) metadata_caught_up: std::sync::atomic::AtomicBool,
    /// The lowest topic id no topic created before this node started can have
    /// ([`TOPICS_UNKNOWN`] until the metadata replica knows it): on a member that lost
    /// its data, the partitions of topics from there on start trusted. Set once, by
    /// shard 0.
    pub(crate) new_topics_from: std::sync::atomic::AtomicU32,
    /// TLS on the client port, if configured.
    pub(crate) tls: Option<crate::tls::ClientTls>,
    /// Derives the stand-in credential shown for unknown users (drawn at start).
    pub(crate) stand_in_secret: [u8; 32],
    /// The cluster as this node knows it.
    pub(crate) cluster: ClusterView,
    /// Every group's replica as its shard last published it (`/replication`,
    /// `/health`, `/metrics`).
    pub(crate) board: crate::replication::status::Board,
}

/// The cluster's name, this node's member id and every member's client address.
#[derive(Debug, Clone)]
pub(crate) struct ClusterView {
    pub(crate) cluster_id: String,
    pub(crate) node_id: u8,
    pub(crate) members: Vec<braid_proto::client::ClusterMember>,
}

/// A connection's place among the strangers at the door (it has not logged in): given
/// back when it logs in or closes, whichever comes first.
pub(crate) struct StrangerSlot {
    shared: Arc<NodeShared>,
    source: std::net::IpAddr,
}

impl StrangerSlot {
    /// Lets a connection from `source` in as a stranger, or says why not.
    pub(crate) fn take(
        shared: &Arc<NodeShared>,
        source: std::net::IpAddr,
    ) -> Result<Self, crate::door::Turned> {
        shared.door().admit(source)?;
        Ok(Self {
            shared: Arc::clone(shared),
            source,
        })
    }
}

impl std::fmt::Debug for StrangerSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StrangerSlot")
            .field("source", &self.source)
            .finish_non_exhaustive()
    }
}

impl Drop for StrangerSlot {
    fn drop(&mut self) {
        self.shared.door().stranger_gone(self.source);
    }
}

/// A connection's place among its user's logged-in connections, given back when it
/// closes.
pub(crate) struct UserSlot {
    shared: Arc<NodeShared>,
    user: String,
}

impl UserSlot {
    /// Lets a connection that logged in as `user` stay, or `None` when the user holds
    /// `connections_per_user_max` connections already.
    pub(crate) fn take(shared: &Arc<NodeShared>, user: &str) -> Option<Self> {
        shared.door().admit_user(user).then(|| Self {
            shared: Arc::clone(shared),
            user: user.to_owned(),
        })
    }
}

impl std::fmt::Debug for UserSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UserSlot")
            .field("user", &self.user)
            .finish()
    }
}

impl Drop for UserSlot {
    fn drop(&mut self) {
        self.shared.door().user_gone(&self.user);
    }
}

/// "No member known" where a member id is published.
pub(crate) const NO_MEMBER: u8 = u8::MAX;

impl NodeShared {
    /// The member coordinating consumer groups, if one is known.
    pub(crate) fn coordinator(&self) -> Option<u8> {
        let member = self.coordinator.load(std::sync::atomic::Ordering::Relaxed);
        (member != NO_MEMBER).then_some(member)
    }

    /// The client address of `member`.
    pub(crate) fn client_addr_of(&self, member: u8) -> Option<&str> {
        self.cluster
            .members
            .iter()
            .find(|m| m.id == member)
            .map(|m| m.client_addr.as_str())
    }

    /// A `NotLeader` answer from this member for `what` ("this partition", "consumer
    /// groups"), led by `leader` if one is known: one form for every `NotLeader`,
    /// "node 1 does not lead this partition: node 2 at 127.0.0.1:7072 leads it", as
    /// `docs/protocol.md` gives it.
    /// The leader also goes as a typed detail (`ErrorDetail::Leader`), for programs.
    pub(crate) fn not_leader(&self, what: &str, leader: Option<u8>) -> crate::error::NodeError {
        use braid_proto::client::ErrorDetail;
        let leader = leader.and_then(|p| Some((p, self.client_addr_of(p)?)));
        let hint = leader.map_or_else(
            || "it is choosing a primary; retry".into(),
            |(p, addr)| format!("node {p} at {addr} leads it"),
        );
        let err = crate::error::NodeError::new(
            braid_proto::client::ErrorCode::NotLeader,
            format!("node {} does not lead {what}: {hint}", self.cluster.node_id),
        );
        match leader {
            Some((node_id, addr)) => err.with(ErrorDetail::Leader {
                node_id,
                client_addr: addr.to_owned(),
            }),
            None => err,
        }
    }

    /// The refusal of a read of offsets `from` to `to` of a partition, committed, that
    /// this member's log is copying from a peer (`NotLeader`: retriable, as a backup's).
    pub(crate) fn copying(&self, from: u64, to: u64) -> crate::error::NodeError {
        crate::error::NodeError::new(
            braid_proto::client::ErrorCode::NotLeader,
            format!(
                "node {} does not serve offsets {from} to {to} of this partition yet: its \
                 log is copying them from a peer; retry",
                self.cluster.node_id
            ),
        )
    }

    /// The door (a poisoned lock is taken as it is: its counts stay whole, each
    /// change being one step).
    pub(crate) fn door(&self) -> std::sync::MutexGuard<'_, crate::door::Door> {
        self.door
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The fetch-budget share of `principal` ("user NAME" or "address IP"), made when
    /// first needed and dropped with its last connection.
    pub(crate) fn principal_budget(&self, principal: &str) -> Arc<PrincipalBudget> {
        let mut principals = self
            .principals
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(budget) = principals.get(principal).and_then(std::sync::Weak::upgrade) {
            return budget;
        }
        if principals.len() >= 1024 {
            principals.retain(|_, budget| budget.strong_count() > 0);
        }
        let config = &self.config;
        let bytes = config
            .fetch_bytes_per_user_max
            .max(u64::from(config.connection_fetch_bytes_max))
            .min(config.fetch_bytes_max);
        let permits = usize::try_from(bytes)
            .unwrap_or(usize::MAX)
            .min(tokio::sync::Semaphore::MAX_PERMITS);
        let budget = Arc::new(PrincipalBudget {
            bytes: Arc::new(tokio::sync::Semaphore::new(permits)),
            waiting: std::sync::atomic::AtomicUsize::new(0),
        });
        principals.insert(principal.to_owned(), Arc::downgrade(&budget));
        budget
    }

    /// The slots of `user`'s delayed logins: at most [`LOGINS_DELAYED_PER_USER_MAX`]
    /// go through their delay and exchange at once, so connections from many
    /// addresses do not guess faster than a few.
    pub(crate) fn login_slots(&self, user: &str) -> Arc<tokio::sync::Semaphore> {
        let mut slots = self
            .login_slots
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(found) = slots.get(user).and_then(std::sync::Weak::upgrade) {
            return found;
        }
        if slots.len() >= 1024 {
            slots.retain(|_, s| s.strong_count() > 0);
        }
        let made = Arc::new(tokio::sync::Semaphore::new(LOGINS_DELAYED_PER_USER_MAX));
        slots.insert(user.to_owned(), Arc::downgrade(&made));
        made
    }

    pub(crate) fn shards(&self) -> usize {
        self.inboxes.len()
    }

    pub(crate) fn data_dir(&self) -> &PathBuf {
        &self.config.data_dir
    }
}

/// One user's (or, unauthenticated, one source address's) share of the node's fetch
/// budget, and how many of its fetches wait for it: while one does, its connections
/// whose answers make no progress are closed after `fetch_stall_contended_ms`, so one
/// of its consumers that reads nothing holds up its others only that long.
#[derive(Debug)]
pub(crate) struct PrincipalBudget {
    pub(crate) bytes: Arc<tokio::sync::Semaphore>,
    pub(crate) waiting: std::sync::atomic::AtomicUsize,
}

/// Delayed logins of one user that go through at once (each waits its delay, up to
/// 5 s, then its exchange): guessing one user's password, from any number of
/// addresses, gets at most this many tries per delay.
pub(crate) const LOGINS_DELAYED_PER_USER_MAX: usize = 8;

/// The wall clock in ms (group sessions, retention).
pub(crate) fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}
