//! This node as a client of the metadata group: its session, the one request it has in
//! flight, and the ops queued behind it. A pure state machine: the shell passes time
//! (in replica ticks) and replies in, and sends the requests it is handed.
//!
//! - A node registers one session per process: its client id is its member id (high
//!   byte, plus one) and a random nonce, so the primary of group 0 knows which node to
//!   answer, and a restarted node never resumes a stale session's request numbers.
//! - One request is in flight at a time (the group's client table keeps one reply per
//!   session); ops proposed meanwhile queue and leave together as the next request, so
//!   a burst of offset commits costs one round and one sync.
//! - A request is first sent to the primary the local replica knows; every retry goes
//!   to every replica, which reaches a new primary and wakes backups that went quiet.
//!   The group's client table answers a retry of an applied request from its cache, so
//!   an op is applied once however often it is sent.

use std::collections::VecDeque;

use braid_proto::client::ErrorCode;
use braid_vsr::{Refusal, Reply, Request};

use super::machine::MetadataMachine;
use crate::error::NodeError;
use crate::metadata::MetaOp;

/// Most ops in one request.
const BATCH_OPS_MAX: usize = 256;

/// The client id of member `node` in this process: the member in the high byte (plus
/// one), a random nonce below it.
pub(crate) fn client_id(node: u8, nonce: u64) -> u64 {
    (u64::from(node) + 1) << 56 | (nonce & ((1 << 56) - 1))
}

/// The request that registers `client`'s session (attempt `attempt`).
pub(crate) fn register_request(client: u64, attempt: u64) -> Request {
    Request {
        client,
        session: 0,
        request: attempt,
        body: bytes::Bytes::new(),
    }
}

/// The node that sent a request with `client`, if the id is a node's.
pub(crate) fn node_of_client(client: u64) -> Option<u8> {
    let high = (client >> 56) as u8;
    high.checked_sub(1)
}

/// Where a request goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Send {
    /// To the primary this node knows.
    Primary(Request),
    /// To every replica of the group.
    All(Request),
}

#[derive(Debug)]
struct InFlight<T> {
    request: Request,
    ops: Vec<MetaOp>,
    tokens: Vec<T>,
    retry_at: u64,
}

/// The node's session with the metadata group.
#[derive(Debug)]
pub(crate) struct MetaClient<T> {
    client: u64,
    session: u64,
    register_attempt: u64,
    next_request: u64,
    in_flight: Option<InFlight<T>>,
    queued: VecDeque<(MetaOp, T)>,
    retry_ticks: u64,
}

impl<T> MetaClient<T> {
    /// A client for member `node`, unique to this process by `nonce`.
    pub(crate) fn new(node: u8, nonce: u64, retry_ticks: u64) -> Self {
        Self {
            client: client_id(node, nonce),
            session: 0,
            register_attempt: 0,
            next_request: 1,
            in_flight: None,
            queued: VecDeque::new(),
            retry_ticks: retry_ticks.max(1),
        }
    }

    /// The client id replies are addressed to.
    pub(crate) fn id(&self) -> u64 {
        self.client
    }

    /// Ops proposed and not yet answered.
    #[cfg(test)]
    pub(crate) fn pending(&self) -> usize {
        self.queued.len() + self.in_flight.as_ref().map_or(0, |f| f.tokens.len())
    }

    /// Queues `op`; its outcome comes back with `token`.
    pub(crate) fn propose(&mut self, op: MetaOp, token: T) {
        self.queued.push_back((op, token));
    }

    /// The request to send now, if one is due: a register before the first op, the
    /// next batch once the last is answered, or a retry.
    pub(crate) fn poll(&mut self, now: u64) -> Option<Send> {
        if let Some(flight) = self.in_flight.as_mut() {
            if now < flight.retry_at {
                return None;
            }
            flight.retry_at = now + self.retry_ticks;
            return Some(Send::All(flight.request.clone()));
        }
        if self.queued.is_empty() {
            return None;
        }
        let (request, ops, tokens) = if self.session == 0 {
            self.register_attempt += 1;
            let request = register_request(self.client, self.register_attempt);
            (request, Vec::new(), Vec::new())
        } else {
            // A session's id is the number of the op that registers it, and a group
            // member's the number of the op that joins it: one of them per op.
            let second_numbered = self
                .queued
                .iter()
                .enumerate()
                .filter(|(_, (op, _))| op.is_numbered())
                .nth(1)
                .map_or(usize::MAX, |(at, _)| at);
            let take = self.queued.len().min(BATCH_OPS_MAX).min(second_numbered);
            let (ops, tokens): (Vec<_>, Vec<_>) = self.queued.drain(..take).unzip();
            let request = Request {
                client: self.client,
                session: self.session,
                request: self.next_request,
                body: MetadataMachine::input(&ops).into(),
            };
            self.next_request += 1;
            (request, ops, tokens)
        };
        self.in_flight = Some(InFlight {
            request: request.clone(),
            ops,
            tokens,
            retry_at: now + self.retry_ticks,
        });
        Some(Send::Primary(request))
    }

    /// Every token waiting, in or behind the request in flight (the group stopped).
    pub(crate) fn drain(&mut self) -> Vec<T> {
        let mut tokens: Vec<T> = self.in_flight.take().map(|f| f.tokens).unwrap_or_default();
        tokens.extend(self.queued.drain(..).map(|(_, t)| t));
        tokens
    }

    /// Takes a reply; returns the outcome of every op it answers, each with the op
    /// number its batch applied at (0 for a failure, which nothing waits for).
    pub(crate) fn on_reply(&mut self, reply: &Reply) -> Vec<(u64, T, Result<(), NodeError>)> {
        let Some(flight) = self.in_flight.as_ref() else {
            return Vec::new();
        };
        let register = flight.request.session == 0;
        if reply.client != self.client
            || reply.register != register
            || reply.request != flight.request.request
            || (!register && reply.session != flight.request.session)
        {
            // A late answer to an earlier attempt, or to an earlier session's request
            // of the same number (request numbers start again with each session: the
            // shell simulator's seed 32719 with damage at rest took session 30's late
            // answer to its request 7, applied at op 40, for session 43's request 7,
            // and acknowledged a stream no member ever created).
            return Vec::new();
        }
        let Some(flight) = self.in_flight.take() else {
            return Vec::new();
        };
        if register {
            match reply.result {
                Ok(_) if reply.session != 0 => {
                    self.session = reply.session;
                    self.next_request = 1;
                }
                // An older attempt than the group saw: the next one is newer.
                _ => {}
            }
            return Vec::new();
        }
        match &reply.result {
            Ok(bytes) => match MetadataMachine::outcomes(bytes) {
                Ok((op, outcomes)) if outcomes.len() == flight.tokens.len() => flight
                    .tokens
                    .into_iter()
                    .zip(outcomes)
                    .map(|(token, outcome)| (op, token, outcome))
                    .collect(),
                Ok((_, outcomes)) => fail(
                    flight.tokens,
                    &format!(
                        "the metadata group answered {} ops with {} outcomes",
                        flight.ops.len(),
                        outcomes.len()
                    ),
                ),
                Err(err) => fail(flight.tokens, &err.message),
            },
            Err(Refusal::SessionUnknown) => {
                // The session was evicted before this request applied (a session the
                // group forgot has no request applied after it): register again and
                // send the same ops, first.
                self.session = 0;
                for (op, token) in flight.ops.into_iter().zip(flight.tokens).rev() {
                    self.queued.push_front((op, token));
                }
                Vec::new()
            }
            Err(Refusal::RequestTooOld) => fail(
                flight.tokens,
                "the metadata group refused a request number as too old",
            ),
        }
    }
}

fn fail<T>(tokens: Vec<T>, reason: &str) -> Vec<(u64, T, Result<(), NodeError>)> {
    tokens
        .into_iter()
        .map(|t| {
            (
                0,
                t,
                Err(NodeError::new(ErrorCode::Internal, reason.to_owned())),
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metadata::op;
    use braid_vsr::StateMachine;

    fn reply_to(request: &Request, session: u64, result: Result<Vec<u8>, Refusal>) -> Reply {
        Reply {
            client: request.client,
            session,
            request: request.request,
            register: request.session == 0,
            view: 0,
            result,
        }
    }

    fn stream(name: &str) -> MetaOp {
        MetaOp::CreateStream(op::CreateStream { name: name.into() })
    }

    fn request(send: Option<Send>) -> Request {
        match send {
            Some(Send::Primary(r) | Send::All(r)) => r,
            None => panic!("nothing to send"),
        }
    }

    #[test]
    fn registers_then_batches_what_queued_and_answers_each_op() {
        let mut client = MetaClient::new(2, 0xabc, 10);
        assert_eq!(node_of_client(client.id()), Some(2));
        assert_eq!(node_of_client(5), None, "not a node's id");
        assert_eq!(client.poll(0), None, "nothing to do");
        client.propose(stream("a"), 1);
        let register = request(client.poll(0));
        assert_eq!((register.session, register.request), (0, 1));
        client.propose(stream("b"), 2);
        assert_eq!(client.poll(1), None, "one request in flight");
        assert!(client
            .on_reply(&reply_to(&register, 40, Ok(vec![])))
            .is_empty());
        let batch = request(client.poll(2));
        assert_eq!((batch.session, batch.request), (40, 1));
        // The batch holds both ops; the machine answers each.
        let mut machine = MetadataMachine::default();
        machine.apply(1, &MetadataMachine::input(&[stream("b")]));
        let result = machine.apply(2, &batch.body);
        let outcomes = client.on_reply(&reply_to(&batch, 40, Ok(result)));
        assert_eq!(outcomes.len(), 2);
        assert_eq!(outcomes[0], (2, 1, Ok(())), "applied at op 2");
        assert_eq!(outcomes[1].1, 2);
        assert_eq!(
            outcomes[1].2.as_ref().unwrap_err().code,
            ErrorCode::StreamExists
        );
        assert_eq!(client.pending(), 0);
    }

    /// A session's id is its register's op number, so no batch holds two registers.
    #[test]
    fn a_batch_holds_at_most_one_session_register() {
        let register = || MetaOp::RegisterSession(op::RegisterSession { timeout_ms: 5_000 });
        let mut client = MetaClient::new(2, 0xabc, 10);
        for (token, op) in [stream("a"), register(), stream("b"), register(), register()]
            .into_iter()
            .enumerate()
        {
            client.propose(op, token);
        }
        let first = request(client.poll(0));
        client.on_reply(&reply_to(&first, 40, Ok(vec![])));
        let mut machine = MetadataMachine::default();
        let mut answered = Vec::new();
        for op in 1..=3 {
            let batch = request(client.poll(op));
            let result = machine.apply(op, &batch.body);
            for (at, token, outcome) in client.on_reply(&reply_to(&batch, 40, Ok(result))) {
                assert!(outcome.is_ok(), "{outcome:?}");
                answered.push((at, token));
            }
        }
        assert_eq!(answered, [(1, 0), (1, 1), (1, 2), (2, 3), (3, 4)]);
        assert_eq!(
            machine.state().sessions.keys().copied().collect::<Vec<_>>(),
            [1, 2, 3]
        );
    }

    #[test]
    fn retries_go_to_every_replica_and_late_answers_are_ignored() {
        let mut client = MetaClient::new(0, 1, 10);
        client.propose(stream("a"), ());
        let first = client.poll(0);
        assert!(matches!(first, Some(Send::Primary(_))));
        assert_eq!(client.poll(9), None, "not yet due");
        let retry = client.poll(10);
        assert!(matches!(retry, Some(Send::All(_))));
        let register = request(retry);
        let stale = Reply {
            request: register.request + 1,
            ..reply_to(&register, 7, Ok(vec![]))
        };
        assert!(client.on_reply(&stale).is_empty());
        assert_eq!(client.pending(), 1, "still waiting");
        client.on_reply(&reply_to(&register, 7, Ok(vec![])));
        let batch = request(client.poll(11));
        assert_eq!(batch.session, 7);
    }

    /// A client of session 3 with stream "a" proposed, and the request carrying it.
    fn in_session_3() -> (MetaClient<&'static str>, Request) {
        let mut client = MetaClient::new(1, 1, 10);
        client.propose(stream("a"), "a");
        let register = request(client.poll(0));
        client.on_reply(&reply_to(&register, 3, Ok(vec![])));
        let batch = request(client.poll(1));
        (client, batch)
    }

    #[test]
    fn a_late_answer_to_an_earlier_sessions_request_of_the_same_number_is_ignored() {
        let (mut client, old) = in_session_3();
        assert_eq!((old.session, old.request), (3, 1));
        client.on_reply(&reply_to(&old, 3, Err(Refusal::SessionUnknown)));
        let again = request(client.poll(2));
        client.on_reply(&reply_to(&again, 9, Ok(vec![])));
        let new = request(client.poll(3));
        assert_eq!((new.session, new.request), (9, 1), "numbers start again");
        // The old session's request 1 did apply after all (at op 5), and its answer
        // arrives late: it answers nothing of the new session's.
        let mut machine = MetadataMachine::default();
        let applied_late = machine.apply(5, &old.body);
        assert!(client
            .on_reply(&reply_to(&old, 3, Ok(applied_late)))
            .is_empty());
        assert_eq!(client.pending(), 1, "still waiting for session 9's answer");
        let result = MetadataMachine::default().apply(12, &new.body);
        let outcomes = client.on_reply(&reply_to(&new, 9, Ok(result)));
        assert_eq!(outcomes.len(), 1);
        assert_eq!(outcomes[0].0, 12, "answered at the op that applied it");
    }

    #[test]
    fn an_evicted_session_registers_again_and_resends_its_ops_first() {
        let (mut client, batch) = in_session_3();
        client.propose(stream("b"), "b");
        let refused = reply_to(&batch, 3, Err(Refusal::SessionUnknown));
        assert!(client.on_reply(&refused).is_empty());
        let again = request(client.poll(2));
        assert_eq!((again.session, again.request), (0, 2), "a new register");
        client.on_reply(&reply_to(&again, 9, Ok(vec![])));
        let resent = request(client.poll(3));
        assert_eq!(resent.session, 9);
        assert_eq!(
            resent.body,
            MetadataMachine::input(&[stream("a"), stream("b")]),
            "the refused op first, then the one queued behind it"
        );
    }
}
