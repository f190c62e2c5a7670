//! A key's watcher table, as plain data: which watches the key feeds, which are live
//! (their initial events or replay written: from then on they get events and bookmarks),
//! which of them an event concerns (`dispatch_index`), and whose bookmarks are due. The
//! CachedObject keeps each watcher's link in the entry (`L`) and sends what the table
//! names; the table decides, the actor carries out (the first room of issue 28.1's key
//! core).

use std::collections::HashMap;

use super::bookmark::{next_bookmark_time, BookmarkTimer};
use super::dispatch_index::DispatchIndex;
use super::key::{Key, Scope};

/// One watch the key feeds.
#[derive(Debug)]
pub struct Entry<L> {
    /// Where its messages go (the actor's link; anything in tests).
    pub link: L,
    pub allow_bookmarks: bool,
    /// When the watch ends by its `timeoutSeconds` (ms on the key's clock): no bookmark is
    /// scheduled past it.
    pub deadline_ms: Option<u64>,
    /// Gets events and bookmarks: its initial events or replay are written. Until then it
    /// is only closed with the key.
    pub live: bool,
    /// The key the watch asked for, when this key covers it.
    pub asked: Option<Box<Key>>,
}

impl<L> Entry<L> {
    /// A watch that is not live yet.
    pub fn new(
        link: L,
        allow_bookmarks: bool,
        deadline_ms: Option<u64>,
        asked: Option<Box<Key>>,
    ) -> Self {
        Entry {
            link,
            allow_bookmarks,
            deadline_ms,
            live: false,
            asked,
        }
    }

    /// The one object name this watch asked for (a covered name key's request), if any:
    /// only that object's events concern it.
    pub fn bound_name(&self) -> Option<&str> {
        match &self.asked.as_deref()?.scope {
            Scope::Name { name, .. } => Some(name.as_str()),
            _ => None,
        }
    }
}

#[derive(Debug)]
pub struct Watchers<L> {
    entries: HashMap<u64, Entry<L>>,
    index: DispatchIndex,
    bookmarks: BookmarkTimer<u64>,
    /// How often a live watch that allows bookmarks gets one (ms).
    bookmark_every_ms: u64,
}

impl<L> Watchers<L> {
    pub fn new(bookmark_every_ms: u64) -> Self {
        Watchers {
            entries: HashMap::new(),
            index: DispatchIndex::default(),
            bookmarks: BookmarkTimer::default(),
            bookmark_every_ms,
        }
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn get(&self, id: u64) -> Option<&Entry<L>> {
        self.entries.get(&id)
    }

    /// Adds watch `id` (not live yet).
    pub fn insert(&mut self, id: u64, entry: Entry<L>) {
        self.index.add(id, entry.bound_name());
        self.entries.insert(id, entry);
    }

    /// Ends watch `id` here: it gets nothing more (its pending bookmark finds no entry
    /// and is dropped; the dispatch index skips it until its next rebuild).
    pub fn remove(&mut self, id: u64) -> Option<Entry<L>> {
        self.entries.remove(&id)
    }

    /// Ends every watch (the key stops, drains, or relists after a gap).
    pub fn drain(&mut self) -> Vec<(u64, Entry<L>)> {
        self.bookmarks = BookmarkTimer::default();
        self.index = DispatchIndex::default();
        self.entries.drain().collect()
    }

    /// Watch `id` wrote its backlog: from now on it gets events, and bookmarks if it
    /// allows them (the first one a bookmark period from `now_ms`).
    pub fn go_live(&mut self, id: u64, now_ms: u64) {
        let Some(w) = self.entries.get_mut(&id) else {
            return;
        };
        w.live = true;
        if w.allow_bookmarks {
            if let Some(due) = next_bookmark_time(now_ms, w.deadline_ms, self.bookmark_every_ms) {
                self.bookmarks.schedule(id, due);
            }
        }
    }

    /// The live watches an event of the object named `name` concerns, with their links:
    /// every live watch not bound to a name, and the live ones bound to `name`.
    /// (An iterator, not a list: this runs for every event of the key.)
    pub fn concerned<'a>(&'a mut self, name: &'a str) -> impl Iterator<Item = (u64, &'a L)> + 'a {
        if self.index.stale(self.entries.len()) {
            self.index
                .rebuild(self.entries.iter().map(|(id, w)| (*id, w.bound_name())));
        }
        let (index, entries) = (&self.index, &self.entries);
        index
            .candidates(name)
            .filter_map(move |id| entries.get(&id).filter(|w| w.live).map(|w| (id, &w.link)))
    }

    /// The watches whose bookmark is due at `now_ms`, with their links; each is scheduled
    /// again a period later (unless its deadline comes first).
    pub fn due_bookmarks(&mut self, now_ms: u64) -> Vec<(u64, &L)> {
        let mut due = Vec::new();
        for id in self.bookmarks.pop_due(now_ms) {
            let Some(w) = self.entries.get(&id).filter(|w| w.allow_bookmarks) else {
                continue;
            };
            if let Some(next) = next_bookmark_time(now_ms, w.deadline_ms, self.bookmark_every_ms) {
                self.bookmarks.schedule(id, next);
            }
            due.push(id);
        }
        due.into_iter()
            .filter_map(|id| self.entries.get(&id).map(|w| (id, &w.link)))
            .collect()
    }

    /// The watches to hand over to another key: those that asked for `only_asked` when
    /// given, else all, split into the live ones and a count of those not live yet (they
    /// are asked for again).
    pub fn handover(&self, only_asked: Option<&Key>) -> (Vec<u64>, usize) {
        let mut live = Vec::new();
        let mut pending = 0;
        for (id, w) in &self.entries {
            if only_asked.is_some_and(|k| w.asked.as_deref() != Some(k)) {
                continue;
            }
            if w.live {
                live.push(*id);
            } else {
                pending += 1;
            }
        }
        (live, pending)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::key::ResourceType;
    use std::sync::Arc;

    fn name_key(name: &str) -> Box<Key> {
        Box::new(Key::new(
            Arc::new(ResourceType::new("", "v1", "secrets", "Secret", true)),
            Scope::Name {
                namespace: Some("ns".into()),
                name: name.into(),
            },
        ))
    }

    fn ids<'a, L: 'a>(v: impl IntoIterator<Item = (u64, &'a L)>) -> Vec<u64> {
        let mut ids: Vec<u64> = v.into_iter().map(|(id, _)| id).collect();
        ids.sort_unstable();
        ids
    }

    #[test]
    fn events_reach_live_watches_they_concern() {
        let mut w = Watchers::new(60_000);
        w.insert(1, Entry::new("all", false, None, None));
        w.insert(2, Entry::new("s1", false, None, Some(name_key("s1"))));
        w.insert(3, Entry::new("s2", false, None, Some(name_key("s2"))));
        // Nobody is live yet: nothing is sent.
        assert_eq!(w.concerned("s1").count(), 0);
        for id in [1, 2, 3] {
            w.go_live(id, 0);
        }
        // (object name, watches concerned)
        for (name, want) in [("s1", vec![1, 2]), ("s2", vec![1, 3]), ("s3", vec![1])] {
            assert_eq!(ids(w.concerned(name)), want, "{name}");
        }
        w.remove(1);
        assert_eq!(ids(w.concerned("s1")), vec![2]);
        // A re-subscribed id is listed once.
        w.insert(2, Entry::new("s1 again", false, None, Some(name_key("s1"))));
        w.go_live(2, 0);
        assert_eq!(w.concerned("s1").count(), 1);
    }

    #[test]
    fn bookmarks_come_every_period_to_live_watches_that_allow_them_until_the_deadline() {
        let mut w = Watchers::new(1_000);
        w.insert(1, Entry::new((), true, None, None));
        w.insert(2, Entry::new((), false, None, None));
        w.insert(3, Entry::new((), true, Some(2_500), None));
        w.insert(4, Entry::new((), true, None, None));
        for id in [1, 2, 3] {
            w.go_live(id, 0);
        }
        // 4 is not live: no bookmark; 2 does not allow them.
        let mut due = Vec::new();
        for now in (0..=4_000).step_by(250) {
            for (id, _) in w.due_bookmarks(now) {
                due.push((now, id));
            }
        }
        let of = |id| due.iter().filter(|(_, i)| *i == id).count();
        assert_eq!((of(2), of(4)), (0, 0), "{due:?}");
        assert!(of(1) >= 3, "{due:?}");
        // None past the deadline.
        assert!(
            due.iter().all(|&(now, id)| id != 3 || now <= 2_500),
            "{due:?}"
        );
        // A removed watch's pending bookmark is dropped.
        w.remove(1);
        assert!(w.due_bookmarks(100_000).iter().all(|(id, _)| *id != 1));
    }

    #[test]
    fn handover_moves_the_live_watches_asked_for_and_counts_the_rest() {
        let mut w = Watchers::new(1_000);
        w.insert(1, Entry::new((), false, None, Some(name_key("s1"))));
        w.insert(2, Entry::new((), false, None, Some(name_key("s1"))));
        w.insert(3, Entry::new((), false, None, Some(name_key("s2"))));
        w.insert(4, Entry::new((), false, None, None));
        w.go_live(1, 0);
        w.go_live(3, 0);
        w.go_live(4, 0);
        let (mut live, pending) = w.handover(Some(&name_key("s1")));
        live.sort_unstable();
        assert_eq!((live, pending), (vec![1], 1));
        let (mut live, pending) = w.handover(None);
        live.sort_unstable();
        assert_eq!((live, pending), (vec![1, 3, 4], 1));
    }

    #[test]
    fn drain_ends_every_watch_and_its_bookmarks() {
        let mut w = Watchers::new(1_000);
        w.insert(1, Entry::new((), true, None, None));
        w.go_live(1, 0);
        assert_eq!(w.drain().len(), 1);
        assert!(w.is_empty());
        assert!(w.due_bookmarks(10_000).is_empty());
        assert_eq!(w.concerned("x").count(), 0);
    }
}
