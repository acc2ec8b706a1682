//! Bytes that check but are not this log's: another partition's batches at the same
//! offsets (a misdirected write), and a synced tail lost with nothing intact after it.

use super::*;

const TAG: i32 = 0x0001_0000;
const OTHER_TAG: i32 = 0x0002_0000;

/// A log tagged `tag` in `dir` holding five synced batches; their positions.
fn tagged_log(dir: &Path, tag: i32) -> Vec<u64> {
    let mut log = PartitionLog::open_tagged(dir, tag, small_config(), 0).unwrap();
    let positions = five_batches(&mut log, Some(4));
    assert_eq!(log.tag(), tag);
    let read = log.read(0, 1 << 16, u64::MAX).unwrap();
    let (batch, _) = RecordBatch::check_stored(read.bytes(), tag).unwrap();
    assert_eq!(
        batch.header().partition_leader_epoch,
        tag,
        "stored with its tag"
    );
    positions
}

/// Two partitions given the same produces store batches alike but for their tags: a
/// page of one written over the other (the shell simulator's seeds 2562 and 3866, where
/// the member served another partition's records as acknowledged ones) is damage.
#[test]
fn another_partitions_batches_at_the_same_offsets_are_damage() {
    let (ours, theirs) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let positions = tagged_log(ours.path(), TAG);
    assert_eq!(tagged_log(theirs.path(), OTHER_TAG), positions);
    let (our_file, their_file) = (
        log_files(ours.path()).pop().unwrap(),
        log_files(theirs.path()).pop().unwrap(),
    );
    let mut bytes = std::fs::read(&our_file).unwrap();
    let their_bytes = std::fs::read(&their_file).unwrap();
    let (from, to) = (positions[2] as usize, positions[3] as usize);
    bytes[from..to].copy_from_slice(&their_bytes[from..to]);
    std::fs::write(&our_file, &bytes).unwrap();

    match PartitionLog::open_tagged(ours.path(), TAG, small_config(), 0) {
        Err(LogError::Corrupt { position, .. }) => assert_eq!(position, from as u64),
        other => panic!("expected Corrupt at {from}, got {other:?}"),
    }
    let config = LogConfig {
        recovery: RecoveryMode::TruncateAtDamage,
        ..small_config()
    };
    let mut log = PartitionLog::open_tagged(ours.path(), TAG, config, 0).unwrap();
    assert_eq!(log.recovery().damage_cut_at, Some(from as u64));
    assert_eq!(read_all(&mut log).len(), 4, "only the batches before it");

    // The other log's recovery point claims nothing here: without an intact batch
    // after the damage, the cut is a torn tail's again.
    std::fs::copy(
        theirs
            .path()
            .join(crate::recovery_point::RECOVERY_POINT_FILE),
        ours.path().join(crate::recovery_point::RECOVERY_POINT_FILE),
    )
    .unwrap();
    assert_eq!(
        RecoveryPoint::load(ours.path(), TAG),
        None,
        "another log's point is no point"
    );
}

/// Below the recovery point every byte was synced: a lost last page there is the
/// disk's damage, not a torn write, though nothing intact follows it. It used to be
/// cut as a torn tail, losing acknowledged records unseen.
#[test]
fn a_synced_tail_lost_with_nothing_after_it_is_refused_not_cut() {
    let dir = tempfile::tempdir().unwrap();
    let positions = tagged_log(dir.path(), TAG);
    let file = log_files(dir.path()).pop().unwrap();
    let mut bytes = std::fs::read(&file).unwrap();
    let from = positions[4] as usize;
    bytes[from..].fill(0);
    std::fs::write(&file, &bytes).unwrap();
    match PartitionLog::open_tagged(dir.path(), TAG, small_config(), 0) {
        Err(LogError::Corrupt { position, .. }) => assert_eq!(position, from as u64),
        other => panic!("expected Corrupt at {from}, got {other:?}"),
    }
    assert_eq!(std::fs::read(&file).unwrap(), bytes, "nothing was cut");
    let config = LogConfig {
        recovery: RecoveryMode::TruncateAtDamage,
        ..small_config()
    };
    let log = PartitionLog::open_tagged(dir.path(), TAG, config, 0).unwrap();
    assert_eq!(log.recovery().damage_cut_at, Some(from as u64));
    assert_eq!(log.next_offset(), 8);
}

/// A sector of a synced batch the disk can no longer read (a latent sector error) is
/// damage at that batch, not the end of the log and not a failed open: refused by a
/// lone log, cut as damage (for peers to repair) by a member's.
#[test]
fn an_unreadable_synced_sector_is_damage() {
    use crate::disk::hook;
    let dir = tempfile::tempdir().unwrap();
    let positions = tagged_log(dir.path(), TAG);
    let file = log_files(dir.path()).pop().unwrap();
    // A byte inside batch 3's sector: the whole 512-byte sector reads as zeros, so the
    // first batch it touches is the damaged one.
    let bad = positions[3] + 8;
    let sector = bad / 512 * 512;
    let damaged = positions.iter().rposition(|p| *p <= sector).unwrap();
    hook::install(hook::Plan::default());
    hook::mark_unreadable(&file, bad, bad + 1);
    let strict = PartitionLog::open_tagged(dir.path(), TAG, small_config(), 0);
    let config = LogConfig {
        recovery: RecoveryMode::TruncateAtDamage,
        ..small_config()
    };
    let member = PartitionLog::open_tagged(dir.path(), TAG, config, 0);
    let failed = hook::take().unwrap().failed;
    match strict {
        Err(LogError::Corrupt { position, .. }) => assert_eq!(position, positions[damaged]),
        other => panic!("expected Corrupt at {}, got {other:?}", positions[damaged]),
    }
    let member = member.unwrap();
    assert_eq!(member.recovery().damage_cut_at, Some(positions[damaged]));
    assert_eq!(member.next_offset(), 2 * damaged as u64);
    assert!(!failed.is_empty(), "the reads met the latent error");
}
