//! A partition group's state machine: its offsets and its client sessions' slice
//! entries. The records are the journal itself (the partition log, see
//! `partition_journal`); applying a committed batch assigns it the next offsets, which
//! are the offsets the log gave it, since the log holds the same batches in the same
//! order, and records it as its session's last request ([`slices`]).
//!
//! Pure: a prepare's body is read as a [`PartitionOp`], applied, and answered with an
//! [`Applied`]; the state's encoding ([`PartitionMachine::snapshot`]) is versioned so it
//! can grow while older checkpoints stay readable. The entries live in the state, so
//! checkpoints, state transfer and the replay of the log above a checkpoint carry them:
//! there is no second file that could drift from the log.

pub(crate) mod barrier;
pub(crate) mod slices;

use braid_proto::BatchHeader;

use barrier::Barrier;

use slices::{SessionTag, Slices, Tagged};

/// The offsets of a partition group and its sessions' last requests.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct PartitionMachine {
    next_offset: u64,
    slices: Slices,
}

/// What a prepare's body asks of the partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum PartitionOp {
    /// One whole batch frame of `records` records: stored at the next offsets, as
    /// `session`'s request if it names one.
    Batch {
        records: u64,
        session: Option<SessionTag>,
    },
    /// A retirement barrier: ended sessions' entries go, the frontier rises.
    Barrier(Barrier),
    /// Anything else (the journal keeps such a body aside; it takes no offsets).
    Unknown,
}

impl PartitionOp {
    /// Reads a body. Only a batch's header is read: the primary validated the
    /// producer's batch whole, and every replica checks the body against its prepare's
    /// checksum.
    pub(crate) fn of(body: &[u8]) -> Self {
        match Barrier::decode(body) {
            Some(Ok(barrier)) => return Self::Barrier(barrier),
            Some(Err(_)) => return Self::Unknown,
            None => {}
        }
        let Ok(header) = BatchHeader::decode(body) else {
            return Self::Unknown;
        };
        let count = header.record_count;
        if header.total_bytes() == body.len() && count >= 1 && header.last_offset_delta == count - 1
        {
            Self::Batch {
                records: u64::from(count as u32),
                session: match SessionTag::of(&header) {
                    Tagged::Yes(tag) => Some(tag),
                    Tagged::No | Tagged::Invalid => None,
                },
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
        PartitionOp::Batch { records, .. } => Some(records),
        PartitionOp::Barrier(_) | PartitionOp::Unknown => None,
    }
}

/// The result of an applied op, as the replicas return it to the partition's client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Applied {
    /// A batch took offsets `base..=last`. Encoded `0, base: u64, last: u64`.
    Stored { base: u64, last: u64 },
    /// A body that is not one batch: it took none. Encoded `1`.
    NotABatch,
    /// A barrier, applied. Encoded `2`.
    Retired,
}

impl Applied {
    const STORED: u8 = 0;
    const NOT_A_BATCH: u8 = 1;
    const RETIRED: u8 = 2;

    pub(crate) fn encode(&self) -> Vec<u8> {
        match self {
            Self::Stored { base, last } => {
                let mut out = vec![Self::STORED];
                out.extend_from_slice(&base.to_be_bytes());
                out.extend_from_slice(&last.to_be_bytes());
                out
            }
            Self::NotABatch => vec![Self::NOT_A_BATCH],
            Self::Retired => vec![Self::RETIRED],
        }
    }

    /// A result as [`Applied::encode`] wrote it, or `None` for any other bytes.
    pub(crate) fn decode(bytes: &[u8]) -> Option<Self> {
        match bytes {
            [Self::NOT_A_BATCH] => Some(Self::NotABatch),
            [Self::RETIRED] => Some(Self::Retired),
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
            Self::NotABatch | Self::Retired => None,
        }
    }
}

/// The version byte of the first versioned encoding: `1, next_offset: u64`. (The
/// first encoding, eight bytes of `next_offset` alone, is still read.)
const STATE_V1: u8 = 1;
/// The version byte of the encoding whose slice entries had no CRC (2026-12-07,
/// d0820f1 to fee86e2): still read.
const STATE_V2: u8 = 2;
/// The version byte of the encoding before the retirement frontier (d0820f1 to
/// 4439d71): `3, next_offset: u64`, then the slice entries. Still read.
const STATE_V3: u8 = 3;
/// The version byte of this encoding: `4, next_offset: u64, frontier: u64`, then the
/// slice entries ([`Slices::encode`]).
const STATE_V4: u8 = 4;

impl PartitionMachine {
    /// The offset the next committed batch takes: the high watermark.
    pub(crate) fn next_offset(&self) -> u64 {
        self.next_offset
    }

    /// The client sessions' slice entries.
    pub(crate) fn slices(&self) -> &Slices {
        &self.slices
    }

    /// A batch of `records` takes the next offsets.
    fn store(&mut self, records: u64, session: Option<SessionTag>) -> (u64, u64) {
        let base = self.next_offset;
        self.next_offset += records;
        let last = self.next_offset - 1;
        if let Some(tag) = session {
            self.slices.applied(tag, base, last);
        }
        (base, last)
    }
}

impl braid_vsr::StateMachine for PartitionMachine {
    fn apply(&mut self, _op: u64, input: &[u8]) -> Vec<u8> {
        match PartitionOp::of(input) {
            PartitionOp::Batch { records, session } => {
                let (base, last) = self.store(records, session);
                Applied::Stored { base, last }.encode()
            }
            PartitionOp::Barrier(barrier) => {
                self.slices.retire(barrier.frontier, &barrier.sessions);
                Applied::Retired.encode()
            }
            PartitionOp::Unknown => Applied::NotABatch.encode(),
        }
    }

    /// A batch committed but not run (a retry of this node's own request to the
    /// group, an unknown session) is in the log all the same, since the journal
    /// appended it when it was prepared: its records take their offsets, so that every
    /// later batch's offsets are the ones it is stored at, and it is its client
    /// session's request as much as if it had run.
    fn skipped(&mut self, op: u64, input: &[u8]) {
        match PartitionOp::of(input) {
            PartitionOp::Batch { records, session } => {
                self.store(records, session);
            }
            // A barrier is state all the same: run it.
            PartitionOp::Barrier(_) => {
                self.apply(op, input);
            }
            PartitionOp::Unknown => {}
        }
    }

    fn snapshot(&self) -> Vec<u8> {
        let mut out = vec![STATE_V4];
        out.extend_from_slice(&self.next_offset.to_be_bytes());
        out.extend_from_slice(&self.slices.frontier().to_be_bytes());
        self.slices.encode(&mut out);
        out
    }

    fn restore(&mut self, snapshot: &[u8]) -> Result<(), String> {
        let (next_offset, slices) = match snapshot {
            [STATE_V4, rest @ ..] if rest.len() >= 16 => {
                let (next_offset, rest) = rest.split_at(8);
                let (frontier, slices) = rest.split_at(8);
                let mut slices = Slices::decode(slices, true)?;
                let mut bytes = [0u8; 8];
                bytes.copy_from_slice(frontier);
                slices.set_frontier(u64::from_be_bytes(bytes));
                (next_offset, slices)
            }
            [version @ (STATE_V2 | STATE_V3), rest @ ..] if rest.len() >= 8 => {
                let (next_offset, slices) = rest.split_at(8);
                (next_offset, Slices::decode(slices, *version == STATE_V3)?)
            }
            [STATE_V1, rest @ ..] if rest.len() == 8 => (rest, Slices::default()),
            legacy if legacy.len() == 8 => (legacy, Slices::default()),
            [version, ..] if snapshot.len() != 8 && *version > STATE_V4 => {
                return Err(format!(
                    "a partition state of version {version}, which this node does not read"
                ))
            }
            _ => {
                return Err(format!(
                    "a partition state of {} bytes does not decode",
                    snapshot.len()
                ))
            }
        };
        let bytes: [u8; 8] = next_offset
            .try_into()
            .map_err(|_| "a partition state's next offset is cut short".to_owned())?;
        self.next_offset = u64::from_be_bytes(bytes);
        self.slices = slices;
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

    /// A tagged batch becomes its session's last request here, whether it ran or was
    /// skipped, and the entries ride the state through a snapshot.
    #[test]
    fn a_sessions_last_request_is_in_the_state() {
        let tagged = |session: i64, request: i32, records: usize| {
            let mut builder = braid_proto::BatchBuilder::new(0);
            for _ in 0..records {
                builder.push(None, Some(b"v"), &[], 0);
            }
            builder.producer(session, -1, request);
            builder.finish()
        };
        let mut machine = PartitionMachine::default();
        machine.apply(1, &tagged(7, 0, 2));
        machine.apply(2, &tagged(9, 0, 1));
        machine.skipped(3, &tagged(7, 1, 3));
        let slice = |m: &PartitionMachine, s| {
            m.slices()
                .get(s)
                .map(|slice| (slice.request, slice.base, slice.last, slice.crc.is_some()))
        };
        assert_eq!(slice(&machine, 7), Some((1, 3, 5, true)));
        assert_eq!(slice(&machine, 9), Some((0, 2, 2, true)));
        let mut restored = PartitionMachine::default();
        restored.restore(&machine.snapshot()).unwrap();
        assert_eq!(restored, machine);
        assert_eq!(restored.slices().len(), 2);
    }

    /// Every replica holds one machine, most with no session's entry: the entries
    /// stay out of line (an empty map inline was 24 more bytes per replica).
    #[test]
    fn a_machine_without_sessions_is_two_words() {
        assert_eq!(std::mem::size_of::<PartitionMachine>(), 16);
    }

    /// The state's encoding is versioned: this version's reads back, the first
    /// version's eight bytes are still read, and a later version or a cut state is
    /// refused with a reason, never taken for some other next offset.
    #[test]
    fn the_state_is_versioned_and_the_first_version_still_reads() {
        let mut machine = PartitionMachine::default();
        machine.restore(&[0, 0, 0, 0, 0, 0, 0x01, 0x00]).unwrap();
        assert_eq!(machine.next_offset(), 256, "the first version's 8 bytes");
        let mut v1 = PartitionMachine::default();
        v1.restore(&[STATE_V1, 0, 0, 0, 0, 0, 0, 0x01, 0x00])
            .unwrap();
        assert_eq!(v1, machine, "the first versioned encoding");
        let snapshot = machine.snapshot();
        assert_eq!(
            snapshot,
            [STATE_V4, 0, 0, 0, 0, 0, 0, 0x01, 0x00, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]
        );
        let mut v3 = PartitionMachine::default();
        v3.restore(&[STATE_V3, 0, 0, 0, 0, 0, 0, 0x01, 0x00, 0, 0, 0, 0])
            .unwrap();
        assert_eq!(v3, machine, "the encoding before the frontier");
        let mut v2 = PartitionMachine::default();
        v2.restore(&[STATE_V2, 0, 0, 0, 0, 0, 0, 0x01, 0x00, 0, 0, 0, 0])
            .unwrap();
        assert_eq!(v2, machine, "the encoding before entries kept a CRC");
        let mut restored = PartitionMachine::default();
        restored.restore(&snapshot).unwrap();
        assert_eq!(restored, machine);
        let newer = restored
            .restore(&[5, 0, 0, 0, 0, 0, 0, 0, 0, 7])
            .unwrap_err();
        assert!(newer.contains("version 5"), "{newer}");
        for cut in [0, 1, 5, 7, 9, 12, 16, 20] {
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

    /// A barrier drops the named sessions' entries (the others stay), raises the
    /// frontier and never lowers it, whether it ran or was skipped, and both ride a
    /// snapshot.
    #[test]
    fn a_barrier_forgets_the_sessions_it_names_and_raises_the_frontier() {
        let tagged = |session: i64, request: i32| {
            let mut builder = braid_proto::BatchBuilder::new(0);
            builder.push(None, Some(b"v"), &[], 0);
            builder.producer(session, -1, request);
            builder.finish()
        };
        let mut machine = PartitionMachine::default();
        for session in [3, 5, 9] {
            machine.apply(session, &tagged(session as i64, 0));
        }
        let barrier = |frontier, sessions: &[u64]| {
            Barrier {
                frontier,
                sessions: sessions.to_vec(),
            }
            .encode()
        };
        assert_eq!(
            Applied::decode(&machine.apply(4, &barrier(40, &[3, 9]))),
            Some(Applied::Retired)
        );
        assert_eq!(machine.slices().sessions().collect::<Vec<_>>(), [5]);
        assert_eq!(machine.slices().frontier(), 40);
        machine.skipped(5, &barrier(30, &[5]));
        assert_eq!(machine.slices().sessions().count(), 0);
        assert_eq!(machine.slices().frontier(), 40, "never lowered");
        assert_eq!(machine.next_offset(), 3, "a barrier takes no offsets");
        let mut restored = PartitionMachine::default();
        restored.restore(&machine.snapshot()).unwrap();
        assert_eq!(restored, machine);
        assert_eq!(restored.slices().frontier(), 40);
        let mut cut = barrier(50, &[1]);
        cut.pop();
        assert_eq!(machine.apply(6, &cut), vec![1], "a cut barrier is no op");
        assert_eq!(
            batch_records(&barrier(50, &[1])),
            None,
            "kept aside by the journal"
        );
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
