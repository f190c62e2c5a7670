//! Backfilling a young key's window: the events between an older resourceVersion N and
//! the key's first list, so a watch from N replays what the API server would send it.
//!
//! A key starts with a list at S; a client that listed at N < S before (client-go's
//! list-then-watch while others write, every informer after a kcache restart) resumes
//! from N. The API server would replay (N, S] from its own watch cache. kcache asks the
//! upstream for the same replay once per key — a list at exactly N and a watch from N —
//! and this module turns the answer into window events: each event's previous object
//! comes from applying the events to the state at N, and the result must land exactly on
//! the key's state at S (the store with the window's events undone), or nothing is
//! backfilled and the watch gets its 410. Objects compare by (UID, resourceVersion).

use std::collections::BTreeMap;
use std::sync::Arc;

use thiserror::Error;

use crate::core::event::StoreEvent;
use crate::core::object::EventType;
use crate::core::object::Object;
use crate::core::store::Store;

#[derive(Debug, Error, PartialEq, Eq)]
pub enum Error {
    /// The replayed events do not lead from the state at N to the key's state at its
    /// list: the upstream's replay was incomplete (it ended before the list's RV).
    #[error("the upstream's replay from {from} does not reach the key's state at {list_rv}")]
    Inconsistent { from: u64, list_rv: u64 },
}

/// What the upstream answered for a replay from `from`: the key's objects at exactly
/// `from`, and the events after it up to the key's list RV, in order.
#[derive(Debug, Default)]
pub struct Replay {
    pub at_from: Vec<Object>,
    pub events: Vec<(EventType, Object, u64)>,
}

/// One event to put in front of the window, with the object it replaced.
#[derive(Debug)]
pub struct Backfilled {
    pub kind: EventType,
    pub rv: u64,
    pub object: Arc<Object>,
    pub prev: Option<Arc<Object>>,
}

type Versions = BTreeMap<String, (String, u64)>;

fn version(o: &Object) -> (String, u64) {
    (o.uid().to_string(), o.rv())
}

/// The key's state at its window's list RV, as versions: the store with the window's
/// events undone (each event keeps the object it replaced). Only meaningful for a window
/// that evicted nothing since its list, which the caller checks.
fn state_at_list<'a>(
    store: &Store,
    window: impl DoubleEndedIterator<Item = &'a StoreEvent>,
) -> Versions {
    let mut at: Versions = store.iter().map(|(k, o)| (k.clone(), version(o))).collect();
    for ev in window.rev() {
        let key = ev.object.key();
        match &ev.prev {
            Some(prev) => at.insert(key, version(prev)),
            None => at.remove(&key),
        };
    }
    at
}

/// The events (`from`, `list_rv`] of a key, with their previous objects, from the
/// upstream's `replay`; checked to end on the key's state at `list_rv`. Events outside
/// that span are ignored (the window already has what follows `list_rv`).
pub fn events_since<'a>(
    store: &Store,
    window: impl DoubleEndedIterator<Item = &'a StoreEvent>,
    list_rv: u64,
    from: u64,
    replay: Replay,
) -> Result<Vec<Backfilled>, Error> {
    let mut state: BTreeMap<String, Arc<Object>> = replay
        .at_from
        .into_iter()
        .map(|o| (o.key(), Arc::new(o)))
        .collect();
    let mut out = Vec::new();
    for (kind, object, rv) in replay.events {
        if rv <= from || rv > list_rv {
            continue;
        }
        let object = Arc::new(object);
        let key = object.key();
        let prev = match kind {
            EventType::Deleted => state.remove(&key),
            EventType::Added | EventType::Modified => state.insert(key, object.clone()),
        };
        out.push(Backfilled {
            kind,
            rv,
            object,
            prev,
        });
    }
    let replayed: Versions = state.iter().map(|(k, o)| (k.clone(), version(o))).collect();
    if replayed != state_at_list(store, window) {
        return Err(Error::Inconsistent { from, list_rv });
    }
    Ok(out)
}

/// Whether a watch from `watch_rv` that waited on a replay from `replayed` gets a replay
/// of its own: after a success, one from an older RV (it arrived meanwhile); after a
/// failure, one from a newer RV (an older RV failing says nothing of it). Each round
/// moves strictly away from the last, so the rounds end.
pub fn another_round(ok: bool, replayed: u64, watch_rv: u64) -> bool {
    if ok {
        watch_rv < replayed
    } else {
        watch_rv > replayed
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::store::fixtures::{obj, store};

    fn ev(seq: u64, rv: u64, kind: EventType, o: Object, prev: Option<Object>) -> StoreEvent {
        StoreEvent::new(seq, rv, kind, Arc::new(o), prev.map(Arc::new))
    }
    fn summary(b: &[Backfilled]) -> Vec<(EventType, u64, Option<u64>)> {
        b.iter()
            .map(|b| (b.kind, b.rv, b.prev.as_ref().map(|p| p.rv())))
            .collect()
    }
    use EventType::{Added, Deleted, Modified};

    /// Listed at 20: b@6, c@15. Then b modified at 21, c deleted at 22.
    fn key_at_20() -> (Store, Vec<StoreEvent>) {
        let s = store(&[obj("b", "2", 21)]);
        let window = vec![
            ev(1, 21, Modified, obj("b", "2", 21), Some(obj("b", "2", 6))),
            ev(2, 22, Deleted, obj("c", "3", 22), Some(obj("c", "3", 15))),
        ];
        (s, window)
    }

    #[test]
    fn nothing_happened_since_n_backfills_nothing_and_succeeds() {
        let (s, w) = key_at_20();
        let replay = Replay {
            at_from: vec![obj("b", "2", 6), obj("c", "3", 15)],
            events: vec![],
        };
        assert_eq!(
            summary(&events_since(&s, w.iter(), 20, 16, replay).unwrap()),
            vec![]
        );
    }

    #[test]
    fn events_between_n_and_the_list_get_their_previous_objects() {
        // The conformance spec's shape: at 10, a@9 and b@6; a modified at 12, a deleted
        // at 14, c added at 15; listed at 20.
        let (s, w) = key_at_20();
        let replay = Replay {
            at_from: vec![obj("a", "1", 9), obj("b", "2", 6)],
            events: vec![
                (Modified, obj("a", "1", 12), 12),
                (Deleted, obj("a", "1", 14), 14),
                (Added, obj("c", "3", 15), 15),
                // Past the list: the window has it (or its key never will); ignored.
                (Modified, obj("b", "2", 21), 21),
            ],
        };
        let got = events_since(&s, w.iter(), 20, 10, replay).unwrap();
        assert_eq!(
            summary(&got),
            vec![
                (Modified, 12, Some(9)),
                (Deleted, 14, Some(12)),
                (Added, 15, None)
            ]
        );
    }

    #[test]
    fn an_incomplete_replay_is_refused() {
        let (s, w) = key_at_20();
        // The replay ended before c's creation at 15.
        let replay = Replay {
            at_from: vec![obj("a", "1", 9), obj("b", "2", 6)],
            events: vec![(Deleted, obj("a", "1", 14), 14)],
        };
        assert_eq!(
            events_since(&s, w.iter(), 20, 10, replay).unwrap_err(),
            Error::Inconsistent {
                from: 10,
                list_rv: 20
            }
        );
        // The same name, another object: the UID tells them apart.
        let replay = Replay {
            at_from: vec![obj("b", "9", 6), obj("c", "3", 15)],
            events: vec![],
        };
        assert!(events_since(&s, w.iter(), 20, 16, replay).is_err());
    }

    #[test]
    fn rounds_move_away_from_the_last_replay() {
        for (ok, replayed, watch_rv, again) in [
            // Served by the extended window.
            (true, 10, 10, false),
            (true, 10, 15, false),
            (true, 10, 5, true),
            // The upstream could not replay 10 (compacted): 5 cannot be either.
            (false, 10, 10, false),
            (false, 10, 5, false),
            (false, 10, 15, true),
        ] {
            assert_eq!(
                another_round(ok, replayed, watch_rv),
                again,
                "{ok} {replayed} {watch_rv}"
            );
        }
    }

    #[test]
    fn an_empty_window_compares_with_the_store_itself() {
        let s = store(&[obj("a", "1", 5)]);
        let none = std::iter::empty();
        let replay = Replay {
            at_from: vec![obj("a", "1", 5)],
            events: vec![],
        };
        assert!(events_since(&s, none, 9, 7, replay).is_ok());
        let replay = Replay::default();
        assert!(events_since(&s, std::iter::empty(), 9, 3, replay).is_err());
    }
}
