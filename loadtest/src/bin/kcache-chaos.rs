//! `kcache-chaos`: the driver of the chaos soak. `loadtest/chaos.sh` starts the API server
//! and etcd, writes the run scripts of the NATS nodes and kcache replicas, and runs this
//! with their names; this starts them, starts the clients, the reference watch and the
//! writer, injects seeded faults for `--duration`, heals everything, lets the clients
//! settle, judges every client's event stream, prints the result and writes it as JSON.
//!
//! Exit status: 0 clean, 1 the judge found lost, duplicated, went-back or phantom events
//! or a final-state mismatch in kcache's clients, 2 the soak itself could not judge (a
//! setup failure, a hole in the reference history, or the control clients — straight to
//! the API server — not clean, which would make the judge suspect).

use kcache_loadtest::chaos;

use std::collections::{BTreeMap, HashSet};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::api::{ListParams, PostParams};
use kube::Api;

use chaos::clients::{Client, Stall, LOG_CAP};
use chaos::counters::{Counters, COUNTERS};
use chaos::etcd::Etcd;
use chaos::faults::{Env, NatsNode, Replica, Schedule, Sizes};
use chaos::judge::judge;
use chaos::observe::{now_ms, Log};
use chaos::procs::{stop_all, wait_tcp, Proc};
use chaos::report::{diff, Mismatch, Report, Totals};
use chaos::rng::Rng;
use chaos::transport::{Endpoint, Failover};
use chaos::truth::Truth;
use chaos::writer::{object_name, Writer};
use kcache_loadtest::client::insecure_client;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

#[derive(Parser, Debug)]
#[command(
    about = "Chaos soak of a kcache fleet: faults, clients, and a judge of every event stream"
)]
struct Args {
    /// The API server (`https://127.0.0.1:PORT`).
    #[arg(long)]
    apiserver: String,
    #[arg(long, default_value = "admintoken")]
    token: String,
    /// etcd's client URL (`http://127.0.0.1:PORT`): the reference watch and compaction.
    #[arg(long)]
    etcd: String,
    /// The script that kills -9 the API server and starts it again
    /// (`$KUBE_DIR/restart-apiserver.sh`).
    #[arg(long)]
    restart_apiserver: String,
    /// Where `<name>.run` scripts are; `<name>.pid` is written there.
    #[arg(long)]
    dir: PathBuf,
    /// A kcache replica: `NAME=https://127.0.0.1:PORT` (its script: `<dir>/NAME.run`).
    #[arg(long = "replica", required = true)]
    replicas: Vec<String>,
    /// A NATS node: `NAME=CLIENT_PORT` (its script: `<dir>/NAME.run`).
    #[arg(long = "nats", required = true)]
    nats: Vec<String>,
    /// Seconds of faults.
    #[arg(long, default_value_t = 600)]
    duration: u64,
    /// Seeds the fault schedule and the writes (default: from the clock, printed).
    #[arg(long)]
    seed: Option<u64>,
    #[arg(long, default_value = "chaos")]
    namespace: String,
    /// ConfigMaps the writer creates, updates and deletes (`c0`..).
    #[arg(long, default_value_t = 40)]
    objects: usize,
    #[arg(long, default_value_t = 10.0)]
    writes_per_sec: f64,
    /// Filler bytes per ConfigMap.
    #[arg(long, default_value_t = 2048)]
    payload: usize,
    /// Namespace-wide reflectors per replica.
    #[arg(long, default_value_t = 2)]
    reflectors_per_replica: usize,
    /// How many replicas (the first ones) have reflectors among their clients; default
    /// every one. With fewer, the others' single-object watches start name keys, which
    /// adaptive coalescing folds into the namespace key the reflectors' replicas run
    /// (fleet-wide: the names are counted across replicas).
    #[arg(long)]
    reflector_replicas: Option<usize>,
    /// Fails the run (as unjudgeable, exit 2) when the replicas counted no coalescing or
    /// no watcher moved: the soak is then meant to judge watches moved by adaptive
    /// coalescing under faults, and one where none moved judged none.
    #[arg(long)]
    require_coalescing: bool,
    /// Single-object (kubelet-pattern) watches per replica.
    #[arg(long, default_value_t = 50)]
    watches_per_replica: usize,
    /// More single-object watches per replica, each starting at a seeded random time
    /// during the faults: names become watched while replicas die and come back, so
    /// adaptive coalescing crosses its threshold (and moves watchers) under faults, not
    /// only before them.
    #[arg(long, default_value_t = 0)]
    late_watches_per_replica: usize,
    /// Single-object watches straight to the API server (the control, beside one
    /// reflector).
    #[arg(long, default_value_t = 4)]
    control_watches: usize,
    /// Longest wait for every client to reach the final state after the faults.
    #[arg(long, default_value_t = 60)]
    settle_secs: u64,
    /// Where to write the JSON result.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Checks the judge on this run's real logs: before judging, the first kcache
    /// reflector's log loses every 50th event and repeats one, so the run must come
    /// out with that many lost and one duplicated (and fail).
    #[arg(long)]
    judge_self_test: bool,
}

fn pair(s: &str) -> Result<(String, String), BoxError> {
    let (a, b) = s
        .split_once('=')
        .ok_or_else(|| format!("expected NAME=VALUE, got {s:?}"))?;
    Ok((a.to_string(), b.to_string()))
}

/// A client that trusts the test certificates; its requests give up after `timeout`
/// when one is given.
fn insecure_http(timeout: Option<Duration>) -> reqwest::Client {
    insecure_client(Duration::from_secs(3), timeout)
}

/// The clients, with the flag saying which are the control.
struct Fleet {
    clients: Vec<(Client, bool)>,
    /// The labels of the clients that start during the faults.
    late: HashSet<String>,
}

fn log() -> Arc<Log> {
    Arc::new(Log::new(LOG_CAP))
}

fn start_clients(
    args: &Args,
    rng: &mut Rng,
    names: &[String],
    replica_eps: &Arc<Vec<Endpoint>>,
    apiserver_ep: &Arc<Vec<Endpoint>>,
) -> Fleet {
    let ns = &args.namespace;
    let mut clients = Vec::new();
    let mut late = HashSet::new();
    let mut add = |c: Client, control: bool| {
        clients.push((c, control));
    };
    let with_reflectors = args.reflector_replicas.unwrap_or(names.len());
    for (i, home) in names.iter().enumerate() {
        let reflectors = if i < with_reflectors {
            args.reflectors_per_replica
        } else {
            0
        };
        for k in 0..reflectors {
            let l = log();
            let kube =
                Failover::new(replica_eps.clone(), i, &args.token, Some(l.clone())).into_client(ns);
            add(
                Client::reflector(format!("{home}/reflector-{k}"), home.clone(), kube, l, ns),
                false,
            );
        }
        for k in 0..args.watches_per_replica {
            // Each replica starts at a different object, so every object is watched on
            // every replica and the replicas do not all mirror one pattern.
            let object = object_name((i * 13 + k) % args.objects.max(1));
            let l = log();
            let kube =
                Failover::new(replica_eps.clone(), i, &args.token, Some(l.clone())).into_client(ns);
            add(
                Client::single(
                    format!("{home}/watch-{k}-{object}"),
                    home.clone(),
                    kube,
                    l,
                    ns,
                    &object,
                    Duration::ZERO,
                ),
                false,
            );
        }
        for k in 0..args.late_watches_per_replica {
            let object = object_name(rng.below(args.objects.max(1)));
            let after = Duration::from_millis(rng.range(0, args.duration * 1000));
            let l = log();
            let kube =
                Failover::new(replica_eps.clone(), i, &args.token, Some(l.clone())).into_client(ns);
            late.insert(format!("{home}/late-{k}-{object}"));
            add(
                Client::single(
                    format!("{home}/late-{k}-{object}"),
                    home.clone(),
                    kube,
                    l,
                    ns,
                    &object,
                    // After the writer and the faults have started (the others' lists).
                    Duration::from_secs(5) + after,
                ),
                false,
            );
        }
    }
    let l = log();
    let kube = Failover::new(apiserver_ep.clone(), 0, &args.token, Some(l.clone())).into_client(ns);
    add(
        Client::reflector(
            "apiserver/reflector-0".into(),
            "apiserver".into(),
            kube,
            l,
            ns,
        ),
        true,
    );
    for k in 0..args.control_watches {
        let object = object_name((k * 7) % args.objects.max(1));
        let l = log();
        let kube =
            Failover::new(apiserver_ep.clone(), 0, &args.token, Some(l.clone())).into_client(ns);
        add(
            Client::single(
                format!("apiserver/watch-{k}-{object}"),
                "apiserver".into(),
                kube,
                l,
                ns,
                &object,
                Duration::ZERO,
            ),
            true,
        );
    }
    Fleet { clients, late }
}

/// The API server's ConfigMaps of the namespace (a consistent list): name → RV.
async fn apiserver_state(api: &Api<ConfigMap>) -> Option<BTreeMap<String, u64>> {
    let list = tokio::time::timeout(Duration::from_secs(10), api.list(&ListParams::default()))
        .await
        .ok()?
        .ok()?;
    Some(
        list.items
            .iter()
            .map(|c| {
                (
                    c.metadata.name.clone().unwrap_or_default(),
                    c.metadata
                        .resource_version
                        .as_deref()
                        .and_then(|r| r.parse().ok())
                        .unwrap_or(0),
                )
            })
            .collect(),
    )
}

/// For `--judge-self-test`: drops every 50th event of a log and repeats the first one
/// left; returns (dropped, repeated).
fn tamper(log: &mut Vec<chaos::observe::Obs>) -> (usize, usize) {
    use chaos::observe::Obs;
    let mut n = 0;
    let mut dropped = 0;
    log.retain(|o| {
        if !matches!(o, Obs::Event { .. }) {
            return true;
        }
        n += 1;
        let keep = n % 50 != 0;
        dropped += usize::from(!keep);
        keep
    });
    let first = log.iter().position(|o| matches!(o, Obs::Event { .. }));
    match first {
        Some(i) => {
            let again = log[i].clone();
            log.insert(i + 1, again);
            (dropped, 1)
        }
        None => (dropped, 0),
    }
}

async fn run(args: Args) -> Result<Report, BoxError> {
    let seed = args.seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(1)
    });
    eprintln!("kcache-chaos: seed {seed}, {} s of faults", args.duration);
    let mut rng = Rng::new(seed);
    let write_rng = rng.fork(1);
    let fault_rng = rng.fork(2);
    let mut client_rng = rng.fork(3);
    let http = insecure_http(None);
    let ns = args.namespace.clone();

    let replica_args: Vec<(String, String)> = args
        .replicas
        .iter()
        .map(|s| pair(s))
        .collect::<Result<_, _>>()?;
    let nats_args: Vec<(String, String)> = args
        .nats
        .iter()
        .map(|s| pair(s))
        .collect::<Result<_, _>>()?;
    let apiserver_ep = Arc::new(vec![Endpoint::new("apiserver", &args.apiserver)?]);
    let replica_eps = Arc::new(
        replica_args
            .iter()
            .map(|(n, u)| Endpoint::new(n, u))
            .collect::<Result<Vec<_>, _>>()?,
    );
    let admin = Failover::new(apiserver_ep.clone(), 0, &args.token, None).into_client(&ns);
    let namespaces: Api<Namespace> = Api::all(admin.clone());
    let nsobj: Namespace = serde_json::from_value(serde_json::json!({"metadata": {"name": ns}}))?;
    match namespaces.create(&PostParams::default(), &nsobj).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 409 => {}
        Err(e) => return Err(format!("creating namespace {ns}: {e}").into()),
    }

    // --- the fleet: NATS first (kcache creates its lease stream at start), then kcache.
    let mut nats = Vec::new();
    for (name, port) in &nats_args {
        let mut p = Proc::new(name, &args.dir);
        p.start()?;
        nats.push(NatsNode {
            proc: p,
            port: port.parse()?,
        });
    }
    for n in &nats {
        if !wait_tcp(n.port, Duration::from_secs(30)).await {
            return Err(format!("NATS {} not listening on {}", n.proc.name, n.port).into());
        }
    }
    let mut replicas = Vec::new();
    for (name, url) in &replica_args {
        let mut p = Proc::new(name, &args.dir);
        p.start()?;
        replicas.push(Replica {
            proc: p,
            url: url.clone(),
        });
    }
    let mut env = Env {
        replicas,
        nats,
        http: http.clone(),
        token: args.token.clone(),
        apiserver: args.apiserver.clone(),
        restart_apiserver: args.restart_apiserver.clone(),
        etcd: Etcd::new(&args.etcd),
        namespace: ns.clone(),
        stalls: Vec::new(),
    };
    for i in 0..env.replicas.len() {
        if !env.replica_ready(i, Duration::from_secs(90)).await {
            return Err(format!("{} not ready in 90 s", env.replicas[i].proc.name).into());
        }
    }
    eprintln!(
        "kcache-chaos: {} NATS nodes and {} replicas up at t={} ms",
        env.nats.len(),
        env.replicas.len(),
        now_ms()
    );

    // --- reference watch, clients, writer.
    let truth = Truth::start(env.etcd.clone(), &ns).await?;
    let names: Vec<String> = replica_args.iter().map(|(n, _)| n.clone()).collect();
    let fleet = start_clients(&args, &mut client_rng, &names, &replica_eps, &apiserver_ep);
    env.stalls = fleet
        .clients
        .iter()
        .filter(|(c, control)| !control && c.label.contains("/reflector-"))
        .map(|(c, _)| (c.label.clone(), c.stall.clone()))
        .collect::<Vec<(String, Arc<Stall>)>>();
    let deadline = Instant::now() + Duration::from_secs(60);
    let listed = |c: &Client| fleet.late.contains(&c.label) || c.log.has_listed();
    while Instant::now() < deadline && !fleet.clients.iter().all(|(c, _)| listed(c)) {
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let mut harness_errors = Vec::new();
    let unlisted = fleet.clients.iter().filter(|(c, _)| !listed(c)).count();
    eprintln!(
        "kcache-chaos: {} clients ({} not listed yet) at t={} ms; writing and injecting faults",
        fleet.clients.len(),
        unlisted,
        now_ms()
    );
    let counters = Counters::start(
        // A paused replica accepts the connection and never answers.
        insecure_http(Some(Duration::from_secs(2))),
        replica_args.iter().map(|(_, u)| u.clone()).collect(),
        args.token.clone(),
    );
    let stop = Arc::new(AtomicBool::new(false));
    let writer = tokio::spawn(
        Writer {
            api: Api::namespaced(admin.clone(), &ns),
            objects: args.objects.max(1),
            per_sec: args.writes_per_sec,
            payload: args.payload,
            rng: write_rng,
        }
        .run(stop.clone()),
    );

    // --- faults.
    let sizes = Sizes {
        replicas: env.replicas.len(),
        nats: env.nats.len(),
        objects: args.objects,
        clients: env.stalls.len(),
    };
    let mut schedule = Schedule::new(fault_rng, sizes);
    let duration = Duration::from_secs(args.duration);
    let chaos_start = Instant::now();
    let mut fault_log = Vec::new();
    loop {
        let (gap, fault) = schedule.next_fault();
        let left = duration.saturating_sub(chaos_start.elapsed());
        tokio::time::sleep(Duration::from_millis(gap).min(left)).await;
        if chaos_start.elapsed() >= duration {
            break;
        }
        let done = env.inject(fault_log.len() + 1, &fault).await;
        eprintln!(
            "kcache-chaos: fault {} t={:.1}s..{:.1}s {}: {}",
            done.n,
            done.start_ms as f64 / 1000.0,
            done.end_ms as f64 / 1000.0,
            done.kind.name(),
            done.what
        );
        fault_log.push(done);
    }
    let chaos_secs = chaos_start.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    let writes = writer.await.unwrap_or_default();
    let heal = env.heal().await;
    eprintln!(
        "kcache-chaos: faults over at t={} ms; healed: {heal:?}; settling",
        now_ms()
    );

    // --- settle: every client's view equals the API server's state.
    let cms: Api<ConfigMap> = Api::namespaced(admin.clone(), &ns);
    let settle_start = Instant::now();
    let settle_deadline = settle_start + Duration::from_secs(args.settle_secs);
    let mut expected = BTreeMap::new();
    let mut settled = false;
    while Instant::now() < settle_deadline {
        if let Some(state) = apiserver_state(&cms).await {
            let all = fleet
                .clients
                .iter()
                .all(|(c, _)| diff(&c.view(), &state, |n| c.scope.covers(n)).is_empty());
            expected = state;
            if all {
                settled = true;
                break;
            }
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let settle_secs = settle_start.elapsed().as_secs_f64();
    // Late duplicates or stray events would arrive now.
    tokio::time::sleep(Duration::from_secs(2)).await;
    for (c, _) in &fleet.clients {
        c.stop();
    }
    let counted = counters.finish().await;
    let count = |name: &str| counted.get(name).copied().unwrap_or(0.0);
    let (coalesced, moved) = (count(COUNTERS[0]), count(COUNTERS[2]));
    if args.require_coalescing && (coalesced == 0.0 || moved == 0.0) {
        harness_errors.push(format!(
            "--require-coalescing: the replicas counted {coalesced} coalescings and {moved} watchers moved; a soak without both judged nothing of coalescing"
        ));
    }
    // Stop the fleet gracefully (kcache releases its leases on SIGTERM).
    let mut procs: Vec<&mut Proc> = env.replicas.iter_mut().map(|r| &mut r.proc).collect();
    stop_all(&mut procs, Duration::from_secs(5)).await;
    let mut procs: Vec<&mut Proc> = env.nats.iter_mut().map(|n| &mut n.proc).collect();
    stop_all(&mut procs, Duration::from_secs(5)).await;

    // --- judge.
    if let Ok(b) = truth.broken.lock() {
        if let Some(e) = b.as_ref() {
            harness_errors.push(e.clone());
        }
    }
    let history = truth.history.lock().map_err(|_| "history lock poisoned")?;
    if history.final_state() != expected {
        harness_errors.push(format!(
            "the reference history's final state ({} objects) differs from the API server's ({} objects)",
            history.final_state().len(),
            expected.len()
        ));
    }
    let mut kcache = Totals::default();
    let mut control = Totals::default();
    let mut mismatches = Vec::new();
    let mut examples = Vec::new();
    let mut tampered = false;
    for (c, is_control) in &fleet.clients {
        if c.log.overflowed() {
            harness_errors.push(format!("{}: log overflowed; not judged", c.label));
            continue;
        }
        let mut log = c.log.snapshot();
        if args.judge_self_test && !*is_control && c.label.ends_with("/reflector-0") && !tampered {
            tampered = true;
            let (dropped, repeated) = tamper(&mut log);
            harness_errors.push(format!(
                "judge self-test: {} lost {dropped} events and repeated {repeated} in its log before judging",
                c.label
            ));
        }
        let v = judge(&history, &c.scope, &c.label, &c.home, &log, history.last_rv);
        let d = diff(&c.view(), &expected, |n| c.scope.covers(n));
        if !d.is_empty() {
            mismatches.push(Mismatch {
                client: c.label.clone(),
                differences: d.clone(),
            });
        }
        let t = if *is_control {
            &mut control
        } else {
            &mut kcache
        };
        t.add(&v, !d.is_empty());
        examples.extend(v.examples);
    }
    if !control.clean() {
        harness_errors.push("the control clients (straight to the API server) are not clean: the judge or the harness is wrong".into());
    }
    let mut faults: BTreeMap<&'static str, usize> = BTreeMap::new();
    for d in &fault_log {
        *faults.entry(d.kind.name()).or_default() += 1;
    }
    let kinds: HashSet<_> = fault_log.iter().map(|d| d.kind).collect();
    eprintln!(
        "kcache-chaos: {} faults of {} kinds",
        fault_log.len(),
        kinds.len()
    );
    let pass = kcache.clean() && harness_errors.is_empty() && settled;
    if !settled {
        harness_errors.push(format!(
            "not every client reached the API server's state within {} s (counted in final-state mismatches)",
            args.settle_secs
        ));
    }
    Ok(Report {
        seed,
        duration_secs: args.duration,
        chaos_secs,
        replicas: env.replicas.len(),
        nats_nodes: env.nats.len(),
        faults_not_carried_out: fault_log.iter().filter(|d| !d.ok).count(),
        faults,
        events_judged: kcache.events_judged,
        lost: kcache.lost,
        duplicated: kcache.duplicated,
        went_back: kcache.went_back,
        relists_forced: kcache.relists_forced,
        final_state_mismatches: kcache.final_state_mismatches,
        kcache_clients: kcache,
        control_clients: control,
        true_events: history.events,
        writes,
        settled,
        settle_secs,
        kcache_counters: counted,
        fault_log,
        heal,
        mismatches,
        examples,
        harness_errors,
        pass,
    })
}

#[tokio::main]
async fn main() -> ExitCode {
    now_ms(); // the soak's clock starts here
    let args = Args::parse();
    let out = args.out.clone();
    match run(args).await {
        Ok(report) => {
            report.print();
            if let Some(out) = out {
                match serde_json::to_string_pretty(&report) {
                    Ok(json) => {
                        if let Err(e) = std::fs::write(&out, json + "\n") {
                            eprintln!("kcache-chaos: writing {}: {e}", out.display());
                        } else {
                            println!("result: {}", out.display());
                        }
                    }
                    Err(e) => eprintln!("kcache-chaos: JSON: {e}"),
                }
            }
            let kcache_clean = report.kcache_clients.clean();
            if !kcache_clean {
                ExitCode::from(1)
            } else if !report.pass {
                ExitCode::from(2)
            } else {
                ExitCode::SUCCESS
            }
        }
        Err(e) => {
            eprintln!("kcache-chaos: {e}");
            ExitCode::from(2)
        }
    }
}
