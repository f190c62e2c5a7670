//! The operator's side: kcache's alert rules (`deploy/observability/alerts.yaml`) are
//! valid Prometheus rules, fire as their unit tests say (`promtool test rules`), and
//! read only metrics kcache defines.

use std::path::{Path, PathBuf};
use std::process::Command;

fn observability() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/observability")
}

fn promtool(args: &[&str]) {
    let out = Command::new("promtool")
        .args(args)
        .current_dir(observability())
        .output()
        .expect("run promtool (Debian package prometheus; scripts/ensure-deps.sh installs it)");
    assert!(
        out.status.success(),
        "promtool {args:?}:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn alert_rules_are_valid_and_fire_as_tested() {
    promtool(&["check", "rules", "alerts.yaml"]);
    promtool(&["test", "rules", "alerts_test.yaml"]);
}

/// A metric renamed in the code must not leave an alert reading nothing.
#[test]
fn alerts_read_only_metrics_kcache_defines() {
    let rules = std::fs::read_to_string(observability().join("alerts.yaml")).expect("alerts.yaml");
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut sources = String::new();
    for dir in ["actors/src", "services/src"] {
        for entry in walk(&root.join(dir)) {
            sources.push_str(&std::fs::read_to_string(entry).unwrap_or_default());
        }
    }
    let mut names: Vec<&str> = rules
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|w| w.starts_with("kcache_"))
        .collect();
    names.sort();
    names.dedup();
    assert!(names.len() >= 5, "{names:?}");
    for name in names {
        assert!(
            sources.contains(&format!("\"{name}\"")),
            "alerts.yaml reads {name}, which kcache does not define"
        );
    }
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
    out
}
