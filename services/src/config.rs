//! kcache's configuration: defaults, then the file (`--config`, else the first of
//! `./config/kcache.toml` and `/etc/kcache/kcache.toml` that exists), then environment and
//! flags. Every field here is documented in `config/kcache.toml`.

use std::path::{Path, PathBuf};

use kcache_actors::config::CacheConfig;
use kcache_actors::core::key::ResourceType;
use serde::Deserialize;
use thiserror::Error;

#[derive(Debug, Error)]
pub enum Error {
    #[error("reading config file {path}: {source}")]
    ReadFailed {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("parsing config file {path}: {source}")]
    ParseFailed {
        path: PathBuf,
        #[source]
        source: toml::de::Error,
    },
    #[error("invalid resource {0:?} in config: want group, version and resource")]
    InvalidResource(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    pub server: ServerConfig,
    pub cache: CacheConfig,
    pub auth: AuthConfig,
    pub audit: crate::audit::AuditConfig,
    pub nats: kcache_actors::config::NatsConfig,
    /// Resources cached in addition to the defaults.
    pub resources: Vec<ResourceEntry>,
    /// Keys kept cached, and in a fleet published over NATS, with no client asking
    /// (`crate::declared`).
    pub publish: Vec<crate::declared::PublishEntry>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServerConfig {
    /// Identifies this replica in `/debug/keys` and logs; defaults to the hostname.
    pub replica_id: Option<String>,
    /// Watches without `timeoutSeconds` last this long times a random factor in [1, 2),
    /// as the API server's `--min-request-timeout`.
    pub min_request_timeout_secs: u64,
    /// On SIGTERM: readiness fails at once, watchers get a last bookmark and are closed,
    /// and the server waits this long for in-flight requests.
    pub shutdown_grace_secs: u64,
    /// Largest request body proxied upstream (the API server's limit is 3 MiB).
    pub max_request_body_bytes: usize,
    /// HTTP worker threads (0: one per core).
    pub workers: usize,
    /// Most watches open on this replica (0: no cap); past it, 429 with Retry-After.
    pub max_watches: usize,
    /// Most watches one user may hold open (0: no cap).
    pub max_watches_per_user: usize,
    /// Cache-served requests worked on at once (`crate::fairness`); 0: 16 per core. While
    /// all are taken, each user waits in a queue of their own and freed seats go to the
    /// waiting users in turn.
    pub cache_seats: usize,
    /// Most cache-served requests one user may have waiting for a seat; past it, 429 with
    /// Retry-After.
    pub cache_queue_per_user: usize,
    /// Most cache-served requests waiting in all users' queues together (0: no bound);
    /// past it, 429 with Retry-After, whoever asks.
    pub cache_queue_total: usize,
    /// Longest a cache-served request waits for a seat before its 429 (the API server's
    /// priority and fairness waits up to 15 s).
    pub cache_queue_wait_secs: u64,
    /// Most proxied read-only requests in flight (0: no cap); past it, 429 with
    /// Retry-After. As the API server's `--max-requests-inflight`.
    pub max_proxied_requests_inflight: usize,
    /// Most proxied mutating requests in flight (0: no cap). As the API server's
    /// `--max-mutating-requests-inflight`.
    pub max_proxied_mutating_requests_inflight: usize,
    /// Most proxied long-running requests (watches kcache does not serve, logs, proxy)
    /// open at once (0: no cap); the two caps above do not count them.
    pub max_proxied_long_running_requests: usize,
    /// HTTP/2: a PING every this many seconds on a quiet connection, and the connection
    /// (with every watch on it) is closed when the answer takes longer than this again;
    /// HTTP/1.1: idle keep-alive connections close after this long. 0: no pings, the
    /// OS's keep-alive. actix-web's 5 s closed a CPU-starved client's connection with its
    /// 200 watches (the 200,000-watch benchmark lost 147,000 so); Go's server, and so the
    /// API server, sends no pings at all.
    pub keep_alive_secs: u64,
}

impl ServerConfig {
    /// `cache_seats`, with 0 read as 16 per core.
    pub fn cache_seats(&self) -> usize {
        match self.cache_seats {
            0 => 16 * std::thread::available_parallelism().map_or(1, usize::from),
            n => n,
        }
    }
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            replica_id: None,
            min_request_timeout_secs: 1800,
            shutdown_grace_secs: 10,
            max_request_body_bytes: 3 * 1024 * 1024,
            workers: 0,
            max_watches: 100_000,
            max_watches_per_user: 20_000,
            cache_seats: 0,
            cache_queue_per_user: 1000,
            cache_queue_total: 20_000,
            cache_queue_wait_secs: 15,
            max_proxied_requests_inflight: 400,
            max_proxied_mutating_requests_inflight: 200,
            max_proxied_long_running_requests: 10_000,
            keep_alive_secs: 30,
        }
    }
}

#[derive(Clone, Debug, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AuthConfig {
    /// Seconds a TokenReview result is reused.
    pub token_cache_ttl_secs: u64,
    /// Most TokenReview results kept.
    pub token_cache_size: usize,
    /// A request without credentials is `system:anonymous` (group
    /// `system:unauthenticated`) and is authorized like any other, when the API server
    /// accepts anonymous requests too (asked at start: `--anonymous-auth`); otherwise, or
    /// when false, it is a 401.
    pub anonymous: bool,
    /// Seconds an allowing SubjectAccessReview answer is reused (the API server's
    /// delegated authorization default).
    pub authz_allow_ttl_secs: u64,
    /// Seconds a denying answer is reused.
    pub authz_deny_ttl_secs: u64,
    /// Most authorization decisions kept.
    pub authz_cache_size: usize,
    /// Proxy the requests of client-certificate users upstream as kcache's own identity
    /// with `Impersonate-User`/`Impersonate-Group` (that identity then needs the
    /// `impersonate` RBAC of `deploy/components/kubelet-certs`). Off: such requests get a 401 when they
    /// would be proxied, rather than reaching the API server as anonymous.
    pub impersonate_cert_users: bool,
    /// With `impersonate_cert_users`: only users whose name starts with one of these are
    /// impersonated (e.g. `["system:node:"]` for kubelets); others get a 403. Empty: any.
    /// RBAC cannot scope `impersonate` to a name prefix, so this is kcache's own fence.
    pub impersonate_user_prefixes: Vec<String>,
    /// With `impersonate_cert_users`: a certificate naming a group outside this list (e.g.
    /// `["system:nodes"]`) is not impersonated (403). Empty: any.
    pub impersonate_groups: Vec<String>,
}

impl Default for AuthConfig {
    fn default() -> Self {
        AuthConfig {
            token_cache_ttl_secs: 10,
            token_cache_size: 10_000,
            anonymous: true,
            authz_allow_ttl_secs: 10,
            authz_deny_ttl_secs: 10,
            authz_cache_size: 10_000,
            impersonate_cert_users: false,
            impersonate_user_prefixes: Vec::new(),
            impersonate_groups: Vec::new(),
        }
    }
}

/// An extra cached resource: `{ group = "apps", version = "v1", resource = "deployments" }`.
/// Its kind and scope come from the API server's discovery; `kind` and `namespaced` may
/// still be written (older configs), and a value that disagrees with discovery is
/// overridden with a warning.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResourceEntry {
    #[serde(default)]
    pub group: String,
    pub version: String,
    pub resource: String,
    #[serde(default)]
    pub kind: Option<String>,
    #[serde(default)]
    pub namespaced: Option<bool>,
}

/// Where kcache looks for its configuration file when `--config` is not given, in order.
pub const DEFAULT_PATHS: [&str; 2] = ["config/kcache.toml", "/etc/kcache/kcache.toml"];

impl Config {
    /// The first of [`DEFAULT_PATHS`] that exists.
    pub fn default_path() -> Option<PathBuf> {
        DEFAULT_PATHS
            .iter()
            .map(PathBuf::from)
            .find(|p| p.is_file())
    }

    pub fn load(path: Option<&Path>) -> Result<Self> {
        let Some(path) = path else {
            return Ok(Config::default());
        };
        let text = std::fs::read_to_string(path).map_err(|source| Error::ReadFailed {
            path: path.to_owned(),
            source,
        })?;
        toml::from_str(&text).map_err(|source| Error::ParseFailed {
            path: path.to_owned(),
            source,
        })
    }

    /// The default resources (v1 secrets, configmaps, pods, services, endpoints,
    /// namespaces, and discovery.k8s.io/v1 endpointslices, what kube-proxy watches) plus the
    /// configured ones, before discovery confirms them.
    pub fn resource_types(&self) -> Result<Vec<ResourceType>> {
        let mut out = vec![
            ResourceType::new("", "v1", "secrets", "Secret", true),
            ResourceType::new("", "v1", "configmaps", "ConfigMap", true),
            ResourceType::new("", "v1", "pods", "Pod", true),
            ResourceType::new("", "v1", "services", "Service", true),
            ResourceType::new("", "v1", "endpoints", "Endpoints", true),
            ResourceType::new("", "v1", "namespaces", "Namespace", false),
            ResourceType::new(
                "discovery.k8s.io",
                "v1",
                "endpointslices",
                "EndpointSlice",
                true,
            ),
        ];
        for r in &self.resources {
            if r.version.is_empty() || r.resource.is_empty() {
                return Err(Error::InvalidResource(format!(
                    "{}/{}/{}",
                    r.group, r.version, r.resource
                )));
            }
            out.retain(|t| {
                !(t.group == r.group && t.version == r.version && t.resource == r.resource)
            });
            // Kind and scope as configured until discovery says (`discovery::resolve`).
            out.push(ResourceType::new(
                &r.group,
                &r.version,
                &r.resource,
                r.kind.as_deref().unwrap_or(""),
                r.namespaced.unwrap_or(true),
            ));
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shipped_config_file_matches_the_defaults() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../config/kcache.toml");
        let cfg = Config::load(Some(&path)).expect("config/kcache.toml parses");
        let def = Config::default();
        assert_eq!(cfg.cache.window_capacity, def.cache.window_capacity);
        assert_eq!(cfg.cache.grace_period_secs, def.cache.grace_period_secs);
        assert_eq!(
            cfg.cache.upstream_streaming_lists,
            def.cache.upstream_streaming_lists
        );
        assert_eq!(cfg.cache.watcher_buffer, def.cache.watcher_buffer);
        assert_eq!(
            cfg.cache.freshness_probe_limit,
            def.cache.freshness_probe_limit
        );
        assert_eq!(
            cfg.cache.upstream_watch_timeout_secs,
            def.cache.upstream_watch_timeout_secs
        );
        assert_eq!(
            cfg.server.min_request_timeout_secs,
            def.server.min_request_timeout_secs
        );
        assert_eq!(
            cfg.server.max_request_body_bytes,
            def.server.max_request_body_bytes
        );
        assert_eq!(
            cfg.server.max_proxied_requests_inflight,
            def.server.max_proxied_requests_inflight
        );
        assert_eq!(
            cfg.server.max_proxied_mutating_requests_inflight,
            def.server.max_proxied_mutating_requests_inflight
        );
        assert_eq!(
            cfg.server.max_proxied_long_running_requests,
            def.server.max_proxied_long_running_requests
        );
        assert_eq!(cfg.auth.token_cache_ttl_secs, def.auth.token_cache_ttl_secs);
        assert_eq!(cfg.auth.anonymous, def.auth.anonymous);
        assert_eq!(cfg.auth.authz_allow_ttl_secs, def.auth.authz_allow_ttl_secs);
        assert_eq!(cfg.auth.authz_deny_ttl_secs, def.auth.authz_deny_ttl_secs);
        assert_eq!(cfg.resource_types().expect("valid").len(), 7);
        assert_eq!(cfg.nats.lease_ttl_ms, def.nats.lease_ttl_ms);
        assert_eq!(cfg.nats.heartbeat_ms, def.nats.heartbeat_ms);
        assert_eq!(cfg.nats.fallback_after_ms, def.nats.fallback_after_ms);
        assert_eq!(cfg.nats.listener_buffer, def.nats.listener_buffer);
        assert_eq!(cfg.nats.subject_prefix, def.nats.subject_prefix);
        assert_eq!(cfg.nats.encrypt_resources, def.nats.encrypt_resources);
        assert_eq!(cfg.nats.retain, def.nats.retain);
        assert_eq!(cfg.nats.retain_stream, def.nats.retain_stream);
        assert_eq!(
            cfg.nats.retain_max_msgs_per_key,
            def.nats.retain_max_msgs_per_key
        );
        assert_eq!(cfg.nats.retain_max_bytes, def.nats.retain_max_bytes);
        assert_eq!(cfg.nats.retain_max_age_secs, def.nats.retain_max_age_secs);
        assert_eq!(cfg.nats.retain_replicas, def.nats.retain_replicas);
    }

    #[test]
    fn extra_resources_are_added_and_validated() {
        let cfg: Config = toml::from_str(
            r#"[[resources]]
group = "apps"
version = "v1"
resource = "deployments"
"#,
        )
        .expect("parses");
        let types = cfg.resource_types().expect("valid");
        assert_eq!(types.len(), 8);
        assert!(types
            .iter()
            .any(|t| t.group == "apps" && t.resource == "deployments"));
        assert!(toml::from_str::<Config>("[cache]\nbogus = 1\n").is_err());
    }
}
