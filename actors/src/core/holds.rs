//! Read holds: a get or list keeps its key cached for the grace period after it, so that
//! repeated reads hit the cache. A hold is one reference per key asked, however many reads
//! renew it: the first read takes the reference and sets one timer; later reads only move
//! its deadline. The registry's cost per read is O(1), with one timer per held key rather
//! than one per read (a client reading thousands of times a second would otherwise queue
//! tens of thousands of timers in the single registry actor).

use std::collections::HashMap;
use std::hash::Hash;
use std::time::{Duration, Instant};

/// What a read's hold asks of the registry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnHold {
    /// The first hold of this key: keep the reference just taken, and check again after
    /// this long.
    Keep(Duration),
    /// Already held: the deadline moved; give back the reference just taken.
    Extended,
}

/// What a hold's timer finds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnTimer {
    /// The deadline passed: release the hold's reference.
    Release,
    /// Renewed since: check again after this long.
    Again(Duration),
    /// No such hold (the key was stopped and started again meanwhile, and another timer
    /// owns its hold now): nothing to do.
    Gone,
}

/// The held keys (by the key asked) and each one's deadline.
#[derive(Debug)]
pub struct Holds<K> {
    until: HashMap<K, Instant>,
}

impl<K> Default for Holds<K> {
    fn default() -> Self {
        Holds {
            until: HashMap::new(),
        }
    }
}

impl<K: Hash + Eq + Clone> Holds<K> {
    /// A read of `asked` at `now`, holding it for `duration`.
    pub fn hold(&mut self, asked: &K, now: Instant, duration: Duration) -> OnHold {
        // An absurd duration (a misconfigured grace period) holds for as long as an
        // Instant can say, rather than panic in the registry.
        let deadline = now
            .checked_add(duration)
            .unwrap_or(now + Duration::from_secs(1 << 32));
        match self.until.get_mut(asked) {
            Some(until) => {
                *until = (*until).max(deadline);
                OnHold::Extended
            }
            None => {
                self.until.insert(asked.clone(), deadline);
                OnHold::Keep(duration)
            }
        }
    }

    /// The timer of `asked`'s hold fired at `now`.
    pub fn timer(&mut self, asked: &K, now: Instant) -> OnTimer {
        match self.until.get(asked) {
            None => OnTimer::Gone,
            Some(&until) if until > now => OnTimer::Again(until - now),
            Some(_) => {
                self.until.remove(asked);
                OnTimer::Release
            }
        }
    }

    /// Takes every hold away, with its deadline: their references move to another key
    /// (a coalesced namespace key serving the names). Their timers find them `Gone`.
    pub fn take(&mut self) -> Vec<(K, Instant)> {
        self.until.drain().collect()
    }

    pub fn len(&self) -> usize {
        self.until.len()
    }

    pub fn is_empty(&self) -> bool {
        self.until.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn taken_holds_leave_nothing_for_their_timers() {
        let t0 = Instant::now();
        let mut h = Holds::default();
        assert_eq!(
            h.hold(&"a", t0, Duration::from_secs(30)),
            OnHold::Keep(Duration::from_secs(30))
        );
        let taken = h.take();
        assert_eq!(taken, [("a", t0 + Duration::from_secs(30))]);
        assert!(h.is_empty());
        assert_eq!(h.timer(&"a", t0 + Duration::from_secs(31)), OnTimer::Gone);
    }

    #[test]
    fn a_hold_is_one_reference_renewed_by_every_read() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let mut h = Holds::default();
        // (what happens, at seconds after t0, expected)
        enum Step {
            Hold(u64, OnHold),
            Timer(u64, OnTimer),
        }
        let steps = [
            Step::Hold(0, OnHold::Keep(s(30))),
            Step::Hold(10, OnHold::Extended),
            Step::Hold(20, OnHold::Extended),
            // The first timer finds the deadline moved to 50 s.
            Step::Timer(30, OnTimer::Again(s(20))),
            Step::Timer(50, OnTimer::Release),
            // A stale timer after the release finds nothing.
            Step::Timer(51, OnTimer::Gone),
            // The next read takes a new reference.
            Step::Hold(60, OnHold::Keep(s(30))),
            Step::Timer(95, OnTimer::Release),
        ];
        for (i, step) in steps.into_iter().enumerate() {
            match step {
                Step::Hold(at, want) => {
                    assert_eq!(h.hold(&"k", t0 + s(at), s(30)), want, "step {i}")
                }
                Step::Timer(at, want) => assert_eq!(h.timer(&"k", t0 + s(at)), want, "step {i}"),
            }
        }
        assert!(h.is_empty());
    }

    #[test]
    fn holds_of_different_keys_are_independent() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let mut h = Holds::default();
        assert_eq!(h.hold(&"a", t0, s(30)), OnHold::Keep(s(30)));
        assert_eq!(h.hold(&"b", t0 + s(5), s(30)), OnHold::Keep(s(30)));
        assert_eq!(h.len(), 2);
        assert_eq!(h.timer(&"a", t0 + s(30)), OnTimer::Release);
        assert_eq!(h.timer(&"b", t0 + s(30)), OnTimer::Again(s(5)));
        // A shorter hold never shortens a longer one.
        assert_eq!(h.hold(&"b", t0 + s(31), s(1)), OnHold::Extended);
        assert_eq!(h.timer(&"b", t0 + s(35)), OnTimer::Release);
    }
}
