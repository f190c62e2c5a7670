//! Many single-object watches share one upstream watch per object; node keys; grace period.

mod support;

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, Secret, ServiceAccount};
use serde_json::{json, Value};
use support::kcache::Kcache;
use support::{eventually, TestCluster};

const TOKEN: &str = "admintoken";

async fn create<K>(client: &kube::Client, ns: Option<&str>, v: Value)
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + serde::Serialize
        + std::fmt::Debug,
    K::DynamicType: Default,
{
    let api: kube::Api<K> = kube::Api::namespaced(client.clone(), ns.unwrap_or("default"));
    let obj: K = serde_json::from_value(v).expect("object");
    api.create(&Default::default(), &obj).await.expect("create");
}

/// Secrets `s0`..`s{n-1}` in `ns`, each with `v: "0"`.
async fn create_secrets(client: &kube::Client, ns: &str, n: usize) {
    for i in 0..n {
        create::<Secret>(
            client,
            Some(ns),
            json!({"metadata": {"name": format!("s{i}")}, "stringData": {"v": "0"}}),
        )
        .await;
    }
}

/// Opens a watch and calls `f` for each event until the stream ends.
fn spawn_watch(
    http: reqwest::Client,
    url: String,
    mut f: impl FnMut(Value) + Send + 'static,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let resp = http
            .get(url)
            .bearer_auth(TOKEN)
            .send()
            .await
            .expect("watch");
        assert_eq!(resp.status().as_u16(), 200);
        support::for_each_event(resp, |v| {
            f(v);
            true
        })
        .await;
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousand_single_object_watches_share_one_upstream_watch_per_object() {
    let cluster = TestCluster::start().await;
    // Name keys, as they are without adaptive coalescing (100 watched of 100 would fold
    // into one namespace key: services/tests/coalescing.rs).
    let k = Kcache::start(
        &cluster,
        "[cache]\ngrace_period_secs = 2\nwatch_keepalive_secs = 1\ncoalesce_min_names = 0\n",
    )
    .await;
    let admin = cluster.kube_client().await;
    support::create_namespace(&admin, "fan").await;
    create_secrets(&admin, "fan", 100).await;
    let baseline = cluster.upstream_watches("secrets").await;

    let http = reqwest::Client::builder()
        .danger_accept_invalid_certs(true)
        .pool_max_idle_per_host(0)
        .build()
        .expect("http client");
    let added = Arc::new(AtomicUsize::new(0));
    let modified = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for i in 0..100 {
        for _ in 0..10 {
            let url = format!(
                "{}/api/v1/namespaces/fan/secrets?watch=1&resourceVersion=0&fieldSelector=metadata.name%3Ds{i}",
                k.url
            );
            let (added, modified) = (added.clone(), modified.clone());
            let name = format!("s{i}");
            tasks.push(spawn_watch(http.clone(), url, move |ev| {
                assert_eq!(
                    ev["object"]["metadata"]["name"],
                    name.as_str(),
                    "a watch got another object's event"
                );
                match ev["type"].as_str() {
                    Some("ADDED") => added.fetch_add(1, Ordering::Relaxed),
                    Some("MODIFIED") => modified.fetch_add(1, Ordering::Relaxed),
                    _ => 0,
                };
            }));
        }
    }
    eventually(
        "1,000 watches got their object",
        Duration::from_secs(60),
        || {
            let added = added.clone();
            async move { added.load(Ordering::Relaxed) == 1000 }
        },
    )
    .await;
    // Upstream watches open right after each key's list, paced by the upstream budget.
    eventually(
        "exactly 100 upstream watches",
        Duration::from_secs(20),
        || async { k.metric("kcache_upstream_watches").await == 100.0 },
    )
    .await;
    assert_eq!(k.metric("kcache_registered_watchers").await, 1000.0);
    eventually(
        "the API server holds 100 more watchers",
        Duration::from_secs(20),
        || async { cluster.upstream_watches("secrets").await == baseline + 100 },
    )
    .await;

    support::update_secrets(&admin, "fan", 100, |_| "1".into()).await;
    eventually(
        "every watch got the update",
        Duration::from_secs(60),
        || {
            let modified = modified.clone();
            async move { modified.load(Ordering::Relaxed) == 1000 }
        },
    )
    .await;

    for t in tasks {
        t.abort();
    }
    eventually(
        "upstream watches stop after the grace period",
        Duration::from_secs(30),
        || async { k.metric("kcache_upstream_watches").await == 0.0 },
    )
    .await;
    eventually(
        "the API server's watchers are back to the baseline",
        Duration::from_secs(30),
        || async { cluster.upstream_watches("secrets").await == baseline },
    )
    .await;
}

/// Upstream lists and watches are HTTP/2 streams, `upstream_streams_per_connection` per
/// connection: 30 keys take 3 connections where HTTP/1.1 would take 30.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_watches_share_http2_connections() {
    let cluster = TestCluster::start().await;
    // One name key each (coalescing off: 30 watched of 30 would fold into one key).
    let k = Kcache::start(
        &cluster,
        "[cache]\nupstream_streams_per_connection = 10\ncoalesce_min_names = 0\n",
    )
    .await;
    let admin = cluster.kube_client().await;
    support::create_namespace(&admin, "h2").await;
    const KEYS: usize = 30;
    create_secrets(&admin, "h2", KEYS).await;
    let baseline = cluster.upstream_watches("secrets").await;
    let added = Arc::new(AtomicUsize::new(0));
    let modified = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for i in 0..KEYS {
        let url = format!(
            "{}/api/v1/namespaces/h2/secrets?watch=1&resourceVersion=0&fieldSelector=metadata.name%3Ds{i}",
            k.url
        );
        let (added, modified) = (added.clone(), modified.clone());
        tasks.push(spawn_watch(support::insecure_http(), url, move |ev| {
            match ev["type"].as_str() {
                Some("ADDED") => added.fetch_add(1, Ordering::Relaxed),
                Some("MODIFIED") => modified.fetch_add(1, Ordering::Relaxed),
                _ => 0,
            };
        }));
    }
    eventually(
        "every watch got its object",
        Duration::from_secs(30),
        || {
            let added = added.clone();
            async move { added.load(Ordering::Relaxed) == KEYS }
        },
    )
    .await;
    eventually(
        "the API server holds one watch per key",
        Duration::from_secs(20),
        || async { cluster.upstream_watches("secrets").await == baseline + KEYS as u64 },
    )
    .await;
    assert_eq!(k.metric("kcache_upstream_watches").await, KEYS as f64);
    // A key holds one stream at a time (its list, then its watch): 30 streams, 10 each.
    assert_eq!(k.metric("kcache_upstream_connections").await, 3.0);
    // Black box: the process's own sockets. Besides the 3 HTTP/2 connections, one more
    // carries TokenReviews and SubjectAccessReviews for the 30 watch requests, and the
    // proxy's client may keep one; one connection per watch or review would be 30+.
    let tcp = k.tcp_connections_to(cluster.port());
    assert!(
        (3..=5).contains(&tcp),
        "{tcp} TCP connections from kcache to the API server"
    );

    support::update_secrets(&admin, "h2", KEYS, |_| "1".into()).await;
    eventually(
        "every watch got the update",
        Duration::from_secs(30),
        || {
            let modified = modified.clone();
            async move { modified.load(Ordering::Relaxed) == KEYS }
        },
    )
    .await;
    for t in tasks {
        t.abort();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_pod_watch_sees_exactly_that_nodes_pods() {
    let cluster = TestCluster::start().await;
    let k = Kcache::start(&cluster, "").await;
    let admin = cluster.kube_client().await;
    let mut want = HashSet::new();
    for ns in ["na", "nb"] {
        support::create_namespace(&admin, ns).await;
        // No controller-manager runs: the ServiceAccount admission plugin needs the
        // namespace's default service account to exist.
        create::<ServiceAccount>(&admin, Some(ns), json!({"metadata": {"name": "default"}})).await;
        for (i, node) in ["n1", "n2", "n1"].iter().enumerate() {
            let name = format!("p{i}");
            create::<Pod>(
                &admin,
                Some(ns),
                json!({
                    "metadata": {"name": name},
                    "spec": {
                        "nodeName": node,
                        "automountServiceAccountToken": false,
                        "containers": [{"name": "c", "image": "busybox"}],
                    }
                }),
            )
            .await;
            if *node == "n1" {
                want.insert(format!("{ns}/{name}"));
            }
        }
    }
    let seen = Arc::new(std::sync::Mutex::new(HashSet::new()));
    let sink = seen.clone();
    let task = spawn_watch(
        support::insecure_http(),
        format!(
            "{}/api/v1/pods?watch=1&resourceVersion=0&fieldSelector=spec.nodeName%3Dn1",
            k.url
        ),
        move |ev| {
            let o = &ev["object"]["metadata"];
            let id = format!(
                "{}/{}",
                o["namespace"].as_str().unwrap_or(""),
                o["name"].as_str().unwrap_or("")
            );
            sink.lock().expect("seen").insert(id);
        },
    );
    eventually(
        "the node watch lists n1's pods",
        Duration::from_secs(20),
        || {
            let seen = seen.clone();
            let n = want.len();
            async move { seen.lock().expect("seen").len() >= n }
        },
    )
    .await;
    // Give a stray event a moment to arrive, then compare exactly.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(*seen.lock().expect("seen"), want);
    let keys = k.debug_keys().await;
    assert!(
        keys["keys"]
            .as_array()
            .expect("keys")
            .iter()
            .any(|e| e["key"] == "/api/v1/pods?fieldSelector=spec.nodeName=n1"),
        "{keys}"
    );
    task.abort();
}
