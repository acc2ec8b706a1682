//! Bus frames: every message between nodes travels as one.
//!
//! | byte | size | field |
//! | ---: | ---: | --- |
//! | 0 | 4 | `length: u32`: bytes after this field |
//! | 4 | 8 | `group: u64`: the consensus group (0 is the metadata group) |
//! | 12 | 1 | `kind: u8`: what the payload is |
//! | 13 | 4 | `checksum: u32`: CRC32C of group, kind and payload |
//! | 17 | … | payload |
//!
//! A frame that fails its checksum or exceeds the size limit cannot be trusted, and
//! neither can anything after it on the stream: the link is closed.

/// Bytes of the frame header, length field included.
pub const FRAME_HEADER_BYTES: usize = 17;

/// Frame kinds from this one up belong to the bus itself; `send` refuses them.
pub const KIND_BUS_RESERVED: u8 = 0xF0;

/// Acceptor to dialer, first on every link it took into the bundle: the dialer counts a
/// link up only on it, so a link the acceptor refuses after the handshake never makes
/// the dialer believe its bundle is up.
pub const KIND_LINK_TAKEN: u8 = 0xFE;

/// Sent by a link's writer after a third of the heartbeat timeout without a frame; a
/// reader that hears nothing for a whole heartbeat timeout closes the link (idle
/// half-open links are found, not kept forever).
pub const KIND_PING: u8 = 0xFD;

/// A frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    /// The consensus group.
    pub group: u64,
    /// What the payload is.
    pub kind: u8,
    /// The payload.
    pub payload: Vec<u8>,
}

/// Why a stream of frames cannot go on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FrameError {
    /// The length field exceeds the limit.
    #[error("frame of {length} bytes exceeds the limit of {max}")]
    TooLarge {
        /// The length field.
        length: u32,
        /// The limit.
        max: u32,
    },
    /// The length field is shorter than the header.
    #[error("frame length {0} is shorter than its header")]
    TooShort(u32),
    /// The checksum does not match.
    #[error("frame checksum mismatch: stored {stored:#010x}, computed {computed:#010x}")]
    Checksum {
        /// In the frame.
        stored: u32,
        /// Of the bytes.
        computed: u32,
    },
}

impl Frame {
    /// The frame's length field: bytes after it. A `u64`, so it never wraps.
    pub fn length_field(&self) -> u64 {
        (FRAME_HEADER_BYTES - 4) as u64 + self.payload.len() as u64
    }

    /// Appends the frame's wire form. The bus refuses a frame above its limit at
    /// `send`, so the length always fits; a length that would not is written as
    /// `u32::MAX`, which every receiver refuses, never as a wrapped small number.
    pub fn encode(&self, out: &mut Vec<u8>) {
        let length = u32::try_from(self.length_field()).unwrap_or(u32::MAX);
        out.extend_from_slice(&length.to_be_bytes());
        let start = out.len();
        out.extend_from_slice(&self.group.to_be_bytes());
        out.push(self.kind);
        let checksum = crc32c::crc32c_append(crc32c::crc32c(&out[start..]), &self.payload);
        out.extend_from_slice(&checksum.to_be_bytes());
        out.extend_from_slice(&self.payload);
    }

    /// Takes one frame from the start of `buffered`: `Ok(Some((frame, used)))`, or
    /// `Ok(None)` while more bytes are needed.
    ///
    /// # Errors
    /// [`FrameError`]: the link must be closed.
    pub fn decode(buffered: &[u8], max: u32) -> Result<Option<(Self, usize)>, FrameError> {
        let Some(raw) = buffered.get(..4) else {
            return Ok(None);
        };
        let length = u32::from_be_bytes([raw[0], raw[1], raw[2], raw[3]]);
        if length > max {
            return Err(FrameError::TooLarge { length, max });
        }
        if (length as usize) < FRAME_HEADER_BYTES - 4 {
            return Err(FrameError::TooShort(length));
        }
        let total = 4 + length as usize;
        let Some(frame) = buffered.get(..total) else {
            return Ok(None);
        };
        let mut group = [0u8; 8];
        group.copy_from_slice(&frame[4..12]);
        let kind = frame[12];
        let stored = u32::from_be_bytes([frame[13], frame[14], frame[15], frame[16]]);
        let payload = &frame[FRAME_HEADER_BYTES..];
        let computed = crc32c::crc32c_append(crc32c::crc32c(&frame[4..13]), payload);
        if stored != computed {
            return Err(FrameError::Checksum { stored, computed });
        }
        let decoded = Self {
            group: u64::from_be_bytes(group),
            kind,
            payload: payload.to_vec(),
        };
        Ok(Some((decoded, total)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip_and_damage_closes_the_link() {
        let frame = Frame {
            group: 42,
            kind: 7,
            payload: b"prepare".to_vec(),
        };
        let mut bytes = Vec::new();
        frame.encode(&mut bytes);
        frame.encode(&mut bytes);
        let (first, used) = Frame::decode(&bytes, 1 << 20).unwrap().unwrap();
        assert_eq!(first, frame);
        assert_eq!(
            Frame::decode(&bytes[used..], 1 << 20).unwrap().unwrap().0,
            frame
        );
        for cut in 0..used {
            assert_eq!(
                Frame::decode(&bytes[..cut], 1 << 20),
                Ok(None),
                "cut at {cut}"
            );
        }
        for at in 4..used {
            let mut damaged = bytes.clone();
            damaged[at] ^= 0x10;
            assert!(
                matches!(
                    Frame::decode(&damaged, 1 << 20),
                    Err(FrameError::Checksum { .. })
                ),
                "flip at {at}"
            );
        }
        assert_eq!(
            Frame::decode(&bytes, 10),
            Err(FrameError::TooLarge {
                length: used as u32 - 4,
                max: 10
            })
        );
        assert_eq!(
            Frame::decode(&[0, 0, 0, 3], 100),
            Err(FrameError::TooShort(3))
        );
    }
}
