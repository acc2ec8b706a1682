//! A partition group's VSR journal whose bodies ARE the partition log: one prepare of a
//! produce is one record batch, appended to the log at the next offsets, and its header
//! (op, view, checksum, parent checksum) is kept beside it in `vsr.journal`, a
//! [`JournalFile`] of headers that names each body's base offset. Ops without a batch
//! (a session's register) are kept whole in `vsr.journal`.
//!
//! The log holds a prefix of the journal: every op from the prune point up to the
//! *tip* has its body, in op order, and nothing else. A prepare above `tip + 1` (an op
//! below it is missing) waits in memory until the gap is repaired, and is reported
//! written only once it is appended and synced. (At open, a member of a cluster whose
//! log is cut at a damaged batch keeps each intact batch past it whole in `vsr.journal`
//! instead: it goes into the log at its offsets once the gap below it is repaired.)
//! Replacing an entry at or below the tip (a view change chose another prepare there)
//! cuts the log back to it first: every entry above chains to the replaced one, so
//! none of them can be in the new log.
//!
//! Bodies are stored with the base offset the log assigns and the partition's tag as
//! leader epoch; both fields are outside the batch CRC, and a body's VSR checksum is
//! over its *canonical* form, with both fields zero. So every replica checksums the
//! same bytes, a batch read back is canonicalised (its offset and tag zeroed) before it
//! is sent or checked, and a stored epoch other than the tag is damage (or another
//! partition's batch, written here by a misdirected write).
//!
//! Crash consistency: [`PartitionJournal::sync`] syncs the log, then `vsr.journal`, and
//! only then are the writes reported. At open, a header whose batch the log lacks was
//! never reported (the log's sync would have kept it): it and everything above it are
//! cut. Batches past the last header's were never reported either and are cut. A batch
//! that is there but does not match its header's checksum is a damaged entry, reported
//! damaged, never absent.
//!
//! A batch goes only where its op belongs: the journal knows where the log ends after
//! its tip (the tip's batch, a prune's recorded end, or the checkpoint's state when a
//! prune could not record it), and refuses to append at any other end
//! ([`PartitionJournalError::Misplaced`]), since a batch appended where a damaged or
//! cut log happens to end would hold other offsets than on every other replica, with
//! every checksum still equal (the body checksum covers the canonical batch). A cut of
//! the journal (a truncation, a new view's header) is synced by the turn that made it,
//! even when batches are synced off the shard: the log view written after the turn
//! rests on it.

// Partition groups join the shards next; until then only the tests use this.
#![cfg_attr(not(test), allow(dead_code))]

use std::collections::BTreeMap;
use std::path::Path;

use braid_proto::batch::{field, set_base_offset, set_partition_leader_epoch, HEADER_BYTES};
use braid_storage::{LogConfig, LogError, PartitionLog};
use braid_vsr::{checksum, Checksum, Header, JournalSlot, Operation, Prepare};

use super::journal_file::{JournalError, JournalFile};
use super::partition_machine::{batch_records, Applied, PartitionMachine};
use super::shard_host::{HostError, Journal};
pub(crate) use error::PartitionJournalError;
use in_flight::InFlight;

/// The header journal's file name in the partition directory.
pub(crate) const JOURNAL_FILE: &str = "vsr.journal";

/// A sync of a partition's journal for another thread (the syncer) to run: the log's
/// active segment and the header journal. Once both are done,
/// [`PartitionJournal::finish_sync`] says which ops it made durable.
#[derive(Debug)]
pub(crate) struct SyncJob {
    pub(crate) id: u64,
    pub(crate) requests: Vec<braid_storage::SyncRequest>,
}

/// Ops a finished sync made durable, waiting for the sync of its marker.
#[derive(Debug)]
struct AwaitingMarker {
    /// The sync that made them durable (a cut after it removes them).
    synced_by: u64,
    /// Where the marker ends in `vsr.journal`.
    end: super::journal_file::SyncedLen,
    ops: Vec<(u64, Checksum)>,
}

/// A sync that runs elsewhere: the ops it will report, and the log's request.
#[derive(Debug)]
struct RunningSync {
    ops: Vec<(u64, Checksum)>,
    log: Option<braid_storage::SyncRequest>,
    /// What of `vsr.journal` it covers, for the sync marker once it is done.
    index: super::journal_file::SyncedLen,
}

/// What opening found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Recovered {
    /// The slots above the prune point, for `Persisted::journal`.
    pub(crate) slots: Vec<(u64, JournalSlot)>,
    /// What is damaged, if anything (the journal file inside, a batch, or the journal
    /// file gone while the log holds batches): its ops are reported damaged, and a lone
    /// replica refuses to start, saying this.
    pub(crate) damage: Option<String>,
    /// Log bytes cut because no header named them (appended, never reported).
    pub(crate) log_bytes_cut: u64,
    /// The log ends before what the journal recorded (its batches were lost): it must
    /// be copied from a peer.
    pub(crate) log_behind: bool,
    /// A tail was cut from the log or the header journal at open: a torn write, or
    /// damage at rest to what was synced and reported (see [`Opened::tail_cut`]).
    ///
    /// [`Opened::tail_cut`]: super::shard_host::Opened::tail_cut
    pub(crate) tail_cut: bool,
}

/// The canonical form of a stored batch: base offset and leader epoch zero.
pub(crate) fn canonical(mut batch: Vec<u8>) -> Vec<u8> {
    if batch.len() >= HEADER_BYTES {
        set_base_offset(&mut batch, 0);
        set_partition_leader_epoch(&mut batch, 0);
    }
    batch
}

/// Whether `prepare`'s body goes to the log: one record batch of a produce.
pub(super) fn is_batch(prepare: &Prepare) -> bool {
    prepare.header.operation == Operation::Request && batch_records(&prepare.body).is_some()
}

/// A partition's journal: headers in `vsr.journal`, bodies in the log.
#[derive(Debug)]
pub(crate) struct PartitionJournal {
    index: JournalFile,
    log: PartitionLog,
    /// What is in flight: none while the partition is quiescent (an idle partition
    /// holds no empty maps; a heap profile of 10,000 idle partitions counted them).
    in_flight: Option<Box<InFlight>>,
    /// Every op from the prune point to here has its body, the batches in the log in
    /// op order and nothing after them.
    tip: u64,
    /// Syncs run on another thread ([`PartitionJournal::start_sync`]) instead of in
    /// [`PartitionJournal::sync`].
    off_thread: bool,
    next_sync: u64,
    /// The log is being copied from a peer up to a checkpoint's end: until it is in,
    /// prepares above the checkpoint wait in `pending`.
    behind: Option<Transfer>,
    /// Where the log known to be the committed one ends: after the batch of the
    /// highest op applied from the log itself (or the end of a finished copy). A
    /// checkpoint installed later copies from here, comparing what lies beyond. An
    /// offset, not an op: the ops below it leave the journal when it is pruned.
    applied_end: u64,
    /// Where the scrub of the committed log goes on ([`PartitionJournal::scrub`]).
    scrub_cursor: u64,
    /// Whole passes the scrub finished since the journal was opened.
    scrub_passes: u64,
    /// A damaged batch found in the committed log, waiting for a peer's copy.
    damaged_at: Option<u64>,
    /// Set when every peer's log starts above `damaged_at` (their retention deleted
    /// it) while this journal still holds its op: no copy will come, and the damage
    /// waits for this journal's next prune to let retention delete it. Holds the
    /// peers' start; the scrub goes on from there meanwhile.
    damage_expired_below: Option<u64>,
    /// A truncation or a header written to `vsr.journal` that no sync has covered yet.
    /// The replica's next durable state (its log view) depends on it, so the next
    /// [`PartitionJournal::sync`] makes it durable at once, even when batches' syncs run
    /// off the shard: a log view on disk without the cut it rests on brings an old
    /// view's entry back after a power loss.
    index_changed_unsynced: bool,
    /// Where the log ends after the tip's batch (or after the prune point), when the
    /// journal knows it: the log must end exactly there when the next batch goes in, so
    /// a batch is stored at the offsets its op takes on every replica, never at
    /// whatever end a damaged or cut log happens to have.
    tip_log_end: Option<u64>,
}

/// A state transfer of the log: the checkpoint at `op` was installed from a peer (this
/// replica was behind every peer's journal), and the log must hold every batch below
/// `log_end`, the offset the checkpoint's state names, before any op above `op` can be
/// appended. The batches come from peers' logs ([`PartitionJournal::copy_chunk`]),
/// from `cursor` on: below it the log is known to be the committed one. Between the
/// cursor and the log's end each batch a peer sends is compared with the one held; at
/// the first that differs (an uncommitted suffix of an old view) the log is cut and
/// the peer's batches appended from there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Transfer {
    pub(crate) op: u64,
    pub(crate) log_end: u64,
    pub(crate) cursor: u64,
}

/// What a chunk of a peer's log did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Copied {
    /// Not for the copy running (stale, or none runs).
    Ignored,
    /// Batches appended (or the log restarted at the peer's start); more to come.
    Progress,
    /// The peer had nothing from the cursor on (it has not committed that far, or is
    /// copying itself): the copy asks again, of the next peer, once the fetch is
    /// overdue. Asked again at once, two members with nothing to give bounced fetches
    /// and empty answers at network speed, and a network that doubles frames made
    /// the bouncing grow without bound (the shell simulator's seed 2356 with damage at
    /// four times the faults: millions of fetches in flight).
    Nothing,
    /// The log reached the checkpoint's end: ops above it flow again.
    Done,
}

/// What the log holds where a journal entry says its batch starts.
#[derive(Debug)]
enum Body {
    /// The batch, canonical, and the offset after it.
    Held(Vec<u8>, u64),
    /// No batch starts there.
    Absent,
    /// What is there does not check.
    Damaged,
}

/// The first batch of `bytes` (a read returns whole batches).
fn first_batch(bytes: &[u8]) -> Option<&[u8]> {
    let length = bytes.get(field::BATCH_LENGTH..field::BATCH_LENGTH + 4)?;
    let length = u32::from_be_bytes(length.try_into().ok()?) as usize;
    bytes.get(..field::BATCH_LENGTH + 4 + length)
}

impl PartitionJournal {
    /// Closes the log's and the header journal's files until they are next used.
    ///
    /// # Errors
    /// As `PartitionLog::release_files`.
    pub(crate) fn release_files(&mut self) -> Result<(), PartitionJournalError> {
        self.log.release_files()?;
        self.index.release();
        Ok(())
    }

    /// The partition log (reads of committed records go straight to it).
    pub(crate) fn log(&mut self) -> &mut PartitionLog {
        &mut self.log
    }

    /// The highest op whose body is in place with all below it.
    pub(crate) fn tip(&self) -> u64 {
        self.tip
    }

    /// How far the journal has its bodies in the log (`/replication`).
    pub(crate) fn progress(&self) -> super::status::JournalProgress {
        super::status::JournalProgress {
            tip: self.tip,
            waiting: self.flight().pending.len() as u64,
            copying: self.behind.map(|t| (t.cursor, t.log_end)),
        }
    }

    /// Writes a prepare at its op, replacing what is there. Reported written by a later
    /// [`PartitionJournal::sync`], once it and every op below it are in place.
    ///
    /// # Errors
    /// A write failed (the journal or the log is poisoned).
    pub(crate) fn write_prepare(
        &mut self,
        prepare: &Prepare,
        now_ms: u64,
    ) -> Result<(), PartitionJournalError> {
        let op = prepare.header.op;
        let (pruned, _) = self.index.pruned();
        tracing::trace!(dir = %self.log.dir().display(), op, pruned, tip = self.tip, "write prepare");
        if op <= pruned {
            return Ok(());
        }
        if op <= self.tip {
            if self.index.entry(op).map(|(h, _)| h.checksum) == Some(prepare.header.checksum) {
                // Already in place (a repair answered twice).
                self.flight_mut()
                    .unsynced
                    .push((op, prepare.header.checksum));
                return Ok(());
            }
            self.replace_from(op, prepare.header.checksum)?;
        }
        tracing::trace!(dir = %self.log.dir().display(), op, view = prepare.header.view, sum = prepare.header.checksum >> 112, parent = prepare.header.parent >> 112, tip = self.tip, behind = self.behind.is_some(), "pending");
        self.flight_mut().pending.insert(op, prepare.clone());
        self.append_pending(now_ms)?;
        if self.flight().pending.contains_key(&op)
            && self.index.entry(op).map(|(h, _)| h.checksum) != Some(prepare.header.checksum)
        {
            // It waits (for an op below it, or for a copy): its header goes to disk
            // now, before the replica's next durable state. That state may name a log
            // view whose log holds this op; restarted without a trace of it, the
            // replica would vote that view's log ends below it, and a view change
            // could drop it though it was committed (found by the shell simulator,
            // seed 42). With its header, the op is known and its body repaired.
            self.index.write_header(&prepare.header)?;
            self.index_changed_unsynced = true;
        }
        Ok(())
    }

    /// Appends the prepares that wait for nothing any more.
    fn append_pending(&mut self, now_ms: u64) -> Result<(), PartitionJournalError> {
        if self.behind.is_some() {
            return Ok(());
        }
        loop {
            // An op kept whole in the header journal (a register: no batch) that is
            // already there, chained to the tip, needs no write: the tip moves over it.
            // (Past a hole at open it stays in place; the replica, which read it back,
            // never sends it again: seed 94 of the shell simulator waited for it.)
            let held = self.index.entry(self.tip + 1).and_then(|(header, base)| {
                let chains = self
                    .index
                    .entry(self.tip)
                    .is_none_or(|(tip, _)| tip.checksum == header.parent);
                (base.is_none() && chains && !self.flight().pending.contains_key(&(self.tip + 1)))
                    .then_some(header.checksum)
            });
            if let Some(held) = held.and_then(|sum| self.index.inline_prepare(self.tip + 1, sum)) {
                if is_batch(&held) {
                    // A batch kept whole past a hole at open: it goes to the log now.
                    self.append(&held, now_ms)?;
                } else {
                    self.tip += 1;
                    self.settle_applied(self.tip, held.header.checksum);
                }
                continue;
            }
            let Some(next) = self.flight().pending.get(&(self.tip + 1)) else {
                break;
            };
            // A prepare goes in only on the one it chains to: one that arrived before
            // its op's new view's predecessor waits for it, instead of going in on an
            // old view's entry that the predecessor's arrival would then cut, taking
            // it along unseen by the replica that reported it written.
            let chains = self
                .index
                .entry(self.tip)
                .is_none_or(|(tip, _)| tip.checksum == next.header.parent);
            if !chains {
                break;
            }
            let next_op = self.tip + 1;
            let Some(next) = self.flight_mut().pending.remove(&next_op) else {
                break;
            };
            self.append(&next, now_ms)?;
        }
        Ok(())
    }

    /// The entries of ops `from..=to`: (op, checksum, the base of its batch).
    #[cfg(test)]
    pub(crate) fn entries(&self, from: u64, to: u64) -> Vec<(u64, Checksum, Option<u64>)> {
        (from..=to)
            .filter_map(|op| self.index.entry(op).map(|(h, base)| (op, h.checksum, base)))
            .collect()
    }

    /// The copy from a peer that runs, if any.
    pub(crate) fn behind(&self) -> Option<Transfer> {
        self.behind
    }

    /// `op`, whose prepare has `checksum`, was applied: it is committed. Only when its
    /// batch is in the log as this journal holds it (at or below the tip, with that
    /// checksum, no copy running) is the log up to it the committed log: an op applied
    /// from a prepare held in memory (above the tip, or while the log is copied) says
    /// nothing of what the log holds, which may be an old view's suffix that a copy
    /// must compare and replace.
    pub(crate) fn applied(&mut self, op: u64, checksum: Checksum) {
        let in_log = self.behind.is_none()
            && op <= self.tip
            && self
                .index
                .entry(op)
                .is_some_and(|(header, _)| header.checksum == checksum);
        if in_log {
            let end = match self.index.next_external(op) {
                Some((next, base)) if next <= self.tip => base,
                _ => self.tip_log_end.unwrap_or(self.log.next_offset()),
            };
            self.applied_end = self.applied_end.max(end);
        } else if op > self.index.pruned().0 {
            self.flight_mut().applied_ahead.insert(op, checksum);
        }
    }

    /// Checks that committed op `op` (its prepare's `checksum`), whose records the
    /// partition's state gave offsets from `base` on, is what the journal holds at
    /// `op`, its batch stored at `base`: what this replica serves at an offset is what
    /// every replica serves there.
    ///
    /// # Errors
    /// [`PartitionJournalError::Diverged`]: the journal holds another prepare at `op`
    /// within its tip, or the batch is stored elsewhere.
    pub(crate) fn check_placed(
        &self,
        op: u64,
        checksum: Checksum,
        base: u64,
    ) -> Result<(), PartitionJournalError> {
        let diverged = |stored: Option<u64>| PartitionJournalError::Diverged {
            dir: self.log.dir().to_owned(),
            op,
            base,
            stored,
        };
        match self.index.entry(op) {
            Some((header, stored)) if op <= self.tip && header.checksum != checksum => {
                Err(diverged(stored))
            }
            Some((_, Some(stored))) if stored != base => Err(diverged(Some(stored))),
            _ => Ok(()),
        }
    }

    /// Where the records this replica may serve end: the log known to be the
    /// committed one. Below the partition's state's next offset while ops applied from
    /// memory wait for their batches (a copy runs, or an op below them is repaired),
    /// so that no read is promised records the log does not hold yet.
    pub(crate) fn committed_end(&self) -> u64 {
        self.applied_end()
    }

    /// Where the log known to be committed ends, within the log.
    fn applied_end(&self) -> u64 {
        self.applied_end
            .min(self.log.next_offset())
            .max(self.log.start_offset())
    }

    /// Appends `prepare` at `tip + 1`.
    fn append(&mut self, prepare: &Prepare, now_ms: u64) -> Result<(), PartitionJournalError> {
        tracing::trace!(dir = %self.log.dir().display(), op = prepare.header.op, view = prepare.header.view, tip = self.tip, log_end = self.log.next_offset(), "append");
        if is_batch(prepare) {
            if let Some(tip_end) = self.tip_log_end.filter(|e| *e != self.log.next_offset()) {
                return Err(PartitionJournalError::Misplaced {
                    dir: self.log.dir().to_owned(),
                    op: prepare.header.op,
                    tip: self.tip,
                    tip_end,
                    log_end: self.log.next_offset(),
                });
            }
            // The shared body goes to the log as it is, bar its offset and epoch.
            let appended = self.log.append_shared(&prepare.body, now_ms)?;
            if self.index.holds_body_or_damage(prepare.header.op) {
                // The entry the record replaces holds the op's body (kept whole past a
                // hole) or stands for a lost one (damaged): either may have been
                // reported. The batch is durable before a record naming it can be (a
                // header journal's sync that does not wait for the log's, or its
                // compaction): a record durable without its batch reads as an op never
                // written, and a view change may drop it (the shell simulator's seed
                // 369042 with damage at rest: ops kept whole past a damaged batch went
                // to the log on its repair, a power loss took the batches but not the
                // records, and the member voted it never had ops it had acknowledged).
                self.log.sync()?;
            }
            self.index
                .write_external(&prepare.header, appended.base_offset)?;
            self.tip_log_end = Some(appended.last_offset + 1);
        } else {
            // A register, or a body that is not one batch: kept whole with its header.
            self.index.write_prepare(prepare)?;
        }
        self.settle_applied(prepare.header.op, prepare.header.checksum);
        self.tip = prepare.header.op;
        self.flight_mut()
            .unsynced
            .push((prepare.header.op, prepare.header.checksum));
        Ok(())
    }

    /// `op` (with `checksum`) just became the tip: if it was applied before it was here,
    /// the log now holds it, committed.
    fn settle_applied(&mut self, op: u64, checksum: Checksum) {
        if self.flight().applied_ahead.get(&op) == Some(&checksum) {
            self.flight_mut().applied_ahead.remove(&op);
            let end = self.tip_log_end.unwrap_or(self.log.next_offset());
            self.applied_end = self.applied_end.max(end);
        }
    }

    /// Writes a header whose body is missing at its op, replacing what is there.
    ///
    /// # Errors
    /// A write failed.
    pub(crate) fn write_header(&mut self, header: &Header) -> Result<(), PartitionJournalError> {
        let op = header.op;
        if op <= self.index.pruned().0 {
            return Ok(());
        }
        if self.index.entry(op).map(|(h, _)| h.checksum) == Some(header.checksum) {
            // The entry held is the one named, its body with it (in place, or past a
            // hole and to be repaired): keep it. A header alone stands for a body never
            // written, which a view change may drop; a written one never is.
            return Ok(());
        }
        if op <= self.tip {
            self.replace_from(op, header.checksum)?;
        }
        if self
            .flight()
            .pending
            .get(&op)
            .is_some_and(|p| p.header.checksum != header.checksum)
        {
            self.flight_mut().pending.remove(&op);
        }
        self.index.write_header(header)?;
        self.index_changed_unsynced = true;
        Ok(())
    }

    /// Removes every entry above `op`.
    ///
    /// # Errors
    /// A write or the log's truncation failed.
    pub(crate) fn truncate(&mut self, op: u64) -> Result<(), PartitionJournalError> {
        tracing::trace!(dir = %self.log.dir().display(), op, tip = self.tip, "truncate");
        self.forget_waiting(|o| o <= op);
        self.note_cut(op);
        if op < self.tip {
            self.cut_above(op)
        } else {
            self.index.truncate(op)?;
            self.index_changed_unsynced = true;
            Ok(())
        }
    }

    /// Remembers a cut above `op` for the syncs running now.
    fn note_cut(&mut self, op: u64) {
        let next_sync = self.next_sync;
        if let Some(flight) = self
            .in_flight
            .as_deref_mut()
            .filter(|f| !f.running.is_empty())
        {
            flight.cuts.push((next_sync, op));
        }
    }

    /// Makes room for another entry at `op` (`op <= tip`): the log holds an older
    /// view's batch there, and the batches after it chain to that one, so the log and
    /// its entries are cut back to `op - 1`. The entries above the tip are the new log's
    /// (headers of ops waiting for their batches, or ops known damaged): they stay. A
    /// replica whose log view's log this is must keep it, as headers at least, or it
    /// votes that the log ends below them (the shell simulator's seed 15843 with damage
    /// at rest: repairing from the top down, writing op 263 took the headers of ops
    /// 264..271 waiting above it, and after a power loss the member, trusted, voted log
    /// view 6 with its log ending below its known commit).
    ///
    /// # Errors
    /// [`PartitionJournalError::Unchained`]: the op above chains to the new entry
    /// (`checksum`), so the ops above are not an older view's and none is cut.
    fn replace_from(&mut self, op: u64, checksum: Checksum) -> Result<(), PartitionJournalError> {
        let chained_above = op < self.tip
            && self
                .index
                .entry(op + 1)
                .is_some_and(|(above, _)| above.parent == checksum);
        if chained_above {
            return Err(PartitionJournalError::Unchained {
                dir: self.log.dir().to_owned(),
                op,
            });
        }
        self.cut_above_keeping(op - 1, self.tip + 1)
    }

    /// Cuts the index and the log back to `op` (`op < tip`).
    fn cut_above(&mut self, op: u64) -> Result<(), PartitionJournalError> {
        self.cut_above_keeping(op, u64::MAX)
    }

    /// As [`Self::cut_above`], keeping the entries at or above `keep_from`.
    fn cut_above_keeping(&mut self, op: u64, keep_from: u64) -> Result<(), PartitionJournalError> {
        tracing::trace!(dir = %self.log.dir().display(), op, tip = self.tip, log_end = self.log.next_offset(), keep_from, "cut above");
        self.note_cut(op);
        let first_cut = self.index.next_external(op);
        self.index.truncate_keeping_from(op, keep_from)?;
        self.index_changed_unsynced = true;
        if let Some((_, base)) = first_cut {
            // An entry above a hole may name a batch past the log's end (the log lost
            // its tail, or a transfer cut it back): nothing of it is in the log to cut.
            if base < self.log.next_offset() {
                // Durable when it returns: a crash after it leaves no batch of a cut op.
                self.log.truncate(base)?;
            }
            if op < self.tip {
                // Contiguous up to op: the first cut batch starts where op's ends.
                self.tip_log_end = Some(base);
            }
        }
        self.tip = self.tip.min(op);
        if let Some(flight) = self.in_flight.as_deref_mut() {
            flight.unsynced.retain(|(o, _)| *o <= op);
        }
        Ok(())
    }

    /// Removes entries at or below `op` (a checkpoint covers them; their batches stay
    /// in the log until retention), recording where the log ends after `op`.
    ///
    /// # Errors
    /// A write failed.
    pub(crate) fn prune(&mut self, op: u64) -> Result<(), PartitionJournalError> {
        tracing::trace!(dir = %self.log.dir().display(), op, tip = self.tip, log_end = self.log.next_offset(), "prune");
        self.forget_waiting(|o| o > op);
        let copying = self.behind.filter(|t| t.op == op).map(|t| t.log_end);
        let held = (op <= self.tip).then(|| match self.index.next_external(op) {
            Some((next, base)) if next <= self.tip => base,
            _ => self.log.next_offset(),
        });
        // While a copy runs to a later checkpoint, the entries past where the log is
        // known committed may be an old view's: their end is no end of the committed
        // log (the shell simulator's seed 26717 with damage: a prune recorded op 192's
        // end at 466 from such entries while the committed log had a batch 464..467,
        // and the member could not restart). The checkpoint restarts the copy instead.
        let held = held.filter(|end| self.behind.is_none() || *end <= self.applied_end());
        let log_end = copying.or(held);
        // The entries that showed how far the log is the committed one may go with the
        // prune: a restart reads it from this record instead (found by the shell
        // simulator, seed 50: a prune above the log's tip left a restart taking the
        // whole log, an old view's batches in it, as committed).
        self.index.write_committed_end(self.applied_end())?;
        self.index.prune_at(op, log_end)?;
        Ok(())
    }

    /// The prepare at `op` with `checksum`, read from the log if need be (a repair
    /// answer).
    ///
    /// # Errors
    /// The log could not be read.
    pub(crate) fn prepare(
        &mut self,
        op: u64,
        checksum_wanted: Checksum,
    ) -> Result<Option<Prepare>, PartitionJournalError> {
        if let Some(pending) = self.flight().pending.get(&op) {
            return Ok((pending.header.checksum == checksum_wanted).then(|| pending.clone()));
        }
        let Some((header, base)) = self.index.entry(op).map(|(h, b)| (*h, b)) else {
            return Ok(None);
        };
        if header.checksum != checksum_wanted {
            return Ok(None);
        }
        match base {
            None => Ok(self.index.inline_prepare(op, checksum_wanted)),
            Some(base) => Ok(match self.read_body(base)? {
                Body::Held(body, _) if checksum(&body) == header.body_checksum => Some(Prepare {
                    header,
                    body: body.into(),
                }),
                _ => None,
            }),
        }
    }

    /// Returns the ops written since the last call, to report written: under
    /// `fsync = always` after making them durable (the log, then the header journal);
    /// under `interval` and `never` at once (they are synced by
    /// [`PartitionJournal::sync_now`] when due, or never), so the journal restarts
    /// untrusted.
    ///
    /// # Errors
    /// A sync failed: the journal is poisoned and nothing more is reported.
    pub(crate) fn sync(&mut self) -> Result<Vec<(u64, Checksum)>, PartitionJournalError> {
        if self.trusted() {
            if self.off_thread {
                if self.index_changed_unsynced {
                    // The state written after this turn may rest on it (see the field).
                    // Unmarked: the batches its records name are not synced yet.
                    drop(self.index.sync_unmarked()?);
                    self.index_changed_unsynced = false;
                }
                // Reported by `finish_sync` once `start_sync`'s job has run.
                self.settle();
                return Ok(Vec::new());
            }
            self.sync_now()?;
        } else {
            drop(self.index.take_unsynced());
        }
        let synced = self.take_unsynced();
        self.settle();
        Ok(synced)
    }

    /// From now on, syncs under `fsync = always` run on another thread: the shard goes
    /// on appending while they run, and one sync covers every append before it.
    pub(crate) fn sync_off_thread(&mut self) {
        self.off_thread = true;
    }

    /// Whether writes wait for a sync job: ops written since the last, or ops synced
    /// whose marker no running sync covers yet.
    pub(crate) fn has_unsynced(&self) -> bool {
        self.off_thread
            && self.trusted()
            && (!self.flight().unsynced.is_empty() || self.marker_unsynced())
    }

    /// Whether the last marker written for reported-to-be ops waits for a sync that no
    /// running one will make.
    fn marker_unsynced(&self) -> bool {
        let flight = self.flight();
        let Some(last) = flight.awaiting_marker.last() else {
            return false;
        };
        !flight.running.values().any(|r| r.index.covers(last.end))
    }

    /// A job that makes the writes so far durable, for the syncer.
    ///
    /// # Errors
    /// The log is poisoned, or the header journal's compaction failed.
    pub(crate) fn start_sync(&mut self) -> Result<Option<SyncJob>, PartitionJournalError> {
        if self.flight().unsynced.is_empty() && !self.marker_unsynced() {
            return Ok(None);
        }
        self.index.compact_if_large()?;
        drop(self.index.take_unsynced());
        let log = self.log.sync_request()?;
        let id = self.next_sync;
        self.next_sync += 1;
        let index = self.index.synced_len_if_synced_now();
        let mut requests = vec![self.index.sync_request()?];
        requests.extend(log.clone());
        let ops = self.take_unsynced();
        self.flight_mut()
            .running
            .insert(id, RunningSync { ops, log, index });
        Ok(Some(SyncJob { id, requests }))
    }

    /// Takes the result of sync job `id` (both of its files); returns the ops it made
    /// durable, to report written.
    ///
    /// # Errors
    /// The sync failed: the journal and the log are poisoned.
    pub(crate) fn finish_sync(
        &mut self,
        id: u64,
        result: Result<(), braid_storage::SyncError>,
    ) -> Result<Vec<(u64, Checksum)>, PartitionJournalError> {
        let Some(done) = self
            .in_flight
            .as_deref_mut()
            .and_then(|f| f.running.remove(&id))
        else {
            return Ok(Vec::new());
        };
        if let Some(request) = &done.log {
            self.log.on_synced(request, result.clone());
        }
        if let Err(err) = result {
            self.index.poison();
            return Err(err.into());
        }
        self.index.note_synced(done.index)?;
        let end = self.index.synced_len_if_synced_now();
        let next_sync = self.next_sync;
        let flight = self.flight_mut();
        if !done.ops.is_empty() {
            flight.awaiting_marker.push(AwaitingMarker {
                synced_by: id,
                end,
                ops: done.ops,
            });
        }
        // What this sync covered (everything written before it began) is durable:
        // the ops whose marker lies inside it are reported.
        let (ready, waiting): (Vec<_>, Vec<_>) = std::mem::take(&mut flight.awaiting_marker)
            .into_iter()
            .partition(|awaiting| done.index.covers(awaiting.end));
        flight.awaiting_marker = waiting;
        let cuts = &flight.cuts;
        let ops = ready
            .into_iter()
            .flat_map(|AwaitingMarker { synced_by, ops, .. }| {
                ops.into_iter().filter(move |(op, _)| {
                    !cuts
                        .iter()
                        .any(|(after, cut)| synced_by < *after && op > cut)
                })
            })
            .collect();
        let oldest = flight
            .running
            .keys()
            .chain(flight.awaiting_marker.iter().map(|a| &a.synced_by))
            .min()
            .copied()
            .unwrap_or(next_sync);
        flight.cuts.retain(|(after, _)| *after > oldest);
        self.settle();
        Ok(ops)
    }

    /// Syncs the log, then the header journal.
    ///
    /// # Errors
    /// A sync failed: the journal is poisoned.
    pub(crate) fn sync_now(&mut self) -> Result<(), PartitionJournalError> {
        self.log.sync()?;
        drop(self.index.sync()?);
        self.index_changed_unsynced = false;
        Ok(())
    }

    /// Syncs everything and closes the log cleanly (its next open skips the scan).
    ///
    /// # Errors
    /// A sync or the close failed.
    pub(crate) fn close(mut self) -> Result<(), PartitionJournalError> {
        self.sync_now()?;
        self.log.close()?;
        Ok(())
    }

    /// Whether every write is synced before it is reported (`fsync = always`).
    pub(crate) fn trusted(&self) -> bool {
        self.log.config().fsync == braid_storage::FsyncPolicy::Always
    }
}

impl Journal for PartitionJournal {
    type Asleep = PartitionAsleep;
    fn can_sleep(&self) -> bool {
        PartitionJournal::can_sleep(self)
    }
    fn release_files(&mut self) -> Result<(), HostError> {
        Ok(PartitionJournal::release_files(self)?)
    }
    fn sleep(self) -> Result<PartitionAsleep, HostError> {
        Ok(PartitionJournal::sleep(self)?)
    }
    fn wake(group: u64, asleep: PartitionAsleep) -> Result<Self, HostError> {
        Ok(PartitionJournal::wake(
            group,
            asleep,
            crate::mailbox::now_ms(),
        )?)
    }
    fn write_prepare(&mut self, prepare: &Prepare) -> Result<(), HostError> {
        Ok(PartitionJournal::write_prepare(
            self,
            prepare,
            crate::mailbox::now_ms(),
        )?)
    }
    fn write_header(&mut self, header: &Header) -> Result<(), HostError> {
        Ok(PartitionJournal::write_header(self, header)?)
    }
    fn truncate(&mut self, op: u64) -> Result<(), HostError> {
        Ok(PartitionJournal::truncate(self, op)?)
    }
    fn prune(&mut self, op: u64) -> Result<(), HostError> {
        Ok(PartitionJournal::prune(self, op)?)
    }
    fn prepare(&mut self, op: u64, checksum: Checksum) -> Result<Option<Prepare>, HostError> {
        Ok(PartitionJournal::prepare(self, op, checksum)?)
    }
    fn sync(&mut self) -> Result<Vec<(u64, Checksum)>, HostError> {
        Ok(PartitionJournal::sync(self)?)
    }
    fn has_unsynced(&self) -> bool {
        PartitionJournal::has_unsynced(self)
    }
    fn log_view_rests_on_writes(&mut self) {
        // Unmarked, as for a truncation: the records are durable, their batches may
        // not be; an open that cuts them for a lost batch keeps the headers the
        // durability marker covers (`DurablePrefix`), so the view's ops stay known.
        self.index_changed_unsynced = true;
    }
    fn distrust_persisted(&mut self) -> Result<(), HostError> {
        Ok(PartitionJournal::distrust_persisted(self)?)
    }
    fn checkpointed(&mut self, checkpoint: &braid_vsr::Checkpoint) -> Result<(), HostError> {
        let mut state = braid_vsr::ReplicatedState::new(PartitionMachine::default(), usize::MAX);
        state
            .restore(&checkpoint.state)
            .map_err(|reason| HostError::Start {
                group: checkpoint.header.group,
                reason: format!("its checkpoint's state does not decode: {reason}"),
            })?;
        let log_end = state.machine().next_offset();
        Ok(PartitionJournal::checkpointed(
            self,
            checkpoint.header.op,
            checkpoint.header.checksum,
            log_end,
            crate::mailbox::now_ms(),
        )?)
    }
    fn applied(
        &mut self,
        op: u64,
        checksum: Checksum,
        result: Option<&[u8]>,
    ) -> Result<(), HostError> {
        if let Some((base, _)) = result.and_then(Applied::offsets) {
            self.check_placed(op, checksum, base)?;
        }
        PartitionJournal::applied(self, op, checksum);
        Ok(())
    }
}

/// Records in a batch: its last offset delta plus one.
fn read_records(batch: &[u8]) -> u64 {
    batch
        .get(field::LAST_OFFSET_DELTA..field::LAST_OFFSET_DELTA + 4)
        .and_then(|b| b.try_into().ok())
        .map_or(0, |b| u64::from(u32::from_be_bytes(b)) + 1)
}

mod damage;
mod error;
mod in_flight;
mod open;
mod retention;
mod sleep;
mod transfer;

pub(crate) use sleep::PartitionAsleep;

#[cfg(test)]
mod tests;
