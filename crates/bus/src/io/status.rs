//! What the bus says of each peer now (`braid cluster status`, `/replication`): whether
//! its bundle is whole, how many of its links are up, its generation, how long it has
//! been in its state, its teardowns, and the frames its links carried.
//!
//! Each peer's manager records a change of state under a lock it takes only then (a
//! bundle going up or down, a teardown), never per frame; a reader takes a snapshot.

use super::*;

/// One peer's bundle as this node sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerStatus {
    /// The peer's replica id.
    pub peer: u8,
    /// Whether every link to it is up (frames to it are sent).
    pub bundle_up: bool,
    /// Links to it with a queue in place now.
    pub links_up: u16,
    /// Links per peer (k).
    pub links: u16,
    /// The bundle's generation (it moves at every attempt to form the bundle).
    pub generation: u32,
    /// How long the bundle has been up, or down (since the bus started if it never
    /// came up).
    pub in_state_for: Duration,
    /// Bundles to it torn down, whole or before they were whole.
    pub teardowns: u64,
    /// Frames sent to it, over all its links.
    pub frames_sent: u64,
    /// Frames received from it, over all its links.
    pub frames_received: u64,
}

/// What a peer's manager last recorded.
#[derive(Debug)]
pub(super) struct PeerRecord {
    pub(super) generation: u32,
    pub(super) teardowns: u64,
    pub(super) changed_at: Instant,
}

impl PeerRecord {
    pub(super) fn new() -> Self {
        Self {
            generation: 0,
            teardowns: 0,
            changed_at: Instant::now(),
        }
    }
}

impl Peer {
    /// Records the bundle's generation and teardowns; `changed` when it went up or
    /// down.
    pub(super) fn record(&self, generation: u32, teardowns: u64, changed: bool) {
        if let Ok(mut record) = self.record.lock() {
            record.generation = generation;
            record.teardowns = teardowns;
            if changed {
                record.changed_at = Instant::now();
            }
        }
    }
}

/// A handle that reads every peer's status from any thread, apart from the [`Bus`]
/// (which its owner shard keeps).
#[derive(Debug, Clone)]
pub struct BusView {
    pub(super) peers: Vec<Option<Arc<PeerHandle>>>,
    pub(super) links: u16,
    pub(super) metrics: Arc<BusMetrics>,
}

impl BusView {
    /// Every peer's status, by replica id.
    pub fn peers(&self) -> Vec<PeerStatus> {
        self.peers
            .iter()
            .enumerate()
            .filter_map(|(id, peer)| Some((id as u8, &peer.as_ref()?.inner)))
            .map(|(id, peer)| self.status_of(id, peer))
            .collect()
    }

    /// The counters.
    pub fn metrics(&self) -> &BusMetrics {
        &self.metrics
    }

    fn status_of(&self, id: u8, peer: &Peer) -> PeerStatus {
        let links_up = peer.queues.lock().map_or(0, |queues| {
            queues.iter().filter(|q| q.is_some()).count() as u16
        });
        let (generation, teardowns, in_state_for) =
            peer.record.lock().map_or((0, 0, Duration::ZERO), |r| {
                (r.generation, r.teardowns, r.changed_at.elapsed())
            });
        let (mut frames_sent, mut frames_received) = (0, 0);
        for link in 0..self.links {
            let (sent, _, received, _) = self.metrics.link_counts(id, link, self.links);
            frames_sent += sent;
            frames_received += received;
        }
        PeerStatus {
            peer: id,
            bundle_up: peer.complete.load(Ordering::Acquire),
            links_up,
            links: self.links,
            generation,
            in_state_for,
            teardowns,
            frames_sent,
            frames_received,
        }
    }
}

impl Bus {
    /// A handle on every peer's status, for a reader on another thread.
    pub fn view(&self) -> BusView {
        BusView {
            peers: self.peers.clone(),
            links: self.layout.links(),
            metrics: Arc::clone(&self.metrics),
        }
    }

    /// Every peer's status now, by replica id.
    pub fn peer_statuses(&self) -> Vec<PeerStatus> {
        self.view().peers()
    }
}
