//! A journal file let go while its group is idle, and taken back exactly as it was.

use super::*;

/// What a journal file put to sleep keeps: what its file must hold when it is opened
/// again, and what the journal had learned in this process that an open does not
/// read back (where its markers reach, which head copy is next).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct JournalAsleep {
    len: u64,
    /// CRC32C of what the open reads back: the prune, the committed end and every
    /// entry's record.
    fingerprint: u32,
    marked_len: u64,
    durable_marked_len: u64,
    generation: u64,
    head_writes: u64,
}

impl JournalFile {
    /// Whether the journal may sleep: nothing written waits to be reported.
    pub(crate) fn can_sleep(&self) -> bool {
        !self.poisoned && self.unsynced.is_empty()
    }

    /// Makes what was written durable, and nothing more (no marker: for a holder
    /// whose writes were reported before they were synced, under `fsync = interval` or
    /// `never`, letting the file go).
    ///
    /// # Errors
    /// The sync failed (the journal is poisoned).
    pub(crate) fn sync_data_only(&mut self) -> Result<(), JournalError> {
        if self.poisoned {
            return Err(JournalError::Poisoned(self.path()));
        }
        let file = self.handle()?;
        if let Err(err) = disk::sync_data(&file, &self.path()) {
            self.poisoned = true;
            return Err(io(&self.path())(err));
        }
        self.head_pending = None;
        Ok(())
    }

    /// Lets the file go (the journal must [`JournalFile::can_sleep`]): what it keeps
    /// checks the file when [`JournalFile::wake`] opens it again.
    pub(crate) fn sleep(self) -> JournalAsleep {
        debug_assert!(self.can_sleep());
        JournalAsleep {
            len: self.len,
            fingerprint: self.fingerprint(),
            marked_len: self.marked_len,
            durable_marked_len: self.durable_marked_len,
            generation: self.generation,
            head_writes: self.head_writes,
        }
    }

    /// Opens the file at `path` again as group `group`'s journal that went to sleep as
    /// `asleep`.
    /// A file that is gone or of another length is refused before anything is
    /// written; one whose records read back otherwise (damage at rest: a member's open
    /// may cut or rewrite it, marking the journal untrusted first through `before_cut`
    /// as a restart would; a `lone` replica's changes nothing, as its start does) is
    /// refused after. Either way the holder restarts.
    ///
    /// # Errors
    /// [`JournalError::NotAsLeft`], or IO errors.
    pub(crate) fn wake(
        path: SharedPath,
        group: u64,
        asleep: &JournalAsleep,
        lone: bool,
        reported_unsynced: bool,
        before_cut: impl FnOnce() -> Result<(), JournalError>,
    ) -> Result<Self, JournalError> {
        let file = path.get();
        let changed = |reason: String| JournalError::NotAsLeft {
            path: file.clone(),
            reason,
        };
        let len = match std::fs::metadata(&file) {
            Ok(meta) => meta.len(),
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
                return Err(changed("it is gone".into()))
            }
            Err(err) => return Err(io(&file)(err)),
        };
        if len != asleep.len {
            return Err(changed(format!("{len} bytes where it had {}", asleep.len)));
        }
        let (mut journal, found) =
            Self::open_marking_at(path, group, lone, reported_unsynced, before_cut)?;
        if (journal.len, journal.fingerprint()) != (asleep.len, asleep.fingerprint) {
            return Err(changed("its records read back otherwise".into()));
        }
        if let Some(at) = found.damaged_at.filter(|_| lone) {
            // Damage whose records read back as they were (an older copy of a record,
            // say): a lone replica's start refuses it all the same, so its wake does.
            return Err(changed(format!("it is damaged at byte {at}")));
        }
        journal.marked_len = asleep.marked_len;
        journal.durable_marked_len = asleep.durable_marked_len;
        journal.generation = asleep.generation;
        journal.head_writes = asleep.head_writes;
        journal.release();
        Ok(journal)
    }

    /// CRC32C of what an open reads back of this journal.
    fn fingerprint(&self) -> u32 {
        let mut crc = crc32c::crc32c(&self.pruned_through.to_be_bytes());
        for value in [self.pruned_log_end, self.committed_end] {
            crc = crc32c::crc32c_append(crc, &value.map_or(u64::MAX, |v| v).to_be_bytes());
        }
        crc = crc32c::crc32c_append(crc, &[u8::from(self.headed), u8::from(self.sealed)]);
        for entry in self.entries.values() {
            crc = crc32c::crc32c_append(crc, &entry.record());
        }
        crc
    }
}
