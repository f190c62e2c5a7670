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
    #[error("adding a client CA certificate: {0}")]
    ClientCa(#[source] rustls::Error),
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
    #[error("reading the client CA {path}: {source}")]
    ReadClientCa {
        path: String,
        #[source]
        source: rustls::pki_types::pem::Error,
    },
    #[error("building the client certificate verifier: {0}")]
    ClientVerifier(#[from] rustls::server::VerifierBuilderError),
    #[error("--tls-cert-file and --tls-private-key-file go together")]
    HalfConfigured,
    #[error("generating a self-signed certificate: {0}")]
    SelfSigned(#[from] rcgen::Error),
    #[error("building the TLS configuration: {0}")]
    Config(#[from] rustls::Error),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The serving configuration; `hosts` are the names a generated certificate is valid for.
/// With `client_ca`, client certificates signed by it are verified (and optional: bearer
/// tokens and anonymous requests still work), as the API server's `--client-ca-file`.
pub fn server_config(
    cert: Option<&Path>,
    key: Option<&Path>,
    client_ca: Option<&Path>,
    hosts: &[String],
) -> Result<rustls::ServerConfig> {
    let (chain, key) = match (cert, key) {
        (Some(cert), Some(key)) => load(cert, key)?,
        (None, None) => self_signed(hosts)?,
        _ => return Err(Error::HalfConfigured),
    };
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()?;
    let cfg = match client_ca {
        None => builder.with_no_client_auth().with_single_cert(chain, key)?,
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            let cas = CertificateDer::pem_file_iter(ca)
                .and_then(|it| it.collect::<Result<Vec<_>, _>>())
                .map_err(|source| Error::ReadClientCa {
                    path: ca.display().to_string(),
                    source,
                })?;
            for c in cas {
                roots.add(c).map_err(Error::ClientCa)?;
            }
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots),
                provider,
            )
            .allow_unauthenticated()
            .build()?;
            builder
                .with_client_cert_verifier(verifier)
                .with_single_cert(chain, key)?
        }
    };
    Ok(cfg)
}

/// The verified client certificate of a connection (DER of the leaf), stored per
/// connection by [`connection_info`].
#[derive(Clone, Debug)]
pub struct ClientCert(pub Vec<u8>);

/// actix-web `on_connect` hook: keeps the verified client certificate for the handlers,
/// and a duplicate of the socket to notice a client that left (`hangup`).
pub fn connection_info(conn: &dyn std::any::Any, ext: &mut actix_web::dev::Extensions) {
    use actix_tls::accept::rustls_0_23::TlsStream;
    use actix_web::rt::net::TcpStream;
    if let Some(tls) = conn.downcast_ref::<TlsStream<TcpStream>>() {
        let (tcp, session) = tls.get_ref();
        if let Some(leaf) = session.peer_certificates().and_then(|c| c.first()) {
            ext.insert(ClientCert(leaf.as_ref().to_vec()));
        }
        if let Some(sock) = crate::hangup::ConnSocket::of(tcp) {
            ext.insert(sock);
        }
    } else if let Some(tcp) = conn.downcast_ref::<TcpStream>() {
        if let Some(sock) = crate::hangup::ConnSocket::of(tcp) {
            ext.insert(sock);
        }
    }
}

/// The identity of a verified client certificate, as the API server's x509 authenticator
/// reads it: common name = user, organizations = groups.
pub fn cert_identity(der: &[u8]) -> Option<(String, Vec<String>)> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    let subject = cert.subject();
    let user = subject
        .iter_common_name()
        .next()?
        .as_str()
        .ok()?
        .to_string();
    let groups = subject
        .iter_organization()
        .filter_map(|o| o.as_str().ok().map(str::to_string))
        .collect();
    Some((user, groups))
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
        let cfg = server_config(None, None, None, &["kcache.example".into()]).expect("config");
        assert!(
            cfg.alpn_protocols.is_empty(),
            "actix-web adds h2 and http/1.1 itself"
        );
    }

    #[test]
    fn certificate_identity_is_cn_and_organizations() {
        let mut params = rcgen::CertificateParams::new(vec!["x".into()]).expect("params");
        params.distinguished_name = rcgen::DistinguishedName::new();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "system:node:node1");
        params
            .distinguished_name
            .push(rcgen::DnType::OrganizationName, "system:nodes");
        let key = rcgen::KeyPair::generate().expect("key");
        let cert = params.self_signed(&key).expect("cert");
        let (user, groups) = cert_identity(cert.der()).expect("identity");
        assert_eq!(user, "system:node:node1");
        assert_eq!(groups, vec!["system:nodes".to_string()]);
        assert_eq!(cert_identity(b"not a certificate"), None);
    }

    #[test]
    fn half_configured_files_are_refused() {
        let e = server_config(Some(Path::new("/nope.crt")), None, None, &[]).expect_err("half");
        assert!(matches!(e, Error::HalfConfigured));
    }
}
