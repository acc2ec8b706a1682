//! Opening a journal file: its records replayed, a torn tail told from damage.

use std::collections::BTreeMap;
use std::path::Path;

use braid_storage::disk;

use super::*;

impl JournalFile {
    /// As [`JournalFile::open`], calling `before_cut` before it cuts a torn tail that
    /// may hide a synced record ([`Recovered::tail_may_hide`]): the caller makes its
    /// distrust durable first, or a power loss right after the cut would leave a
    /// journal that looks whole.
    ///
    /// A `lone` replica's journal (no peer holds its ops) is never changed where damage
    /// is found: a tail cut that may hide a synced record is refused
    /// ([`JournalError::DurableTailLost`]) before anything is cut, and a file with
    /// damage inside is not rewritten, so that what the damage left is there to
    /// restore from, and each start names the same file and byte.
    ///
    /// A journal whose records are reported before they are synced
    /// (`reported_unsynced`: a partition under `fsync = interval` or `never`) carries no
    /// marker saying what was reported, so any tail a member's open cuts may hide
    /// reported ops: it is cut only after `before_cut` (the shell simulator's seed
    /// 365891 with damage to sleeping files: a bit flipped in such a journal's last
    /// records was cut as a torn tail when the files woke, a kill -9 followed before the
    /// group's distrust was written, and the member restarted trusted without ops it had
    /// acknowledged, whose offsets a view change then gave again).
    ///
    /// # Errors
    /// As [`JournalFile::open`], and what `before_cut` returns.
    pub(crate) fn open_marking(
        path: &Path,
        group: u64,
        lone: bool,
        reported_unsynced: bool,
        before_cut: impl FnOnce() -> Result<(), JournalError>,
    ) -> Result<(Self, Recovered), JournalError> {
        Self::open_marking_at(
            SharedPath::whole(path),
            group,
            lone,
            reported_unsynced,
            before_cut,
        )
    }

    /// As [`JournalFile::open_marking`], the path kept as `shared` gives it.
    ///
    /// # Errors
    /// As [`JournalFile::open_marking`].
    pub(crate) fn open_marking_at(
        shared: SharedPath,
        group: u64,
        lone: bool,
        reported_unsynced: bool,
        before_cut: impl FnOnce() -> Result<(), JournalError>,
    ) -> Result<(Self, Recovered), JournalError> {
        let path = &shared.get();
        let dir = shared.dir();
        braid_storage::create_dir_durable(dir).map_err(io(dir))?;
        let (file, created) = disk::open_or_create(path).map_err(io(path))?;
        let bytes = if created {
            let fresh = fresh_file(group);
            disk::write_at(&file, path, &fresh, 0).map_err(io(path))?;
            disk::sync_data(&file, path).map_err(io(path))?;
            disk::sync_dir(dir).map_err(io(dir))?;
            fresh
        } else {
            disk::read(path).map_err(io(path))?
        };
        // A creation torn short leaves a file no record was ever written into.
        if bytes.len() < RECORDS_START
            && (fresh_file(group).starts_with(&bytes) || bytes.starts_with(MAGIC))
        {
            disk::write_at(&file, path, &fresh_file(group), 0).map_err(io(path))?;
            disk::sync_data(&file, path).map_err(io(path))?;
            return Self::open_marking_at(shared, group, lone, reported_unsynced, nothing_to_mark);
        }
        let ((headed, seal), magic_damaged) = match bytes.get(..MAGIC.len()) {
            Some(magic) if magic == MAGIC => ((true, Seal::of(group)), false),
            Some(magic) if magic == MAGIC_UNSEALED => ((true, Seal::UNSEALED), false),
            Some(magic) if magic == MAGIC_HEADLESS => ((false, Seal::UNSEALED), false),
            _ => (damaged_magic_format(path, &bytes, group)?, true),
        };
        let records_start = if headed { RECORDS_START } else { MAGIC.len() };
        let head = if headed {
            Head::decode(&bytes[MAGIC.len()..], seal)
        } else {
            None
        };
        // A head without an intact copy that is not zeros (what a power loss leaves
        // of unsynced writes) is damage at rest, or another journal's head written
        // here by a misdirected write: what it claimed is unknown, so whatever the
        // open cuts may have been reported.
        let head_lost =
            headed && head.is_none() && !magic_damaged && Head::is_damage(&bytes[MAGIC.len()..]);
        let mut found = Scan::of(&bytes, seal, records_start, bytes.len());
        let head_durable = head.map_or(0, |h| h.durable_end());
        let durable_len = found.durable_len.max(head_durable) as usize;
        if let Some(bad) = found.first_bad.filter(|bad| *bad >= durable_len) {
            // Bad bytes past everything a marker says was made durable, with intact
            // records after them: unsynced writes that a power loss lost while later
            // ones landed (the POSIX model; common once syncs run off the shard's turn,
            // the shell simulator's seeds 104 and 127: every op was marked damaged, and
            // with a peer's damage the group's view change waited for ever). A torn
            // tail, cut there with what follows (none of it reported, unless damage
            // at rest took a reported record's marker too: see `tail_may_hide`).
            found = Scan::of(&bytes, seal, records_start, bad);
        }
        let Scan {
            mut entries,
            pruned,
            committed_end,
            end: at,
            first_bad,
            highest_op,
            written_at,
            synced_len,
            ..
        } = found;
        let mut damaged_at = first_bad.map(|bad| bad as u64);
        if magic_damaged {
            damaged_at = Some(0);
        } else if head_lost {
            damaged_at = Some(MAGIC.len() as u64);
        }
        let highest_op = highest_op.max(head.map_or(0, |h| h.op_max));
        let synced_len = synced_len.max(head.map_or(0, |h| h.synced_len).min(at as u64));
        let torn_tail_bytes = (bytes.len() - at) as u64;
        // The head, when a copy is intact, says what the tail may not have held: a
        // cut below its durable end lost records made durable (damage), one above it
        // lost only writes never synced. Without it, the bytes cut are all there is.
        let tail_may_hide = match head {
            Some(head) => (at as u64) < head.durable_end(),
            None if head_lost => torn_tail_bytes > 0,
            None => torn_tail_bytes > 0 && may_hide(&bytes[at..], at),
        } || (reported_unsynced && !lone && torn_tail_bytes > 0);
        if tail_may_hide {
            if lone {
                // An acknowledged op may be gone with the tail, and no peer holds it.
                // (Cut, and the partition log cut to match, a truncated `vsr.journal`
                // on a single node left an empty log where 200 acknowledged records
                // had been, and the group waited in a view change for ever: an outside
                // review of issue 24.)
                return Err(JournalError::DurableTailLost {
                    path: path.to_owned(),
                });
            }
            before_cut()?;
        }
        if torn_tail_bytes > 0 || head.is_some_and(|h| h.durable_end() > at as u64) {
            tracing::warn!(
                path = %path.display(),
                at,
                bytes = torn_tail_bytes,
                "cutting the journal's torn tail"
            );
            disk::set_len(&file, path, at as u64).map_err(io(path))?;
            if headed {
                // The head may not claim bytes the cut took: records written there
                // next were never synced.
                let clamped = Head {
                    synced_len,
                    op_max: highest_op,
                    durable_len: head.map_or(0, |h| h.durable_len).min(at as u64),
                };
                disk::write_at(&file, path, &clamped.encode(seal), MAGIC.len() as u64)
                    .map_err(io(path))?;
            }
            disk::sync_data(&file, path).map_err(io(path))?;
        }
        if let Some(damage) = damaged_at {
            tracing::warn!(
                path = %path.display(),
                at = damage,
                "journal damaged with intact records after it: every op above the prune \
                 point is marked damaged and will be repaired from peers"
            );
            // Nothing read is trusted (a lost truncation could bring a stale prepare
            // back), but every op written must stay known.
            entries = (pruned.0 + 1..=highest_op.max(pruned.0))
                .map(|op| (op, Entry::Damaged(op)))
                .collect();
        }
        let slots = entries.iter().map(|(op, e)| (*op, e.slot())).collect();
        let synced = entries
            .keys()
            .filter(|op| written_at.get(op).is_some_and(|w| (*w as u64) < synced_len))
            .copied()
            .collect();
        let external = entries
            .iter()
            .filter_map(|(op, e)| match e {
                Entry::External { base_offset, .. } => Some((*op, *base_offset)),
                _ => None,
            })
            .collect();
        let journal = Self {
            path: shared,
            file: Some(std::sync::Arc::new(file)),
            len: at as u64,
            entries,
            pruned_through: pruned.0,
            pruned_log_end: pruned.1,
            committed_end,
            unsynced: Vec::new(),
            marked_len: synced_len,
            // Carried into the head's next copy: a head written later must still
            // cover what an earlier durability marker made durable (damage at rest to
            // that marker would otherwise read as a torn tail).
            durable_marked_len: (durable_len as u64).min(at as u64),
            generation: 0,
            headed,
            group,
            sealed: seal.is_sealed(),
            head_writes: if headed {
                Head::next_copy(&bytes[MAGIC.len()..], seal)
            } else {
                0
            },
            head_pending: None,
            poisoned: false,
        };
        let mut journal = journal;
        if damaged_at.is_some() && !lone {
            // Rewritten now, so the damage is not found again at every start. (A lone
            // replica refuses the group, and each start names the damage found here.)
            journal.compact(false)?;
        }
        let recovered = Recovered {
            slots,
            torn_tail_bytes,
            tail_may_hide,
            pruned_through: journal.pruned_through,
            damaged_at,
            external,
            pruned_log_end: journal.pruned_log_end,
            committed_end: journal.committed_end,
            synced,
            durable: DurablePrefix {
                bytes,
                seal,
                start: records_start,
                len: durable_len,
            },
        };
        Ok((journal, recovered))
    }
}

/// Whether bad bytes at byte `at` that no marker covers may hide a record reported
/// written. Every reported record has a durable sync marker after it (the marker is
/// synced before the report), so it can hide one only where damage at rest took that
/// marker too: a zeroed sector (or page) inside the stretch, or the stretch all zeros
/// from a sector's start. Anything else is writes a power loss lost or tore, never
/// reported: all zeros from inside a sector (an unwritten extent), a record cut short,
/// or one damaged record (a flipped bit) whose marker, had it been reported, would be
/// intact after it. (Before markers were durable first, every tail longer than a
/// marker was taken to hide one: with syncs off the shard's turn that made members
/// untrusted after most power losses, and the shell simulator's seeds 428 and 609
/// waited for ever with two of three so.)
pub(super) fn may_hide(stretch: &[u8], at: usize) -> bool {
    const SECTOR: usize = 512;
    // A reported record and its marker take at least this much (a record of one u64,
    // then a marker): anything shorter is a torn marker or a torn write (the shell
    // simulator's seed 768 at four times the faults: a marker torn at a page left a
    // member untrusted, and with the damaged member the view change waited for ever).
    const RECORD_AND_MARKER: usize = RECORD_HEAD + 8 + RECORD_HEAD + 16;
    if stretch.len() < RECORD_AND_MARKER {
        return false;
    }
    if stretch.iter().all(|b| *b == 0) {
        return at.is_multiple_of(SECTOR);
    }
    let end = at + stretch.len();
    let mut sector = at.next_multiple_of(SECTOR);
    while sector < end {
        let span = &stretch[sector - at..(sector + SECTOR).min(end) - at];
        if span.iter().all(|b| *b == 0) {
            return true;
        }
        sector += SECTOR;
    }
    false
}

/// The journal's bytes as read at open, up to its last durability marker: what a power
/// loss cannot take back. Replayed only by an open that needs it (one that cuts
/// unmarked records), not at every open of every group.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct DurablePrefix {
    bytes: Vec<u8>,
    seal: Seal,
    /// Where the records start.
    start: usize,
    len: usize,
}

impl DurablePrefix {
    /// What each op at or above `from` held as of the last durability marker: a
    /// prepare kept whole stays whole (its body may be nowhere else), a damaged one
    /// damaged (its lost body may have been acknowledged), any other entry as its
    /// header alone.
    pub(crate) fn slots_from(&self, from: u64) -> Vec<(u64, JournalSlot)> {
        let scan = Scan::of(
            &self.bytes,
            self.seal,
            self.start,
            self.len.min(self.bytes.len()),
        );
        scan.entries
            .range(from..)
            .map(|(op, entry)| (*op, entry.slot()))
            .collect()
    }
}

/// What replaying a journal's records found.
struct Scan {
    entries: OpMap<Entry>,
    pruned: (u64, Option<u64>),
    committed_end: Option<u64>,
    /// Where the records end: the start of a torn tail, or the limit.
    end: usize,
    /// Where the first bad stretch that intact records follow starts.
    first_bad: Option<usize>,
    highest_op: u64,
    /// Where each op's latest record starts.
    written_at: BTreeMap<u64, usize>,
    /// The bytes the last sync marker says were synced (their batches too).
    synced_len: u64,
    /// The bytes any marker (sync or durability) says were made durable.
    durable_len: u64,
}

impl Scan {
    /// Replays the records of `bytes` (a file sealed with `seal`) from `start` to
    /// before `limit`, past bad stretches that intact records follow, up to a torn
    /// tail.
    fn of(bytes: &[u8], seal: Seal, start: usize, limit: usize) -> Self {
        let mut scan = Self {
            entries: OpMap::new(),
            pruned: (0, None),
            committed_end: None,
            end: start,
            first_bad: None,
            highest_op: 0,
            written_at: BTreeMap::new(),
            synced_len: 0,
            durable_len: 0,
        };
        let mut at = start;
        while at < limit {
            let Some((decoded, total)) = parse_at(bytes, at, seal) else {
                // Damage, or the torn tail: intact records after it tell which.
                match (at + 1..limit).find(|&o| parse_at(bytes, o, seal).is_some()) {
                    None => break,
                    Some(next) => {
                        scan.first_bad.get_or_insert(at);
                        at = next;
                        continue;
                    }
                }
            };
            match &decoded {
                Decoded::Entry(entry) => {
                    scan.highest_op = scan.highest_op.max(entry.op());
                    scan.written_at.insert(entry.op(), at);
                }
                Decoded::Synced(len, op_max) => {
                    scan.synced_len = scan.synced_len.max(*len);
                    scan.durable_len = scan.durable_len.max(*len);
                    scan.highest_op = scan.highest_op.max(*op_max);
                }
                Decoded::Durable(len) => scan.durable_len = scan.durable_len.max(*len),
                _ => {}
            }
            replay(
                &mut scan.entries,
                &mut scan.pruned,
                &mut scan.committed_end,
                decoded,
            );
            at += total;
        }
        scan.end = at;
        scan
    }
}

/// A new file's bytes for group `group`: the magic and a head that claims nothing.
fn fresh_file(group: u64) -> Vec<u8> {
    let mut bytes = MAGIC.to_vec();
    bytes.extend(Head::default().encode(Seal::of(group)));
    bytes
}

/// A `before_cut` with nothing to do.
fn nothing_to_mark() -> Result<(), JournalError> {
    Ok(())
}

/// How a file whose magic is damaged was written (whether it has a head, and its
/// seal): the magic it is nearest to, or, when it is zeroed (a zeroed first page),
/// what its intact records and head copies say. A magic that is not a few flipped
/// bits, or zeros, over a file whose records follow is no journal.
fn damaged_magic_format(
    path: &Path,
    bytes: &[u8],
    group: u64,
) -> Result<(bool, Seal), JournalError> {
    let not_a_journal = || JournalError::NotAJournal {
        path: path.to_owned(),
    };
    let magic = bytes.get(..MAGIC.len()).ok_or_else(not_a_journal)?;
    let flipped = |wanted: &[u8; 8]| -> u32 {
        magic
            .iter()
            .zip(wanted)
            .map(|(a, b)| (a ^ b).count_ones())
            .sum()
    };
    let sealed = Seal::of(group);
    let records_follow =
        |seal: Seal| (MAGIC.len()..bytes.len()).any(|at| parse_at(bytes, at, seal).is_some());
    let zeroed = magic.iter().all(|b| *b == 0);
    let formats = [
        (flipped(MAGIC), (true, sealed)),
        (flipped(MAGIC_UNSEALED), (true, Seal::UNSEALED)),
        (flipped(MAGIC_HEADLESS), (false, Seal::UNSEALED)),
    ];
    let format = if zeroed {
        if records_follow(sealed) {
            Some((true, sealed))
        } else if records_follow(Seal::UNSEALED) {
            let headed = Head::decode(&bytes[MAGIC.len()..], Seal::UNSEALED).is_some()
                || parse_at(bytes, MAGIC.len(), Seal::UNSEALED).is_none();
            Some((headed, Seal::UNSEALED))
        } else {
            None
        }
    } else {
        formats
            .iter()
            .filter(|(bits, (_, seal))| *bits <= 8 && records_follow(*seal))
            .min_by_key(|(bits, _)| *bits)
            .map(|(_, format)| *format)
    };
    let format = format.ok_or_else(not_a_journal)?;
    tracing::warn!(path = %path.display(), "the journal's magic is damaged");
    Ok(format)
}
