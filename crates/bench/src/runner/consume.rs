//! The consumer side of a run: reading units (a group, or one plain consumer of every
//! partition), their tasks, and the check that each read exactly what was acknowledged.

use super::*;

/// A set of consumers that together read every record once: a group, or one plain
/// consumer of every partition.
#[derive(Debug, Default)]
pub(super) struct ReadingUnit {
    pub(super) consumed: AtomicU64,
}

/// What every consumer shares.
#[derive(Debug)]
pub(super) struct ConsumerShared {
    pub(super) names: Names,
    pub(super) clock: RunClock,
    pub(super) counters: Arc<Counters>,
    /// Records each unit must read; `u64::MAX` until the producers have stopped.
    pub(super) expected: AtomicU64,
    /// Set when the drain deadline passes.
    pub(super) give_up: Mutex<Option<Instant>>,
    pub(super) record_bytes: u64,
    /// End-to-end latency means something (not for data written before the read).
    pub(super) end_to_end: bool,
}

/// One consumer task: a consumer per topic, each a group member or plain.
async fn consume(
    addr: Target,
    shared: Arc<ConsumerShared>,
    unit: Arc<ReadingUnit>,
    group: Option<String>,
    member: u32,
) -> Result<Recorder, BenchError> {
    let client = addr
        .connect()
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
pub(super) fn spawn_consumers(
    addr: &Target,
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
            addr.clone(),
            Arc::clone(shared),
            Arc::clone(&units[u]),
            group,
            c,
        )));
    }
    (units, tasks)
}

pub(super) async fn join_consumers(tasks: Vec<ConsumerTask>) -> Result<Recorder, BenchError> {
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
pub(super) fn check_units(units: &[Arc<ReadingUnit>], produced: u64) -> Result<(), BenchError> {
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
