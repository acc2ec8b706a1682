//! The producer: routes records to partitions by key, batches them per partition by
//! size and linger, keeps several batches in flight, and answers each record with its
//! partition and offset.
//!
//! A keyed record goes to the active partition whose hash range holds the high 16 bits
//! of the Murmur3 x86_32 hash (seed 0) of its key. Keyless records go round robin over
//! the active partitions, one batch at a time (a partition's batch fills, then the next
//! partition takes the following records), which keeps batches large.
//!
//! Batches are handed to one dispatcher task in the order they close, and it sends them
//! on the connection in that order, so the records of a key reach their partition in
//! the order they were sent.
//!
//! Each batch goes to its partition's primary (the client's routes). When a
//! connection fails (or a node answers `ShuttingDown`, `NotLeader` or `Busy`), the
//! dispatcher waits with a doubling backoff, refreshes the routes (a new primary after
//! a failover, a member reconnected), for up to [`ProducerConfig::retry_for`], and
//! sends again, in order, every batch in flight that failed; the others in flight are
//! answered as they come (a batch to a healthy primary is not sent twice). A batch
//! sent again may have been stored already, so by default
//! ([`ProducerConfig::idempotent`]) the producer holds a client session and numbers
//! each batch per partition when it first sends it: a batch sent again keeps its
//! number, and the partition answers a number it stored with the offsets it stored it
//! at, storing nothing. A batch refused as out of order (a number the partition did not
//! take yet: an earlier batch was refused for good) was not stored, and is numbered
//! again from the number the partition expects. [`Producer::retried_batches`] counts
//! every batch sent again.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use braid_proto::client::{ErrorCode, Response, TopicInfo};
use braid_proto::hash::key_hash;
use braid_proto::BatchBuilder;
use tokio::sync::{mpsc, oneshot};

use crate::client::Client;
use crate::connection::unexpected;
use crate::error::ClientError;

/// Where a record was stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordMetadata {
    /// Its partition.
    pub partition: u32,
    /// Its offset in the partition.
    pub offset: u64,
}

/// Producer settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProducerConfig {
    /// A partition's batch is sent once it holds this many bytes.
    pub batch_bytes: usize,
    /// ...or once its first record waited this long.
    pub linger: Duration,
    /// Batches sent and not yet answered, per producer.
    pub max_in_flight: usize,
    /// How long after a connection failure the producer keeps reconnecting and
    /// sending again before failing the batches in flight; zero fails them at once.
    pub retry_for: Duration,
    /// The longest wait between reconnection attempts (they start at 50 ms and
    /// double). It bounds how long after a failover ends a producer notices: a
    /// member names the new primary as soon as its view change is done, and the next
    /// attempt finds it.
    pub retry_backoff_max: Duration,
    /// Hold a client session and number batches, so a batch sent again is never
    /// stored twice. At most 8 batches are then in flight (what a partition
    /// remembers of a session), whatever `max_in_flight` says.
    pub idempotent: bool,
    /// The session ends if no heartbeat reaches the cluster for this long (the
    /// producer sends one every third of it).
    pub session_timeout: Duration,
}

impl Default for ProducerConfig {
    fn default() -> Self {
        Self {
            batch_bytes: 256 * 1024,
            linger: Duration::from_millis(5),
            max_in_flight: 8,
            retry_for: Duration::from_secs(30),
            // A second (as before) let a failover of 1.6 s resume at 2.55 s, the next
            // step of 50, 100, ... 800, 1000 ms.
            retry_backoff_max: Duration::from_millis(250),
            idempotent: true,
            session_timeout: Duration::from_secs(30),
        }
    }
}

type RecordReply = oneshot::Sender<Result<RecordMetadata, ClientError>>;

struct OpenBatch {
    builder: BatchBuilder,
    replies: Vec<RecordReply>,
    opened: Instant,
}

struct ClosedBatch {
    partition: u32,
    bytes: Vec<u8>,
    replies: Vec<RecordReply>,
    /// Its number in the producer's session, once first sent.
    request: Option<u32>,
}

struct State {
    open: HashMap<u32, OpenBatch>,
    /// Active partitions as (hash start, hash end, id), sorted by start.
    ranges: Vec<(u16, u16, u32)>,
    next_keyless: usize,
    sticky_keyless: Option<u32>,
}

struct Shared {
    state: Mutex<State>,
    closed: mpsc::UnboundedSender<ClosedBatch>,
    config: ProducerConfig,
    /// Batches sent again after a failure.
    retried: Arc<std::sync::atomic::AtomicU64>,
    /// The client session (0: none), ended when the last clone of the producer goes;
    /// a new one replaces it if the cluster ended it (the heartbeat task registers it).
    session: Arc<AtomicU64>,
    client: Client,
}

impl Drop for Shared {
    fn drop(&mut self) {
        let session = self.session.load(Ordering::Relaxed);
        let (true, Ok(runtime)) = (session != 0, tokio::runtime::Handle::try_current()) else {
            return;
        };
        let client = self.client.clone();
        runtime.spawn(async move {
            if let Err(err) = client.end_session(session).await {
                tracing::debug!(session, %err, "ending the producer's session");
            }
        });
    }
}

/// Produces records to one topic. Cheap to clone; clones share batches.
#[derive(Clone)]
pub struct Producer {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Producer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Producer")
            .field("config", &self.shared.config)
            .finish()
    }
}

/// The active partitions of a topic as sorted hash ranges.
pub(crate) fn active_ranges(info: &TopicInfo) -> Vec<(u16, u16, u32)> {
    let mut ranges: Vec<_> = info
        .partitions
        .iter()
        .filter(|p| !p.sealed)
        .map(|p| (p.hash_start, p.hash_end, p.id))
        .collect();
    ranges.sort_unstable();
    ranges
}

/// Where a topic's records go, for callers that build their own batches (a benchmark,
/// a bulk loader): the active partitions and the hash range each holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Router {
    ranges: Vec<(u16, u16, u32)>,
}

impl Router {
    /// The router of a described topic.
    ///
    /// # Errors
    /// [`ClientError::Invalid`] if the topic has no active partition.
    pub fn new(info: &TopicInfo) -> Result<Self, ClientError> {
        let ranges = active_ranges(info);
        if ranges.is_empty() {
            return Err(ClientError::Invalid(format!(
                "topic {} has no active partition",
                info.name
            )));
        }
        Ok(Self { ranges })
    }

    /// The active partition a key goes to (the one whose range holds its hash).
    pub fn partition_for_key(&self, key: &[u8]) -> Option<u32> {
        partition_for(&self.ranges, key_hash(key))
    }

    /// The active partitions, in hash order.
    pub fn partitions(&self) -> impl Iterator<Item = u32> + '_ {
        self.ranges.iter().map(|r| r.2)
    }
}

/// The partition whose range holds `hash`.
pub(crate) fn partition_for(ranges: &[(u16, u16, u32)], hash: u16) -> Option<u32> {
    let at = ranges.partition_point(|r| r.0 <= hash);
    let (start, end, id) = *ranges.get(at.checked_sub(1)?)?;
    (start <= hash && hash <= end).then_some(id)
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

impl Producer {
    /// A producer for `stream/topic`; it learns the topic's partitions first.
    ///
    /// # Errors
    /// [`ClientError`] if the topic cannot be described.
    pub async fn new(
        client: &Client,
        stream: &str,
        topic: &str,
        config: ProducerConfig,
    ) -> Result<Self, ClientError> {
        let info = client.describe_topic(stream, topic).await?;
        let ranges = Router::new(&info)?.ranges;
        let session = Arc::new(AtomicU64::new(if config.idempotent {
            client.register_session(config.session_timeout).await?
        } else {
            0
        }));
        let (closed, batches) = mpsc::unbounded_channel();
        let retried = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                open: HashMap::new(),
                ranges,
                next_keyless: 0,
                sticky_keyless: None,
            }),
            closed,
            config,
            retried: Arc::clone(&retried),
            session: Arc::clone(&session),
            client: client.clone(),
        });
        let dispatcher = Dispatcher {
            client: client.clone(),
            stream: stream.to_owned(),
            topic: topic.to_owned(),
            config,
            retried,
            in_flight: VecDeque::new(),
            backoff: RETRY_BACKOFF_MIN,
            session: Arc::clone(&session),
            numbering: Numbering::default(),
        };
        tokio::spawn(dispatcher.run(batches));
        tokio::spawn(linger(Arc::downgrade(&shared)));
        if config.idempotent {
            tokio::spawn(heartbeat(Arc::downgrade(&shared)));
        }
        Ok(Self { shared })
    }

    /// Adds a record; the future resolves when the node has committed it. Dropping the
    /// future does not cancel the send.
    pub fn send(
        &self,
        key: Option<&[u8]>,
        value: &[u8],
    ) -> impl std::future::Future<Output = Result<RecordMetadata, ClientError>> + Send + 'static
    {
        self.send_with(key, Some(value), &[], now_ms())
    }

    /// Adds a record with headers and an explicit timestamp (ms).
    pub fn send_with(
        &self,
        key: Option<&[u8]>,
        value: Option<&[u8]>,
        headers: &[(&[u8], Option<&[u8]>)],
        timestamp_ms: i64,
    ) -> impl std::future::Future<Output = Result<RecordMetadata, ClientError>> + Send + 'static
    {
        let (reply, answer) = oneshot::channel();
        let queued = self.enqueue(key, value, headers, timestamp_ms, reply);
        async move {
            queued?;
            answer.await.map_err(|_| ClientError::Closed)?
        }
    }

    fn enqueue(
        &self,
        key: Option<&[u8]>,
        value: Option<&[u8]>,
        headers: &[(&[u8], Option<&[u8]>)],
        timestamp_ms: i64,
        reply: RecordReply,
    ) -> Result<(), ClientError> {
        let mut state = self.shared.state.lock().map_err(|_| ClientError::Closed)?;
        let partition = match key {
            Some(key) => partition_for(&state.ranges, key_hash(key))
                .ok_or_else(|| ClientError::Invalid("no partition covers the key's hash".into()))?,
            None => match state.sticky_keyless {
                Some(p) => p,
                None => {
                    let p = state.ranges[state.next_keyless % state.ranges.len()].2;
                    state.next_keyless += 1;
                    state.sticky_keyless = Some(p);
                    p
                }
            },
        };
        let batch = state.open.entry(partition).or_insert_with(|| OpenBatch {
            builder: BatchBuilder::with_capacity(timestamp_ms, self.shared.config.batch_bytes),
            replies: Vec::new(),
            opened: Instant::now(),
        });
        batch.builder.push(key, value, headers, timestamp_ms);
        batch.replies.push(reply);
        if batch.builder.len_bytes() >= self.shared.config.batch_bytes {
            self.close_batch(&mut state, partition);
        }
        Ok(())
    }

    fn close_batch(&self, state: &mut State, partition: u32) {
        if let Some(batch) = state.open.remove(&partition) {
            if state.sticky_keyless == Some(partition) {
                state.sticky_keyless = None;
            }
            let _ = self.shared.closed.send(ClosedBatch {
                partition,
                bytes: batch.builder.finish(),
                replies: batch.replies,
                request: None,
            });
        }
    }

    /// Batches sent again after a connection failure or a node's refusal to take them
    /// then (without [`ProducerConfig::idempotent`], each possibly stored twice).
    pub fn retried_batches(&self) -> u64 {
        self.shared
            .retried
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The client session the producer numbers its batches in, if idempotent.
    pub fn session(&self) -> Option<u64> {
        Some(self.shared.session.load(Ordering::Relaxed)).filter(|s| *s != 0)
    }

    /// Sends every open batch now.
    pub fn flush(&self) {
        if let Ok(mut state) = self.shared.state.lock() {
            let partitions: Vec<u32> = state.open.keys().copied().collect();
            for partition in partitions {
                self.close_batch(&mut state, partition);
            }
        }
    }
}

async fn linger(shared: std::sync::Weak<Shared>) {
    loop {
        let Some(shared) = shared.upgrade() else {
            return;
        };
        let linger = shared.config.linger;
        let producer = Producer { shared };
        if let Ok(mut state) = producer.shared.state.lock() {
            let due: Vec<u32> = state
                .open
                .iter()
                .filter(|(_, b)| b.opened.elapsed() >= linger)
                .map(|(p, _)| *p)
                .collect();
            for partition in due {
                producer.close_batch(&mut state, partition);
            }
        }
        drop(producer);
        tokio::time::sleep(linger.max(Duration::from_millis(1))).await;
    }
}

/// Keeps the producer's session open while the producer lives, and registers a new
/// one if the cluster ended it (the producer was cut off for longer than its
/// timeout): batches then go under the new one, numbered from 0 again, and a batch
/// in flight under the old one is answered `SessionNotFound` (it may be stored).
async fn heartbeat(shared: std::sync::Weak<Shared>) {
    loop {
        let Some(every) = shared.upgrade().map(|s| s.config.session_timeout / 3) else {
            return;
        };
        tokio::time::sleep(every.max(Duration::from_millis(10))).await;
        let Some((client, session, timeout)) = shared.upgrade().map(|s| {
            (
                s.client.clone(),
                Arc::clone(&s.session),
                s.config.session_timeout,
            )
        }) else {
            return;
        };
        let current = session.load(Ordering::Relaxed);
        match client.session_heartbeat(current).await {
            Ok(_) => {}
            Err(err) if err.code() == Some(ErrorCode::SessionNotFound) => {
                match client.register_session(timeout).await {
                    Ok(new) => {
                        tracing::warn!(
                            old = current,
                            new,
                            "the producer's session ended: a new one"
                        );
                        session.store(new, Ordering::Relaxed);
                    }
                    Err(err) => tracing::debug!(%err, "registering a new session"),
                }
            }
            Err(err) => tracing::debug!(session = current, %err, "a session heartbeat failed"),
        }
    }
}

/// A batch sent and not yet answered.
struct InFlight {
    batch: ClosedBatch,
    answer: Answer,
}

type Answer = std::pin::Pin<
    Box<dyn std::future::Future<Output = Result<Response, ClientError>> + Send + 'static>,
>;

/// Sends batches in order and answers their records; reconnects and resends on
/// failure.
struct Dispatcher {
    client: Client,
    stream: String,
    topic: String,
    config: ProducerConfig,
    retried: Arc<std::sync::atomic::AtomicU64>,
    in_flight: VecDeque<InFlight>,
    /// The pause before the next resend (doubles while failures follow each other).
    backoff: Duration,
    /// The client session batches are numbered in (0: none, not idempotent).
    session: Arc<AtomicU64>,
    numbering: Numbering,
}

/// The numbers a producer's batches take in its session, per partition. A number is
/// never taken back: a batch refused for good may have been stored all the same (a
/// group that stopped after preparing it answers `StorageError`), and a later batch
/// under its number would be answered that batch's offsets. The partition says what
/// it expects instead: a batch refused `RequestOutOfOrder` (not stored) is numbered
/// again from there.
#[derive(Debug, Default)]
struct Numbering {
    /// The session the counts are in: a new one starts every partition at 0.
    session: u64,
    /// Partition -> the number its next batch takes.
    next: HashMap<u32, u32>,
}

impl Numbering {
    /// The number of `partition`'s next batch in `session`.
    fn take(&mut self, session: u64, partition: u32) -> u32 {
        if session != self.session {
            self.session = session;
            self.next.clear();
        }
        let next = self.next.entry(partition).or_insert(0);
        let request = *next;
        *next += 1;
        request
    }

    /// Numbers again, in order, the batches about to be sent again that were refused
    /// out of order (`expected`: the number their partition takes next), each after
    /// any batch of its partition before it that keeps its number. Returns the new
    /// numbers, `None` where a batch keeps its own.
    fn renumber(
        &mut self,
        session: u64,
        again: &[(u32, Option<u32>, Option<u32>)],
    ) -> Vec<Option<u32>> {
        let mut kept: HashMap<u32, u32> = HashMap::new();
        let mut numbers = Vec::with_capacity(again.len());
        for &(partition, request, expected) in again {
            let mut new = None;
            if let (Some(expected), Some(_)) = (expected, request) {
                let from = kept
                    .get(&partition)
                    .map_or(expected, |k| expected.max(k + 1));
                if session == self.session {
                    self.next.insert(partition, from);
                }
                new = Some(self.take(session, partition));
            }
            if let Some(request) = new.or(request) {
                kept.insert(partition, request);
            }
            numbers.push(new);
        }
        for (partition, last) in kept {
            let next = self.next.entry(partition).or_insert(0);
            *next = (*next).max(last + 1);
        }
        numbers
    }
}

/// Batches in flight at once with a session: as many requests of a session as a
/// partition remembers, so every batch sent again is answered its offsets.
const SESSION_IN_FLIGHT_MAX: usize = 8;

/// The first pause before batches are sent again.
const RETRY_BACKOFF_MIN: Duration = Duration::from_millis(50);

/// What woke the dispatcher.
enum Event {
    Answer(Result<Response, ClientError>),
    Batch(Option<ClosedBatch>),
}

/// Whether a failure may pass with a new connection, a new primary or a moment's
/// wait. In a cluster, a member that does not know the topic yet (its metadata
/// replica is a moment behind the member the topic was created through) may know it
/// soon; on one node the answer is final.
fn retriable(err: &ClientError, cluster: bool) -> bool {
    match err {
        ClientError::Io { .. } | ClientError::Closed => true,
        ClientError::Server { code, .. } => match code {
            ErrorCode::ShuttingDown
            | ErrorCode::NotLeader
            | ErrorCode::Busy
            | ErrorCode::RequestOutOfOrder => true,
            ErrorCode::StreamNotFound | ErrorCode::TopicNotFound | ErrorCode::PartitionNotFound => {
                cluster
            }
            _ => false,
        },
        _ => false,
    }
}

/// How long a failure waits for the answers of the other batches in flight before
/// it counts those still unanswered as failed (sent again, maybe stored twice).
const SETTLE_FOR: Duration = Duration::from_secs(10);

/// The request number a partition expects next, as a `RequestOutOfOrder` names it.
fn expected_request(err: &ClientError) -> Option<u32> {
    match err {
        ClientError::Server {
            code: ErrorCode::RequestOutOfOrder,
            details,
            ..
        } => details.iter().find_map(|detail| match detail {
            braid_proto::client::ErrorDetail::ExpectedRequest { request } => Some(*request),
            _ => None,
        }),
        _ => None,
    }
}

impl Dispatcher {
    /// Numbers a batch sent for the first time in the producer's session.
    fn number(&mut self, batch: &mut ClosedBatch) {
        let session = self.session.load(Ordering::Relaxed);
        if session == 0 || batch.request.is_some() {
            return;
        }
        let request = self.numbering.take(session, batch.partition);
        stamp(batch, session, request);
    }

    /// Batches about to be sent again, in order: those refused out of order (not
    /// stored) are numbered again ([`Numbering::renumber`]).
    fn renumber(&mut self, again: &mut VecDeque<(ClosedBatch, Option<u32>)>) {
        let session = self.session.load(Ordering::Relaxed);
        if session == 0 {
            return;
        }
        let asked: Vec<_> = again
            .iter()
            .map(|(batch, expected)| (batch.partition, batch.request, *expected))
            .collect();
        let numbers = self.numbering.renumber(session, &asked);
        for ((batch, _), number) in again.iter_mut().zip(numbers) {
            if let Some(request) = number {
                stamp(batch, session, request);
            }
        }
    }

    fn send(&mut self, mut batch: ClosedBatch) -> InFlight {
        self.number(&mut batch);
        let request = braid_proto::client::Request::Produce {
            stream: &self.stream,
            topic: &self.topic,
            partition: batch.partition,
            batch: &batch.bytes,
        };
        // Sent now, in order; answered whenever.
        let answer = Box::pin(self.client.start_call(&request));
        InFlight { batch, answer }
    }

    async fn run(mut self, mut batches: mpsc::UnboundedReceiver<ClosedBatch>) {
        let mut window = self.config.max_in_flight.max(1);
        if self.config.idempotent {
            window = window.min(SESSION_IN_FLIGHT_MAX);
        }
        let mut open = true;
        loop {
            let room = self.in_flight.len() < window;
            let event = match self.in_flight.front_mut() {
                None if !open => return,
                None => Event::Batch(batches.recv().await),
                Some(front) => {
                    tokio::select! {
                        biased;
                        result = &mut front.answer => Event::Answer(result),
                        next = batches.recv(), if room && open => Event::Batch(next),
                    }
                }
            };
            match event {
                Event::Batch(Some(batch)) => {
                    let sent = self.send(batch);
                    self.in_flight.push_back(sent);
                }
                Event::Batch(None) => open = false,
                Event::Answer(Err(err))
                    if retriable(&err, self.client.is_cluster())
                        && !self.config.retry_for.is_zero() =>
                {
                    self.recover(err).await;
                }
                Event::Answer(result) => {
                    if result.is_ok() {
                        self.backoff = RETRY_BACKOFF_MIN;
                    }
                    if let Some(done) = self.in_flight.pop_front() {
                        answer(done.batch, result);
                    }
                }
            }
        }
    }

    /// The front batch failed with `err`. Every other batch in flight is settled
    /// first: its answer is awaited (a batch to a healthy primary is answered, not
    /// sent twice); those that failed retriably, or were not answered within
    /// [`SETTLE_FOR`], are sent again in order once the routes are refreshed, with
    /// backoff; past `retry_for` they fail with the last error.
    async fn recover(&mut self, mut err: ClientError) {
        let started = Instant::now();
        let cluster = self.client.is_cluster();
        let mut again: VecDeque<(ClosedBatch, Option<u32>)> = VecDeque::new();
        let mut sent = std::mem::take(&mut self.in_flight).into_iter();
        if let Some(front) = sent.next() {
            again.push_back((front.batch, expected_request(&err)));
        }
        for flight in sent {
            match tokio::time::timeout(SETTLE_FOR, flight.answer).await {
                Ok(Ok(response)) => {
                    if again
                        .iter()
                        .any(|(b, _)| b.partition == flight.batch.partition)
                        && !self.config.idempotent
                    {
                        // An earlier batch of this partition failed and this one was
                        // stored: only a primary that lost and regained the partition
                        // between the two does that (a session's numbers refuse it).
                        tracing::warn!(
                            partition = flight.batch.partition,
                            "a batch was stored after an earlier one of its partition failed"
                        );
                    }
                    answer(flight.batch, Ok(response));
                }
                Ok(Err(failure)) if retriable(&failure, cluster) => {
                    let expected = expected_request(&failure);
                    again.push_back((flight.batch, expected));
                }
                Ok(Err(failure)) => answer(flight.batch, Err(failure)),
                Err(_) => again.push_back((flight.batch, None)),
            }
        }
        self.renumber(&mut again);
        // The pause grows across failures in a row (a member still naming a dead
        // primary answers NotLeader until the view change ends), and starts again
        // once a batch is answered.
        let mut backoff = self.backoff;
        loop {
            if started.elapsed() >= self.config.retry_for {
                tracing::warn!(%err, batches = again.len(), "giving up resending produce batches");
                for (batch, _) in again {
                    answer(batch, Err(err.clone()));
                }
                return;
            }
            tokio::time::sleep(backoff).await;
            backoff =
                (backoff * 2).min(self.config.retry_backoff_max.max(Duration::from_millis(1)));
            self.backoff = backoff;
            // The routes after the failure: a new primary, a member reconnected.
            match self.client.refresh().await {
                Ok(()) => {
                    self.retried
                        .fetch_add(again.len() as u64, std::sync::atomic::Ordering::Relaxed);
                    tracing::debug!(batches = again.len(), %err, "sending produce batches again");
                    for (batch, _) in again {
                        let sent = self.send(batch);
                        self.in_flight.push_back(sent);
                    }
                    return;
                }
                Err(next) => err = next,
            }
        }
    }
}

/// Writes `session` and `request` into `batch`.
fn stamp(batch: &mut ClosedBatch, session: u64, request: u32) {
    match braid_proto::batch::set_producer(&mut batch.bytes, session as i64, request as i32) {
        Ok(()) => batch.request = Some(request),
        Err(err) => tracing::warn!(%err, "a batch too short to number"),
    }
}

/// Answers each record of `batch` with its offset, or the batch's error.
fn answer(batch: ClosedBatch, result: Result<Response, ClientError>) {
    let result = match result {
        Ok(Response::Produced { base_offset, .. }) => Ok(base_offset),
        Ok(other) => Err(unexpected(&other)),
        Err(err) => Err(err),
    };
    let partition = batch.partition;
    for (i, reply) in batch.replies.into_iter().enumerate() {
        let _ = reply.send(result.clone().map(|base| RecordMetadata {
            partition,
            offset: base + i as u64,
        }));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_are_numbered_per_partition_and_again_from_what_the_partition_expects() {
        let mut numbering = Numbering::default();
        assert_eq!(
            [0, 0, 1, 2, 1].map(|p| numbering.take(7, p)),
            [0, 1, 0, 0, 1]
        );
        // Partition 0 took 0, 1, 2: 1 was refused for good (no number comes back),
        // 2 was refused out of order (the partition expects 1), and a batch numbered
        // 3 that failed on a lost connection keeps its number.
        assert_eq!(numbering.take(7, 0), 2);
        let again = [
            (0, Some(2), Some(1)),
            (0, Some(3), None),
            (1, Some(2), Some(2)),
        ];
        assert_eq!(
            numbering.renumber(7, &again),
            [Some(1), None, Some(2)],
            "the first from 1; the second keeps 3; partition 1's from 2"
        );
        assert_eq!(numbering.take(7, 0), 4, "after the kept 3");
        assert_eq!(numbering.take(7, 1), 3);
        // Refused out of order behind a batch that keeps its number: after it.
        let again = [(0, Some(5), None), (0, Some(6), Some(5))];
        assert_eq!(numbering.renumber(7, &again), [None, Some(6)]);
        // A new session numbers every partition from 0.
        assert_eq!(numbering.take(9, 0), 0);
        assert_eq!(numbering.take(9, 1), 0);
    }

    #[test]
    fn keys_route_to_the_range_holding_their_hash() {
        let ranges = vec![(0, 0x3fff, 0), (0x4000, 0x7fff, 1), (0x8000, 0xffff, 2)];
        assert_eq!(partition_for(&ranges, 0), Some(0));
        assert_eq!(partition_for(&ranges, 0x3fff), Some(0));
        assert_eq!(partition_for(&ranges, 0x4000), Some(1));
        assert_eq!(partition_for(&ranges, 0xffff), Some(2));
        assert_eq!(partition_for(&[(10, 20, 0)], 5), None);
        assert_eq!(partition_for(&[(10, 20, 0)], 21), None);
    }
}
