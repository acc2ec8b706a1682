//! What a run is made of and what it reports: the seeded PRNG, the faults, the shape of
//! a run, its failure and its outcome.

/// The simulator's PRNG (SplitMix64): fixed, so a seed replays on every build.
#[derive(Debug, Clone)]
pub struct Prng(u64);

impl Prng {
    /// A generator for `seed`.
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (0 when n is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next_u64() % n
        }
    }

    /// True with probability `percent`/100.
    pub fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

/// What faults a run injects in its safety phase.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Faults {
    /// Percent of messages lost.
    pub loss_percent: u64,
    /// Percent of messages delivered twice (once more, later).
    pub duplicate_percent: u64,
    /// Most ticks a message is delayed (delivery order varies with it).
    pub delay_ticks_max: u64,
    /// Chance per tick (per 10,000) of a new network partition.
    pub partition_per_10k: u64,
    /// Chance per tick (per 10,000) of crashing a replica.
    pub crash_per_10k: u64,
    /// Chance per tick (per 10,000) of corrupting a journal entry on one replica.
    pub corrupt_per_10k: u64,
    /// Percent of writes still pending at a crash that are torn (the rest of the
    /// suffix is lost).
    pub torn_percent: u64,
    /// Chance per tick (per 10,000) that an old message, delivered long ago, arrives again.
    pub replay_per_10k: u64,
    /// Chance per write (per 10,000) that the disk refuses it (EIO): the replica stops
    /// (fail-stop), as a node does after a failed fsync, and restarts later.
    pub write_fail_per_10k: u64,
    /// Most ticks a disk write stays pending (writes complete out of order).
    pub write_latency_ticks_max: u64,
    /// Chance per tick (per 10,000) that a journal write reported done landed on another
    /// slot (both read back damaged).
    pub misdirect_per_10k: u64,
    /// Chance per tick (per 10,000) of a latent read error on one journal slot.
    pub latent_per_10k: u64,
    /// Percent of crashes that also damage one durable-state slot (the other survives).
    pub state_damage_percent: u64,
    /// Percent of crashes that also damage one checkpoint slot (the other survives).
    pub checkpoint_damage_percent: u64,
    /// Percent of messages damaged in flight (checksummed content altered; others are
    /// dropped, as the bus's frame CRC would).
    pub damage_percent: u64,
    /// Chance per tick (per 10,000) that a whole node (replica r of every group) crashes.
    pub node_crash_per_10k: u64,
    /// Each node's clock runs at a rate drawn between (100 - skew)% and (100 + skew)%.
    pub clock_skew_percent: u64,
    /// Percent of crashes that are power losses (unsynced page-cache writes lost).
    pub power_loss_percent: u64,
    /// Percent of crashes that lose the whole disk (a replaced drive): the replica
    /// rejoins with nothing, untrusted, as `braid server --rejoin` starts it.
    pub wipe_percent: u64,
}

impl Faults {
    /// No faults at all.
    pub fn none() -> Self {
        Self {
            loss_percent: 0,
            duplicate_percent: 0,
            delay_ticks_max: 1,
            partition_per_10k: 0,
            crash_per_10k: 0,
            corrupt_per_10k: 0,
            torn_percent: 0,
            replay_per_10k: 0,
            write_fail_per_10k: 0,
            write_latency_ticks_max: 1,
            misdirect_per_10k: 0,
            latent_per_10k: 0,
            state_damage_percent: 0,
            checkpoint_damage_percent: 0,
            damage_percent: 0,
            node_crash_per_10k: 0,
            clock_skew_percent: 0,
            power_loss_percent: 0,
            wipe_percent: 0,
        }
    }

    /// Faults drawn from the seed, loss up to 30%.
    pub fn random(prng: &mut Prng) -> Self {
        Self {
            loss_percent: prng.below(31),
            duplicate_percent: prng.below(10),
            delay_ticks_max: 1 + prng.below(8),
            partition_per_10k: prng.below(30),
            crash_per_10k: prng.below(25),
            corrupt_per_10k: prng.below(20),
            torn_percent: prng.below(60),
            replay_per_10k: prng.below(200),
            write_fail_per_10k: prng.below(20),
            write_latency_ticks_max: 1 + prng.below(30),
            misdirect_per_10k: prng.below(10),
            latent_per_10k: prng.below(10),
            state_damage_percent: prng.below(30),
            checkpoint_damage_percent: prng.below(30),
            damage_percent: prng.below(5),
            node_crash_per_10k: prng.below(5),
            clock_skew_percent: prng.below(30),
            power_loss_percent: prng.below(60),
            wipe_percent: prng.below(15),
        }
    }
}

/// The shape of a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SimConfig {
    /// The seed of every choice.
    pub seed: u64,
    /// Replicas per group.
    pub replica_count: u8,
    /// Groups.
    pub groups: u64,
    /// Clients per group.
    pub clients_per_group: u64,
    /// Requests each client makes.
    pub requests_per_client: u64,
    /// Ticks of the safety phase.
    pub safety_ticks: u64,
    /// Most ticks the liveness phase may take.
    pub liveness_ticks_max: u64,
    /// Faults of the safety phase.
    pub faults: Faults,
    /// Client sessions each group keeps (smaller than the clients forces evictions).
    pub sessions_max: usize,
    /// Ops between checkpoints (and the journal kept below one).
    pub checkpoint_interval: u64,
    /// Replicas drop timers and compact their journals while idle.
    pub quiesce: bool,
    /// Replicas drop the bodies of applied ops from memory at once (the partition
    /// groups' setting), serving them from disk.
    pub compact_committed: bool,
    /// Clients resend an operation whose outcome is unknown under a new session after
    /// theirs was evicted (breaking the client-table rule; the model must catch the
    /// double execution this allows).
    pub resend_after_eviction: bool,
    /// Journal writes complete only once synced (`fsync = always`); off, they complete
    /// in the page cache and a power loss may take them (`fsync = never`).
    pub journal_fsync: bool,
}

impl SimConfig {
    /// A configuration drawn from `seed`: 1, 3 or 5 replicas, 1 to 3 groups, faults.
    pub fn from_seed(seed: u64) -> Self {
        let mut prng = Prng::new(seed ^ 0x5eed);
        let replica_count = [1, 3, 3, 3, 5][prng.below(5) as usize];
        // One seed in twenty is a big workload: thousands of ops in one group, many
        // checkpoints, a long safety phase.
        let big = prng.chance(5);
        let clients_per_group = if big {
            4 + prng.below(5)
        } else {
            1 + prng.below(4)
        };
        let (groups, requests_per_client, safety_ticks) = if big {
            (1, 200 + prng.below(400), 4_000 + prng.below(4_000))
        } else {
            (
                1 + prng.below(3),
                5 + prng.below(20),
                500 + prng.below(1500),
            )
        };
        Self {
            seed,
            replica_count,
            groups,
            clients_per_group,
            requests_per_client,
            safety_ticks,
            liveness_ticks_max: if big { 200_000 } else { 20_000 },
            faults: Faults::random(&mut prng),
            // One spare: a duplicate register evicts someone, but clients never thrash.
            sessions_max: clients_per_group as usize + 1,
            checkpoint_interval: 64,
            quiesce: prng.chance(50),
            journal_fsync: prng.chance(50),
            resend_after_eviction: false,
            // Drawn last, so every earlier setting of a seed is what it was before.
            compact_committed: prng.chance(50),
        }
    }
}

/// A safety or liveness violation, with the seed that reproduces it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// The seed.
    pub seed: u64,
    /// The tick.
    pub tick: u64,
    /// What broke.
    pub what: String,
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "seed {} failed at tick {}: {}\nreplay: cargo run -p braid-sim --release -- --seed {} --trace",
            self.seed, self.tick, self.what, self.seed
        )
    }
}

/// What a finished run measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Outcome {
    /// Ticks the liveness phase needed to converge.
    pub ticks_to_converge: u64,
    /// Ops committed over all groups.
    pub ops_committed: u64,
    /// Replica crashes injected.
    pub crashes: u64,
    /// Journal entries corrupted.
    pub corruptions: u64,
    /// Writes torn by a crash.
    pub torn_writes: u64,
    /// Writes the disk refused.
    pub failed_writes: u64,
    /// Replayed old registers the cluster refused.
    pub stale_registers_refused: u64,
    /// Requests whose session was evicted before their reply came: their outcome is
    /// unknown and the client does not resend them (the client-table rule).
    pub outcomes_unknown: u64,
    /// Whole-node crashes (replica r of every group at once).
    pub node_crashes: u64,
    /// Journal writes that landed on another slot.
    pub misdirected_writes: u64,
    /// Latent read errors injected.
    pub latent_errors: u64,
    /// Reads (repair answers) that failed on a damaged or latent slot.
    pub read_errors_found: u64,
    /// Durable-state slots damaged.
    pub state_slots_damaged: u64,
    /// Checkpoint slots damaged.
    pub checkpoint_slots_damaged: u64,
    /// Messages damaged in flight and delivered (the receiver must refuse them).
    pub damaged_messages: u64,
    /// Unsynced page-cache writes a power loss took.
    pub unsynced_writes_lost: u64,
    /// Crashes that were power losses.
    pub power_losses: u64,
    /// Crashes that lost the whole disk (the replica rejoined with nothing).
    pub wipes: u64,
    /// The highest view reached.
    pub views: u64,
    /// Primaries that stepped down because their prepares committed nothing.
    pub step_downs: u64,
    /// Primaries that handed their group back to its preferred replica.
    pub hand_offs: u64,
}

impl Outcome {
    /// Adds another run's counts (for a summary over many seeds).
    pub fn add(&mut self, other: &Self) {
        self.ops_committed += other.ops_committed;
        self.crashes += other.crashes;
        self.corruptions += other.corruptions;
        self.torn_writes += other.torn_writes;
        self.failed_writes += other.failed_writes;
        self.stale_registers_refused += other.stale_registers_refused;
        self.outcomes_unknown += other.outcomes_unknown;
        self.node_crashes += other.node_crashes;
        self.misdirected_writes += other.misdirected_writes;
        self.latent_errors += other.latent_errors;
        self.read_errors_found += other.read_errors_found;
        self.state_slots_damaged += other.state_slots_damaged;
        self.checkpoint_slots_damaged += other.checkpoint_slots_damaged;
        self.damaged_messages += other.damaged_messages;
        self.unsynced_writes_lost += other.unsynced_writes_lost;
        self.power_losses += other.power_losses;
        self.wipes += other.wipes;
        self.views = self.views.max(other.views);
        self.step_downs += other.step_downs;
        self.hand_offs += other.hand_offs;
    }

    /// The fault counts, one line.
    pub fn fault_summary(&self) -> String {
        format!(
            "{} replica crashes, {} node crashes, {} torn writes, {} failed writes, {} corrupted entries, {} misdirected writes, {} latent read errors ({} found on read), {} durable-state slots damaged, {} checkpoint slots damaged, {} damaged messages, {} power losses ({} unsynced writes lost), {} disks lost, {} stale registers refused, {} primaries stepped down, {} handed their group back",
            self.crashes,
            self.node_crashes,
            self.torn_writes,
            self.failed_writes,
            self.corruptions,
            self.misdirected_writes,
            self.latent_errors,
            self.read_errors_found,
            self.state_slots_damaged,
            self.checkpoint_slots_damaged,
            self.damaged_messages,
            self.power_losses,
            self.unsynced_writes_lost,
            self.wipes,
            self.stale_registers_refused,
            self.step_downs,
            self.hand_offs,
        )
    }
}
