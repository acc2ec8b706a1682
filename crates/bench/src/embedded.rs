//! A node in the benchmark's own process, on a temporary directory removed afterwards:
//! `braid bench --embedded` shows Braid's speed on any machine with one command.

use std::net::SocketAddr;
use std::path::Path;

use braid_node::{Node, NodeConfig, StartError};
use thiserror::Error;

/// Why the embedded node did not start.
#[derive(Debug, Error)]
pub enum EmbeddedError {
    /// The temporary data directory could not be made.
    #[error("creating a data directory under {parent}: {source}")]
    DataDir {
        /// Where it was to be made.
        parent: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// A `BRAID_*` variable does not parse.
    #[error("embedded node settings: {0}")]
    Config(#[from] braid_node::ConfigError),
    /// The node refused to start.
    #[error("starting the embedded node: {0}")]
    Start(#[from] StartError),
}

/// A running in-process node and its data directory.
#[derive(Debug)]
pub struct EmbeddedNode {
    node: Node,
    dir: tempfile::TempDir,
}

impl EmbeddedNode {
    /// Starts a node with default settings and any `BRAID_*` environment variables
    /// (client and HTTP ports on 127.0.0.1, chosen by the OS) on a fresh directory under `parent` (the system's temporary directory
    /// if `None`). Topic `fsync` policies come from the workload, not the node.
    ///
    /// # Errors
    /// [`EmbeddedError`].
    pub fn start(parent: Option<&Path>) -> Result<Self, EmbeddedError> {
        let parent = parent.map_or_else(std::env::temp_dir, Path::to_path_buf);
        let dir = tempfile::Builder::new()
            .prefix("braid-bench-")
            .tempdir_in(&parent)
            .map_err(|source| EmbeddedError::DataDir {
                parent: parent.display().to_string(),
                source,
            })?;
        // `BRAID_*` variables tune the node as they tune `braid server`; the directory
        // and the addresses are the benchmark's own.
        let mut config = NodeConfig::default();
        config.apply_env(std::env::vars())?;
        config.data_dir = dir.path().to_path_buf();
        config.client_addr = SocketAddr::from(([127, 0, 0, 1], 0));
        config.http_addr = SocketAddr::from(([127, 0, 0, 1], 0));
        let node = Node::start(config)?;
        Ok(Self { node, dir })
    }

    /// Where clients connect.
    pub fn client_addr(&self) -> SocketAddr {
        self.node.client_addr()
    }

    /// The node's data directory.
    pub fn data_dir(&self) -> &Path {
        self.dir.path()
    }

    /// Stops the node and removes its data.
    pub fn stop(self) {
        self.node.shutdown();
        // Dropping the directory removes it.
        drop(self.dir);
    }
}
