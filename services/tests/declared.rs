//! Declared interest (`[[publish]]`): keys kept cached, and in a fleet published over
//! NATS, with no HTTP client — what a plain NATS subscriber needs, since it never makes a
//! key exist by itself (issue 30.1).

mod support;

use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;

use support::kcache::Kcache;
use support::nats::{fleet_toml, Nats};
use support::{eventually, TestCluster};

const NS: &str = "declared";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_declared_key_is_published_with_no_client_and_a_bad_entry_is_refused() {
    let cluster = TestCluster::start().await;
    let nats = Nats::start(cluster.dir_path());
    let admin = cluster.kube_client().await;
    support::create_namespace(&admin, NS).await;
    // The events of the namespace's ConfigMaps, as a plain subscriber follows them.
    let subscriber = nats.client().await;
    let mut events = subscriber
        .subscribe(format!("kcache.ev._.v1.configmaps.{NS}.all._"))
        .await
        .expect("subscribe");
    let toml = format!(
        "{}\n[[publish]]\nversion = \"v1\"\nresource = \"configmaps\"\nnamespace = \"{NS}\"\n\n\
         [[publish]]\nversion = \"v1\"\nresource = \"nosuchthings\"\n",
        fleet_toml(cluster.dir_path(), &nats, "")
    );
    let k = Kcache::start_with_args(&cluster, &toml, &["--replica-id", "a"]).await;

    // Cached and owned with nobody asking.
    let key = format!("/api/v1/namespaces/{NS}/configmaps");
    eventually(
        "the declared key is cached, synced and owned",
        Duration::from_secs(30),
        || async {
            k.key_info(&key).await.is_some_and(|i| {
                i["declared"] == true && i["synced"] == true && i["role"] == "owner"
            })
        },
    )
    .await;
    let info = k.key_info(&key).await.expect("key info");
    assert_eq!(info["watchers"], 0, "{info}");

    // A write reaches the subscriber as the owner's event.
    let api: kube::Api<ConfigMap> = kube::Api::namespaced(admin, NS);
    let cm: ConfigMap = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "published"},
        "data": {"v": "1"},
    }))
    .expect("configmap");
    api.create(&Default::default(), &cm)
        .await
        .expect("create the ConfigMap");
    let event = tokio::time::timeout(Duration::from_secs(20), async {
        while let Some(msg) = events.next().await {
            let kind = msg
                .headers
                .as_ref()
                .and_then(|h| h.get("Kcache-Type"))
                .map(|v| v.as_str().to_string());
            if kind.as_deref() == Some("event") {
                return Some(msg);
            }
        }
        None
    })
    .await
    .expect("an event within 20 s")
    .expect("the subscription ended");
    let body = String::from_utf8_lossy(&event.payload);
    assert!(body.contains("\"published\""), "{body}");

    // The entry naming no cached resource is refused with its reason, the rest served.
    let log = k.log_tail();
    assert!(
        log.contains("[[publish]] core/v1/nosuchthings: not a resource kcache caches"),
        "{log}"
    );
    assert_eq!(
        k.debug_keys().await["keys"]
            .as_array()
            .map_or(0, |keys| keys.len()),
        1
    );
}

/// A NATS subscriber's answer to an ask: the reply's JSON.
async fn ask(client: &async_nats::Client, key: &str, body: &str) -> serde_json::Value {
    let reply = tokio::time::timeout(
        Duration::from_secs(10),
        client.request(format!("kcache.want.{key}"), body.to_string().into()),
    )
    .await
    .expect("an answer within 10 s")
    .expect("the ask answered");
    serde_json::from_slice(&reply.payload).expect("a JSON answer")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscribers_ask_keeps_a_key_published_until_it_expires_within_bounds() {
    let cluster = TestCluster::start().await;
    let nats = Nats::start(cluster.dir_path());
    let admin = cluster.kube_client().await;
    support::create_namespace(&admin, NS).await;
    let toml = fleet_toml(
        cluster.dir_path(),
        &nats,
        "want_per_asker = 2\nwant_ttl_max_secs = 3\n",
    );
    let k = Kcache::start_with_args(&cluster, &toml, &["--replica-id", "a"]).await;
    let client = nats.client().await;
    let key = format!("_.v1.configmaps.{NS}.name.asked");
    let mut events = client
        .subscribe(format!("kcache.ev.{key}"))
        .await
        .expect("subscribe");

    // Asked for, the key is cached and owned with no HTTP client; ttlSecs is capped.
    let answer = ask(&client, &key, r#"{"ttlSecs": 60}"#).await;
    assert_eq!(answer, serde_json::json!({"key": key, "ttlSecs": 3}));
    let path = format!("/api/v1/namespaces/{NS}/configmaps/asked");
    eventually(
        "the asked key is owned and synced",
        Duration::from_secs(30),
        || async {
            k.key_info(&path)
                .await
                .is_some_and(|i| i["wantedBy"] == 1 && i["synced"] == true && i["role"] == "owner")
        },
    )
    .await;
    let api: kube::Api<ConfigMap> = kube::Api::namespaced(admin, NS);
    let cm: ConfigMap = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "asked"},
        "data": {"v": "1"},
    }))
    .expect("configmap");
    api.create(&Default::default(), &cm).await.expect("create");
    let event = tokio::time::timeout(Duration::from_secs(20), events.next())
        .await
        .expect("an event within 20 s")
        .expect("subscription open");
    assert!(
        String::from_utf8_lossy(&event.payload).contains("\"asked\""),
        "{event:?}"
    );

    // Refusals, each with its reason: no cached resource, a scope the resource lacks, a
    // body that is not an ask, and past the asker's bound (it holds `asked` and one more).
    let refused = |a: serde_json::Value| a["error"].as_str().unwrap_or("").to_string();
    let e = refused(ask(&client, &format!("_.v1.nosuchthings.{NS}.all._"), "").await);
    assert!(e.contains("not a resource kcache caches"), "{e}");
    let e = refused(ask(&client, "_.v1.namespaces.x.all._", "").await);
    assert!(e.contains("cluster-scoped"), "{e}");
    let e = refused(ask(&client, &format!("_.v1.configmaps.{NS}.all._"), "{").await);
    assert!(e.contains("not JSON"), "{e}");
    let second = ask(&client, &format!("_.v1.configmaps.{NS}.name.other"), "").await;
    assert_eq!(second["ttlSecs"], 3, "{second}");
    let e = refused(ask(&client, &format!("_.v1.configmaps.{NS}.name.third"), "").await);
    assert!(e.contains("already wants 2 keys"), "{e}");
    assert_eq!(
        support::prom::sum_samples(
            &k.metrics_text().await,
            "kcache_nats_wants_total",
            Some("result=\"refused\"")
        ),
        4.0
    );

    // An ask whose reply subject is a key's events subject is dropped unanswered: nothing
    // but the owner's own messages ever appears there.
    client
        .publish_with_reply(
            format!("kcache.want.{key}"),
            format!("kcache.ev.{key}"),
            "{}".into(),
        )
        .await
        .expect("publish");
    client.flush().await.expect("flush");
    eventually(
        "the forged ask counted",
        Duration::from_secs(10),
        || async {
            support::prom::sum_samples(
                &k.metrics_text().await,
                "kcache_nats_wants_total",
                Some("result=\"bad_reply\""),
            ) == 1.0
        },
    )
    .await;
    while let Ok(Some(msg)) = tokio::time::timeout(Duration::from_millis(500), events.next()).await
    {
        let kind = msg.headers.as_ref().and_then(|h| h.get("Kcache-Type"));
        assert!(
            kind.is_some(),
            "an answer published into the events: {msg:?}"
        );
    }

    // Not renewed, the interest expires (3 s) and the key stops after its grace period.
    eventually(
        "the unrenewed key stopped",
        Duration::from_secs(30),
        || async { k.key_info(&path).await.is_none() },
    )
    .await;
}
