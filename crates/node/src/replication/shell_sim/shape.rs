//! The shape of one shell simulator run: how many members and partitions, the
//! node's parameters it runs with, and the rates of every fault, drawn from its seed.

use braid_sim::Prng;

use super::files;
#[cfg(doc)]
use super::Variant;

/// The shape of one run, drawn from its seed.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Shape {
    /// Members of every partition group: 3, or 5 ([`Variant`]).
    pub(crate) members: u8,
    pub(crate) partitions: u32,
    /// Ops between checkpoints (the node's 1,024, or fewer, so that a short run goes
    /// through many checkpoints, prunes and state transfers).
    pub(crate) checkpoint_interval: u64,
    /// Segment size: small ones seal (and index) often.
    pub(crate) segment_bytes: u32,
    /// Ticks with faults, then at most `liveness_ticks` to converge without them.
    pub(crate) safety_ticks: u64,
    pub(crate) liveness_ticks: u64,
    /// Chance per tick, in percent, that a producer sends a batch.
    pub(crate) produce_percent: u64,
    /// Chance per tick, per 10,000, that a member crashes.
    pub(crate) crash_per_10k: u64,
    /// Of the crashes, the percent that are power losses.
    pub(crate) power_loss_percent: u64,
    /// Network faults.
    pub(crate) loss_percent: u64,
    pub(crate) duplicate_percent: u64,
    pub(crate) delay_ticks_max: u64,
    /// Chance per tick, per 10,000, that a link is cut or healed.
    pub(crate) cut_per_10k: u64,
    /// Of the power losses of the one member whose disk may be damaged (member
    /// `seed % members`: one faulty member at a time, as VSR tolerates), the
    /// percent after which a file of it is damaged at rest.
    pub(crate) damage_percent: u64,
    /// Damage at rest may also be a misdirected write: a page of one file landed over
    /// another page of it or of another file ([`Variant::misdirected`]).
    pub(crate) misdirected: bool,
    /// Damage at rest may also be a latent read error: a page every read of fails
    /// until it is written again ([`Variant::latent`]).
    pub(crate) latent: bool,
    /// Retention by size on the partitions' logs (a third of the seeds, or
    /// `BRAID_SHELL_SIM_RETENTION=1`): each member deletes its oldest segments every
    /// [`RETENTION_TICKS`] while it keeps twice a segment, as far as its journal
    /// allows, and the checks compare each log from the latest start.
    pub(crate) retention: bool,
    /// The partitions' logs under `fsync = never` (a third of the seeds): their
    /// journals restart trusted only in the boot that wrote their state, so crashes
    /// are `kill -9` only (a power loss may lose what `never` acknowledged).
    pub(crate) fsync_never: bool,
    /// How often (ticks) idle partitions' files go to sleep: often, so that a run
    /// wakes them for every kind of use (a write, a read, a repair, a copy served,
    /// the scrub, a view change).
    pub(crate) sleep_ticks: u64,
    /// Partitions whose files may be open at once (the node's `open_logs_per_shard`):
    /// fewer than the run's partitions in half the seeds, so that any use (a write, a
    /// prepare, a repair, a copy, the scrub's look) may release another's files.
    pub(crate) open_budget: usize,
    /// Most partitions one idle pass puts to sleep (the node's 64): fewer than the
    /// run's partitions in half the seeds, so that idle partitions wait awake, their
    /// files released or not, for a later pass, and are used meanwhile.
    pub(crate) sleeps_per_pass: usize,
    /// Ticks between the scrub's wakes of sleeping partitions for a look: the node's
    /// 10 in half the seeds, 1 (every tick, so that damage at rest is met often) in
    /// the rest.
    pub(crate) scrub_wake_ticks: u64,
    /// Chance per tick, per 10,000, that the damaged member's files of a partition
    /// that sleeps are damaged or one of them removed while it runs (seeds with damage
    /// to sleeping files, [`Variant::asleep`]): its next use finds them changed and
    /// opens the partition again from them.
    pub(crate) asleep_damage_per_10k: u64,
    /// Chance per tick, per 10,000, that a member runs out of file descriptors for a
    /// while (seeds with [`Variant::descriptors`]): every open and creation of its
    /// partitions' files (a wake, a segment's roll, a checkpoint, a reopen) is refused
    /// EMFILE, and the group that met it is dropped and opened again once it can be.
    pub(crate) descriptors_out_per_10k: u64,
}

impl Shape {
    /// The kinds of damage at rest beside flipped bits and zeroed pages.
    pub(super) fn kinds(&self) -> files::DamageKinds {
        files::DamageKinds {
            misdirected: self.misdirected,
            latent: self.latent,
        }
    }

    pub(super) fn from_seed(prng: &mut Prng) -> Self {
        Self {
            members: 3,
            partitions: 1 + prng.below(3) as u32,
            checkpoint_interval: [16, 32, 64, 1_024][prng.below(4) as usize],
            segment_bytes: [2_048, 8_192, 1 << 20][prng.below(3) as usize],
            safety_ticks: 3_000 + prng.below(3_000),
            liveness_ticks: 20_000,
            produce_percent: 20 + prng.below(60),
            crash_per_10k: prng.below(40),
            power_loss_percent: prng.below(101),
            loss_percent: prng.below(10),
            duplicate_percent: prng.below(5),
            delay_ticks_max: 1 + prng.below(8),
            cut_per_10k: prng.below(20),
            damage_percent: if prng.chance(50) {
                0
            } else {
                20 + prng.below(60)
            },
            // Drawn apart from the rest, so the seeds' other draws stay as they were.
            misdirected: false,
            latent: false,
            retention: false,
            fsync_never: false,
            sleep_ticks: 100,
            open_budget: usize::MAX,
            sleeps_per_pass: usize::MAX,
            scrub_wake_ticks: 1,
            asleep_damage_per_10k: 0,
            descriptors_out_per_10k: 0,
        }
    }
}
