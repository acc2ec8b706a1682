//! Consumer groups at the coordinator: what each member owns now, who went quiet,
//! and the grants, as a pure state machine with time as an input. Membership itself
//! (members, their target partitions, the generation) is metadata
//! (`crate::metadata::members`), replicated, so it outlives a coordinator.
//!
//! Assignment is cooperative, so no record is delivered twice when partitions move: a
//! member's target is balanced by count and sticky, but the coordinator *grants* a
//! member a partition only once no other member may own it. A member whose target
//! loses a partition sees it missing from its grant, commits its position, stops
//! fetching it and reports it released in its next heartbeat; only then does the new
//! owner get it. Commits are accepted only for partitions the member owns or was
//! granted. What members own is reported by each heartbeat and kept here only: a
//! coordinator that takes over treats every member it has not heard from yet as
//! owning whatever it may (it grants only what a member already holds until all have
//! reported), and gives each a full timeout to be heard.

use std::collections::{BTreeSet, HashMap};

use crate::metadata::members::{Membership, Memberships};
use crate::metadata::op::LeaveGroup;

/// Why a group call failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum GroupError {
    /// The member id is not in the group (expired, left, or the node restarted).
    #[error("member {member_id} is not in group {group:?}")]
    UnknownMember {
        /// The group.
        group: String,
        /// The member.
        member_id: u64,
    },
    /// The group consumes another topic.
    #[error("group {group:?} consumes topic {topic:?}")]
    TopicMismatch {
        /// The group.
        group: String,
        /// Its topic.
        topic: String,
    },
    /// The member commits with a generation other than the group's: it has not seen
    /// the latest rebalance (or sent 0), and may have been replaced.
    #[error("generation {sent} is not the group's generation {current}")]
    StaleGeneration {
        /// What the member sent.
        sent: u32,
        /// The group's.
        current: u32,
    },
    /// The group has as many members as the node allows (`group_members_max`).
    #[error("group {group:?} has {max} members, the most group_members_max allows")]
    GroupFull {
        /// The group.
        group: String,
        /// The limit.
        max: u32,
    },
    /// The coordinator keeps as many groups as the node allows (`groups_max`).
    #[error("the node has {max} consumer groups with members, the most groups_max allows")]
    TooManyGroups {
        /// The limit.
        max: u32,
    },
    /// The stream has as many groups with members as the node allows one stream
    /// (`groups_per_stream_max`).
    #[error("stream {stream:?} has {max} consumer groups with members, the most groups_per_stream_max allows")]
    TooManyGroupsInStream {
        /// The stream.
        stream: String,
        /// The limit.
        max: u32,
    },
    /// The member commits for a partition it neither owns nor was granted.
    #[error("member {member_id} does not own partition {partition}")]
    NotAssigned {
        /// The member.
        member_id: u64,
        /// The partition.
        partition: u32,
    },
}

/// A member's view after a join or heartbeat.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    /// The member id.
    pub member_id: u64,
    /// The group generation.
    pub generation: u32,
    /// Partitions it may consume now.
    pub partitions: Vec<u32>,
}

/// What the coordinator knows of a member.
#[derive(Debug, Clone)]
struct Seen {
    /// When it was last heard from (or first seen in this epoch).
    heard_ms: u64,
    /// What it reported it owns, with what it was granted since; `None` until it is
    /// heard from in this epoch (it may own anything).
    owned: Option<BTreeSet<u32>>,
}

/// How long a leave proposed for a quiet member is waited for before it is proposed
/// again (one lost in a view change).
const LEAVE_RETRY_MS: u64 = 5_000;

/// The coordinator's side of every group: what members own and when each was heard.
///
/// It lives at the coordinator (the metadata group's primary) and starts again at each
/// new one: each coordinator has an epoch, the metadata view it leads, and a newer
/// epoch drops what an older one heard.
#[derive(Debug)]
pub struct GroupCoordinator {
    epoch: u64,
    seen: HashMap<u64, Seen>,
    /// Members that went quiet whose leave was proposed, and when.
    leaving: HashMap<u64, u64>,
    limits: GroupLimits,
}

/// How much one node's consumer groups may hold: members and their names live in the
/// metadata and go out whole in `DescribeGroup` (found by review: 8,000 members with
/// 60 KB names took 1 GB and a 480 MB answer).
#[derive(Debug, Clone, Copy)]
pub struct GroupLimits {
    /// Members per group.
    pub members: u32,
    /// Groups with members.
    pub groups: u32,
    /// Groups with members in one stream.
    pub per_stream: u32,
}

impl Default for GroupLimits {
    fn default() -> Self {
        Self {
            members: 1_000,
            groups: 10_000,
            per_stream: 1_000,
        }
    }
}

impl Default for GroupCoordinator {
    fn default() -> Self {
        Self::new(GroupLimits::default())
    }
}

fn find<'a>(
    memberships: &'a Memberships,
    stream: &str,
    group: &str,
    member_id: u64,
) -> Result<&'a Membership, GroupError> {
    memberships
        .get(&(stream.to_owned(), group.to_owned()))
        .filter(|m| m.members.contains_key(&member_id))
        .ok_or_else(|| GroupError::UnknownMember {
            group: group.to_owned(),
            member_id,
        })
}

impl GroupCoordinator {
    /// A coordinator that has heard nothing yet, holding at most `limits`.
    pub fn new(limits: GroupLimits) -> Self {
        Self {
            epoch: 0,
            seen: HashMap::new(),
            leaving: HashMap::new(),
            limits,
        }
    }

    /// This node coordinates in `epoch` (the metadata view it leads). A newer epoch than
    /// the one it had means another coordinator may have served in between: what this
    /// one heard is stale. Each member is given its timeout from when this one first
    /// sees it.
    pub fn enter_epoch(&mut self, epoch: u64) {
        if epoch > self.epoch {
            self.seen.clear();
            self.leaving.clear();
            self.epoch = epoch;
        }
    }

    /// Whether a member may join `group` under the limits.
    ///
    /// # Errors
    /// [`GroupError::GroupFull`], [`GroupError::TooManyGroups`],
    /// [`GroupError::TooManyGroupsInStream`].
    pub fn check_join(
        &self,
        memberships: &Memberships,
        stream: &str,
        group: &str,
    ) -> Result<(), GroupError> {
        let live = |m: &&Membership| !m.members.is_empty();
        match memberships
            .get(&(stream.to_owned(), group.to_owned()))
            .filter(live)
        {
            Some(existing) if existing.members.len() >= self.limits.members as usize => {
                Err(GroupError::GroupFull {
                    group: group.to_owned(),
                    max: self.limits.members,
                })
            }
            Some(_) => Ok(()),
            None => {
                if memberships.values().filter(live).count() >= self.limits.groups as usize {
                    return Err(GroupError::TooManyGroups {
                        max: self.limits.groups,
                    });
                }
                let in_stream = memberships
                    .iter()
                    .filter(|((s, _), m)| s == stream && !m.members.is_empty())
                    .count();
                if in_stream >= self.limits.per_stream as usize {
                    return Err(GroupError::TooManyGroupsInStream {
                        stream: stream.to_owned(),
                        max: self.limits.per_stream,
                    });
                }
                Ok(())
            }
        }
    }

    /// What `member` owns, if it was heard from in this epoch.
    fn owned(&self, member: u64) -> Option<&BTreeSet<u32>> {
        self.seen.get(&member)?.owned.as_ref()
    }

    fn granted(&self, membership: &Membership, member_id: u64) -> Vec<u32> {
        let Some(member) = membership.members.get(&member_id) else {
            return Vec::new();
        };
        let holds = |p: u32| {
            self.owned(member_id)
                .is_some_and(|owned| owned.contains(&p))
        };
        member
            .target
            .iter()
            .copied()
            .filter(|p| {
                membership.members.keys().all(|other| {
                    *other == member_id
                        || match self.owned(*other) {
                            // Heard: it owns what it said.
                            Some(owned) => !owned.contains(p),
                            // Not yet heard: it may own anything, so only a partition
                            // this member holds already is granted.
                            None => holds(*p),
                        }
                })
            })
            .collect()
    }

    /// The member's grant. What it is granted counts as owned by it from now on, until
    /// a heartbeat of its own reports otherwise: a member that joined a moment ago and
    /// has not yet heartbeated still holds what it was handed, and nobody else may be
    /// granted it meanwhile.
    fn grant(&mut self, membership: &Membership, member_id: u64, now_ms: u64) -> Grant {
        let partitions = self.granted(membership, member_id);
        let seen = self.seen.entry(member_id).or_insert(Seen {
            heard_ms: now_ms,
            owned: None,
        });
        if let Some(owned) = seen.owned.as_mut() {
            owned.extend(partitions.iter().copied());
        }
        Grant {
            member_id,
            generation: membership.generation,
            partitions,
        }
    }

    /// A member's join committed: it owns nothing yet; returns its grant.
    ///
    /// # Errors
    /// [`GroupError::UnknownMember`] if it left already.
    pub fn joined(
        &mut self,
        memberships: &Memberships,
        stream: &str,
        group: &str,
        member_id: u64,
        now_ms: u64,
    ) -> Result<Grant, GroupError> {
        let membership = find(memberships, stream, group, member_id)?;
        self.seen.insert(
            member_id,
            Seen {
                heard_ms: now_ms,
                owned: Some(BTreeSet::new()),
            },
        );
        Ok(self.grant(membership, member_id, now_ms))
    }

    /// Records that a member is alive and what it still owns; returns its grant.
    ///
    /// # Errors
    /// [`GroupError::UnknownMember`].
    pub fn heartbeat(
        &mut self,
        memberships: &Memberships,
        stream: &str,
        group: &str,
        member_id: u64,
        owned: &[u32],
        now_ms: u64,
    ) -> Result<Grant, GroupError> {
        let membership = find(memberships, stream, group, member_id)?;
        self.seen.insert(
            member_id,
            Seen {
                heard_ms: now_ms,
                owned: Some(owned.iter().copied().collect()),
            },
        );
        Ok(self.grant(membership, member_id, now_ms))
    }

    /// Checks that a member may commit for `partition`.
    ///
    /// # Errors
    /// [`GroupError::UnknownMember`], [`GroupError::StaleGeneration`],
    /// [`GroupError::NotAssigned`].
    pub fn check_commit(
        &self,
        memberships: &Memberships,
        stream: &str,
        group: &str,
        member_id: u64,
        generation: u32,
        partition: u32,
    ) -> Result<(), GroupError> {
        let membership = find(memberships, stream, group, member_id)?;
        // Kafka's fencing: only a member that saw the latest rebalance commits, so one
        // that was replaced cannot overwrite its successor's position.
        if generation != membership.generation {
            return Err(GroupError::StaleGeneration {
                sent: generation,
                current: membership.generation,
            });
        }
        let allowed = match self.owned(member_id) {
            // Heard: what it owns or was granted.
            Some(owned) => {
                owned.contains(&partition)
                    || self.granted(membership, member_id).contains(&partition)
            }
            // Not heard yet by this coordinator: only its own target, and only if no
            // member heard since reports owning it (a member holding nothing must not
            // move another's position: found by review after a failover).
            None => {
                membership
                    .members
                    .get(&member_id)
                    .is_some_and(|m| m.target.contains(&partition))
                    && membership.members.keys().all(|other| {
                        *other == member_id
                            || self.owned(*other).is_none_or(|o| !o.contains(&partition))
                    })
            }
        };
        if allowed {
            Ok(())
        } else {
            Err(GroupError::NotAssigned {
                member_id,
                partition,
            })
        }
    }

    /// The leaves to propose for members not heard from for their timeout (each once
    /// until it is retried); forgets members that are gone.
    pub fn quiet(&mut self, memberships: &Memberships, now_ms: u64) -> Vec<LeaveGroup> {
        let mut leaves = Vec::new();
        let mut present = std::collections::HashSet::new();
        for ((stream, group), membership) in memberships {
            for (id, member) in &membership.members {
                present.insert(*id);
                // First seen now (joined a moment ago, or this coordinator just took
                // over): its timeout runs from now.
                let heard = self
                    .seen
                    .entry(*id)
                    .or_insert(Seen {
                        heard_ms: now_ms,
                        owned: None,
                    })
                    .heard_ms;
                if heard.saturating_add(member.timeout_ms.into()) >= now_ms {
                    continue;
                }
                if self
                    .leaving
                    .get(id)
                    .is_some_and(|at| at.saturating_add(LEAVE_RETRY_MS) > now_ms)
                {
                    continue;
                }
                self.leaving.insert(*id, now_ms);
                leaves.push(LeaveGroup {
                    stream: stream.clone(),
                    group: group.clone(),
                    member: *id,
                });
            }
        }
        self.seen.retain(|id, _| present.contains(id));
        self.leaving.retain(|id, _| present.contains(id));
        leaves
    }

    /// What `member_id` may consume now (for `DescribeGroup`).
    pub fn granted_to(&self, membership: &Membership, member_id: u64) -> Vec<u32> {
        self.granted(membership, member_id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metadata::op::{self, MetaOp};
    use crate::metadata::Metadata;

    const PARTITIONS: [u32; 8] = [0, 1, 2, 3, 4, 5, 6, 7];

    /// The replicated metadata with a topic of 8 partitions, and a coordinator.
    struct World {
        meta: Metadata,
        op: u64,
        coordinator: GroupCoordinator,
    }

    impl World {
        fn new() -> Self {
            let mut world = Self {
                meta: Metadata::default(),
                op: 0,
                coordinator: GroupCoordinator::default(),
            };
            world.apply(MetaOp::CreateStream(op::CreateStream { name: "s".into() }));
            world.apply(MetaOp::CreateTopic(op::CreateTopic {
                stream: "s".into(),
                name: "t".into(),
                settings: braid_proto::client::TopicSettings {
                    partitions: 8,
                    ..Default::default()
                },
            }));
            world
        }

        fn apply(&mut self, op: MetaOp) -> u64 {
            self.op += 1;
            self.meta.begin_op(self.op);
            self.meta.apply(&op).unwrap();
            self.op
        }

        fn join(&mut self, name: &str, timeout_ms: u32, now: u64) -> Grant {
            let id = self.apply(MetaOp::JoinGroup(op::JoinGroup {
                stream: "s".into(),
                group: "g".into(),
                topic: "t".into(),
                name: name.into(),
                session: 0,
                timeout_ms,
                user: String::new(),
            }));
            self.coordinator
                .joined(&self.meta.memberships, "s", "g", id, now)
                .unwrap()
        }

        fn leave(&mut self, member: u64) {
            self.apply(MetaOp::LeaveGroup(op::LeaveGroup {
                stream: "s".into(),
                group: "g".into(),
                member,
            }));
        }

        fn heartbeat(&mut self, member: u64, owned: &[u32], now: u64) -> Result<Grant, GroupError> {
            self.coordinator
                .heartbeat(&self.meta.memberships, "s", "g", member, owned, now)
        }

        fn commit(&self, member: u64, generation: u32, partition: u32) -> Result<(), GroupError> {
            self.coordinator.check_commit(
                &self.meta.memberships,
                "s",
                "g",
                member,
                generation,
                partition,
            )
        }

        fn membership(&self) -> &Membership {
            &self.meta.memberships[&("s".to_owned(), "g".to_owned())]
        }
    }

    /// Membership is metadata: a new coordinator serves the same members with the
    /// same generation (nobody rejoins), and until a member is heard from it grants
    /// nobody else what that member may own, while the member keeps what it holds.
    #[test]
    fn a_new_coordinator_keeps_the_members_and_moves_nothing_until_it_heard_them() {
        let mut world = World::new();
        world.coordinator.enter_epoch(4);
        let a = world.join("a", 10_000, 0);
        assert_eq!(a.partitions, PARTITIONS);
        world.heartbeat(a.member_id, &PARTITIONS, 10).unwrap();
        let b = world.join("b", 10_000, 20);
        assert!(b.partitions.is_empty(), "a still owns everything");
        let generation = world.membership().generation;
        // The coordinator fails over before a released anything.
        world.coordinator.enter_epoch(5);
        let b2 = world.heartbeat(b.member_id, &[], 1_010).unwrap();
        assert_eq!(b2.generation, generation, "the same generation");
        assert!(
            b2.partitions.is_empty(),
            "a may still own b's target: not heard yet"
        );
        // Not heard yet, a may commit its own target; b, not heard either, may not
        // commit a's (found by review: a member holding nothing moved another's
        // position after a failover).
        let a_target: Vec<u32> = world.membership().members[&a.member_id]
            .target
            .iter()
            .copied()
            .collect();
        world.commit(a.member_id, generation, a_target[0]).unwrap();
        assert!(matches!(
            world.commit(b.member_id, generation, a_target[0]),
            Err(GroupError::NotAssigned { .. })
        ));
        let a2 = world.heartbeat(a.member_id, &PARTITIONS, 1_020).unwrap();
        assert_eq!(a2.partitions.len(), 4, "a keeps its share");
        world.heartbeat(a.member_id, &a2.partitions, 1_030).unwrap();
        let b3 = world.heartbeat(b.member_id, &[], 1_040).unwrap();
        assert_eq!(b3.partitions.len(), 4);
        assert!(b3.partitions.iter().all(|p| !a2.partitions.contains(p)));
        // A zombie from a member that left is an unknown member, never a new one.
        world.leave(a.member_id);
        assert!(matches!(
            world.commit(a.member_id, world.membership().generation, 0),
            Err(GroupError::UnknownMember { .. })
        ));
    }

    /// After a failover, a member the new coordinator has not heard from keeps what
    /// it holds: its own partitions are granted to it again at once.
    #[test]
    fn a_member_keeps_what_it_holds_across_a_failover() {
        let mut world = World::new();
        let a = world.join("a", 10_000, 0);
        world.heartbeat(a.member_id, &PARTITIONS, 5).unwrap();
        let b = world.join("b", 10_000, 10);
        world.heartbeat(a.member_id, &PARTITIONS, 20).unwrap();
        let a_share = world.heartbeat(a.member_id, &[0, 1, 2, 3], 30).unwrap();
        let b_share = world.heartbeat(b.member_id, &[], 40).unwrap();
        assert_eq!(a_share.partitions, [0, 1, 2, 3]);
        assert_eq!(b_share.partitions, [4, 5, 6, 7]);
        world.coordinator.enter_epoch(9);
        let again = world
            .heartbeat(b.member_id, &b_share.partitions, 110)
            .unwrap();
        assert_eq!(
            again.partitions, b_share.partitions,
            "b keeps what it holds"
        );
    }

    #[test]
    fn a_grant_is_owned_before_the_first_heartbeat() {
        // Two members join back to back: the second gets nothing the first was handed,
        // although the first has not heartbeated yet (found by `braid bench fanout`,
        // where both members then read the same partitions from the start).
        let mut world = World::new();
        let a = world.join("a", 1_000, 0);
        assert_eq!(a.partitions, PARTITIONS);
        let b = world.join("b", 1_000, 1);
        assert!(b.partitions.is_empty(), "a holds everything it was granted");
        let a2 = world.heartbeat(a.member_id, &PARTITIONS, 2).unwrap();
        assert_eq!(a2.partitions.len(), 4);
        assert!(world
            .heartbeat(b.member_id, &[], 3)
            .unwrap()
            .partitions
            .is_empty());
        world.heartbeat(a.member_id, &a2.partitions, 4).unwrap();
        let b2 = world.heartbeat(b.member_id, &[], 5).unwrap();
        assert_eq!(b2.partitions.len(), 4);
        assert!(b2.partitions.iter().all(|p| !a2.partitions.contains(p)));
    }

    #[test]
    fn partitions_move_only_after_release() {
        let mut world = World::new();
        let a = world.join("a", 1_000, 0);
        assert_eq!(a.partitions, PARTITIONS);
        world.heartbeat(a.member_id, &PARTITIONS, 10).unwrap();
        let b = world.join("b", 1_000, 20);
        assert!(b.partitions.is_empty(), "a still owns everything");
        let a2 = world.heartbeat(a.member_id, &PARTITIONS, 30).unwrap();
        assert_eq!(a2.partitions.len(), 4, "a's grant shrinks to its share");
        // a may still commit what it is releasing.
        let released: Vec<u32> = PARTITIONS
            .iter()
            .copied()
            .filter(|p| !a2.partitions.contains(p))
            .collect();
        world
            .commit(a.member_id, a2.generation, released[0])
            .unwrap();
        // An older generation, or 0, is fenced.
        for stale in [a.generation, 0] {
            assert!(matches!(
                world.commit(a.member_id, stale, released[0]),
                Err(GroupError::StaleGeneration { .. })
            ));
        }
        assert!(world
            .heartbeat(b.member_id, &[], 40)
            .unwrap()
            .partitions
            .is_empty());
        world.heartbeat(a.member_id, &a2.partitions, 50).unwrap();
        let b2 = world.heartbeat(b.member_id, &[], 60).unwrap();
        assert_eq!(b2.partitions, released);
        assert!(matches!(
            world.commit(a.member_id, b2.generation, released[0]),
            Err(GroupError::NotAssigned { .. })
        ));
    }

    #[test]
    fn quiet_members_are_proposed_to_leave_once_until_retried() {
        let mut world = World::new();
        let a = world.join("a", 100, 0);
        let b = world.join("b", 10_000, 0);
        world.heartbeat(a.member_id, &[0, 1, 2, 3], 50).unwrap();
        assert!(world
            .coordinator
            .quiet(&world.meta.memberships, 150)
            .is_empty());
        let leaves = world.coordinator.quiet(&world.meta.memberships, 151);
        assert_eq!(leaves.len(), 1);
        assert_eq!(leaves[0].member, a.member_id);
        assert!(
            world
                .coordinator
                .quiet(&world.meta.memberships, 152)
                .is_empty(),
            "proposed once"
        );
        assert_eq!(
            world
                .coordinator
                .quiet(&world.meta.memberships, 151 + LEAVE_RETRY_MS)
                .len(),
            1,
            "proposed again when the first was lost"
        );
        world.leave(a.member_id);
        let b2 = world.heartbeat(b.member_id, &[], 200).unwrap();
        assert_eq!(
            b2.partitions, PARTITIONS,
            "a's partitions are free once it left"
        );
        assert!(matches!(
            world.heartbeat(a.member_id, &[], 200),
            Err(GroupError::UnknownMember { .. })
        ));
        // A new coordinator gives every member a full timeout from when it first sees
        // it (it took over, or the member joined a moment ago).
        world.coordinator.enter_epoch(3);
        let quiet = |world: &mut World, now| world.coordinator.quiet(&world.meta.memberships, now);
        assert!(quiet(&mut world, 100_000).is_empty());
        assert!(quiet(&mut world, 109_000).is_empty());
        assert_eq!(quiet(&mut world, 110_001).len(), 1);
        let c = world.join("c", 1_000, 200_000);
        assert!(quiet(&mut world, 200_500)
            .iter()
            .all(|leave| leave.member != c.member_id));
    }

    #[test]
    fn limits_refuse_joins_past_them() {
        let mut world = World::new();
        world.coordinator = GroupCoordinator::new(GroupLimits {
            members: 2,
            groups: 1,
            per_stream: 1,
        });
        world.join("a", 1_000, 0);
        world.join("b", 1_000, 0);
        let memberships = &world.meta.memberships;
        assert!(matches!(
            world.coordinator.check_join(memberships, "s", "g"),
            Err(GroupError::GroupFull { .. })
        ));
        assert!(matches!(
            world.coordinator.check_join(memberships, "s", "other"),
            Err(GroupError::TooManyGroups { .. })
        ));
    }
}
