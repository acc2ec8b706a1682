//! The coordinator's side of consumer groups: joins and leaves proposed to the
//! metadata (membership is replicated, `metadata::members`), heartbeats and grants
//! served from what this coordinator heard (`crate::groups`), commits checked against
//! both, and the groups described.

use std::collections::BTreeMap;
use std::sync::Arc;

use braid_proto::client::{
    ErrorCode, GroupDescription, GroupMember, GroupSummary, PartitionOffsets, Response,
};

use super::{
    gather_offsets, refuse_commit_beyond, topic_keys, MetaService, Reply, Waiter,
    SESSION_TIMEOUT_MS_MAX, SESSION_TIMEOUT_MS_MIN,
};
use crate::error::NodeError;
use crate::layout::PartitionKey;
use crate::mailbox::{now_ms, NodeShared};
use crate::metadata::{op, MetaOp};

/// How often the coordinator looks for members that went quiet.
const QUIET_EVERY_MS: u64 = 100;

impl MetaService {
    /// Proposes a member's join: answered with its grant once committed (its id is
    /// the op's number).
    pub(super) fn join(&mut self, shared: &Arc<NodeShared>, join: op::JoinGroup, reply: Reply) {
        if let Err(err) = self.check_join(&join.stream, &join.group, &join.topic, join.timeout_ms) {
            let _ = reply.send(Err(err));
            return;
        }
        let (stream, group) = (join.stream.clone(), join.group.clone());
        self.propose(
            shared,
            MetaOp::JoinGroup(join),
            Waiter::Join {
                reply,
                stream,
                group,
            },
        );
    }

    /// Refuses `user` a call naming a member another user joined (`PermissionDenied`);
    /// an unknown member is left to the call to refuse.
    pub(super) fn check_member_user(
        &self,
        stream: &str,
        group: &str,
        member_id: u64,
        user: Option<&str>,
    ) -> Result<(), NodeError> {
        let joined_by = self
            .group
            .state()
            .memberships
            .get(&(stream.to_owned(), group.to_owned()))
            .and_then(|m| m.members.get(&member_id))
            .map(|m| m.user.as_str())
            .filter(|u| !u.is_empty());
        match crate::client_sessions::not_theirs("group member", member_id, joined_by, user) {
            Some(refusal) => Err(refusal),
            None => Ok(()),
        }
    }

    fn check_join(
        &self,
        stream: &str,
        group: &str,
        topic: &str,
        timeout_ms: u32,
    ) -> Result<(), NodeError> {
        let state = self.group.state();
        state.topic(stream, topic)?;
        if !(SESSION_TIMEOUT_MS_MIN..=SESSION_TIMEOUT_MS_MAX).contains(&timeout_ms) {
            return Err(NodeError::new(
                ErrorCode::InvalidArgument,
                format!("session timeout must be {SESSION_TIMEOUT_MS_MIN} to {SESSION_TIMEOUT_MS_MAX} ms"),
            ));
        }
        let live = state
            .memberships
            .get(&(stream.to_owned(), group.to_owned()))
            .is_some_and(|m| !m.members.is_empty());
        if let Some(durable) = state.stream(stream)?.groups.get(group) {
            if durable.topic != topic && live {
                return Err(NodeError::new(
                    ErrorCode::InvalidArgument,
                    format!("group {group:?} consumes topic {:?}", durable.topic),
                ));
            }
        }
        self.groups.check_join(&state.memberships, stream, group)?;
        Ok(())
    }

    /// A member's heartbeat: what it owns now, answered with its grant. A member of a
    /// client session keeps the session open too.
    pub(super) fn group_heartbeat(
        &mut self,
        stream: &str,
        group: &str,
        member_id: u64,
        owned: &[u32],
    ) -> Result<Response, NodeError> {
        let now = now_ms();
        let state = self.group.state();
        let grant =
            self.groups
                .heartbeat(&state.memberships, stream, group, member_id, owned, now)?;
        let session = state
            .memberships
            .get(&(stream.to_owned(), group.to_owned()))
            .and_then(|m| m.members.get(&member_id))
            .map_or(0, |m| m.session);
        if let Some(open) = state
            .sessions
            .get(&session)
            .filter(|s| s.ended_at.is_none())
        {
            self.liveness.enter_view(self.group.view());
            self.liveness.heard(session, open.timeout_ms, now);
        }
        Ok(Response::Assignment {
            member_id: grant.member_id,
            generation: grant.generation,
            partitions: grant.partitions,
        })
    }

    /// Proposes a member's leave, answered once committed.
    pub(super) fn leave(
        &mut self,
        shared: &Arc<NodeShared>,
        stream: String,
        group: String,
        member: u64,
        reply: Reply,
    ) {
        let leave = op::LeaveGroup {
            stream,
            group,
            member,
        };
        if let Err(err) = self.group.state().check(&MetaOp::LeaveGroup(leave.clone())) {
            let _ = reply.send(Err(err.into()));
            return;
        }
        self.propose(shared, MetaOp::LeaveGroup(leave), Waiter::Plain(reply));
    }

    /// On the coordinator, proposes the leave of every member that went quiet
    /// (looked at every [`QUIET_EVERY_MS`]: a look walks every member).
    pub(super) fn leave_quiet_members(&mut self, shared: &Arc<NodeShared>, now: u64) {
        if now < self.members_looked_ms.saturating_add(QUIET_EVERY_MS)
            || self.not_coordinator(shared).is_some()
        {
            return;
        }
        self.members_looked_ms = now;
        self.groups.enter_epoch(self.group.view());
        for leave in self.groups.quiet(&self.group.state().memberships, now) {
            tracing::info!(
                stream = leave.stream,
                group = leave.group,
                member = leave.member,
                "a group member missed its heartbeats: it leaves"
            );
            self.propose(shared, MetaOp::LeaveGroup(leave), Waiter::Quiet);
        }
    }

    /// A committed join's answer: the member's grant.
    pub(super) fn joined(
        &mut self,
        stream: &str,
        group: &str,
        member_id: u64,
    ) -> Result<Response, NodeError> {
        let state = self.group.state();
        let grant = self
            .groups
            .joined(&state.memberships, stream, group, member_id, now_ms())?;
        Ok(Response::Assignment {
            member_id: grant.member_id,
            generation: grant.generation,
            partitions: grant.partitions,
        })
    }

    /// The op that commits `offsets` for a member, if the member may.
    pub(super) fn commit_op(
        &mut self,
        shared: &Arc<NodeShared>,
        stream: &str,
        group: &str,
        member_id: u64,
        generation: u32,
        offsets: Vec<(u32, u64)>,
    ) -> Result<MetaOp, NodeError> {
        let memberships = &self.group.state().memberships;
        for (partition, _) in &offsets {
            self.groups.check_commit(
                memberships,
                stream,
                group,
                member_id,
                generation,
                *partition,
            )?;
        }
        let topic = memberships
            .get(&(stream.to_owned(), group.to_owned()))
            .map(|m| m.topic.clone())
            .ok_or_else(|| NodeError::new(ErrorCode::UnknownMember, "no such live group"))?;
        let topic_id = self.group.state().topic(stream, &topic)?.id;
        let cluster = shared.cluster.members.len() > 1;
        let high_watermark = |key: &crate::layout::PartitionKey| {
            let published = shared.partitions_published.read().ok()?;
            Some(published.get(key)?.high_watermark())
        };
        let leads = |key: &crate::layout::PartitionKey| {
            shared.partitions_published.read().is_ok_and(|published| {
                published
                    .get(key)
                    .is_some_and(|p| p.primary().0 == Some(shared.cluster.node_id))
            })
        };
        refuse_commit_beyond(topic_id, &offsets, cluster, high_watermark, leads)?;
        Ok(MetaOp::CommitOffsets(op::CommitOffsets {
            stream: stream.to_owned(),
            group: group.to_owned(),
            topic,
            offsets,
        }))
    }

    pub(super) fn list_groups(&self, stream: &str) -> Result<Response, NodeError> {
        let durable = &self.group.state().stream(stream)?.groups;
        let mut all: BTreeMap<String, GroupSummary> = durable
            .iter()
            .map(|(name, g)| {
                let summary = GroupSummary {
                    name: name.clone(),
                    topic: g.topic.clone(),
                    members: 0,
                    generation: 0,
                };
                (name.clone(), summary)
            })
            .collect();
        let memberships = &self.group.state().memberships;
        for ((_, name), membership) in memberships
            .range((stream.to_owned(), String::new())..)
            .take_while(|((s, _), _)| s == stream)
        {
            all.insert(
                name.clone(),
                GroupSummary {
                    name: name.clone(),
                    topic: membership.topic.clone(),
                    members: membership.members.len() as u32,
                    generation: membership.generation,
                },
            );
        }
        Ok(Response::Groups(all.into_values().collect()))
    }

    /// Answers DescribeGroup, or with `offsets_only` FetchOffsets.
    pub(super) fn describe_group(
        &self,
        shared: &Arc<NodeShared>,
        stream: String,
        group: String,
        offsets_only: bool,
        reply: Reply,
    ) {
        let state = self.group.state();
        let live = state
            .memberships
            .get(&(stream.clone(), group.clone()))
            .map(|membership| {
                let members: Vec<GroupMember> = membership
                    .members
                    .iter()
                    .map(|(id, member)| GroupMember {
                        id: *id,
                        name: member.name.clone(),
                        assignment: self.groups.granted_to(membership, *id),
                    })
                    .collect();
                (membership.topic.clone(), membership.generation, members)
            });
        let durable = state
            .stream(&stream)
            .ok()
            .and_then(|s| s.groups.get(&group))
            .cloned();
        let topic_name = match (&live, &durable) {
            (Some((topic, _, _)), _) => topic.clone(),
            (None, Some(d)) => d.topic.clone(),
            (None, None) => {
                let _ = reply.send(Err(NodeError::new(
                    ErrorCode::GroupNotFound,
                    format!("group {group:?} does not exist"),
                )));
                return;
            }
        };
        let topic = match state.topic(&stream, &topic_name) {
            Ok(topic) => topic.clone(),
            Err(err) => {
                let _ = reply.send(Err(err.into()));
                return;
            }
        };
        let committed = durable.map(|d| d.offsets).unwrap_or_default();
        let shared = Arc::clone(shared);
        tokio::task::spawn_local(async move {
            let marks = gather_offsets(shared, topic_keys(&topic)).await;
            let offsets = topic
                .partitions
                .iter()
                .map(|p| {
                    let key = PartitionKey {
                        topic_id: topic.id,
                        partition: p.id,
                    };
                    PartitionOffsets {
                        partition: p.id,
                        committed: committed.get(&p.id).copied(),
                        high_watermark: marks.get(&key).map_or(0, |m| m.1),
                    }
                })
                .collect();
            if offsets_only {
                let _ = reply.send(Ok(Response::Offsets(offsets)));
                return;
            }
            let (generation, members) = match live {
                Some((_, generation, members)) => (generation, members),
                None => (0, Vec::new()),
            };
            let _ = reply.send(Ok(Response::Group(GroupDescription {
                name: group,
                topic: topic_name,
                generation,
                members,
                offsets,
            })));
        });
    }
}
