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
//! before the cut (under `fsync = always`, after a sync returned) at its offset, with
//! offsets dense from the start. CI runs a few workloads; `STORAGE_CRASH_ROUNDS=N`
//! (`scripts/storage-crash-states.sh`) runs N.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::*;
use crate::config::{FsyncPolicy, LogConfig};
use crate::disk::hook::{self, Event, Plan};
use braid_proto::{BatchBuilder, RecordBatch, ValidatedBatch};

const PAGE: usize = 4096;

fn config() -> LogConfig {
    LogConfig {
        segment_bytes_max: 1024,
        index_interval_bytes: 128,
        segment_age_ms_max: None,
        retention_ms: None,
        retention_bytes: Some(1024),
        fsync: FsyncPolicy::Always,
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
fn traced_workload(root: &Path, seed: u64) -> (Vec<Event>, Vec<Ack>) {
    hook::install(Plan {
        tracing: true,
        ..Plan::default()
    });
    let events = || {
        hook::take().map(|plan| {
            let len = plan.trace.len();
            hook::install(plan);
            len
        })
    };
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut rng = move |n: u64| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state % n.max(1)
    };
    let mut log = PartitionLog::open(root.join("p"), config(), 1_000).unwrap();
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
            12..=15 => {
                log.sync().unwrap();
                let acked = log.durable_offset() as usize;
                acks.push(Ack {
                    events: events().unwrap_or(0),
                    values: values[..acked].to_vec(),
                });
            }
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
            19 => {
                log.apply_retention(1_000).unwrap();
            }
            _ => {}
        }
    }
    log.sync().unwrap();
    acks.push(Ack {
        events: events().unwrap_or(0),
        values: values[..log.durable_offset() as usize].to_vec(),
    });
    drop(log);
    (
        hook::take().map(|plan| plan.trace).unwrap_or_default(),
        acks,
    )
}

#[derive(Debug, Clone, Default)]
struct Inode {
    durable: Vec<u8>,
    current: Vec<u8>,
    /// Writes since the last sync: (offset, bytes); a set_len as an empty write.
    pending: Vec<(u64, Vec<u8>, Option<u64>)>,
    is_dir: bool,
}

/// The file system as the trace left it, up to some event.
#[derive(Debug, Default, Clone)]
struct Model {
    inodes: Vec<Inode>,
    current: BTreeMap<PathBuf, usize>,
    durable: BTreeMap<PathBuf, usize>,
}

fn apply_write(content: &mut Vec<u8>, offset: u64, bytes: &[u8], len: Option<u64>) {
    if let Some(len) = len {
        content.resize(len as usize, 0);
        return;
    }
    let end = offset as usize + bytes.len();
    if content.len() < end {
        content.resize(end, 0);
    }
    content[offset as usize..end].copy_from_slice(bytes);
}

impl Model {
    fn new_inode(&mut self, path: &Path, is_dir: bool) {
        self.inodes.push(Inode {
            is_dir,
            ..Inode::default()
        });
        self.current.insert(path.to_owned(), self.inodes.len() - 1);
    }

    fn apply(&mut self, event: &Event) {
        match event {
            Event::MkDir { dir } => self.new_inode(dir, true),
            Event::Create { path } => {
                if !self.current.contains_key(path) {
                    self.new_inode(path, false);
                }
            }
            Event::Write {
                path,
                offset,
                bytes,
            } => {
                if let Some(&inode) = self.current.get(path) {
                    let inode = &mut self.inodes[inode];
                    apply_write(&mut inode.current, *offset, bytes, None);
                    inode.pending.push((*offset, bytes.clone(), None));
                }
            }
            Event::SetLen { path, len } => {
                if let Some(&inode) = self.current.get(path) {
                    let inode = &mut self.inodes[inode];
                    apply_write(&mut inode.current, 0, &[], Some(*len));
                    inode.pending.push((0, Vec::new(), Some(*len)));
                }
            }
            Event::Sync { path } => {
                if let Some(&inode) = self.current.get(path) {
                    let inode = &mut self.inodes[inode];
                    inode.durable = inode.current.clone();
                    inode.pending.clear();
                }
            }
            Event::Remove { path } => {
                self.current.remove(path);
            }
            Event::Rename { from, to } => {
                if let Some(inode) = self.current.remove(from) {
                    self.current.insert(to.clone(), inode);
                }
            }
            Event::DirSync { dir } => {
                // The directory's own entries become what they are now.
                self.durable
                    .retain(|path, _| path.parent() != Some(dir.as_path()));
                for (path, inode) in &self.current {
                    if path.parent() == Some(dir.as_path()) {
                        self.durable.insert(path.clone(), *inode);
                    }
                }
            }
        }
    }
}

/// How the unsynced writes of a file reached the disk.
#[derive(Debug, Clone, Copy)]
enum Persisted {
    None,
    All,
    Prefix(usize),
    LastOnlyEarlierZeroed,
    LastTorn,
}

fn content_of(inode: &Inode, how: Persisted) -> Vec<u8> {
    let mut content = inode.durable.clone();
    let pending = &inode.pending;
    let apply = |content: &mut Vec<u8>, (offset, bytes, len): &(u64, Vec<u8>, Option<u64>)| {
        apply_write(content, *offset, bytes, *len)
    };
    match how {
        Persisted::None => {}
        Persisted::All => pending.iter().for_each(|w| apply(&mut content, w)),
        Persisted::Prefix(k) => pending.iter().take(k).for_each(|w| apply(&mut content, w)),
        Persisted::LastOnlyEarlierZeroed => {
            if let Some((last, earlier)) = pending.split_last() {
                for (offset, bytes, len) in earlier {
                    apply_write(&mut content, *offset, &vec![0; bytes.len()], *len);
                }
                apply(&mut content, last);
            }
        }
        Persisted::LastTorn => {
            if let Some((last, earlier)) = pending.split_last() {
                earlier.iter().for_each(|w| apply(&mut content, w));
                let (offset, bytes, len) = last;
                // Only the pages of the write up to its first page boundary landed.
                let keep = (PAGE - (*offset as usize % PAGE)).min(bytes.len());
                apply_write(&mut content, *offset, &bytes[..keep], *len);
                if len.is_none() && bytes.len() > keep {
                    apply_write(
                        &mut content,
                        *offset + keep as u64,
                        &vec![0; bytes.len() - keep],
                        None,
                    );
                }
            }
        }
    }
    content
}

/// Which directory entries a crash state keeps.
#[derive(Debug, Clone)]
enum Entries {
    /// What the directory syncs covered.
    Synced,
    /// Everything, as the page cache had it.
    All,
    /// What the syncs covered, and one later change (a creation, rename or removal)
    /// that reached the disk before the earlier ones.
    SyncedAndOne(PathBuf),
}

/// Writes one crash state of `model` under `out`, where `root` stood.
fn materialize(
    model: &Model,
    root: &Path,
    out: &Path,
    entries: &Entries,
    how: &dyn Fn(&Inode) -> Persisted,
) {
    let mut chosen;
    let entries = match entries {
        Entries::Synced => &model.durable,
        Entries::All => &model.current,
        Entries::SyncedAndOne(path) => {
            chosen = model.durable.clone();
            match model.current.get(path) {
                Some(inode) => {
                    chosen.insert(path.clone(), *inode);
                }
                None => {
                    chosen.remove(path);
                }
            }
            &chosen
        }
    };
    // Directories first (shallowest first), then files whose directory survived.
    let mut paths: Vec<(&PathBuf, &usize)> = entries.iter().collect();
    paths.sort_by_key(|(path, _)| path.components().count());
    for (path, &inode) in paths {
        let Ok(relative) = path.strip_prefix(root) else {
            continue;
        };
        let target = out.join(relative);
        if !target.parent().is_some_and(Path::is_dir) {
            continue; // its directory's entry was lost: so is it
        }
        let inode = &model.inodes[inode];
        if inode.is_dir {
            std::fs::create_dir_all(&target).unwrap();
        } else {
            std::fs::write(&target, content_of(inode, how(inode))).unwrap();
        }
    }
}

/// Every crash state at every sync boundary of `seed`'s workload; returns how many.
fn every_crash_state_of(seed: u64) -> usize {
    let root_dir = tempfile::tempdir().unwrap();
    let root = root_dir.path().to_owned();
    // The root exists before the workload; its entry is durable.
    let (trace, acks) = traced_workload(&root, seed);
    let mut model = Model::default();
    model.new_inode(&root, true);
    model.durable = model.current.clone();
    let mut states = 0;
    for (at, event) in trace.iter().enumerate() {
        // A cut just before each sync, and just after the last event.
        let boundary = matches!(event, Event::Sync { .. } | Event::DirSync { .. });
        if boundary {
            states += check_states(&model, &root, at, &acks, seed);
        }
        model.apply(event);
    }
    states + check_states(&model, &root, trace.len(), &acks, seed)
}

fn check_states(model: &Model, root: &Path, at: usize, acks: &[Ack], seed: u64) -> usize {
    let acked = acks
        .iter()
        .rev()
        .find(|ack| ack.events <= at)
        .map(|ack| ack.values.clone())
        .unwrap_or_default();
    let most_pending = model
        .inodes
        .iter()
        .map(|inode| inode.pending.len())
        .max()
        .unwrap_or(0);
    let mut variants: Vec<(Entries, Persisted)> = vec![
        (Entries::Synced, Persisted::None),
        (Entries::All, Persisted::All),
        (Entries::All, Persisted::LastOnlyEarlierZeroed),
        (Entries::All, Persisted::LastTorn),
        (Entries::Synced, Persisted::LastOnlyEarlierZeroed),
    ];
    for k in 1..most_pending {
        variants.push((Entries::All, Persisted::Prefix(k)));
    }
    // Each unsynced directory change alone, as if it reached the disk first.
    let changed = model
        .current
        .iter()
        .filter(|(path, inode)| model.durable.get(*path) != Some(inode))
        .map(|(path, _)| path.clone())
        .chain(
            model
                .durable
                .keys()
                .filter(|path| !model.current.contains_key(*path))
                .cloned(),
        );
    for path in changed.collect::<Vec<_>>() {
        variants.push((Entries::SyncedAndOne(path), Persisted::All));
    }
    for (entries, how) in &variants {
        let out = tempfile::tempdir().unwrap();
        materialize(model, root, out.path(), entries, &|_| *how);
        let context =
            format!("seed {seed}, cut before event {at}, entries {entries:?}, writes {how:?}");
        check_one(&out.path().join("p"), &acked, &context);
    }
    variants.len()
}

fn check_one(dir: &Path, acked: &[u32], context: &str) {
    if !dir.is_dir() {
        assert!(
            acked.is_empty(),
            "{context}: the partition directory is gone with acknowledged records"
        );
        return;
    }
    let mut log = PartitionLog::open(dir, config(), 9_000)
        .unwrap_or_else(|err| panic!("{context}: refused to open: {err}"));
    let start = log.start_offset();
    let mut found = Vec::new();
    let mut at = start;
    while at < log.next_offset() {
        let read = log.read(at, 1 << 20, u64::MAX).unwrap();
        let mut bytes = read.bytes();
        while !bytes.is_empty() {
            let (batch, used) = RecordBatch::validate(bytes).unwrap();
            for record in batch.records() {
                let value = record.unwrap().value.unwrap();
                found.push(u32::from_be_bytes(value[..4].try_into().unwrap()));
            }
            bytes = &bytes[used..];
        }
        at = read.next_offset;
    }
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
    let states: usize = (1..=3).map(every_crash_state_of).sum();
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
    let states: usize = (100..100 + rounds).map(every_crash_state_of).sum();
    eprintln!(
        "{rounds} workloads, {states} crash states, every one opened with its acknowledged records"
    );
}
