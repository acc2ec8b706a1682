//! Making a log shorter: cutting its tail (a view change's truncation), starting it
//! again empty at an offset (a state transfer), and dropping old segments (retention).
//! Each removal is synced before the next, so a crash never leaves a hole.

use std::sync::Arc;

use super::{delete_segment_files, sync_dir, PartitionLog, RetentionOutcome};
use crate::error::LogError;
use crate::files::{index_path, log_path, time_index_path};
use crate::recovery_point::RecoveryPoint;
use crate::segment::{
    find_batch, flush_index, load_index, truncate_index_files, IndexFiles, MaxTimestamp, Segment,
};
use crate::writeback::WriteBehind;

impl PartitionLog {
    /// Discards every record at or after `offset`, which must start a batch (or be the
    /// next offset, a no-op). Replication uses it to drop uncommitted entries after a
    /// view change. Durable when it returns; a crash during it leaves a log that ends
    /// somewhere between `offset` and the old end, never one with a hole.
    ///
    /// # Errors
    /// [`LogError::OffsetOutOfRange`], [`LogError::NotBatchBoundary`], IO errors.
    pub fn truncate(&mut self, offset: u64) -> Result<(), LogError> {
        self.check_writable()?;
        self.check_range(offset)?;
        if offset == self.next_offset {
            return Ok(());
        }
        // Rewritten bytes get write-back started again as they arrive.
        self.write_behind = WriteBehind::default();
        let at = self.segment_of(offset);
        let whole = self.segments[at].base_offset == offset;
        if whole {
            // The segment goes whole: a damaged one, whose index cannot be loaded, is
            // cut all the same, its index files with it (rebuilt, empty, below).
            if self.ensure_index(at).is_err() {
                self.segments[at].index = None;
                let base = self.segments[at].base_offset;
                for path in [
                    index_path(&self.dir, base),
                    time_index_path(&self.dir, base),
                ] {
                    match crate::disk::remove(&path) {
                        Ok(()) => {}
                        Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
                        Err(err) => return Err(LogError::io("remove", path)(err)),
                    }
                }
            }
        } else {
            self.ensure_index(at)?;
        }
        let position = if whole {
            0
        } else if self.segments[at].end_offset == Some(offset) {
            // At the segment's end: the segments after it go, it stays whole (a cut
            // at a missing segment, see `check_segments_continue`).
            self.segments[at].size_bytes
        } else {
            let found = self.with_sound_index(at, |log, file| {
                find_batch(&log.dir, &log.segments[at], file, offset)
            })?;
            match found {
                Some((position, header)) if header.base_offset as u64 == offset => position,
                Some((_, header)) => {
                    return Err(LogError::NotBatchBoundary {
                        offset,
                        batch_base: header.base_offset as u64,
                        batch_last: header.last_offset() as u64,
                    })
                }
                None => return Err(self.out_of_range(offset)),
            }
        };
        self.remove_clean_marker()?;
        // Newest first, each removal synced before the next, so a crash leaves a log
        // without holes.
        while self.segments.len() > at + 1 {
            let Some(doomed) = self.segments.pop() else {
                break;
            };
            self.forget_files_of(doomed.base_offset);
            // Synced before the next removal and before the cut below: a cut that
            // reached the disk while a removal did not would leave the removed segment
            // after it on the next open, and a hole of offsets between them (found by
            // the crash-state harness once its truncations reached synced batches).
            let removed = delete_segment_files(&self.dir, doomed.base_offset)
                .and_then(|()| sync_dir(&self.dir));
            self.poisoning("removing a truncated segment", removed)?;
        }
        self.active_file = None;
        if self
            .reader
            .as_ref()
            .is_some_and(|(base, _)| *base == self.segments[at].base_offset)
        {
            self.reader = None;
        }
        self.sealed_indexes
            .retain(|base| *base != self.segments[at].base_offset);
        let file = self.file_for(at)?;
        // The log ends at `offset` from here on in memory, whatever the disk does: a
        // failure below poisons, and reads never go past the cut.
        self.next_offset = offset;
        self.durable_offset = self.durable_offset.min(offset);
        self.generation += 1;
        let dir = self.dir.clone();
        let interval = self.config.index_interval_bytes;
        let segment = &mut self.segments[at];
        let path = log_path(&dir, segment.base_offset);
        segment.size_bytes = position;
        segment.end_offset = Some(offset);
        let relative = segment.relative(offset);
        if let Some(index) = segment.index.as_mut() {
            index.truncate(relative);
        }
        // The recovery point may not name bytes that are about to be rewritten: it is
        // lowered, durably, before the cut, or the log is poisoned. (Stored without a
        // sync, a power loss could keep the cut and the old point: bytes written after
        // the cut and torn by it would then lie below the point, damage to what was
        // synced, and an open would refuse or repair them.)
        let base = segment.base_offset;
        let lowered = RecoveryPoint {
            segment_base: base,
            position,
        };
        let key = |p: &RecoveryPoint| (p.segment_base, p.position);
        let recovery_point = if key(&lowered) < key(&self.recovery_point) {
            lowered
        } else {
            self.recovery_point
        };
        let lowering = recovery_point != self.recovery_point;
        let cut = recovery_point
            .store(&dir, self.tag, lowering)
            .map_err(LogError::io(
                "write",
                dir.join(crate::recovery_point::RECOVERY_POINT_FILE),
            ))
            .and_then(|()| {
                crate::disk::set_len(&file, &path, position)
                    .map_err(LogError::io("truncate", &path))
            })
            .and_then(|()| {
                crate::disk::sync_data(&file, &path).map_err(LogError::io("fsync", &path))
            })
            .and_then(|()| truncate_index_files(&dir, segment))
            .and_then(|()| flush_index(&dir, segment, false))
            .and_then(|()| {
                // Reload so the running largest timestamp and the tail are recomputed
                // by the same walk that opening uses.
                segment.index = None;
                segment.max_timestamp = MaxTimestamp::Unknown;
                load_index(&dir, segment, &file, interval, false, IndexFiles::Trust).map(|_| ())
            })
            .and_then(|()| sync_dir(&dir));
        self.recovery_point = recovery_point;
        self.poisoning("truncating", cut)
    }

    /// Discards every record and starts the log again, empty, at `start`: a replica
    /// whose peers' retention deleted what it lacks copies their log from where it now
    /// begins. Durable when it returns; a crash during it leaves a prefix of the old
    /// log (segments go newest first, each removal synced) or the empty log at `start`,
    /// never one with a hole.
    ///
    /// # Errors
    /// [`LogError::Poisoned`], IO errors (which poison the log).
    pub fn reset(&mut self, start: u64, now_ms: u64) -> Result<(), LogError> {
        self.check_writable()?;
        self.remove_clean_marker()?;
        self.write_behind = WriteBehind::default();
        self.active_file = None;
        self.reader = None;
        self.sealed_indexes.clear();
        let stored = crate::log_start::store(&self.dir, start, self.tag).map_err(LogError::io(
            "write",
            self.dir.join(crate::log_start::LOG_START_FILE),
        ));
        self.poisoning("storing the log's new start", stored)?;
        while let Some(doomed) = self.segments.pop() {
            let removed = delete_segment_files(&self.dir, doomed.base_offset)
                .and_then(|()| sync_dir(&self.dir));
            self.poisoning("removing a segment to start the log again", removed)?;
        }
        let path = log_path(&self.dir, start);
        let point = RecoveryPoint {
            segment_base: start,
            position: 0,
        };
        let dir = self.dir.clone();
        let tag = self.tag;
        let created = crate::disk::create_new(&path)
            .map_err(LogError::io("create", &path))
            .and_then(|file| sync_dir(&dir).map(|()| file))
            .and_then(|file| {
                point
                    .store(&dir, tag, false)
                    .map_err(LogError::io(
                        "write",
                        dir.join(crate::recovery_point::RECOVERY_POINT_FILE),
                    ))
                    .map(|()| file)
            });
        let file = self.poisoning("starting the log again", created)?;
        self.segments.push(Segment::new_empty(start, now_ms));
        self.active_file = Some(Arc::new(file));
        self.next_offset = start;
        self.durable_offset = start;
        self.recovery_point = point;
        self.unsynced_since_ms = None;
        self.generation += 1;
        Ok(())
    }

    /// Deletes the oldest sealed segments that retention by size or age no longer
    /// keeps; never the active one.
    ///
    /// # Errors
    /// IO errors; segments deleted before the error stay deleted.
    pub fn apply_retention(&mut self, now_ms: u64) -> Result<RetentionOutcome, LogError> {
        self.apply_retention_below(now_ms, u64::MAX)
    }

    /// When [`PartitionLog::apply_retention_below`] with `keep_from` would next delete
    /// a segment if nothing were appended meanwhile: `0` if it would now, when the
    /// oldest segment's newest record expires, or `u64::MAX` for never (a log whose
    /// files are let go while idle is woken for retention only then).
    ///
    /// # Errors
    /// The oldest segment's index could not be read.
    pub fn retention_due_ms(&mut self, keep_from: u64) -> Result<u64, LogError> {
        if self.segments.len() < 2 || self.segments[1].base_offset > keep_from {
            return Ok(u64::MAX);
        }
        let total = self.size_bytes();
        let oldest_bytes = self.segments[0].size_bytes;
        if self
            .config
            .retention_bytes
            .is_some_and(|keep| total - oldest_bytes >= keep)
        {
            return Ok(0);
        }
        let Some(keep_ms) = self.config.retention_ms else {
            return Ok(u64::MAX);
        };
        self.ensure_index(0)?;
        Ok(match self.segments[0].max_timestamp {
            MaxTimestamp::At { timestamp, .. } => expires_at(timestamp, keep_ms),
            MaxTimestamp::Empty => 0,
            MaxTimestamp::Unknown => u64::MAX,
        })
    }

    /// As [`PartitionLog::apply_retention`], deleting only segments that end at or
    /// below `keep_from`: a replicated partition's journal still needs the batches of
    /// the ops its checkpoint does not cover.
    ///
    /// # Errors
    /// IO errors; segments deleted before the error stay deleted.
    pub fn apply_retention_below(
        &mut self,
        now_ms: u64,
        keep_from: u64,
    ) -> Result<RetentionOutcome, LogError> {
        let mut outcome = RetentionOutcome::default();
        while self.segments.len() > 1 && self.segments[1].base_offset <= keep_from {
            let total = self.size_bytes();
            let oldest_bytes = self.segments[0].size_bytes;
            let by_size = self
                .config
                .retention_bytes
                .is_some_and(|keep| total - oldest_bytes >= keep);
            let by_age = match self.config.retention_ms {
                Some(keep_ms) => {
                    self.ensure_index(0)?;
                    match self.segments[0].max_timestamp {
                        MaxTimestamp::At { timestamp, .. } => expired(timestamp, keep_ms, now_ms),
                        MaxTimestamp::Empty => true,
                        MaxTimestamp::Unknown => false,
                    }
                }
                None => false,
            };
            if !(by_size || by_age) {
                break;
            }
            let bytes = self.delete_oldest_segment()?;
            outcome.segments_deleted += 1;
            outcome.bytes_deleted += bytes;
        }
        outcome.start_offset = self.start_offset();
        Ok(outcome)
    }

    /// Deletes every whole segment below `offset` (the next one starts at or below
    /// it), whatever the retention settings: for a holder that knows no reader may ask
    /// for them again (a replica whose peers' logs all start above a damaged batch
    /// there). Returns the log's start after it.
    ///
    /// # Errors
    /// As [`apply_retention`](Self::apply_retention).
    pub fn delete_below(&mut self, offset: u64) -> Result<u64, LogError> {
        while self.segments.len() > 1 && self.segments[1].base_offset <= offset {
            self.delete_oldest_segment()?;
        }
        Ok(self.start_offset())
    }

    /// Deletes the oldest segment (there is a newer one), its start durable first.
    /// Returns its size.
    fn delete_oldest_segment(&mut self) -> Result<u64, LogError> {
        self.remove_clean_marker()?;
        // The new start is durable first: a start on disk below the first segment
        // names segments that are gone (see `log_start`).
        let kept = self.segments[1].base_offset;
        let stored = crate::log_start::store(&self.dir, kept, self.tag).map_err(LogError::io(
            "write",
            self.dir.join(crate::log_start::LOG_START_FILE),
        ));
        self.poisoning("storing the log's start for retention", stored)?;
        let doomed = self.segments.remove(0);
        self.forget_files_of(doomed.base_offset);
        // Each removal is synced before the next, oldest first, so a power cut can
        // only leave a shorter prefix removed, never a gap.
        let removed =
            delete_segment_files(&self.dir, doomed.base_offset).and_then(|()| sync_dir(&self.dir));
        self.poisoning("removing a segment for retention", removed)?;
        Ok(doomed.size_bytes)
    }
}

/// Whether a segment whose newest record is stamped `timestamp` (ms, any `i64`: a
/// producer chooses it) is older than `keep_ms` at `now_ms`. Computed in `i128`,
/// where the sum of any `i64` and `u64` is exact: no setting or timestamp can wrap
/// (a `keep_ms` of 2^63 or more once wrapped negative as an `i64` and expired every
/// segment).
/// The first time, in ms, at which a segment whose newest record is `timestamp` has
/// [`expired`] under `keep_ms`.
fn expires_at(timestamp: i64, keep_ms: u64) -> u64 {
    let at = i128::from(timestamp) + i128::from(keep_ms) + 1;
    u64::try_from(at.max(0)).unwrap_or(u64::MAX)
}

fn expired(timestamp: i64, keep_ms: u64, now_ms: u64) -> bool {
    i128::from(timestamp) + i128::from(keep_ms) < i128::from(now_ms)
}

#[cfg(test)]
mod tests {
    use super::{expired, expires_at};

    #[test]
    fn expiry_is_exact_at_the_ends_of_every_range() {
        assert!(!expired(1_000, 500, 1_500), "exactly the age is kept");
        assert!(expired(1_000, 500, 1_501));
        for keep in [1 << 63, u64::MAX] {
            assert!(!expired(0, keep, 1_700_000_000_000));
            assert!(!expired(i64::MAX, keep, u64::MAX));
        }
        assert!(!expired(i64::MIN, u64::MAX, u64::MAX / 2));
        assert!(expired(i64::MIN, 0, 0));
        assert!(
            expired(i64::MIN, u64::MAX, u64::MAX),
            "2^63 ms beyond the age"
        );
        assert!(!expired(i64::MAX, 0, i64::MAX as u64));
    }

    #[test]
    fn a_segment_expires_first_at_the_time_said() {
        for (timestamp, keep) in [
            (1_000, 500),
            (0, 0),
            (i64::MIN, 0),
            (i64::MIN, u64::MAX),
            (i64::MAX, u64::MAX),
            (-5, 3),
        ] {
            let at = expires_at(timestamp, keep);
            assert!(
                at == 0 || !expired(timestamp, keep, at - 1),
                "{timestamp} {keep}"
            );
            assert!(
                at == u64::MAX || expired(timestamp, keep, at),
                "{timestamp} {keep}"
            );
        }
    }
}
