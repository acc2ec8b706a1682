//! Per-log settings.

/// When appended data is forced to disk with `fdatasync`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FsyncPolicy {
    /// Every append is durable before it is acknowledged. Appends that arrive while a
    /// sync is running share the next one (group commit).
    Always,
    /// Data is synced at most this many milliseconds after it was appended; a crash can
    /// lose the appends of the last interval.
    Interval {
        /// The longest time appended data may stay only in the page cache.
        interval_ms: u64,
    },
    /// Data is synced only when a log segment is sealed and when the log is closed;
    /// durability comes from replication, and a crash of the whole node can lose what
    /// the kernel had not written back.
    Never,
}

/// What opening a log does when the newest log segment holds a damaged batch that is
/// followed by an intact one (damage in the middle, not a torn tail).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecoveryMode {
    /// Refuse to open, naming the file and byte position. The default: opening never
    /// drops data silently.
    Strict,
    /// Cut the segment at the damaged batch and open, reporting what was dropped. For an
    /// operator who decided the suffix is lost (or that replicas will restore it).
    TruncateAtDamage,
    /// Open to read what lies before the first damage, cutting nothing: the log ends,
    /// in memory only, at damage in its newest segment or at a segment missing from its
    /// middle, and it takes no writes. For a partition refused on a single node, which
    /// serves the records it holds intact and keeps the rest for an operator to restore.
    ReadToDamage,
}

/// Settings of one partition log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogConfig {
    /// A log segment is sealed and a new one started before it would grow past this.
    pub segment_bytes_max: u32,
    /// A log segment older than this (since its first append) is sealed at the next
    /// append. `None`: no age limit.
    pub segment_age_ms_max: Option<u64>,
    /// One offset index entry (and at most one time index entry) per this many bytes.
    pub index_interval_bytes: u32,
    /// When appends are forced to disk.
    pub fsync: FsyncPolicy,
    /// Delete the oldest sealed log segments while the log stays at least this big
    /// without them. `None`: no size limit.
    pub retention_bytes: Option<u64>,
    /// Delete sealed log segments whose newest record is older than this. `None`: keep.
    pub retention_ms: Option<u64>,
    /// What to do with damage in the middle of the newest log segment.
    pub recovery: RecoveryMode,
    /// Start the kernel's write-back each time this many bytes have been appended,
    /// without waiting for it; 0: leave write-back to the kernel. Durability is
    /// unchanged (only `fsync` decides it); write-back just runs steadily in large
    /// writes instead of piling up and throttling the writer.
    pub write_behind_bytes: u64,
    /// Drop the page-cache pages of the active segment that lie more than this many
    /// bytes behind its head, once their write-back has had that long to finish;
    /// `None`: leave the page cache to the kernel. Bounds a busy log's page cache and
    /// reuses its pages while warm; consumers further behind read from disk.
    pub cached_tail_bytes: Option<u64>,
}

impl Default for LogConfig {
    fn default() -> Self {
        Self {
            segment_bytes_max: 1 << 30,
            segment_age_ms_max: Some(7 * 24 * 3600 * 1000),
            index_interval_bytes: 4096,
            fsync: FsyncPolicy::Never,
            retention_bytes: None,
            retention_ms: Some(7 * 24 * 3600 * 1000),
            recovery: RecoveryMode::Strict,
            write_behind_bytes: WRITE_BEHIND_BYTES_DEFAULT,
            cached_tail_bytes: None,
        }
    }
}

/// The default write-behind window: large enough that each call starts a big write,
/// small enough that a log's dirty bytes stay a few windows.
pub const WRITE_BEHIND_BYTES_DEFAULT: u64 = 8 << 20;

/// The smallest allowed `segment_bytes_max`: one header must fit.
pub const SEGMENT_BYTES_MIN: u32 = 1024;
/// The largest allowed `segment_bytes_max`. Index entries hold 32-bit positions and a
/// batch may start just below the limit, so the limit leaves room for a whole batch.
pub const SEGMENT_BYTES_MAX: u32 = i32::MAX as u32;

/// A setting that cannot work.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid log setting {setting} = {value}: {reason}")]
pub struct ConfigError {
    /// The setting.
    pub setting: &'static str,
    /// Its value.
    pub value: u64,
    /// Why it is refused.
    pub reason: &'static str,
}

impl LogConfig {
    /// Checks the settings.
    ///
    /// # Errors
    /// The first setting out of range.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let refuse = |setting, value: u64, reason| {
            Err(ConfigError {
                setting,
                value,
                reason,
            })
        };
        if !(SEGMENT_BYTES_MIN..=SEGMENT_BYTES_MAX).contains(&self.segment_bytes_max) {
            return refuse(
                "segment_bytes_max",
                self.segment_bytes_max.into(),
                "must be between 1 KiB and 2 GiB - 1",
            );
        }
        if self.index_interval_bytes == 0 {
            return refuse("index_interval_bytes", 0, "must be at least 1");
        }
        if let Some(0) = self.segment_age_ms_max {
            return refuse("segment_age_ms_max", 0, "must be at least 1 ms");
        }
        if let FsyncPolicy::Interval { interval_ms: 0 } = self.fsync {
            return refuse("fsync.interval_ms", 0, "use `always` instead of 0 ms");
        }
        Ok(())
    }
}
