//! Names of the files in a partition directory.

use std::path::{Path, PathBuf};

/// Suffix of a log segment's batch file.
pub(crate) const LOG_SUFFIX: &str = "log";
/// Suffix of a log segment's offset index.
pub(crate) const INDEX_SUFFIX: &str = "index";
/// Suffix of a log segment's time index.
pub(crate) const TIME_INDEX_SUFFIX: &str = "timeindex";
/// Suffix of a file being written before it is renamed into place.
pub(crate) const TEMP_SUFFIX: &str = "tmp";
/// Present only while the log is closed cleanly.
pub(crate) const CLEAN_MARKER: &str = "clean-shutdown";

/// The kinds of file a partition directory holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FileKind {
    Log,
    Index,
    TimeIndex,
    Temp,
}

pub(crate) fn segment_file(dir: &Path, base_offset: u64, suffix: &str) -> PathBuf {
    dir.join(format!("{base_offset:020}.{suffix}"))
}

pub(crate) fn log_path(dir: &Path, base_offset: u64) -> PathBuf {
    segment_file(dir, base_offset, LOG_SUFFIX)
}

pub(crate) fn index_path(dir: &Path, base_offset: u64) -> PathBuf {
    segment_file(dir, base_offset, INDEX_SUFFIX)
}

pub(crate) fn time_index_path(dir: &Path, base_offset: u64) -> PathBuf {
    segment_file(dir, base_offset, TIME_INDEX_SUFFIX)
}

/// Parses `{base:020}.{suffix}` (and `….{suffix}.tmp`).
pub(crate) fn parse_name(name: &str) -> Option<(u64, FileKind)> {
    if name.ends_with(&format!(".{TEMP_SUFFIX}")) {
        return Some((0, FileKind::Temp));
    }
    let (stem, suffix) = name.split_once('.')?;
    if stem.len() != 20 || !stem.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let base = stem.parse().ok()?;
    let kind = match suffix {
        LOG_SUFFIX => FileKind::Log,
        INDEX_SUFFIX => FileKind::Index,
        TIME_INDEX_SUFFIX => FileKind::TimeIndex,
        _ => return None,
    };
    Some((base, kind))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        let dir = Path::new("/d");
        let path = log_path(dir, 42);
        assert_eq!(path, Path::new("/d/00000000000000000042.log"));
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default();
        assert_eq!(parse_name(name), Some((42, FileKind::Log)));
        assert_eq!(
            parse_name("00000000000000000042.timeindex"),
            Some((42, FileKind::TimeIndex))
        );
        assert_eq!(
            parse_name("00000000000000000042.index.tmp"),
            Some((0, FileKind::Temp))
        );
        assert_eq!(parse_name("42.log"), None);
        assert_eq!(parse_name("0000000000000000004x.log"), None);
        assert_eq!(parse_name("00000000000000000042.txt"), None);
    }
}
