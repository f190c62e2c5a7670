//! The resume benchmark (`loadtest/resume.sh`, issue 30.2): one ConfigMap written at
//! `--writes-per-sec` through the whole run; a NATS subscriber (`kcache-subscriber`)
//! follows its namespace's key from a snapshot, goes away for `--away` seconds keeping its
//! position, and comes back from it. Judged against the resourceVersions the API server
//! gave the writes: every write seen exactly once, in order; whether the return needed a
//! snapshot; how long the catch-up took. The reference, in the same run: a watch on the
//! API server itself from the last resourceVersion the subscriber had seen before it left
//! (what an informer does when it comes back), timed to the same last write.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::Parser;
use futures::StreamExt;
use serde_json::{json, Value};

use kcache_loadtest::client::{insecure_client, Api};
use kcache_subscriber::{follow, Options, Position, Subscription, Update};

#[derive(Parser)]
struct Args {
    #[arg(long)]
    apiserver: String,
    #[arg(long, default_value = "admintoken")]
    token: String,
    #[arg(long)]
    nats: String,
    #[arg(long)]
    nats_token_file: String,
    #[arg(long, default_value = "resume-bench")]
    namespace: String,
    #[arg(long, default_value_t = 20)]
    writes_per_sec: u64,
    /// Following live before leaving.
    #[arg(long, default_value_t = 10)]
    before: u64,
    #[arg(long, default_value_t = 30)]
    away: u64,
    /// Following live after the catch-up, while the writes go on.
    #[arg(long, default_value_t = 10)]
    after: u64,
    #[arg(long)]
    out: Option<String>,
}

type Error = Box<dyn std::error::Error>;

/// The resourceVersions of the writes, in order, and when each was acknowledged.
type Written = Arc<Mutex<Vec<u64>>>;

fn rv_of(v: &Value) -> Option<u64> {
    v["metadata"]["resourceVersion"].as_str()?.parse().ok()
}

async fn next(sub: &mut Subscription) -> Result<Update, Error> {
    Ok(tokio::time::timeout(Duration::from_secs(30), sub.next())
        .await
        .map_err(|_| "no update within 30 s")?
        .ok_or("the subscription ended")?)
}

/// Events' resourceVersions until `until` passes, and the position; counts snapshots
/// and notes a resume's end.
async fn collect(
    sub: &mut Subscription,
    seen: &mut Vec<u64>,
    position: &mut Option<Position>,
    resumed: &mut Option<u64>,
    until: Instant,
) -> Result<usize, Error> {
    let mut snapshots = 0;
    while Instant::now() < until {
        let left = until.saturating_duration_since(Instant::now());
        let Ok(update) = tokio::time::timeout(left, next(sub)).await else {
            break;
        };
        let update = update?;
        *position = update.position().or(*position);
        match update {
            Update::Event { line, .. } => {
                let ev: Value = serde_json::from_slice(&line)?;
                seen.extend(rv_of(&ev["object"]));
            }
            Update::Snapshot { .. } => snapshots += 1,
            Update::Resumed { replayed } => *resumed = Some(replayed),
            _ => {}
        }
    }
    Ok(snapshots)
}

#[tokio::main]
async fn main() -> Result<(), Error> {
    let args = Args::parse();
    let api = Api::new(&args.apiserver, &args.token);
    let ns = &args.namespace;
    api.ensure_namespace(ns).await?;
    let cms = format!("/api/v1/namespaces/{ns}/configmaps");
    api.ensure(&cms, &json!({"metadata": {"name": "counter"}}))
        .await?;
    let nats = async_nats::ConnectOptions::new()
        .token(
            std::fs::read_to_string(&args.nats_token_file)?
                .trim()
                .to_string(),
        )
        .connect(&args.nats)
        .await?;
    let key = format!("_.v1.configmaps.{ns}.all._");
    let opts = Options::new("kcache", &key);

    // Follow from a snapshot (the owner may still be starting: the library asks again).
    let mut sub = follow(nats.clone(), opts.clone(), None).await?;
    let mut position = None;
    loop {
        let u = next(&mut sub).await?;
        position = u.position().or(position);
        if matches!(u, Update::Snapshot { .. }) {
            break;
        }
    }

    // The writer: from now to the end of the run.
    let written: Written = Arc::default();
    let total = Duration::from_secs(args.before + args.away + args.after);
    let writer = {
        let (api, written) = (api.clone(), written.clone());
        let path = format!("{cms}/counter");
        let period = Duration::from_micros(1_000_000 / args.writes_per_sec.max(1));
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(period);
            let end = Instant::now() + total;
            let mut i = 0u64;
            while Instant::now() < end {
                tick.tick().await;
                i += 1;
                let patch = json!({"data": {"i": i.to_string()}});
                match api.merge_patch_object(&path, &patch).await {
                    Ok(obj) => written.lock().expect("lock").extend(rv_of(&obj)),
                    Err(e) => eprintln!("write {i} failed: {e}"),
                }
            }
        })
    };

    // Live, then away, keeping the position.
    let mut seen = Vec::new();
    let start = Instant::now();
    let snapshots_live = collect(
        &mut sub,
        &mut seen,
        &mut position,
        &mut None,
        start + Duration::from_secs(args.before),
    )
    .await?;
    drop(sub);
    let left_at_rv = seen.last().copied().unwrap_or(0);
    let position = position.ok_or("no position before leaving")?;
    let seen_before = seen.len();
    tokio::time::sleep(Duration::from_secs(args.away)).await;

    // Back: resume from the position; the catch-up ends with the last write made before
    // the return.
    let back = Instant::now();
    let target = written.lock().expect("lock").last().copied().unwrap_or(0);
    let mut sub = follow(nats.clone(), opts, Some(position)).await?;
    let mut resumed = None;
    let mut replayed = 0;
    let mut snapshots_back = 0;
    let mut caught_up_ms = None;
    while caught_up_ms.is_none() {
        match next(&mut sub).await? {
            Update::Event {
                line, replayed: r, ..
            } => {
                let rv = rv_of(&serde_json::from_slice::<Value>(&line)?["object"]);
                seen.extend(rv);
                replayed += u64::from(r);
                if rv.is_some_and(|rv| rv >= target) {
                    caught_up_ms = Some(back.elapsed().as_secs_f64() * 1e3);
                }
            }
            Update::Resumed { replayed } => resumed = Some(replayed),
            Update::Snapshot { list, .. } => {
                snapshots_back += 1;
                let list: Value = serde_json::from_slice(&list)?;
                if list["items"][0]["metadata"]["resourceVersion"]
                    .as_str()
                    .and_then(|s| s.parse::<u64>().ok())
                    .is_some_and(|rv| rv >= target)
                {
                    caught_up_ms = Some(back.elapsed().as_secs_f64() * 1e3);
                }
            }
            _ => {}
        }
    }

    // The reference: the API server's watch from the same resourceVersion.
    let reference = apiserver_resume(&args, &cms, left_at_rv, target).await;

    let end = start + total + Duration::from_secs(3);
    let mut later = None;
    snapshots_back += collect(&mut sub, &mut seen, &mut later, &mut resumed, end).await?;
    let _ = writer.await;
    let written = written.lock().expect("lock").clone();

    // Judge: every write exactly once, in order.
    let mut counts = std::collections::HashMap::<u64, usize>::new();
    for rv in &seen {
        *counts.entry(*rv).or_default() += 1;
    }
    let lost = written.iter().filter(|rv| !counts.contains_key(rv)).count();
    let duplicated = counts.values().filter(|&&n| n > 1).count();
    let out_of_order = seen.windows(2).filter(|w| w[1] <= w[0]).count();
    let missed_while_away = written
        .iter()
        .filter(|&&rv| rv > left_at_rv && rv <= target)
        .count();
    let result = json!({
        "scenario": "resume",
        "writes_per_sec": args.writes_per_sec,
        "before_secs": args.before,
        "away_secs": args.away,
        "after_secs": args.after,
        "writes": written.len(),
        "events_seen": seen.len(),
        "seen_before_leaving": seen_before,
        "missed_while_away": missed_while_away,
        "lost": lost,
        "duplicated": duplicated,
        "out_of_order": out_of_order,
        "kcache": {
            "resumed_without_snapshot": resumed.is_some() && snapshots_back == 0,
            "resume_reported_replayed": resumed,
            "replayed_from_log": replayed,
            "snapshots_after_return": snapshots_back,
            "snapshots_before_leaving": snapshots_live,
            "catch_up_ms": caught_up_ms,
        },
        "apiserver_watch_from_rv": reference,
    });
    println!("{}", serde_json::to_string_pretty(&result)?);
    if let Some(out) = &args.out {
        std::fs::write(out, serde_json::to_string_pretty(&result)?)?;
    }
    Ok(())
}

/// A watch on the API server from `rv`: its status, and how long until the event at
/// `target` (or the 410 that sends an informer to relist).
async fn apiserver_resume(args: &Args, cms: &str, rv: u64, target: u64) -> Value {
    let http = insecure_client(Duration::from_secs(5), None);
    let url = format!(
        "{}{cms}?watch=1&resourceVersion={rv}&allowWatchBookmarks=true",
        args.apiserver.trim_end_matches('/')
    );
    let started = Instant::now();
    let resp = match http.get(&url).bearer_auth(&args.token).send().await {
        Ok(r) => r,
        Err(e) => return json!({"error": e.to_string()}),
    };
    let status = resp.status().as_u16();
    let mut body = resp.bytes_stream();
    let mut buf = Vec::new();
    let mut events = 0u64;
    let deadline = started + Duration::from_secs(30);
    while Instant::now() < deadline {
        let left = deadline.saturating_duration_since(Instant::now());
        let Ok(Some(Ok(chunk))) = tokio::time::timeout(left, body.next()).await else {
            break;
        };
        buf.extend_from_slice(&chunk);
        while let Some(nl) = buf.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = buf.drain(..=nl).collect();
            let Ok(ev) = serde_json::from_slice::<Value>(&line) else {
                continue;
            };
            match ev["type"].as_str() {
                Some("ERROR") => {
                    return json!({"status": status, "error": ev["object"]["message"],
                        "code": ev["object"]["code"], "ms": started.elapsed().as_secs_f64() * 1e3});
                }
                Some("BOOKMARK") => {}
                _ => {
                    events += 1;
                    if rv_of(&ev["object"]).is_some_and(|r| r >= target) {
                        return json!({"status": status, "events": events,
                            "catch_up_ms": started.elapsed().as_secs_f64() * 1e3});
                    }
                }
            }
        }
    }
    json!({"status": status, "events": events, "error": "not caught up within 30 s"})
}
