//! Benchmark of the partition log against the raw file references, measured in the
//! same run: sequential write, sequential read, and a write-then-fdatasync loop.
//!
//! ```text
//! cargo bench -p braid-storage --bench log -- [--mib 1024] [--sync-mib 256] [--runs 3]
//!     [--dir PATH] [--idle 10000]
//! ```
//!
//! Records are 1 KiB, 1,000 to a batch. Every figure is the median of `--runs` runs;
//! each ratio is the median of the per-run ratios against the reference measured in
//! the same run. `--idle N` also opens N partitions once each and reports the resident
//! memory they keep while idle.

use std::error::Error;
use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Instant;

use braid_proto::{BatchBuilder, ValidatedBatch};
use braid_storage::{FsyncPolicy, LogConfig, PartitionLog, SyncError, SyncRequest, Syncer};

type Res<T> = Result<T, Box<dyn Error>>;

const RECORD_BYTES: usize = 1024;
const RECORDS_PER_BATCH: usize = 1000;
const APPENDERS: usize = 8;
const READ_BUDGET_BYTES: u32 = 4 << 20;

#[derive(Debug)]
struct Options {
    mib: u64,
    sync_mib: u64,
    runs: usize,
    dir: Option<PathBuf>,
    idle: usize,
    idle_open: Option<PathBuf>,
}

fn options() -> Res<Options> {
    let mut options = Options {
        mib: 1024,
        sync_mib: 256,
        runs: 3,
        dir: None,
        idle: 0,
        idle_open: None,
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = || args.next().ok_or(format!("{arg} needs a value"));
        match arg.as_str() {
            "--mib" => options.mib = value()?.parse()?,
            "--sync-mib" => options.sync_mib = value()?.parse()?,
            "--runs" => options.runs = value()?.parse()?,
            "--dir" => options.dir = Some(value()?.into()),
            "--idle" => options.idle = value()?.parse()?,
            "--idle-open" => options.idle_open = Some(value()?.into()),
            "--bench" => {} // passed by `cargo bench`
            other => return Err(format!("unknown option {other}").into()),
        }
    }
    Ok(options)
}

fn batch_bytes() -> Vec<u8> {
    let mut builder = BatchBuilder::with_capacity(0, RECORDS_PER_BATCH * (RECORD_BYTES + 16));
    let mut value = vec![0u8; RECORD_BYTES];
    for i in 0..RECORDS_PER_BATCH {
        for (j, byte) in value.iter_mut().enumerate() {
            *byte = (i * 31 + j * 7) as u8;
        }
        let key = (i as u32).to_be_bytes();
        builder.push(Some(&key), Some(&value), &[], i as i64);
    }
    builder.finish()
}

/// One measurement: bytes moved and seconds taken.
#[derive(Debug, Clone, Copy)]
struct Rate {
    bytes: u64,
    records: u64,
    seconds: f64,
}

impl Rate {
    fn mb_per_s(&self) -> f64 {
        self.bytes as f64 / 1e6 / self.seconds
    }
    fn records_per_s(&self) -> f64 {
        self.records as f64 / self.seconds
    }
}

fn timed(bytes: u64, records: u64, work: impl FnOnce() -> Res<()>) -> Res<Rate> {
    let start = Instant::now();
    work()?;
    Ok(Rate {
        bytes,
        records,
        seconds: start.elapsed().as_secs_f64(),
    })
}

/// The batches as a node holds them after receiving them: each in its own buffer.
/// Built before the clock starts, for the reference and the log alike, so both copy
/// from memory that is not in the CPU cache.
fn received(batch: &[u8], batches: u64) -> Vec<Vec<u8>> {
    (0..batches).map(|_| batch.to_vec()).collect()
}

fn plain_write(path: &Path, batch: &[u8], batches: u64, sync_each: bool) -> Res<Rate> {
    let mut file = File::create(path)?;
    let received = received(batch, batches);
    let rate = timed(
        batch.len() as u64 * batches,
        batches * RECORDS_PER_BATCH as u64,
        || {
            for bytes in received {
                file.write_all(&bytes)?;
                if sync_each {
                    file.sync_data()?;
                }
            }
            Ok(())
        },
    )?;
    Ok(rate)
}

fn config(fsync: FsyncPolicy) -> LogConfig {
    LogConfig {
        fsync,
        retention_ms: None,
        ..LogConfig::default()
    }
}

/// Seconds spent in each of two alternating steps.
#[derive(Debug, Default)]
struct Pair {
    reference_s: f64,
    log_s: f64,
}

impl Pair {
    fn rates(&self, bytes: u64, records: u64) -> (Rate, Rate) {
        let rate = |seconds| Rate {
            bytes,
            records,
            seconds,
        };
        (rate(self.reference_s), rate(self.log_s))
    }
}

fn time_step(total: &mut f64, step: impl FnOnce() -> Res<()>) -> Res<()> {
    let start = Instant::now();
    step()?;
    *total += start.elapsed().as_secs_f64();
    Ok(())
}

/// Writes each batch to a plain file and appends it to the log, alternating batch by
/// batch so both meet the same machine conditions (write-back, other tenants). With
/// `validate_in_loop` the log side also validates each batch, as a node does on
/// receipt; without, batches are validated before the clock starts.
fn interleaved_write(
    scratch: &Path,
    batch: &[u8],
    batches: u64,
    validate_in_loop: bool,
) -> Res<Pair> {
    let mut plain = File::create(scratch.join("plain"))?;
    let mut log = PartitionLog::open(scratch.join("log"), config(FsyncPolicy::Never), 0)?;
    let for_plain = received(batch, batches);
    let mut for_log = received(batch, batches);
    let mut validated = Vec::new();
    if !validate_in_loop {
        validated = for_log
            .drain(..)
            .map(ValidatedBatch::new)
            .collect::<Result<Vec<_>, _>>()?;
    }
    let mut validated = validated.into_iter();
    let mut for_log = for_log.into_iter();
    let mut pair = Pair::default();
    for bytes in for_plain {
        time_step(&mut pair.reference_s, || Ok(plain.write_all(&bytes)?))?;
        time_step(&mut pair.log_s, || {
            let batch = match validated.next() {
                Some(batch) => batch,
                None => ValidatedBatch::new(for_log.next().ok_or("ran out of batches")?)?,
            };
            log.append(batch, 0)?;
            Ok(())
        })?;
    }
    Ok(pair)
}

/// Reads the plain file and the log written by [`interleaved_write`] in alternating
/// chunks of `READ_BUDGET_BYTES`, reusing one buffer each.
fn interleaved_read(scratch: &Path, expected_bytes: u64) -> Res<Pair> {
    let mut plain = File::open(scratch.join("plain"))?;
    let mut log = PartitionLog::open(scratch.join("log"), config(FsyncPolicy::Never), 0)?;
    let mut plain_buf = vec![0u8; READ_BUDGET_BYTES as usize];
    let mut log_buf = Vec::new();
    let (mut plain_bytes, mut log_bytes) = (0u64, 0u64);
    let mut offset = log.start_offset();
    let mut pair = Pair::default();
    while plain_bytes < expected_bytes || offset < log.next_offset() {
        if plain_bytes < expected_bytes {
            time_step(&mut pair.reference_s, || {
                let n = plain.read(&mut plain_buf)?;
                if n == 0 {
                    return Err("plain file ended early".into());
                }
                plain_bytes += n as u64;
                Ok(())
            })?;
        }
        if offset < log.next_offset() {
            time_step(&mut pair.log_s, || {
                let buffer = std::mem::take(&mut log_buf);
                let read = log.read_reusing(offset, READ_BUDGET_BYTES, u64::MAX, buffer)?;
                log_bytes += read.bytes().len() as u64;
                offset = read.next_offset;
                log_buf = read.into_buffer();
                Ok(())
            })?;
        }
    }
    if log_bytes != expected_bytes {
        return Err(format!("log read {log_bytes} bytes, expected {expected_bytes}").into());
    }
    Ok(pair)
}

enum ToOwner {
    Append(Vec<u8>, mpsc::Sender<Result<u64, String>>),
    Synced(SyncRequest, Result<(), SyncError>),
}

/// `APPENDERS` threads each send a batch and wait for its durable acknowledgement; one
/// owner thread appends and acknowledges after the syncer's group commit, the way a
/// shard does.
/// Returns the rate, the appends and the fsyncs they took.
fn log_append_always(
    dir: &Path,
    batch: &[u8],
    batches: u64,
    syncer: &Syncer,
) -> Res<(Rate, u64, u64)> {
    let mut log = PartitionLog::open(dir, config(FsyncPolicy::Always), 0)?;
    let (to_owner, inbox) = mpsc::channel::<ToOwner>();
    let per_appender = batches / APPENDERS as u64;
    let total = per_appender * APPENDERS as u64;
    let fsyncs_before = syncer.stats().fsyncs();
    // The batches as received from the network, before the clock starts.
    let mut received: Vec<Vec<Vec<u8>>> = (0..APPENDERS)
        .map(|_| received(batch, per_appender))
        .collect();
    let rate = timed(
        batch.len() as u64 * total,
        total * RECORDS_PER_BATCH as u64,
        || {
            std::thread::scope(|scope| -> Res<()> {
                let mut appenders = Vec::new();
                for received in received.drain(..) {
                    let to_owner = to_owner.clone();
                    appenders.push(scope.spawn(move || -> Result<(), String> {
                        for bytes in received {
                            let (reply, ack) = mpsc::channel();
                            to_owner
                                .send(ToOwner::Append(bytes, reply))
                                .map_err(|e| e.to_string())?;
                            ack.recv().map_err(|e| e.to_string())??;
                        }
                        Ok(())
                    }));
                }
                let mut waiting: Vec<(u64, mpsc::Sender<Result<u64, String>>)> = Vec::new();
                let mut in_flight = false;
                let mut acked = 0u64;
                while acked < total {
                    match inbox.recv()? {
                        ToOwner::Append(bytes, reply) => {
                            let appended = log.append(ValidatedBatch::new(bytes)?, 0)?;
                            waiting.push((appended.last_offset, reply));
                        }
                        ToOwner::Synced(request, result) => {
                            log.on_synced(&request, result);
                            in_flight = false;
                            let durable = log.durable_offset();
                            for (_, reply) in waiting.extract_if(.., |(last, _)| *last < durable) {
                                let _ = reply.send(Ok(durable));
                                acked += 1;
                            }
                        }
                    }
                    if !in_flight {
                        if let Some(request) = log.sync_request()? {
                            let back = to_owner.clone();
                            syncer.submit(request, move |request, result| {
                                let _ = back.send(ToOwner::Synced(request, result));
                            });
                            in_flight = true;
                        }
                    }
                }
                for appender in appenders {
                    appender.join().map_err(|_| "appender panicked")??;
                }
                Ok(())
            })
        },
    )?;
    let fsyncs = syncer.stats().fsyncs() - fsyncs_before;
    eprintln!("  always: {total} appends, {fsyncs} fsyncs");
    Ok((rate, total, fsyncs))
}

fn validate_only(batch: &[u8], batches: u64) -> Res<Rate> {
    let received = received(batch, batches);
    timed(
        batch.len() as u64 * batches,
        batches * RECORDS_PER_BATCH as u64,
        || {
            for bytes in received {
                ValidatedBatch::new(bytes)?;
            }
            Ok(())
        },
    )
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(|a, b| a.total_cmp(b));
    values[values.len() / 2]
}

fn resident_bytes() -> Res<u64> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    let line = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .ok_or("no VmRSS in /proc/self/status")?;
    let kib: u64 = line
        .split_whitespace()
        .nth(1)
        .ok_or("bad VmRSS line")?
        .parse()?;
    Ok(kib * 1024)
}

/// Creates `count` partitions with one small batch each, then measures in a fresh
/// process (so no allocator memory of the creation is reused) what opening them costs.
fn idle_partitions(root: &Path, count: usize) -> Res<()> {
    let mut builder = BatchBuilder::new(0);
    builder.push(Some(b"k"), Some(&[7u8; 100]), &[], 0);
    let bytes = builder.finish();
    for i in 0..count {
        let mut log =
            PartitionLog::open(root.join(format!("p{i}")), config(FsyncPolicy::Never), 0)?;
        log.append(ValidatedBatch::new(bytes.clone())?, 0)?;
        log.close()?;
    }
    let status = std::process::Command::new(std::env::current_exe()?)
        .arg("--idle-open")
        .arg(root)
        .arg("--idle")
        .arg(count.to_string())
        .status()?;
    if !status.success() {
        return Err(format!("idle measurement failed: {status}").into());
    }
    Ok(())
}

fn idle_open(root: &Path, count: usize) -> Res<()> {
    let before = resident_bytes()?;
    let mut logs = Vec::with_capacity(count);
    for i in 0..count {
        let mut log =
            PartitionLog::open(root.join(format!("p{i}")), config(FsyncPolicy::Never), 0)?;
        log.release_files()?;
        logs.push(log);
    }
    let after = resident_bytes()?;
    let heap: usize = logs.iter().map(PartitionLog::heap_bytes).sum();
    let open_files: usize = logs.iter().map(PartitionLog::open_files).sum();
    println!(
        "idle partitions: {count} opened once each: resident +{:.1} MiB ({} bytes each; heap estimate {} bytes each); open files held: {open_files}",
        (after.saturating_sub(before)) as f64 / (1 << 20) as f64,
        after.saturating_sub(before) / count as u64,
        heap / count,
    );
    Ok(())
}

fn main() -> Res<()> {
    let options = options()?;
    if let Some(root) = &options.idle_open {
        return idle_open(root, options.idle);
    }
    let scratch = match &options.dir {
        Some(dir) => tempfile::tempdir_in(dir)?,
        None => tempfile::tempdir_in(std::env::current_dir()?)?,
    };
    let batch = batch_bytes();
    let batches = (options.mib << 20) / batch.len() as u64;
    let sync_batches = ((options.sync_mib << 20) / batch.len() as u64).max(APPENDERS as u64);
    println!(
        "partition log benchmark: {RECORD_BYTES}-byte records, {RECORDS_PER_BATCH} per batch ({} bytes), {} MiB per run ({} MiB with fsync), {} runs, in {}",
        batch.len(),
        options.mib,
        options.sync_mib,
        options.runs,
        scratch.path().display()
    );
    let syncer = Syncer::start("bench-sync")?;
    // Each odd row is measured against the row above it, in the same run.
    let names = [
        "plain write",
        "append, fsync never",
        "plain write",
        "validate + append, fsync never",
        "plain read",
        "log read",
        "plain write + fdatasync",
        "append, fsync always, 8 appenders",
    ];
    let mut figures: Vec<Vec<Rate>> = vec![Vec::new(); names.len()];
    // This machine is a VM whose fresh memory is slow on first touch (the host faults
    // it in) and whose disk and memory bandwidth are shared. So the writes and reads
    // alternate batch by batch between reference and log, after an unmeasured warm-up,
    // and the order of the fsync pair alternates per run.
    let mut group_commit = (0u64, 0u64);
    let warm = scratch.path().join("warm-up");
    plain_write(&warm, &batch, batches, false)?;
    std::fs::remove_file(&warm)?;
    for run in 0..options.runs {
        let reference_first = run % 2 == 0;
        let bytes = batch.len() as u64 * batches;
        let records = batches * RECORDS_PER_BATCH as u64;
        for (row, validate_in_loop) in [(0, false), (2, true)] {
            let dir = scratch.path().join(format!("run-{run}-{row}"));
            std::fs::create_dir(&dir)?;
            let (reference, ours) =
                interleaved_write(&dir, &batch, batches, validate_in_loop)?.rates(bytes, records);
            figures[row].push(reference);
            figures[row + 1].push(ours);
            if !validate_in_loop {
                let (reference, ours) = interleaved_read(&dir, bytes)?.rates(bytes, records);
                figures[4].push(reference);
                figures[5].push(ours);
            }
            std::fs::remove_dir_all(&dir)?;
        }
        let plain = scratch.path().join("plain");
        let always_dir = scratch.path().join(format!("always-{run}"));
        for turn in 0..2 {
            if (turn == 0) == reference_first {
                figures[6].push(plain_write(&plain, &batch, sync_batches, true)?);
                std::fs::remove_file(&plain)?;
            } else {
                let (rate, appends, fsyncs) =
                    log_append_always(&always_dir, &batch, sync_batches, &syncer)?;
                figures[7].push(rate);
                group_commit.0 += appends;
                group_commit.1 += fsyncs;
                std::fs::remove_dir_all(&always_dir)?;
            }
        }
        let per_run: Vec<String> = (0..names.len() / 2)
            .map(|pair| {
                let ours = figures[2 * pair + 1][run].mb_per_s();
                format!("{:.2}", ours / figures[2 * pair][run].mb_per_s())
            })
            .collect();
        eprintln!(
            "  run {} of {}: ratios {}",
            run + 1,
            options.runs,
            per_run.join(" ")
        );
    }
    println!(
        "{:<36} {:>14} {:>10} {:>8}",
        "", "records/s", "MB/s", "ratio"
    );
    for (i, name) in names.iter().enumerate() {
        let mut rps: Vec<f64> = figures[i].iter().map(Rate::records_per_s).collect();
        let mut mbs: Vec<f64> = figures[i].iter().map(Rate::mb_per_s).collect();
        let ratio = if i % 2 == 1 {
            let mut per_run: Vec<f64> = figures[i]
                .iter()
                .zip(&figures[i - 1])
                .map(|(ours, reference)| ours.mb_per_s() / reference.mb_per_s())
                .collect();
            format!("{:.2}", median(&mut per_run))
        } else {
            "ref".to_owned()
        };
        println!(
            "{name:<36} {:>14.0} {:>10.1} {:>8}",
            median(&mut rps),
            median(&mut mbs),
            ratio
        );
    }
    println!(
        "group commit: {} durable appends took {} fdatasync calls ({:.1} appends each)",
        group_commit.0,
        group_commit.1,
        group_commit.0 as f64 / group_commit.1.max(1) as f64
    );
    let validation = validate_only(&batch, batches.min(256))?;
    println!(
        "where append time goes: batch validation alone (CRC32C and record walk) runs at {:.0} MB/s",
        validation.mb_per_s()
    );
    if options.idle > 0 {
        idle_partitions(&scratch.path().join("idle"), options.idle)?;
    }
    Ok(())
}
