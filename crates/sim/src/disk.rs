//! A replica's simulated disk, in the manner of TigerBeetle's storage simulator.
//!
//! Writes stay pending for a latency drawn per write and complete out of order, within
//! the ordering the replica's contract asks for:
//! - a journal or header write has no ordering of its own;
//! - a durable-state or checkpoint write completes only after every write issued
//!   before it (the log view that depends on a truncation is written after it);
//! - a truncation or prune is a full barrier: it waits for every earlier write, and no
//!   later write starts before it (so a truncation never deletes a newer entry).
//!
//! A crash keeps, of the writes in flight, a random subset that respects those barriers;
//! a write that was in flight may also be torn. With `journal_fsync` off (a topic's
//! `fsync = never`), a journal write completes once it is in the page cache and reaches
//! the disk later; a crash (power loss) keeps a random subset of those unsynced writes.
//! The durable state and checkpoints are always synced before they complete.
//!
//! The durable state lives in two checksummed copies, written one after the other for
//! every change (the write completes when both are on the medium), so a torn write or
//! damage at rest leaves one copy with the newest state the replica acted on.
//! Checkpoints take two slots, the new one overwriting the older: damage to the newest
//! falls back to the previous checkpoint and the journal above it. The restart path
//! reads them through `braid_vsr`'s codecs, so damage is found on read.
//!
//! Faults injected at rest: a damaged journal slot (found at restart), a latent read
//! error (found when the slot is read, for a repair answer or at restart), a misdirected
//! write (it reports success but lands on another slot: both read back damaged), and a
//! damaged durable-state or checkpoint slot.

use std::collections::{BTreeMap, VecDeque};

use braid_vsr::{Checkpoint, DurableState, Header, Input, JournalSlot, Prepare};

use crate::Prng;

/// A write the replica asked for.
#[derive(Debug, Clone)]
pub(crate) enum PendingWrite {
    Journal(Prepare),
    Header(Header),
    State(DurableState),
    Truncate(u64),
    Prune(u64),
    Checkpoint(Checkpoint),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ordering {
    /// No ordering: journal and header writes.
    Free,
    /// After every earlier write: state and checkpoint writes.
    AfterEarlier,
    /// After every earlier write, and before any later one: truncate and prune.
    Full,
}

impl PendingWrite {
    fn ordering(&self) -> Ordering {
        match self {
            Self::Journal(_) | Self::Header(_) => Ordering::Free,
            Self::State(_) | Self::Checkpoint(_) => Ordering::AfterEarlier,
            Self::Truncate(_) | Self::Prune(_) => Ordering::Full,
        }
    }
}

#[derive(Debug, Clone)]
pub(crate) struct Slot {
    pub(crate) prepare: Prepare,
    /// Damaged on the medium (torn, corrupt, or clobbered by a misdirected write).
    pub(crate) damaged: bool,
    /// Only the header was written: the body is known to be missing.
    pub(crate) header_only: bool,
    /// Reads of it fail.
    pub(crate) latent: bool,
}

impl Slot {
    fn new(prepare: Prepare, header_only: bool) -> Self {
        Self {
            prepare,
            damaged: false,
            header_only,
            latent: false,
        }
    }

    /// Whether a read returns its whole prepare.
    pub(crate) fn readable(&self) -> bool {
        !self.damaged && !self.latent && !self.header_only
    }
}

#[derive(Debug, Clone)]
struct Queued {
    write: PendingWrite,
    ready_at: u64,
}

/// What a crash did to the writes in flight.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct CrashReport {
    pub(crate) torn: u64,
    pub(crate) kept: u64,
    pub(crate) lost: u64,
    pub(crate) unsynced_lost: u64,
}

/// What a restart reads back.
#[derive(Debug, Clone)]
pub(crate) struct ReadBack {
    pub(crate) state: Result<DurableState, braid_vsr::DecodeError>,
    pub(crate) checkpoint: Option<Checkpoint>,
    pub(crate) journal: Vec<(u64, JournalSlot)>,
}

/// One replica's disk.
#[derive(Debug, Clone)]
pub(crate) struct Disk {
    state_slots: [Option<Vec<u8>>; 2],
    state_sequence: u64,
    checkpoint_slots: [Option<Vec<u8>>; 2],
    /// What the medium holds.
    journal: BTreeMap<u64, Slot>,
    /// Journal writes completed into the page cache but not yet on the medium
    /// (`journal_fsync` off), oldest first; reads see them.
    unsynced: Vec<PendingWrite>,
    queue: VecDeque<Queued>,
    journal_fsync: bool,
}

impl Disk {
    /// A formatted disk: both state slots hold the initial state, as a shell writes them
    /// when it creates a data directory (so a first write torn still leaves one).
    pub(crate) fn new(journal_fsync: bool) -> Self {
        let initial = DurableState::default().encode(0).to_vec();
        Self {
            state_slots: [Some(initial.clone()), Some(initial)],
            state_sequence: 0,
            checkpoint_slots: [None, None],
            journal: BTreeMap::new(),
            unsynced: Vec::new(),
            queue: VecDeque::new(),
            journal_fsync,
        }
    }

    pub(crate) fn journal_fsync(&self) -> bool {
        self.journal_fsync
    }

    pub(crate) fn has_pending(&self) -> bool {
        !self.queue.is_empty()
    }

    /// Queues a write that completes no earlier than `ready_at`.
    pub(crate) fn issue(&mut self, write: PendingWrite, ready_at: u64) {
        self.queue.push_back(Queued { write, ready_at });
    }

    /// The newest intact durable state (the default before the first write).
    pub(crate) fn durable_state(&self) -> DurableState {
        self.read_state().unwrap_or_default()
    }

    fn read_state(&self) -> Result<DurableState, braid_vsr::DecodeError> {
        if self.state_slots.iter().all(Option::is_none) {
            return Ok(DurableState::default());
        }
        let slots: Vec<&[u8]> = self
            .state_slots
            .iter()
            .flatten()
            .map(Vec::as_slice)
            .collect();
        DurableState::newest(&slots).map(|(_, state)| state)
    }

    /// The indexes of queued writes that may complete now, in queue order.
    fn eligible(&self, now: u64) -> Vec<usize> {
        let mut out = Vec::new();
        for (index, queued) in self.queue.iter().enumerate() {
            let ready = queued.ready_at <= now;
            match queued.write.ordering() {
                Ordering::Free if ready => out.push(index),
                Ordering::Free => {}
                // Waits for every earlier write; later free writes may pass it.
                Ordering::AfterEarlier => {
                    if index == 0 && ready {
                        out.push(index);
                    }
                }
                // Waits for every earlier write, and nothing after it starts first.
                Ordering::Full => {
                    if index == 0 && ready {
                        out.push(index);
                    }
                    break;
                }
            }
        }
        out
    }

    /// Completes due writes (in a random order among those allowed) and returns, in
    /// completion order, the inputs the replica awaits. A write the disk refuses (with
    /// chance `fail_per_10k`) ends the batch with `Err`: it and every later write are
    /// still queued, and the replica must stop.
    pub(crate) fn complete_due(
        &mut self,
        now: u64,
        prng: &mut Prng,
        fail_per_10k: u64,
    ) -> Result<Vec<Input>, Vec<Input>> {
        let mut inputs = Vec::new();
        loop {
            let eligible = self.eligible(now);
            if eligible.is_empty() {
                return Ok(inputs);
            }
            let pick = eligible[prng.below(eligible.len() as u64) as usize];
            if prng.below(10_000) < fail_per_10k {
                return Err(inputs);
            }
            let Some(queued) = self.queue.remove(pick) else {
                return Ok(inputs);
            };
            if let Some(input) = self.perform(queued.write) {
                inputs.push(input);
            }
        }
    }

    /// Performs one write; returns the completion the replica awaits.
    fn perform(&mut self, write: PendingWrite) -> Option<Input> {
        let unsynced = !self.journal_fsync && write.ordering() != Ordering::AfterEarlier;
        if unsynced {
            // The page cache has it; the medium gets it at a writeback or never.
            self.unsynced.push(write.clone());
            return Self::completion(&write);
        }
        self.apply(write)
    }

    fn completion(write: &PendingWrite) -> Option<Input> {
        match write {
            PendingWrite::Journal(prepare) => Some(Input::JournalWritten {
                op: prepare.header.op,
                checksum: prepare.header.checksum,
            }),
            PendingWrite::State(state) => Some(Input::StateWritten(*state)),
            _ => None,
        }
    }

    /// Puts a write on the medium.
    fn apply(&mut self, write: PendingWrite) -> Option<Input> {
        let completion = Self::completion(&write);
        match write {
            PendingWrite::Journal(prepare) => {
                self.journal
                    .insert(prepare.header.op, Slot::new(prepare, false));
            }
            PendingWrite::Header(header) => {
                // A slot holding that very prepare keeps it: a header alone stands for
                // a body never written (a view change may drop it), as in the node. So
                // does a damaged slot, whose lost body may have been acknowledged.
                let held = self.journal.get(&header.op).is_some_and(|slot| {
                    slot.damaged
                        || slot.latent
                        || (!slot.header_only && slot.prepare.header.checksum == header.checksum)
                });
                if !held {
                    let prepare = Prepare {
                        header,
                        body: bytes::Bytes::new(),
                    };
                    self.journal.insert(header.op, Slot::new(prepare, true));
                }
            }
            PendingWrite::State(state) => {
                self.state_sequence += 1;
                let bytes = state.encode(self.state_sequence).to_vec();
                self.state_slots = [Some(bytes.clone()), Some(bytes)];
            }
            PendingWrite::Truncate(op) => self.journal.retain(|o, _| *o <= op),
            PendingWrite::Prune(op) => self.journal.retain(|o, _| *o > op),
            PendingWrite::Checkpoint(checkpoint) => {
                let slot = self.older_checkpoint_slot();
                self.checkpoint_slots[slot] = Some(checkpoint.encode());
            }
        }
        completion
    }

    /// The slot a new checkpoint overwrites: an empty or damaged one, else the older.
    fn older_checkpoint_slot(&self) -> usize {
        let op = |slot: &Option<Vec<u8>>| {
            slot.as_deref()
                .and_then(|bytes| Checkpoint::decode(bytes).ok())
                .map(|c| c.header.op)
        };
        match (op(&self.checkpoint_slots[0]), op(&self.checkpoint_slots[1])) {
            (None, _) => 0,
            (_, None) => 1,
            (Some(a), Some(b)) => usize::from(b < a),
        }
    }

    /// The OS writes the page cache back: every unsynced write reaches the medium.
    pub(crate) fn writeback(&mut self) {
        for write in std::mem::take(&mut self.unsynced) {
            let _ = self.apply(write);
        }
    }

    /// A crash (or power loss): writes in flight are kept, torn or lost at random,
    /// within the barriers; unsynced page-cache writes are kept or lost at random.
    /// With `power_loss` `None` (a process crash) the page cache survives and reaches
    /// the medium; with `Some(p)`, each unsynced write survives with chance p%.
    /// A journal write in flight may be torn only where `may_tear(op)` allows (the
    /// simulation's fault atlas); elsewhere it is kept or lost whole.
    pub(crate) fn crash(
        &mut self,
        prng: &mut Prng,
        torn_percent: u64,
        power_loss: Option<u64>,
        may_tear: &dyn Fn(u64) -> bool,
    ) -> CrashReport {
        let mut report = CrashReport::default();
        let Some(keep_percent) = power_loss else {
            self.writeback();
            return self.crash_in_flight(prng, torn_percent, may_tear, report);
        };
        for write in std::mem::take(&mut self.unsynced) {
            if prng.chance(keep_percent) {
                let _ = self.apply(write);
            } else {
                report.unsynced_lost += 1;
            }
        }
        self.crash_in_flight(prng, torn_percent, may_tear, report)
    }

    fn crash_in_flight(
        &mut self,
        prng: &mut Prng,
        torn_percent: u64,
        may_tear: &dyn Fn(u64) -> bool,
        mut report: CrashReport,
    ) -> CrashReport {
        let mut earlier_lost = false;
        let mut blocked = false;
        for queued in std::mem::take(&mut self.queue) {
            let ordering = queued.write.ordering();
            let may_land = !blocked && (ordering == Ordering::Free || !earlier_lost);
            if may_land && prng.chance(50) {
                let _ = self.apply(queued.write);
                report.kept += 1;
                continue;
            }
            let tearable = match &queued.write {
                PendingWrite::Journal(p) => may_tear(p.header.op),
                PendingWrite::Header(h) => may_tear(h.op),
                _ => true,
            };
            if may_land && tearable && prng.chance(torn_percent) {
                self.tear(queued.write, prng);
                report.torn += 1;
            } else {
                report.lost += 1;
            }
            earlier_lost = true;
            blocked |= ordering == Ordering::Full;
        }
        report
    }

    /// A write cut short by the crash: its target holds garbage.
    fn tear(&mut self, write: PendingWrite, prng: &mut Prng) {
        match write {
            PendingWrite::Journal(prepare) => {
                let mut slot = Slot::new(prepare, false);
                slot.damaged = true;
                self.journal.insert(slot.prepare.header.op, slot);
            }
            PendingWrite::Header(header) => {
                let mut slot = Slot::new(
                    Prepare {
                        header,
                        body: bytes::Bytes::new(),
                    },
                    true,
                );
                slot.damaged = true;
                self.journal.insert(header.op, slot);
            }
            PendingWrite::State(state) => {
                // Torn in the first copy (the second still holds the old state) or in
                // the second (the first holds the new one).
                let fresh = state.encode(self.state_sequence + 1).to_vec();
                let mut torn = fresh.clone();
                let half = torn.len() / 2;
                torn[half..].fill(0);
                if prng.chance(50) {
                    self.state_slots[0] = Some(torn);
                } else {
                    self.state_slots = [Some(fresh), Some(torn)];
                }
            }
            PendingWrite::Checkpoint(checkpoint) => {
                let slot = self.older_checkpoint_slot();
                let mut bytes = checkpoint.encode();
                bytes.truncate(bytes.len() / 2);
                self.checkpoint_slots[slot] = Some(bytes);
            }
            // Metadata operations are atomic: they happen or they do not.
            PendingWrite::Truncate(_) | PendingWrite::Prune(_) => {}
        }
    }

    /// What a restart reads.
    pub(crate) fn read_back(&self) -> ReadBack {
        let checkpoints: Vec<Checkpoint> = self
            .checkpoint_slots
            .iter()
            .flatten()
            .filter_map(|bytes| Checkpoint::decode(bytes).ok())
            .collect();
        let checkpoint = checkpoints.into_iter().max_by_key(|c| c.header.op);
        let journal = self
            .journal
            .iter()
            .map(|(op, slot)| {
                let read = if slot.damaged || slot.latent || slot.prepare.header.op != *op {
                    JournalSlot::Damaged
                } else if slot.header_only {
                    JournalSlot::Header(slot.prepare.header)
                } else {
                    JournalSlot::Prepare(slot.prepare.clone())
                };
                (*op, read)
            })
            .collect();
        ReadBack {
            state: self.read_state(),
            checkpoint,
            journal,
        }
    }

    /// What a shell does at start after reading the state: rewrites both copies from the
    /// intact one, so damage found at rest is not left for the next torn write to pair
    /// with.
    pub(crate) fn rewrite_state(&mut self, state: DurableState) {
        self.state_sequence += 1;
        let bytes = state.encode(self.state_sequence).to_vec();
        self.state_slots = [Some(bytes.clone()), Some(bytes)];
    }

    /// Reads one prepare for a repair answer: the page cache first, then the medium.
    pub(crate) fn read_prepare(&self, op: u64) -> Option<Prepare> {
        let cached = self.unsynced.iter().rev().find_map(|w| match w {
            PendingWrite::Journal(p) if p.header.op == op => Some(Some(p.clone())),
            PendingWrite::Header(h) if h.op == op => Some(None),
            PendingWrite::Truncate(t) if op > *t => Some(None),
            PendingWrite::Prune(p) if op <= *p => Some(None),
            _ => None,
        });
        if let Some(cached) = cached {
            return cached;
        }
        let slot = self.journal.get(&op)?;
        (slot.readable() && slot.prepare.header.op == op).then(|| slot.prepare.clone())
    }

    /// Whether any journal slot on the medium is damaged or unreadable.
    pub(crate) fn has_damage(&self) -> bool {
        self.journal
            .iter()
            .any(|(op, s)| s.damaged || s.latent || s.prepare.header.op != *op)
    }

    /// Ops of intact, readable journal slots on the medium.
    pub(crate) fn intact_ops(&self) -> Vec<u64> {
        self.journal
            .iter()
            .filter(|(op, s)| s.readable() && s.prepare.header.op == **op)
            .map(|(op, _)| *op)
            .collect()
    }

    /// The checksum an intact slot holds.
    pub(crate) fn intact_checksum(&self, op: u64) -> Option<braid_vsr::Checksum> {
        self.journal
            .get(&op)
            .filter(|s| s.readable() && s.prepare.header.op == op)
            .map(|s| s.prepare.header.checksum)
    }

    /// Damages a journal slot on the medium (found at restart).
    pub(crate) fn corrupt(&mut self, op: u64) -> bool {
        match self.journal.get_mut(&op) {
            Some(slot) if !slot.damaged => {
                slot.damaged = true;
                true
            }
            _ => false,
        }
    }

    /// Makes reads of a slot fail from now on.
    pub(crate) fn make_latent(&mut self, op: u64) -> bool {
        match self.journal.get_mut(&op) {
            Some(slot) if !slot.latent => {
                slot.latent = true;
                true
            }
            _ => false,
        }
    }

    /// A write of `op` that reported success but landed on `other`'s slot: both read
    /// back damaged (the target holds a prepare of the wrong op, and the journal's
    /// redundant header shows that `op` was written but not what it holds).
    pub(crate) fn misdirect(&mut self, op: u64, other: u64) -> bool {
        let (Some(a), Some(b)) = (
            self.journal.get(&op).cloned(),
            self.journal.get(&other).cloned(),
        ) else {
            return false;
        };
        let mut clobbered = a;
        clobbered.damaged = true;
        self.journal.insert(other, clobbered.clone());
        let mut missing = b;
        missing.damaged = true;
        self.journal.insert(op, missing);
        true
    }

    /// Damages one durable-state copy while the other is intact: returns whether it did.
    pub(crate) fn damage_state_slot(&mut self, prng: &mut Prng) -> bool {
        damage_one_of(&mut self.state_slots, prng, |b| {
            DurableState::decode(b).is_ok()
        })
    }

    /// Damages one checkpoint slot while the other holds an intact checkpoint.
    pub(crate) fn damage_checkpoint_slot(&mut self, prng: &mut Prng) -> bool {
        damage_one_of(&mut self.checkpoint_slots, prng, |b| {
            Checkpoint::decode(b).is_ok()
        })
    }
}

/// Flips one bit in one of two slots, only when both are intact (so one survives).
fn damage_one_of(
    slots: &mut [Option<Vec<u8>>; 2],
    prng: &mut Prng,
    intact: impl Fn(&[u8]) -> bool,
) -> bool {
    if !slots
        .iter()
        .all(|slot| slot.as_deref().is_some_and(&intact))
    {
        return false;
    }
    let victim = prng.below(2) as usize;
    if let Some(bytes) = slots[victim].as_mut() {
        let at = prng.below(bytes.len() as u64) as usize;
        bytes[at] ^= 1 << prng.below(8);
    }
    true
}
