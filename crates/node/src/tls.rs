//! TLS on the client port: the rustls server configuration built from the PEM files of
//! the `[tls]` settings, once at start.

use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use crate::config::TlsSettings;

/// Why the TLS settings could not be used.
#[derive(Debug, thiserror::Error)]
#[error("tls: {0}")]
pub struct TlsError(String);

/// The TLS acceptor of the client port.
#[derive(Clone)]
pub(crate) struct ClientTls(pub(crate) tokio_rustls::TlsAcceptor);

impl std::fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClientTls(..)")
    }
}

/// The acceptor for the client port, or `None` when TLS is off.
pub(crate) fn acceptor(settings: &TlsSettings) -> Result<Option<ClientTls>, TlsError> {
    let (Some(cert_file), Some(key_file)) = (&settings.cert_file, &settings.key_file) else {
        return Ok(None);
    };
    let read = |what: &str, path: &std::path::Path, e: &dyn std::fmt::Display| {
        TlsError(format!("{what} {}: {e}", path.display()))
    };
    let chain = CertificateDer::pem_file_iter(cert_file)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .map_err(|e| read("reading the certificate chain", cert_file, &e))?;
    if chain.is_empty() {
        return Err(TlsError(format!(
            "{} holds no certificate",
            cert_file.display()
        )));
    }
    let key = PrivateKeyDer::from_pem_file(key_file)
        .map_err(|e| read("reading the private key", key_file, &e))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError(e.to_string()))?;
    let builder = match &settings.client_ca_file {
        None => builder.with_no_client_auth(),
        Some(ca_file) => {
            let mut roots = rustls::RootCertStore::empty();
            for ca in CertificateDer::pem_file_iter(ca_file)
                .map_err(|e| read("reading the client CA bundle", ca_file, &e))?
            {
                let ca = ca.map_err(|e| read("reading the client CA bundle", ca_file, &e))?;
                roots
                    .add(ca)
                    .map_err(|e| read("adding a client CA from", ca_file, &e))?;
            }
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots),
                provider,
            )
            .build()
            .map_err(|e| read("using the client CA bundle", ca_file, &e))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let config = builder
        .with_single_cert(chain, key)
        .map_err(|e| TlsError(format!("the certificate and key do not fit together: {e}")))?;
    Ok(Some(ClientTls(tokio_rustls::TlsAcceptor::from(Arc::new(
        config,
    )))))
}
