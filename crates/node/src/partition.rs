//! One partition on its owning shard, as readers see it: the commit point (high
//! watermark) and the fetches waiting for it. The records are the partition group's
//! journal (`replication::partition_groups`), which moves the commit point; reads
//! stop at it.

use std::collections::VecDeque;

use braid_proto::client::{ErrorCode, OffsetSpec};
use braid_storage::{LogError, LogRead, PartitionLog};

use crate::error::NodeError;
use crate::mailbox::FetchReply;

/// A fetch parked at the high watermark until records commit.
#[derive(Debug)]
pub(crate) struct WaitingFetch {
    pub(crate) offset: u64,
    pub(crate) max_bytes: u32,
    pub(crate) reply: FetchReply,
}

/// The fetches parked at a partition.
#[derive(Debug, Default)]
struct Waiters {
    /// Fetches waiting at the high watermark. Registering is O(1) (pushed; closed ones
    /// are swept only when the queue has doubled since the last sweep): a list walked
    /// per registration cost 5 s of CPU at 40,000 waiters.
    waiting: VecDeque<WaitingFetch>,
    /// Length of `waiting` after its last sweep.
    swept: usize,
    /// Waiting fetches a commit woke, answered by the shard a few at a time between
    /// its other requests, so a burst of them never holds up a produce.
    woken: VecDeque<WaitingFetch>,
}

/// A read of committed batches, and the damage it met, if any: never served (the read
/// stops before it, or is refused when it starts there).
#[derive(Debug)]
pub(crate) struct CheckedRead {
    pub(crate) read: Result<LogRead, NodeError>,
    pub(crate) damage: Option<ReadDamage>,
}

/// Damage in a partition's committed log that a read met.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReadDamage {
    /// A batch that does not check, at its base offset (a member repairs it from a
    /// peer's copy).
    Batch(u64),
    /// The log cannot be read from this offset on (a segment cut short, a header that
    /// does not parse): a member's scrub finds the batch for the repair.
    From(u64),
}

/// A partition owned by this shard.
pub(crate) struct Partition {
    high_watermark: u64,
    /// Fetches parked here, while there are any (most partitions have none: kept
    /// apart, an idle partition costs a pointer, not two queues).
    waiters: Option<Box<Waiters>>,
    sealed: bool,
    /// The log's poisoning was counted and logged.
    poison_reported: bool,
    /// What other shards may read of it (one allocation, one map entry a partition).
    published: std::sync::Arc<Published>,
}

/// A partition as its owner publishes it for other shards.
#[derive(Debug)]
pub(crate) struct Published {
    /// The high watermark (the group coordinator refuses commits beyond it).
    high_watermark: std::sync::atomic::AtomicU64,
    /// The group's primary and view ([`pack_primary`]; `ClusterInfo` reads it).
    primary: std::sync::atomic::AtomicU64,
}

impl Published {
    pub(crate) fn high_watermark(&self) -> u64 {
        self.high_watermark
            .load(std::sync::atomic::Ordering::Acquire)
    }

    /// The primary (`None` while unknown) and its view.
    pub(crate) fn primary(&self) -> (Option<u8>, u64) {
        unpack_primary(self.primary.load(std::sync::atomic::Ordering::Acquire))
    }
}

/// A primary as published for `ClusterInfo`: the view above the low byte, the member
/// (255 while unknown) in it.
pub(crate) fn pack_primary(primary: Option<u8>, view: u64) -> u64 {
    (view << 8) | u64::from(primary.unwrap_or(u8::MAX))
}

/// The member and view [`pack_primary`] packed.
pub(crate) fn unpack_primary(packed: u64) -> (Option<u8>, u64) {
    let member = (packed & 0xff) as u8;
    ((member != u8::MAX).then_some(member), packed >> 8)
}

impl std::fmt::Debug for Partition {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Partition")
            .field("high_watermark", &self.high_watermark)
            .field(
                "waiting",
                &self.waiters.as_ref().map_or(0, |w| w.waiting.len()),
            )
            .finish()
    }
}

impl From<LogError> for NodeError {
    fn from(err: LogError) -> Self {
        let code = match &err {
            LogError::OffsetOutOfRange { .. } => ErrorCode::OffsetOutOfRange,
            LogError::BatchTooLarge { .. } => ErrorCode::BatchTooLarge,
            _ => ErrorCode::StorageError,
        };
        NodeError::new(code, err.to_string())
    }
}

impl Partition {
    /// A partition whose group starts with `high_watermark` committed.
    pub(crate) fn new(high_watermark: u64) -> Self {
        Self {
            high_watermark,
            waiters: None,
            sealed: false,
            poison_reported: false,
            published: std::sync::Arc::new(Published {
                high_watermark: std::sync::atomic::AtomicU64::new(high_watermark),
                primary: std::sync::atomic::AtomicU64::new(pack_primary(None, 0)),
            }),
        }
    }

    /// What readers on other shards see of it.
    pub(crate) fn published(&self) -> std::sync::Arc<Published> {
        std::sync::Arc::clone(&self.published)
    }

    /// Publishes the group's primary (`None` while its replica changes view) in `view`.
    pub(crate) fn set_primary(&self, primary: Option<u8>, view: u64) {
        self.published.primary.store(
            pack_primary(primary, view),
            std::sync::atomic::Ordering::Release,
        );
    }

    /// Why the log refuses writes, the first time this is asked after it began to
    /// (a failed disk step poisons it until the node restarts); `None` otherwise.
    pub(crate) fn newly_poisoned(&mut self, log: &PartitionLog) -> Option<String> {
        if self.poison_reported {
            return None;
        }
        let reason = log.poisoned()?.to_owned();
        self.poison_reported = true;
        Some(reason)
    }

    pub(crate) fn high_watermark(&self) -> u64 {
        self.high_watermark
    }

    /// Whether produces are refused (`PartitionSealed`).
    pub(crate) fn sealed(&self) -> bool {
        self.sealed
    }

    /// Moves the commit point to `up_to` (exclusive) and wakes waiting fetches.
    pub(crate) fn commit(&mut self, up_to: u64) {
        if up_to <= self.high_watermark {
            return;
        }
        self.high_watermark = up_to;
        self.published
            .high_watermark
            .store(up_to, std::sync::atomic::Ordering::Release);
        if let Some(w) = self.waiters.as_mut().filter(|w| !w.waiting.is_empty()) {
            w.woken.append(&mut w.waiting);
            w.swept = 0;
        }
    }

    /// The committed offsets from `offset` that `log` lacks, `(from, to)`, if `offset`
    /// is among them: a cluster member's log that a copy from a peer is rebuilding
    /// (repair of damage, or a state transfer) ends below the high watermark until the
    /// copy is done. A read there is refused, never answered with no batches: a
    /// reader takes that for nothing written yet below a high watermark that promises
    /// records (the shell simulator's seed 384674 with damage to sleeping files; an
    /// outside review of issue 24 saw a member answer so for 80 s).
    pub(crate) fn lacking(&self, log: &PartitionLog, offset: u64) -> Option<(u64, u64)> {
        let from = log.next_offset();
        ((from..self.high_watermark).contains(&offset) && offset >= log.start_offset())
            .then_some((from, self.high_watermark))
    }

    /// Reads committed batches of `log` from `offset` into `buffer` (from the node's
    /// pool; the read hands it back through [`LogRead::into_buffer`]), and names the
    /// damaged batch it met, if any (the caller reports it to the partition's group).
    pub(crate) fn read(
        &self,
        log: &mut PartitionLog,
        offset: u64,
        max_bytes: u32,
        buffer: Vec<u8>,
    ) -> CheckedRead {
        if offset > self.high_watermark && offset <= log.next_offset() {
            // Appended but not committed: nothing to read yet.
            return CheckedRead {
                read: Ok(LogRead::empty_with(offset, buffer)),
                damage: None,
            };
        }
        let mut read = match log.read_reusing(offset, max_bytes, self.high_watermark, buffer) {
            Ok(read) => read,
            Err(err) => {
                // Bytes that do not parse, or a file shorter than the log holds it to
                // be (cut under the running process); not a failing disk.
                let damage = match &err {
                    LogError::Corrupt { .. } => Some(ReadDamage::From(offset)),
                    LogError::Io { source, .. }
                        if source.kind() == std::io::ErrorKind::UnexpectedEof =>
                    {
                        Some(ReadDamage::From(offset))
                    }
                    _ => None,
                };
                return CheckedRead {
                    read: Err(err.into()),
                    damage,
                };
            }
        };
        // A damaged byte is never served: the read stops before the damage (a peer's
        // copy repairs it in a cluster, see `replication::partition_groups`), and a
        // read that starts at it is refused, naming it.
        let damaged = read.keep_verified();
        if let Some(damaged) = damaged {
            if read.is_empty() {
                // Named by file and byte, as a damaged batch found at open is.
                let place = match read.end_in_file(log.dir()) {
                    Some((file, byte)) => format!("{} at byte {byte}", file.display()),
                    None => log.dir().display().to_string(),
                };
                return CheckedRead {
                    read: Err(NodeError::new(
                        ErrorCode::StorageError,
                        format!(
                            "the batch at offset {damaged} in {place} is damaged (its CRC \
                             does not check); a cluster member repairs it from a peer, a \
                             single node needs it restored (docs/operations.md, 'Recovery \
                             and damage')"
                        ),
                    )),
                    damage: Some(ReadDamage::Batch(damaged)),
                };
            }
            tracing::warn!(dir = %log.dir().display(), offset = damaged, "a read stopped before a damaged batch");
        }
        CheckedRead {
            read: Ok(read),
            damage: damaged.map(ReadDamage::Batch),
        }
    }

    /// Parks a fetch until the next commit.
    pub(crate) fn wait_for_commit(&mut self, fetch: WaitingFetch) {
        let w = self.waiters.get_or_insert_with(Box::default);
        if w.waiting.len() >= (2 * w.swept).max(64) {
            // Fetches whose connection gave up (timed out or closed) go, amortised O(1).
            w.waiting.retain(|f| !f.reply.is_closed());
            w.swept = w.waiting.len();
        }
        w.waiting.push_back(fetch);
    }

    /// Whether a commit woke fetches that are not answered yet.
    pub(crate) fn has_woken(&self) -> bool {
        self.waiters.as_ref().is_some_and(|w| !w.woken.is_empty())
    }

    /// Up to `count` woken fetches, oldest first.
    pub(crate) fn take_woken(&mut self, count: usize) -> Vec<WaitingFetch> {
        let Some(w) = self.waiters.as_mut() else {
            return Vec::new();
        };
        let count = count.min(w.woken.len());
        let taken = w.woken.drain(..count).collect();
        if w.woken.is_empty() && w.waiting.is_empty() {
            self.waiters = None;
        }
        taken
    }

    pub(crate) fn list_offset(
        &self,
        log: &mut PartitionLog,
        spec: OffsetSpec,
    ) -> Result<Option<u64>, NodeError> {
        Ok(match spec {
            OffsetSpec::Earliest => Some(log.start_offset()),
            OffsetSpec::Latest => Some(self.high_watermark),
            OffsetSpec::Timestamp(ts) => log
                .offset_for_timestamp(ts)?
                .filter(|offset| *offset < self.high_watermark),
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn offsets_a_log_lacks_below_its_high_watermark_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let mut log =
            PartitionLog::open(dir.path(), braid_storage::LogConfig::default(), 0).unwrap();
        let mut builder = braid_proto::BatchBuilder::new(1_000);
        for i in 0..5u8 {
            builder.push(None, Some(&[i]), &[], 1_000);
        }
        let batch = braid_proto::ValidatedBatch::new(builder.finish()).unwrap();
        log.append(batch, 0).unwrap();
        // The group committed 12 records; the log holds 5 (a copy rebuilds the rest).
        let partition = Partition::new(12);
        assert_eq!(partition.lacking(&log, 5), Some((5, 12)));
        assert_eq!(partition.lacking(&log, 11), Some((5, 12)));
        // What the log holds is served, and nothing is lacking at or past the mark.
        assert_eq!(partition.lacking(&log, 0), None);
        assert_eq!(partition.lacking(&log, 4), None);
        assert_eq!(partition.lacking(&log, 12), None);
        let read = partition
            .read(&mut log, 0, 1 << 20, Vec::new())
            .read
            .unwrap();
        assert_eq!(read.next_offset, 5);
        // A log that holds everything lacks nothing.
        assert_eq!(Partition::new(5).lacking(&log, 5), None);
    }

    /// What a read meets is reported for the partition's group (a single node refuses
    /// the partition, a member repairs it): a batch that does not check at its base
    /// offset, and a log that cannot be read from an offset (a sealed segment cut
    /// short: an outside review of issue 24 saw a single node take writes after it).
    #[test]
    fn damage_a_read_meets_is_named_for_the_group() {
        let dir = tempfile::tempdir().unwrap();
        let config = braid_storage::LogConfig {
            segment_bytes_max: braid_storage::SEGMENT_BYTES_MIN,
            ..braid_storage::LogConfig::default()
        };
        let mut log = PartitionLog::open(dir.path(), config, 0).unwrap();
        for batch in 0..6u8 {
            let mut builder = braid_proto::BatchBuilder::new(1_000);
            builder.push(None, Some(&[batch; 300]), &[], 1_000);
            let batch = braid_proto::ValidatedBatch::new(builder.finish()).unwrap();
            log.append(batch, 0).unwrap();
        }
        log.sync().unwrap();
        let partition = Partition::new(6);
        let whole = partition.read(&mut log, 0, 1 << 20, Vec::new());
        assert_eq!(whole.damage, None);
        assert!(whole.read.unwrap().next_offset > 0);
        // The first segment (sealed) cut short inside its last batch.
        let first = dir.path().join(format!("{:020}.log", 0));
        let len = std::fs::metadata(&first).unwrap().len();
        let file = std::fs::OpenOptions::new()
            .write(true)
            .open(&first)
            .unwrap();
        file.set_len(len - 10).unwrap();
        let second = (1..6)
            .map(|o| log.segment_base(o))
            .find(|b| *b > 0)
            .unwrap();
        let last_in_first = second - 1;
        let cut = partition.read(&mut log, last_in_first, 1 << 20, Vec::new());
        assert!(cut.read.is_err(), "{:?}", cut.read);
        assert_eq!(cut.damage, Some(ReadDamage::From(last_in_first)));
        // A batch whose bytes do not check: the read stops before it, naming it.
        let newest = dir.path().join(format!("{:020}.log", log.segment_base(5)));
        let mut bytes = std::fs::read(&newest).unwrap();
        let at = bytes.len() - 20;
        bytes[at] ^= 0x04;
        std::fs::write(&newest, bytes).unwrap();
        let from = log.segment_base(5);
        let flipped = partition.read(&mut log, from, 1 << 20, Vec::new());
        assert!(
            matches!(flipped.damage, Some(ReadDamage::Batch(offset)) if offset >= from),
            "{:?}",
            flipped.damage
        );
    }
}
