//! Real servers for black-box tests: etcd + kube-apiserver v1.20.2 on free loopback ports
//! (binaries from the project's `scripts/install-kube-apiserver.sh`), and kcache itself
//! ([`kcache::Kcache`]). Every test binary starts its own; nothing is mocked.

#![allow(dead_code)]

pub mod kcache;

use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub const ADMIN_TOKEN: &str = "admintoken";

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

/// The directory holding `kube-apiserver` and `etcd`: `$KCACHE_K8S_BIN`, else what the
/// install script prints (it builds them on first use).
fn bin_dir() -> PathBuf {
    if let Ok(dir) = std::env::var("KCACHE_K8S_BIN") {
        return PathBuf::from(dir);
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/install-kube-apiserver.sh");
    let out = Command::new("bash")
        .arg(&script)
        .stderr(Stdio::inherit())
        .output()
        .expect("run scripts/install-kube-apiserver.sh");
    assert!(out.status.success(), "install-kube-apiserver.sh failed");
    let text = String::from_utf8_lossy(&out.stdout);
    PathBuf::from(text.lines().last().expect("bin dir line").trim())
}

pub struct TestCluster {
    pub url: String,
    pub kubeconfig: PathBuf,
    dir: tempfile::TempDir,
    bin: PathBuf,
    etcd: Child,
    apiserver: Option<Child>,
    etcd_url: String,
    port: u16,
}

impl TestCluster {
    pub async fn start() -> TestCluster {
        let bin = bin_dir();
        let dir = tempfile::Builder::new()
            .prefix("kcache-test-")
            .tempdir()
            .expect("temp dir");
        let d = dir.path();
        let (ep, pp, ap) = (free_port(), free_port(), free_port());
        let etcd_url = format!("http://127.0.0.1:{ep}");
        let etcd = Command::new(bin.join("etcd"))
            .arg("--data-dir")
            .arg(d.join("etcd"))
            .args([
                "--listen-client-urls",
                &etcd_url,
                "--advertise-client-urls",
                &etcd_url,
            ])
            .args(["--listen-peer-urls", &format!("http://127.0.0.1:{pp}")])
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(d.join("etcd.log")).expect("etcd log"))
            .spawn()
            .expect("start etcd");
        let ok = Command::new("openssl")
            .args(["genrsa", "-out"])
            .arg(d.join("sa.key"))
            .arg("2048")
            .stderr(Stdio::null())
            .status()
            .expect("openssl")
            .success()
            && Command::new("openssl")
                .args(["rsa", "-in"])
                .arg(d.join("sa.key"))
                .args(["-pubout", "-out"])
                .arg(d.join("sa.pub"))
                .stderr(Stdio::null())
                .status()
                .expect("openssl")
                .success();
        assert!(ok, "generating the service-account key");
        std::fs::write(
            d.join("tokens.csv"),
            "admintoken,admin,admin-uid,\"system:masters\"\nviewertoken,viewer,viewer-uid\nnobodytoken,nobody,nobody-uid\nnode1token,system:node:node1,node1-uid,\"system:nodes\"\n",
        )
        .expect("tokens.csv");
        let url = format!("https://127.0.0.1:{ap}");
        let kubeconfig = d.join("kubeconfig");
        std::fs::write(
            &kubeconfig,
            format!(
                "apiVersion: v1\nkind: Config\nclusters: [{{name: test, cluster: {{server: \"{url}\", insecure-skip-tls-verify: true}}}}]\nusers: [{{name: admin, user: {{token: {ADMIN_TOKEN}}}}}]\ncontexts: [{{name: test, context: {{cluster: test, user: admin}}}}]\ncurrent-context: test\n"
            ),
        )
        .expect("kubeconfig");
        let mut c = TestCluster {
            url,
            kubeconfig,
            dir,
            bin,
            etcd,
            apiserver: None,
            etcd_url,
            port: ap,
        };
        c.wait_etcd().await;
        c.start_apiserver().await;
        c
    }

    pub fn dir_path(&self) -> &Path {
        self.dir.path()
    }

    async fn wait_etcd(&mut self) {
        let http = reqwest::Client::new();
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if let Ok(r) = http.get(format!("{}/health", self.etcd_url)).send().await {
                if r.status().is_success() {
                    return;
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("etcd not healthy in 30 s");
    }

    /// Starts kube-apiserver (again) on the same port and etcd, and waits for /readyz.
    pub async fn start_apiserver(&mut self) {
        let d = self.dir.path();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(d.join("apiserver.log"))
            .expect("apiserver log");
        let child = Command::new(self.bin.join("kube-apiserver"))
            .arg(format!("--etcd-servers={}", self.etcd_url))
            .args([
                "--bind-address=127.0.0.1",
                &format!("--secure-port={}", self.port),
            ])
            .arg(format!("--cert-dir={}", d.join("certs").display()))
            .arg(format!(
                "--token-auth-file={}",
                d.join("tokens.csv").display()
            ))
            .arg("--service-account-issuer=https://kubernetes.default.svc")
            .arg(format!(
                "--service-account-key-file={}",
                d.join("sa.pub").display()
            ))
            .arg(format!(
                "--service-account-signing-key-file={}",
                d.join("sa.key").display()
            ))
            .args([
                "--authorization-mode=Node,RBAC",
                "--service-cluster-ip-range=10.0.0.0/24",
                "--advertise-address=127.0.0.1",
            ])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start kube-apiserver");
        self.apiserver = Some(child);
        let http = insecure_http();
        let deadline = Instant::now() + Duration::from_secs(90);
        loop {
            if let Ok(r) = http
                .get(format!("{}/readyz", self.url))
                .bearer_auth(ADMIN_TOKEN)
                .send()
                .await
            {
                if r.status().is_success() {
                    return;
                }
            }
            if let Some(Ok(Some(status))) = self.apiserver.as_mut().map(Child::try_wait) {
                panic!(
                    "kube-apiserver exited ({status}):\n{}",
                    self.log_tail("apiserver.log")
                );
            }
            assert!(
                Instant::now() < deadline,
                "kube-apiserver not ready in 90 s:\n{}",
                self.log_tail("apiserver.log")
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// kill -9 of the API server (etcd keeps running).
    pub fn kill_apiserver(&mut self) {
        if let Some(mut c) = self.apiserver.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    pub async fn restart_apiserver(&mut self) {
        self.kill_apiserver();
        self.start_apiserver().await;
    }

    pub fn log_tail(&self, file: &str) -> String {
        let text = std::fs::read_to_string(self.dir.path().join(file)).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }

    pub fn kube_client_config(&self) -> kube::Config {
        let mut cfg = kube::Config::new(self.url.parse().expect("cluster url"));
        cfg.accept_invalid_certs = true;
        cfg.auth_info.token = Some(secrecy::SecretString::new(ADMIN_TOKEN.into()));
        cfg
    }

    pub async fn kube_client(&self) -> kube::Client {
        kube::Client::try_from(self.kube_client_config()).expect("admin kube client")
    }

    /// Sum of the API server's `apiserver_registered_watchers` for `kind`.
    pub async fn registered_watchers(&self, kind: &str) -> u64 {
        let text = insecure_http()
            .get(format!("{}/metrics", self.url))
            .bearer_auth(ADMIN_TOKEN)
            .send()
            .await
            .expect("GET /metrics")
            .text()
            .await
            .expect("metrics text");
        kcache::sum_samples(
            &text,
            "apiserver_registered_watchers",
            Some(&format!("kind=\"{kind}\"")),
        ) as u64
    }
}

impl Drop for TestCluster {
    fn drop(&mut self) {
        self.kill_apiserver();
        let _ = self.etcd.kill();
        let _ = self.etcd.wait();
        if std::env::var_os("KCACHE_KEEP_TEST_DIRS").is_some() {
            let path = std::mem::replace(
                &mut self.dir,
                tempfile::tempdir().expect("placeholder temp dir"),
            )
            .keep();
            eprintln!("kept test dir {}", path.display());
        }
    }
}

/// An HTTP client for self-signed test servers (the API server's and kcache's).
pub fn insecure_http() -> reqwest::Client {
    reqwest::Client::builder()
        .danger_accept_invalid_certs(true)
        .build()
        .expect("http client")
}

/// Polls `f` until it is true; panics naming `what` after `timeout`.
pub async fn eventually<F, Fut>(what: &str, timeout: Duration, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if f().await {
            return;
        }
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Creates a namespace through the API server.
pub async fn create_namespace(client: &kube::Client, name: &str) {
    use k8s_openapi::api::core::v1::Namespace;
    let api: kube::Api<Namespace> = kube::Api::all(client.clone());
    let obj: Namespace = serde_json::from_value(serde_json::json!({"metadata": {"name": name}}))
        .expect("namespace object");
    api.create(&Default::default(), &obj)
        .await
        .expect("create namespace");
}

/// Reads a watch response, calling `f` with each JSON event line (blank keepalive lines
/// are skipped) until the stream ends or `f` returns false (which closes the stream).
pub async fn for_each_event(resp: reqwest::Response, mut f: impl FnMut(serde_json::Value) -> bool) {
    use futures::StreamExt;
    let mut stream = resp.bytes_stream();
    let mut buf = Vec::new();
    while let Some(Ok(chunk)) = stream.next().await {
        buf.extend_from_slice(&chunk);
        while let Some(pos) = buf.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = buf.drain(..=pos).collect();
            if let Ok(v) = serde_json::from_slice(&line) {
                if !f(v) {
                    return;
                }
            }
        }
    }
}

/// The events of a watch response on a channel, forwarded as they arrive; the channel
/// closes when the stream ends.
pub fn event_channel(
    resp: reqwest::Response,
) -> tokio::sync::mpsc::UnboundedReceiver<serde_json::Value> {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let gone = tx.clone();
    tokio::spawn(async move {
        // Dropping the reader (when the receiver is dropped) closes the HTTP stream.
        tokio::select! {
            _ = for_each_event(resp, move |v| tx.send(v).is_ok()) => {}
            _ = gone.closed() => {}
        }
    });
    rx
}

/// Runs openssl with `args` in `dir` (test certificates).
pub fn openssl(dir: &Path, args: &[&str]) {
    let ok = Command::new("openssl")
        .current_dir(dir)
        .args(args)
        .stderr(Stdio::null())
        .status()
        .expect("openssl")
        .success();
    assert!(ok, "openssl {args:?}");
}
