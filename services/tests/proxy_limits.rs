//! Limits on what kcache proxies before the API server has authenticated anyone: request
//! bodies stream through under `max_request_body_bytes` and are refused (413) over it,
//! with nothing created upstream; in-flight proxied requests past a cap get 429 with
//! Retry-After, each kind (mutating, long-running) apart, and succeed again once the
//! held ones finish.

mod support;

use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use serde_json::{json, Value};
use support::kcache::Kcache;
use support::prom::sum_samples;
use support::{create_namespace, eventually, insecure_http, TestCluster, ADMIN_TOKEN};
use tokio::sync::oneshot;

const NS: &str = "limits";

fn configmap(name: &str, value_len: usize) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": NS},
        "data": {"v": "x".repeat(value_len)},
    }))
    .expect("configmap json")
}

fn configmaps(base: &str) -> String {
    format!("{base}/api/v1/namespaces/{NS}/configmaps")
}

/// `body` as a chunked upload (no Content-Length) in `chunk`-byte pieces.
fn chunked(body: Vec<u8>, chunk: usize) -> reqwest::Body {
    let pieces: Vec<Result<Bytes, std::io::Error>> = body
        .chunks(chunk)
        .map(|c| Ok(Bytes::copy_from_slice(c)))
        .collect();
    reqwest::Body::wrap_stream(futures::stream::iter(pieces))
}

async fn post(base: &str, body: reqwest::Body) -> (u16, Option<String>, Value) {
    let resp = insecure_http()
        .post(configmaps(base))
        .bearer_auth(ADMIN_TOKEN)
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .expect("POST a configmap");
    let code = resp.status().as_u16();
    let retry_after = resp
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let body = resp.bytes().await.expect("response body");
    (
        code,
        retry_after,
        serde_json::from_slice(&body).unwrap_or(Value::Null),
    )
}

/// The configmap's `data.v` length as the API server has it, or None if it does not exist.
async fn upstream_value_len(cluster: &TestCluster, name: &str) -> Option<usize> {
    let resp = insecure_http()
        .get(format!("{}/{name}", configmaps(&cluster.url)))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .expect("GET from the API server");
    if resp.status().as_u16() == 404 {
        return None;
    }
    assert!(resp.status().is_success(), "GET {name}: {}", resp.status());
    let cm: Value = resp.json().await.expect("configmap json");
    cm["data"]["v"].as_str().map(str::len)
}

async fn metric(kcache: &Kcache, name: &str, label: &str) -> f64 {
    sum_samples(&kcache.metrics_text().await, name, Some(label))
}

fn assert_too_large(code: u16, status: &Value) {
    assert_eq!(code, 413, "{status}");
    assert_eq!(status["kind"], "Status", "{status}");
    assert_eq!(status["reason"], "RequestEntityTooLarge", "{status}");
    assert_eq!(status["code"], 413, "{status}");
}

fn assert_too_many(code: u16, retry_after: Option<&str>, status: &Value) {
    assert_eq!(code, 429, "{status}");
    assert_eq!(retry_after, Some("1"));
    assert_eq!(status["kind"], "Status", "{status}");
    assert_eq!(status["reason"], "TooManyRequests", "{status}");
    assert_eq!(status["details"]["retryAfterSeconds"], 1, "{status}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_bodies_stream_under_the_cap_and_are_refused_over_it() {
    let cluster = TestCluster::start().await;
    create_namespace(&cluster.kube_client().await, NS).await;
    let limit = 1_200_000;
    let kcache = Kcache::start(
        &cluster,
        &format!("[server]\nmax_request_body_bytes = {limit}\n"),
    )
    .await;

    // ~1 MiB, declared length and chunked: both pass through whole.
    let big = 1_000_000;
    let (code, _, status) = post(&kcache.url, configmap("whole", big).into()).await;
    assert_eq!(code, 201, "{status}");
    let (code, _, status) = post(&kcache.url, chunked(configmap("chunked", big), 16 * 1024)).await;
    assert_eq!(code, 201, "{status}");
    assert_eq!(upstream_value_len(&cluster, "whole").await, Some(big));
    assert_eq!(upstream_value_len(&cluster, "chunked").await, Some(big));

    // Over the cap with a Content-Length: refused before anything goes upstream.
    let over = configmap("over-declared", limit + 100_000);
    let (code, _, status) = post(&kcache.url, over.into()).await;
    assert_too_large(code, &status);
    // Over the cap, chunked: the upstream request is cut off at the cap.
    let over = configmap("over-chunked", limit + 100_000);
    let (code, _, status) = post(&kcache.url, chunked(over, 16 * 1024)).await;
    assert_too_large(code, &status);
    assert_eq!(upstream_value_len(&cluster, "over-declared").await, None);
    assert_eq!(upstream_value_len(&cluster, "over-chunked").await, None);
    assert_eq!(
        metric(
            &kcache,
            "kcache_proxy_rejected_total",
            "reason=\"body_too_large\""
        )
        .await,
        2.0
    );

    // kcache still proxies afterwards.
    let (code, _, status) = post(&kcache.url, configmap("after", 10).into()).await;
    assert_eq!(code, 201, "{status}");
}

/// A configmap POST whose body stops halfway until `release` fires: the request stays in
/// flight at kcache (and upstream, which is reading the body) until then.
fn held_post(base: &str, name: &str) -> (oneshot::Sender<()>, tokio::task::JoinHandle<u16>) {
    let body = configmap(name, 1000);
    let (head, tail) = body.split_at(body.len() / 2);
    let (head, tail) = (Bytes::copy_from_slice(head), Bytes::copy_from_slice(tail));
    let (release, released) = oneshot::channel::<()>();
    let stream = futures::stream::iter([Ok::<_, std::io::Error>(head)]).chain(
        futures::stream::once(async move {
            let _ = released.await;
            Ok(tail)
        }),
    );
    let req = insecure_http()
        .post(configmaps(base))
        .bearer_auth(ADMIN_TOKEN)
        .header("content-type", "application/json")
        .body(reqwest::Body::wrap_stream(stream));
    let task = tokio::spawn(async move {
        let resp = req.send().await.expect("held POST");
        resp.status().as_u16()
    });
    (release, task)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_flight_caps_answer_429_per_kind_and_recover() {
    let cluster = TestCluster::start().await;
    create_namespace(&cluster.kube_client().await, NS).await;
    let kcache = Kcache::start(
        &cluster,
        "[server]\nmax_proxied_mutating_requests_inflight = 2\nmax_proxied_long_running_requests = 2\n",
    )
    .await;
    let inflight = |kind: &'static str| {
        let kcache = &kcache;
        async move {
            metric(
                kcache,
                "kcache_proxy_inflight_requests",
                &format!("kind=\"{kind}\""),
            )
            .await
        }
    };
    let rejected = |reason: &'static str| {
        let kcache = &kcache;
        async move {
            metric(
                kcache,
                "kcache_proxy_rejected_total",
                &format!("reason=\"{reason}\""),
            )
            .await
        }
    };
    // Not cached by kcache: reads and watches of it are proxied.
    let serviceaccounts = format!("{}/api/v1/namespaces/{NS}/serviceaccounts", kcache.url);
    let read = || async {
        insecure_http()
            .get(&serviceaccounts)
            .bearer_auth(ADMIN_TOKEN)
            .send()
            .await
            .expect("proxied GET")
            .status()
            .as_u16()
    };
    let watch = || async {
        insecure_http()
            .get(format!("{serviceaccounts}?watch=1"))
            .bearer_auth(ADMIN_TOKEN)
            .send()
            .await
            .expect("proxied watch")
    };

    // Mutating: two slow uploads fill the cap; a third write is refused.
    let (release1, held1) = held_post(&kcache.url, "held1");
    let (release2, held2) = held_post(&kcache.url, "held2");
    eventually("two writes in flight", Duration::from_secs(30), || async {
        inflight("mutating").await == 2.0
    })
    .await;
    assert_eq!(rejected("mutating_inflight").await, 0.0);
    let (code, retry_after, status) = post(&kcache.url, configmap("extra", 10).into()).await;
    assert_too_many(code, retry_after.as_deref(), &status);
    assert_eq!(rejected("mutating_inflight").await, 1.0);
    assert_eq!(upstream_value_len(&cluster, "extra").await, None);
    // Reads have their own slots.
    assert_eq!(read().await, 200);

    // Long-running: two proxied watches fill their cap; short requests still pass.
    let w1 = watch().await;
    let w2 = watch().await;
    assert_eq!((w1.status().as_u16(), w2.status().as_u16()), (200, 200));
    assert_eq!(inflight("long_running").await, 2.0);
    let w3 = watch().await;
    let code = w3.status().as_u16();
    let retry_after = w3
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let status: Value = w3.json().await.unwrap_or(Value::Null);
    assert_too_many(code, retry_after.as_deref(), &status);
    assert_eq!(rejected("long_running_inflight").await, 1.0);
    assert_eq!(read().await, 200);

    // The held writes finish; writes are admitted again.
    release1.send(()).expect("release held1");
    release2.send(()).expect("release held2");
    assert_eq!(held1.await.expect("held1 task"), 201);
    assert_eq!(held2.await.expect("held2 task"), 201);
    assert_eq!(upstream_value_len(&cluster, "held1").await, Some(1000));
    eventually(
        "a write admitted again",
        Duration::from_secs(30),
        || async {
            let (code, _, status) = post(&kcache.url, configmap("extra", 10).into()).await;
            assert!(code == 201 || code == 429, "{code}: {status}");
            code == 201
        },
    )
    .await;
    assert_eq!(upstream_value_len(&cluster, "extra").await, Some(10));
    drop((w1, w2));
}

/// A proxied watch whose client goes away must give its slot back even while the upstream
/// sends nothing. kcache's HTTP/1.1 dispatcher does not always notice the client's FIN
/// while the proxied body is idle (seen in 2 of 3 full-suite runs before `hangup`), so the
/// proxy asks the kernel whether the client hung up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_proxied_watch_frees_its_slot() {
    let cluster = TestCluster::start().await;
    create_namespace(&cluster.kube_client().await, NS).await;
    let kcache = Kcache::start(
        &cluster,
        "[server]\nmax_proxied_long_running_requests = 2\n",
    )
    .await;
    let serviceaccounts = format!("{}/api/v1/namespaces/{NS}/serviceaccounts", kcache.url);
    let watch = || async {
        insecure_http()
            .get(format!("{serviceaccounts}?watch=1"))
            .bearer_auth(ADMIN_TOKEN)
            .send()
            .await
            .expect("proxied watch")
    };
    let (w1, w2) = (watch().await, watch().await);
    assert_eq!((w1.status().as_u16(), w2.status().as_u16()), (200, 200));
    assert_eq!(watch().await.status().as_u16(), 429);
    drop(w1);
    eventually(
        "a watch admitted again",
        Duration::from_secs(30),
        || async { watch().await.status().as_u16() == 200 },
    )
    .await;
    drop(w2);
}
