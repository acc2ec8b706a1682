//! Why a shard's groups cannot go on, and which errors drop one group alone: files
//! found changed under it, or an open refused a file descriptor.

use super::{CheckpointError, JournalError, PartitionJournalError, StatesError};

/// Why the shard's groups cannot go on. Every one stops them: after a failed write,
/// what reached the disk is unknown until a restart reads it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub(crate) enum HostError {
    #[error(transparent)]
    Journal(#[from] JournalError),
    #[error(transparent)]
    States(#[from] StatesError),
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    #[error(transparent)]
    Partition(#[from] PartitionJournalError),
    #[error("group {group}: {reason}")]
    Start { group: u64, reason: String },
    /// A lone replica's files hold damage it has no peer to repair from: its group
    /// does not start (a partition's is refused alone, the rest of the node serves).
    #[error(
        "group {group}: {reason}, and a lone replica has no peer to repair it from (see \
         \"Damage a replica finds in its replication files\" in docs/operations.md)"
    )]
    Damaged { group: u64, reason: String },
    #[error("no group {0} on this shard")]
    UnknownGroup(u64),
    /// A group's files, asleep, were not as left when woken (damage at rest, a file
    /// removed): the group alone is dropped from the host and must be opened again
    /// from its files ([`ShardHost::take_reopen`]), as a start opens it.
    #[error("group {group}: its files changed while asleep: {reason}")]
    WakeRefused { group: u64, reason: String },
    /// A group's files, asleep, could not be opened for want of a file descriptor:
    /// nothing was found changed in them ([`HostError::is_out_of_descriptors`]).
    #[error(
        "group {group}: its files could not be opened: {reason} (raise the descriptor \
         limit, `ulimit -n`: see \"File descriptors and memory\" in docs/operations.md)"
    )]
    WakeWithoutDescriptors { group: u64, reason: String },
}

impl HostError {
    /// Whether an open failed for want of a file descriptor (EMFILE, ENFILE): nothing
    /// on disk changed, and the same open succeeds once descriptors are free. The
    /// group alone is dropped and opened again from its files when it can be (see
    /// [`ShardHost::found_changed`]): a shard's other groups never stop for it. (They
    /// did: a wake refused for want of a descriptor dropped its group, and the open
    /// that followed, refused too, stopped every group of the shard until a restart.)
    pub(crate) fn is_out_of_descriptors(&self) -> bool {
        matches!(self, Self::WakeWithoutDescriptors { .. }) || caused_by_out_of_descriptors(self)
    }

    /// Whether a group's files were found changed under the running process: at a
    /// wake ([`HostError::WakeRefused`]), or damage met in use (a batch that does not
    /// check, a segment gone). Not a failed disk operation: the group alone is opened
    /// again from its files, as a start opens it, and the shard's others go on.
    pub(crate) fn is_found_changed(&self) -> bool {
        use braid_storage::LogError;
        let gone = |source: &std::io::Error| source.kind() == std::io::ErrorKind::NotFound;
        match self {
            Self::WakeRefused { .. }
            | Self::Partition(PartitionJournalError::Log(
                LogError::Corrupt { .. } | LogError::NotAsClosed { .. },
            )) => true,
            // A file it had (its journal, a segment) gone when opened again by name.
            Self::Partition(PartitionJournalError::Log(LogError::Io { source, .. }))
            | Self::Partition(PartitionJournalError::Journal(JournalError::Io {
                source, ..
            })) => gone(source),
            _ => false,
        }
    }

    /// Whether a lone replica found damage in its files at open (a damaged or lost
    /// journal, log or checkpoint, or its durable state): its group alone is refused,
    /// not the node. Anything else (a failed disk operation, say) stops the shard.
    pub(crate) fn is_damage(&self) -> bool {
        matches!(
            self,
            Self::Damaged { .. }
                | Self::Partition(
                    PartitionJournalError::JournalLost { .. }
                        | PartitionJournalError::OlderThanAcknowledged { .. }
                        | PartitionJournalError::Log(braid_storage::LogError::Corrupt { .. })
                        | PartitionJournalError::Journal(
                            JournalError::NotAJournal { .. } | JournalError::DurableTailLost { .. }
                        )
                )
        )
    }
}

/// Whether `err`, or an error that caused it, is an IO error for want of a file
/// descriptor ([`braid_storage::disk::is_out_of_descriptors`]).
pub(crate) fn caused_by_out_of_descriptors(err: &(dyn std::error::Error + 'static)) -> bool {
    let mut next = Some(err);
    while let Some(err) = next {
        if err
            .downcast_ref::<std::io::Error>()
            .is_some_and(braid_storage::disk::is_out_of_descriptors)
        {
            return true;
        }
        next = err.source();
    }
    false
}
