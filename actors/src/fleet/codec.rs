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

    #[test]
    fn snapshot_requests_read_since_or_nothing() {
        assert_eq!(since_of(br#"{"sinceRv":12}"#), Some(12));
        assert_eq!(since_of(b"{}"), None);
        assert_eq!(since_of(b"garbage"), None);
    }
}
