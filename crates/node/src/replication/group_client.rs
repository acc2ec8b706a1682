//! This node's client of one partition group it leads: the produces queued for the
//! group, its session with the group (registered before the first request), the
//! requests in flight by number, and what each answer means for the produce waiting
//! on it. Pure: no replica, no clock (ticks come in), no channel; generic over the
//! token a waiting produce is answered through, so the tests hold plain numbers.
//!
//! The requests a primary takes are prepared at once and stored with their batch (the
//! log is the journal), so a request is numbered when it is handed to the replica and
//! never handed again: a produce that is not answered is failed, retriable, and its
//! retry is a new request. A produce that names a client session (its batch header's
//! producer id and base sequence) is judged against the partition's slice entries
//! before it is handed over (`partition_machine::slices`): a retry of the session's
//! last request is answered its offsets, a request already prepared waits for its
//! entry, and an older one or a gap is refused, so no session's request is stored
//! twice. Requests prepared by an earlier primary are in the log but not yet in the
//! state, so none is judged before the state holds every op of the log the view
//! started with ([`Tenure`]).

use std::collections::{BTreeMap, VecDeque};

use braid_proto::client::{ErrorCode, ErrorDetail};
use braid_vsr::{Reply, Request};

use super::meta_client::register_request;
use super::partition_machine::barrier::Barrier;
use super::partition_machine::slices::{Admission, SessionTag, Slices, SLICE_WINDOW};
use super::partition_machine::Applied;
use crate::error::NodeError;

/// What a produce is answered: the offsets its batch took, or why not.
pub(crate) type ProduceAnswer = Result<(u64, u64), NodeError>;

/// A request handed to the replica and not answered.
#[derive(Debug)]
struct InFlight<T> {
    /// The produce waiting on it (`None`: a barrier, which nobody waits on).
    token: Option<T>,
    sent_at: u64,
}

/// What the door checked a session's produce against: this node's metadata.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Checked {
    /// The metadata op of the layout that found the session open.
    pub(crate) metadata_op: u64,
    /// The op through which that metadata says the partition owes the retirement of
    /// ended sessions (0: it owes none).
    pub(crate) owed: u64,
}

/// A produce waiting to be handed to the replica.
#[derive(Debug)]
struct Queued<T> {
    body: bytes::Bytes,
    token: T,
    /// The client session's request it is, if its batch names one, and what the door
    /// checked it against.
    tag: Option<(SessionTag, Checked)>,
}

/// Where the primary stands as a turn hands it requests.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PrimaryAt {
    /// It prepares requests now (its view is on disk).
    pub(crate) takes: bool,
    /// Requests its pipeline has room for.
    pub(crate) room: u64,
    pub(crate) view: u64,
    /// Its log's top op.
    pub(crate) op: u64,
    /// The ops its state holds (applied).
    pub(crate) commit_min: u64,
}

/// What this node, as primary of one view, prepared of client sessions' requests.
#[derive(Debug, Default)]
struct Tenure {
    view: u64,
    /// The log's top when this node first handed requests in the view: ops up to it
    /// may be an earlier primary's, prepared and not yet applied, so no session's
    /// request is judged before the state holds them.
    floor: u64,
    /// Session -> the highest of its requests handed to the replica in this view (one
    /// given up as lost too: it may still commit), and the log's top after the turn
    /// that handed it: once the state holds that op, the request is applied or was
    /// never prepared (a replica may refuse a request it was handed), and its entry
    /// says which.
    prepared: BTreeMap<u64, (u32, Option<u64>)>,
    /// The highest frontier of a barrier handed in this view: requests handed after
    /// it are prepared after it, so they are judged by it before it is applied.
    frontier: u64,
}

impl Tenure {
    /// The highest request of `session` that may still be prepared and unapplied.
    fn pending(&self, session: u64, commit_min: u64) -> Option<u32> {
        match self.prepared.get(&session) {
            Some((request, Some(through))) if commit_min < *through => Some(*request),
            Some((request, None)) => Some(*request),
            _ => None,
        }
    }
}

/// This node's session with one group, and its produces.
#[derive(Debug)]
pub(crate) struct GroupClient<T> {
    /// The session the group gave (0: none yet, or forgotten by the group).
    session: u64,
    register_attempt: u64,
    /// When the register in flight was sent, if one is.
    registering: Option<u64>,
    next_request: u64,
    queued: VecDeque<Queued<T>>,
    /// A retirement barrier to hand before the next produce.
    barrier: Option<Barrier>,
    in_flight: BTreeMap<u64, InFlight<T>>,
    tenure: Tenure,
}

impl<T> Default for GroupClient<T> {
    fn default() -> Self {
        Self {
            session: 0,
            register_attempt: 0,
            registering: None,
            next_request: 0,
            queued: VecDeque::new(),
            barrier: None,
            in_flight: BTreeMap::new(),
            tenure: Tenure::default(),
        }
    }
}

impl<T> GroupClient<T> {
    /// Queues a batch's body for the next requests; `tag` is the client session's
    /// request it is, if any, with what the door checked it against.
    pub(crate) fn queue(
        &mut self,
        body: bytes::Bytes,
        token: T,
        tag: Option<(SessionTag, Checked)>,
    ) {
        self.queued.push_back(Queued { body, token, tag });
    }

    /// Queues a retirement barrier, unless one is queued or in flight (the walk
    /// looks again once it is applied). Returns whether it was queued.
    pub(crate) fn retire(&mut self, barrier: Barrier) -> bool {
        if self.has_barrier() {
            return false;
        }
        self.barrier = Some(barrier);
        true
    }

    /// Whether a barrier is queued or in flight.
    pub(crate) fn has_barrier(&self) -> bool {
        self.barrier.is_some() || self.in_flight.values().any(|f| f.token.is_none())
    }

    /// Whether produces (or a barrier) wait to be handed to the replica.
    pub(crate) fn has_queued(&self) -> bool {
        !self.queued.is_empty() || self.barrier.is_some()
    }

    /// Whether nothing waits: no produce or barrier queued or in flight, no register.
    pub(crate) fn is_idle(&self) -> bool {
        !self.has_queued() && self.in_flight.is_empty() && self.registering.is_none()
    }

    /// Takes every waiting produce out (queued and in flight), to be failed; a
    /// register in flight is forgotten.
    pub(crate) fn drain(&mut self) -> Vec<T> {
        self.registering = None;
        let queued = self.queued.drain(..).map(|queued| queued.token);
        self.barrier = None;
        let in_flight = std::mem::take(&mut self.in_flight)
            .into_values()
            .filter_map(|flight| flight.token);
        queued.chain(in_flight).collect()
    }

    /// The requests to hand the replica at tick `now`: without a session, a register
    /// (once, while produces wait); with one, queued batches, numbered in order, while
    /// the primary takes requests and its pipeline has room. A client session's
    /// request is judged against the partition's entries (`slices`) first: the
    /// produces answered without one (a retry's offsets, a refusal) come back beside
    /// the requests, and a request that must wait (for an earlier primary's ops to be
    /// applied, or for its own earlier copy) holds the queue behind it.
    pub(crate) fn requests(
        &mut self,
        client_id: u64,
        now: u64,
        at: PrimaryAt,
        slices: &Slices,
    ) -> (Vec<Request>, Vec<(T, ProduceAnswer)>) {
        let mut out = Vec::new();
        let mut answered = Vec::new();
        if self.session == 0 {
            if self.registering.is_none() && self.has_queued() {
                self.registering = Some(now);
                self.register_attempt += 1;
                out.push(register_request(client_id, self.register_attempt));
            }
            return (out, answered);
        }
        if self.tenure.view != at.view {
            self.tenure = Tenure {
                view: at.view,
                floor: at.op,
                prepared: BTreeMap::new(),
                frontier: 0,
            };
        }
        let mut room = at.room;
        if at.takes && room > 0 {
            if let Some(barrier) = self.barrier.take() {
                room -= 1;
                self.tenure.frontier = self.tenure.frontier.max(barrier.frontier);
                out.push(self.hand(client_id, now, bytes::Bytes::from(barrier.encode()), None));
            }
        }
        while at.takes && room > 0 {
            let Some(front) = self.queued.front() else {
                break;
            };
            if let Some((tag, checked)) = front.tag {
                if at.commit_min < self.tenure.floor {
                    break;
                }
                let prepared = self.tenure.pending(tag.session, at.commit_min);
                let frontier = slices.frontier().max(self.tenure.frontier);
                let admission = if checked.metadata_op < frontier {
                    Err(NodeError::new(
                        ErrorCode::Busy,
                        format!(
                            "the partition retired ended sessions through metadata op \
                             {frontier}, and session {} was checked at op {}: retry",
                            tag.session, checked.metadata_op
                        ),
                    ))
                } else if checked.owed > slices.frontier()
                    && prepared.is_none()
                    && !slices.holds(tag.session)
                {
                    Err(NodeError::new(
                        ErrorCode::Busy,
                        format!(
                            "the partition owes the retirement of ended sessions through \
                             metadata op {}: it takes no new session until it catches up; \
                             retry",
                            checked.owed
                        ),
                    ))
                } else {
                    Ok(slices.admit(tag, prepared))
                };
                let answer = match admission {
                    Err(refusal) => Some(Err(refusal)),
                    Ok(admission) => match admission {
                        Admission::New => None,
                        Admission::InFlight => break,
                        Admission::Stored { base, last } => Some(Ok((base, last))),
                        Admission::Differs { stored } => Some(Err(NodeError::new(
                            ErrorCode::InvalidBatch,
                            format!(
                                "request {} of session {} was stored with other records (batch \
                             CRC {stored:08x}, this one {:08x}): a request number is never \
                             reused",
                                tag.request, tag.session, tag.crc
                            ),
                        ))),
                        Admission::Older { last } => Some(Err(NodeError::new(
                            ErrorCode::DuplicateRequest,
                            format!(
                                "request {} of session {} was stored before; the partition keeps \
                             the offsets of its last {SLICE_WINDOW} requests only (the last \
                             is {last})",
                                tag.request, tag.session
                            ),
                        )
                        .with(ErrorDetail::LastRequest { request: last }))),
                        Admission::Gap { expected } => Some(Err(NodeError::new(
                            ErrorCode::RequestOutOfOrder,
                            format!(
                                "request {} of session {} skips a request: the partition takes \
                             {expected} next",
                                tag.request, tag.session
                            ),
                        )
                        .with(ErrorDetail::ExpectedRequest { request: expected }))),
                    },
                };
                if let Some(answer) = answer {
                    if let Some(queued) = self.queued.pop_front() {
                        answered.push((queued.token, answer));
                    }
                    continue;
                }
                self.tenure
                    .prepared
                    .insert(tag.session, (tag.request, None));
            }
            let Some(Queued { body, token, .. }) = self.queued.pop_front() else {
                break;
            };
            room -= 1;
            out.push(self.hand(client_id, now, body, Some(token)));
        }
        (out, answered)
    }

    /// Numbers a request and keeps it in flight.
    fn hand(&mut self, client_id: u64, now: u64, body: bytes::Bytes, token: Option<T>) -> Request {
        self.next_request += 1;
        let number = self.next_request;
        self.in_flight.insert(
            number,
            InFlight {
                token,
                sent_at: now,
            },
        );
        Request {
            client: client_id,
            session: self.session,
            request: number,
            body,
        }
    }

    /// The turn that took this client's requests left the log's top at `op`: every
    /// request it handed is prepared at or below it, or was refused.
    pub(crate) fn handed_through(&mut self, op: u64) {
        for (_, through) in self.tenure.prepared.values_mut() {
            through.get_or_insert(op);
        }
    }

    /// A reply of the group to this node's client (the caller checked the client id):
    /// a register's sets the session; a request's gives the produce waiting on it its
    /// offsets, or, refused (the group forgot the session), `NotLeader` to retry, and
    /// the next requests register again. A reply to an older session, or to a request
    /// not in flight, answers nothing.
    pub(crate) fn answer(&mut self, reply: &Reply) -> Option<(T, ProduceAnswer)> {
        if reply.register {
            // Only the answer to the register in flight: a late one (a register op
            // committed again by a new primary, or an earlier attempt's) set the
            // session it already had and numbered its requests from 1 again, and the
            // group answered the next batch with the offsets an old request of that
            // number took: acknowledged at 44..=46 for 2 records that were never
            // stored (the shell simulator's seed 366298 with damage at rest).
            if self.registering.is_none() || reply.request != self.register_attempt {
                return None;
            }
            self.registering = None;
            if reply.result.is_ok() && reply.session != 0 && reply.session != self.session {
                self.session = reply.session;
                self.next_request = 0;
            }
            return None;
        }
        if reply.session != self.session {
            return None;
        }
        let flight = self.in_flight.remove(&reply.request)?;
        if reply.result.is_err() {
            self.session = 0;
        }
        let token = flight.token?;
        let answer = match &reply.result {
            Ok(result) => Applied::offsets(result).ok_or_else(|| {
                NodeError::new(ErrorCode::MalformedRequest, "the batch took no offsets")
            }),
            Err(refusal) => Err(NodeError::new(
                ErrorCode::NotLeader,
                format!("the partition group refused the request ({refusal:?}); retry"),
            )),
        };
        Some((token, answer))
    }

    /// At tick `now`: a register sent at or before `register_due` is sent again (the
    /// primary drops one while its view is not yet durable), and requests sent at or
    /// before `lost` are given up (returned, to be failed retriable: a guard against
    /// a request lost in a way nothing else reports).
    pub(crate) fn overdue(
        &mut self,
        client_id: u64,
        now: u64,
        register_due: u64,
        lost: u64,
    ) -> (Option<Request>, Vec<T>) {
        let resend = match self.registering {
            Some(at) if at <= register_due => {
                self.registering = Some(now);
                Some(register_request(client_id, self.register_attempt))
            }
            _ => None,
        };
        let overdue: Vec<u64> = self
            .in_flight
            .iter()
            .filter(|(_, flight)| flight.sent_at <= lost)
            .map(|(number, _)| *number)
            .collect();
        let given_up = overdue
            .into_iter()
            .filter_map(|number| self.in_flight.remove(&number))
            .filter_map(|flight| flight.token)
            .collect();
        (resend, given_up)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use braid_vsr::Refusal;

    const CLIENT: u64 = 7;

    fn at(takes: bool, room: u64) -> PrimaryAt {
        PrimaryAt {
            takes,
            room,
            view: 1,
            op: 0,
            commit_min: 0,
        }
    }

    /// The requests of a turn in which no session's produce is answered.
    fn send<T>(client: &mut GroupClient<T>, now: u64, takes: bool, room: u64) -> Vec<Request> {
        let (requests, answered) =
            client.requests(CLIENT, now, at(takes, room), &Slices::default());
        assert!(answered.is_empty());
        requests
    }

    fn reply(session: u64, request: u64, result: Result<Vec<u8>, Refusal>) -> Reply {
        Reply {
            client: CLIENT,
            session,
            request,
            register: false,
            view: 1,
            result,
        }
    }

    /// The answer to register attempt `attempt`, giving `session`.
    fn registered(session: u64, attempt: u64) -> Reply {
        Reply {
            register: true,
            ..reply(session, attempt, Ok(Vec::new()))
        }
    }

    fn stored(base: u64, last: u64) -> Result<Vec<u8>, Refusal> {
        Ok(Applied::Stored { base, last }.encode())
    }

    #[test]
    fn a_session_comes_first_then_batches_in_order_within_the_pipeline() {
        let mut client = GroupClient::default();
        assert!(send(&mut client, 1, true, 16).is_empty(), "nothing queued");
        for token in 0..5u32 {
            client.queue(bytes::Bytes::from(vec![token as u8]), token, None);
        }
        let register = send(&mut client, 1, true, 16);
        assert_eq!(register.len(), 1);
        assert_eq!(register[0].session, 0, "a register");
        assert!(
            send(&mut client, 2, true, 16).is_empty(),
            "one register at once"
        );
        assert_eq!(client.answer(&registered(40, 1)).map(|(t, _)| t), None);
        assert!(
            send(&mut client, 3, false, 16).is_empty(),
            "the primary takes none"
        );
        let first = send(&mut client, 3, true, 2);
        assert_eq!(
            first
                .iter()
                .map(|r| (r.session, r.request))
                .collect::<Vec<_>>(),
            vec![(40, 1), (40, 2)],
            "numbered in order, as many as the pipeline has room for"
        );
        let rest = send(&mut client, 4, true, 16);
        assert_eq!(
            rest.iter().map(|r| r.request).collect::<Vec<_>>(),
            [3, 4, 5]
        );
        assert_eq!(rest[0].body[..], [2]);
        assert!(!client.has_queued() && !client.is_idle());
    }

    #[test]
    fn answers_reach_their_produce_and_a_refusal_registers_again() {
        let mut client = GroupClient::default();
        client.queue(bytes::Bytes::from_static(b"a"), 'a', None);
        client.queue(bytes::Bytes::from_static(b"b"), 'b', None);
        send(&mut client, 1, true, 16);
        client.answer(&registered(9, 1));
        send(&mut client, 2, true, 16);
        assert_eq!(
            client.answer(&reply(9, 2, stored(5, 7))),
            Some(('b', Ok((5, 7))))
        );
        assert_eq!(
            client.answer(&reply(9, 2, stored(5, 7))),
            None,
            "answered once"
        );
        assert_eq!(
            client.answer(&reply(8, 1, stored(0, 0))),
            None,
            "an older session"
        );
        let (token, answer) = client
            .answer(&reply(9, 1, Err(Refusal::SessionUnknown)))
            .unwrap();
        assert_eq!(token, 'a');
        assert_eq!(answer.unwrap_err().code, ErrorCode::NotLeader);
        client.queue(bytes::Bytes::from_static(b"c"), 'c', None);
        let again = send(&mut client, 3, true, 16);
        assert_eq!(again.len(), 1);
        assert_eq!(
            again[0].session, 0,
            "the forgotten session is registered again"
        );
        // A result that names no offsets is an error, not made-up offsets.
        client.answer(&registered(10, 2));
        send(&mut client, 4, true, 16);
        let (_, answer) = client
            .answer(&reply(10, 1, Ok(Applied::NotABatch.encode())))
            .unwrap();
        assert_eq!(answer.unwrap_err().code, ErrorCode::MalformedRequest);
        assert!(client.is_idle());
    }

    /// A register's answer counts once, for the attempt in flight: a late one (a new
    /// primary committing the register op again, or an earlier attempt's) numbered
    /// the session's requests from 1 again, and the group answered the next batch with
    /// the offsets an old request of that number took (the shell simulator's seed
    /// 366298 with damage at rest: 2 records acknowledged at 44..=46, never stored).
    #[test]
    fn a_late_register_answer_never_numbers_the_session_again() {
        let mut client = GroupClient::default();
        for token in 0..3u8 {
            client.queue(bytes::Bytes::from(vec![token]), token, None);
        }
        send(&mut client, 1, true, 16);
        client.answer(&registered(40, 1));
        let sent = send(&mut client, 2, true, 2);
        assert_eq!(sent.iter().map(|r| r.request).collect::<Vec<_>>(), [1, 2]);
        for late in [registered(40, 1), registered(41, 1), registered(40, 0)] {
            assert_eq!(client.answer(&late), None);
        }
        let next = send(&mut client, 3, true, 16);
        assert_eq!(
            next.iter()
                .map(|r| (r.session, r.request))
                .collect::<Vec<_>>(),
            [(40, 3)],
            "the session and its numbering stand"
        );
    }

    #[test]
    fn overdue_registers_are_sent_again_and_lost_requests_given_up() {
        let mut client = GroupClient::default();
        client.queue(bytes::Bytes::from_static(b"a"), 1u8, None);
        send(&mut client, 10, true, 16);
        let (resend, lost) = client.overdue(CLIENT, 11, 9, 0);
        assert!(resend.is_none() && lost.is_empty(), "not due yet");
        let (resend, _) = client.overdue(CLIENT, 20, 10, 0);
        assert_eq!(resend.map(|r| r.session), Some(0));
        client.answer(&registered(3, 1));
        send(&mut client, 21, true, 16);
        client.queue(bytes::Bytes::from_static(b"b"), 2u8, None);
        send(&mut client, 30, true, 16);
        let (_, lost) = client.overdue(CLIENT, 40, 0, 21);
        assert_eq!(
            lost,
            vec![1],
            "only the request sent at or before the cutoff"
        );
        assert_eq!(client.drain(), vec![2]);
        assert!(client.is_idle());
    }

    fn tag(session: u64, request: u32) -> Option<(SessionTag, Checked)> {
        let tag = SessionTag {
            session,
            request,
            crc: 0,
        };
        Some((tag, Checked::default()))
    }

    /// A registered client with this node's session 3.
    fn registered_client() -> GroupClient<char> {
        let mut client = GroupClient::default();
        client.queue(bytes::Bytes::from_static(b"x"), 'x', None);
        send(&mut client, 1, true, 16);
        client.answer(&registered(3, 1));
        send(&mut client, 2, true, 16);
        client
    }

    #[test]
    fn a_sessions_retry_is_answered_from_its_entry_never_prepared_twice() {
        let mut client = registered_client();
        let mut slices = Slices::default();
        let view = |commit_min| PrimaryAt {
            commit_min,
            op: 1,
            ..at(true, 16)
        };
        client.queue(bytes::Bytes::from_static(b"a"), 'a', tag(50, 0));
        client.queue(bytes::Bytes::from_static(b"A"), 'A', tag(50, 0));
        client.queue(bytes::Bytes::from_static(b"z"), 'z', None);
        let (sent, answered) = client.requests(CLIENT, 3, view(1), &slices);
        assert_eq!(sent.len(), 1, "the first copy goes, the retry waits for it");
        assert!(answered.is_empty());
        let (sent, _) = client.requests(CLIENT, 4, view(1), &slices);
        assert!(
            sent.is_empty(),
            "still in flight: the queue waits behind it"
        );
        slices.applied(
            SessionTag {
                session: 50,
                request: 0,
                crc: 0,
            },
            10,
            11,
        );
        let (sent, answered) = client.requests(CLIENT, 5, view(2), &slices);
        assert_eq!(answered.len(), 1);
        assert_eq!(answered[0].0, 'A');
        assert_eq!(
            answered[0].1.as_ref().ok(),
            Some(&(10, 11)),
            "the original offsets"
        );
        assert_eq!(sent.len(), 1, "the untagged produce behind it goes on");
        client.queue(bytes::Bytes::from_static(b"c"), 'c', tag(50, 2));
        client.queue(bytes::Bytes::from_static(b"b"), 'b', tag(50, 1));
        let (sent, answered) = client.requests(CLIENT, 6, view(3), &slices);
        let gap = answered[0].1.as_ref().unwrap_err();
        assert_eq!(gap.code, ErrorCode::RequestOutOfOrder);
        assert_eq!(
            gap.details,
            vec![ErrorDetail::ExpectedRequest { request: 1 }]
        );
        assert_eq!(sent.len(), 1, "request 1 goes");
        slices.applied(
            SessionTag {
                session: 50,
                request: 1,
                crc: 0,
            },
            12,
            12,
        );
        let window = super::super::partition_machine::slices::SLICE_WINDOW as u32;
        for request in 2..=window {
            slices.applied(
                SessionTag {
                    session: 50,
                    request,
                    crc: 0,
                },
                13,
                13,
            );
        }
        client.queue(bytes::Bytes::from_static(b"a"), 'a', tag(50, 0));
        let (_, answered) = client.requests(CLIENT, 7, view(4), &slices);
        let older = answered[0].1.as_ref().unwrap_err();
        assert_eq!(older.code, ErrorCode::DuplicateRequest);
        assert_eq!(
            older.details,
            vec![ErrorDetail::LastRequest { request: window }]
        );
    }

    /// A request the replica was handed and did not prepare holds its retries only
    /// until the state holds the log's top after that turn.
    #[test]
    fn a_request_never_prepared_holds_no_retry_once_its_turn_is_applied() {
        let mut client = registered_client();
        let slices = Slices::default();
        let view = |op, commit_min| PrimaryAt {
            op,
            commit_min,
            ..at(true, 16)
        };
        client.queue(bytes::Bytes::from_static(b"a"), 'a', tag(50, 0));
        let (sent, _) = client.requests(CLIENT, 3, view(1, 1), &slices);
        assert_eq!(sent.len(), 1);
        client.handed_through(2);
        client.queue(bytes::Bytes::from_static(b"A"), 'A', tag(50, 0));
        let (sent, answered) = client.requests(CLIENT, 4, view(2, 1), &slices);
        assert!(
            sent.is_empty() && answered.is_empty(),
            "op 2 not applied yet"
        );
        // Op 2 applied and request 0 is in no entry: it was never prepared.
        let (sent, _) = client.requests(CLIENT, 5, view(2, 2), &slices);
        assert_eq!(sent.len(), 1, "the retry goes");
    }

    /// A new view's log may hold an earlier primary's prepares of a session's
    /// requests that the state has not applied: nothing of a session is judged until
    /// it has, and a given-up request still counts as prepared.
    #[test]
    fn a_new_view_judges_no_session_before_the_state_holds_its_log() {
        let mut client = registered_client();
        let mut slices = Slices::default();
        let view = |view, op, commit_min| PrimaryAt {
            view,
            op,
            commit_min,
            ..at(true, 16)
        };
        client.queue(bytes::Bytes::from_static(b"a"), 'a', tag(50, 0));
        let (sent, answered) = client.requests(CLIENT, 3, view(2, 8, 5), &slices);
        assert!(
            sent.is_empty() && answered.is_empty(),
            "ops 6..=8 unapplied"
        );
        // The earlier primary's op 7 was request 0 of session 50.
        slices.applied(
            SessionTag {
                session: 50,
                request: 0,
                crc: 0,
            },
            4,
            4,
        );
        let (sent, answered) = client.requests(CLIENT, 4, view(2, 8, 8), &slices);
        assert!(sent.is_empty());
        assert_eq!(answered[0].1.as_ref().ok(), Some(&(4, 4)));
        client.queue(bytes::Bytes::from_static(b"b"), 'b', tag(50, 1));
        let (sent, _) = client.requests(CLIENT, 5, view(2, 8, 8), &slices);
        assert_eq!(sent.len(), 1);
        let (_, lost) = client.overdue(CLIENT, 100, 0, 5);
        assert!(lost.contains(&'b'), "given up, and maybe still to commit");
        client.queue(bytes::Bytes::from_static(b"b"), 'B', tag(50, 1));
        let (sent, answered) = client.requests(CLIENT, 101, view(2, 9, 8), &slices);
        assert!(sent.is_empty() && answered.is_empty(), "waits for its copy");
        // The next view: its log's top is the floor again.
        let (sent, _) = client.requests(CLIENT, 102, view(3, 9, 8), &slices);
        assert!(sent.is_empty(), "op 9 not applied yet");
        let (sent, _) = client.requests(CLIENT, 103, view(3, 9, 9), &slices);
        assert_eq!(sent.len(), 1, "op 9 was not request 1: it goes now");
    }

    /// A barrier goes before the produces queued with it and, from then on, a
    /// session's request checked against metadata older than its frontier is refused
    /// (`Busy`: the door checks it again at newer metadata); a partition that owes a
    /// retirement takes no session it holds no entry of until a barrier catches it up.
    #[test]
    fn a_barrier_goes_first_and_requests_checked_below_the_frontier_wait() {
        let mut client = registered_client();
        let mut slices = Slices::default();
        let view = PrimaryAt {
            commit_min: 1,
            op: 1,
            ..at(true, 16)
        };
        let checked = |metadata_op, owed| Checked { metadata_op, owed };
        let session = |session, request, checked| {
            let tag = SessionTag {
                session,
                request,
                crc: 0,
            };
            Some((tag, checked))
        };
        client.queue(
            bytes::Bytes::from_static(b"s"),
            's',
            session(50, 0, checked(39, 0)),
        );
        assert!(client.retire(Barrier {
            frontier: 40,
            sessions: vec![7],
        }));
        assert!(
            !client.retire(Barrier {
                frontier: 41,
                sessions: vec![8],
            }),
            "one barrier at a time"
        );
        let (sent, answered) = client.requests(CLIENT, 3, view, &slices);
        assert_eq!(sent.len(), 1, "the barrier alone");
        assert!(sent[0]
            .body
            .starts_with(&super::super::partition_machine::barrier::BARRIER_MARK));
        let refused = answered[0].1.as_ref().unwrap_err();
        assert_eq!(refused.code, ErrorCode::Busy, "{refused}");
        assert!(
            !client.retire(Barrier {
                frontier: 41,
                sessions: vec![],
            }),
            "the first is in flight"
        );
        assert_eq!(
            client.answer(&reply(3, sent[0].request, Ok(Applied::Retired.encode()))),
            None,
            "nobody waits on a barrier"
        );
        slices.retire(40, &[7]);
        client.queue(
            bytes::Bytes::from_static(b"t"),
            't',
            session(50, 0, checked(40, 0)),
        );
        let (sent, answered) = client.requests(CLIENT, 4, view, &slices);
        assert_eq!(
            (sent.len(), answered.len()),
            (1, 0),
            "checked at the frontier"
        );
        slices.applied(
            SessionTag {
                session: 50,
                request: 0,
                crc: 0,
            },
            0,
            0,
        );
        client.queue(
            bytes::Bytes::from_static(b"u"),
            'u',
            session(60, 0, checked(45, 44)),
        );
        client.queue(
            bytes::Bytes::from_static(b"v"),
            'v',
            session(50, 1, checked(45, 44)),
        );
        let (sent, answered) = client.requests(CLIENT, 5, view, &slices);
        assert_eq!(answered.len(), 1);
        assert_eq!(
            answered[0].0, 'u',
            "a new session, refused while the partition owes"
        );
        assert_eq!(answered[0].1.as_ref().unwrap_err().code, ErrorCode::Busy);
        assert_eq!(sent.len(), 1, "a session it holds an entry of goes on");
    }
}
