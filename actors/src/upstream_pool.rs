//! Connections to the API server for upstream lists and watches.
//!
//! kube-rs's stock client speaks HTTP/1.1, so every upstream watch is its own TCP and TLS
//! connection: at thousands of keys that is thousands of handshakes on the API server and
//! tens of KiB of TLS and socket buffers per key on both sides. client-go multiplexes its
//! watches over HTTP/2 instead; so does kcache. An HTTP/2 connection carries only as many
//! streams as the server's `SETTINGS_MAX_CONCURRENT_STREAMS`, and hyper queues a request
//! past that limit until a stream ends — which for watches is never — so the pool caps
//! the streams it puts on one connection (`upstream_streams_per_connection`, well under
//! Go's default of 250) and opens another connection when all are full.
//!
//! Each [`kube::Client`] in the pool owns its own hyper connection pool, so one client is
//! one HTTP/2 connection. A [`Checkout`] counts a stream against its connection for as
//! long as the caller holds it.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client as HyperClient;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use kube::client::ConfigExt;
use tower::{BoxError, ServiceBuilder};

use crate::metrics as m;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("building the upstream HTTP/2 client: {0}")]
    Client(#[source] kube::Error),
    #[error("upstream TLS server name {name:?} is invalid")]
    ServerName { name: String },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Which connection a new stream goes on: the least loaded one with room, or `None` when
/// every connection holds `per_conn` streams already (open a new one).
pub fn pick(loads: &[usize], per_conn: usize) -> Option<usize> {
    loads
        .iter()
        .enumerate()
        .filter(|(_, &n)| n < per_conn.max(1))
        .min_by_key(|(_, &n)| n)
        .map(|(i, _)| i)
}

type MakeClient = dyn Fn() -> Result<kube::Client> + Send + Sync;

struct Conn {
    client: kube::Client,
    streams: Arc<AtomicUsize>,
}

/// The upstream clients: HTTP/2 connections opened as streams need them, or one shared
/// HTTP/1.1 client (see [`UpstreamClients::single`]). A mutex, not an actor: every list,
/// watch and review takes a connection here on its own task, and the lock is held only to
/// pick one (or push a new one), never across a request.
pub struct UpstreamClients {
    conns: Mutex<Vec<Conn>>,
    make: Box<MakeClient>,
    per_conn: usize,
}

/// One stream's hold on a connection; the count drops with it.
pub struct Checkout {
    client: kube::Client,
    streams: Arc<AtomicUsize>,
}

impl Checkout {
    pub fn client(&self) -> &kube::Client {
        &self.client
    }
}

impl Drop for Checkout {
    fn drop(&mut self) {
        self.streams.fetch_sub(1, Ordering::Relaxed);
    }
}

impl UpstreamClients {
    /// HTTP/2 connections to the API server of `config`, at most `per_conn` streams each.
    /// Falls back to [`UpstreamClients::single`] for a plain-HTTP server (Go serves h2c
    /// only with a special handler, the API server has none).
    pub fn http2(config: kube::Config, per_conn: usize) -> Result<Self> {
        if config.cluster_url.scheme_str() != Some("https") {
            let client = kube::Client::try_from(config).map_err(Error::Client)?;
            return Ok(Self::single(client));
        }
        // Built now, so unusable TLS settings fail at start, not on the first watch; it
        // connects on its first request.
        let first = Conn {
            client: http2_client(&config)?,
            streams: Arc::new(AtomicUsize::new(0)),
        };
        metrics::gauge!(m::UPSTREAM_CONNECTIONS).set(1.0);
        Ok(UpstreamClients {
            conns: Mutex::new(vec![first]),
            make: Box::new(move || http2_client(&config)),
            per_conn: per_conn.max(1),
        })
    }

    /// Every stream on one client (kube-rs's own, HTTP/1.1: a connection per stream).
    pub fn single(client: kube::Client) -> Self {
        UpstreamClients {
            conns: Mutex::new(vec![Conn {
                client: client.clone(),
                streams: Arc::new(AtomicUsize::new(0)),
            }]),
            make: Box::new(move || Ok(client.clone())),
            per_conn: usize::MAX,
        }
    }

    /// A client for one more stream: held for the stream's lifetime.
    pub fn checkout(&self) -> Checkout {
        let mut conns = self.conns.lock().unwrap_or_else(|e| e.into_inner());
        let loads: Vec<usize> = conns
            .iter()
            .map(|c| c.streams.load(Ordering::Relaxed))
            .collect();
        let i = match pick(&loads, self.per_conn) {
            Some(i) => i,
            None => match (self.make)() {
                Ok(client) => {
                    conns.push(Conn {
                        client,
                        streams: Arc::new(AtomicUsize::new(0)),
                    });
                    metrics::gauge!(m::UPSTREAM_CONNECTIONS).set(conns.len() as f64);
                    conns.len() - 1
                }
                Err(e) => {
                    // The config was usable at start; if it no longer is (a rotated
                    // certificate file gone), overfill the least loaded connection rather
                    // than fail the key: its request waits for a free stream.
                    tracing::error!(error = %e, "cannot open another upstream connection");
                    let least = loads.iter().enumerate().min_by_key(|(_, &n)| n);
                    least.map_or(0, |(i, _)| i)
                }
            },
        };
        let conn = &conns[i];
        conn.streams.fetch_add(1, Ordering::Relaxed);
        Checkout {
            client: conn.client.clone(),
            streams: conn.streams.clone(),
        }
    }

    /// Streams per connection now, for `/debug` and tests.
    pub fn loads(&self) -> Vec<usize> {
        let conns = self.conns.lock().unwrap_or_else(|e| e.into_inner());
        conns
            .iter()
            .map(|c| c.streams.load(Ordering::Relaxed))
            .collect()
    }
}

/// The client for kcache's own short requests (TokenReview, SubjectAccessReview,
/// discovery): HTTP/2 as well, on its own connection, so a burst of new watches, each
/// authenticated and authorized upstream, does not open a connection per request.
pub fn control_client(config: &kube::Config) -> Result<kube::Client> {
    if config.cluster_url.scheme_str() == Some("https") {
        http2_client(config)
    } else {
        kube::Client::try_from(config.clone()).map_err(Error::Client)
    }
}

/// One HTTP/2-only kube client: kube-rs's layers (base URI, auth, extra headers such as
/// impersonation) over a hyper client whose TLS offers only `h2`. No read timeout as
/// kube-rs sets for HTTP/1.1: a connection carries many quiet watches; HTTP/2 pings find
/// a dead one instead.
fn http2_client(config: &kube::Config) -> Result<kube::Client> {
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_nodelay(true);
    http.set_connect_timeout(config.connect_timeout);
    let tls = config.rustls_client_config().map_err(Error::Client)?;
    let builder = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http();
    let builder = match &config.tls_server_name {
        Some(name) => {
            let server_name = rustls_pki_types::ServerName::try_from(name.clone())
                .map_err(|_| Error::ServerName { name: name.clone() })?;
            builder
                .with_server_name_resolver(hyper_rustls::FixedServerNameResolver::new(server_name))
        }
        None => builder,
    };
    let https = builder.enable_http2().wrap_connector(http);
    let hyper = HyperClient::builder(TokioExecutor::new())
        // HTTP/2 keep-alive pings need a timer.
        .timer(TokioTimer::new())
        .http2_only(true)
        .http2_keep_alive_interval(Duration::from_secs(30))
        .http2_keep_alive_timeout(Duration::from_secs(15))
        .http2_keep_alive_while_idle(true)
        .build(https);
    let service = ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(config.auth_layer().map_err(Error::Client)?)
        .layer(config.extra_headers_layer().map_err(Error::Client)?)
        .map_err(BoxError::from)
        .service(hyper);
    Ok(kube::Client::new(service, config.default_namespace.clone()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn picks_the_least_loaded_connection_with_room() {
        assert_eq!(pick(&[], 100), None);
        assert_eq!(pick(&[3, 1, 2], 100), Some(1));
        assert_eq!(pick(&[100, 99, 100], 100), Some(1));
        assert_eq!(pick(&[100, 100], 100), None);
        // A zero cap still allows one stream per connection.
        assert_eq!(pick(&[0], 0), Some(0));
        assert_eq!(pick(&[1], 0), None);
    }

    #[tokio::test]
    async fn opens_a_connection_per_full_set_of_streams_and_frees_on_drop() {
        let config = kube::Config::new("https://127.0.0.1:1".parse().expect("url"));
        let pool = UpstreamClients::http2(config, 2).expect("pool");
        let a = pool.checkout();
        let b = pool.checkout();
        assert_eq!(pool.loads(), vec![2]);
        let c = pool.checkout();
        assert_eq!(pool.loads(), vec![2, 1]);
        drop(c);
        drop(a);
        // The emptier connection takes the next stream.
        let d = pool.checkout();
        assert_eq!(pool.loads(), vec![1, 1]);
        let e = pool.checkout();
        assert_eq!(pool.loads(), vec![2, 1]);
        drop((b, d, e));
        assert_eq!(pool.loads(), vec![0, 0]);
    }
}
