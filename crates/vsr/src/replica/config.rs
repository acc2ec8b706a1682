//! A replica's settings, and the ranges they must keep.

use crate::message::ReplicaId;

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
    /// (plus jitter up to the same again). A primary of a group of more than one whose
    /// prepares commit nothing for twice this long steps down the same way (it has lost
    /// its quorum, while clients may still reach it): the clients waiting on it hear
    /// that it no longer leads instead of waiting forever.
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
    /// Drop each entry's body from memory once a later op is applied (the shell's
    /// journal on disk serves it, as for quiescence): a group whose bodies are large
    /// (a partition's record batches) then holds only its uncommitted ops in memory,
    /// whatever its checkpoint interval.
    pub compact_committed: bool,
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
            compact_committed: false,
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
