//! Named scenarios that break weak implementations, and a batch of random seeds.
//! Every checker runs after every step; a failure prints the seed to replay.

// A panic in a test is a failed assertion, not a crash on outside data.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use braid_sim::{run_seed, Faults, SimConfig, Simulation};
use braid_vsr::Status;

fn quiet(seed: u64, replica_count: u8, groups: u64) -> SimConfig {
    SimConfig {
        seed,
        replica_count,
        groups,
        clients_per_group: 2,
        requests_per_client: 30,
        safety_ticks: 0,
        liveness_ticks_max: 20_000,
        faults: Faults::none(),
        sessions_max: 3,
        checkpoint_interval: 64,
        quiesce: false,
        journal_fsync: true,
        resend_after_eviction: false,
        compact_committed: false,
    }
}

fn ok<T>(result: Result<T, braid_sim::Failure>) -> T {
    result.unwrap_or_else(|failure| panic!("{failure}"))
}

/// CI runs this many random seeds (a longer run: `cargo run -p braid-sim --release -- --seeds 10000`).
#[test]
fn random_seeds() {
    let seeds: u64 = std::env::var("SIM_SEEDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2_000);
    for seed in 1..=seeds {
        ok(run_seed(seed, false));
    }
}

#[test]
fn next_primary_lacks_a_committed_op_then_old_primary_crashes() {
    // Group 0: the primary of view 0 is replica 0, of view 1 replica 1.
    let mut sim = Simulation::new(quiet(11, 3, 1));
    sim.set_random_faults(false);
    ok(sim.run_until(2_000, |s| s.committed(0) >= 5));
    // Replica 1 misses a few ops that replicas 0 and 2 commit, well inside its
    // view-change timeout.
    sim.isolate(1);
    let before = sim.committed(0);
    ok(sim.run_until(40, |s| s.committed(0) >= before + 3));
    let lacking = sim.replica(0, 1).unwrap().commit_max();
    assert!(
        lacking < sim.committed(0),
        "replica 1 is behind what a quorum committed"
    );
    // The old primary dies; replica 1 leads (view 1) or helps elect the next one, and
    // the ops it lacked survive.
    sim.crash((0, 0));
    sim.heal_network();
    ok(sim.run_until(5_000, |s| {
        (1..3).any(|r| s.replica(0, r).is_some_and(|x| x.is_primary()))
            && s.replica(0, 1)
                .is_some_and(|x| x.commit_min() >= before + 3)
    }));
    let outcome = ok(sim.finish());
    assert!(outcome.ops_committed >= before + 3);
}

#[test]
fn one_way_partition_of_the_primary() {
    let mut sim = Simulation::new(quiet(12, 3, 1));
    sim.set_random_faults(false);
    ok(sim.run_until(2_000, |s| s.committed(0) >= 5));
    // The primary hears everyone but nobody hears it.
    sim.cut(0, 1);
    sim.cut(0, 2);
    ok(sim.run_until(5_000, |s| {
        s.replica(0, 1)
            .is_some_and(|r| r.view() > 0 && r.status() == Status::Normal)
    }));
    ok(sim.finish());
}

#[test]
fn heavy_loss_with_replayed_messages_and_evicted_sessions() {
    let mut refused = 0;
    for seed in 0..20 {
        let mut config = quiet(100 + seed, 3, 1);
        config.clients_per_group = 4;
        config.sessions_max = 2; // registers evict sessions, old registers get replayed
        config.safety_ticks = 3_000;
        config.faults = Faults {
            loss_percent: 30,
            duplicate_percent: 20,
            delay_ticks_max: 40,
            replay_per_10k: 2_000,
            ..Faults::none()
        };
        // With fewer sessions than clients they evict each other forever; the safety
        // phase is what this checks, then each client needs only a few requests.
        config.requests_per_client = 3;
        let mut sim = Simulation::new(config);
        ok(sim.run_ticks(3_000));
        refused += sim.outcome().stale_registers_refused;
    }
    assert!(
        refused > 0,
        "replayed old registers reached the cluster and were refused"
    );
}

#[test]
fn crash_between_view_change_and_its_durable_write() {
    let mut sim = Simulation::new(quiet(13, 3, 1));
    sim.set_random_faults(false);
    ok(sim.run_until(2_000, |s| s.committed(0) >= 5));
    sim.isolate(0);
    // Replica 1 starts a view change; crash it while the new view is still being written.
    let caught = ok(sim.run_until(3_000, |s| {
        s.replica(0, 1)
            .is_some_and(|r| r.status() == Status::ViewChange)
            && s.has_pending_writes(0, 1)
    }));
    assert!(
        caught,
        "replica 1 entered a view change with its write pending"
    );
    sim.crash((0, 1));
    sim.heal_network();
    ok(sim.run_ticks(200));
    sim.restart((0, 1));
    ok(sim.finish());
}

#[test]
fn damaged_journal_on_the_replica_that_becomes_primary() {
    let mut sim = Simulation::new(quiet(14, 3, 1));
    sim.set_random_faults(false);
    ok(sim.run_until(3_000, |s| s.committed(0) >= 20));
    // Replica 1 (next primary) loses entries to damage, found when it restarts.
    sim.crash((0, 1));
    for op in [3, 7, 15, 19] {
        sim.corrupt(0, 1, op);
    }
    sim.restart((0, 1));
    sim.crash((0, 0));
    ok(sim.run_until(5_000, |s| s.replica(0, 1).is_some_and(|r| r.is_primary())));
    ok(sim.finish());
}

#[test]
fn lagging_replica_catches_up_by_state_transfer_while_its_source_crashes() {
    let mut config = quiet(15, 3, 1);
    config.checkpoint_interval = 8; // journals keep little, so the laggard needs a snapshot
    config.requests_per_client = 60;
    let mut sim = Simulation::new(config);
    sim.set_random_faults(false);
    sim.isolate(2);
    ok(sim.run_until(10_000, |s| s.committed(0) >= 60));
    sim.heal_network();
    // One of its sources goes down mid-transfer.
    ok(sim.run_ticks(12));
    sim.crash((0, 1));
    ok(sim.run_until(5_000, |s| {
        s.replica(0, 2).is_some_and(|r| r.commit_min() >= 60)
    }));
    assert!(
        sim.replica(0, 2).unwrap().commit_min() >= 60,
        "the laggard caught up"
    );
    ok(sim.finish());
}

#[test]
fn many_groups_restart_at_once() {
    let mut config = quiet(16, 3, 20);
    config.clients_per_group = 1;
    config.requests_per_client = 10;
    let mut sim = Simulation::new(config);
    sim.set_random_faults(false);
    ok(sim.run_ticks(300));
    for group in 0..20 {
        for replica in 0..3 {
            sim.crash((group, replica));
        }
    }
    ok(sim.run_ticks(10));
    let outcome = ok(sim.finish());
    assert!(outcome.ops_committed >= 20 * 10);
}

#[test]
fn restarted_primary_never_reruns_the_view_it_led() {
    // Seed 27667: the primary of view 1 restarts, a replayed DoViewChange of view 1
    // reaches it, and (before the fix) it started view 1 again from its durable commit,
    // preparing other ops at numbers its backups already held.
    ok(run_seed(27667, false));
}

#[test]
fn a_damaged_copy_of_an_installed_snapshot_loses_nothing() {
    // Seed 1153468: a replica that lost its disk installed snapshots of ops 192, then
    // 206, with no journal between (it never held ops 193 and 194). A crash damaged
    // the copy holding 206, it fell back to 192, and once the only other holder of
    // those ops lost its disk too, no replica could apply op 193 again: the group
    // stalled at 192 with 247 committed. An installed snapshot now fills both copies.
    ok(run_seed(1_153_468, false));
}

/// Seed 1246066 (the soak from 1224000): once faults stopped the group changed view
/// for good. The highest log view's best (trusted) vote lacked ops 214-215, the other
/// vote of that view was untrusted above 209, and the third vote, of an older log view,
/// held stale entries there, so it was not counted as never having had them. An op the
/// best vote lacks was prepared in that view, which an older-view vote never
/// acknowledged: it counts as a nack now.
#[test]
fn a_hole_in_the_newest_log_view_is_dropped_with_a_stale_view_vote() {
    ok(run_seed(1_246_066, false));
}

/// Seed 1265781 (the soak from 1224000): a replica became trusted again in memory
/// after a power loss, but its durable state still said otherwise when the simulator
/// let a second replica lose power; it then crashed and came back untrusted, and with
/// two untrusted backups no view change could finish. Two power losses at once are
/// beyond one fault: the simulator now counts a replica untrusted until its durable
/// state is trusted too.
#[test]
fn a_replica_trusted_only_in_memory_counts_as_untrusted_in_the_fault_budget() {
    ok(run_seed(1_265_781, false));
}

#[test]
fn restarted_primary_moves_to_the_next_view() {
    let mut sim = Simulation::new(quiet(17, 3, 1));
    sim.set_random_faults(false);
    ok(sim.run_until(2_000, |s| s.committed(0) >= 5));
    // Group 0's primary of view 0 is replica 0.
    assert!(sim.replica(0, 0).unwrap().is_primary());
    sim.crash((0, 0));
    sim.restart((0, 0));
    ok(sim.run_ticks(1));
    let restarted = sim.replica(0, 0).unwrap();
    assert_eq!(restarted.status(), Status::ViewChange);
    assert_eq!(restarted.view(), 1, "it left the view it led");
    ok(sim.finish());
}

#[test]
fn a_cut_off_primary_installs_a_snapshot_of_a_newer_view() {
    // Seed 13928: the primary of view 2, cut off with ops of its own above the commit,
    // installs a snapshot taken in view 3. Its ops above the snapshot do not chain to it
    // and can never commit: it cuts them and leaves view 2 instead of preparing other
    // ops at the same numbers (caught by the invariants and the log-level check).
    ok(run_seed(13928, false));
}

/// With `fsync = never`, a backup acknowledges writes still in its page cache. One that
/// loses power loses them; after its restart it must not count as never having them,
/// or a view change with the replica that never got them would drop committed ops.
#[test]
fn a_backup_that_lost_unsynced_acknowledged_writes_does_not_nack_them() {
    let mut config = quiet(18, 3, 1);
    config.journal_fsync = false;
    let mut sim = Simulation::new(config);
    sim.set_random_faults(false);
    sim.set_writeback(false);
    ok(sim.run_until(2_000, |s| s.committed(0) >= 5));
    // Replica 2 falls behind; 0 (primary) and 1 commit more.
    sim.isolate(2);
    let before = sim.committed(0);
    ok(sim.run_until(2_000, |s| s.committed(0) >= before + 10));
    let committed = sim.committed(0);
    // Replica 1 loses power (its acknowledged, unsynced writes may be gone) and the
    // primary crashes: only 1 and 2 are up, and 2 never had the newest ops.
    sim.power_off((0, 1));
    sim.crash((0, 0));
    sim.heal_network();
    sim.restart((0, 1));
    assert!(
        !sim.replica(0, 1).unwrap().journal_trusted(),
        "a power loss leaves the journal untrusted"
    );
    // 1 and 2 alone must not start a view without the ops 0 holds.
    ok(sim.run_ticks(1_500));
    for r in 1..3 {
        let replica = sim.replica(0, r).unwrap();
        assert!(
            replica.status() != Status::Normal || replica.commit_max() >= committed,
            "replica {r} is normal in view {} below the committed op {committed}",
            replica.view()
        );
    }
    // With the primary back, the view starts and nothing committed is lost.
    sim.restart((0, 0));
    let outcome = ok(sim.finish());
    assert!(outcome.ops_committed >= committed);
}

/// The client-table rule: after its session is evicted, a client must not resend an
/// operation whose reply it never got under a new session, since the first attempt may
/// have run. A client that does is caught by the model (keyed by the client's own
/// operation, not by session and request) running one operation twice.
#[test]
fn an_operation_resent_under_a_new_session_after_eviction_is_caught() {
    let mut caught = 0;
    let mut unknown = 0;
    for seed in 0..40 {
        let mut config = quiet(300 + seed, 3, 1);
        config.clients_per_group = 4;
        config.sessions_max = 2; // registers evict the others' sessions all the time
        config.requests_per_client = 6;
        config.safety_ticks = 3_000;
        config.faults = Faults {
            loss_percent: 30,
            delay_ticks_max: 20,
            ..Faults::none()
        };
        // The rule kept: never twice, and the unknown outcomes are counted.
        let mut sim = Simulation::new(config);
        ok(sim.run_ticks(3_000));
        unknown += sim.outcome().outcomes_unknown;
        // The rule broken: some run executes an operation twice.
        config.resend_after_eviction = true;
        if let Err(failure) = Simulation::new(config).run_ticks(3_000) {
            assert!(failure.what.contains("ran twice"), "{failure}");
            if caught == 0 {
                eprintln!("{failure}");
            }
            caught += 1;
        }
    }
    assert!(unknown > 0, "evictions left outcomes unknown");
    eprintln!("{caught} of 40 runs that resent after an eviction ran an operation twice");
    assert!(
        caught > 0,
        "resending after an eviction ran an operation twice"
    );
}

/// Damage beyond what a quorum can repair: every copy of a committed op is damaged.
/// Nothing may apply past it (no replica guesses, none applies another op there), and
/// the group stops short of it instead of diverging.
#[test]
fn damage_to_every_copy_of_a_committed_op_is_refused_never_applied() {
    let mut sim = Simulation::new(quiet(19, 3, 1));
    sim.set_random_faults(false);
    ok(sim.run_until(5_000, |s| s.committed(0) >= 20));
    for replica in 0..3 {
        sim.crash((0, replica));
    }
    for replica in 0..3 {
        sim.corrupt(0, replica, 10);
    }
    for replica in 0..3 {
        sim.restart((0, replica));
    }
    ok(sim.run_ticks(3_000));
    for replica in 0..3 {
        let r = sim.replica(0, replica).unwrap();
        assert!(
            r.commit_min() < 10,
            "replica {replica} applied op {} past the op no copy of survived",
            r.commit_min()
        );
    }
}
