//! The bus against what a hostile or broken peer does, with real sockets on
//! 127.0.0.1: wrong secrets and link counts, unknown replicas, silent and stalled
//! sockets, floods, full queues, oversized frames, a peer that never drains, and the
//! counters each of those moves.

// A panic in a test is a failed assertion, not a crash on outside data.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use braid_bus::{Bus, Frame};
use common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peers_with_another_k_or_secret_and_unknown_replicas_are_refused_and_counted() {
    let (ls, addresses) = listeners(2).await;
    let mut ls = ls.into_iter();
    let (a, _ra) = Bus::start(config(0, &addresses, 4, 1), ls.next().unwrap()).unwrap();
    let (b, _rb) = Bus::start(config(1, &addresses, 4, 2), ls.next().unwrap()).unwrap();
    wait_until("a k mismatch counted", || {
        a.metrics().handshake_failures_for("link_count")
            + b.metrics().handshake_failures_for("link_count")
            > 0
    })
    .await;
    assert!(!a.bundle_up(1) && !b.bundle_up(0));
    drop((a, b));

    let (ls, addresses) = listeners(2).await;
    let mut ls = ls.into_iter();
    let (a, _ra) = Bus::start(config(0, &addresses, 4, 1), ls.next().unwrap()).unwrap();
    let mut wrong = config(1, &addresses, 4, 1);
    wrong.keys = braid_bus::LinkKeys::Shared(b"another secret".to_vec());
    let (b, _rb) = Bus::start(wrong, ls.next().unwrap()).unwrap();
    wait_until("a wrong MAC counted", || {
        a.metrics().handshake_failures_for("bad_mac")
            + b.metrics().handshake_failures_for("bad_mac")
            > 0
    })
    .await;
    assert!(!a.bundle_up(1));

    // A preamble naming replica 9.
    let mut raw = TcpStream::connect(addresses[0]).await.unwrap();
    raw.write_all(&[b'B', b'R', 2, 9, 0, 0, 0, 1])
        .await
        .unwrap();
    wait_until("an unknown replica refused", || {
        a.metrics().handshake_failures_for("unknown_replica") > 0
    })
    .await;
    assert!(a.metrics().preamble_refusals.load(Ordering::Relaxed) >= 1);
    drop(b);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_socket_is_closed_at_the_preamble_deadline_and_a_stalled_one_at_the_grace() {
    let (ls, addresses) = listeners(2).await;
    let (a, _ra) = Bus::start(config(1, &addresses, 4, 1), ls.into_iter().nth(1).unwrap()).unwrap();
    // Nothing sent: closed at the preamble's own deadline, a quarter of the grace.
    let started = Instant::now();
    let mut silent = TcpStream::connect(addresses[1]).await.unwrap();
    let mut rest = Vec::new();
    let _ = tokio::time::timeout(GRACE * 3, silent.read_to_end(&mut rest)).await;
    let closed_after = started.elapsed();
    assert!(
        closed_after < GRACE.mul_f32(0.5),
        "a silent socket closed after {closed_after:?}"
    );
    // A valid preamble from replica 0 (the lower id dials), then nothing: the rest of
    // the handshake has the grace.
    let started = Instant::now();
    let mut stalled = TcpStream::connect(addresses[1]).await.unwrap();
    stalled
        .write_all(&[b'B', b'R', 2, 0, 0, 0, 0, 1])
        .await
        .unwrap();
    let _ = tokio::time::timeout(GRACE * 3, stalled.read_to_end(&mut rest)).await;
    let closed_after = started.elapsed();
    assert!(
        closed_after < GRACE.mul_f32(1.6),
        "closed after {closed_after:?}, one grace is {GRACE:?}"
    );
    assert!(closed_after >= GRACE.mul_f32(0.8));
    drop(a);
}

/// Sockets from addresses that are not a configured peer's are refused before they
/// take an admission slot: 64 of them, stalling and reconnecting, do not keep a real
/// peer's bundle down (before: they held every slot for a grace each).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_from_unknown_addresses_does_not_keep_a_bundle_down() {
    let nodes = cluster(&[4, 4], 1).await;
    all_up(&nodes).await;
    let target = nodes[1].0.local_addr();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut attackers = Vec::new();
    for _ in 0..64 {
        let stop = std::sync::Arc::clone(&stop);
        attackers.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let socket = tokio::net::TcpSocket::new_v4().unwrap();
                socket.bind("127.0.0.2:0".parse().unwrap()).unwrap();
                if let Ok(mut stream) = socket.connect(target).await {
                    let _ = stream.write_all(&[b'B', b'R', 2, 0, 0, 0, 0, 1]).await;
                    let mut sink = Vec::new();
                    let _ =
                        tokio::time::timeout(Duration::from_secs(2), stream.read_to_end(&mut sink))
                            .await;
                }
            }
        }));
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let started = Instant::now();
    nodes[0].0.kill_link(1, 0);
    wait_until("the bundle back under the flood", || {
        nodes[0].0.bundle_up(1) && nodes[1].0.bundle_up(0)
    })
    .await;
    let back_after = started.elapsed();
    stop.store(true, Ordering::Relaxed);
    for attacker in attackers {
        attacker.abort();
    }
    assert!(
        back_after < Duration::from_secs(1),
        "back after {back_after:?}"
    );
    assert!(
        nodes[1]
            .0
            .metrics()
            .handshake_failures_for("unknown_address")
            > 0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_queue_drops_and_counts_without_blocking() {
    let (ls, addresses) = listeners(2).await;
    let mut ls = ls.into_iter();
    let mut small = config(0, &addresses, 4, 1);
    small.queue_frames_max = 4;
    let (a, _ra) = Bus::start(small, ls.next().unwrap()).unwrap();
    let (b, _rb) = Bus::start(config(1, &addresses, 4, 1), ls.next().unwrap()).unwrap();
    wait_until("the bundle", || a.bundle_up(1) && b.bundle_up(0)).await;
    let mut refused = 0;
    for i in 0..20_000u32 {
        if a.send(
            1,
            1,
            Frame {
                group: 1,
                kind: 1,
                payload: vec![0; 512 + (i % 3) as usize].into(),
            },
        )
        .is_err()
        {
            refused += 1;
        }
    }
    assert!(refused > 0, "some frames met a full queue");
    assert_eq!(a.metrics().frames_dropped.load(Ordering::Relaxed), refused);
}

/// Found by the bus benchmark: four shards keeping one link's queue full kept its writer
/// gathering frames forever, and nothing was written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_link_kept_full_by_many_shards_still_writes() {
    let mut nodes = cluster(&[4, 4], 1).await;
    all_up(&nodes).await;
    let sender = std::sync::Arc::new(nodes.remove(0).0);
    let mut tasks = Vec::new();
    for shard in 0..4u16 {
        let sender = std::sync::Arc::clone(&sender);
        tasks.push(tokio::spawn(async move {
            for _ in 0..400 {
                let frame = Frame {
                    group: 1,
                    kind: 1,
                    payload: vec![1; 64 * 1024].into(),
                };
                if sender.send_waiting(shard, 1, frame).await.is_err() {
                    return;
                }
            }
        }));
    }
    let (_, deliveries) = &mut nodes[0];
    for _ in 0..1_600 {
        tokio::time::timeout(Duration::from_secs(10), deliveries.recv())
            .await
            .unwrap()
            .unwrap();
    }
    for task in tasks {
        task.await.unwrap();
    }
}

/// A frame above `frame_bytes_max` is refused at `send` with a typed error; the peer
/// never sees it, so the bundle stays up (before, each one tore down both sides).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_frame_is_refused_at_send_and_the_bundle_stays_up() {
    let mut nodes = cluster(&[4, 4], 2).await;
    all_up(&nodes).await;
    let teardowns = nodes[0].0.metrics().teardowns.load(Ordering::Relaxed);
    let big = Frame {
        group: 3,
        kind: 1,
        payload: vec![0u8; 1 << 20].into(),
    };
    let refused = nodes[0].0.send(1, 1, big).unwrap_err();
    assert_eq!(
        refused,
        braid_bus::SendError::FrameTooLarge {
            bytes: (1 << 20) + 13,
            max: 1 << 20
        }
    );
    let fits = Frame {
        group: 3,
        kind: 1,
        payload: vec![1u8; (1 << 20) - 13].into(),
    };
    nodes[0].0.send(1, 1, fits).unwrap();
    let delivery = tokio::time::timeout(Duration::from_secs(5), nodes[1].1.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(delivery.frame.payload.len(), (1 << 20) - 13);
    let metrics = nodes[0].0.metrics();
    assert_eq!(metrics.frames_refused_too_large.load(Ordering::Relaxed), 1);
    assert_eq!(metrics.teardowns.load(Ordering::Relaxed), teardowns);
    assert!(nodes[0].0.bundle_up(1) && nodes[1].0.bundle_up(0));
}

/// A node that does not drain its deliveries holds at most `delivery_bytes_max` of
/// them: its links stop reading and TCP pushes back on the sender, which waits; nothing
/// is dropped, and everything arrives once the consumer drains.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn undrained_deliveries_push_back_instead_of_growing() {
    const BUDGET: usize = 4 << 20;
    const FRAME: usize = 64 << 10;
    const FRAMES: usize = 1024; // 64 MiB: far more than the budget, queues and sockets hold
    let mut nodes = cluster_with(&[4; 2], 1, |c| {
        c.delivery_bytes_max = BUDGET;
        c.queue_frames_max = 16;
    })
    .await;
    all_up(&nodes).await;
    let (receiver_bus, mut deliveries) = nodes.pop().unwrap();
    let (sender_bus, _) = nodes.pop().unwrap();
    let sender_bus = std::sync::Arc::new(sender_bus);
    let sending = {
        let bus = std::sync::Arc::clone(&sender_bus);
        tokio::spawn(async move {
            for seq in 0..FRAMES as u32 {
                let frame = Frame {
                    group: 9,
                    kind: 1,
                    payload: [seq.to_be_bytes().to_vec(), vec![3u8; FRAME - 4]]
                        .concat()
                        .into(),
                };
                bus.send_waiting(1, 1, frame).await.unwrap();
            }
        })
    };
    // Nobody drains: the held deliveries stay within the budget and links wait.
    wait_until("a link waiting for delivery budget", || {
        receiver_bus
            .metrics()
            .delivery_waits
            .load(Ordering::Relaxed)
            > 0
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let held = deliveries.len();
    assert!(
        held * (FRAME + 17) <= BUDGET,
        "{held} deliveries of {FRAME} bytes held against a budget of {BUDGET}"
    );
    assert!(!sending.is_finished(), "the sender was pushed back");
    // Draining lets everything through, in order, none dropped.
    for seq in 0..FRAMES as u32 {
        let delivery = tokio::time::timeout(Duration::from_secs(10), deliveries.recv())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(delivery.frame.payload[..4], seq.to_be_bytes());
    }
    sending.await.unwrap();
    assert_eq!(
        sender_bus.metrics().frames_dropped.load(Ordering::Relaxed),
        0
    );
}

/// The review's flood: 1 GiB offered to a node (a process of its own) that never drains
/// its deliveries. Its resident memory must stay near its delivery budget (64 MiB, and
/// 16 MiB more at most) while the sender is pushed back, none dropped: a large payload
/// delivered without a copy must pin nothing the budget does not count. Prints the
/// figure.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_never_drains_holds_its_budget_not_the_flood() {
    const FRAME: usize = 64 << 10;
    const OFFERED: usize = 1 << 30;
    let heartbeat = Duration::from_secs(30);
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let own = listener.local_addr().unwrap();
    let (child, peer) = spawn_peer(own, heartbeat, &["--hold"]);
    // Killed however the test ends, so a failure never leaves the process behind.
    struct KillOnDrop(std::process::Child);
    impl Drop for KillOnDrop {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let child = KillOnDrop(child);
    let mut config = config(0, &[own, peer], 4, 2);
    config.heartbeat_timeout = heartbeat;
    config.queue_frames_max = 16;
    let (bus, _deliveries) = Bus::start(config, listener).unwrap();
    wait_until("the bundle to the child", || bus.bundle_up(1)).await;
    let before = resident_bytes(child.0.id());
    let payload = bytes::Bytes::from(vec![1u8; FRAME]);
    let mut senders: Vec<_> = (0..4u16).map(|s| bus.shard_sender(s)).collect();
    let mut sending = Vec::new();
    for (shard, mut sender) in senders.drain(..).enumerate() {
        let payload = payload.clone();
        sending.push(tokio::spawn(async move {
            let mut accepted = 0usize;
            while accepted < OFFERED / 4 {
                let frame = Frame::new(1 + shard as u64, 1, payload.clone());
                if let Err(err) = sender.send_waiting(1, frame).await {
                    panic!("after {accepted} bytes: {err}");
                }
                accepted += FRAME;
            }
        }));
    }
    // Wait until the sender stalls: nothing more written for half a second.
    let mut last = 0;
    let mut still = Instant::now();
    let start = Instant::now();
    while still.elapsed() < Duration::from_millis(500) {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "the sender never stalled"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
        let sent = bus.metrics().bytes_sent.load(Ordering::Relaxed);
        if sent != last {
            last = sent;
            still = Instant::now();
        }
    }
    let after = resident_bytes(child.0.id());
    let written = bus.metrics().bytes_sent.load(Ordering::Relaxed);
    eprintln!(
        "offered {} MiB; written to sockets {} MiB; receiver resident {} MiB before, {} MiB after",
        OFFERED >> 20,
        written >> 20,
        before >> 20,
        after >> 20
    );
    assert!(bus.bundle_up(1), "the bundle stayed up");
    assert!(
        sending.iter().all(|t| !t.is_finished()),
        "the senders were pushed back"
    );
    assert!(
        written < (OFFERED as u64) / 4,
        "far less than the flood got through"
    );
    assert!(
        after.saturating_sub(before) < (64 + 16) << 20,
        "the receiver grew from {before} to {after} bytes"
    );
    assert_eq!(bus.metrics().frames_dropped.load(Ordering::Relaxed), 0);
    for task in sending {
        task.abort();
    }
    drop(child);
}

/// Against a peer that refuses it (another cluster secret), the dialer backs off
/// exponentially instead of flapping at the base interval (before: 30 ups and 30
/// teardowns in 3 s with a 20 ms base).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dialer_backs_off_from_a_peer_that_refuses_it() {
    let (ls, addresses) = listeners(2).await;
    let mut ls = ls.into_iter();
    let dialer = config(0, &addresses, 4, 1);
    let mut refuser = config(1, &addresses, 4, 1);
    refuser.keys = braid_bus::LinkKeys::Shared(b"another cluster's secret".to_vec());
    let (a, _ra) = Bus::start(dialer, ls.next().unwrap()).unwrap();
    let (b, _rb) = Bus::start(refuser, ls.next().unwrap()).unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let attempts = handshake_failures(&a).max(handshake_failures(&b));
    let ups = a.metrics().bundles_up.load(Ordering::Relaxed);
    // 20 ms doubling to 640 ms: about 8 attempts in 3 s.
    assert!(attempts >= 2, "it kept trying ({attempts})");
    assert!(
        attempts <= 12,
        "{attempts} attempts in 3 s: the backoff did not grow"
    );
    assert!(ups <= 12, "{ups} false ups in 3 s");
    assert!(!a.bundle_up(1) && !b.bundle_up(0));
}

/// A replica with a higher id that dials a lower one (the lower id dials) is refused at
/// the preamble and counted, even with the cluster secret; the real bundle stays up
/// (before: it could take that bundle over).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_higher_id_dialing_a_lower_one_is_refused() {
    let nodes = cluster(&[4, 4, 4], 1).await;
    all_up(&nodes).await;
    let teardowns = nodes[0].0.metrics().teardowns.load(Ordering::Relaxed);
    let impostor = braid_bus::HandshakeConfig {
        cluster: 7,
        replica: 2,
        replica_count: 3,
        links: 1,
        capabilities: 0,
        keys: braid_bus::LinkKeys::Shared(b"cluster secret".to_vec()),
        incarnation: 77,
    };
    let (_, hello) = braid_bus::DialerAwaitReply::start(impostor, 0, 0, 1_000, [9; 16]);
    let mut socket = TcpStream::connect(nodes[0].0.local_addr()).await.unwrap();
    socket.write_all(&hello).await.unwrap();
    let mut reply = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(5), socket.read_to_end(&mut reply)).await;
    assert!(
        matches!(read, Ok(Ok(0)) | Ok(Err(_))),
        "closed without a reply"
    );
    wait_until("the refusal counted", || {
        nodes[0].0.metrics().handshake_failures_for("wrong_dialer") == 1
    })
    .await;
    assert!(nodes[0].0.bundle_up(2) && nodes[2].0.bundle_up(0));
    assert_eq!(
        nodes[0].0.metrics().teardowns.load(Ordering::Relaxed),
        teardowns
    );
}

/// Counters per shard as well as per node: the links a shard owns add up to the node's
/// totals, shard 0 owns none (it hosts the listener), and a refused send is counted on
/// the shard that tried it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counters_add_up_per_shard() {
    let mut nodes = cluster(&[4, 4], 2).await;
    all_up(&nodes).await;
    for shard in 0..4u16 {
        for seq in 0..50u32 {
            let frame = Frame {
                group: 1 + u64::from(shard),
                kind: 1,
                payload: seq.to_be_bytes().to_vec().into(),
            };
            nodes[0].0.send(shard, 1, frame).unwrap();
        }
    }
    for _ in 0..200 {
        tokio::time::timeout(Duration::from_secs(5), nodes[1].1.recv())
            .await
            .unwrap()
            .unwrap();
    }
    let bus = &nodes[0].0;
    wait_until("every frame counted as sent", || {
        bus.metrics().frames_sent.load(Ordering::Relaxed) >= 200
    })
    .await;
    let per_shard: Vec<_> = (0..4).map(|s| bus.shard_link_counts(s)).collect();
    let sent: u64 = per_shard.iter().map(|c| c.0).sum();
    assert_eq!(sent, bus.metrics().frames_sent.load(Ordering::Relaxed));
    assert_eq!(per_shard[0], (0, 0, 0, 0), "shard 0 owns no link");
    // With the peer gone, a send is refused and counted on its shard.
    let (gone, _) = nodes.pop().unwrap();
    drop(gone);
    let bus = &nodes[0].0;
    wait_until("the bundle down", || !bus.bundle_up(1)).await;
    let frame = Frame {
        group: 3,
        kind: 1,
        payload: Default::default(),
    };
    assert!(bus.send(3, 1, frame).is_err());
    assert_eq!(bus.metrics().shard_send_counts(3).1, 1);
    assert_eq!(bus.metrics().shard_send_counts(2), (0, 0, 0));
}

/// With a key per pair of members, a member can prove only its own id (found by
/// review: any holder of the cluster secret could dial in as any member and get its
/// bundle). Member 2's keys, posing as member 0, never link to member 1; the real
/// members 0 and 1 do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_cannot_pose_as_another_with_per_pair_keys() {
    let keys_of = |replica: u8| {
        let keys = (0..3u8)
            .filter(|peer| *peer != replica)
            .map(|peer| {
                let key = braid_bus::pair_key(b"master secret", "c", replica, peer);
                (peer, key.to_vec())
            })
            .collect();
        braid_bus::LinkKeys::PerPeer(keys)
    };
    let (ls, addresses) = listeners(3).await;
    let mut ls = ls.into_iter();
    let mut impostor = config(0, &addresses, 2, 1);
    impostor.keys = keys_of(2);
    let (fake, _rf) = Bus::start(impostor, ls.next().unwrap()).unwrap();
    let mut one = config(1, &addresses, 2, 1);
    one.keys = keys_of(1);
    let (b, _rb) = Bus::start(one, ls.next().unwrap()).unwrap();
    wait_until("the impostor refused", || {
        b.metrics().handshake_failures_for("bad_mac")
            + fake.metrics().handshake_failures_for("bad_mac")
            > 0
    })
    .await;
    assert!(!b.bundle_up(0) && !fake.bundle_up(1));
    drop((fake, b));
    // The real members 0 and 1, each with its own keys, link.
    let (ls, addresses) = listeners(3).await;
    let mut ls = ls.into_iter();
    let mut zero = config(0, &addresses, 2, 1);
    zero.keys = keys_of(0);
    let (a, _ra) = Bus::start(zero, ls.next().unwrap()).unwrap();
    let mut one = config(1, &addresses, 2, 1);
    one.keys = keys_of(1);
    let (b, _rb) = Bus::start(one, ls.next().unwrap()).unwrap();
    wait_until("members 0 and 1 linked", || {
        a.bundle_up(1) && b.bundle_up(0)
    })
    .await;
}
