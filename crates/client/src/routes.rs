//! Where each request goes in a cluster, from the last `ClusterInfo` the client got:
//! produce, fetch and offset lookups to their partition's primary, consumer-group
//! calls to the coordinator, everything else to whichever member is at hand. Answers
//! from several members merge: for each partition the newest view whose replica knew
//! its primary wins, so a member cut off from the others (still changing views, or
//! still normal in an old one) does not send the client astray. Pure: no sockets, so
//! the choice is tested directly.

use std::collections::{BTreeMap, HashMap};

use braid_proto::client::{ClusterInfo, PartitionPrimary, Request};

/// Whom a request is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Target<'a> {
    /// The primary of this partition.
    Partition {
        stream: &'a str,
        topic: &'a str,
        partition: u32,
    },
    /// The consumer-group coordinator.
    Coordinator,
    /// Any member.
    Any,
}

impl<'a> Target<'a> {
    /// The target of `request`.
    pub(crate) fn of(request: &Request<'a>) -> Self {
        match *request {
            Request::Produce {
                stream,
                topic,
                partition,
                ..
            }
            | Request::Fetch {
                stream,
                topic,
                partition,
                ..
            }
            | Request::ListOffsets {
                stream,
                topic,
                partition,
                ..
            } => Self::Partition {
                stream,
                topic,
                partition,
            },
            Request::RegisterSession { .. }
            | Request::EndSession { .. }
            | Request::SessionHeartbeat { .. }
            | Request::JoinGroup { .. }
            | Request::Heartbeat { .. }
            | Request::LeaveGroup { .. }
            | Request::CommitOffsets { .. }
            | Request::FetchOffsets { .. }
            | Request::DescribeGroup { .. }
            | Request::ListGroups { .. } => Self::Coordinator,
            _ => Self::Any,
        }
    }
}

/// The cluster as the `ClusterInfo` answers of one refresh described it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Routes {
    /// Member id → the address clients reach it at.
    members: BTreeMap<u8, String>,
    coordinator: Option<u8>,
    /// Stream → topic → partition → primary member (if known) and the view it was
    /// known in (looked up by `&str`, so a produce allocates nothing to find its
    /// member).
    primaries: HashMap<String, HashMap<String, HashMap<u32, Known>>>,
}

/// A partition's primary as the routes know it (if any member knew one) and the view
/// that named it.
type Known = (Option<u8>, u64);

impl Routes {
    /// The routes of `info`, answered by the member at `reached_at`: that member is
    /// recorded at the address the client reached it by (it may advertise one this
    /// client cannot use, such as a wildcard address).
    pub(crate) fn new(info: &ClusterInfo, reached_at: &str) -> Self {
        let mut members: BTreeMap<u8, String> = info
            .members
            .iter()
            .map(|m| (m.id, m.client_addr.clone()))
            .collect();
        members.insert(info.node_id, reached_at.to_owned());
        let mut routes = Self {
            members,
            coordinator: info.coordinator,
            primaries: HashMap::new(),
        };
        routes.merge(info);
        routes
    }

    /// Adds another member's answer: a partition's primary is taken from it if that
    /// member knew it in a newer view (or this map knows none); the coordinator if
    /// this map has none. Topics it alone names are added.
    pub(crate) fn merge(&mut self, info: &ClusterInfo) {
        if self.coordinator.is_none() {
            self.coordinator = info.coordinator;
        }
        for t in &info.topics {
            let topic = self
                .primaries
                .entry(t.stream.clone())
                .or_default()
                .entry(t.topic.clone())
                .or_default();
            for &PartitionPrimary {
                partition,
                primary,
                view,
            } in &t.partitions
            {
                let slot = topic.entry(partition).or_insert((primary, view));
                let newer = primary.is_some() && (slot.0.is_none() || view > slot.1);
                if newer {
                    *slot = (primary, view);
                }
            }
        }
    }

    /// The member `target` should go to, if the routes name one.
    pub(crate) fn member_for(&self, target: Target<'_>) -> Option<u8> {
        match target {
            Target::Partition {
                stream,
                topic,
                partition,
            } => self.primaries.get(stream)?.get(topic)?.get(&partition)?.0,
            Target::Coordinator => self.coordinator,
            Target::Any => None,
        }
    }

    /// Every member with its address.
    pub(crate) fn members(&self) -> impl Iterator<Item = (u8, &str)> {
        self.members.iter().map(|(id, addr)| (*id, addr.as_str()))
    }

    /// The address of `member`.
    pub(crate) fn addr_of(&self, member: u8) -> Option<&str> {
        self.members.get(&member).map(String::as_str)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use braid_proto::client::{ClusterMember, OffsetSpec, TopicPrimaries};

    fn primary(partition: u32, primary: Option<u8>, view: u64) -> PartitionPrimary {
        PartitionPrimary {
            partition,
            primary,
            view,
        }
    }

    fn info() -> ClusterInfo {
        ClusterInfo {
            cluster_id: "c".into(),
            node_id: 1,
            coordinator: Some(2),
            members: (0..3)
                .map(|id| ClusterMember {
                    id,
                    client_addr: format!("0.0.0.0:{}", 7070 + u16::from(id)),
                })
                .collect(),
            topics: vec![TopicPrimaries {
                stream: "s".into(),
                topic: "t".into(),
                partitions: vec![primary(0, Some(0), 3), primary(1, Some(2), 5)],
            }],
        }
    }

    #[test]
    fn partition_requests_go_to_their_primary_and_group_calls_to_the_coordinator() {
        let routes = Routes::new(&info(), "10.0.0.1:7071");
        let produce = Request::Produce {
            stream: "s",
            topic: "t",
            partition: 1,
            batch: b"",
        };
        assert_eq!(routes.member_for(Target::of(&produce)), Some(2));
        let fetch = Request::Fetch {
            stream: "s",
            topic: "t",
            partition: 0,
            offset: 0,
            max_bytes: 1,
            max_wait_ms: 0,
        };
        assert_eq!(routes.member_for(Target::of(&fetch)), Some(0));
        let offsets = Request::ListOffsets {
            stream: "s",
            topic: "t",
            partition: 7,
            spec: OffsetSpec::Latest,
        };
        assert_eq!(
            routes.member_for(Target::of(&offsets)),
            None,
            "unknown partition"
        );
        let join = Request::ListGroups { stream: "s" };
        assert_eq!(routes.member_for(Target::of(&join)), Some(2));
        let create = Request::CreateStream { name: "x" };
        assert_eq!(Target::of(&create), Target::Any);
        assert_eq!(routes.member_for(Target::of(&create)), None);
    }

    #[test]
    fn the_answering_member_keeps_the_address_it_was_reached_at() {
        let routes = Routes::new(&info(), "10.0.0.1:7071");
        assert_eq!(routes.addr_of(1), Some("10.0.0.1:7071"));
        assert_eq!(routes.addr_of(2), Some("0.0.0.0:7072"));
        assert_eq!(routes.members().count(), 3);
        assert_eq!(routes.addr_of(9), None);
    }

    #[test]
    fn answers_merge_by_the_newest_view_that_knew_its_primary() {
        // Member 1 is cut off: it still changes views (knows no primary of partition
        // 0) and is normal in an old view of partition 1.
        let mut cut_off = info();
        cut_off.coordinator = None;
        cut_off.topics[0].partitions = vec![primary(0, None, 9), primary(1, Some(1), 5)];
        let mut routes = Routes::new(&cut_off, "10.0.0.1:7071");
        let produce = |partition| Request::Produce {
            stream: "s",
            topic: "t",
            partition,
            batch: b"",
        };
        assert_eq!(routes.member_for(Target::of(&produce(0))), None);
        // The others moved on: view 6 of partition 0 led by member 2, view 7 of 1 by 0.
        let mut moved = info();
        moved.topics[0].partitions = vec![primary(0, Some(2), 6), primary(1, Some(0), 7)];
        routes.merge(&moved);
        assert_eq!(routes.member_for(Target::of(&produce(0))), Some(2));
        assert_eq!(routes.member_for(Target::of(&produce(1))), Some(0));
        assert_eq!(
            routes.member_for(Target::of(&Request::ListGroups { stream: "s" })),
            Some(2)
        );
        // An older answer changes nothing.
        routes.merge(&info());
        assert_eq!(routes.member_for(Target::of(&produce(1))), Some(0));
    }
}
