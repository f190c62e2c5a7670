//! The reference version's kubelet wiring as the judge: `kcache-kubelet`
//! (conformance/kubelet-manager/) runs the kubelet's own watch-based Secret and ConfigMap
//! managers, unchanged, for two nodes' pods — 100 pods × 10 objects each, the objects
//! shared by both nodes' pods — authenticating as each node (so the Node authorizer
//! decides, with the name selector of each reflector), through kcache. Every first sync is
//! a streaming list served by kcache; the API server's watch count grows by kcache's keys,
//! never by the kubelets' reflectors (both nodes reflect every object), and folds to at
//! most two per namespace and resource once coalesced; no reflector waits for a bookmark
//! that never comes; every update reaches every pod's manager on both nodes.

mod support;

use std::process::Stdio;
use std::time::Duration;

use serde_json::{json, Value};
use support::kcache::Kcache;
use support::nats::{fleet_toml, Nats};
use support::{create_as_admin, eventually, TestCluster};
use tokio::io::{AsyncBufReadExt, BufReader};

const NAMESPACES: usize = 4;
/// Per node and namespace.
const PODS_PER_NAMESPACE: usize = 25;
const SECRETS_PER_POD: usize = 5;
const CONFIGMAPS_PER_POD: usize = 5;
/// Each namespace's pool of Secrets and of ConfigMaps, which its pods on both nodes share:
/// pod p mounts objects p..p+4 of each pool (mod the pool).
const POOL: usize = 25;
const NODES: [(&str, &str); 2] = [("node1", "node1token"), ("node2", "node2token")];

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
    let path = format!("/api/v1/namespaces/{ns}/{resource}/{name}");
    let code = support::http::apply(&cluster.url, &path, &body).await;
    assert!(matches!(code, Some(200 | 201)), "apply {path}: {code:?}");
}

/// Every object of every pod set to `v`, a few writes at a time.
async fn put_all(cluster: &TestCluster, v: &str) {
    let mut writes = Vec::new();
    for n in 0..NAMESPACES {
        let ns = format!("kl{n}");
        for i in 0..POOL {
            writes.push((ns.clone(), "secrets", format!("s{i}")));
            writes.push((ns.clone(), "configmaps", format!("c{i}")));
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
    kubelets_through(&cluster, &[&k, &k]).await;
}

/// Through a 3-replica fleet: each node's kubelet on its own replica, the keys' owners
/// wherever the fleet puts them; still at most one upstream watch per key fleet-wide.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_kubelets_own_managers_sync_and_follow_updates_through_a_fleet() {
    let cluster = TestCluster::start().await;
    let nats = Nats::start(cluster.dir_path());
    let toml = fleet_toml(cluster.dir_path(), &nats, "");
    let mut fleet = Vec::new();
    for id in ["a", "b", "c"] {
        fleet.push(Kcache::start_with_args(&cluster, &toml, &["--replica-id", id]).await);
    }
    kubelets_through(&cluster, &[&fleet[0], &fleet[1]]).await;
}

/// Sets up two nodes' pods and runs each node's kubelet managers through `via[i]`.
async fn kubelets_through(cluster: &TestCluster, via: &[&Kcache; 2]) {
    for n in 0..NAMESPACES {
        let ns = format!("kl{n}");
        create_as_admin(
            cluster,
            "/api/v1/namespaces",
            json!({"metadata": {"name": ns}}),
        )
        .await;
        // No controller-manager on this rig: the ServiceAccount admission plugin needs the
        // namespace's default ServiceAccount to exist before pods can be created.
        create_as_admin(
            cluster,
            &format!("/api/v1/namespaces/{ns}/serviceaccounts"),
            json!({"metadata": {"name": "default"}}),
        )
        .await;
        for (node, _) in NODES {
            for p in 0..PODS_PER_NAMESPACE {
                let mut volumes = Vec::new();
                for s in 0..SECRETS_PER_POD {
                    let name = format!("s{}", (p + s) % POOL);
                    volumes.push(json!({"name": format!("s{s}"), "secret": {"secretName": name}}));
                }
                for c in 0..CONFIGMAPS_PER_POD {
                    let name = format!("c{}", (p + c) % POOL);
                    volumes.push(json!({"name": format!("c{c}"), "configMap": {"name": name}}));
                }
                create_as_admin(
                    cluster,
                    &format!("/api/v1/namespaces/{ns}/pods"),
                    json!({
                        "metadata": {"name": format!("{node}-p{p}")},
                        "spec": {
                            "nodeName": node,
                            "automountServiceAccountToken": false,
                            "containers": [{"name": "c", "image": "busybox"}],
                            "volumes": volumes,
                        }
                    }),
                )
                .await;
            }
        }
    }
    put_all(cluster, "1").await;
    let baseline =
        cluster.upstream_watches("secrets").await + cluster.upstream_watches("configmaps").await;
    // One kcache-kubelet per node, both through kcache.
    let mut kubelets = Vec::new();
    for ((node, token), k) in NODES.into_iter().zip(via) {
        let stderr_path = cluster
            .dir_path()
            .join(format!("kcache-kubelet-{node}.stderr"));
        let mut child = tokio::process::Command::new(support::judge_bin("kcache-kubelet"))
            .args(["--server", &k.url, "--token", token, "--node", node])
            .args(["--await-value", "2", "--timeout", "300s"])
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&stderr_path).expect("stderr file"))
            .kill_on_drop(true)
            .spawn()
            .expect("start kcache-kubelet");
        let lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
        kubelets.push((node, child, lines, stderr_path));
    }
    let stderr = |p: &std::path::Path| std::fs::read_to_string(p).unwrap_or_default();
    let refs = PODS_PER_NAMESPACE * NAMESPACES * (SECRETS_PER_POD + CONFIGMAPS_PER_POD);
    for (node, _, lines, path) in &mut kubelets {
        let synced = tokio::time::timeout(Duration::from_secs(300), lines.next_line())
            .await
            .expect("the managers sync within 300 s")
            .expect("read")
            .unwrap_or_else(|| {
                panic!(
                    "{node}: kcache-kubelet exited before syncing:\n{}",
                    stderr(path)
                )
            });
        assert_eq!(
            synced,
            format!(
                "synced pods={} objects={refs}",
                NAMESPACES * PODS_PER_NAMESPACE
            ),
            "{node}"
        );
    }
    // Both nodes reflect every object (a reflector per object and node: 400); the API
    // server sees at most one watch per kcache key — a name key per object (200) and the
    // namespace keys coalescing adds — never one per reflector; then coalescing folds the
    // name keys to at most two per namespace and resource.
    let objects = NAMESPACES * POOL * 2;
    let reflectors = objects * NODES.len();
    // A watcher moved onto a namespace key while coalescing may resume from before that
    // key's window: the key replays the gap with a watch of its own that ends within
    // REPLAY_WATCH_SECS (3 s). Those are the only extra watches allowed, and only while
    // they run: the bound must hold again within seconds, never by a reflector's watch.
    let mut during = 0;
    for _ in 0..20 {
        during = cluster.upstream_watches("secrets").await
            + cluster.upstream_watches("configmaps").await;
        if during <= baseline + (objects + 2 * NAMESPACES) as u64 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert!(
        during <= baseline + (objects + 2 * NAMESPACES) as u64,
        "upstream watches {baseline} -> {during} for {objects} objects, {reflectors} reflectors"
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
    // Every update reaches every pod's managers on both nodes.
    put_all(cluster, "2").await;
    for (node, mut child, mut lines, path) in kubelets {
        let summary = tokio::time::timeout(Duration::from_secs(300), lines.next_line())
            .await
            .expect("every update arrives within 300 s")
            .expect("read")
            .unwrap_or_default();
        let status = child.wait().await.expect("wait");
        assert!(
            status.success() && !summary.is_empty(),
            "{node}: {status}\n{}",
            stderr(&path)
        );
        let v: Value = serde_json::from_str(&summary).expect("summary JSON");
        assert_eq!(v["objects"], refs, "{node}: {v}");
        // Each reflector's first sync was a streaming list (one per object the node's pods
        // mount), none failed, none fell back to a plain list.
        assert!(
            v["streamingLists"].as_u64().unwrap_or(0) >= objects as u64,
            "{node}: {v}"
        );
        assert_eq!(v["lists"], 0, "{node}: {v}");
        assert_eq!(v["errors"], 0, "{node}: {v}");
        assert!(
            !stderr(&path).contains("awaiting required bookmark"),
            "{node}: a reflector waited for an initial-events-end bookmark:\n{}",
            stderr(&path)
        );
        eprintln!("kcache-kubelet {node} through kcache: {v}");
    }
    // The streaming lists were kcache's: proven fresh, none forwarded.
    for k in via {
        let m = k.metrics_text().await;
        let forwarded = support::prom::sum_samples(
            &m,
            "kcache_consistent_reads_total",
            Some("outcome=\"forwarded\""),
        );
        assert_eq!(
            forwarded, 0.0,
            "consistent reads forwarded upstream by {}",
            k.url
        );
    }
}
