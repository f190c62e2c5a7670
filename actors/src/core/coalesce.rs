//! Adaptive coalescing: when enough names of one namespace are watched, one namespace
//! key (one upstream watch) serves them all instead of one name key each; when few are
//! left, they split back. The same for node keys (a kubelet's pods) onto the cluster pods
//! key.
//!
//! The cost model. A name key costs the API server one watch (a cacheWatcher, its
//! goroutines and buffers, a few KiB) and kcache one key; a namespace key costs one watch
//! and kcache a copy of **every** object in the namespace. Coalescing saves `names - 1`
//! upstream watches at the price of holding `objects - names` objects nobody asked for, so
//! it pays when the objects the small keys already hold are a large enough share of what
//! the big key would: `names >= min_names` and `held >= fraction × objects`, where a name
//! key holds its object or none (watched names that do not exist weigh nothing, so they
//! cannot pull a namespace in) and a node key its node's pods. A namespace with 10,000 Secrets
//! of which 3 are watched never qualifies; 5,000 node keys holding 140,000 of 150,000
//! pods do. Splitting back uses a lower share (`split_fraction`, or fewer than half of
//! `min_names` keys) and must hold for `split_after_ms`, so a group near the threshold
//! does not flap.
//!
//! `decide` is pure: the registry gathers each namespace's figures, carries out the
//! decision (count the namespace's objects upstream, start the namespace key and move
//! watchers onto it, or back) and feeds the result in again.
//!
//! The same decision is taken again for each request that would start a name key
//! (`on_request`), with the names asked since the last check counted in: a burst of
//! kubelet watches (a node restart storm, a new user's first thousand watches) is
//! coalesced from the requests in flight, instead of starting every name key — its list,
//! its watch, its lease in a fleet — for the once-a-second check to stop. A request whose
//! group has no fresh object count waits for one (one list, taken once per
//! `count_ttl_ms`) and for a short gathering window; the requests that arrive meanwhile
//! wait with it and are counted. After the window, names below `min_names` start their
//! keys and the name that reaches it coalesces the group at once, so a burst that
//! trickles in starts fewer than `min_names` name keys per namespace (stopped as soon as
//! their watchers have moved).

/// Thresholds (configuration: `cache.coalesce_*`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Thresholds {
    /// 0 turns coalescing off.
    pub min_names: usize,
    pub fraction: f64,
    pub split_fraction: f64,
    pub split_after_ms: u64,
    /// How long an object count is trusted.
    pub count_ttl_ms: u64,
}

/// One namespace and resource, as the registry sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Group {
    /// Names (or nodes) with references: running small keys and those the big key serves.
    pub names: usize,
    /// Objects the small keys hold, when known (a name key: one; a node key: its pods;
    /// unknown for the nodes a coalesced cluster key serves).
    pub held: Option<u64>,
    /// The namespace's object count and when it was taken, if known.
    pub objects: Option<(u64, u64)>,
    /// An upstream count is in flight.
    pub counting: bool,
    /// The namespace key serves the names (coalesced).
    pub coalesced: bool,
    /// Since when the group has been below the split threshold, if it is.
    pub below_since_ms: Option<u64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    Keep,
    /// Ask the upstream how many objects the namespace holds.
    Count,
    /// Start the namespace key and move the names' watchers onto it.
    Coalesce,
    /// Start the name keys again and move their watchers back.
    Split,
    /// Below the split threshold from now on: remember `now`.
    MarkBelow,
    /// Back above it: forget when it went below.
    ClearBelow,
}

/// What to do about one group at `now_ms`.
pub fn decide(g: &Group, t: &Thresholds, now_ms: u64) -> Decision {
    if t.min_names == 0 {
        return if g.coalesced {
            Decision::Split
        } else {
            Decision::Keep
        };
    }
    let objects = g
        .objects
        .filter(|(_, at)| now_ms.saturating_sub(*at) < t.count_ttl_ms)
        .map(|(n, _)| n);
    if !g.coalesced {
        if g.names < t.min_names {
            return Decision::Keep;
        }
        return match objects {
            // While the namespace key runs it knows its count; before, it must be asked.
            None if g.counting => Decision::Keep,
            None => Decision::Count,
            Some(n) if g.held.unwrap_or(g.names as u64) as f64 >= t.fraction * n as f64 => {
                Decision::Coalesce
            }
            Some(_) => Decision::Keep,
        };
    }
    let below = g.names * 2 < t.min_names
        || objects
            .zip(g.held)
            .is_some_and(|(n, held)| (held as f64) < t.split_fraction * n as f64);
    match (below, g.below_since_ms) {
        (false, None) => Decision::Keep,
        (false, Some(_)) => Decision::ClearBelow,
        (true, None) => Decision::MarkBelow,
        (true, Some(since)) if now_ms.saturating_sub(since) >= t.split_after_ms => Decision::Split,
        (true, Some(_)) => Decision::Keep,
    }
}

/// What a request that would start a name key does (`g` counts its name and every other
/// name asked since the last check whose key was not running: the requests in flight).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnRequest {
    /// Start the name key, as asked.
    Start,
    /// Coalesce the group now: the namespace key serves the request.
    Coalesce,
    /// Ask the upstream for the group's object count, and wait for it.
    Count,
    /// A count is in flight: wait for it with the others.
    Wait,
}

/// See [`OnRequest`]. Only a group that is apart is decided here (a coalesced one serves
/// the request already; a splitting one runs its split to the end). `gathering`: the
/// group's gathering window is open (requests wait to be decided together).
pub fn on_request(g: &Group, t: &Thresholds, now_ms: u64, gathering: bool) -> OnRequest {
    if t.min_names == 0 || g.coalesced {
        return OnRequest::Start;
    }
    if decide(g, t, now_ms) == Decision::Coalesce {
        return OnRequest::Coalesce;
    }
    let fresh = g
        .objects
        .is_some_and(|(_, at)| now_ms.saturating_sub(at) < t.count_ttl_ms);
    match (fresh, g.counting || gathering) {
        (true, false) => OnRequest::Start,
        (_, true) => OnRequest::Wait,
        (false, false) => OnRequest::Count,
    }
}

/// Requests that would start a name key, per second, the registry over: a restart storm
/// is many at once, however few reach each namespace in a short while (30 kubelets
/// reconnecting one after another reached each namespace 100–250 ms apart).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct AskRate {
    second: u64,
    this: u32,
    last: u32,
}

/// From this many requests per second (`AskRate`), a group's requests gather for the
/// longer window: a storm.
pub const STORM_ASKS: u32 = 32;

impl AskRate {
    /// Counts a request at `now_ms`; the rate: this second's count or the last one's,
    /// whichever is higher (a storm does not end at a second's turn).
    pub fn note(&mut self, now_ms: u64) -> u32 {
        let s = now_ms / 1000;
        if s != self.second {
            self.last = if s == self.second + 1 { self.this } else { 0 };
            self.this = 0;
            self.second = s;
        }
        self.this = self.this.saturating_add(1);
        self.this.max(self.last)
    }
}

/// Where a watcher moved from one key to another resumes: the RV up to which the key it
/// leaves has given it every event (`from_progress`: it was live and caught up, and the
/// move is queued behind those events). The key it joins must be synced; it may be behind
/// (a quiet name key learns of progress only from its events and bookmarks): what it
/// sends later at or below that RV was sent already and the watcher's floor drops it,
/// what comes after is new. So nothing is skipped, sent twice or sent out of order.
/// `None`: not yet.
pub fn handover_rv(from_progress: u64, to_synced: bool) -> Option<u64> {
    to_synced.then_some(from_progress)
}

/// Where a moved watch of one object starts on the key it joins, from the RV its old key
/// left it at (`from_rv`, see [`handover_rv`]), the RV of its object there (`then`) and
/// on the joined key now (`now`, at that key's `progress`).
///
/// The joined key usually listed after the old key last heard anything (a quiet name key
/// learns of progress only from its own object's events and bookmarks), so `from_rv` lies
/// before the joined key's list, and replaying from it needs the API server's replay (a
/// window backfill, one per key at a time, each up to seconds). But when the object is at
/// the same RV on both, it did not change since `then` <= `from_rv`: any write to it, a
/// delete and re-create too, would have given it a newer RV. So there is nothing to
/// replay for this watch up to `progress`, and it starts there. An object absent from
/// both may still have come and gone in between: that keeps `from_rv`; so does an RV
/// that proves nothing (0, an object without one) or one past `from_rv` (the old key's
/// store is exact at its progress, so that would be a broken key).
pub fn moved_start(from_rv: u64, then: Option<u64>, now: Option<u64>, progress: u64) -> MovedStart {
    match (then, now) {
        (Some(then), Some(now))
            if then == now && then > 0 && then <= from_rv && from_rv < progress =>
        {
            MovedStart::Unchanged(progress)
        }
        _ => MovedStart::From(from_rv),
    }
}

/// See [`moved_start`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MovedStart {
    /// The object did not change since the old key's RV: start at the joined key's
    /// progress, nothing to replay.
    Unchanged(u64),
    /// Replay from this RV (the old key's).
    From(u64),
}

impl MovedStart {
    pub fn rv(self) -> u64 {
        match self {
            MovedStart::Unchanged(rv) | MovedStart::From(rv) => rv,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use Decision::*;

    const T: Thresholds = Thresholds {
        min_names: 4,
        fraction: 0.25,
        split_fraction: 0.1,
        split_after_ms: 60_000,
        count_ttl_ms: 300_000,
    };

    fn g(names: usize, objects: Option<u64>, coalesced: bool, below: Option<u64>) -> Group {
        Group {
            names,
            held: Some(names as u64),
            objects: objects.map(|n| (n, 1_000)),
            counting: false,
            coalesced,
            below_since_ms: below,
        }
    }

    #[test]
    fn decision_table() {
        let now = 10_000;
        let cases = [
            // Few names: nothing, not even a count.
            (g(3, None, false, None), Keep),
            // Enough names, count unknown: count first.
            (g(4, None, false, None), Count),
            // The kubelet pattern: 30 of 100 objects watched.
            (g(30, Some(100), false, None), Coalesce),
            // 3 (or 40) of 10,000 watched: never pulled in whole.
            (g(3, Some(10_000), false, None), Keep),
            (g(40, Some(10_000), false, None), Keep),
            // Exactly at the share.
            (g(25, Some(100), false, None), Coalesce),
            (g(24, Some(100), false, None), Keep),
            // Coalesced, still above the split share.
            (g(20, Some(100), true, None), Keep),
            (g(20, Some(100), true, Some(5_000)), ClearBelow),
            // Coalesced, below: remembered, then split after split_after_ms.
            (g(5, Some(100), true, None), MarkBelow),
            (g(5, Some(100), true, Some(5_000)), Keep),
            (g(1, None, true, None), MarkBelow),
        ];
        for (group, want) in cases {
            assert_eq!(decide(&group, &T, now), want, "{group:?}");
        }
        assert_eq!(
            decide(&g(5, Some(100), true, Some(5_000)), &T, 65_000),
            Split
        );
    }

    #[test]
    fn node_keys_weigh_the_pods_they_hold() {
        let nodes = |n: usize, held: Option<u64>, coalesced: bool| Group {
            names: n,
            held,
            objects: Some((150_000, 1_000)),
            counting: false,
            coalesced,
            below_since_ms: None,
        };
        // 5,000 kubelets hold 140,000 of 150,000 pods: one cluster watch instead.
        assert_eq!(
            decide(&nodes(5_000, Some(140_000), false), &T, 10_000),
            Coalesce
        );
        // Five nodes' 150 pods of 150,000: not worth holding them all.
        assert_eq!(decide(&nodes(5, Some(150), false), &T, 10_000), Keep);
        // Coalesced, what the nodes hold is unknown: only the key count splits.
        assert_eq!(decide(&nodes(5_000, None, true), &T, 10_000), Keep);
        assert_eq!(decide(&nodes(1, None, true), &T, 10_000), MarkBelow);
    }

    #[test]
    fn a_stale_count_is_taken_again_and_one_in_flight_is_awaited() {
        let stale = g(30, Some(100), false, None);
        assert_eq!(decide(&stale, &T, 1_000 + T.count_ttl_ms), Count);
        let counting = Group {
            counting: true,
            objects: None,
            ..stale
        };
        assert_eq!(decide(&counting, &T, 0), Keep);
    }

    #[test]
    fn switched_off_it_splits_what_is_coalesced_and_starts_nothing() {
        let off = Thresholds { min_names: 0, ..T };
        assert_eq!(decide(&g(30, Some(100), false, None), &off, 0), Keep);
        assert_eq!(decide(&g(30, Some(100), true, None), &off, 0), Split);
    }

    #[test]
    fn a_request_is_decided_with_the_requests_in_flight() {
        let now = 10_000;
        let cases = [
            // No count yet: the first request asks for one, later ones wait for it, even
            // below min_names (more of the burst may be on its way).
            (g(1, None, false, None), false, OnRequest::Count),
            (g(3, None, false, None), true, OnRequest::Wait),
            (g(30, None, false, None), true, OnRequest::Wait),
            // Counted: coalesce once the names in flight reach the thresholds.
            (g(3, Some(100), false, None), false, OnRequest::Start),
            (g(30, Some(100), false, None), false, OnRequest::Coalesce),
            // A namespace of 10,000 objects, 40 watched: never pulled in.
            (g(40, Some(10_000), false, None), false, OnRequest::Start),
            // Coalesced already: routing serves it (or it splits): nothing to decide.
            (g(30, Some(100), true, None), false, OnRequest::Start),
        ];
        for ((group, counting), want) in cases.map(|(g, c, w)| ((g, c), w)) {
            let group = Group { counting, ..group };
            assert_eq!(on_request(&group, &T, now, false), want, "{group:?}");
        }
        // Counted, but the gathering window is still open: wait for the rest of the
        // burst, unless the names in flight suffice already.
        assert_eq!(
            on_request(&g(3, Some(100), false, None), &T, now, true),
            OnRequest::Wait
        );
        assert_eq!(
            on_request(&g(30, Some(100), false, None), &T, now, true),
            OnRequest::Coalesce
        );
        // A stale count is taken again; switched off, nothing waits.
        assert_eq!(
            on_request(
                &g(30, Some(100), false, None),
                &T,
                1_000 + T.count_ttl_ms,
                false
            ),
            OnRequest::Count
        );
        let off = Thresholds { min_names: 0, ..T };
        assert_eq!(
            on_request(&g(30, None, false, None), &off, now, true),
            OnRequest::Start
        );
    }

    #[test]
    fn the_ask_rate_is_this_seconds_or_the_last_ones() {
        let mut r = AskRate::default();
        // 40 in the first second.
        let rates: Vec<u32> = (0..40).map(|i| r.note(i * 20)).collect();
        assert_eq!(rates[0], 1);
        assert_eq!(rates[39], 40);
        // The next second still counts the last one's 40.
        assert_eq!(r.note(1_500), 40);
        // A quiet second in between: the storm is over.
        assert_eq!(r.note(3_100), 1);
        assert_eq!(r.note(3_200), 2);
    }

    #[test]
    fn a_watcher_moves_to_a_synced_key_from_where_the_old_one_left_it() {
        assert_eq!(handover_rv(100, true), Some(100));
        assert_eq!(handover_rv(100, false), None);
    }

    #[test]
    fn a_moved_watch_skips_the_replay_only_when_its_object_did_not_change() {
        use MovedStart::*;
        // (from_rv, object's RV on the old key, on the joined key, joined key's progress)
        let cases = [
            // Same object, same RV, the joined key ahead: nothing happened to it since.
            ((100, Some(90), Some(90), 250), Unchanged(250)),
            // It changed after the old key last heard (or was deleted and created again).
            ((100, Some(90), Some(180), 250), From(100)),
            // Gone from the joined key: the delete is in its window.
            ((100, Some(90), None, 250), From(100)),
            // Absent from both: it may have come and gone in between.
            ((100, None, None, 250), From(100)),
            // Created since.
            ((100, None, Some(180), 250), From(100)),
            // No RV (0) proves nothing; nor does one past the old key's progress.
            ((100, Some(0), Some(0), 250), From(100)),
            ((100, Some(120), Some(120), 250), From(100)),
            ((100, Some(100), Some(100), 250), Unchanged(250)),
            // The joined key is not ahead: from_rv as before (its floor drops the rest).
            ((250, Some(90), Some(90), 250), From(250)),
            ((300, Some(90), Some(90), 250), From(300)),
        ];
        for ((from, then, now, progress), want) in cases {
            assert_eq!(
                moved_start(from, then, now, progress),
                want,
                "from {from}, then {then:?}, now {now:?}, progress {progress}"
            );
        }
        assert_eq!(Unchanged(7).rv(), 7);
        assert_eq!(From(3).rv(), 3);
    }
}
