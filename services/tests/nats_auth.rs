//! kcache's `[nats]` security settings against a real nats-server (JetStream on), real
//! kcache processes and a real kube-apiserver: mutual TLS with server verification
//! (`tls_ca_file`, `tls_cert_file`, `tls_key_file`), nkey authentication
//! (`nkey_seed_file`) and a JWT `.creds` file in operator mode (`creds_file`).
//!
//! Each test starts one nats-server configured for the mechanism, two replicas with good
//! credentials and one with wrong ones, and proves both sides:
//!
//! - the good replicas form a fleet: one owns the key (`owner` in /debug/keys), the other
//!   mirrors it (`mirror`, no upstream watch of its own, events received over NATS), and a
//!   ConfigMap written to the API server reaches a watch on the mirror;
//! - the replica with wrong credentials never joins (`kcache_nats_connected` 0, no
//!   connection ever made), still serves its clients from its own upstream watch (`local`
//!   after `fallback_after_ms`), logs the failed connection, and the server's log says
//!   why it refused it. kcache's own log names the cause for nkey and JWT refusals
//!   ("authorization violation") but not for a TLS one (see
//!   `mutual_tls_with_server_verification`).

mod support;

use std::path::Path;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ConfigMap;
use nkeys::KeyPair;
use serde_json::{json, Value};
use support::kcache::Kcache;
use support::nats_conf::{self, ConfNats, TestCa};
use support::prom::sum_samples;
use support::{eventually, TestCluster, ADMIN_TOKEN};
use tokio::sync::mpsc::UnboundedReceiver;

async fn replica(cluster: &TestCluster, toml: &str, id: &str) -> Kcache {
    Kcache::start_with_args(cluster, toml, &["--replica-id", id]).await
}

/// A watch of the ConfigMaps of `ns` on `k`, as admin; its events on a channel.
async fn watch(k: &Kcache, ns: &str) -> UnboundedReceiver<Value> {
    let resp = support::insecure_http()
        .get(format!(
            "{}/api/v1/namespaces/{ns}/configmaps?watch=1&resourceVersion=0",
            k.url
        ))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .expect("open a watch on kcache");
    assert_eq!(resp.status().as_u16(), 200, "watch on {}", k.url);
    support::event_channel(resp)
}

/// Waits for the `kind` event of ConfigMap `name` whose `data.v` is `v` on `rx`; panics
/// naming `who` after 20 s or when the watch ends.
async fn expect_event(
    rx: &mut UnboundedReceiver<Value>,
    who: &str,
    kind: &str,
    name: &str,
    v: &str,
) {
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut seen = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, rx.recv()).await {
            Ok(Some(ev)) => {
                if ev["type"] == kind
                    && ev["object"]["metadata"]["name"] == name
                    && ev["object"]["data"]["v"] == v
                {
                    return;
                }
                seen.push(format!(
                    "{} {}",
                    ev["type"], ev["object"]["metadata"]["name"]
                ));
            }
            Ok(None) => panic!("the watch on {who} ended before {kind} {name} v={v}; saw {seen:?}"),
            Err(_) => panic!("no {kind} {name} v={v} on {who}'s watch in 20 s; saw {seen:?}"),
        }
    }
}

/// The value of gauge `name` on a replica; panics when the replica does not export it
/// (an absent gauge must not pass for a 0).
async fn gauge(k: &Kcache, name: &str) -> f64 {
    let text = k.metrics_text().await;
    assert!(
        text.lines()
            .any(|l| l.split([' ', '{']).next() == Some(name)),
        "{name} is not on {}'s /metrics",
        k.url
    );
    sum_samples(&text, name, None)
}

/// What the replica with wrong credentials is refused with.
struct Refusal {
    /// What kcache's own log line about the failed connection (`NATS event …`) says.
    kcache_says: String,
    /// What nats-server's log says about the attempts (each must appear).
    server_says: Vec<String>,
}

/// `text` without ANSI colour sequences (kcache colours its text log even in a file).
fn plain(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            // ESC [ parameters letter
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// Replicas `a` and `b` (configured by `good`) form a fleet over `nats`; `c` (configured
/// by `bad`) never joins it, serves its clients from its own upstream watch, and both it
/// and the server log the `refusal`.
async fn fleet_and_outsider(
    cluster: &TestCluster,
    nats: &ConfNats,
    ns: &str,
    good: &str,
    bad: &str,
    refusal: Refusal,
) {
    let (a, b, c) = tokio::join!(
        replica(cluster, good, "a"),
        replica(cluster, good, "b"),
        replica(cluster, bad, "c"),
    );
    let admin = cluster.kube_client().await;
    support::create_namespace(&admin, ns).await;
    let key = format!("/api/v1/namespaces/{ns}/configmaps");
    for (name, k) in [("a", &a), ("b", &b)] {
        eventually(
            &format!("{name} connects to NATS"),
            Duration::from_secs(20),
            || async { gauge(k, "kcache_nats_connected").await == 1.0 },
        )
        .await;
    }
    assert_eq!(gauge(&c, "kcache_nats_connected").await, 0.0);

    // A client on a first: a owns the key; then one on b, which mirrors it.
    let mut on_a = watch(&a, ns).await;
    eventually("a owns the key", Duration::from_secs(20), || async {
        a.role(&key).await == "owner"
    })
    .await;
    let mut on_b = watch(&b, ns).await;
    eventually("b mirrors the key", Duration::from_secs(20), || async {
        b.role(&key).await == "mirror"
    })
    .await;
    // c cannot reach the fleet: after fallback_after_ms (1 s) it watches upstream itself.
    let mut on_c = watch(&c, ns).await;
    eventually(
        "c falls back to its own upstream watch",
        Duration::from_secs(20),
        || async { c.role(&key).await == "local" },
    )
    .await;

    let configmaps: kube::Api<ConfigMap> = kube::Api::namespaced(admin, ns);
    let cm: ConfigMap =
        serde_json::from_value(json!({"metadata": {"name": "cm"}, "data": {"v": "1"}}))
            .expect("a ConfigMap");
    configmaps
        .create(&Default::default(), &cm)
        .await
        .expect("create the ConfigMap");
    for (who, rx) in [("a", &mut on_a), ("b", &mut on_b), ("c", &mut on_c)] {
        expect_event(rx, who, "ADDED", "cm", "1").await;
    }
    configmaps
        .patch(
            "cm",
            &Default::default(),
            &kube::api::Patch::Merge(json!({"data": {"v": "2"}})),
        )
        .await
        .expect("update the ConfigMap");
    for (who, rx) in [("a", &mut on_a), ("b", &mut on_b), ("c", &mut on_c)] {
        expect_event(rx, who, "MODIFIED", "cm", "2").await;
    }

    // b's events came over NATS from a: a holds the fleet's one upstream watch, b none.
    assert_eq!(a.role(&key).await, "owner");
    assert_eq!(b.role(&key).await, "mirror");
    assert_eq!(a.metric("kcache_upstream_watches").await, 1.0);
    assert_eq!(b.metric("kcache_upstream_watches").await, 0.0);
    assert!(b.metric("kcache_nats_messages_received_total").await > 0.0);
    assert!(a.metric("kcache_nats_reconnects_total").await >= 1.0);

    // c never connected at any moment (each connection counts one "reconnect"), and still
    // serves from its own upstream watch.
    assert_eq!(gauge(&c, "kcache_nats_connected").await, 0.0);
    assert_eq!(c.metric("kcache_nats_reconnects_total").await, 0.0);
    assert_eq!(c.metric("kcache_nats_messages_received_total").await, 0.0);
    assert_eq!(c.role(&key).await, "local");
    assert_eq!(c.metric("kcache_upstream_watches").await, 1.0);

    // c says it failed to connect, and why.
    let log = plain(&std::fs::read_to_string(&c.log).unwrap_or_default());
    let failures: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("NATS error") || l.contains("cannot connect to NATS"))
        .collect();
    assert!(
        !failures.is_empty(),
        "c's log has no failed NATS connection:\n{}",
        c.log_tail()
    );
    assert!(
        failures.iter().any(|l| l.contains(&refusal.kcache_says)),
        "c's log does not say {:?}:\n{}",
        refusal.kcache_says,
        failures.join("\n")
    );
    let server_log = nats.log();
    for needle in &refusal.server_says {
        assert!(
            server_log.contains(needle.as_str()),
            "nats-server's log does not say {needle:?}:\n{server_log}"
        );
    }
    // …and refused nobody else.
    for good in ["kcache/a\"", "kcache/b\""] {
        assert!(
            !server_log
                .lines()
                .any(|l| l.contains("[ERR]") && l.contains(good)),
            "nats-server refused {good}:\n{server_log}"
        );
    }
}

fn write(path: &Path, text: &str) -> String {
    std::fs::write(path, text).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
    path.display().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_with_server_verification() {
    let cluster = TestCluster::start().await;
    let d = cluster.dir_path();
    let ca = TestCa::new(&d.join("nats-pki"), "nats-ca");
    let (server_crt, server_key) = ca.issue_server("nats-server");
    let (client_crt, client_key) = ca.issue_client("kcache-client", "kcache");
    // A CA that did not sign the server's certificate.
    let other_ca = TestCa::new(&d.join("nats-pki"), "other-ca");
    let nats = ConfNats::start(
        d,
        "nats-tls",
        &format!(
            "tls {{\n  cert_file: \"{}\"\n  key_file: \"{}\"\n  ca_file: \"{}\"\n  verify: true\n  timeout: 2\n}}\n",
            server_crt.display(),
            server_key.display(),
            ca.cert().display(),
        ),
    );
    let tls = |ca: &Path| {
        format!(
            "tls_ca_file = \"{}\"\ntls_cert_file = \"{}\"\ntls_key_file = \"{}\"",
            ca.display(),
            client_crt.display(),
            client_key.display(),
        )
    };
    let good = nats_conf::replica_toml(d, &nats.url(), &tls(&ca.cert()));
    let bad = nats_conf::replica_toml(d, &nats.url(), &tls(&other_ca.cert()));
    // The cause (rustls' "invalid peer certificate: UnknownIssuer") travels only in the
    // connection error, which kcache logs from its first, foreground attempt.
    let refusal = Refusal {
        kcache_says: "UnknownIssuer".into(),
        server_says: vec![
            "TLS handshake error: remote error: tls: unknown certificate authority".into(),
        ],
    };
    fleet_and_outsider(&cluster, &nats, "tls", &good, &bad, refusal).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nkey_authentication() {
    let cluster = TestCluster::start().await;
    let d = cluster.dir_path();
    let user = KeyPair::new_user();
    let nats = ConfNats::start(
        d,
        "nats-nkey",
        &format!(
            "authorization {{\n  users = [\n    {{nkey: \"{}\"}}\n  ]\n}}\n",
            user.public_key()
        ),
    );
    let seed = |kp: &KeyPair, file: &str| {
        let path = write(
            &d.join(file),
            &format!("{}\n", kp.seed().expect("a generated key has a seed")),
        );
        format!("nkey_seed_file = \"{path}\"")
    };
    // A well-formed seed of a user the server does not know.
    let stranger = KeyPair::new_user();
    let good = nats_conf::replica_toml(d, &nats.url(), &seed(&user, "kcache.nk"));
    let bad = nats_conf::replica_toml(d, &nats.url(), &seed(&stranger, "stranger.nk"));
    let refusal = Refusal {
        kcache_says: "authorization violation".into(),
        server_says: vec![format!(
            "kcache/c\" - authentication error - Nkey \"{}\"",
            stranger.public_key()
        )],
    };
    fleet_and_outsider(&cluster, &nats, "nkey", &good, &bad, refusal).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn creds_file_in_operator_mode() {
    let cluster = TestCluster::start().await;
    let d = cluster.dir_path();
    let operator = KeyPair::new_operator();
    // nats-server 2.9 starts JetStream in operator mode only with a system account.
    let system = KeyPair::new_account();
    let account = KeyPair::new_account();
    let user = KeyPair::new_user();
    let operator_jwt = write(&d.join("operator.jwt"), &nats_conf::operator_jwt(&operator));
    let nats = ConfNats::start(
        d,
        "nats-jwt",
        &format!(
            "operator: \"{operator_jwt}\"\n\
             system_account: {sys}\n\
             resolver: MEMORY\n\
             resolver_preload: {{\n  {sys}: \"{sys_jwt}\"\n  {acc}: \"{acc_jwt}\"\n}}\n",
            sys = system.public_key(),
            sys_jwt = nats_conf::system_account_jwt(&operator, &system),
            acc = account.public_key(),
            acc_jwt = nats_conf::account_jwt(&operator, &account, "kcache"),
        ),
    );
    let creds = |user_jwt: &str, user: &KeyPair, file: &str| {
        let path = write(&d.join(file), &nats_conf::creds(user_jwt, user));
        format!("creds_file = \"{path}\"")
    };
    let good = nats_conf::replica_toml(
        d,
        &nats.url(),
        &creds(
            &nats_conf::user_jwt(&account, &user, "kcache"),
            &user,
            "kcache.creds",
        ),
    );
    // A user of an account the operator never signed (nor the server knows).
    let rogue_account = KeyPair::new_account();
    let rogue = KeyPair::new_user();
    let bad = nats_conf::replica_toml(
        d,
        &nats.url(),
        &creds(
            &nats_conf::user_jwt(&rogue_account, &rogue, "rogue"),
            &rogue,
            "rogue.creds",
        ),
    );
    let refusal = Refusal {
        kcache_says: "authorization violation".into(),
        server_says: vec![
            "Account fetch failed: account missing".into(),
            "kcache/c\" - authentication error".into(),
        ],
    };
    fleet_and_outsider(&cluster, &nats, "creds", &good, &bad, refusal).await;
}
