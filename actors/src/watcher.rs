//! One downstream watch, with the API server's cacheWatcher semantics: its own filter,
//! ADDED/MODIFIED/DELETED derived from old and new objects passing it, never an object
//! event at or below the RV it started from, bookmarks, a timeout, and a bounded buffer —
//! a client that stops reading live events is closed rather than allowed to slow its key.
//!
//! The watcher is its response body ([`Watcher`] is a `Stream` of lines): the HTTP/2
//! stream's task polls it when the client can take more, and each poll writes what is
//! next. Its key reaches it through its mailbox (`watch_feed::mailbox`), which is also
//! the client's buffer.
//!
//! Initial events and replays are a *backlog* written at the client's pace, however many
//! there are (cacheWatcher sends its initial events before reading its live channel, and
//! only the client's timeout bounds them). Meanwhile the watcher is not live: the key
//! sends it nothing. When the backlog is written, it tells the key the last sequence
//! number it covered ([`watch_feed::Ready`]); the key answers with the events since
//! ([`watch_feed::Replay`]) and makes it live once they fit in the client's buffer, or
//! ends the watch with a 410 when its window no longer holds them.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};

use actix::prelude::*;
use bytes::Bytes;
use serde_json::json;
use tokio::time::Sleep;

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
    self, CloseReason, KeyLink, Mailbox, Move, MovedFrom, Ready, Received, Start, Subscribe, ToKey,
    ToWatcher,
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
    /// Live events a client may be behind by (`CacheConfig::watcher_buffer`) before the
    /// next one waits for room within the dispatch budget.
    pub buffer: usize,
    /// Events that may wait for room past `buffer` before the watch is closed at once.
    pub mailbox: usize,
    /// The key the watcher is held on and fed by, and its address.
    pub cached: KeyLink,
    /// Holds the reference this watcher releases when it stops; shared by all watchers
    /// (an address clone is three allocations of its own).
    pub registry: Arc<Addr<Registry>>,
    /// The resource's dispatch budget: how long a live event may wait for room in the
    /// client's buffer before the watch is closed as too slow.
    pub budget: Arc<DispatchBudget>,
    /// When to write a bare newline if nothing was written (see
    /// `CacheConfig::watch_keepalive_secs`).
    pub keepalive: Keepalive,
    /// Held until the watch ends (the HTTP layer's admission permit).
    pub permit: Option<Box<dyn Send>>,
}

/// One line still to write of a backlog.
enum Item {
    /// An initial object, sent as ADDED if it passes the filter.
    Object(Arc<Object>),
    /// The `k8s.io/initial-events-end` bookmark at this RV.
    EndBookmark(u64),
    Event(Arc<StoreEvent>),
}

pin_project_lite::pin_project! {
    /// One downstream watch, and the body of its HTTP response: each poll writes the next
    /// line of its backlog, or takes the next message from its key, or wakes for a
    /// keepalive or the timeout.
    ///
    /// An actor without a task of its own: its state is its own, its key reaches it only
    /// through its mailbox, one message at a time — and the HTTP/2 stream's task that
    /// sends its body runs it, when the client can take more. A quiet watch is this
    /// struct, its mailbox and a timer entry (issue 31.1: an actix task, its mailbox,
    /// address, tick stream and a separate body queue were about twice that).
    pub struct Watcher {
        state: State,
        // The next keepalive instant or the deadline, whichever comes first: one entry
        // in the runtime's timer wheel.
        #[pin]
        timer: Sleep,
    }
}

/// What a watcher keeps between polls.
struct State {
    id: u64,
    filter: Filter,
    allow_bookmarks: bool,
    deadline: Instant,
    encoder: Encoder,
    /// The key it is fed by (also in its [`Held`], which ends with the watch).
    cached: KeyLink,
    /// The keepalive period (zero: none).
    every: Duration,
    mailbox: Mailbox,
    /// Initial events or a replay, written as the client reads, before the next message;
    /// boxed, as most of a watch's life it is empty (issue 31.1): 8 bytes then, not 32.
    #[allow(clippy::box_collection)]
    backlog: Option<Box<VecDeque<Item>>>,
    /// The key's sequence number the backlog brings the watcher up to.
    backlog_seq: u64,
    /// Once the backlog is written: tell the key how far it went (`drained`).
    drain_due: bool,
    /// The key sends this watcher its events and bookmarks.
    live: bool,
    /// The never-go-back rules: the RV floor, the last sequence handled (replay and live
    /// events may overlap), the highest RV sent (bookmarks never go back).
    cursor: Cursor,
    started: bool,
    /// The body ends at the next poll.
    closing: bool,
    /// The key and the registry were told (`stop`).
    stopped: bool,
    /// The runtime's clock (a test's paused one too).
    last_write: tokio::time::Instant,
    /// Metric handles, resolved once per resource and shared.
    metrics: Arc<Handles>,
}

/// What a watch holds until it ends, kept in its mailbox (`Mailbox::keep`) so that either
/// side ends it: the watcher when its body ends or is dropped, or the key when it closes or
/// refuses the watch — at once, even if the body is stuck in HTTP/2 flow control.
/// Dropping it unsubscribes from the key and releases the reference (and the permit).
struct Held {
    id: u64,
    cached: KeyLink,
    /// The key the request asked for, when a key covering it serves it (`core::cover`);
    /// boxed: most watches are on their own key, and a watch's size counts.
    asked: Option<Box<Key>>,
    registry: Arc<Addr<Registry>>,
    _permit: Option<Box<dyn Send>>,
}

impl Drop for Held {
    fn drop(&mut self) {
        self.cached.do_send(ToKey::Unsubscribe { id: self.id });
        self.registry.do_send(Release {
            key: self.cached.key.clone(),
            asked: self.asked.as_deref().unwrap_or(&self.cached.key).clone(),
        });
    }
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
    /// Subscribes to the key in `spec.cached`; the watch runs as its body is polled, and
    /// ends (unsubscribed, its reference released) when the body ends or is dropped. Must
    /// be called within the runtime (its timer).
    pub fn new(spec: WatcherSpec) -> Self {
        let (mailbox, _) = watch_feed::mailbox::mailbox(spec.buffer, spec.mailbox, spec.budget);
        let metrics = Handles::of(&spec.cached.key.resource);
        metrics.registered.increment(1.0);
        let every = spec.keepalive.every.min(LONGEST_TIMEOUT);
        // The runtime's clock, not the system's: the same in a running kcache, and it lets
        // a test with paused time place watches on the grid.
        let now = tokio::time::Instant::now();
        let first = match every.is_zero() {
            true => spec.deadline,
            false => {
                let now = now.into_std();
                first_tick(grid_epoch(now), now, every, spec.keepalive.phase).min(spec.deadline)
            }
        };
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        mailbox.keep(Box::new(Held {
            id,
            cached: spec.cached.clone(),
            asked: spec.asked,
            registry: spec.registry,
            _permit: spec.permit,
        }));
        let state = State {
            id,
            filter: spec.filter,
            allow_bookmarks: spec.allow_bookmarks,
            deadline: spec.deadline,
            encoder: spec.encoder,
            cached: spec.cached,
            every,
            mailbox,
            backlog: None,
            backlog_seq: 0,
            drain_due: false,
            live: false,
            cursor: Cursor::new(spec.plan.from_rv),
            started: false,
            closing: false,
            stopped: false,
            last_write: now,
            metrics,
        };
        state.subscribe(spec.plan, None);
        Watcher {
            state,
            timer: tokio::time::sleep_until(first.into()),
        }
    }
}

impl futures::Stream for Watcher {
    type Item = Result<Bytes, Infallible>;

    fn poll_next(
        self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> Poll<Option<Self::Item>> {
        let this = self.project();
        this.state
            .poll_line(this.timer, cx)
            .map(|line| line.map(Ok))
    }
}

impl State {
    /// The next line to write: the timer first (the timeout ends even a long backlog),
    /// then the backlog, then one message at a time; `Pending` when there is none of
    /// these, `None` once the watch ended.
    fn poll_line(
        &mut self,
        mut timer: Pin<&mut Sleep>,
        cx: &mut std::task::Context<'_>,
    ) -> Poll<Option<Bytes>> {
        loop {
            if self.closing {
                self.stop();
                return Poll::Ready(None);
            }
            if timer.as_mut().poll(cx).is_ready() {
                if let Some(line) = self.tick(timer.as_mut()) {
                    return Poll::Ready(Some(line));
                }
                continue;
            }
            if let Some(item) = self.backlog.as_mut().and_then(|b| b.pop_front()) {
                if let Some(line) = self.write(item) {
                    return Poll::Ready(Some(line));
                }
                continue;
            }
            if std::mem::take(&mut self.drain_due) {
                self.drained();
                continue;
            }
            match self.mailbox.poll_recv(cx) {
                Poll::Ready(Received::Msg(msg)) => {
                    if let Some(line) = self.handle(msg) {
                        return Poll::Ready(Some(line));
                    }
                }
                Poll::Ready(Received::Cut) => self.too_slow(),
                Poll::Pending => return Poll::Pending,
            }
        }
    }

    /// The timer fired: the timeout, or a keepalive instant (the newline when the watch
    /// wrote nothing for a while, and the timer set to the next instant).
    fn tick(&mut self, mut timer: Pin<&mut Sleep>) -> Option<Bytes> {
        let at = timer.deadline().into_std();
        if at >= self.deadline {
            self.closing = true;
            return None;
        }
        let now = tokio::time::Instant::now().into_std();
        let next = next_tick(at, now, self.every).min(self.deadline);
        timer.as_mut().reset(next.into());
        let due = keepalive_due(self.last_write.elapsed(), self.every);
        (due && self.encoder.keepalives()).then(|| self.emit(Bytes::from_static(b"\n")))
    }

    fn backlog(&mut self) -> &mut VecDeque<Item> {
        self.backlog.get_or_insert_with(Default::default)
    }

    /// A line leaves for the client.
    fn emit(&mut self, line: Bytes) -> Bytes {
        self.last_write = tokio::time::Instant::now();
        if line.len() != 1 {
            self.metrics.dispatched.increment(1);
        }
        line
    }

    fn handle(&mut self, msg: ToWatcher) -> Option<Bytes> {
        match msg {
            ToWatcher::Start(start) => {
                self.on_start(start);
                None
            }
            ToWatcher::Replay(replay) => {
                self.live |= replay.live;
                self.backlog()
                    .extend(replay.events.into_iter().map(Item::Event));
                self.backlog_seq = self.backlog_seq.max(replay.upto_seq);
                self.drain_due = true;
                None
            }
            ToWatcher::Expired { requested, oldest } => {
                // As 1.20: HTTP 200, then one in-stream ERROR with a 410 Expired Status,
                // which is the form clients (kube-rs, client-go's reflector) relist on.
                let message = format!("too old resource version: {requested} ({oldest})");
                let line = self.encoder.error(410, "Expired", &message);
                self.finish_with(line)
            }
            ToWatcher::Failed {
                code,
                reason,
                message,
            } => {
                let line = self.encoder.error(code, reason, &message);
                self.finish_with(line)
            }
            ToWatcher::Dispatch(ev) => self.on_dispatch(ev),
            ToWatcher::Bookmark { rv } => {
                // Queued only when the client's buffer had room (`offer_bookmark`).
                if self.live && self.allow_bookmarks {
                    self.bookmark(rv, false)
                } else {
                    None
                }
            }
            ToWatcher::Move(m) => {
                // Taken after the backlog the old key sent was written.
                self.move_to(m);
                None
            }
            ToWatcher::Close(reason) => {
                self.closing = true;
                match reason {
                    // Only a watcher that sent everything up to `rv` may say so.
                    CloseReason::Draining { rv } if self.live && self.allow_bookmarks => {
                        self.bookmark(rv, false)
                    }
                    _ => None,
                }
            }
        }
    }

    /// One line of the backlog (`None`: nothing to write for this item).
    fn write(&mut self, item: Item) -> Option<Bytes> {
        match item {
            Item::Object(obj) if self.filter.matches(&obj) => {
                match self.encoder.encode(EventType::Added, &obj) {
                    Some(line) => Some(self.emit(line)),
                    None => self.unencodable(),
                }
            }
            Item::Object(_) => None,
            Item::EndBookmark(rv) => self.bookmark(rv, true),
            Item::Event(ev) => self.deliver(&ev),
        }
    }

    /// The backlog is written: the key learns how far it went (unless already live), or
    /// an empty start or replay made it live at once.
    fn drained(&mut self) {
        // Free what a 20,000-object start left behind.
        self.backlog = None;
        self.cursor.covered(self.backlog_seq);
        if !self.live && !self.closing {
            self.cached.do_send(ToKey::Ready(Ready {
                id: self.id,
                after_seq: self.cursor.last_seq,
                rv: self.cursor.rv(),
                room: self.mailbox.room(),
            }));
        }
    }

    /// The line of an event if this watcher wants it.
    fn deliver(&mut self, ev: &StoreEvent) -> Option<Bytes> {
        // Events from before the key's list (`BACKFILLED_SEQ`) come only in a start's
        // replay, once, ahead of every numbered event: the RV floor alone orders them.
        if !self.cursor.admit(ev.seq, ev.rv, BACKFILLED_SEQ) {
            return None;
        }
        let line = match convert(&self.filter, ev.kind, &ev.object, ev.prev.as_deref()) {
            None => return None,
            Some(Conversion::Send {
                same_as_source: true,
                ..
            }) => self.encoder.shared(ev),
            Some(Conversion::Send { kind, .. }) => self.encoder.encode(kind, &ev.object),
            Some(Conversion::DeletedPrev) => {
                let prev = ev.prev.as_ref()?;
                self.encoder
                    .encode(EventType::Deleted, &prev.with_rv(ev.rv))
            }
        };
        let Some(line) = line else {
            return self.unencodable();
        };
        self.cursor.sent(ev.rv);
        Some(self.emit(line))
    }

    /// A client that did not catch up within its wait (`mailbox`): closed, as
    /// cacheWatcher's are.
    fn too_slow(&mut self) {
        let r = &self.cached.key.resource;
        metrics::counter!(m::TERMINATED_WATCHERS, "group" => r.group.clone(), "resource" => r.resource.clone())
            .increment(1);
        tracing::warn!(key = %self.cached.key, watcher = self.id, "closing unresponsive watcher: client is not reading");
        self.closing = true;
    }

    /// An object this watch's encoding cannot express (protobuf, and a field the schema
    /// lacks): the watch ends with an error rather than send the object without it. The
    /// resource is then served as JSON (`Codec::refuse`), so the client's next list and
    /// watch get every field.
    fn unencodable(&mut self) -> Option<Bytes> {
        metrics::counter!(m::PROTOBUF_UNENCODABLE, "group" => self.cached.key.resource.group.clone(), "resource" => self.cached.key.resource.resource.clone())
            .increment(1);
        let line = self.encoder.error(
            500,
            "InternalError",
            "kcache cannot encode an object of this resource as protobuf; list again",
        );
        self.finish_with(line)
    }

    /// Ends the watch with one in-stream error line (or none, when the encoding cannot
    /// say it).
    fn finish_with(&mut self, line: Option<Bytes>) -> Option<Bytes> {
        self.backlog = None;
        self.closing = true;
        line.map(|line| self.emit(line))
    }

    fn bookmark(&mut self, rv: u64, initial_events_end: bool) -> Option<Bytes> {
        // Never below what the client already has; equal is allowed (as the seed does).
        let rv = self.cursor.bookmark_rv(rv);
        let line = self
            .encoder
            .bookmark(&self.cached.key.resource, rv, initial_events_end)?;
        self.cursor.sent(rv);
        Some(self.emit(line))
    }

    /// Subscribes to the key in `cached` (unless the watch already ended).
    fn subscribe(&self, plan: WatchPlan, moved: Option<MovedFrom>) {
        let Some(asked) = self.held(|h| h.asked.clone()) else {
            return;
        };
        self.cached.do_send(ToKey::Subscribe(Subscribe {
            id: self.id,
            link: self.mailbox.link(),
            plan,
            allow_bookmarks: self.allow_bookmarks,
            deadline: Some(self.deadline),
            asked,
            moved,
        }));
    }

    /// `f` of what the watch holds, while it holds it.
    fn held<R>(&self, f: impl FnOnce(&mut Held) -> R) -> Option<R> {
        self.mailbox
            .kept(|kept| kept.downcast_mut::<Held>().map(f))
            .flatten()
    }

    /// Goes on from another key: the old one sent every event up to `after_rv` (all
    /// written by now) and nothing after, the new one replays what came after it. The
    /// reference moves with the watcher; the filter tests what the new key does not
    /// guarantee; event sequence numbers start over (they are per key), the RV floor
    /// keeps anything at or below `after_rv` from being sent again.
    fn move_to(&mut self, m: Move) {
        if self.closing {
            return;
        }
        if !m.link.connected() {
            // The key it was to join stopped meanwhile: end the watch (the client resumes
            // from its last RV) rather than wait for a start that never comes.
            self.closing = true;
            return;
        }
        // The reference moves with the watcher: what it holds follows it to the new key.
        let moved = self.held(|held| {
            let asked = held
                .asked
                .take()
                .map_or_else(|| held.cached.key.clone(), |k| *k);
            held.registry.do_send(Moved {
                from: held.cached.key.clone(),
                to: m.link.key.clone(),
                asked: asked.clone(),
            });
            held.asked = (asked != m.link.key).then(|| Box::new(asked.clone()));
            held.cached = m.link.clone();
            asked
        });
        let Some(asked) = moved else {
            // The old key ended the watch meanwhile.
            self.closing = true;
            return;
        };
        let field = std::mem::take(&mut self.filter.field);
        self.filter.field = cover::field_for(&asked, &m.link.key, field);
        self.cached = m.link;
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
        self.subscribe(plan, Some(moved));
    }

    fn on_start(&mut self, msg: Start) {
        self.started = true;
        let snapshot = (!msg.initial.is_empty() || msg.end_bookmark).then_some(msg.initial_rv);
        self.cursor.started(snapshot, msg.floor);
        let backlog = self.backlog();
        backlog.extend(msg.initial.into_iter().map(Item::Object));
        if msg.end_bookmark {
            backlog.push_back(Item::EndBookmark(msg.initial_rv));
        }
        backlog.extend(msg.replay.into_iter().map(Item::Event));
        self.backlog_seq = msg.start_seq;
        self.drain_due = true;
    }

    fn on_dispatch(&mut self, ev: Arc<StoreEvent>) -> Option<Bytes> {
        if !self.started {
            return None;
        }
        let line = self.deliver(&ev)?;
        // Only live deliveries are timed: a replayed event's age is the client's
        // resourceVersion, not kcache's latency.
        if !self.closing && ev.seq.is_multiple_of(m::EVENT_DELIVERY_SAMPLE) {
            self.metrics
                .delivery
                .record(ev.made.elapsed().as_secs_f64());
        }
        Some(line)
    }

    /// The watch ended (its body ends) or its body was dropped (the client went away):
    /// what waited and what it held are let go of at once (`Held`: the key and the
    /// registry are told, unless the key ended the watch first and they were told then).
    fn stop(&mut self) {
        if std::mem::replace(&mut self.stopped, true) {
            return;
        }
        self.closing = true;
        self.mailbox.close();
        self.backlog = None;
        self.metrics.registered.decrement(1.0);
    }
}

impl Drop for State {
    fn drop(&mut self) {
        self.stop();
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

/// Longest timeout a watcher keeps; ten years is "never" for a watch.
const LONGEST_TIMEOUT: Duration = Duration::from_secs(10 * 365 * 24 * 3600);

/// `now + timeout`, capped: a client may send any `timeoutSeconds` up to `u64::MAX`, which
/// `Instant` cannot represent (adding it panics).
pub fn deadline_after(timeout: Duration) -> Instant {
    Instant::now() + timeout.min(LONGEST_TIMEOUT)
}

/// The keepalive instant after the one at `at`: a period on, or, when the watcher was not
/// polled for longer than that (its body stuck in flow control), the first instant of the
/// grid after `now` — not one reset per missed period.
fn next_tick(at: Instant, now: Instant, every: Duration) -> Instant {
    let next = at + every;
    if next > now {
        return next;
    }
    let missed = (now - at).as_nanos() / every.as_nanos();
    u32::try_from(missed + 1)
        .ok()
        .and_then(|n| every.checked_mul(n))
        .and_then(|ahead| at.checked_add(ahead))
        .unwrap_or(now + every)
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::CacheConfig;
    use crate::core::key::Scope;
    use crate::feed::{KeyStatus, SourceFactory, SourceHandle, SourceMsg, TakeSnapshot};
    use crate::watch_feed::{KeyAddr, Refused, Replay, WatcherLink};
    use futures::StreamExt;
    use std::sync::Mutex;
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

    /// What a test's key saw of its watcher: its link, and whether it unsubscribed.
    #[derive(Default)]
    struct Seen {
        link: Option<WatcherLink>,
        unsubscribed: bool,
    }

    /// A key that starts every watch empty and makes it live at once: the watcher's
    /// side of the protocol is what these tests look at.
    struct EmptyKey(Arc<Mutex<Seen>>);

    impl Actor for EmptyKey {
        type Context = Context<Self>;
    }

    impl Handler<ToKey> for EmptyKey {
        type Result = ();

        fn handle(&mut self, msg: ToKey, _ctx: &mut Context<Self>) {
            let mut seen = self.0.lock().expect("seen");
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
                    seen.link = Some(sub.link);
                }
                ToKey::Ready(_) => {
                    if let Some(link) = &seen.link {
                        link.do_send(ToWatcher::Replay(Replay {
                            events: Vec::new(),
                            upto_seq: 0,
                            live: true,
                        }));
                    }
                }
                ToKey::Unsubscribe { .. } => seen.unsubscribed = true,
            }
        }
    }

    fn event(seq: u64) -> Arc<StoreEvent> {
        let rv = 1 + seq;
        let object = Object::from_value(
            crate::core::object::Schema::Generic,
            &json!({"metadata": {"name": "s", "namespace": "n", "resourceVersion": rv.to_string()}}),
        )
        .expect("a valid object");
        Arc::new(StoreEvent::new(
            seq,
            rv,
            EventType::Modified,
            Arc::new(object),
            None,
        ))
    }

    /// What `CachedObject` does with a live event: offered, and a watcher that refuses it
    /// as full is closed as too slow.
    fn key_sends(link: &WatcherLink, seq: u64) {
        if link.offer(event(seq)) == Err(Refused::Full) {
            link.do_send(ToWatcher::Close(CloseReason::TooSlow));
        }
    }

    /// A watch with a client buffer of two events over `budget` and keepalives every
    /// `every` at `phase`, its body, and what its key saw.
    fn watch(
        budget: Arc<DispatchBudget>,
        keepalive: Keepalive,
        timeout: Duration,
    ) -> (Pin<Box<Watcher>>, Arc<Mutex<Seen>>) {
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
        let seen = Arc::new(Mutex::new(Seen::default()));
        let watcher = Box::pin(Watcher::new(WatcherSpec {
            asked: None,
            filter: Filter::everything(),
            plan: WatchPlan {
                initial_events: false,
                initial_events_end_bookmark: false,
                from_rv: 1,
            },
            allow_bookmarks: false,
            deadline: deadline_after(timeout),
            encoder: Encoder::Json,
            buffer: 2,
            mailbox: 100,
            cached: Arc::new(KeyAddr {
                key,
                addr: EmptyKey(seen.clone()).start().recipient(),
            }),
            registry: Arc::new(registry),
            budget,
            keepalive,
            permit: None,
        }));
        (watcher, seen)
    }

    fn budget(available: Duration) -> Arc<DispatchBudget> {
        Arc::new(DispatchBudget::with_available(available))
    }

    const HOURLY: Keepalive = Keepalive {
        every: Duration::from_secs(3600),
        phase: 0.0,
    };

    /// A live watch (as [`watch`]), and its key's link to it.
    async fn live_watch(budget: Arc<DispatchBudget>) -> (Pin<Box<Watcher>>, WatcherLink) {
        let (mut body, seen) = watch(budget, HOURLY, Duration::from_secs(60));
        // Start, Ready, the live Replay: the body runs the watcher as it is polled.
        let (lines, ended) = read_rest(&mut body).await;
        assert_eq!((lines, ended), (vec![], false));
        let link = seen.lock().expect("seen").link.clone().expect("subscribed");
        (body, link)
    }

    /// The RVs of the lines the body yields until it ends or stays quiet for 300 ms,
    /// and whether it ended (the watch closed).
    async fn read_rest(body: &mut Pin<Box<Watcher>>) -> (Vec<u64>, bool) {
        let mut rvs = Vec::new();
        loop {
            match tokio::time::timeout(Duration::from_millis(300), body.next()).await {
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
        let (mut body, link) = live_watch(budget(Duration::from_millis(100))).await;
        // Two fill the client's buffer; the third and fourth wait for room.
        for seq in 1..=4 {
            key_sends(&link, seq);
        }
        // The client reads at once, well within the 100 ms.
        let (rvs, ended) = read_rest(&mut body).await;
        assert_eq!((rvs, ended), (vec![2, 3, 4, 5], false));
    }

    #[actix_rt::test]
    async fn a_client_that_does_not_read_within_the_budget_is_closed() {
        let (mut body, link) = live_watch(budget(Duration::from_millis(100))).await;
        for seq in 1..=3 {
            key_sends(&link, seq);
        }
        tokio::time::sleep(Duration::from_millis(400)).await;
        let (rvs, ended) = read_rest(&mut body).await;
        assert_eq!((rvs, ended), (vec![2, 3], true));
    }

    #[actix_rt::test]
    async fn with_the_budget_spent_a_full_buffer_closes_the_watch_at_once() {
        let spent = budget(Duration::ZERO);
        let (mut body, link) = live_watch(spent.clone()).await;
        // What refilled meanwhile, taken: the third event finds nothing to wait with.
        spent.take();
        for seq in 1..=3 {
            key_sends(&link, seq);
        }
        let (rvs, ended) = read_rest(&mut body).await;
        assert_eq!((rvs, ended), (vec![2, 3], true));
        assert_eq!(link.offer(event(4)), Err(Refused::Gone));
    }

    #[actix_rt::test]
    async fn a_dropped_body_unsubscribes_and_frees_what_waited() {
        let (body, link) = live_watch(budget(Duration::from_secs(1))).await;
        let ev = event(1);
        link.offer(ev.clone()).expect("queued");
        assert_eq!(Arc::strong_count(&ev), 2);
        // The client went away: the HTTP/2 stream drops its body.
        drop(body);
        assert_eq!(Arc::strong_count(&ev), 1, "the waiting event was freed");
        assert_eq!(link.offer(event(2)), Err(Refused::Gone));
    }

    #[actix_rt::test]
    async fn a_key_that_closes_a_watch_whose_body_is_not_read_releases_it_at_once() {
        let (mut body, seen) = watch(budget(Duration::ZERO), HOURLY, Duration::from_secs(60));
        assert_eq!(read_rest(&mut body).await, (vec![], false));
        let link = seen.lock().expect("seen").link.clone().expect("subscribed");
        // The client stops reading (its body is not polled); the key closes the watch.
        link.do_send(ToWatcher::Close(CloseReason::KeyStopped));
        for _ in 0..50 {
            if seen.lock().expect("seen").unsubscribed {
                // Told while the body is still there, unread.
                assert!(!body.state.stopped);
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("the watch was not let go of");
    }

    #[actix_rt::test]
    async fn the_key_hears_of_a_dropped_body() {
        let (body, seen) = watch(budget(Duration::ZERO), HOURLY, Duration::from_secs(60));
        drop(body);
        for _ in 0..50 {
            if seen.lock().expect("seen").unsubscribed {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("the key was not told");
    }

    /// The instants (on the paused clock) of a watch's keepalive lines, until its body
    /// ends; and whether anything else was written.
    async fn keepalive_instants(body: Pin<Box<Watcher>>) -> Vec<tokio::time::Instant> {
        body.map(|line| {
            assert_eq!(line.expect("a line"), Bytes::from_static(b"\n"));
            tokio::time::Instant::now()
        })
        .collect()
        .await
    }

    #[actix_rt::test]
    async fn keepalives_every_period_then_the_timeout_ends_the_body() {
        tokio::time::pause();
        let keepalive = Keepalive {
            every: Duration::from_secs(10),
            phase: rand::random(),
        };
        let (body, _seen) = watch(budget(Duration::ZERO), keepalive, Duration::from_secs(35));
        let start = tokio::time::Instant::now();
        let instants = keepalive_instants(body).await;
        // The first keepalive comes at the first instant of the grid at least half a
        // period after the watch began, then one a period.
        assert!((3..=4).contains(&instants.len()), "{instants:?}");
        let first = instants[0] - start;
        assert!(first >= Duration::from_secs(5) && first <= Duration::from_secs(15));
        assert!(instants
            .windows(2)
            .all(|w| w[1] - w[0] == Duration::from_secs(10)));
        // And the body ends at the timeout.
        let ended = tokio::time::Instant::now() - start;
        assert!(ended >= Duration::from_secs(35) && ended < Duration::from_secs(36));
    }

    #[actix_rt::test]
    async fn a_watch_written_to_writes_no_keepalive() {
        tokio::time::pause();
        let keepalive = Keepalive {
            every: Duration::from_secs(10),
            phase: 0.5,
        };
        let (mut body, seen) = watch(budget(Duration::ZERO), keepalive, Duration::from_secs(3600));
        // Start and the live Replay.
        let first = tokio::time::timeout(Duration::from_millis(100), body.next()).await;
        assert!(first.is_err(), "nothing to write yet");
        let link = seen.lock().expect("seen").link.clone().expect("subscribed");
        // An event every 2 s for 30 s: every keepalive instant finds a recent write.
        let mut lines = Vec::new();
        for seq in 1..=15 {
            link.offer(event(seq)).expect("room");
            let line = body.next().await.expect("a line").expect("bytes");
            lines.push(line);
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
        assert!(
            lines.iter().all(|l| l.len() > 1),
            "no keepalive among events"
        );
    }

    #[actix_rt::test]
    async fn watches_of_one_connection_tick_in_the_same_instants() {
        tokio::time::pause();
        let every = Duration::from_secs(10);
        let phase = rand::random::<f64>();
        let timeout = Duration::from_secs(60);
        let shared = Keepalive { every, phase };
        let first = actix_rt::spawn(keepalive_instants(
            watch(budget(Duration::ZERO), shared, timeout).0,
        ));
        // Another watch of the same connection, opened 3.7 s later.
        tokio::time::sleep(Duration::from_millis(3_700)).await;
        let later = actix_rt::spawn(keepalive_instants(
            watch(budget(Duration::ZERO), shared, timeout).0,
        ));
        // A watch of another connection.
        let other = Keepalive {
            every,
            phase: (phase + 0.5) % 1.0,
        };
        let elsewhere = actix_rt::spawn(keepalive_instants(
            watch(budget(Duration::ZERO), other, timeout).0,
        ));
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

    #[test]
    fn any_client_timeout_gives_a_deadline() {
        let now = Instant::now();
        let far = deadline_after(Duration::from_secs(u64::MAX));
        assert!(far >= now + LONGEST_TIMEOUT);
        let near = deadline_after(Duration::from_secs(5));
        assert!(near >= now + Duration::from_secs(5) && near < far);
    }

    #[test]
    fn a_late_tick_goes_on_to_the_next_instant_of_the_grid() {
        let at = Instant::now();
        let every = Duration::from_secs(15);
        let s = Duration::from_secs;
        // (now after `at`) -> the next tick after `at`
        let cases = [
            (s(0), s(15)),
            (s(14), s(15)),
            (s(15), s(30)),
            (s(16), s(30)),
            (s(86_400), s(86_415)),
        ];
        for (now, want) in cases {
            assert_eq!(next_tick(at, at + now, every) - at, want, "now {now:?}");
        }
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
}
