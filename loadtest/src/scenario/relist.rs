//! Scenario `relist`: controllers doing full consistent relists (issue 29.4), and one
//! `kubectl get`-style Table list, directly and through kcache.
//!
//! `--objects` (20,000) ConfigMaps `o0`.. with `--payload-bytes` (128) of data each in one
//! namespace, created once through the API server. Per target (in `--targets` order):
//!
//! 1. **Warm-up**: one paged list through the target (kcache: the key's first sync, as a
//!    controller's informer would have made it long before), then 5 s of quiet.
//! 2. **Idle**: the API server's RSS (and kcache's), CPU seconds of the API server, etcd
//!    (`--etcd-pid`), the target and this generator, and the servers' request counters.
//! 3. **Relists**: `--clients` (50) controllers, each on an HTTP/2 connection of its own
//!    (controllers are processes of their own), for `--seconds` (120): every
//!    `--relist-period-secs` (30; their first relists staggered evenly over one period) a
//!    full consistent relist as client-go's pager reads it: `limit=--page-limit` (500) and
//!    no resourceVersion, then `continue` with each page's `metadata.continue` until it is
//!    empty. A 410 (`Expired` continue token) restarts the relist from its first page and
//!    counts a restart (client-go's pager would fall back to one unpaged list); a 429/5xx
//!    with `Retry-After` is retried as client-go's REST client does; any other failure
//!    ends the relist as an error. A relist that outlasts the period delays the next one
//!    (a ticker that drops missed ticks). After `--seconds` no relist starts; those in
//!    flight finish and count. RSS of the API server (and kcache) sampled every 50 ms on a
//!    thread of its own for the peak; CPU deltas over the whole phase.
//! 4. **Table list**, after 5 s of quiet: one list of every object as a Table (`Accept:
//!    application/json;as=Table;v=v1;g=meta.k8s.io`, the same pages), as `kubectl get`
//!    reads: its wall time and what it cost the API server, etcd and the target in CPU.
//!
//! Targets share one API server, one after the other: the second target's API server
//! starts from the heap the first one's relists grew (Go returns memory to the OS
//! slowly), so its RSS growth over idle is understated. For RSS figures of each on fresh
//! processes, run the scenario once per target (`--targets apiserver`, then
//! `--targets kcache`).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::de::IgnoredAny;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::restart::{error_kind, waited_to_retry, MAX_RETRIES, REQUEST_TIMEOUT};
use super::{between_targets, seed_configmaps, Ctx, ScenarioRun, Target};
use crate::client::{http_client, ConnPool};
use crate::probe::{self, Cpu, PeakRss};
use crate::record::Recorder;
use crate::report::{Latency, TargetReport};

const NS: &str = "bench-relist";
/// What `kubectl get` asks for (its first choice).
const TABLE_ACCEPT: &str = "application/json;as=Table;v=v1;g=meta.k8s.io";
/// How often RSS is sampled during the relists.
const RSS_SAMPLE: Duration = Duration::from_millis(50);
/// Quiet time after the warm-up list and before the Table list.
const SETTLE: Duration = Duration::from_secs(5);
/// 410 restarts one relist may take before it counts as failed.
const MAX_RESTARTS: usize = 10;
/// How often the relist phase logs its progress.
const LOG_EVERY: Duration = Duration::from_secs(15);

#[derive(Clone, Debug)]
pub struct Params {
    pub objects: usize,
    pub payload_bytes: usize,
    pub controllers: usize,
    pub seconds: u64,
    pub period_secs: u64,
    pub limit: usize,
    pub name_reads_secs: u64,
}

impl Params {
    pub fn from_ctx(ctx: &Ctx) -> Params {
        let a = &ctx.args;
        Params {
            objects: a.objects.unwrap_or(20_000).max(1),
            payload_bytes: a.payload_bytes.unwrap_or(128),
            controllers: a.clients.max(1),
            seconds: a.seconds.unwrap_or(120).max(1),
            period_secs: a.relist_period_secs.max(1),
            limit: a.page_limit.max(1),
            name_reads_secs: a.name_reads_secs,
        }
    }
}

fn collection() -> String {
    format!("/api/v1/namespaces/{NS}/configmaps")
}

#[derive(Deserialize, Default)]
struct PageMeta {
    #[serde(default, rename = "continue")]
    cont: Option<String>,
}

/// One page of a list (`items`) or of a Table (`rows`); the entries are only counted.
#[derive(Deserialize)]
struct Page {
    #[serde(default)]
    metadata: PageMeta,
    #[serde(default)]
    items: Option<Vec<IgnoredAny>>,
    #[serde(default)]
    rows: Option<Vec<IgnoredAny>>,
}

/// Why a page was not had.
enum PageError {
    /// 410: the continue token expired.
    Expired,
    Failed(String),
}

/// One paged list, first page to last.
#[derive(Clone, Debug, Default, Serialize)]
struct Paged {
    /// From the first page's request to the last page's body (restarts included).
    seconds: f64,
    /// Pages fetched, those of restarted attempts included.
    pages: usize,
    /// Items (Table: rows) of the attempt that finished.
    items: usize,
    /// Restarts after a 410 on a continue.
    restarts: usize,
    error: Option<String>,
}

/// A list reader: one connection, the bench token, the list's URLs (a fleet's replicas,
/// each page to the next in turn, as behind a Service) and page size, and (Table) its
/// `Accept`.
struct Lister {
    http: reqwest::Client,
    urls: Vec<String>,
    /// The next page's replica (modulo `urls`).
    turn: AtomicUsize,
    token: String,
    limit: usize,
    accept: Option<&'static str>,
}

impl Lister {
    /// A reader whose first page goes to the target's replica `first` (modulo how many).
    fn new(http: reqwest::Client, ctx: &Ctx, t: &Target, p: &Params, first: usize) -> Lister {
        Lister {
            http,
            urls: t
                .urls()
                .iter()
                .map(|u| format!("{u}{}", collection()))
                .collect(),
            turn: AtomicUsize::new(first),
            token: ctx.args.token.clone(),
            limit: p.limit,
            accept: None,
        }
    }

    fn next_url(&self) -> &str {
        let i = self.turn.fetch_add(1, Ordering::Relaxed);
        &self.urls[i % self.urls.len()]
    }

    /// One page: after `cont`, or the first.
    async fn page(&self, cont: Option<&str>, rec: &Recorder) -> Result<Page, PageError> {
        let limit = self.limit.to_string();
        let mut query = vec![("limit", limit.as_str())];
        if let Some(c) = cont {
            query.push(("continue", c));
        }
        for attempt in 0..=MAX_RETRIES {
            let mut req = self
                .http
                .get(self.next_url())
                .query(&query)
                .bearer_auth(&self.token)
                .timeout(REQUEST_TIMEOUT);
            if let Some(a) = self.accept {
                req = req.header(reqwest::header::ACCEPT, a);
            }
            let resp = req
                .send()
                .await
                .map_err(|e| PageError::Failed(format!("list {}", error_kind(&e))))?;
            if waited_to_retry(&resp, attempt, rec).await {
                continue;
            }
            let status = resp.status().as_u16();
            if status == 410 {
                return Err(PageError::Expired);
            }
            if !resp.status().is_success() {
                return Err(PageError::Failed(format!("list HTTP {status}")));
            }
            let body = resp
                .bytes()
                .await
                .map_err(|e| PageError::Failed(format!("list body {}", error_kind(&e))))?;
            return serde_json::from_slice(&body)
                .map_err(|_| PageError::Failed("unparsable page".into()));
        }
        Err(PageError::Failed(
            "list: Retry-After retries exhausted".into(),
        ))
    }

    /// Every page, following `metadata.continue` until it is empty; a 410 on a continue
    /// starts again from the first page. A failure is counted in `rec` with its reason.
    async fn list(&self, rec: &Recorder, pages: &AtomicUsize) -> Paged {
        let start = Instant::now();
        let mut out = Paged::default();
        let mut cont: Option<String> = None;
        loop {
            match self.page(cont.as_deref(), rec).await {
                Ok(page) => {
                    out.pages += 1;
                    pages.fetch_add(1, Ordering::Relaxed);
                    out.items += page.items.or(page.rows).map_or(0, |v| v.len());
                    cont = page.metadata.cont.filter(|c| !c.is_empty());
                    if cont.is_none() {
                        break;
                    }
                }
                Err(PageError::Expired) if cont.is_some() && out.restarts < MAX_RESTARTS => {
                    rec.note("410 on a continue: relist restarted".into());
                    out.restarts += 1;
                    out.items = 0;
                    cont = None;
                }
                Err(e) => {
                    let why = match e {
                        PageError::Expired if cont.is_some() => {
                            format!("410 on a continue {MAX_RESTARTS} times over")
                        }
                        PageError::Expired => "list HTTP 410".into(),
                        PageError::Failed(why) => why,
                    };
                    rec.failure(why.clone());
                    out.error = Some(why);
                    break;
                }
            }
        }
        out.seconds = start.elapsed().as_secs_f64();
        out
    }
}

/// One controller: relists every period from its staggered start until `end`.
async fn controller(
    lister: Lister,
    first: Instant,
    period: Duration,
    end: Instant,
    rec: Arc<Recorder>,
    live: Arc<Live>,
) -> Vec<Paged> {
    let mut done = Vec::new();
    let mut next = first;
    while next < end {
        tokio::time::sleep_until(next.into()).await;
        let r = lister.list(&rec, &live.pages).await;
        live.relists.fetch_add(1, Ordering::Relaxed);
        done.push(r);
        next = (next + period).max(Instant::now());
    }
    done
}

/// Counts the phase logs while it runs.
#[derive(Default)]
struct Live {
    relists: AtomicUsize,
    pages: AtomicUsize,
}

/// Counter samples from a `/metrics` text: `name{label="value"}` → the sum of the
/// samples with that label value (over the samples whose `only` label matches).
type Counts = BTreeMap<String, f64>;

/// The counters read around each phase: (metric, label, only these samples).
type Spec = (
    &'static str,
    &'static str,
    Option<(&'static str, &'static str)>,
);

const APISERVER_COUNTERS: &[Spec] = &[(
    "apiserver_request_total",
    "verb",
    Some(("resource", "configmaps")),
)];
const KCACHE_COUNTERS: &[Spec] = &[
    ("kcache_requests_total", "served", Some(("verb", "LIST"))),
    ("kcache_consistent_reads_total", "outcome", None),
    ("kcache_freshness_probes_total", "result", None),
    ("kcache_upstream_lists_total", "", None),
    ("kcache_cache_bypassed_total", "reason", None),
];

async fn counts(ctx: &Ctx, base: &str, specs: &[Spec]) -> Counts {
    let Some(text) = probe::scrape(&ctx.api.http, base, &ctx.args.token).await else {
        return Counts::new();
    };
    let mut out = Counts::new();
    for (name, label, only) in specs {
        for (value, n) in probe::sum_by_label_where(&text, name, label, *only) {
            let key = if label.is_empty() {
                (*name).to_string()
            } else {
                format!("{name}{{{label}=\"{value}\"}}")
            };
            out.insert(key, n);
        }
    }
    out
}

/// `after - before` for every counter in `after` (absent before: 0).
fn delta(before: &Counts, after: &Counts) -> Counts {
    after
        .iter()
        .map(|(k, v)| (k.clone(), v - before.get(k).copied().unwrap_or(0.0)))
        .collect()
}

/// The API server's and the target's counters (summed over a fleet's replicas), one map.
async fn server_counts(ctx: &Ctx, t: &Target) -> Counts {
    let mut c = counts(ctx, &ctx.args.apiserver, APISERVER_COUNTERS).await;
    if !t.is_apiserver() {
        for url in t.urls() {
            for (k, v) in counts(ctx, &url, KCACHE_COUNTERS).await {
                *c.entry(k).or_default() += v;
            }
        }
    }
    c
}

/// CPU seconds so far: target (a fleet's replicas summed), API server, generator, and
/// etcd (0 without its pid).
fn cpu_now(ctx: &Ctx, t: &Target) -> (Cpu, f64) {
    (
        t.cpu(ctx.args.apiserver_pid),
        ctx.args.etcd_pid.map_or(0.0, probe::cpu_seconds),
    )
}

/// What one phase cost: CPU deltas (with etcd's) and the counters' deltas.
struct Cost {
    cpu: Cpu,
    etcd: f64,
    counters: Counts,
    seconds: f64,
}

/// Runs `f`, measuring what it cost the processes under test.
async fn costed<F: std::future::Future>(ctx: &Ctx, t: &Target, f: F) -> (F::Output, Cost) {
    let counters0 = server_counts(ctx, t).await;
    let (cpu0, etcd0) = cpu_now(ctx, t);
    let start = Instant::now();
    let out = f.await;
    let seconds = start.elapsed().as_secs_f64();
    let (cpu1, etcd1) = cpu_now(ctx, t);
    let counters1 = server_counts(ctx, t).await;
    let cost = Cost {
        cpu: cpu1 - cpu0,
        etcd: etcd1 - etcd0,
        counters: delta(&counters0, &counters1),
        seconds,
    };
    (out, cost)
}

/// Runs the controllers against `t` for the phase; every relist they made.
async fn relists(ctx: &Ctx, p: &Params, t: &Target, rec: &Arc<Recorder>) -> Vec<Paged> {
    let pool = ConnPool::per_node(&ctx.model, p.controllers, 1);
    let period = Duration::from_secs(p.period_secs);
    let start = Instant::now();
    let end = start + Duration::from_secs(p.seconds);
    let live = Arc::new(Live::default());
    let tasks: Vec<_> = (0..p.controllers)
        .map(|i| {
            let first = start + period.mul_f64(i as f64 / p.controllers as f64);
            tokio::spawn(controller(
                Lister::new(pool.get(i), ctx, t, p, i),
                first,
                period,
                end,
                rec.clone(),
                live.clone(),
            ))
        })
        .collect();
    let logger = {
        let (live, rec, progress, name) = (live.clone(), rec.clone(), ctx.progress.clone(), t.name);
        tokio::spawn(async move {
            let start = Instant::now();
            loop {
                tokio::time::sleep(LOG_EVERY).await;
                progress.log(&format!(
                    "  {name}: {:.0} s: {} relists, {} pages, {} errors",
                    start.elapsed().as_secs_f64(),
                    live.relists.load(Ordering::Relaxed),
                    live.pages.load(Ordering::Relaxed),
                    rec.counters.errors.load(Ordering::Relaxed),
                ));
            }
        })
    };
    let all = joined(tasks, rec, "controller").await;
    logger.abort();
    all
}

/// Everything `tasks` gave, in their order; a task that failed counted in `rec` as
/// `what`'s failure.
async fn joined<T>(
    tasks: Vec<tokio::task::JoinHandle<Vec<T>>>,
    rec: &Recorder,
    what: &str,
) -> Vec<T> {
    let mut all = Vec::new();
    for task in tasks {
        match task.await {
            Ok(done) => all.extend(done),
            Err(e) => rec.failure(format!("{what} task: {e}")),
        }
    }
    all
}

/// One reader of single names until `end`: a get of `o<i>`, then a list of it by
/// `metadata.name`, both at `resourceVersion=0` (the cache's answer on both servers), `i`
/// striding over the objects from the reader's own start. Each answer must hold that one
/// object; the latencies of those that did.
async fn name_reader(
    (http, url, token): (reqwest::Client, String, String),
    (first, stride, objects): (usize, usize, usize),
    end: Instant,
    rec: Arc<Recorder>,
) -> Vec<Duration> {
    let mut took = Vec::new();
    let mut i = first;
    while Instant::now() < end {
        let name = format!("o{}", i % objects.max(1));
        i += stride;
        let get = format!("{url}/{name}?resourceVersion=0");
        let list = format!("{url}?resourceVersion=0&fieldSelector=metadata.name%3D{name}");
        for (path, is_list) in [(get, false), (list, true)] {
            let start = Instant::now();
            match read_one(&http, &path, &token, is_list).await {
                Ok(names) if names == [name.as_str()] => took.push(start.elapsed()),
                Ok(names) => rec.failure(format!("name read: {} objects", names.len())),
                Err(why) => rec.failure(why),
            }
        }
    }
    took
}

/// The names a get (one object) or a list (its items) answered with.
async fn read_one(
    http: &reqwest::Client,
    path: &str,
    token: &str,
    is_list: bool,
) -> Result<Vec<String>, String> {
    #[derive(Deserialize)]
    struct Meta {
        #[serde(default)]
        name: String,
    }
    #[derive(Deserialize)]
    struct Obj {
        metadata: Meta,
    }
    #[derive(Deserialize)]
    struct List {
        items: Vec<Obj>,
    }
    let resp = http
        .get(path)
        .bearer_auth(token)
        .timeout(REQUEST_TIMEOUT)
        .send()
        .await
        .map_err(|e| format!("name read {}", error_kind(&e)))?;
    if !resp.status().is_success() {
        return Err(format!("name read HTTP {}", resp.status().as_u16()));
    }
    let body = resp
        .bytes()
        .await
        .map_err(|e| format!("name read body {}", error_kind(&e)))?;
    let unparsable = |_| "name read: unparsable".to_string();
    Ok(if is_list {
        let list: List = serde_json::from_slice(&body).map_err(unparsable)?;
        list.items.into_iter().map(|o| o.metadata.name).collect()
    } else {
        let obj: Obj = serde_json::from_slice(&body).map_err(unparsable)?;
        vec![obj.metadata.name]
    })
}

/// `--clients` name readers against `t` for `--name-reads-secs`, each on a connection of
/// its own; the sorted latencies of every read that answered right.
async fn name_reads(
    ctx: &Ctx,
    p: &Params,
    t: &Target,
    objects: usize,
    rec: &Arc<Recorder>,
) -> Vec<Duration> {
    let pool = ConnPool::per_node(&ctx.model, p.controllers, 1);
    let end = Instant::now() + Duration::from_secs(p.name_reads_secs);
    let url = format!("{}{}", t.url, collection());
    let tasks: Vec<_> = (0..p.controllers)
        .map(|i| {
            tokio::spawn(name_reader(
                (pool.get(i), url.clone(), ctx.args.token.clone()),
                (i * objects / p.controllers, 7919, objects),
                end,
                rec.clone(),
            ))
        })
        .collect();
    let mut all = joined(tasks, rec, "name reader").await;
    all.sort_unstable();
    all
}

/// Sorted durations of the relists that finished.
fn durations(lists: &[Paged]) -> Vec<Duration> {
    let mut v: Vec<Duration> = lists
        .iter()
        .filter(|l| l.error.is_none())
        .map(|l| Duration::from_secs_f64(l.seconds))
        .collect();
    v.sort_unstable();
    v
}

/// Measures one target: warm-up, idle, relists, Table list.
async fn measure(ctx: &Ctx, p: &Params, t: &Target, objects: usize) -> TargetReport {
    let kcache = (!t.is_apiserver()).then_some(t.pid);
    let api_pid = ctx.args.apiserver_pid;
    let rec = Arc::new(Recorder::new(1));
    let own = http_client(ctx.model.http1, None);
    let none = AtomicUsize::new(0);

    ctx.progress
        .stage(&format!("{}: warm-up list of {NS}", t.name));
    // Every replica's key synced: one paged list through each.
    let mut warmup = Paged::default();
    for first in 0..t.urls().len() {
        let one = Lister {
            urls: vec![format!("{}{}", t.urls()[first], collection())],
            ..Lister::new(own.clone(), ctx, t, p, 0)
        };
        warmup = one.list(&rec, &none).await;
    }
    ctx.progress.log(&format!(
        "{}: warm-up list: {} items in {} pages, {:.2} s{}",
        t.name,
        warmup.items,
        warmup.pages,
        warmup.seconds,
        warmup
            .error
            .as_deref()
            .map_or(String::new(), |e| format!("; error: {e}")),
    ));
    tokio::time::sleep(SETTLE).await;

    let api_idle = probe::rss_kib(api_pid);
    let kcache_idle = kcache.map(probe::rss_kib);
    ctx.progress.stage(&format!(
        "{}: {} controllers relisting every {} s for {} s",
        t.name, p.controllers, p.period_secs, p.seconds
    ));
    let api_peak = PeakRss::start(api_pid, RSS_SAMPLE);
    let kcache_peak = kcache.map(|pid| PeakRss::start(pid, RSS_SAMPLE));
    let (lists, cost) = costed(ctx, t, relists(ctx, p, t, &rec)).await;
    let api_peak = api_peak.stop(api_pid);
    let kcache_peak = kcache.zip(kcache_peak).map(|(pid, peak)| peak.stop(pid));

    // Reads of single names while the namespace's key still runs (the relists held it).
    let (reads, reads_cost) = if p.name_reads_secs > 0 {
        ctx.progress.stage(&format!(
            "{}: {} readers of single names for {} s",
            t.name, p.controllers, p.name_reads_secs
        ));
        let before = rec.counters.errors.load(Ordering::Relaxed);
        let (reads, cost) = costed(ctx, t, name_reads(ctx, p, t, objects, &rec)).await;
        let errors = rec.counters.errors.load(Ordering::Relaxed) - before;
        (Some((reads, errors)), Some(cost))
    } else {
        (None, None)
    };

    tokio::time::sleep(SETTLE).await;
    ctx.progress
        .stage(&format!("{}: one Table list of {NS}", t.name));
    let table_lister = Lister {
        accept: Some(TABLE_ACCEPT),
        ..Lister::new(http_client(ctx.model.http1, None), ctx, t, p, 0)
    };
    let (table, table_cost) = costed(ctx, t, table_lister.list(&rec, &none)).await;

    let sorted = durations(&lists);
    let latency = Latency::of(&sorted);
    let completed = sorted.len();
    let failed = lists.len() - completed;
    let pages: usize = lists.iter().map(|l| l.pages).sum();
    let restarts: usize = lists.iter().map(|l| l.restarts).sum();
    let wrong = lists
        .iter()
        .filter(|l| l.error.is_none() && l.items != objects)
        .count();
    let api_growth = api_peak as i64 - api_idle as i64;
    let kcache_growth = kcache_idle
        .zip(kcache_peak)
        .map(|(idle, peak)| peak as i64 - idle as i64);
    let api_lists = cost
        .counters
        .get("apiserver_request_total{verb=\"LIST\"}")
        .copied();
    let errors = rec.counters.errors.load(Ordering::Relaxed);
    let per_relist = |cpu: f64| (completed > 0).then(|| cpu * 1000.0 / completed as f64);
    let kcache_cpu = |c: &Cost| kcache.map(|_| c.cpu.target);
    let etcd = |c: &Cost| ctx.args.etcd_pid.map(|_| c.etcd);
    let f = |v: usize| Some(v as f64);
    let figures = vec![
        ("objects", f(objects)),
        ("replicas", f(t.urls().len())),
        ("relists_completed", f(completed)),
        ("relists_failed", f(failed)),
        ("relists_wrong_item_count", f(wrong)),
        ("pages_fetched", f(pages)),
        ("restarts_410", f(restarts)),
        ("errors", f(errors)),
        ("relist_p50_ms", latency.p50_ms),
        ("relist_p99_ms", latency.p99_ms),
        ("relist_max_ms", latency.max_ms),
        ("relist_phase_seconds", Some(cost.seconds)),
        ("apiserver_cpu_seconds", Some(cost.cpu.apiserver)),
        ("etcd_cpu_seconds", etcd(&cost)),
        (
            "apiserver_plus_etcd_cpu_seconds",
            Some(cost.cpu.apiserver + cost.etcd),
        ),
        (
            "apiserver_cpu_ms_per_relist",
            per_relist(cost.cpu.apiserver),
        ),
        ("apiserver_configmap_lists", api_lists),
        ("kcache_cpu_seconds", kcache_cpu(&cost)),
        ("generator_cpu_seconds", Some(cost.cpu.generator)),
        ("apiserver_rss_idle_kib", Some(api_idle as f64)),
        ("apiserver_rss_peak_kib", Some(api_peak as f64)),
        ("apiserver_rss_peak_growth_kib", Some(api_growth as f64)),
        ("kcache_rss_idle_kib", kcache_idle.map(|v| v as f64)),
        ("kcache_rss_peak_kib", kcache_peak.map(|v| v as f64)),
        (
            "kcache_rss_peak_growth_kib",
            kcache_growth.map(|v| v as f64),
        ),
        ("table_list_seconds", Some(table.seconds)),
        ("table_rows", f(table.items)),
        ("table_pages", f(table.pages)),
        (
            "table_apiserver_cpu_seconds",
            Some(table_cost.cpu.apiserver),
        ),
        ("table_etcd_cpu_seconds", etcd(&table_cost)),
        ("table_kcache_cpu_seconds", kcache_cpu(&table_cost)),
        ("warmup_list_seconds", Some(warmup.seconds)),
    ];
    let mut figures = figures;
    if let (Some((reads, errors)), Some(c)) = (&reads, &reads_cost) {
        let n = reads.len();
        let per_read = |cpu: f64| (n > 0).then(|| cpu * 1e6 / n as f64);
        let l = Latency::of(reads);
        figures.extend([
            ("name_reads", f(n)),
            ("name_read_errors", f(*errors)),
            (
                "name_reads_per_second",
                Some(n as f64 / c.seconds.max(1e-9)),
            ),
            ("name_read_p50_ms", l.p50_ms),
            ("name_read_p99_ms", l.p99_ms),
            ("name_read_apiserver_cpu_us", per_read(c.cpu.apiserver)),
            (
                "name_read_kcache_cpu_us",
                kcache.and_then(|_| per_read(c.cpu.target)),
            ),
        ]);
    }
    let mut notes = Vec::new();
    if !t.replicas.is_empty() {
        notes.push(format!(
            "a fleet of {} replicas: each page to the next replica in turn (as behind a Service), their CPU summed; the RSS figures are the first replica's",
            t.urls().len()
        ));
    }
    if wrong > 0 {
        notes.push(format!(
            "{wrong} relists did not return the {objects} objects"
        ));
    }
    if table.error.is_none() && table.items != objects {
        notes.push(format!(
            "the Table list had {} rows, not {objects}",
            table.items
        ));
    }
    ctx.progress.log(&format!(
        "{}: {completed} relists ({failed} failed, {restarts} restarts after 410, {pages} pages) in {:.1} s, p50 {} ms, p99 {} ms; CPU: API server {:.2} s, etcd {:.2} s, target {:.2} s, generator {:.2} s; API server RSS {api_idle} KiB idle, peak +{api_growth} KiB; Table list {:.2} s, API server CPU {:.2} s",
        t.name,
        cost.seconds,
        latency.p50_ms.map_or("-".into(), |v| format!("{v:.1}")),
        latency.p99_ms.map_or("-".into(), |v| format!("{v:.1}")),
        cost.cpu.apiserver,
        cost.etcd,
        cost.cpu.target,
        cost.cpu.generator,
        table.seconds,
        table_cost.cpu.apiserver,
    ));
    let extra = json!({
        "figures": figures.iter().map(|(k, v)| (k.to_string(), json!(v))).collect::<serde_json::Map<String, Value>>(),
        "relist": {
            "latency": latency,
            "cpu": cost.cpu,
            "etcd_cpu_seconds": etcd(&cost),
            "seconds": cost.seconds,
            "counters": cost.counters,
            "per_controller_relists": lists.len() as f64 / p.controllers as f64,
        },
        "table_list": {
            "list": table,
            "cpu": table_cost.cpu,
            "etcd_cpu_seconds": etcd(&table_cost),
            "counters": table_cost.counters,
        },
        "warmup_list": warmup,
        "name_reads": reads_cost.as_ref().map(|c| json!({
            "cpu": c.cpu,
            "seconds": c.seconds,
            "counters": c.counters,
        })),
    });
    TargetReport {
        target: t.name.into(),
        url: t.url.clone(),
        connections: p.controllers,
        rss_before_kib: kcache_idle.unwrap_or(api_idle),
        rss_after_kib: kcache_peak.unwrap_or(api_peak),
        apiserver_rss_before_kib: api_idle,
        apiserver_rss_growth_kib: api_growth,
        cpu_write: cost.cpu,
        errors,
        error_reasons: rec.reasons(),
        notes,
        extra,
        own_figures: Some(figures),
        ..Default::default()
    }
}

pub async fn run(ctx: &Ctx) -> ScenarioRun {
    let p = Params::from_ctx(ctx);
    let created = seed_configmaps(ctx, NS, p.objects, p.payload_bytes).await;
    let objects = created.created + created.existed;
    let mut notes = Vec::new();
    if ctx.args.etcd_pid.is_none() {
        notes.push("no --etcd-pid: etcd's CPU was not measured".to_string());
    }
    if created.failed > 0 {
        notes.push(format!(
            "{} of the {} ConfigMaps could not be created",
            created.failed, p.objects
        ));
    }
    if ctx.targets.len() > 1 {
        notes.push("the targets ran one after the other on the same API server: the later one's API server RSS growth over idle starts from the heap the earlier one grew (run once per target for RSS on fresh processes)".into());
    }
    let mut reports = Vec::new();
    for (i, t) in ctx.targets.iter().enumerate() {
        if i > 0 {
            between_targets(ctx).await;
        }
        reports.push(measure(ctx, &p, t, objects).await);
    }
    ScenarioRun {
        workload: json!({
            "namespace": NS,
            "configmaps": p.objects,
            "configmaps_present": objects,
            "payload_bytes": p.payload_bytes,
            "controllers": p.controllers,
            "relist_seconds": p.seconds,
            "relist_period_seconds": p.period_secs,
            "page_limit": p.limit,
            "relist": format!("GET {}?limit={} (no resourceVersion), then &continue=<metadata.continue> until it is empty; 410 on a continue: start again from the first page (counted); 429/5xx with Retry-After retried", collection(), p.limit),
            "table_list": format!("GET {}?limit={} with Accept: {TABLE_ACCEPT}, following continue", collection(), p.limit),
            "name_reads": format!("for {} s after the relists, {} readers (a connection each): GET {}/o<i>?resourceVersion=0, then GET {}?resourceVersion=0&fieldSelector=metadata.name%3Do<i>; each must answer with o<i> alone", p.name_reads_secs, p.controllers, collection(), collection()),
            "warmup": "one paged list through the target before the idle figures (kcache: the key's first sync)",
            "targets_in_order": ctx.targets.iter().map(|t| t.name).collect::<Vec<_>>(),
        }),
        reports,
        series: Vec::new(),
        notes,
        sections: vec![(
            "connection_model".into(),
            json!({
                "protocol": if ctx.model.http1 { "HTTPS, HTTP/1.1" } else { "HTTPS, HTTP/2 (ALPN h2)" },
                "controllers": "one connection per controller",
                "warmup_and_table_lists": "a connection of their own each",
                "auth": "bearer token (same for both targets), authorization on",
            }),
        )],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_count_items_or_rows_and_read_continue() {
        let list: Page = serde_json::from_slice(
            br#"{"kind":"ConfigMapList","metadata":{"resourceVersion":"9","continue":"abc"},"items":[{"a":1},{"b":{"c":2}}]}"#,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(list.metadata.cont.as_deref(), Some("abc"));
        assert_eq!(list.items.map(|v| v.len()), Some(2));
        let table: Page = serde_json::from_slice(
            br#"{"kind":"Table","metadata":{"continue":""},"columnDefinitions":[],"rows":[{"cells":["x"]}]}"#,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(table.items.or(table.rows).map(|v| v.len()), Some(1));
        assert_eq!(table.metadata.cont.filter(|c| !c.is_empty()), None);
    }

    #[test]
    fn deltas_count_what_appeared_meanwhile() {
        let before = Counts::from([("a".to_string(), 2.0)]);
        let after = Counts::from([("a".to_string(), 5.0), ("b".to_string(), 1.0)]);
        assert_eq!(
            delta(&before, &after),
            Counts::from([("a".to_string(), 3.0), ("b".to_string(), 1.0)])
        );
    }
}
