//! Several replicas behind one NATS act as one cache: one upstream watch per key for the
//! whole fleet, and every replica's clients see every change, through owner crashes,
//! NATS crashes, late joiners and a paused owner. Real kube-apiserver, real nats-server
//! (killed and restarted on its port), real kcache processes; kube-rs as the judge.

mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use serde_json::{json, Value};
use support::judge::{random_ops, upstream_state, Judge};
use support::kcache::Kcache;
use support::nats::{fleet_toml, Nats};
use support::{eventually, TestCluster, ADMIN_TOKEN};

async fn replica(cluster: &TestCluster, nats: &Nats, id: &str, extra_nats: &str) -> Kcache {
    let toml = fleet_toml(cluster.dir_path(), nats, extra_nats);
    Kcache::start_with_args(cluster, &toml, &["--replica-id", id]).await
}

/// A replica with adaptive coalescing off, for a test that counts one upstream watch per
/// name key (coalescing across a fleet: services/tests/coalescing.rs).
async fn name_key_replica(cluster: &TestCluster, nats: &Nats, id: &str) -> Kcache {
    let toml = fleet_toml(cluster.dir_path(), nats, "").replacen(
        "[cache]\n",
        "[cache]\ncoalesce_min_names = 0\n",
        1,
    );
    assert!(toml.contains("coalesce_min_names = 0"), "{toml}");
    Kcache::start_with_args(cluster, &toml, &["--replica-id", id]).await
}

fn spawn_watch(
    http: reqwest::Client,
    url: String,
    f: impl FnMut(Value) -> bool + Send + 'static,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        // 1,200 watches open at once, each at first on its own TLS connection (the pool
        // has no HTTP/2 connection yet); a replica drops handshakes that outlast actix's
        // 3 s timeout when the machine is busy. Like client-go, retry a watch that got no
        // response at all.
        let mut attempt = 0;
        let resp = loop {
            match http.get(&url).bearer_auth(ADMIN_TOKEN).send().await {
                Ok(resp) => break resp,
                Err(e) if attempt < 5 && e.status().is_none() => {
                    attempt += 1;
                    tokio::time::sleep(Duration::from_millis(200 * attempt)).await;
                }
                Err(e) => panic!("watch {url}: {e}"),
            }
        };
        assert_eq!(resp.status().as_u16(), 200);
        support::for_each_event(resp, f).await;
    })
}

/// Every NATS message, headers and body, as one byte string each.
fn sniff(client: async_nats::Client) -> Arc<Mutex<Vec<Vec<u8>>>> {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let sink = seen.clone();
    tokio::spawn(async move {
        let Ok(mut sub) = client.subscribe(">").await else {
            return;
        };
        while let Some(msg) = sub.next().await {
            let mut bytes = format!("{} {:?} ", msg.subject, msg.headers).into_bytes();
            bytes.extend_from_slice(&msg.payload);
            sink.lock().expect("sniffed").push(bytes);
        }
    });
    seen
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_hold_one_upstream_watch_per_key_and_seal_secrets() {
    let cluster = TestCluster::start().await;
    let nats = Nats::start(cluster.dir_path());
    let sniffed = sniff(nats.client().await);
    let replicas = vec![
        name_key_replica(&cluster, &nats, "a").await,
        name_key_replica(&cluster, &nats, "b").await,
        name_key_replica(&cluster, &nats, "c").await,
    ];
    let admin = cluster.kube_client().await;
    support::create_namespace(&admin, "fleet").await;
    let secrets: kube::Api<Secret> = kube::Api::namespaced(admin.clone(), "fleet");
    for i in 0..100 {
        let s: Secret = serde_json::from_value(json!({
            "metadata": {"name": format!("s{i}"),
                         "annotations": {"note": format!("annotation-plaintext-{i}")}},
            "stringData": {"v": format!("secret-plaintext-{i}-0")},
        }))
        .expect("secret");
        secrets
            .create(&Default::default(), &s)
            .await
            .expect("create");
    }
    let baseline = cluster.upstream_watches("secrets").await;

    // 1,200 single-object watches: 12 per secret, 4 on each replica.
    let http = reqwest::Client::builder()
        .danger_accept_invalid_certs(true)
        .build()
        .expect("http");
    let added = Arc::new(AtomicUsize::new(0));
    let modified = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for i in 0..100 {
        for (r, k) in replicas.iter().enumerate() {
            for _ in 0..4 {
                let url = format!(
                    "{}/api/v1/namespaces/fleet/secrets?watch=1&resourceVersion=0&fieldSelector=metadata.name%3Ds{i}",
                    k.url
                );
                let (added, modified) = (added.clone(), modified.clone());
                let want = format!("s{i}");
                tasks.push(spawn_watch(http.clone(), url, move |ev| {
                    assert_eq!(
                        ev["object"]["metadata"]["name"],
                        want.as_str(),
                        "replica {r}"
                    );
                    match ev["type"].as_str() {
                        Some("ADDED") => added.fetch_add(1, Ordering::Relaxed),
                        Some("MODIFIED") => modified.fetch_add(1, Ordering::Relaxed),
                        _ => 0,
                    };
                    true
                }));
            }
        }
    }
    eventually(
        "1,200 watches got their object",
        Duration::from_secs(90),
        || {
            let added = added.clone();
            async move { added.load(Ordering::Relaxed) == 1200 }
        },
    )
    .await;
    eventually(
        "the fleet holds exactly 100 upstream watches",
        Duration::from_secs(30),
        || async {
            let mut total = 0.0;
            for k in &replicas {
                total += k.metric("kcache_upstream_watches").await;
            }
            total == 100.0
        },
    )
    .await;
    eventually(
        "the API server holds 100 more Secret watchers, not 300 or 1,200",
        Duration::from_secs(30),
        || async { cluster.upstream_watches("secrets").await == baseline + 100 },
    )
    .await;
    // Exactly one owner per key, and the owner sees the fleet's 12 references (interest
    // records travel every second).
    eventually(
        "one owner per key, seeing the fleet's 12 references",
        Duration::from_secs(30),
        || async {
            for i in 0..100 {
                let key = format!("/api/v1/namespaces/fleet/secrets/s{i}");
                let mut owners = Vec::new();
                for k in &replicas {
                    let Some(info) = k.key_info(&key).await else {
                        return false;
                    };
                    if info["role"] == "owner" {
                        owners.push(info);
                    }
                }
                let [owner] = owners.as_slice() else {
                    return false;
                };
                if owner["fleetRefcount"] != 12 || owner["epoch"].as_u64().unwrap_or(0) == 0 {
                    return false;
                }
            }
            true
        },
    )
    .await;

    support::update_secrets(&admin, "fleet", 100, |i| format!("secret-plaintext-{i}-1")).await;
    eventually(
        "every watch on every replica got the update",
        Duration::from_secs(60),
        || {
            let modified = modified.clone();
            async move { modified.load(Ordering::Relaxed) == 1200 }
        },
    )
    .await;
    for t in tasks {
        t.abort();
    }

    // A Secret with 1 MiB of data: its JSON (base64) is far above NATS' max_payload.
    let big_value = "x".repeat(1024 * 1024);
    let big: Secret = serde_json::from_value(json!({
        "metadata": {"name": "big"},
        "stringData": {"blob": big_value},
    }))
    .expect("big secret");
    secrets
        .create(&Default::default(), &big)
        .await
        .expect("create big");
    let big_rv = secrets
        .get("big")
        .await
        .expect("get big")
        .metadata
        .resource_version
        .unwrap_or_default();
    let mut watches = Vec::new();
    for k in &replicas {
        let url = format!(
            "{}/api/v1/namespaces/fleet/secrets?watch=1&resourceVersion=0&fieldSelector=metadata.name%3Dbig",
            k.url
        );
        let (tx, rx) = tokio::sync::oneshot::channel();
        let mut tx = Some(tx);
        watches.push((
            spawn_watch(http.clone(), url, move |ev| {
                if ev["type"] == "ADDED" || ev["type"] == "MODIFIED" {
                    if let Some(tx) = tx.take() {
                        let _ = tx.send(ev);
                    }
                }
                true
            }),
            rx,
        ));
    }
    let patch = json!({"metadata": {"annotations": {"touched": "annotation-plaintext-big"}}});
    secrets
        .patch("big", &Default::default(), &kube::api::Patch::Merge(&patch))
        .await
        .expect("touch big");
    for (r, (task, rx)) in watches.into_iter().enumerate() {
        let ev = tokio::time::timeout(Duration::from_secs(60), rx)
            .await
            .expect("the big secret arrives on every replica")
            .expect("event");
        let blob = ev["object"]["data"]["blob"].as_str().unwrap_or("");
        assert!(
            blob.len() > 1024 * 1024,
            "replica {r}: blob of {} bytes",
            blob.len()
        );
        assert!(ev["object"]["metadata"]["resourceVersion"].as_str() >= Some(big_rv.as_str()));
        task.abort();
    }
    // The fleet did carry the big secret over NATS (in chunks) — and sealed.
    let sniffed: Vec<Vec<u8>> = sniffed.lock().expect("sniffed").clone();
    assert!(sniffed.len() > 1000, "saw {} NATS messages", sniffed.len());
    assert!(
        sniffed.iter().any(|m| contains(m, b"Kcache-Chunk")),
        "no chunked message was published"
    );
    let b64 = |s: &str| {
        use base64::Engine;
        base64::engine::general_purpose::STANDARD.encode(s)
    };
    for m in sniffed.iter() {
        for needle in [
            b"secret-plaintext-1".to_vec(),
            b"annotation-plaintext-".to_vec(),
            b64("secret-plaintext-1").into_bytes(),
            b64("secret-plaintext-42-1").as_bytes()[..16].to_vec(),
            b"xxxxxxxxxxxxxxxx".to_vec(),
            b64("xxxxxxxxxxxx").into_bytes(),
        ] {
            assert!(
                !contains(m, &needle),
                "plaintext Secret bytes on NATS: {:?}",
                String::from_utf8_lossy(&m[..m.len().min(200)])
            );
        }
    }

    // No replica has interest any more: after the grace period (and the interest records'
    // expiry) the fleet's upstream watches stop.
    eventually(
        "the API server's Secret watchers are back to the baseline",
        Duration::from_secs(60),
        || async { cluster.upstream_watches("secrets").await == baseline },
    )
    .await;
}

/// Starts replicas `a` (owner of the ConfigMaps key of `ns`) and `b`, with a judge on `b`.
async fn owner_a_judge_on_b(
    cluster: &TestCluster,
    nats: &Nats,
    ns: &str,
    extra_nats: &str,
) -> (Kcache, Kcache, Judge, tokio::task::JoinHandle<()>) {
    let a = replica(cluster, nats, "a", extra_nats).await;
    let b = replica(cluster, nats, "b", extra_nats).await;
    let admin = cluster.kube_client().await;
    support::create_namespace(&admin, ns).await;
    let key = format!("/api/v1/namespaces/{ns}/configmaps");
    // A watch on `a` first, so `a` owns the key.
    let hold_a = spawn_watch(
        support::insecure_http(),
        format!(
            "{}/api/v1/namespaces/{ns}/configmaps?watch=1&resourceVersion=0",
            a.url
        ),
        |_| true,
    );
    eventually("a owns the key", Duration::from_secs(30), || async {
        a.role(&key).await == "owner"
    })
    .await;
    let judge = Judge::start(b.kube_client(ADMIN_TOKEN), ns);
    eventually("b mirrors the key", Duration::from_secs(30), || async {
        b.role(&key).await == "mirror"
    })
    .await;
    (a, b, judge, hold_a)
}

/// Every judge converges to the API server's state; `strict` ones never saw their watch
/// break (the fault was invisible to them), the others at most relisted.
async fn converge(judges: &[(&str, &Judge, bool)], upstream: &kube::Api<ConfigMap>) {
    let want = upstream_state(upstream).await;
    for (who, judge, strict) in judges {
        eventually(
            &format!("the reflector on {who} converges to the API server's state"),
            Duration::from_secs(90),
            || async { judge.state() == want },
        )
        .await;
        if *strict {
            judge.assert_clean(who);
        } else {
            judge.assert_consistent(who);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn owner_killed_then_a_late_replica_joins() {
    let cluster = TestCluster::start().await;
    let nats = Nats::start(cluster.dir_path());
    let (mut a, b, judge_b, hold_a) = owner_a_judge_on_b(&cluster, &nats, "kill", "").await;
    let admin = cluster.kube_client().await;
    let upstream: kube::Api<ConfigMap> = kube::Api::namespaced(admin, "kill");
    let key = "/api/v1/namespaces/kill/configmaps";

    // a's own clients leave; b's reflector still needs the key, so a keeps owning it past
    // its grace period (5 s) instead of handing it over.
    hold_a.abort();
    tokio::time::sleep(Duration::from_secs(9)).await;
    let info = a.key_info(key).await.expect("a still caches the key");
    assert_eq!(info["role"], "owner", "{info}");
    assert_eq!(info["refcount"], 0, "{info}");
    assert!(info["fleetRefcount"].as_u64() >= Some(1), "{info}");
    assert_eq!(a.metric("kcache_upstream_watches").await, 1.0);

    let writes = {
        let upstream = upstream.clone();
        tokio::spawn(async move { random_ops(&upstream, 300, Duration::from_millis(40)).await })
    };
    tokio::time::sleep(Duration::from_secs(3)).await;
    a.kill9();
    eventually("b takes the key over", Duration::from_secs(30), || async {
        b.role(key).await == "owner"
    })
    .await;
    let c = replica(&cluster, &nats, "c", "").await;
    let judge_c = Judge::start_cached(c.kube_client(ADMIN_TOKEN), "kill");
    writes.await.expect("writes");
    random_ops(&upstream, 30, Duration::ZERO).await;
    converge(&[("b", &judge_b, true), ("c", &judge_c, true)], &upstream).await;
    assert_eq!(c.role(key).await, "mirror");
    assert!(b.metric("kcache_fleet_ownership_changes_total").await >= 1.0);
}

/// A kube-rs client's list-then-watch on a replica that does not cache the key yet: its
/// list goes to the API server (kube-core sends no `resourceVersion=0` with a `limit`, so
/// even `any_semantic()` is a consistent read, which kcache proxies) at RV L; its watch from
/// L starts the key, which syncs from the owner's snapshot at a later RV when the key was
/// written in between. The watch is older than the young key's window: it is served from
/// the upstream's replay (`core::backfill`), as the API server would serve it, not a 410
/// (the late joiner's rare first-watch 410 before backfills).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_mirror_serves_a_watch_from_before_its_first_snapshot() {
    let cluster = TestCluster::start().await;
    let nats = Nats::start(cluster.dir_path());
    let a = replica(&cluster, &nats, "a", "").await;
    let admin = cluster.kube_client().await;
    support::create_namespace(&admin, "young").await;
    let key = "/api/v1/namespaces/young/configmaps";
    let _hold_a = spawn_watch(
        support::insecure_http(),
        format!("{}{key}?watch=1&resourceVersion=0", a.url),
        |_| true,
    );
    eventually("a owns the key", Duration::from_secs(30), || async {
        a.role(key).await == "owner"
    })
    .await;
    let api: kube::Api<ConfigMap> = kube::Api::namespaced(admin, "young");
    let cm = |name: &str| -> ConfigMap {
        serde_json::from_value(json!({"metadata": {"name": name}})).expect("a ConfigMap")
    };
    let pp = kube::api::PostParams::default();
    api.create(&pp, &cm("before")).await.expect("create");
    // The client's list, as kube-rs sends it: answered by the API server.
    let listed = api
        .list(&kube::api::ListParams::default())
        .await
        .expect("list");
    let from = listed.metadata.resource_version.expect("the list's RV");
    // A write after the list, which the owner has before the late replica asks it for
    // its snapshot.
    let after = api.create(&pp, &cm("after")).await.expect("create");
    let after_rv: u64 = after
        .metadata
        .resource_version
        .expect("an RV")
        .parse()
        .expect("a numeric RV");
    eventually("a has the write", Duration::from_secs(10), || async {
        a.key_info(key)
            .await
            .and_then(|i| i["resourceVersion"].as_str()?.parse::<u64>().ok())
            .is_some_and(|rv| rv >= after_rv)
    })
    .await;
    let c = replica(&cluster, &nats, "c", "").await;
    let resp = support::insecure_http()
        .get(format!(
            "{}{key}?watch=1&resourceVersion={from}&allowWatchBookmarks=true",
            c.url
        ))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .expect("watch");
    assert_eq!(resp.status().as_u16(), 200);
    let mut rx = support::event_channel(resp);
    let first = tokio::time::timeout(Duration::from_secs(20), rx.recv())
        .await
        .expect("an event within 20 s")
        .expect("the watch ended without an event");
    assert_eq!(first["type"], "ADDED", "{first}");
    assert_eq!(first["object"]["metadata"]["name"], "after", "{first}");
    assert_eq!(c.role(key).await, "mirror");
    assert_eq!(c.metric("kcache_watch_expired_total").await, 0.0);
    assert!(
        support::prom::sum_samples(
            &c.metrics_text().await,
            "kcache_window_backfills_total",
            Some("outcome=\"extended\"")
        ) >= 1.0,
        "the watch was not served by a backfill"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_killed_and_restarted_on_its_port() {
    let cluster = TestCluster::start().await;
    let mut nats = Nats::start(cluster.dir_path());
    // Mirrors fall back to their own upstream watch after 2 s without NATS.
    let (_a, b, judge_b, _hold) =
        owner_a_judge_on_b(&cluster, &nats, "natsdown", "fallback_after_ms = 2000").await;
    let admin = cluster.kube_client().await;
    let upstream: kube::Api<ConfigMap> = kube::Api::namespaced(admin, "natsdown");
    let key = "/api/v1/namespaces/natsdown/configmaps";

    let writes = {
        let upstream = upstream.clone();
        tokio::spawn(async move { random_ops(&upstream, 300, Duration::from_millis(40)).await })
    };
    tokio::time::sleep(Duration::from_secs(2)).await;
    nats.kill9();
    eventually(
        "b serves from its own upstream watch",
        Duration::from_secs(20),
        || async { b.role(key).await == "local" },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    nats.restart();
    eventually("b rejoins the fleet", Duration::from_secs(30), || async {
        matches!(b.role(key).await.as_str(), "mirror" | "owner")
    })
    .await;
    writes.await.expect("writes");
    random_ops(&upstream, 30, Duration::ZERO).await;
    converge(&[("b", &judge_b, true)], &upstream).await;
    assert!(b.metric("kcache_nats_reconnects_total").await >= 2.0);
}

/// The fleet refcount the owner of `key` sees, if one of `replicas` owns it.
async fn owners_refcount(replicas: &[&Kcache], key: &str) -> Option<u64> {
    for k in replicas {
        if let Some(info) = k.key_info(key).await {
            if info["role"] == "owner" {
                return info["fleetRefcount"].as_u64();
            }
        }
    }
    None
}

/// Fleet interest travels as changes: once the fleet has settled, a replica's interest
/// messages carry no records, however many keys it holds (they only say it is alive);
/// and when messages are lost with NATS, the fleet's refcounts still come right once it
/// is back (a replica that missed a message asks for the sender's table again). Issue
/// 31.5: every replica used to send every key and covered name every second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fleet_interest_travels_as_changes_and_heals_after_lost_messages() {
    let cluster = TestCluster::start().await;
    let mut nats = Nats::start(cluster.dir_path());
    let (a, b) = (
        name_key_replica(&cluster, &nats, "a").await,
        name_key_replica(&cluster, &nats, "b").await,
    );
    let admin = cluster.kube_client().await;
    support::create_namespace(&admin, "interest").await;
    let cms: kube::Api<ConfigMap> = kube::Api::namespaced(admin, "interest");
    const NAMES: usize = 20;
    for i in 0..NAMES {
        let cm: ConfigMap =
            serde_json::from_value(json!({"metadata": {"name": format!("cm{i}")}})).expect("cm");
        cms.create(&Default::default(), &cm).await.expect("create");
    }
    let http = reqwest::Client::builder()
        .danger_accept_invalid_certs(true)
        .build()
        .expect("http");
    let watch = |k: &Kcache, i: usize| {
        let url = format!(
            "{}/api/v1/namespaces/interest/configmaps?watch=1&resourceVersion=0&fieldSelector=metadata.name%3Dcm{i}",
            k.url
        );
        spawn_watch(http.clone(), url, |_| true)
    };
    // Every name once on a and twice on b.
    let (mut on_a, mut on_b, mut second_on_b) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..NAMES {
        on_a.push(watch(&a, i));
        on_b.push(watch(&b, i));
        second_on_b.push(watch(&b, i));
    }
    let key = |i: usize| format!("/api/v1/namespaces/interest/configmaps/cm{i}");
    let every_owner_sees = |n: u64| {
        let (a, b) = (&a, &b);
        move || async move {
            for i in 0..NAMES {
                if owners_refcount(&[a, b], &key(i)).await != Some(n) {
                    return false;
                }
            }
            true
        }
    };
    eventually(
        "each name's owner sees the fleet's 3 references",
        Duration::from_secs(60),
        every_owner_sees(3),
    )
    .await;

    // Settled: a few intervals of interest messages, none with a record.
    let heard = Arc::new(Mutex::new(Vec::new()));
    let mut sub = nats
        .client()
        .await
        .subscribe("kcache.interest.*")
        .await
        .expect("subscribe");
    let sink = heard.clone();
    let listen = tokio::spawn(async move {
        while let Some(msg) = sub.next().await {
            let body: Value = serde_json::from_slice(&msg.payload).expect("an interest body");
            sink.lock().expect("heard").push(body);
        }
    });
    tokio::time::sleep(Duration::from_secs(4)).await;
    listen.abort();
    let heard = heard.lock().expect("heard").clone();
    assert!(
        heard.len() >= 4,
        "2 replicas, one message a second: {heard:?}"
    );
    for m in &heard {
        assert!(m["seq"].is_u64() && m["epoch"].is_u64(), "{m}");
        assert!(
            m.get("full").is_none(),
            "a full table with nothing changed: {m}"
        );
        assert_eq!(m["keys"], json!([]), "{m}");
        assert_eq!(m["covered"], json!([]), "{m}");
    }

    // NATS dies; meanwhile b closes its second watch of every name, and the changes it
    // sends are lost or held back. Once NATS is back the owners see 2 references.
    nats.kill9();
    for w in second_on_b.drain(..) {
        w.abort();
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    nats.restart();
    eventually(
        "each name's owner sees the fleet's 2 references",
        Duration::from_secs(60),
        every_owner_sees(2),
    )
    .await;
    for w in on_a.into_iter().chain(on_b) {
        w.abort();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_owner_is_fenced_off() {
    let cluster = TestCluster::start().await;
    let nats = Nats::start(cluster.dir_path());
    let (a, b, judge_b, _hold) = owner_a_judge_on_b(&cluster, &nats, "pause", "").await;
    let c = replica(&cluster, &nats, "c", "").await;
    let judge_c = Judge::start_cached(c.kube_client(ADMIN_TOKEN), "pause");
    let admin = cluster.kube_client().await;
    let upstream: kube::Api<ConfigMap> = kube::Api::namespaced(admin, "pause");
    let key = "/api/v1/namespaces/pause/configmaps";
    eventually("c mirrors the key", Duration::from_secs(30), || async {
        c.role(key).await == "mirror"
    })
    .await;
    let epoch_a = a.key_info(key).await.expect("a's key")["epoch"]
        .as_u64()
        .unwrap_or(0);

    let writes = {
        let upstream = upstream.clone();
        tokio::spawn(async move { random_ops(&upstream, 400, Duration::from_millis(40)).await })
    };
    tokio::time::sleep(Duration::from_secs(2)).await;
    a.pause();
    let new_owner = Arc::new(Mutex::new(None));
    eventually(
        "b or c takes the key over from the paused owner",
        Duration::from_secs(30),
        || {
            let new_owner = new_owner.clone();
            let (b, c) = (&b, &c);
            async move {
                for (name, k) in [("b", b), ("c", c)] {
                    if k.role(key).await == "owner" {
                        *new_owner.lock().expect("owner") = Some(name);
                        return true;
                    }
                }
                false
            }
        },
    )
    .await;
    let (owner, mirror) = match *new_owner.lock().expect("owner") {
        Some("b") => (&b, &c),
        _ => (&c, &b),
    };
    let epoch = owner.key_info(key).await.expect("new owner's key")["epoch"]
        .as_u64()
        .unwrap_or(0);
    assert!(epoch > epoch_a, "epochs only grow: {epoch_a} then {epoch}");
    eventually(
        "the mirror follows the new owner",
        Duration::from_secs(20),
        || async { mirror.key_info(key).await.and_then(|i| i["epoch"].as_u64()) == Some(epoch) },
    )
    .await;
    // a wakes up believing it still owns the key: what it publishes is refused.
    a.resume();
    eventually(
        "a's late messages are rejected",
        Duration::from_secs(20),
        || async {
            mirror
                .metric("kcache_fleet_stale_epoch_rejected_total")
                .await
                > 0.0
        },
    )
    .await;
    eventually(
        "a steps down and follows the new owner",
        Duration::from_secs(20),
        || async { a.role(key).await == "mirror" },
    )
    .await;
    writes.await.expect("writes");
    random_ops(&upstream, 30, Duration::ZERO).await;
    converge(&[("b", &judge_b, true), ("c", &judge_c, false)], &upstream).await;
}

/// A publisher without the fleet's signing key (a NATS user allowed to publish on the
/// key's subject: a misconfigured account) forges events onto a mirrored key — unsigned,
/// signed with a key of its own, and a replica's signature over another body — and a
/// signing replica claims higher epochs the lease stream does not confirm (it holds no
/// lease; an epoch the stream has not reached). The mirror acts on none of them: they are
/// refused and counted, its clients never see the forged objects, and it keeps following
/// the owner.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mirror_acts_only_on_messages_its_fleet_signed() {
    use kcache_actors::core::sign::Signer;
    use kcache_actors::core::wire::{Frame, Kind, H_SIGNATURE};

    let cluster = TestCluster::start().await;
    let nats = Nats::start(cluster.dir_path());
    let (a, b, judge_b, _hold) = owner_a_judge_on_b(&cluster, &nats, "hostile", "").await;
    let key = "/api/v1/namespaces/hostile/configmaps";
    let token = "_.v1.configmaps.hostile.all._";
    let info = b.key_info(key).await.expect("b's key");
    let (epoch, seq) = (
        info["epoch"].as_u64().unwrap_or(0),
        info["seq"].as_u64().unwrap_or(0),
    );
    assert!(epoch > 0, "{info}");
    let rejected = |reason: &'static str| {
        let b = &b;
        async move {
            support::prom::sum_samples(
                &b.metrics_text().await,
                "kcache_fleet_rejected_messages_total",
                Some(&format!("reason=\"{reason}\"")),
            )
        }
    };
    let (unsigned_before, forged_before, unconfirmed_before) = (
        rejected("unsigned").await,
        rejected("forged").await,
        rejected("unconfirmed-epoch").await,
    );

    let hostile = nats.client().await;
    let stranger = Signer::from_seed(&[9; 32]).expect("seed");
    let fleet_key = support::nats::fleet_signer();
    let forged = |name: &str| {
        Bytes::from(format!(
            "{}\n",
            json!({"type": "ADDED", "object": {"kind": "ConfigMap", "apiVersion": "v1",
                "metadata": {"name": name, "namespace": "hostile", "uid": name,
                             "resourceVersion": "999999999"},
                "data": {"injected": "yes"}}})
        ))
    };
    for (i, name) in [
        "forged-unsigned",
        "forged-stranger",
        "forged-swapped",
        "forged-no-lease",
        "forged-future-epoch",
    ]
    .into_iter()
    .enumerate()
    {
        // Signed by the fleet's key, with an epoch the lease stream does not confirm.
        let (epoch, owner) = match name {
            "forged-no-lease" => (epoch + 1, "intruder"),
            "forged-future-epoch" => (epoch + 1_000_000, "a"),
            _ => (epoch, "a"),
        };
        let frame = Frame {
            kind: Kind::Event,
            epoch,
            seq: seq + 1 + i as u64,
            rv: 999_999_999,
            owner: owner.into(),
            chunk: None,
            key_id: None,
        };
        let body = forged(name);
        let ad = frame.associated_data(token);
        let signature = match name {
            "forged-unsigned" => None,
            "forged-stranger" => Some(stranger.sign(&[&ad, &body])),
            // The fleet's own key, over another body than the one sent.
            "forged-swapped" => Some(fleet_key.sign(&[&ad, b"{}\n"])),
            _ => Some(fleet_key.sign(&[&ad, &body])),
        };
        let mut headers = async_nats::HeaderMap::new();
        for (n, v) in frame.headers() {
            headers.insert(n, v.as_str());
        }
        if let Some(sig) = &signature {
            headers.insert(H_SIGNATURE, sig.as_str());
        }
        hostile
            .publish_with_headers(format!("kcache.ev.{token}"), headers, body)
            .await
            .expect("publish");
    }
    hostile.flush().await.expect("flush");
    eventually(
        "the mirror refused the five forged events",
        Duration::from_secs(20),
        || async {
            rejected("unsigned").await > unsigned_before
                && rejected("forged").await >= forged_before + 2.0
                && rejected("unconfirmed-epoch").await >= unconfirmed_before + 2.0
        },
    )
    .await;
    // The owner's events keep coming, and the mirror's clients see exactly the API
    // server's objects.
    let admin = cluster.kube_client().await;
    let upstream: kube::Api<ConfigMap> = kube::Api::namespaced(admin, "hostile");
    random_ops(&upstream, 30, Duration::from_millis(20)).await;
    converge(&[("b", &judge_b, false)], &upstream).await;
    let (code, list) = support::http::Http::new(&b.url)
        .get_admin("/api/v1/namespaces/hostile/configmaps?resourceVersion=0")
        .await;
    assert_eq!(code, 200, "{list}");
    let injected: Vec<&Value> = list["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|i| i["data"]["injected"] == "yes")
        .collect();
    assert!(injected.is_empty(), "forged objects served: {injected:?}");
    assert_eq!(a.role(key).await, "owner");
    // Still following a's epoch: the claimed ones fenced nobody off.
    let info = b.key_info(key).await.expect("b's key");
    assert_eq!(info["epoch"].as_u64(), Some(epoch), "{info}");
}
