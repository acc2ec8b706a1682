//! The bus's counters, and the names of handshake refusals in them.

use super::*;

/// Counters of a node's bus.
#[derive(Debug)]
pub struct BusMetrics {
    /// Bundles that came up (a counter).
    pub bundles_up: AtomicU64,
    /// Bundles complete now (a gauge).
    pub bundles_complete: AtomicU64,
    /// Complete bundles torn down.
    pub teardowns: AtomicU64,
    /// Incomplete bundles torn down (a link closed, or the grace ran out, before all k
    /// were up).
    pub incomplete_teardowns: AtomicU64,
    /// Links closed because the peer sent nothing, not even a ping, for a heartbeat
    /// timeout (a half-open link).
    pub links_closed_silent: AtomicU64,
    /// Links closed for a frame that failed its checksum.
    pub frame_checksum_errors: AtomicU64,
    /// Links closed for a frame whose length was above `frame_bytes_max` or below its
    /// header.
    pub frame_length_errors: AtomicU64,
    /// Inbound sockets refused at the preamble.
    pub preamble_refusals: AtomicU64,
    /// Handshakes that failed, by reason.
    pub handshake_failures: Mutex<BTreeMap<String, u64>>,
    /// Frames dropped because a link queue was full.
    pub frames_dropped: AtomicU64,
    /// Frames `send` accepted that a teardown then lost (queued, or written by a link
    /// that closed before they were flushed). Consensus retransmits them.
    pub frames_lost_at_teardown: AtomicU64,
    /// Frames refused at `send` for exceeding `frame_bytes_max`.
    pub frames_refused_too_large: AtomicU64,
    /// Times a link stopped reading because the delivery budget was spent.
    pub delivery_waits: AtomicU64,
    /// Frames not sent because the bundle was not complete.
    pub frames_refused_bundle_down: AtomicU64,
    /// Frames sent.
    pub frames_sent: AtomicU64,
    /// Bytes sent.
    pub bytes_sent: AtomicU64,
    /// Frames received.
    pub frames_received: AtomicU64,
    /// Bytes received.
    pub bytes_received: AtomicU64,
    /// Per link (index `peer * k + link`): frames sent, bytes sent, frames received,
    /// bytes received.
    pub per_link: Vec<[AtomicU64; 4]>,
    /// Per sending shard: frames dropped at a full queue, refused while the bundle was
    /// down, and lost at a teardown when `send` saw the link close.
    pub per_shard: Vec<[AtomicU64; 3]>,
}

impl BusMetrics {
    pub(super) fn new(replicas: usize, links: u16, shards: u16) -> Self {
        let zero = || AtomicU64::new(0);
        Self {
            bundles_up: zero(),
            bundles_complete: zero(),
            teardowns: zero(),
            incomplete_teardowns: zero(),
            links_closed_silent: zero(),
            frame_checksum_errors: zero(),
            frame_length_errors: zero(),
            preamble_refusals: zero(),
            handshake_failures: Mutex::new(BTreeMap::new()),
            frames_dropped: zero(),
            frames_lost_at_teardown: zero(),
            frames_refused_too_large: zero(),
            delivery_waits: zero(),
            frames_refused_bundle_down: zero(),
            frames_sent: zero(),
            bytes_sent: zero(),
            frames_received: zero(),
            bytes_received: zero(),
            per_link: (0..replicas * usize::from(links))
                .map(|_| [zero(), zero(), zero(), zero()])
                .collect(),
            per_shard: (0..shards).map(|_| [zero(), zero(), zero()]).collect(),
        }
    }

    pub(super) fn link(&self, peer: u8, link: u16, links: u16) -> Option<&[AtomicU64; 4]> {
        self.per_link
            .get(usize::from(peer) * usize::from(links) + usize::from(link))
    }

    /// (frames sent, bytes sent, frames received, bytes received) of one link.
    pub fn link_counts(&self, peer: u8, link: u16, links: u16) -> (u64, u64, u64, u64) {
        self.link(peer, link, links).map_or((0, 0, 0, 0), |c| {
            let get = |i: usize| c[i].load(Ordering::Relaxed);
            (get(0), get(1), get(2), get(3))
        })
    }

    /// (frames dropped at a full queue, refused while down, lost at a closed link) that
    /// `shard` tried to send.
    pub fn shard_send_counts(&self, shard: u16) -> (u64, u64, u64) {
        self.per_shard
            .get(usize::from(shard))
            .map_or((0, 0, 0), |c| {
                let get = |i: usize| c[i].load(Ordering::Relaxed);
                (get(0), get(1), get(2))
            })
    }

    pub(super) fn shard_failed(&self, shard: u16, which: usize) {
        if let Some(c) = self.per_shard.get(usize::from(shard)) {
            c[which].fetch_add(1, Ordering::Relaxed);
        }
    }

    pub(super) fn failed(&self, reason: &str) {
        if let Ok(mut map) = self.handshake_failures.lock() {
            *map.entry(reason.to_owned()).or_insert(0) += 1;
        }
    }

    /// Handshake failures counted under `reason`.
    pub fn handshake_failures_for(&self, reason: &str) -> u64 {
        self.handshake_failures
            .lock()
            .map_or(0, |m| m.get(reason).copied().unwrap_or(0))
    }
}

pub(super) fn reason(refusal: &Refusal) -> &'static str {
    match refusal {
        Refusal::BadMagic | Refusal::Version(_) => "preamble",
        Refusal::UnknownReplica(_) => "unknown_replica",
        Refusal::NoSuchLink { .. } => "no_such_link",
        Refusal::Malformed => "malformed",
        Refusal::Cluster { .. } => "cluster",
        Refusal::PreambleMismatch => "preamble_mismatch",
        Refusal::LinkCount { .. } => "link_count",
        Refusal::BadMac => "bad_mac",
        Refusal::StaleGeneration { .. } => "stale_generation",
        Refusal::Timeout => "timeout",
        Refusal::WrongDialer { .. } => "wrong_dialer",
    }
}
