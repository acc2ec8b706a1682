//! The shard count a data directory keeps, and the states tables it must hold.
//!
//! Each shard keeps its partition groups' durable states in its own table,
//! `replication/shard-N.{0,1}`, and a partition belongs to the shard its key hashes to
//! among `shards`. Started with another count, a partition would be opened by a shard
//! whose table never held its state: its replica would restart at view 0 with a trusted
//! journal, having forgotten the views it voted in (amnesia, which a cluster must never
//! see). So the count is recorded in `replication/shards` once a start has opened every
//! shard (each shard's table is made at its first open, before any of its groups), and a
//! start with another count is refused, naming both. A directory from before the record
//! infers the count from the tables it holds. With the record there, a table missing
//! whole is damage, not a new shard: a single node refuses to start, naming it; a member
//! of a cluster starts, and each group of that shard with files restarts as a replica
//! that lost its disk (`PartitionGroups::add`).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use braid_storage::disk;

/// The file that records the count.
const FILE: &str = "shards";

/// Why the shard count cannot be used with this data directory.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ShardCountError {
    /// The directory was made with another count.
    #[error(
        "{} holds the partition states of {found} shards, but this node runs {shards}: a data \
         directory keeps the shard count it was made with (the default, one per core, \
         changes with the machine); start it with shards = {found} (--shards {found})",
        dir.display()
    )]
    Changed {
        /// `DATA_DIR/replication`.
        dir: PathBuf,
        /// The count it was made with.
        found: usize,
        /// The count asked for.
        shards: usize,
    },
    /// The record does not read as a count.
    #[error("{} does not hold a shard count ({what}): restore it, or write the count the directory was made with", path.display())]
    Damaged {
        /// The file.
        path: PathBuf,
        /// What it holds instead.
        what: String,
    },
    /// A single node's states table is gone (both copies): its partitions' durable
    /// states are lost, and a single node has no peer that holds them.
    #[error(
        "{} and {} are both gone, though this node opened that shard before: its \
         partitions' durable states are lost. Restore them (or the directory) from a \
         backup; a single node has no peer to take them from",
        files[0].display(),
        files[1].display()
    )]
    TableGone {
        /// The two copies.
        files: [PathBuf; 2],
    },
    /// The record could not be read or written.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
}

/// Checks, before anything opens, that `dir` (`DATA_DIR/replication`) was made with
/// `shards` shards and, where the count is recorded, that every shard's states table is
/// there (a single node refuses; a member, `clustered`, warns: its groups repair).
///
/// # Errors
/// The count differs from the one recorded (or, without a record, from the tables'),
/// the record is damaged or unreadable, or a single node's table is gone.
pub(crate) fn check(dir: &Path, shards: usize, clustered: bool) -> Result<(), ShardCountError> {
    let path = dir.join(FILE);
    let io = |source| ShardCountError::Io {
        path: path.clone(),
        source,
    };
    let recorded = match std::fs::read(&path) {
        Ok(bytes) => Some(parse(&bytes).ok_or_else(|| ShardCountError::Damaged {
            path: path.clone(),
            what: format!(
                "{} bytes: {:?}",
                bytes.len(),
                String::from_utf8_lossy(&bytes)
            ),
        })?),
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => None,
        Err(err) => return Err(io(err)),
    };
    let tables = tables_found(dir).map_err(io)?;
    let found = recorded.or_else(|| tables.last().map(|last| last + 1));
    if let Some(found) = found.filter(|found| *found != shards) {
        return Err(ShardCountError::Changed {
            dir: dir.to_owned(),
            found,
            shards,
        });
    }
    if recorded.is_some() {
        for shard in (0..shards).filter(|shard| !tables.contains(shard)) {
            let files = [0, 1].map(|copy| dir.join(format!("shard-{shard}.{copy}")));
            let gone = ShardCountError::TableGone { files };
            if !clustered {
                return Err(gone);
            }
            tracing::warn!(
                %gone,
                "the groups of this shard with files restart as replicas that lost their \
                 disk and take their state from their peers"
            );
        }
    }
    Ok(())
}

/// Records `shards` in `dir` once a start opened every shard (each made its states
/// table), unless it is recorded already.
///
/// # Errors
/// The record cannot be written.
pub(crate) fn record(dir: &Path, shards: usize) -> Result<(), ShardCountError> {
    let path = dir.join(FILE);
    if path.exists() {
        return Ok(());
    }
    write_record(dir, &path, shards).map_err(|source| ShardCountError::Io { path, source })
}

/// The count a record holds: decimal digits and a newline, never 0.
fn parse(bytes: &[u8]) -> Option<usize> {
    let text = std::str::from_utf8(bytes).ok()?.strip_suffix('\n')?;
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok().filter(|count| *count > 0)
}

/// The shard numbers of the states tables in `dir` (either copy).
fn tables_found(dir: &Path) -> std::io::Result<BTreeSet<usize>> {
    let mut found = BTreeSet::new();
    for entry in std::fs::read_dir(dir)? {
        let name = entry?.file_name();
        let Some(name) = name.to_str() else {
            continue;
        };
        let shard = name
            .strip_prefix("shard-")
            .and_then(|rest| rest.strip_suffix(".0").or_else(|| rest.strip_suffix(".1")))
            .and_then(|n| n.parse::<usize>().ok());
        if let Some(shard) = shard {
            found.insert(shard);
        }
    }
    Ok(found)
}

/// Writes the record durably: a temporary file synced, renamed over it, the directory
/// synced.
fn write_record(dir: &Path, path: &Path, shards: usize) -> std::io::Result<()> {
    let tmp = dir.join(format!("{FILE}.tmp"));
    disk::write_file(&tmp, format!("{shards}\n").as_bytes())?;
    disk::sync_data(&std::fs::File::open(&tmp)?, &tmp)?;
    disk::rename(&tmp, path)?;
    disk::sync_dir(dir)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn touch(dir: &Path, name: &str) {
        std::fs::write(dir.join(name), b"x").unwrap();
    }

    #[test]
    fn a_directory_keeps_its_count_once_recorded() {
        let dir = tempfile::tempdir().unwrap();
        check(dir.path(), 2, false).unwrap();
        for name in ["shard-0.0", "shard-0.1", "shard-1.0", "shard-1.1"] {
            touch(dir.path(), name);
        }
        record(dir.path(), 2).unwrap();
        assert_eq!(std::fs::read(dir.path().join(FILE)).unwrap(), b"2\n");
        check(dir.path(), 2, false).unwrap();
        let err = check(dir.path(), 4, false).unwrap_err();
        assert!(
            matches!(
                err,
                ShardCountError::Changed {
                    found: 2,
                    shards: 4,
                    ..
                }
            ),
            "{err}"
        );
        assert!(err.to_string().contains("--shards 2"), "{err}");
        record(dir.path(), 4).unwrap();
        assert_eq!(
            std::fs::read(dir.path().join(FILE)).unwrap(),
            b"2\n",
            "a record is never rewritten"
        );
    }

    /// A directory from before the record: the count is its tables'.
    #[test]
    fn without_a_record_the_tables_tell_the_count() {
        let dir = tempfile::tempdir().unwrap();
        for name in [
            "shard-0.0",
            "shard-0.1",
            "shard-1.0",
            "shard-2.1",
            "shard-2.tmp",
        ] {
            touch(dir.path(), name);
        }
        let fewer = check(dir.path(), 2, false).unwrap_err();
        assert!(
            matches!(
                fewer,
                ShardCountError::Changed {
                    found: 3,
                    shards: 2,
                    ..
                }
            ),
            "{fewer}"
        );
        let more = check(dir.path(), 4, false).unwrap_err();
        assert!(matches!(more, ShardCountError::Changed { found: 3, .. }));
        check(dir.path(), 3, false).unwrap();
    }

    /// Once recorded, a table gone whole is damage: a single node refuses, naming both
    /// copies; a member of a cluster starts (its groups repair). One copy left is the
    /// table's own business (it rebuilds the other).
    #[test]
    fn a_table_gone_whole_is_refused_on_a_single_node() {
        let dir = tempfile::tempdir().unwrap();
        for name in ["shard-0.0", "shard-0.1", "shard-1.1"] {
            touch(dir.path(), name);
        }
        record(dir.path(), 2).unwrap();
        check(dir.path(), 2, false).unwrap();
        std::fs::remove_file(dir.path().join("shard-1.1")).unwrap();
        let err = check(dir.path(), 2, false).unwrap_err();
        assert!(matches!(err, ShardCountError::TableGone { .. }), "{err}");
        assert!(err.to_string().contains("shard-1.0"), "{err}");
        check(dir.path(), 2, true).unwrap();
    }

    #[test]
    fn a_damaged_record_is_refused_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        for bytes in [
            &b"2"[..],
            b"",
            b"0\n",
            b"two\n",
            b"\xff\n",
            b"99999999999999999999999\n",
        ] {
            std::fs::write(dir.path().join(FILE), bytes).unwrap();
            let err = check(dir.path(), 2, false).unwrap_err();
            assert!(
                matches!(err, ShardCountError::Damaged { .. }),
                "{bytes:?}: {err}"
            );
            assert!(err.to_string().contains("shards"), "{err}");
        }
    }
}
