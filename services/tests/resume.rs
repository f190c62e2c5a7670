//! Resume without a snapshot (issue 30.2): with `[nats] retain`, each published key's
//! events are kept in a JetStream stream, and a subscriber that comes back with its last
//! position replays what it missed from there — judged against the resourceVersions the
//! API server gave the writes. Beyond retention it falls back to a snapshot; a sealed
//! kind stays sealed at rest; a malformed resume request gets a clear end, and one whose
//! reply is outside the key's reply space (or that names no key) gets nothing, counted.

mod support;

use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kcache_actors::core::seal::Keyring;
use kcache_actors::core::sign::Verifier;
use kcache_subscriber::{follow, Options, Position, Subscription, Update};
use kube::api::{Patch, PatchParams, PostParams};

use support::kcache::Kcache;
use support::nats::{fleet_signer, fleet_toml, Nats};
use support::{eventually, TestCluster};

const NS: &str = "resume";
const STREAM: &str = "KCACHE_EVENTS";

fn verifier() -> Arc<Verifier> {
    let public = fleet_signer().public_key().to_vec();
    Arc::new(Verifier::new(vec![public]).expect("verifier"))
}

fn options(key: &str) -> Options {
    let mut o = Options::new("kcache", key);
    o.verifier = Some(verifier());
    o
}

/// A replica retaining events, declaring `resource` of the namespace, synced and owning it.
async fn start(cluster: &TestCluster, nats: &Nats, retain: &str, resource: &str) -> Kcache {
    let toml = format!(
        "{}\n[[publish]]\nversion = \"v1\"\nresource = \"{resource}\"\nnamespace = \"{NS}\"\n",
        fleet_toml(
            cluster.dir_path(),
            nats,
            &format!("retain = true\n{retain}")
        )
    );
    let k = Kcache::start_with_args(cluster, &toml, &["--replica-id", "a"]).await;
    let key = format!("/api/v1/namespaces/{NS}/{resource}");
    eventually(
        "the declared key is synced and owned",
        Duration::from_secs(30),
        || async {
            k.key_info(&key)
                .await
                .is_some_and(|i| i["synced"] == true && i["role"] == "owner")
        },
    )
    .await;
    k
}

async fn next(sub: &mut Subscription) -> Update {
    tokio::time::timeout(Duration::from_secs(20), sub.next())
        .await
        .expect("an update within 20 s")
        .expect("the subscription ended")
}

/// Updates until a snapshot (or `Resumed`), skipping progress.
async fn until_synced(sub: &mut Subscription) -> Update {
    loop {
        match next(sub).await {
            u @ (Update::Snapshot { .. } | Update::Resumed { .. }) => return u,
            Update::Refused(why) => panic!("a message was refused: {why}"),
            _ => {}
        }
    }
}

/// Writes `n` updates of one ConfigMap, ~20 a second; the resourceVersions it was given.
async fn write(api: &kube::Api<ConfigMap>, from: usize, n: usize) -> Vec<String> {
    let mut rvs = Vec::new();
    for i in from..from + n {
        let patch = serde_json::json!({"data": {"i": i.to_string()}});
        let cm = api
            .patch("counter", &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .expect("patch the ConfigMap");
        rvs.push(cm.metadata.resource_version.expect("an rv"));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    rvs
}

/// The events a subscriber receives until it has seen `want` of them (rv, replayed),
/// failing on a snapshot or a refused message.
async fn events(sub: &mut Subscription, want: usize) -> Vec<(String, bool)> {
    let mut got = Vec::new();
    // Heartbeats keep `next` from timing out: the whole wait is bounded too.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while got.len() < want {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{want} events not seen within 60 s: {got:?}"
        );
        match next(sub).await {
            Update::Event { line, replayed, .. } => {
                let ev: serde_json::Value = serde_json::from_slice(&line).expect("an event line");
                let rv = ev["object"]["metadata"]["resourceVersion"]
                    .as_str()
                    .expect("rv")
                    .to_string();
                got.push((rv, replayed));
            }
            Update::Progress { .. } => {}
            other => panic!("expected only events, got {other:?} after {got:?}"),
        }
    }
    got
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscriber_that_was_away_replays_what_it_missed_and_takes_no_snapshot() {
    let cluster = TestCluster::start().await;
    let nats = Nats::start(cluster.dir_path());
    let admin = cluster.kube_client().await;
    support::create_namespace(&admin, NS).await;
    let api: kube::Api<ConfigMap> = kube::Api::namespaced(admin, NS);
    let cm: ConfigMap =
        serde_json::from_value(serde_json::json!({"metadata": {"name": "counter"}}))
            .expect("configmap");
    api.create(&PostParams::default(), &cm)
        .await
        .expect("create");
    let _k = start(&cluster, &nats, "", "configmaps").await;
    let key = format!("_.v1.configmaps.{NS}.all._");

    // Live: a snapshot, then the first writes.
    let client = nats.client().await;
    let mut sub = follow(client.clone(), options(&key), None)
        .await
        .expect("follow");
    assert!(matches!(
        until_synced(&mut sub).await,
        Update::Snapshot { .. }
    ));
    let first = write(&api, 0, 10).await;
    let mut position = None;
    let mut seen = Vec::new();
    while seen.len() < first.len() {
        let u = next(&mut sub).await;
        position = u.position().or(position);
        if let Update::Event { line, .. } = u {
            let ev: serde_json::Value = serde_json::from_slice(&line).expect("line");
            seen.push(ev["object"]["metadata"]["resourceVersion"].to_string());
        }
    }
    let position: Position = position.expect("a position");
    drop(sub);

    // Away while 40 writes happen.
    let missed = write(&api, 10, 40).await;

    // Back from the kept position: the 40 from the log, then live ones, nothing twice.
    let mut sub = follow(client.clone(), options(&key), Some(position))
        .await
        .expect("follow again");
    // The log's events come first, then word that the position held.
    let replayed = events(&mut sub, missed.len()).await;
    assert_eq!(
        replayed,
        missed
            .iter()
            .map(|rv| (rv.clone(), true))
            .collect::<Vec<_>>(),
        "the missed writes, in order, from the log"
    );
    loop {
        match next(&mut sub).await {
            Update::Resumed { replayed } => {
                assert_eq!(replayed, 40, "events replayed");
                break;
            }
            Update::Progress { .. } => {}
            other => panic!("expected the resume's end, got {other:?}"),
        }
    }
    let live = write(&api, 50, 10).await;
    let after = events(&mut sub, live.len()).await;
    assert_eq!(
        after,
        live.iter()
            .map(|rv| (rv.clone(), false))
            .collect::<Vec<_>>(),
        "then the live writes"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn beyond_retention_a_subscriber_takes_a_snapshot_and_sealed_events_stay_sealed_at_rest() {
    let cluster = TestCluster::start().await;
    let nats = Nats::start(cluster.dir_path());
    let admin = cluster.kube_client().await;
    support::create_namespace(&admin, NS).await;
    let api: kube::Api<Secret> = kube::Api::namespaced(admin, NS);
    let secret: Secret = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "s"},
        "stringData": {"password": "plaintext-at-rest-0"},
    }))
    .expect("secret");
    api.create(&PostParams::default(), &secret)
        .await
        .expect("create");
    let _k = start(&cluster, &nats, "retain_max_msgs_per_key = 5\n", "secrets").await;
    let key = format!("_.v1.secrets.{NS}.all._");
    let mut opts = options(&key);
    let sealing = base64::engine::general_purpose::STANDARD
        .decode("a2NhY2hlLXRlc3Qta2V5LTMyLWJ5dGVzLWxvbmchISE=")
        .expect("key");
    opts.keyring = Some(Arc::new(
        Keyring::new(vec![("k1".into(), sealing)], "k1").expect("keyring"),
    ));
    let client = nats.client().await;
    let mut sub = follow(client.clone(), opts.clone(), None)
        .await
        .expect("follow");
    let Update::Snapshot { stamp, .. } = until_synced(&mut sub).await else {
        panic!("expected a snapshot")
    };
    let position = Position {
        epoch: stamp.epoch,
        seq: stamp.seq,
    };
    drop(sub);

    // Twenty writes while away: more than the five the log keeps of this key.
    let mut last = String::new();
    for i in 1..=20 {
        let patch =
            serde_json::json!({"stringData": {"password": format!("plaintext-at-rest-{i}")}});
        let s = api
            .patch("s", &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .expect("patch");
        last = s.metadata.resource_version.expect("rv");
    }
    // The log holds the last five, sealed: no password in any stored message.
    let js = async_nats::jetstream::new(client.clone());
    let stream_subject = format!("kcache.log.{key}");
    eventually(
        "the log holds the key's last five events",
        Duration::from_secs(20),
        || {
            let js = js.clone();
            async move {
                match js.get_stream(STREAM).await {
                    Ok(mut stream) => stream.info().await.is_ok_and(|i| i.state.messages == 5),
                    Err(_) => false,
                }
            }
        },
    )
    .await;
    let stream = js.get_stream(STREAM).await.expect("stream");
    let consumer = stream
        .create_consumer(async_nats::jetstream::consumer::pull::OrderedConfig {
            filter_subject: stream_subject.clone(),
            ..Default::default()
        })
        .await
        .expect("consumer");
    let mut stored = consumer.messages().await.expect("messages");
    for _ in 0..5 {
        let m = tokio::time::timeout(Duration::from_secs(10), stored.next())
            .await
            .expect("a stored message")
            .expect("not ended")
            .expect("a message");
        let body = String::from_utf8_lossy(&m.payload);
        assert!(
            !body.contains("plaintext-at-rest"),
            "stored in the clear: {body}"
        );
        let encoded = base64::engine::general_purpose::STANDARD.encode("plaintext-at-rest");
        assert!(
            !body.contains(&encoded[..16]),
            "stored in the clear: {body}"
        );
        assert!(
            m.headers
                .as_ref()
                .and_then(|h| h.get("Kcache-Key-Id"))
                .is_some(),
            "a stored message without its seal's key id"
        );
    }

    // Back: the log starts past the position, so the subscriber takes a snapshot, which
    // holds the last write.
    let mut sub = follow(client, opts, Some(position))
        .await
        .expect("follow again");
    loop {
        match next(&mut sub).await {
            Update::Snapshot { list, .. } => {
                let list: serde_json::Value = serde_json::from_slice(&list).expect("list");
                assert_eq!(
                    list["items"][0]["metadata"]["resourceVersion"],
                    last.as_str()
                );
                break;
            }
            Update::Event { .. } => panic!("an event applied across retention's edge"),
            Update::Resumed { .. } => panic!("resumed across retention's edge"),
            Update::Refused(why) => panic!("refused: {why}"),
            _ => {}
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_resume_requests_get_a_clear_end_or_nothing_and_are_counted() {
    let cluster = TestCluster::start().await;
    let nats = Nats::start(cluster.dir_path());
    let admin = cluster.kube_client().await;
    support::create_namespace(&admin, NS).await;
    let k = start(&cluster, &nats, "", "configmaps").await;
    let key = format!("_.v1.configmaps.{NS}.all._");
    let client = nats.client().await;
    let mut replies = client
        .subscribe(format!("kcache.reply.{key}.badasker.*"))
        .await
        .expect("subscribe");
    // Everything published anywhere but the asker's own reply space: must stay empty.
    let mut elsewhere = client
        .subscribe(format!("kcache.ev.{key}"))
        .await
        .expect("subscribe");
    client.flush().await.expect("flush");
    let refused = || async {
        support::prom::sum(
            &k.metrics_text().await,
            "kcache_nats_resumes_total",
            &[("result", "refused")],
        )
    };
    let before = refused().await;

    // A body that is not a position: an end marker saying so.
    client
        .publish_with_reply(
            format!("kcache.resume.{key}"),
            format!("kcache.reply.{key}.badasker.1"),
            "not json".into(),
        )
        .await
        .expect("publish");
    let answer = tokio::time::timeout(Duration::from_secs(10), replies.next())
        .await
        .expect("an answer within 10 s")
        .expect("subscribed");
    let why = answer
        .headers
        .as_ref()
        .and_then(|h| h.get("Kcache-Resume-Error"))
        .map(|v| v.to_string())
        .unwrap_or_default();
    assert!(why.contains("epoch"), "{answer:?}");

    // A reply subject outside the key's reply space (an event subject, another key's
    // replies): answered nowhere.
    for reply in [
        format!("kcache.ev.{key}"),
        "kcache.reply._.v1.configmaps.other.all._.x.1".to_string(),
        "_INBOX.stolen".to_string(),
    ] {
        client
            .publish_with_reply(
                format!("kcache.resume.{key}"),
                reply,
                r#"{"epoch":1,"seq":0}"#.into(),
            )
            .await
            .expect("publish");
    }
    // A request naming no key.
    client
        .publish_with_reply(
            "kcache.resume.not-a-key",
            format!("kcache.reply.{key}.badasker.2"),
            r#"{"epoch":1,"seq":0}"#.into(),
        )
        .await
        .expect("publish");
    client.flush().await.expect("flush");
    eventually(
        "five refused resume requests counted",
        Duration::from_secs(10),
        || async { refused().await >= before + 5.0 },
    )
    .await;
    let stray = tokio::time::timeout(Duration::from_millis(500), replies.next()).await;
    assert!(
        stray.is_err(),
        "an answer to a request naming no key: {stray:?}"
    );
    while let Ok(Some(m)) = tokio::time::timeout(Duration::from_millis(200), elsewhere.next()).await
    {
        let kind = m
            .headers
            .as_ref()
            .and_then(|h| h.get("Kcache-Type"))
            .map(|v| v.to_string());
        assert!(
            kind.as_deref() == Some("heartbeat") || kind.as_deref() == Some("event"),
            "a resume answer published on the event subject: {m:?}"
        );
    }
}
