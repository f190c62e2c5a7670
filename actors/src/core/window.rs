//! The sliding window of a key's recent events, from which watches resume.
//!
//! As the API server's `watchCache` ring buffer: capacity-bounded, evicting the oldest;
//! a relist empties it and records the list RV, so the oldest replayable RV is the list
//! RV + 1 until something is evicted, then the first buffered event's RV. "Too old" is
//! decided in one place ([`Window::since`]).

use std::collections::VecDeque;
use std::sync::Arc;

use thiserror::Error;

use crate::core::event::StoreEvent;
use crate::core::rv::{watch_start, WatchStart};

#[derive(Debug, Error, PartialEq, Eq)]
pub enum Error {
    /// The requested RV is older than the window can replay: the client must relist (410).
    #[error("too old resource version: {requested} ({oldest})")]
    Expired { requested: u64, oldest: u64 },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug)]
pub struct Window {
    events: VecDeque<Arc<StoreEvent>>,
    capacity: usize,
    /// RV of the last (re)list; what the window is complete after.
    list_rv: u64,
    evicted_since_list: bool,
    /// The state before this RV is not known exactly: a probe's relist dated the
    /// deletions it found at its own RV (`mark_undated`).
    undated_until: u64,
}

impl Window {
    pub fn new(capacity: usize) -> Self {
        Window {
            events: VecDeque::with_capacity(capacity.min(1024)),
            capacity: capacity.max(1),
            list_rv: 0,
            evicted_since_list: false,
            undated_until: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.events.len()
    }

    /// How many more events fit before the oldest is evicted.
    pub fn room(&self) -> usize {
        self.capacity - self.events.len()
    }

    pub fn is_empty(&self) -> bool {
        self.events.is_empty()
    }

    /// Empties the window after a (re)list at `rv`: events before it cannot be replayed,
    /// so a watcher resuming inside the span the relist skipped gets 410.
    pub fn reset(&mut self, rv: u64) {
        self.events.clear();
        self.list_rv = rv;
        self.evicted_since_list = false;
        self.undated_until = 0;
    }

    /// A relist at `rv` found deletions whose RVs it could not know and dated them at
    /// `rv`: states before `rv` are no longer recoverable exactly ([`Window::oldest_exact`]).
    pub fn mark_undated(&mut self, rv: u64) {
        self.undated_until = self.undated_until.max(rv);
    }

    /// The oldest RV whose state the window recovers exactly (`core::history`): one
    /// below the oldest replayable, unless a relist dated deletions later.
    pub fn oldest_exact(&self) -> u64 {
        self.oldest_replayable()
            .saturating_sub(1)
            .max(self.undated_until)
    }

    /// The buffered events, oldest first.
    pub fn events(&self) -> impl DoubleEndedIterator<Item = &StoreEvent> {
        self.events.iter().map(|e| e.as_ref())
    }

    /// The window holds every event since its list: nothing was evicted. Only then can
    /// the state at the list RV be recovered, and the window extended back.
    pub fn complete_since_list(&self) -> bool {
        !self.evicted_since_list
    }

    /// The oldest RV a watch can start from without a 410: any, while the window is
    /// complete since its list (older ones are backfilled, `core::backfill`), else one
    /// below the oldest event it holds (`rv::watch_start`).
    pub fn replayable_from(&self) -> u64 {
        if self.complete_since_list() {
            0
        } else {
            self.oldest_replayable().saturating_sub(1)
        }
    }

    /// The RV the window is complete after (its last list), while nothing was evicted.
    pub fn list_rv(&self) -> u64 {
        self.list_rv
    }

    /// Moves the window's start back to `rv`, putting `events` — everything that
    /// happened to the key in (`rv`, list RV], oldest first, from `core::backfill` — in
    /// front. Refused (false) once something was evicted, when `rv` is not older, or when
    /// the events do not fit: a window never holds more than its capacity.
    pub fn prepend(&mut self, rv: u64, events: Vec<Arc<StoreEvent>>) -> bool {
        if self.evicted_since_list
            || rv >= self.list_rv
            || self.events.len() + events.len() > self.capacity
        {
            return false;
        }
        for ev in events.into_iter().rev() {
            self.events.push_front(ev);
        }
        self.list_rv = rv;
        true
    }

    /// Appends an event, evicting the oldest when full.
    pub fn push(&mut self, ev: Arc<StoreEvent>) {
        if self.events.len() == self.capacity {
            self.events.pop_front();
            self.evicted_since_list = true;
        }
        self.events.push_back(ev);
    }

    /// The oldest RV a watch can resume at + 1 (`getAllEventsSinceLocked`'s `oldest`).
    pub fn oldest_replayable(&self) -> u64 {
        match self.events.front() {
            Some(first) if self.evicted_since_list => first.rv,
            _ => self.list_rv + 1,
        }
    }

    /// Buffered events newer than `rv`, or Expired when `rv` predates the window.
    pub fn since(&self, rv: u64) -> Result<Vec<Arc<StoreEvent>>> {
        match watch_start(rv, self.oldest_replayable()) {
            WatchStart::Expired { oldest } => Err(Error::Expired {
                requested: rv,
                oldest,
            }),
            WatchStart::Replay => {
                // Events are in RV order, so the first one to send is found by binary search.
                let first = self.events.partition_point(|e| e.rv <= rv);
                Ok(self.events.range(first..).cloned().collect())
            }
        }
    }

    /// Every event after sequence number `seq`, when the window holds all of them: `seq`
    /// is where a watcher's initial events or replay ended, `current` the key's latest
    /// sequence number. `None` when some were evicted, or dispatched without entering the
    /// window: the watcher cannot continue without a gap.
    pub fn since_seq(&self, seq: u64, current: u64) -> Option<Vec<Arc<StoreEvent>>> {
        if seq >= current {
            return Some(Vec::new());
        }
        let front = self.events.front()?;
        let back = self.events.back()?;
        if front.seq > seq + 1 || back.seq != current {
            return None;
        }
        let first = self.events.partition_point(|e| e.seq <= seq);
        Some(self.events.range(first..).cloned().collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::object::EventType;
    use serde_json::json;

    fn ev(seq: u64, rv: u64) -> Arc<StoreEvent> {
        Arc::new(StoreEvent::new(
            seq,
            rv,
            EventType::Modified,
            Arc::new(crate::core::store::fixtures::o(
                json!({"metadata": {"name": "a"}}),
            )),
            None,
        ))
    }
    fn rvs(v: &[Arc<StoreEvent>]) -> Vec<u64> {
        v.iter().map(|e| e.rv).collect()
    }

    #[test]
    fn replay_after_list_without_eviction() {
        let mut w = Window::new(3);
        w.reset(10);
        assert_eq!(w.oldest_replayable(), 11);
        assert_eq!(rvs(&w.since(10).unwrap()), Vec::<u64>::new());
        w.push(ev(1, 12));
        w.push(ev(2, 15));
        assert_eq!(rvs(&w.since(10).unwrap()), vec![12, 15]);
        assert_eq!(rvs(&w.since(12).unwrap()), vec![15]);
        assert_eq!(rvs(&w.since(13).unwrap()), vec![15]);
        assert_eq!(rvs(&w.since(15).unwrap()), Vec::<u64>::new());
        // Newer than anything seen: accepted, nothing to replay (1.20 waits for it).
        assert_eq!(rvs(&w.since(99).unwrap()), Vec::<u64>::new());
        assert_eq!(
            w.since(9).unwrap_err(),
            Error::Expired {
                requested: 9,
                oldest: 11
            }
        );
    }

    #[test]
    fn since_seq_continues_a_watcher_only_without_a_gap() {
        let mut w = Window::new(3);
        w.reset(10);
        // Nothing happened since the watcher's start.
        assert_eq!(w.since_seq(0, 0).map(|v| v.len()), Some(0));
        w.push(ev(1, 12));
        w.push(ev(2, 15));
        assert_eq!(w.since_seq(0, 2).map(|v| rvs(&v)), Some(vec![12, 15]));
        assert_eq!(w.since_seq(1, 2).map(|v| rvs(&v)), Some(vec![15]));
        assert_eq!(w.since_seq(2, 2).map(|v| rvs(&v)), Some(vec![]));
        // Evicted: seq 1 is gone, a watcher at 0 cannot continue.
        w.push(ev(3, 16));
        w.push(ev(4, 17));
        assert!(w.since_seq(0, 4).is_none());
        assert_eq!(w.since_seq(1, 4).map(|v| rvs(&v)), Some(vec![15, 16, 17]));
        // Dispatched without entering the window (seq 5): nobody before it continues.
        assert!(w.since_seq(3, 5).is_none());
        // A relist emptied the window after events the watcher did not see.
        w.reset(30);
        assert!(w.since_seq(4, 6).is_none());
    }

    #[test]
    fn a_complete_window_extends_back() {
        let mut w = Window::new(3);
        w.reset(20);
        assert!(w.since(10).is_err());
        // Events before the list get seq 0: no watcher continues from inside them.
        assert!(w.prepend(10, vec![ev(0, 12), ev(0, 15)]));
        assert_eq!(w.oldest_replayable(), 11);
        assert_eq!(rvs(&w.since(10).unwrap()), vec![12, 15]);
        assert_eq!(rvs(&w.since(12).unwrap()), vec![15]);
        // Never forward.
        assert!(!w.prepend(15, vec![]));
        assert_eq!(w.oldest_replayable(), 11);
        // Not beyond the capacity.
        assert!(!w.prepend(5, vec![ev(0, 6), ev(0, 7)]));
        assert!(w.prepend(5, vec![]));
        w.push(ev(1, 21));
        assert_eq!(w.since_seq(0, 1).map(|v| rvs(&v)), Some(vec![21]));
        // Not once something was evicted.
        w.push(ev(2, 22));
        assert!(!w.complete_since_list());
        assert!(!w.prepend(1, vec![]));
        assert_eq!(w.oldest_replayable(), 15);
    }

    #[test]
    fn eviction_moves_the_oldest_replayable_rv() {
        let mut w = Window::new(2);
        w.reset(10);
        w.push(ev(1, 12));
        w.push(ev(2, 15));
        w.push(ev(3, 20));
        assert_eq!(w.len(), 2);
        assert_eq!(w.oldest_replayable(), 15);
        // A client at 14 has everything before 15: it may resume.
        assert_eq!(rvs(&w.since(14).unwrap()), vec![15, 20]);
        assert!(w.since(13).is_err());
        assert!(w.since(10).is_err());
    }

    #[test]
    fn relist_cuts_the_window() {
        let mut w = Window::new(10);
        w.reset(10);
        w.push(ev(1, 12));
        w.reset(30);
        assert!(w.is_empty());
        assert_eq!(
            w.since(12).unwrap_err(),
            Error::Expired {
                requested: 12,
                oldest: 31
            }
        );
        assert!(w.since(30).unwrap().is_empty());
    }
}
