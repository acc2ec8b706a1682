//! What an idle group costs a node, measured with a counting allocator: the bytes the
//! heap holds for 2,000 quiescent groups, divided by the groups. The figure in
//! `docs/architecture.md` comes from this test
//! (`cargo test -p braid-vsr --test idle_memory -- --nocapture`).

// A panic in a test is a failed assertion, not a crash on outside data.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::alloc::System;

use braid_vsr::{Config, CounterMachine, Input, Message, Node, Output, Replica, Request};
use cap::Cap;

#[global_allocator]
static ALLOCATOR: Cap<System> = Cap::new(System, usize::MAX);

const GROUPS: u64 = 2_000;
const NODES: u8 = 3;

/// Drives three nodes with a loss-free message loop for `ticks`.
fn run(
    nodes: &mut [Node<CounterMachine>],
    from: u64,
    ticks: u64,
    mut inbox: Vec<(u8, u64, Input)>,
) {
    for now in from..from + ticks {
        let mut next = Vec::new();
        for (node, group, input) in inbox.drain(..) {
            let mut out = Vec::new();
            nodes[usize::from(node)]
                .step(now, group, input, &mut out)
                .unwrap();
            next.extend(out.into_iter().map(|o| (node, o)));
        }
        for (index, node) in nodes.iter_mut().enumerate() {
            let mut out = Vec::new();
            node.tick(now, &mut out);
            next.extend(out.into_iter().map(|o| (index as u8, o)));
        }
        for (node, (group, output)) in next {
            match output {
                Output::Send { to, message } => inbox.push((to, group, Input::Message(message))),
                Output::WriteJournal(p) => inbox.push((
                    node,
                    group,
                    Input::JournalWritten {
                        op: p.header.op,
                        checksum: p.header.checksum,
                    },
                )),
                Output::WriteState(s) => inbox.push((node, group, Input::StateWritten(s))),
                _ => {}
            }
        }
    }
}

#[test]
fn an_idle_group_costs_little_heap() {
    let before = ALLOCATOR.allocated();
    let mut nodes: Vec<Node<CounterMachine>> = (0..NODES)
        .map(|replica| {
            let mut node = Node::new();
            for group in 0..GROUPS {
                let mut config = Config::new(group, replica, NODES, 7);
                config.quiesce = true;
                node.insert(Replica::new(config, CounterMachine::default()).unwrap());
            }
            node
        })
        .collect();
    // One session and one request per group, then silence.
    run(&mut nodes, 1, 200, one_request_per_group(0, 1, b""));
    run(&mut nodes, 200, 300, one_request_per_group(1, 1, b"k=1"));
    for node in &nodes {
        assert_eq!(node.armed_groups(), 0, "every group went quiet");
        assert_eq!(node.next_deadline(), None, "idle groups keep no timer");
        for group in 0..GROUPS {
            let replica = node.replica(group).unwrap();
            assert_eq!(replica.commit_min(), 2);
            assert!(
                replica.journal_len() <= 1,
                "only the commit anchor stays in memory"
            );
        }
    }
    let held = ALLOCATOR.allocated() - before;
    let per_group = held as u64 / (GROUPS * u64::from(NODES));
    eprintln!(
        "idle group: {per_group} bytes of heap per group per node ({held} bytes for {GROUPS} groups on {NODES} nodes; the Replica struct alone is {} bytes)",
        std::mem::size_of::<Replica<CounterMachine>>()
    );
    assert!(per_group <= 1_200, "an idle group holds {per_group} bytes");
    // A message wakes one group; the others stay quiet.
    let wake = vec![one_request_per_group(1, 2, b"k=2").remove(0)];
    run(&mut nodes, 500, 100, wake);
    assert_eq!(nodes[0].replica(0).unwrap().commit_min(), 3);
    assert_eq!(nodes.iter().map(Node::armed_groups).sum::<usize>(), 0);
}

/// A request of `session` for every group, sent to the group's primary of view 0.
fn one_request_per_group(session: u64, request: u64, body: &[u8]) -> Vec<(u8, u64, Input)> {
    (0..GROUPS)
        .map(|group| {
            let primary = (group % u64::from(NODES)) as u8;
            let request = Request {
                client: 1,
                session,
                request,
                body: bytes::Bytes::copy_from_slice(body),
            };
            (primary, group, Input::Message(Message::Request(request)))
        })
        .collect()
}
