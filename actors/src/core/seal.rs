//! Sealing payloads that must never be plaintext on NATS (Secrets: their data and their
//! annotations, which can carry the data too, e.g. `last-applied-configuration`).
//!
//! ChaCha20-Poly1305 (AEAD) with keys from config, named by a key id that travels in a
//! message header so keys can be rotated: seal with the active key, open with any key
//! in the ring. A sealed payload is `nonce (12 bytes) ‖ ciphertext ‖ tag`; the
//! associated data binds it to its key's subject token, so a sealed event cannot be
//! replayed onto another key's subject.

use std::collections::HashMap;

use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, CHACHA20_POLY1305, NONCE_LEN};
use ring::rand::{SecureRandom, SystemRandom};
use thiserror::Error;

#[derive(Debug, Error, PartialEq, Eq)]
pub enum Error {
    #[error("encryption key {id:?} must be 32 bytes, got {len}")]
    KeyLength { id: String, len: usize },
    #[error("the active encryption key {0:?} is not in the key ring")]
    NoActiveKey(String),
    #[error("no encryption key {0:?} to open this payload (was it rotated out?)")]
    UnknownKey(String),
    #[error("sealed payload is too short")]
    Truncated,
    #[error("sealed payload failed authentication (wrong key or tampered)")]
    Open,
    #[error("could not draw a nonce")]
    Random,
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The keys a replica may open with, and the one it seals with.
pub struct Keyring {
    active: String,
    keys: HashMap<String, LessSafeKey>,
    rng: SystemRandom,
}

impl std::fmt::Debug for Keyring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut ids: Vec<_> = self.keys.keys().collect();
        ids.sort();
        f.debug_struct("Keyring")
            .field("active", &self.active)
            .field("keys", &ids)
            .finish()
    }
}

impl Keyring {
    pub fn new(keys: Vec<(String, Vec<u8>)>, active: &str) -> Result<Self> {
        let mut ring = HashMap::new();
        for (id, bytes) in keys {
            let unbound =
                UnboundKey::new(&CHACHA20_POLY1305, &bytes).map_err(|_| Error::KeyLength {
                    id: id.clone(),
                    len: bytes.len(),
                })?;
            ring.insert(id, LessSafeKey::new(unbound));
        }
        if !ring.contains_key(active) {
            return Err(Error::NoActiveKey(active.to_string()));
        }
        Ok(Keyring {
            active: active.to_string(),
            keys: ring,
            rng: SystemRandom::new(),
        })
    }

    pub fn active_id(&self) -> &str {
        &self.active
    }

    /// Seals `plaintext` with the active key; returns its id and the sealed bytes.
    pub fn seal(&self, plaintext: &[u8], aad: &[u8]) -> Result<(&str, Vec<u8>)> {
        let key = self
            .keys
            .get(&self.active)
            .ok_or_else(|| Error::NoActiveKey(self.active.clone()))?;
        let mut nonce = [0u8; NONCE_LEN];
        self.rng.fill(&mut nonce).map_err(|_| Error::Random)?;
        let mut out = Vec::with_capacity(NONCE_LEN + plaintext.len() + 16);
        out.extend_from_slice(&nonce);
        out.extend_from_slice(plaintext);
        let tag = key
            .seal_in_place_separate_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(aad),
                &mut out[NONCE_LEN..],
            )
            .map_err(|_| Error::Open)?;
        out.extend_from_slice(tag.as_ref());
        Ok((&self.active, out))
    }

    /// Opens a payload sealed with key `id`.
    pub fn open(&self, id: &str, sealed: &[u8], aad: &[u8]) -> Result<Vec<u8>> {
        let key = self
            .keys
            .get(id)
            .ok_or_else(|| Error::UnknownKey(id.to_string()))?;
        if sealed.len() < NONCE_LEN + 16 {
            return Err(Error::Truncated);
        }
        let (nonce, body) = sealed.split_at(NONCE_LEN);
        let nonce = Nonce::try_assume_unique_for_key(nonce).map_err(|_| Error::Truncated)?;
        let mut buf = body.to_vec();
        let plain = key
            .open_in_place(nonce, Aad::from(aad), &mut buf)
            .map_err(|_| Error::Open)?;
        let n = plain.len();
        buf.truncate(n);
        Ok(buf)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ring2() -> Keyring {
        Keyring::new(
            vec![("k1".into(), vec![1; 32]), ("k2".into(), vec![2; 32])],
            "k2",
        )
        .unwrap()
    }

    #[test]
    fn seal_then_open_with_the_named_key() {
        let r = ring2();
        let (id, sealed) = r.seal(b"top secret data", b"tok").unwrap();
        assert_eq!(id, "k2");
        assert!(!sealed.windows(6).any(|w| w == b"secret"));
        assert_eq!(r.open("k2", &sealed, b"tok").unwrap(), b"top secret data");
        // Another key, another subject, or a flipped bit: refused.
        assert_eq!(r.open("k1", &sealed, b"tok"), Err(Error::Open));
        assert_eq!(r.open("k2", &sealed, b"other"), Err(Error::Open));
        let mut bad = sealed.clone();
        bad[20] ^= 1;
        assert_eq!(r.open("k2", &bad, b"tok"), Err(Error::Open));
        assert_eq!(
            r.open("k9", &sealed, b"tok"),
            Err(Error::UnknownKey("k9".into()))
        );
        assert_eq!(r.open("k2", &sealed[..10], b"tok"), Err(Error::Truncated));
    }

    #[test]
    fn rotation_opens_old_payloads() {
        let old = Keyring::new(vec![("k1".into(), vec![1; 32])], "k1").unwrap();
        let (_, sealed) = old.seal(b"x", b"").unwrap();
        assert_eq!(ring2().open("k1", &sealed, b"").unwrap(), b"x");
    }

    #[test]
    fn bad_configuration_is_reported() {
        assert!(matches!(
            Keyring::new(vec![("k".into(), vec![0; 16])], "k"),
            Err(Error::KeyLength { len: 16, .. })
        ));
        assert!(matches!(
            Keyring::new(vec![("k".into(), vec![0; 32])], "other"),
            Err(Error::NoActiveKey(_))
        ));
    }

    #[test]
    fn nonces_differ() {
        let r = ring2();
        let (_, a) = r.seal(b"same", b"").unwrap();
        let (_, b) = r.seal(b"same", b"").unwrap();
        assert_ne!(a, b);
    }
}
