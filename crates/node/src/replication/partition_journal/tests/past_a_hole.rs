//! Ops past a hole at open: a batch of the log found damaged or lost cuts the log
//! there, and what lies after it is kept whole or reported damaged, never absent.

use super::*;

/// The length of `vsr.journal` in `dir` without its last sync marker (a record of 25
/// bytes, appended after the sync it reports, so a power loss may take it).
fn without_last_marker(dir: &Path) {
    let path = dir.join(JOURNAL_FILE);
    let len = std::fs::metadata(&path).unwrap().len();
    let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    file.set_len(len - 25).unwrap();
}

/// Flips a bit inside op `op`'s batch in the first segment of `dir` (op 1 of
/// [`chain`] is a register: op 2's batch is the log's first).
fn flip_a_bit_of(dir: &Path, ops: &[Prepare], op: u64) {
    let segment = dir.join(format!("{:020}.log", 0));
    let mut bytes = std::fs::read(&segment).unwrap();
    let before: usize = ops[1..op as usize - 1].iter().map(|p| p.body.len()).sum();
    bytes[before + 70] ^= 0x10;
    std::fs::write(&segment, bytes).unwrap();
}

fn slot_of(recovered: &Recovered, op: u64) -> Option<JournalSlot> {
    recovered
        .slots
        .iter()
        .find(|(o, _)| *o == op)
        .map(|(_, s)| s.clone())
}

fn damaged(recovered: &Recovered) -> Vec<u64> {
    recovered
        .slots
        .iter()
        .filter(|(_, s)| *s == JournalSlot::Damaged)
        .map(|(op, _)| *op)
        .collect()
}

/// A register kept whole that lies past a hole stays whole; once the hole is repaired
/// the tip moves over it without its being written again (seed 94 of the shell
/// simulator: the replica, which read it back whole, never sends it again).
#[test]
fn a_register_past_a_hole_stays_whole_and_the_tip_moves_over_it_after_the_repair() {
    let dir = tempfile::tempdir().unwrap();
    let mut ops = chain(5, 1, "a");
    let register = prepare(
        6,
        1,
        ops[4].header.checksum,
        Operation::Register,
        7u64.to_be_bytes().to_vec(),
    );
    ops.push(register.clone());
    {
        let (mut journal, _) = open(dir.path());
        for p in &ops {
            journal.write_prepare(p, 0).unwrap();
        }
        journal.sync().unwrap();
        // The log loses op 3's synced batch and all after it.
        let base = journal.index.entry(3).and_then(|(_, b)| b).unwrap();
        journal.log().truncate(base).unwrap();
    }
    let (mut journal, recovered) = open(dir.path());
    assert_eq!(
        slot_of(&recovered, 3),
        Some(JournalSlot::Damaged),
        "synced and lost"
    );
    assert_eq!(
        slot_of(&recovered, 5),
        Some(JournalSlot::Damaged),
        "lost past the hole"
    );
    assert_eq!(
        slot_of(&recovered, 6),
        Some(JournalSlot::Prepare(register)),
        "kept whole past the hole"
    );
    for p in &ops[2..5] {
        journal.write_prepare(p, 0).unwrap();
    }
    journal.sync().unwrap();
    assert_eq!(
        journal.tip(),
        6,
        "the repairs went in and the tip moved over op 6"
    );
    assert_eq!(log_batches(&mut journal), batch_bodies(&ops));
}

/// The shell simulator's seed 4523 with damage at rest: a bit flipped in a member's
/// batch; its open reported that op and every op after it damaged and cut the log at
/// the damaged batch, but left their entries as they were. A power loss then took the
/// sync marker written after the open's sync, so at the next open the entries past the
/// log's end read as written and never synced, and were cut as never reported: absent
/// in a trusted journal, acknowledged offset 177 went to another record. Damage found
/// at open is written as damage, and the intact batches past it are written whole.
#[test]
fn damage_found_at_open_stays_damage_when_a_power_loss_takes_the_sync_marker() {
    let ops = chain(10, 1, "a");
    let dir = tempfile::tempdir().unwrap();
    let base_6 = {
        let (mut journal, _) = open(dir.path());
        for p in &ops {
            journal.write_prepare(p, 0).unwrap();
        }
        let base_6 = journal.index.entry(6).and_then(|(_, base)| base).unwrap();
        // Synced and closed cleanly (the log's next open trusts it without a scan);
        // the marker after the sync is lost.
        journal.close().unwrap();
        base_6
    };
    without_last_marker(dir.path());
    flip_a_bit_of(dir.path(), &ops, 6);
    let (mut journal, recovered) = open(dir.path());
    assert_eq!(damaged(&recovered), vec![6]);
    assert_eq!(
        prepares(&recovered)[5..],
        ops[6..],
        "ops 7 to 10 kept whole"
    );
    assert_eq!(journal.log().next_offset(), base_6, "cut at the damage");
    drop(journal);
    without_last_marker(dir.path());
    let (_, recovered) = open(dir.path());
    assert_eq!(
        damaged(&recovered),
        vec![6],
        "acknowledged ops are damaged or whole, never absent"
    );
    assert_eq!(prepares(&recovered)[5..], ops[6..]);
}

/// The shell simulator's seed 27835 with damage at rest: a bit flipped in an early
/// committed batch of the member that alone held a view's newest ops; its open cut the
/// log at that batch, and with it every intact batch after it, and no member held those
/// ops any more: the view change waited for ever. The intact batches past the damage
/// are kept whole in `vsr.journal` across restarts, and once the damaged op is
/// repaired they go back into the log at the offsets their ops take on every replica.
#[test]
fn intact_batches_past_a_damaged_one_are_kept_and_go_back_at_their_offsets() {
    let ops = chain(10, 1, "a");
    let dir = tempfile::tempdir().unwrap();
    {
        let (mut journal, _) = open(dir.path());
        for p in &ops {
            journal.write_prepare(p, 0).unwrap();
        }
        journal.close().unwrap();
    }
    flip_a_bit_of(dir.path(), &ops, 3);
    let (journal, recovered) = open(dir.path());
    assert_eq!(damaged(&recovered), vec![3]);
    assert_eq!(
        prepares(&recovered)[2..],
        ops[3..],
        "ops 4 to 10 kept whole"
    );
    assert_eq!(journal.tip(), 2);
    drop(journal);
    // Restarted before any repair: still kept.
    let (mut journal, recovered) = open(dir.path());
    assert_eq!(damaged(&recovered), vec![3]);
    assert_eq!(prepares(&recovered)[2..], ops[3..]);
    // A peer's copy of op 3: the rest follows it into the log, unwritten by the
    // replica (it holds them), at their offsets.
    journal.write_prepare(&ops[2], 0).unwrap();
    journal.sync().unwrap();
    assert_eq!(journal.tip(), 10);
    let (_peer_dir, mut peer, _) = peer_holding(&ops);
    assert_eq!(log_batches(&mut journal), log_batches(&mut peer));
    for op in 2..=10 {
        assert_eq!(
            journal.index.entry(op).and_then(|(_, base)| base),
            peer.index.entry(op).and_then(|(_, base)| base),
            "op {op}'s batch is where the peer's is"
        );
    }
    drop(journal);
    let (_, recovered) = open(dir.path());
    assert_eq!(damaged(&recovered), Vec::<u64>::new());
    assert_eq!(prepares(&recovered), ops);
}

/// A batch kept whole that directly follows the tip at open (the log was cut at its
/// base: the shell simulator's seed 7172 with damage at four times the faults, a zeroed
/// page at a segment's start) is not in the log: the open puts it there, at its
/// offsets, instead of counting it in the tip (which left the member's high watermark
/// stuck at the cut).
#[test]
fn a_batch_kept_whole_right_after_the_tip_goes_into_the_log_at_open() {
    let ops = chain(8, 1, "a");
    let dir = tempfile::tempdir().unwrap();
    {
        let (mut journal, _) = open(dir.path());
        for p in &ops[..6] {
            journal.write_prepare(p, 0).unwrap();
        }
        journal.sync().unwrap();
        // Ops 7 and 8 as an open that cut the log beneath them leaves them.
        for p in &ops[6..] {
            journal.index.write_prepare(p).unwrap();
        }
        journal.index.sync().unwrap();
    }
    let (mut journal, recovered) = open(dir.path());
    assert_eq!(prepares(&recovered), ops);
    assert_eq!(journal.tip(), 8);
    let (_peer_dir, mut peer, _) = peer_holding(&ops);
    assert_eq!(log_batches(&mut journal), log_batches(&mut peer));
    assert_eq!(
        journal.index.entry(8).and_then(|(_, base)| base),
        peer.index.entry(8).and_then(|(_, base)| base)
    );
}

/// The shell simulator's seed 369042 (everything at once): a member's open found op
/// 11's batch damaged and kept the intact ones after it whole. Op 11 was repaired, and
/// it and the kept ops went back into the log; in the same turn a view's header was
/// written, and the sync that made it durable ahead of the member's state (one that
/// does not wait for the log's) made the records naming the new batches durable too.
/// A power loss took the batches: the next open read the ops as written but never
/// synced, so never reported, and the member voted that it never had five committed
/// ops, which a view change dropped (offset 36 acknowledged twice). A batch that
/// replaces a whole or damaged entry is durable before its record: after any crash
/// from that sync on, each such op is held whole (in the log or the journal) or
/// damaged, never a header alone.
#[test]
fn ops_that_go_back_into_the_log_are_never_read_as_unwritten_after_a_crash() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("p");
    let ops = chain(7, 1, "a");
    hook::start_tracing();
    {
        // As an open that found op 3's batch damaged leaves the journal: ops 4 to 6
        // kept whole, the log ending at op 2's batch.
        let (mut journal, _) = open(&dir);
        for p in &ops[..2] {
            journal.write_prepare(p, 0).unwrap();
        }
        journal.sync().unwrap();
        journal.index.write_damaged(3).unwrap();
        for p in &ops[3..6] {
            journal.index.write_prepare(p).unwrap();
        }
        journal.index.sync().unwrap();
    }
    let synced_at;
    {
        let (mut journal, recovered) = open(&dir);
        assert_eq!(damaged(&recovered), vec![3]);
        assert_eq!(journal.tip(), 2);
        journal.sync_off_thread();
        // A peer's copy of op 3: it and the kept ops go into the log. Op 7 comes as a
        // view's header, made durable in the turn.
        journal.write_prepare(&ops[2], 0).unwrap();
        assert_eq!(journal.tip(), 6);
        journal.write_header(&ops[6].header).unwrap();
        assert!(journal.sync().unwrap().is_empty(), "reported off the shard");
        synced_at = hook::trace_len();
    }
    let checked =
        each_crash_state_after(root.path(), synced_at, member_config(), |cut, recovered| {
            for op in 3..=6 {
                match slot_of(&recovered, op) {
                    Some(JournalSlot::Damaged) => {}
                    Some(JournalSlot::Prepare(p)) => {
                        assert_eq!(p, ops[op as usize - 1], "{cut}: op {op}");
                    }
                    other => panic!("{cut}: op {op}, written before, reads as {other:?}"),
                }
            }
        });
    assert!(checked >= 1, "{checked} crash states");
}
