//! A watch event as the key's store saw it, with the previous object and its wire form
//! encoded once (as the API server's `cachingObject`) and shared by every watcher.

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use serde_json::Value;

pub use crate::core::filter::EventType;

/// The `seq` of events a young key learned of after its list, from the upstream's replay
/// (`core::backfill`): they precede every numbered event, sit at the window's front, and
/// reach a watcher only in its start's replay.
pub const BACKFILLED_SEQ: u64 = 0;

/// One change to a key's store. `seq` orders events of one key (it only grows, across
/// relists too); `rv` is the resourceVersion the event happened at.
#[derive(Debug)]
pub struct StoreEvent {
    pub seq: u64,
    pub rv: u64,
    pub kind: EventType,
    /// The object after the change (for DELETED: the object as deleted).
    pub object: Arc<Value>,
    /// The object before the change; `None` for a creation.
    pub prev: Option<Arc<Value>>,
    /// `{"type":…,"object":…}\n`, encoded once for all watchers that send `kind` unchanged.
    pub line: Bytes,
    /// When this replica made the event (from the upstream watch, a relist or NATS): the
    /// start of `kcache_watch_event_delivery_seconds`.
    pub made: Instant,
}

impl StoreEvent {
    pub fn new(
        seq: u64,
        rv: u64,
        kind: EventType,
        object: Arc<Value>,
        prev: Option<Arc<Value>>,
    ) -> Self {
        let line = encode_line(kind.as_str(), &object);
        StoreEvent {
            seq,
            rv,
            kind,
            object,
            prev,
            line,
            made: Instant::now(),
        }
    }
}

/// Encodes one watch-stream line: `{"type":T,"object":O}` and a newline, as the API
/// server's JSON watch encoder frames events.
pub fn encode_line(kind: &str, object: &Value) -> Bytes {
    let mut out = Vec::with_capacity(128);
    out.extend_from_slice(b"{\"type\":\"");
    out.extend_from_slice(kind.as_bytes());
    out.extend_from_slice(b"\",\"object\":");
    // Writing a `Value` into a Vec cannot fail: serde_json only errors on I/O or on
    // non-string map keys, and `Value` maps always have string keys.
    let _ = serde_json::to_writer(&mut out, object);
    out.extend_from_slice(b"}\n");
    Bytes::from(out)
}

/// The resourceVersion of an object (`metadata.resourceVersion`) as a number; 0 when missing
/// or not a number (the API server's RVs are etcd revisions, decimal integers).
pub fn object_rv(obj: &Value) -> u64 {
    obj.pointer("/metadata/resourceVersion")
        .and_then(Value::as_str)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

/// `metadata.uid`, or "" when missing.
pub fn object_uid(obj: &Value) -> &str {
    obj.pointer("/metadata/uid")
        .and_then(Value::as_str)
        .unwrap_or("")
}

/// `namespace/name` (or `name` for cluster-scoped objects): the store key, as client-go's
/// `MetaNamespaceKeyFunc`.
pub fn object_key(obj: &Value) -> String {
    let name = obj
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("");
    match obj.pointer("/metadata/namespace").and_then(Value::as_str) {
        Some(ns) if !ns.is_empty() => format!("{ns}/{name}"),
        _ => name.to_string(),
    }
}

/// A copy of `obj` with `metadata.resourceVersion` set to `rv`, as the cacheWatcher does
/// for a DELETED it synthesises when an object leaves a watcher's filter.
pub fn with_rv(obj: &Value, rv: u64) -> Value {
    let mut copy = obj.clone();
    if let Some(meta) = copy.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.insert("resourceVersion".into(), Value::String(rv.to_string()));
    }
    copy
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn line_is_one_json_document_and_a_newline() {
        let line = encode_line("ADDED", &json!({"metadata": {"name": "a"}}));
        assert_eq!(
            &line[..],
            b"{\"type\":\"ADDED\",\"object\":{\"metadata\":{\"name\":\"a\"}}}\n"
        );
    }

    #[test]
    fn object_accessors_tolerate_missing_fields() {
        let o = json!({"metadata": {"name": "a", "namespace": "n", "resourceVersion": "42", "uid": "u"}});
        assert_eq!(object_rv(&o), 42);
        assert_eq!(object_uid(&o), "u");
        assert_eq!(object_key(&o), "n/a");
        let bare = json!({"metadata": {"name": "ns1", "resourceVersion": "x"}});
        assert_eq!(object_rv(&bare), 0);
        assert_eq!(object_key(&bare), "ns1");
        assert_eq!(object_rv(&json!(null)), 0);
    }

    #[test]
    fn with_rv_rewrites_only_the_resource_version() {
        let o = json!({"metadata": {"name": "a", "resourceVersion": "1"}, "data": {"k": "v"}});
        let c = with_rv(&o, 9);
        assert_eq!(c["metadata"]["resourceVersion"], "9");
        assert_eq!(c["data"], o["data"]);
    }
}
