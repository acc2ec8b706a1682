//! The long real-process fault runs (ignored in CI; `scripts/fault-suite.sh` runs them):
//! three `braid server` processes on loopback under four SDK producers, then
//! (a) 20 SIGKILLs of the partition's primary, each restarted, with the time from the
//! kill to the first acknowledgement of a record sent after it (p50 and max);
//! (b) rolling restarts (stop, start, wait for `/ready`) of all three under
//! `fsync = never`, once with SIGTERM and once with SIGKILL;
//! (c) SIGKILL of all three at once under `fsync = always`, then a restart.
//! After each: every acknowledged record is read back at its offset, records stored
//! twice are counted, and each group's commit point (op and checksum) is the same on
//! every member.

// A panic in a test is a failed assertion, not a crash on outside data.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

mod support;
use support::cluster::{
    check_everything_acknowledged_is_there, connect, partition_primary, under_load, Cluster, NODES,
};

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a long real-process fault run: scripts/fault-suite.sh"]
async fn twenty_kills_of_the_primary_under_four_producers() {
    let (mut cluster, client, load) =
        under_load(Cluster::start("never"), Duration::from_secs(2)).await;
    let mut resumed = Vec::new();
    for kill in 0..20 {
        let victim = partition_primary(&cluster).await;
        cluster.stop(victim, "KILL");
        // From its death (sends before it may still have been answered by it).
        let killed = Instant::now();
        let after = load.first_ack_after(killed, Duration::from_secs(30)).await;
        println!("kill {kill}: member {victim}, first acknowledgement after {after:?}");
        resumed.push(after);
        cluster.spawn(victim);
        cluster.until_ready(victim, Duration::from_secs(60)).await;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let (acked, failed) = load.finish().await;
    let groups = cluster.until_logs_agree(Duration::from_secs(30)).await;
    let (stored, twice) = check_everything_acknowledged_is_there(&client, &acked).await;
    let on_disk = cluster.stop_and_compare_logs();
    assert!(on_disk >= stored, "every member's log holds what was read");
    resumed.sort();
    println!(
        "20 kills: produce resumed p50 {:?}, max {:?}; {} acknowledged, {failed} sends failed, {stored} stored, {twice} stored twice; {groups} groups at one commit point on all members, the same {on_disk} records in every member's log",
        percentile(&resumed, 0.5),
        resumed[resumed.len() - 1],
        acked.len()
    );
    assert!(acked.len() > 1_000, "the producers made progress");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a long real-process fault run: scripts/fault-suite.sh"]
async fn a_rolling_restart_under_fsync_never_loses_nothing() {
    // Clean stops: each records its partitions synced, so they restart trusted.
    rolling_restart("TERM").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a long real-process fault run: scripts/fault-suite.sh"]
async fn a_rolling_kill_9_under_fsync_never_loses_nothing() {
    // Crashes in the same boot: the page cache kept every write the killed process
    // reported, and the states' boot stamp says so, so each restarts trusted (were it
    // untrusted, two untrusted members could form no view).
    rolling_restart("KILL").await;
}

/// Stops each member in turn with `signal` under `fsync = never` and load, restarts
/// it and waits for it to be caught up before the next.
async fn rolling_restart(signal: &str) {
    let (mut cluster, client, load) =
        under_load(Cluster::start("never"), Duration::from_secs(2)).await;
    for id in 0..NODES {
        let before = load.acked();
        cluster.stop(id, signal);
        cluster.spawn(id);
        cluster.until_ready(id, Duration::from_secs(60)).await;
        let rows = cluster.rows(id).await;
        let untrusted: Vec<_> = rows.iter().filter(|r| r["trusted"] != true).collect();
        assert!(
            !rows.is_empty() && untrusted.is_empty(),
            "member {id} restarted in the same boot with untrusted groups: {untrusted:?}"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
        println!(
            "restarted member {id} (SIG{signal}): {} acknowledged meanwhile",
            load.acked() - before
        );
    }
    let (acked, failed) = load.finish().await;
    let groups = cluster.until_logs_agree(Duration::from_secs(30)).await;
    let (stored, twice) = check_everything_acknowledged_is_there(&client, &acked).await;
    let on_disk = cluster.stop_and_compare_logs();
    assert!(on_disk >= stored, "every member's log holds what was read");
    println!(
        "rolling restart (SIG{signal}, fsync = never): {} acknowledged, {failed} sends failed, {stored} stored, {twice} stored twice; {groups} groups agree, the same {on_disk} records in every member's log",
        acked.len()
    );
    assert_eq!(failed, 0, "the SDK rides through a rolling restart");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a long real-process fault run: scripts/fault-suite.sh"]
async fn sigkill_of_every_member_at_once_under_fsync_always_loses_nothing() {
    let (mut cluster, _client, load) =
        under_load(Cluster::start("always"), Duration::from_secs(4)).await;
    // All three at once: no member outlives the others long enough to flush.
    cluster.kill_all_at_once();
    let (acked, failed) = load.finish().await;
    for id in 0..NODES {
        cluster.spawn(id);
    }
    for id in 0..NODES {
        cluster.until_ready(id, Duration::from_secs(60)).await;
    }
    let client = connect(&cluster).await;
    let groups = cluster.until_logs_agree(Duration::from_secs(30)).await;
    let (stored, twice) = check_everything_acknowledged_is_there(&client, &acked).await;
    let on_disk = cluster.stop_and_compare_logs();
    assert!(on_disk >= stored, "every member's log holds what was read");
    println!(
        "kill -9 of all three under fsync = always: {} acknowledged before the kill, all there; {failed} sends failed, {stored} stored, {twice} stored twice; {groups} groups agree, the same {on_disk} records in every member's log",
        acked.len()
    );
    assert!(!acked.is_empty());
}
