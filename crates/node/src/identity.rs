//! The data directory's identity: which format it is written in and which cluster
//! and member it belongs to. Claimed on the first start, checked on every later one,
//! so a node never serves (or replicates) a directory of another cluster, another
//! member or a format it does not read.

use std::path::Path;

use serde::Deserialize;

/// The data directory format this build reads and writes.
///
/// Format 2 keeps the metadata as the metadata group's journal, checkpoints and
/// durable state (`metadata/group-0.*`, `metadata/shard-0.*`); format 1 kept it as an
/// op log (`metadata/ops.log`) and a snapshot.
pub const DATA_DIR_FORMAT: u32 = 2;

/// What a format-1 directory holds that a later one does not.
const FORMAT_1_OP_LOG: &str = "metadata/ops.log";
/// The identity file, in the data directory.
pub(crate) const IDENTITY_FILE: &str = "identity";

/// Why the data directory cannot be used by this node.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum IdentityError {
    /// The identity file could not be read or written.
    #[error("data directory identity {path}: {source}")]
    Io {
        /// The file.
        path: std::path::PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The identity file is damaged.
    #[error("data directory identity {path} is damaged: {reason}")]
    Damaged {
        /// The file.
        path: std::path::PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// Written by another build, in a format this one does not read.
    #[error(
        "the data directory is in format {found}, this braid reads format {DATA_DIR_FORMAT} \
         ({}); use a data directory made by this version",
        if *found > DATA_DIR_FORMAT { "it is newer: upgrade braid" } else { "it is older" }
    )]
    Format {
        /// The directory's format.
        found: u32,
    },
    /// The directory belongs to another cluster.
    #[error(
        "the data directory belongs to cluster {found:?}, not {configured:?}: a node never \
         joins a cluster with another cluster's data (use an empty data directory)"
    )]
    OtherCluster {
        /// Recorded in the directory.
        found: String,
        /// In the config.
        configured: String,
    },
    /// The directory held a node's data, and a file or directory every such node has
    /// is gone: the data is damaged, not new.
    #[error(
        "the data directory {dir} held this node's data (its identity says so), but \
         {missing} is gone: the node does not start as if it were new, which would forget \
         what it acknowledged. {way_out}"
    )]
    Missing {
        /// The data directory.
        dir: std::path::PathBuf,
        /// What is gone, relative to it.
        missing: &'static str,
        /// What the operator can do.
        way_out: &'static str,
    },
    /// A member of a cluster of several found an empty data directory without being
    /// told whether it is new or lost its data.
    #[error(
        "the data directory {dir} is empty and this node is member {node} of a cluster of \
         several: start it once with --init if it is a new member of a new cluster, or \
         with --rejoin if it lost its data (its peers then keep every record it \
         acknowledged); started as new after losing its data, it could help them drop \
         acknowledged records"
    )]
    NewOrLost {
        /// The data directory.
        dir: std::path::PathBuf,
        /// This member.
        node: u8,
    },
    /// The directory is another member's.
    #[error(
        "the data directory is member {found}'s of cluster {cluster:?}, but this node is \
         configured as member {configured}"
    )]
    OtherMember {
        /// The cluster.
        cluster: String,
        /// Recorded in the directory.
        found: u8,
        /// In the config.
        configured: u8,
    },
}

/// The identity file's contents.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Identity {
    pub(crate) format: u32,
    pub(crate) cluster_id: String,
    pub(crate) node_id: u8,
    /// The directory was made for a member that had lost its data (`--rejoin`): its
    /// groups that start with nothing on disk start untrusted, at every start.
    #[serde(default)]
    pub(crate) rejoined: bool,
    /// A start finished opening the directory's metadata once: from then on the
    /// files every started node has must be there (see [`check_intact`]).
    #[serde(default)]
    pub(crate) initialized: bool,
}

/// What every node that once started has in its data directory, with a reading for
/// an operator. The metadata journal, its checkpoint copies and shard 0's states are
/// written by the first open, before any client is served.
const STARTED_NODE_HAS: [(&str, &[&str]); 4] = [
    ("partitions/", &["partitions"]),
    ("metadata/group-0.journal", &["metadata/group-0.journal"]),
    (
        "metadata/group-0.checkpoint.0 and .1",
        &[
            "metadata/group-0.checkpoint.0",
            "metadata/group-0.checkpoint.1",
        ],
    ),
    (
        "metadata/shard-0.0 and .1",
        &["metadata/shard-0.0", "metadata/shard-0.1"],
    ),
];

/// What a started directory of a cluster member lost, to take from its peers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Lost {
    /// The metadata group's journal, both checkpoint copies or both states copies: the
    /// group restarts as a replica that lost its disk.
    pub(crate) metadata: bool,
    /// `partitions/`: every partition group starts untrusted, as after `--rejoin`.
    pub(crate) partitions: bool,
}

/// Refuses a data directory that held a node's data and lost a file every started node
/// has (a `partitions/` directory, the metadata journal, its checkpoints or its
/// states): starting on it as on a new directory would serve less than was
/// acknowledged and hand out offsets again. A member of a cluster of several starts
/// anyway, with what it lost named in the answer and in a warning: it takes it from
/// its peers, its votes abstaining where the loss could have dropped an acknowledged
/// op (issue 24: damage, a missing file included, is repaired, never a refusal, where
/// a peer holds the data). Call before anything creates them.
///
/// # Errors
/// [`IdentityError::Missing`] (a single node), or the identity file cannot be read.
pub(crate) fn check_intact(data_dir: &Path, clustered: bool) -> Result<Lost, IdentityError> {
    let path = data_dir.join(IDENTITY_FILE);
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(Lost::default()),
        Err(source) => return Err(IdentityError::Io { path, source }),
    };
    let Ok(found) = toml::from_str::<Identity>(&text) else {
        // Reported with its reason by `claim`.
        return Ok(Lost::default());
    };
    if !found.initialized {
        return Ok(Lost::default());
    }
    let mut lost = Lost::default();
    for (missing, any_of) in STARTED_NODE_HAS {
        if any_of.iter().any(|p| data_dir.join(p).exists()) {
            continue;
        }
        if !clustered {
            return Err(IdentityError::Missing {
                dir: data_dir.to_owned(),
                missing,
                way_out: "Restore the directory from a backup; a single node has no peer \
                          to copy the lost data from.",
            });
        }
        tracing::warn!(
            dir = %data_dir.display(),
            missing,
            "a file every started node has is gone: this member takes what it held from \
             its peers, and abstains from votes it could lose acknowledged writes in until \
             they have shown it the current view"
        );
        if missing == "partitions/" {
            lost.partitions = true;
        } else {
            lost.metadata = true;
        }
    }
    Ok(lost)
}

/// Records that a start finished opening the directory (once): from the next start on,
/// [`check_intact`] holds it to it.
///
/// # Errors
/// The identity file could not be written.
pub(crate) fn mark_initialized(data_dir: &Path, identity: &Identity) -> Result<(), IdentityError> {
    if identity.initialized {
        return Ok(());
    }
    write_identity(
        data_dir,
        &Identity {
            initialized: true,
            ..identity.clone()
        },
    )
}

impl Identity {
    fn render(&self) -> String {
        let mut text = format!(
            "# The identity of a Braid data directory; braid checks it at every start.\n\
             format = {}\ncluster_id = {:?}\nnode_id = {}\n",
            self.format, self.cluster_id, self.node_id
        );
        if self.rejoined {
            text.push_str(
                "# This member lost its data once: what it starts with nothing of starts \
                 untrusted.\nrejoined = true\n",
            );
        }
        if self.initialized {
            text.push_str(
                "# A start finished here: a missing metadata file or partitions/ is damage.\n\
                 initialized = true\n",
            );
        }
        text
    }
}

/// Checks `data_dir`'s identity against the configured cluster (`None`: a cluster of
/// one, which takes any single-node directory), writing it on the first start. A
/// directory from before identities existed is format 1 (its metadata op log shows it)
/// and is refused like any older format. Returns the identity in force.
///
/// # Errors
/// An [`IdentityError`] saying why the directory is not this node's.
#[cfg(test)]
pub(crate) fn claim(
    data_dir: &Path,
    configured: Option<(&str, u8)>,
    rejoin: bool,
    draw_single_id: impl FnOnce() -> String,
) -> Result<Identity, IdentityError> {
    claim_as(data_dir, configured, Start::Any, rejoin, draw_single_id)
}

/// How an empty data directory may be claimed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Start {
    /// As new (a single node, a cluster of one).
    Any,
    /// As new only when told (`--init`) or as a rejoin (`--rejoin`): a member of a
    /// cluster of several.
    Told {
        /// `--init`: a new member of a new cluster.
        init: bool,
    },
}

/// As [`claim`], refusing an empty directory that `start` does not allow.
///
/// # Errors
/// As [`claim`], and [`IdentityError::NewOrLost`].
pub(crate) fn claim_as(
    data_dir: &Path,
    configured: Option<(&str, u8)>,
    start: Start,
    rejoin: bool,
    draw_single_id: impl FnOnce() -> String,
) -> Result<Identity, IdentityError> {
    let path = data_dir.join(IDENTITY_FILE);
    let io = |source| IdentityError::Io {
        path: path.clone(),
        source,
    };
    match std::fs::read_to_string(&path) {
        Ok(text) => {
            let found: Identity = toml::from_str(&text).map_err(|e| IdentityError::Damaged {
                path: path.clone(),
                reason: e.to_string(),
            })?;
            if found.format != DATA_DIR_FORMAT {
                return Err(IdentityError::Format {
                    found: found.format,
                });
            }
            if let Some((cluster, node)) = configured {
                if found.cluster_id != cluster {
                    return Err(IdentityError::OtherCluster {
                        found: found.cluster_id,
                        configured: cluster.to_owned(),
                    });
                }
                if found.node_id != node {
                    return Err(IdentityError::OtherMember {
                        cluster: found.cluster_id,
                        found: found.node_id,
                        configured: node,
                    });
                }
            }
            if rejoin && !found.rejoined {
                // Marking more than needed is safe: only groups with nothing on disk
                // start untrusted.
                let marked = Identity {
                    rejoined: true,
                    ..found
                };
                write_identity(data_dir, &marked)?;
                return Ok(marked);
            }
            Ok(found)
        }
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
            if data_dir.join(FORMAT_1_OP_LOG).exists() {
                return Err(IdentityError::Format { found: 1 });
            }
            if start == (Start::Told { init: false }) && !rejoin {
                return Err(IdentityError::NewOrLost {
                    dir: data_dir.to_owned(),
                    node: configured.map_or(0, |(_, node)| node),
                });
            }
            let (cluster_id, node_id) = match configured {
                Some((cluster, node)) => (cluster.to_owned(), node),
                None => (draw_single_id(), 0),
            };
            let identity = Identity {
                format: DATA_DIR_FORMAT,
                cluster_id,
                node_id,
                rejoined: rejoin,
                initialized: false,
            };
            write_identity(data_dir, &identity)?;
            Ok(identity)
        }
        Err(err) => Err(io(err)),
    }
}

/// Writes the identity file whole (a temporary file, synced, renamed, the directory
/// synced).
fn write_identity(data_dir: &Path, identity: &Identity) -> Result<(), IdentityError> {
    use braid_storage::disk;
    let path = data_dir.join(IDENTITY_FILE);
    let tmp = data_dir.join(format!("{IDENTITY_FILE}.tmp"));
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| IdentityError::Io { path, source }
    };
    // Through the storage crate's disk seam, as every file a node writes: the shell
    // simulator's power losses and damage reach it too.
    disk::write_file(&tmp, identity.render().as_bytes()).map_err(io(&tmp))?;
    let file = std::fs::File::open(&tmp).map_err(io(&tmp))?;
    disk::sync_data(&file, &tmp).map_err(io(&tmp))?;
    disk::rename(&tmp, &path).map_err(io(&path))?;
    disk::sync_dir(data_dir).map_err(io(&path))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_directory_is_claimed_once_and_refused_to_strangers() {
        let dir = tempfile::tempdir().unwrap();
        let single = claim(dir.path(), None, false, || "local-1".into()).unwrap();
        assert_eq!((single.cluster_id.as_str(), single.node_id), ("local-1", 0));
        // Later starts keep it, whatever they would draw.
        let again = claim(dir.path(), None, false, || "local-2".into()).unwrap();
        assert_eq!(again, single);
        let other = claim(dir.path(), Some(("prod", 0)), false, String::new).unwrap_err();
        assert!(
            matches!(other, IdentityError::OtherCluster { .. }),
            "{other}"
        );
        assert!(other.to_string().contains("local-1") && other.to_string().contains("prod"));

        let member = tempfile::tempdir().unwrap();
        claim(member.path(), Some(("prod", 2)), false, String::new).unwrap();
        claim(member.path(), Some(("prod", 2)), false, String::new).unwrap();
        let swapped = claim(member.path(), Some(("prod", 1)), false, String::new).unwrap_err();
        assert!(
            matches!(swapped, IdentityError::OtherMember { found: 2, .. }),
            "{swapped}"
        );

        let path = member.path().join(IDENTITY_FILE);
        for (format, word) in [(0, "older"), (99, "newer")] {
            let text = std::fs::read_to_string(&path).unwrap();
            let text = text
                .lines()
                .map(|l| {
                    if l.starts_with("format") {
                        format!("format = {format}")
                    } else {
                        l.to_owned()
                    }
                })
                .collect::<Vec<_>>()
                .join("\n");
            std::fs::write(&path, text).unwrap();
            let refused = claim(member.path(), Some(("prod", 2)), false, String::new).unwrap_err();
            assert!(refused.to_string().contains(word), "{refused}");
        }
        std::fs::write(&path, "format = \"one\"").unwrap();
        assert!(matches!(
            claim(member.path(), None, false, String::new),
            Err(IdentityError::Damaged { .. })
        ));

        // A directory from before identities (format 1: a metadata op log) is refused,
        // and left as it was.
        let old = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(old.path().join("metadata")).unwrap();
        std::fs::write(old.path().join(FORMAT_1_OP_LOG), b"BRDOPS01").unwrap();
        let refused = claim(old.path(), None, false, String::new).unwrap_err();
        assert!(
            matches!(refused, IdentityError::Format { found: 1 }),
            "{refused}"
        );
        assert!(refused.to_string().contains("older"), "{refused}");
        assert!(!old.path().join(IDENTITY_FILE).exists());
    }

    /// Issue 24, finding 13: a lost `partitions/` or metadata file started the node as
    /// an empty one, without a word. Once a start has finished, each is refused,
    /// naming what is gone; before that (a crash during the first start) nothing is.
    #[test]
    fn a_started_directory_that_lost_a_file_every_node_has_is_refused_alone_and_repaired_in_a_cluster(
    ) {
        let dir = tempfile::tempdir().unwrap();
        let layout = |dir: &Path| {
            std::fs::create_dir_all(dir.join("partitions")).unwrap();
            std::fs::create_dir_all(dir.join("metadata")).unwrap();
            for f in [
                "group-0.journal",
                "group-0.checkpoint.0",
                "shard-0.0",
                "shard-0.1",
            ] {
                std::fs::write(dir.join("metadata").join(f), b"x").unwrap();
            }
        };
        check_intact(dir.path(), false).unwrap();
        let identity = claim(dir.path(), None, false, || "local-1".into()).unwrap();
        // Claimed, first start not finished: nothing is demanded yet.
        check_intact(dir.path(), false).unwrap();
        layout(dir.path());
        mark_initialized(dir.path(), &identity).unwrap();
        assert!(
            claim(dir.path(), None, false, String::new)
                .unwrap()
                .initialized
        );
        check_intact(dir.path(), false).unwrap();
        for gone in [
            "partitions",
            "metadata/group-0.journal",
            "metadata/group-0.checkpoint.0",
            "metadata/shard-0.0",
        ] {
            let path = dir.path().join(gone);
            if gone == "partitions" {
                std::fs::remove_dir(&path).unwrap();
            } else {
                std::fs::remove_file(&path).unwrap();
            }
            let result = check_intact(dir.path(), false);
            if gone == "metadata/shard-0.0" {
                // One copy of two is enough to start from.
                result.unwrap();
                std::fs::remove_file(dir.path().join("metadata/shard-0.1")).unwrap();
            }
            let refused = check_intact(dir.path(), false).unwrap_err();
            let text = refused.to_string();
            assert!(matches!(refused, IdentityError::Missing { .. }), "{text}");
            assert!(text.contains(gone.split('.').next().unwrap()), "{text}");
            assert!(text.contains("no peer"), "{text}");
            // A cluster member starts, and takes the lost part from its peers.
            let lost = check_intact(dir.path(), true).unwrap();
            assert_eq!(
                lost,
                Lost {
                    metadata: gone != "partitions",
                    partitions: gone == "partitions",
                },
                "{gone}"
            );
            layout(dir.path());
        }
        std::fs::remove_file(dir.path().join("metadata/group-0.journal")).unwrap();
        let single = check_intact(dir.path(), false).unwrap_err().to_string();
        assert!(single.contains("no peer"), "{single}");
    }

    #[test]
    fn a_rejoin_is_recorded_and_kept() {
        let member = tempfile::tempdir().unwrap();
        let fresh = claim(member.path(), Some(("prod", 1)), true, String::new).unwrap();
        assert!(fresh.rejoined);
        let later = claim(member.path(), Some(("prod", 1)), false, String::new).unwrap();
        assert!(later.rejoined, "every later start keeps it");
        let other = tempfile::tempdir().unwrap();
        assert!(
            !claim(other.path(), Some(("prod", 2)), false, String::new)
                .unwrap()
                .rejoined
        );
        let marked = claim(other.path(), Some(("prod", 2)), true, String::new).unwrap();
        assert!(
            marked.rejoined,
            "a rejoin on an existing directory marks it"
        );
    }
}
