//! One link's reader and writer tasks, the delivery budget and the counted queue.

use super::*;

#[allow(clippy::too_many_arguments)] // the parts of one link
pub(super) fn spawn_link(
    config: &BusConfig,
    placement: &Placement,
    peer: u8,
    link: u16,
    generation: u32,
    stream: BoxStream,
    frames: mpsc::Receiver<Frame>,
    events: mpsc::UnboundedSender<PeerEvent>,
    metrics: Arc<BusMetrics>,
    deliver: Deliver,
    announce: bool,
) -> LinkTasks {
    let (mut reader, mut writer) = tokio::io::split(stream);
    let max = config.frame_bytes_max;
    let silence_max = config.heartbeat_timeout.max(Duration::from_millis(30));
    let ping_every = silence_max / 3;
    let links = config.links;
    let read_events = events.clone();
    let read_metrics = Arc::clone(&metrics);
    let reader = placement.spawn(link, peer, async move {
        let mut buf = Vec::with_capacity(64 * 1024);
        let mut chunk = vec![0u8; 64 * 1024];
        // The reading thread's name, looked up again only when the task moves threads.
        let mut thread: Option<(std::thread::ThreadId, Option<Arc<str>>)> = None;
        loop {
            let current = std::thread::current();
            if thread.as_ref().is_none_or(|(id, _)| *id != current.id()) {
                thread = Some((current.id(), current.name().map(Arc::from)));
            }
            let read_on = thread.as_ref().and_then(|(_, name)| name.clone());
            // Decode every whole frame in the buffer, then drop their bytes in one move.
            let mut consumed = 0;
            loop {
                match Frame::decode(&buf[consumed..], max) {
                    Ok(Some((frame, used))) if frame.kind >= KIND_BUS_RESERVED => {
                        consumed += used; // the bus's own; nothing to deliver
                    }
                    Ok(Some((frame, used))) => {
                        consumed += used;
                        read_metrics.frames_received.fetch_add(1, Ordering::Relaxed);
                        read_metrics
                            .bytes_received
                            .fetch_add(used as u64, Ordering::Relaxed);
                        if let Some(c) = read_metrics.link(peer, link, links) {
                            c[2].fetch_add(1, Ordering::Relaxed);
                            c[3].fetch_add(used as u64, Ordering::Relaxed);
                        }
                        // Wait for budget: while the consumer holds too much, this link
                        // stops reading and TCP pushes back on the peer.
                        let Some(budget) = deliver.budget_for(used, &read_metrics).await else {
                            return;
                        };
                        let _ = deliver.channel.send(Delivery {
                            peer,
                            link,
                            frame,
                            read_on: read_on.clone(),
                            _budget: budget,
                        });
                    }
                    Ok(None) => {
                        buf.drain(..consumed);
                        break;
                    }
                    Err(err) => {
                        let err: FrameError = err;
                        let counter = match err {
                            FrameError::Checksum { .. } => &read_metrics.frame_checksum_errors,
                            _ => &read_metrics.frame_length_errors,
                        };
                        counter.fetch_add(1, Ordering::Relaxed);
                        tracing::warn!(peer, link, %err, "closing a replica link");
                        let _ = read_events.send(PeerEvent::LinkClosed { link, generation });
                        return;
                    }
                }
            }
            // A live peer writes at least a ping every third of the heartbeat timeout;
            // silence for a whole one is a half-open link (a blackholed or stopped
            // peer that TCP_USER_TIMEOUT cannot see while we send nothing).
            match tokio::time::timeout(silence_max, reader.read(&mut chunk)).await {
                Err(_) => {
                    read_metrics
                        .links_closed_silent
                        .fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(peer, link, "closing a silent replica link");
                    let _ = read_events.send(PeerEvent::LinkClosed { link, generation });
                    return;
                }
                Ok(Ok(0) | Err(_)) => {
                    let _ = read_events.send(PeerEvent::LinkClosed { link, generation });
                    return;
                }
                Ok(Ok(n)) => buf.extend_from_slice(&chunk[..n]),
            }
        }
    });
    let writer = placement.spawn(link, peer, async move {
        // Whatever is still queued when this task ends (a teardown aborts it) is lost.
        let mut frames = CountedQueue {
            frames,
            metrics: Arc::clone(&metrics),
        };
        let frames = &mut frames.frames;
        let mut bytes = Vec::new();
        if announce {
            // The acceptor tells the dialer it took this link into the bundle.
            let taken = Frame {
                group: 0,
                kind: KIND_LINK_TAKEN,
                payload: Vec::new(),
            };
            taken.encode(&mut bytes);
            if writer.write_all(&bytes).await.is_err() || writer.flush().await.is_err() {
                let _ = events.send(PeerEvent::LinkClosed { link, generation });
                return;
            }
        }
        loop {
            let frame = match tokio::time::timeout(ping_every, frames.recv()).await {
                Ok(Some(frame)) => frame,
                Ok(None) => break,
                Err(_) => {
                    // Idle: a ping tells the peer this side is alive.
                    bytes.clear();
                    ping().encode(&mut bytes);
                    if writer.write_all(&bytes).await.is_err() || writer.flush().await.is_err() {
                        let _ = events.send(PeerEvent::LinkClosed { link, generation });
                        return;
                    }
                    continue;
                }
            };
            bytes.clear();
            frame.encode(&mut bytes);
            let mut count = 1u64;
            // Batch what is already queued into one write, but only up to a bound:
            // senders that keep the queue full must not keep the writer from writing.
            while bytes.len() < WRITE_BATCH_BYTES_MAX {
                let Ok(more) = frames.try_recv() else { break };
                more.encode(&mut bytes);
                count += 1;
            }
            // Flush every batch: a TLS writer buffers ciphertext until flushed, and a
            // batch left there would wait for the next send.
            if writer.write_all(&bytes).await.is_err() || writer.flush().await.is_err() {
                // The batch never made it whole; what is still queued is counted when
                // the queue is dropped.
                metrics
                    .frames_lost_at_teardown
                    .fetch_add(count, Ordering::Relaxed);
                let _ = events.send(PeerEvent::LinkClosed { link, generation });
                return;
            }
            metrics.frames_sent.fetch_add(count, Ordering::Relaxed);
            metrics
                .bytes_sent
                .fetch_add(bytes.len() as u64, Ordering::Relaxed);
            if let Some(c) = metrics.link(peer, link, links) {
                c[0].fetch_add(count, Ordering::Relaxed);
                c[1].fetch_add(bytes.len() as u64, Ordering::Relaxed);
            }
        }
    });
    LinkTasks { reader, writer }
}

/// Where links deliver frames: the consumer's channel and the byte budget it shares.
#[derive(Debug, Clone)]
pub(super) struct Deliver {
    pub(super) channel: mpsc::UnboundedSender<Delivery>,
    pub(super) budget: Arc<DeliveryBudget>,
}

/// Bytes of deliveries held, against `delivery_bytes_max`. One atomic add to take a
/// share and one to give it back: a semaphore's release takes a lock per frame.
#[derive(Debug)]
pub(super) struct DeliveryBudget {
    pub(super) held: AtomicUsize,
    pub(super) max: usize,
    /// Links waiting for room: a release notifies only when there are some.
    pub(super) waiting: AtomicUsize,
    pub(super) freed: tokio::sync::Notify,
}

/// A delivery's share of the budget, given back when the delivery is dropped.
#[derive(Debug)]
pub(super) struct BudgetShare {
    budget: Arc<DeliveryBudget>,
    bytes: usize,
}

impl Drop for BudgetShare {
    fn drop(&mut self) {
        self.budget.held.fetch_sub(self.bytes, Ordering::SeqCst);
        if self.budget.waiting.load(Ordering::SeqCst) > 0 {
            self.budget.freed.notify_waiters();
        }
    }
}

impl Deliver {
    /// A share of the budget for a frame of `bytes`, waiting while the consumer holds
    /// the rest (a lone frame larger than the budget passes when nothing else is held);
    /// `None` never, kept for the shape of the call.
    async fn budget_for(&self, bytes: usize, metrics: &BusMetrics) -> Option<BudgetShare> {
        let wanted = bytes + DELIVERY_OVERHEAD_BYTES;
        let budget = &self.budget;
        let mut waited = false;
        loop {
            let held = budget.held.load(Ordering::SeqCst);
            if held == 0 || held + wanted <= budget.max {
                if budget
                    .held
                    .compare_exchange(held, held + wanted, Ordering::SeqCst, Ordering::SeqCst)
                    .is_ok()
                {
                    return Some(BudgetShare {
                        budget: Arc::clone(budget),
                        bytes: wanted,
                    });
                }
                continue;
            }
            if !waited {
                metrics.delivery_waits.fetch_add(1, Ordering::Relaxed);
                waited = true;
            }
            // Announce the wait, register for the next release, then look again: a
            // release that came before the registration is seen by the look.
            budget.waiting.fetch_add(1, Ordering::SeqCst);
            let freed = budget.freed.notified();
            tokio::pin!(freed);
            freed.as_mut().enable();
            let held = budget.held.load(Ordering::SeqCst);
            if held != 0 && held + wanted > budget.max {
                freed.await;
            }
            budget.waiting.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

/// A link's queue that counts the frames still in it when it is dropped: frames `send`
/// accepted that a teardown loses.
pub(super) struct CountedQueue {
    frames: mpsc::Receiver<Frame>,
    metrics: Arc<BusMetrics>,
}

impl Drop for CountedQueue {
    fn drop(&mut self) {
        self.frames.close();
        let mut lost = 0u64;
        while self.frames.try_recv().is_ok() {
            lost += 1;
        }
        self.metrics
            .frames_lost_at_teardown
            .fetch_add(lost, Ordering::Relaxed);
    }
}

/// The frame an idle link's writer sends every third of the heartbeat timeout.
pub(super) fn ping() -> Frame {
    Frame {
        group: 0,
        kind: KIND_PING,
        payload: Vec::new(),
    }
}
