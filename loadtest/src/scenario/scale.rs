//! Scenario 4, `scale`: `--watches` (50,000) single-object Secret watches over
//! `--objects` (5,000) Secrets on one kcache replica, opened in `--steps` steps with RSS
//! sampled after each, then writes at `--rate`/s. The same against the API server
//! directly, but with at most `--apiserver-max-watches` watches (10,000 by default: it
//! holds ~100 KB and a core's worth of CPU per 10,000 watches on this kind of machine);
//! the output says so whenever it measured fewer watches than kcache.
//!
//! Connections: `--per-connection` watches per HTTP/2 connection (500 connections for
//! 50,000 watches at the default 100), optionally spread over `--source-addrs` loopback source addresses.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::json;

use super::{annotate_round_robin, between_targets, fanout, Ctx, ScenarioRun, Series, Session};
use crate::client::ConnPool;
use crate::probe;
use crate::watch::Ready;

const NS: &str = "bench-scale";

#[derive(Clone, Debug)]
pub struct Params {
    pub watches: usize,
    pub objects: usize,
    pub rate: u64,
    pub seconds: u64,
    pub apiserver_max: usize,
    /// How long the watches sit idle before the writes, for the idle figures.
    pub idle: Duration,
}

impl Params {
    pub fn from_ctx(ctx: &Ctx) -> Params {
        let a = &ctx.args;
        Params {
            watches: a.watches.unwrap_or(50_000).max(1),
            objects: a.objects.unwrap_or(5_000).max(1),
            rate: a.rate.unwrap_or(100).max(1),
            seconds: a.seconds.unwrap_or(20),
            apiserver_max: a.apiserver_max_watches,
            idle: Duration::from_secs(a.idle_secs),
        }
    }
}

/// CPU seconds by thread class from `from` to `to` (`probe::thread_cpu`; a class gone by
/// `to`, such as a finished thread, counts nothing).
fn between<'a>(
    from: &BTreeMap<&'a str, f64>,
    to: &BTreeMap<&'a str, f64>,
) -> BTreeMap<&'a str, f64> {
    to.iter()
        .map(|(k, v)| (*k, (v - from.get(k).copied().unwrap_or(0.0)).max(0.0)))
        .collect()
}

fn object_path(i: usize) -> String {
    format!("/api/v1/namespaces/{NS}/secrets/x{i}")
}

pub async fn run(ctx: &Ctx) -> ScenarioRun {
    let p = Params::from_ctx(ctx);
    ctx.progress
        .stage(&format!("creating {} Secrets", p.objects));
    if let Err(e) = ctx.api.ensure_namespace(NS).await {
        ctx.progress.log(&format!("namespace {NS}: {e}"));
    }
    let items = (0..p.objects)
        .map(|i| {
            (
                format!("/api/v1/namespaces/{NS}/secrets"),
                json!({"metadata": {"name": format!("x{i}")}, "data": {"v": "MA=="}}),
            )
        })
        .collect();
    let n = ctx.api.create_all(items).await;
    ctx.progress.log(&format!(
        "setup: {} Secrets created, {} existed, {} failed",
        n.created, n.existed, n.failed
    ));
    let objects: Vec<String> = (0..p.objects).map(object_path).collect();
    let total_writes = (p.rate * p.seconds) as usize;
    let mut reports = Vec::new();
    let mut series = Vec::new();
    let mut notes = Vec::new();
    for (i, t) in ctx.targets.iter().enumerate() {
        if i > 0 {
            between_targets(ctx).await;
        }
        let w = if t.is_apiserver() {
            p.watches.min(p.apiserver_max)
        } else {
            p.watches
        };
        if w < p.watches {
            let note = format!(
                "{}: measured with {w} watches, not {} (--apiserver-max-watches {}); its per-watch figures are at that scale",
                t.name, p.watches, p.apiserver_max
            );
            ctx.progress.log(&note);
            notes.push(note);
        }
        let watches: Vec<(String, Ready)> = (0..w)
            .map(|j| {
                (
                    format!("/api/v1/namespaces/{NS}/secrets?watch=1&resourceVersion=0&fieldSelector=metadata.name%3Dx{}", j % p.objects),
                    Ready::FirstEvent,
                )
            })
            .collect();
        let receives: Vec<String> = (0..w).map(|j| object_path(j % p.objects)).collect();
        let watchers = fanout(receives.iter().map(String::as_str));
        let mut s = Session::start(ctx, "scale", t, 1, w).await;
        let pool = ConnPool::new(&ctx.model, w);
        // kcache's CPU by thread (issue 31.5: the registry's share at this size), while
        // the watches open, while they sit idle, and during the writes. The main thread is
        // the registry's alone only when the keys have arbiters of their own
        // (`KCACHE_BENCH_CACHE_TOML="arbiters = 2"`; `probe::thread_class`).
        let threads = (!t.is_apiserver()).then_some(t.pid);
        let cpu_before_open = threads.map(probe::thread_cpu);
        s.open(&pool, watches).await;
        s.opened().await;
        let cpu_opened = threads.map(probe::thread_cpu);
        // Write calls too: what an idle watch costs is mostly its keepalive's write.
        let writes_opened = threads.and_then(probe::write_calls);
        if threads.is_some() {
            ctx.progress
                .stage(&format!("idle for {} s", p.idle.as_secs()));
            tokio::time::sleep(p.idle).await;
        }
        let idle_for = p.idle.as_secs_f64().max(f64::MIN_POSITIVE);
        let cpu_idle = threads.map(probe::thread_cpu);
        let idle_writes = threads
            .and_then(probe::write_calls)
            .zip(writes_opened)
            .map(|(to, from)| to.saturating_sub(from) as f64 / idle_for);
        let written = s
            .write(
                annotate_round_robin(&objects, &watchers, total_writes),
                p.rate,
                0,
            )
            .await;
        s.drain(0, written.expected).await;
        let cpu_written = threads.map(probe::thread_cpu);
        let (mut report, sorted) = s.finish(0, &written).await;
        if let (Some(a), Some(b), Some(c), Some(d)) =
            (cpu_before_open, cpu_opened, cpu_idle, cpu_written)
        {
            let per_second = |m: BTreeMap<&'static str, f64>| -> BTreeMap<&'static str, f64> {
                m.into_iter().map(|(k, v)| (k, v / idle_for)).collect()
            };
            let threads = json!({
                "cpu_seconds_by_thread_open": between(&a, &b),
                "idle_seconds": idle_for,
                "idle_cpu_per_second_by_thread": per_second(between(&b, &c)),
                "idle_write_calls_per_second": idle_writes,
                "cpu_seconds_by_thread_write": between(&c, &d),
            });
            ctx.progress
                .log(&format!("{}: CPU by thread {threads}", t.name));
            match report.extra.as_object_mut() {
                Some(extra) => extra.extend(threads.as_object().cloned().unwrap_or_default()),
                None => report.extra = threads,
            }
        }
        if w < p.watches {
            report
                .notes
                .push(format!("capped at {w} of {} watches", p.watches));
        }
        series.push(Series {
            label: format!("{} ({w} watches)", t.name),
            sorted,
        });
        reports.push(report);
    }
    ScenarioRun {
        workload: json!({
            "watches": p.watches,
            "apiserver_max_watches": p.apiserver_max,
            "secrets": p.objects,
            "watches_per_secret": p.watches as f64 / p.objects as f64,
            "writes_per_second": p.rate,
            "seconds": p.seconds,
            "writes": total_writes,
        }),
        reports,
        series,
        notes,
        sections: Vec::new(),
    }
}
