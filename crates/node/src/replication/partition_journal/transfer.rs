//! Bringing a partition's log up to a checkpoint: a peer's log copied from where this
//! one is known committed, and the journal cut to match.

use super::*;

impl PartitionJournal {
    /// A checkpoint at `op` (with `checksum`) whose state says the log ends at
    /// `log_end` there was written (taken here, installed from a peer, or found at
    /// open). If this journal holds that very op (the same checksum, so the same chain
    /// below it), the log holds the committed prefix already. Otherwise the log is
    /// brought to `log_end` from a peer's, compared from where it is known committed
    /// ([`Transfer`]). The prune that follows records `log_end`, so a crash during the
    /// copy resumes it.
    ///
    /// # Errors
    /// The log could not be cut.
    pub(crate) fn checkpointed(
        &mut self,
        op: u64,
        checksum: Checksum,
        log_end: u64,
        now_ms: u64,
    ) -> Result<(), PartitionJournalError> {
        let (pruned, pruned_log_end) = self.index.pruned();
        if self.behind.is_some_and(|t| t.op >= op) || op < pruned {
            if self.behind.is_some_and(|t| t.op == op) {
                // A copy found at open, its checkpoint named now.
                self.flight_mut().copy_anchor = Some((op, checksum));
            }
            return Ok(());
        }
        tracing::trace!(dir = %self.log.dir().display(), op, log_end, pruned, tip = self.tip, applied_end = self.applied_end, log_next = self.log.next_offset(), "checkpointed");
        if op == pruned {
            // Found at open, its prune done. The journal holds nothing above it, so the
            // log must end at the checkpoint's end: a prune that could not record the
            // log's end (it came while the log was behind) left only the checkpoint to
            // say where the next batch goes. A log that ends elsewhere is cut back or
            // copied up to it below, never appended to where it happens to end.
            let unsettled = self.tip == pruned
                && self.behind.is_none()
                && (pruned_log_end != Some(log_end) || self.log.next_offset() != log_end);
            if !unsettled {
                return Ok(());
            }
            if pruned_log_end.is_some_and(|end| end != log_end) {
                tracing::warn!(
                    dir = %self.log.dir().display(),
                    op,
                    journal = ?pruned_log_end,
                    checkpoint = log_end,
                    "the journal's prune and its checkpoint disagree on where the log ends; \
                     the checkpoint's state is taken"
                );
            }
        }
        let held = op <= self.tip
            && self
                .index
                .entry(op)
                .is_some_and(|(h, _)| h.checksum == checksum);
        if held {
            self.applied(op, checksum);
            return Ok(());
        }
        self.forget_waiting(|o| o > op);
        // A copy running to an older checkpoint goes on from where it got to: what it
        // copied is a prefix of the committed log, which this checkpoint's extends.
        // (Started again from what was applied, a member behind under load copied the
        // same chunks after each of its peers' checkpoints: the shell simulator's seed
        // 337060.)
        let copied = self.behind.map_or(0, |t| t.cursor);
        let cursor = self.applied_end().max(copied).min(log_end);
        self.behind = Some(Transfer {
            op,
            log_end,
            cursor,
        });
        self.flight_mut().copy_anchor = Some((op, checksum));
        if cursor == log_end {
            // Everything below the checkpoint's end is known committed.
            let end = self.cut_log_at(log_end)?;
            if end == log_end {
                self.finish_transfer(now_ms)?;
            } else {
                self.behind = Some(Transfer {
                    op,
                    log_end,
                    cursor: end,
                });
            }
        }
        Ok(())
    }

    /// The checkpoint the running copy goes to (its op and checksum), for the fetches
    /// that ask peers for it.
    pub(crate) fn copy_anchor(&self) -> Option<(u64, Checksum)> {
        let transfer = self.behind?;
        self.flight()
            .copy_anchor
            .filter(|(op, _)| *op == transfer.op)
    }

    /// Where this log is the committed one through, given that `op` with `checksum`
    /// is committed (a peer's checkpoint): if the journal holds that op in its prefix
    /// (at or below the tip, whose batches the log holds in op order), chained by
    /// parent checksums down to the prune point, the log is the committed one up to
    /// the end of op's batch, whatever this replica knows of its own commit.
    pub(crate) fn committed_through(&self, op: u64, checksum: Checksum) -> Option<u64> {
        let (pruned, _) = self.index.pruned();
        if self.behind.is_some() || op > self.tip || op <= pruned {
            return None;
        }
        let mut expected = checksum;
        for at in (pruned + 1..=op).rev() {
            let (header, _) = self.index.entry(at)?;
            if header.checksum != expected {
                return None;
            }
            expected = header.parent;
        }
        Some(match self.index.next_external(op) {
            Some((next, base)) if next <= self.tip => base,
            _ => self.log.next_offset(),
        })
    }

    /// Cuts the log at `offset` with every journal entry whose batch is there or
    /// after it. The cut ops above the checkpoint being copied to stay known as
    /// damaged: their batches may be lost (a log cut back at open) while they were
    /// acknowledged, and an op absent from a trusted journal is a vote to drop it
    /// (the shell simulator's seed 1750 with damage at rest: acknowledged offsets
    /// reused after the next restart). Peers repair them; one that was an old view's
    /// is dropped by the view change without this replica's vote. A header held alone
    /// (its body never written here, so never acknowledged) stays a header: made
    /// damaged, it could never be dropped (the shell simulator's seed 15843 with
    /// damage at rest, where two members held a view's newest op so and the view
    /// change waited for ever).
    ///
    /// Returns where the log now ends: below `offset` when damage lay between the
    /// start of `offset`'s segment and the cut (a zeroed page the cut had to walk
    /// through: the shell simulator's seed 2697 with damage at four times the faults,
    /// whose member stopped its partitions): the log is then cut at that segment's
    /// start, and a copy takes the rest again from there.
    pub(super) fn cut_log_at(&mut self, offset: u64) -> Result<u64, PartitionJournalError> {
        let mut offset = offset;
        if offset < self.log.next_offset()
            && matches!(
                self.log.read(offset, 1, u64::MAX),
                Err(LogError::Corrupt { .. })
            )
        {
            // The way to `offset` is damaged: no cut can find it. Decided before any
            // entry is cut, so the entries and the log are cut at the same place.
            let base = self.log.segment_base(offset);
            tracing::warn!(
                dir = %self.log.dir().display(),
                offset,
                cut = base,
                "damage in the partition log's segment: cut at its start; \
                 the batches after it are copied from a peer again"
            );
            offset = base;
        }
        self.cut_entries_from(offset)?;
        if self.log.next_offset() > offset {
            self.log.truncate(offset)?;
        }
        Ok(self.log.next_offset().min(offset))
    }

    /// The journal side of [`PartitionJournal::cut_log_at`]: every entry whose batch
    /// is at `offset` or after it.
    fn cut_entries_from(&mut self, offset: u64) -> Result<(), PartitionJournalError> {
        if let Some(op) = self.index.first_external_from(offset) {
            let covered = self.behind.map_or(0, |t| t.op).max(op.saturating_sub(1));
            // Kept: a header alone, and a prepare held whole (its body is not in the
            // log; the replica holds it and never sends it again: the shell
            // simulator's seed 94). Whatever had its batch in the log is damaged.
            let held: Vec<(u64, Option<braid_vsr::JournalSlot>)> = self
                .index
                .ops_above(covered)
                .map(|o| (o, self.index.held_apart(o)))
                .collect();
            self.cut_above(op.saturating_sub(1))?;
            for (op, slot) in held {
                match slot {
                    Some(braid_vsr::JournalSlot::Header(header)) => {
                        self.index.write_header(&header)?;
                    }
                    Some(braid_vsr::JournalSlot::Prepare(prepare)) => {
                        self.index.write_prepare(&prepare)?;
                    }
                    _ => self.index.write_damaged(op)?,
                }
            }
        }
        Ok(())
    }

    /// Takes a chunk of a peer's log asked for at `from`: `batches`, whole and in
    /// order, or none with `peer_start` above `from` when the peer's retention deleted
    /// what this log lacks (the log then starts again at the peer's start).
    ///
    /// # Errors
    /// A batch is damaged or not where it belongs (the copy is abandoned for this
    /// chunk and asked again), or an append failed.
    pub(crate) fn copy_chunk(
        &mut self,
        from: u64,
        peer_start: u64,
        batches: &[u8],
        now_ms: u64,
    ) -> Result<Copied, PartitionJournalError> {
        let Some(mut transfer) = self.behind else {
            return Ok(Copied::Ignored);
        };
        if from != transfer.cursor {
            return Ok(Copied::Ignored);
        }
        if batches.is_empty() && peer_start <= from {
            return Ok(Copied::Nothing);
        }
        if batches.is_empty() && peer_start > from {
            // Nothing of what this log holds from the cursor on can be checked, and
            // the batches below it (known committed, covered by the checkpoint) go
            // with the reset: so do the entries that name them, durably first. Left
            // naming batches below the log's start, they read at the next open as
            // damage, and the member lost its journal's trust (the shell simulator's
            // seed 322172 at four times the faults: a process crash during such a
            // copy left a member untrusted above its commit, its peer's prepares
            // above it lost to damage, and no view change could drop the ops whose
            // bodies nobody held).
            self.cut_log_at(self.log.start_offset().min(transfer.cursor))?;
            drop(self.index.sync_unmarked()?);
            self.log.reset(peer_start.min(transfer.log_end), now_ms)?;
            transfer.cursor = self.log.next_offset();
        }
        let mut rest = batches;
        while !rest.is_empty() && transfer.cursor < transfer.log_end {
            let (batch, used) = braid_proto::RecordBatch::check_stored(rest, self.log.tag())
                .map_err(|err| {
                    PartitionJournalError::Copy(format!("a copied batch is damaged: {err}"))
                })?;
            let header = batch.header();
            let base = header.base_offset as u64;
            if base != transfer.cursor {
                return Err(PartitionJournalError::Copy(format!(
                    "a copied batch starts at {base}, the copy at {}",
                    transfer.cursor
                )));
            }
            let theirs = &rest[..used];
            rest = &rest[used..];
            tracing::trace!(dir = %self.log.dir().display(), cursor = transfer.cursor, log_next = self.log.next_offset(), op = transfer.op, "copy: a batch");
            if transfer.cursor < self.log.next_offset() {
                match self.read_body(transfer.cursor)? {
                    Body::Held(ours, end) if ours == canonical(theirs.to_vec()) => {
                        transfer.cursor = end;
                        continue;
                    }
                    // The first batch that is not the committed one: it and all after it
                    // are an old view's, never committed.
                    _ => {
                        let end = self.cut_log_at(transfer.cursor)?;
                        if end < transfer.cursor {
                            // Cut further back by damage: taken again from there.
                            transfer.cursor = end;
                            self.behind = Some(transfer);
                            return Ok(Copied::Progress);
                        }
                    }
                }
            }
            self.log.append_shared(theirs, now_ms)?;
            transfer.cursor = self.log.next_offset();
        }
        self.behind = Some(transfer);
        if transfer.cursor >= transfer.log_end {
            let end = self.cut_log_at(transfer.log_end)?;
            if end < transfer.log_end {
                transfer.cursor = end;
                self.behind = Some(transfer);
                return Ok(Copied::Progress);
            }
            self.finish_transfer(now_ms)?;
            return Ok(Copied::Done);
        }
        Ok(Copied::Progress)
    }

    /// The log holds every batch up to the checkpoint's end: synced, it stands for
    /// every op up to the checkpoint, and the ops above it go in.
    fn finish_transfer(&mut self, now_ms: u64) -> Result<(), PartitionJournalError> {
        tracing::trace!(dir = %self.log.dir().display(), transfer = ?self.behind, tip = self.tip, log_end = self.log.next_offset(), "transfer done");
        let Some(transfer) = self.behind.take() else {
            return Ok(());
        };
        self.log.sync()?;
        // The copy made the log the committed one up to the checkpoint's end.
        self.applied_end = self.applied_end.max(transfer.log_end);
        if let Some(flight) = self.in_flight.as_deref_mut() {
            flight.applied_ahead.retain(|o, _| *o > transfer.op);
            // Read only while a copy runs.
            flight.copy_anchor = None;
        }
        self.settle();
        // Entries at or below the checkpoint's op are covered by it, and their batches
        // were copied, not appended: a header written there before the copy (a view's
        // suffix whose bodies were to be repaired) would read at the next open as a
        // hole below the batches appended from here on, and the open would cut them.
        self.index.write_committed_end(self.applied_end())?;
        if transfer.op > self.index.pruned().0 {
            self.index.prune_at(transfer.op, Some(transfer.log_end))?;
        }
        drop(self.index.sync_unmarked()?);
        self.tip = self.tip.max(transfer.op);
        // The log ends at the checkpoint's end unless an op up to the tip has its batch
        // after it (ops held whole, registers, add none).
        let batch_above = self
            .index
            .next_external(transfer.op)
            .is_some_and(|(op, _)| op <= self.tip);
        self.tip_log_end = (!batch_above).then_some(transfer.log_end);
        self.append_pending(now_ms)
    }
}
