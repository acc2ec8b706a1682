//! What a node keeps when its disk loses things: a real node in-process, on port 0.

// A panic in a test is a failed assertion, not a crash on outside data.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use braid_client::Client;
use braid_node::{FsyncSetting, Node};
use common::TestNode;

fn batch(records: usize) -> Vec<u8> {
    let mut builder = braid_proto::BatchBuilder::new(1_000);
    for i in 0..records {
        builder.push(Some(b"k"), Some(format!("old {i}").as_bytes()), &[], 1_000);
    }
    builder.finish()
}

/// A node whose metadata was lost (its directory gone in a power cut, or deleted)
/// restarted its topic ids at 0, so the next new topic was served the old topic's
/// records from the partition directory still on disk. A directory that a start has
/// finished in now refuses to start without its metadata (issue 24, finding 13); one
/// from before that record (its identity without `initialized`) still starts, and its
/// topic ids start above every partition directory present.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_topic_never_gets_the_records_of_a_forgotten_one() {
    let mut node = TestNode::start(FsyncSetting::Always);
    let client = Client::connect(node.addr()).await.unwrap();
    common::create_topic(&client, "s", "old", 1).await;
    client.produce("s", "old", 0, &batch(3)).await.unwrap();
    drop(client);
    node.node.take().unwrap().shutdown();
    std::fs::remove_dir_all(node.dir.path().join("metadata")).unwrap();

    let config = common::config(node.dir.path(), FsyncSetting::Always);
    let refused = Node::start(config.clone()).unwrap_err().to_string();
    assert!(refused.contains("metadata/group-0.journal"), "{refused}");
    let identity = node.dir.path().join("identity");
    let older: String = std::fs::read_to_string(&identity)
        .unwrap()
        .lines()
        .filter(|l| !l.contains("initialized"))
        .map(|l| format!("{l}\n"))
        .collect();
    std::fs::write(&identity, older).unwrap();
    node.node = Some(Node::start(config).unwrap());
    let client = Client::connect(node.addr()).await.unwrap();
    common::create_topic(&client, "s", "new", 1).await;
    let fetched = client.fetch("s", "new", 0, 0, 1 << 20, 0).await.unwrap();
    assert_eq!(fetched.high_watermark, 0, "the new topic is empty");
    assert!(fetched.batches.is_empty());
    // The old records are still on disk, under an id no topic will be given.
    assert!(node.dir.path().join("partitions").join("0").is_dir());
}

/// A batch of `records` records without keys (any partition takes them).
fn keyless(records: usize) -> Vec<u8> {
    let mut builder = braid_proto::BatchBuilder::new(1_000);
    for i in 0..records {
        builder.push(None, Some(format!("v{i}").as_bytes()), &[], 1_000);
    }
    builder.finish()
}

/// What a test does to a stopped single node's partition 0.
#[derive(Debug, Clone, Copy, PartialEq)]
enum PartitionDamage {
    /// Its `vsr.journal` deleted (the log intact).
    JournalGone,
    /// A bit flipped in the middle of its log, in its second batch.
    LogFlipped,
    /// Its whole directory deleted.
    DirectoryGone,
    /// Its `vsr.journal` cut to half its length (below what it had made durable).
    JournalCut,
    /// A bit flipped in the middle of its `vsr.journal`.
    JournalFlipped,
}

/// Issue 24: a single node whose partition's files are damaged refuses that partition
/// alone, naming the damage, while the other partitions serve. Its log serves what it
/// holds intact (each batch checked); a produce, and a read from the damage or where
/// the log ends, are refused, and so they are after the next start (the refusal writes
/// nothing). A deleted partition directory was an empty new partition: 12
/// acknowledged records gone and offset 0 given again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_partition_of_a_single_node_is_refused_alone() {
    use PartitionDamage::*;
    for damage in [
        JournalGone,
        LogFlipped,
        DirectoryGone,
        JournalCut,
        JournalFlipped,
    ] {
        let mut node = TestNode::start(FsyncSetting::Always);
        let client = Client::connect(node.addr()).await.unwrap();
        common::create_topic(&client, "s", "t", 2).await;
        for _ in 0..3 {
            for partition in 0..2 {
                client
                    .produce("s", "t", partition, &keyless(4))
                    .await
                    .unwrap();
            }
        }
        drop(client);
        node.node.take().unwrap().shutdown();
        let damaged = node.dir.path().join("partitions").join("0").join("0");
        match damage {
            JournalGone => std::fs::remove_file(damaged.join("vsr.journal")).unwrap(),
            LogFlipped => {
                let segment = damaged.join(format!("{:020}.log", 0));
                let mut bytes = std::fs::read(&segment).unwrap();
                let at = bytes.len() / 2;
                bytes[at] ^= 0x08;
                std::fs::write(&segment, bytes).unwrap();
            }
            DirectoryGone => std::fs::remove_dir_all(&damaged).unwrap(),
            JournalCut => {
                let journal = damaged.join("vsr.journal");
                let len = std::fs::metadata(&journal).unwrap().len();
                std::fs::OpenOptions::new()
                    .write(true)
                    .open(&journal)
                    .unwrap()
                    .set_len(len / 2)
                    .unwrap();
            }
            JournalFlipped => {
                let journal = damaged.join("vsr.journal");
                let mut bytes = std::fs::read(&journal).unwrap();
                let at = bytes.len() / 2;
                bytes[at] ^= 0x08;
                std::fs::write(&journal, bytes).unwrap();
            }
        }
        // What the damage left, which a single node never changes: it is what an
        // operator restores from (an outside review of issue 24: a cut journal's
        // open cut the log to match it, and the records were gone).
        let left = |name: &str| std::fs::read(damaged.join(name)).ok();
        let segment = format!("{:020}.log", 0);
        let left_before = (left("vsr.journal"), left(&segment));
        for start in 0..2 {
            if start == 0 {
                let config = common::config(node.dir.path(), FsyncSetting::Always);
                node.node = Some(Node::start(config).unwrap());
            } else {
                node.restart();
            }
            let client = Client::connect(node.addr()).await.unwrap();
            // The other partition serves and takes writes.
            let stored = client.produce("s", "t", 1, &keyless(1)).await.unwrap();
            assert_eq!(stored.0, 12 + start);
            // The damaged one takes none, and says why.
            let refused = client.produce("s", "t", 0, &keyless(1)).await.unwrap_err();
            let named = match damage {
                LogFlipped => "(in 00000000000000000000.log)",
                JournalGone | DirectoryGone | JournalCut | JournalFlipped => "vsr.journal",
            };
            assert!(refused.to_string().contains(named), "{damage:?}: {refused}");
            assert!(
                refused.to_string().contains("docs/operations.md"),
                "{refused}"
            );
            let past_end = client.fetch("s", "t", 0, 12, 1 << 20, 0).await.unwrap_err();
            assert!(past_end.to_string().contains("refused"), "{past_end}");
            // What the log holds intact is served at its offsets: all 12 records when
            // only the journal is gone, the batch before the damaged one after a flip
            // (a read from the damage on is refused, naming it), nothing when the
            // directory is gone.
            let served = match damage {
                JournalGone | JournalCut | JournalFlipped => 12,
                LogFlipped => 4,
                DirectoryGone => 0,
            };
            if served > 0 {
                let fetched = client.fetch("s", "t", 0, 0, 1 << 20, 0).await.unwrap();
                assert_eq!(fetched.high_watermark, 12);
                let mut records = std::collections::VecDeque::new();
                braid_client::decode_records(0, 0, &fetched.batches, &mut records).unwrap();
                let offsets: Vec<u64> = records.iter().map(|r| r.offset).collect();
                assert_eq!(offsets, (0..served).collect::<Vec<_>>(), "{damage:?}");
            }
            if served < 12 {
                let at_damage = client.fetch("s", "t", 0, served, 1 << 20, 0).await;
                assert!(at_damage.is_err(), "{damage:?}: {at_damage:?}");
            }
            assert_eq!(
                common::metric(node.http_addr(), "braid_partitions_refused").await,
                1
            );
            if matches!(damage, JournalCut | JournalFlipped) {
                let left_now = (left("vsr.journal"), left(&segment));
                assert!(
                    left_now == left_before,
                    "{damage:?}: the files were changed"
                );
            }
        }
    }
}

/// A node whose topic `s/t` has `partitions` partitions, each given `rounds` batches
/// of 4 keyless records, and a client of it.
async fn node_with_records(partitions: u32, rounds: usize) -> (TestNode, Client) {
    let node = TestNode::start(FsyncSetting::Always);
    let client = Client::connect(node.addr()).await.unwrap();
    common::create_topic(&client, "s", "t", partitions).await;
    for _ in 0..rounds {
        for partition in 0..partitions {
            client
                .produce("s", "t", partition, &keyless(4))
                .await
                .unwrap();
        }
    }
    (node, client)
}

/// An outside review of issue 24: after a restart, no partition of a single node ever
/// slept again (each restarted group writes a state with a new log view, and its
/// journal then waited for a sync that nothing made), so every segment stayed open and
/// a segment deleted under an idle partition went unnoticed. Restarted, the idle
/// partitions' files sleep as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_single_nodes_idle_partitions_sleep_again() {
    let partitions = 8;
    let (mut node, client) = node_with_records(partitions, 1).await;
    drop(client);
    node.restart();
    let client = Client::connect(node.addr()).await.unwrap();
    common::until_files_slept(&node, partitions).await;
    // Woken by a read, each serves what it held.
    for partition in 0..partitions {
        let fetched = client
            .fetch("s", "t", partition, 0, 1 << 20, 0)
            .await
            .unwrap();
        assert_eq!(fetched.high_watermark, 4, "partition {partition}");
    }
}

/// An outside review (2026-12-06): a single node whose idle partition's files (closed
/// while it slept) were found changed at its next use stopped every partition of that
/// shard until a restart. Now that partition alone is opened again from its files, as a
/// start opens it: refused, naming the damage, and serving what its log holds, while
/// every other partition goes on taking writes, with no restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sleeping_partition_whose_files_changed_is_refused_alone_while_the_node_runs() {
    let partitions = 8;
    let (node, client) = node_with_records(partitions, 3).await;
    // Idle, every partition's files go to sleep (a pass a second).
    common::until_files_slept(&node, partitions).await;
    let damaged = node.dir.path().join("partitions").join("0").join("0");
    std::fs::remove_file(damaged.join("vsr.journal")).unwrap();
    // Its next use finds the change: the produce in flight is sent elsewhere
    // (`NotLeader`), and the partition, opened again, is refused naming it.
    let refused = refused_produce(&client, 0, "vsr.journal").await;
    assert!(
        refused.to_string().contains("docs/operations.md"),
        "{refused}"
    );
    // Every other partition, on that shard too, takes writes at once.
    for partition in 1..partitions {
        let stored = client
            .produce("s", "t", partition, &keyless(1))
            .await
            .unwrap();
        assert_eq!(stored.0, 12, "partition {partition}");
    }
    // The refused one serves what its log holds: the 12 acknowledged records at their
    // offsets (and the batch of the produce in flight when the change was found, if
    // its append reached the log: answered with an error, in doubt as after a crash).
    let fetched = client.fetch("s", "t", 0, 0, 1 << 20, 0).await.unwrap();
    let mut records = std::collections::VecDeque::new();
    braid_client::decode_records(0, 0, &fetched.batches, &mut records).unwrap();
    assert!((12..=13).contains(&records.len()), "{}", records.len());
    for (i, record) in records.iter().take(12).enumerate() {
        assert_eq!(record.offset, i as u64);
        assert_eq!(
            record.value.as_deref(),
            Some(format!("v{}", i % 4).as_bytes())
        );
    }
    assert_eq!(
        common::metric(node.http_addr(), "braid_partitions_refused").await,
        1
    );
}

/// An outside review of issue 24: a single node that met a damaged batch in use (a read
/// stopped before it) went on taking writes into that partition, acknowledged past the
/// damage where no read could reach them, until a restart refused it. The first read
/// or scrub that meets the damage refuses the partition, naming the segment file, as a
/// start would; it serves what lies before the damage, and the others go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn damage_a_single_node_meets_in_use_refuses_the_partition_at_once() {
    let mut node = TestNode::start(FsyncSetting::Always);
    let client = Client::connect(node.addr()).await.unwrap();
    common::create_topic(&client, "s", "t", 2).await;
    for _ in 0..3 {
        for partition in 0..2 {
            client
                .produce("s", "t", partition, &keyless(4))
                .await
                .unwrap();
        }
    }
    // A bit flipped in the second of three batches, under the running node.
    let dir = node.dir.path().join("partitions").join("0").join("0");
    let segment = dir.join(format!("{:020}.log", 0));
    let mut bytes = std::fs::read(&segment).unwrap();
    let len = bytes.len();
    bytes[len / 2] ^= 0x08;
    std::fs::write(&segment, bytes).unwrap();
    // A read (or the scrub, first) meets it: what lies before is served.
    if let Ok(fetched) = client.fetch("s", "t", 0, 0, 1 << 20, 0).await {
        let mut records = std::collections::VecDeque::new();
        braid_client::decode_records(0, 0, &fetched.batches, &mut records).unwrap();
        let offsets: Vec<u64> = records.iter().map(|r| r.offset).collect();
        assert_eq!(offsets, vec![0, 1, 2, 3]);
    }
    let refused = refused_produce(&client, 0, "00000000000000000000.log").await;
    assert!(refused.to_string().contains("offset 4"), "{refused}");
    assert!(
        refused.to_string().contains("docs/operations.md"),
        "{refused}"
    );
    let before = client.fetch("s", "t", 0, 0, 1 << 20, 0).await.unwrap();
    let mut records = std::collections::VecDeque::new();
    braid_client::decode_records(0, 0, &before.batches, &mut records).unwrap();
    assert_eq!(records.len(), 4);
    let at_damage = client.fetch("s", "t", 0, 4, 1 << 20, 0).await.unwrap_err();
    assert!(at_damage.to_string().contains("damaged"), "{at_damage}");
    let stored = client.produce("s", "t", 1, &keyless(1)).await.unwrap();
    assert_eq!(stored.0, 12);
    assert_eq!(
        common::metric(node.http_addr(), "braid_partitions_refused").await,
        1
    );
    // Nothing was written into it after the damage, and a start refuses it too.
    assert_eq!(std::fs::read(&segment).unwrap().len(), len);
    drop(client);
    node.restart();
    let client = Client::connect(node.addr()).await.unwrap();
    refused_produce(&client, 0, "00000000000000000000.log").await;
    assert_eq!(
        client.produce("s", "t", 1, &keyless(1)).await.unwrap().0,
        13
    );
}

/// An outside review of issue 24: a segment deleted under a running single node's
/// awake partition took produces through its open handle, acknowledged into a file no
/// directory named, and the next start refused the partition. The scrub's next look
/// finds the file gone and the partition is opened again from its files: refused,
/// naming the segment, while the others take writes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_segment_deleted_under_a_running_single_node_refuses_its_partition() {
    let node = TestNode::start(FsyncSetting::Always);
    let client = Client::connect(node.addr()).await.unwrap();
    common::create_topic(&client, "s", "t", 2).await;
    for partition in 0..2 {
        client
            .produce("s", "t", partition, &keyless(4))
            .await
            .unwrap();
    }
    let segment = node
        .dir
        .path()
        .join("partitions")
        .join("0")
        .join("0")
        .join(format!("{:020}.log", 0));
    std::fs::remove_file(&segment).unwrap();
    // The scrub looks at each of the shard's partitions in turn, one per 10 ms tick.
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    refused_produce(&client, 0, "00000000000000000000.log").await;
    assert!(!segment.exists(), "nothing made anew");
    assert_eq!(client.produce("s", "t", 1, &keyless(1)).await.unwrap().0, 4);
    assert_eq!(
        common::metric(node.http_addr(), "braid_partitions_refused").await,
        1
    );
}

/// Produces to partition `partition` until it is refused with an error naming `named`
/// (at most 5 s: a produce in flight when the partition was dropped is answered
/// `NotLeader`); a produce stored meanwhile fails the test.
async fn refused_produce(
    client: &Client,
    partition: u32,
    named: &str,
) -> braid_client::ClientError {
    for _ in 0..50 {
        match client.produce("s", "t", partition, &keyless(1)).await {
            Ok(stored) => panic!("a produce to the damaged partition was stored at {stored:?}"),
            Err(err) if err.to_string().contains(named) => return err,
            Err(_) => tokio::time::sleep(std::time::Duration::from_millis(100)).await,
        }
    }
    panic!("the damaged partition is never refused naming {named}");
}
/// Copies directory `from` (files only, one level deep, as a partition's is) to `to`.
fn copy_dir(from: &std::path::Path, to: &std::path::Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        if entry.file_type().unwrap().is_file() {
            std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
        }
    }
}

/// An outside review of issue 24: a single node whose partition directory, or only its
/// `vsr.journal`, was restored from a backup older than its last acknowledged write
/// served the older records without a word, cut the newer ones from the log, and
/// acknowledged their offsets again for other records. The states table, kept apart,
/// says what was committed: a partition whose files hold less is refused, naming it,
/// and no offset is given twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_restored_from_an_older_backup_are_refused_not_served_short() {
    let mut node = TestNode::start(FsyncSetting::Always);
    let client = Client::connect(node.addr()).await.unwrap();
    common::create_topic(&client, "s", "t", 3).await;
    for partition in 0..3 {
        for _ in 0..5 {
            client
                .produce("s", "t", partition, &keyless(1))
                .await
                .unwrap();
        }
    }
    drop(client);
    node.node.take().unwrap().shutdown();
    let partitions = node.dir.path().join("partitions").join("0");
    let backup = node.dir.path().join("backup");
    for partition in 0..2 {
        copy_dir(
            &partitions.join(partition.to_string()),
            &backup.join(partition.to_string()),
        );
    }
    node.node = Some(Node::start(common::config(node.dir.path(), FsyncSetting::Always)).unwrap());
    let client = Client::connect(node.addr()).await.unwrap();
    for partition in 0..3 {
        for _ in 0..5 {
            client
                .produce("s", "t", partition, &keyless(1))
                .await
                .unwrap();
        }
    }
    drop(client);
    node.node.take().unwrap().shutdown();
    // Partition 0: its whole directory as it was; partition 1: its journal alone.
    let logged = log_bytes(&partitions.join("1"));
    std::fs::remove_dir_all(partitions.join("0")).unwrap();
    copy_dir(&backup.join("0"), &partitions.join("0"));
    std::fs::copy(
        backup.join("1").join("vsr.journal"),
        partitions.join("1").join("vsr.journal"),
    )
    .unwrap();
    node.node = Some(Node::start(common::config(node.dir.path(), FsyncSetting::Always)).unwrap());
    for _ in 0..2 {
        node.restart();
        let client = Client::connect(node.addr()).await.unwrap();
        for partition in 0..2 {
            let refused = client
                .produce("s", "t", partition, &keyless(1))
                .await
                .unwrap_err();
            assert!(
                refused
                    .to_string()
                    .contains("older than what this node acknowledged"),
                "partition {partition}: {refused}"
            );
        }
        // The untouched partition goes on at offset 10 (then 11).
        let stored = client.produce("s", "t", 2, &keyless(1)).await.unwrap();
        assert!(stored.0 >= 10, "{stored:?}");
    }
    // Partition 1's log still holds all ten acknowledged batches: nothing was cut.
    assert_eq!(log_bytes(&partitions.join("1")), logged);
}

/// The bytes of the segment files in a partition's directory.
fn log_bytes(dir: &std::path::Path) -> u64 {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "log"))
        .map(|p| std::fs::metadata(p).unwrap().len())
        .sum()
}

/// An outside review of issue 24: both checkpoint copies of a single node's partition
/// deleted (or damaged) while its files slept went unnoticed, and the node took writes
/// into a partition its next start refused. Its wake finds them, as its start would:
/// the partition is refused at once, naming them, and the others serve.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sleeping_partitions_lost_checkpoint_copies_are_found_at_its_wake() {
    let partitions = 4;
    let (node, client) = node_with_records(partitions, 1).await;
    common::until_files_slept(&node, partitions).await;
    let dir = node.dir.path().join("partitions").join("0").join("0");
    let mut removed = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.to_string_lossy().contains(".checkpoint.") {
            std::fs::remove_file(path).unwrap();
            removed += 1;
        }
    }
    assert!(removed > 0, "no checkpoint copy in {}", dir.display());
    let refused = refused_produce(&client, 0, "checkpoint").await;
    assert!(refused.to_string().contains("gone"), "{refused}");
    for partition in 1..partitions {
        let stored = client
            .produce("s", "t", partition, &keyless(1))
            .await
            .unwrap();
        assert_eq!(stored.0, 4, "partition {partition}");
    }
}
