//! A shard: one thread with its own single-threaded runtime. It owns the partitions
//! that hash to it (each a VSR group, see `replication::partition_groups`) and the
//! connections handed to it, shares no mutable state with other shards, and talks to
//! them only through channels: a bounded inbox for requests (backpressure), an
//! unbounded control channel for layout changes and lifecycle, which must never block
//! their senders, and its receiver of the replica bus.

use std::cell::RefCell;
use std::collections::{HashMap, HashSet, VecDeque};
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use braid_proto::client::ErrorCode;
use braid_storage::PartitionLog;
use tokio::sync::{mpsc, watch};

mod error;
mod layout;
mod reopen;
mod retire;

pub(crate) use error::ShardError;

use crate::error::NodeError;
use crate::layout::{Layout, PartitionKey};
use crate::mailbox::{now_ms, Control, FetchOutcome, NodeShared, ShardRequest};
use crate::metrics::{add, ShardMetrics};
use crate::partition::Partition;
use crate::refused_partition::RefusedPartition;
use crate::replication::partition_groups::{tag_of, Moved, PartitionGroups, Role};
use crate::replication::partition_machine::slices::{SessionTag, Tagged};

/// How often (in ticks) a shard publishes its partitions' primaries for `ClusterInfo`
/// and its groups' status on the board.
const PRIMARIES_EVERY_TICKS: u64 = 10;
/// Ticks between full publications of the groups' rows (a minute): the incremental
/// ones in between carry every change; this only bounds what a missed one could cost.
const FULL_STATUS_EVERY_TICKS: u64 = 6_000;

/// Requests a shard takes from its inbox before the groups' turn: their prepares share
/// one write and one sync per partition.
const REQUESTS_PER_TURN: usize = 64;

/// How often a shard runs its timers (interval syncs, group expiry).
const TICK_MS: u64 = crate::replication::meta_group::TICK_MS;
/// Frames from peers taken in one turn of the partition groups: enough to batch a
/// burst, few enough that requests and ticks wait little behind it.
const DELIVERIES_PER_TURN: usize = 256;

/// Woken waiting fetches a shard answers per turn of its loop, between its other
/// requests.
const WOKEN_FETCHES_PER_TURN: usize = 64;

/// State of one shard, owned by its loop.
pub(crate) struct Shard {
    pub(crate) id: usize,
    pub(crate) shared: Arc<NodeShared>,
    pub(crate) layout: Rc<RefCell<Arc<Layout>>>,
    partitions: HashMap<PartitionKey, Partition>,
    /// A lone node's partitions whose files hold damage: refused alone, at open.
    refused: HashMap<PartitionKey, RefusedPartition>,
    /// Partitions whose files could not be opened for want of a file descriptor,
    /// opened again when their wait is over.
    reopen_waiting: HashMap<PartitionKey, reopen::WaitingReopen>,
    groups: PartitionGroups,
    /// Partitions under `fsync = interval` with appends not yet synced.
    dirty: HashSet<PartitionKey>,
    pub(crate) draining: watch::Sender<bool>,
    /// Bumped with each layout applied: connections check their logins against it.
    access_changed: watch::Sender<u64>,
    pub(crate) meta: Option<crate::coordinator::MetaService>,
    last_retention_ms: u64,
    /// Partitions whose woken waiting fetches are still to be answered, in turn, and
    /// the same as a set, so queueing one is O(1).
    woken: VecDeque<PartitionKey>,
    woken_queued: HashSet<PartitionKey>,
    /// Frames from peers for the groups of this shard (the bus delivers them here).
    deliveries: Option<mpsc::UnboundedReceiver<braid_bus::Delivery>>,
    /// The bus's bundles coming up and going down (a bundle down wakes the quiescent
    /// backups of that peer's groups).
    bundles: Option<tokio::sync::broadcast::Receiver<braid_bus::BundleEvent>>,
    ticks: u64,
    /// Partitions were opened or dropped since the board last had every row.
    layout_changed: bool,
    /// Layouts queued, the first being opened a chunk at a time.
    applying: VecDeque<layout::Applying>,
    /// When the next chunk of a queued layout may run.
    apply_resume: tokio::time::Instant,
    /// This shard's part of a walk retiring ended client sessions, if one runs.
    walk: Option<retire::ShardWalk>,
}

impl Shard {
    /// A shard with its partition groups' states opened (no partition yet: they come
    /// with the first layout).
    ///
    /// # Errors
    /// The groups' durable states cannot be read.
    pub(crate) fn new(
        id: usize,
        shared: Arc<NodeShared>,
        meta: Option<crate::coordinator::MetaService>,
        groups: crate::replication::partition_groups::Opening,
    ) -> Result<Self, ShardError> {
        let mut groups = groups.open(id).map_err(ShardError::Groups)?;
        groups.sync_through(crate::replication::partition_groups::SyncLink {
            syncer: Arc::clone(&shared.syncer),
            done: shared.controls[id].clone(),
        });
        Ok(Self {
            id,
            shared,
            layout: Rc::new(RefCell::new(Arc::new(Layout::default()))),
            partitions: HashMap::new(),
            refused: HashMap::new(),
            reopen_waiting: HashMap::new(),
            groups,
            dirty: HashSet::new(),
            draining: watch::channel(false).0,
            access_changed: watch::channel(0).0,
            meta,
            last_retention_ms: now_ms(),
            woken: VecDeque::new(),
            woken_queued: HashSet::new(),
            deliveries: None,
            bundles: None,
            ticks: 0,
            layout_changed: true,
            applying: VecDeque::new(),
            apply_resume: tokio::time::Instant::now(),
            walk: None,
        })
    }

    /// Starts the replica bus (shard 0 does: it accepts the links and hands each to
    /// its owner shard's runtime in `runtimes`), and gives every shard its receiver and
    /// its sender.
    pub(crate) fn start_bus(
        &mut self,
        config: braid_bus::BusConfig,
        listener: std::net::TcpListener,
        runtimes: Vec<tokio::runtime::Handle>,
    ) -> Result<(), ShardError> {
        let Some(meta) = self.meta.as_mut() else {
            return Err(ShardError::Bus(
                "it runs on the shard that holds the metadata".into(),
            ));
        };
        listener
            .set_nonblocking(true)
            .map_err(|e| ShardError::Bus(format!("its listener: {e}")))?;
        let listener = tokio::net::TcpListener::from_std(listener)
            .map_err(|e| ShardError::Bus(format!("its listener: {e}")))?;
        let shards = self.shared.shards();
        let route: braid_bus::DeliveryRoute = Arc::new(move |group| {
            crate::replication::partition_groups::key_of(group)
                .map_or(0, |key| key.shard(shards) as u16)
        });
        let (bus, receivers) = braid_bus::Bus::start_on_shards(config, listener, runtimes, route)
            .map_err(|e| ShardError::Bus(e.to_string()))?;
        for (shard, deliveries) in receivers.into_iter().enumerate() {
            let sender = bus.shard_sender(shard as u16);
            let bundles = bus.subscribe();
            if shard == self.id {
                self.groups.attach_bus(sender);
                self.deliveries = Some(deliveries);
                self.bundles = Some(bundles);
            } else {
                let _ = self.shared.controls[shard].send(Control::Bus {
                    deliveries,
                    sender,
                    bundles,
                });
            }
        }
        let _ = self.shared.bus.set(bus.view());
        meta.attach_bus(bus);
        Ok(())
    }

    /// Frames from peers, `first` and every other one already waiting (up to
    /// [`DELIVERIES_PER_TURN`]): the metadata group's go to the metadata service, the
    /// partition groups' to the groups in one turn (one write of their durable states
    /// for all of them).
    fn handle_deliveries(&mut self, first: braid_bus::Delivery) {
        let mut partitions = Vec::new();
        let mut next = Some(first);
        while let Some(delivery) = next.take() {
            if delivery.frame.group == crate::replication::meta_group::METADATA_GROUP {
                if let Some(meta) = self.meta.as_mut() {
                    meta.deliver(&self.shared, &delivery);
                }
            } else {
                partitions.push(delivery);
            }
            if partitions.len() < DELIVERIES_PER_TURN {
                next = self.deliveries.as_mut().and_then(|d| d.try_recv().ok());
            }
        }
        if !partitions.is_empty() {
            let moved = self.groups.deliver(&partitions);
            self.apply_moved(moved);
        }
    }

    /// Moves the high watermarks a turn of the groups committed, and opens again the
    /// partitions whose files a wake found changed.
    fn apply_moved(&mut self, moved: Moved) {
        for (key, high_watermark) in moved {
            if let Some(partition) = self.partitions.get_mut(&key) {
                partition.commit(high_watermark);
                if partition.has_woken() {
                    self.queue_woken(key);
                }
            }
        }
        self.reopen_changed_files();
    }

    /// Who serves `key` here: a lone node leads every partition.
    fn role(&self, key: PartitionKey) -> Role {
        self.groups.role(key)
    }

    /// The `NotLeader` answer for a partition led by `primary`, naming where it is;
    /// on a single node whose partition groups stopped after a failed disk operation,
    /// the failure itself: there is no other member to go to, and "choosing a primary;
    /// retry" had its clients retry until their deadline (an outside review of issue
    /// 24, a full disk).
    fn not_leader(&self, primary: Option<u8>) -> NodeError {
        match self.groups.failure() {
            Some(reason) if self.groups.members() == 1 => {
                crate::replication::partition_groups::stopped(reason)
            }
            _ => self.shared.not_leader("this partition", primary),
        }
    }

    fn metrics(&self) -> &ShardMetrics {
        &self.shared.metrics[self.id]
    }

    /// Publishes the groups' rows on the board and each partition's primary: in full
    /// after the layout changed (or every [`FULL_STATUS_EVERY_TICKS`]), else only the
    /// groups stepped since the last time, so an idle shard of many partitions costs
    /// little (100,000 idle partitions on one node took 73% of a core rebuilding every
    /// row ten times a second).
    fn publish_statuses(&mut self) {
        let full = std::mem::take(&mut self.layout_changed)
            || self.ticks.is_multiple_of(FULL_STATUS_EVERY_TICKS);
        let mut rows = if full {
            self.groups.all_statuses()
        } else {
            self.groups.changed_statuses()
        };
        for row in &rows {
            let partition = crate::replication::partition_groups::key_of(row.group)
                .and_then(|key| Some((key, self.partitions.get(&key)?)));
            if let Some((key, partition)) = partition {
                if let Some((primary, view)) = self.groups.primary_of(key) {
                    partition.set_primary(primary, view);
                }
            }
        }
        if let Some(meta) = self.meta.as_ref().and_then(|meta| meta.status()) {
            // Room for exactly one more: a full publication's rows fill their vector,
            // and a push doubled it (a heap profile of 10,000 idle partitions found
            // half the board's 190 bytes per partition unused).
            rows.reserve_exact(1);
            rows.push(meta);
        }
        if full {
            self.shared.board.publish(self.id, rows);
        } else {
            self.shared.board.update(self.id, rows);
        }
        if self.groups.failure().is_some() {
            self.shared.board.set_stopped(self.id);
        }
    }

    /// Recovers the lone groups of the partitions just opened together (each turn's
    /// states written once for all of them: a node of 100,000 partitions restarted
    /// with an `fdatasync` of the states table per partition when each recovered
    /// alone), then releases their files until they are used.
    fn settle_opened(
        &mut self,
        opened: &[(PartitionKey, Arc<crate::layout::TopicRoute>)],
    ) -> Result<(), ShardError> {
        let moved = self.groups.recover_opened().map_err(ShardError::Recover)?;
        self.apply_moved(moved);
        for (key, _) in opened {
            if self.partitions.contains_key(key) {
                self.groups
                    .release_files(*key)
                    .map_err(|source| ShardError::Release {
                        topic_id: key.topic_id,
                        partition: key.partition,
                        source,
                    })?;
            }
        }
        Ok(())
    }

    /// Opens partition `key` of `topic` (its files made or found) and publishes its
    /// high watermark and primary; [`Shard::settle_opened`] then recovers it.
    fn open_partition(
        &mut self,
        key: PartitionKey,
        topic: &crate::layout::TopicRoute,
    ) -> Result<(), ShardError> {
        let dir = key.dir(self.shared.data_dir());
        let log_config = topic.log_config(&self.shared.config);
        let new_topics_from = self
            .shared
            .new_topics_from
            .load(std::sync::atomic::Ordering::Acquire);
        if new_topics_from != crate::mailbox::TOPICS_UNKNOWN {
            self.groups.trust_new_topics_from(new_topics_from);
        }
        let high_watermark = match self.groups.add(key, &dir, log_config, now_ms()) {
            Ok(high_watermark) => high_watermark,
            Err(err) if self.groups.members() == 1 && err.is_damage() => {
                // A lone node has no peer to repair it from: this partition alone is
                // refused, and the node serves the others.
                self.refuse(key, topic, &err.to_string());
                return Ok(());
            }
            Err(source) => {
                return Err(ShardError::OpenPartition {
                    topic: topic.name.clone(),
                    partition: key.partition,
                    source,
                })
            }
        };
        let partition = Partition::new(high_watermark);
        if let Some((primary, view)) = self.groups.primary_of(key) {
            partition.set_primary(primary, view);
        }
        if let Ok(mut published) = self.shared.partitions_published.write() {
            published.insert(key, partition.published());
        }
        self.partitions.insert(key, partition);
        Ok(())
    }

    /// Wakes the files of partition `key` for a read; files found changed since they
    /// went to sleep drop its group, and the partition is opened again (or refused) at
    /// once, so that the read is answered from what that finds. Returns whether it was.
    /// (The read was answered `PartitionNotFound`, "not on this node", which a consumer
    /// takes for a partition that does not exist: an outside review of issue 24.)
    fn reopened_at_wake(&mut self, key: PartitionKey) -> bool {
        let changed = self.partitions.contains_key(&key) && self.groups.log(key).is_none();
        if changed {
            self.reopen_changed_files();
        }
        changed
    }

    /// Refuses partition `key` of `topic`, whose files hold damage a lone node has no
    /// peer to repair from (`damage`): it takes no writes and serves what its log
    /// holds intact, while the node serves the others.
    fn refuse(&mut self, key: PartitionKey, topic: &crate::layout::TopicRoute, damage: &str) {
        let reason = format!("partition {}/{}: {damage}", topic.name, key.partition);
        tracing::error!(
            topic = %topic.name,
            partition = key.partition,
            %reason,
            "a partition's files are damaged: it takes no writes and serves only what its \
             log holds; restore it or see docs/operations.md"
        );
        let dir = key.dir(self.shared.data_dir());
        let log_config = topic.log_config(&self.shared.config);
        self.refused.insert(
            key,
            RefusedPartition::open(&dir, tag_of(key), log_config, reason),
        );
    }

    /// Counts and logs, once, a partition whose log began to refuse writes.
    fn report_poisoned(&self, key: PartitionKey, reason: Option<String>) {
        if let Some(reason) = reason {
            add(&self.metrics().partitions_poisoned, 1);
            tracing::error!(
                topic = key.topic_id,
                partition = key.partition,
                %reason,
                "partition refuses writes after a failed disk operation; fix the disk and restart the node"
            );
        }
    }

    /// Notes a partition with woken waiting fetches to answer.
    fn queue_woken(&mut self, key: PartitionKey) {
        if self.woken_queued.insert(key) {
            self.woken.push_back(key);
        }
    }

    /// Answers up to `budget` woken waiting fetches, a partition at a time.
    fn answer_woken(&mut self, mut budget: usize) {
        while budget > 0 {
            let Some(key) = self.woken.pop_front() else {
                return;
            };
            let (Some(partition), Some(log)) =
                (self.partitions.get_mut(&key), self.groups.log(key))
            else {
                self.woken_queued.remove(&key);
                continue;
            };
            let fetches = partition.take_woken(budget);
            budget -= fetches.len().max(1).min(budget);
            let mut bytes = 0u64;
            let mut damage = None;
            for fetch in fetches {
                if fetch.reply.is_closed() {
                    continue; // its connection stopped waiting
                }
                let (outcome, damaged) =
                    read_for_fetch(&self.shared, partition, log, fetch.offset, fetch.max_bytes);
                damage = damage.or(damaged);
                if let Ok(found) = &outcome {
                    bytes += found.read.bytes().len() as u64;
                }
                let _ = fetch.reply.send(outcome);
            }
            if partition.has_woken() {
                self.woken.push_back(key);
            } else {
                self.woken_queued.remove(&key);
            }
            add(&self.metrics().fetch_bytes, bytes);
            if let Some(damage) = damage {
                self.groups.damage_met(key, damage);
            }
        }
    }

    pub(crate) fn handle_request(&mut self, request: ShardRequest) {
        match request {
            ShardRequest::Produce {
                key,
                batch,
                reply,
                checked,
            } => {
                let records = u64::from(batch.record_count());
                let bytes = batch.len() as u64;
                if let Some(refused) = self.refused.get(&key) {
                    let _ = reply.send(Err(refused.refusal()));
                    return;
                }
                if let Some(busy) = self.waiting_for_descriptors(key) {
                    let _ = reply.send(Err(busy));
                    return;
                }
                let Some(partition) = self.partitions.get(&key) else {
                    let _ = reply.send(Err(NodeError::new(
                        ErrorCode::PartitionNotFound,
                        "partition not on this node",
                    )));
                    return;
                };
                if partition.sealed() {
                    let _ = reply.send(Err(NodeError::new(
                        ErrorCode::PartitionSealed,
                        "partition is sealed",
                    )));
                    return;
                }
                match self.role(key) {
                    Role::Primary => {
                        if self.groups.log(key).is_some_and(|log| {
                            matches!(
                                log.config().fsync,
                                braid_storage::FsyncPolicy::Interval { .. }
                            )
                        }) {
                            self.dirty.insert(key);
                        }
                        // Checked again against this shard's own layout: a walk
                        // retiring ended sessions starts here only once the layout
                        // knows they ended, so none of them is admitted after it.
                        let checked = match SessionTag::of(batch.header()) {
                            Tagged::Yes(tag) => {
                                match self.layout.borrow().session_check(tag, key) {
                                    Ok(here) if here.metadata_op >= checked.metadata_op => here,
                                    Ok(_) => checked,
                                    Err(refusal) => {
                                        let _ = reply.send(Err(refusal));
                                        return;
                                    }
                                }
                            }
                            Tagged::No | Tagged::Invalid => checked,
                        };
                        self.groups.produce(key, batch, reply, checked);
                        add(&self.metrics().produce_records, records);
                        add(&self.metrics().produce_bytes, bytes);
                    }
                    Role::Backup(primary) => {
                        let moved = self.groups.nudge(key);
                        self.apply_moved(moved);
                        let _ = reply.send(Err(self.not_leader(primary)));
                    }
                }
            }
            ShardRequest::Fetch {
                key,
                offset,
                max_bytes,
                wait,
                reply,
            } => {
                if let Some(refused) = self.refused.get_mut(&key) {
                    let _ = reply.send(refused.fetch(&self.shared, offset, max_bytes));
                    return;
                }
                if let Some(busy) = self.waiting_for_descriptors(key) {
                    let _ = reply.send(Err(busy));
                    return;
                }
                if let Role::Backup(primary) = self.role(key) {
                    if self.partitions.contains_key(&key) {
                        let moved = self.groups.nudge(key);
                        self.apply_moved(moved);
                        let _ = reply.send(Err(self.not_leader(primary)));
                        return;
                    }
                }
                if self.reopened_at_wake(key) {
                    if let Some(refused) = self.refused.get_mut(&key) {
                        let _ = reply.send(refused.fetch(&self.shared, offset, max_bytes));
                        return;
                    }
                    if let Some(busy) = self.waiting_for_descriptors(key) {
                        let _ = reply.send(Err(busy));
                        return;
                    }
                }
                let (Some(partition), Some(log)) =
                    (self.partitions.get_mut(&key), self.groups.log(key))
                else {
                    let _ = reply.send(Err(NodeError::new(
                        ErrorCode::PartitionNotFound,
                        "partition not on this node",
                    )));
                    return;
                };
                if wait && offset >= partition.high_watermark() && offset >= log.start_offset() {
                    partition.wait_for_commit(crate::partition::WaitingFetch {
                        offset,
                        max_bytes,
                        reply,
                    });
                    return;
                }
                let (outcome, damaged) =
                    read_for_fetch(&self.shared, partition, log, offset, max_bytes);
                if let Ok(found) = &outcome {
                    add(&self.metrics().fetch_bytes, found.read.bytes().len() as u64);
                }
                let _ = reply.send(outcome);
                if let Some(damage) = damaged {
                    self.groups.damage_met(key, damage);
                }
            }
            ShardRequest::ListOffsets { key, spec, reply } => {
                self.reopened_at_wake(key);
                if let Some(refused) = self.refused.get_mut(&key) {
                    let _ = reply.send(refused.list_offset(spec));
                    return;
                }
                if let Some(busy) = self.waiting_for_descriptors(key) {
                    let _ = reply.send(Err(busy));
                    return;
                }
                let result = match (self.partitions.get(&key), self.groups.log(key)) {
                    (Some(partition), Some(log)) => partition.list_offset(log, spec),
                    _ => Err(NodeError::new(
                        ErrorCode::PartitionNotFound,
                        "partition not on this node",
                    )),
                };
                let _ = reply.send(result);
            }
            ShardRequest::Offsets { keys, reply } => {
                let found = keys
                    .into_iter()
                    .filter_map(|key| {
                        if let Some(refused) = self.refused.get(&key) {
                            let (start, end) = refused.offsets()?;
                            return Some((key, start, end));
                        }
                        let high_watermark = self.partitions.get(&key)?.high_watermark();
                        let start = self.groups.log_start(key)?;
                        Some((key, start, high_watermark))
                    })
                    .collect();
                let _ = reply.send(found);
            }
            ShardRequest::Admin { request, reply } => match self.meta.take() {
                Some(mut meta) => {
                    meta.handle(&self.shared, request, reply);
                    self.meta = Some(meta);
                }
                None => {
                    let _ = reply.send(Err(NodeError::new(
                        ErrorCode::Internal,
                        "admin request reached a shard without metadata",
                    )));
                }
            },
        }
    }

    /// Returns false when the shard should stop.
    pub(crate) fn handle_control(&mut self, control: Control) -> bool {
        match control {
            Control::Connection(stream, stranger) => {
                let context = crate::connection::ServeContext {
                    shared: Arc::clone(&self.shared),
                    layout: Rc::clone(&self.layout),
                    metrics: Arc::clone(&self.shared.metrics[self.id]),
                    draining: self.draining.subscribe(),
                    access_changed: self.access_changed.subscribe(),
                };
                crate::connection::spawn(context, stream, stranger);
            }
            Control::Listener(listener) => {
                crate::connection::spawn_acceptor(
                    Arc::clone(&self.shared),
                    self.draining.subscribe(),
                    listener,
                );
            }
            Control::Layout { update, done } => self.queue_layout(update, done),
            Control::GroupSynced { group, job, result } => {
                let moved = self.groups.on_synced(group, job, result);
                self.apply_moved(moved);
            }
            Control::Bus {
                deliveries,
                sender,
                bundles,
            } => {
                self.groups.attach_bus(sender);
                self.deliveries = Some(deliveries);
                self.bundles = Some(bundles);
            }
            Control::Barrier(done) => {
                let _ = done.send(());
            }
            Control::Drain => {
                let _ = self.draining.send(true);
            }
            Control::Retire { batch, done } => self.start_walk(batch, done, now_ms()),
            Control::Shutdown { done } => {
                self.close_all();
                let _ = done.send(());
                return false;
            }
        }
        true
    }

    pub(crate) fn tick(&mut self) {
        let now = now_ms();
        let due: Vec<PartitionKey> = self.dirty.drain().collect();
        self.groups.sync_due(&due, now);
        let moved = self.groups.tick();
        self.apply_moved(moved);
        let syncs = self.groups.take_syncs_started();
        add(&self.metrics().fsyncs_requested, syncs);
        let resends = self.groups.take_resends_answered();
        add(&self.metrics().resends_answered, resends);
        let transfers = self.groups.take_transfers_done();
        add(&self.metrics().state_transfers, transfers);
        let repaired = self.groups.take_batches_repaired();
        add(&self.metrics().batches_repaired, repaired);
        self.metrics().partitions_awaiting_repair.store(
            self.groups.awaiting_repair(),
            std::sync::atomic::Ordering::Relaxed,
        );
        let (slept, woken, over_budget) = self.groups.take_sleep_counts();
        add(&self.metrics().files_slept, slept);
        add(&self.metrics().files_woken, woken);
        add(&self.metrics().files_released_over_budget, over_budget);
        self.ticks += 1;
        self.retry_waiting_reopens(now);
        let mut repairs = self.groups.take_repairs();
        if let Some(meta) = self.meta.as_mut() {
            let meta_repairs = meta.take_repairs();
            repairs.prepares += meta_repairs.prepares;
            repairs.snapshots += meta_repairs.snapshots;
        }
        add(&self.metrics().repair_prepares_requested, repairs.prepares);
        add(&self.metrics().batches_repaired, repairs.damage_rewritten);
        add(
            &self.metrics().repair_snapshots_requested,
            repairs.snapshots,
        );
        if self.ticks.is_multiple_of(PRIMARIES_EVERY_TICKS) {
            self.publish_statuses();
        }
        if self.ticks.is_multiple_of(retire::RETIRE_EVERY_TICKS) {
            self.step_retirement(now);
        }
        if now.saturating_sub(self.last_retention_ms) >= self.shared.config.retention_check_ms {
            self.last_retention_ms = now;
            self.apply_retention(now);
        }
        if let Some(meta) = self.meta.as_mut() {
            meta.tick(&self.shared, now);
        }
    }

    fn apply_retention(&mut self, now: u64) {
        let keys: Vec<PartitionKey> = self.partitions.keys().copied().collect();
        let keys: Vec<PartitionKey> = keys
            .into_iter()
            .filter(|k| self.groups.retention_may_apply(*k, now))
            .collect();
        for key in keys {
            let Some(outcome) = self.groups.apply_retention(key, now) else {
                continue;
            };
            if let (Some(partition), Some(log)) =
                (self.partitions.get_mut(&key), self.groups.log(key))
            {
                let poisoned = partition.newly_poisoned(log);
                self.report_poisoned(key, poisoned);
                match outcome {
                    Ok(outcome) if outcome.segments_deleted > 0 => {
                        tracing::info!(
                            topic = key.topic_id,
                            partition = key.partition,
                            deleted = outcome.segments_deleted,
                            "retention"
                        );
                    }
                    Ok(_) => {}
                    Err(err) => tracing::warn!(%err, "retention failed"),
                }
            }
        }
    }

    fn close_all(&mut self) {
        self.partitions.clear();
        self.groups.close();
        if let Some(meta) = self.meta.take() {
            meta.close();
        }
    }

    /// The shard's loop: control first (it unblocks others), then requests, then timers.
    pub(crate) async fn run(
        mut self,
        mut inbox: mpsc::Receiver<ShardRequest>,
        mut controls: mpsc::UnboundedReceiver<Control>,
    ) {
        let mut ticker = tokio::time::interval(Duration::from_millis(TICK_MS));
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                biased;
                control = controls.recv() => match control {
                    Some(control) => if !self.handle_control(control) { break },
                    None => break,
                },
                Some(request) = inbox.recv() => {
                    self.handle_request(request);
                    // What queued meanwhile joins this turn: the groups then write
                    // and sync each partition once for all of it.
                    for _ in 1..REQUESTS_PER_TURN {
                        match inbox.try_recv() {
                            Ok(request) => self.handle_request(request),
                            Err(_) => break,
                        }
                    }
                    let moved = self.groups.flush();
                    self.apply_moved(moved);
                    // One turn of woken fetches after each turn of requests: neither
                    // side can hold up the other for long. So with a layout's chunks.
                    self.answer_woken(WOKEN_FETCHES_PER_TURN);
                    self.apply_if_due();
                }
                () = std::future::ready(()), if !self.woken.is_empty() => {
                    self.answer_woken(WOKEN_FETCHES_PER_TURN);
                }
                Some(delivery) = next_delivery(&mut self.deliveries) => {
                    self.handle_deliveries(delivery);
                    self.apply_if_due();
                }
                lost = next_bundle_down(&mut self.bundles) => {
                    let moved = self.groups.peers_lost(&lost);
                    self.apply_moved(moved);
                }
                _ = ticker.tick() => self.tick(),
                // Last: a queued layout's next chunk, once due (also after a turn of
                // requests or frames that finds it due). Its wait lets the shard's
                // connections, tasks on this thread, read their requests.
                () = tokio::time::sleep_until(self.apply_resume), if self.applying() => {
                    self.apply_step();
                }
            }
        }
    }
}

/// The next frame from a peer; pending forever on a shard without a bus.
async fn next_delivery(
    deliveries: &mut Option<mpsc::UnboundedReceiver<braid_bus::Delivery>>,
) -> Option<braid_bus::Delivery> {
    match deliveries {
        Some(deliveries) => deliveries.recv().await,
        None => std::future::pending().await,
    }
}

/// The peers whose bundle went down (every peer, if events were missed); pending
/// forever on a shard without a bus.
async fn next_bundle_down(
    bundles: &mut Option<tokio::sync::broadcast::Receiver<braid_bus::BundleEvent>>,
) -> Vec<u8> {
    use tokio::sync::broadcast::error::RecvError;
    let Some(receiver) = bundles else {
        return std::future::pending().await;
    };
    loop {
        match receiver.recv().await {
            Ok(event) if !event.up => return vec![event.peer],
            Ok(_) => {}
            Err(RecvError::Lagged(_)) => return (0..=u8::MAX).collect(),
            Err(RecvError::Closed) => {
                *bundles = None;
                return std::future::pending().await;
            }
        }
    }
}

/// Reads committed batches for a fetch into a buffer from the node's pool. Returns the
/// answer, and the damage the read met, if any, for the partition's group.
pub(crate) fn read_for_fetch(
    shared: &NodeShared,
    partition: &Partition,
    log: &mut PartitionLog,
    offset: u64,
    max_bytes: u32,
) -> (
    Result<FetchOutcome, NodeError>,
    Option<crate::partition::ReadDamage>,
) {
    if let Some((from, to)) = partition.lacking(log, offset) {
        return (Err(shared.copying(from, to)), None);
    }
    let buffer = shared.read_buffers.take();
    let checked = partition.read(log, offset, max_bytes, buffer);
    let outcome = checked.read.map(|read| FetchOutcome {
        high_watermark: partition.high_watermark(),
        start_offset: log.start_offset(),
        read,
    });
    (outcome, checked.damage)
}
