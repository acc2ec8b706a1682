//! The metadata made durable: an op log whose every record is synced before the op is
//! acknowledged, and a snapshot that the log is folded into when it grows.
//!
//! Files in the metadata directory:
//! - `ops.log`: records `[length: u32][crc32c of payload: u32][payload: MetaOp]`.
//! - `snapshot`: one such record whose payload is the whole [`Metadata`], written to
//!   `snapshot.tmp`, synced and renamed, so it is either the old or the new one.
//!
//! Opening loads the snapshot and replays the log. A torn last record (a crash during
//! its write, so never acknowledged) is cut; damage followed by an intact record is an
//! error that names the file and position.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use crate::metadata::{MetaError, MetaOp, Metadata};

const OPS_FILE: &str = "ops.log";
const SNAPSHOT_FILE: &str = "snapshot";
const RECORD_HEADER_BYTES: usize = 8;
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
    state: Metadata,
}

fn record(payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(RECORD_HEADER_BYTES + payload.len());
    out.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    out.extend_from_slice(&crc32c::crc32c(payload).to_be_bytes());
    out.extend_from_slice(payload);
    out
}

/// The payload of the record at the start of `bytes`, or `None` if it is cut or fails
/// its CRC.
fn parse_record(bytes: &[u8]) -> Option<&[u8]> {
    let header = bytes.get(..RECORD_HEADER_BYTES)?;
    let len = u32::from_be_bytes([header[0], header[1], header[2], header[3]]) as usize;
    let crc = u32::from_be_bytes([header[4], header[5], header[6], header[7]]);
    let payload = bytes.get(RECORD_HEADER_BYTES..RECORD_HEADER_BYTES + len)?;
    (crc32c::crc32c(payload) == crc).then_some(payload)
}

impl MetaStore {
    /// Opens (or creates) the store in `dir`.
    ///
    /// # Errors
    /// IO errors, or [`StoreError::Corrupt`].
    pub fn open(dir: impl Into<PathBuf>) -> Result<Self, StoreError> {
        let dir = dir.into();
        std::fs::create_dir_all(&dir).map_err(io("create", &dir))?;
        let snapshot_path = dir.join(SNAPSHOT_FILE);
        let mut state = match std::fs::read(&snapshot_path) {
            Ok(bytes) => {
                let corrupt = |reason: String| StoreError::Corrupt {
                    path: snapshot_path.clone(),
                    position: 0,
                    reason,
                };
                let payload =
                    parse_record(&bytes).ok_or_else(|| corrupt("bad CRC or length".into()))?;
                Metadata::decode(payload).map_err(|e| corrupt(e.to_string()))?
            }
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => Metadata::default(),
            Err(err) => return Err(io("read", &snapshot_path)(err)),
        };
        let ops_path = dir.join(OPS_FILE);
        let bytes = match std::fs::read(&ops_path) {
            Ok(bytes) => bytes,
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(err) => return Err(io("read", &ops_path)(err)),
        };
        let mut at = 0usize;
        while at < bytes.len() {
            let Some(payload) = parse_record(&bytes[at..]) else {
                // A torn tail is the last record and nothing intact follows it.
                let declared = bytes
                    .get(at..at + 4)
                    .map_or(0, |h| u32::from_be_bytes([h[0], h[1], h[2], h[3]]) as usize);
                let next = at + RECORD_HEADER_BYTES + declared;
                if next < bytes.len() && parse_record(&bytes[next..]).is_some() {
                    return Err(StoreError::Corrupt {
                        path: ops_path,
                        position: at as u64,
                        reason: "record fails its CRC".into(),
                    });
                }
                tracing::warn!(path = %ops_path.display(), position = at, "cutting a torn metadata record");
                break;
            };
            let op = MetaOp::decode(payload).map_err(|e| StoreError::Corrupt {
                path: ops_path.clone(),
                position: at as u64,
                reason: e.to_string(),
            })?;
            // Ops were checked before they were logged; a refusal now means the log
            // and snapshot disagree.
            state.apply(&op).map_err(|e| StoreError::Corrupt {
                path: ops_path.clone(),
                position: at as u64,
                reason: format!("logged op refused on replay: {e}"),
            })?;
            at += RECORD_HEADER_BYTES + payload.len();
        }
        let ops = OpenOptions::new()
            .create(true)
            .write(true)
            .truncate(false)
            .open(&ops_path)
            .map_err(io("open", &ops_path))?;
        if (at as u64) < bytes.len() as u64 {
            ops.set_len(at as u64).map_err(io("truncate", &ops_path))?;
            ops.sync_all().map_err(io("fsync", &ops_path))?;
        }
        let mut store = Self {
            dir,
            ops,
            ops_bytes: at as u64,
            state,
        };
        store.seek_end()?;
        Ok(store)
    }

    fn seek_end(&mut self) -> Result<(), StoreError> {
        use std::io::Seek;
        let path = self.dir.join(OPS_FILE);
        self.ops
            .seek(std::io::SeekFrom::Start(self.ops_bytes))
            .map_err(io("seek", &path))?;
        Ok(())
    }

    /// The current metadata.
    pub fn state(&self) -> &Metadata {
        &self.state
    }

    /// Checks, logs (synced) and applies an op.
    ///
    /// # Errors
    /// [`StoreError::Refused`] with nothing written, or an IO error.
    pub fn apply(&mut self, op: &MetaOp) -> Result<(), StoreError> {
        self.state.check(op)?;
        let mut payload = Vec::new();
        op.encode(&mut payload);
        let bytes = record(&payload);
        let path = self.dir.join(OPS_FILE);
        self.ops.write_all(&bytes).map_err(io("write", &path))?;
        self.ops.sync_data().map_err(io("fsync", &path))?;
        self.ops_bytes += bytes.len() as u64;
        self.state.apply(op)?;
        if self.ops_bytes > OPS_LOG_BYTES_MAX {
            self.snapshot()?;
        }
        Ok(())
    }

    /// Writes the whole state as the new snapshot and empties the op log.
    ///
    /// # Errors
    /// IO errors; the old snapshot and log then stay in force.
    pub fn snapshot(&mut self) -> Result<(), StoreError> {
        let mut payload = Vec::new();
        self.state.encode(&mut payload);
        let temp = self.dir.join(format!("{SNAPSHOT_FILE}.tmp"));
        let mut file = File::create(&temp).map_err(io("create", &temp))?;
        file.write_all(&record(&payload))
            .map_err(io("write", &temp))?;
        file.sync_all().map_err(io("fsync", &temp))?;
        let path = self.dir.join(SNAPSHOT_FILE);
        std::fs::rename(&temp, &path).map_err(io("rename", &path))?;
        File::open(&self.dir)
            .and_then(|d| d.sync_all())
            .map_err(io("fsync", &self.dir))?;
        let ops_path = self.dir.join(OPS_FILE);
        self.ops.set_len(0).map_err(io("truncate", &ops_path))?;
        self.ops.sync_all().map_err(io("fsync", &ops_path))?;
        self.ops_bytes = 0;
        self.seek_end()
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
                assert_eq!(position, 0);
            }
            other => panic!("expected Corrupt, got {other:?}"),
        }
    }
}
