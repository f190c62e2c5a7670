//! The registry's references as plain data: which keys run, how many references each
//! holds (its own requests', and those of the keys it covers or serves coalesced, by the
//! key asked), who started it (the key budgets `cache.max_keys` and
//! `cache.max_keys_per_user`), and when a key whose last reference went may stop — after
//! its grace period, unless a reference came back meanwhile or the caller keeps it (a
//! fleet owner other replicas still need). The Registry actor keeps each key's actor and
//! status beside its count (`T`) and carries out the starts and stops this table names.
//! In a fleet it also says which counts changed since it was last asked
//! ([`Refs::take_changes`]): the fleet hears only those.

use std::collections::{HashMap, HashSet};

use thiserror::Error;

use super::key::Key;

/// A request would start a key past `cache.max_keys` or `cache.max_keys_per_user`.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum Error {
    #[error("too many cached keys on this replica (limit {limit})")]
    TooManyKeys { limit: usize },
    #[error("too many cached keys started by user {user:?} (limit {limit})")]
    TooManyKeysForUser { user: String, limit: usize },
}

/// The key budgets; 0 is no limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Limits {
    pub max_keys: usize,
    pub max_keys_per_user: usize,
}

/// One running key.
#[derive(Debug)]
pub struct Entry<T> {
    /// The actor's side of the key (its address and status).
    pub value: T,
    pub refs: usize,
    /// References taken for requests of other keys this one serves, by the key asked
    /// for: included in `refs`.
    pub covering: HashMap<Key, usize>,
    /// The user whose request started the key: it counts against their budget until the
    /// key stops.
    creator: Option<String>,
    /// Bumped on every reference taken and on every release to zero, so a grace period
    /// that began before either ends with nothing to do.
    generation: u64,
}

/// What a release leaves to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Released {
    /// The key is not running (already stopped).
    Unknown,
    /// Other references remain.
    Held,
    /// The last reference went: the key stops after its grace period, when
    /// [`Refs::grace_over`] is called with this generation.
    Idle { generation: u64 },
}

/// How a key's grace period ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Grace<T> {
    /// A reference came back (or the key already stopped): nothing to do.
    Nothing,
    /// The caller keeps it: wait another grace period.
    Again,
    /// The key is gone from the table: stop it.
    Stop(T),
}

#[derive(Debug)]
pub struct Refs<T> {
    limits: Limits,
    entries: HashMap<Key, Entry<T>>,
    by_user: HashMap<String, usize>,
    /// Requests of each asked key that other keys serve: the sum of their `covering`.
    covered: HashMap<Key, usize>,
    /// With [`Refs::track_changes`]: the keys whose `refs`, and the asked keys whose
    /// covered count, changed since [`Refs::take_changes`].
    changes: Option<(HashSet<Key>, HashSet<Key>)>,
}

/// The counts that changed since they were last taken, as they are now (0: gone).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Changes {
    pub refs: Vec<(Key, usize)>,
    pub covered: Vec<(Key, usize)>,
}

impl<T> Refs<T> {
    pub fn new(limits: Limits) -> Self {
        Refs {
            limits,
            entries: HashMap::new(),
            by_user: HashMap::new(),
            covered: HashMap::new(),
            changes: None,
        }
    }

    /// Remembers which counts change from now on, for [`Refs::take_changes`] (a fleet
    /// replica: without one nobody takes them, and they are not kept).
    pub fn track_changes(&mut self) {
        self.changes.get_or_insert_with(Default::default);
    }

    /// The counts changed since the last call, as they are now: each key's references,
    /// and each asked key's requests that other keys serve.
    pub fn take_changes(&mut self) -> Changes {
        let Some((refs, covered)) = &mut self.changes else {
            return Changes::default();
        };
        let (refs, covered) = (std::mem::take(refs), std::mem::take(covered));
        Changes {
            refs: refs
                .into_iter()
                .map(|k| {
                    let n = self.entries.get(&k).map_or(0, |e| e.refs);
                    (k, n)
                })
                .collect(),
            covered: covered
                .into_iter()
                .map(|k| {
                    let n = self.covered.get(&k).copied().unwrap_or(0);
                    (k, n)
                })
                .collect(),
        }
    }

    /// Every asked key's requests that other keys serve (a full table of the fleet's).
    pub fn covered_counts(&self) -> impl Iterator<Item = (&Key, usize)> {
        self.covered.iter().map(|(k, n)| (k, *n))
    }

    fn changed(&mut self, key: &Key, covered: Option<&Key>) {
        if let Some((refs, asked)) = &mut self.changes {
            if !refs.contains(key) {
                refs.insert(key.clone());
            }
            if let Some(a) = covered.filter(|a| !asked.contains(*a)) {
                asked.insert(a.clone());
            }
        }
    }

    /// Adds (`up`) or takes `by` requests of `asked` served by another key.
    fn count_covered(&mut self, asked: &Key, by: usize, up: bool) {
        if up {
            *self.covered.entry(asked.clone()).or_default() += by;
        } else if let Some(n) = self.covered.get_mut(asked) {
            *n = n.saturating_sub(by);
            if *n == 0 {
                self.covered.remove(asked);
            }
        }
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn get(&self, key: &Key) -> Option<&Entry<T>> {
        self.entries.get(key)
    }

    /// The actor's side of `key`, to change (never its references: those change by
    /// acquiring and releasing).
    pub fn get_mut(&mut self, key: &Key) -> Option<&mut T> {
        self.entries.get_mut(key).map(|e| &mut e.value)
    }

    pub fn contains(&self, key: &Key) -> bool {
        self.entries.contains_key(key)
    }

    pub fn iter(&self) -> impl Iterator<Item = (&Key, &Entry<T>)> {
        self.entries.iter()
    }

    pub fn values(&self) -> impl Iterator<Item = &Entry<T>> {
        self.entries.values()
    }

    /// Whether one more key may start, for `user` when given.
    pub fn admit(&self, user: Option<&str>) -> Result<(), Error> {
        let l = self.limits;
        if l.max_keys > 0 && self.entries.len() >= l.max_keys {
            return Err(Error::TooManyKeys { limit: l.max_keys });
        }
        if let Some(user) = user {
            let held = self.by_user.get(user).copied().unwrap_or(0);
            if l.max_keys_per_user > 0 && held >= l.max_keys_per_user {
                return Err(Error::TooManyKeysForUser {
                    user: user.to_string(),
                    limit: l.max_keys_per_user,
                });
            }
        }
        Ok(())
    }

    /// A reference on `key` for a request of `key` itself, starting it (`start`) when not
    /// running if the budgets allow: `user`'s too, when given, who is then its creator.
    pub fn acquire_for(
        &mut self,
        key: &Key,
        user: Option<&str>,
        start: impl FnOnce() -> T,
    ) -> Result<&Entry<T>, Error> {
        if !self.entries.contains_key(key) {
            self.admit(user)?;
            if let Some(user) = user {
                *self.by_user.entry(user.to_string()).or_default() += 1;
            }
            let e = self.reference(key, key, start);
            e.creator = user.map(str::to_string);
            return Ok(e);
        }
        Ok(self.reference(key, key, start))
    }

    /// A reference on `key` for a request of `asked` (itself, or a key it serves),
    /// starting it when not running with no budget asked: the caller decided (a covering
    /// key, coalescing, a watcher that moved).
    pub fn acquire(&mut self, key: &Key, asked: &Key, start: impl FnOnce() -> T) -> &Entry<T> {
        self.reference(key, asked, start)
    }

    fn reference(&mut self, key: &Key, asked: &Key, start: impl FnOnce() -> T) -> &mut Entry<T> {
        let covered = (asked != key).then_some(asked);
        if let Some(asked) = covered {
            self.count_covered(asked, 1, true);
        }
        self.changed(key, covered);
        let e = self.entries.entry(key.clone()).or_insert_with(|| Entry {
            value: start(),
            refs: 0,
            covering: HashMap::new(),
            creator: None,
            generation: 0,
        });
        e.refs += 1;
        if asked != key {
            *e.covering.entry(asked.clone()).or_default() += 1;
        }
        // A reference taken during the grace period cancels the pending stop.
        e.generation += 1;
        e
    }

    /// Drops a reference on `held`, taken for a request of `asked`.
    pub fn release(&mut self, held: &Key, asked: &Key) -> Released {
        let Some(e) = self.entries.get_mut(held) else {
            return Released::Unknown;
        };
        e.refs = e.refs.saturating_sub(1);
        let mut covered = None;
        if asked != held {
            if let Some(n) = e.covering.get_mut(asked) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    e.covering.remove(asked);
                }
                covered = Some(asked);
            }
        }
        let released = if e.refs > 0 {
            Released::Held
        } else {
            e.generation += 1;
            Released::Idle {
                generation: e.generation,
            }
        };
        if let Some(asked) = covered {
            self.count_covered(asked, 1, false);
        }
        self.changed(held, covered);
        released
    }

    /// `key`, idle since `generation`, may stop (its grace period is over, or the caller
    /// cuts it short): it does unless a reference came back or `keep` says the key is
    /// still needed.
    pub fn grace_over(
        &mut self,
        key: &Key,
        generation: u64,
        keep: impl FnOnce(&Entry<T>) -> bool,
    ) -> Grace<T> {
        match self.entries.get(key) {
            Some(e) if e.refs == 0 && e.generation == generation => {
                if keep(e) {
                    return Grace::Again;
                }
            }
            _ => return Grace::Nothing,
        }
        match self.remove(key) {
            Some(value) => Grace::Stop(value),
            None => Grace::Nothing,
        }
    }

    /// Takes `key` out of the table now (whatever its references), its creator's budget
    /// given back.
    pub fn remove(&mut self, key: &Key) -> Option<T> {
        let e = self.entries.remove(key)?;
        for (asked, n) in &e.covering {
            self.count_covered(asked, *n, false);
            self.changed(key, Some(asked));
        }
        self.changed(key, None);
        if let Some(user) = &e.creator {
            if let Some(n) = self.by_user.get_mut(user) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    self.by_user.remove(user);
                }
            }
        }
        Some(e.value)
    }

    /// Every key out of the table (shutdown).
    pub fn drain(&mut self) -> impl Iterator<Item = (Key, T)> + '_ {
        self.by_user.clear();
        self.covered.clear();
        self.entries.drain().map(|(k, e)| (k, e.value))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::key::{ResourceType, Scope};
    use std::sync::Arc;

    fn name(n: &str) -> Key {
        Key::new(
            Arc::new(ResourceType::new("", "v1", "secrets", "Secret", true)),
            Scope::Name {
                namespace: Some("n".into()),
                name: n.into(),
            },
        )
    }

    fn ns() -> Key {
        Key::new(
            Arc::new(ResourceType::new("", "v1", "secrets", "Secret", true)),
            Scope::Namespace("n".into()),
        )
    }

    /// One step on the table and what it answered, as text.
    enum Step {
        /// acquire_for(key, user)
        For(Key, Option<&'static str>),
        /// acquire(key, asked)
        Serve(Key, Key),
        /// release(held, asked)
        Release(Key, Key),
        /// grace_over(key, the generation of the last Idle, keep)
        Grace(Key, bool),
        Remove(Key),
    }

    fn run(limits: Limits, steps: Vec<Step>) -> Vec<String> {
        let mut refs: Refs<u32> = Refs::new(limits);
        let mut started = 0;
        let mut idle = 0;
        let mut out = Vec::new();
        for step in steps {
            let mut start = || {
                started += 1;
                started
            };
            out.push(match step {
                Step::For(k, user) => match refs.acquire_for(&k, user, &mut start) {
                    Ok(e) => format!("actor {} refs {}", e.value, e.refs),
                    Err(e) => e.to_string(),
                },
                Step::Serve(k, asked) => {
                    let e = refs.acquire(&k, &asked, &mut start);
                    format!(
                        "actor {} refs {} covering {:?}",
                        e.value,
                        e.refs,
                        e.covering.get(&asked)
                    )
                }
                Step::Release(held, asked) => {
                    let r = refs.release(&held, &asked);
                    if let Released::Idle { generation } = r {
                        idle = generation;
                    }
                    format!("{r:?}")
                }
                Step::Grace(k, keep) => format!("{:?}", refs.grace_over(&k, idle, |_| keep)),
                Step::Remove(k) => format!("{:?}", refs.remove(&k)),
            });
        }
        out
    }

    /// `take_changes`, sorted and as text.
    fn changes(refs: &mut Refs<u32>) -> (Vec<String>, Vec<String>) {
        let c = refs.take_changes();
        let text = |v: Vec<(Key, usize)>| {
            let mut v: Vec<String> = v.into_iter().map(|(k, n)| format!("{k}={n}")).collect();
            v.sort();
            v
        };
        (text(c.refs), text(c.covered))
    }

    #[test]
    fn changes_name_the_counts_that_moved_as_they_are_now() {
        let mut refs: Refs<u32> = Refs::new(Limits::default());
        refs.acquire(&name("a"), &name("a"), || 1);
        // Not tracked before it is asked for (a replica outside a fleet).
        assert_eq!(refs.take_changes(), Changes::default());
        refs.track_changes();
        let (a, b, n) = (name("a"), name("b"), ns());
        refs.acquire(&n, &b, || 2);
        refs.acquire(&n, &b, || 2);
        refs.acquire(&a, &a, || 1);
        let (ks, kn, kb) = (a.to_string(), n.to_string(), b.to_string());
        assert_eq!(
            changes(&mut refs),
            (
                vec![format!("{ks}=2"), format!("{kn}=2")],
                vec![format!("{kb}=2")]
            )
        );
        // Taken: nothing until a count moves again.
        assert_eq!(changes(&mut refs), (vec![], vec![]));
        refs.release(&n, &b);
        assert_eq!(
            changes(&mut refs),
            (vec![format!("{kn}=1")], vec![format!("{kb}=1")])
        );
        // A key taken out with its references: all it served goes with it.
        refs.remove(&n);
        assert_eq!(
            changes(&mut refs),
            (vec![format!("{kn}=0")], vec![format!("{kb}=0")])
        );
        assert_eq!(refs.covered_counts().count(), 0);
        // A release of what was never served changes no covered count.
        refs.release(&a, &b);
        assert_eq!(changes(&mut refs), (vec![format!("{ks}=1")], vec![]));
    }

    #[test]
    fn table() {
        use Step::*;
        let open = Limits::default();
        let two_per_user = Limits {
            max_keys: 0,
            max_keys_per_user: 2,
        };
        let two = Limits {
            max_keys: 2,
            max_keys_per_user: 0,
        };
        let cases: Vec<(&str, Limits, Vec<Step>, Vec<&str>)> = vec![
            (
                "the first reference starts the key, the next ones count",
                open,
                vec![For(name("a"), Some("u")), For(name("a"), Some("v"))],
                vec!["actor 1 refs 1", "actor 1 refs 2"],
            ),
            (
                "the last release starts the grace period; its end stops the key",
                open,
                vec![
                    For(name("a"), None),
                    Release(name("a"), name("a")),
                    Grace(name("a"), false),
                ],
                vec!["actor 1 refs 1", "Idle { generation: 2 }", "Stop(1)"],
            ),
            (
                "a reference taken during the grace period keeps the key",
                open,
                vec![
                    For(name("a"), None),
                    Release(name("a"), name("a")),
                    For(name("a"), None),
                    Grace(name("a"), false),
                ],
                vec![
                    "actor 1 refs 1",
                    "Idle { generation: 2 }",
                    "actor 1 refs 1",
                    "Nothing",
                ],
            ),
            (
                "a key the caller keeps waits another grace period",
                open,
                vec![
                    For(name("a"), None),
                    Release(name("a"), name("a")),
                    Grace(name("a"), true),
                ],
                vec!["actor 1 refs 1", "Idle { generation: 2 }", "Again"],
            ),
            (
                "a user's budget counts the keys they started, until they stop",
                two_per_user,
                vec![
                    For(name("a"), Some("u")),
                    For(name("b"), Some("u")),
                    For(name("c"), Some("u")),
                    For(name("c"), Some("v")),
                    // Referencing a running key costs no budget.
                    For(name("a"), Some("w")),
                    Release(name("b"), name("b")),
                    Grace(name("b"), false),
                    For(name("d"), Some("u")),
                ],
                vec![
                    "actor 1 refs 1",
                    "actor 2 refs 1",
                    "too many cached keys started by user \"u\" (limit 2)",
                    "actor 3 refs 1",
                    "actor 1 refs 2",
                    "Idle { generation: 2 }",
                    "Stop(2)",
                    "actor 4 refs 1",
                ],
            ),
            (
                "the replica's budget holds for every user, and for none",
                two,
                vec![
                    For(name("a"), Some("u")),
                    For(name("b"), None),
                    For(name("c"), Some("v")),
                    For(name("c"), None),
                ],
                vec![
                    "actor 1 refs 1",
                    "actor 2 refs 1",
                    "too many cached keys on this replica (limit 2)",
                    "too many cached keys on this replica (limit 2)",
                ],
            ),
            (
                "references for a key served by another count under the key asked",
                open,
                vec![
                    Serve(ns(), name("a")),
                    Serve(ns(), name("a")),
                    Release(ns(), name("a")),
                    Release(ns(), name("a")),
                ],
                vec![
                    "actor 1 refs 1 covering Some(1)",
                    "actor 1 refs 2 covering Some(2)",
                    "Held",
                    "Idle { generation: 3 }",
                ],
            ),
            (
                "a stopped key is unknown, and a removed one frees its creator's budget",
                Limits {
                    max_keys: 0,
                    max_keys_per_user: 1,
                },
                vec![
                    For(name("a"), Some("u")),
                    Remove(name("a")),
                    Release(name("a"), name("a")),
                    For(name("b"), Some("u")),
                ],
                vec!["actor 1 refs 1", "Some(1)", "Unknown", "actor 2 refs 1"],
            ),
        ];
        for (case, limits, steps, want) in cases {
            assert_eq!(run(limits, steps), want, "{case}");
        }
    }
}
