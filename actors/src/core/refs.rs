//! The registry's references as plain data: which keys run, how many references each
//! holds (its own requests', and those of the keys it covers or serves coalesced, by the
//! key asked), who started it (the key budgets `cache.max_keys` and
//! `cache.max_keys_per_user`), and when a key whose last reference went may stop — after
//! its grace period, unless a reference came back meanwhile or the caller keeps it (a
//! fleet owner other replicas still need). The Registry actor keeps each key's actor and
//! status beside its count (`T`) and carries out the starts and stops this table names.
//! In a fleet it also says which counts changed since it was last asked
//! ([`Refs::take_changes`]): the fleet hears only those. And it keeps each group key's
//! small keys ([`Group`], `Key::group`) as references come and go, so the coalescing check
//! reads its figures per group each second instead of walking every key and covered name.

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
    /// By group key; a group with no running small key and no watched name is dropped.
    groups: HashMap<Key, Group>,
}

/// A group key's small keys (`Key::group`: a namespace key's name keys, the cluster
/// pods key's node keys), as the coalescing check reads them.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Group {
    /// The small keys running here (referenced, or in their grace period).
    pub running: HashSet<Key>,
    /// The group's watched small keys ([`Refs::is_watched`]), each counted once.
    pub names: usize,
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
            groups: HashMap::new(),
        }
    }

    /// Every group with a running small key or a watched name.
    pub fn groups(&self) -> impl Iterator<Item = (&Key, &Group)> {
        self.groups.iter()
    }

    pub fn group(&self, group: &Key) -> Option<&Group> {
        self.groups.get(group)
    }

    /// Whether small key `small` of group key `group` is watched: it has references of its
    /// own, or the group key serves requests of it.
    pub fn is_watched(&self, small: &Key, group: &Key) -> bool {
        self.entries.get(small).is_some_and(|e| e.refs > 0)
            || self
                .entries
                .get(group)
                .is_some_and(|e| e.covering.get(small).is_some_and(|n| *n > 0))
    }

    /// The group's watched small keys (its `names` of them), running or served by the
    /// group key: read when a group splits, not every second.
    pub fn watched_in(&self, group: &Key) -> Vec<Key> {
        let referenced = |k: &Key| self.entries.get(k).is_some_and(|e| e.refs > 0);
        let mut names: Vec<Key> = self
            .groups
            .get(group)
            .into_iter()
            .flat_map(|g| g.running.iter())
            .filter(|k| referenced(k))
            .cloned()
            .collect();
        if let Some(e) = self.entries.get(group) {
            names.extend(
                e.covering
                    .iter()
                    .filter(|(asked, n)| **n > 0 && group.is_group_of(asked) && !referenced(asked))
                    .map(|(asked, _)| asked.clone()),
            );
        }
        names
    }

    /// Counts `touched`'s small keys in or out of their group's names, from whether each
    /// was watched before (`was`) and is now.
    fn count_names(&mut self, touched: &[(Key, Key)], was: &[bool]) {
        for ((small, group), was) in touched.iter().zip(was) {
            let now = self.is_watched(small, group);
            if now != *was {
                let g = self.groups.entry(group.clone()).or_default();
                g.names = if now {
                    g.names + 1
                } else {
                    g.names.saturating_sub(1)
                };
            }
            self.drop_if_empty(group);
        }
    }

    fn drop_if_empty(&mut self, group: &Key) {
        if self
            .groups
            .get(group)
            .is_some_and(|g| g.names == 0 && g.running.is_empty())
        {
            self.groups.remove(group);
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
        // Once referenced, `key` and an `asked` it is the group of are watched.
        for (small, group) in touched(key, asked) {
            if !self.is_watched(&small, &group) {
                self.groups.entry(group).or_default().names += 1;
            }
        }
        if !self.entries.contains_key(key) {
            if let Some(group) = key.group() {
                self.groups
                    .entry(group)
                    .or_default()
                    .running
                    .insert(key.clone());
            }
        }
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
        if !self.entries.contains_key(held) {
            return Released::Unknown;
        }
        let touched = touched(held, asked);
        let was: Vec<bool> = touched
            .iter()
            .map(|(small, group)| self.is_watched(small, group))
            .collect();
        let released = self.unreference(held, asked);
        self.count_names(&touched, &was);
        released
    }

    fn unreference(&mut self, held: &Key, asked: &Key) -> Released {
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
        let touched: Vec<(Key, Key)> = {
            let e = self.entries.get(key)?;
            key.group()
                .map(|group| (key.clone(), group))
                .into_iter()
                .chain(
                    e.covering
                        .keys()
                        .filter(|asked| key.is_group_of(asked))
                        .map(|asked| (asked.clone(), key.clone())),
                )
                .collect()
        };
        let was: Vec<bool> = touched
            .iter()
            .map(|(small, group)| self.is_watched(small, group))
            .collect();
        let e = self.entries.remove(key)?;
        if let Some(g) = key.group().and_then(|group| self.groups.get_mut(&group)) {
            g.running.remove(key);
        }
        self.count_names(&touched, &was);
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
        self.groups.clear();
        self.entries.drain().map(|(k, e)| (k, e.value))
    }
}

/// The small keys (with their group key) whose watched state ([`Refs::is_watched`]) a
/// reference on `key` for `asked` may change: `key` when it has a group, and `asked` when
/// `key` is its group.
fn touched(key: &Key, asked: &Key) -> Vec<(Key, Key)> {
    let mut touched = Vec::new();
    if let Some(group) = key.group() {
        touched.push((key.clone(), group));
    }
    if asked != key && key.is_group_of(asked) {
        touched.push((asked.clone(), key.clone()));
    }
    touched
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

    /// The groups as the coalescing check once computed them each second, from every key
    /// and covered name: the index must always say the same.
    fn groups_walked(refs: &Refs<u32>) -> HashMap<Key, Group> {
        let mut groups: HashMap<Key, Group> = HashMap::new();
        let mut names: HashMap<Key, HashSet<Key>> = HashMap::new();
        for (key, e) in refs.iter() {
            if let Some(group) = key.group() {
                groups
                    .entry(group.clone())
                    .or_default()
                    .running
                    .insert(key.clone());
                if e.refs > 0 {
                    names.entry(group).or_default().insert(key.clone());
                }
            }
            for (asked, n) in &e.covering {
                if *n > 0 && asked.group().as_ref() == Some(key) {
                    names.entry(key.clone()).or_default().insert(asked.clone());
                }
            }
        }
        for (group, names) in names {
            groups.entry(group).or_default().names = names.len();
        }
        groups
    }

    fn universe() -> Vec<Key> {
        let secrets = Arc::new(ResourceType::new("", "v1", "secrets", "Secret", true));
        let pods = Arc::new(ResourceType::new("", "v1", "pods", "Pod", true));
        let name = |r: &Arc<ResourceType>, ns: &str, n: &str| {
            Key::new(
                r.clone(),
                Scope::Name {
                    namespace: Some(ns.into()),
                    name: n.into(),
                },
            )
        };
        vec![
            name(&secrets, "n", "a"),
            name(&secrets, "n", "b"),
            name(&secrets, "n", "c"),
            name(&secrets, "m", "a"),
            Key::new(secrets.clone(), Scope::Namespace("n".into())),
            Key::new(secrets.clone(), Scope::Namespace("m".into())),
            Key::new(secrets.clone(), Scope::Cluster),
            Key::new(pods.clone(), Scope::Node("x".into())),
            Key::new(pods.clone(), Scope::Node("y".into())),
            Key::new(pods.clone(), Scope::Cluster),
            name(&pods, "n", "p"),
        ]
    }

    #[test]
    fn the_group_index_follows_references_as_they_come_and_go() {
        let (a, b, ns) = (name("a"), name("b"), ns());
        let mut refs: Refs<u32> = Refs::new(Limits::default());
        let figures = |refs: &Refs<u32>| {
            refs.group(&ns).map(|g| {
                let mut running: Vec<String> = g.running.iter().map(|k| k.to_string()).collect();
                running.sort();
                (g.names, running)
            })
        };
        let running = |ks: &[&Key]| ks.iter().map(|k| k.to_string()).collect::<Vec<_>>();
        let _ = refs.acquire_for(&a, None, || 1);
        assert_eq!(figures(&refs), Some((1, running(&[&a]))));
        // The namespace key serves a and b: a counted once, b served without a key.
        refs.acquire(&ns, &a, || 2);
        refs.acquire(&ns, &b, || 2);
        assert_eq!(figures(&refs), Some((2, running(&[&a]))));
        let mut watched = refs.watched_in(&ns);
        watched.sort_by_key(|k| k.to_string());
        assert_eq!(watched, vec![a.clone(), b.clone()]);
        // a's own watch goes: still watched through the namespace key, its key idle.
        assert!(matches!(refs.release(&a, &a), Released::Idle { .. }));
        assert_eq!(figures(&refs), Some((2, running(&[&a]))));
        assert!(refs.is_watched(&a, &ns));
        // The namespace key stops: b is no longer watched, a's idle key still runs.
        refs.remove(&ns);
        assert_eq!(figures(&refs), Some((0, running(&[&a]))));
        refs.remove(&a);
        assert_eq!(figures(&refs), None);
    }

    proptest::proptest! {
        /// Any sequence of references, releases and removals, sensible or not: the index
        /// says what walking the whole table says.
        #[test]
        fn the_group_index_matches_a_walk_of_the_table(
            ops in proptest::collection::vec((0u8..4, 0usize..11, 0usize..11), 0..80)
        ) {
            let keys = universe();
            let mut refs: Refs<u32> = Refs::new(Limits::default());
            for (op, k, asked) in ops {
                let (k, asked) = (&keys[k], &keys[asked]);
                match op {
                    0 => {
                        let _ = refs.acquire_for(k, None, || 0);
                    }
                    1 => {
                        refs.acquire(k, asked, || 0);
                    }
                    2 => {
                        refs.release(k, asked);
                    }
                    _ => {
                        refs.remove(k);
                    }
                }
                let walked = groups_walked(&refs);
                let indexed: HashMap<Key, Group> = refs
                    .groups()
                    .map(|(k, g)| (k.clone(), Group { running: g.running.clone(), names: g.names }))
                    .collect();
                proptest::prop_assert_eq!(&indexed, &walked);
                for (group, g) in &walked {
                    let mut watched = refs.watched_in(group);
                    watched.sort_by_key(|k| k.to_string());
                    proptest::prop_assert_eq!(watched.len(), g.names);
                    watched.dedup();
                    proptest::prop_assert_eq!(watched.len(), g.names);
                }
            }
        }
    }
}
