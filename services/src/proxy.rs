//! Everything kcache does not serve from its cache goes to the API server unchanged, with
//! the client's own credentials, streamed back — so clients can point their whole
//! kubeconfig at kcache.

use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse};
use futures::StreamExt;
use http_body_util::BodyExt;

use crate::status::ApiError;

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

pub struct Proxy {
    /// A client with the upstream's address and TLS settings but *no* credentials of its
    /// own: the client's Authorization header is what the API server sees.
    client: kube::Client,
    max_body: usize,
}

impl Proxy {
    pub fn new(mut config: kube::Config, max_body: usize) -> Result<Self, kube::Error> {
        config.auth_info = Default::default();
        // Never retry on the client's behalf: writes are not idempotent.
        config.default_retry = false;
        Ok(Proxy {
            client: kube::Client::try_from(config)?,
            max_body,
        })
    }

    pub async fn forward(
        &self,
        req: &HttpRequest,
        body: web::Payload,
    ) -> Result<HttpResponse, ApiError> {
        if req.headers().get("upgrade").is_some_and(|v| !v.is_empty()) {
            return Err(ApiError::bad_request(
                "kcache does not proxy connection upgrades (exec, attach, port-forward); use the API server directly",
            ));
        }
        let bytes = body.to_bytes_limited(self.max_body).await.map_err(|_| {
            ApiError::new(
                413,
                "RequestEntityTooLarge",
                format!("request body larger than {} bytes", self.max_body),
            )
        })?;
        let bytes =
            bytes.map_err(|e| ApiError::bad_request(format!("reading request body: {e}")))?;
        let uri = req
            .uri()
            .path_and_query()
            .map(|pq| pq.as_str().to_string())
            .unwrap_or_else(|| req.path().to_string());
        let mut builder = http::Request::builder()
            .method(req.method().as_str())
            .uri(uri);
        for (name, value) in req.headers() {
            if HOP_BY_HOP.contains(&name.as_str()) {
                continue;
            }
            builder = builder.header(name.as_str(), value.as_bytes());
        }
        let upstream_req = builder
            .body(kube::client::Body::from(bytes))
            .map_err(|e| ApiError::bad_request(format!("invalid request: {e}")))?;
        let resp = self.client.send(upstream_req).await.map_err(|e| {
            tracing::warn!(error = %e, "proxying to the API server failed");
            ApiError::service_unavailable(format!("the API server is unreachable: {e}"))
        })?;
        let status =
            StatusCode::from_u16(resp.status().as_u16()).unwrap_or(StatusCode::BAD_GATEWAY);
        metrics::counter!("kcache_proxied_requests_total", "code" => status.as_u16().to_string())
            .increment(1);
        let mut out = HttpResponse::build(status);
        for (name, value) in resp.headers() {
            if HOP_BY_HOP.contains(&name.as_str()) || name.as_str() == "content-length" {
                continue;
            }
            out.append_header((name.as_str(), value.as_bytes()));
        }
        let stream = resp
            .into_body()
            .into_data_stream()
            .map(|chunk| chunk.map_err(|e| actix_web::error::ErrorBadGateway(e.to_string())));
        Ok(out.streaming(stream))
    }
}
