//! The varint-encoded records inside a batch, read without copying.

use crate::varint::{get_varint, get_varlong, VarintFault};

/// Why one record (or header) inside a batch could not be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum RecordFault {
    /// A varint was cut off or overlong; `field` names it.
    BadVarint {
        /// The field being read.
        field: &'static str,
        /// Truncated or overlong.
        fault: VarintFault,
    },
    /// A length was below -1 (or below 0 where null is not allowed).
    BadLength {
        /// The field being read.
        field: &'static str,
        /// The length found.
        length: i32,
    },
    /// A length points past the end of the record.
    Overrun {
        /// The field being read.
        field: &'static str,
    },
    /// The record's fields do not use exactly its declared length.
    LengthMismatch {
        /// Declared body length.
        declared: i32,
        /// Bytes the fields used.
        used: usize,
    },
    /// The offset delta is not the record's index in the batch.
    OffsetDelta {
        /// The index the record has.
        expected: i32,
        /// The delta it carries.
        found: i32,
    },
    /// The record's timestamp overflows or exceeds the batch's max timestamp.
    Timestamp,
}

impl std::fmt::Display for RecordFault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::BadVarint { field, fault } => write!(f, "{field}: varint {fault:?}"),
            Self::BadLength { field, length } => write!(f, "{field}: invalid length {length}"),
            Self::Overrun { field } => write!(f, "{field}: runs past the end of the record"),
            Self::LengthMismatch { declared, used } => {
                write!(f, "declared length {declared} but fields use {used} bytes")
            }
            Self::OffsetDelta { expected, found } => {
                write!(f, "offset delta {found}, expected {expected}")
            }
            Self::Timestamp => f.write_str("timestamp out of range of the batch"),
        }
    }
}

/// One record of a batch, borrowing its key, value and headers from the batch bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Record<'a> {
    /// Record attributes (unused by the format; 0).
    pub attributes: u8,
    /// Timestamp minus the batch's base timestamp (ms).
    pub timestamp_delta: i64,
    /// Offset minus the batch's base offset.
    pub offset_delta: i32,
    /// The key, or `None` for a null key.
    pub key: Option<&'a [u8]>,
    /// The value, or `None` for a null value (a tombstone).
    pub value: Option<&'a [u8]>,
    /// The record headers.
    pub headers: Headers<'a>,
}

/// The headers of a record, decoded lazily.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Headers<'a> {
    count: u32,
    bytes: &'a [u8],
}

impl<'a> Headers<'a> {
    /// Number of headers.
    pub fn len(&self) -> usize {
        self.count as usize
    }

    /// Whether the record has no headers.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Iterates the headers. Each item is a `Result` because the bytes came from
    /// outside; in a validated batch every item is `Ok`.
    pub fn iter(&self) -> HeaderIter<'a> {
        HeaderIter {
            remaining: self.count,
            bytes: self.bytes,
        }
    }
}

/// One record header: a key and an optional value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header<'a> {
    /// Header key (Kafka defines it as a UTF-8 string; Braid keeps the bytes).
    pub key: &'a [u8],
    /// Header value, `None` for null.
    pub value: Option<&'a [u8]>,
}

/// Iterator over [`Headers`].
#[derive(Debug, Clone)]
pub struct HeaderIter<'a> {
    remaining: u32,
    bytes: &'a [u8],
}

impl<'a> Iterator for HeaderIter<'a> {
    type Item = Result<Header<'a>, RecordFault>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.remaining == 0 {
            return None;
        }
        self.remaining -= 1;
        let mut cursor = Cursor {
            bytes: self.bytes,
            at: 0,
        };
        let parsed = parse_header(&mut cursor);
        match parsed {
            Ok(header) => {
                self.bytes = &self.bytes[cursor.at..];
                Some(Ok(header))
            }
            Err(fault) => {
                self.remaining = 0;
                Some(Err(fault))
            }
        }
    }
}

struct Cursor<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Cursor<'a> {
    fn varint(&mut self, field: &'static str) -> Result<i32, RecordFault> {
        let (value, used) = get_varint(&self.bytes[self.at..])
            .map_err(|fault| RecordFault::BadVarint { field, fault })?;
        self.at += used;
        Ok(value)
    }

    fn varlong(&mut self, field: &'static str) -> Result<i64, RecordFault> {
        let (value, used) = get_varlong(&self.bytes[self.at..])
            .map_err(|fault| RecordFault::BadVarint { field, fault })?;
        self.at += used;
        Ok(value)
    }

    fn take(&mut self, len: usize, field: &'static str) -> Result<&'a [u8], RecordFault> {
        let slice = self
            .bytes
            .get(self.at..)
            .and_then(|rest| rest.get(..len))
            .ok_or(RecordFault::Overrun { field })?;
        self.at += len;
        Ok(slice)
    }

    /// A length-prefixed byte string where -1 means null.
    fn nullable_bytes(&mut self, field: &'static str) -> Result<Option<&'a [u8]>, RecordFault> {
        let length = self.varint(field)?;
        match length {
            -1 => Ok(None),
            len if len >= 0 => self.take(len as usize, field).map(Some),
            length => Err(RecordFault::BadLength { field, length }),
        }
    }
}

fn parse_header<'a>(cursor: &mut Cursor<'a>) -> Result<Header<'a>, RecordFault> {
    let key_length = cursor.varint("header key length")?;
    if key_length < 0 {
        return Err(RecordFault::BadLength {
            field: "header key length",
            length: key_length,
        });
    }
    let key = cursor.take(key_length as usize, "header key")?;
    let value = cursor.nullable_bytes("header value")?;
    Ok(Header { key, value })
}

/// Parses the record at the start of `bytes`; returns it and the bytes it used.
///
/// # Errors
/// A [`RecordFault`] saying which field is malformed.
pub fn parse_record(bytes: &[u8]) -> Result<(Record<'_>, usize), RecordFault> {
    let mut outer = Cursor { bytes, at: 0 };
    let declared = outer.varint("record length")?;
    if declared < 0 {
        return Err(RecordFault::BadLength {
            field: "record length",
            length: declared,
        });
    }
    let body = outer.take(declared as usize, "record body")?;
    let mut cursor = Cursor { bytes: body, at: 0 };
    let attributes = cursor.take(1, "record attributes")?[0];
    let timestamp_delta = cursor.varlong("timestamp delta")?;
    let offset_delta = cursor.varint("offset delta")?;
    let key = cursor.nullable_bytes("key")?;
    let value = cursor.nullable_bytes("value")?;
    let header_count = cursor.varint("header count")?;
    if header_count < 0 {
        return Err(RecordFault::BadLength {
            field: "header count",
            length: header_count,
        });
    }
    let headers_start = cursor.at;
    for _ in 0..header_count {
        parse_header(&mut cursor)?;
    }
    if cursor.at != body.len() {
        return Err(RecordFault::LengthMismatch {
            declared,
            used: cursor.at,
        });
    }
    let record = Record {
        attributes,
        timestamp_delta,
        offset_delta,
        key,
        value,
        headers: Headers {
            count: header_count as u32,
            bytes: &body[headers_start..],
        },
    };
    Ok((record, outer.at))
}
