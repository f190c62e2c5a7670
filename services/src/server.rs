//! Wires kcache together and serves it: the registry and its upstream source, the
//! Kubernetes API, and the admin endpoints (`/livez`, `/readyz`, `/metrics`, `/debug/keys`).
//!
//! `run` takes a bound listener and any shutdown future (as mini-redis's `server::run`), so
//! the binary and tests start it the same way. On shutdown: readiness fails at once,
//! watchers get a last bookmark and are closed, then the HTTP server stops with a grace period.

use std::future::Future;
use std::net::TcpListener;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use actix::Actor;
use actix_web::{web, App, HttpResponse, HttpServer};
use kcache_actors::fleet::{self, Fleet, FleetSource};
use kcache_actors::health::UpstreamHealth;
use kcache_actors::registry::{DrainAll, GetDebugKeys, Registry, StopAll};
use kcache_actors::source::UpstreamSource;
use kcache_actors::upstream_pool::{self, UpstreamClients};
use metrics_exporter_prometheus::PrometheusHandle;
use thiserror::Error;

use crate::api;
use crate::auth::Authenticator;
use crate::authz::{Attributes, Authorizer};
use crate::config::{self, Config};
use crate::proxy::Proxy;
use crate::state::ApiState;

#[derive(Debug, Error)]
pub enum Error {
    #[error("invalid configuration: {0}")]
    Config(#[from] config::Error),
    #[error("building the upstream client: {0}")]
    UpstreamClient(#[source] kube::Error),
    #[error("opening the audit log: {0}")]
    Audit(#[source] std::io::Error),
    #[error("serving HTTP: {0}")]
    Serve(#[source] std::io::Error),
    #[error("joining the fleet: {0}")]
    Fleet(#[from] kcache_actors::fleet::Error),
    #[error(transparent)]
    UpstreamPool(#[from] kcache_actors::upstream_pool::Error),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// `/readyz`: opens once the upstream answered (discovery), closes for good when shutdown
/// starts (as the API server's `shutdownCheck`), and is false while the replica can serve
/// nothing fresh: its upstream has failed past `[nats] owner_cutoff_ms` and no fleet peer
/// that reaches the API server feeds it over NATS.
pub struct Health {
    ready: AtomicBool,
    draining: AtomicBool,
    upstream: Arc<UpstreamHealth>,
    fleet: Option<Arc<Fleet>>,
}

impl Health {
    pub fn is_ready(&self) -> bool {
        let fresh = match &self.fleet {
            Some(f) => f.serves_fresh(),
            None => !self.upstream.cut_off(),
        };
        self.ready.load(Ordering::Relaxed) && !self.draining.load(Ordering::Relaxed) && fresh
    }
}

/// How the API listener serves.
pub enum Serving {
    /// HTTPS (HTTP/2 via ALPN and HTTP/1.1) — the default.
    Tls(Box<rustls::ServerConfig>),
    /// Plain HTTP, only with an explicit flag for local use: client-go sends no bearer
    /// token over plain HTTP, so kubectl cannot authenticate against it.
    Plain,
}

/// Where kcache serves: the Kubernetes API, and optionally the admin endpoints apart.
pub struct Listeners {
    pub api: TcpListener,
    /// With it, `/livez`, `/readyz`, `/metrics` and `/debug/keys` are served here (plain
    /// HTTP, no authentication: for kubelet probes and Prometheus on the pod network) and
    /// the API listener is the API server's alone: its `/livez`, `/readyz`, `/healthz`
    /// and `/metrics` are the API server's, proxied, as clients of an API server expect.
    /// Without it, the admin endpoints share the API listener (authorized as the API
    /// server authorizes its own non-resource paths).
    pub admin: Option<TcpListener>,
}

pub async fn run(
    cfg: Config,
    kube_config: kube::Config,
    listeners: Listeners,
    serving: Serving,
    metrics: PrometheusHandle,
    shutdown: impl Future<Output = ()>,
) -> Result<()> {
    kcache_actors::metrics::describe();
    crate::request_metrics::describe();
    crate::limits::describe();
    crate::fairness::describe();
    crate::fresh::describe();
    crate::process::init();
    let resources = cfg.resource_types()?;
    let (client, clients) = if cfg.cache.upstream_http2 {
        (
            upstream_pool::control_client(&kube_config)?,
            UpstreamClients::http2(
                kube_config.clone(),
                cfg.cache.upstream_streams_per_connection,
            )?,
        )
    } else {
        let client = kube::Client::try_from(kube_config.clone()).map_err(Error::UpstreamClient)?;
        (client.clone(), UpstreamClients::single(client))
    };
    let kube_config_for_probe = kube_config.clone();
    let proxy = Proxy::new(kube_config, &cfg.server, &cfg.auth).map_err(Error::UpstreamClient)?;
    let cache_cfg = Arc::new(cfg.cache.clone());
    let replica = cfg.server.replica_id.clone().unwrap_or_else(hostname);
    let clients = Arc::new(clients);
    // Whether this replica reaches the API server: its reads report to it, and a probe
    // keeps it current when there are none (readiness, fleet handover).
    let upstream_health = Arc::new(UpstreamHealth::new(Duration::from_millis(
        cfg.nats.owner_cutoff_ms,
    )));
    upstream_health.spawn_probe(clients.clone(), Duration::from_secs(2));
    let upstream = Arc::new(UpstreamSource::new(
        clients.clone(),
        cache_cfg.clone(),
        upstream_health.clone(),
    ));
    let fresh =
        crate::fresh::Freshness::new(clients, upstream.clone(), cfg.cache.freshness_probe_limit);
    let fleet = match &cfg.nats.url {
        Some(url) => {
            let keyring = fleet::load_keyring(&cfg.nats)?;
            let signing = fleet::load_signing(&cfg.nats)?;
            if signing.is_none() {
                tracing::warn!("NATS messages are not signed (nats.signing_key_file unset): anyone who may publish on kcache's subjects can inject events into mirrors");
            }
            let nats = fleet::connect(&cfg.nats, url, &replica).await?;
            tracing::info!(%url, %replica, "joining the fleet over NATS");
            Some(Fleet::new(
                nats,
                Arc::new(cfg.nats.clone()),
                replica.clone(),
                keyring,
                signing,
                upstream.clone(),
                upstream_health.clone(),
            )?)
        }
        None => None,
    };
    let registry = match &fleet {
        Some(f) => Registry::new(cache_cfg, Arc::new(FleetSource(f.clone())), replica.clone())
            .with_fleet(f.gossip(), f.interest_interval()),
        None => Registry::new(cache_cfg, upstream, replica.clone()),
    }
    .start();
    let health = Arc::new(Health {
        ready: AtomicBool::new(false),
        draining: AtomicBool::new(false),
        upstream: upstream_health,
        fleet: fleet.clone(),
    });

    crate::ttl_cache::record_ttls(
        Duration::from_secs(cfg.auth.token_cache_ttl_secs),
        Duration::from_secs(cfg.auth.authz_allow_ttl_secs),
        Duration::from_secs(cfg.auth.authz_deny_ttl_secs),
    );
    let state = web::Data::new(ApiState {
        registry: std::sync::Arc::new(registry.clone()),
        resources: std::sync::OnceLock::new(),
        read_warnings: std::sync::OnceLock::new(),
        table_columns: std::sync::OnceLock::new(),
        auth: Authenticator::new(
            client.clone(),
            Duration::from_secs(cfg.auth.token_cache_ttl_secs),
            cfg.auth.token_cache_size,
        ),
        authz: Authorizer::new(
            client.clone(),
            Duration::from_secs(cfg.auth.authz_allow_ttl_secs),
            Duration::from_secs(cfg.auth.authz_deny_ttl_secs),
            cfg.auth.authz_cache_size,
        ),
        anonymous: AtomicBool::new(false),
        audit: crate::audit::Auditor::start(&cfg.audit).map_err(Error::Audit)?,
        watch_limits: crate::limits::WatchLimits::new(
            cfg.server.max_watches,
            cfg.server.max_watches_per_user,
        ),
        fairness: crate::fairness::Fairness::new(
            cfg.server.cache_seats(),
            cfg.server.cache_queue_per_user,
            cfg.server.cache_queue_total,
            Duration::from_secs(cfg.server.cache_queue_wait_secs),
        ),
        proxy,
        cache: cfg.cache.clone(),
        server: cfg.server.clone(),
        fresh,
        dispatch_budgets: Default::default(),
    });
    // Readiness opens once the API server has answered discovery for every cached
    // resource (their scope and kind) and whether it accepts anonymous requests; until
    // then every request is proxied. In a fleet, also not before every peer's interest
    // has been heard (the replica sends its table at once, and each peer answers with its
    // own, at most an interval later if it sent one just before): a replica restarting into a
    // fleet that has coalesced a namespace must know it before its clients' requests
    // arrive, or it starts every name key of that namespace again for a second
    // (`Registry::adopt_fleet_coalescing`).
    let fleet_heard_at = fleet
        .as_ref()
        .map(|f| tokio::time::Instant::now() + f.interest_interval().mul_f64(1.2));
    {
        let state = state.clone();
        let health = health.clone();
        let registry = registry.clone();
        let publish = cfg.publish.clone();
        let anonymous_allowed_by_config = cfg.auth.anonymous;
        let anonymous_client = anonymous_client(&kube_config_for_probe)?;
        actix_web::rt::spawn(async move {
            loop {
                match start_up(&client, &anonymous_client, &resources).await {
                    Ok((found, (warnings, columns), upstream_anonymous)) => {
                        let anonymous = anonymous_allowed_by_config && upstream_anonymous;
                        tracing::info!(
                            resources = found.len(),
                            upstream_anonymous,
                            anonymous,
                            "upstream API server reachable; discovery read"
                        );
                        state.anonymous.store(anonymous, Ordering::Relaxed);
                        let _ = state.read_warnings.set(warnings);
                        let _ = state.table_columns.set(columns);
                        for r in found.values() {
                            crate::api::register_resource_metrics(r);
                        }
                        let (declared, refused) = crate::declared::keys(&publish, &found);
                        for why in refused {
                            tracing::error!("{why}; that entry is ignored");
                        }
                        if !declared.is_empty() {
                            registry.do_send(kcache_actors::registry::Declare { keys: declared });
                        }
                        let _ = state.resources.set(found);
                        if let Some(at) = fleet_heard_at {
                            tokio::time::sleep_until(at).await;
                        }
                        health.ready.store(true, Ordering::Relaxed);
                        return;
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "upstream API server not reachable yet");
                        tokio::time::sleep(Duration::from_secs(1)).await;
                    }
                }
            }
        });
    }
    // NATS subscribers' asks to keep keys published (`<prefix>.want.<key>`).
    if let Some(f) = &fleet {
        let state = state.clone();
        actix_web::rt::spawn(crate::nats_wants::serve(
            f.client().clone(),
            Arc::new(cfg.nats.clone()),
            move || state.resources.get().cloned(),
            registry.clone(),
        ));
    }
    let Listeners {
        api: listener,
        admin: admin_listener,
    } = listeners;
    let admin = web::Data::new(Admin {
        health: health.clone(),
        metrics,
        registry: registry.clone(),
        api: state.clone(),
        authorize: admin_listener.is_none(),
    });
    let addr = listener.local_addr().map_err(Error::Serve)?;
    let grace = Duration::from_secs(cfg.server.shutdown_grace_secs);
    let admin_server = match admin_listener {
        Some(l) => {
            let admin_addr = l.local_addr().map_err(Error::Serve)?;
            let admin = admin.clone();
            let server = HttpServer::new(move || {
                App::new()
                    .app_data(admin.clone())
                    .configure(admin_routes)
                    .default_service(web::to(HttpResponse::NotFound))
            })
            .disable_signals()
            .workers(1)
            .listen(l)
            .map_err(Error::Serve)?
            .run();
            tracing::info!(addr = %admin_addr, "admin endpoints listening (http)");
            Some(server)
        }
        None => None,
    };
    let admin_shared = admin_server.is_none();
    let mut server = HttpServer::new(move || {
        let app = App::new().app_data(state.clone()).app_data(admin.clone());
        let app = if admin_shared {
            app.configure(admin_routes)
        } else {
            app
        };
        app.default_service(web::to(api::handle))
    })
    .on_connect(crate::tls::connection_info)
    .disable_signals()
    // Watch events are small writes that must leave at once: without TCP_NODELAY, Nagle's
    // algorithm and the client's delayed ACK hold them up to ~40 ms (Go, and so the API
    // server, sets it by default).
    .tcp_nodelay(true)
    // A client that closed its connection is gone, as Go's server (so the API server)
    // takes it: without this, a quiet proxied watch whose client left would hold its
    // upstream connection and its proxy slot until the next upstream event.
    .h1_allow_half_closed(false)
    // actix-web's default (5 s) closes an HTTP/2 connection whose PING is not answered
    // within 5 s: a busy kubelet would lose all its watches at once (`keep_alive_secs`).
    .keep_alive(match cfg.server.keep_alive_secs {
        0 => actix_web::http::KeepAlive::Os,
        s => actix_web::http::KeepAlive::Timeout(Duration::from_secs(s)),
    })
    .shutdown_timeout(grace.as_secs());
    if cfg.server.workers > 0 {
        server = server.workers(cfg.server.workers);
    }
    let (server, scheme) = match serving {
        Serving::Tls(tls) => (server.listen_rustls_0_23(listener, *tls), "https"),
        Serving::Plain => (server.listen(listener), "http"),
    };
    let server = server.map_err(Error::Serve)?.run();
    tracing::info!(%addr, %scheme, %replica, "kcache listening");
    let handle = server.handle();
    let admin_handle = admin_server.as_ref().map(|s| s.handle());
    if let Some(admin_server) = admin_server {
        actix_web::rt::spawn(admin_server);
    }
    let mut server = std::pin::pin!(server);
    tokio::select! {
        res = &mut server => return res.map_err(Error::Serve),
        _ = shutdown => {}
    }
    tracing::info!("shutting down: readiness off, draining watchers");
    health.draining.store(true, Ordering::Relaxed);
    let watchers = registry.send(DrainAll).await.unwrap_or(0);
    tracing::info!(watchers, "watchers closed");
    if let Some(fleet) = &fleet {
        // Hand the keys over now rather than after their leases expire: stopping the keys
        // releases the leases this replica owns.
        let keys = registry.send(StopAll).await.unwrap_or(0);
        tokio::time::sleep(Duration::from_millis(500)).await;
        let _ = tokio::time::timeout(Duration::from_secs(1), fleet.client().flush()).await;
        tracing::info!(keys, "keys stopped, leases released");
    }
    // Stop accepting; in-flight requests get the grace period.
    let stop = handle.stop(true);
    let _ = tokio::time::timeout(grace, stop).await;
    let _ = server.await;
    if let Some(admin) = admin_handle {
        admin.stop(false).await;
    }
    tracing::info!("stopped");
    Ok(())
}

/// Discovery of the cached resources, and whether the API server accepts a request with
/// no credentials (`--anonymous-auth`): a 401 to one says it does not; any other answer
/// (a 403 for lack of RBAC, or a 200) says it does.
async fn start_up(
    client: &kube::Client,
    anonymous: &kube::Client,
    wanted: &[kcache_actors::core::key::ResourceType],
) -> Result<
    (
        crate::discovery::Resources,
        (
            crate::discovery::ReadWarnings,
            crate::discovery::TableColumns,
        ),
        bool,
    ),
    Box<dyn std::error::Error + Send + Sync>,
> {
    let resources = crate::discovery::resolve(client, wanted).await?;
    let probed = crate::discovery::read_probe(client, &resources).await;
    let version = client.apiserver_version().await?;
    crate::upstream_version::report(&version.git_version);
    let req = http::Request::get("/api").body(kube::client::Body::empty())?;
    let status = anonymous.send(req).await?.status();
    if status.is_server_error() {
        return Err(format!("probing anonymous access: the API server answered {status}").into());
    }
    Ok((resources, probed, status != http::StatusCode::UNAUTHORIZED))
}

/// A client with the upstream's address and TLS settings but no credentials.
fn anonymous_client(config: &kube::Config) -> Result<kube::Client> {
    let mut config = config.clone();
    config.auth_info = Default::default();
    kube::Client::try_from(config).map_err(Error::UpstreamClient)
}

struct Admin {
    health: Arc<Health>,
    metrics: PrometheusHandle,
    registry: actix::Addr<Registry>,
    api: web::Data<ApiState>,
    /// False on a separate admin listener, whose network is the access control for
    /// `/metrics` (no TokenReview per scrape); `/debug/keys` is authorized everywhere.
    authorize: bool,
}

fn admin_routes(cfg: &mut web::ServiceConfig) {
    cfg.route("/livez", web::get().to(livez))
        .route("/readyz", web::get().to(readyz))
        .route("/metrics", web::get().to(metrics_endpoint))
        .route("/debug/keys", web::get().to(debug_keys));
}

/// On the API listener, `/metrics` and `/debug/keys` are authorized as non-resource
/// paths, as the API server does its own (`/livez` and `/readyz` are open to all, as the
/// API server's `system:public-info-viewer` role makes them). Returns the caller, when it
/// was asked who it is.
async fn authorize_admin(
    req: &actix_web::HttpRequest,
    admin: &Admin,
    always: bool,
) -> Result<Option<crate::auth::UserInfo>, crate::status::ApiError> {
    if !admin.authorize && !always {
        return Ok(None);
    }
    let user = crate::access::identify(req, &admin.api).await?;
    let attrs = Attributes::NonResource {
        verb: "get".into(),
        path: req.path().to_string(),
    };
    crate::access::check(&admin.api, &user, &attrs).await?;
    Ok(Some(user))
}

async fn livez() -> HttpResponse {
    HttpResponse::Ok().content_type("text/plain").body("ok")
}

async fn readyz(admin: web::Data<Admin>) -> HttpResponse {
    if admin.health.is_ready() {
        HttpResponse::Ok().content_type("text/plain").body("ok")
    } else {
        HttpResponse::ServiceUnavailable()
            .content_type("text/plain")
            .body("not ready")
    }
}

async fn metrics_endpoint(
    req: actix_web::HttpRequest,
    admin: web::Data<Admin>,
) -> Result<HttpResponse, crate::status::ApiError> {
    authorize_admin(&req, &admin, false).await?;
    crate::process::refresh();
    Ok(HttpResponse::Ok()
        .content_type("text/plain; version=0.0.4")
        .body(admin.metrics.render()))
}

async fn debug_keys(
    req: actix_web::HttpRequest,
    admin: web::Data<Admin>,
) -> Result<HttpResponse, crate::status::ApiError> {
    // Key names are object names (a kubelet's Secrets): never without authorization, and
    // each key only to a caller the API server would let list that key's objects.
    let Some(user) = authorize_admin(&req, &admin, true).await? else {
        return Err(crate::status::ApiError::unauthorized());
    };
    let Ok(mut keys) = admin.registry.send(GetDebugKeys).await else {
        return Ok(HttpResponse::ServiceUnavailable().finish());
    };
    let mut visible = std::collections::HashMap::new();
    for id in keys
        .keys
        .iter()
        .map(|k| &k.id)
        .chain(keys.groups.iter().map(|g| &g.id))
    {
        if !visible.contains_key(id) {
            let may = may_list(&admin.api, &user, id).await?;
            visible.insert(id.clone(), may);
        }
    }
    keys.keys.retain(|k| visible[&k.id]);
    keys.groups.retain(|g| visible[&g.id]);
    Ok(HttpResponse::Ok().json(keys))
}

/// Whether `user` may list `key`'s objects as the key's own upstream request does: the
/// resource cluster-wide, else in the key's namespace, else by the key's name or node
/// selector (the Node authorizer's rules). Each question is a SubjectAccessReview through
/// the authorization cache; the broader ones come first, so an operator allowed to list a
/// resource everywhere costs one review per resource, not per key.
async fn may_list(
    state: &ApiState,
    user: &crate::auth::UserInfo,
    key: &kcache_actors::core::key::Key,
) -> Result<bool, crate::status::ApiError> {
    use kcache_actors::core::key::Scope;
    let list = |namespace: &str, name: &str, field_selector: String| Attributes::Resource {
        verb: "list".into(),
        group: key.resource.group.clone(),
        version: key.resource.version.clone(),
        resource: key.resource.resource.clone(),
        subresource: String::new(),
        namespace: namespace.into(),
        name: name.into(),
        field_selector,
        label_selector: String::new(),
    };
    let mut asks = vec![list("", "", String::new())];
    if let Some(ns) = key.namespace() {
        asks.push(list(ns, "", String::new()));
    }
    match &key.scope {
        Scope::Name { name, .. } => asks.push(list(
            key.namespace().unwrap_or(""),
            name,
            key.upstream_field_selector().unwrap_or_default(),
        )),
        Scope::Node(_) => asks.push(list(
            "",
            "",
            key.upstream_field_selector().unwrap_or_default(),
        )),
        Scope::Cluster | Scope::Namespace(_) => {}
    }
    for attrs in &asks {
        if crate::access::decide(state, user, attrs).await?.allowed {
            return Ok(true);
        }
    }
    Ok(false)
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "kcache".to_string())
}
