//! kcache: a Kubernetes-compatible list/watch cache. See `docs/architecture.md`.
//!
//! - [`server`]: wiring, admin endpoints, shutdown.
//! - [`api`]: serving list/get/watch from the cache, proxying the rest ([`proxy`]).
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

pub mod api;
pub mod audit;
pub mod auth;
pub mod authz;
pub mod cert_identity;
pub mod config;
pub mod discovery;
pub mod fresh;
pub mod hangup;
pub mod limits;
pub mod process;
pub mod proxy;
pub mod request;
pub mod request_metrics;
pub mod server;
pub mod status;
pub mod table;
pub mod tls;
pub mod ttl_cache;
pub mod upstream_version;
