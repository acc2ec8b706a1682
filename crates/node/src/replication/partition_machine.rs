//! A partition group's state machine: its offsets. The records are the journal itself
//! (the partition log, see `partition_journal`); applying a committed batch only
//! assigns it the next offsets, which are the offsets the log gave it, since the log
//! holds the same batches in the same order.
//!
//! Pure: a prepare's body is read as a [`PartitionOp`], applied, and answered with an
//! [`Applied`]; the state's encoding ([`PartitionMachine::snapshot`]) is versioned so it
//! can grow (sessions' entries next) while older checkpoints stay readable.

use braid_proto::BatchHeader;

/// The offsets of a partition group.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct PartitionMachine {
    next_offset: u64,
}

/// What a prepare's body asks of the partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PartitionOp {
    /// One whole batch frame of `records` records: stored at the next offsets.
    Batch { records: u64 },
    /// Anything else (the journal keeps such a body aside; it takes no offsets).
    Unknown,
}

impl PartitionOp {
    /// Reads a body. Only a batch's header is read: the primary validated the
    /// producer's batch whole, and every replica checks the body against its prepare's
    /// checksum.
    pub(crate) fn of(body: &[u8]) -> Self {
        let Ok(header) = BatchHeader::decode(body) else {
            return Self::Unknown;
        };
        let count = header.record_count;
        if header.total_bytes() == body.len() && count >= 1 && header.last_offset_delta == count - 1
        {
            Self::Batch {
                records: u64::from(count as u32),
            }
        } else {
            Self::Unknown
        }
    }
}

/// The records of `body` if it is one whole batch frame: what the journal appends to
/// the log (the rest it keeps aside), so the two agree on every offset.
pub(crate) fn batch_records(body: &[u8]) -> Option<u64> {
    match PartitionOp::of(body) {
        PartitionOp::Batch { records } => Some(records),
        PartitionOp::Unknown => None,
    }
}

/// The result of an applied op, as the replicas return it to the partition's client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Applied {
    /// A batch took offsets `base..=last`. Encoded `0, base: u64, last: u64`.
    Stored { base: u64, last: u64 },
    /// A body that is not one batch: it took none. Encoded `1`.
    NotABatch,
}

impl Applied {
    const STORED: u8 = 0;
    const NOT_A_BATCH: u8 = 1;

    pub(crate) fn encode(&self) -> Vec<u8> {
        match self {
            Self::Stored { base, last } => {
                let mut out = vec![Self::STORED];
                out.extend_from_slice(&base.to_be_bytes());
                out.extend_from_slice(&last.to_be_bytes());
                out
            }
            Self::NotABatch => vec![Self::NOT_A_BATCH],
        }
    }

    /// A result as [`Applied::encode`] wrote it, or `None` for any other bytes.
    pub(crate) fn decode(bytes: &[u8]) -> Option<Self> {
        match bytes {
            [Self::NOT_A_BATCH] => Some(Self::NotABatch),
            [Self::STORED, rest @ ..] if rest.len() == 16 => {
                let (base, last) = rest.split_at(8);
                Some(Self::Stored {
                    base: u64::from_be_bytes(base.try_into().ok()?),
                    last: u64::from_be_bytes(last.try_into().ok()?),
                })
            }
            _ => None,
        }
    }

    /// The offsets a batch took, if it was one.
    pub(crate) fn offsets(bytes: &[u8]) -> Option<(u64, u64)> {
        match Self::decode(bytes)? {
            Self::Stored { base, last } => Some((base, last)),
            Self::NotABatch => None,
        }
    }
}

/// The version byte of the state's encoding: `1, next_offset: u64`. (The first
/// encoding, eight bytes of `next_offset` alone, is still read.)
const STATE_V1: u8 = 1;

impl PartitionMachine {
    /// The offset the next committed batch takes: the high watermark.
    pub(crate) fn next_offset(&self) -> u64 {
        self.next_offset
    }
}

impl braid_vsr::StateMachine for PartitionMachine {
    fn apply(&mut self, _op: u64, input: &[u8]) -> Vec<u8> {
        match PartitionOp::of(input) {
            PartitionOp::Batch { records } => {
                let base = self.next_offset;
                self.next_offset += records;
                Applied::Stored {
                    base,
                    last: self.next_offset - 1,
                }
                .encode()
            }
            PartitionOp::Unknown => Applied::NotABatch.encode(),
        }
    }

    /// A batch committed but not run (a retry, an unknown session) is in the log all
    /// the same, since the journal appended it when it was prepared: its records take
    /// their offsets, so that every later batch's offsets are the ones it is stored at.
    fn skipped(&mut self, _op: u64, input: &[u8]) {
        if let PartitionOp::Batch { records } = PartitionOp::of(input) {
            self.next_offset += records;
        }
    }

    fn snapshot(&self) -> Vec<u8> {
        let mut out = vec![STATE_V1];
        out.extend_from_slice(&self.next_offset.to_be_bytes());
        out
    }

    fn restore(&mut self, snapshot: &[u8]) -> Result<(), String> {
        let next_offset = match snapshot {
            [STATE_V1, rest @ ..] if rest.len() == 8 => rest,
            legacy if legacy.len() == 8 => legacy,
            [version, ..] if snapshot.len() != 8 && *version != STATE_V1 => {
                return Err(format!(
                    "a partition state of version {version}, which this node does not read"
                ))
            }
            _ => {
                return Err(format!(
                    "a partition state is 9 bytes (or 8 of the first version), not {}",
                    snapshot.len()
                ))
            }
        };
        let bytes: [u8; 8] = next_offset
            .try_into()
            .map_err(|_| "a partition state's next offset is cut short".to_owned())?;
        self.next_offset = u64::from_be_bytes(bytes);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use braid_vsr::StateMachine;

    #[test]
    fn batches_take_the_next_offsets_and_anything_else_takes_none() {
        let mut machine = PartitionMachine::default();
        let mut builder = braid_proto::BatchBuilder::new(0);
        for _ in 0..3 {
            builder.push(None, Some(b"v"), &[], 0);
        }
        let batch = builder.finish();
        assert_eq!(Applied::offsets(&machine.apply(1, &batch)), Some((0, 2)));
        assert_eq!(Applied::offsets(&machine.apply(2, &batch)), Some((3, 5)));
        assert_eq!(machine.apply(3, b"not a batch"), vec![1]);
        let mut trailing = batch.clone();
        trailing.push(0);
        assert_eq!(machine.apply(4, &trailing), vec![1], "one batch exactly");
        assert_eq!(
            machine.apply(5, &batch[..batch.len() - 1]),
            vec![1],
            "a cut batch"
        );
        assert_eq!(machine.next_offset(), 6);
        let mut restored = PartitionMachine::default();
        restored.restore(&machine.snapshot()).unwrap();
        assert_eq!(restored, machine);
        assert!(restored.restore(b"short").is_err());
    }

    /// The state's encoding is versioned: this version's reads back, the first
    /// version's eight bytes are still read, and a later version or a cut state is
    /// refused with a reason, never taken for some other next offset.
    #[test]
    fn the_state_is_versioned_and_the_first_version_still_reads() {
        let mut machine = PartitionMachine::default();
        machine.restore(&[0, 0, 0, 0, 0, 0, 0x01, 0x00]).unwrap();
        assert_eq!(machine.next_offset(), 256, "the first version's 8 bytes");
        let snapshot = machine.snapshot();
        assert_eq!(snapshot, [STATE_V1, 0, 0, 0, 0, 0, 0, 0x01, 0x00]);
        let mut restored = PartitionMachine::default();
        restored.restore(&snapshot).unwrap();
        assert_eq!(restored, machine);
        let newer = restored
            .restore(&[2, 0, 0, 0, 0, 0, 0, 0, 0, 7])
            .unwrap_err();
        assert!(newer.contains("version 2"), "{newer}");
        for cut in [0, 1, 5, 7] {
            assert!(restored.restore(&snapshot[..cut]).is_err(), "cut at {cut}");
        }
        let mut long = snapshot.clone();
        long.push(0);
        assert!(restored.restore(&long).is_err());
        assert_eq!(restored, machine, "a refused state changes nothing");
    }

    proptest::proptest! {
        /// A result decodes to what was encoded; any other bytes decode to nothing
        /// (never a panic, never offsets made up).
        #[test]
        fn results_round_trip_and_other_bytes_are_none(
            base in proptest::prelude::any::<u64>(),
            last in proptest::prelude::any::<u64>(),
            junk in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..40),
        ) {
            let stored = Applied::Stored { base, last };
            proptest::prop_assert_eq!(Applied::decode(&stored.encode()), Some(stored));
            proptest::prop_assert_eq!(Applied::offsets(&stored.encode()), Some((base, last)));
            proptest::prop_assert_eq!(Applied::decode(&Applied::NotABatch.encode()), Some(Applied::NotABatch));
            if let Some(applied) = Applied::decode(&junk) {
                proptest::prop_assert_eq!(applied.encode(), junk);
            }
        }
    }

    /// A committed batch that did not run is in the log all the same: its records
    /// take their offsets, so the next batch's offsets are where it is stored.
    #[test]
    fn a_skipped_batch_takes_its_offsets_and_anything_else_takes_none() {
        let mut machine = PartitionMachine::default();
        let mut builder = braid_proto::BatchBuilder::new(0);
        for _ in 0..2 {
            builder.push(None, Some(b"v"), &[], 0);
        }
        let batch = builder.finish();
        machine.apply(1, &batch);
        machine.skipped(2, &batch);
        machine.skipped(3, b"not a batch");
        assert_eq!(Applied::offsets(&machine.apply(4, &batch)), Some((4, 5)));
    }
}
