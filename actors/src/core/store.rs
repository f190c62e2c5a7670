//! A key's current state: objects by `namespace/name`, each kept once as shared JSON.
//!
//! As kube-rs's reflector store: one writer (the CachedObject), readers get cheap
//! `Arc` snapshots. Objects are raw JSON so any `group/version/resource` can be cached.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::Value;

use crate::core::event::object_key;

#[derive(Debug, Default)]
pub struct Store {
    objects: BTreeMap<String, Arc<Value>>,
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

    pub fn get(&self, key: &str) -> Option<&Arc<Value>> {
        self.objects.get(key)
    }

    /// Inserts or replaces an object; returns the previous version.
    pub fn upsert(&mut self, obj: Arc<Value>) -> Option<Arc<Value>> {
        self.objects.insert(object_key(&obj), obj)
    }

    /// Removes an object; returns what was stored.
    pub fn remove(&mut self, obj: &Value) -> Option<Arc<Value>> {
        self.objects.remove(&object_key(obj))
    }

    /// Every object, ordered by `namespace/name` (the order the API server lists in).
    pub fn snapshot(&self) -> Vec<Arc<Value>> {
        self.objects.values().cloned().collect()
    }

    pub fn iter(&self) -> impl Iterator<Item = (&String, &Arc<Value>)> {
        self.objects.iter()
    }
}

/// Objects and stores for the core's table tests.
#[cfg(test)]
pub(crate) mod fixtures {
    use super::*;
    use serde_json::json;

    /// `n/name` with a UID and a resourceVersion.
    pub fn obj(name: &str, uid: &str, rv: u64) -> Value {
        json!({"metadata": {"name": name, "namespace": "n", "uid": uid, "resourceVersion": rv.to_string()}})
    }

    pub fn store(objs: &[Value]) -> Store {
        let mut s = Store::new();
        for o in objs {
            s.upsert(Arc::new(o.clone()));
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn upsert_replace_remove() {
        let mut s = Store::new();
        assert!(s
            .upsert(Arc::new(
                json!({"metadata": {"name": "b", "namespace": "n"}})
            ))
            .is_none());
        assert!(s
            .upsert(Arc::new(
                json!({"metadata": {"name": "a", "namespace": "n"}})
            ))
            .is_none());
        let prev = s.upsert(Arc::new(
            json!({"metadata": {"name": "a", "namespace": "n", "resourceVersion": "2"}}),
        ));
        assert!(prev.is_some());
        assert_eq!(s.len(), 2);
        let names: Vec<_> = s
            .snapshot()
            .iter()
            .map(|o| o["metadata"]["name"].clone())
            .collect();
        assert_eq!(names, vec![json!("a"), json!("b")]);
        assert!(s
            .remove(&json!({"metadata": {"name": "a", "namespace": "n"}}))
            .is_some());
        assert!(s
            .remove(&json!({"metadata": {"name": "a", "namespace": "n"}}))
            .is_none());
        assert_eq!(s.len(), 1);
        assert!(s.get("n/b").is_some());
    }
}
