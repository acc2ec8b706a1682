//! The consumer: reads records from assigned partitions, or as a member of a consumer
//! group whose coordinator assigns them, and commits its positions.
//!
//! In a group, a partition moves between members only after its old owner released it:
//! when a heartbeat's grant no longer holds a partition, the consumer commits its
//! position there, stops fetching it and says so in its next heartbeat (sent at once).
//! Records a member has returned from `poll` are therefore committed before another
//! member starts on the partition, and none is delivered twice while members come and
//! go cleanly. A member that crashes leaves uncommitted records to be read again
//! (at least once).

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

use braid_proto::batch::Headers;
use braid_proto::client::{ErrorCode, GroupMemberRequest, OffsetSpec, Request, Response};
use braid_proto::RecordBatch;

use crate::client::Client;
use crate::connection::unexpected;
use crate::error::ClientError;

/// Where a consumer starts in a partition that has no committed offset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StartFrom {
    /// The earliest offset still stored.
    Earliest,
    /// The end: only records produced from now on.
    Latest,
    /// A given offset.
    Offset(u64),
    /// The first record at or after this time (ms since the epoch).
    Timestamp(i64),
}

/// One record as a consumer sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsumerRecord {
    /// Its partition.
    pub partition: u32,
    /// Its offset.
    pub offset: u64,
    /// Its timestamp (ms since the epoch).
    pub timestamp_ms: i64,
    /// Its key.
    pub key: Option<Vec<u8>>,
    /// Its value.
    pub value: Option<Vec<u8>>,
    /// Its headers.
    pub headers: Vec<(Vec<u8>, Option<Vec<u8>>)>,
}

/// One record where it lies in a fetched batch, borrowed: what
/// [`Consumer::poll_each`] visits.
#[derive(Debug, Clone, Copy)]
pub struct RecordView<'a> {
    /// Its timestamp (ms since the epoch).
    pub timestamp_ms: i64,
    /// Its key.
    pub key: Option<&'a [u8]>,
    /// Its value.
    pub value: Option<&'a [u8]>,
    /// Its headers, decoded lazily.
    pub headers: Headers<'a>,
}

/// Consumer settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConsumerConfig {
    /// Where to start without a committed offset.
    pub start_from: StartFrom,
    /// Bytes asked for per partition per fetch.
    pub fetch_bytes_max: u32,
    /// Commit automatically this often (in `poll`); `None` to commit only by hand (and
    /// on release and close).
    pub auto_commit: Option<Duration>,
    /// Group session timeout: the member is removed after this long without heartbeat.
    pub session_timeout: Duration,
    /// How often a group member heartbeats.
    pub heartbeat_interval: Duration,
    /// How long `poll` rides through a lost connection (reconnecting within each
    /// poll's timeout and returning no records) before it returns the error.
    pub retry_for: Duration,
}

impl Default for ConsumerConfig {
    fn default() -> Self {
        Self {
            start_from: StartFrom::Earliest,
            fetch_bytes_max: 1 << 20,
            auto_commit: Some(Duration::from_secs(5)),
            session_timeout: Duration::from_secs(10),
            heartbeat_interval: Duration::from_secs(1),
            retry_for: Duration::from_secs(30),
        }
    }
}

#[derive(Debug)]
struct Membership {
    group: String,
    member_name: String,
    /// The client session the membership belongs to (registered at the first join;
    /// the group's heartbeats keep it open, and the member leaves when it ends).
    session: u64,
    member_id: u64,
    generation: u32,
    last_heartbeat: Instant,
    /// Set when partitions were released: heartbeat at once so they move quickly.
    heartbeat_now: bool,
}

/// Reads one topic.
#[derive(Debug)]
pub struct Consumer {
    client: Client,
    stream: String,
    topic: String,
    config: ConsumerConfig,
    /// Partition to next offset to read.
    positions: BTreeMap<u32, u64>,
    /// Positions as last committed.
    committed: BTreeMap<u32, u64>,
    buffered: VecDeque<ConsumerRecord>,
    group: Option<Membership>,
    last_commit: Instant,
    /// Since when polls have failed for want of a connection.
    disconnected_since: Option<Instant>,
    /// The pause before the next poll after a refresh (grows while polls fail).
    ride_backoff: Duration,
}

/// The first pause of a poll riding through a failover.
const RIDE_BACKOFF_MIN: Duration = Duration::from_millis(25);

impl Consumer {
    /// A consumer of the given partitions, starting where `config.start_from` says.
    ///
    /// # Errors
    /// [`ClientError`] if the offsets cannot be looked up.
    pub async fn assigned(
        client: &Client,
        stream: &str,
        topic: &str,
        partitions: &[u32],
        config: ConsumerConfig,
    ) -> Result<Self, ClientError> {
        let mut consumer = Self::new(client, stream, topic, config);
        for &partition in partitions {
            let offset = consumer.start_offset(partition).await?;
            consumer.positions.insert(partition, offset);
        }
        Ok(consumer)
    }

    /// A consumer of every partition of the topic.
    ///
    /// # Errors
    /// As [`Consumer::assigned`].
    pub async fn all_partitions(
        client: &Client,
        stream: &str,
        topic: &str,
        config: ConsumerConfig,
    ) -> Result<Self, ClientError> {
        let info = client.describe_topic(stream, topic).await?;
        let partitions: Vec<u32> = info.partitions.iter().map(|p| p.id).collect();
        Self::assigned(client, stream, topic, &partitions, config).await
    }

    /// Joins consumer group `group` of `stream`, which consumes `topic`.
    ///
    /// # Errors
    /// [`ClientError`] if the join is refused.
    pub async fn join_group(
        client: &Client,
        stream: &str,
        topic: &str,
        group: &str,
        member_name: &str,
        config: ConsumerConfig,
    ) -> Result<Self, ClientError> {
        let mut consumer = Self::new(client, stream, topic, config);
        consumer.group = Some(Membership {
            group: group.to_owned(),
            member_name: member_name.to_owned(),
            session: 0,
            member_id: 0,
            generation: 0,
            last_heartbeat: Instant::now(),
            heartbeat_now: false,
        });
        consumer.join().await?;
        Ok(consumer)
    }

    fn new(client: &Client, stream: &str, topic: &str, config: ConsumerConfig) -> Self {
        Self {
            client: client.clone(),
            stream: stream.to_owned(),
            topic: topic.to_owned(),
            config,
            positions: BTreeMap::new(),
            committed: BTreeMap::new(),
            buffered: VecDeque::new(),
            group: None,
            last_commit: Instant::now(),
            disconnected_since: None,
            ride_backoff: RIDE_BACKOFF_MIN,
        }
    }

    /// The partitions this consumer reads now, with their next offsets.
    pub fn positions(&self) -> &BTreeMap<u32, u64> {
        &self.positions
    }

    /// The member id, for a group member.
    pub fn member_id(&self) -> Option<u64> {
        self.group.as_ref().map(|g| g.member_id)
    }

    async fn start_offset(&self, partition: u32) -> Result<u64, ClientError> {
        let spec = match self.config.start_from {
            StartFrom::Offset(offset) => return Ok(offset),
            StartFrom::Earliest => OffsetSpec::Earliest,
            StartFrom::Latest => OffsetSpec::Latest,
            StartFrom::Timestamp(ts) => OffsetSpec::Timestamp(ts),
        };
        match self
            .client
            .list_offset(&self.stream, &self.topic, partition, spec)
            .await?
        {
            Some(offset) => Ok(offset),
            // No record at or after the timestamp: start at the end.
            None => Ok(self
                .client
                .list_offset(&self.stream, &self.topic, partition, OffsetSpec::Latest)
                .await?
                .unwrap_or(0)),
        }
    }

    async fn join(&mut self) -> Result<(), ClientError> {
        let timeout = self.config.session_timeout;
        let timeout_ms = timeout.as_millis().min(u32::MAX.into()) as u32;
        let Some(group) = self.group.as_mut() else {
            return Ok(());
        };
        if group.session == 0 {
            // A client session lives 1 s to 10 min.
            let lifetime = timeout.clamp(Duration::from_secs(1), Duration::from_secs(600));
            group.session = self.client.register_session(lifetime).await?;
        }
        let request = Request::JoinGroup {
            stream: &self.stream,
            group: &group.group,
            topic: &self.topic,
            member_name: &group.member_name,
            session_timeout_ms: timeout_ms,
            session: group.session,
        };
        let response = match self.client.call(&request).await {
            Err(err) if err.code() == Some(ErrorCode::SessionNotFound) => {
                // The session ended (the member was quiet past its timeout): a new
                // one, and a new membership.
                group.session = 0;
                return Box::pin(self.join()).await;
            }
            other => other?,
        };
        self.positions.clear();
        self.buffered.clear();
        self.apply_grant(response).await
    }

    /// Takes a join or heartbeat answer: releases what is no longer granted (after
    /// committing it) and starts on what is newly granted.
    async fn apply_grant(&mut self, response: Response) -> Result<(), ClientError> {
        let Response::Assignment {
            member_id,
            generation,
            partitions,
        } = response
        else {
            return Err(unexpected(&response));
        };
        if let Some(group) = self.group.as_mut() {
            group.member_id = member_id;
            group.generation = generation;
            group.last_heartbeat = Instant::now();
        }
        let released: Vec<u32> = self
            .positions
            .keys()
            .copied()
            .filter(|p| !partitions.contains(p))
            .collect();
        if !released.is_empty() {
            // Records of released partitions not yet returned are dropped; the new
            // owner reads them from the committed position.
            self.buffered.retain(|r| !released.contains(&r.partition));
            let offsets: Vec<(u32, u64)> = released
                .iter()
                .filter_map(|p| Some((*p, *self.positions.get(p)?)))
                .collect();
            self.commit_offsets(offsets).await?;
            for partition in &released {
                self.positions.remove(partition);
            }
            if let Some(group) = self.group.as_mut() {
                group.heartbeat_now = true;
            }
        }
        let added: Vec<u32> = partitions
            .iter()
            .copied()
            .filter(|p| !self.positions.contains_key(p))
            .collect();
        if !added.is_empty() {
            let committed = self.fetch_committed().await?;
            for partition in added {
                let offset = match committed.get(&partition) {
                    Some(offset) => *offset,
                    None => self.start_offset(partition).await?,
                };
                self.positions.insert(partition, offset);
                self.committed.insert(partition, offset);
            }
        }
        Ok(())
    }

    async fn fetch_committed(&self) -> Result<BTreeMap<u32, u64>, ClientError> {
        let Some(group) = self.group.as_ref() else {
            return Ok(BTreeMap::new());
        };
        let request = Request::FetchOffsets {
            stream: &self.stream,
            group: &group.group,
        };
        match self.client.call(&request).await? {
            Response::Offsets(list) => Ok(list
                .into_iter()
                .filter_map(|o| Some((o.partition, o.committed?)))
                .collect()),
            other => Err(unexpected(&other)),
        }
    }

    async fn heartbeat(&mut self) -> Result<(), ClientError> {
        let Some(group) = self.group.as_mut() else {
            return Ok(());
        };
        group.heartbeat_now = false;
        let owned: Vec<u32> = self.positions.keys().copied().collect();
        let request = Request::Heartbeat {
            member: GroupMemberRequest {
                stream: &self.stream,
                group: &group.group,
                member_id: group.member_id,
                generation: group.generation,
            },
            owned,
        };
        match self.client.call(&request).await {
            Ok(response) => self.apply_grant(response).await,
            Err(err) if err.code() == Some(ErrorCode::UnknownMember) => {
                tracing::info!("group membership lost; joining again");
                self.join().await
            }
            Err(err) => Err(err),
        }
    }

    /// Returns the next records, waiting up to `timeout` for some to arrive. In a
    /// group it also heartbeats and follows assignment changes; with auto-commit on, it
    /// commits when the interval has passed.
    ///
    /// # Errors
    /// Connection and server errors; [`ClientError::Corrupt`] for a damaged batch.
    pub async fn poll(&mut self, timeout: Duration) -> Result<Vec<ConsumerRecord>, ClientError> {
        match self.poll_connected(timeout).await {
            Err(err) if connection_lost(&err) => {
                self.ride_through(err, timeout).await.map(|()| Vec::new())
            }
            other => {
                self.disconnected_since = None;
                self.ride_backoff = RIDE_BACKOFF_MIN;
                other
            }
        }
    }

    /// A lost connection: reconnect (the same address, TLS and login) with backoff
    /// within `timeout`; a group member then heartbeats on the new connection, and
    /// joins again if the node forgot it (reading on from the committed offsets).
    /// Returns the error once polls have failed for `retry_for`.
    async fn ride_through(
        &mut self,
        err: ClientError,
        timeout: Duration,
    ) -> Result<(), ClientError> {
        let since = *self.disconnected_since.get_or_insert_with(Instant::now);
        if since.elapsed() >= self.config.retry_for {
            return Err(err);
        }
        let until = Instant::now() + timeout;
        let mut backoff = Duration::from_millis(50);
        loop {
            if self.client.is_closed() || self.client.is_stale() {
                if self.client.refresh().await.is_ok() {
                    tracing::debug!(%err, "consumer refreshed the cluster map");
                    if let Some(group) = self.group.as_mut() {
                        group.heartbeat_now = true;
                    }
                    // A member that still names a dead primary answers the same until
                    // the view change ends: ask again after a growing pause, not at once.
                    let pause = self.ride_backoff;
                    self.ride_backoff = (pause * 2).min(Duration::from_secs(1));
                    tokio::time::sleep(pause.min(until.saturating_duration_since(Instant::now())))
                        .await;
                    return Ok(());
                }
            } else {
                // The node refused for now (shutting down): wait and poll again.
                tokio::time::sleep(backoff.min(until.saturating_duration_since(Instant::now())))
                    .await;
                return Ok(());
            }
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(());
            }
            tokio::time::sleep(backoff.min(left)).await;
            backoff = (backoff * 2).min(Duration::from_secs(1));
        }
    }

    async fn poll_connected(
        &mut self,
        timeout: Duration,
    ) -> Result<Vec<ConsumerRecord>, ClientError> {
        self.keep_up().await?;
        if self.buffered.is_empty() {
            for (partition, offset, batches) in self.fetch_raw(timeout).await? {
                decode_records(partition, offset, &batches, &mut self.buffered)?;
            }
        }
        let records: Vec<ConsumerRecord> = self.buffered.drain(..).collect();
        for record in &records {
            self.positions.insert(record.partition, record.offset + 1);
        }
        Ok(records)
    }

    /// As [`Consumer::poll`], but hands each record to `visit` (with its partition and
    /// offset) where it lies in the fetched batches, copying no key, value or header:
    /// the way to read at full speed. Returns how many records were visited.
    ///
    /// # Errors
    /// As [`Consumer::poll`], except that a lost connection is returned at once (no
    /// riding through). A damaged batch stops the walk; records visited before it
    /// count as read.
    pub async fn poll_each<F>(
        &mut self,
        timeout: Duration,
        mut visit: F,
    ) -> Result<u64, ClientError>
    where
        F: FnMut(u32, u64, &RecordView<'_>),
    {
        self.keep_up().await?;
        // `poll` drains its buffer before returning, so nothing copied waits here.
        let mut visited = 0;
        for (partition, offset, batches) in self.fetch_raw(timeout).await? {
            let mut next = None;
            let walked = for_each_record(partition, offset, &batches, |offset, record| {
                visit(partition, offset, record);
                visited += 1;
                next = Some(offset + 1);
            });
            if let Some(next) = next {
                self.positions.insert(partition, next);
            }
            walked?;
        }
        Ok(visited)
    }

    /// Heartbeats a group member and auto-commits when they are due.
    async fn keep_up(&mut self) -> Result<(), ClientError> {
        let due = self.group.as_ref().is_some_and(|g| {
            g.heartbeat_now || g.last_heartbeat.elapsed() >= self.config.heartbeat_interval
        });
        if due {
            self.heartbeat().await?;
        }
        if let Some(interval) = self.config.auto_commit {
            if self.last_commit.elapsed() >= interval {
                self.commit().await?;
            }
        }
        Ok(())
    }

    /// One fetch of every assigned partition, answered as (partition, offset asked
    /// for, whole batches as stored).
    async fn fetch_raw(
        &mut self,
        timeout: Duration,
    ) -> Result<Vec<(u32, u64, bytes::Bytes)>, ClientError> {
        if self.positions.is_empty() {
            // Nothing assigned yet: wait a little for the group to hand something over.
            let pause = timeout.min(self.config.heartbeat_interval / 2);
            tokio::time::sleep(pause).await;
            return Ok(Vec::new());
        }
        let wait_ms = timeout.as_millis().min(u32::MAX.into()) as u32;
        let mut pending = Vec::new();
        for (&partition, &offset) in &self.positions {
            let request = Request::Fetch {
                stream: &self.stream,
                topic: &self.topic,
                partition,
                offset,
                max_bytes: self.config.fetch_bytes_max,
                max_wait_ms: wait_ms,
            };
            pending.push((partition, offset, self.client.start_call(&request)));
        }
        let mut fetched = Vec::with_capacity(pending.len());
        for (partition, offset, answer) in pending {
            match answer.await {
                Ok(Response::Fetched { batches, .. }) => fetched.push((partition, offset, batches)),
                Ok(other) => return Err(unexpected(&other)),
                Err(err) if err.code() == Some(ErrorCode::OffsetOutOfRange) => {
                    // Retention removed what we were about to read: start over by policy.
                    let restart = self.start_offset(partition).await?;
                    tracing::warn!(partition, offset, restart, "offset out of range; resetting");
                    self.positions.insert(partition, restart);
                }
                Err(err) => return Err(err),
            }
        }
        Ok(fetched)
    }

    /// Commits the positions of the records returned so far (for a group member).
    ///
    /// # Errors
    /// Connection and server errors.
    pub async fn commit(&mut self) -> Result<(), ClientError> {
        self.last_commit = Instant::now();
        let changed: Vec<(u32, u64)> = self
            .positions
            .iter()
            .filter(|(p, o)| self.committed.get(p) != Some(o))
            .map(|(p, o)| (*p, *o))
            .collect();
        self.commit_offsets(changed).await
    }

    /// Sends a commit of the current positions now and returns a future of its outcome,
    /// which the caller may await or drop; polling goes on meanwhile. A failed
    /// asynchronous commit is retried by the next synchronous or automatic one.
    pub fn commit_async(
        &mut self,
    ) -> impl std::future::Future<Output = Result<(), ClientError>> + Send + 'static {
        self.last_commit = Instant::now();
        let sent = self.group.as_ref().map(|group| {
            let request = Request::CommitOffsets {
                member: GroupMemberRequest {
                    stream: &self.stream,
                    group: &group.group,
                    member_id: group.member_id,
                    generation: group.generation,
                },
                offsets: self.positions.iter().map(|(p, o)| (*p, *o)).collect(),
            };
            self.client.start_call(&request)
        });
        async move {
            match sent {
                Some(answer) => answer.await.map(|_| ()),
                None => Ok(()),
            }
        }
    }

    async fn commit_offsets(&mut self, offsets: Vec<(u32, u64)>) -> Result<(), ClientError> {
        match self.send_commit(&offsets).await {
            Err(err) if err.code() == Some(ErrorCode::StaleGeneration) => {
                // The group rebalanced since our last heartbeat: learn the new
                // generation and assignment, then commit what is still ours.
                self.heartbeat_boxed().await?;
                let ours: Vec<(u32, u64)> = offsets
                    .into_iter()
                    .filter(|(p, _)| self.positions.contains_key(p))
                    .collect();
                self.send_commit(&ours).await
            }
            Err(err) if err.code() == Some(ErrorCode::UnknownMember) => {
                // The coordinator forgot this member (it moved to another node, or the
                // session expired): join again, and commit the progress made on the
                // partitions that are still ours (reading on from it, not from the
                // older committed offsets the join found).
                tracing::info!("group membership lost at a commit; joining again");
                self.join_boxed().await?;
                let ours: Vec<(u32, u64)> = offsets
                    .into_iter()
                    .filter(|(p, _)| self.positions.contains_key(p))
                    .collect();
                for (partition, offset) in &ours {
                    self.positions.insert(*partition, *offset);
                }
                self.buffered.clear();
                self.send_commit(&ours).await
            }
            other => other,
        }
    }

    /// The join, boxed: a join can commit (releasing partitions), which can join.
    fn join_boxed(
        &mut self,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), ClientError>> + Send + '_>>
    {
        Box::pin(self.join())
    }

    /// The heartbeat, boxed: it can commit (releasing partitions), which can heartbeat.
    fn heartbeat_boxed(
        &mut self,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), ClientError>> + Send + '_>>
    {
        Box::pin(self.heartbeat())
    }

    async fn send_commit(&mut self, offsets: &[(u32, u64)]) -> Result<(), ClientError> {
        let Some(group) = self.group.as_ref() else {
            return Ok(());
        };
        if offsets.is_empty() {
            return Ok(());
        }
        let request = Request::CommitOffsets {
            member: GroupMemberRequest {
                stream: &self.stream,
                group: &group.group,
                member_id: group.member_id,
                generation: group.generation,
            },
            offsets: offsets.to_vec(),
        };
        self.client.call(&request).await?;
        for (partition, offset) in offsets {
            self.committed.insert(*partition, *offset);
        }
        Ok(())
    }

    /// Commits, leaves the group (a member the coordinator no longer knows is out
    /// already) and ends the membership's client session.
    ///
    /// # Errors
    /// Connection and server errors.
    pub async fn close(mut self) -> Result<(), ClientError> {
        self.commit().await?;
        if let Some(group) = self.group.take() {
            let request = Request::LeaveGroup {
                stream: &self.stream,
                group: &group.group,
                member_id: group.member_id,
            };
            match self.client.call(&request).await {
                // The coordinator forgot the member (it moved, or the session expired):
                // it is out of the group already.
                Err(err) if err.code() == Some(ErrorCode::UnknownMember) => {}
                other => {
                    other?;
                }
            }
            if group.session != 0 {
                self.client.end_session(group.session).await?;
            }
        }
        Ok(())
    }
}

/// Decodes fetched batches into records at or after `from`, checking every CRC.
///
/// # Errors
/// [`ClientError::Corrupt`].
pub fn decode_records(
    partition: u32,
    from: u64,
    bytes: &[u8],
    out: &mut VecDeque<ConsumerRecord>,
) -> Result<(), ClientError> {
    let mut bad_header = None;
    for_each_record(partition, from, bytes, |offset, record| {
        let headers = record
            .headers
            .iter()
            .map(|h| h.map(|h| (h.key.to_vec(), h.value.map(<[u8]>::to_vec))))
            .collect::<Result<Vec<_>, _>>();
        match headers {
            Ok(headers) => out.push_back(ConsumerRecord {
                partition,
                offset,
                timestamp_ms: record.timestamp_ms,
                key: record.key.map(<[u8]>::to_vec),
                value: record.value.map(<[u8]>::to_vec),
                headers,
            }),
            Err(err) => {
                bad_header.get_or_insert(ClientError::Corrupt {
                    partition,
                    offset,
                    reason: err.to_string(),
                });
            }
        }
    })?;
    bad_header.map_or(Ok(()), Err)
}

/// Walks fetched batches, checking every CRC, and calls `visit` with the offset of each
/// record at or after `from`, in order.
fn for_each_record(
    partition: u32,
    from: u64,
    mut bytes: &[u8],
    mut visit: impl FnMut(u64, &RecordView<'_>),
) -> Result<(), ClientError> {
    while !bytes.is_empty() {
        let corrupt = |reason: String| ClientError::Corrupt {
            partition,
            offset: from,
            reason,
        };
        let (batch, used) = RecordBatch::validate(bytes).map_err(|e| corrupt(e.to_string()))?;
        let header = batch.header();
        for (i, record) in batch.records().enumerate() {
            let record = record.map_err(|e| corrupt(e.to_string()))?;
            let offset = header.base_offset as u64 + i as u64;
            if offset >= from {
                visit(
                    offset,
                    &RecordView {
                        timestamp_ms: header.base_timestamp.saturating_add(record.timestamp_delta),
                        key: record.key,
                        value: record.value,
                        headers: record.headers,
                    },
                );
            }
        }
        bytes = &bytes[used..];
    }
    Ok(())
}

/// Whether `err` means the connection is gone or the node is going (a new connection
/// may do).
fn connection_lost(err: &ClientError) -> bool {
    crate::client::misrouted(err)
}
