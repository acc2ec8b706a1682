//! What the simulator reads of a member's files, and the damage it does to them.

use std::collections::BTreeMap;
use std::path::PathBuf;

use braid_proto::RecordBatch;
use braid_sim::Prng;

/// Why a read of a log stopped before the end asked for.
#[derive(Debug)]
pub(super) enum Stop {
    /// A batch there does not check (damage at rest): a reader is refused from there.
    Damaged(String),
    /// Nothing there: the log does not hold what it promised.
    Missing(String),
}

impl std::fmt::Display for Stop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Damaged(what) | Self::Missing(what) => f.write_str(what),
        }
    }
}

/// The batches of `log` from `from` (or its start, if later) below `end` that a
/// reader would be served (each checked, as the node's reads check them): (base
/// offset, bytes), and why the read stopped short, if it did.
pub(super) fn read_batches(
    log: &mut braid_storage::PartitionLog,
    from: u64,
    end: u64,
) -> (Vec<(u64, Vec<u8>)>, Option<Stop>) {
    let mut out = Vec::new();
    let mut at = from.max(log.start_offset());
    while at < end {
        let mut read = match log.read(at, 1 << 20, end) {
            Ok(read) => read,
            Err(err @ braid_storage::LogError::Corrupt { .. }) => {
                return (out, Some(Stop::Damaged(err.to_string())))
            }
            Err(err) => return (out, Some(Stop::Missing(err.to_string()))),
        };
        if read.batch_count == 0 || read.next_offset <= at {
            return (
                out,
                Some(Stop::Missing(format!(
                    "the log reads nothing at {at} below {end}"
                ))),
            );
        }
        let damaged = read.keep_verified();
        let mut bytes = read.bytes();
        while !bytes.is_empty() {
            let Ok((batch, used)) = RecordBatch::validate(bytes) else {
                return (
                    out,
                    Some(Stop::Damaged(format!(
                        "at {at}: a batch whose CRC checks does not validate"
                    ))),
                );
            };
            let base = u64::try_from(batch.header().base_offset).unwrap_or(u64::MAX);
            out.push((base, bytes[..used].to_vec()));
            bytes = &bytes[used..];
        }
        if let Some(offset) = damaged {
            return (
                out,
                Some(Stop::Damaged(format!("the batch at {offset} is damaged"))),
            );
        }
        at = read.next_offset;
    }
    (out, None)
}

/// The kinds of damage at rest beside flipped bits and zeroed pages (each off by
/// default, so that the seeds' draws without it stay as they were).
#[derive(Debug, Clone, Copy)]
pub(super) struct DamageKinds {
    /// A page of one file written over another page of it or of another file.
    pub(super) misdirected: bool,
    /// A page every read of fails (EIO) until it is written again.
    pub(super) latent: bool,
}

/// Damages one file under `dir` at rest, as a disk does: a flipped bit, or a zeroed
/// 4 KiB page (a lost write), or, with `misdirected`, a 4 KiB page of one file
/// written over another page of the same file or of another (a write that landed in
/// the wrong place: well-formed bytes where they do not belong), or, with `latent`, a
/// 4 KiB page the disk can no longer read (a latent sector error: every read of it
/// fails until a write covers it; marked in this thread's disk hook). Returns what was
/// done, if any file was there to damage.
pub(super) fn damage_at_rest(
    dir: &std::path::Path,
    draws: &mut Prng,
    kinds: DamageKinds,
) -> std::io::Result<Option<String>> {
    let mut files = Vec::new();
    let mut dirs = vec![dir.to_owned()];
    while let Some(d) = dirs.pop() {
        let mut entries: Vec<PathBuf> = std::fs::read_dir(&d)?
            .map(|e| e.map(|e| e.path()))
            .collect::<Result<_, _>>()?;
        entries.sort();
        for path in entries {
            // The identity file is left whole: a damaged one refuses the start by
            // design (the operator restores it; `identity.rs` tests that), and a
            // member that does not start is no finding here.
            let identity = path.file_name() == Some(crate::identity::IDENTITY_FILE.as_ref());
            if path.is_dir() {
                dirs.push(path);
            } else if !identity && std::fs::metadata(&path)?.len() > 0 {
                files.push(path);
            }
        }
    }
    files.sort();
    let Some(path) = files.get(draws.below(files.len() as u64) as usize) else {
        return Ok(None);
    };
    let mut bytes = std::fs::read(path)?;
    let len = bytes.len() as u64;
    if kinds.latent && draws.chance(25) {
        let page = draws.below(len.div_ceil(4096)) * 4096;
        braid_storage::disk::hook::mark_unreadable(path, page, page + 4096);
        return Ok(Some(format!(
            "page at {page} of {} unreadable (latent sector error)",
            path.display()
        )));
    }
    if kinds.misdirected && draws.chance(30) {
        let source = &files[draws.below(files.len() as u64) as usize];
        let source_bytes = std::fs::read(source)?;
        let from = draws.below((source_bytes.len() as u64).div_ceil(4096)) as usize * 4096;
        let page = &source_bytes[from..(from + 4096).min(source_bytes.len())];
        let to = draws.below(len.div_ceil(4096)) as usize * 4096;
        let end = (to + page.len()).min(bytes.len());
        bytes[to..end].copy_from_slice(&page[..end - to]);
        std::fs::write(path, &bytes)?;
        return Ok(Some(format!(
            "page at {from} of {} written over the page at {to} of {}",
            source.display(),
            path.display()
        )));
    }
    let what = if draws.chance(80) {
        let at = draws.below(len) as usize;
        let bit = draws.below(8);
        bytes[at] ^= 1 << bit;
        format!("bit {bit} of byte {at} of {} flipped", path.display())
    } else {
        let page = draws.below(len.div_ceil(4096)) as usize * 4096;
        let end = (page + 4096).min(bytes.len());
        bytes[page..end].fill(0);
        format!("page at {page} of {} zeroed", path.display())
    };
    std::fs::write(path, &bytes)?;
    Ok(Some(what))
}

/// Damages the files of a partition whose files sleep while its member runs (`dir`,
/// the partition's directory): one file removed (a segment, the journal, a checkpoint
/// copy, a marker), or damaged as [`damage_at_rest`] does. Returns what was done.
pub(super) fn damage_asleep(
    dir: &std::path::Path,
    draws: &mut Prng,
    kinds: DamageKinds,
) -> std::io::Result<Option<String>> {
    if draws.chance(30) {
        let mut files: Vec<PathBuf> = std::fs::read_dir(dir)?
            .map(|e| e.map(|e| e.path()))
            .collect::<Result<_, _>>()?;
        files.retain(|path| path.is_file());
        files.sort();
        let Some(path) = files.get(draws.below(files.len() as u64) as usize) else {
            return Ok(None);
        };
        std::fs::remove_file(path)?;
        return Ok(Some(format!("{} removed", path.display())));
    }
    damage_at_rest(dir, draws, kinds)
}

/// The value of every record in `batches`, by offset.
pub(super) fn values_of(
    batches: &[(u64, Vec<u8>)],
) -> Result<BTreeMap<u64, Option<Vec<u8>>>, String> {
    let mut values = BTreeMap::new();
    for (base, bytes) in batches {
        let (batch, _) =
            RecordBatch::validate(bytes).map_err(|e| format!("batch at {base}: {e}"))?;
        for record in batch.records() {
            let record = record.map_err(|e| format!("batch at {base}: {e}"))?;
            let offset = base + u64::try_from(record.offset_delta).unwrap_or(0);
            values.insert(offset, record.value.map(<[u8]>::to_vec));
        }
    }
    Ok(values)
}

/// A batch's offset, epoch and values, for a failure's report.
pub(super) fn describe_batch((base, bytes): &(u64, Vec<u8>)) -> String {
    let Ok((batch, _)) = RecordBatch::validate(bytes) else {
        return format!("{base}: damaged");
    };
    let values: Vec<String> = batch
        .records()
        .filter_map(Result::ok)
        .map(|r| String::from_utf8_lossy(r.value.unwrap_or_default()).into_owned())
        .collect();
    format!(
        "{base} (epoch {}) {values:?}",
        batch.header().partition_leader_epoch
    )
}
