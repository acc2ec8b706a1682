//! The producer's stamp at the head of every benchmark record: a sequence number and the
//! send time, so consumers measure end-to-end latency and count every record once.

use thiserror::Error;

/// Bytes the stamp takes: sequence (u64) and send time in nanoseconds (u64), big-endian.
pub const STAMP_BYTES: usize = 16;

/// A record too short to carry a stamp.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
#[error("a benchmark record of {len} bytes cannot hold the {STAMP_BYTES}-byte stamp")]
pub struct StampError {
    /// The record's length.
    pub len: usize,
}

/// Writes `sequence` and `sent_ns` (nanoseconds since the run's start) at the head of
/// `record`.
///
/// # Errors
/// [`StampError`] if `record` is shorter than [`STAMP_BYTES`].
pub fn write_stamp(record: &mut [u8], sequence: u64, sent_ns: u64) -> Result<(), StampError> {
    let len = record.len();
    let head = record.get_mut(..STAMP_BYTES).ok_or(StampError { len })?;
    head[..8].copy_from_slice(&sequence.to_be_bytes());
    head[8..].copy_from_slice(&sent_ns.to_be_bytes());
    Ok(())
}

/// Reads `(sequence, sent_ns)` from the head of `record`.
///
/// # Errors
/// [`StampError`] if `record` is shorter than [`STAMP_BYTES`].
pub fn read_stamp(record: &[u8]) -> Result<(u64, u64), StampError> {
    let err = StampError { len: record.len() };
    let (Some(sequence), Some(sent)) = (record.get(..8), record.get(8..STAMP_BYTES)) else {
        return Err(err);
    };
    let sequence = u64::from_be_bytes(sequence.try_into().map_err(|_| err)?);
    let sent = u64::from_be_bytes(sent.try_into().map_err(|_| err)?);
    Ok((sequence, sent))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn a_stamp_reads_back(sequence: u64, sent: u64, extra in 0usize..64) {
            let mut record = vec![0xAB; STAMP_BYTES + extra];
            write_stamp(&mut record, sequence, sent).unwrap();
            prop_assert_eq!(read_stamp(&record), Ok((sequence, sent)));
            prop_assert!(record[STAMP_BYTES..].iter().all(|b| *b == 0xAB));
        }

        #[test]
        fn short_records_are_refused(len in 0usize..STAMP_BYTES) {
            let mut record = vec![0; len];
            prop_assert_eq!(write_stamp(&mut record, 1, 2), Err(StampError { len }));
            prop_assert_eq!(read_stamp(&record), Err(StampError { len }));
        }
    }
}
