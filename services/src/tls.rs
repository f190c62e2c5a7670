//! Serving TLS: the certificate from `--tls-cert-file`/`--tls-private-key-file` (the API
//! server's flag names), or a self-signed one generated at start, as the API server does
//! with `--cert-dir`. HTTP/2 is offered through ALPN because client-go multiplexes all of
//! its watches over one HTTP/2 connection.

use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use thiserror::Error;

#[derive(Debug, Error)]
pub enum Error {
    #[error("reading TLS certificate {path}: {source}")]
    ReadCert {
        path: String,
        #[source]
        source: rustls::pki_types::pem::Error,
    },
    #[error("reading TLS private key {path}: {source}")]
    ReadKey {
        path: String,
        #[source]
        source: rustls::pki_types::pem::Error,
    },
    #[error("--tls-cert-file and --tls-private-key-file go together")]
    HalfConfigured,
    #[error("generating a self-signed certificate: {0}")]
    SelfSigned(#[from] rcgen::Error),
    #[error("building the TLS configuration: {0}")]
    Config(#[from] rustls::Error),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The serving configuration; `hosts` are the names a generated certificate is valid for.
pub fn server_config(
    cert: Option<&Path>,
    key: Option<&Path>,
    hosts: &[String],
) -> Result<rustls::ServerConfig> {
    let (chain, key) = match (cert, key) {
        (Some(cert), Some(key)) => load(cert, key)?,
        (None, None) => self_signed(hosts)?,
        _ => return Err(Error::HalfConfigured),
    };
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let cfg = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(chain, key)?;
    Ok(cfg)
}

fn load(cert: &Path, key: &Path) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)> {
    let chain = CertificateDer::pem_file_iter(cert)
        .and_then(|it| it.collect::<Result<Vec<_>, _>>())
        .map_err(|source| Error::ReadCert {
            path: cert.display().to_string(),
            source,
        })?;
    let key = PrivateKeyDer::from_pem_file(key).map_err(|source| Error::ReadKey {
        path: key.display().to_string(),
        source,
    })?;
    Ok((chain, key))
}

fn self_signed(hosts: &[String]) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)> {
    let mut names: Vec<String> = vec!["localhost".into(), "127.0.0.1".into()];
    names.extend(hosts.iter().cloned());
    names.dedup();
    let certified = rcgen::generate_simple_self_signed(names)?;
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(
        certified.signing_key.serialize_der(),
    ));
    Ok((vec![certified.cert.der().clone()], key))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn self_signed_config_offers_a_certificate() {
        let cfg = server_config(None, None, &["kcache.example".into()]).expect("config");
        assert!(
            cfg.alpn_protocols.is_empty(),
            "actix-web adds h2 and http/1.1 itself"
        );
    }

    #[test]
    fn half_configured_files_are_refused() {
        let e = server_config(Some(Path::new("/nope.crt")), None, &[]).expect_err("half");
        assert!(matches!(e, Error::HalfConfigured));
    }
}
