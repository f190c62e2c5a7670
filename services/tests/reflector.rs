//! kube-rs's watcher/reflector as the judge: pointed at kcache, it converges to the API
//! server's state through random writes (also with streaming lists, which the 1.20
//! upstream itself rejects, and across an API server kill -9 and restart), and no
//! object's resourceVersion ever goes back.

mod support;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::runtime::{reflector, watcher, WatchStreamExt};
use rand::Rng;
use serde_json::json;
use support::kcache::Kcache;
use support::{eventually, TestCluster};

const TOKEN: &str = "admintoken";

#[derive(Default)]
struct Seen {
    /// name → last RV delivered for it.
    last_rv: HashMap<String, u64>,
    violations: Vec<String>,
}

fn rv_of(cm: &ConfigMap) -> u64 {
    cm.metadata
        .resource_version
        .as_deref()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

fn name_of(cm: &ConfigMap) -> String {
    cm.metadata.name.clone().unwrap_or_default()
}

/// Random create/update/delete on up to 30 ConfigMaps.
async fn random_ops(api: &kube::Api<ConfigMap>, n: usize) {
    let mut rng = rand::rng();
    for i in 0..n {
        let name = format!("cm{}", rng.random_range(0..30));
        let op = rng.random_range(0..10);
        let res = if op < 2 {
            api.delete(&name, &Default::default()).await.map(|_| ())
        } else {
            let cm: ConfigMap = serde_json::from_value(json!({
                "metadata": {"name": name, "labels": {"i": (i % 3).to_string()}},
                "data": {"i": i.to_string()},
            }))
            .expect("cm");
            let pp = kube::api::PatchParams::apply("test").force();
            api.patch(&name, &pp, &kube::api::Patch::Apply(&cm))
                .await
                .map(|_| ())
        };
        // Deleting an absent object is fine; while the API server restarts, writes fail.
        let _ = res;
    }
}

async fn upstream_state(api: &kube::Api<ConfigMap>) -> BTreeMap<String, String> {
    api.list(&Default::default())
        .await
        .map(|l| {
            l.items
                .iter()
                .map(|c| {
                    (
                        name_of(c),
                        c.metadata.resource_version.clone().unwrap_or_default(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

fn store_state(store: &reflector::Store<ConfigMap>) -> BTreeMap<String, String> {
    store
        .state()
        .iter()
        .map(|c| {
            (
                name_of(c),
                c.metadata.resource_version.clone().unwrap_or_default(),
            )
        })
        .collect()
}

async fn converges(cfg: watcher::Config, ns: &str, restart_apiserver: bool) {
    let mut cluster = TestCluster::start().await;
    let k = Kcache::start(&cluster, "").await;
    let admin = cluster.kube_client().await;
    support::create_namespace(&admin, ns).await;
    let upstream: kube::Api<ConfigMap> = kube::Api::namespaced(admin.clone(), ns);
    random_ops(&upstream, 40).await;

    let via_kcache: kube::Api<ConfigMap> = kube::Api::namespaced(k.kube_client(TOKEN), ns);
    let (store, writer) = reflector::store();
    let seen = Arc::new(Mutex::new(Seen::default()));
    let sink = seen.clone();
    let stream = reflector(writer, watcher(via_kcache, cfg)).default_backoff();
    let task = tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        while let Some(ev) = stream.next().await {
            let Ok(ev) = ev else { continue };
            let mut s = sink.lock().expect("seen");
            let objs: Vec<&ConfigMap> = match &ev {
                watcher::Event::Apply(o)
                | watcher::Event::InitApply(o)
                | watcher::Event::Delete(o) => vec![o],
                _ => vec![],
            };
            for o in objs {
                let (name, rv) = (name_of(o), rv_of(o));
                let last = s.last_rv.get(&name).copied().unwrap_or(0);
                // A relist (Init) may repeat an object at the same RV; never a lower one.
                if rv < last {
                    s.violations.push(format!("{name}: rv {rv} after {last}"));
                }
                if matches!(ev, watcher::Event::Apply(_)) && rv == last {
                    s.violations
                        .push(format!("{name}: duplicate event at rv {rv}"));
                }
                s.last_rv.insert(name, rv);
            }
        }
    });

    random_ops(&upstream, 150).await;
    if restart_apiserver {
        cluster.kill_apiserver();
        tokio::time::sleep(Duration::from_secs(2)).await;
        cluster.start_apiserver().await;
    }
    random_ops(&upstream, 150).await;

    let want = upstream_state(&upstream).await;
    eventually(
        "the reflector converges to the API server's state",
        Duration::from_secs(90),
        || {
            let store = store.clone();
            let want = want.clone();
            async move { store_state(&store) == want }
        },
    )
    .await;
    let s = seen.lock().expect("seen");
    assert!(
        s.violations.is_empty(),
        "resourceVersion violations: {:?}",
        s.violations
    );
    drop(s);
    task.abort();
    let _ = &k;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reflector_converges_through_random_writes() {
    converges(watcher::Config::default(), "refl", false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reflector_with_streaming_lists_converges() {
    converges(
        watcher::Config::default().streaming_lists(),
        "stream",
        false,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reflector_survives_an_api_server_kill_and_restart() {
    converges(watcher::Config::default(), "restart", true).await;
}
