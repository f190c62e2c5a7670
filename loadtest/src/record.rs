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
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
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
    /// key → arrival instants, for the paired comparison ([`added_by`]).
    arrivals: Mutex<HashMap<String, Vec<Instant>>>,
    /// A reference recorder (direct API server watches during a kcache run) records the
    /// arrival of every keyed event; its writes are marked in another recorder.
    reference: bool,
    /// Arrivals are kept only once a pairing needs them ([`Recorder::keep_arrivals`]):
    /// the generator shares a core with kcache, so it does no bookkeeping it needn't.
    keep_arrivals: AtomicBool,
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
            arrivals: Mutex::default(),
            reference: false,
            keep_arrivals: AtomicBool::new(false),
            counters: Counters::default(),
        }
    }

    /// From now on, record each current write's arrival instants for [`added_by`].
    pub fn keep_arrivals(&self) {
        self.keep_arrivals.store(true, Ordering::Relaxed);
    }

    /// A recorder for reference watches: see [`added_by`].
    pub fn reference() -> Recorder {
        Recorder {
            reference: true,
            ..Recorder::new(1)
        }
    }

    /// The arrivals recorded so far, leaving none (a watch worker's report).
    pub fn take_arrivals(&self) -> HashMap<String, Vec<Instant>> {
        std::mem::take(&mut *lock(&self.arrivals))
    }

    /// Called just before the write with this key is sent.
    pub fn mark_sent(&self, key: String, phase: usize) {
        lock(&self.sent).insert(key, (Instant::now(), phase));
    }

    /// A watch received an event carrying `key` at `at`; true if it was a current write.
    pub fn delivered(&self, key: &str, at: Instant) -> bool {
        if self.reference {
            lock(&self.arrivals)
                .entry(key.to_string())
                .or_default()
                .push(at);
            Counters::inc(&self.counters.deliveries);
            return true;
        }
        let Some((t0, phase)) = lock(&self.sent).get(key).copied() else {
            return false;
        };
        if self.keep_arrivals.load(Ordering::Relaxed) {
            lock(&self.arrivals)
                .entry(key.to_string())
                .or_default()
                .push(at);
        }
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

/// Paired latency: for every write that both recorders saw, each arrival in `measured`
/// minus the first arrival in `reference` (a direct API server watch of the same object,
/// open at the same time), in milliseconds, sorted. Both streams carry the same event at
/// the same time, so the API server's own delay cancels out and what is left is the hop
/// through kcache (negative when kcache's copy happened to arrive first).
pub fn added_by(measured: &Recorder, reference: &Recorder) -> Vec<f64> {
    let reference = lock(&reference.arrivals);
    let mut out: Vec<f64> = lock(&measured.arrivals)
        .iter()
        .filter_map(|(key, at)| {
            let r = reference.get(key)?.iter().min()?;
            Some(at.iter().map(move |a| signed_ms(*a, *r)))
        })
        .flatten()
        .collect();
    out.sort_by(f64::total_cmp);
    out
}

/// The spread between two reference recorders: for every write that `measured` saw (so
/// only current writes, not the initial events a late-opened watch starts with), the
/// first arrival in `other` minus the first arrival in `reference`, sorted.
pub fn spread(measured: &Recorder, reference: &Recorder, other: &Recorder) -> Vec<f64> {
    let keys: Vec<String> = lock(&measured.arrivals).keys().cloned().collect();
    let reference = lock(&reference.arrivals);
    let other = lock(&other.arrivals);
    let mut out: Vec<f64> = keys
        .iter()
        .filter_map(|k| {
            let r = reference.get(k)?.iter().min()?;
            let o = other.get(k)?.iter().min()?;
            Some(signed_ms(*o, *r))
        })
        .collect();
    out.sort_by(f64::total_cmp);
    out
}

fn signed_ms(a: Instant, b: Instant) -> f64 {
    if a >= b {
        (a - b).as_secs_f64() * 1e3
    } else {
        -((b - a).as_secs_f64() * 1e3)
    }
}

/// Nearest-rank percentile of sorted values.
pub fn percentile_f64(sorted: &[f64], p: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len());
    Some(sorted[rank - 1])
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

    #[test]
    fn paired_latency_is_measured_minus_first_reference_arrival() {
        let (m, r) = (Recorder::new(1), Recorder::reference());
        m.keep_arrivals();
        let t0 = Instant::now();
        let (k1, k2) = (next_seq_key(), next_seq_key());
        m.mark_sent(k1.clone(), 0);
        m.mark_sent(k2.clone(), 0);
        let at = |ms| t0 + Duration::from_millis(ms);
        // Reference watches know no writes of their own but record every keyed event.
        assert!(r.delivered(&k1, at(12)));
        assert!(r.delivered(&k1, at(10)));
        m.delivered(&k1, at(13));
        m.delivered(&k1, at(9));
        // No reference arrival: not paired.
        m.delivered(&k2, at(50));
        let d = added_by(&m, &r);
        assert_eq!(d.len(), 2);
        assert!(
            (d[0] + 1.0).abs() < 1e-6 && (d[1] - 3.0).abs() < 1e-6,
            "{d:?}"
        );
        assert_eq!(percentile_f64(&d, 0.5), Some(d[0]));
        assert_eq!(percentile_f64(&[], 0.5), None);
    }

    #[test]
    fn spread_counts_only_current_writes_first_arrival_each() {
        let (m, a, b) = (
            Recorder::new(1),
            Recorder::reference(),
            Recorder::reference(),
        );
        m.keep_arrivals();
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        let (old, cur) = (next_seq_key(), next_seq_key());
        m.mark_sent(cur.clone(), 0);
        m.delivered(&cur, at(20));
        // `old` was written before: a late reference watch's initial event carries it.
        a.delivered(&old, at(0));
        b.delivered(&old, at(900));
        a.delivered(&cur, at(10));
        b.delivered(&cur, at(14));
        b.delivered(&cur, at(11));
        let d = spread(&m, &a, &b);
        assert_eq!(d.len(), 1, "{d:?}");
        assert!((d[0] - 1.0).abs() < 1e-6, "{d:?}");
    }
}
