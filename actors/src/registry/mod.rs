//! The registry: key → refcount. The first reference starts a key's CachedObject; the last
//! release stops it after a grace period, so a reconnecting client does not restart the
//! upstream watch — the kubelet watch-based manager's `AddReference`/`DeleteReference`.
//!
//! Adaptive coalescing of name keys into namespace keys is in [`coalesce`].
//!
//! It holds each CachedObject's strong `Addr` (the refcount decides its lifetime) and is
//! passed explicitly, never a global, so one process can host several replicas in tests.

mod coalesce;

pub use coalesce::GroupInfo;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use serde::Serialize;

use crate::cached_object::{CachedObject, Drain, Stop};
use crate::config::CacheConfig;
use crate::core::cover::{self, KeyState};
use crate::core::holds::{Holds, OnHold, OnTimer};
use crate::core::interest::outbox::Outbox;
use crate::core::interest::sync::Peers;
use crate::core::interest::{Interest, Kind};
use crate::core::key::Key;
use crate::core::refs::{Grace, Limits, Refs, Released};
use crate::core::subject::key_token;
use crate::feed::{KeyStatus, RoleKind, SourceFactory};
use crate::fleet::interest::{Gossip, Publisher, RemoteInterest};
use crate::metrics as m;
use crate::watch_feed::{KeyAddr, KeyLink};

pub use crate::core::refs::Error;
pub use crate::core::wants::{Error as WantError, Limits as WantLimits};
use crate::core::wants::{Wanted, Wants};

/// A running key as the registry holds it, beside its references (`core::refs`).
struct Slot {
    addr: Addr<CachedObject>,
    /// The key's address as its watchers hold it, shared.
    link: KeyLink,
    /// The key's NATS token (fleet interest and ownership).
    token: String,
    /// Reads' holds on this key, by the key asked: one reference each, renewed by every
    /// read (`core::holds`).
    holds: Holds<Key>,
    status: Arc<KeyStatus>,
}

pub struct Registry {
    cfg: Arc<CacheConfig>,
    /// Where keys run (`cache.arbiters`); empty: on the registry's own arbiter.
    arbiters: Arbiters,
    sources: Arc<dyn SourceFactory>,
    /// The running keys, their references, budgets and grace periods (`core::refs`).
    keys: Refs<Slot>,
    replica: String,
    /// In a fleet: the interest channel, and every replica's refcounts by key.
    fleet: Option<FleetInterest>,
    /// Adaptive coalescing, by namespace key (`coalesce`).
    coalescing: HashMap<Key, coalesce::Coalescing>,
    /// Requests that would start a name key, per second: a storm gathers longer.
    asks: crate::core::coalesce::AskRate,
    /// Keys the configuration keeps cached with no client asking ([`Declare`]): one
    /// reference each, never released.
    declared: HashSet<Key>,
    /// Keys NATS subscribers asked for ([`Want`]): one reference each while anyone's
    /// interest lasts (`core::wants`).
    wants: Wants<Key>,
    started: std::time::Instant,
}

struct FleetInterest {
    gossip: Gossip,
    /// The queue to the publishing task (started with the Registry).
    publisher: Option<Publisher>,
    interval: Duration,
    /// Every replica's references and covered names, this one's included.
    table: Interest,
    /// Where this replica stands with each other replica's messages.
    peers: Peers,
    /// What this replica sent, and whether its next message is its full table.
    outbox: Outbox,
    /// Why the full table is due (`metrics::INTEREST_FULL_REASONS`).
    full_reason: &'static str,
    /// A publish ahead of the interval is scheduled (a peer needs the full table).
    publish_soon: bool,
    /// When the last full table went out (ms).
    last_full_ms: Option<u64>,
    started: std::time::Instant,
}

impl FleetInterest {
    fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    /// A replica is heard every interval; its records count for three.
    fn ttl_ms(&self) -> u64 {
        3 * self.interval.as_millis() as u64
    }

    /// The refcount other replicas hold on a key.
    fn others(&self, token: &str) -> u64 {
        let (now, ttl) = (self.now_ms(), self.ttl_ms());
        self.table
            .others(Kind::Refs, token, self.gossip.replica(), now, ttl)
    }

    /// How many distinct names (or nodes) of the group a big key coalesces are watched
    /// in the fleet: those the fleet's records name, with references or served by
    /// covering keys. Run [`Registry::sync_own_interest`] and [`FleetInterest::expire`]
    /// first, so this replica's own are as they are now.
    fn names_watched(&self, big: &Key) -> usize {
        let group = crate::core::subject::member_token_prefix(big);
        self.table.group_len(&group)
    }

    /// Forgets the replicas not heard for a TTL, and their records.
    fn expire(&mut self) {
        let (now, ttl) = (self.now_ms(), self.ttl_ms());
        // This replica never goes silent to itself: a Registry that stalled for a TTL
        // must not drop its own records, which only their changes would bring back.
        let me = self.gossip.replica().to_string();
        self.table.heard(&me, now);
        for gone in self.table.expire(now, ttl) {
            tracing::info!(replica = %gone, "fleet interest: a replica not heard for {ttl} ms; its references no longer count");
            self.peers.forget(&gone);
        }
    }

    /// How many requests of a small key other replicas serve from a covering key.
    fn covered_elsewhere(&self, token: &str) -> u64 {
        let (now, ttl) = (self.now_ms(), self.ttl_ms());
        self.table
            .others(Kind::Covered, token, self.gossip.replica(), now, ttl)
    }

    /// The fleet's refcount of a key.
    fn total(&self, token: &str) -> u64 {
        self.table
            .total(Kind::Refs, token, self.now_ms(), self.ttl_ms())
    }
}

impl Registry {
    pub fn new(cfg: Arc<CacheConfig>, sources: Arc<dyn SourceFactory>, replica: String) -> Self {
        Registry {
            arbiters: Arbiters::spawn(cfg.arbiters),
            keys: Refs::new(Limits {
                max_keys: cfg.max_keys,
                max_keys_per_user: cfg.max_keys_per_user,
            }),
            cfg,
            sources,
            replica,
            fleet: None,
            coalescing: HashMap::new(),
            asks: Default::default(),
            declared: HashSet::new(),
            wants: Wants::default(),
            started: std::time::Instant::now(),
        }
    }

    /// A replica in a fleet: publishes its refcounts every `interval`, hears the
    /// others', and keeps owned keys while other replicas still hold references.
    pub fn with_fleet(mut self, gossip: Gossip, interval: Duration) -> Self {
        self.keys.track_changes();
        self.fleet = Some(FleetInterest {
            gossip,
            publisher: None,
            interval,
            table: Interest::default(),
            peers: Peers::default(),
            outbox: Outbox::new(rand::random()),
            full_reason: "start",
            publish_soon: false,
            last_full_ms: None,
            started: std::time::Instant::now(),
        });
        self
    }

    /// Records this replica's counts that changed since it last looked (`Refs`
    /// names them) as its own in the fleet's table, and queues them for its next message.
    fn sync_own_interest(&mut self) {
        let Some(fleet) = &mut self.fleet else {
            return;
        };
        let changes = self.keys.take_changes();
        let me = fleet.gossip.replica().to_string();
        let refs = changes.refs.into_iter().map(|(k, n)| (Kind::Refs, k, n));
        // Only names and nodes travel as covered: what coalescing counts.
        let covered = changes
            .covered
            .into_iter()
            .filter(|(k, _)| k.group().is_some())
            .map(|(k, n)| (Kind::Covered, k, n));
        for (kind, key, n) in refs.chain(covered) {
            let token = key_token(&key);
            fleet.table.record(kind, &me, &token, n as u64);
            fleet.outbox.changed(kind, token, n as u64);
        }
    }

    /// Publishes what changed in this replica's refcounts and covered names since its
    /// last message (its full table when one is due), and forgets the replicas gone
    /// silent. With it go the names of the replicas whose full table this one needs.
    fn publish_interest(&mut self) {
        self.sync_own_interest();
        let Some(fleet) = &mut self.fleet else {
            return;
        };
        let now = fleet.now_ms();
        if fleet.outbox.full_due() {
            metrics::counter!(m::FLEET_INTEREST_FULL, "reason" => fleet.full_reason).increment(1);
            fleet.last_full_ms = Some(now);
        }
        let keys = &self.keys;
        let table = || {
            let refs = keys
                .values()
                .map(|e| (Kind::Refs, e.value.token.clone(), e.refs as u64));
            let covered = keys
                .covered_counts()
                .filter(|(k, _)| k.group().is_some())
                .map(|(k, n)| (Kind::Covered, key_token(k), n as u64));
            refs.chain(covered).collect()
        };
        let batches = fleet.outbox.next(table);
        // Also marks this replica heard.
        fleet.expire();
        let resync: Vec<String> = fleet.peers.behind().map(str::to_string).collect();
        if let Some(p) = &fleet.publisher {
            p.send(batches, resync);
        }
    }

    /// Publishes the full table a peer needs soon rather than at the next interval (a
    /// replica joining is ready 1.2 intervals after it starts: by then it must have every
    /// peer's table). A peer's ask for the table again waits for the interval when one
    /// went out less than an interval ago: asks cost the fleet about one table per
    /// interval at most.
    fn publish_full_soon(&mut self, reason: &'static str, ctx: &mut Context<Self>) {
        let Some(fleet) = &mut self.fleet else {
            return;
        };
        if !fleet.outbox.full_due() {
            fleet.full_reason = reason;
        }
        fleet.outbox.send_full();
        let interval = fleet.interval.as_millis() as u64;
        // A new peer (a replica starting, ready 1.2 intervals later) is answered at once;
        // asks for the table again wait for the interval when a table went out recently.
        let recent = reason != "new-peer"
            && fleet
                .last_full_ms
                .is_some_and(|at| fleet.now_ms().saturating_sub(at) < interval);
        if fleet.publish_soon || recent {
            return;
        }
        fleet.publish_soon = true;
        ctx.run_later(soon(fleet.interval), |act, _| {
            if let Some(f) = &mut act.fleet {
                f.publish_soon = false;
            }
            act.publish_interest();
        });
    }

    /// Stops a key whose grace period ran out, unless the fleet still needs it: an owner
    /// keeps the upstream watch while other replicas hold references.
    fn schedule_stop(&mut self, key: Key, generation: u64, ctx: &mut Context<Self>) {
        ctx.run_later(self.cfg.grace_period(), move |act, ctx| {
            act.stop_now(key, generation, ctx)
        });
    }

    /// Stops a key idle since `generation` now, unless a reference came back or the
    /// fleet still needs it (then it gets another grace period).
    fn stop_now(&mut self, key: Key, generation: u64, ctx: &mut Context<Self>) {
        self.stop_unless_needed(key, generation, None, ctx)
    }

    /// Stops a key whose watchers were all handed over to its coalesced group, at once.
    /// An owner the other replicas' interest still names is looked at again as soon as
    /// that interest can have lapsed (their name keys hand over too, and their records
    /// expire within the interest TTL), and again at that pace for one grace period,
    /// before it falls back to a grace period at a time (so never later than it would
    /// have stopped without this): a 3-replica fleet opening 99,000 kubelet watches kept
    /// ~700 handed-over name keys, each an upstream watch, a whole grace period (30 s)
    /// longer than one replica.
    pub(crate) fn stop_handed_over(&mut self, key: Key, generation: u64, ctx: &mut Context<Self>) {
        let grace = self.cfg.grace_period();
        let soon = self.fleet.as_ref().map(|f| {
            let every =
                (Duration::from_millis(f.ttl_ms()) + f.interval).max(Duration::from_millis(1));
            let times = grace.as_millis().div_ceil(every.as_millis());
            (every, u32::try_from(times).unwrap_or(u32::MAX))
        });
        self.stop_unless_needed(key, generation, soon, ctx)
    }

    /// [`Registry::stop_now`]; `soon`: while the fleet still needs the key, look again
    /// after this long, this many times, then wait a grace period.
    fn stop_unless_needed(
        &mut self,
        key: Key,
        generation: u64,
        soon: Option<(Duration, u32)>,
        ctx: &mut Context<Self>,
    ) {
        let (keys, fleet) = (&mut self.keys, &self.fleet);
        let keep = |e: &crate::core::refs::Entry<Slot>| {
            fleet.as_ref().is_some_and(|fleet| {
                e.value.status.fleet().role == Some(RoleKind::Owner)
                    && fleet.others(&e.value.token) > 0
            })
        };
        match keys.grace_over(&key, generation, keep) {
            Grace::Nothing => {}
            Grace::Again => match soon {
                Some((after, left)) if left > 0 => {
                    ctx.run_later(after, move |act, ctx| {
                        act.stop_unless_needed(key, generation, Some((after, left - 1)), ctx)
                    });
                }
                _ => self.schedule_stop(key, generation, ctx),
            },
            Grace::Stop(slot) => {
                tracing::info!(key = %key, "no references left; stopping key");
                slot.addr.do_send(Stop);
            }
        }
    }

    /// Counts a key start refused by a key budget.
    fn refused(&self, key: &Key) {
        let r = &key.resource;
        metrics::counter!(crate::metrics::KEYS_REFUSED, "group" => r.group.clone(), "resource" => r.resource.clone())
            .increment(1);
    }

    fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    /// How far along `key` is here.
    fn state(&self, key: &Key) -> KeyState {
        match self.keys.get(key) {
            None => KeyState::NotRunning,
            Some(e) if e.value.status.synced.load(Ordering::Relaxed) => KeyState::Synced,
            Some(_) => KeyState::Syncing,
        }
    }

    /// A reference for a request of `asked` (a watch from `from_rv`, or 0): on its own
    /// key, or on a synced key that covers it when its own is not running and whose window
    /// reaches `from_rv` (`core::cover`).
    fn acquire_covering(
        &mut self,
        asked: Key,
        from_rv: u64,
        user: Option<&str>,
    ) -> Result<Held, Error> {
        self.adopt_fleet_coalescing(&asked);
        let coalesced = asked
            .group()
            .filter(|ns| self.coalescing.get(ns).is_some_and(|c| c.coalesced()));
        let key = cover::route(&asked, from_rv, coalesced.as_ref(), |k| {
            let reach = self.keys.get(k).map_or(0, |e| {
                e.value.status.replayable_from.load(Ordering::Relaxed)
            });
            (self.state(k), reach)
        });
        if key == asked {
            let (addr, link) = self.acquire_for(key.clone(), user)?;
            return Ok(Held { key, addr, link });
        }
        let (addr, link) = self.acquire(&key, &asked);
        let by = match key.scope {
            crate::core::key::Scope::Namespace(_) => "namespace",
            _ => "cluster",
        };
        let r = &key.resource;
        metrics::counter!(crate::metrics::COVERED_REQUESTS, "group" => r.group.clone(), "resource" => r.resource.clone(), "by" => by)
            .increment(1);
        Ok(Held { key, addr, link })
    }

    /// A reference on `key`, starting it for `user` if needed and their budget allows.
    fn acquire_for(
        &mut self,
        key: Key,
        user: Option<&str>,
    ) -> Result<(Addr<CachedObject>, KeyLink), Error> {
        let (cfg, arbiters, sources) = (&self.cfg, &self.arbiters, &self.sources);
        match self
            .keys
            .acquire_for(&key, user, || start(cfg, arbiters, sources, &key))
        {
            Ok(e) => Ok((e.value.addr.clone(), e.value.link.clone())),
            Err(e) => {
                self.refused(&key);
                Err(e)
            }
        }
    }

    /// A reference on `key` for a request of `asked` (itself or a key it serves),
    /// starting it if needed with no budget asked: the caller decided.
    fn acquire(&mut self, key: &Key, asked: &Key) -> (Addr<CachedObject>, KeyLink) {
        let (cfg, arbiters, sources) = (&self.cfg, &self.arbiters, &self.sources);
        let e = self
            .keys
            .acquire(key, asked, || start(cfg, arbiters, sources, key));
        (e.value.addr.clone(), e.value.link.clone())
    }

    /// Drops a reference on `held`, taken for a request of `asked`; the last one starts
    /// the key's grace period.
    fn release(&mut self, held: &Key, asked: &Key, ctx: &mut Context<Self>) {
        if let Released::Idle { generation } = self.keys.release(held, asked) {
            self.schedule_stop(held.clone(), generation, ctx);
        }
    }
}

/// Starts `key`'s CachedObject on the arbiter its hash picks.
fn start(
    cfg: &Arc<CacheConfig>,
    arbiters: &Arbiters,
    sources: &Arc<dyn SourceFactory>,
    key: &Key,
) -> Slot {
    let status = Arc::new(KeyStatus::default());
    let cached = CachedObject::new(key.clone(), cfg.clone(), sources.clone(), status.clone());
    let addr = match arbiters.for_key(key) {
        // The key's source task is spawned from `started`, so it runs there too.
        Some(arbiter) => CachedObject::start_in_arbiter(arbiter, move |_| cached),
        None => cached.start(),
    };
    tracing::info!(key = %key, "caching key");
    let scope = match key.scope {
        crate::core::key::Scope::Name { .. } => "name",
        crate::core::key::Scope::Namespace(_) => "namespace",
        crate::core::key::Scope::Node(_) => "node",
        crate::core::key::Scope::Cluster => "cluster",
    };
    let r = &key.resource;
    metrics::counter!(crate::metrics::KEYS_STARTED, "group" => r.group.clone(), "resource" => r.resource.clone(), "scope" => scope)
        .increment(1);
    Slot {
        token: key_token(key),
        link: Arc::new(KeyAddr {
            key: key.clone(),
            addr: addr.clone().recipient(),
        }),
        addr,
        holds: Holds::default(),
        status,
    }
}

/// The threads keys run on. A key's CachedObject, its source and its upstream stream
/// share one (their messages stay on one thread), chosen by the key's hash so the same
/// key always lands on the same one; different keys' events are handled in parallel.
struct Arbiters(Vec<(Arbiter, ArbiterHandle)>);

impl Arbiters {
    fn spawn(configured: usize) -> Self {
        let n = match configured {
            0 => std::thread::available_parallelism().map_or(1, usize::from),
            n => n,
        };
        if n <= 1 {
            return Arbiters(Vec::new());
        }
        tracing::info!(arbiters = n, "spreading keys over arbiters");
        Arbiters(
            (0..n)
                .map(|_| {
                    let a = Arbiter::new();
                    let h = a.handle();
                    (a, h)
                })
                .collect(),
        )
    }

    fn for_key(&self, key: &Key) -> Option<&ArbiterHandle> {
        use std::hash::{Hash, Hasher};
        if self.0.is_empty() {
            return None;
        }
        let mut h = std::collections::hash_map::DefaultHasher::new();
        key.hash(&mut h);
        let i = (h.finish() % self.0.len() as u64) as usize;
        Some(&self.0[i].1)
    }
}

impl Drop for Arbiters {
    fn drop(&mut self) {
        for (a, _) in &self.0 {
            a.stop();
        }
    }
}

impl Actor for Registry {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        if let Some(fleet) = &mut self.fleet {
            fleet.gossip.spawn_follow(ctx.address().recipient());
            fleet.publisher = Some(fleet.gossip.spawn_publisher());
            // The first message (the full table) goes out at once: the peers answer
            // with theirs, and a replica joining knows the fleet before it is ready.
            ctx.run_later(soon(fleet.interval), |act, _| act.publish_interest());
            ctx.run_interval(fleet.interval, |act, _| act.publish_interest());
        }
        ctx.run_interval(coalesce::CHECK_EVERY, |act, ctx| act.check_coalescing(ctx));
        ctx.run_interval(WANTS_EXPIRE_EVERY, |act, ctx| act.expire_wants(ctx));
    }
}

/// Take a reference for a request of `key`: on `key`, or on a running key that covers it
/// (`core::cover`); the answer names the key held and its CachedObject, or says why the
/// key may not be started for `user` (see `cache.max_keys`).
#[derive(Message)]
#[rtype(result = "Result<Held, Error>")]
pub struct Acquire {
    pub key: Key,
    /// The RV a watch replays from (0: none).
    pub from_rv: u64,
    /// Who asked: a key they start counts against their budget. `None`: no budget.
    pub user: Option<String>,
}

/// The key a request holds a reference on: its own, or one covering it.
#[derive(Debug, Clone)]
pub struct Held {
    pub key: Key,
    pub addr: Addr<CachedObject>,
    /// The key's link for its watchers (`watch_feed::KeyLink`).
    pub link: KeyLink,
}

/// Drop a reference taken with [`Acquire`].
#[derive(Message)]
#[rtype(result = "()")]
pub struct Release {
    /// The key held ([`Held::key`]).
    pub key: Key,
    /// The key the request asked for.
    pub asked: Key,
}

/// A watcher moved from one key to another (`watch_feed::Move`): its reference moves
/// with it.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Moved {
    pub from: Key,
    pub to: Key,
    /// The key the watch asked for.
    pub asked: Key,
}

/// Keep `keys` cached with no client asking — declared interest (`[[publish]]`): in a
/// fleet each is owned and published over NATS like any key with a reference, for plain
/// NATS subscribers. One reference each, never released; a key the key budget refuses is
/// logged and counted (`kcache_keys_refused_total`), as a client's would be.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Declare {
    pub keys: Vec<Key>,
}

/// A NATS subscriber's interest in `key` (`<prefix>.want.<key>`, `docs/nats.md`): the
/// key is kept cached — in a fleet owned and published — until `ttl` after the asker's
/// last ask. Bounded per asker and in all (`limits`); the first interest in a key passes
/// the replica's key budget, as a client's key start does.
#[derive(Message)]
#[rtype(result = "Result<(), WantError>")]
pub struct Want {
    pub key: Key,
    /// Who asks: the reply subject's inbox prefix.
    pub asker: String,
    pub ttl: Duration,
    pub limits: WantLimits,
}

/// How often expired subscriber interest is released.
const WANTS_EXPIRE_EVERY: Duration = Duration::from_secs(1);

/// How long a publish ahead of the interval waits: the asks of peers heard together (a
/// fleet answering a replica that joined) go out as one full table.
fn soon(interval: Duration) -> Duration {
    (interval / 10).min(Duration::from_millis(50))
}

/// Take a reference held for `duration`: gets and lists keep their key (or the key that
/// covers it) cached for the grace period so repeated reads hit the cache.
#[derive(Message)]
#[rtype(result = "Result<Held, Error>")]
pub struct Hold {
    pub key: Key,
    pub duration: Duration,
    pub user: Option<String>,
}

/// Close all watchers gracefully (shutdown).
#[derive(Message)]
#[rtype(result = "usize")]
pub struct DrainAll;

/// Stop every key now (shutdown of a fleet replica: owned keys' leases are released so
/// other replicas take over at once). Answers the number of keys stopped.
#[derive(Message)]
#[rtype(result = "usize")]
pub struct StopAll;

impl Handler<StopAll> for Registry {
    type Result = usize;

    fn handle(&mut self, _msg: StopAll, _ctx: &mut Self::Context) -> usize {
        let n = self.keys.len();
        for (_, slot) in self.keys.drain() {
            slot.addr.do_send(Stop);
        }
        n
    }
}

/// `/debug/keys`.
#[derive(Message)]
#[rtype(result = "DebugKeys")]
pub struct GetDebugKeys;

#[derive(Debug, Serialize)]
pub struct DebugKeys {
    pub replica: String,
    pub keys: Vec<KeyInfo>,
    /// The namespaces (and the cluster, for node keys) adaptive coalescing has figures
    /// for: why each is or is not coalesced (`core::coalesce`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub groups: Vec<GroupInfo>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct KeyInfo {
    /// The key itself, for deciding who may see it (`/debug/keys` shows each caller only
    /// the keys it could list).
    #[serde(skip)]
    pub id: Key,
    pub key: String,
    pub refcount: usize,
    pub resource_version: String,
    pub synced: bool,
    pub objects: usize,
    pub watchers: usize,
    /// The keys whose requests this key serves because their own is not running, with
    /// the references each holds (`core::cover`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub covering: Vec<CoveredKey>,
    /// `coalesced` or `splitting` for a namespace key that serves its names
    /// (`core::coalesce`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub coalescing: Option<&'static str>,
    /// Kept cached by the configuration (`[[publish]]`), whoever else asks.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub declared: bool,
    /// NATS subscribers whose interest keeps it cached (`Want`).
    #[serde(rename = "wantedBy", skip_serializing_if = "is_zero")]
    pub wanted_by: usize,
    /// Fleet fields, present when running with `--nats`.
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub fleet: Option<FleetKeyInfo>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CoveredKey {
    pub key: String,
    pub refcount: usize,
    /// `coalesced`: adaptive coalescing has this (namespace or cluster) key serve the
    /// name's or node's requests — its watchers moved here and its own key stopped, or
    /// they came after that; `covered`: its own key was not running when asked, and this
    /// one covers it.
    pub why: &'static str,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct FleetKeyInfo {
    /// `owner`, `mirror` or `local` (NATS unreachable).
    pub role: &'static str,
    pub owner: String,
    pub fleet_refcount: u64,
    pub epoch: u64,
    pub seq: u64,
}

impl Handler<RemoteInterest> for Registry {
    type Result = ();

    fn handle(&mut self, msg: RemoteInterest, ctx: &mut Self::Context) {
        let Some(fleet) = &mut self.fleet else {
            return;
        };
        let now = fleet.now_ms();
        let was_behind = fleet.peers.behind().any(|r| r == msg.replica);
        let heard = fleet
            .peers
            .receive(&mut fleet.table, &msg.replica, msg.batch, now);
        if heard.ask_full && !was_behind && !heard.send_full {
            metrics::counter!(m::FLEET_INTEREST_BEHIND).increment(1);
            tracing::debug!(replica = %msg.replica, "fleet interest: missed a message; asking for the table again");
        }
        let me = fleet.gossip.replica();
        if heard.send_full {
            self.publish_full_soon("new-peer", ctx);
        } else if msg.resync.iter().any(|r| r == me) {
            self.publish_full_soon("asked", ctx);
        }
    }
}

impl Handler<Acquire> for Registry {
    type Result = MessageResult<Acquire>;

    fn handle(&mut self, msg: Acquire, _ctx: &mut Self::Context) -> Self::Result {
        MessageResult(self.acquire_covering(msg.key, msg.from_rv, msg.user.as_deref()))
    }
}

/// Before a request that may start a name key asks for its reference ([`Acquire`],
/// [`Hold`]): its namespace group decided from the requests in flight (`coalesce`). The
/// answer: nothing to wait for, or a receiver to await — at most [`COUNT_WAIT`], away
/// from the request's seat — before asking. Apart from the reference on purpose: a
/// request whose client leaves while it waits has taken nothing.
#[derive(Message)]
#[rtype(result = "Option<tokio::sync::oneshot::Receiver<()>>")]
pub struct Gather {
    pub key: Key,
}

pub use coalesce::COUNT_WAIT;

impl Handler<Gather> for Registry {
    type Result = MessageResult<Gather>;

    fn handle(&mut self, msg: Gather, ctx: &mut Self::Context) -> Self::Result {
        MessageResult(self.before_start(&msg.key, ctx))
    }
}

/// Waits as [`Gather`] answered: at once, or until the group is decided, at most
/// [`COUNT_WAIT`]; counts a wait that timed out.
pub async fn gathered(waiting: Option<tokio::sync::oneshot::Receiver<()>>) {
    let Some(rx) = waiting else {
        return;
    };
    if tokio::time::timeout(COUNT_WAIT, rx).await.is_err() {
        metrics::counter!(crate::metrics::COALESCE_REQUEST_WAITS, "result" => "timeout")
            .increment(1);
    }
}

impl Handler<Release> for Registry {
    type Result = ();

    fn handle(&mut self, msg: Release, ctx: &mut Self::Context) {
        self.release(&msg.key, &msg.asked, ctx);
    }
}

impl Handler<Hold> for Registry {
    type Result = MessageResult<Hold>;

    fn handle(&mut self, msg: Hold, ctx: &mut Self::Context) -> Self::Result {
        MessageResult(self.hold(msg, ctx))
    }
}

impl Registry {
    fn hold(&mut self, msg: Hold, ctx: &mut Context<Self>) -> Result<Held, Error> {
        let held = self.acquire_covering(msg.key.clone(), 0, msg.user.as_deref());
        if let Ok(h) = &held {
            let (key, asked) = (h.key.clone(), msg.key);
            let now = std::time::Instant::now();
            let on_hold = self
                .keys
                .get_mut(&key)
                .map(|s| s.holds.hold(&asked, now, msg.duration));
            match on_hold {
                Some(OnHold::Keep(after)) => self.check_hold(key, asked, after, ctx),
                // The hold's reference stays; the one just taken goes back.
                Some(OnHold::Extended) => self.release(&key, &asked, ctx),
                None => {}
            }
        }
        held
    }

    /// After `after`, releases the hold of `asked` on `key` if no read renewed it, or
    /// checks again when its deadline has moved: one timer per held key.
    fn check_hold(&mut self, key: Key, asked: Key, after: Duration, ctx: &mut Context<Self>) {
        ctx.run_later(after, move |act, ctx| {
            let now = std::time::Instant::now();
            let Some(slot) = act.keys.get_mut(&key) else {
                return;
            };
            match slot.holds.timer(&asked, now) {
                OnTimer::Release => act.release(&key, &asked, ctx),
                OnTimer::Again(after) => act.check_hold(key, asked, after, ctx),
                OnTimer::Gone => {}
            }
        });
    }
}

impl Handler<DrainAll> for Registry {
    type Result = usize;

    fn handle(&mut self, _msg: DrainAll, _ctx: &mut Self::Context) -> usize {
        let mut watchers = 0;
        for e in self.keys.values() {
            watchers += e.value.status.watchers.load(Ordering::Relaxed);
            e.value.addr.do_send(Drain);
        }
        watchers
    }
}

impl Handler<Declare> for Registry {
    type Result = ();

    fn handle(&mut self, msg: Declare, _ctx: &mut Self::Context) {
        for key in msg.keys {
            if self.declared.contains(&key) {
                continue;
            }
            match self.acquire_for(key.clone(), None) {
                Ok(_) => {
                    tracing::info!(key = %key, "declared interest: keeping the key cached (and published, in a fleet)");
                    self.declared.insert(key);
                }
                Err(error) => {
                    tracing::warn!(key = %key, %error, "declared interest refused: the key budget is spent")
                }
            }
        }
    }
}

impl Handler<Want> for Registry {
    type Result = Result<(), WantError>;

    fn handle(&mut self, msg: Want, _ctx: &mut Self::Context) -> Self::Result {
        let now = self.now_ms();
        let ttl = msg.ttl.as_millis() as u64;
        match self
            .wants
            .want(&msg.key, &msg.asker, now, ttl, msg.limits)?
        {
            Wanted::Again => Ok(()),
            Wanted::First => match self.acquire_for(msg.key.clone(), None) {
                Ok(_) => {
                    tracing::info!(key = %msg.key, asker = %msg.asker, "a NATS subscriber wants the key; keeping it cached");
                    Ok(())
                }
                Err(e) => {
                    self.wants.undo(&msg.key, &msg.asker);
                    Err(WantError::Budget(e.to_string()))
                }
            },
        }
    }
}

impl Registry {
    /// Releases the keys whose last subscriber interest expired.
    fn expire_wants(&mut self, ctx: &mut Context<Self>) {
        let now = self.now_ms();
        for key in self.wants.expire(now) {
            tracing::info!(key = %key, "no NATS subscriber wants the key any more");
            self.release(&key, &key, ctx);
        }
    }
}

impl Handler<GetDebugKeys> for Registry {
    type Result = MessageResult<GetDebugKeys>;

    fn handle(&mut self, _msg: GetDebugKeys, _ctx: &mut Self::Context) -> Self::Result {
        let mut keys: Vec<KeyInfo> = self
            .keys
            .iter()
            .map(|(k, e)| KeyInfo {
                id: k.clone(),
                key: k.to_string(),
                refcount: e.refs,
                resource_version: e.value.status.progress.load(Ordering::Relaxed).to_string(),
                synced: e.value.status.synced.load(Ordering::Relaxed),
                objects: e.value.status.objects.load(Ordering::Relaxed),
                watchers: e.value.status.watchers.load(Ordering::Relaxed),
                covering: {
                    let coalesced = self.coalescing.get(k).is_some_and(|c| c.label().is_some());
                    let mut c: Vec<CoveredKey> = e
                        .covering
                        .iter()
                        .map(|(asked, n)| CoveredKey {
                            key: asked.to_string(),
                            refcount: *n,
                            why: if coalesced && asked.group().as_ref() == Some(k) {
                                "coalesced"
                            } else {
                                "covered"
                            },
                        })
                        .collect();
                    c.sort_by(|a, b| a.key.cmp(&b.key));
                    c
                },
                coalescing: self.coalescing.get(k).and_then(|c| c.label()),
                declared: self.declared.contains(k),
                wanted_by: self.wants.askers(k),
                fleet: self.fleet.as_ref().map(|fleet| {
                    let f = e.value.status.fleet();
                    FleetKeyInfo {
                        role: f.role.map_or("", RoleKind::as_str),
                        owner: f.owner,
                        fleet_refcount: fleet.total(&e.value.token).max(e.refs as u64),
                        epoch: f.epoch,
                        seq: f.seq,
                    }
                }),
            })
            .collect();
        keys.sort_by(|a, b| a.key.cmp(&b.key));
        let mut groups: Vec<GroupInfo> = self
            .coalescing
            .iter()
            .map(|(k, c)| c.info(k, self.now_ms()))
            .collect();
        groups.sort_by(|a, b| a.key.cmp(&b.key));
        MessageResult(DebugKeys {
            replica: self.replica.clone(),
            keys,
            groups,
        })
    }
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}
