//! Copies from peers that a crash interrupts.

use super::*;

/// A copy whose start the peers' retention deleted starts the log again at theirs,
/// and the entries naming the batches below it (ops the checkpoint covers) go with
/// them: a crash before the copy ends opens to a journal with nothing damaged and
/// nothing to distrust (the shell simulator's seed 322172 at four times the faults:
/// the open took those entries for damage, the member lost its journal's trust, and
/// with its peer's prepares lost to damage at rest no view change could end).
#[test]
fn a_copy_started_again_at_the_peers_start_keeps_no_entry_below_it() {
    let ops = chain(30, 1, "a");
    let (_peer_dir, _peer, end) = peer_holding(&ops);
    let dir = tempfile::tempdir().unwrap();
    let mut journal = holding(dir.path(), &ops[..10]);
    for p in &ops[..10] {
        journal.applied(p.header.op, p.header.checksum);
    }
    let committed_end = journal.log().next_offset();
    journal
        .checkpointed(30, ops[29].header.checksum, end, 0)
        .unwrap();
    assert_eq!(
        journal.behind().map(|t| t.cursor),
        Some(committed_end),
        "the copy checks the log from where it is known committed"
    );
    // The peers' logs start past this one's end now.
    let peer_start = committed_end + 5;
    assert_eq!(
        journal
            .copy_chunk(committed_end, peer_start, &[], 0)
            .unwrap(),
        Copied::Progress
    );
    assert_eq!(journal.log().start_offset(), peer_start);
    drop(journal);

    let (mut journal, recovered) = open(dir.path());
    assert_eq!(recovered.damage, None, "nothing the open finds is damage");
    assert!(
        !recovered.tail_cut,
        "and nothing makes the journal untrusted"
    );
    assert!(
        !recovered.slots.iter().any(|(op, _)| (2..=10).contains(op)),
        "no entry names a batch below the log's start: {:?}",
        recovered.slots.iter().map(|(op, _)| op).collect::<Vec<_>>()
    );
    assert_eq!(journal.log().start_offset(), peer_start);
    // The checkpoint, found again, resumes the copy from the log's new start.
    journal
        .checkpointed(30, ops[29].header.checksum, end, 0)
        .unwrap();
    assert_eq!(journal.behind().map(|t| t.cursor), Some(peer_start));
}

/// The shell simulator's seed 335808 (everything at rest, four times the faults): a
/// member's log was damaged in the batch of an op above the registers that followed
/// its prune point, and the open's cut to that op's place, walking from the offset
/// index's entry before it into the damage, went to the segment's start. With
/// registers kept above the prune point, the open did not copy the log back up to that
/// point's end: the op's batch, repaired, went in at offset 0 instead of its own, and
/// the member's partitions stopped ("committed op 133 takes offsets from 304 on ... a
/// batch stored at 0"). A log cut below the prune point's end is copied back to it,
/// whatever registers follow.
#[test]
fn a_log_cut_below_its_prune_point_behind_registers_is_copied_back() {
    let ops = chain(6, 1, "a");
    let (_peer_dir, mut peer, end_6) = peer_holding(&ops);
    let above = registers_then_batches(&ops[5], 9, 10);
    // An index entry at every batch, as a long segment has one before each page: the
    // open's check of a closed log reads on from the newest entry only.
    let dense = LogConfig {
        index_interval_bytes: 1,
        ..member_config()
    };
    let dir = tempfile::tempdir().unwrap();
    {
        let (mut journal, _) = PartitionJournal::open(dir.path(), GROUP, TAG, dense, 0).unwrap();
        for p in ops.iter().chain(&above) {
            journal.write_prepare(p, 0).unwrap();
        }
        journal.sync().unwrap();
        journal.prune(6).unwrap();
        journal.sync().unwrap();
        assert_eq!(journal.index.pruned(), (6, Some(end_6)));
        assert_eq!(journal.index.entry(9).and_then(|(_, b)| b), Some(end_6));
        journal.close().unwrap();
    }
    // Damage at rest over op 9's batch header.
    let path = dir.path().join(format!("{:020}.log", 0));
    let mut bytes = std::fs::read(&path).unwrap();
    let op_9: usize = ops.iter().map(|p| p.body.len()).sum();
    bytes[op_9..op_9 + 16].fill(0);
    std::fs::write(&path, &bytes).unwrap();
    let (mut journal, recovered) =
        PartitionJournal::open(dir.path(), GROUP, TAG, dense, 0).unwrap();
    assert_eq!(
        recovered.slots.iter().find(|(op, _)| *op == 9),
        Some(&(9, JournalSlot::Damaged)),
        "op 9 is repaired from a peer"
    );
    assert_eq!(journal.log().next_offset(), 0, "cut at the segment's start");
    assert_eq!(
        journal.behind(),
        Some(Transfer {
            op: 6,
            log_end: end_6,
            cursor: 0,
        }),
        "the log is copied back up to the prune point's end"
    );
    copy_all(&mut journal, &mut peer, end_6);
    assert_eq!(journal.behind(), None);
    journal.write_prepare(&above[2], 0).unwrap();
    journal.sync().unwrap();
    assert_eq!(
        journal.index.entry(9).and_then(|(_, base)| base),
        Some(end_6),
        "the repaired batch goes at the prune point's end"
    );
}

/// A newer checkpoint that comes while a copy runs goes on from where the copy got to:
/// what it copied is a prefix of the committed log, which the newer checkpoint's log
/// extends. (Started again from what this replica had applied, a member that fell
/// behind under load copied the same few chunks after each of its peers' checkpoints
/// and caught up only long after the load stopped: the shell simulator's seed 337060
/// at four times the faults, whose copy restarted at offset 238 some sixty times.)
#[test]
fn a_newer_checkpoint_during_a_copy_goes_on_from_where_the_copy_got_to() {
    let ops = chain(30, 1, "a");
    let (_peer_dir, mut peer, end) = peer_holding(&ops);
    let end_20 = peer.index.next_external(20).map(|(_, base)| base).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (mut journal, _) = open(dir.path());
    journal
        .checkpointed(20, ops[19].header.checksum, end_20, 0)
        .unwrap();
    journal.prune(20).unwrap();
    let read = peer.log().read(0, 100, end_20).unwrap();
    assert_eq!(
        journal.copy_chunk(0, 0, read.bytes(), 0).unwrap(),
        Copied::Progress
    );
    let copied = journal.behind().map(|t| t.cursor).unwrap();
    assert!(copied > 0 && copied < end_20, "part of the copy is done");
    journal
        .checkpointed(30, ops[29].header.checksum, end, 0)
        .unwrap();
    assert_eq!(
        journal.behind(),
        Some(Transfer {
            op: 30,
            log_end: end,
            cursor: copied,
        }),
        "the copy goes on to the newer checkpoint from where it got to"
    );
    journal.prune(30).unwrap();
    copy_all(&mut journal, &mut peer, end);
    assert_eq!(journal.behind(), None);
    assert_eq!(log_batches(&mut journal), log_batches(&mut peer));
}
