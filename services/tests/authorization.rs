//! Authorization parity: the same requests with the same credentials, sent to the API
//! server (`--authorization-mode=Node,RBAC`) and to kcache, get the same status codes,
//! and kcache never shows an object the API server would not have shown.

mod support;

use std::collections::BTreeSet;
use std::time::Duration;

use futures::StreamExt;
use serde_json::{json, Value};
use support::kcache::Kcache;
use support::rng::Rng;
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
            support::prom::sum_samples(&metrics, "kcache_auth_cache_ttl_seconds", Some(labels)),
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
    let keys_of = |token: &str| {
        let token = token.to_string();
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

    debug_keys_class(&cluster, &k, &keys_of).await;
}

/// The upstream list a `/debug/keys` key stands for: its namespace or cluster list, a
/// name key's list by `metadata.name`, a node key's by `spec.nodeName` (as the key lists).
fn key_list_path(key: &str) -> String {
    let (path, query) = key.split_once('?').unwrap_or((key, ""));
    let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let encode = |q: &str| q.replace('=', "%3D");
    match parts.as_slice() {
        ["api", "v1", "namespaces", ns, resource, name] => format!(
            "/api/v1/namespaces/{ns}/{resource}?fieldSelector=metadata.name%3D{name}&limit=1"
        ),
        _ if query.is_empty() => format!("{path}?limit=1"),
        _ => {
            let selector = query.trim_start_matches("fieldSelector=");
            format!("{path}?fieldSelector={}&limit=1", encode(selector))
        }
    }
}

/// `/debug/keys` as a class: generated service accounts, each with generated RBAC (list,
/// get, watch in some mix; cluster-wide or per namespace; by resource name or not; bound to
/// the account or its group) and the debug endpoint's permission or not; generated keys.
/// Each caller's view is judged by the API server: a key is shown exactly when the caller
/// may list the key's objects as the key lists them (that list, sent directly as the
/// caller, answers 200), and the endpoint answers exactly when the API server would
/// authorize the path. `KCACHE_DEBUGKEYS_SEED` replays a run.
async fn debug_keys_class<F, Fut>(cluster: &TestCluster, k: &Kcache, keys_of: &F)
where
    F: Fn(&str) -> Fut,
    Fut: std::future::Future<Output = (u16, BTreeSet<String>)>,
{
    let seed = Rng::seed_from_env("KCACHE_DEBUGKEYS_SEED", "debug keys class");
    let mut rng = Rng::new(seed);
    let candidates = [
        "/api/v1/namespaces/a/configmaps?resourceVersion=0",
        "/api/v1/namespaces/b/secrets?resourceVersion=0",
        "/api/v1/namespaces/a/pods?resourceVersion=0",
        "/api/v1/namespaces/b/configmaps/cm-b?resourceVersion=0",
        "/api/v1/namespaces/a/secrets/s2?resourceVersion=0",
        "/api/v1/namespaces/a/pods/p1?resourceVersion=0",
        "/api/v1/secrets?resourceVersion=0",
        "/api/v1/configmaps?resourceVersion=0",
        "/api/v1/pods?resourceVersion=0&fieldSelector=spec.nodeName%3Dnode2",
    ];
    for path in candidates {
        if rng.chance(60) {
            assert_eq!(
                observe(&k.url, path, Some(ADMIN_TOKEN)).await.0,
                200,
                "{path}"
            );
        }
    }
    // The callers: service accounts in namespace a, with generated rules.
    let verbs: [&[&str]; 5] = [
        &["list"],
        &["get"],
        &["watch"],
        &["list", "watch"],
        &["get", "list", "watch"],
    ];
    let resources = ["configmaps", "secrets", "pods"];
    let names = ["cm-a", "cm-b", "s1", "s2", "s3", "p1"];
    let rbac = "/apis/rbac.authorization.k8s.io/v1";
    let mut callers = Vec::new();
    let mut debug_bindings = Vec::new();
    for i in 0..6 {
        let sa = format!("gen{i}");
        support::create_as_admin(
            cluster,
            "/api/v1/namespaces/a/serviceaccounts",
            json!({"metadata": {"name": sa}}),
        )
        .await;
        let user = format!("system:serviceaccount:a:{sa}");
        let mut rules = Vec::new();
        for j in 0..rng.below(4) {
            let mut rule = json!({
                "apiGroups": [""],
                "resources": [rng.pick(&resources)],
                "verbs": verbs[rng.below(verbs.len())],
            });
            if rng.chance(25) {
                rule["resourceNames"] = json!([rng.pick(&names)]);
            }
            let subject = if rng.chance(20) {
                json!({"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "system:serviceaccounts:a"})
            } else {
                json!({"kind": "ServiceAccount", "name": sa, "namespace": "a"})
            };
            let name = format!("gen-{i}-{j}");
            let namespace = ["", "a", "b"][rng.below(3)];
            let (role_kind, prefix) = if namespace.is_empty() {
                ("ClusterRole", rbac.to_string())
            } else {
                ("Role", format!("{rbac}/namespaces/{namespace}"))
            };
            let plural = if namespace.is_empty() {
                "clusterroles"
            } else {
                "roles"
            };
            let binding = if namespace.is_empty() {
                "clusterrolebindings"
            } else {
                "rolebindings"
            };
            support::create_as_admin(
                cluster,
                &format!("{prefix}/{plural}"),
                json!({"metadata": {"name": name}, "rules": [rule]}),
            )
            .await;
            support::create_as_admin(
                cluster,
                &format!("{prefix}/{binding}"),
                json!({
                    "metadata": {"name": name},
                    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": role_kind, "name": name},
                    "subjects": [subject],
                }),
            )
            .await;
            rules.push(format!("{namespace}:{rule}"));
        }
        if rng.chance(80) {
            debug_bindings.push(json!({"kind": "ServiceAccount", "name": sa, "namespace": "a"}));
        }
        let token = support::create_as_admin(
            cluster,
            &format!("/api/v1/namespaces/a/serviceaccounts/{sa}/token"),
            json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"expirationSeconds": 3600}}),
        )
        .await["status"]["token"]
            .as_str()
            .expect("a service account token")
            .to_string();
        callers.push((user, rules, token));
    }
    // The debug endpoint's permission last: once the API server authorizes it for the
    // accounts that have it, it has read every rule created before.
    let debug_to = debug_bindings.len();
    if debug_to > 0 {
        support::create_as_admin(
            cluster,
            &format!("{rbac}/clusterrolebindings"),
            json!({
                "metadata": {"name": "gen-debug"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "debug"},
                "subjects": debug_bindings,
            }),
        )
        .await;
    }
    let direct = |path: String, token: String| async move {
        insecure_http()
            .get(format!("{}{path}", cluster.url))
            .bearer_auth(token)
            .send()
            .await
            .expect("a request to the API server")
            .status()
            .as_u16()
    };
    // The API server has no /debug/keys: authorized, it answers 404; not, 403.
    if debug_to > 0 {
        let tokens: Vec<String> = callers.iter().map(|c| c.2.clone()).collect();
        eventually(
            "the API server reads the generated RBAC",
            Duration::from_secs(30),
            || {
                let tokens = tokens.clone();
                async move {
                    let mut authorized = 0;
                    for t in tokens {
                        if direct("/debug/keys".into(), t).await == 404 {
                            authorized += 1;
                        }
                    }
                    authorized == debug_to
                }
            },
        )
        .await;
    }
    let (_, before) = keys_of(ADMIN_TOKEN).await;
    // Every caller's view, with the fixed tokens' too.
    let fixed = ["viewertoken", "nobodytoken", "node1token", "node2token"];
    let mut views = Vec::new();
    for (user, rules, token) in &callers {
        views.push((
            user.clone(),
            rules.join(" "),
            token.clone(),
            keys_of(token).await,
        ));
    }
    for token in fixed {
        views.push((
            token.to_string(),
            String::new(),
            token.to_string(),
            keys_of(token).await,
        ));
    }
    let (_, after) = keys_of(ADMIN_TOKEN).await;
    let stable: BTreeSet<&String> = before.intersection(&after).collect();
    let mut problems = Vec::new();
    let (mut shown, mut hidden) = (0, 0);
    for (user, rules, token, (code, view)) in &views {
        let endpoint = direct("/debug/keys".into(), token.to_string()).await;
        let want = if endpoint == 404 { 200 } else { 403 };
        if *code != want {
            problems.push(format!(
                "{user}: /debug/keys {code}, the API server's {endpoint} says {want} ({rules})"
            ));
            continue;
        }
        for key in before.union(&after) {
            let may = direct(key_list_path(key), token.to_string()).await == 200;
            let seen = view.contains(key);
            if seen && !may {
                problems.push(format!(
                    "{user}: sees {key}, which it may not list ({rules})"
                ));
            }
            if !seen && may && stable.contains(key) && *code == 200 {
                problems.push(format!(
                    "{user}: does not see {key}, which it may list ({rules})"
                ));
            }
            if *code == 200 && stable.contains(key) {
                if seen {
                    shown += 1
                } else {
                    hidden += 1
                }
            }
        }
    }
    eprintln!(
        "debug keys class: {} callers, {} keys, {shown} shown and {hidden} hidden",
        views.len(),
        stable.len()
    );
    assert!(
        problems.is_empty(),
        "seed {seed} (KCACHE_DEBUGKEYS_SEED): /debug/keys differs from the API server:\n{}",
        problems.join("\n")
    );
    assert!(
        shown > 0 && hidden > 0,
        "seed {seed}: nothing judged both ways"
    );
}
