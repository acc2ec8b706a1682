//! The durable states (view, log view, commit) of every group a shard hosts, in one
//! pair of files, written whole and synced once per batch: a thousand groups whose
//! view changes at once cost one `fdatasync`, not a thousand.
//!
//! Each write replaces the older of two copies (`shard-N.0`, `shard-N.1`) with the
//! whole table: magic, batch number, the groups with their boot [`Stamp`] and
//! `DurableState` slot, and a CRC32C over all of it. A crash can tear only the copy
//! being written; the other holds the previous batch, whose states are all a replica
//! may resume from (the torn batch was never reported written, so nothing was sent on
//! its behalf). On open the intact copy with the higher batch number wins; if no copy
//! is intact the shard refuses to start rather than let replicas forget views they
//! voted in. A group's stamp is the boot its state was last written in (see
//! [`super::boot`]); a table from before stamps (`BRDVST01`) reads as unstamped.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use braid_vsr::DurableState;

use super::boot::{BootId, Stamp};
use super::copies::{CopyError, Newest, TwoCopies};

const MAGIC: &[u8; 8] = b"BRDVST02";
/// The table's first format: entries without a stamp.
const MAGIC_UNSTAMPED: &[u8; 8] = b"BRDVST01";
/// Bytes of one group's entry: its id, its stamp and its slot.
const ENTRY_BYTES: usize = 8 + Stamp::BYTES + DurableState::ENCODED_BYTES;
/// Bytes around the entries: magic, batch number, count, and the CRC32C at the end.
const FRAME_BYTES: usize = MAGIC.len() + 8 + 4 + 4;

/// Why the states could not be read or written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub(crate) enum StatesError {
    /// A disk operation failed.
    #[error("replica states {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// Neither copy is intact.
    #[error(
        "replica states in {dir}: no intact copy ({reason}); the replicas' views cannot \
         be recovered, so the node does not start"
    )]
    NoIntactCopy {
        /// The directory.
        dir: PathBuf,
        /// What was wrong with each copy.
        reason: String,
    },
    /// A write failed earlier: what reached the disk is unknown until a restart.
    #[error("replica states are poisoned by an earlier failed write; restart the node")]
    Poisoned,
}

/// One group's entry in the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Entry {
    state: DurableState,
    stamp: Stamp,
}

/// One shard's group states.
#[derive(Debug)]
pub(crate) struct GroupStates {
    copies: TwoCopies,
    /// The boot this process runs in: the stamp of every state it stages.
    boot: BootId,
    /// The states as of the last write, and those staged since.
    states: BTreeMap<u64, Entry>,
    /// Groups whose state changed since the last write, in the order staged.
    staged: Vec<u64>,
    /// The batch number of the newest copy on disk.
    batch: u64,
    poisoned: bool,
}

fn encode(batch: u64, states: &BTreeMap<u64, Entry>) -> Vec<u8> {
    let mut out = Vec::with_capacity(FRAME_BYTES + states.len() * ENTRY_BYTES);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&batch.to_be_bytes());
    out.extend_from_slice(&(states.len() as u32).to_be_bytes());
    for (group, entry) in states {
        out.extend_from_slice(&group.to_be_bytes());
        out.extend_from_slice(&entry.stamp.encode());
        out.extend_from_slice(&entry.state.encode(batch));
    }
    let crc = crc32c::crc32c(&out);
    out.extend_from_slice(&crc.to_be_bytes());
    out
}

/// A copy's batch number and table, or why it is not intact.
fn decode(bytes: &[u8]) -> Result<(u64, BTreeMap<u64, Entry>), String> {
    let magic = bytes.get(..MAGIC.len());
    let stamped = magic == Some(MAGIC.as_slice());
    if bytes.len() < FRAME_BYTES || !(stamped || magic == Some(MAGIC_UNSTAMPED.as_slice())) {
        return Err(format!("{} bytes without the magic", bytes.len()));
    }
    let (body, crc) = bytes.split_at(bytes.len() - 4);
    if crc32c::crc32c(body) != u32::from_be_bytes([crc[0], crc[1], crc[2], crc[3]]) {
        return Err("checksum mismatch".into());
    }
    let word = |at: usize| {
        let mut b = [0u8; 8];
        b.copy_from_slice(&body[at..at + 8]);
        u64::from_be_bytes(b)
    };
    let batch = word(8);
    let count = u32::from_be_bytes([body[16], body[17], body[18], body[19]]) as usize;
    let entries = &body[20..];
    let stamp_bytes = if stamped { Stamp::BYTES } else { 0 };
    let entry_bytes = 8 + stamp_bytes + DurableState::ENCODED_BYTES;
    if entries.len() != count * entry_bytes {
        return Err(format!("{count} groups in {} bytes", entries.len()));
    }
    let mut states = BTreeMap::new();
    for entry in entries.chunks_exact(entry_bytes) {
        let (id, rest) = entry.split_at(8);
        let (stamp, slot) = rest.split_at(stamp_bytes);
        let stamp = match <[u8; Stamp::BYTES]>::try_from(stamp) {
            Ok(bytes) => Stamp::decode(bytes),
            Err(_) => Stamp::Unknown,
        };
        let (_, state) = DurableState::decode(slot).map_err(|e| e.to_string())?;
        let mut group = [0u8; 8];
        group.copy_from_slice(id);
        states.insert(u64::from_be_bytes(group), Entry { state, stamp });
    }
    Ok((batch, states))
}

fn io(path: &Path) -> impl Fn(std::io::Error) -> StatesError + '_ {
    move |source| StatesError::Io {
        path: path.to_owned(),
        source,
    }
}

impl GroupStates {
    /// Opens shard `shard`'s states in `dir` (made durable if new), choosing the intact
    /// copy with the higher batch number; what is staged from now on is stamped `boot`.
    ///
    /// # Errors
    /// [`StatesError::NoIntactCopy`] when copies exist and none is intact, or an IO
    /// error.
    pub(crate) fn open(dir: &Path, shard: usize, boot: BootId) -> Result<Self, StatesError> {
        braid_storage::create_dir_durable(dir).map_err(io(dir))?;
        let copies = TwoCopies::new(dir, &format!("shard-{shard}"));
        let from_copy = |(path, source): CopyError| StatesError::Io { path, source };
        let mut store = Self {
            copies: copies.clone(),
            boot,
            states: BTreeMap::new(),
            staged: Vec::new(),
            batch: 0,
            poisoned: false,
        };
        match copies.newest(decode).map_err(from_copy)? {
            Newest::Absent => {
                // A new shard: an empty table put in place whole, so that from here on
                // a copy that does not decode is damage, never "not written yet".
                copies
                    .install_first(&encode(0, &store.states))
                    .map_err(from_copy)?;
            }
            Newest::Found(batch, states) => {
                store.batch = batch;
                store.states = states;
            }
            Newest::Damaged(reason) => {
                return Err(StatesError::NoIntactCopy {
                    dir: dir.to_owned(),
                    reason,
                })
            }
        }
        Ok(store)
    }

    /// The durable state of `group`, if it has one.
    pub(crate) fn get(&self, group: u64) -> Option<DurableState> {
        self.states.get(&group).map(|e| e.state)
    }

    /// The stamp of `group`'s state as it stands (staged or written).
    pub(crate) fn stamp(&self, group: u64) -> Option<Stamp> {
        self.states.get(&group).map(|e| e.stamp)
    }

    /// Whether `group`'s journal kept every write it reported, by its stamp: written in
    /// this boot, or at a clean stop.
    pub(crate) fn vouches_for(&self, group: u64) -> bool {
        self.stamp(group).is_some_and(|s| s.vouches_in(self.boot))
    }

    /// Every group with a state.
    #[cfg(test)]
    pub(crate) fn groups(&self) -> impl Iterator<Item = (u64, DurableState)> + '_ {
        self.states.iter().map(|(g, e)| (*g, e.state))
    }

    /// Stages `state` for `group` (a replica's `WriteState`), stamped with this boot;
    /// written by the next [`GroupStates::write_staged`].
    pub(crate) fn stage(&mut self, group: u64, state: DurableState) {
        let stamp = Stamp::Boot(self.boot);
        self.states.insert(group, Entry { state, stamp });
        if !self.staged.contains(&group) {
            self.staged.push(group);
        }
    }

    /// Whether something staged waits for [`GroupStates::write_staged`].
    #[cfg(test)]
    pub(crate) fn has_staged(&self) -> bool {
        !self.staged.is_empty()
    }

    /// Writes the table once more at a clean stop, every group stamped
    /// [`Stamp::Synced`] (its journal was synced and closed) except those in `unsynced`
    /// (their close failed), stamped [`Stamp::Unknown`]. The next start, in any boot,
    /// trusts the synced ones.
    ///
    /// # Errors
    /// As [`GroupStates::write_staged`].
    pub(crate) fn write_stopped(&mut self, unsynced: &[u64]) -> Result<(), StatesError> {
        if self.poisoned {
            return Err(StatesError::Poisoned);
        }
        for (group, entry) in &mut self.states {
            entry.stamp = if unsynced.contains(group) {
                Stamp::Unknown
            } else {
                Stamp::Synced
            };
        }
        self.write_table()?;
        self.staged.clear();
        Ok(())
    }

    /// Writes the whole table over the older copy as the next batch, and syncs it.
    fn write_table(&mut self) -> Result<(), StatesError> {
        let batch = self.batch + 1;
        if let Err((path, source)) = self.copies.write(batch, &encode(batch, &self.states)) {
            self.poisoned = true;
            return Err(StatesError::Io { path, source });
        }
        self.batch = batch;
        Ok(())
    }

    /// Forgets a deleted group (written with the next batch). Partition groups use it
    /// when their topic is deleted; the metadata group is never removed.
    pub(crate) fn remove(&mut self, group: u64) {
        if self.states.remove(&group).is_some() && !self.staged.contains(&group) {
            self.staged.push(group);
        }
    }

    /// Writes the whole table over the older copy and syncs it: one `fdatasync` for
    /// every state staged since the last write. Returns the staged groups with the
    /// states now durable (each replica gets its `StateWritten`); still present groups
    /// only.
    ///
    /// # Errors
    /// An IO error poisons the store: every later write is refused
    /// ([`StatesError::Poisoned`]) until a restart reads what reached the disk.
    pub(crate) fn write_staged(&mut self) -> Result<Vec<(u64, DurableState)>, StatesError> {
        if self.poisoned {
            return Err(StatesError::Poisoned);
        }
        if self.staged.is_empty() {
            return Ok(Vec::new());
        }
        self.write_table()?;
        let staged = std::mem::take(&mut self.staged);
        Ok(staged
            .into_iter()
            .filter_map(|g| self.states.get(&g).map(|e| (g, e.state)))
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use braid_storage::disk::hook::{self, Plan};

    fn boot() -> BootId {
        BootId::from_bytes([3; 16])
    }

    fn state(view: u64, commit: u64) -> DurableState {
        DurableState {
            view,
            log_view: view,
            commit,
            journal_trusted_through: u64::MAX,
        }
    }

    #[test]
    fn a_batch_is_one_write_and_the_newest_intact_copy_wins() {
        let dir = tempfile::tempdir().unwrap();
        let mut states = GroupStates::open(dir.path(), 3, boot()).unwrap();
        assert_eq!(states.groups().count(), 0);
        for group in 0..1000 {
            states.stage(group, state(1, group));
        }
        hook::install(Plan::default());
        let durable = states.write_staged().unwrap();
        let syncs = hook::take().unwrap().seen;
        assert_eq!(durable.len(), 1000);
        assert!(
            syncs <= 6,
            "{syncs} disk operations for a batch of 1000 groups"
        );
        assert!(!states.has_staged());
        states.stage(7, state(2, 9));
        states.remove(8);
        assert!(states.has_staged());
        assert_eq!(states.write_staged().unwrap(), vec![(7, state(2, 9))]);
        assert!(states.write_staged().unwrap().is_empty(), "nothing staged");
        let reopened = GroupStates::open(dir.path(), 3, boot()).unwrap();
        assert_eq!(reopened.get(7), Some(state(2, 9)));
        assert_eq!(reopened.get(8), None);
        assert_eq!(reopened.groups().count(), 999);

        // The newest copy (batch 2, in shard-3.0) torn: batch 1's table is used.
        let newest = dir.path().join("shard-3.0");
        let mut bytes = std::fs::read(&newest).unwrap();
        bytes[100] ^= 1;
        std::fs::write(&newest, &bytes).unwrap();
        let older = GroupStates::open(dir.path(), 3, boot()).unwrap();
        assert_eq!(older.get(7), Some(state(1, 7)));
        assert_eq!(older.get(8), Some(state(1, 8)));
        // Both damaged: refused, naming each copy.
        std::fs::write(dir.path().join("shard-3.1"), b"BRDVST02garbage").unwrap();
        let refused = GroupStates::open(dir.path(), 3, boot()).unwrap_err();
        assert!(refused.to_string().contains("shard-3.0"), "{refused}");
        assert!(refused.to_string().contains("shard-3.1"), "{refused}");
    }

    #[test]
    fn stamps_are_kept_per_group_and_a_table_without_stamps_reads_as_unknown() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (BootId::from_bytes([1; 16]), BootId::from_bytes([2; 16]));
        let mut states = GroupStates::open(dir.path(), 0, a).unwrap();
        states.stage(1, state(1, 1));
        states.stage(2, state(1, 2));
        states.write_staged().unwrap();
        // A process of another boot restages group 2 only: group 1 keeps boot a's.
        let mut states = GroupStates::open(dir.path(), 0, b).unwrap();
        assert!(!states.vouches_for(1) && !states.vouches_for(2));
        states.stage(2, state(2, 2));
        states.write_staged().unwrap();
        let states = GroupStates::open(dir.path(), 0, b).unwrap();
        assert_eq!(states.stamp(1), Some(Stamp::Boot(a)));
        assert_eq!(states.stamp(2), Some(Stamp::Boot(b)));
        assert!(states.vouches_for(2) && !states.vouches_for(1));
        assert_eq!(states.get(2), Some(state(2, 2)));

        // The first format: the same table, no stamps.
        let mut old = Vec::new();
        old.extend_from_slice(MAGIC_UNSTAMPED);
        old.extend_from_slice(&5u64.to_be_bytes());
        old.extend_from_slice(&1u32.to_be_bytes());
        old.extend_from_slice(&7u64.to_be_bytes());
        old.extend_from_slice(&state(3, 4).encode(5));
        let crc = crc32c::crc32c(&old);
        old.extend_from_slice(&crc.to_be_bytes());
        let old_dir = tempfile::tempdir().unwrap();
        std::fs::write(old_dir.path().join("shard-0.1"), &old).unwrap();
        let states = GroupStates::open(old_dir.path(), 0, a).unwrap();
        assert_eq!(states.get(7), Some(state(3, 4)));
        assert_eq!(states.stamp(7), Some(Stamp::Unknown));
    }

    /// One batch: groups' new states, and groups removed.
    type Batch = (Vec<(u64, DurableState)>, Vec<u64>);

    /// The batches of a workload: each a few groups' new states, some removals.
    fn workload() -> Vec<Batch> {
        (1..=6u64)
            .map(|b| {
                let staged = (0..3)
                    .map(|g| ((b + g) % 5, state(b, b * 10 + g)))
                    .collect();
                let removed = if b % 3 == 0 { vec![b % 5] } else { Vec::new() };
                (staged, removed)
            })
            .collect()
    }

    fn table_after(batches: usize) -> BTreeMap<u64, DurableState> {
        let mut table = BTreeMap::new();
        for (staged, removed) in workload().into_iter().take(batches) {
            table.extend(staged);
            for g in removed {
                table.remove(&g);
            }
        }
        table
    }

    fn stage_batch(states: &mut GroupStates, (staged, removed): Batch) {
        for (g, s) in staged {
            states.stage(g, s);
        }
        for g in removed {
            states.remove(g);
        }
    }

    fn run(dir: &Path) -> Result<usize, StatesError> {
        let mut states = GroupStates::open(dir, 0, boot())?;
        let mut written = 0;
        for batch in workload() {
            stage_batch(&mut states, batch);
            states.write_staged()?;
            written += 1;
        }
        Ok(written)
    }

    /// Cut at every sync boundary, every way the POSIX model allows: the states open,
    /// and are those of the last batch whose write returned, or of the one in flight.
    #[test]
    fn every_crash_state_opens_to_the_last_written_batch_or_the_next() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("replication");
        hook::start_tracing();
        let trace_len = hook::trace_len;
        let mut acks = Vec::new();
        {
            // Record where in the trace each batch's write returned.
            let mut states = GroupStates::open(&dir, 0, boot()).unwrap();
            acks.push(trace_len());
            for batch in workload() {
                stage_batch(&mut states, batch);
                states.write_staged().unwrap();
                acks.push(trace_len());
            }
        }
        let trace = hook::take().unwrap().trace;
        let checked =
            braid_storage::crash::for_each_crash_state(&trace, root.path(), |at, how, out| {
                let written = acks.iter().filter(|&&events| events <= at).count();
                let dir = out.join("replication");
                if written == 0 {
                    // Cut before the first open returned: anything but damage passes.
                    if let Ok(states) = GroupStates::open(&dir, 0, boot()) {
                        assert_eq!(states.groups().count(), 0, "cut at {at}, {how}");
                    }
                    return;
                }
                let states = GroupStates::open(&dir, 0, boot())
                    .unwrap_or_else(|e| panic!("cut at {at}, {how}: {e}"));
                let found: BTreeMap<u64, DurableState> = states.groups().collect();
                let batches = written - 1;
                assert!(
                    found == table_after(batches) || found == table_after(batches + 1),
                    "cut at {at}, {how}: {found:?} after {batches} batches"
                );
            });
        assert!(checked > 50, "{checked} crash states");
    }

    /// Each disk operation failed in turn: the failing call errors, later writes are
    /// refused, and a reopen finds the last written batch or the one that failed.
    #[test]
    fn a_failed_write_poisons_and_a_reopen_finds_a_written_batch() {
        hook::install(Plan::default());
        let root = tempfile::tempdir().unwrap();
        run(&root.path().join("r")).unwrap();
        let operations = hook::take().unwrap().seen;
        for at in 0..operations {
            let root = tempfile::tempdir().unwrap();
            let dir = root.path().join("r");
            hook::install(Plan {
                fail_at: Some((at, std::io::ErrorKind::Other)),
                ..Plan::default()
            });
            let mut states = GroupStates::open(&dir, 0, boot());
            let mut written = 0;
            if let Ok(states) = states.as_mut() {
                for batch in workload() {
                    stage_batch(states, batch);
                    if states.write_staged().is_err() {
                        states.stage(0, state(99, 99));
                        assert!(matches!(states.write_staged(), Err(StatesError::Poisoned)));
                        break;
                    }
                    written += 1;
                }
            }
            hook::take();
            let Ok(reopened) = GroupStates::open(&dir, 0, boot()) else {
                assert!(
                    states.is_err(),
                    "failure at {at}: a reopen after a good open failed"
                );
                continue;
            };
            let found: BTreeMap<u64, DurableState> = reopened.groups().collect();
            assert!(
                found == table_after(written) || found == table_after(written + 1),
                "failure at {at}: {found:?} after {written} batches"
            );
        }
    }
}
