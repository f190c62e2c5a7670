//! Scenario `restart`: what kubelet-pattern watches go through when the API server is
//! killed (`SIGKILL`) and started again, etcd staying up. `--watches` (10,000)
//! single-object watches (`fieldSelector=metadata.name=X`) over `--secrets` Secrets and
//! `--configmaps` ConfigMaps (500 + 500, interleaved), spread evenly over `--nodes` (100)
//! nodes; each node's watches share one HTTP/2 connection, as a kubelet's do, and no node
//! watches an object twice.
//!
//! Each watch is a client-go reflector (1.20's `ListAndWatch`, which the kubelet's
//! per-object Secret/ConfigMap managers run): a list (`resourceVersion=0&limit=500`), then a
//! watch from the list's RV with `allowWatchBookmarks=true`, following the RV of every event
//! and bookmark. A stream that ends or breaks is watched again at once from the last RV; a
//! watch request refused at connect is retried after 1 s; any other failure (an `ERROR`
//! event, a watch request's error or non-2xx, a watch closed within 1 s with no event)
//! relists after client-go's backoff (800 ms doubling to 30 s, jitter up to 2×), with
//! `limit=500` and no RV after a 410 (a consistent list), else at the last RV; a 429 or 5xx
//! with `Retry-After` is retried by the request itself (up to 10 times), as client-go's
//! REST client does. No `timeoutSeconds`: a stream that ends during the run is the
//! restart's doing.
//!
//! Per target: open every watch (through kcache: and wait until kcache watches every
//! key upstream, its `kcache_upstream_watches`); write once to a ConfigMap nobody
//! watches (in a live cluster other writes move etcd's revision past what a single-object
//! watch last saw; a restarted API server's watch cache starts at the current revision,
//! so such a watcher resumes from an RV it no longer serves: 410); run
//! `--apiserver-restart-cmd` (kill -9 and start the API server again with the same flags;
//! it prints the new pid, which the CPU figures follow); poll the API server's `/readyz`
//! until it answers 200; then write once to every watched object (`--create-concurrency`
//! in flight, always to the API server) and wait, at most `--restart-wait-secs`, until
//! every client has the write (by an event or in a relist) and, through kcache, every key
//! watches upstream again. Per client: did a stream end, did it send watch requests
//! again, did it see a 410 (HTTP or `ERROR` event), did it relist, and the time from the
//! API server's readiness to its receipt of the write.
//!
//! Upstream lists: kcache's own `kcache_upstream_lists_total` from just before the kill to
//! the end, and for both targets the restarted API server's `apiserver_request_total`
//! for Secrets and ConfigMaps with `verb="LIST"`: a new process starts at zero, so it
//! counts every list since the restart (its own loopback clients included; they list a
//! handful). Beside it, the watches of those kinds it holds at the end
//! (`apiserver_longrunning_gauge`; a watch is counted in `apiserver_request_total` only
//! when it ends).

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use futures::StreamExt;
use serde_json::{json, Value};
use tokio::task::JoinHandle;

use super::{between_targets, Ctx, ScenarioRun, Series, Target};
use crate::probe::{self, Cpu};
use crate::record::{next_seq_key, Counters, Recorder};
use crate::report::{Latency, TargetReport};

mod apiserver;
mod reflector;

use crate::client::node_client;
use apiserver::{
    apiserver_requests, read_metrics, restart_apiserver, wait_ready, write_once, KCACHE_COUNTERS,
    READY_TIMEOUT,
};
pub(super) use reflector::{error_kind, waited_to_retry, MAX_RETRIES, REQUEST_TIMEOUT};
use reflector::{Counts, Reflector, Shared, Stats};

const NS: &str = "bench-restart";

#[derive(Clone, Debug)]
pub struct Params {
    pub watches: usize,
    pub nodes: usize,
    pub secrets: usize,
    pub configmaps: usize,
    pub concurrency: usize,
    pub wait_secs: u64,
    pub restart_cmd: String,
}

impl Params {
    pub fn from_ctx(ctx: &Ctx) -> Params {
        let a = &ctx.args;
        let (secrets, configmaps) = match (a.secrets, a.configmaps) {
            (0, 0) => (1, 0),
            other => other,
        };
        Params {
            watches: a.watches.unwrap_or(10_000).max(1),
            nodes: a.nodes.max(1),
            secrets,
            configmaps,
            concurrency: a.create_concurrency.max(1),
            wait_secs: a.restart_wait_secs.max(1),
            restart_cmd: a.apiserver_restart_cmd.clone().unwrap_or_default(),
        }
    }
}

/// One watched object.
#[derive(Clone, Debug)]
struct Object {
    /// `secrets` or `configmaps`.
    kind: &'static str,
    name: String,
}

impl Object {
    fn collection(&self) -> String {
        format!("/api/v1/namespaces/{NS}/{}", self.kind)
    }
    fn path(&self) -> String {
        format!("{}/{}", self.collection(), self.name)
    }
}

/// Secrets and ConfigMaps, interleaved, so every node's contiguous run of objects has
/// both kinds.
fn objects(p: &Params) -> Vec<Object> {
    let mut v = Vec::with_capacity(p.secrets + p.configmaps);
    for i in 0..p.secrets.max(p.configmaps) {
        if i < p.secrets {
            v.push(Object {
                kind: "secrets",
                name: format!("s{i}"),
            });
        }
        if i < p.configmaps {
            v.push(Object {
                kind: "configmaps",
                name: format!("c{i}"),
            });
        }
    }
    v
}

/// Per watch: (node, object index). Node `n` holds watches `watches·n/nodes ..
/// watches·(n+1)/nodes`, watch `g` the object `g mod objects`: a node's objects are
/// distinct as long as it holds no more watches than there are objects.
fn plan(p: &Params, objects: usize) -> Vec<(usize, usize)> {
    let nodes = p.nodes.min(p.watches);
    (0..nodes)
        .flat_map(|n| {
            let (a, b) = (p.watches * n / nodes, p.watches * (n + 1) / nodes);
            (a..b).map(move |g| (n, g % objects.max(1)))
        })
        .collect()
}

fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}

/// The figures compared side by side, in this order (every report of a run has them all).
const FIGURES: [&str; 25] = [
    "client_watches",
    "watches_established",
    "keys",
    "apiserver_down_seconds",
    "clients_lost_connection",
    "clients_reconnected",
    "watch_requests_after_kill",
    "clients_saw_410",
    "clients_relisted",
    "client_lists_after_kill",
    "kcache_upstream_lists",
    "apiserver_lists_after_restart",
    "apiserver_watches_open_at_end",
    "clients_expecting_write",
    "clients_with_write",
    "first_write_from_ready_p50_ms",
    "first_write_from_ready_p99_ms",
    "first_write_from_ready_max_ms",
    "all_delivered_by_seconds",
    "kcache_every_key_watched_again_seconds",
    "write_to_delivery_p50_ms",
    "write_to_delivery_p99_ms",
    "target_cpu_seconds_after_ready",
    "apiserver_cpu_seconds_after_ready",
    "generator_cpu_seconds_after_ready",
];

/// Everything one target's run yields.
struct Measured {
    report: TargetReport,
    sorted: Vec<Duration>,
    note: Option<String>,
}

/// Measures one target: open the watches, restart the API server, write, wait.
async fn measure(
    ctx: &Ctx,
    p: &Params,
    t: &Target,
    objects: &[Object],
    plan: &[(usize, usize)],
    apiserver_pid: &mut u32,
) -> Measured {
    let rec = Arc::new(Recorder::new(1));
    let _tracking = ctx
        .progress
        .track(format!("restart/{}", t.name), rec.clone(), plan.len());
    let shared = Arc::new(Shared {
        rec: rec.clone(),
        base: t.url.clone(),
        token: ctx.args.token.clone(),
        writes: objects.iter().map(|_| OnceLock::new()).collect(),
    });
    let nodes = plan.last().map_or(0, |(n, _)| n + 1);
    let clients: Vec<reqwest::Client> = (0..nodes).map(|_| node_client(ctx.args.http1)).collect();
    let stats: Vec<Arc<Stats>> = plan.iter().map(|_| Arc::default()).collect();
    let mut handles: Vec<JoinHandle<()>> = Vec::with_capacity(plan.len());
    let target_pid = |api: u32| if t.is_apiserver() { api } else { t.pid };

    // Open node by node in `--steps` steps, as nodes come up one after another.
    let rss_before = probe::rss_kib(target_pid(*apiserver_pid));
    let cpu_open_start = Cpu::now(target_pid(*apiserver_pid), *apiserver_pid);
    let timeout = ctx
        .args
        .open_timeout_secs
        .unwrap_or(ctx.args.scenario.open_timeout_secs());
    let deadline = Instant::now() + Duration::from_secs(timeout);
    let steps = ctx.args.steps.clamp(1, nodes.max(1));
    ctx.progress.stage(&format!(
        "opening {} reflectors (list + watch) over {nodes} nodes' connections",
        plan.len()
    ));
    let mut next = 0;
    let mut warned = false;
    for step in 0..steps {
        let last_node = nodes * (step + 1) / steps;
        while next < plan.len() && plan[next].0 < last_node {
            let (node, obj) = plan[next];
            let o = &objects[obj];
            let r = Reflector {
                http: clients[node].clone(),
                shared: shared.clone(),
                stats: stats[next].clone(),
                object: obj,
                collection: o.collection(),
                name: o.name.clone(),
                seed: next as u64,
            };
            handles.push(tokio::spawn(r.run()));
            next += 1;
        }
        let until = if warned {
            Instant::now() + Duration::from_secs(30)
        } else {
            deadline
        };
        while Counters::get(&rec.counters.ready) < next && Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        if Counters::get(&rec.counters.ready) < next && !warned {
            warned = true;
            ctx.progress.log(&format!(
                "{}: only {} of {next} watches established after {timeout} s; going on",
                t.name,
                Counters::get(&rec.counters.ready)
            ));
        }
    }
    tokio::time::sleep(Duration::from_millis(ctx.args.settle_ms)).await;
    let keys: HashSet<usize> = plan.iter().map(|(_, o)| *o).collect();
    // With coalescing, a namespace key's one upstream watch stands for the names it
    // serves: every key is watched when upstream watches + those saved reach the keys.
    let gauges = [
        "kcache_upstream_watches",
        "kcache_synced_keys",
        "kcache_coalesce_upstream_watches_saved",
    ];
    let all_watched = |v: &[f64]| v[0] + v[2] >= keys.len() as f64;
    // kcache paces upstream list and watch starts (`upstream_qps`): its clients are all
    // served (from a key's list) seconds before the last key's upstream watch is open.
    // The restart should hit a steady state, every key watching upstream.
    let mut steady_wait = None;
    if !t.is_apiserver() {
        ctx.progress
            .stage("waiting for kcache to watch every key upstream");
        let start = Instant::now();
        let until = start + Duration::from_secs(120);
        loop {
            let v = read_metrics(ctx, &t.url, &gauges).await;
            if v.as_ref().is_some_and(|v| all_watched(v)) {
                steady_wait = Some(secs(start.elapsed()));
                break;
            }
            if Instant::now() >= until {
                ctx.progress.log(&format!(
                    "kcache: upstream watches {} of {} keys after 120 s; restarting anyway",
                    v.map_or("?".into(), |v| v[0].to_string()),
                    keys.len()
                ));
                break;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
    let established = Counters::get(&rec.counters.ready);
    let cpu_open = Cpu::now(target_pid(*apiserver_pid), *apiserver_pid) - cpu_open_start;
    let rss_open = probe::rss_kib(target_pid(*apiserver_pid));
    let kcache_before = if t.is_apiserver() {
        None
    } else {
        read_metrics(ctx, &t.url, &KCACHE_COUNTERS).await
    };
    let kcache_gauges_before = if t.is_apiserver() {
        None
    } else {
        read_metrics(ctx, &t.url, &gauges).await
    };
    ctx.progress.log(&format!(
        "{}: {established} of {} watches established over {nodes} connections ({} keys); restarting the API server",
        t.name,
        plan.len(),
        keys.len()
    ));

    // In a live cluster, writes to other objects (node leases, events) move etcd's
    // revision past the RVs a single-object watch last saw; a restarted API server's
    // watch cache starts at the revision of its first list, so such watchers resume from
    // an RV it cannot serve. One write to an object nobody watches stands in for them.
    let key = next_seq_key();
    if !write_once(ctx, &unwatched().path(), &key).await {
        ctx.progress
            .log("write to the unwatched ConfigMap failed: etcd's revision may not have moved");
    }

    // The restart.
    let before: Vec<Counts> = stats.iter().map(|s| s.counts()).collect();
    let errors_before = Counters::get(&rec.counters.errors);
    ctx.progress.stage("kill -9 and start the API server again");
    let killed = Instant::now();
    let old_pid = *apiserver_pid;
    let mut notes = Vec::new();
    match restart_apiserver(&p.restart_cmd).await {
        Ok((pid, said)) => {
            *apiserver_pid = pid;
            if !said.is_empty() {
                ctx.progress.log(&format!("restart: {said}"));
                notes.push(format!("the restart command said: {said}"));
            }
        }
        Err(e) => {
            ctx.progress.log(&format!("restart: {e}"));
            notes.push(format!("the API server could not be restarted: {e}"));
        }
    }
    ctx.progress.stage("waiting for the API server's /readyz");
    let ready = wait_ready(ctx).await;
    let Some(ready) = ready else {
        for h in handles {
            h.abort();
        }
        notes.push(format!(
            "the API server was not ready within {} s of the restart; nothing measured",
            READY_TIMEOUT.as_secs()
        ));
        let note = format!("{}: {}", t.name, notes.join("; "));
        ctx.progress.log(&note);
        return Measured {
            report: TargetReport {
                target: t.name.into(),
                url: t.url.clone(),
                client_watches: plan.len(),
                watches_established: established,
                notes,
                own_figures: Some(FIGURES.iter().map(|n| (*n, None)).collect()),
                ..Default::default()
            },
            sorted: Vec::new(),
            note: Some(note),
        };
    };
    let down = ready - killed;
    let new_pid = *apiserver_pid;
    let apiserver_cpu_to_ready = probe::cpu_seconds(new_pid);
    let cpu_start = Cpu::now(target_pid(new_pid), new_pid);
    ctx.progress.log(&format!(
        "{}: API server pid {old_pid} killed, pid {new_pid} ready after {:.2} s",
        t.name,
        secs(down)
    ));

    // One write per watched object, right away.
    ctx.progress.stage(&format!(
        "writing each of {} watched objects once",
        keys.len()
    ));
    let mut watched: Vec<usize> = keys.iter().copied().collect();
    watched.sort_unstable();
    // A client waits for its write unless that write failed for good.
    let write_failed: Arc<Vec<AtomicBool>> =
        Arc::new(objects.iter().map(|_| AtomicBool::new(false)).collect());
    let writer = {
        let (shared, write_failed) = (shared.clone(), write_failed.clone());
        async move {
            let results: Vec<bool> = futures::stream::iter(watched)
                .map(|i| {
                    let (shared, write_failed) = (shared.clone(), write_failed.clone());
                    async move {
                        let key = next_seq_key();
                        let _ = shared.writes[i].set((key.clone(), Instant::now()));
                        Counters::inc(&shared.rec.counters.writes);
                        let ok = write_once(ctx, &objects[i].path(), &key).await;
                        write_failed[i].store(!ok, Ordering::Relaxed);
                        ok
                    }
                })
                .buffer_unordered(p.concurrency)
                .collect()
                .await;
            (results, Instant::now())
        }
    };
    let waiter = async {
        ctx.progress
            .stage("waiting for every client to have the post-restart write");
        let until = ready + Duration::from_secs(p.wait_secs);
        let mut timeline = Vec::new();
        let mut last_poll: Option<Instant> = None;
        // kcache: when every key watched upstream again (its clients may all have the
        // write before, from relists).
        let mut rewatched: Option<f64> = None;
        loop {
            // kcache's upstream side, once a second.
            if !t.is_apiserver() && last_poll.is_none_or(|l| l.elapsed() >= Duration::from_secs(1))
            {
                last_poll = Some(Instant::now());
                if let Some(v) = read_metrics(ctx, &t.url, &gauges).await {
                    timeline.push(json!({
                        "s_after_ready": secs(ready.elapsed()),
                        "upstream_watches": v[0],
                        "synced_keys": v[1],
                        "clients_with_write": stats.iter().filter(|s| s.got.get().is_some()).count(),
                    }));
                    if rewatched.is_none() && all_watched(&v) {
                        rewatched = Some(secs(ready.elapsed()));
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
            let pending = plan.iter().zip(&stats).any(|((_, o), s)| {
                s.got.get().is_none() && !write_failed[*o].load(Ordering::Relaxed)
            });
            let upstream_back = t.is_apiserver() || rewatched.is_some();
            if (!pending && upstream_back) || Instant::now() >= until {
                return (timeline, rewatched);
            }
        }
    };
    let ((results, writes_done), (timeline, rewatched)) = tokio::join!(writer, waiter);
    // Late arrivals of duplicates do not matter; the counters below are final.
    let cpu = Cpu::now(target_pid(new_pid), new_pid) - cpu_start;
    let rss_after = probe::rss_kib(target_pid(new_pid));
    // The restarted API server's own peak, from its start through the reconnect storm to
    // the last client's write: what coalescing is to spare it (the kernel's high-water
    // mark; a new process, so all of it came after the restart).
    let apiserver_peak_rss = probe::peak_rss_kib(new_pid);
    let apiserver_rss_at_end = probe::rss_kib(new_pid);
    ctx.progress.log(&format!(
        "{}: restarted API server RSS: peak {} MiB, at the end {} MiB",
        t.name,
        apiserver_peak_rss / 1024,
        apiserver_rss_at_end / 1024
    ));
    let kcache_after = if t.is_apiserver() {
        None
    } else {
        read_metrics(ctx, &t.url, &KCACHE_COUNTERS).await
    };
    let kcache_gauges_after = if t.is_apiserver() {
        None
    } else {
        read_metrics(ctx, &t.url, &gauges).await
    };
    let api_text = probe::scrape(&ctx.api.http, &ctx.args.apiserver, &ctx.args.token).await;
    let registered = api_text.as_deref().map(probe::apiserver_watches);
    for h in handles {
        h.abort();
    }

    // Per client.
    let delta: Vec<Counts> = stats
        .iter()
        .zip(&before)
        .map(|(s, b)| s.counts() - *b)
        .collect();
    let clients = |f: &dyn Fn(&Counts) -> usize| delta.iter().filter(|c| f(c) > 0).count();
    let total = |f: &dyn Fn(&Counts) -> usize| delta.iter().map(f).sum::<usize>();
    let expecting = plan
        .iter()
        .filter(|(_, o)| !write_failed[*o].load(Ordering::Relaxed))
        .count();
    let mut from_ready: Vec<Duration> = Vec::new();
    let mut from_write: Vec<Duration> = Vec::new();
    for ((_, o), s) in plan.iter().zip(&stats) {
        if let Some(at) = s.got.get() {
            from_ready.push(at.saturating_duration_since(ready));
            if let Some((_, sent)) = shared.writes[*o].get() {
                from_write.push(at.saturating_duration_since(*sent));
            }
        }
    }
    from_ready.sort_unstable();
    from_write.sort_unstable();
    let delivered = from_ready.len();
    let all_by = (delivered == expecting && expecting > 0)
        .then(|| from_ready.last().map(|d| secs(*d)))
        .flatten();
    let ttfw = Latency::of(&from_ready);
    let w2d = Latency::of(&from_write);
    let writes_ok = results.iter().filter(|ok| **ok).count();
    let lost = clients(&|c| c.ended);
    let reconnected = clients(&|c| c.watch_requests);
    let saw_410 = clients(&|c| c.gone);
    let relisted = clients(&|c| c.lists);
    let kdelta: Option<Vec<f64>> = kcache_before
        .zip(kcache_after)
        .map(|(b, a)| a.iter().zip(&b).map(|(a, b)| a - b).collect());
    let kcache_section = kdelta.as_ref().map(|d| {
        let mut m: BTreeMap<String, Value> = KCACHE_COUNTERS
            .iter()
            .zip(d)
            .map(|(n, v)| (n.to_string(), json!(v)))
            .collect();
        m.insert(
            "gauges_before".into(),
            json!(kcache_gauges_before.as_ref().map(
                |g| json!({"upstream_watches": g[0], "synced_keys": g[1], "coalesce_saved": g[2]})
            )),
        );
        m.insert(
            "gauges_after".into(),
            json!(kcache_gauges_after.as_ref().map(
                |g| json!({"upstream_watches": g[0], "synced_keys": g[1], "coalesce_saved": g[2]})
            )),
        );
        m.insert("timeline".into(), json!(timeline));
        m.insert(
            "seconds_until_every_key_watched_before_kill".into(),
            json!(steady_wait),
        );
        m.insert(
            "seconds_after_ready_until_every_key_watched_again".into(),
            json!(rewatched),
        );
        json!(m)
    });
    let upstream_lists = kdelta.as_ref().map(|d| d[0]);
    let api_requests = api_text.as_deref().map(apiserver_requests);
    let api_lists = api_requests.as_ref().and_then(|r| r["lists"].as_f64());
    let api_watches = api_requests
        .as_ref()
        .and_then(|r| r["watches_open"].as_f64());
    let q = |v: &[Duration], p: f64| crate::report::percentile(v, p);
    let f = |v: usize| Some(v as f64);
    // As many values as FIGURES, or this does not compile.
    let values: [Option<f64>; FIGURES.len()] = [
        f(plan.len()),
        f(established),
        f(keys.len()),
        Some(secs(down)),
        f(lost),
        f(reconnected),
        f(total(&|c| c.watch_requests)),
        f(saw_410),
        f(relisted),
        f(total(&|c| c.lists)),
        upstream_lists,
        api_lists,
        api_watches,
        f(expecting),
        f(delivered),
        ttfw.p50_ms,
        ttfw.p99_ms,
        ttfw.max_ms,
        all_by,
        rewatched,
        w2d.p50_ms,
        w2d.p99_ms,
        Some(cpu.target),
        Some(cpu.apiserver),
        Some(cpu.generator),
    ];
    let own = FIGURES.iter().copied().zip(values).collect();
    let summary = format!(
        "{}: down {:.2} s; {lost} clients lost their stream, {reconnected} reconnected, {saw_410} saw a 410, {relisted} relisted; upstream lists: kcache {}, API server {}; write delivered to {delivered}/{expecting}: from ready p50 {} ms, p99 {} ms, max {} ms",
        t.name,
        secs(down),
        upstream_lists.map_or("-".into(), |v| v.to_string()),
        api_lists.map_or("-".into(), |v| v.to_string()),
        fmt_ms(ttfw.p50_ms),
        fmt_ms(ttfw.p99_ms),
        fmt_ms(ttfw.max_ms),
    );
    ctx.progress.log(&summary);
    if established < plan.len() {
        notes.push(format!(
            "{} of {} watches were established before the restart",
            established,
            plan.len()
        ));
    }
    if delivered < expecting {
        notes.push(format!(
            "{} of {expecting} clients had not received the post-restart write {} s after the API server was ready",
            expecting - delivered,
            p.wait_secs
        ));
    }
    let extra = json!({
        "restart": {
            "apiserver_pid_killed": old_pid,
            "apiserver_pid_after": new_pid,
            "down_seconds": secs(down),
            "apiserver_cpu_seconds_start_to_ready": apiserver_cpu_to_ready,
            "apiserver_peak_rss_kib_after_restart": apiserver_peak_rss,
            "apiserver_rss_kib_at_end": apiserver_rss_at_end,
            "target_rss_kib_with_watches_before_kill": rss_open,
            "target_rss_kib_at_end": rss_after,
            "writes": results.len(),
            "writes_failed": results.len() - writes_ok,
            "writes_done_seconds_after_ready": secs(writes_done.saturating_duration_since(ready)),
            "clients": {
                "lost_connection": lost,
                "reconnected": reconnected,
                "saw_410": saw_410,
                "relisted": relisted,
                "refused_at_connect": clients(&|c| c.refused),
                "other_error_events": clients(&|c| c.error_events),
                "http_errors": clients(&|c| c.http_errors),
                "expecting_write": expecting,
                "with_write": delivered,
            },
            "totals": {
                "streams_ended": total(&|c| c.ended),
                "watch_requests": total(&|c| c.watch_requests),
                "refused_at_connect": total(&|c| c.refused),
                "responses_410": total(&|c| c.gone),
                "other_error_events": total(&|c| c.error_events),
                "http_errors": total(&|c| c.http_errors),
                "lists": total(&|c| c.lists),
            },
            "first_write_from_ready": {
                "samples": delivered,
                "p50_ms": ttfw.p50_ms,
                "p90_ms": ttfw.p90_ms,
                "p99_ms": ttfw.p99_ms,
                "max_ms": ttfw.max_ms,
                "all_delivered_by_seconds": all_by,
            },
            "write_to_delivery": {
                "samples": from_write.len(),
                "p50_ms": q(&from_write, 0.5),
                "p99_ms": q(&from_write, 0.99),
                "max_ms": w2d.max_ms,
            },
            "upstream_lists_method": "kcache: kcache_upstream_lists_total from just before the kill to the end (includes probes, see kcache.kcache_upstream_probes_total); apiserver_requests: the restarted API server's apiserver_request_total{verb=LIST} for secrets and configmaps since it started (its own loopback clients included); watches_open: its apiserver_longrunning_gauge{verb=WATCH} for them at the end",
            "apiserver_requests": api_requests,
            "apiserver_watches_at_end": registered,
            "kcache": kcache_section,
        }
    });
    let report = TargetReport {
        target: t.name.into(),
        url: t.url.clone(),
        client_watches: plan.len(),
        watches_established: established,
        connections: nodes,
        rss_before_kib: rss_before,
        rss_after_kib: rss_open,
        writes: results.len(),
        write_errors: results.len() - writes_ok,
        expected_deliveries: expecting,
        deliveries: delivered,
        latency: ttfw,
        cpu_open,
        cpu_write: cpu,
        errors: Counters::get(&rec.counters.errors) - errors_before,
        watch_streams_ended: total(&|c| c.ended),
        error_reasons: rec.reasons(),
        notes: notes.clone(),
        extra,
        own_figures: Some(own),
        ..Default::default()
    };
    Measured {
        report,
        sorted: from_ready,
        note: (!notes.is_empty()).then(|| format!("{}: {}", t.name, notes.join("; "))),
    }
}

/// A ConfigMap no client watches, written just before each kill.
fn unwatched() -> Object {
    Object {
        kind: "configmaps",
        name: "unwatched".into(),
    }
}

fn fmt_ms(v: Option<f64>) -> String {
    v.map_or("-".into(), |v| format!("{v:.0}"))
}

async fn setup(ctx: &Ctx, objects: &[Object]) {
    ctx.progress.stage(&format!(
        "creating {} Secrets and ConfigMaps",
        objects.len()
    ));
    if let Err(e) = ctx.api.ensure_namespace(NS).await {
        ctx.progress.log(&format!("namespace {NS}: {e}"));
    }
    let items = objects
        .iter()
        .chain([&unwatched()])
        .map(|o| {
            let body = if o.kind == "secrets" {
                json!({"metadata": {"name": o.name}, "data": {"v": "MA=="}})
            } else {
                json!({"metadata": {"name": o.name}, "data": {"v": "0"}})
            };
            (o.collection(), body)
        })
        .collect();
    let n = ctx.api.create_all(items).await;
    ctx.progress.log(&format!(
        "setup: {} objects created, {} existed, {} failed",
        n.created, n.existed, n.failed
    ));
}

pub async fn run(ctx: &Ctx) -> ScenarioRun {
    let p = Params::from_ctx(ctx);
    let objects = objects(&p);
    setup(ctx, &objects).await;
    let plan = plan(&p, objects.len());
    let nodes = p.nodes.min(p.watches);
    let mut notes = Vec::new();
    if p.watches.div_ceil(nodes) > objects.len() {
        notes.push(format!(
            "{} watches per node over {} objects: a node watches some objects twice",
            p.watches.div_ceil(nodes),
            objects.len()
        ));
    }
    // Follows the API server across restarts: every target's run starts a new one.
    let mut apiserver_pid = ctx.args.apiserver_pid;
    let mut reports = Vec::new();
    let mut series = Vec::new();
    for (i, t) in ctx.targets.iter().enumerate() {
        if i > 0 {
            between_targets(ctx).await;
        }
        let m = measure(ctx, &p, t, &objects, &plan, &mut apiserver_pid).await;
        notes.extend(m.note);
        series.push(Series {
            label: format!("{}: API server ready -> first post-restart write", t.name),
            sorted: m.sorted,
        });
        reports.push(m.report);
    }
    ScenarioRun {
        workload: json!({
            "watches": plan.len(),
            "nodes": nodes,
            "watches_per_node": p.watches as f64 / nodes as f64,
            "secrets": p.secrets,
            "configmaps": p.configmaps,
            "keys": plan.iter().map(|(_, o)| *o).collect::<HashSet<_>>().len(),
            "connection_per_node": !ctx.args.http1,
            "restart_cmd": p.restart_cmd,
            "write_concurrency": p.concurrency,
            "wait_secs": p.wait_secs,
            "client": "client-go 1.20 reflector per watch: list (resourceVersion=0&limit=500), watch from its RV (allowWatchBookmarks); stream end -> watch again from the last RV; connection refused -> again in 1 s; ERROR event / watch error / very short watch -> backoff (0.8 s doubling to 30 s, jitter 1-2x), relist (after a 410: consistent, limit=500; else at the last RV); 429/5xx with Retry-After retried up to 10 times",
            "latency_cdf": "time from the API server's /readyz answering 200 after the restart to each client's receipt of its object's first post-restart write",
        }),
        reports,
        series,
        notes,
        sections: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn params(watches: usize, nodes: usize) -> Params {
        Params {
            watches,
            nodes,
            secrets: 500,
            configmaps: 500,
            concurrency: 32,
            wait_secs: 180,
            restart_cmd: String::new(),
        }
    }

    #[test]
    fn standard_plan_is_one_hundred_distinct_objects_per_node() {
        let p = params(10_000, 100);
        let objects = objects(&p);
        assert_eq!(objects.len(), 1000);
        assert_eq!(
            (objects[0].kind, objects[1].kind),
            ("secrets", "configmaps")
        );
        let plan = plan(&p, objects.len());
        assert_eq!(plan.len(), 10_000);
        for n in 0..100 {
            let mine: HashSet<usize> = plan
                .iter()
                .filter(|(node, _)| *node == n)
                .map(|(_, o)| *o)
                .collect();
            assert_eq!(mine.len(), 100, "node {n}");
        }
        // Every object is watched by ten nodes.
        let mut per: HashMap<usize, usize> = HashMap::new();
        for (_, o) in &plan {
            *per.entry(*o).or_default() += 1;
        }
        assert_eq!(per.len(), 1000);
        assert!(per.values().all(|n| *n == 10));
        // Uneven sizes still hand out every watch.
        assert_eq!(super::plan(&params(1001, 7), 1000).len(), 1001);
        assert_eq!(super::plan(&params(3, 10), 1000).len(), 3);
    }
}
