//! The producers: a batch to whichever member says it leads, and what was acknowledged.
//! Half the batches are client sessions' requests ([`Sessions`]): one that fails is sent
//! again, the same bytes under the same number, until it is answered, as the SDK does,
//! and the end check finds every record in the logs at most once.

use std::collections::BTreeMap;

use braid_proto::client::ErrorCode;
use braid_proto::{BatchBuilder, ValidatedBatch};
use tokio::sync::oneshot;

use super::{key, Run, Waiting};
use crate::replication::partition_groups::Role;

/// The client sessions the simulated producers use (their ids need no register yet).
const SESSIONS: u64 = 2;
const FIRST_SESSION: u64 = 1_000_001;
/// The session that ends mid-run and is retired ([`super::retire`]).
pub(super) const RETIRED_SESSION: u64 = FIRST_SESSION;
/// Requests of one session to one partition unanswered at once.
const SESSION_IN_FLIGHT_MAX: usize = 4;

/// A session's requests to one partition.
#[derive(Debug, Default)]
struct SessionPartition {
    next: u32,
    /// Request -> its values and whether it is in flight (else it failed and waits to
    /// be sent again).
    unanswered: BTreeMap<u32, (Vec<Vec<u8>>, bool)>,
}

/// The sessions' requests, and what they learned.
#[derive(Debug, Default)]
pub(super) struct Sessions {
    partitions: BTreeMap<(u64, u32), SessionPartition>,
    /// Requests answered `DuplicateRequest` (stored before, offsets not kept): each
    /// value must be in its partition's log.
    pub(super) stored_somewhere: Vec<(u32, Vec<u8>)>,
}

impl Run {
    /// A producer sends one batch to whichever member says it leads the partition.
    pub(super) fn produce(&mut self) {
        let partition = self.prng.below(u64::from(self.shape.partitions)) as u32;
        let leader = (0..self.member_count()).find(|m| {
            self.members[usize::from(*m)]
                .groups
                .as_ref()
                .is_some_and(|g| g.role(key(partition)) == Role::Primary)
        });
        let Some(leader) = leader else {
            return;
        };
        let records = 1 + self.prng.below(4) as usize;
        let mut values = Vec::new();
        for _ in 0..records {
            self.next_value += 1;
            values.push(format!("s{}-v{}", self.seed, self.next_value).into_bytes());
        }
        let mut tag = None;
        let mut resent = false;
        let draw = self
            .session_draws
            .chance(50)
            .then(|| FIRST_SESSION + self.session_draws.below(SESSIONS));
        // An ended session sends nothing more (the door would refuse it).
        if let Some(session) = draw.filter(|s| !self.retiring.ended.contains(s)) {
            let requests = self
                .sessions
                .partitions
                .entry((session, partition))
                .or_default();
            let failed = requests
                .unanswered
                .iter_mut()
                .find(|(_, (_, in_flight))| !*in_flight);
            if let Some((request, (earlier, in_flight))) = failed {
                *in_flight = true;
                self.outcome.session_requests_resent += 1;
                values.clone_from(earlier);
                resent = true;
                tag = Some((session, *request));
            } else if requests.unanswered.len() < SESSION_IN_FLIGHT_MAX {
                let request = requests.next;
                requests.next += 1;
                requests.unanswered.insert(request, (values.clone(), true));
                tag = Some((session, request));
            } else {
                return;
            }
        }
        let mut builder = BatchBuilder::new(1_000);
        for value in &values {
            builder.push(None, Some(value), &[], 1_000);
        }
        if let Some((session, request)) = tag {
            builder.producer(session as i64, -1, request as i32);
        }
        let batch = match ValidatedBatch::new(builder.finish()) {
            Ok(batch) => batch,
            Err(err) => {
                self.fail(format!("the producer built a bad batch: {err}"));
                return;
            }
        };
        if self.trace {
            eprintln!(
                "t{} m{leader} takes a produce to p{partition} {tag:?}: {:?}",
                self.tick,
                values
                    .iter()
                    .map(|v| String::from_utf8_lossy(v).into_owned())
                    .collect::<Vec<_>>()
            );
        }
        let (reply, answer) = oneshot::channel();
        if let Some(groups) = self.members[usize::from(leader)].groups.as_mut() {
            // Every send is checked at the door again, at the metadata's op now.
            let checked = super::super::group_client::Checked {
                metadata_op: self.retiring.door_op,
                owed: 0,
            };
            groups.produce(key(partition), batch, reply, checked);
            let moved = groups.flush();
            self.publish(leader, moved);
        }
        self.waiting.push(Waiting {
            partition,
            values,
            tag,
            resent,
            answer,
        });
        self.collect_sent(leader);
    }

    /// A session's request was answered (`stored`) or failed and waits to be sent
    /// again.
    fn session_answered(&mut self, partition: u32, tag: Option<(u64, u32)>, stored: bool) {
        let Some((session, request)) = tag else {
            return;
        };
        let Some(requests) = self.sessions.partitions.get_mut(&(session, partition)) else {
            return;
        };
        if stored {
            requests.unanswered.remove(&request);
        } else if let Some((_, in_flight)) = requests.unanswered.get_mut(&request) {
            *in_flight = false;
        }
    }

    /// Takes the answers that came: an acknowledged batch's offsets are its own.
    pub(super) fn take_answers(&mut self) {
        let mut still = Vec::new();
        for mut waiting in std::mem::take(&mut self.waiting) {
            match waiting.answer.try_recv() {
                Err(oneshot::error::TryRecvError::Empty) => still.push(waiting),
                Ok(Err(err)) if err.code == ErrorCode::DuplicateRequest => {
                    if waiting.tag.is_none() {
                        self.fail(format!("a produce without a session was refused: {err:?}"));
                        continue;
                    }
                    self.session_answered(waiting.partition, waiting.tag, true);
                    self.outcome.duplicates_refused += 1;
                    for value in waiting.values {
                        self.sessions
                            .stored_somewhere
                            .push((waiting.partition, value));
                    }
                }
                Err(oneshot::error::TryRecvError::Closed) | Ok(Err(_)) => {
                    self.session_answered(waiting.partition, waiting.tag, false);
                    self.outcome.produces_failed += 1;
                }
                Ok(Ok((base, last))) => {
                    if waiting.resent {
                        self.outcome.resent_requests_acknowledged += 1;
                    }
                    self.session_answered(waiting.partition, waiting.tag, true);
                    let count = waiting.values.len() as u64;
                    if self.trace {
                        eprintln!(
                            "t{} acked p{} {:?} {base}..={last} {:?}",
                            self.tick,
                            waiting.partition,
                            waiting.tag,
                            waiting
                                .values
                                .iter()
                                .map(|v| String::from_utf8_lossy(v).into_owned())
                                .collect::<Vec<_>>()
                        );
                    }
                    if last + 1 < base || last + 1 - base != count {
                        self.fail(format!(
                            "a batch of {count} records was acknowledged at {base}..={last}"
                        ));
                        continue;
                    }
                    for (i, value) in waiting.values.into_iter().enumerate() {
                        let at = (waiting.partition, base + i as u64);
                        if let Some(earlier) = self.acked.insert(at, value.clone()) {
                            if earlier != value {
                                self.fail(format!(
                                    "partition {} offset {} acknowledged twice: {} then {}",
                                    at.0,
                                    at.1,
                                    String::from_utf8_lossy(&earlier),
                                    String::from_utf8_lossy(&value)
                                ));
                            }
                        }
                        self.outcome.records_acknowledged += 1;
                    }
                }
            }
        }
        self.waiting = still;
    }
}
