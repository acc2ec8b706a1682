//! Groups whose journal is a plain [`JournalFile`] in the host's directory (the
//! metadata group): the file opened, its damage marked before it is repaired away.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use braid_vsr::{Config, StateMachine};

use super::super::journal_file::{
    mark_untrusted, untrusted_mark, JournalError, JournalFile, Recovered,
};
use super::{HostError, Opened, ShardHost};

impl<S: StateMachine> ShardHost<S, JournalFile> {
    /// Opens a group whose journal is a [`JournalFile`] in the host's directory
    /// (`group-G.journal`, `group-G.checkpoint.*`): a new replica if nothing was ever
    /// written, else a restart from what was.
    ///
    /// # Errors
    /// A file cannot be read, or what it holds cannot restart the replica.
    pub(crate) fn add_group(&mut self, config: Config, machine: S) -> Result<(), HostError> {
        let group = config.group;
        let path = self.dir.join(format!("group-{group}.journal"));
        if self.has_state(group) && super::super::journal_file::gone_or_cut_short(&path) {
            // Made before the group's first state: gone or cut short now, it lost what
            // it held (opened, it would be made anew, empty).
            let reason = format!(
                "{} is gone or cut short while the states table holds the group's state",
                path.display()
            );
            if config.replica_count == 1 {
                return Err(HostError::Damaged { group, reason });
            }
            tracing::warn!(group, %reason, "the group restarts as a replica that lost its disk");
            self.restart_as_lost(group)?;
        }
        let (journal, recovered, untrusted) =
            open_group_journal(&path, group, config.replica_count > 1)?;
        let opened = Opened {
            slots: recovered.slots,
            damage: recovered
                .damaged_at
                .map(|at| format!("{} is damaged at byte {at}", path.display())),
            trusted: true,
            tail_cut: untrusted,
            damaged_at_rest: recovered.damaged_at.is_some(),
        };
        let dir = Arc::from(self.dir.as_path());
        self.add_group_with(config, machine, journal, opened, &dir)
    }
}

/// Opens a group's [`JournalFile`] at `path`, and says whether it is untrusted: its open
/// cut a tail that may hide a reported op, or (a member of a cluster, `repairable`) it
/// was unreadable and was made anew (moved aside as `.damaged`: the peers hold its ops),
/// or an earlier open found so and the group's state may not say it yet. Each of these
/// leaves the journal's untrusted mark, durably, before the evidence is repaired away
/// (the partition journal's rule: the shell simulator's seeds 90 and 40).
fn open_group_journal(
    path: &Path,
    group: u64,
    repairable: bool,
) -> Result<(JournalFile, Recovered, bool), HostError> {
    let marked = untrusted_mark(path).exists();
    let marked_now = std::cell::Cell::new(false);
    let mark_once = || -> Result<(), JournalError> {
        if repairable && !marked_now.get() {
            mark_untrusted(path)?;
            marked_now.set(true);
        }
        Ok(())
    };
    let (journal, recovered, remade) =
        match JournalFile::open_marking(path, group, !repairable, false, mark_once) {
            Err(JournalError::NotAJournal { .. }) if repairable => {
                mark_once()?;
                let mut aside = path.as_os_str().to_owned();
                aside.push(".damaged");
                let aside = PathBuf::from(aside);
                tracing::warn!(
                    path = %path.display(),
                    aside = %aside.display(),
                    "the group's journal is not readable as a journal: moved aside, its ops are \
                     taken from peers"
                );
                braid_storage::disk::rename(path, &aside).map_err(|source| JournalError::Io {
                    path: path.to_owned(),
                    source,
                })?;
                let (journal, recovered) = JournalFile::open(path, group)?;
                (journal, recovered, true)
            }
            opened => {
                let (journal, recovered) = opened?;
                (journal, recovered, false)
            }
        };
    let untrusted = recovered.tail_may_hide || remade || (repairable && marked);
    if untrusted {
        mark_once()?;
    }
    Ok((journal, recovered, untrusted))
}
