//! The sparse offset index and the time index of one log segment.
//!
//! Both are arrays of fixed-size big-endian entries, in memory while the segment is in
//! use and in a file beside it. An offset entry `(relative offset, position)` says that
//! the batch whose base offset is `segment base + relative offset` starts at byte
//! `position` of the `.log` file. A time entry `(timestamp, relative offset)` says that
//! no record before the end of the batch starting at that relative offset has a
//! timestamp above `timestamp`, and that batch holds one equal to it.
//!
//! Entries are deterministic: a batch gets an offset entry when at least
//! `index_interval_bytes` lie between the start of the last indexed batch (or of the
//! segment) and its own start, and a time entry when it gets an offset entry and the
//! segment's largest timestamp grew since the last time entry. Rebuilding from the
//! `.log` file therefore writes the same entries the appends wrote.

/// Bytes of one offset index entry.
pub(crate) const OFFSET_ENTRY_BYTES: usize = 8;
/// Bytes of one time index entry.
pub(crate) const TIME_ENTRY_BYTES: usize = 12;

/// Where a batch starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct OffsetEntry {
    pub(crate) relative_offset: u32,
    pub(crate) position: u32,
}

/// The largest timestamp up to a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TimeEntry {
    pub(crate) timestamp: i64,
    pub(crate) relative_offset: u32,
}

/// Both indexes of one segment, with how many entries of each are already in the files.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct SegmentIndex {
    pub(crate) offsets: Vec<OffsetEntry>,
    pub(crate) times: Vec<TimeEntry>,
    pub(crate) offsets_in_file: usize,
    pub(crate) times_in_file: usize,
}

impl SegmentIndex {
    /// The indexed batch at or before `relative_offset`: its relative offset and
    /// position, or the segment start.
    pub(crate) fn floor(&self, relative_offset: u32) -> OffsetEntry {
        let after = self
            .offsets
            .partition_point(|e| e.relative_offset <= relative_offset);
        match after {
            0 => OffsetEntry {
                relative_offset: 0,
                position: 0,
            },
            n => self.offsets[n - 1],
        }
    }

    /// The entry of the last batch whose running largest timestamp is below
    /// `timestamp`: no record before the end of that batch reaches `timestamp`.
    pub(crate) fn last_below(&self, timestamp: i64) -> Option<TimeEntry> {
        let after = self.times.partition_point(|e| e.timestamp < timestamp);
        after.checked_sub(1).map(|n| self.times[n])
    }

    /// Start of the last indexed batch, or 0.
    pub(crate) fn last_position(&self) -> u32 {
        self.offsets.last().map_or(0, |e| e.position)
    }

    /// The largest timestamp recorded in the time index.
    pub(crate) fn last_timestamp(&self) -> Option<i64> {
        self.times.last().map(|e| e.timestamp)
    }

    /// Applies the indexing rule to a batch about to be placed at `position`. The caller
    /// tracks the running largest timestamp `max_timestamp` (including this batch) and
    /// the relative offset of the batch that holds it.
    pub(crate) fn note_batch(
        &mut self,
        relative_offset: u32,
        position: u32,
        interval_bytes: u32,
        max_timestamp: i64,
        max_timestamp_relative_offset: u32,
    ) {
        if position - self.last_position() < interval_bytes {
            return;
        }
        self.offsets.push(OffsetEntry {
            relative_offset,
            position,
        });
        if self
            .last_timestamp()
            .is_none_or(|last| max_timestamp > last)
        {
            self.times.push(TimeEntry {
                timestamp: max_timestamp,
                relative_offset: max_timestamp_relative_offset,
            });
        }
    }

    /// Adds the closing time entry a sealed segment carries, so that its last time entry
    /// is the segment's largest timestamp.
    pub(crate) fn seal(&mut self, max_timestamp: i64, relative_offset: u32) {
        if self
            .last_timestamp()
            .is_none_or(|last| max_timestamp > last)
        {
            self.times.push(TimeEntry {
                timestamp: max_timestamp,
                relative_offset,
            });
        }
    }

    /// Drops entries at or after `relative_offset`.
    pub(crate) fn truncate(&mut self, relative_offset: u32) {
        self.offsets.retain(|e| e.relative_offset < relative_offset);
        self.times.retain(|e| e.relative_offset < relative_offset);
        self.offsets_in_file = self.offsets_in_file.min(self.offsets.len());
        self.times_in_file = self.times_in_file.min(self.times.len());
    }

    /// Approximate heap bytes held.
    pub(crate) fn heap_bytes(&self) -> usize {
        self.offsets.capacity() * std::mem::size_of::<OffsetEntry>()
            + self.times.capacity() * std::mem::size_of::<TimeEntry>()
    }
}

pub(crate) fn encode_offsets(entries: &[OffsetEntry], out: &mut Vec<u8>) {
    for e in entries {
        out.extend_from_slice(&e.relative_offset.to_be_bytes());
        out.extend_from_slice(&e.position.to_be_bytes());
    }
}

pub(crate) fn encode_times(entries: &[TimeEntry], out: &mut Vec<u8>) {
    for e in entries {
        out.extend_from_slice(&e.timestamp.to_be_bytes());
        out.extend_from_slice(&e.relative_offset.to_be_bytes());
    }
}

/// Decodes an offset index file. Returns the entries of its longest sound prefix and
/// whether the whole file was sound (a length that is not a whole number of entries,
/// or entries that do not increase, or a position at or past `segment_bytes`, end it).
pub(crate) fn decode_offsets(bytes: &[u8], segment_bytes: u64) -> (Vec<OffsetEntry>, bool) {
    let mut entries: Vec<OffsetEntry> = Vec::with_capacity(bytes.len() / OFFSET_ENTRY_BYTES);
    for chunk in bytes.chunks(OFFSET_ENTRY_BYTES) {
        let [a, b, c, d, e, f, g, h] = *chunk else {
            return (entries, false);
        };
        let entry = OffsetEntry {
            relative_offset: u32::from_be_bytes([a, b, c, d]),
            position: u32::from_be_bytes([e, f, g, h]),
        };
        let increasing = entries.last().is_none_or(|last| {
            entry.relative_offset > last.relative_offset && entry.position > last.position
        });
        if !increasing || entry.position == 0 || u64::from(entry.position) >= segment_bytes {
            return (entries, false);
        }
        entries.push(entry);
    }
    (entries, true)
}

/// Decodes a time index file, as [`decode_offsets`]; `relative_offset_end` bounds the
/// relative offsets a sound entry may name.
pub(crate) fn decode_times(bytes: &[u8], relative_offset_end: u64) -> (Vec<TimeEntry>, bool) {
    let mut entries: Vec<TimeEntry> = Vec::with_capacity(bytes.len() / TIME_ENTRY_BYTES);
    for chunk in bytes.chunks(TIME_ENTRY_BYTES) {
        let Ok(raw) = <[u8; TIME_ENTRY_BYTES]>::try_from(chunk) else {
            return (entries, false);
        };
        let [t0, t1, t2, t3, t4, t5, t6, t7, o0, o1, o2, o3] = raw;
        let entry = TimeEntry {
            timestamp: i64::from_be_bytes([t0, t1, t2, t3, t4, t5, t6, t7]),
            relative_offset: u32::from_be_bytes([o0, o1, o2, o3]),
        };
        let increasing = entries.last().is_none_or(|last| {
            entry.timestamp > last.timestamp && entry.relative_offset > last.relative_offset
        });
        if !increasing || u64::from(entry.relative_offset) >= relative_offset_end {
            return (entries, false);
        }
        entries.push(entry);
    }
    (entries, true)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn index_with(positions: &[(u32, u32)]) -> SegmentIndex {
        SegmentIndex {
            offsets: positions
                .iter()
                .map(|&(relative_offset, position)| OffsetEntry {
                    relative_offset,
                    position,
                })
                .collect(),
            ..SegmentIndex::default()
        }
    }

    #[test]
    fn floor_finds_the_batch_at_or_before() {
        let index = index_with(&[(10, 4096), (20, 8200), (30, 12300)]);
        assert_eq!(index.floor(0).position, 0);
        assert_eq!(index.floor(9).position, 0);
        assert_eq!(index.floor(10).position, 4096);
        assert_eq!(index.floor(25).position, 8200);
        assert_eq!(index.floor(u32::MAX).position, 12300);
    }

    #[test]
    fn files_round_trip_and_damage_ends_the_sound_prefix() {
        let index = index_with(&[(10, 4096), (20, 8200), (30, 12300)]);
        let mut bytes = Vec::new();
        encode_offsets(&index.offsets, &mut bytes);
        assert_eq!(
            decode_offsets(&bytes, 20_000),
            (index.offsets.clone(), true)
        );
        // A torn last entry.
        assert_eq!(
            decode_offsets(&bytes[..20], 20_000),
            (index.offsets[..2].to_vec(), false)
        );
        // A position past the segment.
        assert_eq!(
            decode_offsets(&bytes, 10_000),
            (index.offsets[..2].to_vec(), false)
        );
        // Entries that go backwards.
        bytes[8..16].copy_from_slice(&[0, 0, 0, 5, 0, 0, 0, 9]);
        assert_eq!(
            decode_offsets(&bytes, 20_000),
            (index.offsets[..1].to_vec(), false)
        );
    }

    #[test]
    fn time_lookup_and_codec() {
        let mut index = SegmentIndex::default();
        index.note_batch(0, 0, 100, 5, 0);
        assert!(index.offsets.is_empty(), "the first batch needs no entry");
        index.note_batch(4, 120, 100, 50, 4);
        index.note_batch(9, 130, 100, 60, 9);
        index.note_batch(12, 240, 100, 50, 4);
        index.note_batch(15, 400, 100, 70, 15);
        assert_eq!(index.offsets.len(), 3);
        assert_eq!(
            index.times,
            [
                TimeEntry {
                    timestamp: 50,
                    relative_offset: 4
                },
                TimeEntry {
                    timestamp: 70,
                    relative_offset: 15
                }
            ]
        );
        assert_eq!(index.last_below(50), None);
        assert_eq!(index.last_below(51).map(|e| e.relative_offset), Some(4));
        assert_eq!(index.last_below(1000).map(|e| e.relative_offset), Some(15));
        let mut bytes = Vec::new();
        encode_times(&index.times, &mut bytes);
        assert_eq!(decode_times(&bytes, 16), (index.times.clone(), true));
        assert!(!decode_times(&bytes, 15).1);
        index.truncate(12);
        assert_eq!(index.offsets.len(), 1);
        assert_eq!(index.times.len(), 1);
    }
}
