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
//! sync one key at once, the upstream sees one probe at a time per key. A probe lists at
//! most `cache.freshness_probe_limit` objects' metadata; a larger key is proven by a short
//! watch of its events instead (`core::fresh::Tail`), which costs the API server nothing
//! per object and the read about a second.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use actix::Addr;
use kcache_actors::cached_object::{CachedObject, Progress, Read};
use kcache_actors::core::fresh::{judge, Probe, Seen, Verdict, Version};
use kcache_actors::core::key::Key;
use kcache_actors::source::UpstreamSource;
use kcache_actors::upstream_pool::UpstreamClients;
use thiserror::Error;
use tokio::sync::oneshot;

const PROBES: &str = "kcache_freshness_probes_total";
const CONSISTENT_READS: &str = "kcache_consistent_reads_total";
const TAILS: &str = "kcache_freshness_tail_watches_total";

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
    /// The key's CachedObject as the latest request to join saw it: a tail starts from
    /// its progress.
    addr: Option<Addr<CachedObject>>,
}

/// Shared by every HTTP worker.
pub struct Freshness {
    clients: Arc<UpstreamClients>,
    upstream: Arc<UpstreamSource>,
    /// Most objects a probe lists (`cache.freshness_probe_limit`; 0: all).
    limit: u64,
    rounds: Mutex<HashMap<Key, Round>>,
    /// Keys whose last tail fell back, until when their probes list them whole: a tail
    /// that got no bookmark (a quiet cluster, the resource's own write the newest) would
    /// add its three seconds to every read of the key before the same list.
    no_tail_until: Mutex<HashMap<Key, Instant>>,
}

/// Why a probe did not end in a tail's proof.
enum NoTail {
    /// The key has nothing to start a tail from (not synced yet).
    NotYet(String),
    /// The tail ran and could not say (no bookmark, a 410, an unordered event), or its
    /// upstream requests failed.
    Failed(String),
}

/// How long a key whose tail fell back is listed whole instead.
const NO_TAIL_FOR: Duration = Duration::from_secs(30);

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
    metrics::describe_counter!(
        TAILS,
        "Freshness proofs of keys larger than cache.freshness_probe_limit by a short upstream watch of the key's events, by result: ok, or fallback (the watch did not say; the whole key's metadata was listed instead)."
    );
    for result in ["ok", "error"] {
        metrics::counter!(PROBES, "result" => result).increment(0);
    }
    for result in ["ok", "fallback"] {
        metrics::counter!(TAILS, "result" => result).increment(0);
    }
    for outcome in ["fresh", "waited", "forwarded"] {
        metrics::counter!(CONSISTENT_READS, "outcome" => outcome).increment(0);
    }
}

impl Freshness {
    pub fn new(
        clients: Arc<UpstreamClients>,
        upstream: Arc<UpstreamSource>,
        limit: u64,
    ) -> Arc<Self> {
        Arc::new(Freshness {
            clients,
            upstream,
            limit,
            rounds: Mutex::new(HashMap::new()),
            no_tail_until: Mutex::new(HashMap::new()),
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
        let probe = self.probe(key, addr).await?;
        let behind = |reason: String| Error::Behind {
            key: key.to_string(),
            rv: probe.rv,
            reason,
        };
        let snap = addr
            .send(Read {
                min_rv: 0,
                at: None,
                // The proof compares the key's whole state with the upstream's.
                asked: None,
            })
            .await
            .map_err(|e| behind(e.to_string()))?
            .map_err(|e| behind(e.to_string()))?;
        let versions = || {
            snap.objects
                .iter()
                .map(|o| Version {
                    namespace: o.namespace().to_string(),
                    name: o.name().to_string(),
                    uid: o.uid().to_string(),
                    rv: o.rv(),
                })
                .collect()
        };
        match judge(snap.rv, versions, &probe) {
            Verdict::Fresh => Ok(Proof::Fresh),
            // Not there in time (TooLargeResourceVersion), stopping, or gone: the API
            // server answers instead.
            Verdict::WaitFor(rv) => match addr
                .send(Read {
                    min_rv: rv,
                    at: None,
                    asked: None,
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
    async fn probe(self: &Arc<Self>, key: &Key, addr: &Addr<CachedObject>) -> Result<Arc<Probe>> {
        let (tx, rx) = oneshot::channel();
        let start = {
            let mut rounds = self.rounds.lock().unwrap_or_else(|e| e.into_inner());
            let round = rounds.entry(key.clone()).or_default();
            round.waiting.push(tx);
            round.addr = Some(addr.clone());
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
            let (waiting, addr) = {
                let mut rounds = self.rounds.lock().unwrap_or_else(|e| e.into_inner());
                let Some(round) = rounds.get_mut(&key) else {
                    return;
                };
                if round.waiting.is_empty() {
                    rounds.remove(&key);
                    return;
                }
                (std::mem::take(&mut round.waiting), round.addr.clone())
            };
            let result = self.send_probe(&key, addr.as_ref()).await.map(Arc::new);
            metrics::counter!(PROBES, "result" => if result.is_ok() { "ok" } else { "error" })
                .increment(1);
            for tx in waiting {
                let _ = tx.send(result.clone());
            }
        }
    }

    /// One page of the key's metadata, or — for a key larger than the page — a tail
    /// watch (`core::fresh` says why that proves as much). A tail that cannot say (the
    /// upstream's cache no longer reaches the key's progress, no bookmark in time) leaves
    /// it to a list of the whole key's metadata.
    async fn send_probe(&self, key: &Key, addr: Option<&Addr<CachedObject>>) -> Result<Probe> {
        // A key of one object is listed whole: with a selector, the upstream would page
        // even that one on (its candidates are the namespace's).
        let limit = if key.holds_at_most_one() {
            0
        } else {
            self.limit
        };
        if self.tail_resting(key) {
            return self.list_probe(key, 0).await;
        }
        let known_large = match addr {
            Some(addr) if limit > 0 => progress(addr)
                .await
                .is_ok_and(|(_, len)| len as u64 > limit),
            _ => false,
        };
        if !known_large {
            let probe = self.list_probe(key, limit).await?;
            if probe.seen != Seen::Partial {
                return Ok(probe);
            }
        }
        match self.tail(key, addr).await {
            Ok(probe) => {
                metrics::counter!(TAILS, "result" => "ok").increment(1);
                Ok(probe)
            }
            // The key cannot start a tail yet (not synced: its first read): list it, as
            // any key's first probe did before tails.
            Err(NoTail::NotYet(reason)) => {
                tracing::debug!(%key, %reason, "no tail watch yet; listing the whole key's metadata");
                self.list_probe(key, 0).await
            }
            Err(NoTail::Failed(reason)) => {
                metrics::counter!(TAILS, "result" => "fallback").increment(1);
                tracing::info!(%key, %reason, secs = NO_TAIL_FOR.as_secs(), "freshness tail watch did not say; listing the whole key's metadata, for a while");
                self.rest_tail(key);
                self.list_probe(key, 0).await
            }
        }
    }

    /// Whether `key`'s tail fell back lately.
    fn tail_resting(&self, key: &Key) -> bool {
        let map = self.no_tail_until.lock().unwrap_or_else(|e| e.into_inner());
        map.get(key).is_some_and(|until| Instant::now() < *until)
    }

    fn rest_tail(&self, key: &Key) {
        let now = Instant::now();
        let mut map = self.no_tail_until.lock().unwrap_or_else(|e| e.into_inner());
        // Bounded by the keys that fell back within the last NO_TAIL_FOR.
        map.retain(|_, until| now < *until);
        map.insert(key.clone(), now + NO_TAIL_FOR);
    }

    /// The tail proof. The watch is registered upstream before the consistent read that
    /// gives the probe's RV `R`: the upstream's cache bookmarks a watch only at an RV past
    /// the watch's own start (its last event of the resource when registered), and the
    /// read moves the cache to `R` — past that start unless the resource's last event is
    /// the newest write in etcd (then no bookmark comes, and the caller lists instead).
    /// Registered after the read, a watch would start at `R` itself whenever the
    /// resource's events made the cache's latest RV.
    async fn tail(
        &self,
        key: &Key,
        addr: Option<&Addr<CachedObject>>,
    ) -> std::result::Result<Probe, NoTail> {
        let addr = addr.ok_or_else(|| NoTail::NotYet("no cached key to start from".into()))?;
        let (from, _) = progress(addr).await.map_err(NoTail::NotYet)?;
        // 0 would ask the upstream for a watch from "any" state, not from the key's.
        if from == 0 {
            return Err(NoTail::NotYet("the key has no progress yet".into()));
        }
        let failed = |e: &dyn std::fmt::Display| NoTail::Failed(e.to_string());
        let watch = self
            .upstream
            .open_tail(key, from)
            .await
            .map_err(|e| failed(&e))?;
        let probe = self.list_probe(key, 1).await.map_err(|e| failed(&e))?;
        if matches!(probe.seen, Seen::Whole(_)) {
            // It shrank to one object or none: that is the whole key.
            return Ok(probe);
        }
        let rv = probe.rv;
        let at = if from >= rv {
            from
        } else {
            watch.until(rv).await.map_err(|e| failed(&e))?
        };
        Ok(Probe {
            rv,
            seen: Seen::SameAs(at),
        })
    }

    /// A metadata-only consistent list (resourceVersion omitted) with the key's own
    /// selector, of at most `limit` objects (0: all): the reference API server answers it
    /// from its watch cache once that is as new as etcd (consistent reads from cache,
    /// 1.31+).
    async fn list_probe(&self, key: &Key, limit: u64) -> Result<Probe> {
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
            if limit > 0 {
                q.append_pair("limit", &limit.to_string());
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

/// The key's progress RV and how many objects it holds (no copy of its state).
async fn progress(addr: &Addr<CachedObject>) -> std::result::Result<(u64, usize), String> {
    addr.send(Progress)
        .await
        .map_err(|e| e.to_string())?
        .ok_or_else(|| "the key is not synced".to_string())
}
