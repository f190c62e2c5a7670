//! The operator's side: kcache's alert rules (`deploy/observability/alerts.yaml`) are
//! valid Prometheus rules, fire as their unit tests say (`promtool test rules`), and
//! read only metrics kcache defines; its Grafana dashboard
//! (`deploy/observability/dashboard.json`) reads only metrics a live kcache exports.

mod support;

use std::collections::{BTreeMap, BTreeSet};
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
/// mirror) that served cached and proxied reads, watches, writes and refusals (fault
/// counters exist from start: [`alert_and_dashboard_series_exist_from_start`]).
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
    let missing: Vec<&String> = names
        .iter()
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

/// The PromQL expressions of the alert rules: each `expr:` of alerts.yaml, on its line or
/// as a block (`expr: |`) on the more indented lines that follow.
fn alert_queries() -> Vec<String> {
    let rules = std::fs::read_to_string(observability().join("alerts.yaml")).expect("alerts.yaml");
    let lines: Vec<&str> = rules.lines().collect();
    let indent = |l: &str| l.len() - l.trim_start().len();
    let mut out = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let Some(rest) = line.trim_start().strip_prefix("expr:") else {
            continue;
        };
        let rest = rest.trim();
        if rest.starts_with('|') || rest.starts_with('>') {
            let block: Vec<&str> = lines[i + 1..]
                .iter()
                .take_while(|l| l.trim().is_empty() || indent(l) > indent(line))
                .map(|l| l.trim())
                .collect();
            out.push(block.join(" "));
        } else {
            out.push(rest.trim_matches(|c| c == '"' || c == '\'').to_string());
        }
    }
    out
}

/// The series `queries` select, by metric name (a histogram's `_bucket`, `_sum` and
/// `_count` under its own, as [`metric_names`]): for each selector, the label values it
/// matches exactly (`name{label="value"}`; regex matchers and Grafana's `$variables` name
/// no particular value, so select any series).
fn selected_series(queries: &[String]) -> BTreeMap<String, BTreeSet<Vec<(String, String)>>> {
    let (_, histograms) = metric_names(queries);
    let selector = regex::Regex::new(r"\b((?:kcache|process)_[A-Za-z0-9_:]*)\s*(?:\{([^}]*)\})?")
        .expect("selector regex");
    let matcher = regex::Regex::new(r#"([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!=|!~|=)\s*"([^"]*)""#)
        .expect("matcher regex");
    let mut out: BTreeMap<String, BTreeSet<Vec<(String, String)>>> = BTreeMap::new();
    for q in queries {
        for c in selector.captures_iter(q) {
            let mut name = c[1].to_string();
            for suffix in ["_bucket", "_sum", "_count"] {
                if let Some(base) = name.strip_suffix(suffix) {
                    if histograms.contains(base) {
                        name = base.to_string();
                        break;
                    }
                }
            }
            let labels: Vec<(String, String)> = c
                .get(2)
                .map(|m| {
                    matcher
                        .captures_iter(m.as_str())
                        .filter(|m| &m[2] == "=" && !m[3].contains('$'))
                        .map(|m| (m[1].to_string(), m[3].to_string()))
                        .collect()
                })
                .unwrap_or_default();
            out.entry(name).or_default().insert(labels);
        }
    }
    out
}

/// One sample of a scrape: its metric (a histogram's under the histogram's name, without
/// `le`), labels and value.
struct Sample {
    name: String,
    labels: BTreeMap<String, String>,
    value: f64,
}

/// Reads Prometheus text.
fn samples(scrape: &str) -> Vec<Sample> {
    let histograms: BTreeSet<&str> = scrape
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.strip_suffix(" histogram"))
        .collect();
    let mut out = Vec::new();
    for line in scrape
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let (series, value) = line.rsplit_once(' ').expect("a sample line: series value");
        let (mut name, labels) = match series.split_once('{') {
            Some((n, rest)) => (n.to_string(), parse_labels(rest.trim_end_matches('}'))),
            None => (series.to_string(), BTreeMap::new()),
        };
        for suffix in ["_bucket", "_sum", "_count"] {
            if let Some(base) = name.strip_suffix(suffix) {
                if histograms.contains(base) {
                    name = base.to_string();
                    break;
                }
            }
        }
        let mut labels = labels;
        labels.remove("le");
        out.push(Sample {
            name,
            labels,
            value: value.parse().unwrap_or(f64::NAN),
        });
    }
    out
}

/// `a="x",b="y"` (values with Prometheus' `\"`, `\\` and `\n` escapes).
fn parse_labels(text: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut rest = text;
    while let Some((name, after)) = rest.split_once("=\"") {
        let mut value = String::new();
        let mut chars = after.char_indices();
        let mut end = after.len();
        while let Some((i, c)) = chars.next() {
            match c {
                '\\' => match chars.next() {
                    Some((_, 'n')) => value.push('\n'),
                    Some((_, e)) => value.push(e),
                    None => {}
                },
                '"' => {
                    end = i + 1;
                    break;
                }
                c => value.push(c),
            }
        }
        out.insert(name.trim_matches([',', ' ']).to_string(), value);
        rest = &after[end..];
    }
    out
}

/// Whether `samples` hold a series of `name` with (at least) `labels`.
fn has_series(samples: &[Sample], name: &str, labels: &[(String, String)]) -> bool {
    samples.iter().any(|s| {
        s.name == name
            && labels
                .iter()
                .all(|(k, v)| s.labels.get(k).is_some_and(|x| x == v))
    })
}

/// A label and the values it is registered with.
type LabelValues = (&'static str, &'static [&'static str]);

/// `resource` in [`REGISTERED_AT_START`]: each cached resource, with its `group`.
const EACH_RESOURCE: LabelValues = ("resource", &["*"]);

/// What a fresh replica caches (`[[resources]]` left to its defaults), as `group, resource`.
const CACHED_RESOURCES: &[(&str, &str)] = &[
    ("", "secrets"),
    ("", "configmaps"),
    ("", "pods"),
    ("", "services"),
    ("", "endpoints"),
    ("", "namespaces"),
    ("discovery.k8s.io", "endpointslices"),
];

/// The labelled series the alerts and the dashboard read, with the label values a replica
/// registers them at zero with from its start (its per-resource ones once discovery has
/// named the cached resources, before it is ready): every combination of the values
/// listed. Without them the first fault of a kind would create its series, which
/// `rate()` and `increase()` do not count, and panels would show "no data".
const REGISTERED_AT_START: &[(&str, &[LabelValues])] = &[
    ("kcache_upstream_errors_total", &[EACH_RESOURCE]),
    ("kcache_upstream_lists_total", &[EACH_RESOURCE]),
    ("kcache_terminated_watchers_total", &[EACH_RESOURCE]),
    (
        "kcache_watcher_dispatch_waits_total",
        &[("outcome", &["caught_up", "closed", "no_budget"])],
    ),
    ("kcache_watch_expired_total", &[EACH_RESOURCE]),
    ("kcache_keys_refused_total", &[EACH_RESOURCE]),
    ("kcache_watch_cache_events_received_total", &[EACH_RESOURCE]),
    (
        "kcache_watch_cache_events_dispatched_total",
        &[EACH_RESOURCE],
    ),
    ("kcache_watch_event_delivery_seconds", &[EACH_RESOURCE]),
    ("kcache_registered_watchers", &[EACH_RESOURCE]),
    (
        "kcache_cache_bypassed_total",
        &[
            EACH_RESOURCE,
            (
                "reason",
                &[
                    "query",
                    "accept",
                    "selector",
                    "name",
                    "rv",
                    "history",
                    "key_budget",
                    "not_ready",
                    "not_fresh",
                    "protobuf",
                    "table",
                ],
            ),
        ],
    ),
    (
        "kcache_watches_rejected_total",
        &[("reason", &["replica_limit", "user_limit"])],
    ),
    (
        "kcache_proxy_rejected_total",
        &[(
            "reason",
            &[
                "readonly_inflight",
                "mutating_inflight",
                "long_running_inflight",
                "body_too_large",
            ],
        )],
    ),
    (
        "kcache_proxy_inflight_requests",
        &[("kind", &["readonly", "mutating", "long_running"])],
    ),
    (
        "kcache_auth_reviews_total",
        &[
            ("review", &["TokenReview"]),
            ("result", &["authenticated", "unauthenticated", "error"]),
        ],
    ),
    (
        "kcache_auth_reviews_total",
        &[
            ("review", &["SubjectAccessReview"]),
            ("result", &["allowed", "denied", "error"]),
        ],
    ),
    (
        "kcache_auth_review_duration_seconds",
        &[("review", &["TokenReview", "SubjectAccessReview"])],
    ),
    (
        "kcache_auth_cache_requests_total",
        &[("cache", &["token", "authz"]), ("result", &["hit", "miss"])],
    ),
    (
        "kcache_fleet_ownership_changes_total",
        &[(
            "change",
            &["acquired", "lost", "taken-over", "recreated", "handed-over"],
        )],
    ),
    (
        "kcache_fleet_resyncs_total",
        &[("reason", &["start", "gap", "new-owner", "retry"])],
    ),
];

/// Labelled metrics the alerts and the dashboard read whose label values the test cannot
/// list, with why; those made by requests (`true`) are only looked for after traffic.
const LABELS_NOT_KNOWN_AHEAD: &[(&str, bool, &str)] = &[
    (
        "kcache_requests_total",
        true,
        "by verb, group, resource, code and served of the requests answered: the first request of a kind makes its series",
    ),
    (
        "kcache_request_duration_seconds",
        true,
        "by verb, group, resource and served of the requests answered",
    ),
    (
        "kcache_proxied_requests_total",
        true,
        "by the status code the API server answered",
    ),
    (
        "kcache_build_info",
        false,
        "labelled with the build's version and revision (set at start, always 1)",
    ),
];

/// Metrics only a fleet replica (`--nats`) exports: a replica outside a fleet must not
/// read as disconnected from NATS (`KcacheNatsDisconnected`), nor show fleet panels at 0.
const FLEET_ONLY_PREFIXES: &[&str] = &["kcache_nats_", "kcache_fleet_"];

/// The fault counters of issue 27: 0 on a replica that has only served ordinary traffic.
const FAULTS: &[&str] = &[
    "kcache_terminated_watchers_total",
    "kcache_watch_expired_total",
    "kcache_keys_refused_total",
    "kcache_watches_rejected_total",
    "kcache_proxy_rejected_total",
    "kcache_upstream_errors_total",
];

/// The label sets of [`REGISTERED_AT_START`]'s `metric` rows: every combination, each
/// cached resource for [`EACH_RESOURCE`].
fn registered_label_sets(metric: &str) -> Vec<Vec<(String, String)>> {
    let mut out = Vec::new();
    for (_, labels) in REGISTERED_AT_START.iter().filter(|(m, _)| *m == metric) {
        let mut sets: Vec<Vec<(String, String)>> = vec![Vec::new()];
        for (label, values) in labels.iter() {
            let mut next = Vec::new();
            for set in &sets {
                if (*label, *values) == EACH_RESOURCE {
                    for (group, resource) in CACHED_RESOURCES {
                        let mut s = set.clone();
                        s.push(("group".into(), group.to_string()));
                        s.push(("resource".into(), resource.to_string()));
                        next.push(s);
                    }
                } else {
                    for v in values.iter() {
                        let mut s = set.clone();
                        s.push((label.to_string(), v.to_string()));
                        next.push(s);
                    }
                }
            }
            sets = next;
        }
        out.extend(sets);
    }
    out
}

/// Asserts that `scrape` of replica `who` holds every series of `read` (metric name →
/// label sets the queries select) that a replica of its kind (`fleet` or not) exports, and
/// every series [`REGISTERED_AT_START`] lists; with `traffic`, also those only requests
/// make ([`LABELS_NOT_KNOWN_AHEAD`]). The fault counters read 0.
fn assert_series(
    who: &str,
    scrape: &str,
    read: &BTreeMap<String, BTreeSet<Vec<(String, String)>>>,
    fleet: bool,
    traffic: bool,
) {
    let samples = samples(scrape);
    let exported_here =
        |name: &str| fleet || !FLEET_ONLY_PREFIXES.iter().any(|p| name.starts_with(p));
    let mut missing = Vec::new();
    for (name, selections) in read {
        if !exported_here(name) {
            continue;
        }
        let not_known = LABELS_NOT_KNOWN_AHEAD.iter().find(|(n, _, _)| n == name);
        if not_known.is_some_and(|(_, by_requests, _)| *by_requests) && !traffic {
            continue;
        }
        for labels in selections {
            if !has_series(&samples, name, labels) {
                missing.push(format!(
                    "{name}{labels:?} (read by the alerts or dashboard)"
                ));
            }
        }
        for labels in registered_label_sets(name) {
            if !has_series(&samples, name, &labels) {
                missing.push(format!("{name}{labels:?} (registered at start)"));
            }
        }
        // A labelled metric must have its label values registered, or say why it cannot.
        let labelled = samples
            .iter()
            .any(|s| s.name == *name && !s.labels.is_empty());
        if labelled && not_known.is_none() && !REGISTERED_AT_START.iter().any(|(n, _)| n == name) {
            missing.push(format!(
                "{name} is labelled but its label values are neither in REGISTERED_AT_START nor in LABELS_NOT_KNOWN_AHEAD"
            ));
        }
    }
    assert!(
        missing.is_empty(),
        "{who}: the alerts and the dashboard read series the replica does not export:\n{}",
        missing.join("\n")
    );
    let faults: Vec<String> = samples
        .iter()
        .filter(|s| FAULTS.contains(&s.name.as_str()) && s.value != 0.0)
        .map(|s| format!("{}{:?} = {}", s.name, s.labels, s.value))
        .collect();
    assert!(
        faults.is_empty(),
        "{who}: fault counters moved on ordinary traffic: {faults:?}"
    );
}

/// Ordinary traffic through `k`: a cached list at resourceVersion=0, a watch from it, a
/// proxied write whose event the watch delivers.
async fn ordinary_traffic(k: &Kcache, name: &str) {
    let resp = send(
        insecure_http().get(format!(
            "{}/api/v1/namespaces/{NS}/configmaps?resourceVersion=0",
            k.url
        )),
        ADMIN_TOKEN,
    )
    .await;
    assert_eq!(resp.status().as_u16(), 200, "cached list");
    let list: Value = resp.json().await.expect("list");
    let rv = list["metadata"]["resourceVersion"]
        .as_str()
        .expect("list resourceVersion")
        .to_string();
    let mut watch = open_watch(k, &format!("resourceVersion={rv}"), ADMIN_TOKEN).await;
    create_configmap(k, name, "1").await;
    until_added(&mut watch, name).await;
}

/// Issue 27: alerts must see the first fault. Every series `alerts.yaml` and
/// `dashboard.json` read (names and exact label values parsed from their expressions)
/// exists on a freshly started replica — a plain one and a fleet one — at 0 for each of its
/// known label values ([`REGISTERED_AT_START`]) before any request, and every other after
/// ordinary traffic; so a new alert or panel on a series kcache only creates at its first
/// increment fails here.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn alert_and_dashboard_series_exist_from_start() {
    let mut queries = alert_queries();
    assert!(queries.len() >= 10, "alerts.yaml expressions: {queries:?}");
    queries.extend(dashboard_queries(&dashboard()));
    let read = selected_series(&queries);
    assert!(read.len() >= 30, "the files read only {read:?}");
    let listed = REGISTERED_AT_START
        .iter()
        .map(|(n, _)| n)
        .chain(LABELS_NOT_KNOWN_AHEAD.iter().map(|(n, _, _)| n));
    for name in listed {
        assert!(
            read.contains_key(*name),
            "{name} is listed here but neither the alerts nor the dashboard read it: drop it"
        );
    }
    assert!(
        read.get("kcache_auth_reviews_total")
            .is_some_and(|s| s.contains(&vec![("result".to_string(), "error".to_string())])),
        "the selectors' label values are not read: {read:?}"
    );

    let cluster = TestCluster::start().await;
    let nats = Nats::start(cluster.dir_path());
    let plain = Kcache::start_with_admin_port(&cluster, "", &[]).await;
    let fleet_toml = fleet_toml(cluster.dir_path(), &nats, "");
    let fleet = Kcache::start_with_admin_port(&cluster, &fleet_toml, &["--replica-id", "f"]).await;

    // From start, before any request.
    assert_series(
        "plain replica at start",
        &plain.metrics_text().await,
        &read,
        false,
        false,
    );
    assert_series(
        "fleet replica at start",
        &fleet.metrics_text().await,
        &read,
        true,
        false,
    );

    let admin = cluster.kube_client().await;
    support::create_namespace(&admin, NS).await;
    ordinary_traffic(&plain, "p1").await;
    ordinary_traffic(&fleet, "f1").await;
    assert_series(
        "plain replica after traffic",
        &plain.metrics_text().await,
        &read,
        false,
        true,
    );
    assert_series(
        "fleet replica after traffic",
        &fleet.metrics_text().await,
        &read,
        true,
        true,
    );
    drop(nats);
}
