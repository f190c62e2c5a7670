//! One downstream watch, with the API server's cacheWatcher semantics: its own filter,
//! ADDED/MODIFIED/DELETED derived from old and new objects passing it, never an object
//! event at or below the RV it started from, bookmarks, a timeout, and a bounded buffer —
//! a client that stops reading live events is closed rather than allowed to slow its key.
//!
//! Initial events and replays are a *backlog* written at the client's pace, however many
//! there are (cacheWatcher sends its initial events before reading its live channel, and
//! only the client's timeout bounds them). Meanwhile the watcher is not live: the key
//! sends it nothing. When the backlog is written, it tells the key the last sequence
//! number it covered ([`watch_feed::Ready`]); the key answers with the events since
//! ([`Replay`]) and makes it live once they fit in the client's buffer, or ends the watch
//! with a 410 when its window no longer holds them.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use bytes::Bytes;
use serde_json::json;

use crate::body;
use crate::core::bookmark::{bookmark_line, bookmark_object};
use crate::core::cover;
use crate::core::event::{encode_line, encode_value_line, StoreEvent, BACKFILLED_SEQ};
use crate::core::filter::{convert, Conversion, Filter};
use crate::core::key::{Key, ResourceType};
use crate::core::key_machine::Cursor;
use crate::core::object::{EventType, Object};
use crate::core::proto::Codec;
use crate::core::rv::WatchPlan;
use crate::dispatch_budget::DispatchBudget;
use crate::metrics as m;
use crate::registry::{Moved, Registry, Release};
use crate::watch_feed::{
    CloseReason, KeyLink, Move, MovedFrom, Ready, Start, Subscribe, ToKey, ToWatcher,
};

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// Encodes one object event as a watch line.
pub type EncodeFn = dyn Fn(EventType, &Object) -> Bytes + Send + Sync;

/// How a watcher writes its events. JSON shares the key's pre-encoded line and protobuf
/// the event's frame, made once for all its protobuf watchers; other encodings (the HTTP
/// layer's `as=Table`) encode per watcher.
#[derive(Clone)]
pub enum Encoder {
    Json,
    /// Length-prefixed protobuf frames (`core::proto`).
    Protobuf(Arc<Codec>),
    Custom(Arc<EncodeFn>),
}

impl Encoder {
    /// An event of `obj` as `kind`; `None` when the object has no form in this encoding.
    fn encode(&self, kind: EventType, obj: &Object) -> Option<Bytes> {
        match self {
            Encoder::Json => Some(encode_line(kind, obj)),
            Encoder::Protobuf(c) => obj.proto(c).map(|m| c.event(kind.as_str(), &m)),
            Encoder::Custom(f) => Some(f(kind, obj)),
        }
    }

    /// `ev` as the key saw it, shared with every watcher of this encoding where it can be.
    fn shared(&self, ev: &StoreEvent) -> Option<Bytes> {
        match self {
            Encoder::Json => Some(ev.line.clone()),
            Encoder::Protobuf(c) => ev.proto_frame(c),
            Encoder::Custom(f) => Some(f(ev.kind, &ev.object)),
        }
    }

    /// `None` only if protobuf could not express a bookmark (the kind's metadata, which
    /// every schema has): the bookmark is then skipped, never sent empty.
    fn bookmark(
        &self,
        resource: &ResourceType,
        rv: u64,
        initial_events_end: bool,
    ) -> Option<Bytes> {
        match self {
            Encoder::Protobuf(c) => c
                .bookmark(&bookmark_object(resource, rv, initial_events_end))
                .ok(),
            _ => Some(bookmark_line(resource, rv, initial_events_end)),
        }
    }

    /// An in-stream `ERROR` event carrying a Kubernetes `Status`; `None` only if protobuf
    /// could not express a `Status` (every schema has it): the watch then just ends.
    fn error(&self, code: u16, reason: &str, message: &str) -> Option<Bytes> {
        let status = status(code, reason, message);
        match self {
            Encoder::Protobuf(c) => c.error(&status).ok(),
            _ => Some(encode_value_line("ERROR", &status)),
        }
    }

    /// Whether a bare newline may keep the connection busy: not between length-prefixed
    /// frames, where it would be read as a frame's length (the API server sends none).
    fn keepalives(&self) -> bool {
        !matches!(self, Encoder::Protobuf(_))
    }
}

/// When an idle watch writes its keepalive newline: every `every` (never if zero), at the
/// instants of one process-wide grid shifted by `phase` of a period.
///
/// Why a grid: the watches of one HTTP/2 connection (a kubelet's 33, a benchmark's 100)
/// share its phase ([`KeepalivePhase`]), so their ticks fall in the same instant and
/// their newlines leave as one batch of frames — one TLS record, one `writev` — instead
/// of one each. Connections draw their phases at random, so the process as a whole still
/// spreads its keepalives over the period rather than writing them all in one burst.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Keepalive {
    pub every: Duration,
    /// In [0, 1): the fraction of `every` this watch's ticks are shifted by.
    pub phase: f64,
}

/// The keepalive phase of one client connection, drawn when it is accepted and kept in
/// its connection data for every watch it carries (see [`Keepalive`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct KeepalivePhase(pub f64);

impl KeepalivePhase {
    pub fn random() -> Self {
        KeepalivePhase(rand::random::<f64>())
    }
}

/// Everything a watcher needs; built by the HTTP layer after validation.
pub struct WatcherSpec {
    /// The key the request asked for, when a key covering it serves it (`core::cover`);
    /// boxed: most watches are on their own key, and a watch's size counts.
    pub asked: Option<Box<Key>>,
    pub filter: Filter,
    pub plan: WatchPlan,
    pub allow_bookmarks: bool,
    /// When the watch ends (its timeout): [`deadline_after`] the client's timeout.
    pub deadline: Instant,
    pub encoder: Encoder,
    /// The HTTP response body; bounded, its capacity is the watcher's buffer.
    pub body: body::Sender,
    /// The key the watcher is held on and fed by, and its address.
    pub cached: KeyLink,
    /// Holds the reference this watcher releases when it stops; shared by all watchers
    /// (an address clone is three allocations of its own).
    pub registry: Arc<Addr<Registry>>,
    /// Mailbox capacity for events from the CachedObject.
    pub mailbox: usize,
    /// The resource's dispatch budget: how long a live event may wait for room in the
    /// client's buffer before the watch is closed as too slow.
    pub budget: Arc<DispatchBudget>,
    /// When to write a bare newline if nothing was written (see
    /// `CacheConfig::watch_keepalive_secs`).
    pub keepalive: Keepalive,
    /// Held for the watch's lifetime (the HTTP layer's admission permit); dropped with it.
    pub permit: Option<Box<dyn Send>>,
}

/// One line still to write of a backlog.
enum Item {
    /// An initial object, sent as ADDED if it passes the filter.
    Object(Arc<Object>),
    /// The `k8s.io/initial-events-end` bookmark at this RV.
    EndBookmark(u64),
    Event(Arc<StoreEvent>),
    /// A last line (an in-stream error), after which the watch ends.
    Final(Bytes),
    /// A live event's line, at its RV, that found the client's buffer full (`stall`).
    Line(Bytes, u64),
}

pub struct Watcher {
    id: u64,
    spec: WatcherSpec,
    /// Initial events, replays, or a final error, written as the client reads.
    backlog: std::collections::VecDeque<Item>,
    /// The key's sequence number the backlog brings the watcher up to.
    backlog_seq: u64,
    /// Waiting for room in the body to write more of the backlog.
    waiting_for_room: bool,
    /// A live event found the client's buffer full: when the wait for room began and how
    /// much of the dispatch budget it took.
    /// Boxed, as `moving`: rare, and an idle watch's size counts (issue 31.1).
    stalled: Option<Box<(Instant, Duration)>>,
    /// The key sends this watcher its events and bookmarks.
    live: bool,
    /// The never-go-back rules: the RV floor, the last sequence handled (replay and live
    /// events may overlap), the highest RV sent (bookmarks never go back).
    cursor: Cursor,
    started: bool,
    closing: bool,
    /// A move to another key, waiting for the backlog to be written.
    moving: Option<Box<Move>>,
    last_write: Instant,
    /// Metric handles, resolved once per resource and shared.
    metrics: Arc<Handles>,
}

/// A resource's watcher metric handles: a delivery must not build and look up labels, and
/// a watcher should not carry three handles of its own.
struct Handles {
    dispatched: metrics::Counter,
    registered: metrics::Gauge,
    delivery: metrics::Histogram,
}

impl Handles {
    /// The handles of `resource`'s watchers, made by its first watcher.
    fn of(resource: &ResourceType) -> Arc<Handles> {
        type ByResource = std::collections::HashMap<(String, String), Arc<Handles>>;
        static HANDLES: std::sync::OnceLock<std::sync::Mutex<ByResource>> =
            std::sync::OnceLock::new();
        let mut map = HANDLES
            .get_or_init(Default::default)
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        map.entry((resource.group.clone(), resource.resource.clone()))
            .or_insert_with(|| {
                let labels = [
                    ("group", resource.group.clone()),
                    ("resource", resource.resource.clone()),
                ];
                Arc::new(Handles {
                    dispatched: metrics::counter!(m::EVENTS_DISPATCHED, &labels),
                    registered: metrics::gauge!(m::REGISTERED_WATCHERS, &labels),
                    delivery: metrics::histogram!(m::EVENT_DELIVERY, &labels),
                })
            })
            .clone()
    }
}

impl Watcher {
    pub fn new(spec: WatcherSpec) -> Self {
        let metrics = Handles::of(&spec.cached.key.resource);
        Watcher {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            cursor: Cursor::new(spec.plan.from_rv),
            spec,
            backlog: std::collections::VecDeque::new(),
            backlog_seq: 0,
            waiting_for_room: false,
            stalled: None,
            live: false,
            started: false,
            closing: false,
            moving: None,
            last_write: Instant::now(),
            metrics,
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
                    self.metrics.dispatched.increment(1);
                }
                true
            }
            Err(body::Error::Full) => {
                self.too_slow(ctx);
                false
            }
            Err(body::Error::Closed) => {
                self.closing = true;
                ctx.stop();
                false
            }
        }
    }

    /// A live watcher whose client does not keep up: closed, as cacheWatcher's are.
    fn too_slow(&mut self, ctx: &mut Context<Self>) {
        let r = &self.spec.cached.key.resource;
        metrics::counter!(m::TERMINATED_WATCHERS, "group" => r.group.clone(), "resource" => r.resource.clone())
            .increment(1);
        tracing::warn!(key = %self.spec.cached.key, watcher = self.id, "closing unresponsive watcher: client is not reading");
        self.closing = true;
        ctx.stop();
    }

    /// Sends the event if this watcher wants it; whether a line was queued.
    fn deliver(&mut self, ev: &StoreEvent, ctx: &mut Context<Self>) -> bool {
        // Events from before the key's list (`BACKFILLED_SEQ`) come only in a start's
        // replay, once, ahead of every numbered event: the RV floor alone orders them.
        if !self.cursor.admit(ev.seq, ev.rv, BACKFILLED_SEQ) {
            return false;
        }
        let line = match convert(&self.spec.filter, ev.kind, &ev.object, ev.prev.as_deref()) {
            None => return false,
            Some(Conversion::Send {
                same_as_source: true,
                ..
            }) => self.spec.encoder.shared(ev),
            Some(Conversion::Send { kind, .. }) => self.spec.encoder.encode(kind, &ev.object),
            Some(Conversion::DeletedPrev) => match &ev.prev {
                Some(prev) => self
                    .spec
                    .encoder
                    .encode(EventType::Deleted, &prev.with_rv(ev.rv)),
                None => return false,
            },
        };
        let Some(line) = line else {
            self.unencodable(ctx);
            return false;
        };
        if self.live && self.spec.body.room() == 0 && !self.closing {
            return self.stall(line, ev.rv, ctx);
        }
        let pushed = self.push(line, ctx);
        if pushed {
            self.cursor.sent(ev.rv);
        }
        pushed
    }

    /// A live event found the client's buffer full. As the cacher's dispatch, wait for
    /// room at most what the resource's budget has left: the line waits at the head of the
    /// backlog (later events queue behind it, bounded by the mailbox size), and the watch
    /// is closed as too slow when the budget is empty or the wait runs out. A client that
    /// was only a moment behind keeps its watch.
    fn stall(&mut self, line: Bytes, rv: u64, ctx: &mut Context<Self>) -> bool {
        let wait = self.spec.budget.take();
        if wait.is_zero() {
            metrics::counter!(m::DISPATCH_WAITS, "outcome" => "no_budget").increment(1);
            self.too_slow(ctx);
            return false;
        }
        let since = Instant::now();
        self.stalled = Some(Box::new((since, wait)));
        self.backlog.push_back(Item::Line(line, rv));
        ctx.run_later(wait, move |act, ctx| {
            // Still the same wait, and the backlog not written: the budget is spent.
            if act.stalled.as_deref().is_some_and(|(s, _)| *s == since) {
                act.stalled = None;
                metrics::counter!(m::DISPATCH_WAITS, "outcome" => "closed").increment(1);
                act.too_slow(ctx);
            }
        });
        self.drain(ctx);
        true
    }

    /// Writes the backlog while the client's buffer has room, waits for room when it has
    /// none, and once it is written asks the key to continue (unless already live).
    fn drain(&mut self, ctx: &mut Context<Self>) {
        while !self.backlog.is_empty() {
            if self.closing {
                return;
            }
            if self.spec.body.room() == 0 {
                if !self.waiting_for_room {
                    self.waiting_for_room = true;
                    ctx.spawn(
                        self.spec
                            .body
                            .writable()
                            .into_actor(self)
                            .map(|(), act, ctx| {
                                act.waiting_for_room = false;
                                act.drain(ctx);
                            }),
                    );
                }
                return;
            }
            match self.backlog.pop_front() {
                Some(Item::Object(obj)) if self.spec.filter.matches(&obj) => {
                    match self.spec.encoder.encode(EventType::Added, &obj) {
                        Some(line) => {
                            self.push(line, ctx);
                        }
                        None => {
                            self.unencodable(ctx);
                            return;
                        }
                    }
                }
                Some(Item::Object(_)) => {}
                Some(Item::EndBookmark(rv)) => self.bookmark(rv, true, ctx),
                Some(Item::Event(ev)) => {
                    self.deliver(&ev, ctx);
                }
                Some(Item::Final(line)) => {
                    self.push(line, ctx);
                    self.closing = true;
                    ctx.stop();
                    return;
                }
                Some(Item::Line(line, rv)) => {
                    let pushed = self.push(line, ctx);
                    if pushed {
                        self.cursor.sent(rv);
                    }
                }
                None => {}
            }
        }
        if let Some((since, wait)) = self.stalled.take().map(|s| *s) {
            // Caught up within the wait: what it did not use goes back to the others.
            self.spec
                .budget
                .give_back(wait.saturating_sub(since.elapsed()));
            metrics::counter!(m::DISPATCH_WAITS, "outcome" => "caught_up").increment(1);
        }
        // Shrink what a 20,000-object start left behind.
        self.backlog = std::collections::VecDeque::new();
        self.cursor.covered(self.backlog_seq);
        if let Some(m) = self.moving.take() {
            self.move_to(*m, ctx);
            return;
        }
        if !self.live && !self.closing {
            self.spec.cached.do_send(ToKey::Ready(Ready {
                id: self.id,
                after_seq: self.cursor.last_seq,
                rv: self.cursor.rv(),
                room: self.spec.body.room(),
            }));
        }
    }

    /// An object this watch's encoding cannot express (protobuf, and a field the schema
    /// lacks): the watch ends with an error rather than send the object without it. The
    /// resource is then served as JSON (`Codec::refuse`), so the client's next list and
    /// watch get every field.
    fn unencodable(&mut self, ctx: &mut Context<Self>) {
        metrics::counter!(m::PROTOBUF_UNENCODABLE, "group" => self.spec.cached.key.resource.group.clone(), "resource" => self.spec.cached.key.resource.resource.clone())
            .increment(1);
        let line = self.spec.encoder.error(
            500,
            "InternalError",
            "kcache cannot encode an object of this resource as protobuf; list again",
        );
        self.finish_with(line, ctx);
    }

    /// Ends the watch with one in-stream error line, written after what is queued.
    fn finish_with(&mut self, line: Option<Bytes>, ctx: &mut Context<Self>) {
        self.backlog.clear();
        match line {
            Some(line) => {
                self.backlog.push_back(Item::Final(line));
                self.drain(ctx);
            }
            None => {
                self.closing = true;
                ctx.stop();
            }
        }
    }

    fn bookmark(&mut self, rv: u64, initial_events_end: bool, ctx: &mut Context<Self>) {
        // Never below what the client already has; equal is allowed (as the seed does).
        let rv = self.cursor.bookmark_rv(rv);
        let line =
            self.spec
                .encoder
                .bookmark(&self.spec.cached.key.resource, rv, initial_events_end);
        let Some(line) = line else { return };
        if self.push(line, ctx) {
            self.cursor.sent(rv);
        }
    }
}

/// An in-stream `ERROR` event carrying a Kubernetes `Status`, as JSON.
pub fn error_line(code: u16, reason: &str, message: &str) -> Bytes {
    encode_value_line("ERROR", &status(code, reason, message))
}

fn status(code: u16, reason: &str, message: &str) -> serde_json::Value {
    json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    })
}

impl Actor for Watcher {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        ctx.set_mailbox_capacity(self.spec.mailbox.max(1));
        self.metrics.registered.increment(1.0);
        let deadline = self.spec.deadline;
        // The timeout, the keepalives and noticing a client that went away (even on a
        // quiet key) share one stream: one allocation and one timer per watch instead of
        // three, which matters at tens of thousands of idle watches.
        ctx.add_stream(ticks(
            self.spec.body.closed(),
            deadline,
            self.spec.keepalive,
        ));
        self.subscribe(self.spec.plan, None, ctx);
    }

    fn stopped(&mut self, _ctx: &mut Self::Context) {
        self.metrics.registered.decrement(1.0);
        self.spec.cached.do_send(ToKey::Unsubscribe { id: self.id });
        self.spec.registry.do_send(Release {
            key: self.spec.cached.key.clone(),
            asked: self
                .spec
                .asked
                .as_deref()
                .unwrap_or(&self.spec.cached.key)
                .clone(),
        });
    }
}

/// Longest timeout a watcher keeps; ten years is "never" for a watch.
const LONGEST_TIMEOUT: Duration = Duration::from_secs(10 * 365 * 24 * 3600);

/// `now + timeout`, capped: a client may send any `timeoutSeconds` up to `u64::MAX`, which
/// `Instant` cannot represent (adding it panics).
pub fn deadline_after(timeout: Duration) -> Instant {
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

/// The ticks of one watcher: keepalives at the instants of `keepalive`'s grid, then
/// `Timeout` at `deadline`, or `Gone` as soon as `closed` resolves; nothing after
/// `Timeout` or `Gone`.
fn ticks(
    closed: body::Closed,
    deadline: Instant,
    keepalive: Keepalive,
) -> impl futures::Stream<Item = Tick> {
    let Keepalive { every, phase } = keepalive;
    // As long as a timeout may be (`Instant` arithmetic panics where it cannot represent).
    let every = every.min(LONGEST_TIMEOUT);
    // The runtime's clock, not the system's: the same in a running kcache, and it lets a
    // test with paused time place watches on the grid.
    let now = tokio::time::Instant::now().into_std();
    let first = (!every.is_zero()).then(|| first_tick(grid_epoch(now), now, every, phase));
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

/// The origin of every watch's keepalive grid: the first time a watch asked for it.
fn grid_epoch(now: Instant) -> Instant {
    static EPOCH: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    *EPOCH.get_or_init(|| now)
}

/// The first instant after `now` of the grid `epoch + (phase + k) × every`, k ≥ 0 (`phase`
/// is clamped to [0, 1); `every` is not zero).
fn first_tick(epoch: Instant, now: Instant, every: Duration, phase: f64) -> Instant {
    // `mul_f64` panics on NaN: any phase not a number counts as 0.
    let phase = if phase.is_finite() {
        phase.clamp(0.0, 1.0) % 1.0
    } else {
        0.0
    };
    let base = epoch + every.mul_f64(phase);
    if now < base {
        // Only a clock read a moment before the epoch's (another thread's), or a test's
        // paused clock behind the one that set it: the grid's first instant after `now`,
        // whole periods back from `base`, not `base` itself however far ahead it is.
        let back = (base - now).as_nanos() / every.as_nanos() * every.as_nanos();
        let back = Duration::from_nanos(u64::try_from(back).unwrap_or(0));
        return base.checked_sub(back).unwrap_or(base);
    }
    let periods = (now - base).as_nanos() / every.as_nanos() + 1;
    let ahead = u64::try_from(periods * every.as_nanos()).unwrap_or(u64::MAX);
    base.checked_add(Duration::from_nanos(ahead))
        .unwrap_or(now + every)
}

/// Whether a keepalive tick writes its newline: the watch wrote nothing for half a
/// period. Not "for a whole period": the previous tick's newline was written a little
/// after that tick's instant (the timer fires late, the actor runs later still), so at the
/// next tick, one period on, less than a period has passed since it — and an idle watch
/// then wrote every other tick: a cancelled one lingered up to twice
/// `watch_keepalive_secs` (64,916 watches of a client that had exited took 31 s to go,
/// with the 15 s default).
fn keepalive_due(since_last_write: Duration, every: Duration) -> bool {
    since_last_write >= every / 2
}

impl StreamHandler<Tick> for Watcher {
    fn handle(&mut self, tick: Tick, ctx: &mut Self::Context) {
        match tick {
            Tick::Keepalive => {
                // A full queue has bytes on their way already; a keepalive there would be
                // taken for a client that stopped reading.
                if keepalive_due(self.last_write.elapsed(), self.spec.keepalive.every)
                    && self.spec.body.room() > 0
                    && self.spec.encoder.keepalives()
                {
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

impl Handler<ToWatcher> for Watcher {
    type Result = ();

    fn handle(&mut self, msg: ToWatcher, ctx: &mut Self::Context) {
        match msg {
            ToWatcher::Start(start) => self.on_start(start, ctx),
            ToWatcher::Replay(replay) => {
                self.live |= replay.live;
                self.backlog
                    .extend(replay.events.into_iter().map(Item::Event));
                self.backlog_seq = self.backlog_seq.max(replay.upto_seq);
                self.drain(ctx);
            }
            ToWatcher::Expired { requested, oldest } => {
                // As 1.20: HTTP 200, then one in-stream ERROR with a 410 Expired Status,
                // which is the form clients (kube-rs, client-go's reflector) relist on.
                let message = format!("too old resource version: {requested} ({oldest})");
                let line = self.spec.encoder.error(410, "Expired", &message);
                self.finish_with(line, ctx);
            }
            ToWatcher::Failed {
                code,
                reason,
                message,
            } => {
                let line = self.spec.encoder.error(code, reason, &message);
                self.finish_with(line, ctx);
            }
            ToWatcher::Dispatch(ev) => self.on_dispatch(ev, ctx),
            ToWatcher::Bookmark { rv } => {
                // Dropped when the client's buffer is full, as the cacher's bookmarks
                // are: another comes, and a full buffer is no reason to close the watch.
                if self.live
                    && self.backlog.is_empty()
                    && self.spec.allow_bookmarks
                    && self.spec.body.room() > 0
                {
                    self.bookmark(rv, false, ctx);
                }
            }
            ToWatcher::Move(m) => {
                // The backlog holds events the old key sent: they go out first.
                if self.backlog.is_empty() {
                    self.move_to(m, ctx);
                } else {
                    self.moving = Some(Box::new(m));
                }
            }
            ToWatcher::Close(reason) => {
                if let CloseReason::Draining { rv } = reason {
                    // Only a watcher that sent everything up to `rv` may say so.
                    if self.live && self.backlog.is_empty() && self.spec.allow_bookmarks {
                        self.bookmark(rv, false, ctx);
                    }
                }
                self.closing = true;
                ctx.stop();
            }
        }
    }
}

impl Watcher {
    /// Subscribes to the key in `spec.cached`.
    fn subscribe(&mut self, plan: WatchPlan, moved: Option<MovedFrom>, ctx: &mut Context<Self>) {
        self.spec.cached.do_send(ToKey::Subscribe(Subscribe {
            id: self.id,
            link: ctx.address().recipient(),
            plan,
            allow_bookmarks: self.spec.allow_bookmarks,
            deadline: Some(self.spec.deadline),
            asked: self.spec.asked.clone(),
            moved,
        }));
    }

    /// Goes on from another key: the old one sent every event up to `after_rv` (all
    /// written by now) and nothing after, the new one replays what came after it. The
    /// reference moves with the watcher; the filter tests what the new key does not
    /// guarantee; event sequence numbers start over (they are per key), the RV floor
    /// keeps anything at or below `after_rv` from being sent again.
    fn move_to(&mut self, m: Move, ctx: &mut Context<Self>) {
        if self.closing {
            return;
        }
        if !m.link.connected() {
            // The key it was to join stopped meanwhile: end the watch (the client resumes
            // from its last RV) rather than wait for a start that never comes.
            self.closing = true;
            ctx.stop();
            return;
        }
        let asked = self
            .spec
            .asked
            .take()
            .map_or_else(|| self.spec.cached.key.clone(), |k| *k);
        self.spec.registry.do_send(Moved {
            from: self.spec.cached.key.clone(),
            to: m.link.key.clone(),
            asked: asked.clone(),
        });
        let field = std::mem::take(&mut self.spec.filter.field);
        self.spec.filter.field = cover::field_for(&asked, &m.link.key, field);
        self.spec.asked = (asked != m.link.key).then(|| Box::new(asked));
        self.spec.cached = m.link;
        self.cursor.moved(m.after_rv);
        self.live = false;
        self.started = false;
        self.backlog_seq = 0;
        let plan = WatchPlan {
            initial_events: false,
            initial_events_end_bookmark: false,
            from_rv: m.after_rv,
        };
        let moved = MovedFrom {
            object_rv: m.object_rv,
        };
        self.subscribe(plan, Some(moved), ctx);
    }

    fn on_start(&mut self, msg: Start, ctx: &mut Context<Self>) {
        self.started = true;
        let snapshot = (!msg.initial.is_empty() || msg.end_bookmark).then_some(msg.initial_rv);
        self.cursor.started(snapshot, msg.floor);
        self.backlog
            .extend(msg.initial.into_iter().map(Item::Object));
        if msg.end_bookmark {
            self.backlog.push_back(Item::EndBookmark(msg.initial_rv));
        }
        self.backlog.extend(msg.replay.into_iter().map(Item::Event));
        self.backlog_seq = msg.start_seq;
        self.drain(ctx);
    }

    fn on_dispatch(&mut self, ev: Arc<StoreEvent>, ctx: &mut Context<Self>) {
        if !self.started {
            return;
        }
        if self.backlog.is_empty() {
            // Only live deliveries are timed: a replayed event's age is the client's
            // resourceVersion, not kcache's latency.
            if self.deliver(&ev, ctx) && ev.seq.is_multiple_of(m::EVENT_DELIVERY_SAMPLE) {
                self.metrics
                    .delivery
                    .record(ev.made.elapsed().as_secs_f64());
            }
        } else if self.backlog.len() < self.spec.mailbox {
            // Live, and the replay that made it live is still being written: in order.
            self.backlog.push_back(Item::Event(ev));
        } else {
            self.too_slow(ctx);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    mod dispatch_budget {
        use super::*;
        use crate::config::CacheConfig;
        use crate::core::key::{ResourceType, Scope};
        use crate::core::object::Object;
        use crate::feed::{KeyStatus, SourceFactory, SourceHandle, SourceMsg, TakeSnapshot};
        use crate::watch_feed::{KeyAddr, Replay, Start};
        use futures::StreamExt;
        use tokio::sync::mpsc;

        /// The registry of these tests starts no key: a watcher only releases into it.
        struct NoSources;

        impl SourceFactory for NoSources {
            fn start(
                &self,
                _key: &Key,
                _status: &Arc<KeyStatus>,
                _snapshots: Recipient<TakeSnapshot>,
            ) -> (SourceHandle, mpsc::Receiver<SourceMsg>) {
                panic!("the watcher tests start no key")
            }
        }

        /// A key that starts every watch empty and makes it live at once: the watcher's
        /// side of the protocol is what these tests look at.
        #[derive(Default)]
        struct EmptyKey {
            link: Option<crate::watch_feed::WatcherLink>,
        }

        impl Actor for EmptyKey {
            type Context = Context<Self>;
        }

        impl Handler<ToKey> for EmptyKey {
            type Result = ();

            fn handle(&mut self, msg: ToKey, _ctx: &mut Context<Self>) {
                match msg {
                    ToKey::Subscribe(sub) => {
                        sub.link.do_send(ToWatcher::Start(Start {
                            initial: Vec::new(),
                            initial_rv: 1,
                            end_bookmark: false,
                            replay: Vec::new(),
                            floor: 1,
                            start_seq: 0,
                        }));
                        self.link = Some(sub.link);
                    }
                    ToKey::Ready(_) => {
                        if let Some(link) = &self.link {
                            link.do_send(ToWatcher::Replay(Replay {
                                events: Vec::new(),
                                upto_seq: 0,
                                live: true,
                            }));
                        }
                    }
                    ToKey::Unsubscribe { .. } => {}
                }
            }
        }

        fn event(seq: u64) -> ToWatcher {
            let rv = 1 + seq;
            let object = Object::from_value(
                crate::core::object::Schema::Generic,
                &json!({"metadata": {"name": "s", "namespace": "n", "resourceVersion": rv.to_string()}}),
            )
            .expect("a valid object");
            ToWatcher::Dispatch(Arc::new(StoreEvent::new(
                seq,
                rv,
                EventType::Modified,
                Arc::new(object),
                None,
            )))
        }

        /// A live watch with a client buffer of two lines over `budget`, and its body.
        async fn live_watch(budget: Duration) -> (Addr<Watcher>, body::Body) {
            let key = Key::new(
                Arc::new(ResourceType::new("", "v1", "secrets", "Secret", true)),
                Scope::Namespace("n".into()),
            );
            let registry = Registry::new(
                Arc::new(CacheConfig::default()),
                Arc::new(NoSources),
                "test".into(),
            )
            .start();
            let (tx, rx) = body::channel(2);
            let watcher = Watcher::new(WatcherSpec {
                asked: None,
                filter: Filter::everything(),
                plan: WatchPlan {
                    initial_events: false,
                    initial_events_end_bookmark: false,
                    from_rv: 1,
                },
                allow_bookmarks: false,
                deadline: deadline_after(Duration::from_secs(60)),
                encoder: Encoder::Json,
                body: tx,
                cached: Arc::new(KeyAddr {
                    key,
                    addr: EmptyKey::default().start().recipient(),
                }),
                registry: Arc::new(registry),
                mailbox: 100,
                budget: Arc::new(DispatchBudget::with_available(budget)),
                keepalive: Keepalive {
                    every: Duration::from_secs(3600),
                    phase: 0.0,
                },
                permit: None,
            })
            .start();
            // Start, Ready, the live Replay: a few mailbox round trips.
            tokio::time::sleep(Duration::from_millis(100)).await;
            (watcher, rx)
        }

        /// The RVs of the lines the body yields until it ends or stays quiet for 300 ms,
        /// and whether it ended (the watch closed).
        async fn read_rest(rx: &mut body::Body) -> (Vec<u64>, bool) {
            let mut rvs = Vec::new();
            loop {
                match tokio::time::timeout(Duration::from_millis(300), rx.next()).await {
                    Ok(Some(Ok(line))) => {
                        let v: serde_json::Value =
                            serde_json::from_slice(&line).expect("a JSON event line");
                        let rv = v["object"]["metadata"]["resourceVersion"]
                            .as_str()
                            .and_then(|s| s.parse().ok())
                            .expect("an RV");
                        rvs.push(rv);
                    }
                    Ok(_) => return (rvs, true),
                    Err(_) => return (rvs, false),
                }
            }
        }

        #[actix_rt::test]
        async fn a_client_a_moment_behind_keeps_its_watch_and_every_event() {
            let (watcher, mut rx) = live_watch(Duration::from_millis(100)).await;
            // Two fill the client's buffer; the third and fourth wait for room.
            for seq in 1..=4 {
                watcher.do_send(event(seq));
            }
            // The client reads at once, well within the 100 ms.
            let (rvs, ended) = read_rest(&mut rx).await;
            assert_eq!((rvs, ended), (vec![2, 3, 4, 5], false));
            assert!(watcher.connected(), "the watch is still open");
        }

        #[actix_rt::test]
        async fn a_client_that_does_not_read_within_the_budget_is_closed() {
            let (watcher, mut rx) = live_watch(Duration::from_millis(100)).await;
            for seq in 1..=3 {
                watcher.do_send(event(seq));
            }
            tokio::time::sleep(Duration::from_millis(400)).await;
            let (rvs, ended) = read_rest(&mut rx).await;
            assert_eq!((rvs, ended), (vec![2, 3], true));
        }

        #[actix_rt::test]
        async fn with_the_budget_spent_a_full_buffer_closes_the_watch_at_once() {
            let (watcher, mut rx) = live_watch(Duration::ZERO).await;
            for seq in 1..=3 {
                watcher.do_send(event(seq));
            }
            tokio::time::sleep(Duration::from_millis(30)).await;
            let (rvs, ended) = read_rest(&mut rx).await;
            assert_eq!((rvs, ended), (vec![2, 3], true));
        }
    }

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
        let keepalive = Keepalive {
            every: Duration::from_secs(10),
            phase: rand::random(),
        };
        let deadline = deadline_after(Duration::from_secs(35));
        let ticks: Vec<Tick> = ticks(tx.closed(), deadline, keepalive).collect().await;
        let (last, keepalives) = ticks.split_last().expect("ticks");
        assert_eq!(*last, Tick::Timeout, "{ticks:?}");
        // The first keepalive comes somewhere within the first period.
        assert!((3..=4).contains(&keepalives.len()), "{ticks:?}");
        assert!(
            keepalives.iter().all(|t| *t == Tick::Keepalive),
            "{ticks:?}"
        );
    }

    #[test]
    fn an_idle_watch_writes_a_keepalive_at_every_tick() {
        let every = Duration::from_secs(15);
        // The previous tick's newline went out 2 ms after that tick's instant (its timer
        // fired late): one period on, a little less than a period has passed.
        assert!(keepalive_due(every - Duration::from_millis(2), every));
        assert!(keepalive_due(every, every));
        assert!(keepalive_due(every * 3, every));
        // A watch written to within the last half period needs none.
        assert!(!keepalive_due(Duration::from_secs(1), every));
        assert!(!keepalive_due(every / 2 - Duration::from_millis(1), every));
    }

    #[tokio::test(start_paused = true)]
    async fn a_dropped_body_ends_the_ticks_at_once() {
        use futures::StreamExt;
        let (tx, body) = body::channel(4);
        let mut ticks = Box::pin(ticks(
            tx.closed(),
            deadline_after(Duration::from_secs(3600)),
            Keepalive {
                every: Duration::ZERO,
                phase: 0.0,
            },
        ));
        drop(body);
        let started = tokio::time::Instant::now();
        assert_eq!(ticks.next().await, Some(Tick::Gone));
        assert_eq!(ticks.next().await, None);
        assert!(started.elapsed() < Duration::from_secs(1));
    }

    #[test]
    fn the_first_tick_is_the_next_instant_of_the_grid() {
        let epoch = Instant::now();
        let every = Duration::from_secs(15);
        let s = Duration::from_secs;
        let ms = Duration::from_millis;
        // (now after the epoch, phase) -> first tick after the epoch
        let cases = [
            (s(0), 0.0, s(15)),
            (s(0), 0.5, ms(7_500)),
            (ms(7_499), 0.5, ms(7_500)),
            (ms(7_500), 0.5, ms(22_500)),
            (ms(7_501), 0.5, ms(22_500)),
            (s(100), 0.2, s(108)),
            (s(108), 0.2, s(123)),
            // Out of range phases are held to the period.
            (s(1), -3.0, s(15)),
            (s(1), 7.0, s(15)),
            (s(1), f64::NAN, s(15)),
            (s(1), f64::INFINITY, s(15)),
        ];
        for (now, phase, want) in cases {
            assert_eq!(
                first_tick(epoch, epoch + now, every, phase) - epoch,
                want,
                "now {now:?}, phase {phase}"
            );
        }
        // A clock behind the epoch: the grid's first instant after it, not the epoch.
        let later = epoch + s(100);
        assert_eq!(first_tick(later, epoch + s(1), every, 0.0) - epoch, s(10));
        assert_eq!(first_tick(later, epoch + s(10), every, 0.0) - epoch, s(10));
    }

    /// The instants of the keepalives a watch's ticks give until `deadline`.
    async fn keepalive_instants(keepalive: Keepalive, deadline: Instant) -> Vec<Instant> {
        use futures::StreamExt;
        let (tx, _body) = body::channel(4);
        ticks(tx.closed(), deadline, keepalive)
            .filter(|t| std::future::ready(*t == Tick::Keepalive))
            .map(|_| tokio::time::Instant::now().into_std())
            .collect()
            .await
    }

    #[tokio::test(start_paused = true)]
    async fn watches_of_one_connection_tick_in_the_same_instants() {
        let every = Duration::from_secs(10);
        let phase = rand::random::<f64>();
        let deadline = deadline_after(Duration::from_secs(60));
        let shared = Keepalive { every, phase };
        let first = tokio::spawn(keepalive_instants(shared, deadline));
        // Another watch of the same connection, opened 3.7 s later.
        tokio::time::sleep(Duration::from_millis(3_700)).await;
        let later = tokio::spawn(keepalive_instants(shared, deadline));
        // A watch of another connection.
        let other = Keepalive {
            every,
            phase: (phase + 0.5) % 1.0,
        };
        let elsewhere = tokio::spawn(keepalive_instants(other, deadline));
        let (first, later, elsewhere) = (
            first.await.expect("ticks"),
            later.await.expect("ticks"),
            elsewhere.await.expect("ticks"),
        );
        assert!(later.len() >= 5, "{later:?}");
        assert!(
            later.iter().all(|t| first.contains(t)),
            "{first:?} {later:?}"
        );
        assert!(first.windows(2).all(|w| w[1] - w[0] == every), "{first:?}");
        assert!(
            elsewhere.iter().all(|t| !first.contains(t)),
            "{elsewhere:?}"
        );
    }
}
