//! Retiring a producer's client session in the simulator, with the node's own code:
//! at a drawn tick one of the producers' sessions ends (its door op is the simulated
//! metadata's next op, and no request of it is sent again), then a walk looks at
//! every member's copies (`PartitionGroups::copy_state`) and queues a barrier on each
//! primary whose copy is not proven (its frontier below the end op, or an entry of
//! the session in it), until every member's every copy is proven
//! (a member down holds copies no walk has seen: the walk waits for it, as the
//! metadata waits for every member's report). The end check: after convergence, and
//! again after a clean restart of every member (barriers in journals, checkpoints and
//! state transfers), no copy holds an entry of a retired session, and no record is
//! stored twice.

use std::collections::BTreeSet;

use super::{key, Run};
use crate::replication::partition_machine::barrier::Barrier;
use crate::retirement::CopyState;
use braid_sim::Prng;

/// How often (in ticks) the walk looks again.
const WALK_EVERY_TICKS: u64 = 5;

/// The simulated metadata's side of retirement.
#[derive(Debug)]
pub(super) struct Retiring {
    /// The op a door check is made at now: raised by each end.
    pub(super) door_op: u64,
    /// The tick at which a session ends.
    end_at: u64,
    /// The session being retired and its end op.
    ending: Option<(u64, u64)>,
    /// Sessions ended: none of their requests is sent again.
    pub(super) ended: BTreeSet<u64>,
    /// Sessions every copy was proven free of.
    retired: BTreeSet<u64>,
    /// The frontier every copy reached: the last retired session's end op.
    frontier: u64,
}

impl Retiring {
    pub(super) fn new(seed: u64, safety_ticks: u64) -> Self {
        let mut draws = Prng::new(seed.rotate_left(59) ^ 0x7e71);
        Self {
            door_op: 1,
            end_at: safety_ticks / 4 + draws.below(safety_ticks / 2 + 1),
            ending: None,
            ended: BTreeSet::new(),
            retired: BTreeSet::new(),
            frontier: 0,
        }
    }
}

impl Run {
    /// Ends a session at its tick, and walks while one is being retired.
    pub(super) fn step_retirement(&mut self, session: u64) {
        if self.tick == self.retiring.end_at && self.retiring.ended.is_empty() {
            self.retiring.door_op += 1;
            self.retiring.ending = Some((session, self.retiring.door_op));
            self.retiring.ended.insert(session);
            if self.trace {
                eprintln!("t{} session {session} ends", self.tick);
            }
        }
        let Some((session, end_op)) = self.retiring.ending else {
            return;
        };
        if !self.tick.is_multiple_of(WALK_EVERY_TICKS) {
            return;
        }
        let mut proven = true;
        for m in 0..self.member_count() {
            let partitions = self.shape.partitions;
            let Some(groups) = self.members[usize::from(m)].groups.as_mut() else {
                proven = false;
                continue;
            };
            for p in 0..partitions {
                match groups.copy_state(key(p), end_op, |s| s == session, |_| false) {
                    CopyState::Proven => {}
                    CopyState::Waiting => proven = false,
                    CopyState::Holds(sessions) => {
                        proven = false;
                        let barrier = Barrier {
                            frontier: end_op,
                            sessions,
                        };
                        if groups.retire(key(p), barrier) {
                            self.outcome.barriers_queued += 1;
                        }
                    }
                }
            }
            let moved = groups.flush();
            self.publish(m, moved);
            self.collect_sent(m);
        }
        if proven {
            if self.trace {
                eprintln!("t{} session {session} retired", self.tick);
            }
            self.retiring.retired.insert(session);
            self.retiring.frontier = end_op;
            self.retiring.ending = None;
            self.outcome.sessions_retired += 1;
        }
    }

    /// No copy on any member holds an entry of a retired session.
    pub(super) fn check_retired(&self, when: &str) -> Result<(), String> {
        for (m, member) in self.members.iter().enumerate() {
            let Some(groups) = member.groups.as_ref() else {
                continue;
            };
            for p in 0..self.shape.partitions {
                let retired = |s| self.retiring.retired.contains(&s);
                let state = groups.copy_state(key(p), self.retiring.frontier, retired, |_| false);
                if state != CopyState::Proven {
                    return Err(format!(
                        "{when}: member {m} partition {p} still holds a retired session's \
                         entry ({state:?}; retired {:?})",
                        self.retiring.retired
                    ));
                }
            }
        }
        Ok(())
    }
}
