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
}

pub(crate) async fn cluster_command(
    client: &Client,
    as_json: bool,
    command: ClusterCommand,
) -> Result<()> {
    let ClusterCommand::Status = command;
    let info = client.cluster_info().await?;
    let led = |id: u8| -> usize {
        info.topics
            .iter()
            .map(|t| t.partitions.iter().filter(|(_, p)| *p == id).count())
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
            json!({"cluster": info.cluster_id, "answered_by": info.node_id, "members": members})
        );
        return Ok(());
    }
    println!(
        "cluster {} ({} members), answered by member {}\n",
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
