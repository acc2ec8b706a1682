//! A log closed in this process and opened again by its holder, changing nothing: the
//! same log when nothing touched it, a refusal when anything did.

use super::*;

const TAG: i32 = 0x0003_0007;

/// A log of two segments (small segments) with batches in both, closed; its offsets
/// and the settings it was opened with.
fn closed_log(dir: &Path) -> ((u64, u64, u32), Arc<LogConfig>) {
    let config = Arc::new(small_config());
    let mut log = PartitionLog::open_tagged(dir, TAG, Arc::clone(&config), 0).unwrap();
    for i in 0..60 {
        log.append(batch_of(&records(2, i, 50, i as u8)), 0)
            .unwrap();
    }
    log.sync().unwrap();
    assert!(log.segment_count() > 2, "several segments");
    let shape = (log.start_offset(), log.next_offset(), log.segments_crc());
    log.close().unwrap();
    (shape, config)
}

fn reopen(
    dir: &Path,
    config: &Arc<LogConfig>,
    (start, next, segments): (u64, u64, u32),
) -> Result<PartitionLog, LogError> {
    PartitionLog::reopen_closed(
        Arc::from(dir),
        TAG,
        Arc::clone(config),
        0,
        (start, next),
        segments,
    )
}

#[test]
fn a_closed_log_opens_again_as_it_was_and_takes_writes() {
    let dir = tempfile::tempdir().unwrap();
    let (shape, config) = closed_log(dir.path());
    let (start, next, _) = shape;
    let before = decode(
        &PartitionLog::open_tagged(dir.path(), TAG, small_config(), 0)
            .unwrap()
            .read(start, 1 << 20, u64::MAX)
            .unwrap(),
    );
    // The open above found it clean and wrote nothing; close it again as it was.
    let log = PartitionLog::open_tagged(dir.path(), TAG, small_config(), 0).unwrap();
    log.close().unwrap();
    let mut log = reopen(dir.path(), &config, shape).unwrap();
    assert_eq!((log.start_offset(), log.next_offset()), (start, next));
    assert_eq!(log.durable_offset(), next);
    assert_eq!(decode(&log.read(start, 1 << 20, u64::MAX).unwrap()), before);
    let appended = log.append(batch_of(&records(3, 99, 10, 9)), 0).unwrap();
    assert_eq!(appended.base_offset, next);
    log.sync().unwrap();
    drop(log);
    // The marker went before the write: a crash now is recovered, not trusted.
    let log = PartitionLog::open_tagged(dir.path(), TAG, small_config(), 0).unwrap();
    assert!(!log.recovery().clean);
    assert_eq!(log.next_offset(), next + 3);
}

#[test]
fn a_closed_log_changed_at_rest_is_refused_not_repaired() {
    type Change = fn(&Path);
    let changes: [(&str, Change); 5] = [
        ("marker gone", |dir| {
            std::fs::remove_file(dir.join(crate::files::CLEAN_MARKER)).unwrap()
        }),
        ("newest segment cut", |dir| {
            let newest = log_files(dir).pop().unwrap();
            let len = std::fs::metadata(&newest).unwrap().len();
            let file = std::fs::OpenOptions::new()
                .write(true)
                .open(&newest)
                .unwrap();
            file.set_len(len - 10).unwrap();
        }),
        ("oldest segment gone", |dir| {
            std::fs::remove_file(crate::files::log_path(dir, 0)).unwrap();
        }),
        ("a middle segment gone", |dir| {
            std::fs::remove_file(&log_files(dir)[1]).unwrap();
        }),
        ("every segment gone", |dir| {
            for entry in std::fs::read_dir(dir).unwrap() {
                let path = entry.unwrap().path();
                if path.extension().is_some_and(|e| e == "log") {
                    std::fs::remove_file(path).unwrap();
                }
            }
        }),
    ];
    for (what, change) in changes {
        let dir = tempfile::tempdir().unwrap();
        let (shape, config) = closed_log(dir.path());
        change(dir.path());
        let listed = |dir: &Path| {
            let mut names: Vec<_> = std::fs::read_dir(dir)
                .unwrap()
                .map(|e| {
                    let e = e.unwrap();
                    (e.file_name(), e.metadata().unwrap().len())
                })
                // Index files are derived: an open drops those whose segment is gone.
                .filter(|(name, _)| !name.to_string_lossy().ends_with("index"))
                .collect();
            names.sort();
            names
        };
        let files_before = listed(dir.path());
        match reopen(dir.path(), &config, shape) {
            Err(LogError::NotAsClosed { .. }) => {}
            other => panic!("{what}: {other:?}"),
        }
        assert_eq!(
            listed(dir.path()),
            files_before,
            "{what}: no segment or marker changed"
        );
    }
}
