//! The journal found untrusted at open (lost, unreadable, a cut tail that may hide a
//! reported op) stays untrusted until its group's durable state says so.

use super::*;

/// The shell simulator's seed 90 (damage at rest, four times the faults): a member's
/// open moved an unreadable `vsr.journal` aside and made a new one, and a power loss
/// came before the group's state said "untrusted". The next open found a whole, empty
/// journal and the member restarted trusted; its vote dropped committed ops and an
/// acknowledged offset went to another record. An open that finds the journal
/// untrusted (lost, unreadable, a tail cut that may hide) leaves a mark first, so every
/// later open says the same until the host has made the distrust durable.
#[test]
fn an_untrusted_open_says_so_again_until_the_distrust_is_durable() {
    let ops = chain(5, 1, "a");
    let member = member_config();
    for lose in ["delete", "zero", "tear"] {
        let (dir, _, _) = peer_holding(&ops);
        let path = dir.path().join(JOURNAL_FILE);
        let mark = dir.path().join(super::super::open::UNTRUSTED_MARKER);
        match lose {
            "delete" => std::fs::remove_file(&path).unwrap(),
            "zero" => {
                let len = std::fs::metadata(&path).unwrap().len();
                std::fs::write(&path, vec![0u8; len as usize]).unwrap();
            }
            _ => {
                // A torn record at the end: a cut tail that may hide an op.
                let mut bytes = std::fs::read(&path).unwrap();
                tear_over_a_marker(&mut bytes);
                std::fs::write(&path, &bytes).unwrap();
            }
        }
        let (_, recovered) = PartitionJournal::open(dir.path(), GROUP, TAG, member, 0).unwrap();
        assert!(recovered.tail_cut, "{lose}: untrusted");
        assert!(mark.exists(), "{lose}: marked");
        // A power loss now: the open's repairs are on disk, the group's state is not.
        let (mut journal, recovered) =
            PartitionJournal::open(dir.path(), GROUP, TAG, member, 0).unwrap();
        assert!(
            recovered.tail_cut,
            "{lose}: still untrusted after the repair"
        );
        journal.distrust_persisted().unwrap();
        assert!(
            !mark.exists(),
            "{lose}: the mark goes once the state holds it"
        );
        drop(journal);
        let (_, recovered) = PartitionJournal::open(dir.path(), GROUP, TAG, member, 0).unwrap();
        assert!(!recovered.tail_cut, "{lose}: the state speaks from now on");
    }
}

/// The shell simulator's seed 2242 (five members, damage at four times the faults):
/// a member's log lost its batches to damage and then its `vsr.journal` was zeroed. An
/// unreadable journal counted as lost only while the log held batches, so the member
/// restarted trusted with nothing, and its vote helped drop committed ops (offset 10
/// acknowledged twice). Unreadable is untrusted whatever the log holds.
#[test]
fn an_unreadable_journal_is_untrusted_even_with_an_empty_log() {
    let ops = chain(5, 1, "a");
    let (dir, _, _) = peer_holding(&ops);
    let path = dir.path().join(JOURNAL_FILE);
    let len = std::fs::metadata(&path).unwrap().len();
    std::fs::write(&path, vec![0u8; len as usize]).unwrap();
    for entry in std::fs::read_dir(dir.path()).unwrap() {
        let file = entry.unwrap().path();
        if file.extension().is_some_and(|e| e == "log") {
            std::fs::write(&file, b"").unwrap();
        }
    }
    let (_, recovered) =
        PartitionJournal::open(dir.path(), GROUP, TAG, member_config(), 0).unwrap();
    assert!(recovered.tail_cut, "untrusted");
    assert!(recovered.damage.is_some(), "reported as damage");
}

/// The mark comes before the repair that hides the distrust: a torn tail that may hide
/// a synced record is cut only once the mark and its directory entry are synced, so a
/// power loss between the two cannot leave a journal that looks whole (the shell
/// simulator crashes between ticks, never inside an open, so this order is checked
/// here, on the disk operations' trace).
#[test]
fn the_untrusted_mark_is_durable_before_a_torn_tail_is_cut() {
    use braid_storage::disk::hook::{self, Event};
    let ops = chain(5, 1, "a");
    let (dir, _, _) = peer_holding(&ops);
    let path = dir.path().join(JOURNAL_FILE);
    let mut bytes = std::fs::read(&path).unwrap();
    tear_over_a_marker(&mut bytes);
    std::fs::write(&path, &bytes).unwrap();
    hook::start_tracing();
    let opened = PartitionJournal::open(dir.path(), GROUP, TAG, member_config(), 0);
    let trace = hook::take().expect("traced").trace;
    let (_, recovered) = opened.unwrap();
    assert!(recovered.tail_cut);
    let mark = dir.path().join(super::super::open::UNTRUSTED_MARKER);
    let at = |found: &dyn Fn(&Event) -> bool| trace.iter().position(found);
    let marked =
        at(&|e| matches!(e, Event::Create { path } if *path == mark)).expect("the mark is made");
    let dir_synced = trace
        .iter()
        .skip(marked)
        .position(|e| matches!(e, Event::DirSync { dir: d } if d == dir.path()))
        .map(|i| i + marked)
        .expect("its directory synced");
    let cut =
        at(&|e| matches!(e, Event::SetLen { path: p, .. } if *p == path)).expect("the tail is cut");
    assert!(
        dir_synced < cut,
        "the mark is durable before the cut: {trace:?}"
    );
    // Two reasons to mark (the torn tail, then the tail cut it reports), one mark.
    let mark_syncs = trace
        .iter()
        .filter(|e| matches!(e, Event::Sync { path } if *path == mark))
        .count();
    assert_eq!(mark_syncs, 1, "one open marks once: {trace:?}");
}

/// The shell simulator's seed 26717 with damage (and 3429, five members): a copy ran
/// to op 30's checkpoint, and the core pruned at op 5 meanwhile. The journal's entries
/// there were never shown committed (an old view's, perhaps), yet the prune recorded
/// their end as where the log ends after op 5; the committed log had a batch across
/// that offset, and after a `kill -9` the open's cut at it refused the partition. A
/// prune during a copy records no end its entries alone give above the log's known
/// committed end: the checkpoint restarts the copy instead.
#[test]
fn a_prune_during_a_copy_records_no_end_from_entries_never_shown_committed() {
    let ops = chain(10, 1, "a");
    let dir = tempfile::tempdir().unwrap();
    let mut journal = holding(dir.path(), &ops);
    assert_eq!(journal.applied_end(), 0, "nothing shown committed");
    journal.checkpointed(30, 7, 500, 0).unwrap();
    assert!(journal.behind().is_some(), "a copy runs to op 30");
    journal.prune(5).unwrap();
    assert_eq!(
        journal.index.pruned(),
        (5, None),
        "op 5's end is not known from the committed log"
    );
    drop(journal);
    let (mut journal, _) = open(dir.path());
    assert!(
        journal.log().next_offset() > 0,
        "nothing cut on that entry's word"
    );
}

/// A lone replica's `vsr.journal` cut short below what its head says was made durable
/// (a truncated file): refused before anything is cut, the log's batches and the
/// journal's bytes left as they were for a restore. (An outside review of issue 24: the
/// open cut the journal's tail, then the log to match it, leaving an empty log where
/// 200 acknowledged records had been, and the group waited in a view change for ever.)
#[test]
fn a_lone_journal_cut_below_its_durable_end_is_refused_before_anything_is_cut() {
    let dir = tempfile::tempdir().unwrap();
    let ops = chain(6, 1, "a");
    {
        let (mut journal, _) = PartitionJournal::open(dir.path(), GROUP, TAG, config(), 0).unwrap();
        for p in &ops {
            journal.write_prepare(p, 0).unwrap();
        }
        journal.sync().unwrap();
        journal.close().unwrap();
    }
    let path = dir.path().join(JOURNAL_FILE);
    let len = std::fs::metadata(&path).unwrap().len();
    let cut = len / 2;
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(cut)
        .unwrap();
    let log_file = dir.path().join(format!("{:020}.log", 0));
    let log_bytes = std::fs::read(&log_file).unwrap();
    match PartitionJournal::open(dir.path(), GROUP, TAG, config(), 0) {
        Err(PartitionJournalError::Journal(JournalError::DurableTailLost { .. })) => {}
        other => panic!("expected a refusal, got {:?}", other.map(|(_, r)| r)),
    }
    assert_eq!(
        std::fs::read(&log_file).unwrap(),
        log_bytes,
        "the log is untouched"
    );
    assert_eq!(
        std::fs::metadata(&path).unwrap().len(),
        cut,
        "the journal too"
    );
}

/// A lone replica's `vsr.journal` cut below the 64 bytes it is created with, while its
/// log holds batches: gone, never a creation torn short to make anew (an outside review
/// of issue 24: cut to 0 or 8 bytes, a single node restarted the partition empty, cut
/// its log to match and gave the acknowledged offsets to new records). And a journal
/// damaged after a process kill (no clean close): each refusing open leaves every file
/// as it found it (the same review saw a sync marker appended at every start).
#[test]
fn a_lone_journal_cut_below_its_beginning_or_damaged_after_a_kill_is_refused_untouched() {
    for damage in ["cut to 0", "cut to 8", "flipped after a kill"] {
        let dir = tempfile::tempdir().unwrap();
        let ops = chain(6, 1, "a");
        {
            let (mut journal, _) =
                PartitionJournal::open(dir.path(), GROUP, TAG, config(), 0).unwrap();
            for p in &ops {
                journal.write_prepare(p, 0).unwrap();
            }
            journal.sync().unwrap();
            if damage.starts_with("cut") {
                journal.close().unwrap();
            } // else dropped: no clean close, as after `kill -9`
        }
        let path = dir.path().join(JOURNAL_FILE);
        let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        match damage {
            "cut to 0" => file.set_len(0).unwrap(),
            "cut to 8" => file.set_len(8).unwrap(),
            _ => {
                drop(file);
                let mut bytes = std::fs::read(&path).unwrap();
                let at = bytes.len() / 2;
                bytes[at] ^= 0x08;
                std::fs::write(&path, bytes).unwrap();
            }
        }
        let log_file = dir.path().join(format!("{:020}.log", 0));
        let before = (
            std::fs::read(&path).unwrap(),
            std::fs::read(&log_file).unwrap(),
        );
        for _start in 0..2 {
            match PartitionJournal::open(dir.path(), GROUP, TAG, config(), 0) {
                Err(PartitionJournalError::JournalLost { .. }) if damage.starts_with("cut") => {}
                Ok((_, recovered)) if !damage.starts_with("cut") => {
                    assert!(recovered.damage.is_some(), "{damage}: damage reported");
                }
                other => panic!("{damage}: got {:?}", other.map(|(_, r)| r.damage)),
            }
            let after = (
                std::fs::read(&path).unwrap(),
                std::fs::read(&log_file).unwrap(),
            );
            assert!(after == before, "{damage}: the files were changed");
        }
    }
}
