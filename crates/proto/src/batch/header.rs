//! The fixed 61-byte header of a record batch.

use super::BatchError;

/// Size of the batch header in bytes.
pub const HEADER_BYTES: usize = 61;
/// The only supported magic (format version).
pub const MAGIC: i8 = 2;

/// Byte positions of the header fields; all integers are big-endian.
pub mod field {
    /// `base_offset: i64`: offset of the first record. Not covered by the CRC.
    pub const BASE_OFFSET: usize = 0;
    /// `batch_length: i32`: bytes that follow this field, to the end of the batch.
    pub const BATCH_LENGTH: usize = 8;
    /// `partition_leader_epoch: i32`. Not covered by the CRC.
    pub const PARTITION_LEADER_EPOCH: usize = 12;
    /// `magic: i8`, always 2.
    pub const MAGIC: usize = 16;
    /// `crc: u32`: CRC32C (Castagnoli) of every byte from `attributes` to the end.
    pub const CRC: usize = 17;
    /// `attributes: i16`: compression, timestamp type, transactional, control.
    pub const ATTRIBUTES: usize = 21;
    /// `last_offset_delta: i32`: offset delta of the last record.
    pub const LAST_OFFSET_DELTA: usize = 23;
    /// `base_timestamp: i64`: timestamp of the first record, in ms.
    pub const BASE_TIMESTAMP: usize = 27;
    /// `max_timestamp: i64`: largest record timestamp, in ms.
    pub const MAX_TIMESTAMP: usize = 35;
    /// `producer_id: i64`: the Braid session id, or -1.
    pub const PRODUCER_ID: usize = 43;
    /// `producer_epoch: i16`, or -1.
    pub const PRODUCER_EPOCH: usize = 51;
    /// `base_sequence: i32`: the request number within the session, or -1.
    pub const BASE_SEQUENCE: usize = 53;
    /// `record_count: i32`.
    pub const RECORD_COUNT: usize = 57;
    /// First byte of the records.
    pub const RECORDS: usize = 61;
}

/// Bytes counted by `batch_length` that belong to the header.
pub(crate) const LENGTH_COVERED_HEADER_BYTES: usize = HEADER_BYTES - field::PARTITION_LEADER_EPOCH;

const _: () = assert!(field::RECORDS == HEADER_BYTES);
const _: () = assert!(field::RECORD_COUNT + 4 == HEADER_BYTES);

/// The compression codec named by the low three attribute bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    /// Records are stored as they are (code 0). The only codec Braid accepts now.
    None,
    /// gzip (code 1).
    Gzip,
    /// Snappy (code 2).
    Snappy,
    /// LZ4 (code 3).
    Lz4,
    /// Zstandard (code 4).
    Zstd,
    /// Codes 5 to 7, not defined by the format.
    Unknown(u8),
}

impl Compression {
    /// The codec of the attribute bits.
    pub fn from_attributes(attributes: u16) -> Self {
        match attributes & 0x07 {
            0 => Self::None,
            1 => Self::Gzip,
            2 => Self::Snappy,
            3 => Self::Lz4,
            4 => Self::Zstd,
            other => Self::Unknown(other as u8),
        }
    }
}

impl std::fmt::Display for Compression {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::None => f.write_str("none"),
            Self::Gzip => f.write_str("gzip"),
            Self::Snappy => f.write_str("snappy"),
            Self::Lz4 => f.write_str("lz4"),
            Self::Zstd => f.write_str("zstd"),
            Self::Unknown(code) => write!(f, "unknown codec {code}"),
        }
    }
}

/// Attribute bits.
pub mod attribute {
    /// Bits 0-2: the compression codec.
    pub const COMPRESSION_MASK: u16 = 0x0007;
    /// Bit 3: timestamps are the log append time rather than the create time.
    pub const LOG_APPEND_TIME: u16 = 0x0008;
    /// Bit 4: the batch belongs to a transaction.
    pub const TRANSACTIONAL: u16 = 0x0010;
    /// Bit 5: the batch is a control batch (transaction markers).
    pub const CONTROL: u16 = 0x0020;
    /// Bit 6: the batch carries a delete horizon (compaction).
    pub const DELETE_HORIZON: u16 = 0x0040;
}

/// The decoded header of a record batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchHeader {
    /// Offset of the first record.
    pub base_offset: i64,
    /// Bytes after the `batch_length` field; the whole batch is `batch_length + 12`.
    pub batch_length: i32,
    /// Epoch of the leader that appended the batch.
    pub partition_leader_epoch: i32,
    /// Format version; 2.
    pub magic: i8,
    /// The stored CRC32C.
    pub crc: u32,
    /// Attribute bits (see [`attribute`]).
    pub attributes: u16,
    /// Offset delta of the last record.
    pub last_offset_delta: i32,
    /// Timestamp of the first record (ms).
    pub base_timestamp: i64,
    /// Largest record timestamp (ms).
    pub max_timestamp: i64,
    /// Producer (session) id, -1 when none.
    pub producer_id: i64,
    /// Producer epoch, -1 when none.
    pub producer_epoch: i16,
    /// Sequence number of the first record, -1 when none.
    pub base_sequence: i32,
    /// Number of records.
    pub record_count: i32,
}

impl BatchHeader {
    /// Decodes the header at the start of `input`, checking only that the bytes are
    /// there, the magic is 2 and the length field is plausible. It does not check the
    /// CRC or the records: see [`super::RecordBatch::validate`].
    ///
    /// # Errors
    /// [`BatchError::Truncated`] if fewer than [`HEADER_BYTES`] bytes are given,
    /// [`BatchError::BadMagic`], [`BatchError::BadLength`].
    pub fn decode(input: &[u8]) -> Result<Self, BatchError> {
        let Some(bytes) = input.get(..HEADER_BYTES) else {
            return Err(BatchError::Truncated {
                at: 0,
                needed: HEADER_BYTES,
                available: input.len(),
            });
        };
        let header = Self {
            base_offset: i64_at(bytes, field::BASE_OFFSET),
            batch_length: i32_at(bytes, field::BATCH_LENGTH),
            partition_leader_epoch: i32_at(bytes, field::PARTITION_LEADER_EPOCH),
            magic: bytes[field::MAGIC] as i8,
            crc: u32_at(bytes, field::CRC),
            attributes: u16_at(bytes, field::ATTRIBUTES),
            last_offset_delta: i32_at(bytes, field::LAST_OFFSET_DELTA),
            base_timestamp: i64_at(bytes, field::BASE_TIMESTAMP),
            max_timestamp: i64_at(bytes, field::MAX_TIMESTAMP),
            producer_id: i64_at(bytes, field::PRODUCER_ID),
            producer_epoch: u16_at(bytes, field::PRODUCER_EPOCH) as i16,
            base_sequence: i32_at(bytes, field::BASE_SEQUENCE),
            record_count: i32_at(bytes, field::RECORD_COUNT),
        };
        if header.magic != MAGIC {
            return Err(BatchError::BadMagic {
                found: header.magic,
            });
        }
        if (header.batch_length as i64) < LENGTH_COVERED_HEADER_BYTES as i64 {
            return Err(BatchError::BadLength {
                batch_length: header.batch_length,
            });
        }
        Ok(header)
    }

    /// Total size of the batch in bytes, header included.
    pub fn total_bytes(&self) -> usize {
        // decode() guarantees batch_length >= 49, so this cannot wrap.
        self.batch_length as u32 as usize + field::PARTITION_LEADER_EPOCH
    }

    /// Offset of the last record.
    pub fn last_offset(&self) -> i64 {
        self.base_offset
            .saturating_add(i64::from(self.last_offset_delta))
    }

    /// The compression codec of the batch.
    pub fn compression(&self) -> Compression {
        Compression::from_attributes(self.attributes)
    }

    /// Writes the header into the first [`HEADER_BYTES`] of `out`.
    ///
    /// # Panics
    /// If `out` is shorter than [`HEADER_BYTES`]: a caller bug, not a data fault.
    pub fn encode_into(&self, out: &mut [u8]) {
        let out = &mut out[..HEADER_BYTES];
        out[field::BASE_OFFSET..][..8].copy_from_slice(&self.base_offset.to_be_bytes());
        out[field::BATCH_LENGTH..][..4].copy_from_slice(&self.batch_length.to_be_bytes());
        out[field::PARTITION_LEADER_EPOCH..][..4]
            .copy_from_slice(&self.partition_leader_epoch.to_be_bytes());
        out[field::MAGIC] = self.magic as u8;
        out[field::CRC..][..4].copy_from_slice(&self.crc.to_be_bytes());
        out[field::ATTRIBUTES..][..2].copy_from_slice(&self.attributes.to_be_bytes());
        out[field::LAST_OFFSET_DELTA..][..4].copy_from_slice(&self.last_offset_delta.to_be_bytes());
        out[field::BASE_TIMESTAMP..][..8].copy_from_slice(&self.base_timestamp.to_be_bytes());
        out[field::MAX_TIMESTAMP..][..8].copy_from_slice(&self.max_timestamp.to_be_bytes());
        out[field::PRODUCER_ID..][..8].copy_from_slice(&self.producer_id.to_be_bytes());
        out[field::PRODUCER_EPOCH..][..2].copy_from_slice(&self.producer_epoch.to_be_bytes());
        out[field::BASE_SEQUENCE..][..4].copy_from_slice(&self.base_sequence.to_be_bytes());
        out[field::RECORD_COUNT..][..4].copy_from_slice(&self.record_count.to_be_bytes());
    }
}

// The callers below index inside a slice already checked to be HEADER_BYTES long.
fn i64_at(bytes: &[u8], at: usize) -> i64 {
    let mut raw = [0u8; 8];
    raw.copy_from_slice(&bytes[at..at + 8]);
    i64::from_be_bytes(raw)
}

fn i32_at(bytes: &[u8], at: usize) -> i32 {
    u32_at(bytes, at) as i32
}

fn u32_at(bytes: &[u8], at: usize) -> u32 {
    let mut raw = [0u8; 4];
    raw.copy_from_slice(&bytes[at..at + 4]);
    u32::from_be_bytes(raw)
}

fn u16_at(bytes: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([bytes[at], bytes[at + 1]])
}

/// Writes `offset` into the base offset field of an encoded batch. The field is not
/// covered by the CRC, so the batch stays valid.
///
/// # Panics
/// If `batch` is shorter than a header: a caller bug.
pub fn set_base_offset(batch: &mut [u8], offset: i64) {
    batch[field::BASE_OFFSET..][..8].copy_from_slice(&offset.to_be_bytes());
}

/// Writes a session's request into an encoded batch (`producer_id` = session,
/// `producer_epoch` = -1, `base_sequence` = request) and computes its CRC again, since
/// the CRC covers these fields: a producer numbers a batch when it first sends it.
///
/// # Errors
/// [`BatchError::Truncated`] if `batch` is shorter than a header.
pub fn set_producer(batch: &mut [u8], session: i64, request: i32) -> Result<(), BatchError> {
    if batch.len() < HEADER_BYTES {
        return Err(BatchError::Truncated {
            at: 0,
            needed: HEADER_BYTES,
            available: batch.len(),
        });
    }
    batch[field::PRODUCER_ID..][..8].copy_from_slice(&session.to_be_bytes());
    batch[field::PRODUCER_EPOCH..][..2].copy_from_slice(&(-1i16).to_be_bytes());
    batch[field::BASE_SEQUENCE..][..4].copy_from_slice(&request.to_be_bytes());
    let crc = crc32c::crc32c(&batch[field::ATTRIBUTES..]);
    batch[field::CRC..][..4].copy_from_slice(&crc.to_be_bytes());
    Ok(())
}

/// The tag a Braid log stores in the partition leader epoch field of each of its
/// batches (and seeds its recovery point's CRC with): the partition's identity, so that
/// a batch of another partition's log found in this one (a misdirected write: same
/// offsets, a CRC that holds) is damage, not a record. The topic id in the high half and
/// the partition in the low, so that no two partitions of topics below 65,536 with
/// fewer than 65,536 partitions share a tag (beyond that, a rotation and XOR).
pub fn partition_tag(topic_id: u32, partition: u32) -> i32 {
    (topic_id.rotate_left(16) ^ partition) as i32
}

/// Writes `epoch` into the partition leader epoch field (not covered by the CRC).
///
/// # Panics
/// If `batch` is shorter than a header: a caller bug.
pub fn set_partition_leader_epoch(batch: &mut [u8], epoch: i32) {
    batch[field::PARTITION_LEADER_EPOCH..][..4].copy_from_slice(&epoch.to_be_bytes());
}
