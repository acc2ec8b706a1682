//! `braid cluster`: what the cluster looks like from the node asked.

use anyhow::Result;
use braid_client::Client;
use clap::Subcommand;
use serde_json::json;

use crate::table;

#[derive(Subcommand, Debug)]
pub(crate) enum ClusterCommand {
    /// The members, their client addresses, and how many partitions each leads.
    Status,
    /// Start a cluster of MEMBERS nodes on this machine (child processes; node i on
    /// client port 7070+i, HTTP 7080+i, replica bus 7090+i); Ctrl-C stops them.
    Local {
        /// How many nodes.
        #[arg(default_value_t = 3)]
        members: u8,
        /// The first client port; HTTP ports start 10 above it, replica ports 20 above.
        #[arg(long, default_value_t = 7070)]
        base_port: u16,
        /// Where their data directories, logs and the cluster secret go.
        #[arg(long, default_value = "./braid-cluster")]
        data_dir: std::path::PathBuf,
        /// Default fsync policy of new topics (always, interval, never).
        #[arg(long)]
        fsync: Option<String>,
    },
}

pub(crate) async fn cluster_command(
    client: &Client,
    as_json: bool,
    command: ClusterCommand,
) -> Result<()> {
    if !matches!(command, ClusterCommand::Status) {
        anyhow::bail!("`cluster local` runs nodes, not a client command");
    }
    let info = client.cluster_info().await?;
    let led = |id: u8| -> usize {
        info.topics
            .iter()
            .map(|t| {
                t.partitions
                    .iter()
                    .filter(|p| p.primary == Some(id))
                    .count()
            })
            .sum()
    };
    if as_json {
        let members: Vec<_> = info
            .members
            .iter()
            .map(|m| json!({"id": m.id, "client_addr": m.client_addr, "primaries": led(m.id)}))
            .collect();
        println!(
            "{}",
            json!({"cluster": info.cluster_id, "answered_by": info.node_id, "coordinator": info.coordinator, "members": members})
        );
        return Ok(());
    }
    let coordinator = info
        .coordinator
        .map_or("none yet (a view change runs)".to_owned(), |m| {
            format!("member {m}")
        });
    println!(
        "cluster {} ({} members), answered by member {}; consumer groups coordinated by {coordinator}\n",
        info.cluster_id,
        info.members.len(),
        info.node_id
    );
    let rows = info
        .members
        .iter()
        .map(|m| {
            vec![
                m.id.to_string(),
                m.client_addr.clone(),
                led(m.id).to_string(),
            ]
        })
        .collect();
    table::print(&["MEMBER", "CLIENT ADDRESS", "PRIMARIES"], rows);
    Ok(())
}
