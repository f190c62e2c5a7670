//! What every HTTP worker shares: the registry, discovery's view of the cached resources,
//! the authenticators and authorizer, the proxy, limits, audit and configuration.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use actix::Addr;
use kcache_actors::config::CacheConfig;
use kcache_actors::registry::Registry;

use crate::auth::Authenticator;
use crate::authz::Authorizer;
use crate::config::ServerConfig;
use crate::limits::WatchLimits;
use crate::proxy::Proxy;

/// Shared by every HTTP worker.
pub struct ApiState {
    /// Shared: each watcher holds it, and each clone of an actix address is three heap
    /// allocations of its own.
    pub registry: std::sync::Arc<Addr<Registry>>,
    /// The cached resources as discovery describes them; empty (everything proxied)
    /// until the upstream answered discovery.
    pub resources: std::sync::OnceLock<crate::discovery::Resources>,
    /// What the API server warns on reads of each cached resource (set with `resources`).
    pub read_warnings: std::sync::OnceLock<crate::discovery::ReadWarnings>,
    /// The upstream's Table columns by resource, set with the warnings.
    pub table_columns: std::sync::OnceLock<crate::discovery::TableColumns>,
    pub auth: Authenticator,
    pub authz: Authorizer,
    /// Requests without credentials are `system:anonymous` (else 401): set once the API
    /// server said it accepts anonymous requests, and the config allows them.
    pub anonymous: AtomicBool,
    pub proxy: Proxy,
    pub watch_limits: WatchLimits,
    /// Seats for cache-served requests, shared fairly between users.
    pub fairness: crate::fairness::Fairness,
    pub audit: crate::audit::Auditor,
    pub cache: CacheConfig,
    pub server: ServerConfig,
    /// Freshness proofs for consistent reads served from the cache.
    pub fresh: Arc<crate::fresh::Freshness>,
    /// Each resource's dispatch budget, shared by its watchers.
    pub dispatch_budgets: kcache_actors::dispatch_budget::DispatchBudgets,
}
