//! Injected faults: partitions, crashes with cut write queues, restarts, corruption.

use braid_vsr::{Config, CounterMachine, JournalSlot, Replica, ReplicaId};

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
        if !self.history.is_empty() && self.prng.below(10_000) < faults.replay_per_10k {
            let old = self.history[self.prng.below(self.history.len() as u64) as usize].clone();
            self.network.push(Packet {
                deliver_at: self.tick + 1,
                ..old
            });
        }
    }

    /// Crashes a replica: memory is gone; queued writes keep a prefix (the first one
    /// lost may be torn).
    pub fn crash(&mut self, key: (u64, ReplicaId)) {
        let keep = match self.nodes.get(&key) {
            Some(node) if node.replica.is_some() => {
                self.prng.below(node.pending.len() as u64 + 1) as usize
            }
            _ => return,
        };
        let torn = self.prng.chance(self.config.faults.torn_percent);
        self.crash_keeping(key, keep, torn);
    }

    /// Crashes a replica keeping the first `keep` queued writes; with `torn`, the next
    /// one is written damaged.
    pub(crate) fn crash_keeping(&mut self, key: (u64, ReplicaId), keep: usize, torn: bool) {
        let Some(node) = self.nodes.get_mut(&key) else {
            return;
        };
        if node.replica.is_none() {
            return;
        }
        node.replica = None;
        let writes: Vec<PendingWrite> = node.pending.drain(..).collect();
        for (i, write) in writes.into_iter().enumerate() {
            if i < keep {
                let _ = Self::perform(&mut node.disk, write);
            } else if i == keep && torn {
                if let PendingWrite::Journal(prepare) = write {
                    node.disk.journal.insert(
                        prepare.header.op,
                        Slot {
                            prepare,
                            intact: false,
                            header_only: false,
                        },
                    );
                    self.outcome.torn_writes += 1;
                }
                break;
            } else {
                break;
            }
        }
        self.outcome.crashes += 1;
        if self.trace {
            eprintln!("t{} crash g{}r{}", self.tick, key.0, key.1);
        }
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
        let journal: Vec<(u64, JournalSlot)> = node
            .disk
            .journal
            .iter()
            .map(|(op, slot)| {
                let read = match (slot.intact, slot.header_only) {
                    (false, _) => JournalSlot::Damaged,
                    (true, true) => JournalSlot::Header(slot.prepare.header),
                    (true, false) => JournalSlot::Prepare(slot.prepare.clone()),
                };
                (*op, read)
            })
            .collect();
        match Replica::restart(
            config,
            CounterMachine::default(),
            node.disk.state,
            node.disk.checkpoint.clone(),
            journal,
        ) {
            Ok(restarted) => {
                // A restart may forget a view it never made durable; it never goes
                // below the durable one (checked every step).
                node.max_view = node.disk.state.view;
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

    /// Damages one journal entry on one replica, but only where a quorum of the other
    /// replicas still holds an intact copy of it (faults stay recoverable).
    pub(crate) fn corrupt_random_entry(&mut self) {
        let keys: Vec<(u64, ReplicaId)> = self.nodes.keys().copied().collect();
        let key = keys[self.prng.below(keys.len() as u64) as usize];
        let ops: Vec<u64> = self.nodes[&key]
            .disk
            .journal
            .iter()
            .filter(|(_, s)| s.intact && !s.header_only)
            .map(|(o, _)| *o)
            .collect();
        if ops.is_empty() {
            return;
        }
        let op = ops[self.prng.below(ops.len() as u64) as usize];
        let checksum = self.nodes[&key].disk.journal[&op].prepare.header.checksum;
        let intact_elsewhere = self
            .nodes
            .iter()
            .filter(|((g, r), n)| {
                *g == key.0
                    && *r != key.1
                    && n.disk.journal.get(&op).is_some_and(|s| {
                        s.intact && !s.header_only && s.prepare.header.checksum == checksum
                    })
            })
            .count();
        if intact_elsewhere < self.config.replica_count as usize / 2 + 1 {
            return;
        }
        if let Some(slot) = self
            .nodes
            .get_mut(&key)
            .and_then(|n| n.disk.journal.get_mut(&op))
        {
            slot.intact = false;
            self.outcome.corruptions += 1;
            if self.trace {
                eprintln!("t{} corrupt g{}r{} op {op}", self.tick, key.0, key.1);
            }
        }
    }
}
