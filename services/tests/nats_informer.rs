//! An unchanged client-go SharedInformer over NATS (issue 30.3): `kcache-nats-informer`
//! (conformance/nats-informer/, the reference version's client-go on the project's Go
//! package clients/go/natsinformer) follows one namespace's ConfigMaps through a real
//! 3-replica fleet on a real 3-node NATS cluster, with no connection to the API server.
//! While the ConfigMaps are written, the key's owner is killed with SIGKILL and then a
//! NATS node is killed and restarted. Judged against the API server: the informer's store
//! converges to the API server's objects and resourceVersions, and no object's
//! resourceVersion ever goes back in its event handlers.

mod support;

use std::process::Stdio;
use std::time::Duration;

use base64::Engine;
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::{Child, ChildStdout};

use support::kcache::Kcache;
use support::nats::{fleet_signer, NATS_TOKEN};
use support::nats_cluster::{fleet_toml, NatsCluster};
use support::{eventually, TestCluster};

const NS: &str = "natsinformed";
const KEY: &str = "/api/v1/namespaces/natsinformed/configmaps";

struct Informer {
    child: Child,
    lines: Lines<BufReader<ChildStdout>>,
}

impl Informer {
    async fn line(&mut self, what: &str) -> String {
        match tokio::time::timeout(Duration::from_secs(180), self.lines.next_line()).await {
            Ok(Ok(Some(l))) => l,
            _ => panic!(
                "{what}: the informer said nothing, or exited:\n{}",
                self.stderr().await
            ),
        }
    }

    async fn stderr(&mut self) -> String {
        use tokio::io::AsyncReadExt;
        let _ = self.child.start_kill();
        let mut s = String::new();
        if let Some(mut e) = self.child.stderr.take() {
            let _ = tokio::time::timeout(Duration::from_secs(5), e.read_to_string(&mut s)).await;
        }
        let lines: Vec<&str> = s.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }
}

async fn put(cluster: &TestCluster, name: &str, v: &str) {
    // A write may fail while the fleet moves; the writer goes on with the next one.
    let _ = support::http::apply(
        &cluster.url,
        &format!("/api/v1/namespaces/{NS}/configmaps/{name}"),
        &json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": {"v": v}}),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_go_informer_over_nats_converges_through_an_owner_kill_and_a_nats_node_restart() {
    let cluster = TestCluster::start().await;
    let dir = cluster.dir_path();
    let mut nats = NatsCluster::start(dir, 3).await;
    let admin = cluster.kube_client().await;
    support::create_namespace(&admin, NS).await;
    for i in 0..5 {
        put(&cluster, &format!("c{i}"), "0").await;
    }
    // Three replicas declaring the namespace's ConfigMaps: published with no HTTP client.
    let toml = format!(
        "{}\n[[publish]]\nversion = \"v1\"\nresource = \"configmaps\"\nnamespace = \"{NS}\"\n",
        fleet_toml(dir, &nats, "lease_replicas = 3")
    );
    let mut replicas = Vec::new();
    for id in ["a", "b", "c"] {
        replicas.push(Kcache::start_with_args(&cluster, &toml, &["--replica-id", id]).await);
    }
    let owner = |roles: &[String]| roles.iter().position(|r| r == "owner");
    let mut roles = Vec::new();
    eventually("one replica owns the key", Duration::from_secs(30), || {
        let replicas = &replicas;
        async move {
            let mut r = Vec::new();
            for k in replicas {
                r.push(k.role(KEY).await);
            }
            r.iter().filter(|x| *x == "owner").count() == 1
        }
    })
    .await;
    for k in &replicas {
        roles.push(k.role(KEY).await);
    }
    let first_owner = owner(&roles).expect("an owner");

    let token = dir.join("informer-nats-token");
    std::fs::write(&token, NATS_TOKEN).expect("token file");
    let public = base64::engine::general_purpose::STANDARD.encode(fleet_signer().public_key());
    // Two informers: client-go's default (streaming lists) and one with them off (List,
    // then Watch from its resourceVersion), both through the same faults.
    let start = |streaming: bool| {
        let mut cmd = tokio::process::Command::new(support::judge_bin("kcache-nats-informer"));
        cmd.args(["--nats", &nats.urls(), "--token-file"])
            .arg(&token)
            .args(["--verify-key", &public, "--namespace", NS])
            .args([
                "--await-name",
                "done",
                "--await-value",
                "1",
                "--timeout",
                "180s",
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        if !streaming {
            cmd.env("KUBE_FEATURE_WatchListClient", "false");
        }
        let mut child = cmd.spawn().expect("start kcache-nats-informer");
        let lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
        Informer { child, lines }
    };
    let mut informers = [start(true), start(false)];
    for informer in &mut informers {
        let synced = informer.line("sync").await;
        assert!(
            synced.starts_with("synced 5 "),
            "the informer synced the five ConfigMaps: {synced}"
        );
    }

    // Writes through the faults: the owner killed, then a NATS node killed and restarted.
    let writes = async {
        for i in 1..=120 {
            put(&cluster, &format!("c{}", i % 5), &i.to_string()).await;
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    let faults = async {
        tokio::time::sleep(Duration::from_secs(1)).await;
        replicas[first_owner].kill9();
        // A survivor takes the key over (the killed one's presence is gone).
        eventually(
            "a surviving replica owns the key",
            Duration::from_secs(30),
            || {
                let replicas = &replicas;
                async move {
                    let mut n = 0;
                    for (i, k) in replicas.iter().enumerate() {
                        if i != first_owner && k.role(KEY).await == "owner" {
                            n += 1;
                        }
                    }
                    n == 1
                }
            },
        )
        .await;
        nats.kill9(0);
        tokio::time::sleep(Duration::from_secs(2)).await;
        nats.restart(0);
    };
    tokio::join!(writes, faults);
    put(&cluster, "done", "1").await;

    let api: kube::Api<k8s_openapi::api::core::v1::ConfigMap> = kube::Api::namespaced(admin, NS);
    let truth = support::judge::upstream_state(&api).await;
    for (informer, streaming) in informers.iter_mut().zip([true, false]) {
        let summary: Value =
            serde_json::from_str(&informer.line("summary").await).expect("summary JSON");
        eprintln!("the informer over NATS (streaming lists {streaming}): {summary}");
        let seen: std::collections::BTreeMap<String, String> = summary["resourceVersions"]
            .as_object()
            .expect("resourceVersions")
            .iter()
            .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string()))
            .collect();
        // `done` is the informer's exit condition; every other object must be at the API
        // server's resourceVersion too.
        assert_eq!(seen, truth, "the informer's store is the API server's");
        assert_eq!(summary["wentBack"], json!([]), "{summary}");
        // The faults reached it: a new owner's epoch (and any gap while its NATS node was
        // down) sent it back to a snapshot at least once, by the 410 a reflector relists on.
        let stats = &summary["nats"];
        let n = |k: &str| stats[k].as_i64().unwrap_or(0);
        assert!(n("expired") >= 1, "{summary}");
        if streaming {
            assert!(n("streamingLists") >= 2, "{summary}");
        } else {
            assert!(
                n("lists") >= 2 && n("watches") >= 2 && n("streamingLists") == 0,
                "{summary}"
            );
        }
    }
}
