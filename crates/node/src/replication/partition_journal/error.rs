//! Why a partition's journal failed.

use braid_storage::LogError;

use crate::replication::journal_file::JournalError;

/// Why the partition journal failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub(crate) enum PartitionJournalError {
    #[error(transparent)]
    Journal(#[from] JournalError),
    #[error("partition log: {0}")]
    Log(#[from] LogError),
    #[error("partition journal sync: {0}")]
    Sync(#[from] braid_storage::SyncError),
    #[error("partition state transfer: {0}")]
    Copy(String),
    /// A lone replica's header journal is gone (or cut short below its beginning)
    /// while its log holds batches (refused before anything is created, so the next
    /// start sees the same).
    #[error("{path} is gone or cut short while the partition log holds batches, and a lone replica has no peer to repair it from (see \"Damage a replica finds in its replication files\" in docs/operations.md)")]
    JournalLost { path: std::path::PathBuf },
    /// A lone replica's journal ends below the op its durable state says it committed:
    /// the partition's files are older than what it acknowledged (refused before the
    /// open cuts anything, so the next start sees the same).
    #[error(
        "{path} holds ops through {held}, while this node committed and acknowledged ops \
         through {committed} of this partition (its states table says so): the \
         partition's files are older than what this node acknowledged (restored from an \
         older backup, or a file replaced), and serving them would give acknowledged \
         offsets to other records (see \"Damage a replica finds in its replication \
         files\" in docs/operations.md)"
    )]
    OlderThanAcknowledged {
        path: std::path::PathBuf,
        held: u64,
        committed: u64,
    },
    /// The log does not end where the journal says the tip's batch ends: appending
    /// would store the batch at offsets the other replicas give other records.
    #[error(
        "partition log in {dir}: op {op}'s batch would go at offset {log_end}, but the \
         journal's op {tip} ends at {tip_end}; the log and its journal disagree, so \
         nothing more is appended (restart the node: the log is checked and repaired \
         from peers)"
    )]
    Misplaced {
        dir: std::path::PathBuf,
        op: u64,
        tip: u64,
        tip_end: u64,
        log_end: u64,
    },
    /// An op at or below the tip is replaced by a prepare that the op above it already
    /// chains to: the entry held was not what was appended there (damage that every
    /// check missed). Cutting the ops above, as a replacement does, would drop ops the
    /// replica holds durable.
    #[error(
        "partition journal in {dir}: op {op} is replaced by the prepare op {above} \
         chains to, so the entry held at op {op} is not the one appended there; \
         nothing is cut (restart the node: the journal is checked and repaired from \
         peers)",
        above = op + 1
    )]
    Unchained { dir: std::path::PathBuf, op: u64 },
    /// A committed op's batch is not the one stored, or not at the offsets the
    /// partition's state gives it.
    #[error(
        "partition log in {dir}: committed op {op} takes offsets from {base} on in the \
         partition's state, but the journal holds {} there; the log diverged, so the \
         partition stops rather than serve records at offsets other replicas give other \
         records",
        match stored {
            Some(at) => format!("a batch stored at {at}"),
            None => "another prepare".to_owned(),
        }
    )]
    Diverged {
        dir: std::path::PathBuf,
        op: u64,
        base: u64,
        stored: Option<u64>,
    },
}
