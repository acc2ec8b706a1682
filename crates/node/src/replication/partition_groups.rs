//! A shard's partition groups: one VSR group per partition the shard owns, its journal
//! the partition log ([`PartitionJournal`]), its state the offsets
//! ([`PartitionMachine`]), all in one [`ShardHost`] with one durable-state table.
//!
//! The shard's node is the only client of a group it leads: it registers a session
//! with the group when it first proposes as primary, and each produce is one request
//! whose body is the batch (canonical: base offset and leader epoch zero). Requests go
//! in while the group's pipeline has room, the rest wait in order; a producer is
//! answered when its batch commits (on a quorum of replicas, each synced first under
//! `fsync = always`), with the offsets the commit gave it. A replica that stops being
//! primary answers everything it holds `NotLeader`; a retry may then be stored twice
//! until client sessions reach the producers.
//!
//! Every commit moves the group's high watermark, on every replica; the shard reads up
//! to it and wakes the fetches that wait for it.

use std::collections::HashMap;
use std::path::Path;

use braid_bus::ShardSender;
use braid_proto::client::ErrorCode;
use braid_proto::ValidatedBatch;
use braid_storage::{LogConfig, PartitionLog};
use braid_vsr::{Config, Input, Message, ReplicaId, Reply, Request, Status};

use super::group_client::PrimaryAt;
use super::meta_client::client_id;
use super::meta_group::Timing;
use super::partition_journal::{PartitionAsleep, PartitionJournal};
use super::partition_machine::slices::{SessionTag, Tagged};
use super::partition_machine::PartitionMachine;
use super::shard_host::{Effects, HostError, Opened, ShardHost};
use super::wire;
use crate::error::NodeError;
use crate::layout::PartitionKey;
use crate::mailbox::ProduceReply;

mod copy;
mod dropped;
use dropped::{fail_all, not_leader};
pub(crate) use dropped::{stopped, Dropped};
mod frames;
mod hand_off;
mod lone;
mod retire;
mod sleep;
mod syncs;
#[cfg(test)]
mod tests;

use super::outbox::Outbox;

/// Most produce requests a primary keeps in flight per partition.
const PIPELINE_MAX: u64 = 16;

/// Ops between a partition's checkpoints, and ops its journal keeps below the last
/// one. A checkpoint is the next offset and the client table, and the bodies of
/// applied ops leave memory at once: checkpoints (and the durable-state writes paced
/// by them) can be rare.
const CHECKPOINT_INTERVAL: u64 = 1_024;
/// How often (ticks) the files of partitions unused since the last look go to sleep:
/// an idle partition's journal and log leave memory after 1 to 2 seconds, and the
/// close that puts them to sleep (a sync and a clean-shutdown marker) comes at most
/// once per idle spell.
const SLEEP_TICKS: u64 = 100;
/// Ticks between two wakes of sleeping partitions for the scrub's look (10 a second per
/// shard: a shard of 10,000 idle partitions checks each every 17 minutes or so).
const SCRUB_WAKE_TICKS: u64 = 10;

/// The group id of a partition: the high bit set (group 0 is the metadata), then the
/// topic id and the partition.
pub(crate) fn group_of(key: PartitionKey) -> u64 {
    1 << 63 | u64::from(key.topic_id) << 32 | u64::from(key.partition)
}

/// The tag a partition's log stores in each batch (see
/// [`braid_proto::batch::partition_tag`]).
pub(crate) fn tag_of(key: PartitionKey) -> i32 {
    braid_proto::batch::partition_tag(key.topic_id, key.partition)
}

/// The partition of a group id, if it is a partition's.
pub(crate) fn key_of(group: u64) -> Option<PartitionKey> {
    (group >> 63 == 1).then_some(PartitionKey {
        topic_id: ((group >> 32) & 0x7fff_ffff) as u32,
        partition: group as u32,
    })
}

/// Who serves a partition here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    /// This replica leads the group: it takes produces and serves fetches.
    Primary,
    /// Another member leads it (if known: `None` during a view change).
    Backup(Option<ReplicaId>),
}

/// A request unanswered this long (ticks) is failed, retriable: a guard against a
/// request lost in a way nothing else reports.
const REQUEST_TICKS_MAX: u64 = 3_000;

/// This node's session with one group it leads, its produces answered through their
/// reply channels.
type GroupClient = super::group_client::GroupClient<ProduceReply>;

/// High watermarks that moved in a turn.
pub(crate) type Moved = Vec<(PartitionKey, u64)>;

/// What a shard needs to open its groups on its own thread.
#[derive(Debug, Clone)]
pub(crate) struct Opening {
    pub(crate) dir: std::path::PathBuf,
    pub(crate) node: ReplicaId,
    pub(crate) members: u8,
    pub(crate) timing: Timing,
    pub(crate) nonce: u64,
    /// The member's data was lost and its directory recreated: partitions it creates
    /// with nothing on disk start untrusted.
    pub(crate) rejoined: bool,
    /// Partitions whose files may be open at once (`open_logs_per_shard`; see
    /// [`PartitionGroups::set_open_budget`]).
    pub(crate) open_budget: usize,
}

impl Opening {
    /// Opens shard `shard`'s groups.
    ///
    /// # Errors
    /// As [`PartitionGroups::open`].
    pub(crate) fn open(self, shard: usize) -> Result<PartitionGroups, HostError> {
        let mut groups = PartitionGroups::open(
            &self.dir,
            shard,
            self.node,
            self.members,
            self.timing,
            self.nonce,
        )?;
        if self.rejoined {
            groups.host.start_fresh_untrusted();
        }
        groups.set_open_budget(self.open_budget);
        Ok(groups)
    }
}

/// The partition groups of one shard.
#[derive(Debug)]
pub(crate) struct PartitionGroups {
    host: ShardHost<PartitionMachine, PartitionJournal>,
    clients: HashMap<u64, GroupClient>,
    /// Groups with produces queued since the last flush.
    pending: Vec<u64>,
    /// Lone groups opened and not recovered yet ([`PartitionGroups::recover_opened`]).
    opened_lone: Vec<u64>,
    /// Lone groups dropped for damage met in use, with why: refused, not opened again
    /// ([`PartitionGroups::take_reopen`]).
    refused_lone: HashMap<u64, String>,
    node: ReplicaId,
    members: u8,
    client_id: u64,
    timing: Timing,
    now: u64,
    bus: Outbox,
    sync: Option<SyncLink>,
    /// Sync jobs handed to the syncer since the last [`PartitionGroups::take_syncs_started`].
    syncs_started: u64,
    /// Client sessions' requests answered from their entries (stored before) since the
    /// last [`PartitionGroups::take_resends_answered`].
    resends_answered: u64,
    /// Log copies (state transfers) with a fetch out: group -> (tick sent, attempt).
    copies: HashMap<u64, (u64, u64)>,
    /// State transfers finished since the last [`PartitionGroups::take_transfers_done`].
    transfers_done: u64,
    /// Repairs of damaged batches with a fetch out: group -> (tick sent, attempt).
    repairs: HashMap<u64, (u64, u64)>,
    /// The group the scrub of committed batches checks next (the next above, in turn).
    scrub_next: u64,
    /// The tick from which the scrub may wake the next sleeping group for a look.
    scrub_wake_due: u64,
    /// [`SCRUB_WAKE_TICKS`], but for simulator runs that look at sleeping files more
    /// often.
    scrub_wake_ticks: u64,
    /// Damaged batches repaired from peers' copies (for the metrics).
    batches_repaired: u64,
    failed: Option<String>,
    /// [`CHECKPOINT_INTERVAL`], but for simulator runs that want more checkpoints.
    checkpoint_interval: u64,
    /// [`SLEEP_TICKS`], but for simulator runs that put files to sleep more often.
    sleep_ticks: u64,
    /// The host's counts of files slept, woken and slept for the budget of awake ones
    /// at the last [`PartitionGroups::take_sleep_counts`].
    sleep_counts_taken: (u64, u64, u64),
    /// The log settings in use, each held once by every log opened with it (a topic's
    /// thousands of partitions share one: 104 bytes a partition otherwise).
    log_configs: Vec<std::sync::Arc<LogConfig>>,
}

/// Where sync jobs run and where their completions come back.
#[derive(Debug, Clone)]
pub(crate) struct SyncLink {
    pub(crate) syncer: std::sync::Arc<braid_storage::Syncer>,
    pub(crate) done: tokio::sync::mpsc::UnboundedSender<crate::mailbox::Control>,
}

impl PartitionGroups {
    /// `config`, shared with the logs already opened with it.
    fn shared_log_config(&mut self, config: LogConfig) -> std::sync::Arc<LogConfig> {
        if let Some(shared) = self.log_configs.iter().find(|c| ***c == config) {
            return std::sync::Arc::clone(shared);
        }
        // Settings no log holds any more go, so the list stays as long as the number
        // of settings in use.
        self.log_configs
            .retain(|c| std::sync::Arc::strong_count(c) > 1);
        let shared = std::sync::Arc::new(config);
        self.log_configs.push(std::sync::Arc::clone(&shared));
        shared
    }

    /// Opens shard `shard`'s durable group states in `dir`.
    ///
    /// # Errors
    /// The states cannot be read.
    pub(crate) fn open(
        dir: &Path,
        shard: usize,
        node: ReplicaId,
        members: u8,
        timing: Timing,
        nonce: u64,
    ) -> Result<Self, HostError> {
        let host = ShardHost::open(dir, shard)?;
        host.refuse_lone_if_unattributable(members)?;
        Ok(Self::with_host(host, node, members, timing, nonce))
    }

    /// As [`PartitionGroups::open`], in boot `boot` (the simulator stands for a reboot
    /// after a power loss with another).
    #[cfg(test)]
    pub(crate) fn open_in_boot(
        dir: &Path,
        node: ReplicaId,
        members: u8,
        timing: Timing,
        nonce: u64,
        boot: super::boot::BootId,
    ) -> Result<Self, HostError> {
        let host = ShardHost::open_in_boot(dir, 0, boot)?;
        host.refuse_lone_if_unattributable(members)?;
        Ok(Self::with_host(host, node, members, timing, nonce))
    }

    fn with_host(
        host: ShardHost<PartitionMachine, PartitionJournal>,
        node: ReplicaId,
        members: u8,
        timing: Timing,
        nonce: u64,
    ) -> Self {
        Self {
            host,
            clients: HashMap::new(),
            opened_lone: Vec::new(),
            refused_lone: HashMap::new(),
            pending: Vec::new(),
            node,
            members,
            client_id: client_id(node, nonce),
            timing,
            now: 0,
            bus: Outbox::Nowhere,
            sync: None,
            syncs_started: 0,
            resends_answered: 0,
            copies: HashMap::new(),
            transfers_done: 0,
            repairs: HashMap::new(),
            scrub_next: 0,
            scrub_wake_due: 0,
            scrub_wake_ticks: SCRUB_WAKE_TICKS,
            batches_repaired: 0,
            failed: None,
            checkpoint_interval: CHECKPOINT_INTERVAL,
            sleep_ticks: SLEEP_TICKS,
            sleep_counts_taken: (0, 0, 0),
            log_configs: Vec::new(),
        }
    }

    /// Checkpoints every `ops` ops in the partitions added from now on (the simulator
    /// runs short seeds through many checkpoints and state transfers).
    #[cfg(test)]
    pub(crate) fn set_checkpoint_interval(&mut self, ops: u64) {
        self.checkpoint_interval = ops;
    }

    /// A partition's replica's journal entries from `from` to its op: (op, checksum's
    /// top bits, body held, canonical) (the simulator's reports).
    #[cfg(test)]
    pub(crate) fn entry_states(&self, key: PartitionKey, from: u64) -> Vec<String> {
        let Some(replica) = self.host.replica(group_of(key)) else {
            return Vec::new();
        };
        (from..=replica.op())
            .map(|op| match replica.entry_state(op) {
                Some((sum, body, canonical)) => format!(
                    "{op}:{:04x}{}{}",
                    sum >> 112,
                    if body { "+b" } else { "-b" },
                    if canonical { "c" } else { "" }
                ),
                None => format!("{op}:none"),
            })
            .collect()
    }

    /// A partition's replica's log view (the simulator's reports).
    #[cfg(test)]
    pub(crate) fn log_view(&self, key: PartitionKey) -> Option<u64> {
        self.host.replica(group_of(key)).map(|r| r.log_view())
    }

    /// Why the groups stopped, if they did (a failed write, or damage found in use).
    pub(crate) fn failure(&self) -> Option<&str> {
        self.failed.as_deref()
    }

    /// Sync jobs handed to the syncer since the last call (for the metrics).
    pub(crate) fn take_syncs_started(&mut self) -> u64 {
        std::mem::take(&mut self.syncs_started)
    }

    pub(crate) fn take_resends_answered(&mut self) -> u64 {
        std::mem::take(&mut self.resends_answered)
    }

    /// Every partition group's replica now (for the shard's board).
    pub(crate) fn statuses(&self) -> Vec<super::status::GroupStatus> {
        self.host
            .replicas()
            .map(|replica| self.status_of(replica))
            .collect()
    }

    /// As [`PartitionGroups::statuses`], starting the count of changes afresh (see
    /// [`PartitionGroups::changed_statuses`]).
    pub(crate) fn all_statuses(&mut self) -> Vec<super::status::GroupStatus> {
        drop(self.host.take_touched());
        self.statuses()
    }

    /// The status of each group whose status may have changed since the last call of
    /// this or [`PartitionGroups::all_statuses`] (the groups stepped since).
    pub(crate) fn changed_statuses(&mut self) -> Vec<super::status::GroupStatus> {
        let touched = self.host.take_touched();
        touched
            .into_iter()
            .filter_map(|group| self.host.replica(group))
            .map(|replica| self.status_of(replica))
            .collect()
    }

    fn status_of(
        &self,
        replica: &braid_vsr::Replica<PartitionMachine>,
    ) -> super::status::GroupStatus {
        let mut status = super::status::GroupStatus::of(replica);
        status.journal = match self.host.journal(status.group) {
            Some(journal) => Some(journal.progress()),
            None => self
                .host
                .journal_asleep(status.group)
                .map(PartitionAsleep::progress),
        };
        status
    }

    /// Repairs the groups asked of peers since the last call (for the metrics).
    pub(crate) fn take_repairs(&mut self) -> super::shard_host::Repairs {
        self.host.take_repairs()
    }

    /// State transfers (log copies) finished since the last call (for the metrics).
    pub(crate) fn take_transfers_done(&mut self) -> u64 {
        std::mem::take(&mut self.transfers_done)
    }

    /// Damaged batches repaired from peers' copies since the last call (for the
    /// metrics).
    pub(crate) fn take_batches_repaired(&mut self) -> u64 {
        std::mem::take(&mut self.batches_repaired)
    }

    /// Partitions whose log holds damage a peer's copy has not mended yet (for the
    /// metrics: above 0 for long, a repair is stuck).
    pub(crate) fn awaiting_repair(&self) -> u64 {
        self.repairs.len() as u64
    }

    /// Runs journal syncs under `fsync = always` on `link`'s syncer from now on (for
    /// partitions added after this call).
    pub(crate) fn sync_through(&mut self, link: SyncLink) {
        self.sync = Some(link);
    }

    /// Sends through `bus` from now on.
    pub(crate) fn attach_bus(&mut self, bus: ShardSender) {
        self.bus = Outbox::Bus(bus);
    }

    /// Keeps the frames to peers for [`PartitionGroups::take_sent`] (the simulator).
    #[cfg(test)]
    pub(crate) fn keep_sent(&mut self) {
        self.bus = Outbox::Kept(Vec::new());
    }

    /// The frames to peers kept since the last call.
    #[cfg(test)]
    pub(crate) fn take_sent(&mut self) -> Vec<(u8, braid_bus::Frame)> {
        self.bus.take_kept()
    }

    /// How many replicas each group has (1: a lone node).
    pub(crate) fn members(&self) -> u8 {
        self.members
    }

    /// Partitions of topics from `topic_id` on start trusted when they have nothing
    /// on disk, even on a member that lost its data: those topics were created after
    /// it started again (see [`MetaGroup::new_topics_from`](super::meta_group::MetaGroup::new_topics_from)).
    pub(crate) fn trust_new_topics_from(&mut self, topic_id: u32) {
        self.host.trust_fresh_groups_from(group_of(PartitionKey {
            topic_id,
            partition: 0,
        }));
    }

    /// Opens a partition's group: its log in `dir` with its journal and checkpoints.
    /// Returns the high watermark it starts at.
    ///
    /// # Errors
    /// The files cannot be read or cannot restart the replica.
    pub(crate) fn add(
        &mut self,
        key: PartitionKey,
        dir: &Path,
        log_config: LogConfig,
        now_ms: u64,
    ) -> Result<u64, HostError> {
        let group = group_of(key);
        let journal_path = dir.join(super::partition_journal::JOURNAL_FILE);
        if self.host.has_state(group) && super::journal_file::gone_or_cut_short(&journal_path) {
            // The group wrote a durable state here, so its journal was made (before any
            // state): its files are gone (the partition's directory deleted, say), and
            // an empty log would take offsets it acknowledged. A lone replica refuses
            // before anything is made; a member restarts the group as one that lost its
            // disk and takes it from peers.
            let reason = format!(
                "{} is gone or cut short while this node's states table holds the group's \
                 state (the partition's files were lost or damaged)",
                journal_path.display()
            );
            if self.members == 1 {
                return Err(HostError::Damaged { group, reason });
            }
            tracing::warn!(group, %reason, "the group restarts as a replica that lost its disk");
            self.host.restart_as_lost(group)?;
        } else if journal_path.exists() && self.host.state_lost_with_its_table(group) {
            // Its files exist, so it wrote a state, in a table that was missing whole at
            // this start (an outside review of issue 24 deleted every states table of a
            // node and it started, its groups at view 0 with trusted journals: a member
            // that forgot the views it voted in). A lone replica refuses the partition;
            // a member restarts the group as one that lost its disk.
            let reason = format!(
                "{} exists but the states table holding its group's durable state was \
                 missing at start ({} made anew): the state is lost",
                journal_path.display(),
                self.host.states_files()
            );
            if self.members == 1 {
                return Err(HostError::Damaged { group, reason });
            }
            tracing::warn!(group, %reason, "the group restarts as a replica that lost its disk");
            self.host.restart_as_lost(group)?;
        } else if journal_path.exists() && self.host.state_may_be_lost(group) {
            // Its files exist, so it wrote a state (made after its journal), and the
            // states table has a slot damaged in both copies whose group is unknown:
            // it may be this group's. (Refused on a lone replica at open.)
            tracing::warn!(
                group,
                dir = %dir.display(),
                "the group's state may be the one a damaged states-table slot held: the \
                 group restarts as a replica that lost its disk"
            );
            self.host.restart_as_lost(group)?;
        }
        let mut log_config = log_config;
        if self.members > 1 {
            // Damage in the log's newest segment cuts it there instead of refusing to
            // start: the journal reports every op whose synced batch went with the cut
            // as damaged (never absent), and peers restore it (repair, or a copy of
            // what a checkpoint covers). A lone replica has no peer and refuses.
            log_config.recovery = braid_storage::RecoveryMode::TruncateAtDamage;
        }
        let log_config = self.shared_log_config(log_config);
        let floor = (self.members == 1)
            .then(|| {
                let synced = log_config.fsync == braid_storage::FsyncPolicy::Always;
                self.host.acknowledged_floor(group, synced)
            })
            .flatten();
        let (mut journal, recovered) =
            PartitionJournal::open_above(dir, group, tag_of(key), log_config, now_ms, floor)?;
        if self.sync.is_some() {
            journal.sync_off_thread();
        }
        let dir = std::sync::Arc::clone(journal.log().shared_dir());
        let damaged_at_rest =
            recovered.damage.is_some() || journal.log().recovery().damage_cut_at.is_some();
        let opened = Opened {
            slots: recovered.slots,
            damage: recovered.damage,
            trusted: journal.trusted(),
            tail_cut: recovered.tail_cut,
            damaged_at_rest,
        };
        let config = Config {
            pipeline_max: PIPELINE_MAX,
            checkpoint_interval: self.checkpoint_interval,
            journal_keep: self.checkpoint_interval,
            compact_committed: true,
            sessions_max: 8,
            heartbeat_ticks: self.timing.heartbeat_ticks,
            view_change_ticks: self.timing.view_change_ticks,
            retry_ticks: self.timing.retry_ticks,
            // An idle partition drops its timers and journal entries from memory, so a
            // thousand of them cost little; a request or a message wakes it.
            quiesce: true,
            ..Config::new(group, self.node, self.members, self.client_id ^ group)
        };
        self.host
            .add_group_with(config, PartitionMachine::default(), journal, opened, &dir)?;
        if self.members == 1 {
            // Recovered with the others opened with it (`recover_opened`).
            self.opened_lone.push(group);
        }
        Ok(self.high_watermark(key))
    }

    /// Syncs and closes every partition; producers still waiting get `ShuttingDown`.
    pub(crate) fn close(&mut self) {
        let err = NodeError::new(ErrorCode::ShuttingDown, "node is shutting down");
        for client in self.clients.values_mut() {
            fail_all(client, &err);
        }
        self.clients.clear();
        self.failed = Some("the node is shutting down".into());
        let mut unsynced = Vec::new();
        for (group, journal) in self.host.take_journals() {
            if let Err(err) = journal.close() {
                tracing::error!(group, %err, "closing a partition");
                unsynced.push(group);
            }
        }
        // Under fsync = interval or never, this is what lets a planned reboot restart
        // the partitions trusted (see `replication::boot`).
        if let Err(err) = self.host.record_clean_stop(&unsynced) {
            tracing::error!(%err, "recording the clean stop of the partitions");
        }
    }

    /// Closes an idle partition's files (log and header journal) until next used.
    ///
    /// # Errors
    /// The log's files could not be released.
    pub(crate) fn release_files(&mut self, key: PartitionKey) -> Result<(), HostError> {
        if let Some(journal) = self.host.journal_mut(group_of(key)) {
            journal.release_files()?;
        }
        Ok(())
    }

    /// The partition's log (reads go straight to it, up to the high watermark).
    pub(crate) fn log(&mut self, key: PartitionKey) -> Option<&mut PartitionLog> {
        self.woken(group_of(key)).map(PartitionJournal::log)
    }

    /// Applies the partition's retention to its log (see
    /// [`PartitionJournal::apply_retention`]), its files woken if they sleep; `None`
    /// for no such partition.
    pub(crate) fn apply_retention(
        &mut self,
        key: PartitionKey,
        now_ms: u64,
    ) -> Option<
        Result<braid_storage::RetentionOutcome, super::partition_journal::PartitionJournalError>,
    > {
        self.woken(group_of(key))
            .map(|journal| journal.apply_retention(now_ms))
    }

    /// The committed offsets' end that this replica's log holds: the high watermark.
    /// The partition's state may count ops whose batches are not in the log yet (a
    /// copy from a peer runs, or an op below them is being repaired): reads stop where
    /// the log does, never promise records it does not hold.
    pub(crate) fn high_watermark(&self, key: PartitionKey) -> u64 {
        let group = group_of(key);
        let next = self
            .host
            .replica(group)
            .map_or(0, |r| r.state().machine().next_offset());
        let committed_end = match self.host.journal(group) {
            Some(journal) => journal.committed_end(),
            None => self
                .host
                .journal_asleep(group)
                .map_or(next, PartitionAsleep::committed_end),
        };
        next.min(committed_end)
    }

    /// Who serves the partition here.
    pub(crate) fn role(&self, key: PartitionKey) -> Role {
        let Some(replica) = self
            .host
            .replica(group_of(key))
            .filter(|_| self.failed.is_none())
        else {
            // Stopped groups serve nothing: clients are sent elsewhere (`NotLeader`).
            return Role::Backup(None);
        };
        if replica.is_primary() {
            return Role::Primary;
        }
        let known = replica.status() == Status::Normal;
        Role::Backup(known.then(|| replica.primary_of(replica.view())))
    }

    /// A group's primary, known only while its replica is in normal status (one
    /// changing view names nobody: the view it tries may never start), and its view,
    /// for the primaries `ClusterInfo` names.
    pub(crate) fn primary_of(&self, key: PartitionKey) -> Option<(Option<ReplicaId>, u64)> {
        let replica = self.host.replica(group_of(key))?;
        let known = replica.status() == Status::Normal && self.failed.is_none();
        Some((
            known.then(|| replica.primary_of(replica.view())),
            replica.view(),
        ))
    }

    /// Queues a produce's batch for the next [`PartitionGroups::flush`]; `reply` gets
    /// its offsets at commit. The caller has checked this replica is the primary.
    pub(crate) fn produce(
        &mut self,
        key: PartitionKey,
        mut batch: ValidatedBatch,
        reply: ProduceReply,
        checked: super::group_client::Checked,
    ) {
        if let Some(reason) = &self.failed {
            let _ = reply.send(Err(stopped(reason)));
            return;
        }
        let tag = match SessionTag::of(batch.header()) {
            Tagged::No => None,
            Tagged::Yes(tag) => Some(tag),
            Tagged::Invalid => {
                let header = batch.header();
                let _ = reply.send(Err(NodeError::new(
                    ErrorCode::InvalidBatch,
                    format!(
                        "a batch names a session with producer id {} and base sequence {}: \
                         both are -1 (no session), or a session id and a request number \
                         from 0",
                        header.producer_id, header.base_sequence
                    ),
                )));
                return;
            }
        };
        let group = group_of(key);
        batch.set_base_offset(0);
        batch.set_partition_leader_epoch(0);
        // Shared from here on: the journal entry, the write and the sends hold it.
        let body = batch.into_bytes().freeze();
        self.clients
            .entry(group)
            .or_default()
            .queue(body, reply, tag.map(|tag| (tag, checked)));
        if self.pending.last() != Some(&group) {
            self.pending.push(group);
        }
    }

    /// Proposes what the produces since the last flush queued, in one turn of the
    /// groups: each partition written and synced once for all of it.
    pub(crate) fn flush(&mut self) -> Moved {
        let mut moved = Vec::new();
        self.flush_into(&mut moved);
        moved
    }

    fn flush_into(&mut self, moved: &mut Moved) {
        for _ in 0..64 {
            if self.pending.is_empty() || self.failed.is_some() {
                break;
            }
            let mut groups = std::mem::take(&mut self.pending);
            groups.sort_unstable();
            groups.dedup();
            let mut inputs = Vec::new();
            for group in &groups {
                self.collect(*group, &mut inputs);
            }
            if inputs.is_empty() {
                break;
            }
            let stepped = self.host.step(self.now, inputs);
            for group in groups {
                let top = self.host.replica(group).map(braid_vsr::Replica::op);
                if let (Some(top), Some(client)) = (top, self.clients.get_mut(&group)) {
                    client.handed_through(top);
                }
            }
            match stepped {
                Ok(effects) => self.carry(effects, moved),
                Err(HostError::UnknownGroup(_)) => {}
                Err(err) => self.fail(err),
            }
        }
        self.publish_marks(moved);
    }

    /// A request that came to a backup: the replica hears it (a quiet backup then
    /// watches its primary again, so a dead one is replaced) and the caller answers
    /// `NotLeader`.
    pub(crate) fn nudge(&mut self, key: PartitionKey) -> Moved {
        let group = group_of(key);
        let request = Request {
            client: self.client_id,
            session: u64::MAX,
            request: 0,
            body: bytes::Bytes::new(),
        };
        let mut moved = Vec::new();
        self.step_all(
            vec![(group, Input::Message(Message::Request(request)))],
            &mut moved,
        );
        moved
    }

    /// The bus lost its bundle to each of `peers`: every group's replica hears it (a
    /// quiescent backup of a primary on that peer watches it again, so a primary cut
    /// off from this node is replaced even while clients still reach it).
    pub(crate) fn peers_lost(&mut self, peers: &[u8]) -> Moved {
        let groups: Vec<u64> = self.host.replicas().map(|r| r.config().group).collect();
        let inputs: Vec<(u64, Input)> = groups
            .iter()
            .flat_map(|group| {
                let members = self.members;
                peers
                    .iter()
                    .filter(move |peer| **peer < members)
                    .map(|peer| (*group, Input::PeerLost(*peer)))
            })
            .collect();
        let mut moved = Vec::new();
        self.step_all(inputs, &mut moved);
        moved
    }

    /// One tick of time for every group whose timer is due.
    pub(crate) fn tick(&mut self) -> Moved {
        let mut moved = Vec::new();
        if self.failed.is_some() {
            return moved;
        }
        self.now += 1;
        match self.host.tick(self.now) {
            Ok(effects) => self.carry(effects, &mut moved),
            Err(err) => self.fail(err),
        }
        // A group that lost its primary role answers what it held.
        let lost: Vec<u64> = self
            .clients
            .iter()
            .filter(|(_, c)| !c.is_idle())
            .filter(|(g, _)| !self.host.replica(**g).is_some_and(|r| r.is_primary()))
            .map(|(g, _)| *g)
            .collect();
        for group in lost {
            if let Some(client) = self.clients.get_mut(&group) {
                fail_all(client, &not_leader());
            }
        }
        self.resend_overdue(&mut moved);
        self.drive_copies();
        self.scrub_and_repair();
        if self.now.is_multiple_of(self.sleep_ticks) {
            // The files of partitions idle since the last pass go to sleep.
            if let Err(err) = self.host.sleep_idle() {
                self.fail(err);
                return moved;
            }
        }
        self.hand_back(&mut moved);
        if self.members > 1
            && self
                .now
                .is_multiple_of((self.timing.view_change_ticks / 2).max(1))
        {
            self.send_quiet_heartbeats();
        }
        // Produces held back (the primary's view not yet on disk) go when they can.
        for (group, client) in &self.clients {
            if client.has_queued() {
                self.pending.push(*group);
            }
        }
        self.flush_into(&mut moved);
        moved
    }

    /// Now and then, the commit of every quiescent group this shard leads to every
    /// peer: a backup that a client woke (its primary may be gone) hears that it is
    /// not, and sleeps again; one whose primary is gone hears nothing and replaces it.
    fn send_quiet_heartbeats(&mut self) {
        if self.bus.is_nowhere() {
            return;
        }
        for (group, message) in self.host.quiet_heartbeats() {
            for to in (0..self.members).filter(|m| *m != self.node) {
                self.bus.send(to, wire::frame(group, &message));
            }
        }
    }

    /// Sends a register again if its answer is overdue (the primary dropped it while
    /// its view was not yet durable), and fails, retriable, a request unanswered for
    /// [`REQUEST_TICKS_MAX`].
    fn resend_overdue(&mut self, moved: &mut Moved) {
        let due = self.now.saturating_sub(self.timing.retry_ticks * 2);
        let lost = self.now.saturating_sub(REQUEST_TICKS_MAX);
        let mut resend = Vec::new();
        for (group, client) in &mut self.clients {
            let (register, lost) = client.overdue(self.client_id, self.now, due, lost);
            resend.extend(register.map(|request| (*group, request)));
            for reply in lost {
                let _ = reply.send(Err(NodeError::new(
                    ErrorCode::Busy,
                    "the partition group did not answer in time; retry",
                )));
            }
        }
        for (group, request) in resend {
            self.step_all(
                vec![(group, Input::Message(Message::Request(request)))],
                moved,
            );
        }
    }

    /// Syncs the logs of `fsync = interval` groups whose interval is due.
    pub(crate) fn sync_due(&mut self, keys: &[PartitionKey], now_ms: u64) {
        for key in keys {
            if let Some(journal) = self.host.journal_mut(group_of(*key)) {
                if journal.log().sync_due(now_ms) {
                    if let Err(err) = journal.sync_now() {
                        tracing::warn!(%err, "an interval sync of a partition failed");
                    }
                }
            }
        }
    }

    /// The requests `group`'s client may send now: a register first, then batches
    /// while the pipeline has room.
    fn collect(&mut self, group: u64, inputs: &mut Vec<(u64, Input)>) {
        let Some(replica) = self.host.replica(group) else {
            if let Some(client) = self.clients.get_mut(&group) {
                fail_all(client, &not_leader());
            }
            return;
        };
        if !replica.is_primary() {
            if let Some(client) = self.clients.get_mut(&group) {
                fail_all(client, &not_leader());
            }
            return;
        }
        // Only what the primary will prepare goes in (it drops a request while its view
        // is not on disk or its pipeline is full); the rest waits for a later turn.
        let at = PrimaryAt {
            takes: replica.takes_requests(),
            room: PIPELINE_MAX.saturating_sub(replica.op().saturating_sub(replica.commit_max())),
            view: replica.view(),
            op: replica.op(),
            commit_min: replica.commit_min(),
        };
        let Some(client) = self.clients.get_mut(&group) else {
            return;
        };
        let (requests, answered) = client.requests(
            self.client_id,
            self.now,
            at,
            replica.state().machine().slices(),
        );
        for request in requests {
            inputs.push((group, Input::Message(Message::Request(request))));
        }
        for (waiting, answer) in answered {
            self.resends_answered += u64::from(answer.is_ok());
            let _ = waiting.send(answer);
        }
    }

    fn carry(&mut self, effects: Effects, moved: &mut Moved) {
        for group in &effects.unsynced {
            self.start_sync(*group);
        }
        let mut framer = wire::Framer::default();
        for (group, to, message) in effects.sends {
            self.bus.send(to, framer.frame(group, &message));
        }
        let mut touched = Vec::new();
        for (group, _, _) in &effects.applied {
            if touched.last() != Some(group) {
                touched.push(*group);
            }
        }
        for (group, reply) in effects.replies {
            self.answer(group, reply);
            touched.push(group);
        }
        touched.sort_unstable();
        touched.dedup();
        for group in touched {
            if self
                .clients
                .get(&group)
                .is_some_and(GroupClient::has_queued)
            {
                self.pending.push(group);
            }
        }
        self.publish_marks(moved);
    }

    /// The high watermark of every group whose committed end may have moved, whatever
    /// moved it: a step, or a repair or copy from a peer outside one. (Published only
    /// from steps that applied or answered, a member that took its log from a peer
    /// served high watermark 0 until the next produce: the outside review 45's F1.)
    fn publish_marks(&mut self, moved: &mut Moved) {
        for group in self.host.take_marks() {
            if let Some(key) = key_of(group) {
                moved.push((key, self.high_watermark(key)));
            }
        }
    }

    /// A reply of the local primary to this node's session.
    fn answer(&mut self, group: u64, reply: Reply) {
        if reply.client != self.client_id {
            return;
        }
        let Some(client) = self.clients.get_mut(&group) else {
            return;
        };
        if let Some((waiting, answer)) = client.answer(&reply) {
            let _ = waiting.send(answer);
        }
    }
}
