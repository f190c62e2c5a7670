//! The registry's side of adaptive coalescing: every second it counts the names watched
//! per namespace and resource, asks `core::coalesce` what to do, and does it — counts a
//! namespace's objects upstream, starts the namespace key and has the name keys hand their
//! watchers over to it, or starts the name keys again and has the namespace key hand the
//! names' watchers back. Watchers move without a gap, a duplicate or an RV going back
//! (`CachedObject`'s `HandOver`, the watcher's `Move`).

use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::sync::oneshot;

use actix::prelude::*;
use serde::Serialize;

use super::{Moved, Registry};
use crate::cached_object::{HandOver, HandedOver};
use crate::core::coalesce::{self, Decision, Group, OnRequest};
use crate::core::cover::KeyState;
use crate::core::holds::OnHold;
use crate::core::key::{Key, Scope};
use crate::core::refs::Released;
use crate::core::subject::key_token;
use crate::metrics as m;

/// How often the registry looks at its namespaces.
pub(super) const CHECK_EVERY: Duration = Duration::from_secs(1);

/// The longest a request waits for its namespace's object count before it starts its
/// name key anyway, and the longest the count may take (an upstream that does not answer
/// a small metadata list in this time will not serve the namespace key's list any sooner).
pub const COUNT_WAIT: Duration = Duration::from_secs(2);

/// A namespace's names are read with its count when it has at most this many objects:
/// then a request's name is known to exist or not before its key runs (watching names
/// that do not exist must not pull a namespace in). A bigger namespace is not coalesced
/// from requests in flight, only by the check (needing a quarter of 1,000 names at the
/// default fraction, it is no kubelet's). The list carries each object's metadata
/// (annotations and managed fields included: hundreds of bytes to kilobytes an object;
/// only the names are kept), once per group per count TTL.
const NAMES_UP_TO: usize = 1000;

/// How long requests of a group without a fresh count gather before they are decided
/// together, however soon the count comes (on loopback a `limit` list answers in a
/// millisecond, before the rest of a burst has arrived): until no request of the group
/// came for `GATHER`, at most `GATHER_AT_MOST` after the first. A lone request waits
/// `GATHER`. In a storm (`coalesce::AskRate`: many name keys asked across the registry),
/// the window is `GATHER_AT_MOST` from the group's first request, or until the names in
/// flight suffice: kubelets reconnecting one after another each bring a few names of a
/// namespace, and reach it 100–250 ms apart (each connection's TLS handshake) — with a
/// 100 ms quiet gap, 30 nodes started 136 name keys before 20 coalescings, with 250 ms
/// 122. Paid once per group per count TTL.
const GATHER: Duration = Duration::from_millis(100);
const GATHER_AT_MOST: Duration = Duration::from_secs(1);

/// After a coalescing decided at a request, how often the name keys started before it are
/// asked to hand their watchers over (once the namespace key has synced), instead of at
/// the next check; and how many times.
const HURRY_EVERY: Duration = Duration::from_millis(100);
const HURRY_TRIES: u32 = 30;

/// What the registry remembers of one namespace and resource (keyed by its namespace key).
#[derive(Debug, Default)]
pub(super) struct Coalescing {
    objects: Option<(u64, u64)>,
    /// The names of the group's objects when its count read them (`NAMES_UP_TO`).
    names: Option<HashSet<String>>,
    counting: bool,
    below_since_ms: Option<u64>,
    state: State,
    /// The figures of the last check: names (or nodes) watched and the objects they hold.
    last: (usize, Option<u64>),
    /// Names asked since the last check whose keys were not running: the requests in
    /// flight, counted in by `on_request` (`core::coalesce`).
    asked: HashSet<Key>,
    /// Requests waiting for the group's object count before they start a name key.
    waiting: Vec<oneshot::Sender<()>>,
    /// When the gathering began and until when (registry ms) requests gather before they
    /// are decided together (`GATHER`).
    gather_from_ms: u64,
    gather_until_ms: u64,
}

/// One group in `/debug/keys`: its state and the figures the last decision was made on.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GroupInfo {
    /// The namespace key (or cluster key), for deciding who may see it.
    #[serde(skip)]
    pub id: Key,
    /// The namespace key (or cluster key) the names (or nodes) coalesce into.
    pub key: String,
    /// `apart`, `coalesced` or `splitting`.
    pub state: &'static str,
    /// Names (nodes) watched, fleet-wide in a fleet.
    pub names: usize,
    /// Objects those keys hold, when known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub held: Option<u64>,
    /// The group's object count, when known, and how old it is.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub objects: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub counted_secs_ago: Option<u64>,
    /// Since when (seconds) it has been below the split threshold, while coalesced.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub below_for_secs: Option<u64>,
}

#[derive(Debug, Default)]
enum State {
    #[default]
    Apart,
    /// The registry holds a reference on the namespace key, which serves the names.
    Coalesced,
    /// The registry holds the name keys it started again (with whether each has taken
    /// its watchers back) and still the namespace key.
    Splitting(HashMap<Key, bool>),
}

impl Coalescing {
    /// The group's figures with the names asked since the last check counted in: each
    /// was not running when asked, so it is not in the last check's figures, and a name
    /// key holds its object or none (counted as one, as `held` counts a name it cannot
    /// see).
    fn in_flight(&self) -> Group {
        let names = self.last.0 + self.asked.len();
        // A name asked weighs its object when the count says it exists; unknown, nothing
        // (names that do not exist must not pull the namespace in).
        let existing = self.asked.iter().filter(|k| match (&k.scope, &self.names) {
            (Scope::Name { name, .. }, Some(names)) => names.contains(name),
            _ => false,
        });
        let held = self.last.1.unwrap_or(0) + existing.count() as u64;
        Group {
            names,
            held: Some(held),
            objects: self.objects,
            counting: self.counting,
            coalesced: !matches!(self.state, State::Apart),
            below_since_ms: self.below_since_ms,
        }
    }

    fn wait(&mut self) -> oneshot::Receiver<()> {
        let (tx, rx) = oneshot::channel();
        self.waiting.push(tx);
        rx
    }

    pub(super) fn coalesced(&self) -> bool {
        matches!(self.state, State::Coalesced)
    }

    pub(super) fn label(&self) -> Option<&'static str> {
        match self.state {
            State::Apart => None,
            State::Coalesced => Some("coalesced"),
            State::Splitting(_) => Some("splitting"),
        }
    }

    pub(super) fn info(&self, key: &Key, now_ms: u64) -> GroupInfo {
        GroupInfo {
            id: key.clone(),
            key: key.to_string(),
            state: self.label().unwrap_or("apart"),
            names: self.last.0,
            held: self.last.1,
            objects: self.objects.map(|(n, _)| n),
            counted_secs_ago: self.objects.map(|(_, at)| now_ms.saturating_sub(at) / 1000),
            below_for_secs: self
                .below_since_ms
                .map(|at| now_ms.saturating_sub(at) / 1000),
        }
    }
}

impl Registry {
    /// The group's small keys that run here and are watched (`Refs::is_watched`): with
    /// references, or served by the group key.
    fn running_names(&self, big: &Key) -> Vec<Key> {
        self.keys
            .group(big)
            .into_iter()
            .flat_map(|g| g.running.iter())
            .filter(|k| self.keys.is_watched(k, big))
            .cloned()
            .collect()
    }

    /// The objects the small keys of a group hold, when known. A running name key holds
    /// its object or none (watching names that do not exist must not pull the namespace
    /// in); a name served by the namespace key, or watched on another replica only, counts
    /// as the one object it may be. Node keys hold their pods, which nobody counts once the
    /// cluster key serves them.
    fn held(&self, big: &Key, names: usize) -> Option<u64> {
        let cluster = matches!(big.scope, Scope::Cluster);
        let group = self.keys.group(big);
        let (mut held, mut running) = (0, 0);
        for k in group.into_iter().flat_map(|g| g.running.iter()) {
            if let Some(e) = self.keys.get(k).filter(|_| self.keys.is_watched(k, big)) {
                held += e.value.status.objects.load(Ordering::Relaxed) as u64;
                running += 1;
            }
        }
        // Watched node keys that do not run here: their pods are not counted.
        if cluster {
            return (running == group.map_or(0, |g| g.names)).then_some(held);
        }
        Some(held + names.saturating_sub(running) as u64)
    }

    pub(super) fn check_coalescing(&mut self, ctx: &mut Context<Self>) {
        let t = self.cfg.coalesce_thresholds();
        if t.min_names == 0 && self.coalescing.is_empty() {
            return;
        }
        let now = self.now_ms();
        self.sync_own_interest();
        if let Some(f) = &mut self.fleet {
            f.expire();
        }
        // The reference table keeps each group's figures as references come and go: this
        // costs the groups and their running keys, not every covered name.
        let mut groups: HashSet<Key> = self
            .keys
            .groups()
            .filter(|(_, g)| g.names > 0)
            .map(|(k, _)| k.clone())
            .collect();
        groups.extend(self.coalescing.keys().cloned());
        let mut saved = 0;
        for ns_key in groups {
            // In a fleet every replica counts the fleet's names, so all reach the same
            // decision; a replica moves only its own watchers.
            let watched = match &self.fleet {
                Some(fleet) => fleet.names_watched(&ns_key),
                None => self.keys.group(&ns_key).map_or(0, |g| g.names),
            };
            // A running, synced namespace key knows its count.
            let running = self
                .keys
                .get(&ns_key)
                .filter(|e| e.value.status.synced.load(Ordering::Relaxed));
            let own_count =
                running.map(|e| (e.value.status.objects.load(Ordering::Relaxed) as u64, now));
            let c = self.coalescing.entry(ns_key.clone()).or_default();
            if own_count.is_some() {
                c.objects = own_count;
            }
            if matches!(c.state, State::Splitting(_)) {
                // A split runs to its end before anything is decided again.
                self.carry_on(&ns_key, ctx);
                continue;
            }
            if c.coalesced() {
                // One upstream watch where each of the names or nodes would have had one.
                saved += watched.saturating_sub(1);
            }
            let held = self.held(&ns_key, watched);
            let c = self.coalescing.entry(ns_key.clone()).or_default();
            c.last = (watched, held);
            // The names asked since the last check run now (or are served by the
            // namespace key): `watched` counts them. Those still waiting for a count are
            // not counted anywhere else.
            c.waiting.retain(|w| !w.is_closed());
            if c.waiting.is_empty() {
                c.asked.clear();
            }
            let group = Group {
                names: watched,
                held,
                objects: c.objects,
                counting: c.counting,
                coalesced: !matches!(c.state, State::Apart),
                below_since_ms: c.below_since_ms,
            };
            match coalesce::decide(&group, &t, now) {
                Decision::Keep => {}
                Decision::MarkBelow => c.below_since_ms = Some(now),
                Decision::ClearBelow => c.below_since_ms = None,
                Decision::Count => {
                    c.counting = true;
                    self.count(ns_key.clone(), ctx);
                }
                Decision::Coalesce => self.coalesce(&ns_key, watched),
                Decision::Split => self.split(&ns_key),
            }
            self.carry_on(&ns_key, ctx);
        }
        metrics::gauge!(m::COALESCE_SAVED_WATCHES).set(saved as f64);
        // Forget namespaces with nothing left to remember.
        self.coalescing.retain(|_, c| {
            !matches!(c.state, State::Apart)
                || c.counting
                || c.objects
                    .is_some_and(|(_, at)| now.saturating_sub(at) < t.count_ttl_ms)
        });
    }

    /// A request would start a name key (or node key) that another replica serves from
    /// its group's key: the fleet has coalesced the group (every replica decides on the
    /// same fleet-wide figures, so this one would too at its next check). Adopted now,
    /// before the request starts a name key — a lease, an upstream list and watch — that
    /// the check would stop a second later: a replica restarting into a fleet that has
    /// coalesced a namespace would otherwise start every name key of it again.
    pub(super) fn adopt_fleet_coalescing(&mut self, asked: &Key) {
        // Cheapest first: this runs for every request of a name or node key.
        let Some(fleet) = &self.fleet else {
            return;
        };
        if self.keys.contains(asked) || self.cfg.coalesce_thresholds().min_names == 0 {
            return;
        }
        let Some(group) = asked.group() else {
            return;
        };
        if self
            .coalescing
            .get(&group)
            .is_some_and(|c| !matches!(c.state, State::Apart))
            || fleet.covered_elsewhere(&key_token(asked)) == 0
        {
            return;
        }
        let c = self.coalescing.entry(group.clone()).or_default();
        let names = c.last.0;
        tracing::info!(key = %group, name = %asked, "the fleet serves this name from its namespace key; coalescing here too");
        self.coalesce(&group, names);
    }

    /// Before a request of `asked` starts its name key: its group decided from the
    /// requests in flight (`coalesce::on_request`) — coalesced now if they suffice, so
    /// the request (and the rest of its burst) is served by the namespace key and no name
    /// key starts only to be stopped at the next check. `Some`: the request waits for the
    /// group's object count (the answer says nothing; the request is then routed afresh).
    pub(super) fn before_start(
        &mut self,
        asked: &Key,
        ctx: &mut Context<Self>,
    ) -> Option<oneshot::Receiver<()>> {
        // Cheapest first: this runs for every request.
        if !matches!(asked.scope, Scope::Name { .. }) || self.keys.contains(asked) {
            // Node keys are left to the check: what a node key holds (its pods) is
            // known only once it runs.
            return None;
        }
        let t = self.cfg.coalesce_thresholds();
        let group = asked.group()?;
        if t.min_names == 0 || self.state(&group) == KeyState::Synced {
            // A synced namespace key covers the name already (`cover::route`).
            return None;
        }
        self.adopt_fleet_coalescing(asked);
        // A name other replicas watch is in the last check's fleet-wide figures already.
        let elsewhere = self.fleet.as_ref().is_some_and(|f| {
            let token = key_token(asked);
            f.others(&token) > 0 || f.covered_elsewhere(&token) > 0
        });
        let now = self.now_ms();
        let c = self.coalescing.entry(group.clone()).or_default();
        if !matches!(c.state, State::Apart) {
            return None;
        }
        if !elsewhere {
            c.asked.insert(asked.clone());
        }
        let g = c.in_flight();
        let gathering = now < c.gather_until_ms;
        let storm = self.asks.note(now) >= coalesce::STORM_ASKS;
        match coalesce::on_request(&g, &t, now, gathering) {
            OnRequest::Start => None,
            OnRequest::Coalesce => {
                tracing::info!(key = %group, names = g.names, "coalescing from the requests in flight");
                self.coalesce(&group, g.names);
                // Those gathered with it are served by the namespace key too.
                self.decide_waiting(&group, ctx);
                self.hurry_handover(group, 0, ctx);
                None
            }
            OnRequest::Wait => {
                let c = self.coalescing.entry(group).or_default();
                if gathering {
                    // The burst goes on: the window stays open while requests keep coming
                    // (in a storm, to its longest).
                    let most = c.gather_from_ms + GATHER_AT_MOST.as_millis() as u64;
                    let gap = if storm {
                        most
                    } else {
                        now + GATHER.as_millis() as u64
                    };
                    c.gather_until_ms = c.gather_until_ms.max(gap.min(most));
                }
                Some(c.wait())
            }
            OnRequest::Count => {
                let c = self.coalescing.entry(group.clone()).or_default();
                c.counting = true;
                c.gather_from_ms = now;
                let window = if storm { GATHER_AT_MOST } else { GATHER };
                c.gather_until_ms = now + window.as_millis() as u64;
                let waiting = c.wait();
                self.count(group.clone(), ctx);
                self.end_gathering(group, window, ctx);
                Some(waiting)
            }
        }
    }

    /// Ends the group's gathering window once no request has extended it for `after`.
    fn end_gathering(&mut self, group: Key, after: Duration, ctx: &mut Context<Self>) {
        ctx.run_later(after, move |act, ctx| {
            let now = act.now_ms();
            let Some(c) = act.coalescing.get_mut(&group) else {
                return;
            };
            if now < c.gather_until_ms {
                let left = Duration::from_millis(c.gather_until_ms - now);
                return act.end_gathering(group, left, ctx);
            }
            c.gather_until_ms = 0;
            act.decide_waiting(&group, ctx);
        });
    }

    /// Has the name keys that ran before a coalescing decided at a request (the names
    /// asked since the last check) hand their watchers over as soon as the namespace key
    /// has synced, rather than at the next check: every `HURRY_EVERY` until none has
    /// watchers left, at most `HURRY_TRIES` times.
    fn hurry_handover(&mut self, group: Key, tries: u32, ctx: &mut Context<Self>) {
        ctx.run_later(HURRY_EVERY, move |act, ctx| {
            let Some(c) = act.coalescing.get(&group).filter(|c| c.coalesced()) else {
                return;
            };
            // Every name key of the group that runs here hands over, these among them.
            let names = c.asked.clone();
            act.carry_on(&group, ctx);
            let left = names.iter().any(|n| {
                act.keys
                    .get(n)
                    .is_some_and(|e| e.value.status.watchers.load(Ordering::Relaxed) > 0)
            });
            if left && tries + 1 < HURRY_TRIES {
                act.hurry_handover(group, tries + 1, ctx);
            }
        });
    }

    fn count(&mut self, ns_key: Key, ctx: &mut Context<Self>) {
        let now = self.now_ms();
        let names_up_to = match ns_key.scope {
            Scope::Namespace(_) => NAMES_UP_TO,
            _ => 0,
        };
        // Bounded as the requests' waits are: a count that takes longer counts as failed
        // (the group is then left apart until it is counted again).
        let counted = tokio::time::timeout(COUNT_WAIT, self.sources.count(&ns_key, names_up_to));
        let counted = async move { counted.await.ok().flatten() };
        ctx.spawn(counted.into_actor(self).map(move |n, act, ctx| {
            if let Some(c) = act.coalescing.get_mut(&ns_key) {
                c.counting = false;
                // A namespace that cannot be counted is not pulled in, until asked again.
                c.objects = Some((n.as_ref().map_or(u64::MAX, |n| n.objects), now));
                c.names = n.and_then(|n| n.names);
                tracing::debug!(key = %ns_key, objects = ?c.objects, "counted the namespace's objects");
            }
            act.decide_waiting(&ns_key, ctx);
        }));
    }

    /// The group's count came: decides it with the requests that waited for it, and lets
    /// them go on.
    fn decide_waiting(&mut self, group: &Key, ctx: &mut Context<Self>) {
        let t = self.cfg.coalesce_thresholds();
        let now = self.now_ms();
        let Some(c) = self.coalescing.get_mut(group) else {
            return;
        };
        let apart = matches!(c.state, State::Apart);
        // Apart, they wait for both the count and the end of the window (whichever comes
        // last decides); once coalesced, routing serves them.
        if c.waiting.is_empty() || (apart && (c.counting || now < c.gather_until_ms)) {
            return;
        }
        // Those that stopped waiting (timed out, or their client left) are not counted.
        let waiting: Vec<_> = std::mem::take(&mut c.waiting)
            .into_iter()
            .filter(|w| !w.is_closed())
            .collect();
        let g = c.in_flight();
        if apart && coalesce::on_request(&g, &t, now, false) == OnRequest::Coalesce {
            tracing::info!(key = %group, names = g.names, waited = waiting.len(), "coalescing from the requests in flight");
            self.coalesce(group, g.names);
            self.hurry_handover(group.clone(), 0, ctx);
        }
        // Coalesced now or meanwhile (the fleet's figures at a check): routing serves them;
        // apart (or refused a key budget for the namespace key): they start name keys.
        let coalesced = self
            .coalescing
            .get(group)
            .is_some_and(Coalescing::coalesced);
        let result = if coalesced { "coalesced" } else { "apart" };
        metrics::counter!(m::COALESCE_REQUEST_WAITS, "result" => result)
            .increment(waiting.len() as u64);
        for w in waiting {
            let _ = w.send(());
        }
    }

    fn coalesce(&mut self, ns_key: &Key, names: usize) {
        // Starting the namespace key passes the replica's key budget, as any key start.
        if !self.keys.contains(ns_key) {
            if let Err(e) = self.keys.admit(None) {
                self.refused(ns_key);
                tracing::info!(key = %ns_key, error = %e, "not coalescing: no key budget for the namespace key");
                return;
            }
        }
        self.acquire(ns_key, ns_key);
        if let Some(c) = self.coalescing.get_mut(ns_key) {
            c.state = State::Coalesced;
            c.below_since_ms = None;
        }
        let r = &ns_key.resource;
        metrics::counter!(m::COALESCINGS, "group" => r.group.clone(), "resource" => r.resource.clone()).increment(1);
        tracing::info!(key = %ns_key, names, "coalescing the namespace's name keys into its namespace key");
    }

    fn split(&mut self, ns_key: &Key) {
        let mut started = HashMap::new();
        for name in &self.keys.watched_in(ns_key) {
            // Only the names the namespace key serves move back; a name key that still
            // runs keeps its own watchers. A name key start passes the replica's key
            // budget: past it, the name stays served by the namespace key (whose
            // watchers hold it running).
            if !self.keys.contains(name) {
                if let Err(e) = self.keys.admit(None) {
                    self.refused(name);
                    tracing::info!(key = %name, error = %e, "split: name key left on the namespace key, no key budget");
                    continue;
                }
            }
            self.acquire(name, name);
            started.insert(name.clone(), false);
        }
        if let Some(c) = self.coalescing.get_mut(ns_key) {
            c.state = State::Splitting(started);
            c.below_since_ms = None;
        }
        let r = &ns_key.resource;
        metrics::counter!(m::COALESCE_SPLITS, "group" => r.group.clone(), "resource" => r.resource.clone()).increment(1);
        tracing::info!(key = %ns_key, "splitting the namespace key back into name keys");
    }

    /// Moves watchers while coalesced or splitting, and ends a split once every name key
    /// has its watchers back.
    fn carry_on(&mut self, ns_key: &Key, ctx: &mut Context<Self>) {
        let Some(ns) = self.keys.get(ns_key) else {
            return;
        };
        let (ns_addr, ns_link, ns_status) = (
            ns.value.addr.clone(),
            ns.value.link.clone(),
            ns.value.status.clone(),
        );
        let Some(c) = self.coalescing.get(ns_key) else {
            return;
        };
        match &c.state {
            State::Apart => {}
            State::Coalesced => {
                let synced = ns_status.synced.load(Ordering::Relaxed);
                let mut held = Vec::new();
                // Only the names whose own keys run here have anything to hand over.
                for name in &self.running_names(ns_key) {
                    let Some(e) = self.keys.get(name) else {
                        continue;
                    };
                    if synced && !e.value.holds.is_empty() {
                        held.push(name.clone());
                    }
                    if e.value.status.watchers.load(Ordering::Relaxed) == 0 {
                        continue;
                    }
                    e.value.addr.do_send(HandOver {
                        link: ns_link.clone(),
                        to_status: ns_status.clone(),
                        only_asked: None,
                    });
                }
                for name in held {
                    self.move_holds(&name, ns_key, ctx);
                }
            }
            State::Splitting(started) => {
                if started.values().all(|done| *done) {
                    let held: Vec<Key> = started.keys().cloned().collect();
                    for k in &held {
                        self.release(k, k, ctx);
                    }
                    self.release(ns_key, ns_key, ctx);
                    if let Some(c) = self.coalescing.get_mut(ns_key) {
                        c.state = State::Apart;
                    }
                    tracing::info!(key = %ns_key, names = held.len(), "split done");
                    return;
                }
                for (name, done) in started {
                    let Some(e) = self.keys.get(name).filter(|_| !done) else {
                        continue;
                    };
                    let hand = ns_addr.send(HandOver {
                        link: e.value.link.clone(),
                        to_status: e.value.status.clone(),
                        only_asked: Some(name.clone()),
                    });
                    let (ns_key, name) = (ns_key.clone(), name.clone());
                    ctx.spawn(hand.into_actor(self).map(move |res, act, _| {
                        let Ok(HandedOver { left: 0, .. }) = res else {
                            return;
                        };
                        if let Some(Coalescing {
                            state: State::Splitting(started),
                            ..
                        }) = act.coalescing.get_mut(&ns_key)
                        {
                            started.insert(name, true);
                        }
                    }));
                }
            }
        }
    }
}

impl Registry {
    /// Moves the read holds on name key `from` to its coalesced namespace key `to`, which
    /// serves those reads from now on, with what is left of each: a name key a reflector's
    /// list started (held for the grace period) stops once its watchers have moved too,
    /// instead of holding a second upstream watch until its hold runs out.
    fn move_holds(&mut self, from: &Key, to: &Key, ctx: &mut Context<Self>) {
        let Some(slot) = self.keys.get_mut(from) else {
            return;
        };
        let now = std::time::Instant::now();
        for (asked, until) in slot.holds.take() {
            // Taken on the namespace key first, so that the name key's release may stop it.
            self.acquire(to, &asked);
            let left = until.saturating_duration_since(now);
            match self
                .keys
                .get_mut(to)
                .map(|s| s.holds.hold(&asked, now, left))
            {
                Some(OnHold::Keep(after)) => self.check_hold(to.clone(), asked.clone(), after, ctx),
                Some(OnHold::Extended) => self.release(to, &asked, ctx),
                None => {}
            }
            match self.keys.release(from, &asked) {
                Released::Idle { generation } => {
                    self.stop_handed_over(from.clone(), generation, ctx)
                }
                Released::Held | Released::Unknown => {}
            }
        }
    }
}

impl Handler<Moved> for Registry {
    type Result = ();

    fn handle(&mut self, msg: Moved, ctx: &mut Self::Context) {
        self.acquire(&msg.to, &msg.asked);
        // A name key whose watchers all moved to its coalesced namespace key is stopped at
        // once: the namespace key serves every request of the name from now on, so the
        // grace period would only keep a second upstream watch open for nothing.
        let into_coalesced = msg.from.group().as_ref() == Some(&msg.to)
            && self
                .coalescing
                .get(&msg.to)
                .is_some_and(Coalescing::coalesced);
        match self.keys.release(&msg.from, &msg.asked) {
            Released::Idle { generation } if into_coalesced => {
                self.stop_handed_over(msg.from.clone(), generation, ctx)
            }
            Released::Idle { generation } => self.schedule_stop(msg.from.clone(), generation, ctx),
            Released::Held | Released::Unknown => {}
        }
        let r = &msg.to.resource;
        metrics::counter!(m::COALESCE_MOVED_WATCHERS, "group" => r.group.clone(), "resource" => r.resource.clone()).increment(1);
    }
}
