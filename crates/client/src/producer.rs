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

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use braid_proto::client::TopicInfo;
use braid_proto::hash::key_hash;
use braid_proto::BatchBuilder;
use tokio::sync::{mpsc, oneshot, Semaphore};

use crate::connection::{unexpected, Client};
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
}

impl Default for ProducerConfig {
    fn default() -> Self {
        Self {
            batch_bytes: 256 * 1024,
            linger: Duration::from_millis(5),
            max_in_flight: 8,
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
        let (closed, batches) = mpsc::unbounded_channel();
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                open: HashMap::new(),
                ranges,
                next_keyless: 0,
                sticky_keyless: None,
            }),
            closed,
            config,
        });
        tokio::spawn(dispatch(
            client.clone(),
            stream.to_owned(),
            topic.to_owned(),
            batches,
            config.max_in_flight,
        ));
        tokio::spawn(linger(Arc::downgrade(&shared)));
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
            });
        }
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

async fn dispatch(
    client: Client,
    stream: String,
    topic: String,
    mut batches: mpsc::UnboundedReceiver<ClosedBatch>,
    max_in_flight: usize,
) {
    let permits = Arc::new(Semaphore::new(max_in_flight.max(1)));
    while let Some(batch) = batches.recv().await {
        let Ok(permit) = Arc::clone(&permits).acquire_owned().await else {
            return;
        };
        let request = braid_proto::client::Request::Produce {
            stream: &stream,
            topic: &topic,
            partition: batch.partition,
            batch: &batch.bytes,
        };
        // Sent now, in order; answered whenever.
        let answer = client.start_call(&request);
        let partition = batch.partition;
        let replies = batch.replies;
        tokio::spawn(async move {
            let result = match answer.await {
                Ok(braid_proto::client::Response::Produced { base_offset, .. }) => Ok(base_offset),
                Ok(other) => Err(unexpected(&other)),
                Err(err) => Err(err),
            };
            drop(permit);
            for (i, reply) in replies.into_iter().enumerate() {
                let _ = reply.send(result.clone().map(|base| RecordMetadata {
                    partition,
                    offset: base + i as u64,
                }));
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
