//! Buffers that fetches read into, reused across fetches and shards.
//!
//! A fetch reads up to a few megabytes from the log into a buffer, which travels to the
//! connection's writer and comes back here once the answer is written. Reusing it
//! spares an allocation, the zeroing of the bytes the read is about to overwrite, and
//! (on virtual machines that hand freed memory back to the host) the first touch of
//! fresh pages, which in profiles of catch-up reads cost more than the read itself.

use std::sync::Mutex;

/// Buffers kept for reuse, at most; more are freed. With [`BUFFER_BYTES_MAX`] this
/// bounds what an idle node holds here to 128 MiB (typically 16 fetches of 4 MiB).
const POOLED_MAX: usize = 16;
/// A buffer grown past this (by an unusually large fetch) is freed, not kept.
const BUFFER_BYTES_MAX: usize = 8 << 20;

/// The node's pool of read buffers. A lock, not a queue per shard: it is taken once per
/// fetch, and a buffer may come back on another shard's thread.
#[derive(Debug, Default)]
pub(crate) struct ReadBuffers {
    free: Mutex<Vec<Vec<u8>>>,
}

impl ReadBuffers {
    /// A buffer to read into: a used one if any, else a new empty one.
    pub(crate) fn take(&self) -> Vec<u8> {
        self.free
            .lock()
            .ok()
            .and_then(|mut free| free.pop())
            .unwrap_or_default()
    }

    /// Hands a buffer back once its bytes are written.
    pub(crate) fn give_back(&self, buffer: Vec<u8>) {
        if buffer.capacity() == 0 || buffer.capacity() > BUFFER_BYTES_MAX {
            return;
        }
        if let Ok(mut free) = self.free.lock() {
            if free.len() < POOLED_MAX {
                free.push(buffer);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_come_back_bounded_in_number_and_size() {
        let pool = ReadBuffers::default();
        assert_eq!(pool.take().capacity(), 0);
        let buffer = vec![1u8; 4096];
        let at = buffer.as_ptr();
        pool.give_back(buffer);
        let again = pool.take();
        assert_eq!(again.as_ptr(), at, "the same allocation is reused");
        assert_eq!(
            again.len(),
            4096,
            "its length stays, so reads need no zeroing"
        );
        pool.give_back(Vec::with_capacity(BUFFER_BYTES_MAX + 1));
        assert_eq!(pool.take().capacity(), 0, "oversized buffers are freed");
        for _ in 0..POOLED_MAX + 5 {
            pool.give_back(vec![0u8; 16]);
        }
        assert_eq!(pool.free.lock().unwrap().len(), POOLED_MAX);
    }
}
