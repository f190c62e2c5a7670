//! Serving-certificate reload against the real binary: the certificate and key are mounted
//! as the kubelet mounts a Secret (`tls.crt -> ..data/tls.crt`, `..data -> ..<timestamp>`,
//! renewed by an atomic swap of `..data`), and kcache serves a renewed pair without a
//! restart, while a broken one is refused and the previous pair keeps serving.

mod support;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use support::kcache::Kcache;
use support::prom::sum_samples;
use support::{eventually, insecure_http, TestCluster};

const RELOADS: &str = "kcache_tls_certificate_reloads_total";
const EXPIRY: &str = "kcache_tls_certificate_expiry_seconds";
const WARNING: &str = "still serving the previous one";

/// A self-signed P-256 certificate for 127.0.0.1, valid `days`, as `<dir>/<name>/tls.crt`
/// and `tls.key`.
fn make_pair(dir: &Path, name: &str, days: u32) {
    let d = dir.join(name);
    std::fs::create_dir(&d).expect("create the pair's dir");
    support::self_signed_ec(
        &d,
        ("tls.key", "tls.crt"),
        days,
        &format!("/CN=127.0.0.1/O={name}"),
        &["-addext", "subjectAltName=IP:127.0.0.1"],
    );
}

/// Points `..data` at `target` as the kubelet does: a new symlink renamed over the old one.
fn swap_data(dir: &Path, target: &str) {
    let tmp = dir.join("..data_tmp");
    std::os::unix::fs::symlink(target, &tmp).expect("symlink ..data_tmp");
    std::fs::rename(&tmp, dir.join("..data")).expect("rename over ..data");
}

/// The SHA-256 fingerprint line openssl prints for the PEM certificate `pem`.
fn fingerprint(pem: &[u8]) -> String {
    use std::io::Write;
    let mut child = Command::new("openssl")
        .args(["x509", "-noout", "-fingerprint", "-sha256"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run openssl x509");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(pem)
        .expect("write the certificate to openssl");
    let out = child.wait_with_output().expect("openssl x509");
    assert!(
        out.status.success(),
        "openssl x509 failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

fn file_fingerprint(path: &Path) -> String {
    fingerprint(&std::fs::read(path).expect("read the certificate"))
}

/// The fingerprint of the certificate kcache serves on `port` (SNI 127.0.0.1), or None
/// when the handshake gave none.
fn served_fingerprint(port: u16) -> Option<String> {
    let out = Command::new("timeout")
        .args(["10", "openssl", "s_client", "-connect"])
        .arg(format!("127.0.0.1:{port}"))
        .args(["-servername", "127.0.0.1"])
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .expect("run openssl s_client");
    let text = String::from_utf8_lossy(&out.stdout);
    let begin = text.find("-----BEGIN CERTIFICATE-----")?;
    let end_marker = "-----END CERTIFICATE-----";
    let end = text[begin..].find(end_marker)? + begin + end_marker.len();
    Some(fingerprint(text[begin..end].as_bytes()))
}

fn now_secs() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after the epoch")
        .as_secs_f64()
}

fn warnings(k: &Kcache) -> usize {
    std::fs::read_to_string(&k.log)
        .unwrap_or_default()
        .matches(WARNING)
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewed_certificate_is_served_and_a_broken_one_refused() {
    let cluster = TestCluster::start().await;
    let dir = cluster.dir_path().join("serving-cert");
    std::fs::create_dir(&dir).expect("create the certificate dir");
    // Pair A, valid 1 day, mounted the kubelet's way.
    make_pair(&dir, "..2026_a", 1);
    std::os::unix::fs::symlink("..2026_a", dir.join("..data")).expect("symlink ..data");
    for f in ["tls.crt", "tls.key"] {
        std::os::unix::fs::symlink(format!("..data/{f}"), dir.join(f)).expect("symlink file");
    }
    let cert = dir.join("tls.crt").display().to_string();
    let key = dir.join("tls.key").display().to_string();
    let mut k = Kcache::start_with_args(
        &cluster,
        "",
        &[
            "--tls-cert-file",
            &cert,
            "--tls-private-key-file",
            &key,
            "--tls-reload-interval-secs",
            "1",
        ],
    )
    .await;
    let port: u16 = k
        .url
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .expect("kcache's port");

    let a = file_fingerprint(&dir.join("..2026_a/tls.crt"));
    assert_eq!(served_fingerprint(port).as_deref(), Some(a.as_str()));
    let text = k.metrics_text().await;
    let expiry = sum_samples(&text, EXPIRY, None);
    assert!(
        (now_secs() + 0.5 * 86400.0..now_secs() + 1.5 * 86400.0).contains(&expiry),
        "{EXPIRY} = {expiry}, not about a day ahead:\n{text}"
    );

    // Renewal: pair B (valid 3 days) swapped in.
    make_pair(&dir, "..2026_b", 3);
    swap_data(&dir, "..2026_b");
    let b = file_fingerprint(&dir.join("..2026_b/tls.crt"));
    assert_ne!(a, b);
    eventually(
        "kcache serves the renewed certificate",
        Duration::from_secs(10),
        || {
            let served = served_fingerprint(port);
            let b = b.clone();
            async move { served.as_deref() == Some(b.as_str()) }
        },
    )
    .await;
    let text = k.metrics_text().await;
    assert_eq!(
        sum_samples(&text, RELOADS, Some("result=\"ok\"")),
        1.0,
        "{text}"
    );
    let expiry = sum_samples(&text, EXPIRY, None);
    assert!(
        expiry > now_secs() + 2.5 * 86400.0,
        "{EXPIRY} = {expiry}, not the renewed certificate's notAfter:\n{text}"
    );

    // A broken renewal: pair C's certificate with B's key. Refused; B keeps serving.
    make_pair(&dir, "..2026_c", 5);
    std::fs::copy(dir.join("..2026_b/tls.key"), dir.join("..2026_c/tls.key"))
        .expect("copy B's key over C's");
    swap_data(&dir, "..2026_c");
    let kr = &k;
    eventually(
        "the broken pair is counted as a failed reload",
        Duration::from_secs(10),
        move || async move {
            let text = kr.metrics_text().await;
            sum_samples(&text, RELOADS, Some("result=\"error\"")) >= 1.0
        },
    )
    .await;
    // A few more reload intervals: the same broken content is neither retried nor warned
    // about again.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let text = k.metrics_text().await;
    assert_eq!(
        sum_samples(&text, RELOADS, Some("result=\"error\"")),
        1.0,
        "{text}"
    );
    assert_eq!(
        sum_samples(&text, RELOADS, Some("result=\"ok\"")),
        1.0,
        "{text}"
    );
    assert!(
        sum_samples(&text, EXPIRY, None) < now_secs() + 4.0 * 86400.0,
        "{EXPIRY} moved to the refused certificate's:\n{text}"
    );
    assert_eq!(warnings(&k), 1, "one warning expected:\n{}", k.log_tail());
    assert_eq!(served_fingerprint(port).as_deref(), Some(b.as_str()));

    let readyz = insecure_http()
        .get(format!("{}/readyz", k.admin_url))
        .send()
        .await
        .expect("GET /readyz");
    assert!(readyz.status().is_success(), "/readyz: {}", readyz.status());
    assert!(
        k.wait_exit(Duration::from_millis(200)).is_none(),
        "kcache exited:\n{}",
        k.log_tail()
    );
}
