//! kube-rs's watcher/reflector as the judge: pointed at kcache, it converges to the API
//! server's state through random writes (also with streaming lists, which the 1.20
//! upstream itself rejects, and across an API server kill -9 and restart), and no
//! object's resourceVersion ever goes back.

mod support;

use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::runtime::watcher;
use support::judge::{random_ops, upstream_state, Judge};
use support::kcache::Kcache;
use support::{eventually, TestCluster};

const TOKEN: &str = "admintoken";

async fn converges(cfg: watcher::Config, ns: &str, restart_apiserver: bool) {
    let mut cluster = TestCluster::start().await;
    let k = Kcache::start(&cluster, "").await;
    let admin = cluster.kube_client().await;
    support::create_namespace(&admin, ns).await;
    let upstream: kube::Api<ConfigMap> = kube::Api::namespaced(admin.clone(), ns);
    random_ops(&upstream, 40, Duration::ZERO).await;

    let judge = Judge::start_with(k.kube_client(TOKEN), ns, cfg);
    random_ops(&upstream, 150, Duration::ZERO).await;
    if restart_apiserver {
        cluster.kill_apiserver();
        tokio::time::sleep(Duration::from_secs(2)).await;
        cluster.start_apiserver().await;
    }
    random_ops(&upstream, 150, Duration::ZERO).await;

    let want = upstream_state(&upstream).await;
    eventually(
        "the reflector converges to the API server's state",
        Duration::from_secs(90),
        || async { judge.state() == want },
    )
    .await;
    // Writes fail while the API server is down, and so may the watch's relist: only the
    // resourceVersion rules are judged here.
    judge.assert_consistent("kcache");
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
