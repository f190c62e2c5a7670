//! The fleet benchmark (`loadtest/fleet.sh`): single-object Secret watches spread over the
//! replicas of a kcache fleet, writes to the API server, and in one run:
//!
//! - upstream watches the API server holds (`apiserver_registered_watchers`) and the
//!   fleet's `kcache_upstream_watches`, against the number of client watches;
//! - write→delivery latency for watches on the key's owner (same replica) and on the
//!   other replicas (events crossed NATS), so the added cross-replica latency is measured
//!   beside its own reference;
//! - failover: the owner of a written key is killed with SIGKILL; the time until a watch
//!   on a surviving replica receives a write made after the kill, and whether every write
//!   made during the takeover was delivered.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use clap::Parser;
use futures::StreamExt;
use serde_json::{json, Value};

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
    #[arg(long)]
    out: Option<String>,
}

struct Replica {
    url: String,
    pid: u32,
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

async fn metric(http: &reqwest::Client, base: &str, token: &str, name: &str, label: &str) -> f64 {
    let Ok(resp) = http
        .get(format!("{base}/metrics"))
        .bearer_auth(token)
        .send()
        .await
    else {
        return 0.0;
    };
    let text = resp.text().await.unwrap_or_default();
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
        .filter(|l| l.contains(label))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

async fn debug_keys(http: &reqwest::Client, base: &str, token: &str) -> Value {
    match http
        .get(format!("{base}/debug/keys"))
        .bearer_auth(token)
        .send()
        .await
    {
        Ok(r) => r.json().await.unwrap_or(Value::Null),
        Err(_) => Value::Null,
    }
}

/// One delivered write: (replica index, secret index, latency).
type Sample = (usize, usize, Duration);

#[derive(Default)]
struct Collected {
    added: usize,
    samples: Vec<Sample>,
    /// (written, received) timestamps (ns) per (replica, secret), for the failover check.
    delivered: HashMap<(usize, usize), Vec<(u128, u128)>>,
}

fn spawn_watch(
    http: reqwest::Client,
    url: String,
    token: String,
    replica: usize,
    secret: usize,
    sink: Arc<Mutex<Collected>>,
) {
    tokio::spawn(async move {
        let Ok(resp) = http.get(url).bearer_auth(token).send().await else {
            return;
        };
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
                    Some("ADDED") => c.added += 1,
                    Some("MODIFIED") => {
                        let sent = ev["object"]["data"]["t"]
                            .as_str()
                            .and_then(decode_b64)
                            .and_then(|s| s.parse::<u128>().ok());
                        if let Some(sent) = sent {
                            let lat = Duration::from_nanos(received.saturating_sub(sent) as u64);
                            c.samples.push((replica, secret, lat));
                            c.delivered
                                .entry((replica, secret))
                                .or_default()
                                .push((sent, received));
                        }
                    }
                    _ => {}
                }
            }
        }
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

async fn write(http: &reqwest::Client, args: &Args, secret: usize) -> u128 {
    let t = now_ns();
    let url = format!(
        "{}/api/v1/namespaces/{}/secrets/s{secret}",
        args.apiserver, args.namespace
    );
    let _ = http
        .patch(url)
        .bearer_auth(&args.token)
        .header("content-type", "application/merge-patch+json")
        .body(json!({"stringData": {"t": t.to_string()}}).to_string())
        .send()
        .await;
    t
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    let replicas: Vec<Replica> = args
        .replicas
        .iter()
        .map(|r| {
            let (url, pid) = r.rsplit_once('=').expect("--replica URL=PID");
            Replica {
                url: url.to_string(),
                pid: pid.parse().expect("pid"),
            }
        })
        .collect();
    let http = http();
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
    let kind = "kind=\"Secret\"";
    let baseline = metric(
        &http,
        &args.apiserver,
        &args.token,
        "apiserver_registered_watchers",
        kind,
    )
    .await;

    let sink = Arc::new(Mutex::new(Collected::default()));
    let clients: Vec<reqwest::Client> = replicas.iter().map(|_| self::http()).collect();
    for (r, rep) in replicas.iter().enumerate() {
        for i in 0..args.secrets {
            for _ in 0..args.per_replica {
                let url = format!(
                    "{}/api/v1/namespaces/{}/secrets?watch=1&resourceVersion=0&fieldSelector=metadata.name%3Ds{i}",
                    rep.url, args.namespace
                );
                spawn_watch(
                    clients[r].clone(),
                    url,
                    args.token.clone(),
                    r,
                    i,
                    sink.clone(),
                );
            }
        }
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
        "apiserver_registered_watchers",
        kind,
    )
    .await
        - baseline;
    let mut upstream_kcache = 0.0;
    // Owner of each secret's key, by replica index.
    let mut owner: HashMap<usize, usize> = HashMap::new();
    for (r, rep) in replicas.iter().enumerate() {
        upstream_kcache +=
            metric(&http, &rep.url, &args.token, "kcache_upstream_watches", "").await;
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
        write(&http, &args, i % args.secrets).await;
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
        let victim = owner.get(&0).copied().unwrap_or(0);
        let survivors: Vec<usize> = (0..replicas.len()).filter(|r| *r != victim).collect();
        // Writes to s0 every 50 ms from before the kill until well after it.
        let kill_at = now_ns();
        let _ = std::process::Command::new("kill")
            .args(["-9", &replicas[victim].pid.to_string()])
            .status();
        let mut written = Vec::new();
        let until = Instant::now() + Duration::from_secs(20);
        // Events flow again when a survivor receives the first write made after the kill.
        let first_after_kill = |c: &Collected| {
            survivors
                .iter()
                .filter_map(|r| c.delivered.get(&(*r, 0)))
                .flat_map(|v| v.iter())
                .filter(|(sent, _)| *sent > kill_at)
                .map(|(_, received)| *received)
                .min()
        };
        while Instant::now() < until {
            written.push(write(&http, &args, 0).await);
            tokio::time::sleep(Duration::from_millis(50)).await;
            let first = first_after_kill(&sink.lock().expect("c"));
            if first.is_some_and(|r| now_ns() > r + 3_000_000_000) {
                break;
            }
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
        let c = sink.lock().expect("c");
        let recovered_ns = first_after_kill(&c);
        let per_survivor: Vec<Value> = survivors
            .iter()
            .map(|r| {
                let got: Vec<u128> = c
                    .delivered
                    .get(&(*r, 0))
                    .map(|v| v.iter().map(|(sent, _)| *sent).collect())
                    .unwrap_or_default();
                let missing = written.iter().filter(|t| !got.contains(t)).count();
                json!({"replica": r, "written_after_kill": written.len(), "missing_per_watch_set": missing})
            })
            .collect();
        failover = json!({
            "victim": victim,
            "events_flowing_again_after_ms": recovered_ns.map(|r| (r.saturating_sub(kill_at)) as f64 / 1e6),
            "survivors": per_survivor,
        });
        eprintln!("failover: {failover}");
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
