//! `deploy/` as an operator applies it, against the real test API server:
//! - every overlay, alone and with the optional components, renders with `kubectl
//!   kustomize` and passes `kubectl apply --dry-run=server`; nothing it references is
//!   missing (bindings, service accounts, config maps) but the Secrets the docs say to
//!   create;
//! - the PrometheusRule is `deploy/observability/alerts.yaml`, unchanged;
//! - a kubelet's own writes (node registration, node status, its lease, events) go through
//!   kcache with the kubelet's client certificate, with kcache running under exactly the
//!   RBAC of `deploy/base` + `components/kubelet-certs` (as its ServiceAccount), and other
//!   certificate identities are refused.

mod support;

use std::collections::BTreeSet;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::{json, Value};
use support::kcache::Kcache;
use support::TestCluster;

fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy")
}

/// Runs a command with `stdin`, returning stdout; panics with its output on failure.
fn run(cmd: &mut Command, stdin: &str) -> String {
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("start {cmd:?}: {e}"));
    child
        .stdin
        .take()
        .expect("piped stdin")
        .write_all(stdin.as_bytes())
        .expect("write stdin");
    let out = child.wait_with_output().expect("wait");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "{cmd:?} failed:\n{stderr}\n{}",
        String::from_utf8_lossy(&out.stdout)
    );
    // The API server's warnings (deprecated APIs, unknown fields) are failures too.
    assert!(
        !stderr.to_lowercase().contains("warning"),
        "{cmd:?} warned:\n{stderr}"
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn kubectl(cluster: &TestCluster) -> Command {
    let mut c = support::kubectl_command();
    c.arg("--kubeconfig").arg(&cluster.kubeconfig);
    c
}

/// A kustomization in a temp dir: `resources` and `components` given relative to deploy/.
fn combine(dir: &Path, name: &str, resources: &[&str], components: &[&str]) -> PathBuf {
    let d = dir.join(name);
    std::fs::create_dir_all(&d).expect("mkdir");
    // kustomize takes only relative paths: up to / from the temp dir, then down.
    let up = "../".repeat(d.components().count() - 1);
    let deploy = deploy_dir().canonicalize().expect("deploy/");
    let down = deploy.strip_prefix("/").expect("absolute");
    let list = |items: &[&str]| -> String {
        items
            .iter()
            .map(|i| format!("  - {up}{}\n", down.join(i).display()))
            .collect()
    };
    std::fs::write(
        d.join("kustomization.yaml"),
        format!(
            "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n{}components:\n{}",
            list(resources),
            list(components)
        ),
    )
    .expect("write kustomization");
    d
}

/// `kubectl kustomize DIR` (the reference version's kustomize), applied as rendered: no
/// test-only rewrite stands between the manifests and the reference API server.
fn render(dir: &Path) -> String {
    run(support::kubectl_command().arg("kustomize").arg(dir), "")
}

/// Objects of a `kubectl … -o json` answer (a List, or one object).
fn items(out: &str) -> Vec<Value> {
    let v: Value = serde_json::from_str(out).expect("kubectl printed JSON");
    match v.get("items") {
        Some(Value::Array(items)) => items.clone(),
        _ => vec![v],
    }
}

fn names_of<'a>(objs: &'a [Value], kind: &str) -> BTreeSet<&'a str> {
    objs.iter()
        .filter(|o| o["kind"] == kind)
        .filter_map(|o| o["metadata"]["name"].as_str())
        .collect()
}

/// What a rendered set references must be in it, except what the docs tell the operator
/// to create (`external_secrets`) and what Kubernetes provides.
fn check_references(what: &str, objs: &[Value], external_secrets: &[&str]) {
    let roles = names_of(objs, "ClusterRole");
    let accounts = names_of(objs, "ServiceAccount");
    let config_maps = names_of(objs, "ConfigMap");
    let secrets: BTreeSet<&str> = names_of(objs, "Secret")
        .into_iter()
        .chain(external_secrets.iter().copied())
        .chain(
            objs.iter()
                .filter(|o| o["kind"] == "Certificate")
                .filter_map(|o| o["spec"]["secretName"].as_str()),
        )
        .collect();
    for b in objs.iter().filter(|o| o["kind"] == "ClusterRoleBinding") {
        let role = b["roleRef"]["name"].as_str().unwrap_or("");
        assert!(
            roles.contains(role),
            "{what}: binding to missing role {role}"
        );
        for s in b["subjects"].as_array().into_iter().flatten() {
            if s["kind"] == "ServiceAccount" {
                let sa = s["name"].as_str().unwrap_or("");
                assert!(accounts.contains(sa), "{what}: binding to missing SA {sa}");
            }
        }
    }
    for r in &roles {
        assert!(
            objs.iter()
                .any(|o| o["kind"] == "ClusterRoleBinding"
                    && o["roleRef"]["name"].as_str() == Some(r)),
            "{what}: ClusterRole {r} is bound to nobody"
        );
    }
    for w in objs
        .iter()
        .filter(|o| o["kind"] == "Deployment" || o["kind"] == "StatefulSet")
    {
        let spec = &w["spec"]["template"]["spec"];
        if let Some(sa) = spec["serviceAccountName"].as_str() {
            assert!(accounts.contains(sa), "{what}: missing SA {sa}");
        }
        for v in spec["volumes"].as_array().into_iter().flatten() {
            if let Some(cm) = v["configMap"]["name"].as_str() {
                assert!(
                    config_maps.contains(cm) || cm == "kube-root-ca.crt",
                    "{what}: volume of missing ConfigMap {cm}"
                );
            }
            if let Some(s) = v["secret"]["secretName"].as_str() {
                assert!(secrets.contains(s), "{what}: volume of unknown Secret {s}");
            }
        }
        for c in spec["containers"].as_array().into_iter().flatten() {
            for e in c["env"].as_array().into_iter().flatten() {
                if let Some(s) = e["valueFrom"]["secretKeyRef"]["name"].as_str() {
                    assert!(secrets.contains(s), "{what}: env from unknown Secret {s}");
                }
            }
        }
    }
}

#[test]
fn the_prometheusrule_is_alerts_yaml() {
    let alerts = std::fs::read_to_string(deploy_dir().join("observability/alerts.yaml"))
        .expect("alerts.yaml");
    let rule =
        std::fs::read_to_string(deploy_dir().join("components/monitoring/prometheusrule.yaml"))
            .expect("prometheusrule.yaml");
    let spec = rule
        .split_once("\nspec:\n")
        .expect("a spec")
        .1
        .lines()
        .map(|l| l.strip_prefix("  ").unwrap_or(l))
        .collect::<Vec<_>>();
    let want: Vec<&str> = alerts.lines().filter(|l| !l.starts_with('#')).collect();
    assert!(
        spec == want,
        "components/monitoring/prometheusrule.yaml is out of date: run deploy/observability/sync-prometheusrule.sh"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_overlay_passes_a_server_dry_run() {
    let cluster = TestCluster::start().await;
    let crds = deploy_dir().join("test-crds");
    for f in ["monitoring.coreos.com.yaml", "cert-manager.io.yaml"] {
        run(
            kubectl(&cluster).args(["apply", "-f"]).arg(crds.join(f)),
            "",
        );
    }
    run(
        kubectl(&cluster).args([
            "wait",
            "--for=condition=established",
            "--timeout=60s",
            "crd/servicemonitors.monitoring.coreos.com",
            "crd/prometheusrules.monitoring.coreos.com",
            "crd/certificates.cert-manager.io",
            "crd/issuers.cert-manager.io",
        ]),
        "",
    );
    // Namespaced objects cannot be dry-run into a namespace that does not exist.
    run(
        kubectl(&cluster).args(["create", "namespace", "kcache", "--save-config"]),
        "",
    );
    let tmp = tempfile::tempdir().expect("tempdir");
    let all = [
        "components/monitoring",
        "components/cert-manager",
        "components/kubelet-certs",
    ];
    let variants: Vec<(&str, PathBuf, &[&str])> = vec![
        (
            "single",
            deploy_dir().join("overlays/single"),
            &["kcache-tls"],
        ),
        (
            "fleet",
            deploy_dir().join("overlays/fleet"),
            &["kcache-tls", "kcache-nats-auth", "kcache-nats-sealing"],
        ),
        (
            "single+components",
            combine(tmp.path(), "single-all", &["overlays/single"], &all),
            &[],
        ),
        (
            "fleet+components",
            combine(tmp.path(), "fleet-all", &["overlays/fleet"], &all),
            &["kcache-nats-auth", "kcache-nats-sealing"],
        ),
    ];
    for (what, dir, external) in variants {
        let rendered = render(&dir);
        let out = run(
            kubectl(&cluster).args(["apply", "--dry-run=server", "-o", "json", "-f", "-"]),
            &rendered,
        );
        let objs = items(&out);
        check_references(what, &objs, external);
        let kinds: BTreeSet<&str> = objs.iter().filter_map(|o| o["kind"].as_str()).collect();
        for k in [
            "Namespace",
            "ServiceAccount",
            "ClusterRole",
            "ClusterRoleBinding",
            "ConfigMap",
            "Deployment",
            "Service",
            "PodDisruptionBudget",
            "NetworkPolicy",
        ] {
            assert!(kinds.contains(k), "{what} has no {k}: {kinds:?}");
        }
        let dep = objs
            .iter()
            .find(|o| o["kind"] == "Deployment")
            .expect("a Deployment");
        assert_eq!(dep["spec"]["replicas"], 3, "{what}");
        let c = &dep["spec"]["template"]["spec"]["containers"][0];
        assert_eq!(c["readinessProbe"]["httpGet"]["path"], "/readyz", "{what}");
        assert!(c["lifecycle"]["preStop"]["exec"]["command"][0]
            .as_str()
            .is_some_and(|p| p.ends_with("kcache")));
        let args: Vec<&str> = c["args"]
            .as_array()
            .expect("args")
            .iter()
            .filter_map(Value::as_str)
            .collect();
        assert!(
            args.contains(&"--admin-listen=0.0.0.0:8081"),
            "{what}: {args:?}"
        );
        if what.starts_with("fleet") {
            let nats = objs
                .iter()
                .find(|o| o["kind"] == "StatefulSet")
                .expect("a NATS StatefulSet");
            assert_eq!(nats["spec"]["replicas"], 3);
            let env = c["env"].to_string();
            assert!(env.contains("KCACHE_NATS_URL"), "{what}: {env}");
        } else {
            assert!(
                !objs.iter().any(|o| o["kind"] == "StatefulSet"),
                "{what}: NATS without the fleet overlay"
            );
        }
    }
}

/// `kubectl apply --dry-run=server` of `yaml`: the objects as the API server would store them.
fn dry_run(cluster: &TestCluster, yaml: &str) -> Vec<Value> {
    items(&run(
        kubectl(cluster).args(["apply", "--dry-run=server", "-o", "json", "-f", "-"]),
        yaml,
    ))
}

/// An object as it compares between the chart and the overlays: what the API server set
/// (uid, timestamps, managed fields, kubectl's last-applied annotation) and each tool's own
/// marks (Helm's labels, `part-of`, the config checksums that roll pods where kustomize
/// renames the ConfigMap instead) removed; kustomize's ConfigMap name hashes cut off.
fn comparable(mut obj: Value) -> Value {
    fn strip_meta(meta: &mut Value) {
        let Some(m) = meta.as_object_mut() else {
            return;
        };
        for k in [
            "uid",
            "creationTimestamp",
            "resourceVersion",
            "generation",
            "managedFields",
        ] {
            m.remove(k);
        }
        for (field, keys) in [
            (
                "labels",
                &[
                    "app.kubernetes.io/part-of",
                    "app.kubernetes.io/managed-by",
                    "helm.sh/chart",
                ][..],
            ),
            (
                "annotations",
                &[
                    "kubectl.kubernetes.io/last-applied-configuration",
                    "checksum/config",
                ][..],
            ),
        ] {
            if let Some(map) = m.get_mut(field).and_then(Value::as_object_mut) {
                for k in keys {
                    map.remove(*k);
                }
                if map.is_empty() {
                    m.remove(field);
                }
            }
        }
    }
    if let Some(o) = obj.as_object_mut() {
        o.remove("status");
    }
    strip_meta(&mut obj["metadata"]);
    if obj["spec"]["template"]["metadata"].is_object() {
        strip_meta(&mut obj["spec"]["template"]["metadata"]);
    }
    // `kcache-config-5h6298kmm9` → `kcache-config`, wherever it appears.
    let text = obj.to_string();
    let hashed = regex::Regex::new(r#""(kcache(?:-nats)?-config)-[a-z0-9]{10}""#).expect("regex");
    serde_json::from_str(&hashed.replace_all(&text, "\"$1\"")).expect("JSON")
}

/// The Helm chart (helm built from its Go module) passes `helm lint --strict`, and `helm
/// template` with its defaults renders exactly what `deploy/overlays/single` renders, with
/// `fleet.enabled=true` exactly what `deploy/overlays/fleet` renders — object for object,
/// as the reference API server's dry run stores them — so the two ways to install cannot
/// drift apart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_helm_chart_renders_what_the_overlays_render() {
    let cluster = TestCluster::start().await;
    run(
        kubectl(&cluster).args(["create", "namespace", "kcache", "--save-config"]),
        "",
    );
    let chart = deploy_dir().join("helm/kcache");
    for (overlay, values) in [
        ("single", &[][..]),
        ("fleet", &["--set", "fleet.enabled=true"][..]),
    ] {
        run(
            support::helm_command()
                .args(["lint", "--strict"])
                .arg(&chart)
                .args(values),
            "",
        );
        let rendered = run(
            support::helm_command()
                .args(["template", "kcache", "--namespace", "kcache"])
                .arg(&chart)
                .args(values),
            "",
        );
        let by_name = |objs: Vec<Value>| -> std::collections::BTreeMap<String, Value> {
            objs.into_iter()
                // Helm leaves the namespace to `--create-namespace`.
                .filter(|o| o["kind"] != "Namespace")
                .map(comparable)
                .map(|o| {
                    (
                        format!(
                            "{} {}",
                            o["kind"].as_str().unwrap_or(""),
                            o["metadata"]["name"].as_str().unwrap_or("")
                        ),
                        o,
                    )
                })
                .collect()
        };
        let from_chart = by_name(dry_run(&cluster, &rendered));
        let from_overlay = by_name(dry_run(
            &cluster,
            &render(&deploy_dir().join("overlays").join(overlay)),
        ));
        assert_eq!(
            from_chart.keys().collect::<Vec<_>>(),
            from_overlay.keys().collect::<Vec<_>>(),
            "{overlay}: the chart's objects"
        );
        for (name, obj) in &from_overlay {
            assert_eq!(&from_chart[name], obj, "{overlay}: {name} from the chart");
        }
    }
}

/// The NATS server configuration of `deploy/nats` is valid for the nats-server the tests
/// use (2.9), and kcache connects with the manifest's user, its password from a file and
/// only the docs' permissions, and runs as a fleet on it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shipped_nats_config_serves_a_replica_with_its_permissions() {
    let cluster = TestCluster::start().await;
    let dir = cluster.dir_path().to_path_buf();
    // The shipped file, with the cluster block (routes to pod DNS names) and fixed ports
    // replaced by loopback ones.
    let shipped = std::fs::read_to_string(deploy_dir().join("nats/nats.conf")).expect("nats.conf");
    let port = support::free_port();
    let cluster_block = shipped
        .find("cluster {")
        .map(|start| {
            let end = start + shipped[start..].find("\n}\n").expect("end of cluster") + 3;
            (start, end)
        })
        .expect("a cluster block");
    let conf = format!(
        "{}{}",
        &shipped[..cluster_block.0],
        &shipped[cluster_block.1..]
    )
    .replace("listen: 0.0.0.0:4222", &format!("listen: 127.0.0.1:{port}"))
    .replace("http: 0.0.0.0:8222\n", "")
    .replace(
        "/var/run/nats/nats.pid",
        &dir.join("nats.pid").display().to_string(),
    )
    .replace("/data/jetstream", &dir.join("js").display().to_string());
    std::fs::write(dir.join("nats.conf"), conf).expect("write nats.conf");
    let mut nats = Command::new("nats-server")
        .arg("-c")
        .arg(dir.join("nats.conf"))
        .env("POD_NAME", "nats-0")
        .env("KCACHE_NATS_PASSWORD", "s3cret-for-test")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join("nats.log")).expect("nats log"))
        .spawn()
        .expect("start nats-server");
    std::fs::write(dir.join("nats-password"), "s3cret-for-test\n").expect("password file");
    let key: String = {
        use base64::Engine;
        base64::engine::general_purpose::STANDARD.encode(rand::random::<[u8; 32]>())
    };
    std::fs::write(dir.join("k1"), key).expect("key file");
    let toml = format!(
        "[nats]\nurl = \"nats://127.0.0.1:{port}\"\nuser = \"kcache\"\npassword_file = \"{}\"\nencrypt_resources = [\"secrets\"]\nencryption_active_key = \"k1\"\n[[nats.encryption_keys]]\nid = \"k1\"\nfile = \"{}\"\n",
        dir.join("nats-password").display(),
        dir.join("k1").display()
    );
    let k = Kcache::start_with_args(&cluster, &toml, &["--replica-id", "a"]).await;
    // Owning a key takes the lease (JetStream KV) and publishing on kcache's subjects:
    // a permission missing from the shipped config is a refused lease or publish.
    let client = cluster.kube_client().await;
    support::create_namespace(&client, "nats-perm").await;
    let http = support::insecure_http();
    let r = http
        .get(format!(
            "{}/api/v1/namespaces/nats-perm/configmaps?resourceVersion=0",
            k.url
        ))
        .bearer_auth(support::ADMIN_TOKEN)
        .send()
        .await
        .expect("list");
    assert_eq!(r.status(), 200);
    support::eventually(
        "kcache owns the key over the shipped NATS config",
        std::time::Duration::from_secs(20),
        || async {
            k.metric("kcache_fleet_owned_keys").await >= 1.0
                && k.metric("kcache_nats_messages_published_total").await >= 1.0
        },
    )
    .await;
    let log = std::fs::read_to_string(dir.join("nats.log")).unwrap_or_default();
    assert!(
        !log.contains("Permissions Violation"),
        "the shipped permissions refused kcache:\n{log}"
    );
    assert!(
        !k.log_tail().contains("ermission"),
        "kcache saw a permission error:\n{}",
        k.log_tail()
    );
    let _ = nats.kill();
    let _ = nats.wait();
}

/// A kubelet pointed at kcache: its reads are served as its identity, and its writes go
/// upstream as kcache (a ServiceAccount with only the shipped RBAC) impersonating it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kubelet_writes_through_kcache_with_its_client_certificate() {
    let cluster = TestCluster::start().await;
    // kcache's RBAC exactly as shipped, applied for real (nothing runs the Deployment: the
    // test API server has no controllers).
    let tmp = tempfile::tempdir().expect("tempdir");
    let rendered = render(&combine(
        tmp.path(),
        "kubelets",
        &["overlays/single"],
        &["components/kubelet-certs"],
    ));
    run(kubectl(&cluster).args(["apply", "-f", "-"]), &rendered);
    // kcache as its ServiceAccount: a client certificate naming the account authenticates
    // as the same user, and RBAC binds by user name.
    let (sa_crt, sa_key) = cluster.issue_client_cert(
        "kcache-sa",
        "system:serviceaccount:kcache:kcache",
        &["system:serviceaccounts", "system:serviceaccounts:kcache"],
    );
    let kubeconfig = cluster.dir_path().join("kcache-sa.kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: t\n  cluster: {{server: \"{}\", insecure-skip-tls-verify: true}}\nusers:\n- name: sa\n  user: {{client-certificate: \"{}\", client-key: \"{}\"}}\ncontexts:\n- name: t\n  context: {{cluster: t, user: sa}}\ncurrent-context: t\n",
            cluster.url,
            sa_crt.display(),
            sa_key.display()
        ),
    )
    .expect("write kubeconfig");
    let ca = cluster.client_ca.display().to_string();
    let k = Kcache::start_with_kubeconfig(
        &cluster,
        &kubeconfig,
        "",
        &["--client-ca-file", &ca, "--impersonate-nodes"],
    )
    .await;
    let identity = |name: &str, cn: &str, groups: &[&str]| {
        let (crt, key) = cluster.issue_client_cert(name, cn, groups);
        let mut pem = std::fs::read(crt).expect("cert");
        pem.extend(std::fs::read(key).expect("key"));
        reqwest::Client::builder()
            .danger_accept_invalid_certs(true)
            .identity(reqwest::Identity::from_pem(&pem).expect("identity"))
            .build()
            .expect("client")
    };
    let kubelet = identity("node1", "system:node:node1", &["system:nodes"]);
    let u = |p: &str| format!("{}{p}", k.url);
    let send = |req: reqwest::RequestBuilder| async move {
        let r = req.send().await.expect("request");
        let code = r.status().as_u16();
        (code, r.json::<Value>().await.unwrap_or(Value::Null))
    };
    let now = "2026-01-01T00:00:00Z";
    // Registration.
    let (code, body) = send(kubelet.post(u("/api/v1/nodes")).json(&json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": "node1", "labels": {"kubernetes.io/hostname": "node1"}},
    })))
    .await;
    assert_eq!(code, 201, "register the node: {body}");
    // Node status, as the kubelet patches it.
    let (code, body) = send(
        kubelet
            .patch(u("/api/v1/nodes/node1/status"))
            .header("content-type", "application/strategic-merge-patch+json")
            .json(&json!({"status": {"conditions": [{
                "type": "Ready", "status": "True", "reason": "KubeletReady",
                "message": "kubelet is posting ready status",
                "lastHeartbeatTime": now, "lastTransitionTime": now,
            }]}})),
    )
    .await;
    assert_eq!(code, 200, "patch node status: {body}");
    // The node lease: create, then renew.
    let leases = "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases";
    let (code, body) = send(kubelet.post(u(leases)).json(&json!({
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": "node1"},
        "spec": {"holderIdentity": "node1", "leaseDurationSeconds": 40,
                 "renewTime": "2026-01-01T00:00:00.000000Z"},
    })))
    .await;
    assert_eq!(code, 201, "create the lease: {body}");
    let (code, mut lease) = send(kubelet.get(u(&format!("{leases}/node1")))).await;
    assert_eq!(code, 200, "get the lease: {lease}");
    lease["spec"]["renewTime"] = json!("2026-01-01T00:00:10.000000Z");
    let (code, body) = send(kubelet.put(u(&format!("{leases}/node1"))).json(&lease)).await;
    assert_eq!(code, 200, "renew the lease: {body}");
    // An event.
    let (code, body) = send(
        kubelet
            .post(u("/api/v1/namespaces/default/events"))
            .json(&json!({
                "apiVersion": "v1", "kind": "Event",
                "metadata": {"name": "node1.start", "namespace": "default"},
                "involvedObject": {"kind": "Node", "name": "node1", "uid": "node1"},
                "reason": "Starting", "message": "Starting kubelet.", "type": "Normal",
                "source": {"component": "kubelet", "host": "node1"},
                "firstTimestamp": now, "lastTimestamp": now, "count": 1,
            })),
    )
    .await;
    assert_eq!(code, 201, "create an event: {body}");
    // The API server decided as the node, not as kcache or an admin: the Node authorizer
    // refuses a node what kubelets never do.
    let (code, body) = send(
        kubelet
            .post(u("/api/v1/namespaces/default/configmaps"))
            .json(&json!({"metadata": {"name": "not-a-kubelets"}})),
    )
    .await;
    assert_eq!(code, 403, "a node creating a configmap: {body}");
    assert!(
        body["message"]
            .as_str()
            .unwrap_or("")
            .contains("system:node:node1"),
        "refused as whom? {body}"
    );
    // What landed upstream, read as admin.
    let admin = cluster.kube_client().await;
    let nodes: kube::Api<k8s_openapi::api::core::v1::Node> = kube::Api::all(admin.clone());
    let node = nodes.get("node1").await.expect("the node exists upstream");
    let ready = node
        .status
        .and_then(|s| s.conditions)
        .and_then(|c| c.into_iter().find(|c| c.type_ == "Ready"))
        .expect("a Ready condition");
    assert_eq!(ready.status, "True");
    // Other certificate identities: not lent kcache's identity.
    for (name, cn, groups) in [
        ("viewer", "viewer", &[][..]),
        (
            "fake-master",
            "system:node:node1",
            &["system:nodes", "system:masters"][..],
        ),
    ] {
        let c = identity(name, cn, groups);
        let (code, body) = send(c.post(u("/api/v1/namespaces/default/events")).json(&json!({
            "metadata": {"name": format!("{name}.x")},
            "involvedObject": {"kind": "Node", "name": "node1"},
        })))
        .await;
        assert_eq!(code, 403, "{name}: {body}");
        assert!(
            body["message"]
                .as_str()
                .unwrap_or("")
                .contains("kcache forwards only"),
            "{name}: {body}"
        );
    }
}
