use super::*;

/// The shell simulator's seed 300343 (damage at rest, misdirected writes): the
/// metadata journal's first page landed over a partition's `vsr.journal`. Its records
/// fell on the same bytes as the partition's own (op 1 a register of the same size,
/// then a sync marker), so the partition read the metadata group's op 1 as its own;
/// the replica, finding another group's header, repaired op 1, and writing it cut the
/// thirty acknowledged ops above it from the log while the replica counted them
/// durable. Sealed records make the foreign page damage: every op is reported
/// damaged, none is taken from the page, and the repairs rebuild the same log.
#[test]
fn another_groups_journal_page_over_the_header_journal_is_damage() {
    let dir = tempfile::tempdir().unwrap();
    let ops = chain(31, 1, "a");
    drop(holding(dir.path(), &ops));
    let clean = {
        let dir = tempfile::tempdir().unwrap();
        log_batches(&mut holding(dir.path(), &ops))
    };
    // The metadata group's journal: its op 1 a register of the same size as ours.
    let meta_dir = tempfile::tempdir().unwrap();
    let meta_path = meta_dir.path().join("group-0.journal");
    {
        let (mut meta, _) = JournalFile::open(&meta_path, 0).unwrap();
        let mut register = ops[0].clone();
        register.header.group = 0;
        register.header = register.header.seal();
        meta.write_prepare(&register).unwrap();
        meta.sync().unwrap();
    }
    let page = std::fs::read(&meta_path).unwrap();
    let path = dir.path().join(JOURNAL_FILE);
    let mut bytes = std::fs::read(&path).unwrap();
    assert!(page.len() < 4096 && page.len() < bytes.len());
    bytes[..page.len()].copy_from_slice(&page);
    std::fs::write(&path, &bytes).unwrap();

    let (mut journal, recovered) = open(dir.path());
    assert!(recovered.damage.is_some(), "the page is damage");
    for (op, slot) in &recovered.slots {
        let group = match slot {
            JournalSlot::Prepare(p) => Some(p.header.group),
            JournalSlot::Header(h) => Some(h.group),
            JournalSlot::Damaged => None,
        };
        assert!(
            group.is_none_or(|g| g == GROUP),
            "op {op} taken from another group's journal"
        );
    }
    let known: Vec<u64> = recovered.slots.iter().map(|(op, _)| *op).collect();
    assert_eq!(known, (1..=31).collect::<Vec<_>>(), "every op still known");
    // The replica repairs each op reported damaged, lowest first.
    for p in &ops {
        journal.write_prepare(p, 0).unwrap();
    }
    journal.sync().unwrap();
    assert_eq!(journal.tip(), 31);
    assert_eq!(log_batches(&mut journal), clean);
}

/// Should an entry within the tip ever read back other than it was appended, with
/// every check passed, the replica repairs it with the prepare the op above chains to:
/// the ops above are the log's own, not an older view's, and replacing the entry
/// refuses instead of cutting them (the replica holds them durable).
#[test]
fn replacing_an_entry_the_op_above_chains_to_cuts_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let ops = chain(10, 1, "a");
    let mut journal = holding(dir.path(), &ops);
    let before = log_batches(&mut journal);
    let (held, base) = journal.index.entry(5).map(|(h, b)| (*h, b)).unwrap();
    let mut forged = held;
    forged.view = 9;
    let forged = forged.seal();
    journal
        .index
        .write_external(&forged, base.unwrap())
        .unwrap();
    let refused = journal.write_prepare(&ops[4], 0).unwrap_err();
    assert!(
        matches!(refused, PartitionJournalError::Unchained { op: 5, .. }),
        "{refused}"
    );
    assert_eq!(journal.tip(), 10);
    assert_eq!(log_batches(&mut journal), before, "nothing cut");
    // A replacement the op above does not chain to (a new view's) still cuts.
    let mut other = ops[4].clone();
    other.header.view = 2;
    other.header = other.header.seal();
    journal.write_prepare(&other, 0).unwrap();
    assert_eq!(journal.tip(), 5);
}
