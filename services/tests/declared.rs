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
