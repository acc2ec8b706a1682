//! Retention over a replicated partition's log: bounded by what the journal pruned,
//! and that prune made durable before a segment goes.

use super::{PartitionJournal, PartitionJournalError};

impl PartitionJournal {
    /// Deletes the log's oldest segments that retention no longer keeps, only those
    /// whose batches are all of ops the journal pruned (a checkpoint covers them): an
    /// op the journal still holds is replayed from its batch at a restart. (Unbounded,
    /// retention deleted such batches, and the next open took the ops for never
    /// reported, cut them and every op above, and cut the log back to its start.)
    ///
    /// # Errors
    /// As [`braid_storage::PartitionLog::apply_retention`], or the header journal's sync
    /// failed.
    pub(crate) fn apply_retention(
        &mut self,
        now_ms: u64,
    ) -> Result<braid_storage::RetentionOutcome, PartitionJournalError> {
        let keep_from = self.index.pruned().1.unwrap_or(0);
        if self.log.retention_due_ms(keep_from)? <= now_ms {
            self.make_prune_durable()?;
        }
        Ok(self.log.apply_retention_below(now_ms, keep_from)?)
    }

    /// Syncs the header journal, so the prune that bounds a deletion of the log's
    /// oldest segments is durable before they go. (A deletion is durable at once; a
    /// power loss that kept it but not the prune reopened ops whose batches lay below
    /// the log's start, and the member, starting its log again, asked peers whose
    /// retention had deleted them too, for ever: the shell simulator's seed 305047.)
    ///
    /// # Errors
    /// The sync failed (the journal is poisoned).
    pub(super) fn make_prune_durable(&mut self) -> Result<(), PartitionJournalError> {
        drop(self.index.sync_unmarked()?);
        self.index_changed_unsynced = false;
        Ok(())
    }
}
