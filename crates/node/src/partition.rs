//! One partition on its owning shard: the log, the commit point (high watermark), the
//! produce acknowledgements waiting for it, and the fetches waiting for new data.
//!
//! The write path has the shape replication needs: [`Partition::propose`] appends (the
//! prepare), the commit point moves only through [`Partition::commit`], producers are
//! answered only at commit, and reads stop at the commit point. On a single node the
//! commit follows the local append, after the `fsync` the policy asks for; the VSR
//! issue replaces what calls `commit` with a quorum of replicas.

use std::collections::VecDeque;

use braid_proto::client::{ErrorCode, OffsetSpec};
use braid_proto::ValidatedBatch;
use braid_storage::{FsyncPolicy, LogError, LogRead, PartitionLog, SyncError, SyncRequest};

use crate::error::NodeError;
use crate::mailbox::{FetchReply, ProduceReply};

/// The partition leader epoch a single node writes into every batch it appends.
pub(crate) const LEADER_EPOCH_SINGLE_NODE: i32 = 0;

/// A fetch parked at the high watermark until records commit.
#[derive(Debug)]
pub(crate) struct WaitingFetch {
    pub(crate) offset: u64,
    pub(crate) max_bytes: u32,
    pub(crate) reply: FetchReply,
}

struct PendingAck {
    base_offset: u64,
    last_offset: u64,
    reply: ProduceReply,
}

/// A partition owned by this shard.
pub(crate) struct Partition {
    log: PartitionLog,
    high_watermark: u64,
    awaiting_commit: VecDeque<PendingAck>,
    sync_in_flight: bool,
    /// Fetches waiting at the high watermark. Registering is O(1) (pushed; closed ones
    /// are swept only when the queue has doubled since the last sweep): a list walked
    /// per registration cost 5 s of CPU at 40,000 waiters.
    waiting: VecDeque<WaitingFetch>,
    /// Length of `waiting` after its last sweep.
    waiting_swept: usize,
    /// Waiting fetches a commit woke, answered by the shard a few at a time between
    /// its other requests, so a burst of them never holds up a produce.
    woken: VecDeque<WaitingFetch>,
    sealed: bool,
    /// The log's poisoning was counted and logged.
    poison_reported: bool,
    /// The high watermark as other shards may read it (the group coordinator).
    published: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

impl std::fmt::Debug for Partition {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Partition")
            .field("dir", &self.log.dir())
            .field("high_watermark", &self.high_watermark)
            .field("awaiting_commit", &self.awaiting_commit.len())
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
    pub(crate) fn new(log: PartitionLog) -> Self {
        // Everything found on open was synced by close or recovery: it is committed.
        let high_watermark = log.next_offset();
        Self {
            log,
            high_watermark,
            awaiting_commit: VecDeque::new(),
            sync_in_flight: false,
            waiting: VecDeque::new(),
            waiting_swept: 0,
            woken: VecDeque::new(),
            sealed: false,
            poison_reported: false,
            published: std::sync::Arc::new(std::sync::atomic::AtomicU64::new(high_watermark)),
        }
    }

    /// The high watermark for readers on other shards.
    pub(crate) fn published_high_watermark(&self) -> std::sync::Arc<std::sync::atomic::AtomicU64> {
        std::sync::Arc::clone(&self.published)
    }

    /// Why the log refuses writes, the first time this is asked after it began to
    /// (a failed disk step poisons it until the node restarts); `None` otherwise.
    pub(crate) fn newly_poisoned(&mut self) -> Option<String> {
        if self.poison_reported {
            return None;
        }
        let reason = self.log.poisoned()?.to_owned();
        self.poison_reported = true;
        Some(reason)
    }

    pub(crate) fn log_mut(&mut self) -> &mut PartitionLog {
        &mut self.log
    }

    pub(crate) fn high_watermark(&self) -> u64 {
        self.high_watermark
    }

    pub(crate) fn start_offset(&self) -> u64 {
        self.log.start_offset()
    }

    pub(crate) fn segment_count(&self) -> usize {
        self.log.segment_count()
    }

    pub(crate) fn sync_due(&self, now_ms: u64) -> bool {
        self.log.sync_due(now_ms)
    }

    /// Appends a batch and arranges its acknowledgement at commit. Returns a sync
    /// request when the fsync policy needs one before the commit.
    pub(crate) fn propose(
        &mut self,
        batch: ValidatedBatch,
        now_ms: u64,
        reply: ProduceReply,
    ) -> Option<SyncRequest> {
        if self.sealed {
            let _ = reply.send(Err(NodeError::new(
                ErrorCode::PartitionSealed,
                "partition is sealed",
            )));
            return None;
        }
        // The batch records the epoch of the leader that appended it; a single node is
        // epoch 0 (replication will write the view).
        let mut batch = batch;
        batch.set_partition_leader_epoch(LEADER_EPOCH_SINGLE_NODE);
        let appended = match self.log.append(batch, now_ms) {
            Ok(appended) => appended,
            Err(err) => {
                let _ = reply.send(Err(err.into()));
                return None;
            }
        };
        self.awaiting_commit.push_back(PendingAck {
            base_offset: appended.base_offset,
            last_offset: appended.last_offset,
            reply,
        });
        match self.log.config().fsync {
            FsyncPolicy::Always => self.request_sync(),
            FsyncPolicy::Interval { .. } | FsyncPolicy::Never => {
                let next = self.log.next_offset();
                self.commit(next);
                None
            }
        }
    }

    /// A sync request if one is needed and none is running.
    pub(crate) fn request_sync(&mut self) -> Option<SyncRequest> {
        if self.sync_in_flight {
            return None;
        }
        match self.log.sync_request() {
            Ok(Some(request)) => {
                self.sync_in_flight = true;
                Some(request)
            }
            Ok(None) => None,
            Err(err) => {
                self.fail_pending(&NodeError::from(err));
                None
            }
        }
    }

    /// Takes a finished sync; under `always` it moves the commit point. Returns the
    /// next sync request if appends arrived meanwhile.
    pub(crate) fn on_synced(
        &mut self,
        request: &SyncRequest,
        result: Result<(), SyncError>,
    ) -> Option<SyncRequest> {
        self.sync_in_flight = false;
        let failed = result.clone().err();
        self.log.on_synced(request, result);
        if let Some(err) = failed {
            self.fail_pending(&NodeError::new(
                ErrorCode::StorageError,
                format!("fsync failed: {err}"),
            ));
            return None;
        }
        if self.log.config().fsync == FsyncPolicy::Always {
            let durable = self.log.durable_offset();
            self.commit(durable);
        }
        if self.awaiting_commit.is_empty() {
            None
        } else {
            self.request_sync()
        }
    }

    /// Moves the commit point to `up_to` (exclusive): answers the producers whose
    /// batches are now committed and wakes waiting fetches.
    pub(crate) fn commit(&mut self, up_to: u64) {
        if up_to <= self.high_watermark {
            return;
        }
        self.high_watermark = up_to;
        self.published
            .store(up_to, std::sync::atomic::Ordering::Release);
        while let Some(front) = self.awaiting_commit.front() {
            if front.last_offset >= up_to {
                break;
            }
            if let Some(ack) = self.awaiting_commit.pop_front() {
                let _ = ack.reply.send(Ok((ack.base_offset, ack.last_offset)));
            }
        }
        if !self.waiting.is_empty() {
            self.woken.append(&mut self.waiting);
            self.waiting_swept = 0;
        }
    }

    fn fail_pending(&mut self, err: &NodeError) {
        for ack in self.awaiting_commit.drain(..) {
            let _ = ack.reply.send(Err(err.clone()));
        }
    }

    /// Reads committed batches from `offset` into `buffer` (from the node's pool; the
    /// read hands it back through [`LogRead::into_buffer`]).
    pub(crate) fn read(
        &mut self,
        offset: u64,
        max_bytes: u32,
        buffer: Vec<u8>,
    ) -> Result<LogRead, NodeError> {
        if offset > self.high_watermark && offset <= self.log.next_offset() {
            // Appended but not committed: nothing to read yet.
            return Ok(LogRead::empty_with(offset, buffer));
        }
        Ok(self
            .log
            .read_reusing(offset, max_bytes, self.high_watermark, buffer)?)
    }

    /// Parks a fetch until the next commit.
    pub(crate) fn wait_for_commit(&mut self, fetch: WaitingFetch) {
        if self.waiting.len() >= (2 * self.waiting_swept).max(64) {
            // Fetches whose connection gave up (timed out or closed) go, amortised O(1).
            self.waiting.retain(|w| !w.reply.is_closed());
            self.waiting_swept = self.waiting.len();
        }
        self.waiting.push_back(fetch);
    }

    /// Whether a commit woke fetches that are not answered yet.
    pub(crate) fn has_woken(&self) -> bool {
        !self.woken.is_empty()
    }

    /// Up to `count` woken fetches, oldest first.
    pub(crate) fn take_woken(&mut self, count: usize) -> Vec<WaitingFetch> {
        let count = count.min(self.woken.len());
        self.woken.drain(..count).collect()
    }

    pub(crate) fn list_offset(&mut self, spec: OffsetSpec) -> Result<Option<u64>, NodeError> {
        Ok(match spec {
            OffsetSpec::Earliest => Some(self.log.start_offset()),
            OffsetSpec::Latest => Some(self.high_watermark),
            OffsetSpec::Timestamp(ts) => self
                .log
                .offset_for_timestamp(ts)?
                .filter(|offset| *offset < self.high_watermark),
        })
    }

    /// Syncs and closes the log cleanly. Producers still waiting get `ShuttingDown`.
    pub(crate) fn close(mut self) -> Result<(), LogError> {
        self.log.sync()?;
        let durable = self.log.durable_offset();
        self.commit(durable);
        self.fail_pending(&NodeError::new(
            ErrorCode::ShuttingDown,
            "node is shutting down",
        ));
        self.log.close()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use braid_storage::disk::hook::{self, Plan};
    use braid_storage::disk::DiskOp;
    use braid_storage::LogConfig;
    use tokio::sync::oneshot;

    fn batch() -> ValidatedBatch {
        let mut builder = braid_proto::BatchBuilder::new(1_000);
        builder.push(Some(b"k"), Some(b"v"), &[], 1_000);
        ValidatedBatch::new(builder.finish()).unwrap()
    }

    /// A failed group-commit sync fails the waiting produce, poisons the partition, is
    /// reported once, and the next produce is refused, never acknowledged.
    #[test]
    fn a_failed_sync_fails_the_produce_and_is_reported_once() {
        let dir = tempfile::tempdir().unwrap();
        let config = LogConfig {
            fsync: FsyncPolicy::Always,
            ..LogConfig::default()
        };
        let mut partition = Partition::new(PartitionLog::open(dir.path(), config, 0).unwrap());
        let (reply, mut answer) = oneshot::channel();
        let request = partition.propose(batch(), 0, reply).unwrap();
        hook::install(Plan {
            fail_first: Some((DiskOp::Sync, ".log", std::io::ErrorKind::Other)),
            ..Plan::default()
        });
        let result = request.run();
        drop(hook::take());
        assert!(result.is_err());
        assert!(partition.on_synced(&request, result).is_none());
        let refused = answer.try_recv().unwrap().unwrap_err();
        assert_eq!(refused.code, ErrorCode::StorageError);
        assert!(partition.newly_poisoned().is_some(), "reported");
        assert!(partition.newly_poisoned().is_none(), "only once");
        let (reply, mut answer) = oneshot::channel();
        assert!(partition.propose(batch(), 0, reply).is_none());
        assert!(
            answer.try_recv().unwrap().is_err(),
            "refused, not acknowledged"
        );
        assert_eq!(partition.high_watermark(), 0);
    }
}
