//! A real `nats-server` (JetStream on, `-js`) started from a configuration file the test
//! writes (TLS, nkey users, operator/JWT mode), and what its clients need: a small PKI
//! made with openssl, nkey pairs, JWTs signed with them, `.creds` files, and the kcache
//! `[nats]` TOML of a replica pointed at the server.

use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use nkeys::KeyPair;
use serde_json::{json, Value};

/// A nats-server on a free loopback port, configured by `nats.conf` in its own directory
/// (which also holds its JetStream store and `nats.log`). Dropping it kills it.
pub struct ConfNats {
    pub port: u16,
    pub dir: PathBuf,
    child: Child,
}

impl ConfNats {
    /// Writes `conf` (nats-server configuration syntax; the listen address, JetStream and
    /// the store are given on the command line) to `<parent>/<name>/nats.conf` and starts
    /// the server; returns once it accepts TCP connections.
    pub fn start(parent: &Path, name: &str, conf: &str) -> ConfNats {
        let dir = parent.join(name);
        std::fs::create_dir_all(&dir).expect("create the nats-server dir");
        let conf_path = dir.join("nats.conf");
        std::fs::write(&conf_path, conf).expect("write nats.conf");
        let port = super::free_port();
        let log = std::fs::File::create(dir.join("nats.log")).expect("create nats.log");
        let child = Command::new(super::nats::nats_server())
            .arg("-c")
            .arg(&conf_path)
            .args(["-a", "127.0.0.1", "-p", &port.to_string(), "-js"])
            .arg("-sd")
            .arg(dir.join("store"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("clone nats.log handle"))
            .stderr(log)
            .spawn()
            .expect("start nats-server (apt install nats-server)");
        let mut n = ConfNats { port, dir, child };
        let deadline = Instant::now() + Duration::from_secs(20);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            if let Ok(Some(status)) = n.child.try_wait() {
                panic!("nats-server exited ({status}):\n{}", n.log());
            }
            assert!(
                Instant::now() < deadline,
                "nats-server did not listen in 20 s:\n{}",
                n.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        // Listening comes before JetStream is up; a config error JetStream cannot live
        // with shows in the log by then.
        n.wait_log("Server is ready", Duration::from_secs(20));
        n
    }

    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// Everything the server logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("nats.log")).unwrap_or_default()
    }

    /// Waits until the server's log contains `needle`; panics with the log after `timeout`.
    pub fn wait_log(&self, needle: &str, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        while !self.log().contains(needle) {
            assert!(
                Instant::now() < deadline,
                "nats-server never logged {needle:?} in {timeout:?}:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for ConfNats {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A certificate authority made with openssl: `<dir>/<name>.crt` and `.key`.
pub struct TestCa {
    pub dir: PathBuf,
    pub name: String,
}

impl TestCa {
    /// A self-signed P-256 CA named `name` (its subject CN too) in `dir`.
    pub fn new(dir: &Path, name: &str) -> TestCa {
        std::fs::create_dir_all(dir).expect("create the PKI dir");
        super::self_signed_ec(
            dir,
            (&format!("{name}.key"), &format!("{name}.crt")),
            30,
            &format!("/CN={name}"),
            &[],
        );
        TestCa {
            dir: dir.to_path_buf(),
            name: name.to_string(),
        }
    }

    pub fn cert(&self) -> PathBuf {
        self.dir.join(format!("{}.crt", self.name))
    }

    /// A certificate for the NATS server at 127.0.0.1; returns (certificate, key).
    pub fn issue_server(&self, name: &str) -> (PathBuf, PathBuf) {
        self.issue(
            name,
            "/CN=127.0.0.1",
            "extendedKeyUsage=serverAuth\nsubjectAltName=IP:127.0.0.1\n",
        )
    }

    /// A client certificate with common name `cn`; returns (certificate, key).
    pub fn issue_client(&self, name: &str, cn: &str) -> (PathBuf, PathBuf) {
        self.issue(name, &format!("/CN={cn}"), "extendedKeyUsage=clientAuth\n")
    }

    fn issue(&self, name: &str, subject: &str, ext: &str) -> (PathBuf, PathBuf) {
        let ext_file = format!("{name}.ext");
        std::fs::write(
            self.dir.join(&ext_file),
            format!("basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\n{ext}"),
        )
        .expect("write the extensions file");
        let (crt, key, csr) = (
            format!("{name}.crt"),
            format!("{name}.key"),
            format!("{name}.csr"),
        );
        super::openssl(
            &self.dir,
            &[
                "req",
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
        let (ca_crt, ca_key) = (format!("{}.crt", self.name), format!("{}.key", self.name));
        super::openssl(
            &self.dir,
            &[
                "x509",
                "-req",
                "-in",
                &csr,
                "-CA",
                &ca_crt,
                "-CAkey",
                &ca_key,
                "-CAcreateserial",
                "-days",
                "30",
                "-extfile",
                &ext_file,
                "-out",
                &crt,
            ],
        );
        (self.dir.join(crt), self.dir.join(key))
    }
}

/// A JWT in the form nats-server's jwt v2 library decodes:
/// `base64url(header).base64url(claims).base64url(ed25519 signature of the first two)`,
/// header `{"typ":"JWT","alg":"ed25519-nkey"}`, signed by `issuer`. `nats` is the
/// type-specific part of the claims (it names the type and `"version": 2`).
pub fn jwt(issuer: &KeyPair, subject: &str, name: &str, nats: Value) -> String {
    let iat = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("the clock is after 1970")
        .as_secs();
    let mut claims = json!({
        "iat": iat,
        "iss": issuer.public_key(),
        "name": name,
        "sub": subject,
        "nats": nats,
    });
    // A unique id (the Go library hashes the claims the same way; nothing verifies it).
    let digest = ring::digest::digest(&ring::digest::SHA512_256, claims.to_string().as_bytes());
    let jti: String = digest.as_ref().iter().map(|b| format!("{b:02X}")).collect();
    claims["jti"] = Value::String(jti);
    let header = URL_SAFE_NO_PAD.encode(json!({"typ": "JWT", "alg": "ed25519-nkey"}).to_string());
    let body = URL_SAFE_NO_PAD.encode(claims.to_string());
    let signed = format!("{header}.{body}");
    let sig = issuer
        .sign(signed.as_bytes())
        .expect("sign the JWT with the issuer's seed");
    format!("{signed}.{}", URL_SAFE_NO_PAD.encode(sig))
}

/// The operator's self-signed JWT.
pub fn operator_jwt(operator: &KeyPair) -> String {
    jwt(
        operator,
        &operator.public_key(),
        "kcache-test-operator",
        json!({"type": "operator", "version": 2}),
    )
}

/// An account JWT signed by `operator`, with unlimited core limits and JetStream enabled
/// (unlimited memory and file storage, streams and consumers).
pub fn account_jwt(operator: &KeyPair, account: &KeyPair, name: &str) -> String {
    jwt(
        operator,
        &account.public_key(),
        name,
        json!({
            "limits": {
                "subs": -1, "data": -1, "payload": -1,
                "imports": -1, "exports": -1, "wildcards": true, "conn": -1, "leaf": -1,
                "mem_storage": -1, "disk_storage": -1, "streams": -1, "consumer": -1,
            },
            "default_permissions": {"pub": {}, "sub": {}},
            "type": "account",
            "version": 2,
        }),
    )
}

/// The system account's JWT, signed by `operator`: no JetStream (the server refuses it
/// there).
pub fn system_account_jwt(operator: &KeyPair, system: &KeyPair) -> String {
    jwt(
        operator,
        &system.public_key(),
        "SYS",
        json!({
            "limits": {
                "subs": -1, "data": -1, "payload": -1,
                "imports": -1, "exports": -1, "wildcards": true, "conn": -1, "leaf": -1,
            },
            "default_permissions": {"pub": {}, "sub": {}},
            "type": "account",
            "version": 2,
        }),
    )
}

/// A user JWT signed by `account`, without limits or permissions of its own.
pub fn user_jwt(account: &KeyPair, user: &KeyPair, name: &str) -> String {
    jwt(
        account,
        &user.public_key(),
        name,
        json!({
            "pub": {}, "sub": {}, "subs": -1, "data": -1, "payload": -1,
            "type": "user",
            "version": 2,
        }),
    )
}

/// A `.creds` file's text, as `nsc` writes one: the user JWT, then the user's seed.
pub fn creds(user_jwt: &str, user: &KeyPair) -> String {
    let seed = user.seed().expect("a generated user key has a seed");
    format!(
        "-----BEGIN NATS USER JWT-----\n{user_jwt}\n------END NATS USER JWT------\n\n\
         ************************* IMPORTANT *************************\n\
         NKEY Seed printed below can be used to sign and prove identity.\n\
         NKEYs are sensitive and should be treated as secrets.\n\n\
         -----BEGIN USER NKEY SEED-----\n{seed}\n------END USER NKEY SEED------\n\n\
         *************************************************************\n"
    )
}

/// `[cache]` and `[nats]` TOML for a replica pointed at `url`, authenticating with
/// `auth` (lines of `[nats]`, e.g. `nkey_seed_file = "…"`; nothing else: no token), with
/// the fleet's shared sealing key (written into `dir`) and `fallback_after_ms` short.
pub fn replica_toml(dir: &Path, url: &str, auth: &str) -> String {
    super::nats::replica_toml(dir, url, &format!("fallback_after_ms = 1000\n{auth}"))
}
