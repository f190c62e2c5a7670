//! Bounded caches of TokenReview and SubjectAccessReview answers, so every request does not
//! cost an upstream round trip.
//!
//! Each entry expires by its own TTL (allowing and denying answers differ; a zero TTL is
//! not cached). A full cache evicts single entries chosen by moka's TinyLFU: a newcomer is
//! only admitted over a victim used more often, so a flood of one-off keys (random object
//! names, bogus tokens) cannot push out everyone's warm entries and turn every request into
//! a review. Concurrent misses on one key send one review: the rest wait for its answer.

use std::future::Future;
use std::hash::Hash;
use std::sync::Arc;
use std::time::{Duration, Instant};

use moka::future::Cache;
use moka::notification::RemovalCause;
use moka::ops::compute::{CompResult, Op};
use moka::Expiry;

/// Lookups, by `cache` (`token`, `authz`) and `result` (`hit`, `miss`). A miss sent a review.
pub const REQUESTS: &str = "kcache_auth_cache_requests_total";
/// Entries a full cache dropped (or newcomers it did not admit), by `cache`.
pub const EVICTIONS: &str = "kcache_auth_cache_evictions_total";
/// Reviews sent upstream, by `review` (`TokenReview`, `SubjectAccessReview`) and `result`.
pub const REVIEWS: &str = "kcache_auth_reviews_total";
/// How long upstream reviews took, by `review`.
pub const REVIEW_DURATION: &str = "kcache_auth_review_duration_seconds";

/// How long a cached answer is honoured, by `cache` (`token`, `authz`) and `decision`
/// (`any` for tokens; `allow`, `deny` for authorization): the revocation lag of
/// cache-served requests, the one deliberate difference from the API server
/// (docs/security.md), set from `[auth]` at start.
pub const TTL: &str = "kcache_auth_cache_ttl_seconds";

/// Sets [`TTL`]'s series from the configured lifetimes.
pub fn record_ttls(token: Duration, allow: Duration, deny: Duration) {
    for (cache, decision, ttl) in [
        ("token", "any", token),
        ("authz", "allow", allow),
        ("authz", "deny", deny),
    ] {
        metrics::gauge!(TTL, "cache" => cache, "decision" => decision).set(ttl.as_secs_f64());
    }
}

/// Every `result` of [`REVIEWS`], by `review` (what `auth` and `authz` record).
pub const REVIEW_RESULTS: [(&str, &[&str]); 2] = [
    (
        "TokenReview",
        &["authenticated", "unauthenticated", "error"],
    ),
    ("SubjectAccessReview", &["allowed", "denied", "error"]),
];

/// Describes the metrics above, so `/metrics` carries HELP lines, and registers the
/// reviews' series at zero for each review and result, so an alert on failing reviews sees
/// the first (idempotent).
pub fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};
    describe_gauge!(
        TTL,
        Unit::Seconds,
        "How long a cached TokenReview or SubjectAccessReview answer is honoured (the revocation lag of cache-served requests), by cache and decision."
    );
    describe_counter!(
        REQUESTS,
        "Authentication and authorization cache lookups, by cache and result (hit, miss)."
    );
    describe_counter!(
        EVICTIONS,
        "Entries a full authentication or authorization cache evicted or did not admit."
    );
    describe_counter!(
        REVIEWS,
        "TokenReviews and SubjectAccessReviews sent to the API server, by result."
    );
    describe_histogram!(
        REVIEW_DURATION,
        Unit::Seconds,
        "Time TokenReviews and SubjectAccessReviews took at the API server."
    );
    for (review, results) in REVIEW_RESULTS {
        for result in results {
            metrics::counter!(REVIEWS, "review" => review, "result" => *result).increment(0);
        }
        let _ = metrics::histogram!(REVIEW_DURATION, "review" => review);
    }
}

/// Counts one upstream review and its latency.
pub fn record_review(review: &'static str, result: &'static str, took: Duration) {
    metrics::counter!(REVIEWS, "review" => review, "result" => result).increment(1);
    metrics::histogram!(REVIEW_DURATION, "review" => review).record(took.as_secs_f64());
}

type TtlFn<V> = Arc<dyn Fn(&V) -> Duration + Send + Sync>;

/// Each entry lives by its value's TTL from when it was stored; reads do not extend it.
struct PerEntry<V>(TtlFn<V>);

impl<K, V> Expiry<K, V> for PerEntry<V> {
    fn expire_after_create(&self, _: &K, value: &V, _: Instant) -> Option<Duration> {
        Some((self.0)(value))
    }

    fn expire_after_update(
        &self,
        _: &K,
        value: &V,
        _: Instant,
        _: Option<Duration>,
    ) -> Option<Duration> {
        Some((self.0)(value))
    }
}

pub struct TtlCache<K, V> {
    /// The `cache` label of the metrics.
    name: &'static str,
    ttl: TtlFn<V>,
    /// `None` when nothing would be kept (no capacity): every lookup is a review.
    entries: Option<Cache<K, V>>,
}

impl<K, V> TtlCache<K, V>
where
    K: Hash + Eq + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
{
    /// At most `capacity` entries; `ttl` gives each value's lifetime. A capacity of 0 caches
    /// nothing (callers pass 0 when every TTL is zero, so lookups are not serialized per key
    /// for answers that are never kept).
    pub fn new(
        name: &'static str,
        capacity: usize,
        ttl: impl Fn(&V) -> Duration + Send + Sync + 'static,
    ) -> Self {
        describe();
        for result in ["hit", "miss"] {
            metrics::counter!(REQUESTS, "cache" => name, "result" => result).increment(0);
        }
        metrics::counter!(EVICTIONS, "cache" => name).increment(0);
        let ttl: TtlFn<V> = Arc::new(ttl);
        let entries = (capacity > 0).then(|| {
            Cache::builder()
                .max_capacity(u64::try_from(capacity).unwrap_or(u64::MAX))
                .expire_after(PerEntry(ttl.clone()))
                .eviction_listener(move |_, _, cause| {
                    // Expired and replaced entries are the TTL at work, not pressure.
                    if cause == RemovalCause::Size {
                        metrics::counter!(EVICTIONS, "cache" => name).increment(1);
                    }
                })
                .build()
        });
        TtlCache { name, ttl, entries }
    }

    fn count(&self, result: &'static str) {
        metrics::counter!(REQUESTS, "cache" => self.name, "result" => result).increment(1);
    }

    /// The live value of `key`, else `fetch`'s (stored unless its TTL is zero). Concurrent
    /// callers missing on the same key wait for one fetch; a failed fetch is not stored,
    /// and whoever waited then fetches itself.
    pub async fn get_or_fetch<E, F, Fut>(&self, key: K, fetch: F) -> Result<V, E>
    where
        F: Fn() -> Fut,
        Fut: Future<Output = Result<V, E>>,
        E: Send + Sync + 'static,
    {
        let Some(entries) = &self.entries else {
            self.count("miss");
            return fetch().await;
        };
        if let Some(v) = entries.get(&key).await {
            self.count("hit");
            return Ok(v);
        }
        // The per-key lock of `and_try_compute_with` is what coalesces identical misses.
        let mut fetched = None;
        let slot = &mut fetched;
        let ttl = &self.ttl;
        let fetch = &fetch;
        let done = entries
            .entry(key)
            .and_try_compute_with(|existing| async move {
                if existing.is_some() {
                    // Another caller fetched it while this one waited.
                    return Ok(Op::Nop);
                }
                let v = fetch().await?;
                let op = if ttl(&v).is_zero() {
                    Op::Nop
                } else {
                    Op::Put(v.clone())
                };
                *slot = Some(v);
                Ok(op)
            })
            .await?;
        if let Some(v) = fetched {
            self.count("miss");
            return Ok(v);
        }
        match done {
            CompResult::Unchanged(e) | CompResult::Inserted(e) | CompResult::ReplacedWith(e) => {
                self.count("hit");
                Ok(e.into_value())
            }
            // Not reachable (the closure never removes and stores what it fetched), but
            // an answer is still owed: fetch it uncached.
            CompResult::Removed(_) | CompResult::StillNone(_) => {
                self.count("miss");
                fetch().await
            }
        }
    }

    /// Runs moka's pending housekeeping (admission, eviction) now rather than lazily, so
    /// tests see a settled cache.
    #[cfg(test)]
    async fn settle(&self) {
        if let Some(e) = &self.entries {
            e.run_pending_tasks().await;
        }
    }

    #[cfg(test)]
    fn len(&self) -> u64 {
        self.entries.as_ref().map_or(0, |e| e.entry_count())
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::convert::Infallible;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A fetch that counts its calls and answers `value`.
    pub(crate) struct Counted(pub AtomicUsize);

    impl Counted {
        pub(crate) fn new() -> Self {
            Counted(AtomicUsize::new(0))
        }

        pub(crate) async fn fetch<V>(&self, value: V) -> Result<V, Infallible> {
            self.0.fetch_add(1, Ordering::SeqCst);
            // Yield so concurrent callers really overlap.
            for _ in 0..5 {
                tokio::task::yield_now().await;
            }
            Ok(value)
        }

        pub(crate) fn calls(&self) -> usize {
            self.0.load(Ordering::SeqCst)
        }
    }

    fn allow_long_deny_zero(allowed: &bool) -> Duration {
        if *allowed {
            Duration::from_secs(3600)
        } else {
            Duration::ZERO
        }
    }

    async fn get(c: &TtlCache<String, bool>, key: &str, value: bool, f: &Counted) -> bool {
        let Ok(v) = c.get_or_fetch(key.to_string(), || f.fetch(value)).await;
        v
    }

    #[tokio::test]
    async fn each_entry_lives_by_its_own_ttl() {
        let c = TtlCache::new("test", 100, allow_long_deny_zero);
        let (allow, deny) = (Counted::new(), Counted::new());
        for _ in 0..3 {
            assert!(get(&c, "allow", true, &allow).await);
            assert!(!get(&c, "deny", false, &deny).await);
        }
        // Allowed once and kept; a zero deny TTL: never kept, asked every time.
        assert_eq!(allow.calls(), 1);
        assert_eq!(deny.calls(), 3);

        // A short TTL ends while a long one does not.
        let c = TtlCache::new("test", 100, |short: &bool| {
            if *short {
                Duration::from_millis(50)
            } else {
                Duration::from_secs(3600)
            }
        });
        let (short, long) = (Counted::new(), Counted::new());
        get(&c, "short", true, &short).await;
        get(&c, "long", false, &long).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
        get(&c, "short", true, &short).await;
        get(&c, "long", false, &long).await;
        assert_eq!(short.calls(), 2, "the expired entry is fetched again");
        assert_eq!(long.calls(), 1, "the live entry is served");
    }

    #[tokio::test]
    async fn a_full_cache_evicts_single_entries_and_keeps_the_warm_ones() {
        let c = TtlCache::new("test", 20, |_: &bool| Duration::from_secs(3600));
        // moka counts use frequencies only once a cache is half full: fill it that far.
        let filler = Counted::new();
        for i in 0..12 {
            get(&c, &format!("filler-{i}"), true, &filler).await;
        }
        c.settle().await;
        let warm = Counted::new();
        for key in ["warm-a", "warm-b"] {
            for _ in 0..8 {
                get(&c, key, true, &warm).await;
            }
        }
        c.settle().await;
        // A flood of one-off keys, ten times the capacity.
        let flood = Counted::new();
        for i in 0..200 {
            get(&c, &format!("flood-{i}"), true, &flood).await;
        }
        c.settle().await;
        assert_eq!(flood.calls(), 200);
        assert!(c.len() <= 20, "bounded: {} entries", c.len());
        let before = warm.calls();
        get(&c, "warm-a", true, &warm).await;
        get(&c, "warm-b", true, &warm).await;
        assert_eq!(warm.calls(), before, "the warm entries survived the flood");
        // Not cleared either: some of the flood is still cached besides them.
        assert!(c.len() > 2, "only {} entries left", c.len());
    }

    #[tokio::test]
    async fn concurrent_misses_on_one_key_fetch_once() {
        let c = TtlCache::new("test", 100, |_: &bool| Duration::from_secs(3600));
        let f = Counted::new();
        let (a, b, d) = futures::join!(
            get(&c, "k", true, &f),
            get(&c, "k", true, &f),
            get(&c, "k", true, &f)
        );
        assert!(a && b && d);
        assert_eq!(f.calls(), 1);
    }

    #[tokio::test]
    async fn zero_capacity_caches_nothing() {
        let c = TtlCache::new("test", 0, |_: &bool| Duration::from_secs(3600));
        let f = Counted::new();
        get(&c, "k", true, &f).await;
        get(&c, "k", true, &f).await;
        assert_eq!(f.calls(), 2);
    }

    #[tokio::test]
    async fn a_failed_fetch_is_not_stored() {
        let c: TtlCache<String, bool> = TtlCache::new("test", 100, |_| Duration::from_secs(3600));
        let r: Result<bool, &str> = c.get_or_fetch("k".into(), || async { Err("down") }).await;
        assert_eq!(r, Err("down"));
        let f = Counted::new();
        assert!(get(&c, "k", true, &f).await);
        assert_eq!(f.calls(), 1);
    }
}
