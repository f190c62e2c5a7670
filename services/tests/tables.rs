//! `as=Table` answers (what `kubectl get` prints) through kcache against the reference API
//! server's own, for every resource kcache caches by default: the same column definitions
//! (the upstream's own, learned at start), the same cells (ages aside, a pod's last
//! restart's too: two calls a second apart may differ), the same row conditions and row objects. A resource the upstream
//! prints with other columns than kcache's printer has its Tables forwarded.

mod support;

use serde_json::{json, Value};
use support::kcache::Kcache;
use support::{create_as_admin, TestCluster, ADMIN_TOKEN};

const TABLE: &str = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json";

/// A Table with its age cells blanked and its list metadata left out (each server's own
/// resourceVersion).
fn comparable(mut t: Value) -> Value {
    let ages: Vec<usize> = t["columnDefinitions"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
        .filter(|(_, c)| c["name"] == "Age")
        .map(|(i, _)| i)
        .collect();
    if let Some(rows) = t["rows"].as_array_mut() {
        for row in rows {
            for &i in &ages {
                if let Some(cell) = row["cells"].get_mut(i) {
                    *cell = json!("<age>");
                }
            }
            // A pod's restarts with the last restart's age: "7 (91s ago)".
            for cell in row["cells"].as_array_mut().into_iter().flatten() {
                let aged = cell
                    .as_str()
                    .and_then(|c| c.strip_suffix(" ago)"))
                    .and_then(|c| c.split_once(" ("))
                    .map(|(n, _)| format!("{n} (<age> ago)"));
                if let Some(a) = aged {
                    *cell = json!(a);
                }
            }
        }
    }
    if let Some(o) = t.as_object_mut() {
        o.remove("metadata");
    }
    t
}

async fn table(base: &str, path: &str) -> (u16, Value) {
    let resp = support::insecure_http()
        .get(format!("{base}{path}"))
        .bearer_auth(ADMIN_TOKEN)
        .header("Accept", TABLE)
        .send()
        .await
        .expect("request");
    let code = resp.status().as_u16();
    (code, resp.json().await.unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tables_from_the_cache_are_the_api_servers() {
    let cluster = TestCluster::start().await;
    let k = Kcache::start(&cluster, "").await;
    let admin = cluster.kube_client().await;
    support::create_namespace(&admin, "tb").await;
    let ns = "/api/v1/namespaces/tb";
    for (path, body) in [
        // No controllers run: the pod's service account is made by hand.
        (
            format!("{ns}/serviceaccounts"),
            json!({"metadata": {"name": "default"}}),
        ),
        (
            format!("{ns}/secrets"),
            json!({"metadata": {"name": "s1", "labels": {"a": "b"}}, "type": "Opaque", "data": {"k": "dg=="}}),
        ),
        (
            format!("{ns}/configmaps"),
            json!({"metadata": {"name": "c1"}, "data": {"k": "v", "l": "w"}}),
        ),
        (
            format!("{ns}/pods"),
            json!({"metadata": {"name": "p1"}, "spec": {"nodeName": "node1", "automountServiceAccountToken": false, "containers": [
                {"name": "a", "image": "busybox"}, {"name": "b", "image": "busybox"}]}}),
        ),
        (
            format!("{ns}/services"),
            json!({"metadata": {"name": "svc1"}, "spec": {"selector": {"app": "x"}, "ports": [
                {"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"},
                {"name": "dns", "port": 53, "protocol": "UDP"}]}}),
        ),
        (
            format!("{ns}/services"),
            json!({"metadata": {"name": "ext"}, "spec": {"type": "ExternalName", "externalName": "example.invalid"}}),
        ),
        (
            format!("{ns}/endpoints"),
            json!({"metadata": {"name": "ep1"}, "subsets": [{"addresses": [{"ip": "10.0.0.1"}, {"ip": "10.0.0.2"}],
                "ports": [{"port": 80, "protocol": "TCP"}]}]}),
        ),
        (
            "/apis/discovery.k8s.io/v1/namespaces/tb/endpointslices".to_string(),
            json!({"metadata": {"name": "es1", "labels": {"kubernetes.io/service-name": "svc1"}}, "addressType": "IPv4",
                "endpoints": [{"addresses": ["10.0.0.1"]}, {"addresses": ["10.0.0.2"]}],
                "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}]}),
        ),
        (
            "/apis/discovery.k8s.io/v1/namespaces/tb/endpointslices".to_string(),
            json!({"metadata": {"name": "es2"}, "addressType": "IPv6",
                "endpoints": [{"addresses": ["fd00::1"]}, {"addresses": ["fd00::2"]}, {"addresses": ["fd00::3"]}, {"addresses": ["fd00::4"]}, {"addresses": ["fd00::5"]}],
                "ports": [{"name": "a", "port": 1, "protocol": "TCP"}, {"name": "b", "protocol": "TCP"}, {"name": "c", "port": 3, "protocol": "UDP"}, {"name": "d", "port": 4, "protocol": "UDP"}]}),
        ),
        (
            "/apis/discovery.k8s.io/v1/namespaces/tb/endpointslices".to_string(),
            json!({"metadata": {"name": "es3"}, "addressType": "FQDN", "endpoints": [], "ports": []}),
        ),
    ] {
        create_as_admin(&cluster, &path, body).await;
    }
    // Pods in the states the printer reads (no kubelet runs: their status is written as
    // one would): a sidecar among the init containers, restarts with a last restart's age,
    // a crash loop, an init container waiting, a scheduling gate.
    let ago = |secs: i64| {
        kcache_actors::core::time::format_rfc3339(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs() as i64)
                - secs,
        )
    };
    let pods = [
        (
            "p2",
            json!({"initContainers": [{"name": "init", "image": "busybox"}, {"name": "side", "image": "busybox", "restartPolicy": "Always"}],
                   "containers": [{"name": "a", "image": "busybox"}]}),
            json!({"phase": "Pending", "conditions": [{"type": "Initialized", "status": "False"}],
                   "initContainerStatuses": [
                       {"name": "init", "image": "busybox", "imageID": "", "ready": false, "restartCount": 0, "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}},
                       {"name": "side", "image": "busybox", "imageID": "", "ready": true, "started": true, "restartCount": 1, "state": {"running": {}},
                        "lastState": {"terminated": {"exitCode": 1, "finishedAt": ago(30)}}}],
                   "containerStatuses": [{"name": "a", "image": "busybox", "imageID": "", "ready": false, "restartCount": 0, "state": {"waiting": {"reason": "PodInitializing"}}}]}),
        ),
        (
            "p3",
            json!({"containers": [{"name": "a", "image": "busybox"}, {"name": "b", "image": "busybox"}]}),
            json!({"phase": "Running", "conditions": [{"type": "Initialized", "status": "True"}, {"type": "Ready", "status": "False"}],
                   "podIPs": [{"ip": "10.0.0.9"}], "podIP": "10.0.0.9",
                   "containerStatuses": [
                       {"name": "a", "image": "busybox", "imageID": "", "ready": true, "restartCount": 2, "state": {"running": {}},
                        "lastState": {"terminated": {"exitCode": 1, "finishedAt": ago(90)}}},
                       {"name": "b", "image": "busybox", "imageID": "", "ready": false, "restartCount": 5, "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                        "lastState": {"terminated": {"exitCode": 2, "finishedAt": ago(4000)}}}]}),
        ),
        (
            "p4",
            json!({"initContainers": [{"name": "init", "image": "busybox"}], "containers": [{"name": "a", "image": "busybox"}]}),
            json!({"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False", "reason": "SchedulingGated"}],
                   "initContainerStatuses": [{"name": "init", "image": "busybox", "imageID": "", "ready": false, "restartCount": 3, "state": {"waiting": {"reason": "ErrImagePull"}}}]}),
        ),
    ];
    for (name, spec, status) in pods {
        let mut spec = spec;
        spec["automountServiceAccountToken"] = json!(false);
        let created = create_as_admin(
            &cluster,
            &format!("{ns}/pods"),
            json!({"metadata": {"name": name}, "spec": spec}),
        )
        .await;
        let mut pod = created;
        pod["status"] = status;
        let resp = support::insecure_http()
            .put(format!("{}{ns}/pods/{name}/status", cluster.url))
            .bearer_auth(ADMIN_TOKEN)
            .json(&pod)
            .send()
            .await
            .expect("status update");
        let code = resp.status();
        assert!(
            code.is_success(),
            "{name}'s status: {code} {}",
            resp.text().await.unwrap_or_default()
        );
    }
    let mut compared = 0;
    for path in [
        format!("{ns}/secrets?resourceVersion=0"),
        format!("{ns}/secrets/s1?resourceVersion=0"),
        format!("{ns}/configmaps?resourceVersion=0"),
        format!("{ns}/pods?resourceVersion=0"),
        format!("{ns}/pods/p1?resourceVersion=0"),
        format!("{ns}/services?resourceVersion=0"),
        format!("{ns}/endpoints?resourceVersion=0"),
        "/api/v1/namespaces?resourceVersion=0".to_string(),
        "/apis/discovery.k8s.io/v1/namespaces/tb/endpointslices?resourceVersion=0".to_string(),
    ] {
        let (code, direct) = table(&cluster.url, &path).await;
        assert_eq!(code, 200, "{path}: {direct}");
        // Through kcache, served from its cache once the key is synced.
        let (code, through) = table(&k.url, &path).await;
        assert_eq!(code, 200, "{path}: {through}");
        assert_eq!(direct["kind"], "Table", "{path}: {direct}");
        let (want, got) = (comparable(direct), comparable(through));
        assert_eq!(
            got["columnDefinitions"], want["columnDefinitions"],
            "{path}: column definitions"
        );
        let cells = |t: &Value| -> Vec<Value> {
            t["rows"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|r| r["cells"].clone())
                .collect()
        };
        assert_eq!(cells(&got), cells(&want), "{path}: cells");
        assert_eq!(got["rows"], want["rows"], "{path}: rows");
        assert_eq!(got, want, "{path}");
        compared += 1;
    }
    assert_eq!(compared, 9);
    // Every one served by the cache: kcache's printers print the columns the reference
    // version prints (a resource the upstream printed otherwise would be forwarded).
    let m = k.metrics_text().await;
    let served = |resource: &str| {
        support::prom::sum_samples(
            &m,
            "kcache_requests_total",
            Some(&format!(
                "resource=\"{resource}\",code=\"200\",served=\"cache\""
            )),
        )
    };
    for resource in [
        "secrets",
        "configmaps",
        "pods",
        "services",
        "endpoints",
        "namespaces",
        "endpointslices",
    ] {
        assert!(served(resource) >= 1.0, "{resource}: {m}");
    }
    let forwarded = |resource: &str| {
        support::prom::sum_samples(
            &m,
            "kcache_cache_bypassed_total",
            Some(&format!("resource=\"{resource}\",reason=\"table\"")),
        )
    };
    assert_eq!(
        (forwarded("pods"), forwarded("endpointslices")),
        (0.0, 0.0),
        "{m}"
    );
}
