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
}

impl Window {
    pub fn new(capacity: usize) -> Self {
        Window {
            events: VecDeque::with_capacity(capacity.min(1024)),
            capacity: capacity.max(1),
            list_rv: 0,
            evicted_since_list: false,
        }
    }

    pub fn len(&self) -> usize {
        self.events.len()
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::filter::EventType;
    use serde_json::json;

    fn ev(seq: u64, rv: u64) -> Arc<StoreEvent> {
        Arc::new(StoreEvent::new(
            seq,
            rv,
            EventType::Modified,
            Arc::new(json!({"metadata": {"name": "a"}})),
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
