//! Building a batch record by record.

use super::header::{field, BatchHeader, HEADER_BYTES, MAGIC};
use crate::varint::{put_varint, put_varlong, varint_len, varlong_len};

/// Builds an uncompressed batch. Records get offset deltas 0, 1, 2, ... in push order;
/// the base offset is left 0 for the log to assign.
#[derive(Debug, Clone)]
pub struct BatchBuilder {
    bytes: Vec<u8>,
    base_timestamp: i64,
    max_timestamp: i64,
    record_count: i32,
    producer_id: i64,
    producer_epoch: i16,
    base_sequence: i32,
}

impl BatchBuilder {
    /// A builder whose timestamps are relative to `base_timestamp` (ms since the epoch;
    /// use the first record's timestamp).
    pub fn new(base_timestamp: i64) -> Self {
        Self::with_capacity(base_timestamp, 0)
    }

    /// As [`BatchBuilder::new`], reserving room for `capacity` bytes of records.
    pub fn with_capacity(base_timestamp: i64, capacity: usize) -> Self {
        let mut bytes = Vec::with_capacity(HEADER_BYTES + capacity);
        bytes.resize(HEADER_BYTES, 0);
        Self {
            bytes,
            base_timestamp,
            max_timestamp: i64::MIN,
            record_count: 0,
            producer_id: -1,
            producer_epoch: -1,
            base_sequence: -1,
        }
    }

    /// Marks the batch as request `base_sequence` of session `producer_id`, which makes
    /// a retried produce idempotent.
    pub fn producer(&mut self, producer_id: i64, producer_epoch: i16, base_sequence: i32) {
        self.producer_id = producer_id;
        self.producer_epoch = producer_epoch;
        self.base_sequence = base_sequence;
    }

    /// Appends a record.
    ///
    /// # Panics
    /// If the batch would hold more than `i32::MAX` records or bytes, or a key, value or
    /// header is longer than `i32::MAX` bytes: limits far beyond any frame a node
    /// accepts, so reaching them is a caller bug.
    pub fn push(
        &mut self,
        key: Option<&[u8]>,
        value: Option<&[u8]>,
        headers: &[(&[u8], Option<&[u8]>)],
        timestamp: i64,
    ) {
        let timestamp_delta = timestamp.wrapping_sub(self.base_timestamp);
        let offset_delta = self.record_count;
        let body_len = 1
            + varlong_len(timestamp_delta)
            + varint_len(offset_delta)
            + nullable_len(key)
            + nullable_len(value)
            + varint_len(len_i32(headers.len()))
            + headers
                .iter()
                .map(|(k, v)| varint_len(len_i32(k.len())) + k.len() + nullable_len(*v))
                .sum::<usize>();
        let out = &mut self.bytes;
        put_varint(out, len_i32(body_len));
        out.push(0);
        put_varlong(out, timestamp_delta);
        put_varint(out, offset_delta);
        put_nullable(out, key);
        put_nullable(out, value);
        put_varint(out, len_i32(headers.len()));
        for (header_key, header_value) in headers {
            put_varint(out, len_i32(header_key.len()));
            out.extend_from_slice(header_key);
            put_nullable(out, *header_value);
        }
        self.max_timestamp = self.max_timestamp.max(timestamp);
        self.record_count = self
            .record_count
            .checked_add(1)
            .unwrap_or_else(|| panic!("more than i32::MAX records in one batch"));
    }

    /// Records pushed so far.
    pub fn record_count(&self) -> u32 {
        self.record_count as u32
    }

    /// Bytes the batch takes so far, header included.
    pub fn len_bytes(&self) -> usize {
        self.bytes.len()
    }

    /// Whether no record was pushed.
    pub fn is_empty(&self) -> bool {
        self.record_count == 0
    }

    /// Writes the header and CRC and returns the batch. A batch must hold at least one
    /// record to be valid; an empty one is returned as is and fails validation.
    pub fn finish(mut self) -> Vec<u8> {
        let header = BatchHeader {
            base_offset: 0,
            batch_length: len_i32(self.bytes.len() - field::PARTITION_LEADER_EPOCH),
            partition_leader_epoch: -1,
            magic: MAGIC,
            crc: 0,
            attributes: 0,
            last_offset_delta: self.record_count - 1,
            base_timestamp: self.base_timestamp,
            max_timestamp: if self.record_count == 0 {
                self.base_timestamp
            } else {
                self.max_timestamp
            },
            producer_id: self.producer_id,
            producer_epoch: self.producer_epoch,
            base_sequence: self.base_sequence,
            record_count: self.record_count,
        };
        header.encode_into(&mut self.bytes);
        let crc = crc32c::crc32c(&self.bytes[field::ATTRIBUTES..]);
        self.bytes[field::CRC..][..4].copy_from_slice(&crc.to_be_bytes());
        self.bytes
    }
}

fn len_i32(len: usize) -> i32 {
    i32::try_from(len).unwrap_or_else(|_| panic!("length {len} exceeds the batch format"))
}

fn nullable_len(bytes: Option<&[u8]>) -> usize {
    match bytes {
        None => varint_len(-1),
        Some(bytes) => varint_len(len_i32(bytes.len())) + bytes.len(),
    }
}

fn put_nullable(out: &mut Vec<u8>, bytes: Option<&[u8]>) {
    match bytes {
        None => put_varint(out, -1),
        Some(bytes) => {
            put_varint(out, len_i32(bytes.len()));
            out.extend_from_slice(bytes);
        }
    }
}
