//! A deterministic simulator for `braid-vsr`: whole clusters run tick by tick, every
//! choice (delays, loss, duplication, partitions, crashes, torn and corrupt writes)
//! drawn from one seed, with checkers after every step. A failing seed replays the same
//! run exactly.
//!
//! A run has a safety phase with faults, then a liveness phase in which faults stop,
//! partitions heal and crashed replicas restart; the cluster must then converge: every
//! client finishes and every replica applies every committed op, within a bound of
//! ticks.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

mod checks;
mod clients;
mod config;
mod disk;
mod faults;
mod network;

pub use config::{Failure, Faults, Outcome, Prng, SimConfig};

use disk::{Disk, PendingWrite};

use braid_vsr::{
    Config, CounterMachine, Input, Message, Output, Refusal, Replica, ReplicaId, Reply,
};

/// One replica's place in the cluster: its disk and what the simulation tracks about
/// it. The replica itself lives in its server's `braid_vsr::Node`.
#[derive(Debug)]
struct Node {
    disk: Disk,
    restart_at: Option<u64>,
    /// No power loss since the durable state was last written (the shell keeps the
    /// boot id with it): the next restart may trust its journal, unless the durable
    /// state says otherwise.
    journal_trusted: bool,
    max_view: u64,
    /// The highest durable view its disk has held: it never goes back (a damaged copy
    /// of the state must never roll it back), until the disk is lost.
    max_durable_view: u64,
    max_durable_commit: u64,
    /// Its disk was lost once: whatever it restarts with nothing of restarts untrusted
    /// (what `braid server --rejoin` records in the data directory).
    rejoined: bool,
    /// After a lost disk, the commit it must apply before it holds a copy again: until
    /// then it counts as a fault at every op (no second loss in its group meanwhile).
    catch_up_to: Option<u64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Address {
    Replica(u64, ReplicaId),
    Client(u64),
}

#[derive(Debug, Clone)]
struct Packet {
    deliver_at: u64,
    from: Address,
    to: Address,
    message: Payload,
}

#[derive(Debug, Clone)]
enum Payload {
    Replica(Message),
    Reply(Reply),
}

#[derive(Debug)]
struct Client {
    id: u64,
    group: u64,
    session: u64,
    next_request: u64,
    requests_total: u64,
    /// The request in flight: (request number, body, last sent tick).
    pending: Option<(u64, Vec<u8>, u64)>,
    view_hint: u64,
    /// Registration attempts so far; a register carries its attempt number.
    registrations: u64,
    /// The client's own operation number (it survives a new session).
    operation: u64,
    done: bool,
}

/// The model the replies are checked against: the committed log applied in op order to
/// an independent counter machine.
#[derive(Debug, Default)]
struct GroupModel {
    /// op -> checksum, from the first replica to apply it.
    committed: BTreeMap<u64, braid_vsr::Checksum>,
    machine: CounterMachine,
    /// (session, request) -> result of its one execution.
    results: BTreeMap<(u64, u64), Result<Vec<u8>, Refusal>>,
    /// Bodies clients sent, by (session, request).
    bodies: BTreeMap<(u64, u64), Vec<u8>>,
    /// The client's own operation each (session, request) carries: (client, operation
    /// number). The same operation sent under two sessions maps twice.
    operations: BTreeMap<(u64, u64), (u64, u64)>,
    /// Operations executed, and the (session, request) that executed them.
    executed: BTreeMap<(u64, u64), (u64, u64)>,
}

/// A simulated cluster.
#[derive(Debug)]
pub struct Simulation {
    config: SimConfig,
    prng: Prng,
    tick: u64,
    nodes: BTreeMap<(u64, ReplicaId), Node>,
    /// Server r holds replica r of every group, as a node of the cluster does: one
    /// `braid_vsr::Node`, one clock, crashed and restarted as a whole by node crashes.
    servers: BTreeMap<ReplicaId, braid_vsr::Node<CounterMachine>>,
    /// Each server's clock rate in percent of the simulation's (clock skew).
    clock_percent: BTreeMap<ReplicaId, u64>,
    network: Vec<Packet>,
    /// Pairs (from, to) of replicas that cannot reach each other (one-way).
    cut: BTreeSet<(ReplicaId, ReplicaId)>,
    /// Recently delivered packets, for replaying old messages.
    history: VecDeque<Packet>,
    clients: Vec<Client>,
    models: BTreeMap<u64, GroupModel>,
    /// (group, view, op) -> the checksum of the first prepare any replica held for it.
    prepared: BTreeMap<(u64, u64, u64), braid_vsr::Checksum>,
    faults_on: bool,
    writeback: bool,
    trace: bool,
    outcome: Outcome,
    failure: Option<Failure>,
}

impl Simulation {
    /// Builds the cluster of `config`.
    pub fn new(config: SimConfig) -> Self {
        let mut nodes = BTreeMap::new();
        let mut servers: BTreeMap<ReplicaId, braid_vsr::Node<CounterMachine>> = BTreeMap::new();
        let mut clock_percent = BTreeMap::new();
        let mut failure = None;
        for replica in 0..config.replica_count {
            let skew = config.faults.clock_skew_percent;
            let mut clock = Prng::new(config.seed ^ (u64::from(replica) << 40));
            clock_percent.insert(replica, 100 - skew + clock.below(2 * skew + 1));
            servers.insert(replica, braid_vsr::Node::new());
        }
        for group in 0..config.groups {
            for replica in 0..config.replica_count {
                let mut vsr = Config::new(group, replica, config.replica_count, config.seed);
                vsr.sessions_max = config.sessions_max;
                vsr.checkpoint_interval = config.checkpoint_interval;
                vsr.journal_keep = config.checkpoint_interval;
                vsr.quiesce = config.quiesce;
                vsr.compact_committed = config.compact_committed;
                match Replica::new(vsr, CounterMachine::default()) {
                    Ok(started) => {
                        if let Some(server) = servers.get_mut(&replica) {
                            server.insert(started);
                        }
                    }
                    Err(err) => {
                        failure.get_or_insert(Failure {
                            seed: config.seed,
                            tick: 0,
                            what: err.to_string(),
                        });
                    }
                }
                nodes.insert(
                    (group, replica),
                    Node {
                        disk: Disk::new(config.journal_fsync),
                        journal_trusted: true,
                        restart_at: None,
                        max_view: 0,
                        max_durable_view: 0,
                        max_durable_commit: 0,
                        rejoined: false,
                        catch_up_to: None,
                    },
                );
            }
        }
        let mut clients = Vec::new();
        for group in 0..config.groups {
            for c in 0..config.clients_per_group {
                clients.push(Client {
                    id: 1000 + group * 100 + c,
                    group,
                    session: 0,
                    next_request: 0,
                    requests_total: config.requests_per_client,
                    pending: None,
                    view_hint: 0,
                    registrations: 0,
                    operation: 0,
                    done: false,
                });
            }
        }
        let models = (0..config.groups)
            .map(|g| (g, GroupModel::default()))
            .collect();
        Self {
            config,
            prng: Prng::new(config.seed),
            tick: 0,
            nodes,
            servers,
            clock_percent,
            network: Vec::new(),
            cut: BTreeSet::new(),
            history: VecDeque::new(),
            clients,
            models,
            prepared: BTreeMap::new(),
            faults_on: true,
            writeback: true,
            trace: false,
            outcome: Outcome::default(),
            failure,
        }
    }

    /// Prints every delivery and fault to stderr.
    pub fn set_trace(&mut self, trace: bool) {
        self.trace = trace;
    }

    fn fail(&mut self, what: String) {
        if self.failure.is_none() {
            self.failure = Some(Failure {
                seed: self.config.seed,
                tick: self.tick,
                what,
            });
        }
    }

    /// Runs both phases.
    ///
    /// # Errors
    /// The first violation found.
    pub fn run(mut self) -> Result<Outcome, Failure> {
        for _ in 0..self.config.safety_ticks {
            self.step();
            if let Some(failure) = self.failure.take() {
                return Err(failure);
            }
        }
        self.heal();
        let start = self.tick;
        while self.tick - start < self.config.liveness_ticks_max {
            self.step();
            if let Some(failure) = self.failure.take() {
                return Err(failure);
            }
            if self.converged() {
                self.outcome.ticks_to_converge = self.tick - start;
                self.outcome.ops_committed =
                    self.models.values().map(|m| m.committed.len() as u64).sum();
                self.outcome.step_downs += self
                    .nodes
                    .keys()
                    .filter_map(|key| self.replica_at(*key).map(|r| u64::from(r.step_downs())))
                    .sum::<u64>();
                self.outcome.views = self
                    .nodes
                    .keys()
                    .filter_map(|key| self.replica_at(*key).map(Replica::view))
                    .max()
                    .unwrap_or(0);
                return Ok(self.outcome);
            }
        }
        Err(Failure {
            seed: self.config.seed,
            tick: self.tick,
            what: format!(
                "no convergence within {} ticks: {}",
                self.config.liveness_ticks_max,
                self.describe()
            ),
        })
    }

    fn describe(&self) -> String {
        let replicas: Vec<String> = self
            .nodes
            .iter()
            .map(|((g, r), _)| match self.replica_at((*g, *r)) {
                Some(x) => format!(
                    "g{g}r{r}:{:?} v{} op{} c{}/{} next{:?}",
                    x.status(),
                    x.view(),
                    x.op(),
                    x.commit_min(),
                    x.commit_max(),
                    x.entry_state(x.commit_min() + 1)
                ),
                None => format!("g{g}r{r}:down"),
            })
            .collect();
        let clients: Vec<String> = self
            .clients
            .iter()
            .filter(|c| !c.done)
            .map(|c| format!("client {} s{} r{}", c.id, c.session, c.next_request))
            .collect();
        format!(
            "[{}] waiting: [{}]",
            replicas.join(", "),
            clients.join(", ")
        )
    }

    /// Turns random faults on or off (scenarios inject their own).
    pub fn set_random_faults(&mut self, on: bool) {
        self.faults_on = on;
    }

    /// Cuts the link from `from` to `to` (one way) in every group.
    pub fn cut(&mut self, from: ReplicaId, to: ReplicaId) {
        self.cut.insert((from, to));
    }

    /// Cuts a replica off both ways.
    pub fn isolate(&mut self, replica: ReplicaId) {
        for other in 0..self.config.replica_count {
            if other != replica {
                self.cut.insert((replica, other));
                self.cut.insert((other, replica));
            }
        }
    }

    /// Heals every cut link (faults stay as they are).
    pub fn heal_network(&mut self) {
        self.cut.clear();
    }

    /// What the run measured so far.
    pub fn outcome(&self) -> Outcome {
        self.outcome
    }

    /// Runs `ticks` steps; stops early on a violation.
    ///
    /// # Errors
    /// The violation.
    pub fn run_ticks(&mut self, ticks: u64) -> Result<(), Failure> {
        for _ in 0..ticks {
            self.step();
            if let Some(failure) = self.failure.take() {
                return Err(failure);
            }
        }
        Ok(())
    }

    /// Runs until `done` holds or `ticks` pass; returns whether it held.
    ///
    /// # Errors
    /// A violation.
    pub fn run_until(&mut self, ticks: u64, done: impl Fn(&Self) -> bool) -> Result<bool, Failure> {
        for _ in 0..ticks {
            if done(self) {
                return Ok(true);
            }
            self.step();
            if let Some(failure) = self.failure.take() {
                return Err(failure);
            }
        }
        Ok(done(self))
    }

    /// Heals everything and runs the liveness phase.
    ///
    /// # Errors
    /// A violation, or no convergence.
    pub fn finish(mut self) -> Result<Outcome, Failure> {
        self.config.safety_ticks = 0;
        self.run()
    }

    /// A replica, if it is up.
    pub fn replica(&self, group: u64, replica: ReplicaId) -> Option<&Replica<CounterMachine>> {
        self.replica_at((group, replica))
    }

    pub(crate) fn replica_at(&self, key: (u64, ReplicaId)) -> Option<&Replica<CounterMachine>> {
        self.servers.get(&key.1)?.replica(key.0)
    }

    /// Whether a replica has disk writes it asked for that have not completed.
    pub fn has_pending_writes(&self, group: u64, replica: ReplicaId) -> bool {
        self.nodes
            .get(&(group, replica))
            .is_some_and(|n| n.disk.has_pending())
    }

    /// Ops committed in a group (by the first replica to apply each).
    pub fn committed(&self, group: u64) -> u64 {
        self.models
            .get(&group)
            .map_or(0, |m| m.committed.len() as u64)
    }

    /// Damages the journal entry at `op` on a replica's disk (found at its next restart).
    pub fn corrupt(&mut self, group: u64, replica: ReplicaId, op: u64) {
        if self
            .nodes
            .get_mut(&(group, replica))
            .is_some_and(|n| n.disk.corrupt(op))
        {
            self.outcome.corruptions += 1;
        }
    }

    /// Stops faults: heals partitions, stops loss, restarts every crashed replica.
    pub fn heal(&mut self) {
        self.faults_on = false;
        self.cut.clear();
        let down: Vec<(u64, ReplicaId)> = self
            .nodes
            .iter()
            .filter(|(k, _)| self.replica_at(**k).is_none())
            .map(|(k, _)| *k)
            .collect();
        for key in down {
            self.restart(key);
        }
    }

    fn converged(&self) -> bool {
        if !self.clients.iter().all(|c| c.done) {
            return false;
        }
        self.models.iter().all(|(group, model)| {
            let top = model.committed.keys().next_back().copied().unwrap_or(0);
            self.nodes
                .iter()
                .filter(|((g, _), _)| g == group)
                .all(|(key, _)| {
                    self.replica_at(*key).is_some_and(|r| {
                        r.commit_min() >= top && r.status() == braid_vsr::Status::Normal
                    })
                })
        })
    }

    /// One tick: faults, deliveries, timers, write completions, clients, checks.
    pub fn step(&mut self) {
        self.tick += 1;
        if self.faults_on {
            self.inject_faults();
        }
        self.complete_writes();
        self.deliver();
        // Each server ticks the groups whose deadline came on its own clock.
        let servers: Vec<ReplicaId> = self.servers.keys().copied().collect();
        for r in servers {
            let local = self.local_now((0, r));
            let mut out = Vec::new();
            if let Some(server) = self.servers.get_mut(&r) {
                if server.next_deadline().is_some_and(|d| d <= local) {
                    server.tick(local, &mut out);
                }
            }
            for (group, output) in out {
                self.output((group, r), output);
            }
        }
        let keys: Vec<(u64, ReplicaId)> = self.nodes.keys().copied().collect();
        for key in keys {
            let restart = self
                .nodes
                .get(&key)
                .and_then(|n| n.restart_at)
                .is_some_and(|t| t <= self.tick);
            if restart {
                self.restart(key);
            }
        }
        self.drive_clients();
        self.node_heartbeats();
        self.hand_offs();
        self.check();
    }

    /// What a node's shell does to spread leadership again: now and then, every
    /// replica is asked to hand its group back to the group's preferred replica (only a
    /// primary that may, does). Only while faults run: the quiet end converges.
    fn hand_offs(&mut self) {
        const HAND_OFF_TICKS: u64 = 700;
        if !self.faults_on || !self.tick.is_multiple_of(HAND_OFF_TICKS) {
            return;
        }
        let keys: Vec<(u64, ReplicaId)> = self.nodes.keys().copied().collect();
        for key in keys {
            let primary = self.replica_at(key).is_some_and(Replica::is_primary);
            self.input(key, Input::HandOff);
            if primary && !self.replica_at(key).is_some_and(Replica::is_primary) {
                self.outcome.hand_offs += 1;
            }
        }
    }

    /// What a node's shell does for its quiescent groups: now and then, one batch of
    /// commit heartbeats per peer, so a backup that missed the last commits catches up.
    fn node_heartbeats(&mut self) {
        const NODE_HEARTBEAT_TICKS: u64 = 100;
        if !self.config.quiesce || !self.tick.is_multiple_of(NODE_HEARTBEAT_TICKS) {
            return;
        }
        let beats: Vec<((u64, ReplicaId), Message)> = self
            .servers
            .iter()
            .flat_map(|(r, server)| {
                server
                    .quiet_heartbeats()
                    .into_iter()
                    .map(move |(group, message)| ((group, *r), message))
            })
            .collect();
        for ((group, replica), message) in beats {
            for to in 0..self.config.replica_count {
                if to != replica {
                    self.send(
                        Address::Replica(group, replica),
                        Address::Replica(group, to),
                        Payload::Replica(message.clone()),
                    );
                }
            }
        }
    }

    /// A node's own clock: the simulation's ticks at its rate.
    fn local_now(&self, key: (u64, ReplicaId)) -> u64 {
        self.clock_percent
            .get(&key.1)
            .map_or(self.tick, |percent| self.tick * percent / 100)
    }

    fn input(&mut self, key: (u64, ReplicaId), input: Input) {
        let tick = self.local_now(key);
        let mut out = Vec::new();
        let Some(server) = self.servers.get_mut(&key.1) else {
            return;
        };
        if server.step(tick, key.0, input, &mut out).is_err() {
            return; // that group's replica is down on this server
        }
        for (_, output) in out {
            self.output(key, output);
        }
    }

    fn output(&mut self, key: (u64, ReplicaId), output: Output) {
        let (group, replica) = key;
        match output {
            Output::Send { to, message } => {
                // A view-scoped message must speak for a view already on this disk.
                let view = match &message {
                    Message::StartViewChange { view, .. }
                    | Message::DoViewChange { view, .. }
                    | Message::StartView { view, .. }
                    | Message::PrepareOk { view, .. } => Some(*view),
                    _ => None,
                };
                if let Message::Prepare(prepare) = &message {
                    self.check_prepared(key, &prepare.header);
                }
                let durable = self
                    .nodes
                    .get(&key)
                    .map_or(0, |n| n.disk.durable_state().view);
                if let Some(view) = view.filter(|v| *v > durable) {
                    self.fail(format!("g{group}r{replica} sent a message of view {view} with view {durable} on disk"));
                }
                self.send(
                    Address::Replica(group, replica),
                    Address::Replica(group, to),
                    Payload::Replica(message),
                );
            }
            Output::Reply(reply) => {
                let to = Address::Client(reply.client);
                self.send(Address::Replica(group, replica), to, Payload::Reply(reply));
            }
            Output::WriteJournal(prepare) => {
                self.check_prepared(key, &prepare.header);
                self.queue(key, PendingWrite::Journal(prepare))
            }
            Output::WriteHeader(header) => {
                self.check_prepared(key, &header);
                self.queue(key, PendingWrite::Header(header))
            }
            Output::SendFromJournal { to, op, checksum } => {
                let read = self.nodes.get(&key).map(|n| n.disk.read_prepare(op));
                match read.flatten() {
                    Some(prepare) if prepare.header.checksum == checksum => self.send(
                        Address::Replica(group, replica),
                        Address::Replica(group, to),
                        Payload::Replica(Message::Prepare(prepare)),
                    ),
                    Some(_) => {}
                    // The read failed: a latent error found on read (the asker repairs
                    // from another peer; this replica finds the slot damaged at restart).
                    None => self.outcome.read_errors_found += 1,
                }
            }
            Output::WriteState(state) => self.queue(key, PendingWrite::State(state)),
            Output::TruncateJournal { op } => {
                if self.trace {
                    eprintln!("t{} g{group}r{replica} truncate above {op}", self.tick);
                }
                self.queue(key, PendingWrite::Truncate(op))
            }
            Output::PruneJournal { op } => {
                if self.trace {
                    eprintln!("t{} g{group}r{replica} prune through {op}", self.tick);
                }
                self.queue(key, PendingWrite::Prune(op))
            }
            Output::WriteCheckpoint(checkpoint) => {
                self.queue(key, PendingWrite::Checkpoint(checkpoint))
            }
            Output::Applied {
                op,
                checksum,
                session,
                request,
                register,
                executed,
                result,
            } => {
                // Registers are checked by the clients that get their sessions.
                let request = if register { 0 } else { request };
                self.on_applied(
                    group, replica, op, checksum, session, request, executed, result,
                );
            }
            Output::Evicted { .. } => {}
        }
    }

    fn queue(&mut self, key: (u64, ReplicaId), write: PendingWrite) {
        let latency = 1 + self
            .prng
            .below(self.config.faults.write_latency_ticks_max.max(1));
        let ready_at = self.tick + latency;
        if let Some(node) = self.nodes.get_mut(&key) {
            node.disk.issue(write, ready_at);
        }
    }

    fn complete_writes(&mut self) {
        let keys: Vec<(u64, ReplicaId)> = self.nodes.keys().copied().collect();
        let fail_per_10k = if self.faults_on {
            self.config.faults.write_fail_per_10k
        } else {
            0
        };
        for key in keys {
            let tick = self.tick;
            let completed = match self.nodes.get_mut(&key) {
                Some(node)
                    if self
                        .servers
                        .get(&key.1)
                        .is_some_and(|s| s.replica(key.0).is_some()) =>
                {
                    if self.writeback && !node.disk.journal_fsync() && self.prng.chance(5) {
                        node.disk.writeback();
                    }
                    node.disk.complete_due(tick, &mut self.prng, fail_per_10k)
                }
                _ => continue,
            };
            let (inputs, failed) = match completed {
                Ok(inputs) => (inputs, false),
                Err(inputs) => (inputs, true),
            };
            for input in inputs {
                if let Input::StateWritten(state) = &input {
                    if self.trace {
                        eprintln!("t{} g{}r{} durable {:?}", self.tick, key.0, key.1, state);
                    }
                    // Written with this boot's id: the power loss is recorded in it.
                    if let Some(node) = self.nodes.get_mut(&key) {
                        node.journal_trusted = true;
                    }
                }
                self.input(key, input);
            }
            if failed {
                // The disk refused a write: the replica stops (fail-stop, as a node does
                // after a failed fsync) and restarts later.
                self.outcome.failed_writes += 1;
                self.crash(key);
                let downtime = 20 + self.prng.below(200);
                if let Some(node) = self.nodes.get_mut(&key) {
                    node.restart_at = Some(self.tick + downtime);
                }
            }
        }
    }
}

fn brief(message: &Message) -> String {
    match message {
        Message::Request(r) => format!("Request(s{} r{})", r.session, r.request),
        Message::Prepare(p) => format!(
            "Prepare(v{} op{} c{})",
            p.header.view, p.header.op, p.header.commit
        ),
        Message::PrepareOk { view, op, .. } => format!("PrepareOk(v{view} op{op})"),
        Message::Commit { view, commit, .. } => format!("Commit(v{view} c{commit})"),
        Message::StartViewChange { view, .. } => format!("StartViewChange(v{view})"),
        Message::DoViewChange {
            view,
            log_view,
            op,
            commit,
            suffix,
            ..
        } => {
            format!(
                "DoViewChange(v{view} lv{log_view} op{op} c{commit} n{})",
                suffix.len()
            )
        }
        Message::StartView {
            view,
            op,
            commit,
            suffix,
            ..
        } => format!("StartView(v{view} op{op} c{commit} n{})", suffix.len()),
        Message::RequestPrepare { op, .. } => format!("RequestPrepare(op{op})"),
        Message::RequestStartView { view, .. } => format!("RequestStartView(v{view})"),
        Message::RequestViews { .. } => "RequestViews".to_owned(),
        Message::Views { view, .. } => format!("Views(v{view})"),
        Message::Committed { commit, .. } => format!("Committed(c{commit})"),
        Message::RequestSnapshot { .. } => "RequestSnapshot".into(),
        Message::Snapshot { checkpoint, .. } => format!("Snapshot(op{})", checkpoint.header.op),
    }
}

/// Runs one seed.
///
/// # Errors
/// The violation, with the seed.
pub fn run_seed(seed: u64, trace: bool) -> Result<Outcome, Failure> {
    let mut sim = Simulation::new(SimConfig::from_seed(seed));
    sim.set_trace(trace);
    // A broken invariant panics inside the replica: report it with its seed.
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || sim.run())).unwrap_or_else(
        |panic| {
            let what = panic_message(panic.as_ref());
            Err(Failure {
                seed,
                tick: 0,
                what: format!("invariant broken: {what}"),
            })
        },
    )
}

/// What a caught panic says (a broken invariant's message), for a failure's report.
pub fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
        .unwrap_or_else(|| "a panic".to_owned())
}
