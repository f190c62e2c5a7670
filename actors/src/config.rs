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
    /// Stop the upstream watch of immutable Secrets/ConfigMaps once synced (the kubelet does).
    pub immutable_stop_watch: bool,
    /// Seconds between upstream re-verifications of a parked immutable object.
    pub immutable_verify_secs: u64,
    /// How long a read for a resourceVersion newer than the key's progress waits (1.20: 3 s).
    pub block_timeout_ms: u64,
    /// How long a read waits for a key's first sync before failing.
    pub sync_timeout_secs: u64,
    /// Concurrent upstream lists across all keys.
    pub upstream_max_concurrent_lists: usize,
    /// Upstream list/watch starts per second across all keys.
    pub upstream_qps: u32,
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
            immutable_stop_watch: true,
            immutable_verify_secs: 60,
            block_timeout_ms: 3_000,
            sync_timeout_secs: 30,
            upstream_max_concurrent_lists: 16,
            upstream_qps: 200,
        }
    }
}

impl CacheConfig {
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
}
