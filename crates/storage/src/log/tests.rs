use std::path::Path;
use std::sync::{Arc, Barrier};

use braid_proto::{BatchBuilder, RecordBatch, ValidatedBatch};
use proptest::prelude::*;

use super::*;
use crate::config::{FsyncPolicy, LogConfig, RecoveryMode};
use crate::sync::Syncer;

mod damaged_reads;
mod index_damage;
mod misdirected;
mod missing_segment;
mod reopen_closed;

/// One record of the model: its timestamp and value.
type ModelRecord = (i64, Vec<u8>);

fn batch_of(records: &[ModelRecord]) -> ValidatedBatch {
    let mut builder = BatchBuilder::new(records[0].0);
    for (ts, value) in records {
        builder.push(Some(&value[..value.len().min(4)]), Some(value), &[], *ts);
    }
    ValidatedBatch::new(builder.finish()).unwrap()
}

fn records(count: usize, first_ts: i64, value_bytes: usize, tag: u8) -> Vec<ModelRecord> {
    (0..count)
        .map(|i| {
            (
                first_ts + i as i64,
                vec![tag.wrapping_add(i as u8); value_bytes],
            )
        })
        .collect()
}

fn small_config() -> LogConfig {
    LogConfig {
        segment_bytes_max: 4096,
        index_interval_bytes: 256,
        segment_age_ms_max: None,
        retention_ms: None,
        ..LogConfig::default()
    }
}

/// Decodes every record of a read, with its offset.
fn decode(read: &LogRead) -> Vec<(u64, i64, Vec<u8>)> {
    let mut out = Vec::new();
    let mut bytes = read.bytes();
    while !bytes.is_empty() {
        let (batch, used) = RecordBatch::validate(bytes).unwrap();
        let header = batch.header();
        for (i, record) in batch.records().enumerate() {
            let record = record.unwrap();
            out.push((
                header.base_offset as u64 + i as u64,
                header.base_timestamp + record.timestamp_delta,
                record.value.unwrap().to_vec(),
            ));
        }
        bytes = &bytes[used..];
    }
    out
}

fn read_all(log: &mut PartitionLog) -> Vec<(u64, i64, Vec<u8>)> {
    let mut out = Vec::new();
    let mut offset = log.start_offset();
    while offset < log.next_offset() {
        let read = log.read(offset, 1 << 16, u64::MAX).unwrap();
        assert!(!read.is_empty(), "read at {offset} returned nothing");
        out.extend(decode(&read).into_iter().filter(|r| r.0 >= offset));
        offset = read.next_offset;
    }
    out
}

#[test]
fn append_read_and_reopen_continue_offsets() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("p");
    let mut log = PartitionLog::open(&path, small_config(), 0).unwrap();
    let a = log.append(batch_of(&records(3, 100, 10, 1)), 0).unwrap();
    let b = log.append(batch_of(&records(2, 200, 10, 2)), 0).unwrap();
    assert_eq!((a.base_offset, a.last_offset), (0, 2));
    assert_eq!((b.base_offset, b.last_offset), (3, 4));
    let all = read_all(&mut log);
    assert_eq!(all.iter().map(|r| r.0).collect::<Vec<_>>(), [0, 1, 2, 3, 4]);
    // A read in the middle of a batch returns the whole batch.
    let read = log.read(1, 0, u64::MAX).unwrap();
    assert_eq!(
        (read.first_offset, read.next_offset, read.batch_count),
        (0, 3, 1)
    );
    // The end bound stops before uncommitted batches.
    let read = log.read(0, 1 << 20, 3).unwrap();
    assert_eq!(read.next_offset, 3);
    assert!(log.read(5, 100, u64::MAX).unwrap().is_empty());
    assert!(matches!(
        log.read(6, 100, u64::MAX),
        Err(LogError::OffsetOutOfRange { .. })
    ));
    log.close().unwrap();

    let mut log = PartitionLog::open(&path, small_config(), 0).unwrap();
    assert!(log.recovery().clean);
    assert_eq!(log.next_offset(), 5);
    let c = log.append(batch_of(&records(1, 300, 10, 3)), 0).unwrap();
    assert_eq!(c.base_offset, 5);
    drop(log); // no close: the next open recovers

    let mut log = PartitionLog::open(&path, small_config(), 0).unwrap();
    assert!(!log.recovery().clean);
    assert_eq!(log.recovery().bytes_truncated, 0);
    assert_eq!(log.next_offset(), 6);
    assert_eq!(read_all(&mut log).len(), 6);
}

#[test]
fn reset_starts_the_log_again_empty_at_an_offset_and_survives_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("p");
    let mut log = PartitionLog::open(&path, small_config(), 0).unwrap();
    for i in 0..20u8 {
        log.append(batch_of(&records(5, 100, 200, i)), 0).unwrap();
    }
    assert!(log.segment_count() > 1);
    log.reset(1_000, 0).unwrap();
    assert_eq!((log.start_offset(), log.next_offset()), (1_000, 1_000));
    assert_eq!(log.segment_count(), 1);
    assert!(log.read(1_000, 100, u64::MAX).unwrap().is_empty());
    assert!(matches!(
        log.read(5, 100, u64::MAX),
        Err(LogError::OffsetOutOfRange { .. })
    ));
    let a = log.append(batch_of(&records(3, 300, 10, 1)), 0).unwrap();
    assert_eq!(a.base_offset, 1_000);
    drop(log); // no close: the next open recovers the new segment

    let mut log = PartitionLog::open(&path, small_config(), 0).unwrap();
    assert_eq!((log.start_offset(), log.next_offset()), (1_000, 1_003));
    assert_eq!(
        read_all(&mut log).iter().map(|r| r.0).collect::<Vec<_>>(),
        [1_000, 1_001, 1_002]
    );
    // Empty and reset again, then reopened cleanly.
    log.reset(7, 0).unwrap();
    log.close().unwrap();
    let log = PartitionLog::open(&path, small_config(), 0).unwrap();
    assert_eq!((log.start_offset(), log.next_offset()), (7, 7));
    assert_eq!(log_files(&path).len(), 1);
}

#[test]
fn rolls_by_size_and_age_and_reads_across_segments() {
    let dir = tempfile::tempdir().unwrap();
    let config = LogConfig {
        segment_age_ms_max: Some(1_000),
        ..small_config()
    };
    let mut log = PartitionLog::open(dir.path(), config, 0).unwrap();
    for i in 0..20 {
        log.append(batch_of(&records(5, i * 10, 100, i as u8)), 0)
            .unwrap();
    }
    let by_size = log.segment_count();
    assert!(
        by_size > 3,
        "4 KiB segments of ~600-byte batches: {by_size}"
    );
    log.append(batch_of(&records(1, 0, 10, 0)), 5_000).unwrap();
    assert_eq!(log.segment_count(), by_size + 1, "an old segment rolls");
    let all = read_all(&mut log);
    assert_eq!(all.len(), 101);
    assert!(all.iter().enumerate().all(|(i, r)| r.0 == i as u64));
    for entry in std::fs::read_dir(dir.path()).unwrap() {
        let name = entry.unwrap().file_name().into_string().unwrap();
        assert!(
            name.len() == 24
                || name.len() == 26
                || name.len() == 30
                || name == "recovery-point"
                || name == "log-start",
            "{name}"
        );
    }
}

#[test]
fn timestamp_lookup_finds_the_first_record_at_or_after() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = PartitionLog::open(dir.path(), small_config(), 0).unwrap();
    // Timestamps go up and down, as producer clocks do.
    let stamps = [50, 10, 70, 70, 20, 90, 30, 100, 5, 120];
    for chunk in stamps.chunks(2) {
        let recs: Vec<ModelRecord> = chunk.iter().map(|&t| (t, vec![1; 300])).collect();
        log.append(batch_of(&recs), 0).unwrap();
    }
    for target in [0, 5, 11, 50, 51, 70, 71, 95, 100, 101, 120] {
        let expected = stamps.iter().position(|&t| t >= target).map(|i| i as u64);
        assert_eq!(
            log.offset_for_timestamp(target).unwrap(),
            expected,
            "target {target}"
        );
    }
    assert_eq!(log.offset_for_timestamp(121).unwrap(), None);
}

#[test]
fn truncate_drops_the_suffix_and_refuses_mid_batch() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = PartitionLog::open(dir.path(), small_config(), 0).unwrap();
    for i in 0..12 {
        log.append(batch_of(&records(4, i * 10, 150, i as u8)), 0)
            .unwrap();
    }
    assert!(log.segment_count() > 2);
    assert!(matches!(
        log.truncate(9),
        Err(LogError::NotBatchBoundary {
            batch_base: 8,
            batch_last: 11,
            ..
        })
    ));
    log.truncate(8).unwrap();
    assert_eq!(log.next_offset(), 8);
    assert_eq!(read_all(&mut log).len(), 8);
    let again = log.append(batch_of(&records(1, 0, 10, 9)), 0).unwrap();
    assert_eq!(again.base_offset, 8);
    drop(log);
    let mut log = PartitionLog::open(dir.path(), small_config(), 0).unwrap();
    assert_eq!(log.next_offset(), 9);
    assert_eq!(read_all(&mut log).last().unwrap().2, vec![9; 10]);
    log.truncate(0).unwrap();
    assert_eq!(
        (log.start_offset(), log.next_offset(), log.segment_count()),
        (0, 0, 1)
    );
}

#[test]
fn retention_deletes_whole_old_segments_by_size_and_age() {
    let dir = tempfile::tempdir().unwrap();
    let config = LogConfig {
        retention_bytes: Some(6_000),
        ..small_config()
    };
    let mut log = PartitionLog::open(dir.path(), config, 0).unwrap();
    for i in 0..30 {
        log.append(batch_of(&records(2, 1_000 + i, 200, i as u8)), 0)
            .unwrap();
    }
    let before = log.segment_count();
    let outcome = log.apply_retention(0).unwrap();
    assert!(outcome.segments_deleted > 0);
    assert_eq!(
        log.segment_count(),
        before - outcome.segments_deleted as usize
    );
    assert!(log.size_bytes() >= 6_000, "never below the limit");
    assert_eq!(outcome.start_offset, log.start_offset());
    let logs_on_disk = std::fs::read_dir(dir.path())
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .ends_with(".log")
        })
        .count();
    assert_eq!(logs_on_disk, log.segment_count());
    assert!(matches!(
        log.read(0, 10, u64::MAX),
        Err(LogError::OffsetOutOfRange { .. })
    ));
    assert_eq!(read_all(&mut log).first().unwrap().0, log.start_offset());

    // By age: every record is older than the limit; only the active segment stays.
    let dir = tempfile::tempdir().unwrap();
    let config = LogConfig {
        retention_ms: Some(500),
        ..small_config()
    };
    let mut log = PartitionLog::open(dir.path(), config, 0).unwrap();
    for i in 0..30 {
        log.append(batch_of(&records(2, 1_000 + i, 200, i as u8)), 0)
            .unwrap();
    }
    assert_eq!(log.apply_retention(1_400).unwrap().segments_deleted, 0);
    let outcome = log.apply_retention(10_000).unwrap();
    assert_eq!(log.segment_count(), 1);
    assert_eq!(outcome.start_offset, log.start_offset());
    log.release_files().unwrap();
    drop(log);
    let log = PartitionLog::open(dir.path(), small_config(), 0).unwrap();
    assert_eq!((log.segment_count(), log.next_offset()), (1, 60));
}

/// A retention age of 2^63 ms or more (`u64::MAX` is the wire's "keep forever") keeps
/// every sealed segment, whatever the clock or the records' timestamps say. Such an age
/// once wrapped negative as an `i64` and the first retention pass deleted them all.
#[test]
fn retention_ages_of_2_pow_63_and_more_keep_every_sealed_segment() {
    let now_ms = 1_700_000_000_000u64;
    for keep_ms in [1 << 63, (1 << 63) + 1, u64::MAX - 1, u64::MAX] {
        let dir = tempfile::tempdir().unwrap();
        let config = LogConfig {
            retention_ms: Some(keep_ms),
            ..small_config()
        };
        let mut log = PartitionLog::open(dir.path(), config, 0).unwrap();
        // Old records, the oldest possible timestamp among them.
        log.append(batch_of(&records(2, i64::MIN, 200, 0)), 0)
            .unwrap();
        for i in 0..30 {
            log.append(batch_of(&records(2, 1_000 + i, 200, i as u8)), 0)
                .unwrap();
        }
        let segments = log.segment_count();
        assert!(segments > 2, "the test needs sealed segments");
        for now in [0, now_ms, i64::MAX as u64, u64::MAX / 2] {
            let outcome = log.apply_retention(now).unwrap();
            assert_eq!(
                (outcome.segments_deleted, log.segment_count()),
                (0, segments),
                "retention_ms {keep_ms} at {now}"
            );
        }
        assert_eq!(read_all(&mut log).len(), 62);
    }
}

fn log_files(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "log"))
        .collect();
    files.sort();
    files
}

/// Cuts the newest `.log` file at every byte position inside its last three batches,
/// and damages the index files: reopening keeps exactly the batches written whole
/// before the cut, and appends continue without a gap.
#[test]
fn crash_cuts_at_every_position_of_the_tail_lose_only_the_torn_batch() {
    let source = tempfile::tempdir().unwrap();
    let config = LogConfig {
        segment_bytes_max: 64 * 1024,
        index_interval_bytes: 128,
        ..small_config()
    };
    let mut log = PartitionLog::open(source.path(), config, 0).unwrap();
    let mut ends = Vec::new(); // (file size after the batch, next offset after it)
    for i in 0..40 {
        let appended = log
            .append(batch_of(&records(1 + i % 3, i as i64, 40 + i, i as u8)), 0)
            .unwrap();
        ends.push((log.size_bytes(), appended.last_offset + 1));
    }
    drop(log);
    let newest = log_files(source.path()).pop().unwrap();
    let full = std::fs::read(&newest).unwrap();
    let tail_from = ends[ends.len() - 4].0 as usize;
    for cut in (tail_from..full.len()).step_by(3).chain([full.len() - 1]) {
        let dir = tempfile::tempdir().unwrap();
        for entry in std::fs::read_dir(source.path()).unwrap() {
            let entry = entry.unwrap();
            std::fs::copy(entry.path(), dir.path().join(entry.file_name())).unwrap();
        }
        let target = dir.path().join(newest.file_name().unwrap());
        std::fs::write(&target, &full[..cut]).unwrap();
        // Damage the index files too: a torn index entry and garbage in the time index.
        let index = target.with_extension("index");
        let mut bytes = std::fs::read(&index).unwrap_or_default();
        bytes.extend_from_slice(&[0xff, 0x01, 0x02]);
        std::fs::write(&index, bytes).unwrap();
        std::fs::write(target.with_extension("timeindex"), [7u8; 30]).unwrap();

        let mut log = PartitionLog::open(dir.path(), config, 0).unwrap();
        let (kept_bytes, kept_next) = ends
            .iter()
            .rev()
            .find(|(size, _)| *size as usize <= cut)
            .copied()
            .unwrap();
        assert_eq!(log.next_offset(), kept_next, "cut at {cut}");
        assert_eq!(log.size_bytes(), kept_bytes, "cut at {cut}");
        assert_eq!(log.recovery().bytes_truncated, cut as u64 - kept_bytes);
        let all = read_all(&mut log);
        assert_eq!(all.len() as u64, kept_next);
        assert!(all.iter().enumerate().all(|(i, r)| r.0 == i as u64));
        let next = log.append(batch_of(&records(1, 0, 5, 0)), 0).unwrap();
        assert_eq!(
            next.base_offset, kept_next,
            "offsets continue without a gap"
        );
        // The timestamp index was rebuilt: every record's own timestamp finds it.
        assert_eq!(log.offset_for_timestamp(0).unwrap(), Some(0));
    }
}

/// A crash leaves the newest segment's index whole again after open (not rebuilt on
/// every read), and equal to what the appends built, entry for entry.
#[test]
fn recovered_newest_segment_has_the_index_the_appends_built() {
    let dir = tempfile::tempdir().unwrap();
    let config = LogConfig {
        segment_bytes_max: 1 << 20,
        index_interval_bytes: 512,
        ..small_config()
    };
    let mut log = PartitionLog::open(dir.path(), config, 0).unwrap();
    for i in 0..200 {
        let stamp = (i * 37 % 101) as i64;
        log.append(batch_of(&records(1 + i % 4, stamp, 90, i as u8)), 0)
            .unwrap();
    }
    let built = log.segments.last().unwrap().index.clone().unwrap();
    assert!(built.offsets.len() > 20 && built.times.len() > 3);
    drop(log);
    let log = PartitionLog::open(dir.path(), config, 0).unwrap();
    assert!(!log.recovery().clean);
    let recovered = log.segments.last().unwrap().index.clone().unwrap();
    assert_eq!(recovered.offsets, built.offsets);
    assert_eq!(recovered.times, built.times);
    log.close().unwrap();
    // A clean open loads the same entries from the files.
    let mut log = PartitionLog::open(dir.path(), config, 0).unwrap();
    assert!(log.recovery().clean);
    log.ensure_index(0).unwrap();
    let loaded = log.segments.last().unwrap().index.clone().unwrap();
    assert_eq!(loaded.offsets, built.offsets);
    assert_eq!(loaded.times, built.times);
}

/// A log of [`small_config`] in `dir` holding `count` batches of three records, batch
/// `i`'s first timestamp `first_ts(i)` (its records one ms apart): a few segments.
fn log_of_batches(dir: &Path, count: i64, first_ts: impl Fn(i64) -> i64) -> PartitionLog {
    let mut log = PartitionLog::open(dir, small_config(), 0).unwrap();
    for i in 0..count {
        log.append(batch_of(&records(3, first_ts(i), 60, i as u8)), 0)
            .unwrap();
    }
    log
}

#[test]
fn damaged_index_of_a_sealed_segment_is_rebuilt() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = log_of_batches(dir.path(), 30, |i| i * 3);
    let expected = read_all(&mut log);
    log.close().unwrap();
    let first = &log_files(dir.path())[0];
    let index = first.with_extension("index");
    assert!(std::fs::metadata(&index).unwrap().len() > 8);
    // Plausible-looking but wrong: points into the middle of a batch.
    std::fs::write(&index, [0, 0, 0, 3, 0, 0, 0, 10]).unwrap();
    std::fs::remove_file(first.with_extension("timeindex")).unwrap();
    let mut log = PartitionLog::open(dir.path(), small_config(), 0).unwrap();
    assert_eq!(read_all(&mut log), expected);
    assert!(log.recovery().indexes_rebuilt >= 1);
    assert_eq!(log.offset_for_timestamp(4).unwrap(), Some(4));
}

/// Appends five batches of two records, syncing after batch `sync_after` if given;
/// returns where each batch starts.
fn five_batches(log: &mut PartitionLog, sync_after: Option<i64>) -> Vec<u64> {
    let mut positions = Vec::new();
    for i in 0..5 {
        positions.push(log.size_bytes());
        log.append(batch_of(&records(2, i, 50, i as u8)), 0)
            .unwrap();
        if sync_after == Some(i) {
            log.sync().unwrap();
        }
    }
    positions
}

/// Unsynced writes reach the disk in any order on a power cut: a zero page (an
/// unwritten extent) above the last sync followed by a batch that did reach the disk
/// used to be classed as damage in the middle, and the node would not start. Above the
/// recovery point it is a torn tail: cut, with every synced batch kept.
#[test]
fn a_zero_page_above_the_recovery_point_is_a_torn_tail() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = PartitionLog::open(dir.path(), small_config(), 0).unwrap();
    // Batches 0 and 1 acknowledged (synced), 2 to 4 not.
    let positions = five_batches(&mut log, Some(1));
    drop(log);
    let file = log_files(dir.path()).pop().unwrap();
    let mut bytes = std::fs::read(&file).unwrap();
    // Batch 2 never reached the disk (zeros); batches 3 and 4 did.
    let (from, to) = (positions[2] as usize, positions[3] as usize);
    bytes[from..to].fill(0);
    std::fs::write(&file, &bytes).unwrap();
    let mut log = PartitionLog::open(dir.path(), small_config(), 0).unwrap();
    assert_eq!(log.recovery().unsynced_damage_cut_at, Some(from as u64));
    assert_eq!(
        log.next_offset(),
        4,
        "the synced batches, and only the cut after"
    );
    assert_eq!(read_all(&mut log).len(), 4);
    // The same damage below the recovery point (an intact batch after it) is refused.
    log.append(batch_of(&records(2, 9, 50, 9)), 0).unwrap();
    log.append(batch_of(&records(2, 11, 50, 11)), 0).unwrap();
    log.sync().unwrap();
    drop(log);
    let mut bytes = std::fs::read(&file).unwrap();
    bytes[from..from + 40].fill(0);
    std::fs::write(&file, &bytes).unwrap();
    assert!(matches!(
        PartitionLog::open(dir.path(), small_config(), 0),
        Err(LogError::Corrupt { .. })
    ));
}

#[test]
fn corruption_in_the_middle_names_file_and_position() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = PartitionLog::open(dir.path(), small_config(), 0).unwrap();
    let positions = five_batches(&mut log, None);
    // Synced: damage below the recovery point is a failing disk, not a power cut.
    log.sync().unwrap();
    drop(log);
    let file = log_files(dir.path()).pop().unwrap();
    let mut bytes = std::fs::read(&file).unwrap();
    let damaged_at = positions[2] as usize;
    bytes[damaged_at + 70] ^= 0xff; // inside batch 2's records
    std::fs::write(&file, &bytes).unwrap();

    let err = PartitionLog::open(dir.path(), small_config(), 0).unwrap_err();
    match &err {
        LogError::Corrupt { path, position, .. } => {
            assert_eq!(path, &file);
            assert_eq!(*position, damaged_at as u64);
        }
        other => panic!("expected Corrupt, got {other}"),
    }
    let text = err.to_string();
    assert!(
        text.contains(&file.display().to_string()) && text.contains(&damaged_at.to_string()),
        "{text}"
    );
    assert_eq!(std::fs::read(&file).unwrap(), bytes, "nothing was cut");

    // Opened to be read up to the damage: batches 0 and 1, nothing cut, no write.
    let reading = LogConfig {
        recovery: RecoveryMode::ReadToDamage,
        ..small_config()
    };
    let mut log = PartitionLog::open(dir.path(), reading, 0).unwrap();
    assert_eq!(log.next_offset(), 4);
    assert_eq!(read_all(&mut log).len(), 4);
    assert!(log.append(batch_of(&records(1, 9, 10, 9)), 0).is_err());
    drop(log);
    assert_eq!(std::fs::read(&file).unwrap(), bytes, "nothing was cut");

    // An operator may choose to cut at the damage.
    let config = LogConfig {
        recovery: RecoveryMode::TruncateAtDamage,
        ..small_config()
    };
    let log = PartitionLog::open(dir.path(), config, 0).unwrap();
    assert_eq!(log.next_offset(), 4);
    assert_eq!(log.recovery().damage_cut_at, Some(damaged_at as u64));
}

#[test]
fn group_commit_shares_one_fsync_among_waiting_appends() {
    let dir = tempfile::tempdir().unwrap();
    let config = LogConfig {
        fsync: FsyncPolicy::Always,
        ..LogConfig::default()
    };
    let mut log = PartitionLog::open(dir.path(), config, 0).unwrap();
    let syncer = Syncer::start("test-sync").unwrap();
    let gate = Arc::new(Barrier::new(2));
    // Hold the sync thread inside the first callback while 50 more appends queue.
    log.append(batch_of(&records(1, 0, 10, 0)), 0).unwrap();
    let first = log.sync_request().unwrap().unwrap();
    let held = Arc::clone(&gate);
    let (entered_tx, entered_rx) = std::sync::mpsc::channel();
    syncer.submit(first, move |_, result| {
        result.unwrap();
        entered_tx.send(()).unwrap();
        held.wait();
    });
    entered_rx.recv().unwrap();
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    for i in 0..50 {
        log.append(batch_of(&records(1, 0, 10, i)), 0).unwrap();
        let request = log.sync_request().unwrap().unwrap();
        let tx = done_tx.clone();
        syncer.submit(request, move |request, result| {
            tx.send((request, result)).unwrap();
        });
    }
    assert!(log.sync_due(0));
    gate.wait();
    for _ in 0..50 {
        let (request, result) = done_rx.recv().unwrap();
        log.on_synced(&request, result);
    }
    assert_eq!(syncer.stats().requests(), 51);
    assert_eq!(
        syncer.stats().fsyncs(),
        2,
        "50 queued requests share one fsync"
    );
    assert_eq!(log.durable_offset(), 51);
    assert!(!log.sync_due(0));
}

#[test]
fn interval_policy_asks_for_a_sync_when_due() {
    let dir = tempfile::tempdir().unwrap();
    let config = LogConfig {
        fsync: FsyncPolicy::Interval { interval_ms: 100 },
        ..small_config()
    };
    let mut log = PartitionLog::open(dir.path(), config, 0).unwrap();
    assert!(!log.sync_due(1_000));
    log.append(batch_of(&records(1, 0, 10, 0)), 1_000).unwrap();
    assert!(!log.sync_due(1_050));
    assert!(log.sync_due(1_100));
    log.sync().unwrap();
    assert_eq!(log.durable_offset(), 1);
    assert!(!log.sync_due(5_000));
}

#[test]
fn failed_sync_poisons_the_log() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = PartitionLog::open(dir.path(), small_config(), 0).unwrap();
    log.append(batch_of(&records(1, 0, 10, 0)), 0).unwrap();
    let request = log.sync_request().unwrap().unwrap();
    let failure = crate::SyncError::from(std::io::Error::other("EIO"));
    log.on_synced(&request, Err(failure));
    assert_eq!(log.durable_offset(), 0);
    let refused = log.append(batch_of(&records(1, 0, 10, 0)), 0);
    assert!(matches!(refused, Err(LogError::Poisoned { .. })));
    assert!(log.read(0, 100, u64::MAX).is_ok(), "reads still work");
}

#[test]
fn a_sync_from_before_a_truncation_does_not_cover_later_appends() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = PartitionLog::open(dir.path(), small_config(), 0).unwrap();
    log.append(batch_of(&records(1, 0, 10, 0)), 0).unwrap();
    log.sync().unwrap();
    log.append(batch_of(&records(1, 0, 10, 0)), 0).unwrap();
    let stale = log.sync_request().unwrap().unwrap();
    log.truncate(1).unwrap();
    log.append(batch_of(&records(1, 0, 10, 0)), 0).unwrap();
    log.on_synced(&stale, Ok(()));
    assert_eq!(log.durable_offset(), 1);
}

#[test]
fn released_log_holds_no_files_and_works_after() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = PartitionLog::open(dir.path(), small_config(), 0).unwrap();
    for i in 0..20 {
        log.append(batch_of(&records(3, i, 100, i as u8)), 0)
            .unwrap();
    }
    let before = read_all(&mut log);
    assert!(log.open_files() > 0);
    log.release_files().unwrap();
    assert_eq!(log.open_files(), 0);
    assert!(
        log.heap_bytes() < 1_000,
        "idle log holds {} heap bytes",
        log.heap_bytes()
    );
    assert_eq!(read_all(&mut log), before);
    let next = log.append(batch_of(&records(1, 0, 10, 0)), 0).unwrap();
    assert_eq!(next.base_offset, 60);
    assert_eq!(log.offset_for_timestamp(19).unwrap(), Some(53));
}

#[test]
fn oversized_batch_and_bad_config_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut log = PartitionLog::open(dir.path(), small_config(), 0).unwrap();
    let big = batch_of(&records(1, 0, 5_000, 0));
    assert!(matches!(
        log.append(big, 0),
        Err(LogError::BatchTooLarge { .. })
    ));
    let bad = LogConfig {
        index_interval_bytes: 0,
        ..small_config()
    };
    assert!(matches!(
        PartitionLog::open(dir.path(), bad, 0),
        Err(LogError::Config(_))
    ));
}

// ---- the model test -------------------------------------------------------------

#[derive(Debug, Clone)]
enum Op {
    Append {
        count: usize,
        value_bytes: usize,
        ts: Vec<i64>,
    },
    Read {
        at: usize,
        budget: u32,
    },
    ReadBounded {
        at: usize,
        end: usize,
    },
    TimeLookup {
        ts: i64,
    },
    Truncate {
        batch: usize,
    },
    Roll,
    Release,
    Reopen {
        clean: bool,
    },
    Retention,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (1usize..6, 0usize..300, proptest::collection::vec(0i64..1_000, 6))
            .prop_map(|(count, value_bytes, ts)| Op::Append { count, value_bytes, ts }),
        3 => (any::<usize>(), 0u32..3_000).prop_map(|(at, budget)| Op::Read { at, budget }),
        1 => (any::<usize>(), any::<usize>()).prop_map(|(at, end)| Op::ReadBounded { at, end }),
        2 => (-10i64..1_100).prop_map(|ts| Op::TimeLookup { ts }),
        1 => any::<usize>().prop_map(|batch| Op::Truncate { batch }),
        1 => Just(Op::Roll),
        1 => Just(Op::Release),
        1 => any::<bool>().prop_map(|clean| Op::Reopen { clean }),
        1 => Just(Op::Retention),
    ]
}

/// The model: batches in order, each a list of (offset, timestamp, value).
#[derive(Debug, Default)]
struct Model {
    batches: Vec<Vec<(u64, i64, Vec<u8>)>>,
    start: u64,
}

impl Model {
    fn next(&self) -> u64 {
        self.batches
            .last()
            .map_or(self.start, |b| b.last().unwrap().0 + 1)
    }

    fn records_from(&self, offset: u64) -> impl Iterator<Item = &(u64, i64, Vec<u8>)> {
        self.batches.iter().flatten().filter(move |r| r.0 >= offset)
    }
}

fn check_read(
    model: &Model,
    read: &LogRead,
    from: u64,
    budget: u32,
    end: u64,
) -> Result<(), TestCaseError> {
    let got = decode(read);
    let wanted: Vec<_> = model
        .records_from(read.first_offset)
        .filter(|r| r.0 < read.next_offset)
        .cloned()
        .collect();
    prop_assert_eq!(&got, &wanted);
    if from < end.min(model.next()) {
        prop_assert!(!read.is_empty());
        prop_assert!(read.first_offset <= from && from < read.next_offset);
        prop_assert!(read.batch_count == 1 || read.bytes().len() <= budget as usize);
        prop_assert!(read.next_offset <= end.max(read.first_offset + 1) || read.batch_count == 1);
    } else {
        prop_assert!(read.is_empty());
    }
    Ok(())
}

fn run_model(ops: Vec<Op>, config: LogConfig) -> Result<(), TestCaseError> {
    let dir = tempfile::tempdir().unwrap();
    let mut log = Some(PartitionLog::open(dir.path(), config, 0).unwrap());
    let mut model = Model::default();
    for op in ops {
        let current = log.as_mut().unwrap();
        match op {
            Op::Append {
                count,
                value_bytes,
                ts,
            } => {
                let recs: Vec<ModelRecord> = (0..count)
                    .map(|i| (ts[i], vec![(model.next() + i as u64) as u8; value_bytes]))
                    .collect();
                let appended = current.append(batch_of(&recs), 0).unwrap();
                prop_assert_eq!(appended.base_offset, model.next());
                model.batches.push(
                    recs.into_iter()
                        .enumerate()
                        .map(|(i, (t, v))| (appended.base_offset + i as u64, t, v))
                        .collect(),
                );
            }
            Op::Read { at, budget } => {
                let span = model.next() - model.start + 1;
                let from = model.start + (at as u64 % span);
                let read = current.read(from, budget, u64::MAX).unwrap();
                check_read(&model, &read, from, budget, u64::MAX)?;
            }
            Op::ReadBounded { at, end } => {
                let span = model.next() - model.start + 1;
                let from = model.start + (at as u64 % span);
                let end = model.start + (end as u64 % span);
                let read = current.read(from, 1 << 20, end).unwrap();
                let got = decode(&read);
                if from >= end {
                    prop_assert!(read.is_empty());
                } else {
                    // A prefix (one segment's worth) of the batches that hold `from` or
                    // come after it and start before `end`.
                    let wanted: Vec<_> = model
                        .batches
                        .iter()
                        .filter(|b| b.last().unwrap().0 >= from && b[0].0 < end)
                        .take(read.batch_count as usize)
                        .flatten()
                        .cloned()
                        .collect();
                    prop_assert!(read.batch_count >= 1);
                    prop_assert_eq!(got, wanted);
                }
            }
            Op::TimeLookup { ts } => {
                let expected = model
                    .records_from(model.start)
                    .find(|r| r.1 >= ts)
                    .map(|r| r.0);
                prop_assert_eq!(current.offset_for_timestamp(ts).unwrap(), expected);
            }
            Op::Truncate { batch } => {
                if !model.batches.is_empty() {
                    let keep = batch % (model.batches.len() + 1);
                    let offset = model.batches.get(keep).map_or(model.next(), |b| b[0].0);
                    current.truncate(offset).unwrap();
                    model.batches.truncate(keep);
                    prop_assert_eq!(current.next_offset(), model.next());
                }
            }
            Op::Roll => current.roll(0).unwrap(),
            Op::Release => current.release_files().unwrap(),
            Op::Reopen { clean } => {
                let old = log.take().unwrap();
                if clean {
                    old.close().unwrap();
                } else {
                    drop(old);
                }
                let reopened = PartitionLog::open(dir.path(), config, 0).unwrap();
                // A log dropped without close is still clean if nothing was written
                // since it was opened from a clean close.
                prop_assert!(!clean || reopened.recovery().clean);
                prop_assert_eq!(reopened.recovery().bytes_truncated, 0);
                log = Some(reopened);
            }
            Op::Retention => {
                let outcome = current.apply_retention(0).unwrap();
                let start = outcome.start_offset;
                model.batches.retain(|b| b[0].0 >= start);
                model.start = start;
                prop_assert!(model.batches.first().is_none_or(|b| b[0].0 == start));
            }
        }
        let current = log.as_mut().unwrap();
        prop_assert_eq!(current.next_offset(), model.next());
        prop_assert_eq!(current.start_offset(), model.start);
    }
    let current = log.as_mut().unwrap();
    let all = read_all(current);
    let wanted: Vec<_> = model.records_from(model.start).cloned().collect();
    prop_assert_eq!(all, wanted);
    Ok(())
}

proptest! {
    // PROPTEST_CASES=5000 runs a longer search; CI keeps the default short.
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(64),
        ..ProptestConfig::default()
    })]

    #[test]
    fn log_matches_model(ops in proptest::collection::vec(op(), 1..60),
                         interval in 16u32..600,
                         retention in proptest::option::of(2_000u64..10_000)) {
        let config = LogConfig {
            segment_bytes_max: 2048,
            index_interval_bytes: interval,
            retention_bytes: retention,
            ..small_config()
        };
        run_model(ops, config)?;
    }
}

#[test]
fn write_behind_and_a_dropped_tail_lose_nothing() {
    // Windows of 1 KiB and a 2 KiB cached tail: nearly every append starts write-back
    // and drops pages behind it; everything still reads back, before and after reopen.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("p");
    let config = LogConfig {
        segment_bytes_max: 64 << 10,
        write_behind_bytes: 1024,
        cached_tail_bytes: Some(2048),
        ..small_config()
    };
    let mut log = PartitionLog::open(&path, config, 0).unwrap();
    let mut expected = Vec::new();
    for i in 0..200u8 {
        let batch = records(3, i64::from(i) * 10, 100, i);
        expected.extend(batch.iter().map(|r| r.1.clone()));
        log.append(batch_of(&batch), 0).unwrap();
        if i == 120 {
            // A truncation in the middle starts the window over; appends continue.
            log.truncate(300).unwrap();
            expected.truncate(300);
        }
    }
    let values = |log: &mut PartitionLog| -> Vec<Vec<u8>> {
        read_all(log).into_iter().map(|r| r.2).collect()
    };
    assert_eq!(values(&mut log), expected);
    log.close().unwrap();
    let mut log = PartitionLog::open(&path, config, 0).unwrap();
    assert_eq!(values(&mut log), expected);
}

/// Damaged batches kept out of reads and repaired from a replica's copy.
mod repair;
