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

use bytes::{Buf, Bytes, BytesMut};

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
    /// The payload. `Bytes`, so one prepare sent to every peer is one buffer shared by
    /// reference, and a received payload is a slice of the bytes read, not a copy.
    pub payload: Bytes,
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

/// Payloads below this many bytes are copied out of the read buffer on receipt; larger
/// ones are sliced from it when the frame is at least half of the buffer's capacity. A
/// frame kept by the consumer must not pin a buffer much larger than itself (the
/// delivery budget counts the frame, not the buffer).
pub const ZERO_COPY_PAYLOAD_BYTES_MIN: usize = 8 * 1024;

impl Frame {
    /// A frame of `payload`, copied into a `Bytes` (the shared form is `Frame { .. }`
    /// with a `Bytes` the caller already has).
    pub fn new(group: u64, kind: u8, payload: impl Into<Bytes>) -> Self {
        Self {
            group,
            kind,
            payload: payload.into(),
        }
    }

    /// The frame's length field: bytes after it. A `u64`, so it never wraps.
    pub fn length_field(&self) -> u64 {
        (FRAME_HEADER_BYTES - 4) as u64 + self.payload.len() as u64
    }

    /// The frame's header, checksum included: written before the payload, so header
    /// and payload can go out in one vectored write without copying the payload. The
    /// bus refuses a frame above its limit at `send`, so the length always fits; a
    /// length that would not is written as `u32::MAX`, which every receiver refuses,
    /// never as a wrapped small number.
    pub fn header(&self) -> [u8; FRAME_HEADER_BYTES] {
        let length = u32::try_from(self.length_field()).unwrap_or(u32::MAX);
        let mut header = [0u8; FRAME_HEADER_BYTES];
        header[..4].copy_from_slice(&length.to_be_bytes());
        header[4..12].copy_from_slice(&self.group.to_be_bytes());
        header[12] = self.kind;
        let checksum = crc32c::crc32c_append(crc32c::crc32c(&header[4..13]), &self.payload);
        header[13..].copy_from_slice(&checksum.to_be_bytes());
        header
    }

    /// Appends the frame's wire form.
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.header());
        out.extend_from_slice(&self.payload);
    }

    /// Checks the frame at the start of `buffered`: `Ok(Some(total bytes))` once it is
    /// whole and intact, `Ok(None)` while more bytes are needed.
    ///
    /// # Errors
    /// [`FrameError`]: the link must be closed.
    pub fn check(buffered: &[u8], max: u32) -> Result<Option<usize>, FrameError> {
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
        let stored = u32::from_be_bytes([frame[13], frame[14], frame[15], frame[16]]);
        let payload = &frame[FRAME_HEADER_BYTES..];
        let computed = crc32c::crc32c_append(crc32c::crc32c(&frame[4..13]), payload);
        if stored != computed {
            return Err(FrameError::Checksum { stored, computed });
        }
        Ok(Some(total))
    }

    /// Takes one frame from the front of `buffered`, or `Ok(None)` (leaving `buffered`
    /// as it was) while more bytes are needed. A large payload that fills at least half
    /// the buffer is a slice of its memory (see [`ZERO_COPY_PAYLOAD_BYTES_MIN`]).
    ///
    /// # Errors
    /// [`FrameError`]: the link must be closed.
    pub fn decode(buffered: &mut BytesMut, max: u32) -> Result<Option<Self>, FrameError> {
        let Some(total) = Self::check(buffered, max)? else {
            return Ok(None);
        };
        let mut group = [0u8; 8];
        group.copy_from_slice(&buffered[4..12]);
        let kind = buffered[12];
        // Sliced only when the frame is at least half of what the buffer holds, so a
        // kept payload pins at most about twice its own size.
        let large = total - FRAME_HEADER_BYTES >= ZERO_COPY_PAYLOAD_BYTES_MIN;
        let payload = if large && total * 2 >= buffered.capacity() {
            let mut frame = buffered.split_to(total);
            frame.advance(FRAME_HEADER_BYTES);
            frame.freeze()
        } else {
            let payload = Bytes::copy_from_slice(&buffered[FRAME_HEADER_BYTES..total]);
            buffered.advance(total);
            payload
        };
        Ok(Some(Self {
            group: u64::from_be_bytes(group),
            kind,
            payload,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode_all(bytes: &[u8], max: u32) -> Result<Vec<Frame>, FrameError> {
        let mut buffered = BytesMut::from(bytes);
        let mut frames = Vec::new();
        while let Some(frame) = Frame::decode(&mut buffered, max)? {
            frames.push(frame);
        }
        Ok(frames)
    }

    #[test]
    fn frames_round_trip_and_damage_closes_the_link() {
        let frame = Frame::new(42, 7, &b"prepare"[..]);
        let mut bytes = Vec::new();
        frame.encode(&mut bytes);
        frame.encode(&mut bytes);
        let used = bytes.len() / 2;
        assert_eq!(
            decode_all(&bytes, 1 << 20).unwrap(),
            vec![frame.clone(), frame.clone()]
        );
        for cut in 0..used {
            let mut partial = BytesMut::from(&bytes[..cut]);
            assert_eq!(
                Frame::decode(&mut partial, 1 << 20),
                Ok(None),
                "cut at {cut}"
            );
            assert_eq!(partial.len(), cut, "a partial frame stays buffered");
        }
        for at in 4..used {
            let mut damaged = bytes.clone();
            damaged[at] ^= 0x10;
            assert!(
                matches!(
                    decode_all(&damaged, 1 << 20),
                    Err(FrameError::Checksum { .. })
                ),
                "flip at {at}"
            );
        }
        assert_eq!(
            decode_all(&bytes, 10),
            Err(FrameError::TooLarge {
                length: used as u32 - 4,
                max: 10
            })
        );
        assert_eq!(decode_all(&[0, 0, 0, 3], 100), Err(FrameError::TooShort(3)));
    }

    #[test]
    fn large_payloads_are_sliced_from_the_read_buffer_and_small_ones_copied() {
        let large = Frame::new(1, 1, vec![9u8; ZERO_COPY_PAYLOAD_BYTES_MIN]);
        let small = Frame::new(1, 1, vec![8u8; ZERO_COPY_PAYLOAD_BYTES_MIN - 1]);
        let mut bytes = Vec::new();
        large.encode(&mut bytes);
        small.encode(&mut bytes);
        let mut buffered = BytesMut::from(&bytes[..]);
        let region = buffered.as_ptr() as usize..buffered.as_ptr() as usize + bytes.len();
        let first = Frame::decode(&mut buffered, 1 << 20).unwrap().unwrap();
        let second = Frame::decode(&mut buffered, 1 << 20).unwrap().unwrap();
        assert_eq!((&first, &second), (&large, &small));
        assert!(
            region.contains(&(first.payload.as_ptr() as usize)),
            "sliced, not copied"
        );
        assert!(
            !region.contains(&(second.payload.as_ptr() as usize)),
            "copied out"
        );
        assert!(buffered.is_empty());
    }

    #[test]
    fn the_header_is_the_encoding_without_its_payload() {
        let frame = Frame::new(u64::MAX, 3, vec![1, 2, 3]);
        let mut bytes = Vec::new();
        frame.encode(&mut bytes);
        assert_eq!(&bytes[..FRAME_HEADER_BYTES], &frame.header());
        assert_eq!(&bytes[FRAME_HEADER_BYTES..], &[1, 2, 3]);
    }
}
