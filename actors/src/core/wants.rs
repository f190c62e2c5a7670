//! NATS subscribers' interest in keys, as plain data: who asked for which key and until
//! when, within bounds per asker and in all. A subscriber asks on `<prefix>.want.<key>`
//! (NATS's own publish permissions decide who may ask for which keys) and renews before
//! its interest expires; the registry holds one reference on a key while anyone's
//! interest in it lasts, and releases it when the last one expires.
//!
//! `want` and `expire` return what the registry must do with its reference (take one,
//! drop one); the registry carries it out. Generic over the key so tests use strings.

use std::collections::HashMap;
use std::hash::Hash;

use thiserror::Error;

/// The bounds (`nats.want_per_asker`, `nats.want_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Keys one asker may want at once.
    pub per_asker: usize,
    /// (key, asker) pairs in all.
    pub total: usize,
}

/// Why an ask is refused.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum Error {
    #[error("this asker already wants {0} keys, the most one may")]
    AskerFull(usize),
    #[error("subscribers want {0} keys in all, the most this replica holds")]
    Full(usize),
    /// The replica's key budget refused the key (`cache.max_keys`).
    #[error("{0}")]
    Budget(String),
}

/// What the registry must do after an ask.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wanted {
    /// Nobody wanted the key before: take a reference on it.
    First,
    /// Someone already did (maybe this asker: a renewal): nothing to do.
    Again,
}

#[derive(Debug)]
pub struct Wants<K> {
    /// Per key, each asker's expiry (ms).
    by_key: HashMap<K, HashMap<String, u64>>,
    per_asker: HashMap<String, usize>,
    pairs: usize,
}

impl<K> Default for Wants<K> {
    fn default() -> Self {
        Wants {
            by_key: HashMap::new(),
            per_asker: HashMap::new(),
            pairs: 0,
        }
    }
}

impl<K: Hash + Eq + Clone> Wants<K> {
    /// `asker` wants `key` until `now_ms + ttl_ms`; a renewal moves the expiry.
    pub fn want(
        &mut self,
        key: &K,
        asker: &str,
        now_ms: u64,
        ttl_ms: u64,
        limits: Limits,
    ) -> Result<Wanted, Error> {
        let until = now_ms.saturating_add(ttl_ms);
        if let Some(expiry) = self.by_key.get_mut(key).and_then(|a| a.get_mut(asker)) {
            *expiry = until;
            return Ok(Wanted::Again);
        }
        let mine = self.per_asker.get(asker).copied().unwrap_or(0);
        if mine >= limits.per_asker {
            return Err(Error::AskerFull(mine));
        }
        if self.pairs >= limits.total {
            return Err(Error::Full(self.pairs));
        }
        *self.per_asker.entry(asker.to_string()).or_default() += 1;
        self.pairs += 1;
        let askers = self.by_key.entry(key.clone()).or_default();
        askers.insert(asker.to_string(), until);
        Ok(if askers.len() == 1 {
            Wanted::First
        } else {
            Wanted::Again
        })
    }

    /// Takes back an ask that [`Wants::want`] accepted as the key's first but the
    /// registry could not carry out (its key budget refused the key).
    pub fn undo(&mut self, key: &K, asker: &str) {
        let Some(askers) = self.by_key.get_mut(key) else {
            return;
        };
        let removed = askers.remove(asker).is_some();
        if askers.is_empty() {
            self.by_key.remove(key);
        }
        if removed {
            self.forget_one(asker);
        }
    }

    /// Drops every interest expired at `now_ms`; the keys nobody wants any more (the
    /// registry releases its reference on each).
    pub fn expire(&mut self, now_ms: u64) -> Vec<K> {
        let mut gone = Vec::new();
        let mut expired = Vec::new();
        for (key, askers) in &mut self.by_key {
            askers.retain(|asker, until| {
                let keep = *until > now_ms;
                if !keep {
                    expired.push(asker.clone());
                }
                keep
            });
            if askers.is_empty() {
                gone.push(key.clone());
            }
        }
        for asker in expired {
            self.forget_one(&asker);
        }
        for key in &gone {
            self.by_key.remove(key);
        }
        gone
    }

    /// How many askers want `key`.
    pub fn askers(&self, key: &K) -> usize {
        self.by_key.get(key).map_or(0, HashMap::len)
    }

    fn forget_one(&mut self, asker: &str) {
        self.pairs = self.pairs.saturating_sub(1);
        if let Some(n) = self.per_asker.get_mut(asker) {
            *n -= 1;
            if *n == 0 {
                self.per_asker.remove(asker);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const L: Limits = Limits {
        per_asker: 2,
        total: 3,
    };

    #[test]
    fn asks_renewals_bounds_and_expiry() {
        let mut w: Wants<&str> = Wants::default();
        assert_eq!(w.want(&"k1", "a", 0, 100, L), Ok(Wanted::First));
        assert_eq!(w.want(&"k1", "b", 10, 100, L), Ok(Wanted::Again));
        // A renewal moves a's expiry and counts nothing new.
        assert_eq!(w.want(&"k1", "a", 50, 100, L), Ok(Wanted::Again));
        assert_eq!(w.want(&"k2", "a", 50, 100, L), Ok(Wanted::First));
        // a holds two keys: its third is refused; the replica holds three pairs in all.
        assert_eq!(w.want(&"k3", "a", 50, 100, L), Err(Error::AskerFull(2)));
        assert_eq!(w.want(&"k3", "b", 50, 100, L), Err(Error::Full(3)));
        assert_eq!(w.askers(&"k1"), 2);
        // At 110 b's interest in k1 has expired, a's (renewed at 50) has not: k1 stays.
        assert_eq!(w.expire(110), Vec::<&str>::new());
        assert_eq!(w.askers(&"k1"), 1);
        // Room again: b may ask for k3.
        assert_eq!(w.want(&"k3", "b", 110, 100, L), Ok(Wanted::First));
        // At 150 a's two asks expire: k1 and k2 are nobody's.
        let mut gone = w.expire(150);
        gone.sort_unstable();
        assert_eq!(gone, vec!["k1", "k2"]);
        assert_eq!(w.expire(210), vec!["k3"]);
        assert_eq!(w.pairs, 0);
        assert!(w.per_asker.is_empty());
    }

    #[test]
    fn an_ask_the_registry_could_not_carry_out_is_taken_back() {
        let mut w: Wants<&str> = Wants::default();
        assert_eq!(w.want(&"k", "a", 0, 100, L), Ok(Wanted::First));
        w.undo(&"k", "a");
        assert_eq!(w.askers(&"k"), 0);
        assert_eq!(w.pairs, 0);
        // Undoing what was never asked changes nothing.
        w.undo(&"k", "z");
        assert_eq!(w.want(&"k", "a", 0, 100, L), Ok(Wanted::First));
    }
}
