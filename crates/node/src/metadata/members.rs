//! Consumer-group membership as the metadata holds it: every group's members, the
//! partitions each is meant to consume (its *target*) and the group's generation.
//! Joins and leaves are metadata ops, so membership and assignment survive a
//! coordinator failover: the new coordinator serves the same members, ids and
//! generation, and nobody rejoins. A member joined with a client session leaves its
//! group when the session ends (`EndSession`, closed or timed out).
//!
//! What each member reports it *owns* (the cooperative hand-over, `crate::groups`)
//! changes with every heartbeat and stays in the coordinator's memory; a new
//! coordinator treats a member it has not heard from yet as owning whatever it may.

use std::collections::{BTreeMap, BTreeSet};

use braid_proto::wire::{WireError, WireReader, WireWrite};

use super::op::Change;
use super::{MetaError, Metadata};
use crate::groups::GroupError;

/// One member of a group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberMeta {
    /// A name for people (the client id).
    pub name: String,
    /// The client session it belongs to (0: none; it lives by its heartbeats alone).
    pub session: u64,
    /// It leaves when no heartbeat comes for this long.
    pub timeout_ms: u32,
    /// The user that joined it (empty: nobody logged in): only that user may
    /// heartbeat it, commit as it or take it out.
    pub user: String,
    /// The partitions it is meant to consume, in order.
    pub target: BTreeSet<u32>,
}

/// One group's members.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Membership {
    /// The topic it consumes.
    pub topic: String,
    /// Raised by every change of members: a commit must name the current one.
    pub generation: u32,
    /// Members by id (the op that joined each).
    pub members: BTreeMap<u64, MemberMeta>,
}

impl Membership {
    /// Spreads `partitions` over the members, balanced by count and sticky (each
    /// keeps what it had, up to its share), and raises the generation. Deterministic:
    /// every replica applies it alike.
    fn rebalance(&mut self, partitions: &[u32]) {
        self.generation = self.generation.wrapping_add(1);
        let count = self.members.len();
        if count == 0 {
            return;
        }
        let base = partitions.len() / count;
        let extra = partitions.len() % count;
        let valid: BTreeSet<u32> = partitions.iter().copied().collect();
        let mut taken = BTreeSet::new();
        let quotas: Vec<usize> = (0..count).map(|i| base + usize::from(i < extra)).collect();
        for (member, quota) in self.members.values_mut().zip(&quotas) {
            let kept: BTreeSet<u32> = member
                .target
                .iter()
                .copied()
                .filter(|p| valid.contains(p) && !taken.contains(p))
                .take(*quota)
                .collect();
            taken.extend(kept.iter().copied());
            member.target = kept;
        }
        let mut free = partitions.iter().copied().filter(|p| !taken.contains(p));
        for (member, quota) in self.members.values_mut().zip(&quotas) {
            while member.target.len() < *quota {
                match free.next() {
                    Some(p) => {
                        member.target.insert(p);
                    }
                    None => break,
                }
            }
        }
    }
}

/// Every group's membership, by (stream, group).
pub type Memberships = BTreeMap<(String, String), Membership>;

/// The partitions of `stream`/`topic` a group consumes: those not sealed.
fn consumable(meta: &Metadata, stream: &str, topic: &str) -> Vec<u32> {
    meta.topic(stream, topic)
        .map(|t| {
            t.partitions
                .iter()
                .filter(|p| !p.sealed)
                .map(|p| p.id)
                .collect()
        })
        .unwrap_or_default()
}

/// Which groups may hold members of each client session: kept beside the memberships
/// so that a session's end, which every producer's close commits, costs that
/// session's groups and not a walk of every member. It may still name a group the
/// session's members have left (harmless: nothing is found there), so it is not part
/// of the metadata's equality; a decoded snapshot builds it again.
#[derive(Debug, Clone, Default)]
pub struct SessionGroups(BTreeMap<u64, BTreeSet<(String, String)>>);

impl PartialEq for SessionGroups {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for SessionGroups {}

impl SessionGroups {
    /// The lookup for `memberships`, as a decoded snapshot has them.
    pub(super) fn of(memberships: &Memberships) -> Self {
        let mut index = Self::default();
        for (key, membership) in memberships {
            for member in membership.members.values() {
                index.note(member.session, key);
            }
        }
        index
    }

    fn note(&mut self, session: u64, key: &(String, String)) {
        if session != 0 {
            self.0.entry(session).or_default().insert(key.clone());
        }
    }
}

/// Removes every member `gone` picks among the groups `keys`, rebalancing them.
fn remove_members(
    meta: &mut Metadata,
    keys: Vec<(String, String)>,
    gone: impl Fn(&MemberMeta) -> bool,
) {
    for key in keys {
        let Some(membership) = meta.memberships.get(&key) else {
            continue;
        };
        if !membership.members.values().any(&gone) {
            continue;
        }
        let partitions = consumable(meta, &key.0, &membership.topic);
        if let Some(membership) = meta.memberships.get_mut(&key) {
            membership.members.retain(|_, m| !gone(m));
            membership.rebalance(&partitions);
        }
        forget_if_empty(meta, &key);
    }
}

/// Removes every member of `session` (it ended), rebalancing their groups.
pub(super) fn end_session(meta: &mut Metadata, session: u64) {
    let keys = meta.session_groups.0.remove(&session).unwrap_or_default();
    remove_members(meta, keys.into_iter().collect(), |m| m.session == session);
}

/// Removes every member `user` joined (the user was deleted: a user made again under
/// the name never inherits them), rebalancing their groups.
pub(super) fn forget_user(meta: &mut Metadata, user: &str) {
    let keys = meta.memberships.keys().cloned().collect();
    remove_members(meta, keys, |m| m.user == user);
}

/// A group whose last member left keeps no membership (its offsets stay with the
/// stream's groups): joins and leaves under ever new names leave nothing behind.
/// Its next member starts a new generation count; member ids, op numbers, are never
/// given again, so a member from before is still unknown.
fn forget_if_empty(meta: &mut Metadata, key: &(String, String)) {
    if meta
        .memberships
        .get(key)
        .is_some_and(|m| m.members.is_empty())
    {
        meta.memberships.remove(key);
    }
}

fn group_topic(meta: &Metadata, stream: &str, group: &str) -> String {
    meta.memberships
        .get(&(stream.to_owned(), group.to_owned()))
        .map(|m| m.topic.clone())
        .unwrap_or_default()
}

/// Forgets the memberships of groups on `stream` (deleted), or only those consuming
/// `topic` in it (deleted).
pub(super) fn forget(meta: &mut Metadata, stream: &str, topic: Option<&str>) {
    meta.memberships
        .retain(|(s, _), m| s != stream || topic.is_some_and(|t| t != m.topic));
}

/// Appends the membership section of the snapshot: `count: u32`, then for each group
/// `stream: string, group: string, topic: string, generation: u32, count: u32` and
/// per member `id: u64, name: string, session: u64, timeout_ms: u32, user: string,
/// target: count u32 then partition: u32 each`.
pub(super) fn encode(memberships: &Memberships, out: &mut Vec<u8>) {
    out.put_u32_be(memberships.len() as u32);
    for ((stream, group), membership) in memberships {
        out.put_string(stream);
        out.put_string(group);
        out.put_string(&membership.topic);
        out.put_u32_be(membership.generation);
        out.put_u32_be(membership.members.len() as u32);
        for (id, member) in &membership.members {
            out.put_u64_be(*id);
            out.put_string(&member.name);
            out.put_u64_be(member.session);
            out.put_u32_be(member.timeout_ms);
            out.put_string(&member.user);
            out.put_u32_be(member.target.len() as u32);
            for partition in &member.target {
                out.put_u32_be(*partition);
            }
        }
    }
}

/// Reads what [`encode`] wrote.
///
/// # Errors
/// A [`WireError`].
pub(super) fn decode(r: &mut WireReader<'_>) -> Result<Memberships, WireError> {
    let mut memberships = Memberships::new();
    for _ in 0..r.count("memberships", 14)? {
        let stream = r.string("stream")?.to_owned();
        let group = r.string("group")?.to_owned();
        let mut membership = Membership {
            topic: r.string("topic")?.to_owned(),
            generation: r.u32("generation")?,
            members: BTreeMap::new(),
        };
        for _ in 0..r.count("members", 26)? {
            let id = r.u64("member")?;
            let name = r.string("name")?.to_owned();
            let session = r.u64("session")?;
            let timeout_ms = r.u32("timeout_ms")?;
            let user = r.string("user")?.to_owned();
            let mut target = BTreeSet::new();
            for _ in 0..r.count("target", 4)? {
                target.insert(r.u32("partition")?);
            }
            membership.members.insert(
                id,
                MemberMeta {
                    name,
                    session,
                    timeout_ms,
                    user,
                    target,
                },
            );
        }
        memberships.insert((stream, group), membership);
    }
    Ok(memberships)
}

/// A member joins a group (made if new) of `topic`; its id is this op's number. The
/// group is rebalanced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JoinGroup {
    /// The stream.
    pub stream: String,
    /// The group.
    pub group: String,
    /// The topic it consumes.
    pub topic: String,
    /// The member's name.
    pub name: String,
    /// Its client session (0: none).
    pub session: u64,
    /// It leaves when no heartbeat comes for this long (ms).
    pub timeout_ms: u32,
    /// The user that joins it (empty: nobody logged in).
    pub user: String,
}

impl Change for JoinGroup {
    const CODE: u8 = 16;
    const NUMBERED: bool = true;
    fn check(&self, meta: &Metadata) -> Result<(), MetaError> {
        meta.topic(&self.stream, &self.topic)?;
        if self.session != 0 {
            match meta.sessions.get(&self.session) {
                Some(session) if session.ended_at.is_none() => {}
                _ => return Err(MetaError::SessionNotFound(self.session)),
            }
        }
        // Its id is the op's number: one join per op, in any group (the node's
        // metadata client never batches two).
        if meta
            .memberships
            .values()
            .any(|m| m.members.contains_key(&meta.applied_op))
        {
            return Err(MetaError::Invalid(format!(
                "op {} joined a member already",
                meta.applied_op
            )));
        }
        let key = (self.stream.clone(), self.group.clone());
        if let Some(existing) = meta.memberships.get(&key) {
            if existing.topic != self.topic && !existing.members.is_empty() {
                return Err(GroupError::TopicMismatch {
                    group: self.group.clone(),
                    topic: existing.topic.clone(),
                }
                .into());
            }
        }
        Ok(())
    }
    fn apply(&self, meta: &mut Metadata) {
        let partitions = consumable(meta, &self.stream, &self.topic);
        let id = meta.applied_op;
        let key = (self.stream.clone(), self.group.clone());
        meta.session_groups.note(self.session, &key);
        let membership = meta.memberships.entry(key).or_default();
        if membership.topic != self.topic {
            // An empty group may switch topics: what it held was of the other one.
            membership.topic.clone_from(&self.topic);
        }
        membership.members.insert(
            id,
            MemberMeta {
                name: self.name.clone(),
                session: self.session,
                timeout_ms: self.timeout_ms,
                user: self.user.clone(),
                target: BTreeSet::new(),
            },
        );
        membership.rebalance(&partitions);
    }
    fn encode(&self, out: &mut Vec<u8>) {
        out.put_string(&self.stream);
        out.put_string(&self.group);
        out.put_string(&self.topic);
        out.put_string(&self.name);
        out.put_u64_be(self.session);
        out.put_u32_be(self.timeout_ms);
        out.put_string(&self.user);
    }
    fn decode(r: &mut WireReader<'_>) -> Result<Self, WireError> {
        Ok(Self {
            stream: r.string("stream")?.to_owned(),
            group: r.string("group")?.to_owned(),
            topic: r.string("topic")?.to_owned(),
            name: r.string("name")?.to_owned(),
            session: r.u64("session")?,
            timeout_ms: r.u32("timeout_ms")?,
            user: r.string("user")?.to_owned(),
        })
    }
}

/// A member leaves its group (it asked, or the coordinator stopped hearing from it);
/// the group is rebalanced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaveGroup {
    /// The stream.
    pub stream: String,
    /// The group.
    pub group: String,
    /// The member.
    pub member: u64,
}

impl Change for LeaveGroup {
    const CODE: u8 = 17;
    fn check(&self, meta: &Metadata) -> Result<(), MetaError> {
        let key = (self.stream.clone(), self.group.clone());
        match meta.memberships.get(&key) {
            Some(m) if m.members.contains_key(&self.member) => Ok(()),
            _ => Err(GroupError::UnknownMember {
                group: self.group.clone(),
                member_id: self.member,
            }
            .into()),
        }
    }
    fn apply(&self, meta: &mut Metadata) {
        let topic = group_topic(meta, &self.stream, &self.group);
        let partitions = consumable(meta, &self.stream, &topic);
        let key = (self.stream.clone(), self.group.clone());
        if let Some(membership) = meta.memberships.get_mut(&key) {
            membership.members.remove(&self.member);
            membership.rebalance(&partitions);
        }
        forget_if_empty(meta, &key);
    }
    fn encode(&self, out: &mut Vec<u8>) {
        out.put_string(&self.stream);
        out.put_string(&self.group);
        out.put_u64_be(self.member);
    }
    fn decode(r: &mut WireReader<'_>) -> Result<Self, WireError> {
        Ok(Self {
            stream: r.string("stream")?.to_owned(),
            group: r.string("group")?.to_owned(),
            member: r.u64("member")?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metadata::op::{self, MetaOp};
    use crate::metadata::sessions::{EndSession, RegisterSession};

    fn meta_with_topic(partitions: u32) -> Metadata {
        let mut meta = Metadata::default();
        let ops = [
            MetaOp::CreateStream(op::CreateStream { name: "s".into() }),
            MetaOp::CreateTopic(op::CreateTopic {
                stream: "s".into(),
                name: "t".into(),
                settings: braid_proto::client::TopicSettings {
                    partitions,
                    ..Default::default()
                },
            }),
        ];
        for (at, op) in ops.iter().enumerate() {
            meta.begin_op(at as u64 + 1);
            meta.apply(op).unwrap();
        }
        meta
    }

    fn join(name: &str, session: u64) -> MetaOp {
        MetaOp::JoinGroup(JoinGroup {
            stream: "s".into(),
            group: "g".into(),
            topic: "t".into(),
            name: name.into(),
            session,
            timeout_ms: 10_000,
            user: String::new(),
        })
    }

    fn at(meta: &mut Metadata, op_number: u64, op: &MetaOp) -> Result<(), MetaError> {
        meta.begin_op(op_number);
        meta.apply(op)
    }

    fn targets(meta: &Metadata) -> Vec<Vec<u32>> {
        meta.memberships[&("s".to_owned(), "g".to_owned())]
            .members
            .values()
            .map(|m| m.target.iter().copied().collect())
            .collect()
    }

    /// Members are ids of the ops that joined them, assignment is balanced and
    /// sticky, each change raises the generation, and a member of a session leaves
    /// when it ends; all of it survives a snapshot.
    #[test]
    fn joins_leaves_and_session_ends_rebalance_and_survive_a_snapshot() {
        let mut meta = meta_with_topic(8);
        at(&mut meta, 10, &RegisterSession { timeout_ms: 5_000 }.into()).unwrap();
        at(&mut meta, 11, &join("a", 0)).unwrap();
        assert_eq!(targets(&meta), vec![(0..8).collect::<Vec<_>>()]);
        // A second join in the same op, in any group, would share its id: refused.
        let mut other_group = join("x", 0);
        if let MetaOp::JoinGroup(j) = &mut other_group {
            j.group = "h".into();
        }
        assert!(matches!(
            at(&mut meta, 11, &other_group),
            Err(MetaError::Invalid(_))
        ));
        at(&mut meta, 12, &join("b", 10)).unwrap();
        at(&mut meta, 13, &join("c", 0)).unwrap();
        let membership = &meta.memberships[&("s".to_owned(), "g".to_owned())];
        assert_eq!(membership.generation, 3);
        assert_eq!(
            membership.members.keys().copied().collect::<Vec<_>>(),
            [11, 12, 13]
        );
        let sizes: Vec<usize> = targets(&meta).iter().map(Vec::len).collect();
        assert_eq!(sizes, [3, 3, 2]);
        let before = targets(&meta);
        // A replica restored from a snapshot finds the session's members as well.
        let mut bytes = Vec::new();
        meta.encode(&mut bytes);
        let mut restored = Metadata::decode(&bytes).unwrap();
        at(&mut meta, 14, &EndSession { session: 10 }.into()).unwrap();
        at(&mut restored, 14, &EndSession { session: 10 }.into()).unwrap();
        assert_eq!(restored.memberships, meta.memberships);
        let membership = &meta.memberships[&("s".to_owned(), "g".to_owned())];
        assert_eq!(
            membership.members.keys().copied().collect::<Vec<_>>(),
            [11, 13],
            "the member of the ended session left"
        );
        assert_eq!(membership.generation, 4);
        for (old, new) in [&before[0], &before[2]].iter().zip(targets(&meta)) {
            assert!(
                old.iter().all(|p| new.contains(p)),
                "members keep what they had"
            );
        }
        let mut bytes = Vec::new();
        meta.encode(&mut bytes);
        assert_eq!(Metadata::decode(&bytes).unwrap(), meta);
        // Refused: a leave of a member not there, a join of an ended session, a join
        // to another topic while members are in.
        let leave = |member| {
            MetaOp::LeaveGroup(LeaveGroup {
                stream: "s".into(),
                group: "g".into(),
                member,
            })
        };
        assert!(matches!(
            at(&mut meta, 15, &leave(12)),
            Err(MetaError::Group(GroupError::UnknownMember { .. }))
        ));
        assert!(matches!(
            at(&mut meta, 15, &join("d", 10)),
            Err(MetaError::SessionNotFound(10))
        ));
        at(&mut meta, 15, &leave(11)).unwrap();
        at(&mut meta, 16, &leave(13)).unwrap();
        assert!(
            meta.memberships.is_empty(),
            "an empty group keeps no membership"
        );
        // Deleting the topic forgets its groups' members.
        at(&mut meta, 17, &join("e", 0)).unwrap();
        let delete = MetaOp::DeleteTopic(op::DeleteTopic {
            stream: "s".into(),
            name: "t".into(),
        });
        at(&mut meta, 18, &delete).unwrap();
        assert!(meta.memberships.is_empty());
    }
}
