//! The crash-state harness, after ALICE and LazyFS: a workload runs on a real
//! directory with every disk operation recorded (`crate::disk`'s trace); then, at each
//! sync boundary, the states a power cut may leave under the POSIX model are rebuilt in
//! fresh directories and opened with the real recovery code:
//!
//! - a file's bytes are what its last `fdatasync` covered, plus any of the writes since
//!   (none, all, a prefix of them, the last one with the earlier ones zero-filled as
//!   unwritten extents, or the last one torn at a page boundary);
//! - a directory's entries are what its last sync covered (creations, renames and
//!   removals since then lost), or all of them.
//!
//! Every state must open under `strict` recovery and hold every record acknowledged
//! before the cut at its offset, with offsets dense from the start: under `fsync =
//! always`, what a sync covered; under `never`, what sealed segments hold (sealing
//! syncs). CI runs a few workloads; `STORAGE_CRASH_ROUNDS=N`
//! (`scripts/storage-crash-states.sh`) runs N.

use std::path::Path;

use super::*;
use crate::config::{FsyncPolicy, LogConfig};
use crate::disk::hook::{self, Event};
use braid_proto::{BatchBuilder, ValidatedBatch};

fn config(fsync: FsyncPolicy) -> LogConfig {
    LogConfig {
        segment_bytes_max: 1024,
        index_interval_bytes: 128,
        segment_age_ms_max: None,
        retention_ms: None,
        retention_bytes: Some(1024),
        fsync,
        ..LogConfig::default()
    }
}

fn batch(value: u32, records: usize) -> ValidatedBatch {
    let mut builder = BatchBuilder::new(1_000);
    for i in 0..records {
        let mut bytes = value.to_be_bytes().to_vec();
        bytes.extend_from_slice(&[i as u8; 40]);
        builder.push(Some(b"k"), Some(&bytes), &[], 1_000);
    }
    ValidatedBatch::new(builder.finish()).unwrap()
}

/// What had been acknowledged once the trace had `events` events: values of the
/// offsets below the acknowledged one.
#[derive(Debug, Clone)]
struct Ack {
    events: usize,
    values: Vec<u32>,
}

/// Runs a workload on `dir/p` with tracing; returns the trace and the acks.
/// Under `Always` the workload syncs now and then; under `Never` it never does, and
/// only sealing a segment (which syncs it) makes records durable.
fn traced_workload(root: &Path, seed: u64, fsync: FsyncPolicy) -> (Vec<Event>, Vec<Ack>) {
    hook::start_tracing();
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut rng = move |n: u64| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state % n.max(1)
    };
    let mut log = PartitionLog::open(root.join("p"), config(fsync), 1_000).unwrap();
    let syncs = fsync == FsyncPolicy::Always;
    let mut values: Vec<u32> = Vec::new();
    let mut bases: Vec<u64> = Vec::new();
    let mut acks = vec![Ack {
        events: 0,
        values: Vec::new(),
    }];
    for step in 0..60 {
        // Retention is rare, so that one call removes several segments.
        match rng(20) {
            0..=11 => {
                let records = 1 + rng(3) as usize;
                let value = (seed as u32) << 16 | step;
                let appended = log.append(batch(value, records), 1_000).unwrap();
                bases.push(appended.base_offset);
                values.extend(std::iter::repeat_n(value, records));
            }
            12..=15 if syncs => log.sync().unwrap(),
            16 => {
                // Only the last batch, and only unacknowledged (as replication would).
                if let Some(&to) = bases.last() {
                    if to >= log.durable_offset() && to > log.start_offset() {
                        log.truncate(to).unwrap();
                        bases.pop();
                        values.truncate(to as usize);
                    }
                }
            }
            // Synced batches too, as a view change replaces a replica's synced but
            // uncommitted ops. This found a hole: the cut of the older segment reached
            // the disk before the removal of the segments after it, which came back on
            // the next open with the offsets between them missing.
            17 if syncs && bases.len() > 1 => {
                let at = bases.len() - 1 - rng(bases.len().min(4) as u64 - 1) as usize;
                let to = bases[at];
                if to > log.start_offset() {
                    // What the cut takes was given up before it began (a crash inside
                    // it may leave either).
                    let kept = (log.durable_offset() as usize).min(to as usize);
                    acks.push(Ack {
                        events: hook::trace_len(),
                        values: values[..kept].to_vec(),
                    });
                    log.truncate(to).unwrap();
                    bases.truncate(at);
                    values.truncate(to as usize);
                }
            }
            19 => {
                log.apply_retention(1_000).unwrap();
            }
            _ => {}
        }
        // Whatever `durable_offset` now covers is what a client was told is durable.
        let acked = log.durable_offset() as usize;
        if acks.last().is_some_and(|ack| ack.values.len() != acked) {
            acks.push(Ack {
                events: hook::trace_len(),
                values: values[..acked].to_vec(),
            });
        }
    }
    drop(log);
    (
        hook::take().map(|plan| plan.trace).unwrap_or_default(),
        acks,
    )
}

/// Every crash state at every sync boundary of `seed`'s workload; returns how many.
fn every_crash_state_of(seed: u64, fsync: FsyncPolicy) -> usize {
    let root_dir = tempfile::tempdir().unwrap();
    let root = root_dir.path().to_owned();
    let (trace, acks) = traced_workload(&root, seed, fsync);
    crate::crash::for_each_crash_state(&trace, &root, |at, state, dir| {
        let acked = acks
            .iter()
            .rev()
            .find(|ack| ack.events <= at)
            .map(|ack| ack.values.clone())
            .unwrap_or_default();
        let context = format!("seed {seed} ({fsync:?}), cut before operation {at}, {state}");
        check_one(&dir.join("p"), &acked, fsync, &context);
    })
}

fn check_one(dir: &Path, acked: &[u32], fsync: FsyncPolicy, context: &str) {
    if !dir.is_dir() {
        assert!(
            acked.is_empty(),
            "{context}: the partition directory is gone with acknowledged records"
        );
        return;
    }
    let mut log = PartitionLog::open(dir, config(fsync), 9_000)
        .unwrap_or_else(|err| panic!("{context}: refused to open: {err}"));
    let start = log.start_offset();
    let mut at = start;
    while at < log.next_offset() {
        match log.read(at, 1 << 20, u64::MAX) {
            Ok(read) => at = read.next_offset,
            Err(err) => {
                let segments: Vec<_> = log
                    .segments
                    .iter()
                    .map(|s| (s.base_offset, s.size_bytes))
                    .collect();
                panic!(
                    "{context}: {err}; segments {segments:?}, point {:?}, report {:?}",
                    log.recovery_point,
                    log.recovery()
                );
            }
        }
    }
    let found: Vec<u32> = super::fault_tests::read_all(&mut log)
        .into_iter()
        .map(|(_, value)| value)
        .collect();
    assert_eq!(
        found.len() as u64,
        log.next_offset() - start,
        "{context}: offsets dense"
    );
    for offset in start..acked.len() as u64 {
        let got = found.get((offset - start) as usize);
        assert_eq!(
            got,
            Some(&acked[offset as usize]),
            "{context}: acknowledged offset {offset} (start {start}, next {})",
            log.next_offset()
        );
    }
}

#[test]
fn every_crash_state_keeps_what_was_acknowledged() {
    let always: usize = (1..=3)
        .map(|seed| every_crash_state_of(seed, FsyncPolicy::Always))
        .sum();
    let never: usize = (1..=2)
        .map(|seed| every_crash_state_of(seed, FsyncPolicy::Never))
        .sum();
    let states = always + never;
    assert!(states > 100, "{states} crash states");
}

/// `STORAGE_CRASH_ROUNDS=200 cargo test -p braid-storage --release --lib
/// many_workloads_crash_states -- --ignored --nocapture`.
#[test]
#[ignore = "long: run by scripts/storage-crash-states.sh"]
fn many_workloads_crash_states() {
    let rounds: u64 = std::env::var("STORAGE_CRASH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(50);
    let states: usize = (100..100 + rounds)
        .map(|seed| {
            every_crash_state_of(seed, FsyncPolicy::Always)
                + every_crash_state_of(seed, FsyncPolicy::Never)
        })
        .sum();
    eprintln!(
        "{rounds} workloads, {states} crash states, every one opened with its acknowledged records"
    );
}
