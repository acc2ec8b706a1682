//! The check, every [`SERVE_CHECK_TICKS`](super::SERVE_CHECK_TICKS), of what each member
//! would serve below its high watermark.
//!
//! Reading every member's whole log each time made the check the simulator's largest
//! cost, growing with the square of a run's length. Most checks now read only what
//! each member's log gained since its last check; every [`FULL_EVERY`]th check, and
//! the first after a member boots, reads it all again, so a change beneath what was
//! checked (a log cut or rewritten below its high watermark) is still found, at most
//! [`FULL_EVERY`] checks later, and the end of the run compares every log whole.

use std::collections::BTreeMap;

use braid_proto::RecordBatch;

use super::files::{read_batches, values_of, Stop};
use super::{key, Run};

/// One check in this many reads every log from its start.
const FULL_EVERY: u64 = 10;

/// What the checks have verified.
#[derive(Debug, Default)]
pub(super) struct Checked {
    /// (member, partition) -> the high watermark below which the member's log was
    /// found to hold every acknowledged record.
    upto: BTreeMap<(u8, u32), u64>,
    checks: u64,
}

impl Checked {
    /// Member `m` crashed or booted: its logs are read whole at the next check.
    pub(super) fn forget_member(&mut self, m: u8) {
        self.upto.retain(|(member, _), _| *member != m);
    }

    /// Member `m` opened partition `p` again: its log is read whole at the next check.
    pub(super) fn forget_partition(&mut self, m: u8, p: u32) {
        self.upto.remove(&(m, p));
    }
}

impl Run {
    /// What every member would serve now, below its high watermark, is readable and
    /// holds each acknowledged record at its offset: no reader is ever promised a
    /// record the log does not hold, or handed another one.
    pub(super) fn check_served(&mut self) {
        self.served.checks += 1;
        let full = self.served.checks.is_multiple_of(FULL_EVERY);
        let mut problem = None;
        for m in 0..self.member_count() {
            // Reads are served up to the mark the shard publishes, not the groups'.
            let published = self.members[usize::from(m)].published.clone();
            let Some(groups) = self.members[usize::from(m)].groups.as_mut() else {
                continue;
            };
            for p in 0..self.shape.partitions {
                let mark = published.get(&p).copied().unwrap_or(0);
                let copying = groups.copying(key(p));
                let Some(log) = groups.log(key(p)) else {
                    continue;
                };
                let checked = match self.served.upto.get(&(m, p)) {
                    // A high watermark below what was checked: read it all again.
                    Some(&upto) if !full && upto <= mark => upto,
                    _ => 0,
                };
                let tag = log.tag();
                // Below its start, retention deleted the records (and reads are refused).
                let checked = checked.max(log.start_offset());
                let (batches, stopped) = read_batches(log, checked, mark);
                // A log that a copy from a peer rebuilds ends below the mark: the node
                // refuses reads there (`NotLeader`, as a backup's), never answers them
                // with nothing.
                let read_end = batches
                    .last()
                    .and_then(|(base, bytes)| {
                        RecordBatch::check_stored(bytes, tag)
                            .ok()
                            .map(|(b, _)| b.header().last_offset() as u64 + 1)
                            .or(Some(*base))
                    })
                    .unwrap_or(checked);
                let refused_while_copying =
                    copying && (log.next_offset()..mark).contains(&read_end);
                match stopped {
                    Some(Stop::Missing(_)) if refused_while_copying => {
                        self.outcome.reads_refused += 1;
                    }
                    Some(Stop::Missing(err)) => {
                        problem.get_or_insert(format!(
                            "member {m} partition {p} promises records below {mark}: {err}"
                        ));
                        continue;
                    }
                    // Refused from the damage on, until a peer's copy repairs it.
                    Some(Stop::Damaged(_)) => self.outcome.reads_refused += 1,
                    None => {}
                }
                let values = values_of(&batches);
                // What is served ends at the damage, if the read stopped there.
                let served = read_end.min(mark);
                let served = if matches!(stopped, Some(Stop::Damaged(_))) || refused_while_copying {
                    served
                } else {
                    mark
                };
                let mut sound = values.is_ok();
                for ((_, offset), value) in self.acked.range((p, checked)..(p, served.max(checked)))
                {
                    if let Ok(held) = &values {
                        if held.get(offset).and_then(Option::as_ref) != Some(value) {
                            sound = false;
                            problem.get_or_insert(format!(
                                "member {m} partition {p} would serve offset {offset} below \
                                 its high watermark {mark} without its acknowledged record {}",
                                String::from_utf8_lossy(value)
                            ));
                        }
                    }
                }
                // Only a whole read (it stops only at the high watermark) moves the
                // mark: what a damaged read stopped short of is read again once repaired.
                if sound && stopped.is_none() {
                    self.served.upto.insert((m, p), mark);
                } else {
                    self.served.upto.remove(&(m, p));
                }
            }
        }
        if let Some(problem) = problem {
            self.fail(problem);
        }
    }
}
