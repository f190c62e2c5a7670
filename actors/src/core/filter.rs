//! A watcher's filter and the event type it sends, as the API server's cacheWatcher
//! derives it (`convertToWatchEvent`) from whether the old and new objects pass.

use thiserror::Error;

use crate::core::object::{EventType, Object};
use crate::core::selector::{self, FieldSelector, LabelSelector};

#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum Error {
    /// The label selector did not parse.
    #[error("label selector: {0}")]
    LabelSelector(selector::Error),
    /// The field selector did not parse.
    #[error("field selector: {0}")]
    FieldSelector(selector::Error),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What one watcher (or list) selects: both selectors must hold.
#[derive(Debug, Clone, Default)]
pub struct Filter {
    pub label: LabelSelector,
    pub field: FieldSelector,
}

impl Filter {
    pub fn everything() -> Self {
        Self::default()
    }

    pub fn new(label: LabelSelector, field: FieldSelector) -> Self {
        Filter { label, field }
    }

    /// Parses a request's `labelSelector` and `fieldSelector` ("" for either selects
    /// everything), saying which of the two was bad.
    pub fn parse(label: &str, field: &str) -> Result<Self> {
        Ok(Filter {
            label: LabelSelector::parse(label).map_err(Error::LabelSelector)?,
            field: FieldSelector::parse(field).map_err(Error::FieldSelector)?,
        })
    }

    pub fn is_everything(&self) -> bool {
        self.label.is_empty() && self.field.is_empty()
    }

    /// Whether `obj` passes, read from its header.
    pub fn matches(&self, obj: &Object) -> bool {
        // Most watchers select everything: skip the lookups for them.
        if self.is_everything() {
            return true;
        }
        self.label.matches(obj) && self.field.matches(obj)
    }
}

/// What a watcher sends for one event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Conversion {
    /// Send the event's object with this type. `same_as_source` is true when the type is
    /// the event's own, so the line encoded once for the whole key can be reused.
    Send {
        kind: EventType,
        same_as_source: bool,
    },
    /// A DELETED synthesised because the object left the filter: the watcher sends the
    /// previous object with its resourceVersion set to the event's, so the client still
    /// sees the resourceVersions it has seen only grow.
    DeletedPrev,
}

/// The cacheWatcher's conversion. `kind` is what happened to the object in the key's
/// store, `new` the object after it (the last state, for a deletion) and `prev` the
/// object before it (`None` for a creation, or when the previous state is unknown).
///
/// The object passes now if the event did not delete it and `new` passes; it passed before
/// if `prev` passes. Neither: the watcher never hears of it. Only now: ADDED, since for
/// this watcher the object has just appeared. Both: MODIFIED. Only before: DELETED, since
/// it has just disappeared from what the watcher selects.
pub fn convert(
    filter: &Filter,
    kind: EventType,
    new: &Object,
    prev: Option<&Object>,
) -> Option<Conversion> {
    let deleted = kind == EventType::Deleted;
    let passes_now = !deleted && filter.matches(new);
    let passed_before = match prev {
        Some(prev) => filter.matches(prev),
        // A deletion with an unknown previous state: the deleted object is its own last
        // state, and the watcher must not miss the deletion of something it selected.
        None => deleted && filter.matches(new),
    };
    let send = |sent: EventType| Conversion::Send {
        kind: sent,
        same_as_source: sent == kind,
    };
    match (passes_now, passed_before) {
        (false, false) => None,
        (true, false) => Some(send(EventType::Added)),
        (true, true) => Some(send(EventType::Modified)),
        // A real deletion sends the deleted object as delivered; it already carries the
        // deletion's resourceVersion, so the shared line serves.
        (false, true) if deleted => Some(send(EventType::Deleted)),
        (false, true) => Some(Conversion::DeletedPrev),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::object::Schema;
    use serde_json::{json, Value};
    use EventType::{Added, Deleted, Modified};

    fn pod(v: Value) -> Object {
        Object::from_value(Schema::Pod, &v).expect("valid pod")
    }

    fn obj(app: &str, node: &str) -> Object {
        pod(json!({
            "metadata": {"name": "p", "namespace": "ns", "labels": {"app": app}},
            "spec": {"nodeName": node}
        }))
    }

    fn filter(label: &str, field: &str) -> Filter {
        Filter::parse(label, field).unwrap_or_else(|e| panic!("{label:?} {field:?}: {e}"))
    }

    fn send(kind: EventType, same_as_source: bool) -> Option<Conversion> {
        Some(Conversion::Send {
            kind,
            same_as_source,
        })
    }

    #[test]
    fn event_types_have_wire_names() {
        let cases = [
            (Added, "ADDED"),
            (Modified, "MODIFIED"),
            (Deleted, "DELETED"),
        ];
        for (kind, want) in cases {
            assert_eq!(kind.as_str(), want);
        }
    }

    #[test]
    fn filters_match_labels_and_fields() {
        let unlabelled = pod(json!({"metadata": {"name": "p"}, "spec": {"nodeName": "n1"}}));
        let cases: Vec<(&str, &str, Object, bool)> = vec![
            ("", "", pod(json!({})), true),
            ("app=web", "", obj("web", "n1"), true),
            ("app=web", "", obj("db", "n1"), false),
            ("app!=web", "", unlabelled.clone(), true),
            ("app", "", unlabelled.clone(), false),
            ("", "spec.nodeName=n1", obj("web", "n1"), true),
            ("", "spec.nodeName=n1", obj("web", "n2"), false),
            ("", "spec.nodeName=n1", unlabelled.clone(), true),
            ("app=web", "spec.nodeName=n1", obj("web", "n1"), true),
            ("app=web", "spec.nodeName=n1", obj("db", "n1"), false),
            ("app=web", "spec.nodeName=n1", obj("web", "n2"), false),
            ("app=web", "metadata.name=p", obj("web", "n1"), true),
            ("app=web", "metadata.name=q", obj("web", "n1"), false),
            ("app", "spec.nodeName=n1", unlabelled, false),
        ];
        for (label, field, o, want) in cases {
            assert_eq!(
                filter(label, field).matches(&o),
                want,
                "{label:?} {field:?} on {o:?}"
            );
        }
    }

    #[test]
    fn filters_know_when_they_select_everything() {
        let cases = [
            ("", "", true),
            ("", ",", true),
            ("app", "", false),
            ("", "metadata.name=a", false),
        ];
        for (label, field, want) in cases {
            assert_eq!(
                filter(label, field).is_everything(),
                want,
                "{label:?} {field:?}"
            );
        }
        assert!(Filter::everything().is_everything());
        assert!(
            Filter::new(LabelSelector::everything(), FieldSelector::everything()).is_everything()
        );
    }

    #[test]
    fn bad_selectors_say_which_one() {
        let cases = [
            ("a in (", "", "label selector: "),
            ("", "bogus", "field selector: "),
        ];
        for (label, field, prefix) in cases {
            let e = Filter::parse(label, field).expect_err("bad selector");
            assert!(e.to_string().starts_with(prefix), "{e}");
        }
    }

    #[test]
    fn conversions_follow_the_cache_watcher() {
        let web = filter("app=web", "");
        let n1 = filter("", "spec.nodeName=n1");
        let all = Filter::everything();
        // (filter, event type, object after, object before, what the watcher sends)
        type Case<'a> = (
            &'a Filter,
            EventType,
            Object,
            Option<Object>,
            Option<Conversion>,
        );
        let cases: Vec<Case> = vec![
            // creations
            (&web, Added, obj("web", "n1"), None, send(Added, true)),
            (&web, Added, obj("db", "n1"), None, None),
            (&all, Added, obj("db", "n1"), None, send(Added, true)),
            // updates: stays in, enters, leaves, stays out
            (
                &web,
                Modified,
                obj("web", "n1"),
                Some(obj("web", "n2")),
                send(Modified, true),
            ),
            (
                &web,
                Modified,
                obj("web", "n1"),
                Some(obj("db", "n1")),
                send(Added, false),
            ),
            (
                &web,
                Modified,
                obj("db", "n1"),
                Some(obj("web", "n1")),
                Some(Conversion::DeletedPrev),
            ),
            (&web, Modified, obj("db", "n1"), Some(obj("db", "n1")), None),
            (
                &all,
                Modified,
                obj("db", "n1"),
                Some(obj("web", "n1")),
                send(Modified, true),
            ),
            // the same by field: a pod scheduled onto, and moved off, the watched node
            (
                &n1,
                Modified,
                obj("web", "n1"),
                Some(obj("web", "")),
                send(Added, false),
            ),
            (
                &n1,
                Modified,
                obj("web", "n2"),
                Some(obj("web", "n1")),
                Some(Conversion::DeletedPrev),
            ),
            (
                &n1,
                Modified,
                obj("web", "n1"),
                Some(obj("web", "n1")),
                send(Modified, true),
            ),
            // an update with an unknown previous state is new to the watcher
            (&web, Modified, obj("web", "n1"), None, send(Added, false)),
            (&web, Modified, obj("db", "n1"), None, None),
            // an addition over a known previous state (a relist) counts as an update
            (
                &web,
                Added,
                obj("web", "n1"),
                Some(obj("web", "n1")),
                send(Modified, false),
            ),
            (
                &web,
                Added,
                obj("db", "n1"),
                Some(obj("web", "n1")),
                Some(Conversion::DeletedPrev),
            ),
            // deletions are judged on the previous state and send the deleted object
            (
                &web,
                Deleted,
                obj("web", "n1"),
                Some(obj("web", "n1")),
                send(Deleted, true),
            ),
            (
                &web,
                Deleted,
                obj("db", "n1"),
                Some(obj("web", "n1")),
                send(Deleted, true),
            ),
            (&web, Deleted, obj("web", "n1"), Some(obj("db", "n1")), None),
            (&web, Deleted, obj("db", "n1"), Some(obj("db", "n1")), None),
            (
                &all,
                Deleted,
                obj("db", "n1"),
                Some(obj("db", "n1")),
                send(Deleted, true),
            ),
            // ...or on the deleted object itself when the previous state is unknown
            (&web, Deleted, obj("web", "n1"), None, send(Deleted, true)),
            (&web, Deleted, obj("db", "n1"), None, None),
            (&n1, Deleted, obj("web", "n1"), None, send(Deleted, true)),
            (&n1, Deleted, obj("web", "n2"), None, None),
            (&all, Deleted, obj("db", "n1"), None, send(Deleted, true)),
        ];
        for (f, kind, new, prev, want) in cases {
            assert_eq!(
                convert(f, kind, &new, prev.as_ref()),
                want,
                "{kind:?} new={new:?} prev={prev:?} filter={f:?}"
            );
        }
    }
}
