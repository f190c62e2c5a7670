//! `kcache-bench`: one watch workload against the kube-apiserver and against kcache, in
//! the same run, with the same client and connection model (HTTPS, HTTP/2 with many
//! watches multiplexed per connection, bearer token, authorization on), reporting side by
//! side: RSS growth per watch and per cached object, write→delivery latency
//! (p50/p99/max), deliveries per CPU-second, CPU seconds of the target, of the API server
//! and of this generator, and the watches the API server holds (`apiserver_longrunning_requests{verb="WATCH"}`)
//! against the clients' watches.
//!
//! `loadtest/run.sh` starts a fresh cluster and kcache, pins them, and runs this binary;
//! `loadtest/standard.sh` runs the standard benchmark (scenarios 1–3) and scenario 4;
//! `objects` (100,000 cached objects, whole-namespace lists) and `kubeproxy` (5,000
//! kube-proxies' EndpointSlices and Services watches, one connection each) run on their own.
//!
//! Everything it runs is in the `kcache_loadtest` library (`lib.rs` names the rooms); this
//! binary reads the flags, runs the scenario and writes the results and plots.
//!
//! Latency is measured from just before the write request (always to the API server) to
//! the event's arrival at a watching client, matched by a unique key each write puts into
//! the object (see `record`).

use kcache_loadtest::{cli, client, plot, progress, report, scenario, workers};

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{SystemTime, UNIX_EPOCH};

use clap::Parser;
use serde_json::{json, Value};

use cli::{Args, TargetKind};
use client::{Api, ConnModel};
use progress::Progress;
use scenario::{Ctx, ScenarioRun, Target};

/// `dir/stem.json` → `dir/stem-<suffix>`.
fn beside(out: &Path, suffix: &str) -> PathBuf {
    let stem = out.file_stem().and_then(|s| s.to_str()).unwrap_or("bench");
    out.with_file_name(format!("{stem}-{suffix}"))
}

fn draw_plots(args: &Args, run: &ScenarioRun, progress: &Progress) -> Vec<String> {
    let out = Path::new(&args.out);
    let name = args.scenario.name();
    let mut done = Vec::new();
    // A scenario without writes (objects) has no latency to plot, nor watches to plot
    // RSS against.
    if run.series.iter().any(|s| !s.sorted.is_empty()) {
        let cdf = beside(out, "latency-cdf.png");
        match plot::latency_cdf(
            &cdf,
            &format!("{name}: write -> delivery latency"),
            &run.series,
        ) {
            Ok(()) => done.push(cdf.display().to_string()),
            Err(e) => progress.log(&format!("latency plot: {e}")),
        }
    }
    if run.reports.iter().any(|r| !r.rss_steps.is_empty()) {
        let rss = beside(out, "rss.png");
        match plot::rss_vs_watches(
            &rss,
            &format!("{name}: RSS growth vs watches"),
            &run.reports,
        ) {
            Ok(()) => done.push(rss.display().to_string()),
            Err(e) => progress.log(&format!("RSS plot: {e}")),
        }
    }
    done
}

#[tokio::main]
async fn main() -> ExitCode {
    // A child holding a share of the watch connections: see `workers`.
    if std::env::args().nth(1).as_deref() == Some(workers::WORKER_ARG) {
        return workers::serve().await;
    }
    let args = Args::parse();
    let progress = Progress::new(!args.no_progress);
    let targets = args
        .targets
        .iter()
        .map(|k| match k {
            TargetKind::Apiserver => Target {
                kind: *k,
                name: "kube-apiserver",
                url: args.apiserver.trim_end_matches('/').to_string(),
                pid: args.apiserver_pid,
                replicas: Vec::new(),
            },
            TargetKind::Kcache => Target {
                kind: *k,
                name: "kcache",
                url: args.kcache.trim_end_matches('/').to_string(),
                pid: args.kcache_pid,
                replicas: args.kcache_replicas.clone(),
            },
        })
        .collect();
    let ctx = Ctx {
        model: ConnModel {
            http1: args.http1,
            per_connection: args.per_connection,
            source_addrs: args.source_addrs,
        },
        api: Api::new(&args.apiserver, &args.token),
        progress: progress.clone(),
        targets,
        args: args.clone(),
    };
    let started = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    progress.log(&format!(
        "kcache-bench: scenario {}; pinning: {}",
        args.scenario.name(),
        args.pinning
    ));
    let run = scenario::run(&ctx).await;
    progress.finish();

    let plots = if args.no_plots {
        Vec::new()
    } else {
        draw_plots(&args, &run, &progress)
    };
    let mut out = json!({
        "scenario": args.scenario.name(),
        "started_unix": started,
        "machine": {
            "cores": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        },
        "pinning": args.pinning,
        "connection_model": {
            "protocol": if args.http1 { "HTTP/1.1 (one connection per watch)" } else { "HTTPS, HTTP/2" },
            "watches_per_connection": if args.http1 { 1 } else { args.per_connection },
            "source_addresses": args.source_addrs,
            "auth": "bearer token (same for both targets), authorization on",
        },
        "workload": run.workload,
        "results": run.reports,
        "side_by_side": report::side_by_side(&run.reports),
        "notes": run.notes,
        "plots": plots,
    });
    for (name, section) in run.sections {
        out[name] = section;
    }
    // Latency CDF points, so the plots can be redrawn from the JSON.
    out["latency_cdf_ms"] = Value::Object(
        run.series
            .iter()
            .map(|s| (s.label.clone(), json!(report::cdf_points(&s.sorted, 200))))
            .collect(),
    );
    println!("{}", report::table(&run.reports));
    for n in out["notes"].as_array().into_iter().flatten() {
        if let Some(n) = n.as_str() {
            println!("note: {n}");
        }
    }
    let text = match serde_json::to_string_pretty(&out) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("encoding results: {e}");
            return ExitCode::FAILURE;
        }
    };
    if let Err(e) = std::fs::write(&args.out, text) {
        eprintln!("writing {}: {e}", args.out);
        return ExitCode::FAILURE;
    }
    for p in &plots {
        println!("plot: {p}");
    }
    println!("results: {}", args.out);
    ExitCode::SUCCESS
}
