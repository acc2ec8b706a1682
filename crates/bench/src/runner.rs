//! Runs a [`Workload`] against a node over the client protocol, and measures it.
//!
//! Every run gets a fresh stream (`bench-<pid>-<ms>`) holding its topics, deleted at the
//! end unless asked to keep it, so runs against a shared node do not mix. Producers build
//! their own batches (so acknowledgement latency is measured per batch from its
//! intended send time, and no per-record future stands between the tool and the
//! node); consumers use the SDK's [`Consumer`] in its zero-copy mode.
//!
//! Phases: for a rate given as a percentage of the maximum, an unpaced probe on its own
//! topics first; then for a catch-up read, a preload of the data; then the run itself,
//! whose first `warmup_seconds` are sent and checked but not measured.

use std::collections::HashMap;
use std::num::NonZeroU64;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use braid_client::{Client, ClientError, Consumer, ConsumerConfig, RecordView, Router, StartFrom};
use braid_proto::client::{
    Request, Response, TopicSettings, FSYNC_ALWAYS, FSYNC_INTERVAL, FSYNC_NEVER,
};
use braid_proto::BatchBuilder;
use thiserror::Error;

use crate::pacing::{Pacer, Pacing};
use crate::report::{Recorder, Report, Sample, Throughput, CURVE_QUANTILES};
use crate::stamp::{read_stamp, write_stamp};
use crate::workload::{Fsync, Mode, Rate, Stop, Workload, WorkloadError};

mod consume;
mod produce;

use consume::{check_units, join_consumers, spawn_consumers, ConsumerShared};
use produce::{join_producers, spawn_producers, ProducerPlan};

/// How long the unpaced probe of a `PercentOfMax` rate runs. Only its second half
/// counts: a node's first seconds of writing land in free page cache and run faster
/// than it can keep up once write-back has to follow, and half of a burst rate is not a
/// rate a latency run can hold.
const PROBE: Duration = Duration::from_secs(10);
/// How long consumers may take, after the producers stop, to read what was produced.
const DRAIN: Duration = Duration::from_secs(60);
/// How far ahead of its schedule a paced batch may go out: one tick of the runtime's
/// millisecond timer (see [`Pacer::with_lead`]).
const PACING_LEAD: Duration = Duration::from_millis(1);
/// How long a consumer's fetch waits for data.
const POLL: Duration = Duration::from_millis(100);

/// Why a run failed.
#[derive(Debug, Error)]
pub enum BenchError {
    /// The workload cannot run.
    #[error(transparent)]
    Workload(#[from] WorkloadError),
    /// The node refused or the connection failed during setup or teardown.
    #[error("{what}: {source}")]
    Client {
        /// What the run was doing.
        what: String,
        /// The client's error.
        source: ClientError,
    },
    /// Consumers did not read every acknowledged record in time.
    #[error("consumers read {consumed} records where {expected} were due (every group, or plain consumer, reads each acknowledged record once; they had {DRAIN:?} after the producers stopped)")]
    Incomplete {
        /// Records the consumers should have read in all.
        expected: u64,
        /// Records they read.
        consumed: u64,
    },
    /// The probe for a percentage of the maximum rate acknowledged nothing.
    #[error("the probe of the maximum rate acknowledged no record")]
    NoProbeRate,
    /// The retirement experiment could not finish (`crate::retire`).
    #[error("retirement: {0}")]
    Retirement(String),
}

fn client_error(what: impl Into<String>) -> impl FnOnce(ClientError) -> BenchError {
    let what = what.into();
    move |source| BenchError::Client { what, source }
}

/// What the run is doing now, for progress displays.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Phase {
    /// Creating the stream and topics.
    Setup = 0,
    /// Measuring the maximum rate for a `PercentOfMax` rate.
    Probe = 1,
    /// Writing the data a catch-up read will read.
    Preload = 2,
    /// Running, not yet measured.
    Warmup = 3,
    /// Running and measured.
    Measure = 4,
    /// Producers stopped; consumers finishing.
    Drain = 5,
    /// Deleting the stream.
    Teardown = 6,
    /// Finished.
    Done = 7,
}

impl Phase {
    /// A word for displays.
    pub fn name(self) -> &'static str {
        match self {
            Phase::Setup => "setup",
            Phase::Probe => "probe",
            Phase::Preload => "preload",
            Phase::Warmup => "warm-up",
            Phase::Measure => "measure",
            Phase::Drain => "drain",
            Phase::Teardown => "teardown",
            Phase::Done => "done",
        }
    }

    fn from_u8(value: u8) -> Self {
        match value {
            0 => Phase::Setup,
            1 => Phase::Probe,
            2 => Phase::Preload,
            3 => Phase::Warmup,
            4 => Phase::Measure,
            5 => Phase::Drain,
            6 => Phase::Teardown,
            _ => Phase::Done,
        }
    }
}

/// Live counters of a run, shared with whatever shows progress.
#[derive(Debug, Default)]
pub struct Counters {
    /// Records acknowledged.
    pub produced: AtomicU64,
    /// Value bytes acknowledged.
    pub produced_bytes: AtomicU64,
    /// Records consumed (by all consumers).
    pub consumed: AtomicU64,
    /// Value bytes consumed.
    pub consumed_bytes: AtomicU64,
    /// Failed produces and fetches.
    pub errors: AtomicU64,
    phase: AtomicU8,
}

impl Counters {
    /// The current phase.
    pub fn phase(&self) -> Phase {
        Phase::from_u8(self.phase.load(Ordering::Relaxed))
    }

    fn set_phase(&self, phase: Phase) {
        self.phase.store(phase as u8, Ordering::Relaxed);
    }

    fn snapshot(&self) -> [u64; 4] {
        [
            self.produced.load(Ordering::Relaxed),
            self.produced_bytes.load(Ordering::Relaxed),
            self.consumed.load(Ordering::Relaxed),
            self.consumed_bytes.load(Ordering::Relaxed),
        ]
    }
}

/// Options of a run that are not part of the workload.
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    /// Keep the run's stream and its data afterwards.
    pub keep: bool,
}

/// Names of the run's stream and topics.
#[derive(Debug, Clone)]
struct Names {
    stream: String,
    topics: Vec<String>,
}

/// Where the benchmark connects: the addresses of one node or of cluster members (the
/// client learns the rest of the cluster from the first that answers) and how to
/// connect (TLS, a login). Cheap to clone.
#[derive(Debug, Clone)]
pub struct Target(Arc<(Vec<std::net::SocketAddr>, braid_client::ConnectOptions)>);

impl Target {
    /// The node at `addr`, reached with `options`.
    pub fn new(addr: std::net::SocketAddr, options: braid_client::ConnectOptions) -> Self {
        Self::cluster(vec![addr], options)
    }

    /// Members of a cluster at `addrs`, reached with `options`.
    pub fn cluster(
        addrs: Vec<std::net::SocketAddr>,
        options: braid_client::ConnectOptions,
    ) -> Self {
        Self(Arc::new((addrs, options)))
    }

    /// A plain connection to `addr`.
    pub fn plain(addr: std::net::SocketAddr) -> Self {
        Self::new(addr, braid_client::ConnectOptions::default())
    }

    pub(crate) async fn connect(&self) -> Result<Client, braid_client::ClientError> {
        let (addrs, options) = &*self.0;
        let seeds: Vec<String> = addrs.iter().map(ToString::to_string).collect();
        let seeds: Vec<&str> = seeds.iter().map(String::as_str).collect();
        Client::connect_cluster(&seeds, options).await
    }
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let addrs: Vec<String> = self.0 .0.iter().map(ToString::to_string).collect();
        f.write_str(&addrs.join(","))
    }
}

/// Runs `workload` against the node at `addr`, updating `counters` as it goes.
///
/// # Errors
/// [`BenchError`] if the workload is invalid, setup or teardown fails, or consumers do
/// not read every acknowledged record. Failed produces and fetches during the run are
/// counted in the report, not returned.
pub async fn run(
    addr: &Target,
    workload: &Workload,
    options: &RunOptions,
    counters: Arc<Counters>,
) -> Result<Report, BenchError> {
    workload.validate()?;
    counters.set_phase(Phase::Setup);
    let admin = addr
        .connect()
        .await
        .map_err(client_error(format!("connecting to {addr}")))?;
    let millis = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    let stream = format!("bench-{}-{millis}", std::process::id());
    admin
        .create_stream(&stream)
        .await
        .map_err(client_error(format!("creating stream {stream}")))?;
    let result = run_in_stream(addr, &admin, &stream, workload, &counters).await;
    counters.set_phase(Phase::Teardown);
    if !options.keep {
        let deleted = admin.delete_stream(&stream).await;
        if result.is_ok() {
            deleted.map_err(client_error(format!("deleting stream {stream}")))?;
        }
    }
    counters.set_phase(Phase::Done);
    result
}

async fn run_in_stream(
    addr: &Target,
    admin: &Client,
    stream: &str,
    workload: &Workload,
    counters: &Arc<Counters>,
) -> Result<Report, BenchError> {
    let names = create_topics(admin, stream, "t", workload).await?;
    let mut probed_max = None;
    let rate = match workload.rate {
        Rate::Max => None,
        Rate::Fixed(rate) => NonZeroU64::new(rate),
        Rate::PercentOfMax(percent) => {
            counters.set_phase(Phase::Probe);
            let probe = create_topics(admin, stream, "probe", workload).await?;
            let max = probe_max_rate(addr, &probe, workload).await?;
            // The probe's data would only weigh on the run (its dirty pages, its disk).
            for topic in &probe.topics {
                admin
                    .delete_topic(stream, topic)
                    .await
                    .map_err(client_error(format!("deleting probe topic {topic}")))?;
            }
            probed_max = Some(max);
            Some(NonZeroU64::new(max * u64::from(percent) / 100).ok_or(BenchError::NoProbeRate)?)
        }
    };
    let mut report = match workload.mode {
        Mode::Consume => catch_up(addr, &names, workload, rate, counters).await?,
        Mode::Produce | Mode::ProduceConsume => {
            live(addr, &names, workload, rate, counters).await?
        }
    };
    report.probed_max_rate = probed_max;
    report.target_rate = rate.map(NonZeroU64::get);
    Ok(report)
}

async fn create_topics(
    admin: &Client,
    stream: &str,
    prefix: &str,
    workload: &Workload,
) -> Result<Names, BenchError> {
    let (fsync, fsync_interval_ms) = match workload.fsync {
        Fsync::Never => (FSYNC_NEVER, 0),
        Fsync::Always => (FSYNC_ALWAYS, 0),
        Fsync::IntervalMs(ms) => (FSYNC_INTERVAL, ms),
    };
    let mut topics = Vec::new();
    for t in 0..workload.topics {
        let topic = format!("{prefix}{t}");
        let settings = TopicSettings {
            partitions: workload.partitions,
            fsync,
            fsync_interval_ms,
            ..TopicSettings::default()
        };
        admin
            .create_topic(stream, &topic, settings)
            .await
            .map_err(client_error(format!("creating topic {stream}/{topic}")))?;
        topics.push(topic);
    }
    Ok(Names {
        stream: stream.to_owned(),
        topics,
    })
}

/// The unpaced produce rate over [`PROBE`], in records per second.
async fn probe_max_rate(
    addr: &Target,
    names: &Names,
    workload: &Workload,
) -> Result<u64, BenchError> {
    let probe = Workload {
        stop: Stop::Seconds(PROBE.as_secs()),
        warmup_seconds: 0,
        ..workload.clone()
    };
    let counters = Arc::new(Counters::default());
    let clock = RunClock::new(Duration::ZERO);
    let plan = ProducerPlan {
        names: names.clone(),
        workload: probe,
        rate: None,
        clock,
    };
    let results = spawn_producers(addr, &plan, &counters).await?;
    tokio::time::sleep_until((clock.start + PROBE / 2).into()).await;
    let (half_at, half) = (clock.now(), counters.produced.load(Ordering::Relaxed));
    join_producers(results).await;
    let produced = counters.produced.load(Ordering::Relaxed) - half;
    let seconds = clock.now().saturating_sub(half_at).as_secs_f64();
    Ok((produced as f64 / seconds.max(1e-3)) as u64)
}

/// The run's time base: stamps and pacing count from `start`; figures count from
/// `start + warmup`.
#[derive(Debug, Clone, Copy)]
struct RunClock {
    start: Instant,
    warmup: Duration,
}

impl RunClock {
    fn new(warmup: Duration) -> Self {
        Self {
            start: Instant::now(),
            warmup,
        }
    }

    fn now(&self) -> Duration {
        self.start.elapsed()
    }

    fn measured(&self, at: Duration) -> bool {
        at >= self.warmup
    }
}

type Task<T> = tokio::task::JoinHandle<T>;
type ConsumerTask = Task<Result<Recorder, BenchError>>;

/// Samples the counters once a second into the timeline until `stop` is set.
fn spawn_sampler(
    counters: Arc<Counters>,
    clock: RunClock,
    stop: Arc<tokio::sync::Notify>,
) -> Task<(Vec<Sample>, Option<[u64; 4]>)> {
    tokio::spawn(async move {
        let mut timeline = Vec::new();
        let mut last = counters.snapshot();
        let mut at_warmup = None;
        let mut tick = tokio::time::interval_at(
            (clock.start + Duration::from_secs(1)).into(),
            Duration::from_secs(1),
        );
        let mut second = 0;
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                () = stop.notified() => return (timeline, at_warmup),
            }
            let now = counters.snapshot();
            second += 1;
            timeline.push(Sample {
                second,
                produced: now[0] - last[0],
                consumed: now[2] - last[2],
            });
            last = now;
            if at_warmup.is_none() && clock.now() >= clock.warmup {
                // Close enough for the timeline; the figures use exact marks.
                at_warmup = Some(now);
                counters.set_phase(Phase::Measure);
            }
        }
    })
}

/// Produce (and consume) at the same time: `Produce` and `ProduceConsume` modes.
async fn live(
    addr: &Target,
    names: &Names,
    workload: &Workload,
    rate: Option<NonZeroU64>,
    counters: &Arc<Counters>,
) -> Result<Report, BenchError> {
    let consumes = workload.mode == Mode::ProduceConsume;
    let clock = RunClock::new(Duration::from_secs(workload.warmup_seconds));
    let shared = Arc::new(ConsumerShared {
        names: names.clone(),
        clock,
        counters: Arc::clone(counters),
        expected: AtomicU64::new(u64::MAX),
        give_up: Mutex::new(None),
        record_bytes: u64::from(workload.record_bytes),
        end_to_end: true,
    });
    let (units, consumer_tasks) = if consumes {
        spawn_consumers(addr, &shared, workload)
    } else {
        (Vec::new(), Vec::new())
    };
    counters.set_phase(if workload.warmup_seconds > 0 {
        Phase::Warmup
    } else {
        Phase::Measure
    });
    let plan = ProducerPlan {
        names: names.clone(),
        workload: workload.clone(),
        rate,
        clock,
    };
    let stop_sampler = Arc::new(tokio::sync::Notify::new());
    let sampler = spawn_sampler(Arc::clone(counters), clock, Arc::clone(&stop_sampler));
    // Exact marks of the measured window: counters at the end of warm-up and at the end.
    // Without a warm-up the mark is taken here, before any producer runs: a task woken
    // "at once" may run only after the first acknowledgements on a loaded machine, and
    // would then leave them out of the window.
    let start_mark = (clock.now(), counters.snapshot());
    let warmup_mark = (workload.warmup_seconds > 0).then(|| {
        let counters = Arc::clone(counters);
        tokio::spawn(async move {
            tokio::time::sleep_until((clock.start + clock.warmup).into()).await;
            (clock.now(), counters.snapshot())
        })
    });
    let ack = join_producers(spawn_producers(addr, &plan, counters).await?).await;
    let end = (clock.now(), counters.snapshot());
    let (warm_at, warm) = match warmup_mark {
        Some(mark) if mark.is_finished() => mark.await.unwrap_or(start_mark),
        Some(mark) => {
            // The run ended inside its warm-up (a small record count): measure it all.
            mark.abort();
            start_mark
        }
        None => start_mark,
    };
    let window = end.0.saturating_sub(warm_at);
    let produce = Throughput::new(end.1[0] - warm[0], end.1[1] - warm[1], window);

    let mut end_to_end = Recorder::new();
    let mut consume = None;
    if consumes {
        counters.set_phase(Phase::Drain);
        let produced = counters.produced.load(Ordering::Relaxed);
        shared.expected.store(produced, Ordering::Relaxed);
        if let Ok(mut give_up) = shared.give_up.lock() {
            *give_up = Some(Instant::now() + DRAIN);
        }
        end_to_end = join_consumers(consumer_tasks).await?;
        check_units(&units, produced)?;
        // Consumers are measured until they have read everything, so a consumer that
        // falls behind shows in its rate instead of being cut off at the producers' end.
        let (done_at, done) = (clock.now(), counters.snapshot());
        consume = Some(Throughput::new(
            done[2] - warm[2],
            done[3] - warm[3],
            done_at.saturating_sub(warm_at),
        ));
    }
    stop_sampler.notify_one();
    let (timeline, _) = sampler.await.unwrap_or_default();
    Ok(report(
        workload,
        (Some(produce), consume),
        &ack,
        consumes.then_some(&end_to_end),
        counters,
        timeline,
    ))
}

/// `Consume` mode: preload the data, then read it all back as fast as possible.
async fn catch_up(
    addr: &Target,
    names: &Names,
    workload: &Workload,
    rate: Option<NonZeroU64>,
    counters: &Arc<Counters>,
) -> Result<Report, BenchError> {
    counters.set_phase(Phase::Preload);
    let preload = Workload {
        warmup_seconds: 0,
        ..workload.clone()
    };
    let clock = RunClock::new(Duration::ZERO);
    let plan = ProducerPlan {
        names: names.clone(),
        workload: preload,
        rate,
        clock,
    };
    let ack = join_producers(spawn_producers(addr, &plan, counters).await?).await;
    let preloaded = counters.snapshot();
    let preload_time = clock.now();
    let produce = Throughput::new(preloaded[0], preloaded[1], preload_time);

    counters.set_phase(Phase::Measure);
    let clock = RunClock::new(Duration::ZERO);
    let shared = Arc::new(ConsumerShared {
        names: names.clone(),
        clock,
        counters: Arc::clone(counters),
        expected: AtomicU64::new(preloaded[0]),
        give_up: Mutex::new(Some(Instant::now() + DRAIN.max(preload_time * 10))),
        record_bytes: u64::from(workload.record_bytes),
        end_to_end: false,
    });
    let stop_sampler = Arc::new(tokio::sync::Notify::new());
    let sampler = spawn_sampler(Arc::clone(counters), clock, Arc::clone(&stop_sampler));
    let (units, tasks) = spawn_consumers(addr, &shared, workload);
    join_consumers(tasks).await?;
    let elapsed = clock.now();
    stop_sampler.notify_one();
    let (timeline, _) = sampler.await.unwrap_or_default();
    check_units(&units, preloaded[0])?;
    let read = counters.snapshot();
    let consume = Throughput::new(read[2], read[3], elapsed);
    // End-to-end latency means nothing for data written before the read began.
    Ok(report(
        workload,
        (Some(produce), Some(consume)),
        &ack,
        None,
        counters,
        timeline,
    ))
}

/// The report of a run, before the caller adds the rate and references.
fn report(
    workload: &Workload,
    (produce, consume): (Option<Throughput>, Option<Throughput>),
    ack: &Recorder,
    end_to_end: Option<&Recorder>,
    counters: &Counters,
    timeline: Vec<Sample>,
) -> Report {
    Report {
        target: String::new(),
        workload: workload.clone(),
        produce,
        consume,
        ack_latency: Some(ack.summary()),
        end_to_end_latency: end_to_end.map(Recorder::summary),
        ack_curve: ack.curve(CURVE_QUANTILES),
        end_to_end_curve: end_to_end.map_or_else(Vec::new, |r| r.curve(CURVE_QUANTILES)),
        errors: counters.errors.load(Ordering::Relaxed),
        target_rate: None,
        probed_max_rate: None,
        references: None,
        timeline,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phases_round_trip_through_their_byte() {
        for phase in [
            Phase::Setup,
            Phase::Probe,
            Phase::Preload,
            Phase::Warmup,
            Phase::Measure,
            Phase::Drain,
            Phase::Teardown,
            Phase::Done,
        ] {
            assert_eq!(Phase::from_u8(phase as u8), phase);
        }
    }
}
