//! One key's fleet task: it feeds `core::role` what happens and performs the effects it
//! returns (lease requests, starting and stopping the upstream read, following the owner),
//! and as a mirror feeds `core::mirror` the owner's messages and hands the CachedObject
//! what that decides. It holds the role's resources; it decides nothing itself.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::{Actor, Recipient};
use async_nats::{Message, Subscriber};
use bytes::Bytes;
use futures::StreamExt;
use tokio::sync::{mpsc, Semaphore};

use super::codec::{self, Opener};
use super::listener::{Listener, Outlet};
use super::{Fleet, View};
use crate::core::key::Key;
use crate::core::mirror::{EpochGate, Gate, Input as MirrorInput, Mirror, Output, Resync, Stamp};
use crate::core::object::{self, Schema, WireEvent};
use crate::core::role::{self, Claimed, Effect, Input, RoleMachine, World};
use crate::core::wire::{Kind, Reassembler};
use crate::feed::{
    FleetInfo, Follower, KeyStatus, RoleKind, SourceCmd, SourceHandle, SourceMsg, TakeSnapshot,
    UpstreamFeed,
};
use crate::metrics as m;

/// What a mirror buffers and applies: an event line, a snapshot `List`, or a replay
/// (event lines), by kind.
type Body = (Kind, Bytes);

/// Snapshot answers one owner may have in flight; further requests wait for a retry.
const ANSWERS_IN_FLIGHT: usize = 2;

/// How soon an epoch the lease stream did not confirm is checked again (the next
/// heartbeat or retried snapshot after that brings the check).
pub(super) const EPOCH_RECHECK_MS: u64 = 500;

/// What the task holds for its current role.
pub(super) enum Held {
    None,
    /// Owner or local: the upstream read (its messages go to the CachedObject).
    Upstream {
        read: SourceHandle,
        /// Owner only: how it publishes, and its request subscriptions.
        owner: Option<Box<Owning>>,
        _gauge: RoleGauge,
    },
    Mirror(Box<Following>),
}

pub(super) struct Owning {
    outlet: Outlet,
    snaps: Option<Subscriber>,
    ctl: Option<Subscriber>,
    answering: Arc<Semaphore>,
}

pub(super) struct Following {
    events: Option<Subscriber>,
    replies: Option<Subscriber>,
    nonce: String,
    request: u64,
    wanted: String,
    snapshot_due: Instant,
    ev_parts: Reassembler,
    snap_parts: Reassembler,
    /// The owner's replica id, from its (authenticated) messages.
    owner: Option<String>,
    _gauge: RoleGauge,
}

/// A new publisher of a key under the outlet's epoch, as the key's follower.
fn publisher(fleet: &Fleet, outlet: &Outlet) -> Follower {
    let listener = Listener::new(outlet.clone(), fleet.cfg.listener_buffer).start();
    Follower {
        link: listener.recipient(),
        bookmark_every: fleet.cfg.heartbeat(),
        epoch: outlet.epoch,
    }
}

/// Counts a key in a role gauge for as long as it lives.
pub(super) struct RoleGauge(&'static str);

impl RoleGauge {
    fn new(name: &'static str) -> Self {
        metrics::gauge!(name).increment(1.0);
        RoleGauge(name)
    }
}

impl Drop for RoleGauge {
    fn drop(&mut self) {
        metrics::gauge!(self.0).decrement(1.0);
    }
}

/// What woke the task.
enum Wake {
    Command(Option<SourceCmd>),
    Event(Option<Message>),
    Reply(Option<Message>),
    SnapshotRequest(Option<Message>),
    Control(Option<Message>),
    Tick(View),
}

/// The next message of an optional subscription (pending forever without).
async fn next_of(sub: Option<&mut Subscriber>) -> Option<Message> {
    match sub {
        Some(s) => s.next().await,
        None => std::future::pending().await,
    }
}

/// The subscriptions the current role reads.
#[allow(clippy::type_complexity)]
fn subscriptions(
    held: &mut Held,
) -> (
    Option<&mut Subscriber>,
    Option<&mut Subscriber>,
    Option<&mut Subscriber>,
    Option<&mut Subscriber>,
) {
    match held {
        Held::Mirror(f) => (f.events.as_mut(), f.replies.as_mut(), None, None),
        Held::Upstream { owner: Some(o), .. } => (None, None, o.snaps.as_mut(), o.ctl.as_mut()),
        _ => (None, None, None, None),
    }
}

/// The CachedObject is gone: the task ends.
struct Gone;

pub(super) struct KeyTask {
    pub(super) fleet: Arc<Fleet>,
    pub(super) key: Key,
    pub(super) token: String,
    pub(super) opener: Opener,
    pub(super) status: Arc<KeyStatus>,
    pub(super) tx: mpsc::Sender<SourceMsg>,
    pub(super) cmds: mpsc::Receiver<SourceCmd>,
    pub(super) snapshots: Recipient<TakeSnapshot>,
    pub(super) role: RoleMachine,
    pub(super) mirror: Mirror<Body>,
    /// Higher epochs wait for the lease stream's word before the mirror sees them.
    pub(super) gate: EpochGate,
    pub(super) held: Held,
}

impl KeyTask {
    /// What the header of the key's objects holds (`core::object`).
    fn schema(&self) -> Schema {
        Schema::of(&self.key.resource.group, &self.key.resource.resource)
    }

    pub(super) async fn run(mut self) {
        let mut inputs = VecDeque::from([Input::Start]);
        let mut view = self.fleet.view();
        'run: loop {
            while let Some(input) = inputs.pop_front() {
                let effects = self.role.apply(self.fleet.now_ms(), input);
                for effect in effects {
                    match self.perform(effect).await {
                        Ok(Some(next)) => inputs.push_back(next),
                        Ok(None) => {}
                        Err(Gone) => break 'run,
                    }
                }
            }
            let wake = {
                let (events, replies, snaps, ctl) = subscriptions(&mut self.held);
                tokio::select! {
                    cmd = self.cmds.recv() => Wake::Command(cmd),
                    msg = next_of(events) => Wake::Event(msg),
                    msg = next_of(replies) => Wake::Reply(msg),
                    msg = next_of(snaps) => Wake::SnapshotRequest(msg),
                    msg = next_of(ctl) => Wake::Control(msg),
                    changed = view.changed() => match changed {
                        Ok(()) => Wake::Tick(view.borrow_and_update().clone()),
                        // Only when the runtime shuts down.
                        Err(_) => Wake::Command(None),
                    },
                }
            };
            let next = match wake {
                Wake::Command(None) => Ok(Some(Input::Stop)),
                Wake::Command(Some(cmd)) => {
                    self.on_command(cmd).await;
                    Ok(None)
                }
                Wake::Event(msg) => self.on_event(msg).await,
                Wake::Reply(msg) => self.on_reply(msg).await,
                Wake::SnapshotRequest(msg) => {
                    self.on_snapshot_request(msg);
                    Ok(None)
                }
                Wake::Control(msg) => {
                    self.on_control(msg);
                    Ok(None)
                }
                Wake::Tick(view) => self.on_tick(view).await,
            };
            match next {
                Ok(Some(input)) => inputs.push_back(input),
                Ok(None) => {}
                Err(Gone) => {
                    // Nobody reads this key any more: release what it holds.
                    inputs.clear();
                    let effects = self.role.apply(self.fleet.now_ms(), Input::Stop);
                    for effect in effects {
                        if let Effect::Release { rev } = effect {
                            self.fleet.leases.release(&self.token, rev).await;
                        }
                    }
                    break;
                }
            }
        }
        self.held = Held::None;
        self.status.update_fleet(|f| *f = FleetInfo::default());
    }

    fn resume_rv(&self) -> Option<u64> {
        use std::sync::atomic::Ordering;
        self.status
            .synced
            .load(Ordering::Relaxed)
            .then(|| self.status.progress.load(Ordering::Relaxed))
    }

    async fn send(&self, msg: SourceMsg) -> Result<(), Gone> {
        self.tx.send(msg).await.map_err(|_| Gone)
    }

    async fn perform(&mut self, effect: Effect) -> Result<Option<Input>, Gone> {
        let fleet = self.fleet.clone();
        match effect {
            Effect::Claim { takeover } => {
                let owner = match &self.held {
                    Held::Mirror(f) => f.owner.clone(),
                    _ => None,
                };
                let claimed = match (takeover, owner) {
                    (true, Some(owner)) => {
                        let c = fleet.leases.take_over(&self.token, &owner).await;
                        if let Claimed::Won { epoch } = c {
                            tracing::warn!(key = %self.key, epoch, dead = %owner, "took the key over from an owner whose connection is gone");
                            metrics::counter!(m::FLEET_OWNERSHIP_CHANGES, "change" => "taken-over")
                                .increment(1);
                        }
                        c
                    }
                    _ => fleet.leases.claim(&self.token).await,
                };
                Ok(Some(Input::Claimed(claimed)))
            }
            Effect::Renew { rev } => Ok(Some(Input::Renewed(
                fleet.leases.renew(&self.token, rev).await,
            ))),
            Effect::Release { rev } => {
                fleet.leases.release(&self.token, rev).await;
                Ok(None)
            }
            Effect::Own { epoch } => self.own(epoch).await.map(|()| None),
            Effect::Reown { epoch } => self.reown(epoch).await.map(|()| None),
            Effect::Follow => self.follow().await.map(|()| None),
            Effect::GoLocal => self.go_local().await.map(|()| None),
            Effect::Exit => Err(Gone),
        }
    }

    /// Starts the upstream read from this replica's own RV (a relist only on 410).
    fn start_upstream(&self) -> (SourceHandle, UpstreamFeed) {
        let (read, events) = self.fleet.upstream.start_at(&self.key, self.resume_rv());
        let feed = UpstreamFeed {
            events,
            commands: read.commands.clone(),
        };
        (read, feed)
    }

    async fn own(&mut self, epoch: u64) -> Result<(), Gone> {
        let fleet = self.fleet.clone();
        self.held = Held::None;
        metrics::counter!(m::FLEET_OWNERSHIP_CHANGES, "change" => "acquired").increment(1);
        tracing::info!(key = %self.key, epoch, "took ownership of the key");
        self.status.update_fleet(|f| {
            f.role = Some(RoleKind::Owner);
            f.owner = fleet.replica.clone();
            f.epoch = epoch;
        });
        let outlet = Outlet {
            client: fleet.client.clone(),
            subject: fleet.subjects.events(&self.token),
            token: self.token.clone(),
            owner: fleet.replica.clone(),
            epoch,
            keyring: self.opener.keyring.clone(),
            signer: fleet.signer(),
            chunk_max: fleet.chunk_max(),
            log_subject: fleet.retain.then(|| fleet.subjects.log(&self.token)),
        };
        let (read, upstream) = self.start_upstream();
        // The publisher follows the key before the key reads upstream: it sees every event
        // of the read.
        self.send(SourceMsg::Follow(Some(publisher(&fleet, &outlet))))
            .await?;
        self.send(SourceMsg::Reads(Some(upstream))).await?;
        let snaps = fleet
            .client
            .subscribe(fleet.subjects.snapshot(&self.token))
            .await
            .ok();
        let ctl = fleet
            .client
            .subscribe(fleet.subjects.control(&self.token))
            .await
            .ok();
        self.held = Held::Upstream {
            read,
            owner: Some(Box::new(Owning {
                outlet,
                snaps,
                ctl,
                answering: Arc::new(Semaphore::new(ANSWERS_IN_FLIGHT)),
            })),
            _gauge: RoleGauge::new(m::FLEET_OWNED_KEYS),
        };
        Ok(())
    }

    /// The lease was created again after aging out: publish under the new epoch (mirrors
    /// resynchronise on it), keep the upstream read.
    async fn reown(&mut self, epoch: u64) -> Result<(), Gone> {
        let fleet = self.fleet.clone();
        let Held::Upstream { owner: Some(o), .. } = &mut self.held else {
            return Ok(());
        };
        tracing::warn!(key = %self.key, epoch, "the key's lease aged out with nobody holding it; created it again");
        metrics::counter!(m::FLEET_OWNERSHIP_CHANGES, "change" => "recreated").increment(1);
        o.outlet.epoch = epoch;
        let follower = publisher(&fleet, &o.outlet);
        self.status.update_fleet(|f| f.epoch = epoch);
        self.send(SourceMsg::Follow(Some(follower))).await
    }

    async fn follow(&mut self) -> Result<(), Gone> {
        let was_owner = matches!(self.held, Held::Upstream { owner: Some(_), .. });
        // Stops the upstream read and the publishing at once.
        self.held = Held::None;
        match self.role.why() {
            Some(role::Why::LeaseLost) if was_owner => {
                tracing::warn!(key = %self.key, "lost the key's lease; stepping down");
                metrics::counter!(m::FLEET_OWNERSHIP_CHANGES, "change" => "lost").increment(1);
            }
            Some(role::Why::HandedOver) if was_owner => {
                tracing::warn!(key = %self.key, "the upstream has failed past owner_cutoff_ms; handing the key to a replica that reaches it");
                metrics::counter!(m::FLEET_OWNERSHIP_CHANGES, "change" => "handed-over")
                    .increment(1);
            }
            _ => {}
        }
        self.status
            .update_fleet(|f| f.role = Some(RoleKind::Mirror));
        self.send(SourceMsg::Follow(None)).await?;
        self.send(SourceMsg::Reads(None)).await?;
        let mut following = Following {
            events: None,
            replies: None,
            nonce: format!("{:016x}", rand::random::<u64>()),
            request: 0,
            wanted: String::new(),
            snapshot_due: Instant::now(),
            ev_parts: Reassembler::new(self.fleet.cfg.max_message_bytes),
            snap_parts: Reassembler::new(self.fleet.cfg.max_message_bytes),
            owner: None,
            _gauge: RoleGauge::new(m::FLEET_MIRRORED_KEYS),
        };
        self.subscribe(&mut following).await;
        self.held = Held::Mirror(Box::new(following));
        self.mirror.restart();
        Ok(())
    }

    /// Subscribes a mirror to the owner's events and to its own snapshot replies (again
    /// after a failure, from the tick).
    async fn subscribe(&self, f: &mut Following) {
        let fleet = &self.fleet;
        if f.events.is_none() {
            match fleet
                .client
                .subscribe(fleet.subjects.events(&self.token))
                .await
            {
                Ok(s) => f.events = Some(s),
                Err(error) => tracing::warn!(key = %self.key, %error, "cannot subscribe; retrying"),
            }
        }
        if f.replies.is_none() {
            match fleet
                .client
                .subscribe(fleet.subjects.replies(&self.token, &f.nonce))
                .await
            {
                Ok(s) => f.replies = Some(s),
                Err(error) => tracing::warn!(key = %self.key, %error, "cannot subscribe; retrying"),
            }
        }
    }

    async fn go_local(&mut self) -> Result<(), Gone> {
        self.held = Held::None;
        tracing::warn!(key = %self.key, "NATS unreachable; watching upstream directly until it is back");
        self.status.update_fleet(|f| f.role = Some(RoleKind::Local));
        let (read, upstream) = self.start_upstream();
        self.send(SourceMsg::Follow(None)).await?;
        self.send(SourceMsg::Reads(Some(upstream))).await?;
        self.held = Held::Upstream {
            read,
            owner: None,
            _gauge: RoleGauge::new(m::FLEET_LOCAL_KEYS),
        };
        Ok(())
    }

    /// A command that reached the fleet source rather than the upstream read (a mirror's,
    /// or one sent while the role changed).
    async fn on_command(&mut self, cmd: SourceCmd) {
        if let Held::Upstream { read, .. } = &self.held {
            let _ = read.commands.try_send(cmd);
            return;
        }
        match cmd {
            SourceCmd::Probe => {
                let subject = self.fleet.subjects.control(&self.token);
                if self
                    .fleet
                    .client
                    .publish(subject, Bytes::new())
                    .await
                    .is_ok()
                {
                    metrics::counter!(m::NATS_OUT).increment(1);
                }
            }
            // A one-off upstream read, as an owner's: a young key's window is extended
            // back on every replica alike.
            SourceCmd::Replay(cmd) => {
                self.fleet
                    .upstream
                    .spawn_replay(&self.key, cmd, self.tx.clone())
            }
        }
    }

    async fn on_tick(&mut self, view: View) -> Result<Option<Input>, Gone> {
        let connected = view.nats_connected;
        let mut owner_gone = false;
        let mut resync = false;
        match &mut self.held {
            Held::Upstream { read, .. } if read.is_finished() => {
                tracing::warn!(key = %self.key, "upstream read ended; contending again");
                return Ok(Some(Input::UpstreamEnded));
            }
            Held::Mirror(f) => {
                owner_gone = f.owner.as_deref().is_some_and(|o| view.gone.contains(o));
                resync = !self.mirror.synced() && Instant::now() >= f.snapshot_due;
            }
            _ => {}
        }
        let unsubscribed =
            matches!(&self.held, Held::Mirror(f) if f.events.is_none() || f.replies.is_none());
        if connected && unsubscribed {
            if let Held::Mirror(mut f) = std::mem::replace(&mut self.held, Held::None) {
                self.subscribe(&mut f).await;
                self.held = Held::Mirror(f);
                resync = true;
            }
        }
        if resync && connected {
            self.request_snapshot().await;
        }
        Ok(Some(Input::Tick(World {
            nats_connected: connected,
            owner_gone,
            upstream_cut_off: view.upstream_cut_off,
            healthy_peer: view.healthy_peer,
            jitter: rand::random::<f64>(),
        })))
    }

    /// Asks the owner for the events after this replica's RV, or a snapshot.
    async fn request_snapshot(&mut self) {
        let resume = self.resume_rv();
        let fleet = self.fleet.clone();
        let Held::Mirror(f) = &mut self.held else {
            return;
        };
        f.request += 1;
        f.wanted = fleet.subjects.reply(&self.token, &f.nonce, f.request);
        f.snap_parts.reset();
        f.snapshot_due =
            Instant::now() + Duration::from_millis(fleet.cfg.snapshot_timeout_ms.max(100));
        // With this replica's RV the owner can answer with just the events after it
        // (failover, a lost event), so clients miss none; else a snapshot.
        let body = match resume {
            Some(rv) => serde_json::json!({ "sinceRv": rv }).to_string(),
            None => "{}".to_string(),
        };
        if fleet
            .client
            .publish_with_reply(
                fleet.subjects.snapshot(&self.token),
                f.wanted.clone(),
                Bytes::from(body),
            )
            .await
            .is_ok()
        {
            metrics::counter!(m::NATS_OUT).increment(1);
        }
    }

    /// Records the owner of an accepted message (for takeover and `/debug/keys`).
    fn note_owner(&mut self, owner: &str) {
        if let Held::Mirror(f) = &mut self.held {
            if f.owner.as_deref() != Some(owner) {
                f.owner = Some(owner.to_string());
            }
        }
        let epoch = self.mirror.epoch();
        let seq = self.mirror.seq().unwrap_or(0);
        self.status.update_fleet(|f| {
            f.owner = owner.to_string();
            f.epoch = epoch;
            f.seq = seq;
        });
    }

    async fn on_event(&mut self, msg: Option<Message>) -> Result<Option<Input>, Gone> {
        let Some(msg) = msg else {
            // The subscription ended (NATS closed it): subscribe again from the tick.
            if let Held::Mirror(f) = &mut self.held {
                f.events = None;
            }
            return Ok(None);
        };
        metrics::counter!(m::NATS_IN).increment(1);
        let Held::Mirror(f) = &mut self.held else {
            return Ok(None);
        };
        let opened = codec::frame(&msg).and_then(|frame| {
            let body = self.opener.body(&frame, &msg, &mut f.ev_parts)?;
            Ok((frame, body))
        });
        let (frame, body) = match opened {
            Ok(x) => x,
            Err(error) => {
                error.count();
                tracing::warn!(key = %self.key, %error, "refused an event message; resynchronising");
                self.mirror.restart();
                self.request_snapshot().await;
                return Ok(None);
            }
        };
        if !self.epoch_confirmed(frame.epoch, &frame.owner).await {
            return Ok(None);
        }
        let stamp = Stamp {
            epoch: frame.epoch,
            seq: frame.seq,
            rv: frame.rv,
        };
        let input = match (frame.kind, body) {
            (Kind::Heartbeat, Some(_)) => MirrorInput::Heartbeat(stamp),
            (Kind::Event, Some(b)) => MirrorInput::Event(stamp, (Kind::Event, b)),
            (_, None) => return Ok(None),
            (other, _) => {
                metrics::counter!(m::FLEET_BAD_MESSAGES).increment(1);
                tracing::warn!(key = %self.key, kind = other.as_str(), "unexpected message on an event subject");
                return Ok(None);
            }
        };
        let outputs = self.mirror.on(self.fleet.now_ms(), input);
        let stale = outputs.iter().any(|o| matches!(o, Output::Stale(_)));
        if !stale {
            self.note_owner(&frame.owner);
        }
        if self.apply(outputs).await? {
            self.request_snapshot().await;
        }
        Ok((!stale).then_some(Input::Heard))
    }

    /// Whether a message of `epoch` from `owner` may reach the mirror: a higher epoch
    /// than the lease stream confirmed is read against the key's lease first
    /// (`core::mirror::EpochGate`); refused ones are counted and dropped.
    async fn epoch_confirmed(&mut self, epoch: u64, owner: &str) -> bool {
        let now = self.fleet.now_ms();
        let confirmed = match self.gate.admit(epoch, now) {
            Gate::Pass => return true,
            Gate::Refuse => false,
            Gate::Check => {
                let lease = self.fleet.leases.current(&self.token).await;
                let read = match &lease {
                    Ok(l) => Ok(l.as_ref().map(|(rev, holder)| (*rev, holder.as_str()))),
                    Err(error) => {
                        tracing::debug!(key = %self.key, %error, "cannot read the lease to confirm an epoch");
                        Err(())
                    }
                };
                let ok = self.gate.settle(epoch, owner, read, self.fleet.now_ms());
                if !ok {
                    tracing::warn!(key = %self.key, epoch, owner, lease = ?lease, "refused messages of an epoch the lease stream does not confirm");
                }
                ok
            }
        };
        if !confirmed {
            metrics::counter!(m::FLEET_REJECTED, "reason" => "unconfirmed-epoch").increment(1);
        }
        confirmed
    }

    async fn on_reply(&mut self, msg: Option<Message>) -> Result<Option<Input>, Gone> {
        let Some(msg) = msg else {
            if let Held::Mirror(f) = &mut self.held {
                f.replies = None;
            }
            return Ok(None);
        };
        metrics::counter!(m::NATS_IN).increment(1);
        let Held::Mirror(f) = &mut self.held else {
            return Ok(None);
        };
        if msg.subject.as_str() != f.wanted {
            return Ok(None);
        }
        if msg.status == Some(async_nats::StatusCode::NO_RESPONDERS) {
            // No owner yet (or it just went): ask again shortly; the role machine claims
            // the key if the silence lasts.
            f.snapshot_due = Instant::now() + Duration::from_millis(500);
            return Ok(None);
        }
        let opened = codec::frame(&msg).and_then(|frame| {
            let body = self.opener.body(&frame, &msg, &mut f.snap_parts)?;
            Ok((frame, body))
        });
        let (frame, body) = match opened {
            Ok(x) => x,
            Err(error) => {
                error.count();
                tracing::warn!(key = %self.key, %error, "refused a snapshot message; asking again");
                f.snapshot_due = Instant::now() + Duration::from_millis(200);
                return Ok(None);
            }
        };
        let body = match (frame.kind, body) {
            (_, None) => return Ok(None),
            (Kind::NotReady, Some(_)) => {
                f.snapshot_due = Instant::now() + Duration::from_millis(200);
                return Ok(None);
            }
            (kind @ (Kind::Snapshot | Kind::Replay), Some(b)) => (kind, b),
            (other, Some(_)) => {
                metrics::counter!(m::FLEET_BAD_MESSAGES).increment(1);
                tracing::warn!(key = %self.key, kind = other.as_str(), "unexpected message in a snapshot reply");
                return Ok(None);
            }
        };
        if !self.epoch_confirmed(frame.epoch, &frame.owner).await {
            if let Held::Mirror(f) = &mut self.held {
                f.snapshot_due = Instant::now() + Duration::from_millis(EPOCH_RECHECK_MS);
            }
            return Ok(None);
        }
        let stamp = Stamp {
            epoch: frame.epoch,
            seq: frame.seq,
            rv: frame.rv,
        };
        let outputs = self
            .mirror
            .on(self.fleet.now_ms(), MirrorInput::Snapshot(stamp, body));
        self.note_owner(&frame.owner);
        if self.apply(outputs).await? {
            self.request_snapshot().await;
        }
        Ok(Some(Input::Heard))
    }

    /// Answers a snapshot request in a task of its own (a large key's snapshot must not
    /// hold up lease renewals), only to the key's own reply space.
    fn on_snapshot_request(&mut self, req: Option<Message>) {
        let Held::Upstream { owner: Some(o), .. } = &mut self.held else {
            return;
        };
        let Some(req) = req else {
            o.snaps = None;
            return;
        };
        metrics::counter!(m::NATS_IN).increment(1);
        let Some(reply) = req.reply else {
            return;
        };
        if !self.fleet.subjects.is_reply_for(&self.token, &reply) {
            metrics::counter!(m::FLEET_REJECTED, "reason" => "reply-subject").increment(1);
            tracing::warn!(key = %self.key, reply = %reply, "refused a snapshot request whose reply subject is outside the key's reply space");
            return;
        }
        let Ok(permit) = o.answering.clone().try_acquire_owned() else {
            tracing::debug!(key = %self.key, "snapshot answers in flight; the requester will ask again");
            return;
        };
        let since = codec::since_of(&req.payload);
        let snapshots = self.snapshots.clone();
        let outlet = o.outlet.clone();
        let key = self.key.to_string();
        actix::spawn(async move {
            let _permit = permit;
            let snap = match tokio::time::timeout(
                Duration::from_secs(2),
                snapshots.send(TakeSnapshot { since }),
            )
            .await
            {
                Ok(Ok(snap)) => snap,
                _ => return,
            };
            let res = match snap {
                Some(snap) => {
                    let (kind, body) = match &snap.replay {
                        Some(events) => (Kind::Replay, codec::encode_replay(events)),
                        None => (Kind::Snapshot, codec::encode_list(&snap)),
                    };
                    outlet.send(&reply, kind, snap.seq, snap.rv, body).await
                }
                None => {
                    outlet
                        .send(&reply, Kind::NotReady, 0, 0, Bytes::new())
                        .await
                }
            };
            if let Err(error) = res {
                tracing::warn!(%key, %error, "cannot send snapshot");
            }
        });
    }

    /// A mirror's freshness probe: the owner lists upstream and heartbeats the progress.
    fn on_control(&mut self, msg: Option<Message>) {
        let Held::Upstream {
            read,
            owner: Some(o),
            ..
        } = &mut self.held
        else {
            return;
        };
        if msg.is_none() {
            o.ctl = None;
            return;
        }
        metrics::counter!(m::NATS_IN).increment(1);
        let _ = read.commands.try_send(SourceCmd::Probe);
    }

    /// Turns mirror decisions into CachedObject messages; `true` when a snapshot must be
    /// requested.
    async fn apply(&mut self, outputs: Vec<Output<Body>>) -> Result<bool, Gone> {
        let mut resync = false;
        for out in outputs {
            let msg = match out {
                Output::Snapshot(stamp, (Kind::Replay, body)) => {
                    // Every event after this replica's RV: apply them in order (the
                    // CachedObject drops what it has), then take the owner's progress.
                    for line in body.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
                        let Ok(ev) = object::parse_line(line, self.schema()) else {
                            metrics::counter!(m::FLEET_BAD_MESSAGES).increment(1);
                            continue;
                        };
                        let WireEvent::Object { kind, object } = ev else {
                            continue;
                        };
                        let rv = object.rv();
                        self.send(SourceMsg::Event { kind, object, rv }).await?;
                    }
                    tracing::debug!(key = %self.key, epoch = stamp.epoch, rv = stamp.rv, "caught up from the owner's window (replay)");
                    SourceMsg::Progress { rv: stamp.rv }
                }
                Output::Apply(stamp, (_, body)) => match object::parse_line(&body, self.schema()) {
                    Ok(WireEvent::Object { kind, object }) => SourceMsg::Event {
                        kind,
                        object,
                        rv: stamp.rv,
                    },
                    Ok(_) => continue,
                    Err(error) => {
                        tracing::warn!(key = %self.key, %error, "undecodable event; resynchronising");
                        metrics::counter!(m::FLEET_BAD_MESSAGES).increment(1);
                        self.mirror.restart();
                        resync = true;
                        continue;
                    }
                },
                Output::Snapshot(stamp, (_, body)) => match object::parse_list(
                    body,
                    self.schema(),
                    &self.key.resource.kind,
                    &self.key.resource.api_version(),
                ) {
                    // The owner's window did not reach back to this replica's RV.
                    Ok((items, _)) => SourceMsg::Listed {
                        items,
                        rv: stamp.rv,
                        gap: true,
                    },
                    Err(error) => {
                        tracing::warn!(key = %self.key, %error, "undecodable snapshot; asking again");
                        metrics::counter!(m::FLEET_BAD_MESSAGES).increment(1);
                        self.mirror.restart();
                        resync = true;
                        continue;
                    }
                },
                Output::Progress(rv) => SourceMsg::Progress { rv },
                Output::Resync(reason) => {
                    let reason = match reason {
                        Resync::Start => "start",
                        Resync::Gap => {
                            metrics::counter!(m::FLEET_GAPS).increment(1);
                            "gap"
                        }
                        Resync::NewEpoch => "new-owner",
                        Resync::Retry => "retry",
                    };
                    tracing::debug!(key = %self.key, reason, "resynchronising from a snapshot");
                    metrics::counter!(m::FLEET_RESYNCS, "reason" => reason).increment(1);
                    resync = true;
                    continue;
                }
                Output::Stale(stamp) => {
                    metrics::counter!(m::FLEET_STALE).increment(1);
                    tracing::debug!(key = %self.key, epoch = stamp.epoch, seq = stamp.seq, "rejected a message from a fenced-off owner");
                    continue;
                }
            };
            self.send(msg).await?;
        }
        Ok(resync)
    }
}
