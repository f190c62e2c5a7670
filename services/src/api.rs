//! The Kubernetes-compatible API: GET list/get/watch of cached resources is served from
//! the cache; everything else is proxied. Validation happens once, here, and errors are
//! Kubernetes `Status` objects.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use actix::Addr;
use actix_web::http::header::HeaderMap;
use actix_web::{web, HttpRequest, HttpResponse};
use bytes::Bytes;
use kcache_actors::cached_object::{self, Read};
use kcache_actors::config::CacheConfig;
use kcache_actors::core::cover;
use kcache_actors::core::event::encode_value_line;
use kcache_actors::core::filter::Filter;
use kcache_actors::core::key::{route, Key, ResourceType};
use kcache_actors::core::object::{self, EventType, Object};
use kcache_actors::core::rv::{plan_list, plan_watch, ListPlan, Rv};
use kcache_actors::core::selector::{FieldSelector, LabelSelector};
use kcache_actors::registry::{Acquire, Hold, Registry, Release};
use kcache_actors::watcher::{Encoder, Watcher, WatcherSpec};
use serde_json::{json, Value};

use crate::auth::{self, Authenticator, UserInfo};
use crate::authz::{self, Attributes, Authorizer};
use crate::config::ServerConfig;
use crate::limits::WatchLimits;
use crate::proxy::Proxy;
use crate::request::{is_keyable_name, parse_path, parse_query, Query, ResourcePath};
use crate::request_metrics::{self, ServedBy};
use crate::status::ApiError;
use crate::table::{self, IncludeObject, Negotiated, TableVersion};
use kcache_actors::core::proto::{self, Codec};

/// The encoding a cache-served answer is written in, from the request's Accept header.
enum Format {
    Json,
    Table(TableVersion),
    /// A built-in kind, as protobuf.
    Protobuf(Arc<Codec>),
}

/// Shared by every HTTP worker.
pub struct ApiState {
    pub registry: Addr<Registry>,
    /// The cached resources as discovery describes them; empty (everything proxied)
    /// until the upstream answered discovery.
    pub resources: std::sync::OnceLock<crate::discovery::Resources>,
    /// What the API server warns on reads of each cached resource (set with `resources`).
    pub read_warnings: std::sync::OnceLock<crate::discovery::ReadWarnings>,
    pub auth: Authenticator,
    pub authz: Authorizer,
    /// Requests without credentials are `system:anonymous` (else 401): set once the API
    /// server said it accepts anonymous requests, and the config allows them.
    pub anonymous: AtomicBool,
    pub proxy: Proxy,
    pub watch_limits: WatchLimits,
    pub audit: crate::audit::Auditor,
    pub cache: CacheConfig,
    pub server: ServerConfig,
    /// Freshness proofs for consistent reads served from the cache.
    pub fresh: Arc<crate::fresh::Freshness>,
}

/// What a cache-served request turned out to need.
enum Served {
    Response(HttpResponse),
    /// Not the cache's to answer (a consistent read, paging, a key that cannot sync): proxy
    /// it. The reason labels `kcache_cache_bypassed_total`.
    Forward(&'static str),
}

pub async fn handle(
    req: HttpRequest,
    body: web::Payload,
    state: web::Data<ApiState>,
) -> Result<HttpResponse, ApiError> {
    let started = std::time::Instant::now();
    let (served, result) = serve_or_proxy(&req, body, &state).await;
    let code = match &result {
        Ok(r) => r.status().as_u16(),
        Err(e) => e.code,
    };
    request_metrics::record(
        req.method(),
        req.path(),
        req.query_string(),
        served,
        code,
        started,
    );
    result
}

/// Serves the request from the cache or proxies it; says which.
async fn serve_or_proxy(
    req: &HttpRequest,
    body: web::Payload,
    state: &ApiState,
) -> (ServedBy, Result<HttpResponse, ApiError>) {
    // Only cache-served requests are kcache's to authorize: everything proxied carries the
    // client's own credentials and the API server decides. Impersonation (`kubectl --as`)
    // is never ignored: such requests go upstream, which authorizes `impersonate` and
    // applies it.
    let impersonating = req
        .headers()
        .keys()
        .any(|h| h.as_str().starts_with("impersonate-"));
    if req.method() == actix_web::http::Method::GET && !impersonating {
        if let Some(rp) = parse_path(req.path()) {
            // The resource's id, built once for the resource and its read warnings.
            let id = (rp.group.clone(), rp.version.clone(), rp.resource.clone());
            let resource = state
                .resources
                .get()
                .and_then(|r| r.get(&id))
                .filter(|r| fits_scope(&rp, r))
                .cloned();
            if let (Some(resource), None) = (resource, &rp.subresource) {
                let received = std::time::SystemTime::now();
                // One parse of the query, used to authorize and then to serve.
                let q = parse_query(req.query_string());
                let accept = req
                    .headers()
                    .get("accept")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("");
                // The kind's protobuf forms, if it has any: looked up only for a client
                // that mentions protobuf at all (JSON clients pay nothing for it).
                let codec = mentions_protobuf(accept)
                    .then(|| Codec::for_kind(&resource.group, &resource.version, &resource.kind))
                    .flatten();
                let format = match (q.opaque, table::negotiate(accept, codec.is_some())) {
                    (true, _) => Err("query"),
                    (false, Negotiated::Forward) => Err("accept"),
                    (false, Negotiated::Json) => Ok(Format::Json),
                    (false, Negotiated::Table(v)) => Ok(Format::Table(v)),
                    (false, Negotiated::Protobuf) => match codec {
                        Some(c) => Ok(Format::Protobuf(Arc::new(c))),
                        None => Err("accept"),
                    },
                };
                match format {
                    Ok(format) => {
                        let warnings = state.read_warnings.get().and_then(|w| w.get(&id));
                        match serve_or_forward(req, state, &rp, &q, format, resource, received)
                            .await
                        {
                            Ok(None) => {}
                            Ok(Some(r)) => {
                                return (ServedBy::Cache, Ok(with_warnings(r, warnings)))
                            }
                            // As the API server: authorized requests carry the resource's
                            // read warnings whatever their outcome; refused ones do not.
                            Err(e) if warnings.is_some() && !matches!(e.code, 401 | 403) => {
                                let r = actix_web::ResponseError::error_response(&e);
                                return (ServedBy::Cache, Ok(with_warnings(r, warnings)));
                            }
                            Err(e) => return (ServedBy::Cache, Err(e)),
                        }
                    }
                    Err(reason) => bypassed(&resource, reason),
                }
            }
        }
    }
    let result = match (cert_auth(req), req.headers().contains_key("authorization")) {
        // A certificate with a name is who the API server would see, whatever token comes
        // with it; it cannot be forwarded: the request goes as kcache impersonating that
        // user, or not at all.
        (CertAuth::User(user), _) => state.proxy.forward_as(req, body, &user).await,
        // A certificate that failed authentication leaves only a token; without one the
        // API server answers 401, never anonymous.
        (CertAuth::Failed, false) => Err(ApiError::unauthorized()),
        _ => state.proxy.forward(req, body).await,
    };
    (ServedBy::Proxy, result)
}

/// `res` with the resource's read warnings appended (`Warning` headers, as the API
/// server sends them).
fn with_warnings(mut res: HttpResponse, warnings: Option<&Vec<String>>) -> HttpResponse {
    for w in warnings.into_iter().flatten() {
        if let Ok(v) = actix_web::http::header::HeaderValue::from_str(w) {
            res.headers_mut()
                .append(actix_web::http::header::WARNING, v);
        }
    }
    res
}

/// Whether an Accept header names protobuf (media types are case-insensitive).
fn mentions_protobuf(accept: &str) -> bool {
    const PB: &[u8] = b"vnd.kubernetes.protobuf";
    accept
        .as_bytes()
        .windows(PB.len())
        .any(|w| w.eq_ignore_ascii_case(PB))
}

/// Every `reason` [`bypassed`] counts.
pub const BYPASS_REASONS: [&str; 9] = [
    "query",
    "accept",
    "selector",
    "name",
    "rv",
    "key_budget",
    "not_ready",
    "not_fresh",
    "protobuf",
];

/// Registers a cached resource's series at zero (its cache metrics, and its bypasses for
/// each reason), so dashboards and alerts see their first increment: called once per
/// resource when discovery has said which are cached, before any request is served from
/// the cache.
pub fn register_resource_metrics(resource: &ResourceType) {
    kcache_actors::metrics::register_resource(&resource.group, &resource.resource);
    for reason in BYPASS_REASONS {
        metrics::counter!(
            kcache_actors::metrics::CACHE_BYPASSED,
            "group" => resource.group.clone(),
            "resource" => resource.resource.clone(),
            "reason" => reason,
        )
        .increment(0);
    }
}

/// Counts a GET of a cached resource that goes upstream instead, by why.
fn bypassed(resource: &ResourceType, reason: &'static str) {
    metrics::counter!(
        kcache_actors::metrics::CACHE_BYPASSED,
        "group" => resource.group.clone(),
        "resource" => resource.resource.clone(),
        "reason" => reason,
    )
    .increment(1);
}

/// Authenticates, authorizes, serves from the cache and audits; `None` when the request
/// turned out to be the API server's to answer.
async fn serve_or_forward(
    req: &HttpRequest,
    state: &ApiState,
    rp: &ResourcePath,
    q: &Query,
    format: Format,
    resource: Arc<ResourceType>,
    received: SystemTime,
) -> Result<Option<HttpResponse>, ApiError> {
    let user = identify(req, state).await?;
    let attrs = resource_attributes(rp, q);
    let decision = check(state, &user, &attrs).await;
    let served = match &decision {
        Err(e) => Err(e.clone()),
        Ok(()) => serve_cached(state, rp, q, &user, format, resource.clone()).await,
    };
    if !matches!(served, Ok(Served::Forward(_))) {
        let (allowed, reason) = match &decision {
            Ok(()) => (true, ""),
            Err(e) => (false, e.message.as_str()),
        };
        state.audit.record(crate::audit::Record {
            user: &user,
            attrs: &attrs,
            request_uri: req
                .uri()
                .path_and_query()
                .map_or(req.path(), |pq| pq.as_str()),
            source_ip: req.peer_addr().map(|a| a.ip().to_string()),
            user_agent: req
                .headers()
                .get("user-agent")
                .and_then(|v| v.to_str().ok()),
            allowed,
            reason,
            code: match &served {
                Ok(Served::Response(r)) => r.status().as_u16(),
                Err(e) => e.code,
                Ok(Served::Forward(_)) => 0,
            },
            received,
        });
    }
    match served? {
        Served::Response(r) => Ok(Some(r)),
        Served::Forward(reason) => {
            bypassed(&resource, reason);
            Ok(None)
        }
    }
}

/// Whether the path has the form the API server routes for the resource's scope; any
/// other is proxied, and the API server answers it (404). A cluster-scoped resource has
/// no `/namespaces/{ns}/` form (`/api/v1/namespaces/foo/namespaces/bar` would otherwise be
/// authorized in `foo` and answered with `bar`); a namespaced object has no cluster-wide
/// path by name (`/api/v1/secrets/s`).
fn fits_scope(rp: &ResourcePath, resource: &ResourceType) -> bool {
    if resource.namespaced {
        rp.name.is_none() || rp.namespace_prefix
    } else {
        !rp.namespace_prefix
    }
}

/// Authenticates the request as the API server's authenticator chain does: a verified
/// client certificate with a common name first, then a bearer token through TokenReview;
/// no credentials is `system:anonymous` when allowed (as the API server's
/// `--anonymous-auth=true`) — but not after a certificate failed authentication.
pub async fn identify(req: &HttpRequest, state: &ApiState) -> Result<UserInfo, ApiError> {
    let authorization = req.headers().get("authorization").map(|v| v.as_bytes());
    let cert_failed = match cert_auth(req) {
        CertAuth::User(user) => return Ok(user),
        CertAuth::Failed => true,
        CertAuth::None => false,
    };
    match state.auth.authenticate(authorization).await {
        Ok(user) => Ok(user),
        // No bearer credential (none, or another scheme): anonymous, as upstream, when
        // allowed.
        Err(auth::Error::MissingToken)
            if !cert_failed && state.anonymous.load(Ordering::Relaxed) =>
        {
            Ok(UserInfo::anonymous())
        }
        Err(auth::Error::MissingToken | auth::Error::InvalidToken) => Err(ApiError::unauthorized()),
        Err(e @ auth::Error::ReviewFailed(_)) => {
            tracing::warn!(error = %e, "cannot authenticate: TokenReview failed");
            Err(ApiError::service_unavailable(
                "cannot authenticate the request: the API server's TokenReview failed",
            ))
        }
    }
}

/// What the connection's client certificate says (`crate::cert_identity`).
enum CertAuth {
    /// No certificate, or one without a common name: other credentials decide.
    None,
    User(UserInfo),
    /// The x509 authenticator failed (a malformed UID): only a bearer token can still
    /// authenticate the request; it is never anonymous.
    Failed,
}

/// The user of a client certificate verified against `--client-ca-file`, as the API
/// server's x509 authenticator reads it.
fn cert_auth(req: &HttpRequest) -> CertAuth {
    use crate::cert_identity::Identity;
    let Some(cert) = req.conn_data::<crate::tls::ClientCert>() else {
        return CertAuth::None;
    };
    match &cert.0 {
        Ok(Identity::User {
            name,
            uid,
            groups,
            extra,
        }) => CertAuth::User(UserInfo {
            username: name.clone(),
            uid: uid.clone(),
            groups: groups
                .iter()
                .cloned()
                .chain(["system:authenticated".to_string()])
                .collect(),
            extra: extra.clone(),
        }),
        Ok(Identity::Nobody) => CertAuth::None,
        Err(e) => {
            tracing::info!(error = %e, "client certificate not authenticated");
            CertAuth::Failed
        }
    }
}

/// Authorizes `attrs` for `user` with a SubjectAccessReview; a denial is the API server's 403.
pub async fn check(state: &ApiState, user: &UserInfo, attrs: &Attributes) -> Result<(), ApiError> {
    let d = decide(state, user, attrs).await?;
    if d.allowed {
        Ok(())
    } else {
        Err(authz::forbidden(user, attrs, &d.reason))
    }
}

/// The SubjectAccessReview's decision on `attrs` for `user` (through the authorization
/// cache); a review that failed is a 503, as the API server cannot decide either.
pub async fn decide(
    state: &ApiState,
    user: &UserInfo,
    attrs: &Attributes,
) -> Result<authz::Decision, ApiError> {
    state.authz.authorize(user, attrs).await.map_err(|e| {
        tracing::warn!(error = %e, "cannot authorize: SubjectAccessReview failed");
        ApiError::service_unavailable(
            "cannot authorize the request: the API server's SubjectAccessReview failed",
        )
    })
}

/// The request's attributes as the API server's request-info derives them: a path with a
/// name is a `get` (whatever `watch` says); without one, `watch` or `list`, named by a
/// `metadata.name` field selector when the query decodes as `ListOptions` and the name is
/// a valid path segment.
fn resource_attributes(rp: &ResourcePath, q: &Query) -> Attributes {
    let verb = if rp.name.is_some() {
        "get"
    } else if q.watch() {
        "watch"
    } else {
        "list"
    };
    let name = rp.name.clone().unwrap_or_else(|| {
        if !q.list_options_decode() {
            return String::new();
        }
        FieldSelector::parse(&q.field_selector)
            .ok()
            .and_then(|f| f.equality_value("metadata.name").map(str::to_string))
            .filter(|n| is_valid_path_segment(n))
            .unwrap_or_default()
    });
    // Selectors are authorized for list and watch only (`GetAuthorizerAttributes`).
    let (field_selector, label_selector) = if verb == "get" {
        (String::new(), String::new())
    } else {
        (q.field_selector.clone(), q.label_selector.clone())
    };
    Attributes::Resource {
        verb: verb.into(),
        group: rp.group.clone(),
        version: rp.version.clone(),
        resource: rp.resource.clone(),
        subresource: String::new(),
        namespace: rp.namespace.clone().unwrap_or_default(),
        name,
        field_selector,
        label_selector,
    }
}

/// The API server's `IsValidPathSegmentName`.
fn is_valid_path_segment(s: &str) -> bool {
    s != "." && s != ".." && !s.contains('/') && !s.contains('%')
}

async fn serve_cached(
    state: &ApiState,
    rp: &ResourcePath,
    q: &Query,
    user: &UserInfo,
    format: Format,
    resource: Arc<ResourceType>,
) -> Result<Served, ApiError> {
    // Only a Table reads includeObject; any other answer ignores it, as upstream.
    let include = match format {
        Format::Table(_) => IncludeObject::parse(q.include_object.as_deref())
            .map_err(|e| ApiError::bad_request(e.to_string()))?,
        _ => IncludeObject::default(),
    };
    let namespace = rp.namespace.as_deref().filter(|_| resource.namespaced);
    let Some(name) = &rp.name else {
        return list_or_watch(state, q, user, format, include, namespace, resource).await;
    };
    // A GET by name decodes only `resourceVersion` (GetOptions): selectors, limits, watch
    // and resourceVersionMatch are ignored, as upstream.
    let plan = plan_list(q.watch_or_get_rv()?, None, None, false);
    let ListPlan::Cache { min_rv } = plan else {
        return Ok(Served::Forward("rv"));
    };
    let key = route(
        &resource,
        namespace,
        Some(name),
        &FieldSelector::everything(),
    );
    // The snapshot may be a covering key's (`core::cover`): the object is found by name
    // and namespace either way.
    let (_, snap) = match read(state, user, key, min_rv).await? {
        Ok(read) => read,
        Err(reason) => return Ok(Served::Forward(reason)),
    };
    let obj = snap
        .objects
        .iter()
        .find(|o| o.name() == name.as_str() && namespace.is_none_or(|ns| o.namespace() == ns));
    let Some(obj) = obj else {
        return Err(ApiError::not_found(
            &resource.group,
            &resource.resource,
            name,
        ));
    };
    let v = match format {
        // The object's bytes as the upstream sent them.
        Format::Json => {
            return Ok(Served::Response(
                HttpResponse::Ok()
                    .content_type("application/json")
                    .body(obj.json().clone()),
            ))
        }
        Format::Protobuf(codec) => {
            let Some(msg) = obj.proto(&codec) else {
                return Ok(Served::Forward("protobuf"));
            };
            return Ok(Served::Response(
                HttpResponse::Ok()
                    .content_type(proto::codec::CONTENT_TYPE)
                    .body(codec.envelope(&msg)),
            ));
        }
        Format::Table(v) => v,
    };
    let body = table::to_table(
        v,
        &resource.group,
        &resource.resource,
        &[&obj.to_value()],
        json!({ "resourceVersion": snap.rv.to_string() }),
        include,
        now_secs(),
    );
    Ok(Served::Response(json_response(&body)))
}

/// A snapshot of `key`, or of a running key covering it, at `min_rv` or later, holding
/// that key for the grace period; the key it is of and the snapshot, or `Err` with the
/// reason when the API server should answer instead.
async fn read(
    state: &ApiState,
    user: &UserInfo,
    key: Key,
    min_rv: u64,
) -> Result<Result<(Key, cached_object::Snapshot), &'static str>, ApiError> {
    let held = state
        .registry
        .send(Hold {
            key,
            duration: state.cache.grace_period(),
            user: Some(user.username.clone()),
        })
        .await
        .map_err(|_| ApiError::service_unavailable("kcache is shutting down"))?;
    let held = match held {
        Ok(held) => held,
        // Past the key budget: the API server answers reads as well as the cache would.
        Err(e) => {
            tracing::debug!(error = %e, "no new key; forwarding upstream");
            return Ok(Err("key_budget"));
        }
    };
    let snap = match snapshot(&held.addr, min_rv).await? {
        Ok(snap) => snap,
        Err(reason) => return Ok(Err(reason)),
    };
    // A parked key (its objects all immutable, no upstream watch) hears of a deletion or
    // re-creation only when next verified: a deleted credential must not stay readable, so
    // the key is proven as new as the upstream before it answers, and read again.
    if !parks(state, &held.key, &snap) {
        return Ok(Ok((held.key, snap)));
    }
    if let Err(e) = state.fresh.prove(&held.key, &held.addr).await {
        tracing::info!(error = %e, "parked key not proven fresh; forwarding upstream");
        return Ok(Err("not_fresh"));
    }
    Ok(snapshot(&held.addr, min_rv)
        .await?
        .map(|snap| (held.key, snap)))
}

/// Whether `key` holding `snap` parks (`Key::parks`) in this configuration: it may not
/// have heard of the latest deletion or re-creation.
fn parks(state: &ApiState, key: &Key, snap: &cached_object::Snapshot) -> bool {
    state.cache.immutable_stop_watch && key.parks(snap.objects.iter().map(|o| &**o))
}

/// The key's snapshot at `min_rv` or later, or `Err` with the reason when the API server
/// should answer instead.
async fn snapshot(
    addr: &Addr<cached_object::CachedObject>,
    min_rv: u64,
) -> Result<Result<cached_object::Snapshot, &'static str>, ApiError> {
    match addr.send(Read { min_rv }).await {
        Ok(Ok(snap)) => Ok(Ok(snap)),
        Ok(Err(cached_object::Error::TooLargeResourceVersion { requested, current })) => {
            Err(ApiError::too_large_resource_version(requested, current))
        }
        // Not synced in time, or stopping: the API server can still answer.
        Ok(Err(e)) => {
            tracing::info!(error = %e, "cache cannot answer; forwarding upstream");
            Ok(Err("not_ready"))
        }
        Err(_) => Ok(Err("not_ready")),
    }
}

/// A list or watch: the query decodes as the API server's `ListOptions`.
async fn list_or_watch(
    state: &ApiState,
    q: &Query,
    user: &UserInfo,
    format: Format,
    include: IncludeObject,
    namespace: Option<&str>,
    resource: Arc<ResourceType>,
) -> Result<Served, ApiError> {
    let label = LabelSelector::parse(&q.label_selector)
        .map_err(|e| ApiError::bad_request(format!("unable to parse requirement: {e}")))?;
    let field = FieldSelector::parse(&q.field_selector)
        .map_err(|e| ApiError::bad_request(e.to_string()))?;
    let limit = q.limit()?;
    let timeout = q.timeout_seconds()?;
    let servable = field
        .validate_for(&resource.group, &resource.resource, resource.namespaced)
        .map_err(|e| ApiError::bad_request(e.to_string()))?;
    if !servable {
        return Ok(Served::Forward("selector"));
    }
    // A selector value becomes a key (an upstream selector, a NATS subject): only names
    // kcache can carry verbatim; others are for the API server to answer.
    if ["metadata.name", "spec.nodeName"]
        .iter()
        .filter_map(|f| field.equality_value(f))
        .any(|v| !is_keyable_name(v))
    {
        return Ok(Served::Forward("name"));
    }
    let key = route(&resource, namespace, None, &field);
    if q.watch() {
        let permit = state.watch_limits.admit(&user.username)?;
        return watch(
            state, q, timeout, user, key, label, field, format, include, permit,
        )
        .await;
    }
    // As the API server: ListOptions validation (422), then the storage's parse of the
    // resourceVersion (400 for a list).
    q.validate_list_options(false)?;
    let plan = plan_list(
        q.list_rv()?,
        q.rv_match(),
        limit,
        q.continue_token.is_some(),
    );
    let ListPlan::Cache { min_rv } = plan else {
        return Ok(Served::Forward("rv"));
    };
    let (held, snap) = match read(state, user, key.clone(), min_rv).await? {
        Ok(read) => read,
        Err(reason) => return Ok(Served::Forward(reason)),
    };
    let filter = Filter::new(label, cover::field_for(&key, &held, field));
    let items: Vec<Arc<Object>> = snap
        .objects
        .into_iter()
        .filter(|o| filter.matches(o))
        .collect();
    let v = match format {
        Format::Json => {
            let head = object::list_head(
                &format!("{}List", resource.kind),
                &resource.api_version(),
                snap.rv,
            );
            return Ok(Served::Response(list_response(head, items)));
        }
        Format::Protobuf(codec) => {
            // Every item's message first: one the schema cannot express sends the whole
            // list to the API server rather than leave a field out.
            let Some(messages) = items.iter().map(|o| o.proto(&codec)).collect() else {
                return Ok(Served::Forward("protobuf"));
            };
            return Ok(Served::Response(proto_list_response(
                &codec, snap.rv, messages,
            )));
        }
        Format::Table(v) => v,
    };
    let values: Vec<Value> = items.iter().map(|o| o.to_value()).collect();
    let body = table::to_table(
        v,
        &resource.group,
        &resource.resource,
        &values.iter().collect::<Vec<_>>(),
        json!({ "resourceVersion": snap.rv.to_string() }),
        include,
        now_secs(),
    );
    Ok(Served::Response(json_response(&body)))
}

/// How many bytes of items a list writes at a time.
const LIST_CHUNK: usize = 64 << 10;

/// A list's body, written as it is produced: the head, the items' own bytes in chunks of
/// [`LIST_CHUNK`], the tail. Nothing is built whole: a list of 100,000 objects costs its
/// snapshot (a pointer per object) and one chunk, not a second copy of every object. The
/// length is known up front, so the response carries `Content-Length` as the API
/// server's does.
fn list_response(head: Bytes, items: Vec<Arc<Object>>) -> HttpResponse {
    let commas = items.len().saturating_sub(1);
    let len = head.len()
        + items.iter().map(|o| o.json().len()).sum::<usize>()
        + commas
        + object::LIST_TAIL.len();
    struct St {
        head: Option<Bytes>,
        items: std::vec::IntoIter<Arc<Object>>,
        writer: Option<object::ListWriter>,
    }
    let st = St {
        head: Some(head),
        items: items.into_iter(),
        writer: Some(object::ListWriter::new(LIST_CHUNK)),
    };
    let stream = futures::stream::unfold(st, move |mut st| async move {
        if let Some(head) = st.head.take() {
            return Some((Ok::<_, std::convert::Infallible>(head), st));
        }
        let writer = st.writer.as_mut()?;
        for o in st.items.by_ref() {
            if let Some(chunk) = writer.push(o.json()) {
                return Some((Ok(chunk), st));
            }
        }
        let last = st.writer.take()?.finish();
        if len > kcache_actors::memory::TRIM_AFTER_BYTES {
            // The chunks written so far are freed: return the holes they left.
            kcache_actors::memory::release_freed();
        }
        Some((Ok(last), st))
    });
    HttpResponse::Ok()
        .content_type("application/json")
        .body(actix_web::body::SizedStream::new(len as u64, stream))
}

/// A protobuf list: the envelope's head, each item's field header and message, the tail;
/// chunked as [`list_response`], with its length known up front.
fn proto_list_response(codec: &Codec, rv: u64, messages: Vec<Bytes>) -> HttpResponse {
    let (head, tail) = codec.list_head(rv, messages.iter().map(Bytes::len));
    let len = head.len()
        + messages
            .iter()
            .map(|m| proto::codec::item_len(m.len()))
            .sum::<usize>()
        + tail.len();
    // Written as it is produced: the messages are the objects' own (cached), and only one
    // chunk of them is copied at a time.
    struct St {
        head: Option<Bytes>,
        messages: std::vec::IntoIter<Bytes>,
        tail: Option<Bytes>,
    }
    let st = St {
        head: Some(head),
        messages: messages.into_iter(),
        tail: Some(tail),
    };
    let stream = futures::stream::unfold(st, |mut st| async move {
        if let Some(head) = st.head.take() {
            return Some((Ok::<_, std::convert::Infallible>(head), st));
        }
        let tail = st.tail.take()?;
        let mut chunk: Vec<u8> = Vec::with_capacity(LIST_CHUNK);
        for m in st.messages.by_ref() {
            proto::codec::item_prefix(m.len(), &mut chunk);
            chunk.extend_from_slice(&m);
            if chunk.len() >= LIST_CHUNK {
                st.tail = Some(tail);
                return Some((Ok(Bytes::from(chunk)), st));
            }
        }
        chunk.extend_from_slice(&tail);
        Some((Ok(Bytes::from(chunk)), st))
    });
    HttpResponse::Ok()
        .content_type(proto::codec::CONTENT_TYPE)
        .body(actix_web::body::SizedStream::new(len as u64, stream))
}

#[allow(clippy::too_many_arguments)]
async fn watch(
    state: &ApiState,
    q: &Query,
    timeout_seconds: Option<i64>,
    user: &UserInfo,
    key: Key,
    label: LabelSelector,
    field: FieldSelector,
    format: Format,
    include: IncludeObject,
    permit: crate::limits::WatchPermit,
) -> Result<Served, ApiError> {
    // As the API server: ListOptions validation (422), then the storage's parse of the
    // resourceVersion (500 for a watch).
    q.validate_list_options(true)?;
    let rv = q.watch_or_get_rv()?;
    // Planned on the defaulted options: a watch from "" or 0 is a streaming list.
    let send_initial_events = q.list_options(true).send_initial_events;
    // A streaming list as Table: the reference server sends the column definitions in the
    // first event only and its initial-events-end bookmark as a Table (so that a reflector,
    // which cannot store Tables, never syncs); kcache's Table encoder does neither, so the
    // API server answers these itself.
    if matches!(format, Format::Table(_)) && send_initial_events == Some(true) {
        return Ok(Served::Forward("accept"));
    }
    let plan = plan_watch(rv, send_initial_events, q.allow_watch_bookmarks());
    // A streaming list with the resourceVersion omitted is a consistent read: its state
    // must be at least as new as the upstream's when it arrived (the reference cacher
    // waits for etcd's current revision).
    let consistent = rv == Rv::Unset && send_initial_events == Some(true);
    // As the API server: `time.Duration(timeoutSeconds) * time.Second`, in Go's wrapping
    // int64 nanoseconds; zero (or absent) is --min-request-timeout × [1, 2), and a
    // negative one ends the watch at once (a Go timer fires at once for it).
    let nanos = timeout_seconds.unwrap_or(0).wrapping_mul(1_000_000_000);
    let timeout = match nanos {
        0 => Duration::from_secs_f64(
            state.server.min_request_timeout_secs as f64 * (1.0 + rand::random::<f64>()),
        ),
        n if n < 0 => Duration::ZERO,
        n => Duration::from_nanos(n.unsigned_abs()),
    };
    let content_type = match format {
        Format::Protobuf(_) => proto::codec::WATCH_CONTENT_TYPE,
        _ => "application/json",
    };
    let encoder = match format {
        Format::Json => Encoder::Json,
        Format::Protobuf(codec) => Encoder::Protobuf(codec),
        Format::Table(version) => {
            let resource = key.resource.clone();
            Encoder::Custom(Arc::new(move |kind: EventType, obj: &Object| -> Bytes {
                let t = table::to_table(
                    version,
                    &resource.group,
                    &resource.resource,
                    &[&obj.to_value()],
                    json!({ "resourceVersion": obj.rv().to_string() }),
                    include,
                    now_secs(),
                );
                encode_value_line(kind.as_str(), &t)
            }))
        }
    };
    let (tx, rx) = kcache_actors::body::channel(state.cache.watcher_buffer);
    let registry = state.registry.clone();
    let mailbox = state.cache.watcher_buffer.max(16);
    let allow_bookmarks = q.allow_watch_bookmarks();
    let keepalive = Duration::from_secs(state.cache.watch_keepalive_secs);
    // Take the reference first: a key the user may not start is a 429 (the watch was not
    // accepted), as a watch past the watch caps. The watcher releases it when it stops.
    let held = registry
        .send(Acquire {
            key: key.clone(),
            from_rv: if plan.initial_events { 0 } else { plan.from_rv },
            user: Some(user.username.clone()),
        })
        .await
        .map_err(|_| ApiError::service_unavailable("kcache is shutting down"))?
        .map_err(|e| crate::limits::too_many_requests(e.to_string()))?;
    // A watch that starts with the key's state (from "0") must not hand out an object a
    // parked key has not yet heard was deleted: proven like a consistent read.
    let prove = consistent
        || (plan.initial_events
            && state.cache.immutable_stop_watch
            && held.key.may_hold_immutable()
            && matches!(snapshot(&held.addr, 0).await, Ok(Ok(snap)) if parks(state, &held.key, &snap)));
    if prove {
        if let Err(e) = state.fresh.prove(&held.key, &held.addr).await {
            tracing::info!(error = %e, "consistent read not proven fresh; forwarding upstream");
            registry.do_send(Release {
                key: held.key,
                asked: key,
            });
            return Ok(Served::Forward("not_fresh"));
        }
    }
    // Served by a covering key, the filter tests what the own key's upstream selector
    // would have guaranteed.
    let filter = Filter::new(label, cover::field_for(&key, &held.key, field));
    let asked = (held.key != key).then(|| Box::new(key));
    // Start the watcher on this worker's arbiter. Until its first event the client sees the
    // response head and waits, as with the API server.
    actix::Actor::start(Watcher::new(WatcherSpec {
        key: held.key,
        asked,
        filter,
        plan,
        allow_bookmarks,
        timeout,
        encoder,
        body: tx,
        cached: held.addr.recipient(),
        registry,
        mailbox,
        keepalive,
        permit: Some(Box::new(permit)),
    }));
    let mut res = HttpResponse::Ok()
        .content_type(content_type)
        .insert_header(("Cache-Control", "no-cache, private"))
        .streaming(rx);
    compact_headers(res.headers_mut());
    Ok(Served::Response(res))
}

/// Replaces `headers` with a map just large enough for its entries.
///
/// actix-http pre-sizes every response's header map for 12 headers (about 3.4 KB) and, for
/// HTTP/2, keeps the response head alive until the body ends (`h2::dispatcher`'s
/// `handle_response`). A watch's body lasts as long as the watch, so at 50,000 watches the
/// two headers a watch carries would cost 170 MB of empty buckets; right-sized they need
/// about 0.8 KB each.
fn compact_headers(headers: &mut HeaderMap) {
    let mut small = HeaderMap::with_capacity(headers.len());
    for (name, value) in headers.iter() {
        small.append(name.clone(), value.clone());
    }
    *headers = small;
}

fn now_secs() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

fn json_response(v: &Value) -> HttpResponse {
    HttpResponse::Ok().content_type("application/json").json(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each reason a read of a cached resource is sent upstream for (a `Forward` or an
    /// `Err` of a literal in this file) is registered at zero for every cached resource.
    #[test]
    fn every_bypass_reason_is_registered() {
        let source = include_str!("api.rs");
        let mut found = 0;
        for marker in ["Forward(\"", "Err(\""] {
            for (i, _) in source.match_indices(marker) {
                let rest = &source[i + marker.len()..];
                let reason = rest.split('"').next().unwrap_or("");
                assert!(
                    BYPASS_REASONS.contains(&reason),
                    "bypass reason {reason:?} is not in BYPASS_REASONS"
                );
                found += 1;
            }
        }
        assert!(found >= 10, "only {found} bypass reasons found");
    }

    #[test]
    fn protobuf_is_looked_up_only_when_asked_for() {
        assert!(mentions_protobuf(
            "application/vnd.kubernetes.protobuf, application/json"
        ));
        assert!(mentions_protobuf("Application/Vnd.Kubernetes.Protobuf"));
        assert!(!mentions_protobuf("application/json"));
        assert!(!mentions_protobuf(""));
    }

    #[test]
    fn compact_headers_keeps_every_value_in_a_smaller_map() {
        let mut res = HttpResponse::Ok()
            .content_type("application/json")
            .insert_header(("Cache-Control", "no-cache, private"))
            .append_header(("Warning", "a"))
            .append_header(("Warning", "b"))
            .finish();
        let before = res.headers().capacity();
        compact_headers(res.headers_mut());
        let h = res.headers();
        assert!(h.capacity() < before, "{} !< {before}", h.capacity());
        assert_eq!(h.len(), 4);
        assert_eq!(h.get("content-type").unwrap(), "application/json");
        assert_eq!(h.get("cache-control").unwrap(), "no-cache, private");
        let warnings: Vec<_> = h.get_all("warning").collect();
        assert_eq!(warnings, ["a", "b"]);
    }
}
