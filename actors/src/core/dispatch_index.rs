//! Which of a key's watchers an event can concern. A key that covers (or has coalesced)
//! single-object watches — a namespace key serving a thousand kubelets' `metadata.name=X`
//! watches — would otherwise hand every event to every watcher, each to filter it away:
//! O(watchers) actor messages per write, where the API server's cacher indexes its
//! watchers by the same field (`indexedTrigger`) and wakes only the ones an event is for.
//! Here a watcher bound to one name is found by the event's object name (names never
//! change); every other watcher gets every event, as before.
//!
//! The index is append-only between rebuilds: removing a watcher does not touch it, so the
//! many places that end watchers stay as they are. Callers skip ids that are gone, and
//! rebuild the index from the live table once it holds more than twice as many entries
//! as there are watchers ([`DispatchIndex::stale`]) — amortised O(1) per watcher.

use std::collections::{HashMap, HashSet};

#[derive(Debug, Default)]
pub struct DispatchIndex {
    by_name: HashMap<String, Vec<u64>>,
    /// Watchers not bound to one name: every event is theirs.
    any: Vec<u64>,
    /// Every id indexed since the last rebuild, present or not.
    ids: HashSet<u64>,
    /// An id was added twice (a watcher subscribing again): listing it twice would
    /// deliver its events twice, so the next caller rebuilds first.
    dirty: bool,
}

impl DispatchIndex {
    /// Records watcher `id`, bound to object name `name` when it watches one name only.
    pub fn add(&mut self, id: u64, name: Option<&str>) {
        if !self.ids.insert(id) {
            self.dirty = true;
            return;
        }
        match name {
            Some(n) => self.by_name.entry(n.to_string()).or_default().push(id),
            None => self.any.push(id),
        }
    }

    /// The watchers an event of the object named `name` may concern: every unbound one
    /// and those bound to `name`. May name watchers that have ended since (skip them).
    pub fn candidates<'a>(&'a self, name: &str) -> impl Iterator<Item = u64> + 'a {
        self.any
            .iter()
            .chain(self.by_name.get(name).into_iter().flatten())
            .copied()
    }

    /// Whether the index has grown past twice the `present` watchers (plus slack), or an
    /// id was added again: time to [`rebuild`](Self::rebuild) it.
    pub fn stale(&self, present: usize) -> bool {
        self.dirty || self.ids.len() > 2 * present + 64
    }

    /// Replaces the index with the watchers that are present.
    pub fn rebuild<'a>(&mut self, present: impl IntoIterator<Item = (u64, Option<&'a str>)>) {
        *self = DispatchIndex::default();
        for (id, name) in present {
            self.add(id, name);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sorted(it: impl Iterator<Item = u64>) -> Vec<u64> {
        let mut v: Vec<u64> = it.collect();
        v.sort_unstable();
        v
    }

    #[test]
    fn events_reach_unbound_watchers_and_their_names_watchers_table() {
        let mut ix = DispatchIndex::default();
        ix.add(1, None);
        ix.add(2, Some("s1"));
        ix.add(3, Some("s2"));
        ix.add(4, Some("s1"));
        ix.add(5, None);
        // (event's object name, watchers it may concern)
        let cases: &[(&str, &[u64])] = &[
            ("s1", &[1, 2, 4, 5]),
            ("s2", &[1, 3, 5]),
            ("s3", &[1, 5]),
            ("", &[1, 5]),
        ];
        for (name, want) in cases {
            assert_eq!(sorted(ix.candidates(name)), want.to_vec(), "{name:?}");
        }
    }

    #[test]
    fn a_rebuild_keeps_only_present_watchers_and_staleness_is_bounded() {
        let mut ix = DispatchIndex::default();
        for id in 0..200 {
            ix.add(id, Some(if id % 2 == 0 { "even" } else { "odd" }));
        }
        assert!(!ix.stale(200));
        // 190 ended: the index still names them until a rebuild.
        assert!(ix.stale(10));
        let present: Vec<(u64, Option<&str>)> = (190..200)
            .map(|id| (id, Some(if id % 2 == 0 { "even" } else { "odd" })))
            .collect();
        ix.rebuild(present);
        assert_eq!(sorted(ix.candidates("even")), vec![190, 192, 194, 196, 198]);
        assert_eq!(sorted(ix.candidates("odd")), vec![191, 193, 195, 197, 199]);
        assert!(!ix.stale(10));
    }

    #[test]
    fn a_watcher_added_again_is_never_listed_twice() {
        let mut ix = DispatchIndex::default();
        ix.add(7, Some("s1"));
        ix.add(7, None);
        assert!(ix.stale(1), "the second add asks for a rebuild");
        ix.rebuild([(7, None)]);
        assert!(!ix.stale(1));
        assert_eq!(sorted(ix.candidates("s1")), vec![7]);
        assert_eq!(sorted(ix.candidates("s2")), vec![7]);
    }
}
