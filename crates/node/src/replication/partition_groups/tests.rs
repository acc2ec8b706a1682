//! Opening partitions' groups from disk: one whose durable state went with its shard's
//! states table, and what a start found put to sleep at once.

#![allow(clippy::unwrap_used)]

use super::*;
use crate::replication::meta_group::Timing;

const KEY: PartitionKey = PartitionKey {
    topic_id: 1,
    partition: 0,
};

fn open(states: &Path, members: u8) -> PartitionGroups {
    let timing = Timing::from_heartbeat_timeout_ms(1_000);
    PartitionGroups::open(states, 0, 0, members, timing, 7).unwrap()
}

/// A temporary directory with the states tables' directory and a partition's in it.
fn dirs() -> (tempfile::TempDir, std::path::PathBuf, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let states = dir.path().join("replication");
    let data = dir.path().join("partitions").join("1").join("0");
    (dir, states, data)
}

/// The groups with partition `KEY` added at `data`, recovered and ticked 20 times.
fn opened_and_ticked(states: &Path, data: &Path, members: u8) -> PartitionGroups {
    let mut groups = open(states, members);
    groups.add(KEY, data, LogConfig::default(), 0).unwrap();
    groups.recover_opened().unwrap();
    for _ in 0..20 {
        groups.tick();
    }
    groups
}

/// An outside review of issue 24 deleted every states table of a node: it started,
/// its groups at view 0 with trusted journals, as if they had never voted (a member of a
/// cluster forgetting its views can help a stale view commit over a newer one). A group
/// whose files exist while its table was made anew at this open had its state there:
/// a member restarts it as a replica that lost its disk (durably, so the next start
/// does too), and a single node refuses the partition, naming the table.
#[test]
fn a_group_whose_states_table_is_gone_restarts_as_lost_or_is_refused() {
    for members in [3, 1] {
        let (_dir, states, data) = dirs();
        let group = group_of(KEY);
        {
            let groups = opened_and_ticked(&states, &data, members);
            assert!(
                groups.host.has_state(group),
                "{members}: a state was written"
            );
        }
        for copy in [0, 1] {
            std::fs::remove_file(states.join(format!("shard-0.{copy}"))).unwrap();
        }
        let mut groups = open(&states, members);
        let added = groups.add(KEY, &data, LogConfig::default(), 0);
        if members == 1 {
            let err = added.unwrap_err();
            assert!(matches!(err, HostError::Damaged { .. }), "{err}");
            assert!(err.to_string().contains("shard-0.0"), "{err}");
            continue;
        }
        added.unwrap();
        let replica = groups.host.replica(group).unwrap();
        assert!(
            !replica.journal_trusted(),
            "restarted as one that lost its disk"
        );
        drop(groups);
        // The next start finds the table, and the group's state says so still.
        let mut groups = open(&states, members);
        groups.add(KEY, &data, LogConfig::default(), 0).unwrap();
        let replica = groups.host.replica(group).unwrap();
        assert!(!replica.journal_trusted(), "still lost after a restart");
    }
}

/// A start opens every partition it finds; holding them all awake until the first
/// sleep pass left what they held freed in fragments, resident (see
/// `PartitionGroups::sleep_opened`). What a start found goes to sleep as soon as it is
/// open, and its first use wakes it as it was.
#[test]
fn partitions_a_start_finds_sleep_at_once_and_wake_as_they_were() {
    for members in [1, 3] {
        let (_dir, states, data) = dirs();
        let group = group_of(KEY);
        let opened_at = {
            let mut groups = opened_and_ticked(&states, &data, members);
            let at = groups.log_start(KEY).unwrap();
            groups.close();
            at
        };
        let mut groups = open(&states, members);
        groups.add(KEY, &data, LogConfig::default(), 0).unwrap();
        groups.recover_opened().unwrap();
        assert!(
            groups.host.journal(group).is_some(),
            "{members}: open, awake"
        );
        groups.sleep_opened([KEY]);
        assert!(groups.host.journal(group).is_none(), "{members}: asleep");
        assert!(groups.host.journal_asleep(group).is_some(), "{members}");
        assert_eq!(groups.sleep_counts(), (1, 0), "{members}");
        assert_eq!(
            groups.log_start(KEY),
            Some(opened_at),
            "{members}: read asleep"
        );
        // A use wakes it, checked to be as it was left.
        assert!(groups.log(KEY).is_some(), "{members}: woken");
        assert_eq!(groups.sleep_counts(), (1, 1), "{members}");
        assert!(groups.take_reopen().is_empty(), "{members}: found as left");
        assert!(groups.host.replica(group).is_some(), "{members}");
    }
}

/// Lone groups of `count` partitions of topic 1 under `dir`, set up by `configure`
/// before they are added, recovered and ticked 20 times; with their keys.
fn lone_partitions(
    dir: &Path,
    count: u32,
    configure: impl FnOnce(&mut PartitionGroups),
) -> (PartitionGroups, Vec<PartitionKey>) {
    let keys: Vec<PartitionKey> = (0..count)
        .map(|partition| PartitionKey {
            topic_id: 1,
            partition,
        })
        .collect();
    let mut groups = open(&dir.join("replication"), 1);
    configure(&mut groups);
    for key in &keys {
        let data = dir
            .join("partitions")
            .join("1")
            .join(key.partition.to_string());
        groups.add(*key, &data, LogConfig::default(), 0).unwrap();
    }
    groups.recover_opened().unwrap();
    for _ in 0..20 {
        groups.tick();
    }
    (groups, keys)
}

/// Descriptors this process holds open on files under `dir`.
fn descriptors_under(dir: &Path) -> usize {
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|fd| std::fs::read_link(fd.ok()?.path()).ok())
        .filter(|target| target.starts_with(dir))
        .count()
}

/// Every use counts against the shard's budget of partitions with open files, not a
/// client's produce or fetch alone: at 30,000 partitions written on three processes,
/// backups woken by prepares and retirement barriers held every member past its
/// descriptors. Past the budget the least recently used partition lets its
/// descriptors go (its journal stays in memory), and its next use opens them again:
/// every write is acknowledged and all of it is there.
#[test]
fn no_more_partitions_than_the_budget_hold_files_open_whatever_uses_them() {
    const BUDGET: usize = 2;
    let dir = tempfile::tempdir().unwrap();
    let partitions = dir.path().join("partitions");
    let (mut groups, keys) = lone_partitions(dir.path(), 4, |g| g.set_open_budget(BUDGET));
    // A partition in use holds up to three: a segment written, one read, its journal.
    let allowed = 3 * BUDGET;
    let open_now = || descriptors_under(&partitions);
    assert!(open_now() <= allowed, "opened: {} open", open_now());
    // Writes to each in turn: each opens its partition's files, and releases the least
    // recently used one's.
    let mut answers = Vec::new();
    for round in 0..3u8 {
        for key in &keys {
            let mut builder = braid_proto::BatchBuilder::new(1_000);
            builder.push(None, Some(&[round, key.partition as u8][..]), &[], 1_000);
            let batch = braid_proto::ValidatedBatch::new(builder.finish()).unwrap();
            let (reply, answer) = tokio::sync::oneshot::channel();
            let checked = crate::replication::group_client::Checked {
                metadata_op: 0,
                owed: 0,
            };
            groups.produce(*key, batch, reply, checked);
            groups.flush();
            for _ in 0..5 {
                groups.tick();
            }
            assert!(open_now() <= allowed, "after a write: {} open", open_now());
            answers.push(answer);
        }
    }
    for mut answer in answers {
        assert!(
            answer.try_recv().unwrap().is_ok(),
            "every write acknowledged"
        );
    }
    let released = groups.released_over_budget();
    assert!(released >= 8, "released for the budget: {released}");
    // A look (the scrub's) counts too.
    groups.host.wake_for_a_look(group_of(keys[0])).unwrap();
    groups.log(keys[0]).unwrap().read(0, 1 << 20, 3).unwrap();
    groups.host.wake_for_a_look(group_of(keys[1])).unwrap();
    groups.log(keys[1]).unwrap().read(0, 1 << 20, 3).unwrap();
    assert!(open_now() <= allowed, "after reads: {} open", open_now());
    // Every partition holds its three records, as written.
    for key in &keys {
        let log = groups.log(*key).unwrap();
        assert_eq!(log.next_offset(), 3, "partition {}", key.partition);
        assert!(open_now() <= allowed, "after a read: {} open", open_now());
    }
    assert!(groups.take_reopen().is_empty(), "nothing was found changed");
}

/// An idle pass puts at most its count of partitions to sleep, going on where the
/// last one stopped: a pass that closed every idle partition (four syncs each) held a
/// shard for most of each second of a retirement walk over thousands. Every idle
/// partition gets its turn, and each wakes as it was left.
#[test]
fn an_idle_pass_puts_at_most_its_count_to_sleep_and_each_gets_its_turn() {
    let dir = tempfile::tempdir().unwrap();
    let (mut groups, keys) = lone_partitions(dir.path(), 5, |g| {
        g.set_sleep_ticks(u64::MAX);
        g.set_sleeps_per_pass(2);
    });
    let awake = |groups: &PartitionGroups| {
        keys.iter()
            .filter(|key| groups.host.journal(group_of(**key)).is_some())
            .count()
    };
    assert_eq!(awake(&groups), 5, "opened and used");
    // The first pass marks them idle; the next ones sleep two a pass.
    groups.host.sleep_idle().unwrap();
    let mut left = Vec::new();
    for _ in 0..3 {
        let slept = groups.host.sleep_idle().unwrap();
        assert!(slept <= 2, "{slept} slept in one pass");
        left.push(awake(&groups));
    }
    assert_eq!(left, [1, 0, 0], "two a pass, each in its turn");
    for key in &keys {
        assert!(
            groups.log(*key).is_some(),
            "partition {} woken",
            key.partition
        );
    }
    assert!(groups.take_reopen().is_empty(), "each found as left");
}
