//! Opening a log directory: finding the segments, and recovery of the newest one.

use std::path::{Path, PathBuf};

use super::{sync_dir, PartitionLog, RecoveryReport};
use crate::config::{LogConfig, RecoveryMode};
use crate::error::LogError;
use crate::files::{log_path, parse_name, FileKind, CLEAN_MARKER};
use crate::recovery_point::RecoveryPoint;
use crate::segment::{rewrite_index_files, IndexBuilder, Segment};
use crate::walk::{find_intact_batch, Step, Walk};

impl PartitionLog {
    /// Opens the log in `dir`, creating the directory and a first segment if needed.
    ///
    /// After a clean [`close`](Self::close) the newest segment is trusted and only its
    /// tail after the last index entry is walked. Otherwise every batch of the newest
    /// segment is verified (CRC and offset continuity): a torn tail (damage that no
    /// intact batch follows) is cut off, and its indexes are rebuilt. Older segments were
    /// synced when they were sealed; their indexes are checked and, if damaged, rebuilt
    /// when first used. `now_ms` is the wall-clock time, used for segment ages.
    ///
    /// # Errors
    /// [`LogError::Config`]; [`LogError::Corrupt`] naming the file and byte position of
    /// damage that is not a torn tail (under [`RecoveryMode::Strict`]); IO errors.
    pub fn open(dir: impl Into<PathBuf>, config: LogConfig, now_ms: u64) -> Result<Self, LogError> {
        Self::open_tagged(dir, 0, config, now_ms)
    }

    /// As [`open`](Self::open), for the log of a partition tagged `tag` (`config` may be
    /// shared: thousands of a topic's partitions hold one)
    /// ([`braid_proto::batch::partition_tag`]): its stored batches carry the tag in their
    /// leader epoch field and its recovery point is seeded with it, so that bytes of
    /// another partition's log (a misdirected write: same offsets, CRCs that hold) are
    /// damage here, not records. [`open`](Self::open) is the log tagged 0.
    ///
    /// # Errors
    /// As [`open`](Self::open).
    pub fn open_tagged(
        dir: impl Into<PathBuf>,
        tag: i32,
        config: impl Into<std::sync::Arc<LogConfig>>,
        now_ms: u64,
    ) -> Result<Self, LogError> {
        let config = config.into();
        config.validate()?;
        let dir = dir.into();
        let read_only = config.recovery == RecoveryMode::ReadToDamage;
        if !read_only {
            // The partition directory and any parent it needed survive a power cut.
            crate::dirs::create_dir_durable(&dir).map_err(LogError::io("create", &dir))?;
        }
        let (mut bases, clean) = scan_dir(&dir)?;
        let stored = crate::log_start::load(&dir, tag).map_err(LogError::io(
            "read",
            dir.join(crate::log_start::LOG_START_FILE),
        ))?;
        // Segments gone from the start (all of them, or the first ones) are damage:
        // refused under `Strict`, the log started again there (empty, for peers to
        // fill) under `TruncateAtDamage`. Never an empty log at 0 or a later start
        // taken for retention.
        let first = bases.first().copied();
        let lost_from = match stored {
            crate::log_start::Stored::Start(start) if first.is_none_or(|f| start < f) => {
                Some(start)
            }
            _ => None,
        };
        if let Some(start) = lost_from {
            let to = first.unwrap_or(start);
            if config.recovery != RecoveryMode::TruncateAtDamage {
                return Err(LogError::Corrupt {
                    path: log_path(&dir, start),
                    position: 0,
                    corruption: crate::Corruption::MissingSegment { from: start, to },
                });
            }
            tracing::warn!(
                dir = %dir.display(),
                from = start,
                to,
                "the log's first segments are gone: it starts again empty at its start"
            );
            for base in std::mem::take(&mut bases) {
                super::delete_segment_files(&dir, base).and_then(|()| sync_dir(&dir))?;
            }
        }
        if bases.is_empty() && read_only {
            return Err(LogError::io("open", &dir)(std::io::Error::new(
                std::io::ErrorKind::NotFound,
                "the log has no segment to read",
            )));
        }
        if bases.is_empty() {
            let start = lost_from.unwrap_or(0);
            let path = log_path(&dir, start);
            crate::disk::create_new(&path).map_err(LogError::io("create", &path))?;
            sync_dir(&dir)?;
            bases.push(start);
        }
        if stored != crate::log_start::Stored::Start(bases[0]) && !read_only {
            // A log from before the file was kept, or a retention cut short by a crash
            // after it stored the start above the segment it was deleting.
            crate::log_start::store(&dir, bases[0], tag).map_err(LogError::io(
                "write",
                dir.join(crate::log_start::LOG_START_FILE),
            ))?;
        }
        let segments = segments_of(&dir, bases, now_ms)?;
        let mut log = Self::found(std::sync::Arc::from(dir), config, tag, segments, clean);
        let active = log.segments.len() - 1;
        let trusted = clean && log.ensure_index(active).is_ok();
        if !trusted {
            log.recovery.clean = false;
            log.recover_newest()?;
        }
        let newest = &log.segments[active];
        log.next_offset = newest.end_offset.unwrap_or(newest.base_offset);
        // A clean close synced everything, and recovery syncs what it kept.
        log.durable_offset = log.next_offset;
        let end = RecoveryPoint {
            segment_base: newest.base_offset,
            position: newest.size_bytes,
        };
        if read_only {
            log.poisoned = Some("opened to read up to its first damage".to_owned());
        } else if RecoveryPoint::load(&log.dir, log.tag) != Some(end) {
            end.store(&log.dir, log.tag, false).map_err(LogError::io(
                "write",
                log.dir.join(crate::recovery_point::RECOVERY_POINT_FILE),
            ))?;
        }
        log.recovery_point = end;
        if lost_from.is_some() {
            log.recovery.damage_cut_at = lost_from;
        }
        log.check_segments_continue()?;
        Ok(log)
    }

    /// Checks that each sealed segment ends where the next one starts. A segment file
    /// gone from the middle (deleted, or its directory entry lost) would otherwise
    /// leave a log that skips from one segment's end to a later start, serving the
    /// later records as if the missing ones never were. Under
    /// [`RecoveryMode::Strict`] that is refused; under `TruncateAtDamage` (a replica
    /// whose peers hold the records) the log is cut at the gap, as damage.
    fn check_segments_continue(&mut self) -> Result<(), LogError> {
        for at in 0..self.segments.len() - 1 {
            // Loading a sealed index checks where the segment ends (other damage in
            // it is found when it is read, as before).
            let _ = self.ensure_index(at);
            let next = self.segments[at + 1].base_offset;
            let Some(end) = self.segments[at].end_offset.filter(|end| *end != next) else {
                continue;
            };
            let gap = self.missing_segment(end, next);
            if self.config.recovery == RecoveryMode::Strict {
                return Err(gap);
            }
            if self.config.recovery == RecoveryMode::ReadToDamage {
                // The log ends at the gap, in memory: the segments after it stay (a
                // read never goes past the end).
                tracing::warn!(%gap, "the log is read up to where its segments stop following each other");
                self.next_offset = end;
                self.durable_offset = end;
                self.recovery.damage_cut_at = Some(end);
                break;
            }
            tracing::warn!(%gap, "cutting the log where its segments stop following each other");
            self.truncate(end)?;
            self.recovery.damage_cut_at = Some(end);
            break;
        }
        Ok(())
    }

    /// Opens again, changing nothing, a log that [`close`](Self::close) closed in this
    /// process, which must start at `start` and end at `next` as it did then: for a
    /// holder that let an idle log go to save its memory and takes it back. Whatever
    /// differs (the clean-shutdown marker gone, a segment or its index missing or
    /// damaged, other offsets) is refused with [`LogError::NotAsClosed`], never
    /// repaired: the holder's restart runs the full [`open`](Self::open) instead.
    ///
    /// # Errors
    /// [`LogError::NotAsClosed`], or IO errors.
    pub fn reopen_closed(
        dir: std::sync::Arc<Path>,
        tag: i32,
        config: std::sync::Arc<LogConfig>,
        now_ms: u64,
        (start, next): (u64, u64),
        segments: u32,
    ) -> Result<Self, LogError> {
        let changed = |reason: String| LogError::NotAsClosed {
            path: dir.to_path_buf(),
            reason,
        };
        let (bases, clean) = scan_dir(&dir)?;
        if !clean {
            return Err(changed("its clean-shutdown marker is gone".into()));
        }
        if bases.is_empty() {
            return Err(changed("it has no segment".into()));
        }
        if bases_crc(bases.iter().copied()) != segments {
            // A segment gone from the middle changes neither end: found here, or the
            // log would read on from the segment before it as if the gap held its
            // records, and a repair could never fill it (the shell simulator's seed
            // 328385 with damage to sleeping files).
            return Err(changed(format!(
                "its segment files are not those it was closed with ({} now)",
                bases.len()
            )));
        }
        let segments = segments_of(&dir, bases, now_ms)?;
        let mut log = Self::found(std::sync::Arc::clone(&dir), config, tag, segments, clean);
        let active = log.segments.len() - 1;
        log.ensure_index(active).map_err(|err| match err {
            // Refused a descriptor: nothing found changed, and the same open succeeds
            // later (taken for a change, it was reported as damage).
            LogError::Io { ref source, .. } if crate::disk::is_out_of_descriptors(source) => err,
            err => changed(format!("its newest segment's index: {err}")),
        })?;
        let newest = &log.segments[active];
        log.next_offset = newest.end_offset.unwrap_or(newest.base_offset);
        log.durable_offset = log.next_offset;
        log.recovery_point = RecoveryPoint {
            segment_base: newest.base_offset,
            position: newest.size_bytes,
        };
        if (log.start_offset(), log.next_offset) != (start, next) {
            return Err(changed(format!(
                "it holds [{}, {}) where it held [{start}, {next})",
                log.start_offset(),
                log.next_offset
            )));
        }
        Ok(log)
    }

    /// A log of `segments` found in `dir`, before its newest segment is checked.
    fn found(
        dir: std::sync::Arc<Path>,
        config: std::sync::Arc<LogConfig>,
        tag: i32,
        segments: Vec<Segment>,
        clean: bool,
    ) -> Self {
        Self {
            dir,
            config,
            tag,
            segments,
            active_file: None,
            reader: None,
            sealed_indexes: Default::default(),
            next_offset: 0,
            durable_offset: 0,
            unsynced_since_ms: None,
            write_behind: Default::default(),
            generation: 0,
            clean_marker: clean,
            poisoned: None,
            recovery: RecoveryReport {
                clean,
                ..RecoveryReport::default()
            },
            recovery_point: RecoveryPoint::default(),
        }
    }

    /// Verifies every batch of the newest segment, cuts a torn tail, rebuilds its
    /// indexes.
    fn recover_newest(&mut self) -> Result<(), LogError> {
        let active = self.segments.len() - 1;
        self.active_file = None;
        let file = self.file_for(active)?;
        let segment = &mut self.segments[active];
        let path = log_path(&self.dir, segment.base_offset);
        let mut builder = IndexBuilder::new(segment.base_offset, self.config.index_interval_bytes);
        let mut walk = Walk::new(&file, &path, 0, segment.size_bytes, Some(self.tag));
        let mut valid_end = 0;
        let damage = loop {
            match walk.next_step().map_err(LogError::io("read", &path))? {
                Step::End => break None,
                Step::Bad {
                    position,
                    corruption,
                } => break Some((position, corruption)),
                Step::Batch { position, header } => match builder.add(position, &header) {
                    Ok(()) => valid_end = position + header.total_bytes() as u64,
                    Err(corruption) => break Some((position, corruption)),
                },
            }
        };
        self.recovery.bytes_scanned = valid_end;
        if let Some((position, corruption)) = damage {
            // Bytes at or above the recovery point were never known synced: after a
            // power cut they may have reached the disk in any order, so damage there
            // is a torn tail whatever follows it. Bytes below it were synced, so damage
            // there is the disk's (a flipped bit, a lost or misdirected write) even
            // when nothing intact follows it: a cut would lose acknowledged records
            // unseen. Without a point (damaged, or another partition's) only an intact
            // batch after the damage tells.
            let synced = match RecoveryPoint::load(&self.dir, self.tag) {
                Some(point) if point.segment_base == segment.base_offset => {
                    Some(position < point.position)
                }
                Some(point) => Some(point.segment_base > segment.base_offset),
                None => None,
            };
            let intact_after = find_intact_batch(
                &file,
                &path,
                position + 1,
                segment.size_bytes,
                builder.next_offset,
                self.tag,
            )
            .map_err(LogError::io("read", &path))?;
            if self.config.recovery == RecoveryMode::ReadToDamage {
                // Read up to the damage; the file keeps everything.
                self.recovery.damage_cut_at = Some(position);
                segment.size_bytes = position;
                segment.end_offset = Some(builder.next_offset);
                segment.max_timestamp = builder.max_timestamp;
                segment.index = Some(builder.index);
                return Ok(());
            }
            if synced == Some(true) || (intact_after.is_some() && synced.is_none()) {
                if self.config.recovery == RecoveryMode::Strict {
                    return Err(LogError::Corrupt {
                        path,
                        position,
                        corruption,
                    });
                }
                self.recovery.damage_cut_at = Some(position);
            } else if intact_after.is_some() {
                self.recovery.unsynced_damage_cut_at = Some(position);
            }
            self.recovery.bytes_truncated = segment.size_bytes - position;
            crate::disk::set_len(&file, &path, position)
                .map_err(LogError::io("truncate", &path))?;
            segment.size_bytes = position;
        }
        // What survived a process crash may still be only in the page cache; sync it so
        // that `durable_offset` tells the truth from here on.
        crate::disk::sync_data(&file, &path).map_err(LogError::io("fsync", &path))?;
        segment.end_offset = Some(builder.next_offset);
        segment.max_timestamp = builder.max_timestamp;
        segment.index = Some(builder.index);
        rewrite_index_files(&self.dir, segment)?;
        self.recovery.indexes_rebuilt += 1;
        Ok(())
    }
}

/// The segments of `dir` with these base offsets, their indexes not loaded.
fn segments_of(dir: &Path, bases: Vec<u64>, now_ms: u64) -> Result<Vec<Segment>, LogError> {
    let mut segments = Vec::with_capacity(bases.len());
    for base in bases {
        let path = log_path(dir, base);
        let meta = std::fs::metadata(&path).map_err(LogError::io("stat", &path))?;
        let created_ms = meta
            .created()
            .or_else(|_| meta.modified())
            .ok()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map_or(now_ms, |d| d.as_millis() as u64);
        segments.push(Segment {
            base_offset: base,
            size_bytes: meta.len(),
            end_offset: None,
            max_timestamp: crate::segment::MaxTimestamp::Unknown,
            created_ms,
            index: None,
        });
    }
    Ok(segments)
}

/// Lists the segment base offsets of `dir` in order, removes leftovers (temporary
/// files, index files whose `.log` is gone), and reports the clean-shutdown marker.
/// A CRC32C of segments' base offsets, in order: which segment files a log has.
pub(super) fn bases_crc(bases: impl Iterator<Item = u64>) -> u32 {
    bases.fold(0, |crc, base| {
        crc32c::crc32c_append(crc, &base.to_be_bytes())
    })
}

fn scan_dir(dir: &Path) -> Result<(Vec<u64>, bool), LogError> {
    let mut logs = Vec::new();
    let mut indexes = Vec::new();
    let mut clean = false;
    let entries = crate::disk::read_dir(dir).map_err(LogError::io("list", dir))?;
    for entry in entries {
        let entry = entry.map_err(LogError::io("list", dir))?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else {
            continue;
        };
        if name == CLEAN_MARKER {
            clean = true;
            continue;
        }
        match parse_name(name) {
            Some((base, FileKind::Log)) => logs.push(base),
            Some((base, FileKind::Index | FileKind::TimeIndex)) => {
                indexes.push((base, entry.path()))
            }
            Some((_, FileKind::Temp)) => {
                let path = entry.path();
                crate::disk::remove(&path).map_err(LogError::io("remove", &path))?;
            }
            None => {}
        }
    }
    logs.sort_unstable();
    for (base, path) in indexes {
        if logs.binary_search(&base).is_err() {
            crate::disk::remove(&path).map_err(LogError::io("remove", &path))?;
        }
    }
    Ok((logs, clean))
}
