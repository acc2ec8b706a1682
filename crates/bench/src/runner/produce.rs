//! The producer side of a run: tasks that build their own batches, pace them, keep a
//! bounded pipeline in flight and record each batch's acknowledgement latency.

use super::*;

#[derive(Debug, Clone)]
pub(super) struct ProducerPlan {
    pub(super) names: Names,
    pub(super) workload: Workload,
    pub(super) rate: Option<NonZeroU64>,
    pub(super) clock: RunClock,
}

/// Starts one task per producer; each returns its acknowledgement latencies.
pub(super) async fn spawn_producers(
    addr: &Target,
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
        let client = addr
            .connect()
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
        let session = if plan.workload.sessions {
            Some(
                client
                    .register_session(Duration::from_secs(60))
                    .await
                    .map_err(client_error("registering a client session"))?,
            )
        } else {
            None
        };
        let producer = ProducerTask {
            id: p,
            session,
            next_request: Mutex::new(HashMap::new()),
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
    /// What to send again if a member answers that it does not serve it.
    resend: Resend,
    chunks: Vec<(Duration, u32)>,
    records: u32,
    _permit: tokio::sync::OwnedSemaphorePermit,
}

/// A sent batch and where it went, for sending it again.
struct Resend {
    client: Client,
    stream: Arc<str>,
    topic: Arc<str>,
    partition: u32,
    batch: Arc<[u8]>,
}

/// Times a batch refused as misrouted is sent again (after a refresh, 20 ms apart)
/// before it counts as an error: a member that has not yet applied the topic's
/// creation, or a primary that moved, answers so for a moment.
const RESENDS_MAX: u32 = 250;

impl Resend {
    /// Sends the batch again until it is stored or refused for another reason.
    async fn until_stored(&self, mut err: ClientError) -> Result<Response, ClientError> {
        for _ in 0..RESENDS_MAX {
            if !misrouted(&err) {
                return Err(err);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
            let _ = self.client.refresh().await;
            let request = Request::Produce {
                stream: &self.stream,
                topic: &self.topic,
                partition: self.partition,
                batch: &self.batch,
            };
            match self.client.call(&request).await {
                Ok(response) => return Ok(response),
                Err(next) => err = next,
            }
        }
        Err(err)
    }
}

/// Whether `err` says the batch went to a member that does not serve it (yet): it
/// was not stored, and a refresh may send it right.
fn misrouted(err: &ClientError) -> bool {
    use braid_proto::client::ErrorCode;
    matches!(err, ClientError::Io { .. } | ClientError::Closed)
        || matches!(
            err.code(),
            Some(
                ErrorCode::NotLeader
                    | ErrorCode::ShuttingDown
                    | ErrorCode::StreamNotFound
                    | ErrorCode::TopicNotFound
                    | ErrorCode::PartitionNotFound
            )
        )
}

/// Where a producer's sent batches go: a task that awaits their answers in order and
/// takes each latency the moment its answer arrives, not when the sender next looks.
struct Pipeline {
    permits: Arc<tokio::sync::Semaphore>,
    sent: tokio::sync::mpsc::UnboundedSender<InFlight>,
}

struct ProducerTask {
    id: u32,
    /// The client session its batches are numbered in, if the workload has sessions.
    session: Option<u64>,
    /// (topic, partition) -> the number of its next batch in the session.
    next_request: Mutex<HashMap<(usize, u32), i32>>,
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
        let mut builder = batch.builder;
        if let Some(session) = self.session {
            if let Ok(mut next) = self.next_request.lock() {
                let request = next.entry((topic, partition)).or_insert(0);
                builder.producer(session as i64, -1, *request);
                *request += 1;
            }
        }
        let bytes: Arc<[u8]> = builder.finish().into();
        let request = Request::Produce {
            stream: &self.plan.names.stream,
            topic: &self.plan.names.topics[topic],
            partition,
            batch: &bytes,
        };
        let answer = Box::pin(self.client.start_call(&request));
        let resend = Resend {
            client: self.client.clone(),
            stream: self.plan.names.stream.as_str().into(),
            topic: self.plan.names.topics[topic].as_str().into(),
            partition,
            batch: bytes,
        };
        // The acknowledger outlives the sender, so this cannot fail while we send.
        let _ = in_flight.sent.send(InFlight {
            answer,
            resend,
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
        let answer = match sent.answer.await {
            // A batch refused unstored is sent again (its latency counts the wait); a
            // connection lost with it in flight may have stored it: it is sent again
            // too, so it may be stored twice, as with any producer that retries.
            Err(err) => sent.resend.until_stored(err).await,
            answer => answer,
        };
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

/// Waits for the producer tasks and merges their acknowledgement latencies.
pub(super) async fn join_producers(tasks: Vec<Task<Recorder>>) -> Recorder {
    let mut merged = Recorder::new();
    for task in tasks {
        if let Ok(recorder) = task.await {
            merged.merge(&recorder);
        }
    }
    merged
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
}
