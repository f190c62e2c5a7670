//! Scenario `coalesce`: the kubelet's watch pattern at scale, for kcache's adaptive
//! coalescing (issue 16). One target per run: `loadtest/coalesce.sh` runs it three times,
//! each on fresh processes — the API server directly, kcache with coalescing off, kcache
//! with `cache.coalesce_min_names = 4` — and `kcache-coalesce-report` puts the three side
//! by side and judges the targets.
//!
//! The cluster: `--namespaces` (100) namespaces, each with `--secrets-per-namespace` (20)
//! Secrets, `--configmaps-per-namespace` (20) ConfigMaps and its `kube-root-ca.crt`
//! ConfigMap (written by the harness: the test cluster has no controller manager to
//! publish it). `--used-fraction` (0.8) of each namespace's Secrets and of its ConfigMaps
//! are "used by some pod": the names the nodes pick from; the rest are never watched.
//!
//! The nodes: `--nodes` simulated kubelets, each with pods in `--namespaces-per-node` (3)
//! namespaces (node `n` in namespaces `n·m .. n·m + m - 1`, modulo the namespace count,
//! so they are evenly loaded). In each it holds single-object watches
//! (`fieldSelector=metadata.name=X`, as the kubelet's watch-based Secret and ConfigMap
//! managers do), `--watches-per-node` (30) in all, half Secrets half ConfigMaps, over
//! consecutive used names from a pseudo-random start, plus one `kube-root-ca.crt` watch
//! per namespace (the projected service-account volume of its pods): 33 watches per node.
//! Each node's watches share one HTTP/2 connection, as a kubelet's do. No pod watch: a
//! node's `spec.nodeName` pod watch is a key of its own through kcache, which coalescing
//! (per namespace) does not touch, and it would hide the per-namespace count.
//!
//! With `--node-identities` each node authenticates as `system:node:bench-node-<n>` and
//! has one pod per namespace bound to it that mounts what it watches there: the API
//! server's Node authorizer decides each watch, in-process directly, by kcache's
//! SubjectAccessReviews through kcache (created before the baseline, for both targets).
//!
//! Per target: force a collection of the API server's heap (`/debug/pprof/heap?gc=1`),
//! wait 10 s and read the baseline; open the watches node by node in `--steps` steps, at
//! most 100 nodes each (RSS after each; each step waits for its watches), wait
//! `--settle-secs` (45: kcache's name keys that handed their watchers to a namespace key
//! stop after its 30 s grace period), read the API server's watches by resource (`apiserver_longrunning_requests{verb="WATCH"}`), kcache's RSS, its coalescing metrics and `/debug/keys` (upstream watches per
//! namespace); force a collection again, wait 10 s and read the API server's RSS and live
//! memory (heap objects + goroutine stacks) against the baseline's. Without the forced
//! collections the API server's RSS moves by tens of MiB either way with the garbage it
//! happens to hold (as much as a few hundred watches cost). Then write `--rate` (20)
//! writes/s for
//! `--seconds` (20) to pseudo-randomly chosen objects of the namespaces (the same ones for
//! every target, unwatched ones included): each must reach every watch of its object, no
//! more, no fewer. While the watches open and settle, a sampler reads the API server's
//! registered watchers, kcache's upstream watches and both RSS every `--sample-every-ms`
//! (5 s; its /metrics is large, and scraping it costs the API server), for the peaks (kcache's name keys
//! run until coalescing has moved their watchers, so the API server's peak can be well
//! above where it settles).

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::{payload, splitmix64, Ctx, Op, ScenarioRun, Series, Session, Target, WriteOp};
use crate::client::{node_name, ConnPool};
use crate::probe::{self, PeakRss};
use crate::watch::Ready;

mod observe;

use observe::{apiserver_heap, diff, keys_per_namespace, registered_total, snapshot, Sampler};

pub(super) const NS_PREFIX: &str = "bench-co-";
const ROOT_CA: &str = "kube-root-ca.crt";
/// After a forced collection of the API server's heap, the time its runtime gets to give
/// the freed pages back to the system before RSS is read: the baseline and the settled
/// figure are both read that way (a collection and 10 s), so that garbage not yet
/// collected at either moment does not count as growth (it is tens of MiB, as much as a
/// few hundred watches hold).
const QUIET: Duration = Duration::from_secs(10);
/// At most this many nodes open their watches in one step (`--steps` is raised to keep
/// to it): with 200 nodes' 6,600 watches at once, the API server (one core) was too busy
/// to read new connections' HTTP/2 SETTINGS in time and closed 13 of them ("timeout
/// waiting for SETTINGS frames"); 100 nodes' 3,300 at once it handled.
const MAX_NODES_PER_STEP: usize = 100;

#[derive(Clone, Debug)]
pub struct Params {
    pub nodes: usize,
    /// Secret and ConfigMap watches per node (besides the `kube-root-ca.crt` ones).
    pub per_node: usize,
    pub namespaces: usize,
    pub secrets: usize,
    pub configmaps: usize,
    pub used_fraction: f64,
    pub ns_per_node: usize,
    pub rate: u64,
    pub seconds: u64,
    pub settle_secs: u64,
    pub min_names: usize,
    /// Each node its own identity, its pods bound to it (`--node-identities`).
    pub node_identities: bool,
}

impl Params {
    pub fn from_ctx(ctx: &Ctx) -> Params {
        let a = &ctx.args;
        let namespaces = a.namespaces.unwrap_or(100).max(1);
        Params {
            nodes: a.nodes.max(1),
            per_node: a.watches_per_node.unwrap_or(30),
            namespaces,
            secrets: a.secrets_per_namespace,
            configmaps: a.configmaps_per_namespace,
            used_fraction: a.used_fraction.clamp(0.0, 1.0),
            ns_per_node: a.namespaces_per_node.clamp(1, namespaces),
            rate: a.rate.unwrap_or(20).max(1),
            seconds: a.seconds.unwrap_or(20),
            settle_secs: a.settle_secs,
            min_names: a.kcache_coalesce_min_names,
            node_identities: a.node_identities,
        }
    }

    /// How many of `n` objects are used by pods (at least one, if there are any).
    fn used(&self, n: usize) -> usize {
        ((n as f64 * self.used_fraction).round() as usize).clamp(n.min(1), n)
    }

    /// (Secret, ConfigMap) watches of a node in its namespace number `k`: the node's
    /// share spread over its namespaces, half and half (the odd one a Secret), each at
    /// most the used names there are (a kubelet watches a name once).
    fn slot(&self, k: usize) -> (usize, usize) {
        let m = self.ns_per_node;
        let q = self.per_node * (k + 1) / m - self.per_node * k / m;
        let (us, uc) = (self.used(self.secrets), self.used(self.configmaps));
        let (mut s, mut c) = (q.div_ceil(2), q / 2);
        // Where one kind has too few used names, the other takes the rest.
        if s > us {
            c += s - us;
            s = us;
        }
        if c > uc {
            s = (s + c - uc).min(us);
            c = uc;
        }
        (s, c)
    }

    /// Watches per node: the same for every node (one connection each carries them).
    fn watches_per_node(&self) -> usize {
        (0..self.ns_per_node)
            .map(|k| {
                let (s, c) = self.slot(k);
                s + c + 1
            })
            .sum()
    }

    /// The namespace (index) of node `n`'s slot `k`.
    fn namespace_of(&self, n: usize, k: usize) -> usize {
        (n * self.ns_per_node + k) % self.namespaces
    }
}

pub fn ns_name(i: usize) -> String {
    format!("{NS_PREFIX}{i}")
}

fn object_path(ns: &str, kind: &str, name: &str) -> String {
    format!("/api/v1/namespaces/{ns}/{kind}/{name}")
}

fn watch_path(ns: &str, kind: &str, name: &str) -> String {
    format!("/api/v1/namespaces/{ns}/{kind}?watch=1&resourceVersion=0&fieldSelector=metadata.name%3D{name}")
}

/// Node `n`'s namespace in its slot `k`, and the objects it watches there: (kind, name),
/// its Secrets and ConfigMaps from a pseudo-random start among the used names, then
/// `kube-root-ca.crt`. What its pods there mount, with `--node-identities`.
fn node_slot(p: &Params, n: usize, k: usize) -> (String, Vec<(&'static str, String)>) {
    let (us, uc) = (p.used(p.secrets), p.used(p.configmaps));
    let ns = ns_name(p.namespace_of(n, k));
    let (s, c) = p.slot(k);
    let start = splitmix64((n * p.ns_per_node + k) as u64);
    let mut objects = Vec::with_capacity(s + c + 1);
    for (kind, prefix, count, used, offset) in [
        ("secrets", "s", s, us, start as usize),
        ("configmaps", "c", c, uc, (start >> 32) as usize),
    ] {
        for j in 0..count {
            let name = format!("{prefix}{}", (offset % used.max(1) + j) % used.max(1));
            objects.push((kind, name));
        }
    }
    objects.push(("configmaps", ROOT_CA.to_string()));
    (ns, objects)
}

/// The watches (path?query, readiness) in node order, node `n`'s being numbers
/// `n × watches_per_node ..`, and per watch the object path it receives.
fn plan(p: &Params) -> (Vec<(String, Ready)>, Vec<String>) {
    let mut watches = Vec::new();
    let mut receives = Vec::new();
    for n in 0..p.nodes {
        for k in 0..p.ns_per_node {
            let (ns, objects) = node_slot(p, n, k);
            for (kind, name) in objects {
                watches.push((watch_path(&ns, kind, &name), Ready::FirstEvent));
                receives.push(object_path(&ns, kind, &name));
            }
        }
    }
    (watches, receives)
}

/// With `--node-identities`: one pod per node and namespace, bound to the node and
/// mounting every Secret and ConfigMap the node watches there, so the Node authorizer
/// lets the node read exactly those (its graph: node ← pod → Secret, ConfigMap).
fn pods(p: &Params) -> Vec<(String, Value)> {
    let mut v = Vec::with_capacity(p.nodes * p.ns_per_node);
    for n in 0..p.nodes {
        for k in 0..p.ns_per_node {
            let (ns, objects) = node_slot(p, n, k);
            let volumes: Vec<Value> = objects
                .iter()
                .enumerate()
                .map(|(j, (kind, name))| match *kind {
                    "secrets" => json!({"name": format!("v{j}"), "secret": {"secretName": name}}),
                    _ => json!({"name": format!("v{j}"), "configMap": {"name": name}}),
                })
                .collect();
            v.push((
                format!("/api/v1/namespaces/{ns}/pods"),
                json!({
                    "metadata": {"name": format!("{}-{k}", node_name(n))},
                    "spec": {
                        "nodeName": node_name(n),
                        "automountServiceAccountToken": false,
                        "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}],
                        "volumes": volumes,
                    },
                }),
            ));
        }
    }
    v
}

/// Every object of the namespaces, watched or not.
fn all_objects(p: &Params) -> Vec<String> {
    let mut v = Vec::new();
    for i in 0..p.namespaces {
        let ns = ns_name(i);
        v.extend((0..p.secrets).map(|j| object_path(&ns, "secrets", &format!("s{j}"))));
        v.extend((0..p.configmaps).map(|j| object_path(&ns, "configmaps", &format!("c{j}"))));
        v.push(object_path(&ns, "configmaps", ROOT_CA));
    }
    v
}

/// `total` annotation writes to objects drawn pseudo-randomly (the same for every
/// target), each with the number of watches of its object as fan-out.
fn writes(objects: &[String], watchers: &HashMap<String, usize>, total: usize) -> Vec<WriteOp> {
    if objects.is_empty() {
        return Vec::new();
    }
    (0..total)
        .map(|i| {
            let path = objects[splitmix64(0xc0a1 + i as u64) as usize % objects.len()].clone();
            let fanout = watchers.get(&path).copied().unwrap_or(0);
            WriteOp {
                op: Op::Annotate { path },
                fanout,
            }
        })
        .collect()
}

async fn setup(ctx: &Ctx, p: &Params) {
    let objects = p.namespaces * (p.secrets + p.configmaps + 1);
    ctx.progress.stage(&format!(
        "creating {} namespaces and {objects} Secrets/ConfigMaps",
        p.namespaces
    ));
    let api = &ctx.api;
    for i in 0..p.namespaces {
        if let Err(e) = api.ensure_namespace(&ns_name(i)).await {
            ctx.progress.log(&format!("namespace {}: {e}", ns_name(i)));
        }
    }
    // Sizes of the real thing, roughly: a token-sized Secret, a small config file, and the
    // cluster's CA certificate.
    let secret = payload(240);
    let config = payload(400);
    let ca = format!(
        "-----BEGIN CERTIFICATE-----\n{}\n-----END CERTIFICATE-----\n",
        payload(1000)
    );
    let mut items: Vec<(String, Value)> = Vec::with_capacity(objects);
    for i in 0..p.namespaces {
        let ns = ns_name(i);
        let secrets = format!("/api/v1/namespaces/{ns}/secrets");
        let configmaps = format!("/api/v1/namespaces/{ns}/configmaps");
        for j in 0..p.secrets {
            items.push((
                secrets.clone(),
                json!({"metadata": {"name": format!("s{j}")}, "stringData": {"token": secret}}),
            ));
        }
        for j in 0..p.configmaps {
            items.push((
                configmaps.clone(),
                json!({"metadata": {"name": format!("c{j}")}, "data": {"config": config}}),
            ));
        }
        items.push((
            configmaps.clone(),
            json!({"metadata": {"name": ROOT_CA}, "data": {"ca.crt": ca}}),
        ));
    }
    let n = api.create_all(items).await;
    ctx.progress.log(&format!(
        "setup: {} objects created, {} existed, {} failed",
        n.created, n.existed, n.failed
    ));
    if p.node_identities {
        let pods = pods(p);
        ctx.progress.stage(&format!(
            "creating {} pods bound to {} nodes (node identities)",
            pods.len(),
            p.nodes
        ));
        let n = api.create_all(pods).await;
        ctx.progress.log(&format!(
            "setup: {} pods created, {} existed, {} failed",
            n.created, n.existed, n.failed
        ));
    }
}

fn variant(t: &Target, p: &Params) -> String {
    match (t.is_apiserver(), p.min_names) {
        (true, _) => "direct".into(),
        (false, 0) => "kcache, coalescing off".into(),
        (false, n) => format!("kcache, coalescing on (coalesce_min_names = {n})"),
    }
}

pub async fn run(ctx: &Ctx) -> ScenarioRun {
    let p = Params::from_ctx(ctx);
    setup(ctx, &p).await;
    let (watches, receives) = plan(&p);
    let watchers = super::fanout(receives.iter().map(String::as_str));
    let objects = all_objects(&p);
    let total_writes = (p.rate * p.seconds) as usize;
    let per_node = p.watches_per_node();
    let open_steps = ctx.args.steps.max(p.nodes.div_ceil(MAX_NODES_PER_STEP));
    let mut reports = Vec::new();
    let mut series = Vec::new();
    let mut notes = Vec::new();
    if !ctx.args.http1 {
        notes.push(format!(
            "connections: each node's {per_node} watches share one HTTP/2 connection, as a kubelet's ({} connections; --per-connection does not apply)",
            p.nodes
        ));
    }
    for (i, t) in ctx.targets.iter().enumerate() {
        if i > 0 {
            super::between_targets(ctx).await;
        }
        let variant = variant(t, &p);
        ctx.progress.log(&format!("target: {} ({variant})", t.name));
        ctx.progress.stage(&format!(
            "baseline: API server GC, {} s quiet",
            QUIET.as_secs()
        ));
        let heap_before = apiserver_heap(ctx).await;
        tokio::time::sleep(QUIET).await;
        let before = snapshot(ctx, t).await;
        let mut s = Session::start(ctx, "coalesce", t, 1, watches.len()).await;
        s.set_open_steps(open_steps);
        let sampler = Sampler::start(ctx, t);
        let api_peak = PeakRss::start(ctx.args.apiserver_pid, Duration::from_millis(200));
        let target_peaks: Vec<(u32, PeakRss)> = t
            .pids()
            .into_iter()
            .map(|pid| (pid, PeakRss::start(pid, Duration::from_millis(200))))
            .collect();
        // Behind a fleet, node n's connection goes to replica n % replicas, as nodes
        // behind a Service spread.
        let fleet = if t.replicas.is_empty() {
            Vec::new()
        } else {
            t.urls()
        };
        let pool = ConnPool::per_node(&ctx.model, p.nodes, per_node)
            .route(fleet)
            .node_identities(p.node_identities);
        let open_at_sample_secs = sampler.seconds();
        let opened_at = Instant::now();
        s.open(&pool, watches.clone()).await;
        let open_seconds = s.open_seconds();
        let open_wall = opened_at.elapsed().as_secs_f64();
        let after_open = snapshot(ctx, t).await;
        ctx.progress.stage(&format!(
            "settling {} s (kcache's released name keys stop after their grace period)",
            p.settle_secs
        ));
        tokio::time::sleep(Duration::from_secs(p.settle_secs)).await;
        let samples = sampler.stop().await;
        s.opened().await;
        let settled = snapshot(ctx, t).await;
        let api_peak = api_peak
            .stop(ctx.args.apiserver_pid)
            .max(settled.apiserver_rss_kib);
        // Each replica's own peak; their sum bounds the fleet's from above.
        let replica_peaks: Vec<u64> = target_peaks
            .into_iter()
            .map(|(pid, peak)| peak.stop(pid))
            .collect();
        let replica_settled: Vec<u64> = t.pids().into_iter().map(probe::rss_kib).collect();
        let target_peak = replica_peaks
            .iter()
            .sum::<u64>()
            .max(settled.target_rss_kib);
        ctx.progress.stage(&format!(
            "settled: API server GC, {} s quiet",
            QUIET.as_secs()
        ));
        // The quiet window is also the settled fleet's idle time: what each replica
        // spends with nothing to do but keep its keys, mirrors and the fleet's interest
        // (issue 31.5).
        let idle_from = (Instant::now(), replica_cpu(t));
        let heap_settled = apiserver_heap(ctx).await;
        tokio::time::sleep(QUIET).await;
        let after_gc = snapshot(ctx, t).await;
        let idle_secs = idle_from.0.elapsed().as_secs_f64();
        let idle_cores: Vec<f64> = replica_cpu(t)
            .iter()
            .zip(&idle_from.1)
            .map(|(to, from)| (to - from) / idle_secs)
            .collect();
        let idle_rate = |name: &str| {
            let at = |s: &observe::Snapshot| s.kcache.get(name).copied().unwrap_or(0.0);
            (at(&after_gc) - at(&settled)) / idle_secs
        };
        let keys = if t.is_apiserver() {
            None
        } else {
            keys_per_namespace(ctx, t).await
        };
        let written = s
            .write(writes(&objects, &watchers, total_writes), p.rate, 0)
            .await;
        s.drain(0, written.expected).await;
        let end = snapshot(ctx, t).await;
        let (mut report, sorted) = s.finish(0, &written).await;

        let registered_added = diff(&settled.apiserver_watches, &before.apiserver_watches);
        let peak_registered = samples
            .iter()
            .map(|s| s.apiserver_watches)
            .chain([registered_total(&after_open), registered_total(&settled)])
            .filter(|v| v.is_finite())
            .fold(f64::NAN, f64::max);
        // Issue 31.4's bound: at most two upstream watches per namespace (its Secrets key
        // and its ConfigMaps key) at every moment after the first second of the burst.
        let after_first_second: Vec<&observe::Sample> = samples
            .iter()
            .filter(|s| s.seconds >= open_at_sample_secs + 1.0)
            .collect();
        let upstream_after_first_second = after_first_second
            .iter()
            .filter_map(|s| s.kcache_upstream_watches)
            .fold(f64::NAN, f64::max);
        let apiserver_after_first_second = after_first_second
            .iter()
            .map(|s| s.apiserver_watches - registered_total(&before))
            .filter(|v| v.is_finite())
            .fold(f64::NAN, f64::max);
        let namespaces_used = p.namespaces.min(p.nodes * p.ns_per_node);
        let kib = |a: u64, b: u64| a as i64 - b as i64;
        let heap_growth = settled
            .apiserver_heap_inuse_bytes
            .zip(before.apiserver_heap_inuse_bytes)
            .map(|(a, b)| a - b);
        let kcache_growth: BTreeMap<&str, f64> = settled
            .kcache
            .iter()
            .map(|(k, v)| (*k, v - before.kcache.get(k).copied().unwrap_or(0.0)))
            .collect();
        let lost = written.expected.saturating_sub(report.deliveries);
        let surplus = report.deliveries.saturating_sub(written.expected);
        ctx.progress.log(&format!(
            "{variant}: {} of {} watches in {open_seconds:.1} s; API server RSS +{} MiB (peak +{} MiB), live heap {:+.1} MiB, watchers +{:.0} (peak {:.0}); target RSS +{} MiB; deliveries {}/{}",
            report.watches_established,
            report.client_watches,
            kib(after_gc.apiserver_rss_kib, before.apiserver_rss_kib) / 1024,
            kib(api_peak, before.apiserver_rss_kib) / 1024,
            heap_settled
                .zip(heap_before)
                .map_or(f64::NAN, |(a, b)| (a.live_bytes as f64 - b.live_bytes as f64) / 1048576.0),
            registered_added.values().sum::<f64>(),
            peak_registered - registered_total(&before),
            kib(settled.target_rss_kib, before.target_rss_kib) / 1024,
            report.deliveries,
            written.expected,
        ));
        if !t.is_apiserver() {
            ctx.progress.log(&format!(
                "{variant}: from 1 s after the watches began: at most {upstream_after_first_second} upstream watches (bound {}), API server watches added at most {apiserver_after_first_second}",
                2 * namespaces_used
            ));
            ctx.progress.log(&format!(
                "{variant}: idle once settled: {} cores per replica; the fleet's NATS messages {:.0} published, {:.0} received per s",
                idle_cores.iter().map(|c| format!("{c:.3}")).collect::<Vec<_>>().join(" / "),
                idle_rate("kcache_nats_messages_published_total"),
                idle_rate("kcache_nats_messages_received_total"),
            ));
        }
        if let Some(k) = &keys {
            ctx.progress.log(&format!(
                "{variant}: upstream watches per namespace: max {}, mean {:.2}; {} namespace keys coalesced (secrets), {} (configmaps)",
                k["max_per_namespace"],
                k["mean_per_namespace"].as_f64().unwrap_or(f64::NAN),
                k["namespaces_coalesced"]["secrets"],
                k["namespaces_coalesced"]["configmaps"],
            ));
        }
        report.extra = json!({"coalesce": {
            "variant": variant,
            "kcache_coalesce_min_names": (!t.is_apiserver()).then_some(p.min_names),
            "watches_per_node": per_node,
            "connections": pool.connections(),
            "open_steps": open_steps,
            "open_seconds": open_seconds,
            "open_seconds_method": "time from each step's watch requests to the last of them established (first event), summed over the steps; without the settling pauses before each RSS sample",
            "open_wall_seconds": open_wall,
            "settle_seconds": p.settle_secs,
            "replicas": {
                "count": t.urls().len(),
                "routing": "node n's connection to replica n % count",
                "rss_peak_kib": replica_peaks,
                "rss_settled_kib": replica_settled,
                "cpu_seconds_total": replica_cpu(t),
            },
            "idle": (!t.is_apiserver()).then(|| json!({
                "method": "once settled, over the quiet window before the second RSS reading (the API server's forced collection in it): each replica's CPU, and the NATS messages the fleet published and received, summed over replicas, per second",
                "seconds": idle_secs,
                "cpu_cores_per_replica": idle_cores,
                "nats_published_per_second": idle_rate("kcache_nats_messages_published_total"),
                "nats_received_per_second": idle_rate("kcache_nats_messages_received_total"),
            })),
            "apiserver_rss_kib": {
                "method": format!("before: {q} s after a forced collection (/debug/pprof/heap?gc=1), before the first watch; after_gc: {q} s after another, once the watches had settled; growth: after_gc - before. after_settle: when settled, before that collection; peak: VmRSS every 200 ms while the watches opened and settled", q = QUIET.as_secs()),
                "before": before.apiserver_rss_kib,
                "after_open": after_open.apiserver_rss_kib,
                "after_settle": settled.apiserver_rss_kib,
                "after_gc": after_gc.apiserver_rss_kib,
                "peak": api_peak,
                "growth": kib(after_gc.apiserver_rss_kib, before.apiserver_rss_kib),
                "growth_without_forced_gc": kib(settled.apiserver_rss_kib, before.apiserver_rss_kib),
                "peak_growth": kib(api_peak, before.apiserver_rss_kib),
            },
            "apiserver_goroutines": {
                "before": before.apiserver_goroutines,
                "after_settle": settled.apiserver_goroutines,
            },
            "apiserver_heap_inuse_bytes": {
                "method": "go_memstats_heap_inuse_bytes from /metrics, without a collection first (garbage included: noisy)",
                "before": before.apiserver_heap_inuse_bytes,
                "after_settle": settled.apiserver_heap_inuse_bytes,
                "growth": heap_growth,
            },
            "apiserver_live_heap_bytes": {
                "method": "HeapAlloc + StackInuse right after a forced collection (/debug/pprof/heap?gc=1&debug=1): the memory the API server still holds live (objects and goroutine stacks), which RSS follows only slowly",
                "before": heap_before,
                "after_settle": heap_settled,
                "growth": heap_settled.zip(heap_before).map(|(a, b)| a.live_bytes as i64 - b.live_bytes as i64),
            },
            "target_rss_kib": {
                "before": before.target_rss_kib,
                "after_open": after_open.target_rss_kib,
                "after_settle": settled.target_rss_kib,
                "peak": target_peak,
                "after_gc": after_gc.target_rss_kib,
                "growth": kib(settled.target_rss_kib, before.target_rss_kib),
            },
            "apiserver_watches": {
                "before": before.apiserver_watches,
                "after_open": after_open.apiserver_watches,
                "after_settle": settled.apiserver_watches,
                "added": registered_added,
                "added_total": registered_added.values().sum::<f64>(),
                "peak_added": peak_registered - registered_total(&before),
                "peak_method": format!("highest of the samples every {} ms while the watches opened and settled, and of the reads after each", ctx.args.sample_every_ms),
                "max_added_after_first_second": apiserver_after_first_second,
            },
            "upstream_after_first_second": (!t.is_apiserver()).then(|| json!({
                "method": "the highest kcache_upstream_watches of the samples taken from 1 s after the watch requests began until the watches had settled",
                "max": upstream_after_first_second,
                "bound": 2 * namespaces_used,
                "within_bound": upstream_after_first_second <= (2 * namespaces_used) as f64,
                "samples": after_first_second.len(),
            })),
            "kcache_metrics": (!t.is_apiserver()).then(|| json!({
                "after_open": after_open.kcache,
                "after_settle": settled.kcache,
                "after_writes": end.kcache,
                "growth_to_settle": kcache_growth,
            })),
            "upstream_per_namespace": keys,
            "deliveries": {
                "expected": written.expected,
                "delivered": report.deliveries,
                "lost": lost,
                "surplus": surplus,
                "exact": lost == 0 && surplus == 0 && written.failed == 0,
            },
            "samples": samples,
        }});
        series.push(Series {
            label: variant.clone(),
            sorted,
        });
        reports.push(report);
    }
    let (us, uc) = (p.used(p.secrets), p.used(p.configmaps));
    ScenarioRun {
        workload: json!({
            "nodes": p.nodes,
            "namespaces": p.namespaces,
            "namespaces_per_node": p.ns_per_node,
            "secrets_per_namespace": p.secrets,
            "configmaps_per_namespace": p.configmaps + 1,
            "used_secrets_per_namespace": us,
            "used_configmaps_per_namespace": uc,
            "secret_and_configmap_watches_per_node": per_node - p.ns_per_node,
            "kube_root_ca_watches_per_node": p.ns_per_node,
            "watches_per_node": per_node,
            "watches_total": watches.len(),
            "distinct_objects_watched": watchers.len(),
            "objects": objects.len(),
            "writes_per_second": p.rate,
            "seconds": p.seconds,
            "writes": total_writes,
            "settle_seconds": p.settle_secs,
            "kcache_coalesce_min_names": p.min_names,
            "identities": if p.node_identities {
                "each node its own (system:node:bench-node-<n>, group system:nodes), one pod per node and namespace bound to it and mounting what it watches: the Node authorizer decides"
            } else {
                "every node the bench token (one user)"
            },
        }),
        reports,
        series,
        notes,
        sections: Vec::new(),
    }
}

/// Each replica's CPU seconds so far (one for a single kcache).
fn replica_cpu(t: &Target) -> Vec<f64> {
    t.pids().into_iter().map(probe::cpu_seconds).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params() -> Params {
        Params {
            nodes: 1000,
            per_node: 30,
            namespaces: 100,
            secrets: 20,
            configmaps: 20,
            used_fraction: 0.8,
            ns_per_node: 3,
            rate: 20,
            seconds: 20,
            settle_secs: 45,
            min_names: 0,
            node_identities: false,
        }
    }

    #[test]
    fn every_node_holds_thirty_three_distinct_watches_in_three_namespaces() {
        let p = params();
        assert_eq!(p.watches_per_node(), 33);
        let (watches, receives) = plan(&p);
        assert_eq!(watches.len(), 33_000);
        for n in [0, 1, 33, 999] {
            let node = &watches[n * 33..(n + 1) * 33];
            let distinct: std::collections::HashSet<_> = node.iter().map(|w| &w.0).collect();
            assert_eq!(distinct.len(), 33, "node {n}");
            let roots = node.iter().filter(|w| w.0.contains(ROOT_CA)).count();
            assert_eq!(roots, 3);
        }
        // Each namespace gets 30 node visits; together they watch every used name.
        let f = super::super::fanout(receives.iter().map(String::as_str));
        assert_eq!(f.len(), 100 * (16 + 16 + 1));
        assert_eq!(f[&object_path("bench-co-7", "configmaps", ROOT_CA)], 30);
        assert!(!f.contains_key(&object_path("bench-co-7", "secrets", "s17")));
        let total: usize = f.values().sum();
        assert_eq!(total, receives.len());
    }

    #[test]
    fn each_nodes_pods_mount_exactly_what_it_watches() {
        let p = params();
        let (watches, receives) = plan(&p);
        let pods = pods(&p);
        assert_eq!(pods.len(), p.nodes * p.ns_per_node);
        for n in [0, 7, 999] {
            // What node n receives, as object paths.
            let mut watched: Vec<&str> = receives[n * 33..(n + 1) * 33]
                .iter()
                .map(String::as_str)
                .collect();
            watched.sort_unstable();
            let mut mounted = Vec::new();
            for (collection, pod) in &pods[n * p.ns_per_node..(n + 1) * p.ns_per_node] {
                assert_eq!(pod["spec"]["nodeName"], node_name(n));
                let ns = collection
                    .trim_start_matches("/api/v1/namespaces/")
                    .trim_end_matches("/pods");
                for v in pod["spec"]["volumes"].as_array().into_iter().flatten() {
                    let (kind, name) = match v.get("secret") {
                        Some(s) => ("secrets", &s["secretName"]),
                        None => ("configmaps", &v["configMap"]["name"]),
                    };
                    mounted.push(object_path(ns, kind, name.as_str().unwrap_or("")));
                }
            }
            mounted.sort_unstable();
            assert_eq!(mounted, watched, "node {n}");
            assert!(watches[n * 33].0.contains("fieldSelector=metadata.name%3D"));
        }
    }

    #[test]
    fn a_small_namespace_gives_the_other_kind_the_rest() {
        let p = Params {
            secrets: 2,
            configmaps: 20,
            per_node: 12,
            ns_per_node: 2,
            ..params()
        };
        // used: 2 Secrets (round(1.6)), 16 ConfigMaps; each slot of 6: 2 + 4.
        assert_eq!(p.slot(0), (2, 4));
        assert_eq!(p.watches_per_node(), 14);
    }

    #[test]
    fn writes_are_the_same_for_every_target_and_count_their_watches() {
        let p = params();
        let (_, receives) = plan(&p);
        let f = super::super::fanout(receives.iter().map(String::as_str));
        let objects = all_objects(&p);
        assert_eq!(objects.len(), 100 * 41);
        let a = writes(&objects, &f, 400);
        let b = writes(&objects, &f, 400);
        let paths = |w: &[WriteOp]| {
            w.iter()
                .map(|w| match &w.op {
                    Op::Annotate { path } => path.clone(),
                    _ => String::new(),
                })
                .collect::<Vec<_>>()
        };
        assert_eq!(paths(&a), paths(&b));
        // Some writes go to objects nobody watches: a coalesced namespace key sees them
        // and must not deliver them to name watchers.
        assert!(a.iter().any(|w| w.fanout == 0));
        assert!(a.iter().any(|w| w.fanout > 0));
    }
}
