//! The writer of a connection: answers go out as they complete, and a client that
//! reads none of them is closed after `connection_write_timeout_ms`.

use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncWrite, AsyncWriteExt, BufWriter};
use tokio::sync::{mpsc, OwnedSemaphorePermit};

use crate::mailbox::{NodeShared, PrincipalBudget};
use crate::metrics::{add, ShardMetrics};

pub(super) enum Outgoing {
    Frame(Vec<u8>),
    /// A fetch answer, with the shares of the fetch-byte budgets it holds until it is
    /// written.
    Fetch(Vec<u8>, braid_storage::LogRead, FetchBudget),
}

/// A fetch's shares of its connection's, its user's and the node's fetch-byte budgets.
pub(super) struct FetchBudget {
    _connection: OwnedSemaphorePermit,
    _principal: OwnedSemaphorePermit,
    _node: OwnedSemaphorePermit,
    /// Whose share it holds: while another fetch of the same user waits for it, this
    /// answer may stall only `fetch_stall_contended_ms`.
    principal: Arc<PrincipalBudget>,
}

impl FetchBudget {
    pub(super) fn new(
        connection: OwnedSemaphorePermit,
        principal_permit: OwnedSemaphorePermit,
        node: OwnedSemaphorePermit,
        principal: Arc<PrincipalBudget>,
    ) -> Self {
        Self {
            _connection: connection,
            _principal: principal_permit,
            _node: node,
            principal,
        }
    }
}

/// How long an answer may make no progress before its connection is closed: the write
/// timeout, or `fetch_stall_contended_ms` while other fetches wait for the node's
/// budget or for the share of the user whose fetch answer it is (a client that reads
/// nothing then delays the others that little).
struct Stall {
    shared: Arc<NodeShared>,
    alone: Duration,
    contended: Duration,
}

impl Stall {
    fn bound(&self, principal: Option<&PrincipalBudget>) -> Duration {
        let load = |waiting: &std::sync::atomic::AtomicUsize| {
            waiting.load(std::sync::atomic::Ordering::Acquire)
        };
        let contended = load(&self.shared.fetch_budget_waiting) > 0
            || principal.is_some_and(|p| load(&p.waiting) > 0);
        if contended {
            self.contended.min(self.alone)
        } else {
            self.alone
        }
    }
}

pub(super) async fn write_loop<W: AsyncWrite + Unpin>(
    writer: W,
    mut outgoing: mpsc::Receiver<Outgoing>,
    shared: Arc<NodeShared>,
    metrics: Arc<ShardMetrics>,
) {
    let stall = Stall {
        alone: Duration::from_millis(shared.config.connection_write_timeout_ms.max(1)),
        contended: Duration::from_millis(shared.config.fetch_stall_contended_ms.max(1)),
        shared: Arc::clone(&shared),
    };
    let mut writer = BufWriter::with_capacity(64 * 1024, writer);
    while let Some(first) = outgoing.recv().await {
        let mut next = Some(first);
        while let Some(item) = next {
            let principal = match &item {
                Outgoing::Frame(_) => None,
                Outgoing::Fetch(_, _, budget) => Some(&*budget.principal),
            };
            let written = match &item {
                Outgoing::Frame(frame) => {
                    write_progressing(&mut writer, frame, &stall, principal).await
                }
                Outgoing::Fetch(prefix, read, _) => {
                    match write_progressing(&mut writer, prefix, &stall, principal).await {
                        Ok(()) => {
                            write_progressing(&mut writer, read.bytes(), &stall, principal).await
                        }
                        Err(err) => Err(err),
                    }
                }
            };
            if let Err(err) = written {
                if err.kind() == std::io::ErrorKind::TimedOut {
                    add(&metrics.connections_closed_stalled, 1);
                    tracing::info!(
                        stall_ms = stall.bound(principal).as_millis() as u64,
                        "closing a connection whose client reads no answers"
                    );
                }
                // Dropping the queue releases every budget share its answers held.
                return;
            }
            // Written: the read buffer goes back and the budget shares are released.
            if let Outgoing::Fetch(_, read, _budget) = item {
                shared.read_buffers.give_back(read.into_buffer());
            }
            next = outgoing.try_recv().ok();
        }
        let flushed = tokio::time::timeout(stall.alone, writer.flush()).await;
        if !matches!(flushed, Ok(Ok(()))) {
            return;
        }
    }
}

/// Bytes written per step of a large answer: each step must make progress within the
/// write timeout, so a slow reader is not closed but a stopped one is.
const WRITE_STEP_BYTES: usize = 256 * 1024;

/// How often a stalled write checks whether its bound changed.
const STALL_CHECK: Duration = Duration::from_millis(250);

/// Writes `bytes`, failing with `TimedOut` if a step of them makes no progress within
/// the stall bound (which tightens while others wait for the budget).
async fn write_progressing<W: AsyncWrite + Unpin>(
    writer: &mut BufWriter<W>,
    bytes: &[u8],
    stall: &Stall,
    principal: Option<&PrincipalBudget>,
) -> std::io::Result<()> {
    for step in bytes.chunks(WRITE_STEP_BYTES) {
        let started = tokio::time::Instant::now();
        let mut write = std::pin::pin!(writer.write_all(step));
        loop {
            match tokio::time::timeout(STALL_CHECK.min(stall.alone), &mut write).await {
                Ok(result) => {
                    result?;
                    break;
                }
                Err(_) if started.elapsed() >= stall.bound(principal) => {
                    return Err(std::io::ErrorKind::TimedOut.into())
                }
                Err(_) => {}
            }
        }
    }
    Ok(())
}
