//! The Braid node: shards, the client protocol server, metadata, partitions, consumer
//! groups and the HTTP admin endpoint.
//!
//! A node runs one thread per shard, each with its own single-threaded tokio runtime.
//! Partitions belong to shards by a fixed hash; a connection's requests are forwarded to
//! the owning shard through bounded channels, so no lock is taken on the produce or
//! fetch path. Shard 0 also hosts the client listener, the replica bus and the
//! metadata group (streams, topics, users, committed offsets), replicated with VSR.
//!
//! ```no_run
//! let node = braid_node::Node::start(braid_node::NodeConfig::default()).unwrap();
//! println!("serving clients on {}", node.client_addr());
//! node.shutdown();
//! ```

mod access;
mod admin;
mod admin_bootstrap;
mod buffers;
mod client_sessions;
pub mod config;
mod connection;
mod coordinator;
mod data_dir;
mod door;
mod error;
pub mod groups;
mod http;
mod identity;
mod layout;
mod login;
mod mailbox;
pub mod metadata;
mod metrics;
mod node;
mod partition;
mod refused_partition;
mod replication;
mod retirement;
mod shard;
mod tls;

pub use admin_bootstrap::BootstrapError;
pub use config::{
    ClusterSettings, ConfigError, FsyncSetting, MemberSettings, NodeConfig, RecoverySetting,
    Secret, TlsSettings, TopicDefaults, SECRET_BYTES_MIN,
};
pub use error::NodeError;
pub use identity::{IdentityError, DATA_DIR_FORMAT};
pub use node::{Node, StartError};
pub use replication::shard_count::ShardCountError;
pub use tls::TlsError;
