//! The reference version's client-go as the judge: an unchanged SharedInformer
//! (`kcache-informer`, conformance/informer-sync/) syncing by streaming list — client-go's
//! default since 1.35 — with the watchlist consistency detector on, through one kcache
//! and through a fleet, under writes and faults. It must converge on the API server's
//! state, never see an object's resourceVersion go back, never trip the detector (which
//! re-lists at the initial-events-end bookmark's RV with Exact and panics on a
//! difference), and find in its first synced state a write made just before it started.

mod support;

use std::collections::BTreeMap;
use std::process::Stdio;
use std::time::Duration;

use serde_json::{json, Value};
use support::kcache::Kcache;
use support::nats::{fleet_toml, Nats};
use support::{create_as_admin, TestCluster, ADMIN_TOKEN};
use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::{Child, ChildStdout};

const NS: &str = "informed";

/// A running `kcache-informer` against `server`, with the consistency detector on.
struct Informer {
    child: Child,
    lines: Lines<BufReader<ChildStdout>>,
}

impl Informer {
    fn start(server: &str, await_value: &str) -> Informer {
        let mut child = tokio::process::Command::new(support::judge_bin("kcache-informer"))
            .args([
                "--server",
                server,
                "--token",
                ADMIN_TOKEN,
                "--namespace",
                NS,
            ])
            .args(["--await-name", "done", "--await-value", await_value])
            .args(["--timeout", "240s"])
            .env("KUBE_WATCHLIST_INCONSISTENCY_DETECTOR", "true")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("start kcache-informer");
        let lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
        Informer { child, lines }
    }

    async fn line(&mut self, what: &str) -> String {
        tokio::time::timeout(Duration::from_secs(240), self.lines.next_line())
            .await
            .unwrap_or_else(|_| panic!("{what}: nothing in 240 s"))
            .expect("read the informer's output")
            .unwrap_or_default()
    }

    /// The names in its first synced state.
    async fn synced(&mut self) -> Vec<String> {
        let line = self.line("sync").await;
        if line.is_empty() {
            panic!(
                "the informer exited before syncing:\n{}",
                self.stderr().await
            );
        }
        let initial = line
            .split_once("initial=")
            .map(|(_, names)| names.to_string())
            .unwrap_or_else(|| panic!("unexpected first line: {line}"));
        initial
            .split(',')
            .filter(|s| !s.is_empty())
            .map(|k| k.rsplit('/').next().unwrap_or(k).to_string())
            .collect()
    }

    /// Its summary once it saw the awaited write; panics with its stderr (the detector's
    /// panic, a timeout) when it exits otherwise.
    async fn finish(mut self) -> Value {
        let line = self.line("summary").await;
        let status = self.child.wait().await.expect("wait for the informer");
        if !status.success() || line.is_empty() {
            panic!("the informer failed ({status}):\n{}", self.stderr().await);
        }
        serde_json::from_str(&line).expect("summary JSON")
    }

    async fn stderr(&mut self) -> String {
        use tokio::io::AsyncReadExt;
        let mut s = String::new();
        if let Some(mut e) = self.child.stderr.take() {
            let _ = tokio::time::timeout(Duration::from_secs(5), e.read_to_string(&mut s)).await;
        }
        s.lines()
            .rev()
            .take(40)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect::<Vec<_>>()
            .join("\n")
    }
}

async fn put_cm(cluster: &TestCluster, name: &str, v: &str) {
    // A write during an API server restart may fail; the writer goes on with the next one.
    let _ = support::http::apply(
        &cluster.url,
        &format!("/api/v1/namespaces/{NS}/configmaps/{name}"),
        &json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": {"v": v}}),
    )
    .await;
}

async fn delete_cm(cluster: &TestCluster, name: &str) {
    if let Ok(r) = support::insecure_http()
        .delete(format!(
            "{}/api/v1/namespaces/{NS}/configmaps/{name}",
            cluster.url
        ))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
    {
        let _ = r.bytes().await;
    }
}

/// The API server's ConfigMaps in the namespace, name → data.v (kube-root-ca.crt is not
/// created on this rig: no controller-manager).
async fn upstream_state(cluster: &TestCluster) -> BTreeMap<String, String> {
    let (code, list) = support::http::Http::new(&cluster.url)
        .get_admin(&format!("/api/v1/namespaces/{NS}/configmaps"))
        .await;
    assert_eq!(code, 200);
    list["items"]
        .as_array()
        .expect("items")
        .iter()
        .map(|o| {
            (
                o["metadata"]["name"].as_str().unwrap_or("").to_string(),
                o["data"]["v"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect()
}

fn informer_state(summary: &Value) -> BTreeMap<String, String> {
    summary["objects"]
        .as_object()
        .expect("objects")
        .iter()
        .map(|(k, v)| (k.clone(), v.as_str().unwrap_or("").to_string()))
        .collect()
}

/// Writes `rounds` rounds over 20 ConfigMaps: updates, and a create and a delete each round.
async fn writes(cluster: &TestCluster, from: usize, rounds: usize) {
    for r in from..from + rounds {
        put_cm(cluster, &format!("cm{}", r % 20), &r.to_string()).await;
        put_cm(cluster, &format!("tmp{r}"), "t").await;
        if r > 0 {
            delete_cm(cluster, &format!("tmp{}", r - 1)).await;
        }
    }
}

fn judge(summary: &Value, upstream: &BTreeMap<String, String>, who: &str) {
    assert_eq!(
        &informer_state(summary),
        upstream,
        "{who}: the informer's store against the API server's: {summary}"
    );
    assert_eq!(
        summary["wentBack"],
        Value::Null,
        "{who}: a resourceVersion went back: {summary}"
    );
    assert!(
        summary["streamingLists"].as_u64().unwrap_or(0) >= 1,
        "{who}: client-go did not sync by streaming list: {summary}"
    );
}

async fn setup(cluster: &TestCluster) {
    create_as_admin(
        cluster,
        "/api/v1/namespaces",
        json!({"metadata": {"name": NS}}),
    )
    .await;
    for i in 0..20 {
        put_cm(cluster, &format!("cm{i}"), "init").await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reference_informer_syncs_by_streaming_list_through_kcache_under_writes() {
    let cluster = TestCluster::start().await;
    let k = Kcache::start(&cluster, "").await;
    setup(&cluster).await;
    let mut runs = Vec::new();
    for run in 0..3 {
        // A write made just before the informer starts is in its first synced state.
        let pre = format!("pre{run}");
        put_cm(&cluster, &pre, "p").await;
        let mut informer = Informer::start(&k.url, &run.to_string());
        let initial = informer.synced().await;
        assert!(
            initial.contains(&pre),
            "run {run}: {pre} missing from the initial state {initial:?}"
        );
        writes(&cluster, run * 40, 40).await;
        put_cm(&cluster, "done", &run.to_string()).await;
        let summary = informer.finish().await;
        judge(
            &summary,
            &upstream_state(&cluster).await,
            &format!("run {run}"),
        );
        runs.push(summary);
    }
    // Its streaming lists were kcache's own, proven fresh, not forwarded upstream.
    let m = k.metrics_text().await;
    let count = |o: &str| {
        support::prom::sum_samples(
            &m,
            "kcache_consistent_reads_total",
            Some(&format!("outcome=\"{o}\"")),
        )
    };
    assert!(
        count("fresh") + count("waited") >= 3.0,
        "consistent reads served: {m}"
    );
    assert_eq!(count("forwarded"), 0.0, "consistent reads forwarded");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reference_informers_converge_through_a_fleet_across_an_owner_kill_and_an_api_server_restart(
) {
    let mut cluster = TestCluster::start().await;
    setup(&cluster).await;
    let nats = Nats::start(cluster.dir_path());
    let toml = fleet_toml(cluster.dir_path(), &nats, "");
    let mut fleet = Vec::new();
    for id in ["a", "b", "c"] {
        fleet.push(Kcache::start_with_args(&cluster, &toml, &["--replica-id", id]).await);
    }
    // One informer per replica: the namespace key's owner and its mirrors all serve one.
    let mut informers: Vec<Informer> = fleet.iter().map(|r| Informer::start(&r.url, "1")).collect();
    for (i, inf) in informers.iter_mut().enumerate() {
        let initial = inf.synced().await;
        assert!(
            initial.len() >= 20,
            "replica {i}: initial state {initial:?}"
        );
    }
    writes(&cluster, 0, 30).await;
    // kill -9 of the namespace key's owner, mid-writes.
    let key = format!("/api/v1/namespaces/{NS}/configmaps");
    let mut owner = None;
    for (i, r) in fleet.iter().enumerate() {
        if r.role(&key).await == "owner" {
            owner = Some(i);
        }
    }
    let owner = owner.expect("one replica owns the namespace key");
    fleet[owner].kill9();
    // Its informer goes with it (its server is gone); the others carry on.
    let dead = informers.remove(owner);
    drop(dead);
    writes(&cluster, 30, 30).await;
    // An API server restart (kill -9, same etcd), mid-writes.
    cluster.restart_apiserver().await;
    writes(&cluster, 60, 30).await;
    put_cm(&cluster, "done", "1").await;
    let upstream = upstream_state(&cluster).await;
    for (i, inf) in informers.into_iter().enumerate() {
        let summary = inf.finish().await;
        judge(&summary, &upstream, &format!("surviving informer {i}"));
    }
    // A new informer on a survivor syncs the current state, the latest write included.
    let survivor = fleet
        .iter()
        .enumerate()
        .find(|(i, _)| *i != owner)
        .map(|(_, r)| r)
        .expect("a survivor");
    put_cm(&cluster, "pre", "late").await;
    let mut late = Informer::start(&survivor.url, "2");
    let initial = late.synced().await;
    assert!(
        initial.iter().any(|n| n == "pre"),
        "the write before the late informer: {initial:?}"
    );
    put_cm(&cluster, "done", "2").await;
    let summary = late.finish().await;
    judge(&summary, &upstream_state(&cluster).await, "late informer");
}
