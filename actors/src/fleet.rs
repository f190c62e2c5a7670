//! Many replicas, one cache: ownership leases, event fan-out and mirroring over NATS.
//!
//! Each key a replica caches gets a fleet source (a [`SourceFactory`]) that plays one of
//! three roles, switching as the fleet changes:
//!
//! - **owner**: it created the key's lease in the JetStream KV bucket (`create` succeeds
//!   for one replica only); the KV revision of that create is its **epoch**. It runs the
//!   upstream list+watch (resuming from the key's RV), and its CachedObject publishes every
//!   event through a bounded [`Listener`] stamped `(epoch, seq, rv)`, plus heartbeats. It
//!   answers snapshot requests and renews the lease with `update(revision)` every third
//!   of the TTL; a renewal refused because the revision moved means another replica took
//!   over (this one was paused or cut off), and it steps down at once.
//! - **mirror**: it follows the owner's subject through [`Mirror`] (fencing, order, gaps),
//!   resynchronises from a snapshot when needed, and, when the owner falls silent, tries
//!   `create` every third of the TTL (jittered) until the dead owner's lease expires.
//! - **local**: NATS has been unreachable for `fallback_after_ms`: watch upstream directly
//!   until NATS is back, then contend again. Clients keep being served throughout.
//!
//! The CachedObject cannot tell the roles apart beyond `SourceMsg::Role`: every role feeds
//! it the same lists, events and progress, and its RV rules drop anything it already has.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_nats::{Client, ConnectOptions, Message, Subscriber};
use base64::Engine;
use bytes::Bytes;
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use thiserror::Error;
use tokio::sync::{mpsc, oneshot};

use crate::cached_object::{FleetInfo, KeyStatus};
use crate::config::NatsConfig;
use crate::core::event::StoreEvent;
use crate::core::interest::Interest;
use crate::core::key::Key;
use crate::core::lease;
use crate::core::mirror::{Input, Mirror, Output, Resync, Stamp};
use crate::core::object::{self, Schema, WireEvent};
use crate::core::seal::{self, Keyring};
use crate::core::subject::{key_token, Subjects};
use crate::core::wire::{self, Frame, Kind, Reassembler};
use crate::listener::{Listener, Outlet};
use crate::metrics as m;
use crate::source::{
    OwnerSnapshot, Role, SourceCmd, SourceFactory, SourceHandle, SourceMsg, UpstreamSource,
};
use actix::Actor;

#[derive(Debug, Error)]
pub enum Error {
    #[error("cannot read {what} {path}: {source}")]
    File {
        what: &'static str,
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("encryption key {id:?} in {path} is not base64: {source}")]
    KeyEncoding {
        id: String,
        path: String,
        #[source]
        source: base64::DecodeError,
    },
    #[error(transparent)]
    Keyring(#[from] seal::Error),
    #[error("with --nats, objects of {0:?} are sealed on NATS: set [nats] encryption_keys and encryption_active_key (or remove it from encrypt_resources)")]
    NoEncryptionKey(String),
    #[error("cannot connect to NATS at {url}: {source}")]
    Connect {
        url: String,
        #[source]
        source: async_nats::ConnectError,
    },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Connects to NATS with the configured credentials. The client connects (and reconnects)
/// in the background, so a replica starts, and serves, while NATS is down.
pub async fn connect(cfg: &NatsConfig, url: &str, replica: &str) -> Result<Client> {
    let read = |what: &'static str, path: &str| {
        std::fs::read_to_string(path).map_err(|source| Error::File {
            what,
            path: path.to_string(),
            source,
        })
    };
    let mut opts = ConnectOptions::new()
        .name(format!("kcache/{replica}"))
        .retry_on_initial_connect()
        .max_reconnects(None)
        .connection_timeout(Duration::from_secs(3))
        .event_callback(|event| async move {
            match event {
                async_nats::Event::Connected => {
                    metrics::gauge!(m::NATS_CONNECTED).set(1.0);
                    metrics::counter!(m::NATS_RECONNECTS).increment(1);
                    tracing::info!("connected to NATS");
                }
                async_nats::Event::Disconnected => {
                    metrics::gauge!(m::NATS_CONNECTED).set(0.0);
                    tracing::warn!("disconnected from NATS; reconnecting");
                }
                other => tracing::info!(event = %other, "NATS event"),
            }
        });
    let password = match (&cfg.password, &cfg.password_file) {
        (Some(p), _) => Some(p.clone()),
        // A Secret mounted as a file ends in a newline when written by hand.
        (None, Some(path)) => Some(
            read("NATS password file", path)?
                .trim_end_matches(['\r', '\n'])
                .to_string(),
        ),
        (None, None) => None,
    };
    if let (Some(user), Some(password)) = (&cfg.user, password) {
        opts = opts.user_and_password(user.clone(), password);
    }
    if let Some(path) = &cfg.token_file {
        opts = opts.token(read("NATS token file", path)?.trim().to_string());
    }
    if let Some(path) = &cfg.nkey_seed_file {
        opts = opts.nkey(read("NATS nkey seed file", path)?.trim().to_string());
    }
    if let Some(path) = &cfg.creds_file {
        opts = opts
            .credentials_file(path)
            .await
            .map_err(|source| Error::File {
                what: "NATS credentials file",
                path: path.clone(),
                source,
            })?;
    }
    if let Some(ca) = &cfg.tls_ca_file {
        opts = opts.add_root_certificates(ca.into()).require_tls(true);
    }
    if let (Some(cert), Some(key)) = (&cfg.tls_cert_file, &cfg.tls_key_file) {
        opts = opts.add_client_certificate(cert.into(), key.into());
    }
    if cfg.require_tls {
        opts = opts.require_tls(true);
    }
    metrics::gauge!(m::NATS_CONNECTED).set(0.0);
    opts.connect(url).await.map_err(|source| Error::Connect {
        url: url.to_string(),
        source,
    })
}

/// The key ring from `[nats] encryption_keys`; an error when something must be sealed and
/// there is no key (never fall back to plaintext).
pub fn load_keyring(cfg: &NatsConfig) -> Result<Option<Arc<Keyring>>> {
    if cfg.encryption_keys.is_empty() {
        return match cfg.encrypt_resources.first() {
            Some(r) => Err(Error::NoEncryptionKey(r.clone())),
            None => Ok(None),
        };
    }
    let mut keys = Vec::new();
    for k in &cfg.encryption_keys {
        let text = std::fs::read_to_string(&k.file).map_err(|source| Error::File {
            what: "encryption key file",
            path: k.file.clone(),
            source,
        })?;
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(text.trim())
            .map_err(|source| Error::KeyEncoding {
                id: k.id.clone(),
                path: k.file.clone(),
                source,
            })?;
        keys.push((k.id.clone(), bytes));
    }
    let active = cfg
        .encryption_active_key
        .clone()
        .unwrap_or_else(|| cfg.encryption_keys[0].id.clone());
    Ok(Some(Arc::new(Keyring::new(keys, &active)?)))
}

/// What every key's fleet source shares: the connection, the lease bucket, the interest
/// table and the upstream it falls back to.
pub struct Fleet {
    client: Client,
    leases_ready: std::sync::atomic::AtomicBool,
    cfg: Arc<NatsConfig>,
    replica: String,
    subjects: Subjects,
    keyring: Option<Arc<Keyring>>,
    interest: Mutex<Interest>,
    upstream: Arc<UpstreamSource>,
    started: Instant,
}

#[derive(Serialize, Deserialize)]
struct InterestMsg {
    replica: String,
    /// `[token, refcount]` pairs; a replica may split its keys over several messages.
    keys: Vec<(String, u64)>,
}

impl Fleet {
    pub fn new(
        client: Client,
        cfg: Arc<NatsConfig>,
        replica: String,
        keyring: Option<Arc<Keyring>>,
        upstream: Arc<UpstreamSource>,
    ) -> Arc<Self> {
        let fleet = Arc::new(Fleet {
            subjects: Subjects::new(&cfg.subject_prefix),
            client,
            leases_ready: std::sync::atomic::AtomicBool::new(false),
            cfg,
            replica,
            keyring,
            interest: Mutex::new(Interest::default()),
            upstream,
            started: Instant::now(),
        });
        m::describe_fleet();
        tokio::spawn(fleet.clone().follow_interest());
        fleet
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

    fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    fn interest_ttl_ms(&self) -> u64 {
        3 * self.cfg.interest_interval().as_millis() as u64
    }

    /// The refcount other replicas hold on a key (the owner keeps it while this is > 0).
    pub fn others_interest(&self, token: &str) -> u64 {
        let now = self.now_ms();
        let ttl = self.interest_ttl_ms();
        self.interest
            .lock()
            .map(|i| i.others(token, &self.replica, now, ttl))
            .unwrap_or(0)
    }

    /// The fleet's refcount of a key.
    pub fn fleet_interest(&self, token: &str) -> u64 {
        let now = self.now_ms();
        let ttl = self.interest_ttl_ms();
        self.interest
            .lock()
            .map(|i| i.total(token, now, ttl))
            .unwrap_or(0)
    }

    /// Publishes this replica's refcounts (the registry calls this every interval).
    pub async fn publish_interest(&self, keys: Vec<(String, u64)>) {
        {
            let now = self.now_ms();
            if let Ok(mut i) = self.interest.lock() {
                for (t, n) in &keys {
                    i.record(&self.replica, t, *n, now);
                }
            }
        }
        // Batches well under any max_payload.
        for batch in keys.chunks(2_000) {
            let msg = InterestMsg {
                replica: self.replica.clone(),
                keys: batch.to_vec(),
            };
            let Ok(body) = serde_json::to_vec(&msg) else {
                continue;
            };
            let subject = self.subjects.interest(&self.replica);
            if self.client.publish(subject, body.into()).await.is_ok() {
                metrics::counter!(m::NATS_OUT).increment(1);
            }
        }
    }

    async fn follow_interest(self: Arc<Self>) {
        let mut sub = loop {
            match self.client.subscribe(self.subjects.all_interest()).await {
                Ok(s) => break s,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot subscribe to fleet interest; retrying");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        };
        let mut expire = tokio::time::interval(self.cfg.interest_interval());
        loop {
            tokio::select! {
                msg = sub.next() => {
                    let Some(msg) = msg else { return };
                    metrics::counter!(m::NATS_IN).increment(1);
                    let Ok(im) = serde_json::from_slice::<InterestMsg>(&msg.payload) else {
                        metrics::counter!(m::FLEET_BAD_MESSAGES).increment(1);
                        continue;
                    };
                    if im.replica == self.replica {
                        continue;
                    }
                    let now = self.now_ms();
                    if let Ok(mut i) = self.interest.lock() {
                        for (t, n) in im.keys {
                            i.record(&im.replica, &t, n, now);
                        }
                    }
                }
                _ = expire.tick() => {
                    let now = self.now_ms();
                    let ttl = self.interest_ttl_ms();
                    if let Ok(mut i) = self.interest.lock() {
                        i.expire(now, ttl);
                    }
                }
            }
        }
    }

    /// A JetStream API request with a deadline; the answer's body.
    async fn js_request(
        &self,
        subject: String,
        headers: Option<async_nats::HeaderMap>,
        body: Bytes,
    ) -> Result<Bytes, String> {
        let req = async {
            match headers {
                Some(h) => self.client.request_with_headers(subject, h, body).await,
                None => self.client.request(subject, body).await,
            }
        };
        match tokio::time::timeout(Duration::from_secs(2), req).await {
            Ok(Ok(msg)) => Ok(msg.payload),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err("timed out".into()),
        }
    }

    /// Creates the lease stream once (again after an error: the server may have lost it).
    async fn ensure_leases(&self) -> Result<(), String> {
        if self.leases_ready.load(std::sync::atomic::Ordering::Relaxed) {
            return Ok(());
        }
        let bucket = &self.cfg.lease_bucket;
        let config = lease::stream_config(
            bucket,
            self.cfg.lease_ttl().as_millis() as u64,
            self.cfg.lease_replicas,
        );
        let subject = format!("$JS.API.STREAM.CREATE.{}", lease::stream_name(bucket));
        let body = self
            .js_request(subject, None, Bytes::from(config.to_string()))
            .await?;
        match lease::api_result(&body) {
            Ok(()) => {}
            // It exists already (another replica made it first).
            Err(e) if e.err_code == lease::STREAM_NAME_IN_USE => {}
            Err(e) => return Err(format!("creating the lease stream: {}", e.description)),
        }
        self.leases_ready
            .store(true, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }

    /// Compare-and-set write of this replica's lease on `token`.
    async fn write_lease(&self, token: &str, expected: u64) -> Result<lease::Ack, String> {
        self.ensure_leases().await?;
        let mut headers = async_nats::HeaderMap::new();
        headers.insert(
            lease::EXPECTED_LAST_SUBJECT_SEQ,
            expected.to_string().as_str(),
        );
        let subject = lease::lease_subject(&self.cfg.lease_bucket, token);
        match self
            .js_request(subject, Some(headers), Bytes::from(self.replica.clone()))
            .await
        {
            Ok(body) => Ok(lease::parse_ack(&body)),
            Err(e) => {
                self.leases_ready
                    .store(false, std::sync::atomic::Ordering::Relaxed);
                Err(e)
            }
        }
    }

    /// Tries to create the key's lease: `Ok(Some(epoch))` when this replica now owns it.
    async fn claim(&self, token: &str) -> Result<Option<u64>, String> {
        match self.write_lease(token, 0).await? {
            lease::Ack::Written(rev) => Ok(Some(rev)),
            lease::Ack::Conflict => Ok(None),
            lease::Ack::Failed(e) => Err(e),
        }
    }

    /// Renews the lease held at `rev`: `Ok(Some(new))`, `Ok(None)` when it was lost.
    async fn renew(&self, token: &str, rev: u64) -> Result<Option<u64>, String> {
        match self.write_lease(token, rev).await? {
            lease::Ack::Written(rev) => Ok(Some(rev)),
            lease::Ack::Conflict => Ok(None),
            lease::Ack::Failed(e) => Err(e),
        }
    }

    /// Deletes the lease message at `rev` (only ours: a newer owner's message has another
    /// sequence), so the next claim succeeds without waiting for the TTL.
    async fn release(&self, token: &str, rev: u64) {
        let subject = format!(
            "$JS.API.STREAM.MSG.DELETE.{}",
            lease::stream_name(&self.cfg.lease_bucket)
        );
        let body = serde_json::json!({ "seq": rev, "no_erase": true }).to_string();
        match self.js_request(subject, None, Bytes::from(body)).await {
            Ok(b) if lease::api_result(&b).is_ok() => tracing::debug!(token, "lease released"),
            _ => tracing::debug!(token, "lease not released; it will expire"),
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

    fn jitter(&self, max: Duration) -> Duration {
        max.mul_f64(rand::random::<f64>())
    }
}

/// The [`SourceFactory`] of a replica in a fleet.
pub struct FleetSource(pub Arc<Fleet>);

impl SourceFactory for FleetSource {
    fn start(
        &self,
        key: &Key,
        status: &Arc<KeyStatus>,
    ) -> (SourceHandle, mpsc::Receiver<SourceMsg>) {
        let (tx, events) = mpsc::channel(64);
        let (commands, cmds) = mpsc::channel(4);
        let fleet = self.0.clone();
        let stale_after = 2 * fleet.cfg.lease_ttl().as_millis() as u64;
        let task = KeyTask {
            token: key_token(key),
            keyring: fleet.keyring_for(key),
            mirror: Mirror::new(stale_after, fleet.cfg.mirror_buffer),
            fleet,
            key: key.clone(),
            status: status.clone(),
            tx,
            cmds,
        };
        // On the arbiter (spawn_local): an owner starts its Listener actor from this task.
        let handle = actix::spawn(task.run());
        (SourceHandle::graceful(commands, handle), events)
    }
}

enum Next {
    Contend,
    Owner { epoch: u64 },
    Mirror,
    Local,
    Exit,
}

/// Counts a key in a role gauge for as long as it lives.
struct RoleGauge(&'static str);

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

/// A future for the next message of an optional subscription (pending forever without).
async fn next_of(sub: &mut Option<Subscriber>) -> Option<Message> {
    match sub {
        Some(s) => s.next().await,
        None => std::future::pending().await,
    }
}

struct KeyTask {
    fleet: Arc<Fleet>,
    key: Key,
    token: String,
    keyring: Option<Arc<Keyring>>,
    status: Arc<KeyStatus>,
    tx: mpsc::Sender<SourceMsg>,
    cmds: mpsc::Receiver<SourceCmd>,
    mirror: Mirror<Body>,
}

/// What a mirror buffers and applies: an event line, a snapshot `List`, or a replay
/// (event lines), by kind.
type Body = (Kind, Bytes);

impl KeyTask {
    /// What the header of the key's objects holds (`core::object`).
    fn schema(&self) -> Schema {
        Schema::of(&self.key.resource.group, &self.key.resource.resource)
    }

    async fn run(mut self) {
        let mut next = Next::Contend;
        loop {
            next = match next {
                Next::Contend => self.contend().await,
                Next::Owner { epoch } => self.own(epoch).await,
                Next::Mirror => self.follow().await,
                Next::Local => self.local().await,
                Next::Exit => break,
            };
        }
        self.status.update_fleet(|f| *f = FleetInfo::default());
    }

    fn resume_rv(&self) -> Option<u64> {
        use std::sync::atomic::Ordering;
        self.status
            .synced
            .load(Ordering::Relaxed)
            .then(|| self.status.progress.load(Ordering::Relaxed))
    }

    async fn contend(&mut self) -> Next {
        match self.fleet.claim(&self.token).await {
            Ok(Some(epoch)) => Next::Owner { epoch },
            Ok(None) => Next::Mirror,
            Err(error) => {
                tracing::debug!(key = %self.key, %error, "cannot reach the lease bucket");
                Next::Mirror
            }
        }
    }

    /// Owner: upstream list+watch, publish, answer snapshots, renew the lease.
    async fn own(&mut self, epoch: u64) -> Next {
        let fleet = self.fleet.clone();
        let _gauge = RoleGauge::new(m::FLEET_OWNED_KEYS);
        metrics::counter!(m::FLEET_OWNERSHIP_CHANGES, "change" => "acquired").increment(1);
        tracing::info!(key = %self.key, epoch, "took ownership of the key");
        self.status.update_fleet(|f| {
            f.role = "owner";
            f.owner = fleet.replica.clone();
            f.epoch = epoch;
        });
        let outlet = Outlet {
            client: fleet.client.clone(),
            subject: fleet.subjects.events(&self.token),
            token: self.token.clone(),
            owner: fleet.replica.clone(),
            epoch,
            keyring: self.keyring.clone(),
            chunk_max: fleet.chunk_max(),
        };
        let listener = Listener::new(outlet.clone(), fleet.cfg.listener_buffer).start();
        let role = Role::Owner {
            epoch,
            listener,
            heartbeat: fleet.cfg.heartbeat(),
        };
        if self.tx.send(SourceMsg::Role(role)).await.is_err() {
            fleet.release(&self.token, epoch).await;
            return Next::Exit;
        }
        let (upstream, mut up_rx) = fleet.upstream.start_at(&self.key, self.resume_rv());
        let mut snaps = fleet
            .client
            .subscribe(fleet.subjects.snapshot(&self.token))
            .await
            .ok();
        let mut ctl = fleet
            .client
            .subscribe(fleet.subjects.control(&self.token))
            .await
            .ok();
        let period = fleet.cfg.lease_ttl() / 3;
        let mut renew = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
        let mut rev = epoch;
        loop {
            tokio::select! {
                cmd = self.cmds.recv() => match cmd {
                    None => {
                        fleet.release(&self.token, rev).await;
                        return Next::Exit;
                    }
                    Some(c) => { let _ = upstream.commands.try_send(c); }
                },
                msg = up_rx.recv() => match msg {
                    Some(msg) => if self.tx.send(msg).await.is_err() {
                        fleet.release(&self.token, rev).await;
                        return Next::Exit;
                    },
                    None => {
                        tracing::warn!(key = %self.key, "upstream source ended; contending again");
                        fleet.release(&self.token, rev).await;
                        return Next::Contend;
                    }
                },
                req = next_of(&mut snaps) => match req {
                    Some(req) => {
                        metrics::counter!(m::NATS_IN).increment(1);
                        if !self.answer_snapshot(req, &outlet).await {
                            fleet.release(&self.token, rev).await;
                            return Next::Exit;
                        }
                    }
                    None => snaps = None,
                },
                req = next_of(&mut ctl) => match req {
                    Some(_) => {
                        metrics::counter!(m::NATS_IN).increment(1);
                        let _ = upstream.commands.try_send(SourceCmd::Probe);
                    }
                    None => ctl = None,
                },
                _ = renew.tick() => match fleet.renew(&self.token, rev).await {
                    Ok(Some(new)) => rev = new,
                    Ok(None) => {
                        // Someone else holds the key now: this replica was paused or cut
                        // off past its lease. Stop publishing and follow the new owner.
                        tracing::warn!(key = %self.key, epoch, "lost the key's lease; stepping down");
                        metrics::counter!(m::FLEET_OWNERSHIP_CHANGES, "change" => "lost").increment(1);
                        let _ = self.tx.send(SourceMsg::Role(Role::Mirror)).await;
                        return Next::Mirror;
                    }
                    Err(error) => {
                        // NATS is unreachable: keep the upstream watch and keep serving; the
                        // next renewal after reconnecting decides.
                        tracing::debug!(key = %self.key, %error, "lease renewal failed");
                    }
                },
            }
        }
    }

    /// Answers one snapshot request with the CachedObject's state, chunked and sealed.
    /// `false` when the CachedObject is gone.
    async fn answer_snapshot(&mut self, req: Message, outlet: &Outlet) -> bool {
        let Some(reply) = req.reply else {
            return true;
        };
        #[derive(Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct Request {
            since_rv: Option<u64>,
        }
        let since = serde_json::from_slice::<Request>(&req.payload)
            .ok()
            .and_then(|r| r.since_rv);
        let (otx, orx) = oneshot::channel();
        if self
            .tx
            .send(SourceMsg::Snapshot { since, reply: otx })
            .await
            .is_err()
        {
            return false;
        }
        let snap = match tokio::time::timeout(Duration::from_secs(2), orx).await {
            Ok(Ok(snap)) => snap,
            _ => return true,
        };
        let res = match snap {
            Some(snap) => {
                let (kind, body) = match &snap.replay {
                    Some(events) => (Kind::Replay, encode_replay(events)),
                    None => (Kind::Snapshot, encode_list(&snap)),
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
            tracing::warn!(key = %self.key, %error, "cannot send snapshot");
        }
        true
    }

    /// Mirror: follow the owner's events, resync when needed, claim the key when the
    /// owner falls silent, fall back to upstream when NATS is gone.
    async fn follow(&mut self) -> Next {
        let fleet = self.fleet.clone();
        let _gauge = RoleGauge::new(m::FLEET_MIRRORED_KEYS);
        self.status.update_fleet(|f| f.role = "mirror");
        if self.tx.send(SourceMsg::Role(Role::Mirror)).await.is_err() {
            return Next::Exit;
        }
        let subs = async {
            let ev = fleet
                .client
                .subscribe(fleet.subjects.events(&self.token))
                .await?;
            let inbox = fleet.client.new_inbox();
            let replies = fleet.client.subscribe(format!("{inbox}.*")).await?;
            Ok::<_, async_nats::SubscribeError>((ev, inbox, replies))
        };
        let (mut events, inbox, mut replies) = match subs.await {
            Ok(s) => s,
            Err(error) => {
                tracing::warn!(key = %self.key, %error, "cannot subscribe; retrying");
                tokio::time::sleep(Duration::from_secs(1)).await;
                return Next::Contend;
            }
        };
        self.mirror.restart();
        let mut ev_parts = Reassembler::new(fleet.cfg.max_message_bytes);
        let mut snap_parts = Reassembler::new(fleet.cfg.max_message_bytes);
        let mut request = 0u64;
        let mut wanted = String::new();
        let mut snapshot_due = Instant::now();
        let silence = 3 * fleet.cfg.heartbeat();
        let mut last_heard = Instant::now();
        let mut next_claim = Instant::now() + silence;
        let mut cut_off_since: Option<Instant> = None;
        let mut tick = tokio::time::interval(Duration::from_millis(100));
        loop {
            let mut resync = false;
            tokio::select! {
                cmd = self.cmds.recv() => match cmd {
                    None => return Next::Exit,
                    Some(SourceCmd::Probe) => {
                        let _ = fleet.client.publish(fleet.subjects.control(&self.token), Bytes::new()).await;
                    }
                    // A one-off upstream read, as an owner's: a young key's window is
                    // extended back on every replica alike.
                    Some(SourceCmd::Replay(cmd)) => {
                        fleet.upstream.spawn_replay(&self.key, cmd, self.tx.clone());
                    }
                },
                msg = events.next() => {
                    let Some(msg) = msg else { return Next::Contend };
                    metrics::counter!(m::NATS_IN).increment(1);
                    match self.on_event_message(&msg, &mut ev_parts) {
                        Ok(Some(input)) => {
                            let outputs = self.mirror.on(fleet.now_ms(), input);
                            let stale = outputs.iter().any(|o| matches!(o, Output::Stale(_)));
                            if !stale {
                                last_heard = Instant::now();
                                self.note_owner(&msg);
                            }
                            match self.apply(outputs).await {
                                Some(r) => resync |= r,
                                None => return Next::Exit,
                            }
                        }
                        Ok(None) => {}
                        Err(error) => {
                            metrics::counter!(m::FLEET_BAD_MESSAGES).increment(1);
                            tracing::warn!(key = %self.key, %error, "undecodable event message; resynchronising");
                            self.mirror.restart();
                            resync = true;
                        }
                    }
                },
                msg = replies.next() => {
                    let Some(msg) = msg else { return Next::Contend };
                    metrics::counter!(m::NATS_IN).increment(1);
                    if msg.subject.as_str() != wanted {
                        continue;
                    }
                    if msg.status == Some(async_nats::StatusCode::NO_RESPONDERS) {
                        // No owner yet (or it just died): ask again shortly; the claim
                        // timer takes the key if the silence lasts.
                        snapshot_due = Instant::now() + Duration::from_millis(500);
                        continue;
                    }
                    match self.on_snapshot_message(&msg, &mut snap_parts) {
                        Ok(Some(input)) => {
                            let outputs = self.mirror.on(fleet.now_ms(), input);
                            self.note_owner(&msg);
                            match self.apply(outputs).await {
                                Some(r) => resync |= r,
                                None => return Next::Exit,
                            }
                        }
                        Ok(None) => {}
                        Err(SnapshotReply::NotReady) => {
                            snapshot_due = Instant::now() + Duration::from_millis(200);
                        }
                        Err(SnapshotReply::Bad(error)) => {
                            metrics::counter!(m::FLEET_BAD_MESSAGES).increment(1);
                            tracing::warn!(key = %self.key, %error, "undecodable snapshot; asking again");
                            snapshot_due = Instant::now() + Duration::from_millis(200);
                        }
                    }
                },
                _ = tick.tick() => {
                    let now = Instant::now();
                    if fleet.client.connection_state() != async_nats::connection::State::Connected {
                        let since = *cut_off_since.get_or_insert(now);
                        if now.duration_since(since) >= Duration::from_millis(fleet.cfg.fallback_after_ms) {
                            tracing::warn!(key = %self.key, "NATS unreachable; watching upstream directly until it is back");
                            return Next::Local;
                        }
                        continue;
                    }
                    cut_off_since = None;
                    if last_heard.elapsed() > silence && now >= next_claim {
                        if let Ok(Some(epoch)) = fleet.claim(&self.token).await {
                            return Next::Owner { epoch };
                        }
                        let third = fleet.cfg.lease_ttl() / 3;
                        next_claim = Instant::now() + third + fleet.jitter(third);
                    }
                    if !self.mirror.synced() && now >= snapshot_due {
                        resync = true;
                    }
                },
            }
            if resync {
                request += 1;
                wanted = format!("{inbox}.{request}");
                snap_parts.reset();
                snapshot_due =
                    Instant::now() + Duration::from_millis(fleet.cfg.snapshot_timeout_ms.max(100));
                let subject = fleet.subjects.snapshot(&self.token);
                // With this replica's RV the owner can answer with just the events after
                // it (failover, a lost event), so clients miss none; else a snapshot.
                let body = match self.resume_rv() {
                    Some(rv) => serde_json::json!({ "sinceRv": rv }).to_string(),
                    None => "{}".to_string(),
                };
                if fleet
                    .client
                    .publish_with_reply(subject, wanted.clone(), Bytes::from(body))
                    .await
                    .is_ok()
                {
                    metrics::counter!(m::NATS_OUT).increment(1);
                }
            }
        }
    }

    fn note_owner(&self, msg: &Message) {
        let owner = msg
            .headers
            .as_ref()
            .and_then(|h| h.get(crate::core::wire::H_OWNER))
            .map(|v| v.as_str().to_string());
        let epoch = self.mirror.epoch();
        let seq = self.mirror.seq().unwrap_or(0);
        self.status.update_fleet(|f| {
            if let Some(o) = owner {
                f.owner = o;
            }
            f.epoch = epoch;
            f.seq = seq;
        });
    }

    fn frame(msg: &Message) -> Result<Frame, String> {
        let headers = msg.headers.as_ref().ok_or("no headers")?;
        Frame::parse(|name| headers.get(name).map(|v| v.as_str())).map_err(|e| e.to_string())
    }

    /// Reassembles and opens a body.
    fn body(
        &self,
        frame: &Frame,
        msg: &Message,
        parts: &mut Reassembler,
    ) -> Result<Option<Bytes>, String> {
        let fed = parts.feed(frame, msg.payload.clone());
        if let Err(wire::Error::TooLarge { .. }) = &fed {
            metrics::counter!(m::FLEET_OVERSIZED).increment(1);
        }
        let Some(body) = fed.map_err(|e| e.to_string())? else {
            return Ok(None);
        };
        match (&frame.key_id, &self.keyring) {
            (Some(id), Some(ring)) => ring
                .open(id, &body, self.token.as_bytes())
                .map(|b| Some(Bytes::from(b)))
                .map_err(|e| e.to_string()),
            (Some(id), None) => Err(format!(
                "sealed with key {id:?} but this replica has no keys"
            )),
            (None, Some(_)) if !body.is_empty() => {
                Err("plaintext payload for a sealed resource refused".into())
            }
            _ => Ok(Some(body)),
        }
    }

    fn on_event_message(
        &self,
        msg: &Message,
        parts: &mut Reassembler,
    ) -> Result<Option<Input<Body>>, String> {
        let frame = Self::frame(msg)?;
        let stamp = Stamp {
            epoch: frame.epoch,
            seq: frame.seq,
            rv: frame.rv,
        };
        match frame.kind {
            Kind::Heartbeat => Ok(Some(Input::Heartbeat(stamp))),
            Kind::Event => Ok(self
                .body(&frame, msg, parts)?
                .map(|b| Input::Event(stamp, (Kind::Event, b)))),
            other => Err(format!("unexpected {} on an event subject", other.as_str())),
        }
    }

    fn on_snapshot_message(
        &self,
        msg: &Message,
        parts: &mut Reassembler,
    ) -> Result<Option<Input<Body>>, SnapshotReply> {
        let frame = Self::frame(msg).map_err(SnapshotReply::Bad)?;
        match frame.kind {
            Kind::NotReady => Err(SnapshotReply::NotReady),
            kind @ (Kind::Snapshot | Kind::Replay) => {
                let stamp = Stamp {
                    epoch: frame.epoch,
                    seq: frame.seq,
                    rv: frame.rv,
                };
                Ok(self
                    .body(&frame, msg, parts)
                    .map_err(SnapshotReply::Bad)?
                    .map(|b| Input::Snapshot(stamp, (kind, b))))
            }
            other => Err(SnapshotReply::Bad(format!(
                "unexpected {} in a snapshot reply",
                other.as_str()
            ))),
        }
    }

    /// Turns mirror decisions into CachedObject messages. `None` when the CachedObject is
    /// gone; `Some(true)` when a snapshot must be requested.
    async fn apply(&mut self, outputs: Vec<Output<Body>>) -> Option<bool> {
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
                        let msg = SourceMsg::Event { kind, object, rv };
                        if self.tx.send(msg).await.is_err() {
                            return None;
                        }
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
                    Ok((items, _)) => SourceMsg::Listed {
                        items,
                        rv: stamp.rv,
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
            if self.tx.send(msg).await.is_err() {
                return None;
            }
        }
        Some(resync)
    }

    /// NATS is gone: watch upstream directly until it is back, then contend again.
    async fn local(&mut self) -> Next {
        let fleet = self.fleet.clone();
        let _gauge = RoleGauge::new(m::FLEET_LOCAL_KEYS);
        self.status.update_fleet(|f| f.role = "local");
        if self.tx.send(SourceMsg::Role(Role::Local)).await.is_err() {
            return Next::Exit;
        }
        let (upstream, mut up_rx) = fleet.upstream.start_at(&self.key, self.resume_rv());
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        loop {
            tokio::select! {
                cmd = self.cmds.recv() => match cmd {
                    None => return Next::Exit,
                    Some(c) => { let _ = upstream.commands.try_send(c); }
                },
                msg = up_rx.recv() => match msg {
                    Some(msg) => if self.tx.send(msg).await.is_err() { return Next::Exit },
                    None => return Next::Contend,
                },
                _ = tick.tick() => {
                    if fleet.client.connection_state() == async_nats::connection::State::Connected {
                        tracing::info!(key = %self.key, "NATS is back; rejoining the fleet");
                        // Spread the fleet's claims over a moment instead of racing at once.
                        tokio::time::sleep(fleet.jitter(Duration::from_millis(500))).await;
                        return Next::Contend;
                    }
                }
            }
        }
    }
}

enum SnapshotReply {
    NotReady,
    Bad(String),
}

/// A replay body: the events' watch lines, one after another.
fn encode_replay(events: &[Arc<StoreEvent>]) -> Bytes {
    let mut out = Vec::with_capacity(events.iter().map(|e| e.line.len()).sum());
    for e in events {
        out.extend_from_slice(&e.line);
    }
    Bytes::from(out)
}

/// A snapshot body: a `List` as the API server would answer it, the objects' own bytes.
fn encode_list(snap: &OwnerSnapshot) -> Bytes {
    let head = object::list_head("List", "v1", snap.rv);
    let size = head.len()
        + snap
            .objects
            .iter()
            .map(|o| o.json().len() + 1)
            .sum::<usize>()
        + 2;
    let mut out = Vec::with_capacity(size);
    out.extend_from_slice(&head);
    let mut items = object::ListWriter::new(usize::MAX);
    for o in &snap.objects {
        // An unbounded chunk never fills: the whole list comes out of `finish`.
        let _ = items.push(o.json());
    }
    out.extend_from_slice(&items.finish());
    Bytes::from(out)
}
