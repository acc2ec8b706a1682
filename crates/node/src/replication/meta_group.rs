//! Group 0 on shard 0: the metadata group's replica with its files
//! ([`ShardHost`]), this node's client session with the group ([`MetaClient`]), and
//! their traffic on the replica bus. Every node applies the committed ops; changes are
//! proposed through the client, which reaches the primary wherever it is.
//!
//! Time is counted in shard ticks ([`TICK_MS`]); the caller ticks it with the shard.
//! A disk failure stops the group for good (what reached the disk is unknown until a
//! restart reads it): every pending and later proposal is answered with the error.

use std::path::Path;

use braid_bus::{Bus, Delivery, Frame};
use braid_proto::client::ErrorCode;
use braid_vsr::{Config, Input, Message, Replica, ReplicaId, Reply, Request, Status};

use super::machine::{LayoutNews, MetadataMachine};
use super::meta_client::{node_of_client, MetaClient, Send};
use super::outbox::Outbox;
use super::shard_host::{Effects, HostError, ShardHost};
use super::wire::{self, Received};
use crate::error::NodeError;
use crate::metadata::{MetaOp, Metadata};

/// The metadata group's id.
pub(crate) const METADATA_GROUP: u64 = 0;

/// How long a replica tick is: the shard's timer period.
pub(crate) const TICK_MS: u64 = 10;

/// The bus link metadata frames take (seed 000: link 0).
const METADATA_SHARD: u16 = 0;

/// The group's timings, in ticks, from the cluster's heartbeat timeout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Timing {
    pub(crate) heartbeat_ticks: u64,
    pub(crate) view_change_ticks: u64,
    pub(crate) retry_ticks: u64,
}

impl Timing {
    /// A backup gives up on a silent primary after half the heartbeat timeout (plus up
    /// to as much jitter), so a dead primary is replaced before TCP gives up on it; the
    /// primary beats four times in that window.
    pub(crate) fn from_heartbeat_timeout_ms(timeout_ms: u64) -> Self {
        let view_change_ticks = (timeout_ms / 2 / TICK_MS).max(8);
        Self {
            heartbeat_ticks: (view_change_ticks / 4).max(1),
            view_change_ticks,
            retry_ticks: (view_change_ticks / 5).max(2),
        }
    }
}

/// How a node opens its metadata group.
#[derive(Debug, Clone, Copy)]
pub(crate) struct MetaOpening {
    /// This member, of `members`.
    pub(crate) node: ReplicaId,
    pub(crate) members: u8,
    pub(crate) timing: Timing,
    pub(crate) nonce: u64,
    /// The directory was made with `--rejoin`: a group with nothing on disk starts
    /// untrusted.
    pub(crate) rejoined: bool,
    /// A file of the group is gone (a cluster member): it restarts as a replica that
    /// lost its disk and takes the group's state from its peers.
    pub(crate) lost: bool,
    /// Ops between checkpoints ([`CHECKPOINT_INTERVAL`]; fewer in the simulator, so that
    /// a short run goes through many).
    pub(crate) checkpoint_interval: u64,
}

/// Ops between the metadata group's checkpoints; its journal keeps twice as many.
pub(crate) const CHECKPOINT_INTERVAL: u64 = 256;

/// What a turn of the group produced for the metadata service.
#[derive(Debug)]
pub(crate) struct Turn<T> {
    /// Outcomes of this node's proposals.
    /// Outcomes of this node's proposals: the op that applied each, or why not.
    pub(crate) answered: Vec<(T, Result<u64, NodeError>)>,
    /// How committed ops changed the topic layout and the access table.
    pub(crate) layout: LayoutNews,
}

impl<T> Default for Turn<T> {
    fn default() -> Self {
        Self {
            answered: Vec::new(),
            layout: LayoutNews::Unchanged,
        }
    }
}

/// The metadata group as this node runs it.
#[derive(Debug)]
pub(crate) struct MetaGroup<T> {
    host: ShardHost<MetadataMachine>,
    client: MetaClient<T>,
    outbox: Outbox,
    node: ReplicaId,
    members: u8,
    now: u64,
    /// The machine's `touched_end` when the layout was last published.
    layout_seen: u64,
    /// Answers from a remote primary, held until the local replica has applied the op
    /// they name: a client told "created" must find the topic on this node.
    held: Vec<(u64, T, Result<(), NodeError>)>,
    failed: Option<String>,
    /// The replica's newest op when it was first trusted and normal since the start.
    trusted_head: Option<u64>,
    /// Every topic created before the start has an id below this, once known.
    new_topics_from: Option<u32>,
}

impl<T> MetaGroup<T> {
    /// Opens group 0's files in `dir` as `opening` says.
    ///
    /// # Errors
    /// The files cannot be read or cannot restart the replica.
    pub(crate) fn open(dir: &Path, opening: MetaOpening) -> Result<Self, HostError> {
        let MetaOpening {
            node,
            members,
            timing,
            nonce,
            rejoined,
            lost,
            checkpoint_interval,
        } = opening;
        let mut host = ShardHost::open(dir, 0)?;
        host.refuse_lone_if_unattributable(members)?;
        if rejoined {
            host.start_fresh_untrusted();
        }
        if lost || host.state_may_be_lost(METADATA_GROUP) {
            host.restart_as_lost(METADATA_GROUP)?;
        }
        let config = Config {
            pipeline_max: 8,
            checkpoint_interval,
            journal_keep: checkpoint_interval * 2,
            sessions_max: 64,
            heartbeat_ticks: timing.heartbeat_ticks,
            view_change_ticks: timing.view_change_ticks,
            retry_ticks: timing.retry_ticks,
            // One group: its heartbeats are what tells a backup the primary is gone.
            quiesce: false,
            ..Config::new(METADATA_GROUP, node, members, nonce | 1)
        };
        host.add_group(config, MetadataMachine::default())?;
        let mut group = Self {
            host,
            client: MetaClient::new(node, nonce, timing.retry_ticks * 2),
            outbox: Outbox::Nowhere,
            node,
            members,
            now: 0,
            layout_seen: 0,
            held: Vec::new(),
            failed: None,
            trusted_head: None,
            new_topics_from: None,
        };
        if members == 1 {
            // Normal, with every committed op applied, before the node serves; its
            // journal syncs inline, and it has no peer or client yet.
            drop(group.host.recover_lone(&[METADATA_GROUP], &mut group.now)?);
        }
        group.layout_seen = group.touched_end();
        Ok(group)
    }

    /// Sends and receives through `bus` from now on.
    pub(crate) fn attach_bus(&mut self, bus: Bus) {
        self.outbox = Outbox::Owner {
            bus,
            shard: METADATA_SHARD,
        };
    }

    /// Keeps the frames to peers for [`MetaGroup::take_sent`] (the simulator).
    #[cfg(test)]
    pub(crate) fn keep_sent(&mut self) {
        self.outbox = Outbox::Kept(Vec::new());
    }

    /// The frames to peers kept since the last call.
    #[cfg(test)]
    pub(crate) fn take_sent(&mut self) -> Vec<(u8, Frame)> {
        self.outbox.take_kept()
    }

    /// Whether a disk failure stopped the group, and why.
    #[cfg(test)]
    pub(crate) fn failure(&self) -> Option<&str> {
        self.failed.as_deref()
    }

    /// The local replica (added at open, so always there).
    fn replica(&self) -> Option<&Replica<MetadataMachine>> {
        self.host.replica(METADATA_GROUP)
    }

    fn touched_end(&self) -> u64 {
        self.replica()
            .map_or(0, |r| r.state().machine().touched_end())
    }

    fn commit_min(&self) -> u64 {
        self.replica().map_or(0, Replica::commit_min)
    }

    /// The committed metadata this node has applied.
    pub(crate) fn state(&self) -> &Metadata {
        static NONE: std::sync::OnceLock<Metadata> = std::sync::OnceLock::new();
        match self.replica() {
            Some(replica) => replica.state().machine().state(),
            None => NONE.get_or_init(Metadata::default),
        }
    }

    /// The lowest topic id that no topic created before this node started can have,
    /// once known: the replica is trusted and normal (its log holds every op committed
    /// before the start), and has applied every op its log held then. A member that
    /// lost its data may have acknowledged ops of the partitions of older topics; a
    /// topic from this id on was created after it started again, so it never did.
    pub(crate) fn new_topics_from(&mut self) -> Option<u32> {
        if self.new_topics_from.is_none() {
            let replica = self.replica()?;
            if !replica.journal_trusted() || replica.status() != Status::Normal {
                return None;
            }
            let (op, applied) = (replica.op(), replica.commit_min());
            let head = *self.trusted_head.get_or_insert(op);
            if applied >= head {
                self.new_topics_from = Some(self.state().next_topic_id());
            }
        }
        self.new_topics_from
    }

    /// The metadata replica now (for the shard's board).
    pub(crate) fn status(&self) -> Option<super::status::GroupStatus> {
        self.replica().map(super::status::GroupStatus::of)
    }

    /// Repairs the metadata replica asked of peers since the last call.
    pub(crate) fn take_repairs(&mut self) -> super::shard_host::Repairs {
        self.host.take_repairs()
    }

    /// The metadata replica's view: it grows with every change of primary, so it
    /// numbers the coordinators of consumer groups (see `GroupCoordinator::enter_epoch`).
    pub(crate) fn view(&self) -> u64 {
        self.replica().map_or(0, Replica::view)
    }

    /// The member that leads the group, if this replica knows one in normal status.
    pub(crate) fn primary(&self) -> Option<ReplicaId> {
        let replica = self.replica()?;
        (replica.status() == Status::Normal).then(|| replica.primary_of(replica.view()))
    }

    /// Proposes `op`; its outcome comes back in a turn with `token`.
    pub(crate) fn propose(&mut self, op: MetaOp, token: T) -> Turn<T> {
        let mut turn = Turn::default();
        if let Some(reason) = &self.failed {
            turn.answered.push((token, Err(stopped(reason))));
            return turn;
        }
        self.client.propose(op, token);
        self.run(&mut turn, Vec::new());
        turn
    }

    /// One tick of time.
    pub(crate) fn tick(&mut self) -> Turn<T> {
        let mut turn = Turn::default();
        if self.failed.is_some() {
            return turn;
        }
        self.now += 1;
        match self.host.tick(self.now) {
            Ok(effects) => self.run(&mut turn, vec![effects]),
            Err(err) => self.fail(&mut turn, err),
        }
        turn
    }

    /// A client was sent elsewhere because this replica believes another member leads:
    /// a quiescent backup starts watching that primary again, so a dead one is
    /// replaced (nothing else would wake the group if no change is being made).
    pub(crate) fn nudge(&mut self) -> Turn<T> {
        let mut turn = Turn::default();
        if self.failed.is_some() || self.members <= 1 || self.primary() == Some(self.node) {
            return turn;
        }
        let wake = Request {
            client: 0,
            session: u64::MAX,
            request: 0,
            body: bytes::Bytes::new(),
        };
        let input = Input::Message(Message::Request(wake));
        match self.host.step(self.now, vec![(METADATA_GROUP, input)]) {
            Ok(effects) => self.run(&mut turn, vec![effects]),
            Err(err) => self.fail(&mut turn, err),
        }
        turn
    }

    /// A frame from a peer.
    pub(crate) fn deliver(&mut self, delivery: &Delivery) -> Turn<T> {
        self.deliver_frame(delivery.peer, &delivery.frame)
    }

    /// A frame from `peer`, as the bus authenticated it.
    pub(crate) fn deliver_frame(&mut self, peer: u8, frame: &Frame) -> Turn<T> {
        let mut turn = Turn::default();
        if self.failed.is_some() {
            return turn;
        }
        match wire::received_from(peer, frame) {
            Ok(Received::Message(METADATA_GROUP, message)) => {
                match self
                    .host
                    .step(self.now, vec![(METADATA_GROUP, Input::Message(message))])
                {
                    Ok(effects) => self.run(&mut turn, vec![effects]),
                    Err(err) => self.fail(&mut turn, err),
                }
            }
            Ok(Received::Reply(METADATA_GROUP, reply)) => {
                let answered = self.client.on_reply(&reply);
                self.held.extend(answered);
                self.run(&mut turn, Vec::new());
            }
            Ok(
                Received::Message(group, _)
                | Received::Reply(group, _)
                | Received::LogFetch { group, .. }
                | Received::LogChunk { group, .. },
            ) => {
                tracing::debug!(group, peer, "a frame for a group shard 0 does not hold");
            }
            Err(err) => {
                tracing::warn!(peer, %err, "a replica frame that does not decode");
            }
        }
        turn
    }

    /// Sends what the client has due and carries out `pending` effects and what
    /// follows from them, until nothing is left.
    fn run(&mut self, turn: &mut Turn<T>, mut pending: Vec<Effects>) {
        loop {
            if let Some(effects) = pending.pop() {
                self.carry(effects);
                continue;
            }
            let Some(send) = self.client.poll(self.now) else {
                break;
            };
            let (request, to_all) = match send {
                Send::Primary(request) => (request, false),
                Send::All(request) => (request, true),
            };
            let local = to_all || self.primary() == Some(self.node) || self.members == 1;
            if !local || to_all {
                let targets: Vec<ReplicaId> = match (to_all, self.primary()) {
                    (false, Some(primary)) => vec![primary],
                    _ => (0..self.members).filter(|m| *m != self.node).collect(),
                };
                let message = Message::Request(request.clone());
                for to in targets {
                    self.send(to, &message);
                }
            }
            if local {
                let input = Input::Message(Message::Request(request));
                match self.host.step(self.now, vec![(METADATA_GROUP, input)]) {
                    Ok(effects) => pending.push(effects),
                    Err(err) => {
                        self.fail(turn, err);
                        return;
                    }
                }
            }
        }
        if let Some(replica) = self.replica() {
            let machine = replica.state().machine();
            let news = machine.news_since(self.layout_seen);
            self.layout_seen = machine.touched_end();
            turn.layout = match (std::mem::take(&mut turn.layout), news) {
                (LayoutNews::Whole, _) | (_, LayoutNews::Whole) => LayoutNews::Whole,
                (LayoutNews::Touched(mut earlier), LayoutNews::Touched(later)) => {
                    earlier.extend(later);
                    LayoutNews::Touched(earlier)
                }
                (LayoutNews::Unchanged, news) | (news, LayoutNews::Unchanged) => news,
            };
        }
        let applied = self.commit_min();
        let (ready, waiting): (Vec<_>, Vec<_>) = std::mem::take(&mut self.held)
            .into_iter()
            .partition(|(op, _, _)| *op <= applied);
        self.held = waiting;
        turn.answered.extend(
            ready
                .into_iter()
                .map(|(op, token, outcome)| (token, outcome.map(|()| op))),
        );
    }

    fn carry(&mut self, effects: Effects) {
        for (_, to, message) in effects.sends {
            self.send(to, &message);
        }
        for (_, reply) in effects.replies {
            self.answer(reply);
        }
    }

    /// Routes a reply of the local primary to the client it answers.
    fn answer(&mut self, reply: Reply) {
        if reply.client == self.client.id() {
            let answered = self.client.on_reply(&reply);
            self.held.extend(answered);
            return;
        }
        match node_of_client(reply.client) {
            Some(node) if node != self.node && node < self.members => {
                // A lost reply is sent again when the client retries.
                self.outbox
                    .send(node, wire::reply_frame(METADATA_GROUP, &reply));
            }
            _ => tracing::debug!(client = reply.client, "a reply for no node"),
        }
    }

    fn send(&mut self, to: ReplicaId, message: &Message) {
        // A full or down link drops the frame: consensus retransmits.
        self.outbox.send(to, wire::frame(METADATA_GROUP, message));
    }

    fn fail(&mut self, turn: &mut Turn<T>, err: HostError) {
        let reason = err.to_string();
        tracing::error!(%reason, "the metadata group stopped: restart the node");
        // Answers already in are the group's: they stand.
        turn.answered.extend(
            self.held
                .drain(..)
                .map(|(op, token, outcome)| (token, outcome.map(|()| op))),
        );
        for token in self.client.drain() {
            turn.answered.push((token, Err(stopped(&reason))));
        }
        self.failed = Some(reason);
    }
}

fn stopped(reason: &str) -> NodeError {
    NodeError::new(
        ErrorCode::StorageError,
        format!("the metadata group stopped after a disk failure ({reason}); restart the node"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metadata::op;

    fn stream(name: &str) -> MetaOp {
        MetaOp::CreateStream(op::CreateStream { name: name.into() })
    }

    fn lone(dir: &Path) -> MetaGroup<u32> {
        let opening = MetaOpening {
            node: 0,
            members: 1,
            timing: Timing::from_heartbeat_timeout_ms(2_000),
            nonce: 7,
            rejoined: false,
            lost: false,
            checkpoint_interval: CHECKPOINT_INTERVAL,
        };
        MetaGroup::open(dir, opening).unwrap()
    }

    #[test]
    fn a_lone_group_answers_each_proposal_at_once_and_restarts_with_them() {
        let dir = tempfile::tempdir().unwrap();
        let mut group = lone(dir.path());
        assert_eq!(group.primary(), Some(0));
        for i in 0..3 {
            let turn = group.propose(stream(&format!("s{i}")), i);
            assert_eq!(turn.answered.len(), 1, "proposal {i}");
            assert_eq!(turn.answered[0].0, i);
            assert!(turn.answered[0].1.is_ok(), "proposal {i}");
            // Only what the op touched, not the whole layout (20,000 stream creates
            // each rebuilt and published everything).
            let touched = crate::metadata::Touch::Stream(format!("s{i}"));
            assert_eq!(turn.layout, LayoutNews::Touched([touched].into()));
        }
        let refused = group.propose(stream("s1"), 9);
        assert_eq!(refused.answered.len(), 1);
        assert!(refused.answered[0].1.is_err(), "a second s1 is refused");
        assert_eq!(group.state().streams.len(), 3);
        drop(group);
        let group = lone(dir.path());
        assert_eq!(
            group.state().streams.len(),
            3,
            "every op back after a restart"
        );
        assert_eq!(group.primary(), Some(0));
    }
}
