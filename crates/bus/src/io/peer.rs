//! One peer's manager: its bundle state machine driven by link events and timers.

use super::*;

pub(super) struct LinkTasks {
    pub(super) reader: JoinHandle<()>,
    pub(super) writer: JoinHandle<()>,
}

impl LinkTasks {
    fn abort(self) {
        drop(self);
    }
}

/// A link's tasks end with their manager, so a dropped bus leaves no socket behind on
/// any shard.
impl Drop for LinkTasks {
    fn drop(&mut self) {
        self.reader.abort();
        self.writer.abort();
    }
}

#[allow(clippy::too_many_arguments)] // the parts one peer's manager needs
pub(super) async fn manage_peer(
    config: Arc<BusConfig>,
    tls: Arc<Option<Tls>>,
    placement: Arc<Placement>,
    peer: u8,
    handle: Arc<PeerHandle>,
    mut events: mpsc::UnboundedReceiver<PeerEvent>,
    metrics: Arc<BusMetrics>,
    deliver: Deliver,
) {
    let start = Instant::now();
    let now = || start.elapsed().as_millis() as u64;
    let backoff = Backoff {
        first: config.backoff.as_millis().max(1) as u64,
        max: (config.backoff.as_millis().max(1) as u64) * 32,
    };
    let mut bundle = Bundle::new(
        config.links,
        config.replica < peer,
        config.handshake_grace.as_millis() as u64,
        backoff,
        now(),
    );
    let mut links: Vec<Option<LinkTasks>> = (0..config.links).map(|_| None).collect();
    let peer_state = &handle.inner;
    let mut actions = Vec::new();
    let mut teardowns_seen = 0;
    let mut teardowns_recorded = 0;
    // The generation that last came up, named in its down event.
    let mut up_generation = 0;
    loop {
        let wait = bundle
            .next_deadline()
            .map_or(Duration::from_millis(50), |d| {
                Duration::from_millis(d.saturating_sub(now()).min(50))
            });
        let mut install = None;
        tokio::select! {
            event = events.recv() => match event {
                None => return,
                Some(PeerEvent::LinkUp { link, generation, incarnation, stream }) => {
                    match bundle.on_link_up(now(), link, generation, incarnation, &mut actions) {
                        Ok(()) => install = Some((link, generation, stream)),
                        Err(_) => metrics.failed("stale_generation"),
                    }
                }
                Some(PeerEvent::LinkClosed { link, generation }) => bundle.on_link_closed(now(), link, generation, &mut actions),
                Some(PeerEvent::Kill(link)) => {
                    let generation = bundle.generation();
                    if let Some(tasks) = links.get_mut(usize::from(link)).and_then(Option::take) {
                        tasks.abort();
                    }
                    bundle.on_link_closed(now(), link, generation, &mut actions);
                }
            },
            () = tokio::time::sleep(wait) => bundle.on_tick(now(), &mut actions),
        }
        // Teardowns first, then the new link, then "up": a frame queued as soon as the
        // bundle is up finds every link's queue in place.
        let up = actions.contains(&BundleAction::Up);
        let down = actions.contains(&BundleAction::Down);
        let teardowns = bundle.teardowns();
        if teardowns > teardowns_seen {
            let incomplete = teardowns - teardowns_seen - u64::from(down);
            metrics
                .incomplete_teardowns
                .fetch_add(incomplete, Ordering::Relaxed);
            teardowns_seen = teardowns;
        }
        for action in actions.drain(..) {
            match action {
                BundleAction::CloseAll => {
                    peer_state.complete.store(false, Ordering::Release);
                    if let Ok(mut queues) = peer_state.queues.lock() {
                        queues.iter_mut().for_each(|q| *q = None);
                    }
                    peer_state.epoch.fetch_add(1, Ordering::Release);
                    for tasks in links.iter_mut().filter_map(Option::take) {
                        tasks.abort();
                    }
                }
                BundleAction::Down => {
                    peer_state.complete.store(false, Ordering::Release);
                    metrics.teardowns.fetch_add(1, Ordering::Relaxed);
                    metrics.bundles_complete.fetch_sub(1, Ordering::Relaxed);
                    let _ = peer_state.bundle_events.send(BundleEvent {
                        peer,
                        generation: up_generation,
                        up: false,
                    });
                }
                BundleAction::Dial { link, generation } => {
                    placement.spawn(
                        link,
                        peer,
                        dial(
                            Arc::clone(&config),
                            Arc::clone(&tls),
                            peer,
                            link,
                            generation,
                            handle.inner.events.clone(),
                            Arc::clone(&metrics),
                        ),
                    );
                }
                BundleAction::Up => {}
            }
        }
        if let Some((link, generation, stream)) = install {
            let (queue, frames) = mpsc::channel(config.queue_frames_max.max(1));
            if let Ok(mut queues) = peer_state.queues.lock() {
                if let Some(slot) = queues.get_mut(usize::from(link)) {
                    *slot = Some(queue);
                }
            }
            peer_state.epoch.fetch_add(1, Ordering::Release);
            let tasks = spawn_link(
                &config,
                &placement,
                peer,
                link,
                generation,
                stream,
                frames,
                handle.inner.events.clone(),
                Arc::clone(&metrics),
                deliver.clone(),
                config.replica > peer,
            );
            if let Some(old) = links
                .get_mut(usize::from(link))
                .and_then(|slot| slot.replace(tasks))
            {
                old.abort();
            }
        }
        if up || down || teardowns > teardowns_recorded {
            peer_state.record(bundle.generation(), teardowns, up || down);
            teardowns_recorded = teardowns;
        }
        if up {
            peer_state.complete.store(true, Ordering::Release);
            metrics.bundles_up.fetch_add(1, Ordering::Relaxed);
            metrics.bundles_complete.fetch_add(1, Ordering::Relaxed);
            up_generation = bundle.generation();
            let _ = peer_state.bundle_events.send(BundleEvent {
                peer,
                generation: up_generation,
                up: true,
            });
        }
    }
}
