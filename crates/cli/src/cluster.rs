//! `braid cluster`: what the cluster looks like from the node asked.

use anyhow::{Context, Result};
use braid_client::Client;
use braid_proto::client::{NodeStatus, GROUPS_BEHIND_LISTED_MAX};
use clap::Subcommand;
use serde_json::json;

use crate::table;

#[derive(Subcommand, Debug)]
pub(crate) enum ClusterCommand {
    /// Each member's state (caught up, groups it leads, groups in view change, commit
    /// lag), its replica-bus bundle to each peer, and the groups not caught up.
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
    /// Write member NODE_ID's replica-bus keys (one per peer, derived from a master
    /// secret) to a file of its own, mode 0600. Give each member only its file and
    /// keep the master off the members: a member then proves only its own id, where
    /// any holder of a shared cluster secret could pose as any member.
    MemberKeys {
        /// The cluster's config file (its `[cluster]` id and members).
        #[arg(long, value_name = "FILE")]
        config: std::path::PathBuf,
        /// The master secret (first line, at least 16 bytes).
        #[arg(long, value_name = "FILE")]
        master_secret_file: std::path::PathBuf,
        /// The member whose keys to write.
        #[arg(long)]
        node_id: u8,
        /// Where to write them.
        #[arg(long, value_name = "FILE")]
        out: std::path::PathBuf,
    },
}

/// Writes member `node_id`'s keys of `cluster`, derived from the master secret in
/// `master_file`, to `out` (mode 0600).
pub(crate) fn write_member_keys(
    cluster: &braid_node::ClusterSettings,
    master_file: &std::path::Path,
    node_id: u8,
    out: &std::path::Path,
) -> Result<()> {
    let master = std::fs::read_to_string(master_file)
        .with_context(|| format!("reading {}", master_file.display()))?;
    let master = master.lines().next().unwrap_or_default();
    if master.len() < braid_node::SECRET_BYTES_MIN {
        anyhow::bail!(
            "the master secret in {} is shorter than {} bytes",
            master_file.display(),
            braid_node::SECRET_BYTES_MIN
        );
    }
    if !cluster.members.iter().any(|m| m.id == node_id) {
        anyhow::bail!("member {node_id} is not among the cluster's members");
    }
    let text = cluster.member_keys_text(master.as_bytes(), node_id);
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(out)
        .with_context(|| format!("writing {}", out.display()))?;
    file.write_all(text.as_bytes())
        .and_then(|()| file.sync_all())
        .with_context(|| format!("writing {}", out.display()))
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
    let statuses = client.member_statuses().await;
    let partitions_led = |id: u8| -> usize {
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
    let status_of = |id: u8| {
        statuses
            .iter()
            .find(|s| s.id == Some(id))
            .map(|s| s.status.as_ref())
    };
    if as_json {
        let members: Vec<_> = info
            .members
            .iter()
            .map(|m| {
                let mut member = json!({
                    "id": m.id,
                    "client_addr": m.client_addr,
                    "primaries": partitions_led(m.id),
                });
                match status_of(m.id) {
                    Some(Ok(status)) => member["status"] = status_json(status),
                    Some(Err(err)) => member["error"] = json!(err.to_string()),
                    None => member["error"] = json!("not asked"),
                }
                member
            })
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
            let mut row = vec![
                m.id.to_string(),
                m.client_addr.clone(),
                partitions_led(m.id).to_string(),
            ];
            match status_of(m.id) {
                Some(Ok(s)) => row.extend([
                    if s.caught_up { "caught up" } else { "behind" }.to_owned(),
                    s.groups_led.to_string(),
                    s.groups.to_string(),
                    s.groups_in_view_change.to_string(),
                    s.commit_lag_ops.to_string(),
                    duration(s.uptime_ms),
                ]),
                Some(Err(_)) => row.push("unreachable".to_owned()),
                None => row.push("not asked".to_owned()),
            }
            row
        })
        .collect();
    table::print(
        &[
            "MEMBER",
            "CLIENT ADDRESS",
            "PARTITIONS LED",
            "STATE",
            "GROUPS LED",
            "GROUPS",
            "IN VIEW CHANGE",
            "COMMIT LAG",
            "UP",
        ],
        rows,
    );
    for s in &statuses {
        if let Err(err) = &s.status {
            let member = s.id.map_or("?".to_owned(), |id| id.to_string());
            println!("member {member} ({}): {err}", s.client_addr);
        }
    }
    let answered: Vec<&NodeStatus> = statuses
        .iter()
        .filter_map(|s| s.status.as_ref().ok())
        .collect();
    let bundles: Vec<Vec<String>> = answered
        .iter()
        .flat_map(|s| {
            s.peers.iter().map(|p| {
                vec![
                    format!("{} -> {}", s.node_id, p.peer),
                    if p.bundle_up { "up" } else { "down" }.to_owned(),
                    format!("{}/{}", p.links_up, p.links),
                    p.generation.to_string(),
                    duration(p.in_state_ms),
                    p.teardowns.to_string(),
                    p.frames_sent.to_string(),
                    p.frames_received.to_string(),
                ]
            })
        })
        .collect();
    if !bundles.is_empty() {
        println!("\nreplica bus (each member's bundle to each peer)\n");
        table::print(
            &[
                "LINK",
                "BUNDLE",
                "LINKS UP",
                "GENERATION",
                "FOR",
                "TEARDOWNS",
                "FRAMES SENT",
                "FRAMES RECEIVED",
            ],
            bundles,
        );
    }
    let behind: Vec<Vec<String>> = answered
        .iter()
        .flat_map(|s| {
            s.behind.iter().map(|g| {
                vec![
                    s.node_id.to_string(),
                    g.name.clone(),
                    g.status.name().to_owned(),
                    g.view.to_string(),
                    g.primary.map_or("-".to_owned(), |p| p.to_string()),
                    g.op.to_string(),
                    g.commit_min.to_string(),
                    g.commit_max.to_string(),
                ]
            })
        })
        .collect();
    if !behind.is_empty() {
        println!("\ngroups not caught up (first {GROUPS_BEHIND_LISTED_MAX} per member)\n");
        table::print(
            &[
                "MEMBER",
                "GROUP",
                "STATUS",
                "VIEW",
                "PRIMARY",
                "OP",
                "APPLIED",
                "COMMITTED",
            ],
            behind,
        );
    }
    Ok(())
}

/// A member's answer as JSON.
fn status_json(s: &NodeStatus) -> serde_json::Value {
    let peers: Vec<_> = s
        .peers
        .iter()
        .map(|p| {
            json!({
                "peer": p.peer,
                "bundle_up": p.bundle_up,
                "links_up": p.links_up,
                "links": p.links,
                "generation": p.generation,
                "in_state_ms": p.in_state_ms,
                "teardowns": p.teardowns,
                "frames_sent": p.frames_sent,
                "frames_received": p.frames_received,
            })
        })
        .collect();
    let behind: Vec<_> = s
        .behind
        .iter()
        .map(|g| {
            json!({
                "group": g.group,
                "name": g.name,
                "status": g.status.name(),
                "view": g.view,
                "primary": g.primary,
                "op": g.op,
                "commit_min": g.commit_min,
                "commit_max": g.commit_max,
            })
        })
        .collect();
    json!({
        "caught_up": s.caught_up,
        "uptime_ms": s.uptime_ms,
        "groups": s.groups,
        "groups_led": s.groups_led,
        "groups_in_view_change": s.groups_in_view_change,
        "groups_behind": s.groups_behind,
        "commit_lag_ops": s.commit_lag_ops,
        "views_passed": s.views_passed,
        "step_downs": s.step_downs,
        "peers": peers,
        "behind": behind,
    })
}

/// Milliseconds as people read them: `850ms`, `12.3s`, `4m05s`, `3h12m`.
fn duration(ms: u64) -> String {
    match ms {
        0..=999 => format!("{ms}ms"),
        1_000..=59_999 => format!("{:.1}s", ms as f64 / 1000.0),
        60_000..=3_599_999 => format!("{}m{:02}s", ms / 60_000, ms / 1000 % 60),
        _ => format!("{}h{:02}m", ms / 3_600_000, ms / 60_000 % 60),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn durations_read_at_a_glance() {
        assert_eq!(super::duration(850), "850ms");
        assert_eq!(super::duration(12_340), "12.3s");
        assert_eq!(super::duration(245_000), "4m05s");
        assert_eq!(super::duration(11_520_000), "3h12m");
    }
}
