//! Metric names, after the API server's cacher metrics with `kcache_` for `apiserver_`.
//! Labels are `group` and `resource` only: never per-object labels.

pub const REGISTERED_WATCHERS: &str = "kcache_registered_watchers";
pub const CACHED_KEYS: &str = "kcache_cached_keys";
pub const UPSTREAM_WATCHES: &str = "kcache_upstream_watches";
pub const EVENTS_RECEIVED: &str = "kcache_watch_cache_events_received_total";
pub const EVENTS_DISPATCHED: &str = "kcache_watch_cache_events_dispatched_total";
pub const TERMINATED_WATCHERS: &str = "kcache_terminated_watchers_total";
pub const WINDOW_EVENTS: &str = "kcache_watch_cache_window_events";
pub const CACHED_OBJECTS: &str = "kcache_cached_objects";
pub const UPSTREAM_LISTS: &str = "kcache_upstream_lists_total";
pub const UPSTREAM_ERRORS: &str = "kcache_upstream_errors_total";
pub const RELIST_EVENTS: &str = "kcache_relist_synthetic_events_total";
pub const READ_WAIT: &str = "kcache_watch_cache_read_wait_seconds";
pub const EXPIRED_WATCHES: &str = "kcache_watch_expired_total";

/// Describes every metric once, so `/metrics` carries HELP lines.
pub fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};
    describe_gauge!(REGISTERED_WATCHERS, "Downstream watches open, by resource.");
    describe_gauge!(CACHED_KEYS, "Keys (upstream list+watch units) cached.");
    describe_gauge!(
        UPSTREAM_WATCHES,
        "Upstream watches this replica holds open."
    );
    describe_counter!(EVENTS_RECEIVED, "Events received from the upstream watch.");
    describe_counter!(
        EVENTS_DISPATCHED,
        "Watch events sent to downstream watchers."
    );
    describe_counter!(
        TERMINATED_WATCHERS,
        "Watchers closed because they did not keep up with their events."
    );
    describe_gauge!(WINDOW_EVENTS, "Events held in keys' replay windows.");
    describe_gauge!(CACHED_OBJECTS, "Objects held in keys' stores.");
    describe_counter!(
        UPSTREAM_LISTS,
        "Upstream lists (initial syncs, relists, probes)."
    );
    describe_counter!(UPSTREAM_ERRORS, "Failed upstream lists and watches.");
    describe_counter!(RELIST_EVENTS, "Synthetic events emitted by relist diffs.");
    describe_histogram!(
        READ_WAIT,
        Unit::Seconds,
        "Time cache reads waited for the key to be fresh enough."
    );
    describe_counter!(
        EXPIRED_WATCHES,
        "Watches answered with 410 Expired because their RV was too old."
    );
}
