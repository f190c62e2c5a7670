//! Declared interest: keys an operator lists in the configuration (`[[publish]]`) that
//! kcache keeps cached with no client asking — in a fleet, owned and published over NATS
//! for plain NATS subscribers, which otherwise never make a key exist (`docs/nats.md`).
//!
//! Each entry names a cached resource and a scope, as the subject contract names keys:
//! a namespace and a name (one object), a namespace (all of it), a name alone (an object
//! of a cluster-scoped resource), a node (the pods of one node), or nothing (the resource
//! everywhere). The same rules resolve the keys NATS subscribers ask for (`nats_wants`). [`keys`] turns the
//! entries into keys once discovery has said which resources are cached and their scope;
//! an entry that names no cached resource, or a scope the resource does not have, is
//! refused with its reason (logged at start), never guessed.

use std::sync::Arc;

use kcache_actors::core::key::{Key, Scope};
use serde::Deserialize;
use thiserror::Error;

use crate::discovery::Resources;

/// Why an entry names no key.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum Error {
    #[error("not a resource kcache caches ([[resources]] and discovery)")]
    NotCached,
    #[error("a name of a namespaced resource needs its namespace")]
    NameWithoutNamespace,
    #[error("{0} is cluster-scoped: no namespace")]
    ClusterScoped(String),
    #[error("{what} {value:?} is not a valid object name")]
    InvalidName { what: &'static str, value: String },
    #[error("a node key is the pods of one node: pods only, with no namespace or name")]
    NodeNotPods,
}

/// One `[[publish]]` entry.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(default, deny_unknown_fields)]
pub struct PublishEntry {
    /// The API group, empty for the core group.
    pub group: String,
    pub version: String,
    /// The plural resource (`configmaps`).
    pub resource: String,
    pub namespace: Option<String>,
    pub name: Option<String>,
    /// The pods of one node (`fieldSelector=spec.nodeName`, the kubelet's pod watch).
    pub node: Option<String>,
}

impl std::fmt::Display for PublishEntry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let g = if self.group.is_empty() {
            "core"
        } else {
            &self.group
        };
        write!(f, "{g}/{}/{}", self.version, self.resource)?;
        if let Some(ns) = &self.namespace {
            write!(f, " namespace={ns}")?;
        }
        if let Some(n) = &self.name {
            write!(f, " name={n}")?;
        }
        if let Some(n) = &self.node {
            write!(f, " node={n}")?;
        }
        Ok(())
    }
}

/// The keys of `entries` among the cached `resources`, and a reason for each entry
/// refused (in order).
pub fn keys(entries: &[PublishEntry], resources: &Resources) -> (Vec<Key>, Vec<String>) {
    let mut keys = Vec::new();
    let mut refused = Vec::new();
    for e in entries {
        match key(e, resources) {
            Ok(k) if !keys.contains(&k) => keys.push(k),
            Ok(_) => {}
            Err(why) => refused.push(format!("[[publish]] {e}: {why}")),
        }
    }
    (keys, refused)
}

/// The key one entry names among the cached `resources`.
pub fn key(e: &PublishEntry, resources: &Resources) -> Result<Key, Error> {
    let id = (e.group.clone(), e.version.clone(), e.resource.clone());
    let Some(r) = resources.get(&id) else {
        return Err(Error::NotCached);
    };
    for (what, v) in [
        ("namespace", &e.namespace),
        ("name", &e.name),
        ("node", &e.node),
    ] {
        if let Some(v) = v {
            valid(what, v)?;
        }
    }
    if let Some(node) = &e.node {
        let pods = r.group.is_empty() && r.resource == "pods";
        if !pods || e.namespace.is_some() || e.name.is_some() {
            return Err(Error::NodeNotPods);
        }
        return Ok(Key::new(Arc::clone(r), Scope::Node(node.clone())));
    }
    let scope = match (r.namespaced, e.namespace.clone(), e.name.clone()) {
        (true, Some(namespace), Some(name)) => Scope::Name {
            namespace: Some(namespace),
            name,
        },
        (true, Some(ns), None) => Scope::Namespace(ns),
        (true, None, Some(_)) => return Err(Error::NameWithoutNamespace),
        (false, Some(_), _) => return Err(Error::ClusterScoped(e.resource.clone())),
        (false, None, Some(name)) => Scope::Name {
            namespace: None,
            name,
        },
        (_, None, None) => Scope::Cluster,
    };
    Ok(Key::new(Arc::clone(r), scope))
}

/// A namespace or name as the API server would take it in a path: not empty, no `/`, not
/// `.` or `..`, at most 253 bytes.
fn valid(what: &'static str, v: &str) -> Result<(), Error> {
    if v.is_empty() || v.len() > 253 || v.contains('/') || v == "." || v == ".." {
        return Err(Error::InvalidName {
            what,
            value: v.to_string(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use kcache_actors::core::key::ResourceType;

    fn resources() -> Resources {
        let mut r = Resources::new();
        for (res, kind, namespaced) in [
            ("configmaps", "ConfigMap", true),
            ("pods", "Pod", true),
            ("namespaces", "Namespace", false),
        ] {
            r.insert(
                (String::new(), "v1".into(), res.into()),
                Arc::new(ResourceType::new("", "v1", res, kind, namespaced)),
            );
        }
        r
    }

    fn entry(resource: &str, namespace: Option<&str>, name: Option<&str>) -> PublishEntry {
        PublishEntry {
            group: String::new(),
            version: "v1".into(),
            resource: resource.into(),
            namespace: namespace.map(str::to_string),
            name: name.map(str::to_string),
            node: None,
        }
    }

    fn node(resource: &str, namespace: Option<&str>, node: &str) -> PublishEntry {
        PublishEntry {
            node: Some(node.into()),
            ..entry(resource, namespace, None)
        }
    }

    #[test]
    fn entries_become_keys_or_are_refused_with_a_reason() {
        let r = resources();
        // (entry, the key it names or the start of why it is refused)
        let bad = |what, value: &str| {
            Err(Error::InvalidName {
                what,
                value: value.into(),
            })
        };
        let cases = [
            (
                entry("configmaps", Some("a"), Some("x")),
                Ok("configmaps a/x"),
            ),
            (entry("configmaps", Some("a"), None), Ok("configmaps a/*")),
            (entry("configmaps", None, None), Ok("configmaps */*")),
            (entry("namespaces", None, Some("a")), Ok("namespaces a")),
            (entry("namespaces", None, None), Ok("namespaces *")),
            (
                entry("configmaps", None, Some("x")),
                Err(Error::NameWithoutNamespace),
            ),
            (
                entry("namespaces", Some("a"), None),
                Err(Error::ClusterScoped("namespaces".into())),
            ),
            (entry("secrets", Some("a"), None), Err(Error::NotCached)),
            (
                entry("configmaps", Some("a/b"), None),
                bad("namespace", "a/b"),
            ),
            (
                entry("configmaps", Some("a"), Some("..")),
                bad("name", ".."),
            ),
            (entry("configmaps", Some(""), None), bad("namespace", "")),
            (node("pods", None, "n1"), Ok("pods node n1")),
            (node("pods", Some("a"), "n1"), Err(Error::NodeNotPods)),
            (node("configmaps", None, "n1"), Err(Error::NodeNotPods)),
            (node("pods", None, "a/b"), bad("node", "a/b")),
        ];
        for (e, want) in cases {
            let got = key(&e, &r).map(|k| describe(&k));
            assert_eq!(got, want.map(str::to_string), "{e}");
        }
    }

    #[test]
    fn duplicates_are_one_key_and_every_refusal_is_reported() {
        let (keys, refused) = keys(
            &[
                entry("configmaps", Some("a"), None),
                entry("configmaps", Some("a"), None),
                entry("secrets", None, None),
            ],
            &resources(),
        );
        assert_eq!(keys.len(), 1);
        assert_eq!(refused.len(), 1);
        assert!(
            refused[0].starts_with("[[publish]] core/v1/secrets: "),
            "{refused:?}"
        );
    }

    fn describe(k: &Key) -> String {
        let r = &k.resource.resource;
        match &k.scope {
            Scope::Cluster if k.resource.namespaced => format!("{r} */*"),
            Scope::Cluster => format!("{r} *"),
            Scope::Namespace(ns) => format!("{r} {ns}/*"),
            Scope::Name {
                namespace: Some(ns),
                name,
            } => format!("{r} {ns}/{name}"),
            Scope::Name {
                namespace: None,
                name,
            } => format!("{r} {name}"),
            Scope::Node(n) => format!("{r} node {n}"),
        }
    }
}
