//! The bytes of a states copy: its header and its slots, each with its checksums.

use super::*;

/// How a table's checksums are seeded: with its format's magic and, since
/// `BRDVST04`, with the table's name (`metadata/shard-0`, `replication/shard-1`), so
/// that no other format's sum passes, nor a slot of another table that a misdirected
/// write put here (the shell simulator's seed 1962 with misdirected writes: a page of a
/// partitions table over the metadata table's copy rolled the metadata group back to
/// no state, and an acknowledged stream creation was lost).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Sums {
    magic: &'static [u8; 8],
    seed: u32,
}

impl Sums {
    /// The sums of the table named `name`, in the current format.
    pub(super) fn of_table(name: &str) -> Self {
        Self {
            magic: MAGIC,
            seed: crc32c::crc32c_append(crc32c::crc32c(MAGIC), name.as_bytes()),
        }
    }

    /// The sums of the format before (`BRDVST03`): seeded with its magic alone.
    pub(super) fn unsalted() -> Self {
        Self {
            magic: MAGIC_UNSALTED,
            seed: crc32c::crc32c(MAGIC_UNSALTED),
        }
    }

    /// Whether these are the sums of the format before.
    pub(super) fn is_unsalted(self) -> bool {
        self.magic == MAGIC_UNSALTED
    }

    /// The CRC32C of `bytes`, seeded.
    pub(super) fn checksum(self, bytes: &[u8]) -> u32 {
        crc32c::crc32c_append(self.seed, bytes)
    }
}

pub(super) fn be32(bytes: &[u8], at: usize) -> u32 {
    let mut b = [0u8; 4];
    b.copy_from_slice(&bytes[at..at + 4]);
    u32::from_be_bytes(b)
}

pub(super) fn be64(bytes: &[u8], at: usize) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&bytes[at..at + 8]);
    u64::from_be_bytes(b)
}

/// The header: magic, slot size `u32`, slot count `u32`, zeros, CRC32C at the end.
pub(super) fn encode_header(count: u32, sums: Sums) -> [u8; HEADER_BYTES] {
    let mut out = [0u8; HEADER_BYTES];
    out[..8].copy_from_slice(sums.magic);
    out[8..12].copy_from_slice(&(SLOT_BYTES as u32).to_be_bytes());
    out[12..16].copy_from_slice(&count.to_be_bytes());
    let sum = sums.checksum(&out[..HEADER_BYTES - 4]);
    out[HEADER_BYTES - 4..].copy_from_slice(&sum.to_be_bytes());
    out
}

/// A copy's slot count, or why its header is not intact.
pub(super) fn decode_header(bytes: &[u8], sums: Sums) -> Result<u32, String> {
    let Some(header) = bytes.get(..HEADER_BYTES) else {
        return Err(format!("{} bytes, short of a header", bytes.len()));
    };
    if &header[..8] != sums.magic {
        return Err("no magic".into());
    }
    if sums.checksum(&header[..HEADER_BYTES - 4]) != be32(header, HEADER_BYTES - 4) {
        return Err("header checksum mismatch (or another table's header)".into());
    }
    if be32(header, 8) != SLOT_BYTES as u32 {
        return Err(format!("slots of {} bytes", be32(header, 8)));
    }
    Ok(be32(header, 12))
}

pub(super) fn slot_offset(index: u32) -> u64 {
    (HEADER_BYTES + index as usize * SLOT_BYTES) as u64
}

/// `slots` as runs of consecutive slots, one write each: offset, bytes.
pub(super) fn runs(slots: &BTreeMap<u32, [u8; SLOT_BYTES]>) -> Vec<(u64, Vec<u8>)> {
    let mut runs: Vec<(u64, Vec<u8>)> = Vec::new();
    let mut next = None;
    for (&index, bytes) in slots {
        match runs.last_mut() {
            Some((_, run)) if next == Some(index) => run.extend_from_slice(bytes),
            _ => runs.push((slot_offset(index), bytes.to_vec())),
        }
        next = Some(index + 1);
    }
    runs
}

pub(super) fn encode_slot(index: u32, seq: u64, content: Content, sums: Sums) -> [u8; SLOT_BYTES] {
    let mut out = [0u8; SLOT_BYTES];
    let (kind, group) = match content {
        Content::Free => (KIND_FREE, 0),
        Content::Used(group, _) => (KIND_USED, group),
    };
    out[0..4].copy_from_slice(&index.to_be_bytes());
    out[4..8].copy_from_slice(&kind.to_be_bytes());
    out[8..16].copy_from_slice(&seq.to_be_bytes());
    out[16..24].copy_from_slice(&group.to_be_bytes());
    let identity = sums.checksum(&out[..IDENTITY_BYTES]);
    out[IDENTITY_BYTES..STAMP_AT].copy_from_slice(&identity.to_be_bytes());
    if let Content::Used(_, entry) = content {
        out[STAMP_AT..STATE_AT].copy_from_slice(&entry.stamp.encode());
        out[STATE_AT..STATE_AT + DurableState::ENCODED_BYTES]
            .copy_from_slice(&entry.state.encode(seq));
    }
    let sum = sums.checksum(&out[..CHECKSUM_AT]);
    out[CHECKSUM_AT..].copy_from_slice(&sum.to_be_bytes());
    out
}

/// Reads slot `index` from its bytes.
pub(super) fn decode_slot(index: u32, bytes: &[u8], sums: Sums) -> SlotRead {
    debug_assert_eq!(bytes.len(), SLOT_BYTES);
    let kind = be32(bytes, 4);
    let identity_intact = sums.checksum(&bytes[..IDENTITY_BYTES]) == be32(bytes, IDENTITY_BYTES)
        && be32(bytes, 0) == index
        && (kind == KIND_FREE || kind == KIND_USED);
    if !identity_intact {
        return SlotRead::Damaged(None);
    }
    let seq = be64(bytes, 8);
    let group = be64(bytes, 16);
    let claim = (seq, (kind == KIND_USED).then_some(group));
    if sums.checksum(&bytes[..CHECKSUM_AT]) != be32(bytes, CHECKSUM_AT) {
        return SlotRead::Damaged(Some(claim));
    }
    if kind == KIND_FREE {
        return SlotRead::Intact(seq, Content::Free);
    }
    let mut stamp = [0u8; Stamp::BYTES];
    stamp.copy_from_slice(&bytes[STAMP_AT..STATE_AT]);
    // A slot written before the flags word holds the first, shorter layout.
    match DurableState::decode_prefix(&bytes[STATE_AT..CHECKSUM_AT]) {
        Ok(((state_seq, state), _)) if state_seq == seq => {
            let stamp = Stamp::decode(stamp);
            SlotRead::Intact(seq, Content::Used(group, Entry { state, stamp }))
        }
        _ => SlotRead::Damaged(Some(claim)),
    }
}
