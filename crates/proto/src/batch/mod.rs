//! The record batch: Kafka's message format v2 (magic 2).
//!
//! A batch is a 61-byte header followed by `record_count` varint-encoded records. It is
//! the unit of append, replication and transfer: the node stores the bytes a producer
//! sent and serves them to consumers unchanged, rewriting only the two header fields
//! that the CRC does not cover (base offset and partition leader epoch).
//!
//! Three views of the same bytes:
//! - [`BatchHeader`]: the decoded header, checked only for magic and length.
//! - [`RecordBatch`]: a borrowed batch whose CRC, lengths, counts and every record were
//!   checked by [`RecordBatch::validate`]; iterate it with [`RecordBatch::records`].
//! - [`ValidatedBatch`]: owned bytes with the same proof, which the partition log takes
//!   on append, so nothing unchecked reaches the disk.
//!
//! ```
//! use braid_proto::batch::{BatchBuilder, RecordBatch};
//!
//! let mut builder = BatchBuilder::new(1_700_000_000_000);
//! builder.push(Some(b"user-7"), Some(b"hello"), &[], 1_700_000_000_000);
//! builder.push(None, Some(b"world"), &[(b"trace", Some(b"1"))], 1_700_000_000_005);
//! let bytes = builder.finish();
//!
//! let (batch, used) = RecordBatch::validate(&bytes).unwrap();
//! assert_eq!(used, bytes.len());
//! let values: Vec<_> = batch.records().map(|r| r.unwrap().value).collect();
//! assert_eq!(values, [Some(&b"hello"[..]), Some(&b"world"[..])]);
//! ```

mod builder;
mod header;
mod record;

use bytes::BytesMut;

pub use builder::BatchBuilder;
pub use header::{
    attribute, field, partition_tag, set_base_offset, set_partition_leader_epoch, set_producer,
    BatchHeader, Compression, HEADER_BYTES, MAGIC,
};
pub use record::{parse_record, Header, HeaderIter, Headers, Record, RecordFault};

/// Largest batch the format can describe; a node enforces its own, smaller limit.
pub const BATCH_BYTES_MAX: usize = i32::MAX as usize;

/// Why bytes are not a valid record batch. Every variant is a fault of whoever produced
/// the bytes (a peer, a client or the disk), never a bug of the reader.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BatchError {
    /// Fewer bytes than the header or the declared length needs.
    #[error("batch truncated at byte {at}: needs {needed} bytes, {available} available")]
    Truncated {
        /// Where the missing part starts, from the start of the batch.
        at: usize,
        /// Bytes needed from the start of the batch.
        needed: usize,
        /// Bytes available from the start of the batch.
        available: usize,
    },
    /// The magic byte is not 2.
    #[error("unsupported batch magic {found}, expected 2")]
    BadMagic {
        /// The magic found.
        found: i8,
    },
    /// The length field is smaller than the header it must cover.
    #[error("batch length field {batch_length} is smaller than the header")]
    BadLength {
        /// The value of the length field.
        batch_length: i32,
    },
    /// The stored CRC32C does not match the bytes.
    #[error("batch CRC32C mismatch: stored {stored:#010x}, computed {computed:#010x}")]
    CrcMismatch {
        /// CRC in the header.
        stored: u32,
        /// CRC of the bytes.
        computed: u32,
    },
    /// A batch read from a Braid log whose partition leader epoch field is not the
    /// log's partition tag, the only value a log stores there: the field is outside the
    /// CRC, so this is how damage to it is seen, and how a batch of another partition's
    /// log (a misdirected write) is told from one of its own.
    #[error("stored batch has partition tag {found:#010x}, this log stores {expected:#010x}")]
    StoredEpoch {
        /// The value found.
        found: i32,
        /// The log's partition tag.
        expected: i32,
    },
    /// The batch is compressed; Braid stores uncompressed batches only for now.
    #[error("compressed batches are not supported (codec: {codec})")]
    Compressed {
        /// The codec named by the attributes.
        codec: Compression,
    },
    /// Attribute bits Braid does not accept from producers.
    #[error("unsupported batch attributes {attributes:#06x}: {what}")]
    UnsupportedAttributes {
        /// The attribute bits.
        attributes: u16,
        /// Which feature they ask for.
        what: &'static str,
    },
    /// The record count is negative, zero, or disagrees with the last offset delta.
    #[error("record count {record_count} disagrees with last offset delta {last_offset_delta}")]
    BadRecordCount {
        /// The record count field.
        record_count: i32,
        /// The last offset delta field.
        last_offset_delta: i32,
    },
    /// A record is malformed.
    #[error("record {index} at byte {at} of the batch: {fault}")]
    BadRecord {
        /// Index of the record in the batch.
        index: u32,
        /// Byte position of the record from the start of the batch.
        at: usize,
        /// What is wrong with it.
        fault: RecordFault,
    },
    /// A keyed record's key hash lies outside the partition's range (checked only by
    /// [`ValidatedBatch::for_key_range`]).
    #[error("record {index}'s key hashes to {hash}, outside the partition's range")]
    KeyOutOfRange {
        /// The record.
        index: u32,
        /// Its key's ring position.
        hash: u16,
    },
    /// The records end before the batch length does.
    #[error("{extra} bytes follow the last record inside the batch")]
    TrailingBytes {
        /// Unused bytes.
        extra: usize,
    },
    /// The header's max timestamp is not the largest record timestamp.
    #[error("max timestamp {declared} does not match the records' largest {actual}")]
    MaxTimestampMismatch {
        /// The header field.
        declared: i64,
        /// The largest record timestamp.
        actual: i64,
    },
}

/// A borrowed batch whose every byte was checked.
#[derive(Debug, Clone, Copy)]
pub struct RecordBatch<'a> {
    header: BatchHeader,
    bytes: &'a [u8],
}

impl<'a> RecordBatch<'a> {
    /// Checks the batch at the start of `input` and returns it with its length in bytes.
    /// Bytes after the batch are left for the caller (several batches can follow each
    /// other). The checks: magic, length, CRC32C over attributes to end, no compression,
    /// no transactional or control batch, CreateTime timestamps, a record count that
    /// agrees with the last offset delta, records whose offset deltas are 0, 1, 2, ...,
    /// whose fields fill their lengths exactly, and whose largest timestamp is the
    /// header's max timestamp.
    ///
    /// # Errors
    /// The first [`BatchError`] found.
    pub fn validate(input: &'a [u8]) -> Result<(Self, usize), BatchError> {
        let (batch, used) = Self::check_frame(input)?;
        batch.check_attributes()?;
        batch.check_records(None)?;
        Ok((batch, used))
    }

    /// Checks a batch as a Braid log stores it: its frame, as
    /// [`check_frame`](Self::check_frame), and its partition leader epoch field, where a
    /// log stores its partition's tag (`tag`). The two header fields outside the CRC are
    /// then both checked, the base offset by its place in the log (the caller's part): a
    /// stored batch is its canonical form at its offsets in its partition, and a bit
    /// flipped anywhere in it, or another partition's batch, is damage.
    ///
    /// # Errors
    /// As [`check_frame`](Self::check_frame), and [`BatchError::StoredEpoch`].
    pub fn check_stored(input: &'a [u8], tag: i32) -> Result<(Self, usize), BatchError> {
        let (batch, used) = Self::check_frame(input)?;
        match batch.header.partition_leader_epoch {
            found if found == tag => Ok((batch, used)),
            found => Err(BatchError::StoredEpoch {
                found,
                expected: tag,
            }),
        }
    }

    /// Checks only the header, the length and the CRC, not the records: the check a
    /// reader of its own, once-validated files needs to detect damage.
    ///
    /// # Errors
    /// [`BatchError::Truncated`], [`BatchError::BadMagic`], [`BatchError::BadLength`],
    /// [`BatchError::CrcMismatch`].
    pub fn check_frame(input: &'a [u8]) -> Result<(Self, usize), BatchError> {
        let header = BatchHeader::decode(input)?;
        let total = header.total_bytes();
        let Some(bytes) = input.get(..total) else {
            return Err(BatchError::Truncated {
                at: input.len(),
                needed: total,
                available: input.len(),
            });
        };
        let computed = crc32c::crc32c(&bytes[field::ATTRIBUTES..]);
        if computed != header.crc {
            return Err(BatchError::CrcMismatch {
                stored: header.crc,
                computed,
            });
        }
        Ok((Self { header, bytes }, total))
    }

    fn check_attributes(&self) -> Result<(), BatchError> {
        let attributes = self.header.attributes;
        let codec = self.header.compression();
        if codec != Compression::None {
            return Err(BatchError::Compressed { codec });
        }
        let refused = [
            (attribute::LOG_APPEND_TIME, "log-append-time timestamps"),
            (attribute::TRANSACTIONAL, "transactions"),
            (attribute::CONTROL, "control batches"),
            (attribute::DELETE_HORIZON, "delete horizon"),
        ];
        for (bit, what) in refused {
            if attributes & bit != 0 {
                return Err(BatchError::UnsupportedAttributes { attributes, what });
            }
        }
        Ok(())
    }

    /// Walks every record; with `keys`, also checks that each keyed record's hash lies
    /// in that inclusive range, in the same walk.
    fn check_records(&self, keys: Option<(u16, u16)>) -> Result<(), BatchError> {
        let header = &self.header;
        let count = header.record_count;
        if count <= 0 || header.last_offset_delta != count - 1 {
            return Err(BatchError::BadRecordCount {
                record_count: count,
                last_offset_delta: header.last_offset_delta,
            });
        }
        let mut at = HEADER_BYTES;
        let mut max_timestamp = i64::MIN;
        for index in 0..count as u32 {
            let bad = |fault| BatchError::BadRecord { index, at, fault };
            let (record, used) = parse_record(&self.bytes[at..]).map_err(bad)?;
            if record.offset_delta != index as i32 {
                return Err(bad(RecordFault::OffsetDelta {
                    expected: index as i32,
                    found: record.offset_delta,
                }));
            }
            let timestamp = header
                .base_timestamp
                .checked_add(record.timestamp_delta)
                .ok_or(bad(RecordFault::Timestamp))?;
            max_timestamp = max_timestamp.max(timestamp);
            if let (Some((start, end)), Some(key)) = (keys, record.key) {
                let hash = crate::hash::key_hash(key);
                if hash < start || hash > end {
                    return Err(BatchError::KeyOutOfRange { index, hash });
                }
            }
            at += used;
        }
        if at != self.bytes.len() {
            return Err(BatchError::TrailingBytes {
                extra: self.bytes.len() - at,
            });
        }
        if max_timestamp != header.max_timestamp {
            return Err(BatchError::MaxTimestampMismatch {
                declared: header.max_timestamp,
                actual: max_timestamp,
            });
        }
        Ok(())
    }

    /// The decoded header.
    pub fn header(&self) -> &BatchHeader {
        &self.header
    }

    /// The batch bytes, exactly as stored or sent.
    pub fn as_bytes(&self) -> &'a [u8] {
        self.bytes
    }

    /// Iterates the records in offset order without copying.
    pub fn records(&self) -> RecordIter<'a> {
        RecordIter {
            bytes: self.bytes,
            at: HEADER_BYTES,
            index: 0,
            count: self.header.record_count.max(0) as u32,
        }
    }
}

/// Iterator over the records of a [`RecordBatch`].
#[derive(Debug, Clone)]
pub struct RecordIter<'a> {
    bytes: &'a [u8],
    at: usize,
    index: u32,
    count: u32,
}

impl<'a> Iterator for RecordIter<'a> {
    type Item = Result<Record<'a>, BatchError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.index >= self.count {
            return None;
        }
        let (index, at) = (self.index, self.at);
        match parse_record(&self.bytes[at..]) {
            Ok((record, used)) => {
                self.index += 1;
                self.at += used;
                Some(Ok(record))
            }
            Err(fault) => {
                self.index = self.count;
                Some(Err(BatchError::BadRecord { index, at, fault }))
            }
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let left = (self.count - self.index) as usize;
        (0, Some(left))
    }
}

/// An owned batch that passed [`RecordBatch::validate`]. Only `ValidatedBatch::new`
/// makes one, so a function that takes it knows the bytes are sound.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValidatedBatch {
    bytes: BytesMut,
    header: BatchHeader,
}

impl ValidatedBatch {
    /// Validates `bytes`, which must hold exactly one batch. Takes the vector without
    /// copying it.
    ///
    /// # Errors
    /// Any [`BatchError`] of [`RecordBatch::validate`], or [`BatchError::TrailingBytes`]
    /// if bytes follow the batch.
    pub fn new(bytes: Vec<u8>) -> Result<Self, BatchError> {
        // A Bytes made from a Vec is unique, so this takes the allocation as it is.
        let bytes = bytes::Bytes::from(bytes)
            .try_into_mut()
            .unwrap_or_else(|shared| BytesMut::from(&shared[..]));
        Self::from_bytes_mut(bytes)
    }

    /// As [`ValidatedBatch::new`], for bytes split from a connection's read buffer
    /// (without copying).
    ///
    /// # Errors
    /// As [`ValidatedBatch::new`].
    pub fn from_bytes_mut(bytes: BytesMut) -> Result<Self, BatchError> {
        Self::checked(bytes, None)
    }

    /// As [`ValidatedBatch::from_bytes_mut`], and every keyed record's key hash (see
    /// [`crate::hash::key_hash`]) must lie in the inclusive range `[start, end]` of the
    /// partition it is for; keyless records belong anywhere. Checked in the same walk
    /// as the records, and not at all for the full range.
    ///
    /// # Errors
    /// As [`ValidatedBatch::new`], and [`BatchError::KeyOutOfRange`].
    pub fn for_key_range(bytes: BytesMut, start: u16, end: u16) -> Result<Self, BatchError> {
        let keys = (start != 0 || end != u16::MAX).then_some((start, end));
        Self::checked(bytes, keys)
    }

    fn checked(bytes: BytesMut, keys: Option<(u16, u16)>) -> Result<Self, BatchError> {
        let (batch, used) = RecordBatch::check_frame(&bytes)?;
        batch.check_attributes()?;
        batch.check_records(keys)?;
        if used != bytes.len() {
            return Err(BatchError::TrailingBytes {
                extra: bytes.len() - used,
            });
        }
        let header = *batch.header();
        Ok(Self { bytes, header })
    }

    /// The header as validated (its base offset is what the producer sent).
    pub fn header(&self) -> &BatchHeader {
        &self.header
    }

    /// Number of records.
    pub fn record_count(&self) -> u32 {
        self.header.record_count as u32
    }

    /// Size in bytes.
    pub fn len(&self) -> usize {
        self.bytes.len()
    }

    /// Always false: a valid batch has at least a header and one record.
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    /// The bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// Sets the base offset (outside the CRC, so the batch stays valid).
    pub fn set_base_offset(&mut self, offset: i64) {
        set_base_offset(&mut self.bytes, offset);
        self.header.base_offset = offset;
    }

    /// Sets the partition leader epoch (outside the CRC).
    pub fn set_partition_leader_epoch(&mut self, epoch: i32) {
        set_partition_leader_epoch(&mut self.bytes, epoch);
        self.header.partition_leader_epoch = epoch;
    }

    /// Borrows it as a [`RecordBatch`] to iterate its records.
    pub fn as_record_batch(&self) -> RecordBatch<'_> {
        RecordBatch {
            header: self.header,
            bytes: &self.bytes,
        }
    }

    /// Gives the bytes back.
    pub fn into_bytes(self) -> BytesMut {
        self.bytes
    }
}

#[cfg(test)]
mod tests;
