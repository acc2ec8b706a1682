//! What a benchmark run does, and the named presets.

use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::stamp::STAMP_BYTES;

/// Which sides of the log a run drives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    /// Producers only: acknowledgement latency and produce throughput.
    Produce,
    /// Consumers only: a catch-up read of data already in the topic.
    Consume,
    /// Both at once: end-to-end latency from the producer's stamp in each record.
    ProduceConsume,
}

/// When a run ends (after its warm-up).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Stop {
    /// After this many seconds.
    Seconds(u64),
    /// After this many records in total.
    Records(u64),
}

/// How fast producers send, in records per second for all producers together.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Rate {
    /// As fast as the node acknowledges.
    Max,
    /// A fixed rate.
    Fixed(u64),
    /// This percentage of the maximum, measured by a short unpaced run first.
    PercentOfMax(u8),
}

/// The `fsync` policy of the benchmark's topics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Fsync {
    /// Leave write-back to the kernel.
    Never,
    /// Sync before every acknowledgement.
    Always,
    /// Sync at most this many milliseconds apart.
    IntervalMs(u64),
}

/// One benchmark run's configuration, reported in full with its figures.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Workload {
    /// Which sides run.
    pub mode: Mode,
    /// Producer connections.
    pub producers: u32,
    /// Consumers in total.
    pub consumers: u32,
    /// Consumer groups the consumers are spread over; 0 means plain consumers that each
    /// read every partition.
    pub consumer_groups: u32,
    /// Topics.
    pub topics: u32,
    /// Partitions per topic.
    pub partitions: u32,
    /// Bytes per record value, stamp included.
    pub record_bytes: u32,
    /// Records per produce batch.
    pub batch_records: u32,
    /// How long a producer waits to fill a batch.
    pub linger_ms: u32,
    /// Batches each producer keeps sent and unanswered at once.
    pub in_flight: u32,
    /// Distinct keys, drawn uniformly; `None` sends keyless records.
    pub key_cardinality: Option<u64>,
    /// Target rate.
    pub rate: Rate,
    /// When the run ends.
    pub stop: Stop,
    /// Seconds run but not measured, before the figures start.
    pub warmup_seconds: u64,
    /// `fsync` policy of the topics the run creates.
    pub fsync: Fsync,
    /// Each producer holds a client session and numbers its batches (what the SDK's
    /// idempotent producer does), so the partitions judge every batch against its
    /// session's entry before they store it.
    pub sessions: bool,
}

/// A workload that cannot run, naming the value.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum WorkloadError {
    /// No preset has this name.
    #[error("no preset named {0:?} (braid bench --list shows them)")]
    UnknownPreset(String),
    /// A mode that produces has no producers.
    #[error("mode {0:?} needs at least one producer")]
    NoProducers(Mode),
    /// A mode that consumes has no consumers.
    #[error("mode {0:?} needs at least one consumer")]
    NoConsumers(Mode),
    /// More groups than consumers leaves groups empty.
    #[error("{groups} consumer groups for {consumers} consumers leaves groups empty")]
    EmptyGroups {
        /// Groups asked for.
        groups: u32,
        /// Consumers asked for.
        consumers: u32,
    },
    /// A count that must be positive is zero.
    #[error("{0} must be at least 1")]
    Zero(&'static str),
    /// Records must hold the producer's stamp.
    #[error("records of {bytes} bytes cannot hold the {min}-byte stamp")]
    RecordTooSmall {
        /// Bytes asked for.
        bytes: u32,
        /// The minimum.
        min: u32,
    },
    /// A percentage of the maximum rate outside 1..=100.
    #[error("a rate of {0}% of the maximum is outside 1..=100")]
    Percent(u8),
}

impl Workload {
    /// Checks the workload can run.
    ///
    /// # Errors
    /// The first [`WorkloadError`] found.
    pub fn validate(&self) -> Result<(), WorkloadError> {
        let produces = matches!(self.mode, Mode::Produce | Mode::ProduceConsume);
        let consumes = matches!(self.mode, Mode::Consume | Mode::ProduceConsume);
        if produces && self.producers == 0 {
            return Err(WorkloadError::NoProducers(self.mode));
        }
        if consumes && self.consumers == 0 {
            return Err(WorkloadError::NoConsumers(self.mode));
        }
        if self.consumer_groups > self.consumers {
            return Err(WorkloadError::EmptyGroups {
                groups: self.consumer_groups,
                consumers: self.consumers,
            });
        }
        for (name, value) in [
            ("topics", u64::from(self.topics)),
            ("partitions", u64::from(self.partitions)),
            ("batch_records", u64::from(self.batch_records)),
            ("in_flight", u64::from(self.in_flight)),
            ("key_cardinality", self.key_cardinality.unwrap_or(1)),
        ] {
            if value == 0 {
                return Err(WorkloadError::Zero(name));
            }
        }
        match self.stop {
            Stop::Seconds(0) => return Err(WorkloadError::Zero("duration")),
            Stop::Records(0) => return Err(WorkloadError::Zero("records")),
            _ => {}
        }
        match self.rate {
            Rate::Fixed(0) => return Err(WorkloadError::Zero("rate")),
            Rate::PercentOfMax(p) if p == 0 || p > 100 => return Err(WorkloadError::Percent(p)),
            _ => {}
        }
        let min = STAMP_BYTES as u32;
        if self.record_bytes < min {
            return Err(WorkloadError::RecordTooSmall {
                bytes: self.record_bytes,
                min,
            });
        }
        Ok(())
    }

    /// Records each producer sends when the run stops by count (the remainder goes to
    /// the first producers), or `None` for a timed run.
    pub fn records_per_producer(&self, producer: u32) -> Option<u64> {
        let Stop::Records(total) = self.stop else {
            return None;
        };
        let producers = u64::from(self.producers.max(1));
        let extra = u64::from(u64::from(producer) < total % producers);
        Some(total / producers + extra)
    }
}

/// A named workload.
#[derive(Debug, Clone, Copy)]
pub struct Preset {
    /// The name `braid bench NAME` takes.
    pub name: &'static str,
    /// One line for `braid bench --list`.
    pub about: &'static str,
    build: fn() -> Workload,
}

impl Preset {
    /// The preset's workload, before command-line overrides.
    pub fn workload(&self) -> Workload {
        (self.build)()
    }

    /// The preset called `name`.
    ///
    /// # Errors
    /// [`WorkloadError::UnknownPreset`] if there is none.
    pub fn named(name: &str) -> Result<Workload, WorkloadError> {
        PRESETS
            .iter()
            .find(|p| p.name == name)
            .map(Preset::workload)
            .ok_or_else(|| WorkloadError::UnknownPreset(name.to_owned()))
    }
}

/// One producer, 1 KiB records in batches of 1,000, as fast as acknowledged, no fsync,
/// 30 seconds after 5 of warm-up: the base every preset changes.
fn throughput_1kb() -> Workload {
    Workload {
        mode: Mode::Produce,
        producers: 1,
        consumers: 0,
        consumer_groups: 0,
        topics: 1,
        partitions: 1,
        record_bytes: 1024,
        batch_records: 1_000,
        linger_ms: 0,
        in_flight: 8,
        key_cardinality: None,
        rate: Rate::Max,
        stop: Stop::Seconds(30),
        warmup_seconds: 5,
        fsync: Fsync::Never,
        sessions: false,
    }
}

/// The presets `braid bench --list` shows.
pub static PRESETS: &[Preset] = &[
    Preset {
        name: "throughput-1kb",
        about: "1 producer, 1 KiB records, batches of 1,000, max rate, fsync never",
        build: throughput_1kb,
    },
    Preset {
        name: "consume-1kb",
        about: "catch-up read of 1 KiB records by 1 consumer (produces them first)",
        build: || Workload {
            mode: Mode::Consume,
            consumers: 1,
            ..throughput_1kb()
        },
    },
    Preset {
        name: "end-to-end-1kb",
        about:
            "1 producer and 1 consumer at once, at half the measured max rate; end-to-end latency",
        // Unpaced, end-to-end latency would only measure how far the consumer falls
        // behind a producer that saturates the node.
        build: || Workload {
            mode: Mode::ProduceConsume,
            consumers: 1,
            rate: Rate::PercentOfMax(50),
            ..throughput_1kb()
        },
    },
    Preset {
        name: "latency-1kb",
        about: "1 producer, 1 KiB records, batches of 100, at half the measured max rate",
        build: || Workload {
            batch_records: 100,
            rate: Rate::PercentOfMax(50),
            ..throughput_1kb()
        },
    },
    Preset {
        name: "fsync-1kb",
        about: "as throughput-1kb with fsync before every acknowledgement",
        build: || Workload {
            fsync: Fsync::Always,
            ..throughput_1kb()
        },
    },
    Preset {
        name: "fanout",
        about: "1 producer, 4 consumer groups of 1 reading everything, end to end",
        build: || Workload {
            mode: Mode::ProduceConsume,
            consumers: 4,
            consumer_groups: 4,
            partitions: 4,
            key_cardinality: Some(10_000),
            ..throughput_1kb()
        },
    },
    Preset {
        name: "many-partitions",
        about: "16 producers over 1,000 partitions, keyed, 1 KiB records",
        build: || Workload {
            producers: 16,
            partitions: 1_000,
            batch_records: 100,
            linger_ms: 5,
            key_cardinality: Some(1_000_000),
            ..throughput_1kb()
        },
    },
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_preset_is_valid_and_named_once() {
        let mut names: Vec<&str> = PRESETS.iter().map(|p| p.name).collect();
        for preset in PRESETS {
            assert_eq!(preset.workload().validate(), Ok(()), "{}", preset.name);
            assert_eq!(Preset::named(preset.name), Ok(preset.workload()));
        }
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), PRESETS.len());
        assert_eq!(
            Preset::named("nope"),
            Err(WorkloadError::UnknownPreset("nope".into()))
        );
    }

    #[test]
    fn workloads_that_cannot_run_are_refused_with_the_value() {
        let base = throughput_1kb();
        let cases = [
            (
                Workload {
                    producers: 0,
                    ..base.clone()
                },
                WorkloadError::NoProducers(Mode::Produce),
            ),
            (
                Workload {
                    mode: Mode::Consume,
                    ..base.clone()
                },
                WorkloadError::NoConsumers(Mode::Consume),
            ),
            (
                Workload {
                    consumers: 1,
                    consumer_groups: 2,
                    ..base.clone()
                },
                WorkloadError::EmptyGroups {
                    groups: 2,
                    consumers: 1,
                },
            ),
            (
                Workload {
                    record_bytes: 8,
                    ..base.clone()
                },
                WorkloadError::RecordTooSmall { bytes: 8, min: 16 },
            ),
            (
                Workload {
                    partitions: 0,
                    ..base.clone()
                },
                WorkloadError::Zero("partitions"),
            ),
            (
                Workload {
                    key_cardinality: Some(0),
                    ..base.clone()
                },
                WorkloadError::Zero("key_cardinality"),
            ),
            (
                Workload {
                    stop: Stop::Records(0),
                    ..base.clone()
                },
                WorkloadError::Zero("records"),
            ),
            (
                Workload {
                    rate: Rate::PercentOfMax(101),
                    ..base.clone()
                },
                WorkloadError::Percent(101),
            ),
            (
                Workload {
                    rate: Rate::Fixed(0),
                    ..base
                },
                WorkloadError::Zero("rate"),
            ),
        ];
        for (workload, error) in cases {
            assert_eq!(workload.validate(), Err(error));
        }
    }

    #[test]
    fn a_record_count_is_split_over_producers_without_losing_any() {
        for (total, producers) in [(10u64, 3u32), (1_000_000, 16), (5, 8), (7, 1)] {
            let workload = Workload {
                producers,
                stop: Stop::Records(total),
                ..throughput_1kb()
            };
            let sum: u64 = (0..producers)
                .map(|p| workload.records_per_producer(p).unwrap())
                .sum();
            assert_eq!(sum, total);
        }
        assert_eq!(throughput_1kb().records_per_producer(0), None);
    }
}
