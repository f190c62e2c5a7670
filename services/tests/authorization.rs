//! Authorization parity: the same requests with the same credentials, sent to the API
//! server (`--authorization-mode=Node,RBAC`) and to kcache, get the same status codes,
//! and kcache never shows an object the API server would not have shown.

mod support;

use std::collections::BTreeSet;
use std::time::Duration;

use futures::StreamExt;
use serde_json::{json, Value};
use support::kcache::Kcache;
use support::{eventually, insecure_http, TestCluster, ADMIN_TOKEN};

/// Status code and the names of the objects a response shows (list items, a got object,
/// or the objects of a watch that ends by its timeoutSeconds).
async fn observe(base: &str, path: &str, token: Option<&str>) -> (u16, BTreeSet<String>) {
    let mut req = insecure_http().get(format!("{base}{path}"));
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    let resp = req.send().await.expect("request");
    let code = resp.status().as_u16();
    let mut names = BTreeSet::new();
    let mut body = Vec::new();
    let mut stream = resp.bytes_stream();
    let read = async {
        while let Some(Ok(chunk)) = stream.next().await {
            body.extend_from_slice(&chunk);
        }
    };
    let _ = tokio::time::timeout(Duration::from_secs(15), read).await;
    let name_of = |o: &Value| {
        o["metadata"]["name"].as_str().map(|n| {
            format!(
                "{}/{}",
                o["metadata"]["namespace"].as_str().unwrap_or(""),
                n
            )
        })
    };
    if path.contains("watch=1") {
        for line in body.split(|b| *b == b'\n') {
            if let Ok(ev) = serde_json::from_slice::<Value>(line) {
                if ev["type"] != "BOOKMARK" && ev["type"] != "ERROR" {
                    names.extend(name_of(&ev["object"]));
                }
            }
        }
    } else if let Ok(v) = serde_json::from_slice::<Value>(&body) {
        match v["items"].as_array() {
            Some(items) => names.extend(items.iter().filter_map(name_of)),
            None if v["kind"] != "Status" => names.extend(name_of(&v)),
            None => {}
        }
    }
    (code, names)
}

/// Namespaces a and b with a ConfigMap each, Secrets s1 s2 (a) and s3 (b); viewer may
/// read ConfigMaps in a; node1 runs a pod mounting s1.
async fn setup(cluster: &TestCluster) {
    for ns in ["a", "b"] {
        support::create_as_admin(
            cluster,
            "/api/v1/namespaces",
            json!({"metadata": {"name": ns}}),
        )
        .await;
        support::create_as_admin(
            cluster,
            &format!("/api/v1/namespaces/{ns}/serviceaccounts"),
            json!({"metadata": {"name": "default"}}),
        )
        .await;
        support::create_as_admin(
            cluster,
            &format!("/api/v1/namespaces/{ns}/configmaps"),
            json!({"metadata": {"name": format!("cm-{ns}")}}),
        )
        .await;
    }
    for (ns, name) in [("a", "s1"), ("a", "s2"), ("b", "s3")] {
        support::create_as_admin(
            cluster,
            &format!("/api/v1/namespaces/{ns}/secrets"),
            json!({"metadata": {"name": name}}),
        )
        .await;
    }
    // viewer may read configmaps in namespace a only.
    support::create_as_admin(cluster, "/apis/rbac.authorization.k8s.io/v1/namespaces/a/roles", json!({
        "metadata": {"name": "cm-reader"},
        "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list", "watch"]}],
    })).await;
    support::create_as_admin(cluster, "/apis/rbac.authorization.k8s.io/v1/namespaces/a/rolebindings", json!({
        "metadata": {"name": "cm-reader"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "cm-reader"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "viewer"}],
    })).await;
    // node1 runs a pod that mounts secret s1: the Node authorizer lets it read s1 only.
    support::create_as_admin(
        cluster,
        "/api/v1/namespaces/a/pods",
        json!({
            "metadata": {"name": "p1"},
            "spec": {
                "nodeName": "node1",
                "automountServiceAccountToken": false,
                "containers": [{"name": "c", "image": "busybox"}],
                "volumes": [{"name": "s", "secret": {"secretName": "s1"}}],
            },
        }),
    )
    .await;
    eventually(
        "the Node authorizer knows node1's pod",
        Duration::from_secs(30),
        || async {
            observe(
                &cluster.url,
                "/api/v1/namespaces/a/secrets/s1",
                Some("node1token"),
            )
            .await
            .0 == 200
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kcache_answers_every_request_as_the_api_server_would() {
    let cluster = TestCluster::start().await;
    let audit_log = cluster.dir_path().join("audit.log");
    let k = Kcache::start(
        &cluster,
        &format!(
            "[auth]\nauthz_allow_ttl_secs = 2\nauthz_deny_ttl_secs = 2\n[audit]\npath = {:?}\n",
            audit_log.display().to_string()
        ),
    )
    .await;
    setup(&cluster).await;
    // The revocation lag this kcache runs with, as the metric says it (the token cache at
    // its default).
    let metrics = k.metrics_text().await;
    for (labels, want) in [
        ("cache=\"authz\",decision=\"allow\"", 2.0),
        ("cache=\"authz\",decision=\"deny\"", 2.0),
        ("cache=\"token\",decision=\"any\"", 10.0),
    ] {
        assert_eq!(
            support::kcache::sum_samples(&metrics, "kcache_auth_cache_ttl_seconds", Some(labels)),
            want,
            "{labels}"
        );
    }

    let requests = [
        "/api/v1/namespaces/a/configmaps?resourceVersion=0",
        "/api/v1/namespaces/b/configmaps?resourceVersion=0",
        "/api/v1/configmaps?resourceVersion=0",
        "/api/v1/namespaces/a/configmaps/cm-a?resourceVersion=0",
        "/api/v1/namespaces/a/secrets?resourceVersion=0",
        "/api/v1/secrets?resourceVersion=0",
        "/api/v1/namespaces/a/secrets/s1?resourceVersion=0",
        "/api/v1/namespaces/a/secrets/s2?resourceVersion=0",
        "/api/v1/namespaces/a/secrets?resourceVersion=0&fieldSelector=metadata.name%3Ds1",
        "/api/v1/namespaces/a/secrets?resourceVersion=0&fieldSelector=metadata.name%3Ds2",
        "/api/v1/namespaces/a/secrets?resourceVersion=0&fieldSelector=metadata.name%3Ds1&fieldSelector=metadata.name%3Ds2",
        "/api/v1/namespaces/a/secrets?watch=1&timeoutSeconds=2&resourceVersion=0&fieldSelector=metadata.name%3Ds1",
        "/api/v1/namespaces/a/secrets?watch=1&timeoutSeconds=2&resourceVersion=0&fieldSelector=metadata.name%3Ds2",
        "/api/v1/namespaces/a/secrets?watch=1&timeoutSeconds=2&fieldSelector=metadata.name%3Ds1&fieldSelector=metadata.name%3Ds2",
        "/api/v1/namespaces/a/configmaps?watch=1&timeoutSeconds=2&resourceVersion=0",
        "/api/v1/namespaces/a/pods?resourceVersion=0",
        "/api/v1/pods?resourceVersion=0&fieldSelector=spec.nodeName%3Dnode1",
        "/api/v1/namespaces?resourceVersion=0",
        "/api/v1/namespaces/a?resourceVersion=0",
        // Malformed but forbidden: the API server authorizes first.
        "/api/v1/namespaces/b/secrets?resourceVersion=0&labelSelector=%3D%3D",
    ];
    let tokens = [
        Some(ADMIN_TOKEN),
        Some("viewertoken"),
        Some("nobodytoken"),
        Some("node1token"),
        Some("bogus"),
        None,
    ];
    let mut mismatches = Vec::new();
    for path in requests {
        for token in tokens {
            let (want, upstream_names) = observe(&cluster.url, path, token).await;
            let (got, names) = observe(&k.url, path, token).await;
            if want != got {
                mismatches.push(format!(
                    "{path} as {token:?}: API server {want}, kcache {got}"
                ));
            }
            let extra: Vec<_> = names.difference(&upstream_names).collect();
            if !extra.is_empty() {
                mismatches.push(format!(
                    "{path} as {token:?}: kcache showed {extra:?} the API server did not"
                ));
            }
        }
    }
    assert!(mismatches.is_empty(), "{}", mismatches.join("\n"));

    // Allowed and denied Secret reads are audited (Metadata level), with user and decision.
    let audited = |user: &'static str, decision: &'static str| {
        let audit_log = audit_log.clone();
        move || {
            let text = std::fs::read_to_string(&audit_log).unwrap_or_default();
            let found = text
                .lines()
                .filter_map(|l| serde_json::from_str::<Value>(l).ok())
                .any(|e| {
                    e["kind"] == "Event"
                        && e["apiVersion"] == "audit.k8s.io/v1"
                        && e["level"] == "Metadata"
                        && e["user"]["username"] == user
                        && e["objectRef"]["resource"] == "secrets"
                        && e["objectRef"]["name"] == "s1"
                        && e["annotations"]["authorization.k8s.io/decision"] == decision
                        && e["sourceIPs"][0] == "127.0.0.1"
                });
            async move { found }
        }
    };
    eventually(
        "an allowed Secret read is audited",
        Duration::from_secs(10),
        audited("admin", "allow"),
    )
    .await;
    eventually(
        "a denied Secret read is audited",
        Duration::from_secs(10),
        audited("viewer", "forbid"),
    )
    .await;
    let text = std::fs::read_to_string(&audit_log).unwrap_or_default();
    assert!(
        !text.contains("configmaps"),
        "only the configured resources are audited"
    );

    // Impersonation is authorized and applied, never ignored: admin as viewer sees what
    // viewer sees; viewer may not impersonate.
    for (token, as_user) in [(ADMIN_TOKEN, "viewer"), ("viewertoken", "admin")] {
        for path in [
            "/api/v1/namespaces/a/secrets?resourceVersion=0",
            "/api/v1/namespaces/a/configmaps?resourceVersion=0",
        ] {
            let get = |base: String| async move {
                insecure_http()
                    .get(format!("{base}{path}"))
                    .bearer_auth(token)
                    .header("Impersonate-User", as_user)
                    .send()
                    .await
                    .expect("request")
                    .status()
                    .as_u16()
            };
            let (want, got) = (get(cluster.url.clone()).await, get(k.url.clone()).await);
            assert_eq!(got, want, "{path} by {token} as {as_user}");
        }
    }

    // Removing the RoleBinding takes effect within the decision cache's TTL.
    let path = "/api/v1/namespaces/a/configmaps?resourceVersion=0";
    assert_eq!(observe(&k.url, path, Some("viewertoken")).await.0, 200);
    let resp = insecure_http()
        .delete(format!(
            "{}/apis/rbac.authorization.k8s.io/v1/namespaces/a/rolebindings/cm-reader",
            cluster.url
        ))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .expect("delete rolebinding");
    assert!(resp.status().is_success());
    eventually(
        "the revoked user is refused",
        Duration::from_secs(10),
        || async { observe(&k.url, path, Some("viewertoken")).await.0 == 403 },
    )
    .await;
}

/// Status code of a GET through curl with a client certificate (`name`.crt/.key in `dir`).
fn curl_with_cert(dir: &std::path::Path, name: &str, url: &str, extra: &[&str]) -> u16 {
    let out = std::process::Command::new("curl")
        .current_dir(dir)
        .args([
            "-sk",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            "--cert",
            &format!("{name}.crt"),
            "--key",
            &format!("{name}.key"),
        ])
        .args(extra)
        .arg(url)
        .output()
        .expect("curl");
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_certificates_authenticate_as_cn_and_organizations() {
    let cluster = TestCluster::start().await;
    setup(&cluster).await;
    // The test cluster's client CA signs v3 client certificates, as kubelets' are.
    cluster.issue_client_cert("node1", "system:node:node1", &["system:nodes"]);
    cluster.issue_client_cert("viewer", "viewer", &[]);
    let dir = cluster
        .client_ca
        .parent()
        .expect("the client CA lives in the cluster's pki directory")
        .to_path_buf();
    let ca = cluster.client_ca.display().to_string();
    let k = Kcache::start_with_args(
        &cluster,
        "[auth]\nimpersonate_cert_users = true\n",
        &["--client-ca-file", &ca],
    )
    .await;
    // setup() waited until the Node authorizer knows node1's pod.
    let u = |p: &str| format!("{}{p}", k.url);
    // Served from the cache, authorized for the certificate's identity.
    assert_eq!(
        curl_with_cert(
            &dir,
            "node1",
            &u("/api/v1/namespaces/a/secrets/s1?resourceVersion=0"),
            &[]
        ),
        200
    );
    assert_eq!(
        curl_with_cert(
            &dir,
            "node1",
            &u("/api/v1/namespaces/a/secrets/s2?resourceVersion=0"),
            &[]
        ),
        403
    );
    assert_eq!(
        curl_with_cert(
            &dir,
            "viewer",
            &u("/api/v1/namespaces/a/configmaps?resourceVersion=0"),
            &[]
        ),
        200
    );
    assert_eq!(
        curl_with_cert(
            &dir,
            "viewer",
            &u("/api/v1/namespaces/b/configmaps?resourceVersion=0"),
            &[]
        ),
        403
    );
    // Proxied (a consistent read): kcache impersonates the certificate's user upstream.
    assert_eq!(
        curl_with_cert(&dir, "viewer", &u("/api/v1/namespaces/a/configmaps"), &[]),
        200
    );
    assert_eq!(
        curl_with_cert(&dir, "viewer", &u("/api/v1/namespaces/b/configmaps"), &[]),
        403
    );
    // A certificate user's own impersonation is refused, never ignored.
    assert_eq!(
        curl_with_cert(
            &dir,
            "viewer",
            &u("/api/v1/namespaces/a/configmaps"),
            &["-H", "Impersonate-User: admin"]
        ),
        403
    );
    // A certificate from another CA is not an identity: anonymous, forbidden.
    support::openssl(
        &dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "rogue.key",
            "-out",
            "rogue.crt",
            "-days",
            "1",
            "-subj",
            "/O=system:masters/CN=admin",
        ],
    );
    let rogue = curl_with_cert(
        &dir,
        "rogue",
        &u("/api/v1/namespaces/a/secrets?resourceVersion=0"),
        &[],
    );
    assert!(
        rogue == 403 || rogue == 0,
        "a rogue certificate got {rogue}"
    );
}

/// `/debug/keys` names objects (a kubelet's Secrets): a caller allowed the endpoint (a
/// pprof-style `nonResourceURLs: ["/debug/*"]` role) sees each key only if the API server
/// would let it list that key's objects — as the key lists them upstream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn debug_keys_shows_each_caller_only_the_keys_it_may_list() {
    let cluster = TestCluster::start().await;
    setup(&cluster).await;
    support::create_as_admin(
        &cluster,
        "/apis/rbac.authorization.k8s.io/v1/clusterroles",
        json!({"metadata": {"name": "debug"}, "rules": [{"nonResourceURLs": ["/debug/*"], "verbs": ["get"]}]}),
    )
    .await;
    let subjects: Vec<Value> = ["viewer", "nobody", "system:node:node1"]
        .iter()
        .map(|u| json!({"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": u}))
        .collect();
    support::create_as_admin(
        &cluster,
        "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
        json!({
            "metadata": {"name": "debug"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "debug"},
            "subjects": subjects,
        }),
    )
    .await;
    let k = Kcache::start(&cluster, "").await;
    // Keys of every scope, started by the admin's reads (held for the grace period).
    for path in [
        "/api/v1/namespaces/a/configmaps?resourceVersion=0",
        "/api/v1/namespaces/b/configmaps?resourceVersion=0",
        "/api/v1/namespaces/a/secrets/s1?resourceVersion=0",
        "/api/v1/namespaces/b/secrets/s3?resourceVersion=0",
        "/api/v1/pods?resourceVersion=0&fieldSelector=spec.nodeName%3Dnode1",
    ] {
        assert_eq!(
            observe(&k.url, path, Some(ADMIN_TOKEN)).await.0,
            200,
            "{path}"
        );
    }
    let keys_of = |token: &'static str| {
        let url = format!("{}/debug/keys", k.admin_url);
        async move {
            let resp = insecure_http()
                .get(url)
                .bearer_auth(token)
                .send()
                .await
                .expect("GET /debug/keys");
            let code = resp.status().as_u16();
            let body: Value = resp.json().await.unwrap_or(Value::Null);
            let keys: BTreeSet<String> = body["keys"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|k| k["key"].as_str().map(str::to_string))
                .collect();
            (code, keys)
        }
    };
    let set = |keys: &[&str]| keys.iter().map(|k| k.to_string()).collect::<BTreeSet<_>>();
    let all = set(&[
        "/api/v1/namespaces/a/configmaps",
        "/api/v1/namespaces/b/configmaps",
        "/api/v1/namespaces/a/secrets/s1",
        "/api/v1/namespaces/b/secrets/s3",
        "/api/v1/pods?fieldSelector=spec.nodeName=node1",
    ]);
    assert_eq!(keys_of(ADMIN_TOKEN).await, (200, all));
    // viewer lists configmaps in namespace a only.
    assert_eq!(
        keys_of("viewertoken").await,
        (200, set(&["/api/v1/namespaces/a/configmaps"]))
    );
    // The Node authorizer: node1 may list the Secret its pod mounts, by name, and its own
    // pods, by node — nothing else.
    assert_eq!(
        keys_of("node1token").await,
        (
            200,
            set(&[
                "/api/v1/namespaces/a/secrets/s1",
                "/api/v1/pods?fieldSelector=spec.nodeName=node1"
            ])
        )
    );
    assert_eq!(keys_of("nobodytoken").await, (200, BTreeSet::new()));
    // Without the endpoint's permission: refused outright.
    assert_eq!(keys_of("node2token").await.0, 403);
}
