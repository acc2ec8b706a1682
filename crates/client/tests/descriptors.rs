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

/// A batch of one record, `value`, without a key.
fn record(value: &str) -> Vec<u8> {
    let mut builder = braid_proto::BatchBuilder::new(1_000);
    builder.push(None, Some(value.as_bytes()), &[], 1_000);
    builder.finish()
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
    let node = TestNode::start(FsyncSetting::Always);
    let client = Client::connect(node.addr()).await.unwrap();
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
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while common::metric(node.http_addr(), "braid_partition_files_slept_total").await
        < u64::from(partitions)
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the files never slept"
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;

    // Room for a few partitions' files at most: the rest cannot wake.
    let original = getrlimit(Resource::Nofile).current.unwrap();
    set_soft_limit(open_descriptors() + 4);
    let mut busy = 0;
    let mut stored = 0;
    for round in 0..4 {
        for partition in 0..partitions {
            let value = format!("p{partition} round {round}");
            match client.produce("s", "t", partition, &record(&value)).await {
                Ok(at) => {
                    stored += 1;
                    acknowledged[partition as usize].push((at.0, value));
                }
                // Refused for want of a descriptor (or, in flight when its group was
                // dropped, sent to ask again): never stored, never a stopped shard.
                Err(err) => {
                    let code = err.code();
                    assert!(
                        matches!(code, Some(ErrorCode::Busy | ErrorCode::NotLeader)),
                        "partition {partition}: {err}"
                    );
                    if code == Some(ErrorCode::Busy) {
                        busy += 1;
                        assert!(err.to_string().contains("ulimit -n"), "{err}");
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
    // stored between them (a refused produce stored nothing).
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
                (r.offset, value)
            })
            .collect();
        assert_eq!(
            held, acknowledged[partition as usize],
            "partition {partition}"
        );
    }
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
