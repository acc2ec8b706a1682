//! Crash states under the POSIX model, built from a trace of disk operations (see
//! [`crate::disk`]): the test harness of the partition log and of the node's metadata
//! store, after ALICE and LazyFS.
//!
//! At each sync boundary of a trace (just before each file or directory sync, and after
//! the last operation) a power cut may leave:
//!
//! - a file's bytes as its last `fdatasync` left them, plus any of the writes since:
//!   none, all, a prefix of them, the last one alone with the earlier ones zero-filled
//!   (unwritten extents), or all with the last one torn at a page boundary;
//! - a directory's entries as its last sync left them, all of them, or those plus any
//!   one later change (a creation, rename or removal) that reached the disk first.
//!
//! [`for_each_crash_state`] writes each such state into a fresh directory and hands it
//! to a check that opens it with the real recovery code.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::disk::hook::Event;

const PAGE: usize = 4096;

#[derive(Debug, Clone, Default)]
struct Inode {
    durable: Vec<u8>,
    current: Vec<u8>,
    /// Writes since the last sync: (offset, bytes); a set_len as an empty write.
    pending: Vec<(u64, Vec<u8>, Option<u64>)>,
    is_dir: bool,
}

/// The file system as the trace left it, up to some event.
#[derive(Debug, Default, Clone)]
struct Model {
    inodes: Vec<Inode>,
    current: BTreeMap<PathBuf, usize>,
    durable: BTreeMap<PathBuf, usize>,
}

fn apply_write(content: &mut Vec<u8>, offset: u64, bytes: &[u8], len: Option<u64>) {
    if let Some(len) = len {
        content.resize(len as usize, 0);
        return;
    }
    let end = offset as usize + bytes.len();
    if content.len() < end {
        content.resize(end, 0);
    }
    content[offset as usize..end].copy_from_slice(bytes);
}

impl Model {
    fn new_inode(&mut self, path: &Path, is_dir: bool) {
        self.inodes.push(Inode {
            is_dir,
            ..Inode::default()
        });
        self.current.insert(path.to_owned(), self.inodes.len() - 1);
    }

    fn apply(&mut self, event: &Event) {
        match event {
            Event::MkDir { dir } => self.new_inode(dir, true),
            Event::Create { path } => {
                if !self.current.contains_key(path) {
                    self.new_inode(path, false);
                }
            }
            Event::Write {
                path,
                offset,
                bytes,
            } => {
                if let Some(&inode) = self.current.get(path) {
                    let inode = &mut self.inodes[inode];
                    apply_write(&mut inode.current, *offset, bytes, None);
                    inode.pending.push((*offset, bytes.clone(), None));
                }
            }
            Event::SetLen { path, len } => {
                if let Some(&inode) = self.current.get(path) {
                    let inode = &mut self.inodes[inode];
                    apply_write(&mut inode.current, 0, &[], Some(*len));
                    inode.pending.push((0, Vec::new(), Some(*len)));
                }
            }
            Event::Sync { path } => {
                if let Some(&inode) = self.current.get(path) {
                    let inode = &mut self.inodes[inode];
                    // The pending writes, in order, are what current holds beyond
                    // durable: replaying them costs what was written, not the file.
                    for (offset, bytes, len) in inode.pending.drain(..) {
                        apply_write(&mut inode.durable, offset, &bytes, len);
                    }
                }
            }
            Event::Remove { path } => {
                self.current.remove(path);
            }
            Event::Rename { from, to } => {
                if let Some(inode) = self.current.remove(from) {
                    self.current.insert(to.clone(), inode);
                }
            }
            Event::DirSync { dir } => {
                // The directory's own entries become what they are now.
                self.durable
                    .retain(|path, _| path.parent() != Some(dir.as_path()));
                for (path, inode) in &self.current {
                    if path.parent() == Some(dir.as_path()) {
                        self.durable.insert(path.clone(), *inode);
                    }
                }
            }
        }
    }
}

/// How the unsynced writes of a file reached the disk.
#[derive(Debug, Clone, Copy)]
enum Persisted {
    None,
    All,
    Prefix(usize),
    LastOnlyEarlierZeroed,
    LastTorn,
}

fn content_of(inode: &Inode, how: Persisted) -> Vec<u8> {
    let mut content = inode.durable.clone();
    let pending = &inode.pending;
    let apply = |content: &mut Vec<u8>, (offset, bytes, len): &(u64, Vec<u8>, Option<u64>)| {
        apply_write(content, *offset, bytes, *len)
    };
    match how {
        Persisted::None => {}
        Persisted::All => pending.iter().for_each(|w| apply(&mut content, w)),
        Persisted::Prefix(k) => pending.iter().take(k).for_each(|w| apply(&mut content, w)),
        Persisted::LastOnlyEarlierZeroed => {
            if let Some((last, earlier)) = pending.split_last() {
                for (offset, bytes, len) in earlier {
                    apply_write(&mut content, *offset, &vec![0; bytes.len()], *len);
                }
                apply(&mut content, last);
            }
        }
        Persisted::LastTorn => {
            if let Some((last, earlier)) = pending.split_last() {
                earlier.iter().for_each(|w| apply(&mut content, w));
                let (offset, bytes, len) = last;
                // Only the pages of the write up to its first page boundary landed.
                let keep = (PAGE - (*offset as usize % PAGE)).min(bytes.len());
                apply_write(&mut content, *offset, &bytes[..keep], *len);
                if len.is_none() && bytes.len() > keep {
                    apply_write(
                        &mut content,
                        *offset + keep as u64,
                        &vec![0; bytes.len() - keep],
                        None,
                    );
                }
            }
        }
    }
    content
}

/// Which directory entries a crash state keeps.
#[derive(Debug, Clone)]
enum Entries {
    /// What the directory syncs covered.
    Synced,
    /// Everything, as the page cache had it.
    All,
    /// What the syncs covered, and one later change (a creation, rename or removal)
    /// that reached the disk before the earlier ones.
    SyncedAndOne(PathBuf),
}

/// Writes one crash state of `model` under `out`, where `root` stood; `how` says, by
/// inode number, how each file's unsynced writes landed.
fn materialize(
    model: &Model,
    root: &Path,
    out: &Path,
    entries: &Entries,
    how: &dyn Fn(usize) -> Persisted,
) {
    let mut chosen;
    let entries = match entries {
        Entries::Synced => &model.durable,
        Entries::All => &model.current,
        Entries::SyncedAndOne(path) => {
            chosen = model.durable.clone();
            match model.current.get(path) {
                Some(inode) => {
                    chosen.insert(path.clone(), *inode);
                }
                None => {
                    chosen.remove(path);
                }
            }
            &chosen
        }
    };
    // Directories first (shallowest first), then files whose directory survived.
    let mut paths: Vec<(&PathBuf, &usize)> = entries.iter().collect();
    paths.sort_by_key(|(path, _)| path.components().count());
    for (path, &inode) in paths {
        let Ok(relative) = path.strip_prefix(root) else {
            continue;
        };
        let target = out.join(relative);
        if !target.parent().is_some_and(Path::is_dir) {
            continue; // its directory's entry was lost: so is it
        }
        let number = inode;
        let inode = &model.inodes[inode];
        if inode.is_dir {
            std::fs::create_dir_all(&target)
                .unwrap_or_else(|err| panic!("{}: {err}", target.display()));
        } else {
            std::fs::write(&target, content_of(inode, how(number)))
                .unwrap_or_else(|err| panic!("{}: {err}", target.display()));
        }
    }
}

/// Calls `check(cut, state, dir)` for every crash state of `trace`, where `cut` is the
/// number of operations before the cut, `state` names the variant, and `dir` holds the
/// state where `root` stood (`root` existed, durably, before the trace began). Returns
/// how many states were checked.
///
/// # Panics
/// If a state cannot be written to the temporary directory (a test harness).
pub fn for_each_crash_state(
    trace: &[Event],
    root: &Path,
    mut check: impl FnMut(usize, &str, &Path),
) -> usize {
    let mut model = Model::default();
    model.new_inode(root, true);
    model.durable = model.current.clone();
    let mut states = 0;
    for (at, event) in trace.iter().enumerate() {
        if matches!(event, Event::Sync { .. } | Event::DirSync { .. }) {
            states += states_at(&model, root, at, &mut check);
        }
        model.apply(event);
    }
    states + states_at(&model, root, trace.len(), &mut check)
}

fn states_at(
    model: &Model,
    root: &Path,
    at: usize,
    check: &mut impl FnMut(usize, &str, &Path),
) -> usize {
    let most_pending = model
        .inodes
        .iter()
        .map(|inode| inode.pending.len())
        .max()
        .unwrap_or(0);
    let mut variants: Vec<(Entries, Persisted)> = vec![
        (Entries::Synced, Persisted::None),
        (Entries::All, Persisted::All),
        (Entries::All, Persisted::LastOnlyEarlierZeroed),
        (Entries::All, Persisted::LastTorn),
        (Entries::Synced, Persisted::LastOnlyEarlierZeroed),
    ];
    for k in 1..most_pending {
        variants.push((Entries::All, Persisted::Prefix(k)));
    }
    // Each unsynced directory change alone, as if it reached the disk first.
    let changed = model
        .current
        .iter()
        .filter(|(path, inode)| model.durable.get(*path) != Some(inode))
        .map(|(path, _)| path.clone())
        .chain(
            model
                .durable
                .keys()
                .filter(|path| !model.current.contains_key(*path))
                .cloned(),
        );
    for path in changed.collect::<Vec<_>>() {
        variants.push((Entries::SyncedAndOne(path), Persisted::All));
    }
    for (entries, how) in &variants {
        let out = scratch_dir();
        materialize(model, root, &out, entries, &|_| *how);
        check(at, &format!("entries {entries:?}, writes {how:?}"), &out);
        let _ = std::fs::remove_dir_all(&out);
    }
    variants.len()
}

/// A new empty directory for one state.
fn scratch_dir() -> PathBuf {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let dir = std::env::temp_dir().join(format!(
        "braid-crash-state-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap_or_else(|err| panic!("{}: {err}", dir.display()));
    dir
}

/// One directory tree under the POSIX model, followed event by event, from which the
/// state a power cut would leave can be drawn at any moment: the simulator's disk
/// under the node's real files.
#[derive(Debug, Clone)]
pub struct PowerModel {
    model: Model,
    root: PathBuf,
}

impl PowerModel {
    /// The tree at `root` as it is now, all of it durable (as after a reboot, or
    /// before anything ran).
    ///
    /// # Errors
    /// The tree cannot be read.
    pub fn of_dir(root: &Path) -> std::io::Result<Self> {
        let mut model = Model::default();
        model.new_inode(root, true);
        let mut dirs = vec![root.to_owned()];
        while let Some(dir) = dirs.pop() {
            let mut entries: Vec<PathBuf> = std::fs::read_dir(&dir)?
                .map(|entry| entry.map(|e| e.path()))
                .collect::<Result<_, _>>()?;
            entries.sort();
            for path in entries {
                if path.is_dir() {
                    model.new_inode(&path, true);
                    dirs.push(path);
                } else {
                    let bytes = std::fs::read(&path)?;
                    model.new_inode(&path, false);
                    if let Some(inode) = model.inodes.last_mut() {
                        inode.current.clone_from(&bytes);
                        inode.durable = bytes;
                    }
                }
            }
        }
        model.durable = model.current.clone();
        Ok(Self {
            model,
            root: root.to_owned(),
        })
    }

    /// Follows one disk operation; those outside the tree are not its own.
    pub fn apply(&mut self, event: &Event) {
        let inside = match event {
            Event::Write { path, .. }
            | Event::SetLen { path, .. }
            | Event::Sync { path }
            | Event::Create { path }
            | Event::Remove { path } => path.starts_with(&self.root),
            Event::Rename { from, to } => {
                from.starts_with(&self.root) && to.starts_with(&self.root)
            }
            Event::DirSync { dir } | Event::MkDir { dir } => dir.starts_with(&self.root),
        };
        if inside {
            self.model.apply(event);
        }
    }

    /// Every file with writes not yet synced: (path, durable length, current length,
    /// writes pending), for a simulator's trace.
    pub fn unsynced(&self) -> Vec<(PathBuf, usize, usize, usize)> {
        self.model
            .current
            .iter()
            .filter_map(|(path, &inode)| {
                let inode = &self.model.inodes[inode];
                (!inode.pending.is_empty()).then(|| {
                    (
                        path.clone(),
                        inode.durable.len(),
                        inode.current.len(),
                        inode.pending.len(),
                    )
                })
            })
            .collect()
    }

    /// Writes into `out` (an empty directory) a state a power cut now could leave,
    /// drawing with `draw(n)` (a number below `n`) the directories' entries (as synced,
    /// as the page cache had them, or as synced plus one later change) and, file by
    /// file, how its unsynced writes landed (none, all, a prefix, the last alone with
    /// the earlier ones zeroed, or all with the last torn at a page). Returns what was
    /// drawn, for a failure's report.
    pub fn cut_into(&self, out: &Path, draw: &mut dyn FnMut(usize) -> usize) -> String {
        let changed: Vec<PathBuf> = self
            .model
            .current
            .iter()
            .filter(|(path, inode)| self.model.durable.get(*path) != Some(inode))
            .map(|(path, _)| path.clone())
            .chain(
                self.model
                    .durable
                    .keys()
                    .filter(|path| !self.model.current.contains_key(*path))
                    .cloned(),
            )
            .collect();
        let entries = match draw(3) {
            0 => Entries::Synced,
            1 => Entries::All,
            _ => match changed.get(draw(changed.len().max(1))) {
                Some(path) => Entries::SyncedAndOne(path.clone()),
                None => Entries::Synced,
            },
        };
        let hows: Vec<Persisted> = self
            .model
            .inodes
            .iter()
            .map(|inode| match draw(5) {
                0 => Persisted::None,
                1 => Persisted::All,
                2 if inode.pending.len() > 1 => Persisted::Prefix(draw(inode.pending.len())),
                2 => Persisted::All,
                3 => Persisted::LastOnlyEarlierZeroed,
                _ => Persisted::LastTorn,
            })
            .collect();
        materialize(&self.model, &self.root, out, &entries, &|inode| {
            hows.get(inode).copied().unwrap_or(Persisted::None)
        });
        let lost = hows
            .iter()
            .zip(&self.model.inodes)
            .filter(|(how, inode)| !inode.pending.is_empty() && !matches!(how, Persisted::All))
            .count();
        format!("entries {entries:?}, {lost} files lost some unsynced writes")
    }
}
