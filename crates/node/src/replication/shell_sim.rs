//! The node's replication shell under the simulator: three members, each the node's
//! real [`PartitionGroups`] (its [`super::shard_host::ShardHost`] turn ordering, the
//! partition journal over the storage crate's partition log, the shared states table,
//! checkpoints, boot stamps, state transfer by segments and the partition state
//! machine, with the journals' syncs off the shard's turn as the node runs them) and
//! its real metadata group ([`metadata`]), with the node's pipeline and session
//! counts, on real files laid out as a node's data directory. Everything else is drawn from one seed: which member a producer finds
//! leading, the network between members (delay, loss, duplication, reordering, cut
//! links), and crashes, as `kill -9` (the page cache survives) or as power loss.
//!
//! Power loss is the POSIX model over every disk operation the shell made since the
//! member's last boot ([`PowerModel`], fed from the storage crate's disk hook): unsynced
//! writes lost, kept, cut to a prefix, zeroed below a later write that landed, or torn
//! at a page, file by file, and directory entries lost or kept. The member then boots
//! again (a new boot id) from what that left.
//!
//! What is checked: a member restarts from every state a crash leaves; no offset is
//! acknowledged twice for different records; and at the end, with faults stopped, every
//! member holds the same log, batch by batch and byte for byte, in which every
//! acknowledged record sits at its acknowledged offset, and the same metadata, with
//! every stream whose creation was acknowledged, before and after a clean restart of
//! all members.
//!
//! `cargo test -p braid-node --lib shell_sim` runs the seeds CI runs;
//! `scripts/sim-soak.sh --shell` runs many more.

use std::collections::BTreeMap;
use std::path::PathBuf;

use braid_bus::Frame;
use braid_sim::Prng;
use braid_storage::crash::PowerModel;
use braid_storage::disk::hook;
use braid_storage::{FsyncPolicy, LogConfig};
use tokio::sync::oneshot;

use files::damage_at_rest;
pub(crate) use outcome::Outcome;

use super::boot::BootId;
use super::meta_group::METADATA_GROUP;
use super::meta_group::{MetaGroup, MetaOpening, Timing};
use super::partition_groups::{PartitionGroups, Role};
use super::partition_journal::PartitionJournalError;
use crate::error::NodeError;
use crate::layout::PartitionKey;

/// How often (ticks) every member's readable records are checked.
const SERVE_CHECK_TICKS: u64 = 100;
/// Ticks between retention passes, when a seed has retention ([`Shape::retention`]).
const RETENTION_TICKS: u64 = 50;
/// Chance per tick, in percent, that a member's sync thread runs a round of the syncs
/// waiting (some of them, oldest first).
const SYNC_ROUND_PERCENT: u64 = 50;
/// The node's default heartbeat timeout, so the groups keep the node's timing.
const HEARTBEAT_TIMEOUT_MS: u64 = 2_000;

/// Why a run failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Failure {
    pub(crate) seed: u64,
    pub(crate) tick: u64,
    pub(crate) what: String,
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "seed {} tick {}: {}", self.seed, self.tick, self.what)
    }
}

#[derive(Debug)]
struct Member {
    /// The member's data directory: its identity, `metadata/` and the partitions.
    dir: PathBuf,
    groups: Option<PartitionGroups>,
    meta: Option<MetaGroup<u64>>,
    /// The partition journals' syncs, off the shard's turn as the node runs them: held
    /// until the simulator runs them, dropped unrun by a crash.
    syncs: Option<Syncs>,
    /// The disk as the POSIX model sees it since this member's last boot.
    power: PowerModel,
    /// Boots so far: a power loss starts a new one.
    boots: u64,
    /// Whether it ever started: the first start is told `--init`.
    started: bool,
    restart_at: Option<u64>,
    /// Partition -> the high watermark the node's shard would serve: the one `add`
    /// returned, raised only by the moves the groups report (as `Shard` does).
    published: BTreeMap<u32, u64>,
    /// Partition -> the tick of the next try to open it again: its open was refused a
    /// file descriptor (as `Shard` retries it every 250 ms).
    reopen_waiting: BTreeMap<u32, u64>,
}

/// A member's sync thread, as the simulator runs it.
#[derive(Debug)]
struct Syncs {
    syncer: std::sync::Arc<braid_storage::Syncer>,
    done: tokio::sync::mpsc::UnboundedReceiver<crate::mailbox::Control>,
}

#[derive(Debug)]
struct Packet {
    at: u64,
    from: u8,
    to: u8,
    frame: Frame,
}

#[derive(Debug)]
struct Waiting {
    partition: u32,
    values: Vec<Vec<u8>>,
    /// The client session and request number it is, if any.
    tag: Option<(u64, u32)>,
    /// Sent before, failed, and sent again.
    resent: bool,
    answer: oneshot::Receiver<Result<(u64, u64), NodeError>>,
}

/// One seeded run.
#[derive(Debug)]
pub(crate) struct Run {
    seed: u64,
    prng: Prng,
    shape: Shape,
    tick: u64,
    /// Removed with the run.
    _root: tempfile::TempDir,
    members: Vec<Member>,
    network: Vec<Packet>,
    /// One-way cuts (from, to).
    cut: Vec<(u8, u8)>,
    waiting: Vec<Waiting>,
    /// (partition, offset) -> the value acknowledged there.
    acked: BTreeMap<(u32, u64), Vec<u8>>,
    next_value: u64,
    outcome: Outcome,
    failure: Option<String>,
    /// Print faults and boots to stderr (`BRAID_SHELL_SIM_TRACE=1`).
    trace: bool,
    /// With `trace`, every member's groups every 20 ticks (`BRAID_SHELL_SIM_STATUS=1`).
    trace_status: bool,
    /// `BRAID_SHELL_SIM_TRACE_GROUP=P`: every frame of partition P's group delivered.
    trace_group: Option<u64>,
    /// What the serve checks have verified ([`served`]).
    served: served::Checked,
    /// The metadata client's proposals ([`metadata`]).
    proposals: metadata::Proposals,
    /// Draws for damage to sleeping files, apart from the seed's others.
    asleep_draws: Prng,
    /// Draws for the producers' sessions, apart from the others.
    session_draws: Prng,
    /// Draws for consumer groups' ops ([`members`]), apart from the others.
    group_draws: Prng,
    /// The client sessions' requests ([`producer`]).
    sessions: producer::Sessions,
    /// A producer's session ended and retired ([`retire`]).
    retiring: retire::Retiring,
    /// Draws for members running out of file descriptors, apart from the others.
    descriptor_draws: Prng,
    /// The member out of file descriptors, and the tick it has them again.
    descriptors_out: Option<(u8, u64)>,
    /// Damage to sleeping files drawn and not done yet (none slept).
    asleep_damage_due: bool,
    /// (member, partition) -> the scrub's whole passes when its sleeping files were
    /// damaged: convergence waits for a pass after it (damage a wake does not check,
    /// in a segment, is found by the scrub like any other).
    scrub_floor: BTreeMap<(u8, u32), u64>,
}

/// Where a member keeps partition `p` (the node's `partitions/` under its data
/// directory).
fn partition_dir(data_dir: &std::path::Path, p: u32) -> PathBuf {
    data_dir.join("partitions").join(format!("p{p}"))
}

fn key(partition: u32) -> PartitionKey {
    PartitionKey {
        topic_id: 1,
        partition,
    }
}

impl Run {
    /// Builds the cluster of `seed` in a new temporary directory.
    ///
    /// # Errors
    /// A member cannot be created.
    pub(crate) fn new(seed: u64, variant: Variant) -> Result<Self, Failure> {
        let mut prng = Prng::new(seed);
        let mut shape = Shape::from_seed(&mut prng);
        shape.fsync_never = Prng::new(seed.rotate_left(17) ^ 0x5eed).chance(33)
            || std::env::var_os("BRAID_SHELL_SIM_NEVER").is_some();
        shape.retention = Prng::new(seed.rotate_left(29) ^ 0x7e7e).chance(33)
            || std::env::var_os("BRAID_SHELL_SIM_RETENTION").is_some();
        shape.sleep_ticks = std::env::var("BRAID_SHELL_SIM_SLEEP_TICKS")
            .ok()
            .and_then(|t| t.parse().ok())
            .unwrap_or(
                [3, 10, 40, 100][Prng::new(seed.rotate_left(29) ^ 0x51ee).below(4) as usize],
            );
        shape.scrub_wake_ticks = if Prng::new(seed.rotate_left(37) ^ 0x5c7b).chance(50) {
            10
        } else {
            1
        };
        // Half the seeds hold fewer partitions' files open than they have, so that
        // every kind of use releases another partition's files; half (drawn apart)
        // put fewer to sleep a pass than they have, so idle partitions wait awake.
        let partitions = shape.partitions;
        let below_partitions = |env: &str, rotate: u32, salt: u64| {
            let draws = &mut Prng::new(seed.rotate_left(rotate) ^ salt);
            std::env::var(env)
                .ok()
                .and_then(|b| b.parse().ok())
                .unwrap_or(if draws.chance(50) {
                    1 + draws.below(u64::from(partitions.max(2) - 1)) as usize
                } else {
                    usize::MAX
                })
        };
        shape.open_budget = below_partitions("BRAID_SHELL_SIM_OPEN_BUDGET", 41, 0xa3a3);
        shape.sleeps_per_pass = below_partitions("BRAID_SHELL_SIM_SLEEPS_PER_PASS", 43, 0x5ee9);
        if variant.damage && variant.asleep {
            shape.asleep_damage_per_10k = 8;
        }
        if variant.descriptors {
            shape.descriptors_out_per_10k = 30;
        }
        if !variant.damage {
            shape.damage_percent = 0;
        }
        shape.members = variant.members;
        shape.misdirected = variant.damage && variant.misdirected;
        shape.latent = variant.damage && variant.latent;
        // More crashes and cuts, more frames lost and doubled; the same share of power
        // losses and the same draws otherwise, so a seed's shape stays recognisable.
        let scale = variant.fault_scale.max(1);
        shape.crash_per_10k *= scale;
        shape.cut_per_10k *= scale;
        shape.loss_percent = (shape.loss_percent * scale).min(50);
        shape.duplicate_percent = (shape.duplicate_percent * scale).min(50);
        Self::with_shape(seed, prng, shape)
    }

    /// Members of every group.
    fn member_count(&self) -> u8 {
        self.shape.members
    }

    pub(crate) fn with_shape(seed: u64, prng: Prng, shape: Shape) -> Result<Self, Failure> {
        let fail = |what: String| Failure {
            seed,
            tick: 0,
            what,
        };
        // In memory where the machine has it: the simulated disk is the model, and
        // the real one's syncs would only slow the seeds.
        let parent = std::env::var_os("BRAID_SHELL_SIM_DIR")
            .map(PathBuf::from)
            .or_else(|| {
                let shm = PathBuf::from("/dev/shm");
                shm.is_dir().then_some(shm)
            })
            .unwrap_or_else(std::env::temp_dir);
        let root = tempfile::Builder::new()
            .prefix("braid-shell-sim-")
            .tempdir_in(&parent)
            .map_err(|e| fail(format!("temporary directory in {}: {e}", parent.display())))?;
        let mut members = Vec::new();
        for m in 0..shape.members {
            let dir = root.path().join(format!("member-{m}"));
            for p in 0..shape.partitions {
                std::fs::create_dir_all(partition_dir(&dir, p))
                    .map_err(|e| fail(format!("{}: {e}", dir.display())))?;
            }
            let power = PowerModel::of_dir(&dir).map_err(|e| fail(e.to_string()))?;
            members.push(Member {
                dir,
                groups: None,
                meta: None,
                syncs: None,
                power,
                boots: 0,
                started: false,
                restart_at: None,
                published: BTreeMap::new(),
                reopen_waiting: BTreeMap::new(),
            });
        }
        let mut run = Self {
            seed,
            prng,
            shape,
            tick: 0,
            _root: root,
            members,
            network: Vec::new(),
            cut: Vec::new(),
            waiting: Vec::new(),
            acked: BTreeMap::new(),
            next_value: 0,
            outcome: Outcome::default(),
            failure: None,
            trace: std::env::var_os("BRAID_SHELL_SIM_TRACE").is_some(),
            trace_status: std::env::var_os("BRAID_SHELL_SIM_TRACE").is_some()
                && std::env::var_os("BRAID_SHELL_SIM_STATUS").is_some(),
            trace_group: std::env::var("BRAID_SHELL_SIM_TRACE_GROUP")
                .ok()
                .and_then(|p| p.parse::<u32>().ok())
                .map(|p| crate::replication::partition_groups::group_of(key(p))),
            served: served::Checked::default(),
            proposals: metadata::Proposals::default(),
            asleep_draws: Prng::new(seed.rotate_left(43) ^ 0xda7a),
            session_draws: Prng::new(seed.rotate_left(53) ^ 0x5e55),
            group_draws: Prng::new(seed.rotate_left(47) ^ 0x6a0b),
            retiring: retire::Retiring::new(seed, shape.safety_ticks),
            sessions: producer::Sessions::default(),
            descriptor_draws: Prng::new(seed.rotate_left(47) ^ 0xfd),
            descriptors_out: None,
            asleep_damage_due: false,
            scrub_floor: BTreeMap::new(),
        };
        hook::start_tracing();
        for m in 0..run.member_count() {
            run.boot(m);
        }
        match run.failure.take() {
            Some(what) => Err(fail(what)),
            None => Ok(run),
        }
    }

    fn fail(&mut self, what: String) {
        self.failure.get_or_insert(what);
    }

    fn timing() -> Timing {
        Timing::from_heartbeat_timeout_ms(HEARTBEAT_TIMEOUT_MS)
    }

    fn log_config(&self) -> LogConfig {
        LogConfig {
            segment_bytes_max: self.shape.segment_bytes,
            index_interval_bytes: 512,
            fsync: if self.shape.fsync_never {
                FsyncPolicy::Never
            } else {
                FsyncPolicy::Always
            },
            write_behind_bytes: 0,
            cached_tail_bytes: None,
            retention_bytes: self
                .shape
                .retention
                .then_some(2 * u64::from(self.shape.segment_bytes)),
            ..LogConfig::default()
        }
    }

    fn now_ms(&self) -> u64 {
        1_800_000_000_000 + self.tick * super::meta_group::TICK_MS
    }

    /// Starts member `m` from what its directory holds, as the node does.
    fn boot(&mut self, m: u8) {
        let log_config = self.log_config();
        let now_ms = self.now_ms();
        let nonce = self.prng.next_u64();
        let interval = self.shape.checkpoint_interval;
        let partitions = self.shape.partitions;
        let count = self.member_count();
        let member = &mut self.members[usize::from(m)];
        let opening = MetaOpening {
            node: m,
            members: count,
            timing: Self::timing(),
            nonce: nonce ^ 0x6d65_7461,
            rejoined: false,
            lost: false,
            checkpoint_interval: interval,
        };
        // The node's layout: `metadata/`, `replication/` (the states tables) and
        // `partitions/` under the data directory.
        let states_dir = member.dir.join("replication");
        if let Err(err) = braid_storage::create_dir_durable(&states_dir) {
            self.fail(format!("member {m}: {}: {err}", states_dir.display()));
            return;
        }
        let mut meta = match metadata::open(&member.dir, m, opening, !member.started) {
            Ok(meta) => meta,
            Err(err) => {
                let what = format!("member {m} cannot start its metadata group: {err}");
                self.fail(what);
                return;
            }
        };
        meta.keep_sent();
        member.started = true;
        let mut boot_bytes = [0u8; 16];
        boot_bytes[..8].copy_from_slice(&member.boots.to_be_bytes());
        boot_bytes[8] = m;
        let boot = BootId::from_bytes(boot_bytes);
        let opened =
            PartitionGroups::open_in_boot(&states_dir, m, count, Self::timing(), nonce, boot);
        let mut groups = match opened {
            Ok(groups) => groups,
            Err(err) => {
                let what = format!("member {m} cannot start: {err}");
                self.fail(what);
                return;
            }
        };
        groups.keep_sent();
        groups.set_checkpoint_interval(interval);
        groups.set_sleep_ticks(self.shape.sleep_ticks);
        groups.set_open_budget(self.shape.open_budget);
        groups.set_sleeps_per_pass(self.shape.sleeps_per_pass);
        groups.set_scrub_wake_ticks(self.shape.scrub_wake_ticks);
        // As the node: every partition journal's syncs run off the shard's turn.
        let syncer = std::sync::Arc::new(braid_storage::Syncer::held());
        let (done_tx, done) = tokio::sync::mpsc::unbounded_channel();
        groups.sync_through(super::partition_groups::SyncLink {
            syncer: std::sync::Arc::clone(&syncer),
            done: done_tx,
        });
        member.syncs = Some(Syncs { syncer, done });
        member.published.clear();
        member.reopen_waiting.clear();
        let mut found = Vec::new();
        for p in 0..partitions {
            let dir = partition_dir(&member.dir, p);
            if dir.exists() {
                found.push(key(p));
            }
            match groups.add(key(p), &dir, log_config, now_ms) {
                Ok(mark) => {
                    member.published.insert(p, mark);
                }
                Err(err) => {
                    let what = format!("member {m} cannot start partition {p}: {err}");
                    self.fail(what);
                    return;
                }
            }
        }
        // As the node's start: what it found on disk goes to sleep at once.
        groups.sleep_opened(found);
        member.groups = Some(groups);
        member.meta = Some(meta);
        member.restart_at = None;
        self.served.forget_member(m);
        // Its journals count scrub passes from 0 again.
        self.scrub_floor.retain(|(member, _), _| *member != m);
        if self.trace {
            eprintln!("t{} m{m} boots ({})", self.tick, self.describe_member(m));
        }
    }

    fn describe_member(&self, m: u8) -> String {
        let Some(groups) = self.members[usize::from(m)].groups.as_ref() else {
            return "down".into();
        };
        let meta = self.describe_metadata(m);
        let partitions = groups
            .statuses()
            .iter()
            .map(|s| {
                let lv = groups.log_view(key((s.group & 0xff) as u32));
                format!(
                    "g{}: {:?} v{} lv{lv:?} t{} op{} c{}/{} hw{} {:?} scrub{:?}",
                    s.group & 0xff,
                    s.status,
                    s.view,
                    s.trusted,
                    s.op,
                    s.commit_min,
                    s.commit_max,
                    groups.high_watermark(key((s.group & 0xff) as u32)),
                    s.journal,
                    groups.scrubbed(key((s.group & 0xff) as u32)),
                )
            })
            .collect::<Vec<_>>()
            .join(", ");
        format!("{partitions}; {meta}")
    }

    /// Feeds the disk operations since the last call to every member's model.
    fn drain_trace(&mut self) {
        let Some(plan) = hook::take() else {
            hook::start_tracing();
            return;
        };
        // Latent read errors stay on the disk until written over.
        hook::install(hook::Plan {
            tracing: true,
            unreadable: plan.unreadable,
            no_descriptors_under: plan.no_descriptors_under,
            ..hook::Plan::default()
        });
        for event in &plan.trace {
            for member in &mut self.members {
                member.power.apply(event);
            }
        }
    }

    /// Member `m` dies: its process only (`kill -9`), or the machine's power.
    fn crash(&mut self, m: u8, power_loss: bool) {
        self.drain_trace();
        let seed = self.seed;
        let member = &mut self.members[usize::from(m)];
        member.meta = None;
        member.syncs = None;
        let Some(groups) = member.groups.take() else {
            return;
        };
        let (slept, woken) = groups.sleep_counts();
        self.outcome.files_slept += slept;
        self.outcome.files_woken += woken;
        self.outcome.files_released_over_budget += groups.released_over_budget();
        self.served.forget_member(m);
        self.proposals.forget_member(m);
        let downtime = 20 + self.prng.below(300);
        member.restart_at = Some(self.tick + downtime);
        if self.trace {
            eprintln!("t{} m{m} crashes (power loss: {power_loss})", self.tick);
        }
        if !power_loss {
            self.outcome.kills += 1;
            return;
        }
        self.outcome.power_losses += 1;
        if self.trace {
            for (path, durable, current, pending) in member.power.unsynced() {
                eprintln!(
                    "  unsynced at the cut: {} durable {durable} current {current} ({pending} writes)",
                    path.display()
                );
            }
        }
        let out = member.dir.with_extension(format!("cut-{}", member.boots));
        let mut draws = Prng::new(seed ^ self.prng.next_u64());
        let damage = u64::from(m) == seed % u64::from(self.shape.members)
            && self.prng.chance(self.shape.damage_percent);
        let mut damaged = None;
        let result = std::fs::create_dir(&out).and_then(|()| {
            member
                .power
                .cut_into(&out, &mut |n| draws.below(n as u64) as usize);
            std::fs::remove_dir_all(&member.dir)?;
            std::fs::rename(&out, &member.dir)?;
            if damage {
                damaged = damage_at_rest(&member.dir, &mut draws, self.shape.kinds())?;
            }
            PowerModel::of_dir(&member.dir)
        });
        if let Some(what) = damaged {
            self.outcome.damaged_files += 1;
            if self.trace {
                eprintln!("t{} m{m} damaged at rest: {what}", self.tick);
            }
        }
        match result {
            Ok(power) => {
                member.power = power;
                member.boots += 1;
            }
            Err(err) => self.fail(format!("member {m}: writing its power-cut state: {err}")),
        }
    }

    fn is_cut(&self, from: u8, to: u8) -> bool {
        self.cut.contains(&(from, to))
    }

    fn send(&mut self, from: u8, to: u8, frame: Frame) {
        if self.is_cut(from, to) || self.prng.chance(self.shape.loss_percent) {
            self.outcome.frames_lost += 1;
            return;
        }
        let copies = if self.prng.chance(self.shape.duplicate_percent) {
            2
        } else {
            1
        };
        for _ in 0..copies {
            let at = self.tick + 1 + self.prng.below(self.shape.delay_ticks_max);
            self.network.push(Packet {
                at,
                from,
                to,
                frame: frame.clone(),
            });
        }
    }

    fn collect_sent(&mut self, m: u8) {
        let sent = match self.members[usize::from(m)].groups.as_mut() {
            Some(groups) => groups.take_sent(),
            None => return,
        };
        for (to, frame) in sent {
            self.send(m, to, frame);
        }
    }

    /// Runs some of member `m`'s waiting syncs (a sync thread takes each round as it
    /// comes, and a round may take a while) and hands their completions to its groups.
    fn run_syncs(&mut self, m: u8) {
        let member = &mut self.members[usize::from(m)];
        let (Some(syncs), Some(groups)) = (member.syncs.as_mut(), member.groups.as_mut()) else {
            return;
        };
        let mut moved = Vec::new();
        let waiting = syncs.syncer.held_len();
        if waiting > 0 && self.prng.chance(SYNC_ROUND_PERCENT) {
            let count = 1 + self.prng.below(waiting as u64) as usize;
            syncs.syncer.run_held(count);
        }
        while let Ok(control) = syncs.done.try_recv() {
            if let crate::mailbox::Control::GroupSynced { group, job, result } = control {
                moved.extend(groups.on_synced(group, job, result));
            }
        }
        self.publish(m, moved);
        self.collect_sent(m);
    }

    fn inject_faults(&mut self) {
        if self.asleep_draws.below(10_000) < self.shape.asleep_damage_per_10k {
            self.asleep_damage_due = true;
        }
        if self.asleep_damage_due {
            self.asleep_damage_due = !self.damage_asleep();
        }
        for m in 0..self.member_count() {
            let up = self.members[usize::from(m)].groups.is_some();
            if up && self.prng.below(10_000) < self.shape.crash_per_10k {
                let power =
                    !self.shape.fsync_never && self.prng.chance(self.shape.power_loss_percent);
                self.crash(m, power);
            }
        }
        if self.prng.below(10_000) < self.shape.cut_per_10k {
            if self.cut.is_empty() || self.prng.chance(50) {
                let members = self.member_count();
                let from = self.prng.below(u64::from(members)) as u8;
                let to = (from + 1 + self.prng.below(u64::from(members) - 1) as u8) % members;
                self.cut.push((from, to));
                if self.prng.chance(50) {
                    self.cut.push((to, from));
                }
                self.outcome.cuts += 1;
            } else {
                self.cut.clear();
            }
        }
    }

    fn step(&mut self, faults: bool) {
        self.tick += 1;
        if self.trace_status && self.tick.is_multiple_of(20) {
            for m in 0..self.member_count() {
                eprintln!("t{} m{m} status ({})", self.tick, self.describe_member(m));
            }
        }
        if faults {
            self.inject_faults();
        }
        for m in 0..self.member_count() {
            let member = &self.members[usize::from(m)];
            if member.groups.is_none() && member.restart_at.is_some_and(|t| t <= self.tick) {
                self.boot(m);
            }
        }
        // Boots above and the checks below have every descriptor they ask for.
        self.refuse_descriptors(faults);
        let due: Vec<Packet> = {
            let (due, later) = std::mem::take(&mut self.network)
                .into_iter()
                .partition(|p| p.at <= self.tick);
            self.network = later;
            due
        };
        for packet in due {
            let to = usize::from(packet.to);
            self.trace_packet(&packet);
            if packet.frame.group == METADATA_GROUP {
                if let Some(meta) = self.members[to].meta.as_mut() {
                    let turn = meta.deliver_frame(packet.from, &packet.frame);
                    self.take_meta_turn(packet.to, turn);
                }
            } else if let Some(groups) = self.members[to].groups.as_mut() {
                let moved = groups.deliver_frame(packet.from, &packet.frame);
                self.publish(packet.to, moved);
                self.collect_sent(packet.to);
            }
        }
        let now_ms = self.now_ms();
        for m in 0..self.member_count() {
            self.run_syncs(m);
            if let Some(groups) = self.members[usize::from(m)].groups.as_mut() {
                let moved = groups.tick();
                if self.shape.retention && self.tick.is_multiple_of(RETENTION_TICKS) {
                    for p in 0..self.shape.partitions {
                        match groups.apply_retention(key(p), now_ms) {
                            // A damaged segment stops retention there, as the node
                            // logs it, until the scrub's repair mends it.
                            Some(Err(PartitionJournalError::Log(
                                braid_storage::LogError::Corrupt { .. },
                            )))
                            | None => {}
                            // Refused a descriptor: the node warns, and its next pass
                            // tries again.
                            Some(Err(err))
                                if crate::replication::shard_host::caused_by_out_of_descriptors(
                                    &err,
                                ) => {}
                            Some(Err(err)) => {
                                self.failure.get_or_insert(format!(
                                    "member {m} partition {p}: retention: {err}"
                                ));
                            }
                            Some(Ok(_)) => {}
                        }
                    }
                }
                self.publish(m, moved);
                self.collect_sent(m);
            }
            if let Some(meta) = self.members[usize::from(m)].meta.as_mut() {
                let turn = meta.tick();
                self.take_meta_turn(m, turn);
            }
        }
        if faults && self.prng.chance(self.shape.produce_percent) {
            self.produce();
        }
        if faults {
            self.propose_stream();
        }
        self.step_retirement(producer::RETIRED_SESSION);
        hook::set_no_descriptors_under(None);
        self.take_answers();
        if self.tick.is_multiple_of(SERVE_CHECK_TICKS) {
            self.check_served();
            self.check_metadata_agrees();
        }
        for m in 0..self.member_count() {
            let stopped = self.members[usize::from(m)]
                .groups
                .as_ref()
                .and_then(|g| g.failure().map(str::to_owned));
            if let Some(reason) = stopped {
                self.fail(format!("member {m}'s partition groups stopped: {reason}"));
            }
            let stopped = self.members[usize::from(m)]
                .meta
                .as_ref()
                .and_then(|g| g.failure().map(str::to_owned));
            if let Some(reason) = stopped {
                self.fail(format!("member {m}'s metadata group stopped: {reason}"));
            }
        }
        self.drain_trace();
    }

    fn converged(&self) -> bool {
        if !self.waiting.is_empty() || !self.metadata_converged() {
            return false;
        }
        (0..self.shape.partitions).all(|p| {
            let mut marks = self.members.iter().map(|member| {
                member.groups.as_ref().map(|g| {
                    let role = g.role(key(p));
                    (g.high_watermark(key(p)), role)
                })
            });
            let Some(Some((mark, _))) = marks.next() else {
                return false;
            };
            let primaries = self
                .members
                .iter()
                .filter(|member| {
                    member
                        .groups
                        .as_ref()
                        .is_some_and(|g| g.role(key(p)) == Role::Primary)
                })
                .count();
            // Every op any member holds is applied: no suffix is left uncommitted.
            let settled = self.members.iter().all(|member| {
                member.groups.as_ref().is_some_and(|g| {
                    g.statuses().iter().all(|s| {
                        s.status == braid_vsr::Status::Normal
                            && s.commit_min == s.op
                            && s.journal
                                .is_some_and(|j| j.copying.is_none() && j.tip == s.op)
                    })
                })
            });
            // Damage at rest is found by the scrub, not by the checks below: every
            // member scrubbed its whole log since its boot, and repaired what it found.
            let scrubbed = self.members.iter().enumerate().all(|(m, member)| {
                let floor = self.scrub_floor.get(&(m as u8, p)).copied().unwrap_or(0);
                member.groups.as_ref().is_some_and(
                    |g| matches!(g.scrubbed(key(p)), Some((passes, false)) if passes > floor),
                )
            });
            primaries == 1
                && settled
                && scrubbed
                && marks.all(|other| {
                    other.is_some_and(|(m, role)| m == mark && role != Role::Backup(None))
                })
        })
    }

    /// Runs the seed: faults, then convergence, then the checks of every member's log.
    ///
    /// # Errors
    /// The first violation found.
    pub(crate) fn run(mut self) -> Result<Outcome, Failure> {
        let result = self.run_phases();
        let _ = hook::take();
        result.map_err(|what| Failure {
            seed: self.seed,
            tick: self.tick,
            what,
        })
    }

    fn run_phases(&mut self) -> Result<Outcome, String> {
        for _ in 0..self.shape.safety_ticks {
            self.step(true);
            if let Some(what) = self.failure.take() {
                return Err(what);
            }
        }
        self.cut.clear();
        for m in 0..self.member_count() {
            if self.members[usize::from(m)].groups.is_none() {
                self.boot(m);
            }
        }
        let start = self.tick;
        let mut stable = 0;
        while self.tick - start < self.shape.liveness_ticks {
            self.step(false);
            if let Some(what) = self.failure.take() {
                return Err(what);
            }
            // Converged for a while: a heartbeat has carried every commit.
            stable = if self.converged() { stable + 1 } else { 0 };
            if stable >= 50 {
                self.outcome.ticks_to_converge = self.tick - start;
                if self.trace {
                    eprintln!("t{} converged: {}", self.tick, self.describe());
                }
                self.check_published()?;
                self.check_retired("converged")?;
                let before = self.compare_logs()?;
                let streams_before = self.compare_metadata()?;
                self.restart_all_cleanly()?;
                let after = self.compare_logs()?;
                before.kept_in(&after)?;
                self.check_retired("after a clean restart")?;
                let streams = self.compare_metadata()?;
                if streams != streams_before {
                    return Err(format!(
                        "a clean restart changed the metadata: {streams_before} streams, \
                         then {streams}"
                    ));
                }
                self.outcome.records_stored = after.records();
                self.outcome.streams_acknowledged = self.proposals.acknowledged;
                self.outcome.streams_stored = streams as u64;
                self.outcome.sessions_registered = self.proposals.sessions.len() as u64;
                self.outcome.finalizes_acknowledged = self.proposals.finalizes;
                self.outcome.members_joined = self.proposals.groups.joined;
                return Ok(self.outcome);
            }
        }
        Err(format!(
            "no convergence within {} ticks: {}",
            self.shape.liveness_ticks,
            self.describe()
        ))
    }

    fn describe(&self) -> String {
        let mut members: Vec<String> = (0..self.member_count())
            .map(|m| format!("m{m}: {}", self.describe_member(m)))
            .collect();
        for m in 0..self.member_count() {
            let Some(groups) = self.members[usize::from(m)].groups.as_ref() else {
                continue;
            };
            for status in groups.statuses() {
                let behind = status.journal.is_some_and(|j| j.tip < status.op);
                if status.status != braid_vsr::Status::Normal || behind {
                    let p = (status.group & 0xff) as u32;
                    if let Some((journal, tip)) =
                        groups.journal(key(p)).zip(status.journal.map(|j| j.tip))
                    {
                        members.push(format!(
                            "m{m} p{p} journal {:?}",
                            journal.entries(tip.saturating_sub(1), tip + 2)
                        ));
                    }
                    members.push(format!(
                        "m{m} p{p} entries {:?}",
                        groups.entry_states(
                            key(p),
                            status.journal.map_or(status.commit_min, |j| j.tip) + 1
                        )
                    ));
                }
            }
        }
        format!(
            "{} produces waiting; {}",
            self.waiting.len(),
            members.join("; ")
        )
    }
}

mod compare;
mod files;
mod members;
mod metadata;
mod outcome;
mod producer;
mod retire;
mod seeds;
mod served;
mod shape;
mod shard;
mod trace;

pub(crate) use seeds::{run_seed, run_seeds, Variant};
pub(crate) use shape::Shape;

#[cfg(test)]
mod tests;
