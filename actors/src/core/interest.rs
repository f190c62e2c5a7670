//! Fleet-wide interest: which replicas hold references to which keys.
//!
//! Each replica publishes its refcounts every interval; a record lives for a few
//! intervals after its last refresh, so a killed replica's interest disappears on its own
//! and cannot keep a key watched forever. The owner of a key asks [`Interest::others`]
//! before it stops the upstream watch.

use std::collections::HashMap;

#[derive(Debug, Default)]
pub struct Interest {
    /// key token → replica → (refcount, last refreshed).
    keys: HashMap<String, HashMap<String, (u64, u64)>>,
}

impl Interest {
    /// Records `replica`'s refcount of `token` as of `now_ms` (0 withdraws it).
    pub fn record(&mut self, replica: &str, token: &str, refs: u64, now_ms: u64) {
        if refs == 0 {
            if let Some(by) = self.keys.get_mut(token) {
                by.remove(replica);
                if by.is_empty() {
                    self.keys.remove(token);
                }
            }
            return;
        }
        self.keys
            .entry(token.to_string())
            .or_default()
            .insert(replica.to_string(), (refs, now_ms));
    }

    /// The fleet's refcount of `token`, counting records refreshed within `ttl_ms`.
    pub fn total(&self, token: &str, now_ms: u64, ttl_ms: u64) -> u64 {
        self.sum(token, now_ms, ttl_ms, None)
    }

    /// The refcount other replicas than `me` hold on `token`.
    pub fn others(&self, token: &str, me: &str, now_ms: u64, ttl_ms: u64) -> u64 {
        self.sum(token, now_ms, ttl_ms, Some(me))
    }

    fn sum(&self, token: &str, now_ms: u64, ttl_ms: u64, except: Option<&str>) -> u64 {
        self.keys.get(token).map_or(0, |by| {
            by.iter()
                .filter(|(r, (_, seen))| {
                    Some(r.as_str()) != except && now_ms.saturating_sub(*seen) <= ttl_ms
                })
                // Refcounts come from other replicas over NATS: a bogus one must not
                // overflow (a panic in a debug build, a wrapped total in release).
                .fold(0u64, |sum, (_, (n, _))| sum.saturating_add(*n))
        })
    }

    /// The tokens some replica holds a live reference on (refreshed within `ttl_ms`).
    pub fn live_tokens(&self, now_ms: u64, ttl_ms: u64) -> impl Iterator<Item = &str> + '_ {
        self.keys
            .iter()
            .filter(move |(_, by)| {
                by.values()
                    .any(|(n, seen)| *n > 0 && now_ms.saturating_sub(*seen) <= ttl_ms)
            })
            .map(|(t, _)| t.as_str())
    }

    /// Drops records older than `ttl_ms`.
    pub fn expire(&mut self, now_ms: u64, ttl_ms: u64) {
        self.keys.retain(|_, by| {
            by.retain(|_, (_, seen)| now_ms.saturating_sub(*seen) <= ttl_ms);
            !by.is_empty()
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn live_tokens_are_those_with_a_fresh_nonzero_reference() {
        let mut i = Interest::default();
        i.record("a", "v1.secrets.ns.name.x", 1, 0);
        i.record("b", "v1.secrets.ns.name.y", 2, 900);
        i.record("b", "v1.secrets.other.name.z", 1, 900);
        i.record("c", "v1.secrets.ns.name.z", 1, 1_400);
        i.record("c", "v1.secrets.ns.name.z", 0, 1_450);
        let mut live: Vec<&str> = i.live_tokens(1_500, 1_000).collect();
        live.sort();
        // a's record is older than the TTL; c withdrew its reference.
        assert_eq!(live, ["v1.secrets.ns.name.y", "v1.secrets.other.name.z"]);
    }

    #[test]
    fn sums_live_records_and_forgets_dead_replicas() {
        let mut i = Interest::default();
        i.record("a", "k", 3, 0);
        i.record("b", "k", 2, 0);
        assert_eq!(i.total("k", 100, 1_000), 5);
        assert_eq!(i.others("k", "a", 100, 1_000), 2);
        i.record("a", "k", 4, 900);
        // b stopped refreshing (killed): it no longer counts after the TTL.
        assert_eq!(i.total("k", 1_500, 1_000), 4);
        assert_eq!(i.others("k", "a", 1_500, 1_000), 0);
        i.record("a", "k", 0, 1_600);
        assert_eq!(i.total("k", 1_600, 1_000), 0);
        i.record("c", "j", 1, 0);
        i.expire(5_000, 1_000);
        assert_eq!(i.total("j", 0, 10_000), 0);
        assert_eq!(i.total("missing", 0, 1), 0);
    }

    #[test]
    fn refcounts_past_u64_saturate() {
        // Found by fuzzing (actors/tests/fuzz_parsers.rs): the sum overflowed.
        let mut i = Interest::default();
        i.record("a", "t", u64::MAX, 0);
        i.record("b", "t", 2, 0);
        assert_eq!(i.total("t", 0, 10), u64::MAX);
        assert_eq!(i.others("t", "a", 0, 10), 2);
    }
}
