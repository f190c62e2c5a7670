//! Scenario `kubeproxy`: cluster-wide Endpoints watches as kube-proxies hold them, one
//! per node, each on an HTTP/2 connection of its own (every kube-proxy is a process of
//! its own, so nothing multiplexes their watches).
//!
//! `--services` (1,000) headless Services spread over `--namespaces` (10), each with an
//! Endpoints object of one subset of `--endpoint-addresses` (3) addresses. The Endpoints
//! are created explicitly: the test cluster runs no controller manager, hence no endpoints
//! controller. Headless, because the test API server's service range (10.0.0.0/24) has
//! only 254 cluster IPs.
//!
//! Per target: one list of every Endpoints object with `resourceVersion=0` through it (as
//! a reflector starts; for kcache it also starts the cluster-wide key), then `--watches`
//! (5,000) watches `GET /api/v1/endpoints?watch=1&resourceVersion=<the list's>&allowWatchBookmarks=true`,
//! opened in `--steps` steps with RSS sampled after each. The one list stands for every
//! kube-proxy's: 5,000 lists of 1,000 objects would measure lists, not watches (the
//! `objects` scenario measures lists). Then `--rate` (20) writes/s for `--seconds` (20) s
//! to the API server, each a `bench-seq` annotation on a pseudo-random Endpoints object;
//! every watch must deliver every write (fan-out: the watches established). The figures
//! that matter: deliveries per CPU-second of the target (kcache aims at 10× the API
//! server's; reported, not asserted) and write→delivery p50/p99.
//!
//! Each watch is a socket in this process and in the target: run.sh raises the open-file
//! limit of all three processes, and a note says when this process's is too low.

use std::time::Instant;

use serde_json::{json, Value};

use super::{between_targets, splitmix64, Ctx, Op, ScenarioRun, Series, Session, WriteOp};
use crate::client::{Api, ConnModel, ConnPool};
use crate::probe;
use crate::record::Counters;
use crate::watch::Ready;

#[derive(Clone, Debug)]
pub struct Params {
    pub services: usize,
    pub namespaces: usize,
    pub watches: usize,
    pub addresses: usize,
    pub rate: u64,
    pub seconds: u64,
}

impl Params {
    pub fn from_ctx(ctx: &Ctx) -> Params {
        let a = &ctx.args;
        Params {
            services: a.services.max(1),
            namespaces: a.namespaces.unwrap_or(10).max(1),
            watches: a.watches.unwrap_or(5_000).max(1),
            addresses: a.endpoint_addresses.max(1),
            rate: a.rate.unwrap_or(20).max(1),
            seconds: a.seconds.unwrap_or(20),
        }
    }
}

fn ns_name(p: &Params, service: usize) -> String {
    format!("bench-kp-{}", service % p.namespaces)
}

fn endpoints_path(p: &Params, service: usize) -> String {
    format!(
        "/api/v1/namespaces/{}/endpoints/svc-{service}",
        ns_name(p, service)
    )
}

fn service(i: usize) -> Value {
    json!({
        "metadata": {"name": format!("svc-{i}"), "labels": {"app": "bench-kubeproxy"}},
        "spec": {
            "clusterIP": "None",
            "ports": [{"name": "http", "port": 80, "protocol": "TCP"}],
        },
    })
}

/// Endpoints of Service `i`: one subset, `p.addresses` distinct pod-network addresses.
fn endpoints(p: &Params, i: usize) -> Value {
    let addresses: Vec<Value> = (0..p.addresses)
        .map(|j| {
            let n = i * p.addresses + j + 1;
            let ip = format!("10.{}.{}.{}", 64 + (n >> 16) % 64, (n >> 8) & 255, n & 255);
            json!({"ip": ip, "targetRef": {"kind": "Pod", "namespace": ns_name(p, i), "name": format!("svc-{i}-{j}")}})
        })
        .collect();
    json!({
        "metadata": {"name": format!("svc-{i}"), "labels": {"app": "bench-kubeproxy"}},
        "subsets": [{
            "addresses": addresses,
            "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
        }],
    })
}

async fn setup(ctx: &Ctx, p: &Params) {
    ctx.progress.stage(&format!(
        "creating {} Services and their Endpoints",
        p.services
    ));
    for ns in 0..p.namespaces.min(p.services) {
        let name = ns_name(p, ns);
        if let Err(e) = ctx.api.ensure_namespace(&name).await {
            ctx.progress.log(&format!("namespace {name}: {e}"));
        }
    }
    let mut items = Vec::with_capacity(2 * p.services);
    for i in 0..p.services {
        let ns = ns_name(p, i);
        items.push((format!("/api/v1/namespaces/{ns}/services"), service(i)));
        items.push((
            format!("/api/v1/namespaces/{ns}/endpoints"),
            endpoints(p, i),
        ));
    }
    let n = ctx.api.create_all(items).await;
    ctx.progress.log(&format!(
        "setup: {} Services and Endpoints created, {} existed, {} failed",
        n.created, n.existed, n.failed
    ));
}

/// `total` annotation writes, each to a pseudo-random Endpoints object (the same sequence
/// for every target), each to be delivered by `fanout` watches.
fn writes(p: &Params, total: usize, fanout: usize) -> Vec<WriteOp> {
    (0..total)
        .map(|i| {
            let service = (splitmix64(i as u64) % p.services as u64) as usize;
            WriteOp {
                op: Op::Annotate {
                    path: endpoints_path(p, service),
                },
                fanout,
            }
        })
        .collect()
}

/// Lists every Endpoints object through the target with `resourceVersion=0`: (the list's
/// resourceVersion, items, seconds). Retried a few times: kcache answers 504 while a new
/// key's first sync takes longer than its sync timeout.
async fn list(ctx: &Ctx, url: &str) -> Result<(String, usize, f64), String> {
    let api = Api::new(url, &ctx.args.token);
    let mut last = String::new();
    for attempt in 1..=3 {
        let start = Instant::now();
        match api.get_json("/api/v1/endpoints?resourceVersion=0").await {
            Ok(v) => {
                let rv = v["metadata"]["resourceVersion"]
                    .as_str()
                    .ok_or("list without metadata.resourceVersion")?
                    .to_string();
                let items = v["items"].as_array().map_or(0, Vec::len);
                return Ok((rv, items, start.elapsed().as_secs_f64()));
            }
            Err(e) => last = e.to_string(),
        }
        tokio::time::sleep(std::time::Duration::from_secs(2 * attempt)).await;
    }
    Err(last)
}

pub async fn run(ctx: &Ctx) -> ScenarioRun {
    let p = Params::from_ctx(ctx);
    let mut notes = Vec::new();
    // Sockets of the watches, plus a margin for the writers, the probes and the runtime.
    if let Some(limit) = probe::open_files_limit() {
        if limit < p.watches as u64 + 256 {
            let note = format!(
                "this process may open {limit} files, fewer than --watches {} needs (loadtest/run.sh raises the limit)",
                p.watches
            );
            ctx.progress.log(&note);
            notes.push(note);
        }
    }
    setup(ctx, &p).await;
    // One watch per connection, whatever --per-connection says.
    let model = ConnModel {
        per_connection: 1,
        http1: false,
        ..ctx.model.clone()
    };
    let total_writes = (p.rate * p.seconds) as usize;
    let mut reports = Vec::new();
    let mut series = Vec::new();
    for (i, t) in ctx.targets.iter().enumerate() {
        if i > 0 {
            between_targets(ctx).await;
        }
        ctx.progress
            .stage(&format!("{}: listing every Endpoints object", t.name));
        let (rv, listed, list_seconds) = match list(ctx, &t.url).await {
            Ok(l) => l,
            Err(e) => {
                let note = format!("{}: the Endpoints list failed ({e}); not measured", t.name);
                ctx.progress.log(&note);
                notes.push(note);
                continue;
            }
        };
        let watches: Vec<(String, Ready)> = (0..p.watches)
            .map(|_| {
                (
                    format!(
                        "/api/v1/endpoints?watch=1&resourceVersion={rv}&allowWatchBookmarks=true"
                    ),
                    Ready::Headers,
                )
            })
            .collect();
        let mut s = Session::start(ctx, "kubeproxy", t, 1, p.watches).await;
        let pool = ConnPool::new(&model, p.watches);
        s.open(&pool, watches).await;
        s.opened().await;
        // Every established watch must deliver every write; the watches that failed to
        // open are in the report (watches_established against client_watches).
        let c = &s.rec.counters;
        let fanout = Counters::get(&c.ready).saturating_sub(Counters::get(&c.ended));
        if fanout < p.watches {
            let note = format!(
                "{}: {fanout} of {} watches open for the writes",
                t.name, p.watches
            );
            ctx.progress.log(&note);
            notes.push(note);
        }
        let written = s.write(writes(&p, total_writes, fanout), p.rate, 0).await;
        s.drain(0, written.expected).await;
        let (mut report, sorted) = s.finish(0, &written).await;
        report.extra = json!({
            "list_resource_version": rv,
            "list_items": listed,
            "list_seconds": list_seconds,
            "watches_per_connection": 1,
            "fanout_per_write": fanout,
        });
        drop(pool);
        series.push(Series {
            label: format!("{} ({fanout} watches)", t.name),
            sorted,
        });
        reports.push(report);
    }
    let ratio = {
        let per_cpu = |name: &str| {
            reports
                .iter()
                .find(|r| r.target == name)
                .and_then(|r| r.deliveries_per_target_cpu_second)
        };
        per_cpu("kcache")
            .zip(per_cpu("kube-apiserver"))
            .map(|(k, a)| k / a)
    };
    ScenarioRun {
        workload: json!({
            "services": p.services,
            "endpoints": p.services,
            "namespaces": p.namespaces.min(p.services),
            "addresses_per_endpoints": p.addresses,
            "watches": p.watches,
            "watch": "GET /api/v1/endpoints?watch=1&resourceVersion=<list RV>&allowWatchBookmarks=true",
            "writes_per_second": p.rate,
            "seconds": p.seconds,
            "writes": total_writes,
            "write": "merge patch of a bench-seq annotation on a pseudo-random Endpoints object",
        }),
        reports,
        series,
        notes,
        sections: vec![
            (
                "deliveries_per_target_cpu_second".into(),
                json!({
                    "kcache_over_apiserver": ratio,
                    "aim": 10.0,
                    "within_aim": ratio.map(|r| r >= 10.0),
                }),
            ),
            (
                "connection_model".into(),
                json!({
                    "protocol": "HTTPS, HTTP/2",
                    "watches_per_connection": 1,
                    "connections_per_target": p.watches,
                    "source_addresses": ctx.args.source_addrs,
                    "auth": "bearer token (same for both targets), authorization on",
                }),
            ),
        ],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_spread_over_every_namespace_with_full_fanout() {
        let p = Params {
            services: 1000,
            namespaces: 10,
            watches: 5000,
            addresses: 3,
            rate: 20,
            seconds: 20,
        };
        let w = writes(&p, 400, 5000);
        assert_eq!(w.len(), 400);
        assert!(w.iter().all(|w| w.fanout == 5000));
        let namespaces: std::collections::HashSet<String> = w
            .iter()
            .filter_map(|w| match &w.op {
                Op::Annotate { path } => path.split('/').nth(4).map(str::to_string),
                _ => None,
            })
            .collect();
        assert_eq!(namespaces.len(), 10);
        assert_eq!(
            endpoints_path(&p, 13),
            "/api/v1/namespaces/bench-kp-3/endpoints/svc-13"
        );
        let e = endpoints(&p, 999);
        let ips: Vec<&str> = e["subsets"][0]["addresses"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|a| a["ip"].as_str())
            .collect();
        assert_eq!(ips, ["10.64.11.182", "10.64.11.183", "10.64.11.184"]);
    }
}
