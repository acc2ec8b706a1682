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

use crate::durable::{Checkpoint, DurableState};
use crate::message::{
    Checksum, Header, Message, Operation, Prepare, Refusal, ReplicaId, Reply, Request, SuffixEntry,
};
use crate::state::{ReplicatedState, StateMachine};

/// Settings of a replica. All replicas of a group use the same.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Config {
    /// The group id.
    pub group: u64,
    /// This replica.
    pub replica: ReplicaId,
    /// Replicas in the group (1, 3 or 5 typically).
    pub replica_count: u8,
    /// Most uncommitted ops the primary keeps in flight.
    pub pipeline_max: u64,
    /// A checkpoint (state snapshot) every this many applied ops.
    pub checkpoint_interval: u64,
    /// Ops kept in the journal below the latest checkpoint, for peers to repair from.
    pub journal_keep: u64,
    /// Most client sessions; the least recently used is evicted beyond it.
    pub sessions_max: usize,
    /// The primary sends a commit heartbeat this often.
    pub heartbeat_ticks: u64,
    /// A backup that hears nothing from its primary for this long starts a view change
    /// (plus jitter up to the same again).
    pub view_change_ticks: u64,
    /// Resend prepares, requests for repairs and view change messages this often.
    pub retry_ticks: u64,
    /// Seed of the jitter.
    pub seed: u64,
    /// When the group is idle (everything committed and applied), drop every timer and
    /// every journal entry but the commit anchor from memory: thousands of idle groups
    /// then cost little and wake only on a message. Bodies dropped are served from the
    /// journal on disk ([`Output::SendFromJournal`]).
    pub quiesce: bool,
}

impl Config {
    /// A config with test-friendly timings.
    pub fn new(group: u64, replica: ReplicaId, replica_count: u8, seed: u64) -> Self {
        Self {
            group,
            replica,
            replica_count,
            pipeline_max: 8,
            checkpoint_interval: 64,
            journal_keep: 64,
            sessions_max: 16,
            heartbeat_ticks: 10,
            view_change_ticks: 50,
            retry_ticks: 15,
            seed,
            quiesce: false,
        }
    }

    /// Replicas that make a quorum.
    pub fn quorum(&self) -> usize {
        usize::from(self.replica_count) / 2 + 1
    }

    /// Checks that the settings can run.
    ///
    /// # Errors
    /// The first setting out of its range.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let fail = |setting: &'static str, rule: &'static str| {
            Err(ConfigError {
                setting,
                rule,
                group: self.group,
            })
        };
        if self.replica_count == 0 || self.replica_count > REPLICAS_MAX {
            return fail("replica_count", "1 to 16 replicas");
        }
        if self.replica >= self.replica_count {
            return fail("replica", "below replica_count");
        }
        if self.pipeline_max == 0 {
            return fail("pipeline_max", "at least 1");
        }
        if self.checkpoint_interval == 0 {
            return fail("checkpoint_interval", "at least 1");
        }
        if self.journal_keep < self.checkpoint_interval {
            // A damaged newest checkpoint falls back to the one before it, whose ops
            // above it the journal must still hold.
            return fail("journal_keep", "at least checkpoint_interval");
        }
        if self.sessions_max == 0 {
            return fail("sessions_max", "at least 1");
        }
        if self.heartbeat_ticks == 0 || self.retry_ticks == 0 {
            return fail("heartbeat_ticks, retry_ticks", "at least 1 tick");
        }
        if self.view_change_ticks <= self.heartbeat_ticks {
            // A backup must hear several heartbeats before it gives up on the primary.
            return fail("view_change_ticks", "above heartbeat_ticks");
        }
        Ok(())
    }
}

/// Most replicas in one group: a quorum of more is never worth its latency.
pub const REPLICAS_MAX: u8 = 16;

/// A [`Config`] setting out of its range.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("group {group}: {setting} must be {rule}")]
pub struct ConfigError {
    /// The setting.
    pub setting: &'static str,
    /// What it must be.
    pub rule: &'static str,
    /// The group.
    pub group: u64,
}

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
    /// Persist a checkpoint (before pruning the journal below it).
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
    body: Option<Vec<u8>>,
    durable: bool,
    canonical: bool,
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
        })
    }
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
    /// Backup: the primary is silent; view change: this view is not coming.
    ViewChange = 1,
    /// Resend what waits for answers (prepares, repairs, view change messages).
    Retry = 2,
}

const TIMERS: usize = 3;
/// Commit heartbeats an idle primary sends before it goes quiet.
const QUIET_AFTER_HEARTBEATS: u32 = 3;
/// Retries without progress before a stuck replica asks for a snapshot.
const STALLED_RETRIES_FOR_SNAPSHOT: u32 = 4;

/// One replica of one group.
#[derive(Debug)]
pub struct Replica<S> {
    config: Config,
    status: Status,
    view: u64,
    log_view: u64,
    op: u64,
    commit_min: u64,
    commit_max: u64,
    durable: DurableState,
    /// Entries are boxed: an idle group keeps one, and a map's node has room for eleven.
    journal: BTreeMap<u64, Box<Entry>>,
    /// Ops whose journal slot is damaged and whose header is unknown.
    faulty: BTreeSet<u64>,
    /// Expected checksums of ops not yet in the journal (commit anchors, parents).
    wanted: BTreeMap<u64, Checksum>,
    checkpoint: Header,
    state: ReplicatedState<S>,
    prepare_oks: BTreeMap<u64, BTreeSet<ReplicaId>>,
    svc_votes: BTreeSet<ReplicaId>,
    dvc_votes: BTreeMap<ReplicaId, ViewChangeVote>,
    dvc_sent: bool,
    /// The new primary adopted the canonical log and waits for missing bodies.
    start_view_pending: bool,
    /// The new primary sent its StartView.
    start_view_sent: bool,
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
    /// Primary: commit heartbeats sent since it last had work; it goes quiet after a few,
    /// so every backup has heard the final commit.
    idle_heartbeats: u32,
    /// Restarted as the primary of its log view: it may have lost prepares it sent but
    /// had not synced, so it must never lead that view again. Its first step moves the
    /// group to the next view (as TigerBeetle's replica does on open).
    leave_log_view: bool,
    /// Outputs a restart owes, given at the first step.
    startup: Vec<Output>,
    /// Ops above this may have been acknowledged and lost (an untrusted journal after a
    /// restart): this replica's votes never nack them. `u64::MAX` when trusted.
    trusted_through: u64,
    /// The first step writes the durable state (a lowered `trusted_through`).
    persist_trust: bool,
    ignored: IgnoredCounts,
    deadlines: [Option<u64>; TIMERS],
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
        let mut replica = Self::blank(config, machine, root);
        replica.journal.insert(
            0,
            Box::new(Entry {
                header: root,
                body: Some(Vec::new()),
                durable: true,
                canonical: true,
            }),
        );
        replica.status = Status::Normal;
        replica.arm_status_timers();
        Ok(replica)
    }

    fn blank(config: Config, machine: S, checkpoint: Header) -> Self {
        Self {
            config,
            status: Status::Recovering,
            view: 0,
            log_view: 0,
            op: 0,
            commit_min: 0,
            commit_max: 0,
            durable: DurableState::default(),
            journal: BTreeMap::new(),
            faulty: BTreeSet::new(),
            wanted: BTreeMap::new(),
            checkpoint,
            state: ReplicatedState::new(machine, config.sessions_max),
            prepare_oks: BTreeMap::new(),
            svc_votes: BTreeSet::new(),
            dvc_votes: BTreeMap::new(),
            dvc_sent: false,
            start_view_pending: false,
            start_view_sent: false,
            acks_owed: false,
            stalled_retries: 0,
            commit_min_at_retry: 0,
            compacted_through: 0,
            heard_commit: 0,
            idle_heartbeats: 0,
            leave_log_view: false,
            startup: Vec::new(),
            trusted_through: u64::MAX,
            persist_trust: false,
            ignored: IgnoredCounts::default(),
            deadlines: [None; TIMERS],
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
        let mut replica = Self::blank(config, machine, checkpoint_header);
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
                JournalSlot::Prepare(prepare) if prepare.valid() && prepare.header.op == op => {
                    replica.journal.insert(
                        op,
                        Box::new(Entry {
                            header: prepare.header,
                            body: Some(prepare.body),
                            durable: true,
                            canonical: false,
                        }),
                    );
                }
                JournalSlot::Header(header) if header.valid() && header.op == op => {
                    replica.journal.insert(
                        op,
                        Box::new(Entry {
                            header,
                            body: None,
                            durable: true,
                            canonical: false,
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
        replica.status = Status::Recovering;
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
        self.status
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

    /// Whether this replica's journal is trusted: false after a restart that may have
    /// lost acknowledged writes, until it is normal in a newer view.
    pub fn journal_trusted(&self) -> bool {
        self.trusted_through == u64::MAX
    }

    /// Messages ignored so far, by reason.
    pub fn ignored(&self) -> IgnoredCounts {
        self.ignored
    }

    /// The replicated state.
    pub fn state(&self) -> &ReplicatedState<S> {
        &self.state
    }

    /// The primary of a view: `(view + group) mod replica_count`.
    pub fn primary_of(&self, view: u64) -> ReplicaId {
        ((view + self.config.group) % u64::from(self.config.replica_count)) as ReplicaId
    }

    /// Whether this replica is the primary of its view in normal status.
    pub fn is_primary(&self) -> bool {
        self.status == Status::Normal && self.primary_of(self.view) == self.config.replica
    }

    /// The earliest tick at which a timer fires.
    pub fn next_deadline(&self) -> Option<u64> {
        self.deadlines.iter().flatten().min().copied()
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
        out.append(&mut self.startup);
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
            Input::Message(message) => self.on_message(message, out),
        }
        self.settle_timers();
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

    /// Whether nothing is in flight: everything prepared is committed and applied,
    /// nothing is missing, and the view is durable.
    pub fn is_idle(&self) -> bool {
        self.status == Status::Normal
            && self.op == self.commit_max
            && self.commit_min == self.commit_max
            && self.wanted.is_empty()
            && self.faulty.is_empty()
            && self.view_durable()
            && !self.acks_owed
            && self.prepare_oks.is_empty()
            && (!self.is_primary() || self.start_view_sent || self.view == 0)
            && self.journal.values().all(|e| e.durable && e.canonical)
    }

    /// Idle, and sure its peers know it: a primary has sent its final commit a few
    /// times; a backup has heard that commit reach its op.
    fn may_quiesce(&self) -> bool {
        self.config.quiesce
            && self.is_idle()
            && if self.is_primary() {
                self.idle_heartbeats >= QUIET_AFTER_HEARTBEATS
            } else {
                self.heard_commit >= self.op
            }
    }

    /// After each input: a quiescing idle replica drops its timers and compacts its
    /// journal to the commit anchor; a busy one has the timers its status needs.
    fn settle_timers(&mut self) {
        if self.may_quiesce() {
            self.deadlines = [None; TIMERS];
            if self.journal.len() > 1 {
                let anchor = self.journal.get(&self.commit_min).map(|e| e.header);
                if let Some(header) = anchor {
                    self.journal.clear();
                    self.journal.insert(header.op, Entry::anchor(header));
                    self.compacted_through = header.op;
                }
            }
            return;
        }
        let needs = |timer: Timer, replica: &Self| replica.deadlines[timer as usize].is_none();
        if needs(Timer::Retry, self) {
            self.arm(Timer::Retry, self.config.retry_ticks);
        }
        if self.is_primary() {
            if needs(Timer::Heartbeat, self) {
                self.arm(Timer::Heartbeat, self.config.heartbeat_ticks);
            }
        } else if needs(Timer::ViewChange, self) {
            let timeout = self.view_change_timeout();
            self.arm(Timer::ViewChange, timeout);
        }
    }

    /// Ops at or below this are not walked in memory: covered by a checkpoint or
    /// compacted to disk.
    fn floor(&self) -> u64 {
        self.checkpoint.op.max(self.compacted_through)
    }

    /// Whether a message must be dropped before any handler sees it: a sender outside
    /// the group (or posing as this replica), another group's prepare or snapshot, a
    /// damaged one, or a view-scoped message from a replica that does not lead that view.
    /// Every drop is counted. Without this a stray id would count toward a quorum.
    fn ignore_message(&mut self, message: &Message) -> bool {
        if let Some(from) = message.from() {
            if from >= self.config.replica_count || from == self.config.replica {
                self.ignored.foreign_sender += 1;
                return true;
            }
        }
        let (group, intact) = match message {
            Message::Prepare(prepare) => (prepare.header.group, prepare.valid()),
            Message::Snapshot { checkpoint, .. } => (checkpoint.header.group, checkpoint.valid()),
            Message::DoViewChange { suffix, .. } | Message::StartView { suffix, .. } => (
                suffix.first().map_or(self.config.group, |e| e.header.group),
                suffix.iter().all(|e| {
                    e.header.valid()
                        && e.header.group == self.config.group
                        && e.body
                            .as_ref()
                            .is_none_or(|b| crate::message::checksum(b) == e.header.body_checksum)
                }),
            ),
            _ => (self.config.group, true),
        };
        if group != self.config.group {
            self.ignored.wrong_group += 1;
            return true;
        }
        if !intact {
            self.ignored.damaged += 1;
            return true;
        }
        let leads = |view: u64, from: ReplicaId| self.primary_of(view) == from;
        let from_primary = match message {
            Message::Commit { view, from, .. } | Message::StartView { view, from, .. } => {
                leads(*view, *from)
            }
            _ => true,
        };
        if !from_primary {
            self.ignored.not_from_primary += 1;
            return true;
        }
        false
    }

    fn on_message(&mut self, message: Message, out: &mut Vec<Output>) {
        if self.ignore_message(&message) {
            return;
        }
        match message {
            Message::Request(request) => self.on_request(request, out),
            Message::Prepare(prepare) => self.on_prepare(prepare, out),
            Message::PrepareOk {
                view,
                op,
                checksum,
                from,
            } => self.on_prepare_ok(view, op, checksum, from, out),
            Message::Commit {
                view,
                commit,
                checksum,
                from,
            } => self.on_commit(view, commit, checksum, from, out),
            Message::StartViewChange { view, from } => self.on_start_view_change(view, from, out),
            Message::DoViewChange {
                view,
                log_view,
                op,
                commit,
                commit_checksum,
                suffix,
                faulty,
                trusted_through,
                from,
            } => {
                let vote = ViewChangeVote {
                    log_view,
                    op,
                    commit,
                    commit_checksum,
                    suffix,
                    faulty,
                    trusted_through,
                };
                self.on_do_view_change(view, from, vote, out);
            }
            Message::StartView {
                view,
                op,
                commit,
                suffix,
                from,
            } => self.on_start_view(view, op, commit, suffix, from, out),
            Message::RequestPrepare { op, checksum, from } => {
                self.on_request_prepare(op, checksum, from, out)
            }
            Message::RequestStartView { view, from } => self.on_request_start_view(view, from, out),
            Message::RequestSnapshot { from } => self.on_request_snapshot(from, out),
            Message::Snapshot { checkpoint, from } => self.on_snapshot(checkpoint, from, out),
        }
    }

    // ---- timers -------------------------------------------------------------------

    fn arm(&mut self, timer: Timer, ticks: u64) {
        self.deadlines[timer as usize] = Some(self.now + ticks.max(1));
    }

    fn view_change_timeout(&mut self) -> u64 {
        let base = self.config.view_change_ticks;
        base + splitmix(&mut self.prng) % base.max(1)
    }

    fn arm_status_timers(&mut self) {
        self.deadlines = [None; TIMERS];
        if self.is_primary() {
            self.arm(Timer::Heartbeat, self.config.heartbeat_ticks);
        }
        let timeout = self.view_change_timeout();
        if !self.is_primary() {
            self.arm(Timer::ViewChange, timeout);
        }
        self.arm(Timer::Retry, self.config.retry_ticks);
    }

    fn on_tick(&mut self, out: &mut Vec<Output>) {
        let now = self.now;
        let due = |d: Option<u64>| d.is_some_and(|d| d <= now);
        if due(self.deadlines[Timer::Heartbeat as usize]) {
            self.arm(Timer::Heartbeat, self.config.heartbeat_ticks);
            if self.is_primary() {
                self.send_commit(out);
                if self.is_idle() {
                    self.idle_heartbeats = self.idle_heartbeats.saturating_add(1);
                } else {
                    self.idle_heartbeats = 0;
                }
            }
        }
        if due(self.deadlines[Timer::ViewChange as usize]) {
            let timeout = self.view_change_timeout();
            self.arm(Timer::ViewChange, timeout);
            match self.status {
                Status::Normal if !self.is_primary() => self.start_view_change(self.view + 1, out),
                Status::ViewChange => self.start_view_change(self.view + 1, out),
                // Nobody answered with a StartView of our view (its primary may be us,
                // or that view never started): move the group to a newer one.
                Status::Recovering => self.start_view_change(self.view + 1, out),
                _ => {}
            }
        }
        if due(self.deadlines[Timer::Retry as usize]) {
            self.arm(Timer::Retry, self.config.retry_ticks);
            self.retry(out);
        }
    }

    /// Resends whatever waits for an answer.
    fn retry(&mut self, out: &mut Vec<Output>) {
        match self.status {
            Status::Normal if self.is_primary() => {
                // Prepares not yet acknowledged by a quorum.
                let waiting: Vec<u64> = ((self.commit_max + 1)..=self.op).collect();
                for op in waiting {
                    if let Some(prepare) = self.prepare_at(op) {
                        let acked = self.prepare_oks.get(&op).cloned().unwrap_or_default();
                        for to in self.others() {
                            if !acked.contains(&to) {
                                out.push(Output::Send {
                                    to,
                                    message: Message::Prepare(prepare.clone()),
                                });
                            }
                        }
                    }
                }
                self.repair(out);
            }
            Status::Normal => self.repair(out),
            Status::ViewChange => {
                self.send_start_view_change(out);
                if self.dvc_sent {
                    self.send_do_view_change(out);
                }
                if self.start_view_pending {
                    self.repair_view_change(out);
                }
            }
            Status::Recovering => {
                let to = self.primary_of(self.view);
                let message = Message::RequestStartView {
                    view: self.view,
                    from: self.config.replica,
                };
                if to == self.config.replica {
                    self.send_to_others(message, out);
                } else {
                    out.push(Output::Send { to, message });
                }
            }
        }
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

    /// Asks every peer for the prepare at `op` with `checksum`.
    fn request_prepare(&self, op: u64, checksum: Checksum, out: &mut Vec<Output>) {
        let message = Message::RequestPrepare {
            op,
            checksum,
            from: self.config.replica,
        };
        self.send_to_others(message, out);
    }

    fn prepare_at(&self, op: u64) -> Option<Prepare> {
        let entry = self.journal.get(&op)?;
        Some(Prepare {
            header: entry.header,
            body: entry.body.clone()?,
        })
    }

    fn write_state(&mut self, out: &mut Vec<Output>) {
        let state = DurableState {
            view: self.view,
            log_view: self.log_view,
            commit: self.commit_max,
            journal_trusted_through: self.trusted_through,
        };
        if state != self.durable {
            out.push(Output::WriteState(state));
        }
    }

    /// Whether messages of the current view may go out: its view and log view are on disk.
    fn view_durable(&self) -> bool {
        self.durable.view == self.view
            && (self.status != Status::Normal || self.durable.log_view == self.log_view)
    }

    fn insert_entry(
        &mut self,
        header: Header,
        body: Option<Vec<u8>>,
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
        self.faulty.remove(&header.op);
        self.wanted.remove(&header.op);
        self.journal.insert(
            header.op,
            Box::new(Entry {
                header,
                body,
                durable,
                canonical,
            }),
        );
        self.op = self.op.max(header.op);
    }

    /// Marks entries below a canonical one canonical while the parent chain holds, and
    /// records what is missing.
    fn propagate_canonical(&mut self) {
        let Some((&top, _)) = self.journal.iter().rev().find(|(_, e)| e.canonical) else {
            return;
        };
        let mut op = top;
        while op > self.floor() {
            let Some(parent) = self.journal.get(&op).map(|e| e.header.parent) else {
                break;
            };
            match self.journal.get_mut(&(op - 1)) {
                Some(below) if below.header.checksum == parent => {
                    below.canonical = true;
                }
                _ => {
                    self.wanted.insert(op - 1, parent);
                    break;
                }
            }
            op -= 1;
        }
    }

    fn record_anchor(&mut self, op: u64, checksum: Checksum) {
        let floor = self.floor();
        match self.journal.get_mut(&op) {
            Some(entry) if entry.header.checksum == checksum => entry.canonical = true,
            // The primary of this view says op is committed with another checksum than
            // the one this view already pinned here: two histories, an agreement bug.
            Some(entry) if entry.canonical => panic!(
                "group {} replica {}: commit anchor {checksum:x} at op {op} contradicts canonical entry {:x} (view {})",
                self.config.group, self.config.replica, entry.header.checksum, self.view
            ),
            _ if op > floor => {
                self.wanted.insert(op, checksum);
            }
            _ => {}
        }
    }

    /// Asks every other replica for the canonical entries this replica lacks.
    fn repair(&mut self, out: &mut Vec<Output>) {
        self.propagate_canonical();
        let mut asked = 0;
        let wanted: Vec<(u64, Checksum)> = self.wanted.iter().map(|(o, c)| (*o, *c)).collect();
        for (op, checksum) in wanted {
            if op <= self.commit_min || asked >= 8 {
                continue;
            }
            asked += 1;
            self.request_prepare(op, checksum, out);
        }
        // Canonical entries whose bodies are missing.
        let missing: Vec<(u64, Checksum)> = self
            .journal
            .iter()
            .filter(|(op, e)| e.canonical && e.body.is_none() && **op > self.commit_min)
            .map(|(op, e)| (*op, e.header.checksum))
            .take(8)
            .collect();
        for (op, checksum) in missing {
            self.request_prepare(op, checksum, out);
        }
        // Repairs that make no progress: peers may have pruned what is missing (they
        // moved on to a checkpoint). Ask for their state instead.
        if self.commit_min < self.commit_max && self.commit_min == self.commit_min_at_retry {
            self.stalled_retries += 1;
        } else {
            self.stalled_retries = 0;
        }
        self.commit_min_at_retry = self.commit_min;
        if self.stalled_retries >= STALLED_RETRIES_FOR_SNAPSHOT {
            self.stalled_retries = 0;
            self.send_to_others(
                Message::RequestSnapshot {
                    from: self.config.replica,
                },
                out,
            );
        }
    }

    // ---- normal operation ---------------------------------------------------------

    fn on_request(&mut self, request: Request, out: &mut Vec<Output>) {
        if !self.is_primary() || !self.view_durable() {
            // A client that came to a backup could not reach the primary: if this
            // replica was quiescent, it starts watching the primary again.
            if self.status == Status::Normal && self.deadlines[Timer::ViewChange as usize].is_none()
            {
                let timeout = self.view_change_timeout();
                self.arm(Timer::ViewChange, timeout);
            }
            return;
        }
        let reply = |result| {
            Output::Reply(Reply {
                client: request.client,
                session: request.session,
                request: request.request,
                register: false,
                view: self.view,
                result,
            })
        };
        let operation = if request.session == 0 {
            // A retry of a register already applied gets its session; an older one is
            // refused.
            if let Some(answer) = self.state.registration(request.client, request.request) {
                let session = match &answer {
                    Ok(raw) if raw.len() == 8 => {
                        let mut b = [0u8; 8];
                        b.copy_from_slice(raw);
                        u64::from_be_bytes(b)
                    }
                    _ => 0,
                };
                out.push(Output::Reply(Reply {
                    client: request.client,
                    session,
                    request: request.request,
                    register: true,
                    view: self.view,
                    result: answer,
                }));
                return;
            }
            Operation::Register
        } else {
            // Answer retries of applied requests from the table; refuse unknown sessions
            // and old request numbers.
            if let Some(cached) = self.state.cached(request.session, request.request) {
                out.push(reply(cached));
                return;
            }
            if !self.state.has_session(request.session) && self.commit_min == self.commit_max {
                out.push(reply(Err(Refusal::SessionUnknown)));
                return;
            }
            Operation::Request
        };
        // A retry of a request still in the pipeline: it will be answered at commit.
        let in_pipeline = ((self.commit_min + 1)..=self.op).any(|op| {
            self.journal.get(&op).is_some_and(|e| {
                e.header.operation == operation
                    && e.header.session == request.session
                    && e.header.request == request.request
                    && (operation != Operation::Register
                        || e.body.as_deref() == Some(&request.client.to_be_bytes()[..]))
            })
        });
        if in_pipeline || self.op - self.commit_max >= self.config.pipeline_max {
            return;
        }
        let body = match operation {
            // A register's body names the client, so its retry is recognised above.
            Operation::Register => request.client.to_be_bytes().to_vec(),
            _ => request.body,
        };
        let Some(parent) = self.journal.get(&self.op).map(|e| e.header.checksum) else {
            return;
        };
        let header = Header {
            group: self.config.group,
            view: self.view,
            op: self.op + 1,
            commit: self.commit_max,
            parent,
            body_checksum: crate::message::checksum(&body),
            session: request.session,
            request: request.request,
            operation,
            checksum: 0,
        }
        .seal();
        self.idle_heartbeats = 0;
        self.insert_entry(header, Some(body.clone()), true, out);
        self.prepare_oks.insert(header.op, BTreeSet::new());
        self.send_to_others(Message::Prepare(Prepare { header, body }), out);
    }

    fn on_prepare(&mut self, prepare: Prepare, out: &mut Vec<Output>) {
        if !prepare.valid() || prepare.header.group != self.config.group {
            return;
        }
        let header = prepare.header;
        // A repair answer: accept it where the chain expects exactly this checksum.
        let expected = self.wanted.get(&header.op).copied().or_else(|| {
            self.journal
                .get(&header.op)
                .filter(|e| e.body.is_none())
                .map(|e| e.header.checksum)
        });
        if expected == Some(header.checksum) {
            let canonical = self.journal.get(&header.op).is_some_and(|e| e.canonical)
                || self
                    .journal
                    .get(&(header.op + 1))
                    .is_some_and(|e| e.canonical && e.header.parent == header.checksum)
                || self.wanted.contains_key(&header.op);
            self.insert_entry(header, Some(prepare.body), canonical, out);
            self.propagate_canonical();
            self.apply_committed(out);
            if self.start_view_pending {
                self.try_start_view(out);
            }
            return;
        }
        // A re-sent prepare of an earlier view (the new primary re-proposes its log):
        // acknowledge it if this view's log already holds exactly it.
        if self.status == Status::Normal && header.view < self.view && !self.is_primary() {
            let holds = self.journal.get(&header.op).is_some_and(|e| {
                e.header.checksum == header.checksum && e.canonical && e.durable && e.body.is_some()
            });
            // Even an op this replica already knows committed: the new primary may not
            // know it yet and counts acknowledgements to find out.
            if holds {
                self.send_prepare_ok(header.op, header.checksum, out);
            }
            return;
        }
        if self.status != Status::Normal || header.view != self.view {
            if header.view > self.view {
                // A newer view exists: learn it from its primary.
                let to = self.primary_of(header.view);
                out.push(Output::Send {
                    to,
                    message: Message::RequestStartView {
                        view: header.view,
                        from: self.config.replica,
                    },
                });
            }
            return;
        }
        if self.is_primary() {
            return;
        }
        self.arm(Timer::ViewChange, self.config.view_change_ticks * 2);
        match self.journal.get(&header.op) {
            Some(entry) if entry.header.checksum == header.checksum && entry.durable => {
                self.send_prepare_ok(header.op, header.checksum, out);
            }
            Some(entry) if entry.header.checksum == header.checksum => {}
            _ if header.op == self.op + 1 => {
                let chained = self
                    .journal
                    .get(&self.op)
                    .is_some_and(|e| e.header.checksum == header.parent);
                if chained {
                    self.insert_entry(header, Some(prepare.body), true, out);
                    self.propagate_canonical();
                } else {
                    // Our tip is not the view's: the StartView will say what is.
                    out.push(Output::Send {
                        to: self.primary_of(self.view),
                        message: Message::RequestStartView {
                            view: self.view,
                            from: self.config.replica,
                        },
                    });
                }
            }
            _ if header.op > self.op + 1 => {
                // A gap: note what the chain below this op must be and repair it.
                self.wanted.insert(header.op - 1, header.parent);
                self.repair(out);
            }
            _ => {}
        }
        self.heard_commit = self.heard_commit.max(header.commit);
        self.commit_max = self.commit_max.max(header.commit.min(self.op));
        if header.commit <= self.op {
            // The primary's commit is canonical if our chain reaches it.
            self.propagate_canonical();
        }
        self.apply_committed(out);
    }

    fn send_prepare_ok(&self, op: u64, checksum: Checksum, out: &mut Vec<Output>) {
        if self.status != Status::Normal || !self.view_durable() {
            return;
        }
        out.push(Output::Send {
            to: self.primary_of(self.view),
            message: Message::PrepareOk {
                view: self.view,
                op,
                checksum,
                from: self.config.replica,
            },
        });
    }

    fn on_journal_written(&mut self, op: u64, checksum: Checksum, out: &mut Vec<Output>) {
        let Some(entry) = self.journal.get_mut(&op) else {
            return;
        };
        if entry.header.checksum != checksum {
            return;
        }
        entry.durable = true;
        let canonical = entry.canonical;
        if self.status != Status::Normal {
            if self.start_view_pending {
                self.try_start_view(out);
            }
            return;
        }
        if self.is_primary() {
            self.try_commit(out);
        } else if op > self.commit_max && canonical {
            self.send_prepare_ok(op, checksum, out);
        }
        self.apply_committed(out);
    }

    fn on_prepare_ok(
        &mut self,
        view: u64,
        op: u64,
        checksum: Checksum,
        from: ReplicaId,
        out: &mut Vec<Output>,
    ) {
        if !self.is_primary() || view != self.view || op <= self.commit_max {
            return;
        }
        if self
            .journal
            .get(&op)
            .is_none_or(|e| e.header.checksum != checksum)
        {
            return;
        }
        self.prepare_oks.entry(op).or_default().insert(from);
        self.try_commit(out);
    }

    /// Commits, in order, every op a quorum (the primary's own durable copy included)
    /// has in its journal.
    fn try_commit(&mut self, out: &mut Vec<Output>) {
        if !self.view_durable() {
            return;
        }
        let before = self.commit_max;
        loop {
            let op = self.commit_max + 1;
            let Some(entry) = self.journal.get(&op) else {
                break;
            };
            let own = usize::from(entry.durable && entry.body.is_some());
            let acks = self.prepare_oks.get(&op).map_or(0, BTreeSet::len);
            if own + acks < self.config.quorum() {
                break;
            }
            self.commit_max = op;
            self.prepare_oks.remove(&op);
        }
        if self.commit_max > before {
            self.apply_committed(out);
            self.send_commit(out);
        }
    }

    fn send_commit(&self, out: &mut Vec<Output>) {
        if !self.view_durable() {
            return;
        }
        let Some(checksum) = self
            .journal
            .get(&self.commit_max)
            .map(|e| e.header.checksum)
        else {
            return;
        };
        self.send_to_others(
            Message::Commit {
                view: self.view,
                commit: self.commit_max,
                checksum,
                from: self.config.replica,
            },
            out,
        );
    }

    fn on_commit(
        &mut self,
        view: u64,
        commit: u64,
        checksum: Checksum,
        from: ReplicaId,
        out: &mut Vec<Output>,
    ) {
        if view > self.view {
            out.push(Output::Send {
                to: from,
                message: Message::RequestStartView {
                    view,
                    from: self.config.replica,
                },
            });
            return;
        }
        if view < self.view || self.status != Status::Normal || self.is_primary() {
            return;
        }
        self.arm(Timer::ViewChange, self.config.view_change_ticks * 2);
        self.heard_commit = self.heard_commit.max(commit);
        if commit > self.commit_max {
            self.commit_max = commit;
            self.record_anchor(commit, checksum);
        }
        self.apply_committed(out);
    }

    /// Applies committed canonical ops in order; stops at the first one missing.
    fn apply_committed(&mut self, out: &mut Vec<Output>) {
        self.propagate_canonical();
        let mut applied_any = false;
        while self.commit_min < self.commit_max {
            let op = self.commit_min + 1;
            let Some(entry) = self.journal.get(&op) else {
                break;
            };
            let chained = self
                .journal
                .get(&self.commit_min)
                .is_some_and(|below| below.header.checksum == entry.header.parent);
            if !entry.canonical || !chained {
                break;
            }
            let Some(body) = entry.body.clone() else {
                break;
            };
            let header = entry.header;
            let applied =
                self.state
                    .apply(op, header.operation, header.session, header.request, &body);
            let session = match (&header.operation, &applied.result) {
                (Operation::Register, Ok(raw)) if raw.len() == 8 => {
                    let mut b = [0u8; 8];
                    b.copy_from_slice(raw);
                    u64::from_be_bytes(b)
                }
                _ => header.session,
            };
            if let Some(evicted) = applied.evicted {
                out.push(Output::Evicted { session: evicted });
            }
            out.push(Output::Applied {
                op,
                checksum: header.checksum,
                session,
                request: header.request,
                register: header.operation == Operation::Register,
                executed: applied.executed,
                result: applied.result.clone(),
            });
            if self.is_primary() && header.operation != Operation::Root {
                let client = match header.operation {
                    Operation::Register => {
                        let mut raw = [0u8; 8];
                        raw.copy_from_slice(body.get(..8).unwrap_or(&[0; 8]));
                        u64::from_be_bytes(raw)
                    }
                    _ => header.session,
                };
                out.push(Output::Reply(Reply {
                    client,
                    session,
                    request: header.request,
                    register: header.operation == Operation::Register,
                    view: self.view,
                    result: applied.result,
                }));
            }
            self.commit_min = op;
            applied_any = true;
            if op.is_multiple_of(self.config.checkpoint_interval) {
                self.take_checkpoint(out);
            }
        }
        if applied_any
            && self.durable.commit + self.config.checkpoint_interval / 2 <= self.commit_max
        {
            // Persist progress now and then; commit is only a hint for restarts.
            self.write_state(out);
        }
    }

    fn take_checkpoint(&mut self, out: &mut Vec<Output>) {
        let Some(header) = self.journal.get(&self.commit_min).map(|e| e.header) else {
            return;
        };
        out.push(Output::WriteCheckpoint(Checkpoint::new(
            header,
            self.state.snapshot(),
        )));
        self.checkpoint = header;
        let prune = header.op.saturating_sub(self.config.journal_keep);
        if prune > 0 {
            out.push(Output::PruneJournal { op: prune });
            let keep = self.journal.split_off(&prune);
            self.journal = keep;
            // The checkpoint op's header stays as the chain's anchor.
            self.journal
                .entry(header.op)
                .or_insert(Entry::anchor(header));
            self.wanted = self.wanted.split_off(&prune);
        }
    }
}

mod invariants;
mod view_change;
