//! A NATS subscriber of one kcache key, as a library: the subject contract of
//! `docs/nats.md` and the resume of `docs/subscribers.md`, for services, the examples and
//! the tests alike.
//!
//! [`follow`] subscribes to the key's events, then either resumes from a kept
//! [`Position`] — a replica replays the key's retained events after it (`[nats] retain`,
//! `fleet::resume`) — or asks the key's owner for a snapshot; from there it applies events
//! in seq order and resynchronises from a snapshot on a gap or a new owner. The decisions
//! are the [`Session`]'s (over `kcache_actors::core::mirror`); this crate carries them out
//! against NATS and hands out [`Update`]s.

mod follow;
mod session;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use kcache_actors::core::mirror::{Resync, Stamp};
use kcache_actors::core::seal::Keyring;
use kcache_actors::core::sign::Verifier;
use serde::{Deserialize, Serialize};

pub use follow::{follow, Subscription};
pub use session::{Session, Step, Via};

/// Why following a key failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{0:?} is not a key (six escaped tokens, as docs/nats.md names them)")]
    BadKey(String),
    #[error("subscribing to {subject}: {source}")]
    Subscribe {
        subject: String,
        #[source]
        source: async_nats::SubscribeError,
    },
    #[error("publishing to NATS: {0}")]
    Publish(String),
    #[error("the NATS subscription of {0} ended (the connection was closed)")]
    Closed(String),
}

/// How to follow a key.
#[derive(Clone)]
pub struct Options {
    /// First token of kcache's subjects (`[nats] subject_prefix`).
    pub prefix: String,
    /// The key's six escaped tokens, e.g. `_.v1.configmaps.demo.all._`.
    pub key: String,
    /// Opens a sealed resource's messages (Secrets); without it they are refused.
    pub keyring: Option<Arc<Keyring>>,
    /// The fleet's public keys: set, only messages signed by one of them are taken.
    pub verifier: Option<Arc<Verifier>>,
    /// An unanswered snapshot request is sent again after this long.
    pub snapshot_retry: Duration,
    /// A resume answer that stays silent this long is given up for a snapshot.
    pub replay_timeout: Duration,
    /// Events held while a snapshot is on the way.
    pub buffer: usize,
    /// Updates queued for the caller; when full the subscriber waits (and NATS, past its
    /// own buffer, drops: a gap, then a snapshot).
    pub queue: usize,
}

impl Options {
    pub fn new(prefix: &str, key: &str) -> Options {
        Options {
            prefix: prefix.to_string(),
            key: key.to_string(),
            keyring: None,
            verifier: None,
            snapshot_retry: Duration::from_secs(2),
            replay_timeout: Duration::from_secs(5),
            buffer: 10_000,
            queue: 1_024,
        }
    }
}

/// Where a subscriber is in a key's stream: keep it, and [`follow`] from it later.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Position {
    pub epoch: u64,
    pub seq: u64,
}

/// What a subscriber learns, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Update {
    /// The key's whole state (a JSON list, as the API server's): replace what you have.
    Snapshot { stamp: Stamp, list: Bytes },
    /// One watch event line (`{"type":…,"object":…}`), the next after the last.
    Event {
        stamp: Stamp,
        line: Bytes,
        /// It came from the retained log (a resume), not live.
        replayed: bool,
    },
    /// The key is complete up to this resourceVersion.
    Progress { rv: u64 },
    /// A resumed position held: `replayed` events came from the retained log, no
    /// snapshot needed.
    Resumed { replayed: u64 },
    /// A snapshot is on the way (why).
    Resync(Resync),
    /// A message was refused (unsealed, forged, malformed): the reason. A resync follows.
    Refused(String),
}

impl Update {
    /// The position after this update, for those that move it.
    pub fn position(&self) -> Option<Position> {
        match self {
            Update::Snapshot { stamp, .. } | Update::Event { stamp, .. } => Some(Position {
                epoch: stamp.epoch,
                seq: stamp.seq,
            }),
            _ => None,
        }
    }
}
