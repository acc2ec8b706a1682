//! A file's path kept as a shared directory and a name: a partition's journal and
//! checkpoint copies live in its log's directory, and thousands of idle partitions each
//! keeping three whole paths spent about 150 bytes apiece on them (a heap profile of
//! 10,000 idle partitions). The path is made when a file is opened or named in an error.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// A file's name in its directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum FileName {
    /// The same in every directory (`vsr.journal`).
    Fixed(&'static str),
    /// `group-G` and a suffix (`group-7.checkpoint`).
    OfGroup(u64, &'static str),
    /// Any other name.
    Owned(Box<OsStr>),
}

/// A directory, shared, and a file's name in it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SharedPath {
    dir: Arc<Path>,
    name: FileName,
}

impl SharedPath {
    pub(crate) fn new(dir: Arc<Path>, name: FileName) -> Self {
        Self { dir, name }
    }

    /// `path` as it is (its directory not shared with anything).
    pub(crate) fn whole(path: &Path) -> Self {
        let dir = path.parent().unwrap_or(Path::new("."));
        let name = path.file_name().unwrap_or_default();
        Self::new(Arc::from(dir), FileName::Owned(name.into()))
    }

    /// The directory.
    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }

    /// The path, made.
    pub(crate) fn get(&self) -> PathBuf {
        match &self.name {
            FileName::Fixed(name) => self.dir.join(name),
            FileName::OfGroup(group, suffix) => self.dir.join(format!("group-{group}{suffix}")),
            FileName::Owned(name) => self.dir.join(&**name),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_name_makes_the_path_it_says() {
        let dir: Arc<Path> = Arc::from(Path::new("/data/partitions/s-t-3"));
        assert_eq!(
            SharedPath::new(dir.clone(), FileName::Fixed("vsr.journal")).get(),
            Path::new("/data/partitions/s-t-3/vsr.journal")
        );
        assert_eq!(
            SharedPath::new(dir, FileName::OfGroup(7, ".checkpoint")).get(),
            Path::new("/data/partitions/s-t-3/group-7.checkpoint")
        );
        let whole = SharedPath::whole(Path::new("/data/replication/group-0.journal"));
        assert_eq!(whole.get(), Path::new("/data/replication/group-0.journal"));
        assert_eq!(whole.dir(), Path::new("/data/replication"));
    }
}
