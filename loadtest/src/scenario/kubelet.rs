//! Scenario 1, `kubelet`: `--nodes` simulated nodes. Each node holds
//! `--watches-per-node` single-object watches (`fieldSelector=metadata.name=X`, half over
//! `--secrets` Secrets, half over `--configmaps` ConfigMaps, spread evenly) and one
//! `fieldSelector=spec.nodeName=<node>` pod watch over its `--pods-per-node` pods, as a
//! kubelet does. Writes go round robin over all those objects (Secrets, ConfigMaps, pods)
//! at `--rate`/s; each must reach every watch of its object.
//!
//! Afterwards, the per-cached-object figure: `--cached-objects` 1 KiB ConfigMaps in one
//! namespace; the API server's RSS growth while they are created (its watch cache holds
//! them) and kcache's growth when one list through it makes it cache the namespace.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tokio::task::JoinHandle;

use super::{
    annotate_round_robin, between_targets, fanout, payload, per_item_bytes, Ctx, ScenarioRun,
    Series, Session,
};
use crate::client::{Api, ConnPool};
use crate::probe;
use crate::record::{added_by, percentile_f64, spread, Counters, Recorder};
use crate::watch::{self, Ready, WatchReq};

const NS: &str = "bench-kubelet";
const OBJECTS_NS: &str = "bench-objects";

#[derive(Clone, Debug)]
pub struct Params {
    pub nodes: usize,
    pub per_node: usize,
    pub secrets: usize,
    pub configmaps: usize,
    pub pods_per_node: usize,
    pub rate: u64,
    pub seconds: u64,
    pub cached_objects: usize,
    pub paired: usize,
}

impl Params {
    pub fn from_ctx(ctx: &Ctx) -> Params {
        let a = &ctx.args;
        Params {
            nodes: a.nodes.max(1),
            per_node: a.watches_per_node.unwrap_or(99),
            secrets: a.secrets,
            configmaps: a.configmaps,
            pods_per_node: a.pods_per_node,
            rate: a.rate.unwrap_or(100).max(1),
            seconds: a.seconds.unwrap_or(20),
            cached_objects: a.cached_objects,
            paired: a.paired_objects,
        }
    }

    /// Secret and ConfigMap watches per node.
    fn split(&self) -> (usize, usize) {
        match (self.secrets, self.configmaps) {
            (0, 0) => (0, 0),
            (0, _) => (0, self.per_node),
            (_, 0) => (self.per_node, 0),
            _ => (self.per_node.div_ceil(2), self.per_node / 2),
        }
    }
}

fn object_path(kind: &str, name: &str) -> String {
    format!("/api/v1/namespaces/{NS}/{kind}/{name}")
}

fn pod_name(node: usize, j: usize) -> String {
    format!("p-{node}-{j}")
}

/// The watches (path?query, readiness) and, per watch, the object paths it receives.
fn plan(p: &Params) -> (Vec<(String, Ready)>, Vec<String>) {
    let (ks, kc) = p.split();
    let mut watches = Vec::new();
    let mut receives = Vec::new();
    for n in 0..p.nodes {
        for (kind, prefix, count, per) in [
            ("secrets", "s", p.secrets, ks),
            ("configmaps", "c", p.configmaps, kc),
        ] {
            for j in 0..per {
                let name = format!("{prefix}{}", (n * per + j) % count);
                watches.push((
                    format!("/api/v1/namespaces/{NS}/{kind}?watch=1&resourceVersion=0&fieldSelector=metadata.name%3D{name}"),
                    Ready::FirstEvent,
                ));
                receives.push(object_path(kind, &name));
            }
        }
        // The node's own pod watch; it receives every pod bound to the node.
        let ready = if p.pods_per_node > 0 {
            Ready::FirstEvent
        } else {
            Ready::Headers
        };
        watches.push((
            format!(
                "/api/v1/pods?watch=1&resourceVersion=0&fieldSelector=spec.nodeName%3Dnode-{n}"
            ),
            ready,
        ));
        for j in 0..p.pods_per_node {
            receives.push(object_path("pods", &pod_name(n, j)));
        }
    }
    (watches, receives)
}

/// A watch to open: `path?query` and when it counts as established.
type WatchSpec = (String, Ready);

/// Splits watches into the first watch of each distinct path?query (its key) and the
/// rest, each in plan order.
fn first_per_key(watches: &[WatchSpec]) -> (Vec<WatchSpec>, Vec<WatchSpec>) {
    let mut seen = std::collections::HashSet::new();
    watches
        .iter()
        .cloned()
        .partition(|(pq, _)| seen.insert(pq.clone()))
}

/// Every object written to, in round-robin order.
fn written_objects(p: &Params) -> Vec<String> {
    let mut v: Vec<String> = (0..p.secrets)
        .map(|i| object_path("secrets", &format!("s{i}")))
        .collect();
    v.extend((0..p.configmaps).map(|i| object_path("configmaps", &format!("c{i}"))));
    for n in 0..p.nodes {
        v.extend((0..p.pods_per_node).map(|j| object_path("pods", &pod_name(n, j))));
    }
    v
}

/// Secrets and ConfigMaps (kind, name) spread evenly over all of them, `p.paired` in all.
fn reference_objects(p: &Params) -> Vec<(&'static str, String)> {
    let all: Vec<(&'static str, String)> = (0..p.secrets)
        .map(|i| ("secrets", format!("s{i}")))
        .chain((0..p.configmaps).map(|i| ("configmaps", format!("c{i}"))))
        .collect();
    if p.paired == 0 || all.is_empty() {
        return Vec::new();
    }
    let step = (all.len() / p.paired).max(1);
    all.into_iter().step_by(step).take(p.paired).collect()
}

/// Direct API server watches of the reference objects, recording into a reference
/// recorder; waits (at most 60 s) until they are established.
async fn open_reference(ctx: &Ctx, p: &Params) -> Option<(Arc<Recorder>, Vec<JoinHandle<()>>)> {
    let objects = reference_objects(p);
    if objects.is_empty() {
        return None;
    }
    ctx.progress.stage(&format!(
        "opening {} reference watches on the API server",
        objects.len()
    ));
    let rec = Arc::new(Recorder::reference());
    let pool = ConnPool::new(&ctx.model, objects.len());
    let handles = objects
        .iter()
        .enumerate()
        .map(|(i, (kind, name))| {
            let req = WatchReq {
                client: pool.get(i),
                url: format!(
                    "{}/api/v1/namespaces/{NS}/{kind}?watch=1&resourceVersion=0&fieldSelector=metadata.name%3D{name}",
                    ctx.args.apiserver
                ),
                token: ctx.args.token.clone(),
            };
            watch::spawn(req, Ready::FirstEvent, rec.clone())
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(60);
    let c = &rec.counters;
    while Counters::get(&c.ready) + Counters::get(&c.failed) < objects.len()
        && Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Some((rec, handles))
}

/// The paired figure: each kcache delivery of a reference object's write minus the
/// direct watch's arrival of the same write; with `second`, also the same between two
/// direct watches of each reference object (the API server's own spread between watchers).
fn paired_section(
    ctx: &Ctx,
    measured: &Recorder,
    reference: &Recorder,
    second: Option<&Recorder>,
    watches: usize,
) -> Value {
    let d = added_by(measured, reference);
    let q = |p| percentile_f64(&d, p);
    ctx.progress.log(&format!(
        "kcache: added latency, paired with {watches} direct watches ({} samples): p50 {:.2} ms, p99 {:.2} ms",
        d.len(),
        q(0.5).unwrap_or(f64::NAN),
        q(0.99).unwrap_or(f64::NAN),
    ));
    let floor = second.map(|second| {
        let f = spread(measured, reference, second);
        let fq = |p| percentile_f64(&f, p);
        ctx.progress.log(&format!(
            "kcache: direct vs direct (a second API server watch per reference object, {} samples): p50 {:.2} ms, p99 {:.2} ms",
            f.len(),
            fq(0.5).unwrap_or(f64::NAN),
            fq(0.99).unwrap_or(f64::NAN),
        ));
        json!({
            "method": "the same pairing between two direct API server watches of each reference object: how far apart the API server itself delivers one event to two of its watchers (kcache's upstream watch is one such watcher), the noise floor of the paired figure",
            "samples": f.len(),
            "p50_ms": fq(0.5),
            "p90_ms": fq(0.9),
            "p99_ms": fq(0.99),
            "max_ms": f.last(),
        })
    });
    json!({
        "paired_added_latency": {
            "method": "for writes to objects that also had a direct API server watch open during the kcache run: each kcache delivery's arrival minus the direct watch's arrival of the same event (same generator, same moment; the API server's own delay cancels out)",
            "reference_watches": watches,
            "reference_established": Counters::get(&reference.counters.ready),
            "samples": d.len(),
            "p50_ms": q(0.5),
            "p90_ms": q(0.9),
            "p99_ms": q(0.99),
            "max_ms": d.last(),
            "direct_vs_direct": floor,
        }
    })
}

async fn setup(ctx: &Ctx, p: &Params) {
    ctx.progress.stage("creating Secrets, ConfigMaps and pods");
    let api = &ctx.api;
    if let Err(e) = api.ensure_namespace(NS).await {
        ctx.progress.log(&format!("namespace {NS}: {e}"));
    }
    let mut items: Vec<(String, Value)> = Vec::new();
    let secrets = format!("/api/v1/namespaces/{NS}/secrets");
    let configmaps = format!("/api/v1/namespaces/{NS}/configmaps");
    let pods = format!("/api/v1/namespaces/{NS}/pods");
    for i in 0..p.secrets {
        items.push((
            secrets.clone(),
            json!({"metadata": {"name": format!("s{i}")}, "data": {"v": "MA=="}}),
        ));
    }
    for i in 0..p.configmaps {
        items.push((
            configmaps.clone(),
            json!({"metadata": {"name": format!("c{i}")}, "data": {"v": "0"}}),
        ));
    }
    for n in 0..p.nodes {
        for j in 0..p.pods_per_node {
            items.push((
                pods.clone(),
                json!({
                    "metadata": {"name": pod_name(n, j)},
                    "spec": {
                        "nodeName": format!("node-{n}"),
                        "automountServiceAccountToken": false,
                        "containers": [{"name": "c", "image": "k8s.gcr.io/pause:3.2"}],
                    },
                }),
            ));
        }
    }
    let n = api.create_all(items).await;
    ctx.progress.log(&format!(
        "setup: {} objects created, {} existed, {} failed",
        n.created, n.existed, n.failed
    ));
}

/// The per-cached-object figures: (API server bytes/object on create, kcache
/// bytes/object on first list, the JSON section).
async fn per_cached_object(ctx: &Ctx, n: usize) -> (Option<f64>, Option<f64>, Value) {
    ctx.progress
        .stage(&format!("per cached object: creating {n} 1 KiB ConfigMaps"));
    let api = &ctx.api;
    let settle = Duration::from_secs(3);
    if let Err(e) = api.ensure_namespace(OBJECTS_NS).await {
        ctx.progress.log(&format!("namespace {OBJECTS_NS}: {e}"));
    }
    let api_before = probe::rss_kib(ctx.args.apiserver_pid);
    let data = payload(1024);
    let items = (0..n)
        .map(|i| {
            (
                format!("/api/v1/namespaces/{OBJECTS_NS}/configmaps"),
                json!({"metadata": {"name": format!("cm{i}")}, "data": {"v": data}}),
            )
        })
        .collect();
    let created = api.create_all(items).await;
    tokio::time::sleep(settle).await;
    let api_growth = probe::rss_kib(ctx.args.apiserver_pid) as i64 - api_before as i64;
    let api_per = (created.created > 0).then(|| per_item_bytes(api_growth, created.created));
    let mut section = json!({
        "configmaps_created": created.created,
        "configmaps_existed": created.existed,
        "apiserver_rss_growth_on_create_kib": api_growth,
        "apiserver_rss_per_object_bytes": api_per,
    });
    let mut kcache_per = None;
    if let Some(k) = ctx.targets.iter().find(|t| !t.is_apiserver()) {
        ctx.progress
            .stage("per cached object: one list through kcache");
        let before = probe::rss_kib(k.pid);
        let list = Api::new(&k.url, &ctx.args.token)
            .get_json(&format!(
                "/api/v1/namespaces/{OBJECTS_NS}/configmaps?resourceVersion=0"
            ))
            .await;
        let (items, json_bytes) = match &list {
            Ok(v) => (
                v["items"].as_array().map_or(0, Vec::len),
                v["items"].to_string().len(),
            ),
            Err(e) => {
                ctx.progress.log(&format!("kcache list: {e}"));
                (0, 0)
            }
        };
        tokio::time::sleep(settle).await;
        let growth = probe::rss_kib(k.pid) as i64 - before as i64;
        kcache_per = (items > 0).then(|| per_item_bytes(growth, items));
        section["kcache_objects_listed"] = json!(items);
        section["json_bytes_per_object"] = json!(json_bytes as f64 / items.max(1) as f64);
        section["kcache_rss_growth_kib"] = json!(growth);
        section["kcache_rss_per_object_bytes"] = json!(kcache_per);
    }
    (api_per, kcache_per, section)
}

pub async fn run(ctx: &Ctx) -> ScenarioRun {
    let p = Params::from_ctx(ctx);
    setup(ctx, &p).await;
    let (watches, receives) = plan(&p);
    let watchers = fanout(receives.iter().map(String::as_str));
    let objects = written_objects(&p);
    let total_writes = (p.rate * p.seconds) as usize;
    let mut reports = Vec::new();
    let mut series = Vec::new();
    for (i, t) in ctx.targets.iter().enumerate() {
        if i > 0 {
            between_targets(ctx).await;
        }
        let mut s = Session::start(ctx, "kubelet", t, 1, watches.len()).await;
        let pool = ConnPool::new(&ctx.model, watches.len());
        // First one watch per key (for kcache: the cached object and its upstream watch),
        // then the rest, whose growth is the marginal cost of an idle watch.
        let (first, rest) = first_per_key(&watches);
        let n = first.len();
        s.open(&pool, first).await;
        s.keys_warm().await;
        s.open_at(&pool, rest, n).await;
        s.opened().await;
        // After the RSS and watch counts are taken: these watches load only the API
        // server, and only lightly (one per reference object).
        let reference = if t.is_apiserver() {
            None
        } else {
            open_reference(ctx, &p).await
        };
        // A second direct watch per reference object: how far apart the API server
        // delivers one event to two of its own watchers is the method's noise floor
        // (kcache's upstream watch is just such a watcher).
        let second = match reference {
            Some(_) => open_reference(ctx, &p).await,
            None => None,
        };
        if reference.is_some() {
            s.rec.keep_arrivals();
        }
        let written = s
            .write(
                annotate_round_robin(&objects, &watchers, total_writes),
                p.rate,
                0,
            )
            .await;
        s.drain(0, written.expected).await;
        let second = second.map(|(r, handles)| {
            for h in handles {
                h.abort();
            }
            r
        });
        let paired = reference.map(|(r, handles)| {
            for h in handles {
                h.abort();
            }
            paired_section(
                ctx,
                &s.rec,
                &r,
                second.as_deref(),
                reference_objects(&p).len(),
            )
        });
        let (mut report, sorted) = s.finish(0, &written).await;
        if let Some(extra) = paired {
            report.extra = extra;
        }
        series.push(Series {
            label: t.name.to_string(),
            sorted,
        });
        reports.push(report);
    }
    let mut sections = Vec::new();
    if p.cached_objects > 0 {
        let (api_per, kcache_per, section) = per_cached_object(ctx, p.cached_objects).await;
        for r in &mut reports {
            let (per, method) = if r.target == "kcache" {
                (kcache_per, "kcache RSS growth when one list with resourceVersion=0 through it caches the namespace (includes the list's transient buffers)")
            } else {
                (api_per, "API server RSS growth while the objects were created (its watch cache holds them; includes etcd client and request buffers)")
            };
            r.cached_objects = Some(p.cached_objects);
            r.rss_growth_per_cached_object_bytes = per;
            r.cached_objects_method = Some(method.into());
        }
        sections.push(("per_cached_object".to_string(), section));
    }
    let (ks, kc) = p.split();
    ScenarioRun {
        workload: json!({
            "nodes": p.nodes,
            "secret_watches_per_node": ks,
            "configmap_watches_per_node": kc,
            "pod_watches_per_node": 1,
            "watches_total": watches.len(),
            "secrets": p.secrets,
            "configmaps": p.configmaps,
            "pods_per_node": p.pods_per_node,
            "writes_per_second": p.rate,
            "seconds": p.seconds,
            "writes": total_writes,
            "cached_objects": p.cached_objects,
        }),
        reports,
        series,
        notes: Vec::new(),
        sections,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn standard_plan_is_ten_thousand_watches_spread_evenly() {
        let p = Params {
            nodes: 100,
            per_node: 99,
            secrets: 500,
            configmaps: 500,
            pods_per_node: 2,
            rate: 100,
            seconds: 20,
            cached_objects: 0,
            paired: 100,
        };
        let (watches, receives) = plan(&p);
        assert_eq!(watches.len(), 10_000);
        let f = fanout(receives.iter().map(String::as_str));
        assert_eq!(f[&object_path("secrets", "s0")], 10);
        assert_eq!(f[&object_path("pods", "p-7-1")], 1);
        let refs = reference_objects(&p);
        assert_eq!(refs.len(), 100);
        assert_eq!(refs[0], ("secrets", "s0".to_string()));
        assert_eq!(refs[50], ("configmaps", "c0".to_string()));
        // Each written object's fan-out sums to the watch receipts.
        let (first, rest) = first_per_key(&watches);
        assert_eq!(first.len(), 1000 + 100);
        assert_eq!(rest.len(), 10_000 - 1100);
        let objects = written_objects(&p);
        assert_eq!(objects.len(), 1200);
        let total: usize = objects.iter().map(|o| f.get(o).copied().unwrap_or(0)).sum();
        assert_eq!(total, receives.len());
    }
}
