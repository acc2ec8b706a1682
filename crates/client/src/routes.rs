//! Where each request goes in a cluster, from the last `ClusterInfo` the client got:
//! produce, fetch and offset lookups to their partition's primary, consumer-group
//! calls to the coordinator, everything else to whichever member is at hand. Pure: no
//! sockets, so the choice is tested directly.

use std::collections::{BTreeMap, HashMap};

use braid_proto::client::{ClusterInfo, Request};

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
            Request::JoinGroup { .. }
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

/// The cluster as one `ClusterInfo` answer described it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Routes {
    /// Member id → the address clients reach it at.
    members: BTreeMap<u8, String>,
    coordinator: Option<u8>,
    /// Stream → topic → partition → primary member (looked up by `&str`, so a
    /// produce allocates nothing to find its member).
    primaries: HashMap<String, HashMap<String, HashMap<u32, u8>>>,
}

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
        let mut primaries: HashMap<String, HashMap<String, HashMap<u32, u8>>> = HashMap::new();
        for t in &info.topics {
            primaries
                .entry(t.stream.clone())
                .or_default()
                .insert(t.topic.clone(), t.partitions.iter().copied().collect());
        }
        Self {
            members,
            coordinator: info.coordinator,
            primaries,
        }
    }

    /// The member `target` should go to, if the routes name one.
    pub(crate) fn member_for(&self, target: Target<'_>) -> Option<u8> {
        match target {
            Target::Partition {
                stream,
                topic,
                partition,
            } => self
                .primaries
                .get(stream)?
                .get(topic)?
                .get(&partition)
                .copied(),
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
                partitions: vec![(0, 0), (1, 2)],
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
}
