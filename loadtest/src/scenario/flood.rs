//! Scenario `flood`: one flooding client beside normal watches and readers.
//!
//! `--watches` normal single-object watches over `--objects` ConfigMaps (their deliveries
//! measure latency, as in `slow`) and `--flood-readers` normal readers, each reading one
//! object at resourceVersion 0 every 100 ms (their answers measure latency too). Two write
//! phases of `--seconds` at `--rate`/s: the normal clients alone, then beside a flooding
//! client: `--flood-concurrency` loops listing the whole namespace at resourceVersion 0 as
//! fast as answers come, as another user (`--flood-token`, allowed to read the namespace's
//! ConfigMaps). The API server meets the flood with its priority and fairness; kcache with
//! its cache seats, shared fairly between users (`services/src/fairness.rs`). The report
//! says whether the normal clients were affected, by the `slow` scenario's rule, and what
//! the flood got (answers, 429s).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::json;

use super::slow::unaffected;
use super::{
    annotate_round_robin, between_targets, name_watches, Ctx, NameWatches, ScenarioRun, Series,
    Session,
};
use crate::client::ConnPool;
use crate::report::Latency;

const NS: &str = "bench-flood";

#[derive(Clone, Debug)]
pub struct Params {
    pub normal: usize,
    pub readers: usize,
    pub flooders: usize,
    pub objects: usize,
    pub payload_bytes: usize,
    pub rate: u64,
    pub seconds: u64,
}

impl Params {
    pub fn from_ctx(ctx: &Ctx) -> Params {
        let a = &ctx.args;
        Params {
            normal: a.watches.unwrap_or(1000).max(1),
            readers: a.flood_readers.max(1),
            flooders: a.flood_concurrency.max(1),
            objects: a.objects.unwrap_or(100).max(1),
            payload_bytes: a.payload_bytes.unwrap_or(4096),
            rate: a.rate.unwrap_or(100).max(1),
            seconds: a.seconds.unwrap_or(15),
        }
    }
}

/// The `slow` scenario's rule (`slow::unaffected`), for watch deliveries and reads alike.
const VERDICT_RULE: &str = "unaffected = answers (deliveries) with the flood >= 99.9 % of the share without, and p99 with <= max(p99 without + 5 ms, 1.5 x p99 without)";

/// Normal readers' answers in one phase: latencies of 200s, and how many were asked.
#[derive(Default)]
struct Reads {
    ok: Vec<Duration>,
    asked: usize,
}

/// Runs `readers` normal readers until `stop`, each reading one of `objects` (paths) every
/// 100 ms.
fn spawn_readers(
    base: &str,
    token: &str,
    readers: usize,
    objects: &[String],
    pool: &ConnPool,
    stop: Arc<AtomicBool>,
) -> (Arc<Mutex<Reads>>, Vec<tokio::task::JoinHandle<()>>) {
    let reads = Arc::new(Mutex::new(Reads::default()));
    let handles = (0..readers)
        .map(|r| {
            let (client, stop, reads) = (pool.get(r), stop.clone(), reads.clone());
            let url = format!("{base}{}?resourceVersion=0", objects[r % objects.len()]);
            let token = token.to_string();
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(Duration::from_millis(100));
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                while !stop.load(Ordering::Relaxed) {
                    tick.tick().await;
                    let start = Instant::now();
                    let ok = client
                        .get(&url)
                        .bearer_auth(&token)
                        .send()
                        .await
                        .is_ok_and(|r| r.status().is_success());
                    let took = start.elapsed();
                    if let Ok(mut g) = reads.lock() {
                        g.asked += 1;
                        if ok {
                            g.ok.push(took);
                        }
                    }
                }
            })
        })
        .collect();
    (reads, handles)
}

/// One phase's reads (sorted latencies of answers, how many asked) and, beside the flood,
/// the flood's (answered, refused, other).
type Phase = (Vec<Duration>, usize, Option<(u64, u64, u64)>);

/// What the flood got.
#[derive(Default)]
struct Flood {
    answered: AtomicU64,
    refused: AtomicU64,
    other: AtomicU64,
}

fn spawn_flood(
    base: &str,
    token: &str,
    loops: usize,
    pool: &ConnPool,
    stop: Arc<AtomicBool>,
) -> (Arc<Flood>, Vec<tokio::task::JoinHandle<()>>) {
    let flood = Arc::new(Flood::default());
    let url = format!("{base}/api/v1/namespaces/{NS}/configmaps?resourceVersion=0");
    let handles = (0..loops)
        .map(|i| {
            let (client, stop, flood, url) =
                (pool.get(i), stop.clone(), flood.clone(), url.clone());
            let token = token.to_string();
            tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    let resp = client.get(&url).bearer_auth(&token).send().await;
                    let counter = match resp {
                        Ok(r) if r.status().is_success() => {
                            // The whole body, as a client that uses the list would read it.
                            let _ = r.bytes().await;
                            &flood.answered
                        }
                        Ok(r) if r.status().as_u16() == 429 => {
                            // As client-go: wait as Retry-After says (1 s), then go on.
                            tokio::time::sleep(Duration::from_secs(1)).await;
                            &flood.refused
                        }
                        _ => &flood.other,
                    };
                    counter.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    (flood, handles)
}

/// Lets `user` read ConfigMaps in the scenario's namespace (idempotent). A Role of its own:
/// the `view` ClusterRole is empty without a controller-manager to aggregate it.
async fn bind_reader(ctx: &Ctx, user: &str) {
    let rbac = format!("/apis/rbac.authorization.k8s.io/v1/namespaces/{NS}");
    let role = json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {"name": "bench-flood-reader"},
        "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list", "watch"]}],
    });
    let binding = json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": "bench-flood-reader"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "bench-flood-reader"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
    });
    for (what, body) in [("roles", role), ("rolebindings", binding)] {
        if let Err(e) = ctx.api.ensure(&format!("{rbac}/{what}"), &body).await {
            ctx.progress.log(&format!("{what} for {user}: {e}"));
        }
    }
}

pub async fn run(ctx: &Ctx) -> ScenarioRun {
    let p = Params::from_ctx(ctx);
    let NameWatches {
        watches: normal,
        watchers,
        objects,
    } = name_watches(ctx, NS, p.objects, p.payload_bytes, p.normal).await;
    bind_reader(ctx, &ctx.args.flood_user).await;
    let total_writes = (p.rate * p.seconds) as usize;

    let mut reports = Vec::new();
    let mut series = Vec::new();
    let mut notes = Vec::new();
    for (i, t) in ctx.targets.iter().enumerate() {
        if i > 0 {
            between_targets(ctx).await;
        }
        let mut s = Session::start(ctx, "flood", t, 2, p.normal).await;
        let pool = ConnPool::new(&ctx.model, p.normal);
        s.open(&pool, normal.clone()).await;
        s.opened().await;
        let reader_pool = ConnPool::new(&ctx.model, p.readers);
        // The flooder is one client process: its loops share connections as one would.
        let flood_pool = ConnPool::new(&ctx.model, p.flooders);

        let mut phases: Vec<Phase> = Vec::new();
        let mut written = Vec::new();
        for phase in 0..2 {
            let stop = Arc::new(AtomicBool::new(false));
            let flood = (phase == 1).then(|| {
                ctx.progress.stage(&format!(
                    "flooding: {} loops listing {NS} as {}",
                    p.flooders, ctx.args.flood_user
                ));
                spawn_flood(
                    &t.url,
                    &ctx.args.flood_token,
                    p.flooders,
                    &flood_pool,
                    stop.clone(),
                )
            });
            let (reads, readers) = spawn_readers(
                &t.url,
                &ctx.args.token,
                p.readers,
                &objects,
                &reader_pool,
                stop.clone(),
            );
            if phase == 1 {
                s.restart_cpu();
            }
            let w = s
                .write(
                    annotate_round_robin(&objects, &watchers, total_writes),
                    p.rate,
                    phase,
                )
                .await;
            s.drain(phase, w.expected).await;
            stop.store(true, Ordering::Relaxed);
            for h in readers {
                let _ = h.await;
            }
            let mut flood_counts = None;
            if let Some((f, handles)) = flood {
                for h in handles {
                    let _ = h.await;
                }
                flood_counts = Some((
                    f.answered.load(Ordering::Relaxed),
                    f.refused.load(Ordering::Relaxed),
                    f.other.load(Ordering::Relaxed),
                ));
            }
            let reads = std::mem::take(&mut *reads.lock().unwrap_or_else(|e| e.into_inner()));
            let mut ok = reads.ok;
            ok.sort_unstable();
            phases.push((ok, reads.asked, flood_counts));
            written.push(w);
        }
        let base = s.rec.sorted(0);
        let w1 = written.pop().expect("two phases");
        let w0 = written.pop().expect("two phases");
        let (mut report, with) = s.finish(1, &w1).await;
        let watches_ok = unaffected(&base, w0.expected, &with, w1.expected);
        let (reads0, asked0, _) = &phases[0];
        let (reads1, asked1, flood) = &phases[1];
        let reads_ok = unaffected(reads0, *asked0, reads1, *asked1);
        let (answered, refused, other) = flood.unwrap_or_default();
        let secs = p.seconds.max(1) as f64;
        report.extra = json!({
            "normal_watches": p.normal,
            "normal_readers": p.readers,
            "flood_loops": p.flooders,
            "watches_alone": Latency::of(&base),
            "watches_with_flood": Latency::of(&with),
            "watch_deliveries": [base.len(), w0.expected, with.len(), w1.expected],
            "reads_alone": Latency::of(reads0),
            "reads_with_flood": Latency::of(reads1),
            "reads_answered": [reads0.len(), asked0, reads1.len(), asked1],
            "flood_answered": answered,
            "flood_answered_per_second": answered as f64 / secs,
            "flood_refused_429": refused,
            "flood_other": other,
            "normal_watches_unaffected": watches_ok,
            "normal_reads_unaffected": reads_ok,
        });
        let p99 = |s: &[Duration]| {
            Latency::of(s)
                .p99_ms
                .map_or("-".into(), |v| format!("{v:.2}"))
        };
        let verdict = |ok: bool| if ok { "unaffected" } else { "AFFECTED" };
        let line = format!(
            "{}: beside a flood of {} loops ({answered} lists answered, {refused} refused with 429, {other} other), normal watches {} (p99 {} -> {} ms, deliveries {}/{} -> {}/{}), normal reads {} (p99 {} -> {} ms, {}/{} -> {}/{} answered); {VERDICT_RULE}",
            t.name,
            p.flooders,
            verdict(watches_ok),
            p99(&base),
            p99(&with),
            base.len(),
            w0.expected,
            with.len(),
            w1.expected,
            verdict(reads_ok),
            p99(reads0),
            p99(reads1),
            reads0.len(),
            asked0,
            reads1.len(),
            asked1,
        );
        ctx.progress.log(&line);
        notes.push(line);
        series.push(Series {
            label: format!("{} watches (alone)", t.name),
            sorted: base,
        });
        series.push(Series {
            label: format!("{} watches (beside the flood)", t.name),
            sorted: with,
        });
        series.push(Series {
            label: format!("{} reads (alone)", t.name),
            sorted: phases[0].0.clone(),
        });
        series.push(Series {
            label: format!("{} reads (beside the flood)", t.name),
            sorted: phases[1].0.clone(),
        });
        reports.push(report);
    }
    ScenarioRun {
        workload: json!({
            "normal_watches": p.normal,
            "normal_readers": p.readers,
            "reader": "GET of one ConfigMap at resourceVersion 0 every 100 ms",
            "flood_loops": p.flooders,
            "flood": "list of the whole namespace at resourceVersion 0, back to back, as another user (may read its ConfigMaps); on 429 waits 1 s",
            "flood_user": ctx.args.flood_user,
            "configmaps": p.objects,
            "payload_bytes": p.payload_bytes,
            "writes_per_second": p.rate,
            "seconds_per_phase": p.seconds,
            "phases": ["normal clients alone", "beside the flood"],
            "verdict_rule": VERDICT_RULE,
        }),
        reports,
        series,
        notes,
        sections: Vec::new(),
    }
}
