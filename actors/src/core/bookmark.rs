//! Bookmark scheduling: when each watcher is owed a BOOKMARK, in time buckets shared by a key.
//!
//! As the API server's `watcherBookmarkTimeBuckets` and the cacheWatcher's
//! `nextBookmarkTime`: a bookmark roughly every `frequency`, and one 2 s before the
//! watch's deadline so a client can resume exactly where the stream ended. One timer per
//! key pops due watchers instead of a timer per watcher. Times are milliseconds on any
//! monotonic clock the caller chooses.

use std::collections::BTreeMap;

use bytes::Bytes;
use serde_json::json;

use crate::core::event::encode_value_line;
use crate::core::key::ResourceType;

/// How long before a watch's deadline its last bookmark is due.
pub const PRE_TIMEOUT_MS: u64 = 2_000;
/// Bucket granularity: due times are rounded up to the next bucket.
pub const BUCKET_MS: u64 = 1_000;

/// When a watcher's next bookmark is due, or `None` when it should get no more (the
/// deadline is too close).
pub fn next_bookmark_time(now: u64, deadline: Option<u64>, frequency: u64) -> Option<u64> {
    let heartbeat = now + frequency;
    let Some(deadline) = deadline else {
        return Some(heartbeat);
    };
    let due = heartbeat.min(deadline.saturating_sub(PRE_TIMEOUT_MS));
    (due >= now).then_some(due)
}

/// Watchers of one key grouped by the bucket their bookmark is due in.
#[derive(Debug)]
pub struct BookmarkTimer<Id> {
    buckets: BTreeMap<u64, Vec<Id>>,
}

impl<Id> Default for BookmarkTimer<Id> {
    fn default() -> Self {
        BookmarkTimer {
            buckets: BTreeMap::new(),
        }
    }
}

impl<Id> BookmarkTimer<Id> {
    pub fn schedule(&mut self, id: Id, due: u64) {
        let bucket = due.div_ceil(BUCKET_MS);
        self.buckets.entry(bucket).or_default().push(id);
    }

    /// Every watcher whose bookmark is due at `now`. Watchers that went away meanwhile are
    /// returned too; the caller skips them (cheaper than removing from buckets).
    pub fn pop_due(&mut self, now: u64) -> Vec<Id> {
        let current = now / BUCKET_MS;
        let later = self.buckets.split_off(&(current + 1));
        let due = std::mem::replace(&mut self.buckets, later);
        due.into_values().flatten().collect()
    }

    pub fn len(&self) -> usize {
        self.buckets.values().map(Vec::len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.buckets.is_empty()
    }
}

/// A BOOKMARK watch line: an object of the key's kind carrying only the resourceVersion,
/// plus the `k8s.io/initial-events-end` annotation when it closes the initial events.
pub fn bookmark_line(resource: &ResourceType, rv: u64, initial_events_end: bool) -> Bytes {
    encode_value_line(
        "BOOKMARK",
        &bookmark_object(resource, rv, initial_events_end),
    )
}

/// A bookmark's object: the resource's kind carrying only the RV (and the end of initial
/// events' annotation).
pub fn bookmark_object(
    resource: &ResourceType,
    rv: u64,
    initial_events_end: bool,
) -> serde_json::Value {
    let mut metadata = json!({ "resourceVersion": rv.to_string() });
    if initial_events_end {
        metadata["annotations"] = json!({ "k8s.io/initial-events-end": "true" });
    }
    json!({
        "kind": resource.kind,
        "apiVersion": resource.api_version(),
        "metadata": metadata,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn next_time_without_deadline_is_a_heartbeat() {
        assert_eq!(next_bookmark_time(1_000, None, 60_000), Some(61_000));
    }

    #[test]
    fn next_time_moves_before_the_deadline() {
        // Deadline in 30 s: the bookmark comes 2 s before it, not in a minute.
        assert_eq!(next_bookmark_time(0, Some(30_000), 60_000), Some(28_000));
        // Deadline far away: the heartbeat wins.
        assert_eq!(next_bookmark_time(0, Some(600_000), 60_000), Some(60_000));
        // Past the pre-timeout point: no more bookmarks.
        assert_eq!(next_bookmark_time(29_000, Some(30_000), 60_000), None);
        assert_eq!(
            next_bookmark_time(28_000, Some(30_000), 60_000),
            Some(28_000)
        );
    }

    #[test]
    fn buckets_pop_only_what_is_due() {
        let mut t = BookmarkTimer::default();
        t.schedule(1, 1_500);
        t.schedule(2, 2_000);
        t.schedule(3, 5_200);
        assert_eq!(t.len(), 3);
        assert!(t.pop_due(999).is_empty());
        // 1_500 rounds up to the 2 s bucket, so it is due at 2 s with watcher 2.
        assert!(t.pop_due(1_999).is_empty());
        let mut due = t.pop_due(2_000);
        due.sort();
        assert_eq!(due, vec![1, 2]);
        assert!(t.pop_due(5_999).is_empty());
        assert_eq!(t.pop_due(6_000), vec![3]);
        assert!(t.is_empty());
    }

    #[test]
    fn bookmark_lines() {
        let r = ResourceType::new("", "v1", "secrets", "Secret", true);
        assert_eq!(
            &bookmark_line(&r, 42, false)[..],
            b"{\"type\":\"BOOKMARK\",\"object\":{\"apiVersion\":\"v1\",\"kind\":\"Secret\",\"metadata\":{\"resourceVersion\":\"42\"}}}\n"
        );
        let end = bookmark_line(&r, 7, true);
        let v: serde_json::Value = serde_json::from_slice(&end).expect("json");
        assert_eq!(
            v["object"]["metadata"]["annotations"]["k8s.io/initial-events-end"],
            "true"
        );
    }
}
