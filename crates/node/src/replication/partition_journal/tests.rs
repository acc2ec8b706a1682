use super::*;
use braid_proto::{BatchBuilder, ValidatedBatch};
use braid_storage::disk::hook;

mod sleep;

/// A batch of `n` records whose values name `tag`.
fn batch(tag: &str, n: usize) -> Vec<u8> {
    let mut builder = BatchBuilder::new(1_000);
    for i in 0..n {
        builder.push(
            Some(tag.as_bytes()),
            Some(format!("{tag}-{i}").as_bytes()),
            &[],
            1_000,
        );
    }
    canonical(builder.finish())
}

fn prepare(
    op: u64,
    view: u64,
    parent: Checksum,
    operation: Operation,
    body: impl Into<bytes::Bytes>,
) -> Prepare {
    let body = body.into();
    let header = Header {
        group: 7,
        view,
        op,
        commit: 0,
        parent,
        body_checksum: checksum(&body),
        session: 1,
        request: op,
        operation,
        checksum: 0,
    }
    .seal();
    Prepare { header, body }
}

/// Op 1 a register (kept whole), then ops 2..=n batches of 1 to 3 records.
fn chain(n: u64, view: u64, tag: &str) -> Vec<Prepare> {
    let mut out = Vec::new();
    let mut parent = Header::root(7).checksum;
    for op in 1..=n {
        let p = if op == 1 {
            prepare(
                op,
                view,
                parent,
                Operation::Register,
                9u64.to_be_bytes().to_vec(),
            )
        } else {
            let records = (op % 3 + 1) as usize;
            prepare(
                op,
                view,
                parent,
                Operation::Request,
                batch(&format!("{tag}{op}"), records),
            )
        };
        parent = p.header.checksum;
        out.push(p);
    }
    out
}

/// The group of the tested journals (their prepares' headers name it).
const GROUP: u64 = 7;

/// The partition tag of the tested journals' logs (not 0, a plain log's).
const TAG: i32 = 0x0003_0001;

/// `fsync = always`: every write reported is synced first.
fn config() -> LogConfig {
    LogConfig {
        fsync: braid_storage::FsyncPolicy::Always,
        ..LogConfig::default()
    }
}

/// As a member of a cluster opens it (damage cut, for peers to repair); a lone
/// replica's strict open, which cuts nothing once it finds damage, is opened with
/// [`config`] where a test means it.
fn open(dir: &Path) -> (PartitionJournal, Recovered) {
    PartitionJournal::open(dir, GROUP, TAG, member_config(), 0).unwrap()
}

/// [`config`] as a member of a cluster opens its logs: damage is cut there, for peers
/// to repair.
fn member_config() -> LogConfig {
    LogConfig {
        recovery: braid_storage::RecoveryMode::TruncateAtDamage,
        ..config()
    }
}

fn prepares(recovered: &Recovered) -> Vec<Prepare> {
    recovered
        .slots
        .iter()
        .filter_map(|(_, s)| match s {
            JournalSlot::Prepare(p) => Some(p.clone()),
            _ => None,
        })
        .collect()
}

/// The canonical batches the log holds, in order.
fn log_batches(journal: &mut PartitionJournal) -> Vec<Vec<u8>> {
    let log = journal.log();
    let mut out = Vec::new();
    let mut at = log.start_offset();
    while at < log.next_offset() {
        let read = log.read(at, 1, u64::MAX).unwrap();
        let batch = first_batch(read.bytes()).unwrap().to_vec();
        at += read_records(&batch);
        out.push(canonical(batch));
    }
    out
}

fn batch_bodies(prepares: &[Prepare]) -> Vec<Vec<u8>> {
    prepares
        .iter()
        .filter(|p| p.header.operation == Operation::Request)
        .map(|p| p.body.to_vec())
        .collect()
}

#[test]
fn batches_are_the_log_and_come_back_with_their_headers_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let ops = chain(20, 1, "a");
    let (mut journal, recovered) = open(dir.path());
    assert!(recovered.slots.is_empty());
    for (i, p) in ops.iter().enumerate() {
        journal.write_prepare(p, 0).unwrap();
        if i == 9 {
            // An idle partition closes its files; the next write opens them again.
            journal.release_files().unwrap();
        }
    }
    let written = journal.sync().unwrap();
    assert_eq!(
        written.len(),
        20,
        "every op reported written after the sync"
    );
    assert_eq!(journal.tip(), 20);
    // The log holds the batches, with the offsets it assigned and the partition's tag.
    let log = journal.log();
    let first = log.read(0, 1, u64::MAX).unwrap();
    let header = braid_proto::RecordBatch::check_stored(first.bytes(), TAG)
        .unwrap()
        .0;
    assert_eq!(header.header().partition_leader_epoch, TAG);
    assert_eq!(log_batches(&mut journal), batch_bodies(&ops));
    // A repair answer is read back from the log, canonical and whole.
    let asked = &ops[9];
    assert_eq!(
        journal.prepare(10, asked.header.checksum).unwrap().as_ref(),
        Some(asked)
    );
    assert_eq!(journal.prepare(10, 1).unwrap(), None, "another checksum");
    drop(journal);
    let (mut journal, recovered) = open(dir.path());
    assert_eq!(
        prepares(&recovered),
        ops,
        "the same prepares, chain and all"
    );
    assert_eq!(recovered.log_bytes_cut, 0);
    assert_eq!(journal.tip(), 20);
    assert_eq!(log_batches(&mut journal), batch_bodies(&ops));
}

#[test]
fn a_prepare_above_a_gap_waits_for_it_and_a_replaced_entry_cuts_the_log_back() {
    let dir = tempfile::tempdir().unwrap();
    let ops = chain(10, 1, "a");
    let (mut journal, _) = open(dir.path());
    for p in &ops[..5] {
        journal.write_prepare(p, 0).unwrap();
    }
    // Op 7 before op 6: held until 6 arrives.
    journal.write_prepare(&ops[6], 0).unwrap();
    let written: Vec<u64> = journal.sync().unwrap().iter().map(|w| w.0).collect();
    assert_eq!(written, vec![1, 2, 3, 4, 5]);
    journal.write_prepare(&ops[5], 0).unwrap();
    let written: Vec<u64> = journal.sync().unwrap().iter().map(|w| w.0).collect();
    assert_eq!(written, vec![6, 7]);
    for p in &ops[7..] {
        journal.write_prepare(p, 0).unwrap();
    }
    journal.sync().unwrap();
    // A new view chose another op 6: 6 and everything above it go, log included.
    let other = chain(6, 2, "b");
    let replaced = prepare(
        6,
        2,
        ops[4].header.checksum,
        Operation::Request,
        other[5].body.clone(),
    );
    journal.write_prepare(&replaced, 0).unwrap();
    let written: Vec<u64> = journal.sync().unwrap().iter().map(|w| w.0).collect();
    assert_eq!(written, vec![6]);
    assert_eq!(journal.tip(), 6);
    let mut expected: Vec<Prepare> = ops[..5].to_vec();
    expected.push(replaced.clone());
    assert_eq!(log_batches(&mut journal), batch_bodies(&expected));
    drop(journal);
    let (mut journal, recovered) = open(dir.path());
    assert_eq!(prepares(&recovered), expected);
    assert_eq!(log_batches(&mut journal), batch_bodies(&expected));
}

#[test]
fn a_header_that_names_another_body_cuts_and_a_prune_keeps_the_log_end() {
    let dir = tempfile::tempdir().unwrap();
    let ops = chain(12, 1, "a");
    let (mut journal, _) = open(dir.path());
    for p in &ops {
        journal.write_prepare(p, 0).unwrap();
    }
    journal.sync().unwrap();
    // The same header at op 4 keeps its body; another one cuts 4 and above.
    journal.write_header(&ops[3].header).unwrap();
    assert_eq!(journal.tip(), 12);
    let stranger = prepare(
        9,
        2,
        ops[7].header.checksum,
        Operation::Request,
        batch("x", 1),
    );
    journal.write_header(&stranger.header).unwrap();
    assert_eq!(journal.tip(), 8);
    journal.prune(5).unwrap();
    journal.sync().unwrap();
    drop(journal);
    let (mut journal, recovered) = open(dir.path());
    let ops_held: Vec<u64> = recovered.slots.iter().map(|(op, _)| *op).collect();
    assert_eq!(ops_held, vec![6, 7, 8, 9]);
    assert_eq!(recovered.slots[3].1, JournalSlot::Header(stranger.header));
    assert_eq!(journal.tip(), 8);
    assert_eq!(log_batches(&mut journal), batch_bodies(&ops[..8]));
    // A batch appended without its header (a crash between the two) is cut at open.
    let stray = ValidatedBatch::new(batch("stray", 2)).unwrap();
    journal.log().append(stray, 0).unwrap();
    journal.log().sync().unwrap();
    drop(journal);
    let (mut journal, recovered) = open(dir.path());
    assert!(recovered.log_bytes_cut > 0);
    assert_eq!(log_batches(&mut journal), batch_bodies(&ops[..8]));
    // After a prune that took every batch entry, the recorded log end still cuts.
    journal.prune(8).unwrap();
    journal.sync().unwrap();
    let stray = ValidatedBatch::new(batch("stray", 2)).unwrap();
    journal.log().append(stray, 0).unwrap();
    journal.log().sync().unwrap();
    drop(journal);
    let (mut journal, recovered) = open(dir.path());
    assert!(recovered.log_bytes_cut > 0, "{recovered:?}");
    assert_eq!(log_batches(&mut journal), batch_bodies(&ops[..8]));
}

/// What the journal's steps are in the crash workload.
#[derive(Debug, Clone)]
enum Step {
    Write(Prepare),
    Header(Header),
    Truncate(u64),
    Prune(u64),
    Sync,
}

fn workload() -> Vec<Step> {
    let ops = chain(14, 1, "a");
    let mut steps = Vec::new();
    for (i, p) in ops[..10].iter().enumerate() {
        steps.push(Step::Write(p.clone()));
        if i % 3 == 2 {
            steps.push(Step::Sync);
        }
    }
    steps.push(Step::Sync);
    // A view change replaces op 8, then op 9 comes without its body.
    let other = chain(9, 2, "b");
    let replaced = prepare(
        8,
        2,
        ops[6].header.checksum,
        Operation::Request,
        other[7].body.clone(),
    );
    let headless = prepare(
        9,
        2,
        replaced.header.checksum,
        Operation::Request,
        other[8].body.clone(),
    );
    steps.push(Step::Write(replaced));
    steps.push(Step::Header(headless.header));
    steps.push(Step::Sync);
    steps.push(Step::Write(headless));
    steps.push(Step::Prune(4));
    steps.push(Step::Sync);
    steps.push(Step::Truncate(8));
    steps.push(Step::Sync);
    steps
}

fn run(journal: &mut PartitionJournal, step: &Step) {
    match step {
        Step::Write(p) => journal.write_prepare(p, 0).unwrap(),
        Step::Header(h) => journal.write_header(h).unwrap(),
        Step::Truncate(op) => journal.truncate(*op).unwrap(),
        Step::Prune(op) => journal.prune(*op).unwrap(),
        Step::Sync => {
            journal.sync().unwrap();
        }
    }
}

/// The slots a clean run of the first `steps` steps reopens to.
fn model(steps: usize) -> Vec<(u64, JournalSlot)> {
    let dir = tempfile::tempdir().unwrap();
    let (mut journal, _) = open(dir.path());
    for step in workload().iter().take(steps) {
        run(&mut journal, step);
    }
    journal.sync().unwrap();
    drop(journal);
    open(dir.path()).1.slots
}

/// Cut at every sync boundary every way the POSIX model allows: the journal reopens
/// to the slots of some state between the last sync and the next (a slot may be
/// damaged where the cut hid which of the two landed, never absent), and the log holds
/// exactly the batches of its contiguous prepares.
#[test]
fn every_crash_state_reopens_to_a_synced_state_or_a_later_one() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("p");
    let steps = workload();
    let models: Vec<_> = (0..=steps.len()).map(model).collect();
    hook::start_tracing();
    // (trace length when a sync returned, steps run by then)
    let mut syncs = Vec::new();
    {
        let (mut journal, _) = open(&dir);
        syncs.push((hook::trace_len(), 0));
        for (i, step) in steps.iter().enumerate() {
            run(&mut journal, step);
            if matches!(step, Step::Sync) {
                syncs.push((hook::trace_len(), i + 1));
            }
        }
    }
    let trace = hook::take().unwrap().trace;
    let checked =
        braid_storage::crash::for_each_crash_state(&trace, root.path(), |at, how, out| {
            let Some(index) = syncs.iter().rposition(|(events, _)| *events <= at) else {
                return;
            };
            let synced = syncs[index].1;
            let next = syncs.get(index + 1).map_or(steps.len(), |s| s.1);
            // As a member opens it: a lone replica refuses a group with a damaged slot
            // and cuts nothing.
            let (mut journal, recovered) =
                PartitionJournal::open(&out.join("p"), GROUP, TAG, member_config(), 0)
                    .unwrap_or_else(|e| panic!("cut at {at}, {how}: {e}"));
            let fits = (synced..=next).any(|r| {
                let model = &models[r];
                model.len() >= recovered.slots.len().saturating_sub(1)
                    && model.iter().all(|(op, slot)| {
                        recovered
                            .slots
                            .iter()
                            .any(|(o, s)| o == op && (s == slot || *s == JournalSlot::Damaged))
                            || recovered.slots.iter().all(|(o, _)| o < op)
                    })
                    && recovered.slots.iter().all(|(o, s)| {
                        *s == JournalSlot::Damaged
                            || models[synced..=next]
                                .iter()
                                .any(|m| m.iter().any(|(mo, ms)| mo == o && ms == s))
                    })
            });
            assert!(
                fits,
                "cut at {at}, {how}: {:?} fits no state between steps {synced} and {next}",
                recovered.slots.iter().map(|(o, _)| *o).collect::<Vec<_>>()
            );
            // Every op the last sync reported is held, unless a step after it removed it.
            let removed_later = steps[synced..next]
                .iter()
                .any(|s| matches!(s, Step::Write(_) | Step::Header(_) | Step::Truncate(_)));
            if !removed_later {
                for (op, _) in &models[synced] {
                    assert!(
                        recovered.slots.iter().any(|(o, _)| o == op),
                        "cut at {at}, {how}: synced op {op} absent"
                    );
                }
            }
            // The log holds exactly the batches of the prepares up to the tip.
            let tip = journal.tip();
            let held: Vec<Prepare> = recovered
                .slots
                .iter()
                .filter(|(o, _)| *o <= tip)
                .filter_map(|(_, s)| match s {
                    JournalSlot::Prepare(p) => Some(p.clone()),
                    _ => None,
                })
                .collect();
            let log = log_batches(&mut journal);
            assert!(
                log.ends_with(&batch_bodies(&held)),
                "cut at {at}, {how}: the log's tail is not the held batches"
            );
        });
    assert!(checked > 30, "{checked} crash states");
}

/// Off the shard: a sync reports only what was written before it began, and none of
/// the ops a cut made while it ran removed (their entries are gone or newer than it).
#[test]
fn an_off_thread_sync_reports_what_it_covers_and_nothing_a_later_cut_removed() {
    let dir = tempfile::tempdir().unwrap();
    let ops = chain(6, 1, "a");
    let (mut journal, _) = open(dir.path());
    journal.sync_off_thread();
    for p in &ops[..5] {
        journal.write_prepare(p, 0).unwrap();
    }
    assert!(
        journal.sync().unwrap().is_empty(),
        "reported by the job, not inline"
    );
    assert!(journal.has_unsynced());
    let first = journal.start_sync().unwrap().unwrap();
    assert!(!journal.has_unsynced());
    // While it runs, a new view replaces op 4 (and so cuts 5).
    let replaced = prepare(
        4,
        2,
        ops[2].header.checksum,
        Operation::Request,
        batch("b", 1),
    );
    journal.write_prepare(&replaced, 0).unwrap();
    for request in &first.requests {
        request.run().unwrap();
    }
    assert!(
        journal.finish_sync(first.id, Ok(())).unwrap().is_empty(),
        "reported once its marker is durable"
    );
    assert!(
        journal.has_unsynced(),
        "the marker waits for a sync of its own"
    );
    let second = journal.start_sync().unwrap().unwrap();
    for request in &second.requests {
        request.run().unwrap();
    }
    let reported: Vec<u64> = journal
        .finish_sync(second.id, Ok(()))
        .unwrap()
        .iter()
        .map(|w| w.0)
        .collect();
    assert_eq!(
        reported,
        vec![1, 2, 3],
        "4 and 5 were cut while the first ran"
    );
    let third = journal.start_sync().unwrap().unwrap();
    for request in &third.requests {
        request.run().unwrap();
    }
    let reported = journal.finish_sync(third.id, Ok(())).unwrap();
    assert_eq!(reported, vec![(4, replaced.header.checksum)]);
    assert!(!journal.has_unsynced());
    // A failed sync reports nothing and poisons the journal.
    journal
        .write_prepare(
            &prepare(
                5,
                2,
                replaced.header.checksum,
                Operation::Request,
                batch("c", 1),
            ),
            0,
        )
        .unwrap();
    let fourth = journal.start_sync().unwrap().unwrap();
    let failed = braid_storage::SyncError {
        kind: std::io::ErrorKind::Other,
        message: "the disk said no".into(),
    };
    assert!(journal.finish_sync(fourth.id, Err(failed)).is_err());
    assert!(journal.log().poisoned().is_some());
    drop(journal);
    let (_, recovered) = open(dir.path());
    let mut expected = ops[..3].to_vec();
    expected.push(replaced);
    assert_eq!(
        prepares(&recovered)[..4],
        expected[..],
        "what was reported is there"
    );
}

/// The ops after `after` up to `last`, chained: registers (no batch) below
/// `batches_from`, a batch each from there on.
fn registers_then_batches(after: &Prepare, batches_from: u64, last: u64) -> Vec<Prepare> {
    let mut parent = after.header.checksum;
    (after.header.op + 1..=last)
        .map(|op| {
            let (operation, body) = if op >= batches_from {
                (Operation::Request, batch("b", 2))
            } else {
                (Operation::Register, op.to_be_bytes().to_vec())
            };
            let p = prepare(op, 1, parent, operation, body);
            parent = p.header.checksum;
            p
        })
        .collect()
}

/// Copies `peer`'s log into `journal` in small chunks until the copy is done.
fn copy_all(journal: &mut PartitionJournal, peer: &mut PartitionJournal, end: u64) {
    for _ in 0..1_000 {
        let Some(from) = journal.behind().map(|t| t.cursor) else {
            return;
        };
        let read = peer.log().read(from, 100, end).unwrap();
        let start = peer.log().start_offset();
        match journal.copy_chunk(from, start, read.bytes(), 0).unwrap() {
            Copied::Done => return,
            Copied::Progress => {}
            Copied::Ignored | Copied::Nothing => panic!("a chunk for the copy was ignored"),
        }
    }
    panic!("the copy never finished");
}

/// The journal in `dir`, holding `ops` written and synced.
/// Damages `bytes` (a journal) at rest over its last synced record and the durable
/// marker after it: zeros from a sector's start (never over the magic and head) to
/// the end. A cut there may hide a reported op.
fn tear_over_a_marker(bytes: &mut [u8]) {
    let from = ((bytes.len() - 60) / 512 * 512).max(fresh_journal().len());
    bytes[from..].fill(0);
}

/// A journal file as its creation leaves it: the magic, and a head that claims
/// nothing synced (what the head says before the first sync's marker is written).
fn fresh_journal() -> Vec<u8> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(JOURNAL_FILE);
    drop(JournalFile::open(&path, GROUP).unwrap());
    std::fs::read(&path).unwrap()
}

fn holding(dir: &Path, ops: &[Prepare]) -> PartitionJournal {
    let (mut journal, _) = open(dir);
    for p in ops {
        journal.write_prepare(p, 0).unwrap();
    }
    journal.sync().unwrap();
    journal
}

/// A peer's journal holding `ops`, synced, with its directory and its log's end.
fn peer_holding(ops: &[Prepare]) -> (tempfile::TempDir, PartitionJournal, u64) {
    let dir = tempfile::tempdir().unwrap();
    let mut peer = holding(dir.path(), ops);
    let end = peer.log().next_offset();
    (dir, peer, end)
}

#[test]
fn a_checkpoint_beyond_the_log_is_copied_from_a_peer_and_a_crash_resumes_the_copy() {
    let ops = chain(30, 1, "a");
    let (_peer_dir, mut peer, end) = peer_holding(&ops);

    // This replica had ops 1 to 3, then installed a peer's checkpoint at op 30.
    let dir = tempfile::tempdir().unwrap();
    let (mut journal, _) = open(dir.path());
    for p in &ops[..3] {
        journal.write_prepare(p, 0).unwrap();
    }
    journal.sync().unwrap();
    journal
        .checkpointed(30, ops[29].header.checksum, end, 0)
        .unwrap();
    journal.prune(30).unwrap();
    assert_eq!(
        journal.behind(),
        Some(Transfer {
            op: 30,
            log_end: end,
            cursor: 0,
        }),
        "nothing was applied: the copy checks the log from its start"
    );
    // An op above the checkpoint waits for the copy.
    let next = prepare(
        31,
        1,
        ops[29].header.checksum,
        Operation::Request,
        batch("b", 2),
    );
    journal.write_prepare(&next, 0).unwrap();
    assert!(journal.tip() < 31);
    assert!(
        journal.sync().unwrap().is_empty(),
        "nothing above the copy is written"
    );
    // A stale chunk (not where the copy is) is ignored.
    assert_eq!(journal.copy_chunk(5, 0, &[], 0).unwrap(), Copied::Ignored);
    // A peer with nothing from the cursor on moves nothing: not progress, so the copy
    // waits and asks the next peer instead of asking again at once (seed 2356).
    assert_eq!(journal.copy_chunk(0, 0, &[], 0).unwrap(), Copied::Nothing);
    assert_eq!(journal.behind().map(|t| t.cursor), Some(0));
    // One chunk, then a crash: the copy resumes from where the log got to.
    let from = 0;
    let read = peer.log().read(from, 100, end).unwrap();
    assert_eq!(
        journal.copy_chunk(from, 0, read.bytes(), 0).unwrap(),
        Copied::Progress
    );
    drop(journal);
    let (mut journal, _) = open(dir.path());
    let resumed_at = journal.log().next_offset();
    assert!(resumed_at > 0);
    assert_eq!(
        journal.behind(),
        Some(Transfer {
            op: 30,
            log_end: end,
            cursor: resumed_at,
        }),
        "a restart resumes the copy"
    );
    copy_all(&mut journal, &mut peer, end);
    assert_eq!(journal.behind(), None);
    assert_eq!(log_batches(&mut journal), log_batches(&mut peer));
    // Ops above the checkpoint go in at the copied log's end.
    journal.write_prepare(&next, 0).unwrap();
    assert_eq!(journal.tip(), 31);
    assert_eq!(journal.log().next_offset(), end + 2);
    let written = journal.sync().unwrap();
    assert_eq!(written, vec![(31, next.header.checksum)]);
}

#[test]
fn a_copy_whose_start_the_peers_deleted_starts_the_log_again_at_theirs() {
    let dir = tempfile::tempdir().unwrap();
    let (mut journal, _) = open(dir.path());
    journal.checkpointed(10, 1, 500, 0).unwrap();
    journal.prune(10).unwrap();
    // The peers' logs start at 400 now: nothing below it exists anywhere.
    assert_eq!(
        journal.copy_chunk(0, 400, &[], 0).unwrap(),
        Copied::Progress
    );
    let log = journal.log();
    assert_eq!((log.start_offset(), log.next_offset()), (400, 400));
    let mut rest = batch("c", 100);
    set_base_offset(&mut rest, 400);
    set_partition_leader_epoch(&mut rest, TAG);
    assert_eq!(
        journal.copy_chunk(400, 400, &rest, 0).unwrap(),
        Copied::Done
    );
    assert_eq!(journal.log().next_offset(), 500);
    // A batch not where the log ends is refused, not appended.
    let dir = tempfile::tempdir().unwrap();
    let (mut journal, _) = open(dir.path());
    journal.checkpointed(5, 1, 50, 0).unwrap();
    let mut wrong = batch("d", 3);
    set_base_offset(&mut wrong, 7);
    set_partition_leader_epoch(&mut wrong, TAG);
    assert!(matches!(
        journal.copy_chunk(0, 0, &wrong, 0),
        Err(PartitionJournalError::Copy(_))
    ));
    assert_eq!(journal.log().next_offset(), 0);
    // So is another partition's batch where the log ends (its tag is not this one's).
    let mut theirs = batch("e", 3);
    set_partition_leader_epoch(&mut theirs, TAG + 1);
    assert!(matches!(
        journal.copy_chunk(0, 0, &theirs, 0),
        Err(PartitionJournalError::Copy(_))
    ));
    assert_eq!(journal.log().next_offset(), 0);
    // Peers whose start is past the checkpoint's end: the log starts at the end.
    assert_eq!(journal.copy_chunk(0, 80, &[], 0).unwrap(), Copied::Done);
    assert_eq!(journal.log().next_offset(), 50);
}

/// Ops 1..=5 of `committed`, then an old view's uncommitted ops 6..=9 chained on op 5
/// with batches of the same sizes as the committed ones (so the same offsets, other
/// records): what a primary cut off from its peers holds when it comes back.
fn divergent(committed: &[Prepare]) -> Vec<Prepare> {
    let mut out: Vec<Prepare> = committed[..5].to_vec();
    let mut parent = committed[4].header.checksum;
    for op in 6..=9u64 {
        let p = prepare(
            op,
            1,
            parent,
            Operation::Request,
            batch(&format!("x{op}"), (op % 3 + 1) as usize),
        );
        parent = p.header.checksum;
        out.push(p);
    }
    out
}

#[test]
fn a_transfer_replaces_an_old_views_suffix_from_the_first_batch_that_differs() {
    let ops = chain(30, 2, "a");
    let (_peer_dir, mut peer, end) = peer_holding(&ops);
    for applied in [0, 5] {
        let dir = tempfile::tempdir().unwrap();
        let (mut journal, _) = open(dir.path());
        for p in divergent(&ops) {
            journal.write_prepare(&p, 0).unwrap();
        }
        journal.sync().unwrap();
        if applied > 0 {
            let op = &ops[applied as usize - 1];
            journal.applied(op.header.op, op.header.checksum);
        }
        // Ops 6 to 9 here are as long as the committed ones: a copy from the log's
        // end would keep them and append the rest after.
        journal
            .checkpointed(30, ops[29].header.checksum, end, 0)
            .unwrap();
        copy_all(&mut journal, &mut peer, end);
        assert_eq!(
            journal.behind(),
            None,
            "applied {applied}: the copy finished"
        );
        assert_eq!(
            log_batches(&mut journal),
            log_batches(&mut peer),
            "applied {applied}: the old view's batches are gone"
        );
        // The checkpoint covers every op up to it: the finished copy prunes their
        // entries, so none can read as a hole below the batches appended next.
        assert_eq!(journal.index.pruned(), (30, Some(end)));
        assert_eq!(journal.prepare(5, ops[4].header.checksum).unwrap(), None);
    }
    // The checkpoint of an op this journal holds (the same checksum): nothing to copy.
    let dir = tempfile::tempdir().unwrap();
    let (mut journal, _) = open(dir.path());
    for p in &ops {
        journal.write_prepare(p, 0).unwrap();
    }
    journal.sync().unwrap();
    journal
        .checkpointed(30, ops[29].header.checksum, end, 0)
        .unwrap();
    assert_eq!(journal.behind(), None);
}

/// Issue 24, finding 9: with batches synced off the shard, a turn that only cuts the
/// journal (a view change's truncation, a new view's header) started no sync, so the
/// states table could hold the new log view while the cut was still in the page cache.
/// Now the turn's `sync` makes the cut durable before it returns: every crash state
/// after it reopens without the cut entries.
#[test]
fn a_cut_is_durable_when_the_turn_syncs_even_with_batches_synced_off_the_shard() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("p");
    let ops = chain(6, 1, "a");
    let other = chain(5, 2, "b");
    let new_view_header = prepare(
        5,
        2,
        ops[3].header.checksum,
        Operation::Request,
        other[4].body.clone(),
    )
    .header;
    hook::start_tracing();
    let synced_at;
    {
        let (mut journal, _) = open(&dir);
        journal.sync_off_thread();
        for p in &ops {
            journal.write_prepare(p, 0).unwrap();
        }
        let mut reported = 0;
        while let Some(job) = journal.start_sync().unwrap() {
            for request in &job.requests {
                request.run().unwrap();
            }
            reported += journal.finish_sync(job.id, Ok(())).unwrap().len();
        }
        assert_eq!(reported, 6, "reported once the marker is durable");
        // The view change: entries above 4 go, op 5 comes back as the new view's
        // header (its body to be repaired). Then the turn's sync, then the log view.
        journal.truncate(4).unwrap();
        journal.write_header(&new_view_header).unwrap();
        assert!(journal.sync().unwrap().is_empty());
        synced_at = hook::trace_len();
    }
    let checked = each_crash_state_after(root.path(), synced_at, config(), |cut, recovered| {
        for (op, slot) in &recovered.slots {
            let old = match slot {
                JournalSlot::Prepare(p) => p.header.view == 1 && *op > 4,
                JournalSlot::Header(h) => h.view == 1 && *op > 4,
                _ => false,
            };
            assert!(!old, "{cut}: the old view's op {op} is back");
        }
        assert!(
            recovered
                .slots
                .iter()
                .any(|(op, s)| *op == 5 && *s == JournalSlot::Header(new_view_header)),
            "{cut}: the new view's header at op 5 is lost"
        );
    });
    assert!(checked >= 1, "{checked} crash states");
}

/// The shell simulator's seed 7533 (damage at rest, four times the faults): a backup
/// installed a new view whose two newest ops came whole, and the turn wrote its state
/// with the new log view while their records and batches waited for a sync off the
/// shard. A power loss took them; the member restarted in that log view two ops short
/// and its vote dropped a committed batch. A turn whose state names a new log view
/// now makes the journal's records durable first: every crash state after the turn's
/// sync still knows the view's ops (their batches, if lost, are repaired from peers).
#[test]
fn a_new_log_views_whole_prepares_are_known_after_any_crash_once_the_turn_syncs() {
    use super::super::shard_host::Journal;
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("p");
    let ops = chain(6, 1, "a");
    hook::start_tracing();
    let synced_at;
    {
        let (mut journal, _) = open(&dir);
        journal.sync_off_thread();
        for p in &ops[..4] {
            journal.write_prepare(p, 0).unwrap();
        }
        while let Some(job) = journal.start_sync().unwrap() {
            for request in &job.requests {
                request.run().unwrap();
            }
            journal.finish_sync(job.id, Ok(())).unwrap();
        }
        // The new view's log brings ops 5 and 6 whole; the state names its log view.
        for p in &ops[4..] {
            journal.write_prepare(p, 0).unwrap();
        }
        Journal::log_view_rests_on_writes(&mut journal);
        assert!(
            journal.sync().unwrap().is_empty(),
            "reported later, off the shard"
        );
        synced_at = hook::trace_len();
    }
    let checked =
        each_crash_state_after(root.path(), synced_at, member_config(), |cut, recovered| {
            for op in [5, 6] {
                let header = match recovered.slots.iter().find(|(o, _)| *o == op) {
                    Some((_, JournalSlot::Prepare(p))) => p.header,
                    Some((_, JournalSlot::Header(h))) => *h,
                    other => panic!("{cut}: op {op} is {other:?}"),
                };
                assert_eq!(header, ops[op as usize - 1].header, "{cut}");
            }
        });
    assert!(checked >= 1, "{checked} crash states");
}

/// Issue 24, finding 1: a log that ends before its journal's tip (batches lost under
/// it) took the next batch at its own end, so one member stored later batches at
/// earlier offsets while every checksum still matched. The journal now refuses to
/// append anywhere but where its tip's batch ends.
#[test]
fn a_batch_never_goes_where_the_log_happens_to_end_only_where_its_op_belongs() {
    let dir = tempfile::tempdir().unwrap();
    let ops = chain(8, 1, "a");
    let (mut journal, _) = open(dir.path());
    for p in &ops[..6] {
        journal.write_prepare(p, 0).unwrap();
    }
    journal.sync().unwrap();
    let end = journal.log().next_offset();
    // The log loses its last batches beneath the journal.
    let (_, base) = journal.index.entry(5).map(|(h, b)| (*h, b)).unwrap();
    journal.log().truncate(base.unwrap()).unwrap();
    assert!(journal.log().next_offset() < end);
    let err = journal.write_prepare(&ops[6], 0).unwrap_err();
    assert!(
        matches!(err, PartitionJournalError::Misplaced { op: 7, tip: 6, tip_end, .. } if tip_end == end),
        "{err}"
    );
    assert_eq!(journal.tip(), 6, "nothing appended");
}

/// A committed op whose batch is stored elsewhere than the offsets the partition's
/// state gave it is caught at apply, before any record is served from there.
#[test]
fn a_committed_batch_stored_off_its_offsets_stops_the_partition() {
    let dir = tempfile::tempdir().unwrap();
    let ops = chain(4, 1, "a");
    let (mut journal, _) = open(dir.path());
    for p in &ops {
        journal.write_prepare(p, 0).unwrap();
    }
    journal.sync().unwrap();
    let base = journal.index.entry(3).and_then(|(_, b)| b).unwrap();
    let sum = ops[2].header.checksum;
    journal.check_placed(3, sum, base).unwrap();
    let err = journal.check_placed(3, sum, base + 1).unwrap_err();
    assert!(
        matches!(err, PartitionJournalError::Diverged { op: 3, stored, .. } if stored == Some(base)),
        "{err}"
    );
    // Another prepare committed at op 3 than the one whose batch the log holds there.
    let err = journal.check_placed(3, sum ^ 1, base).unwrap_err();
    assert!(
        matches!(err, PartitionJournalError::Diverged { op: 3, .. }),
        "{err}"
    );
    // A register has no batch.
    journal
        .check_placed(1, ops[0].header.checksum, 12_345)
        .unwrap();
}

/// The findings of the shell simulator (`replication::shell_sim`), each as a test.
mod findings;
mod misdirected;
mod past_a_hole;
mod retention;
mod transfer;
mod untrusted;

/// Reopens, with `config`, the journal at `root/p` as every crash at or after traced
/// event `from` (of the trace the test's hook took) leaves it, and hands each open's
/// findings to `check` with where the crash cut. Returns the states checked.
fn each_crash_state_after(
    root: &Path,
    from: usize,
    config: LogConfig,
    mut check: impl FnMut(&str, Recovered),
) -> usize {
    let trace = hook::take().unwrap().trace;
    braid_storage::crash::for_each_crash_state(&trace, root, |at, how, out| {
        if at < from {
            return;
        }
        let cut = format!("cut at {at}, {how}");
        let (_, recovered) = PartitionJournal::open(&out.join("p"), GROUP, TAG, config, 0)
            .unwrap_or_else(|e| panic!("{cut}: {e}"));
        check(&cut, recovered);
    })
}
