//! The partition log: an ordered list of log segments, the newest one active.

use std::collections::VecDeque;
use std::fs::{File, OpenOptions};
use std::path::Path;
use std::sync::Arc;

use braid_proto::ValidatedBatch;

use crate::config::{FsyncPolicy, LogConfig};
use crate::error::LogError;
use crate::files::{index_path, log_path, time_index_path, CLEAN_MARKER};
use crate::recovery_point::RecoveryPoint;
use crate::segment::{flush_index, index_batch, read_batches, LogRead, MaxTimestamp, Segment};
use crate::sync::{SyncError, SyncRequest};
use crate::writeback::WriteBehind;

mod indexes;
mod open;
mod repair;
mod trim;

/// Unflushed index entries after which an append writes them to the index files.
const INDEX_FLUSH_ENTRIES: usize = 256;
/// Sealed segments whose indexes stay in memory per log (the active one always may).
const SEALED_INDEXES_CACHED: usize = 2;

/// Where an append landed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Appended {
    /// Offset of the batch's first record.
    pub base_offset: u64,
    /// Offset of its last record.
    pub last_offset: u64,
    /// Size of the batch in bytes.
    pub bytes: u32,
}

/// What opening the log found and did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecoveryReport {
    /// The log was closed cleanly, so the newest segment was trusted (its tail walked,
    /// not re-verified).
    pub clean: bool,
    /// Bytes of the newest segment verified batch by batch.
    pub bytes_scanned: u64,
    /// Bytes cut from the end of the newest segment (a torn tail, or damage dropped
    /// under [`crate::RecoveryMode::TruncateAtDamage`]).
    pub bytes_truncated: u64,
    /// Where damage that was not a torn tail was cut, under `TruncateAtDamage`.
    pub damage_cut_at: Option<u64>,
    /// Index files rebuilt from the log segment.
    pub indexes_rebuilt: u32,
    /// Where damage with intact batches after it was cut because it lay above the
    /// recovery point (bytes never synced, which a power cut leaves in any order).
    pub unsynced_damage_cut_at: Option<u64>,
}

/// What a lookup by time found in one segment.
enum TimeLookup {
    Found(u64),
    NotHere,
    /// A time entry named a batch that does not hold its timestamp.
    IndexFault,
}

/// Segments removed by retention.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RetentionOutcome {
    /// Log segments deleted.
    pub segments_deleted: u32,
    /// Bytes of batches deleted.
    pub bytes_deleted: u64,
    /// The log start offset afterwards.
    pub start_offset: u64,
}

/// An append-only log of record batches in one directory.
///
/// Offsets are dense: the log assigns each appended batch the next offsets. Reads return
/// the stored bytes of whole batches. The log is owned by one thread (a shard) and is
/// mutated through `&mut self`; durability is asked of a [`crate::Syncer`] with
/// [`PartitionLog::sync_request`] and reported back with [`PartitionLog::on_synced`],
/// or done inline with [`PartitionLog::sync`].
///
/// Call order for a shard under `fsync = always`: [`append`](Self::append) any number
/// of batches, then [`sync_request`](Self::sync_request), submit it, and acknowledge
/// the appends when its callback has passed the result to
/// [`on_synced`](Self::on_synced) and [`durable_offset`](Self::durable_offset) covers
/// them.
#[derive(Debug)]
pub struct PartitionLog {
    /// Shared with whoever keeps files beside the log (the node's journal and
    /// checkpoints), so that a partition holds its directory's path once.
    dir: Arc<Path>,
    config: Arc<LogConfig>,
    /// The partition's tag: what every stored batch carries in its leader epoch field
    /// and what seeds the recovery point's CRC, so that another partition's bytes
    /// written here (a misdirected write) read as damage.
    tag: i32,
    /// Sorted by base offset; the last one is active. Never empty.
    segments: Vec<Segment>,
    /// Read-write handle of the active segment, opened on demand.
    active_file: Option<Arc<File>>,
    /// Read handle of one sealed segment: (base offset, file).
    reader: Option<(u64, Arc<File>)>,
    /// Base offsets of sealed segments whose indexes are loaded, oldest first.
    sealed_indexes: VecDeque<u64>,
    next_offset: u64,
    durable_offset: u64,
    /// When the oldest append not yet durable was made (ms).
    unsynced_since_ms: Option<u64>,
    /// How far write-back and cache dropping have reached in the active segment.
    write_behind: WriteBehind,
    /// Grows on every truncation, so a sync that started before it is not taken as
    /// covering data written after it.
    generation: u64,
    /// The clean-shutdown marker is on disk and must go before the next write.
    clean_marker: bool,
    poisoned: Option<String>,
    recovery: RecoveryReport,
    /// How far the newest data is known synced (stored beside the segments).
    recovery_point: RecoveryPoint,
}

impl PartitionLog {
    /// The directory of the log.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The directory of the log, shared.
    pub fn shared_dir(&self) -> &Arc<Path> {
        &self.dir
    }

    /// The settings, shared.
    pub fn shared_config(&self) -> &Arc<LogConfig> {
        &self.config
    }

    /// The settings.
    pub fn config(&self) -> &LogConfig {
        &self.config
    }

    /// The partition's tag, which every stored batch carries (see
    /// [`open_tagged`](Self::open_tagged)).
    pub fn tag(&self) -> i32 {
        self.tag
    }

    /// The earliest offset still stored.
    pub fn start_offset(&self) -> u64 {
        self.segments
            .first()
            .map_or(self.next_offset, |s| s.base_offset)
    }

    /// Checks that the segment files the log holds open are still named by its
    /// directory: one deleted under a running process (by hand, say) keeps taking
    /// writes through its open handle, and they are gone at the next open.
    ///
    /// # Errors
    /// [`LogError::NotAsClosed`] naming the deleted file, or an IO error of `fstat`.
    pub fn check_linked(&self) -> Result<(), LogError> {
        use std::os::unix::fs::MetadataExt;
        let active = self
            .segments
            .last()
            .map(|s| (s.base_offset, &self.active_file));
        let sealed = self.reader.as_ref().map(|(base, file)| (*base, file));
        let open = active
            .and_then(|(base, file)| Some((base, file.as_ref()?)))
            .into_iter()
            .chain(sealed);
        for (base, file) in open {
            let path = log_path(&self.dir, base);
            let meta = file.metadata().map_err(LogError::io("fstat", &path))?;
            if meta.nlink() == 0 {
                return Err(LogError::NotAsClosed {
                    path: self.dir.to_path_buf(),
                    reason: format!("{} was deleted while open", path.display()),
                });
            }
        }
        Ok(())
    }

    /// The base offset of the segment that holds `offset` (a point the log can always
    /// be cut at, whatever the segment's batches hold).
    pub fn segment_base(&self, offset: u64) -> u64 {
        self.segments[self.segment_of(offset)].base_offset
    }

    /// The offset the next appended record gets.
    pub fn next_offset(&self) -> u64 {
        self.next_offset
    }

    /// Every offset below this is on disk (fsynced).
    pub fn durable_offset(&self) -> u64 {
        self.durable_offset
    }

    /// Bytes of batches stored.
    pub fn size_bytes(&self) -> u64 {
        self.segments.iter().map(|s| s.size_bytes).sum()
    }

    /// Number of log segments.
    pub fn segment_count(&self) -> usize {
        self.segments.len()
    }

    /// What opening the log found.
    pub fn recovery(&self) -> &RecoveryReport {
        &self.recovery
    }

    /// Why the log refuses writes, after a failed write or sync (until it is reopened).
    pub fn poisoned(&self) -> Option<&str> {
        self.poisoned.as_deref()
    }

    /// Files this log holds open now (at most two: the active segment and one reader).
    pub fn open_files(&self) -> usize {
        usize::from(self.active_file.is_some()) + usize::from(self.reader.is_some())
    }

    /// Appends a batch: assigns it the next offsets (and the log's tag as its leader
    /// epoch: a log stores nothing else there, so damage to the field, which the CRC
    /// leaves out, shows, and so does another partition's batch) and writes it to the
    /// page cache.
    /// Rolls to a new segment first when the active one is full or old. The batch is
    /// durable only once [`durable_offset`](Self::durable_offset) passes it (see
    /// [`append_blocking`](Self::append_blocking) for a call that waits).
    ///
    /// # Errors
    /// [`LogError::BatchTooLarge`], [`LogError::Poisoned`], or an IO error; after a
    /// failed write the log is as it was before the call.
    pub fn append(&mut self, mut batch: ValidatedBatch, now_ms: u64) -> Result<Appended, LogError> {
        let header = *batch.header();
        let tag = self.tag;
        self.append_with(
            batch.len(),
            &header,
            now_ms,
            |file, path, base, position| {
                batch.set_base_offset(base as i64);
                batch.set_partition_leader_epoch(tag);
                crate::disk::write_at(file, path, batch.as_bytes(), position)
            },
        )
    }

    /// Appends a batch held elsewhere (shared, so not owned or copied): `bytes` must be
    /// one whole batch already validated (a replicated prepare's body, whose producer's
    /// batch was validated by the primary and whose checksum held on arrival). Its base
    /// offset is written as this log assigns it and its leader epoch as the log's tag,
    /// the rest as is.
    ///
    /// # Errors
    /// [`LogError::Corrupt`] if `bytes` is not one batch's frame, and as
    /// [`append`](Self::append).
    pub fn append_shared(&mut self, bytes: &[u8], now_ms: u64) -> Result<Appended, LogError> {
        let not_a_batch = |err: braid_proto::BatchError| LogError::Corrupt {
            path: self.dir.to_path_buf(),
            position: self.next_offset,
            corruption: crate::Corruption::Batch(err),
        };
        let header = braid_proto::BatchHeader::decode(bytes).map_err(not_a_batch)?;
        let total = header.total_bytes();
        if total < bytes.len() {
            return Err(not_a_batch(braid_proto::BatchError::TrailingBytes {
                extra: bytes.len() - total,
            }));
        }
        if total > bytes.len() {
            return Err(not_a_batch(braid_proto::BatchError::Truncated {
                at: bytes.len(),
                needed: total,
                available: bytes.len(),
            }));
        }
        let head_len = braid_proto::batch::HEADER_BYTES;
        let tag = self.tag;
        self.append_with(
            bytes.len(),
            &header,
            now_ms,
            |file, path, base, position| {
                let mut head = [0u8; braid_proto::batch::HEADER_BYTES];
                head.copy_from_slice(&bytes[..head_len]);
                braid_proto::batch::set_base_offset(&mut head, base as i64);
                braid_proto::batch::set_partition_leader_epoch(&mut head, tag);
                crate::disk::write_at(file, path, &head, position)?;
                crate::disk::write_at(file, path, &bytes[head_len..], position + head_len as u64)
            },
        )
    }

    /// Appends a batch of `bytes` bytes described by `header`, which `write` writes at
    /// its position with the base offset it is given.
    fn append_with(
        &mut self,
        bytes: usize,
        header: &braid_proto::BatchHeader,
        now_ms: u64,
        write: impl FnOnce(&File, &Path, u64, u64) -> std::io::Result<()>,
    ) -> Result<Appended, LogError> {
        self.check_writable()?;
        if bytes > self.config.segment_bytes_max as usize {
            return Err(LogError::BatchTooLarge {
                bytes,
                segment_bytes_max: self.config.segment_bytes_max,
            });
        }
        let count = u64::from(header.record_count.max(0) as u32);
        self.remove_clean_marker()?;
        if self.should_roll(bytes as u64, count, now_ms) {
            self.roll(now_ms)?;
        }
        let active = self.segments.len() - 1;
        self.ensure_index(active)?;
        let file = self.file_for(active)?;
        let base_offset = self.next_offset;
        let segment = &mut self.segments[active];
        let position = segment.size_bytes;
        let path = log_path(&self.dir, segment.base_offset);
        if let Err(err) = write(&file, &path, base_offset, position) {
            // Leave no partial batch behind; if even that fails, stop writing.
            if let Err(cut) = crate::disk::set_len(&file, &path, position) {
                self.poisoned = Some(format!("could not undo a failed write: {cut}"));
            }
            return Err(LogError::io("write", path)(err));
        }
        let index = segment.index.get_or_insert_with(Default::default);
        index_batch(
            index,
            &mut segment.max_timestamp,
            segment.base_offset,
            base_offset,
            position,
            header.max_timestamp,
            self.config.index_interval_bytes,
        );
        let pending = index.offsets.len() - index.offsets_in_file;
        segment.size_bytes += bytes as u64;
        self.next_offset += count;
        segment.end_offset = Some(self.next_offset);
        if segment.size_bytes == bytes as u64 {
            segment.created_ms = now_ms;
        }
        let actions = self.write_behind.after_append(
            segment.base_offset,
            segment.size_bytes,
            self.config.write_behind_bytes,
            self.config.cached_tail_bytes,
        );
        // Both are advice to the kernel: failing loses nothing (fsync alone decides
        // durability), so they are not errors of the append.
        if let Some(range) = actions.write_back {
            let _ = crate::writeback::start(&file, range.start, range.end - range.start);
        }
        if let Some(range) = actions.drop {
            let _ = crate::writeback::drop_cached(&file, range.start, range.end - range.start);
        }
        let flushed = if pending >= INDEX_FLUSH_ENTRIES {
            flush_index(&self.dir, segment, false)
        } else {
            Ok(())
        };
        self.unsynced_since_ms.get_or_insert(now_ms);
        // The batch is in the log and will be read: the append succeeded. A failed
        // index write poisons the log instead (the index is rebuilt on reopen).
        if let Err(err) = flushed {
            self.poisoned
                .get_or_insert_with(|| format!("index write failed: {err}"));
        }
        Ok(Appended {
            base_offset,
            last_offset: self.next_offset - 1,
            bytes: bytes as u32,
        })
    }

    /// Appends and, under `fsync = always`, syncs before returning: the blocking form
    /// for callers without a [`crate::Syncer`]. It gets no group commit.
    ///
    /// # Errors
    /// As [`append`](Self::append) and [`sync`](Self::sync).
    pub fn append_blocking(
        &mut self,
        batch: ValidatedBatch,
        now_ms: u64,
    ) -> Result<Appended, LogError> {
        let appended = self.append(batch, now_ms)?;
        if self.config.fsync == FsyncPolicy::Always {
            self.sync()?;
        }
        Ok(appended)
    }

    fn should_roll(&self, bytes: u64, count: u64, now_ms: u64) -> bool {
        let Some(active) = self.segments.last() else {
            return true;
        };
        if active.size_bytes == 0 {
            return false;
        }
        let full = active.size_bytes + bytes > u64::from(self.config.segment_bytes_max);
        let old = self
            .config
            .segment_age_ms_max
            .is_some_and(|max| now_ms.saturating_sub(active.created_ms) >= max);
        // Index entries hold offsets relative to the segment base in 32 bits.
        let span = self.next_offset + count - 1 - active.base_offset > u64::from(u32::MAX);
        full || old || span
    }

    /// Seals the active segment (indexes completed and synced, data synced) and starts
    /// a new one at the next offset. Does nothing while the active segment is empty.
    ///
    /// # Errors
    /// IO errors; the log stays usable with the old active segment.
    pub fn roll(&mut self, now_ms: u64) -> Result<(), LogError> {
        self.check_writable()?;
        let active = self.segments.len() - 1;
        if self.segments[active].size_bytes == 0 {
            return Ok(());
        }
        self.remove_clean_marker()?;
        self.ensure_index(active)?;
        let file = self.file_for(active)?;
        let segment = &mut self.segments[active];
        if let (
            Some(index),
            MaxTimestamp::At {
                timestamp,
                relative_offset,
            },
        ) = (segment.index.as_mut(), segment.max_timestamp)
        {
            index.seal(timestamp, relative_offset);
        }
        let old_path = log_path(&self.dir, segment.base_offset);
        let base = self.next_offset;
        let path = log_path(&self.dir, base);
        let dir = self.dir.clone();
        let sealed = flush_index(&dir, segment, true)
            .and_then(|()| {
                crate::disk::sync_data(&file, &old_path).map_err(LogError::io("fsync", &old_path))
            })
            .and_then(|()| crate::disk::create_new(&path).map_err(LogError::io("create", &path)))
            .and_then(|new_file| sync_dir(&dir).map(|()| new_file));
        // A failed sync may have dropped the pages it could not write, and a second
        // sync would report success: nothing more is written until a reopen.
        let new_file = self.poisoning("sealing a segment", sealed)?;
        self.durable_offset = self.durable_offset.max(base);
        let _ = self.raise_recovery_point(RecoveryPoint {
            segment_base: base,
            position: 0,
        });
        self.unsynced_since_ms = None;
        // The old active segment's index now counts as a cached sealed one.
        self.sealed_indexes
            .push_back(self.segments[active].base_offset);
        self.trim_sealed_indexes();
        self.segments.push(Segment::new_empty(base, now_ms));
        self.active_file = Some(Arc::new(new_file));
        Ok(())
    }

    /// Reads whole batches from the one holding `from`, up to `max_bytes` (at least one
    /// batch, even a larger one) and from one log segment; reads stop before `end_offset`
    /// (the commit point, for a log that holds uncommitted entries). Reading at or past
    /// the end returns an empty result.
    ///
    /// # Errors
    /// [`LogError::OffsetOutOfRange`] below the start or above the next offset;
    /// [`LogError::Corrupt`] if a stored batch header is damaged; IO errors.
    pub fn read(
        &mut self,
        from: u64,
        max_bytes: u32,
        end_offset: u64,
    ) -> Result<LogRead, LogError> {
        self.read_reusing(from, max_bytes, end_offset, Vec::new())
    }

    /// As [`read`](Self::read), reading into `buffer` (from an earlier
    /// [`LogRead::into_buffer`]) instead of a new allocation.
    ///
    /// # Errors
    /// As [`read`](Self::read).
    pub fn read_reusing(
        &mut self,
        from: u64,
        max_bytes: u32,
        end_offset: u64,
        mut buffer: Vec<u8>,
    ) -> Result<LogRead, LogError> {
        self.check_range(from)?;
        let limit = end_offset.min(self.next_offset);
        if from >= limit {
            return Ok(LogRead::empty_with(from, buffer));
        }
        let mut at = self.segment_of(from);
        while at < self.segments.len() {
            self.ensure_index(at)?;
            let interval = self.config.index_interval_bytes;
            let mut spare = Some(buffer);
            let tag = self.tag;
            let read = self.with_sound_index(at, |log, file| {
                let buffer = spare.take().unwrap_or_default();
                read_batches(
                    &log.dir,
                    &log.segments[at],
                    file,
                    from,
                    u64::from(max_bytes),
                    limit,
                    interval,
                    buffer,
                )
                .map(|read| read.tagged(tag))
            })?;
            if !read.is_empty() {
                return Ok(read);
            }
            buffer = read.into_buffer();
            // The next segment must start where this one ends: a read never skips
            // offsets whose segment is gone.
            if let Some(next) = self.segments.get(at + 1) {
                let end = self.segments[at].end_offset.unwrap_or(next.base_offset);
                if end != next.base_offset {
                    return Err(self.missing_segment(end, next.base_offset));
                }
            }
            at += 1;
        }
        Ok(LogRead::empty_with(from, buffer))
    }

    /// The first offset whose record timestamp is at or after `timestamp_ms`, or `None`
    /// when every record is older.
    ///
    /// # Errors
    /// As [`read`](Self::read).
    pub fn offset_for_timestamp(&mut self, timestamp_ms: i64) -> Result<Option<u64>, LogError> {
        for at in 0..self.segments.len() {
            self.ensure_index(at)?;
            let found = match self.offset_in_segment(at, timestamp_ms, true)? {
                TimeLookup::IndexFault => {
                    // Rebuilt from the batches themselves: nothing left to check.
                    let file = self.file_for(at)?;
                    self.rebuild_index(at, &file)?;
                    self.offset_in_segment(at, timestamp_ms, false)?
                }
                found => found,
            };
            if let TimeLookup::Found(offset) = found {
                return Ok(Some(offset));
            }
        }
        Ok(None)
    }

    /// The first offset of segment `at` (its index loaded) whose record timestamp is at
    /// or after `timestamp_ms`. With `check`, the time entry it starts from is checked
    /// against the batch it names, since index files carry no checksum.
    fn offset_in_segment(
        &mut self,
        at: usize,
        timestamp_ms: i64,
        check: bool,
    ) -> Result<TimeLookup, LogError> {
        match self.segments[at].max_timestamp {
            MaxTimestamp::At { timestamp, .. } if timestamp >= timestamp_ms => {}
            _ => return Ok(TimeLookup::NotHere),
        }
        let segment = &self.segments[at];
        let Some(index) = segment.index.as_ref() else {
            return Ok(TimeLookup::NotHere);
        };
        let below = index.last_below(timestamp_ms);
        let mut offset = match below {
            Some(entry) => segment.base_offset + u64::from(entry.relative_offset),
            None => segment.base_offset,
        };
        let end = segment.end_offset.unwrap_or(self.next_offset);
        let mut first = check;
        while offset < end {
            let read = self.read(offset, 0, end)?;
            if read.is_empty() {
                break;
            }
            let corrupt = |e: braid_proto::BatchError| LogError::Corrupt {
                path: log_path(&self.dir, self.segments[at].base_offset),
                position: 0,
                corruption: e.into(),
            };
            let (batch, _) =
                braid_proto::RecordBatch::check_stored(read.bytes(), self.tag).map_err(corrupt)?;
            let header = *batch.header();
            if let (true, Some(entry)) = (first, below) {
                if header.base_offset as u64 != offset || header.max_timestamp != entry.timestamp {
                    return Ok(TimeLookup::IndexFault);
                }
            }
            first = false;
            if header.max_timestamp >= timestamp_ms {
                for (i, record) in batch.records().enumerate() {
                    let record = record.map_err(corrupt)?;
                    let at_ms = header.base_timestamp.saturating_add(record.timestamp_delta);
                    if at_ms >= timestamp_ms {
                        return Ok(TimeLookup::Found(header.base_offset as u64 + i as u64));
                    }
                }
            }
            if read.next_offset <= offset {
                break;
            }
            offset = read.next_offset;
        }
        Ok(TimeLookup::NotHere)
    }

    /// A request that makes every append so far durable, or `None` if they already are.
    ///
    /// # Errors
    /// [`LogError::Poisoned`] after a failure; the active segment's file could not be
    /// opened.
    pub fn sync_request(&mut self) -> Result<Option<SyncRequest>, LogError> {
        // After a failed sync a second one may succeed for pages the kernel dropped:
        // a poisoned log asks for none.
        self.check_writable()?;
        if self.durable_offset >= self.next_offset {
            return Ok(None);
        }
        let active = self.segments.len() - 1;
        let file = self.file_for(active)?;
        let segment = &self.segments[active];
        Ok(Some(SyncRequest {
            file,
            path: Arc::from(log_path(&self.dir, segment.base_offset).as_path()),
            next_offset: self.next_offset,
            generation: self.generation,
            segment_base: segment.base_offset,
            position: segment.size_bytes,
        }))
    }

    /// Takes the result of a [`SyncRequest`] of this log. A failure poisons the log;
    /// a success moves `durable_offset` only if the log is not poisoned (a sync that
    /// follows a failed one proves nothing) and no truncation came between.
    pub fn on_synced(&mut self, request: &SyncRequest, result: Result<(), SyncError>) {
        match result {
            Err(err) => {
                self.poisoned.get_or_insert(err.to_string());
            }
            Ok(()) if request.generation == self.generation && self.poisoned.is_none() => {
                self.durable_offset = self.durable_offset.max(request.next_offset);
                if self.durable_offset >= self.next_offset {
                    self.unsynced_since_ms = None;
                }
                // Advice for the next recovery: failing to store it only makes that
                // recovery stricter, so it is not an error of the sync.
                let _ = self.raise_recovery_point(RecoveryPoint {
                    segment_base: request.segment_base,
                    position: request.position,
                });
            }
            Ok(()) => {}
        }
    }

    /// Syncs on the calling thread.
    ///
    /// # Errors
    /// A failed `fdatasync` (which also poisons the log).
    pub fn sync(&mut self) -> Result<(), LogError> {
        if let Some(request) = self.sync_request()? {
            let result = request.run();
            self.on_synced(&request, result.clone());
            result.map_err(|e| LogError::Poisoned {
                reason: e.to_string(),
            })?;
        }
        Ok(())
    }

    /// Whether the fsync policy wants a sync now: under `always` whenever appends are
    /// not durable, under `interval` once the oldest of them is that old, under `never`
    /// not at all.
    pub fn sync_due(&self, now_ms: u64) -> bool {
        let Some(since) = self.unsynced_since_ms else {
            return false;
        };
        match self.config.fsync {
            FsyncPolicy::Always => true,
            FsyncPolicy::Interval { interval_ms } => now_ms.saturating_sub(since) >= interval_ms,
            FsyncPolicy::Never => false,
        }
    }

    /// Closes open files and drops the cached indexes, keeping only what an idle log
    /// needs (a few dozen bytes per segment). The next operation reopens what it uses.
    ///
    /// # Errors
    /// Writing pending index entries failed.
    pub fn release_files(&mut self) -> Result<(), LogError> {
        for at in 0..self.segments.len() {
            let flushed = flush_index(&self.dir, &mut self.segments[at], false);
            self.poisoning("writing an index", flushed)?;
            let segment = &mut self.segments[at];
            segment.index = None;
            // The running largest timestamp is recomputed when the index is reloaded.
            if segment.max_timestamp != MaxTimestamp::Empty {
                segment.max_timestamp = MaxTimestamp::Unknown;
            }
        }
        self.sealed_indexes.clear();
        self.active_file = None;
        self.reader = None;
        Ok(())
    }

    /// Which segment files the log has (a CRC32C of their base offsets): what
    /// [`reopen_closed`](Self::reopen_closed) checks besides the offsets, since a
    /// segment file gone from the middle changes neither.
    pub fn segments_crc(&self) -> u32 {
        open::bases_crc(self.segments.iter().map(|s| s.base_offset))
    }

    /// Flushes and syncs everything, then marks the log cleanly closed so the next open
    /// need not verify the newest segment.
    ///
    /// # Errors
    /// Any IO error; the log is then left without the marker, as after a crash.
    pub fn close(mut self) -> Result<(), LogError> {
        if self.clean_marker {
            // Nothing was written since the marker was found or made (it goes before
            // the first write): the files are as the marker vouches for.
            return Ok(());
        }
        self.check_writable()?;
        let active = self.segments.len() - 1;
        self.ensure_index(active)?;
        let file = self.file_for(active)?;
        flush_index(&self.dir, &mut self.segments[active], true)?;
        let path = log_path(&self.dir, self.segments[active].base_offset);
        crate::disk::sync_data(&file, &path).map_err(LogError::io("fsync", &path))?;
        let end = RecoveryPoint {
            segment_base: self.segments[active].base_offset,
            position: self.segments[active].size_bytes,
        };
        self.raise_recovery_point(end).map_err(LogError::io(
            "write",
            self.dir.join(crate::recovery_point::RECOVERY_POINT_FILE),
        ))?;
        // Only once everything is synced: a marker the next open trusts.
        let marker = self.dir.join(CLEAN_MARKER);
        crate::disk::write_file(&marker, &[])
            .and_then(|()| crate::disk::open(OpenOptions::new().read(true), &marker))
            .and_then(|f| crate::disk::sync_data(&f, &marker))
            .map_err(LogError::io("create", &marker))?;
        sync_dir(&self.dir)
    }

    /// Approximate heap bytes this log holds, for capacity planning.
    pub fn heap_bytes(&self) -> usize {
        self.dir.as_os_str().len()
            + self.segments.capacity() * std::mem::size_of::<Segment>()
            + self
                .segments
                .iter()
                .filter_map(|s| s.index.as_ref())
                .map(|i| i.heap_bytes())
                .sum::<usize>()
    }

    /// Moves the recovery point up to `point` (never down) and stores it.
    fn raise_recovery_point(&mut self, point: RecoveryPoint) -> std::io::Result<()> {
        let key = |p: &RecoveryPoint| (p.segment_base, p.position);
        if key(&point) <= key(&self.recovery_point) {
            return Ok(());
        }
        self.recovery_point = point;
        point.store(&self.dir, self.tag, false)
    }

    /// Passes `result` through, poisoning the log if it is an error: after a failed
    /// step that changed the disk, what reached it is unknown, and a retried sync may
    /// report a success it has not earned. Reads go on; writes wait for a reopen.
    ///
    /// An open refused a descriptor (EMFILE, ENFILE) poisons nothing: no sync ran, so
    /// none can have dropped what it failed to write, and the step is tried again once
    /// descriptors are free. (Poisoned, a node out of descriptors refused every write
    /// of the partitions whose index it could not reopen, until a restart: an outside
    /// review of issue 24.)
    fn poisoning<T>(&mut self, what: &str, result: Result<T, LogError>) -> Result<T, LogError> {
        match &result {
            Err(LogError::Io { source, .. }) if crate::disk::is_out_of_descriptors(source) => {}
            Err(err) => {
                self.poisoned
                    .get_or_insert_with(|| format!("{what}: {err}"));
            }
            Ok(_) => {}
        }
        result
    }

    fn check_writable(&self) -> Result<(), LogError> {
        match &self.poisoned {
            Some(reason) => Err(LogError::Poisoned {
                reason: reason.clone(),
            }),
            None => Ok(()),
        }
    }

    fn check_range(&self, offset: u64) -> Result<(), LogError> {
        if offset < self.start_offset() || offset > self.next_offset {
            return Err(self.out_of_range(offset));
        }
        Ok(())
    }

    fn out_of_range(&self, offset: u64) -> LogError {
        LogError::OffsetOutOfRange {
            offset,
            start: self.start_offset(),
            next: self.next_offset,
        }
    }

    /// Index of the segment that holds `offset` (the last with base at or below it).
    /// The error of a segment missing between offsets `from` and `to`.
    pub(crate) fn missing_segment(&self, from: u64, to: u64) -> LogError {
        LogError::Corrupt {
            path: log_path(&self.dir, from),
            position: 0,
            corruption: crate::Corruption::MissingSegment { from, to },
        }
    }

    fn segment_of(&self, offset: u64) -> usize {
        self.segments
            .partition_point(|s| s.base_offset <= offset)
            .saturating_sub(1)
    }

    fn remove_clean_marker(&mut self) -> Result<(), LogError> {
        if self.clean_marker {
            let marker = self.dir.join(CLEAN_MARKER);
            // Until its removal is durable, a crash could make the next open trust a
            // tail it must verify: no write goes ahead without it.
            let removed = match crate::disk::remove(&marker) {
                Ok(()) => Ok(()),
                Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(()),
                Err(err) => Err(LogError::io("remove", &marker)(err)),
            }
            .and_then(|()| sync_dir(&self.dir));
            self.poisoning("removing the clean-shutdown marker", removed)?;
            self.clean_marker = false;
        }
        Ok(())
    }

    /// The open file of segment `at`, opening it if needed (closing the previous
    /// reader for a sealed segment).
    fn file_for(&mut self, at: usize) -> Result<Arc<File>, LogError> {
        let base = self.segments[at].base_offset;
        let active = at + 1 == self.segments.len();
        if active {
            if let Some(file) = &self.active_file {
                return Ok(Arc::clone(file));
            }
        } else if let Some((reader_base, file)) = &self.reader {
            if *reader_base == base {
                return Ok(Arc::clone(file));
            }
        }
        let path = log_path(&self.dir, base);
        let file = crate::disk::open(OpenOptions::new().read(true).write(active), &path)
            .map_err(LogError::io("open", &path))?;
        let file = Arc::new(file);
        if active {
            self.active_file = Some(Arc::clone(&file));
        } else {
            self.reader = Some((base, Arc::clone(&file)));
        }
        Ok(file)
    }

    fn forget_files_of(&mut self, base: u64) {
        if self.reader.as_ref().is_some_and(|(b, _)| *b == base) {
            self.reader = None;
        }
        if self.segments.last().is_none_or(|s| s.base_offset < base) {
            self.active_file = None;
        }
        self.sealed_indexes.retain(|b| *b != base);
    }
}

fn delete_segment_files(dir: &Path, base: u64) -> Result<(), LogError> {
    // The .log file goes first: index files without it are removed on open.
    for path in [
        log_path(dir, base),
        index_path(dir, base),
        time_index_path(dir, base),
    ] {
        match crate::disk::remove(&path) {
            Ok(()) => {}
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
            Err(err) => return Err(LogError::io("remove", &path)(err)),
        }
    }
    Ok(())
}

/// Makes creations, renames and removals in `dir` durable.
pub(crate) fn sync_dir(dir: &Path) -> Result<(), LogError> {
    crate::dirs::sync_dir(dir).map_err(LogError::io("fsync", dir))
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod fault_tests;

#[cfg(test)]
mod crash_tests;
