//! `braid cluster local N`: a cluster of N nodes on this machine for trying Braid,
//! each a child process of this binary with its own data directory under one root.
//! Node i listens for clients on BASE + i, for HTTP on BASE + 10 + i and for its peers
//! on BASE + 20 + i (127.0.0.1 only; BASE is 7070 unless `--base-port` says otherwise);
//! a master secret is drawn once into the root, and each member's bus keys derived from
//! it into `node-ID.keys`. Ctrl-C stops them all (SIGTERM, then
//! SIGKILL after the grace period).

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::table;

/// How long the nodes get to stop after SIGTERM before they are killed.
const STOP_GRACE: Duration = Duration::from_secs(10);

/// The client, HTTP and replica ports of member `id`.
fn ports(base: u16, id: u8) -> (u16, u16, u16) {
    let id = u16::from(id);
    (base + id, base + 10 + id, base + 20 + id)
}

/// The cluster secret in `root`, drawn from the OS on the first start.
fn secret_file(root: &Path) -> Result<PathBuf> {
    let path = root.join("cluster-secret");
    if !path.exists() {
        let mut bytes = [0u8; 24];
        std::fs::File::open("/dev/urandom")
            .and_then(|mut f| f.read_exact(&mut bytes))
            .context("drawing a cluster secret")?;
        let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        std::fs::write(&path, format!("{hex}\n"))
            .with_context(|| format!("writing {}", path.display()))?;
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?;
    }
    Ok(path)
}

/// Starts `members` nodes under `root` and waits for Ctrl-C (or a node's exit).
pub(crate) fn run(members: u8, root: &Path, base: u16, fsync: Option<&str>) -> Result<()> {
    if !(1..=9).contains(&members) {
        bail!("a local cluster has 1 to 9 members, not {members}");
    }
    if base.checked_add(29).is_none() || base == 0 {
        bail!("--base-port {base} leaves no room for the 30 ports after it");
    }
    std::fs::create_dir_all(root).with_context(|| format!("creating {}", root.display()))?;
    let secret = secret_file(root)?;
    let exe = std::env::current_exe().context("finding this program")?;
    let member_flags: Vec<String> = (0..members)
        .map(|id| {
            let (client, _, replica) = ports(base, id);
            format!("{id}=127.0.0.1:{replica}/127.0.0.1:{client}")
        })
        .collect();
    // A new root starts a new cluster (every member --init); a member whose directory
    // is gone from a root whose others have theirs lost its data (--rejoin).
    // Each member gets only its own pairs' keys, derived from the drawn secret: none
    // can pose as another on the replica bus.
    let settings = braid_node::ClusterSettings {
        id: "local".into(),
        members: (0..members)
            .map(|id| {
                let (client, _, replica) = ports(base, id);
                braid_node::MemberSettings {
                    id,
                    replica_addr: ([127, 0, 0, 1], replica).into(),
                    client_addr: ([127, 0, 0, 1], client).into(),
                }
            })
            .collect(),
        ..braid_node::ClusterSettings::default()
    };
    let keys: Vec<PathBuf> = (0..members)
        .map(|id| {
            let path = root.join(format!("node-{id}.keys"));
            crate::cluster::write_member_keys(&settings, &secret, id, &path).map(|()| path)
        })
        .collect::<Result<_>>()?;
    let claimed = |id: u8| root.join(format!("node-{id}")).join("identity").exists();
    let new_cluster = !(0..members).any(claimed);
    let mut children: Vec<(u8, Child)> = Vec::new();
    let mut rows = Vec::new();
    for id in 0..members {
        let (client, http, replica) = ports(base, id);
        let dir = root.join(format!("node-{id}"));
        let log_path = root.join(format!("node-{id}.log"));
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .with_context(|| format!("opening {}", log_path.display()))?;
        let mut command = Command::new(&exe);
        command
            .arg("server")
            .arg("--data-dir")
            .arg(&dir)
            .arg("--client-addr")
            .arg(format!("127.0.0.1:{client}"))
            .arg("--http-addr")
            .arg(format!("127.0.0.1:{http}"))
            .arg("--cluster-id")
            .arg("local")
            .arg("--node-id")
            .arg(id.to_string())
            .arg("--cluster-member-keys-file")
            .arg(&keys[usize::from(id)]);
        for member in &member_flags {
            command.arg("--member").arg(member);
        }
        if let Some(fsync) = fsync {
            command.arg("--fsync").arg(fsync);
        }
        if members > 1 && new_cluster {
            command.arg("--init");
        } else if members > 1 && !claimed(id) {
            command.arg("--rejoin");
        }
        let child = command
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("starting node {id}"))?;
        children.push((id, child));
        rows.push(vec![
            id.to_string(),
            format!("127.0.0.1:{client}"),
            format!("127.0.0.1:{http}"),
            format!("127.0.0.1:{replica}"),
            log_path.display().to_string(),
        ]);
    }
    println!(
        "cluster \"local\" of {members} under {} (Ctrl-C stops it)\n",
        root.display()
    );
    table::print(&["MEMBER", "CLIENTS", "HTTP", "REPLICAS", "LOG"], rows);
    let addrs: Vec<String> = (0..members)
        .map(|id| format!("127.0.0.1:{}", ports(base, id).0))
        .collect();
    println!("\ntry: braid --addr {} cluster status", addrs.join(","));
    let outcome = wait(&mut children);
    stop(&mut children);
    outcome
}

/// Waits for SIGINT or SIGTERM. A node that exits on its own (killed to try a
/// failover, or failed) is reported and the others go on; when none is left, so does
/// this.
fn wait(children: &mut [(u8, Child)]) -> Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        use tokio::signal::unix::{signal, SignalKind};
        let mut term = signal(SignalKind::terminate())?;
        let mut interrupt = signal(SignalKind::interrupt())?;
        let mut poll = tokio::time::interval(Duration::from_millis(200));
        let mut exited = vec![false; children.len()];
        loop {
            tokio::select! {
                _ = term.recv() => return Ok(()),
                _ = interrupt.recv() => return Ok(()),
                _ = poll.tick() => {
                    for (id, child) in children.iter_mut() {
                        if exited[usize::from(*id)] {
                            continue;
                        }
                        if let Some(status) = child.try_wait()? {
                            exited[usize::from(*id)] = true;
                            eprintln!("node {id} exited ({status}); the others go on (its log says why)");
                        }
                    }
                    if exited.iter().all(|e| *e) {
                        bail!("every node exited");
                    }
                }
            }
        }
    })
}

/// Asks every node still running to stop (SIGTERM through `kill`, which needs no
/// unsafe code here), and kills those still up after the grace period.
fn stop(children: &mut [(u8, Child)]) {
    for (_, child) in children.iter_mut() {
        if matches!(child.try_wait(), Ok(None)) {
            let _ = Command::new("kill")
                .arg("-TERM")
                .arg(child.id().to_string())
                .status();
        }
    }
    let deadline = Instant::now() + STOP_GRACE;
    for (id, child) in children.iter_mut() {
        loop {
            match child.try_wait() {
                Ok(Some(_)) | Err(_) => break,
                Ok(None) if Instant::now() >= deadline => {
                    eprintln!("node {id} did not stop in {STOP_GRACE:?}: killing it");
                    let _ = child.kill();
                    let _ = child.wait();
                    break;
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(50)),
            }
        }
    }
    eprintln!("stopped");
}
