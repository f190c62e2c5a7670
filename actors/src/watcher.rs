//! One downstream watch, with the API server's cacheWatcher semantics: its own filter,
//! ADDED/MODIFIED/DELETED derived from old and new objects passing it, never an object
//! event at or below the RV it started from, bookmarks, a timeout, and a bounded buffer —
//! a client that stops reading is closed rather than allowed to slow its key.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use bytes::Bytes;
use serde_json::{json, Value};

use crate::body;
use crate::cached_object::{self, CachedObject};
use crate::core::bookmark::bookmark_line;
use crate::core::event::{encode_line, with_rv, StoreEvent};
use crate::core::filter::{convert, Conversion, EventType, Filter};
use crate::core::key::Key;
use crate::core::rv::WatchPlan;
use crate::metrics as m;
use crate::registry::{Registry, Release};

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// Encodes one object event as a watch line.
pub type EncodeFn = dyn Fn(EventType, &Value) -> Bytes + Send + Sync;

/// How a watcher writes an object event. JSON shares the key's pre-encoded line; other
/// encodings (the HTTP layer's `as=Table`) encode per watcher.
#[derive(Clone)]
pub enum Encoder {
    Json,
    Custom(Arc<EncodeFn>),
}

impl Encoder {
    fn encode(&self, kind: EventType, obj: &Value) -> Bytes {
        match self {
            Encoder::Json => encode_line(kind.as_str(), obj),
            Encoder::Custom(f) => f(kind, obj),
        }
    }
}

/// Everything a watcher needs; built by the HTTP layer after validation.
pub struct WatcherSpec {
    pub key: Key,
    pub filter: Filter,
    pub plan: WatchPlan,
    pub allow_bookmarks: bool,
    pub timeout: Duration,
    pub encoder: Encoder,
    /// The HTTP response body; bounded, its capacity is the watcher's buffer.
    pub body: body::Sender,
    pub cached: Addr<CachedObject>,
    /// Holds the reference this watcher releases when it stops.
    pub registry: Addr<Registry>,
    /// Mailbox capacity for events from the CachedObject.
    pub mailbox: usize,
    /// Write a bare newline when nothing was written for this long (see
    /// `CacheConfig::watch_keepalive_secs`).
    pub keepalive: Duration,
    /// Held for the watch's lifetime (the HTTP layer's admission permit); dropped with it.
    pub permit: Option<Box<dyn Send>>,
}

pub struct Watcher {
    id: u64,
    spec: WatcherSpec,
    /// Object events at or below this RV are never sent (the client has them).
    floor: u64,
    /// Highest event sequence handled; replay and live events may overlap.
    last_seq: u64,
    /// Highest RV sent, so bookmarks never go back.
    sent_rv: u64,
    started: bool,
    closing: bool,
    last_write: Instant,
    /// Metric handles, resolved once: a delivery must not build and look up labels.
    dispatched: metrics::Counter,
    registered: metrics::Gauge,
}

impl Watcher {
    pub fn new(spec: WatcherSpec) -> Self {
        let labels = [
            ("group", spec.key.resource.group.clone()),
            ("resource", spec.key.resource.resource.clone()),
        ];
        let dispatched = metrics::counter!(m::EVENTS_DISPATCHED, &labels);
        let registered = metrics::gauge!(m::REGISTERED_WATCHERS, &labels);
        Watcher {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            floor: spec.plan.from_rv,
            sent_rv: spec.plan.from_rv,
            spec,
            last_seq: 0,
            started: false,
            closing: false,
            last_write: Instant::now(),
            dispatched,
            registered,
        }
    }

    /// Writes one line to the client; a full buffer means the client is not reading.
    fn push(&mut self, line: Bytes, ctx: &mut Context<Self>) -> bool {
        if self.closing {
            return false;
        }
        let keepalive = line.len() == 1;
        match self.spec.body.try_send(line) {
            Ok(()) => {
                self.last_write = Instant::now();
                if !keepalive {
                    self.dispatched.increment(1);
                }
                true
            }
            Err(body::Error::Full) => {
                let r = &self.spec.key.resource;
                metrics::counter!(m::TERMINATED_WATCHERS, "group" => r.group.clone(), "resource" => r.resource.clone())
                    .increment(1);
                tracing::warn!(key = %self.spec.key, watcher = self.id, "closing unresponsive watcher: client is not reading");
                self.closing = true;
                ctx.stop();
                false
            }
            Err(body::Error::Closed) => {
                self.closing = true;
                ctx.stop();
                false
            }
        }
    }

    fn deliver(&mut self, ev: &StoreEvent, ctx: &mut Context<Self>) {
        if ev.seq <= self.last_seq {
            return;
        }
        self.last_seq = ev.seq;
        if ev.rv <= self.floor {
            return;
        }
        let line = match convert(&self.spec.filter, ev.kind, &ev.object, ev.prev.as_deref()) {
            None => return,
            Some(Conversion::Send {
                kind,
                same_as_source: true,
            }) if matches!(self.spec.encoder, Encoder::Json) => {
                let _ = kind;
                ev.line.clone()
            }
            Some(Conversion::Send { kind, .. }) => self.spec.encoder.encode(kind, &ev.object),
            Some(Conversion::DeletedPrev) => match &ev.prev {
                Some(prev) => self
                    .spec
                    .encoder
                    .encode(EventType::Deleted, &with_rv(prev, ev.rv)),
                None => return,
            },
        };
        if self.push(line, ctx) {
            self.sent_rv = self.sent_rv.max(ev.rv);
        }
    }

    fn bookmark(&mut self, rv: u64, initial_events_end: bool, ctx: &mut Context<Self>) {
        // Never below what the client already has; equal is allowed (as the seed does).
        let rv = rv.max(self.sent_rv).max(self.floor);
        let line = bookmark_line(&self.spec.key.resource, rv, initial_events_end);
        if self.push(line, ctx) {
            self.sent_rv = rv;
        }
    }
}

/// An in-stream `ERROR` event carrying a Kubernetes `Status`.
pub fn error_line(code: u16, reason: &str, message: &str) -> Bytes {
    let status = json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    });
    encode_line("ERROR", &status)
}

impl Actor for Watcher {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        ctx.set_mailbox_capacity(self.spec.mailbox.max(1));
        self.registered.increment(1.0);
        let deadline = deadline_after(self.spec.timeout);
        // The timeout, the keepalives and noticing a client that went away (even on a
        // quiet key) share one stream: one allocation and one timer per watch instead of
        // three, which matters at tens of thousands of idle watches.
        ctx.add_stream(ticks(
            self.spec.body.closed(),
            deadline,
            self.spec.keepalive,
        ));
        self.spec.cached.do_send(cached_object::Subscribe {
            id: self.id,
            addr: ctx.address(),
            plan: self.spec.plan,
            allow_bookmarks: self.spec.allow_bookmarks,
            deadline: Some(deadline),
        });
    }

    fn stopped(&mut self, _ctx: &mut Self::Context) {
        self.registered.decrement(1.0);
        self.spec
            .cached
            .do_send(cached_object::Unsubscribe { id: self.id });
        self.spec.registry.do_send(Release {
            key: self.spec.key.clone(),
        });
    }
}

/// Longest timeout a watcher keeps; ten years is "never" for a watch.
const LONGEST_TIMEOUT: Duration = Duration::from_secs(10 * 365 * 24 * 3600);

/// `now + timeout`, capped: a client may send any `timeoutSeconds` up to `u64::MAX`, which
/// `Instant` cannot represent (adding it panics).
fn deadline_after(timeout: Duration) -> Instant {
    Instant::now() + timeout.min(LONGEST_TIMEOUT)
}

/// What wakes an idle watcher.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tick {
    /// Time to write a bare newline if nothing was written for a period.
    Keepalive,
    /// The watch's timeout passed.
    Timeout,
    /// The response body was dropped: the client went away.
    Gone,
}

/// The ticks of one watcher: keepalives every `every` (none if zero) from a random phase,
/// then `Timeout` at `deadline`, or `Gone` as soon as `closed` resolves; nothing after
/// `Timeout` or `Gone`.
fn ticks(
    closed: body::Closed,
    deadline: Instant,
    every: Duration,
) -> impl futures::Stream<Item = Tick> {
    // Watches opened together (a node's, after a restart) would otherwise all write their
    // keepalives in the same instant, every period: a burst that delays real events.
    let first = (!every.is_zero()).then(|| Instant::now() + every.mul_f64(rand::random::<f64>()));
    futures::stream::unfold(Some((closed, first)), move |state| async move {
        let (mut closed, next) = state?;
        let at = next.map_or(deadline, |n| n.min(deadline));
        tokio::select! {
            _ = &mut closed => Some((Tick::Gone, None)),
            _ = tokio::time::sleep_until(at.into()) => {
                if at >= deadline {
                    Some((Tick::Timeout, None))
                } else {
                    Some((Tick::Keepalive, Some((closed, Some(at + every)))))
                }
            }
        }
    })
}

impl StreamHandler<Tick> for Watcher {
    fn handle(&mut self, tick: Tick, ctx: &mut Self::Context) {
        match tick {
            Tick::Keepalive => {
                if self.last_write.elapsed() >= self.spec.keepalive {
                    self.push(Bytes::from_static(b"\n"), ctx);
                }
            }
            Tick::Timeout | Tick::Gone => {
                self.closing = true;
                ctx.stop();
            }
        }
    }

    // The stream ends only after `Timeout` or `Gone`, which stop the watcher already.
    fn finished(&mut self, _ctx: &mut Self::Context) {}
}

/// The watcher's start: initial ADDED events (state at `initial_rv`) or events to replay.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Start {
    pub initial: Vec<Arc<Value>>,
    pub initial_rv: u64,
    pub end_bookmark: bool,
    pub replay: Vec<Arc<StoreEvent>>,
    pub floor: u64,
    /// Events up to this sequence are covered by `initial`/`replay`.
    pub start_seq: u64,
}

/// The watch's RV is older than the key can replay.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Expired {
    pub requested: u64,
    pub oldest: u64,
}

/// The watch could not start (key not synced in time, not fresh enough, stopping).
#[derive(Message)]
#[rtype(result = "()")]
pub struct Failed {
    pub error: cached_object::Error,
}

/// One event of the key.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Dispatch(pub Arc<StoreEvent>);

/// A periodic or pre-timeout bookmark at the key's progress.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Bookmark {
    pub rv: u64,
}

#[derive(Debug, Clone, Copy)]
pub enum CloseReason {
    TooSlow,
    KeyStopped,
    /// Shutdown: send a last bookmark (when allowed) so the client resumes exactly here.
    Draining {
        rv: u64,
    },
}

#[derive(Message)]
#[rtype(result = "()")]
pub struct Close {
    pub reason: CloseReason,
}

impl Handler<Start> for Watcher {
    type Result = ();

    fn handle(&mut self, msg: Start, ctx: &mut Self::Context) {
        self.started = true;
        for obj in &msg.initial {
            if self.spec.filter.matches(obj) {
                let line = self.spec.encoder.encode(EventType::Added, obj);
                if !self.push(line, ctx) {
                    return;
                }
            }
        }
        if !msg.initial.is_empty() || msg.end_bookmark {
            self.sent_rv = self.sent_rv.max(msg.initial_rv);
            // Live events after the snapshot are all newer than it.
            self.floor = self.floor.max(msg.initial_rv);
        }
        if msg.end_bookmark {
            self.bookmark(msg.initial_rv, true, ctx);
        }
        for ev in &msg.replay {
            self.deliver(ev, ctx);
        }
        self.floor = self.floor.max(msg.floor);
        self.last_seq = self.last_seq.max(msg.start_seq);
    }
}

impl Handler<Expired> for Watcher {
    type Result = ();

    fn handle(&mut self, msg: Expired, ctx: &mut Self::Context) {
        // As 1.20: HTTP 200, then one in-stream ERROR with a 410 Expired Status, which is
        // the form clients (kube-rs, client-go's reflector) relist on.
        let message = format!(
            "too old resource version: {} ({})",
            msg.requested, msg.oldest
        );
        self.push(error_line(410, "Expired", &message), ctx);
        self.closing = true;
        ctx.stop();
    }
}

impl Handler<Failed> for Watcher {
    type Result = ();

    fn handle(&mut self, msg: Failed, ctx: &mut Self::Context) {
        let (code, reason) = match msg.error {
            cached_object::Error::TooLargeResourceVersion { .. } => (504, "Timeout"),
            cached_object::Error::NotSynced { .. } => (503, "ServiceUnavailable"),
            cached_object::Error::Stopping { .. } => (503, "ServiceUnavailable"),
        };
        self.push(error_line(code, reason, &msg.error.to_string()), ctx);
        self.closing = true;
        ctx.stop();
    }
}

impl Handler<Dispatch> for Watcher {
    type Result = ();

    fn handle(&mut self, msg: Dispatch, ctx: &mut Self::Context) {
        if self.started {
            self.deliver(&msg.0, ctx);
        }
    }
}

impl Handler<Bookmark> for Watcher {
    type Result = ();

    fn handle(&mut self, msg: Bookmark, ctx: &mut Self::Context) {
        if self.started && self.spec.allow_bookmarks {
            self.bookmark(msg.rv, false, ctx);
        }
    }
}

impl Handler<Close> for Watcher {
    type Result = ();

    fn handle(&mut self, msg: Close, ctx: &mut Self::Context) {
        if let CloseReason::Draining { rv } = msg.reason {
            if self.started && self.spec.allow_bookmarks {
                self.bookmark(rv, false, ctx);
            }
        }
        self.closing = true;
        ctx.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn any_client_timeout_gives_a_deadline() {
        let now = Instant::now();
        let far = deadline_after(Duration::from_secs(u64::MAX));
        assert!(far >= now + LONGEST_TIMEOUT);
        let near = deadline_after(Duration::from_secs(5));
        assert!(near >= now + Duration::from_secs(5) && near < far);
    }

    #[tokio::test(start_paused = true)]
    async fn keepalives_every_period_then_the_timeout_then_nothing() {
        use futures::StreamExt;
        let (tx, _body) = body::channel(4);
        let every = Duration::from_secs(10);
        let ticks: Vec<Tick> = ticks(tx.closed(), deadline_after(Duration::from_secs(35)), every)
            .collect()
            .await;
        let (last, keepalives) = ticks.split_last().expect("ticks");
        assert_eq!(*last, Tick::Timeout, "{ticks:?}");
        // The first keepalive comes at a random phase within the first period.
        assert!((3..=4).contains(&keepalives.len()), "{ticks:?}");
        assert!(
            keepalives.iter().all(|t| *t == Tick::Keepalive),
            "{ticks:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_dropped_body_ends_the_ticks_at_once() {
        use futures::StreamExt;
        let (tx, body) = body::channel(4);
        let mut ticks = Box::pin(ticks(
            tx.closed(),
            deadline_after(Duration::from_secs(3600)),
            Duration::ZERO,
        ));
        drop(body);
        let started = tokio::time::Instant::now();
        assert_eq!(ticks.next().await, Some(Tick::Gone));
        assert_eq!(ticks.next().await, None);
        assert!(started.elapsed() < Duration::from_secs(1));
    }
}
