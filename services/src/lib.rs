//! kcache: a Kubernetes-compatible list/watch cache. See `docs/architecture.md`.
//!
//! - [`server`]: wiring, admin endpoints, shutdown.
//! - [`api`]: routing: each request planned ([`plan`]), authenticated and authorized
//!   ([`access`]) and served from the cache ([`serve`]), or proxied ([`proxy`]).
//! - [`state`]: what every HTTP worker shares.
//! - [`request`]: the one canonical parse of paths and queries.
//! - [`fresh`]: freshness proofs for consistent reads served from the cache.
//! - [`auth`]: TokenReview authentication.
//! - [`authz`]: SubjectAccessReview authorization.
//! - [`audit`]: audit.k8s.io Event lines for cache-served requests.
//! - [`table`]: `as=Table` answers for `kubectl get`.
//! - [`status`]: Kubernetes `Status` errors.
//! - [`tls`]: serving certificates.
//! - [`hangup`]: clients that left while their response was idle.
//! - [`upstream_version`]: the supported upstream Kubernetes versions, said at start.
//! - [`declared`]: keys kept cached (and published in a fleet) with no client asking;
//!   [`nats_wants`]: the same for keys NATS subscribers ask for.

pub mod access;
pub mod api;
pub mod audit;
pub mod auth;
pub mod authz;
pub mod cert_identity;
pub mod config;
pub mod declared;
pub mod discovery;
pub mod fairness;
pub mod fresh;
pub mod hangup;
pub mod limits;
pub mod nats_wants;
pub mod plan;
pub mod process;
pub mod proxy;
pub mod request;
pub mod request_metrics;
pub mod serve;
pub mod server;
pub mod state;
pub mod status;
pub mod table;
pub mod tls;
pub mod ttl_cache;
pub mod upstream_version;
