//! Certificates made in the test: a certificate authority and one replica certificate
//! it signed, for `braid-replica`. A test-only module of the crate, also included by
//! the integration tests through `#[path]`.

// A panic here is a failed test setup, not a crash on outside data.
#![allow(clippy::unwrap_used, dead_code)]

/// A CA and a replica certificate it signed, for `braid-replica`: (certificate DER,
/// private key PKCS#8 DER, CA certificate DER). Plain bytes, so the unit tests (inside
/// the crate) and the integration tests (outside it) build their `TlsConfig` alike.
pub(crate) fn replica_certificates() -> (Vec<u8>, Vec<u8>, Vec<u8>) {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair};
    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let node_key = KeyPair::generate().unwrap();
    let node = CertificateParams::new(vec!["braid-replica".to_owned()])
        .unwrap()
        .signed_by(&node_key, &ca, &ca_key)
        .unwrap();
    (
        node.der().to_vec(),
        node_key.serialize_der(),
        ca.der().to_vec(),
    )
}
