//! The log's start: the first offset the log keeps, in a small file beside the segments,
//! so that a first segment gone (deleted, or its directory entry lost) is damage, never
//! taken for retention (a review's finding: a lone node whose first segment was deleted
//! served from the second, and a member hid the records its peers still held).
//!
//! `log-start`: `[magic "BRDLST01"][start: u64][crc32c: u32]`, 20 bytes, big-endian;
//! the CRC-32C is of the log's partition tag (4 bytes, big-endian) followed by the 16
//! bytes before it (another partition's file written here reads as damage). Stored and
//! synced before retention deletes a segment or a reset starts the log elsewhere, so
//! the start on disk is never above the first segment kept: one below it names
//! segments that are gone.

use std::path::{Path, PathBuf};

/// File name of the log's start in a partition directory.
pub(crate) const LOG_START_FILE: &str = "log-start";
const MAGIC: &[u8; 8] = b"BRDLST01";
const BYTES: usize = 20;

fn crc(tag: i32, bytes: &[u8]) -> u32 {
    crc32c::crc32c_append(crc32c::crc32c(&tag.to_be_bytes()), bytes)
}

fn encode(start: u64, tag: i32) -> [u8; BYTES] {
    let mut out = [0u8; BYTES];
    out[..8].copy_from_slice(MAGIC);
    out[8..16].copy_from_slice(&start.to_be_bytes());
    let crc = crc(tag, &out[..16]);
    out[16..].copy_from_slice(&crc.to_be_bytes());
    out
}

fn decode(bytes: &[u8], tag: i32) -> Option<u64> {
    let bytes: &[u8; BYTES] = bytes.try_into().ok()?;
    let stored = u32::from_be_bytes([bytes[16], bytes[17], bytes[18], bytes[19]]);
    if &bytes[..8] != MAGIC || crc(tag, &bytes[..16]) != stored {
        return None;
    }
    let mut word = [0u8; 8];
    word.copy_from_slice(&bytes[8..16]);
    Some(u64::from_be_bytes(word))
}

fn path(dir: &Path) -> PathBuf {
    dir.join(LOG_START_FILE)
}

/// What `dir` says of the start of the log tagged `tag`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stored {
    /// No file: a log made before the file was kept.
    Absent,
    /// A file that does not check (damaged, or another log's).
    Damaged,
    Start(u64),
}

/// The start stored in `dir` for the log tagged `tag`.
///
/// # Errors
/// The file exists and cannot be read.
pub(crate) fn load(dir: &Path, tag: i32) -> std::io::Result<Stored> {
    match crate::disk::read(&path(dir)) {
        Ok(bytes) => Ok(decode(&bytes, tag).map_or(Stored::Damaged, Stored::Start)),
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(Stored::Absent),
        Err(err) => Err(err),
    }
}

/// Stores `start` in `dir` for the log tagged `tag`, synced (and its directory entry,
/// when the file is new).
///
/// # Errors
/// The file could not be opened, written or synced.
pub(crate) fn store(dir: &Path, start: u64, tag: i32) -> std::io::Result<()> {
    let path = path(dir);
    let (file, created) = crate::disk::open_or_create(&path)?;
    crate::disk::write_at(&file, &path, &encode(start, tag), 0)?;
    crate::disk::set_len(&file, &path, BYTES as u64)?;
    crate::disk::sync_data(&file, &path)?;
    if created {
        crate::disk::sync_dir(dir)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_refuses_damage_and_other_logs() {
        let bytes = encode(52_113, 7);
        assert_eq!(decode(&bytes, 7), Some(52_113));
        assert_eq!(decode(&bytes, 8), None, "another log's");
        for at in 0..BYTES {
            let mut damaged = bytes;
            damaged[at] ^= 1;
            assert_eq!(decode(&damaged, 7), None, "flip at {at}");
        }
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(load(dir.path(), 7).unwrap(), Stored::Absent);
        store(dir.path(), 900, 7).unwrap();
        store(dir.path(), 901, 7).unwrap();
        assert_eq!(load(dir.path(), 7).unwrap(), Stored::Start(901));
        assert_eq!(load(dir.path(), 3).unwrap(), Stored::Damaged);
    }
}
