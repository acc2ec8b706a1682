//! Write-behind and drop-behind for the active segment.
//!
//! Left alone, the kernel lets gigabytes of a fast writer's pages go dirty and then
//! throttles the writer while its flusher catches up; on the development VMs that cut
//! a sustained 1 KiB-record produce to about a quarter. So the log starts write-back
//! itself every `write_behind_bytes` (without waiting), and, optionally, drops the pages
//! that lie more than `cached_tail_bytes` behind the head once they are written back,
//! so the page cache of a busy log stays bounded and its pages are reused while warm.
//! Neither makes anything durable; that is `fsync`'s job alone.
//!
//! [`WriteBehind`] decides the ranges (pure); [`start`] and [`drop_cached`] are the two
//! system calls, `sync_file_range(2)` and `posix_fadvise(2)`. They are the crate's only
//! `unsafe`: no safe wrapper crate we use exposes them, and each takes a descriptor
//! borrowed from a live `File` and integers, touching no memory of ours.

#![allow(unsafe_code)]

use std::fs::File;
use std::ops::Range;

/// Where write-back and cache dropping have reached in the active segment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct WriteBehind {
    /// Base offset of the segment the positions belong to.
    segment: u64,
    /// Write-back has been started for `[0, started)`.
    started: u64,
    /// Pages of `[0, dropped)` have been dropped from the cache.
    dropped: u64,
}

/// What to do after an append.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct Actions {
    /// Start write-back of this range.
    pub(crate) write_back: Option<Range<u64>>,
    /// Drop the cached pages of this range.
    pub(crate) drop: Option<Range<u64>>,
}

impl WriteBehind {
    /// The ranges to act on now that segment `segment` holds `end` bytes: write-back of
    /// everything since the last start once a whole `window` has built up, and a drop
    /// of what lies more than `tail` behind the last started write-back (so dropped
    /// pages had at least `tail` bytes of writing to get clean).
    pub(crate) fn after_append(
        &mut self,
        segment: u64,
        end: u64,
        window: u64,
        tail: Option<u64>,
    ) -> Actions {
        if segment != self.segment {
            *self = Self {
                segment,
                ..Self::default()
            };
        }
        let mut actions = Actions::default();
        if window == 0 || end < self.started.saturating_add(window) {
            return actions;
        }
        actions.write_back = Some(self.started..end);
        self.started = end;
        if let Some(tail) = tail {
            let drop_to = self.started.saturating_sub(tail.max(window));
            if drop_to > self.dropped {
                actions.drop = Some(self.dropped..drop_to);
                self.dropped = drop_to;
            }
        }
        actions
    }
}

/// Starts write-back of the dirty pages of `[offset, offset + len)` of `file` and
/// returns at once (`SYNC_FILE_RANGE_WRITE`). Makes nothing durable: metadata and the
/// disk cache are untouched, which is `fsync`'s job.
#[cfg(target_os = "linux")]
pub(crate) fn start(file: &File, offset: u64, len: u64) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let (Ok(offset), Ok(len)) = (i64::try_from(offset), i64::try_from(len)) else {
        return Err(std::io::Error::from(std::io::ErrorKind::InvalidInput));
    };
    // SAFETY: the descriptor stays open for the call (borrowed from `file`), and
    // sync_file_range touches no user memory.
    let rc = unsafe {
        libc::sync_file_range(file.as_raw_fd(), offset, len, libc::SYNC_FILE_RANGE_WRITE)
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Drops the clean cached pages of `[offset, offset + len)` of `file`
/// (`POSIX_FADV_DONTNEED`); pages still dirty or under write-back stay.
#[cfg(target_os = "linux")]
pub(crate) fn drop_cached(file: &File, offset: u64, len: u64) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let (Ok(offset), Ok(len)) = (i64::try_from(offset), i64::try_from(len)) else {
        return Err(std::io::Error::from(std::io::ErrorKind::InvalidInput));
    };
    // SAFETY: as for `start`: a borrowed open descriptor, no user memory.
    let rc =
        unsafe { libc::posix_fadvise(file.as_raw_fd(), offset, len, libc::POSIX_FADV_DONTNEED) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::from_raw_os_error(rc))
    }
}

/// Elsewhere the page cache is left to the kernel.
#[cfg(not(target_os = "linux"))]
pub(crate) fn drop_cached(_file: &File, _offset: u64, _len: u64) -> std::io::Result<()> {
    Ok(())
}

/// Elsewhere the kernel's own write-back is all there is.
#[cfg(not(target_os = "linux"))]
pub(crate) fn start(_file: &File, _offset: u64, _len: u64) -> std::io::Result<()> {
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn windows_start_write_back_and_the_tail_is_dropped_behind_it() {
        let mut wb = WriteBehind::default();
        let mib = 1u64 << 20;
        // Under a window: nothing.
        assert_eq!(
            wb.after_append(0, 5 * mib, 8 * mib, Some(16 * mib)),
            Actions::default()
        );
        // A window: write-back of all of it; nothing far enough behind to drop.
        assert_eq!(
            wb.after_append(0, 9 * mib, 8 * mib, Some(16 * mib)),
            Actions {
                write_back: Some(0..9 * mib),
                drop: None
            }
        );
        assert_eq!(
            wb.after_append(0, 30 * mib, 8 * mib, Some(16 * mib)),
            Actions {
                write_back: Some(9 * mib..30 * mib),
                drop: Some(0..14 * mib)
            }
        );
        assert_eq!(
            wb.after_append(0, 40 * mib, 8 * mib, Some(16 * mib)),
            Actions {
                write_back: Some(30 * mib..40 * mib),
                drop: Some(14 * mib..24 * mib)
            }
        );
        // Without a tail nothing is dropped; a new segment starts from its beginning.
        assert_eq!(
            wb.after_append(7, 8 * mib, 8 * mib, None),
            Actions {
                write_back: Some(0..8 * mib),
                drop: None
            }
        );
        // A zero window turns it off.
        assert_eq!(wb.after_append(7, 100 * mib, 0, None), Actions::default());
    }

    #[test]
    fn write_back_starts_on_a_real_file_and_refuses_nonsense() {
        let mut file = tempfile::tempfile().unwrap();
        file.write_all(&vec![7u8; 1 << 20]).unwrap();
        start(&file, 0, 1 << 20).unwrap();
        // A range past the end is fine (nothing to write); a negative one is not.
        start(&file, 1 << 30, 4096).unwrap();
        assert!(start(&file, u64::MAX, 1).is_err());
        file.sync_data().unwrap();
        drop_cached(&file, 0, 1 << 20).unwrap();
        assert!(drop_cached(&file, u64::MAX, 1).is_err());
    }
}
