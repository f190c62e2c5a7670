//! An owner cut off from the API server hands its keys to a replica that reaches it, and
//! readiness tells a replica that can serve nothing fresh. Replica `a` reaches the real
//! kube-apiserver through a TCP proxy the test cuts; `b` reaches it directly; real
//! nats-server; kube-rs reflectors as the judges.

mod support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use support::judge::{random_ops, upstream_state, Judge};
use support::kcache::Kcache;
use support::nats::{fleet_toml, Nats};
use support::{eventually, TestCluster, ADMIN_TOKEN};

/// A TCP proxy to the API server that can be cut: open connections are closed and new
/// ones refused, as when a replica's network path to the API server fails.
struct Proxy {
    port: u16,
    cut: Arc<AtomicBool>,
    conns: Arc<std::sync::Mutex<Vec<tokio::task::JoinHandle<()>>>>,
}

impl Proxy {
    async fn start(upstream: u16) -> Proxy {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind proxy");
        let port = listener.local_addr().expect("addr").port();
        let cut = Arc::new(AtomicBool::new(false));
        let conns = Arc::new(std::sync::Mutex::new(Vec::new()));
        let (c, list) = (cut.clone(), conns.clone());
        tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                if c.load(Ordering::SeqCst) {
                    continue; // dropped: refused
                }
                let task = tokio::spawn(async move {
                    if let Ok(mut out) =
                        tokio::net::TcpStream::connect(("127.0.0.1", upstream)).await
                    {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut out).await;
                    }
                });
                list.lock().expect("conns").push(task);
            }
        });
        Proxy { port, cut, conns }
    }

    fn set_cut(&self, cut: bool) {
        self.cut.store(cut, Ordering::SeqCst);
        if cut {
            for t in self.conns.lock().expect("conns").drain(..) {
                t.abort();
            }
        }
    }
}

async fn ready(k: &Kcache) -> bool {
    support::insecure_http()
        .get(format!("{}/readyz", k.admin_url))
        .send()
        .await
        .is_ok_and(|r| r.status().is_success())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owner_cut_off_from_the_api_server_hands_over_and_readiness_follows() {
    let cluster = TestCluster::start().await;
    let nats = Nats::start(cluster.dir_path());
    let proxy = Proxy::start(cluster.port()).await;
    let kubeconfig = cluster.dir_path().join("kubeconfig-via-proxy");
    let text = std::fs::read_to_string(&cluster.kubeconfig).expect("kubeconfig");
    let via_proxy = text.replace(
        &format!("127.0.0.1:{}", cluster.port()),
        &format!("127.0.0.1:{}", proxy.port),
    );
    assert_ne!(
        text, via_proxy,
        "the kubeconfig names the API server's port"
    );
    std::fs::write(&kubeconfig, via_proxy).expect("write kubeconfig");
    let extra = "owner_cutoff_ms = 3000";
    let toml = fleet_toml(cluster.dir_path(), &nats, extra);
    let a =
        // a's admin endpoints on their own port: on the API port they authenticate through
        // the API server a is about to lose.
        Kcache::start_with_kubeconfig_and_admin_port(
            &cluster,
            &kubeconfig,
            &toml,
            &["--replica-id", "a"],
        )
        .await;
    let mut b = Kcache::start_with_args(&cluster, &toml, &["--replica-id", "b"]).await;
    let admin = cluster.kube_client().await;
    support::create_namespace(&admin, "cutoff").await;
    let upstream: kube::Api<ConfigMap> = kube::Api::namespaced(admin, "cutoff");
    let key = "/api/v1/namespaces/cutoff/configmaps";

    // a's reflector first, so a owns the key; then b's.
    let judge_a = Judge::start(a.kube_client(ADMIN_TOKEN), "cutoff");
    eventually("a owns the key", Duration::from_secs(30), || async {
        a.role(key).await == "owner"
    })
    .await;
    let judge_b = Judge::start(b.kube_client(ADMIN_TOKEN), "cutoff");
    eventually("b mirrors the key", Duration::from_secs(30), || async {
        b.role(key).await == "mirror"
    })
    .await;
    random_ops(&upstream, 20, Duration::from_millis(20)).await;

    // a loses the API server; b still reaches it: the key moves to b, and a's clients go
    // on receiving every event, now through NATS.
    proxy.set_cut(true);
    let writes = {
        let upstream = upstream.clone();
        tokio::spawn(async move { random_ops(&upstream, 100, Duration::from_millis(50)).await })
    };
    eventually(
        "b owns the key, a mirrors it",
        Duration::from_secs(30),
        || async { b.role(key).await == "owner" && a.role(key).await == "mirror" },
    )
    .await;
    eventually(
        "a reports its upstream cut off",
        Duration::from_secs(10),
        || async { a.metric("kcache_upstream_cut_off").await == 1.0 },
    )
    .await;
    assert!(
        support::prom::sum_samples_with_label(
            &a.metrics_text().await,
            "kcache_fleet_ownership_changes_total",
            "change",
            "handed-over",
        ) >= 1.0
    );
    // a serves nothing fresh of its own, but b's events reach it: still ready.
    assert!(ready(&a).await, "a is ready while a healthy peer feeds it");
    writes.await.expect("writes");
    let want = upstream_state(&upstream).await;
    for (who, judge) in [("a", &judge_a), ("b", &judge_b)] {
        eventually(
            &format!("the reflector on {who} converges"),
            Duration::from_secs(60),
            || async { judge.state() == want },
        )
        .await;
        judge.assert_clean(who);
    }
    // a claims nothing while cut off, even long after b's last heartbeat would do.
    assert_eq!(a.role(key).await, "mirror");

    // No healthy peer left: a keeps serving what it has, and says it is not ready.
    b.kill9();
    eventually(
        "a is not ready once no peer feeds it",
        Duration::from_secs(30),
        || async { !ready(&a).await },
    )
    .await;

    // The API server is reachable again: a is ready and takes the key back.
    proxy.set_cut(false);
    eventually("a is ready again", Duration::from_secs(30), || async {
        ready(&a).await
    })
    .await;
    eventually("a owns the key again", Duration::from_secs(30), || async {
        a.role(key).await == "owner"
    })
    .await;
    random_ops(&upstream, 20, Duration::ZERO).await;
    let want = upstream_state(&upstream).await;
    eventually(
        "the reflector on a converges",
        Duration::from_secs(60),
        || async { judge_a.state() == want },
    )
    .await;
    judge_a.assert_consistent("a");
}
