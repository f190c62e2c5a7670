//! A small bounded cache whose entries expire: TokenReview and SubjectAccessReview answers
//! are reused briefly so every request does not cost an upstream round trip.

use std::borrow::Borrow;
use std::collections::HashMap;
use std::hash::Hash;
use std::sync::Mutex;
use std::time::{Duration, Instant};

pub struct TtlCache<K, V> {
    capacity: usize,
    /// How long a value stays valid; may depend on the value (allow vs deny TTLs).
    ttl: Box<dyn Fn(&V) -> Duration + Send + Sync>,
    // A std lock held for a lookup or an insert, never across an await.
    entries: Mutex<HashMap<K, (V, Instant)>>,
}

impl<K: Hash + Eq, V: Clone> TtlCache<K, V> {
    /// `ttl` gives each value's lifetime.
    pub fn new(capacity: usize, ttl: impl Fn(&V) -> Duration + Send + Sync + 'static) -> Self {
        TtlCache {
            capacity: capacity.max(1),
            ttl: Box::new(ttl),
            entries: Mutex::new(HashMap::new()),
        }
    }

    fn live(&self, v: &V, at: Instant) -> bool {
        at.elapsed() < (self.ttl)(v)
    }

    pub fn get<Q>(&self, key: &Q) -> Option<V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let entries = self.entries.lock().ok()?;
        let (v, at) = entries.get(key)?;
        self.live(v, *at).then(|| v.clone())
    }

    pub fn insert(&self, key: K, value: V) {
        let Ok(mut entries) = self.entries.lock() else {
            return;
        };
        if entries.len() >= self.capacity {
            // Bounded: drop expired entries first, then everything if still full (a burst of
            // distinct keys must not grow memory without bound).
            entries.retain(|_, (v, at)| self.live(v, *at));
            if entries.len() >= self.capacity {
                entries.clear();
            }
        }
        entries.insert(key, (value, Instant::now()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_expire_by_their_own_ttl_and_the_size_is_bounded() {
        // Allowing answers live a minute; denying ones not at all.
        let c = TtlCache::new(2, |allowed: &bool| {
            if *allowed {
                Duration::from_secs(60)
            } else {
                Duration::ZERO
            }
        });
        c.insert("allow", true);
        c.insert("deny", false);
        assert_eq!(c.get("allow"), Some(true));
        // A zero deny TTL: never served.
        assert_eq!(c.get("deny"), None);
        // Full: the expired entry is dropped to make room, the live one stays.
        c.insert("third", true);
        assert_eq!(c.get("allow"), Some(true));
        assert_eq!(c.get("third"), Some(true));
        // Full of live entries: cleared rather than grown.
        c.insert("fourth", true);
        assert_eq!(c.get("allow"), None);
        assert_eq!(c.get("fourth"), Some(true));
    }
}
