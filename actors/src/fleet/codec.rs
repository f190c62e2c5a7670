//! Reading and writing a key's NATS messages beyond the headers (`core::wire`): opening
//! sealed bodies bound to their headers, snapshot and replay bodies, snapshot requests.

use std::sync::Arc;

use async_nats::Message;
use bytes::Bytes;
use serde::Deserialize;
use thiserror::Error;

use crate::core::event::StoreEvent;
use crate::core::object;
use crate::core::seal::Keyring;
use crate::core::sign::{self, Signer, Verifier};
use crate::core::wire::{self, Frame, Reassembler};
use crate::feed::OwnerSnapshot;
use crate::metrics as m;

#[derive(Debug, Error)]
pub enum Error {
    #[error("no headers")]
    NoHeaders,
    #[error(transparent)]
    Wire(#[from] wire::Error),
    #[error("sealed with key {0:?} but this replica has no keys")]
    NoKeys(String),
    #[error("a sealed resource's message arrived unsealed; refused")]
    Plaintext,
    #[error("sealed message does not authenticate (wrong key, or its headers or body were changed): {0}")]
    Unauthenticated(crate::core::seal::Error),
    #[error("message not signed by a replica of this fleet: {0}")]
    Signature(sign::Error),
}

impl Error {
    /// Counts a refused message by why.
    pub fn count(&self) {
        match self {
            Error::Plaintext => {
                metrics::counter!(m::FLEET_REJECTED, "reason" => "plaintext").increment(1)
            }
            Error::Unauthenticated(_) | Error::NoKeys(_) => {
                metrics::counter!(m::FLEET_REJECTED, "reason" => "unauthenticated").increment(1)
            }
            Error::Signature(e) => {
                metrics::counter!(m::FLEET_REJECTED, "reason" => refusal(e)).increment(1)
            }
            Error::Wire(wire::Error::TooLarge { .. }) => {
                metrics::counter!(m::FLEET_OVERSIZED).increment(1)
            }
            _ => {}
        }
        metrics::counter!(m::FLEET_BAD_MESSAGES).increment(1);
    }
}

/// A message's headers.
pub fn frame(msg: &Message) -> Result<Frame, Error> {
    let headers = msg.headers.as_ref().ok_or(Error::NoHeaders)?;
    Ok(Frame::parse(|name| headers.get(name).map(|v| v.as_str()))?)
}

/// How a key's messages are opened.
#[derive(Clone)]
pub struct Opener {
    /// The key's token, bound into every seal.
    pub token: String,
    /// Set when the key's resource is sealed: then every message must be sealed.
    pub keyring: Option<Arc<Keyring>>,
    /// Set when the fleet signs (`nats.signing_key_file`): then every message must carry
    /// a signature of one of these keys.
    pub verifier: Option<Arc<Verifier>>,
}

impl Opener {
    /// Feeds one message into `parts` and, once its body is whole, opens it. A sealed
    /// resource's message must carry a seal over its body and its headers; an unsealed
    /// resource's message must not claim one it cannot check.
    pub fn body(
        &self,
        frame: &Frame,
        msg: &Message,
        parts: &mut Reassembler,
    ) -> Result<Option<Bytes>, Error> {
        let Some(body) = parts.feed(frame, msg.payload.clone())? else {
            return Ok(None);
        };
        if let Some(verifier) = &self.verifier {
            verifier
                .verify(
                    signature(msg),
                    &[&frame.associated_data(&self.token), &body],
                )
                .map_err(Error::Signature)?;
        }
        match (&frame.key_id, &self.keyring) {
            (Some(id), Some(ring)) => ring
                .open(id, &body, &frame.associated_data(&self.token))
                .map(|b| Some(Bytes::from(b)))
                .map_err(Error::Unauthenticated),
            (Some(id), None) => Err(Error::NoKeys(id.clone())),
            (None, Some(_)) => Err(Error::Plaintext),
            (None, None) => Ok(Some(body)),
        }
    }
}

/// One body as the messages an owner publishes (`listener::Outlet::send`): sealed when the
/// key's resource is — every message, an empty heartbeat too, with its headers as
/// associated data (`Frame::associated_data`), since a mirror trusts no header a seal
/// does not vouch for — signed over what a mirror checks when the fleet signs (the headers
/// it trusts and the body as sent), then chunked. Each message: its headers, its part.
pub fn encode(
    mut frame: Frame,
    token: &str,
    body: Bytes,
    keyring: Option<&Keyring>,
    signer: Option<&Signer>,
    chunk_max: usize,
) -> Result<Vec<(async_nats::HeaderMap, Bytes)>, crate::core::seal::Error> {
    let body = match keyring {
        Some(ring) => {
            frame.key_id = Some(ring.active_id().to_string());
            let ad = frame.associated_data(token);
            let (_, sealed) = ring.seal(&body, &ad)?;
            Bytes::from(sealed)
        }
        None => body,
    };
    let signature = signer.map(|s| s.sign(&[&frame.associated_data(token), &body]));
    let parts = wire::split(body, chunk_max);
    let total = parts.len() as u32;
    Ok(parts
        .into_iter()
        .enumerate()
        .map(|(i, part)| {
            frame.chunk = (total > 1).then_some((i as u32 + 1, total));
            let mut headers = async_nats::HeaderMap::new();
            for (name, value) in frame.headers() {
                headers.insert(name, value.as_str());
            }
            if let Some(sig) = &signature {
                headers.insert(wire::H_SIGNATURE, sig.as_str());
            }
            (headers, part)
        })
        .collect())
}

/// A message's `Kcache-Signature`, if any.
fn signature(msg: &Message) -> Option<&str> {
    msg.headers
        .as_ref()
        .and_then(|h| h.get(wire::H_SIGNATURE))
        .map(|v| v.as_str())
}

/// The `kcache_fleet_rejected_messages_total` reason of a signature refused.
fn refusal(e: &sign::Error) -> &'static str {
    match e {
        sign::Error::Unsigned => "unsigned",
        _ => "forged",
    }
}

/// What a control message's signature covers (interest gossip, presence beacons): its
/// subject, which names the replica it speaks for, and its body, domain-separated from a
/// key's messages.
fn control_signed(subject: &str, body: &[u8]) -> Vec<u8> {
    let mut m = Vec::with_capacity(24 + subject.len() + body.len());
    m.extend_from_slice(b"kcache-control-v1");
    m.extend_from_slice(&(subject.len() as u32).to_be_bytes());
    m.extend_from_slice(subject.as_bytes());
    m.extend_from_slice(body);
    m
}

/// Headers signing a control message on `subject` (none when the fleet does not sign).
pub fn control_headers(
    signer: Option<&sign::Signer>,
    subject: &str,
    body: &[u8],
) -> Option<async_nats::HeaderMap> {
    let signer = signer?;
    let mut h = async_nats::HeaderMap::new();
    h.insert(
        wire::H_SIGNATURE,
        signer.sign(&[&control_signed(subject, body)]).as_str(),
    );
    Some(h)
}

/// Whether a control message may be acted on: always when the fleet does not sign, else
/// only with a signature of one of its keys; a refusal is counted.
pub fn control_verified(verifier: Option<&Verifier>, msg: &Message) -> bool {
    let Some(verifier) = verifier else {
        return true;
    };
    match verifier.verify(
        signature(msg),
        &[&control_signed(msg.subject.as_str(), &msg.payload)],
    ) {
        Ok(()) => true,
        Err(e) => {
            metrics::counter!(m::FLEET_REJECTED, "reason" => refusal(&e)).increment(1);
            false
        }
    }
}

/// A snapshot request's body: `{"sinceRv": N}` or `{}`.
pub fn since_of(payload: &[u8]) -> Option<u64> {
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Request {
        since_rv: Option<u64>,
    }
    serde_json::from_slice::<Request>(payload)
        .ok()
        .and_then(|r| r.since_rv)
}

/// A replay body: the events' watch lines, one after another.
pub fn encode_replay(events: &[Arc<StoreEvent>]) -> Bytes {
    let mut out = Vec::with_capacity(events.iter().map(|e| e.line.len()).sum());
    for e in events {
        out.extend_from_slice(&e.line);
    }
    Bytes::from(out)
}

/// A snapshot body: a `List` as the API server would answer it, the objects' own bytes.
pub fn encode_list(snap: &OwnerSnapshot) -> Bytes {
    let head = object::list_head("List", "v1", snap.rv);
    let size = head.len()
        + snap
            .objects
            .iter()
            .map(|o| o.json().len() + 1)
            .sum::<usize>()
        + 2;
    let mut out = Vec::with_capacity(size);
    out.extend_from_slice(&head);
    let mut items = object::ListWriter::new(usize::MAX);
    for o in &snap.objects {
        // An unbounded chunk never fills: the whole list comes out of `finish`.
        let _ = items.push(o.json());
    }
    out.extend_from_slice(&items.finish());
    Bytes::from(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::wire::Kind;

    fn ring() -> Arc<Keyring> {
        Arc::new(Keyring::new(vec![("k1".into(), vec![7; 32])], "k1").expect("ring"))
    }

    fn message(frame: &Frame, body: Vec<u8>) -> Message {
        let mut headers = async_nats::HeaderMap::new();
        for (n, v) in frame.headers() {
            headers.insert(n, v.as_str());
        }
        Message {
            subject: "kcache.ev.t".into(),
            reply: None,
            payload: Bytes::from(body),
            headers: Some(headers),
            status: None,
            description: None,
            length: 0,
        }
    }

    fn sealed(frame: &Frame, token: &str, body: &[u8]) -> Vec<u8> {
        ring()
            .seal(body, &frame.associated_data(token))
            .expect("seal")
            .1
    }

    fn heartbeat() -> Frame {
        Frame {
            kind: Kind::Heartbeat,
            epoch: 3,
            seq: 10,
            rv: 500,
            owner: "a".into(),
            chunk: None,
            key_id: Some("k1".into()),
        }
    }

    #[test]
    fn a_sealed_message_opens_only_with_its_own_headers_and_key() {
        let opener = Opener {
            token: "t".into(),
            keyring: Some(ring()),
            verifier: None,
        };
        let f = heartbeat();
        let body = sealed(&f, "t", b"");
        let mut parts = Reassembler::new(1 << 20);
        let msg = message(&f, body.clone());
        assert_eq!(
            opener.body(&f, &msg, &mut parts).expect("opens"),
            Some(Bytes::new())
        );
        // The same seal under an edited header (a heartbeat made to claim a higher RV, a
        // replayed event given a new seq) or on another key is refused.
        for edited in [
            Frame {
                rv: 501,
                ..f.clone()
            },
            Frame {
                seq: 11,
                ..f.clone()
            },
            Frame {
                epoch: 4,
                ..f.clone()
            },
            Frame {
                owner: "b".into(),
                ..f.clone()
            },
        ] {
            let msg = message(&edited, body.clone());
            assert!(matches!(
                opener.body(&edited, &msg, &mut parts),
                Err(Error::Unauthenticated(_))
            ));
        }
        let other = Opener {
            token: "u".into(),
            keyring: Some(ring()),
            verifier: None,
        };
        assert!(matches!(
            other.body(&f, &message(&f, body), &mut parts),
            Err(Error::Unauthenticated(_))
        ));
    }

    #[test]
    fn a_sealed_resource_refuses_plaintext_even_an_empty_heartbeat() {
        let opener = Opener {
            token: "t".into(),
            keyring: Some(ring()),
            verifier: None,
        };
        let f = Frame {
            key_id: None,
            ..heartbeat()
        };
        let mut parts = Reassembler::new(1 << 20);
        assert!(matches!(
            opener.body(&f, &message(&f, Vec::new()), &mut parts),
            Err(Error::Plaintext)
        ));
        let plain = Opener {
            token: "t".into(),
            keyring: None,
            verifier: None,
        };
        assert_eq!(
            plain
                .body(&f, &message(&f, b"x".to_vec()), &mut parts)
                .expect("plain"),
            Some(Bytes::from_static(b"x"))
        );
        let claimed = heartbeat();
        assert!(matches!(
            plain.body(&claimed, &message(&claimed, b"x".to_vec()), &mut parts),
            Err(Error::NoKeys(_))
        ));
    }

    /// Where the fleet signs, a mirror opens only what a holder of the signing key sent,
    /// unchanged: an unsealed kind (a Pod event) forged by any other publisher is refused.
    #[test]
    fn a_signing_fleet_opens_only_what_its_replicas_signed() {
        use crate::core::sign::Signer;
        let replica = Signer::from_seed(&[1; 32]).expect("seed");
        let stranger = Signer::from_seed(&[2; 32]).expect("seed");
        let opener = Opener {
            token: "t".into(),
            keyring: None,
            verifier: Some(Arc::new(
                Verifier::new(vec![replica.public_key().to_vec()]).expect("verifier"),
            )),
        };
        let f = Frame {
            kind: Kind::Event,
            key_id: None,
            ..heartbeat()
        };
        let body = b"{\"type\":\"ADDED\",\"object\":{}}\n".to_vec();
        let signed = |s: &Signer, frame: &Frame, body: &[u8]| {
            let mut m = message(frame, body.to_vec());
            let sig = s.sign(&[&frame.associated_data("t"), body]);
            if let Some(h) = m.headers.as_mut() {
                h.insert(wire::H_SIGNATURE, sig.as_str());
            }
            m
        };
        let mut parts = Reassembler::new(1 << 20);
        assert_eq!(
            opener
                .body(&f, &signed(&replica, &f, &body), &mut parts)
                .expect("signed by a replica"),
            Some(Bytes::from(body.clone()))
        );
        let refused = |m: Message, frame: &Frame, parts: &mut Reassembler| match opener
            .body(frame, &m, parts)
        {
            Err(Error::Signature(e)) => e,
            other => panic!("not refused: {other:?}"),
        };
        assert_eq!(
            refused(message(&f, body.clone()), &f, &mut parts),
            sign::Error::Unsigned
        );
        assert!(matches!(
            refused(signed(&stranger, &f, &body), &f, &mut parts),
            sign::Error::UnknownKey(_)
        ));
        // A replica's signature on another body, or with a header changed on the way.
        let other_body = signed(&replica, &f, b"{}\n");
        let mut swapped = signed(&replica, &f, &body);
        swapped.headers = other_body.headers.clone();
        assert_eq!(refused(swapped, &f, &mut parts), sign::Error::Forged);
        let later = Frame {
            seq: 11,
            ..f.clone()
        };
        let mut moved = signed(&replica, &f, &body);
        moved.headers = message(&later, Vec::new()).headers;
        if let (Some(h), Some(orig)) = (moved.headers.as_mut(), signed(&replica, &f, &body).headers)
        {
            if let Some(sig) = orig.get(wire::H_SIGNATURE) {
                h.insert(wire::H_SIGNATURE, sig.as_str());
            }
        }
        assert_eq!(refused(moved, &later, &mut parts), sign::Error::Forged);
    }

    /// Interest and presence are heard only when a replica of the fleet signed them for
    /// the subject they came on (a beacon replayed as another replica's does not verify).
    #[test]
    fn control_messages_verify_for_their_own_subject() {
        use crate::core::sign::Signer;
        let replica = Signer::from_seed(&[1; 32]).expect("seed");
        let verifier = Verifier::new(vec![replica.public_key().to_vec()]).expect("verifier");
        let msg = |subject: &str, headers: Option<async_nats::HeaderMap>| Message {
            subject: subject.into(),
            reply: None,
            payload: Bytes::from_static(b"{\"upstreamOk\":true}"),
            headers,
            status: None,
            description: None,
            length: 0,
        };
        let body = b"{\"upstreamOk\":true}";
        let signed = control_headers(Some(&replica), "kcache.alive.a", body);
        assert!(control_verified(
            Some(&verifier),
            &msg("kcache.alive.a", signed.clone())
        ));
        assert!(!control_verified(
            Some(&verifier),
            &msg("kcache.alive.b", signed)
        ));
        assert!(!control_verified(
            Some(&verifier),
            &msg("kcache.alive.a", None)
        ));
        let stranger = Signer::from_seed(&[2; 32]).expect("seed");
        let forged = control_headers(Some(&stranger), "kcache.alive.a", body);
        assert!(!control_verified(
            Some(&verifier),
            &msg("kcache.alive.a", forged)
        ));
        // A fleet that does not sign hears everything, as before.
        assert!(control_headers(None, "kcache.alive.a", body).is_none());
        assert!(control_verified(None, &msg("kcache.alive.a", None)));
    }

    #[test]
    fn snapshot_requests_read_since_or_nothing() {
        assert_eq!(since_of(br#"{"sinceRv":12}"#), Some(12));
        assert_eq!(since_of(b"{}"), None);
        assert_eq!(since_of(b"garbage"), None);
    }
}
