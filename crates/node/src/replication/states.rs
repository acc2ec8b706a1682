//! The durable states (view, log view, commit, journal trusted through) of every group
//! a shard hosts: one fixed slot per group in each of two copies, `shard-N.0` and
//! `shard-N.1`. A batch of state changes costs what changed: the staged slots are
//! written to copy 0 and synced, then the same slots to copy 1 and synced. Two
//! `fdatasync`s however many groups changed, a few hundred bytes for one group among
//! ten thousand, and nothing at all while nothing changes.
//!
//! # Layout
//!
//! A copy is a 128-byte header (magic `BRDVST04`, the slot size, the slots counted,
//! CRC32C) and then the slots, 128 bytes each, slot `i` at `128 * (i + 1)`. Every
//! CRC32C is seeded with the magic and the table's name (`codec::Sums`), so another
//! table's bytes never pass here. A slot
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
//! replica that lost its disk, or refuses to start). A slot that names no group in
//! either copy is kept out of use and reported ([`GroupStates::unattributable`]): a
//! lone replica refuses to start, naming the files and the offset; a member of a
//! cluster restarts every group of the shard with files and no proven state as a
//! replica that lost its disk. The header counts the
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
use codec::{
    be32, be64, decode_header, decode_slot, encode_header, encode_slot, runs, slot_offset, Sums,
};

/// The magic of the slotted layout, its sums seeded with the table's name.
const MAGIC: &[u8; 8] = b"BRDVST04";
/// The slotted layout with sums seeded with the magic alone: read, and put in place
/// as `BRDVST04` by the open that reads it.
const MAGIC_UNSALTED: &[u8; 8] = b"BRDVST03";
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

fn io(path: &Path) -> impl Fn(std::io::Error) -> StatesError + '_ {
    move |source| StatesError::Io {
        path: path.to_owned(),
        source,
    }
}

/// A copy's bytes, or `None` when it does not exist.
fn read_copy(path: &Path) -> Result<Option<Vec<u8>>, StatesError> {
    match braid_storage::disk::read(path) {
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
    /// The sums its format takes.
    sums: Sums,
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
            Some(slot) => decode_slot(index, slot, self.sums),
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
    /// How its checksums are seeded (its format and name).
    sums: Sums,
    /// Where a whole copy is written before it is renamed into place.
    tmp: PathBuf,
    /// Each copy's file, kept open between writes: a write opens nothing, so that a
    /// process out of file descriptors still writes its states (it opened each copy on
    /// every write, one more way EMFILE stopped every group of a shard), and spends two
    /// syscalls less. Closed when [`GroupStates::install`] renames a new copy over it.
    open: [Option<std::fs::File>; 2],
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
    /// Each group staged since the last write: its entry before (`None`: it had
    /// none), so that a group dropped in the turn that staged it can be unstaged
    /// ([`GroupStates::unstage`]).
    before_staged: BTreeMap<u64, Option<Entry>>,
    /// The slot count each copy's header holds (`None`: to be written).
    headers: [Option<u32>; 2],
    /// The sequence number of the last write.
    seq: u64,
    /// Groups whose state open could not prove, not staged or removed since.
    damaged: BTreeSet<u64>,
    /// Whether open found no copy and made a new shard.
    created: bool,
    /// Offsets of the slots damaged in both copies that name no group: kept out of
    /// use, never written, so that every open finds them again.
    unattributable: Vec<u64>,
    poisoned: bool,
}

impl GroupStates {
    /// Opens shard `shard`'s states in `dir` (made durable if new): each group's newest
    /// intact slot, any copy damage repaired (written to both copies) before it
    /// returns. What is staged from now on is stamped `boot`.
    ///
    /// # Errors
    /// [`StatesError::NoIntactCopy`] when copies exist and no header (or old table) is
    /// intact, or an IO error. (A slot damaged in both copies without naming its group
    /// is no error here: see [`GroupStates::unattributable`].)
    pub(crate) fn open(dir: &Path, shard: usize, boot: BootId) -> Result<Self, StatesError> {
        braid_storage::create_dir_durable(dir).map_err(io(dir))?;
        let mut store = Self {
            dir: dir.to_owned(),
            paths: [0, 1].map(|i| dir.join(format!("shard-{shard}.{i}"))),
            sums: Sums::of_table(&table_name(dir, shard)),
            tmp: dir.join(format!("shard-{shard}.tmp")),
            open: [None, None],
            boot,
            states: BTreeMap::new(),
            owners: Vec::new(),
            slot_of: BTreeMap::new(),
            free: BTreeSet::new(),
            dirty: BTreeSet::new(),
            staged: Vec::new(),
            staged_set: BTreeSet::new(),
            before_staged: BTreeMap::new(),
            headers: [None, None],
            seq: 0,
            damaged: BTreeSet::new(),
            created: false,
            unattributable: Vec::new(),
            poisoned: false,
        };
        let copies = [read_copy(&store.paths[0])?, read_copy(&store.paths[1])?];
        let present = || copies.iter().flatten();
        if present().any(|bytes| bytes.starts_with(MAGIC) || bytes.starts_with(MAGIC_UNSALTED)) {
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
            .filter_map(|bytes| legacy::decode_table(bytes).ok());
        let Some((batch, table)) = tables.max_by_key(|(batch, _)| *batch) else {
            let reason = self.describe(copies, |bytes| match legacy::decode_table(bytes) {
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
        // Each copy is replaced by a new file: what was open is not it.
        self.open = [None, None];
        let seq = self.seq + 1;
        let count = self.owners.len() as u32;
        let mut bytes = encode_header(count, self.sums).to_vec();
        for index in 0..count {
            bytes.extend_from_slice(&self.slot_bytes(index, seq));
        }
        let tmp = &self.tmp;
        for path in &self.paths {
            disk::write_file(tmp, &bytes).map_err(io(tmp))?;
            let file = disk::open(std::fs::OpenOptions::new().read(true), tmp).map_err(io(tmp))?;
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
        let own = self.sums;
        let copies = copies.map(|bytes| match bytes {
            Some(bytes) if is_old_table(&bytes) => CopyRead {
                bytes: None,
                count: Err("a table from before the upgrade".into()),
                sums: own,
            },
            Some(bytes) => {
                let sums = if bytes.starts_with(MAGIC_UNSALTED) {
                    Sums::unsalted()
                } else {
                    own
                };
                CopyRead {
                    count: decode_header(&bytes, sums),
                    bytes: Some(bytes),
                    sums,
                }
            }
            None => CopyRead {
                bytes: None,
                count: Err("absent".into()),
                sums: own,
            },
        });
        let unsalted = copies
            .iter()
            .any(|copy| copy.bytes.is_some() && copy.sums.is_unsalted());
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
                tracing::warn!(
                    files = %self.files(),
                    offset = slot_offset(index),
                    "replica states: a slot is damaged in both copies and names no group; \
                     every group of this shard without a proven state restarts as a \
                     replica that lost its disk"
                );
                self.unattributable.push(slot_offset(index));
            }
            resolved.push(slot);
        }
        self.warn_of_slots(&damaged_at);
        let copied = self.settle(resolved);
        if unsalted {
            if self.damaged.is_empty() {
                // Every slot proven: the table goes in place whole in the current
                // format (as from the first formats), each copy renamed over.
                self.install()?;
                tracing::info!(
                    dir = %self.dir.display(),
                    "replica states upgraded to sums seeded with the table's name ({})",
                    String::from_utf8_lossy(MAGIC)
                );
                return Ok(());
            }
            // A lost slot's evidence stays as it was found (its copies' bytes): the
            // table keeps the format before until an open finds every slot proven.
            self.sums = Sums::unsalted();
        }
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
                // Out of use (neither free nor owned), never written: the group it
                // held is unknown, and the next open must find it again, until every
                // group that may have been its own has a proven state of its own.
                Resolved::Unattributable => {}
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

    /// The two copies' paths, for an error that names them.
    pub(crate) fn files(&self) -> String {
        format!(
            "{} and {}",
            self.paths[0].display(),
            self.paths[1].display()
        )
    }

    /// A slot damaged in both copies and naming no group, if open found one: some
    /// group's state is lost, and which is unknown. A lone replica refuses to start
    /// with it; a member of a cluster restarts every group of the shard that has
    /// files and no proven state as a replica that lost its disk (peers hold what it
    /// lost).
    pub(crate) fn unattributable(&self) -> Option<StatesError> {
        let offset = *self.unattributable.first()?;
        Some(StatesError::Unattributable {
            files: self.files(),
            offset,
        })
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
        let before = self.states.insert(group, Entry { state, stamp });
        self.before_staged.entry(group).or_insert(before);
        self.damaged.remove(&group);
        let slot = self.slot_for(group);
        self.dirty.insert(slot);
        if self.staged_set.insert(group) {
            self.staged.push(group);
        }
    }

    /// Takes back what was staged for `group` since the last write, as if its turn had
    /// not run (a group dropped in the turn that staged it: what it staged may rest on
    /// journal writes that will not be synced, as after a crash of that group alone).
    pub(crate) fn unstage(&mut self, group: u64) {
        let Some(before) = self.before_staged.remove(&group) else {
            return;
        };
        match before {
            Some(entry) => {
                self.states.insert(group, entry);
            }
            None => {
                self.states.remove(&group);
            }
        }
        // Its slot, still dirty, is written as it was: the same bytes again.
        self.staged_set.remove(&group);
        self.staged.retain(|g| *g != group);
    }

    /// Stages `state` for `group` and writes what is staged now, synced: for a state
    /// that must be durable before the group's first step. The staged groups are still
    /// reported by the next [`GroupStates::write_staged`].
    ///
    /// # Errors
    /// As [`GroupStates::write_staged`].
    pub(crate) fn write_now(&mut self, group: u64, state: DurableState) -> Result<(), StatesError> {
        if self.poisoned {
            return Err(StatesError::Poisoned);
        }
        self.stage(group, state);
        self.write_dirty()
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
        encode_slot(index, seq, content, self.sums)
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
        // Durable now: nothing written can be taken back.
        self.before_staged.clear();
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
            let (file, created) = match self.open[copy].take() {
                Some(file) => (file, false),
                None => disk::open_or_create(path).map_err(io(path))?,
            };
            if self.headers[copy] != Some(count) {
                disk::write_at(&file, path, &encode_header(count, self.sums), 0)
                    .map_err(io(path))?;
            }
            for (offset, run) in &runs(slots) {
                disk::write_at(&file, path, run, *offset).map_err(io(path))?;
            }
            disk::sync_data(&file, path).map_err(io(path))?;
            if created {
                disk::sync_dir(&self.dir).map_err(io(&self.dir))?;
            }
            self.headers[copy] = Some(count);
            self.open[copy] = Some(file);
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

/// The name a table's sums are seeded with: its role (the metadata group's table, or
/// the partitions' of a shard, by the directory a node keeps it in) and its shard:
/// `metadata/shard-0`, `replication/shard-1`. A table elsewhere (a test's) is
/// `states/shard-N`, wherever it is copied to.
fn table_name(dir: &Path, shard: usize) -> String {
    let role = dir
        .file_name()
        .and_then(|name| name.to_str())
        .filter(|role| matches!(*role, "metadata" | "replication"))
        .unwrap_or("states");
    format!("{role}/shard-{shard}")
}

mod codec;
mod legacy;
#[cfg(test)]
mod tests;
mod warnings;
