//! The engine behind `braid bench`.
//!
//! Pure pieces, with the clock as an input so tests drive them with exact times:
//! - [`workload`]: what a run does (producers, consumers, sizes, rate, stop rule) and the
//!   named presets, validated into typed errors;
//! - [`pacing`]: a token bucket that gives every batch its *intended* send time, so
//!   latency is measured from when a record should have gone out and a stalled sender
//!   cannot hide its stall (coordinated omission);
//! - [`report`]: HDR latency summaries, throughput, ratios against raw references, and
//!   the JSON that scripts read;
//! - [`stamp`]: the producer timestamp carried in each record for end-to-end latency.
//!
//! And the shell that uses them:
//! - [`runner`]: drives a workload against a node over real sockets;
//! - [`embedded`]: a node in the same process on a temporary directory;
//! - [`reference`]: raw file write and loopback TCP, measured in the same run;
//! - [`retire`]: seed 001's experiment, the time to retire sessions that touched
//!   every partition;
//! - [`chart`]: the SVG of throughput over time and latency percentiles.

pub mod chart;
pub mod embedded;
pub mod pacing;
pub mod reference;
pub mod report;
pub mod retire;
pub mod runner;
pub mod stamp;
pub mod workload;

pub use chart::ChartError;
pub use embedded::{EmbeddedError, EmbeddedNode, EMBEDDED_MEMBERS_MAX};
pub use pacing::{Pacer, Pacing};
pub use report::{
    LatencySummary, Recorder, References, Report, Sample, Throughput, CURVE_QUANTILES,
    REPORT_FIELDS,
};
pub use runner::{run, BenchError, Counters, Phase, RunOptions, Target};
pub use stamp::{read_stamp, write_stamp, StampError, STAMP_BYTES};
pub use workload::{Fsync, Mode, Preset, Rate, Stop, Workload, WorkloadError, PRESETS};
