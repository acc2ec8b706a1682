//! State transfer of a partition: a replica that installed a checkpoint beyond its log
//! (it was behind every peer's journal, or its log lost batches) copies the committed
//! batches up to the checkpoint's end from a peer's log, chunk by chunk over the bus,
//! before any op above the checkpoint goes into its journal. It asks from where its
//! own log is known committed; what it holds beyond that is compared batch by batch
//! and replaced from the first that differs (see `PartitionJournal::copy_chunk`). A peer serves only what
//! it has committed; one whose retention deleted the start answers with where its log
//! begins, and the copy starts the log again there.

use super::{key_of, wire, Moved, PartitionGroups};
use crate::replication::partition_journal::{Copied, PartitionJournalError};
use crate::replication::shard_host::HostError;

/// Bytes of batches per chunk (at least one batch, even a larger one).
const CHUNK_BYTES: u32 = 1 << 20;
/// Ticks a fetch waits for its chunk before it is asked again (of another peer).
const FETCH_TICKS: u64 = 50;
/// How often (ticks) the shard looks for partitions that must be copied.
const SCAN_TICKS: u64 = 10;
/// Asks for a damaged batch's repair between two warnings that it is still not done
/// (one ask per [`FETCH_TICKS`]: about a minute).
const REPAIR_ATTEMPTS_PER_WARNING: u64 = 120;
/// Bytes of committed batches the shard checks per tick for damage at rest, over its
/// partitions in turn (a few MiB a second: a small share of one core's CRC32C).
const SCRUB_BYTES_PER_TICK: u32 = 64 << 10;

impl PartitionGroups {
    /// Checks the next stretch of one partition's committed log for damage at rest,
    /// and asks a peer for its copy of every damaged batch found and not yet repaired
    /// (again, of the next peer, when an answer is overdue). A lone replica has no peer:
    /// the partition is refused, and its reads stop before the damage, naming it.
    pub(super) fn scrub_and_repair(&mut self) {
        let look = self.host.group_from(self.scrub_next).filter(|group| {
            // A group whose files sleep is woken for it, not counted a use: data at
            // rest is checked whether or not anyone reads it, and the files sleep
            // again at the next pass (unchanged, which costs no write). At most one
            // such wake every `scrub_wake_ticks`: the scrub waits at a sleeping group
            // until then. (One a tick held about a hundred partitions of each shard
            // awake, files open, and every partition of a shard with fewer than a
            // hundred: an outside review of issue 24.)
            let asleep = self.host.journal(*group).is_none();
            !asleep || self.now >= self.scrub_wake_due
        });
        if let Some(group) = look {
            if self.host.journal(group).is_none() {
                self.scrub_wake_due = self.now + self.scrub_wake_ticks;
            }
            if let Err(err) = self.host.wake_for_a_look(group) {
                self.fail(err);
                return;
            }
            if let Some(journal) = self.host.journal_mut(group) {
                match journal.scrub(SCRUB_BYTES_PER_TICK) {
                    // A file of its log gone under it: opened again from its files.
                    // A file it reads refused a descriptor: nothing is known of the
                    // bytes, and the next pass looks again.
                    Err(err)
                        if crate::replication::shard_host::caused_by_out_of_descriptors(&err) => {}
                    Err(err) => self.host.drop_for_reopen(group, err.to_string()),
                    Ok(Some(damaged)) if self.members <= 1 => {
                        self.refuse_damaged(group, damaged);
                    }
                    Ok(_) => {}
                }
            }
            self.scrub_next = group.wrapping_add(1);
        }
        if self.members <= 1 || !self.now.is_multiple_of(SCAN_TICKS) {
            return;
        }
        let now = self.now;
        let damaged: Vec<(u64, u64, u64)> = self
            .host
            .journals_mut()
            .filter_map(|(group, journal)| {
                let at = journal.damage_to_repair()?;
                Some((group, at, journal.committed_end()))
            })
            .collect();
        self.repairs
            .retain(|group, _| damaged.iter().any(|(g, _, _)| g == group));
        for (group, from, to) in damaged {
            let due = self
                .repairs
                .get(&group)
                .is_none_or(|(sent, _)| now.saturating_sub(*sent) >= FETCH_TICKS);
            if !due {
                continue;
            }
            let attempt = self.repairs.get(&group).map_or(0, |(_, a)| a + 1);
            if attempt > 0 && attempt.is_multiple_of(REPAIR_ATTEMPTS_PER_WARNING) {
                // Every peer asked in turn, again and again: their copies are damaged
                // too, or gone, or they refuse the range. Nothing is served past the
                // damage meanwhile, but an operator must hear of it
                // (`braid_partitions_awaiting_repair` says how many).
                tracing::warn!(
                    group,
                    offset = from,
                    attempts = attempt,
                    "a damaged batch is still not repaired: no peer's copy has mended it; \
                     compare the peers' logs at this offset"
                );
            }
            if let Some(peer) = self.peer_in_turn(attempt) {
                self.bus
                    .send(peer, wire::log_fetch_frame(group, from, to, None));
            }
            self.repairs.insert(group, (now, attempt));
        }
    }

    /// Asks a peer for the next chunk of every copy that has no fetch out (or whose
    /// fetch went unanswered).
    pub(super) fn drive_copies(&mut self) {
        if self.members <= 1 || !self.now.is_multiple_of(SCAN_TICKS) {
            return;
        }
        let now = self.now;
        let behind: Vec<(u64, u64, u64)> = self
            .host
            .journals_mut()
            .filter_map(|(group, journal)| {
                let transfer = journal.behind()?;
                Some((group, transfer.cursor, transfer.log_end))
            })
            .collect();
        self.copies
            .retain(|group, _| behind.iter().any(|(g, _, _)| g == group));
        let due: Vec<(u64, u64, u64)> = behind
            .into_iter()
            .filter(|(group, _, _)| {
                self.copies
                    .get(group)
                    .is_none_or(|(sent, _)| now.saturating_sub(*sent) >= FETCH_TICKS)
            })
            .collect();
        for (group, from, to) in due {
            let attempt = self.copies.get(&group).map_or(0, |(_, a)| a + 1);
            self.ask_copy(group, from, to, attempt);
        }
    }

    /// Sends the fetch of `[from, to)` to a peer: the primary if this replica knows
    /// one, else the peers in turn as attempts go by.
    fn ask_copy(&mut self, group: u64, from: u64, to: u64, attempt: u64) {
        let primary = self
            .host
            .replica(group)
            .map(|r| r.primary_of(r.view()))
            .filter(|p| *p != self.node);
        let Some(fallback) = self.peer_in_turn(attempt) else {
            return;
        };
        let to_peer = if attempt == 0 {
            primary.unwrap_or(fallback)
        } else {
            fallback
        };
        let anchor = self.host.journal(group).and_then(|j| j.copy_anchor());
        self.bus
            .send(to_peer, wire::log_fetch_frame(group, from, to, anchor));
        self.copies.insert(group, (self.now, attempt));
    }

    /// The peer to ask at attempt `attempt`: each in turn.
    fn peer_in_turn(&self, attempt: u64) -> Option<u8> {
        let peers: Vec<u8> = (0..self.members).filter(|m| *m != self.node).collect();
        peers.get((attempt as usize) % peers.len().max(1)).copied()
    }

    /// A peer asks for committed batches of `group` in `[from, to)`.
    pub(super) fn serve_copy(
        &mut self,
        peer: u8,
        group: u64,
        from: u64,
        to: u64,
        anchor: Option<(u64, braid_vsr::Checksum)>,
    ) {
        let Some(key) = key_of(group) else {
            return;
        };
        let mut committed = self.high_watermark(key);
        let Some(journal) = self.woken(group) else {
            return;
        };
        if journal.behind().is_some() {
            // Copying itself: what it holds is not yet a whole prefix.
            return;
        }
        if let Some((op, checksum)) = anchor {
            // The asker's checkpoint is committed; holding its op, chained, this log
            // holds the committed one up to it, whatever this replica's commit (the
            // shell simulator's seed 5743 with damage at rest: the one member holding
            // every op had restarted untrusted, with a high watermark of 0, and the
            // copy waited for ever).
            if let Some(end) = journal.committed_through(op, checksum) {
                committed = committed.max(end);
            }
        }
        let log = journal.log();
        let start = log.start_offset();
        let end = to.min(committed).min(log.next_offset());
        let batches = if from < start || from >= end {
            bytes::Bytes::new()
        } else {
            match log.read(from, CHUNK_BYTES, end) {
                Ok(mut read) if read.first_offset == from => {
                    // Never a damaged byte to a peer: what lies before the damage, and
                    // the damage waits for its own repair.
                    if let Some(damaged) = read.keep_verified() {
                        journal.note_damage(damaged);
                    }
                    bytes::Bytes::copy_from_slice(read.bytes())
                }
                Ok(read) => {
                    tracing::warn!(
                        group,
                        from,
                        batch = read.first_offset,
                        "a log copy asked for an offset inside a batch"
                    );
                    return;
                }
                Err(err) => {
                    tracing::warn!(group, from, %err, "reading a log chunk for a peer failed");
                    return;
                }
            }
        };
        self.bus
            .send(peer, wire::log_chunk_frame(group, from, start, &batches));
    }

    /// A chunk of a peer's log arrived for a copy.
    pub(super) fn take_copy(
        &mut self,
        group: u64,
        from: u64,
        start: u64,
        batches: &[u8],
        moved: &mut Moved,
    ) {
        let now_ms = crate::mailbox::now_ms();
        let Some(journal) = self.host.journal_mut(group) else {
            return;
        };
        // Nothing, from a peer whose log starts above `from`: no peer keeps the damage.
        let retained_nowhere = batches.is_empty() && start > from;
        let mended = if retained_nowhere {
            journal.damage_retained_nowhere(from, start)
        } else {
            journal.repair(from, batches)
        };
        match mended {
            Ok(true) => {
                self.repairs.remove(&group);
                self.batches_repaired += u64::from(!retained_nowhere);
                return;
            }
            Ok(false) => {}
            Err(err) => {
                self.fail_group(group, err.into());
                return;
            }
        }
        let Some(journal) = self.host.journal_mut(group) else {
            return;
        };
        match journal.copy_chunk(from, start, batches, now_ms) {
            // Overdue, the fetch goes to the next peer (`drive_copies`).
            Ok(Copied::Ignored | Copied::Nothing) => {}
            Ok(Copied::Progress) => {
                if let Some(transfer) = journal.behind() {
                    self.ask_copy(group, transfer.cursor, transfer.log_end, 0);
                }
            }
            Ok(Copied::Done) => {
                self.copies.remove(&group);
                self.transfers_done += 1;
                tracing::info!(group, "partition state transfer done");
                // The prepares that waited for the copy went into the journal: they are
                // synced and reported like any write.
                if journal.has_unsynced() {
                    self.start_sync(group);
                } else {
                    match self.host.sync_journal(self.now, group) {
                        Ok(effects) => self.carry(effects, moved),
                        Err(HostError::UnknownGroup(_)) => {}
                        Err(err) => self.fail_group(group, err),
                    }
                }
            }
            Err(PartitionJournalError::Copy(reason)) => {
                // Asked again, maybe of another peer, at the next scan.
                tracing::warn!(group, %reason, "a log chunk was refused");
                self.copies.remove(&group);
            }
            Err(err) => self.fail_group(group, err.into()),
        }
    }
}
