//! One key's cache as plain data — its store, event window, key machine, sequence
//! numbers, watcher table with bookmarks, waiting reads and watches, and backfills — that
//! takes the key's inputs ([`Input`]: lists and events from its source, reads, watches,
//! ticks, handovers) and returns what is to be done ([`Output`]: messages to watchers,
//! replies, commands to the source, events and bookmarks to its follower — the fleet's
//! publisher while this replica owns the key), in order. `apply(now,
//! input) -> outputs`, as `core::upstream::step`; the CachedObject actor carries the
//! outputs out and feeds back what happened to them (a watcher's full buffer, a command
//! the source could not take).
//!
//! Generic over the watcher link `L` and the reply channel `R`, so tests drive it with
//! plain values. The core keeps the links ("the address book"): an output names a watcher
//! still in the table by its id (the actor borrows the link with [`KeyCore::link`], no
//! clone per delivery), and hands over the link of one that leaves it with its last
//! message ([`Output::Final`]).
//!
//! What is decided where: when a list initialises or relists, which events apply, which
//! reads and watches are served, wait or fail, and when to probe — `core::key_machine`;
//! what a list or an event emits — `core::relist`, `core::window`, `core::history`,
//! `core::backfill`; who gets an event and whose bookmark is due — `core::watchers`. This
//! module strings them together for one key.

use std::collections::HashMap;
use std::sync::Arc;

use thiserror::Error;

use crate::config::CacheConfig;
use crate::core::backfill::{self, Replay};
use crate::core::coalesce;
use crate::core::event::{StoreEvent, BACKFILLED_SEQ};
use crate::core::history::{self, Past};
use crate::core::key::Key;
use crate::core::key_machine::{self, Continue, Effect, Failure, KeyMachine, WatchStart};
use crate::core::object::{EventType, Object};
use crate::core::relist;
use crate::core::rv::WatchPlan;
use crate::core::store::{self, Store};
use crate::core::watchers::{Entry, Watchers};
use crate::core::window::{self, Window};
use crate::feed::{OwnerSnapshot, ReplayCmd, SourceCmd};
use crate::metrics as m;
use crate::watch_feed::{self, CloseReason, MovedFrom, Ready, ToWatcher};

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

/// The key's timing and sizes, from `[cache]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settings {
    pub window_capacity: usize,
    pub timing: key_machine::Timing,
    pub bookmark_every_ms: u64,
}

impl Settings {
    pub fn of(cfg: &CacheConfig) -> Settings {
        Settings {
            window_capacity: cfg.window_capacity,
            timing: key_machine::Timing {
                block_ms: cfg.block_timeout().as_millis() as u64,
                sync_ms: cfg.sync_timeout().as_millis() as u64,
                probe_interval_ms: cfg.probe_interval().as_millis() as u64,
            },
            bookmark_every_ms: cfg.bookmark_frequency().as_millis() as u64,
        }
    }
}

/// A watch as the key takes it (`watch_feed::Subscribe` with its deadline on the key's
/// clock).
#[derive(Debug)]
pub struct Watch<L> {
    pub id: u64,
    pub link: L,
    pub plan: WatchPlan,
    pub allow_bookmarks: bool,
    /// When the watch ends by its `timeoutSeconds`, in ms on the key's clock.
    pub deadline_ms: Option<u64>,
    /// The key the watch asked for, when this key covers it (`core::cover`).
    pub asked: Option<Box<Key>>,
    /// Set when the watch moved here from another key.
    pub moved: Option<MovedFrom>,
}

/// What happens to the key.
pub enum Input<L, R> {
    /// The source listed the key at `rv`; `gap`: the events since its last state are gone
    /// for good.
    Listed {
        items: Vec<Object>,
        rv: u64,
        gap: bool,
    },
    /// An upstream event (or an owner's, on a mirror).
    Event {
        kind: EventType,
        object: Object,
        rv: u64,
    },
    /// The key is known complete up to `rv` (an upstream bookmark; on a mirror, the owner's heartbeat).
    Progress { rv: u64 },
    /// The source's replay from `from` for a backfill (`None`: it could not).
    Replayed { from: u64, replay: Option<Replay> },
    /// The source failed: reads go on from the cache, a probe in flight is lost.
    SourceUnhealthy,
    /// Read the key once synced and at least `min_rv` fresh: its current state, or — `at`
    /// — its state at exactly that resourceVersion. Answered by [`Output::Reply`].
    Read {
        min_rv: u64,
        at: Option<u64>,
        /// The key the request asked for when this key covers it: only what it can hold
        /// is copied (`Store::snapshot_for`).
        asked: Option<Key>,
        reply: R,
    },
    /// A watcher registers.
    Subscribe(Watch<L>),
    /// A watcher wrote its backlog (`watch_feed::Ready`).
    Ready(Ready),
    /// A watcher ended.
    Unsubscribe { id: u64 },
    /// A live watcher's buffer was full when offered an event: it is closed, as the
    /// cacher's `nonblockingAdd` fails a watcher rather than slow the key down.
    Full { id: u64 },
    /// The source could not take this command now.
    Refused(SourceCmd),
    /// The periodic tick: bookmarks (the follower's too), expired waits and backfills.
    Tick,
    /// A follower — the fleet's publisher, while this replica owns the key — follows the
    /// key from now on: every event, with its seq, and every so many ms a bookmark that
    /// carries the last seq; `None`: nobody follows (a mirror, or no fleet).
    Follow(Option<u64>),
    /// Move the live watchers (those that asked for `only_asked` when given) to another
    /// key, which is synced or not (`core::coalesce::handover_rv`).
    HandOver {
        only_asked: Option<Key>,
        to_synced: bool,
    },
    /// Shutdown: close every watcher with a last bookmark where allowed.
    Drain,
    /// The key stops: every watcher, wait and backfill ends.
    Stop,
}

/// What the carrier of the key must do, in order.
pub enum Output<L, R> {
    /// A message to watcher `id`, which stays in the table (sent whatever its buffer holds).
    ToWatcher { id: u64, msg: ToWatcher },
    /// The last message to a watcher that has left the table, with its link.
    Final { link: L, msg: ToWatcher },
    /// An event for live watcher `id`, without waiting: if its buffer is full, answer
    /// [`Input::Full`].
    Offer { id: u64, event: Arc<StoreEvent> },
    /// A bookmark for watcher `id`, dropped if its buffer is full (another comes).
    Bookmark { id: u64, rv: u64 },
    /// The answer to a [`Input::Read`].
    Reply(R, Result<Snapshot>),
    /// Ask whoever reads the key upstream; answer [`Input::Refused`] when it cannot take it.
    Command(SourceCmd),
    /// An event for the follower (sent without waiting; one it cannot take is lost, and
    /// the seq it skips tells the mirrors to resynchronise).
    ToFollower(Arc<StoreEvent>),
    /// The follower's bookmark: the last seq and the progress RV, so mirrors detect a lost
    /// last event and can answer bookmarks and RV checks (the fleet's heartbeat).
    FollowerBookmark { seq: u64, rv: u64 },
    /// Watcher (link) continues from the key a [`Input::HandOver`] named, after `after_rv`;
    /// `object_rv`: the RV of the one object it asks for here, if any (`MovedFrom`).
    Move {
        link: L,
        after_rv: u64,
        object_rv: Option<u64>,
    },
    /// How a [`Input::HandOver`] went.
    HandedOver(HandedOver),
}

/// See [`Input::HandOver`]: how many watchers moved, and how many are left (not live yet,
/// or the other key not far enough along): the registry asks again.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HandedOver {
    pub moved: usize,
    pub left: usize,
}

/// What `/debug/keys`, the registry and the gauges read of the key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Status {
    pub progress: u64,
    pub synced: bool,
    pub objects: usize,
    pub window_events: usize,
    pub watchers: usize,
    pub replayable_from: u64,
    pub seq: u64,
}

/// A read or watch waiting for the key to be fresh enough (`KeyMachine` decides when).
enum Waiter<L, R> {
    Read(R, Option<u64>, Option<Key>),
    Watch(Watch<L>),
}

/// How much longer than a read of a future RV a watch waits for its backfill: the
/// replay's upstream watch runs up to three seconds.
const BACKFILL_GRACE_MS: u64 = 5_000;

/// A replay that has not answered in this long no longer blocks the key's next one.
const BACKFILL_ABANDON_MS: u64 = 120_000;

pub struct KeyCore<L, R> {
    key: Key,
    labels: [(&'static str, String); 2],
    store: Store,
    window: Window,
    /// Synced, progress RV, waits and probes.
    machine: KeyMachine,
    block_ms: u64,
    seq: u64,
    /// Who watches, who is live, whom an event concerns, whose bookmark is due; the links
    /// are in its entries.
    watchers: Watchers<L>,
    /// The clients behind the machine's waits, by wait id.
    waiting: HashMap<u64, Waiter<L, R>>,
    next_wait: u64,
    /// Watches from an RV older than this young key's window, waiting for a replay from
    /// that RV to show whether the window may start there (`backfill`), with deadlines.
    backfill: Vec<(Watch<L>, u64)>,
    /// The RV of the `SourceCmd::Replay` in flight, and when it was asked for.
    backfill_at: Option<(u64, u64)>,
    /// Set while a follower follows the key (this replica owns it in the fleet): how often
    /// it gets a bookmark.
    follower: Option<u64>,
    follower_bookmarked_ms: u64,
}

impl<L, R> KeyCore<L, R> {
    pub fn new(key: Key, settings: Settings) -> Self {
        let labels = [
            ("group", key.resource.group.clone()),
            ("resource", key.resource.resource.clone()),
        ];
        KeyCore {
            key,
            labels,
            store: Store::new(),
            window: Window::new(settings.window_capacity),
            machine: KeyMachine::new(settings.timing),
            block_ms: settings.timing.block_ms,
            seq: 0,
            watchers: Watchers::new(settings.bookmark_every_ms),
            waiting: HashMap::new(),
            next_wait: 0,
            backfill: Vec::new(),
            backfill_at: None,
            follower: None,
            follower_bookmarked_ms: 0,
        }
    }

    pub fn key(&self) -> &Key {
        &self.key
    }

    /// The link of watcher `id`, while it is in the table.
    pub fn link(&self, id: u64) -> Option<&L> {
        self.watchers.get(id).map(|w| &w.link)
    }

    pub fn status(&self) -> Status {
        Status {
            progress: self.machine.progress(),
            synced: self.machine.synced(),
            objects: self.store.len(),
            window_events: self.window.len(),
            watchers: self.watchers.len(),
            replayable_from: self.window.replayable_from(),
            seq: self.seq,
        }
    }

    /// What a read would answer if the key is synced and fresh enough now, else `None`.
    pub fn try_read(
        &self,
        min_rv: u64,
        at: Option<u64>,
        asked: Option<&Key>,
    ) -> Option<Result<Snapshot>> {
        self.machine
            .fresh_enough(at.unwrap_or(min_rv))
            .then(|| self.snapshot_at(at, asked))
    }

    /// The progress RV and the number of objects, once synced.
    pub fn progress(&self) -> Option<(u64, usize)> {
        self.machine
            .synced()
            .then(|| (self.machine.progress(), self.store.len()))
    }

    /// What a mirror's snapshot request is answered with: the events after `since` when
    /// the window still holds them all, else the whole state; `None` while not synced.
    pub fn owner_snapshot(&self, since: Option<u64>) -> Option<OwnerSnapshot> {
        self.machine
            .synced()
            .then(|| match since.map(|rv| self.window.since(rv)) {
                Some(Ok(events)) => OwnerSnapshot {
                    objects: Vec::new(),
                    replay: Some(events),
                    rv: self.machine.progress(),
                    seq: self.seq,
                },
                _ => OwnerSnapshot {
                    objects: self.store.snapshot(),
                    replay: None,
                    rv: self.machine.progress(),
                    seq: self.seq,
                },
            })
    }

    /// Takes one input at `now` (ms on the key's clock) and says what to do.
    pub fn apply(&mut self, now: u64, input: Input<L, R>) -> Vec<Output<L, R>> {
        let mut out = Vec::new();
        match input {
            Input::Listed { items, rv, gap } => self.on_listed(now, items, rv, gap, &mut out),
            Input::Event { kind, object, rv } => self.on_event(now, kind, object, rv, &mut out),
            Input::Progress { rv } => self.step(
                now,
                key_machine::Input::Progress { rv },
                &mut out,
                |_, _, _| {},
            ),
            Input::Replayed { from, replay } => self.on_replayed(now, from, replay, &mut out),
            Input::SourceUnhealthy => self.step(
                now,
                key_machine::Input::SourceUnhealthy,
                &mut out,
                |_, _, _| {},
            ),
            Input::Read {
                min_rv,
                at,
                asked,
                reply,
            } => {
                let min_rv = at.unwrap_or(min_rv);
                if self.machine.fresh_enough(min_rv) {
                    out.push(Output::Reply(reply, self.snapshot_at(at, asked.as_ref())));
                } else {
                    self.wait(now, min_rv, Waiter::Read(reply, at, asked), &mut out);
                }
            }
            Input::Subscribe(watch) => self.subscribe(now, watch, &mut out),
            Input::Ready(ready) => self.continue_watcher(now, ready, &mut out),
            Input::Unsubscribe { id } => {
                self.watchers.remove(id);
                // A watch that went away while it waited for the key (its sync, its
                // freshness, a backfill) must not be started later, for nobody.
                self.waiting
                    .retain(|_, w| !matches!(w, Waiter::Watch(watch) if watch.id == id));
                self.backfill.retain(|(watch, _)| watch.id != id);
            }
            Input::Full { id } => self.terminate(id, &mut out),
            Input::Refused(SourceCmd::Probe) => self.step(
                now,
                key_machine::Input::ProbeRefused,
                &mut out,
                |_, _, _| {},
            ),
            Input::Refused(SourceCmd::Replay(cmd)) => {
                if self.backfill_at.map(|(rv, _)| rv) == Some(cmd.from) {
                    self.backfill_at = None;
                }
                self.end_backfill(now, cmd.from, false, &mut out);
            }
            Input::Tick => self.tick(now, &mut out),
            Input::Follow(bookmark_ms) => {
                self.follower = bookmark_ms;
                self.follower_bookmarked_ms = 0;
            }
            Input::HandOver {
                only_asked,
                to_synced,
            } => self.hand_over(only_asked.as_ref(), to_synced, &mut out),
            Input::Drain => {
                let rv = self.machine.progress();
                for (_, w) in self.watchers.drain() {
                    out.push(Output::Final {
                        link: w.link,
                        msg: ToWatcher::Close(CloseReason::Draining { rv }),
                    });
                }
            }
            Input::Stop => self.stop(&mut out),
        }
        out
    }

    /// Feeds the key machine and carries out what it decides; the effects about a list or
    /// an event are the caller's, passed in as `apply` (in order: a read served after a
    /// list must see the list).
    fn step(
        &mut self,
        now: u64,
        input: key_machine::Input,
        out: &mut Vec<Output<L, R>>,
        mut apply: impl FnMut(&mut Self, Effect, &mut Vec<Output<L, R>>),
    ) {
        for effect in self.machine.apply(now, input) {
            match effect {
                Effect::Progressed { .. } => {
                    // Mirrors learn of progress without events from the follower's
                    // bookmark: send it now.
                    self.follower_bookmarked_ms = 0;
                }
                Effect::Serve { id, waited_ms } => {
                    metrics::histogram!(m::READ_WAIT, &self.labels)
                        .record(waited_ms as f64 / 1000.0);
                    match self.waiting.remove(&id) {
                        Some(Waiter::Read(reply, at, asked)) => {
                            out.push(Output::Reply(reply, self.snapshot_at(at, asked.as_ref())))
                        }
                        Some(Waiter::Watch(watch)) => self.activate(now, watch, true, out),
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
                        Some(Waiter::Read(reply, ..)) => out.push(Output::Reply(reply, Err(error))),
                        Some(Waiter::Watch(watch)) => out.push(Output::Final {
                            link: watch.link,
                            msg: error.to_watcher(),
                        }),
                        None => {}
                    }
                }
                Effect::Probe => out.push(Output::Command(SourceCmd::Probe)),
                Effect::Init { .. } | Effect::Relist { .. } | Effect::Ignore | Effect::Apply => {
                    apply(self, effect, out)
                }
            }
        }
    }

    fn on_listed(
        &mut self,
        now: u64,
        items: Vec<Object>,
        rv: u64,
        gap: bool,
        out: &mut Vec<Output<L, R>>,
    ) {
        let mut items = Some(items);
        self.step(
            now,
            key_machine::Input::Listed { rv },
            out,
            |this, effect, out| match effect {
                Effect::Init { rv } => {
                    for item in items.take().into_iter().flatten() {
                        this.store.upsert(Arc::new(item));
                    }
                    this.window.reset(rv);
                    tracing::debug!(key = %this.key, rv, objects = this.store.len(), "key synced");
                }
                Effect::Relist { rv } => {
                    let listed = items.take().unwrap_or_default();
                    this.relist(listed, rv, gap, out);
                }
                _ => {}
            },
        );
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
    fn relist(&mut self, listed: Vec<Object>, rv: u64, gap: bool, out: &mut Vec<Output<L, R>>) {
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
            // number skipped makes the follower's next bookmark a gap to them, and they
            // resynchronise (their own watches end the same way).
            self.seq += 1;
            self.follower_bookmarked_ms = 0;
            for (_, w) in self.watchers.drain() {
                out.push(Output::Final {
                    link: w.link,
                    msg: ToWatcher::Close(CloseReason::Resync),
                });
            }
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
        if self.follower.is_some() {
            self.seq += 1;
        }
        metrics::counter!(m::RELIST_EVENTS, &self.labels).increment(changes.len() as u64);
        for c in changes {
            self.store_change(&c);
            self.seq += 1;
            let ev = Arc::new(StoreEvent::new(self.seq, c.rv, c.kind, c.object, c.prev));
            self.window.push(ev.clone());
            self.dispatch(ev, out);
        }
    }

    fn on_event(
        &mut self,
        now: u64,
        kind: EventType,
        object: Object,
        rv: u64,
        out: &mut Vec<Output<L, R>>,
    ) {
        metrics::counter!(m::EVENTS_RECEIVED, &self.labels).increment(1);
        let mut object = Some(object);
        self.step(
            now,
            key_machine::Input::Event { rv },
            out,
            |this, effect, out| {
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
                this.dispatch(ev, out);
            },
        );
    }

    /// Offers an event to every live watcher it concerns, and to the follower.
    fn dispatch(&mut self, ev: Arc<StoreEvent>, out: &mut Vec<Output<L, R>>) {
        for (id, _) in self.watchers.concerned(ev.object.name()) {
            out.push(Output::Offer {
                id,
                event: ev.clone(),
            });
        }
        if self.follower.is_some() {
            out.push(Output::ToFollower(ev));
        }
    }

    fn terminate(&mut self, id: u64, out: &mut Vec<Output<L, R>>) {
        if let Some(w) = self.watchers.remove(id) {
            metrics::counter!(m::TERMINATED_WATCHERS, &self.labels).increment(1);
            tracing::warn!(key = %self.key, watcher = id, "closing unresponsive watcher: its buffer is full");
            out.push(Output::Final {
                link: w.link,
                msg: ToWatcher::Close(CloseReason::TooSlow),
            });
        }
    }

    /// A watch from `watch.plan.from_rv`, older than the window of a key that is merely
    /// young (its first list came after the client's own list: client-go's list-then-watch
    /// while others write, every informer resuming after a kcache restart): ask the source
    /// for the upstream's replay from that RV; the window is extended back with what
    /// happened since (`on_replayed`) and the watch starts normally, as the API server
    /// would serve it, else it gets its 410. One replay in flight per key.
    fn backfill(&mut self, now: u64, watch: Watch<L>, out: &mut Vec<Output<L, R>>) {
        // The replay's own upstream watch ends within a few seconds (`source::Reader`).
        let deadline = now + self.block_ms + BACKFILL_GRACE_MS;
        let rv = watch.plan.from_rv;
        self.backfill.push((watch, deadline));
        // One replay per key at a time; one that never answered (its task died with a
        // source) stops blocking the next after a while.
        if self
            .backfill_at
            .is_some_and(|(_, asked)| now.saturating_sub(asked) < BACKFILL_ABANDON_MS)
        {
            return;
        }
        self.backfill_at = Some((rv, now));
        out.push(Output::Command(SourceCmd::Replay(ReplayCmd {
            from: rv,
            to: self.window.list_rv(),
            max_events: self.window.room(),
        })));
    }

    /// The source's replay from `from` (`None`: it could not).
    fn on_replayed(
        &mut self,
        now: u64,
        from: u64,
        replay: Option<Replay>,
        out: &mut Vec<Output<L, R>>,
    ) {
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
                        tracing::debug!(key = %self.key, from, events = n, "young key's window extended back");
                        "extended"
                    } else {
                        "too_many_events"
                    }
                }
            },
        };
        metrics::counter!(m::WINDOW_BACKFILLS, "group" => self.labels[0].1.clone(), "resource" => self.labels[1].1.clone(), "outcome" => outcome).increment(1);
        self.end_backfill(now, from, outcome == "extended", out);
    }

    /// Starts (or expires) the waiting watches after a replay from `rv`
    /// (`backfill::another_round` decides which get a replay of their own).
    fn end_backfill(&mut self, now: u64, rv: u64, ok: bool, out: &mut Vec<Output<L, R>>) {
        for (watch, _) in std::mem::take(&mut self.backfill) {
            let again = backfill::another_round(ok, rv, watch.plan.from_rv);
            self.activate(now, watch, again, out);
        }
    }

    /// Watches whose replay did not answer in time get their 410; the others wait on.
    fn expire_backfills(&mut self, now: u64, out: &mut Vec<Output<L, R>>) {
        let (overdue, waiting): (Vec<_>, Vec<_>) = std::mem::take(&mut self.backfill)
            .into_iter()
            .partition(|(_, deadline)| now >= *deadline);
        self.backfill = waiting;
        for (watch, _) in overdue {
            // Counted, so a 410 from a replay that answered too late is told apart from
            // the window's own (`kcache_watch_expired_total` counts both).
            metrics::counter!(m::WINDOW_BACKFILLS, "group" => self.labels[0].1.clone(), "resource" => self.labels[1].1.clone(), "outcome" => "overdue").increment(1);
            self.activate(now, watch, false, out);
        }
    }

    /// The current state, or the state at `at` (`core::history`), in key order; of
    /// `asked` alone when this key covers it (`Store::snapshot_for`).
    fn snapshot_at(&self, at: Option<u64>, asked: Option<&Key>) -> Result<Snapshot> {
        let Some(rv) = at else {
            return Ok(Snapshot {
                objects: self.store.snapshot_for(asked),
                rv: self.machine.progress(),
            });
        };
        match Past::at(&self.window, self.machine.progress(), rv) {
            Ok(past) => Ok(Snapshot {
                objects: past
                    .objects(&self.store, store::borrowed(&store::span(asked)))
                    .cloned()
                    .collect(),
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
    fn wait(&mut self, now: u64, min_rv: u64, waiter: Waiter<L, R>, out: &mut Vec<Output<L, R>>) {
        self.next_wait += 1;
        let id = self.next_wait;
        self.waiting.insert(id, waiter);
        self.step(
            now,
            key_machine::Input::Wait { id, min_rv },
            out,
            |_, _, _| {},
        );
    }

    fn subscribe(&mut self, now: u64, watch: Watch<L>, out: &mut Vec<Output<L, R>>) {
        // A watch with initial events needs a state at least as fresh as its RV; a plain
        // watch from N newer than the progress is accepted at once and waits for events
        // newer than N, as 1.20 does.
        let min_rv = if watch.plan.initial_events {
            watch.plan.from_rv
        } else {
            0
        };
        if self.machine.fresh_enough(min_rv) {
            self.activate(now, watch, true, out);
        } else {
            self.wait(now, min_rv, Waiter::Watch(watch), out);
        }
    }

    /// Starts a watch that may be served: its initial state or replay, a backfill first
    /// (`may_backfill`), or its 410.
    fn activate(
        &mut self,
        now: u64,
        mut watch: Watch<L>,
        may_backfill: bool,
        out: &mut Vec<Output<L, R>>,
    ) {
        if let Some(moved) = watch.moved.take() {
            let start = coalesce::moved_start(
                watch.plan.from_rv,
                moved.object_rv,
                self.object_rv(watch.asked.as_deref()),
                self.machine.progress(),
            );
            let how = match start {
                coalesce::MovedStart::Unchanged(_) => "unchanged",
                coalesce::MovedStart::From(_) => "from_rv",
            };
            metrics::counter!(m::MOVED_WATCH_STARTS, "group" => self.labels[0].1.clone(), "resource" => self.labels[1].1.clone(), "start" => how).increment(1);
            watch.plan.from_rv = start.rv();
        }
        let from = watch.plan.from_rv;
        let window = if watch.plan.initial_events {
            Ok(Vec::new())
        } else {
            self.window.since(from)
        };
        let decision = key_machine::watch_start(
            watch.plan.initial_events,
            window
                .as_ref()
                .map(|_| ())
                .map_err(|window::Error::Expired { oldest, .. }| *oldest),
            may_backfill && requested_backfillable(&self.window, from),
        );
        let start = match (decision, window) {
            (WatchStart::Initial, _) => watch_feed::Start {
                initial: self.store.snapshot_for(watch.asked.as_deref()),
                initial_rv: self.machine.progress(),
                end_bookmark: watch.plan.initial_events_end_bookmark,
                replay: Vec::new(),
                floor: from,
                start_seq: self.seq,
            },
            (WatchStart::Replay, Ok(replay)) => watch_feed::Start {
                initial: Vec::new(),
                initial_rv: self.machine.progress(),
                end_bookmark: false,
                replay,
                floor: from,
                start_seq: self.seq,
            },
            (WatchStart::Backfill, _) => return self.backfill(now, watch, out),
            (WatchStart::Expired { oldest }, _)
            | (WatchStart::Replay, Err(window::Error::Expired { oldest, .. })) => {
                metrics::counter!(m::EXPIRED_WATCHES, &self.labels).increment(1);
                out.push(Output::Final {
                    link: watch.link,
                    msg: ToWatcher::Expired {
                        requested: from,
                        oldest,
                    },
                });
                return;
            }
        };
        // The Start message is a one-off control message; later events are offered once
        // the watcher has written it and is live (`Ready`).
        let id = watch.id;
        self.watchers.insert(
            id,
            Entry::new(
                watch.link,
                watch.allow_bookmarks,
                watch.deadline_ms,
                watch.asked,
            ),
        );
        out.push(Output::ToWatcher {
            id,
            msg: ToWatcher::Start(start),
        });
    }

    /// The RV of the one object `asked` (this key when `None`) names, when it names one
    /// and the store holds it.
    fn object_rv(&self, asked: Option<&Key>) -> Option<u64> {
        if !asked.unwrap_or(&self.key).holds_at_most_one() {
            return None;
        }
        let span = store::span(asked);
        let mut objects = self.store.range(store::borrowed(&span));
        match (objects.next(), objects.next()) {
            (Some((_, o)), None) => Some(o.rv()),
            _ => None,
        }
    }

    /// Continues a watcher that wrote its backlog up to `after_seq`: the events since,
    /// from the window; live (events and bookmarks from now on) once they fit in its
    /// buffer with a line to spare, else another round. A window that lost some of them
    /// ends the watch with a 410, as a watch from an RV the window no longer holds.
    fn continue_watcher(&mut self, now: u64, msg: Ready, out: &mut Vec<Output<L, R>>) {
        if self.watchers.get(msg.id).is_none() {
            return;
        }
        let events = self.window.since_seq(msg.after_seq, self.seq);
        let next = key_machine::continue_watcher(events.as_ref().map(Vec::len), msg.room);
        let (Some(events), false) = (events, next == Continue::Expired) else {
            metrics::counter!(m::EXPIRED_WATCHES, &self.labels).increment(1);
            let oldest = self.window.oldest_replayable();
            if let Some(w) = self.watchers.remove(msg.id) {
                out.push(Output::Final {
                    link: w.link,
                    msg: ToWatcher::Expired {
                        requested: msg.rv,
                        oldest,
                    },
                });
            }
            return;
        };
        let live = next == Continue::Live;
        out.push(Output::ToWatcher {
            id: msg.id,
            msg: ToWatcher::Replay(watch_feed::Replay {
                events,
                upto_seq: self.seq,
                live,
            }),
        });
        if live {
            self.watchers.go_live(msg.id, now);
        }
    }

    /// Bookmarks to due watchers and the follower, expired waits and backfills.
    fn tick(&mut self, now: u64, out: &mut Vec<Output<L, R>>) {
        let rv = self.machine.progress();
        for (id, _) in self.watchers.due_bookmarks(now) {
            out.push(Output::Bookmark { id, rv });
        }
        if let Some(every) = self.follower {
            if now.saturating_sub(self.follower_bookmarked_ms) >= every {
                self.follower_bookmarked_ms = now;
                out.push(Output::FollowerBookmark { seq: self.seq, rv });
            }
        }
        self.step(now, key_machine::Input::Tick, out, |_, _, _| {});
        self.expire_backfills(now, out);
    }

    fn hand_over(
        &mut self,
        only_asked: Option<&Key>,
        to_synced: bool,
        out: &mut Vec<Output<L, R>>,
    ) {
        // Only live watches move: the others are not writing events yet, and are asked
        // for again.
        let (live, pending) = self.watchers.handover(only_asked);
        let mut handed = HandedOver {
            moved: 0,
            left: pending,
        };
        match coalesce::handover_rv(self.machine.progress(), to_synced) {
            None => handed.left += live.len(),
            Some(after_rv) => {
                for id in live {
                    // Its pending bookmark finds no watcher and is dropped (`tick`).
                    if let Some(w) = self.watchers.remove(id) {
                        let object_rv = self.object_rv(w.asked.as_deref());
                        out.push(Output::Move {
                            link: w.link,
                            after_rv,
                            object_rv,
                        });
                        handed.moved += 1;
                    }
                }
            }
        }
        out.push(Output::HandedOver(handed));
    }

    fn stop(&mut self, out: &mut Vec<Output<L, R>>) {
        let key = self.key.to_string();
        let stopping = || Error::Stopping { key: key.clone() };
        for (_, w) in self.watchers.drain() {
            out.push(Output::Final {
                link: w.link,
                msg: ToWatcher::Close(CloseReason::KeyStopped),
            });
        }
        for (watch, _) in self.backfill.drain(..) {
            out.push(Output::Final {
                link: watch.link,
                msg: stopping().to_watcher(),
            });
        }
        for (_, waiter) in self.waiting.drain() {
            match waiter {
                Waiter::Read(reply, ..) => out.push(Output::Reply(reply, Err(stopping()))),
                Waiter::Watch(watch) => out.push(Output::Final {
                    link: watch.link,
                    msg: stopping().to_watcher(),
                }),
            }
        }
    }
}

/// A watch from `rv` may wait for a backfill: the window is complete since its list (so
/// its state there can be recovered) and `rv` is a real RV below it.
fn requested_backfillable(window: &Window, rv: u64) -> bool {
    rv > 0 && rv < window.list_rv() && window.complete_since_list()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::key::{ResourceType, Scope};
    use crate::core::store::fixtures::obj;

    type In = Input<&'static str, u32>;
    type Out = Output<&'static str, u32>;
    /// A case of the table: its name, its steps (time, input), each step's outputs.
    type Case = (&'static str, Vec<(u64, In)>, Vec<&'static str>);

    fn key() -> Key {
        Key::new(
            Arc::new(ResourceType::new("", "v1", "secrets", "Secret", true)),
            Scope::Namespace("n".into()),
        )
    }

    fn core() -> KeyCore<&'static str, u32> {
        core_of(key())
    }

    fn core_of(key: Key) -> KeyCore<&'static str, u32> {
        KeyCore::new(
            key,
            Settings {
                window_capacity: 8,
                timing: key_machine::Timing {
                    block_ms: 3_000,
                    sync_ms: 10_000,
                    probe_interval_ms: 1_000,
                },
                bookmark_every_ms: 1_000,
            },
        )
    }

    fn listed(objects: &[(&str, u64)], rv: u64, gap: bool) -> In {
        Input::Listed {
            items: objects.iter().map(|(n, r)| obj(n, n, *r)).collect(),
            rv,
            gap,
        }
    }

    fn event(kind: EventType, name: &str, rv: u64) -> In {
        Input::Event {
            kind,
            object: obj(name, name, rv),
            rv,
        }
    }

    fn modified(name: &str, rv: u64) -> In {
        event(EventType::Modified, name, rv)
    }

    /// Watch `id` (link `w<id>`), from `from` with initial events or not, bookmarks allowed.
    fn watch(id: u64, link: &'static str, from: u64, initial: bool) -> In {
        Input::Subscribe(Watch {
            id,
            link,
            plan: WatchPlan {
                initial_events: initial,
                initial_events_end_bookmark: false,
                from_rv: from,
            },
            allow_bookmarks: true,
            deadline_ms: None,
            asked: None,
            moved: None,
        })
    }

    /// Watch `id` moved here from another key after `from`, asking for object `name` of
    /// namespace `n`, which the key it left held at `object_rv`.
    fn moved_watch(
        id: u64,
        link: &'static str,
        from: u64,
        name: &str,
        object_rv: Option<u64>,
    ) -> In {
        let Input::Subscribe(mut w) = watch(id, link, from, false) else {
            unreachable!("watch() subscribes")
        };
        w.asked = Some(Box::new(name_key(name)));
        w.moved = Some(MovedFrom { object_rv });
        Input::Subscribe(w)
    }

    fn name_key(name: &str) -> Key {
        Key::new(
            key().resource,
            Scope::Name {
                namespace: Some("n".into()),
                name: name.into(),
            },
        )
    }

    fn ready(id: u64, after_seq: u64) -> In {
        Input::Ready(Ready {
            id,
            after_seq,
            rv: 0,
            room: 100,
        })
    }

    fn read(reply: u32, min_rv: u64, at: Option<u64>) -> In {
        Input::Read {
            min_rv,
            at,
            asked: None,
            reply,
        }
    }

    /// A read of the name `name` in `n` at `at`, through this namespace key (its cover).
    fn read_of(reply: u32, name: &str, at: Option<u64>) -> In {
        let one = Key::new(
            key().resource,
            Scope::Name {
                namespace: Some("n".into()),
                name: name.into(),
            },
        );
        Input::Read {
            min_rv: 0,
            at,
            asked: Some(one),
            reply,
        }
    }

    fn names(objects: &[Arc<Object>]) -> String {
        let names: Vec<&str> = objects.iter().map(|o| o.name()).collect();
        names.join(",")
    }

    fn rvs(events: &[Arc<StoreEvent>]) -> String {
        let rvs: Vec<String> = events.iter().map(|e| e.rv.to_string()).collect();
        rvs.join(",")
    }

    fn msg(m: &ToWatcher) -> String {
        match m {
            ToWatcher::Start(s) => format!(
                "start [{}]@{} replay [{}] seq {}",
                names(&s.initial),
                s.initial_rv,
                rvs(&s.replay),
                s.start_seq
            ),
            ToWatcher::Replay(r) => format!(
                "replay [{}] upto {}{}",
                rvs(&r.events),
                r.upto_seq,
                if r.live { " live" } else { "" }
            ),
            ToWatcher::Expired { requested, oldest } => format!("410 {requested} ({oldest})"),
            ToWatcher::Failed { code, .. } => format!("failed {code}"),
            ToWatcher::Dispatch(e) => format!("event {}", e.rv),
            ToWatcher::Bookmark { rv } => format!("bookmark {rv}"),
            ToWatcher::Close(CloseReason::Draining { rv }) => format!("close draining {rv}"),
            ToWatcher::Close(c) => format!("close {c:?}"),
            ToWatcher::Move(m) => format!("move after {}", m.after_rv),
        }
    }

    fn render(o: &Out) -> String {
        match o {
            Output::ToWatcher { id, msg: m } => format!("w{id}: {}", msg(m)),
            Output::Final { link, msg: m } => format!("{link} last: {}", msg(m)),
            Output::Offer { id, event } => format!("w{id}: offer {}#{}", event.rv, event.seq),
            Output::Bookmark { id, rv } => format!("w{id}: bookmark {rv}"),
            Output::Reply(r, Ok(s)) => format!("reply {r}: [{}]@{}", names(&s.objects), s.rv),
            Output::Reply(r, Err(e)) => format!("reply {r}: {e}"),
            Output::Command(SourceCmd::Probe) => "probe".into(),
            Output::Command(SourceCmd::Replay(c)) => format!("replay {}..{}", c.from, c.to),
            Output::ToFollower(e) => format!("follower {}#{}", e.rv, e.seq),
            Output::FollowerBookmark { seq, rv } => format!("follower bookmark #{seq} {rv}"),
            Output::Move {
                link,
                after_rv,
                object_rv,
            } => format!("{link} moves after {after_rv} (object at {object_rv:?})"),
            Output::HandedOver(h) => format!("handed over {} left {}", h.moved, h.left),
        }
    }

    /// Runs the steps on a new core: each step's outputs, rendered, one line per step.
    fn run(steps: Vec<(u64, In)>) -> Vec<String> {
        let mut core = core();
        steps
            .into_iter()
            .map(|(now, input)| {
                let outs: Vec<String> = core.apply(now, input).iter().map(render).collect();
                outs.join("; ")
            })
            .collect()
    }

    /// A key synced at 10 with `a`@5 and `b`@6, and watcher 1 live from 10.
    fn live_watcher() -> Vec<(u64, In)> {
        vec![
            (0, listed(&[("a", 5), ("b", 6)], 10, false)),
            (1, watch(1, "w1", 10, false)),
            (2, ready(1, 0)),
        ]
    }

    fn with(mut base: Vec<(u64, In)>, more: Vec<(u64, In)>) -> Vec<(u64, In)> {
        base.extend(more);
        base
    }

    #[test]
    fn table() {
        let cases: Vec<Case> = vec![
            (
                "a read before the first list waits for it",
                vec![(0, read(7, 0, None)), (5, listed(&[("a", 5)], 10, false))],
                vec!["", "reply 7: [a]@10"],
            ),
            (
                "a read before the first list fails after the sync timeout",
                vec![(0, read(7, 0, None)), (10_000, Input::Tick)],
                vec!["", "reply 7: the cache for /api/v1/namespaces/n/secrets is not synced yet"],
            ),
            (
                "a watch starts with a replay from the window, and is offered events once live",
                with(live_watcher(), vec![(3, modified("a", 11))]),
                vec!["", "w1: start []@10 replay [] seq 0", "w1: replay [] upto 0 live", "w1: offer 11#1"],
            ),
            (
                "events before the watcher is live come in its next replay, not as offers",
                vec![
                    (0, listed(&[("a", 5)], 10, false)),
                    (1, watch(1, "w1", 0, true)),
                    (2, modified("a", 11)),
                    (3, ready(1, 0)),
                    (4, modified("a", 12)),
                ],
                vec!["", "w1: start [a]@10 replay [] seq 0", "", "w1: replay [11] upto 1 live", "w1: offer 12#2"],
            ),
            (
                "a watch that goes away while it waits for the first list is not started",
                vec![
                    (0, watch(1, "w1", 0, true)),
                    (1, Input::Unsubscribe { id: 1 }),
                    (2, listed(&[("a", 5)], 10, false)),
                    (3, modified("a", 11)),
                ],
                vec!["", "", "", ""],
            ),
            (
                "a full buffer closes the watcher, which gets nothing more",
                with(
                    live_watcher(),
                    vec![(3, modified("a", 11)), (4, Input::Full { id: 1 }), (5, modified("a", 12))],
                ),
                vec![
                    "",
                    "w1: start []@10 replay [] seq 0",
                    "w1: replay [] upto 0 live",
                    "w1: offer 11#1",
                    "w1 last: close TooSlow",
                    "",
                ],
            ),
            (
                // Due a period after going live, in the timer's next 1 s bucket.
                "a live watcher gets a bookmark at the progress a period after going live",
                with(
                    live_watcher(),
                    vec![
                        (500, Input::Progress { rv: 15 }),
                        (1_002, Input::Tick),
                        (2_000, Input::Tick),
                    ],
                ),
                vec!["", "w1: start []@10 replay [] seq 0", "w1: replay [] upto 0 live", "", "", "w1: bookmark 15"],
            ),
            (
                "a read of a newer RV probes, and is served when the probe's list gets there",
                vec![
                    (0, listed(&[("a", 5)], 10, false)),
                    (1, read(7, 20, None)),
                    (2, listed(&[("a", 18)], 20, false)),
                ],
                vec!["", "probe", "reply 7: [a]@20"],
            ),
            (
                "a read of a newer RV fails after the block timeout",
                vec![
                    (0, listed(&[("a", 5)], 10, false)),
                    (1, read(7, 20, None)),
                    (1, Input::Refused(SourceCmd::Probe)),
                    (3_001, Input::Tick),
                ],
                vec!["", "probe", "", "reply 7: Too large resource version: 20, current: 10"],
            ),
            (
                "a read at an exact RV is the state then",
                vec![
                    (0, listed(&[("a", 5)], 10, false)),
                    (1, event(EventType::Added, "b", 11)),
                    (2, event(EventType::Deleted, "a", 12)),
                    (3, read(7, 0, Some(11))),
                    (4, read(8, 0, Some(12))),
                ],
                vec!["", "", "", "reply 7: [a,b]@11", "reply 8: [b]@12"],
            ),
            (
                "a read of a name the key covers holds that name's object alone, now or then",
                vec![
                    (0, listed(&[("a", 5), ("b", 6), ("c", 7)], 10, false)),
                    (1, event(EventType::Deleted, "b", 11)),
                    (2, read_of(7, "b", None)),
                    (3, read_of(8, "b", Some(10))),
                    (4, read_of(9, "c", None)),
                    (5, read_of(10, "x", Some(11))),
                ],
                vec!["", "", "reply 7: []@11", "reply 8: [b]@10", "reply 9: [c]@11", "reply 10: []@11"],
            ),
            (
                "a probe's list that differs enters the window as events, offered to watchers and the follower",
                with(
                    live_watcher(),
                    vec![
                        (3, Input::Follow(Some(1_000))),
                        (4, listed(&[("a", 5), ("b", 14), ("c", 13)], 15, false)),
                    ],
                ),
                vec![
                    "",
                    "w1: start []@10 replay [] seq 0",
                    "w1: replay [] upto 0 live",
                    "",
                    // A seq skipped first: mirrors resynchronise rather than apply guesses.
                    "w1: offer 13#2; follower 13#2; w1: offer 14#3; follower 14#3",
                ],
            ),
            (
                "a list after a gap ends every watch and skips a seq for the mirrors",
                with(
                    live_watcher(),
                    vec![
                        (3, Input::Follow(Some(1_000))),
                        (4, listed(&[("a", 12)], 15, true)),
                        (1_004, Input::Tick),
                    ],
                ),
                vec![
                    "",
                    "w1: start []@10 replay [] seq 0",
                    "w1: replay [] upto 0 live",
                    "",
                    "w1 last: close Resync",
                    "follower bookmark #1 15",
                ],
            ),
            (
                "a watch older than a young key's window asks for a replay, and expires when refused",
                vec![
                    (0, listed(&[("a", 5)], 10, false)),
                    (1, watch(1, "w1", 7, false)),
                    (2, Input::Refused(SourceCmd::Replay(ReplayCmd { from: 7, to: 10, max_events: 8 }))),
                ],
                vec!["", "replay 7..10", "w1 last: 410 7 (11)"],
            ),
            (
                "a backfill that never answers ends its watch with a 410 after its grace",
                vec![
                    (0, listed(&[("a", 5)], 10, false)),
                    (1, watch(1, "w1", 7, false)),
                    (8_000, Input::Tick),
                    (8_001, Input::Tick),
                ],
                vec!["", "replay 7..10", "", "w1 last: 410 7 (11)"],
            ),
            (
                "a backfilled window serves the old watch",
                vec![
                    (0, listed(&[("a", 9)], 10, false)),
                    (1, watch(1, "w1", 7, false)),
                    (
                        2,
                        Input::Replayed {
                            from: 7,
                            replay: Some(Replay {
                                at_from: vec![obj("a", "a", 6)],
                                events: vec![(EventType::Modified, obj("a", "a", 9), 9)],
                            }),
                        },
                    ),
                ],
                vec!["", "replay 7..10", "w1: start []@10 replay [9] seq 0"],
            ),
            (
                "a handover moves the live watchers and counts the others",
                with(
                    live_watcher(),
                    vec![
                        (3, watch(2, "w2", 10, false)),
                        (
                            4,
                            Input::HandOver {
                                only_asked: None,
                                to_synced: true,
                            },
                        ),
                    ],
                ),
                vec![
                    "",
                    "w1: start []@10 replay [] seq 0",
                    "w1: replay [] upto 0 live",
                    "w2: start []@10 replay [] seq 0",
                    "w1 moves after 10 (object at None); handed over 1 left 1",
                ],
            ),
            (
                "a watcher of one object moves with its object's RV",
                vec![
                    (0, listed(&[("a", 5), ("b", 6)], 10, false)),
                    (1, moved_watch(1, "w1", 10, "a", None)),
                    (2, ready(1, 0)),
                    (
                        3,
                        Input::HandOver {
                            only_asked: Some(name_key("a")),
                            to_synced: true,
                        },
                    ),
                ],
                vec![
                    "",
                    "w1: start []@10 replay [] seq 0",
                    "w1: replay [] upto 0 live",
                    "w1 moves after 10 (object at Some(5)); handed over 1 left 0",
                ],
            ),
            (
                "a moved watch whose object did not change starts at the key's progress, no replay",
                vec![
                    (0, listed(&[("a", 5), ("b", 6)], 10, false)),
                    (1, moved_watch(1, "w1", 7, "a", Some(5))),
                ],
                vec!["", "w1: start []@10 replay [] seq 0"],
            ),
            (
                "a moved watch that arrives before the key's list is decided once it is synced",
                vec![
                    (0, moved_watch(1, "w1", 7, "a", Some(5))),
                    (1, listed(&[("a", 5), ("b", 6)], 10, false)),
                ],
                vec!["", "w1: start []@10 replay [] seq 0"],
            ),
            (
                "a moved watch whose object changed since is replayed from where it was left",
                vec![
                    (0, listed(&[("a", 9), ("b", 6)], 10, false)),
                    (1, moved_watch(1, "w1", 7, "a", Some(5))),
                ],
                vec!["", "replay 7..10"],
            ),
            (
                "a moved watch of an object neither key held is replayed (it may have come and gone)",
                vec![
                    (0, listed(&[("b", 6)], 10, false)),
                    (1, moved_watch(1, "w1", 7, "a", None)),
                ],
                vec!["", "replay 7..10"],
            ),
            (
                "a key that stops answers its waits and closes its watchers",
                with(
                    live_watcher(),
                    vec![(3, read(7, 30, None)), (4, Input::Stop)],
                ),
                vec![
                    "",
                    "w1: start []@10 replay [] seq 0",
                    "w1: replay [] upto 0 live",
                    "probe",
                    "w1 last: close KeyStopped; reply 7: the cache for /api/v1/namespaces/n/secrets is shutting down",
                ],
            ),
            (
                "a draining key closes its watchers at its progress",
                with(live_watcher(), vec![(3, Input::Drain)]),
                vec!["", "w1: start []@10 replay [] seq 0", "w1: replay [] upto 0 live", "w1 last: close draining 10"],
            ),
        ];
        let mut wrong = Vec::new();
        for (name, steps, want) in cases {
            let got = run(steps);
            if got != want {
                wrong.push(format!("{name}:\n  got  {got:?}\n  want {want:?}"));
            }
        }
        assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    }

    /// Splitting: a watcher moved back from the namespace key to its own name key, whose
    /// store is its one object (the watch asks for the key itself).
    #[test]
    fn a_name_key_starts_a_watcher_moved_back_from_its_unchanged_object() {
        let moved_back = |object_rv| {
            let Input::Subscribe(mut w) = watch(1, "w1", 7, false) else {
                unreachable!("watch() subscribes")
            };
            w.moved = Some(MovedFrom { object_rv });
            Input::Subscribe(w)
        };
        let mut core = core_of(name_key("a"));
        core.apply(0, listed(&[("a", 5)], 10, false));
        let outs: Vec<String> = core
            .apply(1, moved_back(Some(5)))
            .iter()
            .map(render)
            .collect();
        assert_eq!(outs, vec!["w1: start []@10 replay [] seq 0"]);
        let mut core = core_of(name_key("a"));
        core.apply(0, listed(&[("a", 9)], 10, false));
        let outs: Vec<String> = core
            .apply(1, moved_back(Some(5)))
            .iter()
            .map(render)
            .collect();
        assert_eq!(outs, vec!["replay 7..10"]);
    }

    #[test]
    fn the_status_follows_the_key() {
        let mut core = core();
        for (now, input) in with(live_watcher(), vec![(3, modified("a", 11))]) {
            core.apply(now, input);
        }
        let s = core.status();
        assert_eq!(
            (
                s.progress,
                s.synced,
                s.objects,
                s.watchers,
                s.seq,
                s.window_events
            ),
            (11, true, 2, 1, 1, 1)
        );
        assert_eq!(core.progress(), Some((11, 2)));
        assert_eq!(core.link(1), Some(&"w1"));
        core.apply(4, Input::Unsubscribe { id: 1 });
        assert_eq!((core.status().watchers, core.link(1)), (0, None));
    }
}
