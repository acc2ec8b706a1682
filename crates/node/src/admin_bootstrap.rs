//! The first user of a node that requires authentication: `admin`, with every
//! permission, created once when authentication is on and no user exists.
//!
//! Its password comes from `BRAID_ADMIN_PASSWORD`, else from `admin_password_file`,
//! else it is drawn at random and written to `<data_dir>/admin-password` (mode 0600),
//! whose path, not its content, is logged.

use std::io::Write;
use std::path::Path;

use braid_proto::client::{Grant, Resource, NODE_PERMISSIONS, STREAM_PERMISSIONS};
use braid_proto::scram::{nonce_from, ScramCredential, ITERATIONS_DEFAULT, SALT_BYTES};

use crate::config::NodeConfig;
use crate::metadata::{op, MetaOp, Metadata};

/// The bootstrap admin's name.
pub(crate) const ADMIN_USER: &str = "admin";
/// Where a drawn password is written, in the data directory.
pub(crate) const ADMIN_PASSWORD_FILE: &str = "admin-password";

/// Why the bootstrap admin could not be made.
#[derive(Debug, thiserror::Error)]
pub enum BootstrapError {
    /// The password file could not be read or written.
    #[error("admin password file {path}: {source}")]
    File {
        /// The file.
        path: std::path::PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The password is empty.
    #[error("the bootstrap admin's password is empty")]
    Empty,
    /// No randomness from the OS.
    #[error("drawing random bytes: {0}")]
    Random(String),
    /// The metadata refused the user.
    #[error("{0}")]
    Refused(String),
}

/// Fills `out` from the OS's random source.
pub(crate) fn random_bytes(out: &mut [u8]) -> Result<(), BootstrapError> {
    getrandom::getrandom(out).map_err(|e| BootstrapError::Random(e.to_string()))
}

/// The ops that create `admin` with every permission, if authentication is on and no
/// user exists. A drawn password is written to its file before the ops are proposed (a
/// crash between leaves a file and no user); a file left by an earlier start is read
/// again rather than drawn anew, so a start that proposes again never leaves a file
/// whose password the user does not have.
pub(crate) fn admin_ops(
    state: &Metadata,
    config: &NodeConfig,
) -> Result<Vec<MetaOp>, BootstrapError> {
    if config.authentication && !state.users.is_empty() {
        // Named at every secured start: an operator sees who may manage users (and
        // so everything else), a stranger among them included.
        let managers: Vec<&str> = state
            .users
            .iter()
            .filter(|(_, user)| {
                user.grants
                    .get(&Resource::Node)
                    .is_some_and(|bits| bits & braid_proto::client::USERS != 0)
            })
            .map(|(name, _)| name.as_str())
            .collect();
        tracing::info!(
            users = state.users.len(),
            managers = ?managers,
            "authentication is on; these users may manage users"
        );
    }
    if !config.authentication || !state.users.is_empty() {
        return Ok(Vec::new());
    }
    let drawn_path = config.data_dir.join(ADMIN_PASSWORD_FILE);
    let (password, drawn) = match (&config.admin_password, &config.admin_password_file) {
        (Some(secret), _) => (secret.0.clone(), false),
        (None, Some(path)) => (read_password(path)?, false),
        (None, None) if drawn_path.exists() => (read_password(&drawn_path)?, true),
        (None, None) => {
            let mut bytes = [0u8; 18];
            random_bytes(&mut bytes)?;
            let password = nonce_from(&bytes).replace(['+', '/'], "x");
            write_password(&drawn_path, &password)?;
            (password, true)
        }
    };
    if password.is_empty() {
        return Err(BootstrapError::Empty);
    }
    let mut salt = [0u8; SALT_BYTES];
    random_bytes(&mut salt)?;
    let credential = ScramCredential::derive(&password, &salt, ITERATIONS_DEFAULT);
    let name = ADMIN_USER.to_owned();
    let mut ops = vec![MetaOp::CreateUser(op::CreateUser {
        name: name.clone(),
        credential,
    })];
    for (resource, permissions) in [
        (Resource::Node, NODE_PERMISSIONS),
        (Resource::AllStreams, STREAM_PERMISSIONS),
    ] {
        ops.push(MetaOp::Grant(op::Grant {
            user: name.clone(),
            grant: Grant {
                resource,
                permissions,
            },
        }));
    }
    if drawn {
        tracing::warn!(
            user = ADMIN_USER,
            password_file = %drawn_path.display(),
            "creating the bootstrap admin with a random password; read it from the file, \
             then delete the file"
        );
    } else {
        tracing::info!(user = ADMIN_USER, "creating the bootstrap admin");
    }
    Ok(ops)
}

fn read_password(path: &Path) -> Result<String, BootstrapError> {
    let text = std::fs::read_to_string(path).map_err(|source| BootstrapError::File {
        path: path.to_owned(),
        source,
    })?;
    // One line; a trailing newline from `echo` is not part of it.
    Ok(text.trim_end_matches(['\n', '\r']).to_owned())
}

fn write_password(path: &Path, password: &str) -> Result<(), BootstrapError> {
    let file_error = |source| BootstrapError::File {
        path: path.to_owned(),
        source,
    };
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    let mut file = options.open(path).map_err(file_error)?;
    file.write_all(password.as_bytes())
        .and_then(|()| file.write_all(b"\n"))
        .and_then(|()| file.sync_all())
        .map_err(file_error)
}
