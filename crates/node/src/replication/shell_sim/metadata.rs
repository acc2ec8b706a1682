//! The metadata group under the shell simulator: each member runs the node's real
//! [`MetaGroup`] (its journal of inline ops, checkpoints of the metadata state machine
//! and states table in `metadata/`), opened as [`crate::node`] opens it: the data
//! directory's identity claimed, what it lost found by [`identity::check_intact`], the
//! identity marked initialized after the open. A client proposes streams through any
//! member, and now and then registers a client session, ends one, reports a walk
//! retiring ended sessions or finalizes them (the ops of retirement, through view
//! changes); every acknowledged stream and session must be in every member's metadata
//! at the end (each session under the id it was answered, no id answered twice; an
//! ended one ended, or retired through an acknowledged finalize), and members that
//! applied the same ops must hold the same metadata at every check.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use super::members::{GroupProposals, GROUP_PERCENT};
use super::Run;
use crate::identity::{self, Start};
use crate::metadata::{op, MetaOp, Metadata};
use crate::replication::meta_group::{MetaGroup, MetaOpening, Turn};

/// Chance per tick, in percent, that the client proposes a stream.
const PROPOSE_PERCENT: u64 = 3;
/// Chance, in percent, that a proposal registers a client session instead.
const REGISTER_PERCENT: u64 = 20;
/// Chance, in percent, that a proposal is one of retirement's instead: an end of a
/// registered session, a member's report of a walk, or the finalize that is due.
const RETIRE_PERCENT: u64 = 30;
const SESSION_TIMEOUT_MS: u32 = 10_000;

/// The cluster name the members' identities carry.
const CLUSTER: &str = "shell-sim";

/// What the client proposed and what was acknowledged.
#[derive(Debug, Default)]
pub(super) struct Proposals {
    next: u64,
    /// Proposal -> the member that took it, until it is answered (or the member dies).
    waiting: BTreeMap<u64, u8>,
    /// Streams whose creation was acknowledged.
    acked: BTreeSet<String>,
    /// Proposals that register a client session.
    registers: BTreeSet<u64>,
    /// Session id -> the proposal whose register was answered with it.
    pub(super) sessions: BTreeMap<u64, u64>,
    /// Proposals of retirement's ops: an end (of the session named), a report, a
    /// finalize (through the op named).
    retiring: BTreeMap<u64, Retiring>,
    /// Sessions an end was proposed for (it may commit unanswered).
    end_proposed: BTreeSet<u64>,
    /// Sessions whose end was acknowledged.
    ended: BTreeSet<u64>,
    /// The highest op a finalize was acknowledged through.
    finalized: u64,
    /// Finalizes acknowledged.
    pub(super) finalizes: u64,
    /// Consumer groups' proposals.
    pub(super) groups: GroupProposals,
    pub(super) acknowledged: u64,
    pub(super) refused: u64,
}

impl Proposals {
    /// Member `m` died: what it had not answered is unknown, never acknowledged.
    pub(super) fn forget_member(&mut self, m: u8) {
        self.waiting.retain(|_, at| *at != m);
    }

    pub(super) fn settled(&self) -> bool {
        self.waiting.is_empty()
    }
}

/// A proposal of retirement's ops.
#[derive(Debug, Clone, Copy)]
enum Retiring {
    End(u64),
    Report,
    Finalize(u64),
}

fn stream_name(n: u64) -> String {
    format!("stream-{n}")
}

/// Opens member `m`'s metadata group in `data_dir` as a node's start does.
pub(super) fn open(
    data_dir: &Path,
    m: u8,
    opening: MetaOpening,
    first_boot: bool,
) -> Result<MetaGroup<u64>, String> {
    let lost = identity::check_intact(data_dir, true).map_err(|e| e.to_string())?;
    let identity = identity::claim_as(
        data_dir,
        Some((CLUSTER, m)),
        Start::Told { init: first_boot },
        false,
        || CLUSTER.into(),
    )
    .map_err(|e| e.to_string())?;
    let dir = data_dir.join("metadata");
    braid_storage::create_dir_durable(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let opening = MetaOpening {
        rejoined: identity.rejoined,
        lost: lost.metadata,
        ..opening
    };
    let group = MetaGroup::open(&dir, opening).map_err(|e| e.to_string())?;
    identity::mark_initialized(data_dir, &identity).map_err(|e| e.to_string())?;
    Ok(group)
}

/// One of retirement's ops for member `m` to propose, drawn by `kind`: the end of an
/// answered session (`pick` chooses), `m`'s report of a walk through the newest end in
/// its metadata, or the finalize its metadata says is due; `None` if there is none.
fn retire_op(
    state: &Metadata,
    m: u8,
    members: u8,
    kind: u64,
    pick: u64,
    sessions: &BTreeMap<u64, u64>,
) -> Option<(MetaOp, Retiring)> {
    match kind {
        0 => {
            let ids: Vec<u64> = sessions.keys().copied().collect();
            let session = *ids.get((pick % ids.len().max(1) as u64) as usize)?;
            let end = MetaOp::EndSession(op::EndSession { session });
            Some((end, Retiring::End(session)))
        }
        1 => {
            let watermark = state.sessions.values().filter_map(|s| s.ended_at).max()?;
            let report = MetaOp::ReportRetirement(op::ReportRetirement {
                node: m,
                watermark,
                debt: Vec::new(),
            });
            Some((report, Retiring::Report))
        }
        _ => {
            let finalize = state.retirement.due(0..members)?;
            let through = finalize.retired_through;
            Some((
                MetaOp::FinalizeSession(finalize),
                Retiring::Finalize(through),
            ))
        }
    }
}

impl Run {
    /// Member `m`'s metadata group, if it is up.
    fn meta_mut(&mut self, m: u8) -> Option<&mut MetaGroup<u64>> {
        self.members[usize::from(m)].meta.as_mut()
    }

    /// Takes what a turn of member `m`'s group answered, and sends what it sent.
    pub(super) fn take_meta_turn(&mut self, m: u8, turn: Turn<u64>) {
        for (token, outcome) in turn.answered {
            let Some(took) = self.proposals.waiting.remove(&token) else {
                continue;
            };
            if took != m {
                self.fail(format!(
                    "proposal {token}, taken by member {took}, answered by member {m}"
                ));
            }
            if self.proposals.groups.waiting.contains_key(&token) {
                let outcome = outcome.map_err(|_| ());
                if outcome.is_err() {
                    self.proposals.refused += 1;
                }
                if let Err(what) = self.proposals.groups.answered(token, outcome) {
                    self.fail(what);
                }
                continue;
            }
            if let Some(retiring) = self.proposals.retiring.remove(&token) {
                match (retiring, outcome) {
                    (Retiring::End(session), Ok(_)) => {
                        self.proposals.ended.insert(session);
                    }
                    (Retiring::Finalize(through), Ok(_)) => {
                        self.proposals.finalizes += 1;
                        self.proposals.finalized = self.proposals.finalized.max(through);
                    }
                    (Retiring::Report, Ok(_)) => {}
                    (_, Err(_)) => self.proposals.refused += 1,
                }
                continue;
            }
            match outcome {
                Ok(session) if self.proposals.registers.contains(&token) => {
                    if let Some(earlier) = self.proposals.sessions.insert(session, token) {
                        self.fail(format!(
                            "registers {earlier} and {token} were both answered session {session}"
                        ));
                    }
                }
                Ok(_) => {
                    self.proposals.acknowledged += 1;
                    self.proposals.acked.insert(stream_name(token));
                    if self.trace {
                        eprintln!("t{} m{m} acked {}", self.tick, stream_name(token));
                    }
                }
                Err(_) => self.proposals.refused += 1,
            }
        }
        let sent = self.meta_mut(m).map(MetaGroup::take_sent);
        for (to, frame) in sent.unwrap_or_default() {
            self.send(m, to, frame);
        }
    }

    /// With some chance, the client proposes a new stream, or registers a session,
    /// through a member that is up.
    pub(super) fn propose_stream(&mut self) {
        if !self.prng.chance(PROPOSE_PERCENT) {
            return;
        }
        let m = self.prng.below(u64::from(self.member_count())) as u8;
        let token = self.proposals.next;
        let register = self.session_draws.chance(REGISTER_PERCENT);
        let retiring = !register && self.session_draws.chance(RETIRE_PERCENT);
        let kind = self.session_draws.below(3);
        let pick = self.session_draws.below(u64::MAX);
        let grouping = !register && !retiring && self.group_draws.chance(GROUP_PERCENT);
        let group_kind = self.group_draws.below(3);
        let group_pick = self.group_draws.below(u64::MAX);
        let member_session = match self.group_draws.below(3) {
            0 => 0,
            n => self
                .proposals
                .sessions
                .keys()
                .nth(
                    (group_pick.rotate_left(7) % (self.proposals.sessions.len() as u64 + 1))
                        as usize,
                )
                .copied()
                .unwrap_or(n),
        };
        let members = self.member_count();
        let Some(group) = self.members[usize::from(m)].meta.as_mut() else {
            return;
        };
        let grouped = if grouping {
            self.proposals.groups.draw(
                group_kind,
                group_pick,
                &self.proposals.acked,
                member_session,
            )
        } else {
            None
        };
        if let Some((op, what)) = grouped {
            let turn = group.propose(op, token);
            self.proposals.next += 1;
            self.proposals.groups.proposed(token, what);
            self.proposals.waiting.insert(token, m);
            self.take_meta_turn(m, turn);
            return;
        }
        let retire = if retiring {
            retire_op(
                group.state(),
                m,
                members,
                kind,
                pick,
                &self.proposals.sessions,
            )
        } else {
            None
        };
        if let Some((op, what)) = retire {
            let turn = group.propose(op, token);
            self.proposals.next += 1;
            if let Retiring::End(session) = what {
                self.proposals.end_proposed.insert(session);
            }
            self.proposals.retiring.insert(token, what);
            self.proposals.waiting.insert(token, m);
            self.take_meta_turn(m, turn);
            return;
        }
        let op = if register {
            MetaOp::RegisterSession(op::RegisterSession {
                timeout_ms: SESSION_TIMEOUT_MS,
            })
        } else {
            MetaOp::CreateStream(op::CreateStream {
                name: stream_name(token),
            })
        };
        let turn = group.propose(op, token);
        self.proposals.next += 1;
        if register {
            self.proposals.registers.insert(token);
        }
        self.proposals.waiting.insert(token, m);
        self.take_meta_turn(m, turn);
    }

    /// Members that applied the same ops hold the same metadata: the state at a commit
    /// is a function of the committed ops, so a difference is divergence.
    pub(super) fn check_metadata_agrees(&mut self) {
        let mut by_commit: BTreeMap<u64, (u8, &Metadata)> = BTreeMap::new();
        let mut failure = None;
        for (m, member) in self.members.iter().enumerate() {
            let Some(group) = member.meta.as_ref() else {
                continue;
            };
            let Some(status) = group.status() else {
                continue;
            };
            match by_commit.get(&status.commit_min) {
                Some((other, state)) if *state != group.state() => {
                    failure.get_or_insert(format!(
                        "members {other} and {m} applied the metadata's ops to {} and hold \
                         different metadata",
                        status.commit_min
                    ));
                }
                Some(_) => {}
                None => {
                    by_commit.insert(status.commit_min, (m as u8, group.state()));
                }
            }
        }
        if let Some(what) = failure {
            self.fail(what);
        }
    }

    /// Every member's metadata group is normal, with every op it holds applied, at
    /// the same commit, and every proposal answered.
    pub(super) fn metadata_converged(&self) -> bool {
        let mut commits = self.members.iter().map(|member| {
            let status = member.meta.as_ref()?.status()?;
            (status.status == braid_vsr::Status::Normal && status.commit_min == status.op)
                .then_some(status.commit_min)
        });
        let Some(Some(first)) = commits.next() else {
            return false;
        };
        self.proposals.settled() && commits.all(|c| c == Some(first))
    }

    /// At the end: every member holds the same metadata, with every acknowledged
    /// stream in it. Returns the streams.
    pub(super) fn compare_metadata(&self) -> Result<usize, String> {
        let mut states = Vec::new();
        for (m, member) in self.members.iter().enumerate() {
            let group = member
                .meta
                .as_ref()
                .ok_or_else(|| format!("member {m}'s metadata group is down at the end"))?;
            states.push(group.state());
        }
        let first = states[0];
        if let Some(m) = states.iter().position(|s| *s != first) {
            return Err(format!(
                "members 0 and {m} hold different metadata at the end: {} and {} streams",
                first.streams.len(),
                states[m].streams.len()
            ));
        }
        if let Some(lost) = self
            .proposals
            .acked
            .iter()
            .find(|name| !first.streams.contains_key(*name))
        {
            return Err(format!(
                "the acknowledged creation of {lost} is in no member's metadata"
            ));
        }
        self.proposals.groups.check(first, |session| {
            self.proposals.end_proposed.contains(&session)
        })?;
        let retired_through = first.retirement.retired_through;
        if retired_through < self.proposals.finalized {
            return Err(format!(
                "a finalize through op {} was acknowledged; the metadata retired through {}",
                self.proposals.finalized, retired_through
            ));
        }
        for id in self.proposals.sessions.keys() {
            let ending = self.proposals.end_proposed.contains(id);
            let fine = match first.sessions.get(id) {
                // Retired: ended (at an op past its id) at or below what is retired.
                None => ending && retired_through > *id,
                Some(s) if s.timeout_ms != SESSION_TIMEOUT_MS => false,
                Some(s) => match s.ended_at {
                    Some(end) => ending && end > retired_through,
                    None => !self.proposals.ended.contains(id),
                },
            };
            if !fine {
                return Err(format!(
                    "session {id}, registered and answered ({}), stands in the members' \
                     metadata as {:?} (retired through {retired_through})",
                    if self.proposals.ended.contains(id) {
                        "its end acknowledged"
                    } else if ending {
                        "an end proposed"
                    } else {
                        "never ended"
                    },
                    first.sessions.get(id)
                ));
            }
        }
        Ok(first.streams.len())
    }

    /// Member `m`'s metadata group, for a failure's report.
    pub(super) fn describe_metadata(&self, m: u8) -> String {
        match self.members[usize::from(m)]
            .meta
            .as_ref()
            .and_then(MetaGroup::status)
        {
            Some(s) => format!(
                "meta: {:?} v{} op{} c{}/{} {:?}",
                s.status, s.view, s.op, s.commit_min, s.commit_max, s.trusted
            ),
            None => "meta: down".into(),
        }
    }
}
