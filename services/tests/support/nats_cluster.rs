//! A real three-node (or n-node) nats-server cluster on loopback, JetStream on, token
//! authentication as [`super::nats`] uses: each node has its own client port, cluster
//! port, `server_name`, JetStream store and `nats.log`, and routes to every other node.
//! A node can be killed with SIGKILL and restarted on its ports with its store, as a
//! crashed and rebooted machine would be.

use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde_json::Value;

use super::nats::NATS_TOKEN;

/// The cluster's name (`cluster { name }`).
pub const CLUSTER_NAME: &str = "kcache-test";

/// One node of a [`NatsCluster`].
pub struct Node {
    /// Its `server_name` (`n0`, `n1`, …): what JetStream names leaders and peers by.
    pub name: String,
    pub port: u16,
    pub cluster_port: u16,
    /// Holds `nats.conf`, `nats.log` and the JetStream store (`store/`).
    pub dir: PathBuf,
    child: Option<Child>,
}

impl Node {
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// Everything the node logged so far (every run of it: the log is appended to).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("nats.log")).unwrap_or_default()
    }

    /// The last `n` lines of the node's log.
    pub fn log_tail(&self, n: usize) -> String {
        let log = self.log();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }

    fn spawn(&mut self) {
        assert!(self.child.is_none(), "node {} is running", self.name);
        let mut log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("nats.log"))
            .expect("open nats.log");
        {
            use std::io::Write;
            writeln!(log, "=== kcache tests: starting {}", self.name).expect("write nats.log");
        }
        let child = Command::new(super::nats::nats_server())
            .arg("-c")
            .arg(self.dir.join("nats.conf"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("clone nats.log handle"))
            .stderr(log)
            .spawn()
            .expect("start nats-server (apt install nats-server)");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(20);
        while TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            if let Some(Ok(Some(status))) = self.child.as_mut().map(Child::try_wait) {
                panic!(
                    "nats-server {} exited ({status}):\n{}",
                    self.name,
                    self.log_tail(40)
                );
            }
            assert!(
                Instant::now() < deadline,
                "nats-server {} did not listen in 20 s:\n{}",
                self.name,
                self.log_tail(40)
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// SIGKILL: no goodbye to clients or to the other nodes, as a crash.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// A nats-server cluster; dropping it kills every node.
pub struct NatsCluster {
    pub nodes: Vec<Node>,
}

impl NatsCluster {
    /// Starts `n` nodes under `parent/nats-cluster/` and waits until JetStream has a
    /// meta leader and every node is a JetStream peer (a stream with `n` replicas can be
    /// created).
    pub async fn start(parent: &Path, n: usize) -> NatsCluster {
        let root = parent.join("nats-cluster");
        let ports: Vec<(u16, u16)> = super::free_ports(2 * n)
            .chunks(2)
            .map(|p| (p[0], p[1]))
            .collect();
        let mut nodes = Vec::new();
        for (i, &(port, cluster_port)) in ports.iter().enumerate() {
            let name = format!("n{i}");
            let dir = root.join(&name);
            std::fs::create_dir_all(&dir).expect("create the node's dir");
            let routes: Vec<String> = ports
                .iter()
                .enumerate()
                .filter(|&(j, _)| j != i)
                .map(|(_, &(_, cp))| format!("    nats-route://127.0.0.1:{cp}"))
                .collect();
            let conf = format!(
                r#"server_name: {name}
listen: "127.0.0.1:{port}"
authorization {{
  token: "{NATS_TOKEN}"
}}
jetstream {{
  store_dir: "{store}"
}}
cluster {{
  name: {CLUSTER_NAME}
  listen: "127.0.0.1:{cluster_port}"
  routes: [
{routes}
  ]
}}
"#,
                store = dir.join("store").display(),
                routes = routes.join("\n"),
            );
            std::fs::write(dir.join("nats.conf"), conf).expect("write nats.conf");
            nodes.push(Node {
                name,
                port,
                cluster_port,
                dir,
                child: None,
            });
        }
        let mut cluster = NatsCluster { nodes };
        // From here on a panic drops `cluster`, which kills whatever was started.
        for node in &mut cluster.nodes {
            node.spawn();
        }
        cluster.wait_jetstream(n).await;
        cluster
    }

    /// Every node's URL, comma-separated (as kcache's `[nats] url` takes them).
    pub fn urls(&self) -> String {
        self.nodes
            .iter()
            .map(Node::url)
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The index of the node whose `server_name` is `name`.
    pub fn index_of(&self, name: &str) -> usize {
        self.nodes
            .iter()
            .position(|n| n.name == name)
            .unwrap_or_else(|| panic!("no node named {name:?}"))
    }

    /// SIGKILL of node `i`; the others keep running.
    pub fn kill9(&mut self, i: usize) {
        self.nodes[i].kill9();
    }

    /// Starts node `i` again on its ports with its JetStream store (killing it first if it
    /// runs); returns once it listens.
    pub fn restart(&mut self, i: usize) {
        self.nodes[i].kill9();
        self.nodes[i].spawn();
    }

    /// A client of node `i` alone, authenticated like kcache's replicas.
    pub async fn client(&self, i: usize) -> Result<async_nats::Client, String> {
        let connect = async_nats::ConnectOptions::new()
            .token(NATS_TOKEN.into())
            .connection_timeout(Duration::from_secs(2))
            .connect(self.nodes[i].url());
        match tokio::time::timeout(Duration::from_secs(3), connect).await {
            Ok(Ok(c)) => Ok(c),
            Ok(Err(e)) => Err(format!("connect to {}: {e}", self.nodes[i].name)),
            Err(_) => Err(format!("connect to {}: timed out", self.nodes[i].name)),
        }
    }

    /// A JetStream API request (`$JS.API.…`) through the first running node, answered
    /// without an `error` member; `Err` with what went wrong otherwise (no node running,
    /// no answer in 3 s, or the API's error).
    pub async fn js_api(&self, subject: &str, body: &str) -> Result<Value, String> {
        let i = self
            .nodes
            .iter()
            .position(Node::is_running)
            .ok_or("no node is running")?;
        let client = self.client(i).await?;
        let req = client.request(subject.to_string(), Bytes::from(body.to_string()));
        let msg = match tokio::time::timeout(Duration::from_secs(3), req).await {
            Ok(Ok(msg)) => msg,
            Ok(Err(e)) => return Err(format!("{subject}: {e}")),
            Err(_) => return Err(format!("{subject}: no answer in 3 s")),
        };
        let answer: Value = serde_json::from_slice(&msg.payload)
            .map_err(|e| format!("{subject}: not JSON ({e})"))?;
        if let Some(error) = answer.get("error") {
            return Err(format!("{subject}: {error}"));
        }
        Ok(answer)
    }

    /// `$JS.API.STREAM.INFO.<stream>`: its `config`, `state` and `cluster` (`leader`, the
    /// leader's server name, and `replicas`, the other peers with `current`, `offline`).
    pub async fn stream_info(&self, stream: &str) -> Result<Value, String> {
        self.js_api(&format!("$JS.API.STREAM.INFO.{stream}"), "")
            .await
    }

    /// Waits until JetStream answers `$JS.API.INFO` (a meta leader was elected) and a
    /// stream with `replicas` copies can be created (that many peers joined); deletes that
    /// probe stream again.
    async fn wait_jetstream(&self, replicas: usize) {
        let deadline = Instant::now() + Duration::from_secs(30);
        let logs = |c: &NatsCluster| {
            c.nodes
                .iter()
                .map(|n| format!("--- {}:\n{}", n.name, n.log_tail(20)))
                .collect::<Vec<_>>()
                .join("\n")
        };
        loop {
            match self.js_api("$JS.API.INFO", "").await {
                Ok(_) => break,
                Err(e) => assert!(
                    Instant::now() < deadline,
                    "JetStream has no meta leader after 30 s ({e}):\n{}",
                    logs(self)
                ),
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let probe = serde_json::json!({
            "name": "cluster-probe",
            "subjects": ["cluster-probe"],
            "storage": "memory",
            "num_replicas": replicas,
        })
        .to_string();
        loop {
            match self
                .js_api("$JS.API.STREAM.CREATE.cluster-probe", &probe)
                .await
            {
                Ok(_) => break,
                Err(e) => assert!(
                    Instant::now() < deadline,
                    "no stream with {replicas} replicas after 30 s ({e}):\n{}",
                    logs(self)
                ),
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        self.js_api("$JS.API.STREAM.DELETE.cluster-probe", "")
            .await
            .expect("delete the probe stream");
    }
}

impl Drop for NatsCluster {
    fn drop(&mut self) {
        for node in &mut self.nodes {
            node.kill9();
        }
    }
}

/// `[cache]` and `[nats]` TOML for a replica of a fleet on `cluster`: every node's URL,
/// token auth, the fleet's sealing key (files written into `dir`), plus `extra_nats`
/// lines of `[nats]`.
pub fn fleet_toml(dir: &Path, cluster: &NatsCluster, extra_nats: &str) -> String {
    super::nats::token_replica_toml(dir, &cluster.urls(), extra_nats)
}
