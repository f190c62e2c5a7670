//! Covering keys against a real API server: with a namespace key (or the cluster key)
//! running, a request whose own key is not running — a name, another namespace — is
//! served by it without a new upstream watch, and answers as the API server does: the
//! same objects for gets and lists, the same events for watches.

mod support;

use std::time::Duration;

use serde_json::Value;
use support::http::{delete_secret, next_events, object_ref, put_secret, Http};
use support::kcache::Kcache;
use support::{eventually, TestCluster};

/// What a get or list shows: `ns/name@rv` per object, sorted, or the Status reason.
fn shown(code: u16, body: &Value) -> (u16, Vec<String>) {
    let mut out = match body["kind"].as_str() {
        Some("Status") => vec![body["reason"].as_str().unwrap_or("").to_string()],
        Some(k) if k.ends_with("List") => body["items"]
            .as_array()
            .map(|items| items.iter().map(object_ref).collect())
            .unwrap_or_default(),
        _ => vec![object_ref(body)],
    };
    out.sort();
    (code, out)
}

/// Every path gives the same status and objects from both servers.
async fn same_reads(upstream: &Http, kcache: &Http, paths: &[&str]) {
    for path in paths {
        let (a, a_body) = upstream.get_admin(path).await;
        let (k, k_body) = kcache.get_admin(path).await;
        assert_eq!(
            shown(k, &k_body),
            shown(a, &a_body),
            "{path}: kcache (left) vs the API server"
        );
    }
}

async fn key_names(k: &Kcache) -> Vec<String> {
    let keys = k.debug_keys().await;
    keys["keys"]
        .as_array()
        .map(|ks| {
            ks.iter()
                .filter_map(|k| k["key"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn running_namespace_and_cluster_keys_serve_what_they_cover_as_the_api_server_does() {
    let cluster = TestCluster::start().await;
    let k = Kcache::start(&cluster, "").await;
    let kcache = Http::new(&k.url);
    let upstream = Http::new(&format!("https://127.0.0.1:{}", cluster.port()));
    let admin = cluster.kube_client().await;
    for ns in ["cov", "other"] {
        support::create_namespace(&admin, ns).await;
    }
    for (ns, name) in [("cov", "s1"), ("cov", "s2"), ("other", "s1")] {
        put_secret(&admin, ns, name, "0").await;
    }

    // A namespace informer keeps the namespace key running.
    let _informer = kcache
        .watch_ok("/api/v1/namespaces/cov/secrets?watch=1")
        .await;
    let ns_key = "/api/v1/namespaces/cov/secrets";
    eventually(
        "the namespace key syncs",
        Duration::from_secs(30),
        || async {
            k.key_info(ns_key)
                .await
                .is_some_and(|i| i["synced"] == true)
        },
    )
    .await;

    same_reads(
        &upstream,
        &kcache,
        &[
            "/api/v1/namespaces/cov/secrets/s1?resourceVersion=0",
            "/api/v1/namespaces/cov/secrets/nothere?resourceVersion=0",
            "/api/v1/namespaces/cov/secrets?resourceVersion=0&fieldSelector=metadata.name%3Ds1",
            "/api/v1/namespaces/cov/secrets?resourceVersion=0&fieldSelector=metadata.name%3Ds1,type%3DOpaque",
            "/api/v1/namespaces/cov/secrets?resourceVersion=0&fieldSelector=metadata.name%3Ds1,type%3Dother",
            "/api/v1/namespaces/cov/secrets?resourceVersion=0&fieldSelector=metadata.name%3Dnothere",
        ],
    )
    .await;

    // The kubelet's single-object watch, from the list's RV, on both.
    let (_, list) = kcache
        .get_admin(
            "/api/v1/namespaces/cov/secrets?resourceVersion=0&fieldSelector=metadata.name%3Ds1",
        )
        .await;
    let rv = list["metadata"]["resourceVersion"]
        .as_str()
        .expect("list rv")
        .to_string();
    let path = format!(
        "/api/v1/namespaces/cov/secrets?watch=1&resourceVersion={rv}&fieldSelector=metadata.name%3Ds1"
    );
    let mut from_kcache = kcache.watch_ok(&path).await;
    let mut from_upstream = upstream.watch_ok(&path).await;
    let keys = key_names(&k).await;
    assert!(
        !keys.iter().any(|k| k.ends_with("/secrets/s1")),
        "no name key started: {keys:?}"
    );
    let info = k.key_info(ns_key).await.expect("namespace key");
    // Two names, below coalesce_min_names: both are served because their own keys were
    // not running, not because they were coalesced.
    let covered = support::kcache::covering(&info);
    assert_eq!(
        covered,
        [
            "/api/v1/namespaces/cov/secrets/nothere covered",
            "/api/v1/namespaces/cov/secrets/s1 covered"
        ],
        "{info}"
    );
    for (name, v) in [("s2", "1"), ("s1", "1"), ("s2", "2"), ("s1", "2")] {
        put_secret(&admin, "cov", name, v).await;
    }
    delete_secret(&admin, "cov", "s1").await;
    assert_eq!(
        next_events(&mut from_kcache, 3).await,
        next_events(&mut from_upstream, 3).await,
        "kcache (left) vs the API server"
    );

    // The cluster key covers other namespaces, and names across namespaces.
    let _cluster_informer = kcache.watch_ok("/api/v1/secrets?watch=1").await;
    eventually("the cluster key syncs", Duration::from_secs(30), || async {
        k.key_info("/api/v1/secrets")
            .await
            .is_some_and(|i| i["synced"] == true)
    })
    .await;
    same_reads(
        &upstream,
        &kcache,
        &[
            "/api/v1/namespaces/other/secrets?resourceVersion=0",
            "/api/v1/namespaces/other/secrets/s1?resourceVersion=0",
            "/api/v1/namespaces/other/secrets/s2?resourceVersion=0",
            "/api/v1/secrets?resourceVersion=0&fieldSelector=metadata.name%3Ds2",
            "/api/v1/namespaces/other/secrets?resourceVersion=0&fieldSelector=metadata.name%3Ds1",
        ],
    )
    .await;
    // Reads of the past and pages through the cover: only the asked namespace's or
    // name's objects are taken from the cluster key's state (`Store::snapshot_for`), and a
    // version changed or deleted since is still found.
    put_secret(&admin, "other", "s3", "0").await;
    let (_, then) = upstream.get_admin("/api/v1/namespaces/other/secrets").await;
    let rv = then["metadata"]["resourceVersion"]
        .as_str()
        .expect("list rv")
        .to_string();
    put_secret(&admin, "other", "s1", "9").await;
    delete_secret(&admin, "other", "s3").await;
    let exact = |q: &str| {
        format!(
            "/api/v1/namespaces/other/secrets{q}resourceVersion={rv}&resourceVersionMatch=Exact"
        )
    };
    let bypassed = || async {
        let text = k.metrics_text().await;
        support::prom::sum_samples(&text, "kcache_cache_bypassed_total", None)
    };
    let bypassed_before = bypassed().await;
    same_reads(
        &upstream,
        &kcache,
        &[
            &exact("?"),
            &exact("?fieldSelector=metadata.name%3Ds3&"),
            &exact("?fieldSelector=metadata.name%3Ds1&"),
            &exact("?limit=1&"),
            "/api/v1/namespaces/other/secrets?limit=1",
            "/api/v1/namespaces/other/secrets?resourceVersion=0&fieldSelector=metadata.name%3Ds3",
            "/api/v1/namespaces/other/secrets?fieldSelector=metadata.name%3Ds1",
        ],
    )
    .await;
    assert_eq!(bypassed().await, bypassed_before, "all served by the cache");
    let keys = key_names(&k).await;
    assert_eq!(
        keys,
        ["/api/v1/namespaces/cov/secrets", "/api/v1/secrets"],
        "every other read was covered"
    );
    assert_eq!(k.metric("kcache_upstream_watches").await, 2.0);
    let text = k.metrics_text().await;
    assert!(
        support::prom::sum_samples_with_label(
            &text,
            "kcache_covered_requests_total",
            "by",
            "cluster"
        ) >= 5.0,
        "{text}"
    );
    assert!(
        support::prom::sum_samples_with_label(
            &text,
            "kcache_covered_requests_total",
            "by",
            "namespace"
        ) >= 7.0,
        "{text}"
    );
}
