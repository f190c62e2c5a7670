//! Fleet-wide interest: which replicas hold references to which keys, and which names
//! their covering keys serve.
//!
//! Each replica sends its table once in full, then only what changed
//! ([`outbox::Outbox`]), every interval, and an empty message when nothing did: a
//! replica's records live while it is heard, so a killed replica's interest disappears
//! on its own (`expire`) and cannot keep a key watched forever. Receivers apply a
//! replica's messages in order and ask for its table again when one went missing
//! ([`sync::Peers`]). The owner of a key asks [`Interest::others`] before it stops the
//! upstream watch; coalescing counts a namespace's names fleet-wide from the group index
//! ([`Interest::group_len`]), kept as records come and go, so neither re-reads the fleet's
//! names every second.

pub mod outbox;
pub mod sync;

use std::collections::HashMap;

use crate::core::subject::member_group;

/// Which of a replica's two tables a record belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    /// References on the key itself: they keep its owner watching it.
    Refs,
    /// Requests of a name or node that a covering key serves: counted by coalescing,
    /// never by ownership (a covered name must not keep its name key's owner watching it).
    Covered,
}

#[derive(Debug, Default)]
pub struct Interest {
    /// key token → replica → refcount (never 0: a 0 withdraws the record).
    refs: HashMap<String, HashMap<String, u64>>,
    /// name or node token → replica → requests a covering key serves.
    covered: HashMap<String, HashMap<String, u64>>,
    /// replica → when it was last heard (ms).
    heard: HashMap<String, u64>,
    /// member group (`subject::member_group`) → token → records of it, both kinds, all
    /// replicas: the names and nodes watched anywhere in the fleet, by namespace.
    groups: HashMap<String, HashMap<String, u32>>,
}

impl Interest {
    /// Records `replica`'s count of `token` (0 withdraws it).
    pub fn record(&mut self, kind: Kind, replica: &str, token: &str, n: u64) {
        let table = self.table_mut(kind);
        let changed = if n == 0 {
            let by = table.get_mut(token);
            let (gone, empty) = by.map_or((None, false), |by| (by.remove(replica), by.is_empty()));
            if empty {
                table.remove(token);
            }
            gone.map(|_| -1)
        } else {
            let by = table.entry(token.to_string()).or_default();
            by.insert(replica.to_string(), n).is_none().then_some(1)
        };
        if let (Some(delta), Some(group)) = (changed, member_group(token)) {
            self.count_in_group(group, token, delta);
        }
    }

    /// `replica` was heard at `now_ms`: its records count until `now_ms + ttl`.
    pub fn heard(&mut self, replica: &str, now_ms: u64) {
        match self.heard.get_mut(replica) {
            Some(at) => *at = now_ms,
            None => {
                self.heard.insert(replica.to_string(), now_ms);
            }
        }
    }

    /// The fleet's count of `token`, counting replicas heard within `ttl_ms`.
    pub fn total(&self, kind: Kind, token: &str, now_ms: u64, ttl_ms: u64) -> u64 {
        self.sum(kind, token, now_ms, ttl_ms, None)
    }

    /// The count replicas other than `me` hold on `token`.
    pub fn others(&self, kind: Kind, token: &str, me: &str, now_ms: u64, ttl_ms: u64) -> u64 {
        self.sum(kind, token, now_ms, ttl_ms, Some(me))
    }

    fn sum(&self, kind: Kind, token: &str, now_ms: u64, ttl_ms: u64, except: Option<&str>) -> u64 {
        self.table(kind).get(token).map_or(0, |by| {
            by.iter()
                .filter(|(r, _)| Some(r.as_str()) != except && self.live(r, now_ms, ttl_ms))
                // Counts come from other replicas over NATS: a bogus one must not
                // overflow (a panic in a debug build, a wrapped total in release).
                .fold(0u64, |sum, (_, n)| sum.saturating_add(*n))
        })
    }

    fn live(&self, replica: &str, now_ms: u64, ttl_ms: u64) -> bool {
        self.heard
            .get(replica)
            .is_some_and(|at| now_ms.saturating_sub(*at) <= ttl_ms)
    }

    /// How many distinct names (or nodes) of a member group (`subject::member_group`, as
    /// `member_token_prefix` gives it for the big key) the fleet's records name. Exact
    /// for the replicas heard within the TTL once [`Interest::expire`] has run.
    pub fn group_len(&self, group: &str) -> usize {
        self.groups.get(group).map_or(0, HashMap::len)
    }

    /// Forgets the replicas not heard within `ttl_ms` and their records; returns them.
    pub fn expire(&mut self, now_ms: u64, ttl_ms: u64) -> Vec<String> {
        let gone: Vec<String> = self
            .heard
            .iter()
            .filter(|(_, at)| now_ms.saturating_sub(**at) > ttl_ms)
            .map(|(r, _)| r.clone())
            .collect();
        for r in &gone {
            self.forget(r);
        }
        gone
    }

    /// Drops every record of `replica` (it expired, or restarted: a new incarnation
    /// sends its table afresh). One pass over the fleet's tokens: a rare event.
    pub fn forget(&mut self, replica: &str) {
        self.heard.remove(replica);
        self.retain_records(replica, |_, _| false);
    }

    /// Keeps the records of `replica` for which `keep(kind, token)` holds.
    pub fn retain_records(&mut self, replica: &str, mut keep: impl FnMut(Kind, &str) -> bool) {
        let mut dropped = Vec::new();
        for kind in [Kind::Refs, Kind::Covered] {
            self.table_mut(kind).retain(|token, by| {
                if by.contains_key(replica) && !keep(kind, token) {
                    by.remove(replica);
                    dropped.push(token.clone());
                }
                !by.is_empty()
            });
        }
        for token in dropped {
            if let Some(group) = member_group(&token) {
                self.count_in_group(group, &token, -1);
            }
        }
    }

    /// The tokens `replica` holds a record of, of `kind`.
    pub fn records_of<'a>(
        &'a self,
        kind: Kind,
        replica: &'a str,
    ) -> impl Iterator<Item = (&'a str, u64)> + 'a {
        self.table(kind)
            .iter()
            .filter_map(move |(t, by)| by.get(replica).map(|n| (t.as_str(), *n)))
    }

    fn count_in_group(&mut self, group: &str, token: &str, delta: i32) {
        if delta > 0 {
            let g = self.groups.entry(group.to_string()).or_default();
            *g.entry(token.to_string()).or_default() += 1;
            return;
        }
        let Some(g) = self.groups.get_mut(group) else {
            return;
        };
        if let Some(n) = g.get_mut(token) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                g.remove(token);
            }
        }
        if g.is_empty() {
            self.groups.remove(group);
        }
    }

    fn table(&self, kind: Kind) -> &HashMap<String, HashMap<String, u64>> {
        match kind {
            Kind::Refs => &self.refs,
            Kind::Covered => &self.covered,
        }
    }

    fn table_mut(&mut self, kind: Kind) -> &mut HashMap<String, HashMap<String, u64>> {
        match kind {
            Kind::Refs => &mut self.refs,
            Kind::Covered => &mut self.covered,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use Kind::{Covered, Refs};

    const NAME_X: &str = "_.v1.secrets.ns.name.x";
    const NAME_Y: &str = "_.v1.secrets.ns.name.y";
    const GROUP: &str = "_.v1.secrets.ns.name.";

    #[test]
    fn sums_heard_replicas_and_forgets_silent_ones() {
        let mut i = Interest::default();
        i.heard("a", 0);
        i.heard("b", 0);
        i.record(Refs, "a", "k", 3);
        i.record(Refs, "b", "k", 2);
        assert_eq!(i.total(Refs, "k", 100, 1_000), 5);
        assert_eq!(i.others(Refs, "k", "a", 100, 1_000), 2);
        i.record(Refs, "a", "k", 4);
        i.heard("a", 900);
        // b is no longer heard (killed): it no longer counts after the TTL.
        assert_eq!(i.total(Refs, "k", 1_500, 1_000), 4);
        assert_eq!(i.others(Refs, "k", "a", 1_500, 1_000), 0);
        assert_eq!(i.expire(1_500, 1_000), ["b"]);
        i.record(Refs, "a", "k", 0);
        assert_eq!(i.total(Refs, "k", 1_600, 1_000), 0);
        // A covered name is not a reference on its name key.
        i.record(Covered, "a", "j", 1);
        assert_eq!(i.total(Refs, "j", 1_600, 1_000), 0);
        assert_eq!(i.total(Covered, "j", 1_600, 1_000), 1);
        assert_eq!(i.total(Refs, "missing", 0, 1), 0);
        // A replica never heard counts nothing.
        i.record(Refs, "ghost", "k", 7);
        assert_eq!(i.total(Refs, "k", 1_600, 1_000), 0);
    }

    #[test]
    fn refcounts_past_u64_saturate() {
        // Found by fuzzing (actors/tests/fuzz_parsers.rs): the sum overflowed.
        let mut i = Interest::default();
        i.heard("a", 0);
        i.heard("b", 0);
        i.record(Refs, "a", "t", u64::MAX);
        i.record(Refs, "b", "t", 2);
        assert_eq!(i.total(Refs, "t", 0, 10), u64::MAX);
        assert_eq!(i.others(Refs, "t", "a", 0, 10), 2);
    }

    #[test]
    fn the_group_index_counts_distinct_names_over_both_kinds_and_all_replicas() {
        let mut i = Interest::default();
        for r in ["a", "b"] {
            i.heard(r, 0);
        }
        // (step, kind, replica, token, n, names in the group after it)
        let steps = [
            (Refs, "a", NAME_X, 1, 1),
            (Covered, "b", NAME_X, 2, 1),
            (Refs, "b", NAME_Y, 1, 2),
            // A count that changes is not a new record.
            (Refs, "b", NAME_Y, 5, 2),
            (Refs, "a", NAME_X, 0, 2),
            (Covered, "b", NAME_X, 0, 1),
            // Withdrawing what was never recorded changes nothing.
            (Covered, "a", NAME_Y, 0, 1),
            // Namespace keys are nobody's members.
            (Refs, "a", "_.v1.secrets.ns.all._", 1, 1),
        ];
        for (n, (kind, r, token, count, names)) in steps.into_iter().enumerate() {
            i.record(kind, r, token, count);
            assert_eq!(i.group_len(GROUP), names, "step {n}");
        }
        let named = |t: &str| i.groups.get(GROUP).is_some_and(|g| g.contains_key(t));
        assert!(named(NAME_Y) && !named(NAME_X));
        i.forget("b");
        assert_eq!(i.group_len(GROUP), 0);
        assert!(i.groups.is_empty(), "{:?}", i.groups);
    }

    #[test]
    fn retain_records_drops_one_replicas_records_only() {
        let mut i = Interest::default();
        i.heard("a", 0);
        i.heard("b", 0);
        i.record(Refs, "a", NAME_X, 1);
        i.record(Refs, "b", NAME_X, 1);
        i.record(Covered, "a", NAME_Y, 1);
        i.retain_records("a", |kind, _| kind == Refs);
        assert_eq!(i.total(Refs, NAME_X, 0, 10), 2);
        assert_eq!(i.total(Covered, NAME_Y, 0, 10), 0);
        assert_eq!(i.group_len(GROUP), 1);
        let mut a: Vec<_> = i.records_of(Refs, "a").collect();
        a.sort();
        assert_eq!(a, [(NAME_X, 1)]);
    }
}
