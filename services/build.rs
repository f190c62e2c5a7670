//! Stamps the git revision into the binary (`kcache --version`, `kcache_build_info`):
//! `KCACHE_GIT_REVISION` when set (builds from a source tarball), else `git rev-parse`,
//! else "unknown".

use std::process::Command;

fn main() {
    println!("cargo:rerun-if-env-changed=KCACHE_GIT_REVISION");
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    for f in [".git/HEAD", ".git/refs/heads", ".git/packed-refs"] {
        if root.join(f).exists() {
            println!("cargo:rerun-if-changed={}", root.join(f).display());
        }
    }
    let rev = std::env::var("KCACHE_GIT_REVISION")
        .ok()
        .filter(|r| !r.is_empty())
        .or_else(|| {
            Command::new("git")
                .args(["rev-parse", "--short=12", "HEAD"])
                .current_dir(&root)
                .output()
                .ok()
                .filter(|o| o.status.success())
                .and_then(|o| String::from_utf8(o.stdout).ok())
                .map(|s| s.trim().to_string())
                .filter(|s| !s.is_empty())
        })
        .unwrap_or_else(|| "unknown".to_string());
    println!("cargo:rustc-env=KCACHE_GIT_REVISION={rev}");
}
