//! [`NodeStatus`]: what one member says of its own replicas and of its replica-bus
//! bundles (the `NodeStatus` command). `braid cluster status` asks every member and
//! lays the answers side by side.

use crate::wire::{WireError, WireReader, WireWrite};

/// Most groups a [`NodeStatus`] names in [`NodeStatus::behind`] (the count in
/// [`NodeStatus::groups_behind`] is complete).
pub const GROUPS_BEHIND_LISTED_MAX: usize = 32;

/// A replica's status as the wire carries it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ReplicaStatus {
    /// Its view's primary is known and the replica takes part in it.
    Normal,
    /// It is changing view: no primary is known.
    ViewChange,
    /// It restarts and asks its peers what it may have lost.
    Recovering,
}

impl ReplicaStatus {
    fn code(self) -> u8 {
        match self {
            Self::Normal => 0,
            Self::ViewChange => 1,
            Self::Recovering => 2,
        }
    }

    fn decode(r: &mut WireReader<'_>) -> Result<Self, WireError> {
        let at = r.position();
        match r.u8("status")? {
            0 => Ok(Self::Normal),
            1 => Ok(Self::ViewChange),
            2 => Ok(Self::Recovering),
            value => Err(WireError::BadValue {
                at,
                field: "status",
                value: value.into(),
            }),
        }
    }

    /// The status as a word (`normal`, `view_change`, `recovering`).
    pub fn name(self) -> &'static str {
        match self {
            Self::Normal => "normal",
            Self::ViewChange => "view_change",
            Self::Recovering => "recovering",
        }
    }
}

/// The bundle of links from the answering member to one peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerBundle {
    /// The peer's member id.
    pub peer: u8,
    /// Whether every link to it is up.
    pub bundle_up: bool,
    /// Links up now.
    pub links_up: u16,
    /// Links per peer (k).
    pub links: u16,
    /// The bundle's generation.
    pub generation: u32,
    /// Milliseconds the bundle has been up, or down.
    pub in_state_ms: u64,
    /// Bundles to it torn down since the member started.
    pub teardowns: u64,
    /// Frames sent to it.
    pub frames_sent: u64,
    /// Frames received from it.
    pub frames_received: u64,
}

/// A group whose replica on the answering member is not caught up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupBehind {
    /// The group id.
    pub group: u64,
    /// What it replicates: `metadata`, or `stream/topic/partition`.
    pub name: String,
    /// The replica's status.
    pub status: ReplicaStatus,
    /// Its view.
    pub view: u64,
    /// The primary of its view, if it is in normal status.
    pub primary: Option<u8>,
    /// The highest op in its journal.
    pub op: u64,
    /// The highest op it applied.
    pub commit_min: u64,
    /// The highest op it knows committed.
    pub commit_max: u64,
}

/// [`super::Response::Node`]: the answering member's replicas summed up, its bundle to
/// each peer, and the groups it has not caught up on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeStatus {
    /// The member that answered.
    pub node_id: u8,
    /// Milliseconds since it started.
    pub uptime_ms: u64,
    /// Every shard has published and every group is caught up (`/health`).
    pub caught_up: bool,
    /// Groups it holds a replica of (the metadata group included).
    pub groups: u64,
    /// Groups it leads in normal status.
    pub groups_led: u64,
    /// Groups in view change or recovering.
    pub groups_in_view_change: u64,
    /// Groups not caught up (not normal, or committed ops not applied yet).
    pub groups_behind: u64,
    /// Committed ops known and not applied yet, over all groups.
    pub commit_lag_ops: u64,
    /// Views its groups passed since it started.
    pub views_passed: u64,
    /// Primaries here that stepped down for lack of a quorum since it started.
    pub step_downs: u64,
    /// Its bundle to each peer, by member id (none in a cluster of one).
    pub peers: Vec<PeerBundle>,
    /// Up to [`GROUPS_BEHIND_LISTED_MAX`] of the groups not caught up.
    pub behind: Vec<GroupBehind>,
}

/// The wire value of "no primary" in [`GroupBehind::primary`].
const NO_MEMBER: u8 = u8::MAX;

/// Bytes of one [`PeerBundle`] on the wire.
const PEER_BYTES: usize = 1 + 1 + 2 + 2 + 4 + 8 * 4;
/// Fewest bytes of one [`GroupBehind`] on the wire (an empty name).
const GROUP_BYTES_MIN: usize = 8 + 2 + 1 + 8 + 1 + 8 * 3;

impl NodeStatus {
    pub(super) fn encode_into(&self, out: &mut Vec<u8>) {
        out.put_u8_be(self.node_id);
        out.put_u64_be(self.uptime_ms);
        out.put_u8_be(u8::from(self.caught_up));
        for count in [
            self.groups,
            self.groups_led,
            self.groups_in_view_change,
            self.groups_behind,
            self.commit_lag_ops,
            self.views_passed,
            self.step_downs,
        ] {
            out.put_u64_be(count);
        }
        out.put_u32_be(self.peers.len() as u32);
        for p in &self.peers {
            out.put_u8_be(p.peer);
            out.put_u8_be(u8::from(p.bundle_up));
            out.put_u16_be(p.links_up);
            out.put_u16_be(p.links);
            out.put_u32_be(p.generation);
            out.put_u64_be(p.in_state_ms);
            out.put_u64_be(p.teardowns);
            out.put_u64_be(p.frames_sent);
            out.put_u64_be(p.frames_received);
        }
        out.put_u32_be(self.behind.len() as u32);
        for g in &self.behind {
            out.put_u64_be(g.group);
            out.put_string(&g.name);
            out.put_u8_be(g.status.code());
            out.put_u64_be(g.view);
            out.put_u8_be(g.primary.unwrap_or(NO_MEMBER));
            out.put_u64_be(g.op);
            out.put_u64_be(g.commit_min);
            out.put_u64_be(g.commit_max);
        }
    }

    pub(super) fn decode(r: &mut WireReader<'_>) -> Result<Self, WireError> {
        let node_id = r.u8("node_id")?;
        let uptime_ms = r.u64("uptime_ms")?;
        let caught_up = r.bool("caught_up")?;
        let groups = r.u64("groups")?;
        let groups_led = r.u64("groups_led")?;
        let groups_in_view_change = r.u64("groups_in_view_change")?;
        let groups_behind = r.u64("groups_behind")?;
        let commit_lag_ops = r.u64("commit_lag_ops")?;
        let views_passed = r.u64("views_passed")?;
        let step_downs = r.u64("step_downs")?;
        let peers = (0..r.count("peers", PEER_BYTES)?)
            .map(|_| {
                Ok(PeerBundle {
                    peer: r.u8("peer")?,
                    bundle_up: r.bool("bundle_up")?,
                    links_up: r.u16("links_up")?,
                    links: r.u16("links")?,
                    generation: r.u32("generation")?,
                    in_state_ms: r.u64("in_state_ms")?,
                    teardowns: r.u64("teardowns")?,
                    frames_sent: r.u64("frames_sent")?,
                    frames_received: r.u64("frames_received")?,
                })
            })
            .collect::<Result<_, WireError>>()?;
        let behind = (0..r.count("behind", GROUP_BYTES_MIN)?)
            .map(|_| {
                let group = r.u64("group")?;
                let name = r.string("name")?.to_owned();
                let status = ReplicaStatus::decode(r)?;
                let view = r.u64("view")?;
                let primary = Some(r.u8("primary")?).filter(|m| *m != NO_MEMBER);
                Ok(GroupBehind {
                    group,
                    name,
                    status,
                    view,
                    primary,
                    op: r.u64("op")?,
                    commit_min: r.u64("commit_min")?,
                    commit_max: r.u64("commit_max")?,
                })
            })
            .collect::<Result<_, WireError>>()?;
        Ok(Self {
            node_id,
            uptime_ms,
            caught_up,
            groups,
            groups_led,
            groups_in_view_change,
            groups_behind,
            commit_lag_ops,
            views_passed,
            step_downs,
            peers,
            behind,
        })
    }
}
