//! A segment's indexes in memory: loaded from their files when first needed, checked
//! against the batches they name, rebuilt from the `.log` file when they do not hold,
//! and let go again for the oldest sealed segments.

use std::fs::File;

use super::{PartitionLog, SEALED_INDEXES_CACHED};
use crate::error::LogError;
use crate::files::log_path;
use crate::segment::{load_index, IndexFiles, MaxTimestamp};

impl PartitionLog {
    /// Runs `op` on segment `at` (its index loaded) and its file; if `op` finds an index
    /// entry that names no batch, rebuilds the segment's indexes from its `.log` file
    /// and runs `op` once more. A second fault is the log's, reported as corruption.
    pub(super) fn with_sound_index<T>(
        &mut self,
        at: usize,
        mut op: impl FnMut(&Self, &File) -> Result<T, LogError>,
    ) -> Result<T, LogError> {
        let file = self.file_for(at)?;
        match op(self, &file) {
            Err(LogError::Corrupt {
                corruption: crate::Corruption::IndexEntry { .. },
                ..
            }) => {
                self.rebuild_index(at, &file)?;
                op(self, &file)
            }
            done => done,
        }
    }

    /// Rebuilds segment `at`'s indexes from its `.log` file, ignoring the index files.
    pub(super) fn rebuild_index(&mut self, at: usize, file: &File) -> Result<(), LogError> {
        let sealed = at + 1 < self.segments.len();
        let interval = self.config.index_interval_bytes;
        let segment = &mut self.segments[at];
        segment.max_timestamp = MaxTimestamp::Unknown;
        load_index(
            &self.dir,
            segment,
            file,
            interval,
            sealed,
            IndexFiles::Rebuild,
        )?;
        self.recovery.indexes_rebuilt += 1;
        Ok(())
    }

    /// Loads the indexes of segment `at` if they are not in memory.
    pub(super) fn ensure_index(&mut self, at: usize) -> Result<(), LogError> {
        if self.segments[at].index.is_some()
            && self.segments[at].max_timestamp != MaxTimestamp::Unknown
        {
            return Ok(());
        }
        let file = self.file_for(at)?;
        let sealed = at + 1 < self.segments.len();
        let interval = self.config.index_interval_bytes;
        let segment = &mut self.segments[at];
        let rebuilt = load_index(
            &self.dir,
            segment,
            &file,
            interval,
            sealed,
            IndexFiles::Trust,
        )?;
        self.recovery.indexes_rebuilt += u32::from(rebuilt);
        if sealed {
            let segment = &self.segments[at];
            let next_base = self.segments[at + 1].base_offset;
            match segment.end_offset {
                // Every batch of the file read whole, and offsets left before the next
                // segment: no file holds them (one removed, say). Nothing written in
                // place repairs that; the holder's full open cuts the log there.
                Some(end) if end < next_base => {
                    return Err(self.missing_segment(end, next_base));
                }
                // Offsets past the next segment's start: the last batch's header is
                // damaged (the walk reads headers without their CRC), so the end is
                // not known until a read finds that batch and a repair mends it. (Kept,
                // it read as a segment missing after it, and the open cut the log at
                // an offset it never held: the shell simulator's seed 309621 with
                // damage to sleeping files.)
                Some(end) if end > next_base => {
                    let segment = &mut self.segments[at];
                    segment.end_offset = None;
                    return Err(LogError::Corrupt {
                        path: log_path(&self.dir, segment.base_offset),
                        position: segment.size_bytes,
                        corruption: crate::Corruption::UnexpectedOffset {
                            expected: end,
                            found: next_base as i64,
                        },
                    });
                }
                _ => {}
            }
            // No end known (`None`): the load met damage, and its index holds the
            // batches before it, which reads serve; a read that reaches the damage
            // names it.
            // Loaded again while still cached (a failed rebuild leaves its largest
            // timestamp unknown): moved to the back, never queued twice, or the trim
            // below would drop the index just loaded, and a lookup in it would find
            // no batch at all (the shell simulator's seed 31966 with damage at rest: a
            // cut at a batch boundary refused as outside the log).
            let base = segment.base_offset;
            self.sealed_indexes.retain(|b| *b != base);
            self.sealed_indexes.push_back(base);
            self.trim_sealed_indexes();
        }
        Ok(())
    }

    pub(super) fn trim_sealed_indexes(&mut self) {
        while self.sealed_indexes.len() > SEALED_INDEXES_CACHED {
            let Some(base) = self.sealed_indexes.pop_front() else {
                break;
            };
            let at = self.segments.partition_point(|s| s.base_offset < base);
            let sealed = at + 1 < self.segments.len();
            if let Some(segment) = self.segments.get_mut(at) {
                if segment.base_offset == base && sealed {
                    // Sealed indexes are complete in their files; only memory is freed.
                    segment.index = None;
                }
            }
        }
    }
}
