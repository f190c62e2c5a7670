//! Signing what a key's owner publishes on NATS, so a mirror acts only on messages of a
//! replica. Sealing (`core::seal`) hides Secrets, but its key is symmetric and a mirror's
//! opening key is also a sealing one; unsealed kinds (Pods, ConfigMaps) had nothing at
//! all: anyone who may publish on a key's subject — a misconfigured account, a reader
//! given too much — could inject a Pod bound to a node. Ed25519 signatures separate the
//! two rights: replicas hold the fleet's signing key (a 32-byte seed) and sign every
//! message they publish on a key's subjects; whoever only verifies (a NATS subscriber, a
//! replica rotating keys) holds public keys and cannot forge one.
//!
//! A signature covers the message's associated data (`wire::Frame::associated_data`: the
//! key's token and every header a mirror trusts) and its whole body as sent (sealed, for a
//! sealed kind), and travels in the `Kcache-Signature` header as `<key id>.<base64>`; the
//! key id is the first 8 bytes of the public key's SHA-256, in hex, so keys rotate by
//! listing the next one's public key before signing with it.

use std::collections::HashMap;

use base64::Engine;
use ring::digest::{digest, SHA256};
use ring::signature::{Ed25519KeyPair, KeyPair, UnparsedPublicKey, ED25519};
use thiserror::Error;

#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum Error {
    #[error("a signing key is a 32-byte Ed25519 seed, got {0} bytes")]
    SeedLength(usize),
    #[error("a public key is 32 bytes, got {0}")]
    PublicKeyLength(usize),
    #[error("the message is not signed")]
    Unsigned,
    #[error("signature header is not `<key id>.<base64>`")]
    Malformed,
    #[error("signed with key {0:?}, which this replica does not know")]
    UnknownKey(String),
    #[error("signature does not verify (forged, or the message was changed)")]
    Forged,
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A public key's id: its SHA-256's first 8 bytes, in hex.
pub fn key_id(public_key: &[u8]) -> String {
    digest(&SHA256, public_key).as_ref()[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// What a replica signs with.
pub struct Signer {
    pair: Ed25519KeyPair,
    id: String,
}

impl std::fmt::Debug for Signer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Signer").field("id", &self.id).finish()
    }
}

impl Signer {
    pub fn from_seed(seed: &[u8]) -> Result<Self> {
        let pair =
            Ed25519KeyPair::from_seed_unchecked(seed).map_err(|_| Error::SeedLength(seed.len()))?;
        let id = key_id(pair.public_key().as_ref());
        Ok(Signer { pair, id })
    }

    pub fn public_key(&self) -> &[u8] {
        self.pair.public_key().as_ref()
    }

    pub fn id(&self) -> &str {
        &self.id
    }

    /// The `Kcache-Signature` value over `parts`, concatenated.
    pub fn sign(&self, parts: &[&[u8]]) -> String {
        let sig = self.pair.sign(&parts.concat());
        format!(
            "{}.{}",
            self.id,
            base64::engine::general_purpose::STANDARD_NO_PAD.encode(sig.as_ref())
        )
    }
}

/// The public keys a mirror accepts signatures of.
#[derive(Debug, Clone, Default)]
pub struct Verifier {
    keys: HashMap<String, Vec<u8>>,
}

impl Verifier {
    pub fn new(public_keys: Vec<Vec<u8>>) -> Result<Self> {
        let mut keys = HashMap::new();
        for k in public_keys {
            if k.len() != 32 {
                return Err(Error::PublicKeyLength(k.len()));
            }
            keys.insert(key_id(&k), k);
        }
        Ok(Verifier { keys })
    }

    /// Checks a `Kcache-Signature` value (`None`: absent) over `parts`, concatenated.
    pub fn verify(&self, header: Option<&str>, parts: &[&[u8]]) -> Result<()> {
        let header = header.ok_or(Error::Unsigned)?;
        let (id, sig) = header.split_once('.').ok_or(Error::Malformed)?;
        let sig = base64::engine::general_purpose::STANDARD_NO_PAD
            .decode(sig)
            .map_err(|_| Error::Malformed)?;
        let key = self
            .keys
            .get(id)
            .ok_or_else(|| Error::UnknownKey(id.to_string()))?;
        UnparsedPublicKey::new(&ED25519, key)
            .verify(&parts.concat(), &sig)
            .map_err(|_| Error::Forged)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn signer(seed: u8) -> Signer {
        Signer::from_seed(&[seed; 32]).expect("seed")
    }

    #[test]
    fn only_a_holder_of_the_signing_key_signs_what_verifies() {
        let s = signer(1);
        let v = Verifier::new(vec![s.public_key().to_vec()]).expect("verifier");
        let sig = s.sign(&[b"headers", b"body"]);
        assert_eq!(v.verify(Some(&sig), &[b"headers", b"body"]), Ok(()));
        // The parts are concatenated: where they split does not matter.
        assert_eq!(v.verify(Some(&sig), &[b"headersbody"]), Ok(()));
        // (the header, what it is checked over, the verdict)
        type Case<'a> = (Option<String>, &'a [&'a [u8]], Error);
        let cases: [Case; 5] = [
            (None, &[b"headersbody"], Error::Unsigned),
            (Some(sig.clone()), &[b"headersbody!"], Error::Forged),
            (Some("nodot".into()), &[b"x"], Error::Malformed),
            (Some(format!("{}.@@", s.id())), &[b"x"], Error::Malformed),
            (
                Some(signer(2).sign(&[b"headersbody"])),
                &[b"headersbody"],
                Error::UnknownKey(signer(2).id().to_string()),
            ),
        ];
        for (header, parts, want) in cases {
            assert_eq!(v.verify(header.as_deref(), parts), Err(want), "{header:?}");
        }
        // A signature of another key under this key's id does not verify.
        let other = signer(2).sign(&[b"headersbody"]);
        let (_, b64) = other.split_once('.').expect("dot");
        assert_eq!(
            v.verify(Some(&format!("{}.{b64}", s.id())), &[b"headersbody"]),
            Err(Error::Forged)
        );
    }

    #[test]
    fn keys_rotate_by_listing_the_next_public_key_first() {
        let (old, new) = (signer(1), signer(2));
        let v = Verifier::new(vec![old.public_key().to_vec(), new.public_key().to_vec()])
            .expect("verifier");
        for s in [&old, &new] {
            assert_eq!(v.verify(Some(&s.sign(&[b"m"])), &[b"m"]), Ok(()));
        }
        assert_ne!(old.id(), new.id());
        assert_eq!(old.id().len(), 16);
    }

    #[test]
    fn bad_keys_are_refused() {
        assert_eq!(
            Signer::from_seed(&[0; 31]).err(),
            Some(Error::SeedLength(31))
        );
        assert_eq!(
            Verifier::new(vec![vec![0; 33]]).err(),
            Some(Error::PublicKeyLength(33))
        );
    }
}
