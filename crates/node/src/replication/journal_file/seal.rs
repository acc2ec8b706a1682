//! What a journal's CRCs are seeded with, so that well-formed bytes written where they
//! do not belong fail their check.
//!
//! A misdirected write (a disk's write that lands in the wrong place) leaves bytes
//! that are intact in themselves. Records framed alike in every journal would pass
//! anywhere: the shell simulator's seed 300343 (damage at rest, misdirected writes)
//! put the metadata journal's first page over a partition's `vsr.journal`, whose first
//! records had the same sizes; the partition read the metadata group's op 1 as its own,
//! and repairing that op cut the thirty acknowledged ops above it. So every record's
//! CRC starts from the owning group's id and the record's byte position, and the
//! head's from the group's id: another journal's records, or this journal's records
//! at another place, are damage, found as such.

/// The seed of a journal's CRCs: its group's id, or nothing for a file written before
/// seals (`BRDJNL01`, `BRDJNL02`), read and appended to as it was until it is
/// rewritten.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Seal(Option<u64>);

impl Seal {
    /// A file from before seals: CRCs start from zero.
    pub(crate) const UNSEALED: Self = Self(None);

    /// The seal of group `group`'s journal.
    pub(crate) fn of(group: u64) -> Self {
        Self(Some(group))
    }

    /// Whether the file's CRCs are seeded.
    pub(crate) fn is_sealed(self) -> bool {
        self.0.is_some()
    }

    /// The CRC a record at byte `at` starts from.
    pub(crate) fn record_seed(self, at: u64) -> u32 {
        match self.0 {
            None => 0,
            Some(group) => {
                let mut seed = [0; 16];
                seed[..8].copy_from_slice(&group.to_be_bytes());
                seed[8..].copy_from_slice(&at.to_be_bytes());
                crc32c::crc32c(&seed)
            }
        }
    }

    /// The CRC a head copy starts from.
    pub(crate) fn head_seed(self) -> u32 {
        self.0
            .map_or(0, |group| crc32c::crc32c(&group.to_be_bytes()))
    }
}
