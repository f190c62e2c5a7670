//! `kcache-coalesce-report`: puts the three runs of `loadtest/coalesce.sh` (`kcache-bench
//! --scenario coalesce` against the API server directly, through kcache with coalescing
//! off, and with it on) side by side in one JSON file, judges issue 16's targets and
//! prints the table as Markdown.
//!
//! Targets: the API server's RSS growth (from before the watches to after they settled)
//! directly at least 100× that through kcache with coalescing; at most 2 upstream watches
//! per namespace with coalescing (one per resource type, kcache's `/debug/keys`); and for
//! every target, every watch established and every write delivered to every watch of its
//! object, no more and no fewer. Also the WARN and ERROR lines of each run's kcache and
//! API server logs (`--logs DIR`, with `<part>/kcache.log` as run.sh's
//! `KCACHE_BENCH_LOG_DIR` leaves them), with a few examples.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Parser;
use serde_json::{json, Map, Value};

#[derive(Parser, Debug)]
#[command(
    name = "kcache-coalesce-report",
    about = "Side by side of the three coalesce runs (direct, kcache coalescing off, on), with issue 16's targets judged"
)]
struct Args {
    /// The combined JSON to write.
    #[arg(long)]
    out: PathBuf,
    /// The command that ran the benchmark (recorded).
    #[arg(long, default_value = "")]
    command: String,
    /// Directory with one subdirectory per part (named after its JSON file's stem) holding
    /// kcache.log and apiserver.log.
    #[arg(long)]
    logs: Option<PathBuf>,
    /// Wall time of the whole benchmark (recorded).
    #[arg(long)]
    wall_seconds: Option<u64>,
    /// Aim for the API server's RSS growth, direct over through kcache with coalescing.
    #[arg(long, default_value_t = 100.0)]
    rss_ratio_aim: f64,
    /// Aim for upstream watches per namespace with coalescing.
    #[arg(long, default_value_t = 2)]
    per_namespace_aim: u64,
    /// The parts' JSON files, in order: direct, coalescing off, coalescing on.
    #[arg(num_args = 3, required = true)]
    parts: Vec<PathBuf>,
}

/// `v` at a dotted path (`a.b.c`), or null.
fn at<'a>(v: &'a Value, path: &str) -> &'a Value {
    path.split('.').fold(v, |v, k| &v[k])
}

/// One part: its file, its report (`results[0]`) and its coalesce figures.
struct Part {
    name: &'static str,
    file: PathBuf,
    doc: Option<Value>,
}

impl Part {
    fn report(&self) -> &Value {
        self.doc.as_ref().map_or(&Value::Null, |d| &d["results"][0])
    }
    fn co(&self, path: &str) -> &Value {
        at(&self.report()["extra"]["coalesce"], path)
    }
    fn f(&self, path: &str) -> Option<f64> {
        self.co(path).as_f64()
    }
    fn r(&self, path: &str) -> Option<f64> {
        at(self.report(), path).as_f64()
    }
    fn present(&self) -> bool {
        self.doc.is_some()
    }
    /// `v` for a run through kcache, `None` for the direct one (whose target is the API
    /// server itself).
    fn kcache(&self, v: Option<f64>) -> Option<f64> {
        v.filter(|_| self.report()["target"].as_str() == Some("kcache"))
    }
}

fn mib(kib: Option<f64>) -> Option<f64> {
    kib.map(|k| k / 1024.0)
}

/// What kcache logs when it starts shutting down (run.sh stops it, and at the same time
/// the API server, once the bench is done).
const SHUTDOWN: &str = "shutting down: readiness off";

/// WARN and ERROR lines of one stretch of a log.
#[derive(Default)]
struct Levels {
    counts: BTreeMap<&'static str, usize>,
    messages: BTreeMap<String, Seen>,
    examples: BTreeMap<&'static str, Vec<String>>,
}

/// One message: how often, its first line in full (with the fields `message` cuts off,
/// e.g. `error=`) and the time stamps of its first and last lines — when in the run
/// they came.
#[derive(Default)]
struct Seen {
    count: usize,
    first_line: String,
    first: String,
    last: String,
}

impl Levels {
    fn add(&mut self, level: &'static str, line: &str) {
        *self.counts.entry(level).or_default() += 1;
        let seen = self.messages.entry(message(line)).or_default();
        seen.count += 1;
        if seen.count == 1 {
            seen.first_line = line.chars().take(400).collect();
            seen.first = stamp(line);
        }
        seen.last = stamp(line);
        let ex = self.examples.entry(level).or_default();
        if ex.len() < 5 {
            ex.push(line.chars().take(400).collect());
        }
    }

    fn json(self) -> Value {
        let mut by_count: Vec<(String, Seen)> = self.messages.into_iter().collect();
        by_count.sort_by(|a, b| b.1.count.cmp(&a.1.count).then_with(|| a.0.cmp(&b.0)));
        by_count.truncate(20);
        json!({
            "warn": self.counts.get("warn").copied().unwrap_or(0),
            "error": self.counts.get("error").copied().unwrap_or(0),
            "messages": by_count.into_iter().map(|(m, s)| json!({
                "count": s.count,
                "message": m,
                "first": s.first,
                "last": s.last,
                "first_line": s.first_line,
            })).collect::<Vec<_>>(),
            "examples": self.examples,
        })
    }
}

/// WARN and ERROR lines of a log (ANSI colour codes removed): counts, the distinct
/// messages with their counts (the message without its time stamp, cut at its first
/// `key=` field so one message about many keys counts once), the time stamps of their
/// first and last lines and their first line in full, and up to 5 examples per
/// level — for the run, and apart from it those from kcache's shutdown on (its last
/// watchers' streams, the API server stopped at the same time); `None` if the file is not
/// there.
fn log_summary(path: &Path) -> Option<Value> {
    let text = std::fs::read_to_string(path).ok()?;
    let (mut run, mut shutdown) = (Levels::default(), Levels::default());
    let mut lines = 0usize;
    let mut stopping = false;
    for raw in text.lines() {
        lines += 1;
        let line = strip_ansi(raw);
        stopping |= line.contains(SHUTDOWN);
        // tracing's format: "<time>  WARN target: message"; klog's: "W1124 ..." / "E1124 ...".
        let level = if line.contains(" WARN ") || klog_level(&line) == Some('W') {
            "warn"
        } else if line.contains(" ERROR ") || klog_level(&line) == Some('E') {
            "error"
        } else {
            continue;
        };
        if stopping { &mut shutdown } else { &mut run }.add(level, &line);
    }
    let mut out = run.json();
    out["lines"] = json!(lines);
    out["at_shutdown"] = shutdown.json();
    Some(out)
}

/// A log line without its time stamp (tracing: the first field; klog: level, date, time
/// and thread id), cut at its first `key=` field and at 200 characters.
fn message(line: &str) -> String {
    let rest = if klog_level(line).is_some() {
        // "W1124 06:15:05.123456   21598 file.go:1] message"
        line.split_whitespace()
            .skip(3)
            .collect::<Vec<_>>()
            .join(" ")
    } else {
        line.split_once(char::is_whitespace)
            .map_or(line, |(_, r)| r)
            .trim_start()
            .to_string()
    };
    let cut = rest.find(" key=").map_or(rest.as_str(), |i| &rest[..i]);
    cut.chars().take(200).collect()
}

/// A log line's time stamp: tracing's first field, or klog's time (`W1124 06:15:05.123456`).
fn stamp(line: &str) -> String {
    let mut fields = line.split_whitespace();
    if klog_level(line).is_some() {
        fields.nth(1)
    } else {
        fields.next()
    }
    .unwrap_or("")
    .to_string()
}

/// The `error=` field of a tracing line, if any (to its end: it is the last field kcache
/// writes), at most 200 characters.
fn error_field(line: &str) -> Option<String> {
    let i = line.find(" error=")?;
    Some(line[i + 1..].chars().take(200).collect())
}

/// klog's severity letter: `W1124 06:15:05.123456 ...`.
fn klog_level(line: &str) -> Option<char> {
    let mut c = line.chars();
    let level = c.next()?;
    let digits: String = c.take(4).collect();
    (matches!(level, 'I' | 'W' | 'E' | 'F')
        && digits.len() == 4
        && digits.chars().all(|d| d.is_ascii_digit()))
    .then_some(level)
}

fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            // ESC [ ... final byte in @..~
            for d in chars.by_ref() {
                if ('@'..='~').contains(&d) && d != '[' {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

fn fmt(v: Option<f64>, decimals: usize) -> String {
    match v {
        None => "–".into(),
        Some(v) if !v.is_finite() => "–".into(),
        Some(v) => {
            let s = format!("{v:.decimals$}");
            // Thousands separators on the integer part.
            let (int, frac) = s
                .split_once('.')
                .map_or((s.as_str(), None), |(i, f)| (i, Some(f)));
            let (sign, digits) = int.strip_prefix('-').map_or(("", int), |d| ("-", d));
            let mut grouped = String::new();
            for (i, ch) in digits.chars().enumerate() {
                if i > 0 && (digits.len() - i) % 3 == 0 {
                    grouped.push(',');
                }
                grouped.push(ch);
            }
            match frac {
                Some(f) => format!("{sign}{grouped}.{f}"),
                None => format!("{sign}{grouped}"),
            }
        }
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    let names = ["direct", "coalescing off", "coalescing on"];
    let parts: Vec<Part> = args
        .parts
        .iter()
        .zip(names)
        .map(|(file, name)| {
            let doc = std::fs::read_to_string(file)
                .ok()
                .and_then(|t| serde_json::from_str::<Value>(&t).ok());
            if doc.is_none() {
                eprintln!(
                    "kcache-coalesce-report: {} ({name}) missing or unreadable",
                    file.display()
                );
            }
            Part {
                name,
                file: file.clone(),
                doc,
            }
        })
        .collect();
    let [direct, off, on] = [&parts[0], &parts[1], &parts[2]];

    // The rows of the table: (label, decimals, value per part).
    type Row = (&'static str, usize, Vec<Option<f64>>);
    let each = |f: &dyn Fn(&Part) -> Option<f64>| parts.iter().map(f).collect::<Vec<_>>();
    let kind = |p: &Part, k: &str| {
        p.present()
            .then(|| p.f(&format!("apiserver_watches.added.{k}")).unwrap_or(0.0))
    };
    let rows: Vec<Row> = vec![
        ("watches requested", 0, each(&|p| p.r("client_watches"))),
        (
            "watches established",
            0,
            each(&|p| p.r("watches_established")),
        ),
        (
            "client connections (one per node)",
            0,
            each(&|p| p.f("connections")),
        ),
        ("time to establish (s)", 1, each(&|p| p.f("open_seconds"))),
        (
            "API server watches added: secrets",
            0,
            each(&|p| kind(p, "secrets")),
        ),
        (
            "API server watches added: configmaps",
            0,
            each(&|p| kind(p, "configmaps")),
        ),
        (
            "API server watches added: all resources",
            0,
            each(&|p| p.f("apiserver_watches.added_total")),
        ),
        (
            "API server watches added: peak while opening",
            0,
            each(&|p| p.f("apiserver_watches.peak_added")),
        ),
        (
            "upstream watches per namespace: max",
            0,
            each(&|p| p.f("upstream_per_namespace.max_per_namespace")),
        ),
        (
            "upstream watches per namespace: mean",
            2,
            each(&|p| p.f("upstream_per_namespace.mean_per_namespace")),
        ),
        (
            "API server RSS growth (MiB; GC + 10 s before either read)",
            1,
            each(&|p| mib(p.f("apiserver_rss_kib.growth"))),
        ),
        (
            "API server RSS growth without that GC (MiB)",
            1,
            each(&|p| mib(p.f("apiserver_rss_kib.growth_without_forced_gc"))),
        ),
        (
            "API server RSS growth, peak (MiB)",
            1,
            each(&|p| mib(p.f("apiserver_rss_kib.peak_growth"))),
        ),
        (
            "API server live heap growth, after a forced GC (MiB)",
            1,
            each(&|p| {
                p.f("apiserver_live_heap_bytes.growth")
                    .map(|b| b / 1048576.0)
            }),
        ),
        (
            "API server goroutines added",
            0,
            each(&|p| {
                p.f("apiserver_goroutines.after_settle")
                    .zip(p.f("apiserver_goroutines.before"))
                    .map(|(a, b)| a - b)
            }),
        ),
        (
            "kcache RSS growth, settled (MiB)",
            1,
            each(&|p| p.kcache(mib(p.f("target_rss_kib.growth")))),
        ),
        (
            "kcache RSS peak (MiB)",
            1,
            each(&|p| p.kcache(mib(p.f("target_rss_kib.peak")))),
        ),
        (
            "API server CPU opening + settling (s)",
            1,
            each(&|p| p.r("cpu_open.apiserver")),
        ),
        (
            "kcache CPU opening + settling (s)",
            1,
            each(&|p| p.kcache(p.r("cpu_open.target"))),
        ),
        (
            "generator CPU opening + settling (s)",
            1,
            each(&|p| p.r("cpu_open.generator")),
        ),
        ("writes", 0, each(&|p| p.r("writes"))),
        (
            "deliveries expected",
            0,
            each(&|p| p.f("deliveries.expected")),
        ),
        ("deliveries", 0, each(&|p| p.f("deliveries.delivered"))),
        ("lost", 0, each(&|p| p.f("deliveries.lost"))),
        ("surplus", 0, each(&|p| p.f("deliveries.surplus"))),
        (
            "watch errors / streams ended",
            0,
            each(&|p| {
                p.r("errors")
                    .zip(p.r("watch_streams_ended"))
                    .map(|(a, b)| a + b)
            }),
        ),
        (
            "kcache_coalescings_total",
            0,
            each(&|p| p.f("kcache_metrics.after_settle.kcache_coalescings_total")),
        ),
        (
            "kcache_coalesce_moved_watchers_total",
            0,
            each(&|p| p.f("kcache_metrics.after_settle.kcache_coalesce_moved_watchers_total")),
        ),
        (
            "kcache_coalesce_splits_total",
            0,
            each(&|p| p.f("kcache_metrics.after_settle.kcache_coalesce_splits_total")),
        ),
        (
            "kcache_covered_requests_total",
            0,
            each(&|p| p.f("kcache_metrics.after_settle.kcache_covered_requests_total")),
        ),
        (
            "kcache_upstream_watches (settled)",
            0,
            each(&|p| p.f("kcache_metrics.after_settle.kcache_upstream_watches")),
        ),
        (
            "kcache_upstream_lists_total",
            0,
            each(&|p| p.f("kcache_metrics.after_settle.kcache_upstream_lists_total")),
        ),
        (
            "kcache_upstream_errors_total",
            0,
            each(&|p| p.f("kcache_metrics.after_writes.kcache_upstream_errors_total")),
        ),
    ];

    // Logs.
    let mut logs = Map::new();
    if let Some(dir) = &args.logs {
        for p in &parts {
            let stem = p
                .file
                .file_stem()
                .and_then(|s| s.to_str())
                .unwrap_or(p.name)
                .to_string();
            logs.insert(
                p.name.to_string(),
                json!({
                    "kcache": log_summary(&dir.join(&stem).join("kcache.log")),
                    "apiserver": log_summary(&dir.join(&stem).join("apiserver.log")),
                }),
            );
        }
    }
    let log_count =
        |p: &Part, who: &str, level: &str| logs.get(p.name).and_then(|l| l[who][level].as_f64());
    let mut rows = rows;
    for (label, level) in [
        ("kcache log WARN lines (before its shutdown)", "warn"),
        ("kcache log ERROR lines (before its shutdown)", "error"),
    ] {
        let values = parts
            .iter()
            .map(|p| p.kcache(log_count(p, "kcache", level)))
            .collect();
        rows.push((label, 0, values));
    }

    // The targets.
    let growth = |p: &Part| p.f("apiserver_rss_kib.growth");
    let ratio = |a: Option<f64>, b: Option<f64>| match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => Some(a / b),
        _ => None,
    };
    let rss_ratio = ratio(growth(direct), growth(on));
    let peak_ratio = ratio(
        direct.f("apiserver_rss_kib.peak_growth"),
        on.f("apiserver_rss_kib.peak_growth"),
    );
    let heap_ratio = ratio(
        direct.f("apiserver_live_heap_bytes.growth"),
        on.f("apiserver_live_heap_bytes.growth"),
    );
    let rss_met = match (growth(direct), growth(on)) {
        (Some(d), Some(c)) if c <= 0.0 => Some(d > 0.0),
        _ => rss_ratio.map(|r| r >= args.rss_ratio_aim),
    };
    let per_ns = on.f("upstream_per_namespace.max_per_namespace");
    let per_ns_met = per_ns.map(|n| n <= args.per_namespace_aim as f64);
    let kinds_ok = on.present().then(|| {
        let namespaces = at(
            on.doc.as_ref().unwrap_or(&Value::Null),
            "workload.namespaces",
        )
        .as_f64()
        .unwrap_or(0.0);
        let added = on.f("apiserver_watches.added_total").unwrap_or(f64::MAX);
        added <= namespaces * args.per_namespace_aim as f64
    });
    let exact: Vec<(String, Option<bool>)> = parts
        .iter()
        .map(|p| {
            let all = p
                .r("watches_established")
                .zip(p.r("client_watches"))
                .map(|(a, b)| a == b);
            let delivered = p.co("deliveries.exact").as_bool();
            (p.name.to_string(), all.zip(delivered).map(|(a, b)| a && b))
        })
        .collect();
    let verdict = |m: Option<bool>| match m {
        Some(true) => "met",
        Some(false) => "NOT met",
        None => "not measured",
    };
    let goals = json!({
        "apiserver_rss_growth_direct_over_coalescing": {
            "aim": format!(">= {}x", args.rss_ratio_aim),
            "direct_growth_kib": growth(direct),
            "coalescing_on_growth_kib": growth(on),
            "coalescing_off_growth_kib": growth(off),
            "ratio": rss_ratio,
            "ratio_off": ratio(growth(direct), growth(off)),
            "ratio_of_peaks": peak_ratio,
            "ratio_of_live_heap_growth": heap_ratio,
            "verdict": verdict(rss_met),
        },
        "upstream_watches_per_namespace": {
            "aim": format!("<= {}", args.per_namespace_aim),
            "max": per_ns,
            "mean": on.f("upstream_per_namespace.mean_per_namespace"),
            "namespaces_over_aim": on.f("upstream_per_namespace.namespaces_over_2"),
            "apiserver_watches_added_within_namespaces_times_aim": kinds_ok,
            "verdict": verdict(per_ns_met.zip(kinds_ok).map(|(a, b)| a && b)),
        },
        "every_watch_established_and_every_write_delivered_exactly": exact.iter().map(|(n, m)| (n.clone(), json!(verdict(*m)))).collect::<Map<_, _>>(),
    });

    // The Markdown table.
    let mut md = String::new();
    md.push_str("| | API server directly | kcache, coalescing off | kcache, coalescing on |\n|---|---:|---:|---:|\n");
    for (label, decimals, values) in &rows {
        md.push_str(&format!("| {label} |"));
        for v in values {
            md.push_str(&format!(" {} |", fmt(*v, *decimals)));
        }
        md.push('\n');
    }
    md.push_str(&format!(
        "\nAPI server RSS growth, direct ÷ coalescing on: {} (aim ≥ {}×: **{}**); of the peaks: {}; of the live heap (after a forced GC): {}\n",
        match (rss_ratio, growth(on)) {
            (None, Some(c)) if c <= 0.0 => format!("∞ (no growth with coalescing: {} MiB)", fmt(mib(Some(c)), 1)),
            _ => fmt(rss_ratio, 1),
        },
        args.rss_ratio_aim,
        verdict(rss_met),
        fmt(peak_ratio, 1),
        fmt(heap_ratio, 1),
    ));
    md.push_str(&format!(
        "Upstream watches per namespace with coalescing: max {} (aim ≤ {}: **{}**)\n",
        fmt(per_ns, 0),
        args.per_namespace_aim,
        verdict(per_ns_met.zip(kinds_ok).map(|(a, b)| a && b)),
    ));
    for (n, m) in &exact {
        md.push_str(&format!(
            "Every watch established, every write delivered exactly ({n}): **{}**\n",
            verdict(*m)
        ));
    }
    for p in parts.iter().filter(|p| p.name != "direct") {
        for (when, path) in [("run", "messages"), ("shutdown", "at_shutdown.messages")] {
            let msgs = logs.get(p.name).map(|l| at(&l["kcache"], path));
            for m in msgs.and_then(Value::as_array).into_iter().flatten().take(5) {
                let error = m["first_line"]
                    .as_str()
                    .and_then(error_field)
                    .map_or(String::new(), |e| format!("; first: `{e}`"));
                md.push_str(&format!(
                    "kcache log ({}, {when}): {} × `{}` ({} – {}{error})\n",
                    p.name,
                    m["count"],
                    m["message"].as_str().unwrap_or(""),
                    m["first"].as_str().unwrap_or("?"),
                    m["last"].as_str().unwrap_or("?"),
                ));
            }
        }
    }

    let first = parts.iter().find_map(|p| p.doc.as_ref());
    let table: Map<String, Value> = rows
        .iter()
        .map(|(label, _, values)| {
            (
                label.to_string(),
                Value::Object(
                    parts
                        .iter()
                        .zip(values)
                        .map(|(p, v)| (p.name.to_string(), json!(v)))
                        .collect(),
                ),
            )
        })
        .collect();
    let out = json!({
        "scenario": "coalesce",
        "command": args.command,
        "wall_seconds": args.wall_seconds,
        "started_unix": first.map(|d| d["started_unix"].clone()),
        "machine": first.map(|d| d["machine"].clone()),
        "pinning": first.map(|d| d["pinning"].clone()),
        "connection_model": first.map(|d| d["connection_model"].clone()),
        "workload": first.map(|d| {
            let mut w = d["workload"].clone();
            if let Some(o) = w.as_object_mut() {
                o.remove("kcache_coalesce_min_names");
            }
            w
        }),
        "targets": parts.iter().map(|p| json!({
            "name": p.name,
            "file": p.file.display().to_string(),
            "measured": p.present(),
            "variant": p.co("variant"),
        })).collect::<Vec<_>>(),
        "goals": goals,
        "table": table,
        "table_markdown": md,
        "logs": logs,
        "notes": parts.iter().filter_map(|p| p.doc.as_ref().map(|d| (p.name, d["notes"].clone()))).collect::<BTreeMap<_, _>>(),
        "results": parts.iter().map(|p| p.report().clone()).collect::<Vec<_>>(),
    });
    let text = match serde_json::to_string_pretty(&out) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("encoding: {e}");
            return ExitCode::FAILURE;
        }
    };
    if let Err(e) = std::fs::write(&args.out, text) {
        eprintln!("writing {}: {e}", args.out.display());
        return ExitCode::FAILURE;
    }
    println!("{md}");
    println!("results: {}", args.out.display());
    if parts.iter().all(Part::present) {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_of_both_log_formats_without_colour() {
        assert_eq!(
            strip_ansi("2026-11-24T06:00:00Z \u{1b}[33m WARN\u{1b}[0m x: y"),
            "2026-11-24T06:00:00Z  WARN x: y"
        );
        assert_eq!(klog_level("W1124 06:15:05.123456   1 x.go:1] y"), Some('W'));
        assert_eq!(klog_level("I1124 06:15:05.123456"), Some('I'));
        assert_eq!(klog_level("Warning: x"), None);
        assert_eq!(
            message("W1124 06:15:05.123456   21598 controller.go:152] gone"),
            "controller.go:152] gone"
        );
        assert_eq!(
            message("2026-11-24T06:00:00Z  WARN kcache: slow key=/api/v1/x n=1"),
            "WARN kcache: slow"
        );
    }

    #[test]
    fn a_message_keeps_its_first_line_times_and_error() {
        let mut l = Levels::default();
        let line = |t: &str, k: &str| {
            format!("{t}  WARN kcache_actors::source: upstream request failed; backing off key={k} error=upstream watch of {k} failed to start: ServiceError: client error (Connect)")
        };
        l.add("warn", &line("2026-11-24T09:32:03.812058Z", "/a"));
        l.add("warn", &line("2026-11-24T09:32:09.900000Z", "/b"));
        let j = l.json();
        let m = &j["messages"][0];
        assert_eq!(m["count"], 2);
        assert_eq!(
            m["message"],
            "WARN kcache_actors::source: upstream request failed; backing off"
        );
        assert_eq!(m["first"], "2026-11-24T09:32:03.812058Z");
        assert_eq!(m["last"], "2026-11-24T09:32:09.900000Z");
        assert_eq!(
            m["first_line"].as_str().and_then(error_field).as_deref(),
            Some(
                "error=upstream watch of /a failed to start: ServiceError: client error (Connect)"
            )
        );
        assert_eq!(
            stamp("W1124 06:15:05.123456   21598 controller.go:152] gone"),
            "06:15:05.123456"
        );
        assert_eq!(error_field("2026-11-24T06:00:00Z  WARN x: y"), None);
    }

    #[test]
    fn numbers_get_thousands_separators() {
        assert_eq!(fmt(Some(150000.0), 0), "150,000");
        assert_eq!(fmt(Some(-1234.56), 1), "-1,234.6");
        assert_eq!(fmt(Some(12.0), 2), "12.00");
        assert_eq!(fmt(None, 0), "–");
    }
}
