//! The `kcache` command line as an operator meets it: `--version` names the git revision,
//! shell completions and the man page are generated, boolean environment variables accept
//! what `strconv.ParseBool`-minded operators write (`1`, `0`, `true`), and the default
//! configuration file is read when present.

use std::path::Path;
use std::process::{Command, Output};

fn kcache(args: &[&str], env: &[(&str, &str)], cwd: Option<&Path>) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_kcache"));
    cmd.args(args)
        .env_remove("KCACHE_CONFIG")
        .env_remove("KCACHE_LOG_JSON")
        .env_remove("KCACHE_INSECURE_HTTP");
    for (k, v) in env {
        cmd.env(k, v);
    }
    if let Some(dir) = cwd {
        cmd.current_dir(dir);
    }
    cmd.output().expect("run kcache")
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

#[test]
fn version_names_the_git_revision() {
    let out = kcache(&["--version"], &[], None);
    assert!(out.status.success(), "{}", text(&out));
    let v = text(&out);
    let head = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
    match head {
        // Built from this checkout: its HEAD (or a revision stamped by KCACHE_GIT_REVISION).
        Some(rev) if std::env::var("KCACHE_GIT_REVISION").is_err() => {
            assert_eq!(
                v.trim(),
                format!("kcache {} (rev {rev})", env!("CARGO_PKG_VERSION"))
            )
        }
        _ => assert!(v.starts_with("kcache ") && v.contains("(rev "), "{v}"),
    }
}

#[test]
fn completions_and_man_page_are_generated() {
    for shell in ["bash", "zsh", "fish"] {
        let out = kcache(&["completions", shell], &[], None);
        assert!(out.status.success(), "{shell}: {}", text(&out));
        let script = String::from_utf8_lossy(&out.stdout);
        assert!(
            script.contains("admin-listen") && script.contains("serve"),
            "{shell} completion lacks serve's flags:\n{script}"
        );
    }
    let out = kcache(&["man"], &[], None);
    assert!(out.status.success(), "{}", text(&out));
    let man = String::from_utf8_lossy(&out.stdout);
    assert!(man.contains(".TH kcache 1"), "{man}");
    assert!(
        man.contains("serve") && man.contains("completions"),
        "{man}"
    );
    let out = kcache(&["completions", "tcsh"], &[], None);
    assert!(!out.status.success(), "an unknown shell is an error");
}

/// `serve` against a kubeconfig that does not exist fails after flags, environment and
/// the config file were read: what it complains about tells how far it got.
fn serve_failure(env: &[(&str, &str)], cwd: Option<&Path>) -> String {
    let out = kcache(
        &["serve", "--kubeconfig", "/nonexistent/kubeconfig"],
        env,
        cwd,
    );
    assert!(!out.status.success());
    text(&out)
}

#[test]
fn boolean_environment_variables_accept_1_and_0() {
    for (value, json) in [
        ("1", true),
        ("true", true),
        ("yes", true),
        ("0", false),
        ("false", false),
    ] {
        let err = serve_failure(&[("KCACHE_LOG_JSON", value)], None);
        assert!(
            err.contains("/nonexistent/kubeconfig"),
            "KCACHE_LOG_JSON={value} was refused: {err}"
        );
        assert_eq!(
            err.lines().any(|l| l.starts_with('{')),
            json,
            "KCACHE_LOG_JSON={value}: {err}"
        );
    }
    let err = serve_failure(&[("KCACHE_INSECURE_HTTP", "1")], None);
    assert!(err.contains("/nonexistent/kubeconfig"), "{err}");
    let err = serve_failure(&[("KCACHE_LOG_JSON", "maybe")], None);
    assert!(err.contains("invalid value 'maybe'"), "{err}");
}

#[test]
fn the_default_config_file_is_read_when_present() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::create_dir(dir.path().join("config")).expect("mkdir");
    std::fs::write(
        dir.path().join("config/kcache.toml"),
        "[cache]\nnot_a_setting = 1\n",
    )
    .expect("write config");
    // Read (and refused: unknown fields are errors) without --config.
    let err = serve_failure(&[], Some(dir.path()));
    assert!(
        err.contains("parsing config file config/kcache.toml") && err.contains("not_a_setting"),
        "{err}"
    );
    // --config wins over the default file.
    let shipped = Path::new(env!("CARGO_MANIFEST_DIR")).join("../config/kcache.toml");
    let out = kcache(
        &[
            "serve",
            "--kubeconfig",
            "/nonexistent/kubeconfig",
            "--config",
            &shipped.display().to_string(),
        ],
        &[],
        Some(dir.path()),
    );
    let err = text(&out);
    assert!(
        err.contains("/nonexistent/kubeconfig") && !err.contains("not_a_setting"),
        "{err}"
    );
    // No file anywhere: the built-in defaults.
    std::fs::remove_file(dir.path().join("config/kcache.toml")).expect("rm");
    if !Path::new("/etc/kcache/kcache.toml").exists() {
        let err = serve_failure(&[], Some(dir.path()));
        assert!(err.contains("/nonexistent/kubeconfig"), "{err}");
    }
}
