//! Primitives of the native protocol's bodies: big-endian integers, strings, byte
//! strings and arrays, with a strict reader whose errors carry the byte offset.
//!
//! | type | encoding |
//! | --- | --- |
//! | `u8` `u16` `u32` `u64` `i64` | big-endian, fixed size |
//! | string | `u16` length, then that many bytes of UTF-8 |
//! | bytes | `u32` length, then the bytes |
//! | array of T | `u32` count, then the items |
//! | option of T | `u8` 0 (absent) or 1 (present), then T |

/// Why a frame or body could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WireError {
    /// The input ended inside a field.
    #[error("truncated at byte {at}: {field} needs {needed} bytes, {available} left")]
    Truncated {
        /// Byte offset of the field in the body.
        at: usize,
        /// The field.
        field: &'static str,
        /// Bytes it needs.
        needed: usize,
        /// Bytes left.
        available: usize,
    },
    /// A string is not UTF-8.
    #[error("field {field} at byte {at} is not UTF-8")]
    NotUtf8 {
        /// Byte offset of the string.
        at: usize,
        /// The field.
        field: &'static str,
    },
    /// A field holds a value outside its range.
    #[error("field {field} at byte {at} has invalid value {value}")]
    BadValue {
        /// Byte offset of the field.
        at: usize,
        /// The field.
        field: &'static str,
        /// The value found.
        value: u64,
    },
    /// A number of a well-formed request is outside the range its field takes (a
    /// bad argument, like [`WireError::InvalidName`]).
    #[error("{field} at byte {at} is {value}, out of range: {range}")]
    OutOfRange {
        /// Byte offset of the field.
        at: usize,
        /// The field.
        field: &'static str,
        /// The value found.
        value: u64,
        /// The values the field takes.
        range: &'static str,
    },
    /// A stream, topic or group name breaks the name rule (1 to 249 bytes of
    /// `a-z A-Z 0-9 - _ .`): a well-formed request with a bad argument.
    #[error("{field} at byte {at} is not a valid name: {reason}")]
    InvalidName {
        /// Byte offset of the field.
        at: usize,
        /// The field.
        field: &'static str,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// Bytes are left after the last field.
    #[error("{extra} unexpected bytes after the body at byte {at}")]
    TrailingBytes {
        /// Where they start.
        at: usize,
        /// How many.
        extra: usize,
    },
    /// An array declares more items than its bytes can hold.
    #[error("field {field} at byte {at} declares {count} items")]
    TooManyItems {
        /// Byte offset of the count.
        at: usize,
        /// The field.
        field: &'static str,
        /// The count found.
        count: u32,
    },
}

/// Reads fields from a body, front to back.
#[derive(Debug, Clone)]
pub struct WireReader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> WireReader<'a> {
    /// A reader at the start of `bytes`.
    pub fn new(bytes: &'a [u8]) -> Self {
        Self { bytes, at: 0 }
    }

    /// Bytes read so far.
    pub fn position(&self) -> usize {
        self.at
    }

    /// Bytes left.
    pub fn remaining(&self) -> usize {
        self.bytes.len() - self.at
    }

    /// Takes `len` raw bytes.
    ///
    /// # Errors
    /// [`WireError::Truncated`].
    pub fn take(&mut self, len: usize, field: &'static str) -> Result<&'a [u8], WireError> {
        let available = self.remaining();
        if len > available {
            return Err(WireError::Truncated {
                at: self.at,
                field,
                needed: len,
                available,
            });
        }
        let slice = &self.bytes[self.at..self.at + len];
        self.at += len;
        Ok(slice)
    }

    fn array<const N: usize>(&mut self, field: &'static str) -> Result<[u8; N], WireError> {
        let mut raw = [0u8; N];
        raw.copy_from_slice(self.take(N, field)?);
        Ok(raw)
    }

    /// Reads a `u8`.
    ///
    /// # Errors
    /// [`WireError::Truncated`].
    pub fn u8(&mut self, field: &'static str) -> Result<u8, WireError> {
        Ok(self.array::<1>(field)?[0])
    }

    /// Reads a `u16`.
    ///
    /// # Errors
    /// [`WireError::Truncated`].
    pub fn u16(&mut self, field: &'static str) -> Result<u16, WireError> {
        Ok(u16::from_be_bytes(self.array(field)?))
    }

    /// Reads a `u32`.
    ///
    /// # Errors
    /// [`WireError::Truncated`].
    pub fn u32(&mut self, field: &'static str) -> Result<u32, WireError> {
        Ok(u32::from_be_bytes(self.array(field)?))
    }

    /// Reads a `u64`.
    ///
    /// # Errors
    /// [`WireError::Truncated`].
    pub fn u64(&mut self, field: &'static str) -> Result<u64, WireError> {
        Ok(u64::from_be_bytes(self.array(field)?))
    }

    /// Reads an `i64`.
    ///
    /// # Errors
    /// [`WireError::Truncated`].
    pub fn i64(&mut self, field: &'static str) -> Result<i64, WireError> {
        Ok(i64::from_be_bytes(self.array(field)?))
    }

    /// Reads a `u8` that must be 0 or 1.
    ///
    /// # Errors
    /// [`WireError::Truncated`], [`WireError::BadValue`].
    pub fn bool(&mut self, field: &'static str) -> Result<bool, WireError> {
        let at = self.at;
        match self.u8(field)? {
            0 => Ok(false),
            1 => Ok(true),
            value => Err(WireError::BadValue {
                at,
                field,
                value: value.into(),
            }),
        }
    }

    /// Reads a string (`u16` length, UTF-8).
    ///
    /// # Errors
    /// [`WireError::Truncated`], [`WireError::NotUtf8`].
    pub fn string(&mut self, field: &'static str) -> Result<&'a str, WireError> {
        let len = self.u16(field)? as usize;
        let at = self.at;
        let bytes = self.take(len, field)?;
        std::str::from_utf8(bytes).map_err(|_| WireError::NotUtf8 { at, field })
    }

    /// Reads a byte string (`u32` length).
    ///
    /// # Errors
    /// [`WireError::Truncated`].
    pub fn bytes(&mut self, field: &'static str) -> Result<&'a [u8], WireError> {
        let len = self.u32(field)? as usize;
        self.take(len, field)
    }

    /// Reads an array count, refusing one that cannot fit in the bytes left when each
    /// item takes at least `item_bytes_min` bytes.
    ///
    /// # Errors
    /// [`WireError::Truncated`], [`WireError::TooManyItems`].
    pub fn count(&mut self, field: &'static str, item_bytes_min: usize) -> Result<u32, WireError> {
        let at = self.at;
        let count = self.u32(field)?;
        if (count as usize).saturating_mul(item_bytes_min.max(1)) > self.remaining() {
            return Err(WireError::TooManyItems { at, field, count });
        }
        Ok(count)
    }

    /// Checks that the whole body was read.
    ///
    /// # Errors
    /// [`WireError::TrailingBytes`].
    pub fn finish(&self) -> Result<(), WireError> {
        match self.remaining() {
            0 => Ok(()),
            extra => Err(WireError::TrailingBytes { at: self.at, extra }),
        }
    }
}

/// Appends fields to a body.
pub trait WireWrite {
    /// Appends a `u8`.
    fn put_u8_be(&mut self, value: u8);
    /// Appends a `u16`.
    fn put_u16_be(&mut self, value: u16);
    /// Appends a `u32`.
    fn put_u32_be(&mut self, value: u32);
    /// Appends a `u64`.
    fn put_u64_be(&mut self, value: u64);
    /// Appends an `i64`.
    fn put_i64_be(&mut self, value: i64);
    /// Appends a string. Strings longer than `u16::MAX` bytes are cut at a character
    /// boundary below it: names are validated far shorter before they reach here.
    fn put_string(&mut self, value: &str);
    /// Appends a byte string.
    fn put_bytes(&mut self, value: &[u8]);
}

impl WireWrite for Vec<u8> {
    fn put_u8_be(&mut self, value: u8) {
        self.push(value);
    }
    fn put_u16_be(&mut self, value: u16) {
        self.extend_from_slice(&value.to_be_bytes());
    }
    fn put_u32_be(&mut self, value: u32) {
        self.extend_from_slice(&value.to_be_bytes());
    }
    fn put_u64_be(&mut self, value: u64) {
        self.extend_from_slice(&value.to_be_bytes());
    }
    fn put_i64_be(&mut self, value: i64) {
        self.extend_from_slice(&value.to_be_bytes());
    }
    fn put_string(&mut self, value: &str) {
        let mut end = value.len().min(u16::MAX as usize);
        while !value.is_char_boundary(end) {
            end -= 1;
        }
        self.put_u16_be(end as u16);
        self.extend_from_slice(&value.as_bytes()[..end]);
    }
    fn put_bytes(&mut self, value: &[u8]) {
        self.put_u32_be(value.len() as u32);
        self.extend_from_slice(value);
    }
}
