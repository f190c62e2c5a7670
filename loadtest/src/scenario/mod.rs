//! The scenarios, and the measuring steps they share.
//!
//! Each scenario module (`kubelet`, `informer`, `slow`, `scale`, `kubeproxy`) has a `run`
//! that creates its objects once, through the API server, then measures every target in
//! turn with a [`Session`]: open the watches in steps (RSS sampled after each), write at a
//! fixed rate to the API server, wait for the deliveries, and read CPU and the servers'
//! watch counters. Targets never overlap: the watches of one are closed before the next
//! starts. `objects` measures no watch workload (RSS per cached object and whole-namespace
//! lists) and does without a [`Session`]; neither does `restart`, whose clients reconnect
//! and relist as client-go's reflector does and whose API server changes pid mid-run, nor
//! `relist`, whose clients only list (paged, consistent, as controllers' relists).

pub mod coalesce;
pub mod flood;
pub mod informer;
pub mod kubelet;
pub mod kubeproxy;
pub mod objects;
pub mod relist;
pub mod restart;
pub mod scale;
pub mod slow;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tokio::task::JoinHandle;

use crate::cli::{Args, Replica, TargetKind};
use crate::client::{Api, ConnModel, ConnPool, Created};
use crate::probe::{self, Cpu};
use crate::progress::{Progress, Tracking};
use crate::record::{delete_key, next_seq_key, Counters, Recorder, SEQ_ANNOTATION};
use crate::report::{Latency, RssStep, ServerWatches, TargetReport};
use crate::watch::{self, Ready, WatchReq};
use crate::workers::{self, Workers};

/// What every scenario gets.
pub struct Ctx {
    pub args: Args,
    pub model: ConnModel,
    /// Setup and writes: always the API server.
    pub api: Api,
    pub progress: Progress,
    pub targets: Vec<Target>,
}

/// One server under test.
#[derive(Clone, Debug)]
pub struct Target {
    pub kind: TargetKind,
    pub name: &'static str,
    pub url: String,
    pub pid: u32,
    /// The fleet's other replicas (`--kcache-replica`): only the relist scenario uses
    /// them.
    pub replicas: Vec<Replica>,
}

impl Target {
    pub fn is_apiserver(&self) -> bool {
        self.kind == TargetKind::Apiserver
    }

    /// The target's URL, then its replicas'.
    pub fn urls(&self) -> Vec<String> {
        std::iter::once(self.url.clone())
            .chain(self.replicas.iter().map(|r| r.url.clone()))
            .collect()
    }

    /// The target's process, then its replicas'.
    pub fn pids(&self) -> Vec<u32> {
        std::iter::once(self.pid)
            .chain(self.replicas.iter().map(|r| r.pid))
            .collect()
    }

    /// The RSS of the target, a fleet's replicas summed.
    pub fn rss_kib(&self) -> u64 {
        self.pids().into_iter().map(probe::rss_kib).sum()
    }

    /// CPU seconds so far of the target (a fleet's replicas summed), the API server and
    /// this generator.
    pub fn cpu(&self, apiserver_pid: u32) -> Cpu {
        let mut cpu = Cpu::now(self.pid, apiserver_pid);
        cpu.target += self
            .replicas
            .iter()
            .map(|r| probe::cpu_seconds(r.pid))
            .sum::<f64>();
        cpu
    }

    /// A metric's value summed over the target's replicas (`None` if none answered).
    pub async fn metric(&self, http: &reqwest::Client, token: &str, name: &str) -> Option<f64> {
        let mut sum = None;
        for url in self.urls() {
            if let Some(v) = probe::metric(http, &url, token, name).await {
                *sum.get_or_insert(0.0) += v;
            }
        }
        sum
    }
}

/// One latency series for the CDF plot.
pub struct Series {
    pub label: String,
    pub sorted: Vec<Duration>,
}

/// What a scenario hands back: the workload description, one report per target, the
/// latency series to plot, and notes for the reader.
pub struct ScenarioRun {
    pub workload: Value,
    pub reports: Vec<TargetReport>,
    pub series: Vec<Series>,
    pub notes: Vec<String>,
    /// Extra top-level JSON sections (e.g. `per_cached_object`).
    pub sections: Vec<(String, Value)>,
}

/// A write and the number of client watches that should deliver it.
pub struct WriteOp {
    pub op: Op,
    pub fanout: usize,
}

pub enum Op {
    /// Merge-patch the object at `path` with a fresh `bench-seq` annotation.
    Annotate { path: String },
    /// POST `body` (its metadata gets the `bench-seq` annotation) to `collection`.
    Create { collection: String, body: Value },
    /// DELETE `path` (the object `namespace/name`).
    Delete {
        path: String,
        namespace: String,
        name: String,
    },
}

/// Outcome of a write phase.
#[derive(Debug, Default)]
pub struct Written {
    pub writes: usize,
    pub failed: usize,
    /// Sum of the fan-out of the writes that succeeded.
    pub expected: usize,
    pub seconds: f64,
}

/// The KiB → bytes-per-item figure.
pub fn per_item_bytes(growth_kib: i64, items: usize) -> f64 {
    growth_kib as f64 * 1024.0 / items.max(1) as f64
}

/// A data string of `n` bytes.
pub fn payload(n: usize) -> String {
    "x".repeat(n)
}

/// splitmix64: a fixed pseudo-random sequence (`splitmix64(seed + i)`) without a
/// dependency, so both targets get the same "random" objects and writes.
pub fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Counts the watches per object path of a plan (`object` → number of watches).
pub fn fanout<'a>(objects: impl IntoIterator<Item = &'a str>) -> HashMap<String, usize> {
    let mut m = HashMap::new();
    for o in objects {
        *m.entry(o.to_string()).or_insert(0) += 1;
    }
    m
}

/// Values read before a target's watches are opened.
struct Before {
    rss: u64,
    apiserver_rss: u64,
    cpu: Cpu,
    registered: Option<f64>,
    terminated: Option<f64>,
}

/// The metric a target counts the watches it closed as unresponsive in.
fn terminated_metric(t: &Target) -> &'static str {
    if t.is_apiserver() {
        "apiserver_terminated_watchers_total"
    } else {
        "kcache_terminated_watchers_total"
    }
}

/// Measures one target: opened with [`Session::start`], finished with [`Session::finish`].
pub struct Session<'a> {
    pub ctx: &'a Ctx,
    pub target: Target,
    pub rec: Arc<Recorder>,
    before: Before,
    handles: Vec<JoinHandle<()>>,
    pub steps: Vec<RssStep>,
    client_watches: usize,
    connections: usize,
    rss_after: u64,
    apiserver_rss_after: u64,
    /// (RSS, watches requested) when every key had its first watch; see
    /// [`Session::keys_warm`].
    warm: Option<(u64, usize)>,
    cpu_open: Cpu,
    /// Time spent waiting for watches to be established, over every open step (without
    /// the settling pauses before the RSS samples).
    open_wait: Duration,
    /// Steps [`Session::open_at`] opens a batch in (`--steps` unless a scenario sets it).
    open_steps: usize,
    write_start: Option<Cpu>,
    server_watches: ServerWatches,
    /// Child processes holding the watches of a pool too large for this process's
    /// open-file limit (or `--watch-workers`); started by the first such pool.
    workers: Option<Workers>,
    _tracking: Tracking,
}

impl<'a> Session<'a> {
    /// Reads the baseline (RSS, CPU, watch counters) and starts the live display.
    /// `phases`: latency phases the scenario records; `watches`: for the display.
    pub async fn start(
        ctx: &'a Ctx,
        scenario: &str,
        target: &Target,
        phases: usize,
        watches: usize,
    ) -> Session<'a> {
        let rec = Arc::new(Recorder::new(phases));
        let tracking =
            ctx.progress
                .track(format!("{scenario}/{}", target.name), rec.clone(), watches);
        let http = &ctx.api.http;
        let before = Before {
            rss: target.rss_kib(),
            apiserver_rss: probe::rss_kib(ctx.args.apiserver_pid),
            cpu: target.cpu(ctx.args.apiserver_pid),
            registered: probe::apiserver_watches_at(http, &ctx.args.apiserver, &ctx.args.token)
                .await,
            terminated: target
                .metric(http, &ctx.args.token, terminated_metric(target))
                .await,
        };
        Session {
            ctx,
            target: target.clone(),
            rec,
            cpu_open: Cpu::default(),
            open_wait: Duration::ZERO,
            open_steps: ctx.args.steps,
            rss_after: before.rss,
            apiserver_rss_after: before.apiserver_rss,
            warm: None,
            before,
            handles: Vec::new(),
            steps: Vec::new(),
            client_watches: 0,
            connections: 0,
            write_start: None,
            server_watches: ServerWatches::default(),
            workers: None,
            _tracking: tracking,
        }
    }

    fn url(&self, path_and_query: &str) -> String {
        format!("{}{path_and_query}", self.target.url)
    }

    /// Waits until `done()` or the deadline; false on timeout.
    async fn wait_until(deadline: Instant, mut done: impl FnMut() -> bool) -> bool {
        loop {
            if done() {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Takes the RSS baseline again (e.g. after lists that filled a cache), so the
    /// per-watch growth counts only what the watches add.
    pub fn rebase_rss(&mut self) {
        self.before.rss = self.target.rss_kib();
        self.before.apiserver_rss = probe::rss_kib(self.ctx.args.apiserver_pid);
    }

    /// Opens `watches` (`path?query`, readiness) on `pool`'s connections in
    /// `--steps` steps, sampling RSS after each step has been established.
    pub async fn open(&mut self, pool: &ConnPool, watches: Vec<(String, Ready)>) {
        self.open_at(pool, watches, 0).await
    }

    /// Records the RSS once every key has its first watch: the watches opened after
    /// this give the marginal per-watch figure.
    pub async fn keys_warm(&mut self) {
        tokio::time::sleep(Duration::from_millis(self.ctx.args.settle_ms)).await;
        self.warm = Some((self.target.rss_kib(), self.client_watches));
    }

    /// As [`Session::open`], for a later batch on the same pool: `offset` is the number
    /// of watches the pool already carries, so connections fill in order.
    pub async fn open_at(&mut self, pool: &ConnPool, watches: Vec<(String, Ready)>, offset: usize) {
        let ctx = self.ctx;
        let total = watches.len();
        self.client_watches += total;
        self.connections += pool.connections();
        ctx.progress.stage(&format!(
            "opening {total} watches over {} connections",
            pool.connections()
        ));
        let steps = self.open_steps.clamp(1, total.max(1));
        let timeout = ctx
            .args
            .open_timeout_secs
            .unwrap_or(ctx.args.scenario.open_timeout_secs());
        let deadline = Instant::now() + Duration::from_secs(timeout);
        self.start_workers(pool);
        let c = &self.rec.counters;
        let base = Counters::get(&c.ready) + Counters::get(&c.failed);
        let mut watches = watches.into_iter().enumerate();
        let mut warned = false;
        for step in 0..steps {
            let end = total * (step + 1) / steps;
            for (i, (pq, ready)) in watches.by_ref().take(end - total * step / steps) {
                // A pool routed over a fleet's replicas sends each connection to its own.
                let url = match pool.base(offset + i) {
                    Some(base) => format!("{base}{pq}"),
                    None => self.url(&pq),
                };
                let token = pool.token(offset + i);
                if let Some(w) = &self.workers {
                    let conn = pool.connection(offset + i);
                    w.open(&self.rec, pool.id(), conn, url, token, ready);
                    continue;
                }
                let req = WatchReq {
                    client: pool.get(offset + i),
                    url,
                    token: token.unwrap_or_else(|| ctx.args.token.clone()),
                };
                self.handles
                    .push(watch::spawn(req, ready, self.rec.clone()));
            }
            let goal = base + end;
            // Past the deadline, still give each step some time: opening every remaining
            // watch at once would be a storm of handshakes no client makes.
            let until = if warned {
                Instant::now() + Duration::from_secs(30)
            } else {
                deadline
            };
            let waited = Instant::now();
            let all = Self::wait_until(until, || {
                Counters::get(&c.ready) + Counters::get(&c.failed) >= goal
            })
            .await;
            self.open_wait += waited.elapsed();
            tokio::time::sleep(Duration::from_millis(ctx.args.settle_ms)).await;
            self.steps.push(RssStep {
                watches: Counters::get(&c.ready),
                target_rss_kib: self.target.rss_kib(),
                apiserver_rss_kib: probe::rss_kib(ctx.args.apiserver_pid),
            });
            if !all && !warned {
                warned = true;
                ctx.progress.log(&format!(
                    "{}: only {} of {goal} watches established (or failed) after {timeout} s; going on",
                    self.target.name,
                    Counters::get(&c.ready) + Counters::get(&c.failed),
                ));
                // The remaining steps wait at most 30 s each.
            }
        }
    }

    /// Starts watch workers for a one-connection-per-node `pool` with more connections
    /// than this process may open, or as `--watch-workers` says; keeps the watches here
    /// if they cannot start (the run then stops at the open-file limit, as before).
    fn start_workers(&mut self, pool: &ConnPool) {
        if self.workers.is_some() || !pool.is_per_node() {
            return;
        }
        let per_process = workers::per_process();
        let n = match self.ctx.args.watch_workers {
            0 if pool.connections() <= per_process => return,
            0 => pool.connections().div_ceil(per_process),
            n => n,
        };
        match Workers::spawn(n, &self.ctx.args.token, self.rec.clone()) {
            Ok(w) => {
                self.ctx.progress.log(&format!(
                    "{} connections held by {n} watch worker processes (at most {per_process} per process)",
                    pool.connections()
                ));
                self.workers = Some(w);
            }
            Err(e) => self
                .ctx
                .progress
                .log(&format!("{e}; holding the watches here")),
        }
    }

    /// Open the next batches in `steps` steps instead of `--steps`.
    pub fn set_open_steps(&mut self, steps: usize) {
        self.open_steps = steps;
    }

    /// Seconds spent waiting for the watches to be established so far: from each step's
    /// requests to the last of them established (or failed), summed over the steps.
    pub fn open_seconds(&self) -> f64 {
        self.open_wait.as_secs_f64()
    }

    /// Records RSS, CPU and the servers' watch counters with every watch open; call once
    /// after the last [`Session::open`] whose watches count as "the watches".
    pub async fn opened(&mut self) {
        let ctx = self.ctx;
        self.rss_after = self.target.rss_kib();
        self.apiserver_rss_after = probe::rss_kib(ctx.args.apiserver_pid);
        self.cpu_open = self.target.cpu(ctx.args.apiserver_pid) - self.before.cpu;
        let http = &ctx.api.http;
        let token = &ctx.args.token;
        let registered = probe::apiserver_watches_at(http, &ctx.args.apiserver, token).await;
        self.server_watches.apiserver_watches_added =
            registered.zip(self.before.registered).map(|(a, b)| a - b);
        if !self.target.is_apiserver() {
            // A fleet's replicas summed: each watch is registered on one replica, and each
            // upstream watch is its key's owner's.
            let t = &self.target;
            self.server_watches.kcache_registered_watchers =
                t.metric(http, token, "kcache_registered_watchers").await;
            self.server_watches.kcache_upstream_watches =
                t.metric(http, token, "kcache_upstream_watches").await;
        }
        let c = &self.rec.counters;
        ctx.progress.log(&format!(
            "{}: {} of {} watches established; RSS {} -> {} KiB (API server {} -> {} KiB); API server watchers +{}",
            self.target.name,
            Counters::get(&c.ready),
            self.client_watches,
            self.before.rss,
            self.rss_after,
            self.before.apiserver_rss,
            self.apiserver_rss_after,
            self.server_watches
                .apiserver_watches_added
                .map_or("?".into(), |v| v.to_string()),
        ));
    }

    /// Starts the write-phase CPU account again at the next [`Session::write`] (for a
    /// scenario whose last phase is the one reported).
    pub fn restart_cpu(&mut self) {
        self.write_start = None;
    }

    /// Sends `ops` to the API server at `rate` per second, recording latency into `phase`.
    pub async fn write(&mut self, ops: Vec<WriteOp>, rate: u64, phase: usize) -> Written {
        let ctx = self.ctx;
        if self.write_start.is_none() {
            self.write_start = Some(self.target.cpu(ctx.args.apiserver_pid));
        }
        ctx.progress.stage(&format!(
            "writing {} objects at {rate}/s (phase {phase})",
            ops.len()
        ));
        let interval = Duration::from_secs_f64(1.0 / rate.max(1) as f64);
        let start = Instant::now();
        let mut tasks = Vec::with_capacity(ops.len());
        for (i, w) in ops.into_iter().enumerate() {
            tokio::time::sleep_until((start + interval.mul_f64(i as f64)).into()).await;
            let (api, rec) = (ctx.api.clone(), self.rec.clone());
            tasks.push(tokio::spawn(async move {
                Counters::inc(&rec.counters.writes);
                let result = match w.op {
                    Op::Annotate { path } => {
                        let key = next_seq_key();
                        let patch = json!({"metadata": {"annotations": {SEQ_ANNOTATION: &key}}});
                        rec.mark_sent(key, phase);
                        api.merge_patch(&path, &patch).await
                    }
                    Op::Create {
                        collection,
                        mut body,
                    } => {
                        let key = next_seq_key();
                        body["metadata"]["annotations"] = json!({SEQ_ANNOTATION: &key});
                        rec.mark_sent(key, phase);
                        api.create(&collection, &body).await
                    }
                    Op::Delete {
                        path,
                        namespace,
                        name,
                    } => {
                        rec.mark_sent(delete_key(&namespace, &name), phase);
                        api.delete(&path).await
                    }
                };
                match result {
                    Ok(()) => Some(w.fanout),
                    Err(e) => {
                        rec.failure(format!("write {e}"));
                        None
                    }
                }
            }));
        }
        let mut out = Written::default();
        for t in tasks {
            out.writes += 1;
            match t.await {
                Ok(Some(f)) => out.expected += f,
                _ => out.failed += 1,
            }
        }
        out.seconds = start.elapsed().as_secs_f64();
        out
    }

    /// Waits for `expected` deliveries in `phase`, at most `--drain-secs`, and stops
    /// early once nothing arrived for 5 s.
    pub async fn drain(&self, phase: usize, expected: usize) {
        self.ctx.progress.stage("waiting for the last deliveries");
        let deadline = Instant::now() + Duration::from_secs(self.ctx.args.drain_secs);
        let mut last = (self.rec.count(phase), Instant::now());
        while self.rec.count(phase) < expected && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(100)).await;
            let n = self.rec.count(phase);
            if n != last.0 {
                last = (n, Instant::now());
            } else if last.1.elapsed() > Duration::from_secs(5) {
                break;
            }
        }
    }

    /// Closes the watches and fills the report; latency and throughput come from
    /// `phase`, whose writes are `written`.
    pub async fn finish(
        mut self,
        phase: usize,
        written: &Written,
    ) -> (TargetReport, Vec<Duration>) {
        let ctx = self.ctx;
        let cpu_end = self.target.cpu(ctx.args.apiserver_pid);
        let cpu_write = cpu_end - self.write_start.unwrap_or(cpu_end);
        let terminated = self
            .target
            .metric(
                &ctx.api.http,
                &ctx.args.token,
                terminated_metric(&self.target),
            )
            .await;
        self.server_watches.terminated_watchers =
            terminated.zip(self.before.terminated).map(|(a, b)| a - b);
        for h in self.handles.drain(..) {
            h.abort();
        }
        if let Some(w) = self.workers.take() {
            w.stop().await;
        }
        let sorted = self.rec.sorted(phase);
        let c = &self.rec.counters;
        let growth = self.rss_after as i64 - self.before.rss as i64;
        let api_growth = self.apiserver_rss_after as i64 - self.before.apiserver_rss as i64;
        let incl = if self.target.is_apiserver() {
            growth
        } else {
            growth + api_growth
        };
        let deliveries = sorted.len();
        let per_cpu = |cpu: f64| (cpu > 0.0).then(|| deliveries as f64 / cpu);
        let report = TargetReport {
            target: self.target.name.into(),
            url: self.target.url.clone(),
            client_watches: self.client_watches,
            watches_established: Counters::get(&c.ready),
            connections: self.connections,
            rss_before_kib: self.before.rss,
            rss_after_kib: self.rss_after,
            rss_growth_per_watch_bytes: per_item_bytes(growth, self.client_watches),
            apiserver_rss_before_kib: self.before.apiserver_rss,
            apiserver_rss_growth_kib: api_growth,
            rss_growth_per_watch_incl_upstream_bytes: per_item_bytes(incl, self.client_watches),
            rss_marginal_per_watch_bytes: self.warm.filter(|&(_, n)| self.client_watches > n).map(
                |(rss, n)| {
                    per_item_bytes(self.rss_after as i64 - rss as i64, self.client_watches - n)
                },
            ),
            rss_steps: self.steps.clone(),
            writes: written.writes,
            write_errors: written.failed,
            expected_deliveries: written.expected,
            deliveries,
            latency: Latency::of(&sorted),
            write_phase_seconds: written.seconds,
            deliveries_per_second: deliveries as f64 / written.seconds.max(1e-9),
            deliveries_per_target_cpu_second: per_cpu(cpu_write.target),
            deliveries_per_cpu_second_incl_apiserver: per_cpu(if self.target.is_apiserver() {
                cpu_write.target
            } else {
                cpu_write.target + cpu_write.apiserver
            }),
            cpu_open: self.cpu_open,
            cpu_write,
            server_watches: self.server_watches.clone(),
            errors: Counters::get(&c.errors),
            watch_streams_ended: Counters::get(&c.ended),
            error_reasons: self.rec.reasons(),
            ..Default::default()
        };
        ctx.progress.log(&format!(
            "{}: {deliveries}/{} deliveries, p50 {} ms, p99 {} ms, max {} ms; CPU {:.2} s (API server {:.2} s, generator {:.2} s); {} errors",
            self.target.name,
            written.expected,
            fmt_ms(report.latency.p50_ms),
            fmt_ms(report.latency.p99_ms),
            fmt_ms(report.latency.max_ms),
            cpu_write.target,
            cpu_write.apiserver,
            cpu_write.generator,
            report.errors,
        ));
        (report, sorted)
    }
}

fn fmt_ms(v: Option<f64>) -> String {
    v.map_or("-".into(), |v| format!("{v:.2}"))
}

/// Pause between targets, so the API server lets go of what the previous one held.
pub async fn between_targets(ctx: &Ctx) {
    ctx.progress.stage("pause between targets");
    tokio::time::sleep(Duration::from_secs(5)).await;
}

/// Round-robin writes over `objects` (API paths), `total` of them, each with the number
/// of watches of its object as fan-out.
pub fn annotate_round_robin(
    objects: &[String],
    watchers: &HashMap<String, usize>,
    total: usize,
) -> Vec<WriteOp> {
    if objects.is_empty() {
        return Vec::new();
    }
    (0..total)
        .map(|i| {
            let path = objects[i % objects.len()].clone();
            let fanout = watchers.get(&path).copied().unwrap_or(0);
            WriteOp {
                op: Op::Annotate { path },
                fanout,
            }
        })
        .collect()
}

/// ConfigMaps `o0`.. of `payload_bytes` in `ns` (the namespace made first) and `normal`
/// single-object watches spread over them round-robin: the measured clients of `slow` and
/// `flood`.
pub struct NameWatches {
    /// Each watch's path and when it counts as open.
    pub watches: Vec<(String, Ready)>,
    /// Watches per object path (`fanout`), for the writes' expected deliveries.
    pub watchers: HashMap<String, usize>,
    /// Every object's path.
    pub objects: Vec<String>,
}

/// Creates `ns` and in it ConfigMaps `o0`.. with `payload_bytes` of data each, through
/// the API server; what was created.
pub async fn seed_configmaps(ctx: &Ctx, ns: &str, objects: usize, payload_bytes: usize) -> Created {
    ctx.progress
        .stage(&format!("creating {objects} ConfigMaps in {ns}"));
    if let Err(e) = ctx.api.ensure_namespace(ns).await {
        ctx.progress.log(&format!("namespace {ns}: {e}"));
    }
    let data = payload(payload_bytes);
    let items = (0..objects)
        .map(|i| {
            (
                format!("/api/v1/namespaces/{ns}/configmaps"),
                json!({"metadata": {"name": format!("o{i}")}, "data": {"v": data}}),
            )
        })
        .collect();
    let n = ctx.api.create_all(items).await;
    ctx.progress.log(&format!(
        "setup: {} ConfigMaps created, {} existed, {} failed",
        n.created, n.existed, n.failed
    ));
    n
}

pub async fn name_watches(
    ctx: &Ctx,
    ns: &str,
    objects: usize,
    payload_bytes: usize,
    normal: usize,
) -> NameWatches {
    seed_configmaps(ctx, ns, objects, payload_bytes).await;
    let path = |i: usize| format!("/api/v1/namespaces/{ns}/configmaps/o{i}");
    let watches = (0..normal)
        .map(|i| {
            (
                format!("/api/v1/namespaces/{ns}/configmaps?watch=1&resourceVersion=0&fieldSelector=metadata.name%3Do{}", i % objects),
                Ready::FirstEvent,
            )
        })
        .collect();
    let receives: Vec<String> = (0..normal).map(|i| path(i % objects)).collect();
    NameWatches {
        watches,
        watchers: fanout(receives.iter().map(String::as_str)),
        objects: (0..objects).map(path).collect(),
    }
}

/// Runs the selected scenario.
pub async fn run(ctx: &Ctx) -> ScenarioRun {
    match ctx.args.scenario {
        crate::cli::ScenarioKind::Kubelet => kubelet::run(ctx).await,
        crate::cli::ScenarioKind::Informer => informer::run(ctx).await,
        crate::cli::ScenarioKind::Slow => slow::run(ctx).await,
        crate::cli::ScenarioKind::Flood => flood::run(ctx).await,
        crate::cli::ScenarioKind::Scale => scale::run(ctx).await,
        crate::cli::ScenarioKind::Objects => objects::run(ctx).await,
        crate::cli::ScenarioKind::Kubeproxy => kubeproxy::run(ctx).await,
        crate::cli::ScenarioKind::Restart => restart::run(ctx).await,
        crate::cli::ScenarioKind::Coalesce => coalesce::run(ctx).await,
        crate::cli::ScenarioKind::Relist => relist::run(ctx).await,
    }
}
