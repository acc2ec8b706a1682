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
