//! Consumer groups: membership and partition assignment, as a pure state machine with
//! time as an input.
//!
//! Assignment is cooperative, so no record is delivered twice when partitions move: the
//! coordinator keeps a target assignment (balanced by count, sticky), but *grants* a
//! member a partition only once no other member reports owning it. A member whose target
//! loses a partition sees it missing from its grant, commits its position, stops
//! fetching it and reports it released in its next heartbeat; only then does the new
//! owner get it. Commits are accepted only for partitions the member owns or was
//! granted. Membership is not durable: after a node restart members get
//! `UnknownMember` and join again; committed offsets are durable (metadata).

use std::collections::{BTreeMap, BTreeSet, HashMap};

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

#[derive(Debug, Clone)]
struct Member {
    name: String,
    session_timeout_ms: u64,
    last_seen_ms: u64,
    target: BTreeSet<u32>,
    owned: BTreeSet<u32>,
}

#[derive(Debug, Clone)]
struct Group {
    topic: String,
    partitions: Vec<u32>,
    generation: u32,
    members: BTreeMap<u64, Member>,
}

/// A member as [`GroupCoordinator::describe`] shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberView {
    /// Member id.
    pub id: u64,
    /// Its name.
    pub name: String,
    /// What it may consume now.
    pub granted: Vec<u32>,
}

/// A group as [`GroupCoordinator::describe`] shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupView {
    /// Its topic.
    pub topic: String,
    /// Its generation.
    pub generation: u32,
    /// Its members.
    pub members: Vec<MemberView>,
}

/// Every live group of a node, keyed by (stream, group).
///
/// Its state lives in memory at the coordinator (the metadata group's primary) and
/// starts again at each new one, so each coordinator has an epoch, the metadata view it
/// leads: member ids are `epoch << 32 | n`, and a group's generations start at
/// `epoch << 16`, so no id or generation is ever given again by a later coordinator. A
/// consumer from before a failover is an unknown member at the new one, never taken for
/// a new member that happens to get its old id.
#[derive(Debug)]
pub struct GroupCoordinator {
    groups: HashMap<(String, String), Group>,
    next_member_id: u64,
    epoch: u64,
    limits: GroupLimits,
}

/// How much one node's consumer groups may hold: members and their names live in the
/// coordinator's memory and go out whole in `DescribeGroup` (found by review: 8,000
/// members with 60 KB names took 1 GB and a 480 MB answer).
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

impl Group {
    fn rebalance(&mut self) {
        self.generation = self.generation.wrapping_add(1);
        let count = self.members.len();
        if count == 0 {
            return;
        }
        let base = self.partitions.len() / count;
        let extra = self.partitions.len() % count;
        let valid: BTreeSet<u32> = self.partitions.iter().copied().collect();
        let mut taken = BTreeSet::new();
        let quotas: Vec<usize> = (0..count).map(|i| base + usize::from(i < extra)).collect();
        // Keep what each member had, up to its quota, so little moves.
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
        let mut free = self
            .partitions
            .iter()
            .copied()
            .filter(|p| !taken.contains(p));
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

    fn granted(&self, member_id: u64) -> Vec<u32> {
        let Some(member) = self.members.get(&member_id) else {
            return Vec::new();
        };
        member
            .target
            .iter()
            .copied()
            .filter(|p| {
                self.members
                    .iter()
                    .all(|(id, other)| *id == member_id || !other.owned.contains(p))
            })
            .collect()
    }

    /// The member's grant. What it is granted counts as owned by it from now on, until
    /// a heartbeat of its own reports otherwise: a member that joined a moment ago and
    /// has not yet heartbeated still holds what it was handed, and nobody else may be
    /// granted it meanwhile.
    fn grant(&mut self, member_id: u64) -> Grant {
        let partitions = self.granted(member_id);
        if let Some(member) = self.members.get_mut(&member_id) {
            member.owned.extend(partitions.iter().copied());
        }
        Grant {
            member_id,
            generation: self.generation,
            partitions,
        }
    }
}

impl GroupCoordinator {
    /// A coordinator with no group yet, holding at most `limits`.
    pub fn new(limits: GroupLimits) -> Self {
        Self {
            groups: HashMap::new(),
            next_member_id: 0,
            epoch: 0,
            limits,
        }
    }

    /// This node coordinates in `epoch` (the metadata view it leads). A newer epoch than
    /// the one it had means another coordinator served in between: what this one held
    /// is stale, so it starts empty, with ids and generations of the new epoch.
    pub fn enter_epoch(&mut self, epoch: u64) {
        if epoch > self.epoch {
            self.groups.clear();
            self.next_member_id = 0;
            self.epoch = epoch;
        }
    }

    /// Adds a member to a group (creating the group), rebalances, and returns the
    /// member's grant (often empty until others release partitions).
    ///
    /// # Errors
    /// [`GroupError::TopicMismatch`] if the group consumes another topic.
    #[allow(clippy::too_many_arguments)] // each is a field of the join request
    pub fn join(
        &mut self,
        stream: &str,
        group: &str,
        topic: &str,
        partitions: &[u32],
        name: &str,
        session_timeout_ms: u64,
        now_ms: u64,
    ) -> Result<Grant, GroupError> {
        let key = (stream.to_owned(), group.to_owned());
        match self.groups.get(&key) {
            Some(existing) if existing.members.len() >= self.limits.members as usize => {
                return Err(GroupError::GroupFull {
                    group: group.to_owned(),
                    max: self.limits.members,
                });
            }
            None => {
                if self.groups.len() >= self.limits.groups as usize {
                    // Groups whose members all left are kept to be described; a new
                    // one may take their place.
                    self.groups.retain(|_, g| !g.members.is_empty());
                    if self.groups.len() >= self.limits.groups as usize {
                        return Err(GroupError::TooManyGroups {
                            max: self.limits.groups,
                        });
                    }
                }
                let in_stream = self
                    .groups
                    .iter()
                    .filter(|((s, _), g)| s == stream && !g.members.is_empty())
                    .count();
                if in_stream >= self.limits.per_stream as usize {
                    return Err(GroupError::TooManyGroupsInStream {
                        stream: stream.to_owned(),
                        max: self.limits.per_stream,
                    });
                }
            }
            Some(_) => {}
        }
        // The low 16 bits of the epoch, shifted: a group's generations are this
        // coordinator's alone unless 65,536 rebalances or views pass.
        let generation = ((self.epoch & 0xFFFF) as u32) << 16;
        let entry = self.groups.entry(key).or_insert_with(|| Group {
            topic: topic.to_owned(),
            partitions: partitions.to_vec(),
            generation,
            members: BTreeMap::new(),
        });
        if entry.topic != topic {
            if !entry.members.is_empty() {
                return Err(GroupError::TopicMismatch {
                    group: group.to_owned(),
                    topic: entry.topic.clone(),
                });
            }
            entry.topic = topic.to_owned();
        }
        entry.partitions = partitions.to_vec();
        self.next_member_id += 1;
        let member_id = self.epoch << 32 | (self.next_member_id & 0xFFFF_FFFF);
        entry.members.insert(
            member_id,
            Member {
                name: name.to_owned(),
                session_timeout_ms,
                last_seen_ms: now_ms,
                target: BTreeSet::new(),
                owned: BTreeSet::new(),
            },
        );
        entry.rebalance();
        Ok(entry.grant(member_id))
    }

    fn member_mut(
        &mut self,
        stream: &str,
        group: &str,
        member_id: u64,
    ) -> Result<(&mut Group, u64), GroupError> {
        let unknown = || GroupError::UnknownMember {
            group: group.to_owned(),
            member_id,
        };
        let entry = self
            .groups
            .get_mut(&(stream.to_owned(), group.to_owned()))
            .ok_or_else(unknown)?;
        if !entry.members.contains_key(&member_id) {
            return Err(unknown());
        }
        Ok((entry, member_id))
    }

    /// Records that a member is alive and what it still owns; returns its grant.
    ///
    /// # Errors
    /// [`GroupError::UnknownMember`].
    pub fn heartbeat(
        &mut self,
        stream: &str,
        group: &str,
        member_id: u64,
        owned: &[u32],
        now_ms: u64,
    ) -> Result<Grant, GroupError> {
        let (entry, id) = self.member_mut(stream, group, member_id)?;
        if let Some(member) = entry.members.get_mut(&id) {
            member.last_seen_ms = now_ms;
            member.owned = owned.iter().copied().collect();
        }
        Ok(entry.grant(id))
    }

    /// Removes a member and rebalances.
    ///
    /// # Errors
    /// [`GroupError::UnknownMember`].
    pub fn leave(&mut self, stream: &str, group: &str, member_id: u64) -> Result<(), GroupError> {
        let (entry, id) = self.member_mut(stream, group, member_id)?;
        entry.members.remove(&id);
        entry.rebalance();
        Ok(())
    }

    /// Checks that a member may commit for `partition`.
    ///
    /// # Errors
    /// [`GroupError::UnknownMember`], [`GroupError::NotAssigned`].
    pub fn check_commit(
        &mut self,
        stream: &str,
        group: &str,
        member_id: u64,
        generation: u32,
        partition: u32,
    ) -> Result<(), GroupError> {
        let (entry, id) = self.member_mut(stream, group, member_id)?;
        // Kafka's fencing: only a member that saw the latest rebalance commits, so one
        // that was replaced cannot overwrite its successor's position.
        if generation != entry.generation {
            return Err(GroupError::StaleGeneration {
                sent: generation,
                current: entry.generation,
            });
        }
        let owns = entry
            .members
            .get(&id)
            .is_some_and(|m| m.owned.contains(&partition));
        if owns || entry.granted(id).contains(&partition) {
            Ok(())
        } else {
            Err(GroupError::NotAssigned {
                member_id,
                partition,
            })
        }
    }

    /// Removes members whose session timed out; returns (stream, group, member) of each.
    pub fn expire(&mut self, now_ms: u64) -> Vec<(String, String, u64)> {
        let mut removed = Vec::new();
        for ((stream, group), entry) in &mut self.groups {
            let dead: Vec<u64> = entry
                .members
                .iter()
                .filter(|(_, m)| m.last_seen_ms.saturating_add(m.session_timeout_ms) < now_ms)
                .map(|(id, _)| *id)
                .collect();
            if dead.is_empty() {
                continue;
            }
            for id in dead {
                entry.members.remove(&id);
                removed.push((stream.clone(), group.clone(), id));
            }
            entry.rebalance();
        }
        removed
    }

    /// Keeps only the groups whose (stream, topic) `exists` says still exist: the
    /// rest were deleted with their topic, on whichever node the deletion came in.
    pub fn retain_topics(&mut self, exists: impl Fn(&str, &str) -> bool) {
        self.groups
            .retain(|(stream, _), g| exists(stream, &g.topic));
    }

    /// A group's live state, if it has any.
    pub fn describe(&self, stream: &str, group: &str) -> Option<GroupView> {
        let entry = self.groups.get(&(stream.to_owned(), group.to_owned()))?;
        Some(GroupView {
            topic: entry.topic.clone(),
            generation: entry.generation,
            members: entry
                .members
                .iter()
                .map(|(id, m)| MemberView {
                    id: *id,
                    name: m.name.clone(),
                    granted: entry.granted(*id),
                })
                .collect(),
        })
    }

    /// The live groups of a stream: (name, topic, members, generation).
    pub fn list(&self, stream: &str) -> Vec<(String, String, u32, u32)> {
        let mut list: Vec<_> = self
            .groups
            .iter()
            .filter(|((s, _), _)| s == stream)
            .map(|((_, name), g)| {
                (
                    name.clone(),
                    g.topic.clone(),
                    g.members.len() as u32,
                    g.generation,
                )
            })
            .collect();
        list.sort();
        list
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PARTITIONS: [u32; 8] = [0, 1, 2, 3, 4, 5, 6, 7];

    /// Issue 24, finding 6: after a coordinator failover, ids and generations started
    /// again at 1, so a consumer from before it passed for the new member 1 and its
    /// commit moved the group's offsets back. Each coordinator now has its epoch.
    #[test]
    fn a_consumer_from_before_a_failover_is_never_taken_for_a_new_one() {
        let mut old = GroupCoordinator::default();
        old.enter_epoch(4);
        let zombie = old.join("s", "g", "t", &PARTITIONS, "a", 1_000, 0).unwrap();
        let mut new = GroupCoordinator::default();
        new.enter_epoch(5);
        let fresh = new.join("s", "g", "t", &PARTITIONS, "b", 1_000, 0).unwrap();
        assert_ne!(zombie.member_id, fresh.member_id);
        assert_ne!(zombie.generation, fresh.generation);
        let refused = new.check_commit("s", "g", zombie.member_id, zombie.generation, 0);
        assert!(
            matches!(refused, Err(GroupError::UnknownMember { .. })),
            "{refused:?}"
        );
        new.check_commit("s", "g", fresh.member_id, fresh.generation, 0)
            .unwrap();
        // The old coordinator leading again later starts afresh, in its new epoch.
        old.enter_epoch(7);
        assert!(old.describe("s", "g").is_none(), "stale groups dropped");
        let again = old.join("s", "g", "t", &PARTITIONS, "c", 1_000, 0).unwrap();
        assert!(again.member_id > fresh.member_id && again.generation > fresh.generation);
        old.enter_epoch(6);
        assert!(
            old.describe("s", "g").is_some(),
            "an older epoch changes nothing"
        );
    }

    #[test]
    fn a_grant_is_owned_before_the_first_heartbeat() {
        // Two members join back to back: the second gets nothing the first was handed,
        // although the first has not heartbeated yet (found by `braid bench fanout`,
        // where both members then read the same partitions from the start).
        let mut c = GroupCoordinator::default();
        let a = c.join("s", "g", "t", &PARTITIONS, "a", 1_000, 0).unwrap();
        assert_eq!(a.partitions, PARTITIONS);
        let b = c.join("s", "g", "t", &PARTITIONS, "b", 1_000, 1).unwrap();
        assert!(b.partitions.is_empty(), "a holds everything it was granted");
        let a2 = c.heartbeat("s", "g", a.member_id, &PARTITIONS, 2).unwrap();
        assert_eq!(a2.partitions.len(), 4);
        assert!(c
            .heartbeat("s", "g", b.member_id, &[], 3)
            .unwrap()
            .partitions
            .is_empty());
        c.heartbeat("s", "g", a.member_id, &a2.partitions, 4)
            .unwrap();
        let b2 = c.heartbeat("s", "g", b.member_id, &[], 5).unwrap();
        assert_eq!(b2.partitions.len(), 4);
        assert!(b2.partitions.iter().all(|p| !a2.partitions.contains(p)));
    }

    #[test]
    fn partitions_move_only_after_release() {
        let mut c = GroupCoordinator::default();
        let a = c.join("s", "g", "t", &PARTITIONS, "a", 1_000, 0).unwrap();
        assert_eq!(a.partitions, PARTITIONS);
        c.heartbeat("s", "g", a.member_id, &PARTITIONS, 10).unwrap();
        let b = c.join("s", "g", "t", &PARTITIONS, "b", 1_000, 20).unwrap();
        assert!(b.partitions.is_empty(), "a still owns everything");
        let a2 = c.heartbeat("s", "g", a.member_id, &PARTITIONS, 30).unwrap();
        assert_eq!(a2.partitions.len(), 4, "a's grant shrinks to its share");
        // a may still commit what it is releasing.
        let released: Vec<u32> = PARTITIONS
            .iter()
            .copied()
            .filter(|p| !a2.partitions.contains(p))
            .collect();
        c.check_commit("s", "g", a.member_id, a2.generation, released[0])
            .unwrap();
        // An older generation, or 0, is fenced.
        for stale in [a.generation, 0] {
            assert!(matches!(
                c.check_commit("s", "g", a.member_id, stale, released[0]),
                Err(GroupError::StaleGeneration { .. })
            ));
        }
        assert!(c
            .heartbeat("s", "g", b.member_id, &[], 40)
            .unwrap()
            .partitions
            .is_empty());
        c.heartbeat("s", "g", a.member_id, &a2.partitions, 50)
            .unwrap();
        let b2 = c.heartbeat("s", "g", b.member_id, &[], 60).unwrap();
        assert_eq!(b2.partitions, released);
        assert!(matches!(
            c.check_commit("s", "g", a.member_id, b2.generation, released[0]),
            Err(GroupError::NotAssigned { .. })
        ));
    }

    #[test]
    fn expiry_and_leave_rebalance() {
        let mut c = GroupCoordinator::default();
        let a = c.join("s", "g", "t", &PARTITIONS, "a", 100, 0).unwrap();
        let b = c.join("s", "g", "t", &PARTITIONS, "b", 10_000, 0).unwrap();
        c.heartbeat("s", "g", a.member_id, &[0, 1, 2, 3], 50)
            .unwrap();
        assert!(c.expire(100).is_empty());
        assert_eq!(c.expire(151), vec![("s".into(), "g".into(), a.member_id)]);
        let b2 = c.heartbeat("s", "g", b.member_id, &[], 200).unwrap();
        assert_eq!(
            b2.partitions, PARTITIONS,
            "a's partitions are free once it expired"
        );
        assert!(matches!(
            c.heartbeat("s", "g", a.member_id, &[], 200),
            Err(GroupError::UnknownMember { .. })
        ));
        c.leave("s", "g", b.member_id).unwrap();
        assert_eq!(c.describe("s", "g").unwrap().members.len(), 0);
        assert!(
            c.join("s", "g", "other", &PARTITIONS, "x", 1, 0).is_ok(),
            "an empty group may switch topics"
        );
    }

    #[test]
    fn assignment_is_balanced_and_sticky() {
        let mut c = GroupCoordinator::default();
        let ids: Vec<u64> = (0..3)
            .map(|i| {
                c.join("s", "g", "t", &PARTITIONS, &format!("m{i}"), 1_000, 0)
                    .unwrap()
                    .member_id
            })
            .collect();
        // Members heartbeat what they hold after each grant, releasing what left their
        // grant, until partitions settle.
        let mut held: Vec<Vec<u32>> = vec![PARTITIONS.to_vec(), Vec::new(), Vec::new()];
        for round in 0..3 {
            for (i, id) in ids.iter().enumerate() {
                let grant = c.heartbeat("s", "g", *id, &held[i], 10 + round).unwrap();
                held[i] = grant.partitions;
            }
        }
        let view = c.describe("s", "g").unwrap();
        let sizes: Vec<usize> = view.members.iter().map(|m| m.granted.len()).collect();
        assert_eq!(sizes.iter().sum::<usize>(), 8);
        assert!(sizes.iter().all(|s| (2..=3).contains(s)), "{sizes:?}");
        let before: Vec<Vec<u32>> = view.members.iter().map(|m| m.granted.clone()).collect();
        c.leave("s", "g", ids[2]).unwrap();
        let after = c.describe("s", "g").unwrap();
        for (old, new) in before.iter().zip(&after.members) {
            assert!(
                old.iter().all(|p| new.granted.contains(p)),
                "members keep what they had"
            );
        }
    }
}
