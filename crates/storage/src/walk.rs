//! Walking the batches of a log segment file in order.

use std::fs::File;
use std::path::Path;

use braid_proto::batch::{BatchHeader, RecordBatch, HEADER_BYTES};
use braid_proto::BatchError;

use crate::error::Corruption;

/// Bytes read at a time when only headers are needed.
const HEADER_CHUNK_BYTES: usize = 64 * 1024;
/// Bytes read at a time when whole batches are checked.
const VERIFY_CHUNK_BYTES: usize = 4 * 1024 * 1024;

/// One step of a walk.
#[derive(Debug)]
pub(crate) enum Step {
    /// A batch starts at `position`.
    Batch { position: u64, header: BatchHeader },
    /// The bytes at `position` are not a sound batch.
    Bad {
        position: u64,
        corruption: Corruption,
    },
    /// The walk reached the end.
    End,
}

/// Reads batch after batch from `position` to `end` of a file. With `verify` (the log's
/// partition tag), each batch is read whole and checked as stored (CRC and tag);
/// without, only headers are read and each batch is checked to end inside the file.
#[derive(Debug)]
pub(crate) struct Walk<'f> {
    file: &'f File,
    path: &'f Path,
    position: u64,
    end: u64,
    verify: Option<i32>,
    buf: Vec<u8>,
    buf_start: u64,
}

impl<'f> Walk<'f> {
    pub(crate) fn new(
        file: &'f File,
        path: &'f Path,
        position: u64,
        end: u64,
        verify: Option<i32>,
    ) -> Self {
        Self {
            file,
            path,
            position,
            end,
            verify,
            buf: Vec::new(),
            buf_start: 0,
        }
    }

    /// The next batch, the damage that stops the walk, or the end.
    ///
    /// # Errors
    /// A failed read.
    pub(crate) fn next_step(&mut self) -> std::io::Result<Step> {
        let position = self.position;
        if position >= self.end {
            return Ok(Step::End);
        }
        let left = self.end - position;
        let bad = |corruption| {
            Ok(Step::Bad {
                position,
                corruption,
            })
        };
        if left < HEADER_BYTES as u64 {
            return bad(Corruption::Batch(BatchError::Truncated {
                at: left as usize,
                needed: HEADER_BYTES,
                available: left as usize,
            }));
        }
        self.cover(position, HEADER_BYTES)?;
        let header = match BatchHeader::decode(self.slice(position, HEADER_BYTES)) {
            Ok(header) => header,
            Err(err) => return bad(Corruption::Batch(err)),
        };
        let total = header.total_bytes();
        if total as u64 > left {
            return bad(Corruption::Batch(BatchError::Truncated {
                at: left as usize,
                needed: total,
                available: left as usize,
            }));
        }
        if let Some(tag) = self.verify {
            self.cover(position, total)?;
            if let Err(err) = RecordBatch::check_stored(self.slice(position, total), tag) {
                return bad(Corruption::Batch(err));
            }
        }
        self.position = position + total as u64;
        Ok(Step::Batch { position, header })
    }

    /// Makes the buffer hold `[position, position + len)`.
    fn cover(&mut self, position: u64, len: usize) -> std::io::Result<()> {
        let buf_end = self.buf_start + self.buf.len() as u64;
        if position >= self.buf_start && position + len as u64 <= buf_end {
            return Ok(());
        }
        let chunk = if self.verify.is_some() {
            VERIFY_CHUNK_BYTES
        } else {
            HEADER_CHUNK_BYTES
        };
        let want = (len.max(chunk) as u64).min(self.end - position) as usize;
        self.buf.resize(want, 0);
        crate::disk::read_exact_at(self.file, self.path, &mut self.buf, position)?;
        self.buf_start = position;
        Ok(())
    }

    fn slice(&self, position: u64, len: usize) -> &[u8] {
        let from = (position - self.buf_start) as usize;
        &self.buf[from..from + len]
    }
}

/// Looks for an intact batch anywhere in `[from, end)` of the file whose base offset is
/// at least `offset_min`: proof that damage before it is not a torn tail. Only used on
/// the failure path of recovery.
///
/// # Errors
/// A failed read.
pub(crate) fn find_intact_batch(
    file: &File,
    path: &Path,
    from: u64,
    end: u64,
    offset_min: u64,
    tag: i32,
) -> std::io::Result<Option<u64>> {
    const WINDOW_BYTES: u64 = 1 << 20;
    let mut window = Vec::new();
    let mut start = from;
    while start + (HEADER_BYTES as u64) <= end {
        let len = (WINDOW_BYTES + HEADER_BYTES as u64).min(end - start) as usize;
        window.resize(len, 0);
        crate::disk::read_exact_at(file, path, &mut window, start)?;
        let last = len - HEADER_BYTES;
        for at in 0..=last {
            let Ok(header) = BatchHeader::decode(&window[at..]) else {
                continue;
            };
            let position = start + at as u64;
            let total = header.total_bytes() as u64;
            if header.base_offset < offset_min as i64 || position + total > end {
                continue;
            }
            let mut batch = vec![0u8; total as usize];
            crate::disk::read_exact_at(file, path, &mut batch, position)?;
            if RecordBatch::check_stored(&batch, tag).is_ok() {
                return Ok(Some(position));
            }
        }
        start += last as u64 + 1;
    }
    Ok(None)
}
