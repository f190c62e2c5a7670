//! The NATS permissions docs/nats.md documents, proven on a real nats-server configured
//! with exactly that `authorization` block: kcache replicas work under theirs, and a
//! reader of one namespace gets that namespace's events and snapshot replies and nothing
//! else — no other namespace, no `_INBOX.>`, no publishing events, and no way to make an
//! owner publish onto a lease or event subject through a snapshot request's reply.

mod support;

use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kcache_subscriber::{follow, Options, Update};
use serde_json::{json, Value};
use support::kcache::Kcache;
use support::nats_conf::{replica_toml, ConfNats};
use support::{eventually, TestCluster, ADMIN_TOKEN};

/// The `authorization { … }` block of docs/nats.md, passwords filled in.
fn documented_authorization() -> String {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/nats.md"))
        .expect("docs/nats.md");
    let start = doc
        .find("authorization {")
        .expect("docs/nats.md has an authorization block");
    let end = start
        + doc[start..]
            .find("\n```")
            .expect("the authorization block ends its code fence");
    doc[start..end]
        // An observer of everything, for the test's own eyes only.
        .replacen(
            "users = [",
            "users = [\n    {user: observer, password: \"observer-pw\"}",
            1,
        )
        .replace("$KCACHE_PW", "\"kcache-pw\"")
        .replace("$READER_PW", "\"reader-pw\"")
}

async fn connect(nats: &ConfNats, user: &str, password: &str) -> async_nats::Client {
    async_nats::ConnectOptions::new()
        .user_and_password(user.into(), password.into())
        .connect(nats.url())
        .await
        .expect("connect to nats-server")
}

/// Messages a subscription receives within `wait`.
async fn drain(sub: &mut async_nats::Subscriber, wait: Duration) -> Vec<async_nats::Message> {
    let mut got = Vec::new();
    let deadline = tokio::time::Instant::now() + wait;
    while let Ok(Some(m)) = tokio::time::timeout_at(deadline, sub.next()).await {
        got.push(m);
    }
    got
}

/// Snapshot requests the replica refused for their reply subject.
async fn rejected(k: &Kcache) -> f64 {
    support::prom::sum_samples_with_label(
        &k.metrics_text().await,
        "kcache_fleet_rejected_messages_total",
        "reason",
        "reply-subject",
    )
}

fn watch_url(k: &Kcache, ns: &str) -> String {
    format!(
        "{}/api/v1/namespaces/{ns}/configmaps?watch=1&resourceVersion=0",
        k.url
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn documented_permissions_scope_a_reader_to_its_namespace() {
    let cluster = TestCluster::start().await;
    let d = cluster.dir_path();
    let nats = ConfNats::start(d, "nats-perms", &documented_authorization());
    let toml = replica_toml(
        d,
        &nats.url(),
        "user = \"kcache\"\npassword = \"kcache-pw\"\nencrypt_resources = []\nretain = true",
    );
    let a = Kcache::start_with_args(&cluster, &toml, &["--replica-id", "a"]).await;
    let b = Kcache::start_with_args(&cluster, &toml, &["--replica-id", "b"]).await;
    let admin = cluster.kube_client().await;
    for ns in ["team-a", "team-b"] {
        support::create_namespace(&admin, ns).await;
    }
    let http = support::insecure_http();
    // Watches on a first (so it owns both keys), then on b (a mirror of both).
    let mut holds = Vec::new();
    for (k, want) in [(&a, "owner"), (&b, "mirror")] {
        for ns in ["team-a", "team-b"] {
            let resp = http
                .get(watch_url(k, ns))
                .bearer_auth(ADMIN_TOKEN)
                .send()
                .await
                .expect("watch");
            assert_eq!(resp.status().as_u16(), 200);
            holds.push(tokio::spawn(support::for_each_event(resp, |_| true)));
        }
        for ns in ["team-a", "team-b"] {
            let key = format!("/api/v1/namespaces/{ns}/configmaps");
            eventually(
                &format!("{want} of {key}"),
                Duration::from_secs(30),
                || async { k.role(&key).await == want },
            )
            .await;
        }
    }

    let reader = connect(&nats, "team-a-reader", "reader-pw").await;
    let team_a = "_.v1.configmaps.team-a.all._";
    let team_b = "_.v1.configmaps.team-b.all._";
    let mut own_events = reader
        .subscribe(format!("kcache.ev.{team_a}"))
        .await
        .expect("subscribe");
    // Refused by the server (a permissions violation): these receive nothing.
    let mut other_events = reader
        .subscribe(format!("kcache.ev.{team_b}"))
        .await
        .expect("subscribe");
    let mut inboxes = reader.subscribe("_INBOX.>").await.expect("subscribe");
    let mut kcache_inbox = reader
        .subscribe("_KCACHE_INBOX.>")
        .await
        .expect("subscribe");
    let mut replies = reader
        .subscribe(format!("kcache.reply.{team_a}.r3ader.*"))
        .await
        .expect("subscribe");
    reader.flush().await.expect("flush");

    // Writes in both namespaces; the reader sees team-a's events only.
    let cms = |ns: &str| kube::Api::<ConfigMap>::namespaced(admin.clone(), ns);
    for ns in ["team-a", "team-b"] {
        let cm: ConfigMap = serde_json::from_value(json!({
            "metadata": {"name": "cm"}, "data": {"who": ns}
        }))
        .expect("configmap");
        cms(ns)
            .create(&Default::default(), &cm)
            .await
            .expect("create");
    }
    let got = drain(&mut own_events, Duration::from_secs(3)).await;
    let events: Vec<&async_nats::Message> = got
        .iter()
        .filter(|m| {
            m.headers
                .as_ref()
                .and_then(|h| h.get("Kcache-Type"))
                .is_some_and(|t| t.as_str() == "event")
        })
        .collect();
    assert!(
        events
            .iter()
            .any(|m| String::from_utf8_lossy(&m.payload).contains("\"who\":\"team-a\"")),
        "the reader got team-a's ADDED event: {got:?}"
    );
    assert!(drain(&mut other_events, Duration::from_millis(500))
        .await
        .is_empty());

    // A snapshot request answered into the key's reply space reaches the reader.
    let reply = format!("kcache.reply.{team_a}.r3ader.1");
    reader
        .publish_with_reply(format!("kcache.snap.{team_a}"), reply, Bytes::from("{}"))
        .await
        .expect("request");
    let answer = drain(&mut replies, Duration::from_secs(3)).await;
    assert!(
        answer
            .iter()
            .any(|m| String::from_utf8_lossy(&m.payload).contains("\"who\":\"team-a\"")),
        "the reader got team-a's snapshot: {answer:?}"
    );

    // A snapshot request whose reply names a lease, an event subject, another key's
    // replies or an inbox: the owner answers none of them.
    let before = rejected(&a).await;
    let observer = connect(&nats, "observer", "observer-pw").await;
    let mut lease_writes = observer
        .subscribe(format!("$KV.kcache-leases.{team_a}"))
        .await
        .expect("subscribe");
    let mut forged_events = observer
        .subscribe(format!("kcache.ev.{team_a}"))
        .await
        .expect("subscribe");
    let mut other_replies = observer
        .subscribe(format!("kcache.reply.{team_b}.>"))
        .await
        .expect("subscribe");
    observer.flush().await.expect("flush");
    for reply in [
        format!("$KV.kcache-leases.{team_a}"),
        format!("kcache.ev.{team_a}"),
        format!("kcache.reply.{team_b}.x.1"),
        "_INBOX.stolen".to_string(),
    ] {
        reader
            .publish_with_reply(format!("kcache.snap.{team_a}"), reply, Bytes::from("{}"))
            .await
            .expect("request");
    }
    reader.flush().await.expect("flush");
    eventually(
        "the owner refused four reply subjects",
        Duration::from_secs(10),
        || async { rejected(&a).await >= before + 4.0 },
    )
    .await;
    // The lease subject sees the owner's renewals only (their body: its replica id).
    for m in drain(&mut lease_writes, Duration::from_millis(500)).await {
        assert_eq!(m.payload, Bytes::from_static(b"a"), "{m:?}");
    }
    assert!(drain(&mut other_replies, Duration::from_millis(100))
        .await
        .is_empty());
    // Only the owner's own heartbeats and events on the event subject: no snapshot.
    for m in drain(&mut forged_events, Duration::from_millis(100)).await {
        let kind = m.headers.as_ref().and_then(|h| h.get("Kcache-Type"));
        assert!(
            kind.is_some_and(|t| t.as_str() == "event" || t.as_str() == "heartbeat"),
            "{m:?}"
        );
    }
    assert!(drain(&mut inboxes, Duration::from_millis(100))
        .await
        .is_empty());
    assert!(drain(&mut kcache_inbox, Duration::from_millis(100))
        .await
        .is_empty());

    // The reader cannot publish an event: nats-server refuses it, so no replica serves it.
    let forged = json!({"type": "ADDED", "object": {"kind": "ConfigMap", "apiVersion": "v1",
        "metadata": {"name": "forged", "namespace": "team-a", "resourceVersion": "999999999"}}});
    let mut headers = async_nats::HeaderMap::new();
    for (k, v) in [
        ("Kcache-Type", "event"),
        ("Kcache-Epoch", "999999"),
        ("Kcache-Seq", "1"),
        ("Kcache-Rv", "999999999"),
        ("Kcache-Owner", "x"),
    ] {
        headers.insert(k, v);
    }
    reader
        .publish_with_headers(
            format!("kcache.ev.{team_a}"),
            headers,
            Bytes::from(format!("{forged}\n")),
        )
        .await
        .expect("publish");
    reader.flush().await.expect("flush");
    tokio::time::sleep(Duration::from_secs(1)).await;
    let list: Value = http
        .get(format!("{}/api/v1/namespaces/team-a/configmaps", b.url))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .expect("list")
        .json()
        .await
        .expect("list body");
    let names: Vec<&str> = list["items"]
        .as_array()
        .expect("items")
        .iter()
        .filter_map(|i| i["metadata"]["name"].as_str())
        .collect();
    assert_eq!(names, ["cm"], "{list}");
    let log = nats.log();
    for violation in [
        "Subscription Violation - User \"team-a-reader\", Subject \"kcache.ev._.v1.configmaps.team-b",
        "Subscription Violation - User \"team-a-reader\", Subject \"_INBOX.>\"",
        "Subscription Violation - User \"team-a-reader\", Subject \"_KCACHE_INBOX.>\"",
        "Publish Violation - User \"team-a-reader\", Subject \"kcache.ev._.v1.configmaps.team-a",
    ] {
        assert!(
            log.contains(violation),
            "nats-server refused {violation:?}:\n{log}"
        );
    }

    // Resume (issue 30.2): a replica replays team-a's retained events into the key's reply
    // space for the reader, who holds no JetStream permission at all — a consumer of its
    // own could deliver anywhere — and is refused one, even on its own key's log.
    let resumer = connect(&nats, "team-a-reader", "reader-pw").await;
    let opts = Options::new("kcache", team_a);
    let mut sub = follow(resumer.clone(), opts.clone(), None)
        .await
        .expect("follow");
    let position = loop {
        let u = tokio::time::timeout(Duration::from_secs(20), sub.next())
            .await
            .expect("a snapshot within 20 s")
            .expect("following");
        if matches!(u, Update::Snapshot { .. }) {
            break u.position().expect("a snapshot's position");
        }
    };
    drop(sub);
    for i in 0..2 {
        let patch = json!({"data": {"i": i.to_string()}});
        cms("team-a")
            .patch("cm", &Default::default(), &kube::api::Patch::Merge(&patch))
            .await
            .expect("patch");
    }
    // The writes reach the log a moment after the API server took them (kcache's watch
    // hears of them, then publishes): a resume right away may find only the first there
    // (a CI run got 1 of 2). Resume again from the same position until both are.
    let mut from_log = (0, 0);
    for _ in 0..40 {
        let mut sub = follow(resumer.clone(), opts.clone(), Some(position))
            .await
            .expect("follow again");
        let mut replayed = 0;
        from_log = loop {
            match tokio::time::timeout(Duration::from_secs(20), sub.next())
                .await
                .expect("an update within 20 s")
                .expect("following")
            {
                Update::Event { replayed: true, .. } => replayed += 1,
                Update::Resumed { replayed: n } => break (n, replayed),
                Update::Progress { .. } => {}
                other => panic!("expected the log's events, got {other:?}"),
            }
        };
        assert_eq!(from_log.0, from_log.1, "the resume counts what it replayed");
        if from_log.0 >= 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert_eq!(from_log, (2, 2), "both writes from the log");
    let js = async_nats::jetstream::new(resumer);
    let stream = js
        .get_stream_no_info("KCACHE_EVENTS")
        .await
        .expect("the stream handle");
    let other = tokio::time::timeout(
        Duration::from_secs(10),
        stream.create_consumer(async_nats::jetstream::consumer::pull::OrderedConfig {
            name: Some("sneak".into()),
            filter_subject: format!("kcache.log.{team_a}"),
            ..Default::default()
        }),
    )
    .await;
    assert!(!matches!(other, Ok(Ok(_))), "the reader created a consumer");
    let violation = format!(
        "Publish Violation - User \"team-a-reader\", Subject \"$JS.API.CONSUMER.CREATE.KCACHE_EVENTS.sneak.kcache.log.{team_a}"
    );
    nats.wait_log(&violation, Duration::from_secs(10));
    for h in holds {
        h.abort();
    }
}
