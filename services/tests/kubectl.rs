//! kubectl as the judge: pointed at kcache it behaves as against the API server.

mod support;

use std::process::{Command, Stdio};
use std::time::Duration;

use support::kcache::Kcache;
use support::{eventually, TestCluster};

fn kubectl(server: &str, args: &[&str]) -> (bool, String, String) {
    let mut cmd = support::kubectl_command();
    cmd.args(["--server", server, "--token", "admintoken"]);
    // Both kcache and the test API server serve self-signed certificates.
    cmd.arg("--insecure-skip-tls-verify");
    // An empty kubeconfig so nothing on the machine leaks in.
    cmd.env("KUBECONFIG", "/dev/null");
    let out = cmd.args(args).output().expect("run kubectl");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The table without the AGE column (ages may differ by a second between two calls).
fn without_age(table: &str) -> Vec<Vec<String>> {
    let mut rows: Vec<Vec<String>> = table
        .lines()
        .map(|l| l.split_whitespace().map(str::to_string).collect())
        .collect();
    let age = rows.first().and_then(|h| h.iter().position(|c| c == "AGE"));
    if let Some(i) = age {
        for r in &mut rows {
            if i < r.len() {
                r.remove(i);
            }
        }
    }
    rows
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_against_kcache_matches_the_api_server() {
    let cluster = TestCluster::start().await;
    let k = Kcache::start(&cluster, "").await;
    let ks = k.url.as_str();
    let up = cluster.url.as_str();

    let (ok, _, err) = kubectl(ks, &["create", "namespace", "kc"]);
    assert!(ok, "create namespace through kcache: {err}");
    let (ok, _, err) = kubectl(
        ks,
        &[
            "-n",
            "kc",
            "create",
            "secret",
            "generic",
            "s1",
            "--from-literal=a=b",
        ],
    );
    assert!(ok, "create secret through kcache: {err}");

    // Table output: the same rows as the API server's.
    let (ok, via_kcache, err) = kubectl(ks, &["-n", "kc", "get", "secrets"]);
    assert!(ok, "get secrets: {err}");
    let (ok, direct, _) = kubectl(up, &["-n", "kc", "get", "secrets"]);
    assert!(ok);
    assert_eq!(
        without_age(&via_kcache),
        without_age(&direct),
        "kcache:\n{via_kcache}\ndirect:\n{direct}"
    );
    assert!(via_kcache.contains("s1"), "{via_kcache}");

    // -o json: the same object.
    let (ok, json_k, err) = kubectl(ks, &["-n", "kc", "get", "secret", "s1", "-o", "json"]);
    assert!(ok, "{err}");
    let (_, json_d, _) = kubectl(up, &["-n", "kc", "get", "secret", "s1", "-o", "json"]);
    let a: serde_json::Value = serde_json::from_str(&json_k).expect("json from kcache");
    let b: serde_json::Value = serde_json::from_str(&json_d).expect("json from API server");
    assert_eq!(a, b);

    // A watch through kcache sees a write made through kcache.
    let mut watch = support::kubectl_command()
        .args([
            "--server",
            ks,
            "--insecure-skip-tls-verify",
            "--token",
            "admintoken",
            "-n",
            "kc",
            "get",
            "secrets",
            "-w",
        ])
        .env("KUBECONFIG", "/dev/null")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("kubectl get -w");
    let stdout = watch.stdout.take().expect("stdout");
    let lines = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let sink = lines.clone();
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
        {
            sink.lock().expect("lines").push(line);
        }
    });
    let seen = |name: &'static str| {
        let lines = lines.clone();
        move || {
            let found = lines
                .lock()
                .expect("lines")
                .iter()
                .any(|l| l.starts_with(name));
            async move { found }
        }
    };
    eventually("the watch lists s1", Duration::from_secs(20), seen("s1 ")).await;
    // Let the watch request itself reach kcache before writing.
    eventually(
        "kcache holds the watch",
        Duration::from_secs(20),
        || async { k.metric("kcache_registered_watchers").await >= 1.0 },
    )
    .await;
    let (ok, _, err) = kubectl(
        ks,
        &[
            "-n",
            "kc",
            "create",
            "secret",
            "generic",
            "s2",
            "--from-literal=x=y",
        ],
    );
    assert!(ok, "{err}");
    eventually("the watch shows s2", Duration::from_secs(20), seen("s2 ")).await;
    let (ok, _, err) = kubectl(ks, &["-n", "kc", "delete", "secret", "s2"]);
    assert!(ok, "delete through kcache: {err}");
    let _ = watch.kill();
    let _ = watch.wait();

    // The watch was served by kcache's cache (one upstream watch for the namespace key).
    let keys = k.debug_keys().await;
    let listed: Vec<&str> = keys["keys"]
        .as_array()
        .expect("keys")
        .iter()
        .filter_map(|e| e["key"].as_str())
        .collect();
    assert!(listed.contains(&"/api/v1/namespaces/kc/secrets"), "{keys}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serves_https_with_http2_and_a_provided_certificate() {
    let cluster = TestCluster::start().await;
    let dir = cluster.dir_path().to_path_buf();
    // A CA and a serving certificate for 127.0.0.1 signed by it.
    support::openssl(
        &dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "ca.key",
            "-out",
            "ca.crt",
            "-days",
            "1",
            "-subj",
            "/CN=kcache-test-ca",
        ],
    );
    support::openssl(
        &dir,
        &[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "srv.key",
            "-out",
            "srv.csr",
            "-subj",
            "/CN=kcache",
        ],
    );
    std::fs::write(
        dir.join("ext.cnf"),
        "subjectAltName=IP:127.0.0.1,DNS:localhost\n",
    )
    .expect("ext");
    support::openssl(
        &dir,
        &[
            "x509",
            "-req",
            "-in",
            "srv.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "srv.crt",
            "-days",
            "1",
            "-extfile",
            "ext.cnf",
        ],
    );
    let cert = dir.join("srv.crt").display().to_string();
    let key = dir.join("srv.key").display().to_string();
    let k = Kcache::start_with_args(
        &cluster,
        "",
        &["--tls-cert-file", &cert, "--tls-private-key-file", &key],
    )
    .await;
    let ca = dir.join("ca.crt").display().to_string();
    // kubectl verifying kcache's certificate against the CA.
    let out = support::kubectl_command()
        .args([
            "--server",
            &k.url,
            "--certificate-authority",
            &ca,
            "--token",
            "admintoken",
            "get",
            "namespaces",
        ])
        .env("KUBECONFIG", "/dev/null")
        .output()
        .expect("kubectl");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("default"));
    // curl negotiates HTTP/2 through ALPN.
    let out = Command::new("curl")
        .args([
            "-sS",
            "--http2",
            "-v",
            "--cacert",
            &ca,
            "-H",
            "Authorization: Bearer admintoken",
        ])
        .arg(format!("{}/api/v1/namespaces?resourceVersion=0", k.url))
        .output()
        .expect("curl");
    let verbose = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{verbose}");
    assert!(verbose.contains("HTTP/2 200"), "{verbose}");
}
