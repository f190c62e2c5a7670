//! Consistent reads from the cache: before a request that asks for the upstream's
//! current state (a list or streaming list with the resourceVersion omitted), any read of a
//! parked key (which has no upstream watch to hear of a deletion), or any read of Secrets
//! (a deleted credential must not stay readable, not even for the moment a watch's event
//! takes to arrive), is served from a
//! key, kcache proves the key at least as new as the upstream was when the request
//! arrived (`core::fresh` says how), waiting for the key where it is behind and sending
//! the request to the API server where that takes too long.
//!
//! Probes are batched per key, as the API server batches progress requests: a request
//! joins the next probe of its key that starts after it arrived, so however many clients
//! sync one key at once, the upstream sees one probe at a time per key.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use actix::Addr;
use kcache_actors::cached_object::{CachedObject, Read};
use kcache_actors::core::fresh::{judge, Probe, Verdict, Version};
use kcache_actors::core::key::Key;
use kcache_actors::upstream_pool::UpstreamClients;
use thiserror::Error;
use tokio::sync::oneshot;

const PROBES: &str = "kcache_freshness_probes_total";
const CONSISTENT_READS: &str = "kcache_consistent_reads_total";

#[derive(Debug, Error, Clone)]
pub enum Error {
    /// The upstream did not answer the probe (or not with a list): the API server can
    /// answer the request itself.
    #[error("freshness probe of {key} failed: {reason}")]
    ProbeFailed { key: String, reason: String },
    /// The key did not reach the probe's resourceVersion in time, or stopped.
    #[error("{key} did not reach resourceVersion {rv} in time: {reason}")]
    Behind {
        key: String,
        rv: u64,
        reason: String,
    },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// How a consistent read was proven.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Proof {
    /// The key was already as new as the upstream.
    Fresh,
    /// The key was behind and caught up.
    Waited,
}

type Waiting = Vec<oneshot::Sender<Result<Arc<Probe>>>>;

#[derive(Default)]
struct Round {
    running: bool,
    waiting: Waiting,
}

/// Shared by every HTTP worker.
pub struct Freshness {
    clients: Arc<UpstreamClients>,
    rounds: Mutex<HashMap<Key, Round>>,
}

/// Registers the metrics at zero for each outcome, so the first consistent read is seen
/// by `rate()`.
pub fn describe() {
    metrics::describe_counter!(
        PROBES,
        "Freshness probes sent upstream (a metadata-only consistent list of a key), by result."
    );
    metrics::describe_counter!(
        CONSISTENT_READS,
        "Consistent reads (lists and streaming lists with the resourceVersion omitted, and reads answered by a parked key or of Secrets), by outcome: fresh (served at once), waited (served once the key caught up), forwarded (sent to the API server: probe failed or the key did not catch up in time)."
    );
    for result in ["ok", "error"] {
        metrics::counter!(PROBES, "result" => result).increment(0);
    }
    for outcome in ["fresh", "waited", "forwarded"] {
        metrics::counter!(CONSISTENT_READS, "outcome" => outcome).increment(0);
    }
}

impl Freshness {
    pub fn new(clients: Arc<UpstreamClients>) -> Arc<Self> {
        Arc::new(Freshness {
            clients,
            rounds: Mutex::new(HashMap::new()),
        })
    }

    /// Proves `addr` (the CachedObject of `key`, synced) at least as new as the upstream
    /// now; counts the outcome.
    pub async fn prove(self: &Arc<Self>, key: &Key, addr: &Addr<CachedObject>) -> Result<Proof> {
        let result = self.prove_inner(key, addr).await;
        let outcome = match &result {
            Ok(Proof::Fresh) => "fresh",
            Ok(Proof::Waited) => "waited",
            Err(_) => "forwarded",
        };
        metrics::counter!(CONSISTENT_READS, "outcome" => outcome).increment(1);
        result
    }

    async fn prove_inner(self: &Arc<Self>, key: &Key, addr: &Addr<CachedObject>) -> Result<Proof> {
        let probe = self.probe(key).await?;
        let behind = |reason: String| Error::Behind {
            key: key.to_string(),
            rv: probe.rv,
            reason,
        };
        let snap = addr
            .send(Read {
                min_rv: 0,
                at: None,
            })
            .await
            .map_err(|e| behind(e.to_string()))?
            .map_err(|e| behind(e.to_string()))?;
        let versions = snap
            .objects
            .iter()
            .map(|o| Version {
                namespace: o.namespace().to_string(),
                name: o.name().to_string(),
                uid: o.uid().to_string(),
                rv: o.rv(),
            })
            .collect();
        match judge(snap.rv, versions, &probe) {
            Verdict::Fresh => Ok(Proof::Fresh),
            // Not there in time (TooLargeResourceVersion), stopping, or gone: the API
            // server answers instead.
            Verdict::WaitFor(rv) => match addr
                .send(Read {
                    min_rv: rv,
                    at: None,
                })
                .await
            {
                Ok(Ok(_)) => Ok(Proof::Waited),
                Ok(Err(e)) => Err(behind(e.to_string())),
                Err(e) => Err(behind(e.to_string())),
            },
        }
    }

    /// The key's upstream state from a probe that started after this call.
    async fn probe(self: &Arc<Self>, key: &Key) -> Result<Arc<Probe>> {
        let (tx, rx) = oneshot::channel();
        let start = {
            let mut rounds = self.rounds.lock().unwrap_or_else(|e| e.into_inner());
            let round = rounds.entry(key.clone()).or_default();
            round.waiting.push(tx);
            !std::mem::replace(&mut round.running, true)
        };
        if start {
            let this = self.clone();
            let key = key.clone();
            tokio::spawn(async move { this.run_rounds(key).await });
        }
        rx.await.unwrap_or_else(|_| {
            Err(Error::ProbeFailed {
                key: key.to_string(),
                reason: "kcache is shutting down".into(),
            })
        })
    }

    /// Sends probes for `key` while requests wait for one; each answers the requests that
    /// were waiting when it was sent.
    async fn run_rounds(self: Arc<Self>, key: Key) {
        loop {
            let waiting = {
                let mut rounds = self.rounds.lock().unwrap_or_else(|e| e.into_inner());
                let Some(round) = rounds.get_mut(&key) else {
                    return;
                };
                if round.waiting.is_empty() {
                    rounds.remove(&key);
                    return;
                }
                std::mem::take(&mut round.waiting)
            };
            let result = self.send_probe(&key).await.map(Arc::new);
            metrics::counter!(PROBES, "result" => if result.is_ok() { "ok" } else { "error" })
                .increment(1);
            for tx in waiting {
                let _ = tx.send(result.clone());
            }
        }
    }

    /// A metadata-only consistent list (resourceVersion omitted) with the key's own
    /// selector: the reference API server answers it from its watch cache once that is
    /// as new as etcd (consistent reads from cache, 1.31+).
    async fn send_probe(&self, key: &Key) -> Result<Probe> {
        let failed = |reason: String| Error::ProbeFailed {
            key: key.to_string(),
            reason,
        };
        // (The serializer is not Send: finish it before any await.)
        let query = {
            let mut q = url::form_urlencoded::Serializer::new(String::new());
            if let Some(fs) = key.upstream_field_selector() {
                q.append_pair("fieldSelector", &fs);
            }
            q.finish()
        };
        let uri = if query.is_empty() {
            key.upstream_path()
        } else {
            format!("{}?{query}", key.upstream_path())
        };
        let req = http::Request::get(uri)
            .header(
                http::header::ACCEPT,
                "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json",
            )
            .body(Vec::new())
            .map_err(|e| failed(e.to_string()))?;
        let conn = self.clients.checkout();
        let text = conn
            .client()
            .request_text(req)
            .await
            .map_err(|e| failed(e.to_string()))?;
        Probe::from_list_json(text.as_bytes()).map_err(|e| failed(e.to_string()))
    }
}
