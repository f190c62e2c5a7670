//! A real `nats-server` (JetStream on, token auth) per test, on a fixed free port so it
//! can be killed with SIGKILL and restarted on the same port with the same store, and
//! the kcache `[nats]` configuration that points a replica at it.

use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The token every test NATS server requires.
pub const NATS_TOKEN: &str = "nats-test-token";

pub struct Nats {
    pub port: u16,
    pub dir: PathBuf,
    child: Option<Child>,
}

/// The nats-server binary: Debian's, or the first on PATH.
pub fn nats_server() -> String {
    for p in [
        "/usr/sbin/nats-server",
        "/usr/bin/nats-server",
        "/usr/local/bin/nats-server",
    ] {
        if Path::new(p).exists() {
            return p.to_string();
        }
    }
    "nats-server".to_string()
}

impl Nats {
    /// Starts a server in a fresh directory under `parent`.
    pub fn start(parent: &Path) -> Nats {
        let port = super::free_port();
        let dir = parent.join(format!("nats-{port}"));
        std::fs::create_dir_all(&dir).expect("nats dir");
        let mut n = Nats {
            port,
            dir,
            child: None,
        };
        n.spawn();
        n
    }

    fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("nats.log"))
            .expect("nats log");
        let child = Command::new(nats_server())
            .args(["-a", "127.0.0.1", "-p", &self.port.to_string(), "-js"])
            .arg("-sd")
            .arg(self.dir.join("store"))
            .args(["--auth", NATS_TOKEN])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start nats-server (apt install nats-server)");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(20);
        while TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(Instant::now() < deadline, "nats-server did not listen");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// SIGKILL: no goodbye to clients, as a crash.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts again on the same port with the same JetStream store.
    pub fn restart(&mut self) {
        self.kill9();
        self.spawn();
    }

    /// A client authenticated like kcache's replicas.
    pub async fn client(&self) -> async_nats::Client {
        async_nats::ConnectOptions::new()
            .token(NATS_TOKEN.into())
            .connect(self.url())
            .await
            .expect("connect to the test NATS")
    }
}

impl Drop for Nats {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// `[cache]` and `[nats]` TOML for a replica of a test fleet: token auth, a sealing key
/// (files written into `dir`), and timings short enough for tests.
pub fn fleet_toml(dir: &Path, nats: &Nats, extra_nats: &str) -> String {
    token_replica_toml(dir, &nats.url(), extra_nats)
}

/// [`fleet_toml`] for any NATS URL (list): token auth plus `extra_nats` lines of `[nats]`.
pub fn token_replica_toml(dir: &Path, url: &str, extra_nats: &str) -> String {
    let token = dir.join("nats-token");
    std::fs::write(&token, NATS_TOKEN).expect("token file");
    replica_toml(
        dir,
        url,
        &format!("token_file = \"{}\"\n{extra_nats}", token.display()),
    )
}

/// The fleet's signing key in tests: a fixed 32-byte seed, base64 (every replica of a fleet
/// shares it; `core::sign`).
pub const SIGNING_SEED: &str = "a2NhY2hlLXRlc3Qtc2lnbmluZy1zZWVkLTMyLWJ5dGU=";

/// The test fleet's signing key ([`SIGNING_SEED`]): its public key is what a subscriber
/// verifies messages with.
pub fn fleet_signer() -> kcache_actors::core::sign::Signer {
    use base64::Engine;
    let seed = base64::engine::general_purpose::STANDARD
        .decode(SIGNING_SEED)
        .expect("the test signing seed is base64");
    kcache_actors::core::sign::Signer::from_seed(&seed).expect("a 32-byte seed")
}

/// `[cache]` and `[nats]` TOML for a replica pointed at `url` with `nats_lines` (auth and
/// anything else of `[nats]`), the fleet's shared sealing key and its signing key, written
/// into `dir`.
pub fn replica_toml(dir: &Path, url: &str, nats_lines: &str) -> String {
    let key = dir.join("nats-key-k1");
    // 32 bytes, base64: a fixed test key (every replica of the fleet must share it).
    std::fs::write(&key, "a2NhY2hlLXRlc3Qta2V5LTMyLWJ5dGVzLWxvbmchISE=\n").expect("key file");
    let signing = dir.join("nats-signing-key");
    std::fs::write(&signing, format!("{SIGNING_SEED}\n")).expect("signing key file");
    format!(
        r#"[cache]
grace_period_secs = 5
watch_keepalive_secs = 1

[nats]
url = "{url}"
encryption_active_key = "k1"
signing_key_file = "{signing}"
{nats_lines}

[[nats.encryption_keys]]
id = "k1"
file = "{key}"
"#,
        key = key.display(),
        signing = signing.display(),
    )
}
