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

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use clap::Parser;
use futures::StreamExt;
use serde_json::{json, Value};

use kcache_loadtest::probe::{scrape, sum_where};

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

struct Replica {
    url: String,
    pid: u32,
    client: reqwest::Client,
}

fn now_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0)
}

fn http() -> reqwest::Client {
    reqwest::Client::builder()
        .danger_accept_invalid_certs(true)
        .build()
        .expect("http client")
}

async fn metric(
    http: &reqwest::Client,
    base: &str,
    token: &str,
    name: &str,
    labels: &[(&str, &str)],
) -> f64 {
    scrape(http, base, token)
        .await
        .map_or(0.0, |t| sum_where(&t, name, labels))
}

async fn debug_keys(http: &reqwest::Client, base: &str, token: &str) -> Value {
    match http
        .get(format!("{base}/debug/keys"))
        .bearer_auth(token)
        .timeout(Duration::from_secs(10))
        .send()
        .await
    {
        Ok(r) => r.json().await.unwrap_or(Value::Null),
        Err(_) => Value::Null,
    }
}

/// The keys a replica's `/debug/keys` says it owns.
fn owned_keys(keys: &Value) -> Vec<String> {
    keys["keys"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|k| k["role"].as_str() == Some("owner"))
        .filter_map(|k| k["key"].as_str().map(str::to_string))
        .collect()
}

/// One delivered write: (replica index, key index, latency).
type Sample = (usize, usize, Duration);

/// One client watch.
struct WatchRec {
    replica: usize,
    key: usize,
    /// Its first event (the object's state) arrived.
    added_ns: Option<u128>,
    /// Its stream ended (or never opened).
    ended_ns: Option<u128>,
    /// (written, received) timestamps of each MODIFIED carrying a write's stamp.
    delivered: Vec<(u128, u128)>,
}

#[derive(Default)]
struct Collected {
    added: usize,
    samples: Vec<Sample>,
    watches: Vec<WatchRec>,
}

impl Collected {
    /// The earliest arrival, on a watch of `key` on one of `replicas`, of a write made
    /// after `after` (ns).
    fn first_after(&self, key: usize, replicas: &[usize], after: u128) -> Option<u128> {
        self.watches
            .iter()
            .filter(|w| w.key == key && replicas.contains(&w.replica))
            .flat_map(|w| w.delivered.iter())
            .filter(|(sent, _)| *sent > after)
            .map(|(_, received)| *received)
            .min()
    }
}

/// Key indices: `0..secrets` are Secrets `s<i>`, then ConfigMaps `fo<j>`.
#[derive(Clone)]
struct Api {
    http: reqwest::Client,
    apiserver: String,
    token: String,
    namespace: String,
    secrets: usize,
}

impl Api {
    fn path(&self, key: usize) -> String {
        if key < self.secrets {
            format!("/api/v1/namespaces/{}/secrets/s{key}", self.namespace)
        } else {
            format!(
                "/api/v1/namespaces/{}/configmaps/fo{}",
                self.namespace,
                key - self.secrets
            )
        }
    }

    fn watch_path(&self, key: usize) -> String {
        let (resource, name) = if key < self.secrets {
            ("secrets", format!("s{key}"))
        } else {
            ("configmaps", format!("fo{}", key - self.secrets))
        };
        format!(
            "/api/v1/namespaces/{}/{resource}?watch=1&resourceVersion=0&fieldSelector=metadata.name%3D{name}",
            self.namespace
        )
    }

    /// Writes the current time into the object; the time, if the API server took it.
    async fn write(&self, key: usize) -> Option<u128> {
        let t = now_ns();
        let body = if key < self.secrets {
            json!({"stringData": {"t": t.to_string()}})
        } else {
            json!({"data": {"t": t.to_string()}})
        };
        let resp = self
            .http
            .patch(format!("{}{}", self.apiserver, self.path(key)))
            .bearer_auth(&self.token)
            .header("content-type", "application/merge-patch+json")
            .timeout(Duration::from_secs(10))
            .body(body.to_string())
            .send()
            .await
            .ok()?;
        resp.status().is_success().then_some(t)
    }
}

fn spawn_watch(
    http: reqwest::Client,
    url: String,
    token: String,
    replica: usize,
    key: usize,
    base64: bool,
    sink: Arc<Mutex<Collected>>,
) {
    let id = {
        let mut c = sink.lock().expect("collected");
        c.watches.push(WatchRec {
            replica,
            key,
            added_ns: None,
            ended_ns: None,
            delivered: Vec::new(),
        });
        c.watches.len() - 1
    };
    tokio::spawn(async move {
        if let Ok(resp) = http.get(url).bearer_auth(token).send().await {
            let mut body = resp.bytes_stream();
            let mut buf = Vec::new();
            while let Some(Ok(chunk)) = body.next().await {
                buf.extend_from_slice(&chunk);
                while let Some(nl) = buf.iter().position(|b| *b == b'\n') {
                    let line: Vec<u8> = buf.drain(..=nl).collect();
                    let Ok(ev) = serde_json::from_slice::<Value>(&line) else {
                        continue;
                    };
                    let received = now_ns();
                    let mut c = sink.lock().expect("collected");
                    match ev["type"].as_str() {
                        Some("ADDED") => {
                            c.added += 1;
                            c.watches[id].added_ns.get_or_insert(received);
                        }
                        Some("MODIFIED") => {
                            let stamp = ev["object"]["data"]["t"].as_str();
                            let sent = if base64 {
                                stamp.and_then(decode_b64)
                            } else {
                                stamp.map(str::to_string)
                            }
                            .and_then(|s| s.parse::<u128>().ok());
                            if let Some(sent) = sent {
                                let lat =
                                    Duration::from_nanos(received.saturating_sub(sent) as u64);
                                c.samples.push((replica, key, lat));
                                c.watches[id].delivered.push((sent, received));
                            }
                        }
                        _ => {}
                    }
                }
            }
        }
        sink.lock().expect("collected").watches[id].ended_ns = Some(now_ns());
    });
}

/// Standard base64 → UTF-8 (the Secret's `data` values); small, to avoid a dependency.
fn decode_b64(s: &str) -> Option<String> {
    const A: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = Vec::new();
    let (mut acc, mut bits) = (0u32, 0);
    for c in s.bytes().filter(|c| *c != b'=') {
        let v = A.iter().position(|a| *a == c)? as u32;
        acc = (acc << 6) | v;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    String::from_utf8(out).ok()
}

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i].as_secs_f64() * 1000.0
}

fn summary(mut v: Vec<Duration>) -> Value {
    v.sort();
    json!({
        "deliveries": v.len(),
        "p50_ms": percentile(&v, 0.50),
        "p99_ms": percentile(&v, 0.99),
        "max_ms": v.last().map_or(0.0, |d| d.as_secs_f64() * 1000.0),
    })
}

/// p50/p90/p99/max of milliseconds (nearest rank, as `percentile`).
fn distribution(ms: &[f64]) -> Value {
    let mut v: Vec<Duration> = ms
        .iter()
        .map(|m| Duration::from_secs_f64(m.max(0.0) / 1000.0))
        .collect();
    v.sort();
    json!({
        "n": v.len(),
        "p50_ms": percentile(&v, 0.50),
        "p90_ms": percentile(&v, 0.90),
        "p99_ms": percentile(&v, 0.99),
        "max_ms": v.last().map_or(0.0, |d| d.as_secs_f64() * 1000.0),
    })
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// `kcache_fleet_ownership_changes_total` by `change`.
const CHANGES: [&str; 4] = ["acquired", "taken-over", "lost", "handed-over"];
type Changes = [f64; 4];

async fn changes(http: &reqwest::Client, base: &str, token: &str) -> Option<Changes> {
    for attempt in 0..5 {
        if attempt > 0 {
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        if let Some(text) = scrape(http, base, token).await {
            let mut c = [0.0; 4];
            for (slot, change) in c.iter_mut().zip(CHANGES) {
                *slot = sum_where(
                    &text,
                    "kcache_fleet_ownership_changes_total",
                    &[("change", change)],
                );
            }
            return Some(c);
        }
    }
    None
}

fn add(a: Changes, b: Changes) -> Changes {
    [a[0] + b[0], a[1] + b[1], a[2] + b[2], a[3] + b[3]]
}

fn sub(a: Changes, b: Changes) -> Changes {
    [a[0] - b[0], a[1] - b[1], a[2] - b[2], a[3] - b[3]]
}

fn changes_json(c: Changes) -> Value {
    json!({"acquired": c[0], "taken_over": c[1], "lost": c[2], "handed_over": c[3]})
}

/// Ownership counters of the whole fleet across restarts: each replica's counters as
/// last read, plus what its killed predecessors had counted when last read before their
/// kill.
struct Ledger {
    banked: Vec<Changes>,
    last: Vec<Changes>,
    scrape_failures: usize,
}

impl Ledger {
    async fn refresh(&mut self, replicas: &[Replica], token: &str, which: &[usize]) {
        for &r in which {
            if !alive(replicas[r].pid) {
                continue;
            }
            match changes(&replicas[r].client, &replicas[r].url, token).await {
                Some(c) => self.last[r] = c,
                None => self.scrape_failures += 1,
            }
        }
    }

    fn killed(&mut self, r: usize) {
        self.banked[r] = add(self.banked[r], self.last[r]);
        self.last[r] = [0.0; 4];
    }

    fn total(&self) -> Changes {
        self.banked
            .iter()
            .chain(self.last.iter())
            .fold([0.0; 4], |a, c| add(a, *c))
    }
}

fn open_watches(
    api: &Api,
    rep: &Replica,
    r: usize,
    keys: impl Iterator<Item = usize>,
    per_key: impl Fn(usize) -> usize,
    sink: &Arc<Mutex<Collected>>,
) -> usize {
    let mut n = 0;
    for key in keys {
        for _ in 0..per_key(key) {
            spawn_watch(
                rep.client.clone(),
                format!("{}{}", rep.url, api.watch_path(key)),
                api.token.clone(),
                r,
                key,
                key < api.secrets,
                sink.clone(),
            );
            n += 1;
        }
    }
    n
}

/// Starts replica `r` again with `cmd` (`{i}` → r): its new pid.
async fn restart(cmd: &str, r: usize) -> Result<u32, String> {
    let out = tokio::process::Command::new("sh")
        .arg("-c")
        .arg(cmd.replace("{i}", &r.to_string()))
        .stderr(std::process::Stdio::inherit())
        .output()
        .await
        .map_err(|e| format!("restart command: {e}"))?;
    if !out.status.success() {
        return Err(format!("restart command exited with {}", out.status));
    }
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .last()
        .and_then(|l| l.trim().parse().ok())
        .ok_or_else(|| "restart command printed no pid".to_string())
}

fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .map(|s| {
            !s.lines()
                .any(|l| l.starts_with("State:") && l.contains('Z'))
        })
        .unwrap_or(false)
}

async fn wait_ready(http: &reqwest::Client, url: &str, pid: u32, within: Duration) -> bool {
    let until = Instant::now() + within;
    while Instant::now() < until {
        if let Ok(r) = http
            .get(format!("{url}/readyz"))
            .timeout(Duration::from_secs(2))
            .send()
            .await
        {
            if r.status().is_success() {
                return true;
            }
        }
        if !alive(pid) {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}

/// The replicas whose `/debug/keys` say they own `target`, and what each owns.
async fn ownership(
    replicas: &[Replica],
    token: &str,
    target: &str,
) -> (Vec<usize>, Vec<Vec<String>>) {
    let mut owners = Vec::new();
    let mut owned = Vec::new();
    for (r, rep) in replicas.iter().enumerate() {
        let keys = owned_keys(&debug_keys(&rep.client, &rep.url, token).await);
        if keys.iter().any(|k| k == target) {
            owners.push(r);
        }
        owned.push(keys);
    }
    (owners, owned)
}

fn ms_between(from: u128, to: u128) -> f64 {
    to.saturating_sub(from) as f64 / 1e6
}

async fn failover_phase(
    args: &Args,
    api: &Api,
    replicas: &mut [Replica],
    sink: &Arc<Mutex<Collected>>,
) -> Value {
    let fo: Vec<usize> = (api.secrets..api.secrets + args.failover_keys.max(1)).collect();
    let target = fo[0];
    let target_path = api.path(target);
    for &key in &fo {
        let _ = api
            .http
            .post(format!(
                "{}/api/v1/namespaces/{}/configmaps",
                api.apiserver, api.namespace
            ))
            .bearer_auth(&api.token)
            .json(&json!({"metadata": {"name": format!("fo{}", key - api.secrets)}, "data": {"t": "0"}}))
            .send()
            .await;
    }
    let mut expected_added = sink.lock().expect("c").added;
    for (r, rep) in replicas.iter().enumerate() {
        expected_added += open_watches(
            api,
            rep,
            r,
            fo.iter().copied(),
            |_| args.failover_watches,
            sink,
        );
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    while sink.lock().expect("c").added < expected_added && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // Continuous writes: every failover ConfigMap every --failover-write-ms (their times
    // kept), and the Secrets at --writes-per-sec as background load.
    let stop = Arc::new(AtomicBool::new(false));
    let written: Arc<Mutex<HashMap<usize, Vec<u128>>>> = Arc::default();
    let mut writers = Vec::new();
    for &key in &fo {
        let (api, stop, written) = (api.clone(), stop.clone(), written.clone());
        let every = Duration::from_millis(args.failover_write_ms.max(1));
        writers.push(tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            while !stop.load(Ordering::Relaxed) {
                tick.tick().await;
                if let Some(t) = api.write(key).await {
                    written
                        .lock()
                        .expect("written")
                        .entry(key)
                        .or_default()
                        .push(t);
                }
            }
        }));
    }
    {
        let (api, stop) = (api.clone(), stop.clone());
        let every = Duration::from_secs(1) / args.writes_per_sec.max(1) as u32;
        writers.push(tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut i = 0;
            while !stop.load(Ordering::Relaxed) {
                tick.tick().await;
                let _ = api.write(i % api.secrets.max(1)).await;
                i += 1;
            }
        }));
    }
    tokio::time::sleep(Duration::from_secs(3)).await;

    let kills = if args.restart_cmd.is_some() {
        args.kills
    } else {
        if args.kills > 1 {
            eprintln!("failover: no --restart-cmd, so one kill only");
        }
        args.kills.min(1)
    };
    let mut ledger = Ledger {
        banked: vec![[0.0; 4]; replicas.len()],
        last: vec![[0.0; 4]; replicas.len()],
        scrape_failures: 0,
    };
    let all: Vec<usize> = (0..replicas.len()).collect();
    ledger.refresh(replicas, &api.token, &all).await;
    let start_total = ledger.total();
    let timeout = Duration::from_secs(args.recover_timeout_secs);
    let mut per_kill = Vec::new();
    let mut flowing = Vec::new();
    let mut all_flowing = Vec::new();
    let mut slowest_key = Vec::new();
    let mut not_recovered = 0;
    let mut explained_total = 0.0;
    let mut while_alive = 0.0;
    let mut shortfall = 0.0;
    let mut missing_total = 0;
    let mut aborted = Value::Null;
    let load_start = loadavg();

    for k in 0..kills {
        // The target key's one owner, and every key each replica owns.
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut split = 0;
        let (victim, owned) = loop {
            let (owners, owned) = ownership(replicas, &api.token, &target_path).await;
            if owners.len() == 1 {
                break (Some(owners[0]), owned);
            }
            if owners.len() > 1 {
                split += 1;
            }
            if Instant::now() > deadline {
                break (None, owned);
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        let Some(victim) = victim else {
            aborted = json!(format!(
                "kill {}: no single owner of {target_path} in 30 s",
                k + 1
            ));
            break;
        };
        let victim_keys = owned[victim].clone();
        let victim_fo: Vec<usize> = fo
            .iter()
            .copied()
            .filter(|key| victim_keys.contains(&api.path(*key)))
            .collect();
        let survivors: Vec<usize> = all.iter().copied().filter(|r| *r != victim).collect();
        ledger.refresh(replicas, &api.token, &all).await;
        let before = ledger.total();

        let kill_at = now_ns();
        let killed = tokio::process::Command::new("kill")
            .args(["-9", &replicas[victim].pid.to_string()])
            .status()
            .await
            .is_ok_and(|s| s.success());
        ledger.killed(victim);
        if !killed {
            aborted = json!(format!(
                "kill {}: kill -9 {} failed",
                k + 1,
                replicas[victim].pid
            ));
            break;
        }

        // Events flow again: the first write made after the kill arrives on a survivor,
        // for the target key and for every written key the victim owned.
        let until = Instant::now() + timeout;
        loop {
            let done = {
                let c = sink.lock().expect("c");
                victim_fo
                    .iter()
                    .chain(std::iter::once(&target))
                    .all(|key| c.first_after(*key, &survivors, kill_at).is_some())
                    && survivors
                        .iter()
                        .all(|r| c.first_after(target, &[*r], kill_at).is_some())
            };
            if done || Instant::now() > until {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let (first, per_survivor, per_key) = {
            let c = sink.lock().expect("c");
            let first = c
                .first_after(target, &survivors, kill_at)
                .map(|t| ms_between(kill_at, t));
            let per_survivor: Vec<Option<f64>> = survivors
                .iter()
                .map(|r| {
                    c.first_after(target, &[*r], kill_at)
                        .map(|t| ms_between(kill_at, t))
                })
                .collect();
            let per_key: Vec<(usize, Option<f64>)> = victim_fo
                .iter()
                .map(|key| {
                    (
                        *key,
                        c.first_after(*key, &survivors, kill_at)
                            .map(|t| ms_between(kill_at, t)),
                    )
                })
                .collect();
            (first, per_survivor, per_key)
        };
        let cap = timeout.as_secs_f64() * 1000.0;
        if first.is_none() {
            not_recovered += 1;
        }
        flowing.push(first.unwrap_or(cap));
        all_flowing.push(
            per_survivor
                .iter()
                .map(|m| m.unwrap_or(cap))
                .fold(0.0, f64::max),
        );
        slowest_key.push(
            per_key
                .iter()
                .map(|(_, m)| m.unwrap_or(cap))
                .fold(first.unwrap_or(cap), f64::max),
        );
        let (new_owners, _) = ownership(replicas, &api.token, &target_path).await;
        tokio::time::sleep(Duration::from_secs(2)).await;

        // Start the victim again, reopen its watches, let the fleet settle.
        let mut restart_ms = Value::Null;
        let mut restart_error = Value::Null;
        if let Some(cmd) = &args.restart_cmd {
            let started = Instant::now();
            match restart(cmd, victim).await {
                Ok(pid) => {
                    replicas[victim].pid = pid;
                    replicas[victim].client = http();
                    let rep = &replicas[victim];
                    if wait_ready(&rep.client, &rep.url, pid, Duration::from_secs(60)).await {
                        restart_ms = json!(started.elapsed().as_secs_f64() * 1000.0);
                        // (The count read first: open_watches locks the sink.)
                        let added = sink.lock().expect("c").added;
                        let expected = added
                            + open_watches(
                                api,
                                rep,
                                victim,
                                (0..api.secrets).chain(fo.iter().copied()),
                                |key| {
                                    if key < api.secrets {
                                        args.per_replica
                                    } else {
                                        args.failover_watches
                                    }
                                },
                                sink,
                            );
                        let deadline = Instant::now() + Duration::from_secs(60);
                        while sink.lock().expect("c").added < expected && Instant::now() < deadline
                        {
                            tokio::time::sleep(Duration::from_millis(100)).await;
                        }
                    } else {
                        restart_error = json!("not ready within 60 s");
                    }
                }
                Err(e) => restart_error = json!(e),
            }
            tokio::time::sleep(Duration::from_secs(args.settle_secs)).await;
        }

        // Every write to a failover key from 1 s before the kill until 3 s ago, on every
        // survivor watch that was open (had its object) before that.
        let check_from = kill_at.saturating_sub(1_000_000_000);
        let check_to = now_ns().saturating_sub(3_000_000_000);
        let (missing, checked, ended) = {
            let c = sink.lock().expect("c");
            let w = written.lock().expect("written");
            let (mut missing, mut checked, mut ended) = (0usize, 0usize, 0usize);
            for watch in c
                .watches
                .iter()
                .filter(|w| survivors.contains(&w.replica) && fo.contains(&w.key))
                .filter(|w| w.added_ns.is_some_and(|a| a < check_from))
            {
                if watch.ended_ns.is_some_and(|e| e > check_from) {
                    ended += 1;
                    continue;
                }
                if watch.ended_ns.is_some() {
                    continue;
                }
                let got: HashSet<u128> = watch.delivered.iter().map(|(s, _)| *s).collect();
                for t in w.get(&watch.key).into_iter().flatten() {
                    if *t >= check_from && *t <= check_to {
                        checked += 1;
                        if !got.contains(t) {
                            missing += 1;
                        }
                    }
                }
            }
            (missing, checked, ended)
        };
        missing_total += missing;

        ledger.refresh(replicas, &api.token, &all).await;
        let delta = sub(ledger.total(), before);
        let explained = victim_keys.len() as f64;
        explained_total += explained;
        let excess = delta[0] - explained;
        if excess > 0.0 {
            while_alive += excess;
        } else {
            shortfall -= excess;
        }
        let record = json!({
            "kill": k + 1,
            "victim": victim,
            "victim_owned_keys": victim_keys.len(),
            "victim_owned_written_keys": victim_fo.len(),
            "events_flowing_again_ms": first,
            "per_survivor_ms": survivors.iter().zip(&per_survivor).map(|(r, m)| json!({"replica": r, "ms": m})).collect::<Vec<_>>(),
            "per_written_key_ms": per_key.iter().map(|(key, m)| json!({"key": api.path(*key), "ms": m})).collect::<Vec<_>>(),
            "new_owner": new_owners,
            "split_owner_polls": split,
            "ownership_changes": changes_json(delta),
            "acquisitions_explained": explained,
            "takeovers_while_alive": excess.max(0.0),
            "slow_path_acquisitions": (delta[0] - delta[1]).max(0.0),
            "restart_ready_ms": restart_ms,
            "restart_error": restart_error,
            "deliveries_checked": checked,
            "deliveries_missing": missing,
            "survivor_watches_ended": ended,
        });
        eprintln!(
            "kill {:>2}/{kills}: r{victim} (owned {} keys) → events flowing again after {} ms on r{:?}; acquired {} taken-over {} lost {}; missing {missing}/{checked}",
            k + 1,
            victim_keys.len(),
            first.map_or("NOT RECOVERED".to_string(), |m| format!("{m:.0}")),
            new_owners,
            delta[0],
            delta[1],
            delta[2],
        );
        per_kill.push(record);
        if !restart_error.is_null() {
            aborted = json!(format!("kill {}: restart of r{victim} failed", k + 1));
            break;
        }
    }
    stop.store(true, Ordering::Relaxed);
    for w in writers {
        let _ = w.await;
    }

    let total = sub(ledger.total(), start_total);
    let dist = distribution(&flowing);
    let p99 = dist["p99_ms"].as_f64().unwrap_or(f64::MAX);
    let lost = total[2];
    let met = per_kill.len() == kills
        && not_recovered == 0
        && p99 <= 2000.0
        && while_alive == 0.0
        && lost == 0.0;
    let result = json!({
        "kills_requested": kills,
        "kills_done": per_kill.len(),
        "aborted": aborted,
        "target_key": target_path,
        "written_keys": fo.len(),
        "write_every_ms": args.failover_write_ms,
        "background_secret_writes_per_sec": args.writes_per_sec,
        "settle_secs": args.settle_secs,
        "events_flowing_again": dist,
        "events_flowing_again_samples_ms": flowing,
        "not_recovered": not_recovered,
        "within_2s": flowing.iter().filter(|m| **m <= 2000.0).count(),
        "every_survivor_flowing_again": distribution(&all_flowing),
        "slowest_written_victim_key": distribution(&slowest_key),
        "ownership_changes": changes_json(total),
        "acquisitions_explained_by_kills": explained_total,
        "takeovers_while_alive": while_alive,
        "acquisitions_short_of_kills": shortfall,
        "lost": lost,
        "slow_path_acquisitions": (total[0] - total[1]).max(0.0),
        "deliveries_missing": missing_total,
        "metric_scrape_failures": ledger.scrape_failures,
        "loadavg_start": load_start,
        "loadavg_end": loadavg(),
        "target": {"p99_ms_at_most": 2000, "takeovers_while_alive": 0, "met": met},
        "per_kill": per_kill,
    });
    eprintln!(
        "failover over {} kills: events flowing again p50 {:.0} ms, p90 {:.0} ms, p99 {:.0} ms, max {:.0} ms ({} within 2 s, {not_recovered} not recovered); takeovers while alive {while_alive}, lost {lost}; acquired {} (taken-over {}), explained by kills {explained_total}; missing deliveries {missing_total}; target p99 ≤ 2 s and 0 takeovers while alive: {}",
        per_kill.len(),
        dist["p50_ms"].as_f64().unwrap_or(0.0),
        dist["p90_ms"].as_f64().unwrap_or(0.0),
        p99,
        dist["max_ms"].as_f64().unwrap_or(0.0),
        result["within_2s"],
        total[0],
        total[1],
        if met { "met" } else { "NOT met" },
    );
    result
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
    let api = Api {
        http: http.clone(),
        apiserver: args.apiserver.clone(),
        token: args.token.clone(),
        namespace: args.namespace.clone(),
        secrets: args.secrets,
    };
    // Setup: the namespace and the secrets (idempotent).
    let _ = http
        .post(format!("{}/api/v1/namespaces", args.apiserver))
        .bearer_auth(&args.token)
        .json(&json!({"metadata": {"name": args.namespace}}))
        .send()
        .await;
    for i in 0..args.secrets {
        let _ = http
            .post(format!(
                "{}/api/v1/namespaces/{}/secrets",
                args.apiserver, args.namespace
            ))
            .bearer_auth(&args.token)
            .json(&json!({"metadata": {"name": format!("s{i}")}, "stringData": {"t": "0"}}))
            .send()
            .await;
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
        failover = failover_phase(&args, &api, &mut replicas, &sink).await;
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
