//! Hardening against the real API server: no read the API server would refuse, and no
//! client pattern that wears kcache down. Each test sends the same requests to the API
//! server and to kcache, or drives kcache the way a real client does, and judges the
//! answers.

mod support;

use std::collections::BTreeSet;
use std::process::Stdio;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use serde_json::{json, Value};
use support::kcache::Kcache;
use support::{create_namespace, eventually, insecure_http, TestCluster, ADMIN_TOKEN};

/// GETs `path` from `base` (with `token`, or none) and returns the status code and body.
async fn get(base: &str, path: &str, token: Option<&str>) -> (u16, String) {
    let mut req = insecure_http()
        .get(format!("{base}{path}"))
        .timeout(Duration::from_secs(20));
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    match req.send().await {
        Ok(resp) => {
            let code = resp.status().as_u16();
            (code, resp.text().await.unwrap_or_default())
        }
        Err(e) => panic!("GET {base}{path}: {e}"),
    }
}

/// The same GET to both; asserts the same status code class and that kcache's body holds
/// none of `secrets` unless the API server's does. Returns (API server code, kcache code).
async fn same_answer(
    cluster: &TestCluster,
    kc: &Kcache,
    path: &str,
    token: Option<&str>,
    secrets: &[&str],
) -> (u16, u16) {
    let (up, up_body) = get(&cluster.url, path, token).await;
    let (ours, our_body) = get(&kc.url, path, token).await;
    assert_eq!(
        up / 100,
        ours / 100,
        "{path} as {token:?}: API server {up}, kcache {ours}:\n{our_body}"
    );
    for s in secrets {
        assert!(
            !our_body.contains(s) || up_body.contains(s),
            "{path} as {token:?}: kcache returned {s:?}, the API server did not:\n{our_body}"
        );
    }
    (up, ours)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn encoded_segments_never_widen_a_read() {
    let cluster = TestCluster::start().await;
    let admin = cluster.kube_client().await;
    create_namespace(&admin, "sec").await;
    create_namespace(&admin, "cms").await;
    // The secret's name and value, base64 as a list would show it.
    support::create_as_admin(
        &cluster,
        "/api/v1/namespaces/sec/secrets",
        json!({"metadata": {"name": "topsecret"}, "stringData": {"k": "hunter2-value"}}),
    )
    .await;
    support::create_as_admin(
        &cluster,
        "/api/v1/namespaces/cms/configmaps",
        json!({"metadata": {"name": "cm1"}, "data": {"k": "v"}}),
    )
    .await;
    // viewer may read ConfigMaps everywhere, and nothing else.
    support::create_as_admin(
        &cluster,
        "/apis/rbac.authorization.k8s.io/v1/clusterroles",
        json!({"metadata": {"name": "cm-reader"}, "rules": [
            {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list", "watch"]}
        ]}),
    )
    .await;
    support::create_as_admin(&cluster,
        "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
        json!({"metadata": {"name": "viewer-cm-reader"},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cm-reader"},
               "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "viewer"}]}),
    )
    .await;
    let kc = Kcache::start(&cluster, "").await;
    let secret_b64 = "aHVudGVyMi12YWx1ZQ"; // "hunter2-value", base64 (prefix)
    let secrets = ["topsecret", secret_b64, "hunter2"];
    for path in [
        "/api/v1/namespaces/sec%2Fsecrets%3Fx%3D/configmaps",
        "/api/v1/namespaces/sec%2Fsecrets%3Fx%3D/configmaps?resourceVersion=0",
        "/api/v1/namespaces/sec%2Fsecrets%2Ftopsecret%3Fx%3D/configmaps?resourceVersion=0",
        "/api/v1/namespaces/sec%2Fsecrets%23/configmaps?resourceVersion=0",
        "/api/v1/namespaces/sec%2Fsecrets%3Fx%3D/configmaps?watch=1&timeoutSeconds=1",
        "/api/v1/namespaces/cms/configmaps/..%2F..%2Fsec%2Fsecrets%2Ftopsecret?resourceVersion=0",
        "/api/v1/namespaces/cms/configmaps/%2E%2E?resourceVersion=0",
        "/api/v1/namespaces/cms/configmaps/cm1%3FfieldSelector%3D?resourceVersion=0",
        "/api/v1/namespaces/cms/configmaps?fieldSelector=metadata.name%3Dx%5C%2Cmetadata.namespace%3Dsec&resourceVersion=0",
        "/api/v1/namespaces/Sec/configmaps?resourceVersion=0",
        "/api/v1/namespaces/sec/configmaps?resourceVersion=0",
    ] {
        same_answer(&cluster, &kc, path, Some("viewertoken"), &secrets).await;
    }
    // The plain, valid read still comes from the cache.
    let (code, body) = get(
        &kc.url,
        "/api/v1/namespaces/cms/configmaps?resourceVersion=0",
        Some("viewertoken"),
    )
    .await;
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("cm1"), "{body}");
    let keys = kc.debug_keys().await.to_string();
    assert!(
        !keys.contains("secrets"),
        "no Secrets key was started by a ConfigMaps reader: {keys}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_scoped_resources_have_no_namespaced_paths() {
    let cluster = TestCluster::start().await;
    let admin = cluster.kube_client().await;
    create_namespace(&admin, "foo").await;
    create_namespace(&admin, "bar").await;
    support::create_as_admin(
        &cluster,
        "/api/v1/namespaces/foo/secrets",
        json!({"metadata": {"name": "s1"}, "stringData": {"k": "v"}}),
    )
    .await;
    // A configuration that calls Namespaces namespaced: discovery overrides it.
    let kc = Kcache::start(
        &cluster,
        "[[resources]]\nversion = \"v1\"\nresource = \"namespaces\"\nkind = \"Namespace\"\nnamespaced = true\n",
    )
    .await;
    for path in [
        "/api/v1/namespaces/foo/namespaces/bar",
        "/api/v1/namespaces/foo/namespaces/bar?resourceVersion=0",
        "/api/v1/namespaces/foo/namespaces/foo?resourceVersion=0",
        "/api/v1/namespaces/foo/namespaces?resourceVersion=0",
        "/api/v1/namespaces/foo/namespaces?watch=1&timeoutSeconds=1",
        "/api/v1/secrets/s1?resourceVersion=0",
    ] {
        let (up, ours) = same_answer(&cluster, &kc, path, Some(ADMIN_TOKEN), &[]).await;
        assert_eq!((up, ours), (404, 404), "{path}");
    }
    // The namespace's own path and the namespace list are served, as upstream.
    for path in [
        "/api/v1/namespaces/bar?resourceVersion=0",
        "/api/v1/namespaces?resourceVersion=0",
        "/api/v1/secrets?resourceVersion=0",
    ] {
        let (up, ours) = same_answer(&cluster, &kc, path, Some(ADMIN_TOKEN), &[]).await;
        assert_eq!((up, ours), (200, 200), "{path}");
    }
}

/// Creates ConfigMaps `cm0`..`cm{n-1}` in `ns`, a few at a time.
async fn create_configmaps(client: &kube::Client, ns: &str, n: usize) {
    let api: kube::Api<ConfigMap> = kube::Api::namespaced(client.clone(), ns);
    futures::stream::iter(0..n)
        .for_each_concurrent(16, |i| {
            let api = api.clone();
            async move {
                let cm: ConfigMap = serde_json::from_value(
                    json!({"metadata": {"name": format!("cm{i}")}, "data": {"v": "x".repeat(200)}}),
                )
                .expect("a ConfigMap");
                api.create(&PostParams::default(), &cm)
                    .await
                    .unwrap_or_else(|e| panic!("create cm{i}: {e}"));
            }
        })
        .await;
}

/// Reads a raw watch through kcache until `want` ADDED events of `cm*` arrived, pausing
/// `pause` every 50 events (a slow reader); with `trailing`, also until one more event
/// arrived after those (the initial-events-end bookmark) and returns the events after them.
async fn raw_initial_events(
    kc: &Kcache,
    query: &str,
    want: usize,
    pause: Duration,
    trailing: bool,
) -> Vec<Value> {
    let resp = insecure_http()
        .get(format!(
            "{}/api/v1/namespaces/big/configmaps?{query}",
            kc.url
        ))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .expect("watch");
    assert_eq!(resp.status().as_u16(), 200, "{query}");
    let mut rx = support::event_channel(resp);
    let mut added = BTreeSet::new();
    let mut after = Vec::new();
    while added.len() < want || (trailing && after.is_empty()) {
        let ev = tokio::time::timeout(Duration::from_secs(60), rx.recv())
            .await
            .unwrap_or_else(|_| panic!("{query}: stalled after {} ADDED", added.len()))
            .unwrap_or_else(|| panic!("{query}: the watch ended after {} ADDED", added.len()));
        assert_ne!(ev["type"], "ERROR", "{query}: {ev}");
        let name = ev["object"]["metadata"]["name"].as_str().unwrap_or("");
        if ev["type"] == "ADDED" && name.starts_with("cm") && added.len() < want {
            added.insert(name.to_string());
            if added.len() % 50 == 0 && !pause.is_zero() {
                tokio::time::sleep(pause).await;
            }
        } else if added.len() >= want {
            after.push(ev);
        }
    }
    after
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn initial_events_beyond_the_buffer_stream_at_the_clients_pace() {
    const N: usize = 1_000;
    let cluster = TestCluster::start().await;
    let admin = cluster.kube_client().await;
    create_namespace(&admin, "big").await;
    create_configmaps(&admin, "big", N).await;
    // A buffer of 10 lines: the initial events are 100 times that.
    let kc = Kcache::start(&cluster, "[cache]\nwatcher_buffer = 10\n").await;

    // Initial events of a watch without a resourceVersion, read at once and read slowly.
    for (query, pause) in [
        ("watch=1", Duration::ZERO),
        ("watch=1&timeoutSeconds=120", Duration::from_millis(30)),
    ] {
        raw_initial_events(&kc, query, N, pause, false).await;
    }
    // A streaming list: every object, then the initial-events-end bookmark.
    let after = raw_initial_events(
        &kc,
        "watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true",
        N,
        Duration::from_millis(10),
        true,
    )
    .await;
    assert_eq!(after[0]["type"], "BOOKMARK", "{:?}", after[0]);
    assert_eq!(
        after[0]["object"]["metadata"]["annotations"]["k8s.io/initial-events-end"],
        "true"
    );

    // kube-rs watcher, list+watch and streaming list.
    let client = kc.kube_client(ADMIN_TOKEN);
    for (what, cfg) in [
        ("list+watch", watcher::Config::default()),
        (
            "streaming list",
            watcher::Config::default().streaming_lists(),
        ),
    ] {
        let api: kube::Api<ConfigMap> = kube::Api::namespaced(client.clone(), "big");
        let mut stream = watcher::watcher(api, cfg).boxed();
        let mut seen = 0;
        loop {
            let ev = tokio::time::timeout(Duration::from_secs(60), stream.next())
                .await
                .unwrap_or_else(|_| panic!("{what}: stalled after {seen}"))
                .unwrap_or_else(|| panic!("{what}: ended"))
                .unwrap_or_else(|e| panic!("{what}: {e}"));
            match ev {
                watcher::Event::InitApply(_) => seen += 1,
                watcher::Event::InitDone => break,
                _ => {}
            }
        }
        // kube-root-ca.crt is not created here (no controller-manager).
        assert_eq!(seen, N, "{what}");
    }

    // kubectl get -w: the list, then the watch picks up a change.
    let mut kubectl = support::kubectl_command()
        .args(["--server", &kc.url, "--token", ADMIN_TOKEN])
        .args([
            "--insecure-skip-tls-verify",
            "-n",
            "big",
            "get",
            "configmaps",
        ])
        .args(["-w", "--no-headers", "--output-watch-events"])
        .env("KUBECONFIG", "/dev/null")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("run kubectl");
    let stdout = kubectl.stdout.take().expect("kubectl stdout");
    let lines = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let reader = {
        let lines = lines.clone();
        std::thread::spawn(move || {
            use std::io::BufRead;
            for line in std::io::BufReader::new(stdout)
                .lines()
                .map_while(Result::ok)
            {
                if let Ok(mut l) = lines.lock() {
                    l.push(line);
                }
            }
        })
    };
    let count = |pred: &dyn Fn(&str) -> bool| {
        lines
            .lock()
            .map(|l| l.iter().filter(|s| pred(s)).count())
            .unwrap_or(0)
    };
    eventually(
        "kubectl lists every ConfigMap",
        Duration::from_secs(60),
        || async { count(&|l: &str| l.contains(" cm")) >= N },
    )
    .await;
    let api: kube::Api<ConfigMap> = kube::Api::namespaced(admin.clone(), "big");
    api.patch(
        "cm7",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"v": "changed"}})),
    )
    .await
    .expect("patch cm7");
    eventually(
        "kubectl sees the change",
        Duration::from_secs(30),
        || async { count(&|l: &str| l.starts_with("MODIFIED") && l.contains("cm7")) >= 1 },
    )
    .await;
    let _ = kubectl.kill();
    let _ = kubectl.wait();
    let _ = reader.join();

    // Nobody was closed as a slow consumer.
    assert_eq!(kc.metric("kcache_terminated_watchers_total").await, 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_are_budgeted_and_names_that_cannot_exist_start_none() {
    let cluster = TestCluster::start().await;
    let admin = cluster.kube_client().await;
    create_namespace(&admin, "kb").await;
    for i in 0..6 {
        support::create_as_admin(
            &cluster,
            "/api/v1/namespaces/kb/secrets",
            json!({"metadata": {"name": format!("s{i}")}, "stringData": {"k": "v"}}),
        )
        .await;
    }
    let kc = Kcache::start(&cluster, "[cache]\nmax_keys_per_user = 3\n").await;
    // Six GETs of distinct names: all answered, as upstream; three keys at most.
    for i in 0..6 {
        let path = format!("/api/v1/namespaces/kb/secrets/s{i}?resourceVersion=0");
        let (up, ours) = same_answer(&cluster, &kc, &path, Some(ADMIN_TOKEN), &[]).await;
        assert_eq!((up, ours), (200, 200), "{path}");
    }
    let kb_keys = |keys: &Value| {
        keys["keys"]
            .as_array()
            .map(|k| {
                k.iter()
                    .filter(|k| k["key"].as_str().is_some_and(|s| s.contains("/kb/")))
                    .count()
            })
            .unwrap_or(0)
    };
    assert_eq!(kb_keys(&kc.debug_keys().await), 3);
    // A watch that needs a fourth key is refused as the API server refuses overload.
    let resp = insecure_http()
        .get(format!(
            "{}/api/v1/namespaces/kb/secrets?watch=1&fieldSelector=metadata.name%3Ds5&resourceVersion=0",
            kc.url
        ))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .expect("watch");
    assert_eq!(resp.status().as_u16(), 429);
    assert_eq!(
        resp.headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok()),
        Some("1")
    );
    let status: Value = resp.json().await.expect("a Status");
    assert_eq!(status["reason"], "TooManyRequests");
    assert!(kc.metric("kcache_keys_refused_total").await >= 4.0);
    // Another user's budget is their own.
    support::create_as_admin(&cluster,
        "/apis/rbac.authorization.k8s.io/v1/namespaces/kb/rolebindings",
        json!({"metadata": {"name": "viewer-view"},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
               "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "viewer"}]}),
    )
    .await;
    // RBAC takes a moment to see the new binding. (cluster-admin: the aggregated roles
    // such as `admin` are empty without a controller-manager.)
    eventually(
        "the viewer reads s5 through kcache",
        Duration::from_secs(30),
        || async {
            let (code, _) = get(
                &kc.url,
                "/api/v1/namespaces/kb/secrets/s5?resourceVersion=0",
                Some("viewertoken"),
            )
            .await;
            code == 200
        },
    )
    .await;
    assert_eq!(kb_keys(&kc.debug_keys().await), 4);

    // Names no object can have: answered as upstream (404), no key.
    let long = "n".repeat(300);
    for path in [
        format!("/api/v1/namespaces/kb/secrets/{long}?resourceVersion=0"),
        "/api/v1/namespaces/kb/secrets/a%2Cb?resourceVersion=0".to_string(),
        format!(
            "/api/v1/namespaces/kb/secrets?fieldSelector=metadata.name%3D{long}&resourceVersion=0"
        ),
    ] {
        same_answer(&cluster, &kc, &path, Some("viewertoken"), &[]).await;
    }
    let keys = kc.debug_keys().await.to_string();
    assert!(!keys.contains(&long), "{keys}");
    assert_eq!(kb_keys(&kc.debug_keys().await), 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_of_future_resource_versions_cannot_flood_the_upstream() {
    let cluster = TestCluster::start().await;
    let admin = cluster.kube_client().await;
    create_namespace(&admin, "fr").await;
    let kc = Kcache::start(
        &cluster,
        "[cache]\nprobe_interval_ms = 600000\nblock_timeout_ms = 300\n",
    )
    .await;
    let (code, body) = get(
        &kc.url,
        "/api/v1/namespaces/fr/configmaps?resourceVersion=0",
        Some(ADMIN_TOKEN),
    )
    .await;
    assert_eq!(code, 200, "{body}");
    let rv: u64 = serde_json::from_str::<Value>(&body).expect("a list")["metadata"]
        ["resourceVersion"]
        .as_str()
        .and_then(|s| s.parse().ok())
        .expect("the list's RV");
    let probes_before = kc.metric("kcache_upstream_probes_total").await;
    let lists_before = kc.metric("kcache_upstream_lists_total").await;
    for i in 0..8 {
        let path = format!(
            "/api/v1/namespaces/fr/configmaps?resourceVersion={}",
            rv + 1_000_000 + i
        );
        let (code, body) = get(&kc.url, &path, Some(ADMIN_TOKEN)).await;
        // As 1.20: "Too large resource version" once the wait runs out.
        assert_eq!(code, 504, "{body}");
    }
    let probes = kc.metric("kcache_upstream_probes_total").await - probes_before;
    let lists = kc.metric("kcache_upstream_lists_total").await - lists_before;
    assert!(probes <= 1.0, "{probes} probes for 8 reads");
    assert!(lists <= 1.0, "{lists} upstream lists for 8 reads");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_then_watch_on_a_young_key_gets_no_410_while_others_write() {
    const NAMES: usize = 25;
    let cluster = TestCluster::start().await;
    let admin = cluster.kube_client().await;
    create_namespace(&admin, "yk").await;
    create_namespace(&admin, "noise").await;
    for i in 0..NAMES {
        support::create_as_admin(
            &cluster,
            "/api/v1/namespaces/yk/secrets",
            json!({"metadata": {"name": format!("s{i}")}, "stringData": {"v": "0"}}),
        )
        .await;
    }
    let kc = Kcache::start(&cluster, "").await;
    // Writers elsewhere keep the cluster's RV moving.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let noise = {
        let stop = stop.clone();
        let api: kube::Api<ConfigMap> = kube::Api::namespaced(admin.clone(), "noise");
        tokio::spawn(async move {
            let mut i = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let cm: ConfigMap =
                    serde_json::from_value(json!({"metadata": {"name": format!("n{i}")}}))
                        .expect("a ConfigMap");
                let _ = api.create(&PostParams::default(), &cm).await;
                i += 1;
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
    };
    // client-go's reflector: list, then watch each name from the list's RV — while the
    // noise moves the RV on. The list is the API server's own (a client that listed it
    // directly, or before kcache was in front): its RV is older than the name keys that
    // the watches start, whose windows begin at their own lists.
    let (code, body) = get(
        &cluster.url,
        "/api/v1/namespaces/yk/secrets",
        Some(ADMIN_TOKEN),
    )
    .await;
    assert_eq!(code, 200, "{body}");
    let list_rv = serde_json::from_str::<Value>(&body).expect("a list")["metadata"]
        ["resourceVersion"]
        .as_str()
        .expect("the list's RV")
        .to_string();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut watches = Vec::new();
    for i in 0..NAMES {
        for _ in 0..2 {
            let resp = insecure_http()
                .get(format!(
                    "{}/api/v1/namespaces/yk/secrets?watch=1&fieldSelector=metadata.name%3Ds{i}&resourceVersion={list_rv}&allowWatchBookmarks=true",
                    kc.url
                ))
                .bearer_auth(ADMIN_TOKEN)
                .send()
                .await
                .expect("watch");
            assert_eq!(resp.status().as_u16(), 200);
            watches.push((i, support::event_channel(resp)));
        }
        // Keys start one after another, each later than the last write.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let secrets: kube::Api<Secret> = kube::Api::namespaced(admin.clone(), "yk");
    for i in 0..NAMES {
        secrets
            .patch(
                &format!("s{i}"),
                &PatchParams::default(),
                &Patch::Merge(json!({"stringData": {"v": "1"}})),
            )
            .await
            .expect("patch");
    }
    for (i, rx) in &mut watches {
        loop {
            let ev = tokio::time::timeout(Duration::from_secs(30), rx.recv())
                .await
                .unwrap_or_else(|_| panic!("s{i}: no MODIFIED within 30 s"))
                .unwrap_or_else(|| panic!("s{i}: the watch ended"));
            assert_ne!(ev["type"], "ERROR", "s{i}: {ev}");
            if ev["type"] == "MODIFIED" {
                assert_eq!(ev["object"]["metadata"]["name"], format!("s{i}"));
                break;
            }
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let _ = noise.await;
    assert_eq!(kc.metric("kcache_watch_expired_total").await, 0.0);
    assert!(kc.metric("kcache_window_backfills_total").await >= 1.0);
}

/// The events of a watch of `target` on `base` until `done` (a name and event type)
/// arrives, as (type, name, resourceVersion), or until 15 s pass.
async fn events_until(
    base: &str,
    target: &str,
    done: (&str, &str),
) -> Vec<(String, String, String)> {
    let resp = insecure_http()
        .get(format!("{base}{target}"))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .expect("watch");
    assert_eq!(resp.status().as_u16(), 200, "{base}{target}");
    let mut rx = support::event_channel(resp);
    let mut seen = Vec::new();
    while let Ok(Some(ev)) = tokio::time::timeout(Duration::from_secs(15), rx.recv()).await {
        let name = ev["object"]["metadata"]["name"]
            .as_str()
            .unwrap_or("")
            .to_string();
        let kind = ev["type"].as_str().unwrap_or("").to_string();
        let rv = ev["object"]["metadata"]["resourceVersion"]
            .as_str()
            .unwrap_or("")
            .to_string();
        let last = (kind.as_str(), name.as_str()) == (done.1, done.0);
        seen.push((kind, name, rv));
        if last {
            break;
        }
    }
    seen
}

/// Kubernetes' conformance spec "should be able to start watching from a specific
/// resource version", and worse: objects change between the client's RV and the list of
/// the key its watch starts — one is updated twice and deleted, one leaves the watch's
/// label selector, one is created. kcache replays what happened in between from the
/// upstream (one replay for the key) and sends what the API server sends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_young_key_replays_what_changed_before_its_list() {
    let cluster = TestCluster::start().await;
    let admin = cluster.kube_client().await;
    create_namespace(&admin, "replay").await;
    let kc = Kcache::start(&cluster, "").await;
    let api: kube::Api<ConfigMap> = kube::Api::namespaced(admin.clone(), "replay");
    let cm = |name: &str, label: &str, v: &str| -> ConfigMap {
        serde_json::from_value(json!({
            "metadata": {"name": name, "labels": {"watch-this": label}},
            "data": {"v": v},
        }))
        .expect("a ConfigMap")
    };
    let pp = PostParams::default();
    api.create(&pp, &cm("gone", "yes", "0"))
        .await
        .expect("create");
    api.create(&pp, &cm("leaves", "yes", "0"))
        .await
        .expect("create");
    let first = api
        .replace("gone", &pp, &cm("gone", "yes", "1"))
        .await
        .expect("update");
    let from = first.metadata.resource_version.expect("an RV");
    api.replace("gone", &pp, &cm("gone", "yes", "2"))
        .await
        .expect("update");
    api.replace("leaves", &pp, &cm("leaves", "no", "1"))
        .await
        .expect("update");
    api.create(&pp, &cm("new", "yes", "0"))
        .await
        .expect("create");
    api.delete("gone", &Default::default())
        .await
        .expect("delete");
    // Unfiltered and through the label selector: the second needs each event's previous
    // object to turn "leaves" into a DELETED.
    for selector in ["", "&labelSelector=watch-this%3Dyes"] {
        let target = format!(
            "/api/v1/namespaces/replay/configmaps?watch=1&resourceVersion={from}{selector}"
        );
        let direct = events_until(&cluster.url, &target, ("gone", "DELETED")).await;
        let cached = events_until(&kc.url, &target, ("gone", "DELETED")).await;
        assert!(
            direct.iter().any(|e| e.0 == "DELETED" && e.1 == "gone"),
            "{target}: the API server sent {direct:?}"
        );
        assert_eq!(cached, direct, "{target}");
    }
    assert!(
        support::prom::sum_samples(
            &kc.metrics_text().await,
            "kcache_window_backfills_total",
            Some("outcome=\"extended\"")
        ) >= 1.0,
        "no backfill counted as extended"
    );
    assert_eq!(kc.metric("kcache_watch_expired_total").await, 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anonymous_access_follows_the_upstream() {
    let cluster = TestCluster::start_with_args(&["--anonymous-auth=false"]).await;
    // kcache's config allows anonymous requests; the API server does not, so neither
    // does kcache.
    let kc = Kcache::start(&cluster, "[auth]\nanonymous = true\n").await;
    for path in [
        "/api/v1/namespaces/default/configmaps?resourceVersion=0",
        "/api/v1/namespaces?resourceVersion=0",
        "/api/v1/namespaces/default/secrets?watch=1&timeoutSeconds=1",
    ] {
        let (up, ours) = same_answer(&cluster, &kc, path, None, &[]).await;
        assert_eq!((up, ours), (401, 401), "{path}");
    }
}
