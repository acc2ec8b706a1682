//! The durable states (view, log view, commit, journal trusted through) of every group
//! a shard hosts: one fixed slot per group in each of two copies, `shard-N.0` and
//! `shard-N.1`. A batch of state changes costs what changed: the staged slots are
//! written to copy 0 and synced, then the same slots to copy 1 and synced. Two
//! `fdatasync`s however many groups changed, a few hundred bytes for one group among
//! ten thousand, and nothing at all while nothing changes.
//!
//! # Layout
//!
//! A copy is a 128-byte header (magic `BRDVST03`, the slot size, the slots counted,
//! CRC32C) and then the slots, 128 bytes each, slot `i` at `128 * (i + 1)`. A slot
//! holds its own index, its kind (free or used), the sequence number of the write that
//! wrote it, the group, a CRC32C of those four (its identity), then the group's boot
//! [`Stamp`] (see [`super::boot`]) and `DurableState`, and a CRC32C of the whole slot.
//! A group takes a slot when first staged (the lowest freed one, else a new one) and
//! keeps it until removed; its removal writes the slot free. The header is rewritten
//! only when the count of slots grows. Slots are aligned so that no slot straddles a
//! sector or a page: a torn write tears whole slots.
//!
//! # Why a damaged copy cannot roll a group back
//!
//! The copies are written in turn, never at once: copy 1 only after copy 0 is synced,
//! and a state is reported written only once both are. So every state ever reported is
//! in both copies, and a crash tears at most the copy in flight, whose slots belong to
//! the batch not yet reported. On open, each slot is taken from the intact copy with
//! the higher sequence number. A bit flip, a lost or zeroed sector, or a misdirected
//! write (a slot names its index, so another slot's bytes fail there) damages one
//! copy; the other still holds the newest reported state. Before it returns, open
//! copies each such slot's bytes from the copy that holds it into the one that does
//! not (never writing the only good copy, which a crash could then tear), so no
//! replica acts on a state only one copy holds. A copy whose slot is older (the batch
//! in flight at a crash) is brought level the same way.
//!
//! A slot damaged in both copies is never guessed at. Its identity has a checksum of
//! its own, so damage to the state alone still says which group the slot held: that
//! group is reported in [`GroupStates::damaged_groups`] (the caller restarts it as a
//! replica that lost its disk, or refuses to start), and a slot that names no group in
//! either copy refuses the open, naming the files and the offset. The header counts the
//! slots, so a zeroed or lost slot below the count is damage, never "not written yet".
//! (A slot damaged at rest in one copy is found only by an open: if a write of the same
//! slot then tears the other copy, the group is reported, not rolled back.)
//! Both copies missing is a new shard ([`GroupStates::was_created`] says so, for a
//! caller that knows the directory held data); one copy missing is rebuilt from the
//! other.
//!
//! The first formats (`BRDVST01` without stamps, `BRDVST02`) were the whole table in
//! each copy, rewritten at every write. Such a table is read once and put in place in
//! the new layout, each copy written, synced and renamed over the old one.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use braid_storage::disk;
use braid_vsr::DurableState;

use super::boot::{BootId, Stamp};

/// The magic of the slotted layout.
const MAGIC: &[u8; 8] = b"BRDVST03";
/// The whole-table format with stamps, read to upgrade.
const MAGIC_STAMPED: &[u8; 8] = b"BRDVST02";
/// The table's first format: entries without a stamp, read to upgrade.
const MAGIC_UNSTAMPED: &[u8; 8] = b"BRDVST01";
/// Bytes of one slot, and of the header before the first.
const SLOT_BYTES: usize = 128;
const HEADER_BYTES: usize = SLOT_BYTES;
/// A slot's identity: index `u32`, kind `u32`, sequence `u64`, group `u64`.
const IDENTITY_BYTES: usize = 24;
const STAMP_AT: usize = IDENTITY_BYTES + 4;
const STATE_AT: usize = STAMP_AT + Stamp::BYTES;
const CHECKSUM_AT: usize = SLOT_BYTES - 4;
const KIND_FREE: u32 = u32::from_be_bytes(*b"FREE");
const KIND_USED: u32 = u32::from_be_bytes(*b"USED");
/// The smallest unit a disk tears a write at.
const SECTOR_BYTES: usize = 512;
/// Damaged slots warned of one by one per copy at open; the rest are counted.
const WARNINGS_PER_COPY_MAX: usize = 8;

// The state fits before the checksum.
const _: () = assert!(STATE_AT + DurableState::ENCODED_BYTES <= CHECKSUM_AT);
// No slot straddles a sector: a torn write leaves each slot whole, old or new.
const _: () =
    assert!(SECTOR_BYTES.is_multiple_of(SLOT_BYTES) && HEADER_BYTES.is_multiple_of(SLOT_BYTES));

/// Why the states could not be read or written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub(crate) enum StatesError {
    /// A disk operation failed.
    #[error("replica states {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// Neither copy is intact (its header, or an old table).
    #[error(
        "replica states in {dir}: no intact copy ({reason}); the replicas' views cannot \
         be recovered, so the node does not start"
    )]
    NoIntactCopy {
        /// The directory.
        dir: PathBuf,
        /// What was wrong with each copy.
        reason: String,
    },
    /// A slot is damaged in both copies and neither says whose it was.
    #[error(
        "replica states {files}: the slot at offset {offset} is damaged in both copies \
         and names no group; whose state was lost cannot be known, so the node does not \
         start"
    )]
    Unattributable {
        /// The copies.
        files: String,
        /// The slot's offset in each.
        offset: u64,
    },
    /// A write failed earlier: what reached the disk is unknown until a restart.
    #[error("replica states are poisoned by an earlier failed write; restart the node")]
    Poisoned,
}

/// One group's state and stamp.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Entry {
    state: DurableState,
    stamp: Stamp,
}

/// What a slot holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Content {
    Free,
    Used(u64, Entry),
}

impl Content {
    fn group(self) -> Option<u64> {
        match self {
            Self::Free => None,
            Self::Used(group, _) => Some(group),
        }
    }
}

/// What a slot's identity proves when the rest of it is damaged: the sequence number
/// of the write, and the group (`None`: the slot was free).
type Claim = (u64, Option<u64>);

/// What one copy of a slot says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SlotRead {
    /// Intact, written with this sequence number.
    Intact(u64, Content),
    /// Damaged; what its identity still proves, if it is intact.
    Damaged(Option<Claim>),
    /// At or past the count of slots the copy's intact header gives.
    Beyond,
    /// The copy is missing, or a table from before the upgrade.
    Absent,
}

/// Where open found a proven slot's content.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    /// Both copies hold it.
    Both,
    /// Only this copy: its bytes are copied into the other, and it is not written.
    Copy(usize),
    /// Neither holds it as it must now read (free): written anew to both, in turn.
    New,
}

/// What open makes of one slot from its two copies.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Resolved {
    /// The slot's newest content, and where it is.
    Proven {
        seq: u64,
        content: Content,
        source: Source,
    },
    /// Not provable: the groups its copies name, each with the sequence number it was
    /// written with; `carry` is the copy whose bytes the other (missing) copy gets, so
    /// that the next open finds the same.
    Lost {
        claims: Vec<(u64, u64)>,
        carry: Option<usize>,
    },
    /// Damaged in every copy that counts it, naming no group.
    Unattributable,
}

/// The CRC32C of `bytes`, seeded with the magic (so no other format's sum passes).
fn checksum(bytes: &[u8]) -> u32 {
    crc32c::crc32c_append(crc32c::crc32c(MAGIC), bytes)
}

fn be32(bytes: &[u8], at: usize) -> u32 {
    let mut b = [0u8; 4];
    b.copy_from_slice(&bytes[at..at + 4]);
    u32::from_be_bytes(b)
}

fn be64(bytes: &[u8], at: usize) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&bytes[at..at + 8]);
    u64::from_be_bytes(b)
}

/// The header: magic, slot size `u32`, slot count `u32`, zeros, CRC32C at the end.
fn encode_header(count: u32) -> [u8; HEADER_BYTES] {
    let mut out = [0u8; HEADER_BYTES];
    out[..8].copy_from_slice(MAGIC);
    out[8..12].copy_from_slice(&(SLOT_BYTES as u32).to_be_bytes());
    out[12..16].copy_from_slice(&count.to_be_bytes());
    let sum = checksum(&out[..HEADER_BYTES - 4]);
    out[HEADER_BYTES - 4..].copy_from_slice(&sum.to_be_bytes());
    out
}

/// A copy's slot count, or why its header is not intact.
fn decode_header(bytes: &[u8]) -> Result<u32, String> {
    let Some(header) = bytes.get(..HEADER_BYTES) else {
        return Err(format!("{} bytes, short of a header", bytes.len()));
    };
    if &header[..8] != MAGIC {
        return Err("no magic".into());
    }
    if checksum(&header[..HEADER_BYTES - 4]) != be32(header, HEADER_BYTES - 4) {
        return Err("header checksum mismatch".into());
    }
    if be32(header, 8) != SLOT_BYTES as u32 {
        return Err(format!("slots of {} bytes", be32(header, 8)));
    }
    Ok(be32(header, 12))
}

fn slot_offset(index: u32) -> u64 {
    (HEADER_BYTES + index as usize * SLOT_BYTES) as u64
}

/// `slots` as runs of consecutive slots, one write each: offset, bytes.
fn runs(slots: &BTreeMap<u32, [u8; SLOT_BYTES]>) -> Vec<(u64, Vec<u8>)> {
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

fn encode_slot(index: u32, seq: u64, content: Content) -> [u8; SLOT_BYTES] {
    let mut out = [0u8; SLOT_BYTES];
    let (kind, group) = match content {
        Content::Free => (KIND_FREE, 0),
        Content::Used(group, _) => (KIND_USED, group),
    };
    out[0..4].copy_from_slice(&index.to_be_bytes());
    out[4..8].copy_from_slice(&kind.to_be_bytes());
    out[8..16].copy_from_slice(&seq.to_be_bytes());
    out[16..24].copy_from_slice(&group.to_be_bytes());
    let identity = checksum(&out[..IDENTITY_BYTES]);
    out[IDENTITY_BYTES..STAMP_AT].copy_from_slice(&identity.to_be_bytes());
    if let Content::Used(_, entry) = content {
        out[STAMP_AT..STATE_AT].copy_from_slice(&entry.stamp.encode());
        out[STATE_AT..STATE_AT + DurableState::ENCODED_BYTES]
            .copy_from_slice(&entry.state.encode(seq));
    }
    let sum = checksum(&out[..CHECKSUM_AT]);
    out[CHECKSUM_AT..].copy_from_slice(&sum.to_be_bytes());
    out
}

/// Reads slot `index` from its bytes.
fn decode_slot(index: u32, bytes: &[u8]) -> SlotRead {
    debug_assert_eq!(bytes.len(), SLOT_BYTES);
    let kind = be32(bytes, 4);
    let identity_intact = checksum(&bytes[..IDENTITY_BYTES]) == be32(bytes, IDENTITY_BYTES)
        && be32(bytes, 0) == index
        && (kind == KIND_FREE || kind == KIND_USED);
    if !identity_intact {
        return SlotRead::Damaged(None);
    }
    let seq = be64(bytes, 8);
    let group = be64(bytes, 16);
    let claim = (seq, (kind == KIND_USED).then_some(group));
    if checksum(&bytes[..CHECKSUM_AT]) != be32(bytes, CHECKSUM_AT) {
        return SlotRead::Damaged(Some(claim));
    }
    if kind == KIND_FREE {
        return SlotRead::Intact(seq, Content::Free);
    }
    let mut stamp = [0u8; Stamp::BYTES];
    stamp.copy_from_slice(&bytes[STAMP_AT..STATE_AT]);
    match DurableState::decode(&bytes[STATE_AT..STATE_AT + DurableState::ENCODED_BYTES]) {
        Ok((state_seq, state)) if state_seq == seq => {
            let stamp = Stamp::decode(stamp);
            SlotRead::Intact(seq, Content::Used(group, Entry { state, stamp }))
        }
        _ => SlotRead::Damaged(Some(claim)),
    }
}

/// One slot from its two copies. Copy 0 is always written (and synced) first, so in a
/// crash it is the one ahead.
fn resolve(reads: [SlotRead; 2]) -> Resolved {
    use SlotRead::{Absent, Beyond, Damaged, Intact};
    let claim = |read: SlotRead| match read {
        Intact(seq, content) => Some(Some((seq, content.group()))),
        Damaged(claim) => Some(claim),
        Beyond | Absent => None,
    };
    let claims: Vec<Option<Claim>> = reads.into_iter().filter_map(claim).collect();
    match reads {
        // The same write in both copies with different contents: a bug or a forgery,
        // not a crash; neither is trusted.
        [Intact(s, x), Intact(t, y)] if s == t && x != y => lost(&claims, None),
        [Intact(s, x), Intact(t, _)] if s == t => proven(s, x, Source::Both),
        [Intact(s, x), Intact(t, _)] if s > t => proven(s, x, Source::Copy(0)),
        [Intact(_, _), Intact(t, y)] => proven(t, y, Source::Copy(1)),
        // Copy 1 was written only after copy 0 held that write: copy 0's older one is
        // not the newest, and the newer cannot be read.
        [Intact(s, _), Damaged(Some((t, _)))] if t > s => lost(&claims, None),
        [Intact(s, x), _] => proven(s, x, Source::Copy(0)),
        [_, Intact(t, y)] => proven(t, y, Source::Copy(1)),
        // Copy 1's header does not count the slot: it was taken by the write in flight.
        [Damaged(_), Beyond] => proven(0, Content::Free, Source::New),
        [Damaged(_), Damaged(_)] => lost(&claims, None),
        [Damaged(_), Absent] => lost(&claims, Some(0)),
        [Beyond | Absent, Damaged(_)] => lost(&claims, Some(1)),
        // Not reachable: one copy's header counts every slot read.
        [Beyond | Absent, Beyond | Absent] => proven(0, Content::Free, Source::New),
    }
}

fn proven(seq: u64, content: Content, source: Source) -> Resolved {
    Resolved::Proven {
        seq,
        content,
        source,
    }
}

/// A slot that cannot be proven: the groups its copies name. A copy's in-flight write
/// went to a slot either free in both copies or already its group's, so one copy's
/// intact identity names every group the slot may have held for a reported state.
fn lost(claims: &[Option<Claim>], carry: Option<usize>) -> Resolved {
    if claims.iter().all(Option::is_none) {
        return Resolved::Unattributable;
    }
    let groups: Vec<(u64, u64)> = claims
        .iter()
        .flatten()
        .filter_map(|(seq, group)| group.map(|g| (g, *seq)))
        .collect();
    if groups.is_empty() {
        // Free in every copy that says: nothing to lose.
        return proven(0, Content::Free, Source::New);
    }
    Resolved::Lost {
        claims: groups,
        carry,
    }
}

/// A whole table of the first formats: its batch number and its groups.
fn decode_table(bytes: &[u8]) -> Result<(u64, BTreeMap<u64, Entry>), String> {
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
    let entry_bytes = 8 + stamp_bytes + DurableState::ENCODED_BYTES;
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

fn io(path: &Path) -> impl Fn(std::io::Error) -> StatesError + '_ {
    move |source| StatesError::Io {
        path: path.to_owned(),
        source,
    }
}

/// A copy's bytes, or `None` when it does not exist.
fn read_copy(path: &Path) -> Result<Option<Vec<u8>>, StatesError> {
    match std::fs::read(path) {
        Ok(bytes) => Ok(Some(bytes)),
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(err) => Err(io(path)(err)),
    }
}

fn is_old_table(bytes: &[u8]) -> bool {
    bytes.starts_with(MAGIC_STAMPED) || bytes.starts_with(MAGIC_UNSTAMPED)
}

/// One copy as open found it.
struct CopyRead {
    /// Its bytes; `None` when missing or a table from before the upgrade.
    bytes: Option<Vec<u8>>,
    /// The slots its header counts, or why the header is not intact.
    count: Result<u32, String>,
}

impl CopyRead {
    fn slot(&self, index: u32) -> SlotRead {
        let Some(bytes) = &self.bytes else {
            return SlotRead::Absent;
        };
        if self.count.as_ref().is_ok_and(|count| index >= *count) {
            return SlotRead::Beyond;
        }
        let at = slot_offset(index) as usize;
        match bytes.get(at..at + SLOT_BYTES) {
            Some(slot) => decode_slot(index, slot),
            None => SlotRead::Damaged(None),
        }
    }

    fn raw(&self, index: u32) -> Option<[u8; SLOT_BYTES]> {
        let at = slot_offset(index) as usize;
        let slot = self.bytes.as_ref()?.get(at..at + SLOT_BYTES)?;
        let mut out = [0u8; SLOT_BYTES];
        out.copy_from_slice(slot);
        Some(out)
    }
}

/// One shard's group states.
#[derive(Debug)]
pub(crate) struct GroupStates {
    dir: PathBuf,
    /// The copies, written in this order.
    paths: [PathBuf; 2],
    /// Where a whole copy is written before it is renamed into place.
    tmp: PathBuf,
    /// The boot this process runs in: the stamp of every state it stages.
    boot: BootId,
    /// The states as of the last write, and those staged since.
    states: BTreeMap<u64, Entry>,
    /// Each slot's group; `None` for a free slot, or one damaged beyond proof that no
    /// group owns (kept out of `free`, so it is never written).
    owners: Vec<Option<u64>>,
    slot_of: BTreeMap<u64, u32>,
    /// Slots free for the next group that needs one.
    free: BTreeSet<u32>,
    /// Slots the next write writes (staged or removed groups).
    dirty: BTreeSet<u32>,
    /// Groups staged since the last write, in the order staged.
    staged: Vec<u64>,
    staged_set: BTreeSet<u64>,
    /// The slot count each copy's header holds (`None`: to be written).
    headers: [Option<u32>; 2],
    /// The sequence number of the last write.
    seq: u64,
    /// Groups whose state open could not prove, not staged or removed since.
    damaged: BTreeSet<u64>,
    /// Whether open found no copy and made a new shard.
    created: bool,
    poisoned: bool,
}

impl GroupStates {
    /// Opens shard `shard`'s states in `dir` (made durable if new): each group's newest
    /// intact slot, any copy damage repaired (written to both copies) before it
    /// returns. What is staged from now on is stamped `boot`.
    ///
    /// # Errors
    /// [`StatesError::NoIntactCopy`] when copies exist and no header (or old table) is
    /// intact, [`StatesError::Unattributable`] when a slot is damaged in both copies
    /// without naming its group, or an IO error.
    pub(crate) fn open(dir: &Path, shard: usize, boot: BootId) -> Result<Self, StatesError> {
        braid_storage::create_dir_durable(dir).map_err(io(dir))?;
        let mut store = Self {
            dir: dir.to_owned(),
            paths: [0, 1].map(|i| dir.join(format!("shard-{shard}.{i}"))),
            tmp: dir.join(format!("shard-{shard}.tmp")),
            boot,
            states: BTreeMap::new(),
            owners: Vec::new(),
            slot_of: BTreeMap::new(),
            free: BTreeSet::new(),
            dirty: BTreeSet::new(),
            staged: Vec::new(),
            staged_set: BTreeSet::new(),
            headers: [None, None],
            seq: 0,
            damaged: BTreeSet::new(),
            created: false,
            poisoned: false,
        };
        let copies = [read_copy(&store.paths[0])?, read_copy(&store.paths[1])?];
        let present = || copies.iter().flatten();
        if present().any(|bytes| bytes.starts_with(MAGIC)) {
            store.load(copies)?;
        } else if present().any(|bytes| is_old_table(bytes)) {
            store.upgrade(&copies)?;
        } else if copies.iter().all(Option::is_none) {
            // A new shard: both copies put in place whole, so that from here on a copy
            // that does not decode is damage, never "not written yet".
            store.install()?;
            store.created = true;
        } else {
            let reason = store.describe(&copies, |bytes| {
                format!("{} bytes without a magic", bytes.len())
            });
            return Err(StatesError::NoIntactCopy {
                dir: dir.to_owned(),
                reason,
            });
        }
        Ok(store)
    }

    /// What each copy is, for an error.
    fn describe(&self, copies: &[Option<Vec<u8>>; 2], what: impl Fn(&[u8]) -> String) -> String {
        let each = self.paths.iter().zip(copies).map(|(path, bytes)| {
            let what = bytes.as_deref().map_or_else(|| "absent".to_owned(), &what);
            format!("{}: {what}", path.display())
        });
        each.collect::<Vec<_>>().join("; ")
    }

    /// Reads a table of the first formats (the newer intact copy) and puts it in place
    /// in the slotted layout.
    fn upgrade(&mut self, copies: &[Option<Vec<u8>>; 2]) -> Result<(), StatesError> {
        let tables = copies
            .iter()
            .flatten()
            .filter_map(|bytes| decode_table(bytes).ok());
        let Some((batch, table)) = tables.max_by_key(|(batch, _)| *batch) else {
            let reason = self.describe(copies, |bytes| match decode_table(bytes) {
                Ok(_) => "intact".to_owned(),
                Err(reason) => reason,
            });
            return Err(StatesError::NoIntactCopy {
                dir: self.dir.clone(),
                reason,
            });
        };
        self.seq = batch;
        for (group, entry) in table {
            self.states.insert(group, entry);
            self.slot_for(group);
        }
        self.install()?;
        tracing::info!(
            dir = %self.dir.display(),
            groups = self.states.len(),
            "replica states upgraded to one slot per group ({})",
            String::from_utf8_lossy(MAGIC)
        );
        Ok(())
    }

    /// Puts the whole table in place as both copies: each written, synced and renamed
    /// over the copy, then the directory synced.
    fn install(&mut self) -> Result<(), StatesError> {
        let seq = self.seq + 1;
        let count = self.owners.len() as u32;
        let mut bytes = encode_header(count).to_vec();
        for index in 0..count {
            bytes.extend_from_slice(&self.slot_bytes(index, seq));
        }
        let tmp = &self.tmp;
        for path in &self.paths {
            disk::write_file(tmp, &bytes).map_err(io(tmp))?;
            let file = std::fs::File::open(tmp).map_err(io(tmp))?;
            disk::sync_data(&file, tmp).map_err(io(tmp))?;
            disk::rename(tmp, path).map_err(io(path))?;
        }
        disk::sync_dir(&self.dir).map_err(io(&self.dir))?;
        self.seq = seq;
        self.headers = [Some(count); 2];
        Ok(())
    }

    /// Reads the slotted layout: each slot from its two copies, each group from its
    /// newest slot; then writes back what a copy lacks.
    fn load(&mut self, copies: [Option<Vec<u8>>; 2]) -> Result<(), StatesError> {
        let copies = copies.map(|bytes| match bytes {
            Some(bytes) if is_old_table(&bytes) => CopyRead {
                bytes: None,
                count: Err("a table from before the upgrade".into()),
            },
            Some(bytes) => CopyRead {
                count: decode_header(&bytes),
                bytes: Some(bytes),
            },
            None => CopyRead {
                bytes: None,
                count: Err("absent".into()),
            },
        });
        let counts = copies.each_ref().map(|copy| copy.count.clone().ok());
        let Some(count) = counts.into_iter().flatten().max() else {
            let reason = self
                .paths
                .iter()
                .zip(&copies)
                .map(|(path, copy)| {
                    let reason = copy.count.as_ref().err().map_or("", String::as_str);
                    format!("{}: {reason}", path.display())
                })
                .collect::<Vec<_>>()
                .join("; ");
            return Err(StatesError::NoIntactCopy {
                dir: self.dir.clone(),
                reason,
            });
        };
        self.warn_of_copies(&copies);
        self.headers = counts;
        let mut resolved = Vec::with_capacity(count as usize);
        let mut damaged_at: [Vec<u64>; 2] = [Vec::new(), Vec::new()];
        for index in 0..count {
            let reads = [copies[0].slot(index), copies[1].slot(index)];
            for (copy, read) in reads.iter().enumerate() {
                match read {
                    SlotRead::Intact(seq, _) | SlotRead::Damaged(Some((seq, _))) => {
                        self.seq = self.seq.max(*seq);
                    }
                    _ => {}
                }
                if matches!(read, SlotRead::Damaged(_)) {
                    damaged_at[copy].push(slot_offset(index));
                }
            }
            let slot = resolve(reads);
            if slot == Resolved::Unattributable {
                return Err(StatesError::Unattributable {
                    files: self.files(),
                    offset: slot_offset(index),
                });
            }
            resolved.push(slot);
        }
        self.warn_of_slots(&damaged_at);
        let copied = self.settle(resolved);
        // Each copy gets the slots it lacks as the other holds them (the copy that
        // holds a slot is not written, so a crash now cannot tear the only one), and
        // the slots written anew.
        let mut slots = [BTreeMap::new(), BTreeMap::new()];
        for (&index, &to) in &copied {
            if let Some(raw) = copies[1 - to].raw(index) {
                slots[to].insert(index, raw);
            }
        }
        for (index, bytes) in self.dirty_slots(self.seq + 1) {
            slots[0].insert(index, bytes);
            slots[1].insert(index, bytes);
        }
        if slots.iter().any(|s| !s.is_empty()) || self.headers != [Some(count); 2] {
            self.write_slots([&slots[0], &slots[1]])?;
        }
        Ok(())
    }

    /// Takes in each slot as resolved: the groups' states, the owners, the free slots,
    /// the damaged groups, and the slots to write anew (made dirty). Returns the slots
    /// one copy lacks, to be copied into it from the other: slot, copy to write.
    fn settle(&mut self, resolved: Vec<Resolved>) -> BTreeMap<u32, usize> {
        let mut copied = BTreeMap::new();
        self.owners = vec![None; resolved.len()];
        // Each group's newest proven slot; an older one of the same group is freed.
        let mut newest: BTreeMap<u64, (u32, u64)> = BTreeMap::new();
        let mut lost = Vec::new();
        for (index, slot) in resolved.into_iter().enumerate() {
            let index = index as u32;
            match slot {
                Resolved::Proven {
                    seq,
                    content,
                    source,
                } => {
                    match source {
                        Source::Both => {}
                        Source::Copy(from) => {
                            copied.insert(index, 1 - from);
                        }
                        Source::New => {
                            self.dirty.insert(index);
                        }
                    }
                    let Content::Used(group, entry) = content else {
                        self.free.insert(index);
                        continue;
                    };
                    match newest.get(&group) {
                        Some(&(_, older)) if older >= seq => {
                            self.free_slot(index);
                            continue;
                        }
                        Some(&(stale, _)) => self.free_slot(stale),
                        None => {}
                    }
                    newest.insert(group, (index, seq));
                    self.states.insert(group, entry);
                    self.owners[index as usize] = Some(group);
                }
                Resolved::Lost { claims, carry } => lost.push((index, claims, carry)),
                Resolved::Unattributable => unreachable!("refused before"),
            }
        }
        let mut lost_owners = BTreeSet::new();
        for (index, claims, carry) in lost {
            // A claim a newer proven slot of the same group supersedes is no loss.
            let mut claims: Vec<(u64, u64)> = claims
                .into_iter()
                .filter(|(group, seq)| newest.get(group).is_none_or(|(_, proven)| proven < seq))
                .collect();
            if claims.is_empty() {
                self.free_slot(index);
                continue;
            }
            claims.sort_by_key(|(_, seq)| std::cmp::Reverse(*seq));
            for &(group, _) in &claims {
                if self.damaged.insert(group) {
                    tracing::warn!(
                        files = %self.files(),
                        offset = slot_offset(index),
                        group,
                        "replica states: the group's slot is damaged in both copies; its \
                         state cannot be proven"
                    );
                }
                // An older proven state is not the group's newest: never served.
                if let Some((stale, _)) = newest.remove(&group) {
                    self.states.remove(&group);
                    self.free_slot(stale);
                }
            }
            // The newest claim's group owns the slot (its next state is written
            // there); a slot whose group owns another stays out of use, unwritten.
            let owner = claims[0].0;
            if lost_owners.insert(owner) {
                self.owners[index as usize] = Some(owner);
            }
            if let Some(from) = carry {
                copied.insert(index, 1 - from);
            }
        }
        for (index, owner) in self.owners.iter().enumerate() {
            if let Some(group) = owner {
                self.slot_of.insert(*group, index as u32);
            }
        }
        // A slot written anew is not copied.
        copied.retain(|index, _| !self.dirty.contains(index));
        copied
    }

    /// Frees slot `index` at open: written free at once.
    fn free_slot(&mut self, index: u32) {
        self.owners[index as usize] = None;
        self.free.insert(index);
        self.dirty.insert(index);
    }

    fn files(&self) -> String {
        format!(
            "{} and {}",
            self.paths[0].display(),
            self.paths[1].display()
        )
    }

    fn warn_of_copies(&self, copies: &[CopyRead; 2]) {
        for (path, copy) in self.paths.iter().zip(copies) {
            if let Err(reason) = &copy.count {
                tracing::warn!(
                    path = %path.display(),
                    reason = %reason,
                    "replica states: copy without an intact header; the other copy's \
                     slots are used and this copy is written again"
                );
            }
        }
    }

    fn warn_of_slots(&self, damaged_at: &[Vec<u64>; 2]) {
        for (path, offsets) in self.paths.iter().zip(damaged_at) {
            for &offset in offsets.iter().take(WARNINGS_PER_COPY_MAX) {
                tracing::warn!(
                    path = %path.display(),
                    offset,
                    "replica states: damaged slot; the other copy's is used if intact, \
                     and written back"
                );
            }
            if offsets.len() > WARNINGS_PER_COPY_MAX {
                tracing::warn!(
                    path = %path.display(),
                    slots = offsets.len(),
                    "replica states: damaged slots in this copy"
                );
            }
        }
    }

    /// Whether open found no copy and made a new shard (a caller that knows its data
    /// directory held data refuses such a start: the states were lost, not new).
    #[allow(dead_code, reason = "read by the shard host's start, being written")]
    pub(crate) fn was_created(&self) -> bool {
        self.created
    }

    /// Groups whose state open could not prove (their slot damaged in both copies):
    /// they have no state here, and each must start as a replica that lost its disk.
    /// A group leaves the set when staged or removed.
    #[allow(dead_code, reason = "read by the shard host's start, being written")]
    pub(crate) fn damaged_groups(&self) -> &BTreeSet<u64> {
        &self.damaged
    }

    /// The durable state of `group`, if it has one.
    pub(crate) fn get(&self, group: u64) -> Option<DurableState> {
        self.states.get(&group).map(|e| e.state)
    }

    /// The stamp of `group`'s state as it stands (staged or written).
    pub(crate) fn stamp(&self, group: u64) -> Option<Stamp> {
        self.states.get(&group).map(|e| e.stamp)
    }

    /// Whether `group`'s journal kept every write it reported, by its stamp: written in
    /// this boot, or at a clean stop.
    pub(crate) fn vouches_for(&self, group: u64) -> bool {
        self.stamp(group).is_some_and(|s| s.vouches_in(self.boot))
    }

    /// Every group with a state.
    #[cfg(test)]
    pub(crate) fn groups(&self) -> impl Iterator<Item = (u64, DurableState)> + '_ {
        self.states.iter().map(|(g, e)| (*g, e.state))
    }

    /// Stages `state` for `group` (a replica's `WriteState`), stamped with this boot;
    /// written by the next [`GroupStates::write_staged`].
    pub(crate) fn stage(&mut self, group: u64, state: DurableState) {
        let stamp = Stamp::Boot(self.boot);
        self.states.insert(group, Entry { state, stamp });
        self.damaged.remove(&group);
        let slot = self.slot_for(group);
        self.dirty.insert(slot);
        if self.staged_set.insert(group) {
            self.staged.push(group);
        }
    }

    /// `group`'s slot, taken if it has none (the lowest free one, else a new one).
    fn slot_for(&mut self, group: u64) -> u32 {
        if let Some(&slot) = self.slot_of.get(&group) {
            return slot;
        }
        let slot = self.free.pop_first().unwrap_or_else(|| {
            assert!(self.owners.len() < u32::MAX as usize, "slots exhausted");
            self.owners.push(None);
            (self.owners.len() - 1) as u32
        });
        debug_assert!(self.owners[slot as usize].is_none());
        self.owners[slot as usize] = Some(group);
        self.slot_of.insert(group, slot);
        slot
    }

    /// Whether something staged (or removed) waits for [`GroupStates::write_staged`].
    #[cfg(test)]
    pub(crate) fn has_staged(&self) -> bool {
        !self.dirty.is_empty()
    }

    /// Writes every group's slot at a clean stop, stamped [`Stamp::Synced`] (its
    /// journal was synced and closed) except those in `unsynced` (their close failed),
    /// stamped [`Stamp::Unknown`]. The next start, in any boot, trusts the synced ones.
    ///
    /// # Errors
    /// As [`GroupStates::write_staged`].
    pub(crate) fn write_stopped(&mut self, unsynced: &[u64]) -> Result<(), StatesError> {
        if self.poisoned {
            return Err(StatesError::Poisoned);
        }
        for (group, entry) in &mut self.states {
            entry.stamp = if unsynced.contains(group) {
                Stamp::Unknown
            } else {
                Stamp::Synced
            };
            self.dirty.insert(self.slot_of[group]);
        }
        self.write_dirty()?;
        self.staged.clear();
        self.staged_set.clear();
        Ok(())
    }

    /// Forgets a deleted group: its slot is written free with the next write, then
    /// reused. Partition groups use it when their topic is deleted; the metadata group
    /// is never removed.
    pub(crate) fn remove(&mut self, group: u64) {
        self.states.remove(&group);
        self.damaged.remove(&group);
        if let Some(&slot) = self.slot_of.get(&group) {
            self.dirty.insert(slot);
        }
    }

    /// Writes the slots staged (or removed) since the last write: to copy 0, synced,
    /// then to copy 1, synced. Two `fdatasync`s for every state staged since the last
    /// write. Returns the staged groups with the states now durable (each replica gets
    /// its `StateWritten`); still present groups only.
    ///
    /// # Errors
    /// An IO error poisons the store: every later write is refused
    /// ([`StatesError::Poisoned`]) until a restart reads what reached the disk.
    pub(crate) fn write_staged(&mut self) -> Result<Vec<(u64, DurableState)>, StatesError> {
        if self.poisoned {
            return Err(StatesError::Poisoned);
        }
        self.write_dirty()?;
        self.staged_set.clear();
        let staged = std::mem::take(&mut self.staged);
        Ok(staged
            .into_iter()
            .filter_map(|g| self.states.get(&g).map(|e| (g, e.state)))
            .collect())
    }

    /// The bytes of slot `index` as it stands, written with sequence number `seq`.
    fn slot_bytes(&self, index: u32, seq: u64) -> [u8; SLOT_BYTES] {
        let owner = self.owners[index as usize];
        let content = owner
            .and_then(|group| {
                self.states
                    .get(&group)
                    .map(|entry| Content::Used(group, *entry))
            })
            .unwrap_or(Content::Free);
        encode_slot(index, seq, content)
    }

    fn dirty_slots(&self, seq: u64) -> impl Iterator<Item = (u32, [u8; SLOT_BYTES])> + '_ {
        self.dirty
            .iter()
            .map(move |&index| (index, self.slot_bytes(index, seq)))
    }

    /// Writes the dirty slots as the next write, then frees the slots written free.
    fn write_dirty(&mut self) -> Result<(), StatesError> {
        if self.dirty.is_empty() {
            return Ok(());
        }
        let slots = self.dirty_slots(self.seq + 1).collect();
        if let Err(err) = self.write_slots([&slots, &slots]) {
            self.poisoned = true;
            return Err(err);
        }
        Ok(())
    }

    /// Writes `slots[0]` (and the header, where it is not current) to copy 0 and syncs
    /// it, then `slots[1]` to copy 1 and syncs it: one more write; slots written anew
    /// carry its sequence number. Afterwards no slot is dirty, and those written free
    /// are free.
    fn write_slots(
        &mut self,
        slots: [&BTreeMap<u32, [u8; SLOT_BYTES]>; 2],
    ) -> Result<(), StatesError> {
        let count = self.owners.len() as u32;
        for (copy, slots) in slots.into_iter().enumerate() {
            let path = &self.paths[copy];
            let (file, created) = disk::open_or_create(path).map_err(io(path))?;
            if self.headers[copy] != Some(count) {
                disk::write_at(&file, path, &encode_header(count), 0).map_err(io(path))?;
            }
            for (offset, run) in &runs(slots) {
                disk::write_at(&file, path, run, *offset).map_err(io(path))?;
            }
            disk::sync_data(&file, path).map_err(io(path))?;
            if created {
                disk::sync_dir(&self.dir).map_err(io(&self.dir))?;
            }
            self.headers[copy] = Some(count);
        }
        self.seq += 1;
        for index in std::mem::take(&mut self.dirty) {
            let owner = &mut self.owners[index as usize];
            if let Some(group) = *owner {
                if self.states.contains_key(&group) {
                    continue;
                }
                self.slot_of.remove(&group);
                *owner = None;
            }
            self.free.insert(index);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use braid_storage::disk::hook::{self, Event, Plan};

    fn boot() -> BootId {
        BootId::from_bytes([3; 16])
    }

    fn state(view: u64, commit: u64) -> DurableState {
        DurableState {
            view,
            log_view: view,
            commit,
            journal_trusted_through: u64::MAX,
        }
    }

    fn paths(dir: &Path, shard: usize) -> [PathBuf; 2] {
        [0, 1].map(|i| dir.join(format!("shard-{shard}.{i}")))
    }

    /// Bytes written and syncs done in a trace.
    fn cost(trace: &[Event]) -> (usize, usize) {
        let written = trace
            .iter()
            .map(|event| match event {
                Event::Write { bytes, .. } => bytes.len(),
                _ => 0,
            })
            .sum();
        let syncs = trace
            .iter()
            .filter(|event| matches!(event, Event::Sync { .. }))
            .count();
        (written, syncs)
    }

    /// A table of the second format (`BRDVST02`), as the old code wrote it whole.
    fn encode_stamped_table(batch: u64, states: &BTreeMap<u64, Entry>) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(MAGIC_STAMPED);
        out.extend_from_slice(&batch.to_be_bytes());
        out.extend_from_slice(&(states.len() as u32).to_be_bytes());
        for (group, entry) in states {
            out.extend_from_slice(&group.to_be_bytes());
            out.extend_from_slice(&entry.stamp.encode());
            out.extend_from_slice(&entry.state.encode(batch));
        }
        let crc = crc32c::crc32c(&out);
        out.extend_from_slice(&crc.to_be_bytes());
        out
    }

    #[test]
    fn a_write_costs_the_slots_it_changed_and_two_syncs() {
        const GROUPS: u64 = 10_000;
        let dir = tempfile::tempdir().unwrap();
        let mut states = GroupStates::open(dir.path(), 0, boot()).unwrap();
        for group in 0..GROUPS {
            states.stage(group, state(1, group));
        }
        assert_eq!(states.write_staged().unwrap().len(), GROUPS as usize);

        // One group among ten thousand: its slot in each copy, and two syncs.
        hook::start_tracing();
        states.stage(4_321, state(2, 7));
        assert_eq!(states.write_staged().unwrap(), vec![(4_321, state(2, 7))]);
        let (one_bytes, one_syncs) = cost(&hook::take().unwrap().trace);
        assert_eq!(one_syncs, 2);
        assert_eq!(one_bytes, 2 * SLOT_BYTES);
        assert!(one_bytes < 4096, "{one_bytes} bytes for one group");

        // A hundred groups, a removal and a new group in the freed slot: O(changed).
        hook::start_tracing();
        for group in (0..GROUPS).step_by(100) {
            states.stage(group, state(3, group));
        }
        states.remove(5);
        assert_eq!(states.write_staged().unwrap().len(), 100);
        states.stage(GROUPS + 1, state(1, 1));
        states.write_staged().unwrap();
        let (bytes, syncs) = cost(&hook::take().unwrap().trace);
        assert_eq!(syncs, 4);
        assert_eq!(bytes, 2 * 101 * SLOT_BYTES + 2 * SLOT_BYTES);
        assert_eq!(states.slot_of[&(GROUPS + 1)], states_slot_was(5));

        // Nothing staged, a reopen of an intact shard: nothing written.
        hook::start_tracing();
        assert!(states.write_staged().unwrap().is_empty());
        let reopened = GroupStates::open(dir.path(), 0, boot()).unwrap();
        assert_eq!(cost(&hook::take().unwrap().trace), (0, 0));
        assert_eq!(reopened.get(4_321), Some(state(2, 7)));
        assert_eq!(reopened.get(GROUPS + 1), Some(state(1, 1)));
        assert_eq!(reopened.get(5), None);
        assert_eq!(reopened.groups().count(), GROUPS as usize);

        // Before: the same change rewrote the whole table (BRDVST02) over the older
        // copy through `TwoCopies::write`, and synced it.
        let old_dir = tempfile::tempdir().unwrap();
        let old = super::super::copies::TwoCopies::new(old_dir.path(), "shard-0");
        hook::start_tracing();
        old.write(2, &encode_stamped_table(2, &reopened.states))
            .unwrap();
        let (old_bytes, old_syncs) = cost(&hook::take().unwrap().trace);
        println!(
            "one group changed among {GROUPS}: before {old_bytes} bytes written and \
             {old_syncs} fdatasync (the whole table); after {one_bytes} bytes and \
             {one_syncs} fdatasyncs (its slot in each copy)"
        );
        assert!(old_bytes > 100 * one_bytes);
    }

    /// The slot group 5 held in [`a_write_costs_the_slots_it_changed_and_two_syncs`]:
    /// groups took slots in order.
    fn states_slot_was(group: u64) -> u32 {
        group as u32
    }

    #[test]
    fn a_batch_is_two_writes_and_damage_to_the_newest_copy_rolls_nothing_back() {
        let dir = tempfile::tempdir().unwrap();
        let mut states = GroupStates::open(dir.path(), 3, boot()).unwrap();
        assert!(states.was_created());
        assert_eq!(states.groups().count(), 0);
        for group in 0..1000 {
            states.stage(group, state(1, group));
        }
        hook::install(Plan::default());
        let durable = states.write_staged().unwrap();
        let operations = hook::take().unwrap().seen;
        assert_eq!(durable.len(), 1000);
        assert!(
            operations <= 8,
            "{operations} disk operations for 1000 groups"
        );
        assert!(!states.has_staged());
        states.stage(7, state(2, 9));
        states.remove(8);
        assert!(states.has_staged());
        assert_eq!(states.write_staged().unwrap(), vec![(7, state(2, 9))]);
        assert!(states.write_staged().unwrap().is_empty(), "nothing staged");
        let reopened = GroupStates::open(dir.path(), 3, boot()).unwrap();
        assert!(!reopened.was_created());
        assert_eq!(reopened.get(7), Some(state(2, 9)));
        assert_eq!(reopened.get(8), None);
        assert_eq!(reopened.groups().count(), 999);

        // Group 7's newest slot flipped in either copy: still the newest state.
        let at = slot_offset(reopened.slot_of[&7]) as usize + 60;
        for path in paths(dir.path(), 3) {
            let mut bytes = std::fs::read(&path).unwrap();
            bytes[at] ^= 1;
            std::fs::write(&path, &bytes).unwrap();
            let states = GroupStates::open(dir.path(), 3, boot()).unwrap();
            assert_eq!(states.get(7), Some(state(2, 9)), "{}", path.display());
            assert!(states.damaged_groups().is_empty());
        }
        // No intact header: refused, naming each copy.
        for path in paths(dir.path(), 3) {
            std::fs::write(path, b"BRDVST03garbage").unwrap();
        }
        let refused = GroupStates::open(dir.path(), 3, boot()).unwrap_err();
        assert!(refused.to_string().contains("shard-3.0"), "{refused}");
        assert!(refused.to_string().contains("shard-3.1"), "{refused}");
    }

    #[test]
    fn stamps_are_kept_per_group_and_tables_of_the_first_formats_are_upgraded() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (BootId::from_bytes([1; 16]), BootId::from_bytes([2; 16]));
        let mut states = GroupStates::open(dir.path(), 0, a).unwrap();
        states.stage(1, state(1, 1));
        states.stage(2, state(1, 2));
        states.write_staged().unwrap();
        // A process of another boot restages group 2 only: group 1 keeps boot a's.
        let mut states = GroupStates::open(dir.path(), 0, b).unwrap();
        assert!(!states.vouches_for(1) && !states.vouches_for(2));
        states.stage(2, state(2, 2));
        states.write_staged().unwrap();
        let mut states = GroupStates::open(dir.path(), 0, b).unwrap();
        assert_eq!(states.stamp(1), Some(Stamp::Boot(a)));
        assert_eq!(states.stamp(2), Some(Stamp::Boot(b)));
        assert!(states.vouches_for(2) && !states.vouches_for(1));
        assert_eq!(states.get(2), Some(state(2, 2)));
        // A clean stop: synced, or unknown where the journal's close failed.
        states.write_stopped(&[2]).unwrap();
        let states = GroupStates::open(dir.path(), 0, b).unwrap();
        assert_eq!(states.stamp(1), Some(Stamp::Synced));
        assert_eq!(states.stamp(2), Some(Stamp::Unknown));

        // The second format: the whole table in each copy; the newer batch is read
        // once and put in place as slots, stamps and all.
        let table = |view| {
            BTreeMap::from([
                (
                    3,
                    Entry {
                        state: state(view, 30),
                        stamp: Stamp::Boot(a),
                    },
                ),
                (
                    9,
                    Entry {
                        state: state(view, 90),
                        stamp: Stamp::Synced,
                    },
                ),
            ])
        };
        let old_dir = tempfile::tempdir().unwrap();
        let [zero, one] = paths(old_dir.path(), 0);
        std::fs::write(&zero, encode_stamped_table(6, &table(6))).unwrap();
        std::fs::write(&one, encode_stamped_table(5, &table(5))).unwrap();
        let mut states = GroupStates::open(old_dir.path(), 0, b).unwrap();
        assert!(!states.was_created());
        assert_eq!(states.states, table(6));
        for path in [&zero, &one] {
            assert!(std::fs::read(path).unwrap().starts_with(MAGIC));
        }
        states.stage(3, state(7, 31));
        states.write_staged().unwrap();
        let states = GroupStates::open(old_dir.path(), 0, b).unwrap();
        assert_eq!(states.get(3), Some(state(7, 31)));
        assert_eq!(states.stamp(9), Some(Stamp::Synced));
        assert_eq!(states.get(9), Some(state(6, 90)));

        // The first format: the same table, no stamps.
        let mut old = Vec::new();
        old.extend_from_slice(MAGIC_UNSTAMPED);
        old.extend_from_slice(&5u64.to_be_bytes());
        old.extend_from_slice(&1u32.to_be_bytes());
        old.extend_from_slice(&7u64.to_be_bytes());
        old.extend_from_slice(&state(3, 4).encode(5));
        let crc = crc32c::crc32c(&old);
        old.extend_from_slice(&crc.to_be_bytes());
        let old_dir = tempfile::tempdir().unwrap();
        std::fs::write(old_dir.path().join("shard-0.1"), &old).unwrap();
        let states = GroupStates::open(old_dir.path(), 0, a).unwrap();
        assert_eq!(states.get(7), Some(state(3, 4)));
        assert_eq!(states.stamp(7), Some(Stamp::Unknown));
        // An old table that does not decode: refused, as before.
        std::fs::write(old_dir.path().join("shard-0.0"), b"BRDVST02garbage").unwrap();
        std::fs::write(old_dir.path().join("shard-0.1"), b"BRDVST02garbage").unwrap();
        assert!(matches!(
            GroupStates::open(old_dir.path(), 0, a),
            Err(StatesError::NoIntactCopy { .. })
        ));
    }

    /// Opens copies holding `files` (`None`: missing) in a crash-state harness: every
    /// state a crash during that open (whatever it writes) can leave opens to
    /// `expected` exactly, with no group damaged. Returns the states checked.
    fn assert_every_crash_state_of_open(
        files: [Option<Vec<u8>>; 2],
        expected: &BTreeMap<u64, Entry>,
        what: &str,
    ) -> usize {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("replication");
        std::fs::create_dir(&dir).unwrap();
        // The harness starts from an empty root: the copies as they stood come first.
        let mut trace = vec![
            Event::MkDir { dir: dir.clone() },
            Event::DirSync {
                dir: root.path().to_owned(),
            },
        ];
        for (path, bytes) in paths(&dir, 0).into_iter().zip(files) {
            let Some(bytes) = bytes else { continue };
            std::fs::write(&path, &bytes).unwrap();
            trace.push(Event::Create { path: path.clone() });
            trace.push(Event::Write {
                path: path.clone(),
                offset: 0,
                bytes,
            });
            trace.push(Event::Sync { path });
        }
        trace.push(Event::DirSync { dir: dir.clone() });
        let start = trace.len();
        hook::start_tracing();
        GroupStates::open(&dir, 0, boot()).unwrap_or_else(|e| panic!("{what}: {e}"));
        trace.extend(hook::take().unwrap().trace);
        braid_storage::crash::for_each_crash_state(&trace, root.path(), |at, how, out| {
            if at < start {
                return;
            }
            let what = format!("{what}, cut at {at}, {how}");
            let states = GroupStates::open(&out.join("replication"), 0, boot())
                .unwrap_or_else(|e| panic!("{what}: {e}"));
            assert_eq!(&states.states, expected, "{what}");
            assert!(states.damaged_groups().is_empty(), "{what}");
        })
    }

    /// Cut at every sync boundary of an upgrade: the old table, whole.
    #[test]
    fn every_crash_state_of_an_upgrade_opens_to_the_old_table() {
        let table: BTreeMap<u64, Entry> = (0..5)
            .map(|g| {
                let (state, stamp) = (state(g + 1, g), Stamp::Synced);
                (g, Entry { state, stamp })
            })
            .collect();
        let old = [
            Some(encode_stamped_table(4, &table)),
            Some(encode_stamped_table(3, &BTreeMap::new())),
        ];
        let checked = assert_every_crash_state_of_open(old, &table, "upgrade");
        assert!(checked > 10, "{checked} crash states");
    }

    /// Cut at every sync boundary of what open writes back into a damaged or missing
    /// copy: the copy that proved a slot is never written, so every group stays
    /// exactly as written.
    #[test]
    fn every_crash_state_of_a_repair_opens_to_the_newest_states() {
        let (dir, expected) = written_table(12);
        let files = read_files(dir.path());
        let at = slot_offset(3) as usize;
        let mut checked = 0;
        for copy in 0..2 {
            let other = Some(files[1 - copy].clone());
            let mut damaged = [Some(files[0].clone()), Some(files[1].clone())];
            let bytes = damaged[copy].as_mut().unwrap();
            bytes[at + STATE_AT] ^= 1;
            bytes[at + 2 * SLOT_BYTES..at + 4 * SLOT_BYTES].fill(0);
            bytes[5] ^= 1;
            let what = format!("slots and header damaged in copy {copy}");
            checked += assert_every_crash_state_of_open(damaged, &expected, &what);
            let mut missing = [None, None];
            missing[1 - copy] = other;
            let what = format!("copy {copy} missing");
            checked += assert_every_crash_state_of_open(missing, &expected, &what);
        }
        assert!(checked > 40, "{checked} crash states");
    }

    /// One batch: groups' new states, and groups removed.
    type Batch = (Vec<(u64, DurableState)>, Vec<u64>);

    /// The batches of a workload: each a few groups' new states, some removals (whose
    /// slots later batches reuse).
    fn workload() -> Vec<Batch> {
        (1..=8u64)
            .map(|b| {
                let staged = (0..3)
                    .map(|g| ((b + g) % 6, state(b, b * 10 + g)))
                    .collect();
                let removed = if b % 3 == 0 {
                    vec![b % 6, (b + 3) % 6]
                } else {
                    Vec::new()
                };
                (staged, removed)
            })
            .collect()
    }

    fn table_after(batches: usize) -> BTreeMap<u64, DurableState> {
        let mut table = BTreeMap::new();
        for (staged, removed) in workload().into_iter().take(batches) {
            table.extend(staged);
            for g in removed {
                table.remove(&g);
            }
        }
        table
    }

    fn stage_batch(states: &mut GroupStates, (staged, removed): Batch) {
        for (g, s) in staged {
            states.stage(g, s);
        }
        for g in removed {
            states.remove(g);
        }
    }

    /// Each group's state is the one `batches` batches left, or the next batch's.
    fn assert_at_batch(found: &BTreeMap<u64, DurableState>, batches: usize, what: &str) {
        let (before, after) = (table_after(batches), table_after(batches + 1));
        for group in before.keys().chain(after.keys()).chain(found.keys()) {
            let state = found.get(group);
            assert!(
                state == before.get(group) || state == after.get(group),
                "{what}: group {group} at {state:?} after {batches} batches"
            );
        }
    }

    fn run(dir: &Path) -> Result<usize, StatesError> {
        let mut states = GroupStates::open(dir, 0, boot())?;
        let mut written = 0;
        for batch in workload() {
            stage_batch(&mut states, batch);
            states.write_staged()?;
            written += 1;
        }
        Ok(written)
    }

    /// Cut at every sync boundary, every way the POSIX model allows: the states open,
    /// each group's is that of the last batch whose write returned or of the one in
    /// flight, none is damaged, and what open wrote back leaves nothing to repair.
    #[test]
    fn every_crash_state_opens_to_the_last_written_batch_or_the_next() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("replication");
        hook::start_tracing();
        let trace_len = hook::trace_len;
        let mut acks = Vec::new();
        {
            // Record where in the trace each batch's write returned.
            let mut states = GroupStates::open(&dir, 0, boot()).unwrap();
            acks.push(trace_len());
            for batch in workload() {
                stage_batch(&mut states, batch);
                states.write_staged().unwrap();
                acks.push(trace_len());
            }
        }
        let trace = hook::take().unwrap().trace;
        let checked =
            braid_storage::crash::for_each_crash_state(&trace, root.path(), |at, how, out| {
                let written = acks.iter().filter(|&&events| events <= at).count();
                let dir = out.join("replication");
                let what = format!("cut at {at}, {how}");
                let states =
                    GroupStates::open(&dir, 0, boot()).unwrap_or_else(|e| panic!("{what}: {e}"));
                let found: BTreeMap<u64, DurableState> = states.groups().collect();
                assert!(states.damaged_groups().is_empty(), "{what}");
                assert_at_batch(&found, written.saturating_sub(1), &what);
                hook::start_tracing();
                let again = GroupStates::open(&dir, 0, boot()).unwrap();
                let trace = hook::take().unwrap().trace;
                assert_eq!(cost(&trace), (0, 0), "{what}: a second open wrote");
                assert_eq!(again.states, states.states, "{what}");
            });
        assert!(checked > 50, "{checked} crash states");
    }

    /// Each disk operation failed in turn: the failing call errors, later writes are
    /// refused, and a reopen finds each group as the last written batch or the one that
    /// failed left it.
    #[test]
    fn a_failed_write_poisons_and_a_reopen_finds_a_written_batch() {
        hook::install(Plan::default());
        let root = tempfile::tempdir().unwrap();
        run(&root.path().join("r")).unwrap();
        let operations = hook::take().unwrap().seen;
        for at in 0..operations {
            let root = tempfile::tempdir().unwrap();
            let dir = root.path().join("r");
            hook::install(Plan {
                fail_at: Some((at, std::io::ErrorKind::Other)),
                ..Plan::default()
            });
            let mut states = GroupStates::open(&dir, 0, boot());
            let mut written = 0;
            if let Ok(states) = states.as_mut() {
                for batch in workload() {
                    stage_batch(states, batch);
                    if states.write_staged().is_err() {
                        states.stage(0, state(99, 99));
                        assert!(matches!(states.write_staged(), Err(StatesError::Poisoned)));
                        break;
                    }
                    written += 1;
                }
            }
            hook::take();
            let reopened = GroupStates::open(&dir, 0, boot())
                .unwrap_or_else(|e| panic!("failure at {at}: {e}"));
            assert!(reopened.damaged_groups().is_empty());
            let found: BTreeMap<u64, DurableState> = reopened.groups().collect();
            assert_at_batch(&found, written, &format!("failure at {at}"));
        }
    }

    /// Several batches over `groups` groups, across two boots, with removals and
    /// freed slots reused: the directory and every group's newest state and stamp.
    fn written_table(groups: u64) -> (tempfile::TempDir, BTreeMap<u64, Entry>) {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (BootId::from_bytes([1; 16]), BootId::from_bytes([2; 16]));
        let mut states = GroupStates::open(dir.path(), 0, a).unwrap();
        for group in 0..groups {
            states.stage(group, state(1, group));
        }
        states.write_staged().unwrap();
        for batch in 2..6 {
            for group in (0..groups).filter(|g| g % batch == 0) {
                states.stage(group, state(batch, group * batch));
            }
            states.remove(batch + 1);
            states.write_staged().unwrap();
        }
        let mut states = GroupStates::open(dir.path(), 0, b).unwrap();
        states.stage(groups + 1, state(7, 7));
        states.stage(1, state(8, 8));
        states.write_staged().unwrap();
        let expected = states.states.clone();
        assert!(expected.contains_key(&(groups + 1)) && expected.len() as u64 <= groups);
        (dir, expected)
    }

    /// A copy of `files` in a new directory.
    fn with_files(files: &[Vec<u8>; 2]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        for (path, bytes) in paths(dir.path(), 0).iter().zip(files) {
            std::fs::write(path, bytes).unwrap();
        }
        dir
    }

    fn read_files(dir: &Path) -> [Vec<u8>; 2] {
        paths(dir, 0).map(|path| std::fs::read(path).unwrap())
    }

    /// Opens `files` damaged by `damage` in copy `copy`: every group exactly as
    /// written, none damaged. Then (when `twice`) the same damage to the other copy
    /// as open repaired them: still exact, so open wrote the damaged copy back.
    fn assert_survives(
        files: &[Vec<u8>; 2],
        expected: &BTreeMap<u64, Entry>,
        copy: usize,
        damage: &dyn Fn(&mut Vec<u8>),
        twice: bool,
        what: &str,
    ) {
        let mut damaged = files.clone();
        damage(&mut damaged[copy]);
        let dir = with_files(&damaged);
        let states = GroupStates::open(dir.path(), 0, boot())
            .unwrap_or_else(|e| panic!("{what} in copy {copy}: {e}"));
        assert_eq!(&states.states, expected, "{what} in copy {copy}");
        assert!(states.damaged_groups().is_empty(), "{what} in copy {copy}");
        drop(states);
        if twice {
            let mut repaired = read_files(dir.path());
            damage(&mut repaired[1 - copy]);
            let dir = with_files(&repaired);
            let states = GroupStates::open(dir.path(), 0, boot())
                .unwrap_or_else(|e| panic!("{what} in both copies in turn: {e}"));
            assert_eq!(&states.states, expected, "{what} in both copies in turn");
        }
    }

    #[test]
    fn a_flipped_bit_anywhere_in_either_copy_never_rolls_a_group_back() {
        let (dir, expected) = written_table(12);
        let files = read_files(dir.path());
        for copy in 0..2 {
            for at in 0..files[copy].len() {
                let flip = move |bytes: &mut Vec<u8>| bytes[at] ^= 1 << (at % 8);
                let what = format!("bit {} of byte {at}", at % 8);
                assert_survives(&files, &expected, copy, &flip, at % 5 == 0, &what);
            }
        }
    }

    #[test]
    fn a_zeroed_page_or_a_lost_tail_in_either_copy_never_rolls_a_group_back() {
        let (dir, expected) = written_table(100);
        let files = read_files(dir.path());
        for copy in 0..2 {
            let len = files[copy].len();
            for at in (0..len).step_by(SECTOR_BYTES) {
                let zero = move |bytes: &mut Vec<u8>| {
                    let end = (at + 4096).min(bytes.len());
                    bytes[at..end].fill(0);
                };
                let what = format!("4 KiB zeroed at {at}");
                assert_survives(&files, &expected, copy, &zero, at % 2048 == 0, &what);
            }
            for at in (0..len).step_by(SLOT_BYTES * 7) {
                let cut = move |bytes: &mut Vec<u8>| bytes.truncate(at);
                assert_survives(&files, &expected, copy, &cut, true, &format!("cut at {at}"));
            }
        }
    }

    #[test]
    fn a_misdirected_write_in_either_copy_never_rolls_a_group_back() {
        let (dir, expected) = written_table(10);
        let files = read_files(dir.path());
        // The header and every slot, each copied over every other.
        let blocks = files[0].len() / SLOT_BYTES;
        for copy in 0..2 {
            for from in 0..blocks {
                for to in (0..blocks).filter(|to| *to != from) {
                    let misdirect = move |bytes: &mut Vec<u8>| {
                        let block = bytes[from * SLOT_BYTES..(from + 1) * SLOT_BYTES].to_vec();
                        bytes[to * SLOT_BYTES..(to + 1) * SLOT_BYTES].copy_from_slice(&block);
                    };
                    let what = format!("block {from} written over block {to}");
                    assert_survives(&files, &expected, copy, &misdirect, from == 0, &what);
                }
            }
        }
        // A write lost in copy 0 (its older slot still there), copy 1 intact: newest.
        let dir = tempfile::tempdir().unwrap();
        let mut states = GroupStates::open(dir.path(), 0, boot()).unwrap();
        states.stage(1, state(1, 1));
        states.stage(2, state(1, 2));
        states.write_staged().unwrap();
        let older = read_files(dir.path());
        states.stage(2, state(2, 2));
        states.write_staged().unwrap();
        let newer = read_files(dir.path());
        let reopened = GroupStates::open(
            with_files(&[older[0].clone(), newer[1].clone()]).path(),
            0,
            boot(),
        )
        .unwrap();
        assert_eq!(reopened.get(2), Some(state(2, 2)));
    }

    #[test]
    fn a_slot_damaged_in_both_copies_names_its_group_and_never_an_older_state() {
        let (dir, expected) = written_table(12);
        let files = read_files(dir.path());
        let states = GroupStates::open(dir.path(), 0, boot()).unwrap();
        let group = 8;
        let at = slot_offset(states.slot_of[&group]) as usize;
        drop(states);

        // The state damaged in both copies, the identity intact: the group is named.
        let mut damaged = files.clone();
        for bytes in &mut damaged {
            bytes[at + STATE_AT + 20] ^= 4;
        }
        let dir = with_files(&damaged);
        let mut states = GroupStates::open(dir.path(), 0, boot()).unwrap();
        assert_eq!(states.damaged_groups(), &BTreeSet::from([group]));
        assert_eq!(states.get(group), None);
        let mut rest = expected.clone();
        rest.remove(&group);
        assert_eq!(states.states, rest);
        // Reopened, still damaged; staged again (a replica recovered from its peers),
        // proven again.
        assert_eq!(
            GroupStates::open(dir.path(), 0, boot())
                .unwrap()
                .damaged_groups(),
            &BTreeSet::from([group])
        );
        states.stage(group, state(9, 9));
        assert!(states.damaged_groups().is_empty());
        states.write_staged().unwrap();
        let states = GroupStates::open(dir.path(), 0, boot()).unwrap();
        assert!(states.damaged_groups().is_empty());
        assert_eq!(states.get(group), Some(state(9, 9)));

        // Zeroed in copy 0, the state damaged in copy 1: named by copy 1.
        let mut damaged = files.clone();
        damaged[0][at..at + SLOT_BYTES].fill(0);
        damaged[1][at + CHECKSUM_AT] ^= 1;
        let states = GroupStates::open(with_files(&damaged).path(), 0, boot()).unwrap();
        assert_eq!(states.damaged_groups(), &BTreeSet::from([group]));

        // Copy 1 missing and the slot damaged in copy 0: named, and still named once
        // open has rebuilt copy 1.
        let dir = with_files(&[damaged[1].clone(), Vec::new()]);
        std::fs::remove_file(dir.path().join("shard-0.1")).unwrap();
        let states = GroupStates::open(dir.path(), 0, boot()).unwrap();
        assert_eq!(states.damaged_groups(), &BTreeSet::from([group]));
        assert_eq!(states.states, rest);
        let states = GroupStates::open(dir.path(), 0, boot()).unwrap();
        assert_eq!(states.damaged_groups(), &BTreeSet::from([group]));

        // Zeroed in both copies: nothing says whose it was, so open refuses, naming
        // the files and the offset.
        let mut damaged = files.clone();
        for bytes in &mut damaged {
            bytes[at..at + SLOT_BYTES].fill(0);
        }
        let refused = GroupStates::open(with_files(&damaged).path(), 0, boot()).unwrap_err();
        assert!(
            matches!(refused, StatesError::Unattributable { .. }),
            "{refused}"
        );
        let message = refused.to_string();
        assert!(
            message.contains("shard-0.0") && message.contains("shard-0.1"),
            "{message}"
        );
        assert!(message.contains(&format!("offset {at}")), "{message}");

        // Copy 1 holds a newer write than copy 0 (whose write was lost) and it is
        // damaged: copy 0's older state is not served; the group is named.
        let dir = tempfile::tempdir().unwrap();
        let mut states = GroupStates::open(dir.path(), 0, boot()).unwrap();
        states.stage(1, state(1, 1));
        states.stage(2, state(1, 2));
        states.write_staged().unwrap();
        let older = read_files(dir.path());
        states.stage(2, state(2, 2));
        states.write_staged().unwrap();
        let mut newer = read_files(dir.path());
        let at = slot_offset(states.slot_of[&2]) as usize;
        newer[1][at + STATE_AT] ^= 1;
        let states = GroupStates::open(
            with_files(&[older[0].clone(), newer[1].clone()]).path(),
            0,
            boot(),
        )
        .unwrap();
        assert_eq!(states.get(2), None);
        assert_eq!(states.damaged_groups(), &BTreeSet::from([2]));
        assert_eq!(states.get(1), Some(state(1, 1)));
    }

    #[test]
    fn a_missing_copy_is_rebuilt_and_both_missing_is_a_new_shard() {
        let (dir, expected) = written_table(12);
        let [zero, one] = paths(dir.path(), 0);
        for (gone, other) in [(&one, &zero), (&zero, &one)] {
            std::fs::remove_file(gone).unwrap();
            let states = GroupStates::open(dir.path(), 0, boot()).unwrap();
            assert!(!states.was_created());
            assert_eq!(states.states, expected);
            // Rebuilt whole: it alone now holds every group.
            std::fs::remove_file(other).unwrap();
            let states = GroupStates::open(dir.path(), 0, boot()).unwrap();
            assert!(!states.was_created());
            assert_eq!(states.states, expected);
        }
        // Both missing: a new shard, which the caller can tell from a lost one.
        std::fs::remove_file(&zero).unwrap();
        std::fs::remove_file(&one).unwrap();
        let states = GroupStates::open(dir.path(), 0, boot()).unwrap();
        assert!(states.was_created());
        assert_eq!(states.groups().count(), 0);
        assert!(!GroupStates::open(dir.path(), 0, boot())
            .unwrap()
            .was_created());
        // Both empty: damage, not a new shard.
        std::fs::write(&zero, b"").unwrap();
        std::fs::write(&one, b"").unwrap();
        assert!(matches!(
            GroupStates::open(dir.path(), 0, boot()),
            Err(StatesError::NoIntactCopy { .. })
        ));
    }
}
