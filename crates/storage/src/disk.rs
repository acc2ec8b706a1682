//! Every operation that changes the disk, in one place: writes, syncs, creations,
//! renames, removals and truncations of the log's files and directories; and the reads
//! of what was stored, so that a test's disk can fail them too.
//!
//! Each passes through a hook before it runs. In normal builds the hook is nothing. In
//! tests it can fail the operation (EIO, ENOSPC: the fault-injection harness), fail
//! every read of a marked range until it is written again (a latent sector error,
//! which the drive remaps on the next write), and it records what was done (the trace
//! the crash-state harness replays under the POSIX model: unsynced writes lost, torn
//! or zero-filled, unsynced directory entries lost).
//! The hook is per thread; the [`crate::Syncer`] thread's syncs bypass a test's plan,
//! so the harnesses sync inline.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::Path;

/// A kind of disk operation, as the fault plan names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DiskOp {
    /// A write of file bytes.
    Write,
    /// An `fdatasync` of a file.
    Sync,
    /// A truncation or extension of a file.
    SetLen,
    /// A creation of a file or directory.
    Create,
    /// A removal of a file.
    Remove,
    /// A rename.
    Rename,
    /// An `fsync` of a directory.
    DirSync,
    /// A read of stored bytes.
    Read,
    /// An open of a file that exists (refused only for want of a descriptor).
    Open,
}

/// The unit a read is retried in after the disk could not read a range: a sector of
/// the smallest size a drive reports.
const SECTOR_BYTES: u64 = 512;

/// Sectors read as zeros because the disk could not read them, since the process
/// started.
static UNREADABLE_SECTORS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// How many sector reads the disk failed (EIO) since the process started, each read
/// as zeros (see [`read_exact_at`]): a disk that fails them is failing.
pub fn unreadable_sectors() -> u64 {
    UNREADABLE_SECTORS.load(std::sync::atomic::Ordering::Relaxed)
}

/// Reads exactly `buf.len()` bytes at `offset` of `file` (at `path`). A sector the disk
/// cannot read (EIO: a latent sector error) reads as zeros, and the rest of the range
/// as stored: every format Braid stores is checksummed, so the zeros are damage to
/// whatever held them, found and repaired (or refused) as a flipped bit would be,
/// instead of one bad sector failing every read of a file (a states table, a whole
/// journal) that holds much more. Each such sector is logged.
///
/// # Errors
/// Any other failed read, or the file ended first.
pub fn read_exact_at(file: &File, path: &Path, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
    read_exact_at_named(file, || path.to_owned(), buf, offset)
}

/// As [`read_exact_at`], naming the file only when it must (a log read builds no path
/// unless a test's hook or a failed sector asks for it).
pub(crate) fn read_exact_at_named(
    file: &File,
    path: impl Fn() -> std::path::PathBuf,
    buf: &mut [u8],
    offset: u64,
) -> std::io::Result<()> {
    match read_raw(file, &path, buf, offset) {
        Err(err) if is_unreadable(&err) => read_sectors(file, &path, buf, offset),
        done => done,
    }
}

fn read_raw(
    file: &File,
    path: &impl Fn() -> std::path::PathBuf,
    buf: &mut [u8],
    offset: u64,
) -> std::io::Result<()> {
    if hook::ACTIVE {
        hook::read(&path(), offset, buf.len() as u64)?;
    }
    file.read_exact_at(buf, offset)
}

/// Whether `err` is the process (EMFILE) or the system (ENFILE) out of file
/// descriptors: an open refused for want of one, which changed no file and succeeds
/// again once descriptors are free. Not the disk failing: no write was lost.
pub fn is_out_of_descriptors(err: &std::io::Error) -> bool {
    matches!(err.raw_os_error(), Some(libc::EMFILE | libc::ENFILE))
}

/// Whether `err` is the disk failing to read what it holds.
fn is_unreadable(err: &std::io::Error) -> bool {
    err.raw_os_error() == Some(libc::EIO)
}

/// Reads `buf` sector by sector, zeros for each sector the disk cannot read.
fn read_sectors(
    file: &File,
    path: &impl Fn() -> std::path::PathBuf,
    buf: &mut [u8],
    offset: u64,
) -> std::io::Result<()> {
    let mut at = 0usize;
    while at < buf.len() {
        let here = offset + at as u64;
        let end =
            (buf.len() as u64).min((here / SECTOR_BYTES + 1) * SECTOR_BYTES - offset) as usize;
        match read_raw(file, path, &mut buf[at..end], here) {
            Ok(()) => {}
            Err(err) if is_unreadable(&err) => {
                buf[at..end].fill(0);
                UNREADABLE_SECTORS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                tracing::warn!(
                    path = %path().display(),
                    offset = here,
                    bytes = end - at,
                    %err,
                    "the disk cannot read a sector: it reads as zeros, damage to what it held \
                     (repaired from a peer in a cluster, refused on a single node)"
                );
            }
            Err(err) => return Err(err),
        }
        at = end;
    }
    Ok(())
}

/// Reads the whole file at `path`, as [`read_exact_at`] reads a range.
///
/// # Errors
/// The file cannot be opened or read.
pub fn read(path: &Path) -> std::io::Result<Vec<u8>> {
    let file = open(OpenOptions::new().read(true), path)?;
    let len = file.metadata()?.len();
    let mut bytes = vec![0u8; usize::try_from(len).map_err(std::io::Error::other)?];
    read_exact_at(&file, path, &mut bytes, 0)?;
    Ok(bytes)
}

/// Writes `bytes` at `offset` of `file`.
pub fn write_at(file: &File, path: &Path, bytes: &[u8], offset: u64) -> std::io::Result<()> {
    hook::before(DiskOp::Write, path)?;
    file.write_all_at(bytes, offset)?;
    hook::wrote(path, offset, bytes);
    Ok(())
}

/// Opens the file at `path` as `options` say. Every open of a file that exists comes
/// here, so that a test's disk can refuse it a descriptor (EMFILE), as a process at its
/// limit is refused.
///
/// # Errors
/// The open failed.
pub fn open(options: &OpenOptions, path: &Path) -> std::io::Result<File> {
    hook::opening(path)?;
    options.open(path)
}

/// Lists directory `dir` (which holds a descriptor while it is read, refused as
/// [`open`] is).
///
/// # Errors
/// The directory cannot be opened.
pub fn read_dir(dir: &Path) -> std::io::Result<std::fs::ReadDir> {
    hook::opening(dir)?;
    std::fs::read_dir(dir)
}

/// `options` making a file only its owner may read or write (0600): the data directory
/// holds every record and the users' SCRAM keys.
fn private(options: &mut OpenOptions) -> &mut OpenOptions {
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(options, 0o600);
    options
}

/// Appends `bytes` to the file at `path`, creating it if needed; with `sync`, syncs it.
pub fn append(path: &Path, bytes: &[u8], sync: bool) -> std::io::Result<()> {
    // Whether it exists and where the write lands matter only to the test hook's trace:
    // a normal build spends no `stat` on them.
    let traced = hook::ACTIVE;
    let existed = traced && path.exists();
    if traced && !existed {
        hook::before(DiskOp::Create, path)?;
    }
    let mut file = private(OpenOptions::new().create(true).append(true)).open(path)?;
    if traced && !existed {
        hook::created(path);
    }
    if !bytes.is_empty() {
        hook::before(DiskOp::Write, path)?;
        let offset = if traced { file.metadata()?.len() } else { 0 };
        file.write_all(bytes)?;
        hook::wrote(path, offset, bytes);
    }
    if sync {
        sync_data(&file, path)?;
    }
    Ok(())
}

/// `fdatasync` of `file`.
pub fn sync_data(file: &File, path: &Path) -> std::io::Result<()> {
    hook::before(DiskOp::Sync, path)?;
    file.sync_data()?;
    hook::synced(path);
    Ok(())
}

/// Cuts or extends `file` to `len` bytes.
pub fn set_len(file: &File, path: &Path, len: u64) -> std::io::Result<()> {
    hook::before(DiskOp::SetLen, path)?;
    file.set_len(len)?;
    hook::set_len(path, len);
    Ok(())
}

/// Creates a new file for reading and writing; refuses one that exists.
pub fn create_new(path: &Path) -> std::io::Result<File> {
    hook::before(DiskOp::Create, path)?;
    let file = private(OpenOptions::new().read(true).write(true).create_new(true)).open(path)?;
    hook::created(path);
    Ok(file)
}

/// Opens the file at `path` for writing, creating it if needed; says whether it did.
pub fn open_or_create(path: &Path) -> std::io::Result<(File, bool)> {
    match open(OpenOptions::new().write(true), path) {
        Ok(file) => Ok((file, false)),
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
            hook::before(DiskOp::Create, path)?;
            let file =
                private(OpenOptions::new().write(true).create(true).truncate(false)).open(path)?;
            hook::created(path);
            Ok((file, true))
        }
        Err(err) => Err(err),
    }
}

/// Creates (or empties) a file and writes `bytes` to it, unsynced.
pub fn write_file(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    hook::before(DiskOp::Create, path)?;
    let file = private(OpenOptions::new().write(true).create(true).truncate(true)).open(path)?;
    hook::created(path);
    hook::set_len(path, 0);
    write_at(&file, path, bytes, 0)
}

/// Removes a file.
pub fn remove(path: &Path) -> std::io::Result<()> {
    hook::before(DiskOp::Remove, path)?;
    std::fs::remove_file(path)?;
    hook::removed(path);
    Ok(())
}

/// Renames `from` over `to`.
pub fn rename(from: &Path, to: &Path) -> std::io::Result<()> {
    hook::before(DiskOp::Rename, to)?;
    std::fs::rename(from, to)?;
    hook::renamed(from, to);
    Ok(())
}

/// Creates directory `dir` (its parent must exist).
pub fn create_dir(dir: &Path) -> std::io::Result<()> {
    hook::before(DiskOp::Create, dir)?;
    let mut builder = std::fs::DirBuilder::new();
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
    builder.create(dir)?;
    hook::made_dir(dir);
    Ok(())
}

/// Syncs directory `dir`: its entries' creations, renames and removals become durable.
/// Inside [`with_dir_syncs_deferred`] on this thread, `dir` is only noted, and synced
/// once when that returns.
pub fn sync_dir(dir: &Path) -> std::io::Result<()> {
    let deferred = DEFERRED_DIR_SYNCS.with(|d| {
        d.borrow_mut()
            .as_mut()
            .map(|dirs| dirs.insert(dir.to_path_buf()))
            .is_some()
    });
    if deferred {
        return Ok(());
    }
    hook::before(DiskOp::DirSync, dir)?;
    open(OpenOptions::new().read(true), dir)?.sync_all()?;
    hook::dir_synced(dir);
    Ok(())
}

thread_local! {
    /// Directories whose syncs [`with_dir_syncs_deferred`] holds back on this thread.
    static DEFERRED_DIR_SYNCS: std::cell::RefCell<Option<std::collections::BTreeSet<std::path::PathBuf>>> =
        const { std::cell::RefCell::new(None) };
}

/// Runs `create`, deferring every directory sync it makes on this thread, then syncs
/// each directory it asked for once. For creating many new partitions at once: each
/// creation syncs its parent (the topic's directory, thousands of entries) and its
/// own directory several times, each sync an ext4 journal commit; deferred, the first
/// sync commits them all. (It was written for the gigabytes a topic of 10,000
/// partitions wrote; those turned out to be the states tables' syncs, one turn per
/// frame, and this saves little beside them.)
///
/// Only for creating what nothing depends on yet: until this returns, the new entries
/// may be lost to a power cut (as a creation interrupted by one), so nothing made in
/// `create` may be reported durable to anyone before. Never around a removal or a
/// rename that a later write relies on.
///
/// # Errors
/// `create`'s result, or the first failed sync (the others are still tried).
pub fn with_dir_syncs_deferred<T, E: From<std::io::Error>>(
    create: impl FnOnce() -> Result<T, E>,
) -> Result<T, E> {
    let outer = DEFERRED_DIR_SYNCS.with(|d| {
        let mut d = d.borrow_mut();
        let outer = d.is_some();
        if !outer {
            *d = Some(std::collections::BTreeSet::new());
        }
        outer
    });
    let result = create();
    if outer {
        // A nested call: the outermost one syncs.
        return result;
    }
    let dirs = DEFERRED_DIR_SYNCS.with(|d| d.borrow_mut().take().unwrap_or_default());
    let mut failed = None;
    // Deepest first, so each parent is synced after what was made in it.
    let mut dirs: Vec<_> = dirs.into_iter().collect();
    dirs.sort_by_key(|d| std::cmp::Reverse(d.components().count()));
    for dir in dirs {
        if let Err(err) = sync_dir(&dir) {
            failed.get_or_insert(err);
        }
    }
    let value = result?;
    match failed {
        Some(err) => Err(err.into()),
        None => Ok(value),
    }
}

#[cfg(not(any(test, feature = "fault-injection")))]
mod hook {
    use super::DiskOp;
    use std::path::Path;

    /// No hook: nothing is failed or traced.
    pub(super) const ACTIVE: bool = false;

    #[inline(always)]
    pub(super) fn before(_: DiskOp, _: &Path) -> std::io::Result<()> {
        Ok(())
    }
    #[inline(always)]
    pub(super) fn read(_: &Path, _: u64, _: u64) -> std::io::Result<()> {
        Ok(())
    }
    #[inline(always)]
    pub(super) fn opening(_: &Path) -> std::io::Result<()> {
        Ok(())
    }
    #[inline(always)]
    pub(super) fn wrote(_: &Path, _: u64, _: &[u8]) {}
    #[inline(always)]
    pub(super) fn synced(_: &Path) {}
    #[inline(always)]
    pub(super) fn set_len(_: &Path, _: u64) {}
    #[inline(always)]
    pub(super) fn created(_: &Path) {}
    #[inline(always)]
    pub(super) fn removed(_: &Path) {}
    #[inline(always)]
    pub(super) fn renamed(_: &Path, _: &Path) {}
    #[inline(always)]
    pub(super) fn dir_synced(_: &Path) {}
    #[inline(always)]
    pub(super) fn made_dir(_: &Path) {}
}

#[cfg(any(test, feature = "fault-injection"))]
pub mod hook {
    //! The test hook: a plan of which operation fails, and the trace of what ran.

    use super::DiskOp;
    use std::cell::RefCell;
    use std::path::{Path, PathBuf};

    /// One operation that reached the disk (the page cache), in order.
    #[derive(Debug, Clone, PartialEq, Eq)]
    #[allow(missing_docs)] // the fields are what their names say
    pub enum Event {
        /// `bytes` written at `offset`.
        Write {
            path: PathBuf,
            offset: u64,
            bytes: Vec<u8>,
        },
        /// The file cut or extended to `len`.
        SetLen { path: PathBuf, len: u64 },
        /// The file's `fdatasync`.
        Sync { path: PathBuf },
        /// A file created.
        Create { path: PathBuf },
        /// A file removed.
        Remove { path: PathBuf },
        /// A rename.
        Rename { from: PathBuf, to: PathBuf },
        /// A directory's `fsync`.
        DirSync { dir: PathBuf },
        /// A directory created.
        MkDir { dir: PathBuf },
    }

    /// What this thread's disk operations do.
    #[derive(Debug, Default)]
    pub struct Plan {
        /// Operations that passed `before`, counted from 0.
        pub seen: u64,
        /// Fail the operation with this number, with this error.
        pub fail_at: Option<(u64, std::io::ErrorKind)>,
        /// Fail the first operation of this kind on a path ending so.
        pub fail_first: Option<(DiskOp, &'static str, std::io::ErrorKind)>,
        /// Every operation done (when `tracing`).
        pub trace: Vec<Event>,
        /// Record every operation in `trace`.
        pub tracing: bool,
        /// Operations failed so far.
        pub failed: Vec<(DiskOp, PathBuf)>,
        /// Byte ranges `[from, to)` of files whose every read fails with EIO until a
        /// write touches them, the file is cut below them, removed or replaced: latent
        /// sector errors.
        pub unreadable: Vec<Unreadable>,
        /// Every open or creation of a file under this directory (a directory's sync
        /// opens it) fails with EMFILE, as for a process out of file descriptors;
        /// not counted in `seen`, so that a plan's numbering stays as it was.
        pub no_descriptors_under: Option<PathBuf>,
    }

    /// A range of a file that cannot be read (see [`Plan::unreadable`]).
    #[derive(Debug, Clone, PartialEq, Eq)]
    #[allow(missing_docs)] // the fields are what their names say
    pub struct Unreadable {
        pub path: PathBuf,
        pub from: u64,
        pub to: u64,
    }

    /// Marks `[from, to)` of `path` unreadable in this thread's plan (none: nothing).
    pub fn mark_unreadable(path: &Path, from: u64, to: u64) {
        PLAN.with(|p| {
            if let Some(plan) = p.borrow_mut().as_mut() {
                plan.unreadable.push(Unreadable {
                    path: path.to_owned(),
                    from,
                    to,
                });
            }
        });
    }

    /// Forgets the unreadable ranges `keep` refuses.
    fn heal(mut keep: impl FnMut(&Unreadable) -> bool) {
        PLAN.with(|p| {
            if let Some(plan) = p.borrow_mut().as_mut() {
                plan.unreadable.retain(|u| keep(u));
            }
        });
    }

    pub(super) fn read(path: &Path, offset: u64, len: u64) -> std::io::Result<()> {
        let latent = PLAN.with(|p| {
            p.borrow().as_ref().is_some_and(|plan| {
                plan.unreadable
                    .iter()
                    .any(|u| u.path == path && u.from < offset + len && offset < u.to)
            })
        });
        before(DiskOp::Read, path)?;
        if latent {
            PLAN.with(|p| {
                if let Some(plan) = p.borrow_mut().as_mut() {
                    plan.failed.push((DiskOp::Read, path.to_owned()));
                }
            });
            // EIO, as a drive reports a sector it cannot read.
            return Err(std::io::Error::from_raw_os_error(5));
        }
        Ok(())
    }

    thread_local! {
        static PLAN: RefCell<Option<Plan>> = const { RefCell::new(None) };
    }

    /// The hook is compiled in: operations are counted, and traced when asked.
    pub(super) const ACTIVE: bool = true;

    /// Installs `plan` on this thread until [`take`]: from then on this thread's disk
    /// operations are counted, failed as it says, and traced if it asks.
    pub fn install(plan: Plan) {
        PLAN.with(|p| *p.borrow_mut() = Some(plan));
    }

    /// Removes this thread's plan and returns it.
    pub fn take() -> Option<Plan> {
        PLAN.with(|p| p.borrow_mut().take())
    }

    /// Starts tracing this thread's disk operations (a plan that fails nothing).
    pub fn start_tracing() {
        install(Plan {
            tracing: true,
            ..Plan::default()
        });
    }

    /// Operations traced so far on this thread (0 without a plan): where a workload
    /// stood when a write returned, for the crash-state harness.
    pub fn trace_len() -> usize {
        PLAN.with(|p| p.borrow().as_ref().map_or(0, |plan| plan.trace.len()))
    }

    /// Sets (or with `None`, ends) the directory under which every open and creation
    /// fails with EMFILE in this thread's plan ([`Plan::no_descriptors_under`]).
    pub fn set_no_descriptors_under(dir: Option<PathBuf>) {
        PLAN.with(|p| {
            if let Some(plan) = p.borrow_mut().as_mut() {
                plan.no_descriptors_under = dir;
            }
        });
    }

    /// An open of `path` refused a descriptor, if the plan says so.
    pub(super) fn opening(path: &Path) -> std::io::Result<()> {
        let refused = PLAN.with(|p| {
            let mut plan = p.borrow_mut();
            let Some(plan) = plan.as_mut() else {
                return false;
            };
            let refused = plan
                .no_descriptors_under
                .as_ref()
                .is_some_and(|dir| path.starts_with(dir));
            if refused {
                plan.failed.push((DiskOp::Open, path.to_owned()));
            }
            refused
        });
        if refused {
            return Err(std::io::Error::from_raw_os_error(libc::EMFILE));
        }
        Ok(())
    }

    pub(super) fn before(op: DiskOp, path: &Path) -> std::io::Result<()> {
        if matches!(op, DiskOp::Create | DiskOp::DirSync) {
            opening(path)?;
        }
        PLAN.with(|p| {
            let mut plan = p.borrow_mut();
            let Some(plan) = plan.as_mut() else {
                return Ok(());
            };
            let number = plan.seen;
            plan.seen += 1;
            let numbered = plan.fail_at.filter(|(at, _)| *at == number).map(|f| f.1);
            let matching = plan
                .fail_first
                .filter(|(kind, suffix, _)| *kind == op && path.to_string_lossy().ends_with(suffix))
                .map(|f| f.2);
            match numbered.or(matching) {
                Some(kind) => {
                    if matching.is_some() {
                        plan.fail_first = None;
                    }
                    plan.failed.push((op, path.to_owned()));
                    Err(std::io::Error::new(kind, "injected fault"))
                }
                None => Ok(()),
            }
        })
    }

    fn record(event: impl FnOnce() -> Event) {
        PLAN.with(|p| {
            if let Some(plan) = p.borrow_mut().as_mut().filter(|plan| plan.tracing) {
                plan.trace.push(event());
            }
        });
    }

    pub(super) fn wrote(path: &Path, offset: u64, bytes: &[u8]) {
        // The kernel writes the whole page back and the drive remaps its sectors.
        let end = offset + bytes.len() as u64;
        heal(|u| !(u.path == path && u.from < end && offset < u.to));
        record(|| Event::Write {
            path: path.to_owned(),
            offset,
            bytes: bytes.to_vec(),
        });
    }
    pub(super) fn synced(path: &Path) {
        record(|| Event::Sync {
            path: path.to_owned(),
        });
    }
    pub(super) fn set_len(path: &Path, len: u64) {
        heal(|u| !(u.path == path && u.from >= len));
        record(|| Event::SetLen {
            path: path.to_owned(),
            len,
        });
    }
    pub(super) fn created(path: &Path) {
        record(|| Event::Create {
            path: path.to_owned(),
        });
    }
    pub(super) fn removed(path: &Path) {
        heal(|u| u.path != path);
        record(|| Event::Remove {
            path: path.to_owned(),
        });
    }
    pub(super) fn renamed(from: &Path, to: &Path) {
        heal(|u| u.path != to);
        PLAN.with(|p| {
            if let Some(plan) = p.borrow_mut().as_mut() {
                for u in plan.unreadable.iter_mut().filter(|u| u.path == from) {
                    u.path = to.to_owned();
                }
            }
        });
        record(|| Event::Rename {
            from: from.to_owned(),
            to: to.to_owned(),
        });
    }
    pub(super) fn dir_synced(dir: &Path) {
        record(|| Event::DirSync {
            dir: dir.to_owned(),
        });
    }
    pub(super) fn made_dir(dir: &Path) {
        record(|| Event::MkDir {
            dir: dir.to_owned(),
        });
    }
}

#[cfg(test)]
mod deferred_tests {
    use super::hook::{self, Event};
    use super::*;

    /// Every directory synced inside is synced once, deepest first, when the call
    /// returns; a sync that fails then is the call's error.
    #[test]
    fn deferred_directory_syncs_happen_once_each_at_the_end() {
        let root = tempfile::tempdir().unwrap();
        let topic = root.path().join("topic");
        let partitions: Vec<_> = (0..3).map(|p| topic.join(p.to_string())).collect();
        hook::start_tracing();
        with_dir_syncs_deferred(|| -> std::io::Result<()> {
            for dir in &partitions {
                crate::dirs::create_dir_durable(dir)?;
                sync_dir(dir)?;
                sync_dir(dir)?;
            }
            let synced = hook::take()
                .unwrap()
                .trace
                .iter()
                .any(|e| matches!(e, Event::DirSync { .. }));
            assert!(!synced, "no directory synced before the end");
            hook::start_tracing();
            Ok(())
        })
        .unwrap();
        let synced: Vec<_> = hook::take()
            .unwrap()
            .trace
            .into_iter()
            .filter_map(|e| match e {
                Event::DirSync { dir } => Some(dir),
                _ => None,
            })
            .collect();
        let mut expected: Vec<_> = partitions.clone();
        expected.push(topic.clone());
        expected.push(root.path().to_path_buf());
        assert_eq!(synced.len(), expected.len(), "{synced:?}");
        for dir in &expected {
            assert_eq!(
                synced.iter().filter(|d| *d == dir).count(),
                1,
                "{dir:?}: {synced:?}"
            );
        }
        assert_eq!(
            synced.last(),
            Some(&root.path().to_path_buf()),
            "the shallowest last"
        );
        // Outside, syncs happen at once again; a deferred one that fails is the error.
        sync_dir(&topic).unwrap();
        let gone = root.path().join("gone");
        let failed = with_dir_syncs_deferred(|| -> std::io::Result<()> { sync_dir(&gone) });
        assert!(failed.is_err());
    }
}

#[cfg(test)]
mod latent_tests {
    use super::hook;
    use super::*;

    /// A sector the disk cannot read reads as zeros, the sectors around it as stored,
    /// and a write that touches it makes it readable again (the drive remaps it).
    #[test]
    fn an_unreadable_sector_reads_as_zeros_until_written() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let stored: Vec<u8> = (0..4096u32).map(|i| (i % 251) as u8 + 1).collect();
        std::fs::write(&path, &stored).unwrap();
        hook::install(hook::Plan::default());
        hook::mark_unreadable(&path, 1024, 1536);
        let counted = unreadable_sectors();
        let read = super::read(&path).unwrap();
        assert!(unreadable_sectors() > counted, "counted for the metric");
        assert!(read[1024..1536].iter().all(|b| *b == 0));
        assert_eq!(read[..1024], stored[..1024]);
        assert_eq!(read[1536..], stored[1536..]);
        let file = File::open(&path).unwrap();
        let mut part = [0u8; 100];
        read_exact_at(&file, &path, &mut part, 1000).unwrap();
        assert_eq!(part[..24], stored[1000..1024]);
        assert!(part[24..].iter().all(|b| *b == 0));
        // Each read failed whole, then at its one sector.
        assert_eq!(hook::take().unwrap().failed.len(), 4);

        hook::install(hook::Plan::default());
        hook::mark_unreadable(&path, 1024, 1536);
        let file = OpenOptions::new().write(true).open(&path).unwrap();
        write_at(&file, &path, &[9u8; 10], 1100).unwrap();
        let read = super::read(&path).unwrap();
        assert_eq!(read[1100..1110], [9u8; 10]);
        assert_eq!(read[1024..1100], stored[1024..1100]);
        assert!(hook::take().unwrap().failed.is_empty());
    }
}
