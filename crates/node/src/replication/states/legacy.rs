//! The whole-table formats that came before the slots (`BRDVST01`, `BRDVST02`): read
//! once, at the upgrade to the slot layout.

use std::collections::BTreeMap;

use braid_vsr::DurableState;

use super::{be32, be64, Entry, Stamp, MAGIC_STAMPED, MAGIC_UNSTAMPED};

/// A whole table of the first formats: its batch number and its groups.
pub(super) fn decode_table(bytes: &[u8]) -> Result<(u64, BTreeMap<u64, Entry>), String> {
    /// Magic, batch number, count, and the CRC32C at the end.
    const FRAME_BYTES: usize = 8 + 8 + 4 + 4;
    let magic = bytes.get(..8);
    let stamped = magic == Some(MAGIC_STAMPED.as_slice());
    if bytes.len() < FRAME_BYTES || !(stamped || magic == Some(MAGIC_UNSTAMPED.as_slice())) {
        return Err(format!("{} bytes without the magic", bytes.len()));
    }
    let (body, crc) = bytes.split_at(bytes.len() - 4);
    if crc32c::crc32c(body) != be32(crc, 0) {
        return Err("checksum mismatch".into());
    }
    let batch = be64(body, 8);
    let count = be32(body, 16) as usize;
    let entries = &body[20..];
    let stamp_bytes = if stamped { Stamp::BYTES } else { 0 };
    let entry_bytes = 8 + stamp_bytes + DurableState::ENCODED_BYTES_V1;
    if entries.len() != count * entry_bytes {
        return Err(format!("{count} groups in {} bytes", entries.len()));
    }
    let mut states = BTreeMap::new();
    for entry in entries.chunks_exact(entry_bytes) {
        let (id, rest) = entry.split_at(8);
        let (stamp, slot) = rest.split_at(stamp_bytes);
        let stamp = match <[u8; Stamp::BYTES]>::try_from(stamp) {
            Ok(bytes) => Stamp::decode(bytes),
            Err(_) => Stamp::Unknown,
        };
        let (_, state) = DurableState::decode(slot).map_err(|e| e.to_string())?;
        states.insert(be64(id, 0), Entry { state, stamp });
    }
    Ok((batch, states))
}
