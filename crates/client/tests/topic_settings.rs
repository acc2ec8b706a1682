//! Topic settings against a real node, in process on port 0: every numeric setting of
//! CreateTopic is checked against its range, and "keep forever" keeps every segment
//! through retention passes.

// A panic in a test is a failed assertion, not a crash on outside data.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::{Duration, Instant};

use braid_client::Client;
use braid_node::{FsyncSetting, Node};
use braid_proto::client::{
    ErrorCode, TopicSettings, FSYNC_INTERVAL, FSYNC_INTERVAL_MS_MAX, RETENTION_BYTES_MAX,
    RETENTION_FOREVER, RETENTION_MS_MAX,
};

/// A batch of `records` records of 200 bytes, stamped in 1970: older than any
/// retention age but forever.
fn old_batch(records: usize) -> Vec<u8> {
    let mut builder = braid_proto::BatchBuilder::new(1_000);
    let value = vec![7u8; 200];
    for _ in 0..records {
        builder.push(None, Some(&value), &[], 1_000);
    }
    builder.finish()
}

/// One partition, 4 KiB segments, and `retention_ms`.
fn small_segments(retention_ms: u64) -> TopicSettings {
    TopicSettings {
        partitions: 1,
        retention_ms,
        segment_bytes: 4096,
        max_batch_bytes: 2048,
        ..TopicSettings::default()
    }
}

/// `retention_ms` of 2^63 or more was accepted, wrapped negative in the retention pass,
/// and the first pass deleted every sealed segment. Now 2^64 - 1 is the one explicit
/// "keep forever", which keeps every segment, and every other value beyond 100 years
/// (2^63 among them) is refused with InvalidArgument, as is a sync interval of
/// 2^64 - 1 ms.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_beyond_100_years_is_refused_and_forever_keeps_every_segment() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = common::config(dir.path(), FsyncSetting::Always);
    config.retention_check_ms = 50;
    let node = Node::start(config).unwrap();
    let client = Client::connect(node.client_addr()).await.unwrap();
    client.create_stream("s").await.unwrap();

    let refused = |settings: TopicSettings, field: &'static str| {
        let client = &client;
        async move {
            let err = client
                .create_topic("s", "refused", settings)
                .await
                .unwrap_err();
            assert_eq!(err.code(), Some(ErrorCode::InvalidArgument), "{settings:?}");
            assert!(err.to_string().contains(field), "{err}");
        }
    };
    for retention_ms in [
        1 << 63,
        (1 << 63) + 1,
        RETENTION_FOREVER - 1,
        RETENTION_MS_MAX + 1,
    ] {
        refused(small_segments(retention_ms), "retention_ms").await;
    }
    refused(
        TopicSettings {
            retention_bytes: RETENTION_BYTES_MAX + 1,
            ..small_segments(0)
        },
        "retention_bytes",
    )
    .await;
    // A segment smaller than the batches the topic takes names both values (the
    // default max_batch_bytes with small segments: an outside review of issue 24 was
    // told only the rules).
    refused(
        TopicSettings {
            max_batch_bytes: 0,
            ..small_segments(0)
        },
        "must not exceed segment_bytes 4096",
    )
    .await;
    refused(
        TopicSettings {
            segment_bytes: 100,
            ..small_segments(0)
        },
        "segment_bytes",
    )
    .await;
    for fsync_interval_ms in [u64::MAX, FSYNC_INTERVAL_MS_MAX + 1] {
        refused(
            TopicSettings {
                fsync: FSYNC_INTERVAL,
                fsync_interval_ms,
                ..small_segments(0)
            },
            "fsync_interval_ms",
        )
        .await;
    }
    assert_eq!(
        client
            .describe_topic("s", "refused")
            .await
            .unwrap_err()
            .code(),
        Some(ErrorCode::TopicNotFound)
    );
    // The connection is still good after the refusals.
    client.ping().await.unwrap();

    client
        .create_topic("s", "forever", small_segments(RETENTION_FOREVER))
        .await
        .unwrap();
    client
        .create_topic("s", "brief", small_segments(1))
        .await
        .unwrap();
    let forever = client.describe_topic("s", "forever").await.unwrap();
    assert_eq!(
        (
            forever.settings.retention_ms,
            forever.settings.retention_bytes
        ),
        (RETENTION_FOREVER, RETENTION_FOREVER),
        "no limit is reported in its explicit form"
    );
    assert_eq!(
        client
            .describe_topic("s", "brief")
            .await
            .unwrap()
            .settings
            .retention_ms,
        1
    );
    // Retention deletes only batches of ops its replication journal pruned (a
    // checkpoint every 1,024 ops, the 1,024 before it kept): "brief" gets past that.
    for (topic, batches) in [("forever", 20), ("brief", 2_200)] {
        for _ in 0..batches {
            client.produce("s", topic, 0, &old_batch(4)).await.unwrap();
        }
    }

    // Retention passes run (they trim the topic that keeps 1 ms) ...
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let brief = client.describe_topic("s", "brief").await.unwrap();
        if brief.partitions[0].start_offset > 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no retention pass trimmed {brief:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    // ... and the topic kept forever lost nothing.
    let forever = client.describe_topic("s", "forever").await.unwrap();
    assert_eq!(
        (
            forever.partitions[0].start_offset,
            forever.partitions[0].high_watermark
        ),
        (0, 80)
    );
    let read = client
        .fetch("s", "forever", 0, 0, 1 << 20, 0)
        .await
        .unwrap();
    assert_eq!(read.start_offset, 0);
    assert!(!read.batches.is_empty());
    node.shutdown();
}
