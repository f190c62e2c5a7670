//! Whether a key's state is at least as new as the upstream's at a given moment: the
//! freshness proof behind consistent reads (a list or streaming list with the
//! resourceVersion omitted) served from the cache.
//!
//! The reference API server proves its watch cache fresh with etcd's progress
//! notifications (`waitUntilFreshAndBlock` after `GetCurrentResourceVersion`). kcache has no
//! such signal one level up: upstream bookmarks come about once a minute and cannot be
//! asked for, and the global resourceVersion moves with writes to other resources, so a
//! quiet key never "reaches" it. The proof instead asks the upstream, after the request
//! arrived, for a consistent read of the key — a metadata-only list with the key's
//! selectors, at most one page (`R` its resourceVersion) — and then:
//!
//! - the key has progressed to `R` or past it: fresh;
//! - the page held the whole key (`Seen::Whole`): the key's objects at its own progress
//!   `r < R` are exactly the upstream's at `R` (same namespace, name, UID and
//!   resourceVersion each) — nothing it holds changed between `r` and `R`: any write gives
//!   an object a new resourceVersion, a re-creation a new UID — so its state is the state
//!   at `R`: fresh; otherwise the events it lacks are at most `R`, already in the
//!   upstream's cache and on their way: wait for its progress to reach `R` (bounded; past
//!   the bound the request goes to the API server);
//! - the key is larger than the page: a short watch of the key from its progress `r`
//!   (`Tail`) lists the key's events after `r` until a bookmark at or past `R` — or an
//!   event past `R` — says the upstream sent every event up to `R`. The upstream's cache
//!   was as new as `R` when it answered the list, and a watch sends events in order, so
//!   the key's state at `R` is its state at the last of those events at most `R` (or at
//!   `r` if there is none): wait for the key's progress to reach that (`Seen::SameAs`).
//!   The upstream reads none of the key's objects; the price is the bookmark's wait (the
//!   reference cacher sends one two seconds before a watch's deadline, on its one-second
//!   tick — and only at an RV past the watch's start, which is why the watch is opened
//!   before the read that gives `R`, and why a tail may end without a word: the caller
//!   then lists the key whole).

use thiserror::Error;

#[derive(Debug, Error, PartialEq, Eq)]
pub enum Error {
    /// The upstream's answer to the probe is not a list kcache can read.
    #[error("unreadable freshness probe answer: {0}")]
    Unreadable(String),
    /// A tail watch sent what no watch from the key's progress sends: no proof.
    #[error("tail watch from resourceVersion {from} sent {what}")]
    Unordered { from: u64, what: String },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What identifies an object's version: namespace, name, UID, resourceVersion.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Version {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub rv: u64,
}

/// What the upstream said of a key at `rv`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Probe {
    pub rv: u64,
    pub seen: Seen,
}

/// What a probe learned of the key's state at its resourceVersion.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Seen {
    /// Every object, sorted: the key fit in the probe's page.
    Whole(Vec<Version>),
    /// The key holds more than the page: only a watch of its events can tell (`Tail`).
    Partial,
    /// The key's state at the probe's RV is its state at this RV (a `Tail` said so).
    SameAs(u64),
}

impl Probe {
    /// Reads a `PartialObjectMetadataList` (or any list: only `metadata` is read); one
    /// that says more follow (`continue`) is `Seen::Partial`.
    pub fn from_list_json(body: &[u8]) -> Result<Probe> {
        #[derive(serde::Deserialize)]
        struct List {
            metadata: ListMeta,
            #[serde(default)]
            items: Option<Vec<Item>>,
        }
        #[derive(serde::Deserialize)]
        struct ListMeta {
            #[serde(rename = "resourceVersion", default)]
            resource_version: String,
            #[serde(rename = "continue", default)]
            continue_token: String,
        }
        #[derive(serde::Deserialize)]
        struct Item {
            metadata: ItemMeta,
        }
        #[derive(serde::Deserialize)]
        struct ItemMeta {
            #[serde(default)]
            namespace: String,
            #[serde(default)]
            name: String,
            #[serde(default)]
            uid: String,
            #[serde(rename = "resourceVersion", default)]
            resource_version: String,
        }
        let list: List =
            serde_json::from_slice(body).map_err(|e| Error::Unreadable(e.to_string()))?;
        let rv = |s: &str| {
            s.parse::<u64>()
                .map_err(|_| Error::Unreadable(format!("resourceVersion {s:?}")))
        };
        let probe_rv = rv(&list.metadata.resource_version)?;
        if !list.metadata.continue_token.is_empty() {
            return Ok(Probe {
                rv: probe_rv,
                seen: Seen::Partial,
            });
        }
        let mut objects = list
            .items
            .unwrap_or_default()
            .into_iter()
            .map(|i| {
                Ok(Version {
                    rv: rv(&i.metadata.resource_version)?,
                    namespace: i.metadata.namespace,
                    name: i.metadata.name,
                    uid: i.metadata.uid,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        objects.sort_unstable();
        Ok(Probe {
            rv: probe_rv,
            seen: Seen::Whole(objects),
        })
    }
}

/// The verdict on a key against a probe.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The key's state is the upstream's at the probe's RV or newer: serve.
    Fresh,
    /// The key lacks events up to this RV: wait until its progress reaches it.
    WaitFor(u64),
}

/// Judges a key at progress `key_rv` against `probe`; `key_objects` (any order) are read
/// only where the probe saw the whole key.
pub fn judge(key_rv: u64, key_objects: impl FnOnce() -> Vec<Version>, probe: &Probe) -> Verdict {
    if key_rv >= probe.rv {
        return Verdict::Fresh;
    }
    match &probe.seen {
        Seen::Whole(objects) => {
            let mut key_objects = key_objects();
            key_objects.sort_unstable();
            if &key_objects == objects {
                Verdict::Fresh
            } else {
                Verdict::WaitFor(probe.rv)
            }
        }
        Seen::SameAs(at) if key_rv >= *at => Verdict::Fresh,
        Seen::SameAs(at) => Verdict::WaitFor(*at),
        // Nothing known in between: only the probe's own RV is safe.
        Seen::Partial => Verdict::WaitFor(probe.rv),
    }
}

/// One event of a short watch of a key (`Tail`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TailEvent {
    /// An object's change at this RV.
    Change(u64),
    Bookmark(u64),
}

/// Reads a watch of a key from its progress `from` until it says what the key's state at
/// `until` is (module docs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tail {
    from: u64,
    until: u64,
    last: Option<u64>,
}

impl Tail {
    pub fn new(from: u64, until: u64) -> Tail {
        Tail {
            from,
            until,
            last: None,
        }
    }

    /// `Some(at)` once the watch has said all: the key's state at `until` is its state at
    /// `at`; `None`: read on. An event at or before the watch's start, or an RV of 0,
    /// is no proof of anything (an upstream that sends it is not the one reasoned about).
    pub fn step(&mut self, event: TailEvent) -> Result<Option<u64>> {
        let unordered = |what: String| Error::Unordered {
            from: self.from,
            what,
        };
        Ok(match event {
            TailEvent::Change(rv) if rv <= self.from => {
                return Err(unordered(format!("a change at resourceVersion {rv}")))
            }
            TailEvent::Bookmark(0) => {
                return Err(unordered("a bookmark without a resourceVersion".into()))
            }
            // Events come in order: one past `until` means every one up to it came.
            TailEvent::Change(rv) if rv > self.until => Some(self.at()),
            TailEvent::Change(rv) => {
                self.last = Some(self.last.map_or(rv, |last| last.max(rv)));
                (rv == self.until).then(|| self.at())
            }
            TailEvent::Bookmark(rv) if rv >= self.until => Some(self.at()),
            TailEvent::Bookmark(_) => None,
        })
    }

    fn at(&self) -> u64 {
        self.last.map_or(self.from, |last| last.max(self.from))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(name: &str, uid: &str, rv: u64) -> Version {
        Version {
            namespace: "ns".into(),
            name: name.into(),
            uid: uid.into(),
            rv,
        }
    }

    #[test]
    fn verdicts() {
        let probe = Probe {
            rv: 50,
            seen: Seen::Whole(vec![v("a", "u1", 10), v("b", "u2", 20)]),
        };
        let cases = [
            // Progressed to the probe's RV or past it: fresh whatever it holds.
            (50, vec![], Verdict::Fresh),
            (60, vec![v("a", "u1", 55)], Verdict::Fresh),
            // Same objects, same versions, any order: nothing changed up to 50.
            (20, vec![v("b", "u2", 20), v("a", "u1", 10)], Verdict::Fresh),
            // An update it has not seen yet.
            (
                20,
                vec![v("a", "u1", 10), v("b", "u2", 15)],
                Verdict::WaitFor(50),
            ),
            // A creation it has not seen yet.
            (20, vec![v("a", "u1", 10)], Verdict::WaitFor(50)),
            // A deletion it has not seen yet (a deleted Secret must not stay readable).
            (
                20,
                vec![v("a", "u1", 10), v("b", "u2", 20), v("c", "u3", 18)],
                Verdict::WaitFor(50),
            ),
            // Deleted and re-created under the same name, even at an equal RV number.
            (
                20,
                vec![v("a", "u0", 10), v("b", "u2", 20)],
                Verdict::WaitFor(50),
            ),
        ];
        for (key_rv, objects, want) in cases {
            assert_eq!(
                judge(key_rv, || objects.clone(), &probe),
                want,
                "{key_rv} {objects:?}"
            );
        }
        // A key larger than the probe's page: what a tail said, never its objects.
        let unread = || -> Vec<Version> { panic!("a partial probe reads no objects") };
        let same_as = |at| Probe {
            rv: 50,
            seen: Seen::SameAs(at),
        };
        let partial = Probe {
            rv: 50,
            seen: Seen::Partial,
        };
        let cases = [
            (60, same_as(30), Verdict::Fresh),
            (30, same_as(30), Verdict::Fresh),
            (35, same_as(30), Verdict::Fresh),
            (20, same_as(30), Verdict::WaitFor(30)),
            (50, partial.clone(), Verdict::Fresh),
            (20, partial, Verdict::WaitFor(50)),
        ];
        for (key_rv, probe, want) in cases {
            assert_eq!(judge(key_rv, unread, &probe), want, "{key_rv} {probe:?}");
        }
    }

    #[test]
    fn a_tail_ends_when_the_upstream_has_sent_every_event_up_to_the_probe() {
        use TailEvent::{Bookmark, Change};
        /// The step that ends a tail, and its answer.
        type End = Option<(usize, u64)>;
        // (from, until, events, end)
        let cases: Vec<(u64, u64, Vec<TailEvent>, End)> = vec![
            // No event of the key in between: its state at 50 is its state at 20.
            (20, 50, vec![Bookmark(50)], Some((0, 20))),
            (20, 50, vec![Bookmark(70)], Some((0, 20))),
            // A bookmark short of the probe says nothing yet.
            (20, 50, vec![Bookmark(40)], None),
            (20, 50, vec![Bookmark(40), Bookmark(55)], Some((1, 20))),
            // Events up to the probe: the state at the last of them.
            (
                20,
                50,
                vec![Change(30), Change(45), Bookmark(50)],
                Some((2, 45)),
            ),
            // One at the probe's RV ends it (RVs are unique and ordered).
            (20, 50, vec![Change(30), Change(50)], Some((1, 50))),
            // One past it: every event up to it came before.
            (20, 50, vec![Change(30), Change(60)], Some((1, 30))),
            (20, 50, vec![Change(60)], Some((0, 20))),
            // Events and no bookmark yet: read on.
            (20, 50, vec![Change(30), Change(45)], None),
        ];
        for (from, until, events, want) in cases {
            let mut tail = Tail::new(from, until);
            let got = events
                .iter()
                .enumerate()
                .find_map(|(i, e)| tail.step(*e).expect("an ordered watch").map(|at| (i, at)));
            assert_eq!(got, want, "{from} {until} {events:?}");
        }
        // What no watch from the key's progress sends ends the tail without a proof.
        for bad in [Change(20), Change(5), Change(0), Bookmark(0)] {
            assert!(
                Tail::new(20, 50).step(bad).is_err(),
                "{bad:?} after a watch from 20"
            );
        }
    }

    #[test]
    fn probe_reads_a_metadata_list() {
        let body = br#"{"kind":"PartialObjectMetadataList","apiVersion":"meta.k8s.io/v1","metadata":{"resourceVersion":"812"},"items":[
            {"kind":"PartialObjectMetadata","metadata":{"name":"b","namespace":"ns","uid":"u2","resourceVersion":"20","labels":{"x":"y"}}},
            {"metadata":{"name":"a","namespace":"ns","uid":"u1","resourceVersion":"10"}}]}"#;
        let p = Probe::from_list_json(body).expect("parses");
        assert_eq!(p.rv, 812);
        assert_eq!(
            p.seen,
            Seen::Whole(vec![v("a", "u1", 10), v("b", "u2", 20)])
        );
        let empty = Probe::from_list_json(br#"{"metadata":{"resourceVersion":"9"},"items":null}"#)
            .expect("parses");
        assert_eq!(
            empty,
            Probe {
                rv: 9,
                seen: Seen::Whole(vec![])
            }
        );
        // One page of more: the rest is for a tail to tell.
        let page = Probe::from_list_json(
            br#"{"metadata":{"resourceVersion":"9","continue":"abc","remainingItemCount":4},"items":[{"metadata":{"name":"a","resourceVersion":"3"}}]}"#,
        )
        .expect("parses");
        assert_eq!(
            page,
            Probe {
                rv: 9,
                seen: Seen::Partial
            }
        );
        for bad in [
            &br#"{"metadata":{"resourceVersion":"x"}}"#[..],
            br#"{"metadata":{"resourceVersion":"9"},"items":[{"metadata":{"name":"a","resourceVersion":""}}]}"#,
            br#"not json"#,
        ] {
            assert!(Probe::from_list_json(bad).is_err());
        }
    }
}
