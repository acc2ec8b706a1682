//! A node out of file descriptors: a real node in-process, on port 0, in a test binary
//! of its own (it lowers the process's descriptor limit, which every thread shares).

// A panic in a test is a failed assertion, not a crash on outside data.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use braid_client::Client;
use braid_node::FsyncSetting;
use braid_proto::client::ErrorCode;
use common::TestNode;
use rustix::process::{getrlimit, setrlimit, Resource};

/// A batch of one record, `value` and 6 KB of padding, without a key: large enough
/// that each batch adds entries to its segment's index, which a partition's release
/// writes (one more file opened).
fn record(value: &str) -> Vec<u8> {
    let mut builder = braid_proto::BatchBuilder::new(1_000);
    builder.push(None, Some(padded(value).as_bytes()), &[], 1_000);
    builder.finish()
}

fn padded(value: &str) -> String {
    format!("{value} {}", ".".repeat(6_000))
}

/// The descriptors this process has open.
fn open_descriptors() -> u64 {
    std::fs::read_dir("/proc/self/fd").unwrap().count() as u64
}

/// Sets this process's soft descriptor limit.
fn set_soft_limit(soft: u64) {
    let mut limit = getrlimit(Resource::Nofile);
    limit.current = Some(soft);
    setrlimit(Resource::Nofile, limit).unwrap();
}

/// An outside review of issue 24: a sleeping partition woken when the process had no
/// descriptor left was taken for one whose files changed, and the open that followed,
/// refused a descriptor too, stopped every partition of its shard until a restart.
/// Now each partition that cannot open its files answers `Busy` and is opened again
/// when it can be; nothing else stops, nothing acknowledged is lost, and once
/// descriptors are free every partition takes writes again, with no restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_out_of_descriptors_answers_busy_and_recovers_without_a_restart() {
    // A small budget of open logs, so that partitions' files are also released and
    // opened again while in use (a sync, an index written), not only woken.
    let dir = tempfile::tempdir().unwrap();
    let mut config = common::config(dir.path(), FsyncSetting::Always);
    config.open_logs_per_shard = 4;
    let node = TestNode {
        node: Some(braid_node::Node::start(config).unwrap()),
        dir,
    };
    let client = Client::connect(node.addr()).await.unwrap();
    let other = Client::connect(node.addr()).await.unwrap();
    let partitions = 24;
    common::create_topic(&client, "s", "t", partitions).await;
    let mut acknowledged: Vec<Vec<(u64, String)>> = vec![Vec::new(); partitions as usize];
    for partition in 0..partitions {
        let value = format!("p{partition} first");
        let stored = client
            .produce("s", "t", partition, &record(&value))
            .await
            .unwrap();
        acknowledged[partition as usize].push((stored.0, value));
    }
    // Idle, every partition's files go to sleep (a pass a second).
    common::until_files_slept(&node, partitions).await;
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;

    // Room for a few partitions' files at most: the rest cannot wake.
    let original = getrlimit(Resource::Nofile).current.unwrap();
    set_soft_limit(open_descriptors() + 4);
    let mut busy = 0;
    let mut stored = 0;
    // Values answered `NotLeader` (in flight when their group was dropped): in doubt,
    // as after a crash, so they may be stored; anything else answered is not.
    let mut in_doubt = std::collections::BTreeSet::new();
    for round in 0..4 {
        for partition in 0..partitions {
            let value = format!("p{partition} round {round}");
            // Two producers at once, each on its own partition.
            let (mine, theirs) = (record(&value), record(&format!("{value} other")));
            let sent = tokio::join!(
                client.produce("s", "t", partition, &mine),
                other.produce("s", "t", (partition + 1) % partitions, &theirs),
            );
            for (at_partition, value, result) in [
                (partition, value.clone(), sent.0),
                (
                    (partition + 1) % partitions,
                    format!("{value} other"),
                    sent.1,
                ),
            ] {
                match result {
                    Ok(at) => {
                        stored += 1;
                        acknowledged[at_partition as usize].push((at.0, value));
                    }
                    // Refused for want of a descriptor before anything was done, or in
                    // flight when its group was dropped: never a stopped shard.
                    Err(err) => {
                        let code = err.code();
                        assert!(
                            matches!(code, Some(ErrorCode::Busy | ErrorCode::NotLeader)),
                            "partition {at_partition}: {err}"
                        );
                        if code == Some(ErrorCode::Busy) {
                            busy += 1;
                            assert!(err.to_string().contains("ulimit -n"), "{err}");
                        } else {
                            in_doubt.insert(value);
                        }
                    }
                }
            }
        }
    }
    set_soft_limit(original);
    assert!(
        busy > 0,
        "no produce was refused a descriptor ({stored} stored)"
    );

    // Descriptors free, every partition takes writes again within a second or so.
    for partition in 0..partitions {
        let value = format!("p{partition} last");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            match client.produce("s", "t", partition, &record(&value)).await {
                Ok(at) => {
                    acknowledged[partition as usize].push((at.0, value));
                    break;
                }
                Err(err) => {
                    assert!(
                        matches!(err.code(), Some(ErrorCode::Busy | ErrorCode::NotLeader)),
                        "partition {partition}: {err}"
                    );
                    assert!(
                        std::time::Instant::now() < deadline,
                        "partition {partition} never took writes again: {err}"
                    );
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                }
            }
        }
    }
    // Every acknowledged record is where it was acknowledged, and nothing else is
    // stored but what was in doubt (a produce refused `Busy` stored nothing).
    for partition in 0..partitions {
        let fetched = client
            .fetch("s", "t", partition, 0, 1 << 20, 0)
            .await
            .unwrap();
        let mut records = std::collections::VecDeque::new();
        braid_client::decode_records(0, 0, &fetched.batches, &mut records).unwrap();
        let held: Vec<(u64, String)> = records
            .iter()
            .map(|r| {
                let value = String::from_utf8(r.value.clone().unwrap().to_vec()).unwrap();
                let value = value.trim_end_matches('.').trim_end().to_owned();
                (r.offset, value)
            })
            .collect();
        let held: std::collections::BTreeMap<u64, String> = held.into_iter().collect();
        for (offset, value) in &acknowledged[partition as usize] {
            assert_eq!(held.get(offset), Some(value), "partition {partition}");
        }
        let acked: std::collections::BTreeSet<&String> = acknowledged[partition as usize]
            .iter()
            .map(|(_, value)| value)
            .collect();
        for value in held.values() {
            assert!(
                acked.contains(value) || in_doubt.contains(value),
                "partition {partition}: {value} stored though answered Busy"
            );
        }
    }
    assert_eq!(
        common::metric(node.http_addr(), "braid_shards_stopped").await,
        0
    );
    assert!(
        common::metric(
            node.http_addr(),
            "braid_partition_opens_without_descriptors_total"
        )
        .await
            > 0
    );
    assert_eq!(
        common::metric(node.http_addr(), "braid_partitions_refused").await,
        0
    );
}
