//! The recovery point: how far a partition's newest data is known to be synced, kept
//! in a small file beside the segments (as Kafka's recovery-point checkpoint).
//!
//! Opening after a crash treats damage at or above the recovery point as a torn tail:
//! bytes written but never synced may reach the disk in any order, so a zero page (an
//! unwritten extent) followed by a page that did reach the disk is what a power cut
//! leaves there, not a sign of a failing disk. Damage below it is refused (under
//! [`crate::RecoveryMode::Strict`]).
//!
//! `recovery-point`: `[magic "BRDRCP02"][segment base: u64][position: u64]
//! [crc32c: u32]`, 28 bytes, big-endian; the CRC-32C is of the log's partition tag (4
//! bytes, big-endian) followed by the 24 bytes before it, so that another partition's
//! recovery point written over this one (a misdirected write) reads as damage, not as a
//! claim about this log's segments. Written in place with
//! one `pwrite` after each sync that succeeded, not synced itself (a sync more per group
//! commit would halve its rate). After a power cut it may therefore lag the last
//! synced byte, never lead it: it is written only once the data it names is synced.

use std::path::{Path, PathBuf};

/// File name of the recovery point in a partition directory.
pub(crate) const RECOVERY_POINT_FILE: &str = "recovery-point";
const MAGIC: &[u8; 8] = b"BRDRCP02";
const BYTES: usize = 28;

/// Everything below `position` of the segment at `segment_base`, and all of every
/// older segment, was synced.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct RecoveryPoint {
    pub(crate) segment_base: u64,
    pub(crate) position: u64,
}

impl RecoveryPoint {
    /// The CRC of the first 24 bytes, seeded with the log's tag.
    fn crc(tag: i32, bytes: &[u8]) -> u32 {
        crc32c::crc32c_append(crc32c::crc32c(&tag.to_be_bytes()), bytes)
    }

    fn encode(self, tag: i32) -> [u8; BYTES] {
        let mut out = [0u8; BYTES];
        out[..8].copy_from_slice(MAGIC);
        out[8..16].copy_from_slice(&self.segment_base.to_be_bytes());
        out[16..24].copy_from_slice(&self.position.to_be_bytes());
        let crc = Self::crc(tag, &out[..24]);
        out[24..].copy_from_slice(&crc.to_be_bytes());
        out
    }

    fn decode(bytes: &[u8], tag: i32) -> Option<Self> {
        let bytes: &[u8; BYTES] = bytes.try_into().ok()?;
        let crc = u32::from_be_bytes([bytes[24], bytes[25], bytes[26], bytes[27]]);
        if &bytes[..8] != MAGIC || Self::crc(tag, &bytes[..24]) != crc {
            return None;
        }
        let word = |at: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&bytes[at..at + 8]);
            u64::from_be_bytes(w)
        };
        Some(Self {
            segment_base: word(8),
            position: word(16),
        })
    }

    fn path(dir: &Path) -> PathBuf {
        dir.join(RECOVERY_POINT_FILE)
    }

    /// The recovery point stored in `dir` for the log tagged `tag`, if there is an
    /// intact one.
    pub(crate) fn load(dir: &Path, tag: i32) -> Option<Self> {
        crate::disk::read(&Self::path(dir))
            .ok()
            .and_then(|bytes| Self::decode(&bytes, tag))
    }

    /// Stores the point in `dir` for the log tagged `tag`: unsynced when it goes up
    /// (see the module docs), synced (`durable`) when it goes down before a cut.
    ///
    /// # Errors
    /// The file could not be opened, written or synced.
    pub(crate) fn store(self, dir: &Path, tag: i32, durable: bool) -> std::io::Result<()> {
        let path = Self::path(dir);
        let (file, created) = crate::disk::open_or_create(&path)?;
        crate::disk::write_at(&file, &path, &self.encode(tag), 0)?;
        if durable && !created {
            crate::disk::sync_data(&file, &path)?;
        }
        if created {
            // Its name, once, so that a later power cut cannot lose the whole file.
            crate::disk::sync_data(&file, &path)?;
            crate::disk::sync_dir(dir)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TAG: i32 = 0x0002_0005;

    #[test]
    fn round_trips_and_refuses_damage() {
        let point = RecoveryPoint {
            segment_base: 52_113,
            position: 4096,
        };
        let bytes = point.encode(TAG);
        assert_eq!(RecoveryPoint::decode(&bytes, TAG), Some(point));
        for at in 0..BYTES {
            let mut damaged = bytes;
            damaged[at] ^= 1;
            assert_eq!(RecoveryPoint::decode(&damaged, TAG), None, "flip at {at}");
        }
        assert_eq!(RecoveryPoint::decode(&bytes[..27], TAG), None);
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(RecoveryPoint::load(dir.path(), TAG), None);
        point.store(dir.path(), TAG, false).unwrap();
        assert_eq!(RecoveryPoint::load(dir.path(), TAG), Some(point));
    }

    /// Another partition's recovery point (a misdirected write) claims nothing here.
    #[test]
    fn another_logs_point_is_damage() {
        let point = RecoveryPoint {
            segment_base: 0,
            position: 8192,
        };
        assert_eq!(RecoveryPoint::decode(&point.encode(TAG + 1), TAG), None);
    }
}
