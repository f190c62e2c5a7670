//! Consistent reads served from the cache: a streaming list with the resourceVersion
//! omitted (how reference-version informers and kubelets sync) sees every write that
//! completed before it was sent — creations, updates, deletions, re-creations — as the
//! API server's own answer would, however quickly it follows the write. Judged by the
//! order of events, not by a timeout: each write completes on the API server, then the
//! read is sent to kcache at once.

mod support;

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::Value;
use support::http::{delete_secret, put_secret, Events, Http};
use support::kcache::Kcache;
use support::{create_as_admin, TestCluster};

/// Reads a streaming list to its initial-events-end bookmark: the objects' `name → data.v`
/// (base64 as served) and the bookmark's RV.
async fn initial_state(rx: &mut Events) -> (BTreeMap<String, String>, u64) {
    let mut state = BTreeMap::new();
    loop {
        let ev: Value = tokio::time::timeout(Duration::from_secs(20), rx.recv())
            .await
            .expect("an event within 20 s")
            .expect("the stream continues to its initial-events-end bookmark");
        let obj = &ev["object"];
        match ev["type"].as_str() {
            Some("ADDED") => {
                state.insert(
                    obj["metadata"]["name"].as_str().unwrap_or("").to_string(),
                    obj["data"]["v"].as_str().unwrap_or("").to_string(),
                );
            }
            Some("BOOKMARK") => {
                if obj["metadata"]["annotations"]["k8s.io/initial-events-end"] == "true" {
                    let rv = obj["metadata"]["resourceVersion"]
                        .as_str()
                        .and_then(|s| s.parse().ok())
                        .expect("bookmark RV");
                    return (state, rv);
                }
            }
            other => {
                panic!("unexpected event before the initial-events-end bookmark: {other:?} {ev}")
            }
        }
    }
}

fn b64(s: &str) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(s)
}

const STREAM: &str =
    "watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streaming_lists_see_every_write_made_before_them() {
    let cluster = TestCluster::start().await;
    let k = Kcache::start(&cluster, "").await;
    let admin = cluster.kube_client().await;
    support::create_namespace(&admin, "fresh").await;
    put_secret(&admin, "fresh", "base", "0").await;
    let kc = Http::new(&k.url);
    let api = Http::new(&cluster.url);
    // Keep the namespace key and one name key running, as informers and kubelets do: every
    // read below is served by a key that is already synced and may lag the write by the
    // time the event takes to arrive.
    let _ns_watch = kc
        .watch_ok(&format!("/api/v1/namespaces/fresh/secrets?{STREAM}"))
        .await;
    let _name_watch = kc
        .watch_ok(&format!(
            "/api/v1/namespaces/fresh/secrets?{STREAM}&fieldSelector=metadata.name%3Dbase"
        ))
        .await;
    let before = k.metrics_text().await;
    const ROUNDS: usize = 30;
    for i in 0..ROUNDS {
        let value = i.to_string();
        let extra = format!("s{i}");
        // Write, then read at once: an update, a creation, and (from round 1) the
        // deletion of the previous round's Secret.
        put_secret(&admin, "fresh", "base", &value).await;
        put_secret(&admin, "fresh", &extra, &value).await;
        if i > 0 {
            delete_secret(&admin, "fresh", &format!("s{}", i - 1)).await;
        }
        let mut ns = kc
            .watch_ok(&format!("/api/v1/namespaces/fresh/secrets?{STREAM}"))
            .await;
        let mut one = kc
            .watch_ok(&format!(
                "/api/v1/namespaces/fresh/secrets?{STREAM}&fieldSelector=metadata.name%3Dbase"
            ))
            .await;
        let (state, rv) = initial_state(&mut ns).await;
        let (one_state, _) = initial_state(&mut one).await;
        let want: BTreeMap<String, String> = [
            ("base".to_string(), b64(&value)),
            (extra.clone(), b64(&value)),
        ]
        .into();
        assert_eq!(
            state, want,
            "round {i}: the namespace's state through kcache (bookmark RV {rv})"
        );
        assert_eq!(
            one_state,
            [("base".to_string(), b64(&value))].into(),
            "round {i}: the name key's state through kcache"
        );
        // The API server's own streaming list says the same.
        let (_, mut direct) = api
            .watch(&format!("/api/v1/namespaces/fresh/secrets?{STREAM}"))
            .await;
        let (direct_state, _) = initial_state(&mut direct).await;
        assert_eq!(
            state, direct_state,
            "round {i}: kcache against the API server"
        );
    }
    // A deleted and re-created name: the new object, never the old one.
    delete_secret(&admin, "fresh", "base").await;
    put_secret(&admin, "fresh", "base", "reborn").await;
    let mut one = kc
        .watch_ok(&format!(
            "/api/v1/namespaces/fresh/secrets?{STREAM}&fieldSelector=metadata.name%3Dbase"
        ))
        .await;
    let (one_state, _) = initial_state(&mut one).await;
    assert_eq!(one_state, [("base".to_string(), b64("reborn"))].into());

    // Served by kcache, not forwarded: every read was proven fresh (at once or after the
    // key caught up), none went to the API server.
    let after = k.metrics_text().await;
    let count = |text: &str, outcome: &str| {
        support::kcache::sum_samples(
            text,
            "kcache_consistent_reads_total",
            Some(&format!("outcome=\"{outcome}\"")),
        )
    };
    let served = count(&after, "fresh") + count(&after, "waited")
        - count(&before, "fresh")
        - count(&before, "waited");
    let forwarded = count(&after, "forwarded") - count(&before, "forwarded");
    assert_eq!(forwarded, 0.0, "consistent reads forwarded upstream");
    assert_eq!(
        served,
        (2 * ROUNDS + 1) as f64,
        "consistent reads served by kcache"
    );
}

/// A name key whose object is immutable parks its upstream watch (as the kubelet's
/// manager stops watching immutable objects) and would not hear of a deletion for
/// `immutable_verify_secs`. A consistent read must not be answered from it: the proof sees
/// the object gone upstream, the parked key cannot catch up, and the read goes to the API
/// server — a deleted credential is never handed out by a streaming list.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parked_immutable_key_never_answers_a_consistent_read_with_a_deleted_object() {
    let cluster = TestCluster::start().await;
    let k = Kcache::start(&cluster, "").await;
    let admin = cluster.kube_client().await;
    support::create_namespace(&admin, "imm").await;
    let secret = |v: &str| serde_json::json!({"metadata": {"name": "frozen"}, "immutable": true, "stringData": {"v": v}});
    create_as_admin(&cluster, "/api/v1/namespaces/imm/secrets", secret("old")).await;
    let kc = Http::new(&k.url);
    let path =
        format!("/api/v1/namespaces/imm/secrets?{STREAM}&fieldSelector=metadata.name%3Dfrozen");
    let mut first = kc.watch_ok(&path).await;
    let (state, _) = initial_state(&mut first).await;
    assert_eq!(state, [("frozen".to_string(), b64("old"))].into());
    support::eventually(
        "the immutable key parks its upstream watch",
        Duration::from_secs(20),
        || async { k.metric("kcache_upstream_watches").await == 0.0 },
    )
    .await;
    delete_secret(&admin, "imm", "frozen").await;
    let mut after_delete = kc.watch_ok(&path).await;
    let (state, _) = initial_state(&mut after_delete).await;
    assert_eq!(
        state,
        BTreeMap::new(),
        "a deleted Secret served by a consistent read"
    );
    create_as_admin(&cluster, "/api/v1/namespaces/imm/secrets", secret("new")).await;
    let mut after_create = kc.watch_ok(&path).await;
    let (state, _) = initial_state(&mut after_create).await;
    assert_eq!(
        state,
        [("frozen".to_string(), b64("new"))].into(),
        "the re-created Secret"
    );
}
