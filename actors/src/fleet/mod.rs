//! Many replicas, one cache: ownership leases, event fan-out and mirroring over NATS
//! (`docs/nats.md`).
//!
//! Each key a replica caches gets a fleet source ([`FleetSource`]) whose task
//! ([`key_task`]) plays one of three roles, decided by the pure machine in `core::role`:
//!
//! - **owner**: it holds the key's lease ([`leases`]); the KV revision that created it is
//!   its **epoch**. It runs the upstream list+watch, whose messages go straight to the
//!   CachedObject, which publishes every event through a bounded `Listener` stamped
//!   `(epoch, seq, rv)`, plus heartbeats. It answers snapshot requests and renews the lease.
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
pub mod presence;

use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::Recipient;
use async_nats::Client;
use tokio::sync::mpsc;

use crate::config::NatsConfig;
use crate::core::key::Key;
use crate::core::mirror::Mirror;
use crate::core::role::{RoleMachine, Timing};
use crate::core::seal::Keyring;
use crate::core::subject::{key_token, Subjects};
use crate::feed::{KeyStatus, SourceFactory, SourceHandle, SourceMsg, TakeSnapshot};
use crate::health::UpstreamHealth;
use crate::metrics as m;
use crate::source::UpstreamSource;

pub use conn::{connect, load_keyring, Error, Result};

/// What every key's fleet source shares: the connection, the lease client, peers'
/// presence, and the upstream it reads as owner or local.
pub struct Fleet {
    client: Client,
    cfg: Arc<NatsConfig>,
    replica: String,
    subjects: Subjects,
    keyring: Option<Arc<Keyring>>,
    leases: leases::Leases,
    presence: Arc<presence::Presence>,
    health: Arc<UpstreamHealth>,
    upstream: Arc<UpstreamSource>,
    started: Instant,
}

impl Fleet {
    pub fn new(
        client: Client,
        cfg: Arc<NatsConfig>,
        replica: String,
        keyring: Option<Arc<Keyring>>,
        upstream: Arc<UpstreamSource>,
        health: Arc<UpstreamHealth>,
    ) -> Arc<Self> {
        m::describe_fleet();
        let subjects = Subjects::new(&cfg.subject_prefix);
        let presence = presence::Presence::start(
            client.clone(),
            subjects.clone(),
            replica.clone(),
            &cfg.inbox_prefix,
            cfg.presence(),
            health.clone(),
        );
        Arc::new(Fleet {
            leases: leases::Leases::new(client.clone(), cfg.clone(), replica.clone()),
            subjects,
            client,
            cfg,
            replica,
            keyring,
            presence,
            health,
            upstream,
            started: Instant::now(),
        })
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
        )
    }

    fn nats_connected(&self) -> bool {
        self.client.connection_state() == async_nats::connection::State::Connected
    }

    /// Whether this replica can serve anything fresh: its own upstream works, or NATS
    /// brings it the events of a replica whose upstream does (readiness).
    pub fn serves_fresh(&self) -> bool {
        !self.health.cut_off() || (self.nats_connected() && self.presence.healthy_peer())
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
            },
            token,
            role: RoleMachine::new(fleet.timing()),
            mirror: Mirror::new(stale_after, fleet.cfg.mirror_buffer),
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
}
