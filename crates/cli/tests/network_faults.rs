//! Network faults between real processes (ignored in CI; needs root and `iproute2`:
//! `scripts/network-faults.sh`). Three `braid server` processes, each in its own
//! network namespace on a bridge the test reaches them through, under four SDK
//! producers:
//! (a) the partition's primary cut off from both peers, both ways, while its clients
//!     still reach it;
//! (b) one-way cuts: the primary's packets to its peers dropped; then, on a new
//!     primary, its peers' packets to it dropped (its prepares and heartbeats arrive,
//!     no acknowledgement returns);
//! (c) the primary's link down: no FIN, no RST, every connection to it half-open, found
//!     only by heartbeats and TCP_USER_TIMEOUT.
//! During each cut a client connected to the old primary alone sends batches: none is
//! acknowledged. After each heal every acknowledged record is read back at its
//! offset, in each producer's order, and each group's commit point is the same on all
//! members.

// A panic in a test is a failed assertion, not a crash on outside data.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use braid_client::{Client, ConnectOptions};

mod support;
use support::cluster::{
    check_everything_acknowledged_is_there, partition_primary, under_load, Cluster, Load,
};
use support::netns::Netns;

/// What a client connected to one member alone got from it: batches acknowledged,
/// refused.
struct Probe {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<(u64, u64)>,
}

impl Probe {
    /// Sends one-record batches (values `9-N`, a fifth producer's) to member `id` alone
    /// until stopped.
    async fn start(cluster: &Cluster, id: u8) -> Self {
        let options = ConnectOptions {
            direct: true,
            ..ConnectOptions::default()
        };
        let client = Client::connect_with(&cluster.client_addr(id).to_string(), &options)
            .await
            .unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let task = tokio::spawn(async move {
            let (mut acked, mut refused) = (0, 0);
            let mut n = 0u64;
            while !flag.load(Ordering::Relaxed) {
                let mut builder = braid_proto::BatchBuilder::new(0);
                let value = format!("9-{n}");
                builder.push(Some(b"9"), Some(value.as_bytes()), &[], 0);
                let batch = builder.finish();
                let sent = client.produce("s", "t", 0, &batch);
                match tokio::time::timeout(Duration::from_millis(500), sent).await {
                    Ok(Ok(_)) => acked += 1,
                    Ok(Err(_)) => {
                        refused += 1;
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                    // Unanswered (held, never committed) counts as not acknowledged;
                    // the probe goes on with the next.
                    Err(_) => refused += 1,
                }
                n += 1;
            }
            (acked, refused)
        });
        Self { stop, task }
    }

    async fn finish(self) -> (u64, u64) {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await.unwrap()
    }
}

/// The cluster in namespaces, under load, with its topic.
async fn start() -> (Cluster, Client, Load) {
    under_load(
        Cluster::start_in(Netns::create(3), "never"),
        Duration::from_secs(2),
    )
    .await
}

/// A counter from member `id`'s `/metrics`.
async fn metric(cluster: &Cluster, id: u8, name: &str) -> u64 {
    let (_, text) = support::http_get(cluster.http_addr(id), "/metrics")
        .await
        .unwrap();
    text.lines()
        .find(|l| l.split_whitespace().next() == Some(name))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in /metrics"))
}

/// Asserts member `id` counted a step-down (only its own can move the group on when
/// its backups still hear it, or its clients still reach it).
async fn assert_stepped_down(cluster: &Cluster, id: u8, who: &str) {
    let step_downs = metric(cluster, id, "braid_vsr_step_downs_total").await;
    assert!(step_downs >= 1, "{who} (member {id}) never stepped down");
}

/// Runs a cut of the primary made by `cut` and undone by `heal`: the load resumes on a
/// new primary, a client of the old primary alone gets nothing acknowledged, and after
/// the heal the old primary catches up. Returns (old primary, time to resume).
async fn cut_the_primary(
    cluster: &Cluster,
    load: &Load,
    what: &str,
    cut: impl Fn(&Netns, u8),
    heal: impl Fn(&Netns, u8),
) -> (u8, Duration) {
    let netns = cluster.netns().unwrap();
    let old = partition_primary(cluster).await;
    cut(netns, old);
    // From the moment the cut is whole (what was sent before may still commit).
    let at = Instant::now();
    let probe = Probe::start(cluster, old).await;
    let Some(resumed) = load.try_first_ack_after(at, Duration::from_secs(30)).await else {
        panic!(
            "{what}: no produce acknowledged within 30 s\n{}",
            cluster.dump().await
        );
    };
    let new = partition_primary(cluster).await;
    if new == old {
        panic!(
            "{what}: the partition still has its old primary {old} (resumed after {resumed:?})\n{}",
            cluster.dump().await
        );
    }
    // Long enough for the old primary to step down and the probe to try it again.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (acked, refused) = probe.finish().await;
    println!(
        "{what}: member {old} cut, produce resumed on member {new} after {resumed:?}; the old primary acknowledged {acked} of {} batches sent to it alone",
        acked + refused
    );
    assert_eq!(acked, 0, "{what}: the cut-off primary acknowledged a batch");
    assert!(refused > 0, "{what}: the probe sent nothing");
    heal(netns, old);
    cluster.until_ready(old, Duration::from_secs(60)).await;
    (old, resumed)
}

/// Stops the load and checks everything after the heals: every acknowledged record
/// read back, each group at one commit point, and each member's log on disk the same.
async fn check(mut cluster: Cluster, client: &Client, load: Load, what: &str) {
    let (acked, failed) = load.finish().await;
    let groups = cluster.until_logs_agree(Duration::from_secs(60)).await;
    let (stored, twice) = check_everything_acknowledged_is_there(client, &acked).await;
    let on_disk = cluster.stop_and_compare_logs();
    println!(
        "{what}: {} acknowledged, {failed} sends failed, {stored} stored, {twice} stored twice; {groups} groups at one commit point on all members; the same {on_disk} records in every member's log",
        acked.len()
    );
    assert!(acked.len() > 1_000, "the producers made progress");
    assert!(on_disk >= stored, "the logs hold what was read");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root and network namespaces: scripts/network-faults.sh"]
async fn a_primary_cut_off_from_its_peers_acknowledges_nothing_and_the_others_go_on() {
    let (cluster, client, load) = start().await;
    let (old, _) = cut_the_primary(
        &cluster,
        &load,
        "primary isolated from its peers",
        |netns, id| netns.isolate_from_peers(id),
        |netns, id| netns.rejoin_peers(id),
    )
    .await;
    assert_stepped_down(&cluster, old, "the cut-off primary").await;
    check(cluster, &client, load, "isolated primary, healed").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root and network namespaces: scripts/network-faults.sh"]
async fn one_way_cuts_either_way_move_the_primary_and_lose_nothing() {
    let (cluster, client, load) = start().await;
    let peers = |id: u8| (0..3u8).filter(move |p| *p != id);
    cut_the_primary(
        &cluster,
        &load,
        "the primary's packets to its peers dropped",
        |netns, id| peers(id).for_each(|p| netns.cut(id, p)),
        |netns, id| peers(id).for_each(|p| netns.heal(id, p)),
    )
    .await;
    // Its prepares and heartbeats arrive and keep its backups from suspecting it;
    // only its own step-down (nothing commits) moves the group on.
    let (old, _) = cut_the_primary(
        &cluster,
        &load,
        "the peers' packets to the primary dropped",
        |netns, id| peers(id).for_each(|p| netns.cut(p, id)),
        |netns, id| peers(id).for_each(|p| netns.heal(p, id)),
    )
    .await;
    assert_stepped_down(
        &cluster,
        old,
        "the primary whose acknowledgements were lost",
    )
    .await;
    check(cluster, &client, load, "one-way cuts, healed").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root and network namespaces: scripts/network-faults.sh"]
async fn a_half_open_primary_is_replaced_and_rejoins_after_the_heal() {
    let (cluster, client, load) = start().await;
    let netns = cluster.netns().unwrap();
    let old = partition_primary(&cluster).await;
    netns.link_down(old);
    let at = Instant::now();
    let resumed = load.first_ack_after(at, Duration::from_secs(30)).await;
    let new = partition_primary(&cluster).await;
    let mut rows = Vec::new();
    for id in 0..3 {
        rows.push(format!("member {id}: {:?}", cluster.rows(id).await));
    }
    assert_ne!(new, old, "resumed after {resumed:?}\n{}", rows.join("\n"));
    println!("half-open link to member {old}: produce resumed on member {new} after {resumed:?}");
    // Half-open for a while longer than every timeout, then healed.
    tokio::time::sleep(Duration::from_secs(8)).await;
    netns.link_up(old);
    cluster.until_ready(old, Duration::from_secs(60)).await;
    let torn_down = metric(&cluster, new, "braid_bus_teardowns_total").await;
    assert!(torn_down >= 1, "the half-open bundle was never torn down");
    check(cluster, &client, load, "half-open primary, healed").await;
}
