//! Nodes in the benchmark's own process, on a temporary directory removed afterwards:
//! `braid bench --embedded` shows Braid's speed on any machine with one command, and
//! `--embedded --members 3` the speed of a 3-node cluster on it.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::time::{Duration, Instant};

use braid_node::{ClusterSettings, MemberSettings, Node, NodeConfig, Secret, StartError};
use thiserror::Error;

/// Most members an embedded cluster may have.
pub const EMBEDDED_MEMBERS_MAX: u8 = 9;

/// How long the members of an embedded cluster get to link up and elect their
/// primaries before the run gives up.
const READY_WITHIN: Duration = Duration::from_secs(30);

/// Why the embedded nodes did not start.
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
    /// A node refused to start.
    #[error("starting the embedded node: {0}")]
    Start(#[from] StartError),
    /// No loopback ports could be reserved for the members.
    #[error("reserving loopback ports: {0}")]
    Ports(std::io::Error),
    /// The member count is out of range.
    #[error("an embedded cluster has 1 to {EMBEDDED_MEMBERS_MAX} members, not {0}")]
    Members(u8),
    /// The members did not all report themselves caught up in time.
    #[error("member {member} was not ready within {READY_WITHIN:?} (GET /ready)")]
    NotReady {
        /// The member that was not.
        member: u8,
    },
}

/// Running in-process nodes (one, or the members of one cluster) and their data
/// directory.
#[derive(Debug)]
pub struct EmbeddedNode {
    nodes: Vec<Node>,
    dir: tempfile::TempDir,
}

impl EmbeddedNode {
    /// Starts `members` nodes (1 for a single node, else one cluster on loopback) with
    /// default settings and any `BRAID_*` environment variables, on a fresh directory
    /// under `parent` (the system's temporary directory if `None`), and waits until
    /// every member is caught up. Client and HTTP ports are on 127.0.0.1, chosen by
    /// the OS. Topic `fsync` policies come from the workload, not the nodes.
    ///
    /// # Errors
    /// [`EmbeddedError`].
    pub fn start(parent: Option<&Path>, members: u8) -> Result<Self, EmbeddedError> {
        if !(1..=EMBEDDED_MEMBERS_MAX).contains(&members) {
            return Err(EmbeddedError::Members(members));
        }
        let parent = parent.map_or_else(std::env::temp_dir, Path::to_path_buf);
        let dir = tempfile::Builder::new()
            .prefix("braid-bench-")
            .tempdir_in(&parent)
            .map_err(|source| EmbeddedError::DataDir {
                parent: parent.display().to_string(),
                source,
            })?;
        // `BRAID_*` variables tune the nodes as they tune `braid server`; directories,
        // addresses and the cluster are the benchmark's own.
        let mut base = NodeConfig::default();
        base.apply_env(std::env::vars())?;
        base.http_addr = SocketAddr::from(([127, 0, 0, 1], 0));
        let mut tries = 0;
        let nodes = loop {
            tries += 1;
            match start_members(&base, dir.path(), members) {
                // A reserved port was taken before its member bound it: again, on new
                // ports (each try's members start on fresh directories).
                Err(EmbeddedError::Start(StartError::Bind { .. })) if tries < 10 => {
                    for id in 0..members {
                        let _ = std::fs::remove_dir_all(dir.path().join(format!("node-{id}")));
                    }
                }
                other => break other?,
            }
        };
        if members > 1 {
            for (id, node) in nodes.iter().enumerate() {
                wait_ready(node.http_addr(), Instant::now() + READY_WITHIN)
                    .then_some(())
                    .ok_or(EmbeddedError::NotReady { member: id as u8 })?;
            }
        }
        Ok(Self { nodes, dir })
    }

    /// Where clients connect: every member's client address.
    pub fn client_addrs(&self) -> Vec<SocketAddr> {
        self.nodes.iter().map(Node::client_addr).collect()
    }

    /// Every member's HTTP address (`/metrics`, `/ready`).
    pub fn http_addrs(&self) -> Vec<SocketAddr> {
        self.nodes.iter().map(Node::http_addr).collect()
    }

    /// The nodes' data directory (each member's is `node-ID` in it).
    pub fn data_dir(&self) -> &Path {
        self.dir.path()
    }

    /// Stops the nodes and removes their data.
    pub fn stop(self) {
        for node in self.nodes {
            node.shutdown();
        }
        // Dropping the directory removes it.
        drop(self.dir);
    }
}

/// Starts `members` nodes on `dir` (a single node in it, or each member in `node-ID`);
/// on an error the ones started are stopped.
fn start_members(base: &NodeConfig, dir: &Path, members: u8) -> Result<Vec<Node>, EmbeddedError> {
    let cluster = if members > 1 {
        Some(cluster_settings(members)?)
    } else {
        None
    };
    let mut nodes: Vec<Node> = Vec::new();
    for id in 0..members {
        let mut config = base.clone();
        config.data_dir = if members == 1 {
            dir.to_path_buf()
        } else {
            dir.join(format!("node-{id}"))
        };
        config.client_addr = SocketAddr::from(([127, 0, 0, 1], 0));
        config.cluster = cluster.clone().map(|mut cluster| {
            cluster.node_id = id;
            if let Some(me) = cluster.this_member() {
                config.client_addr = me.client_addr;
            }
            cluster
        });
        match Node::start(config) {
            Ok(node) => nodes.push(node),
            Err(err) => {
                for node in nodes {
                    node.shutdown();
                }
                return Err(err.into());
            }
        }
    }
    Ok(nodes)
}

/// The `[cluster]` of `members` members on loopback ports reserved now (bound, then
/// released: the nodes bind them a moment later), with a secret drawn for this run.
fn cluster_settings(members: u8) -> Result<ClusterSettings, EmbeddedError> {
    let reserve = || -> Result<Vec<SocketAddr>, EmbeddedError> {
        let listeners = (0..members)
            .map(|_| TcpListener::bind(("127.0.0.1", 0)))
            .collect::<Result<Vec<_>, _>>()
            .map_err(EmbeddedError::Ports)?;
        listeners
            .iter()
            .map(TcpListener::local_addr)
            .collect::<Result<_, _>>()
            .map_err(EmbeddedError::Ports)
    };
    let replica = reserve()?;
    let client = reserve()?;
    Ok(ClusterSettings {
        id: "bench".into(),
        members: (0..members)
            .map(|id| MemberSettings {
                id,
                replica_addr: replica[usize::from(id)],
                client_addr: client[usize::from(id)],
            })
            .collect(),
        secret: Some(Secret(random_secret())),
        // Every member starts on a new temporary directory, in a new cluster.
        init: true,
        ..ClusterSettings::default()
    })
}

/// 32 hex digits from the standard library's per-instance random hasher keys (seeded
/// by the OS): the secret only has to be unguessable for this run.
fn random_secret() -> String {
    use std::hash::{BuildHasher, Hasher};
    (0..2)
        .map(|_| {
            let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
            hasher.write_u64(std::process::id().into());
            format!("{:016x}", hasher.finish())
        })
        .collect()
}

/// Polls `GET /ready` on `http` until it answers 200 or `deadline` passes.
fn wait_ready(http: SocketAddr, deadline: Instant) -> bool {
    loop {
        if ready(http).unwrap_or(false) {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn ready(http: SocketAddr) -> std::io::Result<bool> {
    let mut stream = TcpStream::connect_timeout(&http, Duration::from_secs(1))?;
    stream.set_read_timeout(Some(Duration::from_secs(1)))?;
    stream.write_all(b"GET /ready HTTP/1.1\r\nHost: braid\r\nConnection: close\r\n\r\n")?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer)?;
    Ok(answer.starts_with("HTTP/1.1 200"))
}
