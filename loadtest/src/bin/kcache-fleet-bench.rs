//! The fleet benchmark (`loadtest/fleet.sh`): single-object Secret watches spread over the
//! replicas of a kcache fleet, writes to the API server, and in one run:
//!
//! - upstream watches the API server holds (`apiserver_longrunning_requests{verb="WATCH"}`) and the
//!   fleet's `kcache_upstream_watches`, against the number of client watches;
//! - write→delivery latency for watches on the key's owner (same replica) and on the
//!   other replicas (events crossed NATS), so the added cross-replica latency is measured
//!   beside its own reference;
//! - failover (`--failover`, 2+ replicas), `--kills` times: ConfigMaps `fo0..` written
//!   every `--failover-write-ms` and watched on every replica, the Secrets still written
//!   at `--writes-per-sec`; the owner of `fo0`'s key (`/debug/keys`) is killed with
//!   SIGKILL, and the time from the kill to the first write made after the kill arriving
//!   on a watch on a surviving replica ("events flowing again") is recorded, with whether
//!   every write around the kill reached every surviving watch. The killed replica is
//!   started again (`--restart-cmd`, same port and flags), its watches reopened, and the
//!   fleet left to settle before the next kill. Takeovers while the owner is alive:
//!   `kcache_fleet_ownership_changes_total` summed over the replicas (a killed replica's
//!   counters as last read before the kill), against what the kills explain (one
//!   acquisition per key the killed replica owned; a restart explains none).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::Parser;
use serde_json::{json, Value};

use kcache_loadtest::fleet::failover;
use kcache_loadtest::fleet::replica::{debug_keys, http, metric, Replica};
use kcache_loadtest::fleet::watches::{open_watches, summary, Api, Collected};

#[derive(Parser)]
struct Args {
    #[arg(long)]
    apiserver: String,
    /// `URL=PID` of each replica.
    #[arg(long = "replica", required = true)]
    replicas: Vec<String>,
    #[arg(long, default_value = "admintoken")]
    token: String,
    #[arg(long, default_value = "fleetbench")]
    namespace: String,
    #[arg(long, default_value_t = 100)]
    secrets: usize,
    /// Watches per secret on each replica.
    #[arg(long, default_value_t = 4)]
    per_replica: usize,
    #[arg(long, default_value_t = 20)]
    writes_per_sec: u64,
    #[arg(long, default_value_t = 20)]
    seconds: u64,
    /// Kill the owner of a written key and time the takeover (needs 2+ replicas).
    #[arg(long)]
    failover: bool,
    /// Kills in the failover phase (more than one needs --restart-cmd).
    #[arg(long, default_value_t = 20)]
    kills: usize,
    /// Shell command starting replica `{i}` (its index) again with the same port and
    /// flags, in the background; its last line of output is the new pid.
    #[arg(long)]
    restart_cmd: Option<String>,
    /// ConfigMaps `fo0..` written during the failover phase; `fo0`'s owner is the one
    /// killed.
    #[arg(long, default_value_t = 4)]
    failover_keys: usize,
    /// Each failover ConfigMap is written every this many milliseconds.
    #[arg(long, default_value_t = 75)]
    failover_write_ms: u64,
    /// Watches per failover ConfigMap on each replica.
    #[arg(long, default_value_t = 2)]
    failover_watches: usize,
    /// Seconds between a restarted replica's watches being open and the next kill.
    #[arg(long, default_value_t = 5)]
    settle_secs: u64,
    /// A kill after which no write reaches a survivor within this is "not recovered".
    #[arg(long, default_value_t = 30)]
    recover_timeout_secs: u64,
    #[arg(long)]
    out: Option<String>,
}

/// The failover phase's settings from the flags.
fn failover_params(args: &Args) -> failover::Params {
    failover::Params {
        kills: args.kills,
        restart_cmd: args.restart_cmd.clone(),
        failover_keys: args.failover_keys,
        failover_write_ms: args.failover_write_ms,
        failover_watches: args.failover_watches,
        writes_per_sec: args.writes_per_sec,
        per_replica: args.per_replica,
        settle_secs: args.settle_secs,
        recover_timeout_secs: args.recover_timeout_secs,
    }
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    let mut replicas: Vec<Replica> = args
        .replicas
        .iter()
        .map(|r| {
            let (url, pid) = r.rsplit_once('=').expect("--replica URL=PID");
            Replica {
                url: url.to_string(),
                pid: pid.parse().expect("pid"),
                client: http(),
            }
        })
        .collect();
    let http = http();
    let api = Api::new(&args.apiserver, &args.token, &args.namespace, args.secrets);
    // Setup: the namespace and the secrets (idempotent).
    api.create_namespace().await;
    for i in 0..args.secrets {
        api.create(i).await;
    }
    // The API server's Secret watches (`apiserver_registered_watchers`, which this read
    // before, was removed in 1.25).
    let kind = &[("resource", "secrets"), ("verb", "WATCH")][..];
    let baseline = metric(
        &http,
        &args.apiserver,
        &args.token,
        "apiserver_longrunning_requests",
        kind,
    )
    .await;

    let sink = Arc::new(Mutex::new(Collected::default()));
    for (r, rep) in replicas.iter().enumerate() {
        open_watches(&api, rep, r, 0..args.secrets, |_| args.per_replica, &sink);
    }
    let client_watches = replicas.len() * args.secrets * args.per_replica;
    let deadline = Instant::now() + Duration::from_secs(120);
    while sink.lock().expect("c").added < client_watches && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    let upstream_apiserver = metric(
        &http,
        &args.apiserver,
        &args.token,
        "apiserver_longrunning_requests",
        kind,
    )
    .await
        - baseline;
    let mut upstream_kcache = 0.0;
    // Owner of each secret's key, by replica index.
    let mut owner: HashMap<usize, usize> = HashMap::new();
    for (r, rep) in replicas.iter().enumerate() {
        upstream_kcache +=
            metric(&http, &rep.url, &args.token, "kcache_upstream_watches", &[]).await;
        let keys = debug_keys(&http, &rep.url, &args.token).await;
        for k in keys["keys"].as_array().into_iter().flatten() {
            let role = k["role"].as_str().unwrap_or("owner");
            let key = k["key"].as_str().unwrap_or("");
            let prefix = format!("/api/v1/namespaces/{}/secrets/s", args.namespace);
            if let Some(i) = key
                .strip_prefix(&prefix)
                .and_then(|s| s.parse::<usize>().ok())
            {
                if role == "owner" || replicas.len() == 1 {
                    owner.insert(i, r);
                }
            }
        }
    }
    eprintln!(
        "{} replicas: {client_watches} client watches, {} ADDED, API server +{upstream_apiserver} watches, fleet upstream watches {upstream_kcache}",
        replicas.len(),
        sink.lock().expect("c").added
    );

    // Latency phase.
    let interval = Duration::from_secs(1) / args.writes_per_sec.max(1) as u32;
    let started = Instant::now();
    let mut next = Instant::now();
    let mut i = 0;
    while started.elapsed() < Duration::from_secs(args.seconds) {
        api.write(i % args.secrets).await;
        i += 1;
        next += interval;
        tokio::time::sleep_until(next.into()).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (same, cross, expected) = {
        let c = sink.lock().expect("c");
        let mut same = Vec::new();
        let mut cross = Vec::new();
        for (r, s, lat) in &c.samples {
            if owner.get(s) == Some(r) {
                same.push(*lat);
            } else {
                cross.push(*lat);
            }
        }
        (same, cross, i * args.per_replica * replicas.len())
    };
    let delivered = same.len() + cross.len();
    eprintln!("latency: {delivered}/{expected} deliveries");

    // Failover phase.
    let mut failover = Value::Null;
    if args.failover && replicas.len() >= 2 {
        failover = failover::run(&failover_params(&args), &api, &mut replicas, &sink).await;
    }

    let result = json!({
        "replicas": replicas.len(),
        "client_watches": client_watches,
        "upstream_watches_apiserver": upstream_apiserver,
        "upstream_watches_fleet": upstream_kcache,
        "keys": args.secrets,
        "writes": i,
        "writes_per_sec": args.writes_per_sec,
        "deliveries_expected": expected,
        "same_replica": summary(same),
        "cross_replica": summary(cross),
        "failover": failover,
    });
    println!(
        "{}",
        serde_json::to_string_pretty(&result).unwrap_or_default()
    );
    if let Some(out) = &args.out {
        let _ = std::fs::write(
            out,
            serde_json::to_string_pretty(&result).unwrap_or_default(),
        );
    }
}
