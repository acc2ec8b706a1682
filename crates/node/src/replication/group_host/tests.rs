use super::*;
use crate::metadata::MetaOp;
use crate::replication::machine::MetadataMachine;
use braid_vsr::{Request, Status};
use std::collections::VecDeque;

/// A client of the metadata group: a session and its request numbers.
struct MetaClient {
    id: u64,
    session: u64,
    next: u64,
}

impl MetaClient {
    fn register(id: u64) -> (Self, Message) {
        let client = Self {
            id,
            session: 0,
            next: 1,
        };
        let message = Message::Request(Request {
            client: id,
            session: 0,
            request: 1,
            body: Vec::new(),
        });
        (client, message)
    }

    fn propose(&mut self, op: &MetaOp) -> Message {
        let request = self.next;
        self.next += 1;
        Message::Request(Request {
            client: self.id,
            session: self.session,
            request,
            body: MetadataMachine::input(op),
        })
    }
}

fn stream(name: &str) -> MetaOp {
    MetaOp::CreateStream { name: name.into() }
}

fn config(replica: u8, count: u8) -> Config {
    Config::new(0, replica, count, 7)
}

/// Ticks a lone replica until it is normal (a restarted one recovers by itself).
fn tick_until_normal(host: &mut GroupHost<MetadataMachine>, now: &mut u64) {
    for _ in 0..1_000 {
        if host.replica().status() == Status::Normal {
            return;
        }
        *now += 1;
        host.step(*now, Input::Tick).unwrap();
    }
    panic!("the replica never became normal");
}

#[test]
fn a_lone_replica_commits_to_disk_and_restarts_with_every_op() {
    let dir = tempfile::tempdir().unwrap();
    let mut now = 0;
    let mut host = GroupHost::open(dir.path(), config(0, 1), MetadataMachine::default()).unwrap();
    tick_until_normal(&mut host, &mut now);
    let (mut client, register) = MetaClient::register(9);
    let effects = host.step(now, Input::Message(register)).unwrap();
    client.session = effects.replies[0].session;
    // Enough ops to pass a checkpoint (every 64) and prune the journal below it.
    for i in 0..100 {
        let message = client.propose(&stream(&format!("s{i}")));
        let effects = host.step(now, Input::Message(message)).unwrap();
        assert_eq!(effects.replies.len(), 1, "op {i} answered");
        let result = effects.replies[0].result.clone().unwrap();
        MetadataMachine::outcome(&result).unwrap();
    }
    let again = client.propose(&stream("s0"));
    let refused = host.step(now, Input::Message(again)).unwrap();
    let result = refused.replies[0].result.clone().unwrap();
    assert!(
        MetadataMachine::outcome(&result).is_err(),
        "a second s0 is refused"
    );
    let before = host.replica().state().machine().state().clone();
    drop(host);

    let mut host = GroupHost::open(dir.path(), config(0, 1), MetadataMachine::default()).unwrap();
    tick_until_normal(&mut host, &mut now);
    assert_eq!(host.replica().state().machine().state(), &before);
    assert_eq!(host.replica().state().machine().state().streams.len(), 100);
    // The session survives the restart: its next request is served, once.
    let message = client.propose(&stream("after"));
    let effects = host.step(now, Input::Message(message.clone())).unwrap();
    MetadataMachine::outcome(&effects.replies[0].result.clone().unwrap()).unwrap();
    let retried = host.step(now, Input::Message(message)).unwrap();
    assert_eq!(
        retried.replies[0].result, effects.replies[0].result,
        "a retry is answered from the session"
    );
    assert_eq!(host.replica().state().machine().state().streams.len(), 101);
    assert!(
        std::fs::read_dir(dir.path()).unwrap().any(|e| e
            .unwrap()
            .file_name()
            .to_string_lossy()
            .starts_with("group-0.checkpoint")),
        "a checkpoint was written"
    );
}

#[test]
fn a_lone_replica_with_a_damaged_journal_refuses_to_start() {
    let dir = tempfile::tempdir().unwrap();
    let mut now = 0;
    let mut host = GroupHost::open(dir.path(), config(0, 1), MetadataMachine::default()).unwrap();
    tick_until_normal(&mut host, &mut now);
    let (mut client, register) = MetaClient::register(1);
    client.session = host.step(now, Input::Message(register)).unwrap().replies[0].session;
    for i in 0..5 {
        host.step(
            now,
            Input::Message(client.propose(&stream(&format!("s{i}")))),
        )
        .unwrap();
    }
    drop(host);
    let path = dir.path().join("group-0.journal");
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[40] ^= 0xff;
    std::fs::write(&path, &bytes).unwrap();
    let refused = GroupHost::open(dir.path(), config(0, 1), MetadataMachine::default());
    let err = refused.expect_err("a damaged lone journal was accepted");
    assert!(err.to_string().contains("no peer"), "{err}");
}

/// Three hosts on three directories, messages moved between them in memory.
struct Trio {
    dirs: Vec<tempfile::TempDir>,
    hosts: Vec<Option<GroupHost<MetadataMachine>>>,
    wire: VecDeque<(ReplicaId, Message)>,
    replies: Vec<Reply>,
    now: u64,
}

impl Trio {
    fn new() -> Self {
        let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
        let hosts = (0..3u8)
            .map(|r| {
                Some(
                    GroupHost::open(
                        dirs[r as usize].path(),
                        config(r, 3),
                        MetadataMachine::default(),
                    )
                    .unwrap(),
                )
            })
            .collect();
        Self {
            dirs,
            hosts,
            wire: VecDeque::new(),
            replies: Vec::new(),
            now: 0,
        }
    }

    fn deliver(&mut self, to: ReplicaId, input: Input) {
        let now = self.now;
        if let Some(host) = self.hosts[to as usize].as_mut() {
            let effects = host.step(now, input).unwrap();
            self.wire.extend(effects.sends);
            self.replies.extend(effects.replies);
        }
    }

    /// Runs the wire dry, ticking every host `ticks` times along the way.
    fn run(&mut self, ticks: u64) {
        for _ in 0..ticks {
            self.now += 1;
            for r in 0..3 {
                self.deliver(r, Input::Tick);
            }
            while let Some((to, message)) = self.wire.pop_front() {
                self.deliver(to, Input::Message(message));
            }
        }
    }

    fn primary(&self) -> ReplicaId {
        self.hosts
            .iter()
            .flatten()
            .find(|h| h.replica().is_primary() && h.replica().status() == Status::Normal)
            .map(|h| h.replica().config().replica)
            .expect("a normal primary")
    }

    fn request(&mut self, message: Message) -> Reply {
        self.replies.clear();
        let primary = self.primary();
        self.deliver(primary, Input::Message(message));
        for _ in 0..200 {
            if let Some(reply) = self.replies.pop() {
                return reply;
            }
            self.run(1);
        }
        panic!("no reply");
    }

    fn restart(&mut self, r: ReplicaId) {
        self.hosts[r as usize] = None;
        self.hosts[r as usize] = Some(
            GroupHost::open(
                self.dirs[r as usize].path(),
                config(r, 3),
                MetadataMachine::default(),
            )
            .unwrap(),
        );
    }
}

#[test]
fn three_replicas_on_real_disks_agree_through_restarts() {
    let mut trio = Trio::new();
    trio.run(100);
    let (mut client, register) = MetaClient::register(5);
    client.session = trio.request(register).session;
    for i in 0..40 {
        let reply = trio.request(client.propose(&stream(&format!("s{i}"))));
        MetadataMachine::outcome(&reply.result.unwrap()).unwrap();
        if i == 15 {
            // A backup restarts from its disk in the middle.
            let backup = (trio.primary() + 1) % 3;
            trio.restart(backup);
        }
        if i == 30 {
            // The primary restarts: a view change, then the new primary serves.
            let primary = trio.primary();
            trio.restart(primary);
            trio.run(400);
        }
    }
    trio.run(400);
    let states: Vec<_> = trio
        .hosts
        .iter()
        .flatten()
        .map(|h| h.replica().state().machine().state().clone())
        .collect();
    assert_eq!(states.len(), 3);
    assert!(
        trio.hosts.iter().flatten().all(|h| h.replica().view() > 0),
        "the primary's restart moved the group to a new view"
    );
    assert_eq!(
        states[0].streams.len(),
        40,
        "every acknowledged op is there"
    );
    assert!(
        states.iter().all(|s| s == &states[0]),
        "the replicas disagree"
    );
}
