//! One key's cache: the store, the event window and its progress RV, fed by a source,
//! serving reads and feeding watchers.
//!
//! The actor only holds state and passes messages: whether a list initialises or relists,
//! which events apply, which reads and watches are served, wait or fail, and when to probe
//! is decided by `core::key_machine`; what to emit for a list or an event by `core`
//! (`relist::diff`, `window`, `rv`, `bookmark`). It is the only writer of its store, as
//! kube-rs's reflector `Writer`.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use thiserror::Error;
use tokio::sync::oneshot;
use tokio_stream::wrappers::ReceiverStream;

use crate::config::CacheConfig;
use crate::core::backfill::{self, Replay};
use crate::core::coalesce;
use crate::core::event::{StoreEvent, BACKFILLED_SEQ};
use crate::core::history::{self, Past};
use crate::core::key::Key;
use crate::core::key_machine::{self, Continue, Effect, Failure, Input, KeyMachine, WatchStart};
use crate::core::object::EventType;
use crate::core::object::Object;
use crate::core::relist;
use crate::core::store::Store;
use crate::core::watchers::{Entry, Watchers};
use crate::core::window::{self, Window};
use crate::feed::{
    KeyStatus, OwnerSnapshot, ReplayCmd, Role, SourceCmd, SourceFactory, SourceHandle, SourceMsg,
    TakeSnapshot, UpstreamFeed,
};
use crate::listener::{Listener, Publish};
use crate::metrics as m;
use crate::watch_feed::{
    self, CloseReason, KeyLink, Ready, Subscribe, ToKey, ToWatcher, WatcherLink,
};

#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum Error {
    /// The key did not complete its first list in time (upstream down or slow).
    #[error("the cache for {key} is not synced yet")]
    NotSynced { key: String },
    /// As 1.20's `waitUntilFreshAndBlock`: the key did not reach the RV within the block
    /// timeout (HTTP 504, retry after 1 s).
    #[error("Too large resource version: {requested}, current: {current}")]
    TooLargeResourceVersion { requested: u64, current: u64 },
    /// The key is stopping; the caller should retry (it gets a new CachedObject).
    #[error("the cache for {key} is shutting down")]
    Stopping { key: String },
    /// A read of the state at a resourceVersion whose changes since left the window
    /// (`core::history`).
    #[error("too old resource version: {requested} ({oldest})")]
    TooOld { requested: u64, oldest: u64 },
}

impl Error {
    /// The Status a watch that could not start ends with.
    pub fn status(&self) -> (u16, &'static str) {
        match self {
            Error::TooLargeResourceVersion { .. } => (504, "Timeout"),
            Error::NotSynced { .. } | Error::Stopping { .. } => (503, "ServiceUnavailable"),
            Error::TooOld { .. } => (410, "Expired"),
        }
    }

    fn to_watcher(&self) -> ToWatcher {
        let (code, reason) = self.status();
        ToWatcher::Failed {
            code,
            reason,
            message: self.to_string(),
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A consistent view of a key for a list or get.
#[derive(Debug, Clone)]
pub struct Snapshot {
    pub objects: Vec<Arc<Object>>,
    /// The key's progress RV when the snapshot was taken (the list's resourceVersion).
    pub rv: u64,
}

/// Read the key once it is synced and at least `min_rv` fresh: its current state, or —
/// `at` — its state at exactly that resourceVersion (`min_rv` is then `at`).
pub struct Read {
    pub min_rv: u64,
    pub at: Option<u64>,
}

impl Message for Read {
    type Result = Result<Snapshot>;
}

/// What [`Read`] would answer if the key is synced and fresh enough now, else `None` at
/// once (a reader that would wait gives its seat back first, then sends [`Read`]).
pub struct TryRead {
    pub min_rv: u64,
    pub at: Option<u64>,
}

impl Message for TryRead {
    type Result = Option<Result<Snapshot>>;
}

/// The key's progress RV and how many objects it holds, once synced (`None` before): what
/// a freshness proof starts from, without copying the key's state.
pub struct Progress;

impl Message for Progress {
    type Result = Option<(u64, usize)>;
}

/// Move live watchers to `to` (coalescing onto a covering key, or splitting back to their
/// own): those that asked for `only_asked` when given, else all. Each gets every event up
/// to this key's progress from here and the rest from `to`, once `to` is synced
/// (`core::coalesce::handover_rv`). Answers how many moved and how many are left (not
/// live yet, or `to` not far enough along): the registry asks again.
#[derive(Message)]
#[rtype(result = "HandedOver")]
pub struct HandOver {
    pub to: Key,
    pub link: KeyLink,
    pub to_status: Arc<KeyStatus>,
    pub only_asked: Option<Key>,
}

#[derive(Debug, Clone, Copy, Default, MessageResponse)]
pub struct HandedOver {
    pub moved: usize,
    pub left: usize,
}

/// Stop the key (sent by the registry after the grace period): watchers are closed.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Stop;

/// Close every watcher gracefully (shutdown drain): a last bookmark where allowed.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Drain;

/// A read or watch waiting for the key to be fresh enough (`KeyMachine` decides when).
enum Waiter {
    Read(oneshot::Sender<Result<Snapshot>>, Option<u64>),
    Watch(Subscribe),
}

pub struct CachedObject {
    key: Key,
    cfg: Arc<CacheConfig>,
    sources: Arc<dyn SourceFactory>,
    source: Option<SourceHandle>,
    status: Arc<KeyStatus>,
    store: Store,
    window: Window,
    /// Synced, progress RV, waits and probes.
    machine: KeyMachine,
    seq: u64,
    /// Who watches, who is live, whom an event concerns, whose bookmark is due
    /// (`core::watchers`); the links to send to are in its entries.
    watchers: Watchers<WatcherLink>,
    /// The clients behind the machine's waits, by wait id.
    waiting: HashMap<u64, Waiter>,
    next_wait: u64,
    /// Watches from an RV older than this young key's window, waiting for a list at that
    /// RV to show whether the window may start there (`backfill`).
    backfill: Vec<(Subscribe, Instant)>,
    /// The RV of the `SourceCmd::Replay` in flight, and when it was asked for.
    backfill_at: Option<(u64, Instant)>,
    epoch: Instant,
    labels: [(&'static str, String); 2],
    /// Set while this replica owns the key in the fleet: every event goes out through it.
    listener: Option<Addr<Listener>>,
    /// Set while this replica reads the key upstream as its fleet owner (or locally): the
    /// commands go straight to that read instead of through the fleet source.
    upstream_commands: Option<tokio::sync::mpsc::Sender<SourceCmd>>,
    heartbeat_ms: u64,
    last_heartbeat_ms: u64,
}

impl CachedObject {
    pub fn new(
        key: Key,
        cfg: Arc<CacheConfig>,
        sources: Arc<dyn SourceFactory>,
        status: Arc<KeyStatus>,
    ) -> Self {
        let window = Window::new(cfg.window_capacity);
        let machine = KeyMachine::new(key_machine::Timing {
            block_ms: cfg.block_timeout().as_millis() as u64,
            sync_ms: cfg.sync_timeout().as_millis() as u64,
            probe_interval_ms: cfg.probe_interval().as_millis() as u64,
        });
        let bookmark_every_ms = cfg.bookmark_frequency().as_millis() as u64;
        let labels = [
            ("group", key.resource.group.clone()),
            ("resource", key.resource.resource.clone()),
        ];
        CachedObject {
            key,
            cfg,
            sources,
            source: None,
            status,
            store: Store::new(),
            window,
            machine,
            seq: 0,
            watchers: Watchers::new(bookmark_every_ms),
            waiting: HashMap::new(),
            next_wait: 0,
            backfill: Vec::new(),
            backfill_at: None,
            epoch: Instant::now(),
            labels,
            listener: None,
            upstream_commands: None,
            heartbeat_ms: 1_000,
            last_heartbeat_ms: 0,
        }
    }

    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    fn progress(&self) -> u64 {
        self.machine.progress()
    }

    /// Feeds the key machine and carries out what it decides; the effects about a list or
    /// an event are the caller's (`on_listed`, `on_event`), passed in as `apply`.
    fn step(&mut self, input: Input, mut apply: impl FnMut(&mut Self, Effect)) {
        let effects = self.machine.apply(self.now_ms(), input);
        self.status
            .progress
            .store(self.machine.progress(), Ordering::Relaxed);
        for effect in effects {
            match effect {
                Effect::Progressed { .. } => {
                    // Mirrors learn of progress without events from a heartbeat: send it now.
                    self.last_heartbeat_ms = 0;
                }
                Effect::Serve { id, waited_ms } => {
                    metrics::histogram!(m::READ_WAIT, &self.labels)
                        .record(waited_ms as f64 / 1000.0);
                    match self.waiting.remove(&id) {
                        Some(Waiter::Read(tx, at)) => {
                            let _ = tx.send(self.snapshot_at(at));
                        }
                        Some(Waiter::Watch(sub)) => self.activate(sub),
                        None => {}
                    }
                }
                Effect::Fail { id, failure } => {
                    let error = match failure {
                        Failure::NotSynced => Error::NotSynced {
                            key: self.key.to_string(),
                        },
                        Failure::TooLargeResourceVersion { requested, current } => {
                            Error::TooLargeResourceVersion { requested, current }
                        }
                    };
                    match self.waiting.remove(&id) {
                        Some(Waiter::Read(tx, _)) => {
                            let _ = tx.send(Err(error));
                        }
                        Some(Waiter::Watch(sub)) => sub.link.do_send(error.to_watcher()),
                        None => {}
                    }
                }
                Effect::Probe => self.probe(),
                Effect::Init { .. } | Effect::Relist { .. } | Effect::Ignore | Effect::Apply => {
                    apply(self, effect)
                }
            }
        }
    }

    fn on_listed(&mut self, items: Vec<Object>, rv: u64, gap: bool) {
        let before_objects = self.store.len();
        let before_window = self.window.len();
        let large = items.len() >= LARGE_LIST;
        let mut items = Some(items);
        self.step(Input::Listed { rv }, |this, effect| match effect {
            Effect::Init { rv } => {
                for item in items.take().into_iter().flatten() {
                    this.store.upsert(Arc::new(item));
                }
                this.window.reset(rv);
                this.status.synced.store(true, Ordering::Relaxed);
                metrics::gauge!(m::SYNCED_KEYS).increment(1.0);
                tracing::debug!(key = %this.key, rv, objects = this.store.len(), "key synced");
            }
            Effect::Relist { rv } => {
                let listed = items.take().unwrap_or_default();
                this.relist(listed, rv, gap);
            }
            _ => {}
        });
        self.account(before_objects, before_window);
        if large {
            // The list's vector and the objects it replaced are freed: return the holes.
            drop(items);
            crate::memory::release_freed();
        }
    }

    /// Applies one of a relist's changes to the store.
    fn store_change(&mut self, c: &relist::Change) {
        match c.kind {
            EventType::Deleted => {
                self.store.remove(&c.object);
            }
            EventType::Added | EventType::Modified => {
                self.store.upsert(c.object.clone());
            }
        }
    }

    /// A list that differs from the store.
    ///
    /// After a gap (`gap`: the events in between are gone for good) the store takes the
    /// list, the window restarts at its RV and every watch ends, as the API server's
    /// cacher terminates its watchers when its reflector relists: a client resumes from
    /// its last RV and, from before the list, gets a 410 and relists itself. Emitting the
    /// net change instead would skip intermediate states and date deletions at the list's
    /// RV — events that never happened, without telling the client (found by
    /// `loadtest/chaos.sh` after owner changes over a compacted history).
    ///
    /// Otherwise (a probe's list: the differences are events still on their way) the net
    /// effect enters the window as events at the objects' own RVs (deletions at the
    /// list's), as DeltaFIFO's Replace does, so a client's read of a newer RV does not cut
    /// every other watcher's window.
    fn relist(&mut self, listed: Vec<Object>, rv: u64, gap: bool) {
        let changes = relist::diff(&self.store, listed, rv);
        if changes.is_empty() {
            return;
        }
        if gap {
            tracing::info!(key = %self.key, rv, changes = changes.len(), watchers = self.watchers.len(), "relist after a gap; ending the key's watches so clients resume from the list");
            for c in &changes {
                self.store_change(c);
            }
            self.window.reset(rv);
            // An owner's mirrors must not carry on as if nothing happened: a sequence
            // number skipped makes the next heartbeat a gap to them, and they resynchronise
            // (their own watches end the same way).
            self.seq += 1;
            self.last_heartbeat_ms = 0;
            for (_, w) in self.watchers.drain() {
                w.link.do_send(ToWatcher::Close(CloseReason::Resync));
            }
            self.status.watchers.store(0, Ordering::Relaxed);
            return;
        }
        tracing::info!(key = %self.key, rv, changes = changes.len(), "relist found changes; emitting synthetic events");
        // A list shows each object's last state only: the states in between are lost and
        // a deletion is dated by guess, so the states before it are not exact any more
        // (`core::history`).
        self.window.mark_undated(rv);
        // Mirrors must not apply these as events: several deletions dated at the list's RV
        // would be taken for one (a mirror ignores events at or below its progress), and a
        // mirror's window would not know its history is guessed. A sequence number skipped
        // makes the first of them a gap to every mirror, which resynchronises from a
        // snapshot instead (as after a gap relist).
        if self.listener.is_some() {
            self.seq += 1;
        }
        metrics::counter!(m::RELIST_EVENTS, &self.labels).increment(changes.len() as u64);
        for c in changes {
            self.store_change(&c);
            self.seq += 1;
            let ev = Arc::new(StoreEvent::new(self.seq, c.rv, c.kind, c.object, c.prev));
            self.window.push(ev.clone());
            self.dispatch(&ev);
        }
    }

    fn on_event(&mut self, kind: EventType, object: Object, rv: u64) {
        metrics::counter!(m::EVENTS_RECEIVED, &self.labels).increment(1);
        let before_objects = self.store.len();
        let before_window = self.window.len();
        let mut object = Some(object);
        self.step(Input::Event { rv }, |this, effect| {
            let (Effect::Apply, Some(object)) = (effect, object.take()) else {
                return;
            };
            this.seq += 1;
            // The event's line and the stored object share one allocation.
            let mut ev = StoreEvent::of_new(this.seq, rv, kind, object, None);
            ev.prev = match kind {
                EventType::Deleted => this.store.remove(&ev.object),
                EventType::Added | EventType::Modified => this.store.upsert(ev.object.clone()),
            };
            let ev = Arc::new(ev);
            this.window.push(ev.clone());
            this.dispatch(&ev);
        });
        self.account(before_objects, before_window);
    }

    fn account(&self, objects_before: usize, window_before: usize) {
        let d_obj = self.store.len() as f64 - objects_before as f64;
        let d_win = self.window.len() as f64 - window_before as f64;
        if d_obj != 0.0 {
            metrics::gauge!(m::CACHED_OBJECTS).increment(d_obj);
            self.status
                .objects
                .store(self.store.len(), Ordering::Relaxed);
        }
        if d_win != 0.0 {
            metrics::gauge!(m::WINDOW_EVENTS).increment(d_win);
        }
    }

    /// Non-blocking add to every watcher, as `dispatchEvent`'s `nonblockingAdd`; a watcher
    /// whose mailbox is full is closed rather than allowed to slow the key down.
    fn dispatch(&mut self, ev: &Arc<StoreEvent>) {
        self.status
            .replayable_from
            .store(self.window.replayable_from(), Ordering::Relaxed);
        let mut slow = Vec::new();
        for (id, link) in self.watchers.concerned(ev.object.name()) {
            match link.try_send(ToWatcher::Dispatch(ev.clone())) {
                Ok(()) => {}
                Err(SendError::Full(_)) => slow.push(id),
                // Already stopping; its Unsubscribe is on the way.
                Err(SendError::Closed(_)) => {}
            }
        }
        for id in slow {
            self.terminate(id);
        }
        if let Some(listener) = &self.listener {
            if let Err(SendError::Full(_)) = listener.try_send(Publish::Event(ev.clone())) {
                metrics::counter!(m::FLEET_LISTENER_DROPS).increment(1);
            }
            self.status.update_fleet(|f| f.seq = ev.seq);
        }
    }

    /// An owner's heartbeat: the last seq and the progress RV, so mirrors detect a lost
    /// last event and can answer bookmarks and RV checks.
    fn heartbeat(&mut self, now: u64) {
        if let Some(listener) = &self.listener {
            if now.saturating_sub(self.last_heartbeat_ms) >= self.heartbeat_ms {
                self.last_heartbeat_ms = now;
                let _ = listener.try_send(Publish::Heartbeat {
                    seq: self.seq,
                    rv: self.progress(),
                });
            }
        }
    }

    fn terminate(&mut self, id: u64) {
        if let Some(w) = self.watchers.remove(id) {
            self.status
                .watchers
                .store(self.watchers.len(), Ordering::Relaxed);
            metrics::counter!(m::TERMINATED_WATCHERS, &self.labels).increment(1);
            tracing::warn!(key = %self.key, watcher = id, "closing unresponsive watcher: its buffer is full");
            w.link.do_send(ToWatcher::Close(CloseReason::TooSlow));
        }
    }

    /// Sends a command to whoever reads the key: the upstream read this replica runs, or
    /// else its source. `false` when it cannot take one now.
    fn command(&self, cmd: SourceCmd) -> bool {
        match &self.upstream_commands {
            Some(tx) => tx.try_send(cmd).is_ok(),
            None => self
                .source
                .as_ref()
                .is_some_and(|src| src.commands.try_send(cmd).is_ok()),
        }
    }

    /// Asks the source to establish progress with a consistent list (the machine decided
    /// one is due).
    fn probe(&mut self) {
        if self.command(SourceCmd::Probe) {
            metrics::counter!(m::PROBES, &self.labels).increment(1);
        } else {
            self.step(Input::ProbeRefused, |_, _| {});
        }
    }

    /// A watch from `sub.plan.from_rv`, older than the window of a key that is merely
    /// young (its first list came after the client's own list: client-go's list-then-watch
    /// while others write, every informer resuming after a kcache restart): ask the source
    /// for the upstream's replay from that RV; the window is extended back with what
    /// happened since (`on_replayed`) and the watch starts normally, as the API server
    /// would serve it, else it gets its 410. One replay in flight per key.
    fn backfill(&mut self, sub: Subscribe) {
        let now = Instant::now();
        // The replay's own upstream watch ends within a few seconds (`source::Reader`).
        let deadline = now + self.cfg.block_timeout() + BACKFILL_GRACE;
        let rv = sub.plan.from_rv;
        self.backfill.push((sub, deadline));
        // One replay per key at a time; one that never answered (its task died with a
        // source) stops blocking the next after a while.
        if self
            .backfill_at
            .is_some_and(|(_, asked)| now.duration_since(asked) < BACKFILL_ABANDON)
        {
            return;
        }
        let cmd = ReplayCmd {
            from: rv,
            to: self.window.list_rv(),
            max_events: self.window.room(),
        };
        if self.command(SourceCmd::Replay(cmd)) {
            self.backfill_at = Some((rv, now));
        } else {
            self.backfill_at = None;
            self.end_backfill(rv, false);
        }
    }

    /// The source's replay from `from` (`None`: it could not).
    fn on_replayed(&mut self, from: u64, replay: Option<Replay>) {
        if self.backfill_at.map(|(rv, _)| rv) != Some(from) {
            return;
        }
        self.backfill_at = None;
        let outcome = match replay {
            None => "upstream_refused",
            Some(_) if !self.window.complete_since_list() || from >= self.window.list_rv() => {
                "window_moved"
            }
            Some(replay) => match backfill::events_since(
                &self.store,
                self.window.events(),
                self.window.list_rv(),
                from,
                replay,
            ) {
                Err(e) => {
                    tracing::warn!(key = %self.key, error = %e, "young key's window backfill refused");
                    "inconsistent"
                }
                Ok(events) => {
                    let before = self.window.len();
                    let n = events.len();
                    // Before every numbered event: no watcher continues from inside them
                    // (`Window::since_seq`).
                    let events = events
                        .into_iter()
                        .map(|b| {
                            Arc::new(StoreEvent::new(
                                BACKFILLED_SEQ,
                                b.rv,
                                b.kind,
                                b.object,
                                b.prev,
                            ))
                        })
                        .collect();
                    if self.window.prepend(from, events) {
                        self.account(self.store.len(), before);
                        tracing::debug!(key = %self.key, from, events = n, "young key's window extended back");
                        "extended"
                    } else {
                        "too_many_events"
                    }
                }
            },
        };
        metrics::counter!(m::WINDOW_BACKFILLS, "group" => self.labels[0].1.clone(), "resource" => self.labels[1].1.clone(), "outcome" => outcome).increment(1);
        self.end_backfill(from, outcome == "extended");
    }

    /// Starts (or expires) the waiting watches after a replay from `rv`
    /// (`backfill::another_round` decides which get a replay of their own).
    fn end_backfill(&mut self, rv: u64, ok: bool) {
        let waiting = std::mem::take(&mut self.backfill);
        for (sub, _) in waiting {
            let again = backfill::another_round(ok, rv, sub.plan.from_rv);
            self.activate_with(sub, again);
        }
    }

    /// Watches whose replay did not answer in time get their 410; the others wait on.
    fn expire_backfills(&mut self) {
        let now = Instant::now();
        let (overdue, waiting) = std::mem::take(&mut self.backfill)
            .into_iter()
            .partition(|(_, deadline)| now >= *deadline);
        self.backfill = waiting;
        for (sub, _) in overdue {
            self.activate_with(sub, false);
        }
    }

    fn snapshot(&self) -> Snapshot {
        Snapshot {
            objects: self.store.snapshot(),
            rv: self.progress(),
        }
    }

    /// The current state, or the state at `at` (`core::history`), in key order.
    fn snapshot_at(&self, at: Option<u64>) -> Result<Snapshot> {
        let Some(rv) = at else {
            return Ok(self.snapshot());
        };
        match Past::at(&self.window, self.progress(), rv) {
            Ok(past) => Ok(Snapshot {
                objects: past.objects(&self.store, None).cloned().collect(),
                rv,
            }),
            Err(history::Error::TooOld { requested, oldest }) => {
                Err(Error::TooOld { requested, oldest })
            }
            // Served only once the progress reached `rv`.
            Err(history::Error::TooNew { requested, current }) => {
                Err(Error::TooLargeResourceVersion { requested, current })
            }
        }
    }

    /// Parks a read or watch until the machine serves or fails it.
    fn wait(&mut self, min_rv: u64, waiter: Waiter) {
        self.next_wait += 1;
        let id = self.next_wait;
        self.waiting.insert(id, waiter);
        self.step(Input::Wait { id, min_rv }, |_, _| {});
    }

    fn activate(&mut self, sub: Subscribe) {
        self.activate_with(sub, true);
    }

    fn activate_with(&mut self, sub: Subscribe, may_backfill: bool) {
        let from = sub.plan.from_rv;
        let window = if sub.plan.initial_events {
            Ok(Vec::new())
        } else {
            self.window.since(from)
        };
        let decision = key_machine::watch_start(
            sub.plan.initial_events,
            window
                .as_ref()
                .map(|_| ())
                .map_err(|window::Error::Expired { oldest, .. }| *oldest),
            may_backfill && requested_backfillable(&self.window, from),
        );
        let start = match (decision, window) {
            (WatchStart::Initial, _) => watch_feed::Start {
                initial: self.store.snapshot(),
                initial_rv: self.progress(),
                end_bookmark: sub.plan.initial_events_end_bookmark,
                replay: Vec::new(),
                floor: from,
                start_seq: self.seq,
            },
            (WatchStart::Replay, Ok(replay)) => watch_feed::Start {
                initial: Vec::new(),
                initial_rv: self.progress(),
                end_bookmark: false,
                replay,
                floor: from,
                start_seq: self.seq,
            },
            (WatchStart::Backfill, _) => {
                self.backfill(sub);
                return;
            }
            (WatchStart::Expired { oldest }, _)
            | (WatchStart::Replay, Err(window::Error::Expired { oldest, .. })) => {
                metrics::counter!(m::EXPIRED_WATCHES, &self.labels).increment(1);
                sub.link.do_send(ToWatcher::Expired {
                    requested: from,
                    oldest,
                });
                return;
            }
        };
        // The Start message is a one-off control message; later events are try_send'ed,
        // once the watcher has written it and is live (`Ready`).
        sub.link.do_send(ToWatcher::Start(start));
        let now = self.now_ms();
        let deadline_ms = sub
            .deadline
            .map(|d| now + d.saturating_duration_since(Instant::now()).as_millis() as u64);
        self.watchers.insert(
            sub.id,
            Entry::new(sub.link, sub.allow_bookmarks, deadline_ms, sub.asked),
        );
        self.status
            .watchers
            .store(self.watchers.len(), Ordering::Relaxed);
    }

    /// Continues a watcher that wrote its backlog up to `after_seq`: the events since,
    /// from the window; live (events and bookmarks from now on) once they fit in its
    /// buffer with a line to spare, else another round. A window that lost some of them
    /// ends the watch with a 410, as a watch from an RV the window no longer holds.
    fn continue_watcher(&mut self, msg: Ready) {
        let now = self.now_ms();
        let Some(w) = self.watchers.get(msg.id) else {
            return;
        };
        let events = self.window.since_seq(msg.after_seq, self.seq);
        let next = key_machine::continue_watcher(events.as_ref().map(Vec::len), msg.room);
        let (Some(events), false) = (events, next == Continue::Expired) else {
            metrics::counter!(m::EXPIRED_WATCHES, &self.labels).increment(1);
            let oldest = self.window.oldest_replayable();
            if let Some(w) = self.watchers.remove(msg.id) {
                w.link.do_send(ToWatcher::Expired {
                    requested: msg.rv,
                    oldest,
                });
            }
            self.status
                .watchers
                .store(self.watchers.len(), Ordering::Relaxed);
            return;
        };
        let live = next == Continue::Live;
        w.link.do_send(ToWatcher::Replay(watch_feed::Replay {
            events,
            upto_seq: self.seq,
            live,
        }));
        if live {
            self.watchers.go_live(msg.id, now);
        }
    }

    /// One timer per key: bookmarks to due watchers, then expired waits.
    fn tick(&mut self) {
        self.status
            .replayable_from
            .store(self.window.replayable_from(), Ordering::Relaxed);
        let now = self.now_ms();
        let rv = self.progress();
        for (_, link) in self.watchers.due_bookmarks(now) {
            let _ = link.try_send(ToWatcher::Bookmark { rv });
        }
        self.heartbeat(now);
        self.step(Input::Tick, |_, _| {});
        self.expire_backfills();
    }

    fn on_role(&mut self, role: Role, ctx: &mut Context<Self>) {
        match role {
            Role::Owner {
                epoch,
                listener,
                heartbeat,
                upstream,
            } => {
                tracing::info!(key = %self.key, epoch, seq = self.seq, "publishing the key's events as its owner");
                self.listener = Some(listener);
                self.heartbeat_ms = heartbeat.as_millis() as u64;
                self.last_heartbeat_ms = 0;
                self.status.update_fleet(|f| f.seq = self.seq);
                if let Some(upstream) = upstream {
                    self.read_upstream(upstream, ctx);
                }
            }
            Role::Local { upstream } => {
                self.listener = None;
                self.read_upstream(upstream, ctx);
            }
            Role::Mirror => {
                self.listener = None;
                self.upstream_commands = None;
            }
        }
    }

    /// Reads an upstream read's messages directly (they end when the fleet source stops it).
    fn read_upstream(&mut self, upstream: UpstreamFeed, ctx: &mut Context<Self>) {
        self.upstream_commands = Some(upstream.commands);
        ctx.add_stream(ReceiverStream::new(upstream.events));
    }

    /// What a mirror's snapshot request is answered with: the events after `since` when the
    /// window still holds them all, else the whole state; `None` while not synced.
    fn owner_snapshot(&self, since: Option<u64>) -> Option<OwnerSnapshot> {
        self.machine
            .synced()
            .then(|| match since.map(|rv| self.window.since(rv)) {
                Some(Ok(events)) => OwnerSnapshot {
                    objects: Vec::new(),
                    replay: Some(events),
                    rv: self.progress(),
                    seq: self.seq,
                },
                _ => OwnerSnapshot {
                    objects: self.store.snapshot(),
                    replay: None,
                    rv: self.progress(),
                    seq: self.seq,
                },
            })
    }
}

/// A list of at least this many objects leaves enough freed memory behind to trim.
const LARGE_LIST: usize = 10_000;

/// How much longer than a read of a future RV a watch waits for its backfill: the
/// replay's upstream watch runs up to three seconds.
const BACKFILL_GRACE: Duration = Duration::from_secs(5);

/// A replay that has not answered in this long no longer blocks the key's next one.
const BACKFILL_ABANDON: Duration = Duration::from_secs(120);

/// A watch from `rv` may wait for a backfill: the window is complete since its list (so
/// its state there can be recovered) and `rv` is a real RV below it.
fn requested_backfillable(window: &Window, rv: u64) -> bool {
    rv > 0 && rv < window.list_rv() && window.complete_since_list()
}

impl Actor for CachedObject {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        metrics::gauge!(m::CACHED_KEYS).increment(1.0);
        let (handle, events) =
            self.sources
                .start(&self.key, &self.status, ctx.address().recipient());
        self.source = Some(handle);
        ctx.add_stream(ReceiverStream::new(events));
        ctx.run_interval(Duration::from_millis(250), |act, _| act.tick());
    }

    fn stopped(&mut self, _ctx: &mut Self::Context) {
        metrics::gauge!(m::CACHED_KEYS).decrement(1.0);
        if self.machine.synced() {
            metrics::gauge!(m::SYNCED_KEYS).decrement(1.0);
        }
        metrics::gauge!(m::CACHED_OBJECTS).decrement(self.store.len() as f64);
        metrics::gauge!(m::WINDOW_EVENTS).decrement(self.window.len() as f64);
        for (_, w) in self.watchers.drain() {
            w.link.do_send(ToWatcher::Close(CloseReason::KeyStopped));
        }
        for (sub, _) in self.backfill.drain(..) {
            let err = Error::Stopping {
                key: self.key.to_string(),
            };
            sub.link.do_send(err.to_watcher());
        }
        for (_, waiter) in self.waiting.drain() {
            let err = Error::Stopping {
                key: self.key.to_string(),
            };
            match waiter {
                Waiter::Read(tx, _) => {
                    let _ = tx.send(Err(err));
                }
                Waiter::Watch(sub) => sub.link.do_send(err.to_watcher()),
            }
        }
        // Dropping the handle aborts the source task (and its upstream watch).
        self.source = None;
        tracing::debug!(key = %self.key, "key stopped");
    }
}

impl StreamHandler<SourceMsg> for CachedObject {
    fn handle(&mut self, msg: SourceMsg, ctx: &mut Self::Context) {
        match msg {
            SourceMsg::Listed { items, rv, gap } => self.on_listed(items, rv, gap),
            SourceMsg::Event { kind, object, rv } => self.on_event(kind, object, rv),
            SourceMsg::Progress { rv } => self.step(Input::Progress { rv }, |_, _| {}),
            SourceMsg::Replayed { from, replay } => self.on_replayed(from, replay),
            SourceMsg::Role(role) => self.on_role(role, ctx),
            SourceMsg::Unhealthy { error } => {
                // Reads keep being served from what is cached; a probe in flight is lost.
                self.step(Input::SourceUnhealthy, |_, _| {});
                tracing::debug!(key = %self.key, %error, "source unhealthy");
            }
        }
    }

    // The default `finished` stops the actor; a source only ends when it is dropped, and
    // the key's lifetime belongs to the registry, so do nothing here.
    fn finished(&mut self, _ctx: &mut Self::Context) {}
}

impl Handler<TakeSnapshot> for CachedObject {
    type Result = Option<OwnerSnapshot>;

    fn handle(&mut self, msg: TakeSnapshot, _ctx: &mut Self::Context) -> Self::Result {
        self.owner_snapshot(msg.since)
    }
}

impl Handler<Read> for CachedObject {
    type Result = ResponseFuture<Result<Snapshot>>;

    fn handle(&mut self, msg: Read, _ctx: &mut Self::Context) -> Self::Result {
        let min_rv = msg.at.unwrap_or(msg.min_rv);
        if self.machine.fresh_enough(min_rv) {
            let snap = self.snapshot_at(msg.at);
            return Box::pin(async move { snap });
        }
        let (tx, rx) = oneshot::channel();
        self.wait(min_rv, Waiter::Read(tx, msg.at));
        let key = self.key.to_string();
        Box::pin(async move { rx.await.unwrap_or(Err(Error::Stopping { key })) })
    }
}

impl Handler<TryRead> for CachedObject {
    type Result = Option<Result<Snapshot>>;

    fn handle(&mut self, msg: TryRead, _ctx: &mut Self::Context) -> Self::Result {
        self.machine
            .fresh_enough(msg.at.unwrap_or(msg.min_rv))
            .then(|| self.snapshot_at(msg.at))
    }
}

impl Handler<Progress> for CachedObject {
    type Result = Option<(u64, usize)>;

    fn handle(&mut self, _msg: Progress, _ctx: &mut Self::Context) -> Self::Result {
        self.machine
            .synced()
            .then(|| (self.machine.progress(), self.store.len()))
    }
}

impl Handler<ToKey> for CachedObject {
    type Result = ();

    fn handle(&mut self, msg: ToKey, _ctx: &mut Self::Context) {
        match msg {
            ToKey::Subscribe(sub) => self.subscribe(sub),
            ToKey::Ready(ready) => self.continue_watcher(ready),
            ToKey::Unsubscribe { id } => {
                if self.watchers.remove(id).is_some() {
                    self.status
                        .watchers
                        .store(self.watchers.len(), Ordering::Relaxed);
                }
            }
        }
    }
}

impl CachedObject {
    fn subscribe(&mut self, sub: Subscribe) {
        // A watch with initial events needs a state at least as fresh as its RV; a plain
        // watch from N newer than the progress is accepted at once and waits for events
        // newer than N, as 1.20 does.
        let min_rv = if sub.plan.initial_events {
            sub.plan.from_rv
        } else {
            0
        };
        if self.machine.fresh_enough(min_rv) {
            self.activate(sub);
        } else {
            self.wait(min_rv, Waiter::Watch(sub));
        }
    }
}

impl Handler<HandOver> for CachedObject {
    type Result = HandedOver;

    fn handle(&mut self, msg: HandOver, _ctx: &mut Self::Context) -> HandedOver {
        // Only live watches move: the others are not writing events yet, and are asked
        // for again.
        let (live, pending) = self.watchers.handover(msg.only_asked.as_ref());
        let mut out = HandedOver {
            moved: 0,
            left: pending,
        };
        let to_synced = msg.to_status.synced.load(Ordering::Relaxed);
        let Some(after_rv) = coalesce::handover_rv(self.progress(), to_synced) else {
            out.left += live.len();
            return out;
        };
        for id in live {
            if let Some(w) = self.watchers.remove(id) {
                // Its pending bookmark finds no watcher and is dropped (`tick`).
                w.link.do_send(ToWatcher::Move(watch_feed::Move {
                    key: msg.to.clone(),
                    link: msg.link.clone(),
                    after_rv,
                }));
                out.moved += 1;
            }
        }
        self.status
            .watchers
            .store(self.watchers.len(), Ordering::Relaxed);
        if out.moved > 0 {
            tracing::info!(key = %self.key, to = %msg.to, moved = out.moved, left = out.left, after_rv, "watchers handed over");
        }
        out
    }
}

impl Handler<Stop> for CachedObject {
    type Result = ();

    fn handle(&mut self, _msg: Stop, ctx: &mut Self::Context) {
        ctx.stop();
    }
}

impl Handler<Drain> for CachedObject {
    type Result = ();

    fn handle(&mut self, _msg: Drain, _ctx: &mut Self::Context) {
        let rv = self.progress();
        for (_, w) in self.watchers.drain() {
            w.link
                .do_send(ToWatcher::Close(CloseReason::Draining { rv }));
        }
        self.status.watchers.store(0, Ordering::Relaxed);
    }
}
