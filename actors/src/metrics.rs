//! Metric names, after the API server's cacher metrics with `kcache_` for `apiserver_`.
//! Labels are `group` and `resource` only: never per-object labels.

pub const REGISTERED_WATCHERS: &str = "kcache_registered_watchers";
pub const CACHED_KEYS: &str = "kcache_cached_keys";
pub const SYNCED_KEYS: &str = "kcache_synced_keys";
pub const EVENT_DELIVERY: &str = "kcache_watch_event_delivery_seconds";
pub const UPSTREAM_WATCHES: &str = "kcache_upstream_watches";
pub const UPSTREAM_CONNECTIONS: &str = "kcache_upstream_connections";
pub const EVENTS_RECEIVED: &str = "kcache_watch_cache_events_received_total";
pub const EVENTS_DISPATCHED: &str = "kcache_watch_cache_events_dispatched_total";
pub const TERMINATED_WATCHERS: &str = "kcache_terminated_watchers_total";
pub const DISPATCH_WAITS: &str = "kcache_watcher_dispatch_waits_total";
pub const WINDOW_EVENTS: &str = "kcache_watch_cache_window_events";
pub const CACHED_OBJECTS: &str = "kcache_cached_objects";
pub const UPSTREAM_LISTS: &str = "kcache_upstream_lists_total";
pub const UPSTREAM_STREAMING_LISTS: &str = "kcache_upstream_streaming_lists_total";
pub const UPSTREAM_ERRORS: &str = "kcache_upstream_errors_total";
pub const RELIST_EVENTS: &str = "kcache_relist_synthetic_events_total";
pub const READ_WAIT: &str = "kcache_watch_cache_read_wait_seconds";
pub const EXPIRED_WATCHES: &str = "kcache_watch_expired_total";
pub const PROBES: &str = "kcache_upstream_probes_total";
pub const WINDOW_BACKFILLS: &str = "kcache_window_backfills_total";
pub const KEYS_REFUSED: &str = "kcache_keys_refused_total";
pub const COVERED_REQUESTS: &str = "kcache_covered_requests_total";
pub const COALESCINGS: &str = "kcache_coalescings_total";
pub const COALESCE_SPLITS: &str = "kcache_coalesce_splits_total";
pub const COALESCE_MOVED_WATCHERS: &str = "kcache_coalesce_moved_watchers_total";
pub const MOVED_WATCH_STARTS: &str = "kcache_moved_watch_starts_total";
pub const COALESCE_SAVED_WATCHES: &str = "kcache_coalesce_upstream_watches_saved";
pub const COALESCE_REQUEST_WAITS: &str = "kcache_coalesce_request_waits_total";
pub const KEYS_STARTED: &str = "kcache_keys_started_total";
pub const CACHE_BYPASSED: &str = "kcache_cache_bypassed_total";
pub const PROTOBUF_UNENCODABLE: &str = "kcache_protobuf_unencodable_total";

/// `kcache_watch_event_delivery_seconds` samples the events whose `seq` is a multiple of
/// this, for every watcher they reach: a per-delivery sample is a per-watcher cost on the
/// hottest path.
pub const EVENT_DELIVERY_SAMPLE: u64 = 8;

/// Describes every metric once, so `/metrics` carries HELP lines, and registers the
/// unlabelled ones at zero: a fresh replica exports them (dashboards show 0, not "no
/// data"), and `rate()` sees their first increment.
pub fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};
    for g in [
        CACHED_KEYS,
        SYNCED_KEYS,
        UPSTREAM_CUT_OFF,
        UPSTREAM_WATCHES,
        CACHED_OBJECTS,
        WINDOW_EVENTS,
    ] {
        metrics::gauge!(g).increment(0.0);
    }
    describe_gauge!(REGISTERED_WATCHERS, "Downstream watches open, by resource.");
    describe_gauge!(
        UPSTREAM_VERSION_SUPPORTED,
        "1 when the upstream API server's version is within the supported range (the reference Kubernetes version and the two minors before it), 0 outside it or unreadable (absent until the upstream first answered)."
    );
    describe_gauge!(
        UPSTREAM_INFO,
        "1, labelled with the upstream API server's gitVersion."
    );
    describe_gauge!(
        UPSTREAM_CUT_OFF,
        "1 while every upstream request has failed for longer than [nats] owner_cutoff_ms (the replica can serve nothing fresh of its own)."
    );
    describe_gauge!(CACHED_KEYS, "Keys (upstream list+watch units) cached.");
    describe_gauge!(
        SYNCED_KEYS,
        "Cached keys that have completed their first list (kcache_cached_keys minus this: keys not synced yet)."
    );
    describe_histogram!(
        EVENT_DELIVERY,
        Unit::Seconds,
        "From a watch event's arrival at this replica (upstream watch, relist or NATS) to its line queued on a live watcher's connection; sampled: the events of each key whose sequence number is a multiple of 8."
    );
    describe_gauge!(
        UPSTREAM_WATCHES,
        "Upstream watches this replica holds open."
    );
    describe_gauge!(
        UPSTREAM_CONNECTIONS,
        "HTTP/2 connections to the API server carrying upstream lists and watches."
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
    describe_counter!(
        DISPATCH_WAITS,
        "Live events that found a watcher's client buffer full and waited on the resource's dispatch budget, by outcome: caught_up, closed (the wait ran out), no_budget (closed at once)."
    );
    describe_gauge!(WINDOW_EVENTS, "Events held in keys' replay windows.");
    describe_gauge!(CACHED_OBJECTS, "Objects held in keys' stores.");
    describe_counter!(
        UPSTREAM_LISTS,
        "Upstream lists (initial syncs, relists, probes), streaming lists included."
    );
    describe_counter!(
        UPSTREAM_STREAMING_LISTS,
        "Upstream streaming lists (sendInitialEvents) a key started or restarted with."
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
    describe_counter!(
        PROBES,
        "Consistent upstream lists asked for by reads of an RV newer than the key's (at most one per key per cache.probe_interval_ms)."
    );
    describe_counter!(
        WINDOW_BACKFILLS,
        "Replays for watches from before a young key's window, by outcome: extended (the window reaches back, served), upstream_refused, window_moved, inconsistent, too_many_events (410 unless another round serves them); overdue counts each watch whose replay had not answered by its deadline (served if the window reaches by then, else 410)."
    );
    describe_counter!(
        COVERED_REQUESTS,
        "Gets, lists and watches served by a running key that covers the request's own key (label by: namespace or cluster) instead of starting it."
    );
    describe_counter!(
        COALESCINGS,
        "Namespaces whose watched names were coalesced into one namespace key (cache.coalesce_*)."
    );
    describe_counter!(
        COALESCE_SPLITS,
        "Coalesced namespaces split back into name keys."
    );
    describe_gauge!(
        COALESCE_SAVED_WATCHES,
        "Upstream watches coalesced namespace and cluster keys save: the names (or nodes) they serve, fleet-wide, less their own one."
    );
    describe_counter!(
        COALESCE_REQUEST_WAITS,
        "Requests that would have started a name key and waited for their namespace's object count first, by how it went (result: coalesced, apart, timeout): decided from the requests in flight."
    );
    describe_counter!(
        KEYS_STARTED,
        "Keys started (an upstream list and watch each, in a fleet by the key's owner), by scope: name, namespace, node or cluster."
    );
    describe_counter!(
        COALESCE_MOVED_WATCHERS,
        "Watchers moved between a name key and its namespace key, either way, without closing their watch."
    );
    describe_counter!(
        MOVED_WATCH_STARTS,
        "Moved watchers as the key they joined started them (start: unchanged — their one object is at the same RV on both keys, so they start at the joined key's progress with nothing to replay; from_rv — replayed from where the old key left them, which may need a window backfill)."
    );
    describe_counter!(
        KEYS_REFUSED,
        "Requests that would have created a key past cache.max_keys or cache.max_keys_per_user (reads proxied, watches 429)."
    );
    describe_counter!(
        CACHE_BYPASSED,
        "GETs of cached resources proxied because kcache cannot answer them as the API server would, by reason (query, accept, selector, name, rv, key_budget, not_ready, protobuf)."
    );
    describe_counter!(
        PROTOBUF_UNENCODABLE,
        "Protobuf answers kcache could not make because an object has a field its schema (generated from the reference Kubernetes version) lacks: gets and lists proxied, watches ended with an error; the resource is served as JSON from then on."
    );
    for outcome in DISPATCH_WAIT_OUTCOMES {
        metrics::counter!(DISPATCH_WAITS, "outcome" => outcome).increment(0);
    }
}

/// `kcache_watcher_dispatch_waits_total`'s outcomes.
pub const DISPATCH_WAIT_OUTCOMES: [&str; 3] = ["caught_up", "closed", "no_budget"];

/// The per-resource series dashboards and alerts read, registered at zero for one cached
/// resource (`group`, `resource` as its keys label them): called for each resource once
/// discovery has said which are cached, before any key of them exists, so `rate()` sees a
/// resource's first upstream error, terminated watcher, expired watch or refused key.
pub fn register_resource(group: &str, resource: &str) {
    let labels = [
        ("group", group.to_string()),
        ("resource", resource.to_string()),
    ];
    for c in [
        EVENTS_RECEIVED,
        EVENTS_DISPATCHED,
        TERMINATED_WATCHERS,
        EXPIRED_WATCHES,
        UPSTREAM_LISTS,
        UPSTREAM_STREAMING_LISTS,
        UPSTREAM_ERRORS,
        KEYS_REFUSED,
    ] {
        metrics::counter!(c, &labels).increment(0);
    }
    metrics::gauge!(REGISTERED_WATCHERS, &labels).increment(0.0);
    // A registered histogram is exported (empty buckets) before its first sample.
    let _ = metrics::histogram!(EVENT_DELIVERY, &labels);
}

pub const FLEET_OWNED_KEYS: &str = "kcache_fleet_owned_keys";
pub const FLEET_MIRRORED_KEYS: &str = "kcache_fleet_mirrored_keys";
pub const FLEET_LOCAL_KEYS: &str = "kcache_fleet_local_fallback_keys";
pub const NATS_IN: &str = "kcache_nats_messages_received_total";
pub const NATS_OUT: &str = "kcache_nats_messages_published_total";
pub const NATS_CONNECTED: &str = "kcache_nats_connected";
pub const NATS_RECONNECTS: &str = "kcache_nats_reconnects_total";
pub const FLEET_GAPS: &str = "kcache_fleet_gaps_total";
pub const FLEET_RESYNCS: &str = "kcache_fleet_resyncs_total";
pub const FLEET_STALE: &str = "kcache_fleet_stale_epoch_rejected_total";
pub const FLEET_OWNERSHIP_CHANGES: &str = "kcache_fleet_ownership_changes_total";
pub const FLEET_LISTENER_DROPS: &str = "kcache_fleet_listener_dropped_events_total";
pub const FLEET_BAD_MESSAGES: &str = "kcache_fleet_bad_messages_total";
pub const FLEET_OVERSIZED: &str = "kcache_fleet_oversized_messages_total";
pub const FLEET_REJECTED: &str = "kcache_fleet_rejected_messages_total";
pub const FLEET_PEERS_GONE: &str = "kcache_fleet_peers_gone_total";
/// Full interest tables this replica sent, by `reason` ([`INTEREST_FULL_REASONS`]).
pub const FLEET_INTEREST_FULL: &str = "kcache_fleet_interest_full_tables_total";
pub const FLEET_INTEREST_BEHIND: &str = "kcache_fleet_interest_behind_total";
pub const FLEET_INTEREST_DROPPED: &str = "kcache_fleet_interest_dropped_total";
/// Subscribers' resume requests by `result` (`answered`, `failed`, `refused`, `busy`).
pub const NATS_RESUMES: &str = "kcache_nats_resumes_total";
pub const UPSTREAM_CUT_OFF: &str = "kcache_upstream_cut_off";
pub const UPSTREAM_VERSION_SUPPORTED: &str = "kcache_upstream_version_supported";
pub const UPSTREAM_INFO: &str = "kcache_upstream_info";

/// Every `change` label of [`FLEET_OWNERSHIP_CHANGES`] (`fleet::key_task`).
pub const OWNERSHIP_CHANGES: [&str; 5] =
    ["acquired", "lost", "taken-over", "recreated", "handed-over"];
/// Every `reason` label of [`FLEET_RESYNCS`] (`fleet::key_task`).
pub const RESYNC_REASONS: [&str; 4] = ["start", "gap", "new-owner", "retry"];
/// Every `reason` label of [`FLEET_INTEREST_FULL`] (`registry`).
pub const INTEREST_FULL_REASONS: [&str; 3] = ["start", "new-peer", "asked"];
/// Every `reason` label of [`FLEET_REJECTED`] (`fleet::codec`, `fleet::key_task`,
/// `fleet::presence`).
pub const REJECTED_REASONS: [&str; 6] = [
    "unauthenticated",
    "plaintext",
    "reply-subject",
    "unsigned",
    "forged",
    "unconfirmed-epoch",
];

/// Describes the fan-out metrics (only registered when kcache runs with `--nats`: a
/// replica outside a fleet exports none, so `kcache_nats_connected == 0` never fires for
/// it), and registers them at zero, the labelled ones for each of their label values.
pub fn describe_fleet() {
    use metrics::{describe_counter, describe_gauge};
    for g in [FLEET_OWNED_KEYS, FLEET_MIRRORED_KEYS, FLEET_LOCAL_KEYS] {
        metrics::gauge!(g).increment(0.0);
    }
    for c in [
        NATS_IN,
        NATS_OUT,
        NATS_RECONNECTS,
        FLEET_GAPS,
        FLEET_STALE,
        FLEET_LISTENER_DROPS,
        FLEET_BAD_MESSAGES,
        FLEET_OVERSIZED,
        FLEET_PEERS_GONE,
        FLEET_INTEREST_BEHIND,
        FLEET_INTEREST_DROPPED,
    ] {
        metrics::counter!(c).increment(0);
    }
    for reason in INTEREST_FULL_REASONS {
        metrics::counter!(FLEET_INTEREST_FULL, "reason" => reason).increment(0);
    }
    for change in OWNERSHIP_CHANGES {
        metrics::counter!(FLEET_OWNERSHIP_CHANGES, "change" => change).increment(0);
    }
    for reason in RESYNC_REASONS {
        metrics::counter!(FLEET_RESYNCS, "reason" => reason).increment(0);
    }
    for reason in REJECTED_REASONS {
        metrics::counter!(FLEET_REJECTED, "reason" => reason).increment(0);
    }
    for result in ["answered", "failed", "refused", "busy"] {
        metrics::counter!(NATS_RESUMES, "result" => result).increment(0);
    }
    describe_counter!(
        NATS_RESUMES,
        "Subscribers' resume requests (<prefix>.resume.<key>) by result: answered from the retained log, failed (the log could not be read: the subscriber takes a snapshot), refused (not a key, or a reply subject outside its reply space), busy."
    );
    describe_gauge!(
        FLEET_OWNED_KEYS,
        "Keys this replica owns: it holds their upstream watch and publishes their events."
    );
    describe_gauge!(
        FLEET_MIRRORED_KEYS,
        "Keys this replica mirrors from their owner over NATS."
    );
    describe_gauge!(
        FLEET_LOCAL_KEYS,
        "Keys this replica watches upstream itself because NATS is unreachable."
    );
    describe_counter!(
        NATS_IN,
        "NATS messages received (events, heartbeats, snapshot chunks, requests)."
    );
    describe_counter!(NATS_OUT, "NATS messages published.");
    describe_gauge!(NATS_CONNECTED, "1 while connected to NATS.");
    describe_counter!(NATS_RECONNECTS, "Reconnections to NATS after a disconnect.");
    describe_counter!(
        FLEET_GAPS,
        "Sequence gaps detected by mirrors (lost events or a heartbeat ahead)."
    );
    describe_counter!(
        FLEET_RESYNCS,
        "Snapshot resynchronisations requested by mirrors, by reason."
    );
    describe_counter!(
        FLEET_STALE,
        "Messages rejected because they came from a fenced-off owner (lower epoch)."
    );
    describe_counter!(
        FLEET_OWNERSHIP_CHANGES,
        "Keys this replica took over or gave up."
    );
    describe_counter!(
        FLEET_LISTENER_DROPS,
        "Events an owner could not queue for publishing (mirrors resync)."
    );
    describe_counter!(
        FLEET_BAD_MESSAGES,
        "NATS messages that could not be decoded or opened."
    );
    describe_counter!(
        FLEET_REJECTED,
        "NATS messages refused, by reason: a seal that does not authenticate its headers and body (unauthenticated), plaintext for a sealed resource (plaintext), a request whose reply subject is outside kcache's reply space (reply-subject), a message without a signature (unsigned) or with one that does not verify (forged) where the fleet signs (nats.signing_key_file)."
    );
    describe_counter!(
        FLEET_PEERS_GONE,
        "Peers whose NATS connection was found gone (no responders to their presence): their keys are taken over without waiting for their leases to expire."
    );
    describe_counter!(
        FLEET_INTEREST_FULL,
        "Full interest tables this replica published, by reason: its start, a new peer (or a peer restarted), a peer that missed one of its messages asked (asked). Between them it publishes only what changed."
    );
    describe_counter!(
        FLEET_INTEREST_BEHIND,
        "Interest messages from a peer that showed this replica had missed one (a number skipped, a table part out of its run): it asks that peer for its full table."
    );
    describe_counter!(
        FLEET_INTEREST_DROPPED,
        "Intervals of this replica's interest not published because the queue to NATS was full (peers ask for its table again)."
    );
    describe_counter!(
        FLEET_OVERSIZED,
        "Chunked NATS messages a mirror refused as over [nats] max_message_bytes (also bad messages)."
    );
}
