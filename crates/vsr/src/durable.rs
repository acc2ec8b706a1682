//! What a replica keeps on disk besides its journal, and the byte layouts the shell
//! stores it in: every one checksummed, so damage is found on read and never applied.
//!
//! Layouts are fixed-width and big-endian. A shell keeps the durable state in two slots
//! and writes the older one ([`DurableState::encode`] takes a sequence number); on
//! restart [`DurableState::newest`] picks the newest slot that decodes. A write torn by
//! a crash damages only the slot being written, and nothing was sent on its behalf
//! (view-scoped messages wait for the write to complete), so the other slot is a state
//! the replica may resume from.

use crate::message::{checksum, Checksum, Header, Operation};

/// Why stored bytes were refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DecodeError {
    /// Fewer bytes than the layout needs.
    #[error("{what}: {len} bytes, the layout needs {needed}")]
    Truncated {
        /// What was decoded.
        what: &'static str,
        /// Bytes given.
        len: usize,
        /// Bytes needed.
        needed: usize,
    },
    /// More bytes than the layout holds.
    #[error("{what}: {extra} bytes after the end")]
    TrailingBytes {
        /// What was decoded.
        what: &'static str,
        /// Bytes left over.
        extra: usize,
    },
    /// The magic number is not this layout's.
    #[error("{what}: bad magic {found:#x}")]
    BadMagic {
        /// What was decoded.
        what: &'static str,
        /// The magic found.
        found: u32,
    },
    /// The checksum does not match the bytes.
    #[error("{what}: checksum mismatch")]
    Checksum {
        /// What was decoded.
        what: &'static str,
    },
    /// A field holds a value the layout does not allow.
    #[error("{what}: invalid field {field}")]
    InvalidField {
        /// What was decoded.
        what: &'static str,
        /// The field.
        field: &'static str,
    },
    /// No copy of the durable state survived: the replica must not start from it.
    #[error("no intact copy of the durable state among {slots} slots")]
    NoIntactState {
        /// Slots read.
        slots: usize,
    },
}

/// What a replica must keep across crashes besides its journal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DurableState {
    /// The highest view it took part in.
    pub view: u64,
    /// The last view in which it was normal (its journal is that view's log).
    pub log_view: u64,
    /// The highest op it knows is committed.
    pub commit: u64,
    /// Journal entries above this op may be acknowledged writes lost to a power loss
    /// (`u64::MAX`: none). Kept here so that a process crash after a power loss does
    /// not make an untrusted journal look trusted again.
    pub journal_trusted_through: u64,
    /// It lost its disk: `view` and `log_view` were made up at the restart, not kept,
    /// so they prove nothing about what it acknowledged before. It abstains from view
    /// changes until it is normal in a view as new as any a quorum of its peers names.
    /// (An untrusted journal alone, even from op 0, leaves the log view its own: a
    /// vote of an older log view still says it never acknowledged a newer view's op.)
    pub views_lost: bool,
}

impl Default for DurableState {
    fn default() -> Self {
        Self {
            view: 0,
            log_view: 0,
            commit: 0,
            journal_trusted_through: u64::MAX,
            views_lost: false,
        }
    }
}

/// The first layout, without flags: read, never written.
const STATE_MAGIC_V1: u32 = 0x4252_5653; // "BRVS"
const STATE_MAGIC: u32 = 0x4252_5632; // "BRV2"
/// The one flag of the second layout; every other bit must be clear.
const FLAG_VIEWS_LOST: u64 = 1;
const CHECKPOINT_MAGIC: u32 = 0x4252_4350; // "BRCP"

impl DurableState {
    /// Bytes of one encoded slot: magic, sequence, view, log view, commit, journal
    /// trusted through, flags, checksum.
    pub const ENCODED_BYTES: usize = 4 + 6 * 8 + 16;
    /// Bytes of a slot of the first layout (no flags word), which [`Self::decode`]
    /// still reads: its `views_lost` is what a journal untrusted from op 0 meant then.
    pub const ENCODED_BYTES_V1: usize = 4 + 5 * 8 + 16;

    /// The slot bytes for this state, with the write's sequence number (higher is newer).
    pub fn encode(&self, sequence: u64) -> [u8; Self::ENCODED_BYTES] {
        let mut out = [0u8; Self::ENCODED_BYTES];
        out[0..4].copy_from_slice(&STATE_MAGIC.to_be_bytes());
        let flags = if self.views_lost { FLAG_VIEWS_LOST } else { 0 };
        let words = [
            sequence,
            self.view,
            self.log_view,
            self.commit,
            self.journal_trusted_through,
            flags,
        ];
        for (i, word) in words.iter().enumerate() {
            out[4 + i * 8..12 + i * 8].copy_from_slice(&word.to_be_bytes());
        }
        let summed = Self::ENCODED_BYTES - 16;
        let sum = checksum(&out[..summed]);
        out[summed..].copy_from_slice(&sum.to_be_bytes());
        out
    }

    /// Reads one slot of either layout, exactly its bytes: `(sequence, state)`.
    ///
    /// # Errors
    /// The bytes are not an intact slot.
    pub fn decode(bytes: &[u8]) -> Result<(u64, Self), DecodeError> {
        let (decoded, len) = Self::decode_prefix(bytes)?;
        exact_len("durable state", bytes, len)?;
        Ok(decoded)
    }

    /// Reads the slot at the start of `bytes` (a region that may hold more, as a
    /// states table's slot does): `((sequence, state), bytes it took)`.
    ///
    /// # Errors
    /// The bytes do not start with an intact slot.
    pub fn decode_prefix(bytes: &[u8]) -> Result<((u64, Self), usize), DecodeError> {
        const WHAT: &str = "durable state";
        let mut reader = Reader::new(WHAT, bytes);
        let magic = reader.u32()?;
        let len = match magic {
            STATE_MAGIC => Self::ENCODED_BYTES,
            STATE_MAGIC_V1 => Self::ENCODED_BYTES_V1,
            found => return Err(DecodeError::BadMagic { what: WHAT, found }),
        };
        let Some(bytes) = bytes.get(..len) else {
            return Err(DecodeError::Truncated {
                what: WHAT,
                len: bytes.len(),
                needed: len,
            });
        };
        let sequence = reader.u64()?;
        let mut state = Self {
            view: reader.u64()?,
            log_view: reader.u64()?,
            commit: reader.u64()?,
            journal_trusted_through: reader.u64()?,
            views_lost: false,
        };
        if magic == STATE_MAGIC {
            let flags = reader.u64()?;
            if flags & !FLAG_VIEWS_LOST != 0 {
                return Err(DecodeError::InvalidField {
                    what: WHAT,
                    field: "flags",
                });
            }
            state.views_lost = flags & FLAG_VIEWS_LOST != 0;
        } else {
            // The first layout said "lost its disk" with a journal untrusted from 0.
            state.views_lost = state.journal_trusted_through == 0;
        }
        if reader.u128()? != checksum(&bytes[..len - 16]) {
            return Err(DecodeError::Checksum { what: WHAT });
        }
        if state.log_view > state.view {
            return Err(DecodeError::InvalidField {
                what: WHAT,
                field: "log_view",
            });
        }
        Ok(((sequence, state), len))
    }

    /// The newest intact state among the slots read back: `(sequence, state)`.
    ///
    /// # Errors
    /// [`DecodeError::NoIntactState`] if no slot decodes.
    pub fn newest(slots: &[&[u8]]) -> Result<(u64, Self), DecodeError> {
        slots
            .iter()
            .filter_map(|slot| Self::decode(slot).ok())
            .max_by_key(|(sequence, _)| *sequence)
            .ok_or(DecodeError::NoIntactState { slots: slots.len() })
    }
}

/// A snapshot of the applied state at `header.op`: what a checkpoint stores and what
/// state transfer sends. `checksum` covers the header's checksum and the state.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Checkpoint {
    /// Header of the last op applied into `state`.
    pub header: Header,
    /// The replicated state.
    pub state: Vec<u8>,
    /// Checksum of `header.checksum` and `state`.
    pub checksum: Checksum,
}

impl Checkpoint {
    /// A checkpoint with its checksum.
    pub fn new(header: Header, state: Vec<u8>) -> Self {
        let checksum = Self::compute_checksum(&header, &state);
        Self {
            header,
            state,
            checksum,
        }
    }

    fn compute_checksum(header: &Header, state: &[u8]) -> Checksum {
        let mut bytes = Vec::with_capacity(16 + state.len());
        bytes.extend_from_slice(&header.checksum.to_be_bytes());
        bytes.extend_from_slice(state);
        checksum(&bytes)
    }

    /// Whether the header and the state are intact.
    pub fn valid(&self) -> bool {
        self.header.valid() && self.checksum == Self::compute_checksum(&self.header, &self.state)
    }

    /// The stored bytes: magic, header, state length, state, checksum.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(4 + Header::ENCODED_BYTES + 8 + self.state.len() + 16);
        out.extend_from_slice(&CHECKPOINT_MAGIC.to_be_bytes());
        out.extend_from_slice(&self.header.encode());
        out.extend_from_slice(&(self.state.len() as u64).to_be_bytes());
        out.extend_from_slice(&self.state);
        out.extend_from_slice(&self.checksum.to_be_bytes());
        out
    }

    /// Reads stored bytes back.
    ///
    /// # Errors
    /// The bytes are not an intact checkpoint.
    pub fn decode(bytes: &[u8]) -> Result<Self, DecodeError> {
        const WHAT: &str = "checkpoint";
        let mut reader = Reader::new(WHAT, bytes);
        let magic = reader.u32()?;
        if magic != CHECKPOINT_MAGIC {
            return Err(DecodeError::BadMagic {
                what: WHAT,
                found: magic,
            });
        }
        let header = Header::decode(reader.take(Header::ENCODED_BYTES)?)?;
        let len = usize::try_from(reader.u64()?).map_err(|_| DecodeError::InvalidField {
            what: WHAT,
            field: "state length",
        })?;
        let state = reader.take(len)?.to_vec();
        let sum = reader.u128()?;
        reader.finish()?;
        let checkpoint = Self {
            header,
            state,
            checksum: sum,
        };
        if !checkpoint.valid() {
            return Err(DecodeError::Checksum { what: WHAT });
        }
        Ok(checkpoint)
    }
}

impl Header {
    /// Bytes of an encoded header: the fields its checksum covers, then the checksum.
    pub const ENCODED_BYTES: usize = Self::FIELDS_BYTES + 16;

    /// The header as stored in a journal or checkpoint.
    pub fn encode(&self) -> [u8; Self::ENCODED_BYTES] {
        let mut out = [0u8; Self::ENCODED_BYTES];
        out[..Self::FIELDS_BYTES].copy_from_slice(&self.fields());
        out[Self::FIELDS_BYTES..].copy_from_slice(&self.checksum.to_be_bytes());
        out
    }

    /// Reads an encoded header and checks its checksum.
    ///
    /// # Errors
    /// The bytes are not an intact header.
    pub fn decode(bytes: &[u8]) -> Result<Self, DecodeError> {
        const WHAT: &str = "header";
        exact_len(WHAT, bytes, Self::ENCODED_BYTES)?;
        let mut reader = Reader::new(WHAT, bytes);
        let group = reader.u64()?;
        let view = reader.u64()?;
        let op = reader.u64()?;
        let commit = reader.u64()?;
        let session = reader.u64()?;
        let request = reader.u64()?;
        let parent = reader.u128()?;
        let body_checksum = reader.u128()?;
        let operation = match reader.take(1)?[0] {
            0 => Operation::Root,
            1 => Operation::Register,
            2 => Operation::Request,
            _ => {
                return Err(DecodeError::InvalidField {
                    what: WHAT,
                    field: "operation",
                })
            }
        };
        let sum = reader.u128()?;
        let header = Self {
            group,
            view,
            op,
            commit,
            parent,
            body_checksum,
            session,
            request,
            operation,
            checksum: sum,
        };
        if !header.valid() {
            return Err(DecodeError::Checksum { what: WHAT });
        }
        Ok(header)
    }
}

fn exact_len(what: &'static str, bytes: &[u8], needed: usize) -> Result<(), DecodeError> {
    match bytes.len() {
        len if len < needed => Err(DecodeError::Truncated { what, len, needed }),
        len if len > needed => Err(DecodeError::TrailingBytes {
            what,
            extra: len - needed,
        }),
        _ => Ok(()),
    }
}

pub(crate) struct Reader<'a> {
    what: &'static str,
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(what: &'static str, bytes: &'a [u8]) -> Self {
        Self { what, bytes, at: 0 }
    }

    pub(crate) fn take(&mut self, len: usize) -> Result<&'a [u8], DecodeError> {
        let end = self
            .at
            .checked_add(len)
            .filter(|end| *end <= self.bytes.len());
        let Some(end) = end else {
            return Err(DecodeError::Truncated {
                what: self.what,
                len: self.bytes.len(),
                needed: self.at.saturating_add(len),
            });
        };
        let slice = &self.bytes[self.at..end];
        self.at = end;
        Ok(slice)
    }

    pub(crate) fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.take(1)?[0])
    }

    /// Bytes not read yet.
    pub(crate) fn remaining(&self) -> usize {
        self.bytes.len() - self.at
    }

    pub(crate) fn u32(&mut self) -> Result<u32, DecodeError> {
        let mut raw = [0u8; 4];
        raw.copy_from_slice(self.take(4)?);
        Ok(u32::from_be_bytes(raw))
    }

    pub(crate) fn u64(&mut self) -> Result<u64, DecodeError> {
        let mut raw = [0u8; 8];
        raw.copy_from_slice(self.take(8)?);
        Ok(u64::from_be_bytes(raw))
    }

    pub(crate) fn u128(&mut self) -> Result<u128, DecodeError> {
        let mut raw = [0u8; 16];
        raw.copy_from_slice(self.take(16)?);
        Ok(u128::from_be_bytes(raw))
    }

    pub(crate) fn finish(&self) -> Result<(), DecodeError> {
        match self.bytes.len() - self.at {
            0 => Ok(()),
            extra => Err(DecodeError::TrailingBytes {
                what: self.what,
                extra,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn header() -> Header {
        let root = Header::root(3);
        Header {
            group: 3,
            view: 2,
            op: 1,
            commit: 0,
            parent: root.checksum,
            body_checksum: checksum(b"x=1"),
            session: 9,
            request: 4,
            operation: Operation::Request,
            checksum: 0,
        }
        .seal()
    }

    #[test]
    fn every_layout_round_trips_and_refuses_any_flipped_bit() {
        let state = DurableState {
            view: 7,
            log_view: 5,
            commit: 40,
            journal_trusted_through: 38,
            views_lost: true,
        };
        let slot = state.encode(12);
        assert_eq!(DurableState::decode(&slot), Ok((12, state)));
        let header = header();
        assert_eq!(Header::decode(&header.encode()), Ok(header));
        let checkpoint = Checkpoint::new(header, b"k=3\n".to_vec());
        let stored = checkpoint.encode();
        assert_eq!(Checkpoint::decode(&stored), Ok(checkpoint));
        for bytes in [slot.to_vec(), header.encode().to_vec(), stored] {
            for bit in 0..bytes.len() * 8 {
                let mut damaged = bytes.clone();
                damaged[bit / 8] ^= 1 << (bit % 8);
                let refused = match bytes.len() {
                    DurableState::ENCODED_BYTES => DurableState::decode(&damaged).is_err(),
                    Header::ENCODED_BYTES => Header::decode(&damaged).is_err(),
                    _ => Checkpoint::decode(&damaged).is_err(),
                };
                assert!(refused, "bit {bit} of a {}-byte layout", bytes.len());
            }
            for len in 0..bytes.len() {
                assert!(Checkpoint::decode(&bytes[..len]).is_err());
                assert!(DurableState::decode(&bytes[..len]).is_err());
                assert!(Header::decode(&bytes[..len]).is_err());
            }
        }
    }

    /// A slot of the first layout, as the code before the flags word wrote it.
    fn encode_v1(state: &DurableState, sequence: u64) -> Vec<u8> {
        let mut out = STATE_MAGIC_V1.to_be_bytes().to_vec();
        for word in [
            sequence,
            state.view,
            state.log_view,
            state.commit,
            state.journal_trusted_through,
        ] {
            out.extend_from_slice(&word.to_be_bytes());
        }
        let sum = checksum(&out);
        out.extend_from_slice(&sum.to_be_bytes());
        out
    }

    #[test]
    fn a_slot_of_the_first_layout_still_reads_and_a_lost_disk_stays_lost() {
        let kept = DurableState {
            view: 4,
            log_view: 3,
            commit: 9,
            journal_trusted_through: 6,
            views_lost: false,
        };
        let v1 = encode_v1(&kept, 8);
        assert_eq!(v1.len(), DurableState::ENCODED_BYTES_V1);
        assert_eq!(DurableState::decode(&v1), Ok((8, kept)));
        // Then, a journal untrusted from op 0 meant a lost disk.
        let lost = DurableState {
            journal_trusted_through: 0,
            ..kept
        };
        let (_, read) = DurableState::decode(&encode_v1(&lost, 2)).unwrap();
        assert!(read.views_lost);
        // In a larger region (a states table's slot), the prefix is read.
        let mut region = v1.clone();
        region.extend_from_slice(&[0; 20]);
        assert_eq!(
            DurableState::decode_prefix(&region),
            Ok(((8, kept), DurableState::ENCODED_BYTES_V1))
        );
        assert!(DurableState::decode(&region).is_err());
        // Flags this layout does not define are refused, not ignored.
        let mut unknown = kept.encode(1);
        unknown[4 + 5 * 8 + 7] |= 2;
        let summed = DurableState::ENCODED_BYTES - 16;
        let sum = checksum(&unknown[..summed]);
        unknown[summed..].copy_from_slice(&sum.to_be_bytes());
        assert!(matches!(
            DurableState::decode(&unknown),
            Err(DecodeError::InvalidField { field: "flags", .. })
        ));
    }

    #[test]
    fn the_newest_intact_slot_wins_and_no_intact_slot_is_refused() {
        let old = DurableState {
            view: 1,
            log_view: 1,
            commit: 3,
            ..DurableState::default()
        };
        let new = DurableState { view: 2, ..old };
        let a = old.encode(1);
        let mut b = new.encode(2);
        assert_eq!(DurableState::newest(&[&a, &b]), Ok((2, new)));
        b[20] ^= 0x40; // the newer write was torn
        assert_eq!(DurableState::newest(&[&a, &b]), Ok((1, old)));
        let mut a_damaged = a;
        a_damaged[40] ^= 1;
        assert_eq!(
            DurableState::newest(&[&a_damaged, &b]),
            Err(DecodeError::NoIntactState { slots: 2 })
        );
    }
}
