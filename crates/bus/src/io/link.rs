//! One link's reader and writer tasks, the delivery budget and the counted queue.

use bytes::{BufMut, Bytes, BytesMut};

use super::*;
use crate::frame::ZERO_COPY_PAYLOAD_BYTES_MIN;

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
        let mut buf = BytesMut::with_capacity(READ_BUFFER_BYTES);
        // While a large frame is read into a buffer of its own (`dedicated`), the read
        // buffer waits here.
        let mut spare = BytesMut::new();
        let mut dedicated = false;
        // The reading thread's name, looked up again only when the task moves threads.
        let mut thread: Option<(std::thread::ThreadId, Option<Arc<str>>)> = None;
        loop {
            let current = std::thread::current();
            if thread.as_ref().is_none_or(|(id, _)| *id != current.id()) {
                thread = Some((current.id(), current.name().map(Arc::from)));
            }
            let read_on = thread.as_ref().and_then(|(_, name)| name.clone());
            // Deliver every whole frame in the buffer; large payloads are slices of it.
            loop {
                match Frame::decode(&mut buf, max) {
                    Ok(Some(frame)) if frame.kind >= KIND_BUS_RESERVED => {} // the bus's own
                    Ok(Some(frame)) => {
                        let used = FRAME_HEADER_BYTES + frame.payload.len();
                        read_metrics.frames_received.fetch_add(1, Ordering::Relaxed);
                        read_metrics
                            .bytes_received
                            .fetch_add(used as u64, Ordering::Relaxed);
                        if let Some(c) = read_metrics.link(peer, link, links) {
                            c[2].fetch_add(1, Ordering::Relaxed);
                            c[3].fetch_add(used as u64, Ordering::Relaxed);
                        }
                        let target = deliver.target(frame.group);
                        // Wait for budget: while the target shard's consumer holds too
                        // much, this link stops reading and TCP pushes back on the peer.
                        let budget = target.budget_for(used, &read_metrics).await;
                        let _ = target.channel.send(Delivery {
                            peer,
                            link,
                            frame,
                            read_on: read_on.clone(),
                            _budget: budget,
                        });
                    }
                    Ok(None) => break,
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
            if dedicated && buf.is_empty() {
                // The dedicated frame was delivered: back to the read buffer.
                std::mem::swap(&mut buf, &mut spare);
                dedicated = false;
            }
            // A large frame is read into an allocation of exactly its size (the part
            // already buffered copied over, the rest read straight in), so its payload
            // is delivered without a copy and pins no memory beyond itself, which the
            // delivery budget counts.
            let whole = match buf.get(..4) {
                Some(raw) => 4 + u32::from_be_bytes([raw[0], raw[1], raw[2], raw[3]]) as usize,
                None => 0,
            };
            if !dedicated && whole >= FRAME_HEADER_BYTES + ZERO_COPY_PAYLOAD_BYTES_MIN {
                let mut frame = BytesMut::with_capacity(whole);
                frame.extend_from_slice(&buf);
                buf.clear();
                spare = std::mem::replace(&mut buf, frame);
                dedicated = true;
            }
            if !dedicated {
                buf.reserve(READ_BUFFER_BYTES);
            }
            let read = async {
                if dedicated {
                    let missing = whole - buf.len();
                    reader.read_buf(&mut (&mut buf).limit(missing)).await
                } else {
                    reader.read_buf(&mut buf).await
                }
            };
            // A live peer writes at least a ping every third of the heartbeat timeout;
            // silence for a whole one is a half-open link (a blackholed or stopped
            // peer that TCP_USER_TIMEOUT cannot see while we send nothing).
            match tokio::time::timeout(silence_max, read).await {
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
                Ok(Ok(_)) => {}
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
        let mut batch = WriteBatch::default();
        if announce {
            // The acceptor tells the dialer it took this link into the bundle.
            batch.push(&bus_frame(KIND_LINK_TAKEN));
            if batch.write_to(&mut writer).await.is_err() {
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
                    batch.push(&bus_frame(KIND_PING));
                    if batch.write_to(&mut writer).await.is_err() {
                        let _ = events.send(PeerEvent::LinkClosed { link, generation });
                        return;
                    }
                    continue;
                }
            };
            batch.push(&frame);
            drop(frame);
            // Batch what is already queued into one write, but only up to a bound:
            // senders that keep the queue full must not keep the writer from writing.
            while batch.bytes < WRITE_BATCH_BYTES_MAX {
                let Ok(more) = frames.try_recv() else { break };
                batch.push(&more);
            }
            let (count, bytes) = (batch.frames, batch.bytes as u64);
            if batch.write_to(&mut writer).await.is_err() {
                // The batch never made it whole; what is still queued is counted when
                // the queue is dropped.
                metrics
                    .frames_lost_at_teardown
                    .fetch_add(count, Ordering::Relaxed);
                let _ = events.send(PeerEvent::LinkClosed { link, generation });
                return;
            }
            metrics.frames_sent.fetch_add(count, Ordering::Relaxed);
            metrics.bytes_sent.fetch_add(bytes, Ordering::Relaxed);
            if let Some(c) = metrics.link(peer, link, links) {
                c[0].fetch_add(count, Ordering::Relaxed);
                c[1].fetch_add(bytes, Ordering::Relaxed);
            }
        }
    });
    LinkTasks { reader, writer }
}

/// Where links deliver frames: one channel and byte budget per receiving shard, and the
/// node's rule for which shard a group belongs to.
#[derive(Clone)]
pub(super) struct Deliver {
    pub(super) targets: Arc<Vec<DeliveryTarget>>,
    pub(super) route: Option<DeliveryRoute>,
}

/// One receiving shard's channel and the budget its deliveries hold.
#[derive(Debug)]
pub(super) struct DeliveryTarget {
    pub(super) channel: mpsc::UnboundedSender<Delivery>,
    pub(super) budget: Arc<DeliveryBudget>,
}

impl Deliver {
    /// The receiving shard of `group`'s frames (the only one without a route).
    fn target(&self, group: u64) -> &DeliveryTarget {
        let shard = match &self.route {
            Some(route) => usize::from(route(group)) % self.targets.len().max(1),
            None => 0,
        };
        &self.targets[shard]
    }
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

impl DeliveryTarget {
    /// A share of the budget for a frame of `bytes`, waiting while the consumer holds
    /// the rest (a lone frame larger than the budget passes when nothing else is held).
    async fn budget_for(&self, bytes: usize, metrics: &BusMetrics) -> BudgetShare {
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
                    return BudgetShare {
                        budget: Arc::clone(budget),
                        bytes: wanted,
                    };
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

/// A frame of the bus's own (a ping, a link-taken announcement): empty, group 0.
pub(super) fn bus_frame(kind: u8) -> Frame {
    Frame {
        group: 0,
        kind,
        payload: Bytes::new(),
    }
}

/// Payloads from this many bytes up are written from their own buffer (vectored);
/// smaller ones are copied next to their header, where one copy costs less than an
/// iovec entry.
const VECTORED_PAYLOAD_BYTES_MIN: usize = 4 * 1024;

/// The most buffers one vectored write names (below every platform's IOV_MAX).
const WRITE_SLICES_MAX: usize = 64;

/// Read buffer of a link, grown for a frame that needs more.
const READ_BUFFER_BYTES: usize = 64 * 1024;

/// Frames gathered for one write, in wire order: headers and small payloads copied
/// into `staged`, large payloads referenced, never copied.
#[derive(Default)]
struct WriteBatch {
    staged: Vec<u8>,
    parts: Vec<BatchPart>,
    /// Frames in the batch.
    frames: u64,
    /// Bytes in the batch.
    bytes: usize,
}

enum BatchPart {
    /// `staged[..end]` from where the previous staged part ended.
    Staged {
        end: usize,
    },
    Payload(Bytes),
}

impl WriteBatch {
    fn push(&mut self, frame: &Frame) {
        self.staged.extend_from_slice(&frame.header());
        if frame.payload.len() >= VECTORED_PAYLOAD_BYTES_MIN {
            self.parts.push(BatchPart::Staged {
                end: self.staged.len(),
            });
            self.parts.push(BatchPart::Payload(frame.payload.clone()));
        } else {
            self.staged.extend_from_slice(&frame.payload);
        }
        self.frames += 1;
        self.bytes += FRAME_HEADER_BYTES + frame.payload.len();
    }

    /// Writes the whole batch with vectored writes and flushes it (a TLS writer keeps
    /// ciphertext buffered until flushed, and a batch left there would wait for the
    /// next send), then empties it for the next one.
    async fn write_to<W: tokio::io::AsyncWrite + Unpin>(
        &mut self,
        writer: &mut W,
    ) -> std::io::Result<()> {
        let staged_end = self.staged.len();
        if self
            .parts
            .last()
            .is_none_or(|part| !matches!(part, BatchPart::Staged { end } if *end == staged_end))
        {
            self.parts.push(BatchPart::Staged { end: staged_end });
        }
        // The batch as buffers, then written from the front, skipping what went out.
        let mut buffers: Vec<&[u8]> = Vec::with_capacity(self.parts.len());
        let mut start = 0;
        for part in &self.parts {
            match part {
                BatchPart::Staged { end } => {
                    if *end > start {
                        buffers.push(&self.staged[start..*end]);
                    }
                    start = *end;
                }
                BatchPart::Payload(payload) => buffers.push(payload),
            }
        }
        let result = write_all_vectored(writer, &mut buffers).await;
        let result = match result {
            Ok(()) => writer.flush().await,
            Err(err) => Err(err),
        };
        drop(buffers);
        self.staged.clear();
        self.parts.clear();
        self.frames = 0;
        self.bytes = 0;
        result
    }
}

/// Writes every buffer, in order, at most `WRITE_SLICES_MAX` per call.
async fn write_all_vectored<W: tokio::io::AsyncWrite + Unpin>(
    writer: &mut W,
    buffers: &mut [&[u8]],
) -> std::io::Result<()> {
    let mut first = 0;
    while first < buffers.len() {
        let slices: Vec<std::io::IoSlice<'_>> = buffers[first..]
            .iter()
            .take(WRITE_SLICES_MAX)
            .map(|b| std::io::IoSlice::new(b))
            .collect();
        let mut written = writer.write_vectored(&slices).await?;
        if written == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        while written > 0 {
            let head = buffers[first].len();
            if written >= head {
                written -= head;
                first += 1;
            } else {
                buffers[first] = &buffers[first][written..];
                written = 0;
            }
        }
        while buffers.get(first).is_some_and(|b| b.is_empty()) {
            first += 1;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    // A panic in a test is a failed assertion, not a crash on outside data.
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    use crate::test_certificates as certificates;

    /// Both ends of one TLS connection over real loopback sockets with small kernel
    /// buffers, so a writer meets a full socket after a few kilobytes.
    async fn tls_pair() -> (BoxStream, BoxStream) {
        let (certificate, private_key, ca) = certificates::replica_certificates();
        let tls = build_tls(&TlsConfig {
            certificate_chain: vec![certificate],
            private_key,
            ca_certificates: vec![ca],
            server_name: "braid-replica".to_owned(),
        })
        .unwrap();
        let listening = tokio::net::TcpSocket::new_v4().unwrap();
        listening.set_recv_buffer_size(4096).unwrap();
        listening.bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let listener = listening.listen(1).unwrap();
        let dialing = tokio::net::TcpSocket::new_v4().unwrap();
        dialing.set_send_buffer_size(4096).unwrap();
        dialing.set_recv_buffer_size(4096).unwrap();
        let (dialed, accepted) = tokio::join!(
            dialing.connect(listener.local_addr().unwrap()),
            listener.accept()
        );
        let (dialed, (accepted, _)) = (dialed.unwrap(), accepted.unwrap());
        let (client, server) = tokio::join!(
            tls.connector.connect(tls.server_name.clone(), dialed),
            tls.acceptor.accept(accepted)
        );
        (Box::new(client.unwrap()), Box::new(server.unwrap()))
    }

    /// Once `write_to` returns, every byte of the batch is on its way: a TLS writer
    /// that met a full socket keeps the rest of its ciphertext until flushed, and an
    /// unflushed batch would wait for the next one. (Without the flush in `write_to`
    /// the reader here stops short of the batch on every run.)
    #[tokio::test]
    async fn a_batch_written_over_tls_into_a_full_socket_leaves_nothing_buffered() {
        let (mut writer, mut reader) = tls_pair().await;
        let mut batch = WriteBatch::default();
        for seq in 0..32u32 {
            let body = [&seq.to_be_bytes()[..], &[9u8; 8 * 1024 - 4][..]].concat();
            batch.push(&Frame::new(1, 1, body));
        }
        let total = batch.bytes;
        // The reader drains slowly, so the writer's socket stays full to the end.
        let reading = tokio::spawn(async move {
            let mut got = Vec::new();
            let mut chunk = [0u8; 2048];
            while got.len() < total {
                let n = reader.read(&mut chunk).await.unwrap();
                assert_ne!(n, 0, "the writer closed");
                got.extend_from_slice(&chunk[..n]);
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            got
        });
        batch.write_to(&mut writer).await.unwrap();
        // Nothing more is written; the whole batch must still arrive.
        let got = tokio::time::timeout(Duration::from_secs(5), reading)
            .await
            .expect("the tail of the batch stayed in the TLS writer")
            .unwrap();
        let mut buffered = BytesMut::from(&got[..]);
        for seq in 0..32u32 {
            let frame = Frame::decode(&mut buffered, 1 << 20).unwrap().unwrap();
            assert_eq!(frame.payload[..4], seq.to_be_bytes());
        }
        assert!(buffered.is_empty());
        drop(writer);
    }
}
