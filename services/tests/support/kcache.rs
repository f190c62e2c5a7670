//! Starts the real `kcache` binary against a test cluster, on a free loopback port, and
//! reads its admin endpoints.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::TestCluster;

pub struct Kcache {
    pub url: String,
    /// Where `/livez`, `/readyz`, `/metrics` and `/debug/keys` are: `url`, or the
    /// `--admin-listen` address ([`Kcache::start_with_admin_port`]).
    pub admin_url: String,
    pub log: PathBuf,
    child: Child,
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

impl Kcache {
    /// Starts kcache with the default config plus `extra_toml` (merged by sections: pass
    /// whole `[cache]` etc. sections), and waits for `/readyz`.
    pub async fn start(cluster: &TestCluster, extra_toml: &str) -> Kcache {
        Self::start_with_args(cluster, extra_toml, &[]).await
    }

    /// As [`Kcache::start`], with extra command-line arguments.
    pub async fn start_with_args(cluster: &TestCluster, extra_toml: &str, args: &[&str]) -> Kcache {
        Self::spawn(cluster, &cluster.kubeconfig, extra_toml, args, false).await
    }

    /// As [`Kcache::start_with_args`], with its own upstream identity (a kubeconfig other
    /// than the cluster's admin one).
    pub async fn start_with_kubeconfig(
        cluster: &TestCluster,
        kubeconfig: &std::path::Path,
        extra_toml: &str,
        args: &[&str],
    ) -> Kcache {
        Self::spawn(cluster, kubeconfig, extra_toml, args, false).await
    }

    /// As [`Kcache::start_with_kubeconfig`], with the admin endpoints on a port of their
    /// own: readable when the replica's upstream (which authenticates requests on the API
    /// port) is unreachable.
    pub async fn start_with_kubeconfig_and_admin_port(
        cluster: &TestCluster,
        kubeconfig: &std::path::Path,
        extra_toml: &str,
        args: &[&str],
    ) -> Kcache {
        Self::spawn(cluster, kubeconfig, extra_toml, args, true).await
    }

    /// As [`Kcache::start_with_args`], with the admin endpoints on a port of their own
    /// (`--admin-listen`): the API port is then the API server's alone.
    pub async fn start_with_admin_port(
        cluster: &TestCluster,
        extra_toml: &str,
        args: &[&str],
    ) -> Kcache {
        Self::spawn(cluster, &cluster.kubeconfig, extra_toml, args, true).await
    }

    async fn spawn(
        cluster: &TestCluster,
        kubeconfig: &std::path::Path,
        extra_toml: &str,
        args: &[&str],
        admin: bool,
    ) -> Kcache {
        let port = free_port();
        let admin_port = admin.then(free_port);
        let dir = cluster.dir_path();
        let config = dir.join(format!("kcache-{port}.toml"));
        std::fs::write(&config, extra_toml).expect("write kcache config");
        let log = dir.join(format!("kcache-{port}.log"));
        let log_file = std::fs::File::create(&log).expect("create kcache log");
        let child = Command::new(env!("CARGO_BIN_EXE_kcache"))
            .args(["serve", "--listen", &format!("127.0.0.1:{port}")])
            .arg("--kubeconfig")
            .arg(kubeconfig)
            .arg("--config")
            .arg(&config)
            .args(args)
            // Without an admin port of its own (the default), the admin endpoints are put
            // on the API port (`--admin-listen api`), as tests that read them there expect.
            .args([
                "--admin-listen".to_string(),
                admin_port.map_or_else(|| "api".to_string(), |p| format!("127.0.0.1:{p}")),
            ])
            .env(
                "KCACHE_LOG",
                std::env::var("KCACHE_LOG").unwrap_or_else(|_| "info".into()),
            )
            .stdout(Stdio::null())
            .stderr(log_file)
            .spawn()
            .expect("start kcache");
        let url = format!("https://127.0.0.1:{port}");
        let mut k = Kcache {
            admin_url: match admin_port {
                Some(p) => format!("http://127.0.0.1:{p}"),
                None => url.clone(),
            },
            url,
            log,
            child,
        };
        k.wait_ready().await;
        k
    }

    async fn wait_ready(&mut self) {
        let http = super::insecure_http();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(r) = http.get(format!("{}/readyz", self.admin_url)).send().await {
                if r.status().is_success() {
                    return;
                }
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!(
                    "kcache exited ({status}) during start:\n{}",
                    self.log_tail()
                );
            }
            assert!(
                Instant::now() < deadline,
                "kcache not ready in 30 s:\n{}",
                self.log_tail()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Established TCP connections this kcache process holds to `port` on loopback.
    pub fn tcp_connections_to(&self, port: u16) -> usize {
        super::tcp_connections_to(self.pid(), port)
    }

    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(40)..].join("\n")
    }

    /// A kube-rs config pointing at kcache with `token`.
    pub fn kube_config(&self, token: &str) -> kube::Config {
        let mut cfg = kube::Config::new(self.url.parse().expect("kcache url"));
        cfg.accept_invalid_certs = true;
        cfg.auth_info.token = Some(secrecy::SecretString::new(token.into()));
        cfg
    }

    pub fn kube_client(&self, token: &str) -> kube::Client {
        kube::Client::try_from(self.kube_config(token)).expect("kube client for kcache")
    }

    /// kcache's /metrics text, read as admin.
    pub async fn metrics_text(&self) -> String {
        super::insecure_http()
            .get(format!("{}/metrics", self.admin_url))
            .bearer_auth(super::ADMIN_TOKEN)
            .send()
            .await
            .expect("GET /metrics")
            .text()
            .await
            .expect("metrics body")
    }

    /// Sum of every sample of `name` on kcache's /metrics (0 when absent).
    pub async fn metric(&self, name: &str) -> f64 {
        super::prom::sum(&self.metrics_text().await, name, &[])
    }

    /// The `/debug/keys` entry of `key`.
    pub async fn key_info(&self, key: &str) -> Option<serde_json::Value> {
        let keys = self.debug_keys().await;
        keys["keys"]
            .as_array()?
            .iter()
            .find(|e| e["key"] == key)
            .cloned()
    }

    /// The fleet role (`owner`, `mirror`, `local`) of `key`, "" when not cached.
    pub async fn role(&self, key: &str) -> String {
        self.key_info(key)
            .await
            .and_then(|e| e["role"].as_str().map(str::to_string))
            .unwrap_or_default()
    }

    pub async fn debug_keys(&self) -> serde_json::Value {
        super::insecure_http()
            .get(format!("{}/debug/keys", self.admin_url))
            .bearer_auth(super::ADMIN_TOKEN)
            .send()
            .await
            .expect("GET /debug/keys")
            .json()
            .await
            .expect("debug keys json")
    }

    /// Sends SIGTERM (graceful shutdown).
    pub fn terminate(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
    }

    /// SIGKILL (a crash: no drain, no lease release).
    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGSTOP / SIGCONT: a paused process (a long GC or VM pause, a frozen container).
    pub fn pause(&self) {
        let _ = Command::new("kill")
            .args(["-STOP", &self.child.id().to_string()])
            .status();
    }

    pub fn resume(&self) {
        let _ = Command::new("kill")
            .args(["-CONT", &self.child.id().to_string()])
            .status();
    }

    pub fn wait_exit(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Ok(Some(s)) = self.child.try_wait() {
                return Some(s);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        None
    }
}

impl Drop for Kcache {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What a `/debug/keys` entry serves for other keys: `key why` per `covering` element
/// (`why`: `covered` or `coalesced`), in the order shown.
pub fn covering(info: &serde_json::Value) -> Vec<String> {
    info["covering"]
        .as_array()
        .map(|c| {
            c.iter()
                .map(|c| {
                    format!(
                        "{} {}",
                        c["key"].as_str().unwrap_or(""),
                        c["why"].as_str().unwrap_or("")
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}
