//! Keys and routing: which upstream list+watch (a *key*) serves a downstream request.
//!
//! A key is one upstream list+watch, as the kubelet's watch-based manager runs one
//! reflector per referenced object. Label selectors and the remaining field selectors are
//! filters inside the watcher and never create keys, so many clients share one key.

use std::fmt;
use std::sync::Arc;

use crate::core::object::Object;
use crate::core::selector::FieldSelector;

/// A resource kcache caches: `group/version/resource` plus what it needs to build paths
/// and bookmark objects.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ResourceType {
    /// "" for the core group.
    pub group: String,
    pub version: String,
    /// Plural, lower-case (`secrets`).
    pub resource: String,
    /// `Secret`; used for bookmark objects and list kinds (`SecretList`).
    pub kind: String,
    pub namespaced: bool,
}

impl ResourceType {
    pub fn new(group: &str, version: &str, resource: &str, kind: &str, namespaced: bool) -> Self {
        ResourceType {
            group: group.into(),
            version: version.into(),
            resource: resource.into(),
            kind: kind.into(),
            namespaced,
        }
    }

    /// `v1` for core, else `group/version`.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.clone()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// `/api/v1` for core, else `/apis/group/version`.
    pub fn group_version_path(&self) -> String {
        if self.group.is_empty() {
            format!("/api/{}", path_segment(&self.version))
        } else {
            format!(
                "/apis/{}/{}",
                path_segment(&self.group),
                path_segment(&self.version)
            )
        }
    }

    /// The collection path, in a namespace when given and the resource is namespaced.
    /// Every segment is escaped by [`path_segment`].
    pub fn collection_path(&self, namespace: Option<&str>) -> String {
        match namespace {
            Some(ns) if self.namespaced => format!(
                "{}/namespaces/{}/{}",
                self.group_version_path(),
                path_segment(ns),
                path_segment(&self.resource)
            ),
            _ => format!(
                "{}/{}",
                self.group_version_path(),
                path_segment(&self.resource)
            ),
        }
    }
}

/// The characters left as they are in a path segment: RFC 3986 unreserved.
const SEGMENT: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// One path segment of an upstream URL, percent-encoded: the one function through which
/// every namespace, resource, group and version kcache puts into a URL passes, so no
/// segment can add a `/`, a `?` or a `#` to kcache's own request.
/// `.` and `..` are encoded too: a client or proxy would otherwise resolve them as
/// relative path steps.
pub fn path_segment(s: &str) -> String {
    match s {
        "." => "%2E".to_string(),
        ".." => "%2E%2E".to_string(),
        _ => percent_encoding::utf8_percent_encode(s, SEGMENT).to_string(),
    }
}

/// A field selector value escaped as the API server's `fields.EscapeValue`: `\`, `,` and
/// `=` get a backslash.
pub fn selector_value(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for c in v.chars() {
        if matches!(c, '\\' | ',' | '=') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// What part of a resource one key covers.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Scope {
    /// Every object of the resource.
    Cluster,
    /// Every object in one namespace.
    Namespace(String),
    /// One object by name (`fieldSelector=metadata.name=X` upstream, as the kubelet does);
    /// `namespace` is `None` for cluster-scoped resources or a cluster-wide name selector.
    Name {
        namespace: Option<String>,
        name: String,
    },
    /// Pods bound to one node (`fieldSelector=spec.nodeName=X`, the kubelet's own pod watch).
    Node(String),
}

/// One upstream list+watch.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Key {
    pub resource: Arc<ResourceType>,
    pub scope: Scope,
}

impl Key {
    pub fn new(resource: Arc<ResourceType>, scope: Scope) -> Self {
        Key { resource, scope }
    }

    /// The namespace whose collection the upstream list+watch reads, if any.
    pub fn namespace(&self) -> Option<&str> {
        match &self.scope {
            Scope::Namespace(ns) => Some(ns),
            Scope::Name { namespace, .. } => namespace.as_deref(),
            Scope::Cluster | Scope::Node(_) => None,
        }
    }

    /// The path the upstream list and watch are sent to (without query).
    pub fn upstream_path(&self) -> String {
        self.resource.collection_path(self.namespace())
    }

    /// The field selector sent upstream; `None` for namespace and cluster keys. Values are
    /// escaped as `fields.EscapeValue` does, so a name can never add a term.
    pub fn upstream_field_selector(&self) -> Option<String> {
        match &self.scope {
            Scope::Name { name, .. } => Some(format!("metadata.name={}", selector_value(name))),
            Scope::Node(node) => Some(format!("spec.nodeName={}", selector_value(node))),
            Scope::Cluster | Scope::Namespace(_) => None,
        }
    }

    /// The field equality every object of this key satisfies, as the upstream selector
    /// guarantees: a watcher's filter need not test it.
    pub fn implied_field(&self) -> Option<(&'static str, &str)> {
        match &self.scope {
            Scope::Name { name, .. } => Some(("metadata.name", name)),
            Scope::Node(node) => Some(("spec.nodeName", node)),
            Scope::Cluster | Scope::Namespace(_) => None,
        }
    }

    /// The key this small key coalesces into (`core::coalesce`): a namespaced name key's
    /// namespace key, a node key's cluster key; `None` for every other key.
    pub fn group(&self) -> Option<Key> {
        match &self.scope {
            Scope::Name {
                namespace: Some(ns),
                ..
            } => Some(Key::new(
                self.resource.clone(),
                Scope::Namespace(ns.clone()),
            )),
            Scope::Node(_) => Some(Key::new(self.resource.clone(), Scope::Cluster)),
            _ => None,
        }
    }

    /// Whether this key is `small`'s [`Key::group`], without building it.
    pub fn is_group_of(&self, small: &Key) -> bool {
        let scopes = match (&small.scope, &self.scope) {
            (
                Scope::Name {
                    namespace: Some(ns),
                    ..
                },
                Scope::Namespace(group_ns),
            ) => ns == group_ns,
            (Scope::Node(_), Scope::Cluster) => true,
            _ => false,
        };
        scopes && small.resource == self.resource
    }

    /// A name key in one namespace (or of a cluster-scoped resource): at most one
    /// object, however the upstream pages a list of it.
    pub fn holds_at_most_one(&self) -> bool {
        match &self.scope {
            Scope::Name { namespace, .. } => namespace.is_some() || !self.resource.namespaced,
            Scope::Cluster | Scope::Namespace(_) | Scope::Node(_) => false,
        }
    }

    /// Name keys of Secrets and ConfigMaps may stop watching once their object is
    /// immutable, as the kubelet's watch-based manager does.
    pub fn may_hold_immutable(&self) -> bool {
        self.resource.group.is_empty()
            && matches!(self.resource.resource.as_str(), "secrets" | "configmaps")
            && matches!(self.scope, Scope::Name { .. })
    }

    /// Whether a key holding `objects` stops its upstream watch (parks) when immutable
    /// objects may: a namespaced name key of a Secret or ConfigMap whose objects — at
    /// least one — are all immutable. A parked key hears of a deletion or re-creation only
    /// when it is next verified, so a read of such a key is proven fresh first.
    pub fn parks<'a>(&self, objects: impl IntoIterator<Item = &'a Object>) -> bool {
        let mut objects = objects.into_iter().peekable();
        self.may_hold_immutable()
            && self.namespace().is_some()
            && objects.peek().is_some()
            && objects.all(Object::immutable)
    }
}

/// The key as an API path, as `/debug/keys` shows it: the upstream watch's path, with the
/// name as last segment for name keys and the node selector as a query for node keys.
impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.scope {
            Scope::Name { name, .. } => write!(f, "{}/{}", self.upstream_path(), name),
            Scope::Node(node) => write!(
                f,
                "{}?fieldSelector=spec.nodeName={}",
                self.upstream_path(),
                node
            ),
            Scope::Cluster | Scope::Namespace(_) => f.write_str(&self.upstream_path()),
        }
    }
}

/// Picks the key for a request. `name` is the object name of a GET by name; `field` the
/// request's field selector. A `metadata.name` equality makes a name key (the kubelet's
/// single-object watch); a cluster-wide pod list with a `spec.nodeName` equality makes a
/// node key; otherwise the namespace or the whole cluster.
pub fn route(
    resource: &Arc<ResourceType>,
    namespace: Option<&str>,
    name: Option<&str>,
    field: &FieldSelector,
) -> Key {
    let namespace = namespace
        .filter(|_| resource.namespaced)
        .map(str::to_string);
    let scope = if let Some(name) = name.or_else(|| field.equality_value("metadata.name")) {
        Scope::Name {
            namespace,
            name: name.to_string(),
        }
    } else if let (None, true, Some(node)) = (
        &namespace,
        resource.group.is_empty() && resource.resource == "pods",
        field.equality_value("spec.nodeName"),
    ) {
        Scope::Node(node.to_string())
    } else if let Some(ns) = namespace {
        Scope::Namespace(ns)
    } else {
        Scope::Cluster
    };
    Key::new(resource.clone(), scope)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::object::Schema;

    fn secrets() -> Arc<ResourceType> {
        Arc::new(ResourceType::new("", "v1", "secrets", "Secret", true))
    }
    fn pods() -> Arc<ResourceType> {
        Arc::new(ResourceType::new("", "v1", "pods", "Pod", true))
    }
    fn namespaces() -> Arc<ResourceType> {
        Arc::new(ResourceType::new(
            "",
            "v1",
            "namespaces",
            "Namespace",
            false,
        ))
    }
    fn fs(s: &str) -> FieldSelector {
        FieldSelector::parse(s).expect("valid selector")
    }

    #[test]
    fn small_keys_and_their_groups() {
        let name = |r: &Arc<ResourceType>, ns: Option<&str>, n: &str| {
            Key::new(
                r.clone(),
                Scope::Name {
                    namespace: ns.map(str::to_string),
                    name: n.into(),
                },
            )
        };
        let ns = |r: &Arc<ResourceType>, ns: &str| Key::new(r.clone(), Scope::Namespace(ns.into()));
        let cluster = |r: &Arc<ResourceType>| Key::new(r.clone(), Scope::Cluster);
        let node = Key::new(pods(), Scope::Node("n1".into()));
        let keys = [
            name(&secrets(), Some("a"), "s"),
            name(&secrets(), Some("b"), "s"),
            name(&namespaces(), None, "a"),
            name(&secrets(), None, "s"),
            ns(&secrets(), "a"),
            ns(&secrets(), "b"),
            ns(&pods(), "a"),
            cluster(&secrets()),
            cluster(&pods()),
            node.clone(),
        ];
        let want = [
            (0, Some(ns(&secrets(), "a"))),
            (1, Some(ns(&secrets(), "b"))),
            (2, None),
            (3, None),
            (4, None),
            (7, None),
            (9, Some(cluster(&pods()))),
        ];
        for (i, group) in want {
            assert_eq!(keys[i].group(), group, "{}", keys[i]);
        }
        // is_group_of agrees with group() for every pair.
        for small in &keys {
            for big in &keys {
                assert_eq!(
                    big.is_group_of(small),
                    small.group().as_ref() == Some(big),
                    "{big} of {small}"
                );
            }
        }
    }

    #[test]
    fn which_keys_park_table() {
        let obj = |kind: &str, immutable: bool| {
            let json = format!(
                r#"{{"kind":"{kind}","metadata":{{"name":"s1","namespace":"a","resourceVersion":"5"}},"immutable":{immutable}}}"#
            );
            let schema = match kind {
                "Secret" => Schema::Secret,
                "ConfigMap" => Schema::ConfigMap,
                _ => Schema::Generic,
            };
            Object::parse(bytes::Bytes::from(json), schema).expect("a valid object")
        };
        let configmaps = Arc::new(ResourceType::new("", "v1", "configmaps", "ConfigMap", true));
        let frozen = obj("Secret", true);
        let mutable = obj("Secret", false);
        let frozen_cm = obj("ConfigMap", true);
        // (key, objects, parks)
        let cases: Vec<(Key, Vec<&Object>, bool)> = vec![
            (
                route(&secrets(), Some("a"), Some("s1"), &fs("")),
                vec![&frozen],
                true,
            ),
            (
                route(&configmaps, Some("a"), Some("s1"), &fs("")),
                vec![&frozen_cm],
                true,
            ),
            // Nothing held (deleted, never created): a watch must hear of a creation.
            (
                route(&secrets(), Some("a"), Some("s1"), &fs("")),
                vec![],
                false,
            ),
            (
                route(&secrets(), Some("a"), Some("s1"), &fs("")),
                vec![&mutable],
                false,
            ),
            (
                route(&secrets(), Some("a"), Some("s1"), &fs("")),
                vec![&frozen, &mutable],
                false,
            ),
            // A cluster-wide name key holds one name across namespaces: it never parks.
            (
                route(&secrets(), None, Some("s1"), &fs("")),
                vec![&frozen],
                false,
            ),
            // Namespace keys and other kinds never park.
            (
                route(&secrets(), Some("a"), None, &fs("")),
                vec![&frozen],
                false,
            ),
            (
                route(&pods(), Some("a"), Some("s1"), &fs("")),
                vec![&frozen],
                false,
            ),
        ];
        for (key, objects, parks) in cases {
            assert_eq!(key.parks(objects), parks, "{key}");
        }
    }

    #[test]
    fn routing_table() {
        // (resource, namespace, name, field selector, expected key)
        type Case<'a> = (
            Arc<ResourceType>,
            Option<&'a str>,
            Option<&'a str>,
            &'a str,
            &'a str,
        );
        let cases: Vec<Case> = vec![
            (
                secrets(),
                Some("a"),
                Some("s1"),
                "",
                "/api/v1/namespaces/a/secrets/s1",
            ),
            (
                secrets(),
                Some("a"),
                None,
                "metadata.name=s1",
                "/api/v1/namespaces/a/secrets/s1",
            ),
            (
                secrets(),
                Some("a"),
                None,
                "metadata.name=s1,type=Opaque",
                "/api/v1/namespaces/a/secrets/s1",
            ),
            (
                secrets(),
                None,
                None,
                "metadata.name=s1",
                "/api/v1/secrets/s1",
            ),
            (
                secrets(),
                Some("a"),
                None,
                "type=Opaque",
                "/api/v1/namespaces/a/secrets",
            ),
            (
                secrets(),
                Some("a"),
                None,
                "metadata.name!=s1",
                "/api/v1/namespaces/a/secrets",
            ),
            (secrets(), None, None, "", "/api/v1/secrets"),
            (
                pods(),
                None,
                None,
                "spec.nodeName=n1",
                "/api/v1/pods?fieldSelector=spec.nodeName=n1",
            ),
            // A node selector inside a namespace stays a namespace key with a filter.
            (
                pods(),
                Some("a"),
                None,
                "spec.nodeName=n1",
                "/api/v1/namespaces/a/pods",
            ),
            (secrets(), None, None, "spec.nodeName=n1", "/api/v1/secrets"),
            (
                namespaces(),
                None,
                Some("kube-system"),
                "",
                "/api/v1/namespaces/kube-system",
            ),
            // A namespace on a cluster-scoped resource is ignored, as the API path has none.
            (namespaces(), Some("x"), None, "", "/api/v1/namespaces"),
        ];
        for (res, ns, name, sel, want) in cases {
            let key = route(&res, ns, name, &fs(sel));
            assert_eq!(key.to_string(), want, "{ns:?} {name:?} {sel:?}");
        }
    }

    #[test]
    fn upstream_request_of_each_scope() {
        let k = route(&secrets(), Some("a"), Some("s1"), &fs(""));
        assert_eq!(k.upstream_path(), "/api/v1/namespaces/a/secrets");
        assert_eq!(
            k.upstream_field_selector().as_deref(),
            Some("metadata.name=s1")
        );
        assert!(k.may_hold_immutable());
        let k = route(&pods(), None, None, &fs("spec.nodeName=n1"));
        assert_eq!(k.upstream_path(), "/api/v1/pods");
        assert_eq!(
            k.upstream_field_selector().as_deref(),
            Some("spec.nodeName=n1")
        );
        assert!(!k.may_hold_immutable());
        let k = route(&secrets(), Some("a"), None, &fs(""));
        assert_eq!(k.upstream_field_selector(), None);
        assert!(!k.may_hold_immutable());
    }

    #[test]
    fn every_upstream_segment_is_escaped() {
        // A namespace that reached here unvalidated could not turn a ConfigMaps list into
        // a Secrets list: it stays one segment.
        let cm = Arc::new(ResourceType::new("", "v1", "configmaps", "ConfigMap", true));
        assert_eq!(
            cm.collection_path(Some("kube-system/secrets?x=")),
            "/api/v1/namespaces/kube-system%2Fsecrets%3Fx%3D/configmaps"
        );
        assert_eq!(
            cm.collection_path(Some("..")),
            "/api/v1/namespaces/%2E%2E/configmaps"
        );
        assert_eq!(path_segment("."), "%2E");
        assert_eq!(path_segment("a b#c%d"), "a%20b%23c%25d");
        assert_eq!(path_segment("ok-name_1.x~"), "ok-name_1.x~");
    }

    #[test]
    fn selector_values_cannot_add_terms() {
        assert_eq!(
            selector_value("a,metadata.namespace=b"),
            "a\\,metadata.namespace\\=b"
        );
        assert_eq!(selector_value("x\\y"), "x\\\\y");
        let k = route(
            &secrets(),
            Some("n"),
            Some("a,b=c"),
            &FieldSelector::default(),
        );
        assert_eq!(
            k.upstream_field_selector().as_deref(),
            Some("metadata.name=a\\,b\\=c")
        );
        // The escaped selector parses back to the one name.
        let parsed =
            FieldSelector::parse(&k.upstream_field_selector().unwrap_or_default()).expect("parses");
        assert_eq!(parsed.equality_value("metadata.name"), Some("a,b=c"));
    }

    #[test]
    fn which_keys_hold_at_most_one_object() {
        let ns = namespaces();
        let name = |namespace: Option<&str>| Scope::Name {
            namespace: namespace.map(str::to_string),
            name: "x".into(),
        };
        let cases = [
            (Key::new(secrets(), name(Some("a"))), true),
            // One name across every namespace: one object per namespace.
            (Key::new(secrets(), name(None)), false),
            (Key::new(ns.clone(), name(None)), true),
            (Key::new(ns, Scope::Cluster), false),
            (Key::new(secrets(), Scope::Namespace("a".into())), false),
            (Key::new(secrets(), Scope::Node("n".into())), false),
        ];
        for (key, want) in cases {
            assert_eq!(key.holds_at_most_one(), want, "{key}");
        }
    }

    #[test]
    fn group_paths() {
        let d = ResourceType::new("apps", "v1", "deployments", "Deployment", true);
        assert_eq!(d.api_version(), "apps/v1");
        assert_eq!(
            d.collection_path(Some("n")),
            "/apis/apps/v1/namespaces/n/deployments"
        );
        assert_eq!(d.collection_path(None), "/apis/apps/v1/deployments");
    }
}
