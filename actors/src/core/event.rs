//! A watch event as the key's store saw it, with the previous object and its wire form
//! encoded once (as the API server's `cachingObject`) and shared by every watcher.

use std::sync::{Arc, OnceLock};
use std::time::Instant;

use bytes::Bytes;

use crate::core::object::{EventType, Object, ADDED_PREFIX, DELETED_PREFIX, MODIFIED_PREFIX};
use crate::core::proto::Codec;

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
    pub object: Arc<Object>,
    /// The object before the change; `None` for a creation.
    pub prev: Option<Arc<Object>>,
    /// `{"type":…,"object":…}\n`, framed once for all watchers that send `kind` unchanged.
    pub line: Bytes,
    /// When this replica made the event (from the upstream watch, a relist or NATS): the
    /// start of `kcache_watch_event_delivery_seconds`.
    pub made: Instant,
    /// The protobuf frame of the same event, made by the first protobuf watcher that
    /// sends it and shared by the rest (`None`: the object has no protobuf form).
    proto: OnceLock<Option<Bytes>>,
}

impl StoreEvent {
    /// An event of an object already shared (stored, or another event's).
    pub fn new(
        seq: u64,
        rv: u64,
        kind: EventType,
        object: Arc<Object>,
        prev: Option<Arc<Object>>,
    ) -> Self {
        let line = encode_line(kind, &object);
        StoreEvent {
            seq,
            rv,
            kind,
            object,
            prev,
            line,
            made: Instant::now(),
            proto: OnceLock::new(),
        }
    }

    /// An event of a new object: its bytes move into the event's line, so the line and
    /// the object (in the window, and in the store when it stays) are one allocation.
    pub fn of_new(
        seq: u64,
        rv: u64,
        kind: EventType,
        mut object: Object,
        prev: Option<Arc<Object>>,
    ) -> Self {
        let line = encode_line(kind, &object);
        object.share_line(&line, prefix(kind).len());
        StoreEvent {
            seq,
            rv,
            kind,
            object: Arc::new(object),
            prev,
            line,
            made: Instant::now(),
            proto: OnceLock::new(),
        }
    }
}

impl StoreEvent {
    /// This event's protobuf frame in `codec`'s resource, encoded once for all watchers.
    pub fn proto_frame(&self, codec: &Codec) -> Option<Bytes> {
        self.proto
            .get_or_init(|| {
                let msg = self.object.proto(codec)?;
                Some(codec.event(self.kind.as_str(), &msg))
            })
            .clone()
    }
}

fn prefix(kind: EventType) -> &'static [u8] {
    match kind {
        EventType::Added => ADDED_PREFIX,
        EventType::Modified => MODIFIED_PREFIX,
        EventType::Deleted => DELETED_PREFIX,
    }
}

/// One watch-stream line, `{"type":T,"object":O}` and a newline, as the API server's JSON
/// watch encoder frames events: the object's bytes between a prebuilt prefix and suffix.
pub fn encode_line(kind: EventType, object: &Object) -> Bytes {
    object.line(prefix(kind))
}

/// A watch line of an object kcache makes itself (a BOOKMARK, an ERROR's `Status`, a
/// `Table` row): `{"type":T,"object":O}` and a newline.
pub fn encode_value_line(kind: &str, object: &serde_json::Value) -> Bytes {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::object::Schema;
    use serde_json::json;

    #[test]
    fn line_is_the_object_framed_and_shared() {
        let o = Object::from_value(Schema::Generic, &json!({"metadata": {"name": "a"}})).unwrap();
        let line = encode_line(EventType::Added, &o);
        assert_eq!(
            &line[..],
            b"{\"type\":\"ADDED\",\"object\":{\"metadata\":{\"name\":\"a\"}}}\n"
        );
        let ev = StoreEvent::of_new(1, 1, EventType::Modified, o, None);
        assert!(ev.line.starts_with(MODIFIED_PREFIX));
        assert_eq!(
            ev.object.json().as_ptr(),
            ev.line[MODIFIED_PREFIX.len()..].as_ptr()
        );
    }
}
