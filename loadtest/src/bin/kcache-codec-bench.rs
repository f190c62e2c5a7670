//! The protobuf design's measurement (`loadtest/codec.sh`): how kcache should hold the two
//! encodings of a built-in object, measured on the API server's own objects.
//!
//! - **JSON first** (what kcache does): the upstream watch is JSON; the header is read
//!   from it; protobuf is derived from the JSON once per object, when a protobuf client
//!   first needs it (`core::proto`).
//! - **Protobuf first** (the alternative): the upstream watch is protobuf; the header would
//!   be read from protobuf, and JSON derived once per object for JSON clients.
//!
//! Per event, each side pays one read and, when both kinds of client watch, one
//! derivation; per delivery both share the bytes (no cost per watcher). This measures
//! those per-event costs on the same objects, and each encoding's size (the memory per
//! object). The alternative is not built, so its two steps are bounds: reading protobuf is
//! timed as a full decode into kube-rs's prost types (an upper bound for a header read),
//! deriving JSON as serde_json writing the k8s-openapi typed object (a lower bound: a
//! protobuf→JSON transcoder also has to decode).

use std::time::{Duration, Instant};

use bytes::Bytes;
use clap::Parser;
use kcache_actors::core::object::{Object, Schema};
use kcache_actors::core::proto::Codec;
use prost::Message as _;
use serde_json::{json, Value};

#[derive(Parser)]
struct Args {
    #[arg(long)]
    apiserver: String,
    #[arg(long, default_value = "admintoken")]
    token: String,
    #[arg(long, default_value = "codecbench")]
    namespace: String,
    /// Objects of each kind.
    #[arg(long, default_value_t = 1000)]
    objects: usize,
    /// Passes over the objects per measurement (the best pass is kept).
    #[arg(long, default_value_t = 5)]
    passes: usize,
    #[arg(long)]
    out: Option<String>,
}

fn http() -> reqwest::Client {
    kcache_loadtest::client::insecure_client(Duration::from_secs(30), None)
}

async fn post(a: &Args, path: &str, body: Value) {
    let r = http()
        .post(format!("{}{path}", a.apiserver))
        .bearer_auth(&a.token)
        .json(&body)
        .send()
        .await
        .expect("POST");
    let code = r.status();
    if !code.is_success() && code.as_u16() != 409 {
        panic!(
            "POST {path}: {code}: {}",
            r.text().await.unwrap_or_default()
        );
    }
}

async fn get(a: &Args, path: &str, accept: &str) -> Bytes {
    let r = http()
        .get(format!("{}{path}", a.apiserver))
        .bearer_auth(&a.token)
        .header("accept", accept)
        .send()
        .await
        .expect("GET");
    assert!(r.status().is_success(), "GET {path}: {}", r.status());
    r.bytes().await.expect("body")
}

/// Nanoseconds per object of the best of `passes` runs of `f` over every object.
fn time<T>(passes: usize, items: &[T], mut f: impl FnMut(&T)) -> f64 {
    let mut best = f64::MAX;
    for _ in 0..passes {
        let t = Instant::now();
        for i in items {
            f(i);
        }
        best = best.min(t.elapsed().as_nanos() as f64 / items.len() as f64);
    }
    best
}

struct Kind {
    name: &'static str,
    kind: &'static str,
    json: Vec<Bytes>,
    proto: Vec<Bytes>,
}

fn pod(ns: &str, i: usize) -> Value {
    // A DaemonSet-like pod as a real cluster holds them: labels, owner, probes, env,
    // mounts, resources, tolerations; status with conditions.
    json!({"metadata":{"name":format!("pod-{i:05}"),"namespace":ns,"labels":{"app":"agent","pod-template-hash":"7d9f8c6b5","controller-revision-hash":"5c8d7f"},
        "annotations":{"prometheus.io/scrape":"true","prometheus.io/port":"9100"}},
     "spec":{"automountServiceAccountToken":false,"nodeName":format!("node-{}", i % 100),"containers":[{"name":"agent","image":"registry.example.com/agent:v1.2.3",
        "args":["--config=/etc/agent/config.yaml","--v=2"],"ports":[{"name":"metrics","containerPort":9100,"protocol":"TCP"}],
        "env":[{"name":"NODE_NAME","valueFrom":{"fieldRef":{"apiVersion":"v1","fieldPath":"spec.nodeName"}}},{"name":"TOKEN","valueFrom":{"secretKeyRef":{"name":"agent","key":"token"}}}],
        "resources":{"limits":{"cpu":"200m","memory":"256Mi"},"requests":{"cpu":"100m","memory":"128Mi"}},
        "volumeMounts":[{"name":"config","mountPath":"/etc/agent"},{"name":"proc","mountPath":"/host/proc","readOnly":true}],
        "livenessProbe":{"httpGet":{"path":"/healthz","port":9100},"initialDelaySeconds":10,"periodSeconds":10},
        "readinessProbe":{"httpGet":{"path":"/ready","port":"metrics"}}}],
        "volumes":[{"name":"config","configMap":{"name":"agent-config"}},{"name":"proc","hostPath":{"path":"/proc"}}],
        "tolerations":[{"operator":"Exists","effect":"NoSchedule"},{"key":"node.kubernetes.io/not-ready","operator":"Exists","effect":"NoExecute","tolerationSeconds":300}]}})
}

#[tokio::main]
async fn main() {
    let a = Args::parse();
    let ns = a.namespace.clone();
    post(&a, "/api/v1/namespaces", json!({"metadata":{"name":ns}})).await;
    post(
        &a,
        &format!("/api/v1/namespaces/{ns}/serviceaccounts"),
        json!({"metadata":{"name":"default"}}),
    )
    .await;
    // ~1.4 KB ConfigMaps, as the cached-object scenario's.
    let data: serde_json::Map<String, Value> = (0..10)
        .map(|k| (format!("key-{k}"), Value::String("v".repeat(110))))
        .collect();
    for i in 0..a.objects {
        post(
            &a,
            &format!("/api/v1/namespaces/{ns}/configmaps"),
            json!({"metadata":{"name":format!("cm-{i:05}"),"labels":{"app":"bench"}},"data":data}),
        )
        .await;
        post(&a, &format!("/api/v1/namespaces/{ns}/pods"), pod(&ns, i)).await;
    }
    let mut kinds = Vec::new();
    for (name, kind, resource) in [
        ("ConfigMap", "ConfigMap", "configmaps"),
        ("Pod", "Pod", "pods"),
    ] {
        let path = format!("/api/v1/namespaces/{ns}/{resource}");
        let list: Value =
            serde_json::from_slice(&get(&a, &path, "application/json").await).expect("JSON list");
        let json: Vec<Bytes> = list["items"]
            .as_array()
            .expect("items")
            .iter()
            .map(|o| {
                let mut o = o.clone();
                o["kind"] = json!(kind);
                o["apiVersion"] = json!("v1");
                Bytes::from(serde_json::to_vec(&o).expect("JSON"))
            })
            .collect();
        let pb = get(&a, &path, "application/vnd.kubernetes.protobuf").await;
        let unk = k8s_pb::apimachinery::pkg::runtime::Unknown::decode(&pb[4..]).expect("Unknown");
        let raw = unk.raw.unwrap_or_default();
        let proto: Vec<Bytes> = if kind == "Pod" {
            let l = k8s_pb::api::core::v1::PodList::decode(&raw[..]).expect("PodList");
            l.items
                .iter()
                .map(|p| Bytes::from(p.encode_to_vec()))
                .collect()
        } else {
            let l = k8s_pb::api::core::v1::ConfigMapList::decode(&raw[..]).expect("list");
            l.items
                .iter()
                .map(|p| Bytes::from(p.encode_to_vec()))
                .collect()
        };
        assert_eq!(json.len(), proto.len());
        kinds.push(Kind {
            name,
            kind,
            json,
            proto,
        });
    }

    let mut rows = Vec::new();
    for k in &kinds {
        let codec = Codec::for_kind("", "v1", k.kind).expect("codec");
        let schema = Schema::of(
            "",
            if k.kind == "Pod" {
                "pods"
            } else {
                "configmaps"
            },
        );
        let avg = |v: &[Bytes]| v.iter().map(Bytes::len).sum::<usize>() as f64 / v.len() as f64;
        let (json_bytes, proto_bytes) = (avg(&k.json), avg(&k.proto));
        let read_json = time(a.passes, &k.json, |j| {
            std::hint::black_box(Object::parse(j.clone(), schema).expect("parse"));
        });
        let derive_proto = time(a.passes, &k.json, |j| {
            std::hint::black_box(codec.message(j).expect("encode"));
        });
        let msgs: Vec<Bytes> = k
            .json
            .iter()
            .map(|j| codec.message(j).expect("encode"))
            .collect();
        let frame = time(a.passes, &msgs, |m| {
            std::hint::black_box(codec.event("MODIFIED", m));
        });
        let read_proto = time(a.passes, &k.proto, |p| {
            if k.kind == "Pod" {
                std::hint::black_box(k8s_pb::api::core::v1::Pod::decode(&p[..]).expect("decode"));
            } else {
                std::hint::black_box(
                    k8s_pb::api::core::v1::ConfigMap::decode(&p[..]).expect("decode"),
                );
            }
        });
        let typed: Vec<Value> = k
            .json
            .iter()
            .map(|j| serde_json::from_slice(j).unwrap())
            .collect();
        let derive_json = if k.kind == "Pod" {
            let pods: Vec<k8s_openapi::api::core::v1::Pod> = typed
                .iter()
                .map(|v| serde_json::from_value(v.clone()).unwrap())
                .collect();
            time(a.passes, &pods, |p| {
                std::hint::black_box(serde_json::to_vec(p).unwrap());
            })
        } else {
            let cms: Vec<k8s_openapi::api::core::v1::ConfigMap> = typed
                .iter()
                .map(|v| serde_json::from_value(v.clone()).unwrap())
                .collect();
            time(a.passes, &cms, |p| {
                std::hint::black_box(serde_json::to_vec(p).unwrap());
            })
        };
        let row = json!({
            "kind": k.name,
            "objects": k.json.len(),
            "json_bytes": json_bytes.round(),
            "protobuf_bytes": proto_bytes.round(),
            "ns_per_object": {
                "read_json_header": read_json.round(),
                "derive_protobuf_from_json": derive_proto.round(),
                "frame_protobuf_event": frame.round(),
                "read_protobuf_full_decode_upper_bound": read_proto.round(),
                "derive_json_lower_bound": derive_json.round(),
            },
            "json_first_ns": {
                "json_clients_only": read_json.round(),
                "both_kinds_of_client": (read_json + derive_proto + frame).round(),
            },
            "protobuf_first_ns_bounds": {
                "protobuf_clients_only": (read_proto + frame).round(),
                "both_kinds_of_client": (read_proto + frame + derive_json).round(),
            },
        });
        println!("{}", serde_json::to_string_pretty(&row).unwrap());
        rows.push(row);
    }
    if let Some(out) = &a.out {
        std::fs::write(
            out,
            serde_json::to_vec_pretty(&json!({ "rows": rows })).unwrap(),
        )
        .expect("write results");
    }
}
