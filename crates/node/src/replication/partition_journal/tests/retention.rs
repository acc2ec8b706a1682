use super::*;

/// A log config of small segments and retention by size.
fn small_retained(lone: bool) -> LogConfig {
    LogConfig {
        segment_bytes_max: 1_024,
        retention_bytes: Some(2_500),
        recovery: if lone {
            braid_storage::RecoveryMode::Strict
        } else {
            braid_storage::RecoveryMode::TruncateAtDamage
        },
        ..config()
    }
}

/// A journal of 80 ops, synced, over small segments under retention by size.
fn holding_80(dir: &Path, lone: bool) -> PartitionJournal {
    let (mut journal, _) =
        PartitionJournal::open(dir, GROUP, TAG, small_retained(lone), 0).unwrap();
    for p in &chain(80, 1, "a") {
        journal.write_prepare(p, 0).unwrap();
    }
    journal.sync().unwrap();
    journal
}

/// Retention deletes whole segments by size or age, but only those whose batches are
/// all of ops the journal pruned: a restart replays the ops it still holds from their
/// batches. Unbounded, it deleted such batches, and the next open took the ops for
/// never reported, cut them and every op above, and cut the log back to its start,
/// deleting every record retention had kept.
#[test]
fn retention_deletes_only_batches_of_pruned_ops() {
    for lone in [true, false] {
        let dir = tempfile::tempdir().unwrap();
        let (start, next) = {
            let mut journal = holding_80(dir.path(), lone);
            assert_eq!(journal.apply_retention(0).unwrap().segments_deleted, 0);
            journal.prune(60).unwrap();
            let deleted = journal.apply_retention(0).unwrap().segments_deleted;
            assert!(
                deleted > 0,
                "retention deleted segments below the prune point"
            );
            let (_, op_61) = journal.index.entry(61).map(|(h, b)| (*h, b)).unwrap();
            assert!(journal.log().start_offset() <= op_61.unwrap());
            (journal.log().start_offset(), journal.log().next_offset())
        };
        let (mut journal, recovered) =
            PartitionJournal::open(dir.path(), GROUP, TAG, small_retained(lone), 0).unwrap();
        assert_eq!(
            (journal.log().start_offset(), journal.log().next_offset()),
            (start, next),
            "lone {lone}: the log retention kept is kept"
        );
        assert_eq!(journal.tip(), 80, "lone {lone}");
        assert_eq!(recovered.damage, None, "lone {lone}");
    }
}

/// The prune that bounds a retention pass is durable before the pass deletes a
/// segment: a deletion is durable at once, and a power loss that kept it but not the
/// prune reopened ops whose batches lay below the log's start (the shell simulator's
/// seed 305047 with damage to sleeping files: the member asked for ever for a copy of
/// batches every peer's retention had deleted too).
#[test]
fn the_prune_that_bounds_retention_is_durable_before_a_segment_goes() {
    use braid_storage::disk::hook::{self, Event};
    let dir = tempfile::tempdir().unwrap();
    let mut journal = holding_80(dir.path(), false);
    journal.prune(60).unwrap();
    hook::start_tracing();
    let deleted = journal.apply_retention(0).unwrap().segments_deleted;
    let trace = hook::take().expect("traced").trace;
    assert!(deleted > 0);
    let journal_file = dir.path().join(JOURNAL_FILE);
    let synced = trace
        .iter()
        .position(|e| matches!(e, Event::Sync { path } if *path == journal_file))
        .expect("the header journal is synced");
    let removed = trace
        .iter()
        .position(
            |e| matches!(e, Event::Remove { path } if path.extension().is_some_and(|x| x == "log")),
        )
        .expect("a segment is removed");
    assert!(synced < removed, "the prune first: {trace:?}");
}

/// Batches an earlier version's retention deleted beneath ops the journal holds (or a
/// first segment lost where no `log-start` file names the log's start) are damage:
/// a lone replica refuses, and no open cuts the log it kept.
#[test]
fn batches_deleted_beneath_the_journals_ops_are_damage_never_a_cut() {
    for lone in [true, false] {
        let dir = tempfile::tempdir().unwrap();
        let (start, next) = {
            let mut journal = holding_80(dir.path(), lone);
            // Retention as it was: whatever the journal holds.
            let outcome = journal.log().apply_retention(0).unwrap();
            assert!(outcome.segments_deleted > 0);
            (journal.log().start_offset(), journal.log().next_offset())
        };
        let (mut journal, recovered) =
            PartitionJournal::open(dir.path(), GROUP, TAG, small_retained(lone), 0).unwrap();
        assert!(recovered.damage.is_some(), "lone {lone}: damage");
        assert!(
            recovered
                .slots
                .iter()
                .any(|(_, s)| *s == JournalSlot::Damaged),
            "lone {lone}"
        );
        if lone {
            assert_eq!(
                (journal.log().start_offset(), journal.log().next_offset()),
                (start, next),
                "a lone replica keeps its log whole"
            );
        } else {
            assert!(journal.log().next_offset() <= next);
        }
    }
}
