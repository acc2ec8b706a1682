//! A lone node's groups recovered together after they are opened.

use super::*;

impl PartitionGroups {
    /// Brings the lone groups opened since the last call to normal, every committed op
    /// applied, all in the same turns; what their recovery wrote is synced and
    /// reported like any write. Returns the high watermarks that moved.
    ///
    /// # Errors
    /// As [`ShardHost::tick`].
    pub(crate) fn recover_opened(&mut self) -> Result<Moved, HostError> {
        let mut moved = Vec::new();
        let groups = std::mem::take(&mut self.opened_lone);
        if !groups.is_empty() {
            let effects = self.host.recover_lone(&groups, &mut self.now)?;
            self.carry(effects, &mut moved);
            for group in groups {
                if let Some(key) = key_of(group) {
                    moved.push((key, self.high_watermark(key)));
                }
            }
        }
        Ok(moved)
    }
}
