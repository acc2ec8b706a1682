//! A segment file gone from the middle of a log (deleted, or its directory entry lost):
//! never a log that skips from one segment's end to a later segment's start.

use super::*;

/// A closed log of several small segments; their base offsets and its end.
fn segmented(dir: &Path, config: LogConfig) -> (Vec<u64>, u64) {
    let mut log = PartitionLog::open(dir, config, 0).unwrap();
    for i in 0..80 {
        log.append(batch_of(&records(2, i, 50, i as u8)), 0)
            .unwrap();
    }
    log.sync().unwrap();
    let bases: Vec<u64> = log_files(dir)
        .iter()
        .filter_map(|p| p.file_stem()?.to_str()?.parse().ok())
        .collect();
    assert!(bases.len() >= 3, "{bases:?}");
    let end = log.next_offset();
    log.close().unwrap();
    (bases, end)
}

#[test]
fn a_missing_segment_is_refused_by_a_strict_open_and_cut_by_a_replicas() {
    let dir = tempfile::tempdir().unwrap();
    let (bases, end) = segmented(dir.path(), small_config());
    std::fs::remove_file(crate::files::log_path(dir.path(), bases[1])).unwrap();
    let expected_end = bases[1];
    match PartitionLog::open(dir.path(), small_config(), 0) {
        Err(LogError::Corrupt {
            corruption: crate::Corruption::MissingSegment { from, to },
            ..
        }) => assert_eq!((from, to), (expected_end, bases[2])),
        other => panic!("{:?}", other.map(|l| l.next_offset())),
    }
    // Refused, nothing cut: the segments after the gap are still there.
    assert!(crate::files::log_path(dir.path(), bases[2]).exists());
    let replica = LogConfig {
        recovery: RecoveryMode::TruncateAtDamage,
        ..small_config()
    };
    let mut log = PartitionLog::open(dir.path(), replica, 0).unwrap();
    assert_eq!(
        log.next_offset(),
        expected_end,
        "cut at the gap (was {end})"
    );
    assert_eq!(log.recovery().damage_cut_at, Some(expected_end));
    let read = decode(&log.read(0, 1 << 20, u64::MAX).unwrap());
    assert_eq!(read.last().map(|r| r.0 + 1), Some(expected_end));
    drop(log);
    let log = PartitionLog::open(dir.path(), small_config(), 0).unwrap();
    assert_eq!(log.next_offset(), expected_end, "the cut is durable");
}

#[test]
fn a_read_never_skips_a_missing_segment() {
    let dir = tempfile::tempdir().unwrap();
    let (bases, _) = segmented(dir.path(), small_config());
    std::fs::remove_file(crate::files::log_path(dir.path(), bases[1])).unwrap();
    let opened = PartitionLog::open(dir.path(), small_config(), 0);
    let mut log = match opened {
        // Refused at open: the gap is found there.
        Err(LogError::Corrupt { .. }) => return,
        Err(other) => panic!("{other}"),
        Ok(log) => log,
    };
    for from in [bases[1], bases[1] + 1, bases[2] - 1] {
        match log.read(from, 1 << 16, u64::MAX) {
            Err(LogError::Corrupt { .. }) => {}
            Ok(read) => {
                let first = decode(&read).first().map(|r| r.0);
                panic!("a read from {from} in the gap gave {first:?}");
            }
            Err(other) => panic!("{other}"),
        }
    }
}

/// The first segment gone, or every segment: the log's start on disk names them.
#[test]
fn segments_gone_from_the_start_are_refused_or_started_again_never_taken_for_retention() {
    type Gone = fn(&Path, &[u64]);
    let cases: [(&str, Gone); 2] = [
        ("the first segment", |dir, bases| {
            std::fs::remove_file(crate::files::log_path(dir, bases[0])).unwrap()
        }),
        ("every segment", |dir, bases| {
            for base in bases {
                std::fs::remove_file(crate::files::log_path(dir, *base)).unwrap();
            }
        }),
    ];
    for (what, gone) in cases {
        let dir = tempfile::tempdir().unwrap();
        let (bases, _) = segmented(dir.path(), small_config());
        gone(dir.path(), &bases);
        match PartitionLog::open(dir.path(), small_config(), 0) {
            Err(LogError::Corrupt {
                corruption: crate::Corruption::MissingSegment { from: 0, .. },
                ..
            }) => {}
            other => panic!("{what}: {:?}", other.map(|l| l.start_offset())),
        }
        let replica = LogConfig {
            recovery: RecoveryMode::TruncateAtDamage,
            ..small_config()
        };
        let log = PartitionLog::open(dir.path(), replica, 0).unwrap();
        assert_eq!(
            (log.start_offset(), log.next_offset()),
            (0, 0),
            "{what}: started again at its start, for peers to fill"
        );
        assert_eq!(log.recovery().damage_cut_at, Some(0), "{what}");
    }
}

#[test]
fn retention_moves_the_start_and_the_next_open_takes_it() {
    let dir = tempfile::tempdir().unwrap();
    let config = LogConfig {
        retention_bytes: Some(1),
        ..small_config()
    };
    let (bases, end) = segmented(dir.path(), config);
    let mut log = PartitionLog::open(dir.path(), config, 0).unwrap();
    let outcome = log.apply_retention(0).unwrap();
    assert!(outcome.segments_deleted > 0);
    let start = log.start_offset();
    assert!(start > bases[0]);
    drop(log);
    let log = PartitionLog::open(dir.path(), config, 0).unwrap();
    assert_eq!((log.start_offset(), log.next_offset()), (start, end));
    assert_eq!(log.recovery().damage_cut_at, None);
}

/// A log opened to be read up to its damage (a partition refused on a single node)
/// ends at the gap in memory, serves every record before it, takes no write, and cuts
/// nothing: a strict open afterwards finds the same gap.
#[test]
fn a_read_to_damage_open_serves_up_to_the_gap_and_cuts_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (bases, _) = segmented(dir.path(), small_config());
    std::fs::remove_file(crate::files::log_path(dir.path(), bases[1])).unwrap();
    let files_before = log_files(dir.path());
    let reading = LogConfig {
        recovery: RecoveryMode::ReadToDamage,
        ..small_config()
    };
    let mut log = PartitionLog::open(dir.path(), reading, 0).unwrap();
    assert_eq!(log.next_offset(), bases[1], "ends at the gap");
    assert_eq!(log.recovery().damage_cut_at, Some(bases[1]));
    let mut read = Vec::new();
    let mut at = 0;
    while at < log.next_offset() {
        let records = decode(&log.read(at, 1 << 20, u64::MAX).unwrap());
        at = records.last().unwrap().0 + 1;
        read.extend(records);
    }
    assert_eq!(read.len() as u64, bases[1], "every record before the gap");
    assert!(log.append(batch_of(&records(1, 9, 10, 9)), 0).is_err());
    drop(log);
    assert_eq!(log_files(dir.path()), files_before, "nothing cut");
    assert!(matches!(
        PartitionLog::open(dir.path(), small_config(), 0),
        Err(LogError::Corrupt {
            corruption: crate::Corruption::MissingSegment { .. },
            ..
        })
    ));
}
