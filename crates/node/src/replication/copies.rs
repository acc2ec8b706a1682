//! A small file kept as two copies, each write replacing the older copy whole and
//! syncing it: a crash tears at most the copy being written, and the other still holds
//! the previous value. Readers take the newest copy that decodes.

use std::path::{Path, PathBuf};

use braid_storage::disk;

use super::shared_path::SharedPath;

/// An IO failure and the file it happened on.
pub(crate) type CopyError = (PathBuf, std::io::Error);

/// The two copies `STEM.0` and `STEM.1` in a directory.
#[derive(Debug, Clone)]
pub(crate) struct TwoCopies {
    /// `DIR/STEM`: each group holds one, so the copies' paths are made when used (three
    /// paths and a stem kept per group were a tenth of an idle partition's memory).
    base: SharedPath,
}

/// What reading the copies found.
#[derive(Debug)]
pub(crate) enum Newest<T> {
    /// Neither copy exists.
    Absent,
    /// The newest intact copy: its sequence number and value.
    Found(u64, T),
    /// Copies exist and none decodes; why, per copy.
    Damaged(String),
}

impl TwoCopies {
    #[cfg(test)]
    pub(crate) fn new(dir: &Path, stem: &str) -> Self {
        Self::at(SharedPath::whole(&dir.join(stem)))
    }

    /// The copies `base.0` and `base.1`.
    pub(crate) fn at(base: SharedPath) -> Self {
        Self { base }
    }

    /// `DIR/STEM.SUFFIX`.
    fn with_suffix(&self, suffix: &str) -> PathBuf {
        let mut path = self.base.get().into_os_string();
        path.push(".");
        path.push(suffix);
        PathBuf::from(path)
    }

    /// The copies' common path, without the suffix.
    pub(crate) fn base(&self) -> PathBuf {
        self.base.get()
    }

    fn path(&self, copy: u64) -> PathBuf {
        self.with_suffix(if copy.is_multiple_of(2) { "0" } else { "1" })
    }

    fn dir(&self) -> &Path {
        self.base.dir()
    }

    /// The newest copy `decode` accepts (it gives the copy's sequence number).
    pub(crate) fn newest<T>(
        &self,
        decode: impl Fn(&[u8]) -> Result<(u64, T), String>,
    ) -> Result<Newest<T>, CopyError> {
        let mut best: Option<(u64, T)> = None;
        let mut reasons = Vec::new();
        let mut any = false;
        for path in [self.path(0), self.path(1)] {
            let bytes = match braid_storage::disk::read(&path) {
                Ok(bytes) => bytes,
                Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
                    reasons.push(format!("{}: absent", path.display()));
                    continue;
                }
                Err(err) => return Err((path.clone(), err)),
            };
            any = true;
            match decode(&bytes) {
                Ok((seq, value)) if best.as_ref().is_none_or(|(b, _)| seq > *b) => {
                    best = Some((seq, value));
                }
                Ok(_) => {}
                Err(reason) => reasons.push(format!("{}: {reason}", path.display())),
            }
        }
        Ok(match (best, any) {
            (Some((seq, value)), _) => Newest::Found(seq, value),
            (None, false) => Newest::Absent,
            (None, true) => Newest::Damaged(reasons.join("; ")),
        })
    }

    /// Writes `bytes` over copy `seq % 2` and syncs it (and the directory, when the
    /// copy is new). The caller numbers writes so that each replaces the older copy.
    pub(crate) fn write(&self, seq: u64, bytes: &[u8]) -> Result<(), CopyError> {
        let path = &self.path(seq);
        let fail = |err| (path.clone(), err);
        let (file, created) = disk::open_or_create(path).map_err(fail)?;
        disk::write_at(&file, path, bytes, 0).map_err(fail)?;
        disk::set_len(&file, path, bytes.len() as u64).map_err(fail)?;
        disk::sync_data(&file, path).map_err(fail)?;
        if created {
            let dir = self.dir();
            disk::sync_dir(dir).map_err(|err| (dir.to_owned(), err))?;
        }
        Ok(())
    }

    /// Puts `bytes` in place as copy 0 at once (written, synced, renamed, the rename
    /// synced), for a store whose absence must from then on mean damage.
    pub(crate) fn install_first(&self, bytes: &[u8]) -> Result<(), CopyError> {
        let tmp = self.with_suffix("tmp");
        let fail = |err| (tmp.clone(), err);
        disk::write_file(&tmp, bytes).map_err(fail)?;
        let file = disk::open(std::fs::OpenOptions::new().read(true), &tmp).map_err(fail)?;
        disk::sync_data(&file, &tmp).map_err(fail)?;
        let first = self.path(0);
        disk::rename(&tmp, &first).map_err(|err| (first.clone(), err))?;
        let dir = self.dir();
        disk::sync_dir(dir).map_err(|err| (dir.to_owned(), err))
    }
}
