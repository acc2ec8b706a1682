//! Directories made durable: a new directory or file exists after a power cut only once
//! its parent directory has been synced, so every creation syncs its parent, up the
//! chain of what it created.

use std::path::Path;

/// Syncs `dir`, making the creations, renames and removals in it durable.
///
/// # Errors
/// The open or the `fsync` failed. The caller must treat the failure as a failed
/// sync: what it made durable is unknown, and a retry may report a success it has not
/// earned.
pub fn sync_dir(dir: &Path) -> std::io::Result<()> {
    crate::disk::sync_dir(dir)
}

/// Creates `dir` and every missing ancestor, syncing the parent of each directory it
/// created (deepest last), so the whole new chain survives a power cut. An existing
/// `dir` is left as it is.
///
/// # Errors
/// A creation or a sync failed.
pub fn create_dir_durable(dir: &Path) -> std::io::Result<()> {
    let mut missing = Vec::new();
    let mut at = Some(dir);
    while let Some(path) = at.filter(|p| !p.as_os_str().is_empty()) {
        if path.is_dir() {
            break;
        }
        missing.push(path);
        at = path.parent();
    }
    if missing.is_empty() {
        return Ok(());
    }
    for created in missing.iter().rev() {
        match crate::disk::create_dir(created) {
            Ok(()) => {}
            // Another thread (a shard opening a sibling partition) made it first; its
            // parent is still synced here, as this caller relies on it.
            Err(err) if err.kind() == std::io::ErrorKind::AlreadyExists && created.is_dir() => {}
            Err(err) => return Err(err),
        }
        if let Some(parent) = created.parent().filter(|p| !p.as_os_str().is_empty()) {
            sync_dir(parent)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn creates_the_missing_chain_and_leaves_an_existing_one() {
        let root = tempfile::tempdir().unwrap();
        let deep = root.path().join("a").join("b").join("c");
        create_dir_durable(&deep).unwrap();
        assert!(deep.is_dir());
        create_dir_durable(&deep).unwrap();
        // Threads racing to create siblings under one new parent all succeed.
        let parent = root.path().join("race");
        let threads: Vec<_> = (0..8)
            .map(|i| {
                let dir = parent.join(i.to_string());
                std::thread::spawn(move || create_dir_durable(&dir))
            })
            .collect();
        for thread in threads {
            thread.join().unwrap().unwrap();
        }
        // A file where a directory should be is an error, not a silent success.
        let file = root.path().join("f");
        std::fs::write(&file, b"x").unwrap();
        assert!(create_dir_durable(&file.join("d")).is_err());
    }
}
