//! The Braid partition log on disk.
//!
//! A partition is an append-only sequence of record batches (see `braid_proto::batch`)
//! with dense offsets. [`PartitionLog`] keeps it in one directory as log segments, each
//! a `.log` file of batches named by its base offset, with a sparse offset index
//! (`.index`) and a time index (`.timeindex`). The newest segment takes appends; the
//! others are sealed and read-only. `docs/format.md` describes the files byte by byte.
//!
//! - Appends take a [`braid_proto::ValidatedBatch`], so only checked bytes reach the
//!   disk; the log assigns offsets and writes to the page cache.
//! - Durability follows the [`FsyncPolicy`]: a [`Syncer`] thread runs the `fdatasync`
//!   calls and merges concurrent requests (group commit).
//! - Opening after a crash verifies the newest segment, cuts a torn tail and rebuilds
//!   indexes; damage that is not a torn tail is an error naming file and position.
//! - Retention deletes whole sealed segments by size and age.
//! - An idle log holds no file descriptors after [`PartitionLog::release_files`] or
//!   a clean close; [`OpenLogLru`] tells a shard which log to let go.
//!
//! ```
//! use braid_proto::{BatchBuilder, ValidatedBatch};
//! use braid_storage::{LogConfig, PartitionLog};
//!
//! let dir = tempfile::tempdir().unwrap();
//! let mut log = PartitionLog::open(dir.path().join("p0"), LogConfig::default(), 0).unwrap();
//! let mut builder = BatchBuilder::new(1_000);
//! builder.push(Some(b"key"), Some(b"value"), &[], 1_000);
//! let batch = ValidatedBatch::new(builder.finish()).unwrap();
//! let appended = log.append_blocking(batch, 1_000).unwrap();
//! assert_eq!((appended.base_offset, appended.last_offset), (0, 0));
//! let read = log.read(0, 1 << 20, u64::MAX).unwrap();
//! assert_eq!(read.next_offset, 1);
//! log.close().unwrap();
//! ```

mod config;
#[cfg(any(test, feature = "fault-injection"))]
pub mod crash;
mod dirs;
pub mod disk;
mod error;
mod files;
mod index;
mod log;
mod log_start;
mod lru;
mod recovery_point;
mod segment;
mod sync;
mod walk;
mod writeback;

pub use config::{
    ConfigError, FsyncPolicy, LogConfig, RecoveryMode, SEGMENT_BYTES_MAX, SEGMENT_BYTES_MIN,
    WRITE_BEHIND_BYTES_DEFAULT,
};
pub use dirs::{create_dir_durable, sync_dir};
pub use error::{Corruption, LogError};
pub use log::{Appended, PartitionLog, RecoveryReport, RetentionOutcome};
pub use lru::OpenLogLru;
pub use segment::LogRead;
pub use sync::{
    SyncCallback, SyncError, SyncRequest, Syncer, SyncerStats, SYNC_ROUND_REQUESTS_MAX,
};
