//! Scenario `objects`: what a cached object costs when there are many, and what a list of
//! all of them costs. `--objects` (100,000) ConfigMaps in one namespace, each ~1.4 KB of
//! JSON as the API server returns it (four `data` keys of pseudo-random text, two labels,
//! and the metadata and managedFields the server adds), created through the API server
//! `--create-concurrency` (32) at a time; the output says how long that took.
//!
//! Per target, first the RSS of holding every object, with one namespace-wide watch
//! (`resourceVersion=0`) open that has delivered every object as an initial event. The
//! API server: its growth from before the creates (its watch cache fills as they happen,
//! so the baseline must come before them, as for `kubelet`'s per-cached-object figure).
//! kcache: its growth from before to after the watch makes it start the namespace key and
//! list it, until its `/metrics` say the key is synced and holds every object. Both per object,
//! and per object minus the object's mean compact JSON size (from the target's first list
//! below): what the target holds beyond the bytes a client gets. kcache aims at 1 KiB or
//! less for the latter; the output reports it, it does not assert it.
//!
//! Then `--lists` (3) whole-namespace lists with `resourceVersion=0` (JSON, no limit), one
//! at a time: wall time to the last byte, body size, items, the target's CPU seconds and
//! its peak RSS growth during the list (VmRSS sampled every 10 ms), each and the median.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::{json, Value};

use super::{between_targets, per_item_bytes, splitmix64, Ctx, ScenarioRun, Target};
use crate::client::{http_client, ApiError, Created};
use crate::probe::{self, Cpu, PeakRss};
use crate::record::{lock, percentile_f64};
use crate::report::TargetReport;

const NS: &str = "bench-objects";
/// kcache's aim for RSS per cached object beyond the object's JSON.
const TARGET_MINUS_JSON_BYTES: f64 = 1024.0;
/// `data` keys per ConfigMap and characters per value: with the labels, the metadata and
/// the managedFields entry the API server adds, ~1.4 KB of JSON per object.
const DATA_KEYS: usize = 4;
const DATA_CHARS: usize = 212;
/// How often the target's RSS is sampled during a list.
const RSS_SAMPLE: Duration = Duration::from_millis(10);

#[derive(Clone, Debug)]
pub struct Params {
    pub objects: usize,
    pub concurrency: usize,
    pub lists: usize,
}

impl Params {
    pub fn from_ctx(ctx: &Ctx) -> Params {
        let a = &ctx.args;
        Params {
            objects: a.objects.unwrap_or(100_000).max(1),
            concurrency: a.create_concurrency.max(1),
            lists: a.lists.max(1),
        }
    }
}

fn collection() -> String {
    format!("/api/v1/namespaces/{NS}/configmaps")
}

/// `n` characters of word-like pseudo-random text, fixed by `seed`. Random rather than
/// repeated so that neither server gets a saving real data would not give (shared or
/// compressed strings, a compressing allocator or page deduplication).
fn text(seed: u64, n: usize) -> String {
    const ALPHABET: &[u8; 32] = b"abcdefghijklmnopqrstuvwxyz -_.:/";
    let mut out = String::with_capacity(n);
    let mut i = 0u64;
    while out.len() < n {
        let mut r = splitmix64(seed.wrapping_mul(1_000_003).wrapping_add(i));
        i += 1;
        // 12 characters of 5 bits from each 64-bit draw.
        for _ in 0..12 {
            if out.len() == n {
                break;
            }
            out.push(char::from(ALPHABET[(r & 31) as usize]));
            r >>= 5;
        }
    }
    out
}

/// ConfigMap number `i`.
fn configmap(i: usize) -> Value {
    let data: serde_json::Map<String, Value> = (0..DATA_KEYS)
        .map(|k| {
            (
                format!("key-{k}"),
                json!(text((i * DATA_KEYS + k) as u64, DATA_CHARS)),
            )
        })
        .collect();
    json!({
        "metadata": {
            "name": format!("cm-{i:06}"),
            "labels": {"app": "bench-objects", "shard": format!("s{}", i % 100)},
        },
        "data": data,
    })
}

/// Creates the ConfigMaps, `concurrency` at a time, each made as it is sent (100,000
/// bodies at once would be half a GB of `Value`s), each retried when a busy API server
/// sheds it (429, 5xx, a transport error); 409 counts as existed. Returns the counts and
/// the seconds it took.
async fn create(ctx: &Ctx, p: &Params) -> (Created, f64) {
    ctx.progress.stage(&format!(
        "creating {} ConfigMaps, {} at a time",
        p.objects, p.concurrency
    ));
    if let Err(e) = ctx.api.ensure_namespace(NS).await {
        ctx.progress.log(&format!("namespace {NS}: {e}"));
    }
    let start = Instant::now();
    let path = collection();
    let mut results = futures::stream::iter(0..p.objects)
        .map(|i| {
            let (api, path) = (&ctx.api, &path);
            async move {
                let body = configmap(i);
                let mut attempt = 1;
                loop {
                    let r = api.create(path, &body).await;
                    let shed = match &r {
                        Ok(()) => false,
                        Err(ApiError::Status(s)) => *s == 429 || *s >= 500,
                        Err(ApiError::Http(_)) => true,
                    };
                    if !shed || attempt == 4 {
                        return r;
                    }
                    tokio::time::sleep(Duration::from_secs(attempt)).await;
                    attempt += 1;
                }
            }
        })
        .buffer_unordered(p.concurrency);
    let mut n = Created::default();
    let mut done = 0;
    let tenth = (p.objects / 10).max(1);
    while let Some(r) = results.next().await {
        match r {
            Ok(()) => n.created += 1,
            Err(ApiError::Status(409)) => n.existed += 1,
            Err(_) => n.failed += 1,
        }
        done += 1;
        if done % tenth == 0 {
            ctx.progress.log(&format!(
                "  {done}/{} ConfigMaps after {:.0} s",
                p.objects,
                start.elapsed().as_secs_f64()
            ));
        }
    }
    let seconds = start.elapsed().as_secs_f64();
    ctx.progress.log(&format!(
        "setup: {} ConfigMaps created, {} existed, {} failed in {seconds:.1} s ({:.0}/s)",
        n.created,
        n.existed,
        n.failed,
        done as f64 / seconds.max(1e-9)
    ));
    (n, seconds)
}

/// The namespace's resourceVersion and its number of ConfigMaps, from a one-item list on
/// the API server (`remainingItemCount`) rather than a 140 MB one.
async fn namespace_state(ctx: &Ctx) -> Result<(String, usize), String> {
    let v = ctx
        .api
        .get_json(&format!("{}?limit=1", collection()))
        .await
        .map_err(|e| e.to_string())?;
    let rv = v["metadata"]["resourceVersion"]
        .as_str()
        .ok_or("list without metadata.resourceVersion")?
        .to_string();
    let remaining = v["metadata"]["remainingItemCount"].as_u64().unwrap_or(0);
    let items = v["items"].as_array().map_or(0, Vec::len);
    Ok((
        rv,
        items + usize::try_from(remaining).unwrap_or(usize::MAX - items),
    ))
}

/// The RSS of a target holding every object.
struct Held {
    before_kib: u64,
    after_kib: u64,
    /// From opening the watch until the target held every object and the watch had
    /// delivered them (kcache: its key synced).
    seconds: f64,
    /// Objects the target says it holds (kcache: `kcache_cached_objects`).
    objects_held: Option<f64>,
    complete: bool,
    cpu: Cpu,
    /// The namespace-wide watch, open until the target is done.
    watch: tokio::task::JoinHandle<()>,
    events: Arc<WatchEvents>,
}

/// What the namespace-wide watch has received.
#[derive(Default)]
struct WatchEvents {
    /// The response headers arrived.
    open: AtomicBool,
    /// Events (non-blank lines: kcache's keepalives are blank).
    events: AtomicUsize,
    /// `ERROR` events.
    errors: AtomicUsize,
    /// Why the request or its stream failed, if it did.
    failure: Mutex<Option<String>>,
}

/// Whether a watch line is an `ERROR` event; both servers write `type` first.
fn is_error_event(line: &[u8]) -> bool {
    line.starts_with(br#"{"type":"ERROR""#)
}

/// Opens the watch (retrying a failed request once a second, as kcache may answer 5xx
/// while a key's first sync outlasts its sync timeout) and counts its events without
/// parsing them: 100,000 initial events need no more than their line ends.
fn spawn_counting(
    client: reqwest::Client,
    url: String,
    token: String,
    deadline: Instant,
    w: Arc<WatchEvents>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let resp = loop {
            let why = match client.get(&url).bearer_auth(&token).send().await {
                Ok(r) if r.status().is_success() => break r,
                Ok(r) => format!("watch HTTP {}", r.status().as_u16()),
                Err(e) => format!("watch request: {e}"),
            };
            if Instant::now() >= deadline {
                *lock(&w.failure) = Some(why);
                return;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        };
        w.open.store(true, Ordering::Relaxed);
        let mut body = resp.bytes_stream();
        let mut line: Vec<u8> = Vec::new();
        while let Some(chunk) = body.next().await {
            let chunk = match chunk {
                Ok(c) => c,
                Err(e) => {
                    *lock(&w.failure) = Some(format!("watch stream: {e}"));
                    return;
                }
            };
            for part in chunk.split_inclusive(|b| *b == b'\n') {
                // Only the start of a line is kept: enough to tell ERROR events.
                if line.len() < 32 {
                    line.extend(part.iter().take(32 - line.len()));
                }
                if part.ends_with(b"\n") {
                    if line.iter().any(|b| !b.is_ascii_whitespace()) {
                        w.events.fetch_add(1, Ordering::Relaxed);
                        if is_error_event(&line) {
                            w.errors.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    line.clear();
                }
            }
        }
        *lock(&w.failure) = Some("watch stream ended".into());
    })
}

/// kcache's key counts and cached objects from its `/metrics`: (keys, synced, objects).
async fn kcache_keys(ctx: &Ctx, t: &Target) -> Option<(f64, f64, f64)> {
    let text = probe::scrape(&ctx.api.http, &t.url, &ctx.args.token).await?;
    let get = |name| probe::sum_samples(&text, name).unwrap_or(0.0);
    Some((
        get("kcache_cached_keys"),
        get("kcache_synced_keys"),
        get("kcache_cached_objects"),
    ))
}

/// Makes `t` hold every object (see the module summary) and measures its RSS.
/// `before_kib`: the baseline (the API server's: from before the creates).
async fn hold(ctx: &Ctx, t: &Target, objects: usize, before_kib: u64) -> Held {
    ctx.progress
        .stage(&format!("{}: one namespace-wide watch", t.name));
    let cpu0 = Cpu::now(t.pid, ctx.args.apiserver_pid);
    let timeout = ctx
        .args
        .open_timeout_secs
        .unwrap_or(ctx.args.scenario.open_timeout_secs());
    let start = Instant::now();
    let deadline = start + Duration::from_secs(timeout);
    let events = Arc::new(WatchEvents::default());
    // resourceVersion=0: the watch starts with every object as an ADDED event, so its
    // events say when the target serves them all. A watch from a resourceVersion read
    // on the API server just before would be older than kcache's first list of the key
    // whenever any other write came between, and kcache would then replay the upstream
    // from it (a second list of the namespace) during the measurement.
    let watch = spawn_counting(
        http_client(false, None),
        format!(
            "{}{}?watch=1&resourceVersion=0&allowWatchBookmarks=true",
            t.url,
            collection()
        ),
        ctx.args.token.clone(),
        deadline,
        events.clone(),
    );
    let mut objects_held = None;
    let mut complete = false;
    while Instant::now() < deadline && lock(&events.failure).is_none() {
        if events.events.load(Ordering::Relaxed) >= objects {
            if t.is_apiserver() {
                // Its watch cache has held them since they were created.
                objects_held = Some(objects as f64);
                complete = true;
                break;
            }
            if let Some((keys, synced, cached)) = kcache_keys(ctx, t).await {
                objects_held = Some(cached);
                if keys >= 1.0 && synced >= keys && cached >= objects as f64 {
                    complete = true;
                    break;
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let seconds = start.elapsed().as_secs_f64();
    // As kubelet's per-cached-object figure: let the transient buffers go.
    tokio::time::sleep(Duration::from_millis(ctx.args.settle_ms.max(3000))).await;
    let after_kib = probe::rss_kib(t.pid);
    let cpu = Cpu::now(t.pid, ctx.args.apiserver_pid) - cpu0;
    ctx.progress.log(&format!(
        "{}: holds {} of {objects} objects, the watch delivered {} events after {seconds:.1} s; RSS {before_kib} -> {after_kib} KiB",
        t.name,
        objects_held.map_or("?".into(), |n| format!("{n:.0}")),
        events.events.load(Ordering::Relaxed),
    ));
    Held {
        before_kib,
        after_kib,
        seconds,
        objects_held,
        complete,
        cpu,
        watch,
        events,
    }
}

/// One whole-namespace list.
#[derive(Clone, Debug, Default, Serialize)]
struct ListRun {
    /// From sending the request to the last byte of the body.
    seconds: f64,
    first_byte_seconds: f64,
    body_bytes: usize,
    items: usize,
    /// Mean compact JSON size of one item.
    json_bytes_per_object: Option<f64>,
    rss_before_kib: u64,
    /// Highest VmRSS during the list minus `rss_before_kib`.
    peak_rss_growth_kib: i64,
    target_cpu_seconds: f64,
    error: Option<String>,
}

#[derive(Deserialize)]
struct ListBody<'a> {
    #[serde(borrow)]
    items: Vec<&'a RawValue>,
}

/// Bytes of a JSON text without the whitespace outside strings: its compact size.
fn compact_len(s: &str) -> usize {
    let (mut n, mut in_string, mut escaped) = (0, false, false);
    for b in s.bytes() {
        if in_string {
            if escaped {
                escaped = false;
            } else if b == b'\\' {
                escaped = true;
            } else if b == b'"' {
                in_string = false;
            }
            n += 1;
        } else if !b.is_ascii_whitespace() {
            in_string = b == b'"';
            n += 1;
        }
    }
    n
}

/// The items of a list body and their total compact JSON size; `None` if it is not a list.
fn items_json(body: &[u8]) -> Option<(usize, usize)> {
    let list: ListBody = serde_json::from_slice(body).ok()?;
    let bytes = list.items.iter().map(|i| compact_len(i.get())).sum();
    Some((list.items.len(), bytes))
}

/// Lists the namespace once with `resourceVersion=0` through `t` and measures it.
async fn list_once(ctx: &Ctx, t: &Target, http: &reqwest::Client) -> ListRun {
    let url = format!("{}{}?resourceVersion=0", t.url, collection());
    let mut run = ListRun {
        rss_before_kib: probe::rss_kib(t.pid),
        ..Default::default()
    };
    let cpu0 = probe::cpu_seconds(t.pid);
    let peak = PeakRss::start(t.pid, RSS_SAMPLE);
    let start = Instant::now();
    let result: Result<(f64, Vec<u8>), ApiError> = async {
        let resp = http.get(&url).bearer_auth(&ctx.args.token).send().await?;
        if !resp.status().is_success() {
            return Err(ApiError::Status(resp.status().as_u16()));
        }
        let first = start.elapsed().as_secs_f64();
        let mut body = Vec::new();
        let mut stream = resp.bytes_stream();
        while let Some(chunk) = stream.next().await {
            body.extend_from_slice(&chunk?);
        }
        Ok((first, body))
    }
    .await;
    run.seconds = start.elapsed().as_secs_f64();
    run.peak_rss_growth_kib = peak.stop(t.pid) as i64 - run.rss_before_kib as i64;
    run.target_cpu_seconds = probe::cpu_seconds(t.pid) - cpu0;
    match result {
        Ok((first, body)) => {
            run.first_byte_seconds = first;
            run.body_bytes = body.len();
            match items_json(&body) {
                Some((items, bytes)) => {
                    run.items = items;
                    run.json_bytes_per_object = (items > 0).then(|| bytes as f64 / items as f64);
                }
                None => run.error = Some("body is not a list".into()),
            }
        }
        Err(e) => run.error = Some(e.to_string()),
    }
    ctx.progress.log(&format!(
        "{}: list of {} items, {:.1} MB in {:.2} s (first byte {:.2} s); peak RSS +{} KiB; CPU {:.2} s{}",
        t.name,
        run.items,
        run.body_bytes as f64 / 1e6,
        run.seconds,
        run.first_byte_seconds,
        run.peak_rss_growth_kib,
        run.target_cpu_seconds,
        run.error.as_deref().map_or(String::new(), |e| format!("; error: {e}")),
    ));
    run
}

/// Median (nearest rank) of the lists that succeeded.
fn median(lists: &[ListRun], f: impl Fn(&ListRun) -> f64) -> Option<f64> {
    let mut v: Vec<f64> = lists.iter().filter(|l| l.error.is_none()).map(f).collect();
    v.sort_by(f64::total_cmp);
    percentile_f64(&v, 0.5)
}

/// Measures one target: hold every object, then list them `p.lists` times.
async fn measure(
    ctx: &Ctx,
    p: &Params,
    t: &Target,
    objects: usize,
    api_baseline: u64,
) -> TargetReport {
    let before = if t.is_apiserver() {
        api_baseline
    } else {
        probe::rss_kib(t.pid)
    };
    let held = hold(ctx, t, objects, before).await;
    let http = http_client(false, None);
    let mut lists = Vec::with_capacity(p.lists);
    for i in 0..p.lists {
        ctx.progress.stage(&format!(
            "{}: whole-namespace list {}/{}",
            t.name,
            i + 1,
            p.lists
        ));
        // Let the previous list's buffers go before the next baseline.
        tokio::time::sleep(Duration::from_secs(2)).await;
        lists.push(list_once(ctx, t, &http).await);
    }
    // Whether the lists left anything behind.
    let rss_after_lists = probe::rss_kib(t.pid);
    held.watch.abort();
    let growth = held.after_kib as i64 - held.before_kib as i64;
    let per_object = per_item_bytes(growth, objects);
    let json_per_object = lists.iter().find_map(|l| l.json_bytes_per_object);
    let minus_json = json_per_object.map(|j| per_object - j);
    let mut notes = Vec::new();
    if !held.complete {
        notes.push(format!(
            "did not hold all {objects} objects within the timeout (held: {}); the per-object figures are not meaningful",
            held.objects_held.map_or("?".into(), |n| format!("{n:.0}"))
        ));
    }
    let wrong = lists
        .iter()
        .filter(|l| l.error.is_none() && l.items != objects)
        .count();
    if wrong > 0 {
        notes.push(format!("{wrong} lists did not return {objects} items"));
    }
    let list_errors = lists.iter().filter(|l| l.error.is_some()).count();
    let watch_errors = held.events.errors.load(Ordering::Relaxed);
    let watch_failure = lock(&held.events.failure).clone();
    let errors = list_errors + watch_errors + usize::from(watch_failure.is_some());
    let mut reasons = std::collections::BTreeMap::new();
    if watch_errors > 0 {
        reasons.insert("watch ERROR events".to_string(), watch_errors);
    }
    if let Some(f) = watch_failure {
        reasons.insert(f, 1);
    }
    for l in &lists {
        if let Some(e) = &l.error {
            *reasons.entry(format!("list: {e}")).or_default() += 1;
        }
    }
    let medians = json!({
        "seconds": median(&lists, |l| l.seconds),
        "first_byte_seconds": median(&lists, |l| l.first_byte_seconds),
        "body_bytes": median(&lists, |l| l.body_bytes as f64),
        "peak_rss_growth_kib": median(&lists, |l| l.peak_rss_growth_kib as f64),
        "target_cpu_seconds": median(&lists, |l| l.target_cpu_seconds),
    });
    let own = vec![
        ("objects", Some(objects as f64)),
        ("objects_held", held.objects_held),
        ("json_bytes_per_object", json_per_object),
        ("rss_growth_holding_kib", Some(growth as f64)),
        ("rss_per_object_bytes", Some(per_object)),
        ("rss_per_object_minus_json_bytes", minus_json),
        (
            "seconds_to_hold_all_objects",
            (!t.is_apiserver()).then_some(held.seconds),
        ),
        ("target_cpu_seconds_to_hold", Some(held.cpu.target)),
        ("list_seconds_median", medians["seconds"].as_f64()),
        (
            "list_first_byte_seconds_median",
            medians["first_byte_seconds"].as_f64(),
        ),
        ("list_body_bytes_median", medians["body_bytes"].as_f64()),
        (
            "list_peak_rss_growth_kib_median",
            medians["peak_rss_growth_kib"].as_f64(),
        ),
        (
            "list_target_cpu_seconds_median",
            medians["target_cpu_seconds"].as_f64(),
        ),
        ("errors", Some(errors as f64)),
    ];
    let method = if t.is_apiserver() {
        "API server RSS growth from before the ConfigMaps were created to after one resourceVersion=0 namespace-wide watch delivered them all (its watch cache holds them; includes etcd client and request buffers and Go heap not yet collected)"
    } else {
        "kcache RSS growth from before to after one resourceVersion=0 namespace-wide watch made it list and cache the namespace and delivered every object (its key synced with every object, then a settle; includes what the upstream list and the initial events left allocated)"
    };
    TargetReport {
        target: t.name.into(),
        url: t.url.clone(),
        client_watches: 1,
        watches_established: usize::from(held.events.open.load(Ordering::Relaxed)),
        connections: 2,
        rss_before_kib: held.before_kib,
        rss_after_kib: held.after_kib,
        cached_objects: Some(objects),
        rss_growth_per_cached_object_bytes: Some(per_object),
        cached_objects_method: Some(method.into()),
        cpu_open: held.cpu,
        errors,
        error_reasons: reasons,
        notes,
        extra: json!({
            "objects": objects,
            "objects_held": held.objects_held,
            "seconds_to_hold_all_objects": held.seconds,
            "held_all_objects": held.complete,
            "json_bytes_per_object": json_per_object,
            "rss_per_object_bytes": per_object,
            "rss_per_object_minus_json_bytes": minus_json,
            "rss_after_lists_kib": rss_after_lists,
            "lists": lists,
            "list_median": medians,
        }),
        own_figures: Some(own),
        ..Default::default()
    }
}

pub async fn run(ctx: &Ctx) -> ScenarioRun {
    let p = Params::from_ctx(ctx);
    // Before the creates: the API server's watch cache fills as they happen.
    let api_before = probe::rss_kib(ctx.args.apiserver_pid);
    let (created, create_seconds) = create(ctx, &p).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let api_after_create = probe::rss_kib(ctx.args.apiserver_pid);
    let mut notes = Vec::new();
    let mut reports = Vec::new();
    let state = namespace_state(ctx).await;
    match &state {
        Ok((rv, objects)) => {
            ctx.progress.log(&format!(
                "namespace {NS}: {objects} ConfigMaps at resourceVersion {rv}"
            ));
            for (i, t) in ctx.targets.iter().enumerate() {
                if i > 0 {
                    between_targets(ctx).await;
                }
                reports.push(measure(ctx, &p, t, *objects, api_before).await);
            }
        }
        Err(e) => {
            let note = format!("could not read the namespace's state, nothing measured: {e}");
            ctx.progress.log(&note);
            notes.push(note);
        }
    }
    let figure = |target: &str, name: &str| {
        reports
            .iter()
            .find(|r| r.target == target)
            .and_then(|r| r.extra[name].as_f64())
    };
    let kcache_minus_json = figure("kcache", "rss_per_object_minus_json_bytes");
    let objects = state.as_ref().map_or(0, |(_, n)| *n);
    let section = json!({
        "configmaps_created": created.created,
        "configmaps_existed": created.existed,
        "configmaps_failed": created.failed,
        "objects_in_namespace": objects,
        "create_seconds": create_seconds,
        "creates_per_second": (created.created + created.existed) as f64 / create_seconds.max(1e-9),
        "create_concurrency": p.concurrency,
        "apiserver_rss_before_create_kib": api_before,
        "apiserver_rss_after_create_kib": api_after_create,
        "apiserver_rss_per_object_on_create_bytes": per_item_bytes(api_after_create as i64 - api_before as i64, objects),
        "kcache_rss_per_object_minus_json_bytes": kcache_minus_json,
        "kcache_minus_json_aim_bytes": TARGET_MINUS_JSON_BYTES,
        "kcache_within_aim": kcache_minus_json.map(|v| v <= TARGET_MINUS_JSON_BYTES),
    });
    ScenarioRun {
        workload: json!({
            "namespace": NS,
            "configmaps": p.objects,
            "data_keys_per_configmap": DATA_KEYS,
            "data_chars_per_key": DATA_CHARS,
            "labels_per_configmap": 2,
            "create_concurrency": p.concurrency,
            "lists_per_target": p.lists,
            "list": "GET .../configmaps?resourceVersion=0 (JSON, no limit), one at a time",
        }),
        reports,
        series: Vec::new(),
        notes,
        sections: vec![
            ("objects".into(), section),
            (
                "connection_model".into(),
                json!({
                    "protocol": "HTTPS, HTTP/2",
                    "hold": "one namespace-wide watch on a connection of its own",
                    "lists": "one connection, one list at a time",
                    "auth": "bearer token (same for both targets), authorization on",
                }),
            ),
        ],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn objects_are_distinct_and_the_json_measure_is_compact() {
        let (a, b) = (configmap(0), configmap(1));
        assert_ne!(a["data"], b["data"]);
        assert_eq!(a["data"]["key-3"].as_str().map(str::len), Some(DATA_CHARS));
        assert_eq!(configmap(7), configmap(7));
        assert_eq!(compact_len(r#"{ "a" : "x y\" z" ,"b":[1, 2] }"#), 25);
        let body = br#"{"kind":"ConfigMapList","metadata":{"resourceVersion":"5"},"items":[{"a":1}, { "b" : "c d" }]}"#;
        assert_eq!(items_json(body), Some((2, 7 + 11)));
        assert_eq!(items_json(b"{\"kind\":\"Status\"}"), None);
        assert!(is_error_event(br#"{"type":"ERROR","object":{"code":410}}"#));
        assert!(!is_error_event(br#"{"type":"ADDED","object":{}}"#));
    }
}
