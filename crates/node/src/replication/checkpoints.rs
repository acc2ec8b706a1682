//! A group's newest checkpoint (its state machine at an op, for restart and state
//! transfer), kept as two copies: each write replaces the older copy whole, numbered
//! by a generation before the checkpoint's own checksummed bytes.
//!
//! A new store first puts in place a copy saying "no checkpoint yet" (written, synced,
//! renamed), so from then on a copy that does not decode is damage, never "not
//! written yet". The replica prunes its journal below a checkpoint only once the
//! checkpoint is durable, so a torn write loses nothing: the other copy and the
//! journal hold what it would have.

use std::path::{Path, PathBuf};

use braid_vsr::Checkpoint;

use super::copies::{Newest, TwoCopies};

/// Why a checkpoint could not be read or written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub(crate) enum CheckpointError {
    /// A disk operation failed.
    #[error("checkpoint {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// Copies exist and none is intact.
    #[error("checkpoint copies are damaged: {0}")]
    Damaged(String),
    /// A write failed earlier: what reached the disk is unknown until a restart.
    #[error("the checkpoint store is poisoned by an earlier failed write; restart the node")]
    Poisoned,
}

/// One group's checkpoint copies.
#[derive(Debug)]
pub(crate) struct CheckpointStore {
    copies: TwoCopies,
    generation: u64,
    poisoned: bool,
}

/// A copy: `generation: u64`, then nothing (no checkpoint yet) or a checkpoint in
/// `braid_vsr`'s checksummed layout.
fn encode(generation: u64, checkpoint: Option<&Checkpoint>) -> Vec<u8> {
    let mut bytes = generation.to_be_bytes().to_vec();
    if let Some(checkpoint) = checkpoint {
        bytes.extend_from_slice(&checkpoint.encode());
    }
    bytes
}

fn decode(bytes: &[u8]) -> Result<(u64, Option<Checkpoint>), String> {
    let (generation, rest) = bytes
        .split_first_chunk::<8>()
        .ok_or_else(|| format!("{} bytes", bytes.len()))?;
    let checkpoint = if rest.is_empty() {
        // Only the first copy says "none", and it is put in place whole.
        None
    } else {
        Some(Checkpoint::decode(rest).map_err(|e| e.to_string())?)
    };
    Ok((u64::from_be_bytes(*generation), checkpoint))
}

impl CheckpointStore {
    /// Opens the copies `STEM.0` and `STEM.1` in `dir`: the newest intact checkpoint,
    /// or none if none was written.
    ///
    /// # Errors
    /// [`CheckpointError::Damaged`] when copies exist and none is intact, or IO.
    pub(crate) fn open(
        dir: &Path,
        stem: &str,
    ) -> Result<(Self, Option<Checkpoint>), CheckpointError> {
        let io = |(path, source)| CheckpointError::Io { path, source };
        braid_storage::create_dir_durable(dir).map_err(|source| CheckpointError::Io {
            path: dir.to_owned(),
            source,
        })?;
        let copies = TwoCopies::new(dir, stem);
        let (generation, newest) = match copies.newest(decode).map_err(io)? {
            Newest::Absent => {
                copies.install_first(&encode(0, None)).map_err(io)?;
                (0, None)
            }
            Newest::Found(generation, checkpoint) => (generation, checkpoint),
            Newest::Damaged(reason) => return Err(CheckpointError::Damaged(reason)),
        };
        let store = Self {
            copies,
            generation,
            poisoned: false,
        };
        Ok((store, newest))
    }

    /// Writes `checkpoint` over the older copy and syncs it; the replica may prune
    /// below it once this returns.
    ///
    /// # Errors
    /// An IO error poisons the store.
    pub(crate) fn write(&mut self, checkpoint: &Checkpoint) -> Result<(), CheckpointError> {
        if self.poisoned {
            return Err(CheckpointError::Poisoned);
        }
        let generation = self.generation + 1;
        let bytes = encode(generation, Some(checkpoint));
        if let Err((path, source)) = self.copies.write(generation, &bytes) {
            self.poisoned = true;
            return Err(CheckpointError::Io { path, source });
        }
        self.generation = generation;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use braid_storage::disk::hook;
    use braid_vsr::Header;

    fn checkpoint(op: u64) -> Checkpoint {
        let header = Header {
            op,
            ..Header::root(0)
        }
        .seal();
        Checkpoint::new(header, format!("state at {op}").into_bytes())
    }

    #[test]
    fn the_newest_intact_checkpoint_is_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let (mut store, none) = CheckpointStore::open(dir.path(), "meta.checkpoint").unwrap();
        assert!(none.is_none());
        // Ops of one parity would land on one copy if numbered by op: generations
        // alternate the copies whatever the ops.
        for op in [64, 128, 192] {
            store.write(&checkpoint(op)).unwrap();
        }
        let (_, newest) = CheckpointStore::open(dir.path(), "meta.checkpoint").unwrap();
        assert_eq!(newest, Some(checkpoint(192)));
        // The newest copy (generation 3: copy 1) torn: the one before it.
        let path = dir.path().join("meta.checkpoint.1");
        assert!(path.exists());
        let mut bytes = std::fs::read(&path).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 1;
        std::fs::write(&path, &bytes).unwrap();
        let (_, older) = CheckpointStore::open(dir.path(), "meta.checkpoint").unwrap();
        assert_eq!(older, Some(checkpoint(128)));
        std::fs::write(dir.path().join("meta.checkpoint.0"), b"junk").unwrap();
        assert!(matches!(
            CheckpointStore::open(dir.path(), "meta.checkpoint"),
            Err(CheckpointError::Damaged(_))
        ));
    }

    /// Every crash state at every sync boundary opens to the last checkpoint written,
    /// or the one being written, or (before the first returned) none.
    #[test]
    fn every_crash_state_holds_the_last_written_checkpoint_or_the_next() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("replication");
        hook::start_tracing();
        let trace_len = hook::trace_len;
        let ops = [64u64, 128, 192, 256];
        let mut acks = Vec::new();
        {
            let (mut store, _) = CheckpointStore::open(&dir, "c").unwrap();
            acks.push(trace_len());
            for op in ops {
                store.write(&checkpoint(op)).unwrap();
                acks.push(trace_len());
            }
        }
        let trace = hook::take().unwrap().trace;
        let checked =
            braid_storage::crash::for_each_crash_state(&trace, root.path(), |at, how, out| {
                let written = acks.iter().filter(|&&events| events <= at).count();
                let opened = CheckpointStore::open(&out.join("replication"), "c");
                let found = match opened {
                    Ok((_, found)) => found,
                    Err(err) => panic!("cut at {at}, {how}: {err}"),
                };
                let found = found.map(|c| c.header.op);
                let last = written.checked_sub(2).map(|i| ops[i]);
                let next = written.checked_sub(1).and_then(|i| ops.get(i).copied());
                assert!(
                    found == last || found == next,
                    "cut at {at}, {how}: {found:?}, written {last:?}, next {next:?}"
                );
            });
        assert!(checked > 20, "{checked} crash states");
    }
}
