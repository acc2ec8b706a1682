//! The experiment of seed 001: how long a cluster takes to retire client sessions
//! that touched every partition. `sessions` sessions each produce one record, as
//! their request 0, to every one of `partitions` partitions (in topics of at most
//! 1,000), then all end; the time from the last end to the `FinalizeSession` that
//! retires them all is measured (the last session's heartbeat, every 10 ms, finds it
//! gone instead of ended). A *create* pass writes to partitions just created; a *write*
//! pass, with new sessions, to the same partitions again. Per pass: the time, the
//! FinalizeSession ops committed, the peak of copies each member's walk had left to
//! prove (sampled from `/metrics` every 100 ms) and the copies left as debt.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use braid_client::{Client, ClientError};
use braid_proto::client::{ErrorCode, TopicSettings, FSYNC_ALWAYS, FSYNC_INTERVAL, FSYNC_NEVER};
use serde::Serialize;

use crate::runner::BenchError;

/// Partitions per topic (a node's default `topic_partitions_max`).
const TOPIC_PARTITIONS: u32 = 1_000;
/// Produces in flight at once, over all connections.
const IN_FLIGHT: usize = 512;
/// Client connections the produces are spread over.
const CONNECTIONS: usize = 8;
/// Topics per stream (a node's default `partitions_per_stream_max` is 10,000).
const TOPICS_PER_STREAM: u32 = 10;

/// What to run.
#[derive(Debug, Clone, Copy)]
pub struct RetireRun {
    /// Partitions in all.
    pub partitions: u32,
    /// Sessions per pass.
    pub sessions: u32,
    /// The topics' fsync policy.
    pub fsync: crate::Fsync,
}

/// One pass's figures.
#[derive(Debug, Clone, Serialize)]
pub struct RetirePass {
    /// `create` or `write`.
    pub pass: &'static str,
    /// Seconds the sessions took to write to every partition.
    pub produce_secs: f64,
    /// Seconds from the last session's end to the finalize that retired them all.
    pub finalize_secs: f64,
    /// FinalizeSession ops committed in that time.
    pub finalize_ops: u64,
    /// Per member: the most copies its walk had left to prove at once.
    pub peak_unproven: Vec<u64>,
    /// Copies the walks gave up as debt (summed over the members).
    pub debt_copies: u64,
    /// Retirement barriers the members' primaries proposed.
    pub barriers: u64,
    /// Heartbeats of the wait the coordinator did not answer (it was moving).
    pub heartbeats_unanswered: u64,
}

fn client_error(what: &str) -> impl FnOnce(ClientError) -> BenchError + '_ {
    move |source| BenchError::Client {
        what: what.to_owned(),
        source,
    }
}

/// One value of a node's `/metrics` (0 if it cannot be read).
fn metric(http: SocketAddr, name: &str) -> u64 {
    let read = || -> std::io::Result<String> {
        let mut stream = TcpStream::connect_timeout(&http, Duration::from_secs(1))?;
        stream.set_read_timeout(Some(Duration::from_secs(2)))?;
        stream.write_all(b"GET /metrics HTTP/1.1\r\nHost: braid\r\nConnection: close\r\n\r\n")?;
        let mut text = String::new();
        stream.read_to_string(&mut text)?;
        Ok(text)
    };
    read().ok().map_or(0, |text| {
        text.lines()
            .find(|line| line.split_whitespace().next() == Some(name))
            .and_then(|line| line.split_whitespace().nth(1))
            .and_then(|value| value.parse().ok())
            .unwrap_or(0)
    })
}

fn metric_sum(https: &[SocketAddr], name: &str) -> u64 {
    https.iter().map(|http| metric(*http, name)).sum()
}

/// Samples every member's unproven copies until stopped; returns each one's peak.
struct Sampler {
    stop: Arc<AtomicBool>,
    peaks: Arc<Mutex<Vec<u64>>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Sampler {
    fn start(https: Vec<SocketAddr>) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let peaks = Arc::new(Mutex::new(vec![0; https.len()]));
        let thread = {
            let (stop, peaks) = (Arc::clone(&stop), Arc::clone(&peaks));
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    for (i, http) in https.iter().enumerate() {
                        let now = metric(*http, "braid_retirement_copies_unproven");
                        if let Ok(mut peaks) = peaks.lock() {
                            peaks[i] = peaks[i].max(now);
                        }
                    }
                    std::thread::sleep(Duration::from_millis(100));
                }
            })
        };
        Self {
            stop,
            peaks,
            thread: Some(thread),
        }
    }

    fn finish(mut self) -> Vec<u64> {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        self.peaks.lock().map(|p| p.clone()).unwrap_or_default()
    }
}

/// A one-record batch of `session`'s request 0.
fn tagged(session: u64) -> Vec<u8> {
    let mut builder = braid_proto::BatchBuilder::new(0);
    builder.push(None, Some(b"r"), &[], 0);
    builder.producer(session as i64, -1, 0);
    builder.finish()
}

/// Produces `batch` until it is stored (a retry of a session's request is answered
/// its offsets, never stored twice).
async fn produce(
    client: &Client,
    (stream, topic, partition): &(String, String, u32),
    batch: &[u8],
) -> Result<(), BenchError> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match client.produce(stream, topic, *partition, batch).await {
            Ok(_) => return Ok(()),
            Err(err)
                if Instant::now() < deadline
                    && matches!(
                        err.code(),
                        Some(ErrorCode::Busy | ErrorCode::NotLeader) | None
                    ) =>
            {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(err) => return Err(client_error("a produce")(err)),
        }
    }
}

/// Runs both passes against `target`, whose members serve HTTP at `https`.
///
/// # Errors
/// [`BenchError::Client`] when the cluster refuses a step.
pub async fn run_retirement(
    target: &crate::Target,
    https: &[SocketAddr],
    run: RetireRun,
) -> Result<Vec<RetirePass>, BenchError> {
    let mut clients = Vec::new();
    for _ in 0..CONNECTIONS {
        clients.push(target.connect().await.map_err(client_error("connecting"))?);
    }
    let admin = clients[0].clone();
    let topics = run.partitions.div_ceil(TOPIC_PARTITIONS);
    let mut partitions = Vec::new();
    for t in 0..topics {
        let count = (run.partitions - t * TOPIC_PARTITIONS).min(TOPIC_PARTITIONS);
        let stream = format!("bench-retire-{}", t / TOPICS_PER_STREAM);
        if t % TOPICS_PER_STREAM == 0 {
            admin
                .create_stream(&stream)
                .await
                .map_err(client_error("creating a stream"))?;
        }
        let topic = format!("t{t}");
        let (fsync, fsync_interval_ms) = match run.fsync {
            crate::Fsync::Never => (FSYNC_NEVER, 0),
            crate::Fsync::Always => (FSYNC_ALWAYS, 0),
            crate::Fsync::IntervalMs(ms) => (FSYNC_INTERVAL, ms),
        };
        let settings = TopicSettings {
            partitions: count,
            fsync,
            fsync_interval_ms,
            ..TopicSettings::default()
        };
        admin
            .create_topic(&stream, &topic, settings)
            .await
            .map_err(client_error("creating a topic"))?;
        partitions.extend((0..count).map(|p| (stream.clone(), topic.clone(), p)));
        eprintln!(
            "created {} of {} partitions",
            partitions.len(),
            run.partitions
        );
    }
    let partitions = Arc::new(partitions);
    let mut passes = Vec::new();
    for pass in ["create", "write"] {
        eprintln!(
            "{pass} pass: {} sessions write to every partition",
            run.sessions
        );
        let started = Instant::now();
        let mut sessions = Vec::new();
        for _ in 0..run.sessions {
            let session = admin
                .register_session(Duration::from_secs(600))
                .await
                .map_err(client_error("registering a session"))?;
            sessions.push(session);
        }
        let semaphore = Arc::new(tokio::sync::Semaphore::new(IN_FLIGHT));
        let mut tasks = tokio::task::JoinSet::new();
        let mut n = 0usize;
        // Partition by partition, every session's record to each: a partition is busy
        // for a moment and then idle, so its files go back to sleep (all of them awake
        // at once would take more descriptors than a process has).
        let batches: Vec<Arc<Vec<u8>>> = sessions.iter().map(|s| Arc::new(tagged(*s))).collect();
        for i in 0..partitions.len() {
            for batch in &batches {
                let permit = Arc::clone(&semaphore)
                    .acquire_owned()
                    .await
                    .map_err(|_| BenchError::Retirement("the produce limiter closed".into()))?;
                let client = clients[n % CONNECTIONS].clone();
                n += 1;
                let (batch, partitions) = (Arc::clone(batch), Arc::clone(&partitions));
                tasks.spawn(async move {
                    let result = produce(&client, &partitions[i], &batch).await;
                    drop(permit);
                    result
                });
                while let Some(done) = tasks.try_join_next() {
                    done.map_err(|e| BenchError::Retirement(e.to_string()))??;
                }
            }
        }
        while let Some(done) = tasks.join_next().await {
            done.map_err(|e| BenchError::Retirement(e.to_string()))??;
        }
        let produce_secs = started.elapsed().as_secs_f64();
        eprintln!("{pass} pass: written in {produce_secs:.1} s; the sessions end");
        let finalizes = metric_sum(https, "braid_sessions_finalize_ops_total");
        let debt = metric_sum(https, "braid_retirement_debt_copies_total");
        let barriers = metric_sum(https, "braid_retirement_barriers_total");
        let sampler = Sampler::start(https.to_vec());
        for session in &sessions {
            admin
                .end_session(*session)
                .await
                .map_err(client_error("ending a session"))?;
        }
        let ended = Instant::now();
        // Ended one after the other: once the last is retired (its heartbeat finds it
        // gone, not ended), all are.
        let last = sessions.last().copied().unwrap_or(0);
        let mut unanswered = 0u64;
        loop {
            match admin.session_heartbeat(last).await {
                Err(err) if err.to_string().contains("does not exist") => break,
                Err(err) if err.code() == Some(ErrorCode::SessionNotFound) => {}
                // The coordinator moving (a metadata view change) is part of what the
                // time measures: the wait goes on, and the pass counts it.
                Err(err)
                    if matches!(
                        err.code(),
                        Some(ErrorCode::NotLeader | ErrorCode::Busy | ErrorCode::ShuttingDown)
                    ) =>
                {
                    if unanswered == 0 {
                        eprintln!("{pass} pass: the coordinator did not answer ({err}); waiting");
                    }
                    unanswered += 1;
                }
                Err(err) => return Err(client_error("a heartbeat")(err)),
                Ok(_) => {}
            }
            if ended.elapsed() > Duration::from_secs(1_800) {
                return Err(BenchError::Retirement(
                    "the sessions were not retired in 30 minutes".into(),
                ));
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let finalize_secs = ended.elapsed().as_secs_f64();
        eprintln!("{pass} pass: retired {finalize_secs:.2} s after the last end");
        let peak_unproven = sampler.finish();
        // The coordinator counts its finalize a tick after the apply that answered the
        // heartbeat: wait for the count (at most 1 s) rather than read it early.
        let mut finalize_ops = 0;
        for _ in 0..50 {
            finalize_ops = metric_sum(https, "braid_sessions_finalize_ops_total") - finalizes;
            if finalize_ops > 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        passes.push(RetirePass {
            pass,
            produce_secs,
            finalize_secs,
            finalize_ops,
            peak_unproven,
            debt_copies: metric_sum(https, "braid_retirement_debt_copies_total") - debt,
            barriers: metric_sum(https, "braid_retirement_barriers_total") - barriers,
            heartbeats_unanswered: unanswered,
        });
    }
    Ok(passes)
}
