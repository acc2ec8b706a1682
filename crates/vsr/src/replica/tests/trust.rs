//! A replica restarted untrusted (a power loss that may have taken writes it
//! acknowledged) regains trust in the view it restarted in, and only on proof.

use super::*;

/// A settled, idle group of three with a few committed ops; returns the harness.
fn idle_group_with_ops() -> Harness {
    let mut h = Harness::with(3, |config| config.quiesce = true);
    h.request(0, 0, 1, b"");
    h.settle(50);
    let reply = h.replies.pop().unwrap();
    let session = u64::from_be_bytes(reply.result.unwrap().try_into().unwrap());
    for request in 1..=4 {
        h.request(0, session, request, format!("k={request}").as_bytes());
        h.settle(50);
    }
    let quiet = h.run_until(
        1_000,
        |_, _, _| true,
        |h| (0..3).all(|r| h.replica(r).may_quiesce()),
    );
    assert!(quiet, "the group went quiet");
    h
}

/// Restarts replica `r` after a power loss that took its whole journal (nothing was
/// synced): its durable state as last written; messages to and from the old process
/// are gone.
fn restart_untrusted(h: &mut Harness, r: ReplicaId) {
    let config = *h.replica(r).config();
    let durable = h.replica(r).durable;
    h.replicas[usize::from(r)] = Replica::restart(
        config,
        CounterMachine::default(),
        Persisted {
            durable,
            checkpoint: None,
            journal: Vec::new(),
            journal_trusted: false,
        },
    )
    .unwrap();
    h.messages.retain(|(from, to, _)| *from != r && *to != r);
    h.writes.retain(|(replica, _)| *replica != r);
    assert!(!h.replica(r).journal_trusted());
}

/// An outside review of issue 24: a replica restarted untrusted in a group that never
/// changes view stayed untrusted for good (only a newer view's log restored trust), so
/// its votes could never drop an op the others lacked. Once it holds its own view's
/// log through the op the primary answered with after the restart, it trusts its
/// journal again, durably, without a view change, and the group goes quiet.
#[test]
fn an_untrusted_backup_of_an_idle_group_trusts_again_in_the_same_view() {
    let mut h = idle_group_with_ops();
    let op = h.replica(0).op();
    restart_untrusted(&mut h, 1);
    let trusted = h.run_until(
        5_000,
        |_, _, _| true,
        |h| h.replica(1).journal_trusted() && (0..3).all(|r| h.replica(r).may_quiesce()),
    );
    assert!(trusted, "it stayed untrusted, or awake");
    h.settle(10);
    assert_eq!(h.replica(1).view(), 0, "no view change was needed");
    assert_eq!(h.replica(1).status(), Status::Normal);
    assert_eq!(h.replica(1).commit_min(), op);
    assert_eq!(
        h.replica(1).durable.journal_trusted_through,
        u64::MAX,
        "the regained trust is durable"
    );
}

/// Trust comes only from the primary of its own view, answering this incarnation's
/// request: an answer with another nonce (to a request of the process before the
/// restart, which says nothing about what the restart lost) or a backup's answer
/// naming an op never counts.
#[test]
fn only_its_primarys_answer_to_this_incarnation_restores_trust() {
    let mut h = idle_group_with_ops();
    let op = h.replica(0).op();
    restart_untrusted(&mut h, 1);
    let held_back = std::cell::RefCell::new(Vec::new());
    let caught_up = h.run_until(
        5_000,
        |_, to, message| {
            let hold = to == 1 && matches!(message, Message::Views { .. });
            if hold {
                held_back.borrow_mut().push(message.clone());
            }
            !hold
        },
        |h| h.replica(1).status() == Status::Normal && h.replica(1).commit_min() == op,
    );
    assert!(caught_up, "it never caught up");
    assert!(!h.replica(1).journal_trusted(), "no answer came yet");
    let held_back = held_back.into_inner();
    let nonce = held_back
        .iter()
        .find_map(|m| match m {
            Message::Views { nonce, .. } => Some(*nonce),
            _ => None,
        })
        .unwrap();
    let stale = Message::Views {
        view: 0,
        primary_op: Some(op),
        from: 0,
        nonce: nonce ^ 1,
    };
    let from_a_backup = Message::Views {
        view: 0,
        primary_op: Some(op),
        from: 2,
        nonce,
    };
    for message in [stale, from_a_backup] {
        h.input(1, Input::Message(message));
        h.settle(10);
        assert!(!h.replica(1).journal_trusted(), "trusted on a wrong answer");
    }
    for message in held_back {
        h.input(1, Input::Message(message));
    }
    h.settle(10);
    assert!(
        h.replica(1).journal_trusted(),
        "its primary's answer counts"
    );
}

/// The primary answers with its op only while normal in its view: a replica of the
/// view that has not started yet (or a backup) holds no log that op would name.
#[test]
fn only_a_normal_primary_names_its_op_in_its_views_answer() {
    let mut h = idle_group_with_ops();
    let op = h.replica(0).op();
    for (to, expected) in [(0, Some(op)), (2, None)] {
        h.messages.clear();
        h.input(
            to,
            Input::Message(Message::RequestViews { from: 1, nonce: 7 }),
        );
        let answer = h.messages.iter().find_map(|(_, _, m)| match m {
            Message::Views { primary_op, .. } => Some(*primary_op),
            _ => None,
        });
        assert_eq!(answer, Some(expected), "replica {to}'s answer");
    }
}
