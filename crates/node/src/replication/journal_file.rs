//! A VSR journal in one append-only file: every journal output of the replica is one
//! CRC-framed record, and replaying the records rebuilds the slots the replica restarts
//! from. The metadata group keeps whole prepares in it; a partition group keeps only
//! headers in it, each with where its body (a record batch) sits in the partition log
//! (see `partition_journal`).
//!
//! Records are `length: u32, crc32c: u32, kind: u8, payload`, the CRC over length,
//! kind and payload (so zero-filled extents never pass), seeded with the group's id and
//! the record's byte position ([`Seal`]: a record of another journal, or of this one
//! at another place, written here by a misdirected write, is damage). Kinds: 1 a prepare (encoded
//! header, body), 2 a header whose body must be repaired, 3 a truncation (entries above
//! an op go), 4 a prune (entries at or below an op go), 5 an op whose entry was lost to
//! damage (so it is reported damaged, never absent, until it is written again), 6 a
//! prepare whose body is elsewhere (encoded header, then the body's base offset in the
//! partition log, `u64`), 7 a prune that also records where the partition log ends
//! after the pruned op (`op: u64, log_end: u64`). Writes are appended unsynced;
//! [`JournalFile::sync`] makes them durable, and only then does the host report them
//! written, so one `fdatasync` covers every write of a turn.
//!
//! Every sync, once done, appends 8, a sync marker (`synced_len: u64, op_max: u64`:
//! every record starting before that byte was made durable by a sync that finished,
//! and for a partition so were their batches; `op_max` is the highest op held then, so
//! an op whose record is damaged is still known). So every record reported written has an intact
//! record after it once the marker reaches the disk: damage to the last record reported
//! reads as damage, never as a torn tail (absent); and a partition's journal can tell
//! an op whose batch is known synced from one that never was.
//!
//! Opening cuts a torn tail (a bad record that no intact record follows). Damage that
//! intact records follow is not cut and not trusted: a lost truncation could bring a
//! stale prepare back, so every op above the prune point is reported damaged (and the
//! file rewritten so), and the replica repairs them from its peers. The file is rewritten with only its live
//! slots when it grows past [`COMPACT_BYTES`].

use std::fs::File;
use std::path::{Path, PathBuf};

use braid_storage::disk;

use super::shared_path::SharedPath;
use braid_vsr::op_map::OpMap;
use braid_vsr::{Header, JournalSlot, Prepare};

const MAGIC: &[u8; 8] = b"BRDJNLS3";
/// The magic of a journal written before seals (read and appended to with CRCs
/// unseeded, and sealed when next rewritten). Five bits from [`MAGIC`], so that no
/// flipped bit makes one the other.
const MAGIC_UNSEALED: &[u8; 8] = b"BRDJNL02";
/// The magic of a journal written before the head (read, appended to without a head
/// or seal, and given both when next rewritten).
const MAGIC_HEADLESS: &[u8; 8] = b"BRDJNL01";
/// Where the records start in a file with a head.
const RECORDS_START: usize = MAGIC.len() + HEAD_BYTES;
/// Bytes before a record's payload: length, CRC, kind.
const RECORD_HEAD: usize = 4 + 4 + 1;
/// Largest record accepted on replay (a metadata op is far smaller).
const RECORD_BYTES_MAX: usize = 64 << 20;
/// The file is rewritten with its live slots when it grows past this.
pub(crate) const COMPACT_BYTES: u64 = 4 << 20;

const KIND_PREPARE: u8 = 1;
const KIND_HEADER: u8 = 2;
const KIND_TRUNCATE: u8 = 3;
const KIND_PRUNE: u8 = 4;
const KIND_DAMAGED: u8 = 5;
const KIND_EXTERNAL: u8 = 6;
const KIND_PRUNE_AT: u8 = 7;
const KIND_SYNCED: u8 = 8;
const KIND_COMMITTED_END: u8 = 9;
/// A durability marker: every record before this byte was made durable by a sync
/// that finished (their batches perhaps not): written, and synced, after a sync that
/// a state write rests on (see [`JournalFile::sync_unmarked`]).
const KIND_DURABLE: u8 = 10;
/// Bytes of a sync marker record: its head, the length synced and the highest op.
#[cfg(test)]
const SYNC_MARKER_BYTES: usize = RECORD_HEAD + 16;

/// Why the journal could not be read or written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub(crate) enum JournalError {
    /// A disk operation failed.
    #[error("journal {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The file is not a journal.
    #[error("journal {path}: not a journal file (bad magic)")]
    NotAJournal {
        /// The file.
        path: PathBuf,
    },
    /// A write failed earlier: what reached the disk is unknown until a restart.
    #[error("journal {0} is poisoned by an earlier failed write; restart the node")]
    Poisoned(PathBuf),
    /// A lone replica's journal lost records it had made durable (its tail cut short
    /// or damaged at rest below its head's durable end): refused before anything is
    /// cut, since no peer holds what may be gone.
    #[error(
        "journal {path} lost records it had made durable (cut short or damaged at rest): \
         acknowledged ops may be gone, and a lone replica has no peer to repair them \
         from; nothing was cut (see \"Damage a replica finds in its replication files\" \
         in docs/operations.md)"
    )]
    DurableTailLost {
        /// The file.
        path: PathBuf,
    },
    /// A journal put to sleep found otherwise when woken ([`JournalFile::wake`]).
    #[error("journal {path} is not as it was left: {reason}")]
    NotAsLeft {
        /// The file.
        path: PathBuf,
        /// What differs.
        reason: String,
    },
}

/// What opening found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Recovered {
    /// The slots, by op, for `Persisted::journal`.
    pub(crate) slots: Vec<(u64, JournalSlot)>,
    /// Bytes cut from a torn tail.
    pub(crate) torn_tail_bytes: u64,
    /// Whether the cut tail may have held a record a sync covered, damaged at rest: it
    /// was not just the sync marker appended after the last sync (see
    /// [`only_an_unsynced_marker`]).
    pub(crate) tail_may_hide: bool,
    /// Entries at or below this op were pruned (a checkpoint covers them).
    pub(crate) pruned_through: u64,
    /// Damage with intact records after it was found at this byte: every slot above
    /// the prune point is reported damaged.
    pub(crate) damaged_at: Option<u64>,
    /// The ops whose body is elsewhere, with its base offset (their slot is the
    /// header: the holder of the bodies reads them in).
    pub(crate) external: Vec<(u64, u64)>,
    /// Where the partition log ends after the pruned op, if the prune recorded it.
    pub(crate) pruned_log_end: Option<u64>,
    /// Where the partition log was last recorded to be the committed one, if it was.
    pub(crate) committed_end: Option<u64>,
    /// The ops whose entry a sync is proven to have covered (a sync marker follows its
    /// record): written, and so perhaps reported.
    pub(crate) synced: std::collections::BTreeSet<u64>,
    /// The journal as of its last durability marker (what a power loss cannot take
    /// back): an open that cuts a later, unmarked record of an op falls back to the
    /// header it held there, since a durable log view may name it.
    pub(crate) durable: DurablePrefix,
}

/// An entry in memory: a whole prepare, a header alone, or an op known to have been
/// written whose bytes were lost to damage (kept so it is never reported absent).
#[derive(Debug, Clone, PartialEq, Eq)]
enum Entry {
    Prepare(Prepare),
    Header(Header),
    Damaged(u64),
    External { header: Header, base_offset: u64 },
}

/// One group's journal file.
#[derive(Debug)]
pub(crate) struct JournalFile {
    path: SharedPath,
    /// The open file, or `None` once released (an idle partition holds no file); it is
    /// opened again by the next write or sync (a sync covers the file, whichever
    /// descriptor wrote it).
    file: Option<std::sync::Arc<File>>,
    len: u64,
    entries: OpMap<Entry>,
    /// Entries at or below this op were pruned.
    pruned_through: u64,
    /// Where the partition log ends after `pruned_through`, if known.
    pruned_log_end: Option<u64>,
    /// Where the partition log was last recorded to be the committed one.
    committed_end: Option<u64>,
    /// Prepares written since the last sync (op, checksum): reported after it.
    unsynced: Vec<(u64, braid_vsr::Checksum)>,
    /// The file's length after its last sync marker: a sync with nothing written since
    /// adds none.
    marked_len: u64,
    /// The length the last durability marker covers (see [`JournalFile::sync_unmarked`]).
    durable_marked_len: u64,
    /// How many times the file was rewritten (compacted) in this process: a sync's
    /// covered length means nothing in a later generation's file.
    generation: u64,
    /// Whether the file has a head (a copy of its newest markers, see `head`); a
    /// file written before heads has none until it is rewritten.
    headed: bool,
    /// The group whose journal this is: the seed of its CRCs.
    group: u64,
    /// Whether the file's CRCs are sealed with `group`; a file written before seals
    /// is not until it is rewritten.
    sealed: bool,
    /// Head copies written: the next goes to copy `head_writes % 2`, unless one is
    /// still in flight.
    head_writes: u64,
    /// The file's length at the last head write while no finished sync covers it
    /// (see [`JournalFile::write_head`]).
    head_pending: Option<u64>,
    poisoned: bool,
}

/// The bytes of a journal file a sync covers, in the file as it was when the sync
/// began.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SyncedLen {
    generation: u64,
    len: u64,
}

impl SyncedLen {
    /// Whether a sync of this much makes `end` durable: the same file through `end`,
    /// or a later one (a rewrite is synced whole before it replaces the file).
    pub(crate) fn covers(&self, end: SyncedLen) -> bool {
        end.generation < self.generation
            || (end.generation == self.generation && end.len <= self.len)
    }
}

/// A record's bytes, its CRC left for [`seal_record`] where it is written.
fn record(kind: u8, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(RECORD_HEAD + payload.len());
    out.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    out.extend_from_slice(&[0; 4]);
    out.push(kind);
    out.extend_from_slice(payload);
    out
}

/// Sets the CRC of `record`, to be written at byte `at` of a file sealed with `seal`.
fn seal_record(record: &mut [u8], seal: Seal, at: u64) {
    let crc = record_crc(
        seal.record_seed(at),
        &record[..4],
        record[8],
        &record[RECORD_HEAD..],
    );
    record[4..8].copy_from_slice(&crc.to_be_bytes());
}

/// Appends `record` to `bytes`, sealed for its place there.
fn push_sealed(bytes: &mut Vec<u8>, seal: Seal, mut record: Vec<u8>) {
    seal_record(&mut record, seal, bytes.len() as u64);
    bytes.extend(record);
}

fn record_crc(seed: u32, len: &[u8], kind: u8, payload: &[u8]) -> u32 {
    let crc = crc32c::crc32c_append(seed, len);
    let crc = crc32c::crc32c_append(crc, &[kind]);
    crc32c::crc32c_append(crc, payload)
}

/// A record's meaning.
#[derive(Debug)]
enum Decoded {
    Entry(Entry),
    Truncate(u64),
    Prune(u64, Option<u64>),
    /// The partition log is the committed one up to this offset.
    CommittedEnd(u64),
    /// A sync marker: every record before this byte was synced, and the highest op
    /// held then.
    Synced(u64, u64),
    /// A durability marker: every record before this byte was synced.
    Durable(u64),
}

/// The record at the start of `bytes` and its length, if its frame is intact (its CRC
/// from `seed`) and its payload decodes (an intact frame around a payload that does
/// not is damage too).
fn parse(bytes: &[u8], seed: u32) -> Option<(Decoded, usize)> {
    let head = bytes.get(..RECORD_HEAD)?;
    let len = u32::from_be_bytes([head[0], head[1], head[2], head[3]]) as usize;
    if len > RECORD_BYTES_MAX {
        return None;
    }
    let crc = u32::from_be_bytes([head[4], head[5], head[6], head[7]]);
    let kind = head[8];
    let payload = bytes.get(RECORD_HEAD..RECORD_HEAD + len)?;
    if record_crc(seed, &head[..4], kind, payload) != crc {
        return None;
    }
    let op = || payload.try_into().ok().map(u64::from_be_bytes);
    let decoded = match kind {
        KIND_PREPARE | KIND_HEADER => {
            let header = Header::decode(payload.get(..Header::ENCODED_BYTES)?).ok()?;
            let body = &payload[Header::ENCODED_BYTES..];
            if kind == KIND_HEADER {
                if !body.is_empty() {
                    return None;
                }
                Decoded::Entry(Entry::Header(header))
            } else {
                let prepare = Prepare {
                    header,
                    body: bytes::Bytes::copy_from_slice(body),
                };
                if !prepare.valid() {
                    return None;
                }
                Decoded::Entry(Entry::Prepare(prepare))
            }
        }
        KIND_EXTERNAL => {
            let header = Header::decode(payload.get(..Header::ENCODED_BYTES)?).ok()?;
            let offset = payload.get(Header::ENCODED_BYTES..)?.try_into().ok()?;
            Decoded::Entry(Entry::External {
                header,
                base_offset: u64::from_be_bytes(offset),
            })
        }
        KIND_TRUNCATE => Decoded::Truncate(op()?),
        KIND_PRUNE => Decoded::Prune(op()?, None),
        KIND_PRUNE_AT => {
            let op = u64::from_be_bytes(payload.get(..8)?.try_into().ok()?);
            let end = u64::from_be_bytes(payload.get(8..)?.try_into().ok()?);
            Decoded::Prune(op, Some(end))
        }
        KIND_DAMAGED => Decoded::Entry(Entry::Damaged(op()?)),
        KIND_COMMITTED_END => Decoded::CommittedEnd(op()?),
        KIND_DURABLE => Decoded::Durable(op()?),
        KIND_SYNCED => {
            let len = u64::from_be_bytes(payload.get(..8)?.try_into().ok()?);
            let op_max = u64::from_be_bytes(payload.get(8..)?.try_into().ok()?);
            Decoded::Synced(len, op_max)
        }
        _ => return None,
    };
    Some((decoded, RECORD_HEAD + len))
}

/// The record at byte `at` of `bytes`, a file sealed with `seal`, as [`parse`]; a sync
/// marker that names bytes after itself (a misdirected copy) is no record.
fn parse_at(bytes: &[u8], at: usize, seal: Seal) -> Option<(Decoded, usize)> {
    match parse(bytes.get(at..)?, seal.record_seed(at as u64))? {
        (Decoded::Synced(synced_len, _) | Decoded::Durable(synced_len), _)
            if synced_len > at as u64 =>
        {
            None
        }
        parsed => Some(parsed),
    }
}

impl Entry {
    fn checksum(&self) -> Option<braid_vsr::Checksum> {
        match self {
            Self::Prepare(p) => Some(p.header.checksum),
            Self::Header(h) | Self::External { header: h, .. } => Some(h.checksum),
            Self::Damaged(_) => None,
        }
    }

    fn op(&self) -> u64 {
        match self {
            Self::Prepare(p) => p.header.op,
            Self::Header(h) | Self::External { header: h, .. } => h.op,
            Self::Damaged(op) => *op,
        }
    }

    fn slot(&self) -> JournalSlot {
        match self {
            Self::Prepare(p) => JournalSlot::Prepare(p.clone()),
            Self::Header(h) | Self::External { header: h, .. } => JournalSlot::Header(*h),
            Self::Damaged(_) => JournalSlot::Damaged,
        }
    }

    fn record(&self) -> Vec<u8> {
        match self {
            Self::Prepare(p) => {
                let mut payload = p.header.encode().to_vec();
                payload.extend_from_slice(&p.body);
                record(KIND_PREPARE, &payload)
            }
            Self::Header(h) => record(KIND_HEADER, &h.encode()),
            Self::Damaged(op) => record(KIND_DAMAGED, &op.to_be_bytes()),
            Self::External {
                header,
                base_offset,
            } => {
                let mut payload = header.encode().to_vec();
                payload.extend_from_slice(&base_offset.to_be_bytes());
                record(KIND_EXTERNAL, &payload)
            }
        }
    }
}

fn replay(
    entries: &mut OpMap<Entry>,
    pruned: &mut (u64, Option<u64>),
    committed_end: &mut Option<u64>,
    decoded: Decoded,
) {
    match decoded {
        Decoded::Entry(entry) => {
            if entry.op() > pruned.0 {
                entries.insert(entry.op(), entry);
            }
        }
        Decoded::Truncate(op) => entries.retain(|o, _| *o <= op),
        Decoded::Prune(op, log_end) => {
            if op >= pruned.0 {
                *pruned = (op, log_end.or(if op == pruned.0 { pruned.1 } else { None }));
            }
            entries.retain(|o, _| *o > op);
        }
        Decoded::CommittedEnd(end) => *committed_end = Some(end),
        Decoded::Synced(..) | Decoded::Durable(_) => {}
    }
}

fn prune_record(op: u64, log_end: Option<u64>) -> Vec<u8> {
    match log_end {
        Some(end) => {
            let mut payload = op.to_be_bytes().to_vec();
            payload.extend_from_slice(&end.to_be_bytes());
            record(KIND_PRUNE_AT, &payload)
        }
        None => record(KIND_PRUNE, &op.to_be_bytes()),
    }
}

/// Whether the journal file at `path` is gone, or too short to hold even the beginning
/// a journal is created with (its magic and head, written and synced whole before
/// anything names the journal). For a group something already names (a durable state,
/// batches in its log) that is loss or damage, never a new journal: an open would take
/// such a file for a creation torn short and make it anew, empty (an outside review of
/// issue 24: a single node's `vsr.journal` cut below 64 bytes restarted the partition
/// empty, its log cut to match, and its acknowledged offsets given to new records).
pub(crate) fn gone_or_cut_short(path: &Path) -> bool {
    let Ok(len) = std::fs::metadata(path).map(|m| m.len()) else {
        return true;
    };
    if len >= RECORDS_START as u64 {
        return false;
    }
    // Short: whole only as a journal of the first format, whose magic alone is a
    // whole, empty one.
    // A read refused a descriptor says nothing of the file: the open that follows
    // fails the same way, and is tried again.
    disk::read(path).map_or_else(
        |err| !disk::is_out_of_descriptors(&err),
        |bytes| !bytes.starts_with(MAGIC_HEADLESS),
    )
}

/// The file beside `journal` whose presence says an open found the journal untrusted
/// (lost, unreadable, or with a cut tail that may hide acknowledged ops) and its
/// group's durable state may not say so yet: `<journal>.untrusted`.
pub(crate) fn untrusted_mark(journal: &Path) -> PathBuf {
    let mut path = journal.as_os_str().to_owned();
    path.push(".untrusted");
    PathBuf::from(path)
}

/// Makes `journal`'s untrusted mark, durably (the file and its directory entry).
///
/// # Errors
/// A disk operation failed.
pub(crate) fn mark_untrusted(journal: &Path) -> Result<(), JournalError> {
    let path = untrusted_mark(journal);
    let dir = path.parent().unwrap_or(Path::new("."));
    let (file, _) = disk::open_or_create(&path).map_err(io(&path))?;
    disk::sync_data(&file, &path).map_err(io(&path))?;
    disk::sync_dir(dir).map_err(io(&path))?;
    Ok(())
}

/// Removes `journal`'s untrusted mark, durably, if it is there: the group's state now
/// says what it said.
///
/// # Errors
/// A disk operation failed.
pub(crate) fn clear_untrusted_mark(journal: &Path) -> Result<(), JournalError> {
    let path = untrusted_mark(journal);
    let dir = path.parent().unwrap_or(Path::new("."));
    match disk::remove(&path) {
        Ok(()) => disk::sync_dir(dir).map_err(io(&path)),
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(err) => Err(io(&path)(err)),
    }
}

fn io(path: &Path) -> impl Fn(std::io::Error) -> JournalError + '_ {
    move |source| JournalError::Io {
        path: path.to_owned(),
        source,
    }
}

impl JournalFile {
    /// Opens (or creates, durably) the journal of group `group` at `path`.
    ///
    /// # Errors
    /// IO errors, or a file that is not a journal.
    pub(crate) fn open(path: &Path, group: u64) -> Result<(Self, Recovered), JournalError> {
        Self::open_marking(path, group, false, false, || Ok(()))
    }

    /// The journal's file.
    pub(crate) fn path(&self) -> PathBuf {
        self.path.get()
    }

    /// The open file, opened again if it was released.
    fn handle(&mut self) -> Result<std::sync::Arc<File>, JournalError> {
        if let Some(file) = &self.file {
            return Ok(std::sync::Arc::clone(file));
        }
        let path = self.path();
        let file = disk::open(File::options().read(true).write(true), &path).map_err(io(&path))?;
        let file = std::sync::Arc::new(file);
        self.file = Some(std::sync::Arc::clone(&file));
        Ok(file)
    }

    /// Closes the file until it is next needed.
    pub(crate) fn release(&mut self) {
        self.file = None;
    }

    fn append_record(&mut self, mut bytes: Vec<u8>) -> Result<(), JournalError> {
        if self.poisoned {
            return Err(JournalError::Poisoned(self.path()));
        }
        seal_record(&mut bytes, self.seal(), self.len);
        let file = self.handle()?;
        if let Err(err) = disk::write_at(&file, &self.path(), &bytes, self.len) {
            self.poisoned = true;
            return Err(io(&self.path())(err));
        }
        self.len += bytes.len() as u64;
        Ok(())
    }

    /// Appends a prepare (replacing any entry at its op); durable at the next sync.
    pub(crate) fn write_prepare(&mut self, prepare: &Prepare) -> Result<(), JournalError> {
        self.write_entry(Entry::Prepare(prepare.clone()))?;
        self.unsynced
            .push((prepare.header.op, prepare.header.checksum));
        Ok(())
    }

    /// Appends a header without its body.
    pub(crate) fn write_header(&mut self, header: &Header) -> Result<(), JournalError> {
        // A header alone stands for a body never written (a view change may drop it):
        // an entry of the same checksum held whole is kept, never downgraded; nor is a
        // damaged slot, whose lost body may have been acknowledged: it reads back
        // damaged until a body is written there (the replica keeps the header in
        // memory meanwhile, and asks for it again after a restart).
        if self.entries.get(&header.op).is_some_and(|e| {
            matches!(e, Entry::Damaged(_)) || e.checksum() == Some(header.checksum)
        }) {
            return Ok(());
        }
        self.write_entry(Entry::Header(*header))
    }

    /// Appends the header of a prepare whose body is at `base_offset` in the partition
    /// log.
    pub(crate) fn write_external(
        &mut self,
        header: &Header,
        base_offset: u64,
    ) -> Result<(), JournalError> {
        self.write_entry(Entry::External {
            header: *header,
            base_offset,
        })
    }

    /// The header at `op` and, if its body is in the partition log, its base offset;
    /// `None` for no entry or a damaged one.
    pub(crate) fn entry(&self, op: u64) -> Option<(&Header, Option<u64>)> {
        match self.entries.get(&op)? {
            Entry::Prepare(p) => Some((&p.header, None)),
            Entry::Header(h) => Some((h, None)),
            Entry::External {
                header,
                base_offset,
            } => Some((header, Some(*base_offset))),
            Entry::Damaged(_) => None,
        }
    }

    /// What `op` holds apart from the partition log: its header alone, or its prepare
    /// whole.
    pub(crate) fn held_apart(&self, op: u64) -> Option<JournalSlot> {
        match self.entries.get(&op)? {
            e @ (Entry::Header(_) | Entry::Prepare(_)) => Some(e.slot()),
            _ => None,
        }
    }

    /// The prune point, and where the partition log ends after it if known.
    pub(crate) fn pruned(&self) -> (u64, Option<u64>) {
        (self.pruned_through, self.pruned_log_end)
    }

    /// The first op above `op` whose body is in the partition log, with its base
    /// offset.
    pub(crate) fn next_external(&self, op: u64) -> Option<(u64, u64)> {
        self.entries.range(op + 1..).find_map(|(o, e)| match e {
            Entry::External { base_offset, .. } => Some((*o, *base_offset)),
            _ => None,
        })
    }

    /// Marks `op` damaged: its body is gone here and may have been acknowledged, so
    /// it reads back damaged (faulty in a vote, never absent) until a prepare is
    /// written there.
    pub(crate) fn write_damaged(&mut self, op: u64) -> Result<(), JournalError> {
        self.write_entry(Entry::Damaged(op))
    }

    /// The file's length as written (synced or not).
    pub(crate) fn len(&self) -> u64 {
        self.len
    }

    /// Whether `op` is held as damaged.
    pub(crate) fn is_damaged(&self, op: u64) -> bool {
        matches!(self.entries.get(&op), Some(Entry::Damaged(_)))
    }

    /// Whether `op` is held whole or as damaged: an entry that stands for a body that
    /// may have been reported written.
    pub(crate) fn holds_body_or_damage(&self, op: u64) -> bool {
        matches!(
            self.entries.get(&op),
            Some(Entry::Prepare(_) | Entry::Damaged(_))
        )
    }

    /// The ops held above `op`, damaged ones too.
    pub(crate) fn ops_above(&self, op: u64) -> impl Iterator<Item = u64> + '_ {
        self.entries.range(op + 1..).map(|(o, _)| *o)
    }

    /// The first op whose body is in the partition log at or after offset `offset`.
    pub(crate) fn first_external_from(&self, offset: u64) -> Option<u64> {
        self.entries.iter().find_map(|(o, e)| match e {
            Entry::External { base_offset, .. } if *base_offset >= offset => Some(*o),
            _ => None,
        })
    }

    /// The whole prepare at `op` if held here with `checksum`, by value.
    pub(crate) fn inline_prepare(&self, op: u64, checksum: braid_vsr::Checksum) -> Option<Prepare> {
        self.prepare(op, checksum).cloned()
    }

    fn write_entry(&mut self, entry: Entry) -> Result<(), JournalError> {
        self.append_record(entry.record())?;
        self.entries.insert(entry.op(), entry);
        Ok(())
    }

    /// Removes entries above `op`.
    pub(crate) fn truncate(&mut self, op: u64) -> Result<(), JournalError> {
        self.append_record(record(KIND_TRUNCATE, &op.to_be_bytes()))?;
        self.entries.retain(|o, _| *o <= op);
        self.unsynced.retain(|(o, _)| *o <= op);
        Ok(())
    }

    /// Removes entries above `op`, except those at or above `keep_from`, which are
    /// written again after the truncation; one whose body is in the partition log is
    /// kept as damaged, since the log is cut beneath it and its batch may have been
    /// acknowledged.
    pub(crate) fn truncate_keeping_from(
        &mut self,
        op: u64,
        keep_from: u64,
    ) -> Result<(), JournalError> {
        let kept: Vec<Entry> = self
            .entries
            .range(keep_from.max(op + 1)..)
            .map(|(o, e)| match e {
                Entry::External { .. } => Entry::Damaged(*o),
                e => e.clone(),
            })
            .collect();
        self.truncate(op)?;
        for entry in kept {
            if let Entry::Prepare(p) = &entry {
                self.unsynced.push((p.header.op, p.header.checksum));
            }
            self.write_entry(entry)?;
        }
        Ok(())
    }

    /// Removes entries at or below `op` (a checkpoint covers them).
    pub(crate) fn prune(&mut self, op: u64) -> Result<(), JournalError> {
        self.prune_at(op, None)
    }

    /// As [`JournalFile::prune`], recording where the partition log ends after `op`.
    pub(crate) fn prune_at(&mut self, op: u64, log_end: Option<u64>) -> Result<(), JournalError> {
        self.append_record(prune_record(op, log_end))?;
        if op >= self.pruned_through {
            self.pruned_log_end = log_end.or(if op == self.pruned_through {
                self.pruned_log_end
            } else {
                None
            });
            self.pruned_through = op;
        }
        self.entries.retain(|o, _| *o > op);
        Ok(())
    }

    /// Records that the partition log is the committed one up to `end` (unsynced, like
    /// any record): what a restart may trust of the log when the journal no longer
    /// holds the ops that showed it.
    ///
    /// # Errors
    /// The write failed (the journal is poisoned).
    pub(crate) fn write_committed_end(&mut self, end: u64) -> Result<(), JournalError> {
        if self.committed_end != Some(end) {
            self.append_record(record(KIND_COMMITTED_END, &end.to_be_bytes()))?;
            self.committed_end = Some(end);
        }
        Ok(())
    }

    /// The prepare at `op`, if held whole with `checksum` (a repair answer).
    pub(crate) fn prepare(&self, op: u64, checksum: braid_vsr::Checksum) -> Option<&Prepare> {
        match self.entries.get(&op) {
            Some(Entry::Prepare(p)) if p.header.checksum == checksum => Some(p),
            _ => None,
        }
    }

    /// Makes every write so far durable and returns the prepares it covers (the host
    /// reports them written), and rewrites the file with its live entries when it has
    /// grown past [`COMPACT_BYTES`].
    ///
    /// # Errors
    /// An IO error poisons the journal.
    pub(crate) fn sync(&mut self) -> Result<Vec<(u64, braid_vsr::Checksum)>, JournalError> {
        self.sync_marked(true)
    }

    /// As [`JournalFile::sync`], for a holder whose records name batches this sync does
    /// not cover: no sync marker is written for it.
    ///
    /// # Errors
    /// As [`JournalFile::sync`].
    pub(crate) fn sync_unmarked(
        &mut self,
    ) -> Result<Vec<(u64, braid_vsr::Checksum)>, JournalError> {
        self.sync_marked(false)
    }

    fn sync_marked(&mut self, mark: bool) -> Result<Vec<(u64, braid_vsr::Checksum)>, JournalError> {
        if self.poisoned {
            return Err(JournalError::Poisoned(self.path()));
        }
        let synced_len = self.len;
        let file = self.handle()?;
        if let Err(err) = disk::sync_data(&file, &self.path()) {
            self.poisoned = true;
            return Err(io(&self.path())(err));
        }
        self.head_pending = None;
        if self.len > COMPACT_BYTES {
            if let Err(err) = self.compact(mark) {
                self.poisoned = true;
                return Err(err);
            }
        } else if mark {
            // The marker is durable before the ops are reported: a record reported
            // written always has an intact marker after it, so a torn tail (no marker
            // after it) can only be writes never reported (see `tail_may_hide`).
            let before = self.len;
            self.note_synced(SyncedLen {
                generation: self.generation,
                len: synced_len,
            })?;
            if self.len > before {
                if let Err(err) = disk::sync_data(&file, &self.path()) {
                    self.poisoned = true;
                    return Err(io(&self.path())(err));
                }
                self.head_pending = None;
            }
        } else if synced_len > self.durable_marked_len {
            // A state write rests on these records (a truncation, a view's headers):
            // a durable marker says so, so that the open reads damage to them as
            // damage, never as a torn tail it may cut (which could bring back the
            // prepares a truncation removed).
            self.append_record(record(KIND_DURABLE, &synced_len.to_be_bytes()))?;
            self.durable_marked_len = synced_len;
            self.write_head()?;
            if let Err(err) = disk::sync_data(&file, &self.path()) {
                self.poisoned = true;
                return Err(io(&self.path())(err));
            }
            self.head_pending = None;
        }
        Ok(std::mem::take(&mut self.unsynced))
    }

    /// The sync marker saying the first `synced_len` bytes were synced.
    fn sync_marker(&self, synced_len: u64) -> Vec<u8> {
        let mut payload = synced_len.to_be_bytes().to_vec();
        payload.extend_from_slice(&self.op_max().to_be_bytes());
        record(KIND_SYNCED, &payload)
    }

    /// The highest op held.
    fn op_max(&self) -> u64 {
        self.entries.keys().next_back().copied().unwrap_or(0)
    }

    /// What the head says now: the newest markers' lengths.
    /// The seal of the file's CRCs.
    fn seal(&self) -> Seal {
        if self.sealed {
            Seal::of(self.group)
        } else {
            Seal::UNSEALED
        }
    }

    fn head(&self) -> Head {
        Head {
            synced_len: self.marked_len,
            op_max: self.op_max(),
            durable_len: self.durable_marked_len.max(self.marked_len),
        }
    }

    /// What a sync that starts now covers: every record written so far.
    pub(crate) fn synced_len_if_synced_now(&self) -> SyncedLen {
        SyncedLen {
            generation: self.generation,
            len: self.len,
        }
    }

    /// A sync that covered `synced` finished (and, for a partition, so did the sync of
    /// their batches): a marker says so, durable with the next sync. Ignored if the
    /// file was rewritten since.
    ///
    /// # Errors
    /// The marker's write failed (the journal is poisoned).
    pub(crate) fn note_synced(&mut self, synced: SyncedLen) -> Result<(), JournalError> {
        if synced.generation == self.generation
            && self
                .head_pending
                .is_some_and(|written_at| synced.len >= written_at)
        {
            // That sync began after the head's last write: it made that copy durable.
            self.head_pending = None;
        }
        if synced.generation == self.generation
            && synced.len > self.marked_len
            && synced.len <= self.len
        {
            self.append_record(self.sync_marker(synced.len))?;
            self.marked_len = synced.len;
            self.write_head()?;
        }
        Ok(())
    }

    /// The prepares written since the last sync, without syncing: for a holder that
    /// reports writes before they are durable (`fsync = interval` or `never`).
    pub(crate) fn take_unsynced(&mut self) -> Vec<(u64, braid_vsr::Checksum)> {
        std::mem::take(&mut self.unsynced)
    }

    /// Writes the live entries to a new file, syncs it and renames it over this one;
    /// with `all_synced` (every entry and every batch it names was synced before), it
    /// ends with a sync marker covering them all.
    fn compact(&mut self, all_synced: bool) -> Result<(), JournalError> {
        let tmp = self.path().with_extension("compact");
        // A rewrite is sealed, whatever the file it replaces was.
        let seal = Seal::of(self.group);
        let mut bytes = MAGIC.to_vec();
        bytes.extend([0; HEAD_BYTES]);
        if self.pruned_through > 0 || self.pruned_log_end.is_some() {
            let prune = prune_record(self.pruned_through, self.pruned_log_end);
            push_sealed(&mut bytes, seal, prune);
        }
        if let Some(end) = self.committed_end {
            let committed = record(KIND_COMMITTED_END, &end.to_be_bytes());
            push_sealed(&mut bytes, seal, committed);
        }
        for entry in self.entries.values() {
            push_sealed(&mut bytes, seal, entry.record());
        }
        let image_len = bytes.len() as u64;
        let marked_len = if all_synced { image_len } else { 0 };
        if all_synced {
            push_sealed(&mut bytes, seal, self.sync_marker(marked_len));
        } else {
            // The image is synced before it is renamed in: durable as a whole, though
            // the batches its records name may not be.
            let durable = record(KIND_DURABLE, &image_len.to_be_bytes());
            push_sealed(&mut bytes, seal, durable);
        }
        let head = Head {
            synced_len: marked_len,
            op_max: self.op_max(),
            durable_len: image_len,
        };
        bytes[MAGIC.len()..RECORDS_START].copy_from_slice(&head.encode(seal));
        disk::write_file(&tmp, &bytes).map_err(io(&tmp))?;
        let file = disk::open(File::options().read(true).write(true), &tmp).map_err(io(&tmp))?;
        disk::sync_data(&file, &tmp).map_err(io(&tmp))?;
        disk::rename(&tmp, &self.path()).map_err(io(&self.path()))?;
        let dir = self.path.dir();
        disk::sync_dir(dir).map_err(io(dir))?;
        self.file = Some(std::sync::Arc::new(file));
        self.len = bytes.len() as u64;
        self.marked_len = marked_len;
        self.durable_marked_len = image_len;
        self.head_pending = None;
        self.generation += 1;
        self.headed = true;
        self.sealed = true;
        Ok(())
    }

    /// A request that syncs the file on another thread (the syncer): it makes every
    /// write made so far durable.
    ///
    /// # Errors
    /// The released file could not be opened again.
    pub(crate) fn sync_request(&mut self) -> Result<braid_storage::SyncRequest, JournalError> {
        Ok(braid_storage::SyncRequest::for_file(
            self.handle()?,
            std::sync::Arc::from(self.path().as_path()),
        ))
    }

    /// Rewrites the file with its live entries if it has grown past
    /// [`COMPACT_BYTES`] (for a holder that syncs through [`JournalFile::sync_request`]).
    ///
    /// # Errors
    /// An IO error poisons the journal.
    pub(crate) fn compact_if_large(&mut self) -> Result<(), JournalError> {
        if self.len > COMPACT_BYTES {
            if let Err(err) = self.compact(false) {
                self.poisoned = true;
                return Err(err);
            }
        }
        Ok(())
    }

    /// Poisons the journal after a sync that failed elsewhere.
    pub(crate) fn poison(&mut self) {
        self.poisoned = true;
    }
}

mod head;
mod open;
mod seal;
mod sleep;

use head::{Head, HEAD_BYTES};
pub(crate) use open::DurablePrefix;
use seal::Seal;
pub(crate) use sleep::JournalAsleep;

#[cfg(test)]
mod tests;
