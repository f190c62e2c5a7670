//! What flows between a key's source and its CachedObject, and what both share: source
//! messages and commands, where the key's events come from, the follower the fleet
//! attaches while this replica owns the key, and the key's status.
//!
//! Its own module so that arrows only run down: sources (`source`, `fleet`) and the
//! CachedObject both use these types, and neither imports the other.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize};
use std::sync::Arc;
use std::time::Duration;

use actix::{Message, Recipient};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::core::backfill::Replay;
use crate::core::event::StoreEvent;
use crate::core::key::Key;
use crate::core::object::EventType;
use crate::core::object::Object;

/// What a source tells its CachedObject.
#[derive(Debug)]
pub enum SourceMsg {
    /// A complete list of the key at `rv` (initial sync, relist, verification or probe).
    /// `gap`: the key missed events it cannot get back (a relist after a 410, a mirror's
    /// snapshot resync); the CachedObject then ends its watches, as the API server's
    /// cacher terminates its watchers when its reflector relists, and they resume (with a
    /// 410 when from before the list). Without it (a probe, a verification) the list's
    /// differences are events still on their way, emitted as synthetic events.
    Listed {
        items: Vec<Object>,
        rv: u64,
        gap: bool,
    },
    /// One upstream event at `rv`.
    Event {
        kind: EventType,
        object: Object,
        rv: u64,
    },
    /// The key is known complete up to `rv` (an upstream bookmark).
    Progress { rv: u64 },
    /// The answer to `SourceCmd::Replay`: the key at exactly `from` and its events
    /// since, or `None` when the upstream could not replay from there (compacted, its
    /// own window passed, or a failure).
    Replayed { from: u64, replay: Option<Replay> },
    /// The source failed and is backing off; reads keep being served from what is cached.
    Unhealthy { error: String },
    /// Where the key's events come from from now on (only with `--nats`, as its fleet
    /// role changes): an upstream read this replica runs (an owner's, or one cut off from
    /// NATS), whose messages the CachedObject reads itself; `None`: the source's own
    /// messages (a mirror's, fed from the owner over NATS).
    Reads(Option<UpstreamFeed>),
    /// From now on the key has this follower (this replica owns the key: the fleet's
    /// publisher), or none.
    Follow(Option<Follower>),
}

/// A follower of a key: gets every event, with its seq, and a bookmark carrying the last
/// seq every `bookmark_every` — the fleet's publisher of a key this replica owns, which
/// publishes them over NATS under `epoch` (events and heartbeats). Sent without waiting:
/// what it cannot take is dropped (`kcache_fleet_listener_dropped_events_total`), and the
/// mirrors resynchronise from the seq it skips.
#[derive(Debug)]
pub struct Follower {
    pub link: Recipient<Follow>,
    pub bookmark_every: Duration,
    pub epoch: u64,
}

/// What a key sends its follower.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub enum Follow {
    Event(Arc<StoreEvent>),
    /// The key's last seq and progress RV.
    Bookmark {
        seq: u64,
        rv: u64,
    },
}

/// An upstream read handed to the CachedObject while this replica owns the key (or
/// watches it locally): its messages go straight to the CachedObject, not through the
/// fleet source, and the CachedObject's commands straight to it. The fleet source keeps
/// the read's handle and stops it when the role changes; the stream then ends.
#[derive(Debug)]
pub struct UpstreamFeed {
    pub events: mpsc::Receiver<SourceMsg>,
    pub commands: mpsc::Sender<SourceCmd>,
}

/// Asks an owner's CachedObject for what a mirror's snapshot request needs: the key's
/// state and the seq it corresponds to, or `None` while not synced.
pub struct TakeSnapshot {
    /// The requester's progress: when the window still holds every event after it, the
    /// answer is those events instead of the whole state.
    pub since: Option<u64>,
}

impl actix::Message for TakeSnapshot {
    type Result = Option<OwnerSnapshot>;
}

/// What an owner's CachedObject hands its source to answer a snapshot request.
#[derive(Debug)]
pub struct OwnerSnapshot {
    pub objects: Vec<Arc<Object>>,
    /// Set instead of `objects` when the request's `since` could be replayed.
    pub replay: Option<Vec<Arc<StoreEvent>>>,
    pub rv: u64,
    pub seq: u64,
}

/// What a CachedObject may ask of its source.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SourceCmd {
    /// Establish progress now with a consistent list (a read is waiting for a newer RV).
    Probe,
    /// Replay the key from `from` up to `to` (its list RV), answered with
    /// `SourceMsg::Replayed`: a watch from an RV older than a young key's list is served
    /// from a window extended back (`core::backfill`), as the API server would serve it.
    Replay(ReplayCmd),
}

/// What `SourceCmd::Replay` asks, for a task of its own ([`UpstreamSource::spawn_replay`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplayCmd {
    pub from: u64,
    pub to: u64,
    pub max_events: usize,
}

/// A running source's control side; dropping it stops the task. Its events arrive on the
/// receiver [`SourceFactory::start`] returns beside it.
pub struct SourceHandle {
    pub commands: mpsc::Sender<SourceCmd>,
    task: JoinHandle<()>,
    abort_on_drop: bool,
}

impl SourceHandle {
    pub fn new(commands: mpsc::Sender<SourceCmd>, task: JoinHandle<()>) -> Self {
        SourceHandle {
            commands,
            task,
            abort_on_drop: true,
        }
    }

    /// A handle whose task is not aborted on drop: it sees its command channel close and
    /// cleans up itself (a fleet source releases its lease).
    pub fn graceful(commands: mpsc::Sender<SourceCmd>, task: JoinHandle<()>) -> Self {
        SourceHandle {
            commands,
            task,
            abort_on_drop: false,
        }
    }
}

impl SourceHandle {
    /// The source's task has ended by itself.
    pub fn is_finished(&self) -> bool {
        self.task.is_finished()
    }
}

impl Drop for SourceHandle {
    fn drop(&mut self) {
        if self.abort_on_drop {
            self.task.abort();
        }
    }
}

/// Starts sources for keys. The registry holds one and hands it to each CachedObject.
pub trait SourceFactory: Send + Sync + 'static {
    /// `status` is the key's shared status: a fleet source reads the progress RV to resume
    /// from and records the key's owner, epoch and seq for `/debug/keys`.
    /// `snapshots` reaches the key's CachedObject, for an owner answering mirrors.
    fn start(
        &self,
        key: &Key,
        status: &Arc<KeyStatus>,
        snapshots: Recipient<TakeSnapshot>,
    ) -> (SourceHandle, mpsc::Receiver<SourceMsg>);

    /// How many objects `key` holds upstream, without reading them (`core::coalesce`
    /// weighs a namespace before it is pulled in), and their names if there are at most
    /// `names_up_to`; `None` when the upstream did not say.
    fn count(
        &self,
        _key: &Key,
        _names_up_to: usize,
    ) -> futures::future::BoxFuture<'static, Option<Counted>> {
        Box::pin(async { None })
    }
}

/// A key's objects as counted upstream ([`SourceFactory::count`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Counted {
    pub objects: u64,
    /// Their names, when the count's list held them all.
    pub names: Option<std::collections::HashSet<String>>,
}

/// What the registry and `/debug/keys` can see of a key without a message round trip.
///
/// Shared beside the messages, on purpose: the registry reads it for every request it
/// routes (is the covering key synced, does its window reach the watch's RV) and for every
/// key on each coalescing check and `/debug/keys`, while the keys run on other arbiters'
/// threads. A message per read would make routing wait on the busiest key's mailbox (a
/// key fanning out a burst of events), and the registry must never wait on a key. Only
/// the key's CachedObject writes it (`CachedObject::show_status`, after each input) and
/// the fleet source its `fleet` part. Readers get a value at most one input old; where it
/// routes a request, the key still decides what it serves (its `KeyCore`): a watch routed
/// to a covering key whose window has just moved gets that key's own 410.
#[derive(Debug, Default)]
pub struct KeyStatus {
    pub progress: AtomicU64,
    /// The oldest RV a watch can start from without a 410 (`Window::replayable_from`).
    pub replayable_from: AtomicU64,
    pub synced: AtomicBool,
    pub objects: AtomicUsize,
    pub watchers: AtomicUsize,
    /// The key's place in the fleet (`--nats` only).
    pub fleet: std::sync::Mutex<FleetInfo>,
}

/// `/debug/keys`' fleet fields of a key.
#[derive(Debug, Default, Clone)]
pub struct FleetInfo {
    /// The key's role; `None` without NATS.
    pub role: Option<RoleKind>,
    /// The owner's replica id, when known.
    pub owner: String,
    /// The owner's epoch (its lease revision).
    pub epoch: u64,
    /// The last seq of the owner's event stream this replica published or applied.
    pub seq: u64,
}

impl KeyStatus {
    pub fn fleet(&self) -> FleetInfo {
        self.fleet.lock().map(|f| f.clone()).unwrap_or_default()
    }

    pub fn update_fleet(&self, f: impl FnOnce(&mut FleetInfo)) {
        if let Ok(mut info) = self.fleet.lock() {
            f(&mut info);
        }
    }
}

/// A key's role in the fleet, as `/debug/keys` shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RoleKind {
    Owner,
    Mirror,
    Local,
}

impl RoleKind {
    pub fn as_str(self) -> &'static str {
        match self {
            RoleKind::Owner => "owner",
            RoleKind::Mirror => "mirror",
            RoleKind::Local => "local",
        }
    }
}
