//! Kubernetes' own e2e specs as the judge: the reference version's api-machinery specs
//! (and the ConfigMap/Secret API specs), built from the same Go modules as the test API
//! server (`scripts/k8s/build-programs.sh`), run against the API server directly, through
//! one kcache and through a 3-replica fleet with the specs spread over the replicas — each
//! kcache in its default configuration (the API port the API server's, kcache's admin
//! endpoints on a port of their own).
//! Nobody here wrote them. A spec that passes directly and fails through kcache fails this
//! test. The specs that run on this rig are listed in `conformance/specs.txt`; the ones
//! that cannot (they need nodes, pods, webhooks, a controller-manager) and why, in
//! `docs/conformance.md`.

mod support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use support::kcache::Kcache;
use support::nats::{fleet_toml, Nats};
use support::{TestCluster, ADMIN_TOKEN};

const PODTEMPLATES: &str =
    "[[resources]]\nversion = \"v1\"\nresource = \"podtemplates\"\nkind = \"PodTemplate\"\nnamespaced = true\n";

/// How one spec ended in one run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Outcome {
    Passed,
    Failed,
    Skipped,
}

/// Failures the e2e specs are known to have on a busy API server, whatever is in front of
/// it: (what the failure says, the upstream reports). A spec that fails through kcache or
/// the fleet with one of these is run once more, alone, through the same kcache; only if
/// it fails again is it a problem. Any other failure is one at once.
const KNOWN_UPSTREAM_FLAKES: [(&str, &str); 1] = [(
    // `DeleteV1CustomResourceDefinition` waits 30 s for the CRD to leave discovery; its
    // finalizer takes longer on a loaded API server (this rig runs three, and seven spec
    // runners, on two cores).
    "failed to delete CustomResourceDefinition",
    "kubernetes/kubernetes#129989, kubernetes/kubernetes#138086",
)];

/// The upstream reports of the known flake `failure` is, if it is one.
fn known_flake(failure: &str) -> Option<&'static str> {
    KNOWN_UPSTREAM_FLAKES
        .iter()
        .find(|(says, _)| failure.contains(says))
        .map(|(_, reports)| *reports)
}

/// The applicable specs, one full spec text per line: `conformance/specs.txt`, or the
/// file `KCACHE_E2E_SPECS` names (to run a few while working on them).
fn specs() -> Vec<String> {
    let path = std::env::var_os("KCACHE_E2E_SPECS")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../conformance/specs.txt"));
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(str::to_string)
        .collect()
}

/// The runner binary: `KCACHE_E2E_TEST`, else beside the API server
/// (`scripts/k8s/build-programs.sh` puts it there; `scripts/test.sh` runs it).
fn runner() -> PathBuf {
    std::env::var_os("KCACHE_E2E_TEST")
        .map(PathBuf::from)
        .unwrap_or_else(|| support::judge_bin("kcache-e2e.test"))
}

/// A Go (RE2) regular expression matching exactly the given spec texts.
fn focus(specs: &[String]) -> String {
    specs
        .iter()
        .map(|s| {
            let mut out = String::with_capacity(s.len() + 8);
            for c in s.chars() {
                if "\\.+*?()|[]{}^$".contains(c) {
                    out.push('\\');
                }
                out.push(c);
            }
            out
        })
        .collect::<Vec<_>>()
        .join("|")
}

/// The `&…;` references XML attributes use, undone.
fn unescape_xml(s: &str) -> String {
    s.replace("&quot;", "\"")
        .replace("&apos;", "'")
        .replace("&#39;", "'")
        .replace("&#34;", "\"")
        .replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&amp;", "&")
}

/// Every spec in a ginkgo JUnit report: `<testcase name="…">` with a `<failure>`,
/// `<skipped>` or nothing inside.
fn parse_junit(xml: &str) -> BTreeMap<String, Outcome> {
    junit_cases(xml)
        .into_iter()
        .map(|(name, (outcome, _))| (name, outcome))
        .collect()
}

/// [`parse_junit`] with each failed spec's failure text (its `<failure>` or `<error>`
/// body and message, unescaped).
fn junit_cases(xml: &str) -> BTreeMap<String, (Outcome, String)> {
    let mut out = BTreeMap::new();
    let mut rest = xml;
    while let Some(start) = rest.find("<testcase ") {
        rest = &rest[start..];
        let head_end = rest.find('>').unwrap_or(rest.len());
        let head = &rest[..head_end];
        let body_end = if head.ends_with('/') {
            head_end
        } else {
            rest.find("</testcase>").unwrap_or(rest.len())
        };
        let body = &rest[head_end..body_end];
        // Ginkgo v2 names a spec's case "[It] <spec text>" (the framework's report omits
        // the label list); suite nodes ("[BeforeSuite]") keep their own names.
        if let Some(name) = head
            .split_once(" name=\"")
            .and_then(|(_, r)| r.split_once('"'))
            .map(|(n, _)| unescape_xml(n))
            .map(|n| n.strip_prefix("[It] ").map(str::to_string).unwrap_or(n))
        {
            // Ginkgo v2 says the outcome in a `status` attribute (a spec cut short by the
            // runner's end is `skipped` with an empty body); without one, the body says.
            let status = head
                .split_once(" status=\"")
                .and_then(|(_, r)| r.split_once('"'))
                .map(|(st, _)| st);
            let outcome = match status {
                Some("passed") => Outcome::Passed,
                Some("skipped" | "pending") => Outcome::Skipped,
                Some(_) => Outcome::Failed,
                None if body.contains("<failure") || body.contains("<error") => Outcome::Failed,
                None if body.contains("<skipped") => Outcome::Skipped,
                None => Outcome::Passed,
            };
            let failure = if outcome == Outcome::Failed {
                unescape_xml(body)
            } else {
                String::new()
            };
            out.insert(name, (outcome, failure));
        }
        rest = &rest[body_end.max(1)..];
    }
    out
}

/// Adds `more` to `into`: a report lists every spec it did not run as skipped, so a run
/// outcome (passed or failed) from any report wins over a skip.
fn merge(into: &mut BTreeMap<String, Outcome>, more: BTreeMap<String, Outcome>) {
    for (spec, outcome) in more {
        if outcome != Outcome::Skipped || !into.contains_key(&spec) {
            into.insert(spec, outcome);
        }
    }
}

/// Writes a kubeconfig for `server` with the admin token.
fn kubeconfig(dir: &Path, name: &str, server: &str) -> PathBuf {
    let path = dir.join(format!("kubeconfig-{name}"));
    std::fs::write(
        &path,
        format!(
            "apiVersion: v1\nkind: Config\n\
             clusters:\n- name: c\n  cluster: {{server: \"{server}\", insecure-skip-tls-verify: true}}\n\
             users:\n- name: u\n  user: {{token: {ADMIN_TOKEN}}}\n\
             contexts:\n- name: c\n  context: {{cluster: c, user: u}}\n\
             current-context: c\n"
        ),
    )
    .expect("write kubeconfig");
    path
}

/// Runs `specs` with the runner against `kubeconfig`; the outcome of each spec, and the
/// runner's output (for the failure message).
async fn run_specs(dir: &Path, name: &str, kubeconfig: &Path, specs: &[String]) -> Run {
    let report = dir.join(format!("report-{name}"));
    let log = dir.join(format!("e2e-{name}.log"));
    let log_file = std::fs::File::create(&log).expect("e2e log");
    let err_file = log_file.try_clone().expect("e2e log");
    let mut child = tokio::process::Command::new(runner())
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args([
            "--provider",
            "skeleton",
            // No controller-manager: no service account tokens, no namespace deletion.
            "--e2e-verify-service-account=false",
            "--delete-namespace=false",
            "--ginkgo.no-color",
        ])
        // Specs that run kubectl (CustomResourcePublishOpenAPI) use the reference version's.
        .arg("--kubectl-path")
        .arg(support::bin_dir().join("kubectl"))
        .arg(format!("--ginkgo.focus={}", focus(specs)))
        .arg("--report-dir")
        .arg(&report)
        .arg("--report-prefix")
        .arg(name)
        .stdin(Stdio::null())
        .stdout(log_file)
        .stderr(err_file)
        .kill_on_drop(true)
        .spawn()
        .expect("start the e2e runner");
    // Well above the slowest spec set's time; a hung spec must not hang the suite.
    let budget = Duration::from_secs(15 * 60);
    if tokio::time::timeout(budget, child.wait()).await.is_err() {
        let _ = child.kill().await;
    }
    let mut outcomes = BTreeMap::new();
    let mut failures = BTreeMap::new();
    if let Ok(entries) = std::fs::read_dir(&report) {
        for e in entries.flatten() {
            let xml = std::fs::read_to_string(e.path()).unwrap_or_default();
            let cases = junit_cases(&xml);
            for (spec, (_, failure)) in &cases {
                if !failure.is_empty() {
                    failures.insert(spec.clone(), failure.clone());
                }
            }
            merge(
                &mut outcomes,
                cases.into_iter().map(|(k, (o, _))| (k, o)).collect(),
            );
        }
    }
    Run {
        outcomes,
        failures,
        log,
    }
}

/// What one runner reported: each spec's outcome, the failed ones' failure texts, and its
/// output.
struct Run {
    outcomes: BTreeMap<String, Outcome>,
    failures: BTreeMap<String, String>,
    log: PathBuf,
}

fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubernetes_api_machinery_specs_pass_through_kcache() {
    let specs = specs();
    // The whole list, unless a developer picked a few (`KCACHE_E2E_SPECS`).
    let floor = if std::env::var_os("KCACHE_E2E_SPECS").is_some() {
        1
    } else {
        40
    };
    assert!(specs.len() >= floor, "only {} specs to run", specs.len());
    // One API server per mode: specs make cluster-scoped objects with fixed names (CRDs),
    // so the same spec cannot run twice at once against one API server.
    let (direct_cluster, single_cluster, fleet_cluster) = tokio::join!(
        TestCluster::start(),
        TestCluster::start(),
        TestCluster::start()
    );
    let dir = direct_cluster.dir_path().to_path_buf();
    // PodTemplates cached too: the chunking specs page through them, so their pages are
    // kcache's (`core::page`), not the API server's.
    let one = Kcache::start_with_admin_port(&single_cluster, PODTEMPLATES, &[]).await;
    let nats = Nats::start(fleet_cluster.dir_path());
    let toml = format!(
        "{}{PODTEMPLATES}",
        fleet_toml(fleet_cluster.dir_path(), &nats, "")
    );
    let mut fleet = Vec::new();
    for id in ["a", "b", "c"] {
        fleet.push(
            Kcache::start_with_admin_port(&fleet_cluster, &toml, &["--replica-id", id]).await,
        );
    }
    let started = Instant::now();
    // Everything at once, each mode in shards (disjoint specs): waiting is most of what
    // the specs do.
    let shard = |part: usize, of: usize| -> Vec<String> {
        specs.iter().skip(part).step_by(of).cloned().collect()
    };
    let direct_cfg = kubeconfig(&dir, "direct", &direct_cluster.url);
    let single_cfg = kubeconfig(&dir, "single", &one.url);
    let mut runs = Vec::new();
    for i in 0..2 {
        runs.push((format!("direct-{i}"), direct_cfg.clone(), shard(i, 2)));
        runs.push((format!("single-{i}"), single_cfg.clone(), shard(i, 2)));
    }
    // The fleet: a third of the specs through each replica, so a key's owner and its
    // mirrors serve different specs' clients.
    for (i, replica) in fleet.iter().enumerate() {
        let name = format!("fleet-{i}");
        let cfg = kubeconfig(&dir, &name, &replica.url);
        runs.push((name, cfg, shard(i, fleet.len())));
    }
    let results = futures::future::join_all(
        runs.iter()
            .map(|(name, cfg, part)| run_specs(&dir, name, cfg, part)),
    )
    .await;
    let elapsed = started.elapsed();
    // Per mode: each spec's outcome, and the runners' logs; per spec failed through a
    // kcache, its failure text and the kubeconfig of the run it failed in.
    let mut modes: BTreeMap<&str, (BTreeMap<String, Outcome>, Vec<PathBuf>)> = BTreeMap::new();
    let mut failed_in: BTreeMap<(&str, String), (String, PathBuf)> = BTreeMap::new();
    for ((name, cfg, _), run) in runs.iter().zip(results) {
        let mode = name.split('-').next().unwrap_or(name);
        for (spec, failure) in run.failures {
            failed_in.insert((mode, spec), (failure, cfg.clone()));
        }
        let entry = modes.entry(mode).or_default();
        merge(&mut entry.0, run.outcomes);
        entry.1.push(run.log);
    }
    let (direct, direct_logs) = &modes["direct"];
    let (single, single_logs) = &modes["single"];
    let (fleet_outcomes, fleet_logs) = &modes["fleet"];
    let mut problems = Vec::new();
    let mut failed_directly = Vec::new();
    let mut flaked = Vec::new();
    let mut counts = [0usize; 3];
    for spec in &specs {
        let d = direct.get(spec).copied();
        match d {
            None => problems.push(format!(
                "did not run at all (specs.txt out of date?): {spec}"
            )),
            Some(Outcome::Passed) => {
                counts[0] += 1;
                let through = [
                    ("single", "kcache", single.get(spec).copied(), 1),
                    ("fleet", "the fleet", fleet_outcomes.get(spec).copied(), 2),
                ];
                for (mode, what, outcome, slot) in through {
                    if outcome == Some(Outcome::Passed) {
                        counts[slot] += 1;
                        continue;
                    }
                    // A known upstream flake is run once more, alone, through the same
                    // kcache: only a second failure is kcache's.
                    let again = failed_in
                        .get(&(mode, spec.clone()))
                        .and_then(|(failure, cfg)| known_flake(failure).map(|r| (r, cfg)));
                    if let Some((reports, cfg)) = again {
                        let name = format!("{mode}-again-{}", flaked.len() + problems.len());
                        let run = run_specs(&dir, &name, cfg, std::slice::from_ref(spec)).await;
                        if run.outcomes.get(spec) == Some(&Outcome::Passed) {
                            counts[slot] += 1;
                            flaked.push(format!(
                                "through {what}, failed as a known upstream flake ({reports}), passed when run again: {spec}"
                            ));
                            continue;
                        }
                    }
                    problems.push(format!(
                        "passes directly, {outcome:?} through {what}: {spec}"
                    ));
                }
            }
            Some(other) => failed_directly.push(format!("{other:?} directly: {spec}")),
        }
    }
    eprintln!(
        "{} specs in {:.0} s: {} pass directly, {} through one kcache, {} through the fleet",
        specs.len(),
        elapsed.as_secs_f64(),
        counts[0],
        counts[1],
        counts[2]
    );
    for f in failed_directly.iter().chain(&flaked) {
        eprintln!("  {f}");
    }
    // A rig where the specs do not even pass directly judges nothing.
    assert!(
        failed_directly.len() <= 2,
        "{} specs fail against the API server itself:\n{}\n\n{}",
        failed_directly.len(),
        failed_directly.join("\n"),
        direct_logs
            .iter()
            .map(|l| tail(l, 40))
            .collect::<Vec<_>>()
            .join("\n---\n")
    );
    // A flake allowance is not a way around a failing spec: a few, or the rig is too
    // loaded to judge.
    assert!(
        flaked.len() <= 2,
        "{} specs needed a second run:\n{}",
        flaked.len(),
        flaked.join("\n")
    );
    if !problems.is_empty() {
        let mut logs = String::new();
        for l in single_logs.iter().chain(fleet_logs.iter()) {
            logs.push_str(&format!("\n--- {}:\n{}", l.display(), tail(l, 40)));
        }
        let fleet_tails: Vec<String> = fleet
            .iter()
            .enumerate()
            .map(|(i, r)| format!("kcache (fleet-{i}):\n{}", r.log_tail()))
            .collect();
        panic!(
            "{} problems:\n{}\n\n{logs}\n\nkcache (single):\n{}\n\n{}",
            problems.len(),
            problems.join("\n"),
            one.log_tail(),
            fleet_tails.join("\n\n")
        );
    }
}

#[test]
fn junit_reports_parse() {
    let xml = r#"<?xml version="1.0" encoding="UTF-8"?>
  <testsuite name="kcache-e2e" tests="3" failures="1" errors="0" time="1">
      <testcase name="[It] [sig-api-machinery] Watchers should observe add, update, and delete watch notifications on configmaps [Conformance]" classname="kcache-e2e" time="1.2"></testcase>
      <testcase name="[sig-api-machinery] Servers with support for Table transformation should return a 406 for a backend which does not implement metadata [Conformance]" classname="kcache-e2e" time="0.1">
          <failure type="Failure">x &lt; y</failure>
      </testcase>
      <testcase name="a &quot;quoted&quot; &amp; skipped" classname="kcache-e2e" time="0">
          <skipped></skipped>
      </testcase>
      <testcase name="self-closing" classname="kcache-e2e" time="0"/>
      <testcase name="[BeforeSuite]" classname="kcache-e2e" time="0"/>
      <testcase name="[It] cut short" classname="kcache-e2e" status="skipped" time="0"></testcase>
      <testcase name="[It] interrupted" classname="kcache-e2e" status="interrupted" time="0"><error message="" type="interrupted">x</error></testcase>
      <testcase name="[It] v2 passed" classname="kcache-e2e" status="passed" time="1"></testcase>
  </testsuite>"#;
    let got = parse_junit(xml);
    assert_eq!(got.len(), 8, "{got:?}");
    assert_eq!(got["[BeforeSuite]"], Outcome::Passed);
    assert_eq!(got["cut short"], Outcome::Skipped);
    assert_eq!(got["interrupted"], Outcome::Failed);
    assert_eq!(got["v2 passed"], Outcome::Passed);
    assert_eq!(
        got["[sig-api-machinery] Watchers should observe add, update, and delete watch notifications on configmaps [Conformance]"],
        Outcome::Passed
    );
    assert_eq!(
        got["[sig-api-machinery] Servers with support for Table transformation should return a 406 for a backend which does not implement metadata [Conformance]"],
        Outcome::Failed
    );
    assert_eq!(got["a \"quoted\" & skipped"], Outcome::Skipped);
    // Failure texts, and which of them are known upstream flakes.
    let cases = junit_cases(xml);
    let (_, failure) = &cases["[sig-api-machinery] Servers with support for Table transformation should return a 406 for a backend which does not implement metadata [Conformance]"];
    assert!(failure.contains("x < y"), "{failure}");
    assert_eq!(known_flake(failure), None);
    assert!(cases["v2 passed"].1.is_empty());
    assert!(known_flake(
        "[FAILED] failed to delete CustomResourceDefinition(e2e-test-x-crds.example.com): context deadline exceeded"
    )
    .is_some());
    assert_eq!(got["self-closing"], Outcome::Passed);
    assert_eq!(
        focus(&["a [b] (c).d".into(), "e|f".into()]),
        r"a \[b\] \(c\)\.d|e\|f"
    );
}
