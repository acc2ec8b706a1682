use super::*;

/// Ops applied from prepares held in memory (above the journal's tip, or while the
/// log is copied) say nothing of what the log holds: a later copy still compares the
/// log from the end of the last op applied from it, even once the journal pruned those
/// ops (found by the shell simulator: a second checkpoint installed during a copy took
/// the log's end as committed, keeping an old view's batches).
#[test]
fn ops_applied_from_memory_do_not_vouch_for_the_log() {
    let ops = chain(30, 2, "a");
    let (_peer_dir, mut peer, end) = peer_holding(&ops);
    let dir = tempfile::tempdir().unwrap();
    let (mut journal, _) = open(dir.path());
    let old = divergent(&ops);
    for p in &old {
        journal.write_prepare(p, 0).unwrap();
    }
    journal.sync().unwrap();
    // Ops 1 to 5 are applied from the log; 6 to 20 from memory (the log holds an old
    // view's 6 to 9).
    for p in &ops[..20] {
        journal.applied(p.header.op, p.header.checksum);
    }
    let end_20 = peer.index.entry(21).and_then(|(_, base)| base).unwrap();
    journal
        .checkpointed(20, ops[19].header.checksum, end_20, 0)
        .unwrap();
    let first = journal.behind().unwrap();
    // The replica prunes what its checkpoint covers (the old view's entries with it),
    // and a newer checkpoint comes before the copy moved.
    journal.prune(20).unwrap();
    journal
        .checkpointed(30, ops[29].header.checksum, end, 0)
        .unwrap();
    assert_eq!(
        journal.behind().map(|t| t.cursor),
        Some(first.cursor),
        "the copy still compares from the end of op 5"
    );
    copy_all(&mut journal, &mut peer, end);
    assert_eq!(journal.behind(), None);
    assert_eq!(log_batches(&mut journal), log_batches(&mut peer));
}

/// A prune that could not record where the log ends (it came while the log was behind
/// its checkpoint) leaves the checkpoint to say it: at open the log is cut back or
/// copied up to the checkpoint's end, never appended to where it happens to end.
#[test]
fn at_open_the_checkpoint_says_where_the_log_ends_when_the_prune_could_not() {
    let ops = chain(12, 1, "a");
    let (_peer_dir, mut peer, _) = peer_holding(&ops);
    let checkpoint_end = {
        let (_, base) = peer.index.entry(11).map(|(h, b)| (*h, b)).unwrap();
        base.unwrap()
    };
    let dir = tempfile::tempdir().unwrap();
    {
        let (mut journal, _) = open(dir.path());
        for p in &ops[..4] {
            journal.write_prepare(p, 0).unwrap();
        }
        journal.sync().unwrap();
        // Pruned at op 10 with no log end known (as a prune above the tip records it).
        journal.index.prune_at(10, None).unwrap();
        journal.sync_now().unwrap();
    }
    let (mut journal, _) = open(dir.path());
    assert_eq!(journal.tip(), 10);
    assert!(journal.log().next_offset() < checkpoint_end);
    journal
        .checkpointed(10, ops[9].header.checksum, checkpoint_end, 0)
        .unwrap();
    let transfer = journal
        .behind()
        .expect("the log is copied up to the checkpoint");
    assert_eq!((transfer.op, transfer.log_end), (10, checkpoint_end));
    copy_all(&mut journal, &mut peer, checkpoint_end);
    assert_eq!(journal.log().next_offset(), checkpoint_end);
    journal.write_prepare(&ops[10], 0).unwrap();
    assert_eq!(journal.tip(), 11);
    assert_eq!(
        log_batches(&mut journal),
        log_batches(&mut peer)[..10].to_vec(),
        "every batch at the offsets the peer holds it"
    );
}

/// Issue 24, findings 11 and 13: a batch the log lost after its sync (a flipped bit in
/// the active segment's last batch, cut as a torn tail by the log's recovery) made its
/// op absent from the journal too. A finished sync's marker now proves the batch was
/// synced, so the op is damaged (repaired from a peer; a lone replica refuses to
/// start), while a batch no finished sync covered is still cut as never reported.
#[test]
fn a_synced_batch_the_log_lost_is_damaged_and_an_unsynced_one_is_cut() {
    let dir = tempfile::tempdir().unwrap();
    let ops = chain(6, 1, "a");
    let base = {
        let (mut journal, _) = open(dir.path());
        for p in &ops[..5] {
            journal.write_prepare(p, 0).unwrap();
        }
        journal.sync().unwrap();
        journal.index.entry(4).and_then(|(_, b)| b).unwrap()
    };
    {
        // The log loses ops 4 and 5's batches beneath the journal.
        let mut log = PartitionLog::open_tagged(dir.path(), TAG, config(), 0).unwrap();
        log.truncate(base).unwrap();
    }
    let (journal, recovered) = open(dir.path());
    assert!(
        recovered.damage.is_some(),
        "a lone replica refuses to start on this"
    );
    let slots: Vec<_> = recovered
        .slots
        .iter()
        .map(|(o, s)| (*o, s.clone()))
        .collect();
    assert!(matches!(
        slots[..3],
        [(1, JournalSlot::Prepare(_)), (2, _), (3, _)]
    ));
    assert_eq!(
        slots[3..],
        [(4, JournalSlot::Damaged), (5, JournalSlot::Damaged)],
        "acknowledged ops are never absent"
    );
    assert_eq!(journal.tip(), 3);
    assert_eq!(
        journal.tip_log_end,
        Some(base),
        "repairs go in where op 4 belongs"
    );
    drop(journal);

    // Written and never synced: cut, since it was never reported.
    let dir = tempfile::tempdir().unwrap();
    {
        let (mut journal, _) = open(dir.path());
        for p in &ops[..3] {
            journal.write_prepare(p, 0).unwrap();
        }
        journal.sync().unwrap();
        journal.log().sync().unwrap();
        for p in &ops[3..5] {
            journal.write_prepare(p, 0).unwrap();
        }
        let base = journal.index.entry(4).and_then(|(_, b)| b).unwrap();
        journal.log().truncate(base).unwrap();
    }
    let (journal, recovered) = open(dir.path());
    assert!(recovered.damage.is_none(), "{:?}", recovered.damage);
    assert_eq!(recovered.slots.len(), 3);
    assert_eq!(journal.tip(), 3);
}

/// Issue 24, finding 2: "partition log: offset X is outside the log [0, Y]" stopped a
/// member's start after a state transfer, one partition per start. Entries above a
/// hole (their batches lost with the log's tail, or cut by a transfer) name bases past
/// the log's end, and cutting them tried to truncate the log beyond its end. Such a cut
/// now drops the entries and leaves the log as it is.
#[test]
fn cutting_entries_whose_batches_lie_past_the_log_end_is_no_error() {
    let dir = tempfile::tempdir().unwrap();
    let ops = chain(10, 1, "a");
    let (hole, past) = {
        let (mut journal, _) = open(dir.path());
        for p in &ops {
            journal.write_prepare(p, 0).unwrap();
        }
        journal.sync().unwrap();
        let base = |op| journal.index.entry(op).and_then(|(_, b)| b).unwrap();
        (base(6), base(8))
    };
    {
        let mut log = PartitionLog::open_tagged(dir.path(), TAG, config(), 0).unwrap();
        log.truncate(hole).unwrap();
    }
    let (mut journal, recovered) = open(dir.path());
    assert!(recovered.damage.is_some());
    assert_eq!(journal.tip(), 5);
    assert_eq!(journal.log().next_offset(), hole);
    // A transfer's end at the hole + 1: the first entry from there names `past`.
    journal.cut_log_at(hole + 1).unwrap();
    assert!(
        journal.index.entry(8).is_none(),
        "the entries past the end are cut"
    );
    assert!(past > journal.log().next_offset());
    assert_eq!(journal.log().next_offset(), hole, "the log is as it was");
    assert_eq!(
        journal.tip_log_end,
        Some(hole),
        "op 6 still goes at the hole"
    );
    journal.write_prepare(&ops[5], 0).unwrap();
    assert_eq!(journal.tip(), 6);
}

/// The records a replica may serve end where its log holds the committed ones: ops
/// applied from prepares in memory count once their batches are in (found by the
/// shell simulator: backups promised reads below a high watermark their logs did not
/// reach yet).
#[test]
fn what_may_be_served_ends_where_the_log_holds_the_applied_ops() {
    let dir = tempfile::tempdir().unwrap();
    let ops = chain(6, 1, "a");
    let (mut journal, _) = open(dir.path());
    for p in &ops[..3] {
        journal.write_prepare(p, 0).unwrap();
    }
    // Op 5 waits for op 4, which is being repaired.
    journal.write_prepare(&ops[4], 0).unwrap();
    journal.sync().unwrap();
    for p in &ops[..3] {
        journal.applied(p.header.op, p.header.checksum);
    }
    let end_3 = journal.log().next_offset();
    assert_eq!(journal.committed_end(), end_3);
    // Ops 4 and 5 commit and are applied from memory: the log does not hold them.
    journal.applied(4, ops[3].header.checksum);
    journal.applied(5, ops[4].header.checksum);
    assert_eq!(
        journal.committed_end(),
        end_3,
        "nothing promised past the log"
    );
    // The repair brings op 4; op 5 follows it into the log.
    journal.write_prepare(&ops[3], 0).unwrap();
    assert_eq!(journal.tip(), 5);
    assert_eq!(journal.committed_end(), journal.log().next_offset());
    assert!(journal.committed_end() > end_3);
}

/// How far the log is the committed one survives a restart after a prune took the
/// entries that showed it: a prune above the log's tip (a copy runs for a newer
/// checkpoint) must not leave the next open taking the whole log, an old view's
/// batches in it, as committed (found by the shell simulator, seed 50).
#[test]
fn a_restart_after_a_prune_above_the_tip_still_compares_the_unproven_batches() {
    let ops = chain(30, 2, "a");
    let (_peer_dir, mut peer, end) = peer_holding(&ops);
    let dir = tempfile::tempdir().unwrap();
    {
        let (mut journal, _) = open(dir.path());
        for p in &divergent(&ops) {
            journal.write_prepare(p, 0).unwrap();
        }
        journal.sync().unwrap();
        for p in &ops[..5] {
            journal.applied(p.header.op, p.header.checksum);
        }
        let end_20 = peer.index.entry(21).and_then(|(_, base)| base).unwrap();
        journal
            .checkpointed(20, ops[19].header.checksum, end_20, 0)
            .unwrap();
        // A newer checkpoint replaces the copy; the replica prunes what the first
        // covers, above the log's tip (op 9), and the process dies.
        journal
            .checkpointed(30, ops[29].header.checksum, end, 0)
            .unwrap();
        journal.prune(20).unwrap();
        journal.sync_now().unwrap();
    }
    let (mut journal, _) = open(dir.path());
    let end_5 = peer.index.entry(6).and_then(|(_, base)| base).unwrap();
    journal
        .checkpointed(30, ops[29].header.checksum, end, 0)
        .unwrap();
    assert_eq!(
        journal.behind().map(|t| t.cursor),
        Some(end_5),
        "the copy compares from the end of op 5, the last op applied from the log"
    );
    copy_all(&mut journal, &mut peer, end);
    assert_eq!(log_batches(&mut journal), log_batches(&mut peer));
}

/// Damage inside the header journal, before any prune: no op's batch is known to be
/// where it was, so the log is cut back and each repaired op goes in at its place
/// again, never after the old batches (found by the shell simulator, seed 980: a
/// repaired batch went in at offsets its op did not take).
#[test]
fn a_damaged_header_journal_cuts_the_log_back_so_repairs_go_in_at_their_place() {
    let dir = tempfile::tempdir().unwrap();
    let ops = chain(5, 1, "a");
    drop(holding(dir.path(), &ops));
    let path = dir.path().join(JOURNAL_FILE);
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[100] ^= 0x08;
    std::fs::write(&path, &bytes).unwrap();
    let (mut journal, recovered) = open(dir.path());
    assert!(recovered.damage.is_some());
    assert_eq!(journal.log().next_offset(), 0, "the log is cut back");
    for p in &ops {
        journal.write_prepare(p, 0).unwrap();
    }
    journal.sync().unwrap();
    assert_eq!(journal.tip(), 5);
    let (_, base_3) = journal.index.entry(3).map(|(h, b)| (*h, b)).unwrap();
    // Op 3 sits where a log that never lost anything holds it.
    let dir2 = tempfile::tempdir().unwrap();
    let clean = holding(dir2.path(), &ops);
    assert_eq!(base_3, clean.index.entry(3).and_then(|(_, b)| b));
}

/// Prints what a partition directory's journal holds around its tip (a debugging aid
/// for evidence a fault run kept): `BRAID_INSPECT_PARTITION=DIR`.
#[test]
#[ignore = "inspects a kept partition directory: BRAID_INSPECT_PARTITION=DIR"]
fn inspect_a_partition_directory() {
    let Some(dir) = std::env::var_os("BRAID_INSPECT_PARTITION") else {
        return;
    };
    let copy = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), copy.path().join(entry.file_name())).unwrap();
    }
    let (journal, recovered) = open(copy.path());
    let tip = journal.tip();
    println!(
        "pruned {:?}, tip {tip}, log [{}, {}), slots {}",
        journal.index.pruned(),
        journal.log.start_offset(),
        journal.log.next_offset(),
        recovered.slots.len()
    );
    for (op, slot) in recovered
        .slots
        .iter()
        .filter(|(op, _)| *op + 3 >= tip && *op <= tip + 5)
    {
        let kind = match slot {
            JournalSlot::Prepare(p) => format!(
                "prepare v{} sum {:x} parent {:x}",
                p.header.view,
                p.header.checksum >> 100,
                p.header.parent >> 100
            ),
            JournalSlot::Header(h) => format!(
                "header v{} sum {:x} parent {:x}",
                h.view,
                h.checksum >> 100,
                h.parent >> 100
            ),
            JournalSlot::Damaged => "damaged".into(),
        };
        println!(
            "op {op}: {kind} entry {:?}",
            journal
                .index
                .entry(*op)
                .map(|(h, b)| (h.checksum >> 100, b))
        );
    }
}

/// A partition's `vsr.journal` deleted, or zeroed past knowing, while its log holds
/// batches (the real-process damage suite; the shell simulator's seed 768): the ops it
/// named are unknown, never absent. A lone replica (strict recovery) is told what is
/// damaged and refuses; a member of a cluster (truncate-at-damage) moves an unreadable
/// file aside and restarts the group untrusted above its known commit (its votes never
/// nack what it may have acknowledged), its peers supplying the ops.
#[test]
fn a_lost_or_unreadable_header_journal_is_damage_never_an_empty_journal() {
    let ops = chain(5, 1, "a");
    // A replica that wrote and synced them all.
    let (dir, _, _) = peer_holding(&ops);
    let path = dir.path().join(JOURNAL_FILE);
    let member = member_config();
    std::fs::remove_file(&path).unwrap();
    // A lone replica refuses, and makes no new file: the next start refuses the same.
    for _ in 0..2 {
        let refused = PartitionJournal::open(dir.path(), GROUP, TAG, config(), 0)
            .map(|_| ())
            .unwrap_err();
        assert!(
            matches!(refused, PartitionJournalError::JournalLost { .. }),
            "{refused}"
        );
        assert!(!path.exists());
    }
    let (mut journal, recovered) =
        PartitionJournal::open(dir.path(), GROUP, TAG, member, 0).unwrap();
    let damage = recovered.damage.expect("a lost journal is damage");
    assert!(damage.contains("vsr.journal is gone"), "{damage}");
    assert!(
        recovered.tail_cut,
        "untrusted above what is known committed"
    );
    // No batch of the log is known to be where its op puts it: the log is cut back, and
    // the repaired ops go in at their places (the shell simulator's seed 5289 with
    // damage at rest: op 2 went in after the old batches, at offset 13 for 0).
    assert_eq!(journal.log().next_offset(), 0);
    for p in &ops {
        journal.write_prepare(p, 0).unwrap();
    }
    journal.sync().unwrap();
    assert_eq!(journal.index.entry(2).and_then(|(_, base)| base), Some(0));
    drop(journal);

    // Zeroed whole: a lone replica refuses to open it; a cluster member moves it aside.
    let len = std::fs::metadata(&path).unwrap().len();
    std::fs::write(&path, vec![0u8; len.max(16) as usize]).unwrap();
    assert!(PartitionJournal::open(dir.path(), GROUP, TAG, config(), 0).is_err());
    let (_, recovered) = PartitionJournal::open(dir.path(), GROUP, TAG, member, 0).unwrap();
    assert!(recovered.damage.is_some() && recovered.tail_cut);
    assert!(
        dir.path().join("vsr.journal.damaged").exists(),
        "the evidence kept"
    );
}

/// A member's open reads `vsr.journal` once: an earlier version opened it twice (the
/// first to see whether it was a journal at all), and the first open's repairs (a torn
/// tail cut, damage rewritten as damaged entries) hid from the second what it found,
/// so the group restarted trusted and its log was not cut back (the shell simulator's
/// seeds 1302, 1989 and 2070 with damage at rest: a diverged log, a view change that
/// never ended, a member that would serve less than was acknowledged).
#[test]
fn a_members_open_reports_the_damage_and_the_torn_tail_it_found() {
    let ops = chain(5, 1, "a");
    // A replica that wrote and synced them all.
    let (dir, _, _) = peer_holding(&ops);
    let member = member_config();
    let path = dir.path().join(JOURNAL_FILE);
    let mut bytes = std::fs::read(&path).unwrap();
    // Inside the first record (after the magic and head, 64 bytes).
    bytes[100] ^= 0x10;
    // And a torn record at the end.
    tear_over_a_marker(&mut bytes);
    std::fs::write(&path, &bytes).unwrap();
    let (_, recovered) = PartitionJournal::open(dir.path(), GROUP, TAG, member, 0).unwrap();
    let damage = recovered.damage.expect("damage found");
    assert!(damage.contains("is damaged at byte"), "{damage}");
    assert!(
        recovered.tail_cut,
        "the torn tail makes the group untrusted"
    );
}

/// The shell simulator's seed 1750, with damage at rest: a member's log lost its
/// segment (cut at its start at open), a checkpoint's copy brought it back to the
/// checkpoint's end, and finishing the copy cut the journal's entries above the
/// checkpoint as if they were an old view's. They were acknowledged ops whose batches
/// went with the damage: absent from a trusted journal at the next start, the
/// member's vote dropped them, and their offsets were given to other records. They
/// stay damaged until peers repair them.
#[test]
fn ops_above_a_checkpoint_that_a_copy_cut_stay_damaged() {
    let ops = chain(10, 1, "a");
    let (_peer_dir, mut peer, _) = peer_holding(&ops);
    let end_5 = peer.index.next_external(5).map(|(_, base)| base).unwrap();
    // A replica that wrote and synced them all.
    let (dir, _, _) = peer_holding(&ops);
    // Damage at rest took every batch.
    PartitionLog::open_tagged(dir.path(), TAG, config(), 0)
        .unwrap()
        .truncate(0)
        .unwrap();
    let (mut journal, recovered) = open(dir.path());
    assert!(recovered
        .slots
        .iter()
        .filter(|(op, _)| *op >= 2)
        .all(|(_, slot)| *slot == JournalSlot::Damaged));
    journal
        .checkpointed(5, ops[4].header.checksum, end_5, 0)
        .unwrap();
    copy_all(&mut journal, &mut peer, end_5);
    assert_eq!(journal.behind(), None, "the copy is done");
    assert_eq!(journal.log().next_offset(), end_5);
    drop(journal);
    let (_, recovered) = open(dir.path());
    for op in 6..=10 {
        assert_eq!(
            recovered.slots.iter().find(|(o, _)| *o == op),
            Some(&(op, JournalSlot::Damaged)),
            "op {op} may have been acknowledged: damaged, never absent"
        );
    }
}

/// The shell simulator's seed 2010 with damage at rest: a member's log lost the
/// segment after its prune point's end while the journal held two registers (no
/// batch) above that point. The open let the log stay short, and the next batch found
/// the log ending elsewhere than its journal said (`Misplaced`): the shard's groups
/// stopped for good. The log is copied up to the prune point's end from a peer, the
/// registers stay, and the next batch goes where it belongs.
#[test]
fn a_log_short_of_its_prune_point_behind_registers_is_copied_back() {
    let ops = chain(6, 1, "a");
    let (_peer_dir, mut peer, end_6) = peer_holding(&ops);
    let above = registers_then_batches(&ops[5], 9, 9);
    let dir = tempfile::tempdir().unwrap();
    let lost_from = {
        let (mut journal, _) = open(dir.path());
        for p in ops.iter().chain(&above[..2]) {
            journal.write_prepare(p, 0).unwrap();
        }
        journal.sync().unwrap();
        journal.prune(6).unwrap();
        journal.sync().unwrap();
        assert_eq!(journal.index.pruned(), (6, Some(end_6)));
        peer.index.entry(4).and_then(|(_, base)| base).unwrap()
    };
    // Damage at rest took the log from op 4's batch on.
    PartitionLog::open_tagged(dir.path(), TAG, config(), 0)
        .unwrap()
        .truncate(lost_from)
        .unwrap();
    let (mut journal, recovered) = open(dir.path());
    assert_eq!(journal.tip(), 8, "the registers stay");
    assert_eq!(prepares(&recovered), above[..2].to_vec());
    assert_eq!(
        journal.behind(),
        Some(Transfer {
            op: 6,
            log_end: end_6,
            cursor: lost_from,
        }),
        "the log is copied up to the prune point's end"
    );
    copy_all(&mut journal, &mut peer, end_6);
    assert_eq!(journal.behind(), None);
    journal.write_prepare(&above[2], 0).unwrap();
    journal.sync().unwrap();
    assert_eq!(journal.tip(), 9);
    assert_eq!(
        journal.index.entry(9).and_then(|(_, base)| base),
        Some(end_6),
        "the next batch goes at the prune point's end"
    );
}

/// The shell simulator's seed 5743 with damage at rest: a member copying its log up
/// to a checkpoint asked peers that serve only below their own high watermark, and
/// the one holding every op had restarted untrusted (high watermark 0): the copy
/// waited for ever. A peer whose journal holds the checkpoint's op, chained down to its
/// prune point, holds the committed log up to that op's batch.
#[test]
fn a_journal_holding_a_checkpoints_op_holds_the_committed_log_through_it() {
    let ops = chain(10, 1, "a");
    let (_dir, peer, log_end) = peer_holding(&ops);
    let end_5 = peer.index.next_external(5).map(|(_, base)| base).unwrap();
    assert_eq!(
        peer.committed_through(5, ops[4].header.checksum),
        Some(end_5)
    );
    assert_eq!(
        peer.committed_through(10, ops[9].header.checksum),
        Some(log_end)
    );
    assert_eq!(peer.committed_through(5, ops[3].header.checksum), None);
    assert_eq!(peer.committed_through(11, 0), None, "past the tip");
    // Another history's op 5: not this chain's.
    let other = chain(10, 2, "b");
    assert_eq!(peer.committed_through(5, other[4].header.checksum), None);
}

/// A tail cut from the log never makes a member untrusted: cut bytes no op names (a
/// state transfer's unsynced batches, a torn append) hide nothing (the shell
/// simulator's seed 7707 with damage at rest: a member restarted untrusted for a
/// copy's lost batches, and with another untrusted member the view change waited for
/// ever); a reported op's header has a durable sync marker after it, so its batch cut
/// reads as damaged; and an op whose header no marker covers was never reported, its
/// batch cut with it (seed 24 with syncs off the shard's turn: every member untrusted
/// so, and the view change waited for ever).
#[test]
fn a_log_tail_cut_hides_nothing_and_a_reported_batch_it_took_is_damaged() {
    let ops = chain(4, 1, "a");
    let member = member_config();
    let segment = |dir: &Path| dir.join(format!("{:020}.log", 0));

    // Bytes no op names at the log's end (an append a power loss tore).
    let (dir, journal, _) = peer_holding(&ops);
    drop(journal);
    let mut file = std::fs::OpenOptions::new()
        .append(true)
        .open(segment(dir.path()))
        .unwrap();
    std::io::Write::write_all(&mut file, &[0x5a; 40]).unwrap();
    drop(file);
    let (mut journal, recovered) =
        PartitionJournal::open(dir.path(), GROUP, TAG, member, 0).unwrap();
    assert!(
        journal.log().recovery().bytes_truncated > 0,
        "the tail was cut"
    );
    assert!(recovered.damage.is_none());
    assert!(!recovered.tail_cut, "the cut hid no batch an op names");
    drop(journal);

    // The last op's batch damaged at rest: its header's marker says it was synced.
    let damage_last_batch = |dir: &Path| {
        let mut bytes = std::fs::read(segment(dir)).unwrap();
        let last = bytes.len() - 3;
        bytes[last] ^= 0x01;
        std::fs::write(segment(dir), &bytes).unwrap();
    };
    let (dir, journal, _) = peer_holding(&ops);
    drop(journal);
    damage_last_batch(dir.path());
    let (_, recovered) = PartitionJournal::open(dir.path(), GROUP, TAG, member, 0).unwrap();
    assert!(!recovered.tail_cut);
    assert_eq!(
        recovered.slots.last(),
        Some(&(4, JournalSlot::Damaged)),
        "a reported batch the cut took is damaged, never absent"
    );

    // No marker after the header, and the head not rewritten with it (its sync never
    // finished): never reported.
    let (dir, journal, _) = peer_holding(&ops);
    drop(journal);
    let path = dir.path().join(JOURNAL_FILE);
    let mut bytes = std::fs::read(&path).unwrap();
    let marker = 4 + 4 + 1 + 16;
    bytes.truncate(bytes.len() - marker);
    let fresh = fresh_journal();
    bytes[..fresh.len()].copy_from_slice(&fresh);
    std::fs::write(&path, &bytes).unwrap();
    damage_last_batch(dir.path());
    let (_, recovered) = PartitionJournal::open(dir.path(), GROUP, TAG, member, 0).unwrap();
    assert!(!recovered.tail_cut, "trusted");
    assert_eq!(
        recovered
            .slots
            .iter()
            .map(|(op, _)| *op)
            .collect::<Vec<_>>(),
        [1, 2, 3],
        "op 4 was never reported: cut with its batch"
    );
}

/// A new view's log repaired from the top down: its ops above the tip wait for their
/// batches with their headers written; replacing an older view's entry below them cuts
/// the log back, and must not take those headers (the shell simulator's seed 15843
/// with damage at rest: after a power loss the member, trusted, voted its log view's
/// log ended below its known commit).
#[test]
fn replacing_an_old_views_entry_keeps_the_new_logs_headers_above_it() {
    let dir = tempfile::tempdir().unwrap();
    let old = chain(10, 1, "a");
    let mut journal = holding(dir.path(), &old);
    // View 2's log differs from op 6 on.
    let mut parent = old[4].header.checksum;
    let new: Vec<Prepare> = (6..=12)
        .map(|op| {
            let p = prepare(
                op,
                2,
                parent,
                Operation::Request,
                batch(&format!("b{op}"), 2),
            );
            parent = p.header.checksum;
            p
        })
        .collect();
    let at = |op: u64| &new[(op - 6) as usize];
    for op in [12, 11, 10] {
        journal.write_prepare(at(op), 0).unwrap();
    }
    journal.sync().unwrap();
    drop(journal);
    let (mut journal, recovered) = open(dir.path());
    for op in [10, 11, 12] {
        let slot = recovered
            .slots
            .iter()
            .find(|(o, _)| *o == op)
            .map(|(_, s)| s);
        assert_eq!(
            slot,
            Some(&JournalSlot::Header(at(op).header)),
            "op {op} of the new log"
        );
    }
    // The repair goes on after the restart and ends with the new log whole.
    for op in (6..=12).rev() {
        journal.write_prepare(at(op), 0).unwrap();
    }
    journal.sync().unwrap();
    let mut expected: Vec<Prepare> = old[..5].to_vec();
    expected.extend(new.iter().cloned());
    assert_eq!(log_batches(&mut journal), batch_bodies(&expected));
    drop(journal);
    let (_, recovered) = open(dir.path());
    assert_eq!(prepares(&recovered), expected);
}

/// A copy that cuts the log keeps a header held alone above the checkpoint as a
/// header: its body was never written here, so never acknowledged. Made damaged, the
/// op could never be dropped (the shell simulator's seed 15843 with damage at rest).
#[test]
fn a_copy_keeps_headers_held_alone_above_its_checkpoint() {
    let ops = chain(30, 2, "a");
    let (_peer_dir, mut peer, _) = peer_holding(&ops);
    let dir = tempfile::tempdir().unwrap();
    let (mut journal, _) = open(dir.path());
    for p in divergent(&ops) {
        journal.write_prepare(&p, 0).unwrap();
    }
    for p in &ops[24..27] {
        journal.write_header(&p.header).unwrap();
    }
    journal.sync().unwrap();
    let end_20 = peer.index.entry(21).and_then(|(_, base)| base).unwrap();
    journal
        .checkpointed(20, ops[19].header.checksum, end_20, 0)
        .unwrap();
    copy_all(&mut journal, &mut peer, end_20);
    assert_eq!(journal.behind(), None, "the copy finished");
    journal.sync().unwrap();
    drop(journal);
    let (_, recovered) = open(dir.path());
    for p in &ops[24..27] {
        let op = p.header.op;
        let slot = recovered
            .slots
            .iter()
            .find(|(o, _)| *o == op)
            .map(|(_, s)| s);
        assert_eq!(slot, Some(&JournalSlot::Header(p.header)), "op {op}");
    }
}

/// The log's first batch damaged under registers alone (nothing pruned): the log is
/// cut back to where that batch was, and its repair goes in at its place (the shell
/// simulator's seed 20558 with damage at rest: the repaired batch went in after the
/// old ones, and the partition stopped).
#[test]
fn a_damaged_first_batch_above_registers_is_repaired_at_its_place() {
    let dir = tempfile::tempdir().unwrap();
    let ops = chain(5, 1, "a");
    {
        let mut journal = holding(dir.path(), &ops);
        assert_eq!(journal.index.entry(2).and_then(|(_, b)| b), Some(0));
        // Sealed, so opening does not scan it: the journal finds the damage.
        journal.log().roll(0).unwrap();
    }
    // Op 2's batch, at offset 0, damaged at rest: a byte of its records flipped.
    // (The repairs below go in at their place only if the log is cut back to it.)
    let segment = dir.path().join(format!("{:020}.log", 0));
    let mut bytes = std::fs::read(&segment).unwrap();
    bytes[70] ^= 0x40;
    std::fs::write(&segment, &bytes).unwrap();
    let (mut journal, recovered) = open(dir.path());
    assert!(recovered.damage.is_some());
    assert_eq!(journal.tip(), 1);
    assert_eq!(
        journal.log().next_offset(),
        0,
        "the log is cut back to op 2's batch"
    );
    for p in &ops[1..] {
        journal.write_prepare(p, 0).unwrap();
    }
    journal.sync().unwrap();
    assert_eq!(journal.tip(), 5);
    assert_eq!(journal.index.entry(2).and_then(|(_, b)| b), Some(0));
    assert_eq!(log_batches(&mut journal), batch_bodies(&ops));
}

/// The shell simulator's seed 2697 (damage at rest, four times the faults): a copy
/// found its first batch differing from the peer's and cut the log there, but the
/// cut had to walk through the segment's first page, zeroed, and the member stopped
/// its partitions ("unsupported batch magic 0"). The cut goes to the segment's start
/// instead, and says so: the copy takes the rest again from there.
#[test]
fn a_cut_through_damage_goes_to_its_segments_start() {
    let dir = tempfile::tempdir().unwrap();
    let small = LogConfig {
        segment_bytes_max: 1_024,
        ..member_config()
    };
    let ops = chain(24, 1, "a");
    {
        let (mut journal, _) = PartitionJournal::open(dir.path(), GROUP, TAG, small, 0).unwrap();
        for p in &ops {
            journal.write_prepare(p, 0).unwrap();
        }
        journal.sync().unwrap();
        journal.close().unwrap();
    }
    let (mut journal, _) = PartitionJournal::open(dir.path(), GROUP, TAG, small, 0).unwrap();
    let end = journal.log().next_offset();
    // A sealed segment past the first: its first page zeroed, and a cut inside it.
    let base = journal.log().segment_base(end - 1);
    let sealed = journal.log().segment_base(base - 1);
    assert!(sealed > 0, "a sealed segment after the first");
    let path = dir.path().join(format!("{sealed:020}.log"));
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[..64].fill(0);
    std::fs::write(&path, &bytes).unwrap();
    let inside = (sealed + 1..base)
        .find(|o| {
            journal
                .index
                .first_external_from(*o)
                .is_some_and(|op| journal.index.entry(op).and_then(|(_, b)| b) == Some(*o))
        })
        .expect("a batch boundary inside the damaged segment");
    assert_eq!(journal.cut_log_at(inside).unwrap(), sealed);
    assert_eq!(journal.log().next_offset(), sealed);
    assert!(
        journal.index.first_external_from(sealed).is_none(),
        "no entry names a batch past the cut"
    );
}

/// The shell simulator's seed 613 with syncs off the shard's turn: a power loss took
/// every header record that named a batch (a torn tail), the batches stayed in the
/// log, and the next batch went in after them, at offsets its op did not take (a
/// member then served another record at an acknowledged offset). With no op naming a
/// batch and nothing pruned, no batch of the log is known to be where it was: none
/// was reported, and the log is cut back to its start.
#[test]
fn a_log_whose_batches_no_record_names_is_cut_back_to_its_start() {
    let ops = chain(3, 1, "a");
    let dir = tempfile::tempdir().unwrap();
    drop(holding(dir.path(), &ops));
    let path = dir.path().join(JOURNAL_FILE);
    let bytes = std::fs::read(&path).unwrap();
    std::fs::write(&path, &bytes[..8]).unwrap();
    let (mut journal, recovered) =
        PartitionJournal::open(dir.path(), GROUP, TAG, member_config(), 0).unwrap();
    assert!(recovered.slots.is_empty());
    assert_eq!(
        journal.log().next_offset(),
        journal.log().start_offset(),
        "the unnamed batches are cut"
    );
}

/// The shell simulator's seed 23612: a member's view's headers were written alone and
/// made durable before its log view; their bodies then came and were appended, and the
/// appends' records reached the disk with no marker after them while their batches did
/// not. Its open took the unmarked records as never reported and cut them, and with
/// them the headers they had replaced: its vote of that log view said its log ended
/// below ops a quorum had acknowledged, and offset 187 went to two records. The open
/// now falls back to the durable headers.
#[test]
fn an_open_keeps_the_durable_headers_that_unmarked_records_replaced() {
    let ops = chain(6, 1, "a");
    let dir = tempfile::tempdir().unwrap();
    let segment = dir.path().join(format!("{:020}.log", 0));
    let synced_log = {
        let (mut journal, _) = open(dir.path());
        for p in &ops[..3] {
            journal.write_prepare(p, 0).unwrap();
        }
        journal.sync().unwrap();
        // A view's headers, alone, durable before the log view that names them.
        for p in &ops[3..] {
            journal.write_header(&p.header).unwrap();
        }
        journal.sync().unwrap();
        let synced_log = std::fs::metadata(&segment).unwrap().len();
        // Their bodies come and are appended; no sync follows.
        for p in &ops[3..] {
            journal.write_prepare(p, 0).unwrap();
        }
        synced_log
    };
    // The power loss: the journal's new records reached the disk, the batches did not.
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(&segment)
        .unwrap();
    file.set_len(synced_log).unwrap();
    let (journal, recovered) = open(dir.path());
    assert_eq!(journal.tip(), 3);
    for p in &ops[3..] {
        assert!(
            recovered
                .slots
                .contains(&(p.header.op, JournalSlot::Header(p.header))),
            "op {} is known by its header: {:?}",
            p.header.op,
            recovered.slots.iter().map(|(op, _)| op).collect::<Vec<_>>()
        );
    }
    // And it stays so at the next open.
    drop(journal);
    let (_, recovered) = open(dir.path());
    for p in &ops[3..] {
        assert!(recovered
            .slots
            .contains(&(p.header.op, JournalSlot::Header(p.header))));
    }
}
