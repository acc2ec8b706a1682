//! How to reach a node: TLS and credentials.

use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};

use crate::error::ClientError;

/// Options of a connection; the default is plain TCP without a login.
#[derive(Debug, Clone)]
pub struct ConnectOptions {
    /// TLS, if the node's client port has it.
    pub tls: Option<TlsOptions>,
    /// A user to log in as (SCRAM-SHA-256) right after connecting.
    pub credentials: Option<Credentials>,
    /// Talk to the node connected to alone: no cluster map, every request to it (a
    /// request for a partition it does not lead is answered `NotLeader`). For tools
    /// that inspect one member; applications leave it off.
    pub direct: bool,
    /// A connection whose sent bytes go unacknowledged this long, or that answers no
    /// keepalive probe for this long when idle, is dropped (TCP_USER_TIMEOUT and
    /// keepalive), so a node that vanished without a FIN or RST (cut off, powered off)
    /// fails the calls on it instead of holding them, and the client moves to another
    /// member. The node's kernel acknowledges what a busy node has not read yet, so load
    /// does not trip it. Zero leaves the system's defaults (minutes).
    pub dead_peer_timeout: std::time::Duration,
}

impl Default for ConnectOptions {
    fn default() -> Self {
        Self {
            tls: None,
            credentials: None,
            direct: false,
            dead_peer_timeout: std::time::Duration::from_secs(5),
        }
    }
}

/// A user name and password. The password is never sent: the client proves it knows
/// it (SCRAM), and `Debug` does not print it.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    /// The user.
    pub user: String,
    /// The password.
    pub password: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("user", &self.user)
            .finish_non_exhaustive()
    }
}

/// TLS settings of a client.
#[derive(Clone)]
pub struct TlsOptions {
    connector: tokio_rustls::TlsConnector,
    server_name: Option<ServerName<'static>>,
}

impl std::fmt::Debug for TlsOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsOptions")
            .field("server_name", &self.server_name)
            .finish_non_exhaustive()
    }
}

fn tls_error(what: &str, err: impl std::fmt::Display) -> ClientError {
    ClientError::Invalid(format!("tls: {what}: {err}"))
}

fn read_certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, ClientError> {
    let what = format!("reading {}", path.display());
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| tls_error(&what, e))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| tls_error(&what, e))?;
    if certs.is_empty() {
        return Err(tls_error(&what, "no certificate in the file"));
    }
    Ok(certs)
}

impl TlsOptions {
    /// Trusts the CA certificates (PEM) in `ca_file`; `server_name` is the name the
    /// node's certificate must carry (default: the host of the address connected to);
    /// `client_identity` is a certificate chain file and key file for a node that
    /// asks for client certificates.
    ///
    /// # Errors
    /// [`ClientError::Invalid`] naming the file or setting that is wrong.
    pub fn from_files(
        ca_file: &Path,
        server_name: Option<&str>,
        client_identity: Option<(&Path, &Path)>,
    ) -> Result<Self, ClientError> {
        let mut roots = rustls::RootCertStore::empty();
        for ca in read_certificates(ca_file)? {
            roots
                .add(ca)
                .map_err(|e| tls_error(&format!("using {}", ca_file.display()), e))?;
        }
        let identity = match client_identity {
            None => None,
            Some((cert_file, key_file)) => {
                let chain = read_certificates(cert_file)?;
                let key = PrivateKeyDer::from_pem_file(key_file)
                    .map_err(|e| tls_error(&format!("reading {}", key_file.display()), e))?;
                Some((chain, key))
            }
        };
        Self::new(roots, server_name, identity)
    }

    /// As [`TlsOptions::from_files`], from certificates in memory.
    ///
    /// # Errors
    /// [`ClientError::Invalid`].
    pub fn new(
        roots: rustls::RootCertStore,
        server_name: Option<&str>,
        client_identity: Option<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)>,
    ) -> Result<Self, ClientError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| tls_error("protocol versions", e))?
            .with_root_certificates(roots);
        let config = match client_identity {
            None => builder.with_no_client_auth(),
            Some((chain, key)) => builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| tls_error("the client certificate and key", e))?,
        };
        let server_name = server_name
            .map(|name| ServerName::try_from(name.to_owned()))
            .transpose()
            .map_err(|e| tls_error("server name", e))?;
        Ok(Self {
            connector: tokio_rustls::TlsConnector::from(Arc::new(config)),
            server_name,
        })
    }

    pub(crate) fn connector(&self) -> &tokio_rustls::TlsConnector {
        &self.connector
    }

    /// The name to verify: the one given, else the host part of `addr`.
    pub(crate) fn server_name_for(&self, addr: &str) -> Result<ServerName<'static>, ClientError> {
        if let Some(name) = &self.server_name {
            return Ok(name.clone());
        }
        let host = match addr.rsplit_once(':') {
            Some((host, _port)) => host.trim_start_matches('[').trim_end_matches(']'),
            None => addr,
        };
        ServerName::try_from(host.to_owned()).map_err(|e| tls_error("server name", e))
    }
}
