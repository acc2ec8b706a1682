//! The data directory at start: made durable up its chain, and read for what the
//! metadata must not forget.

use std::path::Path;

/// Makes the data directory's tree durable and returns the lowest topic id a new topic
/// may take: one above every `partitions/<topic id>` directory present.
///
/// A directory whose creation was never synced (a crash right after it) exists after a
/// restart but could still vanish in a later power cut with the records fsynced inside
/// it, so each start syncs `partitions/` and every topic directory in it (the entries
/// they hold); each partition log syncs its own directory.
///
/// # Errors
/// A listing or a sync failed.
pub(crate) fn prepare(data_dir: &Path) -> std::io::Result<u32> {
    braid_storage::create_dir_durable(data_dir)?;
    if let Some(mode) = open_to_others(data_dir)? {
        // Every record and the users' SCRAM keys are in it. The node makes its own
        // directories 0700 and files 0600; one given to it is left as the operator
        // set it, but said loudly.
        tracing::warn!(
            dir = %data_dir.display(),
            mode = format!("{mode:o}"),
            "the data directory is open to other local users, who can read every \
             record and the users' SCRAM keys: chmod 700 it"
        );
    }
    let partitions = data_dir.join("partitions");
    braid_storage::create_dir_durable(&partitions)?;
    braid_storage::sync_dir(data_dir)?;
    braid_storage::sync_dir(&partitions)?;
    let mut floor = 0u32;
    for entry in std::fs::read_dir(&partitions)? {
        let entry = entry?;
        let Some(id) = entry
            .file_name()
            .to_str()
            .and_then(|name| name.parse::<u32>().ok())
        else {
            continue;
        };
        if entry.file_type()?.is_dir() {
            braid_storage::sync_dir(&entry.path())?;
            floor = floor.max(id.saturating_add(1));
        }
    }
    Ok(floor)
}

/// The mode of `dir` if users other than its owner may enter or read it.
fn open_to_others(dir: &Path) -> std::io::Result<Option<u32>> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(dir)?.permissions().mode() & 0o777;
        Ok(Some(mode).filter(|mode| mode & 0o077 != 0))
    }
    #[cfg(not(unix))]
    {
        let _ = dir;
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_floor_is_above_every_topic_directory() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(prepare(dir.path()).unwrap(), 0);
        for topic in ["0", "7", "3"] {
            std::fs::create_dir_all(dir.path().join("partitions").join(topic).join("0")).unwrap();
        }
        std::fs::create_dir_all(dir.path().join("partitions").join("not-a-topic")).unwrap();
        assert_eq!(prepare(dir.path()).unwrap(), 8);
    }
}
