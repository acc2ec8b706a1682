//! Injected faults: partitions, crashes with cut write queues, restarts, corruption.

use braid_vsr::{Config, CounterMachine, DurableState, Persisted, Replica, ReplicaId};

use super::*;

impl Simulation {
    pub(crate) fn inject_faults(&mut self) {
        let faults = self.config.faults;
        let n = self.config.replica_count;
        if n > 1 && self.prng.below(10_000) < faults.partition_per_10k {
            self.cut.clear();
            match self.prng.below(4) {
                // Heal.
                0 => {}
                // Isolate one replica both ways.
                1 => {
                    let victim = self.prng.below(u64::from(n)) as ReplicaId;
                    for other in 0..n {
                        if other != victim {
                            self.cut.insert((victim, other));
                            self.cut.insert((other, victim));
                        }
                    }
                }
                // One-way: one replica cannot send to the others.
                2 => {
                    let victim = self.prng.below(u64::from(n)) as ReplicaId;
                    for other in 0..n {
                        if other != victim {
                            self.cut.insert((victim, other));
                        }
                    }
                }
                // Split in two.
                _ => {
                    let side: Vec<bool> = (0..n).map(|_| self.prng.chance(50)).collect();
                    for a in 0..n {
                        for b in 0..n {
                            if side[a as usize] != side[b as usize] {
                                self.cut.insert((a, b));
                            }
                        }
                    }
                }
            }
            if self.trace {
                eprintln!("t{} partition {:?}", self.tick, self.cut);
            }
        }
        if self.prng.below(10_000) < faults.crash_per_10k {
            let keys: Vec<(u64, ReplicaId)> = self
                .nodes
                .keys()
                .filter(|k| self.replica_at(**k).is_some())
                .copied()
                .collect();
            if !keys.is_empty() {
                let key = keys[self.prng.below(keys.len() as u64) as usize];
                self.crash(key);
                let downtime = 20 + self.prng.below(300);
                if let Some(node) = self.nodes.get_mut(&key) {
                    node.restart_at = Some(self.tick + downtime);
                }
            }
        }
        if self.prng.below(10_000) < faults.corrupt_per_10k {
            self.corrupt_random_entry();
        }
        if self.prng.below(10_000) < faults.latent_per_10k {
            self.latent_random_entry();
        }
        if self.prng.below(10_000) < faults.misdirect_per_10k {
            self.misdirect_random_write();
        }
        if n > 1 && self.prng.below(10_000) < faults.node_crash_per_10k {
            let victim = self.prng.below(u64::from(n)) as ReplicaId;
            let downtime = 20 + self.prng.below(300);
            self.crash_node(victim, downtime);
            if self.trace {
                eprintln!("t{} crash node {victim}", self.tick);
            }
        }
        if !self.history.is_empty() && self.prng.below(10_000) < faults.replay_per_10k {
            let old = self.history[self.prng.below(self.history.len() as u64) as usize].clone();
            self.network.push(Packet {
                deliver_at: self.tick + 1,
                ..old
            });
        }
    }

    /// Crashes a replica: memory is gone; of the writes in flight a random subset
    /// within the disk's barriers lands, some may be torn; unsynced page-cache writes
    /// may be lost; now and then a durable-state or checkpoint slot is damaged.
    pub fn crash(&mut self, key: (u64, ReplicaId)) {
        self.crash_as(key, None);
    }

    /// Makes the OS write the page cache back on every replica now and then (on by
    /// default); off, unsynced writes stay unsynced until a crash decides their fate.
    pub fn set_writeback(&mut self, on: bool) {
        self.writeback = on;
    }

    /// Cuts a replica's power: like [`Simulation::crash`], and every unsynced page-cache
    /// write is lost (with `journal_fsync` off).
    pub fn power_off(&mut self, key: (u64, ReplicaId)) {
        self.crash_as(key, Some(true));
    }

    /// A crash that is a power loss (`Some(true)`), a process crash (`Some(false)`), or
    /// either at random within the faults' limits (`None`).
    fn crash_as(&mut self, key: (u64, ReplicaId), forced_power_loss: Option<bool>) {
        let faults = self.config.faults;
        if self.replica_at(key).is_none() {
            return;
        }
        // A power loss takes unsynced journal writes; at most `replica_count - quorum`
        // replicas of a group may be untrusted at once (a majority losing power at once
        // with `fsync = never` may lose acknowledged records: documented, not tested).
        let untrusted = self.untrusted_in_group(key.0, Some(key.1));
        // Damage at rest elsewhere in the group would be a second fault at some op.
        let damaged = self
            .nodes
            .iter()
            .any(|((g, r), n)| *g == key.0 && *r != key.1 && n.disk.has_damage());
        let spare = usize::from(self.config.replica_count) - self.quorum();
        let power_loss_allowed = self.faults_on && untrusted < spare && !damaged;
        let power_loss = forced_power_loss
            .unwrap_or_else(|| power_loss_allowed && self.prng.chance(faults.power_loss_percent));
        // Torn journal writes stay within the fault atlas, and none while a replica of
        // the group may have lost acknowledged writes: a torn slot is a damaged one (it
        // may have been acknowledged, for all the replica knows), so together they would
        // be two faults at one op. A lone replica cuts a torn head at restart.
        let n = u64::from(self.config.replica_count);
        let spare = n - (n / 2 + 1);
        let replica = key.1;
        let quiet_group = untrusted == 0 && !power_loss;
        let may_tear =
            move |op: u64| n == 1 || (quiet_group && (op + u64::from(replica)) % n < spare);
        let Some(node) = self.nodes.get_mut(&key) else {
            return;
        };
        if let Some(server) = self.servers.get_mut(&key.1) {
            if let Some(replica) = server.remove(key.0) {
                self.outcome.step_downs += u64::from(replica.step_downs());
            }
        }
        let keep_percent = if forced_power_loss == Some(true) {
            0
        } else {
            50
        };
        let report = node.disk.crash(
            &mut self.prng,
            faults.torn_percent,
            power_loss.then_some(keep_percent),
            &may_tear,
        );
        self.outcome.torn_writes += report.torn;
        self.outcome.unsynced_writes_lost += report.unsynced_lost;
        // The shell knows a power loss happened since the durable state was last written
        // (it keeps the boot id with it) and restarts the replica with an untrusted
        // journal; after a process crash the page cache held. The durable state carries
        // an untrusted journal across later process crashes.
        if power_loss && !node.disk.journal_fsync() {
            node.journal_trusted = false;
        }
        if power_loss {
            self.outcome.power_losses += 1;
        }
        // A lost disk is an untrusted journal at every op: within the same limit.
        let wipe = self.faults_on
            && !power_loss
            && power_loss_allowed
            && self.prng.chance(faults.wipe_percent);
        if wipe {
            node.disk = Disk::new(node.disk.journal_fsync());
            node.rejoined = true;
            node.catch_up_to = Some(u64::MAX);
            // Counted untrusted while it is down, as after a power loss.
            node.journal_trusted = false;
            // Its durable view and commit went with the disk.
            node.max_view = 0;
            node.max_durable_view = 0;
            node.max_durable_commit = 0;
            self.outcome.wipes += 1;
            if self.trace {
                eprintln!("t{} wipe g{}r{}", self.tick, key.0, key.1);
            }
        }
        if self.faults_on
            && self.prng.chance(faults.state_damage_percent)
            && node.disk.damage_state_slot(&mut self.prng)
        {
            self.outcome.state_slots_damaged += 1;
        }
        if self.faults_on
            && self.prng.chance(faults.checkpoint_damage_percent)
            && node.disk.damage_checkpoint_slot(&mut self.prng)
        {
            self.outcome.checkpoint_slots_damaged += 1;
        }
        self.outcome.crashes += 1;
        if self.trace {
            eprintln!("t{} crash g{}r{}", self.tick, key.0, key.1);
        }
    }

    /// Crashes replica `replica` of every group at once: one node of the cluster.
    pub fn crash_node(&mut self, replica: ReplicaId, downtime: u64) {
        let keys: Vec<(u64, ReplicaId)> = self
            .nodes
            .keys()
            .filter(|(_, r)| *r == replica)
            .copied()
            .collect();
        for key in keys {
            self.crash(key);
            if let Some(node) = self.nodes.get_mut(&key) {
                node.restart_at = Some(self.tick + downtime);
            }
        }
        // The whole process is gone: a new `braid_vsr::Node` takes the groups back as
        // they restart.
        if let Some(server) = self.servers.get_mut(&replica) {
            invariant_empty(server);
            *server = braid_vsr::Node::new();
        }
        self.outcome.node_crashes += 1;
    }

    /// Replicas of `group` (but `except`) whose journal may have lost acknowledged
    /// writes: up and untrusted, or down after a power loss or with an untrusted state.
    fn untrusted_in_group(&self, group: u64, except: Option<ReplicaId>) -> usize {
        self.nodes
            .iter()
            .filter(|((g, r), n)| {
                *g == group
                    && Some(*r) != except
                    && match self.replica_at((*g, *r)) {
                        // Trusted again in memory is not enough: until the durable
                        // state says so too, a crash brings the untrusted journal back
                        // (seed 1265781).
                        Some(replica) => {
                            !replica.journal_trusted()
                                || n.disk.durable_state().journal_trusted_through != u64::MAX
                                || n.catch_up_to.is_some_and(|t| replica.commit_min() < t)
                        }
                        None if n
                            .catch_up_to
                            .is_some_and(|t| n.disk.durable_state().commit < t) =>
                        {
                            true
                        }
                        None => {
                            !n.journal_trusted
                                || n.disk.durable_state().journal_trusted_through != u64::MAX
                        }
                    }
            })
            .count()
    }

    /// Replicas that make a quorum.
    pub(crate) fn quorum(&self) -> usize {
        usize::from(self.config.replica_count) / 2 + 1
    }

    /// Whether `replica` may hold a fault at `op`: for each op, at most
    /// `replica_count - quorum` replicas may (TigerBeetle's fault atlas), so a quorum
    /// always keeps an intact copy of what it acknowledged. A lone replica has no peer to
    /// repair from and gets no faults at rest.
    pub(crate) fn faultable(&self, replica: ReplicaId, op: u64) -> bool {
        let n = u64::from(self.config.replica_count);
        let spare = n - (n / 2 + 1);
        spare > 0 && (op + u64::from(replica)) % n < spare
    }

    /// Restarts a crashed replica from its disk.
    pub fn restart(&mut self, key: (u64, ReplicaId)) {
        let (group, replica) = key;
        if self.replica_at(key).is_some() {
            if let Some(node) = self.nodes.get_mut(&key) {
                node.restart_at = None;
            }
            return;
        }
        // What the group has committed now: a replica that lost its disk holds a copy
        // again only once it has applied this much.
        let group_commit = self
            .servers
            .values()
            .filter_map(|server| server.replica(group))
            .map(|r| r.commit_max())
            .max()
            .unwrap_or(0);
        let Some(node) = self.nodes.get_mut(&key) else {
            return;
        };
        let mut config = Config::new(
            group,
            replica,
            self.config.replica_count,
            self.config.seed ^ self.tick,
        );
        config.sessions_max = self.config.sessions_max;
        config.checkpoint_interval = self.config.checkpoint_interval;
        config.journal_keep = self.config.checkpoint_interval;
        config.quiesce = self.config.quiesce;
        config.compact_committed = self.config.compact_committed;
        let read = node.disk.read_back();
        let state = match read.state {
            Ok(state) => state,
            Err(err) => {
                // Never injected beyond one slot: a replica with no intact state must
                // refuse to start, and here that would be a bug in the disk model.
                let what = format!("g{group}r{replica} refused to start: {err}");
                self.fail(what);
                return;
            }
        };
        if self.trace {
            let slots: Vec<String> = read
                .journal
                .iter()
                .map(|(op, slot)| match slot {
                    braid_vsr::JournalSlot::Prepare(_) => format!("{op}"),
                    braid_vsr::JournalSlot::Header(_) => format!("{op}h"),
                    braid_vsr::JournalSlot::Damaged => format!("{op}x"),
                })
                .collect();
            eprintln!(
                "t{} g{group}r{replica} reads {:?}, checkpoint {:?}, journal [{}]",
                self.tick,
                state,
                read.checkpoint.as_ref().map(|c| c.header.op),
                slots.join(" ")
            );
        }
        let fresh = state == DurableState::default()
            && read.checkpoint.is_none()
            && read.journal.is_empty();
        let (state, trusted) = if fresh && node.rejoined {
            node.catch_up_to = Some(group_commit);
            // Nothing on a disk that was lost once: it may have acknowledged ops it no
            // longer has, so it never says it never had one until it is normal in a
            // newer view.
            (Persisted::after_disk_loss().durable, false)
        } else {
            (state, node.journal_trusted)
        };
        if !trusted {
            // Trusted again (normal in a newer view) is not yet a copy again: until it
            // has applied what the group had committed, what it lost is repaired from
            // the others, so no second fault may take their copies meanwhile.
            node.catch_up_to = Some(group_commit);
        }
        node.disk.rewrite_state(state);
        let persisted = Persisted {
            durable: state,
            checkpoint: read.checkpoint,
            journal: read.journal,
            journal_trusted: trusted,
        };
        match Replica::restart(config, CounterMachine::default(), persisted) {
            Ok(restarted) => {
                // A restart may forget a view it never made durable; it never goes
                // below the durable one (checked every step).
                node.max_view = state.view;
                node.restart_at = None;
                if let Some(server) = self.servers.get_mut(&replica) {
                    server.insert(restarted);
                }
            }
            Err(err) => {
                let what = format!("g{group}r{replica} failed to restart: {err}");
                self.fail(what);
            }
        }
        if self.trace {
            eprintln!("t{} restart g{group}r{replica}", self.tick);
        }
    }

    /// A random (group, replica) and one of its intact journal ops that the fault
    /// atlas lets it lose, where a quorum of the others holds an intact copy.
    fn fault_target(&mut self) -> Option<((u64, ReplicaId), u64)> {
        let keys: Vec<(u64, ReplicaId)> = self.nodes.keys().copied().collect();
        let key = keys[self.prng.below(keys.len() as u64) as usize];
        if self.untrusted_in_group(key.0, None) > 0 {
            // A journal that may have lost acknowledged writes is a fault at every op
            // above what it knows committed: no second fault in that group meanwhile.
            return None;
        }
        let ops: Vec<u64> = self.nodes[&key]
            .disk
            .intact_ops()
            .into_iter()
            .filter(|op| self.faultable(key.1, *op))
            .collect();
        if ops.is_empty() {
            return None;
        }
        let op = ops[self.prng.below(ops.len() as u64) as usize];
        let checksum = self.nodes[&key].disk.intact_checksum(op)?;
        let intact_elsewhere = self
            .nodes
            .iter()
            .filter(|((g, r), n)| {
                *g == key.0 && *r != key.1 && n.disk.intact_checksum(op) == Some(checksum)
            })
            .count();
        (intact_elsewhere >= self.quorum()).then_some((key, op))
    }

    /// Damages one journal entry (found at the replica's next restart).
    pub(crate) fn corrupt_random_entry(&mut self) {
        if let Some((key, op)) = self.fault_at_rest(Disk::corrupt) {
            self.outcome.corruptions += 1;
            if self.trace {
                eprintln!("t{} corrupt g{}r{} op {op}", self.tick, key.0, key.1);
            }
        }
    }

    /// A latent read error on one slot: reads fail from now on.
    pub(crate) fn latent_random_entry(&mut self) {
        if let Some((key, op)) = self.fault_at_rest(Disk::make_latent) {
            self.outcome.latent_errors += 1;
            if self.trace {
                eprintln!("t{} latent g{}r{} op {op}", self.tick, key.0, key.1);
            }
        }
    }

    /// Applies `fault` to the disk slot [`Simulation::fault_target`] picks; returns
    /// where, if it took.
    fn fault_at_rest(
        &mut self,
        fault: fn(&mut Disk, u64) -> bool,
    ) -> Option<((u64, ReplicaId), u64)> {
        let (key, op) = self.fault_target()?;
        let node = self.nodes.get_mut(&key)?;
        fault(&mut node.disk, op).then_some((key, op))
    }

    /// A write that landed on a neighbouring slot: both slots read back damaged.
    pub(crate) fn misdirect_random_write(&mut self) {
        let Some((key, op)) = self.fault_target() else {
            return;
        };
        let other = op + 1 + self.prng.below(3);
        if !self.faultable(key.1, other) {
            return;
        }
        let intact_elsewhere = self
            .nodes
            .iter()
            .filter(|((g, r), n)| {
                *g == key.0
                    && *r != key.1
                    && n.disk.intact_checksum(other).is_some()
                    && n.disk.intact_checksum(other) == self.nodes[&key].disk.intact_checksum(other)
            })
            .count();
        if intact_elsewhere < self.config.replica_count as usize / 2 + 1 {
            return;
        }
        if self
            .nodes
            .get_mut(&key)
            .is_some_and(|n| n.disk.misdirect(op, other))
        {
            self.outcome.misdirected_writes += 1;
            if self.trace {
                eprintln!(
                    "t{} misdirect g{}r{} op {op} onto {other}",
                    self.tick, key.0, key.1
                );
            }
        }
    }
}

/// After a node crash every group of the server is down.
fn invariant_empty(server: &braid_vsr::Node<CounterMachine>) {
    debug_assert!(server.is_empty(), "a crashed node still holds groups");
}
