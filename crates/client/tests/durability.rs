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
