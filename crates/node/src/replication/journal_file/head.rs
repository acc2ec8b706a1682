//! The journal's head: a second copy of its newest markers, at a fixed place in the
//! file's first page, so that an open can tell writes a power loss lost from damage
//! at rest to records already reported.
//!
//! The marker appended after a sync is the only proof, in the records, that what
//! precedes it was reported; a zeroed sector at the tail can take a reported record
//! and its marker, or only writes that were never synced, and the records alone
//! cannot say which (the shell simulator's seeds 32436, 5928 and 44274: members left
//! untrusted by unsynced zeros, and a view change that waited for ever). The head is
//! rewritten in place with every marker, in the same sync, so what it claims is
//! durable before any op it covers is reported. It has two copies, written in turn: a
//! power loss tears or zeroes at most the one in flight (the other holds the claim
//! before, durable), a flipped bit takes one, and a zeroed page takes the magic too
//! (damage, found as such). Its CRCs are sealed with the journal's group ([`Seal`]):
//! another journal's head, written here by a misdirected write, is no claim.

use super::seal::Seal;
use super::{disk, io, JournalError, JournalFile, MAGIC};

/// Bytes of one copy: `synced_len: u64, op_max: u64, durable_len: u64, crc32c: u32`.
pub(super) const COPY_BYTES: usize = 8 + 8 + 8 + 4;
/// Bytes of the head: two copies.
pub(super) const HEAD_BYTES: usize = 2 * COPY_BYTES;

/// What the head says of the records after it (each claim was true when written).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(super) struct Head {
    /// Every record before this byte was synced by a sync that finished (for a
    /// partition, their batches too): the newest sync marker's `synced_len`.
    pub(super) synced_len: u64,
    /// The highest op held when it was written.
    pub(super) op_max: u64,
    /// Every record before this byte was made durable (the newest durability or sync
    /// marker's length).
    pub(super) durable_len: u64,
}

impl Head {
    /// The bytes before which nothing may be lost: a record there was made durable,
    /// and may have been reported or have a state write resting on it.
    pub(super) fn durable_end(&self) -> u64 {
        self.synced_len.max(self.durable_len)
    }

    /// The head's bytes: the claim, twice (a new file's, or a rewrite's).
    pub(super) fn encode(&self, seal: Seal) -> [u8; HEAD_BYTES] {
        let copy = self.encode_copy(seal);
        let mut out = [0; HEAD_BYTES];
        out[..COPY_BYTES].copy_from_slice(&copy);
        out[COPY_BYTES..].copy_from_slice(&copy);
        out
    }

    /// One copy's bytes. A marker's claim goes to one copy, the two in turn, so that
    /// the other keeps the claim before it, durable: a power loss that zeroes or
    /// tears the copy in flight leaves one intact (the shell simulator's seed 2022:
    /// both copies written at once were zeroed together, and the open fell back to
    /// guessing from the cut bytes, and took a member's lost unsynced writes for damage).
    pub(super) fn encode_copy(&self, seal: Seal) -> [u8; COPY_BYTES] {
        let mut copy = [0; COPY_BYTES];
        copy[..8].copy_from_slice(&self.synced_len.to_be_bytes());
        copy[8..16].copy_from_slice(&self.op_max.to_be_bytes());
        copy[16..24].copy_from_slice(&self.durable_len.to_be_bytes());
        let crc = crc32c::crc32c_append(seal.head_seed(), &copy[..24]);
        copy[24..].copy_from_slice(&crc.to_be_bytes());
        copy
    }

    /// Where copy `index` (0 or 1) lies within the head.
    pub(super) fn copy_at(index: u64) -> usize {
        (index % 2) as usize * COPY_BYTES
    }

    /// The claim the head's intact copies make, or `None` when neither is intact
    /// (both taken by writes a power loss zeroed, or by damage). Two intact copies
    /// that differ (a power loss landed one of the pair) give the larger of each
    /// field: the head is used only to say what may not be lost, so it may overstate
    /// what was reported, never understate it.
    pub(super) fn decode(bytes: &[u8], seal: Seal) -> Option<Self> {
        let intact: Vec<Self> = bytes
            .get(..HEAD_BYTES)?
            .chunks_exact(COPY_BYTES)
            .filter_map(|copy| Self::decode_copy(copy, seal))
            .collect();
        intact.into_iter().reduce(|a, b| Self {
            synced_len: a.synced_len.max(b.synced_len),
            op_max: a.op_max.max(b.op_max),
            durable_len: a.durable_len.max(b.durable_len),
        })
    }

    /// Which copy the next claim goes to: one that is not intact, else the one with
    /// the older claim, so that the newest durable claim is never the one in flight.
    /// (Always starting with the first after an open, a power loss during the first
    /// claim after a restart could tear the newest copy while the other held an older
    /// claim, both then less than what was durable.)
    pub(super) fn next_copy(bytes: &[u8], seal: Seal) -> u64 {
        let copy = |index: usize| {
            bytes
                .get(index * COPY_BYTES..(index + 1) * COPY_BYTES)
                .and_then(|copy| Self::decode_copy(copy, seal))
        };
        match (copy(0), copy(1)) {
            (None, _) => 0,
            (_, None) => 1,
            (Some(first), Some(second)) => {
                let claim = |h: Self| (h.durable_end(), h.synced_len, h.op_max);
                u64::from(claim(second) < claim(first))
            }
        }
    }

    /// Whether a head none of whose copies is intact ([`Head::decode`]) was damaged:
    /// a copy holds bytes other than zeros. A power loss leaves each copy as it was
    /// or as written, or zeros (an unsynced write, zero-filled, under the POSIX
    /// model); anything else is damage at rest, or another journal's head written
    /// here.
    pub(super) fn is_damage(bytes: &[u8]) -> bool {
        bytes.iter().take(HEAD_BYTES).any(|b| *b != 0)
    }

    fn decode_copy(copy: &[u8], seal: Seal) -> Option<Self> {
        let field = |at: usize| -> Option<u64> {
            Some(u64::from_be_bytes(copy.get(at..at + 8)?.try_into().ok()?))
        };
        let crc = u32::from_be_bytes(copy.get(24..28)?.try_into().ok()?);
        if crc32c::crc32c_append(seal.head_seed(), copy.get(..24)?) != crc {
            return None;
        }
        Some(Self {
            synced_len: field(0)?,
            op_max: field(8)?,
            durable_len: field(16)?,
        })
    }
}

impl JournalFile {
    /// Writes the head in place (durable with the sync that makes the marker it
    /// copies durable). A claim goes to the copy still in flight while no finished
    /// sync covers it, so that the other always holds a durable one. (Alternating
    /// regardless, the claims of syncs finishing off the shard one after the other,
    /// none covering the last, left both copies in flight; a power loss zeroed both,
    /// and the member restarted untrusted though nothing reported was lost: the shell
    /// simulator's seed 325700 with damage to sleeping files, whose other member had
    /// lost its disk, and whose view change waited for ever.)
    ///
    /// # Errors
    /// The write failed (the journal is poisoned).
    pub(super) fn write_head(&mut self) -> Result<(), JournalError> {
        if !self.headed {
            return Ok(());
        }
        if self.poisoned {
            return Err(JournalError::Poisoned(self.path()));
        }
        let file = self.handle()?;
        let copy = self.head().encode_copy(self.seal());
        let index = match self.head_pending {
            Some(_) => self.head_writes.wrapping_sub(1),
            None => self.head_writes,
        };
        let at = MAGIC.len() + Head::copy_at(index);
        if let Err(err) = disk::write_at(&file, &self.path(), &copy, at as u64) {
            self.poisoned = true;
            return Err(io(&self.path())(err));
        }
        if self.head_pending.is_none() {
            self.head_writes += 1;
        }
        self.head_pending = Some(self.len);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_head_survives_one_damaged_copy_and_zeros_are_no_claim() {
        let seal = Seal::of(7);
        let head = Head {
            synced_len: 4_100,
            op_max: 17,
            durable_len: 5_000,
        };
        let bytes = head.encode(seal);
        assert_eq!(Head::decode(&bytes, seal), Some(head));
        for bit in 0..HEAD_BYTES * 8 {
            let mut flipped = bytes;
            flipped[bit / 8] ^= 1 << (bit % 8);
            assert_eq!(Head::decode(&flipped, seal), Some(head), "bit {bit}");
        }
        assert_eq!(Head::decode(&[0; HEAD_BYTES], seal), None);
        assert_eq!(
            Head::decode(&bytes[..HEAD_BYTES - 1], seal),
            None,
            "cut short"
        );
        // One copy of a newer claim landed, the other kept the older one.
        let newer = Head {
            synced_len: 6_000,
            op_max: 19,
            durable_len: 5_000,
        };
        let mut mixed = head.encode(seal);
        mixed[..COPY_BYTES].copy_from_slice(&newer.encode(seal)[..COPY_BYTES]);
        assert_eq!(Head::decode(&mixed, seal), Some(newer));
        // Another group's head, whole, is no claim on this journal.
        assert_eq!(Head::decode(&bytes, Seal::of(8)), None);
        assert_eq!(Head::decode(&bytes, Seal::UNSEALED), None);
        // The next claim goes to the older copy, or to one that is not intact.
        assert_eq!(Head::next_copy(&mixed, seal), 1);
        let mut mixed = head.encode(seal);
        mixed[COPY_BYTES..].copy_from_slice(&newer.encode(seal)[COPY_BYTES..]);
        assert_eq!(Head::next_copy(&mixed, seal), 0);
        mixed[COPY_BYTES] ^= 1;
        assert_eq!(Head::next_copy(&mixed, seal), 1);
        assert_eq!(Head::next_copy(&[0; HEAD_BYTES], seal), 0);
    }
}
