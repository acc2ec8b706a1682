//! What an open of the states table warns of: copies without an intact header, and
//! damaged slots (the first few of each copy one by one, the rest counted).

use super::{CopyRead, GroupStates, WARNINGS_PER_COPY_MAX};

impl GroupStates {
    pub(super) fn warn_of_copies(&self, copies: &[CopyRead; 2]) {
        for (path, copy) in self.paths.iter().zip(copies) {
            if let Err(reason) = &copy.count {
                tracing::warn!(
                    path = %path.display(),
                    reason = %reason,
                    "replica states: copy without an intact header; the other copy's \
                     slots are used and this copy is written again"
                );
            }
        }
    }

    pub(super) fn warn_of_slots(&self, damaged_at: &[Vec<u64>; 2]) {
        for (path, offsets) in self.paths.iter().zip(damaged_at) {
            for &offset in offsets.iter().take(WARNINGS_PER_COPY_MAX) {
                tracing::warn!(
                    path = %path.display(),
                    offset,
                    "replica states: damaged slot; the other copy's is used if intact, \
                     and written back"
                );
            }
            if offsets.len() > WARNINGS_PER_COPY_MAX {
                tracing::warn!(
                    path = %path.display(),
                    slots = offsets.len(),
                    "replica states: damaged slots in this copy"
                );
            }
        }
    }
}
