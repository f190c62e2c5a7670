//! Many replicas, one cache: ownership leases, event fan-out and mirroring over NATS
//! (`docs/nats.md`).
//!
//! Each key a replica caches gets a fleet source ([`FleetSource`]) whose task
//! ([`key_task`]) plays one of three roles, decided by the pure machine in `core::role`:
//!
//! - **owner**: it holds the key's lease ([`leases`]); the KV revision that created it is
//!   its **epoch**. It runs the upstream list+watch, whose messages go straight to the
//!   CachedObject, and attaches a bounded publisher ([`listener`]) that follows the key
//!   like a watcher: every event, published stamped `(epoch, seq, rv)`, and bookmarks
//!   carrying the seq, published as heartbeats. It answers snapshot requests and renews
//!   the lease.
//! - **mirror**: it follows the owner's subject through `core::mirror` (fencing, order,
//!   gaps), resynchronises from a snapshot when needed, and takes the key over when the
//!   owner's connection is gone ([`presence`]) or its lease has expired.
//! - **local**: NATS has been unreachable for `fallback_after_ms`: it watches upstream
//!   directly until NATS is back, then contends again.
//!
//! Fleet-wide interest ([`interest`]) belongs to the Registry; message bodies, seals and
//! snapshot encodings are in [`codec`]; the connection and key ring in [`conn`].

pub mod codec;
pub mod conn;
pub mod interest;
mod key_task;
pub mod leases;
pub mod listener;
pub mod presence;
pub mod resume;
pub mod retain;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::Recipient;
use async_nats::Client;
use tokio::sync::{mpsc, watch};

use crate::config::NatsConfig;
use crate::core::key::Key;
use crate::core::mirror::{EpochGate, Mirror};
use crate::core::retain::Limits;
use crate::core::role::{RoleMachine, Timing};
use crate::core::seal::Keyring;
use crate::core::sign::{Signer, Verifier};
use crate::core::subject::{key_token, Subjects};
use crate::feed::{KeyStatus, SourceFactory, SourceHandle, SourceMsg, TakeSnapshot};
use crate::health::UpstreamHealth;
use crate::metrics as m;
use crate::source::UpstreamSource;

pub use conn::{connect, load_keyring, load_signing, signer_from_file, Error, Result};

/// What every key's fleet source shares: the connection, the lease client, peers'
/// presence, and the upstream it reads as owner or local.
pub struct Fleet {
    client: Client,
    cfg: Arc<NatsConfig>,
    replica: String,
    subjects: Subjects,
    keyring: Option<Arc<Keyring>>,
    /// The fleet's signing key and accepted public keys, when it signs (`core::sign`).
    signing: Option<(Arc<Signer>, Arc<Verifier>)>,
    leases: leases::Leases,
    /// Owners also publish each event on its key's log subject (`core::retain`).
    retain: bool,
    upstream: Arc<UpstreamSource>,
    /// The replica's view of the fleet, renewed every [`TICK`]; its renewal is every key
    /// task's tick.
    view: watch::Receiver<View>,
    started: Instant,
}

/// How often key tasks look at the fleet (renewals, takeovers, handovers, resyncs).
pub const TICK: Duration = Duration::from_millis(100);

/// What a key task's tick reads, computed once per tick for the whole replica: ten
/// thousand keys each locking the peer table and scanning it ten times a second would do
/// the same work ten thousand times.
#[derive(Debug, Clone, Default)]
pub(crate) struct View {
    pub nats_connected: bool,
    pub upstream_cut_off: bool,
    /// A peer announced a working upstream within three beacon periods.
    pub healthy_peer: bool,
    /// Peers whose NATS connection is known to be gone.
    pub gone: Arc<BTreeSet<String>>,
}

impl View {
    fn read(client: &Client, presence: &presence::Presence, health: &UpstreamHealth) -> View {
        View {
            nats_connected: client.connection_state() == async_nats::connection::State::Connected,
            upstream_cut_off: health.cut_off(),
            healthy_peer: presence.healthy_peer(),
            gone: Arc::new(presence.gone()),
        }
    }
}

/// Renews the view every [`TICK`] until every reader is gone. It holds the parts it reads,
/// not the `Fleet`, which owns the receiver.
async fn renew_view(
    tx: watch::Sender<View>,
    client: Client,
    presence: Arc<presence::Presence>,
    health: Arc<UpstreamHealth>,
) {
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if tx.send(View::read(&client, &presence, &health)).is_err() {
            return;
        }
    }
}

impl Fleet {
    pub fn new(
        client: Client,
        cfg: Arc<NatsConfig>,
        replica: String,
        keyring: Option<Arc<Keyring>>,
        signing: Option<(Arc<Signer>, Arc<Verifier>)>,
        upstream: Arc<UpstreamSource>,
        health: Arc<UpstreamHealth>,
    ) -> Result<Arc<Self>> {
        m::describe_fleet();
        let retain = Limits::from_config(&cfg)?;
        let subjects = Subjects::new(&cfg.subject_prefix);
        let retaining = retain.is_some();
        if let Some(limits) = retain {
            tokio::spawn(resume::serve(
                client.clone(),
                subjects.clone(),
                limits.clone(),
            ));
            tokio::spawn(retain::keep(client.clone(), limits, subjects.all_logs()));
        }
        let presence = presence::Presence::start(
            client.clone(),
            subjects.clone(),
            replica.clone(),
            &cfg.inbox_prefix,
            cfg.presence(),
            health.clone(),
            signing.clone(),
        );
        let (view_tx, view) = watch::channel(View::read(&client, &presence, &health));
        tokio::spawn(renew_view(view_tx, client.clone(), presence, health));
        Ok(Arc::new(Fleet {
            leases: leases::Leases::new(client.clone(), cfg.clone(), replica.clone()),
            retain: retaining,
            subjects,
            client,
            cfg,
            replica,
            keyring,
            signing,
            upstream,
            view,
            started: Instant::now(),
        }))
    }

    pub fn replica(&self) -> &str {
        &self.replica
    }

    pub fn client(&self) -> &Client {
        &self.client
    }

    pub fn interest_interval(&self) -> Duration {
        self.cfg.interest_interval()
    }

    /// The interest channel, for the Registry that owns the table.
    pub fn gossip(&self) -> interest::Gossip {
        interest::Gossip::new(
            self.client.clone(),
            self.subjects.clone(),
            self.replica.clone(),
            self.signing.clone(),
        )
    }

    /// The view as of the last tick, and the ticks to come.
    fn view(&self) -> watch::Receiver<View> {
        self.view.clone()
    }

    /// Whether this replica can serve anything fresh: its own upstream works, or NATS
    /// brings it the events of a replica whose upstream does (readiness).
    pub fn serves_fresh(&self) -> bool {
        let v = self.view.borrow();
        !v.upstream_cut_off || (v.nats_connected && v.healthy_peer)
    }

    fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    fn timing(&self) -> Timing {
        Timing {
            lease_ttl_ms: self.cfg.lease_ttl().as_millis() as u64,
            heartbeat_ms: self.cfg.heartbeat().as_millis() as u64,
            fallback_after_ms: self.cfg.fallback_after_ms,
            cutoff_ms: self.cfg.owner_cutoff_ms,
        }
    }

    fn chunk_max(&self) -> usize {
        if self.cfg.max_chunk_bytes > 0 {
            return self.cfg.max_chunk_bytes;
        }
        let max = match self.client.server_info().max_payload {
            0 => 1024 * 1024,
            n => n,
        };
        // Room for headers (epoch, seq, rv, owner, chunk, key id) and the AEAD overhead.
        max.saturating_sub(8 * 1024).max(1024)
    }

    fn signer(&self) -> Option<Arc<Signer>> {
        self.signing.as_ref().map(|(s, _)| s.clone())
    }

    fn keyring_for(&self, key: &Key) -> Option<Arc<Keyring>> {
        self.cfg
            .encrypt_resources
            .iter()
            .any(|r| r == &key.resource.resource)
            .then(|| self.keyring.clone())
            .flatten()
    }
}

/// The [`SourceFactory`] of a replica in a fleet.
pub struct FleetSource(pub Arc<Fleet>);

impl SourceFactory for FleetSource {
    fn start(
        &self,
        key: &Key,
        status: &Arc<KeyStatus>,
        snapshots: Recipient<TakeSnapshot>,
    ) -> (SourceHandle, mpsc::Receiver<SourceMsg>) {
        let (tx, events) = mpsc::channel(64);
        let (commands, cmds) = mpsc::channel(4);
        let fleet = self.0.clone();
        let stale_after = 2 * fleet.cfg.lease_ttl().as_millis() as u64;
        let token = key_token(key);
        let task = key_task::KeyTask {
            opener: codec::Opener {
                token: token.clone(),
                keyring: fleet.keyring_for(key),
                verifier: fleet.signing.as_ref().map(|(_, v)| v.clone()),
            },
            token,
            role: RoleMachine::new(fleet.timing()),
            mirror: Mirror::new(stale_after, fleet.cfg.mirror_buffer),
            gate: EpochGate::new(key_task::EPOCH_RECHECK_MS),
            fleet,
            key: key.clone(),
            status: status.clone(),
            tx,
            cmds,
            snapshots,
            held: key_task::Held::None,
        };
        // On the arbiter (spawn_local): an owner starts its Listener actor from this task.
        let handle = actix::spawn(task.run());
        (SourceHandle::graceful(commands, handle), events)
    }

    fn count(
        &self,
        key: &Key,
        names_up_to: usize,
    ) -> futures::future::BoxFuture<'static, Option<crate::feed::Counted>> {
        self.0.upstream.count(key, names_up_to)
    }
}
