//! The replica's NATS connection (credentials, TLS, its own inbox prefix) and the sealing
//! key ring, both from `[nats]`.

use std::sync::Arc;
use std::time::Duration;

use async_nats::{Client, ConnectOptions};
use base64::Engine;
use thiserror::Error;

use crate::config::NatsConfig;
use crate::core::seal::{self, Keyring};
use crate::core::sign::{self, Signer, Verifier};
use crate::metrics as m;

#[derive(Debug, Error)]
pub enum Error {
    #[error("cannot read {what} {path}: {source}")]
    File {
        what: &'static str,
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("encryption key {id:?} in {path} is not base64: {source}")]
    KeyEncoding {
        id: String,
        path: String,
        #[source]
        source: base64::DecodeError,
    },
    #[error(transparent)]
    Keyring(#[from] seal::Error),
    #[error(transparent)]
    Signing(#[from] sign::Error),
    #[error("nats.verify_key_files without nats.signing_key_file: a replica that owns a key must sign what it publishes")]
    VerifyWithoutSigning,
    #[error("with --nats, objects of {0:?} are sealed on NATS: set [nats] encryption_keys and encryption_active_key (or remove it from encrypt_resources)")]
    NoEncryptionKey(String),
    #[error("[nats] {name} = {value:?} is not a NATS subject prefix (dot-separated tokens, no wildcards or whitespace)")]
    Prefix { name: &'static str, value: String },
    #[error(transparent)]
    Retain(#[from] crate::core::retain::Error),
    #[error("[nats] tls_cert_file and tls_key_file go together: set both or neither")]
    HalfClientCertificate,
    #[error("cannot connect to NATS at {url}: {source}")]
    Connect {
        url: String,
        #[source]
        source: async_nats::ConnectError,
    },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Connects to NATS with the configured credentials. The client connects (and reconnects)
/// in the background, so a replica starts, and serves, while NATS is down.
///
/// A first attempt is made in the foreground: when it fails, its whole error chain is
/// logged (a refused TLS handshake's cause — "invalid peer certificate: UnknownIssuer" —
/// travels only in the error, never in the client's events), then the client keeps
/// trying in the background.
pub async fn connect(cfg: &NatsConfig, url: &str, replica: &str) -> Result<Client> {
    for (name, value) in [
        ("subject_prefix", &cfg.subject_prefix),
        ("inbox_prefix", &cfg.inbox_prefix),
    ] {
        if !valid_prefix(value) {
            return Err(Error::Prefix {
                name,
                value: value.clone(),
            });
        }
    }
    // `[nats] url` and `--nats` take a comma-separated list (every node of a cluster), which
    // async-nats reads as one address: split it.
    let urls: Vec<&str> = url
        .split(',')
        .map(str::trim)
        .filter(|u| !u.is_empty())
        .collect();
    match options(cfg, replica, false)
        .await?
        .connect(urls.as_slice())
        .await
    {
        Ok(client) => return Ok(client),
        Err(error) => {
            let mut cause = error.to_string();
            let mut source = std::error::Error::source(&error);
            while let Some(s) = source {
                cause.push_str(": ");
                cause.push_str(&s.to_string());
                source = s.source();
            }
            tracing::warn!(%url, error = %cause, "cannot connect to NATS; retrying in the background");
        }
    }
    options(cfg, replica, true)
        .await?
        .connect(urls.as_slice())
        .await
        .map_err(|source| Error::Connect {
            url: url.to_string(),
            source,
        })
}

/// The client's options; `retry_initial`: the first connection is retried in the
/// background (connect returns at once).
async fn options(cfg: &NatsConfig, replica: &str, retry_initial: bool) -> Result<ConnectOptions> {
    let read = |what: &'static str, path: &str| {
        std::fs::read_to_string(path).map_err(|source| Error::File {
            what,
            path: path.to_string(),
            source,
        })
    };
    let mut opts = ConnectOptions::new()
        .name(format!("kcache/{replica}"))
        // Answers to this replica's requests (JetStream, presence) arrive under its own
        // prefix, which only kcache's NATS user may read (docs/nats.md, Security).
        .custom_inbox_prefix(cfg.inbox_prefix.trim_end_matches('.'))
        .max_reconnects(None)
        .connection_timeout(Duration::from_secs(3))
        .event_callback(|event| async move {
            match event {
                async_nats::Event::Connected => {
                    metrics::gauge!(m::NATS_CONNECTED).set(1.0);
                    metrics::counter!(m::NATS_RECONNECTS).increment(1);
                    tracing::info!("connected to NATS");
                }
                async_nats::Event::Disconnected => {
                    metrics::gauge!(m::NATS_CONNECTED).set(0.0);
                    tracing::warn!("disconnected from NATS; reconnecting");
                }
                // Refused credentials, a failed handshake, a server's -ERR: an operator
                // must see these.
                e @ (async_nats::Event::ClientError(_) | async_nats::Event::ServerError(_)) => {
                    tracing::warn!(event = %e, "NATS error")
                }
                other => tracing::info!(event = %other, "NATS event"),
            }
        });
    let password = match (&cfg.password, &cfg.password_file) {
        (Some(p), _) => Some(p.clone()),
        // A Secret mounted as a file ends in a newline when written by hand.
        (None, Some(path)) => Some(
            read("NATS password file", path)?
                .trim_end_matches(['\r', '\n'])
                .to_string(),
        ),
        (None, None) => None,
    };
    if let (Some(user), Some(password)) = (&cfg.user, password) {
        opts = opts.user_and_password(user.clone(), password);
    }
    if let Some(path) = &cfg.token_file {
        opts = opts.token(read("NATS token file", path)?.trim().to_string());
    }
    if let Some(path) = &cfg.nkey_seed_file {
        opts = opts.nkey(read("NATS nkey seed file", path)?.trim().to_string());
    }
    if let Some(path) = &cfg.creds_file {
        opts = opts
            .credentials_file(path)
            .await
            .map_err(|source| Error::File {
                what: "NATS credentials file",
                path: path.clone(),
                source,
            })?;
    }
    if let Some(ca) = &cfg.tls_ca_file {
        opts = opts.add_root_certificates(ca.into()).require_tls(true);
    }
    match (&cfg.tls_cert_file, &cfg.tls_key_file) {
        (Some(cert), Some(key)) => {
            opts = opts.add_client_certificate(cert.into(), key.into());
        }
        (None, None) => {}
        // Half a client certificate would be ignored and show up only as the server's
        // refusal: say so at start.
        _ => return Err(Error::HalfClientCertificate),
    }
    if cfg.require_tls {
        opts = opts.require_tls(true);
    }
    if retry_initial {
        opts = opts.retry_on_initial_connect();
    }
    metrics::gauge!(m::NATS_CONNECTED).set(0.0);
    Ok(opts)
}

/// The key ring from `[nats] encryption_keys`; an error when something must be sealed and
/// there is no key (never fall back to plaintext).
pub fn load_keyring(cfg: &NatsConfig) -> Result<Option<Arc<Keyring>>> {
    if cfg.encryption_keys.is_empty() {
        return match cfg.encrypt_resources.first() {
            Some(r) => Err(Error::NoEncryptionKey(r.clone())),
            None => Ok(None),
        };
    }
    let mut keys = Vec::new();
    for k in &cfg.encryption_keys {
        keys.push((
            k.id.clone(),
            read_base64("encryption key file", &k.id, &k.file)?,
        ));
    }
    let active = cfg
        .encryption_active_key
        .clone()
        .unwrap_or_else(|| cfg.encryption_keys[0].id.clone());
    Ok(Some(Arc::new(Keyring::new(keys, &active)?)))
}

/// A key file's base64 content, decoded; `id` names the key in the error.
/// A request with a deadline (the JetStream API: lease writes and reads, the retention
/// stream); the answer's body.
pub(crate) async fn request(
    client: &Client,
    subject: String,
    headers: Option<async_nats::HeaderMap>,
    body: bytes::Bytes,
    deadline: Duration,
) -> Result<bytes::Bytes, String> {
    let req = async {
        match headers {
            Some(h) => client.request_with_headers(subject, h, body).await,
            None => client.request(subject, body).await,
        }
    };
    match tokio::time::timeout(deadline, req).await {
        Ok(Ok(msg)) => Ok(msg.payload),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err("timed out".into()),
    }
}

fn read_base64(what: &'static str, id: &str, path: &str) -> Result<Vec<u8>> {
    let text = std::fs::read_to_string(path).map_err(|source| Error::File {
        what,
        path: path.to_string(),
        source,
    })?;
    base64::engine::general_purpose::STANDARD
        .decode(text.trim())
        .map_err(|source| Error::KeyEncoding {
            id: id.to_string(),
            path: path.to_string(),
            source,
        })
}

/// The signing key in a file (a 32-byte Ed25519 seed, base64).
pub fn signer_from_file(path: &str) -> Result<Signer> {
    Ok(Signer::from_seed(&read_base64(
        "signing key file",
        "signing",
        path,
    )?)?)
}

/// The fleet's signing key and the public keys a mirror accepts (`[nats]
/// signing_key_file`, `verify_key_files`); none when the fleet does not sign. Public keys
/// without a signing key are an error: a replica that owns a key must sign what it
/// publishes for mirrors that verify.
pub fn load_signing(cfg: &NatsConfig) -> Result<Option<(Arc<Signer>, Arc<Verifier>)>> {
    let Some(file) = &cfg.signing_key_file else {
        if !cfg.verify_key_files.is_empty() {
            return Err(Error::VerifyWithoutSigning);
        }
        return Ok(None);
    };
    let signer = signer_from_file(file)?;
    let mut public = vec![signer.public_key().to_vec()];
    for f in &cfg.verify_key_files {
        public.push(read_base64("verify key file", "verify", f)?);
    }
    let verifier = Verifier::new(public)?;
    Ok(Some((Arc::new(signer), Arc::new(verifier))))
}

/// Dot-separated non-empty tokens without wildcards or whitespace.
fn valid_prefix(p: &str) -> bool {
    !p.is_empty()
        && p.split('.').all(|t| {
            !t.is_empty()
                && !t
                    .chars()
                    .any(|c| c == '*' || c == '>' || c.is_whitespace() || c.is_control())
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_are_plain_subject_tokens() {
        for ok in ["kcache", "_KCACHE_INBOX", "team.kcache", "a-b_c"] {
            assert!(valid_prefix(ok), "{ok}");
        }
        for bad in ["", "a..b", ".a", "a.", "a.*", ">", "a b", "a\tb"] {
            assert!(!valid_prefix(bad), "{bad:?}");
        }
    }
}
