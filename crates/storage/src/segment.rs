//! One log segment: its place in the log, its size, and its indexes when loaded.
//!
//! The functions here take the segment's open file from the caller, which owns the
//! handles and bounds how many are open.

use std::fs::File;
use std::path::{Path, PathBuf};

use braid_proto::batch::BatchHeader;

use crate::error::{Corruption, LogError};
use crate::files::{index_path, log_path, time_index_path, TEMP_SUFFIX};
use crate::index::{decode_offsets, decode_times, encode_offsets, encode_times, SegmentIndex};
use crate::walk::{Step, Walk};

/// The largest timestamp of a segment and the batch that holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum MaxTimestamp {
    /// Not known until the indexes are loaded.
    Unknown,
    /// The segment holds no batch.
    Empty,
    /// The largest record timestamp, in the batch at `relative_offset`.
    At {
        timestamp: i64,
        relative_offset: u32,
    },
}

impl MaxTimestamp {
    fn include(&mut self, timestamp: i64, relative_offset: u32) {
        let grows = match *self {
            Self::At { timestamp: max, .. } => timestamp > max,
            Self::Unknown | Self::Empty => true,
        };
        if grows {
            *self = Self::At {
                timestamp,
                relative_offset,
            };
        }
    }
}

/// What the log keeps of one segment. An idle segment is a few dozen bytes: its
/// indexes are dropped and reloaded from their files when needed.
#[derive(Debug)]
pub(crate) struct Segment {
    pub(crate) base_offset: u64,
    /// Bytes of whole batches in the `.log` file.
    pub(crate) size_bytes: u64,
    /// Offset after the segment's last batch; `None` until the indexes are loaded.
    pub(crate) end_offset: Option<u64>,
    pub(crate) max_timestamp: MaxTimestamp,
    /// Wall-clock time of the segment's creation (ms), for rolling by age.
    pub(crate) created_ms: u64,
    pub(crate) index: Option<SegmentIndex>,
}

impl Segment {
    pub(crate) fn new_empty(base_offset: u64, created_ms: u64) -> Self {
        Self {
            base_offset,
            size_bytes: 0,
            end_offset: Some(base_offset),
            max_timestamp: MaxTimestamp::Empty,
            created_ms,
            index: Some(SegmentIndex::default()),
        }
    }

    /// Offset relative to the segment base. Callers keep offsets inside the segment,
    /// whose span the log bounds to `u32`.
    pub(crate) fn relative(&self, offset: u64) -> u32 {
        (offset - self.base_offset) as u32
    }

    fn corrupt(&self, dir: &Path, position: u64, corruption: Corruption) -> LogError {
        LogError::Corrupt {
            path: log_path(dir, self.base_offset),
            position,
            corruption,
        }
    }
}

/// The indexing rule for one batch, shared by appends and rebuilds so both write the
/// same entries: fold the batch's largest timestamp into the segment's running maximum,
/// then let the index decide whether the batch gets entries.
pub(crate) fn index_batch(
    index: &mut SegmentIndex,
    max_timestamp: &mut MaxTimestamp,
    segment_base: u64,
    batch_base: u64,
    position: u64,
    batch_max_timestamp: i64,
    interval_bytes: u32,
) {
    let relative_offset = (batch_base - segment_base) as u32;
    max_timestamp.include(batch_max_timestamp, relative_offset);
    if let MaxTimestamp::At {
        timestamp,
        relative_offset: max_at,
    } = *max_timestamp
    {
        index.note_batch(
            relative_offset,
            position as u32,
            interval_bytes,
            timestamp,
            max_at,
        );
    }
}

/// Indexing state carried through a walk, so a rebuild applies the same rule as the
/// appends did.
#[derive(Debug)]
pub(crate) struct IndexBuilder {
    pub(crate) index: SegmentIndex,
    pub(crate) max_timestamp: MaxTimestamp,
    pub(crate) next_offset: u64,
    base_offset: u64,
    interval_bytes: u32,
}

impl IndexBuilder {
    pub(crate) fn new(base_offset: u64, interval_bytes: u32) -> Self {
        Self {
            index: SegmentIndex::default(),
            max_timestamp: MaxTimestamp::Empty,
            next_offset: base_offset,
            base_offset,
            interval_bytes,
        }
    }

    /// Takes the next batch of the segment, which must continue the offsets.
    pub(crate) fn add(&mut self, position: u64, header: &BatchHeader) -> Result<(), Corruption> {
        if header.base_offset != self.next_offset as i64 {
            return Err(Corruption::UnexpectedOffset {
                expected: self.next_offset,
                found: header.base_offset,
            });
        }
        index_batch(
            &mut self.index,
            &mut self.max_timestamp,
            self.base_offset,
            self.next_offset,
            position,
            header.max_timestamp,
            self.interval_bytes,
        );
        self.next_offset = header.last_offset() as u64 + 1;
        Ok(())
    }
}

/// Whether [`load_index`] may start from the index files, or must rebuild them from the
/// `.log` file because an entry was found naming a batch the log does not hold there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum IndexFiles {
    Trust,
    Rebuild,
}

/// Loads a segment's indexes from their files and completes them by walking the batches
/// after the last offset entry. Damaged index files are rebuilt from the `.log` file;
/// damage in the `.log` file itself is an error. `sealed` adds the closing time entry.
///
/// Index files carry no checksum, so a sound-looking file may still hold a damaged
/// entry: the last offset entry and the batch holding the segment's largest timestamp
/// are checked here, and every other offset entry when a read starts from it (a
/// mismatch there is [`Corruption::IndexEntry`], and the caller rebuilds).
pub(crate) fn load_index(
    dir: &Path,
    segment: &mut Segment,
    file: &File,
    interval_bytes: u32,
    sealed: bool,
    files: IndexFiles,
) -> Result<bool, LogError> {
    let base = segment.base_offset;
    let (offsets, times) = match files {
        IndexFiles::Trust => (
            read_optional(&index_path(dir, base))?,
            read_optional(&time_index_path(dir, base))?,
        ),
        IndexFiles::Rebuild => (Vec::new(), Vec::new()),
    };
    let (mut offset_entries, offsets_sound) = decode_offsets(&offsets, segment.size_bytes);
    let (mut time_entries, times_sound) = decode_times(&times, u64::from(u32::MAX) + 1);
    let mut sound = offsets_sound && times_sound && files == IndexFiles::Trust;
    if let Some(last) = offset_entries.last() {
        let mut raw = [0u8; braid_proto::batch::HEADER_BYTES];
        let points_at_batch = crate::disk::read_exact_at_named(
            file,
            || log_path(dir, base),
            &mut raw,
            u64::from(last.position),
        )
        .is_ok()
            && BatchHeader::decode(&raw)
                .is_ok_and(|h| h.base_offset == (base + u64::from(last.relative_offset)) as i64);
        sound &= points_at_batch;
    }
    if !sound {
        offset_entries.clear();
        time_entries.clear();
    }
    let mut builder = IndexBuilder::new(base, interval_bytes);
    let start = offset_entries.last().copied();
    let (mut position, resume) = match start {
        Some(entry) => (u64::from(entry.position), true),
        None => (0, false),
    };
    builder.index.offsets_in_file = if sound { offset_entries.len() } else { 0 };
    builder.index.times_in_file = if sound { time_entries.len() } else { 0 };
    if resume {
        // Resume the rule from the last indexed batch: the running largest timestamp
        // up to and including it is the last time entry.
        builder.max_timestamp = match time_entries.last() {
            Some(t) => MaxTimestamp::At {
                timestamp: t.timestamp,
                relative_offset: t.relative_offset,
            },
            None => MaxTimestamp::Empty,
        };
    }
    builder.index.offsets = offset_entries;
    builder.index.times = time_entries;
    let path = log_path(dir, base);
    let mut walk = Walk::new(file, &path, position, segment.size_bytes, None);
    let mut first = resume;
    let damaged_at = loop {
        let step = walk.next_step().map_err(LogError::io("read", &path))?;
        match step {
            Step::End => break None,
            Step::Bad {
                position,
                corruption,
            } => break Some((position, corruption)),
            Step::Batch {
                position: at,
                header,
            } => {
                position = at;
                if first {
                    // Already indexed: only move past it.
                    first = false;
                    builder.next_offset = header.last_offset() as u64 + 1;
                    if let MaxTimestamp::Empty = builder.max_timestamp {
                        builder.max_timestamp.include(
                            header.max_timestamp,
                            segment.relative(header.base_offset as u64),
                        );
                    }
                    continue;
                }
                if let Err(corruption) = builder.add(position, &header) {
                    break Some((position, corruption));
                }
            }
        }
    };
    if let Some((position, corruption)) = damaged_at {
        if !sealed {
            // The newest segment: its open walks and checks it, and cuts or refuses.
            return Err(segment.corrupt(dir, position, corruption));
        }
        // Damage in a sealed segment: the index holds the batches before it, which reads
        // serve; where the segment ends is unknown until a read finds the damaged batch
        // (naming its byte) and a repair mends it, and the index is loaded again then.
        // (Refused whole, a single node served nothing of a segment whose last batch
        // had one flipped bit in its length, and named a byte past the damage: an
        // outside review of issue 24.) Nothing is written: the index files stay as
        // they were.
        tracing::warn!(path = %path.display(), position, "a log segment is damaged from this byte: it is read up to it");
        segment.end_offset = None;
        segment.max_timestamp = MaxTimestamp::Unknown;
        segment.index = Some(builder.index);
        return Ok(false);
    }
    if sealed {
        if let MaxTimestamp::At {
            timestamp,
            relative_offset,
        } = builder.max_timestamp
        {
            builder.index.seal(timestamp, relative_offset);
        }
    }
    let rebuilt = !sound;
    segment.end_offset = Some(builder.next_offset);
    segment.max_timestamp = builder.max_timestamp;
    segment.index = Some(builder.index);
    if rebuilt {
        rewrite_index_files(dir, segment)?;
    } else if !holds_max_timestamp(dir, segment, file)? {
        // The time index names a largest timestamp no batch there holds: a damaged
        // entry, which would make lookups by time skip or misplace records.
        return load_index(
            dir,
            segment,
            file,
            interval_bytes,
            sealed,
            IndexFiles::Rebuild,
        );
    }
    Ok(rebuilt)
}

/// Whether the batch the segment's largest timestamp names starts where the index
/// says and holds that timestamp. A damaged offset entry on the way is a `false` too.
fn holds_max_timestamp(dir: &Path, segment: &Segment, file: &File) -> Result<bool, LogError> {
    let MaxTimestamp::At {
        timestamp,
        relative_offset,
    } = segment.max_timestamp
    else {
        return Ok(true);
    };
    let offset = segment.base_offset + u64::from(relative_offset);
    match find_batch(dir, segment, file, offset) {
        Ok(Some((_, header))) => {
            Ok(header.base_offset as u64 == offset && header.max_timestamp == timestamp)
        }
        Ok(None) => Ok(false),
        Err(LogError::Corrupt {
            corruption: Corruption::IndexEntry { .. },
            ..
        }) => Ok(false),
        // Damage in the batches on the way is the log's, found where it is read (or
        // cut by a repair, which must be able to load the index to cut): not a reason
        // to refuse the index (the shell simulator's seed 17408 with damage at rest).
        Err(LogError::Corrupt { .. }) => Ok(true),
        Err(err) => Err(err),
    }
}

/// The error for a read that started at an index entry and found no batch of the
/// entry's offset there: the index is wrong, not (yet known to be) the log.
fn index_entry_fault(dir: &Path, segment: &Segment, entry: crate::index::OffsetEntry) -> LogError {
    segment.corrupt(
        dir,
        u64::from(entry.position),
        Corruption::IndexEntry {
            relative_offset: entry.relative_offset,
            position: entry.position,
        },
    )
}

fn read_optional(path: &Path) -> Result<Vec<u8>, LogError> {
    match crate::disk::read(path) {
        Ok(bytes) => Ok(bytes),
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(err) => Err(LogError::io("read", path)(err)),
    }
}

/// Writes both index files whole, through a temporary file and a rename, so a crash
/// leaves either the old or the new file.
pub(crate) fn rewrite_index_files(dir: &Path, segment: &mut Segment) -> Result<(), LogError> {
    let Some(index) = segment.index.as_mut() else {
        return Ok(());
    };
    let mut bytes = Vec::new();
    encode_offsets(&index.offsets, &mut bytes);
    replace_file(&index_path(dir, segment.base_offset), &bytes)?;
    bytes.clear();
    encode_times(&index.times, &mut bytes);
    replace_file(&time_index_path(dir, segment.base_offset), &bytes)?;
    index.offsets_in_file = index.offsets.len();
    index.times_in_file = index.times.len();
    Ok(())
}

fn replace_file(path: &Path, bytes: &[u8]) -> Result<(), LogError> {
    let mut temp = path.as_os_str().to_owned();
    temp.push(".");
    temp.push(TEMP_SUFFIX);
    let temp = std::path::PathBuf::from(temp);
    crate::disk::write_file(&temp, bytes).map_err(LogError::io("write", &temp))?;
    crate::disk::rename(&temp, path).map_err(LogError::io("rename", path))?;
    // The rename is durable only once the directory is synced.
    if let Some(dir) = path.parent() {
        crate::disk::sync_dir(dir).map_err(LogError::io("fsync", dir))?;
    }
    Ok(())
}

/// Appends the index entries not yet in the files; with `sync`, makes both files
/// durable.
pub(crate) fn flush_index(dir: &Path, segment: &mut Segment, sync: bool) -> Result<(), LogError> {
    let Some(index) = segment.index.as_mut() else {
        return Ok(());
    };
    let mut bytes = Vec::new();
    encode_offsets(&index.offsets[index.offsets_in_file..], &mut bytes);
    append_file(&index_path(dir, segment.base_offset), &bytes, sync)?;
    index.offsets_in_file = index.offsets.len();
    bytes.clear();
    encode_times(&index.times[index.times_in_file..], &mut bytes);
    append_file(&time_index_path(dir, segment.base_offset), &bytes, sync)?;
    index.times_in_file = index.times.len();
    Ok(())
}

fn append_file(path: &Path, bytes: &[u8], sync: bool) -> Result<(), LogError> {
    if bytes.is_empty() && !sync {
        return Ok(());
    }
    crate::disk::append(path, bytes, sync).map_err(LogError::io_with("write", || path.to_owned()))
}

/// Cuts both index files to the entries still in memory after a truncation.
pub(crate) fn truncate_index_files(dir: &Path, segment: &Segment) -> Result<(), LogError> {
    let Some(index) = segment.index.as_ref() else {
        return Ok(());
    };
    let cuts = [
        (
            index_path(dir, segment.base_offset),
            index.offsets_in_file * crate::index::OFFSET_ENTRY_BYTES,
        ),
        (
            time_index_path(dir, segment.base_offset),
            index.times_in_file * crate::index::TIME_ENTRY_BYTES,
        ),
    ];
    for (path, len) in cuts {
        match crate::disk::open(std::fs::OpenOptions::new().write(true), &path) {
            Ok(file) => crate::disk::set_len(&file, &path, len as u64)
                .map_err(LogError::io("truncate", &path))?,
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
            Err(err) => return Err(LogError::io("open", &path)(err)),
        }
    }
    Ok(())
}

/// Finds the batch that holds `offset`: its position and header. `None` when the
/// segment ends before it.
pub(crate) fn find_batch(
    dir: &Path,
    segment: &Segment,
    file: &File,
    offset: u64,
) -> Result<Option<(u64, BatchHeader)>, LogError> {
    let Some(index) = segment.index.as_ref() else {
        return Ok(None);
    };
    let entry = index.floor(segment.relative(offset));
    // Position 0 is the segment's start, not an entry read from a file.
    let from_index = entry.position != 0;
    let mut expected = segment.base_offset + u64::from(entry.relative_offset);
    let path = log_path(dir, segment.base_offset);
    let mut walk = Walk::new(
        file,
        &path,
        u64::from(entry.position),
        segment.size_bytes,
        None,
    );
    loop {
        let step = walk.next_step().map_err(LogError::io("read", &path))?;
        match step {
            Step::End => return Ok(None),
            Step::Bad { position, .. } if from_index && position == u64::from(entry.position) => {
                return Err(index_entry_fault(dir, segment, entry))
            }
            Step::Bad {
                position,
                corruption,
            } => return Err(segment.corrupt(dir, position, corruption)),
            Step::Batch { position, header } => {
                if header.base_offset != expected as i64
                    && from_index
                    && position == u64::from(entry.position)
                {
                    return Err(index_entry_fault(dir, segment, entry));
                }
                if header.base_offset != expected as i64 {
                    let corruption = Corruption::UnexpectedOffset {
                        expected,
                        found: header.base_offset,
                    };
                    return Err(segment.corrupt(dir, position, corruption));
                }
                expected = header.last_offset() as u64 + 1;
                if expected > offset {
                    return Ok(Some((position, header)));
                }
            }
        }
    }
}

/// Whole batches read from one segment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogRead {
    buf: Vec<u8>,
    start: usize,
    end: usize,
    /// Base offset of the first batch returned (at or below the offset asked for).
    pub first_offset: u64,
    /// The offset after the last batch returned: where the next read continues.
    pub next_offset: u64,
    /// Number of batches returned.
    pub batch_count: u32,
    /// The tag of the log read, which its stored batches carry.
    pub(crate) tag: i32,
    /// The base offset of the segment read and the byte of its file where the returned
    /// bytes start (to name a damaged batch found after them by file and byte); `None`
    /// for a read that came from no segment.
    in_file: Option<(u64, u64)>,
}

impl LogRead {
    /// An empty read positioned at `offset`.
    pub fn default_at(offset: u64) -> Self {
        Self::empty(offset)
    }

    /// An empty read at `offset` that keeps `buffer` for [`LogRead::into_buffer`].
    pub fn empty_with(offset: u64, buffer: Vec<u8>) -> Self {
        let mut read = Self::empty(offset);
        read.buf = buffer;
        read
    }

    pub(crate) fn empty(next_offset: u64) -> Self {
        Self {
            buf: Vec::new(),
            start: 0,
            end: 0,
            first_offset: next_offset,
            next_offset,
            batch_count: 0,
            tag: 0,
            in_file: None,
        }
    }

    /// The segment file (by its base offset) and the byte of it where the returned bytes
    /// end: after [`LogRead::keep_verified`] found damage, where the damaged batch
    /// starts. `None` for a read that came from no segment.
    pub fn end_in_file(&self, dir: &Path) -> Option<(PathBuf, u64)> {
        let (base, start) = self.in_file?;
        Some((log_path(dir, base), start + (self.end - self.start) as u64))
    }

    /// The read, of a log tagged `tag`.
    pub(crate) fn tagged(mut self, tag: i32) -> Self {
        self.tag = tag;
        self
    }

    /// The batches, exactly as stored.
    pub fn bytes(&self) -> &[u8] {
        &self.buf[self.start..self.end]
    }

    /// Whether no batch was returned.
    pub fn is_empty(&self) -> bool {
        self.batch_count == 0
    }

    /// Gives the bytes as an owned buffer (moving them to its front if needed).
    pub fn into_bytes(mut self) -> Vec<u8> {
        self.buf.truncate(self.end);
        self.buf.drain(..self.start);
        self.buf
    }

    /// Keeps only the first `bytes` bytes (`batches` whole batches ending before
    /// `next_offset`).
    pub(crate) fn cut_at(&mut self, bytes: usize, next_offset: u64, batches: u32) {
        self.end = self.start + bytes;
        self.next_offset = next_offset;
        self.batch_count = batches;
        if batches == 0 {
            self.first_offset = next_offset;
        }
    }

    /// Gives back the whole buffer, to pass to the next
    /// [`crate::PartitionLog::read_reusing`] and spare its allocation and zeroing.
    pub fn into_buffer(self) -> Vec<u8> {
        self.buf
    }
}

/// Bytes read past a header that is not yet buffered, so a walk over small batches
/// does not read them one header at a time.
const HEADER_SLACK_BYTES: u64 = 4096;

/// Reads whole batches from the batch holding `from`, up to `budget_bytes` (the first
/// batch is returned whole even if larger), stopping before a batch whose base offset is
/// at or above `end_offset`.
#[allow(clippy::too_many_arguments)] // one call site; a struct would only rename them
pub(crate) fn read_batches(
    dir: &Path,
    segment: &Segment,
    file: &File,
    from: u64,
    budget_bytes: u64,
    end_offset: u64,
    interval_bytes: u32,
    buffer: Vec<u8>,
) -> Result<LogRead, LogError> {
    let Some(index) = segment.index.as_ref() else {
        return Ok(LogRead::empty_with(from, buffer));
    };
    let entry = index.floor(segment.relative(from));
    let path = || log_path(dir, segment.base_offset);
    let mut reader = Reader {
        file,
        dir,
        base: segment.base_offset,
        buf: buffer,
        valid: 0,
        buf_start: u64::from(entry.position),
        limit: segment.size_bytes,
    };
    // The batch asked for starts at most one index interval plus one batch after the
    // entry; one read of budget plus interval usually covers both.
    let first_want = budget_bytes + u64::from(interval_bytes) + HEADER_SLACK_BYTES;
    reader
        .cover(reader.buf_start + first_want)
        .map_err(LogError::io_with("read", path))?;
    let mut position = reader.buf_start;
    let mut expected = segment.base_offset + u64::from(entry.relative_offset);
    let mut start = None;
    let mut read = LogRead::empty(from);
    let from_index = entry.position != 0;
    while position < segment.size_bytes {
        // Nothing past the read's budget or end is looked at: damage there is the
        // next read's to find, never blamed on the batches before it. (A scrub that
        // read one intact batch before a zeroed page took it for the damaged one, and
        // its repair was refused for ever: the shell simulator's seed 46 with damage
        // to sleeping files.)
        if read.batch_count > 0
            && (expected >= end_offset
                || start.is_some_and(|first| position - first >= budget_bytes))
        {
            break;
        }
        let at_entry = from_index && position == u64::from(entry.position);
        let header = match reader.header(position) {
            Ok(header) => header,
            // The intact batches before damage are served; a read from the damaged
            // one finds it and names it. (Failing the whole read, a single node
            // served nothing from a segment with one bad length field, though every
            // batch before it was whole: an outside review of issue 24.)
            Err(ReadFault::Bad(_)) if read.batch_count > 0 => break,
            Err(ReadFault::Io(err)) => return Err(LogError::io("read", path())(err)),
            Err(ReadFault::Bad(_)) if at_entry => {
                return Err(index_entry_fault(dir, segment, entry))
            }
            Err(ReadFault::Bad(c)) => return Err(segment.corrupt(dir, position, c)),
        };
        if header.base_offset != expected as i64 && at_entry {
            return Err(index_entry_fault(dir, segment, entry));
        }
        if header.base_offset != expected as i64 && read.batch_count > 0 {
            break;
        }
        if header.base_offset != expected as i64 {
            let corruption = Corruption::UnexpectedOffset {
                expected,
                found: header.base_offset,
            };
            return Err(segment.corrupt(dir, position, corruption));
        }
        let total = header.total_bytes() as u64;
        let last = header.last_offset() as u64;
        expected = last + 1;
        if last < from {
            position += total;
            continue;
        }
        if header.base_offset as u64 >= end_offset {
            break;
        }
        let first = *start.get_or_insert(position);
        if read.batch_count > 0 && position + total - first > budget_bytes {
            break;
        }
        if read.batch_count == 0 {
            read.first_offset = header.base_offset as u64;
        }
        reader
            .cover(position + total)
            .map_err(LogError::io_with("read", path))?;
        position += total;
        read.batch_count += 1;
        read.next_offset = expected;
    }
    read.in_file = Some((segment.base_offset, start.unwrap_or(position)));
    if let Some(first) = start {
        // `position` is the end of the last batch taken, and the buffer covers it.
        read.start = (first - reader.buf_start) as usize;
        read.end = (position - reader.buf_start) as usize;
    }
    read.buf = reader.buf;
    Ok(read)
}

enum ReadFault {
    Io(std::io::Error),
    Bad(Corruption),
}

/// A growing buffer whose first `valid` bytes hold `[buf_start, buf_start + valid)` of
/// a segment file. A reused buffer keeps its length, so growing into it needs no
/// zeroing.
struct Reader<'f> {
    file: &'f File,
    dir: &'f Path,
    base: u64,
    buf: Vec<u8>,
    valid: usize,
    buf_start: u64,
    limit: u64,
}

impl Reader<'_> {
    /// Extends the valid part to cover the file up to `end` (at most the segment size).
    fn cover(&mut self, end: u64) -> std::io::Result<()> {
        let end = end.min(self.limit);
        let have = self.buf_start + self.valid as u64;
        if end <= have {
            return Ok(());
        }
        let want = (end - self.buf_start) as usize;
        if self.buf.len() < want {
            self.buf.resize(want, 0);
        }
        crate::disk::read_exact_at_named(
            self.file,
            || log_path(self.dir, self.base),
            &mut self.buf[self.valid..want],
            have,
        )
        .map_err(|err| {
            if err.kind() != std::io::ErrorKind::UnexpectedEof {
                return err;
            }
            // The file is shorter than the log holds it to be: cut while open. (Said
            // so, and where: "failed to fill whole buffer" named no byte, an outside
            // review of issue 24.)
            std::io::Error::new(
                err.kind(),
                format!(
                    "the file ends before byte {end}, which the log holds (cut short \
                     since it was opened)"
                ),
            )
        })?;
        self.valid = want;
        Ok(())
    }

    fn header(&mut self, position: u64) -> Result<BatchHeader, ReadFault> {
        let header_end = position + braid_proto::batch::HEADER_BYTES as u64;
        if header_end > self.limit {
            return Err(ReadFault::Bad(Corruption::Batch(
                braid_proto::BatchError::Truncated {
                    at: (self.limit - position) as usize,
                    needed: braid_proto::batch::HEADER_BYTES,
                    available: (self.limit - position) as usize,
                },
            )));
        }
        self.cover(header_end + HEADER_SLACK_BYTES)
            .map_err(ReadFault::Io)?;
        let from = (position - self.buf_start) as usize;
        let header = BatchHeader::decode(&self.buf[from..self.valid])
            .map_err(|e| ReadFault::Bad(Corruption::Batch(e)))?;
        if position + header.total_bytes() as u64 > self.limit {
            let available = (self.limit - position) as usize;
            return Err(ReadFault::Bad(Corruption::Batch(
                braid_proto::BatchError::Truncated {
                    at: available,
                    needed: header.total_bytes(),
                    available,
                },
            )));
        }
        Ok(header)
    }
}
