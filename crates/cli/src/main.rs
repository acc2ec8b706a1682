//! `braid`: run a node, manage streams, topics and groups, produce and consume.

use std::io::{BufRead, Write};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use braid_client::{Client, Consumer, ConsumerConfig, Producer, ProducerConfig, StartFrom};
use braid_node::{FsyncSetting, Node, NodeConfig};
use braid_proto::client::{
    ErrorCode, TopicSettings, FSYNC_ALWAYS, FSYNC_DEFAULT, FSYNC_INTERVAL, FSYNC_INTERVAL_MS_MAX,
    FSYNC_NEVER, RETENTION_BYTES_MAX, RETENTION_FOREVER, RETENTION_MS_MAX,
};
use clap::{Parser, Subcommand, ValueEnum};
use serde_json::json;

mod access;
mod bench;
mod cluster;
mod cluster_local;
mod table;

#[derive(Parser, Debug)]
#[command(
    name = "braid",
    version,
    about = "Braid: a persistent, replicated message-streaming platform"
)]
struct Cli {
    /// The node to talk to, or several members of a cluster (repeat the flag or
    /// separate with commas): the first that answers tells the client the rest.
    #[arg(
        long,
        global = true,
        env = "BRAID_ADDR",
        value_delimiter = ',',
        default_value = "127.0.0.1:7070"
    )]
    addr: Vec<String>,
    /// Print JSON instead of tables. `braid bench --json FILE` writes its report to FILE
    /// (the other commands take no file: put `--json` after their arguments).
    #[arg(long, global = true, num_args = 0..=1, value_name = "FILE")]
    json: Option<Option<PathBuf>>,
    #[command(flatten)]
    connect: access::ConnectArgs,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run a node.
    Server(ServerArgs),
    /// Manage streams (namespaces of topics).
    #[command(subcommand)]
    Stream(StreamCommand),
    /// Manage topics.
    #[command(subcommand)]
    Topic(TopicCommand),
    /// Inspect consumer groups.
    #[command(subcommand)]
    Group(GroupCommand),
    /// The cluster's members and who leads what.
    #[command(subcommand)]
    Cluster(cluster::ClusterCommand),
    /// Manage users (needs the node permission `users`).
    #[command(subcommand)]
    User(access::UserCommand),
    /// Grant, revoke and list permissions (needs the node permission `users`).
    #[command(subcommand)]
    Acl(access::AclCommand),
    /// Produce lines from standard input (or a file) as records.
    Produce(ProduceArgs),
    /// Print records.
    Consume(ConsumeArgs),
    /// Benchmark a node (or an embedded one): presets, live progress, latency
    /// percentiles, JSON reports and charts.
    Bench(bench::BenchArgs),
}

#[derive(clap::Args, Debug)]
struct ServerArgs {
    /// A TOML config file (also BRAID_CONFIG).
    #[arg(long, env = "BRAID_CONFIG")]
    config: Option<PathBuf>,
    /// Where data lives [default: ./braid-data].
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Client protocol address [default: 127.0.0.1:7070].
    #[arg(long)]
    client_addr: Option<SocketAddr>,
    /// HTTP admin address [default: 127.0.0.1:7080].
    #[arg(long)]
    http_addr: Option<SocketAddr>,
    /// Shard threads [default: one per core].
    #[arg(long)]
    shards: Option<usize>,
    /// Default fsync policy of new topics [default: always].
    #[arg(long)]
    fsync: Option<Fsync>,
    /// The cluster's name (the `[cluster]` table's `id`).
    #[arg(long)]
    cluster_id: Option<String>,
    /// This node's member id.
    #[arg(long)]
    node_id: Option<u8>,
    /// A member, `ID=REPLICA_ADDR/CLIENT_ADDR`; repeat for each (replaces the table's).
    #[arg(long = "member", value_name = "ID=REPLICA/CLIENT")]
    members: Vec<String>,
    /// A file holding the cluster secret (or BRAID_CLUSTER_SECRET; no flag takes the
    /// secret itself).
    #[arg(long, value_name = "FILE")]
    cluster_secret_file: Option<PathBuf>,
    /// A file of this member's replica-bus keys, one per peer (`braid cluster
    /// member-keys` writes it): it then proves only its own id to its peers.
    #[arg(long, value_name = "FILE")]
    cluster_member_keys_file: Option<PathBuf>,
    /// This member lost its data (its data directory was deleted or replaced) and
    /// rejoins the cluster: its groups start untrusted until they are caught up, so
    /// they never help lose a record it acknowledged before. Recorded in the data
    /// directory.
    #[arg(long)]
    rejoin: bool,
    /// This member starts for the first time, in a new cluster: its empty data
    /// directory is new, not lost. A member of a cluster of several refuses an empty
    /// directory without this or --rejoin. Give it on the first start only.
    #[arg(long, conflicts_with = "rejoin")]
    init: bool,
}

#[derive(Copy, Clone, Debug, ValueEnum)]
enum Fsync {
    Always,
    Interval,
    Never,
}

#[derive(Subcommand, Debug)]
enum StreamCommand {
    /// Create a stream.
    Create { name: String },
    /// List streams.
    List,
    /// Show a stream's topics and consumer groups.
    Describe { name: String },
    /// Delete a stream and everything in it.
    Delete { name: String },
}

#[derive(Subcommand, Debug)]
enum TopicCommand {
    /// Create a topic.
    Create {
        stream: String,
        topic: String,
        /// Partitions, each an equal part of the key-hash ring.
        #[arg(long, default_value_t = 1)]
        partitions: u32,
        /// fsync policy [default: the node's].
        #[arg(long)]
        fsync: Option<Fsync>,
        /// For --fsync interval (ms, at most 3600000 = 1 hour; 0: the node's default).
        #[arg(long, default_value_t = 0,
              value_parser = clap::value_parser!(u64).range(0..=FSYNC_INTERVAL_MS_MAX))]
        fsync_interval_ms: u64,
        /// Retention by size per partition (bytes, at most 2^60; `forever`: no size
        /// limit; 0: the node's default).
        #[arg(long, default_value = "0", value_parser = parse_retention_bytes)]
        retention_bytes: u64,
        /// Retention by age (ms, at most 3155760000000 = 100 years; `forever`: keep
        /// forever; 0: the node's default).
        #[arg(long, default_value = "0", value_parser = parse_retention_ms)]
        retention_ms: u64,
        /// Largest batch (bytes, 1024 to the segment size; 0: the node's default).
        #[arg(long, default_value_t = 0)]
        max_batch_bytes: u32,
        /// Log segment size (bytes, 1024 to 2147483647; 0: the node's default).
        #[arg(long, default_value_t = 0)]
        segment_bytes: u32,
    },
    /// List the topics of a stream.
    List { stream: String },
    /// Show a topic's settings and partitions.
    Describe { stream: String, topic: String },
    /// Delete a topic and its data.
    Delete { stream: String, topic: String },
}

#[derive(Subcommand, Debug)]
enum GroupCommand {
    /// List the consumer groups of a stream.
    List { stream: String },
    /// Show a group's members, assignment, offsets and lag.
    Describe { stream: String, group: String },
}

#[derive(clap::Args, Debug)]
struct ProduceArgs {
    stream: String,
    topic: String,
    /// Split each line at the first occurrence into key and value.
    #[arg(long)]
    key_separator: Option<String>,
    /// Read lines from this file instead of standard input.
    #[arg(long)]
    file: Option<PathBuf>,
}

#[derive(clap::Args, Debug)]
struct ConsumeArgs {
    stream: String,
    topic: String,
    /// Consume as a member of this group (committing its progress).
    #[arg(long)]
    group: Option<String>,
    /// Where to start without a committed offset: earliest, latest, offset:N or
    /// timestamp:MS.
    #[arg(long, default_value = "earliest")]
    from: String,
    /// Only these partitions (without --group); all by default.
    #[arg(long, value_delimiter = ',')]
    partitions: Vec<u32>,
    /// Stop after this many records.
    #[arg(long)]
    count: Option<u64>,
    /// Keep waiting for new records instead of stopping at the end.
    #[arg(long)]
    follow: bool,
    /// Print partition, offset and key before each value.
    #[arg(long)]
    verbose: bool,
}

fn main() -> std::process::ExitCode {
    match run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(err) => {
            // The error and its causes on one line: never a stack trace, which `main`
            // returning the error prints whenever RUST_BACKTRACE is set (many shells
            // set it for development).
            eprintln!("Error: {err:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run() -> Result<()> {
    let cli = Cli::parse();
    if !matches!(
        cli.command,
        Command::Server(_)
            | Command::Bench(_)
            | Command::Cluster(cluster::ClusterCommand::Local { .. })
    ) {
        stop_quietly_on_a_closed_pipe();
    }
    // A benchmark's own output is the point; an embedded node only speaks up on trouble.
    // So is a client command's: the SDK's notes on retries (a failover) go to BRAID_LOG.
    let default_filter = if !matches!(
        cli.command,
        Command::Server(_) | Command::Cluster(cluster::ClusterCommand::Local { .. })
    ) {
        "warn"
    } else {
        "info"
    };
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("BRAID_LOG")
                .unwrap_or_else(|_| default_filter.into()),
        )
        .with_writer(std::io::stderr)
        // Colour only for a terminal: a log file or journald gets plain text.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    match cli.command {
        Command::Server(args) => server(args),
        Command::Bench(args) => bench::bench(&cli.addr, cli.connect.options()?, cli.json, args),
        Command::Cluster(cluster::ClusterCommand::Local {
            members,
            base_port,
            data_dir,
            fsync,
        }) => cluster_local::run(members, &data_dir, base_port, fsync.as_deref()),
        Command::Cluster(cluster::ClusterCommand::MemberKeys {
            config,
            master_secret_file,
            node_id,
            out,
        }) => {
            let config = NodeConfig::from_file(&config)?;
            let Some(cluster_settings) = config.cluster.as_ref() else {
                bail!("the config has no [cluster] table");
            };
            cluster::write_member_keys(cluster_settings, &master_secret_file, node_id, &out)?;
            eprintln!("wrote the keys of member {node_id} to {}", out.display());
            Ok(())
        }
        command => {
            if let Some(Some(file)) = &cli.json {
                bail!(
                    "--json takes a file only for `braid bench` (got {}); put --json after the command's arguments",
                    file.display()
                );
            }
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()?;
            let options = cli.connect.options()?;
            runtime.block_on(client_command(
                &cli.addr,
                &options,
                cli.json.is_some(),
                command,
            ))
        }
    }
}

fn server(args: ServerArgs) -> Result<()> {
    let mut config = match &args.config {
        Some(path) => NodeConfig::from_file(path)?,
        None => NodeConfig::default(),
    };
    config.apply_env(std::env::vars())?;
    if let Some(dir) = args.data_dir {
        config.data_dir = dir;
    }
    if let Some(addr) = args.client_addr {
        config.client_addr = addr;
    }
    if let Some(addr) = args.http_addr {
        config.http_addr = addr;
    }
    if let Some(shards) = args.shards {
        config.shards = shards;
    }
    if let Some(fsync) = args.fsync {
        config.topic_defaults.fsync = match fsync {
            Fsync::Always => FsyncSetting::Always,
            Fsync::Interval => FsyncSetting::Interval,
            Fsync::Never => FsyncSetting::Never,
        };
    }
    if let Some(id) = args.cluster_id {
        config.cluster_mut().id = id;
    }
    if let Some(node_id) = args.node_id {
        config.cluster_mut().node_id = node_id;
    }
    if !args.members.is_empty() {
        let members = braid_node::config::cluster::parse_members(&args.members.join(","))
            .map_err(|e| anyhow::anyhow!("--member: {e}"))?;
        config.cluster_mut().members = members;
    }
    if let Some(file) = args.cluster_secret_file {
        config.cluster_mut().secret_file = Some(file);
    }
    if let Some(file) = args.cluster_member_keys_file {
        config.cluster_mut().member_keys_file = Some(file);
    }
    if args.rejoin {
        config.cluster_mut().rejoin = true;
    }
    if args.init {
        config.cluster_mut().init = true;
    }
    let node = Node::start(config).context("starting the node")?;
    // The handlers go in before the listening line: a supervisor (or a test) that
    // sends SIGTERM as soon as it reads the line must get a graceful stop, not the
    // default action's kill.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let (mut term, mut interrupt) = runtime.block_on(async {
        use tokio::signal::unix::{signal, SignalKind};
        Ok::<_, std::io::Error>((
            signal(SignalKind::terminate())?,
            signal(SignalKind::interrupt())?,
        ))
    })?;
    // Scripts and tests read this line to learn the bound ports.
    println!(
        "braid listening: client {} http {}",
        node.client_addr(),
        node.http_addr()
    );
    std::io::stdout().flush()?;
    runtime.block_on(async {
        tokio::select! {
            _ = interrupt.recv() => {}
            _ = term.recv() => {}
        }
    });
    tracing::info!("shutting down");
    node.shutdown();
    Ok(())
}

/// A retention flag: `forever` ([`RETENTION_FOREVER`], as the protocol writes it), or
/// a whole number from 0 (the node's default) to `max`.
fn parse_retention(value: &str, max: u64, unit: &str) -> Result<u64, String> {
    if value == "forever" {
        return Ok(RETENTION_FOREVER);
    }
    match value.parse::<u64>() {
        Ok(n) if n <= max || n == RETENTION_FOREVER => Ok(n),
        Ok(n) => Err(format!(
            "{n} is out of range: 0 (the node's default), 1 to {max} {unit}, or `forever`"
        )),
        Err(e) => Err(format!("{e}: expected a whole number or `forever`")),
    }
}

fn parse_retention_ms(value: &str) -> Result<u64, String> {
    parse_retention(value, RETENTION_MS_MAX, "ms (100 years)")
}

fn parse_retention_bytes(value: &str) -> Result<u64, String> {
    parse_retention(value, RETENTION_BYTES_MAX, "bytes (1 EiB)")
}

/// A retention setting as `topic describe` prints it (a node reports no limit as
/// [`RETENTION_FOREVER`]; an older one as 0).
fn retention_text(value: u64, unit: &str, unlimited: &str) -> String {
    if value == RETENTION_FOREVER || value == 0 {
        unlimited.to_owned()
    } else {
        format!("{value} {unit}")
    }
}

fn fsync_code(fsync: Option<Fsync>) -> u8 {
    match fsync {
        None => FSYNC_DEFAULT,
        Some(Fsync::Always) => FSYNC_ALWAYS,
        Some(Fsync::Interval) => FSYNC_INTERVAL,
        Some(Fsync::Never) => FSYNC_NEVER,
    }
}

fn fsync_name(code: u8) -> &'static str {
    match code {
        FSYNC_ALWAYS => "always",
        FSYNC_INTERVAL => "interval",
        FSYNC_NEVER => "never",
        _ => "default",
    }
}

async fn client_command(
    addr: &[String],
    options: &braid_client::ConnectOptions,
    as_json: bool,
    command: Command,
) -> Result<()> {
    let client = access::connect(addr, options).await?;
    match command {
        Command::User(command) => access::user_command(&client, as_json, command).await?,
        Command::Acl(command) => access::acl_command(&client, as_json, command).await?,
        Command::Server(_) | Command::Bench(_) => {
            bail!("`server` and `bench` are not client commands")
        }
        Command::Stream(StreamCommand::Create { name }) => {
            client.create_stream(&name).await?;
            eprintln!("created stream {name}");
        }
        Command::Stream(StreamCommand::Delete { name }) => {
            client.delete_stream(&name).await?;
            eprintln!("deleted stream {name}");
        }
        Command::Stream(StreamCommand::Describe { name }) => {
            let topics = client.list_topics(&name).await?;
            let groups = client.list_groups(&name).await?;
            if as_json {
                let topics: Vec<_> = topics
                    .iter()
                    .map(|t| json!({"name": t.name, "partitions": t.partitions}))
                    .collect();
                let groups: Vec<_> = groups
                    .iter()
                    .map(|g| json!({"name": g.name, "topic": g.topic, "members": g.members}))
                    .collect();
                println!(
                    "{}",
                    json!({"stream": name, "topics": topics, "groups": groups})
                );
            } else {
                println!("stream {name}\n");
                let rows = topics
                    .iter()
                    .map(|t| vec![t.name.clone(), t.partitions.to_string()])
                    .collect();
                table::print(&["TOPIC", "PARTITIONS"], rows);
                println!();
                let rows = groups
                    .iter()
                    .map(|g| vec![g.name.clone(), g.topic.clone(), g.members.to_string()])
                    .collect();
                table::print(&["GROUP", "TOPIC", "MEMBERS"], rows);
            }
        }
        Command::Stream(StreamCommand::List) => {
            let streams = client.list_streams().await?;
            if as_json {
                let list: Vec<_> = streams
                    .iter()
                    .map(|s| json!({"name": s.name, "topics": s.topics}))
                    .collect();
                println!("{}", serde_json::Value::from(list));
            } else {
                let rows = streams
                    .iter()
                    .map(|s| vec![s.name.clone(), s.topics.to_string()])
                    .collect();
                table::print(&["STREAM", "TOPICS"], rows);
            }
        }
        Command::Topic(command) => topic_command(&client, as_json, command).await?,
        Command::Group(command) => group_command(&client, as_json, command).await?,
        Command::Cluster(command) => cluster::cluster_command(&client, as_json, command).await?,
        Command::Produce(args) => produce(&client, args).await?,
        Command::Consume(args) => consume(&client, as_json, args).await?,
    }
    Ok(())
}

async fn topic_command(client: &Client, as_json: bool, command: TopicCommand) -> Result<()> {
    match command {
        TopicCommand::Create {
            stream,
            topic,
            partitions,
            fsync,
            fsync_interval_ms,
            retention_bytes,
            retention_ms,
            max_batch_bytes,
            segment_bytes,
        } => {
            let settings = TopicSettings {
                partitions,
                fsync: fsync_code(fsync),
                fsync_interval_ms,
                retention_bytes,
                retention_ms,
                max_batch_bytes,
                segment_bytes,
            };
            client.create_topic(&stream, &topic, settings).await?;
            eprintln!("created topic {stream}/{topic} with {partitions} partitions");
        }
        TopicCommand::Delete { stream, topic } => {
            client.delete_topic(&stream, &topic).await?;
            eprintln!("deleted topic {stream}/{topic}");
        }
        TopicCommand::List { stream } => {
            let topics = client.list_topics(&stream).await?;
            if as_json {
                let list: Vec<_> = topics
                    .iter()
                    .map(|t| json!({"name": t.name, "partitions": t.partitions}))
                    .collect();
                println!("{}", serde_json::Value::from(list));
            } else {
                let rows = topics
                    .iter()
                    .map(|t| vec![t.name.clone(), t.partitions.to_string()])
                    .collect();
                table::print(&["TOPIC", "PARTITIONS"], rows);
            }
        }
        TopicCommand::Describe { stream, topic } => {
            let info = client.describe_topic(&stream, &topic).await?;
            let s = info.settings;
            if as_json {
                let partitions: Vec<_> = info
                    .partitions
                    .iter()
                    .map(|p| {
                        json!({"id": p.id, "hash_start": p.hash_start, "hash_end": p.hash_end, "parents": p.parents,
                               "sealed": p.sealed, "start_offset": p.start_offset, "high_watermark": p.high_watermark})
                    })
                    .collect();
                let value = json!({
                    "stream": info.stream, "topic": info.name, "id": info.id, "epoch": info.epoch,
                    "settings": {"partitions": s.partitions, "fsync": fsync_name(s.fsync), "fsync_interval_ms": s.fsync_interval_ms,
                                 "retention_bytes": s.retention_bytes, "retention_ms": s.retention_ms,
                                 "max_batch_bytes": s.max_batch_bytes, "segment_bytes": s.segment_bytes},
                    "partitions": partitions,
                });
                println!("{value}");
            } else {
                println!(
                    "topic {}/{} (id {}, layout epoch {})\nfsync {} | retention {}, {} | max batch {} bytes | segment {} bytes\n",
                    info.stream,
                    info.name,
                    info.id,
                    info.epoch,
                    fsync_name(s.fsync),
                    retention_text(s.retention_bytes, "bytes", "no size limit"),
                    retention_text(s.retention_ms, "ms", "kept forever"),
                    s.max_batch_bytes,
                    s.segment_bytes
                );
                let rows = info
                    .partitions
                    .iter()
                    .map(|p| {
                        vec![
                            p.id.to_string(),
                            format!("{:04x}-{:04x}", p.hash_start, p.hash_end),
                            if p.sealed { "sealed" } else { "active" }.to_owned(),
                            p.start_offset.to_string(),
                            p.high_watermark.to_string(),
                        ]
                    })
                    .collect();
                table::print(
                    &[
                        "PARTITION",
                        "HASH RANGE",
                        "STATE",
                        "START",
                        "HIGH WATERMARK",
                    ],
                    rows,
                );
            }
        }
    }
    Ok(())
}

async fn group_command(client: &Client, as_json: bool, command: GroupCommand) -> Result<()> {
    match command {
        GroupCommand::List { stream } => {
            let groups = client.list_groups(&stream).await?;
            if as_json {
                let list: Vec<_> = groups
                    .iter()
                    .map(|g| json!({"name": g.name, "topic": g.topic, "members": g.members, "generation": g.generation}))
                    .collect();
                println!("{}", serde_json::Value::from(list));
            } else {
                let rows = groups
                    .iter()
                    .map(|g| {
                        vec![
                            g.name.clone(),
                            g.topic.clone(),
                            g.members.to_string(),
                            g.generation.to_string(),
                        ]
                    })
                    .collect();
                table::print(&["GROUP", "TOPIC", "MEMBERS", "GENERATION"], rows);
            }
        }
        GroupCommand::Describe { stream, group } => {
            let g = client.describe_group(&stream, &group).await?;
            let lag = |o: &braid_proto::client::PartitionOffsets| {
                o.high_watermark.saturating_sub(o.committed.unwrap_or(0))
            };
            if as_json {
                let members: Vec<_> = g
                    .members
                    .iter()
                    .map(|m| json!({"id": m.id, "name": m.name, "assignment": m.assignment}))
                    .collect();
                let offsets: Vec<_> = g
                    .offsets
                    .iter()
                    .map(|o| json!({"partition": o.partition, "committed": o.committed, "high_watermark": o.high_watermark, "lag": lag(o)}))
                    .collect();
                println!(
                    "{}",
                    json!({"group": g.name, "topic": g.topic, "generation": g.generation, "members": members, "offsets": offsets})
                );
            } else {
                println!(
                    "group {} on topic {} (generation {})\n",
                    g.name, g.topic, g.generation
                );
                let rows = g
                    .members
                    .iter()
                    .map(|m| {
                        let parts: Vec<String> = m.assignment.iter().map(u32::to_string).collect();
                        vec![m.id.to_string(), m.name.clone(), parts.join(",")]
                    })
                    .collect();
                table::print(&["MEMBER", "NAME", "PARTITIONS"], rows);
                println!();
                let owner = |p: u32| {
                    g.members
                        .iter()
                        .find(|m| m.assignment.contains(&p))
                        .map_or("-".to_owned(), |m| m.name.clone())
                };
                let rows = g
                    .offsets
                    .iter()
                    .map(|o| {
                        vec![
                            o.partition.to_string(),
                            o.committed.map_or("-".to_owned(), |c| c.to_string()),
                            o.high_watermark.to_string(),
                            lag(o).to_string(),
                            owner(o.partition),
                        ]
                    })
                    .collect();
                table::print(
                    &["PARTITION", "COMMITTED", "HIGH WATERMARK", "LAG", "MEMBER"],
                    rows,
                );
            }
        }
    }
    Ok(())
}

async fn produce(client: &Client, args: ProduceArgs) -> Result<()> {
    let producer =
        Producer::new(client, &args.stream, &args.topic, ProducerConfig::default()).await?;
    let input: Box<dyn BufRead> = match &args.file {
        Some(path) => Box::new(std::io::BufReader::new(
            std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?,
        )),
        None => Box::new(std::io::stdin().lock()),
    };
    let mut pending = Vec::new();
    let mut sent = 0u64;
    for line in input.lines() {
        let line = line?;
        let (key, value) = match &args.key_separator {
            Some(sep) => match line.split_once(sep.as_str()) {
                Some((k, v)) => (Some(k.as_bytes().to_vec()), v.as_bytes().to_vec()),
                None => (None, line.into_bytes()),
            },
            None => (None, line.into_bytes()),
        };
        pending.push(producer.send(key.as_deref(), &value));
        // Bound what waits in memory.
        if pending.len() >= 10_000 {
            for send in pending.drain(..) {
                send.await?;
                sent += 1;
            }
        }
    }
    producer.flush();
    for send in pending {
        send.await?;
        sent += 1;
    }
    eprintln!("produced {sent} records to {}/{}", args.stream, args.topic);
    Ok(())
}

fn parse_from(from: &str) -> Result<StartFrom> {
    Ok(match from {
        "earliest" => StartFrom::Earliest,
        "latest" => StartFrom::Latest,
        other => match other.split_once(':') {
            Some(("offset", n)) => StartFrom::Offset(n.parse().context("offset:N needs a number")?),
            Some(("timestamp", ms)) => {
                StartFrom::Timestamp(ms.parse().context("timestamp:MS needs a number")?)
            }
            _ => bail!("--from must be earliest, latest, offset:N or timestamp:MS"),
        },
    })
}

async fn consume(client: &Client, as_json: bool, args: ConsumeArgs) -> Result<()> {
    let config = ConsumerConfig {
        start_from: parse_from(&args.from)?,
        ..ConsumerConfig::default()
    };
    let info = client.describe_topic(&args.stream, &args.topic).await?;
    let mut consumer = match &args.group {
        Some(group) => {
            Consumer::join_group(
                client,
                &args.stream,
                &args.topic,
                group,
                "braid-cli",
                config,
            )
            .await?
        }
        None if args.partitions.is_empty() => {
            Consumer::all_partitions(client, &args.stream, &args.topic, config).await?
        }
        None => {
            Consumer::assigned(client, &args.stream, &args.topic, &args.partitions, config).await?
        }
    };
    // Without --follow, stop once every partition is read to where it ended at start.
    let ends: std::collections::BTreeMap<u32, u64> = info
        .partitions
        .iter()
        .map(|p| (p.id, p.high_watermark))
        .collect();
    let mut printed = 0u64;
    let stdout = std::io::stdout();
    let mut idle_polls = 0;
    'outer: loop {
        let records = consumer.poll(Duration::from_millis(500)).await?;
        idle_polls = if records.is_empty() {
            idle_polls + 1
        } else {
            0
        };
        let mut out = stdout.lock();
        for record in records {
            let value =
                String::from_utf8_lossy(record.value.as_deref().unwrap_or_default()).into_owned();
            let key = record
                .key
                .as_deref()
                .map(|k| String::from_utf8_lossy(k).into_owned());
            if as_json {
                let line = json!({"partition": record.partition, "offset": record.offset, "timestamp_ms": record.timestamp_ms, "key": key, "value": value});
                writeln!(out, "{line}")?;
            } else if args.verbose {
                writeln!(
                    out,
                    "{}\t{}\t{}\t{}",
                    record.partition,
                    record.offset,
                    key.unwrap_or_default(),
                    value
                )?;
            } else {
                writeln!(out, "{value}")?;
            }
            printed += 1;
            if args.count.is_some_and(|c| printed >= c) {
                break 'outer;
            }
        }
        out.flush()?;
        if !args.follow {
            let caught_up = !consumer.positions().is_empty()
                && consumer
                    .positions()
                    .iter()
                    .all(|(p, o)| *o >= ends.get(p).copied().unwrap_or(0));
            // A group member may own nothing yet; give up after a few idle polls.
            if caught_up || (idle_polls >= 4 && consumer.positions().is_empty()) {
                break;
            }
        }
    }
    stdout.lock().flush()?;
    if !args.follow {
        // Read to where each partition ended at start; a partition refused for damage
        // (a single node) ends where its log does, which may be short of what it
        // acknowledged: a read there says so, and so must this command.
        let at_end: Vec<(u32, u64)> = consumer
            .positions()
            .iter()
            .filter(|(p, o)| **o >= ends.get(p).copied().unwrap_or(0))
            .map(|(p, o)| (*p, *o))
            .collect();
        for (partition, offset) in at_end {
            if let Err(err) = client
                .fetch(&args.stream, &args.topic, partition, offset, 1, 0)
                .await
            {
                if err.code() == Some(ErrorCode::StorageError) {
                    consumer.close().await?;
                    bail!("partition {partition} at offset {offset}: {err}");
                }
            }
        }
    }
    consumer.close().await?;
    Ok(())
}

/// A client command piped into `head` ends when the pipe closes, as other command-line
/// tools do, instead of panicking at the next `println!`: the default action of
/// SIGPIPE is restored (Rust starts with it ignored). Its sockets are unaffected: the
/// standard library sends on them with `MSG_NOSIGNAL`. Nodes (and `braid bench`, which
/// may embed them) keep SIGPIPE ignored.
#[allow(unsafe_code)]
fn stop_quietly_on_a_closed_pipe() {
    // SAFETY: called first thing in `main`, before any other thread exists; setting a
    // signal's disposition to its default has no other precondition.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}
