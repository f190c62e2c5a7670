//! The judge: one client's log ([`Obs`]) against the true history ([`History`]).
//!
//! A client's story is a first list at resourceVersion S0, then watch streams, and, after
//! a 410, relists. The judge replays it:
//!
//! - **lost**: every true event of the client's objects after S0 (up to the end of the
//!   run) must have been delivered as an event with its resourceVersion — or have been
//!   *replaced by a relist the client was forced into by a 410*: a relist at S whose
//!   content equals the truth at S replaces the client's unseen events up to S (counted
//!   as `replaced`, and the relist in `relists_forced`). A list whose content differs from
//!   the truth at its own resourceVersion replaces nothing; a wrong first list counts one
//!   lost event per object it got wrong.
//! - **duplicated**: an event the client had already been given: the same object at the
//!   same resourceVersion, by an event or a list.
//! - **went back**: an event older than what the client was already shown of that object,
//!   or not newer than the previous event of the same watch stream (a stream is in
//!   resourceVersion order, which is what lets a client resume from its last one); a
//!   relist showing an object older than the client had seen.
//! - **phantom**: an event that is not in the true history at all (no such change of
//!   that object at that resourceVersion, or an object outside the client's scope).
//! - **wrong type**: ADDED for a change that was a MODIFIED or the reverse (reported;
//!   a reflector cannot tell the two apart, and an informer treats both as upserts).
//!
//! Final state is compared elsewhere (`report`): the client's view against the API
//! server's after the writer stopped and things settled.

use std::collections::{BTreeSet, HashMap, HashSet};

use serde::Serialize;

use super::clients::Scope;
use super::observe::{Obs, SeenKind};
use super::truth::{History, Kind};

/// Findings kept per category and client as evidence; the counts are complete.
const EXAMPLES: usize = 20;

#[derive(Clone, Debug, Serialize)]
pub struct Finding {
    pub client: String,
    pub object: String,
    pub rv: u64,
    /// When it happened: the client's observation, or for a lost event when the
    /// reference watch saw it (ms since the soak began).
    pub at_ms: u64,
    pub detail: String,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct Verdict {
    pub client: String,
    pub home: String,
    /// False if the client never completed a first list (all its events count as lost).
    pub started: bool,
    pub start_rv: u64,
    /// True events the client had to account for.
    pub judged: usize,
    pub seen: usize,
    pub replaced: usize,
    pub delivered: usize,
    pub relists_forced: usize,
    /// Relists with no 410 before them (a client only relists after one).
    pub relists_unforced: usize,
    pub gone: usize,
    pub errors: usize,
    pub lost: usize,
    /// Lost events after which the client was shown a newer state of the object (the
    /// change was skipped, not the object forgotten).
    pub lost_superseded: usize,
    pub duplicated: usize,
    pub went_back: usize,
    pub phantom: usize,
    pub wrong_type: usize,
    pub examples: Vec<(String, Finding)>,
}

impl Verdict {
    fn note(&mut self, category: &str, f: Finding) {
        let n = self.examples.iter().filter(|(c, _)| c == category).count();
        if n < EXAMPLES {
            self.examples.push((category.to_string(), f));
        }
    }
}

fn kind_name(k: Kind) -> &'static str {
    match k {
        Kind::Added => "ADDED",
        Kind::Modified => "MODIFIED",
        Kind::Deleted => "DELETED",
    }
}

fn seen_name(k: SeenKind) -> &'static str {
    match k {
        SeenKind::Added => "ADDED",
        SeenKind::Modified => "MODIFIED",
        SeenKind::Applied => "ADDED/MODIFIED",
        SeenKind::Deleted => "DELETED",
    }
}

struct Replay<'a> {
    h: &'a History,
    scope: &'a Scope,
    v: Verdict,
    /// The client's position: its last list's resourceVersion or newest event.
    pos: Option<u64>,
    seen: HashSet<(String, u64)>,
    replaced: HashSet<(String, u64)>,
    /// The newest resourceVersion the client was shown of each object.
    shown: HashMap<String, u64>,
    /// The current watch stream's resourceVersion (its start, then its last event).
    stream_last: u64,
    gone_pending: bool,
}

impl Replay<'_> {
    fn names(&self, extra: impl Iterator<Item = String>) -> BTreeSet<String> {
        match self.scope {
            Scope::Name(n) => BTreeSet::from([n.clone()]),
            Scope::Namespace => self.h.names().map(str::to_string).chain(extra).collect(),
        }
    }

    fn finding(&self, object: &str, rv: u64, at_ms: u64, detail: String) -> Finding {
        Finding {
            client: self.v.client.clone(),
            object: object.to_string(),
            rv,
            at_ms,
            detail,
        }
    }

    fn list(&mut self, s: u64, items: &[(String, u64)], at_ms: u64) {
        let listed: HashMap<&str, u64> = items.iter().map(|(n, r)| (n.as_str(), *r)).collect();
        for (n, r) in items {
            if !self.scope.covers(n) {
                self.v.phantom += 1;
                let f = self.finding(
                    n,
                    *r,
                    at_ms,
                    format!("list at {s} holds an object outside the client's scope"),
                );
                self.v.note("phantom", f);
            }
        }
        let names = self.names(items.iter().map(|(n, _)| n.clone()));
        match self.pos {
            None => {
                self.v.started = true;
                self.v.start_rv = s;
                for name in &names {
                    let truth = self.h.state_at(name, s);
                    let got = listed.get(name.as_str()).copied();
                    if got != truth {
                        // The client starts from a state that never existed at S.
                        self.v.judged += 1;
                        self.v.lost += 1;
                        let f = self.finding(name, s, at_ms, format!(
                            "first list at {s} shows {name} at {got:?}; the truth at {s} is {truth:?}"
                        ));
                        self.v.note("lost", f);
                    }
                }
            }
            Some(pos) => {
                if self.gone_pending {
                    self.v.relists_forced += 1;
                } else {
                    self.v.relists_unforced += 1;
                }
                for name in &names {
                    let truth = self.h.state_at(name, s);
                    let got = listed.get(name.as_str()).copied();
                    let unseen: Vec<u64> = self
                        .h
                        .between(name, pos, s)
                        .iter()
                        .map(|e| e.rv)
                        .filter(|rv| !self.seen.contains(&(name.clone(), *rv)))
                        .collect();
                    if got == truth {
                        for rv in unseen {
                            self.replaced.insert((name.clone(), rv));
                        }
                    } else if unseen.is_empty() {
                        // Nothing to lose, yet the list contradicts its resourceVersion
                        // against what the client already had.
                        self.v.went_back += 1;
                        let f = self.finding(name, s, at_ms, format!(
                            "relist at {s} shows {name} at {got:?}; the truth at {s} is {truth:?}, which the client had already been shown"
                        ));
                        self.v.note("went_back", f);
                    }
                    // else: the unseen events stay unseen and count as lost at the end.
                }
            }
        }
        for (n, r) in items {
            let prev = self.shown.get(n).copied().unwrap_or(0);
            if *r < prev {
                self.v.went_back += 1;
                let f = self.finding(
                    n,
                    *r,
                    at_ms,
                    format!("list at {s} shows {n} at {r}, older than the {prev} the client had"),
                );
                self.v.note("went_back", f);
            }
            self.shown.insert(n.clone(), prev.max(*r));
        }
        self.gone_pending = false;
        self.pos = Some(s);
        self.stream_last = s;
    }

    fn event(&mut self, kind: SeenKind, name: &str, rv: u64, at_ms: u64) {
        self.v.delivered += 1;
        if !self.scope.covers(name) {
            self.v.phantom += 1;
            let f = self.finding(
                name,
                rv,
                at_ms,
                "event for an object outside the client's scope".into(),
            );
            self.v.note("phantom", f);
            return;
        }
        let key = (name.to_string(), rv);
        let prev = self.shown.get(name).copied();
        if self.seen.contains(&key) || prev == Some(rv) {
            self.v.duplicated += 1;
            let f = self.finding(
                name,
                rv,
                at_ms,
                format!("{} {name} at {rv} again", seen_name(kind)),
            );
            self.v.note("duplicated", f);
            return;
        }
        if let Some(p) = prev.filter(|p| rv < *p) {
            self.v.went_back += 1;
            let f = self.finding(
                name,
                rv,
                at_ms,
                format!(
                    "{} {name} at {rv} after the client had been shown {name} at {p}",
                    seen_name(kind)
                ),
            );
            self.v.note("went_back", f);
        } else if rv <= self.stream_last {
            self.v.went_back += 1;
            let f = self.finding(
                name,
                rv,
                at_ms,
                format!(
                    "{} {name} at {rv} in a watch stream already at {}",
                    seen_name(kind),
                    self.stream_last
                ),
            );
            self.v.note("went_back", f);
        }
        match self.h.kind_at(name, rv) {
            None => {
                self.v.phantom += 1;
                let f = self.finding(name, rv, at_ms, format!(
                    "{} {name} at {rv}: no such change in the true history (the truth at {rv}: {:?})",
                    seen_name(kind),
                    self.h.state_at(name, rv)
                ));
                self.v.note("phantom", f);
            }
            Some(truth) => {
                let fits = matches!(
                    (kind, truth),
                    (SeenKind::Added, Kind::Added)
                        | (SeenKind::Modified, Kind::Modified)
                        | (SeenKind::Applied, Kind::Added | Kind::Modified)
                        | (SeenKind::Deleted, Kind::Deleted)
                );
                let present_fits = (kind == SeenKind::Deleted) == (truth == Kind::Deleted);
                if !present_fits {
                    self.v.phantom += 1;
                    let f = self.finding(
                        name,
                        rv,
                        at_ms,
                        format!(
                            "{} {name} at {rv}, but that change was a {}",
                            seen_name(kind),
                            kind_name(truth)
                        ),
                    );
                    self.v.note("phantom", f);
                } else if !fits {
                    self.v.wrong_type += 1;
                    let f = self.finding(
                        name,
                        rv,
                        at_ms,
                        format!(
                            "{} {name} at {rv}, but that change was a {}",
                            seen_name(kind),
                            kind_name(truth)
                        ),
                    );
                    self.v.note("wrong_type", f);
                }
                self.seen.insert(key);
            }
        }
        self.shown
            .insert(name.to_string(), prev.unwrap_or(0).max(rv));
        self.stream_last = self.stream_last.max(rv);
        self.pos = Some(self.pos.unwrap_or(0).max(rv));
    }
}

/// What the client next saw of `name` after `rv`, for a lost event's evidence.
fn next_sight(log: &[Obs], name: &str, rv: u64) -> String {
    for o in log {
        match o {
            Obs::Event {
                at_ms,
                kind,
                name: n,
                rv: r,
            } if n == name && *r > rv => {
                return format!("next seen: {} at {r} (t={at_ms} ms)", seen_name(*kind));
            }
            Obs::Listed {
                at_ms,
                items,
                rv: lrv,
            } => {
                if let Some((_, r)) = items.iter().find(|(n, r)| n == name && *r > rv) {
                    return format!("next seen: in a list (list rv {lrv:?}) at {r} (t={at_ms} ms)");
                }
            }
            _ => {}
        }
    }
    "never seen again".into()
}

/// Judges one client. `end_rv`: the truth's last revision when the run ended.
pub fn judge(
    h: &History,
    scope: &Scope,
    client: &str,
    home: &str,
    log: &[Obs],
    end_rv: u64,
) -> Verdict {
    let mut r = Replay {
        h,
        scope,
        v: Verdict {
            client: client.to_string(),
            home: home.to_string(),
            ..Verdict::default()
        },
        pos: None,
        seen: HashSet::new(),
        replaced: HashSet::new(),
        shown: HashMap::new(),
        stream_last: 0,
        gone_pending: false,
    };
    let mut pending: Option<(u64, &[(String, u64)])> = None;
    for o in log {
        match o {
            Obs::Gone { .. } => {
                r.v.gone += 1;
                r.gone_pending = true;
            }
            Obs::Error { .. } => r.v.errors += 1,
            Obs::Listed {
                at_ms,
                rv: Some(s),
                items,
            } => r.list(*s, items, *at_ms),
            Obs::Listed {
                at_ms,
                rv: None,
                items,
            } => pending = Some((*at_ms, items)),
            Obs::Watch { from, status, .. } => {
                // kube-rs's watcher watches from its list's resourceVersion: the first
                // watch after a list says what that list's resourceVersion was.
                if let Some((at, items)) = pending.take() {
                    r.list(*from, items, at);
                }
                if *status == 200 {
                    r.stream_last = *from;
                }
            }
            Obs::Event {
                at_ms,
                kind,
                name,
                rv,
            } => r.event(*kind, name, *rv, *at_ms),
        }
    }
    let start = match r.pos {
        Some(_) => r.v.start_rv,
        None => 0,
    };
    let names = r.names(r.shown.keys().cloned().collect::<Vec<_>>().into_iter());
    for name in &names {
        for e in h.between(name, start, end_rv) {
            r.v.judged += 1;
            let key = (name.clone(), e.rv);
            if r.seen.contains(&key) {
                r.v.seen += 1;
            } else if r.replaced.contains(&key) {
                r.v.replaced += 1;
            } else {
                r.v.lost += 1;
                let superseded = r.shown.get(name).is_some_and(|s| *s > e.rv);
                if superseded {
                    r.v.lost_superseded += 1;
                }
                if r.v.examples.iter().filter(|(c, _)| c == "lost").count() < EXAMPLES {
                    let f = r.finding(
                        name,
                        e.rv,
                        e.at_ms,
                        format!(
                            "{} {name} at {} (written t={} ms) never delivered; {}",
                            kind_name(e.kind),
                            e.rv,
                            e.at_ms,
                            next_sight(log, name, e.rv)
                        ),
                    );
                    r.v.note("lost", f);
                }
            }
        }
    }
    r.v
}

#[cfg(test)]
mod tests {
    use super::*;

    fn truth() -> History {
        let mut h = History::default();
        h.record("a", 10, Kind::Added, 0);
        h.record("b", 11, Kind::Added, 0);
        h.record("a", 12, Kind::Modified, 0);
        h.record("b", 13, Kind::Deleted, 0);
        h.record("a", 14, Kind::Modified, 0);
        h
    }

    fn listed(rv: Option<u64>, items: &[(&str, u64)]) -> Obs {
        Obs::Listed {
            at_ms: 0,
            rv,
            items: items.iter().map(|(n, r)| (n.to_string(), *r)).collect(),
        }
    }

    fn ev(kind: SeenKind, name: &str, rv: u64) -> Obs {
        Obs::Event {
            at_ms: 0,
            kind,
            name: name.into(),
            rv,
        }
    }

    fn watch(from: u64) -> Obs {
        Obs::Watch {
            at_ms: 0,
            from,
            replica: "r0".into(),
            status: 200,
        }
    }

    #[test]
    fn a_complete_stream_is_clean() {
        let log = vec![
            listed(None, &[("a", 10), ("b", 11)]),
            watch(11),
            ev(SeenKind::Applied, "a", 12),
            ev(SeenKind::Deleted, "b", 13),
            ev(SeenKind::Applied, "a", 14),
        ];
        let v = judge(&truth(), &Scope::Namespace, "c", "r0", &log, 14);
        assert_eq!((v.judged, v.seen, v.lost), (3, 3, 0));
        assert_eq!((v.duplicated, v.went_back, v.phantom), (0, 0, 0));
        assert_eq!(v.start_rv, 11);
    }

    #[test]
    fn a_missing_event_is_lost_and_a_repeat_duplicated() {
        let log = vec![
            listed(Some(11), &[("a", 10), ("b", 11)]),
            ev(SeenKind::Modified, "a", 12),
            ev(SeenKind::Modified, "a", 12),
            ev(SeenKind::Modified, "a", 14),
        ];
        let v = judge(&truth(), &Scope::Namespace, "c", "r0", &log, 14);
        assert_eq!((v.lost, v.duplicated), (1, 1));
        assert_eq!(v.lost_superseded, 0);
    }

    #[test]
    fn a_forced_relist_replaces_what_it_covers() {
        let log = vec![
            listed(Some(11), &[("a", 10), ("b", 11)]),
            Obs::Gone {
                at_ms: 0,
                how: "410".into(),
            },
            listed(Some(13), &[("a", 12)]),
            ev(SeenKind::Modified, "a", 14),
        ];
        let v = judge(&truth(), &Scope::Namespace, "c", "r0", &log, 14);
        assert_eq!((v.lost, v.replaced, v.relists_forced), (0, 2, 1));
    }

    #[test]
    fn a_stale_relist_replaces_nothing() {
        let log = vec![
            listed(Some(11), &[("a", 10), ("b", 11)]),
            Obs::Gone {
                at_ms: 0,
                how: "410".into(),
            },
            // Claims 13 but still holds b, deleted at 13.
            listed(Some(13), &[("a", 12), ("b", 11)]),
            ev(SeenKind::Modified, "a", 14),
        ];
        let v = judge(&truth(), &Scope::Namespace, "c", "r0", &log, 14);
        assert_eq!((v.lost, v.replaced), (1, 1));
    }

    #[test]
    fn going_back_and_phantoms_are_caught() {
        let log = vec![
            listed(Some(11), &[("a", 10), ("b", 11)]),
            ev(SeenKind::Modified, "a", 14),
            ev(SeenKind::Modified, "a", 12),
            ev(SeenKind::Deleted, "b", 15),
        ];
        let v = judge(&truth(), &Scope::Namespace, "c", "r0", &log, 14);
        assert_eq!(v.went_back, 1);
        assert_eq!(v.phantom, 1);
        // b's deletion at 13 was never delivered (the client got one at 15 instead).
        assert_eq!(v.lost, 1);
        assert_eq!(v.lost_superseded, 1);
    }

    #[test]
    fn a_single_object_client_is_judged_on_its_object() {
        let log = vec![
            listed(Some(10), &[("a", 10)]),
            watch(10),
            ev(SeenKind::Modified, "a", 12),
            ev(SeenKind::Modified, "a", 14),
        ];
        let v = judge(&truth(), &Scope::Name("a".into()), "c", "r0", &log, 14);
        assert_eq!((v.judged, v.seen, v.lost, v.wrong_type), (2, 2, 0, 0));
    }

    #[test]
    fn a_client_that_never_listed_lost_everything() {
        let v = judge(&truth(), &Scope::Name("a".into()), "c", "r0", &[], 14);
        assert!(!v.started);
        assert_eq!(v.lost, 3);
    }
}
