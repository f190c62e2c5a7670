//! Scenario `kubeproxy`: kube-proxy's watches as the reference version's kube-proxy holds
//! them, one kube-proxy per HTTP/2 connection (every kube-proxy is a process of its own,
//! so nothing multiplexes their watches across nodes).
//!
//! `--services` (1,000) headless Services spread over `--namespaces` (10), each with one
//! `discovery.k8s.io/v1` EndpointSlice of `--endpoint-addresses` (3) addresses. The slices
//! are created explicitly: the test cluster runs no controller manager, hence no
//! EndpointSlice controller. Headless Services, because the test API server's service range
//! (10.0.0.0/24) has only 254 cluster IPs; every tenth slice carries the
//! `service.kubernetes.io/headless` label the controller would give it, so kube-proxy's
//! selector has something to filter out (writes to those slices reach no watch).
//!
//! Per target: one list of Services and one of EndpointSlices with kube-proxy's selector
//! `!service.kubernetes.io/service-proxy-name,!service.kubernetes.io/headless` and
//! `resourceVersion=0` (as its reflectors start; through kcache this starts the two
//! cluster-wide keys), then `--watches` (5,000) kube-proxies, each one connection carrying
//! the two watches kube-proxy holds: `GET /apis/discovery.k8s.io/v1/endpointslices?watch=1`
//! and `GET /api/v1/services?watch=1` with that selector, the list's resourceVersion and
//! `allowWatchBookmarks=true`. The one list stands for every kube-proxy's: 5,000 lists of
//! 1,000 objects would measure lists, not watches (the `objects` scenario measures lists).
//! Then `--rate` (20) writes/s for `--seconds` (20) s to the API server, each a `bench-seq`
//! annotation on a pseudo-random EndpointSlice; every EndpointSlice watch must deliver
//! every write to a slice its selector matches, and no other. The figures that matter:
//! deliveries per CPU-second of the target (kcache aims at 10× the API server's; reported,
//! not asserted) and write→delivery p50/p99. JSON, where kube-proxy asks for protobuf: the
//! harness reads JSON lines (`services/tests/kube_proxy.rs` runs the real pattern in
//! protobuf).
//!
//! Each connection is a socket in this process and in the target: run.sh raises the
//! open-file limit of all three processes, and a note says when this process's is too low.

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

/// kube-proxy's label selector (`pkg/proxy/apis` + `cmd/kube-proxy`): Services and
/// EndpointSlices another proxy owns, and headless Services' slices, are not its business.
const SELECTOR: &str = "!service.kubernetes.io/service-proxy-name,!service.kubernetes.io/headless";

/// The same, query-escaped (`!` and `,` as Go's `url.QueryEscape` writes them).
const SELECTOR_QUERY: &str =
    "%21service.kubernetes.io%2Fservice-proxy-name%2C%21service.kubernetes.io%2Fheadless";

const SLICES: &str = "/apis/discovery.k8s.io/v1/endpointslices";
const SERVICES: &str = "/api/v1/services";

fn slice_path(p: &Params, service: usize) -> String {
    format!(
        "/apis/discovery.k8s.io/v1/namespaces/{}/endpointslices/svc-{service}",
        ns_name(p, service)
    )
}

/// Whether Service `i`'s slice carries the headless label (every tenth): kube-proxy's
/// selector leaves it out.
fn labelled_headless(i: usize) -> bool {
    i % 10 == 9
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

/// The EndpointSlice of Service `i`: `p.addresses` endpoints, each a distinct
/// pod-network address, ready, as the EndpointSlice controller writes them.
fn slice(p: &Params, i: usize) -> Value {
    let endpoints: Vec<Value> = (0..p.addresses)
        .map(|j| {
            let n = i * p.addresses + j + 1;
            let ip = format!("10.{}.{}.{}", 64 + (n >> 16) % 64, (n >> 8) & 255, n & 255);
            json!({
                "addresses": [ip],
                "conditions": {"ready": true, "serving": true, "terminating": false},
                "targetRef": {"kind": "Pod", "namespace": ns_name(p, i), "name": format!("svc-{i}-{j}")},
            })
        })
        .collect();
    let mut labels = json!({
        "app": "bench-kubeproxy",
        "kubernetes.io/service-name": format!("svc-{i}"),
        "endpointslice.kubernetes.io/managed-by": "kcache-loadtest",
    });
    if labelled_headless(i) {
        labels["service.kubernetes.io/headless"] = json!("");
    }
    json!({
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {"name": format!("svc-{i}"), "labels": labels},
        "addressType": "IPv4",
        "endpoints": endpoints,
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
    })
}

async fn setup(ctx: &Ctx, p: &Params) {
    ctx.progress.stage(&format!(
        "creating {} Services and their EndpointSlices",
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
            format!("/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices"),
            slice(p, i),
        ));
    }
    let n = ctx.api.create_all(items).await;
    ctx.progress.log(&format!(
        "setup: {} Services and EndpointSlices created, {} existed, {} failed",
        n.created, n.existed, n.failed
    ));
}

/// `total` annotation writes, each to a pseudo-random EndpointSlice (the same sequence
/// for every target), each to be delivered by `fanout` watches — or by none, for a slice
/// the selector leaves out.
fn writes(p: &Params, total: usize, fanout: usize) -> Vec<WriteOp> {
    (0..total)
        .map(|i| {
            let service = (splitmix64(i as u64) % p.services as u64) as usize;
            WriteOp {
                op: Op::Annotate {
                    path: slice_path(p, service),
                },
                fanout: if labelled_headless(service) {
                    0
                } else {
                    fanout
                },
            }
        })
        .collect()
}

/// Lists `collection` through the target with kube-proxy's selector and
/// `resourceVersion=0`: (the list's resourceVersion, items, seconds). Retried a few times:
/// kcache answers 504 while a new key's first sync takes longer than its sync timeout.
async fn list(ctx: &Ctx, url: &str, collection: &str) -> Result<(String, usize, f64), String> {
    let api = Api::new(url, &ctx.args.token);
    let mut last = String::new();
    for attempt in 1..=3 {
        let start = Instant::now();
        let path = format!("{collection}?labelSelector={SELECTOR_QUERY}&resourceVersion=0");
        match api.get_json(&path).await {
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
    // One kube-proxy (its two watches) per connection, whatever --per-connection says.
    let model = ConnModel {
        per_connection: 2,
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
        ctx.progress.stage(&format!(
            "{}: listing Services and EndpointSlices with kube-proxy's selector",
            t.name
        ));
        let lists = match (
            list(ctx, &t.url, SERVICES).await,
            list(ctx, &t.url, SLICES).await,
        ) {
            (Ok(services), Ok(slices)) => (services, slices),
            (Err(e), _) | (_, Err(e)) => {
                let note = format!("{}: a list failed ({e}); not measured", t.name);
                ctx.progress.log(&note);
                notes.push(note);
                continue;
            }
        };
        let ((services_rv, _, _), (rv, listed, list_seconds)) = lists;
        // Connection k carries watches 2k (its slices) and 2k + 1 (its Services).
        let watches: Vec<(String, Ready)> = (0..p.watches)
            .flat_map(|_| {
                [
                    (
                        format!("{SLICES}?watch=1&labelSelector={SELECTOR_QUERY}&resourceVersion={rv}&allowWatchBookmarks=true"),
                        Ready::Headers,
                    ),
                    (
                        format!("{SERVICES}?watch=1&labelSelector={SELECTOR_QUERY}&resourceVersion={services_rv}&allowWatchBookmarks=true"),
                        Ready::Headers,
                    ),
                ]
            })
            .collect();
        let mut s = Session::start(ctx, "kubeproxy", t, 1, 2 * p.watches).await;
        let pool = ConnPool::new(&model, 2 * p.watches);
        s.open(&pool, watches).await;
        s.opened().await;
        // Every established slice watch must deliver every write its selector matches; the
        // watches that failed to open are in the report (watches_established against
        // client_watches). Services watches see no writes: the open ones beyond the
        // Services watches are the slice watches (a failed Services watch would count one
        // slice watch too many, and show as a delivery short).
        let c = &s.rec.counters;
        let fanout = Counters::get(&c.ready)
            .saturating_sub(Counters::get(&c.ended))
            .saturating_sub(p.watches);
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
            "services_list_resource_version": services_rv,
            "watches_per_connection": 2,
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
            "endpointslices": p.services,
            "endpointslices_left_out_by_the_selector": (0..p.services).filter(|&i| labelled_headless(i)).count(),
            "namespaces": p.namespaces.min(p.services),
            "addresses_per_endpointslice": p.addresses,
            "kube_proxies": p.watches,
            "watches": 2 * p.watches,
            "watch": format!("GET {SLICES} and {SERVICES} ?watch=1&labelSelector={SELECTOR}&resourceVersion=<list RV>&allowWatchBookmarks=true"),
            "writes_per_second": p.rate,
            "seconds": p.seconds,
            "writes": total_writes,
            "write": "merge patch of a bench-seq annotation on a pseudo-random EndpointSlice",
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
                    "watches_per_connection": 2,
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
    fn the_escaped_selector_is_the_selector() {
        let decoded = SELECTOR_QUERY
            .replace("%21", "!")
            .replace("%2F", "/")
            .replace("%2C", ",");
        assert_eq!(decoded, SELECTOR);
        assert!(!decoded.contains('%'));
    }

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
        // Writes to the slices the selector leaves out reach no watch; the rest reach all.
        let left_out = w.iter().filter(|w| w.fanout == 0).count();
        assert!(w.iter().all(|w| w.fanout == 5000 || w.fanout == 0));
        assert!(
            (20..=60).contains(&left_out),
            "{left_out} of 400 writes left out"
        );
        let namespaces: std::collections::HashSet<String> = w
            .iter()
            .filter_map(|w| match &w.op {
                Op::Annotate { path } => path.split('/').nth(5).map(str::to_string),
                _ => None,
            })
            .collect();
        assert_eq!(namespaces.len(), 10);
        assert_eq!(
            slice_path(&p, 13),
            "/apis/discovery.k8s.io/v1/namespaces/bench-kp-3/endpointslices/svc-13"
        );
        let e = slice(&p, 999);
        let ips: Vec<&str> = e["endpoints"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|a| a["addresses"][0].as_str())
            .collect();
        assert_eq!(ips, ["10.64.11.182", "10.64.11.183", "10.64.11.184"]);
        assert_eq!(
            e["metadata"]["labels"]["service.kubernetes.io/headless"],
            ""
        );
        assert!(slice(&p, 998)["metadata"]["labels"]
            .get("service.kubernetes.io/headless")
            .is_none());
    }
}
