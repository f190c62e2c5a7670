//! The Kubernetes-compatible API's routing: each request is planned once (`crate::plan`);
//! a planned GET of a cached resource is authenticated and authorized (`crate::access`),
//! served from the cache (`crate::serve`) and audited; everything else, and whatever the
//! cache finds it cannot answer, is proxied (`crate::proxy`) and counted by reason.

use std::time::Instant;

use actix_web::{web, HttpRequest, HttpResponse};
use kcache_actors::core::key::ResourceType;
use kcache_actors::watcher::KeepalivePhase;

use crate::access::{self, CertAuth};
use crate::plan::{self, Forward, Incoming, Op, Plan, Reason};
use crate::request_metrics::{self, ServedBy};
use crate::serve::{self, Served};
use crate::state::ApiState;
use crate::status::ApiError;

pub async fn handle(
    req: HttpRequest,
    body: web::Payload,
    state: web::Data<ApiState>,
) -> Result<HttpResponse, ApiError> {
    let started = Instant::now();
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
    let received = std::time::SystemTime::now();
    let incoming = Incoming {
        method: req.method().as_str(),
        path: req.path(),
        query: req.query_string(),
        accept: req
            .headers()
            .get("accept")
            .and_then(|v| v.to_str().ok())
            .unwrap_or(""),
        impersonating: req
            .headers()
            .keys()
            .any(|h| h.as_str().starts_with("impersonate-")),
    };
    // Only cache-served requests are kcache's to authorize: everything proxied carries the
    // client's own credentials and the API server decides (a kcache continue token goes
    // in the API server's version: `proxy::upstream_target`).
    match plan::plan(&incoming, state.resources.get()) {
        Plan::Serve(planned) => {
            let warnings = state
                .read_warnings
                .get()
                .and_then(|w| w.get(&planned.id))
                .cloned();
            match serve_or_forward(req, state, *planned, received).await {
                Ok(None) => {}
                Ok(Some(r)) => return (ServedBy::Cache, Ok(with_warnings(r, warnings.as_ref()))),
                // As the API server: authorized requests carry the resource's read warnings
                // whatever their outcome; refused ones (and those that found no seat) do
                // not.
                Err(e) if warnings.is_some() && !matches!(e.code, 401 | 403 | 429) => {
                    let r = actix_web::ResponseError::error_response(&e);
                    return (ServedBy::Cache, Ok(with_warnings(r, warnings.as_ref())));
                }
                Err(e) => return (ServedBy::Cache, Err(e)),
            }
        }
        // Planned away before kcache authenticated anything: the API server answers,
        // authentication and authorization first, as for any request it reads.
        Plan::Forward(Forward::Bypass(resource, reason)) => bypassed(&resource, reason),
        Plan::Forward(Forward::Verb | Forward::Impersonation | Forward::Uncached) => {}
    }
    let result = match (
        access::cert_auth(req),
        req.headers().contains_key("authorization"),
    ) {
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

/// Registers a cached resource's series at zero (its cache metrics, and its bypasses for
/// each reason), so dashboards and alerts see their first increment: called once per
/// resource when discovery has said which are cached, before any request is served from
/// the cache.
pub fn register_resource_metrics(resource: &ResourceType) {
    kcache_actors::metrics::register_resource(&resource.group, &resource.resource);
    for reason in Reason::ALL {
        metrics::counter!(
            kcache_actors::metrics::CACHE_BYPASSED,
            "group" => resource.group.clone(),
            "resource" => resource.resource.clone(),
            "reason" => reason.as_str(),
        )
        .increment(0);
    }
}

/// Counts a GET of a cached resource that goes upstream instead, by why.
fn bypassed(resource: &ResourceType, reason: Reason) {
    metrics::counter!(
        kcache_actors::metrics::CACHE_BYPASSED,
        "group" => resource.group.clone(),
        "resource" => resource.resource.clone(),
        "reason" => reason.as_str(),
    )
    .increment(1);
}

/// Authenticates, authorizes, serves from the cache and audits; `None` when the request
/// turned out to be the API server's to answer.
async fn serve_or_forward(
    req: &HttpRequest,
    state: &ApiState,
    planned: plan::Serve,
    received: std::time::SystemTime,
) -> Result<Option<HttpResponse>, ApiError> {
    let plan::Serve {
        resource,
        attrs,
        format,
        op,
        ..
    } = planned;
    let user = access::identify(req, state).await?;
    // A seat for the cache's work, when the cache does the work (a request the plan
    // already knows goes upstream meets the API server's own priority and fairness). A
    // flow is a user; taken before authorization, as the API server's filter sits before
    // its authorizer.
    let seat = match &op {
        Ok(Op::Get { .. } | Op::List { .. } | Op::Watch(_)) => {
            Some(state.fairness.seat(&user.username).await)
        }
        Ok(Op::Forward(_)) | Err(_) => None,
    };
    // Refused a seat: no authorization decision (`None`), as the API server's.
    let (decision, served) = match seat {
        Some(Err(e)) => (None, Err(e)),
        seat => {
            let seat = seat.and_then(Result::ok);
            let decision = access::check(state, &user, &attrs).await;
            let served = match (&decision, op) {
                (Err(e), _) => Err(e.clone()),
                (Ok(()), Err(e)) => Err(e),
                (Ok(()), Ok(op)) => {
                    let conn = req.conn_data::<KeepalivePhase>().copied();
                    serve::serve(state, &user, (&resource, conn), op, format, seat).await
                }
            };
            (Some(decision), served)
        }
    };
    if !matches!(served, Ok(Served::Forward(_))) {
        let decision = decision.as_ref().map(|d| match d {
            Ok(()) => (true, ""),
            Err(e) => (false, e.message.as_str()),
        });
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
            decision,
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
