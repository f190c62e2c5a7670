//! One key's cache as an actor: it owns a [`KeyCore`] (the store, the event window, the
//! watcher table and every decision about them, in `key_core`) and carries out what the
//! core says — messages to watchers, replies to reads, commands to its source, events and
//! bookmarks to its follower (the fleet's publisher, which the fleet source attaches while
//! this replica owns the key) — feeding back what happened to them. It knows no fleet
//! roles: its source says where its events come from (`SourceMsg::Reads`) and who follows
//! it (`SourceMsg::Follow`). It is the only writer of
//! its store, as kube-rs's reflector `Writer`, and the only place the key's links live.

mod key_core;
mod messages;

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use tokio::sync::oneshot;
use tokio_stream::wrappers::ReceiverStream;

pub use self::key_core::{Error, HandedOver, Result, Snapshot};
use self::key_core::{Input, KeyCore, Output, Settings, Status, Watch};
pub use self::messages::{Drain, HandOver, Progress, Read, Stop, TryRead};
use crate::config::CacheConfig;
use crate::core::key::Key;
use crate::feed::{
    Follow, Follower, KeyStatus, OwnerSnapshot, SourceCmd, SourceFactory, SourceHandle, SourceMsg,
    TakeSnapshot, UpstreamFeed,
};
use crate::metrics as m;
use crate::watch_feed::{KeyLink, Refused, Subscribe, ToKey, ToWatcher, WatcherLink};

type Reply = oneshot::Sender<Result<Snapshot>>;

pub struct CachedObject {
    core: KeyCore<WatcherLink, Reply>,
    sources: Arc<dyn SourceFactory>,
    source: Option<SourceHandle>,
    status: Arc<KeyStatus>,
    /// What the gauges and `status` last showed of the core (they move by differences).
    shown: Status,
    epoch: Instant,
    labels: [(&'static str, String); 2],
    /// The key's follower: the fleet's publisher while this replica owns the key.
    follower: Option<Recipient<Follow>>,
    /// Set while this replica reads the key upstream as its fleet owner (or locally): the
    /// commands go straight to that read instead of through the fleet source.
    upstream_commands: Option<tokio::sync::mpsc::Sender<SourceCmd>>,
}

impl CachedObject {
    pub fn new(
        key: Key,
        cfg: Arc<CacheConfig>,
        sources: Arc<dyn SourceFactory>,
        status: Arc<KeyStatus>,
    ) -> Self {
        let labels = [
            ("group", key.resource.group.clone()),
            ("resource", key.resource.resource.clone()),
        ];
        let core = KeyCore::new(key, Settings::of(&cfg));
        CachedObject {
            shown: core.status(),
            core,
            sources,
            source: None,
            status,
            epoch: Instant::now(),
            labels,
            follower: None,
            upstream_commands: None,
        }
    }

    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    /// Feeds the core one input and carries out what it says, with the inputs that
    /// carrying out gives back (a full buffer, a refused command), in order; `to` is the
    /// key watchers move to, for a handover.
    fn run(&mut self, input: Input<WatcherLink, Reply>, to: Option<&KeyLink>) -> HandedOver {
        let mut handed = HandedOver::default();
        // The inputs carrying out gives back; empty (no allocation) for nearly every event.
        let mut inputs = VecDeque::new();
        let mut next = Some(input);
        while let Some(input) = next.take().or_else(|| inputs.pop_front()) {
            let now = self.now_ms();
            for output in self.core.apply(now, input) {
                match output {
                    Output::ToWatcher { id, msg } => {
                        if let Some(link) = self.core.link(id) {
                            link.do_send(msg);
                        }
                    }
                    Output::Final { link, msg } => link.do_send(msg),
                    Output::Offer { id, event } => {
                        let Some(link) = self.core.link(id) else {
                            continue;
                        };
                        // A closed one is stopping: its Unsubscribe is on the way.
                        if let Err(Refused::Full) = link.offer(event) {
                            inputs.push_back(Input::Full { id });
                        }
                    }
                    Output::Bookmark { id, rv } => {
                        if let Some(link) = self.core.link(id) {
                            link.offer_bookmark(rv);
                        }
                    }
                    Output::Reply(reply, result) => {
                        let _ = reply.send(result);
                    }
                    Output::Command(cmd) => {
                        if !self.command(cmd) {
                            inputs.push_back(Input::Refused(cmd));
                        } else if cmd == SourceCmd::Probe {
                            metrics::counter!(m::PROBES, &self.labels).increment(1);
                        }
                    }
                    Output::ToFollower(event) => self.to_follower(Follow::Event(event)),
                    Output::FollowerBookmark { seq, rv } => {
                        self.to_follower(Follow::Bookmark { seq, rv })
                    }
                    Output::Move {
                        link,
                        after_rv,
                        object_rv,
                    } => match to {
                        Some(key_link) => link.do_send(ToWatcher::Move(crate::watch_feed::Move {
                            link: key_link.clone(),
                            after_rv,
                            object_rv,
                        })),
                        // Only a handover moves watchers, and it names where to.
                        None => debug_assert!(false, "a move without a handover"),
                    },
                    Output::HandedOver(h) => handed = h,
                }
            }
        }
        self.show_status();
        handed
    }

    fn to_follower(&self, msg: Follow) {
        let Some(follower) = &self.follower else {
            return;
        };
        let event = matches!(msg, Follow::Event(_));
        // A bookmark lost to a full queue is followed by the next one.
        if let (true, Err(SendError::Full(_))) = (event, follower.try_send(msg)) {
            metrics::counter!(m::FLEET_LISTENER_DROPS).increment(1);
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

    /// Shows the core's state to the registry and `/debug/keys` (`KeyStatus`) and moves
    /// the gauges by what changed.
    fn show_status(&mut self) {
        let now = self.core.status();
        let was = std::mem::replace(&mut self.shown, now);
        let s = &self.status;
        s.progress.store(now.progress, Ordering::Relaxed);
        s.replayable_from
            .store(now.replayable_from, Ordering::Relaxed);
        s.objects.store(now.objects, Ordering::Relaxed);
        s.watchers.store(now.watchers, Ordering::Relaxed);
        if now.synced && !was.synced {
            s.synced.store(true, Ordering::Relaxed);
            metrics::gauge!(m::SYNCED_KEYS).increment(1.0);
        }
        if now.objects != was.objects {
            metrics::gauge!(m::CACHED_OBJECTS).increment(now.objects as f64 - was.objects as f64);
        }
        if now.window_events != was.window_events {
            metrics::gauge!(m::WINDOW_EVENTS)
                .increment(now.window_events as f64 - was.window_events as f64);
        }
        if self.follower.is_some() && now.seq != was.seq {
            s.update_fleet(|f| f.seq = now.seq);
        }
    }

    /// A follower attached (this replica now owns the key) or detached.
    fn on_follow(&mut self, follower: Option<Follower>) {
        let every = follower
            .as_ref()
            .map(|f| f.bookmark_every.as_millis() as u64);
        if let Some(f) = &follower {
            let seq = self.core.status().seq;
            tracing::info!(key = %self.core.key(), epoch = f.epoch, seq, "publishing the key's events as its owner");
            self.status.update_fleet(|i| i.seq = seq);
        }
        self.follower = follower.map(|f| f.link);
        self.run(Input::Follow(every), None);
    }

    /// Reads an upstream read's messages directly (they end when the fleet source stops it).
    fn read_upstream(&mut self, upstream: UpstreamFeed, ctx: &mut Context<Self>) {
        self.upstream_commands = Some(upstream.commands);
        ctx.add_stream(ReceiverStream::new(upstream.events));
    }
}

/// A list of at least this many objects leaves enough freed memory behind to trim.
const LARGE_LIST: usize = 10_000;

impl Actor for CachedObject {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        metrics::gauge!(m::CACHED_KEYS).increment(1.0);
        let (handle, events) =
            self.sources
                .start(self.core.key(), &self.status, ctx.address().recipient());
        self.source = Some(handle);
        ctx.add_stream(ReceiverStream::new(events));
        ctx.run_interval(Duration::from_millis(250), |act, _| {
            act.run(Input::Tick, None);
        });
    }

    fn stopped(&mut self, _ctx: &mut Self::Context) {
        self.run(Input::Stop, None);
        metrics::gauge!(m::CACHED_KEYS).decrement(1.0);
        if self.shown.synced {
            metrics::gauge!(m::SYNCED_KEYS).decrement(1.0);
        }
        metrics::gauge!(m::CACHED_OBJECTS).decrement(self.shown.objects as f64);
        metrics::gauge!(m::WINDOW_EVENTS).decrement(self.shown.window_events as f64);
        // Dropping the handle aborts the source task (and its upstream watch).
        self.source = None;
        tracing::debug!(key = %self.core.key(), "key stopped");
    }
}

impl StreamHandler<SourceMsg> for CachedObject {
    fn handle(&mut self, msg: SourceMsg, ctx: &mut Self::Context) {
        match msg {
            SourceMsg::Listed { items, rv, gap } => {
                let large = items.len() >= LARGE_LIST;
                self.run(Input::Listed { items, rv, gap }, None);
                if large {
                    // The list's vector and the objects it replaced are freed: return the holes.
                    crate::memory::release_freed();
                }
            }
            SourceMsg::Event { kind, object, rv } => {
                self.run(Input::Event { kind, object, rv }, None);
            }
            SourceMsg::Progress { rv } => {
                self.run(Input::Progress { rv }, None);
            }
            SourceMsg::Replayed { from, replay } => {
                self.run(Input::Replayed { from, replay }, None);
            }
            SourceMsg::Follow(follower) => self.on_follow(follower),
            SourceMsg::Reads(Some(upstream)) => self.read_upstream(upstream, ctx),
            // The source's own messages from now on; its upstream read, if any, is stopped.
            SourceMsg::Reads(None) => self.upstream_commands = None,
            SourceMsg::Unhealthy { error } => {
                // Reads keep being served from what is cached; a probe in flight is lost.
                self.run(Input::SourceUnhealthy, None);
                tracing::debug!(key = %self.core.key(), %error, "source unhealthy");
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
        self.core.owner_snapshot(msg.since)
    }
}

impl Handler<Read> for CachedObject {
    type Result = ResponseFuture<Result<Snapshot>>;

    fn handle(&mut self, msg: Read, _ctx: &mut Self::Context) -> Self::Result {
        let (reply, rx) = oneshot::channel();
        self.run(
            Input::Read {
                min_rv: msg.min_rv,
                at: msg.at,
                asked: msg.asked,
                reply,
            },
            None,
        );
        let key = self.core.key().to_string();
        Box::pin(async move { rx.await.unwrap_or(Err(Error::Stopping { key })) })
    }
}

impl Handler<TryRead> for CachedObject {
    type Result = Option<Result<Snapshot>>;

    fn handle(&mut self, msg: TryRead, _ctx: &mut Self::Context) -> Self::Result {
        self.core.try_read(msg.min_rv, msg.at, msg.asked.as_ref())
    }
}

impl Handler<Progress> for CachedObject {
    type Result = Option<(u64, usize)>;

    fn handle(&mut self, _msg: Progress, _ctx: &mut Self::Context) -> Self::Result {
        self.core.progress()
    }
}

impl Handler<ToKey> for CachedObject {
    type Result = ();

    fn handle(&mut self, msg: ToKey, _ctx: &mut Self::Context) {
        let input = match msg {
            ToKey::Subscribe(sub) => Input::Subscribe(self.watch(sub)),
            ToKey::Ready(ready) => Input::Ready(ready),
            ToKey::Unsubscribe { id } => Input::Unsubscribe { id },
        };
        self.run(input, None);
    }
}

impl CachedObject {
    /// A subscription as the core takes it: its deadline on the key's clock.
    fn watch(&self, sub: Subscribe) -> Watch<WatcherLink> {
        let now = self.now_ms();
        Watch {
            id: sub.id,
            link: sub.link,
            plan: sub.plan,
            allow_bookmarks: sub.allow_bookmarks,
            deadline_ms: sub
                .deadline
                .map(|d| now + d.saturating_duration_since(Instant::now()).as_millis() as u64),
            asked: sub.asked,
            moved: sub.moved,
        }
    }
}

impl Handler<HandOver> for CachedObject {
    type Result = HandedOver;

    fn handle(&mut self, msg: HandOver, _ctx: &mut Self::Context) -> HandedOver {
        let to_synced = msg.to_status.synced.load(Ordering::Relaxed);
        let input = Input::HandOver {
            only_asked: msg.only_asked.clone(),
            to_synced,
        };
        let handed = self.run(input, Some(&msg.link));
        if handed.moved > 0 {
            tracing::info!(key = %self.core.key(), to = %msg.link.key, moved = handed.moved, left = handed.left, "watchers handed over");
        }
        handed
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
        self.run(Input::Drain, None);
    }
}
