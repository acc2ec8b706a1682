//! A quiescent journal's files put to sleep and woken: the same journal when nothing
//! touched them, a refusal (never a repair, never a new file) when anything did.

use super::*;

/// A journal of 20 ops, synced, in `dir`.
fn written(dir: &Path, config: LogConfig) -> PartitionJournal {
    let (mut journal, _) = PartitionJournal::open(dir, GROUP, TAG, config, 0).unwrap();
    for p in chain(20, 1, "a") {
        journal.write_prepare(&p, 0).unwrap();
    }
    assert_eq!(journal.sync().unwrap().len(), 20);
    for p in chain(20, 1, "a") {
        journal.applied(p.header.op, p.header.checksum);
    }
    journal
}

/// What the holder and a peer see of a journal.
fn seen(journal: &mut PartitionJournal) -> impl PartialEq + std::fmt::Debug {
    (
        journal.tip(),
        journal.entries(0, 30),
        journal.committed_end(),
        journal.progress(),
        journal.scrubbed(),
        log_batches(journal),
    )
}

#[test]
fn a_journal_woken_is_the_one_that_slept_and_goes_on() {
    for config in [
        member_config(),
        LogConfig {
            fsync: braid_storage::FsyncPolicy::Never,
            ..member_config()
        },
    ] {
        let dir = tempfile::tempdir().unwrap();
        let mut journal = written(dir.path(), config);
        journal.prune(5).unwrap();
        journal.sync().unwrap();
        let before = seen(&mut journal);
        assert!(journal.can_sleep());
        let asleep = journal.sleep().unwrap();
        assert_eq!(
            asleep.progress(),
            crate::replication::status::JournalProgress {
                tip: 20,
                waiting: 0,
                copying: None,
            }
        );
        let mut journal = PartitionJournal::wake(GROUP, asleep, 0).unwrap();
        assert_eq!(seen(&mut journal), before);
        // It sleeps and wakes again with nothing written between (the scrub's look).
        let mut journal = PartitionJournal::wake(GROUP, journal.sleep().unwrap(), 0).unwrap();
        assert_eq!(seen(&mut journal), before);
        // And goes on: more ops, reported, and a restart finds them all.
        let more = chain(25, 1, "a");
        for p in &more[20..] {
            journal.write_prepare(p, 0).unwrap();
        }
        assert_eq!(journal.sync().unwrap().len(), 5);
        drop(journal);
        let (mut journal, recovered) =
            PartitionJournal::open(dir.path(), GROUP, TAG, config, 0).unwrap();
        assert!(recovered.damage.is_none(), "{:?}", recovered.damage);
        assert_eq!(journal.tip(), 25);
        assert!(
            log_batches(&mut journal) == batch_bodies(&more),
            "every batch in the log"
        );
    }
}

#[test]
fn files_changed_while_asleep_are_refused_not_repaired_or_made_anew() {
    type Change = fn(&Path);
    let changes: [(&str, Change); 4] = [
        ("the header journal gone", |dir| {
            std::fs::remove_file(dir.join(JOURNAL_FILE)).unwrap()
        }),
        ("a byte of the header journal flipped", |dir| {
            let path = dir.join(JOURNAL_FILE);
            let mut bytes = std::fs::read(&path).unwrap();
            let at = bytes.len() / 2;
            bytes[at] ^= 0x10;
            std::fs::write(&path, bytes).unwrap();
        }),
        ("the log's clean-shutdown marker gone", |dir| {
            std::fs::remove_file(dir.join("clean-shutdown")).unwrap()
        }),
        ("the log cut short", |dir| {
            let path = dir.join("00000000000000000000.log");
            let len = std::fs::metadata(&path).unwrap().len();
            let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
            file.set_len(len - 7).unwrap();
        }),
    ];
    for (what, change) in changes {
        let dir = tempfile::tempdir().unwrap();
        let journal = written(dir.path(), member_config());
        let asleep = journal.sleep().unwrap();
        change(dir.path());
        let journal_existed = dir.path().join(JOURNAL_FILE).exists();
        match PartitionJournal::wake(GROUP, asleep, 0) {
            Err(
                PartitionJournalError::Journal(JournalError::NotAsLeft { .. })
                | PartitionJournalError::Log(LogError::NotAsClosed { .. }),
            ) => {}
            other => panic!("{what}: {:?}", other.map(|_| ())),
        }
        assert_eq!(
            dir.path().join(JOURNAL_FILE).exists(),
            journal_existed,
            "{what}: no journal made anew"
        );
        // The restart that follows opens the files in full: what changed is damage
        // (or a lost journal), never fewer ops taken as the whole.
        let (_, recovered) =
            PartitionJournal::open(dir.path(), GROUP, TAG, member_config(), 0).unwrap();
        let whole = recovered.damage.is_none() && !recovered.tail_cut;
        let ops = recovered.slots.len();
        assert!(!whole || ops == 20, "{what}: {ops} ops, taken as whole");
    }
}

/// A lone replica's journal damaged while it slept is refused at the wake and left as
/// the damage left it, so that the start that follows names the file and byte. (An
/// outside review of issue 24: the wake's open rewrote it as a member's would, and the
/// single node's refusal then named only "op 1 ... damaged or lost".)
#[test]
fn a_lone_replicas_journal_damaged_asleep_is_left_as_found_and_named() {
    let dir = tempfile::tempdir().unwrap();
    let journal = written(dir.path(), config());
    let asleep = journal.sleep().unwrap();
    let path = dir.path().join(JOURNAL_FILE);
    let mut bytes = std::fs::read(&path).unwrap();
    let at = bytes.len() / 2;
    bytes[at] ^= 0x10;
    std::fs::write(&path, &bytes).unwrap();
    let woken = PartitionJournal::wake(GROUP, asleep, 0).map(|_| ());
    assert!(
        matches!(
            woken,
            Err(PartitionJournalError::Journal(
                JournalError::NotAsLeft { .. }
            ))
        ),
        "{woken:?}"
    );
    assert_eq!(std::fs::read(&path).unwrap(), bytes, "left as found");
    let (_, recovered) = PartitionJournal::open(dir.path(), GROUP, TAG, config(), 0).unwrap();
    let damage = recovered.damage.unwrap();
    assert!(
        damage.contains("vsr.journal is damaged at byte"),
        "{damage}"
    );
    assert_eq!(std::fs::read(&path).unwrap(), bytes, "left as found");
}

/// A sleeping partition is woken for retention only when retention would delete a
/// segment: by size at once, by age when its oldest segment expires, never while the
/// journal still holds the oldest segment's ops (an idle partition under the default
/// retention by age is not woken at every check).
#[test]
fn a_sleeping_log_is_due_for_retention_only_when_it_would_delete() {
    let small = |retention_bytes, retention_ms| LogConfig {
        segment_bytes_max: 1_024,
        retention_bytes,
        retention_ms,
        ..member_config()
    };
    let timestamp = 1_000; // the batches' records (see `batch`)
    for (config, prune, due) in [
        (small(Some(500), None), true, Some(0)),
        (small(Some(500), None), false, None),
        (small(None, Some(60_000)), true, Some(timestamp + 60_001)),
        (small(None, None), true, None),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let mut journal = written(dir.path(), config);
        assert!(journal.log().segment_count() >= 2, "{config:?}");
        if prune {
            journal.prune(19).unwrap();
            journal.sync().unwrap();
        }
        let asleep = journal.sleep().unwrap();
        for now in [0, timestamp + 60_000, timestamp + 60_001, u64::MAX] {
            assert_eq!(
                asleep.retention_may_apply(now),
                due.is_some_and(|due| now >= due),
                "{config:?} prune {prune} at {now}"
            );
        }
    }
}
