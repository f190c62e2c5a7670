//! A watcher's filter, and the cacheWatcher's `convertToWatchEvent`: the event type a
//! watcher sends is derived from whether the old and the new object pass its filter.

use serde_json::Value;

use crate::core::selector::{FieldSelector, LabelSelector};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventType {
    Added,
    Modified,
    Deleted,
}

impl EventType {
    pub fn as_str(&self) -> &'static str {
        match self {
            EventType::Added => "ADDED",
            EventType::Modified => "MODIFIED",
            EventType::Deleted => "DELETED",
        }
    }
}

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

    pub fn is_everything(&self) -> bool {
        self.label.is_empty() && self.field.is_empty()
    }

    pub fn matches(&self, obj: &Value) -> bool {
        if self.is_everything() {
            return true;
        }
        let labels = obj.pointer("/metadata/labels").and_then(Value::as_object);
        self.label.matches(labels) && self.field.matches(obj)
    }
}

/// What a watcher sends for one event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Conversion {
    /// Send the event's object as `kind`; `same_as_source` when `kind` is the event's own
    /// type, so the line encoded once for the key can be reused.
    Send {
        kind: EventType,
        same_as_source: bool,
    },
    /// The object left the filter: send the previous object as DELETED with the event's RV.
    DeletedPrev,
}

pub fn convert(
    filter: &Filter,
    kind: EventType,
    new: &Value,
    prev: Option<&Value>,
) -> Option<Conversion> {
    if kind == EventType::Deleted {
        // The deleted object is its own last state when the previous one is unknown.
        let old_passes = filter.matches(prev.unwrap_or(new));
        return old_passes.then_some(Conversion::Send {
            kind: EventType::Deleted,
            same_as_source: true,
        });
    }
    let cur = filter.matches(new);
    let old = prev.is_some_and(|p| filter.matches(p));
    let send = |k: EventType| Conversion::Send {
        kind: k,
        same_as_source: k == kind,
    };
    match (cur, old) {
        (false, false) => None,
        (true, false) => Some(send(EventType::Added)),
        (true, true) => Some(send(EventType::Modified)),
        (false, true) => Some(Conversion::DeletedPrev),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use EventType::*;

    fn obj(app: &str) -> Value {
        json!({"metadata": {"name": "a", "labels": {"app": app}}})
    }
    fn f(sel: &str) -> Filter {
        Filter::new(
            LabelSelector::parse(sel).expect("sel"),
            FieldSelector::everything(),
        )
    }

    #[test]
    fn conversion_table() {
        let web = f("app=web");
        let send = |k, same| {
            Some(Conversion::Send {
                kind: k,
                same_as_source: same,
            })
        };
        let cases: Vec<(EventType, Value, Option<Value>, Option<Conversion>)> = vec![
            (Added, obj("web"), None, send(Added, true)),
            (Added, obj("db"), None, None),
            (Modified, obj("web"), Some(obj("web")), send(Modified, true)),
            (Modified, obj("web"), Some(obj("db")), send(Added, false)),
            (
                Modified,
                obj("db"),
                Some(obj("web")),
                Some(Conversion::DeletedPrev),
            ),
            (Modified, obj("db"), Some(obj("db")), None),
            // A MODIFIED with no known previous object counts as new to the watcher.
            (Modified, obj("web"), None, send(Added, false)),
            (Deleted, obj("web"), Some(obj("web")), send(Deleted, true)),
            (Deleted, obj("db"), Some(obj("web")), send(Deleted, true)),
            (Deleted, obj("web"), Some(obj("db")), None),
            (Deleted, obj("web"), None, send(Deleted, true)),
            (Deleted, obj("db"), None, None),
        ];
        for (kind, new, prev, want) in cases {
            assert_eq!(
                convert(&web, kind, &new, prev.as_ref()),
                want,
                "{kind:?} {new} {prev:?}"
            );
        }
    }

    #[test]
    fn everything_passes_everything() {
        let all = Filter::everything();
        assert!(all.is_everything());
        assert!(all.matches(&json!({})));
        assert_eq!(
            convert(&all, Modified, &obj("x"), Some(&obj("y"))),
            Some(Conversion::Send {
                kind: Modified,
                same_as_source: true
            })
        );
    }

    #[test]
    fn field_and_label_together() {
        let filter = Filter::new(
            LabelSelector::parse("app=web").expect("l"),
            FieldSelector::parse("metadata.name=a").expect("f"),
        );
        assert!(filter.matches(&obj("web")));
        assert!(!filter.matches(&json!({"metadata": {"name": "b", "labels": {"app": "web"}}})));
    }
}
