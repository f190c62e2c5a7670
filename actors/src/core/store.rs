//! A key's current state: objects by `namespace/name`, each kept once as shared JSON.
//!
//! As kube-rs's reflector store: one writer (the CachedObject), readers get cheap
//! `Arc` snapshots. Objects are the upstream's JSON bytes (`core::object`), so any
//! `group/version/resource` can be cached.

use std::collections::BTreeMap;
use std::ops::Bound;
use std::sync::Arc;

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
}
