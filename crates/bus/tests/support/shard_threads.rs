//! One current-thread runtime per shard, each on a thread named `node{n}-shard{s}`,
//! standing in for a node's shard threads. Shared by the link tests and the bus bench
//! (`#[path]`-included, so it lives outside any test target of its own).

use std::io;

/// The shard threads of one node; they stop when this is dropped.
#[derive(Debug)]
pub(crate) struct ShardThreads {
    /// One runtime handle per shard, in shard order.
    pub(crate) handles: Vec<tokio::runtime::Handle>,
    stops: Vec<tokio::sync::oneshot::Sender<()>>,
}

impl ShardThreads {
    /// Starts `shards` threads for node `node`.
    pub(crate) fn start(node: u8, shards: u16) -> io::Result<Self> {
        let mut threads = Self {
            handles: Vec::new(),
            stops: Vec::new(),
        };
        for shard in 0..shards {
            let (handle_tx, handle_rx) = std::sync::mpsc::channel();
            let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
            std::thread::Builder::new()
                .name(format!("node{node}-shard{shard}"))
                .spawn(move || {
                    let runtime = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build();
                    let Ok(runtime) = runtime else {
                        let _ = handle_tx.send(Err(runtime.err()));
                        return;
                    };
                    let _ = handle_tx.send(Ok(runtime.handle().clone()));
                    let _ = runtime.block_on(stopped);
                })?;
            let handle = handle_rx
                .recv()
                .map_err(|_| io::Error::other("a shard thread ended before its runtime"))?
                .map_err(|e| e.unwrap_or_else(|| io::Error::other("no runtime")))?;
            threads.handles.push(handle);
            threads.stops.push(stop);
        }
        Ok(threads)
    }
}

impl Drop for ShardThreads {
    fn drop(&mut self) {
        for stop in self.stops.drain(..) {
            let _ = stop.send(());
        }
    }
}
