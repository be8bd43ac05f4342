//! The TLS client configuration of `etcd_ca_cert_file`, `etcd_cert_file`
//! and `etcd_key_file`: the CA (else the system's roots) verifies the
//! members, the certificate and key (both or neither) authenticate us.

use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use super::{EtcdConfig, EtcdError};

fn certificates(path: &Path, what: &str) -> Result<Vec<CertificateDer<'static>>, EtcdError> {
    let certs: Vec<_> = CertificateDer::pem_file_iter(path)
        .and_then(|iter| iter.collect::<Result<Vec<_>, _>>())
        .map_err(|e| EtcdError::Config(format!("reading {what} {}: {e}", path.display())))?;
    if certs.is_empty() {
        return Err(EtcdError::Config(format!(
            "{what} {} holds no PEM certificate",
            path.display()
        )));
    }
    Ok(certs)
}

/// The rustls configuration for the members of `conf`.
pub fn client_config(conf: &EtcdConfig) -> Result<Arc<rustls::ClientConfig>, EtcdError> {
    let mut roots = rustls::RootCertStore::empty();
    match &conf.ca_cert_file {
        Some(ca) => {
            for cert in certificates(ca, "etcd_ca_cert_file")? {
                roots.add(cert).map_err(|e| {
                    EtcdError::Config(format!("etcd_ca_cert_file {}: {e}", ca.display()))
                })?;
            }
        }
        None => {
            for cert in rustls_native_certs::load_native_certs().certs {
                let _ = roots.add(cert);
            }
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| EtcdError::Config(format!("TLS: {e}")))?
        .with_root_certificates(roots);
    let config = match (&conf.cert_file, &conf.key_file) {
        (Some(cert), Some(key)) => {
            let chain = certificates(cert, "etcd_cert_file")?;
            // The key's path may be logged, never its content.
            let key_der = PrivateKeyDer::from_pem_file(key).map_err(|e| {
                EtcdError::Config(format!("reading etcd_key_file {}: {e}", key.display()))
            })?;
            builder
                .with_client_auth_cert(chain, key_der)
                .map_err(|e| EtcdError::Config(format!("etcd client certificate: {e}")))?
        }
        (None, None) => builder.with_no_client_auth(),
        _ => {
            return Err(EtcdError::Config(
                "etcd_cert_file and etcd_key_file must be given together".into(),
            ));
        }
    };
    Ok(Arc::new(config))
}
