//! `kcache-bench`: the same watch workload against the kube-apiserver and against kcache,
//! in one run, with the same client and connection model (HTTPS, HTTP/2 multiplexed,
//! bearer token), reporting RSS per idle watch, write→delivery latency and CPU seconds.
//!
//! Kubelet pattern: `objects` Secrets, `per_object` single-object watches each
//! (`fieldSelector=metadata.name=X`), then writes at `rate`/s; every watch of the written
//! object must deliver the event. Latency is measured from just before the write request
//! to the event's arrival, keyed by an annotation carrying the write's sequence number.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::Parser;
use futures::StreamExt;
use serde::Serialize;
use serde_json::{json, Value};

#[derive(Parser, Clone)]
struct Args {
    /// API server URL (writes always go here).
    #[arg(long)]
    apiserver: String,
    /// PID of the kube-apiserver process (RSS, CPU).
    #[arg(long)]
    apiserver_pid: u32,
    /// kcache URL.
    #[arg(long)]
    kcache: String,
    /// PID of the kcache process.
    #[arg(long)]
    kcache_pid: u32,
    #[arg(long, default_value = "admintoken")]
    token: String,
    #[arg(long, default_value_t = 100)]
    objects: usize,
    #[arg(long, default_value_t = 10)]
    per_object: usize,
    /// Writes per second during the latency phase.
    #[arg(long, default_value_t = 100)]
    rate: u64,
    /// Seconds of writes.
    #[arg(long, default_value_t = 10)]
    seconds: u64,
    /// Watches per HTTP/2 connection (the API server allows 250 streams per connection).
    #[arg(long, default_value_t = 200)]
    per_connection: usize,
    /// ConfigMaps (1 KiB each) for the per-cached-object figure.
    #[arg(long, default_value_t = 5000)]
    cached_objects: usize,
    /// Use HTTP/1.1 (one connection per watch) instead of HTTP/2.
    #[arg(long)]
    http1: bool,
    /// Where to write the JSON results.
    #[arg(long, default_value = "bench-results.json")]
    out: String,
}

#[derive(Serialize, Default, Clone)]
struct TargetResult {
    target: String,
    watches: usize,
    rss_before_kib: u64,
    rss_after_kib: u64,
    rss_per_watch_bytes: f64,
    /// The API server's RSS growth while these watches were open (upstream cost).
    apiserver_rss_growth_kib: i64,
    deliveries: usize,
    expected_deliveries: usize,
    latency_p50_ms: f64,
    latency_p99_ms: f64,
    latency_max_ms: f64,
    target_cpu_seconds: f64,
    apiserver_cpu_seconds: f64,
}

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse().ok()))
        })
        .unwrap_or(0)
}

/// utime + stime of a process, in seconds.
fn cpu_seconds(pid: u32) -> f64 {
    let ticks = 100.0; // USER_HZ on Linux
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            let after = s.rsplit_once(") ")?.1;
            let f: Vec<&str> = after.split_whitespace().collect();
            let u: f64 = f.get(11)?.parse().ok()?;
            let k: f64 = f.get(12)?.parse().ok()?;
            Some((u + k) / ticks)
        })
        .unwrap_or(0.0)
}

fn client() -> reqwest::Client {
    client_with(false)
}

fn client_with(http1: bool) -> reqwest::Client {
    let b = reqwest::Client::builder();
    let b = if http1 { b.http1_only() } else { b };
    b.danger_accept_invalid_certs(true)
        .pool_max_idle_per_host(1)
        .build()
        .expect("http client")
}

async fn request(
    http: &reqwest::Client,
    method: reqwest::Method,
    url: &str,
    token: &str,
    body: Option<Value>,
) -> Value {
    let mut r = http.request(method, url).bearer_auth(token);
    if let Some(b) = body {
        r = r
            .header("Content-Type", "application/merge-patch+json")
            .body(b.to_string());
    }
    match r.send().await {
        Ok(resp) => resp.json().await.unwrap_or(Value::Null),
        Err(e) => {
            eprintln!("request {url}: {e}");
            Value::Null
        }
    }
}

async fn setup(args: &Args) {
    let http = client();
    let base = &args.apiserver;
    let create = |name: String, kind: &str, data: Value| {
        let http = http.clone();
        let url = format!("{base}/api/v1/namespaces/bench/{kind}");
        let token = args.token.clone();
        async move {
            let _ = http
                .post(url)
                .bearer_auth(token)
                .json(&json!({"metadata": {"name": name}, "data": data}))
                .send()
                .await;
        }
    };
    let _ = http
        .post(format!("{base}/api/v1/namespaces"))
        .bearer_auth(&args.token)
        .json(&json!({"metadata": {"name": "bench"}}))
        .send()
        .await;
    let _ = http
        .post(format!("{base}/api/v1/namespaces"))
        .bearer_auth(&args.token)
        .json(&json!({"metadata": {"name": "bench-objects"}}))
        .send()
        .await;
    futures::stream::iter(
        (0..args.objects).map(|i| create(format!("s{i}"), "secrets", json!({"v": "MA=="}))),
    )
    .buffer_unordered(16)
    .collect::<Vec<_>>()
    .await;
}

async fn run_target(args: &Args, target: &str, base: &str, pid: u32) -> TargetResult {
    let watches = args.objects * args.per_object;
    let rss_before = rss_kib(pid);
    let api_rss_before = rss_kib(args.apiserver_pid);
    let cpu_before = cpu_seconds(pid);
    let api_cpu_before = cpu_seconds(args.apiserver_pid);
    let ready = Arc::new(AtomicUsize::new(0));
    let sent_at: Arc<Mutex<HashMap<u64, Instant>>> = Arc::default();
    let latencies: Arc<Mutex<Vec<Duration>>> = Arc::default();
    let clients: Vec<reqwest::Client> = (0..watches.div_ceil(args.per_connection))
        .map(|_| client())
        .collect();
    let mut tasks = Vec::new();
    for w in 0..watches {
        let name = format!("s{}", w % args.objects);
        let url = format!(
            "{base}/api/v1/namespaces/bench/secrets?watch=1&resourceVersion=0&fieldSelector=metadata.name%3D{name}"
        );
        let http = clients[w / args.per_connection].clone();
        let token = args.token.clone();
        let (ready, sent_at, latencies) = (ready.clone(), sent_at.clone(), latencies.clone());
        tasks.push(tokio::spawn(async move {
            let Ok(resp) = http.get(url).bearer_auth(token).send().await else {
                return;
            };
            let mut stream = resp.bytes_stream();
            let mut buf = Vec::new();
            while let Some(Ok(chunk)) = stream.next().await {
                let now = Instant::now();
                buf.extend_from_slice(&chunk);
                while let Some(pos) = buf.iter().position(|b| *b == b'\n') {
                    let line: Vec<u8> = buf.drain(..=pos).collect();
                    let Ok(ev) = serde_json::from_slice::<Value>(&line) else {
                        continue;
                    };
                    match ev["type"].as_str() {
                        Some("ADDED") => {
                            ready.fetch_add(1, Ordering::Relaxed);
                        }
                        Some("MODIFIED") => {
                            let seq = ev["object"]["metadata"]["annotations"]["bench-seq"]
                                .as_str()
                                .and_then(|s| s.parse::<u64>().ok());
                            if let Some(seq) = seq {
                                let t0 = sent_at.lock().ok().and_then(|m| m.get(&seq).copied());
                                if let (Some(t0), Ok(mut l)) = (t0, latencies.lock()) {
                                    l.push(now - t0);
                                }
                            }
                        }
                        _ => {}
                    }
                }
            }
        }));
    }
    let deadline = Instant::now() + Duration::from_secs(120);
    while ready.load(Ordering::Relaxed) < watches && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Let allocations settle before reading RSS.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let rss_after = rss_kib(pid);
    let api_rss_after = rss_kib(args.apiserver_pid);
    eprintln!(
        "{target}: {} of {watches} watches ready; RSS {rss_before} -> {rss_after} KiB",
        ready.load(Ordering::Relaxed)
    );

    // Writes at a fixed rate, round robin over the objects, always to the API server.
    let writer = client();
    let total = (args.rate * args.seconds) as usize;
    let interval = Duration::from_secs_f64(1.0 / args.rate as f64);
    let start = Instant::now();
    let seq_base = if target == "kcache" { 1_000_000 } else { 0 };
    let mut writes = Vec::new();
    for i in 0..total {
        let due = start + interval * i as u32;
        tokio::time::sleep_until(due.into()).await;
        let seq = seq_base + i as u64;
        let url = format!(
            "{}/api/v1/namespaces/bench/secrets/s{}",
            args.apiserver,
            i % args.objects
        );
        if let Ok(mut m) = sent_at.lock() {
            m.insert(seq, Instant::now());
        }
        let (writer, token) = (writer.clone(), args.token.clone());
        writes.push(tokio::spawn(async move {
            request(
                &writer,
                reqwest::Method::PATCH,
                &url,
                &token,
                Some(json!({"metadata": {"annotations": {"bench-seq": seq.to_string()}}})),
            )
            .await;
        }));
    }
    for w in writes {
        let _ = w.await;
    }
    let expected = total * args.per_object;
    let deadline = Instant::now() + Duration::from_secs(30);
    while latencies.lock().map(|l| l.len()).unwrap_or(0) < expected && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let cpu_after = cpu_seconds(pid);
    let api_cpu_after = cpu_seconds(args.apiserver_pid);
    for t in tasks {
        t.abort();
    }
    let mut l = latencies.lock().map(|l| l.clone()).unwrap_or_default();
    l.sort();
    let pct = |p: f64| -> f64 {
        if l.is_empty() {
            return f64::NAN;
        }
        let i = ((l.len() as f64 * p).ceil() as usize).clamp(1, l.len()) - 1;
        l[i].as_secs_f64() * 1000.0
    };
    TargetResult {
        target: target.into(),
        watches,
        rss_before_kib: rss_before,
        rss_after_kib: rss_after,
        rss_per_watch_bytes: (rss_after as f64 - rss_before as f64) * 1024.0 / watches as f64,
        apiserver_rss_growth_kib: api_rss_after as i64 - api_rss_before as i64,
        deliveries: l.len(),
        expected_deliveries: expected,
        latency_p50_ms: pct(0.50),
        latency_p99_ms: pct(0.99),
        latency_max_ms: l
            .last()
            .map(|d| d.as_secs_f64() * 1000.0)
            .unwrap_or(f64::NAN),
        target_cpu_seconds: cpu_after - cpu_before,
        apiserver_cpu_seconds: api_cpu_after - api_cpu_before,
    }
}

/// kcache's RSS growth per cached object: one namespace key holding `n` 1 KiB ConfigMaps,
/// read once with resourceVersion=0 (which makes kcache list and cache them).
async fn per_cached_object(args: &Args) -> Value {
    let http = client();
    let payload = "x".repeat(1024);
    let base = args.apiserver.clone();
    futures::stream::iter((0..args.cached_objects).map(|i| {
        let (http, token, base, payload) = (
            http.clone(),
            args.token.clone(),
            base.clone(),
            payload.clone(),
        );
        async move {
            let _ = http
                .post(format!("{base}/api/v1/namespaces/bench-objects/configmaps"))
                .bearer_auth(token)
                .json(&json!({"metadata": {"name": format!("cm{i}")}, "data": {"v": payload}}))
                .send()
                .await;
        }
    }))
    .buffer_unordered(16)
    .collect::<Vec<_>>()
    .await;
    let before = rss_kib(args.kcache_pid);
    let list = request(
        &http,
        reqwest::Method::GET,
        &format!(
            "{}/api/v1/namespaces/bench-objects/configmaps?resourceVersion=0",
            args.kcache
        ),
        &args.token,
        None,
    )
    .await;
    let items = list["items"].as_array().map_or(0, Vec::len);
    let json_bytes = list["items"].to_string().len();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let after = rss_kib(args.kcache_pid);
    json!({
        "objects": items,
        "json_bytes_per_object": json_bytes as f64 / items.max(1) as f64,
        "kcache_rss_growth_kib": after as i64 - before as i64,
        "kcache_rss_per_object_bytes": (after as f64 - before as f64) * 1024.0 / items.max(1) as f64,
    })
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    setup(&args).await;
    let direct = run_target(
        &args,
        "kube-apiserver",
        &args.apiserver.clone(),
        args.apiserver_pid,
    )
    .await;
    // Let the API server release what the direct watches held.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let cached = run_target(&args, "kcache", &args.kcache.clone(), args.kcache_pid).await;
    let objects = per_cached_object(&args).await;
    let added_p99 = cached.latency_p99_ms - direct.latency_p99_ms;
    let out = json!({
        "workload": {
            "objects": args.objects, "watches_per_object": args.per_object,
            "writes_per_second": args.rate, "seconds": args.seconds,
            "watches_per_http2_connection": args.per_connection,
        },
        "results": [direct, cached],
        "per_cached_object": objects,
        "ratios": {
            "rss_per_watch_kcache_over_apiserver": cached.rss_per_watch_bytes / direct.rss_per_watch_bytes,
            "p99_added_by_kcache_ms": added_p99,
        },
    });
    let text = serde_json::to_string_pretty(&out).unwrap_or_default();
    if let Err(e) = std::fs::write(&args.out, &text) {
        eprintln!("writing {}: {e}", args.out);
    }
    println!("{text}");
}
