//! The clients' HTTP: a `kube::Client` whose requests go to a *home* server first and,
//! when that one cannot be reached, to the next live one — a client-go client behind a
//! load balancer over the kcache replicas: a broken watch is resumed from its last
//! resourceVersion on whichever replica answers.
//!
//! Built from hyper-util + hyper-rustls rather than `kube::Client::try_from(Config)` for
//! three reasons: kube-rs's own connector speaks HTTP/1.1 only, and kubelets and
//! informers use HTTP/2; the stream window is ours to set (64 KiB, HTTP/2's initial
//! window, so a client that stops reading pushes back on the server within a few dozen
//! events — the slow-client fault); and the transport sees every watch request, so it
//! can log where each watch of a kube-rs watcher starts ([`Obs::Watch`]), which kube-rs
//! does not expose and the judge needs.

use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::future::BoxFuture;
use http::{Request, Response};
use http_body_util::combinators::BoxBody;
use http_body_util::BodyExt;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client as HyperClient;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use kube::client::{Body, ConfigExt};
use tower::BoxError;

use super::observe::{now_ms, Log, Obs};

type Https = hyper_rustls::HttpsConnector<HttpConnector>;

/// How long a request may take to get its response headers before the client tries the
/// next server. It stands in for client-go's 10 s TLS handshake timeout, which is what
/// moves a client off a server that accepts connections but does not answer (a paused
/// process: the kernel still completes the TCP handshake).
const HEADERS_TIMEOUT: Duration = Duration::from_secs(12);

/// One server the clients can talk to.
pub struct Endpoint {
    pub name: String,
    /// `https://host:port`, no trailing slash.
    pub base: String,
    client: HyperClient<Https, Body>,
}

impl Endpoint {
    /// An HTTP/2 client of `base` (certificate not verified: kcache's and the test API
    /// server's are self-signed).
    pub fn new(name: &str, base: &str) -> Result<Endpoint, BoxError> {
        let mut cfg = kube::Config::new(base.parse()?);
        cfg.accept_invalid_certs = true;
        // hyper-rustls sets ALPN itself: `h2` alone, from `enable_http2` below.
        let tls = cfg.rustls_client_config()?;
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        http.set_nodelay(true);
        http.set_connect_timeout(Some(Duration::from_secs(3)));
        let https = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http()
            .enable_http2()
            .wrap_connector(http);
        let client = HyperClient::builder(TokioExecutor::new())
            .http2_only(true)
            .http2_initial_stream_window_size(64 * 1024)
            // client-go's HTTP/2 health check (ReadIdleTimeout 30 s, PingTimeout 15 s):
            // a connection to a process that stopped answering is dropped eventually.
            .timer(TokioTimer::new())
            .http2_keep_alive_interval(Duration::from_secs(30))
            .http2_keep_alive_timeout(Duration::from_secs(15))
            .build(https);
        Ok(Endpoint {
            name: name.to_string(),
            base: base.trim_end_matches('/').to_string(),
            client,
        })
    }
}

/// A tower service for `kube::Client::new`: home first, then the others in order.
#[derive(Clone)]
pub struct Failover {
    endpoints: Arc<Vec<Endpoint>>,
    home: usize,
    token: Arc<str>,
    /// Where watch requests are logged, for a client whose watch starts the judge needs.
    log: Option<Arc<Log>>,
}

/// The `resourceVersion` of a watch request's query, if it is one.
fn watch_from(query: Option<&str>) -> Option<u64> {
    let q = query?;
    let mut watch = false;
    let mut rv = None;
    for pair in q.split('&') {
        match pair.split_once('=') {
            Some(("watch", v)) => watch = v == "true" || v == "1",
            Some(("resourceVersion", v)) => rv = v.parse().ok(),
            _ => {}
        }
    }
    watch.then_some(rv.unwrap_or(0))
}

impl Failover {
    pub fn new(
        endpoints: Arc<Vec<Endpoint>>,
        home: usize,
        token: &str,
        log: Option<Arc<Log>>,
    ) -> Failover {
        Failover {
            endpoints,
            home,
            token: token.into(),
            log,
        }
    }

    /// A kube client over this service.
    pub fn into_client(self, namespace: &str) -> kube::Client {
        kube::Client::new(self, namespace)
    }
}

impl tower::Service<Request<Body>> for Failover {
    type Response = Response<BoxBody<bytes::Bytes, BoxError>>;
    type Error = BoxError;
    type Future = BoxFuture<'static, Result<Self::Response, BoxError>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<Body>) -> Self::Future {
        let endpoints = self.endpoints.clone();
        let home = self.home;
        let token = self.token.clone();
        let log = self.log.clone();
        Box::pin(async move {
            let (parts, body) = req.into_parts();
            let from = watch_from(parts.uri.query());
            // Only reads move between servers: their bodies are empty, so the request
            // can be made again. A write goes to the home server alone.
            let retry = parts.method == http::Method::GET;
            let mut body = Some(body);
            let path = parts
                .uri
                .path_and_query()
                .map(|p| p.as_str().to_string())
                .unwrap_or_else(|| "/".into());
            let n = endpoints.len();
            let mut last_err: BoxError = "no server to send to".into();
            for i in 0..n {
                let ep = &endpoints[(home + i) % n];
                let mut b = Request::builder()
                    .method(parts.method.clone())
                    .uri(format!("{}{path}", ep.base));
                for (k, v) in &parts.headers {
                    b = b.header(k, v);
                }
                b = b.header(http::header::AUTHORIZATION, format!("Bearer {token}"));
                let this_body = if retry {
                    Body::empty()
                } else {
                    body.take().unwrap_or_else(Body::empty)
                };
                let req = b.body(this_body)?;
                match tokio::time::timeout(HEADERS_TIMEOUT, ep.client.request(req)).await {
                    Ok(Ok(resp)) => {
                        if let (Some(log), Some(from)) = (&log, from) {
                            log.push(Obs::Watch {
                                at_ms: now_ms(),
                                from,
                                replica: ep.name.clone(),
                                status: resp.status().as_u16(),
                            });
                        }
                        return Ok(resp.map(|b| b.map_err(BoxError::from).boxed()));
                    }
                    Ok(Err(e)) => last_err = format!("{}: {e}", ep.name).into(),
                    Err(_) => last_err = format!("{}: no response headers in 12 s", ep.name).into(),
                }
                if !retry {
                    break;
                }
            }
            Err(last_err)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn watch_requests_are_recognised() {
        assert_eq!(
            watch_from(Some(
                "watch=true&resourceVersion=42&allowWatchBookmarks=true"
            )),
            Some(42)
        );
        assert_eq!(watch_from(Some("resourceVersion=0&limit=500")), None);
        assert_eq!(watch_from(Some("watch=1")), Some(0));
        assert_eq!(watch_from(None), None);
    }
}
