//! The client and connection model, identical for both targets: HTTPS (certificates not
//! verified: both serve self-signed ones), HTTP/2 with `per_connection` watches
//! multiplexed on each connection (one `reqwest::Client` per connection), bearer token.
//! Also [`Api`], the small write/setup client that always talks to the API server.

use std::net::{IpAddr, Ipv4Addr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

use futures::StreamExt;
use serde_json::Value;

/// How watch connections are made.
#[derive(Clone, Debug)]
pub struct ConnModel {
    pub http1: bool,
    pub per_connection: usize,
    /// Connections are spread over 127.0.0.1..=127.0.0.N as source addresses.
    pub source_addrs: u8,
}

/// A client that owns one HTTP/2 connection (or, with HTTP/1.1, a pool of them).
pub fn http_client(http1: bool, local: Option<IpAddr>) -> reqwest::Client {
    let b = reqwest::Client::builder()
        .danger_accept_invalid_certs(true)
        .pool_max_idle_per_host(1)
        .tcp_nodelay(true)
        .connect_timeout(Duration::from_secs(30))
        .local_address(local);
    let b = if http1 { b.http1_only() } else { b };
    // Only fails if the TLS backend cannot initialise: not a runtime condition.
    b.build().expect("building the HTTP client")
}

/// One node's connection, as a kubelet holds one: HTTP/2 with the protocol known up front
/// (ALPN `h2` only), so the node's concurrent requests wait for one connection instead of
/// racing a handshake each, as Go's HTTP/2 transport shares one dial per host. `http1`:
/// one connection per concurrent request instead.
pub fn node_client(http1: bool) -> reqwest::Client {
    let b = reqwest::Client::builder()
        .danger_accept_invalid_certs(true)
        .pool_max_idle_per_host(1)
        .tcp_nodelay(true)
        .connect_timeout(Duration::from_secs(30));
    let b = if http1 {
        b.http1_only()
    } else {
        b.http2_prior_knowledge()
    };
    // Only fails if the TLS backend cannot initialise: not a runtime condition.
    b.build().expect("building the HTTP client")
}

/// A plain client for setup, writes and scrapes: certificates not verified (both targets
/// serve self-signed ones), connecting within `connect`, each request given up after
/// `timeout` when one is given.
pub fn insecure_client(connect: Duration, timeout: Option<Duration>) -> reqwest::Client {
    let mut b = reqwest::Client::builder()
        .danger_accept_invalid_certs(true)
        .connect_timeout(connect);
    if let Some(t) = timeout {
        b = b.timeout(t);
    }
    // Only fails if the TLS backend cannot initialise: not a runtime condition.
    b.build().expect("building the HTTP client")
}

/// The clients a set of watches is spread over: watch `i` uses connection
/// `i / per_connection` (HTTP/2), so both targets see the same number of connections.
/// Each client is built when its first watch asks for it: a pool whose watches a
/// scenario hands to watch workers ([`crate::workers`]) builds none here, and 30,000
/// clients' TLS configurations are not small.
pub struct ConnPool {
    /// Unique in this process: a watch worker keys its connections by pool and number.
    id: u64,
    clients: Vec<OnceLock<reqwest::Client>>,
    make: Make,
    per_connection: usize,
    /// Connection `c` authenticates as node `c` ([`node_token`]) instead of with the
    /// scenario's token.
    node_tokens: bool,
    /// Base URLs the connections are spread over (a fleet's replicas, as nodes behind a
    /// Service), connection `c` on `bases[c % len]`; empty: the target's URL.
    bases: Vec<String>,
}

/// The user name of simulated node `n` (`system:node:` + this).
pub fn node_name(n: usize) -> String {
    format!("bench-node-{n}")
}

/// The bearer token of simulated node `n`, as `scripts/start-test-cluster.sh` writes it
/// into the API server's token file with `KUBE_NODE_TOKENS`.
pub fn node_token(n: usize) -> String {
    format!("bench-node-{n}-token")
}

fn next_pool_id() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// How a pool's connection number `c` gets its client.
#[derive(Clone, Copy)]
enum Make {
    /// [`http_client`], from 127.0.0.(1 + c % addrs) when `addrs` > 1.
    Spread { http1: bool, addrs: u8 },
    /// [`node_client`] (HTTP/2, prior knowledge).
    Node,
}

impl Make {
    fn client(self, c: usize) -> reqwest::Client {
        match self {
            Make::Spread { http1, addrs } => {
                let local = (addrs > 1).then(|| {
                    // 127.0.0.1, 127.0.0.2, ...: loopback accepts any 127/8 source.
                    let last = 1 + (c % usize::from(addrs)) as u8;
                    IpAddr::V4(Ipv4Addr::new(127, 0, 0, last))
                });
                http_client(http1, local)
            }
            Make::Node => node_client(false),
        }
    }
}

impl ConnPool {
    pub fn new(model: &ConnModel, watches: usize) -> ConnPool {
        let per_connection = if model.http1 {
            usize::MAX // one pooled client; hyper opens a connection per concurrent request
        } else {
            model.per_connection.max(1)
        };
        let n = if model.http1 {
            usize::from(model.source_addrs.max(1))
        } else {
            watches.div_ceil(per_connection).max(1)
        };
        ConnPool {
            id: next_pool_id(),
            clients: (0..n).map(|_| OnceLock::new()).collect(),
            make: Make::Spread {
                http1: model.http1,
                addrs: model.source_addrs,
            },
            per_connection,
            node_tokens: false,
            bases: Vec::new(),
        }
    }

    /// One connection per node, as a kubelet holds: `nodes` clients, node `n`'s watches
    /// being numbers `n × per_node ..` (`per_node` each). HTTP/2 with the protocol known
    /// up front (ALPN `h2` only), so a node's concurrent requests wait for one connection
    /// instead of racing a handshake each, as Go's HTTP/2 transport shares one dial per
    /// host. With `--http1` (`model.http1`), as [`ConnPool::new`].
    pub fn per_node(model: &ConnModel, nodes: usize, per_node: usize) -> ConnPool {
        if model.http1 {
            return ConnPool::new(model, nodes * per_node);
        }
        ConnPool {
            id: next_pool_id(),
            clients: (0..nodes.max(1)).map(|_| OnceLock::new()).collect(),
            make: Make::Node,
            per_connection: per_node.max(1),
            node_tokens: false,
            bases: Vec::new(),
        }
    }

    /// Each connection authenticates as its node: watch `i` with the token of node
    /// `connection(i)` ([`ConnPool::token`]).
    pub fn node_identities(mut self, on: bool) -> ConnPool {
        self.node_tokens = on;
        self
    }

    /// The token watch `i` must use instead of the scenario's, if its node has its own.
    pub fn token(&self, i: usize) -> Option<String> {
        self.node_tokens.then(|| node_token(self.connection(i)))
    }

    /// Spreads the connections over `bases` round robin (none: the target's own URL).
    pub fn route(mut self, bases: Vec<String>) -> ConnPool {
        self.bases = bases;
        self
    }

    /// The base URL of watch number `i`'s connection, if the pool is routed.
    pub fn base(&self, i: usize) -> Option<&str> {
        if self.bases.is_empty() {
            return None;
        }
        Some(&self.bases[self.connection(i) % self.bases.len()])
    }

    /// The client for watch number `i`.
    pub fn get(&self, i: usize) -> reqwest::Client {
        let c = self.connection(i);
        self.clients[c].get_or_init(|| self.make.client(c)).clone()
    }

    /// The connection (client) number of watch number `i`.
    pub fn connection(&self, i: usize) -> usize {
        if self.per_connection == usize::MAX {
            i % self.clients.len()
        } else {
            (i / self.per_connection).min(self.clients.len() - 1)
        }
    }

    pub fn connections(&self) -> usize {
        self.clients.len()
    }

    /// This pool's number, unique in this process.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Whether a worker process can hold this pool's connections as it does: one
    /// HTTP/2 node connection per number ([`node_client`]), nothing else to carry over.
    pub fn is_per_node(&self) -> bool {
        matches!(self.make, Make::Node)
    }
}

/// Failure of a setup or write request.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("{0}")]
    Http(#[from] reqwest::Error),
    #[error("HTTP {0}")]
    Status(u16),
}

/// What [`Api::create_all`] did.
#[derive(Clone, Copy, Debug, Default)]
pub struct Created {
    pub created: usize,
    /// Already there (409): the setup is idempotent.
    pub existed: usize,
    pub failed: usize,
}

/// Requests to one server with the bench token.
#[derive(Clone)]
pub struct Api {
    pub http: reqwest::Client,
    pub base: String,
    pub token: String,
}

impl Api {
    pub fn new(base: &str, token: &str) -> Api {
        Api {
            http: http_client(false, None),
            base: base.trim_end_matches('/').to_string(),
            token: token.to_string(),
        }
    }

    fn check(resp: reqwest::Response) -> Result<reqwest::Response, ApiError> {
        if resp.status().is_success() {
            Ok(resp)
        } else {
            Err(ApiError::Status(resp.status().as_u16()))
        }
    }

    /// POST `body` to a collection path (e.g. `/api/v1/namespaces/x/secrets`).
    pub async fn create(&self, path: &str, body: &Value) -> Result<(), ApiError> {
        let resp = self
            .http
            .post(format!("{}{path}", self.base))
            .bearer_auth(&self.token)
            .json(body)
            .send()
            .await?;
        Self::check(resp).map(drop)
    }

    /// Creates, treating 409 AlreadyExists as success (setup is idempotent).
    pub async fn ensure(&self, path: &str, body: &Value) -> Result<(), ApiError> {
        match self.create(path, body).await {
            Err(ApiError::Status(409)) => Ok(()),
            other => other,
        }
    }

    async fn send_merge_patch(
        &self,
        path: &str,
        patch: &Value,
    ) -> Result<reqwest::Response, ApiError> {
        let resp = self
            .http
            .patch(format!("{}{path}", self.base))
            .bearer_auth(&self.token)
            .header("Content-Type", "application/merge-patch+json")
            .body(patch.to_string())
            .send()
            .await?;
        Self::check(resp)
    }

    /// JSON merge patch of an object path.
    pub async fn merge_patch(&self, path: &str, patch: &Value) -> Result<(), ApiError> {
        self.send_merge_patch(path, patch).await.map(drop)
    }

    /// JSON merge patch of an object path; the object as the server returned it.
    pub async fn merge_patch_object(&self, path: &str, patch: &Value) -> Result<Value, ApiError> {
        Ok(self.send_merge_patch(path, patch).await?.json().await?)
    }

    pub async fn delete(&self, path: &str) -> Result<(), ApiError> {
        let resp = self
            .http
            .delete(format!("{}{path}", self.base))
            .bearer_auth(&self.token)
            .send()
            .await?;
        Self::check(resp).map(drop)
    }

    pub async fn get_json(&self, path_and_query: &str) -> Result<Value, ApiError> {
        let resp = self
            .http
            .get(format!("{}{path_and_query}", self.base))
            .bearer_auth(&self.token)
            .send()
            .await?;
        Ok(Self::check(resp)?.json().await?)
    }

    /// Creates many objects, 16 requests at a time.
    pub async fn create_all(&self, items: Vec<(String, Value)>) -> Created {
        let mut n = Created::default();
        let mut todo = items;
        // A busy API server sheds some creates (429, 5xx, timeouts): retry those, so no
        // watch of the plan waits for an object that was never made.
        for attempt in 1..=4 {
            let results: Vec<((String, Value), Result<(), ApiError>)> = futures::stream::iter(todo)
                .map(|(path, body)| async move {
                    let r = self.create(&path, &body).await;
                    ((path, body), r)
                })
                .buffer_unordered(16)
                .collect()
                .await;
            todo = Vec::new();
            for (item, r) in results {
                match r {
                    Ok(()) => n.created += 1,
                    Err(ApiError::Status(409)) => n.existed += 1,
                    Err(_) => todo.push(item),
                }
            }
            if todo.is_empty() {
                break;
            }
            tokio::time::sleep(Duration::from_secs(attempt)).await;
        }
        n.failed = todo.len();
        n
    }

    /// A namespace, and in it a `default` ServiceAccount that mounts no token (there is
    /// no controller manager to create either; pods need the ServiceAccount to exist).
    pub async fn ensure_namespace(&self, ns: &str) -> Result<(), ApiError> {
        self.ensure(
            "/api/v1/namespaces",
            &serde_json::json!({"metadata": {"name": ns}}),
        )
        .await?;
        self.ensure(
            &format!("/api/v1/namespaces/{ns}/serviceaccounts"),
            &serde_json::json!({"metadata": {"name": "default"}, "automountServiceAccountToken": false}),
        )
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_routed_pool_sends_each_nodes_connection_to_one_replica_in_turn() {
        let model = ConnModel {
            http1: false,
            per_connection: 100,
            source_addrs: 1,
        };
        let bases = vec![
            "https://r0".to_string(),
            "https://r1".to_string(),
            "https://r2".to_string(),
        ];
        let pool = ConnPool::per_node(&model, 4, 3).route(bases);
        // Node n's watches are numbers 3n..3n+2, all on replica n % 3.
        let got: Vec<&str> = (0..12).filter_map(|i| pool.base(i)).collect();
        assert_eq!(
            got,
            [
                "https://r0",
                "https://r0",
                "https://r0",
                "https://r1",
                "https://r1",
                "https://r1",
                "https://r2",
                "https://r2",
                "https://r2",
                "https://r0",
                "https://r0",
                "https://r0",
            ]
        );
        let unrouted = ConnPool::per_node(&model, 4, 3);
        assert_eq!(unrouted.base(5), None);
    }
}
