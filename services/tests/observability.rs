//! The operator's side: kcache's alert rules (`deploy/observability/alerts.yaml`) are
//! valid Prometheus rules, fire as their unit tests say (`promtool test rules`), and
//! read only metrics kcache defines; its Grafana dashboard
//! (`deploy/observability/dashboard.json`) reads only metrics a live kcache exports.

mod support;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::{json, Value};
use support::kcache::Kcache;
use support::nats::{fleet_toml, Nats};
use support::{eventually, insecure_http, TestCluster, ADMIN_TOKEN};

fn observability() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/observability")
}

fn promtool(args: &[&str]) {
    let out = Command::new("promtool")
        .args(args)
        .current_dir(observability())
        .output()
        .expect("run promtool (Debian package prometheus; scripts/ensure-deps.sh installs it)");
    assert!(
        out.status.success(),
        "promtool {args:?}:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn alert_rules_are_valid_and_fire_as_tested() {
    promtool(&["check", "rules", "alerts.yaml"]);
    promtool(&["test", "rules", "alerts_test.yaml"]);
}

/// A metric renamed in the code must not leave an alert reading nothing.
#[test]
fn alerts_read_only_metrics_kcache_defines() {
    let rules = std::fs::read_to_string(observability().join("alerts.yaml")).expect("alerts.yaml");
    let sources = sources();
    let mut names: Vec<&str> = rules
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|w| w.starts_with("kcache_"))
        .collect();
    names.sort();
    names.dedup();
    assert!(names.len() >= 5, "{names:?}");
    for name in names {
        assert!(
            sources.contains(&format!("\"{name}\"")),
            "alerts.yaml reads {name}, which kcache does not define"
        );
    }
}

/// kcache's Rust sources (actors/src and services/src), concatenated.
fn sources() -> String {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut sources = String::new();
    for dir in ["actors/src", "services/src"] {
        for entry in walk(&root.join(dir)) {
            sources.push_str(&std::fs::read_to_string(entry).unwrap_or_default());
        }
    }
    sources
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
    out
}

/// Dashboard metrics the live fleet below does not export. The exporter lists a metric only
/// once it has been recorded (a HELP text alone does not make it appear), and these are
/// only recorded after a fault (or, for resyncs, an owner change seen by a third replica),
/// which the test does not stage. Each must be a metric the dashboard reads (so this list
/// cannot outlive its panels) and one kcache defines.
const EXPORTED_ONLY_AFTER_A_FAULT: &[(&str, &str)] = &[
    (
        "kcache_terminated_watchers_total",
        "only once a watcher stops reading and overflows cache.watcher_buffer",
    ),
    (
        "kcache_upstream_errors_total",
        "only after an upstream list or watch fails",
    ),
    (
        "kcache_fleet_resyncs_total",
        "only after a mirror resynchronises after a gap, an owner change or a refused snapshot (a mirror's first snapshot is not counted)",
    ),
];

const NS: &str = "obs";

fn dashboard() -> Value {
    let text = std::fs::read_to_string(observability().join("dashboard.json"))
        .expect("deploy/observability/dashboard.json");
    serde_json::from_str(&text).expect("dashboard.json is JSON")
}

/// Every PromQL expression of the dashboard: each panel target's `expr` (through rows and
/// their nested panels) and each templating query.
fn dashboard_queries(d: &Value) -> Vec<String> {
    fn panels(list: &Value, out: &mut Vec<String>) {
        for panel in list.as_array().into_iter().flatten() {
            for target in panel["targets"].as_array().into_iter().flatten() {
                if let Some(expr) = target["expr"].as_str() {
                    out.push(expr.to_string());
                }
            }
            panels(&panel["panels"], out);
        }
    }
    let mut out = Vec::new();
    panels(&d["panels"], &mut out);
    for var in d["templating"]["list"].as_array().into_iter().flatten() {
        // A string in older schemas, `{query, refId}` in newer ones; a `datasource`
        // variable's query is the plugin type, not PromQL.
        if var["type"] == "datasource" {
            continue;
        }
        match &var["query"] {
            Value::String(q) => out.push(q.clone()),
            q => out.extend(q["query"].as_str().map(str::to_string)),
        }
    }
    out
}

/// The metric names the queries read: identifiers starting with `kcache_` or `process_`,
/// a histogram's `_bucket` series (and `_sum` / `_count`, when its buckets are read too)
/// counted under the histogram's name. Also returns the histograms' names.
fn metric_names(queries: &[String]) -> (BTreeSet<String>, BTreeSet<String>) {
    let idents: Vec<&str> = queries
        .iter()
        .flat_map(|q| q.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':')))
        .filter(|w| w.starts_with("kcache_") || w.starts_with("process_"))
        .collect();
    let histograms: BTreeSet<String> = idents
        .iter()
        .filter_map(|w| w.strip_suffix("_bucket"))
        .map(str::to_string)
        .collect();
    let names = idents
        .iter()
        .map(|w| {
            for suffix in ["_bucket", "_sum", "_count"] {
                if let Some(base) = w.strip_suffix(suffix) {
                    if histograms.contains(base) {
                        return base.to_string();
                    }
                }
            }
            w.to_string()
        })
        .collect();
    (names, histograms)
}

/// Whether `scrape` (Prometheus text) has a sample of metric `name`: a line of `name`
/// followed by its labels or its value, or, for a histogram, by `_bucket`, `_sum` or
/// `_count`.
fn exports(scrape: &str, name: &str, histogram: bool) -> bool {
    let histogram = histogram || scrape.contains(&format!("# TYPE {name} histogram"));
    scrape
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.strip_prefix(name))
        .any(|rest| {
            let rest = if histogram {
                ["_bucket", "_sum", "_count"]
                    .iter()
                    .find_map(|s| rest.strip_prefix(s))
                    .unwrap_or(rest)
            } else {
                rest
            };
            rest.starts_with('{') || rest.starts_with(' ')
        })
}

async fn send(req: reqwest::RequestBuilder, token: &str) -> reqwest::Response {
    req.bearer_auth(token)
        .send()
        .await
        .expect("request to kcache")
}

/// Creates a ConfigMap through kcache (a proxied write); returns its resourceVersion.
async fn create_configmap(k: &Kcache, name: &str, value: &str) -> String {
    let resp = send(
        insecure_http()
            .post(format!("{}/api/v1/namespaces/{NS}/configmaps", k.url))
            .json(&json!({"metadata": {"name": name}, "data": {"v": value}})),
        ADMIN_TOKEN,
    )
    .await;
    assert_eq!(resp.status().as_u16(), 201, "create configmap {name}");
    let created: Value = resp.json().await.expect("created configmap");
    created["metadata"]["resourceVersion"]
        .as_str()
        .expect("resourceVersion")
        .to_string()
}

type Events = tokio::sync::mpsc::UnboundedReceiver<Value>;

async fn open_watch(k: &Kcache, query: &str, token: &str) -> Events {
    let resp = send(
        insecure_http().get(format!(
            "{}/api/v1/namespaces/{NS}/configmaps?watch=1&{query}",
            k.url
        )),
        token,
    )
    .await;
    assert_eq!(resp.status().as_u16(), 200, "watch ?{query}");
    support::event_channel(resp)
}

/// Reads `rx` until the ADDED event of ConfigMap `name`.
async fn until_added(rx: &mut Events, name: &str) {
    let wait = async {
        while let Some(ev) = rx.recv().await {
            if ev["type"] == "ADDED" && ev["object"]["metadata"]["name"] == name {
                return;
            }
        }
        panic!("the watch ended before ADDED {name}");
    };
    tokio::time::timeout(Duration::from_secs(30), wait)
        .await
        .unwrap_or_else(|_| panic!("no ADDED {name} within 30 s"));
}

/// A renamed or dropped metric must not leave a panel empty: every metric the dashboard
/// reads is on the `/metrics` of a live fleet of two kcache replicas (an owner and a
/// mirror) that served cached and proxied reads, watches, writes and refusals, except
/// the few that only a fault produces ([`EXPORTED_ONLY_AFTER_A_FAULT`]).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dashboard_queries_read_metrics_a_live_kcache_exports() {
    let d = dashboard();
    let queries = dashboard_queries(&d);
    let (names, histograms) = metric_names(&queries);
    assert!(
        names.len() >= 25,
        "the dashboard reads only {} metrics: {names:?}",
        names.len()
    );
    let sources = sources();
    for (name, why) in EXPORTED_ONLY_AFTER_A_FAULT {
        assert!(
            names.contains(*name),
            "{name} is allowed to be missing ({why}) but the dashboard does not read it: drop it from the list"
        );
        assert!(
            sources.contains(&format!("\"{name}\"")),
            "{name} is allowed to be missing ({why}) but kcache does not define it"
        );
    }

    let cluster = TestCluster::start().await;
    let mut nats = Nats::start(cluster.dir_path());
    // `a` owns the key: one watch per user (so a second one is refused with 429), a
    // window of 3 events (so an older resourceVersion expires), 64 KiB bodies (so a
    // larger one is refused). `b` mirrors it, may hold a single key (so a second one is
    // refused), and falls back to its own upstream watch 2 s after losing NATS.
    let dir = cluster.dir_path();
    let toml_a = format!(
        "[server]\nmax_watches_per_user = 1\nmax_request_body_bytes = 65536\n\n{}",
        fleet_toml(dir, &nats, "").replacen("[cache]\n", "[cache]\nwindow_capacity = 3\n", 1)
    );
    let toml_b = fleet_toml(dir, &nats, "fallback_after_ms = 2000").replacen(
        "[cache]\n",
        "[cache]\nmax_keys = 1\n",
        1,
    );
    let a = Kcache::start_with_admin_port(&cluster, &toml_a, &["--replica-id", "a"]).await;
    let b = Kcache::start_with_admin_port(&cluster, &toml_b, &["--replica-id", "b"]).await;

    // The user `viewer` may read ConfigMaps (a role of our own: the bootstrap `view` role
    // is aggregated by the controller manager, which the test cluster does not run).
    support::create_as_admin(
        &cluster,
        "/apis/rbac.authorization.k8s.io/v1/clusterroles",
        json!({
            "metadata": {"name": "kcache-test-configmap-reader"},
            "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list", "watch"]}],
        }),
    )
    .await;
    support::create_as_admin(
        &cluster,
        "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
        json!({
            "metadata": {"name": "kcache-test-configmap-reader"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "kcache-test-configmap-reader"},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "viewer"}],
        }),
    )
    .await;
    let admin = cluster.kube_client().await;
    support::create_namespace(&admin, NS).await;
    support::create_as_admin(
        &cluster,
        &format!("/api/v1/namespaces/{NS}/secrets"),
        json!({"metadata": {"name": "s1"}, "stringData": {"v": "secret"}}),
    )
    .await;
    support::create_as_admin(
        &cluster,
        &format!("/api/v1/namespaces/{NS}/configmaps"),
        json!({"metadata": {"name": "c0"}, "data": {"v": "0"}}),
    )
    .await;
    let http = insecure_http();
    let configmaps = format!("/api/v1/namespaces/{NS}/configmaps");

    // A cached list (which makes `a` the key's owner) and a get.
    let resp = send(
        http.get(format!("{}{configmaps}?resourceVersion=0", a.url)),
        ADMIN_TOKEN,
    )
    .await;
    assert_eq!(resp.status().as_u16(), 200, "cached list");
    let list: Value = resp.json().await.expect("list");
    let list_rv = list["metadata"]["resourceVersion"]
        .as_str()
        .expect("list resourceVersion")
        .to_string();
    let resp = send(
        http.get(format!("{}/api/v1/namespaces/{NS}/secrets/s1", a.url)),
        ADMIN_TOKEN,
    )
    .await;
    assert_eq!(resp.status().as_u16(), 200, "get");
    eventually("a owns the key", Duration::from_secs(30), || async {
        a.role(&configmaps).await == "owner"
    })
    .await;

    // A watch, and a second one of the same user refused with 429.
    let mut watch_a = open_watch(&a, &format!("resourceVersion={list_rv}"), ADMIN_TOKEN).await;
    let resp = send(
        http.get(format!("{}{configmaps}?watch=1&resourceVersion=0", a.url)),
        ADMIN_TOKEN,
    )
    .await;
    assert_eq!(resp.status().as_u16(), 429, "a watch past the user's cap");
    drop(resp);

    // Proxied writes, whose events reach the watch.
    let c1_rv = create_configmap(&a, "c1", "1").await;
    for i in 2..=5 {
        create_configmap(&a, &format!("c{i}"), &i.to_string()).await;
    }
    for i in 1..=5 {
        until_added(&mut watch_a, &format!("c{i}")).await;
    }

    // A watch from before the window (c2..c5 since c1, the window holds 3): 410 Expired.
    let mut expired = open_watch(&a, &format!("resourceVersion={c1_rv}"), "viewertoken").await;
    let ev = tokio::time::timeout(Duration::from_secs(30), expired.recv())
        .await
        .expect("an answer to the expired watch within 30 s")
        .expect("an event");
    assert_eq!(ev["type"], "ERROR", "{ev}");
    assert_eq!(ev["object"]["code"], 410, "{ev}");

    // A read kcache cannot serve (protobuf), and a write over the body limit (413).
    let resp = send(
        http.get(format!("{}{configmaps}", a.url))
            .header("accept", "application/vnd.kubernetes.protobuf"),
        ADMIN_TOKEN,
    )
    .await;
    assert_eq!(resp.status().as_u16(), 200, "protobuf list (proxied)");
    let resp = send(
        http.post(format!("{}{configmaps}", a.url))
            .json(&json!({"metadata": {"name": "big"}, "data": {"v": "x".repeat(100 * 1024)}})),
        ADMIN_TOKEN,
    )
    .await;
    assert_eq!(resp.status().as_u16(), 413, "a body over the limit");

    // `b` mirrors the key: its watch gets the owner's events over NATS.
    let mut watch_b = open_watch(&b, "resourceVersion=0", ADMIN_TOKEN).await;
    eventually("b mirrors the key", Duration::from_secs(30), || async {
        b.role(&configmaps).await == "mirror"
    })
    .await;
    create_configmap(&a, "c6", "6").await;
    until_added(&mut watch_a, "c6").await;
    until_added(&mut watch_b, "c6").await;
    // A second key on `b` is past its budget: the list is proxied.
    let resp = send(
        http.get(format!(
            "{}/api/v1/namespaces/{NS}/secrets?resourceVersion=0",
            b.url
        )),
        ADMIN_TOKEN,
    )
    .await;
    assert_eq!(resp.status().as_u16(), 200, "list past the key budget");

    // NATS goes away: `b` watches upstream itself.
    nats.kill9();
    eventually(
        "b falls back to its own upstream watch",
        Duration::from_secs(30),
        || async { b.role(&configmaps).await == "local" },
    )
    .await;

    let scrapes = [a.metrics_text().await, b.metrics_text().await];
    let allowed: BTreeSet<&str> = EXPORTED_ONLY_AFTER_A_FAULT
        .iter()
        .map(|(n, _)| *n)
        .collect();
    let missing: Vec<&String> = names
        .iter()
        .filter(|n| !allowed.contains(n.as_str()))
        .filter(|n| {
            !scrapes
                .iter()
                .any(|s| exports(s, n, histograms.contains(n.as_str())))
        })
        .collect();
    assert!(
        missing.is_empty(),
        "the dashboard reads metrics a live kcache does not export: {missing:?}"
    );
    drop((watch_a, watch_b, expired));
}
