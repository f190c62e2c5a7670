//! The NATS payload contract (`docs/nats.md`): message headers, and chunking of payloads
//! larger than the server's `max_payload`.
//!
//! An event message's body is the event exactly as the watch API sends it
//! (`{"type":"MODIFIED","object":{…}}\n`), sealed for Secrets; a snapshot's body is a
//! `List` with `metadata.resourceVersion`. Headers carry what a mirror needs to order and
//! fence them: the owner's epoch, the key's sequence number and the resourceVersion.
//! A body above the chunk size is sent as consecutive messages `Kcache-Chunk: i/n` on the
//! same subject; NATS keeps one publisher's order on one subject, so a receiver only
//! reassembles a run of chunks and treats anything else as a gap.

use bytes::{Bytes, BytesMut};
use thiserror::Error;

pub const H_TYPE: &str = "Kcache-Type";
pub const H_EPOCH: &str = "Kcache-Epoch";
pub const H_SEQ: &str = "Kcache-Seq";
pub const H_RV: &str = "Kcache-Rv";
pub const H_OWNER: &str = "Kcache-Owner";
pub const H_CHUNK: &str = "Kcache-Chunk";
pub const H_KEY_ID: &str = "Kcache-Key-Id";

#[derive(Debug, Error, PartialEq, Eq)]
pub enum Error {
    #[error("missing or malformed header {0}")]
    Header(&'static str),
    #[error("unknown message type {0:?}")]
    Type(String),
    #[error("chunk {index}/{total} out of order (expected {expected})")]
    ChunkOrder {
        index: u32,
        total: u32,
        expected: u32,
    },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// One watch event.
    Event,
    /// The owner's periodic "last seq, progress RV" on a key's event subject.
    Heartbeat,
    /// A snapshot chunk, sent to a request's reply inbox.
    Snapshot,
    /// Instead of a snapshot, the events after the requester's RV (from the owner's
    /// window), one watch line each: the requester then misses no event at all.
    Replay,
    /// The owner is not synced yet (answer to a snapshot request): retry shortly.
    NotReady,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Event => "event",
            Kind::Heartbeat => "heartbeat",
            Kind::Snapshot => "snapshot",
            Kind::Replay => "replay",
            Kind::NotReady => "not-ready",
        }
    }
}

/// The headers of one message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    pub kind: Kind,
    pub epoch: u64,
    pub seq: u64,
    pub rv: u64,
    pub owner: String,
    /// `(index, total)`, 1-based, when the body is one chunk of several.
    pub chunk: Option<(u32, u32)>,
    /// The encryption key id when the body is sealed.
    pub key_id: Option<String>,
}

impl Frame {
    /// Header name/value pairs, in a stable order.
    pub fn headers(&self) -> Vec<(&'static str, String)> {
        let mut h = vec![
            (H_TYPE, self.kind.as_str().to_string()),
            (H_EPOCH, self.epoch.to_string()),
            (H_SEQ, self.seq.to_string()),
            (H_RV, self.rv.to_string()),
            (H_OWNER, self.owner.clone()),
        ];
        if let Some((i, n)) = self.chunk {
            h.push((H_CHUNK, format!("{i}/{n}")));
        }
        if let Some(id) = &self.key_id {
            h.push((H_KEY_ID, id.clone()));
        }
        h
    }

    /// Reads a frame through a header lookup.
    pub fn parse<'a>(get: impl Fn(&str) -> Option<&'a str>) -> Result<Frame> {
        let num = |name: &'static str| -> Result<u64> {
            get(name)
                .and_then(|v| v.trim().parse().ok())
                .ok_or(Error::Header(name))
        };
        let kind = match get(H_TYPE).ok_or(Error::Header(H_TYPE))? {
            "event" => Kind::Event,
            "heartbeat" => Kind::Heartbeat,
            "snapshot" => Kind::Snapshot,
            "replay" => Kind::Replay,
            "not-ready" => Kind::NotReady,
            other => return Err(Error::Type(other.to_string())),
        };
        let chunk = match get(H_CHUNK) {
            None => None,
            Some(v) => {
                let (i, n) = v.split_once('/').ok_or(Error::Header(H_CHUNK))?;
                let i: u32 = i.parse().map_err(|_| Error::Header(H_CHUNK))?;
                let n: u32 = n.parse().map_err(|_| Error::Header(H_CHUNK))?;
                if i == 0 || i > n {
                    return Err(Error::Header(H_CHUNK));
                }
                Some((i, n))
            }
        };
        Ok(Frame {
            kind,
            epoch: num(H_EPOCH)?,
            seq: num(H_SEQ)?,
            rv: num(H_RV)?,
            owner: get(H_OWNER).unwrap_or("").to_string(),
            chunk,
            key_id: get(H_KEY_ID).map(str::to_string),
        })
    }
}

/// Splits a body into chunks of at most `max` bytes (at least one, possibly empty).
pub fn split(body: Bytes, max: usize) -> Vec<Bytes> {
    let max = max.max(1);
    if body.len() <= max {
        return vec![body];
    }
    let mut out = Vec::with_capacity(body.len().div_ceil(max));
    let mut rest = body;
    while !rest.is_empty() {
        let n = rest.len().min(max);
        out.push(rest.split_to(n));
    }
    out
}

/// Reassembles a run of chunks of one message.
#[derive(Debug, Default)]
pub struct Reassembler {
    partial: Option<Partial>,
}

#[derive(Debug)]
struct Partial {
    seq: u64,
    total: u32,
    next: u32,
    buf: BytesMut,
}

impl Reassembler {
    /// Feeds one message; returns the whole body once its last chunk arrived. A chunk out
    /// of order (a lost chunk, or another message in between) drops what was collected and
    /// is an error the caller treats as a gap.
    pub fn feed(&mut self, frame: &Frame, body: Bytes) -> Result<Option<Bytes>> {
        let Some((index, total)) = frame.chunk else {
            if let Some(p) = self.partial.take() {
                return Err(Error::ChunkOrder {
                    index: 0,
                    total: p.total,
                    expected: p.next,
                });
            }
            return Ok(Some(body));
        };
        let expected = match &self.partial {
            Some(p) if p.seq == frame.seq && p.total == total => p.next,
            Some(p) => {
                let expected = p.next;
                self.partial = None;
                return Err(Error::ChunkOrder {
                    index,
                    total,
                    expected,
                });
            }
            None => 1,
        };
        if index != expected {
            self.partial = None;
            return Err(Error::ChunkOrder {
                index,
                total,
                expected,
            });
        }
        let p = self.partial.get_or_insert_with(|| Partial {
            seq: frame.seq,
            total,
            next: 1,
            buf: BytesMut::new(),
        });
        p.buf.extend_from_slice(&body);
        p.next += 1;
        if index == total {
            let done = self.partial.take().map(|p| p.buf.freeze());
            return Ok(done);
        }
        Ok(None)
    }

    /// Forgets a partial message (after a resync).
    pub fn reset(&mut self) {
        self.partial = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn frame(seq: u64, chunk: Option<(u32, u32)>) -> Frame {
        Frame {
            kind: Kind::Event,
            epoch: 7,
            seq,
            rv: 100 + seq,
            owner: "a".into(),
            chunk,
            key_id: None,
        }
    }

    #[test]
    fn headers_round_trip() {
        let mut f = frame(3, Some((2, 5)));
        f.key_id = Some("k1".into());
        let map: HashMap<_, _> = f.headers().into_iter().collect();
        let parsed = Frame::parse(|n| map.get(n).map(String::as_str)).unwrap();
        assert_eq!(parsed, f);
        let mut bad = map.clone();
        bad.insert(H_SEQ, "x".into());
        assert_eq!(
            Frame::parse(|n| bad.get(n).map(String::as_str)),
            Err(Error::Header(H_SEQ))
        );
        let mut bad = map.clone();
        bad.insert(H_CHUNK, "6/5".into());
        assert!(Frame::parse(|n| bad.get(n).map(String::as_str)).is_err());
        let mut bad = map;
        bad.insert(H_TYPE, "what".into());
        assert!(matches!(
            Frame::parse(|n| bad.get(n).map(String::as_str)),
            Err(Error::Type(_))
        ));
    }

    #[test]
    fn split_and_reassemble() {
        let body = Bytes::from((0..2500u32).map(|i| i as u8).collect::<Vec<_>>());
        let parts = split(body.clone(), 1000);
        assert_eq!(
            parts.iter().map(Bytes::len).collect::<Vec<_>>(),
            [1000, 1000, 500]
        );
        let mut r = Reassembler::default();
        let n = parts.len() as u32;
        let mut out = None;
        for (i, p) in parts.into_iter().enumerate() {
            out = r.feed(&frame(9, Some((i as u32 + 1, n))), p).unwrap();
        }
        assert_eq!(out, Some(body));
        assert_eq!(split(Bytes::new(), 10).len(), 1);
        // Unchunked messages pass straight through.
        assert_eq!(
            r.feed(&frame(10, None), Bytes::from_static(b"x")).unwrap(),
            Some(Bytes::from_static(b"x"))
        );
    }

    #[test]
    fn a_lost_chunk_is_an_error_not_a_corrupt_message() {
        let mut r = Reassembler::default();
        assert_eq!(
            r.feed(&frame(1, Some((1, 3))), Bytes::from_static(b"a")),
            Ok(None)
        );
        // Chunk 2 lost.
        assert!(r
            .feed(&frame(1, Some((3, 3))), Bytes::from_static(b"c"))
            .is_err());
        // A message of another seq interleaved.
        assert_eq!(
            r.feed(&frame(2, Some((1, 2))), Bytes::from_static(b"a")),
            Ok(None)
        );
        assert!(r.feed(&frame(3, None), Bytes::from_static(b"z")).is_err());
        // A run starting in the middle.
        assert!(r
            .feed(&frame(4, Some((2, 2))), Bytes::from_static(b"b"))
            .is_err());
        // And it recovers on the next whole run.
        assert_eq!(
            r.feed(&frame(5, Some((1, 1))), Bytes::from_static(b"q")),
            Ok(Some(Bytes::from_static(b"q")))
        );
    }
}
