//! The fault-injection harness: a workload that appends, syncs, rolls, truncates,
//! applies retention and closes, run once per disk operation it performs with that
//! one operation failing (EIO, then ENOSPC). After the failure the log must refuse to
//! claim durability it has not earned, and a reopen (the page cache kept, as after a
//! crash of the process) must hold every acknowledged record at its offset.
//!
//! CI runs every operation of a small workload; `STORAGE_FAULTS_ROUNDS=N` runs N
//! workloads of other shapes (seeds), each with every operation failed in turn.

use std::io::ErrorKind;

use super::*;
use crate::config::{FsyncPolicy, LogConfig};
use crate::disk::hook::{self, Plan};
use braid_proto::{BatchBuilder, RecordBatch, ValidatedBatch};

fn config() -> LogConfig {
    LogConfig {
        segment_bytes_max: 1024,
        index_interval_bytes: 64,
        segment_age_ms_max: None,
        retention_ms: None,
        retention_bytes: Some(2048),
        fsync: FsyncPolicy::Always,
        ..LogConfig::default()
    }
}

fn batch(value: u32) -> ValidatedBatch {
    let mut builder = BatchBuilder::new(1_000);
    builder.push(Some(b"k"), Some(&value.to_be_bytes()), &[], 1_000);
    ValidatedBatch::new(builder.finish()).unwrap()
}

/// What the workload was told, as a client would see it.
#[derive(Debug, Default)]
struct Model {
    /// Value of each offset from 0, as appended (and not truncated away).
    values: Vec<u32>,
    /// Offsets below this were acknowledged durable (a sync returned Ok after them).
    acked: u64,
    /// The first error, and the op it came from.
    failure: Option<(String, LogError)>,
}

/// A tiny PRNG so workloads vary by seed without a dependency.
struct Rng(u64);
impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n.max(1)
    }
}

/// Runs the workload on `dir` until its first error; returns what was acknowledged.
fn workload(dir: &Path, seed: u64, log: &mut Option<PartitionLog>) -> Model {
    let mut model = Model::default();
    let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let opened = PartitionLog::open(dir, config(), 1_000);
    let mut current = match opened {
        Ok(current) => current,
        Err(err) => {
            model.failure = Some(("open".into(), err));
            return model;
        }
    };
    let steps = 30 + rng.below(20);
    for step in 0..steps {
        let choice = rng.below(10);
        let result = if choice < 6 {
            let value = (seed as u32) << 16 | step as u32;
            current
                .append(batch(value), 1_000 + step)
                .map(|appended| {
                    assert_eq!(appended.base_offset, model.values.len() as u64);
                    model.values.push(value);
                })
                .map_err(|e| ("append", e))
        } else if choice < 8 {
            current
                .sync()
                .map(|()| model.acked = current.durable_offset())
                .map_err(|e| ("sync", e))
        } else if choice == 8 && current.next_offset() > current.start_offset() + 2 {
            let to = current.next_offset() - 1 - rng.below(2);
            // Asked to go, the records from `to` are no longer promised, whether the
            // cut succeeds or not; any of them found later must still be the original.
            model.acked = model.acked.min(to);
            current
                .truncate(to)
                .map(|()| model.values.truncate(to as usize))
                .map_err(|e| ("truncate", e))
        } else {
            current
                .apply_retention(1_000 + step)
                .map(|_| ())
                .map_err(|e| ("retention", e))
        };
        if let Err((what, err)) = result {
            model.failure = Some((what.into(), err));
            break;
        }
        // No acknowledgement runs ahead of the syncs that made it true.
        assert!(current.durable_offset() <= current.next_offset());
    }
    if model.failure.is_none() {
        let closing = current.close();
        if let Err(err) = closing {
            model.failure = Some(("close".into(), err));
        }
        *log = None;
    } else {
        // After a failure that poisoned the log it claims nothing new: a sync is
        // refused and `durable_offset` does not move. A failure that did not poison
        // (a write undone) leaves a log whose syncs work.
        let durable = current.durable_offset();
        let synced = current.sync();
        if current.poisoned().is_some() {
            assert!(synced.is_err(), "a poisoned log synced");
            assert_eq!(
                current.durable_offset(),
                durable,
                "durable moved after a failure"
            );
            assert!(matches!(
                current.append(batch(0), 0),
                Err(LogError::Poisoned { .. })
            ));
        } else if synced.is_ok() {
            assert_eq!(current.durable_offset(), current.next_offset());
            model.acked = current.durable_offset();
        }
        *log = Some(current);
    }
    model
}

/// Every record of a log from its start: (offset, the first four bytes of its value).
pub(super) fn read_all(log: &mut PartitionLog) -> Vec<(u64, u32)> {
    let mut out = Vec::new();
    let mut at = log.start_offset();
    while at < log.next_offset() {
        let read = log.read(at, 1 << 20, u64::MAX).unwrap();
        let mut bytes = read.bytes();
        assert!(!bytes.is_empty(), "a read at {at} returned nothing");
        while !bytes.is_empty() {
            let (batch, used) = RecordBatch::validate(bytes).unwrap();
            let base = batch.header().base_offset as u64;
            for (i, record) in batch.records().enumerate() {
                let value = record.unwrap().value.unwrap();
                out.push((
                    base + i as u64,
                    u32::from_be_bytes(value[..4].try_into().unwrap()),
                ));
            }
            bytes = &bytes[used..];
        }
        at = read.next_offset;
    }
    out
}

/// Runs the workload of `seed` once per disk operation, failing that one.
fn every_fault_of(seed: u64, kind: ErrorKind) -> usize {
    // A clean run counts the operations.
    let dir = tempfile::tempdir().unwrap();
    hook::install(Plan::default());
    let mut log = None;
    let clean = workload(dir.path(), seed, &mut log);
    assert!(clean.failure.is_none(), "{:?}", clean.failure);
    let operations = hook::take().unwrap().seen;
    for at in 0..operations {
        let dir = tempfile::tempdir().unwrap();
        hook::install(Plan {
            fail_at: Some((at, kind)),
            ..Plan::default()
        });
        let mut log = None;
        let model = workload(dir.path(), seed, &mut log);
        let plan = hook::take().unwrap();
        let context = format!(
            "seed {seed}, operation {at} of {operations} ({:?}) failed with {kind:?}; first error {:?}",
            plan.failed, model.failure
        );
        drop(log); // a crash of the process: no close
        let mut reopened = PartitionLog::open(dir.path(), config(), 9_000)
            .unwrap_or_else(|err| panic!("{context}: reopen refused: {err}"));
        let found = read_all(&mut reopened);
        let start = reopened.start_offset();
        for (offset, value) in &found {
            if let Some(expected) = model.values.get(*offset as usize) {
                assert_eq!(value, expected, "{context}: offset {offset}");
            }
        }
        // Every acknowledged record not deleted by retention is there.
        for offset in start..model.acked {
            assert!(
                found.iter().any(|(o, _)| *o == offset),
                "{context}: acknowledged offset {offset} lost (found up to {:?})",
                found.last()
            );
        }
        // Offsets are dense from the start.
        for (i, (offset, _)) in found.iter().enumerate() {
            assert_eq!(*offset, start + i as u64, "{context}: a hole");
        }
        // And the reopened log takes writes again (a segment file left by a failed
        // roll must not make every later roll fail).
        let next = reopened.next_offset();
        for value in 0..30 {
            let appended = reopened
                .append(batch(value), 9_000)
                .unwrap_or_else(|err| panic!("{context}: append after reopen: {err}"));
            assert_eq!(appended.base_offset, next + u64::from(value));
        }
        reopened
            .sync()
            .unwrap_or_else(|err| panic!("{context}: sync after reopen: {err}"));
    }
    operations as usize
}

#[test]
fn every_failed_disk_operation_keeps_what_was_acknowledged() {
    let mut total = 0;
    for seed in 1..=3 {
        total += every_fault_of(seed, ErrorKind::Other);
        total += every_fault_of(seed, ErrorKind::StorageFull);
    }
    assert!(total > 200, "the workloads reached the disk {total} times");
}

/// The long run: `STORAGE_FAULTS_ROUNDS=200 cargo test -p braid-storage --release
/// many_workloads -- --ignored`.
#[test]
#[ignore = "long: run by scripts/storage-faults.sh"]
fn many_workloads_with_every_operation_failed() {
    let rounds: u64 = std::env::var("STORAGE_FAULTS_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(50);
    let mut total = 0;
    for seed in 100..100 + rounds {
        total += every_fault_of(seed, ErrorKind::Other);
        total += every_fault_of(seed, ErrorKind::StorageFull);
    }
    eprintln!("{rounds} workloads, {total} failed operations, every one recovered");
}

/// The fsyncgate case by name: a failed sync while sealing a segment at roll used to
/// leave the log writable; the next append retried the roll, its second sync reported
/// success, and everything up to the new base was marked durable.
#[test]
fn a_failed_sync_at_roll_poisons_and_nothing_becomes_durable() {
    for file in [".log", ".index", ".timeindex"] {
        let dir = tempfile::tempdir().unwrap();
        let mut config = config();
        config.fsync = FsyncPolicy::Never;
        config.retention_bytes = None;
        let mut log = PartitionLog::open(dir.path(), config, 0).unwrap();
        for value in 0..10 {
            log.append(batch(value), 0).unwrap();
        }
        let durable = log.durable_offset();
        hook::install(Plan {
            fail_first: Some((crate::disk::DiskOp::Sync, file, ErrorKind::Other)),
            ..Plan::default()
        });
        let rolled = log.roll(0);
        let plan = hook::take().unwrap();
        assert_eq!(plan.failed.len(), 1, "{file}: the sync failed");
        assert!(rolled.is_err(), "{file}");
        // Without the fault now, nothing may retry the sync and call it a success.
        assert!(log.poisoned().is_some(), "{file}");
        assert!(matches!(
            log.append(batch(99), 0),
            Err(LogError::Poisoned { .. })
        ));
        assert!(matches!(log.roll(0), Err(LogError::Poisoned { .. })));
        assert!(matches!(log.sync(), Err(LogError::Poisoned { .. })));
        assert_eq!(
            log.durable_offset(),
            durable,
            "{file}: nothing became durable"
        );
        drop(log);
        // A reopen verifies and keeps the ten batches.
        let mut log = PartitionLog::open(dir.path(), config, 0).unwrap();
        assert_eq!(read_all(&mut log).len(), 10, "{file}");
        log.append(batch(10), 0).unwrap();
    }
}

/// A failed index write during an append used to return an error for a batch that
/// stayed in the log and became visible. The append succeeds (the batch is there) and
/// the log is poisoned; the index is rebuilt on reopen.
#[test]
fn a_failed_index_write_does_not_fail_an_append_that_landed() {
    let dir = tempfile::tempdir().unwrap();
    // Segments large enough that no roll comes first: the failing write is the
    // append's own index flush.
    let config = LogConfig {
        segment_bytes_max: 1 << 20,
        ..config()
    };
    let mut log = PartitionLog::open(dir.path(), config, 0).unwrap();
    hook::install(Plan {
        fail_first: Some((crate::disk::DiskOp::Write, ".index", ErrorKind::Other)),
        ..Plan::default()
    });
    let mut appended = 0;
    while hook::take().map(|plan| {
        let done = !plan.failed.is_empty();
        if !done {
            hook::install(plan);
        }
        done
    }) == Some(false)
    {
        log.append(batch(appended), 0).unwrap();
        appended += 1;
    }
    assert!(log.poisoned().is_some());
    assert_eq!(log.next_offset(), u64::from(appended));
    assert!(matches!(
        log.append(batch(0), 0),
        Err(LogError::Poisoned { .. })
    ));
    drop(log);
    let mut log = PartitionLog::open(dir.path(), config, 0).unwrap();
    assert_eq!(read_all(&mut log).len() as u32, appended);
}
