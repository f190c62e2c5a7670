//! A key's state at an earlier resourceVersion, from its store and window: what exact
//! lists and page chains read (`resourceVersionMatch=Exact`, a limit with `N`, `continue`).
//!
//! The reference API server keeps a snapshot per event (`storeSnapshotter`: a B-tree
//! clone at each event's resourceVersion, pruned with its watch history). kcache copies
//! nothing: every event in the window carries the object it replaced, so the state at
//! `rv` is the current store with each object changed after `rv` put back as the first
//! such change found it. Retention is the window's: an `rv` the window is not complete
//! after is too old, exactly when a watch from it would be (`rv::watch_start`).

use std::collections::BTreeMap;
use std::iter::Peekable;
use std::ops::Bound;
use std::sync::Arc;

use thiserror::Error;

use crate::core::object::Object;
use crate::core::store::Store;
use crate::core::window::Window;

#[derive(Debug, Error, PartialEq, Eq)]
pub enum Error {
    /// Changes after `requested` were evicted from the window (or predate its list, or a
    /// relist dated them): `oldest` is the oldest state the window recovers.
    #[error("too old resource version: {requested} ({oldest})")]
    TooOld { requested: u64, oldest: u64 },
    /// The key has not reached `requested` yet.
    #[error("too large resource version: {requested}, current: {current}")]
    TooNew { requested: u64, current: u64 },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The key's state at one resourceVersion, as the difference from its current store.
#[derive(Debug, Clone)]
pub struct Past {
    rv: u64,
    /// Each object key changed after `rv`, with its version at `rv` (`None`: absent).
    undone: BTreeMap<String, Option<Arc<Object>>>,
}

impl Past {
    /// The state at `rv` of a key whose store has reached `progress` and whose window
    /// holds the events that led there.
    pub fn at(window: &Window, progress: u64, rv: u64) -> Result<Past> {
        if rv > progress {
            return Err(Error::TooNew {
                requested: rv,
                current: progress,
            });
        }
        let oldest = window.oldest_exact();
        if rv < oldest {
            return Err(Error::TooOld {
                requested: rv,
                oldest,
            });
        }
        let mut undone = BTreeMap::new();
        // In the order they happened: the first change after `rv` replaced the version
        // current at `rv`.
        for ev in window.events().filter(|e| e.rv > rv) {
            undone
                .entry(ev.object.key())
                .or_insert_with(|| ev.prev.clone());
        }
        Ok(Past { rv, undone })
    }

    /// The state at the store's own progress: nothing undone.
    pub fn current(progress: u64) -> Past {
        Past {
            rv: progress,
            undone: BTreeMap::new(),
        }
    }

    pub fn rv(&self) -> u64 {
        self.rv
    }

    /// The objects at `rv` whose store keys fall in `span` (`store::span`), in key order
    /// (`namespace/name`, byte-wise: the API server's order).
    pub fn objects<'a>(
        &'a self,
        store: &'a Store,
        span: (Bound<&'a str>, Bound<&'a str>),
    ) -> impl Iterator<Item = &'a Arc<Object>> + 'a {
        Merge {
            current: store.range(span).peekable(),
            undone: self.undone.range::<str, _>(span).peekable(),
        }
    }
}

/// The store's objects with the undone keys' versions in their place, in key order.
struct Merge<C, U>
where
    C: Iterator,
    U: Iterator,
{
    current: Peekable<C>,
    undone: Peekable<U>,
}

impl<'a, C, U> Iterator for Merge<C, U>
where
    C: Iterator<Item = (&'a String, &'a Arc<Object>)>,
    U: Iterator<Item = (&'a String, &'a Option<Arc<Object>>)>,
{
    type Item = &'a Arc<Object>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            let take_undone = match (self.current.peek(), self.undone.peek()) {
                (None, None) => return None,
                (Some(_), None) => false,
                (None, Some(_)) => true,
                (Some((c, _)), Some((u, _))) => {
                    if c == u {
                        // The current version is not the one at `rv`.
                        self.current.next();
                        true
                    } else {
                        u < c
                    }
                }
            };
            if take_undone {
                if let Some((_, Some(obj))) = self.undone.next() {
                    return Some(obj);
                }
                // Absent at `rv`: created after it.
            } else if let Some((_, obj)) = self.current.next() {
                return Some(obj);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::event::StoreEvent;
    use crate::core::object::EventType;
    use crate::core::store::fixtures::obj;

    /// A key replaying `events` (`(kind, name, uid, rv)`) onto an empty store listed at
    /// `list_rv`, in a window of `capacity`, as the CachedObject applies them.
    fn key(
        list_rv: u64,
        capacity: usize,
        events: &[(EventType, &str, &str, u64)],
    ) -> (Store, Window) {
        let mut store = Store::new();
        let mut window = Window::new(capacity);
        window.reset(list_rv);
        for (seq, &(kind, name, uid, rv)) in events.iter().enumerate() {
            let o = Arc::new(obj(name, uid, rv));
            let prev = match kind {
                EventType::Deleted => store.remove(&o),
                _ => store.upsert(o.clone()),
            };
            window.push(Arc::new(StoreEvent::new(seq as u64 + 1, rv, kind, o, prev)));
        }
        (store, window)
    }

    fn names(past: &Past, store: &Store, from: Option<&str>) -> Vec<String> {
        let lower = from.map_or(Bound::Unbounded, Bound::Included);
        names_in(past, store, (lower, Bound::Unbounded))
    }

    /// `name@rv` of the objects at the past's RV within `span`.
    fn names_in(past: &Past, store: &Store, span: (Bound<&str>, Bound<&str>)) -> Vec<String> {
        past.objects(store, span)
            .map(|o| format!("{}@{}", o.name(), o.rv()))
            .collect()
    }

    #[test]
    fn state_at_each_resource_version() {
        use EventType::*;
        let (store, window) = key(
            10,
            100,
            &[
                (Added, "a", "1", 11),
                (Added, "b", "2", 12),
                (Modified, "a", "1", 13),
                (Deleted, "b", "2", 14),
                (Added, "c", "3", 15),
                (Added, "b", "4", 16),
                (Modified, "c", "3", 17),
            ],
        );
        let cases: &[(u64, &[&str])] = &[
            (10, &[]),
            (11, &["a@11"]),
            (12, &["a@11", "b@12"]),
            (13, &["a@13", "b@12"]),
            (14, &["a@13"]),
            (15, &["a@13", "c@15"]),
            (16, &["a@13", "b@16", "c@15"]),
            (17, &["a@13", "b@16", "c@17"]),
        ];
        for &(rv, want) in cases {
            let past = Past::at(&window, 17, rv).expect("within the window");
            assert_eq!(names(&past, &store, None), want, "at {rv}");
            assert_eq!(past.rv(), rv);
        }
        // A resourceVersion between events, or past the last one up to the progress.
        let past = Past::at(&window, 20, 20).expect("at the progress");
        assert_eq!(names(&past, &store, None), ["a@13", "b@16", "c@17"]);
        assert_eq!(
            names(&Past::current(20), &store, None),
            ["a@13", "b@16", "c@17"]
        );
    }

    #[test]
    fn from_a_key_on() {
        use EventType::*;
        let (store, window) = key(
            10,
            100,
            &[
                (Added, "a", "1", 11),
                (Added, "b", "2", 12),
                (Added, "c", "3", 13),
                (Deleted, "b", "2", 14),
            ],
        );
        let past = Past::at(&window, 14, 13).expect("within the window");
        // Store keys are `n/name`; a page starts strictly after `n/a` with `n/a\0`.
        assert_eq!(names(&past, &store, Some("n/a\0")), ["b@12", "c@13"]);
        assert_eq!(names(&past, &store, Some("n/b")), ["b@12", "c@13"]);
        assert_eq!(names(&past, &store, Some("n/b\0")), ["c@13"]);
        assert_eq!(names(&past, &store, Some("n/d")), Vec::<String>::new());
        let now = Past::at(&window, 14, 14).expect("current");
        assert_eq!(names(&now, &store, Some("n/a\0")), ["c@13"]);
    }

    #[test]
    fn within_the_span_of_a_covered_key() {
        use EventType::*;
        let (store, window) = key(
            10,
            100,
            &[
                (Added, "a", "1", 11),
                (Added, "b", "2", 12),
                (Modified, "b", "2", 13),
                (Deleted, "b", "2", 14),
                (Added, "c", "3", 15),
            ],
        );
        let b = (Bound::Included("n/b"), Bound::Included("n/b"));
        // Deleted since, its version at the past resourceVersion is still found by name.
        let at = |rv| Past::at(&window, 15, rv).expect("within the window");
        assert_eq!(names_in(&at(12), &store, b), ["b@12"]);
        assert_eq!(names_in(&at(13), &store, b), ["b@13"]);
        assert_eq!(names_in(&at(14), &store, b), Vec::<String>::new());
        assert_eq!(names_in(&at(15), &store, b), Vec::<String>::new());
        let all = (Bound::Unbounded, Bound::Unbounded);
        assert_eq!(names_in(&at(13), &store, all), ["a@11", "b@13"]);
    }

    #[test]
    fn retention_is_the_windows() {
        use EventType::*;
        let events = [
            (Added, "a", "1", 11),
            (Modified, "a", "1", 12),
            (Modified, "a", "1", 13),
            (Modified, "a", "1", 14),
        ];
        // Complete since its list at 10: anything from 10 on.
        let (_, window) = key(10, 100, &events);
        assert!(Past::at(&window, 14, 10).is_ok());
        assert_eq!(
            Past::at(&window, 14, 9).unwrap_err(),
            Error::TooOld {
                requested: 9,
                oldest: 10
            }
        );
        // Two evicted (11 and 12): the state at 12 is recovered from 13's previous
        // object, the state at 11 is gone.
        let (store, window) = key(10, 2, &events);
        let past = Past::at(&window, 14, 12).expect("the oldest event's previous state");
        assert_eq!(names(&past, &store, None), ["a@12"]);
        assert_eq!(
            Past::at(&window, 14, 11).unwrap_err(),
            Error::TooOld {
                requested: 11,
                oldest: 12
            }
        );
        // A relist at 13 dated a deletion it found: states before 13 are not exact.
        let (_, mut window) = key(10, 100, &events);
        window.mark_undated(13);
        assert!(Past::at(&window, 14, 13).is_ok());
        assert_eq!(
            Past::at(&window, 14, 12).unwrap_err(),
            Error::TooOld {
                requested: 12,
                oldest: 13
            }
        );
        assert_eq!(
            Past::at(&window, 14, 15).unwrap_err(),
            Error::TooNew {
                requested: 15,
                current: 14
            }
        );
    }
}
