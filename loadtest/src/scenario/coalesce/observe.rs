//! What the coalescing scenario reads from the servers while it runs: the API server's
//! watches by resource, its live heap after a forced collection, kcache's coalescing
//! metrics and its upstream watches per namespace (`/debug/keys`), and a sampler of both
//! servers' registered watches and RSS for the peaks.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::{json, Value};

use super::super::{Ctx, Target};
use super::NS_PREFIX;
use crate::probe;

/// What the servers say at one moment.
#[derive(Clone, Debug, Default, Serialize)]
pub(super) struct Snapshot {
    pub(super) apiserver_rss_kib: u64,
    pub(super) target_rss_kib: u64,
    /// The API server's watches by resource.
    pub(super) apiserver_watches: BTreeMap<String, f64>,
    /// The API server's `go_memstats_heap_inuse_bytes`: live heap, which RSS lags behind
    /// (the Go runtime returns freed memory to the system slowly).
    pub(super) apiserver_heap_inuse_bytes: Option<f64>,
    /// The API server's `go_goroutines`.
    pub(super) apiserver_goroutines: Option<f64>,
    /// kcache's metrics (kcache targets).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub(super) kcache: BTreeMap<&'static str, f64>,
}

/// The API server's Go memory after a forced garbage collection
/// (`/debug/pprof/heap?gc=1&debug=1`, whose trailer has the runtime's MemStats): live
/// memory, which RSS only follows slowly (freed pages go back to the system in the
/// background, and a Go process's RSS runs up to about twice its live heap).
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub(super) struct Heap {
    /// `HeapAlloc + StackInuse` right after the collection: live heap objects and
    /// goroutine stacks (a watch holds goroutines, whose stacks are not heap).
    pub(super) live_bytes: u64,
    pub(super) heap_alloc_bytes: u64,
    pub(super) stack_inuse_bytes: u64,
    pub(super) heap_inuse_bytes: u64,
    pub(super) heap_released_bytes: u64,
    pub(super) sys_bytes: u64,
}

pub(super) async fn apiserver_heap(ctx: &Ctx) -> Option<Heap> {
    let resp = ctx
        .api
        .http
        .get(format!(
            "{}/debug/pprof/heap?gc=1&debug=1",
            ctx.args.apiserver
        ))
        .bearer_auth(&ctx.args.token)
        .send()
        .await
        .ok()?;
    if !resp.status().is_success() {
        ctx.progress.log(&format!(
            "API server /debug/pprof/heap: HTTP {}",
            resp.status().as_u16()
        ));
        return None;
    }
    let text = resp.text().await.ok()?;
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("# {name} = ")))
            .and_then(|v| v.trim().parse::<u64>().ok())
    };
    // "# Stack = <StackInuse> / <StackSys>"
    let stack = text
        .lines()
        .find_map(|l| l.strip_prefix("# Stack = "))
        .and_then(|v| v.split('/').next())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .unwrap_or(0);
    let heap_alloc = field("HeapAlloc")?;
    Some(Heap {
        live_bytes: heap_alloc + stack,
        heap_alloc_bytes: heap_alloc,
        stack_inuse_bytes: stack,
        heap_inuse_bytes: field("HeapInuse")?,
        heap_released_bytes: field("HeapReleased").unwrap_or(0),
        sys_bytes: field("Sys").unwrap_or(0),
    })
}

/// kcache's metrics the report reads (summed over their label sets).
pub(super) const KCACHE_METRICS: &[&str] = &[
    "kcache_registered_watchers",
    "kcache_upstream_watches",
    "kcache_upstream_connections",
    "kcache_cached_keys",
    "kcache_synced_keys",
    "kcache_cached_objects",
    "kcache_upstream_lists_total",
    "kcache_upstream_errors_total",
    "kcache_coalescings_total",
    "kcache_coalesce_splits_total",
    "kcache_coalesce_moved_watchers_total",
    "kcache_covered_requests_total",
    "kcache_keys_refused_total",
    "kcache_terminated_watchers_total",
    "kcache_nats_messages_published_total",
    "kcache_nats_messages_received_total",
    "kcache_auth_reviews_total",
    "kcache_watch_expired_total",
];

/// kcache's metrics the report reads by one label's value: (recorded as, metric, label,
/// value).
pub(super) const KCACHE_LABELLED: &[(&str, &str, &str, &str)] = &[
    (
        "kcache_window_backfills_total{outcome=\"extended\"}",
        "kcache_window_backfills_total",
        "outcome",
        "extended",
    ),
    (
        "kcache_window_backfills_total{outcome=\"overdue\"}",
        "kcache_window_backfills_total",
        "outcome",
        "overdue",
    ),
    (
        "kcache_moved_watch_starts_total{start=\"unchanged\"}",
        "kcache_moved_watch_starts_total",
        "start",
        "unchanged",
    ),
    (
        "kcache_moved_watch_starts_total{start=\"from_rv\"}",
        "kcache_moved_watch_starts_total",
        "start",
        "from_rv",
    ),
];

pub(super) async fn snapshot(ctx: &Ctx, t: &Target) -> Snapshot {
    let http = &ctx.api.http;
    let token = &ctx.args.token;
    let api = probe::scrape(http, &ctx.args.apiserver, token).await;
    let mut s = Snapshot {
        apiserver_rss_kib: probe::rss_kib(ctx.args.apiserver_pid),
        target_rss_kib: t.rss_kib(),
        ..Default::default()
    };
    if let Some(text) = &api {
        s.apiserver_watches = probe::apiserver_watches_by_resource(text);
        s.apiserver_heap_inuse_bytes = probe::sum_samples(text, "go_memstats_heap_inuse_bytes");
        s.apiserver_goroutines = probe::sum_samples(text, "go_goroutines");
    }
    if !t.is_apiserver() {
        // A fleet's replicas summed (each replica counts its own coalescings and keys,
        // mirrors included: `keys_per_namespace` counts upstream watches once).
        for url in t.urls() {
            if let Some(text) = probe::scrape(http, &url, token).await {
                for name in KCACHE_METRICS {
                    *s.kcache.entry(name).or_default() +=
                        probe::sum_samples(&text, name).unwrap_or(0.0);
                }
                for (recorded, name, label, value) in KCACHE_LABELLED {
                    *s.kcache.entry(recorded).or_default() +=
                        probe::sum_where(&text, name, &[(label, value)]);
                }
            }
        }
    }
    s
}

pub(super) fn registered_total(s: &Snapshot) -> f64 {
    s.apiserver_watches.values().sum()
}

/// One sample of the sampler.
#[derive(Clone, Debug, Serialize)]
pub(super) struct Sample {
    pub(super) seconds: f64,
    pub(super) apiserver_watches: f64,
    pub(super) apiserver_rss_kib: u64,
    pub(super) target_rss_kib: u64,
    pub(super) kcache_upstream_watches: Option<f64>,
}

/// Reads the watch counts and RSS every `--sample-every-ms` until stopped.
pub(super) struct Sampler {
    pub(super) stop: Arc<AtomicBool>,
    pub(super) task: tokio::task::JoinHandle<Vec<Sample>>,
    start: Instant,
}

impl Sampler {
    pub(super) fn start(ctx: &Ctx, t: &Target) -> Sampler {
        let every = Duration::from_millis(ctx.args.sample_every_ms.max(100));
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let (http, token) = (ctx.api.http.clone(), ctx.args.token.clone());
        let (api_url, api_pid) = (ctx.args.apiserver.clone(), ctx.args.apiserver_pid);
        let (t, kcache) = (t.clone(), !t.is_apiserver());
        let start = Instant::now();
        let task = tokio::spawn(async move {
            let mut out = Vec::new();
            while !flag.load(Ordering::Relaxed) {
                let registered = probe::apiserver_watches_at(&http, &api_url, &token)
                    .await
                    .unwrap_or(f64::NAN);
                // Summed over a fleet: only a key's owner watches upstream.
                let upstream = if kcache {
                    t.metric(&http, &token, "kcache_upstream_watches").await
                } else {
                    None
                };
                out.push(Sample {
                    seconds: start.elapsed().as_secs_f64(),
                    apiserver_watches: registered,
                    apiserver_rss_kib: probe::rss_kib(api_pid),
                    target_rss_kib: t.rss_kib(),
                    kcache_upstream_watches: upstream,
                });
                let next = Instant::now() + every;
                while Instant::now() < next && !flag.load(Ordering::Relaxed) {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
            out
        });
        Sampler { stop, task, start }
    }

    /// Seconds since the sampler started, on its samples' clock.
    pub(super) fn seconds(&self) -> f64 {
        self.start.elapsed().as_secs_f64()
    }

    pub(super) async fn stop(self) -> Vec<Sample> {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await.unwrap_or_default()
    }
}

/// kcache's keys of the bench namespaces from `/debug/keys`: per namespace and resource
/// the keys running (each holds one upstream watch: nothing here is immutable) and
/// whether the namespace key is coalesced.
pub(super) async fn keys_per_namespace(ctx: &Ctx, t: &Target) -> Option<Value> {
    // A fleet's keys: each replica lists its own, a mirror (fed over NATS by the key's
    // owner) holding no upstream watch; a key counts once, however many replicas run it.
    let mut all = Vec::new();
    for url in t.urls() {
        let keys = crate::client::Api::new(&url, &ctx.args.token)
            .get_json("/debug/keys")
            .await;
        match keys {
            Ok(v) => all.extend(v["keys"].as_array().cloned().unwrap_or_default()),
            Err(e) => {
                ctx.progress.log(&format!("/debug/keys of {url}: {e}"));
                return None;
            }
        }
    }
    let keys = upstream_keys(all);
    #[derive(Default)]
    struct Ns {
        name_keys: BTreeMap<String, usize>,
        namespace_keys: BTreeMap<String, usize>,
        coalesced: BTreeMap<String, bool>,
    }
    let mut per_ns: BTreeMap<String, Ns> = BTreeMap::new();
    let mut other = 0usize;
    for k in &keys {
        let Some(key) = k["key"].as_str() else {
            continue;
        };
        // /api/v1/namespaces/<ns>/<resource>[/<name>]
        let parts: Vec<&str> = key.trim_start_matches('/').split('/').collect();
        match parts.as_slice() {
            ["api", "v1", "namespaces", ns, resource, rest @ ..]
                if ns.starts_with(NS_PREFIX) && rest.len() <= 1 =>
            {
                let e = per_ns.entry(ns.to_string()).or_default();
                if rest.is_empty() {
                    *e.namespace_keys.entry(resource.to_string()).or_default() += 1;
                    if k["coalescing"].as_str() == Some("coalesced") {
                        e.coalesced.insert(resource.to_string(), true);
                    }
                } else {
                    *e.name_keys.entry(resource.to_string()).or_default() += 1;
                }
            }
            _ => other += 1,
        }
    }
    let per: Vec<usize> = per_ns
        .values()
        .map(|n| n.name_keys.values().sum::<usize>() + n.namespace_keys.values().sum::<usize>())
        .collect();
    let total: usize = per.iter().sum();
    let mut histogram: BTreeMap<usize, usize> = BTreeMap::new();
    for n in &per {
        *histogram.entry(*n).or_default() += 1;
    }
    let sum_of = |f: &dyn Fn(&Ns) -> usize| per_ns.values().map(f).sum::<usize>();
    let coalesced_ns = |r: &str| {
        per_ns
            .values()
            .filter(|n| n.coalesced.get(r).copied().unwrap_or(false))
            .count()
    };
    Some(json!({
        "method": "kcache's /debug/keys after the settle time: running keys of the bench namespaces, each one upstream watch (name keys and namespace keys; nothing is immutable)",
        "namespaces_with_keys": per_ns.len(),
        "upstream_watches": total,
        "max_per_namespace": per.iter().max(),
        "mean_per_namespace": (!per.is_empty()).then(|| total as f64 / per.len() as f64),
        "namespaces_over_2": per.iter().filter(|n| **n > 2).count(),
        "histogram": histogram.iter().map(|(k, v)| (k.to_string(), json!(v))).collect::<serde_json::Map<_, _>>(),
        "name_keys": sum_of(&|n| n.name_keys.values().sum()),
        "namespace_keys": sum_of(&|n| n.namespace_keys.values().sum()),
        "namespaces_coalesced": {"secrets": coalesced_ns("secrets"), "configmaps": coalesced_ns("configmaps")},
        "keys_outside_the_bench_namespaces": other,
    }))
}

/// The keys of a fleet's `/debug/keys` lists that hold an upstream watch: an owner's
/// key once (two replicas may both claim it a moment during a handover), a replica's own
/// (`local`: NATS unreachable; no fleet) each, a mirror's (fed over NATS) never. A key any
/// replica coalesced counts as coalesced.
fn upstream_keys(entries: Vec<Value>) -> Vec<Value> {
    let mut out = Vec::new();
    let mut owners = std::collections::BTreeSet::new();
    let mut coalesced = std::collections::BTreeSet::new();
    for e in entries {
        let Some(key) = e["key"].as_str().map(str::to_string) else {
            continue;
        };
        if e["coalescing"].as_str() == Some("coalesced") {
            coalesced.insert(key.clone());
        }
        // `role` is the fleet's (flattened into the entry); absent without a fleet.
        match e["role"].as_str() {
            Some("mirror") => {}
            Some("owner") if !owners.insert(key) => {}
            _ => out.push(e),
        }
    }
    for e in &mut out {
        if e["key"].as_str().is_some_and(|k| coalesced.contains(k)) {
            e["coalescing"] = json!("coalesced");
        }
    }
    out
}

pub(super) fn diff(
    after: &BTreeMap<String, f64>,
    before: &BTreeMap<String, f64>,
) -> BTreeMap<String, f64> {
    after
        .iter()
        .map(|(k, v)| (k.clone(), v - before.get(k).copied().unwrap_or(0.0)))
        .chain(
            before
                .iter()
                .filter(|(k, _)| !after.contains_key(*k))
                .map(|(k, v)| (k.clone(), -v)),
        )
        .filter(|(_, v)| *v != 0.0)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fleets_keys_count_once_and_mirrors_not_at_all() {
        let entry = |key: &str, role: Option<&str>, coalescing: Option<&str>| json!({"key": key, "role": role, "coalescing": coalescing});
        let keys = upstream_keys(vec![
            // One replica alone (no fleet): every key counts.
            entry("/a", None, None),
            // Owner on one replica, mirror on another.
            entry("/b", Some("mirror"), Some("coalesced")),
            entry("/b", Some("owner"), None),
            // Only mirrors: no upstream watch here.
            entry("/c", Some("mirror"), None),
            // Owned twice for a moment: one upstream watch.
            entry("/e", Some("owner"), None),
            entry("/e", Some("owner"), None),
            // NATS unreachable: each replica's local key watches upstream itself.
            entry("/d", Some("local"), None),
            entry("/d", Some("local"), None),
        ]);
        let got: Vec<(String, Option<String>)> = keys
            .iter()
            .map(|k| {
                (
                    k["key"].as_str().unwrap_or_default().to_string(),
                    k["coalescing"].as_str().map(str::to_string),
                )
            })
            .collect();
        assert_eq!(
            got,
            [
                ("/a".to_string(), None),
                ("/b".to_string(), Some("coalesced".to_string())),
                ("/e".to_string(), None),
                ("/d".to_string(), None),
                ("/d".to_string(), None),
            ]
        );
    }
}
