use super::*;

/// A commit beyond the high watermark is refused where this member knows it (a
/// single node, or the partition's primary), never because a backup lags.
#[test]
fn a_commit_is_checked_against_the_high_watermark_only_where_it_is_known() {
    let marks = |key: &crate::layout::PartitionKey| Some(10 * u64::from(key.partition + 1));
    let leads_0 = |key: &crate::layout::PartitionKey| key.partition == 0;
    // A single node knows every partition's mark.
    let err = refuse_commit_beyond(1, &[(1, 21)], false, marks, leads_0).unwrap_err();
    assert_eq!(err.code, ErrorCode::OffsetOutOfRange);
    refuse_commit_beyond(1, &[(1, 20)], false, marks, leads_0).unwrap();
    // In a cluster: refused on a partition this member leads ...
    let err = refuse_commit_beyond(1, &[(0, 11)], true, marks, leads_0).unwrap_err();
    assert_eq!(err.code, ErrorCode::OffsetOutOfRange);
    // ... and taken on one it backs up, whose mark here may lag the primary's.
    refuse_commit_beyond(1, &[(0, 10), (1, 25)], true, marks, leads_0).unwrap();
}
use crate::layout::TopicRoute;

fn log_config(stored: TopicSettings) -> braid_storage::LogConfig {
    TopicRoute {
        id: 1,
        name: "t".into(),
        settings: stored,
        partitions: Vec::new(),
    }
    .log_config(&crate::config::NodeConfig::default())
}

/// "Keep forever" on the wire (2^64 - 1) is stored as 0, as no limit always was,
/// reported back as 2^64 - 1, and reaches the log as no limit; the wire's 0 takes
/// the node's default, which may itself be forever.
#[test]
fn forever_is_stored_as_no_limit_and_reported_as_forever() {
    let week = 7 * 24 * 3600 * 1000;
    let defaults = TopicDefaults::default();
    assert_eq!(defaults.retention_ms, week);
    let new = |retention_ms, retention_bytes| TopicSettings {
        partitions: 1,
        retention_ms,
        retention_bytes,
        ..TopicSettings::default()
    };
    let stored = resolve_settings(new(RETENTION_FOREVER, RETENTION_FOREVER), &defaults);
    assert_eq!((stored.retention_ms, stored.retention_bytes), (0, 0));
    let reported = reported_settings(stored);
    assert_eq!(
        (reported.retention_ms, reported.retention_bytes),
        (RETENTION_FOREVER, RETENTION_FOREVER)
    );
    let log = log_config(stored);
    assert_eq!((log.retention_ms, log.retention_bytes), (None, None));

    let stored = resolve_settings(new(0, 0), &defaults);
    assert_eq!((stored.retention_ms, stored.retention_bytes), (week, 0));
    assert_eq!(log_config(stored).retention_ms, Some(week));
    assert_eq!(reported_settings(stored).retention_ms, week);

    for forever in [0, RETENTION_FOREVER] {
        let defaults = TopicDefaults {
            retention_ms: forever,
            retention_bytes: forever,
            ..TopicDefaults::default()
        };
        let stored = resolve_settings(new(0, 0), &defaults);
        assert_eq!((stored.retention_ms, stored.retention_bytes), (0, 0));
        let stored = resolve_settings(new(60_000, 1 << 30), &defaults);
        assert_eq!(
            (stored.retention_ms, stored.retention_bytes),
            (60_000, 1 << 30)
        );
        assert_eq!(log_config(stored).retention_ms, Some(60_000));
    }
    // A topic stored before the ranges were checked keeps its value, which the
    // log's arithmetic takes without wrapping.
    let legacy = new(1 << 63, 0);
    assert_eq!(log_config(legacy).retention_ms, Some(1 << 63));
    assert_eq!(
        log_config(new(RETENTION_FOREVER, 0)).retention_ms,
        None,
        "a forever stored as the wire form"
    );
}
