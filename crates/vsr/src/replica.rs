//! One replica of one consensus group: Viewstamped Replication Revisited with a
//! checksum-chained journal, as a pure state machine.
//!
//! Method kinds, in calling order: getters; [`Replica::step`] with one [`Input`]
//! (a message, a tick, or the completion of a write the replica asked for), which
//! appends [`Output`]s to a buffer the caller owns; [`Replica::next_deadline`] for the
//! shell's timer. Time is the tick number passed to `step`.
//!
//! Safety rests on three rules:
//! - A backup applies only *canonical* entries: ones whose checksum is pinned by the
//!   current view (a prepare from its primary, its StartView, or a commit anchor), or
//!   whose checksum is the parent of a canonical entry. The checksum covers the parent,
//!   so one canonical checksum pins the whole log below it.
//! - View-scoped messages (PrepareOk, DoViewChange, StartView) go out only once the
//!   view and log view they speak for are durable, and journal truncations and
//!   replacements are written before the log view that depends on them.
//! - The new primary takes the suffix of the DoViewChange with the highest
//!   (log view, op), and drops an op only when a quorum says it never had it; a
//!   damaged entry is never counted as "never had".

use std::collections::{BTreeMap, BTreeSet};

use bytes::Bytes;

use crate::durable::{Checkpoint, DurableState};
use crate::lazy::Lazy;
use crate::message::{
    Checksum, Header, Message, Operation, Prepare, Refusal, ReplicaId, Reply, Request, SuffixEntry,
};
use crate::op_map::OpMap;
use crate::state::{ReplicatedState, StateMachine};

pub use config::{Config, ConfigError, REPLICAS_MAX};

/// Why a replica could not start from what it persisted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StartError {
    /// The settings cannot run.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The checkpoint is damaged or belongs to another group.
    #[error("group {group}: the checkpoint at op {op} is damaged")]
    CheckpointDamaged {
        /// The group.
        group: u64,
        /// The checkpoint's op.
        op: u64,
    },
    /// The checkpoint is intact but its state does not decode.
    #[error("group {group}: the checkpoint's state does not decode: {reason}")]
    CheckpointState {
        /// The group.
        group: u64,
        /// The state machine's reason.
        reason: String,
    },
}

/// Messages a replica ignored, by reason: a shell exports them as metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct IgnoredCounts {
    /// From a replica id outside the group, or claiming to be this replica.
    pub foreign_sender: u64,
    /// For another group.
    pub wrong_group: u64,
    /// A checksum did not hold (a damaged message).
    pub damaged: u64,
    /// From a replica that is not the primary of the view it speaks for.
    pub not_from_primary: u64,
}

impl IgnoredCounts {
    /// Nothing ignored.
    pub const NONE: Self = Self {
        foreign_sender: 0,
        wrong_group: 0,
        damaged: 0,
        not_from_primary: 0,
    };
}

/// The replica's status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// Processing requests in a view.
    Normal,
    /// Choosing the log of a new view.
    ViewChange,
    /// Restarted; waiting to learn the current view.
    Recovering,
}

/// What a restarting replica reads back from its disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Persisted {
    /// The durable state (the newest intact copy).
    pub durable: DurableState,
    /// The newest intact checkpoint, if any was written.
    pub checkpoint: Option<Checkpoint>,
    /// The journal slots above the checkpoint, by op. A slot whose write was reported
    /// complete must read back as its prepare, its header, or [`JournalSlot::Damaged`],
    /// never be absent; [`Persisted::journal_trusted`] says when that cannot be promised.
    pub journal: Vec<(u64, JournalSlot)>,
    /// False when journal writes were reported complete before they were synced
    /// (`fsync = never` or `interval`) and the page cache may have been lost since (the
    /// machine rebooted or lost power). The replica then never counts as "never had" an
    /// op above what it knows committed, until it is normal in a newer view.
    pub journal_trusted: bool,
}

impl Persisted {
    /// What a replica that lost its disk restarts from: nothing, untrusted from op 0
    /// (it may have acknowledged ops it no longer has), so it abstains from view
    /// changes and trusts itself again only in a view as new as any a quorum of its
    /// peers names.
    pub fn after_disk_loss() -> Self {
        Self {
            durable: DurableState {
                journal_trusted_through: 0,
                views_lost: true,
                ..DurableState::default()
            },
            checkpoint: None,
            journal: Vec::new(),
            journal_trusted: false,
        }
    }
}

/// The replica that leads `view` of `group`: views rotate through the replicas,
/// offset by the group id so groups' primaries spread over the members.
pub fn primary_of(group: u64, view: u64, replica_count: u8) -> ReplicaId {
    ((view + group) % u64::from(replica_count.max(1))) as ReplicaId
}

/// A journal slot as read back from disk after a restart.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JournalSlot {
    /// A whole prepare (checked on load).
    Prepare(Prepare),
    /// A header whose body is known to be missing.
    Header(Header),
    /// The slot could not be read (torn or corrupt).
    Damaged,
}

/// An input to [`Replica::step`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Input {
    /// A message from a replica or client.
    Message(Message),
    /// Time passed.
    Tick,
    /// A journal write asked for finished.
    JournalWritten {
        /// The op.
        op: u64,
        /// Its checksum.
        checksum: Checksum,
    },
    /// A durable-state write asked for finished.
    StateWritten(DurableState),
    /// The shell lost its connection to this replica of the group (its node's bus
    /// link went silent or closed). A quiescent backup keeps no timer, so a primary cut
    /// off from it would never be replaced while clients still reach that primary: a
    /// backup of that primary stays awake and watches it, as when a client comes.
    PeerLost(ReplicaId),
    /// The shell asks a primary to hand the group back to its preferred replica (the
    /// primary of view 0: groups spread over the members by group id), as Kafka's
    /// preferred leader election does, so that leadership spreads again after
    /// failovers. Taken only by a primary in normal status with nothing in flight,
    /// once the preferred replica has acknowledged its newest op in this view (it is
    /// up and holds the whole log); it then starts a view change to the next view the
    /// preferred replica leads. Anything else ignores it.
    HandOff,
}

/// What a replica asks its shell to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Output {
    /// Send a message to another replica of the group.
    Send {
        /// The receiver.
        to: ReplicaId,
        /// The message.
        message: Message,
    },
    /// Answer a client.
    Reply(Reply),
    /// Write a prepare to the journal (replacing any entry at its op); answer with
    /// [`Input::JournalWritten`].
    WriteJournal(Prepare),
    /// Write a header without its body at its op (replacing any entry there): the
    /// entry is known but its body must be repaired. Keeps a stale body from outliving
    /// the log view that replaced it.
    WriteHeader(Header),
    /// Send the journal's prepare at `op` (if it has `checksum`) to a peer: a repair
    /// answer for an entry this replica keeps only on disk.
    SendFromJournal {
        /// The peer.
        to: ReplicaId,
        /// The op.
        op: u64,
        /// The checksum asked for.
        checksum: Checksum,
    },
    /// Remove journal entries above `op`. Takes effect before later writes.
    TruncateJournal {
        /// Entries above this op go.
        op: u64,
    },
    /// Remove journal entries at or below `op` (covered by a checkpoint).
    PruneJournal {
        /// Entries at or below this op go.
        op: u64,
    },
    /// Persist the durable state; answer with [`Input::StateWritten`].
    WriteState(DurableState),
    /// Persist a checkpoint (before pruning the journal below it) over the older of the
    /// two copies the shell keeps; an installed snapshot comes twice, so it fills both.
    WriteCheckpoint(Checkpoint),
    /// An op was applied (for observers and checkers).
    Applied {
        /// The op.
        op: u64,
        /// Its checksum.
        checksum: Checksum,
        /// Its session (the new session for a register).
        session: u64,
        /// Its request number.
        request: u64,
        /// Whether it registered a session (rather than a request).
        register: bool,
        /// Whether the state machine ran it (false for a duplicate).
        executed: bool,
        /// The result.
        result: Result<Vec<u8>, Refusal>,
    },
    /// A session was evicted for capacity.
    Evicted {
        /// The session.
        session: u64,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Entry {
    header: Header,
    body: Option<Bytes>,
    durable: bool,
    canonical: bool,
    /// Held as a header alone in a slot that was damaged: the replica may have written
    /// and acknowledged a body there before the damage, so this header is never a
    /// nack (its vote lists the op as faulty) until a body is written again.
    after_damage: bool,
}

impl Entry {
    /// A committed op kept only as the chain's anchor: its body is on disk or covered
    /// by a checkpoint.
    fn anchor(header: Header) -> Box<Self> {
        Box::new(Self {
            header,
            body: None,
            durable: true,
            canonical: true,
            after_damage: false,
        })
    }
}

/// The status with the state that belongs to it: a view change's votes exist only
/// while it runs.
#[derive(Debug)]
enum Phase {
    /// As primary: the newest op of this view the preferred replica (view 0's primary)
    /// acknowledged, which [`Input::HandOff`] waits for. (Here, not in the replica: a
    /// field there would cost every idle group 8 bytes; this variant's room is free.)
    Normal {
        preferred_acked: u64,
    },
    /// Boxed: idle groups are normal, and the votes would cost each of them.
    ViewChange(Box<ViewChangeState>),
    Recovering,
}

/// What a view change collects.
#[derive(Debug, Default)]
struct ViewChangeState {
    /// Replicas that voted StartViewChange for this view (this one included).
    start_view_change_from: BTreeSet<ReplicaId>,
    /// The DoViewChange votes, at the new primary.
    do_view_change_from: BTreeMap<ReplicaId, ViewChangeVote>,
    /// This replica sent its DoViewChange.
    do_view_change_sent: bool,
    /// The new primary adopted the canonical log and waits for missing bodies.
    start_view_pending: bool,
}

/// A replica restarted untrusted, learning from its peers when it may trust its journal
/// again.
#[derive(Debug, Clone, Default)]
struct Rejoin {
    /// Drawn at the restart; its RequestViews carry it and only answers that echo it
    /// count (an answer to an older incarnation says nothing about what it lost).
    nonce: u64,
    /// It lost its disk (its views too), not only unsynced writes.
    views_lost: bool,
    /// Peer -> the view it said it is in.
    views: BTreeMap<ReplicaId, u64>,
    /// Set once a quorum of peers answered: the highest view among them. Every view
    /// that ever started had a quorum in it, which shares a member with them.
    trust_from: Option<u64>,
    /// (view, op) the normal primary of that view answered with, after the restart:
    /// every op this replica could have acknowledged in that view is at or below the
    /// op, so holding that view's log through it, it holds all it may have lost.
    primary_op: Option<(u64, u64)>,
}

/// A DoViewChange as the new primary keeps it.
#[derive(Debug, Clone)]
struct ViewChangeVote {
    log_view: u64,
    op: u64,
    commit: u64,
    commit_checksum: Option<Checksum>,
    suffix: Vec<SuffixEntry>,
    faulty: Vec<u64>,
    trusted_through: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Timer {
    /// Primary: send a commit heartbeat.
    Heartbeat = 0,
    /// Backup: the primary is silent; view change: this view is not coming; primary
    /// with ops in flight: nothing committed for too long (it steps down).
    ViewChange = 1,
    /// Resend what waits for answers (prepares, repairs, view change messages).
    Retry = 2,
}

const TIMERS: usize = 3;
/// Commit heartbeats an idle primary sends before it goes quiet.
const QUIET_AFTER_HEARTBEATS: u8 = 3;
/// Retries without progress before a stuck replica asks for a snapshot.
const STALLED_RETRIES_FOR_SNAPSHOT: u32 = 4;

/// One replica of one group.
#[derive(Debug)]
pub struct Replica<S> {
    config: Config,
    /// The status, holding what belongs to it (a view change's votes).
    phase: Phase,
    view: u64,
    log_view: u64,
    op: u64,
    commit_min: u64,
    commit_max: u64,
    durable: DurableState,
    /// Entries are boxed: an idle group keeps one, and a map's node has room for eleven.
    journal: OpMap<Box<Entry>>,
    /// Ops whose journal slot is damaged and whose header is unknown.
    faulty: Lazy<BTreeSet<u64>>,
    /// Expected checksums of ops not yet in the journal (commit anchors, parents).
    wanted: Lazy<BTreeMap<u64, Checksum>>,
    /// The op of the newest checkpoint written (or the root): the journal below it is
    /// pruned. Its header is not kept: only its op is ever read (112 bytes of every
    /// idle group).
    checkpoint_op: u64,
    state: ReplicatedState<S>,
    prepare_oks: Lazy<BTreeMap<u64, BTreeSet<ReplicaId>>>,
    /// The new primary sent its StartView.
    start_view_sent: bool,
    /// A primary's StartView carries headers from this op up: the lowest anchor of the
    /// votes that elected it, so every voter can link the new log to its own.
    start_view_anchor: u64,
    /// A backup that installed a StartView owes PrepareOks once its log view is durable.
    acks_owed: bool,
    /// Retries in a row during which nothing could be applied although ops are committed.
    stalled_retries: u32,
    commit_min_at_retry: u64,
    /// Entries at or below this op were dropped from memory by quiescence; they are on
    /// disk.
    compacted_through: u64,
    /// Backup: the highest commit its primary has told it in this view.
    heard_commit: u64,
    /// Backup: a client came here, so the primary may be gone; it stays awake (no
    /// quiescence) until its primary is heard from, and its view-change timer runs.
    watching: bool,
    /// Primary: commit heartbeats sent since it last had work; it goes quiet after a few,
    /// so every backup has heard the final commit.
    idle_heartbeats: u8,
    /// Restarted as the primary of its log view: it may have lost prepares it sent but
    /// had not synced, so it must never lead that view again. Its first step moves the
    /// group to the next view (as TigerBeetle's replica does on open).
    leave_log_view: bool,
    /// Restarted untrusted: what its peers answered since. One that lost its disk
    /// (untrusted from op 0) learns the oldest view it may regain trust in: its old log
    /// view is gone, so "normal in a newer view" alone proves nothing, the view it
    /// joins might predate views it once acknowledged ops in. Any learns its primary's
    /// op, so that it can trust again in the view it restarted in, which an idle group
    /// may never leave. Boxed: almost every replica never has one.
    rejoin: Option<Box<Rejoin>>,
    /// Outputs a restart owes, given at the first step.
    startup: Lazy<Vec<Output>>,
    /// Ops above this may have been acknowledged and lost (an untrusted journal after a
    /// restart): this replica's votes never nack them. `u64::MAX` when trusted.
    trusted_through: u64,
    /// The first step writes the durable state (a lowered `trusted_through`).
    persist_trust: bool,
    /// Given a newer view's log after a loss, but holding some of its ops above
    /// `trusted_through` as headers alone: ops it may have acknowledged before the
    /// loss, which its votes must not nack. Trusted once every one has its body
    /// written here ([`Replica::trust_once_whole`]).
    trust_waits_for_bodies: bool,
    ignored: Lazy<IgnoredCounts>,
    /// Times this replica stepped down as a primary whose prepares committed nothing.
    step_downs: u32,
    deadlines: Deadlines,
    now: u64,
    prng: u64,
}

fn splitmix(state: &mut u64) -> u64 {
    // SplitMix64: a tiny, fixed PRNG, so a seed means the same run on every build.
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

impl<S: StateMachine> Replica<S> {
    /// A replica of a new group: an empty log at the root op, view 0.
    ///
    /// # Errors
    /// The config cannot run.
    pub fn new(config: Config, machine: S) -> Result<Self, ConfigError> {
        config.validate()?;
        let root = Header::root(config.group);
        let mut replica = Self::blank(config, machine, root.op);
        replica.journal.insert(
            0,
            Box::new(Entry {
                header: root,
                body: Some(Bytes::new()),
                durable: true,
                canonical: true,
                after_damage: false,
            }),
        );
        replica.phase = Phase::Normal { preferred_acked: 0 };
        replica.arm_status_timers();
        Ok(replica)
    }

    fn blank(config: Config, machine: S, checkpoint_op: u64) -> Self {
        Self {
            config,
            phase: Phase::Recovering,
            view: 0,
            log_view: 0,
            op: 0,
            commit_min: 0,
            commit_max: 0,
            durable: DurableState::default(),
            journal: OpMap::new(),
            faulty: Lazy::default(),
            wanted: Lazy::default(),
            checkpoint_op,
            state: ReplicatedState::new(machine, config.sessions_max),
            prepare_oks: Lazy::default(),
            start_view_sent: false,
            start_view_anchor: 0,
            acks_owed: false,
            stalled_retries: 0,
            commit_min_at_retry: 0,
            compacted_through: 0,
            heard_commit: 0,
            watching: false,
            idle_heartbeats: 0,
            leave_log_view: false,
            rejoin: None,
            startup: Lazy::default(),
            trusted_through: u64::MAX,
            persist_trust: false,
            trust_waits_for_bodies: false,
            ignored: Lazy::default(),
            step_downs: 0,
            deadlines: Deadlines::NONE,
            now: 0,
            prng: config.seed ^ (u64::from(config.replica) << 56) ^ config.group,
        }
    }

    /// A replica restarted from what it persisted: its durable state, its latest
    /// checkpoint, and its journal as read back.
    /// It starts `Recovering` and rejoins once it learns the current view.
    ///
    /// # Errors
    /// The config cannot run, or the checkpoint is damaged or does not decode.
    pub fn restart(config: Config, machine: S, persisted: Persisted) -> Result<Self, StartError> {
        let Persisted {
            durable,
            checkpoint,
            journal,
            journal_trusted,
        } = persisted;
        config.validate()?;
        let root = Header::root(config.group);
        if let Some(checkpoint) = &checkpoint {
            if !checkpoint.valid() || checkpoint.header.group != config.group {
                return Err(StartError::CheckpointDamaged {
                    group: config.group,
                    op: checkpoint.header.op,
                });
            }
        }
        let checkpoint_header = checkpoint.as_ref().map_or(root, |c| c.header);
        let mut replica = Self::blank(config, machine, checkpoint_header.op);
        if let Some(checkpoint) = &checkpoint {
            replica.state.restore(&checkpoint.state).map_err(|reason| {
                StartError::CheckpointState {
                    group: config.group,
                    reason,
                }
            })?;
        }
        replica.view = durable.view;
        replica.log_view = durable.log_view;
        replica.durable = durable;
        replica.trusted_through = durable.journal_trusted_through;
        if !journal_trusted {
            // Writes acknowledged before they were synced may be gone: only what is known
            // committed is certain (and even that may need repair). Votes say so until
            // this replica is normal in a view newer than this log view; the first step
            // persists it, so a later process crash keeps it.
            let known = durable.commit.max(checkpoint_header.op);
            replica.trusted_through = replica.trusted_through.min(known);
            replica.persist_trust = replica.trusted_through != durable.journal_trusted_through;
        }
        if (durable.views_lost || replica.trusted_through != u64::MAX) && config.replica_count > 1 {
            let nonce = splitmix(&mut replica.prng);
            replica.rejoin = Some(Box::new(Rejoin {
                nonce,
                views_lost: durable.views_lost,
                ..Rejoin::default()
            }));
        }
        replica.commit_min = checkpoint_header.op;
        replica.commit_max = durable.commit.max(checkpoint_header.op);
        replica
            .journal
            .insert(checkpoint_header.op, Entry::anchor(checkpoint_header));
        for (op, slot) in journal {
            if op <= checkpoint_header.op {
                continue;
            }
            match slot {
                // A slot of another group (a misdirected write can put one there,
                // whole and checksummed) is damage like any other.
                JournalSlot::Prepare(prepare)
                    if prepare.valid()
                        && prepare.header.op == op
                        && prepare.header.group == config.group =>
                {
                    replica.journal.insert(
                        op,
                        Box::new(Entry {
                            header: prepare.header,
                            body: Some(prepare.body),
                            durable: true,
                            canonical: false,
                            after_damage: false,
                        }),
                    );
                }
                JournalSlot::Header(header)
                    if header.valid() && header.op == op && header.group == config.group =>
                {
                    replica.journal.insert(
                        op,
                        Box::new(Entry {
                            header,
                            body: None,
                            durable: true,
                            canonical: false,
                            after_damage: false,
                        }),
                    );
                }
                _ => {
                    replica.faulty.insert(op);
                }
            }
        }
        // A lone replica cannot survive damage to entries it acknowledged: there is no
        // other copy.
        if config.replica_count == 1 {
            // A lone replica commits an op only once it and every op below it are
            // durable, and replies only then: everything above the first hole, damaged
            // slot or broken link of the chain from its checkpoint was never
            // acknowledged (writes complete out of order), so it is cut.
            let mut top = checkpoint_header.op;
            let mut parent = checkpoint_header.checksum;
            while let Some(above) = replica.journal.get(&(top + 1)) {
                if above.header.parent != parent || above.body.is_none() {
                    break;
                }
                parent = above.header.checksum;
                top += 1;
            }
            if replica.journal.keys().next_back().is_some_and(|o| *o > top)
                || replica.faulty.iter().next_back().is_some_and(|o| *o > top)
            {
                replica.startup.push(Output::TruncateJournal { op: top });
            }
            replica.journal.retain(|o, _| *o <= top);
            replica.faulty.clear();
        }
        let highest = replica.journal.keys().next_back().copied().unwrap_or(0);
        replica.op = highest.max(replica.faulty.iter().next_back().copied().unwrap_or(0));
        // Entries up to the durable commit are committed; mark what the chain proves.
        replica.phase = Phase::Recovering;
        replica.leave_log_view = config.replica_count > 1
            && durable.view == durable.log_view
            && replica.primary_of(durable.log_view) == config.replica;
        replica.arm(Timer::Retry, config.retry_ticks);
        let timeout = replica.view_change_timeout();
        replica.arm(Timer::ViewChange, timeout);
        Ok(replica)
    }

    // ---- getters ------------------------------------------------------------------

    /// The config.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The status.
    pub fn status(&self) -> Status {
        match self.phase {
            Phase::Normal { .. } => Status::Normal,
            Phase::ViewChange(_) => Status::ViewChange,
            Phase::Recovering => Status::Recovering,
        }
    }

    /// The current view.
    pub fn view(&self) -> u64 {
        self.view
    }

    /// The highest op in the journal.
    pub fn op(&self) -> u64 {
        self.op
    }

    /// The highest op applied.
    pub fn commit_min(&self) -> u64 {
        self.commit_min
    }

    /// The highest op known committed.
    pub fn commit_max(&self) -> u64 {
        self.commit_max
    }

    /// The latest view in which this replica's log was the view's log (it was normal
    /// in it, or took its StartView).
    pub fn log_view(&self) -> u64 {
        self.log_view
    }

    /// Whether this replica's journal is trusted: false after a restart that may have
    /// lost acknowledged writes, until it is normal in a newer view or holds its own
    /// view's log through the op its primary answered with after the restart.
    pub fn journal_trusted(&self) -> bool {
        self.trusted_through == u64::MAX
    }

    /// Messages ignored so far, by reason.
    pub fn ignored(&self) -> IgnoredCounts {
        *self.ignored
    }

    /// Times this replica stepped down as a primary whose prepares committed nothing
    /// for twice [`Config::view_change_ticks`].
    pub fn step_downs(&self) -> u32 {
        self.step_downs
    }

    /// The replicated state.
    pub fn state(&self) -> &ReplicatedState<S> {
        &self.state
    }

    /// The primary of a view: `(view + group) mod replica_count`.
    pub fn primary_of(&self, view: u64) -> ReplicaId {
        primary_of(self.config.group, view, self.config.replica_count)
    }

    /// Whether [`Input::HandOff`] would move the group now: this replica is its primary
    /// but not its preferred one, nothing is in flight, and the preferred replica
    /// acknowledged the newest op of this view.
    pub fn may_hand_off(&self) -> bool {
        self.is_primary()
            && self.primary_of(0) != self.config.replica
            && self.commit_max == self.op
            && matches!(self.phase, Phase::Normal { preferred_acked } if preferred_acked == self.op)
            && self.view_durable()
    }

    /// Whether this replica is the primary of its view in normal status.
    pub fn is_primary(&self) -> bool {
        self.status() == Status::Normal && self.primary_of(self.view) == self.config.replica
    }

    /// Whether a request sent now is prepared (not dropped): the primary, its view on
    /// disk, its pipeline not full.
    pub fn takes_requests(&self) -> bool {
        self.is_primary()
            && self.view_durable()
            && self.op - self.commit_max < self.config.pipeline_max
    }

    /// After a restart with an untrusted journal, the durable state that says so
    /// (its first step writes it). A host whose open repaired away the evidence of the
    /// distrust (a lost journal, a cut tail) writes it at once: until it is durable, a
    /// power loss would restart the replica trusted.
    pub fn distrust_to_persist(&self) -> Option<DurableState> {
        self.persist_trust.then(|| self.durable_state())
    }

    /// The earliest tick at which a timer fires.
    pub fn next_deadline(&self) -> Option<u64> {
        self.deadlines.earliest()
    }

    /// What the journal holds at `op`: (checksum, body present, canonical).
    pub fn entry_state(&self, op: u64) -> Option<(Checksum, bool, bool)> {
        self.journal
            .get(&op)
            .map(|e| (e.header.checksum, e.body.is_some(), e.canonical))
    }

    /// Journal entries held in memory.
    pub fn journal_len(&self) -> usize {
        self.journal.len()
    }

    /// The header of `op` in the journal, if present.
    pub fn header(&self, op: u64) -> Option<&Header> {
        self.journal.get(&op).map(|e| &e.header)
    }

    // ---- input --------------------------------------------------------------------

    /// Takes one input; appends what to do to `out`. `now` must not go backwards.
    pub fn step(&mut self, now: u64, input: Input, out: &mut Vec<Output>) {
        debug_assert!(now >= self.now, "time went backwards");
        self.now = now.max(self.now);
        let before = self.progress();
        self.startup.if_boxed(|startup| out.append(startup));
        self.startup.settle();
        if std::mem::take(&mut self.persist_trust) {
            self.write_state(out);
        }
        if self.leave_log_view {
            self.leave_log_view = false;
            self.start_view_change(self.view + 1, out);
        }
        match input {
            Input::Tick => self.on_tick(out),
            Input::JournalWritten { op, checksum } => self.on_journal_written(op, checksum, out),
            Input::StateWritten(state) => self.on_state_written(state, out),
            Input::PeerLost(peer) => {
                if !self.is_primary() && self.primary_of(self.view) == peer {
                    self.start_watching();
                }
            }
            Input::Message(message) => self.on_message(message, out),
            Input::HandOff => self.hand_off(out),
        }
        self.settle_timers();
        self.check_progress(before);
        self.check_invariants();
    }

    /// The commit heartbeat a quiescent primary's node sends now and then, batched with
    /// those of its other groups: it wakes a backup that missed the final commits.
    /// `None` unless this replica is a primary with a durable view.
    pub fn commit_heartbeat(&self) -> Option<Message> {
        if !self.is_primary() || !self.view_durable() {
            return None;
        }
        let checksum = self.journal.get(&self.commit_max)?.header.checksum;
        Some(Message::Commit {
            view: self.view,
            commit: self.commit_max,
            checksum,
            from: self.config.replica,
        })
    }

    /// Ops at or below this are not walked in memory: covered by a checkpoint or
    /// compacted to disk.
    fn floor(&self) -> u64 {
        self.checkpoint_op.max(self.compacted_through)
    }

    // ---- helpers ------------------------------------------------------------------

    fn others(&self) -> Vec<ReplicaId> {
        (0..self.config.replica_count)
            .filter(|r| *r != self.config.replica)
            .collect()
    }

    fn send_to_others(&self, message: Message, out: &mut Vec<Output>) {
        for to in self.others() {
            out.push(Output::Send {
                to,
                message: message.clone(),
            });
        }
    }

    fn prepare_at(&self, op: u64) -> Option<Prepare> {
        let entry = self.journal.get(&op)?;
        Some(Prepare {
            header: entry.header,
            body: entry.body.clone()?,
        })
    }

    /// The durable state as this replica stands.
    fn durable_state(&self) -> DurableState {
        DurableState {
            view: self.view,
            log_view: self.log_view,
            commit: self.commit_max,
            journal_trusted_through: self.trusted_through,
            views_lost: self.views_lost(),
        }
    }

    fn write_state(&mut self, out: &mut Vec<Output>) {
        let state = self.durable_state();
        if state != self.durable {
            out.push(Output::WriteState(state));
        }
    }

    /// Whether messages of the current view may go out: its view and log view are on disk.
    fn view_durable(&self) -> bool {
        self.durable.view == self.view
            && (self.status() != Status::Normal || self.durable.log_view == self.log_view)
    }

    fn insert_entry(
        &mut self,
        header: Header,
        body: Option<Bytes>,
        canonical: bool,
        out: &mut Vec<Output>,
    ) {
        let durable = match &body {
            Some(body) => {
                out.push(Output::WriteJournal(Prepare {
                    header,
                    body: body.clone(),
                }));
                false
            }
            None => {
                out.push(Output::WriteHeader(header));
                false
            }
        };
        // A header alone over a damaged slot (or over such a header) stays "perhaps
        // acknowledged"; a body written there ends it.
        let after_damage = body.is_none()
            && (self.faulty.contains(&header.op)
                || self.journal.get(&header.op).is_some_and(|e| e.after_damage));
        self.faulty.if_boxed(|f| {
            f.remove(&header.op);
        });
        self.wanted.if_boxed(|w| {
            w.remove(&header.op);
        });
        self.journal.insert(
            header.op,
            Box::new(Entry {
                header,
                body,
                durable,
                canonical,
                after_damage,
            }),
        );
        self.op = self.op.max(header.op);
    }
}

mod clients;
mod config;
mod dispatch;
mod invariants;
mod normal;
mod repair;
mod timers;
mod view_change;

use timers::Deadlines;

#[cfg(test)]
mod tests;
