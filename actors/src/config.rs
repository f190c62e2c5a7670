//! Tunables of the cache core, with the defaults `config/kcache.toml` documents.

use std::time::Duration;

use serde::Deserialize;

/// `[cache]` in `config/kcache.toml`.
#[derive(Clone, Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CacheConfig {
    /// Events each key keeps for watches to resume from (the watch cache's ring buffer).
    pub window_capacity: usize,
    /// Watch lines buffered per downstream watcher before it counts as unresponsive and
    /// is closed (`kcache_terminated_watchers_total`).
    pub watcher_buffer: usize,
    /// An idle watch writes a bare newline this often. actix-web's HTTP/2 dispatcher only
    /// notices a client's RST_STREAM (how client-go cancels a watch) when it writes, so
    /// this bounds how long a cancelled watch lingers. JSON stream decoders skip it.
    pub watch_keepalive_secs: u64,
    /// Seconds a key stays cached after its last reference, so a reconnecting client does
    /// not restart the upstream watch.
    pub grace_period_secs: u64,
    /// Seconds between periodic bookmarks to watchers that allow them.
    pub bookmark_frequency_secs: u64,
    /// `timeoutSeconds` of upstream watches. A 1.20 upstream sends a bookmark only shortly
    /// before a watch's timeout, so this bounds how stale a quiet key's progress gets.
    pub upstream_watch_timeout_secs: u64,
    /// Start and restart keys with streaming lists (`sendInitialEvents`) where the
    /// upstream serves them: its watch cache sends the state as events instead of building
    /// a list, and the stream goes on as the key's watch.
    pub upstream_streaming_lists: bool,
    /// Stop the upstream watch of immutable Secrets/ConfigMaps once synced (the kubelet does).
    pub immutable_stop_watch: bool,
    /// Seconds between upstream re-verifications of a parked immutable object.
    pub immutable_verify_secs: u64,
    /// How long a read for a resourceVersion newer than the key's progress waits (1.20: 3 s).
    pub block_timeout_ms: u64,
    /// Most objects a consistent read's freshness probe lists (their metadata only); a
    /// key with more is proven by a short upstream watch of its events instead — nothing
    /// read per object, about a second added to the read (`core::fresh`). 0: always list
    /// the whole key.
    pub freshness_probe_limit: u64,
    /// How long a read waits for a key's first sync before failing.
    pub sync_timeout_secs: u64,
    /// Concurrent upstream lists across all keys.
    pub upstream_max_concurrent_lists: usize,
    /// Upstream list/watch starts per second across all keys. It bounds how fast keys
    /// recover after an API server restart (every key relists): 1,000 keys took 5 s at
    /// 200/s and under 1 s at 1,000/s, against 10,000 direct clients relisting in ~1 s
    /// (docs/benchmarks.md, restart storm).
    pub upstream_qps: u32,
    /// Multiplex upstream lists and watches over HTTP/2 (as client-go does) instead of
    /// one HTTP/1.1 connection per watch.
    pub upstream_http2: bool,
    /// Streams kcache puts on one upstream HTTP/2 connection before opening another;
    /// below the server's SETTINGS_MAX_CONCURRENT_STREAMS (Go's default: 250).
    pub upstream_streams_per_connection: usize,
    /// At most one probe (a consistent upstream list a read of a newer RV asks for) per
    /// key this often: reads are client-driven, upstream lists are not free.
    pub probe_interval_ms: u64,
    /// Most keys cached at once (0: no cap). A request that would start another gets the
    /// API server's answer instead: reads are proxied, watches get 429 with Retry-After.
    pub max_keys: usize,
    /// Most keys one user's requests may have started and still hold (0: no cap).
    pub max_keys_per_user: usize,
    /// Threads (actix arbiters) the keys are spread over, a key always on the same one;
    /// 0: one per CPU. 1 runs every key on the registry's own thread.
    pub arbiters: usize,
    /// Adaptive coalescing (`core::coalesce`): once this many names of one namespace and
    /// resource are watched, and they are at least `coalesce_fraction` of the namespace's
    /// objects, one namespace key serves them all. 0 turns it off.
    pub coalesce_min_names: usize,
    pub coalesce_fraction: f64,
    /// Split back below this share of the namespace's objects (or below half of
    /// `coalesce_min_names` names), once it has held for `coalesce_split_after_secs`.
    pub coalesce_split_fraction: f64,
    pub coalesce_split_after_secs: u64,
}

impl Default for CacheConfig {
    fn default() -> Self {
        CacheConfig {
            window_capacity: 100,
            watcher_buffer: 100,
            watch_keepalive_secs: 15,
            grace_period_secs: 30,
            bookmark_frequency_secs: 60,
            upstream_watch_timeout_secs: 120,
            upstream_streaming_lists: true,
            immutable_stop_watch: true,
            immutable_verify_secs: 60,
            block_timeout_ms: 3_000,
            freshness_probe_limit: 500,
            sync_timeout_secs: 30,
            upstream_max_concurrent_lists: 16,
            upstream_qps: 1000,
            upstream_http2: true,
            upstream_streams_per_connection: 100,
            probe_interval_ms: 1_000,
            max_keys: 100_000,
            max_keys_per_user: 10_000,
            arbiters: 0,
            // Below 8 names, the few upstream watches saved are not worth a namespace's
            // objects in memory and the churn of moving watchers.
            coalesce_min_names: 8,
            coalesce_fraction: 0.25,
            coalesce_split_fraction: 0.1,
            coalesce_split_after_secs: 300,
        }
    }
}

impl CacheConfig {
    pub fn coalesce_thresholds(&self) -> crate::core::coalesce::Thresholds {
        crate::core::coalesce::Thresholds {
            min_names: self.coalesce_min_names,
            fraction: self.coalesce_fraction,
            split_fraction: self.coalesce_split_fraction,
            split_after_ms: self.coalesce_split_after_secs.saturating_mul(1000),
            count_ttl_ms: 300_000,
        }
    }

    pub fn grace_period(&self) -> Duration {
        Duration::from_secs(self.grace_period_secs)
    }
    pub fn bookmark_frequency(&self) -> Duration {
        Duration::from_secs(self.bookmark_frequency_secs.max(1))
    }
    pub fn block_timeout(&self) -> Duration {
        Duration::from_millis(self.block_timeout_ms)
    }
    pub fn sync_timeout(&self) -> Duration {
        Duration::from_secs(self.sync_timeout_secs)
    }
    pub fn probe_interval(&self) -> Duration {
        Duration::from_millis(self.probe_interval_ms)
    }
}

/// `[nats]` in `config/kcache.toml`: the multi-replica fan-out (see `docs/nats.md`).
/// Used only when kcache runs with `--nats`.
#[derive(Clone, Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NatsConfig {
    /// Server URL(s), comma-separated; `--nats`/`KCACHE_NATS_URL` override it.
    pub url: Option<String>,
    /// User/password authentication.
    pub user: Option<String>,
    pub password: Option<String>,
    /// A file holding `user`'s password (a mounted Secret), instead of `password`.
    pub password_file: Option<String>,
    /// Token authentication (a file holding the token, so it stays out of the config).
    pub token_file: Option<String>,
    /// A `.creds` file (JWT + nkey seed), as `nsc` writes.
    pub creds_file: Option<String>,
    /// A file holding an nkey seed (`SU…`).
    pub nkey_seed_file: Option<String>,
    /// CA bundle to verify the NATS server; setting it (or `require_tls`) uses TLS.
    pub tls_ca_file: Option<String>,
    /// Client certificate and key for mutual TLS.
    pub tls_cert_file: Option<String>,
    pub tls_key_file: Option<String>,
    pub require_tls: bool,
    /// First token of every subject kcache uses.
    pub subject_prefix: String,
    /// The replica's inbox prefix (answers to its JetStream and presence requests).
    /// Grant subscribe on `<inbox_prefix>.>` to kcache's NATS user only: the default
    /// `_INBOX` would be shared with every other client of the server.
    pub inbox_prefix: String,
    /// JetStream KV bucket holding one ownership lease per key (file storage, history 1).
    pub lease_bucket: String,
    /// Lease lifetime (the bucket's `max_age`); owners renew every third of it. A dead
    /// owner's keys move to another replica within about this plus `heartbeat_ms × 3`.
    pub lease_ttl_ms: u64,
    /// Copies of the lease stream in a NATS cluster (JetStream `num_replicas`, 1–5): with
    /// 3, leases survive the loss of one NATS node. A single server only takes 1.
    pub lease_replicas: u32,
    /// Owners send a heartbeat (epoch, last seq, progress RV) per key this often: a lost
    /// last event on a quiet key is noticed within one interval.
    pub heartbeat_ms: u64,
    /// Each replica publishes what changed in its refcounts this often; a replica not
    /// heard for three intervals no longer counts.
    pub interest_interval_ms: u64,
    /// An owner whose every upstream request has failed this long hands its keys to a
    /// replica that reaches the API server (if one does), and readiness turns false
    /// unless NATS still brings fresh events from such a replica.
    pub owner_cutoff_ms: u64,
    /// Each replica announces itself this often on `<prefix>.alive.<replica>`; a peer
    /// silent for three periods is asked whether it is still connected, and NATS' "no
    /// responders" answer (its connection is gone) lets its keys be taken over at once.
    pub presence_ms: u64,
    /// A mirror that has been cut off from NATS this long watches upstream itself until
    /// NATS is back.
    pub fallback_after_ms: u64,
    /// A snapshot request unanswered this long is sent again.
    pub snapshot_timeout_ms: u64,
    /// Events queued per owned key for publishing; when full, events are dropped, counted,
    /// and the mirrors resynchronise from a snapshot (the gap is detected by seq).
    pub listener_buffer: usize,
    /// Events a resynchronising mirror holds while its snapshot is on the way.
    pub mirror_buffer: usize,
    /// Largest message body sent; larger bodies are chunked. 0 = the server's
    /// `max_payload` minus room for headers.
    pub max_chunk_bytes: usize,
    /// Largest snapshot or replay a mirror reassembles from chunks; events are capped
    /// lower, at the smaller of this and `wire::MAX_EVENT_BYTES` (one object each). A
    /// snapshot is a whole key, so the default is sized from the largest key rather than
    /// the largest object (`wire::DEFAULT_MAX_MESSAGE_BYTES` says why 2 GiB). A larger
    /// message is refused, counted (`kcache_fleet_oversized_messages_total`), and the
    /// mirror treats it as a gap.
    pub max_message_bytes: usize,
    /// Resources whose objects are sealed (AEAD) on NATS.
    pub encrypt_resources: Vec<String>,
    /// Encryption keys: `id` and a file with 32 random bytes, base64-encoded.
    pub encryption_keys: Vec<EncryptionKey>,
    /// The key id new messages are sealed with; the others only open old messages.
    pub encryption_active_key: Option<String>,
    /// The fleet's signing key: a file with a 32-byte Ed25519 seed, base64-encoded, held
    /// by replicas only (`core::sign`). Set, every message a replica publishes on a key's
    /// subjects is signed, and a mirror acts only on messages signed by this key (or one
    /// of `verify_key_files`): no NATS user without it can inject or alter an event.
    pub signing_key_file: Option<String>,
    /// More public keys (32 bytes, base64) whose signatures are accepted: the next key
    /// during a rotation. `kcache nats-public-key FILE` prints a signing key's.
    pub verify_key_files: Vec<String>,
    /// Keys one NATS subscriber (one reply inbox) may ask to keep published at once on
    /// `<prefix>.want.<key>` (`docs/nats.md`).
    pub want_per_asker: usize,
    /// Subscriber asks one replica holds at once, all askers together.
    pub want_total: usize,
    /// How long an ask keeps its key when it names no `ttlSecs`; asks renew before it ends.
    pub want_ttl_secs: u64,
    /// The longest `ttlSecs` an ask may name.
    pub want_ttl_max_secs: u64,
    /// Keep each published key's recent events in a JetStream stream, so a subscriber
    /// that was away resumes from its last seq without a snapshot (`core::retain`). Costs
    /// the NATS server one stored message per event (not per heartbeat) within the limits
    /// below, and each owner a second publish per event.
    pub retain: bool,
    /// The stream's name (created, or updated to these limits, by the replicas).
    pub retain_stream: String,
    /// Messages kept per key (JetStream `max_msgs_per_subject`): one per event, one per
    /// chunk of an event over `max_chunk_bytes`.
    pub retain_max_msgs_per_key: i64,
    /// Bytes kept over all keys; the oldest events go first.
    pub retain_max_bytes: i64,
    /// How long an event is kept: a subscriber away longer takes a snapshot.
    pub retain_max_age_secs: u64,
    /// Copies of the stream in a NATS cluster (1–5).
    pub retain_replicas: u32,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EncryptionKey {
    pub id: String,
    pub file: String,
}

impl Default for NatsConfig {
    fn default() -> Self {
        NatsConfig {
            url: None,
            user: None,
            password: None,
            password_file: None,
            token_file: None,
            creds_file: None,
            nkey_seed_file: None,
            tls_ca_file: None,
            tls_cert_file: None,
            tls_key_file: None,
            require_tls: false,
            subject_prefix: "kcache".into(),
            inbox_prefix: "_KCACHE_INBOX".into(),
            lease_bucket: "kcache-leases".into(),
            lease_ttl_ms: 5_000,
            lease_replicas: 1,
            heartbeat_ms: 1_000,
            interest_interval_ms: 1_000,
            owner_cutoff_ms: 10_000,
            presence_ms: 250,
            fallback_after_ms: 10_000,
            snapshot_timeout_ms: 5_000,
            listener_buffer: 1_024,
            mirror_buffer: 10_000,
            max_chunk_bytes: 0,
            max_message_bytes: crate::core::wire::DEFAULT_MAX_MESSAGE_BYTES,
            encrypt_resources: vec!["secrets".into()],
            encryption_keys: Vec::new(),
            encryption_active_key: None,
            signing_key_file: None,
            verify_key_files: Vec::new(),
            want_per_asker: 100,
            want_total: 10_000,
            want_ttl_secs: 60,
            want_ttl_max_secs: 300,
            retain: false,
            retain_stream: "KCACHE_EVENTS".into(),
            retain_max_msgs_per_key: 10_000,
            retain_max_bytes: 1 << 30,
            retain_max_age_secs: 600,
            retain_replicas: 1,
        }
    }
}

impl NatsConfig {
    pub fn lease_ttl(&self) -> Duration {
        Duration::from_millis(self.lease_ttl_ms.max(1_000))
    }
    pub fn heartbeat(&self) -> Duration {
        Duration::from_millis(self.heartbeat_ms.max(50))
    }
    pub fn presence(&self) -> Duration {
        Duration::from_millis(self.presence_ms.max(20))
    }
    pub fn interest_interval(&self) -> Duration {
        Duration::from_millis(self.interest_interval_ms.max(50))
    }
}
