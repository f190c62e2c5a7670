//! Everything kcache does not serve from its cache goes to the API server unchanged, with
//! the client's own credentials, streamed both ways — so clients can point their whole
//! kubeconfig at kcache.
//!
//! kcache cannot authenticate what it proxies (the API server does, with the credentials
//! the request carries), so anyone who can reach the port can make it hold requests. Two
//! limits keep that bounded before the API server has seen a byte:
//!
//! - Request bodies are streamed upstream as they arrive through a small bounded channel,
//!   never collected, and cut off past `max_request_body_bytes` (413).
//! - In-flight proxied requests are capped with semaphores, as the API server's
//!   `--max-requests-inflight` / `--max-mutating-requests-inflight`; past a cap the answer is
//!   429 with `Retry-After`, never a queue. Long-running requests (watches, logs, proxy)
//!   have a cap of their own; see [`Kind`].
//!
//! "Unchanged" has one exception: a `continue` value that is kcache's own page token goes
//! in the API server's version (`core::page::upstream_form`), so a chain kcache began and
//! cannot continue (past its window, a request it forwards) continues upstream instead of
//! failing on a version only kcache knows.

use std::sync::{Arc, OnceLock};

use actix_web::http::StatusCode;
use actix_web::{dev, web, HttpRequest, HttpResponse};
use bytes::Bytes;
use futures::{FutureExt, StreamExt};
use http_body_util::channel::Channel;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Empty, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client as HyperClient;
use hyper_util::rt::TokioExecutor;
use kube::client::ConfigExt;
use thiserror::Error;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tower::util::BoxCloneSyncService;
use tower::{BoxError, ServiceBuilder, ServiceExt};

use crate::config::ServerConfig;
use crate::status::ApiError;

/// Proxied requests answered by the API server, by status code.
pub const PROXIED_REQUESTS: &str = "kcache_proxied_requests_total";
/// Proxied requests in flight, by `kind` (`readonly`, `mutating`, `long_running`).
pub const PROXY_INFLIGHT: &str = "kcache_proxy_inflight_requests";
/// Proxied requests refused by kcache before or while reaching the API server, by
/// `reason` (`readonly_inflight`, `mutating_inflight`, `long_running_inflight`,
/// `body_too_large`).
pub const PROXY_REJECTED: &str = "kcache_proxy_rejected_total";
/// The `reason` of [`PROXY_REJECTED`] for a body over `server.max_request_body_bytes`.
const BODY_TOO_LARGE: &str = "body_too_large";

/// Body chunks (as the client's connection delivers them, at most tens of KiB each)
/// queued between the client and the upstream connection: enough to keep both busy,
/// small enough that a stalled upstream stops kcache reading the client.
const BODY_CHUNKS: usize = 4;

/// Headers that describe one hop, not the request (RFC 9110 §7.6.1), plus Host.
const HOP_BY_HOP: [&str; 9] = [
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "host",
];

/// The API server's long-running subresources (`BasicLongRunningRequestCheck` in
/// `k8s.io/apiserver`, as kube-apiserver configures it).
const LONG_RUNNING_SUBRESOURCES: [&str; 5] = ["attach", "exec", "proxy", "log", "portforward"];

/// Why a request body did not reach the API server whole.
#[derive(Debug, Clone, Error)]
pub enum Error {
    #[error("request body larger than {0} bytes")]
    BodyTooLarge(usize),
    #[error("reading the request body: {0}")]
    ReadBody(String),
}

type UpstreamBody = UnsyncBoxBody<Bytes, BoxError>;
type Upstream =
    BoxCloneSyncService<http::Request<UpstreamBody>, http::Response<UpstreamBody>, BoxError>;

/// Which in-flight cap a proxied request counts against.
///
/// How often an idle long-running response checks that its client is still there.
const HANGUP_CHECK: std::time::Duration = std::time::Duration::from_secs(1);

/// Why long-running requests are apart: a proxied watch or `logs -f` holds its slot for
/// minutes, so counting it with short requests would let a few hundred idle watches
/// refuse every `kubectl apply`. The API server exempts them from its in-flight limits
/// altogether (they are bounded by its request timeout instead); kcache cannot, since
/// each one also holds an upstream connection and a socket here, so they get a cap of
/// their own, sized for connections rather than for request rate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    ReadOnly,
    Mutating,
    LongRunning,
}

impl Kind {
    const ALL: [Kind; 3] = [Kind::ReadOnly, Kind::Mutating, Kind::LongRunning];

    fn label(self) -> &'static str {
        match self {
            Kind::ReadOnly => "readonly",
            Kind::Mutating => "mutating",
            Kind::LongRunning => "long_running",
        }
    }

    fn rejected_reason(self) -> &'static str {
        match self {
            Kind::ReadOnly => "readonly_inflight",
            Kind::Mutating => "mutating_inflight",
            Kind::LongRunning => "long_running_inflight",
        }
    }

    /// As the API server classifies a request (`RequestInfoFactory` then its long-running
    /// check): a watch of a collection (`?watch=` not false, or the old `/watch/` paths),
    /// the old `/proxy/` verb, or a long-running subresource; otherwise by method.
    pub fn of(method: &str, path: &str, query: &str) -> Kind {
        let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
        let rest = match parts.first() {
            Some(&"api") if parts.len() > 2 => &parts[2..],
            Some(&"apis") if parts.len() > 3 => &parts[3..],
            _ => &[][..],
        };
        let mut long_running = match rest.first() {
            Some(&"watch") => method == "GET",
            Some(&"proxy") => true,
            _ => false,
        };
        if !long_running && !rest.is_empty() {
            let mut rest = rest;
            if rest[0] == "namespaces"
                && rest.len() > 2
                && !crate::request::NAMESPACE_SUBRESOURCES.contains(&rest[2])
            {
                rest = &rest[2..];
            }
            long_running = rest
                .get(2)
                .is_some_and(|s| LONG_RUNNING_SUBRESOURCES.contains(s))
                // Only a collection is watched; a named GET with `?watch` is a get.
                || (method == "GET" && rest.len() == 1 && watch_requested(query));
        }
        if long_running {
            Kind::LongRunning
        } else if matches!(method, "GET" | "HEAD" | "OPTIONS") {
            Kind::ReadOnly
        } else {
            Kind::Mutating
        }
    }
}

/// apimachinery's query bool: the first `watch` value, true unless `0` or `false`
/// (any case) — an empty `?watch` is true.
pub fn watch_requested(query: &str) -> bool {
    url::form_urlencoded::parse(query.as_bytes())
        .find(|(k, _)| k == "watch")
        .is_some_and(|(_, v)| v != "0" && !v.eq_ignore_ascii_case("false"))
}

/// The request target as it goes upstream: `path_and_query` byte for byte, but for each
/// `continue` pair holding kcache's token, which carries the API server's version instead
/// (`core::page::upstream_form`). Pairs are what Go's `url.ParseQuery` takes them to be:
/// split at `&`, none with a `;` (Go drops those), the key unescaped.
pub fn upstream_target(path_and_query: &str) -> std::borrow::Cow<'_, str> {
    use kcache_actors::core::page::upstream_form;
    let Some((path, query)) = path_and_query.split_once('?') else {
        return path_and_query.into();
    };
    let translated = |pair: &str| {
        if pair.contains(';') {
            return None;
        }
        url::form_urlencoded::parse(pair.as_bytes())
            .next()
            .filter(|(k, _)| k == "continue")
            .and_then(|(_, v)| upstream_form(&v))
    };
    // Nearly every proxied request has no kcache token: look before building anything.
    if !query.split('&').any(|pair| translated(pair).is_some()) {
        return path_and_query.into();
    }
    let pairs: Vec<String> = query
        .split('&')
        .map(|pair| match translated(pair) {
            Some(token) => format!("continue={token}"),
            None => pair.to_string(),
        })
        .collect();
    format!("{path}?{}", pairs.join("&")).into()
}

/// One proxied request's slot; the gauge and the semaphore get it back on drop.
struct InFlight {
    kind: Kind,
    _permit: Option<OwnedSemaphorePermit>,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        metrics::gauge!(PROXY_INFLIGHT, "kind" => self.kind.label()).decrement(1.0);
    }
}

/// The three in-flight caps (`None`: no cap).
struct Slots {
    readonly: Option<Arc<Semaphore>>,
    mutating: Option<Arc<Semaphore>>,
    long_running: Option<Arc<Semaphore>>,
    limits: [usize; 3],
}

impl Slots {
    fn new(readonly: usize, mutating: usize, long_running: usize) -> Self {
        let sem =
            |n: usize| (n > 0).then(|| Arc::new(Semaphore::new(n.min(Semaphore::MAX_PERMITS))));
        Slots {
            readonly: sem(readonly),
            mutating: sem(mutating),
            long_running: sem(long_running),
            limits: [readonly, mutating, long_running],
        }
    }

    fn admit(&self, kind: Kind) -> Result<InFlight, ApiError> {
        let (sem, limit) = match kind {
            Kind::ReadOnly => (&self.readonly, self.limits[0]),
            Kind::Mutating => (&self.mutating, self.limits[1]),
            Kind::LongRunning => (&self.long_running, self.limits[2]),
        };
        let permit = match sem {
            Some(s) => Some(s.clone().try_acquire_owned().map_err(|_| {
                metrics::counter!(PROXY_REJECTED, "reason" => kind.rejected_reason()).increment(1);
                let mut e = ApiError::new(
                    429,
                    "TooManyRequests",
                    format!(
                        "too many {} requests proxied by this kcache replica (limit {limit}), please try again later",
                        kind.label().replace('_', "-")
                    ),
                );
                e.retry_after = Some(1);
                e.details = Some(serde_json::json!({"retryAfterSeconds": 1}));
                e
            })?),
            None => None,
        };
        metrics::gauge!(PROXY_INFLIGHT, "kind" => kind.label()).increment(1.0);
        Ok(InFlight {
            kind,
            _permit: permit,
        })
    }
}

pub struct Proxy {
    /// A client with the upstream's address and TLS settings but *no* credentials of its
    /// own: the client's Authorization header is what the API server sees.
    client: Upstream,
    /// kcache's own identity, used only to impersonate client-certificate users when
    /// `auth.impersonate_cert_users` is on, and which of them.
    impersonator: Option<(Upstream, ImpersonationScope)>,
    max_body: usize,
    slots: Slots,
}

/// kube-rs's layers (base URI, auth, extra headers) over a hyper client of our own, since
/// `kube::Client` only sends bodies it holds whole. HTTP/1.1 as kube-rs's stock client;
/// never retries (writes are not idempotent).
fn upstream(config: &kube::Config) -> Result<Upstream, kube::Error> {
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_nodelay(true);
    http.set_connect_timeout(config.connect_timeout);
    let https = config.rustls_https_connector_with_connector(http)?;
    let hyper = HyperClient::builder(TokioExecutor::new()).build(https);
    let service = ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(config.auth_layer()?)
        .layer(config.extra_headers_layer()?)
        .map_err(BoxError::from)
        .service(hyper)
        .map_err(Into::<BoxError>::into)
        .map_response(|r| r.map(|b| b.map_err(BoxError::from).boxed_unsync()));
    Ok(BoxCloneSyncService::new(service))
}

/// The client-certificate identities kcache lends its own identity to
/// (`auth.impersonate_user_prefixes`, `auth.impersonate_groups`; empty lists allow any).
#[derive(Clone, Debug, Default)]
pub struct ImpersonationScope {
    pub user_prefixes: Vec<String>,
    pub groups: Vec<String>,
}

impl ImpersonationScope {
    /// Why `user` may not be impersonated, if it may not.
    pub fn refuses(&self, user: &crate::auth::UserInfo) -> Option<String> {
        if !self.user_prefixes.is_empty()
            && !self
                .user_prefixes
                .iter()
                .any(|p| user.username.starts_with(p.as_str()))
        {
            return Some(format!(
                "kcache forwards only client-certificate users named {:?}…; {} must use a bearer token or the API server directly",
                self.user_prefixes,
                kcache_actors::core::go_quote::go_quote(&user.username)
            ));
        }
        if !self.groups.is_empty() {
            // system:authenticated is every user's, and the API server adds it itself to an
            // impersonated user (it is never sent).
            if let Some(g) = user
                .groups
                .iter()
                .find(|g| *g != "system:authenticated" && !self.groups.contains(g))
            {
                return Some(format!(
                    "kcache forwards only client-certificate groups {:?}; group {} must use the API server directly",
                    self.groups,
                    kcache_actors::core::go_quote::go_quote(g)
                ));
            }
        }
        None
    }
}

/// Whether `value` reaches the API server unchanged as an HTTP header value: Go's server
/// trims leading and trailing spaces and tabs (so `"system:node:n1 "` would arrive as
/// `system:node:n1`, another identity) and no control character may be sent at all.
fn header_exact(value: &str) -> bool {
    let b = value.as_bytes();
    let edge = |c: Option<&u8>| !matches!(c, Some(b' ' | b'\t'));
    edge(b.first()) && edge(b.last()) && b.iter().all(|&c| c == b'\t' || (c >= 0x20 && c != 0x7f))
}

/// Why `user` cannot be impersonated exactly, if it cannot: a name or group an HTTP
/// header cannot carry unchanged. kcache refuses rather than send another identity (the
/// API server would have authorized the certificate's own); `docs/security.md`.
fn unforwardable(user: &crate::auth::UserInfo) -> Option<String> {
    let quote = kcache_actors::core::go_quote::go_quote;
    // The API server always gives an impersonated system:anonymous the group
    // system:unauthenticated, which a certificate naming it may not carry.
    if user.username == "system:anonymous"
        && !user.groups.iter().any(|g| g == "system:unauthenticated")
    {
        return Some(
            "kcache cannot forward user \"system:anonymous\" to the API server without the group system:unauthenticated (the API server would add it); use the API server directly".into(),
        );
    }
    let uncarried = |what: &str, name: &str| {
        format!(
            "kcache cannot forward {what} {} to the API server: an HTTP header cannot carry the name unchanged (leading or trailing space, or a control character); use the API server directly",
            quote(name)
        )
    };
    if !header_exact(&user.username) {
        return Some(uncarried("user", &user.username));
    }
    user.groups
        .iter()
        .find(|g| !header_exact(g))
        .map(|g| uncarried("group", g))
}

impl Proxy {
    pub fn new(
        config: kube::Config,
        server: &ServerConfig,
        auth: &crate::config::AuthConfig,
    ) -> Result<Self, kube::Error> {
        use metrics::{describe_counter, describe_gauge};
        describe_counter!(
            PROXIED_REQUESTS,
            "Proxied requests answered upstream, by code."
        );
        describe_gauge!(PROXY_INFLIGHT, "Proxied requests in flight, by kind.");
        describe_counter!(
            PROXY_REJECTED,
            "Proxied requests refused by kcache (429 or 413), by reason."
        );
        // Every kind and reason from the start, so the first refusal is seen by `rate()`.
        for kind in Kind::ALL {
            metrics::gauge!(PROXY_INFLIGHT, "kind" => kind.label()).increment(0.0);
            metrics::counter!(PROXY_REJECTED, "reason" => kind.rejected_reason()).increment(0);
        }
        metrics::counter!(PROXY_REJECTED, "reason" => BODY_TOO_LARGE).increment(0);
        let own = config;
        let mut anonymous = own.clone();
        anonymous.auth_info = Default::default();
        Ok(Proxy {
            client: upstream(&anonymous)?,
            impersonator: if auth.impersonate_cert_users {
                Some((
                    upstream(&own)?,
                    ImpersonationScope {
                        user_prefixes: auth.impersonate_user_prefixes.clone(),
                        groups: auth.impersonate_groups.clone(),
                    },
                ))
            } else {
                None
            },
            max_body: server.max_request_body_bytes,
            slots: Slots::new(
                server.max_proxied_requests_inflight,
                server.max_proxied_mutating_requests_inflight,
                server.max_proxied_long_running_requests,
            ),
        })
    }

    /// Forwards with the client's own credentials.
    pub async fn forward(
        &self,
        req: &HttpRequest,
        body: web::Payload,
    ) -> Result<HttpResponse, ApiError> {
        self.send(&self.client, req, body, None).await
    }

    /// Forwards as kcache impersonating a client-certificate user.
    pub async fn forward_as(
        &self,
        req: &HttpRequest,
        body: web::Payload,
        user: &crate::auth::UserInfo,
    ) -> Result<HttpResponse, ApiError> {
        let Some((client, scope)) = &self.impersonator else {
            return Err(ApiError::new(
                401,
                "Unauthorized",
                "kcache cannot forward a client-certificate identity to the API server unless auth.impersonate_cert_users is enabled",
            ));
        };
        // Never ignore a client's impersonation: kcache cannot chain it, so it refuses.
        if req
            .headers()
            .keys()
            .any(|h| h.as_str().starts_with("impersonate-"))
        {
            return Err(ApiError::new(
                403,
                "Forbidden",
                "impersonation by client-certificate users is not supported through kcache; use a bearer token or the API server directly",
            ));
        }
        if let Some(why) = scope.refuses(user).or_else(|| unforwardable(user)) {
            return Err(ApiError::new(403, "Forbidden", why));
        }
        self.send(client, req, body, Some(user)).await
    }

    fn too_large(&self) -> ApiError {
        metrics::counter!(PROXY_REJECTED, "reason" => BODY_TOO_LARGE).increment(1);
        ApiError::new(
            413,
            "RequestEntityTooLarge",
            Error::BodyTooLarge(self.max_body).to_string(),
        )
    }

    async fn send(
        &self,
        client: &Upstream,
        req: &HttpRequest,
        body: web::Payload,
        impersonate: Option<&crate::auth::UserInfo>,
    ) -> Result<HttpResponse, ApiError> {
        let upgrade = Upgrade::of(req);
        if upgrade == Upgrade::Other {
            return Err(ApiError::bad_request(
                "kcache proxies connection upgrades only to WebSocket (kubectl's default for exec, attach and port-forward since 1.31); use WebSocket or the API server directly",
            ));
        }
        // A declared length over the cap is refused before anything goes upstream.
        let declared = req
            .headers()
            .get("content-length")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok());
        if declared.is_some_and(|n| n > self.max_body as u64) {
            return Err(self.too_large());
        }
        // A small body of declared length (nearly every API write) is read whole first,
        // before it takes a slot (a client that never sends it holds only its connection):
        // it goes upstream complete or not at all, and a short one is the client's 400
        // here rather than an upstream failure. Larger ones stream.
        let payload = body.into_inner();
        let body = match declared {
            Some(len) if len <= WHOLE_BODY_MAX => {
                RequestBody::Whole(read_declared(payload, len, req).await?)
            }
            _ => RequestBody::Streamed(payload),
        };
        let kind = Kind::of(req.method().as_str(), req.path(), req.query_string());
        let in_flight = self.slots.admit(kind)?;
        // A long-running response can sit idle for minutes: end it when its client
        // hangs up, not at the next upstream event (`hangup`).
        // On HTTP/2 this task can outlive its connection: a client already gone is not
        // sent upstream.
        let hangup = match (kind == Kind::LongRunning)
            .then(|| req.conn_data::<crate::hangup::ConnFd>())
            .flatten()
            .map(crate::hangup::ConnFd::socket)
        {
            Some(crate::hangup::Peer::Socket(sock)) => Some(sock),
            Some(crate::hangup::Peer::Gone) => {
                return Err(ApiError::new(
                    499,
                    "ClientClosedRequest",
                    "the client closed its connection before the request was forwarded",
                ));
            }
            Some(crate::hangup::Peer::Unknown) | None => None,
        };
        let uri = req
            .uri()
            .path_and_query()
            .map(|pq| upstream_target(pq.as_str()).into_owned())
            .unwrap_or_else(|| req.path().to_string());
        let mut builder = http::Request::builder()
            .method(req.method().as_str())
            .uri(uri);
        for (name, value) in req.headers() {
            let n = name.as_str();
            // When impersonating, the client may not add identities of its own.
            if HOP_BY_HOP.contains(&n)
                || (impersonate.is_some()
                    && (n == "authorization" || n.starts_with("impersonate-")))
            {
                continue;
            }
            builder = builder.header(n, value.as_bytes());
        }
        if upgrade == Upgrade::WebSocket {
            // The handshake goes upstream as the client sent it (its key, version and
            // subprotocols above): the API server's answer is the client's.
            builder = builder
                .header("connection", "Upgrade")
                .header("upgrade", "websocket");
        }
        if let Some(user) = impersonate {
            // As bytes: a UTF-8 name (obs-text to HTTP) goes as the certificate has it.
            builder = builder.header("Impersonate-User", user.username.as_bytes());
            // Every group, system:authenticated included, so that groups are always
            // given: with a bare user name the API server fills them in itself — a
            // `system:node:` name becomes a node (group system:nodes, constrained
            // impersonation since 1.36) and a `system:serviceaccount:` name gets the
            // account's groups — where the certificate named neither.
            for g in &user.groups {
                builder = builder.header("Impersonate-Group", g.as_bytes());
            }
        }
        let (upstream_body, failure, body) = match body {
            // The client's bytes after the handshake are the upgraded connection's, not a
            // request body: they go upstream once the API server has switched.
            body if upgrade == Upgrade::WebSocket => {
                (empty(), Arc::new(OnceLock::new()), Some(body))
            }
            RequestBody::Whole(whole) => (whole, Arc::new(OnceLock::new()), None),
            RequestBody::Streamed(payload) => {
                let (b, f) = self.stream_body(payload);
                (b, f, None)
            }
        };
        let upstream_req = builder
            .body(upstream_body)
            .map_err(|e| ApiError::bad_request(format!("invalid request: {e}")))?;
        let mut resp = client.clone().oneshot(upstream_req).await.map_err(|e| {
            // Set before the body was aborted, so it is here when that failed the request.
            match failure.get() {
                Some(Error::BodyTooLarge(_)) => self.too_large(),
                Some(e @ Error::ReadBody(_)) => ApiError::bad_request(e.to_string()),
                None => {
                    // hyper's errors say little at the top ("client error (Connect)").
                    let mut why = e.to_string();
                    let mut source = e.source();
                    while let Some(s) = source {
                        why = format!("{why}: {s}");
                        source = s.source();
                    }
                    tracing::warn!(error = %why, "proxying to the API server failed");
                    ApiError::service_unavailable(format!("the API server is unreachable: {why}"))
                }
            }
        })?;
        let status =
            StatusCode::from_u16(resp.status().as_u16()).unwrap_or(StatusCode::BAD_GATEWAY);
        metrics::counter!(PROXIED_REQUESTS, "code" => status.as_u16().to_string()).increment(1);
        let mut out = HttpResponse::build(status);
        let switched = status == StatusCode::SWITCHING_PROTOCOLS && upgrade == Upgrade::WebSocket;
        let typed = resp.headers().contains_key("content-type");
        for (name, value) in resp.headers() {
            // A switch keeps its `Upgrade` (actix adds `Connection: upgrade` itself).
            if (HOP_BY_HOP.contains(&name.as_str()) && !(switched && name == "upgrade"))
                || name.as_str() == "content-length"
            {
                continue;
            }
            out.append_header((name.as_str(), value.as_bytes()));
        }
        if switched {
            let upgraded = hyper::upgrade::on(&mut resp).await.map_err(|e| {
                tracing::warn!(error = %e, "the API server switched protocols but the connection could not be taken over");
                ApiError::service_unavailable(format!("upgrading the connection to the API server: {e}"))
            })?;
            return Ok(without_default_type(
                out.streaming(relay(upgraded, payload_of(body), in_flight)),
                typed,
            ));
        }
        if upgrade == Upgrade::WebSocket {
            // A refused handshake. actix reads the rest of an upgrade request's connection
            // as its payload and would write a streamed answer raw under a chunked header:
            // the answer (a Status) goes whole, and the connection closes after it.
            let body = http_body_util::Limited::new(resp.into_body(), REFUSED_UPGRADE_MAX)
                .collect()
                .await
                .map_err(|e| {
                    ApiError::service_unavailable(format!("reading the API server's answer: {e}"))
                })?
                .to_bytes();
            drop(in_flight);
            return Ok(out.force_close().body(body));
        }
        // The slot is held until the response body ends or the client goes away.
        let stream = resp.into_body().into_data_stream().map(move |chunk| {
            let _held = &in_flight;
            chunk.map_err(|e| actix_web::error::ErrorBadGateway(e.to_string()))
        });
        let res = match hangup {
            Some(sock) => out.streaming(stream.take_until(Box::pin(sock.closed(HANGUP_CHECK)))),
            None => out.streaming(stream),
        };
        Ok(without_default_type(res, typed))
    }

    /// A request body of no declared length (chunked) or a large one, as it arrives, for
    /// the upstream request. A body already known to be empty (none, or an HTTP/2 stream that ended
    /// with its headers) is sent as none, so a GET does not go upstream chunked; the check does not
    /// wait, so a client that stalls before its body stalls only the upstream request,
    /// which the API server's request timeout bounds. The rest is pumped by a task on this
    /// worker (the client's payload cannot leave it) into a bounded channel; past
    /// `max_body` bytes, or if the client's body fails, the upstream body is aborted (the
    /// upstream request fails rather than seeing a truncated body) and the reason is left
    /// in the cell.
    fn stream_body(&self, mut payload: dev::Payload) -> (UpstreamBody, Arc<OnceLock<Error>>) {
        let failure = Arc::new(OnceLock::new());
        if matches!(payload, dev::Payload::None) {
            return (empty(), failure);
        }
        let first = match payload.next().now_or_never() {
            Some(None) => return (empty(), failure),
            Some(Some(first)) => Some(first),
            // Not here yet.
            None => None,
        };
        let mut payload = futures::stream::iter(first).chain(payload);
        let (mut tx, body) = Channel::<Bytes, Error>::new(BODY_CHUNKS);
        let max = self.max_body;
        let cell = failure.clone();
        actix_web::rt::spawn(async move {
            let mut sent = 0usize;
            while let Some(item) = payload.next().await {
                let err = match item {
                    Ok(chunk) => {
                        sent = sent.saturating_add(chunk.len());
                        if sent <= max {
                            if tx.send_data(chunk).await.is_err() {
                                // The upstream request is over (answered or failed).
                                return;
                            }
                            continue;
                        }
                        Error::BodyTooLarge(max)
                    }
                    Err(e) => Error::ReadBody(e.to_string()),
                };
                let _ = cell.set(err.clone());
                tx.abort(err);
                return;
            }
        });
        (body.map_err(BoxError::from).boxed_unsync(), failure)
    }
}

/// actix gives a streamed response `Content-Type: application/octet-stream` when it has
/// none; the API server's answer had none (`typed` false), so neither does the client's.
fn without_default_type(mut res: HttpResponse, typed: bool) -> HttpResponse {
    if !typed {
        res.headers_mut().remove("content-type");
    }
    res
}

/// The most of the API server's answer to a handshake it refused that kcache passes on.
const REFUSED_UPGRADE_MAX: usize = 1 << 20;

/// The most an upgraded connection's relay reads from the API server at a time.
const RELAY_CHUNK: usize = 16 << 10;

/// What a request asks its connection to become.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Upgrade {
    None,
    /// An HTTP/1.1 WebSocket handshake (`Upgrade: websocket`, `Connection: upgrade`): kcache
    /// relays the switched connection byte for byte.
    WebSocket,
    /// Any other protocol (SPDY/3.1): actix reads no stream after such a request's head, so
    /// kcache cannot relay it.
    Other,
}

impl Upgrade {
    fn of(req: &HttpRequest) -> Upgrade {
        match req.headers().get("upgrade").map(|v| v.as_bytes()) {
            None | Some(b"") => Upgrade::None,
            Some(v)
                if v.trim_ascii().eq_ignore_ascii_case(b"websocket") && req.head().upgrade() =>
            {
                Upgrade::WebSocket
            }
            Some(_) => Upgrade::Other,
        }
    }
}

/// The client's side of an upgraded connection: the bytes actix delivers after the
/// handshake's head.
fn payload_of(body: Option<RequestBody>) -> dev::Payload {
    match body {
        Some(RequestBody::Streamed(payload)) => payload,
        _ => dev::Payload::None,
    }
}

/// Relays a switched connection: the API server's bytes are the response body, the
/// client's go upstream from a task on this worker (the payload cannot leave it). The
/// proxy slot is held until the API server's side ends; the client's end of input closes
/// the upstream's write side, as a TCP proxy would.
fn relay(
    upgraded: hyper::upgrade::Upgraded,
    mut payload: dev::Payload,
    slot: impl Send + 'static,
) -> impl futures::Stream<Item = Result<Bytes, actix_web::Error>> {
    use tokio::io::AsyncWriteExt;
    let (read, mut write) = tokio::io::split(hyper_util::rt::TokioIo::new(upgraded));
    actix_web::rt::spawn(async move {
        while let Some(Ok(chunk)) = payload.next().await {
            if write.write_all(&chunk).await.is_err() {
                return;
            }
        }
        let _ = write.shutdown().await;
    });
    futures::stream::unfold((read, slot), |(mut read, slot)| async move {
        use tokio::io::AsyncReadExt;
        let mut buf = bytes::BytesMut::with_capacity(RELAY_CHUNK);
        match read.read_buf(&mut buf).await {
            Ok(0) => None,
            Ok(_) => Some((Ok(buf.freeze()), (read, slot))),
            Err(e) => Some((Err(actix_web::error::ErrorBadGateway(e)), (read, slot))),
        }
    })
}

/// A proxied request's body: read before its slot was taken, or to stream after.
enum RequestBody {
    Whole(UpstreamBody),
    Streamed(dev::Payload),
}

/// Bodies of declared length up to this are read whole before going upstream.
const WHOLE_BODY_MAX: u64 = 64 << 10;

/// How long a client may take to send such a body.
const BODY_READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Reads a body whose `Content-Length` is `len` (at most `WHOLE_BODY_MAX`) to its end.
async fn read_declared(
    mut payload: dev::Payload,
    len: u64,
    req: &HttpRequest,
) -> Result<UpstreamBody, ApiError> {
    let mut buf = bytes::BytesMut::with_capacity(len as usize);
    let read = async {
        while let Some(chunk) = payload.next().await {
            let chunk = chunk
                .map_err(|e| ApiError::bad_request(format!("reading the request body: {e}")))?;
            if (buf.len() + chunk.len()) as u64 > len {
                return Err(ApiError::bad_request(format!(
                    "request body longer than its Content-Length ({len})"
                )));
            }
            buf.extend_from_slice(&chunk);
        }
        Ok(())
    };
    match tokio::time::timeout(BODY_READ_TIMEOUT, read).await {
        Err(_) => return Err(ApiError::bad_request("timed out reading the request body")),
        Ok(r) => r?,
    }
    if buf.len() as u64 != len {
        tracing::warn!(method = %req.method(), path = %req.path(), version = ?req.version(), declared = len, received = buf.len(), "request body shorter than its Content-Length");
        return Err(ApiError::bad_request(format!(
            "request body of {} bytes where its Content-Length says {len}",
            buf.len()
        )));
    }
    Ok(Full::new(buf.freeze())
        .map_err(|never| match never {})
        .boxed_unsync())
}

fn empty() -> UpstreamBody {
    Empty::<Bytes>::new()
        .map_err(|never| match never {})
        .boxed_unsync()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_identities_a_header_carries_unchanged_are_impersonated() {
        let user = |name: &str, groups: &[&str]| crate::auth::UserInfo {
            username: name.into(),
            uid: String::new(),
            groups: groups.iter().map(|g| g.to_string()).collect(),
            extra: Default::default(),
        };
        let table: &[(&str, &[&str], bool)] = &[
            ("system:node:n1", &["system:nodes"], true),
            ("b\u{f8}b", &["g\u{263a}"], true),
            ("a\tb", &[], true),
            ("", &[""], true),
            ("system:node:n1 ", &["system:nodes"], false),
            (" bob", &[], false),
            ("bob\t", &[], false),
            ("bob\n", &[], false),
            ("b\u{0}b", &[], false),
            ("b\u{7f}", &[], false),
            ("bob", &["system:nodes "], false),
            ("bob", &["g\r\n"], false),
            ("system:anonymous", &["g"], false),
            ("system:anonymous", &["system:unauthenticated"], true),
        ];
        for &(name, groups, forwarded) in table {
            assert_eq!(
                unforwardable(&user(name, groups)).is_none(),
                forwarded,
                "{name:?} {groups:?}"
            );
        }
    }

    #[test]
    fn impersonation_scope_admits_only_the_configured_users_and_groups() {
        let user = |name: &str, groups: &[&str]| crate::auth::UserInfo {
            username: name.into(),
            uid: String::new(),
            groups: groups.iter().map(|g| g.to_string()).collect(),
            extra: Default::default(),
        };
        let any = ImpersonationScope::default();
        assert_eq!(any.refuses(&user("admin", &["system:masters"])), None);
        let nodes = ImpersonationScope {
            user_prefixes: vec!["system:node:".into()],
            groups: vec!["system:nodes".into()],
        };
        assert_eq!(
            nodes.refuses(&user("system:node:n1", &["system:nodes"])),
            None
        );
        assert_eq!(nodes.refuses(&user("system:node:n1", &[])), None);
        assert_eq!(
            nodes.refuses(&user(
                "system:node:n1",
                &["system:nodes", "system:authenticated"]
            )),
            None
        );
        assert!(nodes.refuses(&user("viewer", &[])).is_some());
        assert!(nodes
            .refuses(&user("system:nodex", &["system:nodes"]))
            .is_some());
        assert!(nodes
            .refuses(&user("system:node:n1", &["system:nodes", "system:masters"]))
            .is_some());
    }

    #[test]
    fn only_kcache_tokens_change_on_the_way_upstream() {
        use base64::Engine;
        let b64 = |json: &str| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(json);
        let ours = b64(r#"{"v":"kcache.io/v1","rv":9,"start":"a\u0000"}"#);
        let theirs = b64(r#"{"v":"meta.k8s.io/v1","rv":9,"start":"a\u0000"}"#);
        let cases = [
            ("/api/v1/pods".to_string(), "/api/v1/pods".to_string()),
            (
                format!("/api/v1/pods?limit=1&continue={ours}"),
                format!("/api/v1/pods?limit=1&continue={theirs}"),
            ),
            // Every other byte as it came: duplicates, escapes, order, empty pairs.
            (
                format!(
                    "/api/v1/pods?resourceVersion=0&continue={ours}&resourceVersion=2&&x=%41+b"
                ),
                format!(
                    "/api/v1/pods?resourceVersion=0&continue={theirs}&resourceVersion=2&&x=%41+b"
                ),
            ),
            // An escaped key is the same key to Go.
            (
                format!("/api/v1/pods?%63ontinue={ours}"),
                format!("/api/v1/pods?continue={theirs}"),
            ),
            // Go drops a pair with `;`; so does the rewrite, leaving it as it came.
            (
                format!("/api/v1/pods?a=1;continue={ours}"),
                format!("/api/v1/pods?a=1;continue={ours}"),
            ),
            // The API server's tokens and other keys are untouched.
            (
                format!("/api/v1/pods?continue={theirs}&x={ours}"),
                format!("/api/v1/pods?continue={theirs}&x={ours}"),
            ),
        ];
        for (incoming, want) in cases {
            assert_eq!(upstream_target(&incoming), want, "{incoming}");
        }
    }

    #[test]
    fn classifies_as_the_api_server() {
        let get = "GET";
        let cases = [
            (
                get,
                "/api/v1/namespaces/a/pods",
                "watch=1",
                Kind::LongRunning,
            ),
            (
                get,
                "/api/v1/pods",
                "watch=true&resourceVersion=5",
                Kind::LongRunning,
            ),
            (get, "/api/v1/pods", "watch", Kind::LongRunning),
            (get, "/api/v1/pods", "watch=", Kind::LongRunning),
            (get, "/api/v1/pods", "watch=0", Kind::ReadOnly),
            (get, "/api/v1/pods", "watch=False", Kind::ReadOnly),
            (get, "/api/v1/pods", "watch=0&watch=1", Kind::ReadOnly),
            (
                get,
                "/apis/apps/v1/deployments",
                "watch=1",
                Kind::LongRunning,
            ),
            (
                get,
                "/apis/apps/v1/namespaces/a/deployments",
                "watch=1",
                Kind::LongRunning,
            ),
            (
                get,
                "/api/v1/watch/namespaces/a/pods",
                "",
                Kind::LongRunning,
            ),
            (
                get,
                "/api/v1/namespaces/a/pods/p/log",
                "follow=true",
                Kind::LongRunning,
            ),
            (
                get,
                "/api/v1/namespaces/a/pods/p/log",
                "",
                Kind::LongRunning,
            ),
            (
                get,
                "/api/v1/namespaces/a/services/s/proxy/x/y",
                "",
                Kind::LongRunning,
            ),
            (
                "POST",
                "/api/v1/namespaces/a/pods/p/proxy",
                "",
                Kind::LongRunning,
            ),
            (
                get,
                "/api/v1/proxy/namespaces/a/pods/p",
                "",
                Kind::LongRunning,
            ),
            // A named get with ?watch is a get on the API server.
            (
                get,
                "/api/v1/namespaces/a/pods/p",
                "watch=1",
                Kind::ReadOnly,
            ),
            (get, "/api/v1/namespaces/a", "watch=1", Kind::ReadOnly),
            (get, "/api/v1/namespaces", "watch=1", Kind::LongRunning),
            ("PUT", "/api/v1/namespaces/a/finalize", "", Kind::Mutating),
            (
                get,
                "/api/v1/namespaces/a/pods/p/status",
                "",
                Kind::ReadOnly,
            ),
            (get, "/version", "watch=1", Kind::ReadOnly),
            (get, "/api", "", Kind::ReadOnly),
            (get, "/apis/apps", "", Kind::ReadOnly),
            ("HEAD", "/api/v1/pods", "", Kind::ReadOnly),
            (
                "POST",
                "/api/v1/namespaces/a/configmaps",
                "watch=1",
                Kind::Mutating,
            ),
            (
                "PATCH",
                "/api/v1/namespaces/a/configmaps/c",
                "",
                Kind::Mutating,
            ),
            (
                "DELETE",
                "/api/v1/namespaces/a/configmaps",
                "",
                Kind::Mutating,
            ),
        ];
        for (method, path, query, want) in cases {
            assert_eq!(
                Kind::of(method, path, query),
                want,
                "{method} {path}?{query}"
            );
        }
    }

    #[test]
    fn caps_each_kind_apart_and_frees_on_drop() {
        let slots = Slots::new(1, 2, 0);
        let r = slots.admit(Kind::ReadOnly).expect("first read");
        let e = slots
            .admit(Kind::ReadOnly)
            .err()
            .expect("second read refused");
        assert_eq!(
            (e.code, e.reason, e.retry_after),
            (429, "TooManyRequests", Some(1))
        );
        assert_eq!(e.to_status()["details"]["retryAfterSeconds"], 1);
        let _m1 = slots
            .admit(Kind::Mutating)
            .expect("writes have their own slots");
        let _m2 = slots.admit(Kind::Mutating).expect("second write");
        assert!(slots.admit(Kind::Mutating).is_err());
        // 0: no cap.
        let watches: Vec<_> = (0..1000)
            .map(|_| slots.admit(Kind::LongRunning).expect("uncapped"))
            .collect();
        assert_eq!(watches.len(), 1000);
        drop(r);
        let _r = slots.admit(Kind::ReadOnly).expect("slot freed");
    }
}
