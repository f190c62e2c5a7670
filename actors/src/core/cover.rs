//! Covering keys: a request whose own key is not running is served by a running, synced
//! key whose objects include all of its own — a name by its namespace's key or the
//! cluster key, a namespace or a node's pods by the cluster key — instead of starting
//! another upstream watch.
//!
//! A covering key serves the request with the semantics of its own key: the same
//! resourceVersion rules (the covering key's freshness and window; the API server's
//! watch cache is per resource, so its answers have the same shape), and a filter that
//! tests what the own key's upstream selector would have guaranteed ([`field_for`]).

use crate::core::key::{Key, Scope};
use crate::core::selector::FieldSelector;

/// The keys whose objects include every object of `key`, nearest (fewest objects) first.
pub fn covering(key: &Key) -> Vec<Key> {
    let namespace = |ns: &str| Key::new(key.resource.clone(), Scope::Namespace(ns.to_string()));
    let cluster = || Key::new(key.resource.clone(), Scope::Cluster);
    match &key.scope {
        Scope::Name {
            namespace: Some(ns),
            ..
        } => vec![namespace(ns), cluster()],
        Scope::Name {
            namespace: None, ..
        }
        | Scope::Node(_)
        | Scope::Namespace(_) => vec![cluster()],
        Scope::Cluster => Vec::new(),
    }
}

/// How far along a running key is, as the registry sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyState {
    NotRunning,
    /// Running, its first list not done yet.
    Syncing,
    Synced,
}

/// The key a request for `key` is served by: its own when it runs (syncing or not: it is
/// the key the request asked for, and starting nothing is always cheaper), else the
/// nearest synced covering key, else its own (to be started). A covering key that is
/// still syncing is not taken: the request would wait on a list of more objects than its
/// own key would read.
pub fn choose(key: &Key, state: impl Fn(&Key) -> KeyState) -> Key {
    if state(key) != KeyState::NotRunning {
        return key.clone();
    }
    covering(key)
        .into_iter()
        .find(|k| state(k) == KeyState::Synced)
        .unwrap_or_else(|| key.clone())
}

/// The key a request of `asked` (a watch from `from_rv`, or 0 for a read) is served by,
/// from what `look` says of the running keys (their state and `Window::replayable_from`):
/// the namespace key its names are coalesced into (`coalesced_into`) while that key is
/// synced — it serves them even while their old keys run out their grace period — or
/// while it is syncing and the name's own key is not running (coalescing was just decided:
/// the request waits for the namespace key's list rather than start a name key the move
/// would stop); else [`choose`], where a synced covering key whose window does not reach
/// `from_rv` counts as not ready yet ([`serves_from`]).
pub fn route(
    asked: &Key,
    from_rv: u64,
    coalesced_into: Option<&Key>,
    look: impl Fn(&Key) -> (KeyState, u64),
) -> Key {
    if let Some(ns) = coalesced_into {
        match look(ns).0 {
            KeyState::Synced => return ns.clone(),
            KeyState::Syncing if look(asked).0 == KeyState::NotRunning => return ns.clone(),
            _ => {}
        }
    }
    choose(asked, |k| match look(k) {
        (KeyState::Synced, reach) if k != asked && !serves_from(reach, from_rv) => {
            KeyState::Syncing
        }
        (state, _) => state,
    })
}

/// Whether a covering key whose window replays from `replayable_from`
/// (`Window::replayable_from`) serves a watch from `from_rv` (0: no replay) without a 410
/// its own key would not have given: a covering key's window holds the events of more
/// objects, so it reaches less far back.
pub fn serves_from(replayable_from: u64, from_rv: u64) -> bool {
    from_rv == 0 || from_rv >= replayable_from
}

/// The field selector a watcher or list of a request for `key` applies when `served_by`
/// serves it: on its own key, without the term the upstream selector guarantees (a name
/// key holds only that name); on a covering key, with the terms the covering key does not
/// guarantee (the name, the node, the namespace) added.
pub fn field_for(key: &Key, served_by: &Key, field: FieldSelector) -> FieldSelector {
    if key == served_by {
        return match key.implied_field() {
            Some((name, value)) => field.without_equality(name, value),
            None => field,
        };
    }
    let mut field = field;
    if let Some((name, value)) = key.implied_field() {
        field = field.with_equality(name, value);
    }
    if let (Some(ns), Scope::Cluster) = (key.namespace(), &served_by.scope) {
        field = field.with_equality("metadata.namespace", ns);
    }
    field
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::core::key::ResourceType;
    use crate::core::object::{Object, Schema};

    fn secrets() -> Arc<ResourceType> {
        Arc::new(ResourceType::new("", "v1", "secrets", "Secret", true))
    }

    fn key(scope: Scope) -> Key {
        Key::new(secrets(), scope)
    }

    fn name(ns: Option<&str>, n: &str) -> Key {
        key(Scope::Name {
            namespace: ns.map(str::to_string),
            name: n.into(),
        })
    }

    fn ns(n: &str) -> Key {
        key(Scope::Namespace(n.into()))
    }

    fn cluster() -> Key {
        key(Scope::Cluster)
    }

    #[test]
    fn covering_keys_nearest_first() {
        let cases = [
            (name(Some("a"), "s"), vec![ns("a"), cluster()]),
            (name(None, "s"), vec![cluster()]),
            (ns("a"), vec![cluster()]),
            (key(Scope::Node("n1".into())), vec![cluster()]),
            (cluster(), vec![]),
        ];
        for (k, want) in cases {
            assert_eq!(covering(&k), want, "{k}");
        }
    }

    #[test]
    fn choice_table() {
        use KeyState::*;
        let s = name(Some("a"), "s");
        // (own, namespace key, cluster key) → chosen
        let cases = [
            ((NotRunning, NotRunning, NotRunning), s.clone()),
            ((Syncing, Synced, Synced), s.clone()),
            ((Synced, Synced, Synced), s.clone()),
            ((NotRunning, Synced, Synced), ns("a")),
            ((NotRunning, Syncing, Synced), cluster()),
            ((NotRunning, NotRunning, Synced), cluster()),
            ((NotRunning, Syncing, Syncing), s.clone()),
        ];
        for ((own, namespace, whole), want) in cases {
            let state = states(&s, own, namespace, whole);
            assert_eq!(choose(&s, state), want, "{own:?} {namespace:?} {whole:?}");
        }
    }

    /// The state of `s`'s own key, its namespace key `a` and the cluster key; every other
    /// key not running.
    fn states(
        s: &Key,
        own: KeyState,
        namespace: KeyState,
        whole: KeyState,
    ) -> impl Fn(&Key) -> KeyState + '_ {
        move |k: &Key| {
            if k == s {
                own
            } else if *k == ns("a") {
                namespace
            } else if *k == cluster() {
                whole
            } else {
                KeyState::NotRunning
            }
        }
    }

    #[test]
    fn route_table() {
        use KeyState::*;
        let s = name(Some("a"), "s");
        // (own, namespace key, cluster key, coalesced into the namespace, watch from) →
        // served by; a running key's window replays from 100.
        let cases = [
            ((NotRunning, NotRunning, NotRunning, false, 0), s.clone()),
            // Coalesced: the namespace key while it is synced, even over the running own key.
            ((Synced, Synced, NotRunning, true, 0), ns("a")),
            ((Synced, Synced, NotRunning, true, 50), ns("a")),
            // Coalescing just decided, the namespace key syncing: a running own key
            // serves, a name not running waits for the namespace key.
            ((Synced, Syncing, Synced, true, 0), s.clone()),
            ((NotRunning, Syncing, Synced, true, 0), ns("a")),
            ((NotRunning, Syncing, NotRunning, true, 0), ns("a")),
            // Coalesced, the namespace key not running (not started for want of budget).
            ((NotRunning, NotRunning, Synced, true, 0), cluster()),
            // Not coalesced: the own key when it runs.
            ((Syncing, Synced, Synced, false, 0), s.clone()),
            // A covering key serves a watch its window reaches, and a read.
            ((NotRunning, Synced, Synced, false, 150), ns("a")),
            ((NotRunning, Synced, Synced, false, 0), ns("a")),
            // One whose window does not reach the watch's RV does not; the next may not either.
            ((NotRunning, Synced, Synced, false, 50), s.clone()),
            ((NotRunning, NotRunning, Synced, false, 50), s.clone()),
            // The own key serves from wherever its window is (its own 410).
            ((Synced, Synced, Synced, false, 50), s.clone()),
        ];
        for ((own, namespace, whole, coalesced, from), want) in cases {
            let state = states(&s, own, namespace, whole);
            let look = |k: &Key| (state(k), 100);
            let into = coalesced.then(|| ns("a"));
            assert_eq!(
                route(&s, from, into.as_ref(), look),
                want,
                "{own:?} {namespace:?} {whole:?} coalesced {coalesced} from {from}"
            );
        }
    }

    #[test]
    fn a_covering_key_serves_only_watches_its_window_reaches() {
        // (replayable from, watch from) → served
        let cases = [
            (0, 5, true),
            (0, 0, true),
            (100, 0, true),
            (100, 100, true),
            (100, 150, true),
            (100, 99, false),
        ];
        for (from, rv, want) in cases {
            assert_eq!(serves_from(from, rv), want, "{from} {rv}");
        }
    }

    fn secret(ns: &str, name: &str) -> Object {
        let json = format!(
            r#"{{"apiVersion":"v1","kind":"Secret","metadata":{{"name":"{name}","namespace":"{ns}","resourceVersion":"5"}}}}"#
        );
        Object::parse(json.into(), Schema::Secret).expect("secret")
    }

    #[test]
    fn a_covered_request_selects_what_its_own_key_would_hold() {
        let objects = [
            secret("a", "s"),
            secret("a", "t"),
            secret("b", "s"),
            secret("b", "t"),
        ];
        // What the covering key's upstream watch holds, then what the filter selects.
        let selected = |k: &Key, by: &Key, f: &str| -> Vec<String> {
            let f = field_for(k, by, FieldSelector::parse(f).expect("selector"));
            objects
                .iter()
                .filter(|o| by.namespace().is_none_or(|ns| o.namespace() == ns))
                .filter(|o| f.matches(o))
                .map(|o| format!("{}/{}", o.namespace(), o.name()))
                .collect()
        };
        // A GET by name has no selector: the name comes from the path.
        assert_eq!(selected(&name(Some("a"), "s"), &ns("a"), ""), ["a/s"]);
        assert_eq!(selected(&name(Some("a"), "s"), &cluster(), ""), ["a/s"]);
        assert_eq!(
            selected(&name(Some("a"), "s"), &cluster(), "metadata.name=s"),
            ["a/s"]
        );
        assert_eq!(selected(&name(None, "s"), &cluster(), ""), ["a/s", "b/s"]);
        assert_eq!(selected(&ns("b"), &cluster(), ""), ["b/s", "b/t"]);
        // On its own key the routing term is dropped: the upstream selector holds it.
        let own = field_for(
            &name(Some("a"), "s"),
            &name(Some("a"), "s"),
            FieldSelector::parse("metadata.name=s,type=x").expect("selector"),
        );
        assert_eq!(own, FieldSelector::parse("type=x").expect("selector"));
    }
}
