//! Single handlers, driven directly: a pure harness of a few replicas on a virtual
//! clock whose message queue a test can drop, hold or alter (the shape of
//! `quinn-proto`'s `Pair`). Whole runs with faults are the simulator's job.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::*;
use crate::state::CounterMachine;

/// Replicas of group 0, their pending messages and write completions.
struct Harness {
    replicas: Vec<Replica<CounterMachine>>,
    now: u64,
    /// (from, to, message) not yet delivered.
    messages: Vec<(ReplicaId, ReplicaId, Message)>,
    /// (replica, completion) of writes not yet done.
    writes: Vec<(ReplicaId, Input)>,
    replies: Vec<Reply>,
}

impl Harness {
    fn new(replica_count: u8) -> Self {
        Self::with(replica_count, |_| {})
    }

    /// Replicas whose configs `adjust` changes first.
    fn with(replica_count: u8, adjust: impl Fn(&mut Config)) -> Self {
        let replicas = (0..replica_count)
            .map(|r| {
                let mut config = Config::new(0, r, replica_count, 9);
                adjust(&mut config);
                Replica::new(config, CounterMachine::default())
            })
            .collect::<Result<Vec<_>, _>>()
            .unwrap();
        Self {
            replicas,
            now: 1,
            messages: Vec::new(),
            writes: Vec::new(),
            replies: Vec::new(),
        }
    }

    /// Feeds one input to one replica and files its outputs.
    fn input(&mut self, replica: ReplicaId, input: Input) {
        let mut out = Vec::new();
        self.replicas[usize::from(replica)].step(self.now, input, &mut out);
        for output in out {
            match output {
                Output::Send { to, message } => self.messages.push((replica, to, message)),
                Output::WriteJournal(p) => self.writes.push((
                    replica,
                    Input::JournalWritten {
                        op: p.header.op,
                        checksum: p.header.checksum,
                    },
                )),
                Output::WriteState(state) => {
                    self.writes.push((replica, Input::StateWritten(state)))
                }
                Output::Reply(reply) => self.replies.push(reply),
                _ => {}
            }
        }
    }

    fn request(&mut self, to: ReplicaId, session: u64, request: u64, body: &[u8]) {
        let message = Message::Request(Request {
            client: 7,
            session,
            request,
            body: bytes::Bytes::copy_from_slice(body),
        });
        self.input(to, Input::Message(message));
    }

    /// Completes every pending write.
    fn complete_writes(&mut self) {
        for (replica, input) in std::mem::take(&mut self.writes) {
            self.input(replica, input);
        }
    }

    /// Delivers pending messages that `keep(from, to, message)` accepts (the others
    /// are dropped).
    fn deliver(&mut self, mut keep: impl FnMut(ReplicaId, ReplicaId, &Message) -> bool) {
        for (from, to, message) in std::mem::take(&mut self.messages) {
            if keep(from, to, &message) {
                self.input(to, Input::Message(message));
            }
        }
    }

    /// Writes and messages until nothing is pending, at most `rounds` rounds.
    fn settle(&mut self, rounds: usize) {
        for _ in 0..rounds {
            if self.messages.is_empty() && self.writes.is_empty() {
                return;
            }
            self.complete_writes();
            self.deliver(|_, _, _| true);
        }
    }

    /// Moves the clock tick by tick, at most `ticks`, until `done`: replicas whose
    /// deadline came are ticked, writes complete, and messages `keep` accepts arrive.
    fn run_until(
        &mut self,
        ticks: u64,
        mut keep: impl FnMut(ReplicaId, ReplicaId, &Message) -> bool,
        done: impl Fn(&Self) -> bool,
    ) -> bool {
        self.run_altering(ticks, |from, to, message| keep(from, to, message), done)
    }

    /// [`Harness::run_until`] whose filter may also change a message on its way.
    fn run_altering(
        &mut self,
        ticks: u64,
        mut alter: impl FnMut(ReplicaId, ReplicaId, &mut Message) -> bool,
        done: impl Fn(&Self) -> bool,
    ) -> bool {
        for _ in 0..ticks {
            if done(self) {
                return true;
            }
            self.now += 1;
            for r in 0..self.replicas.len() {
                if self.replicas[r]
                    .next_deadline()
                    .is_some_and(|d| d <= self.now)
                {
                    self.input(r as ReplicaId, Input::Tick);
                }
            }
            self.complete_writes();
            for (from, to, mut message) in std::mem::take(&mut self.messages) {
                if alter(from, to, &mut message) {
                    self.input(to, Input::Message(message));
                }
            }
        }
        done(self)
    }

    fn replica(&self, replica: ReplicaId) -> &Replica<CounterMachine> {
        &self.replicas[usize::from(replica)]
    }
}

/// A registered session on a settled group: returns the harness and the session id.
fn registered(replica_count: u8) -> (Harness, u64) {
    let mut h = Harness::new(replica_count);
    h.request(0, 0, 1, b"");
    h.settle(50);
    let reply = h.replies.pop().unwrap();
    let session = u64::from_be_bytes(reply.result.unwrap().try_into().unwrap());
    (h, session)
}

#[test]
fn config_validation_refuses_what_cannot_run() {
    let ok = Config::new(0, 0, 3, 1);
    assert_eq!(ok.validate(), Ok(()));
    let refused = [
        Config {
            replica_count: 0,
            ..ok
        },
        Config { replica: 3, ..ok },
        Config {
            pipeline_max: 0,
            ..ok
        },
        Config {
            checkpoint_interval: 0,
            ..ok
        },
        Config {
            journal_keep: 10,
            ..ok
        },
        Config {
            sessions_max: 0,
            ..ok
        },
        Config {
            heartbeat_ticks: 0,
            ..ok
        },
        Config {
            view_change_ticks: 10,
            ..ok
        },
        Config {
            replica_count: REPLICAS_MAX + 1,
            ..ok
        },
    ];
    for config in refused {
        let err = config.validate().unwrap_err();
        assert!(!err.to_string().is_empty());
        assert!(
            Replica::new(config, CounterMachine::default()).is_err(),
            "{err}"
        );
    }
}

#[test]
fn a_prepare_ok_from_outside_the_group_is_ignored_and_counted() {
    let (mut h, session) = registered(3);
    h.request(0, session, 1, b"k=1");
    h.complete_writes();
    let prepared = h.replica(0).op();
    let checksum = h.replica(0).header(prepared).unwrap().checksum;
    h.messages.clear(); // the backups never hear of it
    for from in [7, 0] {
        // A stray id, and one posing as the primary itself.
        let forged = Message::PrepareOk {
            view: 0,
            op: prepared,
            checksum,
            from,
        };
        h.input(0, Input::Message(forged));
    }
    assert_eq!(h.replica(0).ignored().foreign_sender, 2);
    assert!(
        h.replica(0).commit_max() < prepared,
        "no quorum was counted"
    );
    let real = Message::PrepareOk {
        view: 0,
        op: prepared,
        checksum,
        from: 1,
    };
    h.input(0, Input::Message(real));
    assert_eq!(h.replica(0).commit_max(), prepared);
}

#[test]
fn a_start_view_change_from_outside_the_group_never_makes_a_quorum() {
    let mut h = Harness::new(3);
    h.settle(10);
    h.input(
        1,
        Input::Message(Message::StartViewChange { view: 1, from: 9 }),
    );
    h.complete_writes();
    assert_eq!(h.replica(1).ignored().foreign_sender, 1);
    assert_eq!(
        h.replica(1).status(),
        Status::Normal,
        "a stray vote starts nothing"
    );
    h.input(
        1,
        Input::Message(Message::StartViewChange { view: 1, from: 2 }),
    );
    h.complete_writes();
    assert_eq!(h.replica(1).status(), Status::ViewChange);
    assert_eq!(h.replica(1).view(), 1);
    // Its own vote and 2's make a quorum: the DoViewChange goes to 1 (primary of view 1).
    h.messages
        .retain(|(_, _, m)| matches!(m, Message::DoViewChange { .. }));
    assert!(
        h.messages.is_empty(),
        "replica 1 is the new primary: its vote stays local"
    );
}

#[test]
fn a_commit_from_a_replica_that_does_not_lead_the_view_is_ignored() {
    let (mut h, session) = registered(3);
    h.request(0, session, 1, b"k=1");
    h.complete_writes();
    h.deliver(|_, to, _| to == 1); // replica 1 has the prepare, not the commit
    let op = h.replica(1).op();
    let checksum = h.replica(1).header(op).unwrap().checksum;
    let before = h.replica(1).commit_max();
    let forged = Message::Commit {
        view: 0,
        commit: op,
        checksum,
        from: 2,
    };
    h.input(1, Input::Message(forged));
    assert_eq!(h.replica(1).ignored().not_from_primary, 1);
    assert_eq!(h.replica(1).commit_max(), before);
}

#[test]
fn a_damaged_prepare_is_refused_and_counted() {
    let (mut h, session) = registered(3);
    h.request(0, session, 1, b"k=1");
    let mut damaged = 0;
    for (_, _, message) in &mut h.messages {
        if let Message::Prepare(prepare) = message {
            let mut body = prepare.body.to_vec();
            body[0] ^= 1;
            prepare.body = body.into();
            damaged += 1;
        }
    }
    assert_eq!(damaged, 2);
    let op_before = h.replica(1).op();
    h.deliver(|_, _, _| true);
    assert_eq!(
        h.replica(1).op(),
        op_before,
        "nothing damaged reached the journal"
    );
    assert_eq!(h.replica(1).ignored().damaged, 1);
}

#[test]
fn prepare_ok_waits_for_the_journal_write() {
    let (mut h, session) = registered(3);
    h.request(0, session, 1, b"k=1");
    h.complete_writes();
    h.deliver(|_, to, _| to == 1);
    assert!(
        !h.messages
            .iter()
            .any(|(_, _, m)| matches!(m, Message::PrepareOk { .. })),
        "no acknowledgement before the write completes"
    );
    h.complete_writes();
    assert!(h
        .messages
        .iter()
        .any(|(_, to, m)| *to == 0 && matches!(m, Message::PrepareOk { from: 1, .. })));
}

#[test]
fn a_request_runs_once_and_its_retry_gets_the_same_reply() {
    let (mut h, session) = registered(3);
    h.request(0, session, 1, b"k=5");
    h.settle(50);
    h.request(0, session, 1, b"k=5");
    h.settle(50);
    let answers: Vec<_> = h.replies.iter().filter(|r| r.request == 1).collect();
    assert_eq!(answers.len(), 2);
    assert_eq!(answers[0].result, Ok(b"5".to_vec()));
    assert_eq!(answers[1].result, Ok(b"5".to_vec()));
    // Both go to the client that registered the session (the first once went to a
    // client numbered like the session, so only retries ever reached the sender).
    assert!(answers.iter().all(|a| a.client == 7), "{answers:?}");
    for r in 0..3 {
        assert_eq!(
            h.replica(r).state().machine().get("k"),
            5,
            "replica {r} ran it once"
        );
    }
}

/// A quiescent group keeps no timer, so it only learns its primary died when a client
/// comes to a backup: that backup must stay awake until a view change (the quiescence
/// at the end of the same step once dropped the timer it had just armed).
#[test]
fn a_backup_a_client_woke_replaces_a_dead_quiescent_primary() {
    let mut h = Harness::with(3, |c| c.quiesce = true);
    h.request(0, 0, 1, b"");
    h.settle(50);
    let session = u64::from_be_bytes(h.replies.pop().unwrap().result.unwrap().try_into().unwrap());
    h.request(0, session, 1, b"k=1");
    let quiet = h.run_until(
        2_000,
        |_, _, _| true,
        |h| (0..3).all(|r| h.replica(r).next_deadline().is_none()),
    );
    assert!(quiet, "the idle group went quiet");
    // Replica 0 dies; nobody notices until a client asks replica 1.
    let nothing = h.run_until(
        500,
        |from, to, _| from != 0 && to != 0,
        |h| h.replica(1).view() > 0,
    );
    assert!(!nothing, "a quiet group does not move on its own");
    h.request(1, session, 2, b"k=1");
    let elected = h.run_until(
        2_000,
        |from, to, _| from != 0 && to != 0,
        |h| (1..3).any(|r| h.replica(r).is_primary()),
    );
    assert!(elected, "the woken backup led the group to a new view");
}

#[test]
fn a_backup_told_its_link_to_the_primary_is_gone_replaces_a_quiescent_primary() {
    let mut h = Harness::with(3, |c| c.quiesce = true);
    h.request(0, 0, 1, b"");
    h.settle(50);
    let quiet = h.run_until(
        2_000,
        |_, _, _| true,
        |h| (0..3).all(|r| h.replica(r).next_deadline().is_none()),
    );
    assert!(quiet, "the idle group went quiet");
    // Losing a peer that does not lead the view changes nothing.
    h.input(1, Input::PeerLost(2));
    assert_eq!(
        h.replica(1).next_deadline(),
        None,
        "woken by a backup's loss"
    );
    // Replica 0 is cut off (its clients may still reach it); the shells of 1 and 2
    // see their links to it go.
    h.input(1, Input::PeerLost(0));
    h.input(2, Input::PeerLost(0));
    assert!(
        h.replica(1).next_deadline().is_some(),
        "watching its primary"
    );
    let elected = h.run_until(
        2_000,
        |from, to, _| from != 0 && to != 0,
        |h| (1..3).any(|r| h.replica(r).is_primary()),
    );
    assert!(elected, "the backups led the group to a new view");
}

#[test]
fn a_silent_primary_is_replaced_and_its_view_moves_on() {
    let (mut h, session) = registered(3);
    h.request(0, session, 1, b"k=1");
    h.settle(50);
    // Replica 0 is cut off: every message from or to it is dropped.
    h.messages.clear();
    let elected = h.run_until(
        2_000,
        |from, to, _| from != 0 && to != 0,
        |h| h.replica(1).is_primary() && h.replica(1).commit_min() >= 2,
    );
    assert!(elected);
    assert!(h.replica(1).is_primary(), "replica 1 leads view 1");
    assert_eq!(h.replica(1).view(), 1);
    assert_eq!(
        h.replica(1).state().machine().get("k"),
        1,
        "the committed op survived"
    );
}

#[test]
#[should_panic(expected = "contradicts canonical entry")]
fn a_commit_anchor_contradicting_a_canonical_entry_is_an_assertion() {
    let (mut h, session) = registered(3);
    h.request(0, session, 1, b"k=1");
    h.complete_writes();
    h.deliver(|_, to, _| to == 1);
    let op = h.replica(1).op();
    // The primary of view 0 claims another checksum for an op its prepare pinned.
    let forged = Message::Commit {
        view: 0,
        commit: op,
        checksum: 42,
        from: 0,
    };
    h.input(1, Input::Message(forged));
}

#[test]
fn a_primary_cut_off_from_its_backups_steps_down_instead_of_holding_its_client() {
    let (mut h, session) = registered(3);
    let window = 2 * h.replica(0).config.view_change_ticks;
    // Idle, the primary never steps down, however long nobody writes.
    h.run_until(10 * window, |_, _, _| true, |_| false);
    assert_eq!(h.replica(0).step_downs(), 0);
    // Busy, with each op committed within the window: no step-down either.
    for request in 1..=5 {
        h.request(0, session, request, format!("k={request}").as_bytes());
        let start = h.replica(0).commit_min();
        // Backups' answers held for most of the window, then delivered.
        let mut held = Vec::new();
        h.run_until(
            window - 10,
            |from, to, message| {
                if from != 0 {
                    held.push((from, to, message.clone()));
                }
                from == 0
            },
            |_| false,
        );
        h.messages.extend(held);
        h.run_until(
            window,
            |_, _, _| true,
            |h| h.replica(0).commit_min() > start,
        );
        assert!(
            h.replica(0).commit_min() > start,
            "request {request} committed"
        );
    }
    assert_eq!(h.replica(0).step_downs(), 0);
    assert!(h.replica(0).is_primary());
    let committed = h.replica(0).commit_max();

    // Cut off from its peers, but not from its client: the request is prepared and
    // can never commit. Within the window the primary stops leading and answers
    // nothing, so the node answers its client NotLeader.
    h.request(0, session, 6, b"k=6");
    let before = h.now;
    let stepped = h.run_until(
        window + 5,
        |from, to, _| from != 0 && to != 0,
        |h| !h.replica(0).is_primary(),
    );
    assert!(stepped, "the cut-off primary still leads");
    assert!(h.now - before >= window, "stepped down early");
    assert_eq!(h.replica(0).step_downs(), 1);
    assert_eq!(h.replica(0).status(), Status::ViewChange);
    assert_eq!(
        h.replica(0).commit_max(),
        committed,
        "nothing more committed"
    );
    assert!(
        h.replies.iter().all(|r| r.request != 6),
        "the cut-off primary answered the request"
    );
}

#[test]
fn a_replica_restarted_as_primary_of_its_log_view_leaves_it() {
    let (mut h, session) = registered(3);
    h.request(0, session, 1, b"k=1");
    h.settle(50);
    let state = DurableState::default();
    let persisted = Persisted {
        durable: state,
        checkpoint: None,
        journal: Vec::new(),
        journal_trusted: true,
    };
    let mut restarted = Replica::restart(
        Config::new(0, 0, 3, 9),
        CounterMachine::default(),
        persisted,
    )
    .unwrap();
    assert_eq!(restarted.status(), Status::Recovering);
    let mut out = Vec::new();
    restarted.step(h.now, Input::Tick, &mut out);
    assert_eq!(restarted.status(), Status::ViewChange);
    assert_eq!(restarted.view(), 1, "it never leads view 0 again");
    assert!(out
        .iter()
        .any(|o| matches!(o, Output::WriteState(s) if s.view == 1)));
}

#[test]
fn an_untrusted_journal_persists_its_distrust_before_anything_else() {
    let state = DurableState {
        view: 2,
        log_view: 2,
        commit: 5,
        ..DurableState::default()
    };
    let persisted = Persisted {
        durable: state,
        checkpoint: None,
        journal: Vec::new(),
        journal_trusted: false,
    };
    let mut restarted = Replica::restart(
        Config::new(0, 1, 3, 9),
        CounterMachine::default(),
        persisted,
    )
    .unwrap();
    assert!(!restarted.journal_trusted());
    let mut out = Vec::new();
    restarted.step(1, Input::Tick, &mut out);
    let Some(Output::WriteState(written)) = out.first() else {
        panic!("the first output persists the state: {out:?}");
    };
    assert_eq!(written.journal_trusted_through, 5);
}

/// Simulator seed 871958. A primary of a view that never committed anything (its
/// backup never heard its StartView) prepared on top of an older op a later view then
/// committed. When a snapshot of that later view reaches it, its own canonical suffix
/// contradicts the snapshot although the snapshot's header names an older view than
/// its own: the header's view is only the view that prepared the op. The replica must
/// cut the dead suffix and leave its view, not assert.
#[test]
fn a_snapshot_committed_by_a_later_view_cuts_a_dead_views_suffix() {
    let (mut h, session) = registered(3);
    // Replica 2 never gets the body of op 2 (so it can never apply past op 1 on its
    // own): every prepare of op 2 to it is dropped, every suffix it gets loses the body
    // of op 2, and snapshots wait for the end.
    let starve = |to: ReplicaId, message: &mut Message| -> bool {
        if to != 2 {
            return true;
        }
        match message {
            Message::Prepare(p) => p.header.op != 2,
            Message::Snapshot { .. } => false,
            Message::StartView { suffix, .. } | Message::DoViewChange { suffix, .. } => {
                for entry in suffix.iter_mut().filter(|e| e.header.op == 2) {
                    entry.body = None;
                }
                true
            }
            _ => true,
        }
    };
    // View 0: op 2 commits on replicas 0 and 1.
    h.request(0, session, 1, b"a=1");
    let committed = h.run_altering(
        200,
        |from, to, m| from != 2 && starve(to, m),
        |h| h.replica(0).commit_min() >= 2 && h.replica(1).commit_max >= 2,
    );
    assert!(committed, "op 2 committed in view 0");
    // View 1 (replica 1 leads; 0 is cut off): op 3 is prepared on replica 1 only.
    let view_1 = h.run_altering(
        2_000,
        |from, to, m| from != 0 && to != 0 && starve(to, m),
        |h| {
            h.replica(1).is_primary()
                && h.replica(2).view() == 1
                && h.replica(2).status() == Status::Normal
        },
    );
    assert!(view_1, "replicas 1 and 2 formed view 1");
    assert_eq!(h.replica(2).commit_min(), 1, "replica 2 cannot apply op 2");
    h.request(1, session, 2, b"b=2");
    h.complete_writes();
    h.messages.clear();
    assert_eq!(h.replica(1).op(), 3);
    // View 2 (replica 2 leads; 1 is cut off; 0 never hears the StartView): replica 2
    // prepares ops 3 and 4 of view 2 on itself alone, canonical there.
    let view_2 = h.run_altering(
        4_000,
        |from, to, m| {
            from != 1 && to != 1 && !matches!(m, Message::StartView { .. }) && starve(to, m)
        },
        |h| {
            let r2 = h.replica(2);
            r2.is_primary() && r2.view() == 2 && r2.status() == Status::Normal && r2.view_durable()
        },
    );
    assert!(view_2, "replica 2 leads view 2");
    h.request(2, session, 3, b"c=3");
    h.request(2, session, 4, b"d=4");
    h.complete_writes();
    h.messages.clear();
    assert_eq!(h.replica(2).op(), 4);
    let dead = h.replica(2).journal.get(&4).unwrap();
    assert!(dead.canonical && dead.header.view == 2);
    // View 3 (replica 0 leads with replica 1; 2 is cut off) commits replica 1's op 3
    // of view 1.
    let view_3 = h.run_altering(
        8_000,
        |from, to, m| from != 2 && to != 2 && starve(to, m),
        |h| h.replica(0).is_primary() && h.replica(0).view() >= 3 && h.replica(0).commit_min() >= 3,
    );
    assert!(view_3, "replicas 0 and 1 committed op 3 in a later view");
    let later_view = h.replica(0).view();
    assert_eq!(h.replica(0).state().machine().get("b"), 2);
    // Replica 2 asks replica 0 for a snapshot and gets it.
    h.messages.clear();
    h.input(0, Input::Message(Message::RequestSnapshot { from: 2 }));
    let snapshot = h
        .messages
        .iter()
        .find_map(|(_, to, m)| match m {
            Message::Snapshot {
                checkpoint, view, ..
            } if *to == 2 => Some((checkpoint.header, *view)),
            _ => None,
        })
        .unwrap();
    assert_eq!(snapshot.0.op, 3);
    assert_eq!(snapshot.0.view, 1, "the op was prepared in view 1");
    assert_eq!(
        snapshot.1, later_view,
        "and sent from the view that committed it"
    );
    h.deliver(|_, to, m| to == 2 && matches!(m, Message::Snapshot { .. }));
    let r2 = h.replica(2);
    assert_eq!(r2.commit_min(), 3, "the snapshot is installed");
    assert_eq!(r2.op(), 3, "the dead view's op 4 is cut");
    assert!(!r2.is_primary(), "the cut primary left its view");
    assert_eq!(r2.state().machine().get("b"), 2);
    assert_eq!(r2.state().machine().get("c"), 0);
    // It asked the later view's primary for its log.
    assert!(h.messages.iter().any(|(from, to, m)| *from == 2
        && *to == 0
        && matches!(m, Message::RequestStartView { view, .. } if *view == later_view)));
    // Healed, the three agree and nothing of view 2 ever applied.
    let converged = h.run_until(
        8_000,
        |_, _, _| true,
        |h| {
            (0..3).all(|r| h.replica(r).status() == Status::Normal)
                && (0..3).all(|r| h.replica(r).commit_min() == h.replica(0).commit_min())
                && (0..3).all(|r| h.replica(r).view() == h.replica(0).view())
        },
    );
    assert!(converged, "the group converged after the heal");
    for r in 0..3 {
        let machine = h.replica(r).state().machine();
        assert_eq!((machine.get("a"), machine.get("b")), (1, 2));
        assert_eq!((machine.get("c"), machine.get("d")), (0, 0), "replica {r}");
    }
}

/// A replica that lost everything (its disk was replaced) and restarts untrusted from
/// op 0: with the only other holder of a committed op down, a view change between it
/// and a replica that never had the op must wait, never drop the op.
#[test]
fn a_wiped_replica_restarted_untrusted_never_helps_drop_a_committed_op() {
    let mut h = op_2_committed_without_replica_2();
    // Replica 1's disk is wiped: it restarts with nothing, untrusted from op 0.
    restart_1_and_expect_no_view_without_op_2(&mut h, Persisted::after_disk_loss());
    // Replica 0 comes back: the group goes on with op 2.
    let healed = h.run_until(
        10_000,
        |_, _, _| true,
        |h| {
            (0..3)
                .all(|r| h.replica(r).commit_min() >= 2 && h.replica(r).status() == Status::Normal)
        },
    );
    assert!(healed);
    for r in 0..3 {
        assert_eq!(h.replica(r).state().machine().get("k"), 1, "replica {r}");
    }
}

/// A replica that lost its unsynced writes in a power loss (all of them above what it
/// knew committed) must not help a view change drop an op it acknowledged before the
/// loss, with the op's only other holder down.
#[test]
fn a_power_lost_replica_never_helps_drop_an_op_it_acknowledged() {
    let mut h = op_2_committed_without_replica_2();
    // Replica 1 acknowledged op 2 (unsynced) and lost it with the page cache: its
    // durable state says view 0, commit 1; its journal ends at op 1.
    let journal: Vec<(u64, JournalSlot)> = (1..=1)
        .filter_map(|op| {
            let e = h.replica(1).journal.get(&op)?;
            Some((
                op,
                JournalSlot::Prepare(Prepare {
                    header: e.header,
                    body: e.body.clone()?,
                }),
            ))
        })
        .collect();
    let lost = Persisted {
        durable: DurableState {
            commit: 1,
            ..DurableState::default()
        },
        checkpoint: None,
        journal,
        journal_trusted: false,
    };
    restart_1_and_expect_no_view_without_op_2(&mut h, lost);
}

/// A group of three where op 2 (`k=1`) committed on replicas 0 and 1 and replica 2
/// never saw it.
fn op_2_committed_without_replica_2() -> Harness {
    let (mut h, session) = registered(3);
    h.request(0, session, 1, b"k=1");
    let committed = h.run_until(
        200,
        |from, to, _| from != 2 && to != 2,
        |h| h.replica(0).commit_min() >= 2,
    );
    assert!(committed, "op 2 committed on replicas 0 and 1");
    h
}

/// Restarts replica 1 from `persisted` with replica 0 (the only other holder of the
/// committed op 2) cut off: replicas 1 and 2 must not form a view without op 2.
fn restart_1_and_expect_no_view_without_op_2(h: &mut Harness, persisted: Persisted) {
    h.replicas[1] = Replica::restart(
        Config::new(0, 1, 3, 9),
        CounterMachine::default(),
        persisted,
    )
    .unwrap();
    expect_no_view_without_op_2(h);
}

/// With replica 0 (the only other holder of the committed op 2) cut off, replicas 1
/// and 2 must not form a view without op 2.
fn expect_no_view_without_op_2(h: &mut Harness) {
    h.messages.clear();
    let formed = h.run_until(
        5_000,
        |from, to, _| from != 0 && to != 0,
        |h| (1..3).any(|r| h.replica(r).is_primary()),
    );
    for r in 1..3 {
        if h.replica(r).is_primary() {
            assert!(
                h.replica(r).op() >= 2,
                "replica {r} leads a view without the committed op 2"
            );
        }
    }
    assert!(
        !formed,
        "a view formed without the only intact holder of op 2"
    );
}

/// Simulator seed 930886: a new primary counted a quorum of acknowledgements for op 3
/// while op 2 below it had none; a backup's `Committed` then said op 2 was committed.
/// Op 3 must commit at once: its backups have acknowledged it, so no retry would ever
/// ask them again.
#[test]
fn acknowledgements_counted_above_an_op_another_replica_says_committed_commit_it() {
    let (mut h, session) = registered(3);
    h.request(0, session, 1, b"a=1");
    h.request(0, session, 2, b"b=2");
    h.complete_writes();
    // The prepares arrive; only replica 1's acknowledgement of op 3 gets back.
    h.deliver(|_, _, m| matches!(m, Message::Prepare(_)));
    h.complete_writes();
    h.deliver(|from, _, m| matches!(m, Message::PrepareOk { op: 3, .. }) && from == 1);
    assert_eq!(
        h.replica(0).commit_max(),
        1,
        "op 2 has no acknowledgement yet"
    );
    let op2 = h.replica(0).journal.get(&2).unwrap().header.checksum;
    h.messages.clear();
    h.input(
        0,
        Input::Message(Message::Committed {
            view: 0,
            commit: 2,
            checksum: op2,
            from: 2,
        }),
    );
    assert_eq!(h.replica(0).commit_max(), 3, "op 3 commits with its quorum");
    assert_eq!(h.replica(0).state().machine().get("b"), 2);
}

/// Seed 948762: a replica that installed a snapshot pruned its whole journal below it,
/// ops it had acknowledged included; when that newest checkpoint was then damaged, the
/// fallback (the checkpoint before it) had no journal above it, and those ops were
/// gone from the replica. A snapshot install, like any checkpoint, prunes no higher
/// than the previous checkpoint.
#[test]
fn a_snapshot_install_keeps_the_journal_above_its_fallback_checkpoint() {
    let (mut h, session) = registered(3);
    for r in 0..3 {
        let config = &mut h.replicas[r].config;
        config.checkpoint_interval = 4;
        config.journal_keep = 4;
    }
    // Ops 2..=5 everywhere: replica 2 checkpoints at op 4.
    for request in 1..=4 {
        h.request(0, session, request, format!("k{request}=1").as_bytes());
        h.settle(50);
    }
    assert_eq!(h.replica(2).commit_min(), 5);
    let fallback = h.replica(2).checkpoint_op;
    assert!(fallback >= 4, "replica 2 took a checkpoint");
    // Replica 2 never gets op 6, so it cannot apply past 5, while it writes and
    // acknowledges ops above it.
    let misses_6 = |_: ReplicaId, to: ReplicaId, m: &Message| {
        to != 2
            || !matches!(m, Message::Snapshot { .. })
                && !matches!(m, Message::Prepare(p) if p.header.op == 6)
    };
    for request in 5..=11 {
        h.request(0, session, request, format!("k{request}=1").as_bytes());
        for _ in 0..50 {
            h.complete_writes();
            h.deliver(misses_6);
        }
    }
    assert_eq!(h.replica(0).commit_min(), 12);
    assert_eq!(
        h.replica(2).commit_min(),
        5,
        "replica 2 is stuck below op 6"
    );
    assert!(
        (7..=11).all(|op| h.replica(2).journal.contains_key(&op)),
        "it holds ops 7..=11"
    );
    // It installs replica 0's snapshot at op 12.
    h.messages.clear();
    h.input(0, Input::Message(Message::RequestSnapshot { from: 2 }));
    let (_, _, snapshot) = h
        .messages
        .drain(..)
        .find(|(_, to, m)| *to == 2 && matches!(m, Message::Snapshot { .. }))
        .unwrap();
    let mut out = Vec::new();
    h.replicas[2].step(h.now, Input::Message(snapshot), &mut out);
    assert_eq!(h.replica(2).commit_min(), 12, "the snapshot is installed");
    // Seed 1153468: the fallback need not have a journal up to the snapshot, so the
    // snapshot goes into both checkpoint copies (one damaged copy leaves the other).
    let copies = out
        .iter()
        .filter(|o| matches!(o, Output::WriteCheckpoint(c) if c.header.op == 12))
        .count();
    assert_eq!(
        copies, 2,
        "the installed snapshot fills both checkpoint copies"
    );
    let pruned = out
        .iter()
        .filter_map(|o| match o {
            Output::PruneJournal { op } => Some(*op),
            _ => None,
        })
        .max()
        .unwrap_or(0);
    assert!(
        pruned <= fallback,
        "pruned through {pruned}, above the fallback checkpoint {fallback}: ops 7..=11 would go with a damaged newest checkpoint"
    );
}

mod issue_24;
mod trust;

/// A new primary whose commit point lags ops the views before it committed (the commit
/// messages were lost) must not refuse a session it has not applied yet as unknown: the
/// client would register again and send its request anew, and a pending copy of it in
/// the new primary's log would run too. It answers once its state is complete.
#[test]
fn a_new_primary_behind_its_log_never_refuses_a_session_as_unknown() {
    let mut h = Harness::new(3);
    h.request(0, 0, 1, b"");
    // The register commits at replica 0; no commit point reaches the backups.
    let registered = h.run_until(
        200,
        |_, _, m| !matches!(m, Message::Commit { .. }),
        |h| !h.replies.is_empty(),
    );
    assert!(registered);
    let reply = h.replies.pop().unwrap();
    let session = u64::from_be_bytes(reply.result.unwrap().try_into().unwrap());
    assert!(
        h.replica(1).commit_max() < h.replica(1).op(),
        "replica 1 lags"
    );
    // Replica 0 is cut off; replica 1 leads view 1, its commit point still behind.
    h.messages.clear();
    let elected = h.run_until(
        2_000,
        |from, to, m| from != 0 && to != 0 && !matches!(m, Message::PrepareOk { .. }),
        |h| h.replica(1).is_primary() && h.replica(1).status() == Status::Normal,
    );
    assert!(elected);
    h.complete_writes();
    assert!(
        !h.replica(1).state().has_session(session),
        "not applied yet"
    );
    assert_eq!(h.replica(1).commit_min(), h.replica(1).commit_max());
    h.request(1, session, 1, b"k=1");
    assert!(
        h.replies
            .iter()
            .all(|r| r.result != Err(Refusal::SessionUnknown)),
        "{:?}",
        h.replies
    );
    // Once its log commits, the client's retry runs, once.
    let caught_up = h.run_until(
        2_000,
        |from, to, _| from != 0 && to != 0,
        |h| h.replica(1).state().has_session(session),
    );
    assert!(caught_up);
    h.request(1, session, 1, b"k=1");
    h.run_until(
        2_000,
        |from, to, _| from != 0 && to != 0,
        |h| h.replica(1).state().machine().get("k") == 1,
    );
    assert_eq!(h.replica(1).state().machine().get("k"), 1);
    assert!(h.replies.iter().any(|r| r.request == 1 && r.result.is_ok()));
}
