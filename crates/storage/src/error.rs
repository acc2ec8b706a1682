//! Errors of the partition log, typed by whose fault they are.

use std::path::PathBuf;

use braid_proto::BatchError;

/// What is wrong with bytes found on disk.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Corruption {
    /// The bytes are not a valid batch.
    #[error("{0}")]
    Batch(#[from] BatchError),
    /// A batch carries an offset that does not continue the log.
    #[error("batch base offset {found}, expected {expected}")]
    UnexpectedOffset {
        /// The offset that continues the log.
        expected: u64,
        /// The offset found.
        found: i64,
    },
    /// The segment file holding these offsets is gone: the segment before them ends
    /// where the next one does not start.
    #[error("the segment of offsets {from} to {to} is missing")]
    MissingSegment {
        /// The first offset missing (where the segment before ends).
        from: u64,
        /// Where the next segment starts.
        to: u64,
    },
    /// An offset index entry names a batch the `.log` file does not hold at that
    /// position: the index is rebuilt from the log and the read retried.
    #[error(
        "index entry for relative offset {relative_offset} at byte {position} names no such batch"
    )]
    IndexEntry {
        /// The relative offset the entry names.
        relative_offset: u32,
        /// The position the entry names.
        position: u32,
    },
}

/// Why a log operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LogError {
    /// The operating system refused an operation (disk full, permissions, IO error).
    #[error("{op} {path}: {source}")]
    Io {
        /// What was being done.
        op: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// Data on disk is damaged where it cannot be a torn write: it is reported, never
    /// dropped silently.
    #[error("corrupt data in {path} at byte {position}: {corruption}")]
    Corrupt {
        /// The log segment file.
        path: PathBuf,
        /// Byte position of the damaged batch in the file.
        position: u64,
        /// What is wrong.
        corruption: Corruption,
    },
    /// The offset is below the log start or above the next offset.
    #[error("offset {offset} is outside the log [{start}, {next}]")]
    OffsetOutOfRange {
        /// The offset asked for.
        offset: u64,
        /// The earliest offset still stored.
        start: u64,
        /// The offset the next append will get.
        next: u64,
    },
    /// Truncation must cut between batches.
    #[error("offset {offset} is inside batch [{batch_base}, {batch_last}]; truncate at a batch boundary")]
    NotBatchBoundary {
        /// The offset asked for.
        offset: u64,
        /// First offset of the batch that holds it.
        batch_base: u64,
        /// Last offset of that batch.
        batch_last: u64,
    },
    /// The batch cannot fit in one log segment.
    #[error("batch of {bytes} bytes exceeds the log segment size {segment_bytes_max}")]
    BatchTooLarge {
        /// Size of the batch.
        bytes: usize,
        /// The configured segment size.
        segment_bytes_max: u32,
    },
    /// An earlier fsync failed, so what the page cache holds may never reach the disk;
    /// the log takes no more writes until it is reopened (which runs recovery).
    #[error("log refuses writes after a failed fsync: {reason}")]
    Poisoned {
        /// The failure that poisoned the log.
        reason: String,
    },
    /// A replica's copy could not be written over damaged batches.
    #[error("cannot repair the log at offset {offset}: {why}")]
    Repair {
        /// The first offset to repair.
        offset: u64,
        /// Why not.
        why: String,
    },
    /// A repair at `offset` cannot be placed: the damage begins before it, at
    /// `damaged_from` (no intact batch leads there from the segment's start). The
    /// repair must start there.
    #[error("cannot repair the log at offset {offset}: the damage begins at {damaged_from}")]
    RepairFromEarlier {
        /// The offset the repair was asked for.
        offset: u64,
        /// The first damaged batch on the way to it.
        damaged_from: u64,
    },
    /// The settings cannot work.
    #[error(transparent)]
    Config(#[from] crate::ConfigError),
    /// A log closed in this process is not as it was closed
    /// ([`PartitionLog::reopen_closed`](crate::PartitionLog::reopen_closed)).
    #[error("the log in {path} is not as it was closed: {reason}")]
    NotAsClosed {
        /// The log's directory.
        path: PathBuf,
        /// What differs.
        reason: String,
    },
}

impl LogError {
    pub(crate) fn io(
        op: &'static str,
        path: impl Into<PathBuf>,
    ) -> impl FnOnce(std::io::Error) -> Self {
        let path = path.into();
        move |source| Self::Io { op, path, source }
    }

    /// As [`io`](Self::io), naming the path only when there is an error: for reads
    /// in a loop, where formatting a segment's path on every success cost more than
    /// the read.
    pub(crate) fn io_with(
        op: &'static str,
        path: impl FnOnce() -> PathBuf,
    ) -> impl FnOnce(std::io::Error) -> Self {
        move |source| Self::Io {
            op,
            path: path(),
            source,
        }
    }
}
