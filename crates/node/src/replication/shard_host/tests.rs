use super::*;
use crate::metadata::{op, MetaOp};
use crate::replication::boot::Stamp;
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
            body: bytes::Bytes::new(),
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
            body: MetadataMachine::input(std::slice::from_ref(op)).into(),
        })
    }
}

fn stream(name: &str) -> MetaOp {
    MetaOp::CreateStream(op::CreateStream { name: name.into() })
}

fn config(replica: u8, count: u8) -> Config {
    Config::new(0, replica, count, 7)
}

type Host = ShardHost<MetadataMachine>;

/// A shard host holding only the metadata group.
fn open(dir: &std::path::Path, replica: u8, count: u8) -> Result<Host, HostError> {
    let mut host = ShardHost::open(dir, 0)?;
    host.add_group(config(replica, count), MetadataMachine::default())?;
    Ok(host)
}

/// One input to group 0.
fn step(host: &mut Host, now: u64, input: Input) -> Effects {
    host.step(now, vec![(0, input)]).unwrap()
}

/// The metadata group 0 holds on `host`.
fn metadata(host: &Host) -> &crate::metadata::Metadata {
    host.replica(0).unwrap().state().machine().state()
}

fn replies(effects: &Effects) -> Vec<&Reply> {
    effects.replies.iter().map(|(_, r)| r).collect()
}

/// Ticks a lone replica until it is normal (a restarted one recovers by itself).
fn tick_until_normal(host: &mut Host, now: &mut u64) {
    for _ in 0..1_000 {
        if host.replica(0).unwrap().status() == Status::Normal {
            return;
        }
        *now += 1;
        host.tick(*now).unwrap();
    }
    panic!("the replica never became normal");
}

#[test]
fn a_lone_replica_commits_to_disk_and_restarts_with_every_op() {
    let dir = tempfile::tempdir().unwrap();
    let mut now = 0;
    let mut host = open(dir.path(), 0, 1).unwrap();
    tick_until_normal(&mut host, &mut now);
    let (mut client, register) = MetaClient::register(9);
    let effects = step(&mut host, now, Input::Message(register));
    client.session = replies(&effects)[0].session;
    // Enough ops to pass a checkpoint (every 64) and prune the journal below it.
    for i in 0..100 {
        let message = client.propose(&stream(&format!("s{i}")));
        let effects = step(&mut host, now, Input::Message(message));
        assert_eq!(effects.replies.len(), 1, "op {i} answered");
        let result = replies(&effects)[0].result.clone().unwrap();
        MetadataMachine::outcome(&result).unwrap();
    }
    let again = client.propose(&stream("s0"));
    let refused = step(&mut host, now, Input::Message(again));
    let result = replies(&refused)[0].result.clone().unwrap();
    assert!(
        MetadataMachine::outcome(&result).is_err(),
        "a second s0 is refused"
    );
    let before = metadata(&host).clone();
    drop(host);

    let mut host = open(dir.path(), 0, 1).unwrap();
    tick_until_normal(&mut host, &mut now);
    assert_eq!(metadata(&host), &before);
    assert_eq!(metadata(&host).streams.len(), 100);
    // The session survives the restart: its next request is served, once.
    let message = client.propose(&stream("after"));
    let effects = step(&mut host, now, Input::Message(message.clone()));
    MetadataMachine::outcome(&replies(&effects)[0].result.clone().unwrap()).unwrap();
    let retried = step(&mut host, now, Input::Message(message));
    assert_eq!(
        replies(&retried)[0].result,
        replies(&effects)[0].result,
        "a retry is answered from the session"
    );
    assert_eq!(metadata(&host).streams.len(), 101);
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
    let mut host = open(dir.path(), 0, 1).unwrap();
    tick_until_normal(&mut host, &mut now);
    let (mut client, register) = MetaClient::register(1);
    client.session = replies(&step(&mut host, now, Input::Message(register)))[0].session;
    for i in 0..5 {
        let message = client.propose(&stream(&format!("s{i}")));
        step(&mut host, now, Input::Message(message));
    }
    drop(host);
    let path = dir.path().join("group-0.journal");
    let mut bytes = std::fs::read(&path).unwrap();
    // Inside the first record (after the magic and head, 64 bytes).
    bytes[120] ^= 0xff;
    std::fs::write(&path, &bytes).unwrap();
    let refused = open(dir.path(), 0, 1);
    let err = refused.expect_err("a damaged lone journal was accepted");
    assert!(err.to_string().contains("no peer"), "{err}");
}

/// Three hosts on three directories, messages moved between them in memory.
struct Trio {
    dirs: Vec<tempfile::TempDir>,
    hosts: Vec<Option<Host>>,
    wire: VecDeque<(ReplicaId, Message)>,
    replies: Vec<Reply>,
    now: u64,
}

impl Trio {
    fn new() -> Self {
        let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
        let hosts = (0..3u8)
            .map(|r| Some(open(dirs[r as usize].path(), r, 3).unwrap()))
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
            let effects = match input {
                Input::Tick => host.tick(now).unwrap(),
                input => host.step(now, vec![(0, input)]).unwrap(),
            };
            self.wire
                .extend(effects.sends.into_iter().map(|(_, to, m)| (to, m)));
            self.replies
                .extend(effects.replies.into_iter().map(|(_, r)| r));
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
            .filter_map(|h| h.replica(0))
            .find(|r| r.is_primary() && r.status() == Status::Normal)
            .map(|r| r.config().replica)
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
        self.hosts[r as usize] = Some(open(self.dirs[r as usize].path(), r, 3).unwrap());
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
    assert!(
        trio.hosts
            .iter()
            .flatten()
            .all(|h| h.replica(0).unwrap().view() > 0),
        "the primary's restart moved the group to a new view"
    );
    assert_agree_on_streams(&trio, 40);
}

/// The shell simulator's seeds 40 and 123 with damage: a zeroed page over the start of
/// a member's metadata journal ("not a journal file") refused the member's start. A
/// member of a cluster moves such a journal aside, restarts the group untrusted (the
/// mark durable before the new file is made, the distrust durable before its first
/// step, then the mark gone) and takes the ops from its peers.
#[test]
fn an_unreadable_metadata_journal_of_a_member_is_taken_from_its_peers() {
    let mut trio = Trio::new();
    trio.run(100);
    let (mut client, register) = MetaClient::register(5);
    client.session = trio.request(register).session;
    for i in 0..10 {
        let reply = trio.request(client.propose(&stream(&format!("s{i}"))));
        MetadataMachine::outcome(&reply.result.unwrap()).unwrap();
    }
    let backup = (trio.primary() + 1) % 3;
    trio.hosts[backup as usize] = None;
    let dir = trio.dirs[backup as usize].path().to_owned();
    let path = dir.join("group-0.journal");
    let len = std::fs::metadata(&path).unwrap().len() as usize;
    std::fs::write(&path, vec![0u8; len.min(4096)]).unwrap();
    let host = open(&dir, backup, 3).expect("a member starts");
    let replica = host.replica(0).unwrap();
    assert!(!replica.journal_trusted(), "its journal is untrusted");
    assert_eq!(
        on_disk(&dir).1.map(|d| d.journal_trusted_through),
        Some(0),
        "the distrust is durable before the first step"
    );
    assert!(dir.join("group-0.journal.damaged").exists(), "kept aside");
    assert!(
        !dir.join("group-0.journal.untrusted").exists(),
        "the mark goes once the state says it"
    );
    trio.hosts[backup as usize] = Some(host);
    trio.run(400);
    for i in 10..15 {
        let reply = trio.request(client.propose(&stream(&format!("s{i}"))));
        MetadataMachine::outcome(&reply.result.unwrap()).unwrap();
    }
    trio.run(400);
    assert_agree_on_streams(&trio, 15);
    // A lone replica has no peer: the same file refuses its start.
    let lone = tempfile::tempdir().unwrap();
    std::fs::write(lone.path().join("group-0.journal"), vec![0u8; 4096]).unwrap();
    assert!(matches!(
        open(lone.path(), 0, 1),
        Err(HostError::Journal(JournalError::NotAJournal { .. }))
    ));
}

/// Every one of the three hosts holds the same metadata, with `streams` streams.
fn assert_agree_on_streams(trio: &Trio, streams: usize) {
    let states: Vec<_> = trio
        .hosts
        .iter()
        .flatten()
        .map(|h| h.replica(0).unwrap().state().machine().state().clone())
        .collect();
    assert_eq!(states.len(), 3);
    assert_eq!(
        states[0].streams.len(),
        streams,
        "every acknowledged op is there"
    );
    assert!(
        states.iter().all(|s| s == &states[0]),
        "the replicas disagree"
    );
}

/// Issue 24, finding 10: a group whose durable state is damaged in both copies of
/// the states table restarts as a replica that lost its disk, never from an older or
/// an empty state; the others serve meanwhile and it catches up with every op. A lone
/// replica with the same damage refuses to start.
#[test]
fn a_state_damaged_in_both_copies_restarts_as_a_lost_disk_and_catches_up() {
    let mut trio = Trio::new();
    trio.run(100);
    let (mut client, register) = MetaClient::register(5);
    client.session = trio.request(register).session;
    for i in 0..30 {
        let reply = trio.request(client.propose(&stream(&format!("s{i}"))));
        MetadataMachine::outcome(&reply.result.unwrap()).unwrap();
        if i == 20 {
            let backup = (trio.primary() + 1) % 3;
            trio.hosts[backup as usize] = None;
            damage_group_slots(trio.dirs[backup as usize].path());
            trio.restart(backup);
            let host = trio.hosts[backup as usize].as_ref().unwrap();
            assert_eq!(
                host.replica(0).unwrap().view(),
                0,
                "restarted as a lost disk"
            );
        }
    }
    trio.run(600);
    assert_agree_on_streams(&trio, 30);

    let dir = tempfile::tempdir().unwrap();
    {
        let mut host = open(dir.path(), 0, 1).unwrap();
        step(&mut host, 1, Input::Tick);
    }
    damage_group_slots(dir.path());
    let refused = open(dir.path(), 0, 1).unwrap_err();
    assert!(refused.to_string().contains("states table"), "{refused}");
}

/// Flips a bit in the state of every group slot of both copies of shard 0's table.
fn damage_group_slots(dir: &std::path::Path) {
    for copy in 0..2 {
        let path = dir.join(format!("shard-0.{copy}"));
        let mut bytes = std::fs::read(&path).unwrap();
        // Slots of 128 bytes after a 128-byte header; the state sits past the identity.
        let mut at = 128 + 64;
        while at < bytes.len() {
            bytes[at] ^= 0x40;
            at += 128;
        }
        std::fs::write(&path, &bytes).unwrap();
    }
}

/// Many groups on each of three shard hosts: each turn delivers a host every message
/// waiting for it, across groups, in one step (one states write for all of them); a
/// host restarts in the middle; every group ends with its ops on all three.
#[test]
fn many_groups_share_each_hosts_turns_and_agree_through_a_restart() {
    const GROUPS: u64 = 12;
    let dirs: Vec<_> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let open_all = |r: u8| {
        let mut host = ShardHost::open(dirs[r as usize].path(), 0).unwrap();
        for group in 0..GROUPS {
            let config = Config::new(group, r, 3, group * 3 + u64::from(r));
            host.add_group(config, MetadataMachine::default()).unwrap();
        }
        host
    };
    let mut hosts: Vec<Host> = (0..3).map(open_all).collect();
    let mut wire: Vec<(u8, u64, Message)> = Vec::new();
    let mut replies: Vec<(u64, Reply)> = Vec::new();
    let mut now = 0u64;
    // One turn: every host ticks, then takes all messages for it in one step.
    let mut turn = |hosts: &mut Vec<Host>,
                    wire: &mut Vec<(u8, u64, Message)>,
                    replies: &mut Vec<(u64, Reply)>,
                    extra: Vec<(u8, u64, Message)>| {
        now += 1;
        wire.extend(extra);
        for (r, host) in hosts.iter_mut().enumerate() {
            let mine: Vec<(u64, Input)> = wire
                .iter()
                .filter(|(to, _, _)| *to as usize == r)
                .map(|(_, g, m)| (*g, Input::Message(m.clone())))
                .collect();
            wire.retain(|(to, _, _)| *to as usize != r);
            let mut effects = host.tick(now).unwrap();
            let stepped = host.step(now, mine).unwrap();
            effects.sends.extend(stepped.sends);
            effects.replies.extend(stepped.replies);
            wire.extend(effects.sends.into_iter().map(|(g, to, m)| (to, g, m)));
            replies.extend(effects.replies);
        }
    };
    for _ in 0..100 {
        turn(&mut hosts, &mut wire, &mut replies, Vec::new());
    }
    let primary_of = |hosts: &Vec<Host>, group: u64| -> u8 {
        hosts
            .iter()
            .filter_map(|h| h.replica(group))
            .find(|r| r.is_primary() && r.status() == Status::Normal)
            .map(|r| r.config().replica)
            .expect("a primary")
    };
    // Register a session in every group, then three ops per group.
    let mut sessions = vec![0u64; GROUPS as usize];
    for group in 0..GROUPS {
        let (_, register) = MetaClient::register(group + 100);
        let to = primary_of(&hosts, group);
        turn(
            &mut hosts,
            &mut wire,
            &mut replies,
            vec![(to, group, register)],
        );
        for _ in 0..50 {
            if let Some(i) = replies.iter().position(|(g, r)| *g == group && r.register) {
                sessions[group as usize] = replies.remove(i).1.session;
                break;
            }
            turn(&mut hosts, &mut wire, &mut replies, Vec::new());
        }
        assert_ne!(sessions[group as usize], 0, "group {group} registered");
    }
    for round in 0..3u64 {
        if round == 1 {
            hosts[2] = ShardHost::open(dirs[2].path(), 0).unwrap();
            for group in 0..GROUPS {
                let config = Config::new(group, 2, 3, group * 3 + 2);
                hosts[2]
                    .add_group(config, MetadataMachine::default())
                    .unwrap();
            }
            for _ in 0..300 {
                turn(&mut hosts, &mut wire, &mut replies, Vec::new());
            }
        }
        let mut requests = Vec::new();
        for group in 0..GROUPS {
            let message = Message::Request(Request {
                client: group + 100,
                session: sessions[group as usize],
                request: round + 1,
                body: MetadataMachine::input(&[stream(&format!("g{group}r{round}"))]).into(),
            });
            requests.push((primary_of(&hosts, group), group, message));
        }
        replies.clear();
        turn(&mut hosts, &mut wire, &mut replies, requests);
        for _ in 0..200 {
            if replies.iter().filter(|(_, r)| !r.register).count() >= GROUPS as usize {
                break;
            }
            turn(&mut hosts, &mut wire, &mut replies, Vec::new());
        }
        assert_eq!(
            replies.len(),
            GROUPS as usize,
            "round {round}: every group answered"
        );
    }
    for _ in 0..300 {
        turn(&mut hosts, &mut wire, &mut replies, Vec::new());
    }
    for group in 0..GROUPS {
        let states: Vec<_> = hosts
            .iter()
            .map(|h| h.replica(group).unwrap().state().machine().state().clone())
            .collect();
        assert_eq!(states[0].streams.len(), 3, "group {group}");
        assert!(
            states.iter().all(|s| s == &states[0]),
            "group {group} disagrees"
        );
    }
}

/// Replica 0 of a three-member group whose journal, like a partition's under
/// `fsync = never`, reports writes before it syncs them, opened by a process of boot
/// `boot`, after one turn.
fn open_unsynced(dir: &std::path::Path, boot: BootId) -> Host {
    open_unsynced_found(dir, boot, false)
}

/// As [`open_unsynced`], its open having found damage at rest (`damaged_at_rest`).
fn open_unsynced_found(dir: &std::path::Path, boot: BootId, damaged_at_rest: bool) -> Host {
    let mut host = ShardHost::open_in_boot(dir, 0, boot).unwrap();
    let (journal, recovered) = JournalFile::open(&dir.join("group-0.journal"), 0).unwrap();
    let opened = Opened {
        slots: recovered.slots,
        damage: None,
        trusted: false,
        tail_cut: false,
        damaged_at_rest,
    };
    host.add_group_with(
        config(0, 3),
        MetadataMachine::default(),
        journal,
        opened,
        &std::sync::Arc::from(dir),
    )
    .unwrap();
    host.step(1, vec![(0, Input::Tick)]).unwrap();
    host
}

/// The group's stamp and state as the states file on disk holds them.
fn on_disk(dir: &std::path::Path) -> (Option<Stamp>, Option<braid_vsr::DurableState>) {
    let states = GroupStates::open(dir, 0, BootId::from_bytes([9; 16])).unwrap();
    (states.stamp(0), states.get(0))
}

#[test]
fn an_unsynced_journal_is_trusted_after_a_restart_in_the_boot_that_wrote_its_state() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (BootId::from_bytes([1; 16]), BootId::from_bytes([2; 16]));
    let host = open_unsynced(dir.path(), a);
    assert!(host.replica(0).unwrap().journal_trusted(), "a new member");
    drop(host);
    assert_eq!(
        on_disk(dir.path()).0,
        Some(Stamp::Boot(a)),
        "stamped at once"
    );

    // A process crash: the page cache held every write it reported.
    let host = open_unsynced(dir.path(), a);
    assert!(host.replica(0).unwrap().journal_trusted());
    drop(host);

    // A reboot: writes reported unsynced may be gone. The first turn persists the
    // reduced trust with the new boot's stamp...
    let host = open_unsynced(dir.path(), b);
    assert!(!host.replica(0).unwrap().journal_trusted());
    drop(host);
    let (stamp, state) = on_disk(dir.path());
    assert_eq!(stamp, Some(Stamp::Boot(b)));
    assert_ne!(state.unwrap().journal_trusted_through, u64::MAX);
    // ...which a later process crash keeps: still untrusted, from the state.
    let host = open_unsynced(dir.path(), b);
    assert!(!host.replica(0).unwrap().journal_trusted());
}

/// The boot's stamp vouches for what a crash in that boot keeps (the page cache), not
/// for what damage at rest takes: an open that found damage trusts the journal only on
/// its own evidence (the shell simulator's seed 304327, damage to sleeping files:
/// a member restarted in the same boot voted committed ops away).
#[test]
fn an_unsynced_journal_that_found_damage_is_untrusted_even_in_the_boot_that_wrote_it() {
    let dir = tempfile::tempdir().unwrap();
    let a = BootId::from_bytes([1; 16]);
    drop(open_unsynced(dir.path(), a));
    let host = open_unsynced_found(dir.path(), a, true);
    assert!(!host.replica(0).unwrap().journal_trusted());
    drop(host);
    // Persisted so: the next start in the same boot, damage or not, still doubts it.
    let host = open_unsynced(dir.path(), a);
    assert!(!host.replica(0).unwrap().journal_trusted());
}

#[test]
fn a_clean_stop_is_trusted_in_any_boot_until_the_next_write_restamps_it() {
    let dir = tempfile::tempdir().unwrap();
    let boots: Vec<BootId> = (1..=4).map(|b| BootId::from_bytes([b; 16])).collect();
    let mut host = open_unsynced(dir.path(), boots[0]);
    drop(host.take_journals());
    host.record_clean_stop(&[]).unwrap();
    drop(host);
    assert_eq!(on_disk(dir.path()).0, Some(Stamp::Synced));

    // A planned reboot: trusted, and from its first turn the stamp is this boot's...
    let host = open_unsynced(dir.path(), boots[1]);
    assert!(host.replica(0).unwrap().journal_trusted());
    drop(host);
    assert_eq!(on_disk(dir.path()).0, Some(Stamp::Boot(boots[1])));
    // ...so a power loss after it is not mistaken for a clean stop.
    let mut host = open_unsynced(dir.path(), boots[2]);
    assert!(!host.replica(0).unwrap().journal_trusted());

    // A journal whose close failed is stamped unknown: untrusted in any boot.
    drop(host.take_journals());
    host.record_clean_stop(&[0]).unwrap();
    drop(host);
    assert_eq!(on_disk(dir.path()).0, Some(Stamp::Unknown));
}

/// Damages both copies of group 0's checkpoint in `dir`: a flipped bit in each, or
/// (`delete`) both files removed.
fn damage_checkpoints(dir: &Path, delete: bool) {
    for copy in 0..2 {
        let path = dir.join(format!("group-0.checkpoint.{copy}"));
        if delete {
            let _ = std::fs::remove_file(&path);
        } else if let Ok(mut bytes) = std::fs::read(&path) {
            let last = bytes.len() - 1;
            bytes[last] ^= 0x01;
            std::fs::write(&path, &bytes).unwrap();
        }
    }
}

/// Both copies of a group's checkpoint damaged or deleted: a member of several restarts
/// the group with its views and journal (never refusing, never from nothing as if new),
/// installs a peer's checkpoint and catches up; a lone replica refuses (found by the
/// shell simulator with damage at rest, seed 40; deleted, by an outside review: a lone
/// node took the copies for never made and waited in a view change for ever).
#[test]
fn a_checkpoint_damaged_in_both_copies_is_taken_from_a_peer() {
    for delete in [false, true] {
        checkpoint_lost_in_both_copies(delete);
    }
}

fn checkpoint_lost_in_both_copies(delete: bool) {
    let mut trio = Trio::new();
    trio.run(100);
    let (mut client, register) = MetaClient::register(5);
    client.session = trio.request(register).session;
    let interval = config(0, 3).checkpoint_interval as usize;
    let ops = interval * 2 + 10;
    for i in 0..ops {
        let reply = trio.request(client.propose(&stream(&format!("s{i}"))));
        MetadataMachine::outcome(&reply.result.unwrap()).unwrap();
        if i == interval + 5 {
            let backup = (trio.primary() + 1) % 3;
            let view = trio.hosts[backup as usize]
                .as_ref()
                .and_then(|h| h.replica(0))
                .map(|r| r.view())
                .unwrap();
            trio.hosts[backup as usize] = None;
            damage_checkpoints(trio.dirs[backup as usize].path(), delete);
            trio.restart(backup);
            // Only the state below its journal is gone: it keeps its views and its
            // journal's vote (a lost disk's abstention could stall a group in which
            // another member doubts its journal too).
            let restarted = trio.hosts[backup as usize].as_ref().unwrap();
            let replica = restarted.replica(0).unwrap();
            assert_eq!(replica.view(), view);
            assert!(replica.journal_trusted());
        }
    }
    trio.run(800);
    assert_agree_on_streams(&trio, ops);

    let dir = tempfile::tempdir().unwrap();
    {
        let mut host = open(dir.path(), 0, 1).unwrap();
        step(&mut host, 1, Input::Tick);
    }
    damage_checkpoints(dir.path(), delete);
    let refused = open(dir.path(), 0, 1).unwrap_err();
    assert!(refused.to_string().contains("checkpoint"), "{refused}");
    assert!(
        !dir.path().join("group-0.checkpoint.0").exists() || !delete,
        "nothing made"
    );
}

/// A group found to have lost its files says so in its durable state at once, before
/// its files are made anew: a crash before the turn that would write the state must
/// not leave the old state beside a new, empty journal, which restarted the group
/// trusted and amnesiac (the shell simulator's seed 333206, whose member's votes then
/// dropped ops it had acknowledged).
#[test]
fn a_group_found_lost_is_durably_untrusted_before_its_files_are_made_again() {
    let dir = tempfile::tempdir().unwrap();
    {
        let mut host = open(dir.path(), 0, 3).unwrap();
        step(&mut host, 1, Input::Tick);
        assert!(host.has_state(0), "the group wrote its state");
    }
    {
        // Opened again, the group's files found gone: the process dies before a turn.
        let mut host = ShardHost::<MetadataMachine>::open(dir.path(), 0).unwrap();
        host.restart_as_lost(0).unwrap();
    }
    let states = GroupStates::open(dir.path(), 0, BootId::current()).unwrap();
    let state = states.get(0).unwrap();
    assert!(state.views_lost, "{state:?}");
    assert_eq!(state.journal_trusted_through, 0, "{state:?}");
}

/// A states-table slot damaged in both copies that names no group: a lone replica
/// refuses to start (no peer holds the lost state), a member of a cluster starts, and
/// a group without a proven state there may be the slot's (restarted as lost).
#[test]
fn a_slot_naming_no_group_refuses_a_lone_start_and_marks_stateless_groups() {
    let dir = tempfile::tempdir().unwrap();
    {
        let mut host = open(dir.path(), 0, 3).unwrap();
        step(&mut host, 1, Input::Tick);
        assert!(host.has_state(0));
    }
    for copy in 0..2 {
        let path = dir.path().join(format!("shard-0.{copy}"));
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[128..256].fill(0);
        std::fs::write(&path, &bytes).unwrap();
    }
    let host = ShardHost::<MetadataMachine>::open(dir.path(), 0).unwrap();
    let refused = host.refuse_lone_if_unattributable(1).unwrap_err();
    assert!(refused.to_string().contains("names no group"), "{refused}");
    host.refuse_lone_if_unattributable(3).unwrap();
    assert!(!host.has_state(0));
    assert!(host.state_may_be_lost(0));
}
