use super::open::may_hide;
use super::*;
use braid_storage::disk::hook::{self, Plan};
use braid_vsr::{checksum, Operation};

/// The group of the tested journals (the metadata group's).
const GROUP: u64 = 0;

/// The prepare at `op` whose body is `body`, chained to `parent`.
fn prepare(op: u64, view: u64, parent: braid_vsr::Checksum, body: &[u8]) -> Prepare {
    let header = Header {
        group: 0,
        view,
        op,
        commit: op.saturating_sub(1),
        parent,
        body_checksum: checksum(body),
        session: 1,
        request: op,
        operation: Operation::Request,
        checksum: 0,
    }
    .seal();
    Prepare {
        header,
        body: body.to_vec().into(),
    }
}

/// A chain of prepares 1..=n in `view`.
fn chain(n: u64, view: u64) -> Vec<Prepare> {
    let mut parent = Header::root(0).checksum;
    (1..=n)
        .map(|op| {
            let p = prepare(op, view, parent, format!("op {op} view {view}").as_bytes());
            parent = p.header.checksum;
            p
        })
        .collect()
}

fn slot_ops(recovered: &Recovered) -> Vec<u64> {
    recovered.slots.iter().map(|(op, _)| *op).collect()
}

#[test]
fn writes_truncations_and_prunes_replay_to_the_same_slots() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("meta.journal");
    let (mut journal, recovered) = JournalFile::open(&path, GROUP).unwrap();
    assert!(recovered.slots.is_empty());
    let first = chain(6, 1);
    for p in &first {
        journal.write_prepare(p).unwrap();
    }
    journal.write_header(&chain(7, 1)[6].header).unwrap();
    // A new view replaces ops 5.. with its own.
    journal.truncate(4).unwrap();
    let replacement = prepare(5, 2, first[3].header.checksum, b"op 5 view 2");
    journal.write_prepare(&replacement).unwrap();
    journal.prune(2).unwrap();
    journal.sync().unwrap();
    assert!(journal.prepare(5, replacement.header.checksum).is_some());
    assert!(
        journal.prepare(5, first[4].header.checksum).is_none(),
        "the old op 5"
    );
    drop(journal);
    let (journal, recovered) = JournalFile::open(&path, GROUP).unwrap();
    assert_eq!(slot_ops(&recovered), [3, 4, 5]);
    assert_eq!(
        recovered.slots[2].1,
        JournalSlot::Prepare(replacement.clone())
    );
    assert_eq!(recovered.torn_tail_bytes, 0);
    assert!(journal.prepare(3, first[2].header.checksum).is_some());
}

#[test]
fn a_torn_tail_is_cut_and_damage_inside_marks_every_op_damaged_until_rewritten() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("meta.journal");
    let (mut journal, _) = JournalFile::open(&path, GROUP).unwrap();
    for p in chain(5, 1) {
        journal.write_prepare(&p).unwrap();
    }
    journal.sync().unwrap();
    drop(journal);
    let whole = std::fs::read(&path).unwrap();

    // A record cut short at the end (with the sync marker after it): a torn tail,
    // cut; the rest is whole.
    std::fs::write(&path, &whole[..whole.len() - SYNC_MARKER_BYTES - 7]).unwrap();
    let (_, recovered) = JournalFile::open(&path, GROUP).unwrap();
    assert_eq!(slot_ops(&recovered), [1, 2, 3, 4]);
    assert!(recovered.torn_tail_bytes > 0 && recovered.damaged_at.is_none());
    let (_, again) = JournalFile::open(&path, GROUP).unwrap();
    assert_eq!(again.torn_tail_bytes, 0, "the cut was made durable");

    // A bit flipped in the second record, intact records after it: every op above the
    // prune point is damaged, none absent, and stays so across restarts until written.
    let mut flipped = whole.clone();
    flipped[MAGIC.len() + 200] ^= 0x10;
    std::fs::write(&path, &flipped).unwrap();
    let (mut journal, recovered) = JournalFile::open(&path, GROUP).unwrap();
    assert!(recovered.damaged_at.is_some());
    assert_eq!(slot_ops(&recovered), [1, 2, 3, 4, 5]);
    assert!(recovered
        .slots
        .iter()
        .all(|(_, s)| *s == JournalSlot::Damaged));
    let repaired = chain(5, 1)[2].clone();
    journal.write_prepare(&repaired).unwrap();
    // A header alone written over a damaged slot does not make it read back as a
    // header: its lost body may have been acknowledged, and a header alone counts as
    // "never had it" in a view change (the shell simulator's seed 825, with damage at
    // rest, dropped an acknowledged op so).
    journal.write_header(&chain(5, 1)[3].header).unwrap();
    journal.sync().unwrap();
    drop(journal);
    let (_, recovered) = JournalFile::open(&path, GROUP).unwrap();
    assert!(
        recovered.damaged_at.is_none(),
        "the damage was rewritten away"
    );
    assert_eq!(slot_ops(&recovered), [1, 2, 3, 4, 5]);
    assert_eq!(recovered.slots[2].1, JournalSlot::Prepare(repaired));
    assert_eq!(recovered.slots[0].1, JournalSlot::Damaged);
    assert_eq!(
        recovered.slots[3].1,
        JournalSlot::Damaged,
        "a header alone never stands for a damaged slot"
    );

    std::fs::write(&path, b"not a journal at all").unwrap();
    assert!(matches!(
        JournalFile::open(&path, GROUP),
        Err(JournalError::NotAJournal { .. })
    ));
}

#[test]
fn a_large_journal_is_compacted_to_its_live_entries() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("meta.journal");
    let (mut journal, _) = JournalFile::open(&path, GROUP).unwrap();
    let body = vec![7u8; 64 * 1024];
    let mut parent = Header::root(0).checksum;
    for op in 1..=80u64 {
        let p = prepare(op, 1, parent, &body);
        parent = p.header.checksum;
        journal.write_prepare(&p).unwrap();
        if op % 8 == 0 {
            journal.prune(op - 4).unwrap();
            journal.sync().unwrap();
        }
    }
    journal.sync().unwrap();
    let len = std::fs::metadata(&path).unwrap().len();
    assert!(len < COMPACT_BYTES, "{len} bytes after compaction");
    drop(journal);
    let (_, recovered) = JournalFile::open(&path, GROUP).unwrap();
    assert_eq!(slot_ops(&recovered), [77, 78, 79, 80]);
}

/// One step of the crash workload.
#[derive(Debug, Clone)]
enum Step {
    Prepare(Prepare),
    Header(Header),
    Truncate(u64),
    Prune(u64),
    Sync,
}

fn workload() -> Vec<Step> {
    let first = chain(6, 1);
    let second = prepare(4, 2, first[2].header.checksum, b"op 4 view 2");
    let mut steps: Vec<Step> = first[..3].iter().cloned().map(Step::Prepare).collect();
    steps.push(Step::Sync);
    steps.extend(first[3..].iter().cloned().map(Step::Prepare));
    steps.push(Step::Header(chain(7, 1)[6].header));
    steps.push(Step::Sync);
    steps.push(Step::Truncate(3));
    steps.push(Step::Prepare(second));
    steps.push(Step::Prune(1));
    steps.push(Step::Sync);
    steps
}

/// The slots after the first `records` writes of the workload.
fn model(records: usize) -> Vec<(u64, JournalSlot)> {
    let mut entries = OpMap::new();
    let mut pruned = (0, None);
    for step in workload()
        .into_iter()
        .filter(|s| !matches!(s, Step::Sync))
        .take(records)
    {
        let decoded = match step {
            Step::Prepare(p) => Decoded::Entry(Entry::Prepare(p)),
            Step::Header(h) => Decoded::Entry(Entry::Header(h)),
            Step::Truncate(op) => Decoded::Truncate(op),
            Step::Prune(op) => Decoded::Prune(op, None),
            Step::Sync => continue,
        };
        replay(&mut entries, &mut pruned, &mut None, decoded);
    }
    entries.iter().map(|(op, e)| (*op, e.slot())).collect()
}

/// What a reopen may find after `synced` records were synced and up to `written` were
/// written: the slots after some prefix between the two, or, where damage hid what
/// landed, every op of the synced slots still known (damaged), bar those a landed
/// prune removed.
fn check_recovered(recovered: &Recovered, synced: usize, written: usize, context: &str) {
    let damaged = recovered
        .slots
        .iter()
        .any(|(_, s)| *s == JournalSlot::Damaged);
    if damaged {
        let held = slot_ops(recovered);
        for (op, _) in model(synced) {
            assert!(
                op <= recovered.pruned_through || held.contains(&op),
                "{context}: op {op} absent"
            );
        }
    } else {
        assert!(
            (synced..=written).any(|records| model(records) == recovered.slots),
            "{context}: {:?} is no prefix after {synced} synced records",
            slot_ops(recovered)
        );
    }
}

/// Cut at every sync boundary, every way the POSIX model allows: the journal opens to
/// the slots of the last sync plus a prefix of the writes after it, or, where damage
/// hid what landed, to every op of the last sync reported damaged, never absent.
#[test]
fn every_crash_state_keeps_every_synced_write_or_marks_it_damaged() {
    let root = tempfile::tempdir().unwrap();
    let path = root.path().join("replication").join("meta.journal");
    hook::start_tracing();
    let trace_len = hook::trace_len;
    // (trace length when a sync returned, records written by then)
    let mut acks = Vec::new();
    let total = {
        let (mut journal, _) = JournalFile::open(&path, GROUP).unwrap();
        acks.push((trace_len(), 0));
        let mut records = 0;
        for step in workload() {
            match step {
                Step::Prepare(p) => journal.write_prepare(&p).unwrap(),
                Step::Header(h) => journal.write_header(&h).unwrap(),
                Step::Truncate(op) => journal.truncate(op).unwrap(),
                Step::Prune(op) => journal.prune(op).unwrap(),
                Step::Sync => {
                    journal.sync().unwrap();
                    acks.push((trace_len(), records));
                    continue;
                }
            }
            records += 1;
        }
        records
    };
    let trace = hook::take().unwrap().trace;
    let checked =
        braid_storage::crash::for_each_crash_state(&trace, root.path(), |at, how, out| {
            let Some(&(_, synced)) = acks.iter().rev().find(|(events, _)| *events <= at) else {
                return; // cut inside the first open: nothing was written
            };
            let path = out.join("replication").join("meta.journal");
            let (_, recovered) = JournalFile::open(&path, GROUP)
                .unwrap_or_else(|e| panic!("cut at {at}, {how}: {e}"));
            check_recovered(&recovered, synced, total, &format!("cut at {at}, {how}"));
        });
    assert!(checked > 30, "{checked} crash states");
}

/// Each disk operation of the workload failed in turn: the failing call errors, every
/// later write is refused, and a reopen holds every op synced before the failure (or
/// marks it damaged).
#[test]
fn a_failed_write_or_sync_poisons_and_keeps_what_was_synced() {
    hook::install(Plan::default());
    let scratch = tempfile::tempdir().unwrap();
    {
        let (mut journal, _) = JournalFile::open(&scratch.path().join("j"), GROUP).unwrap();
        for step in workload() {
            match step {
                Step::Prepare(p) => journal.write_prepare(&p).unwrap(),
                Step::Header(h) => journal.write_header(&h).unwrap(),
                Step::Truncate(op) => journal.truncate(op).unwrap(),
                Step::Prune(op) => journal.prune(op).unwrap(),
                Step::Sync => drop(journal.sync().unwrap()),
            }
        }
    }
    let operations = hook::take().unwrap().seen;
    for at in 0..operations {
        let root = tempfile::tempdir().unwrap();
        let path = root.path().join("j");
        hook::install(Plan {
            fail_at: Some((at, std::io::ErrorKind::Other)),
            ..Plan::default()
        });
        let (mut synced, mut records) = (0, 0);
        if let Ok((mut journal, _)) = JournalFile::open(&path, GROUP) {
            for step in workload() {
                let is_sync = matches!(step, Step::Sync);
                let result = match step {
                    Step::Prepare(p) => journal.write_prepare(&p),
                    Step::Header(h) => journal.write_header(&h),
                    Step::Truncate(op) => journal.truncate(op),
                    Step::Prune(op) => journal.prune(op),
                    Step::Sync => journal.sync().map(|_| synced = records),
                };
                if result.is_err() {
                    let again = journal.truncate(0);
                    assert!(matches!(again, Err(JournalError::Poisoned(_))), "at {at}");
                    break;
                }
                if !is_sync {
                    records += 1;
                }
            }
        }
        hook::take();
        let Ok((_, recovered)) = JournalFile::open(&path, GROUP) else {
            continue; // the failure was in creating the file: nothing was written
        };
        check_recovered(&recovered, synced, records, &format!("failure at {at}"));
    }
}

/// Issue 24, finding 11: one flipped bit in the last record a sync covered read back as
/// a torn tail, so an acknowledged op became absent (a "never had it" vote). The sync
/// marker written once the sync is done follows it, so the flip is damage; every byte
/// of the record tried.
#[test]
fn damage_to_the_last_synced_record_is_damage_never_absence() {
    let ops = chain(3, 1);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("j");
    let (start, end) = {
        let (mut journal, _) = JournalFile::open(&path, GROUP).unwrap();
        journal.write_prepare(&ops[0]).unwrap();
        journal.write_prepare(&ops[1]).unwrap();
        journal.sync().unwrap();
        let start = journal.len;
        journal.write_prepare(&ops[2]).unwrap();
        let end = journal.len;
        journal.sync().unwrap();
        (start, end)
    };
    let (_, clean) = JournalFile::open(&path, GROUP).unwrap();
    assert_eq!(slot_ops(&clean), vec![1, 2, 3]);
    assert_eq!(
        clean.synced.iter().copied().collect::<Vec<_>>(),
        vec![1, 2, 3]
    );
    let pristine = std::fs::read(&path).unwrap();
    for at in start..end {
        let mut bytes = pristine.clone();
        bytes[at as usize] ^= 0x10;
        std::fs::write(&path, &bytes).unwrap();
        let (_, recovered) = JournalFile::open(&path, GROUP).unwrap();
        assert!(recovered.damaged_at.is_some(), "flip at {at}: not seen");
        assert!(
            recovered
                .slots
                .iter()
                .any(|(op, s)| *op == 3 && *s == JournalSlot::Damaged),
            "flip at {at}: op 3 is {:?}",
            recovered.slots
        );
    }
    // A write no sync covered has no marker after it: its tail is still a torn tail.
    std::fs::write(&path, &pristine).unwrap();
    {
        let (mut journal, _) = JournalFile::open(&path, GROUP).unwrap();
        journal.write_prepare(&chain(4, 1)[3]).unwrap();
    }
    let mut bytes = std::fs::read(&path).unwrap();
    let last = bytes.len() - 3;
    bytes[last] ^= 0x10;
    std::fs::write(&path, &bytes).unwrap();
    let (_, recovered) = JournalFile::open(&path, GROUP).unwrap();
    assert_eq!(recovered.damaged_at, None);
    assert_eq!(slot_ops(&recovered), vec![1, 2, 3]);
}

/// A journal whose records are reported before they are synced (a partition under
/// `fsync = never`) has no marker saying what was reported: a member's open that cuts
/// any tail of it calls `before_cut` first and says the tail may hide reported ops
/// (the shell simulator's seed 365891: a bit flipped in such a journal's last record
/// was cut as a torn tail, a kill -9 came before the group's distrust was written, and
/// the member restarted trusted without ops it had acknowledged). A single node's open
/// cuts it as before (it has no peer; `never` documents the loss).
#[test]
fn a_cut_tail_of_a_journal_reported_unsynced_may_hide_reported_records() {
    let ops = chain(3, 1);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("j");
    {
        let (mut journal, _) = JournalFile::open(&path, GROUP).unwrap();
        for op in &ops {
            journal.write_prepare(op).unwrap();
        }
        drop(journal.take_unsynced());
    }
    let mut bytes = std::fs::read(&path).unwrap();
    let last = bytes.len() - 3;
    bytes[last] ^= 0x10;
    for (lone, reported_unsynced, may_hide) in [
        (false, true, true),
        (false, false, false),
        (true, true, false),
    ] {
        std::fs::write(&path, &bytes).unwrap();
        let mut marked = false;
        let (_, recovered) =
            JournalFile::open_marking(&path, GROUP, lone, reported_unsynced, || {
                marked = true;
                Ok(())
            })
            .unwrap();
        let context = format!("lone {lone}, reported unsynced {reported_unsynced}");
        assert_eq!(slot_ops(&recovered), vec![1, 2], "{context}");
        assert_eq!(recovered.tail_may_hide, may_hide, "{context}");
        assert_eq!(marked, may_hide, "{context}: marked before the cut");
    }
}

/// Damage over the journal's magic (a flipped bit, a zeroed page) is damage like any
/// other, when records follow it: every op is reported damaged (repaired from peers),
/// and the file is rewritten whole. A file that is no journal is still refused (found
/// by the shell simulator with damage at rest, seeds 727 and 932).
#[test]
fn damage_over_the_magic_is_damage_and_another_file_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("meta.journal");
    let (mut journal, _) = JournalFile::open(&path, GROUP).unwrap();
    for p in chain(5, 1) {
        journal.write_prepare(&p).unwrap();
    }
    journal.sync().unwrap();
    drop(journal);
    let whole = std::fs::read(&path).unwrap();
    for damage in [
        |b: &mut Vec<u8>| b[3] ^= 0x04,
        |b: &mut Vec<u8>| b[..8].fill(0),
    ] {
        let mut bytes = whole.clone();
        damage(&mut bytes);
        std::fs::write(&path, &bytes).unwrap();
        let (_, recovered) = JournalFile::open(&path, GROUP).unwrap();
        assert!(recovered.damaged_at.is_some());
        assert!(recovered
            .slots
            .iter()
            .all(|(_, slot)| *slot == JournalSlot::Damaged));
        assert_eq!(slot_ops(&recovered), [1, 2, 3, 4, 5]);
        let magic = std::fs::read(&path).unwrap();
        assert_eq!(&magic[..MAGIC.len()], MAGIC, "rewritten whole");
    }
    std::fs::write(&path, b"not a journal at all, only some text").unwrap();
    assert!(matches!(
        JournalFile::open(&path, GROUP),
        Err(JournalError::NotAJournal { .. })
    ));
}

/// A power loss that tears the sync marker appended after the last sync (a prefix of
/// it kept, zeros for the rest, or zeros alone) cuts a tail that hides nothing: the
/// journal stays trusted. A short record a sync covered, with any one bit flipped and
/// its marker lost, or zeroed from a sector's start, is a tail that may hide a
/// reported record.
#[test]
fn a_torn_marker_hides_nothing_and_only_damage_over_a_durable_marker_may() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("meta.journal");
    let (mut journal, _) = JournalFile::open(&path, GROUP).unwrap();
    for p in chain(3, 1) {
        journal.write_prepare(&p).unwrap();
    }
    journal.sync().unwrap();
    drop(journal);
    let whole = std::fs::read(&path).unwrap();
    let at = whole.len() - SYNC_MARKER_BYTES;
    assert_eq!(whole[at + 8], KIND_SYNCED, "the file ends with the marker");
    for keep in 0..SYNC_MARKER_BYTES {
        let mut torn = whole.clone();
        torn[at + keep..].fill(0);
        std::fs::write(&path, &torn).unwrap();
        let (_, recovered) = JournalFile::open(&path, GROUP).unwrap();
        assert_eq!(slot_ops(&recovered), [1, 2, 3]);
        assert!(recovered.torn_tail_bytes > 0, "keep {keep}");
        assert!(!recovered.tail_may_hide, "{keep} bytes of the marker kept");
    }

    // The last synced record is a short one (a truncation): its marker is durable
    // before the sync returns, so a flipped bit in it is damage, never a torn tail.
    let (mut journal, _) = JournalFile::open(&path, GROUP).unwrap();
    journal.truncate(2).unwrap();
    journal.sync().unwrap();
    drop(journal);
    let with_marker = std::fs::read(&path).unwrap();
    let marker_at = with_marker.len() - SYNC_MARKER_BYTES;
    let record_at = marker_at - (RECORD_HEAD + 8);
    assert_eq!(with_marker[record_at + 8], KIND_TRUNCATE);
    for bit in 0..(RECORD_HEAD + 8) * 8 {
        let mut damaged = with_marker.clone();
        damaged[record_at + bit / 8] ^= 1 << (bit % 8);
        std::fs::write(&path, &damaged).unwrap();
        let (_, recovered) = JournalFile::open(&path, GROUP).unwrap();
        assert!(
            recovered.damaged_at.is_some() && recovered.torn_tail_bytes == 0,
            "bit {bit} of the truncation flipped is damage"
        );
    }
    // Damage that takes the marker too (a zeroed sector over both) may hide it.
    assert!(may_hide(&[0; 60], 4096));
    assert!(!may_hide(&[0; 60], 4096 + 3), "zeros from inside a sector");
    let mut torn_marker = vec![0x5a; 12];
    torn_marker.extend([0; 13]);
    assert!(
        !may_hide(&torn_marker, 4096 - 12),
        "a marker torn at a page: shorter than a record and its marker"
    );
    let mut record_then_zeroed_sector = vec![0x5a; 40];
    record_then_zeroed_sector.extend([0; 30]);
    assert!(may_hide(&record_then_zeroed_sector, 4096 - 40));
    assert!(
        !may_hide(&[0x5a; 70], 4096 - 40),
        "a flipped bit in one record: its marker would be intact after it"
    );
}

/// The shell simulator's seeds 104 and 127, with syncs off the shard's turn: a power
/// loss kept a later unsynced record and zeroed an earlier one. Bad bytes past every
/// marker, with intact records after them, are unsynced writes lost: a torn tail, cut
/// there with what follows (it was marked every op damaged, and with a peer's damage
/// the view change waited for ever). Zeros from inside a sector or a flipped bit hide
/// nothing (a reported record has its durable marker after it); a zeroed sector may
/// hide one (damage that took the marker too). Past a durability marker (what a
/// state write rests on), damage is damage.
#[test]
fn bad_bytes_past_every_marker_with_records_after_them_are_a_torn_tail() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("meta.journal");
    let ops = chain(6, 1);
    let (mut journal, _) = JournalFile::open(&path, GROUP).unwrap();
    for p in &ops[..3] {
        journal.write_prepare(p).unwrap();
    }
    journal.sync().unwrap();
    let fourth_at = std::fs::metadata(&path).unwrap().len() as usize;
    for p in &ops[3..] {
        journal.write_prepare(p).unwrap();
    }
    // Ops 1 to 6 encode to records of one length.
    let record_len = (fourth_at - RECORDS_START - SYNC_MARKER_BYTES) / 3;
    let fifth_at = fourth_at + record_len;
    drop(journal);
    let whole = std::fs::read(&path).unwrap();
    assert!(!fourth_at.is_multiple_of(512));

    let mut zeroed = whole.clone();
    zeroed[fourth_at..fifth_at].fill(0);
    std::fs::write(&path, &zeroed).unwrap();
    let (_, recovered) = JournalFile::open(&path, GROUP).unwrap();
    assert_eq!(slot_ops(&recovered), [1, 2, 3]);
    assert!(recovered.damaged_at.is_none(), "not damage");
    assert!(
        !recovered.tail_may_hide,
        "lost unsynced writes hide nothing"
    );
    assert_eq!(std::fs::metadata(&path).unwrap().len() as usize, fourth_at);

    let mut flipped = whole.clone();
    flipped[fourth_at + 20] ^= 0x04;
    std::fs::write(&path, &flipped).unwrap();
    let (_, recovered) = JournalFile::open(&path, GROUP).unwrap();
    assert_eq!(slot_ops(&recovered), [1, 2, 3]);
    assert!(recovered.damaged_at.is_none());
    assert!(
        !recovered.tail_may_hide,
        "one damaged unsynced record hides nothing"
    );

    // A record's first bytes, a zeroed sector, then the unsynced records: the head
    // says the sync reached no further than the marker before them, so the zeros
    // hide nothing (the records alone could not say: seeds 32436, 5928, 44274).
    let mut sector_zeroed = whole[..fourth_at].to_vec();
    sector_zeroed.push(0x42);
    while !sector_zeroed.len().is_multiple_of(512) {
        sector_zeroed.push(0x42);
    }
    sector_zeroed.extend([0u8; 512]);
    sector_zeroed.extend_from_slice(&whole[fourth_at..]);
    std::fs::write(&path, &sector_zeroed).unwrap();
    let (_, recovered) = JournalFile::open(&path, GROUP).unwrap();
    assert_eq!(slot_ops(&recovered), [1, 2, 3]);
    assert!(
        !recovered.tail_may_hide,
        "the head proves the zeroed sector held only unsynced writes"
    );
    // The copy written with the last marker lost (a power loss zeroed it in flight):
    // the other copy keeps the claim before it, and still nothing is hidden.
    let mut copy_lost = sector_zeroed.clone();
    copy_lost[MAGIC.len()..MAGIC.len() + head::COPY_BYTES].fill(0);
    std::fs::write(&path, &copy_lost).unwrap();
    let (_, recovered) = JournalFile::open(&path, GROUP).unwrap();
    assert!(!recovered.tail_may_hide, "one copy of the head is enough");
    // Without a head (both copies lost), a zeroed sector may have taken a marker.
    sector_zeroed[MAGIC.len()..RECORDS_START].fill(0);
    std::fs::write(&path, &sector_zeroed).unwrap();
    let (_, recovered) = JournalFile::open(&path, GROUP).unwrap();
    assert_eq!(slot_ops(&recovered), [1, 2, 3]);
    assert!(
        recovered.tail_may_hide,
        "a zeroed sector may have taken a marker"
    );

    // The same records made durable for a state write: damage, every op marked.
    std::fs::write(&path, &whole).unwrap();
    let (mut journal, _) = JournalFile::open(&path, GROUP).unwrap();
    journal.sync_unmarked().unwrap();
    drop(journal);
    let mut flipped = std::fs::read(&path).unwrap();
    flipped[fourth_at + 20] ^= 0x04;
    std::fs::write(&path, &flipped).unwrap();
    let (_, recovered) = JournalFile::open(&path, GROUP).unwrap();
    assert_eq!(recovered.damaged_at, Some(fourth_at as u64));
    assert!(recovered
        .slots
        .iter()
        .all(|(_, s)| *s == JournalSlot::Damaged));
}

/// Damage at rest that zeroes the page holding the last reported records and their
/// marker, with only unsynced writes after it, looks like a power loss's torn tail;
/// the head (a copy of the newest marker in the file's first page) tells them apart:
/// the cut lies below what it says was synced, so the tail may hide reported ops. A
/// flipped bit in one head copy changes nothing. The head is brought down to the cut,
/// so records written there next are not taken for synced ones.
#[test]
fn a_cut_below_what_the_head_says_was_synced_may_hide_reported_records() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("meta.journal");
    let ops = chain(6, 1);
    let (mut journal, _) = JournalFile::open(&path, GROUP).unwrap();
    for p in &ops[..2] {
        journal.write_prepare(p).unwrap();
    }
    journal.sync().unwrap();
    let third_at = std::fs::metadata(&path).unwrap().len() as usize;
    journal.write_prepare(&ops[2]).unwrap();
    journal.sync().unwrap();
    for p in &ops[3..] {
        journal.write_prepare(p).unwrap();
    }
    drop(journal);
    let whole = std::fs::read(&path).unwrap();
    for flip_a_head_copy in [false, true] {
        let mut damaged = whole.clone();
        // Zeros from op 3's record (reported) to the end: it, its marker and the
        // unsynced ops 4 to 6.
        damaged[third_at..].fill(0);
        if flip_a_head_copy {
            damaged[MAGIC.len() + 3] ^= 0x20;
        }
        std::fs::write(&path, &damaged).unwrap();
        let (_, recovered) = JournalFile::open(&path, GROUP).unwrap();
        assert_eq!(slot_ops(&recovered), [1, 2]);
        assert!(
            recovered.tail_may_hide,
            "op 3 was reported: {flip_a_head_copy}"
        );
        assert!(recovered.synced.contains(&2));
    }
    // Reopened after the cut, the head claims no more than the file holds.
    let (mut journal, recovered) = JournalFile::open(&path, GROUP).unwrap();
    assert!(!recovered.tail_may_hide && recovered.torn_tail_bytes == 0);
    journal.write_prepare(&ops[2]).unwrap();
    drop(journal);
    let (_, recovered) = JournalFile::open(&path, GROUP).unwrap();
    assert_eq!(slot_ops(&recovered), [1, 2, 3]);
    assert!(
        !recovered.synced.contains(&3),
        "written after the cut, never synced"
    );
}

/// `records` (a sealed journal's, from [`RECORDS_START`]) framed as a journal written
/// before seals frames them, from byte `start` on.
fn unsealed_records(records: &[u8], start: usize) -> Vec<u8> {
    let mut out = Vec::new();
    let mut at = 0;
    while at + RECORD_HEAD <= records.len() {
        let len = u32::from_be_bytes(records[at..at + 4].try_into().unwrap()) as usize;
        let mut record = records[at..at + RECORD_HEAD + len].to_vec();
        seal_record(&mut record, Seal::UNSEALED, (start + out.len()) as u64);
        out.extend(record);
        at += RECORD_HEAD + len;
    }
    out
}

/// A journal written before heads (magic `BRDJNL01`, records from byte 8), or before
/// seals (`BRDJNL02`, CRCs unseeded), is read and appended to as it is, and given a
/// head and a seal when it is next rewritten.
#[test]
fn a_journal_from_before_heads_or_seals_is_read_and_sealed_when_rewritten() {
    for (magic, head) in [
        (MAGIC_HEADLESS, None),
        (MAGIC_UNSEALED, Some(Head::default().encode(Seal::UNSEALED))),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("meta.journal");
        let ops = chain(4, 1);
        let (mut journal, _) = JournalFile::open(&path, GROUP).unwrap();
        for p in &ops[..2] {
            journal.write_prepare(p).unwrap();
        }
        drop(journal);
        let sealed = std::fs::read(&path).unwrap();
        let mut old = magic.to_vec();
        if let Some(head) = head {
            old.extend_from_slice(&head);
        }
        let records = unsealed_records(&sealed[RECORDS_START..], old.len());
        old.extend(records);
        std::fs::write(&path, &old).unwrap();
        let (mut journal, recovered) = JournalFile::open(&path, GROUP).unwrap();
        assert_eq!(slot_ops(&recovered), [1, 2]);
        assert_eq!(recovered.damaged_at, None);
        journal.write_prepare(&ops[2]).unwrap();
        journal.sync().unwrap();
        drop(journal);
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(&bytes[..MAGIC.len()], magic, "as it was");
        let (mut journal, recovered) = JournalFile::open(&path, GROUP).unwrap();
        assert_eq!(slot_ops(&recovered), [1, 2, 3]);
        assert!(recovered.synced.contains(&3));
        journal.compact(true).unwrap();
        journal.write_prepare(&ops[3]).unwrap();
        journal.sync().unwrap();
        drop(journal);
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(
            &bytes[..MAGIC.len()],
            MAGIC,
            "rewritten with a head and a seal"
        );
        let (_, recovered) = JournalFile::open(&path, GROUP).unwrap();
        assert_eq!(slot_ops(&recovered), [1, 2, 3, 4]);
        assert!(recovered.synced.contains(&4));
        let (_, other) = JournalFile::open(&path, GROUP + 1).unwrap();
        assert!(
            other
                .slots
                .iter()
                .all(|(_, slot)| *slot == JournalSlot::Damaged),
            "sealed: another group's open takes none of it"
        );
    }
}

/// A page of another group's journal, or of this journal from another place, written
/// over a page of it (a misdirected write) is damage: none of its records is taken for
/// this journal's, even where the records are framed alike and fall on the same bytes
/// (the shell simulator's seed 300343: the metadata journal's first page over a
/// partition's, whose op 1 was a register of the same size as the metadata's).
#[test]
fn a_misdirected_page_is_damage_never_entries() {
    let dir = tempfile::tempdir().unwrap();
    let ops = chain(120, 1);
    let write = |path: &Path, group: u64| {
        let (mut journal, _) = JournalFile::open(path, group).unwrap();
        for p in &ops {
            journal.write_prepare(p).unwrap();
            journal.sync().unwrap();
        }
    };
    let ours = dir.path().join("ours.journal");
    let theirs = dir.path().join("theirs.journal");
    write(&ours, GROUP);
    write(&theirs, GROUP + 1);
    let clean = std::fs::read(&ours).unwrap();
    assert!(clean.len() > 3 * 4096);
    // Another group's journal of the same ops: the same records at the same places,
    // bar their seals.
    let foreign = std::fs::read(&theirs).unwrap();
    assert_eq!(foreign.len(), clean.len());
    for (from, to, source) in [
        (0, 0, &foreign),
        (4096, 4096, &foreign),
        (0, 4096, &clean),
        (4096, 8192, &clean),
    ] {
        let mut bytes = clean.clone();
        bytes[to..to + 4096].copy_from_slice(&source[from..from + 4096]);
        std::fs::write(&ours, &bytes).unwrap();
        let (_, recovered) = JournalFile::open(&ours, GROUP).unwrap();
        let what = format!(
            "page {from} of {} over page {to}",
            if std::ptr::eq(source, &foreign) {
                "theirs"
            } else {
                "ours"
            }
        );
        assert!(recovered.damaged_at.is_some(), "{what}: damage");
        assert_eq!(
            recovered.slots.len(),
            ops.len(),
            "{what}: every op still known"
        );
        assert!(
            recovered
                .slots
                .iter()
                .all(|(_, slot)| *slot == JournalSlot::Damaged),
            "{what}: every op damaged, none taken from the page"
        );
        std::fs::write(&ours, &clean).unwrap();
    }
}

/// Syncs off the shard finish one after another, none covering the head written at the
/// one before (the syncer ran both before either completion was noted): each
/// completion writes a claim to the head. Alternating copies regardless left both in
/// flight, and a power loss that zeroed the file's unsynced writes took both: the open
/// found no head, took the zeroed tail for one that may hide a reported op, and the
/// member restarted untrusted though every reported op was there (the shell
/// simulator's seed 325700 with damage to sleeping files: its other member had lost its
/// disk, and the view change waited for ever). A claim goes to the copy still in
/// flight: after any crash, the other holds a durable one.
#[test]
fn claims_of_syncs_finishing_in_a_row_never_leave_both_head_copies_in_flight() {
    let root = tempfile::tempdir().unwrap();
    let path = root.path().join("p").join("vsr.journal");
    // Bodies of a few hundred bytes: the unsynced writes span whole sectors.
    let mut parent = Header::root(0).checksum;
    let ops: Vec<Prepare> = (1..=10)
        .map(|op| {
            let p = prepare(op, 1, parent, &[op as u8; 400]);
            parent = p.header.checksum;
            p
        })
        .collect();
    hook::start_tracing();
    let from;
    {
        let (mut journal, _) = JournalFile::open(&path, GROUP).unwrap();
        for p in &ops[..3] {
            journal.write_prepare(p).unwrap();
        }
        let first = journal.synced_len_if_synced_now();
        let first_sync = journal.sync_request().unwrap();
        journal.write_prepare(&ops[3]).unwrap();
        let second = journal.synced_len_if_synced_now();
        let second_sync = journal.sync_request().unwrap();
        // The syncer runs both, then the shard notes each completion.
        first_sync.run().unwrap();
        second_sync.run().unwrap();
        from = hook::trace_len();
        journal.note_synced(first).unwrap();
        journal.note_synced(second).unwrap();
        // Later writes, unsynced: a power loss may land the last alone.
        for p in &ops[4..] {
            journal.write_prepare(p).unwrap();
        }
    }
    let trace = hook::take().unwrap().trace;
    let checked =
        braid_storage::crash::for_each_crash_state(&trace, root.path(), |at, how, out| {
            if at < from {
                return;
            }
            let path = out.join("p").join("vsr.journal");
            let (_, recovered) = JournalFile::open(&path, GROUP)
                .unwrap_or_else(|e| panic!("cut at {at}, {how}: {e}"));
            assert!(
                !recovered.tail_may_hide,
                "cut at {at}, {how}: every synced op is there, yet the tail may hide one"
            );
            assert!(slot_ops(&recovered).len() >= 4, "cut at {at}, {how}");
        });
    assert!(checked > 5, "{checked} crash states");
}
