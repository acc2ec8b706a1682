//! The replica's side of issue 24's findings (a cluster that never diverges): trust
//! after a lost disk, what a vote may count as "never had it", hand-offs.

use super::*;

/// Issue 24, finding 14: a replica that lost its disk counted any `Views` answer, so a
/// delayed answer to a request from before the loss (naming an old view) could make
/// it trust itself too early. Only answers that echo this incarnation's nonce count.
#[test]
fn a_rejoining_replica_counts_only_answers_to_its_own_request() {
    let mut h = Harness::new(3);
    lose_disk(&mut h, 1);
    // Its own request, with the nonce it drew.
    h.input(1, Input::Tick);
    let mut ticks = 0;
    let nonce = loop {
        if let Some(nonce) = h.messages.iter().find_map(|(from, _, m)| match m {
            Message::RequestViews { nonce, .. } if *from == 1 => Some(*nonce),
            _ => None,
        }) {
            break nonce;
        }
        ticks += 1;
        assert!(ticks < 1_000, "it never asked for views");
        h.now += 1;
        h.input(1, Input::Tick);
    };
    h.messages.clear();
    // Two stale answers (another nonce) from a quorum of peers: not trusted yet.
    for from in [0, 2] {
        let stale = Message::Views {
            view: 0,
            primary_op: None,
            from,
            nonce: nonce ^ 1,
        };
        h.input(1, Input::Message(stale));
    }
    assert!(!h.replica(1).may_trust_in(0), "stale answers counted");
    for from in [0, 2] {
        let fresh = Message::Views {
            view: 0,
            primary_op: None,
            from,
            nonce,
        };
        h.input(1, Input::Message(fresh));
    }
    assert!(h.replica(1).may_trust_in(0), "its own answers count");
}

/// A vote holding an uncommitted op as its header alone never wrote its body (a body
/// written and lost is a damaged slot), so it says it never had it; a damaged slot, a
/// committed op and an op above a vote's trusted journal never count so.
#[test]
fn a_header_held_alone_above_the_commit_is_a_nack_and_a_damaged_slot_is_not() {
    let entry = |op: u64, body: Option<&'static [u8]>| SuffixEntry {
        header: Header {
            op,
            ..Header::root(1)
        }
        .seal(),
        body: body.map(bytes::Bytes::from_static),
    };
    let vote = ViewChangeVote {
        log_view: 3,
        op: 9,
        commit: 6,
        commit_checksum: None,
        suffix: vec![
            entry(6, None),
            entry(7, Some(b"body")),
            entry(8, None),
            entry(9, None),
        ],
        faulty: vec![9],
        trusted_through: u64::MAX,
    };
    let nacks = |vote: &ViewChangeVote, op| Replica::<CounterMachine>::nacks_op(vote, op, None);
    assert!(
        !nacks(&vote, 6),
        "committed: its body left memory when applied"
    );
    assert!(!nacks(&vote, 7), "held whole");
    assert!(
        nacks(&vote, 8),
        "a header alone above the commit: never written here"
    );
    assert!(
        !nacks(&vote, 9),
        "damaged: perhaps acknowledged before the damage"
    );
    assert!(nacks(&vote, 10), "above its log");
    let untrusted = ViewChangeVote {
        trusted_through: 7,
        ..vote
    };
    assert!(!nacks(&untrusted, 8), "above what its journal vouches for");
}

/// A slot damaged at restart whose header alone comes back (from a peer's log) may hold
/// an op this replica acknowledged before the damage: its vote lists the op as faulty,
/// never as "never had it", until a body is written there again (the shell simulator's
/// seed 825: such a header counted as a nack and an acknowledged op was dropped).
#[test]
fn a_header_alone_over_a_damaged_slot_is_never_a_nack() {
    let ops = chain(0, 3, 1);
    let persisted = Persisted {
        durable: DurableState {
            view: 1,
            log_view: 1,
            commit: 1,
            ..DurableState::default()
        },
        checkpoint: None,
        journal: vec![
            (1, JournalSlot::Prepare(ops[0].clone())),
            (2, JournalSlot::Damaged),
            (3, JournalSlot::Header(ops[2].header)),
        ],
        journal_trusted: true,
    };
    let mut replica = Replica::restart(
        Config::new(0, 1, 3, 9),
        CounterMachine::default(),
        persisted,
    )
    .unwrap();
    assert_eq!(
        replica.faulty_in_vote(1),
        vec![2],
        "damaged, header unknown"
    );
    let mut out = Vec::new();
    replica.insert_entry(ops[1].header, None, false, &mut out);
    assert_eq!(
        replica.faulty_in_vote(1),
        vec![2],
        "its header is known again, its body is not: still perhaps acknowledged"
    );
    replica.insert_entry(ops[1].header, Some(ops[1].body.clone()), false, &mut out);
    assert!(
        replica.faulty_in_vote(1).is_empty(),
        "written whole again; op 3, a header alone never over damage, may be nacked"
    );
}

/// Prepares 1..=`count` of `group` in `view`, each chained to the one below.
fn chain(group: u64, count: u64, view: u64) -> Vec<Prepare> {
    let mut parent = Header::root(group).checksum;
    (1..=count)
        .map(|op| {
            let body = bytes::Bytes::from(format!("op {op}"));
            let header = Header {
                view,
                op,
                commit: op - 1,
                parent,
                body_checksum: crate::message::checksum(&body),
                ..Header::root(group)
            }
            .seal();
            parent = header.checksum;
            Prepare { header, body }
        })
        .collect()
}

/// A vote's entry holding `p` whole.
fn whole(p: &Prepare) -> SuffixEntry {
    SuffixEntry {
        header: p.header,
        body: Some(p.body.clone()),
    }
}

/// A vote's entry holding `header` alone.
fn alone(header: Header) -> SuffixEntry {
    SuffixEntry { header, body: None }
}

/// Replica 1 of 3 of `group` restarted with `durable` and a trusted journal holding
/// `ops` whole: a new primary about to adopt a log from votes.
fn restarted_holding(
    group: u64,
    durable: DurableState,
    ops: &[Prepare],
) -> Replica<CounterMachine> {
    Replica::restart(
        Config::new(group, 1, 3, 5),
        CounterMachine::default(),
        Persisted {
            durable,
            checkpoint: None,
            journal: ops
                .iter()
                .map(|p| (p.header.op, JournalSlot::Prepare(p.clone())))
                .collect(),
            journal_trusted: true,
        },
    )
    .unwrap()
}

/// Issue 24, finding 5: a replica that lost its disk and was shown the current view's
/// log (a StartView) before a quorum of peers answered its RequestViews stayed
/// untrusted for ever: the StartView it asks for next names the view it is in already,
/// which never counts as newer. It abstained from every view change, so the group had
/// no primary once the old one died. Normal on that view's log, it trusts its journal
/// as soon as the quorum's answers come.
#[test]
fn a_rejoined_replica_normal_before_its_views_answers_trusts_itself_then() {
    let (mut h, session) = registered(3);
    h.request(0, session, 1, b"k=1");
    h.settle(50);
    lose_disk(&mut h, 1);
    let (normal, held_back) = hold_back_to_1(
        &mut h,
        |m| matches!(m, Message::Views { .. }),
        |h| h.replica(1).status() == Status::Normal,
    );
    assert!(normal, "it never joined the view");
    assert!(!h.replica(1).journal_trusted(), "no quorum answered yet");
    for views in held_back {
        h.input(1, Input::Message(views));
    }
    h.settle(50);
    assert!(
        h.replica(1).journal_trusted(),
        "normal on the current view's log, and a quorum showed no newer view"
    );
}

/// The other order (an outside review of issue 24, a rejoined member of a real
/// cluster whose partition stayed untrusted while it took writes, and stalled once
/// another member died): a quorum's answers came while the replica was not normal yet,
/// so it asked the current view's primary for that view's log, and the StartView that
/// came named the view its lost disk left it in (view 0), which never counted as
/// newer. A rejoined replica trusts the log of any view its quorum's answers allow.
#[test]
fn a_rejoined_replica_whose_views_answers_come_first_trusts_the_start_view_it_asks_for() {
    let (mut h, session) = registered(3);
    h.request(0, session, 1, b"k=1");
    h.settle(50);
    assert_eq!(h.replica(0).view(), 0, "the group never left view 0");
    lose_disk(&mut h, 1);
    let (answered, held_back) = hold_back_to_1(
        &mut h,
        |m| matches!(m, Message::StartView { .. }),
        |h| h.replica(1).may_trust_in(0),
    );
    assert!(answered, "a quorum never answered its RequestViews");
    assert_ne!(h.replica(1).status(), Status::Normal, "normal already");
    for start_view in held_back {
        h.input(1, Input::Message(start_view));
    }
    h.settle(50);
    assert_eq!(h.replica(1).status(), Status::Normal);
    assert!(
        h.replica(1).journal_trusted(),
        "normal on the log of a view its quorum allows"
    );
}

/// A rejoined replica of a quiescent group (partitions drop their timers when idle)
/// whose first `RequestViews` went unanswered must not go quiet before a quorum
/// answers: quiet, it never asked again and stayed untrusted for ever, so the group had
/// no primary once another replica died (an outside review of issue 24, a real
/// cluster's idle partition on a member that rejoined after losing its disk).
#[test]
fn a_rejoined_replica_of_a_quiescent_group_asks_for_views_until_a_quorum_answers() {
    let mut h = Harness::with(3, |c| c.quiesce = true);
    h.request(0, 0, 1, b"");
    h.settle(50);
    let session = u64::from_be_bytes(h.replies.pop().unwrap().result.unwrap().try_into().unwrap());
    h.request(0, session, 1, b"k=1");
    h.settle(50);
    lose_disk(&mut h, 1);
    // Its first requests for views (one to each peer) are lost; everything else goes
    // through, and the group has nothing to do.
    let mut lost = 0;
    let trusted = h.run_until(
        20_000,
        |_, _, message| {
            if matches!(message, Message::RequestViews { .. }) && lost < 2 {
                lost += 1;
                return false;
            }
            true
        },
        |h| h.replica(1).journal_trusted(),
    );
    assert!(trusted, "the rejoined replica went quiet untrusted");
}

/// Issue 24, finding 8: leadership never spread back after failovers. A primary asked
/// to hand off moves the group to the next view its preferred replica (view 0's
/// primary) leads, once that replica acknowledged its newest op and nothing is in
/// flight; every committed op is kept. Asked earlier, it does nothing.
#[test]
fn a_primary_hands_the_group_back_to_its_preferred_replica_once_it_holds_the_log() {
    let (mut h, session) = registered(3);
    assert_eq!(h.replica(0).primary_of(0), 0, "replica 0 is preferred");
    // Replica 0 goes silent: the others elect replica 1 (view 1).
    let failed_over = h.run_until(
        10_000,
        |from, to, _| from != 0 && to != 0,
        |h| h.replica(1).is_primary(),
    );
    assert!(failed_over, "no failover");
    let view = h.replica(1).view();
    // Not yet: replica 0 has acknowledged nothing of this view.
    h.input(1, Input::HandOff);
    assert!(
        h.replica(1).is_primary(),
        "handed off to a replica that may lag"
    );
    // Replica 0 is back; a request commits with its acknowledgement.
    let rejoined = h.run_until(
        10_000,
        |_, _, _| true,
        |h| h.replica(0).status() == Status::Normal && h.replica(0).view() == view,
    );
    assert!(rejoined, "replica 0 never joined view {view}");
    h.request(1, session, 1, b"k=1");
    let replied = h.run_until(10_000, |_, _, _| true, |h| !h.replies.is_empty());
    assert!(replied, "the request was never answered");
    assert_eq!(h.replies.pop().map(|r| r.result.is_ok()), Some(true));
    let committed = h.replica(1).commit_max();
    h.input(1, Input::HandOff);
    let handed = h.run_until(10_000, |_, _, _| true, |h| h.replica(0).is_primary());
    assert!(handed, "the group never went back to replica 0");
    assert!(h.replica(0).view() > view);
    assert!(
        h.replica(0).commit_max() >= committed,
        "a committed op was lost"
    );
    // And it serves: the next request commits.
    // As a client would: sent again until answered (the first may come before the new
    // view is on disk, and is dropped).
    let mut replied = false;
    for _ in 0..100 {
        h.request(0, session, 2, b"k=2");
        replied = h.run_until(100, |_, _, _| true, |h| !h.replies.is_empty());
        if replied {
            break;
        }
    }
    assert!(replied, "the new primary never answered");
    assert_eq!(h.replies.pop().map(|r| r.result.is_ok()), Some(true));
}

/// The shell simulator's seed 5743: the newest op of view 1's log had no body left
/// anywhere (its primary's copy damaged, the other member held its header alone), and
/// the third replica, whose journal lost its tail to a power loss and knew nothing
/// committed, was untrusted from op 0. Untrusted from op 0 read as "lost its disk", so
/// it abstained, the op could be dropped by no quorum, and the view change waited for
/// ever. Its log view (0) is still its own: it was never normal in view 1, so it never
/// acknowledged the op, and its vote makes the quorum that drops it.
#[test]
fn an_untrusted_journal_of_an_older_log_view_never_acknowledged_a_newer_views_op() {
    let group = 2;
    let old = chain(group, 3, 0);
    // View 1's op 3 replaced view 0's; the primary of view 1 prepared it.
    let newer = Header {
        view: 1,
        op: 3,
        commit: 2,
        parent: old[1].header.checksum,
        body_checksum: crate::message::checksum(b"op 3 of view 1"),
        ..Header::root(group)
    }
    .seal();
    let persisted = Persisted {
        durable: DurableState {
            view: 3,
            log_view: 0,
            commit: 0,
            ..DurableState::default()
        },
        checkpoint: None,
        journal: old
            .iter()
            .map(|p| (p.header.op, JournalSlot::Prepare(p.clone())))
            .collect(),
        journal_trusted: false, // a torn tail, and nothing known committed
    };
    let mut replica = Replica::restart(
        Config::new(group, 0, 3, 5),
        CounterMachine::default(),
        persisted,
    )
    .unwrap();
    assert!(
        !replica.views_lost(),
        "untrusted from op 0, but its views are its own: not a lost disk"
    );
    let own = ViewChangeVote {
        log_view: 0,
        op: 3,
        commit: 0,
        commit_checksum: None,
        suffix: old.iter().map(whole).collect(),
        faulty: vec![],
        trusted_through: 0,
    };
    let damaged = ViewChangeVote {
        log_view: 1,
        op: 3,
        commit: 0,
        commit_checksum: None,
        suffix: vec![whole(&old[0]), whole(&old[1]), alone(newer)],
        faulty: vec![3],
        trusted_through: u64::MAX,
    };
    let header_alone = ViewChangeVote {
        faulty: vec![],
        ..damaged.clone()
    };
    let votes: BTreeMap<ReplicaId, ViewChangeVote> =
        [(0, own), (1, damaged), (2, header_alone)].into();
    let mut out = Vec::new();
    assert!(replica.adopt_canonical_log(&votes, &mut out));
    assert_eq!(
        replica.op(),
        2,
        "view 1's op 3, which no quorum acknowledged, is dropped"
    );
    assert!(out
        .iter()
        .any(|o| matches!(o, Output::TruncateJournal { op: 2 })));
    // Without the older log view's vote, the op may have committed: the view waits.
    let mut votes = votes;
    votes.remove(&0);
    let mut waiting = Replica::restart(
        Config::new(group, 0, 3, 5),
        CounterMachine::default(),
        Persisted {
            durable: DurableState {
                view: 3,
                log_view: 1,
                commit: 0,
                ..DurableState::default()
            },
            checkpoint: None,
            journal: vec![],
            journal_trusted: true,
        },
    )
    .unwrap();
    waiting.adopt_canonical_log(&votes, &mut Vec::new());
    assert_eq!(waiting.op(), 3, "kept, waiting for its body");
}

/// The shell simulator's seed 24236 with damage at rest: the new primary knew ops up
/// to 3; a damaged replica knew ops 4 and 5 committed but had lost them (faulty), and
/// held 6..8 as headers alone, which the quorum never had and so dropped. Op 5, now
/// the top, was known only by the checksum op 6 named. Adopted, the view's log ended
/// at an op with no header to write: both voters restarted in log view 5 unable to
/// name it, and no later view could start. The view waits for a vote that holds it,
/// and starts with that vote's log.
#[test]
fn a_view_never_starts_with_a_top_known_only_by_checksum() {
    let group = 7;
    let ops = chain(group, 8, 0);
    let primary = || {
        let durable = DurableState {
            view: 5,
            log_view: 0,
            commit: 2,
            ..DurableState::default()
        };
        restarted_holding(group, durable, &ops[..3])
    };
    let own = ViewChangeVote {
        log_view: 0,
        op: 3,
        commit: 2,
        commit_checksum: Some(ops[1].header.checksum),
        suffix: ops[1..3].iter().map(whole).collect(),
        faulty: vec![],
        trusted_through: u64::MAX,
    };
    let damaged = ViewChangeVote {
        log_view: 0,
        op: 8,
        commit: 5,
        commit_checksum: None,
        suffix: vec![
            whole(&ops[2]),
            alone(ops[5].header),
            alone(ops[6].header),
            alone(ops[7].header),
        ],
        faulty: vec![4, 5],
        trusted_through: u64::MAX,
    };
    let mut votes: BTreeMap<ReplicaId, ViewChangeVote> = [(1, own), (2, damaged)].into();
    let mut replica = primary();
    let mut out = Vec::new();
    assert!(
        !replica.adopt_canonical_log(&votes, &mut out),
        "op 5 is named by no header any vote holds: the view waits"
    );
    assert!(
        !out.iter()
            .any(|o| matches!(o, Output::TruncateJournal { .. })),
        "nothing is cut while it waits"
    );
    // The third replica held op 5 (at its commit, a header) and the bodies above it.
    let holder = ViewChangeVote {
        log_view: 0,
        op: 8,
        commit: 5,
        commit_checksum: None,
        suffix: vec![
            alone(ops[4].header),
            whole(&ops[5]),
            whole(&ops[6]),
            whole(&ops[7]),
        ],
        faulty: vec![],
        trusted_through: u64::MAX,
    };
    votes.insert(0, holder);
    let mut replica = primary();
    let mut out = Vec::new();
    assert!(replica.adopt_canonical_log(&votes, &mut out));
    assert_eq!(replica.op(), 8, "the holder's ops are the view's log");
    let written: Vec<u64> = out
        .iter()
        .filter_map(|o| match o {
            Output::WriteHeader(h) => Some(h.op),
            Output::WriteJournal(p) => Some(p.header.op),
            _ => None,
        })
        .collect();
    assert_eq!(
        written,
        vec![5, 6, 7, 8],
        "every op above its own is written"
    );
}

/// The shell simulator's seed 2739 (damage at rest, four times the faults): the one
/// vote of the newest log view (6) held its ops above the commit as damaged, so it
/// could not name view 6's top; a vote of log view 5 held view 6's op 8 as a header
/// alone (it took the prepare before view 6's log), and another held op 8 of view 5,
/// which view 6's log replaced. An op number is prepared once per view, so the view-6
/// header is view 6's op 8 whoever holds it: it names the top, and since the two votes
/// of log view 5 were never normal in view 6, it is dropped. Before, no view could
/// start.
#[test]
fn an_older_log_views_vote_names_the_newer_views_op_it_holds() {
    let group = 9;
    let ops = chain(group, 7, 2);
    let newer = |view: u64, tag: &'static [u8]| {
        Header {
            view,
            op: 8,
            commit: 7,
            parent: ops[6].header.checksum,
            body_checksum: crate::message::checksum(tag),
            ..Header::root(group)
        }
        .seal()
    };
    let (of_view_6, of_view_5) = (newer(6, b"view 6"), newer(5, b"view 5"));
    let damaged = ViewChangeVote {
        log_view: 6,
        op: 8,
        commit: 7,
        commit_checksum: None,
        suffix: vec![alone(ops[5].header)],
        faulty: vec![7, 8],
        trusted_through: u64::MAX,
    };
    let header_alone = ViewChangeVote {
        log_view: 5,
        op: 8,
        commit: 5,
        commit_checksum: Some(ops[4].header.checksum),
        suffix: vec![
            alone(ops[4].header),
            alone(ops[5].header),
            alone(ops[6].header),
            alone(of_view_6),
        ],
        faulty: vec![],
        trusted_through: u64::MAX,
    };
    let replaced = ViewChangeVote {
        log_view: 5,
        op: 8,
        commit: 7,
        commit_checksum: None,
        suffix: vec![
            whole(&ops[6]),
            SuffixEntry {
                header: of_view_5,
                body: Some(bytes::Bytes::from_static(b"view 5")),
            },
        ],
        faulty: vec![],
        trusted_through: u64::MAX,
    };
    let votes: BTreeMap<ReplicaId, ViewChangeVote> =
        [(0, damaged), (1, header_alone), (2, replaced)].into();
    let durable = DurableState {
        view: 9,
        log_view: 5,
        commit: 5,
        ..DurableState::default()
    };
    let mut replica = restarted_holding(group, durable, &ops[..5]);
    let mut out = Vec::new();
    assert!(
        replica.adopt_canonical_log(&votes, &mut out),
        "view 6's op 8 is named, and dropped"
    );
    assert_eq!(replica.op(), 7, "the log ends at the commit");
    assert_eq!(
        replica.header(7).map(|h| h.checksum),
        Some(ops[6].header.checksum)
    );
}

/// The shell simulator's seed 315500 (misdirected and latent damage and damage to
/// sleeping files, four times the faults): view 10's one trusted voter held its newest
/// ops, never acknowledged, as scattered headers (6 and 8, without bodies); the second
/// voter of log view 10 was untrusted above op 4 (a power loss cut its tail), the third
/// untrusted from op 0 but of log view 5. No vote offers ops 5 and 7, and only the
/// trusted one says it never had them, but they were prepared in view 10 (the trusted
/// vote, which holds view 10's starting log, lacks them), where the vote of log view 5
/// was never normal: a quorum never acknowledged them. Counting that vote only for ops
/// some vote names, every view change waited for ever for a vote holding op 7.
#[test]
fn a_hole_prepared_in_the_best_log_view_is_dropped_with_an_older_log_views_vote() {
    let group = 11;
    let ops = chain(group, 8, 10);
    let scattered = ViewChangeVote {
        log_view: 10,
        op: 8,
        commit: 4,
        commit_checksum: Some(ops[3].header.checksum),
        suffix: vec![whole(&ops[3]), alone(ops[5].header), alone(ops[7].header)],
        faulty: vec![],
        trusted_through: u64::MAX,
    };
    let tail_cut = ViewChangeVote {
        log_view: 10,
        op: 4,
        commit: 4,
        commit_checksum: Some(ops[3].header.checksum),
        suffix: vec![whole(&ops[3])],
        faulty: vec![],
        trusted_through: 4,
    };
    let older = ViewChangeVote {
        log_view: 5,
        op: 2,
        commit: 0,
        commit_checksum: None,
        suffix: vec![],
        faulty: vec![],
        trusted_through: 0,
    };
    let primary = || {
        let durable = DurableState {
            view: 11,
            log_view: 10,
            commit: 4,
            ..DurableState::default()
        };
        restarted_holding(group, durable, &ops[..4])
    };
    // Without the vote of the older log view, nothing says the untrusted voter never
    // acknowledged op 5: the view waits.
    let votes: BTreeMap<ReplicaId, ViewChangeVote> =
        [(1, scattered.clone()), (0, tail_cut.clone())].into();
    assert!(!primary().adopt_canonical_log(&votes, &mut Vec::new()));
    let votes: BTreeMap<ReplicaId, ViewChangeVote> =
        [(1, scattered), (0, tail_cut), (2, older)].into();
    let mut replica = primary();
    assert!(
        replica.adopt_canonical_log(&votes, &mut Vec::new()),
        "ops 5 to 8 were never acknowledged by a quorum"
    );
    assert_eq!(replica.op(), 4, "the log ends at the commit");
    assert_eq!(
        replica.header(4).map(|h| h.checksum),
        Some(ops[3].header.checksum)
    );
}

/// The shell simulator's seed 11305 (damage at rest, four times the faults): the one
/// replica of the newest log view lost its journal whole (a zeroed page over all of
/// it) and restarted untrusted from what it knew committed, holding nothing above.
/// Taken as trusted "through its top" (its top being that very op), its vote named its
/// log view's log empty, and the view change dropped the committed ops every other
/// replica held. An untrusted vote never names the top, however little it holds.
#[test]
fn a_replica_of_the_newest_log_view_that_lost_its_journal_never_empties_the_log() {
    let (mut h, session) = registered(3);
    // Pipelined: each op's header names commit 1, so after the restarts below no
    // replica knows more than op 1 committed.
    for (request, body) in [(1, &b"a=1"[..]), (2, b"b=2"), (3, b"c=3")] {
        h.request(0, session, request, body);
    }
    h.settle(50);
    assert!((0..3).all(|r| h.replica(r).commit_min() >= 4));
    // Replicas 0 and 2 restart from their journals, never out of log view 0; their
    // durable commit is still 0 (it is written only now and then).
    for r in [0, 2] {
        let journal: Vec<(u64, JournalSlot)> = (1..=4)
            .map(|op| {
                let e = h.replica(r).journal.get(&op).unwrap();
                let prepare = Prepare {
                    header: e.header,
                    body: e.body.clone().unwrap(),
                };
                (op, JournalSlot::Prepare(prepare))
            })
            .collect();
        let config = *h.replica(r).config();
        h.replicas[usize::from(r)] = Replica::restart(
            config,
            CounterMachine::default(),
            Persisted {
                durable: DurableState {
                    view: 3,
                    ..DurableState::default()
                },
                checkpoint: None,
                journal,
                journal_trusted: true,
            },
        )
        .unwrap();
    }
    // Replica 1 was normal in view 1 (which committed nothing) and then lost its
    // journal: untrusted from op 0, nothing held.
    let config = *h.replica(1).config();
    h.replicas[1] = Replica::restart(
        config,
        CounterMachine::default(),
        Persisted {
            durable: DurableState {
                view: 3,
                log_view: 1,
                commit: 0,
                ..DurableState::default()
            },
            checkpoint: None,
            journal: vec![],
            journal_trusted: false,
        },
    )
    .unwrap();
    h.messages.clear();
    // Replica 1 leads view 4; with replica 2 cut off, its vote and replica 0's are all
    // it hears. No view may form without the committed ops.
    h.run_until(
        5_000,
        |from, to, _| from != 2 && to != 2,
        |h| h.replica(1).is_primary(),
    );
    for r in [0, 1] {
        if h.replica(r).is_primary() || h.replica(r).status() == Status::Normal {
            assert!(
                h.replica(r).op() >= 4,
                "replica {r} is normal at op {}",
                h.replica(r).op()
            );
        }
    }
    let settled = h.run_until(
        20_000,
        |_, _, _| true,
        |h| {
            (0..3).all(|r| h.replica(r).status() == Status::Normal && h.replica(r).view() > 1)
                && (0..3).any(|r| h.replica(r).is_primary())
        },
    );
    assert!(settled, "a view after view 1 started");
    for r in 0..3 {
        assert!(
            h.replica(r).op() >= 4,
            "replica {r} holds op {}",
            h.replica(r).op()
        );
    }
    let healed = h.run_until(
        10_000,
        |_, _, _| true,
        |h| (0..3).all(|r| h.replica(r).commit_min() >= 4),
    );
    assert!(healed);
    for r in 0..3 {
        let machine = h.replica(r).state().machine();
        assert_eq!(
            (machine.get("a"), machine.get("b"), machine.get("c")),
            (1, 2, 3),
            "replica {r}"
        );
    }
}

/// The shell simulator's seeds 63, 365, 428 and 653 with misdirected writes: a page of
/// one partition's journal written over another's put records of another group there,
/// whole and checksummed, and the restarted replica took them as its own (an
/// invariant stopped it). A slot of another group is damage: faulty, repaired.
#[test]
fn a_journal_slot_of_another_group_is_damage() {
    let (h, _) = registered(3);
    let entry = h.replica(1).journal.get(&1).unwrap();
    let mut foreign = Prepare {
        header: entry.header,
        body: entry.body.clone().unwrap(),
    };
    foreign.header.group = 5;
    foreign.header = foreign.header.seal();
    assert!(foreign.valid(), "whole and checksummed");
    let config = *h.replica(1).config();
    let restarted = Replica::restart(
        config,
        CounterMachine::default(),
        Persisted {
            durable: DurableState::default(),
            checkpoint: None,
            journal: vec![
                (1, JournalSlot::Prepare(foreign.clone())),
                (2, JournalSlot::Header(foreign.header)),
            ],
            journal_trusted: true,
        },
    )
    .unwrap();
    assert!(restarted.journal.get(&1).is_none() && restarted.journal.get(&2).is_none());
    assert!(restarted.faulty.contains(&1) && restarted.faulty.contains(&2));
}

/// Shell simulator seed 3501 (latent read errors): a replica that lost its journal was
/// trusted again on installing a newer view's log while it held that log's ops as
/// headers alone, one of them an op it had acknowledged before the loss. A trusted
/// vote counts a header alone above its commit as "never had it", so with the one
/// replica that truly never had the op, a view dropped it. Trust now waits for the
/// bodies.
#[test]
fn a_replica_re_trusted_by_a_newer_views_log_never_nacks_its_headers_alone() {
    let mut h = op_2_committed_without_replica_2();
    // Replica 1 acknowledged op 2, then lost its journal (its state survived): it
    // restarts untrusted above op 1, the commit it knew.
    h.replicas[1] = Replica::restart(
        Config::new(0, 1, 3, 9),
        CounterMachine::default(),
        Persisted {
            durable: DurableState {
                commit: 1,
                ..DurableState::default()
            },
            checkpoint: None,
            journal: vec![],
            journal_trusted: false,
        },
    )
    .unwrap();
    h.messages.clear();
    h.input(1, Input::Tick);
    h.complete_writes();
    assert!(!h.replica(1).journal_trusted());
    // View 3's log, from its primary (replica 0), as headers alone: op 2 not yet known
    // committed there, no body sent.
    let suffix: Vec<SuffixEntry> = (1..=2)
        .map(|op| SuffixEntry {
            header: h.replica(0).journal.get(&op).unwrap().header,
            body: None,
        })
        .collect();
    h.input(
        1,
        Input::Message(Message::StartView {
            view: 3,
            op: 2,
            commit: 1,
            suffix,
            from: 0,
        }),
    );
    h.complete_writes();
    assert!(
        !h.replica(1).journal_trusted(),
        "trusted while it holds op 2 as a header alone"
    );
    // Replica 0 is cut off: replicas 1 and 2 must not form a view without op 2.
    expect_no_view_without_op_2(&mut h);
    // Replica 0 back: the group goes on with op 2, and replica 1 trusts its journal
    // again once it holds the body.
    let healed = h.run_until(
        10_000,
        |_, _, _| true,
        |h| {
            (0..3)
                .all(|r| h.replica(r).commit_min() >= 2 && h.replica(r).status() == Status::Normal)
                && h.replica(1).journal_trusted()
        },
    );
    assert!(healed);
    for r in 0..3 {
        assert_eq!(h.replica(r).state().machine().get("k"), 1, "replica {r}");
    }
}

/// A backup that missed the new view's StartView asks its primary for it when the
/// primary's commits reach it, instead of starting view change after view change (the
/// shell simulator's seed 315500: a member missed view 8's StartView and voted for
/// view after view while the others committed in view 8).
#[test]
fn a_backup_that_missed_the_start_view_asks_for_it_at_the_next_commit() {
    let (mut h, session) = registered(3);
    h.request(0, session, 1, b"k=1");
    h.settle(50);
    // Replica 0 falls silent; the first StartView of view 1 to replica 2 is lost.
    h.messages.clear();
    let mut lost = false;
    let normal = h.run_until(
        2_000,
        |from, to, message| {
            let first_start_view = to == 2 && matches!(message, Message::StartView { .. });
            if first_start_view && !lost {
                lost = true;
                return false;
            }
            from != 0 && to != 0
        },
        |h| h.replica(1).is_primary() && h.replica(2).status() == Status::Normal,
    );
    assert!(normal && lost);
    assert_eq!(
        h.replica(2).view(),
        1,
        "it joined view 1 rather than moving the group to another view"
    );
}

/// Restarts replica `r` as one that lost its disk.
fn lose_disk(h: &mut Harness, r: usize) {
    let config = *h.replica(r as u8).config();
    h.replicas[r] = Replica::restart(
        config,
        CounterMachine::default(),
        Persisted::after_disk_loss(),
    )
    .unwrap();
}

/// Runs `h` until `done`, holding back every message to replica 1 that `held` picks;
/// returns whether `done` came, and the messages held back, in order.
fn hold_back_to_1(
    h: &mut Harness,
    held: impl Fn(&Message) -> bool,
    done: impl Fn(&Harness) -> bool,
) -> (bool, Vec<Message>) {
    let held_back = std::cell::RefCell::new(Vec::new());
    let came = h.run_until(
        10_000,
        |_, to, message| {
            let hold = to == 1 && held(message);
            if hold {
                held_back.borrow_mut().push(message.clone());
            }
            !hold
        },
        done,
    );
    (came, held_back.into_inner())
}
