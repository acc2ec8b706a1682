//! The metadata made durable: an op log whose every record is synced before the op is
//! acknowledged, and a snapshot that the log is folded into when it grows.
//!
//! Files in the metadata directory (`docs/format.md` has them byte by byte):
//! - `ops.log`: the magic `BRDOPS01`, then records
//!   `[length: u32][seq: u64][crc32c: u32][payload: MetaOp]`. The CRC covers length, seq
//!   and payload, so a damaged length is found, not trusted; a length of 0 is refused
//!   (eight zero bytes were once a valid record). Seqs count up by one from 1.
//! - `snapshot`: the magic `BRDSNP01` and one record whose seq is the last op it holds
//!   and whose payload is the whole [`Metadata`]; written to `snapshot.tmp`, synced,
//!   renamed and the directory synced, so it is either the old or the new one.
//!
//! Opening loads the snapshot and replays the logged ops above its seq, so a crash
//! between the snapshot's rename and the log's truncation replays nothing twice. A torn
//! last record (a crash during its write, so never acknowledged) is cut; a damaged record
//! that any intact record follows, at whatever position, is an error naming the file and
//! position. After a failed write or sync the store is poisoned: it refuses every op
//! until the node is restarted, since what reached the disk is unknown and appending
//! after it could log an op twice.

use std::fs::File;
use std::path::{Path, PathBuf};

use braid_storage::disk;

use crate::metadata::{MetaError, MetaOp, Metadata};

const OPS_FILE: &str = "ops.log";
const SNAPSHOT_FILE: &str = "snapshot";
const OPS_MAGIC: &[u8; 8] = b"BRDOPS01";
const SNAPSHOT_MAGIC: &[u8; 8] = b"BRDSNP01";
const RECORD_HEADER_BYTES: usize = 16;
/// The op log is folded into a new snapshot once it is this big.
const OPS_LOG_BYTES_MAX: u64 = 4 << 20;

/// Why the metadata store failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The OS refused a file operation.
    #[error("{op} {path}: {source}")]
    Io {
        /// What was done.
        op: &'static str,
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A record is damaged and is not a torn tail.
    #[error("corrupt metadata in {path} at byte {position}: {reason}")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// Byte position of the record.
        position: u64,
        /// What is wrong.
        reason: String,
    },
    /// The file is not in the format this node reads.
    #[error(
        "{path} is not metadata format 1 (it starts {found:?}): it was written by an \
         older Braid or is not a metadata file; move the data directory aside to start \
         afresh"
    )]
    Format {
        /// The file.
        path: PathBuf,
        /// Its first bytes.
        found: String,
    },
    /// An earlier write or sync failed; nothing more is written until a restart.
    #[error("metadata store refuses writes after a failed {0}; restart the node")]
    Poisoned(String),
    /// The op was refused.
    #[error(transparent)]
    Refused(#[from] MetaError),
}

fn io(op: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> StoreError {
    let path = path.to_owned();
    move |source| StoreError::Io { op, path, source }
}

/// The durable metadata of a node.
#[derive(Debug)]
pub struct MetaStore {
    dir: PathBuf,
    ops: File,
    ops_bytes: u64,
    /// Seq of the last op logged (or held by the snapshot).
    seq: u64,
    state: Metadata,
    /// The operation that failed, once one has.
    poisoned: Option<String>,
}

fn record(seq: u64, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(RECORD_HEADER_BYTES + payload.len());
    out.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    out.extend_from_slice(&seq.to_be_bytes());
    let crc = crc32c::crc32c_append(crc32c::crc32c(&out[..12]), payload);
    out.extend_from_slice(&crc.to_be_bytes());
    out.extend_from_slice(payload);
    out
}

/// The (seq, payload) of an intact record at the start of `bytes`, or `None` if it is
/// cut, empty or fails its CRC.
fn parse_record(bytes: &[u8]) -> Option<(u64, &[u8])> {
    let header = bytes.get(..RECORD_HEADER_BYTES)?;
    let len = u32::from_be_bytes([header[0], header[1], header[2], header[3]]) as usize;
    if len == 0 {
        return None;
    }
    let mut seq = [0u8; 8];
    seq.copy_from_slice(&header[4..12]);
    let crc = u32::from_be_bytes([header[12], header[13], header[14], header[15]]);
    let payload = bytes.get(RECORD_HEADER_BYTES..RECORD_HEADER_BYTES.checked_add(len)?)?;
    let computed = crc32c::crc32c_append(crc32c::crc32c(&header[..12]), payload);
    (computed == crc).then_some((u64::from_be_bytes(seq), payload))
}

/// The first position after `from` where an intact record starts, if any: damage is
/// a torn tail only when nothing intact follows it.
fn intact_record_after(bytes: &[u8], from: usize) -> Option<usize> {
    (from + 1..bytes.len()).find(|&at| parse_record(&bytes[at..]).is_some())
}

/// `bytes` without its magic, or the format error.
fn strip_magic<'a>(bytes: &'a [u8], magic: &[u8; 8], path: &Path) -> Result<&'a [u8], StoreError> {
    match bytes.strip_prefix(&magic[..]) {
        Some(rest) => Ok(rest),
        None => Err(StoreError::Format {
            path: path.to_owned(),
            found: String::from_utf8_lossy(&bytes[..bytes.len().min(8)]).into_owned(),
        }),
    }
}

impl MetaStore {
    /// Opens (or creates) the store in `dir`.
    ///
    /// # Errors
    /// IO errors, [`StoreError::Format`] or [`StoreError::Corrupt`].
    pub fn open(dir: impl Into<PathBuf>) -> Result<Self, StoreError> {
        let dir = dir.into();
        braid_storage::create_dir_durable(&dir).map_err(io("create", &dir))?;
        let snapshot_path = dir.join(SNAPSHOT_FILE);
        let (mut state, snapshot_seq) = match std::fs::read(&snapshot_path) {
            Ok(bytes) => {
                let corrupt = |reason: String| StoreError::Corrupt {
                    path: snapshot_path.clone(),
                    position: SNAPSHOT_MAGIC.len() as u64,
                    reason,
                };
                let body = strip_magic(&bytes, SNAPSHOT_MAGIC, &snapshot_path)?;
                let (seq, payload) =
                    parse_record(body).ok_or_else(|| corrupt("bad CRC or length".into()))?;
                let state = Metadata::decode(payload).map_err(|e| corrupt(e.to_string()))?;
                (state, seq)
            }
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => (Metadata::default(), 0),
            Err(err) => return Err(io("read", &snapshot_path)(err)),
        };
        // A snapshot that never reached its rename is garbage.
        let temp = dir.join(format!("{SNAPSHOT_FILE}.tmp"));
        match disk::remove(&temp) {
            Ok(()) => {}
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
            Err(err) => return Err(io("remove", &temp)(err)),
        }
        let ops_path = dir.join(OPS_FILE);
        let (bytes, created) = match std::fs::read(&ops_path) {
            Ok(bytes) if bytes.is_empty() => (Vec::new(), true),
            Ok(bytes) => (bytes, false),
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => (Vec::new(), true),
            Err(err) => return Err(io("read", &ops_path)(err)),
        };
        let body = if created {
            &[][..]
        } else {
            strip_magic(&bytes, OPS_MAGIC, &ops_path)?
        };
        let base = OPS_MAGIC.len();
        let mut seq = snapshot_seq;
        let mut at = 0usize;
        while at < body.len() {
            let position = (base + at) as u64;
            let corrupt = |reason: String| StoreError::Corrupt {
                path: ops_path.clone(),
                position,
                reason,
            };
            let Some((record_seq, payload)) = parse_record(&body[at..]) else {
                if intact_record_after(body, at).is_some() {
                    return Err(corrupt("damaged record followed by intact ones".into()));
                }
                tracing::warn!(path = %ops_path.display(), position, "cutting a torn metadata record");
                break;
            };
            at += RECORD_HEADER_BYTES + payload.len();
            if record_seq <= snapshot_seq {
                // Folded into the snapshot already: the log was not yet emptied.
                continue;
            }
            if record_seq != seq + 1 {
                return Err(corrupt(format!("op {record_seq} follows op {seq}")));
            }
            let op = MetaOp::decode(payload).map_err(|e| corrupt(e.to_string()))?;
            // Ops were checked before they were logged; a refusal now means the log
            // and snapshot disagree.
            state
                .apply(&op)
                .map_err(|e| corrupt(format!("logged op refused on replay: {e}")))?;
            seq = record_seq;
        }
        let (ops, _) = disk::open_or_create(&ops_path).map_err(io("open", &ops_path))?;
        let kept = (base + at) as u64;
        if created {
            // A new log: its magic, synced, and its name made durable in the directory.
            disk::set_len(&ops, &ops_path, 0)
                .and_then(|()| disk::write_at(&ops, &ops_path, OPS_MAGIC, 0))
                .map_err(io("write", &ops_path))?;
            disk::sync_data(&ops, &ops_path).map_err(io("fsync", &ops_path))?;
            braid_storage::sync_dir(&dir).map_err(io("fsync", &dir))?;
        } else if kept < bytes.len() as u64 {
            disk::set_len(&ops, &ops_path, kept).map_err(io("truncate", &ops_path))?;
            disk::sync_data(&ops, &ops_path).map_err(io("fsync", &ops_path))?;
        }
        Ok(Self {
            dir,
            ops,
            ops_bytes: if created { base as u64 } else { kept },
            seq,
            state,
            poisoned: None,
        })
    }

    /// The current metadata.
    pub fn state(&self) -> &Metadata {
        &self.state
    }

    /// Seq of the last op applied.
    pub fn seq(&self) -> u64 {
        self.seq
    }

    /// Records a failure: no write follows it until the node restarts.
    fn poison(&mut self, what: &str, err: StoreError) -> StoreError {
        tracing::error!(%err, "metadata store poisoned");
        self.poisoned = Some(what.to_owned());
        err
    }

    fn check_writable(&self) -> Result<(), StoreError> {
        match &self.poisoned {
            Some(what) => Err(StoreError::Poisoned(what.clone())),
            None => Ok(()),
        }
    }

    /// Checks, logs (synced) and applies an op.
    ///
    /// # Errors
    /// [`StoreError::Refused`] with nothing written; [`StoreError::Poisoned`] after an
    /// earlier failure; an IO error, after which the op's outcome is unknown (it may be
    /// found logged after a restart) and the store is poisoned.
    pub fn apply(&mut self, op: &MetaOp) -> Result<(), StoreError> {
        self.check_writable()?;
        self.state.check(op)?;
        let mut payload = Vec::new();
        op.encode(&mut payload);
        let bytes = record(self.seq + 1, &payload);
        let path = self.dir.join(OPS_FILE);
        if let Err(err) = disk::write_at(&self.ops, &path, &bytes, self.ops_bytes) {
            return Err(self.poison("write of ops.log", io("write", &path)(err)));
        }
        if let Err(err) = disk::sync_data(&self.ops, &path) {
            return Err(self.poison("fsync of ops.log", io("fsync", &path)(err)));
        }
        self.ops_bytes += bytes.len() as u64;
        self.seq += 1;
        self.state.apply(op)?;
        if self.ops_bytes > OPS_LOG_BYTES_MAX {
            self.snapshot()?;
        }
        Ok(())
    }

    /// Writes the whole state as the new snapshot and empties the op log.
    ///
    /// # Errors
    /// IO errors. A failure before the rename leaves the old snapshot and log in
    /// force; one after it poisons the store (the snapshot holds every op, and the log's
    /// ops at or below its seq are skipped on the next open).
    pub fn snapshot(&mut self) -> Result<(), StoreError> {
        self.check_writable()?;
        let mut payload = Vec::new();
        self.state.encode(&mut payload);
        let temp = self.dir.join(format!("{SNAPSHOT_FILE}.tmp"));
        let write_temp = || -> Result<(), StoreError> {
            let mut bytes = SNAPSHOT_MAGIC.to_vec();
            bytes.extend_from_slice(&record(self.seq, &payload));
            disk::write_file(&temp, &bytes).map_err(io("write", &temp))?;
            let file = File::open(&temp).map_err(io("open", &temp))?;
            disk::sync_data(&file, &temp).map_err(io("fsync", &temp))
        };
        // On failure the temporary file is removed on the next open; nothing changed.
        write_temp()?;
        let path = self.dir.join(SNAPSHOT_FILE);
        if let Err(err) = disk::rename(&temp, &path) {
            return Err(self.poison("rename of the snapshot", io("rename", &path)(err)));
        }
        if let Err(err) = braid_storage::sync_dir(&self.dir) {
            return Err(self.poison(
                "fsync of the metadata directory",
                io("fsync", &self.dir)(err),
            ));
        }
        let ops_path = self.dir.join(OPS_FILE);
        let base = OPS_MAGIC.len() as u64;
        let cut = disk::set_len(&self.ops, &ops_path, base)
            .and_then(|()| disk::sync_data(&self.ops, &ops_path));
        if let Err(err) = cut {
            return Err(self.poison("truncation of ops.log", io("truncate", &ops_path)(err)));
        }
        self.ops_bytes = base;
        Ok(())
    }

    /// Replaces the log's file with one opened read-only, so the next write fails as a
    /// failing disk's would (tests of the poison rule).
    #[cfg(test)]
    fn break_ops_file(&mut self) {
        self.ops = File::open(self.dir.join(OPS_FILE)).unwrap();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use braid_proto::client::TopicSettings;

    fn create_topic(name: &str) -> MetaOp {
        MetaOp::CreateTopic {
            stream: "s".into(),
            name: name.into(),
            settings: TopicSettings {
                partitions: 2,
                ..TopicSettings::default()
            },
        }
    }

    #[test]
    fn survives_reopen_snapshot_and_a_torn_tail() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = MetaStore::open(dir.path()).unwrap();
        store
            .apply(&MetaOp::CreateStream { name: "s".into() })
            .unwrap();
        store.apply(&create_topic("a")).unwrap();
        assert!(matches!(
            store.apply(&create_topic("a")),
            Err(StoreError::Refused(_))
        ));
        let state = store.state().clone();
        drop(store);
        let mut store = MetaStore::open(dir.path()).unwrap();
        assert_eq!(store.state(), &state);
        store.snapshot().unwrap();
        store.apply(&create_topic("b")).unwrap();
        let state = store.state().clone();
        drop(store);
        // A torn write of a further op: it was never acknowledged and is cut.
        let ops = dir.path().join(OPS_FILE);
        let mut bytes = std::fs::read(&ops).unwrap();
        let whole = bytes.len();
        bytes.extend_from_slice(&[0, 0, 0, 40, 1, 2, 3]);
        std::fs::write(&ops, &bytes).unwrap();
        let mut store = MetaStore::open(dir.path()).unwrap();
        assert_eq!(store.state(), &state);
        assert_eq!(std::fs::metadata(&ops).unwrap().len(), whole as u64);
        store.apply(&create_topic("c")).unwrap();
        drop(store);
        let store = MetaStore::open(dir.path()).unwrap();
        assert!(store.state().topic("s", "c").is_ok());
    }

    #[test]
    fn damage_before_an_intact_record_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = MetaStore::open(dir.path()).unwrap();
        store
            .apply(&MetaOp::CreateStream { name: "s".into() })
            .unwrap();
        store.apply(&create_topic("a")).unwrap();
        drop(store);
        let ops = dir.path().join(OPS_FILE);
        let mut bytes = std::fs::read(&ops).unwrap();
        bytes[9] ^= 0xff;
        std::fs::write(&ops, &bytes).unwrap();
        match MetaStore::open(dir.path()) {
            Err(StoreError::Corrupt { path, position, .. }) => {
                assert_eq!(path, ops);
                assert_eq!(position, OPS_MAGIC.len() as u64);
            }
            other => panic!("expected Corrupt, got {other:?}"),
        }
    }

    fn stream_and_topics(store: &mut MetaStore, topics: &[&str]) {
        store
            .apply(&MetaOp::CreateStream { name: "s".into() })
            .unwrap();
        for topic in topics {
            store.apply(&create_topic(topic)).unwrap();
        }
    }

    /// A crash after the snapshot's rename and before the log was emptied (any kill in
    /// that window) left ops the snapshot already holds in the log; replaying them
    /// refused the start ("stream already exists"). Their seqs are now skipped.
    #[test]
    fn a_crash_between_snapshot_and_log_truncation_replays_nothing_twice() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = MetaStore::open(dir.path()).unwrap();
        stream_and_topics(&mut store, &["a", "b"]);
        let ops = dir.path().join(OPS_FILE);
        let logged = std::fs::read(&ops).unwrap();
        store.snapshot().unwrap();
        let state = store.state().clone();
        drop(store);
        // The state just after the rename: new snapshot, old log.
        std::fs::write(&ops, &logged).unwrap();
        let mut store = MetaStore::open(dir.path()).unwrap();
        assert_eq!(store.state(), &state);
        assert_eq!(store.seq(), 3);
        // New ops go on from there, and survive another open.
        store.apply(&create_topic("c")).unwrap();
        drop(store);
        let store = MetaStore::open(dir.path()).unwrap();
        assert_eq!(store.seq(), 4);
        assert!(store.state().topic("s", "c").is_ok());
    }

    /// Eight zero bytes were a valid record (length 0, CRC of nothing 0), so a
    /// zero-filled tail (unwritten extents after a power cut) stopped the node. Zero
    /// length is refused now, and the zeros are a torn tail.
    #[test]
    fn a_zero_filled_tail_is_cut_as_torn() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = MetaStore::open(dir.path()).unwrap();
        stream_and_topics(&mut store, &["a"]);
        let state = store.state().clone();
        drop(store);
        let ops = dir.path().join(OPS_FILE);
        let mut bytes = std::fs::read(&ops).unwrap();
        let whole = bytes.len();
        bytes.extend_from_slice(&[0u8; 4096]);
        std::fs::write(&ops, &bytes).unwrap();
        let store = MetaStore::open(dir.path()).unwrap();
        assert_eq!(store.state(), &state);
        assert_eq!(std::fs::metadata(&ops).unwrap().len(), whole as u64);
    }

    /// One flipped bit in a record's length made recovery cut the file to nothing and
    /// carry on without every stream. The CRC covers the length now, and intact
    /// records after the damage, at any position, make it an error.
    #[test]
    fn a_flipped_length_bit_is_an_error_not_an_erase() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = MetaStore::open(dir.path()).unwrap();
        stream_and_topics(&mut store, &["a", "b", "c"]);
        drop(store);
        let ops = dir.path().join(OPS_FILE);
        let bytes = std::fs::read(&ops).unwrap();
        for bit in 0..32 {
            let mut damaged = bytes.clone();
            damaged[OPS_MAGIC.len() + bit / 8] ^= 1 << (bit % 8);
            std::fs::write(&ops, &damaged).unwrap();
            match MetaStore::open(dir.path()) {
                Err(StoreError::Corrupt { position, .. }) => {
                    assert_eq!(position, OPS_MAGIC.len() as u64, "bit {bit}");
                }
                other => panic!("bit {bit}: expected Corrupt, got {other:?}"),
            }
            assert_eq!(std::fs::read(&ops).unwrap(), damaged, "nothing cut");
        }
    }

    /// A failed write left the store carrying on, so a retry logged the op twice and
    /// the next start refused to open. A failure now poisons the store; after a restart
    /// the op is there at most once.
    #[test]
    fn a_failed_write_poisons_and_the_op_is_logged_at_most_once() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = MetaStore::open(dir.path()).unwrap();
        stream_and_topics(&mut store, &["a"]);
        store.break_ops_file();
        assert!(matches!(
            store.apply(&create_topic("b")),
            Err(StoreError::Io { op: "write", .. })
        ));
        // The operator's retry is refused, not logged again.
        assert!(matches!(
            store.apply(&create_topic("b")),
            Err(StoreError::Poisoned(_))
        ));
        assert!(matches!(store.snapshot(), Err(StoreError::Poisoned(_))));
        drop(store);
        let mut store = MetaStore::open(dir.path()).unwrap();
        assert!(store.state().topic("s", "a").is_ok());
        assert!(store.state().topic("s", "b").is_err());
        store.apply(&create_topic("b")).unwrap();
    }

    /// A file of another format is refused with a message that says so, not parsed.
    #[test]
    fn a_log_of_another_format_is_refused_clearly() {
        let dir = tempfile::tempdir().unwrap();
        // Format 0: records straight from byte 0.
        std::fs::write(dir.path().join(OPS_FILE), [0, 0, 0, 2, 1, 2, 3, 4, 5, 6]).unwrap();
        let err = MetaStore::open(dir.path()).unwrap_err();
        assert!(matches!(err, StoreError::Format { .. }), "{err:?}");
        assert!(err.to_string().contains("older Braid"), "{err}");
    }

    /// The ops of a metadata workload: streams and topics created and deleted.
    fn workload_ops(count: usize) -> Vec<MetaOp> {
        let mut ops = Vec::new();
        for i in 0..count {
            ops.push(match i % 4 {
                0 => MetaOp::CreateStream {
                    name: format!("s{i}"),
                },
                1 | 2 => MetaOp::CreateTopic {
                    stream: format!("s{}", i - i % 4),
                    name: format!("t{i}"),
                    settings: TopicSettings {
                        partitions: 1,
                        ..TopicSettings::default()
                    },
                },
                _ => MetaOp::DeleteTopic {
                    stream: format!("s{}", i - i % 4),
                    name: format!("t{}", i - 1),
                },
            });
        }
        ops
    }

    /// The state after each prefix of `ops`.
    fn states_after(ops: &[MetaOp]) -> Vec<Metadata> {
        let mut state = Metadata::default();
        let mut states = vec![state.clone()];
        for op in ops {
            state.apply(op).unwrap();
            states.push(state.clone());
        }
        states
    }

    /// Applies `ops` to a store in `dir`, a snapshot every fifth op, until an error;
    /// returns how many were acknowledged and, for each, the trace length then.
    fn run_ops(dir: &Path, ops: &[MetaOp], trace_len: &dyn Fn() -> usize) -> Vec<usize> {
        let mut acked = Vec::new();
        let Ok(mut store) = MetaStore::open(dir) else {
            return acked;
        };
        for (i, op) in ops.iter().enumerate() {
            if store.apply(op).is_err() {
                break;
            }
            acked.push(trace_len());
            if i % 5 == 4 && store.snapshot().is_err() {
                break;
            }
        }
        acked
    }

    /// The store opened from `dir` holds a prefix of the ops at least `acked` long.
    fn check_reopened(dir: &Path, states: &[Metadata], acked: usize, context: &str) {
        let store =
            MetaStore::open(dir).unwrap_or_else(|err| panic!("{context}: refused to open: {err}"));
        let seq = store.seq() as usize;
        assert!(
            seq >= acked,
            "{context}: {acked} ops acknowledged, {seq} kept"
        );
        assert_eq!(
            store.state(),
            &states[seq],
            "{context}: the state of op {seq}"
        );
    }

    /// Every state a power cut may leave at every sync boundary of a workload that
    /// logs and snapshots (the harness of `braid_storage::crash`) opens with every
    /// acknowledged op and nothing that is not a prefix of the ops.
    #[test]
    fn every_crash_state_keeps_the_acknowledged_ops() {
        use braid_storage::disk::hook;
        let ops = workload_ops(24);
        let states = states_after(&ops);
        let root = tempfile::tempdir().unwrap();
        hook::start_tracing();
        let trace_len = hook::trace_len;
        let acks = run_ops(&root.path().join("metadata"), &ops, &trace_len);
        assert_eq!(acks.len(), ops.len());
        let trace = hook::take().unwrap().trace;
        let checked =
            braid_storage::crash::for_each_crash_state(&trace, root.path(), |at, state, dir| {
                let acked = acks.iter().filter(|&&events| events <= at).count();
                let metadata = dir.join("metadata");
                if !metadata.is_dir() {
                    assert_eq!(acked, 0, "cut at {at}, {state}: the directory is gone");
                    return;
                }
                check_reopened(&metadata, &states, acked, &format!("cut at {at}, {state}"));
            });
        assert!(checked > 100, "{checked} crash states");
    }

    /// Each disk operation of the workload failed in turn (EIO, then ENOSPC): the
    /// failing call errors, later writes are refused, and a reopen (page cache kept)
    /// holds every acknowledged op and a prefix of the ops.
    #[test]
    fn every_failed_disk_operation_keeps_the_acknowledged_ops() {
        use braid_storage::disk::hook::{self, Plan};
        let ops = workload_ops(12);
        let states = states_after(&ops);
        let root = tempfile::tempdir().unwrap();
        hook::install(Plan::default());
        run_ops(&root.path().join("metadata"), &ops, &|| 0);
        let operations = hook::take().unwrap().seen;
        for kind in [std::io::ErrorKind::Other, std::io::ErrorKind::StorageFull] {
            for at in 0..operations {
                let root = tempfile::tempdir().unwrap();
                let dir = root.path().join("metadata");
                hook::install(Plan {
                    fail_at: Some((at, kind)),
                    ..Plan::default()
                });
                let acked = run_ops(&dir, &ops, &|| 0).len();
                drop(hook::take());
                if !dir.is_dir() {
                    assert_eq!(acked, 0);
                    continue;
                }
                check_reopened(
                    &dir,
                    &states,
                    acked,
                    &format!("operation {at} failed with {kind:?}"),
                );
            }
        }
    }
}
