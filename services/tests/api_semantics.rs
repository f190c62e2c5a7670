//! Watch and read semantics of the cache against a real API server: resourceVersion
//! rules, in-stream 410, sendInitialEvents, bad input as Status codes, slow consumers.

mod support;

use std::time::{Duration, Instant};

use serde_json::Value;
use support::http::{put_secret, Events, Http};
use support::kcache::Kcache;
use support::{eventually, TestCluster, ADMIN_TOKEN};

const TOKEN: &str = ADMIN_TOKEN;

async fn next_event(rx: &mut Events) -> Value {
    tokio::time::timeout(Duration::from_secs(20), rx.recv())
        .await
        .expect("an event within 20 s")
        .expect("stream open")
}

async fn admin(cluster: &TestCluster) -> kube::Client {
    cluster.kube_client().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_status_codes_and_kcache_keeps_serving() {
    let cluster = TestCluster::start().await;
    let k = Kcache::start(&cluster, "").await;
    let http = Http::new(&k.url);
    put_secret(&admin(&cluster).await, "default", "s0", "v").await;
    let cases: Vec<(&str, Option<&str>, u16)> = vec![
        // No credentials: system:anonymous, which RBAC forbids (as the API server answers).
        ("/api/v1/namespaces/default/secrets?resourceVersion=0", None, 403),
        ("/api/v1/namespaces/default/secrets?resourceVersion=0", Some("not-a-token"), 401),
        ("/api/v1/namespaces/default/secrets?resourceVersion=0&labelSelector=a%20in%20(", Some(TOKEN), 400),
        ("/api/v1/namespaces/default/secrets?resourceVersion=0&labelSelector=!!x", Some(TOKEN), 400),
        ("/api/v1/namespaces/default/secrets?resourceVersion=0&fieldSelector=spec.nodeName%3Dx", Some(TOKEN), 400),
        ("/api/v1/namespaces/default/secrets?watch=1&fieldSelector=bogus", Some(TOKEN), 400),
        // A resourceVersion that is not a number: the storage's error, 500 for a watch (and a
        // get by name), 400 for a list.
        ("/api/v1/namespaces/default/secrets?watch=1&resourceVersion=abc", Some(TOKEN), 500),
        ("/api/v1/namespaces/default/secrets/s0?resourceVersion=abc", Some(TOKEN), 500),
        ("/api/v1/namespaces/default/secrets?resourceVersion=abc", Some(TOKEN), 400),
        ("/api/v1/namespaces/default/secrets?resourceVersion=99999999999999999999999", Some(TOKEN), 400),
        // ListOptions validation: 422, every error in one message.
        ("/api/v1/namespaces/default/secrets?watch=1&resourceVersion=0&resourceVersionMatch=NotOlderThan", Some(TOKEN), 422),
        ("/api/v1/namespaces/default/secrets?watch=1&sendInitialEvents=true", Some(TOKEN), 422),
        ("/api/v1/namespaces/default/secrets?watch=1&sendInitialEvents=true&resourceVersionMatch=Exact&resourceVersion=1", Some(TOKEN), 422),
        ("/api/v1/namespaces/default/secrets?watch=1&resourceVersion=abc&resourceVersionMatch=Bogus", Some(TOKEN), 422),
        ("/api/v1/namespaces/default/secrets?resourceVersionMatch=Bogus", Some(TOKEN), 422),
        ("/api/v1/namespaces/default/secrets?resourceVersion=0&sendInitialEvents=false", Some(TOKEN), 422),
        ("/api/v1/namespaces/default/secrets?watch=1&timeoutSeconds=x", Some(TOKEN), 400),
        ("/api/v1/namespaces/default/secrets?resourceVersion=0&limit=", Some(TOKEN), 400),
        ("/api/v1/namespaces/default/secrets?resourceVersion=0&fieldSelector=involvedObject.name%3Dx", Some(TOKEN), 400),
        ("/api/v1/namespaces?resourceVersion=0&fieldSelector=metadata.namespace%3Dx", Some(TOKEN), 400),
        ("/api/v1/namespaces/default/secrets?resourceVersion=0&resourceVersionMatch=Exact", Some(TOKEN), 422),
        ("/api/v1/namespaces/default/frobnicators", Some(TOKEN), 404),
        ("/api/v1/namespaces/default/secrets/missing?resourceVersion=0", Some(TOKEN), 404),
    ];
    // Every difference at once, so one run shows them all.
    let mut differences = Vec::new();
    for (path, token, want) in cases {
        let (code, body) = http.get(path, token).await;
        assert_eq!(code, want, "{path}: {body}");
        assert_eq!(body["kind"], "Status", "{path}: {body}");
        assert_eq!(body["code"], want, "{path}: {body}");
        // The API server's answer to the same request: the same code, the same words.
        let (upstream, upstream_body) = Http::new(&cluster.url).get(path, token).await;
        assert_eq!(upstream, want, "API server: {path}: {upstream_body}");
        for field in ["message", "reason", "details"] {
            if body[field] != upstream_body[field] {
                differences.push(format!(
                    "{path}: {field}\n  kcache:     {}\n  API server: {}",
                    body[field], upstream_body[field]
                ));
            }
        }
    }
    assert!(
        differences.is_empty(),
        "{} differences from the API server:\n{}",
        differences.len(),
        differences.join("\n")
    );
    // Answered as the API server converts parameters: any value but 0/false turns a watch
    // on, a negative timeoutSeconds ends it at once, a negative limit is no limit, and a
    // pair with `;` is dropped (Go's query parser).
    for path in [
        "/api/v1/namespaces/default/secrets?watch=maybe&timeoutSeconds=-4",
        "/api/v1/namespaces/default/secrets?watch=&timeoutSeconds=-1",
        "/api/v1/namespaces/default/secrets?resourceVersion=0&limit=-5",
        "/api/v1/namespaces/default/secrets?resourceVersion=0;limit=x",
        "/api/v1/namespaces/default/secrets?resourceVersion=0&labelSelector=a%20in%20()",
        // A GET by name ignores list parameters.
        "/api/v1/namespaces/default/secrets/s0?resourceVersion=0&limit=x&labelSelector=!!&watch=1",
    ] {
        let (code, body) = http.get(path, Some(TOKEN)).await;
        let (upstream, _) = Http::new(&cluster.url).get(path, Some(TOKEN)).await;
        assert_eq!((code, upstream), (200, 200), "{path}: {body}");
    }
    // An unknown group is proxied: the answer is the API server's own (a plain-text 404).
    let (code, _) = http
        .get("/apis/nope.example.com/v1/things", Some(TOKEN))
        .await;
    let direct = support::insecure_http()
        .get(format!("{}/apis/nope.example.com/v1/things", cluster.url))
        .bearer_auth(TOKEN)
        .send()
        .await
        .expect("direct request");
    assert_eq!(code, direct.status().as_u16());
    assert_eq!(code, 404);
    let (_, body) = http
        .get(
            "/api/v1/namespaces/default/secrets?resourceVersion=0&fieldSelector=spec.nodeName%3Dx",
            Some(TOKEN),
        )
        .await;
    assert_eq!(body["message"], "field label not supported: spec.nodeName");
    // An Accept header with nothing kcache can send goes to the API server, which answers
    // it (here: protobuf).
    let resp = support::insecure_http()
        .get(format!(
            "{}/api/v1/namespaces/default/secrets?resourceVersion=0",
            k.url
        ))
        .bearer_auth(TOKEN)
        .header("Accept", "application/vnd.kubernetes.protobuf")
        .send()
        .await
        .expect("request");
    assert_eq!(resp.status().as_u16(), 200);
    assert_eq!(
        resp.headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok()),
        Some("application/vnd.kubernetes.protobuf")
    );
    // The largest timeoutSeconds whose nanoseconds fit Go's int64 (292 years) is a watch
    // like any other (a deadline computed naively from it would overflow `Instant` inside
    // the watcher).
    let resp = support::insecure_http()
        .get(format!(
            "{}/api/v1/namespaces?watch=1&resourceVersion=0&timeoutSeconds={}",
            k.url,
            i64::MAX / 1_000_000_000
        ))
        .bearer_auth(TOKEN)
        .send()
        .await
        .expect("watch");
    assert_eq!(resp.status().as_u16(), 200);
    let mut first = None;
    tokio::time::timeout(
        Duration::from_secs(20),
        support::for_each_event(resp, |ev| {
            first = Some(ev);
            false
        }),
    )
    .await
    .expect("a watch with the largest timeoutSeconds delivers its initial events");
    let first = first.expect("an event");
    assert_eq!(first["type"], "ADDED", "{first}");
    let (code, _) = http.get("/livez", None).await;
    assert_eq!(code, 200);
    let (code, body) = http
        .get(
            "/api/v1/namespaces/default/secrets?resourceVersion=0",
            Some(TOKEN),
        )
        .await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(body["kind"], "SecretList");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_resource_version_semantics() {
    let cluster = TestCluster::start().await;
    // A small window so an old RV falls out of it quickly.
    let k = Kcache::start(&cluster, "[cache]\nwindow_capacity = 5\n").await;
    let http = Http::new(&k.url);
    let admin = admin(&cluster).await;
    support::create_namespace(&admin, "rv").await;
    let rv0: u64 = put_secret(&admin, "rv", "s", "0")
        .await
        .parse()
        .expect("rv");

    // RV=0: the current state as ADDED, then live events.
    let (code, mut w0) = http
        .watch("/api/v1/namespaces/rv/secrets?watch=1&resourceVersion=0&fieldSelector=metadata.name%3Ds")
        .await;
    assert_eq!(code, 200);
    let first = next_event(&mut w0).await;
    assert_eq!(first["type"], "ADDED");
    assert_eq!(
        first["object"]["metadata"]["resourceVersion"],
        rv0.to_string()
    );
    let mut rvs = vec![rv0];
    for i in 1..=8 {
        rvs.push(
            put_secret(&admin, "rv", "s", &i.to_string())
                .await
                .parse()
                .expect("rv"),
        );
    }
    for want in &rvs[1..] {
        let ev = next_event(&mut w0).await;
        assert_eq!(ev["type"], "MODIFIED");
        assert_eq!(
            ev["object"]["metadata"]["resourceVersion"],
            want.to_string()
        );
    }

    // From an RV inside the window: exactly the events after it.
    let (code, mut w1) = http
        .watch(&format!("/api/v1/namespaces/rv/secrets?watch=1&resourceVersion={}&fieldSelector=metadata.name%3Ds", rvs[6]))
        .await;
    assert_eq!(code, 200);
    for want in &rvs[7..] {
        let ev = next_event(&mut w1).await;
        assert_eq!(
            ev["object"]["metadata"]["resourceVersion"],
            want.to_string()
        );
    }

    // From an RV older than the window: HTTP 200 and an in-stream 410 Expired.
    let (code, mut w2) = http
        .watch(&format!("/api/v1/namespaces/rv/secrets?watch=1&resourceVersion={rv0}&fieldSelector=metadata.name%3Ds"))
        .await;
    assert_eq!(code, 200);
    let ev = next_event(&mut w2).await;
    assert_eq!(ev["type"], "ERROR", "{ev}");
    assert_eq!(ev["object"]["code"], 410);
    assert_eq!(ev["object"]["reason"], "Expired");

    // From an RV newer than anything yet: accepted, nothing at or below it is delivered,
    // bookmarks never go below it.
    let future = rvs[8] + 1000;
    let (code, mut w3) = http
        .watch(&format!("/api/v1/namespaces/rv/secrets?watch=1&resourceVersion={future}&allowWatchBookmarks=true&timeoutSeconds=4&fieldSelector=metadata.name%3Ds"))
        .await;
    assert_eq!(code, 200);
    put_secret(&admin, "rv", "s", "late").await;
    // The watch times out after 4 s; its pre-timeout bookmark (if any) is at or above `future`.
    let deadline = Instant::now() + Duration::from_secs(15);
    while let Ok(Some(ev)) = tokio::time::timeout_at(deadline.into(), w3.recv()).await {
        let rv: u64 = ev["object"]["metadata"]["resourceVersion"]
            .as_str()
            .and_then(|s| s.parse().ok())
            .expect("rv");
        assert_eq!(
            ev["type"], "BOOKMARK",
            "no object event at or below {future}: {ev}"
        );
        assert!(rv >= future, "bookmark {rv} below the watch's RV {future}");
    }

    // sendInitialEvents: the state, then the initial-events-end bookmark.
    let (code, mut w4) = http
        .watch("/api/v1/namespaces/rv/secrets?watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true")
        .await;
    assert_eq!(code, 200);
    let ev = next_event(&mut w4).await;
    assert_eq!(ev["type"], "ADDED");
    let ev = next_event(&mut w4).await;
    assert_eq!(ev["type"], "BOOKMARK");
    assert_eq!(
        ev["object"]["metadata"]["annotations"]["k8s.io/initial-events-end"],
        "true"
    );

    // A list for an RV newer than the key's progress on a quiet key: the probe establishes
    // freshness instead of waiting for a bookmark the 1.20 upstream would not send.
    let latest: u64 = put_secret(&admin, "rv", "other", "x")
        .await
        .parse()
        .expect("rv");
    let (code, body) = http
        .get(&format!("/api/v1/namespaces/rv/secrets?resourceVersion={latest}&fieldSelector=metadata.name%3Ds"), Some(TOKEN))
        .await;
    assert_eq!(code, 200, "{body}");
    let list_rv: u64 = body["metadata"]["resourceVersion"]
        .as_str()
        .and_then(|s| s.parse().ok())
        .expect("rv");
    assert!(
        list_rv >= latest,
        "list RV {list_rv} older than requested {latest}"
    );
    // Far in the future: 504 Too large resource version.
    let (code, body) = http
        .get(
            &format!(
                "/api/v1/namespaces/rv/secrets?resourceVersion={}",
                latest + 1_000_000
            ),
            Some(TOKEN),
        )
        .await;
    assert_eq!(code, 504, "{body}");
    assert!(
        body["message"]
            .as_str()
            .unwrap_or("")
            .starts_with("Too large resource version"),
        "{body}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_never_reads_is_closed_without_delaying_others() {
    let cluster = TestCluster::start().await;
    let k = Kcache::start(&cluster, "[cache]\nwatcher_buffer = 4\n").await;
    let admin = admin(&cluster).await;
    support::create_namespace(&admin, "slow").await;
    put_secret(&admin, "slow", "big", "0").await;
    let base = format!(
        "{}/api/v1/namespaces/slow/secrets?watch=1&resourceVersion=0",
        k.url
    );
    // The slow client: opens the watch, never reads the body.
    let slow = support::insecure_http()
        .get(&base)
        .bearer_auth(TOKEN)
        .send()
        .await
        .expect("slow watch");
    assert_eq!(slow.status().as_u16(), 200);
    let http = Http::new(&k.url);
    let (_, mut fast) = http
        .watch("/api/v1/namespaces/slow/secrets?watch=1&resourceVersion=0")
        .await;
    assert_eq!(next_event(&mut fast).await["type"], "ADDED");
    let payload = "x".repeat(256 * 1024);
    let mut latencies = Vec::new();
    for i in 0..60 {
        let value = format!("{i}{payload}");
        let t = Instant::now();
        put_secret(&admin, "slow", "big", &value).await;
        let ev = next_event(&mut fast).await;
        latencies.push(t.elapsed());
        assert_eq!(ev["type"], "MODIFIED");
    }
    eventually(
        "the slow watcher is terminated",
        Duration::from_secs(20),
        || async { k.metric("kcache_terminated_watchers_total").await >= 1.0 },
    )
    .await;
    latencies.sort();
    println!(
        "fast watcher write->event latency with a stuck peer: p50 {:?} max {:?}",
        latencies[latencies.len() / 2],
        latencies[latencies.len() - 1]
    );
    // The slow client's stream was closed by kcache: reading it now ends.
    let body = tokio::time::timeout(Duration::from_secs(20), slow.bytes())
        .await
        .expect("the slow stream ends");
    let _ = body;
    drop(fast);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watches_past_the_per_user_cap_get_429_with_retry_after() {
    let cluster = TestCluster::start().await;
    let k = Kcache::start(
        &cluster,
        "[server]\nmax_watches_per_user = 2\n[cache]\nwatch_keepalive_secs = 1\n",
    )
    .await;
    let http = Http::new(&k.url);
    let path = "/api/v1/namespaces/default/configmaps?watch=1&resourceVersion=0";
    let (c1, w1) = http.watch(path).await;
    let (c2, _w2) = http.watch(path).await;
    assert_eq!((c1, c2), (200, 200));
    let resp = support::insecure_http()
        .get(format!("{}{path}", k.url))
        .bearer_auth(TOKEN)
        .send()
        .await
        .expect("third watch");
    assert_eq!(resp.status().as_u16(), 429);
    assert_eq!(
        resp.headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok()),
        Some("1")
    );
    let body: Value = resp.json().await.expect("status body");
    assert_eq!(body["reason"], "TooManyRequests");
    // Closing a watch frees its slot.
    drop(w1);
    eventually(
        "a closed watch frees its slot",
        Duration::from_secs(20),
        || async {
            support::insecure_http()
                .get(format!("{}{path}&timeoutSeconds=1", k.url))
                .bearer_auth(TOKEN)
                .send()
                .await
                .map(|r| r.status().as_u16() == 200)
                .unwrap_or(false)
        },
    )
    .await;
}

/// With `--admin-listen`, the API port is the API server's alone: its health endpoints
/// (what `kubectl get --raw /readyz?verbose` and Kubernetes' "health handlers" spec read)
/// and `/metrics` come from the API server, and kcache's own are on the admin port,
/// served without a TokenReview.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admin_port_leaves_the_api_servers_health_endpoints_to_it() {
    let cluster = TestCluster::start().await;
    let kc = Kcache::start_with_admin_port(&cluster, "", &[]).await;
    let http = support::insecure_http();
    let text = |base: String, path: &'static str, token: Option<&'static str>| {
        let http = http.clone();
        async move {
            let mut req = http.get(format!("{base}{path}"));
            if let Some(t) = token {
                req = req.bearer_auth(t);
            }
            let resp = req.send().await.expect("request");
            let code = resp.status().as_u16();
            (code, resp.text().await.unwrap_or_default())
        }
    };
    for path in ["/healthz?verbose", "/livez?verbose", "/readyz?verbose"] {
        let (up, up_body) = text(cluster.url.clone(), path, Some(TOKEN)).await;
        let (ours, body) = text(kc.url.clone(), path, Some(TOKEN)).await;
        assert_eq!((ours, up), (200, 200), "{path}: {body}");
        // The API server's own checks, e.g. `[+]etcd ok`.
        assert!(body.contains("[+]etcd ok"), "{path}: {body}");
        assert!(up_body.contains("[+]etcd ok"), "{path}: {up_body}");
    }
    let (code, body) = text(kc.url.clone(), "/metrics", Some(TOKEN)).await;
    assert_eq!(code, 200);
    assert!(
        body.contains("apiserver_request_total"),
        "the API server's /metrics"
    );
    assert!(
        !body.contains("kcache_"),
        "kcache's metrics on the API port"
    );
    // The admin port: kcache's own, with no credentials.
    let (code, body) = text(kc.admin_url.clone(), "/readyz", None).await;
    assert_eq!((code, body.as_str()), (200, "ok"));
    let (code, body) = text(kc.admin_url.clone(), "/metrics", None).await;
    assert_eq!(code, 200);
    assert!(body.contains("kcache_"), "{body}");
    // Key names are object names: still authorized there.
    let (code, _) = text(kc.admin_url.clone(), "/debug/keys", None).await;
    assert!(
        code == 401 || code == 403,
        "/debug/keys without credentials: {code}"
    );
    let (code, _) = text(kc.admin_url.clone(), "/debug/keys", Some(TOKEN)).await;
    assert_eq!(code, 200);
    // Nothing else: the Kubernetes API is not served there.
    let (code, _) = text(kc.admin_url.clone(), "/api/v1/secrets", Some(TOKEN)).await;
    assert_eq!(code, 404);
    // What an operator's dashboards read: the build, the process (RSS first), and
    // histograms as buckets, which aggregate across replicas (the TokenReview above).
    let (_, body) = text(kc.admin_url.clone(), "/metrics", None).await;
    assert!(body.contains("kcache_build_info{version=\""), "{body}");
    let rss = support::prom::sum_samples(&body, "process_resident_memory_bytes", None);
    assert!(rss > 1e6, "RSS {rss}");
    assert!(support::prom::sum_samples(&body, "process_open_fds", None) > 3.0);
    assert!(
        body.contains("kcache_auth_review_duration_seconds_bucket{"),
        "{body}"
    );
    assert!(!body.contains("quantile=\""), "summaries: {body}");
}

/// Reads of a deprecated resource (v1 Endpoints, since 1.33) carry the API server's
/// `Warning` header from kcache too — lists, gets, watches, and the errors of authorized
/// requests — and refused requests carry none, as upstream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_warnings_match_the_api_servers() {
    let cluster = TestCluster::start().await;
    let k = Kcache::start(&cluster, "").await;
    let http = support::insecure_http();
    let warnings = |base: String, path: &'static str, token: &'static str| {
        let http = http.clone();
        async move {
            let resp = http
                .get(format!("{base}{path}"))
                .bearer_auth(token)
                .timeout(Duration::from_secs(5))
                .send()
                .await
                .expect("request");
            let code = resp.status().as_u16();
            let w: Vec<String> = resp
                .headers()
                .get_all("warning")
                .iter()
                .map(|v| v.to_str().unwrap_or("").to_string())
                .collect();
            (code, w)
        }
    };
    let mut checked = 0;
    for (path, token) in [
        (
            "/api/v1/namespaces/default/endpoints?resourceVersion=0",
            TOKEN,
        ),
        (
            "/api/v1/namespaces/default/endpoints/kubernetes?resourceVersion=0",
            TOKEN,
        ),
        (
            "/api/v1/namespaces/default/endpoints/missing?resourceVersion=0",
            TOKEN,
        ),
        (
            "/api/v1/namespaces/default/endpoints?watch=1&timeoutSeconds=1",
            TOKEN,
        ),
        (
            "/api/v1/namespaces/default/endpoints?resourceVersion=0&resourceVersionMatch=Bogus",
            TOKEN,
        ),
        (
            "/api/v1/namespaces/default/endpoints?resourceVersion=0",
            "viewertoken",
        ),
        (
            "/api/v1/namespaces/default/secrets?resourceVersion=0",
            TOKEN,
        ),
    ] {
        let (up_code, up) = warnings(cluster.url.clone(), path, token).await;
        let (kc_code, ours) = warnings(k.url.clone(), path, token).await;
        assert_eq!(kc_code, up_code, "{path} as {token}");
        assert_eq!(ours, up, "{path} as {token}: Warning headers");
        checked += usize::from(!up.is_empty());
    }
    // Not vacuous: the reference API server does warn on Endpoints.
    assert!(
        checked >= 4,
        "the API server sent warnings on {checked} requests"
    );
    let m = k.metrics_text().await;
    assert!(
        support::prom::sum_samples(&m, "kcache_requests_total", Some("served=\"cache\"")) >= 4.0,
        "the Endpoints reads were served by kcache: {m}"
    );
}

/// One user's flood of cache-served reads fills that user's own queue for the cache's
/// seats (`server.cache_seats`): past it, 429 with Retry-After, counted by reason; another
/// user reading meanwhile waits at most a turn and gets the API server's answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_from_one_user_is_refused_from_its_own_queue_not_others() {
    let cluster = TestCluster::start().await;
    let audit_log = cluster.dir_path().join("audit.log");
    let k = Kcache::start(
        &cluster,
        &format!(
            "[server]\ncache_seats = 1\ncache_queue_per_user = 2\ncache_queue_wait_secs = 10\n\
             [audit]\npath = {:?}\nresources = [\"configmaps\"]\n",
            audit_log.display().to_string()
        ),
    )
    .await;
    let path = "/api/v1/namespaces/default/configmaps?resourceVersion=0";
    let get = |base: String, token: &'static str| async move {
        let r = Http::new(&base).reply(path, Some(token)).await;
        (r.code, r.retry_after, r.body)
    };
    // The key is synced before the flood.
    assert_eq!(get(k.url.clone(), TOKEN).await.0, 200);
    // What the API server answers the other user (whatever their rights).
    let calm_want = get(cluster.url.clone(), "viewertoken").await.0;
    let flood = futures::future::join_all((0..300).map(|_| get(k.url.clone(), TOKEN)));
    let calm = async {
        let mut codes = Vec::new();
        for _ in 0..20 {
            codes.push(get(k.url.clone(), "viewertoken").await.0);
        }
        codes
    };
    let (flood, calm) = tokio::join!(flood, calm);
    assert!(
        calm.iter().all(|c| *c == calm_want),
        "the other user's answers {calm:?}, the API server's {calm_want}"
    );
    let refused: Vec<_> = flood.iter().filter(|(c, _, _)| *c == 429).collect();
    assert!(
        flood.iter().all(|(c, _, _)| matches!(c, 200 | 429)),
        "{:?}",
        flood.iter().map(|f| f.0).collect::<Vec<_>>()
    );
    assert!(
        !refused.is_empty(),
        "a flood through one seat was never refused"
    );
    for (_, retry_after, body) in &refused {
        assert_eq!(retry_after.as_deref(), Some("1"));
        assert_eq!(body["reason"], "TooManyRequests", "{body}");
        assert!(
            body["message"].as_str().unwrap_or("").contains("\"admin\""),
            "{body}"
        );
    }
    let m = k.metrics_text().await;
    let counted = support::prom::sum_samples(
        &m,
        "kcache_cache_requests_rejected_total",
        Some("reason=\"queue_full\""),
    );
    assert!(
        counted >= refused.len() as f64,
        "{counted} counted, {} refused",
        refused.len()
    );
    // Every seat and queue place is given back.
    assert_eq!(
        support::prom::sum_samples(&m, "kcache_cache_requests_waiting", None),
        0.0
    );
    // Refused requests are audited with their 429 and, refused before authorization, no
    // authorization decision (as the API server audits what its priority and fairness
    // rejects); answered ones with theirs.
    eventually("the refusals are audited", Duration::from_secs(10), || {
        let audit_log = audit_log.clone();
        async move {
            let text = std::fs::read_to_string(&audit_log).unwrap_or_default();
            let events: Vec<Value> = text
                .lines()
                .filter_map(|l| serde_json::from_str(l).ok())
                .collect();
            let refused = events.iter().any(|e| {
                e["responseStatus"]["code"] == 429
                    && e["user"]["username"] == "admin"
                    && e["annotations"]
                        .get("authorization.k8s.io/decision")
                        .is_none()
            });
            let answered = events.iter().any(|e| {
                e["responseStatus"]["code"] == 200
                    && e["annotations"]["authorization.k8s.io/decision"] == "allow"
            });
            refused && answered
        }
    })
    .await;
}

/// A read that only waits — here for a resourceVersion the key has not reached, as it
/// would for a key's first sync or a freshness proof — gives its seat back meanwhile: with
/// one seat, another user's read is answered at once, not after the wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_that_waits_gives_its_seat_back() {
    let cluster = TestCluster::start().await;
    let k = Kcache::start(
        &cluster,
        "[server]\ncache_seats = 1\n[cache]\nblock_timeout_ms = 6000\n",
    )
    .await;
    let list = "/api/v1/namespaces/default/configmaps";
    let get = |base: String, query: String, token: &'static str| async move {
        let r = Http::new(&base)
            .reply(&format!("{list}?{query}"), Some(token))
            .await;
        (r.code, r.body, r.took)
    };
    let (code, body, _) = get(k.url.clone(), "resourceVersion=0".into(), TOKEN).await;
    assert_eq!(code, 200, "{body}");
    let rv: u64 = body["metadata"]["resourceVersion"]
        .as_str()
        .and_then(|v| v.parse().ok())
        .expect("a list RV");
    let calm_want = get(
        cluster.url.clone(),
        "resourceVersion=0".into(),
        "viewertoken",
    )
    .await
    .0;
    let waiting = get(
        k.url.clone(),
        format!(
            "resourceVersion={}&resourceVersionMatch=NotOlderThan",
            rv + 1_000_000
        ),
        TOKEN,
    );
    let other = async {
        tokio::time::sleep(Duration::from_millis(500)).await;
        get(k.url.clone(), "resourceVersion=0".into(), "viewertoken").await
    };
    let ((wait_code, wait_body, waited), (code, body, took)) = tokio::join!(waiting, other);
    // The waiting read ends as the API server's would, with its 504 after the block timeout.
    assert_eq!(wait_code, 504, "{wait_body}");
    assert!(waited >= Duration::from_secs(5), "{waited:?}");
    assert_eq!(code, calm_want, "{body}");
    assert!(
        took < Duration::from_secs(3),
        "the other user's read took {took:?}: it waited for the seat a waiting read held"
    );
}
