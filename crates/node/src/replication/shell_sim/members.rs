//! Consumer-group membership under the shell simulator: the metadata client now and
//! then creates a topic in an acknowledged stream, joins a member to its group (with an
//! answered client session or none) or leaves an answered member, through the real
//! metadata group under its faults. The end check: every answered member is in its
//! group with its session, unless its leave or its session's end was proposed; no
//! member whose leave was acknowledged is.

use std::collections::{BTreeMap, BTreeSet};

use braid_proto::client::TopicSettings;

use crate::metadata::{op, MetaOp, Metadata};

/// Chance, in percent, that a proposal is one of groups' instead of a stream.
pub(super) const GROUP_PERCENT: u64 = 30;
/// The topic each stream's group consumes, and the group.
const TOPIC: &str = "t";
const GROUP: &str = "g";

/// A proposal of groups' ops.
#[derive(Debug, Clone)]
pub(super) enum GroupProposal {
    Topic(String),
    Join { stream: String, session: u64 },
    Leave(u64),
}

/// What the client proposed of groups and what was answered.
#[derive(Debug, Default)]
pub(super) struct GroupProposals {
    /// Proposal token -> what it proposes, until answered.
    pub(super) waiting: BTreeMap<u64, GroupProposal>,
    /// Streams whose topic's creation was acknowledged.
    topics: BTreeSet<String>,
    /// Member id (the join's op) -> its stream and session, for answered joins.
    members: BTreeMap<u64, (String, u64)>,
    /// Members a leave was proposed for.
    leave_proposed: BTreeSet<u64>,
    /// Members whose leave was acknowledged.
    left: BTreeSet<u64>,
    /// Joins answered.
    pub(super) joined: u64,
}

impl GroupProposals {
    /// Draws one of groups' ops: a topic in an acknowledged stream, a join to its
    /// group (with session `session`, 0 for none), or the leave of an answered member.
    pub(super) fn draw(
        &self,
        kind: u64,
        pick: u64,
        streams: &BTreeSet<String>,
        session: u64,
    ) -> Option<(MetaOp, GroupProposal)> {
        let nth = |len: usize| (pick % len.max(1) as u64) as usize;
        match kind {
            0 => {
                let stream = streams.iter().nth(nth(streams.len()))?.clone();
                let topic = MetaOp::CreateTopic(op::CreateTopic {
                    stream: stream.clone(),
                    name: TOPIC.into(),
                    settings: TopicSettings {
                        partitions: 3,
                        ..TopicSettings::default()
                    },
                });
                Some((topic, GroupProposal::Topic(stream)))
            }
            1 => {
                // Mostly where the topic was made; now and then anywhere (refused).
                let with_topic = if pick.is_multiple_of(8) {
                    streams
                } else {
                    &self.topics
                };
                let stream = with_topic.iter().nth(nth(with_topic.len()))?.clone();
                let join = MetaOp::JoinGroup(op::JoinGroup {
                    stream: stream.clone(),
                    group: GROUP.into(),
                    topic: TOPIC.into(),
                    name: "sim".into(),
                    session,
                    timeout_ms: 10_000,
                    user: String::new(),
                });
                Some((join, GroupProposal::Join { stream, session }))
            }
            _ => {
                let member = *self.members.keys().nth(nth(self.members.len()))?;
                let (stream, _) = &self.members[&member];
                let leave = MetaOp::LeaveGroup(op::LeaveGroup {
                    stream: stream.clone(),
                    group: GROUP.into(),
                    member,
                });
                Some((leave, GroupProposal::Leave(member)))
            }
        }
    }

    /// A proposal was made.
    pub(super) fn proposed(&mut self, token: u64, proposal: GroupProposal) {
        if let GroupProposal::Leave(member) = proposal {
            self.leave_proposed.insert(member);
        }
        self.waiting.insert(token, proposal);
    }

    /// Proposal `token` was answered `outcome` (the op it applied at); `Err` with what
    /// is wrong if the answer cannot be.
    pub(super) fn answered(&mut self, token: u64, outcome: Result<u64, ()>) -> Result<(), String> {
        let Some(proposal) = self.waiting.remove(&token) else {
            return Ok(());
        };
        match (proposal, outcome) {
            (GroupProposal::Join { stream, session }, Ok(member)) => {
                self.joined += 1;
                if let Some(earlier) = self.members.insert(member, (stream, session)) {
                    return Err(format!(
                        "two joins were answered member {member} ({earlier:?} first)"
                    ));
                }
            }
            (GroupProposal::Leave(member), Ok(_)) => {
                self.left.insert(member);
            }
            (GroupProposal::Topic(stream), Ok(_)) => {
                self.topics.insert(stream);
            }
            _ => {}
        }
        Ok(())
    }

    /// The end check against the members' common metadata; `ending` says whether an
    /// end of a session was proposed.
    pub(super) fn check(
        &self,
        meta: &Metadata,
        ending: impl Fn(u64) -> bool,
    ) -> Result<(), String> {
        for (member, (stream, session)) in &self.members {
            let found = meta
                .memberships
                .get(&(stream.clone(), GROUP.to_owned()))
                .and_then(|m| m.members.get(member));
            let may_be_gone =
                self.leave_proposed.contains(member) || (*session != 0 && ending(*session));
            match found {
                Some(_) if self.left.contains(member) => {
                    return Err(format!(
                        "member {member}'s leave was acknowledged; it is still in"
                    ))
                }
                Some(found) if found.session != *session => {
                    return Err(format!(
                        "member {member} joined with session {session}; the metadata says {}",
                        found.session
                    ))
                }
                Some(_) => {}
                None if may_be_gone => {}
                None => {
                    return Err(format!(
                        "member {member}'s join was answered and it never left, but it is in \
                         no member's metadata"
                    ))
                }
            }
        }
        Ok(())
    }
}
