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
    /// kcache's own identity, used only to impersonate client-certificate users when
    /// `auth.impersonate_cert_users` is on.
    impersonator: Option<kube::Client>,
    max_body: usize,
}

impl Proxy {
    pub fn new(
        config: kube::Config,
        max_body: usize,
        impersonate_cert_users: bool,
    ) -> Result<Self, kube::Error> {
        // Never retry on the client's behalf: writes are not idempotent.
        let mut own = config;
        own.default_retry = false;
        let mut anonymous = own.clone();
        anonymous.auth_info = Default::default();
        Ok(Proxy {
            client: kube::Client::try_from(anonymous)?,
            impersonator: if impersonate_cert_users {
                Some(kube::Client::try_from(own)?)
            } else {
                None
            },
            max_body,
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
        let Some(client) = &self.impersonator else {
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
        self.send(client, req, body, Some(user)).await
    }

    async fn send(
        &self,
        client: &kube::Client,
        req: &HttpRequest,
        body: web::Payload,
        impersonate: Option<&crate::auth::UserInfo>,
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
        if let Some(user) = impersonate {
            builder = builder.header("Impersonate-User", user.username.as_str());
            for g in user.groups.iter().filter(|g| *g != "system:authenticated") {
                builder = builder.header("Impersonate-Group", g.as_str());
            }
        }
        let upstream_req = builder
            .body(kube::client::Body::from(bytes))
            .map_err(|e| ApiError::bad_request(format!("invalid request: {e}")))?;
        let resp = client.send(upstream_req).await.map_err(|e| {
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
