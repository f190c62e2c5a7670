//! The test support's own check: a cluster starts, every identity it promises works, the
//! watcher metric is readable and counts watches, and the API server restarts in place.

mod support;

use std::time::Duration;

use k8s_openapi::api::core::v1::Namespace;
use support::{eventually, insecure_http, TestCluster, ADMIN_TOKEN};

async fn status(url: &str, token: &str) -> u16 {
    insecure_http()
        .get(url)
        .bearer_auth(token)
        .send()
        .await
        .expect("GET through reqwest")
        .status()
        .as_u16()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn test_cluster_starts_authenticates_counts_watchers_and_restarts() {
    let mut cluster = TestCluster::start().await;
    assert_eq!(cluster.admin_token, ADMIN_TOKEN);

    // kube-rs as admin.
    let namespaces: kube::Api<Namespace> = kube::Api::all(cluster.kube_client().await);
    let names: Vec<String> = namespaces
        .list(&Default::default())
        .await
        .expect("list namespaces as admin")
        .items
        .into_iter()
        .filter_map(|ns| ns.metadata.name)
        .collect();
    assert!(
        names.iter().any(|n| n == "default"),
        "namespaces: {names:?}"
    );

    // The other tokens: authenticated, and authorized by Node,RBAC only as granted.
    let ns_url = format!("{}/api/v1/namespaces", cluster.url);
    assert_eq!(status(&ns_url, "viewertoken").await, 403);
    assert_eq!(status(&ns_url, "nobodytoken").await, 403);
    assert_eq!(status(&ns_url, "wrongtoken").await, 401);
    // The Node authorizer with selectors (GA 1.34): a node lists Nodes only by its own
    // name.
    let nodes_url = format!("{}/api/v1/nodes", cluster.url);
    assert_eq!(status(&nodes_url, "node1token").await, 403);
    let own_node = format!("{nodes_url}?fieldSelector=metadata.name%3Dnode1");
    assert_eq!(status(&own_node, "node1token").await, 200);

    // A client certificate signed by the cluster's client CA authenticates as its CN/O.
    let (crt, key) = cluster.issue_client_cert("admin", "admin", &["system:masters"]);
    let mut pem = std::fs::read(&crt).expect("read admin.crt");
    pem.extend(std::fs::read(&key).expect("read admin.key"));
    let with_cert = reqwest::Client::builder()
        .danger_accept_invalid_certs(true)
        .identity(reqwest::Identity::from_pem(&pem).expect("client identity from PEM"))
        .build()
        .expect("build an HTTP client with a client certificate");
    let resp = with_cert
        .get(&ns_url)
        .send()
        .await
        .expect("GET namespaces with a client certificate");
    assert_eq!(resp.status().as_u16(), 200);

    // upstream_watches counts a watch we open, and forgets it when we close it: the series
    // the other tests count upstream watches by exists on this server and is not vacuous.
    let baseline = cluster.upstream_watches("namespaces").await;
    let watch = insecure_http()
        .get(format!("{ns_url}?watch=true"))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .expect("open a namespace watch");
    assert!(watch.status().is_success(), "watch: {}", watch.status());
    eventually(
        "the API server counts our namespace watch",
        Duration::from_secs(10),
        || async { cluster.upstream_watches("namespaces").await == baseline + 1 },
    )
    .await;
    drop(watch);
    eventually(
        "the API server forgets our namespace watch",
        Duration::from_secs(10),
        || async { cluster.upstream_watches("namespaces").await == baseline },
    )
    .await;

    // kill -9 and restart in place: same URL, same data.
    let url = cluster.url.clone();
    cluster.kill_apiserver();
    assert!(
        insecure_http()
            .get(format!("{url}/readyz"))
            .send()
            .await
            .is_err(),
        "nothing listens while the API server is down"
    );
    cluster.start_apiserver().await;
    cluster.restart_apiserver().await;
    assert_eq!(cluster.url, url);
    assert_eq!(status(&ns_url, ADMIN_TOKEN).await, 200);
    let after = cluster.kube_client().await;
    let kept = kube::Api::<Namespace>::all(after)
        .get("default")
        .await
        .expect("namespace default survives API server restarts (etcd kept)");
    assert_eq!(kept.metadata.name.as_deref(), Some("default"));
}
