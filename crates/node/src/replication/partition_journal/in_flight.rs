//! A partition journal's work in flight, boxed apart so that a quiescent partition
//! holds none of it.

use super::*;

/// A partition journal's work in flight: prepares waiting, writes not yet synced, syncs
/// running and their markers. Boxed and dropped once all is done, so that a quiescent
/// partition holds none of it.
#[derive(Debug, Default)]
pub(super) struct InFlight {
    /// Prepares above `tip + 1`, waiting for the ops below them.
    pub(super) pending: BTreeMap<u64, Prepare>,
    /// Ops written since the last sync: reported written after it.
    pub(super) unsynced: Vec<(u64, Checksum)>,
    /// Syncs running elsewhere, by id.
    pub(super) running: BTreeMap<u64, RunningSync>,
    /// Ops a finished sync made durable, by the id of that sync, reported once
    /// `vsr.journal` is synced through the marker that says so (its end here): a
    /// record reported written always has a durable marker after it, so the open can
    /// tell a torn tail (never reported) from damage to what was.
    pub(super) awaiting_marker: Vec<AwaitingMarker>,
    /// Cuts made while syncs ran: (the first sync id started after it, the op cut
    /// above). A sync started before a cut reports none of the ops above it: their
    /// entries are gone, or were written again after that sync began.
    pub(super) cuts: Vec<(u64, u64)>,
    /// Committed ops applied from prepares held in memory, not yet in the log (above
    /// the tip, or while the log is copied), with their checksums: each raises
    /// `applied_end` when its batch goes in.
    pub(super) applied_ahead: BTreeMap<u64, Checksum>,
    /// The checkpoint (op and checksum) the running copy goes to, once known: peers
    /// that hold that op serve the copy up to it ([`PartitionJournal::committed_through`]).
    pub(super) copy_anchor: Option<(u64, Checksum)>,
}

/// What a journal with nothing in flight reads.
static NOTHING_IN_FLIGHT: InFlight = InFlight {
    pending: BTreeMap::new(),
    unsynced: Vec::new(),
    running: BTreeMap::new(),
    awaiting_marker: Vec::new(),
    cuts: Vec::new(),
    applied_ahead: BTreeMap::new(),
    copy_anchor: None,
};

impl InFlight {
    pub(super) fn is_empty(&self) -> bool {
        self.pending.is_empty()
            && self.unsynced.is_empty()
            && self.running.is_empty()
            && self.awaiting_marker.is_empty()
            && self.cuts.is_empty()
            && self.applied_ahead.is_empty()
            && self.copy_anchor.is_none()
    }
}

impl PartitionJournal {
    /// What is in flight (nothing, read as empty, while the partition is quiescent).
    pub(super) fn flight(&self) -> &InFlight {
        self.in_flight.as_deref().unwrap_or(&NOTHING_IN_FLIGHT)
    }

    /// What is in flight, made if there was none.
    pub(super) fn flight_mut(&mut self) -> &mut InFlight {
        self.in_flight.get_or_insert_with(Box::default)
    }

    /// Drops what is in flight once nothing is.
    pub(super) fn settle(&mut self) {
        if self.in_flight.as_deref().is_some_and(InFlight::is_empty) {
            self.in_flight = None;
        }
    }

    /// The ops written since the last sync, taken.
    pub(super) fn take_unsynced(&mut self) -> Vec<(u64, Checksum)> {
        self.in_flight
            .as_deref_mut()
            .map(|flight| std::mem::take(&mut flight.unsynced))
            .unwrap_or_default()
    }

    /// Forgets the prepares waiting and the ops applied ahead of the log at the ops
    /// `keep` refuses (a truncation, a prune, a copy's checkpoint).
    pub(super) fn forget_waiting(&mut self, keep: impl Fn(u64) -> bool) {
        if let Some(flight) = self.in_flight.as_deref_mut() {
            flight.pending.retain(|op, _| keep(*op));
            flight.applied_ahead.retain(|op, _| keep(*op));
        }
        self.settle();
    }
}
