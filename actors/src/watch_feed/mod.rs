//! The protocol between a key and its watchers: what a watcher asks of its key
//! ([`ToKey`], to the key's actix address) and what a key sends each watcher
//! ([`ToWatcher`], into the watcher's [`mailbox`]), one message type each way, so neither
//! side names the other.
//!
//! `feed` is what flows into a key (from its source); this is what flows out of it. Keeping
//! the protocol here, below both actors, keeps `cached_object` and `watcher` out of each
//! other's imports, and lets a watcher move to another key (`ToWatcher::Move`).

pub mod mailbox;

use std::sync::Arc;

use actix::prelude::*;

use std::time::Instant;

use crate::core::event::StoreEvent;
use crate::core::key::Key;
use crate::core::object::Object;
use crate::core::rv::WatchPlan;

pub use self::mailbox::{Mailbox, Received, Refused, WatcherLink};

/// A key as its watchers see it: one per key, made when the key starts (the registry's
/// slot) and shared by all its watchers. Each clone of an actix address is three heap
/// allocations (its own park state), about 130 bytes per watch when each watcher held its
/// own; and a watcher's own copy of its key was 56 bytes and, for a name key, two strings.
pub type KeyLink = std::sync::Arc<KeyAddr>;

/// A key and its address (see [`KeyLink`]).
#[derive(Debug)]
pub struct KeyAddr {
    pub key: Key,
    pub addr: Recipient<ToKey>,
}

impl KeyAddr {
    pub fn do_send(&self, msg: ToKey) {
        self.addr.do_send(msg)
    }

    /// Whether the key's actor is still running.
    pub fn connected(&self) -> bool {
        self.addr.connected()
    }
}

/// What a watcher asks of its key.
#[derive(Message)]
#[rtype(result = "()")]
pub enum ToKey {
    Subscribe(Subscribe),
    Ready(Ready),
    Unsubscribe { id: u64 },
}

/// Register a watcher; its first message back is `ToWatcher::Start`, `Expired` or
/// `Failed`.
pub struct Subscribe {
    pub id: u64,
    pub link: WatcherLink,
    pub plan: WatchPlan,
    pub allow_bookmarks: bool,
    pub deadline: Option<Instant>,
    /// The key the watch asked for, when this key covers it (`core::cover`): splitting
    /// moves these watchers back to their own key.
    pub asked: Option<Box<Key>>,
    /// Set when the watch moved here from another key (`ToWatcher::Move`).
    pub moved: Option<MovedFrom>,
}

/// A moved watch, as the key it left saw it at the plan's `from_rv`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MovedFrom {
    /// The RV of the one object the watch asks for, when it asks for one and the key it
    /// left held it: the key it joins skips the replay if it holds the object at the
    /// same RV (`core::coalesce::moved_start`).
    pub object_rv: Option<u64>,
}

/// A watcher wrote its initial events or replay, up to the key's sequence number
/// `after_seq`, and has `room` lines free in its client's buffer: the key answers with the
/// events since (`ToWatcher::Replay`), live once they fit, or `ToWatcher::Expired`.
pub struct Ready {
    pub id: u64,
    pub after_seq: u64,
    /// The watcher's RV, for the 410's message.
    pub rv: u64,
    pub room: usize,
}

/// Every message a key sends a watcher, in the order a watch sees them: one `Start`,
/// `Expired` or `Failed`; then `Replay`s until one makes it live; then `Dispatch`es and
/// `Bookmark`s; `Close` at any time.
pub enum ToWatcher {
    Start(Start),
    Replay(Replay),
    /// The watch's RV is older than the key can replay (the 410 `Expired`).
    Expired {
        requested: u64,
        oldest: u64,
    },
    /// The watch could not start (key not synced in time, not fresh enough, stopping), as
    /// the Status the watch ends with.
    Failed {
        code: u16,
        reason: &'static str,
        message: String,
    },
    /// One event of the key, for a live watcher.
    Dispatch(Arc<StoreEvent>),
    /// A periodic or pre-timeout bookmark at the key's progress.
    Bookmark {
        rv: u64,
    },
    Close(CloseReason),
    /// Go on from another key that covers this watch, or that it covers (coalescing and
    /// splitting, `core::coalesce`): the key sending this has given the watcher every event
    /// up to `after_rv` and sends it nothing more.
    Move(Move),
}

/// See [`ToWatcher::Move`].
pub struct Move {
    /// The key to go on from, and its address.
    pub link: KeyLink,
    pub after_rv: u64,
    /// See [`MovedFrom::object_rv`].
    pub object_rv: Option<u64>,
}

/// The watcher's start: initial ADDED events (state at `initial_rv`) or events to replay.
/// Written as the client reads; the watcher is not live until it answers
/// `Ready`.
pub struct Start {
    pub initial: Vec<Arc<Object>>,
    pub initial_rv: u64,
    pub end_bookmark: bool,
    pub replay: Vec<Arc<StoreEvent>>,
    pub floor: u64,
    /// Events up to this sequence are covered by `initial`/`replay`.
    pub start_seq: u64,
}

/// The key's answer to `Ready`: the events since, up to `upto_seq`; with `live`, the
/// watcher now gets every later event and bookmark (the events fit in its buffer), else it
/// writes them and sends `Ready` again.
pub struct Replay {
    pub events: Vec<Arc<StoreEvent>>,
    pub upto_seq: u64,
    pub live: bool,
}

#[derive(Debug, Clone, Copy)]
pub enum CloseReason {
    TooSlow,
    KeyStopped,
    /// The key relisted after a gap: the client resumes from its last RV (as after the
    /// API server's cacher terminated its watchers).
    Resync,
    /// Shutdown: send a last bookmark (when allowed) so the client resumes exactly here.
    Draining {
        rv: u64,
    },
}
