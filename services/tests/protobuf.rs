//! Protobuf from the cache, judged against the real API server's own protobuf: the same
//! gets, lists and watches with `Accept: application/vnd.kubernetes.protobuf`, to both,
//! decoded by an independent decoder (kube-rs's k8s-pb) and compared field by field.
//!
//! What differs legitimately is normalised away: Go writes some zero values (an empty
//! string, a zero Time) that the JSON kcache derives from omits; a decoder reads both the
//! same.

mod support;

use std::fmt::Debug;
use std::time::Duration;

use futures::StreamExt;
use k8s_pb::api::core::v1 as core;
use k8s_pb::apimachinery::pkg::apis::meta::v1 as meta;
use k8s_pb::apimachinery::pkg::runtime::Unknown;
use prost::Message;
use serde_json::json;
use support::kcache::Kcache;
use support::{create_namespace, insecure_http, TestCluster, ADMIN_TOKEN};

const PB: &str = "application/vnd.kubernetes.protobuf";

async fn get_pb(base: &str, path: &str) -> (u16, String, bytes::Bytes) {
    let resp = insecure_http()
        .get(format!("{base}{path}"))
        .bearer_auth(ADMIN_TOKEN)
        .header("accept", PB)
        .timeout(Duration::from_secs(20))
        .send()
        .await
        .unwrap_or_else(|e| panic!("GET {base}{path}: {e}"));
    let code = resp.status().as_u16();
    let ct = content_type(&resp);
    (code, ct, resp.bytes().await.expect("body"))
}

fn content_type(resp: &reqwest::Response) -> String {
    resp.headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string()
}

fn unwrap_envelope(b: &[u8]) -> Unknown {
    assert!(
        b.starts_with(b"k8s\x00"),
        "no protobuf magic: {:?}",
        &b[..b.len().min(16)]
    );
    Unknown::decode(&b[4..]).expect("runtime.Unknown")
}

/// The Debug form of a decoded object with zero values and empty messages dropped: what a
/// Go client decodes the same whether they were written or not.
fn normalized<T: Debug>(v: &T) -> String {
    let zero = regex::Regex::new(r#"Some\((""|0|false|\[\])\)"#).unwrap();
    let empty = regex::Regex::new(r"Some\(\w+ \{ (\w+: None, )*\w+: None \}\)").unwrap();
    let mut s = format!("{v:?}");
    loop {
        let next = empty
            .replace_all(&zero.replace_all(&s, "None"), "None")
            .into_owned();
        if next == s {
            return s;
        }
        s = next;
    }
}

/// A GET from both, decoded as `T`: the same wire form and the same object.
async fn same_get<T: Message + Default + Debug>(cluster: &TestCluster, kc: &Kcache, path: &str) {
    let (up_code, up_ct, up) = get_pb(&cluster.url, path).await;
    let (code, ct, ours) = get_pb(&kc.url, path).await;
    assert_eq!((up_code, code), (200, 200), "{path}");
    assert_eq!(up_ct, PB, "{path}: the API server answers protobuf");
    assert_eq!(ct, PB, "{path}: kcache answers protobuf");
    let (a, b) = (unwrap_envelope(&up), unwrap_envelope(&ours));
    assert_eq!(a.type_meta, b.type_meta, "{path}");
    let decode = |u: &Unknown| T::decode(u.raw.as_deref().unwrap_or_default()).expect("decodes");
    diff(path, &normalized(&decode(&a)), &normalized(&decode(&b)));
}

fn diff(path: &str, up: &str, ours: &str) {
    if up != ours {
        let at = up
            .bytes()
            .zip(ours.bytes())
            .take_while(|(a, b)| a == b)
            .count();
        // 200 bytes either side, widened to whole characters.
        let around = |s: &str| {
            let (mut from, mut to) = (at.saturating_sub(200), (at + 200).min(s.len()));
            while !s.is_char_boundary(from) {
                from -= 1;
            }
            while !s.is_char_boundary(to) {
                to += 1;
            }
            s[from..to].to_string()
        };
        panic!(
            "{path}: kcache's protobuf differs from the API server's at byte {at}\n API server: …{}\n kcache:     …{}",
            around(up),
            around(ours)
        );
    }
}

/// One watch's frames: (type, normalised object) for the first `n` object events.
async fn watch_pb(base: &str, path: &str, n: usize) -> Vec<(String, String)> {
    let resp = insecure_http()
        .get(format!("{base}{path}"))
        .bearer_auth(ADMIN_TOKEN)
        .header("accept", PB)
        .send()
        .await
        .expect("watch");
    assert_eq!(resp.status().as_u16(), 200, "{base}{path}");
    let ct = content_type(&resp);
    assert_eq!(
        ct, "application/vnd.kubernetes.protobuf;stream=watch",
        "{base}"
    );
    let mut body = resp.bytes_stream();
    let mut buf: Vec<u8> = Vec::new();
    let mut out = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while out.len() < n {
        while buf.len() >= 4 {
            let len = u32::from_be_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
            if buf.len() < 4 + len {
                break;
            }
            let ev = meta::WatchEvent::decode(&buf[4..4 + len]).expect("a WatchEvent frame");
            buf.drain(..4 + len);
            let ty = ev.r#type.clone().unwrap_or_default();
            let raw = ev.object.and_then(|o| o.raw).unwrap_or_default();
            let unk = unwrap_envelope(&raw);
            assert_ne!(ty, "ERROR", "{base}: {unk:?}");
            if ty == "BOOKMARK" {
                continue;
            }
            let cm = core::ConfigMap::decode(unk.raw.as_deref().unwrap_or_default())
                .expect("a ConfigMap");
            out.push((ty, normalized(&cm)));
        }
        if out.len() >= n {
            break;
        }
        match tokio::time::timeout_at(deadline, body.next()).await {
            Ok(Some(Ok(chunk))) => buf.extend_from_slice(&chunk),
            other => panic!(
                "{base}{path}: watch ended after {} events: {other:?}",
                out.len()
            ),
        }
    }
    out
}

#[tokio::test]
async fn protobuf_gets_lists_and_watches_match_the_api_server() {
    let cluster = TestCluster::start().await;
    // Deployments: an extra resource, cached from configuration (the apps group).
    let kc = Kcache::start(
        &cluster,
        "[[resources]]\ngroup = \"apps\"\nversion = \"v1\"\nresource = \"deployments\"\n",
    )
    .await;
    let client = cluster.kube_client().await;
    let ns = "pb";
    create_namespace(&client, ns).await;
    let create = |path: &'static str, body: serde_json::Value| {
        let url = cluster.url.clone();
        async move {
            let r = insecure_http()
                .post(format!("{url}{path}"))
                .bearer_auth(ADMIN_TOKEN)
                .json(&body)
                .send()
                .await
                .expect("create");
            assert!(
                r.status().is_success(),
                "{path}: {}",
                r.text().await.unwrap_or_default()
            );
        }
    };
    create("/api/v1/namespaces/pb/configmaps", json!({"metadata":{"name":"cm1","labels":{"a":"1","b":"x"},"annotations":{"n":"line\nbreak \"q\" é"}},"data":{"k":"v","empty":""},"binaryData":{"b":"AAEC/w=="}})).await;
    create(
        "/api/v1/namespaces/pb/configmaps",
        json!({"metadata":{"name":"cm2"},"immutable":true}),
    )
    .await;
    create(
        "/api/v1/namespaces/pb/secrets",
        json!({"metadata":{"name":"s1"},"type":"Opaque","data":{"k":"aGVsbG8="}}),
    )
    .await;
    create("/api/v1/namespaces/pb/services", json!({"metadata":{"name":"svc"},"spec":{"ports":[{"name":"a","port":80,"targetPort":8080},{"name":"b","port":81,"targetPort":"http","protocol":"UDP"}],"selector":{"app":"x"}}})).await;
    // No controller manager here to make the namespace's default service account.
    create(
        "/api/v1/namespaces/pb/serviceaccounts",
        json!({"metadata":{"name":"default"}}),
    )
    .await;
    create("/api/v1/namespaces/pb/pods", json!({"metadata":{"name":"p1","labels":{"app":"x"}},"spec":{"automountServiceAccountToken":false,"containers":[{"name":"c","image":"busybox","command":["sh","-c","sleep 1e9"],"env":[{"name":"S","valueFrom":{"secretKeyRef":{"name":"s1","key":"k"}}}],"resources":{"limits":{"cpu":"500m","memory":"128Mi"}},"livenessProbe":{"httpGet":{"path":"/","port":8080}},"readinessProbe":{"tcpSocket":{"port":"http"}}}],"volumes":[{"name":"v","configMap":{"name":"cm1","defaultMode":420}}],"tolerations":[{"key":"k","operator":"Exists","effect":"NoExecute","tolerationSeconds":300}]}})).await;
    create("/apis/apps/v1/namespaces/pb/deployments", json!({"metadata":{"name":"d"},"spec":{"replicas":0,"selector":{"matchLabels":{"app":"x"}},"template":{"metadata":{"labels":{"app":"x"}},"spec":{"containers":[{"name":"c","image":"busybox"}]}},"strategy":{"type":"RollingUpdate","rollingUpdate":{"maxUnavailable":"25%","maxSurge":1}}}})).await;

    // Gets by name and lists at resourceVersion=0 (as informers list and the kubelet
    // reads): kcache answers these from its cache; a consistent read goes upstream.
    let ns_path = |rest: &str| format!("/api/v1/namespaces/pb/{rest}?resourceVersion=0");
    same_get::<core::ConfigMap>(&cluster, &kc, &ns_path("configmaps/cm1")).await;
    same_get::<core::Secret>(&cluster, &kc, &ns_path("secrets/s1")).await;
    same_get::<core::Service>(&cluster, &kc, &ns_path("services/svc")).await;
    same_get::<core::Pod>(&cluster, &kc, &ns_path("pods/p1")).await;
    same_get::<k8s_pb::api::apps::v1::Deployment>(
        &cluster,
        &kc,
        "/apis/apps/v1/namespaces/pb/deployments/d?resourceVersion=0",
    )
    .await;
    for path in [
        "/api/v1/namespaces/pb/configmaps?resourceVersion=0",
        "/api/v1/namespaces/pb/pods?resourceVersion=0",
    ] {
        let (_, _, up) = get_pb(&cluster.url, path).await;
        let (code, ct, ours) = get_pb(&kc.url, path).await;
        assert_eq!((code, ct.as_str()), (200, PB), "{path}");
        let (a, b) = (unwrap_envelope(&up), unwrap_envelope(&ours));
        assert_eq!(a.type_meta, b.type_meta, "{path}");
        // Items only: each server lists at its own resourceVersion. By name: the API
        // server's `resourceVersion=0` list comes from its watch cache's map, in Go's map
        // order (random from one list to the next), so order is no part of the answer.
        let name = |m: &Option<k8s_pb::apimachinery::pkg::apis::meta::v1::ObjectMeta>| {
            m.as_ref().and_then(|m| m.name.clone()).unwrap_or_default()
        };
        let items = |u: &Unknown| -> String {
            if path.contains("pods") {
                let mut l = core::PodList::decode(u.raw.as_deref().unwrap_or_default()).unwrap();
                l.items.sort_by_key(|o| name(&o.metadata));
                normalized(&l.items)
            } else {
                let mut l =
                    core::ConfigMapList::decode(u.raw.as_deref().unwrap_or_default()).unwrap();
                l.items.sort_by_key(|o| name(&o.metadata));
                normalized(&l.items)
            }
        };
        diff(path, &items(&a), &items(&b));
    }

    // A watch from the list's RV on both, then three changes.
    let (_, _, list) = get_pb(&cluster.url, "/api/v1/namespaces/pb/configmaps").await;
    let rv = core::ConfigMapList::decode(unwrap_envelope(&list).raw.as_deref().unwrap())
        .unwrap()
        .metadata
        .and_then(|m| m.resource_version)
        .expect("list RV");
    let path = format!(
        "/api/v1/namespaces/pb/configmaps?watch=1&resourceVersion={rv}&allowWatchBookmarks=true"
    );
    let up = tokio::spawn({
        let (url, path) = (cluster.url.clone(), path.clone());
        async move { watch_pb(&url, &path, 3).await }
    });
    let ours = tokio::spawn({
        let (url, path) = (kc.url.clone(), path.clone());
        async move { watch_pb(&url, &path, 3).await }
    });
    tokio::time::sleep(Duration::from_secs(1)).await;
    create(
        "/api/v1/namespaces/pb/configmaps",
        json!({"metadata":{"name":"cm3"},"data":{"x":"1"}}),
    )
    .await;
    let patch = insecure_http()
        .patch(format!(
            "{}/api/v1/namespaces/pb/configmaps/cm1",
            cluster.url
        ))
        .bearer_auth(ADMIN_TOKEN)
        .header("content-type", "application/merge-patch+json")
        .body(r#"{"data":{"k":"v2"}}"#)
        .send()
        .await
        .expect("patch");
    assert!(patch.status().is_success());
    let del = insecure_http()
        .delete(format!(
            "{}/api/v1/namespaces/pb/configmaps/cm2",
            cluster.url
        ))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .expect("delete");
    assert!(del.status().is_success());
    let (up, ours) = (
        up.await.expect("upstream watch"),
        ours.await.expect("kcache watch"),
    );
    let kinds: Vec<&str> = ours.iter().map(|(t, _)| t.as_str()).collect();
    assert_eq!(kinds, ["ADDED", "MODIFIED", "DELETED"]);
    for (i, (a, b)) in up.iter().zip(&ours).enumerate() {
        assert_eq!(a.0, b.0, "event {i}");
        diff(&format!("watch event {i}"), &a.1, &b.1);
    }
    // Everything above went through kcache as protobuf GETs: each served from the cache
    // (a proxied one would have been the API server's own bytes, proving nothing).
    let text = kc.metrics_text().await;
    let proxied =
        support::prom::sum_samples_with_label(&text, "kcache_requests_total", "served", "proxy");
    let cached =
        support::prom::sum_samples_with_label(&text, "kcache_requests_total", "served", "cache");
    assert_eq!(
        proxied,
        0.0,
        "protobuf requests were proxied:\n{}",
        text.lines()
            .filter(|l| l.contains("bypassed") || l.contains("kcache_requests_total"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert!(cached >= 8.0, "cache-served requests: {cached}");
}

/// client-go itself, speaking protobuf only (as the kubelet and kube-proxy do): its
/// informer syncs through kcache exactly as through the API server, every list and get
/// it receives is protobuf on the wire (the envelope's magic, not just the header), its
/// watch is a protobuf stream, and a write made after the sync reaches it by that watch.
#[tokio::test]
async fn a_client_go_protobuf_informer_syncs_through_kcache() {
    use tokio::io::AsyncBufReadExt;
    let bin = support::judge_bin("kcache-pb-informer");
    let cluster = TestCluster::start().await;
    let kc = Kcache::start(&cluster, "").await;
    let client = cluster.kube_client().await;
    create_namespace(&client, "inf").await;
    let cms: kube::Api<k8s_openapi::api::core::v1::ConfigMap> =
        kube::Api::namespaced(client.clone(), "inf");
    let cm = |name: &str, v: &str| -> k8s_openapi::api::core::v1::ConfigMap {
        serde_json::from_value(json!({"metadata":{"name":name},"data":{"k":v}})).unwrap()
    };
    for i in 0..5 {
        cms.create(&Default::default(), &cm(&format!("cm{i}"), "x"))
            .await
            .expect("create");
    }
    for (who, url, before) in [("the API server", &cluster.url, 5), ("kcache", &kc.url, 6)] {
        let late = format!("late-{}", before);
        let mut child = tokio::process::Command::new(&bin)
            .args([
                "--server",
                url,
                "--token",
                ADMIN_TOKEN,
                "--namespace",
                "inf",
            ])
            .args(["--await", &late, "--timeout", "60s"])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("start kcache-pb-informer");
        let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
        let first = tokio::time::timeout(Duration::from_secs(60), lines.next_line())
            .await
            .unwrap_or_else(|_| panic!("{who}: no sync in 60 s"))
            .expect("read")
            .unwrap_or_else(|| panic!("{who}: informer exited before syncing"));
        assert_eq!(first, format!("synced {before}"), "{who}");
        cms.create(&Default::default(), &cm(&late, "after-sync"))
            .await
            .expect("create");
        let summary = tokio::time::timeout(Duration::from_secs(60), lines.next_line())
            .await
            .unwrap_or_else(|_| panic!("{who}: the post-sync write did not arrive in 60 s"))
            .expect("read")
            .unwrap_or_else(|| panic!("{who}: informer exited without a summary"));
        let status = child.wait().await.expect("wait");
        assert!(status.success(), "{who}: {status}");
        let v: serde_json::Value = serde_json::from_str(&summary).expect("summary JSON");
        assert_eq!(v["objects"], before + 1, "{who}: {v}");
        assert_eq!(v["awaited"], json!({"k": "after-sync"}), "{who}: {v}");
        let responses = v["responses"].as_array().expect("responses");
        let (watches, reads): (Vec<_>, Vec<_>) = responses.iter().partition(|r| r["watch"] == true);
        // The reference client-go syncs by streaming list (a watch); lists appear only on
        // a fallback, and each must be protobuf too.
        assert!(!watches.is_empty(), "{who}: {v}");
        for r in reads {
            assert_eq!(r["status"], 200, "{who}: {r}");
            assert_eq!(r["contentType"], PB, "{who}: {r}");
            assert_eq!(r["magic"], true, "{who}: not protobuf on the wire: {r}");
        }
        for r in watches {
            assert_eq!(
                r["contentType"], "application/vnd.kubernetes.protobuf;stream=watch",
                "{who}: {r}"
            );
        }
    }
    // The informer's list and watch were kcache's own answers, not the API server's.
    let text = kc.metrics_text().await;
    let proxied =
        support::prom::sum_samples_with_label(&text, "kcache_requests_total", "served", "proxy");
    assert_eq!(proxied, 0.0, "{text}");
}
