//! Starting an in-process node for tests.

// A panic in a test is a failed assertion, not a crash on outside data.
#![allow(clippy::unwrap_used, clippy::expect_used)]
#![allow(dead_code)] // each test file uses a different part of it

use braid_node::{FsyncSetting, Node, NodeConfig};

pub(crate) struct TestNode {
    pub(crate) node: Option<Node>,
    pub(crate) dir: tempfile::TempDir,
}

pub(crate) fn config(dir: &std::path::Path, fsync: FsyncSetting) -> NodeConfig {
    let mut config = NodeConfig {
        data_dir: dir.to_path_buf(),
        // Below the ephemeral range (see `addresses`): tests start the node again on
        // the same address.
        client_addr: addresses(1)[0],
        http_addr: "127.0.0.1:0".parse().unwrap(),
        shards: 2,
        shutdown_grace_ms: 2_000,
        ..NodeConfig::default()
    };
    config.topic_defaults.fsync = fsync;
    config
}

impl TestNode {
    pub(crate) fn start(fsync: FsyncSetting) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let node = Node::start(config(dir.path(), fsync)).unwrap();
        Self {
            node: Some(node),
            dir,
        }
    }

    pub(crate) fn addr(&self) -> std::net::SocketAddr {
        self.node.as_ref().unwrap().client_addr()
    }

    pub(crate) fn http_addr(&self) -> std::net::SocketAddr {
        self.node.as_ref().unwrap().http_addr()
    }

    pub(crate) fn restart(&mut self) {
        let old = self.node.take().unwrap();
        let fsync = FsyncSetting::Always;
        old.shutdown();
        self.node = Some(Node::start(config(self.dir.path(), fsync)).unwrap());
    }
}

/// Creates stream `stream` and topic `topic` with `partitions` (other settings default).
pub(crate) async fn create_topic(
    client: &braid_client::Client,
    stream: &str,
    topic: &str,
    partitions: u32,
) {
    client.create_stream(stream).await.unwrap();
    let settings = braid_proto::client::TopicSettings {
        partitions,
        ..braid_proto::client::TopicSettings::default()
    };
    client.create_topic(stream, topic, settings).await.unwrap();
}

/// The body of `GET path` on the node's HTTP port.
pub(crate) async fn http_get(http: std::net::SocketAddr, path: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(http).await.unwrap();
    let request = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut text = String::new();
    stream.read_to_string(&mut text).await.unwrap();
    text.split_once("\r\n\r\n")
        .map(|(_, body)| body.to_string())
        .unwrap_or_default()
}

/// One value from the node's `/metrics` (the line `NAME VALUE`).
pub(crate) async fn metric(http: std::net::SocketAddr, name: &str) -> u64 {
    let text = http_get(http, "/metrics").await;
    text.lines()
        .find(|l| l.split_whitespace().next() == Some(name))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in /metrics"))
}

/// Each group's (group, commit_min, commit checksum) from the node's `/replication`.
pub(crate) async fn commit_points(http: std::net::SocketAddr) -> Vec<(u64, u64, String)> {
    let text = http_get(http, "/replication").await;
    let field = |row: &str, name: &str| -> String {
        let start = row.find(&format!("\"{name}\":")).unwrap() + name.len() + 3;
        row[start..]
            .split([',', '}'])
            .next()
            .unwrap()
            .trim_matches('"')
            .to_string()
    };
    text.split("{\"group\":")
        .skip(1)
        .map(|row| {
            let row = format!("{{\"group\":{row}");
            (
                field(&row, "group").parse().unwrap(),
                field(&row, "commit_min").parse().unwrap(),
                field(&row, "commit_checksum"),
            )
        })
        .collect()
}

/// A member of an in-process cluster: its node (None while stopped), its data directory
/// and its config (to start it again on the same directory and ports).
pub(crate) struct Member {
    pub(crate) node: Option<Node>,
    pub(crate) _dir: tempfile::TempDir,
    pub(crate) config: NodeConfig,
}

impl Member {
    pub(crate) fn addr(&self) -> std::net::SocketAddr {
        self.config.client_addr
    }

    /// The HTTP admin address of the running node.
    pub(crate) fn http_addr(&self) -> std::net::SocketAddr {
        self.node.as_ref().unwrap().http_addr()
    }

    pub(crate) fn stop(&mut self) {
        if let Some(node) = self.node.take() {
            node.shutdown();
        }
    }

    pub(crate) fn start(&mut self) {
        self.node = Some(Node::start(self.config.clone()).unwrap());
    }
}

/// Reserves `n` loopback addresses (bound, then released), on ports below the
/// kernel's ephemeral range: a member stopped and started again binds its port anew,
/// and a port from that range could meanwhile be the local port of any connection a
/// test running beside it opens (CI saw `AddrInUse` on a restart so).
pub(crate) fn addresses(n: usize) -> Vec<std::net::SocketAddr> {
    let ephemeral_low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32_768);
    let low = (ephemeral_low / 2).max(1_024);
    let span = u64::from(ephemeral_low.saturating_sub(low).max(1));
    let mut draw = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
        ^ u64::from(std::process::id()).rotate_left(32);
    let mut probes = Vec::with_capacity(n);
    while probes.len() < n {
        // SplitMix64 steps: any spread will do.
        draw = draw.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = draw;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        let port = low + ((z ^ (z >> 31)) % span) as u16;
        if let Ok(probe) = std::net::TcpListener::bind(("127.0.0.1", port)) {
            probes.push(probe);
        }
    }
    probes.iter().map(|p| p.local_addr().unwrap()).collect()
}

/// Starts `n` in-process members of one cluster on loopback ports, each with its own
/// directory. The ports are reserved (bound, then released) before the members bind
/// them, so a test running beside it may take one meanwhile: then every member stops
/// and the cluster starts again on new ports.
pub(crate) fn start_cluster(n: u8, fsync: FsyncSetting) -> Vec<Member> {
    start_cluster_with(n, fsync, |_| {})
}

/// As [`start_cluster`], each member's config changed by `configure` first.
pub(crate) fn start_cluster_with(
    n: u8,
    fsync: FsyncSetting,
    configure: impl Fn(&mut NodeConfig),
) -> Vec<Member> {
    for _ in 0..10 {
        if let Some(members) = try_start_cluster(n, fsync, &configure) {
            return members;
        }
    }
    panic!("no free loopback ports for a cluster of {n} in 10 tries");
}

/// One try of [`start_cluster`]: `None` if a port was taken before a member bound it.
fn try_start_cluster(
    n: u8,
    fsync: FsyncSetting,
    configure: &impl Fn(&mut NodeConfig),
) -> Option<Vec<Member>> {
    use braid_node::{ClusterSettings, MemberSettings, Secret, StartError};
    // One reservation for both, so that no port is drawn twice.
    let mut replica = addresses(2 * usize::from(n));
    let client = replica.split_off(n.into());
    let members: Vec<MemberSettings> = (0..n)
        .map(|id| MemberSettings {
            id,
            replica_addr: replica[usize::from(id)],
            client_addr: client[usize::from(id)],
        })
        .collect();
    let mut started: Vec<Member> = Vec::new();
    for id in 0..n {
        let dir = tempfile::tempdir().unwrap();
        let mut config = config(dir.path(), fsync);
        config.client_addr = client[usize::from(id)];
        config.shutdown_grace_ms = 500;
        config.cluster = Some(ClusterSettings {
            id: "test".into(),
            node_id: id,
            members: members.clone(),
            heartbeat_timeout_ms: 1_000,
            secret: Some(Secret("a secret of enough bytes".into())),
            ..ClusterSettings::default()
        });
        configure(&mut config);
        // The first start of a new cluster's member says so (--init); later starts
        // use the config kept, without it.
        let mut first = config.clone();
        if let Some(cluster) = first.cluster.as_mut() {
            cluster.init = true;
        }
        match Node::start(first) {
            Ok(node) => started.push(Member {
                node: Some(node),
                _dir: dir,
                config,
            }),
            Err(StartError::Bind { .. }) => {
                for member in &mut started {
                    member.stop();
                }
                return None;
            }
            Err(err) => panic!("member {id} did not start: {err}"),
        }
    }
    Some(started)
}

/// A client of the node at `addr` alone (no routing): what that member itself says.
pub(crate) async fn direct(
    addr: std::net::SocketAddr,
) -> Result<braid_client::Client, braid_client::ClientError> {
    let options = braid_client::ConnectOptions {
        direct: true,
        ..Default::default()
    };
    braid_client::Client::connect_with(&addr.to_string(), &options).await
}

/// Every record value of a partition, in log order, read through `client`.
pub(crate) async fn read_partition(
    client: &braid_client::Client,
    stream: &str,
    topic: &str,
    partition: u32,
) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let mut offset = 0;
    loop {
        let fetched = client
            .fetch(stream, topic, partition, offset, 1 << 20, 0)
            .await
            .unwrap();
        let mut records = std::collections::VecDeque::new();
        braid_client::decode_records(partition, offset, &fetched.batches, &mut records).unwrap();
        let Some(last) = records.back() else {
            return out;
        };
        offset = last.offset + 1;
        out.extend(records.into_iter().map(|r| r.value.unwrap_or_default()));
    }
}

/// Waits (at most 20 s) until the node has put partitions' files to sleep `count` times.
pub(crate) async fn until_files_slept(node: &TestNode, count: u32) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while metric(node.http_addr(), "braid_partition_files_slept_total").await < u64::from(count) {
        assert!(
            std::time::Instant::now() < deadline,
            "the files never slept"
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}
