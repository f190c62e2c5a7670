//! Adaptive coalescing against a real API server: names of one namespace watched by
//! kube-rs clients move onto the namespace key once enough of them are watched, and back
//! onto name keys once few are, under random writes. Every client's events are compared
//! with those of the same watch on the API server itself: no gap, no duplicate, no
//! resourceVersion going back, no relist, the same final state.

mod support;

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::runtime::watcher;
use serde_json::Value;
use support::http::events_until_quiet;
use support::judge::{upstream_state, Judge};
use support::kcache::Kcache;
use support::{eventually, TestCluster, ADMIN_TOKEN};

const NS: &str = "coal";
/// Objects in the namespace (the writer's names).
const OBJECTS: usize = 10;

/// Random writes over the namespace's ten ConfigMaps.
async fn writes(api: &kube::Api<ConfigMap>, n: usize) {
    use rand::Rng;
    for i in 0..n {
        let (name, op) = {
            let mut rng = rand::rng();
            (
                format!("cm{}", rng.random_range(0..OBJECTS)),
                rng.random_range(0..10),
            )
        };
        if op < 2 {
            let _ = api.delete(&name, &Default::default()).await;
        } else {
            let cm: ConfigMap = serde_json::from_value(serde_json::json!({
                "metadata": {"name": name},
                "data": {"i": i.to_string()},
            }))
            .expect("cm");
            let pp = kube::api::PatchParams::apply("test").force();
            let _ = api.patch(&name, &pp, &kube::api::Patch::Apply(&cm)).await;
        }
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
}

/// One name, watched through kcache and directly on the API server.
struct Pair {
    name: String,
    kcache: Judge,
    direct: Judge,
}

impl Pair {
    fn start(k: &Kcache, admin: &kube::Client, name: &str) -> Pair {
        let cfg = || watcher::Config::default().fields(&format!("metadata.name={name}"));
        Pair {
            name: name.to_string(),
            kcache: Judge::start_with(k.kube_client(ADMIN_TOKEN), NS, cfg()),
            direct: Judge::start_with(admin.clone(), NS, cfg()),
        }
    }

    /// The object events (`apply|delete name rv`) a judge saw after its first list, above
    /// `after`.
    fn events(judge: &Judge, after: u64) -> Vec<String> {
        let s = judge.seen.lock().expect("seen");
        s.recent
            .iter()
            .skip_while(|e| *e != "init-done")
            .filter(|e| e.starts_with("apply ") || e.starts_with("delete "))
            .filter(|e| {
                e.rsplit(' ')
                    .next()
                    .and_then(|rv| rv.parse::<u64>().ok())
                    .is_some_and(|rv| rv > after)
            })
            .cloned()
            .collect()
    }

    /// Where a judge's first list stands: the highest RV among its initial objects; when
    /// the name was absent from it, just before its first event (a list at resourceVersion
    /// 0 may come from either server's cache, so the two judges' lists are not taken at one
    /// moment: one may start after a deletion the other still had to see), or 0.
    fn listed_at(judge: &Judge) -> u64 {
        let s = judge.seen.lock().expect("seen");
        let rv = |e: &String| e.rsplit(' ').next().and_then(|rv| rv.parse::<u64>().ok());
        let initial = s
            .recent
            .iter()
            .take_while(|e| *e != "init-done")
            .filter_map(rv)
            .max();
        initial
            .or_else(|| {
                s.recent
                    .iter()
                    .skip_while(|e| *e != "init-done")
                    .filter(|e| e.starts_with("apply ") || e.starts_with("delete "))
                    .find_map(rv)
                    .map(|first| first.saturating_sub(1))
            })
            .unwrap_or(0)
    }

    /// Both judges hold the API server's state of the name, the kcache one saw the same
    /// events as the direct one since both had listed, and it never broke or relisted.
    async fn judge(&self, api: &kube::Api<ConfigMap>) {
        let want: BTreeMap<String, String> = upstream_state(api)
            .await
            .into_iter()
            .filter(|(n, _)| *n == self.name)
            .collect();
        eventually(
            &format!("the watchers of {} converge", self.name),
            Duration::from_secs(60),
            || async { self.kcache.state() == want && self.direct.state() == want },
        )
        .await;
        self.kcache.assert_clean(&self.name);
        let after = Self::listed_at(&self.kcache).max(Self::listed_at(&self.direct));
        assert_eq!(
            Self::events(&self.kcache, after),
            Self::events(&self.direct, after),
            "{}: kcache (left) vs the API server, events after RV {after}",
            self.name
        );
    }
}

/// A cluster with the test namespace, a kcache over it started with `config`, and the
/// namespace's ConfigMaps.
async fn namespace_through_kcache(config: &str) -> (TestCluster, Kcache, kube::Api<ConfigMap>) {
    let cluster = TestCluster::start().await;
    let k = Kcache::start(&cluster, config).await;
    let admin = cluster.kube_client().await;
    support::create_namespace(&admin, NS).await;
    let api = kube::Api::namespaced(admin, NS);
    (cluster, k, api)
}

/// Writes `data.after = value` to ConfigMap `name` (replacing it); its new RV.
async fn write_after(api: &kube::Api<ConfigMap>, name: &str, value: &str) -> String {
    let cm: ConfigMap = serde_json::from_value(serde_json::json!({
        "metadata": {"name": name},
        "data": {"after": value},
    }))
    .expect("cm");
    api.replace(name, &Default::default(), &cm)
        .await
        .expect("replace")
        .metadata
        .resource_version
        .unwrap_or_default()
}

/// Creates the namespace's ConfigMaps `cm0`..`cm9`; their RVs by index.
async fn create_objects(api: &kube::Api<ConfigMap>) -> BTreeMap<usize, String> {
    let mut rvs = BTreeMap::new();
    for i in 0..OBJECTS {
        let cm: ConfigMap = serde_json::from_value(serde_json::json!({
            "metadata": {"name": format!("cm{i}")},
        }))
        .expect("cm");
        let made = api.create(&Default::default(), &cm).await.expect("create");
        rvs.insert(i, made.metadata.resource_version.unwrap_or_default());
    }
    rvs
}

/// Six single-object watches through `k`, of the names `{prefix}0`..`{prefix}5`, each with
/// `query` added.
async fn name_watches(k: &Kcache, prefix: &str, query: &str) -> Vec<support::http::Events> {
    let http = support::http::Http::new(&k.url);
    let mut watches = Vec::new();
    for i in 0..6 {
        watches.push(
            http.watch_ok(&format!(
                "/api/v1/namespaces/{NS}/configmaps?watch=1{query}\
                 &fieldSelector=metadata.name%3D{prefix}{i}"
            ))
            .await,
        );
    }
    watches
}

/// Waits until the namespace key serves the names, then until their keys have stopped
/// (`what`) within `stop_within`, leaving one upstream watch.
async fn coalesced_into_one_watch(k: &Kcache, stop_within: Duration, what: &str) {
    eventually(
        "the namespace key serves the names",
        Duration::from_secs(60),
        || async { coalesced(k).await.as_deref() == Some("coalesced") },
    )
    .await;
    eventually(
        &format!("{what}: one upstream watch"),
        stop_within,
        || async { name_keys(k).await == 0 && k.metric("kcache_upstream_watches").await == 1.0 },
    )
    .await;
}

async fn coalesced(k: &Kcache) -> Option<String> {
    k.key_info(&format!("/api/v1/namespaces/{NS}/configmaps"))
        .await
        .and_then(|i| i["coalescing"].as_str().map(str::to_string))
}

async fn name_keys(k: &Kcache) -> usize {
    let keys = k.debug_keys().await;
    keys["keys"]
        .as_array()
        .map(|ks| {
            ks.iter()
                .filter(|k| {
                    k["key"]
                        .as_str()
                        .is_some_and(|k| k.contains(&format!("/namespaces/{NS}/configmaps/")))
                })
                .count()
        })
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watched_names_coalesce_into_their_namespace_and_split_back_without_a_gap() {
    let cluster = TestCluster::start().await;
    // Four of ten objects watched coalesce; two split back after 3 s. Name keys stop 2 s
    // after their last watcher left. A window large enough that nothing here expires.
    let k = Kcache::start(
        &cluster,
        "[cache]\ncoalesce_min_names = 4\ncoalesce_fraction = 0.3\n\
         coalesce_split_fraction = 0.35\ncoalesce_split_after_secs = 3\n\
         grace_period_secs = 2\nwindow_capacity = 2000\n",
    )
    .await;
    let admin = cluster.kube_client().await;
    support::create_namespace(&admin, NS).await;
    let api: kube::Api<ConfigMap> = kube::Api::namespaced(admin.clone(), NS);
    // Every object exists when the names are asked: a name whose object does not exist
    // weighs nothing at the request's decision (`Coalescing::in_flight`), so with random
    // deletes first the fourth name could fall short of the fraction, start its own key
    // and move later (a CI run saw 4 moves).
    create_objects(&api).await;

    // Three names first, below coalesce_min_names: each its own name key. The fourth
    // name coalesces the namespace (decided at its request, `core::coalesce::on_request`:
    // 4 names, 4 of 10 objects held) and the first three names' watchers move onto the
    // namespace key.
    let mut pairs: Vec<Pair> = (0..3)
        .map(|i| Pair::start(&k, &admin, &format!("cm{i}")))
        .collect();
    // Both sides of every pair list before anything is written, so their first lists
    // show the same state and their events can be compared one for one.
    let listed = |j: &Judge| j.seen.lock().expect("seen").inits >= 1;
    eventually(
        "the first watchers listed",
        Duration::from_secs(30),
        || async { pairs.iter().all(|p| listed(&p.kcache) && listed(&p.direct)) },
    )
    .await;
    // A watch follows its list: its key may start a moment after.
    eventually("a name key each", Duration::from_secs(10), || async {
        name_keys(&k).await == 3
    })
    .await;
    pairs.extend((3..6).map(|i| Pair::start(&k, &admin, &format!("cm{i}"))));
    eventually("every watcher listed", Duration::from_secs(30), || async {
        pairs.iter().all(|p| listed(&p.kcache) && listed(&p.direct))
    })
    .await;
    let writer = {
        let api = api.clone();
        tokio::spawn(async move { writes(&api, 250).await })
    };
    coalesced_into_one_watch(&k, Duration::from_secs(60), "the name keys stopped").await;
    // /debug/keys says which key serves the names and why: six names, each held as one
    // object now that the namespace key serves them all. The group's figures are those of
    // the last check (every second), which may predate the last name key's stop: a name
    // key whose object the writer had deleted held none.
    let ns_key = format!("/api/v1/namespaces/{NS}/configmaps");
    let group_of = |keys: &Value| {
        keys["groups"]
            .as_array()
            .and_then(|g| g.iter().find(|g| g["key"] == ns_key.as_str()).cloned())
    };
    let want = (Value::from("coalesced"), Value::from(6), Value::from(6));
    let figures = |g: &Value| (g["state"].clone(), g["names"].clone(), g["held"].clone());
    let mut keys = k.debug_keys().await;
    for _ in 0..10 {
        if group_of(&keys).is_some_and(|g| figures(&g) == want) {
            break;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
        keys = k.debug_keys().await;
    }
    let group = group_of(&keys).unwrap_or_else(|| panic!("no group for {ns_key}: {keys:#}"));
    assert_eq!(figures(&group), want, "{keys:#}");
    // Why: the six held objects are at least coalesce_fraction of the namespace's count.
    assert!(
        group["objects"]
            .as_u64()
            .is_some_and(|n| 6.0 >= 0.3 * n as f64),
        "{keys:#}"
    );
    let info = k.key_info(&ns_key).await.expect("namespace key");
    let served = support::kcache::covering(&info);
    let want: Vec<String> = (0..6)
        .map(|i| format!("{ns_key}/cm{i} coalesced"))
        .collect();
    assert_eq!(served, want, "{info:#}");
    writer.await.expect("writes");
    for p in &pairs {
        p.judge(&api).await;
    }
    // The three that ran before the decision moved; the others never had a key to move
    // from.
    let moved_on = k.metric("kcache_coalesce_moved_watchers_total").await;
    assert_eq!(moved_on, 3.0, "the first three watchers moved");
    assert_eq!(
        k.metric("kcache_coalesce_upstream_watches_saved").await,
        5.0
    );

    // Four names are left alone: two watched of ten is below the split share.
    let mut pairs = pairs;
    pairs.truncate(2);
    let writer = {
        let api = api.clone();
        tokio::spawn(async move { writes(&api, 250).await })
    };
    for _ in 0..60 {
        if coalesced(&k).await.is_none() && name_keys(&k).await == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    if !(coalesced(&k).await.is_none() && name_keys(&k).await == 2) {
        panic!("no split: {:#}\n{}", k.debug_keys().await, k.log_tail());
    }
    writer.await.expect("writes");
    eventually(
        "the namespace key stopped: one upstream watch per name",
        Duration::from_secs(60),
        || async { k.metric("kcache_upstream_watches").await == 2.0 },
    )
    .await;
    for p in &pairs {
        p.judge(&api).await;
    }
    assert!(k.metric("kcache_coalesce_moved_watchers_total").await >= moved_on + 2.0);
    assert_eq!(k.metric("kcache_coalesce_splits_total").await, 1.0);
    assert_eq!(k.metric("kcache_coalescings_total").await, 1.0);
}

/// A replica of a 3-replica fleet with coalescing on.
async fn fleet_replica(cluster: &TestCluster, nats: &support::nats::Nats, id: &str) -> Kcache {
    let toml = support::nats::fleet_toml(cluster.dir_path(), nats, "interest_interval_ms = 300")
        .replacen(
            "[cache]\n",
            "[cache]\ncoalesce_min_names = 4\ncoalesce_fraction = 0.3\n\
             coalesce_split_fraction = 0.05\nwindow_capacity = 2000\n",
            1,
        );
    Kcache::start_with_args(cluster, &toml, &["--replica-id", id]).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_coalesces_on_names_watched_across_replicas_and_survives_the_owners_kill() {
    let cluster = TestCluster::start().await;
    let nats = support::nats::Nats::start(cluster.dir_path());
    let mut replicas = Vec::new();
    for id in ["a", "b", "c"] {
        replicas.push(fleet_replica(&cluster, &nats, id).await);
    }
    let admin = cluster.kube_client().await;
    support::create_namespace(&admin, NS).await;
    let api: kube::Api<ConfigMap> = kube::Api::namespaced(admin.clone(), NS);
    writes(&api, 20).await;

    // Two names per replica: no replica alone watches enough names to coalesce; the
    // fleet does.
    let pairs: Vec<(usize, Pair)> = (0..6)
        .map(|i| {
            (
                i / 2,
                Pair::start(&replicas[i / 2], &admin, &format!("cm{i}")),
            )
        })
        .collect();
    let listed = |j: &Judge| j.seen.lock().expect("seen").inits >= 1;
    eventually("every watcher listed", Duration::from_secs(30), || async {
        pairs
            .iter()
            .all(|(_, p)| listed(&p.kcache) && listed(&p.direct))
    })
    .await;
    let writer = {
        let api = api.clone();
        tokio::spawn(async move { writes(&api, 400).await })
    };
    let ns_key = format!("/api/v1/namespaces/{NS}/configmaps");
    let all_coalesced = || async {
        for r in &replicas {
            if coalesced(r).await.as_deref() != Some("coalesced") || name_keys(r).await != 0 {
                return false;
            }
        }
        true
    };
    for _ in 0..60 {
        if all_coalesced().await {
            break;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    if !all_coalesced().await {
        let mut dump = String::new();
        for r in &replicas {
            dump += &format!("{:#}\n", r.debug_keys().await);
        }
        panic!(
            "not every replica coalesced:\n{dump}\n{}",
            replicas[0].log_tail()
        );
    }
    let mut owners = Vec::new();
    for (i, r) in replicas.iter().enumerate() {
        if r.role(&ns_key).await == "owner" {
            owners.push(i);
        }
    }
    assert_eq!(
        owners.len(),
        1,
        "one owner of the namespace key: {owners:?}"
    );
    eventually(
        "one upstream watch in the fleet",
        Duration::from_secs(30),
        || async {
            let mut total = 0.0;
            for r in &replicas {
                total += r.metric("kcache_upstream_watches").await;
            }
            total == 1.0
        },
    )
    .await;

    // The owner is killed mid-writes; another replica takes the namespace key over and
    // the survivors' clients see every event.
    let owner = owners[0];
    replicas[owner].kill9();
    let survivors: Vec<usize> = (0..3).filter(|i| *i != owner).collect();
    eventually(
        "a survivor owns the namespace key",
        Duration::from_secs(30),
        || async {
            for i in &survivors {
                if replicas[*i].role(&ns_key).await == "owner" {
                    return true;
                }
            }
            false
        },
    )
    .await;
    writer.await.expect("writes");
    for (at, p) in &pairs {
        if *at != owner {
            p.judge(&api).await;
        }
    }
    for i in &survivors {
        assert_eq!(
            coalesced(&replicas[*i]).await.as_deref(),
            Some("coalesced"),
            "replica {i} still coalesced"
        );
    }
}

/// How long a watch stays quiet before its events are taken to be all.
const QUIET: Duration = Duration::from_secs(3);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_pod_watches_coalesce_into_the_cluster_pods_key_without_a_gap() {
    use k8s_openapi::api::core::v1::Pod;
    let cluster = TestCluster::start().await;
    let k = Kcache::start(
        &cluster,
        "[cache]\ncoalesce_min_names = 3\ncoalesce_fraction = 0.5\n\
         grace_period_secs = 2\nwindow_capacity = 2000\n",
    )
    .await;
    let admin = cluster.kube_client().await;
    let ns = "nodes";
    support::create_namespace(&admin, ns).await;
    // No controller-manager: the ServiceAccount admission plugin needs the default one.
    support::create_as_admin(
        &cluster,
        &format!("/api/v1/namespaces/{ns}/serviceaccounts"),
        serde_json::json!({"metadata": {"name": "default"}}),
    )
    .await;
    for i in 0..12 {
        support::create_as_admin(
            &cluster,
            &format!("/api/v1/namespaces/{ns}/pods"),
            serde_json::json!({
                "metadata": {"name": format!("p{i}")},
                "spec": {
                    "nodeName": format!("n{}", i % 4),
                    "automountServiceAccountToken": false,
                    "containers": [{"name": "c", "image": "busybox"}],
                }
            }),
        )
        .await;
    }
    let http = support::insecure_http();
    let get = |url: String| {
        let http = http.clone();
        async move {
            let resp = http
                .get(url)
                .bearer_auth(ADMIN_TOKEN)
                .send()
                .await
                .expect("request");
            assert_eq!(resp.status().as_u16(), 200);
            resp
        }
    };
    let list: serde_json::Value = get(format!("{}/api/v1/pods", cluster.url))
        .await
        .json()
        .await
        .expect("list");
    let rv = list["metadata"]["resourceVersion"]
        .as_str()
        .expect("list rv")
        .to_string();
    // Each kubelet's pod watch, from the same RV, through kcache and on the API server.
    let mut watches = Vec::new();
    for n in 0..4 {
        let path =
            format!("/api/v1/pods?watch=1&resourceVersion={rv}&fieldSelector=spec.nodeName%3Dn{n}");
        watches.push((
            support::event_channel(get(format!("{}{path}", k.url)).await),
            support::event_channel(get(format!("{}{path}", cluster.url)).await),
        ));
    }
    let pods: kube::Api<Pod> = kube::Api::namespaced(admin.clone(), ns);
    let writer = tokio::spawn(async move {
        for i in 0..200 {
            let name = format!("p{}", i % 12);
            let patch = serde_json::json!({"metadata": {"labels": {"i": i.to_string()}}});
            let _ = pods
                .patch(&name, &Default::default(), &kube::api::Patch::Merge(&patch))
                .await;
            tokio::time::sleep(Duration::from_millis(30)).await;
        }
    });
    eventually(
        "the cluster pods key serves the nodes, one upstream watch",
        Duration::from_secs(60),
        || async {
            let coalesced = k
                .key_info("/api/v1/pods")
                .await
                .is_some_and(|i| i["coalescing"] == "coalesced");
            coalesced
                && k.debug_keys().await["keys"].as_array().map(Vec::len) == Some(1)
                && k.metric("kcache_upstream_watches").await == 1.0
        },
    )
    .await;
    writer.await.expect("writes");
    for (n, (through, direct)) in watches.iter_mut().enumerate() {
        let (got, want) = (
            events_until_quiet(through, QUIET).await,
            events_until_quiet(direct, QUIET).await,
        );
        assert!(want.len() >= 40, "n{n}: the node's pods changed: {want:?}");
        assert_eq!(got, want, "n{n}: kcache (left) vs the API server");
    }
    assert!(k.metric("kcache_coalesce_moved_watchers_total").await >= 4.0);
}

/// Coalescing weighs the objects the names' keys hold, not the names asked for: watching
/// names that do not exist must not pull a whole namespace into the cache. The decision
/// is judged on its own figures (/debug/keys: the names counted, the namespace counted,
/// nothing held), not by a timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watching_names_that_do_not_exist_never_coalesces_their_namespace() {
    let (_cluster, k, api) =
        namespace_through_kcache("[cache]\ncoalesce_min_names = 4\ncoalesce_fraction = 0.3\n")
            .await;
    writes(&api, 10).await;
    let watches = name_watches(&k, "missing", "&resourceVersion=0").await;
    let ns_key = format!("/api/v1/namespaces/{NS}/configmaps");
    let group = || async {
        let keys = k.debug_keys().await;
        keys["groups"]
            .as_array()
            .and_then(|g| g.iter().find(|g| g["key"] == ns_key.as_str()).cloned())
    };
    // Decided on six names, a counted namespace and nothing held...
    let mut decided = 0;
    for _ in 0..60 {
        if let Some(g) = group().await {
            if g["names"] == 6 && g["objects"].as_u64().is_some() && g["held"] == 0 {
                decided += 1;
                // ...at least twice after the count (a check runs every second).
                if decided == 3 {
                    break;
                }
            }
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let keys = k.debug_keys().await;
    assert_eq!(decided, 3, "no decision on the group's figures: {keys:#}");
    // ...and kept apart: a name key per watched name, no namespace key.
    let g = group().await.expect("group");
    assert_eq!(g["state"], "apart", "{keys:#}");
    assert!(k.key_info(&ns_key).await.is_none(), "{keys:#}");
    assert_eq!(name_keys(&k).await, 6, "{keys:#}");
    assert_eq!(k.metric("kcache_coalescings_total").await, 0.0);
    drop(watches);
}

/// Name keys whose watchers all moved to their coalesced namespace key stop at once, not
/// after their grace period: from then on the namespace key serves every request of those
/// names, and a name key left running would hold a second upstream watch for nothing
/// (issue 31.4: a burst of kubelet watches kept 510 upstream watches for 30 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn name_keys_handed_over_to_their_coalesced_namespace_stop_at_once() {
    // A grace period far longer than the test: only stopping at once passes.
    let (_cluster, k, api) = namespace_through_kcache(
        "[cache]\ncoalesce_min_names = 4\ncoalesce_fraction = 0.3\ngrace_period_secs = 600\n",
    )
    .await;
    create_objects(&api).await;
    let mut watches = name_watches(&k, "cm", "").await;
    coalesced_into_one_watch(
        &k,
        Duration::from_secs(30),
        "the name keys stopped well within their grace period",
    )
    .await;
    // The watches went on from the namespace key: a write reaches the name's watch.
    let rv = write_after(&api, "cm0", "coalescing").await;
    let want = format!("MODIFIED {NS}/cm0@{rv}");
    let seen = events_until_quiet(&mut watches[0], Duration::from_secs(5)).await;
    assert!(
        seen.contains(&want),
        "cm0's watch: want {want}, got {seen:?}"
    );
}

/// A replica of a fleet with coalescing on and a grace period far longer than a test: only
/// a key stopped at once is gone within one.
async fn long_grace_replica(cluster: &TestCluster, nats: &support::nats::Nats, id: &str) -> Kcache {
    let toml = support::nats::fleet_toml(cluster.dir_path(), nats, "interest_interval_ms = 300")
        .replacen(
            "[cache]\n",
            "[cache]\ncoalesce_min_names = 4\ncoalesce_fraction = 0.3\n",
            1,
        )
        .replacen("grace_period_secs = 5", "grace_period_secs = 600", 1);
    assert!(toml.contains("grace_period_secs = 600"), "{toml}");
    Kcache::start_with_args(cluster, &toml, &["--replica-id", id]).await
}

/// Single-object watches through `k` of the ConfigMaps `cm<i>`.
async fn watches_of<const N: usize>(k: &Kcache, names: [usize; N]) -> Vec<support::http::Events> {
    let http = support::http::Http::new(&k.url);
    let mut watches = Vec::new();
    for i in names {
        watches.push(
            http.watch_ok(&format!(
                "/api/v1/namespaces/{NS}/configmaps?watch=1&fieldSelector=metadata.name%3Dcm{i}"
            ))
            .await,
        );
    }
    watches
}

/// Name keys that ran on two replicas (one owns each, the other mirrors it) and are
/// handed over to their coalesced namespace key on both stop at once on both: the owner
/// does not wait a grace period for the other replica's interest, which lapses as soon as
/// that replica has handed its own watchers over (a 3-replica fleet opening 99,000
/// kubelet watches kept ~700 such keys, each an upstream watch, 30 s longer than one
/// replica did).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handed_over_name_keys_stop_at_once_across_a_fleet() {
    let cluster = TestCluster::start().await;
    let nats = support::nats::Nats::start(cluster.dir_path());
    let a = long_grace_replica(&cluster, &nats, "a").await;
    let b = long_grace_replica(&cluster, &nats, "b").await;
    let admin = cluster.kube_client().await;
    support::create_namespace(&admin, NS).await;
    let api: kube::Api<ConfigMap> = kube::Api::namespaced(admin, NS);
    create_objects(&api).await;
    // Three names on each replica, two of them on both: neither alone reaches
    // coalesce_min_names (4), the fleet does (cm0..cm3); cm1 and cm2 are each one
    // replica's key and the other's mirror, with references on both.
    let _on_a = watches_of(&a, [0, 1, 2]).await;
    let _on_b = watches_of(&b, [1, 2, 3]).await;
    let settled = || async {
        for k in [&a, &b] {
            if coalesced(k).await.as_deref() != Some("coalesced") || name_keys(k).await != 0 {
                return false;
            }
        }
        a.metric("kcache_upstream_watches").await + b.metric("kcache_upstream_watches").await == 1.0
    };
    for _ in 0..40 {
        if settled().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    panic!(
        "name keys still running 20 s on:\n{:#}\n{:#}\n{}",
        a.debug_keys().await,
        b.debug_keys().await,
        a.log_tail()
    );
}

/// A replica that joins (or restarts into) a fleet that has coalesced a namespace serves
/// its clients' requests of those names from the namespace key at once: it starts no
/// name key — a lease nobody holds any more, an upstream list and watch each — for the
/// next coalescing check to stop a second later (issue 31.4; the fleet bench saw 100 such
/// keys per restarted replica).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_joining_a_fleet_that_coalesced_a_namespace_starts_no_name_key() {
    let cluster = TestCluster::start().await;
    let nats = support::nats::Nats::start(cluster.dir_path());
    let a = fleet_replica(&cluster, &nats, "a").await;
    let admin = cluster.kube_client().await;
    support::create_namespace(&admin, NS).await;
    let api: kube::Api<ConfigMap> = kube::Api::namespaced(admin, NS);
    create_objects(&api).await;
    let _on_a = name_watches(&a, "cm", "").await;
    coalesced_into_one_watch(&a, Duration::from_secs(30), "replica a coalesced").await;

    // Ready only once it has heard the fleet's interest: a's namespace key serves cm0..cm5.
    let c = fleet_replica(&cluster, &nats, "c").await;
    let mut on_c = name_watches(&c, "cm", "").await;
    for w in &mut on_c {
        let first = support::http::next_events(w, 1).await;
        assert!(first[0].starts_with("ADDED "), "{first:?}");
    }
    assert_eq!(coalesced(&c).await.as_deref(), Some("coalesced"));
    assert_eq!(name_keys(&c).await, 0, "{:#}", c.debug_keys().await);
    // Its namespace key mirrors a's; a name key would have been the owner of a lease
    // nobody held, listing upstream.
    assert_eq!(
        c.metric("kcache_upstream_lists_total").await,
        0.0,
        "{:#}\n{}",
        c.debug_keys().await,
        c.log_tail()
    );
    assert_eq!(
        c.role(&format!("/api/v1/namespaces/{NS}/configmaps")).await,
        "mirror"
    );
}

/// A burst of single-object watches — a new user's first watches, a node restart storm —
/// is coalesced from the requests in flight: the first waits for the namespace's object
/// count, the rest of the burst with it, and all are served by the namespace key. No name
/// key is started (its list, its upstream watch) for the once-a-second check to stop
/// (issue 31.4: 1,000 kubelet watches started 500 name keys, then coalesced them).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_name_watches_is_coalesced_before_any_name_key_starts() {
    let (_cluster, k, api) =
        namespace_through_kcache("[cache]\ncoalesce_min_names = 4\ncoalesce_fraction = 0.3\n")
            .await;
    let rvs = create_objects(&api).await;
    // Every name twice (two kubelets), all asked at once; lists first, as reflectors do
    // without streaming lists, then watches.
    let http = support::http::Http::new(&k.url);
    let path = |i: usize| {
        format!(
            "/api/v1/namespaces/{NS}/configmaps?fieldSelector=metadata.name%3Dcm{}",
            i % OBJECTS
        )
    };
    let lists = futures::future::join_all((0..2 * OBJECTS).map(|i| {
        let (http, path) = (&http, path(i));
        async move { http.get_admin(&path).await }
    }))
    .await;
    for (i, (code, list)) in lists.iter().enumerate() {
        assert_eq!(*code, 200, "list {i}: {list:#}");
        let names: Vec<&str> = list["items"]
            .as_array()
            .map(|items| {
                items
                    .iter()
                    .filter_map(|o| o["metadata"]["name"].as_str())
                    .collect()
            })
            .unwrap_or_default();
        assert_eq!(names, [format!("cm{}", i % OBJECTS)], "list {i}: {list:#}");
    }
    let mut watches = futures::future::join_all((0..2 * OBJECTS).map(|i| {
        let (http, path) = (&http, format!("{}&watch=1", path(i)));
        async move { http.watch_ok(&path).await }
    }))
    .await;
    // Each watch starts with its own object, and only that.
    for (i, w) in watches.iter_mut().enumerate() {
        let seen = events_until_quiet(w, Duration::from_secs(2)).await;
        let want = format!("ADDED {NS}/cm{}@{}", i % OBJECTS, rvs[&(i % OBJECTS)]);
        assert_eq!(seen, [want], "watch {i}");
    }
    let text = k.metrics_text().await;
    let started = |scope| {
        support::prom::sum(
            &text,
            "kcache_keys_started_total",
            &[("resource", "configmaps"), ("scope", scope)],
        )
    };
    let keys = k.debug_keys().await;
    assert_eq!(
        started("name"),
        0.0,
        "name keys started: {keys:#}\n{}",
        k.log_tail()
    );
    assert_eq!(started("namespace"), 1.0, "{keys:#}");
    assert_eq!(
        coalesced(&k).await.as_deref(),
        Some("coalesced"),
        "{keys:#}"
    );
    assert!(
        support::prom::sum(
            &text,
            "kcache_coalesce_request_waits_total",
            &[("result", "coalesced")]
        ) >= 1.0,
        "no request waited for the count: {text}"
    );
    // The namespace key goes on serving them: a write reaches both watches of its name.
    let rv = write_after(&api, "cm3", "the burst").await;
    for i in [3, 3 + OBJECTS] {
        let seen = events_until_quiet(&mut watches[i], Duration::from_secs(3)).await;
        assert_eq!(seen, [format!("MODIFIED {NS}/cm3@{rv}")], "watch {i}");
    }
    for i in [0, 4, 9 + OBJECTS] {
        let seen = events_until_quiet(&mut watches[i], Duration::from_millis(500)).await;
        assert!(
            seen.is_empty(),
            "watch {i} saw another name's write: {seen:?}"
        );
    }
}

/// A reflector's list of a name holds its key for the grace period. Once the namespace is
/// coalesced, those holds move to the namespace key (which serves the reads from then
/// on) and the name keys stop, rather than each keep an upstream watch until its hold
/// runs out (the restart bench had 344 such name keys running beside two namespace keys).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_holds_on_name_keys_move_to_their_coalesced_namespace_key() {
    // A grace period (the read hold) far longer than the test.
    let (_cluster, k, api) = namespace_through_kcache(
        "[cache]\ncoalesce_min_names = 4\ncoalesce_fraction = 0.3\ngrace_period_secs = 600\n",
    )
    .await;
    create_objects(&api).await;
    let http = support::http::Http::new(&k.url);
    let list = |i: usize| {
        format!("/api/v1/namespaces/{NS}/configmaps?fieldSelector=metadata.name%3Dcm{i}")
    };
    // Three names listed one by one, below coalesce_min_names: a name key each, held.
    for i in 0..3 {
        let (code, body) = http.get_admin(&list(i)).await;
        assert_eq!(code, 200, "{body:#}");
    }
    assert_eq!(name_keys(&k).await, 3, "{:#}", k.debug_keys().await);
    // A fourth name's watch coalesces the namespace.
    let _watch = http.watch_ok(&format!("{}&watch=1", list(3))).await;
    coalesced_into_one_watch(
        &k,
        Duration::from_secs(30),
        "the held name keys stopped well within their hold",
    )
    .await;
    // The reads go on from the namespace key, which holds them now.
    let info = k
        .key_info(&format!("/api/v1/namespaces/{NS}/configmaps"))
        .await
        .expect("namespace key");
    let served = support::kcache::covering(&info);
    for i in 0..3 {
        let want = format!("/api/v1/namespaces/{NS}/configmaps/cm{i} coalesced");
        assert!(served.contains(&want), "{want} not in {served:?}");
    }
    let (code, body) = http.get_admin(&list(1)).await;
    assert_eq!(code, 200);
    assert_eq!(body["items"][0]["metadata"]["name"], "cm1", "{body:#}");
}

/// A watch whose client leaves while its request waits for its namespace group to be
/// decided leaves nothing behind: the reference is taken only after the wait, by a request
/// still there (a leaked reference would keep its name key and upstream watch for good).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_abandoned_while_its_group_is_decided_leaves_no_reference() {
    let (_cluster, k, api) =
        namespace_through_kcache("[cache]\ncoalesce_min_names = 4\ncoalesce_fraction = 0.3\n")
            .await;
    create_objects(&api).await;
    // HTTP/1.1, whose server drops a request's handler when its connection closes (an
    // HTTP/2 stream reset leaves actix-http's handler running to its end), on a connection
    // already open and authenticated, so the watch reaches the registry at once.
    let client = support::insecure_http1();
    let warm = client
        .get(format!("{}/version", k.url))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .expect("get");
    assert_eq!(warm.status().as_u16(), 200);
    // A lone first request of another name waits (count and gathering window, 100 ms at
    // least); its client gives up after 20 ms, closing the connection.
    let url = format!(
        "{}/api/v1/namespaces/{NS}/configmaps?watch=1&fieldSelector=metadata.name%3Dcm0",
        k.url
    );
    let gave_up = client
        .get(&url)
        .bearer_auth(ADMIN_TOKEN)
        .timeout(Duration::from_millis(20))
        .send()
        .await;
    assert!(
        gave_up.is_err(),
        "the watch answered within 20 ms: {gave_up:?}"
    );
    // The group was counted for it ...
    eventually("the group counted", Duration::from_secs(10), || async {
        k.debug_keys().await["groups"]
            .as_array()
            .is_some_and(|g| g.iter().any(|g| g["objects"].as_u64().is_some()))
    })
    .await;
    // ... and no key holds a reference for the request that left.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let keys = k.debug_keys().await;
    let held: Vec<&Value> = keys["keys"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|k| {
            k["refcount"].as_u64() != Some(0)
                && k["key"].as_str().is_some_and(|k| k.ends_with("/cm0"))
        })
        .collect();
    assert!(held.is_empty(), "references left: {keys:#}");
    assert_eq!(
        support::prom::sum(
            &k.metrics_text().await,
            "kcache_keys_started_total",
            &[("scope", "name")]
        ),
        0.0
    );
}

/// A watcher moved from a quiet name key onto its coalesced namespace key is not replayed
/// from where the name key last heard anything — that lies before the namespace key's
/// list whenever the cluster wrote anything else meanwhile, and a replay from before a
/// key's list needs the API server's (a window backfill: one per key at a time, each up to
/// seconds; at a million watches 729 of them missed their deadline and ended in 410,
/// issue 31.2). Its object at the same RV on both keys shows nothing happened to it
/// since: it starts at the namespace key's progress, and its next event is the next write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_moved_watcher_whose_object_did_not_change_needs_no_replay() {
    let (cluster, k, api) =
        namespace_through_kcache("[cache]\ncoalesce_min_names = 4\ncoalesce_fraction = 0.3\n")
            .await;
    create_objects(&api).await;
    // Three names: below coalesce_min_names, three name keys, each listed now.
    let mut watches = watches_of(&k, [0, 1, 2]).await;
    for w in &mut watches {
        let added = events_until_quiet(w, Duration::from_secs(1)).await;
        assert_eq!(added.len(), 1, "{added:?}");
    }
    eventually("three name keys", Duration::from_secs(10), || async {
        name_keys(&k).await == 3
    })
    .await;
    // The cluster moves on: a write the name keys do not see, so their progress stays
    // behind every later list.
    support::http::put_secret(&cluster.kube_client().await, NS, "elsewhere", "x").await;
    // A fourth name coalesces the namespace; its key lists after that write, and the three
    // watchers move onto it.
    let _fourth = watches_of(&k, [3]).await;
    coalesced_into_one_watch(&k, Duration::from_secs(30), "the name keys stopped").await;
    let text = k.metrics_text().await;
    let sum = |name: &str, labels: &[(&str, &str)]| support::prom::sum(&text, name, labels);
    assert_eq!(
        sum("kcache_coalesce_moved_watchers_total", &[]),
        3.0,
        "{text}"
    );
    assert_eq!(sum("kcache_window_backfills_total", &[]), 0.0, "{text}");
    // Unchanged, unless an upstream bookmark (about one a minute) moved a name key past
    // the namespace key's list meanwhile: then there was nothing to replay either.
    let unchanged = sum("kcache_moved_watch_starts_total", &[("start", "unchanged")]);
    let from_rv = sum("kcache_moved_watch_starts_total", &[("start", "from_rv")]);
    assert_eq!(
        (unchanged + from_rv, unchanged > 0.0),
        (3.0, true),
        "{text}"
    );
    // Each moved watch goes on with its next write: nothing replayed, nothing missed.
    for (i, w) in watches.iter_mut().enumerate() {
        let rv = write_after(&api, &format!("cm{i}"), "moved").await;
        let seen = events_until_quiet(w, Duration::from_secs(2)).await;
        assert_eq!(seen, vec![format!("MODIFIED {NS}/cm{i}@{rv}")]);
    }
}
