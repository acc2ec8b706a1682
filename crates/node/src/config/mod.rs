//! Node settings: defaults that work, then a TOML file, then `BRAID_*` environment
//! variables, then command-line flags (applied by the CLI), each overriding the last.
//! `docs/config.md` lists every setting.

use std::net::SocketAddr;
use std::path::PathBuf;

use serde::Deserialize;

pub mod cluster;

pub use cluster::{ClusterSettings, MemberSettings};

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
    /// Logs per shard that may hold open files at once; idle ones are released.
    pub open_logs_per_shard: usize,
    /// How long a graceful shutdown waits for in-flight requests (ms).
    pub shutdown_grace_ms: u64,
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
    /// Fetches one connection may have parked at a partition's end; more are answered
    /// at once.
    pub connection_waiting_fetches_max: u32,
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
    /// Retention by size per partition (bytes), 0 for none.
    pub retention_bytes: u64,
    /// Retention by age (ms), 0 for none.
    pub retention_ms: u64,
    /// Largest batch a producer may send (bytes).
    pub max_batch_bytes: u32,
    /// Log segment size (bytes).
    pub segment_bytes: u32,
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
            open_logs_per_shard: 1024,
            shutdown_grace_ms: 10_000,
            write_behind_bytes: braid_storage::WRITE_BEHIND_BYTES_DEFAULT,
            cached_tail_bytes: 0,
            recovery: RecoverySetting::Strict,
            connection_requests_max: 256,
            connection_fetch_bytes_max: 64 << 20,
            fetch_bytes_max: 512 << 20,
            connection_write_timeout_ms: 30_000,
            connection_waiting_fetches_max: 1024,
            connection_first_frame_ms: 10_000,
            connection_frame_ms: 30_000,
            connection_idle_ms: 600_000,
            connections_max: 10_000,
            connection_login_ms: 10_000,
            connection_login_frame_bytes_max: 64 * 1024,
            authentication: false,
            allow_unauthenticated: false,
            admin_password_file: None,
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
                "OPEN_LOGS_PER_SHARD" => self.open_logs_per_shard = parse(&value).map_err(bad)?,
                "SHUTDOWN_GRACE_MS" => self.shutdown_grace_ms = parse(&value).map_err(bad)?,
                "WRITE_BEHIND_BYTES" => self.write_behind_bytes = parse(&value).map_err(bad)?,
                "CACHED_TAIL_BYTES" => self.cached_tail_bytes = parse(&value).map_err(bad)?,
                "CONNECTION_REQUESTS_MAX" => {
                    self.connection_requests_max = parse(&value).map_err(bad)?
                }
                "CONNECTION_FETCH_BYTES_MAX" => {
                    self.connection_fetch_bytes_max = parse(&value).map_err(bad)?
                }
                "FETCH_BYTES_MAX" => self.fetch_bytes_max = parse(&value).map_err(bad)?,
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
                "CONNECTION_WRITE_TIMEOUT_MS" => {
                    self.connection_write_timeout_ms = parse(&value).map_err(bad)?
                }
                "AUTHENTICATION" => self.authentication = parse(&value).map_err(bad)?,
                "ALLOW_UNAUTHENTICATED" => {
                    self.allow_unauthenticated = parse(&value).map_err(bad)?
                }
                "ADMIN_PASSWORD_FILE" => self.admin_password_file = Some(PathBuf::from(&value)),
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
                    self.topic_defaults.retention_bytes = parse(&value).map_err(bad)?
                }
                "RETENTION_MS" => self.topic_defaults.retention_ms = parse(&value).map_err(bad)?,
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
        if let Some(cluster) = &self.cluster {
            cluster.check()?;
            cluster.read_secret()?;
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
        let defaults = &self.topic_defaults;
        if defaults.max_batch_bytes as u64 + 1024 > u64::from(self.frame_bytes_max) {
            return Err(ConfigError::Invalid(format!(
                "topic_defaults.max_batch_bytes ({}) must leave room in frame_bytes_max ({})",
                defaults.max_batch_bytes, self.frame_bytes_max
            )));
        }
        if !(braid_storage::SEGMENT_BYTES_MIN..=braid_storage::SEGMENT_BYTES_MAX)
            .contains(&defaults.segment_bytes)
        {
            return Err(ConfigError::Invalid(
                "topic_defaults.segment_bytes out of range".into(),
            ));
        }
        Ok(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_env_and_defaults_layer() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("braid.toml");
        std::fs::write(
            &path,
            "data_dir = \"/var/lib/braid\"\nshards = 3\ncached_tail_bytes = 67108864\nrecovery = \"truncate-at-damage\"\n[topic_defaults]\nfsync = \"never\"\n",
        )
        .unwrap();
        let mut config = NodeConfig::from_file(&path).unwrap();
        assert_eq!(config.shards, 3);
        assert_eq!(config.topic_defaults.fsync, FsyncSetting::Never);
        assert_eq!(config.client_addr, NodeConfig::default().client_addr);
        assert_eq!(config.cached_tail_bytes, 64 << 20);
        assert_eq!(config.write_behind_bytes, 8 << 20);
        assert_eq!(config.recovery, RecoverySetting::TruncateAtDamage);
        config
            .apply_env([
                ("BRAID_WRITE_BEHIND_BYTES".to_owned(), "0".to_owned()),
                ("BRAID_SHARDS".to_owned(), "2".to_owned()),
                ("BRAID_FSYNC".to_owned(), "interval".to_owned()),
                ("BRAID_RECOVERY".to_owned(), "strict".to_owned()),
                ("HOME".to_owned(), "/root".to_owned()),
            ])
            .unwrap();
        assert_eq!(config.shards, 2);
        assert_eq!(config.write_behind_bytes, 0);
        assert_eq!(config.topic_defaults.fsync, FsyncSetting::Interval);
        assert_eq!(config.recovery, RecoverySetting::Strict);
        let bad = config.apply_env([("BRAID_SHARDS".to_owned(), "two".to_owned())]);
        assert!(matches!(bad, Err(ConfigError::Env { .. })));
        std::fs::write(&path, "shardz = 3\n").unwrap();
        assert!(matches!(
            NodeConfig::from_file(&path),
            Err(ConfigError::Parse { .. })
        ));
        assert!(NodeConfig::default().resolve().unwrap().shards >= 1);
    }

    #[test]
    fn a_cluster_table_reads_from_toml_and_the_environment() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("braid.toml");
        let secret = dir.path().join("secret");
        std::fs::write(&secret, "a secret of at least sixteen bytes\n").unwrap();
        let members: String = (0..3)
            .map(|i| {
                format!(
                    "[[cluster.members]]\nid = {i}\nreplica_addr = \"127.0.0.1:{}\"\nclient_addr = \"127.0.0.1:{}\"\n",
                    7090 + i,
                    7070 + i
                )
            })
            .collect();
        std::fs::write(
            &path,
            format!(
                "[cluster]\nid = \"prod\"\nnode_id = 2\nsecret_file = {:?}\n{members}",
                secret.display().to_string()
            ),
        )
        .unwrap();
        let config = NodeConfig::from_file(&path).unwrap();
        let cluster = config.cluster.clone().unwrap();
        assert_eq!((cluster.members.len(), cluster.node_id), (3, 2));
        assert_eq!(cluster.links_per_peer, 1, "the default k");
        assert_eq!(cluster.read_secret().unwrap().unwrap().len(), 34);
        config.clone().resolve().unwrap();
        let mut moved = config;
        moved
            .apply_env([("BRAID_NODE_ID".to_owned(), "7".to_owned())])
            .unwrap();
        assert!(moved.resolve().is_err(), "node 7 is not a member");
        let mut from_env = NodeConfig::default();
        from_env
            .apply_env([
                ("BRAID_CLUSTER_ID".to_owned(), "one".to_owned()),
                (
                    "BRAID_CLUSTER_MEMBERS".to_owned(),
                    "0=127.0.0.1:7090/127.0.0.1:7070".to_owned(),
                ),
            ])
            .unwrap();
        assert_eq!(from_env.cluster.as_ref().unwrap().members.len(), 1);
        from_env.resolve().unwrap();
        assert!(
            NodeConfig::default().cluster.is_none(),
            "no table: a cluster of one"
        );
    }

    #[test]
    fn a_node_beyond_loopback_needs_authentication_or_an_explicit_opt_out() {
        let open = |authentication, allow_unauthenticated, ip: [u8; 4]| {
            NodeConfig {
                client_addr: SocketAddr::from((ip, 7070)),
                authentication,
                allow_unauthenticated,
                ..NodeConfig::default()
            }
            .resolve()
            .is_ok()
        };
        assert!(open(false, false, [127, 0, 0, 1]));
        assert!(!open(false, false, [0, 0, 0, 0]));
        assert!(!open(false, false, [10, 1, 2, 3]));
        assert!(open(true, false, [0, 0, 0, 0]));
        assert!(open(false, true, [0, 0, 0, 0]));
        let mut config = NodeConfig::default();
        config
            .apply_env([
                ("BRAID_AUTHENTICATION".to_owned(), "true".to_owned()),
                ("BRAID_ADMIN_PASSWORD".to_owned(), "hunter2".to_owned()),
                (
                    "BRAID_TLS_CERT_FILE".to_owned(),
                    "/etc/braid/cert.pem".to_owned(),
                ),
            ])
            .unwrap();
        assert!(config.authentication);
        assert!(
            !format!("{config:?}").contains("hunter2"),
            "a secret in debug output"
        );
        assert!(
            config.clone().resolve().is_err(),
            "a certificate without a key"
        );
        config.tls.key_file = Some("/etc/braid/key.pem".into());
        assert!(config.resolve().is_ok());
    }
}
