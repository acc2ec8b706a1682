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

/// Runs `workload` against the node at `addr`, updating `counters` as it goes.
///
/// # Errors
/// [`BenchError`] if the workload is invalid, setup or teardown fails, or consumers do
/// not read every acknowledged record. Failed produces and fetches during the run are
/// counted in the report, not returned.
pub async fn run(
    addr: std::net::SocketAddr,
    workload: &Workload,
    options: &RunOptions,
    counters: Arc<Counters>,
) -> Result<Report, BenchError> {
    workload.validate()?;
    counters.set_phase(Phase::Setup);
    let admin = Client::connect(addr)
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
    addr: std::net::SocketAddr,
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
    addr: std::net::SocketAddr,
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

#[derive(Debug, Clone)]
struct ProducerPlan {
    names: Names,
    workload: Workload,
    rate: Option<NonZeroU64>,
    clock: RunClock,
}

type Task<T> = tokio::task::JoinHandle<T>;
type ConsumerTask = Task<Result<Recorder, BenchError>>;

/// Starts one task per producer; each returns its acknowledgement latencies.
async fn spawn_producers(
    addr: std::net::SocketAddr,
    plan: &ProducerPlan,
    counters: &Arc<Counters>,
) -> Result<Vec<Task<Recorder>>, BenchError> {
    let mut tasks = Vec::new();
    let producers = plan.workload.producers;
    // Each producer paces its share of the rate; the shares add up to the rate.
    let share = |p: u32| {
        plan.rate.and_then(|rate| {
            let base = rate.get() / u64::from(producers);
            let extra = u64::from(u64::from(p) < rate.get() % u64::from(producers));
            NonZeroU64::new(base + extra)
        })
    };
    for p in 0..producers {
        let client = Client::connect(addr)
            .await
            .map_err(client_error(format!("connecting producer {p}")))?;
        let mut routers = Vec::new();
        for topic in &plan.names.topics {
            let info = client
                .describe_topic(&plan.names.stream, topic)
                .await
                .map_err(client_error(format!("describing {topic}")))?;
            routers.push(Router::new(&info).map_err(client_error(format!("routing {topic}")))?);
        }
        let producer = ProducerTask {
            id: p,
            client,
            plan: plan.clone(),
            routers,
            pacer: Pacer::new(share(p)).with_lead(PACING_LEAD),
            counters: Arc::clone(counters),
        };
        tasks.push(tokio::spawn(producer.run()));
    }
    Ok(tasks)
}

/// A batch being filled for one partition.
struct OpenBatch {
    builder: BatchBuilder,
    records: u32,
    /// (intended send time, records) of each paced chunk in the batch.
    chunks: Vec<(Duration, u32)>,
    opened: Instant,
}

/// A batch sent and not yet answered; its permit bounds the batches in flight.
struct InFlight {
    answer:
        std::pin::Pin<Box<dyn std::future::Future<Output = Result<Response, ClientError>> + Send>>,
    chunks: Vec<(Duration, u32)>,
    records: u32,
    _permit: tokio::sync::OwnedSemaphorePermit,
}

/// Where a producer's sent batches go: a task that awaits their answers in order and
/// takes each latency the moment its answer arrives, not when the sender next looks.
struct Pipeline {
    permits: Arc<tokio::sync::Semaphore>,
    sent: tokio::sync::mpsc::UnboundedSender<InFlight>,
}

struct ProducerTask {
    id: u32,
    client: Client,
    plan: ProducerPlan,
    routers: Vec<Router>,
    pacer: Pacer,
    counters: Arc<Counters>,
}

impl ProducerTask {
    async fn run(mut self) -> Recorder {
        let workload = &self.plan.workload;
        let clock = self.plan.clock;
        let value_bytes = workload.record_bytes as usize;
        let batch_records = workload.batch_records;
        let linger = Duration::from_millis(u64::from(workload.linger_ms));
        let in_flight_max = workload.in_flight as usize;
        let limit = workload.records_per_producer(self.id);
        let deadline = match workload.stop {
            Stop::Seconds(s) => Some(clock.warmup + Duration::from_secs(s)),
            Stop::Records(_) => None,
        };
        let mut value = vec![0x5au8; value_bytes];
        let mut rng = XorShift::new(u64::from(self.id) + 1);
        let mut open: HashMap<(usize, u32), OpenBatch> = HashMap::new();
        let (sent, answers) = tokio::sync::mpsc::unbounded_channel();
        let acknowledger = tokio::spawn(acknowledge(
            answers,
            clock,
            Arc::clone(&self.counters),
            u64::from(workload.record_bytes),
        ));
        let mut in_flight = Pipeline {
            permits: Arc::new(tokio::sync::Semaphore::new(in_flight_max)),
            sent,
        };
        let mut sequence = 0u64;
        let mut next_keyless = self.id as usize;
        loop {
            let now = clock.now();
            let remaining = limit.map_or(u64::MAX, |l| l - sequence);
            if remaining == 0 || deadline.is_some_and(|d| now >= d) {
                break;
            }
            let chunk = u64::from(batch_records).min(remaining);
            let intended = match self.pacer.take(now, chunk) {
                Pacing::Send { intended } => intended,
                Pacing::WaitUntil(at) => {
                    // Sleep until the tokens accrue, or a lingering batch is due.
                    let linger_due = open.values().map(|b| b.opened + linger).min();
                    let wake = clock.start + at;
                    let wake = linger_due.map_or(wake, |l| l.min(wake));
                    tokio::time::sleep_until(wake.into()).await;
                    self.close_lingering(&mut open, &mut in_flight, linger, true)
                        .await;
                    continue;
                }
            };
            let keyless_at = next_keyless;
            next_keyless += 1;
            let topic = keyless_at % self.routers.len();
            // Keyless records of a chunk share a partition, the next one round robin.
            let keyless_partition = {
                let router = &self.routers[topic];
                let pick = (keyless_at / self.routers.len()) % router.partitions().count().max(1);
                router.partitions().nth(pick).unwrap_or(0)
            };
            // Real timestamps: a node's retention by age judges segments by them.
            let timestamp_ms = wall_clock_ms();
            for _ in 0..chunk {
                // Sequence numbers are unique per producer: the producer id is the top 16 bits.
                let sent_ns = u64::try_from(intended.as_nanos()).unwrap_or(u64::MAX);
                // `validate` keeps records at least a stamp long.
                let _ = write_stamp(&mut value, (u64::from(self.id) << 48) | sequence, sent_ns);
                sequence += 1;
                let key_bytes = workload
                    .key_cardinality
                    .map(|cardinality| (rng.next() % cardinality).to_be_bytes());
                let key = key_bytes.as_ref().map(|k| &k[..]);
                let partition = match key {
                    Some(key) => match self.routers[topic].partition_for_key(key) {
                        Some(partition) => partition,
                        None => {
                            self.counters.errors.fetch_add(1, Ordering::Relaxed);
                            continue;
                        }
                    },
                    None => keyless_partition,
                };
                let batch = open.entry((topic, partition)).or_insert_with(|| OpenBatch {
                    builder: BatchBuilder::with_capacity(
                        timestamp_ms,
                        (value_bytes + 32) * batch_records as usize,
                    ),
                    records: 0,
                    chunks: Vec::new(),
                    opened: Instant::now(),
                });
                batch.builder.push(key, Some(&value), &[], timestamp_ms);
                batch.records += 1;
                match batch.chunks.last_mut() {
                    Some((at, n)) if *at == intended => *n += 1,
                    _ => batch.chunks.push((intended, 1)),
                }
                if batch.records >= batch_records {
                    if let Some(full) = open.remove(&(topic, partition)) {
                        self.send(topic, partition, full, &mut in_flight).await;
                    }
                }
            }
            self.close_lingering(&mut open, &mut in_flight, linger, linger.is_zero())
                .await;
        }
        self.close_lingering(&mut open, &mut in_flight, linger, true)
            .await;
        drop(in_flight);
        acknowledger.await.unwrap_or_default()
    }

    /// Sends open batches whose linger has passed (all of them if `all`).
    async fn close_lingering(
        &self,
        open: &mut HashMap<(usize, u32), OpenBatch>,
        in_flight: &mut Pipeline,
        linger: Duration,
        all: bool,
    ) {
        let due: Vec<(usize, u32)> = open
            .iter()
            .filter(|(_, b)| all || b.opened.elapsed() >= linger)
            .map(|(k, _)| *k)
            .collect();
        for (topic, partition) in due {
            if let Some(batch) = open.remove(&(topic, partition)) {
                self.send(topic, partition, batch, in_flight).await;
            }
        }
    }

    /// Sends a batch once fewer than `in_flight` are unanswered.
    async fn send(&self, topic: usize, partition: u32, batch: OpenBatch, in_flight: &mut Pipeline) {
        let Ok(permit) = Arc::clone(&in_flight.permits).acquire_owned().await else {
            return;
        };
        let bytes = batch.builder.finish();
        let request = Request::Produce {
            stream: &self.plan.names.stream,
            topic: &self.plan.names.topics[topic],
            partition,
            batch: &bytes,
        };
        // The acknowledger outlives the sender, so this cannot fail while we send.
        let _ = in_flight.sent.send(InFlight {
            answer: Box::pin(self.client.start_call(&request)),
            chunks: batch.chunks,
            records: batch.records,
            _permit: permit,
        });
    }
}

/// Awaits a producer's answers in the order sent (the connection answers in order),
/// counting and timing each as it arrives; returns the acknowledgement latencies.
async fn acknowledge(
    mut answers: tokio::sync::mpsc::UnboundedReceiver<InFlight>,
    clock: RunClock,
    counters: Arc<Counters>,
    record_bytes: u64,
) -> Recorder {
    let mut latencies = Recorder::new();
    while let Some(sent) = answers.recv().await {
        let answer = sent.answer.await;
        let now = clock.now();
        match answer {
            Ok(Response::Produced { .. }) => {
                let records = u64::from(sent.records);
                counters.produced.fetch_add(records, Ordering::Relaxed);
                counters
                    .produced_bytes
                    .fetch_add(records * record_bytes, Ordering::Relaxed);
                for (intended, records) in sent.chunks {
                    if clock.measured(intended) {
                        latencies.record_n(now.saturating_sub(intended), u64::from(records));
                    }
                }
            }
            Ok(_) | Err(_) => {
                counters.errors.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
    latencies
}

/// Milliseconds since the Unix epoch, the records' timestamps.
fn wall_clock_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// A small fast generator for keys; quality only needs to spread keys evenly.
struct XorShift(u64);

impl XorShift {
    fn new(seed: u64) -> Self {
        Self(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1)
    }

    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

/// A set of consumers that together read every record once: a group, or one plain
/// consumer of every partition.
#[derive(Debug, Default)]
struct ReadingUnit {
    consumed: AtomicU64,
}

/// What every consumer shares.
#[derive(Debug)]
struct ConsumerShared {
    names: Names,
    clock: RunClock,
    counters: Arc<Counters>,
    /// Records each unit must read; `u64::MAX` until the producers have stopped.
    expected: AtomicU64,
    /// Set when the drain deadline passes.
    give_up: Mutex<Option<Instant>>,
    record_bytes: u64,
    /// End-to-end latency means something (not for data written before the read).
    end_to_end: bool,
}

/// One consumer task: a consumer per topic, each a group member or plain.
async fn consume(
    addr: std::net::SocketAddr,
    shared: Arc<ConsumerShared>,
    unit: Arc<ReadingUnit>,
    group: Option<String>,
    member: u32,
) -> Result<Recorder, BenchError> {
    let client = Client::connect(addr)
        .await
        .map_err(client_error(format!("connecting consumer {member}")))?;
    let config = ConsumerConfig {
        start_from: StartFrom::Earliest,
        fetch_bytes_max: 4 << 20,
        auto_commit: Some(Duration::from_secs(1)),
        ..ConsumerConfig::default()
    };
    let mut consumers = Vec::new();
    for topic in &shared.names.topics {
        let consumer = match &group {
            Some(group) => {
                Consumer::join_group(
                    &client,
                    &shared.names.stream,
                    topic,
                    group,
                    &format!("bench-{member}"),
                    config,
                )
                .await
            }
            None => Consumer::all_partitions(&client, &shared.names.stream, topic, config).await,
        };
        consumers.push(consumer.map_err(client_error(format!("starting consumer {member}")))?);
    }
    let mut latencies = Recorder::new();
    let counters = &shared.counters;
    while unit.consumed.load(Ordering::Relaxed) < shared.expected.load(Ordering::Relaxed) {
        if shared
            .give_up
            .lock()
            .ok()
            .and_then(|g| *g)
            .is_some_and(|at| Instant::now() >= at)
        {
            break;
        }
        for consumer in &mut consumers {
            // Records of one poll arrived together: the time is taken at the first one,
            // after the fetch answered (not before the poll, which may wait).
            let mut arrived: Option<Duration> = None;
            let mut bad = 0u64;
            let polled = consumer
                .poll_each(POLL, |_, _, record: &RecordView<'_>| {
                    let now = *arrived.get_or_insert_with(|| shared.clock.now());
                    // Every benchmark record has a stamp and a real timestamp.
                    if record.timestamp_ms <= 0 {
                        bad += 1;
                    }
                    match record.value.map(read_stamp) {
                        Some(Ok((_, sent_ns))) => {
                            let sent = Duration::from_nanos(sent_ns);
                            if shared.end_to_end && shared.clock.measured(sent) {
                                latencies.record(now.saturating_sub(sent));
                            }
                        }
                        _ => bad += 1,
                    }
                })
                .await;
            match polled {
                Ok(read) => {
                    unit.consumed.fetch_add(read, Ordering::Relaxed);
                    counters.consumed.fetch_add(read, Ordering::Relaxed);
                    counters
                        .consumed_bytes
                        .fetch_add(read * shared.record_bytes, Ordering::Relaxed);
                }
                Err(err) => {
                    tracing::warn!(%err, "bench fetch failed");
                    counters.errors.fetch_add(1, Ordering::Relaxed);
                    tokio::time::sleep(POLL).await;
                }
            }
            counters.errors.fetch_add(bad, Ordering::Relaxed);
        }
    }
    for consumer in consumers {
        // Leaving the group is tidiness; the stream is deleted afterwards anyway.
        let _ = consumer.close().await;
    }
    Ok(latencies)
}

/// Starts the consumer tasks: `consumer_groups` groups sharing the consumers, or with
/// no groups, each consumer reading every partition on its own.
fn spawn_consumers(
    addr: std::net::SocketAddr,
    shared: &Arc<ConsumerShared>,
    workload: &Workload,
) -> (Vec<Arc<ReadingUnit>>, Vec<ConsumerTask>) {
    let units_count = if workload.consumer_groups == 0 {
        workload.consumers
    } else {
        workload.consumer_groups
    };
    let units: Vec<Arc<ReadingUnit>> = (0..units_count)
        .map(|_| Arc::new(ReadingUnit::default()))
        .collect();
    let mut tasks = Vec::new();
    for c in 0..workload.consumers {
        let u = (c % units_count) as usize;
        let group = (workload.consumer_groups > 0).then(|| format!("bench-group-{u}"));
        tasks.push(tokio::spawn(consume(
            addr,
            Arc::clone(shared),
            Arc::clone(&units[u]),
            group,
            c,
        )));
    }
    (units, tasks)
}

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
    addr: std::net::SocketAddr,
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
    let warmup_mark = {
        let counters = Arc::clone(counters);
        tokio::spawn(async move {
            tokio::time::sleep_until((clock.start + clock.warmup).into()).await;
            (clock.now(), counters.snapshot())
        })
    };
    let ack = join_producers(spawn_producers(addr, &plan, counters).await?).await;
    let end = (clock.now(), counters.snapshot());
    let (warm_at, warm) = if warmup_mark.is_finished() {
        warmup_mark.await.unwrap_or((Duration::ZERO, [0; 4]))
    } else {
        // The run ended inside its warm-up (a small record count): measure it all.
        warmup_mark.abort();
        (Duration::ZERO, [0; 4])
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

async fn join_consumers(tasks: Vec<ConsumerTask>) -> Result<Recorder, BenchError> {
    let mut merged = Recorder::new();
    for task in tasks {
        match task.await {
            Ok(Ok(recorder)) => merged.merge(&recorder),
            Ok(Err(err)) => return Err(err),
            Err(_) => {}
        }
    }
    Ok(merged)
}

/// Every reading unit read exactly what was acknowledged.
fn check_units(units: &[Arc<ReadingUnit>], produced: u64) -> Result<(), BenchError> {
    let consumed: u64 = units
        .iter()
        .map(|u| u.consumed.load(Ordering::Relaxed))
        .sum();
    let expected = produced * units.len() as u64;
    if consumed != expected {
        return Err(BenchError::Incomplete { expected, consumed });
    }
    Ok(())
}

/// `Consume` mode: preload the data, then read it all back as fast as possible.
async fn catch_up(
    addr: std::net::SocketAddr,
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

/// Waits for the producer tasks and merges their acknowledgement latencies.
async fn join_producers(tasks: Vec<Task<Recorder>>) -> Recorder {
    let mut merged = Recorder::new();
    for task in tasks {
        if let Ok(recorder) = task.await {
            merged.merge(&recorder);
        }
    }
    merged
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
    fn keys_spread_over_the_cardinality() {
        let mut rng = XorShift::new(1);
        let mut seen = [0u32; 10];
        for _ in 0..10_000 {
            seen[(rng.next() % 10) as usize] += 1;
        }
        assert!(seen.iter().all(|&n| (800..1_200).contains(&n)), "{seen:?}");
    }

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
