//! Real servers for black-box tests: etcd + kube-apiserver of the reference Kubernetes
//! version (`scripts/k8s/versions.env`) on free loopback ports (binaries from
//! `$KCACHE_K8S_BIN`, else what the project's `scripts/k8s/build.sh` prints), and kcache
//! itself ([`kcache::Kcache`]). Every test starts its own; nothing is mocked.
//!
//! The API server runs with `--authorization-mode=Node,RBAC` and these identities:
//!
//! | credential | user | groups |
//! |---|---|---|
//! | `admintoken` ([`ADMIN_TOKEN`]) | admin | system:masters |
//! | `viewertoken` | viewer (no RBAC bindings) | |
//! | `nobodytoken` | nobody (no RBAC bindings) | |
//! | `node1token` | system:node:node1 | system:nodes |
//! | `node2token` | system:node:node2 | system:nodes |
//! | client certificates signed by [`TestCluster::client_ca`] | CN | O |
//!
//! Logs (`etcd.log`, `apiserver.log`) stay in the cluster's temp dir, which is removed on
//! drop unless `KCACHE_KEEP_TEST_DIRS` is set.

#![allow(dead_code)]

pub mod http;
pub mod judge;
pub mod kcache;
pub mod nats;
pub mod nats_cluster;
pub mod nats_conf;
pub mod prom;
pub mod rng;

use std::collections::HashSet;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The cluster-admin token (user `admin`, group `system:masters`).
pub const ADMIN_TOKEN: &str = "admintoken";

const TOKENS_CSV: &str = "\
admintoken,admin,admin-uid,\"system:masters\"
viewertoken,viewer,viewer-uid
nobodytoken,nobody,nobody-uid
node1token,system:node:node1,node1-uid,\"system:nodes\"
node2token,system:node:node2,node2-uid,\"system:nodes\"
";

/// How long etcd and the API server may take to become ready. A cold start takes ~5 s on
/// an idle machine; the margin is for loaded CI machines running tests side by side.
const READY_TIMEOUT: Duration = Duration::from_secs(90);

/// A port that was free a moment ago (bound, read, released).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("bind an ephemeral loopback port")
}

/// `n` distinct ports that were free a moment ago: each is held until all are picked, so
/// no two are the same (a NATS cluster's six ports, picked one by one, once held the same
/// port twice and a node could not listen).
pub fn free_ports(n: usize) -> Vec<u16> {
    let held: Vec<std::net::TcpListener> = (0..n)
        .map(|_| {
            std::net::TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral loopback port")
        })
        .collect();
    held.iter()
        .map(|l| l.local_addr().expect("a bound port").port())
        .collect()
}

/// The directory holding `kube-apiserver`, `kubectl` and `etcd`: `$KCACHE_K8S_BIN`, else the
/// last line printed by `scripts/k8s/build.sh` (which builds the reference version from Go
/// modules on first use).
pub fn bin_dir() -> PathBuf {
    std::env::var_os("KCACHE_K8S_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| built_by("scripts/k8s/build.sh"))
}

/// Runs a build script of the workspace (idempotent: it builds on first use only) and
/// returns the directory it prints on its last line.
fn built_by(script: &str) -> PathBuf {
    let script = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("services/ has a parent (the workspace root)")
        .join(script);
    let out = Command::new("bash")
        .arg(&script)
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", script.display()));
    assert!(
        out.status.success(),
        "{} failed ({})",
        script.display(),
        out.status
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout
        .lines()
        .map(str::trim)
        .rfind(|l| !l.is_empty())
        .unwrap_or_else(|| panic!("{} prints the bin dir on its last line", script.display()));
    PathBuf::from(line)
}

/// A `helm` command of the pinned version, built from its Go module: in `$KCACHE_HELM_BIN`
/// when set, else as `scripts/k8s/build-helm.sh` builds it.
pub fn helm_command() -> Command {
    let dir = std::env::var_os("KCACHE_HELM_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| built_by("scripts/k8s/build-helm.sh"));
    Command::new(dir.join("helm"))
}

/// One of kcache's Go judges built by `scripts/k8s/build-programs.sh` (`kcache-e2e.test`,
/// `kcache-pb-informer`, `kcache-informer`): beside `$KCACHE_E2E_TEST` when set, else
/// beside the API server ([`bin_dir`]).
pub fn judge_bin(name: &str) -> PathBuf {
    let path = std::env::var_os("KCACHE_E2E_TEST")
        .map(PathBuf::from)
        .and_then(|p| p.parent().map(|d| d.join(name)))
        .unwrap_or_else(|| bin_dir().join(name));
    assert!(
        path.is_file(),
        "no {name} at {} (scripts/k8s/build-programs.sh builds it)",
        path.display()
    );
    path
}

/// A `kubectl` command of the reference version (beside the API server in [`bin_dir`]),
/// not whatever other kubectl the machine has.
pub fn kubectl_command() -> Command {
    Command::new(bin_dir().join("kubectl"))
}

/// Runs openssl with `args` in `dir`; panics with openssl's stderr on failure.
/// A self-signed P-256 certificate and its key, written as `files` (key, certificate) in
/// `dir`; `extra` goes to `openssl req` as is (e.g. `-addext subjectAltName=…`).
pub fn self_signed_ec(dir: &Path, files: (&str, &str), days: u32, subject: &str, extra: &[&str]) {
    let days = days.to_string();
    let mut args = vec![
        "req",
        "-x509",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
        "-keyout",
        files.0,
        "-out",
        files.1,
        "-days",
        &days,
        "-subj",
        subject,
    ];
    args.extend_from_slice(extra);
    openssl(dir, &args);
}

pub fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .current_dir(dir)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run openssl (is it installed?)");
    assert!(
        out.status.success(),
        "openssl {args:?} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The last `n` lines of `path` (empty when unreadable).
fn tail(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Established TCP connections process `pid` holds to remote `port`: its socket inodes
/// (`/proc/<pid>/fd`) matched against `/proc/net/tcp{,6}` (state 01 = ESTABLISHED).
pub fn tcp_connections_to(pid: u32, port: u16) -> usize {
    let inodes: HashSet<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| {
            d.filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
                .filter_map(|l| {
                    let l = l.to_string_lossy().into_owned();
                    let inode = l.strip_prefix("socket:[")?.strip_suffix(']')?;
                    Some(inode.to_string())
                })
                .collect()
        })
        .unwrap_or_default();
    let mut n = 0;
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let text = std::fs::read_to_string(table).unwrap_or_default();
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() < 10 || f[3] != "01" || !inodes.contains(f[9]) {
                continue;
            }
            let remote_port = f[2]
                .rsplit(':')
                .next()
                .and_then(|p| u16::from_str_radix(p, 16).ok());
            if remote_port == Some(port) {
                n += 1;
            }
        }
    }
    n
}

/// A throw-away etcd + kube-apiserver. Dropping it kills both.
pub struct TestCluster {
    /// `https://127.0.0.1:<port>` (self-signed serving certificate).
    pub url: String,
    /// Holds the logs, tokens, keys and etcd's data.
    pub dir: tempfile::TempDir,
    /// kubeconfig for the admin token, skipping server certificate verification.
    pub kubeconfig: PathBuf,
    /// [`ADMIN_TOKEN`].
    pub admin_token: &'static str,
    /// The API server's `--client-ca-file` (PEM); its key is `client_ca_key`.
    pub client_ca: PathBuf,
    pub client_ca_key: PathBuf,
    bin: PathBuf,
    port: u16,
    etcd_url: String,
    etcd: Option<Child>,
    apiserver: Option<Child>,
    /// Extra kube-apiserver flags ([`TestCluster::start_with_args`]).
    extra_args: Vec<String>,
}

impl TestCluster {
    /// Starts etcd and kube-apiserver on free ports and waits until `/readyz` answers 200.
    pub async fn start() -> TestCluster {
        Self::start_with_args(&[]).await
    }

    /// As [`TestCluster::start`], with extra kube-apiserver flags (e.g.
    /// `--anonymous-auth=false`).
    pub async fn start_with_args(args: &[&str]) -> TestCluster {
        let bin = bin_dir();
        for exe in ["etcd", "kube-apiserver"] {
            assert!(
                bin.join(exe).is_file(),
                "no {exe} in {} (set KCACHE_K8S_BIN or run scripts/k8s/build.sh)",
                bin.display()
            );
        }
        let dir = tempfile::Builder::new()
            .prefix("kcache-test-")
            .tempdir()
            .expect("create the test cluster's temp dir");
        let d = dir.path().to_path_buf();
        let (etcd_port, peer_port, port) = (free_port(), free_port(), free_port());
        let url = format!("https://127.0.0.1:{port}");
        let kubeconfig = d.join("kubeconfig");
        let pki = d.join("pki");
        std::fs::create_dir(&pki).expect("create pki dir");
        let mut cluster = TestCluster {
            url,
            kubeconfig,
            admin_token: ADMIN_TOKEN,
            client_ca: pki.join("ca.crt"),
            client_ca_key: pki.join("ca.key"),
            bin,
            port,
            etcd_url: format!("http://127.0.0.1:{etcd_port}"),
            etcd: None,
            apiserver: None,
            extra_args: args.iter().map(|a| a.to_string()).collect(),
            dir,
        };
        // From here on a panic drops `cluster`, which kills whatever was started.
        cluster.start_etcd(peer_port);
        cluster.write_credentials();
        cluster.wait_etcd().await;
        cluster.start_apiserver_on_a_free_port().await;
        cluster
    }

    /// The API server's port.
    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn dir_path(&self) -> &Path {
        self.dir.path()
    }

    /// The last 30 lines of a log in the cluster dir (e.g. `"apiserver.log"`).
    pub fn log_tail(&self, file: &str) -> String {
        tail(&self.dir.path().join(file), 30)
    }

    fn start_etcd(&mut self, peer_port: u16) {
        let d = self.dir.path();
        let log = std::fs::File::create(d.join("etcd.log")).expect("create etcd.log");
        let peer = format!("http://127.0.0.1:{peer_port}");
        let child = Command::new(self.bin.join("etcd"))
            .arg("--data-dir")
            .arg(d.join("etcd"))
            .args(["--listen-client-urls", &self.etcd_url])
            .args(["--advertise-client-urls", &self.etcd_url])
            .args(["--listen-peer-urls", &peer])
            .args(["--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &format!("default={peer}")])
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("clone etcd.log handle"))
            .stderr(log)
            .spawn()
            .expect("spawn etcd");
        self.etcd = Some(child);
    }

    /// tokens.csv, the service-account key pair, the client CA, and the kubeconfig.
    fn write_credentials(&self) {
        let d = self.dir.path();
        std::fs::write(d.join("tokens.csv"), TOKENS_CSV).expect("write tokens.csv");
        // The service-account signing key must be RSA (tokens are signed RS256).
        openssl(d, &["genrsa", "-out", "sa.key", "2048"]);
        openssl(d, &["rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub"]);
        self_signed_ec(
            &d.join("pki"),
            ("ca.key", "ca.crt"),
            30,
            "/CN=kcache-test-client-ca",
            &[],
        );
        self.write_kubeconfig();
    }

    /// The admin kubeconfig for the API server's URL (written again if its port moves).
    fn write_kubeconfig(&self) {
        std::fs::write(
            &self.kubeconfig,
            format!(
                "apiVersion: v1\n\
                 kind: Config\n\
                 clusters:\n\
                 - name: test\n  cluster: {{server: \"{url}\", insecure-skip-tls-verify: true}}\n\
                 users:\n\
                 - name: admin\n  user: {{token: {ADMIN_TOKEN}}}\n\
                 contexts:\n\
                 - name: test\n  context: {{cluster: test, user: admin}}\n\
                 current-context: test\n",
                url = self.url
            ),
        )
        .expect("write kubeconfig");
    }

    /// Issues a client certificate signed by [`TestCluster::client_ca`] (so the API server
    /// authenticates it as user `cn` in `groups`); returns (certificate, key) PEM paths.
    pub fn issue_client_cert(&self, name: &str, cn: &str, groups: &[&str]) -> (PathBuf, PathBuf) {
        let subject: String = groups
            .iter()
            .map(|g| format!("/O={g}"))
            .chain([format!("/CN={cn}")])
            .collect();
        self.issue_client_cert_with_subject(name, &subject)
    }

    /// As [`TestCluster::issue_client_cert`], with the subject as `openssl req -subj` takes
    /// it (`/CN=a/O=b/k8sUID=c`, in order; `k8sUID` is Kubernetes' user UID attribute,
    /// 1.3.6.1.4.1.57683.2).
    pub fn issue_client_cert_with_subject(&self, name: &str, subject: &str) -> (PathBuf, PathBuf) {
        let pki = self.dir.path().join("pki");
        let req_cnf = pki.join("req.cnf");
        if !req_cnf.exists() {
            std::fs::write(
                &req_cnf,
                "oid_section = oids\n[oids]\nk8sUID = 1.3.6.1.4.1.57683.2\n[req]\ndistinguished_name = dn\n[dn]\n",
            )
            .expect("write req.cnf");
        }
        let ext = pki.join("client.ext");
        if !ext.exists() {
            std::fs::write(
                &ext,
                "basicConstraints=CA:FALSE\nkeyUsage=digitalSignature\nextendedKeyUsage=clientAuth\n",
            )
            .expect("write client.ext");
        }
        let (crt, key, csr) = (
            format!("{name}.crt"),
            format!("{name}.key"),
            format!("{name}.csr"),
        );
        openssl(
            &pki,
            &[
                "req",
                "-config",
                "req.cnf",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:prime256v1",
                "-nodes",
                "-keyout",
                &key,
                "-out",
                &csr,
                "-subj",
                subject,
            ],
        );
        openssl(
            &pki,
            &[
                "x509",
                "-req",
                "-in",
                &csr,
                "-CA",
                "ca.crt",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-days",
                "30",
                "-extfile",
                "client.ext",
                "-out",
                &crt,
            ],
        );
        (pki.join(crt), pki.join(key))
    }

    async fn wait_etcd(&mut self) {
        let http = insecure_http_within(Duration::from_secs(5));
        let health = format!("{}/health", self.etcd_url);
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if let Ok(r) = http.get(&health).send().await {
                if r.status().is_success() {
                    return;
                }
            }
            if let Some(Ok(Some(status))) = self.etcd.as_mut().map(Child::try_wait) {
                panic!("etcd exited ({status}):\n{}", self.log_tail("etcd.log"));
            }
            assert!(
                Instant::now() < deadline,
                "etcd not healthy in {READY_TIMEOUT:?}:\n{}",
                self.log_tail("etcd.log")
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Starts kube-apiserver on this cluster's port and etcd (after [`Self::kill_apiserver`],
    /// a restart) and waits until `/readyz` answers 200. Its log is appended to
    /// `apiserver.log`.
    /// The first start: the port was free when picked, but another process (a parallel
    /// test's, a build's) may bind it first; then the API server exits at once, and it is
    /// started again on another port. Restarts keep their port (`start_apiserver`).
    async fn start_apiserver_on_a_free_port(&mut self) {
        for attempt in 0..4 {
            self.spawn_apiserver();
            match self.apiserver_ready().await {
                Ok(()) => return,
                Err(log) if attempt < 3 && log.contains("address already in use") => {
                    self.apiserver = None;
                    self.port = free_port();
                    self.url = format!("https://127.0.0.1:{}", self.port);
                    self.write_kubeconfig();
                }
                Err(log) => panic!("{log}"),
            }
        }
    }

    pub async fn start_apiserver(&mut self) {
        self.spawn_apiserver();
        if let Err(why) = self.apiserver_ready().await {
            panic!("{why}");
        }
    }

    fn spawn_apiserver(&mut self) {
        assert!(
            self.apiserver.is_none(),
            "kube-apiserver is already running"
        );
        let d = self.dir.path();
        let path = |name: &str| d.join(name).display().to_string();
        let mut log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(d.join("apiserver.log"))
            .expect("open apiserver.log");
        {
            use std::io::Write;
            writeln!(log, "=== kcache tests: starting kube-apiserver")
                .expect("write apiserver.log");
        }
        let child = Command::new(self.bin.join("kube-apiserver"))
            .arg(format!("--etcd-servers={}", self.etcd_url))
            .arg("--bind-address=127.0.0.1")
            .arg("--advertise-address=127.0.0.1")
            .arg(format!("--secure-port={}", self.port))
            .arg(format!("--cert-dir={}", path("certs")))
            .arg(format!("--token-auth-file={}", path("tokens.csv")))
            .arg(format!("--client-ca-file={}", self.client_ca.display()))
            .arg("--authorization-mode=Node,RBAC")
            .arg("--service-account-issuer=https://kubernetes.default.svc")
            .arg(format!("--service-account-key-file={}", path("sa.pub")))
            .arg(format!(
                "--service-account-signing-key-file={}",
                path("sa.key")
            ))
            .arg("--service-cluster-ip-range=10.0.0.0/24")
            // Since 1.2x the endpoint reconciler refuses a loopback advertise address; the
            // rig has no other, and nothing reaches the API server through the kubernetes
            // Service.
            .arg("--endpoint-reconciler-type=none")
            .args(&self.extra_args)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("clone apiserver.log handle"))
            .stderr(log)
            .spawn()
            .expect("spawn kube-apiserver");
        self.apiserver = Some(child);
    }

    /// Waits for `/readyz`; why not, when the API server exited or did not get ready.
    async fn apiserver_ready(&mut self) -> Result<(), String> {
        let http = insecure_http_within(Duration::from_secs(5));
        let readyz = format!("{}/readyz", self.url);
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if let Ok(r) = http.get(&readyz).bearer_auth(ADMIN_TOKEN).send().await {
                if r.status().is_success() {
                    return Ok(());
                }
            }
            if let Some(Ok(Some(status))) = self.apiserver.as_mut().map(Child::try_wait) {
                return Err(format!(
                    "kube-apiserver exited ({status}):\n{}",
                    self.log_tail("apiserver.log")
                ));
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "kube-apiserver not ready in {READY_TIMEOUT:?}:\n{}",
                    self.log_tail("apiserver.log")
                ));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// `kill -9` of the API server; etcd keeps running.
    pub fn kill_apiserver(&mut self) {
        if let Some(mut child) = self.apiserver.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// `kill -9` of the API server, then a new one on the same port and etcd; returns once
    /// it is ready.
    pub async fn restart_apiserver(&mut self) {
        self.kill_apiserver();
        self.start_apiserver().await;
    }

    /// A kube-rs config for the admin token, accepting the self-signed certificate.
    pub fn kube_client_config(&self) -> kube::Config {
        let mut cfg = kube::Config::new(self.url.parse().expect("cluster url is a URI"));
        cfg.accept_invalid_certs = true;
        cfg.auth_info.token = Some(secrecy::SecretString::new(ADMIN_TOKEN.into()));
        cfg
    }

    pub async fn kube_client(&self) -> kube::Client {
        kube::Client::try_from(self.kube_client_config()).expect("build the admin kube client")
    }

    /// The API server's `/metrics` (read as admin).
    pub async fn metrics_text(&self) -> String {
        let resp = insecure_http()
            .get(format!("{}/metrics", self.url))
            .bearer_auth(ADMIN_TOKEN)
            .send()
            .await
            .expect("GET the API server's /metrics");
        assert!(
            resp.status().is_success(),
            "GET /metrics: {}",
            resp.status()
        );
        resp.text().await.expect("read /metrics")
    }

    /// How many watches of `resource` (e.g. `"secrets"`) the API server is serving: the sum of
    /// its `apiserver_longrunning_requests{verb="WATCH",resource="<resource>"}` gauges.
    /// (`apiserver_registered_watchers`, which 1.20 exported by kind, was removed in 1.25: a
    /// modern server reads 0 there, and a "no more watches than before" check on it would
    /// pass without testing anything. Tests that count pair this with a step that must
    /// move the count, so a series that stopped existing fails them.)
    pub async fn upstream_watches(&self, resource: &str) -> u64 {
        let text = self.metrics_text().await;
        upstream_watches_in(&text, resource)
    }
}

/// [`TestCluster::upstream_watches`] read from a `/metrics` text.
pub fn upstream_watches_in(text: &str, resource: &str) -> u64 {
    prom::sum(
        text,
        "apiserver_longrunning_requests",
        &[
            ("verb", "WATCH"),
            ("resource", resource),
            ("subresource", ""),
        ],
    ) as u64
}

/// How many `verb` requests (e.g. `"LIST"`) of `resource` the API server has completed: the
/// sum of its `apiserver_request_total` counters for them, from a `/metrics` text.
pub fn api_requests_in(text: &str, verb: &str, resource: &str) -> u64 {
    prom::sum(
        text,
        "apiserver_request_total",
        &[("verb", verb), ("resource", resource), ("subresource", "")],
    ) as u64
}

impl Drop for TestCluster {
    fn drop(&mut self) {
        self.kill_apiserver();
        if let Some(mut etcd) = self.etcd.take() {
            let _ = etcd.kill();
            let _ = etcd.wait();
        }
        if std::env::var_os("KCACHE_KEEP_TEST_DIRS").is_some() {
            self.dir.disable_cleanup(true);
            // Straight to stderr: libtest captures eprintln! of passing tests.
            use std::io::Write;
            let _ = writeln!(
                std::io::stderr(),
                "kept test cluster dir {}",
                self.dir.path().display()
            );
        }
    }
}

/// An HTTP client for self-signed test servers (the API server's and kcache's). No
/// request timeout: watches use it.
/// POSTs `body` to `path` on the API server as admin and returns what it answered (the
/// created object; `Null` if that is not JSON); panics with the answer unless it is a
/// success.
pub async fn create_as_admin(
    cluster: &TestCluster,
    path: &str,
    body: serde_json::Value,
) -> serde_json::Value {
    let resp = insecure_http()
        .post(format!("{}{}", cluster.url, path))
        .bearer_auth(ADMIN_TOKEN)
        .json(&body)
        .send()
        .await
        .expect("create");
    let status = resp.status();
    let text = resp.text().await.unwrap_or_default();
    assert!(status.is_success(), "create {path}: {status} {text}");
    serde_json::from_str(&text).unwrap_or(serde_json::Value::Null)
}

/// The tests' client: the test certificates are not verified.
pub fn insecure_http() -> reqwest::Client {
    reqwest::Client::builder()
        .danger_accept_invalid_certs(true)
        .build()
        .expect("build an HTTP client")
}

/// [`insecure_http`] speaking HTTP/1.1 only (a WebSocket handshake is an HTTP/1.1
/// upgrade; an HTTP/1.1 server drops a request's handler when its connection closes).
pub fn insecure_http1() -> reqwest::Client {
    reqwest::Client::builder()
        .danger_accept_invalid_certs(true)
        .http1_only()
        .build()
        .expect("build an HTTP/1.1 client")
}

/// [`insecure_http`] whose requests give up after `timeout`.
pub fn insecure_http_within(timeout: Duration) -> reqwest::Client {
    reqwest::Client::builder()
        .danger_accept_invalid_certs(true)
        .timeout(timeout)
        .build()
        .expect("build an HTTP client")
}

/// Polls `f` (every 100 ms) until it returns true; panics naming `what` after `timeout`.
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
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for: {what}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Creates a namespace through `client`.
pub async fn create_namespace(client: &kube::Client, name: &str) {
    use k8s_openapi::api::core::v1::Namespace;
    let api: kube::Api<Namespace> = kube::Api::all(client.clone());
    let ns: Namespace = serde_json::from_value(serde_json::json!({"metadata": {"name": name}}))
        .expect("a Namespace object");
    api.create(&Default::default(), &ns)
        .await
        .unwrap_or_else(|e| panic!("create namespace {name}: {e}"));
}

/// Merge-patches `stringData.v` of Secrets `s0`..`s{n-1}` in `namespace` to `value(i)`.
pub async fn update_secrets(
    client: &kube::Client,
    namespace: &str,
    n: usize,
    value: impl Fn(usize) -> String,
) {
    use k8s_openapi::api::core::v1::Secret;
    let api: kube::Api<Secret> = kube::Api::namespaced(client.clone(), namespace);
    for i in 0..n {
        let patch = serde_json::json!({"stringData": {"v": value(i)}});
        api.patch(
            &format!("s{i}"),
            &Default::default(),
            &kube::api::Patch::Merge(&patch),
        )
        .await
        .unwrap_or_else(|e| panic!("update secret {namespace}/s{i}: {e}"));
    }
}

/// Reads a watch response, calling `f` with each JSON event line (blank keepalive lines
/// and anything not JSON are skipped) until the stream ends or `f` returns false (which
/// drops, so closes, the stream).
pub async fn for_each_event(resp: reqwest::Response, mut f: impl FnMut(serde_json::Value) -> bool) {
    use futures::StreamExt;
    let mut body = resp.bytes_stream();
    let mut pending: Vec<u8> = Vec::new();
    while let Some(Ok(chunk)) = body.next().await {
        pending.extend_from_slice(&chunk);
        while let Some(newline) = pending.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = pending.drain(..=newline).collect();
            let Ok(event) = serde_json::from_slice::<serde_json::Value>(&line) else {
                continue;
            };
            if !f(event) {
                return;
            }
        }
    }
}

/// The events of a watch response on a channel, forwarded as they arrive. The channel
/// closes when the stream ends; dropping the receiver closes the stream.
pub fn event_channel(
    resp: reqwest::Response,
) -> tokio::sync::mpsc::UnboundedReceiver<serde_json::Value> {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let closed = tx.clone();
    tokio::spawn(async move {
        tokio::select! {
            _ = for_each_event(resp, move |event| tx.send(event).is_ok()) => {}
            _ = closed.closed() => {}
        }
    });
    rx
}
