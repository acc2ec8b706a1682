//! Injected faults: partitions, crashes with cut write queues, restarts, corruption.

use braid_vsr::{Config, CounterMachine, Replica, ReplicaId};

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
                .iter()
                .filter(|(_, n)| n.replica.is_some())
                .map(|(k, _)| *k)
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
        let faults = self.config.faults;
        let Some(node) = self.nodes.get_mut(&key) else {
            return;
        };
        if node.replica.is_none() {
            return;
        }
        node.replica = None;
        let report = node.disk.crash(&mut self.prng, faults.torn_percent);
        self.outcome.torn_writes += report.torn;
        if !node.disk.journal_fsync() {
            self.outcome.unsynced_writes_lost += report.lost;
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
        self.outcome.node_crashes += 1;
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
        let Some(node) = self.nodes.get_mut(&key) else {
            return;
        };
        if node.replica.is_some() {
            node.restart_at = None;
            return;
        }
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
        node.disk.rewrite_state(state);
        match Replica::restart(
            config,
            CounterMachine::default(),
            state,
            read.checkpoint,
            read.journal,
        ) {
            Ok(restarted) => {
                // A restart may forget a view it never made durable; it never goes
                // below the durable one (checked every step).
                node.max_view = state.view;
                node.replica = Some(restarted);
                node.restart_at = None;
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
        let Some((key, op)) = self.fault_target() else {
            return;
        };
        if self.nodes.get_mut(&key).is_some_and(|n| n.disk.corrupt(op)) {
            self.outcome.corruptions += 1;
            if self.trace {
                eprintln!("t{} corrupt g{}r{} op {op}", self.tick, key.0, key.1);
            }
        }
    }

    /// A latent read error on one slot: reads fail from now on.
    pub(crate) fn latent_random_entry(&mut self) {
        let Some((key, op)) = self.fault_target() else {
            return;
        };
        if self
            .nodes
            .get_mut(&key)
            .is_some_and(|n| n.disk.make_latent(op))
        {
            self.outcome.latent_errors += 1;
            if self.trace {
                eprintln!("t{} latent g{}r{} op {op}", self.tick, key.0, key.1);
            }
        }
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
