//! Key and process lifecycles: immutable objects park their upstream watch and are
//! re-verified; SIGTERM drains watchers with a last bookmark, then the process exits.

mod support;

use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use serde_json::{json, Value};
use support::kcache::Kcache;
use support::{eventually, insecure_http, TestCluster};

const TOKEN: &str = "admintoken";

type Events = tokio::sync::mpsc::UnboundedReceiver<Value>;

/// Opens a watch; its events arrive on the returned channel.
async fn watch(url: String) -> Events {
    let resp = insecure_http()
        .get(url)
        .bearer_auth(TOKEN)
        .send()
        .await
        .expect("watch");
    assert_eq!(resp.status().as_u16(), 200);
    support::event_channel(resp)
}

async fn next(rx: &mut Events) -> Option<Value> {
    tokio::time::timeout(Duration::from_secs(20), rx.recv())
        .await
        .expect("an event (or the end) within 20 s")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn immutable_secret_parks_its_upstream_watch_and_is_reverified() {
    let cluster = TestCluster::start().await;
    let k = Kcache::start(&cluster, "[cache]\nimmutable_verify_secs = 1\n").await;
    let admin = cluster.kube_client().await;
    support::create_namespace(&admin, "imm").await;
    let api: kube::Api<Secret> = kube::Api::namespaced(admin.clone(), "imm");
    let make = |v: &str| -> Secret {
        serde_json::from_value(
            json!({"metadata": {"name": "frozen"}, "immutable": true, "stringData": {"v": v}}),
        )
        .expect("secret")
    };
    let first = api
        .create(&Default::default(), &make("1"))
        .await
        .expect("create");
    let mut rx = watch(format!(
        "{}/api/v1/namespaces/imm/secrets?watch=1&resourceVersion=0&fieldSelector=metadata.name%3Dfrozen",
        k.url
    ))
    .await;
    let ev = next(&mut rx).await.expect("initial event");
    assert_eq!(ev["type"], "ADDED");
    // Synced and immutable: no upstream watch, yet the client's watch stays open.
    eventually(
        "the immutable key parks",
        Duration::from_secs(20),
        || async {
            k.metric("kcache_upstream_watches").await == 0.0
                && k.metric("kcache_registered_watchers").await == 1.0
        },
    )
    .await;
    // Deleted and recreated (new UID): the verification list notices within its interval.
    api.delete("frozen", &Default::default())
        .await
        .expect("delete");
    let second = api
        .create(&Default::default(), &make("2"))
        .await
        .expect("recreate");
    let ev = next(&mut rx).await.expect("event");
    assert_eq!(ev["type"], "DELETED", "{ev}");
    assert_eq!(
        ev["object"]["metadata"]["uid"].as_str(),
        first.metadata.uid.as_deref()
    );
    let ev = next(&mut rx).await.expect("event");
    assert_eq!(ev["type"], "ADDED", "{ev}");
    assert_eq!(
        ev["object"]["metadata"]["uid"].as_str(),
        second.metadata.uid.as_deref()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_watchers_with_a_last_bookmark_and_exits_cleanly() {
    let cluster = TestCluster::start().await;
    let mut k = Kcache::start(&cluster, "[server]\nshutdown_grace_secs = 2\n").await;
    let admin = cluster.kube_client().await;
    support::create_namespace(&admin, "drain").await;
    let mut rx = watch(format!(
        "{}/api/v1/namespaces/drain/secrets?watch=1&resourceVersion=0&allowWatchBookmarks=true",
        k.url
    ))
    .await;
    eventually(
        "the watch is registered",
        Duration::from_secs(20),
        || async { k.metric("kcache_registered_watchers").await == 1.0 },
    )
    .await;
    k.terminate();
    // The stream ends after a last BOOKMARK so the client can resume exactly there.
    let mut last = None;
    while let Some(ev) = next(&mut rx).await {
        last = Some(ev);
    }
    let last = last.expect("a last event before the stream ended");
    assert_eq!(last["type"], "BOOKMARK", "{last}");
    let status = k
        .wait_exit(Duration::from_secs(20))
        .expect("kcache exits after SIGTERM");
    assert!(status.success(), "exit status {status}");
}
