//! A single node's partition whose files hold damage no peer can repair (issue 24:
//! the damaged partition, not the whole node, refuses writes and reads past the
//! damage, naming it, while the other partitions serve).
//!
//! Its replication group does not start. Its log is opened to be read up to its first
//! damage, cutting nothing ([`RecoveryMode::ReadToDamage`]: damage in its newest
//! segment, or a segment missing from its middle, ends it in memory only), and serves
//! what it holds before it, each batch checked as every read is; a produce, and a read
//! from there on (where the damage may have taken acknowledged records), get
//! `StorageError` with the reason found at open. A log whose first segments are gone
//! serves nothing. Restoring the
//! partition, or `recovery = "truncate-at-damage"`, is the way out
//! (`docs/operations.md`).

use braid_proto::client::{ErrorCode, OffsetSpec};
use braid_storage::{LogConfig, PartitionLog, RecoveryMode};

use crate::error::NodeError;
use crate::mailbox::{FetchOutcome, NodeShared};
use crate::partition::Partition;
use crate::shard::read_for_fetch;

/// A partition refused at open, and what of its log is readable.
#[derive(Debug)]
pub(crate) struct RefusedPartition {
    /// Why, naming the file and offset (or op) and the way out.
    reason: String,
    /// The log as found, and a partition whose high watermark is where the log ends.
    log: Option<(PartitionLog, Partition)>,
}

impl RefusedPartition {
    /// Opens what `dir` holds of a partition (tagged `tag`) whose group was refused
    /// for `reason`.
    pub(crate) fn open(dir: &std::path::Path, tag: i32, config: LogConfig, reason: String) -> Self {
        let config = LogConfig {
            recovery: RecoveryMode::ReadToDamage,
            ..config
        };
        // A directory that is gone stays gone: opening a log would make an empty one.
        let log = match dir
            .is_dir()
            .then(|| PartitionLog::open_tagged(dir, tag, config, crate::mailbox::now_ms()))
        {
            Some(Ok(log)) => {
                let end = log.next_offset();
                Some((log, Partition::new(end)))
            }
            Some(Err(err)) => {
                tracing::error!(dir = %dir.display(), %err, "the refused partition's log does not open: it serves nothing");
                None
            }
            None => None,
        };
        Self { reason, log }
    }

    /// The error every write, and every read past what the log holds, gets.
    pub(crate) fn refusal(&self) -> NodeError {
        NodeError::new(
            ErrorCode::StorageError,
            format!(
                "the partition is refused on this node: {}; it takes no writes, and reads \
                 stop where its log ends",
                self.reason
            ),
        )
    }

    /// Reads from `offset`: what the log holds below its end (never a damaged byte),
    /// else the refusal.
    pub(crate) fn fetch(
        &mut self,
        shared: &NodeShared,
        offset: u64,
        max_bytes: u32,
    ) -> Result<FetchOutcome, NodeError> {
        let refusal = self.refusal();
        let Some((log, partition)) = self.log.as_mut() else {
            return Err(refusal);
        };
        if offset >= partition.high_watermark() && offset >= log.start_offset() {
            return Err(refusal);
        }
        // Damage it meets is already why it is refused, or is named by the read.
        read_for_fetch(shared, partition, log, offset, max_bytes).0
    }

    /// The offset `spec` names in what the log holds; the latest is refused: where
    /// the log ends is not where the partition's acknowledged records end (the damage
    /// may have taken the newest), and a reader told "the end" there would stop short
    /// of them without a word (an outside review of issue 24: a deleted newest
    /// segment, and `braid consume` printed 175 of 200 records and exited 0).
    pub(crate) fn list_offset(&mut self, spec: OffsetSpec) -> Result<Option<u64>, NodeError> {
        let refusal = self.refusal();
        if spec == OffsetSpec::Latest {
            return Err(refusal);
        }
        let (log, partition) = self.log.as_mut().ok_or(refusal)?;
        partition.list_offset(log, spec)
    }

    /// The log's start and end, if it opened.
    pub(crate) fn offsets(&self) -> Option<(u64, u64)> {
        self.log
            .as_ref()
            .map(|(log, partition)| (log.start_offset(), partition.high_watermark()))
    }
}
