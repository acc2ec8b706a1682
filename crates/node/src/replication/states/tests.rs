use super::*;
use braid_storage::disk::hook::{self, Event, Plan};

fn boot() -> BootId {
    BootId::from_bytes([3; 16])
}

fn state(view: u64, commit: u64) -> DurableState {
    DurableState {
        view,
        log_view: view,
        commit,
        journal_trusted_through: u64::MAX,
        views_lost: false,
    }
}

/// A durable state in the first layout (before the flags word), as old tables hold it.
fn encode_v1(state: &DurableState, sequence: u64) -> Vec<u8> {
    let mut out = 0x4252_5653u32.to_be_bytes().to_vec(); // "BRVS"
    for word in [
        sequence,
        state.view,
        state.log_view,
        state.commit,
        state.journal_trusted_through,
    ] {
        out.extend_from_slice(&word.to_be_bytes());
    }
    let sum = braid_vsr::checksum(&out);
    out.extend_from_slice(&sum.to_be_bytes());
    out
}

fn paths(dir: &Path, shard: usize) -> [PathBuf; 2] {
    [0, 1].map(|i| dir.join(format!("shard-{shard}.{i}")))
}

/// Bytes written and syncs done in a trace.
fn cost(trace: &[Event]) -> (usize, usize) {
    let written = trace
        .iter()
        .map(|event| match event {
            Event::Write { bytes, .. } => bytes.len(),
            _ => 0,
        })
        .sum();
    let syncs = trace
        .iter()
        .filter(|event| matches!(event, Event::Sync { .. }))
        .count();
    (written, syncs)
}

/// A table of the second format (`BRDVST02`), as the old code wrote it whole.
fn encode_stamped_table(batch: u64, states: &BTreeMap<u64, Entry>) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(MAGIC_STAMPED);
    out.extend_from_slice(&batch.to_be_bytes());
    out.extend_from_slice(&(states.len() as u32).to_be_bytes());
    for (group, entry) in states {
        out.extend_from_slice(&group.to_be_bytes());
        out.extend_from_slice(&entry.stamp.encode());
        out.extend_from_slice(&encode_v1(&entry.state, batch));
    }
    let crc = crc32c::crc32c(&out);
    out.extend_from_slice(&crc.to_be_bytes());
    out
}

#[test]
fn a_write_costs_the_slots_it_changed_and_two_syncs() {
    const GROUPS: u64 = 10_000;
    let dir = tempfile::tempdir().unwrap();
    let mut states = GroupStates::open(dir.path(), 0, boot()).unwrap();
    for group in 0..GROUPS {
        states.stage(group, state(1, group));
    }
    assert_eq!(states.write_staged().unwrap().len(), GROUPS as usize);

    // One group among ten thousand: its slot in each copy, and two syncs.
    hook::start_tracing();
    states.stage(4_321, state(2, 7));
    assert_eq!(states.write_staged().unwrap(), vec![(4_321, state(2, 7))]);
    let (one_bytes, one_syncs) = cost(&hook::take().unwrap().trace);
    assert_eq!(one_syncs, 2);
    assert_eq!(one_bytes, 2 * SLOT_BYTES);
    assert!(one_bytes < 4096, "{one_bytes} bytes for one group");

    // A hundred groups, a removal and a new group in the freed slot: O(changed).
    hook::start_tracing();
    for group in (0..GROUPS).step_by(100) {
        states.stage(group, state(3, group));
    }
    states.remove(5);
    assert_eq!(states.write_staged().unwrap().len(), 100);
    states.stage(GROUPS + 1, state(1, 1));
    states.write_staged().unwrap();
    let (bytes, syncs) = cost(&hook::take().unwrap().trace);
    assert_eq!(syncs, 4);
    assert_eq!(bytes, 2 * 101 * SLOT_BYTES + 2 * SLOT_BYTES);
    assert_eq!(states.slot_of[&(GROUPS + 1)], states_slot_was(5));

    // Nothing staged, a reopen of an intact shard: nothing written.
    hook::start_tracing();
    assert!(states.write_staged().unwrap().is_empty());
    let reopened = GroupStates::open(dir.path(), 0, boot()).unwrap();
    assert_eq!(cost(&hook::take().unwrap().trace), (0, 0));
    assert_eq!(reopened.get(4_321), Some(state(2, 7)));
    assert_eq!(reopened.get(GROUPS + 1), Some(state(1, 1)));
    assert_eq!(reopened.get(5), None);
    assert_eq!(reopened.groups().count(), GROUPS as usize);

    // Before: the same change rewrote the whole table (BRDVST02) over the older
    // copy through `TwoCopies::write`, and synced it.
    let old_dir = tempfile::tempdir().unwrap();
    let old = super::super::copies::TwoCopies::new(old_dir.path(), "shard-0");
    hook::start_tracing();
    old.write(2, &encode_stamped_table(2, &reopened.states))
        .unwrap();
    let (old_bytes, old_syncs) = cost(&hook::take().unwrap().trace);
    println!(
        "one group changed among {GROUPS}: before {old_bytes} bytes written and \
         {old_syncs} fdatasync (the whole table); after {one_bytes} bytes and \
         {one_syncs} fdatasyncs (its slot in each copy)"
    );
    assert!(old_bytes > 100 * one_bytes);
}

/// The slot group 5 held in [`a_write_costs_the_slots_it_changed_and_two_syncs`]:
/// groups took slots in order.
fn states_slot_was(group: u64) -> u32 {
    group as u32
}

#[test]
fn a_batch_is_two_writes_and_damage_to_the_newest_copy_rolls_nothing_back() {
    let dir = tempfile::tempdir().unwrap();
    let mut states = GroupStates::open(dir.path(), 3, boot()).unwrap();
    assert!(states.was_created());
    assert_eq!(states.groups().count(), 0);
    for group in 0..1000 {
        states.stage(group, state(1, group));
    }
    hook::install(Plan::default());
    let durable = states.write_staged().unwrap();
    let operations = hook::take().unwrap().seen;
    assert_eq!(durable.len(), 1000);
    assert!(
        operations <= 8,
        "{operations} disk operations for 1000 groups"
    );
    assert!(!states.has_staged());
    states.stage(7, state(2, 9));
    states.remove(8);
    assert!(states.has_staged());
    assert_eq!(states.write_staged().unwrap(), vec![(7, state(2, 9))]);
    assert!(states.write_staged().unwrap().is_empty(), "nothing staged");
    let reopened = GroupStates::open(dir.path(), 3, boot()).unwrap();
    assert!(!reopened.was_created());
    assert_eq!(reopened.get(7), Some(state(2, 9)));
    assert_eq!(reopened.get(8), None);
    assert_eq!(reopened.groups().count(), 999);

    // Group 7's newest slot flipped in either copy: still the newest state.
    let at = slot_offset(reopened.slot_of[&7]) as usize + 60;
    for path in paths(dir.path(), 3) {
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[at] ^= 1;
        std::fs::write(&path, &bytes).unwrap();
        let states = GroupStates::open(dir.path(), 3, boot()).unwrap();
        assert_eq!(states.get(7), Some(state(2, 9)), "{}", path.display());
        assert!(states.damaged_groups().is_empty());
    }
    // No intact header: refused, naming each copy.
    for path in paths(dir.path(), 3) {
        std::fs::write(path, b"BRDVST03garbage").unwrap();
    }
    let refused = GroupStates::open(dir.path(), 3, boot()).unwrap_err();
    assert!(refused.to_string().contains("shard-3.0"), "{refused}");
    assert!(refused.to_string().contains("shard-3.1"), "{refused}");
}

#[test]
fn stamps_are_kept_per_group_and_tables_of_the_first_formats_are_upgraded() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (BootId::from_bytes([1; 16]), BootId::from_bytes([2; 16]));
    let mut states = GroupStates::open(dir.path(), 0, a).unwrap();
    states.stage(1, state(1, 1));
    states.stage(2, state(1, 2));
    states.write_staged().unwrap();
    // A process of another boot restages group 2 only: group 1 keeps boot a's.
    let mut states = GroupStates::open(dir.path(), 0, b).unwrap();
    assert!(!states.vouches_for(1) && !states.vouches_for(2));
    states.stage(2, state(2, 2));
    states.write_staged().unwrap();
    let mut states = GroupStates::open(dir.path(), 0, b).unwrap();
    assert_eq!(states.stamp(1), Some(Stamp::Boot(a)));
    assert_eq!(states.stamp(2), Some(Stamp::Boot(b)));
    assert!(states.vouches_for(2) && !states.vouches_for(1));
    assert_eq!(states.get(2), Some(state(2, 2)));
    // A clean stop: synced, or unknown where the journal's close failed.
    states.write_stopped(&[2]).unwrap();
    let states = GroupStates::open(dir.path(), 0, b).unwrap();
    assert_eq!(states.stamp(1), Some(Stamp::Synced));
    assert_eq!(states.stamp(2), Some(Stamp::Unknown));

    // The second format: the whole table in each copy; the newer batch is read
    // once and put in place as slots, stamps and all.
    let table = |view| {
        BTreeMap::from([
            (
                3,
                Entry {
                    state: state(view, 30),
                    stamp: Stamp::Boot(a),
                },
            ),
            (
                9,
                Entry {
                    state: state(view, 90),
                    stamp: Stamp::Synced,
                },
            ),
        ])
    };
    let old_dir = tempfile::tempdir().unwrap();
    let [zero, one] = paths(old_dir.path(), 0);
    std::fs::write(&zero, encode_stamped_table(6, &table(6))).unwrap();
    std::fs::write(&one, encode_stamped_table(5, &table(5))).unwrap();
    let mut states = GroupStates::open(old_dir.path(), 0, b).unwrap();
    assert!(!states.was_created());
    assert_eq!(states.states, table(6));
    for path in [&zero, &one] {
        assert!(std::fs::read(path).unwrap().starts_with(MAGIC));
    }
    states.stage(3, state(7, 31));
    states.write_staged().unwrap();
    let states = GroupStates::open(old_dir.path(), 0, b).unwrap();
    assert_eq!(states.get(3), Some(state(7, 31)));
    assert_eq!(states.stamp(9), Some(Stamp::Synced));
    assert_eq!(states.get(9), Some(state(6, 90)));

    // The first format: the same table, no stamps.
    let mut old = Vec::new();
    old.extend_from_slice(MAGIC_UNSTAMPED);
    old.extend_from_slice(&5u64.to_be_bytes());
    old.extend_from_slice(&1u32.to_be_bytes());
    old.extend_from_slice(&7u64.to_be_bytes());
    old.extend_from_slice(&encode_v1(&state(3, 4), 5));
    let crc = crc32c::crc32c(&old);
    old.extend_from_slice(&crc.to_be_bytes());
    let old_dir = tempfile::tempdir().unwrap();
    std::fs::write(old_dir.path().join("shard-0.1"), &old).unwrap();
    let states = GroupStates::open(old_dir.path(), 0, a).unwrap();
    assert_eq!(states.get(7), Some(state(3, 4)));
    assert_eq!(states.stamp(7), Some(Stamp::Unknown));
    // An old table that does not decode: refused, as before.
    std::fs::write(old_dir.path().join("shard-0.0"), b"BRDVST02garbage").unwrap();
    std::fs::write(old_dir.path().join("shard-0.1"), b"BRDVST02garbage").unwrap();
    assert!(matches!(
        GroupStates::open(old_dir.path(), 0, a),
        Err(StatesError::NoIntactCopy { .. })
    ));
}

/// Opens copies holding `files` (`None`: missing) in a crash-state harness: every
/// state a crash during that open (whatever it writes) can leave opens to
/// `expected` exactly, with no group damaged. Returns the states checked.
fn assert_every_crash_state_of_open(
    files: [Option<Vec<u8>>; 2],
    expected: &BTreeMap<u64, Entry>,
    what: &str,
) -> usize {
    let root = tempfile::tempdir().unwrap();
    // Named as the copies' table was (a test's: `states`), wherever it is.
    let dir = root.path().join("states");
    std::fs::create_dir(&dir).unwrap();
    // The harness starts from an empty root: the copies as they stood come first.
    let mut trace = vec![
        Event::MkDir { dir: dir.clone() },
        Event::DirSync {
            dir: root.path().to_owned(),
        },
    ];
    for (path, bytes) in paths(&dir, 0).into_iter().zip(files) {
        let Some(bytes) = bytes else { continue };
        std::fs::write(&path, &bytes).unwrap();
        trace.push(Event::Create { path: path.clone() });
        trace.push(Event::Write {
            path: path.clone(),
            offset: 0,
            bytes,
        });
        trace.push(Event::Sync { path });
    }
    trace.push(Event::DirSync { dir: dir.clone() });
    let start = trace.len();
    hook::start_tracing();
    GroupStates::open(&dir, 0, boot()).unwrap_or_else(|e| panic!("{what}: {e}"));
    trace.extend(hook::take().unwrap().trace);
    braid_storage::crash::for_each_crash_state(&trace, root.path(), |at, how, out| {
        if at < start {
            return;
        }
        let what = format!("{what}, cut at {at}, {how}");
        let states = GroupStates::open(&out.join("states"), 0, boot())
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_eq!(&states.states, expected, "{what}");
        assert!(states.damaged_groups().is_empty(), "{what}");
    })
}

/// Cut at every sync boundary of an upgrade: the old table, whole.
#[test]
fn every_crash_state_of_an_upgrade_opens_to_the_old_table() {
    let table: BTreeMap<u64, Entry> = (0..5)
        .map(|g| {
            let (state, stamp) = (state(g + 1, g), Stamp::Synced);
            (g, Entry { state, stamp })
        })
        .collect();
    let old = [
        Some(encode_stamped_table(4, &table)),
        Some(encode_stamped_table(3, &BTreeMap::new())),
    ];
    let checked = assert_every_crash_state_of_open(old, &table, "upgrade");
    assert!(checked > 10, "{checked} crash states");
}

/// Cut at every sync boundary of what open writes back into a damaged or missing
/// copy: the copy that proved a slot is never written, so every group stays
/// exactly as written.
#[test]
fn every_crash_state_of_a_repair_opens_to_the_newest_states() {
    let (dir, expected) = written_table(12);
    let files = read_files(dir.path());
    let at = slot_offset(3) as usize;
    let mut checked = 0;
    for copy in 0..2 {
        let other = Some(files[1 - copy].clone());
        let mut damaged = [Some(files[0].clone()), Some(files[1].clone())];
        let bytes = damaged[copy].as_mut().unwrap();
        bytes[at + STATE_AT] ^= 1;
        bytes[at + 2 * SLOT_BYTES..at + 4 * SLOT_BYTES].fill(0);
        bytes[5] ^= 1;
        let what = format!("slots and header damaged in copy {copy}");
        checked += assert_every_crash_state_of_open(damaged, &expected, &what);
        let mut missing = [None, None];
        missing[1 - copy] = other;
        let what = format!("copy {copy} missing");
        checked += assert_every_crash_state_of_open(missing, &expected, &what);
    }
    assert!(checked > 40, "{checked} crash states");
}

/// One batch: groups' new states, and groups removed.
type Batch = (Vec<(u64, DurableState)>, Vec<u64>);

/// The batches of a workload: each a few groups' new states, some removals (whose
/// slots later batches reuse).
fn workload() -> Vec<Batch> {
    (1..=8u64)
        .map(|b| {
            let staged = (0..3)
                .map(|g| ((b + g) % 6, state(b, b * 10 + g)))
                .collect();
            let removed = if b % 3 == 0 {
                vec![b % 6, (b + 3) % 6]
            } else {
                Vec::new()
            };
            (staged, removed)
        })
        .collect()
}

fn table_after(batches: usize) -> BTreeMap<u64, DurableState> {
    let mut table = BTreeMap::new();
    for (staged, removed) in workload().into_iter().take(batches) {
        table.extend(staged);
        for g in removed {
            table.remove(&g);
        }
    }
    table
}

fn stage_batch(states: &mut GroupStates, (staged, removed): Batch) {
    for (g, s) in staged {
        states.stage(g, s);
    }
    for g in removed {
        states.remove(g);
    }
}

/// Each group's state is the one `batches` batches left, or the next batch's.
fn assert_at_batch(found: &BTreeMap<u64, DurableState>, batches: usize, what: &str) {
    let (before, after) = (table_after(batches), table_after(batches + 1));
    for group in before.keys().chain(after.keys()).chain(found.keys()) {
        let state = found.get(group);
        assert!(
            state == before.get(group) || state == after.get(group),
            "{what}: group {group} at {state:?} after {batches} batches"
        );
    }
}

fn run(dir: &Path) -> Result<usize, StatesError> {
    let mut states = GroupStates::open(dir, 0, boot())?;
    let mut written = 0;
    for batch in workload() {
        stage_batch(&mut states, batch);
        states.write_staged()?;
        written += 1;
    }
    Ok(written)
}

/// Cut at every sync boundary, every way the POSIX model allows: the states open,
/// each group's is that of the last batch whose write returned or of the one in
/// flight, none is damaged, and what open wrote back leaves nothing to repair.
#[test]
fn every_crash_state_opens_to_the_last_written_batch_or_the_next() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("replication");
    hook::start_tracing();
    let trace_len = hook::trace_len;
    let mut acks = Vec::new();
    {
        // Record where in the trace each batch's write returned.
        let mut states = GroupStates::open(&dir, 0, boot()).unwrap();
        acks.push(trace_len());
        for batch in workload() {
            stage_batch(&mut states, batch);
            states.write_staged().unwrap();
            acks.push(trace_len());
        }
    }
    let trace = hook::take().unwrap().trace;
    let checked =
        braid_storage::crash::for_each_crash_state(&trace, root.path(), |at, how, out| {
            let written = acks.iter().filter(|&&events| events <= at).count();
            let dir = out.join("replication");
            let what = format!("cut at {at}, {how}");
            let states =
                GroupStates::open(&dir, 0, boot()).unwrap_or_else(|e| panic!("{what}: {e}"));
            let found: BTreeMap<u64, DurableState> = states.groups().collect();
            assert!(states.damaged_groups().is_empty(), "{what}");
            assert_at_batch(&found, written.saturating_sub(1), &what);
            hook::start_tracing();
            let again = GroupStates::open(&dir, 0, boot()).unwrap();
            let trace = hook::take().unwrap().trace;
            assert_eq!(cost(&trace), (0, 0), "{what}: a second open wrote");
            assert_eq!(again.states, states.states, "{what}");
        });
    assert!(checked > 50, "{checked} crash states");
}

/// Each disk operation failed in turn: the failing call errors, later writes are
/// refused, and a reopen finds each group as the last written batch or the one that
/// failed left it.
#[test]
fn a_failed_write_poisons_and_a_reopen_finds_a_written_batch() {
    hook::install(Plan::default());
    let root = tempfile::tempdir().unwrap();
    run(&root.path().join("r")).unwrap();
    let operations = hook::take().unwrap().seen;
    for at in 0..operations {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("r");
        hook::install(Plan {
            fail_at: Some((at, std::io::ErrorKind::Other)),
            ..Plan::default()
        });
        let mut states = GroupStates::open(&dir, 0, boot());
        let mut written = 0;
        if let Ok(states) = states.as_mut() {
            for batch in workload() {
                stage_batch(states, batch);
                if states.write_staged().is_err() {
                    states.stage(0, state(99, 99));
                    assert!(matches!(states.write_staged(), Err(StatesError::Poisoned)));
                    break;
                }
                written += 1;
            }
        }
        hook::take();
        let reopened =
            GroupStates::open(&dir, 0, boot()).unwrap_or_else(|e| panic!("failure at {at}: {e}"));
        assert!(reopened.damaged_groups().is_empty());
        let found: BTreeMap<u64, DurableState> = reopened.groups().collect();
        assert_at_batch(&found, written, &format!("failure at {at}"));
    }
}

/// Several batches over `groups` groups, across two boots, with removals and
/// freed slots reused: the directory and every group's newest state and stamp.
fn written_table(groups: u64) -> (tempfile::TempDir, BTreeMap<u64, Entry>) {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (BootId::from_bytes([1; 16]), BootId::from_bytes([2; 16]));
    let mut states = GroupStates::open(dir.path(), 0, a).unwrap();
    for group in 0..groups {
        states.stage(group, state(1, group));
    }
    states.write_staged().unwrap();
    for batch in 2..6 {
        for group in (0..groups).filter(|g| g % batch == 0) {
            states.stage(group, state(batch, group * batch));
        }
        states.remove(batch + 1);
        states.write_staged().unwrap();
    }
    let mut states = GroupStates::open(dir.path(), 0, b).unwrap();
    states.stage(groups + 1, state(7, 7));
    states.stage(1, state(8, 8));
    states.write_staged().unwrap();
    let expected = states.states.clone();
    assert!(expected.contains_key(&(groups + 1)) && expected.len() as u64 <= groups);
    (dir, expected)
}

/// A copy of `files` in a new directory.
fn with_files(files: &[Vec<u8>; 2]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for (path, bytes) in paths(dir.path(), 0).iter().zip(files) {
        std::fs::write(path, bytes).unwrap();
    }
    dir
}

fn read_files(dir: &Path) -> [Vec<u8>; 2] {
    paths(dir, 0).map(|path| std::fs::read(path).unwrap())
}

/// Opens `files` damaged by `damage` in copy `copy`: every group exactly as
/// written, none damaged. Then (when `twice`) the same damage to the other copy
/// as open repaired them: still exact, so open wrote the damaged copy back.
fn assert_survives(
    files: &[Vec<u8>; 2],
    expected: &BTreeMap<u64, Entry>,
    copy: usize,
    damage: &dyn Fn(&mut Vec<u8>),
    twice: bool,
    what: &str,
) {
    let mut damaged = files.clone();
    damage(&mut damaged[copy]);
    let dir = with_files(&damaged);
    let states = GroupStates::open(dir.path(), 0, boot())
        .unwrap_or_else(|e| panic!("{what} in copy {copy}: {e}"));
    assert_eq!(&states.states, expected, "{what} in copy {copy}");
    assert!(states.damaged_groups().is_empty(), "{what} in copy {copy}");
    drop(states);
    if twice {
        let mut repaired = read_files(dir.path());
        damage(&mut repaired[1 - copy]);
        let dir = with_files(&repaired);
        let states = GroupStates::open(dir.path(), 0, boot())
            .unwrap_or_else(|e| panic!("{what} in both copies in turn: {e}"));
        assert_eq!(&states.states, expected, "{what} in both copies in turn");
    }
}

#[test]
fn a_flipped_bit_anywhere_in_either_copy_never_rolls_a_group_back() {
    let (dir, expected) = written_table(12);
    let files = read_files(dir.path());
    for copy in 0..2 {
        for at in 0..files[copy].len() {
            let flip = move |bytes: &mut Vec<u8>| bytes[at] ^= 1 << (at % 8);
            let what = format!("bit {} of byte {at}", at % 8);
            assert_survives(&files, &expected, copy, &flip, at % 5 == 0, &what);
        }
    }
}

#[test]
fn a_zeroed_page_or_a_lost_tail_in_either_copy_never_rolls_a_group_back() {
    let (dir, expected) = written_table(100);
    let files = read_files(dir.path());
    for copy in 0..2 {
        let len = files[copy].len();
        for at in (0..len).step_by(SECTOR_BYTES) {
            let zero = move |bytes: &mut Vec<u8>| {
                let end = (at + 4096).min(bytes.len());
                bytes[at..end].fill(0);
            };
            let what = format!("4 KiB zeroed at {at}");
            assert_survives(&files, &expected, copy, &zero, at % 2048 == 0, &what);
        }
        for at in (0..len).step_by(SLOT_BYTES * 7) {
            let cut = move |bytes: &mut Vec<u8>| bytes.truncate(at);
            assert_survives(&files, &expected, copy, &cut, true, &format!("cut at {at}"));
        }
    }
}

#[test]
fn a_misdirected_write_in_either_copy_never_rolls_a_group_back() {
    let (dir, expected) = written_table(10);
    let files = read_files(dir.path());
    // The header and every slot, each copied over every other.
    let blocks = files[0].len() / SLOT_BYTES;
    for copy in 0..2 {
        for from in 0..blocks {
            for to in (0..blocks).filter(|to| *to != from) {
                let misdirect = move |bytes: &mut Vec<u8>| {
                    let block = bytes[from * SLOT_BYTES..(from + 1) * SLOT_BYTES].to_vec();
                    bytes[to * SLOT_BYTES..(to + 1) * SLOT_BYTES].copy_from_slice(&block);
                };
                let what = format!("block {from} written over block {to}");
                assert_survives(&files, &expected, copy, &misdirect, from == 0, &what);
            }
        }
    }
    // A write lost in copy 0 (its older slot still there), copy 1 intact: newest.
    let dir = tempfile::tempdir().unwrap();
    let mut states = GroupStates::open(dir.path(), 0, boot()).unwrap();
    states.stage(1, state(1, 1));
    states.stage(2, state(1, 2));
    states.write_staged().unwrap();
    let older = read_files(dir.path());
    states.stage(2, state(2, 2));
    states.write_staged().unwrap();
    let newer = read_files(dir.path());
    let reopened = GroupStates::open(
        with_files(&[older[0].clone(), newer[1].clone()]).path(),
        0,
        boot(),
    )
    .unwrap();
    assert_eq!(reopened.get(2), Some(state(2, 2)));
}

#[test]
fn a_slot_damaged_in_both_copies_names_its_group_and_never_an_older_state() {
    let (dir, expected) = written_table(12);
    let files = read_files(dir.path());
    let states = GroupStates::open(dir.path(), 0, boot()).unwrap();
    let group = 8;
    let at = slot_offset(states.slot_of[&group]) as usize;
    drop(states);

    // The state damaged in both copies, the identity intact: the group is named.
    let mut damaged = files.clone();
    for bytes in &mut damaged {
        bytes[at + STATE_AT + 20] ^= 4;
    }
    let dir = with_files(&damaged);
    let mut states = GroupStates::open(dir.path(), 0, boot()).unwrap();
    assert_eq!(states.damaged_groups(), &BTreeSet::from([group]));
    assert_eq!(states.get(group), None);
    let mut rest = expected.clone();
    rest.remove(&group);
    assert_eq!(states.states, rest);
    // Reopened, still damaged; staged again (a replica recovered from its peers),
    // proven again.
    assert_eq!(
        GroupStates::open(dir.path(), 0, boot())
            .unwrap()
            .damaged_groups(),
        &BTreeSet::from([group])
    );
    states.stage(group, state(9, 9));
    assert!(states.damaged_groups().is_empty());
    states.write_staged().unwrap();
    let states = GroupStates::open(dir.path(), 0, boot()).unwrap();
    assert!(states.damaged_groups().is_empty());
    assert_eq!(states.get(group), Some(state(9, 9)));

    // Zeroed in copy 0, the state damaged in copy 1: named by copy 1.
    let mut damaged = files.clone();
    damaged[0][at..at + SLOT_BYTES].fill(0);
    damaged[1][at + CHECKSUM_AT] ^= 1;
    let states = GroupStates::open(with_files(&damaged).path(), 0, boot()).unwrap();
    assert_eq!(states.damaged_groups(), &BTreeSet::from([group]));

    // Copy 1 missing and the slot damaged in copy 0: named, and still named once
    // open has rebuilt copy 1.
    let dir = with_files(&[damaged[1].clone(), Vec::new()]);
    std::fs::remove_file(dir.path().join("shard-0.1")).unwrap();
    let states = GroupStates::open(dir.path(), 0, boot()).unwrap();
    assert_eq!(states.damaged_groups(), &BTreeSet::from([group]));
    assert_eq!(states.states, rest);
    let states = GroupStates::open(dir.path(), 0, boot()).unwrap();
    assert_eq!(states.damaged_groups(), &BTreeSet::from([group]));

    // Zeroed in both copies: nothing says whose it was. Open reports it (a lone
    // replica refuses to start with it, naming the files and the offset), keeps the
    // slot out of use, and every later open finds it again, whatever is written.
    let mut damaged = files.clone();
    for bytes in &mut damaged {
        bytes[at..at + SLOT_BYTES].fill(0);
    }
    let dir = with_files(&damaged);
    let mut states = GroupStates::open(dir.path(), 0, boot()).unwrap();
    assert!(states.get(group).is_none() && states.damaged_groups().is_empty());
    let refused = states.unattributable().expect("reported");
    states.stage(group, state(9, 9));
    states.stage(1 << 40, state(1, 1));
    states.write_staged().unwrap();
    let states = GroupStates::open(dir.path(), 0, boot()).unwrap();
    assert_eq!(states.get(group), Some(state(9, 9)));
    assert_eq!(states.get(1 << 40), Some(state(1, 1)));
    assert_eq!(
        states.unattributable().map(|e| e.to_string()),
        Some(refused.to_string()),
        "still there"
    );
    assert!(
        matches!(refused, StatesError::Unattributable { .. }),
        "{refused}"
    );
    let message = refused.to_string();
    assert!(
        message.contains("shard-0.0") && message.contains("shard-0.1"),
        "{message}"
    );
    assert!(message.contains(&format!("offset {at}")), "{message}");

    // Copy 1 holds a newer write than copy 0 (whose write was lost) and it is
    // damaged: copy 0's older state is not served; the group is named.
    let dir = tempfile::tempdir().unwrap();
    let mut states = GroupStates::open(dir.path(), 0, boot()).unwrap();
    states.stage(1, state(1, 1));
    states.stage(2, state(1, 2));
    states.write_staged().unwrap();
    let older = read_files(dir.path());
    states.stage(2, state(2, 2));
    states.write_staged().unwrap();
    let mut newer = read_files(dir.path());
    let at = slot_offset(states.slot_of[&2]) as usize;
    newer[1][at + STATE_AT] ^= 1;
    let states = GroupStates::open(
        with_files(&[older[0].clone(), newer[1].clone()]).path(),
        0,
        boot(),
    )
    .unwrap();
    assert_eq!(states.get(2), None);
    assert_eq!(states.damaged_groups(), &BTreeSet::from([2]));
    assert_eq!(states.get(1), Some(state(1, 1)));
}

#[test]
fn a_missing_copy_is_rebuilt_and_both_missing_is_a_new_shard() {
    let (dir, expected) = written_table(12);
    let [zero, one] = paths(dir.path(), 0);
    for (gone, other) in [(&one, &zero), (&zero, &one)] {
        std::fs::remove_file(gone).unwrap();
        let states = GroupStates::open(dir.path(), 0, boot()).unwrap();
        assert!(!states.was_created());
        assert_eq!(states.states, expected);
        // Rebuilt whole: it alone now holds every group.
        std::fs::remove_file(other).unwrap();
        let states = GroupStates::open(dir.path(), 0, boot()).unwrap();
        assert!(!states.was_created());
        assert_eq!(states.states, expected);
    }
    // Both missing: a new shard, which the caller can tell from a lost one.
    std::fs::remove_file(&zero).unwrap();
    std::fs::remove_file(&one).unwrap();
    let states = GroupStates::open(dir.path(), 0, boot()).unwrap();
    assert!(states.was_created());
    assert_eq!(states.groups().count(), 0);
    assert!(!GroupStates::open(dir.path(), 0, boot())
        .unwrap()
        .was_created());
    // Both empty: damage, not a new shard.
    std::fs::write(&zero, b"").unwrap();
    std::fs::write(&one, b"").unwrap();
    assert!(matches!(
        GroupStates::open(dir.path(), 0, boot()),
        Err(StatesError::NoIntactCopy { .. })
    ));
}

/// A table written before the durable state's flags word holds 60-byte states in its
/// slots: it opens as before, and a lost disk (untrusted from op 0, as that layout said
/// it) stays lost.
#[test]
fn slots_of_the_first_state_layout_still_open() {
    let dir = tempfile::tempdir().unwrap();
    let kept = state(4, 9);
    let lost = DurableState {
        journal_trusted_through: 0,
        ..state(2, 0)
    };
    let mut states = GroupStates::open(dir.path(), 0, boot()).unwrap();
    states.stage(7, kept);
    states.stage(8, lost);
    states.write_staged().unwrap();
    drop(states);
    for path in paths(dir.path(), 0) {
        let mut bytes = std::fs::read(&path).unwrap();
        for slot in [1usize, 2] {
            let at = SLOT_BYTES * slot;
            let seq = be64(&bytes, at + 8);
            let old = if be64(&bytes, at + 16) == 7 {
                kept
            } else {
                lost
            };
            let region = &mut bytes[at + STATE_AT..at + CHECKSUM_AT];
            region.fill(0);
            region[..DurableState::ENCODED_BYTES_V1].copy_from_slice(&encode_v1(&old, seq));
            let sums = Sums::of_table(&table_name(dir.path(), 0));
            let sum = sums.checksum(&bytes[at..at + CHECKSUM_AT]);
            bytes[at + CHECKSUM_AT..at + SLOT_BYTES].copy_from_slice(&sum.to_be_bytes());
        }
        std::fs::write(&path, bytes).unwrap();
    }
    let states = GroupStates::open(dir.path(), 0, boot()).unwrap();
    assert_eq!(states.get(7), Some(kept));
    assert_eq!(
        states.get(8),
        Some(DurableState {
            views_lost: true,
            ..lost
        })
    );
}

/// The shell simulator's seed 1962 with misdirected writes: a page of a partitions
/// table written over the metadata table's copy 0 put that table's header and slots
/// there, whole and checksummed; its newer sequence numbers won, the metadata group
/// had no state, restarted from view 0, and an acknowledged stream creation was lost.
/// A table's sums are seeded with its name: another table's bytes are damage, and the
/// other copy is read.
#[test]
fn another_tables_page_over_a_copy_is_damage() {
    let root = tempfile::tempdir().unwrap();
    let ours_dir = root.path().join("metadata");
    let theirs_dir = root.path().join("replication");
    let mut ours = GroupStates::open(&ours_dir, 0, boot()).unwrap();
    ours.stage(0, state(3, 40));
    ours.write_staged().unwrap();
    drop(ours);
    let mut theirs = GroupStates::open(&theirs_dir, 0, boot()).unwrap();
    for round in 0..5 {
        theirs.stage(77, state(round, 1));
        theirs.write_staged().unwrap();
    }
    drop(theirs);
    let page = std::fs::read(theirs_dir.join("shard-0.1")).unwrap();
    std::fs::write(ours_dir.join("shard-0.0"), &page).unwrap();
    let ours = GroupStates::open(&ours_dir, 0, boot()).unwrap();
    assert_eq!(
        ours.get(0),
        Some(state(3, 40)),
        "our own state, from copy 1"
    );
    assert_eq!(ours.get(77), None, "nothing of the other table");
}

/// A table in the format before (`BRDVST03`, sums seeded with the magic alone) opens
/// as it was and is put in place in the current one.
#[test]
fn a_table_of_the_format_before_opens_and_is_upgraded() {
    let dir = tempfile::tempdir().unwrap();
    let mut states = GroupStates::open(dir.path(), 0, boot()).unwrap();
    states.stage(5, state(2, 9));
    states.stage(6, state(4, 1));
    states.write_staged().unwrap();
    drop(states);
    // Rewrite both copies as the format before would have.
    let old = Sums::unsalted();
    for path in paths(dir.path(), 0) {
        let mut bytes = std::fs::read(&path).unwrap();
        let count = be32(&bytes, 12);
        bytes[..HEADER_BYTES].copy_from_slice(&encode_header(count, old));
        for index in 0..count {
            let at = slot_offset(index) as usize;
            let SlotRead::Intact(seq, content) = decode_slot(
                index,
                &bytes[at..at + SLOT_BYTES],
                Sums::of_table(&table_name(dir.path(), 0)),
            ) else {
                panic!("slot {index} intact");
            };
            bytes[at..at + SLOT_BYTES].copy_from_slice(&encode_slot(index, seq, content, old));
        }
        std::fs::write(&path, bytes).unwrap();
        assert!(std::fs::read(&path).unwrap().starts_with(MAGIC_UNSALTED));
    }
    let states = GroupStates::open(dir.path(), 0, boot()).unwrap();
    assert_eq!(
        (states.get(5), states.get(6)),
        (Some(state(2, 9)), Some(state(4, 1)))
    );
    drop(states);
    for path in paths(dir.path(), 0) {
        assert!(std::fs::read(&path).unwrap().starts_with(MAGIC), "upgraded");
    }
    let states = GroupStates::open(dir.path(), 0, boot()).unwrap();
    assert_eq!(
        (states.get(5), states.get(6)),
        (Some(state(2, 9)), Some(state(4, 1)))
    );
}
