//! Serving TLS: the certificate from `--tls-cert-file`/`--tls-private-key-file` (the API
//! server's flag names), or a self-signed one generated at start, as the API server does
//! with `--cert-dir`. HTTP/2 is offered through ALPN because client-go multiplexes all of
//! its watches over one HTTP/2 connection.
//!
//! A certificate from files is reloaded without a restart, as the API server's dynamic
//! serving certificate: a background thread re-reads both files every reload interval
//! (10 s in the binary) and, when their contents changed (by SHA-256; the kubelet's
//! `..data` symlink swap for a renewed Secret need not change any modification time),
//! swaps the new pair in for the handshakes that follow. A pair that does not load (a
//! file missing or unparsable, a key that is not the certificate's) is refused: the old
//! pair keeps serving, with one warning per failing content. Reloads are counted in
//! `kcache_tls_certificate_reloads_total{result="ok"|"error"}`, and the serving
//! certificate's notAfter is `kcache_tls_certificate_expiry_seconds`. The client CA
//! (`--client-ca-file`) is read once, at start.

use std::path::{Path, PathBuf};
use std::sync::{Arc, PoisonError, RwLock, Weak};
use std::time::Duration;

use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use thiserror::Error;

/// Reloads of the serving certificate from its files, by `result` (`ok`, `error`).
pub const CERTIFICATE_RELOADS: &str = "kcache_tls_certificate_reloads_total";
/// notAfter of the certificate being served, in seconds since the Unix epoch.
pub const CERTIFICATE_EXPIRY: &str = "kcache_tls_certificate_expiry_seconds";

/// How often the binary looks at `--tls-cert-file`/`--tls-private-key-file` for a new pair.
pub const DEFAULT_RELOAD_INTERVAL: Duration = Duration::from_secs(10);

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
    #[error("reading {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("no certificate in {path}")]
    NoCertificate { path: String },
    #[error("the first certificate of {path} does not parse: {reason}")]
    ParseCert { path: String, reason: String },
    #[error("the certificate {cert} and the key {key} do not make a pair: {source}")]
    KeyPair {
        cert: String,
        key: String,
        #[source]
        source: rustls::Error,
    },
    #[error("generating a self-signed certificate: {0}")]
    SelfSigned(#[from] rcgen::Error),
    #[error("building the TLS configuration: {0}")]
    Config(#[from] rustls::Error),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The serving configuration; `hosts` are the names a generated certificate is valid for.
/// A certificate from files is checked for a new pair every `reload_interval` (see the
/// module header); the first pair must load, or this fails.
/// With `client_ca`, client certificates signed by it are verified (and optional: bearer
/// tokens and anonymous requests still work), as the API server's `--client-ca-file`.
pub fn server_config(
    cert: Option<&Path>,
    key: Option<&Path>,
    client_ca: Option<&Path>,
    hosts: &[String],
    reload_interval: Duration,
) -> Result<rustls::ServerConfig> {
    describe();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let resolver = match (cert, key) {
        (Some(cert), Some(key)) => {
            let mut watch = PairWatch::new(cert, key, provider.clone());
            let resolver = Arc::new(Resolver::new(watch.load_first()?));
            watch.spawn(Arc::downgrade(&resolver), reload_interval);
            resolver
        }
        (None, None) => {
            let (chain, key) = self_signed(hosts)?;
            let certified = CertifiedKey::from_der(chain, key, &provider)?;
            Arc::new(Resolver::new(Loaded::new(certified, "self-signed")?))
        }
        _ => return Err(Error::HalfConfigured),
    };
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()?;
    let cfg = match client_ca {
        None => builder.with_no_client_auth().with_cert_resolver(resolver),
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
            let webpki = rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots),
                provider,
            )
            .allow_unauthenticated()
            .build()?;
            let verifier = Arc::new(GoParsedClientCerts(webpki));
            builder
                .with_client_cert_verifier(verifier)
                .with_cert_resolver(resolver)
        }
    };
    Ok(cfg)
}

fn describe() {
    metrics::describe_counter!(
        CERTIFICATE_RELOADS,
        "Loads of a changed --tls-cert-file/--tls-private-key-file pair, by result: ok (now served) or error (refused; the previous pair is still served)."
    );
    metrics::describe_gauge!(
        CERTIFICATE_EXPIRY,
        metrics::Unit::Seconds,
        "notAfter of the serving certificate, in seconds since the Unix epoch."
    );
}

/// The serving certificate for every handshake: the current pair, replaced by the reload
/// thread. A handshake only clones an `Arc` under a read lock, never touches the disk.
#[derive(Debug)]
struct Resolver {
    current: RwLock<Arc<CertifiedKey>>,
}

impl Resolver {
    fn new(first: Loaded) -> Resolver {
        first.publish();
        Resolver {
            current: RwLock::new(first.certified),
        }
    }

    fn swap(&self, next: Loaded) {
        next.publish();
        *self.current.write().unwrap_or_else(PoisonError::into_inner) = next.certified;
    }
}

impl ResolvesServerCert for Resolver {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(
            self.current
                .read()
                .unwrap_or_else(PoisonError::into_inner)
                .clone(),
        )
    }
}

/// A pair ready to serve, with its leaf's notAfter.
struct Loaded {
    certified: Arc<CertifiedKey>,
    not_after: i64,
}

impl Loaded {
    /// `source` names the certificate in errors.
    fn new(certified: CertifiedKey, source: &str) -> Result<Loaded> {
        let leaf = certified
            .end_entity_cert()
            .map_err(|_| Error::NoCertificate {
                path: source.to_string(),
            })?;
        let not_after = x509_parser::parse_x509_certificate(leaf)
            .map_err(|e| Error::ParseCert {
                path: source.to_string(),
                reason: e.to_string(),
            })?
            .1
            .validity()
            .not_after
            .timestamp();
        Ok(Loaded {
            certified: Arc::new(certified),
            not_after,
        })
    }

    fn publish(&self) {
        metrics::gauge!(CERTIFICATE_EXPIRY).set(self.not_after as f64);
    }
}

/// The certificate and key files, and what was last seen in them.
struct PairWatch {
    cert: PathBuf,
    key: PathBuf,
    provider: Arc<CryptoProvider>,
    /// SHA-256 of the contents last loaded or refused (or of the read error last
    /// reported): the same again is not looked at twice, nor warned about twice.
    seen: Vec<u8>,
}

/// What one look at the files found.
#[derive(Debug, PartialEq, Eq)]
enum Check {
    Unchanged,
    /// A file changed between two reads; looked at again next time.
    InFlux,
    Reloaded,
    Refused,
}

impl PairWatch {
    fn new(cert: &Path, key: &Path, provider: Arc<CryptoProvider>) -> PairWatch {
        PairWatch {
            cert: cert.to_path_buf(),
            key: key.to_path_buf(),
            provider,
            seen: Vec::new(),
        }
    }

    /// The pair at start; an error here stops kcache, as before reloading existed.
    fn load_first(&mut self) -> Result<Loaded> {
        let (cert, key) = self.read()?;
        self.seen = digest(&[b"pair", &cert, &key]);
        self.parse(&cert, &key)
    }

    fn spawn(mut self, resolver: Weak<Resolver>, interval: Duration) {
        let spawned = std::thread::Builder::new()
            .name("kcache-tls-reload".into())
            .spawn(move || loop {
                std::thread::sleep(interval);
                // Gone with the server's configuration.
                let Some(resolver) = resolver.upgrade() else {
                    return;
                };
                self.check(&resolver);
            });
        match spawned {
            Ok(_) => {
                // Both series from the start, so that an alert on errors has a baseline.
                metrics::counter!(CERTIFICATE_RELOADS, "result" => "ok").increment(0);
                metrics::counter!(CERTIFICATE_RELOADS, "result" => "error").increment(0);
            }
            Err(e) => {
                tracing::warn!("starting the TLS certificate reload thread: {e}; the certificate will not be reloaded");
            }
        }
    }

    /// Reads both files and swaps in their pair if it changed and loads.
    fn check(&mut self, resolver: &Resolver) -> Check {
        let (cert, key) = match self.read_settled() {
            Ok(Some(pair)) => pair,
            Ok(None) => return Check::InFlux,
            Err(e) => {
                let seen = digest(&[b"error", e.to_string().as_bytes()]);
                if seen == self.seen {
                    return Check::Unchanged;
                }
                self.seen = seen;
                return refused(&e);
            }
        };
        let seen = digest(&[b"pair", &cert, &key]);
        if seen == self.seen {
            return Check::Unchanged;
        }
        self.seen = seen;
        match self.parse(&cert, &key) {
            Ok(loaded) => {
                let not_after = loaded.not_after;
                resolver.swap(loaded);
                metrics::counter!(CERTIFICATE_RELOADS, "result" => "ok").increment(1);
                tracing::info!(
                    cert = %self.cert.display(),
                    not_after,
                    "reloaded the serving certificate"
                );
                Check::Reloaded
            }
            Err(e) => refused(&e),
        }
    }

    fn read(&self) -> Result<(Vec<u8>, Vec<u8>)> {
        Ok((read_file(&self.cert)?, read_file(&self.key)?))
    }

    /// Both files, unless the certificate changed while the key was read (a swap between
    /// the two reads would pair an old certificate with a new key): `None` then.
    fn read_settled(&self) -> Result<Option<(Vec<u8>, Vec<u8>)>> {
        let (cert, key) = self.read()?;
        let again = read_file(&self.cert)?;
        Ok((again == cert).then_some((cert, key)))
    }

    fn parse(&self, cert: &[u8], key: &[u8]) -> Result<Loaded> {
        let cert_path = self.cert.display().to_string();
        let key_path = self.key.display().to_string();
        let chain = CertificateDer::pem_slice_iter(cert)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|source| Error::ReadCert {
                path: cert_path.clone(),
                source,
            })?;
        if chain.is_empty() {
            return Err(Error::NoCertificate { path: cert_path });
        }
        let key = PrivateKeyDer::from_pem_slice(key).map_err(|source| Error::ReadKey {
            path: key_path.clone(),
            source,
        })?;
        // `from_der` also checks that the key is the certificate's (`keys_match`).
        let certified = CertifiedKey::from_der(chain, key, &self.provider).map_err(|source| {
            Error::KeyPair {
                cert: cert_path.clone(),
                key: key_path,
                source,
            }
        })?;
        Loaded::new(certified, &cert_path)
    }
}

/// A pair that did not load: counted and logged (once per content: the caller only comes
/// here for contents not seen before); the previous pair keeps serving.
fn refused(e: &Error) -> Check {
    metrics::counter!(CERTIFICATE_RELOADS, "result" => "error").increment(1);
    tracing::warn!("reloading the serving certificate: {e}; still serving the previous one");
    Check::Refused
}

fn read_file(path: &Path) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|source| Error::Read {
        path: path.display().to_string(),
        source,
    })
}

fn digest(parts: &[&[u8]]) -> Vec<u8> {
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    for part in parts {
        ctx.update(&(part.len() as u64).to_be_bytes());
        ctx.update(part);
    }
    ctx.finish().as_ref().to_vec()
}

/// What the verified client certificate of a connection says (`crate::cert_identity`),
/// read once when the connection is made ([`connection_info`]), not per request.
#[derive(Clone, Debug)]
pub struct ClientCert(pub Result<crate::cert_identity::Identity, crate::cert_identity::Error>);

/// actix-web `on_connect` hook: keeps the verified client certificate for the handlers,
/// a duplicate of the socket to notice a client that left (`hangup`), and the phase its
/// watches write their keepalives in (one per connection: `watcher::Keepalive`).
pub fn connection_info(conn: &dyn std::any::Any, ext: &mut actix_web::dev::Extensions) {
    use actix_tls::accept::rustls_0_23::TlsStream;
    use actix_web::rt::net::TcpStream;
    ext.insert(kcache_actors::watcher::KeepalivePhase::random());
    if let Some(tls) = conn.downcast_ref::<TlsStream<TcpStream>>() {
        let (tcp, session) = tls.get_ref();
        if let Some(leaf) = session.peer_certificates().and_then(|c| c.first()) {
            ext.insert(ClientCert(crate::cert_identity::identity(leaf.as_ref())));
        }
        if let Some(sock) = crate::hangup::ConnFd::of(tcp) {
            ext.insert(sock);
        }
    } else if let Some(tcp) = conn.downcast_ref::<TcpStream>() {
        if let Some(sock) = crate::hangup::ConnFd::of(tcp) {
            ext.insert(sock);
        }
    }
}

/// The client-certificate check of the API server's TLS handshake: Go parses every
/// certificate the client presents before it verifies the chain, and refuses one whose
/// names it cannot read (`crate::cert_identity::go_parses_names`) — which webpki accepts. A
/// certificate the API server would refuse at the handshake is refused here too, so no
/// identity is ever read from it.
#[derive(Debug)]
struct GoParsedClientCerts(Arc<dyn rustls::server::danger::ClientCertVerifier>);

impl rustls::server::danger::ClientCertVerifier for GoParsedClientCerts {
    fn offer_client_auth(&self) -> bool {
        self.0.offer_client_auth()
    }

    fn client_auth_mandatory(&self) -> bool {
        self.0.client_auth_mandatory()
    }

    fn root_hint_subjects(&self) -> &[rustls::DistinguishedName] {
        self.0.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: rustls::pki_types::UnixTime,
    ) -> std::result::Result<rustls::server::danger::ClientCertVerified, rustls::Error> {
        for cert in std::iter::once(end_entity).chain(intermediates) {
            if let Err(e) = crate::cert_identity::go_parses_names(cert) {
                tracing::info!(error = %e, "refusing a client certificate the API server would not parse");
                return Err(rustls::Error::InvalidCertificate(
                    rustls::CertificateError::BadEncoding,
                ));
            }
        }
        self.0.verify_client_cert(end_entity, intermediates, now)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> std::result::Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> std::result::Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.supported_verify_schemes()
    }
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
        let cfg = server_config(
            None,
            None,
            None,
            &["kcache.example".into()],
            DEFAULT_RELOAD_INTERVAL,
        )
        .expect("config");
        assert!(
            cfg.alpn_protocols.is_empty(),
            "actix-web adds h2 and http/1.1 itself"
        );
    }

    #[test]
    fn half_configured_files_are_refused() {
        let e = server_config(
            Some(Path::new("/nope.crt")),
            None,
            None,
            &[],
            DEFAULT_RELOAD_INTERVAL,
        )
        .expect_err("half");
        assert!(matches!(e, Error::HalfConfigured));
    }

    /// A self-signed certificate for 127.0.0.1 and its key, as PEM.
    fn pem_pair() -> (String, String) {
        let key = rcgen::KeyPair::generate().expect("key");
        let params = rcgen::CertificateParams::new(vec!["127.0.0.1".into()]).expect("params");
        let cert = params.self_signed(&key).expect("cert");
        (cert.pem(), key.serialize_pem())
    }

    fn served(resolver: &Resolver) -> Vec<u8> {
        resolver.current.read().expect("lock").cert[0]
            .as_ref()
            .to_vec()
    }

    fn der(pem: &str) -> Vec<u8> {
        CertificateDer::from_pem_slice(pem.as_bytes())
            .expect("pem")
            .as_ref()
            .to_vec()
    }

    #[test]
    fn a_changed_pair_is_swapped_in_and_a_broken_one_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (cert, key) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
        let write = |c: &str, k: &str| {
            std::fs::write(&cert, c).expect("write cert");
            std::fs::write(&key, k).expect("write key");
        };
        let (a_cert, a_key) = pem_pair();
        write(&a_cert, &a_key);
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut watch = PairWatch::new(&cert, &key, provider);
        let resolver = Resolver::new(watch.load_first().expect("first pair"));
        assert_eq!(served(&resolver), der(&a_cert));
        assert_eq!(watch.check(&resolver), Check::Unchanged);

        let (b_cert, b_key) = pem_pair();
        write(&b_cert, &b_key);
        assert_eq!(watch.check(&resolver), Check::Reloaded);
        assert_eq!(served(&resolver), der(&b_cert));
        assert_eq!(watch.check(&resolver), Check::Unchanged);

        // A certificate with someone else's key: refused once, then left alone.
        let (c_cert, _) = pem_pair();
        write(&c_cert, &b_key);
        assert_eq!(watch.check(&resolver), Check::Refused);
        assert_eq!(watch.check(&resolver), Check::Unchanged);
        assert_eq!(served(&resolver), der(&b_cert));

        // Garbage, then a missing file: the same.
        write("not a certificate", &b_key);
        assert_eq!(watch.check(&resolver), Check::Refused);
        std::fs::remove_file(&key).expect("remove key");
        assert_eq!(watch.check(&resolver), Check::Refused);
        assert_eq!(watch.check(&resolver), Check::Unchanged);
        assert_eq!(served(&resolver), der(&b_cert));

        // Back to a good pair.
        let (d_cert, d_key) = pem_pair();
        write(&d_cert, &d_key);
        assert_eq!(watch.check(&resolver), Check::Reloaded);
        assert_eq!(served(&resolver), der(&d_cert));
    }

    #[test]
    fn a_mismatched_pair_at_start_is_an_error() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (cert, key) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
        let (a_cert, _) = pem_pair();
        let (_, b_key) = pem_pair();
        std::fs::write(&cert, a_cert).expect("write cert");
        std::fs::write(&key, b_key).expect("write key");
        let e = server_config(Some(&cert), Some(&key), None, &[], DEFAULT_RELOAD_INTERVAL)
            .expect_err("mismatch");
        assert!(matches!(e, Error::KeyPair { .. }), "{e}");
    }
}
