//! The reference version's kubelet wiring as the judge: `kcache-kubelet`
//! (conformance/kubelet-manager/) runs the kubelet's own watch-based Secret and ConfigMap
//! managers, unchanged, for 100 pods × 10 objects bound to node1, authenticating as node1
//! (so the Node authorizer decides, with the name selector of each reflector), through
//! kcache. Every first sync is a streaming list served by kcache; the API server's watch
//! count grows by kcache's keys, never by the kubelet's 1,000 reflectors, and folds to at
//! most two per namespace and resource once coalesced; no reflector waits for a bookmark
//! that never comes; every update reaches every pod's manager.

mod support;

use std::process::Stdio;
use std::time::Duration;

use serde_json::{json, Value};
use support::kcache::Kcache;
use support::{create_as_admin, eventually, TestCluster, ADMIN_TOKEN};
use tokio::io::{AsyncBufReadExt, BufReader};

const NAMESPACES: usize = 4;
const PODS_PER_NAMESPACE: usize = 25;
const SECRETS_PER_POD: usize = 5;
const CONFIGMAPS_PER_POD: usize = 5;

async fn put(cluster: &TestCluster, ns: &str, resource: &str, name: &str, v: &str) {
    let (kind, data) = if resource == "secrets" {
        ("Secret", json!({"stringData": {"v": v}}))
    } else {
        ("ConfigMap", json!({"data": {"v": v}}))
    };
    let mut body = json!({"apiVersion": "v1", "kind": kind, "metadata": {"name": name}});
    for (k, val) in data.as_object().expect("object") {
        body[k] = val.clone();
    }
    let resp = support::insecure_http()
        .patch(format!(
            "{}/api/v1/namespaces/{ns}/{resource}/{name}?fieldManager=test&force=true",
            cluster.url
        ))
        .bearer_auth(ADMIN_TOKEN)
        .header("Content-Type", "application/apply-patch+yaml")
        .body(body.to_string())
        .send()
        .await
        .expect("apply");
    assert!(
        resp.status().is_success(),
        "apply {ns}/{resource}/{name}: {}",
        resp.status()
    );
}

/// Every object of every pod set to `v`, a few writes at a time.
async fn put_all(cluster: &TestCluster, v: &str) {
    let mut writes = Vec::new();
    for n in 0..NAMESPACES {
        let ns = format!("kl{n}");
        for p in 0..PODS_PER_NAMESPACE {
            for s in 0..SECRETS_PER_POD {
                writes.push((ns.clone(), "secrets", format!("p{p}-s{s}")));
            }
            for c in 0..CONFIGMAPS_PER_POD {
                writes.push((ns.clone(), "configmaps", format!("p{p}-c{c}")));
            }
        }
    }
    for chunk in writes.chunks(16) {
        futures::future::join_all(
            chunk
                .iter()
                .map(|(ns, r, name)| put(cluster, ns, r, name, v)),
        )
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_kubelets_own_managers_sync_and_follow_updates_through_kcache() {
    let cluster = TestCluster::start().await;
    let k = Kcache::start(&cluster, "").await;
    for n in 0..NAMESPACES {
        let ns = format!("kl{n}");
        create_as_admin(
            &cluster,
            "/api/v1/namespaces",
            json!({"metadata": {"name": ns}}),
        )
        .await;
        // No controller-manager on this rig: the ServiceAccount admission plugin needs the
        // namespace's default ServiceAccount to exist before pods can be created.
        create_as_admin(
            &cluster,
            &format!("/api/v1/namespaces/{ns}/serviceaccounts"),
            json!({"metadata": {"name": "default"}}),
        )
        .await;
        for p in 0..PODS_PER_NAMESPACE {
            let mut volumes = Vec::new();
            for s in 0..SECRETS_PER_POD {
                volumes.push(json!({"name": format!("s{s}"), "secret": {"secretName": format!("p{p}-s{s}")}}));
            }
            for c in 0..CONFIGMAPS_PER_POD {
                volumes.push(
                    json!({"name": format!("c{c}"), "configMap": {"name": format!("p{p}-c{c}")}}),
                );
            }
            create_as_admin(
                &cluster,
                &format!("/api/v1/namespaces/{ns}/pods"),
                json!({
                    "metadata": {"name": format!("p{p}")},
                    "spec": {
                        "nodeName": "node1",
                        "automountServiceAccountToken": false,
                        "containers": [{"name": "c", "image": "busybox"}],
                        "volumes": volumes,
                    }
                }),
            )
            .await;
        }
    }
    put_all(&cluster, "1").await;
    let baseline =
        cluster.upstream_watches("secrets").await + cluster.upstream_watches("configmaps").await;
    let stderr_path = cluster.dir_path().join("kcache-kubelet.stderr");
    let mut child = tokio::process::Command::new(support::judge_bin("kcache-kubelet"))
        .args([
            "--server",
            &k.url,
            "--token",
            "node1token",
            "--node",
            "node1",
        ])
        .args(["--await-value", "2", "--timeout", "300s"])
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&stderr_path).expect("stderr file"))
        .kill_on_drop(true)
        .spawn()
        .expect("start kcache-kubelet");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let stderr = || std::fs::read_to_string(&stderr_path).unwrap_or_default();
    let synced = tokio::time::timeout(Duration::from_secs(300), lines.next_line())
        .await
        .expect("the managers sync within 300 s")
        .expect("read")
        .unwrap_or_else(|| panic!("kcache-kubelet exited before syncing:\n{}", stderr()));
    let objects = NAMESPACES * PODS_PER_NAMESPACE * (SECRETS_PER_POD + CONFIGMAPS_PER_POD);
    assert_eq!(
        synced,
        format!(
            "synced pods={} objects={objects}",
            NAMESPACES * PODS_PER_NAMESPACE
        )
    );
    // The kubelet's reflectors cost the API server one watch per key at most (here every
    // object is its own name key, and coalescing adds a namespace key per namespace and
    // resource: never one per client), and coalescing
    // then folds the name keys to at most two per namespace and resource. (That a burst
    // starts every name key before coalescing folds them is issue 31's to remove.)
    let during =
        cluster.upstream_watches("secrets").await + cluster.upstream_watches("configmaps").await;
    assert!(
        during <= baseline + (objects + 2 * NAMESPACES) as u64,
        "upstream watches {baseline} -> {during} for {objects} reflectors"
    );
    eventually(
        "coalesced to at most two upstream watches per namespace and resource",
        Duration::from_secs(90),
        || async {
            let now = cluster.upstream_watches("secrets").await
                + cluster.upstream_watches("configmaps").await;
            now <= baseline + (2 * 2 * NAMESPACES) as u64
        },
    )
    .await;
    // Every update reaches every pod's managers.
    put_all(&cluster, "2").await;
    let summary = tokio::time::timeout(Duration::from_secs(300), lines.next_line())
        .await
        .expect("every update arrives within 300 s")
        .expect("read")
        .unwrap_or_default();
    let status = child.wait().await.expect("wait");
    assert!(
        status.success() && !summary.is_empty(),
        "kcache-kubelet: {status}\n{}",
        stderr()
    );
    let v: Value = serde_json::from_str(&summary).expect("summary JSON");
    assert_eq!(v["objects"], objects, "{v}");
    // Each reflector's first sync was a streaming list, none failed, and none fell back to
    // a plain list.
    assert!(
        v["streamingLists"].as_u64().unwrap_or(0) >= objects as u64,
        "{v}"
    );
    assert_eq!(v["lists"], 0, "{v}");
    assert_eq!(v["errors"], 0, "{v}");
    assert!(
        !stderr().contains("awaiting required bookmark"),
        "a reflector waited for an initial-events-end bookmark:\n{}",
        stderr()
    );
    // The streaming lists were kcache's: proven fresh, none forwarded.
    let m = k.metrics_text().await;
    let forwarded = support::kcache::sum_samples(
        &m,
        "kcache_consistent_reads_total",
        Some("outcome=\"forwarded\""),
    );
    assert_eq!(forwarded, 0.0, "consistent reads forwarded upstream");
    eprintln!("kcache-kubelet through kcache: {v}");
}
