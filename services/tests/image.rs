//! The container image (`deploy/image/build.sh`, with Debian's umoci and skopeo): built
//! from the test's kcache binary, its config runs `/usr/local/bin/kcache serve` as
//! 65532:65532 on linux/amd64 with the Apache-2.0 license label; its layers weigh no more
//! than the stripped binary plus a few MiB (libraries, CA bundle); its rootfs has no shell
//! and no package manager but has the executable, the CA bundle, a nonroot user and a
//! 1777 /tmp; and the libraries copied into it are enough to run `kcache --version`
//! through the image's own dynamic loader.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const TAG: &str = "test";
const MIB: u64 = 1 << 20;

fn build_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/image/build.sh")
}

fn describe(cmd: &Command) -> String {
    let mut s = cmd.get_program().to_string_lossy().into_owned();
    for a in cmd.get_args() {
        s.push(' ');
        s.push_str(&a.to_string_lossy());
    }
    s
}

/// Runs `cmd`; panics with its stdout and stderr unless it exits 0.
fn run(cmd: &mut Command) -> Output {
    let what = describe(cmd);
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run `{what}`: {e}"));
    assert!(
        out.status.success(),
        "`{what}` failed ({}):\n--- stdout\n{}\n--- stderr\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn stdout(cmd: &mut Command) -> String {
    String::from_utf8(run(cmd).stdout).expect("utf-8 output")
}

fn json(cmd: &mut Command) -> serde_json::Value {
    let what = describe(cmd);
    let text = stdout(cmd);
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("`{what}`: not JSON ({e}):\n{text}"))
}

fn found(tool: &str) -> bool {
    Command::new(tool).arg("--version").output().is_ok()
}

/// umoci and skopeo from Debian, installed if missing; the test fails (never skips)
/// when they cannot be.
fn ensure_umoci_and_skopeo() {
    if found("umoci") && found("skopeo") {
        return;
    }
    let root = stdout(Command::new("id").arg("-u")).trim() == "0";
    let mut install = if root {
        Command::new("apt-get")
    } else {
        let mut c = Command::new("sudo");
        c.args(["-n", "apt-get"]);
        c
    };
    install
        .args([
            "install",
            "-y",
            "--no-install-recommends",
            "umoci",
            "skopeo",
        ])
        .env("DEBIAN_FRONTEND", "noninteractive");
    let what = describe(&install);
    let result = install.output();
    if found("umoci") && found("skopeo") {
        return;
    }
    let why = match result {
        Ok(o) => format!("{}\n{}", o.status, String::from_utf8_lossy(&o.stderr)),
        Err(e) => e.to_string(),
    };
    panic!(
        "the image test needs umoci and skopeo, which are missing and `{what}` could not \
         install them; install them with `apt-get install -y --no-install-recommends umoci \
         skopeo`:\n{why}"
    );
}

fn string_array(v: &serde_json::Value) -> Vec<&str> {
    v.as_array()
        .unwrap_or_else(|| panic!("not an array: {v}"))
        .iter()
        .map(|s| s.as_str().unwrap_or_else(|| panic!("not a string: {s}")))
        .collect()
}

/// `rel` (relative to the rootfs) does not exist, not even as a dangling symlink.
fn absent(rootfs: &Path, rel: &str) {
    assert!(
        std::fs::symlink_metadata(rootfs.join(rel)).is_err(),
        "/{rel} is in the image"
    );
}

#[test]
fn image_is_minimal_and_runs_kcache() {
    ensure_umoci_and_skopeo();
    let binary = Path::new(env!("CARGO_BIN_EXE_kcache"));
    let tmp = tempfile::tempdir().expect("temp dir");
    let layout = tmp.path().join("oci");
    let image = format!("oci:{}:{TAG}", layout.display());

    // Build; the last line of stdout names the image.
    let built = stdout(
        Command::new("bash")
            .arg(build_script())
            .arg("--binary")
            .arg(binary)
            .arg("--out")
            .arg(&layout)
            .args(["--tag", TAG]),
    );
    let reference = built.lines().last().unwrap_or_default();
    let printed_dir = reference
        .strip_prefix("oci:")
        .and_then(|r| r.strip_suffix(&format!(":{TAG}")))
        .unwrap_or_else(|| panic!("build.sh's last line is not oci:DIR:{TAG}: {built:?}"));
    assert_eq!(
        Path::new(printed_dir).canonicalize().expect("printed dir"),
        layout.canonicalize().expect("layout dir"),
        "build.sh printed {reference}"
    );

    // The config.
    let config = json(Command::new("skopeo").args(["inspect", "--config", &image]));
    let c = &config["config"];
    assert_eq!(c["User"], "65532:65532", "{config:#}");
    assert_eq!(string_array(&c["Entrypoint"]), ["/usr/local/bin/kcache"]);
    assert_eq!(string_array(&c["Cmd"]), ["serve"]);
    assert_eq!(
        c["Labels"]["org.opencontainers.image.licenses"], "Apache-2.0",
        "{config:#}"
    );
    assert_eq!(config["os"], "linux", "{config:#}");
    assert_eq!(config["architecture"], "amd64", "{config:#}");
    let inspect = json(Command::new("skopeo").args(["inspect", &image]));
    assert_eq!(inspect["Os"], "linux", "{inspect:#}");
    assert_eq!(inspect["Architecture"], "amd64", "{inspect:#}");
    assert_eq!(
        inspect["Labels"]["org.opencontainers.image.licenses"], "Apache-2.0",
        "{inspect:#}"
    );

    // The size: the stripped binary plus a few MiB of libraries and CA bundle.
    let manifest = json(Command::new("skopeo").args(["inspect", "--raw", &image]));
    let layers = manifest["layers"]
        .as_array()
        .unwrap_or_else(|| panic!("no layers: {manifest:#}"));
    assert!(!layers.is_empty(), "{manifest:#}");
    let layer_bytes: u64 = layers
        .iter()
        .map(|l| {
            l["size"]
                .as_u64()
                .unwrap_or_else(|| panic!("layer size: {l}"))
        })
        .sum();
    let stripped = tmp.path().join("kcache.stripped");
    run(Command::new("strip").arg("-o").arg(&stripped).arg(binary));
    let stripped_bytes = std::fs::metadata(&stripped).expect("stripped").len();
    assert!(
        layer_bytes < stripped_bytes + 8 * MIB,
        "layers {layer_bytes} bytes, stripped binary {stripped_bytes} bytes: more than \
         the binary and 8 MiB of libraries in the image"
    );

    // The filesystem.
    let bundle = tmp.path().join("bundle");
    run(Command::new("umoci")
        .args(["unpack", "--rootless", "--image"])
        .arg(format!("{}:{TAG}", layout.display()))
        .arg(&bundle));
    let rootfs = bundle.join("rootfs");
    absent(&rootfs, "bin/sh");
    absent(&rootfs, "usr/bin/sh");
    absent(&rootfs, "usr/bin/apt");
    absent(&rootfs, "usr/bin/dpkg");
    let exe = rootfs.join("usr/local/bin/kcache");
    let mode = std::fs::metadata(&exe)
        .unwrap_or_else(|e| panic!("{}: {e}", exe.display()))
        .permissions()
        .mode();
    assert!(mode & 0o111 != 0, "/usr/local/bin/kcache mode {mode:o}");
    let ca = rootfs.join("etc/ssl/certs/ca-certificates.crt");
    let ca_bytes = std::fs::metadata(&ca).map(|m| m.len()).unwrap_or(0);
    assert!(
        ca_bytes > 0,
        "no CA bundle at /etc/ssl/certs/ca-certificates.crt"
    );
    let passwd = std::fs::read_to_string(rootfs.join("etc/passwd")).expect("/etc/passwd");
    assert!(passwd.contains("nonroot:x:65532:65532"), "{passwd}");
    let tmp_mode = std::fs::metadata(rootfs.join("tmp"))
        .expect("/tmp")
        .permissions()
        .mode();
    assert_eq!(tmp_mode & 0o7777, 0o1777, "/tmp mode {tmp_mode:o}");

    // The binary runs on the image's libraries, through the image's loader.
    let interp = stdout(Command::new("readelf").arg("-l").arg(&exe));
    let loader = interp
        .lines()
        .find_map(|l| {
            l.split_once("Requesting program interpreter: ")
                .map(|(_, r)| r.trim_end_matches(']').trim())
        })
        .unwrap_or_else(|| panic!("no program interpreter in readelf -l:\n{interp}"));
    let loader = rootfs.join(loader.trim_start_matches('/'));
    let library_path = format!(
        "{}:{}",
        rootfs.join("lib/x86_64-linux-gnu").display(),
        rootfs.join("usr/lib/x86_64-linux-gnu").display()
    );
    // Every library resolves inside the image, none falls back to the host's.
    let listed = stdout(
        Command::new(&loader)
            .args(["--library-path", &library_path, "--list"])
            .arg(&exe),
    );
    let rootfs_str = rootfs.to_string_lossy().into_owned();
    for line in listed.lines().filter(|l| l.contains(" => ")) {
        let path = line.split(" => ").nth(1).unwrap_or_default().trim();
        assert!(
            path.starts_with(&rootfs_str),
            "a library is not in the image: {line}\n{listed}"
        );
    }
    let version = stdout(
        Command::new(&loader)
            .args(["--library-path", &library_path])
            .arg(&exe)
            .arg("--version")
            .env_clear(),
    );
    assert!(version.contains("kcache"), "kcache --version: {version}");
}
