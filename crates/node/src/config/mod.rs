//! Node settings: defaults that work, then a TOML file, then `BRAID_*` environment
//! variables, then command-line flags (applied by the CLI), each overriding the last.
//! `docs/config.md` lists every setting.

use std::net::SocketAddr;
use std::path::PathBuf;

use braid_proto::client::{
    FSYNC_INTERVAL_MS_MAX, MAX_BATCH_BYTES_MIN, RETENTION_BYTES_MAX, RETENTION_FOREVER,
    RETENTION_MS_MAX,
};
use serde::Deserialize;

pub mod cluster;

/// Longest of the node's timeouts and graces (`connection_*_ms`, `shutdown_grace_ms`,
/// `cluster.heartbeat_timeout_ms`): one day. A deadline that far out is a setting
/// mistaken for "never", and one beyond the clock's range would panic.
pub const TIMEOUT_MS_MAX: u64 = 86_400_000;

/// The ranges `docs/config.md` states, in the words of the errors.
const FSYNC_INTERVAL_MS_RANGE: &str = "1 to 3600000 (1 hour)";
const RETENTION_MS_RANGE: &str =
    "1 to 3155760000000 (100 years), or \"forever\" (also 0 or 18446744073709551615)";
const RETENTION_BYTES_RANGE: &str =
    "1 to 1152921504606846976 (2^60, 1 EiB), or \"forever\" for no size limit (also 0 or 18446744073709551615)";

pub use cluster::{ClusterSettings, MemberSettings, SECRET_BYTES_MIN};

/// Settings of one node.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NodeConfig {
    /// Where partitions and metadata live.
    pub data_dir: PathBuf,
    /// Address of the client protocol listener.
    pub client_addr: SocketAddr,
    /// Address of the HTTP admin listener (`/health`, `/ready`, `/replication`, `/metrics`).
    pub http_addr: SocketAddr,
    /// Shard threads; 0 means one per core.
    pub shards: usize,
    /// Largest client frame accepted (bytes).
    pub frame_bytes_max: u32,
    /// Bytes of client frames being received that the whole node may hold (a frame
    /// over 64 KiB takes its length from this before its body is read; while there is
    /// none, its socket is not read).
    pub frame_bytes_in_flight_max: u64,
    /// Logs per shard that may hold open files at once; idle ones are released.
    pub open_logs_per_shard: usize,
    /// How long a graceful shutdown waits for in-flight requests (ms).
    pub shutdown_grace_ms: u64,
    /// How often each shard applies retention to its partitions (ms).
    pub retention_check_ms: u64,
    /// Each partition log starts the kernel's write-back every this many appended bytes
    /// instead of letting dirty pages pile up; 0 leaves write-back to the kernel.
    pub write_behind_bytes: u64,
    /// Page-cache pages more than this many bytes behind the head of a partition's
    /// active segment are dropped once written back; 0 leaves the page cache to the
    /// kernel.
    pub cached_tail_bytes: u64,
    /// Requests one connection may have in flight (read, not yet answered); beyond it
    /// the connection's socket is not read (TCP pushes back on the client).
    pub connection_requests_max: u32,
    /// Fetch-response bytes one connection may hold in flight; a fetch's `max_bytes`
    /// is capped at it, and beyond it the connection's socket is not read.
    pub connection_fetch_bytes_max: u32,
    /// Fetch-response bytes the whole node may hold in flight, over all connections.
    pub fetch_bytes_max: u64,
    /// Fetch-response bytes one user (or, with authentication off, one source address)
    /// may hold over all its connections; taken between `connection_fetch_bytes_max`
    /// and `fetch_bytes_max`.
    pub fetch_bytes_per_user_max: u64,
    /// While fetches wait for the node's budget, a connection whose answers make no
    /// progress for this long (ms) is closed, releasing what it holds.
    pub fetch_stall_contended_ms: u64,
    /// Fetches one connection may have parked at a partition's end; more are answered
    /// at once.
    pub connection_waiting_fetches_max: u32,
    /// Connections that have not logged in (with authentication on) the node holds;
    /// at most half of `connections_max`.
    pub connections_unauthenticated_max: u32,
    /// Connections that have not logged in the node holds from one source address; at
    /// most a quarter of the node's budget for them, so one address cannot take it.
    pub connections_unauthenticated_per_source_max: u32,
    /// Connections one user may hold logged in, over the node (at most
    /// `connections_max`): one tenant cannot take every slot.
    pub connections_per_user_max: u32,
    /// Partitions one topic may have (at most the protocol's 10,000); a larger create
    /// is refused `QuotaExceeded`.
    pub topic_partitions_max: u32,
    /// Topics one stream may have.
    pub topics_per_stream_max: u32,
    /// Streams the cluster may have.
    pub streams_max: u32,
    /// Partitions the cluster may have over all topics (each member holds a replica
    /// of every one).
    pub partitions_max: u32,
    /// Partitions one stream's topics may have together: one tenant's stream cannot
    /// take the whole `partitions_max`.
    pub partitions_per_stream_max: u32,
    /// Members one consumer group may have; a join beyond is refused `QuotaExceeded`.
    pub group_members_max: u32,
    /// Consumer groups with members the coordinator keeps, over all streams; a join
    /// that would start another is refused `QuotaExceeded`.
    pub groups_max: u32,
    /// Consumer groups one stream may have, with members and with committed offsets
    /// each: one tenant's stream cannot take the node's whole `groups_max`, nor keep
    /// offsets for groups without end.
    pub groups_per_stream_max: u32,
    /// A new connection's first complete frame must arrive within this (ms).
    pub connection_first_frame_ms: u64,
    /// A frame, once its first byte arrived, must be whole within this (ms).
    pub connection_frame_ms: u64,
    /// A connection with nothing in flight is closed after this long without a frame
    /// (ms).
    pub connection_idle_ms: u64,
    /// With authentication on, a connection must have logged in within this (ms).
    pub connection_login_ms: u64,
    /// With authentication on, the largest frame a connection may send before it
    /// logged in (bytes): a stranger cannot make the node buffer `frame_bytes_max`.
    pub connection_login_frame_bytes_max: u32,
    /// Client connections the node serves at once; more are closed at accept.
    pub connections_max: u32,
    /// A connection whose answers make no progress for this long (its client reads
    /// nothing) is closed, releasing what it held (ms).
    pub connection_write_timeout_ms: u64,
    /// What opening a partition does with damage below its recovery point that intact
    /// batches follow (damage above it, never synced, is always a torn tail).
    pub recovery: RecoverySetting,
    /// Every client must authenticate (SCRAM-SHA-256) before any other request, and
    /// every request checks the user's permissions.
    pub authentication: bool,
    /// Let a node listen on a non-loopback address without authentication. Without it
    /// such a node refuses to start (protected mode).
    pub allow_unauthenticated: bool,
    /// A file holding the bearer token `/metrics` and `/replication` ask for
    /// (`Authorization: Bearer TOKEN`). Required when `http_addr` is not a loopback
    /// address, unless `allow_unauthenticated` says otherwise.
    pub http_token_file: Option<PathBuf>,
    /// A file holding the bootstrap admin's password, read when authentication is on
    /// and no user exists yet (also `BRAID_ADMIN_PASSWORD`). Without either, a random
    /// password is written to `<data_dir>/admin-password`.
    pub admin_password_file: Option<PathBuf>,
    /// The bootstrap admin's password from `BRAID_ADMIN_PASSWORD` (never from a file
    /// setting or a flag, which show in `ps` and in config dumps).
    #[serde(skip)]
    pub admin_password: Option<Secret>,
    /// TLS on the client port.
    pub tls: TlsSettings,
    /// The cluster this node is a member of; `None` (no `[cluster]` table): a cluster
    /// of one.
    pub cluster: Option<ClusterSettings>,
    /// Defaults for new topics.
    pub topic_defaults: TopicDefaults,
}

/// A string kept out of logs and debug output.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(pub String);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(..)")
    }
}

/// TLS on the client port: on when both `cert_file` and `key_file` are set.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TlsSettings {
    /// The node's certificate chain (PEM).
    pub cert_file: Option<PathBuf>,
    /// The node's private key (PEM: PKCS#8, PKCS#1 or SEC1).
    pub key_file: Option<PathBuf>,
    /// With this CA bundle (PEM), every client must present a certificate it signed
    /// (mutual TLS); without it, clients present none.
    pub client_ca_file: Option<PathBuf>,
}

impl TlsSettings {
    /// Whether TLS is on.
    pub fn enabled(&self) -> bool {
        self.cert_file.is_some() && self.key_file.is_some()
    }
}

/// Defaults a new topic gets for the settings its creator leaves at 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TopicDefaults {
    /// `always`, `interval` or `never`.
    pub fsync: FsyncSetting,
    /// For `fsync = "interval"` (ms).
    pub fsync_interval_ms: u64,
    /// Retention by size per partition (bytes), at most [`RETENTION_BYTES_MAX`];
    /// [`RETENTION_FOREVER`] (`"forever"` in TOML and `BRAID_RETENTION_BYTES`) for no
    /// size limit. 0, the older spelling, means the same.
    #[serde(deserialize_with = "retention")]
    pub retention_bytes: u64,
    /// Retention by age (ms), at most [`RETENTION_MS_MAX`]; [`RETENTION_FOREVER`]
    /// (`"forever"` in TOML and `BRAID_RETENTION_MS`) to keep forever. 0, the older
    /// spelling, means the same.
    #[serde(deserialize_with = "retention")]
    pub retention_ms: u64,
    /// Largest batch a producer may send (bytes).
    pub max_batch_bytes: u32,
    /// Log segment size (bytes).
    pub segment_bytes: u32,
}

/// Reads a retention setting: a whole number, or `"forever"` ([`RETENTION_FOREVER`]).
/// Its range is checked by [`NodeConfig::resolve`].
fn retention<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<u64, D::Error> {
    struct Retention;
    impl serde::de::Visitor<'_> for Retention {
        type Value = u64;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a whole number or \"forever\"")
        }
        fn visit_u64<E: serde::de::Error>(self, value: u64) -> Result<u64, E> {
            Ok(value)
        }
        fn visit_i64<E: serde::de::Error>(self, value: i64) -> Result<u64, E> {
            u64::try_from(value).map_err(|_| {
                E::custom(format!(
                    "{value} is negative: expected a whole number or \"forever\""
                ))
            })
        }
        fn visit_str<E: serde::de::Error>(self, value: &str) -> Result<u64, E> {
            parse_retention(value).map_err(E::custom)
        }
    }
    deserializer.deserialize_any(Retention)
}

/// Parses a retention setting's text: a whole number, or `forever`.
fn parse_retention(value: &str) -> Result<u64, String> {
    match value {
        "forever" => Ok(RETENTION_FOREVER),
        _ => value
            .parse::<u64>()
            .map_err(|e| format!("{e}: expected a whole number or \"forever\"")),
    }
}

/// Whether a retention setting of the config is in its range: 0 or
/// [`RETENTION_FOREVER`] (no limit), or 1 to `max`.
fn retention_in_range(value: u64, max: u64) -> bool {
    value <= max || value == RETENTION_FOREVER
}

/// The `recovery` setting's values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RecoverySetting {
    /// Refuse to start, naming the file and byte position.
    #[default]
    Strict,
    /// Cut the partition at the damage and start, logging what was dropped.
    TruncateAtDamage,
}

impl RecoverySetting {
    /// The log's mode.
    pub fn mode(self) -> braid_storage::RecoveryMode {
        match self {
            Self::Strict => braid_storage::RecoveryMode::Strict,
            Self::TruncateAtDamage => braid_storage::RecoveryMode::TruncateAtDamage,
        }
    }
}

/// The `fsync` setting's values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FsyncSetting {
    /// Acknowledge only what is on disk (group commit).
    Always,
    /// Sync every `fsync_interval_ms`.
    Interval,
    /// Leave it to the kernel (and, in a cluster, to replication).
    Never,
}

impl Default for TopicDefaults {
    fn default() -> Self {
        Self {
            fsync: FsyncSetting::Always,
            fsync_interval_ms: 1000,
            retention_bytes: 0,
            retention_ms: 7 * 24 * 3600 * 1000,
            max_batch_bytes: 4 << 20,
            segment_bytes: 1 << 30,
        }
    }
}

impl Default for NodeConfig {
    fn default() -> Self {
        Self {
            data_dir: PathBuf::from("./braid-data"),
            client_addr: SocketAddr::from(([127, 0, 0, 1], 7070)),
            http_addr: SocketAddr::from(([127, 0, 0, 1], 7080)),
            shards: 0,
            frame_bytes_max: braid_proto::client::FRAME_BYTES_MAX_DEFAULT,
            frame_bytes_in_flight_max: 256 << 20,
            open_logs_per_shard: 1024,
            shutdown_grace_ms: 10_000,
            retention_check_ms: 60_000,
            write_behind_bytes: braid_storage::WRITE_BEHIND_BYTES_DEFAULT,
            cached_tail_bytes: 0,
            recovery: RecoverySetting::Strict,
            connection_requests_max: 256,
            connection_fetch_bytes_max: 64 << 20,
            fetch_bytes_max: 512 << 20,
            fetch_bytes_per_user_max: 128 << 20,
            fetch_stall_contended_ms: 2_000,
            connection_write_timeout_ms: 30_000,
            connection_waiting_fetches_max: 1024,
            connections_unauthenticated_max: 1_000,
            connections_unauthenticated_per_source_max: 64,
            connections_per_user_max: 1_000,
            topic_partitions_max: 1_000,
            topics_per_stream_max: 1_000,
            streams_max: 10_000,
            partitions_max: 100_000,
            partitions_per_stream_max: 10_000,
            group_members_max: 1_000,
            groups_max: 10_000,
            groups_per_stream_max: 1_000,
            connection_first_frame_ms: 10_000,
            connection_frame_ms: 30_000,
            connection_idle_ms: 600_000,
            connections_max: 10_000,
            connection_login_ms: 10_000,
            connection_login_frame_bytes_max: 64 * 1024,
            authentication: false,
            allow_unauthenticated: false,
            admin_password_file: None,
            http_token_file: None,
            admin_password: None,
            tls: TlsSettings::default(),
            cluster: None,
            topic_defaults: TopicDefaults::default(),
        }
    }
}

/// A setting that could not be read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The file could not be read.
    #[error("reading {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The file is not valid TOML for these settings.
    #[error("{path}: {message}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// An environment variable holds a bad value.
    #[error("environment variable {name}={value:?}: {reason}")]
    Env {
        /// The variable.
        name: String,
        /// Its value.
        value: String,
        /// What is wrong.
        reason: String,
    },
    /// A value is out of range.
    #[error("{0}")]
    Invalid(String),
}

impl NodeConfig {
    /// Reads a TOML file over the defaults.
    ///
    /// # Errors
    /// [`ConfigError::Read`], [`ConfigError::Parse`].
    pub fn from_file(path: impl Into<PathBuf>) -> Result<Self, ConfigError> {
        let path = path.into();
        let text = std::fs::read_to_string(&path).map_err(|source| ConfigError::Read {
            path: path.clone(),
            source,
        })?;
        toml::from_str(&text).map_err(|e| ConfigError::Parse {
            path,
            message: e.to_string(),
        })
    }

    /// Applies `BRAID_*` variables from `vars` (usually `std::env::vars()`).
    ///
    /// # Errors
    /// [`ConfigError::Env`] for a value that does not parse.
    pub fn apply_env(
        &mut self,
        vars: impl IntoIterator<Item = (String, String)>,
    ) -> Result<(), ConfigError> {
        for (name, value) in vars {
            let Some(key) = name.strip_prefix("BRAID_") else {
                continue;
            };
            let bad = |reason: String| ConfigError::Env {
                name: name.clone(),
                value: value.clone(),
                reason,
            };
            fn parse<T: std::str::FromStr>(value: &str) -> Result<T, String>
            where
                T::Err: std::fmt::Display,
            {
                value.parse::<T>().map_err(|e| e.to_string())
            }
            match key {
                "DATA_DIR" => self.data_dir = PathBuf::from(&value),
                "CLIENT_ADDR" => self.client_addr = parse(&value).map_err(bad)?,
                "HTTP_ADDR" => self.http_addr = parse(&value).map_err(bad)?,
                "SHARDS" => self.shards = parse(&value).map_err(bad)?,
                "FRAME_BYTES_MAX" => self.frame_bytes_max = parse(&value).map_err(bad)?,
                "FRAME_BYTES_IN_FLIGHT_MAX" => {
                    self.frame_bytes_in_flight_max = parse(&value).map_err(bad)?
                }
                "OPEN_LOGS_PER_SHARD" => self.open_logs_per_shard = parse(&value).map_err(bad)?,
                "SHUTDOWN_GRACE_MS" => self.shutdown_grace_ms = parse(&value).map_err(bad)?,
                "RETENTION_CHECK_MS" => self.retention_check_ms = parse(&value).map_err(bad)?,
                "WRITE_BEHIND_BYTES" => self.write_behind_bytes = parse(&value).map_err(bad)?,
                "CACHED_TAIL_BYTES" => self.cached_tail_bytes = parse(&value).map_err(bad)?,
                "CONNECTION_REQUESTS_MAX" => {
                    self.connection_requests_max = parse(&value).map_err(bad)?
                }
                "CONNECTION_FETCH_BYTES_MAX" => {
                    self.connection_fetch_bytes_max = parse(&value).map_err(bad)?
                }
                "FETCH_BYTES_MAX" => self.fetch_bytes_max = parse(&value).map_err(bad)?,
                "FETCH_BYTES_PER_USER_MAX" => {
                    self.fetch_bytes_per_user_max = parse(&value).map_err(bad)?
                }
                "FETCH_STALL_CONTENDED_MS" => {
                    self.fetch_stall_contended_ms = parse(&value).map_err(bad)?
                }
                "CONNECTION_FIRST_FRAME_MS" => {
                    self.connection_first_frame_ms = parse(&value).map_err(bad)?
                }
                "CONNECTION_FRAME_MS" => self.connection_frame_ms = parse(&value).map_err(bad)?,
                "CONNECTION_IDLE_MS" => self.connection_idle_ms = parse(&value).map_err(bad)?,
                "CONNECTIONS_MAX" => self.connections_max = parse(&value).map_err(bad)?,
                "CONNECTION_LOGIN_MS" => self.connection_login_ms = parse(&value).map_err(bad)?,
                "CONNECTION_LOGIN_FRAME_BYTES_MAX" => {
                    self.connection_login_frame_bytes_max = parse(&value).map_err(bad)?
                }
                "CONNECTION_WAITING_FETCHES_MAX" => {
                    self.connection_waiting_fetches_max = parse(&value).map_err(bad)?
                }
                "CONNECTIONS_UNAUTHENTICATED_MAX" => {
                    self.connections_unauthenticated_max = parse(&value).map_err(bad)?
                }
                "CONNECTIONS_UNAUTHENTICATED_PER_SOURCE_MAX" => {
                    self.connections_unauthenticated_per_source_max = parse(&value).map_err(bad)?
                }
                "CONNECTIONS_PER_USER_MAX" => {
                    self.connections_per_user_max = parse(&value).map_err(bad)?
                }
                "TOPIC_PARTITIONS_MAX" => self.topic_partitions_max = parse(&value).map_err(bad)?,
                "PARTITIONS_PER_STREAM_MAX" => {
                    self.partitions_per_stream_max = parse(&value).map_err(bad)?
                }
                "TOPICS_PER_STREAM_MAX" => {
                    self.topics_per_stream_max = parse(&value).map_err(bad)?
                }
                "STREAMS_MAX" => self.streams_max = parse(&value).map_err(bad)?,
                "PARTITIONS_MAX" => self.partitions_max = parse(&value).map_err(bad)?,
                "GROUP_MEMBERS_MAX" => self.group_members_max = parse(&value).map_err(bad)?,
                "GROUPS_MAX" => self.groups_max = parse(&value).map_err(bad)?,
                "GROUPS_PER_STREAM_MAX" => {
                    self.groups_per_stream_max = parse(&value).map_err(bad)?;
                }
                "CONNECTION_WRITE_TIMEOUT_MS" => {
                    self.connection_write_timeout_ms = parse(&value).map_err(bad)?
                }
                "AUTHENTICATION" => self.authentication = parse(&value).map_err(bad)?,
                "ALLOW_UNAUTHENTICATED" => {
                    self.allow_unauthenticated = parse(&value).map_err(bad)?
                }
                "ADMIN_PASSWORD_FILE" => self.admin_password_file = Some(PathBuf::from(&value)),
                "HTTP_TOKEN_FILE" => self.http_token_file = Some(PathBuf::from(&value)),
                "ADMIN_PASSWORD" => self.admin_password = Some(Secret(value.clone())),
                "TLS_CERT_FILE" => self.tls.cert_file = Some(PathBuf::from(&value)),
                "TLS_KEY_FILE" => self.tls.key_file = Some(PathBuf::from(&value)),
                "TLS_CLIENT_CA_FILE" => self.tls.client_ca_file = Some(PathBuf::from(&value)),
                "CLUSTER_ID" => self.cluster_mut().id = value.clone(),
                "NODE_ID" => self.cluster_mut().node_id = parse(&value).map_err(bad)?,
                "CLUSTER_MEMBERS" => {
                    self.cluster_mut().members = cluster::parse_members(&value).map_err(bad)?
                }
                "CLUSTER_SECRET" => self.cluster_mut().secret = Some(Secret(value.clone())),
                "CLUSTER_MEMBER_KEYS_FILE" => {
                    self.cluster_mut().member_keys_file = Some(PathBuf::from(&value))
                }
                "CLUSTER_SECRET_FILE" => {
                    self.cluster_mut().secret_file = Some(PathBuf::from(&value))
                }
                "LINKS_PER_PEER" => {
                    self.cluster_mut().links_per_peer = parse(&value).map_err(bad)?
                }
                "HEARTBEAT_TIMEOUT_MS" => {
                    self.cluster_mut().heartbeat_timeout_ms = parse(&value).map_err(bad)?
                }
                "CLUSTER_REJOIN" => self.cluster_mut().rejoin = parse(&value).map_err(bad)?,
                "CLUSTER_INIT" => self.cluster_mut().init = parse(&value).map_err(bad)?,
                "RECOVERY" => {
                    self.recovery = match value.as_str() {
                        "strict" => RecoverySetting::Strict,
                        "truncate-at-damage" => RecoverySetting::TruncateAtDamage,
                        _ => return Err(bad("expected strict or truncate-at-damage".into())),
                    }
                }
                "FSYNC" => {
                    self.topic_defaults.fsync = match value.as_str() {
                        "always" => FsyncSetting::Always,
                        "interval" => FsyncSetting::Interval,
                        "never" => FsyncSetting::Never,
                        _ => return Err(bad("expected always, interval or never".into())),
                    }
                }
                "FSYNC_INTERVAL_MS" => {
                    self.topic_defaults.fsync_interval_ms = parse(&value).map_err(bad)?
                }
                "RETENTION_BYTES" => {
                    self.topic_defaults.retention_bytes = parse_retention(&value).map_err(bad)?
                }
                "RETENTION_MS" => {
                    self.topic_defaults.retention_ms = parse_retention(&value).map_err(bad)?
                }
                "MAX_BATCH_BYTES" => {
                    self.topic_defaults.max_batch_bytes = parse(&value).map_err(bad)?
                }
                "SEGMENT_BYTES" => {
                    self.topic_defaults.segment_bytes = parse(&value).map_err(bad)?
                }
                // BRAID_CONFIG names the file and is read by the CLI; others are not ours.
                _ => {}
            }
        }
        Ok(())
    }

    /// The `[cluster]` table, made (with its defaults) if it was not there.
    pub fn cluster_mut(&mut self) -> &mut ClusterSettings {
        self.cluster.get_or_insert_with(ClusterSettings::default)
    }

    /// The HTTP admin port's bearer token, read from `http_token_file` (its first
    /// line), if one is set.
    ///
    /// # Errors
    /// The file cannot be read, or the token is shorter than 16 bytes.
    pub fn http_token(&self) -> Result<Option<String>, ConfigError> {
        let Some(path) = &self.http_token_file else {
            return Ok(None);
        };
        let text = std::fs::read_to_string(path).map_err(|err| {
            ConfigError::Invalid(format!("http_token_file {}: {err}", path.display()))
        })?;
        let token = text.lines().next().unwrap_or("").trim().to_owned();
        if token.len() < 16 {
            return Err(ConfigError::Invalid(format!(
                "the token in http_token_file {} is shorter than 16 bytes",
                path.display()
            )));
        }
        Ok(Some(token))
    }

    /// Checks ranges and resolves `shards = 0` to the core count.
    ///
    /// # Errors
    /// [`ConfigError::Invalid`].
    pub fn resolve(mut self) -> Result<Self, ConfigError> {
        if self.shards == 0 {
            self.shards = std::thread::available_parallelism().map_or(1, |n| n.get());
        }
        if self.shards > 256 {
            return Err(ConfigError::Invalid(format!(
                "shards = {} (at most 256)",
                self.shards
            )));
        }
        if self.frame_bytes_max < 1024 {
            return Err(ConfigError::Invalid(
                "frame_bytes_max must be at least 1024".into(),
            ));
        }
        for (name, value) in [
            ("group_members_max", self.group_members_max),
            ("topic_partitions_max", self.topic_partitions_max),
            ("topics_per_stream_max", self.topics_per_stream_max),
            ("streams_max", self.streams_max),
            ("partitions_max", self.partitions_max),
            (
                "connections_unauthenticated_max",
                self.connections_unauthenticated_max,
            ),
            (
                "connections_unauthenticated_per_source_max",
                self.connections_unauthenticated_per_source_max,
            ),
            ("groups_max", self.groups_max),
            ("groups_per_stream_max", self.groups_per_stream_max),
            ("connections_per_user_max", self.connections_per_user_max),
            ("partitions_per_stream_max", self.partitions_per_stream_max),
        ] {
            if value == 0 {
                return Err(ConfigError::Invalid(format!("{name} must be at least 1")));
            }
        }
        // A whole frame must fit, or one would wait for ever.
        if self.frame_bytes_in_flight_max < u64::from(self.frame_bytes_max) {
            return Err(ConfigError::Invalid(format!(
                "frame_bytes_in_flight_max ({}) must be at least frame_bytes_max ({})",
                self.frame_bytes_in_flight_max, self.frame_bytes_max
            )));
        }
        if self.connection_requests_max == 0 {
            return Err(ConfigError::Invalid(
                "connection_requests_max must be at least 1".into(),
            ));
        }
        if self.connection_fetch_bytes_max < 64 * 1024 {
            return Err(ConfigError::Invalid(
                "connection_fetch_bytes_max must be at least 65536".into(),
            ));
        }
        // One fetch takes up to a connection's share of the node's budget at once.
        if self.fetch_bytes_max < u64::from(self.connection_fetch_bytes_max) {
            return Err(ConfigError::Invalid(format!(
                "fetch_bytes_max ({}) must be at least connection_fetch_bytes_max ({})",
                self.fetch_bytes_max, self.connection_fetch_bytes_max
            )));
        }
        if self.fetch_stall_contended_ms == 0 {
            return Err(ConfigError::Invalid(
                "fetch_stall_contended_ms must be at least 1".into(),
            ));
        }
        // Protected mode: a node reachable from other machines must not let anyone who
        // reaches its port do anything, unless told so in as many words.
        if !self.authentication
            && !self.allow_unauthenticated
            && !self.client_addr.ip().is_loopback()
        {
            return Err(ConfigError::Invalid(format!(
                "refusing to serve clients on {} without authentication: set \
                 authentication = true (and create users), or allow_unauthenticated = true \
                 to accept any client that reaches the port",
                self.client_addr
            )));
        }
        // The same for the HTTP admin port: what it shows (every group, every counter)
        // is for operators, so off loopback it asks for a token.
        if self.http_token_file.is_none()
            && !self.allow_unauthenticated
            && !self.http_addr.ip().is_loopback()
        {
            return Err(ConfigError::Invalid(format!(
                "refusing to serve the HTTP admin port on {} without a token: set \
                 http_token_file, or allow_unauthenticated = true to show it to anyone \
                 who reaches the port",
                self.http_addr
            )));
        }
        self.http_token()?;
        if let Some(cluster) = &self.cluster {
            cluster.check()?;
            cluster.link_keys()?;
        }
        if self.connection_login_frame_bytes_max < 1024 {
            return Err(ConfigError::Invalid(
                "connection_login_frame_bytes_max must be at least 1024".into(),
            ));
        }
        if self.tls.cert_file.is_some() != self.tls.key_file.is_some() {
            return Err(ConfigError::Invalid(
                "tls.cert_file and tls.key_file are set together".into(),
            ));
        }
        if self.tls.client_ca_file.is_some() && !self.tls.enabled() {
            return Err(ConfigError::Invalid(
                "tls.client_ca_file needs tls.cert_file and tls.key_file".into(),
            ));
        }
        if !(1..=TIMEOUT_MS_MAX).contains(&self.retention_check_ms) {
            return Err(ConfigError::Invalid(format!(
                "retention_check_ms = {} is out of range: 1 to {TIMEOUT_MS_MAX} (1 day)",
                self.retention_check_ms
            )));
        }
        for (name, value) in [
            ("shutdown_grace_ms", self.shutdown_grace_ms),
            ("connection_first_frame_ms", self.connection_first_frame_ms),
            ("connection_frame_ms", self.connection_frame_ms),
            ("connection_idle_ms", self.connection_idle_ms),
            ("connection_login_ms", self.connection_login_ms),
            (
                "connection_write_timeout_ms",
                self.connection_write_timeout_ms,
            ),
        ] {
            if value > TIMEOUT_MS_MAX {
                return Err(ConfigError::Invalid(format!(
                    "{name} = {value} is out of range: at most {TIMEOUT_MS_MAX} (1 day)"
                )));
            }
        }
        self.topic_defaults.check(self.frame_bytes_max)?;
        Ok(self)
    }
}

impl TopicDefaults {
    /// Checks every setting against its range (`docs/config.md`), on a node whose
    /// largest frame is `frame_bytes_max`.
    ///
    /// # Errors
    /// [`ConfigError::Invalid`], naming the first setting out of range and its range.
    pub fn check(&self, frame_bytes_max: u32) -> Result<(), ConfigError> {
        let out_of_range = |name: &str, value: u64, range: &str| {
            Err(ConfigError::Invalid(format!(
                "topic_defaults.{name} = {value} is out of range: {range}"
            )))
        };
        let defaults = self;
        if !(1..=FSYNC_INTERVAL_MS_MAX).contains(&defaults.fsync_interval_ms) {
            return out_of_range(
                "fsync_interval_ms",
                defaults.fsync_interval_ms,
                FSYNC_INTERVAL_MS_RANGE,
            );
        }
        if !retention_in_range(defaults.retention_ms, RETENTION_MS_MAX) {
            return out_of_range("retention_ms", defaults.retention_ms, RETENTION_MS_RANGE);
        }
        if !retention_in_range(defaults.retention_bytes, RETENTION_BYTES_MAX) {
            return out_of_range(
                "retention_bytes",
                defaults.retention_bytes,
                RETENTION_BYTES_RANGE,
            );
        }
        if !(braid_storage::SEGMENT_BYTES_MIN..=braid_storage::SEGMENT_BYTES_MAX)
            .contains(&defaults.segment_bytes)
        {
            return out_of_range(
                "segment_bytes",
                defaults.segment_bytes.into(),
                "1024 to 2147483647 (2 GiB - 1)",
            );
        }
        if !(MAX_BATCH_BYTES_MIN..=defaults.segment_bytes).contains(&defaults.max_batch_bytes) {
            return out_of_range(
                "max_batch_bytes",
                defaults.max_batch_bytes.into(),
                &format!("1024 to segment_bytes ({})", defaults.segment_bytes),
            );
        }
        if defaults.max_batch_bytes as u64 + 1024 > u64::from(frame_bytes_max) {
            return Err(ConfigError::Invalid(format!(
                "topic_defaults.max_batch_bytes ({}) must leave room in frame_bytes_max ({})",
                defaults.max_batch_bytes, frame_bytes_max
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
