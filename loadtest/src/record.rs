//! Counting and timing: live [`Counters`] (what the progress line shows) and the
//! [`Recorder`] that turns a write and the events it causes into latency samples.
//!
//! Every write carries a unique key: an update or create puts `bench-seq: s<N>` into the
//! object's annotations, a delete is keyed `d/<namespace>/<name>`. The writer records the
//! instant just before the request is sent; a watch that receives an event with a known
//! key records one sample per delivery. Keys of earlier phases (e.g. the annotation an
//! object kept from the other target's run) are ignored, so initial `ADDED` events of a
//! new watch never count as deliveries.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// The annotation that carries a write's sequence number.
pub const SEQ_ANNOTATION: &str = "bench-seq";

/// Live counts of one target's run.
#[derive(Default)]
pub struct Counters {
    /// Watch requests sent.
    pub opened: AtomicUsize,
    /// Watches established (first event, or response headers for watches from a list RV).
    pub ready: AtomicUsize,
    /// Watch requests that failed for good (after retries).
    pub failed: AtomicUsize,
    /// Events matched to a write of the current run.
    pub deliveries: AtomicUsize,
    /// Writes sent.
    pub writes: AtomicUsize,
    /// Failed watch requests, failed writes, broken streams, ERROR events.
    pub errors: AtomicUsize,
    /// Watch streams that ended while the run still wanted them.
    pub ended: AtomicUsize,
}

impl Counters {
    pub fn get(c: &AtomicUsize) -> usize {
        c.load(Ordering::Relaxed)
    }
    pub fn inc(c: &AtomicUsize) {
        c.fetch_add(1, Ordering::Relaxed);
    }
}

/// Locks, recovering the data if another task panicked while holding the lock.
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Write keys and their send instants, and the latency samples of each phase.
pub struct Recorder {
    /// key → (sent at, phase).
    sent: Mutex<HashMap<String, (Instant, usize)>>,
    samples: Mutex<Vec<Vec<Duration>>>,
    /// Why requests failed or were retried, with counts (reported in the JSON).
    reasons: Mutex<BTreeMap<String, usize>>,
    pub counters: Counters,
}

static SEQ: AtomicU64 = AtomicU64::new(1);

/// A process-wide unique write key for an update or create (`s<N>`).
pub fn next_seq_key() -> String {
    format!("s{}", SEQ.fetch_add(1, Ordering::Relaxed))
}

/// The key of a delete of `namespace/name`.
pub fn delete_key(namespace: &str, name: &str) -> String {
    format!("d/{namespace}/{name}")
}

impl Recorder {
    pub fn new(phases: usize) -> Recorder {
        Recorder {
            sent: Mutex::default(),
            samples: Mutex::new(vec![Vec::new(); phases.max(1)]),
            reasons: Mutex::default(),
            counters: Counters::default(),
        }
    }

    /// Called just before the write with this key is sent.
    pub fn mark_sent(&self, key: String, phase: usize) {
        lock(&self.sent).insert(key, (Instant::now(), phase));
    }

    /// A watch received an event carrying `key` at `at`; true if it was a current write.
    pub fn delivered(&self, key: &str, at: Instant) -> bool {
        let Some((t0, phase)) = lock(&self.sent).get(key).copied() else {
            return false;
        };
        if let Some(v) = lock(&self.samples).get_mut(phase) {
            v.push(at.saturating_duration_since(t0));
        }
        Counters::inc(&self.counters.deliveries);
        true
    }

    /// Deliveries recorded so far in `phase`.
    pub fn count(&self, phase: usize) -> usize {
        lock(&self.samples).get(phase).map_or(0, Vec::len)
    }

    /// Counts an error and its reason.
    pub fn failure(&self, reason: String) {
        Counters::inc(&self.counters.errors);
        self.note(reason);
    }

    /// Counts a reason without counting an error (e.g. a retried request).
    pub fn note(&self, reason: String) {
        *lock(&self.reasons).entry(reason).or_default() += 1;
    }

    /// Failure and retry reasons so far, with counts.
    pub fn reasons(&self) -> BTreeMap<String, usize> {
        lock(&self.reasons).clone()
    }

    /// The samples of `phase`, sorted.
    pub fn sorted(&self, phase: usize) -> Vec<Duration> {
        let mut v = lock(&self.samples).get(phase).cloned().unwrap_or_default();
        v.sort_unstable();
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_keys_of_this_recorder_count() {
        let r = Recorder::new(2);
        let k = next_seq_key();
        r.mark_sent(k.clone(), 1);
        assert!(r.delivered(&k, Instant::now()));
        assert!(r.delivered(&k, Instant::now()));
        assert!(!r.delivered("s0", Instant::now()));
        assert_eq!((r.count(0), r.count(1)), (0, 2));
        assert_eq!(Counters::get(&r.counters.deliveries), 2);
        assert_ne!(next_seq_key(), k);
    }
}
