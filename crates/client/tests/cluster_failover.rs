//! The SDK through a failover on three in-process nodes: a producer and a group
//! consumer, connected through one member, go on without an error reaching the
//! application while a member leading partitions (and the consumer groups, when it
//! leads the metadata) stops; every acknowledged record is read back in per-key order.

// A panic in a test is a failed assertion, not a crash on outside data.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::HashSet;
use std::time::{Duration, Instant};

use braid_client::{Client, Consumer, ConsumerConfig, Producer, ProducerConfig};
use braid_node::FsyncSetting;
use common::start_cluster;

const KEYS: usize = 8;

/// Sends `rounds` records per key (values `k{key}-{seq}`); every send must succeed.
async fn send(producer: &Producer, next: &mut [u32], rounds: u32) -> Vec<(usize, u32)> {
    let mut pending = Vec::new();
    for _ in 0..rounds {
        for (key, seq) in next.iter_mut().enumerate() {
            let value = format!("k{key}-{seq}");
            pending.push((
                key,
                *seq,
                producer.send(Some(format!("k{key}").as_bytes()), value.as_bytes()),
            ));
            *seq += 1;
        }
    }
    let mut acked = Vec::new();
    for (key, seq, answer) in pending {
        answer
            .await
            .expect("the producer rides through the failover");
        acked.push((key, seq));
    }
    acked
}

/// (key, sequence number) of a value `k{key}-{seq}`.
fn parse(value: &[u8]) -> (usize, u32) {
    let value = std::str::from_utf8(value).unwrap();
    let (key, seq) = value.trim_start_matches('k').split_once('-').unwrap();
    (key.parse().unwrap(), seq.parse().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_producer_and_a_group_consumer_ride_through_a_primarys_stop() {
    let mut members = start_cluster(3, FsyncSetting::Always);
    let client = Client::connect(members[1].addr()).await.unwrap();
    common::create_topic(&client, "s", "t", 4).await;
    let config = ProducerConfig {
        linger: Duration::from_millis(1),
        ..ProducerConfig::default()
    };
    let producer = Producer::new(&client, "s", "t", config).await.unwrap();
    let mut next = vec![0u32; KEYS];
    let mut acked = send(&producer, &mut next, 25).await;

    // The member to stop: the coordinator if it leads a partition (both move), else
    // the primary of partition 0.
    let info = client.cluster_info().await.unwrap();
    let topic = info.topics.iter().find(|t| t.topic == "t").unwrap();
    let coordinator = info.coordinator.expect("a coordinator is known");
    let victim = if topic
        .partitions
        .iter()
        .any(|p| p.primary == Some(coordinator))
    {
        coordinator
    } else {
        topic.partitions[0].primary.unwrap()
    };
    let consumer_config = ConsumerConfig {
        auto_commit: Some(Duration::from_millis(200)),
        ..ConsumerConfig::default()
    };
    let mut consumer = Consumer::join_group(&client, "s", "t", "g", "m1", consumer_config)
        .await
        .unwrap();

    let stopped = Instant::now();
    members[usize::from(victim)].stop();
    let first = producer.send(Some(b"k0"), format!("k0-{}", next[0]).as_bytes());
    next[0] += 1;
    first.await.expect("the first produce after the stop");
    println!(
        "first record acknowledged {:?} after member {victim} stopped",
        stopped.elapsed()
    );
    acked.push((0, next[0] - 1));
    acked.extend(send(&producer, &mut next, 25).await);

    // The group consumer reads every acknowledged record (at least once: a member
    // that joins again at the new coordinator reads on from the committed offsets).
    let want: HashSet<(usize, u32)> = acked.iter().copied().collect();
    let mut seen = HashSet::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while !want.is_subset(&seen) {
        assert!(
            Instant::now() < deadline,
            "{} of {} acknowledged records read",
            want.intersection(&seen).count(),
            want.len()
        );
        for record in consumer.poll(Duration::from_millis(200)).await.unwrap() {
            seen.insert(parse(&record.value.unwrap()));
        }
    }
    consumer.commit().await.unwrap();

    // The logs themselves: per key, every sequence number stored once, in order: the
    // producer's session makes each resent batch answered, not stored again.
    let mut expected = [0u32; KEYS];
    let mut duplicates = 0;
    for partition in 0..4 {
        for value in common::read_partition(&client, "s", "t", partition).await {
            let (key, seq) = parse(&value);
            if seq < expected[key] {
                duplicates += 1;
            } else {
                assert_eq!(
                    seq, expected[key],
                    "key {key}: a record stored out of order"
                );
                expected[key] += 1;
            }
        }
    }
    assert!(
        acked.iter().all(|(key, seq)| *seq < expected[*key]),
        "an acknowledged record is missing from the logs"
    );
    assert_eq!(
        duplicates,
        0,
        "records stored twice ({} batches resent)",
        producer.retried_batches()
    );
    println!(
        "{} records acknowledged, all read; {} batches resent, {duplicates} records stored twice",
        want.len(),
        producer.retried_batches()
    );
    consumer.close().await.unwrap();
    for member in &mut members {
        member.stop();
    }
}

/// Issue 24, finding 6: member ids and generations started again at 1 at a new
/// coordinator, so a consumer from before the failover (a zombie) passed for the new
/// member 1 and its commit moved the group's offsets back from 25 to 11. Issue 26:
/// membership is metadata now, so a member that heartbeats keeps its id, generation
/// and partitions across the failover (no rejoin), and a quiet one leaves by its
/// timeout, after which its commits are refused. Raw protocol calls, as a zombie would
/// make them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_keeps_its_members_across_a_coordinator_failover_and_fences_a_quiet_one() {
    use braid_proto::client::{GroupMemberRequest, Request, Response};
    let mut members = start_cluster(3, FsyncSetting::Always);
    let client = Client::connect(members[0].addr()).await.unwrap();
    common::create_topic(&client, "s", "t", 1).await;
    let producer = Producer::new(&client, "s", "t", ProducerConfig::default())
        .await
        .unwrap();
    for i in 0..30 {
        producer
            .send(Some(b"k"), format!("v{i}").as_bytes())
            .await
            .unwrap();
    }
    let join = |member_name, session_timeout_ms| Request::JoinGroup {
        stream: "s",
        group: "g",
        topic: "t",
        member_name,
        session_timeout_ms,
        session: 0,
    };
    let granted = |response| match response {
        Response::Assignment {
            member_id,
            generation,
            partitions,
        } => ((member_id, generation), partitions),
        other => panic!("not an assignment: {other:?}"),
    };
    let commit = |(member_id, generation): (u64, u32), offset: u64| Request::CommitOffsets {
        member: GroupMemberRequest {
            stream: "s",
            group: "g",
            member_id,
            generation,
        },
        offsets: vec![(0, offset)],
    };
    let heartbeat = |(member_id, generation): (u64, u32), owned: Vec<u32>| Request::Heartbeat {
        member: GroupMemberRequest {
            stream: "s",
            group: "g",
            member_id,
            generation,
        },
        owned,
    };
    // Finding 8: a member that does not coordinate names the one that does in the
    // documented form of every NotLeader.
    let coordinator = client.cluster_info().await.unwrap().coordinator.unwrap();
    let other = (usize::from(coordinator) + 1) % 3;
    let direct = common::direct(members[other].addr()).await.unwrap();
    let refused = direct
        .call(&join("x", 1_000))
        .await
        .unwrap_err()
        .to_string();
    let leader_addr = members[usize::from(coordinator)].addr();
    assert!(
        refused.contains(&format!(
            "does not lead consumer groups: node {coordinator} at {leader_addr} leads it"
        )),
        "{refused}"
    );
    let (zombie, partitions) = granted(client.call(&join("zombie", 4_000)).await.unwrap());
    assert_eq!(partitions, [0]);
    client.call(&commit(zombie, 11)).await.unwrap();
    let (keeper, _) = granted(client.call(&join("keeper", 60_000)).await.unwrap());

    members[usize::from(coordinator)].stop();
    let deadline = Instant::now() + Duration::from_secs(60);
    let (again, _) = loop {
        match client.call(&heartbeat(keeper, Vec::new())).await {
            Ok(response) => break granted(response),
            Err(err) => {
                assert!(
                    err.code() != Some(braid_proto::client::ErrorCode::UnknownMember),
                    "the new coordinator forgot the member: {err}"
                );
                assert!(Instant::now() < deadline, "no new coordinator: {err}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    };
    assert_eq!(again.0, keeper.0, "the member kept its id");
    // The zombie, quiet, leaves by its timeout; its partition then goes to the keeper.
    let deadline = Instant::now() + Duration::from_secs(30);
    let keeper = loop {
        let (now, partitions) = granted(client.call(&heartbeat(keeper, Vec::new())).await.unwrap());
        if partitions == [0] {
            break now;
        }
        assert!(Instant::now() < deadline, "the quiet member never left");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(keeper.1 > again.1, "its leave raised the generation");
    client.call(&commit(keeper, 25)).await.unwrap();
    let refused = client.call(&commit(zombie, 11)).await;
    assert!(
        refused.is_err(),
        "the zombie's commit was taken: {refused:?}"
    );
    let offsets = client
        .call(&Request::FetchOffsets {
            stream: "s",
            group: "g",
        })
        .await
        .unwrap();
    let Response::Offsets(offsets) = offsets else {
        panic!("not offsets: {offsets:?}");
    };
    assert_eq!(offsets[0].committed, Some(25), "{offsets:?}");
}
