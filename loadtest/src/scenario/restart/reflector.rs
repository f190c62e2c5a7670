//! The restart scenario's client: one client-go 1.20 reflector (`ListAndWatch`, as the
//! kubelet's per-object Secret/ConfigMap managers ran it) per watched object, on its
//! node's shared connection, counting what it goes through (streams ended, watches sent
//! again, 410s, relists) and when its object's post-restart write reached it. How it lists,
//! watches, retries and backs off is the scenario's documented client (`super`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use futures::StreamExt;
use serde::Deserialize;

use super::super::splitmix64;
use crate::record::{Counters, Recorder, SEQ_ANNOTATION};

/// client-go's reflector backoff (`NewExponentialBackoffManager(800ms, 30s, 2min, 2.0,
/// 1.0)`): the first wait, the cap, and the quiet time after which it starts over.
const BACKOFF_INITIAL: Duration = Duration::from_millis(800);
const BACKOFF_CAP: Duration = Duration::from_secs(30);
const BACKOFF_RESET: Duration = Duration::from_secs(120);
/// client-go's REST client retries a 429/5xx that carries `Retry-After` this many times.
pub(in crate::scenario) const MAX_RETRIES: usize = 10;
/// Longest wait for a list's body or a watch's response headers.
pub(in crate::scenario) const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

/// What one target's clients share.
pub(super) struct Shared {
    pub(super) rec: Arc<Recorder>,
    pub(super) base: String,
    pub(super) token: String,
    /// Per object: the key of its post-restart write and when it was first sent; set just
    /// before the write is sent, so no client can see the key before it is known.
    pub(super) writes: Vec<OnceLock<(String, Instant)>>,
}

/// One client's counts over the whole run; the figures are their change from just before
/// the kill.
#[derive(Default)]
pub(super) struct Stats {
    pub(super) established: AtomicBool,
    pub(super) watch_requests: AtomicUsize,
    pub(super) refused: AtomicUsize,
    pub(super) ended: AtomicUsize,
    pub(super) gone: AtomicUsize,
    pub(super) error_events: AtomicUsize,
    pub(super) http_errors: AtomicUsize,
    pub(super) lists: AtomicUsize,
    /// When the object's post-restart write reached this client (an event or a relist).
    pub(super) got: OnceLock<Instant>,
}

/// A snapshot of a client's counts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Counts {
    pub(super) watch_requests: usize,
    pub(super) refused: usize,
    pub(super) ended: usize,
    pub(super) gone: usize,
    pub(super) error_events: usize,
    pub(super) http_errors: usize,
    pub(super) lists: usize,
}

impl Stats {
    pub(super) fn counts(&self) -> Counts {
        let g = |c: &AtomicUsize| c.load(Ordering::Relaxed);
        Counts {
            watch_requests: g(&self.watch_requests),
            refused: g(&self.refused),
            ended: g(&self.ended),
            gone: g(&self.gone),
            error_events: g(&self.error_events),
            http_errors: g(&self.http_errors),
            lists: g(&self.lists),
        }
    }
}

impl std::ops::Sub for Counts {
    type Output = Counts;
    fn sub(self, b: Counts) -> Counts {
        Counts {
            watch_requests: self.watch_requests.saturating_sub(b.watch_requests),
            refused: self.refused.saturating_sub(b.refused),
            ended: self.ended.saturating_sub(b.ended),
            gone: self.gone.saturating_sub(b.gone),
            error_events: self.error_events.saturating_sub(b.error_events),
            http_errors: self.http_errors.saturating_sub(b.http_errors),
            lists: self.lists.saturating_sub(b.lists),
        }
    }
}

/// client-go's `exponentialBackoffManagerImpl`: each wait doubles up to the cap, jittered
/// to between 1× and 2×; it starts over after two quiet minutes.
struct Backoff {
    next: Duration,
    last: Option<Instant>,
    seed: u64,
    draws: u64,
}

impl Backoff {
    fn new(seed: u64) -> Backoff {
        Backoff {
            next: BACKOFF_INITIAL,
            last: None,
            seed,
            draws: 0,
        }
    }

    fn wait(&mut self) -> Duration {
        let now = Instant::now();
        if self.last.is_some_and(|l| now - l > BACKOFF_RESET) {
            self.next = BACKOFF_INITIAL;
        }
        self.last = Some(now);
        let d = self.next;
        self.next = (self.next * 2).min(BACKOFF_CAP);
        self.draws += 1;
        let r = splitmix64(self.seed.wrapping_mul(1 << 20).wrapping_add(self.draws)) as f64
            / u64::MAX as f64;
        d.mul_f64(1.0 + r)
    }
}

/// Where a relist reads from (client-go's `relistResourceVersion`).
#[derive(Clone, Debug)]
enum ListFrom {
    /// The first list: from the watch cache, `limit` ignored there.
    Zero,
    /// At least as new as the last RV seen: from the watch cache, unpaged.
    At(String),
    /// After a 410: a consistent (quorum) list, paged.
    Consistent,
}

impl ListFrom {
    fn query(&self) -> String {
        match self {
            ListFrom::Zero => "resourceVersion=0&limit=500".into(),
            ListFrom::At(rv) if rv.is_empty() => "resourceVersion=0&limit=500".into(),
            ListFrom::At(rv) => format!("resourceVersion={rv}"),
            ListFrom::Consistent => "limit=500".into(),
        }
    }
}

/// How one watch ended.
enum Outcome {
    /// The request could not connect (connection refused): watch again in 1 s.
    Refused,
    /// The stream ended or broke: watch again at once from the last RV.
    Ended,
    /// Relist after the backoff; `gone`: after a 410.
    Relist { gone: bool },
}

#[derive(Deserialize, Default)]
struct Meta {
    #[serde(default, rename = "resourceVersion")]
    resource_version: Option<String>,
    #[serde(default)]
    annotations: Option<HashMap<String, String>>,
}

#[derive(Deserialize, Default)]
struct EventObject {
    #[serde(default)]
    metadata: Meta,
    /// A Status object's code (`ERROR` events).
    #[serde(default)]
    code: Option<u16>,
}

#[derive(Deserialize)]
struct Event {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    object: EventObject,
}

#[derive(Deserialize, Default)]
struct ListMeta {
    #[serde(default, rename = "resourceVersion")]
    resource_version: String,
}

#[derive(Deserialize, Default)]
struct ListItem {
    #[serde(default)]
    metadata: Meta,
}

#[derive(Deserialize)]
struct List {
    #[serde(default)]
    metadata: ListMeta,
    #[serde(default)]
    items: Vec<ListItem>,
}

/// What a line of a watch body was.
enum Line {
    Skip,
    Event,
    Error { gone: bool },
}

/// Whether a request failed because nothing listened on the port: client-go's reflector
/// sleeps 1 s and watches again (no relist) only on `IsConnectionRefused`. A node's
/// requests share one connection attempt: hyper fails the ones that waited for it with
/// `CheckoutNoLongerWanted`, where Go's HTTP/2 transport hands them the dial's own error,
/// so those count as refused too.
fn refused(e: &reqwest::Error) -> bool {
    let mut src: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(s) = src {
        if let Some(io) = s.downcast_ref::<std::io::Error>() {
            if io.kind() == std::io::ErrorKind::ConnectionRefused {
                return true;
            }
        }
        if s.source().is_none() && e.is_connect() {
            // hyper-util's pool error is private: only its name tells.
            return format!("{s:?}") == "CheckoutNoLongerWanted";
        }
        src = s.source();
    }
    false
}

/// A failed request's kind and innermost cause (e.g. `connect error: Connection reset by
/// peer (os error 104)`), for the reasons in the report: which failure a client saw
/// decides whether it relists.
pub(in crate::scenario) fn error_kind(e: &reqwest::Error) -> String {
    let kind = if e.is_connect() {
        "connect"
    } else if e.is_timeout() {
        "timeout"
    } else if e.is_body() || e.is_decode() {
        "body"
    } else {
        "request"
    };
    let mut inner: &dyn std::error::Error = e;
    while let Some(s) = inner.source() {
        inner = s;
    }
    format!("{kind} error: {inner}")
}

/// Whether a list answered `resp` on try `attempt` is tried again, as client-go's REST
/// client does: a 429 or 5xx with `Retry-After`, up to [`MAX_RETRIES`] times — waited
/// for here and noted.
pub(in crate::scenario) async fn waited_to_retry(
    resp: &reqwest::Response,
    attempt: usize,
    rec: &crate::record::Recorder,
) -> bool {
    let Some(wait) = retry_after(resp).filter(|_| attempt < MAX_RETRIES) else {
        return false;
    };
    let status = resp.status().as_u16();
    rec.note(format!("list HTTP {status} (Retry-After, retried)"));
    tokio::time::sleep(wait).await;
    true
}

/// `Retry-After` in seconds, as client-go's `checkWait` reads it (429 and 5xx only).
fn retry_after(resp: &reqwest::Response) -> Option<Duration> {
    let status = resp.status().as_u16();
    if status != 429 && !(500..600).contains(&status) {
        return None;
    }
    let secs: u64 = resp
        .headers()
        .get("retry-after")?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()?;
    Some(Duration::from_secs(secs))
}

/// One client: a reflector for one object, on its node's connection.
pub(super) struct Reflector {
    pub(super) http: reqwest::Client,
    pub(super) shared: Arc<Shared>,
    pub(super) stats: Arc<Stats>,
    pub(super) object: usize,
    pub(super) collection: String,
    pub(super) name: String,
    pub(super) seed: u64,
}

impl Reflector {
    /// Lists and watches until aborted.
    pub(super) async fn run(self) {
        let mut backoff = Backoff::new(self.seed);
        let mut rv = String::new();
        let mut relist = Some(ListFrom::Zero);
        loop {
            if let Some(from) = relist.take() {
                match self.list(&from).await {
                    Some(list_rv) => rv = list_rv,
                    None => {
                        tokio::time::sleep(backoff.wait()).await;
                        relist = Some(from);
                        continue;
                    }
                }
            }
            match self.watch(&mut rv).await {
                Outcome::Refused => tokio::time::sleep(Duration::from_secs(1)).await,
                Outcome::Ended => {}
                Outcome::Relist { gone } => {
                    tokio::time::sleep(backoff.wait()).await;
                    relist = Some(if gone {
                        ListFrom::Consistent
                    } else {
                        ListFrom::At(rv.clone())
                    });
                }
            }
        }
    }

    /// Records the post-restart write if `meta` carries its key.
    fn check(&self, meta: &Meta, at: Instant) {
        let Some((key, _)) = self.shared.writes[self.object].get() else {
            return;
        };
        let carries = meta
            .annotations
            .as_ref()
            .and_then(|a| a.get(SEQ_ANNOTATION))
            .is_some_and(|k| k == key);
        if carries && self.stats.got.set(at).is_ok() {
            Counters::inc(&self.shared.rec.counters.deliveries);
        }
    }

    /// One list; its RV, or `None` (the caller backs off and lists again).
    async fn list(&self, from: &ListFrom) -> Option<String> {
        let rec = &self.shared.rec;
        let url = format!(
            "{}{}?fieldSelector=metadata.name%3D{}&{}",
            self.shared.base,
            self.collection,
            self.name,
            from.query()
        );
        for attempt in 0..=MAX_RETRIES {
            let send = self
                .http
                .get(&url)
                .bearer_auth(&self.shared.token)
                .timeout(REQUEST_TIMEOUT)
                .send();
            let resp = match send.await {
                Ok(r) => r,
                Err(e) => {
                    if refused(&e) {
                        self.stats.refused.fetch_add(1, Ordering::Relaxed);
                        rec.note("list connection refused".into());
                    } else {
                        rec.failure(format!("list {}", error_kind(&e)));
                    }
                    return None;
                }
            };
            if waited_to_retry(&resp, attempt, rec).await {
                continue;
            }
            let status = resp.status().as_u16();
            if !resp.status().is_success() {
                self.stats.http_errors.fetch_add(1, Ordering::Relaxed);
                rec.failure(format!("list HTTP {status}"));
                return None;
            }
            let body = match resp.bytes().await {
                Ok(b) => b,
                Err(e) => {
                    rec.failure(format!("list body {}", error_kind(&e)));
                    return None;
                }
            };
            let at = Instant::now();
            let Ok(list) = serde_json::from_slice::<List>(&body) else {
                rec.failure("unparsable list".into());
                return None;
            };
            self.stats.lists.fetch_add(1, Ordering::Relaxed);
            for item in &list.items {
                self.check(&item.metadata, at);
            }
            return Some(list.metadata.resource_version);
        }
        None
    }

    /// One watch request and its stream, following `rv`.
    async fn watch(&self, rv: &mut String) -> Outcome {
        let (rec, stats) = (&self.shared.rec, &self.stats);
        let from = if rv.is_empty() { "0" } else { rv.as_str() };
        let url = format!(
            "{}{}?watch=1&allowWatchBookmarks=true&fieldSelector=metadata.name%3D{}&resourceVersion={from}",
            self.shared.base, self.collection, self.name
        );
        stats.watch_requests.fetch_add(1, Ordering::Relaxed);
        Counters::inc(&rec.counters.opened);
        let send = self.http.get(&url).bearer_auth(&self.shared.token).send();
        let resp = match tokio::time::timeout(REQUEST_TIMEOUT, send).await {
            Err(_) => {
                rec.failure("watch: no response headers in 60 s".into());
                return Outcome::Relist { gone: false };
            }
            Ok(Err(e)) if refused(&e) => {
                stats.refused.fetch_add(1, Ordering::Relaxed);
                rec.note("watch connection refused (again in 1 s)".into());
                return Outcome::Refused;
            }
            Ok(Err(e)) => {
                rec.failure(format!("watch {}", error_kind(&e)));
                return Outcome::Relist { gone: false };
            }
            Ok(Ok(r)) => r,
        };
        let status = resp.status().as_u16();
        if status == 410 {
            stats.gone.fetch_add(1, Ordering::Relaxed);
            rec.failure("watch HTTP 410".into());
            return Outcome::Relist { gone: true };
        }
        if !resp.status().is_success() {
            stats.http_errors.fetch_add(1, Ordering::Relaxed);
            rec.failure(format!("watch HTTP {status}"));
            return Outcome::Relist { gone: false };
        }
        if !stats.established.swap(true, Ordering::Relaxed) {
            Counters::inc(&rec.counters.ready);
        }
        let started = Instant::now();
        let mut events = 0usize;
        let mut body = resp.bytes_stream();
        let mut buf: Vec<u8> = Vec::new();
        loop {
            let chunk = match body.next().await {
                Some(Ok(chunk)) => chunk,
                Some(Err(e)) => {
                    rec.note(format!("watch stream broke: {}", error_kind(&e)));
                    break;
                }
                None => {
                    rec.note("watch stream ended".into());
                    break;
                }
            };
            let at = Instant::now();
            buf.extend_from_slice(&chunk);
            let mut start = 0;
            while let Some(nl) = buf[start..].iter().position(|b| *b == b'\n') {
                let line = self.on_line(&buf[start..start + nl], at, rv);
                start += nl + 1;
                match line {
                    Line::Skip => {}
                    Line::Event => events += 1,
                    Line::Error { gone } => return Outcome::Relist { gone },
                }
            }
            buf.drain(..start);
        }
        stats.ended.fetch_add(1, Ordering::Relaxed);
        Counters::inc(&rec.counters.ended);
        // client-go's "very short watch": closed within a second without an event.
        if events == 0 && started.elapsed() < Duration::from_secs(1) {
            rec.note("very short watch (relist)".into());
            return Outcome::Relist { gone: false };
        }
        Outcome::Ended
    }

    fn on_line(&self, line: &[u8], at: Instant, rv: &mut String) -> Line {
        let rec = &self.shared.rec;
        if line.iter().all(u8::is_ascii_whitespace) {
            return Line::Skip; // kcache's keepalive newline
        }
        let Ok(ev) = serde_json::from_slice::<Event>(line) else {
            rec.failure("unparsable watch line".into());
            return Line::Skip;
        };
        if ev.kind == "ERROR" {
            let code = ev.object.code.unwrap_or(0);
            if code == 410 {
                self.stats.gone.fetch_add(1, Ordering::Relaxed);
            } else {
                self.stats.error_events.fetch_add(1, Ordering::Relaxed);
            }
            rec.failure(format!("watch event ERROR {code}"));
            return Line::Error { gone: code == 410 };
        }
        if let Some(v) = ev.object.metadata.resource_version.as_deref() {
            if !v.is_empty() {
                v.clone_into(rv);
            }
        }
        if ev.kind != "BOOKMARK" {
            self.check(&ev.object.metadata, at);
        }
        Line::Event
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::node_client;

    #[test]
    fn backoff_doubles_to_the_cap_with_jitter() {
        let mut b = Backoff::new(1);
        let waits: Vec<Duration> = (0..8).map(|_| b.wait()).collect();
        assert!(waits[0] >= BACKOFF_INITIAL && waits[0] < BACKOFF_INITIAL * 2);
        assert!(waits[1] >= BACKOFF_INITIAL * 2 && waits[1] < BACKOFF_INITIAL * 4);
        assert!(waits[7] >= BACKOFF_CAP && waits[7] < BACKOFF_CAP * 2);
    }

    #[test]
    fn relist_queries_follow_client_go() {
        assert_eq!(ListFrom::Zero.query(), "resourceVersion=0&limit=500");
        assert_eq!(ListFrom::At("42".into()).query(), "resourceVersion=42");
        assert_eq!(
            ListFrom::At(String::new()).query(),
            "resourceVersion=0&limit=500"
        );
        assert_eq!(ListFrom::Consistent.query(), "limit=500");
    }

    #[test]
    fn watch_lines_update_the_rv_and_find_the_write() {
        let shared = Arc::new(Shared {
            rec: Arc::new(Recorder::new(1)),
            base: String::new(),
            token: String::new(),
            writes: vec![OnceLock::new()],
        });
        let r = Reflector {
            http: node_client(false),
            shared: shared.clone(),
            stats: Arc::default(),
            object: 0,
            collection: String::new(),
            name: "s0".into(),
            seed: 0,
        };
        let at = Instant::now();
        let mut rv = "1".to_string();
        let bookmark = br#"{"type":"BOOKMARK","object":{"metadata":{"resourceVersion":"9"}}}"#;
        assert!(matches!(r.on_line(bookmark, at, &mut rv), Line::Event));
        assert_eq!(rv, "9");
        assert!(matches!(r.on_line(b" ", at, &mut rv), Line::Skip));
        let _ = shared.writes[0].set(("s77".into(), at));
        let old = br#"{"type":"MODIFIED","object":{"metadata":{"resourceVersion":"10","annotations":{"bench-seq":"s1"}}}}"#;
        r.on_line(old, at, &mut rv);
        assert!(r.stats.got.get().is_none());
        let new = br#"{"type":"MODIFIED","object":{"metadata":{"resourceVersion":"11","annotations":{"bench-seq":"s77"}}}}"#;
        r.on_line(new, at, &mut rv);
        assert_eq!((r.stats.got.get(), rv.as_str()), (Some(&at), "11"));
        let gone = br#"{"type":"ERROR","object":{"kind":"Status","code":410}}"#;
        assert!(matches!(
            r.on_line(gone, at, &mut rv),
            Line::Error { gone: true }
        ));
        assert_eq!(r.stats.counts().gone, 1);
    }

    #[tokio::test]
    async fn refused_connections_are_told_apart_also_for_waiters() {
        // A free port, closed again: nothing listens there.
        let Ok(l) = std::net::TcpListener::bind("127.0.0.1:0") else {
            return;
        };
        let Ok(addr) = l.local_addr() else { return };
        drop(l);
        let c = node_client(false);
        let tasks: Vec<_> = (0..20)
            .map(|_| {
                let c = c.clone();
                tokio::spawn(async move { c.get(format!("https://{addr}/x")).send().await })
            })
            .collect();
        for t in tasks {
            match t.await {
                Ok(Err(e)) => assert!(refused(&e), "{e:?}"),
                other => panic!("{other:?}"),
            }
        }
    }
}
