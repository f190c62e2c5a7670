//! The true event history of the soak's namespace, recorded by a reference watch.
//!
//! The reference watch reads the API server's own storage: an etcd watch of
//! `/registry/configmaps/<ns>/`, the very stream the API server's watch cache is fed
//! from. A watch through the API server cannot be the reference in this soak, because
//! one of its faults kills the API server: the restarted server's watch cache starts at
//! etcd's current revision and answers 410 to a watch from any older one, so a
//! reference on it would have a hole exactly where kcache is under test. etcd is never
//! killed, and a watch that keeps up is not affected by compaction. etcd revisions *are*
//! the API server's resourceVersions: a creation (version 1) is an `ADDED` at its
//! mod_revision, a change a `MODIFIED`, a deletion a `DELETED` at the revision of the
//! delete — the resourceVersion the API server puts on a `DELETED` event.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Serialize;

use super::etcd::{Etcd, KeyEvent};

/// An event's type, as a watch reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub enum Kind {
    Added,
    Modified,
    Deleted,
}

impl Kind {
    /// Whether the object exists after an event of this kind.
    pub fn present(self) -> bool {
        self != Kind::Deleted
    }
}

/// One true event of an object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TrueEvent {
    pub rv: u64,
    pub kind: Kind,
    /// When the reference watch received it (ms since the soak began).
    pub at_ms: u64,
}

/// Every change to the namespace's ConfigMaps, per name, in resourceVersion order.
#[derive(Debug, Default)]
pub struct History {
    by_name: HashMap<String, Vec<TrueEvent>>,
    /// The highest revision recorded.
    pub last_rv: u64,
    pub events: usize,
}

impl History {
    pub fn record(&mut self, name: &str, rv: u64, kind: Kind, at_ms: u64) {
        let v = self.by_name.entry(name.to_string()).or_default();
        // etcd delivers in revision order; a repeat (a re-watch overlapping) is dropped.
        if v.last().is_some_and(|last| last.rv >= rv) {
            return;
        }
        v.push(TrueEvent { rv, kind, at_ms });
        self.last_rv = self.last_rv.max(rv);
        self.events += 1;
    }

    /// The events of `name` in resourceVersion order.
    pub fn of(&self, name: &str) -> &[TrueEvent] {
        self.by_name.get(name).map(Vec::as_slice).unwrap_or(&[])
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.by_name.keys().map(String::as_str)
    }

    /// The resourceVersion `name` had at revision `rv`, `None` if it did not exist.
    pub fn state_at(&self, name: &str, rv: u64) -> Option<u64> {
        let ev = self.of(name);
        let i = ev.partition_point(|e| e.rv <= rv);
        match i {
            0 => None,
            _ => {
                let e = ev[i - 1];
                e.kind.present().then_some(e.rv)
            }
        }
    }

    /// The type of the event of `name` at `rv`, if there is one.
    pub fn kind_at(&self, name: &str, rv: u64) -> Option<Kind> {
        let ev = self.of(name);
        ev.binary_search_by_key(&rv, |e| e.rv)
            .ok()
            .map(|i| ev[i].kind)
    }

    /// Events of `name` with `lo < rv <= hi`.
    pub fn between(&self, name: &str, lo: u64, hi: u64) -> &[TrueEvent] {
        let ev = self.of(name);
        let a = ev.partition_point(|e| e.rv <= lo);
        let b = ev.partition_point(|e| e.rv <= hi);
        &ev[a..b.max(a)]
    }

    /// name → resourceVersion of every object that exists after the last event.
    pub fn final_state(&self) -> BTreeMap<String, u64> {
        self.by_name
            .iter()
            .filter_map(|(name, ev)| {
                let e = ev.last()?;
                e.kind.present().then(|| (name.clone(), e.rv))
            })
            .collect()
    }
}

/// The reference watch, running: the history it has recorded, and why it stopped if it
/// did (then the soak cannot judge and says so).
#[derive(Clone)]
pub struct Truth {
    pub history: Arc<Mutex<History>>,
    pub broken: Arc<Mutex<Option<String>>>,
}

/// The etcd key prefix of the namespace's ConfigMaps (the API server's default
/// `--etcd-prefix=/registry`).
pub fn prefix(ns: &str) -> String {
    format!("/registry/configmaps/{ns}/")
}

impl Truth {
    /// Reads what exists now, then watches every change after it.
    pub async fn start(etcd: Etcd, ns: &str) -> Result<Truth, super::etcd::EtcdError> {
        let prefix = prefix(ns);
        let (start_rv, existing) = etcd.range_prefix(&prefix).await?;
        let mut history = History::default();
        for (key, rv) in existing {
            if let Some(name) = key.strip_prefix(&prefix) {
                history.record(name, rv, Kind::Added, 0);
            }
        }
        let truth = Truth {
            history: Arc::new(Mutex::new(history)),
            broken: Arc::new(Mutex::new(None)),
        };
        let t = truth.clone();
        tokio::spawn(async move {
            let mut from = start_rv + 1;
            loop {
                let h = t.history.clone();
                let p = prefix.clone();
                let mut last = from - 1;
                let r = etcd
                    .watch_prefix(&prefix, from, |ev: KeyEvent| {
                        let Some(name) = ev.key.strip_prefix(&p) else {
                            return;
                        };
                        let kind = match (ev.deleted, ev.version) {
                            (true, _) => Kind::Deleted,
                            (false, 1) => Kind::Added,
                            (false, _) => Kind::Modified,
                        };
                        last = last.max(ev.rev);
                        if let Ok(mut h) = h.lock() {
                            h.record(name, ev.rev, kind, super::observe::now_ms());
                        }
                    })
                    .await;
                from = last + 1;
                match r {
                    // The stream ended (etcd is never killed here, so a connection reset):
                    // resume after the last revision seen.
                    Ok(()) => {}
                    Err(super::etcd::EtcdError::Compacted(c)) => {
                        if let Ok(mut b) = t.broken.lock() {
                            *b = Some(format!(
                                "the reference watch was cut off and its history from revision {from} was compacted (at {c}): the truth has a hole"
                            ));
                        }
                        return;
                    }
                    Err(_) => {}
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        });
        Ok(truth)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> History {
        let mut h = History::default();
        h.record("a", 10, Kind::Added, 0);
        h.record("a", 12, Kind::Modified, 0);
        h.record("a", 15, Kind::Deleted, 0);
        h.record("a", 20, Kind::Added, 0);
        h.record("b", 11, Kind::Added, 0);
        h
    }

    #[test]
    fn state_at_follows_the_events() {
        let h = sample();
        assert_eq!(h.state_at("a", 9), None);
        assert_eq!(h.state_at("a", 10), Some(10));
        assert_eq!(h.state_at("a", 14), Some(12));
        assert_eq!(h.state_at("a", 15), None);
        assert_eq!(h.state_at("a", 25), Some(20));
        assert_eq!(h.state_at("zz", 25), None);
    }

    #[test]
    fn between_is_half_open() {
        let h = sample();
        let rvs: Vec<u64> = h.between("a", 10, 15).iter().map(|e| e.rv).collect();
        assert_eq!(rvs, vec![12, 15]);
        assert!(h.between("a", 30, 20).is_empty());
        assert_eq!(h.kind_at("a", 15), Some(Kind::Deleted));
        assert_eq!(h.kind_at("a", 13), None);
    }

    #[test]
    fn repeats_are_dropped_and_final_state_skips_deleted() {
        let mut h = sample();
        h.record("a", 12, Kind::Modified, 0);
        assert_eq!(h.events, 5);
        h.record("b", 30, Kind::Deleted, 0);
        let f = h.final_state();
        assert_eq!(f.get("a"), Some(&20));
        assert!(!f.contains_key("b"));
    }
}
