//! Why a shard could not start or apply a layout, kept typed until it reaches whoever
//! acts on it: a client (the coordinator answers `StorageError` naming it) or the
//! operator (a start error).

use crate::replication::shard_host::HostError;

/// What stopped a shard's start or a layout's application.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ShardError {
    /// The shard's partition groups (their durable states) could not be opened.
    #[error("partition groups: {0}")]
    Groups(#[source] HostError),
    /// A partition's files could not be opened or made.
    #[error("opening partition {topic}/{partition}: {source}")]
    OpenPartition {
        topic: String,
        partition: u32,
        #[source]
        source: HostError,
    },
    /// The partitions just opened could not recover their groups.
    #[error("recovering the partitions: {0}")]
    Recover(#[source] HostError),
    /// An opened partition's files could not be released.
    #[error("releasing the files of partition {partition} of topic {topic_id}: {source}")]
    Release {
        topic_id: u32,
        partition: u32,
        #[source]
        source: HostError,
    },
    /// New partitions' directories could not be synced.
    #[error("syncing the new partitions' directories: {0}")]
    DirSync(#[source] std::io::Error),
    /// The replica bus could not start.
    #[error("replica bus: {0}")]
    Bus(String),
}

impl ShardError {
    /// Whether a file could not be opened for want of a descriptor (EMFILE, ENFILE):
    /// nothing on disk changed, and the same open succeeds once descriptors are free.
    pub(crate) fn is_out_of_descriptors(&self) -> bool {
        match self {
            Self::Groups(source)
            | Self::OpenPartition { source, .. }
            | Self::Recover(source)
            | Self::Release { source, .. } => source.is_out_of_descriptors(),
            Self::DirSync(source) => braid_storage::disk::is_out_of_descriptors(source),
            Self::Bus(_) => false,
        }
    }
}

impl From<ShardError> for crate::error::NodeError {
    /// What a client whose change waited on the shard is told: the disk (or the bus)
    /// failed under it, naming what.
    fn from(err: ShardError) -> Self {
        use braid_proto::client::ErrorCode;
        let code = match &err {
            ShardError::Bus(_) => ErrorCode::Internal,
            _ => ErrorCode::StorageError,
        };
        Self::new(code, err.to_string())
    }
}
