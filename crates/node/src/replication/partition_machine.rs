//! A partition group's state machine: its offsets. The records are the journal itself
//! (the partition log, see `partition_journal`); applying a committed batch only
//! assigns it the next offsets, which are the offsets the log gave it, since the log
//! holds the same batches in the same order. The state is the next offset, so a
//! checkpoint is eight bytes.
//!
//! A result is `0, base_offset: u64, last_offset: u64` for a batch, or `1` for a body
//! that is not one batch (the journal kept it aside; it takes no offsets).

// Partition groups join the shards next; until then only the tests use this.
#![cfg_attr(not(test), allow(dead_code))]

use braid_proto::BatchHeader;

/// The offsets of a partition group.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct PartitionMachine {
    next_offset: u64,
}

/// The records of `body` if it is one whole batch frame: what the journal appends to
/// the log (the rest it keeps aside), so the two agree on every offset. Only the header
/// is read: the primary validated the producer's batch whole, and every replica checks
/// the body against its prepare's checksum.
pub(crate) fn batch_records(body: &[u8]) -> Option<u64> {
    let header = BatchHeader::decode(body).ok()?;
    let count = header.record_count;
    (header.total_bytes() == body.len() && count >= 1 && header.last_offset_delta == count - 1)
        .then_some(u64::from(count as u32))
}

impl PartitionMachine {
    /// The offset the next committed batch takes: the high watermark.
    pub(crate) fn next_offset(&self) -> u64 {
        self.next_offset
    }

    /// The offsets a result names: `(base, last)` of the batch, if it was one.
    pub(crate) fn offsets(result: &[u8]) -> Option<(u64, u64)> {
        if result.len() != 17 || result[0] != 0 {
            return None;
        }
        let word = |at: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&result[at..at + 8]);
            u64::from_be_bytes(b)
        };
        Some((word(1), word(9)))
    }
}

impl braid_vsr::StateMachine for PartitionMachine {
    fn apply(&mut self, _op: u64, input: &[u8]) -> Vec<u8> {
        match batch_records(input) {
            Some(records) if records > 0 => {
                let base = self.next_offset;
                self.next_offset += records;
                let mut out = vec![0];
                out.extend_from_slice(&base.to_be_bytes());
                out.extend_from_slice(&(self.next_offset - 1).to_be_bytes());
                out
            }
            _ => vec![1],
        }
    }

    /// A batch committed but not run (a retry, an unknown session) is in the log all
    /// the same, since the journal appended it when it was prepared: its records take
    /// their offsets, so that every later batch's offsets are the ones it is stored at.
    fn skipped(&mut self, _op: u64, input: &[u8]) {
        if let Some(records) = batch_records(input) {
            self.next_offset += records;
        }
    }

    fn snapshot(&self) -> Vec<u8> {
        self.next_offset.to_be_bytes().to_vec()
    }

    fn restore(&mut self, snapshot: &[u8]) -> Result<(), String> {
        let bytes: [u8; 8] = snapshot
            .try_into()
            .map_err(|_| format!("a partition state is 8 bytes, not {}", snapshot.len()))?;
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
        assert_eq!(
            PartitionMachine::offsets(&machine.apply(1, &batch)),
            Some((0, 2))
        );
        assert_eq!(
            PartitionMachine::offsets(&machine.apply(2, &batch)),
            Some((3, 5))
        );
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
        assert_eq!(
            PartitionMachine::offsets(&machine.apply(4, &batch)),
            Some((4, 5))
        );
    }
}
