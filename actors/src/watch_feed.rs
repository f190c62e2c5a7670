//! What a key sends each of its watchers: one message type, [`ToWatcher`], so a
//! CachedObject holds a `Recipient<ToWatcher>` and never names the Watcher actor.
//!
//! `feed` is what flows into a key (from its source); this is what flows out of it. Keeping
//! the protocol here, below both actors, is what lets `watcher` depend on `cached_object`
//! (to subscribe) without `cached_object` depending back on `watcher`.

use std::sync::Arc;

use actix::prelude::*;

use crate::core::event::StoreEvent;
use crate::core::object::Object;

/// A watcher as its key sees it.
pub type WatcherLink = Recipient<ToWatcher>;

/// Every message a key sends a watcher, in the order a watch sees them: one `Start`,
/// `Expired` or `Failed`; then `Replay`s until one makes it live; then `Dispatch`es and
/// `Bookmark`s; `Close` at any time.
#[derive(Message)]
#[rtype(result = "()")]
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
}

/// The watcher's start: initial ADDED events (state at `initial_rv`) or events to replay.
/// Written as the client reads; the watcher is not live until it answers
/// `cached_object::Ready`.
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
