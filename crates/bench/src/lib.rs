//! The engine behind `braid bench`, built in the pieces that need no node:
//! - [`workload`]: what a run does (producers, consumers, sizes, rate, stop rule) and the
//!   named presets, validated into typed errors;
//! - [`pacing`]: a token bucket that gives every batch its *intended* send time, so
//!   latency is measured from when a record should have gone out and a stalled sender
//!   cannot hide its stall (coordinated omission);
//! - [`report`]: HDR latency summaries, throughput, ratios against raw references, and
//!   the JSON that scripts read;
//! - [`stamp`]: the producer timestamp carried in each record for end-to-end latency.
//!
//! All of them are pure: the clock is an input, so tests drive them with exact times.

pub mod pacing;
pub mod report;
pub mod stamp;
pub mod workload;

pub use pacing::{Pacer, Pacing};
pub use report::{LatencySummary, Recorder, References, Report, Sample, Throughput};
pub use stamp::{read_stamp, write_stamp, StampError, STAMP_BYTES};
pub use workload::{Fsync, Mode, Preset, Rate, Stop, Workload, WorkloadError, PRESETS};
