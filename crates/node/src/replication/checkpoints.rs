//! A group's newest checkpoint (its state machine at an op, for restart and state
//! transfer), kept as two copies: each write replaces the older copy whole, numbered
//! by a generation. A copy is `BRDCKP02`, the generation, the checkpoint's own
//! checksummed bytes, and a CRC32C over all of it: a flipped bit in the generation of
//! the older copy must not make it pass for the newer one (copies of the first layout,
//! the generation then the checkpoint, are still read).
//!
//! A new store first puts in place a copy saying "no checkpoint yet" (written, synced,
//! renamed), so from then on a copy that does not decode is damage, never "not
//! written yet". The replica prunes its journal below a checkpoint only once the
//! checkpoint is durable, so a torn write loses nothing: the other copy and the
//! journal hold what it would have.

use std::path::PathBuf;

use braid_vsr::Checkpoint;

use super::copies::{Newest, TwoCopies};
use super::shared_path::SharedPath;

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

const MAGIC: &[u8; 8] = b"BRDCKP02";

/// A copy: the magic, `generation: u64`, then nothing (no checkpoint yet) or a
/// checkpoint in `braid_vsr`'s checksummed layout, then a CRC32C over all before it.
fn encode(generation: u64, checkpoint: Option<&Checkpoint>) -> Vec<u8> {
    let mut bytes = MAGIC.to_vec();
    bytes.extend_from_slice(&generation.to_be_bytes());
    if let Some(checkpoint) = checkpoint {
        bytes.extend_from_slice(&checkpoint.encode());
    }
    let crc = crc32c::crc32c(&bytes);
    bytes.extend_from_slice(&crc.to_be_bytes());
    bytes
}

fn decode(bytes: &[u8]) -> Result<(u64, Option<Checkpoint>), String> {
    let Some(framed) = bytes.strip_prefix(MAGIC.as_slice()) else {
        return decode_unframed(bytes);
    };
    let (body, crc) = framed
        .split_last_chunk::<4>()
        .ok_or_else(|| format!("{} bytes", bytes.len()))?;
    if crc32c::crc32c(&bytes[..bytes.len() - 4]) != u32::from_be_bytes(*crc) {
        return Err("checksum mismatch".into());
    }
    decode_unframed(body)
}

/// The first layout: the generation, then the checkpoint or nothing.
fn decode_unframed(bytes: &[u8]) -> Result<(u64, Option<Checkpoint>), String> {
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
    /// Opens the copies `STEM.0` and `STEM.1` in `dir`: the newest intact checkpoint of
    /// `group`, or none if none was written. A copy that holds another group's
    /// checkpoint, whole and checksummed, is damage (a misdirected write can put one
    /// there: the shell simulator's seed 921 with misdirected writes refused to start
    /// a partition on it). With `made` (the group's durable state exists, and the
    /// copies are made before it), copies that are both gone are damage too, never a
    /// group that never checkpointed (found by an outside review: a lone node whose
    /// checkpoint files were deleted waited in a view change for ever, answering
    /// `NotLeader`).
    ///
    /// # Errors
    /// [`CheckpointError::Damaged`] when copies exist and none is intact, or none
    /// exists though `made`; IO.
    pub(crate) fn open(
        base: SharedPath,
        group: u64,
        made: bool,
    ) -> Result<(Self, Option<Checkpoint>), CheckpointError> {
        let io = |(path, source)| CheckpointError::Io { path, source };
        let dir = base.dir();
        braid_storage::create_dir_durable(dir).map_err(|source| CheckpointError::Io {
            path: dir.to_owned(),
            source,
        })?;
        let copies = TwoCopies::at(base);
        let of_group = |bytes: &[u8]| match decode(bytes)? {
            (_, Some(checkpoint)) if checkpoint.header.group != group => Err(format!(
                "it holds a checkpoint of group {}",
                checkpoint.header.group
            )),
            decoded => Ok(decoded),
        };
        let (generation, newest) = match copies.newest(of_group).map_err(io)? {
            Newest::Absent if made => {
                return Err(CheckpointError::Damaged(format!(
                    "both copies ({}.0 and .1) are gone while the group's durable state \
                     says they were made",
                    copies.base().display()
                )))
            }
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

    /// Checks that the copies read back as this store left them: the newest intact
    /// one of the generation it last wrote. (A lone replica's wake checks it: both
    /// copies damaged or deleted while its files slept went unnoticed, and the node
    /// took writes into a partition its next start refused: an outside review of
    /// issue 24.)
    ///
    /// # Errors
    /// [`CheckpointError::Damaged`] saying what it found, or IO.
    pub(crate) fn check_as_left(&self) -> Result<(), CheckpointError> {
        let newest = self
            .copies
            .newest(decode)
            .map_err(|(path, source)| CheckpointError::Io { path, source })?;
        let base = self.copies.base().display().to_string();
        match newest {
            Newest::Found(generation, _) if generation == self.generation => Ok(()),
            Newest::Found(generation, _) => Err(CheckpointError::Damaged(format!(
                "the newest intact copy of {base} is of generation {generation}, where \
                 generation {} was written",
                self.generation
            ))),
            Newest::Absent => Err(CheckpointError::Damaged(format!(
                "both copies ({base}.0 and .1) are gone"
            ))),
            Newest::Damaged(reason) => Err(CheckpointError::Damaged(reason)),
        }
    }

    /// Starts the copies again empty after both were found damaged ([`Self::open`]'s
    /// [`CheckpointError::Damaged`]): for a replica whose peers hold the state (it
    /// restarts as one that lost it, and installs a peer's checkpoint). Copy 0 is
    /// written anew; a damaged copy 1 is overwritten by the next write.
    ///
    /// # Errors
    /// IO.
    pub(crate) fn reset(base: SharedPath) -> Result<Self, CheckpointError> {
        let copies = TwoCopies::at(base);
        copies
            .install_first(&encode(0, None))
            .map_err(|(path, source)| CheckpointError::Io { path, source })?;
        Ok(Self {
            copies,
            generation: 0,
            poisoned: false,
        })
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
    use std::path::Path;

    fn copies_at(dir: &Path, stem: &str) -> SharedPath {
        SharedPath::whole(&dir.join(stem))
    }

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
        let (mut store, none) =
            CheckpointStore::open(copies_at(dir.path(), "meta.checkpoint"), 0, false).unwrap();
        assert!(none.is_none());
        // Ops of one parity would land on one copy if numbered by op: generations
        // alternate the copies whatever the ops.
        for op in [64, 128, 192] {
            store.write(&checkpoint(op)).unwrap();
        }
        let (_, newest) =
            CheckpointStore::open(copies_at(dir.path(), "meta.checkpoint"), 0, false).unwrap();
        assert_eq!(newest, Some(checkpoint(192)));
        // The newest copy (generation 3: copy 1) torn: the one before it.
        let path = dir.path().join("meta.checkpoint.1");
        assert!(path.exists());
        let mut bytes = std::fs::read(&path).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 1;
        std::fs::write(&path, &bytes).unwrap();
        let (_, older) =
            CheckpointStore::open(copies_at(dir.path(), "meta.checkpoint"), 0, false).unwrap();
        assert_eq!(older, Some(checkpoint(128)));
        std::fs::write(dir.path().join("meta.checkpoint.0"), b"junk").unwrap();
        assert!(matches!(
            CheckpointStore::open(copies_at(dir.path(), "meta.checkpoint"), 0, false),
            Err(CheckpointError::Damaged(_))
        ));
    }

    /// The shell simulator's seed 921 with misdirected writes: a page of another
    /// partition's checkpoint, whole and checksummed, landed over one copy, and the
    /// replica refused to start on it. A copy of another group's checkpoint is damage:
    /// the other copy is read.
    #[test]
    fn a_copy_of_another_groups_checkpoint_is_damage() {
        let dir = tempfile::tempdir().unwrap();
        let (mut ours, _) = CheckpointStore::open(copies_at(dir.path(), "ours"), 0, false).unwrap();
        ours.write(&checkpoint(64)).unwrap();
        ours.write(&checkpoint(128)).unwrap();
        let other = Checkpoint::new(
            Header {
                op: 192,
                ..Header::root(7)
            }
            .seal(),
            b"another group's state".to_vec(),
        );
        let (mut theirs, _) =
            CheckpointStore::open(copies_at(dir.path(), "theirs"), 7, false).unwrap();
        theirs.write(&other).unwrap();
        theirs.write(&other).unwrap();
        // Their newest copy (generation 2: copy 0) over our newest (copy 0).
        std::fs::copy(dir.path().join("theirs.0"), dir.path().join("ours.0")).unwrap();
        let (_, found) = CheckpointStore::open(copies_at(dir.path(), "ours"), 0, false).unwrap();
        assert_eq!(found, Some(checkpoint(64)), "the intact copy of our own");
        std::fs::copy(dir.path().join("theirs.1"), dir.path().join("ours.1")).unwrap();
        assert!(matches!(
            CheckpointStore::open(copies_at(dir.path(), "ours"), 0, false),
            Err(CheckpointError::Damaged(_))
        ));
    }

    /// Issue 24, finding 14: the generation lay outside every checksum, so a flipped
    /// bit there made the older copy pass for the newer. Every bit of either copy's
    /// generation flipped: the newest checkpoint, or the one before it when the newest
    /// copy itself is hit, never an older one taken for newer.
    #[test]
    fn a_flipped_generation_never_makes_the_older_copy_win() {
        let dir = tempfile::tempdir().unwrap();
        let (mut store, _) = CheckpointStore::open(copies_at(dir.path(), "c"), 0, false).unwrap();
        for op in [64, 128, 192] {
            store.write(&checkpoint(op)).unwrap();
        }
        // Generation 3 (op 192) is copy 1; generation 2 (op 128) is copy 0.
        for (copy, expected) in [(0, 192), (1, 128)] {
            let path = dir.path().join(format!("c.{copy}"));
            let pristine = std::fs::read(&path).unwrap();
            for at in MAGIC.len()..MAGIC.len() + 8 {
                for bit in 0..8 {
                    let mut bytes = pristine.clone();
                    bytes[at] ^= 1 << bit;
                    std::fs::write(&path, &bytes).unwrap();
                    let (_, found) =
                        CheckpointStore::open(copies_at(dir.path(), "c"), 0, false).unwrap();
                    assert_eq!(
                        found.map(|c| c.header.op),
                        Some(expected),
                        "copy {copy}, byte {at}, bit {bit}"
                    );
                }
            }
            std::fs::write(&path, &pristine).unwrap();
        }
        // A copy of the first layout (no magic, no CRC) is still read.
        let mut old = 9u64.to_be_bytes().to_vec();
        old.extend_from_slice(&checkpoint(256).encode());
        std::fs::write(dir.path().join("c.1"), &old).unwrap();
        let (_, found) = CheckpointStore::open(copies_at(dir.path(), "c"), 0, false).unwrap();
        assert_eq!(found.map(|c| c.header.op), Some(256));
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
            let (mut store, _) = CheckpointStore::open(copies_at(&dir, "c"), 0, false).unwrap();
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
                let opened =
                    CheckpointStore::open(copies_at(&out.join("replication"), "c"), 0, false);
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
