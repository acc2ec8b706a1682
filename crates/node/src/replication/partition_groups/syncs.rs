//! The partition journals' syncs, run off the shard's turn by the syncer: started
//! for a group with unsynced writes, and their completions taken back.

use super::*;

impl PartitionGroups {
    /// Starts the sync job of `group`'s journal on the syncer.
    pub(super) fn start_sync(&mut self, group: u64) {
        let Some(link) = self.sync.clone() else {
            return;
        };
        let Some(journal) = self.host.journal_mut(group) else {
            return;
        };
        let job = match journal.start_sync() {
            Ok(Some(job)) => job,
            Ok(None) => return,
            // Its journal's file could not be opened again (a descriptor refused):
            // that group alone is dropped and opened again.
            Err(err) => {
                self.fail_group(group, err.into());
                return;
            }
        };
        let remaining =
            std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(job.requests.len()));
        let failure = std::sync::Arc::new(std::sync::Mutex::new(None));
        let id = job.id;
        self.syncs_started += 1;
        for request in job.requests {
            let (remaining, failure, done) = (
                std::sync::Arc::clone(&remaining),
                std::sync::Arc::clone(&failure),
                link.done.clone(),
            );
            link.syncer.submit(request, move |_, result| {
                if let (Err(err), Ok(mut slot)) = (result, failure.lock()) {
                    slot.get_or_insert(err);
                }
                if remaining.fetch_sub(1, std::sync::atomic::Ordering::AcqRel) == 1 {
                    let result = match failure.lock() {
                        Ok(mut slot) => slot.take().map_or(Ok(()), Err),
                        Err(_) => Err(braid_storage::SyncError {
                            kind: std::io::ErrorKind::Other,
                            message: "a sync callback panicked".into(),
                        }),
                    };
                    let _ = done.send(crate::mailbox::Control::GroupSynced {
                        group,
                        job: id,
                        result,
                    });
                }
            });
        }
    }

    /// A sync job finished: the replica hears which of its writes are durable.
    pub(crate) fn on_synced(
        &mut self,
        group: u64,
        job: u64,
        result: Result<(), braid_storage::SyncError>,
    ) -> Moved {
        let mut moved = Vec::new();
        let Some(journal) = self.host.journal_mut(group) else {
            return moved;
        };
        match journal.finish_sync(job, result) {
            Ok(written) if written.is_empty() => {}
            Ok(written) => {
                let inputs = written
                    .into_iter()
                    .map(|(op, checksum)| (group, Input::JournalWritten { op, checksum }))
                    .collect();
                match self.host.step(self.now, inputs) {
                    Ok(effects) => self.carry(effects, &mut moved),
                    Err(HostError::UnknownGroup(_)) => {}
                    Err(err) => self.fail(err),
                }
            }
            // A failed sync stops the shard's groups; a sync marker whose journal file
            // could not be opened again (a descriptor refused) drops that group alone.
            Err(err) => self.fail_group(group, err.into()),
        }
        // The sync's marker waits for a sync of its own before its ops are reported.
        if self
            .host
            .journal_mut(group)
            .is_some_and(|journal| journal.has_unsynced())
        {
            self.start_sync(group);
        }
        self.flush_into(&mut moved);
        moved
    }
}
