//! Scenario 2, `informer`: `--clients` namespace-wide list+watch clients, as client-go
//! informers start: a list with `resourceVersion=0`, then a watch from the list's
//! resourceVersion (`allowWatchBookmarks=true`). Client `i` watches namespace
//! `i % --namespaces`. Then ConfigMap churn at `--rate` operations/s spread over those
//! namespaces: creates, updates (of objects created about a second earlier) and deletes
//! (about two seconds after the create), one third each; every operation must reach every
//! client of its namespace, deletes included.

use std::sync::Arc;

use futures::StreamExt;
use serde_json::{json, Value};

use super::{
    between_targets, payload, per_item_bytes, Ctx, Op, ScenarioRun, Series, Session, WriteOp,
};
use crate::client::ConnPool;
use crate::probe;
use crate::record::Recorder;
use crate::watch::Ready;

#[derive(Clone, Debug)]
pub struct Params {
    pub clients: usize,
    pub namespaces: usize,
    pub objects_per_ns: usize,
    pub rate: u64,
    pub seconds: u64,
}

impl Params {
    pub fn from_ctx(ctx: &Ctx) -> Params {
        let a = &ctx.args;
        Params {
            clients: a.clients.max(1),
            namespaces: a.namespaces.unwrap_or(5).max(1),
            objects_per_ns: a.objects_per_namespace,
            rate: a.rate.unwrap_or(60).max(1),
            seconds: a.seconds.unwrap_or(20),
        }
    }

    /// Clients watching namespace `ns`.
    fn clients_in(&self, ns: usize) -> usize {
        (0..self.clients)
            .filter(|c| c % self.namespaces == ns)
            .count()
    }
}

fn ns_name(i: usize) -> String {
    format!("bench-inf-{i}")
}

fn collection(ns: usize) -> String {
    format!("/api/v1/namespaces/{}/configmaps", ns_name(ns))
}

/// The churn of one target run: operation `i` is a create (i % 3 == 0), an update or a
/// delete of the object created `lag` creates earlier (resp. `2 × lag`); updates and
/// deletes without such an object update a pre-existing ConfigMap instead.
fn churn(p: &Params, run: usize, total: usize) -> Vec<WriteOp> {
    let lag = (p.rate as usize / 3).max(1); // about one second of creates
    let data = payload(1024);
    let name = |k: usize| format!("churn-{run}-{k}");
    (0..total)
        .map(|i| {
            let k = i / 3;
            let fallback = |k: usize| {
                let ns = k % p.namespaces;
                let obj = k % p.objects_per_ns.max(1);
                (
                    Op::Annotate {
                        path: format!("{}/cfg-{obj}", collection(ns)),
                    },
                    ns,
                )
            };
            let (op, ns) = match i % 3 {
                0 => {
                    let ns = k % p.namespaces;
                    (
                        Op::Create {
                            collection: collection(ns),
                            body: json!({"metadata": {"name": name(k)}, "data": {"v": data}}),
                        },
                        ns,
                    )
                }
                1 if k >= lag => {
                    let ns = (k - lag) % p.namespaces;
                    (
                        Op::Annotate {
                            path: format!("{}/{}", collection(ns), name(k - lag)),
                        },
                        ns,
                    )
                }
                2 if k >= 2 * lag => {
                    let ns = (k - 2 * lag) % p.namespaces;
                    (
                        Op::Delete {
                            path: format!("{}/{}", collection(ns), name(k - 2 * lag)),
                            namespace: ns_name(ns),
                            name: name(k - 2 * lag),
                        },
                        ns,
                    )
                }
                _ if p.objects_per_ns > 0 => fallback(k),
                _ => {
                    // No pre-existing objects: create instead.
                    let ns = k % p.namespaces;
                    (
                        Op::Create {
                            collection: collection(ns),
                            body: json!({"metadata": {"name": format!("churn-{run}-x{i}")}, "data": {"v": "0"}}),
                        },
                        ns,
                    )
                }
            };
            WriteOp {
                op,
                fanout: p.clients_in(ns),
            }
        })
        .collect()
}

async fn setup(ctx: &Ctx, p: &Params) -> usize {
    ctx.progress.stage("creating namespaces and ConfigMaps");
    let data = payload(1024);
    let mut items: Vec<(String, Value)> = Vec::new();
    for ns in 0..p.namespaces {
        if let Err(e) = ctx.api.ensure_namespace(&ns_name(ns)).await {
            ctx.progress.log(&format!("namespace {}: {e}", ns_name(ns)));
        }
        for i in 0..p.objects_per_ns {
            items.push((
                collection(ns),
                json!({"metadata": {"name": format!("cfg-{i}")}, "data": {"v": data}}),
            ));
        }
    }
    let n = ctx.api.create_all(items).await;
    ctx.progress.log(&format!(
        "setup: {} ConfigMaps created, {} existed, {} failed",
        n.created, n.existed, n.failed
    ));
    n.created
}

/// Lists every client's namespace through the target; the resourceVersion per client
/// (`None` if its list failed) and the items listed.
async fn list_all(
    s: &Session<'_>,
    pool: &ConnPool,
    p: &Params,
    rec: &Arc<Recorder>,
) -> (Vec<Option<String>>, usize) {
    let results: Vec<(usize, Option<(String, usize)>)> = futures::stream::iter(0..p.clients)
        .map(|c| {
            let http = pool.get(c);
            let url = format!(
                "{}{}?resourceVersion=0",
                s.target.url,
                collection(c % p.namespaces)
            );
            let token = s.ctx.args.token.clone();
            let rec = rec.clone();
            async move {
                let resp = http.get(url).bearer_auth(token).send().await;
                let list: Option<Value> = match resp {
                    Ok(r) if r.status().is_success() => r.json().await.ok(),
                    Ok(r) => {
                        rec.failure(format!("list HTTP {}", r.status().as_u16()));
                        None
                    }
                    Err(_) => {
                        rec.failure("list request error".into());
                        None
                    }
                };
                let got = list.and_then(|l| {
                    let rv = l["metadata"]["resourceVersion"].as_str()?.to_string();
                    Some((rv, l["items"].as_array().map_or(0, Vec::len)))
                });
                (c, got)
            }
        })
        .buffer_unordered(p.clients.min(64))
        .collect()
        .await;
    let mut rvs = vec![None; p.clients];
    let mut items = 0;
    for (c, got) in results {
        if let Some((rv, n)) = got {
            rvs[c] = Some(rv);
            items += n;
        }
    }
    (rvs, items)
}

pub async fn run(ctx: &Ctx) -> ScenarioRun {
    let p = Params::from_ctx(ctx);
    let api_before = probe::rss_kib(ctx.args.apiserver_pid);
    let created = setup(ctx, &p).await;
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    let api_growth = probe::rss_kib(ctx.args.apiserver_pid) as i64 - api_before as i64;
    let cached = p.namespaces * p.objects_per_ns;
    let total_writes = (p.rate * p.seconds) as usize;
    let mut reports = Vec::new();
    let mut series = Vec::new();
    for (run, t) in ctx.targets.iter().enumerate() {
        if run > 0 {
            between_targets(ctx).await;
        }
        let mut s = Session::start(ctx, "informer", t, 1, p.clients).await;
        let pool = ConnPool::new(&ctx.model, p.clients);
        ctx.progress
            .stage(&format!("{} clients listing", p.clients));
        let rss0 = probe::rss_kib(t.pid);
        let rec = s.rec.clone();
        let (rvs, listed) = list_all(&s, &pool, &p, &rec).await;
        tokio::time::sleep(std::time::Duration::from_millis(ctx.args.settle_ms)).await;
        let list_growth = probe::rss_kib(t.pid) as i64 - rss0 as i64;
        // RSS per watch counts from here, without what the lists made kcache cache.
        s.rebase_rss();
        let lists_failed = rvs.iter().filter(|rv| rv.is_none()).count();
        let watches: Vec<(String, Ready)> = rvs
            .iter()
            .enumerate()
            .filter_map(|(c, rv)| {
                let rv = rv.as_ref()?;
                Some((
                    format!(
                        "{}?watch=1&resourceVersion={rv}&allowWatchBookmarks=true",
                        collection(c % p.namespaces)
                    ),
                    Ready::Headers,
                ))
            })
            .collect();
        s.open(&pool, watches).await;
        s.opened().await;
        let written = s.write(churn(&p, run, total_writes), p.rate, 0).await;
        s.drain(0, written.expected).await;
        let (mut report, sorted) = s.finish(0, &written).await;
        report.cached_objects = Some(cached);
        if t.is_apiserver() {
            report.rss_growth_per_cached_object_bytes =
                (created > 0).then(|| per_item_bytes(api_growth, created));
            report.cached_objects_method = Some(
                "API server RSS growth while the namespaces' ConfigMaps were created (its watch cache holds them)".into(),
            );
        } else {
            report.rss_growth_per_cached_object_bytes = Some(per_item_bytes(list_growth, cached));
            report.cached_objects_method = Some(
                "kcache RSS growth over the clients' first lists, which make it cache the namespaces (includes list buffers)".into(),
            );
        }
        report.extra = json!({
            "lists_failed": lists_failed,
            "objects_listed_by_all_clients": listed,
            "rss_growth_over_lists_kib": list_growth,
        });
        series.push(Series {
            label: t.name.to_string(),
            sorted,
        });
        reports.push(report);
    }
    ScenarioRun {
        workload: json!({
            "clients": p.clients,
            "namespaces": p.namespaces,
            "configmaps_per_namespace": p.objects_per_ns,
            "configmap_bytes": 1024,
            "operations_per_second": p.rate,
            "seconds": p.seconds,
            "operations": total_writes,
            "mix": "1/3 create, 1/3 update (of an object created ~1 s earlier), 1/3 delete (~2 s after create)",
        }),
        reports,
        series,
        notes: Vec::new(),
        sections: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn churn_creates_updates_then_deletes() {
        let p = Params {
            clients: 10,
            namespaces: 5,
            objects_per_ns: 3,
            rate: 3,
            seconds: 3,
        };
        let ops = churn(&p, 0, 9);
        assert!(matches!(&ops[0].op, Op::Create { .. }));
        // k = 0 has no earlier object: a pre-existing one is updated instead.
        assert!(matches!(&ops[1].op, Op::Annotate { path } if path.ends_with("/cfg-0")));
        assert!(matches!(&ops[4].op, Op::Annotate { path } if path.ends_with("/churn-0-0")));
        assert!(
            matches!(&ops[8].op, Op::Delete { name, namespace, .. } if name == "churn-0-0" && namespace == "bench-inf-0")
        );
        assert!(ops.iter().all(|o| o.fanout == 2));
    }
}
