//! A key's current state: objects by `namespace/name`, each kept once as shared JSON.
//!
//! As kube-rs's reflector store: one writer (the CachedObject), readers get cheap
//! `Arc` snapshots. Objects are the upstream's JSON bytes (`core::object`), so any
//! `group/version/resource` can be cached.

use std::collections::BTreeMap;
use std::ops::Bound;
use std::sync::Arc;

use crate::core::key::{Key, Scope};
use crate::core::object::Object;

#[derive(Debug, Default)]
pub struct Store {
    objects: BTreeMap<String, Arc<Object>>,
}

impl Store {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn len(&self) -> usize {
        self.objects.len()
    }

    pub fn is_empty(&self) -> bool {
        self.objects.is_empty()
    }

    pub fn get(&self, key: &str) -> Option<&Arc<Object>> {
        self.objects.get(key)
    }

    /// Inserts or replaces an object; returns the previous version.
    pub fn upsert(&mut self, obj: Arc<Object>) -> Option<Arc<Object>> {
        self.objects.insert(obj.key(), obj)
    }

    /// Removes an object; returns what was stored.
    pub fn remove(&mut self, obj: &Object) -> Option<Arc<Object>> {
        self.objects.remove(&obj.key())
    }

    /// Every object, ordered by `namespace/name` (the order the API server lists in).
    pub fn snapshot(&self) -> Vec<Arc<Object>> {
        self.objects.values().cloned().collect()
    }

    /// What a watch or read of `asked` is given when this store's key covers it: its one
    /// object for a name, its namespace's objects for a namespace, in key order; every
    /// object otherwise (and for `None`: the request is the key's own). The request's
    /// filter still decides; this only leaves out what it would drop. A namespace key
    /// serving 100,000 name watches over 20,000 Secrets copied all 20,000 into every
    /// watch's start, and each watcher filtered them: 170 CPU-s to open the watches
    /// instead of 66.
    pub fn snapshot_for(&self, asked: Option<&Key>) -> Vec<Arc<Object>> {
        let span = span(asked);
        self.range(borrowed(&span))
            .map(|(_, o)| o.clone())
            .collect()
    }

    pub fn iter(&self) -> impl Iterator<Item = (&String, &Arc<Object>)> {
        self.objects.iter()
    }

    /// The objects whose keys fall in `range`, in key order.
    pub fn range<'a>(
        &'a self,
        range: (Bound<&'a str>, Bound<&'a str>),
    ) -> impl Iterator<Item = (&'a String, &'a Arc<Object>)> + 'a {
        self.objects.range::<str, _>(range)
    }
}

/// A range of store keys (`namespace/name`, or `name` for a cluster-scoped resource).
pub type Span = (Bound<String>, Bound<String>);

/// The store keys that can hold an object of `asked` (see [`Store::snapshot_for`]): one
/// key for a name, a namespace's keys, or all of them.
pub fn span(asked: Option<&Key>) -> Span {
    let Some(asked) = asked else {
        return (Bound::Unbounded, Bound::Unbounded);
    };
    let one = |key: String| (Bound::Included(key.clone()), Bound::Included(key));
    match (&asked.scope, asked.resource.namespaced) {
        (
            Scope::Name {
                namespace: Some(ns),
                name,
            },
            true,
        ) => one(format!("{ns}/{name}")),
        (
            Scope::Name {
                namespace: None,
                name,
            },
            false,
        ) => one(name.clone()),
        // Keys are `namespace/name`; '0' is the byte after '/'.
        (Scope::Namespace(ns), true) => (
            Bound::Included(format!("{ns}/")),
            Bound::Excluded(format!("{ns}0")),
        ),
        // A name across namespaces, a node's pods, the whole resource.
        _ => (Bound::Unbounded, Bound::Unbounded),
    }
}

/// `span` as the bounds `BTreeMap::range` takes.
pub fn borrowed(span: &Span) -> (Bound<&str>, Bound<&str>) {
    (
        span.0.as_ref().map(String::as_str),
        span.1.as_ref().map(String::as_str),
    )
}

/// Objects and stores for the core's table tests.
#[cfg(test)]
pub(crate) mod fixtures {
    use super::*;
    use crate::core::object::Schema;
    use serde_json::{json, Value};

    /// An object from JSON, read as a resource without selectable fields.
    pub fn o(v: Value) -> Object {
        Object::from_value(Schema::Generic, &v).expect("fixture objects are valid")
    }

    /// `n/name` with a UID and a resourceVersion.
    pub fn obj(name: &str, uid: &str, rv: u64) -> Object {
        o(
            json!({"metadata": {"name": name, "namespace": "n", "uid": uid, "resourceVersion": rv.to_string()}}),
        )
    }

    pub fn store(objs: &[Object]) -> Store {
        let mut s = Store::new();
        for o in objs {
            s.upsert(Arc::new(o.clone()));
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::fixtures::o;
    use super::*;
    use serde_json::json;

    #[test]
    fn upsert_replace_remove() {
        let mut s = Store::new();
        let named = |name: &str, rv: &str| {
            o(json!({"metadata": {"name": name, "namespace": "n", "resourceVersion": rv}}))
        };
        assert!(s.upsert(Arc::new(named("b", "1"))).is_none());
        assert!(s.upsert(Arc::new(named("a", "1"))).is_none());
        let prev = s.upsert(Arc::new(named("a", "2")));
        assert_eq!(prev.map(|p| p.rv()), Some(1));
        assert_eq!(s.len(), 2);
        let names: Vec<_> = s.snapshot().iter().map(|o| o.name().to_string()).collect();
        assert_eq!(names, ["a", "b"]);
        assert!(s.remove(&named("a", "")).is_some());
        assert!(s.remove(&named("a", "")).is_none());
        assert_eq!(s.len(), 1);
        assert!(s.get("n/b").is_some());
    }

    #[test]
    fn a_covered_watch_starts_from_only_what_it_asked_for() {
        use crate::core::key::ResourceType;
        let at = |ns: &str, name: &str| {
            Arc::new(o(json!({"metadata": {"name": name, "namespace": ns}})))
        };
        let mut s = Store::new();
        // Namespaces whose names sort right around "n/": "n-a" and "n0" before and after.
        for (ns, name) in [
            ("n", "a"),
            ("n", "b"),
            ("n-a", "a"),
            ("n0", "a"),
            ("n2", "a"),
        ] {
            s.upsert(at(ns, name));
        }
        let secrets = Arc::new(ResourceType::new("", "v1", "secrets", "Secret", true));
        let key = |scope| Key::new(secrets.clone(), scope);
        let name = |ns: Option<&str>, name: &str| {
            key(Scope::Name {
                namespace: ns.map(str::to_string),
                name: name.into(),
            })
        };
        let cases: [(Option<Key>, &[&str]); 8] = [
            (None, &["n-a/a", "n/a", "n/b", "n0/a", "n2/a"]),
            (Some(name(Some("n"), "b")), &["n/b"]),
            (Some(name(Some("n"), "x")), &[]),
            (Some(name(Some("n-a"), "a")), &["n-a/a"]),
            (Some(key(Scope::Namespace("n".into()))), &["n/a", "n/b"]),
            (Some(key(Scope::Namespace("n0".into()))), &["n0/a"]),
            // A name in every namespace, or a node's pods: everything, the filter decides.
            (
                Some(name(None, "a")),
                &["n-a/a", "n/a", "n/b", "n0/a", "n2/a"],
            ),
            (
                Some(key(Scope::Node("node-1".into()))),
                &["n-a/a", "n/a", "n/b", "n0/a", "n2/a"],
            ),
        ];
        for (asked, want) in cases {
            let got: Vec<String> = s
                .snapshot_for(asked.as_ref())
                .iter()
                .map(|o| o.key())
                .collect();
            assert_eq!(got, want, "{asked:?}");
        }
        // A cluster-scoped resource's name is its whole key.
        let mut nodes = Store::new();
        nodes.upsert(Arc::new(o(json!({"metadata": {"name": "node-1"}}))));
        nodes.upsert(Arc::new(o(json!({"metadata": {"name": "node-2"}}))));
        let kind = Arc::new(ResourceType::new("", "v1", "nodes", "Node", false));
        let one = Key::new(
            kind,
            Scope::Name {
                namespace: None,
                name: "node-2".into(),
            },
        );
        let got: Vec<String> = nodes
            .snapshot_for(Some(&one))
            .iter()
            .map(|o| o.key())
            .collect();
        assert_eq!(got, ["node-2"]);
    }
}
