//! Group commit: one thread that turns many sync requests into few `fdatasync` calls.
//!
//! A shard appends to the page cache and goes on serving; under `fsync = always` it asks
//! the [`Syncer`] to make the appends durable and acknowledges them in the callback.
//! The syncer takes every request that arrived while it was busy and runs one
//! `fdatasync` per file for all of them, so N concurrent appends to a log cost one
//! sync, not N (group commit). A sync covers every byte written to the file before it
//! started, which is why the request only needs the file and the offset it reaches.
//!
//! A round that touches many files (a retirement walk's barriers reach thousands of
//! partitions, each its own log) syncs them on [`SYNC_THREADS`] threads at once: the
//! filesystem's journal commits concurrent syncs together, where one after another
//! each pays its own commit (on ext4 here, about 2 to 3 times the files a second).

use std::fs::File;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;

/// Everything appended to a log before [`crate::PartitionLog::sync_request`] was called
/// becomes durable when `file` is synced.
#[derive(Debug, Clone)]
pub struct SyncRequest {
    pub(crate) file: Arc<File>,
    /// The file's path, for errors and the test harnesses' trace.
    pub(crate) path: Arc<std::path::Path>,
    /// The log's next offset when the request was made: the sync makes every offset
    /// below it durable.
    pub next_offset: u64,
    pub(crate) generation: u64,
    /// The active segment and its size when the request was made: the recovery point
    /// the sync proves.
    pub(crate) segment_base: u64,
    pub(crate) position: u64,
}

impl SyncRequest {
    /// A request that syncs `file` (at `path`), a file beside the log (a replication
    /// journal); it carries no log position, so it is never given to
    /// [`crate::PartitionLog::on_synced`].
    pub fn for_file(file: Arc<File>, path: Arc<std::path::Path>) -> Self {
        Self {
            file,
            path,
            next_offset: 0,
            generation: u64::MAX,
            segment_base: 0,
            position: 0,
        }
    }

    /// Runs the sync on the calling thread.
    ///
    /// # Errors
    /// The `fdatasync` failure.
    pub fn run(&self) -> Result<(), SyncError> {
        crate::disk::sync_data(&self.file, &self.path).map_err(SyncError::from)
    }
}

/// A failed `fdatasync`. After one, the log refuses writes until it is reopened: the
/// kernel may have dropped the dirty pages, so retrying could report success for data
/// that is gone.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("fdatasync failed ({kind:?}): {message}")]
pub struct SyncError {
    /// The OS error kind.
    pub kind: std::io::ErrorKind,
    /// The OS error text.
    pub message: String,
}

impl From<std::io::Error> for SyncError {
    fn from(err: std::io::Error) -> Self {
        Self {
            kind: err.kind(),
            message: err.to_string(),
        }
    }
}

/// What the syncer calls when a request is done.
pub type SyncCallback = Box<dyn FnOnce(SyncRequest, Result<(), SyncError>) + Send>;

struct Job {
    request: SyncRequest,
    done: SyncCallback,
}

/// Counters of a [`Syncer`].
#[derive(Debug, Default)]
pub struct SyncerStats {
    requests: AtomicU64,
    fsyncs: AtomicU64,
}

impl SyncerStats {
    /// Requests completed.
    pub fn requests(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }

    /// `fdatasync` calls made. `requests / fsyncs` is the group-commit factor.
    pub fn fsyncs(&self) -> u64 {
        self.fsyncs.load(Ordering::Relaxed)
    }
}

/// Most requests one round takes, so callbacks of the first ones are not delayed by an
/// unbounded stream of later ones.
pub const SYNC_ROUND_REQUESTS_MAX: usize = 4096;

/// Threads that sync the files of one round at once (the syncer's own among them).
pub(crate) const SYNC_THREADS: usize = 16;

/// The sync thread. Dropping it finishes the queued requests and joins the thread.
#[derive(Debug)]
pub struct Syncer {
    sender: Option<mpsc::Sender<Job>>,
    thread: Option<JoinHandle<()>>,
    /// The helpers that sync a round's other files while the sync thread syncs one.
    pool: Option<Arc<Pool>>,
    helpers: Vec<JoinHandle<()>>,
    stats: Arc<SyncerStats>,
    /// [`Syncer::held`]: requests wait here for [`Syncer::run_held`].
    held: Option<std::sync::Mutex<Vec<Job>>>,
}

impl std::fmt::Debug for Job {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Job")
            .field("request", &self.request)
            .finish()
    }
}

impl Syncer {
    /// Starts the sync thread.
    ///
    /// # Errors
    /// The thread could not be spawned.
    pub fn start(name: &str) -> std::io::Result<Self> {
        let (sender, receiver) = mpsc::channel::<Job>();
        let stats = Arc::new(SyncerStats::default());
        let pool = Arc::new(Pool::default());
        let mut helpers = Vec::new();
        for i in 1..SYNC_THREADS {
            let (pool, stats) = (Arc::clone(&pool), Arc::clone(&stats));
            let helper = std::thread::Builder::new()
                .name(format!("{name}-{i}"))
                .spawn(move || pool.help(&stats));
            match helper {
                Ok(helper) => helpers.push(helper),
                // Fewer helpers only make rounds slower.
                Err(_) => break,
            }
        }
        let thread_stats = Arc::clone(&stats);
        let thread_pool = Arc::clone(&pool);
        let thread = std::thread::Builder::new()
            .name(name.to_owned())
            .spawn(move || run(&receiver, &thread_stats, &thread_pool))?;
        Ok(Self {
            sender: Some(sender),
            thread: Some(thread),
            pool: Some(pool),
            helpers,
            stats,
            held: None,
        })
    }

    /// A syncer without a thread: requests wait until [`Syncer::run_held`] runs them
    /// on the caller's thread, so a deterministic simulator chooses when each sync
    /// happens (and its disk model sees them), and drops the waiting ones in a crash.
    pub fn held() -> Self {
        Self {
            sender: None,
            thread: None,
            pool: None,
            helpers: Vec::new(),
            stats: Arc::new(SyncerStats::default()),
            held: Some(std::sync::Mutex::new(Vec::new())),
        }
    }

    /// Requests waiting in a [`Syncer::held`] syncer.
    pub fn held_len(&self) -> usize {
        self.held
            .as_ref()
            .and_then(|held| held.lock().ok().map(|jobs| jobs.len()))
            .unwrap_or(0)
    }

    /// Runs the `count` oldest requests waiting in a [`Syncer::held`] syncer as one
    /// round (one `fdatasync` per file among them), and their callbacks.
    pub fn run_held(&self, count: usize) {
        let Some(held) = &self.held else {
            return;
        };
        let mut round: Vec<Job> = match held.lock() {
            Ok(mut jobs) => {
                let count = count.min(jobs.len());
                jobs.drain(..count).collect()
            }
            Err(_) => return,
        };
        run_round(&mut round, &self.stats, None);
    }

    /// Queues a request; `done` runs on the sync thread when it completes.
    pub fn submit(
        &self,
        request: SyncRequest,
        done: impl FnOnce(SyncRequest, Result<(), SyncError>) + Send + 'static,
    ) {
        let job = Job {
            request,
            done: Box::new(done),
        };
        if let Some(held) = &self.held {
            if let Ok(mut jobs) = held.lock() {
                jobs.push(job);
                return;
            }
        }
        let unsent = match &self.sender {
            Some(sender) => sender.send(job).err().map(|e| e.0),
            None => Some(job),
        };
        // The thread only stops when the syncer is dropped; should it have died,
        // sync inline rather than lose the request.
        if let Some(job) = unsent {
            let result = job.request.run();
            (job.done)(job.request, result);
        }
    }

    /// The counters.
    pub fn stats(&self) -> &SyncerStats {
        &self.stats
    }
}

impl Drop for Syncer {
    fn drop(&mut self) {
        self.sender = None;
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        if let Some(pool) = self.pool.take() {
            pool.stop();
        }
        for helper in self.helpers.drain(..) {
            let _ = helper.join();
        }
    }
}

/// The files of the round being synced, shared by the sync thread and its helpers.
#[derive(Default, Debug)]
struct Pool {
    state: std::sync::Mutex<PoolState>,
    /// Helpers wait here for files.
    work: std::sync::Condvar,
    /// The sync thread waits here for the round's last file.
    done: std::sync::Condvar,
}

#[derive(Default, Debug)]
struct PoolState {
    /// Files not yet taken, each with its requests.
    files: Vec<Vec<Job>>,
    /// Files taken or not whose sync has not finished.
    unfinished: usize,
    stop: bool,
}

impl Pool {
    /// A helper's life: sync files as rounds offer them, until the syncer stops.
    fn help(&self, stats: &SyncerStats) {
        loop {
            let file = {
                let Ok(mut state) = self.state.lock() else {
                    return;
                };
                loop {
                    if let Some(file) = state.files.pop() {
                        break file;
                    }
                    if state.stop {
                        return;
                    }
                    state = match self.work.wait(state) {
                        Ok(state) => state,
                        Err(_) => return,
                    };
                }
            };
            let _finished = Finished(self);
            sync_file(file, stats);
        }
    }

    fn finished(&self) {
        if let Ok(mut state) = self.state.lock() {
            state.unfinished -= 1;
            if state.unfinished == 0 {
                self.done.notify_all();
            }
        }
    }

    /// Syncs `files` on the calling thread and the helpers, and returns when all
    /// are synced; gives them back unsynced if the pool's lock is poisoned.
    fn sync_all(&self, files: Vec<Vec<Job>>, stats: &SyncerStats) -> Result<(), Vec<Vec<Job>>> {
        {
            let Ok(mut state) = self.state.lock() else {
                return Err(files);
            };
            state.unfinished += files.len();
            state.files.extend(files);
        }
        self.work.notify_all();
        loop {
            let file = match self.state.lock() {
                Ok(mut state) => state.files.pop(),
                Err(_) => None,
            };
            let Some(file) = file else {
                break;
            };
            let _finished = Finished(self);
            sync_file(file, stats);
        }
        if let Ok(mut state) = self.state.lock() {
            while state.unfinished > 0 {
                state = match self.done.wait(state) {
                    Ok(state) => state,
                    Err(_) => return Ok(()),
                };
            }
        }
        Ok(())
    }

    fn stop(&self) {
        if let Ok(mut state) = self.state.lock() {
            state.stop = true;
        }
        self.work.notify_all();
    }
}

/// Counts a file's sync finished when dropped, even by a callback's panic, so the
/// round's waiter is never left waiting.
struct Finished<'a>(&'a Pool);

impl Drop for Finished<'_> {
    fn drop(&mut self) {
        self.0.finished();
    }
}

fn run(receiver: &mpsc::Receiver<Job>, stats: &SyncerStats, pool: &Pool) {
    let mut round: Vec<Job> = Vec::new();
    while let Ok(first) = receiver.recv() {
        round.push(first);
        while round.len() < SYNC_ROUND_REQUESTS_MAX {
            match receiver.try_recv() {
                Ok(job) => round.push(job),
                Err(_) => break,
            }
        }
        run_round(&mut round, stats, Some(pool));
    }
}

/// Runs `round`'s requests and callbacks, emptying it. One fdatasync per distinct file
/// covers every request for it in the round: all their bytes were written before the
/// sync starts. With a `pool`, the files are synced at once on its threads (each
/// request's callback still follows its file's sync); without one, in the order of
/// their first request, so a simulator that runs a held round sees the same order
/// every run.
fn run_round(round: &mut Vec<Job>, stats: &SyncerStats, pool: Option<&Pool>) {
    let mut files: Vec<Vec<Job>> = Vec::new();
    let mut index_of: std::collections::HashMap<*const File, usize> =
        std::collections::HashMap::new();
    for job in round.drain(..) {
        let at = *index_of
            .entry(Arc::as_ptr(&job.request.file))
            .or_insert_with(|| {
                files.push(Vec::new());
                files.len() - 1
            });
        files[at].push(job);
    }
    if let Some(pool) = pool.filter(|_| files.len() > 1) {
        // In their order, as far as the threads allow: they are popped from the end.
        files.reverse();
        match pool.sync_all(files, stats) {
            Ok(()) => return,
            Err(unsynced) => {
                files = unsynced;
                files.reverse();
            }
        }
    }
    for file in files {
        sync_file(file, stats);
    }
}

/// One `fdatasync` of the file of `requests`, then each request's callback.
fn sync_file(requests: Vec<Job>, stats: &SyncerStats) {
    let Some(first) = requests.first() else {
        return;
    };
    let result = first.request.run();
    stats.fsyncs.fetch_add(1, Ordering::Relaxed);
    stats
        .requests
        .fetch_add(requests.len() as u64, Ordering::Relaxed);
    for job in requests {
        (job.done)(job.request, result.clone());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A held syncer runs nothing until told, then the oldest requests as one round on
    /// the caller's thread (the disk hook sees the syncs), in the order they came.
    #[test]
    fn a_held_syncer_runs_its_requests_when_told_and_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let path: Arc<std::path::Path> = dir.path().join("f").into();
        let file = Arc::new(File::create(&path).unwrap());
        let syncer = Syncer::held();
        let (done_tx, done_rx) = mpsc::channel();
        for i in 0..3u64 {
            let mut request = SyncRequest::for_file(Arc::clone(&file), Arc::clone(&path));
            request.next_offset = i;
            let tx = done_tx.clone();
            syncer.submit(request, move |request, result| {
                tx.send((request.next_offset, result)).unwrap();
            });
        }
        assert_eq!(syncer.held_len(), 3);
        assert!(done_rx.try_recv().is_err(), "nothing ran yet");
        crate::disk::hook::start_tracing();
        syncer.run_held(2);
        let trace = crate::disk::hook::take().unwrap().trace;
        let syncs = trace
            .iter()
            .filter(|e| matches!(e, crate::disk::hook::Event::Sync { .. }))
            .count();
        assert_eq!(
            syncs, 1,
            "two requests of one file, one sync, here: {trace:?}"
        );
        let done: Vec<u64> = done_rx.try_iter().map(|(offset, _)| offset).collect();
        assert_eq!(done, vec![0, 1], "the two oldest, in order");
        assert_eq!(syncer.held_len(), 1);
        syncer.run_held(usize::MAX);
        assert_eq!(done_rx.try_iter().count(), 1);
        assert_eq!((syncer.stats().requests(), syncer.stats().fsyncs()), (3, 2));
    }

    /// Rounds of many files are synced on the pool's threads: every request is
    /// answered once, successfully, and a file's requests in one round share a sync.
    #[test]
    fn many_files_are_synced_at_once_and_every_request_answered() {
        let dir = tempfile::tempdir().unwrap();
        let files: Vec<(Arc<File>, Arc<std::path::Path>)> = (0..64)
            .map(|i| {
                let path: Arc<std::path::Path> = dir.path().join(format!("f{i}")).into();
                let mut file = File::create(&path).unwrap();
                std::io::Write::write_all(&mut file, b"record").unwrap();
                (Arc::new(file), path)
            })
            .collect();
        let syncer = Syncer::start("test-sync").unwrap();
        let (done_tx, done_rx) = mpsc::channel();
        for round in 0..3u64 {
            for (i, (file, path)) in files.iter().enumerate() {
                let mut request = SyncRequest::for_file(Arc::clone(file), Arc::clone(path));
                request.next_offset = round * 1_000 + i as u64;
                let tx = done_tx.clone();
                syncer.submit(request, move |request, result| {
                    tx.send((request.next_offset, result)).unwrap();
                });
            }
        }
        drop(done_tx);
        let mut answered: Vec<u64> = Vec::new();
        for (offset, result) in done_rx.iter().take(3 * 64) {
            assert_eq!(result, Ok(()));
            answered.push(offset);
        }
        answered.sort_unstable();
        let expected: Vec<u64> = (0..3u64)
            .flat_map(|round| (0..64).map(move |i| round * 1_000 + i))
            .collect();
        assert_eq!(answered, expected, "each request answered once");
        assert_eq!(syncer.stats().requests(), 3 * 64);
        assert!(syncer.stats().fsyncs() <= 3 * 64);
        drop(syncer);
    }
}
