//! Opening a partition's journal: the log and its header journal brought into line.

use std::sync::Arc;

use super::*;
use crate::replication::shared_path::{FileName, SharedPath};

impl PartitionJournal {
    /// Opens the log in `dir` (of the partition tagged `tag`:
    /// [`braid_proto::batch::partition_tag`]) and its header journal (of group `group`,
    /// which seals its records), and brings the two into line.
    ///
    /// # Errors
    /// A file cannot be read or cut.
    pub(crate) fn open(
        dir: &Path,
        group: u64,
        tag: i32,
        config: impl Into<Arc<LogConfig>>,
        now_ms: u64,
    ) -> Result<(Self, Recovered), PartitionJournalError> {
        Self::open_above(dir, group, tag, config, now_ms, None)
    }

    /// As [`PartitionJournal::open`], for a lone replica that committed and
    /// acknowledged ops through `committed` (its durable state's exact commit): a
    /// journal that ends below it is refused before anything is cut.
    ///
    /// # Errors
    /// As [`PartitionJournal::open`], and
    /// [`PartitionJournalError::OlderThanAcknowledged`].
    pub(crate) fn open_above(
        dir: &Path,
        group: u64,
        tag: i32,
        config: impl Into<Arc<LogConfig>>,
        now_ms: u64,
        committed: Option<u64>,
    ) -> Result<(Self, Recovered), PartitionJournalError> {
        let config = config.into();
        let log = PartitionLog::open_tagged(dir, tag, Arc::clone(&config), now_ms)?;
        let journal_path = dir.join(JOURNAL_FILE);
        let repairable = config.recovery == braid_storage::RecoveryMode::TruncateAtDamage;
        // What becomes of damage found here, for the logs: a single node has no peer.
        let remedy = if repairable {
            "repaired from a peer"
        } else {
            "the partition is refused (a single node has no peer to repair it from)"
        };
        // Gone while the log holds batches: every op it named is unknown (a missing file
        // is damage, never a new journal: issue 24). Judged by the file, not by an empty
        // journal: a crash between the log's sync and the journal's leaves batches no
        // header names, never reported, which are cut below. A lone replica refuses
        // before the open makes a new file; a member makes one and restarts the group
        // untrusted (its durable state says so from the first step).
        let log_holds_batches = log.next_offset() > log.start_offset();
        // (Cut short below the beginning it is created with counts as gone: opened,
        // it would read as a creation torn short and be made anew, empty.)
        let mut journal_lost =
            log_holds_batches && super::super::journal_file::gone_or_cut_short(&journal_path);
        if journal_lost && !repairable {
            return Err(PartitionJournalError::JournalLost { path: journal_path });
        }
        // An earlier open found the journal untrusted and repaired away the evidence
        // (a new file, a cut tail) before the group's state said so: still untrusted.
        let marked = dir.join(UNTRUSTED_MARKER).exists();
        // Each reason below marks; the first makes the mark durable, the rest find it
        // made by this open. (A mark found at the open may be in the page cache alone,
        // from a kill inside an earlier mark: the first marking here syncs it.)
        let marked_now = std::cell::Cell::new(false);
        let mark_once = || -> Result<(), JournalError> {
            if !marked_now.get() {
                mark_untrusted(dir)?;
                marked_now.set(true);
            }
            Ok(())
        };
        if journal_lost {
            // Marked before the new file is made: a power loss after its making must
            // not leave a journal that looks whole.
            mark_once()?;
        }
        // Opened once: an open cuts a torn tail and rewrites a damaged file, and what it
        // found (below) is only in this answer.
        let mark = || {
            if repairable {
                mark_once()?;
            }
            Ok(())
        };
        let shared =
            || SharedPath::new(Arc::clone(log.shared_dir()), FileName::Fixed(JOURNAL_FILE));
        let reported_unsynced = log.config().fsync != braid_storage::FsyncPolicy::Always;
        let (index, found) = match JournalFile::open_marking_at(
            shared(),
            group,
            !repairable,
            reported_unsynced,
            mark,
        ) {
            Err(JournalError::NotAJournal { .. }) if repairable => {
                // Damaged past knowing (a zeroed small file, say: the shell simulator's
                // seed 768) in a member of a cluster: lost, as if deleted; its peers
                // hold the ops. Kept aside as the evidence.
                mark_once()?;
                let aside = dir.join(format!("{JOURNAL_FILE}.damaged"));
                tracing::warn!(
                    path = %journal_path.display(),
                    aside = %aside.display(),
                    "the partition's vsr.journal is not readable as a journal: moved aside, \
                     its ops are taken from peers"
                );
                braid_storage::disk::rename(&journal_path, &aside).map_err(|source| {
                    JournalError::Io {
                        path: journal_path.clone(),
                        source,
                    }
                })?;
                // Lost whatever the log holds: an unreadable journal may have named
                // acknowledged ops whose batches went with damage to the log too (the
                // shell simulator's seed 2242, five members at four times the faults:
                // both lost, the member restarted trusted with nothing, and its vote
                // dropped committed ops).
                journal_lost = true;
                JournalFile::open_marking_at(shared(), group, false, reported_unsynced, || Ok(()))?
            }
            opened => opened?,
        };
        let (pruned, pruned_log_end) = index.pruned();
        if let Some(committed) = committed {
            let held = found
                .slots
                .iter()
                .map(|(op, _)| *op)
                .max()
                .unwrap_or(0)
                .max(pruned);
            if held < committed {
                return Err(PartitionJournalError::OlderThanAcknowledged {
                    path: journal_path,
                    held,
                    committed,
                });
            }
        }
        let len_opened = index.len();
        if journal_lost {
            tracing::warn!(
                dir = %dir.display(),
                "the partition's vsr.journal is gone while its log holds batches: its ops \
                 are unknown here and are taken from peers"
            );
        }
        let mut journal = Self {
            index,
            log,
            in_flight: None,
            tip: pruned,
            off_thread: false,
            next_sync: 0,
            behind: None,
            applied_end: 0,
            scrub_cursor: 0,
            scrub_passes: 0,
            damaged_at: None,
            damage_expired_below: None,
            index_changed_unsynced: false,
            tip_log_end: None,
        };
        let external: BTreeMap<u64, u64> = found.external.iter().copied().collect();
        let journal_damaged = found.damaged_at.is_some();
        let recorded_end = found.committed_end;
        let mut slots = Vec::with_capacity(found.slots.len());
        let mut log_end = pruned_log_end;
        let mut contiguous = true;
        let mut cut_from = None;
        let mut log_behind = false;
        // Batches past a hole written whole into the header journal: durable before
        // the log is cut beneath them.
        let mut kept_whole = false;
        for (op, slot) in found.slots {
            let (slot, end) = match (external.get(&op), slot) {
                (Some(&base), JournalSlot::Header(header)) if !contiguous => {
                    // Its batch lies past a hole, and the log is cut back to the hole
                    // below. Intact, it is kept whole in the header journal until the
                    // hole is repaired (it may be the only copy of an op a quorum
                    // needs: the shell simulator's seed 27835 with damage at rest, whose
                    // member cut a view's newest ops with the batches after one bit
                    // flipped in a committed batch, and no member held them any more);
                    // otherwise it is damaged, repaired from a peer.
                    let intact = if repairable {
                        journal.intact_body(base, header)?
                    } else {
                        None
                    };
                    match intact {
                        Some(prepare) => {
                            journal.index.write_prepare(&prepare)?;
                            kept_whole = true;
                            (JournalSlot::Prepare(prepare), None)
                        }
                        None => (JournalSlot::Damaged, None),
                    }
                }
                (Some(&base), JournalSlot::Header(header)) => match journal.read_body(base)? {
                    Body::Absent
                        if found.synced.contains(&op) && base >= journal.log.start_offset() =>
                    {
                        // A sync that finished covered its header, so its batch was
                        // synced before it (the log syncs first): the log lost it to
                        // damage. Damaged, never absent: it may have been acknowledged.
                        tracing::warn!(
                            dir = %dir.display(),
                            op,
                            base,
                            remedy,
                            "the partition log lost a synced batch"
                        );
                        (JournalSlot::Damaged, None)
                    }
                    Body::Absent
                        if journal
                            .log
                            .recovery()
                            .damage_cut_at
                            .is_some_and(|cut| base >= cut) =>
                    {
                        // The log's open cut it with damage (not a torn tail): an
                        // unmarked record says only that no sync marker followed it,
                        // and under `fsync = never` or `interval` a reported op may
                        // have none. Damaged, never absent (the shell simulator's seed
                        // 337454: a zeroed first page of a sleeping member's log, its
                        // acknowledged ops read as never written and dropped).
                        tracing::warn!(
                            dir = %dir.display(),
                            op,
                            base,
                            remedy,
                            "an op's batch went with damage the partition log's open cut"
                        );
                        (JournalSlot::Damaged, None)
                    }
                    Body::Absent if base < journal.log.start_offset() => {
                        // Below the log's start: deleted (retention deletes only what
                        // the journal pruned, so by a version that did not, or the
                        // first segment lost where no `log-start` file says where the
                        // log began), never unwritten. Damaged: a lone replica refuses
                        // and keeps its log; taken for never written, the op and every
                        // op above were cut, and the log back to its start, deleting
                        // every record retention kept.
                        tracing::warn!(
                            dir = %dir.display(),
                            op,
                            base,
                            start = journal.log.start_offset(),
                            "an op's batch lies below the partition log's start"
                        );
                        (JournalSlot::Damaged, None)
                    }
                    Body::Absent => {
                        // Its batch never reached the log's synced part, so it was never
                        // reported written, nor was anything above it.
                        cut_from = Some(op);
                        break;
                    }
                    Body::Held(body, end) if checksum(&body) == header.body_checksum => (
                        JournalSlot::Prepare(Prepare {
                            header,
                            body: body.into(),
                        }),
                        Some(end),
                    ),
                    Body::Held(..) | Body::Damaged => {
                        // Damage at rest, or another partition's batch written at its
                        // place (a misdirected write): said, since nothing else shows
                        // it until a peer's copy repairs it.
                        tracing::warn!(
                            dir = %dir.display(),
                            op,
                            base,
                            remedy,
                            "the batch at an op's place in the partition log is damaged \
                             or not the op's"
                        );
                        (JournalSlot::Damaged, None)
                    }
                },
                (_, slot) => (slot, None),
            };
            let was = contiguous;
            // A batch kept whole in `vsr.journal` (past a damaged one at an earlier
            // open) is not in the log: the tip stops below it, and it goes in below.
            // (Taken as contiguous, the shell simulator's seed 7172 with damage at four
            // times the faults left a member's tip above a log cut at a zeroed page,
            // its high watermark stuck there.)
            let in_place = match &slot {
                JournalSlot::Prepare(prepare) => external.contains_key(&op) || !is_batch(prepare),
                _ => false,
            };
            contiguous &= op == journal.tip + 1 && in_place;
            if was && !contiguous && log_end.is_none() {
                // No op below holds a batch (registers only, nothing pruned): where the
                // log goes on is where this op's batch was, and the log is cut back
                // there so that its repair goes in at its place (the shell simulator's
                // seed 20558 with damage at rest: op 2's batch, the log's first,
                // damaged; the repaired one went in after the old batches).
                log_end = external.get(&op).copied();
            }
            if was && !contiguous {
                tracing::trace!(dir = %dir.display(), op, tip = journal.tip, pruned, external = ?external.get(&op), slot = ?std::mem::discriminant(&slot), damaged = matches!(slot, JournalSlot::Damaged), header = matches!(slot, JournalSlot::Header(_)), "open: the journal's contiguous ops end");
            }
            if contiguous {
                journal.tip = op;
                log_end = end.or(log_end);
            }
            slots.push((op, slot));
        }
        // A lone replica that found damage cuts nothing, from its log or its journal:
        // it refuses to start the group, and what the damage left is there to read and
        // restore.
        let keep_log = !repairable
            && (journal_damaged || slots.iter().any(|(_, s)| *s == JournalSlot::Damaged));
        if keep_log {
            log_end = None;
        }
        if let Some(op) = cut_from.filter(|_| !keep_log) {
            journal.index.truncate(op - 1)?;
            if repairable {
                // The cut records were never reported, but the headers they replaced
                // may have been, and a durable log view may name them: a view's
                // headers are written alone and marked durable before the log view,
                // and the records of their bodies' appends can reach the disk with no
                // marker after them while the batches do not. Dropped with the cut, a
                // vote of that log view said its log ended below them, and a view
                // change dropped committed ops (the shell simulator's seed 23612:
                // offset 187 acknowledged twice). They stay, headers alone, their
                // bodies repaired from a peer; an op the durable journal holds as
                // damaged stays damaged (its lost body may have been acknowledged:
                // the shell simulator's seed 330755, whose member, its journal
                // damaged, wrote its ops again from a peer, lost their batches to a
                // power loss, and voted that it never had them).
                for (above, slot) in found.durable.slots_from(op) {
                    match &slot {
                        JournalSlot::Prepare(prepare) => journal.index.write_prepare(prepare)?,
                        JournalSlot::Header(header) => journal.index.write_header(header)?,
                        JournalSlot::Damaged => journal.index.write_damaged(above)?,
                    }
                    slots.push((above, slot));
                }
            }
        }
        if pruned == 0 && log_end.is_none() && !keep_log {
            // No op the journal holds names a batch, and nothing is pruned: no batch of
            // the log is known to be where it was. Damage inside the header journal, or
            // the journal lost: each is repaired, and goes in at its place again (found
            // by the shell simulator, seed 980: a batch went in after the old ones, at
            // offsets its op did not take; seed 5289 with damage at rest, the same
            // after a zeroed journal was moved aside). Or a torn tail took every record
            // that named one (seed 613 with syncs off the shard's turn: a register
            // alone was left, the old batches stayed, and the next batch went in after
            // them): none was reported.
            log_end = Some(journal.log.start_offset());
        }
        if kept_whole {
            drop(journal.index.sync_unmarked()?);
        }
        let mut log_bytes_cut = 0;
        if let Some(end) = log_end.filter(|end| *end < journal.log.start_offset()) {
            // The ops from below the log's start on are damaged (their batches were
            // deleted; a lone replica keeps its log and refuses, above): a member
            // starts its log again where they go, for peers to fill.
            tracing::warn!(
                dir = %dir.display(),
                start = journal.log.start_offset(),
                end,
                "the partition log starts above batches its journal holds: started \
                 again at {end}, copied from peers"
            );
            let before = journal.log.size_bytes();
            journal.log.reset(end, now_ms)?;
            log_bytes_cut = before;
        } else if let Some(end) = log_end.filter(|end| journal.log.next_offset() > *end) {
            let before = journal.log.size_bytes();
            match journal.log.truncate(end) {
                Ok(()) => {}
                Err(LogError::Corrupt { .. } | LogError::NotBatchBoundary { .. }) if repairable => {
                    // Damage on the way to the cut (a member of a cluster): cut at the
                    // start of its segment instead. (A batch header that says the cut
                    // lies inside it disagrees with the journal, which read the batch
                    // ending there: damage too. The shell simulator's seed 41907: a
                    // header claimed offsets 684 to 16,777,902, and the member could not
                    // start its partition.) The ops whose batches went with it,
                    // and every op after them, are damaged, never absent: peers repair
                    // them (and copy what a checkpoint covers).
                    let cut = journal.log.segment_base(end);
                    tracing::warn!(
                        dir = %dir.display(),
                        end,
                        cut,
                        "damage in the partition log's segment: cut at its start; \
                         the batches after it are repaired from a peer"
                    );
                    let mut hole = false;
                    let mut tip = pruned;
                    for (op, slot) in &mut slots {
                        hole |= external.get(op).is_some_and(|base| *base >= cut);
                        if !hole {
                            if *op <= journal.tip {
                                tip = *op;
                            }
                            continue;
                        }
                        // Read whole above (its batch checked): kept whole, as past a
                        // hole (see above).
                        match slot {
                            JournalSlot::Prepare(prepare) => {
                                if journal
                                    .index
                                    .entry(*op)
                                    .is_some_and(|(_, base)| base.is_some())
                                {
                                    journal.index.write_prepare(prepare)?;
                                }
                            }
                            _ => *slot = JournalSlot::Damaged,
                        }
                    }
                    drop(journal.index.sync_unmarked()?);
                    journal.log.truncate(cut)?;
                    journal.tip = tip;
                    log_end = Some(cut);
                    // Below the prune point's end, no op kept above that point has a
                    // batch (registers may stay): the log is copied back up to it.
                    // (Only when no op stayed, the registers' member put the op's
                    // repaired batch at the cut, offsets it never took: the shell
                    // simulator's seed 335808 with damage at rest.)
                    if pruned_log_end.is_some_and(|want| want > cut) {
                        log_end = pruned_log_end;
                    }
                }
                Err(err) => return Err(err.into()),
            }
            log_bytes_cut = before.saturating_sub(journal.log.size_bytes());
        }
        match log_end {
            Some(end) if journal.log.next_offset() > end => {}
            Some(end)
                if journal.log.next_offset() < end
                    && journal
                        .index
                        .next_external(pruned)
                        .is_none_or(|(op, _)| op > journal.tip) =>
            {
                // The log ends before the prune point's end (a state transfer that a
                // crash interrupted, batches lost with the page cache, or a segment
                // lost to damage at rest), and no op the journal holds above the prune
                // point has a batch (those held whole, registers, stay: the shell
                // simulator's seed 2010 with damage at rest, whose log stayed short
                // behind two registers until the next batch found no place): the rest
                // is copied from a peer before any batch above the prune point goes in.
                tracing::info!(
                    dir = %dir.display(),
                    log_end = journal.log.next_offset(),
                    want = end,
                    "the partition log is copied from a peer up to its checkpoint"
                );
                // What the log holds is a prefix of the committed log (a transfer
                // cuts at a difference before it appends).
                journal.behind = Some(Transfer {
                    op: pruned,
                    log_end: end,
                    cursor: journal.log.next_offset(),
                });
            }
            Some(end) if journal.log.next_offset() < end => {
                // The log lost batches its journal counts as written: it must be
                // copied back from a peer before this replica can take part.
                tracing::warn!(
                    dir = %dir.display(),
                    log_end = journal.log.next_offset(),
                    journal_end = end,
                    "the partition log ends before what its journal recorded"
                );
                log_behind = true;
            }
            _ => {}
        }
        if journal.behind.is_none() {
            journal.tip_log_end = log_end;
        }
        // Where the log was last recorded to be the committed one. (A journal written
        // before that record existed: up to the first batch above the prune point.)
        journal.applied_end = recorded_end.unwrap_or_else(|| {
            journal
                .index
                .next_external(pruned)
                .map_or(journal.log.next_offset(), |(_, base)| base)
        });
        let log_end_now = journal.log.next_offset().max(journal.log.start_offset());
        if journal.applied_end > log_end_now {
            // The log was cut beneath it (damage, a lost tail): what goes in above the
            // cut is known committed only once applied again, so the end comes down to
            // the log's, recorded so. (Left above, the batches kept whole that go in
            // below were served as committed: the shell simulator's seed 7172 with
            // damage at four times the faults, whose member served an old view's batch
            // at offset 733 below its high watermark.)
            journal.applied_end = log_end_now;
            if !keep_log {
                journal.index.write_committed_end(log_end_now)?;
            }
        }
        if repairable {
            // What is reported damaged is written damaged, before the sync below: the
            // log may have been cut beneath it (at the first damaged batch, or a
            // segment's start), and at the next open an entry past the log's end whose
            // sync marker a power loss took reads as never written, so absent (the
            // shell simulator's seed 4523 with damage at rest: acknowledged offset 177
            // given to another record).
            for (op, slot) in &slots {
                if *slot == JournalSlot::Damaged && !journal.index.is_damaged(*op) {
                    journal.index.write_damaged(*op)?;
                }
            }
        }
        // Batches kept whole that now follow the tip go into the log at once (an idle
        // group writes nothing that would move them), synced before the journal
        // names them there.
        let tip_opened = journal.tip;
        if journal.tip_log_end.is_some() {
            journal.append_pending(now_ms)?;
        }
        if journal.tip > tip_opened {
            journal.log.sync()?;
        }
        // A tail cut from the log beneath an op the journal names (its batch absent,
        // no sync marker covering its header: it reads as never written, above) hides
        // nothing: a sync's marker is durable before its ops are reported, so a
        // reported op's header has an intact marker after it and its lost batch reads
        // as damaged. Only a journal cut that may have taken such a marker
        // (`tail_may_hide`) leaves the doubt. (Counting every log cut under a named op
        // as hiding one made members untrusted after most power losses once syncs
        // ran off the shard's turn: the shell simulator's seed 24, whose three
        // members all lost their trust so and whose view change waited for ever.)
        let tail_cut = journal_lost || found.tail_may_hide;
        let tail_cut = tail_cut || marked;
        if tail_cut && repairable {
            // What the open cut or made anew below becomes durable with the next sync;
            // the mark first, so the distrust outlives a power loss until the group's
            // state holds it ([`PartitionJournal::distrust_persisted`]). A mark found
            // at the open is synced here too: it may not have been durable.
            mark_once()?;
        }
        // What the group acts on must be durable: after a kill -9 the file may be in
        // the page cache alone. A clean close synced it (bar its last sync marker, a
        // hint), and an open that wrote nothing needs no sync: a node of 100,000
        // partitions restarted with an `fdatasync` each.
        // (A lone replica that found damage writes nothing, not even a sync marker:
        // it refuses the group, and each start must find the files as the damage left
        // them; an outside review of issue 24 saw one appended at every start after a
        // `kill -9`.)
        let wrote = journal.index.len() != len_opened || journal_lost;
        if !keep_log && (!journal.log.recovery().clean || wrote) {
            journal.index.sync()?;
        }
        let first_damaged = slots
            .iter()
            .find(|(_, s)| *s == JournalSlot::Damaged)
            .map(|(op, _)| *op);
        let damage = if journal_lost {
            Some(format!("{} is gone or unreadable", journal_path.display()))
        } else if let Some(at) = found.damaged_at {
            Some(format!(
                "{} is damaged at byte {at}",
                journal_path.display()
            ))
        } else if let Some(op) = first_damaged {
            let batch = external.get(&op).map_or(String::new(), |base| {
                let segment = journal.log.segment_base(*base);
                format!(" at offset {base} (in {segment:020}.log)")
            });
            Some(format!(
                "op {op} of the partition in {}: its batch{batch} is damaged or lost",
                dir.display()
            ))
        } else if log_behind {
            Some(format!(
                "the partition log in {} ends before what its vsr.journal recorded",
                dir.display()
            ))
        } else {
            None
        };
        let recovered = Recovered {
            slots,
            damage,
            log_bytes_cut,
            log_behind,
            tail_cut,
        };
        Ok((journal, recovered))
    }
}

/// The file whose presence says a journal's open found it untrusted (lost, unreadable,
/// or with a cut tail that may hide acknowledged ops) and its group's durable state
/// may not say so yet.
pub(crate) const UNTRUSTED_MARKER: &str = "vsr.journal.untrusted";

/// Creates the untrusted mark in `dir`, durably (the file and its directory entry).
pub(super) fn mark_untrusted(dir: &Path) -> Result<(), JournalError> {
    super::super::journal_file::mark_untrusted(&dir.join(JOURNAL_FILE))
}

impl PartitionJournal {
    /// The group's durable state now says its journal is untrusted: the mark its open
    /// left goes.
    ///
    /// # Errors
    /// The mark cannot be removed.
    pub(crate) fn distrust_persisted(&mut self) -> Result<(), PartitionJournalError> {
        let journal = self.log.dir().join(JOURNAL_FILE);
        Ok(super::super::journal_file::clear_untrusted_mark(&journal)?)
    }
}
