//! Scenario 3, `slow`: slow consumers mixed with normal clients.
//!
//! `--watches` in total; `--slow-fraction` of them are slow consumers: namespace-wide
//! ConfigMap watches that are opened and never read, each on its own connection (a slow
//! client is a separate process; sharing a connection with a normal client would stall
//! that client through HTTP/2 connection flow control, which no server can prevent). The
//! rest are normal single-object watches over `--objects` ConfigMaps of
//! `--payload-bytes` each, which measure latency.
//!
//! Two write phases of `--seconds` at `--rate`/s: normal clients alone, then with the slow
//! consumers open. A slow watch receives every write of the namespace, so its stream
//! stalls after the HTTP/2 stream window (hyper's 2 MiB) and the server's own buffer; a
//! server that isolates its clients closes it (kcache: `kcache_terminated_watchers_total`,
//! the API server: `apiserver_terminated_watchers_total`) and keeps delivering to the
//! others on time. The report compares the two phases and counts the closed slow watches,
//! by the server's counter and by reading the held streams at the end.

use std::time::Duration;

use serde_json::{json, Value};

use super::{
    annotate_round_robin, between_targets, name_watches, Ctx, NameWatches, ScenarioRun, Series,
    Session,
};
use crate::client::{ConnModel, ConnPool};
use crate::probe;
use crate::report::Latency;
use crate::watch::{self, WatchReq};

const NS: &str = "bench-slow";

#[derive(Clone, Debug)]
pub struct Params {
    pub normal: usize,
    pub slow: usize,
    pub objects: usize,
    pub payload_bytes: usize,
    pub rate: u64,
    pub seconds: u64,
}

impl Params {
    pub fn from_ctx(ctx: &Ctx) -> Params {
        let a = &ctx.args;
        let total = a.watches.unwrap_or(1000).max(1);
        let slow = ((total as f64 * a.slow_fraction.clamp(0.0, 1.0)).round() as usize).min(total);
        Params {
            normal: total - slow,
            slow,
            objects: a.objects.unwrap_or(100).max(1),
            payload_bytes: a.payload_bytes.unwrap_or(4096),
            rate: a.rate.unwrap_or(100).max(1),
            seconds: a.seconds.unwrap_or(15),
        }
    }
}

/// A phase's figures for the normal clients.
fn phase_summary(sorted: &[Duration], expected: usize) -> Value {
    json!({
        "expected_deliveries": expected,
        "deliveries": sorted.len(),
        "delivery_ratio": sorted.len() as f64 / expected.max(1) as f64,
        "latency": Latency::of(sorted),
    })
}

/// Normal clients count as unaffected when they got (nearly) as large a share of their
/// deliveries as without slow consumers, and their p99 rose by at most 5 ms or 50 %.
const VERDICT_RULE: &str = "unaffected = delivery ratio with slow consumers >= 99.9 % of the ratio without, and p99 with <= max(p99 without + 5 ms, 1.5 x p99 without)";

pub(super) fn unaffected(
    base: &[Duration],
    base_exp: usize,
    with: &[Duration],
    with_exp: usize,
) -> bool {
    let ratio = |s: &[Duration], e: usize| s.len() as f64 / e.max(1) as f64;
    let p99 = |s: &[Duration]| Latency::of(s).p99_ms.unwrap_or(f64::INFINITY);
    let (b, w) = (p99(base), p99(with));
    ratio(with, with_exp) >= 0.999 * ratio(base, base_exp) && w <= (b + 5.0).max(1.5 * b)
}

pub async fn run(ctx: &Ctx) -> ScenarioRun {
    let p = Params::from_ctx(ctx);
    let NameWatches {
        watches: normal,
        watchers,
        objects,
    } = name_watches(ctx, NS, p.objects, p.payload_bytes, p.normal).await;
    let total_writes = (p.rate * p.seconds) as usize;
    let slow_model = ConnModel {
        per_connection: 1,
        ..ctx.model.clone()
    };

    let mut reports = Vec::new();
    let mut series = Vec::new();
    let mut notes = Vec::new();
    for (i, t) in ctx.targets.iter().enumerate() {
        if i > 0 {
            between_targets(ctx).await;
        }
        let mut s = Session::start(ctx, "slow", t, 2, p.normal + p.slow).await;
        let pool = ConnPool::new(&ctx.model, p.normal);
        s.open(&pool, normal.clone()).await;
        s.opened().await;

        // Phase 0: normal clients alone.
        let w0 = s
            .write(
                annotate_round_robin(&objects, &watchers, total_writes),
                p.rate,
                0,
            )
            .await;
        s.drain(0, w0.expected).await;

        // Phase 1: with the slow consumers open.
        ctx.progress
            .stage(&format!("opening {} slow watches (never read)", p.slow));
        let slow_pool = ConnPool::new(&slow_model, p.slow);
        let held: Vec<_> = (0..p.slow)
            .map(|j| {
                let req = WatchReq {
                    client: slow_pool.get(j),
                    url: format!(
                        "{}/api/v1/namespaces/{NS}/configmaps?watch=1&resourceVersion=0",
                        t.url
                    ),
                    token: ctx.args.token.clone(),
                };
                watch::spawn_unread(req, s.rec.clone())
            })
            .collect();
        let mut responses = Vec::new();
        for h in held {
            if let Ok(Some(r)) = h.await {
                responses.push(r);
            }
        }
        let slow_opened = responses.len();
        tokio::time::sleep(Duration::from_millis(ctx.args.settle_ms)).await;
        let rss_with_slow = probe::rss_kib(t.pid);
        s.restart_cpu();
        let w1 = s
            .write(
                annotate_round_robin(&objects, &watchers, total_writes),
                p.rate,
                1,
            )
            .await;
        s.drain(1, w1.expected).await;
        // Give the server time to notice the last stalled streams.
        tokio::time::sleep(Duration::from_secs(2)).await;
        ctx.progress
            .stage("reading the slow watches to see which were closed");
        let closed = watch::count_closed(responses, Duration::from_secs(5)).await;

        let base = s.rec.sorted(0);
        let (mut report, with) = s.finish(1, &w1).await;
        let ok = unaffected(&base, w0.expected, &with, w1.expected);
        let d = |f: fn(&Latency) -> Option<f64>| {
            f(&Latency::of(&with))
                .zip(f(&Latency::of(&base)))
                .map(|(a, b)| a - b)
        };
        report.extra = json!({
            "normal_watches": p.normal,
            "slow_watches": p.slow,
            "slow_watches_opened": slow_opened,
            "normal_only": phase_summary(&base, w0.expected),
            "with_slow_consumers": phase_summary(&with, w1.expected),
            "p50_change_ms": d(|l| l.p50_ms),
            "p99_change_ms": d(|l| l.p99_ms),
            "normal_clients_unaffected": ok,
            "slow_watches_closed_by_target_metric": report.server_watches.terminated_watchers,
            "slow_watches_found_closed_by_client": closed,
            "rss_with_slow_watches_open_kib": rss_with_slow,
        });
        let closed_metric = report
            .server_watches
            .terminated_watchers
            .map_or("?".into(), |v| v.to_string());
        let line = format!(
            "{}: normal clients {} by {slow_opened} slow consumers ({VERDICT_RULE}); p99 {} -> {} ms, deliveries {}/{} -> {}/{}; slow watches closed: {closed_metric} by the target's counter, {closed} seen closed by the clients",
            t.name,
            if ok { "unaffected" } else { "AFFECTED" },
            Latency::of(&base).p99_ms.map_or("-".into(), |v| format!("{v:.2}")),
            Latency::of(&with).p99_ms.map_or("-".into(), |v| format!("{v:.2}")),
            base.len(),
            w0.expected,
            with.len(),
            w1.expected,
        );
        ctx.progress.log(&line);
        notes.push(line);
        series.push(Series {
            label: format!("{} (normal only)", t.name),
            sorted: base,
        });
        series.push(Series {
            label: format!("{} (with slow consumers)", t.name),
            sorted: with,
        });
        reports.push(report);
    }
    ScenarioRun {
        workload: json!({
            "normal_watches": p.normal,
            "slow_watches": p.slow,
            "slow_watch": "namespace-wide ConfigMap watch, own HTTP/2 connection, body never read",
            "configmaps": p.objects,
            "payload_bytes": p.payload_bytes,
            "writes_per_second": p.rate,
            "seconds_per_phase": p.seconds,
            "phases": ["normal clients alone", "with slow consumers"],
            "verdict_rule": VERDICT_RULE,
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

    #[test]
    fn verdict_rule() {
        let ms = |v: u64| Duration::from_millis(v);
        let base: Vec<Duration> = (1..=100).map(ms).collect();
        assert!(unaffected(&base, 100, &base, 100));
        let slower: Vec<Duration> = (1..=100).map(|v| ms(v * 2)).collect();
        assert!(!unaffected(&base, 100, &slower, 100));
        assert!(!unaffected(&base, 100, &base[..50], 100));
    }
}
