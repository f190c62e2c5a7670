//! The registry: key → refcount. The first reference starts a key's CachedObject; the last
//! release stops it after a grace period, so a reconnecting client does not restart the
//! upstream watch — the kubelet watch-based manager's `AddReference`/`DeleteReference`.
//!
//! It holds each CachedObject's strong `Addr` (the refcount decides its lifetime) and is
//! passed explicitly, never a global, so one process can host several replicas in tests.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use serde::Serialize;

use crate::cached_object::{CachedObject, Drain, KeyStatus, Stop};
use crate::config::CacheConfig;
use crate::core::key::Key;
use crate::core::subject::key_token;
use crate::fleet::Fleet;
use crate::source::SourceFactory;

struct Entry {
    addr: Addr<CachedObject>,
    /// The key's NATS token (fleet interest and ownership).
    token: String,
    refs: usize,
    /// Bumped on every release to zero, so a stale grace timer does nothing.
    generation: u64,
    status: Arc<KeyStatus>,
}

pub struct Registry {
    cfg: Arc<CacheConfig>,
    sources: Arc<dyn SourceFactory>,
    entries: HashMap<Key, Entry>,
    replica: String,
    fleet: Option<Arc<Fleet>>,
}

impl Registry {
    pub fn new(cfg: Arc<CacheConfig>, sources: Arc<dyn SourceFactory>, replica: String) -> Self {
        Registry {
            cfg,
            sources,
            entries: HashMap::new(),
            replica,
            fleet: None,
        }
    }

    /// A replica in a fleet: publishes its refcounts, and keeps owned keys while other
    /// replicas still hold references.
    pub fn with_fleet(mut self, fleet: Arc<Fleet>) -> Self {
        self.fleet = Some(fleet);
        self
    }

    /// Publishes every key's refcount (0 during the grace period withdraws it).
    fn publish_interest(&self) {
        let Some(fleet) = self.fleet.clone() else {
            return;
        };
        let keys: Vec<(String, u64)> = self
            .entries
            .values()
            .map(|e| (e.token.clone(), e.refs as u64))
            .collect();
        actix::spawn(async move { fleet.publish_interest(keys).await });
    }

    /// Stops a key whose grace period ran out, unless the fleet still needs it: an owner
    /// keeps the upstream watch while other replicas hold references.
    fn schedule_stop(&mut self, key: Key, generation: u64, ctx: &mut Context<Self>) {
        ctx.run_later(self.cfg.grace_period(), move |act, ctx| {
            let Some(e) = act.entries.get(&key) else {
                return;
            };
            if e.refs != 0 || e.generation != generation {
                return;
            }
            if let Some(fleet) = &act.fleet {
                let owned = e.status.fleet().role == "owner";
                if owned && fleet.others_interest(&e.token) > 0 {
                    act.schedule_stop(key, generation, ctx);
                    return;
                }
            }
            if let Some(e) = act.entries.remove(&key) {
                tracing::info!(key = %key, "no references left after the grace period; stopping key");
                e.addr.do_send(Stop);
            }
        });
    }

    fn acquire(&mut self, key: Key) -> Addr<CachedObject> {
        let cfg = &self.cfg;
        let sources = &self.sources;
        let entry = self.entries.entry(key.clone()).or_insert_with(|| {
            let status = Arc::new(KeyStatus::default());
            let addr = CachedObject::new(key.clone(), cfg.clone(), sources.clone(), status.clone())
                .start();
            tracing::info!(key = %key, "caching key");
            Entry {
                token: key_token(&key),
                addr,
                refs: 0,
                generation: 0,
                status,
            }
        });
        entry.refs += 1;
        // A reference taken during the grace period cancels the pending stop.
        entry.generation += 1;
        entry.addr.clone()
    }

    fn release(&mut self, key: &Key, ctx: &mut Context<Self>) {
        let Some(entry) = self.entries.get_mut(key) else {
            return;
        };
        entry.refs = entry.refs.saturating_sub(1);
        if entry.refs > 0 {
            return;
        }
        entry.generation += 1;
        let generation = entry.generation;
        self.schedule_stop(key.clone(), generation, ctx);
    }
}

impl Actor for Registry {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        if let Some(fleet) = &self.fleet {
            ctx.run_interval(fleet.interest_interval(), |act, _| act.publish_interest());
        }
    }
}

/// Take a reference on a key; the answer is its CachedObject.
#[derive(Message)]
#[rtype(result = "Addr<CachedObject>")]
pub struct Acquire {
    pub key: Key,
}

/// Drop a reference taken with [`Acquire`].
#[derive(Message)]
#[rtype(result = "()")]
pub struct Release {
    pub key: Key,
}

/// Take a reference held for `duration`: gets and lists keep their key cached for the
/// grace period so repeated reads hit the cache.
#[derive(Message)]
#[rtype(result = "Addr<CachedObject>")]
pub struct Hold {
    pub key: Key,
    pub duration: Duration,
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
        let n = self.entries.len();
        for (_, e) in self.entries.drain() {
            e.addr.do_send(Stop);
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
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct KeyInfo {
    pub key: String,
    pub refcount: usize,
    pub resource_version: String,
    pub synced: bool,
    pub objects: usize,
    pub watchers: usize,
    /// Fleet fields, present when running with `--nats`.
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub fleet: Option<FleetKeyInfo>,
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

impl Handler<Acquire> for Registry {
    type Result = MessageResult<Acquire>;

    fn handle(&mut self, msg: Acquire, _ctx: &mut Self::Context) -> Self::Result {
        MessageResult(self.acquire(msg.key))
    }
}

impl Handler<Release> for Registry {
    type Result = ();

    fn handle(&mut self, msg: Release, ctx: &mut Self::Context) {
        self.release(&msg.key, ctx);
    }
}

impl Handler<Hold> for Registry {
    type Result = MessageResult<Hold>;

    fn handle(&mut self, msg: Hold, ctx: &mut Self::Context) -> Self::Result {
        let addr = self.acquire(msg.key.clone());
        let key = msg.key;
        ctx.run_later(msg.duration, move |act, ctx| act.release(&key, ctx));
        MessageResult(addr)
    }
}

impl Handler<DrainAll> for Registry {
    type Result = usize;

    fn handle(&mut self, _msg: DrainAll, _ctx: &mut Self::Context) -> usize {
        let mut watchers = 0;
        for e in self.entries.values() {
            watchers += e.status.watchers.load(Ordering::Relaxed);
            e.addr.do_send(Drain);
        }
        watchers
    }
}

impl Handler<GetDebugKeys> for Registry {
    type Result = MessageResult<GetDebugKeys>;

    fn handle(&mut self, _msg: GetDebugKeys, _ctx: &mut Self::Context) -> Self::Result {
        let mut keys: Vec<KeyInfo> = self
            .entries
            .iter()
            .map(|(k, e)| KeyInfo {
                key: k.to_string(),
                refcount: e.refs,
                resource_version: e.status.progress.load(Ordering::Relaxed).to_string(),
                synced: e.status.synced.load(Ordering::Relaxed),
                objects: e.status.objects.load(Ordering::Relaxed),
                watchers: e.status.watchers.load(Ordering::Relaxed),
                fleet: self.fleet.as_ref().map(|fleet| {
                    let f = e.status.fleet();
                    FleetKeyInfo {
                        role: f.role,
                        owner: f.owner,
                        fleet_refcount: fleet.fleet_interest(&e.token).max(e.refs as u64),
                        epoch: f.epoch,
                        seq: f.seq,
                    }
                }),
            })
            .collect();
        keys.sort_by(|a, b| a.key.cmp(&b.key));
        MessageResult(DebugKeys {
            replica: self.replica.clone(),
            keys,
        })
    }
}
