//! The producers: a batch to whichever member says it leads, and what was acknowledged.

use braid_proto::{BatchBuilder, ValidatedBatch};
use tokio::sync::oneshot;

use super::{key, Run, Waiting};
use crate::replication::partition_groups::Role;

impl Run {
    /// A producer sends one batch to whichever member says it leads the partition.
    pub(super) fn produce(&mut self) {
        let partition = self.prng.below(u64::from(self.shape.partitions)) as u32;
        let leader = (0..self.member_count()).find(|m| {
            self.members[usize::from(*m)]
                .groups
                .as_ref()
                .is_some_and(|g| g.role(key(partition)) == Role::Primary)
        });
        let Some(leader) = leader else {
            return;
        };
        let records = 1 + self.prng.below(4) as usize;
        let mut builder = BatchBuilder::new(1_000);
        let mut values = Vec::new();
        for _ in 0..records {
            self.next_value += 1;
            let value = format!("s{}-v{}", self.seed, self.next_value).into_bytes();
            builder.push(None, Some(&value), &[], 1_000);
            values.push(value);
        }
        let batch = match ValidatedBatch::new(builder.finish()) {
            Ok(batch) => batch,
            Err(err) => {
                self.fail(format!("the producer built a bad batch: {err}"));
                return;
            }
        };
        if self.trace {
            eprintln!(
                "t{} m{leader} takes a produce to p{partition}: {}..={}",
                self.tick,
                self.next_value + 1 - records as u64,
                self.next_value
            );
        }
        let (reply, answer) = oneshot::channel();
        if let Some(groups) = self.members[usize::from(leader)].groups.as_mut() {
            groups.produce(key(partition), batch, reply);
            let moved = groups.flush();
            self.publish(leader, moved);
        }
        self.waiting.push(Waiting {
            partition,
            values,
            answer,
        });
        self.collect_sent(leader);
    }

    /// Takes the answers that came: an acknowledged batch's offsets are its own.
    pub(super) fn take_answers(&mut self) {
        let mut still = Vec::new();
        for mut waiting in std::mem::take(&mut self.waiting) {
            match waiting.answer.try_recv() {
                Err(oneshot::error::TryRecvError::Empty) => still.push(waiting),
                Err(oneshot::error::TryRecvError::Closed) | Ok(Err(_)) => {
                    self.outcome.produces_failed += 1;
                }
                Ok(Ok((base, last))) => {
                    let count = waiting.values.len() as u64;
                    if self.trace {
                        eprintln!(
                            "t{} acked p{} {base}..={last} {:?}",
                            self.tick,
                            waiting.partition,
                            waiting
                                .values
                                .iter()
                                .map(|v| String::from_utf8_lossy(v).into_owned())
                                .collect::<Vec<_>>()
                        );
                    }
                    if last + 1 < base || last + 1 - base != count {
                        self.fail(format!(
                            "a batch of {count} records was acknowledged at {base}..={last}"
                        ));
                        continue;
                    }
                    for (i, value) in waiting.values.into_iter().enumerate() {
                        let at = (waiting.partition, base + i as u64);
                        if let Some(earlier) = self.acked.insert(at, value.clone()) {
                            if earlier != value {
                                self.fail(format!(
                                    "partition {} offset {} acknowledged twice: {} then {}",
                                    at.0,
                                    at.1,
                                    String::from_utf8_lossy(&earlier),
                                    String::from_utf8_lossy(&value)
                                ));
                            }
                        }
                        self.outcome.records_acknowledged += 1;
                    }
                }
            }
        }
        self.waiting = still;
    }
}
