//! The NATS payload contract (`docs/nats.md`): message headers, and chunking of payloads
//! larger than the server's `max_payload`.
//!
//! An event message's body is the event exactly as the watch API sends it
//! (`{"type":"MODIFIED","object":{…}}\n`), sealed for Secrets; a snapshot's body is a
//! `List` with `metadata.resourceVersion`. Headers carry what a mirror needs to order and
//! fence them: the owner's epoch, the key's sequence number and the resourceVersion.
//! A body above the chunk size is sent as consecutive messages `Kcache-Chunk: i/n` on the
//! same subject; NATS keeps one publisher's order on one subject, so a receiver only
//! reassembles a run of chunks and treats anything else as a gap. A reassembled message is
//! bounded in size: an over-limit run is rejected with [`Error::TooLarge`] before it is
//! collected, and a mirror treats it as a gap like any broken run.

use bytes::{Bytes, BytesMut};
use thiserror::Error;

pub const H_TYPE: &str = "Kcache-Type";
pub const H_EPOCH: &str = "Kcache-Epoch";
pub const H_SEQ: &str = "Kcache-Seq";
pub const H_RV: &str = "Kcache-Rv";
pub const H_OWNER: &str = "Kcache-Owner";
pub const H_CHUNK: &str = "Kcache-Chunk";
pub const H_KEY_ID: &str = "Kcache-Key-Id";
/// `<key id>.<base64 Ed25519 signature>` over the associated data and the whole body
/// (`core::sign`), on every chunk of a signed message.
pub const H_SIGNATURE: &str = "Kcache-Signature";
/// The subject contract's version (`docs/nats.md`, Versioning), on every message. It
/// changes only when a reader of the old contract would misread a message; additions a
/// reader can ignore (a header, a field) keep it. A message without it is version 1 (the
/// owners before the header).
pub const H_CONTRACT: &str = "Kcache-Contract";
/// The contract version this code writes, and the highest it reads.
pub const CONTRACT_VERSION: u32 = 1;
/// Ends a resume answer (`fleet::resume`): how many retained messages were sent.
pub const H_RESUME_END: &str = "Kcache-Resume-End";
/// Ends a resume answer that could not be given (why): take a snapshot.
pub const H_RESUME_ERROR: &str = "Kcache-Resume-Error";

/// The largest event a mirror reassembles. An event is one object, and Kubernetes bounds
/// objects, not keys: etcd refuses a write above `--max-request-bytes` (1.5 MiB by
/// default). Served as JSON an object can grow up to 6× (a control byte in a string is
/// `\u00XX`; `[]byte` fields become base64, 4/3), so 9 MiB, plus the watch line's
/// envelope and sealing (28 bytes): 16 MiB leaves room for an etcd limit raised to about
/// 2.5 MiB. An event above it (only from a larger etcd limit, or a hostile publisher) is a
/// gap: the mirror resynchronises from a snapshot, which does carry the object.
pub const MAX_EVENT_BYTES: usize = 16 << 20;

/// Default of `[nats] max_message_bytes`: the largest snapshot or replay a mirror
/// reassembles. Unlike an event, a snapshot is a whole key (every pod of a cluster): it is
/// as large as the key's store, which the mirror holds anyway. A bound sized from one
/// object would leave every large key unmirrorable. Kubernetes' scalability envelope
/// (150,000 pods at a few KiB of JSON each: 1 GiB or so) fits, and so does anything near
/// etcd's default backend quota (2 GiB for the whole database: every resource and its
/// history), so keys within those limits are not refused; the bound stops a broken or
/// hostile run of chunks from growing without end. A key above it cannot be mirrored
/// (counted in `kcache_fleet_oversized_messages_total`): raise the limit.
pub const DEFAULT_MAX_MESSAGE_BYTES: usize = 2 << 30;

#[derive(Debug, Error, PartialEq, Eq)]
pub enum Error {
    #[error("missing or malformed header {0}")]
    Header(&'static str),
    #[error("unknown message type {0:?}")]
    Type(String),
    #[error("a message of subject contract version {0}; this reader knows up to {CONTRACT_VERSION}: upgrade it")]
    Contract(u32),
    #[error("chunk {index}/{total} out of order (expected {expected})")]
    ChunkOrder {
        index: u32,
        total: u32,
        expected: u32,
    },
    #[error(
        "{kind} message of at least {bytes} bytes in {total} chunk(s) is over the {max}-byte limit"
    )]
    TooLarge {
        kind: &'static str,
        /// What arrived (or, from the first chunk, what the announced run must hold).
        bytes: u64,
        total: u32,
        max: usize,
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
            (H_CONTRACT, CONTRACT_VERSION.to_string()),
        ];
        if let Some((i, n)) = self.chunk {
            h.push((H_CHUNK, format!("{i}/{n}")));
        }
        if let Some(id) = &self.key_id {
            h.push((H_KEY_ID, id.clone()));
        }
        h
    }

    /// The associated data a sealed body is bound to: the key's token and every header a
    /// receiver trusts (type, epoch, seq, resourceVersion, owner, key id) — not the chunk
    /// header, as sealing happens before chunking. A body moved to another key, or a
    /// header edited on the way (a replayed event given a new seq, a heartbeat given a
    /// higher RV), no longer opens. Each field is length-prefixed, so no two different
    /// frames share an encoding.
    pub fn associated_data(&self, token: &str) -> Vec<u8> {
        let key_id = self.key_id.as_deref().unwrap_or("");
        let mut ad = Vec::with_capacity(64 + token.len() + self.owner.len() + key_id.len());
        ad.extend_from_slice(b"kcache-seal-v2");
        for field in [
            token.as_bytes(),
            self.kind.as_str().as_bytes(),
            &self.epoch.to_be_bytes(),
            &self.seq.to_be_bytes(),
            &self.rv.to_be_bytes(),
            self.owner.as_bytes(),
            key_id.as_bytes(),
        ] {
            ad.extend_from_slice(&(field.len() as u32).to_be_bytes());
            ad.extend_from_slice(field);
        }
        ad
    }

    /// Reads a frame through a header lookup.
    pub fn parse<'a>(get: impl Fn(&str) -> Option<&'a str>) -> Result<Frame> {
        let num = |name: &'static str| -> Result<u64> {
            get(name)
                .and_then(|v| v.trim().parse().ok())
                .ok_or(Error::Header(name))
        };
        // Checked first: a later contract may mean other things by the headers below.
        if let Some(v) = get(H_CONTRACT) {
            let v: u32 = v.trim().parse().map_err(|_| Error::Header(H_CONTRACT))?;
            if v > CONTRACT_VERSION {
                return Err(Error::Contract(v));
            }
        }
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
                // A body is only chunked when it needs two chunks or more (`split`).
                if i == 0 || i > n || n < 2 {
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

/// Reassembles a run of chunks of one message, up to a size limit.
#[derive(Debug)]
pub struct Reassembler {
    max_bytes: usize,
    partial: Option<Partial>,
    /// The run last reported broken: its remaining chunks are dropped quietly, so one lost
    /// chunk (or one over-limit message) is one gap, not one per chunk that follows.
    dropped: Option<Run>,
}

/// What every chunk of one message repeats. Chunks are matched on all of it, not on the
/// seq alone: a fenced-off owner and its successor can publish the same seq on one
/// subject, and both can answer one snapshot request, and their chunks must never mix.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Run {
    kind: Kind,
    epoch: u64,
    seq: u64,
    rv: u64,
    owner: String,
    key_id: Option<String>,
    total: u32,
}

impl Run {
    fn of(frame: &Frame, total: u32) -> Run {
        Run {
            kind: frame.kind,
            epoch: frame.epoch,
            seq: frame.seq,
            rv: frame.rv,
            owner: frame.owner.clone(),
            key_id: frame.key_id.clone(),
            total,
        }
    }

    fn same(&self, frame: &Frame, total: u32) -> bool {
        self.kind == frame.kind
            && self.epoch == frame.epoch
            && self.seq == frame.seq
            && self.rv == frame.rv
            && self.total == total
            && self.owner == frame.owner
            && self.key_id == frame.key_id
    }
}

#[derive(Debug)]
struct Partial {
    run: Run,
    next: u32,
    buf: BytesMut,
}

impl Default for Reassembler {
    fn default() -> Self {
        Reassembler::new(DEFAULT_MAX_MESSAGE_BYTES)
    }
}

impl Reassembler {
    /// A reassembler refusing snapshots and replays above `max_bytes`, and events above
    /// the smaller of it and [`MAX_EVENT_BYTES`].
    pub fn new(max_bytes: usize) -> Self {
        Reassembler {
            max_bytes,
            partial: None,
            dropped: None,
        }
    }

    /// The size limit of a message of this kind.
    pub fn limit(&self, kind: Kind) -> usize {
        match kind {
            Kind::Event => self.max_bytes.min(MAX_EVENT_BYTES),
            _ => self.max_bytes,
        }
    }

    /// Feeds one message; returns the whole body once its last chunk arrived. A chunk out
    /// of order (a lost chunk, or another message in between) or a message over the limit
    /// drops what was collected and is an error the caller treats as a gap; the rest of a
    /// run reported broken is then dropped without another error.
    pub fn feed(&mut self, frame: &Frame, body: Bytes) -> Result<Option<Bytes>> {
        let limit = self.limit(frame.kind);
        let Some((index, total)) = frame.chunk else {
            if let Some(p) = self.partial.take() {
                let err = Error::ChunkOrder {
                    index: 0,
                    total: p.run.total,
                    expected: p.next,
                };
                self.dropped = Some(p.run);
                return Err(err);
            }
            if body.len() > limit {
                return Err(too_large(frame.kind, body.len() as u64, 1, limit));
            }
            return Ok(Some(body));
        };
        // `Frame::parse` never yields these; a hand-made frame is refused the same way.
        if index == 0 || index > total {
            return Err(Error::Header(H_CHUNK));
        }
        let continues = self
            .partial
            .as_ref()
            .is_some_and(|p| p.run.same(frame, total) && p.next == index);
        let mut broken = None;
        if !continues {
            if index > 1 && self.dropped.as_ref().is_some_and(|r| r.same(frame, total)) {
                return Ok(None);
            }
            // A break: report the message being collected, or else this stray chunk.
            broken = match self.partial.take() {
                Some(p) => {
                    let expected = p.next;
                    self.dropped = Some(p.run);
                    Some(expected)
                }
                None if index > 1 => {
                    self.dropped = Some(Run::of(frame, total));
                    Some(1)
                }
                None => None,
            };
            // A first chunk starts a message even right after a break. An over-limit
            // message is reported rather than the break: both are one gap to the caller,
            // and only this one is worth counting apart.
            if index == 1 {
                self.start(frame, total, body.len(), limit)?;
            }
        }
        let appended = self.append(frame.kind, index, total, &body, limit);
        match broken {
            Some(expected) if appended.is_ok() => Err(Error::ChunkOrder {
                index,
                total,
                expected,
            }),
            _ => appended,
        }
    }

    /// Adds a chunk to the message being collected; the body once it is whole.
    fn append(
        &mut self,
        kind: Kind,
        index: u32,
        total: u32,
        body: &[u8],
        limit: usize,
    ) -> Result<Option<Bytes>> {
        let Some(p) = self.partial.as_mut() else {
            return Ok(None);
        };
        let size = p.buf.len() as u64 + body.len() as u64;
        if size > limit as u64 {
            self.drop_partial();
            return Err(too_large(kind, size, total, limit));
        }
        p.buf.extend_from_slice(body);
        if index == total {
            return Ok(self.partial.take().map(|p| p.buf.freeze()));
        }
        // `1 <= index < total` (checked in `feed`): no overflow.
        p.next = index + 1;
        Ok(None)
    }

    /// Begins collecting a run at its first chunk, unless the run cannot fit: every chunk
    /// but the last is as long as the first (see [`split`]), so `(total − 1) × first`
    /// bytes are certain, and an over-limit message is refused before anything is
    /// collected. Nothing is reserved from the header: `total` only ever bounds.
    fn start(&mut self, frame: &Frame, total: u32, first: usize, limit: usize) -> Result<()> {
        let run = Run::of(frame, total);
        // The last chunk holds a byte at least, and a sender never makes empty chunks, so
        // a count above the limit cannot fit either, whatever the first chunk's size.
        let at_least = u64::from(total.saturating_sub(1))
            .saturating_mul(first as u64)
            .saturating_add(1)
            .max(u64::from(total));
        if at_least > limit as u64 {
            self.dropped = Some(run);
            return Err(too_large(frame.kind, at_least, total, limit));
        }
        // The same message again (an owner answering a repeated request alike): collect
        // it afresh, its chunks are no longer strays.
        if self.dropped.as_ref() == Some(&run) {
            self.dropped = None;
        }
        self.partial = Some(Partial {
            run,
            next: 1,
            buf: BytesMut::new(),
        });
        Ok(())
    }

    fn drop_partial(&mut self) {
        if let Some(p) = self.partial.take() {
            self.dropped = Some(p.run);
        }
    }

    /// Whether a message is being collected (its first chunks arrived, not its last).
    pub fn collecting(&self) -> bool {
        self.partial.is_some()
    }

    /// Forgets a partial message (after a resync).
    pub fn reset(&mut self) {
        self.partial = None;
        self.dropped = None;
    }
}

fn too_large(kind: Kind, bytes: u64, total: u32, max: usize) -> Error {
    Error::TooLarge {
        kind: kind.as_str(),
        bytes,
        total,
        max,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn associated_data_changes_with_every_trusted_header_but_not_the_chunk() {
        let f = Frame {
            kind: Kind::Event,
            epoch: 5,
            seq: 9,
            rv: 100,
            owner: "a".into(),
            chunk: None,
            key_id: Some("k1".into()),
        };
        let base = f.associated_data("_.v1.secrets.ns.name.s");
        let variants = [
            Frame {
                kind: Kind::Heartbeat,
                ..f.clone()
            },
            Frame {
                epoch: 6,
                ..f.clone()
            },
            Frame {
                seq: 10,
                ..f.clone()
            },
            Frame {
                rv: 101,
                ..f.clone()
            },
            Frame {
                owner: "b".into(),
                ..f.clone()
            },
            Frame {
                key_id: Some("k2".into()),
                ..f.clone()
            },
            Frame {
                key_id: None,
                ..f.clone()
            },
        ];
        for v in variants {
            assert_ne!(v.associated_data("_.v1.secrets.ns.name.s"), base, "{v:?}");
        }
        assert_ne!(f.associated_data("_.v1.secrets.ns.name.t"), base);
        // Field boundaries are unambiguous.
        let g = Frame {
            owner: "ab".into(),
            key_id: Some("".into()),
            ..f.clone()
        };
        let h = Frame {
            owner: "a".into(),
            key_id: Some("b".into()),
            ..f.clone()
        };
        assert_ne!(g.associated_data("t"), h.associated_data("t"));
        let chunked = Frame {
            chunk: Some((1, 2)),
            ..f.clone()
        };
        assert_eq!(chunked.associated_data("_.v1.secrets.ns.name.s"), base);
    }
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
        // Not chunk headers a sender writes: a zeroth chunk, a single chunk, a huge count
        // that starts at zero.
        for v in [
            "0/5",
            "1/1",
            "0/4294967295",
            "1/0",
            "/",
            "1/-1",
            "1/4294967296",
        ] {
            let mut bad = map.clone();
            bad.insert(H_CHUNK, v.into());
            assert_eq!(
                Frame::parse(|n| bad.get(n).map(String::as_str)),
                Err(Error::Header(H_CHUNK)),
                "{v}"
            );
        }
        // The contract's version: a later one is refused before anything else is read,
        // an unreadable one too; an absent one is the first.
        assert_eq!(map.get(H_CONTRACT).map(String::as_str), Some("1"));
        let mut later = map.clone();
        later.insert(H_CONTRACT, "2".into());
        later.insert(H_TYPE, "what".into());
        assert_eq!(
            Frame::parse(|n| later.get(n).map(String::as_str)),
            Err(Error::Contract(2))
        );
        let mut bad = map.clone();
        bad.insert(H_CONTRACT, "v1".into());
        assert_eq!(
            Frame::parse(|n| bad.get(n).map(String::as_str)),
            Err(Error::Header(H_CONTRACT))
        );
        let mut old = map.clone();
        old.remove(H_CONTRACT);
        assert_eq!(
            Frame::parse(|n| old.get(n).map(String::as_str)),
            Ok(f.clone())
        );
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

    fn feed_all(r: &mut Reassembler, f: &Frame, parts: Vec<Bytes>) -> Vec<Result<Option<Bytes>>> {
        let n = parts.len() as u32;
        parts
            .into_iter()
            .enumerate()
            .map(|(i, p)| {
                let mut f = f.clone();
                f.chunk = (n > 1).then_some((i as u32 + 1, n));
                r.feed(&f, p)
            })
            .collect()
    }

    #[test]
    fn chunks_of_two_owners_with_one_seq_never_mix() {
        // A fenced-off owner (epoch 1) and its successor (epoch 2) both publish seq 5 in
        // two chunks; matching on seq and count alone glued their halves together.
        let mut r = Reassembler::default();
        let old = frame(5, Some((1, 2)));
        let mut new = frame(5, Some((2, 2)));
        new.epoch = 8;
        new.owner = "b".into();
        assert_eq!(r.feed(&old, Bytes::from_static(b"{\"old\":")), Ok(None));
        assert!(r.feed(&new, Bytes::from_static(b"\"new\"}")).is_err());
        // Two answers to one snapshot request, same seq and RV, different owners.
        let mut a = frame(9, Some((1, 2)));
        a.kind = Kind::Snapshot;
        let mut b = a.clone();
        b.owner = "b".into();
        assert_eq!(r.feed(&a, Bytes::from_static(b"A1")), Ok(None));
        assert!(r.feed(&b, Bytes::from_static(b"B1")).is_err());
        b.chunk = Some((2, 2));
        assert_eq!(
            r.feed(&b, Bytes::from_static(b"B2")),
            Ok(Some(Bytes::from_static(b"B1B2")))
        );
    }

    #[test]
    fn an_over_limit_message_is_refused_at_its_first_chunk_and_is_one_gap() {
        let mut r = Reassembler::new(100);
        let body = Bytes::from(vec![b'x'; 250]);
        let out = feed_all(&mut r, &frame(1, None), split(body, 60));
        assert!(
            matches!(
                out[0],
                Err(Error::TooLarge {
                    bytes: 241,
                    total: 5,
                    max: 100,
                    ..
                })
            ),
            "{out:?}"
        );
        assert!(r.partial.is_none(), "nothing collected");
        assert!(out[1..].iter().all(|o| *o == Ok(None)), "{out:?}");
        // Exactly at the limit goes through, and so does what follows.
        let body = Bytes::from(vec![b'y'; 100]);
        let out = feed_all(&mut r, &frame(2, None), split(body.clone(), 30));
        assert_eq!(out.last(), Some(&Ok(Some(body))));
        // An unchunked message over the limit is refused too.
        assert!(matches!(
            r.feed(&frame(3, None), Bytes::from(vec![0; 101])),
            Err(Error::TooLarge { bytes: 101, .. })
        ));
    }

    #[test]
    fn a_run_growing_past_the_limit_is_refused_when_it_crosses_it() {
        // A small first chunk, then large ones (no sender splits so): the running size
        // is what counts.
        let mut r = Reassembler::new(10);
        assert_eq!(
            r.feed(&frame(1, Some((1, 3))), Bytes::from_static(b"a")),
            Ok(None)
        );
        assert!(matches!(
            r.feed(&frame(1, Some((2, 3))), Bytes::from_static(b"bbbbbbbbbb")),
            Err(Error::TooLarge { bytes: 11, .. })
        ));
        assert!(r.partial.is_none());
        assert_eq!(
            r.feed(&frame(1, Some((3, 3))), Bytes::from_static(b"c")),
            Ok(None)
        );
    }

    #[test]
    fn a_hostile_chunk_count_reserves_nothing() {
        let mut r = Reassembler::default();
        // The largest count the header can announce, one byte each: more than any limit.
        let out = r.feed(&frame(1, Some((1, u32::MAX))), Bytes::from_static(b"a"));
        assert!(
            matches!(
                out,
                Err(Error::TooLarge {
                    total: u32::MAX,
                    ..
                })
            ),
            "{out:?}"
        );
        assert!(r.partial.is_none());
        // The end of such a run is a stray chunk of a dropped run; a hand-made zeroth or
        // past-the-end chunk is refused.
        assert_eq!(
            r.feed(&frame(1, Some((u32::MAX, u32::MAX))), Bytes::new()),
            Ok(None)
        );
        assert!(r
            .feed(&frame(2, Some((u32::MAX, u32::MAX))), Bytes::new())
            .is_err());
        assert_eq!(
            r.feed(&frame(3, Some((0, u32::MAX))), Bytes::new()),
            Err(Error::Header(H_CHUNK))
        );
        assert_eq!(
            r.feed(&frame(3, Some((3, 2))), Bytes::new()),
            Err(Error::Header(H_CHUNK))
        );
    }

    #[test]
    fn events_are_capped_below_snapshots() {
        let r = Reassembler::new(1 << 40);
        assert_eq!(r.limit(Kind::Event), MAX_EVENT_BYTES);
        assert_eq!(r.limit(Kind::Snapshot), 1 << 40);
        assert_eq!(r.limit(Kind::Replay), 1 << 40);
        let r = Reassembler::new(1000);
        assert_eq!(r.limit(Kind::Event), 1000);
        let r = Reassembler::default();
        assert_eq!(r.limit(Kind::Snapshot), DEFAULT_MAX_MESSAGE_BYTES);
        // An event chunked to just above its cap is refused; the same as a snapshot is not.
        let mut r = Reassembler::new(MAX_EVENT_BYTES + 1);
        let body = Bytes::from(vec![b'e'; MAX_EVENT_BYTES + 1]);
        let out = feed_all(&mut r, &frame(1, None), split(body.clone(), 1 << 20));
        assert!(matches!(out[0], Err(Error::TooLarge { .. })));
        let mut snap = frame(2, None);
        snap.kind = Kind::Snapshot;
        let out = feed_all(&mut r, &snap, split(body.clone(), 1 << 20));
        assert_eq!(out.last(), Some(&Ok(Some(body))));
    }

    #[test]
    fn the_rest_of_a_broken_run_is_dropped_without_another_error() {
        // One lost chunk is one gap, not one per chunk that follows (each error costs the
        // owner a snapshot).
        let mut r = Reassembler::default();
        let parts = split(Bytes::from(vec![b'z'; 50]), 10);
        let mut out = Vec::new();
        for (i, p) in parts.into_iter().enumerate() {
            if i != 1 {
                out.push(r.feed(&frame(1, Some((i as u32 + 1, 5))), p));
            }
        }
        assert_eq!(out.iter().filter(|o| o.is_err()).count(), 1, "{out:?}");
        // A duplicated chunk too.
        let mut r = Reassembler::default();
        let f = |i| frame(2, Some((i, 3)));
        assert_eq!(r.feed(&f(1), Bytes::from_static(b"a")), Ok(None));
        assert_eq!(r.feed(&f(2), Bytes::from_static(b"b")), Ok(None));
        assert!(r.feed(&f(2), Bytes::from_static(b"b")).is_err());
        assert_eq!(r.feed(&f(3), Bytes::from_static(b"c")), Ok(None));
        // The same message sent again (a repeated snapshot answer) is collected afresh.
        assert_eq!(r.feed(&f(1), Bytes::from_static(b"a")), Ok(None));
        assert_eq!(r.feed(&f(2), Bytes::from_static(b"b")), Ok(None));
        assert_eq!(
            r.feed(&f(3), Bytes::from_static(b"c")),
            Ok(Some(Bytes::from_static(b"abc")))
        );
    }
}
