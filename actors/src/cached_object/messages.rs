//! What the registry and the HTTP handlers may ask of a key, besides its watchers'
//! `ToKey` (`watch_feed`) and its source's `SourceMsg` (`feed`): reads, its progress,
//! handing its watchers over, stopping and draining.

use std::sync::Arc;

use actix::prelude::*;

use super::key_core::{HandedOver, Result, Snapshot};
use crate::core::key::Key;
use crate::feed::KeyStatus;
use crate::watch_feed::KeyLink;

/// Read the key once it is synced and at least `min_rv` fresh: its current state, or —
/// `at` — its state at exactly that resourceVersion (`min_rv` is then `at`).
pub struct Read {
    pub min_rv: u64,
    pub at: Option<u64>,
    /// The key the request asked for, when this key covers it: the snapshot holds only
    /// what that key could (`Store::snapshot_for`), not a copy of the whole state.
    pub asked: Option<Key>,
}

impl Message for Read {
    type Result = Result<Snapshot>;
}

/// What [`Read`] would answer if the key is synced and fresh enough now, else `None` at
/// once (a reader that would wait gives its seat back first, then sends [`Read`]).
pub struct TryRead {
    pub min_rv: u64,
    pub at: Option<u64>,
    /// As [`Read::asked`].
    pub asked: Option<Key>,
}

impl Message for TryRead {
    type Result = Option<Result<Snapshot>>;
}

/// The key's progress RV and how many objects it holds, once synced (`None` before): what
/// a freshness proof starts from, without copying the key's state.
pub struct Progress;

impl Message for Progress {
    type Result = Option<(u64, usize)>;
}

/// Move live watchers to `link.key` (coalescing onto a covering key, or splitting back to
/// their own): those that asked for `only_asked` when given, else all. Each gets every event
/// up to this key's progress from here and the rest from that key, once it is synced
/// (`core::coalesce::handover_rv`). Answers how many moved and how many are left (not
/// live yet, or that key not far enough along): the registry asks again.
#[derive(Message)]
#[rtype(result = "HandedOver")]
pub struct HandOver {
    /// The key to hand over to (`link.key`), and its address.
    pub link: KeyLink,
    pub to_status: Arc<KeyStatus>,
    pub only_asked: Option<Key>,
}

impl<A, M> actix::dev::MessageResponse<A, M> for HandedOver
where
    A: Actor,
    M: Message<Result = HandedOver>,
{
    fn handle(self, _ctx: &mut A::Context, tx: Option<actix::dev::OneshotSender<HandedOver>>) {
        if let Some(tx) = tx {
            let _ = tx.send(self);
        }
    }
}

/// Stop the key (sent by the registry after the grace period): watchers are closed.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Stop;

/// Close every watcher gracefully (shutdown drain): a last bookmark where allowed.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Drain;
