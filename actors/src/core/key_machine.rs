//! A key's decisions as a pure state machine: when a list initialises or relists the
//! store, which upstream events apply, which reads and watches are served now, which wait
//! for a fresher state (and how long), when they fail, and when to ask the upstream for a
//! probe. `apply(now, input) -> effects`, like `core::upstream::step`; the CachedObject
//! holds the store, the window and the waiting clients and carries the effects out.
//!
//! The rules are the watch cache's (1.20's, unchanged on the reference v1.37.2: its
//! `watch_cache.go`): a read at `min_rv` is served once the key is synced
//! and its progress has reached `min_rv` (`waitUntilFreshAndBlock`); until the first list
//! it waits up to the sync timeout, after that up to the block timeout (3 s), then fails
//! with "Too large resource version" (or "not synced" before the first list). Lists and
//! events at or below the progress RV are already reflected and are dropped.

use std::collections::BTreeMap;

/// How long waits last, and how often a key may probe. Milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timing {
    /// A read of a future RV on a synced key (the API server's 3 s).
    pub block_ms: u64,
    /// A read of a key that has not completed its first list.
    pub sync_ms: u64,
    /// At most one probe (a client-triggered upstream list) this often.
    pub probe_interval_ms: u64,
}

/// What happened to the key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Input {
    /// The source listed the key at `rv` (first sync, relist, verification or probe).
    Listed { rv: u64 },
    /// An upstream event at `rv`, before it is applied.
    Event { rv: u64 },
    /// The key is known complete up to `rv` (an upstream bookmark, an owner's heartbeat).
    Progress { rv: u64 },
    /// A read or watch, known to the caller as `id`, needs the key at `min_rv` or later.
    Wait { id: u64, min_rv: u64 },
    /// The periodic tick: expire waits past their deadline.
    Tick,
    /// The probe asked for could not be sent (the source's command queue was full).
    ProbeRefused,
    /// The source failed; a probe in flight is lost with it.
    SourceUnhealthy,
}

/// What the CachedObject must do, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Effect {
    /// The first list: fill the store with it and start the window at `rv`.
    Init { rv: u64 },
    /// A later list: diff it against the store, emit the changes (`core::relist`).
    Relist { rv: u64 },
    /// A list or event already reflected (at or below the progress RV): drop it.
    Ignore,
    /// Apply the event to the store and window, then dispatch it.
    Apply,
    /// The progress RV moved to `rv` (mirrors hear of it by the next heartbeat: send it now).
    Progressed { rv: u64 },
    /// Serve the wait `id` now; it waited `waited_ms`.
    Serve { id: u64, waited_ms: u64 },
    /// The wait `id` failed.
    Fail { id: u64, failure: Failure },
    /// Ask the source for a consistent list, to establish progress.
    Probe,
}

/// Why a wait failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// The key did not complete its first list in time.
    NotSynced,
    /// The key did not reach `requested` in time; it was at `current`.
    TooLargeResourceVersion { requested: u64, current: u64 },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Wait {
    min_rv: u64,
    deadline_ms: u64,
    started_ms: u64,
}

/// The key's decision state.
#[derive(Debug, Clone)]
pub struct KeyMachine {
    timing: Timing,
    synced: bool,
    progress: u64,
    waits: BTreeMap<u64, Wait>,
    probe_in_flight: bool,
    last_probe_ms: Option<u64>,
}

impl KeyMachine {
    pub fn new(timing: Timing) -> Self {
        KeyMachine {
            timing,
            synced: false,
            progress: 0,
            waits: BTreeMap::new(),
            probe_in_flight: false,
            last_probe_ms: None,
        }
    }

    pub fn synced(&self) -> bool {
        self.synced
    }

    /// The RV up to which the key is known complete (a list's resourceVersion).
    pub fn progress(&self) -> u64 {
        self.progress
    }

    /// Whether a read needing `min_rv` can be answered now.
    pub fn fresh_enough(&self, min_rv: u64) -> bool {
        self.synced && self.progress >= min_rv
    }

    /// Ends every pending wait, returning their ids in order.
    pub fn take_waits(&mut self) -> Vec<u64> {
        std::mem::take(&mut self.waits).into_keys().collect()
    }

    pub fn apply(&mut self, now_ms: u64, input: Input) -> Vec<Effect> {
        let mut out = Vec::new();
        match input {
            Input::Listed { rv } => {
                self.probe_in_flight = false;
                if !self.synced {
                    self.synced = true;
                    out.push(Effect::Init { rv });
                    self.progress = 0;
                    self.advance(rv, &mut out);
                } else if rv >= self.progress {
                    out.push(Effect::Relist { rv });
                    self.advance(rv, &mut out);
                } else {
                    // An older list than what the key has seen (a probe overtaken by
                    // events): nothing in it is new.
                    out.push(Effect::Ignore);
                }
                self.serve_waits(now_ms, &mut out);
            }
            Input::Event { rv } => {
                if !self.synced || rv <= self.progress {
                    // Before the first list the list will carry it; at or below the
                    // progress RV a list already reflected it.
                    out.push(Effect::Ignore);
                    return out;
                }
                out.push(Effect::Apply);
                // Events move progress silently: mirrors learn it from the event itself.
                self.progress = rv;
                self.serve_waits(now_ms, &mut out);
            }
            Input::Progress { rv } => {
                self.advance(rv, &mut out);
                self.serve_waits(now_ms, &mut out);
            }
            Input::Wait { id, min_rv } => {
                if self.fresh_enough(min_rv) {
                    out.push(Effect::Serve { id, waited_ms: 0 });
                    return out;
                }
                let timeout = if self.synced {
                    self.timing.block_ms
                } else {
                    self.timing.sync_ms
                };
                self.waits.insert(
                    id,
                    Wait {
                        min_rv,
                        deadline_ms: now_ms + timeout,
                        started_ms: now_ms,
                    },
                );
                if self.synced {
                    self.probe(now_ms, &mut out);
                }
            }
            Input::Tick => self.serve_waits(now_ms, &mut out),
            Input::ProbeRefused => {
                self.probe_in_flight = false;
                self.last_probe_ms = None;
            }
            Input::SourceUnhealthy => self.probe_in_flight = false,
        }
        out
    }

    fn advance(&mut self, rv: u64, out: &mut Vec<Effect>) {
        if rv > self.progress {
            self.progress = rv;
            out.push(Effect::Progressed { rv });
        }
    }

    /// Serves what is fresh enough, fails what is overdue, and probes for the rest.
    fn serve_waits(&mut self, now_ms: u64, out: &mut Vec<Effect>) {
        if self.waits.is_empty() {
            return;
        }
        let mut wants_probe = false;
        let (synced, progress, block) = (self.synced, self.progress, self.timing.block_ms);
        self.waits.retain(|&id, w| {
            if synced && progress >= w.min_rv {
                out.push(Effect::Serve {
                    id,
                    waited_ms: now_ms.saturating_sub(w.started_ms),
                });
                return false;
            }
            if now_ms >= w.deadline_ms {
                let failure = if synced {
                    Failure::TooLargeResourceVersion {
                        requested: w.min_rv,
                        current: progress,
                    }
                } else {
                    Failure::NotSynced
                };
                out.push(Effect::Fail { id, failure });
                return false;
            }
            if synced {
                // A read that waited for the first sync now waits only as long as any
                // read of a future RV (the API server's 3 s), not the sync's.
                w.deadline_ms = w.deadline_ms.min(now_ms + block);
                wants_probe = true;
            }
            true
        });
        if wants_probe {
            self.probe(now_ms, out);
        }
    }

    /// A 1.20 upstream sends bookmarks only shortly before a watch's timeout, so a quiet
    /// key's progress lags: a consistent list establishes it. One in flight, and at most
    /// one per probe interval — probes are client-triggered upstream lists.
    fn probe(&mut self, now_ms: u64, out: &mut Vec<Effect>) {
        let recent = self
            .last_probe_ms
            .is_some_and(|t| now_ms.saturating_sub(t) < self.timing.probe_interval_ms);
        if self.probe_in_flight || recent {
            return;
        }
        self.probe_in_flight = true;
        self.last_probe_ms = Some(now_ms);
        out.push(Effect::Probe);
    }
}

/// What a new watch starts with, given its plan and the window's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WatchStart {
    /// The key's current state as initial events (`sendInitialEvents`, or a watch from 0).
    Initial,
    /// The window's events after the watch's RV.
    Replay,
    /// Older than a young key's window: ask the upstream for a replay (`core::backfill`).
    Backfill,
    /// Older than the window: 410 Gone.
    Expired { oldest: u64 },
}

/// `initial_events`: the plan asks for the state first. `window`: the window's answer for
/// the watch's RV (`Err(oldest)` when it is too old). `backfillable`: the window could be
/// extended back to that RV, and this watch may still ask for it.
pub fn watch_start(
    initial_events: bool,
    window: Result<(), u64>,
    backfillable: bool,
) -> WatchStart {
    match (initial_events, window) {
        (true, _) => WatchStart::Initial,
        (false, Ok(())) => WatchStart::Replay,
        (false, Err(_)) if backfillable => WatchStart::Backfill,
        (false, Err(oldest)) => WatchStart::Expired { oldest },
    }
}

/// A watcher's continuation after writing its backlog: the window's events since the
/// backlog (`None`: some were evicted) and the room in the client's buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Continue {
    /// Send the events and go live: they fit with a line to spare (or there are none).
    Live,
    /// Send the events as another backlog round; not live yet.
    Another,
    /// The window lost some of them: 410, as a watch from an RV it no longer holds.
    Expired,
}

pub fn continue_watcher(events: Option<usize>, room: usize) -> Continue {
    match events {
        None => Continue::Expired,
        Some(n) if n == 0 || n < room => Continue::Live,
        Some(_) => Continue::Another,
    }
}

/// A watcher's never-go-back rules, as the cacheWatcher's: no object event at or below
/// the RV it started from (the client has those), no event twice (a replay and the live
/// stream overlap), and no bookmark below what the client has seen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cursor {
    /// Object events at or below this RV are never sent.
    pub floor: u64,
    /// Highest event sequence number handled.
    pub last_seq: u64,
    /// Highest RV sent.
    pub sent_rv: u64,
}

impl Cursor {
    pub fn new(from_rv: u64) -> Self {
        Cursor {
            floor: from_rv,
            last_seq: 0,
            sent_rv: from_rv,
        }
    }

    /// Whether the event (`seq`, `rv`) is new to the watcher; marks it handled. Events of
    /// sequence `backfilled` (a young key's replayed past) come once, in a start's replay,
    /// ahead of every numbered event: the RV floor alone orders them.
    pub fn admit(&mut self, seq: u64, rv: u64, backfilled: u64) -> bool {
        if seq != backfilled {
            if seq <= self.last_seq {
                return false;
            }
            self.last_seq = seq;
        }
        rv > self.floor
    }

    /// The watch started: from a snapshot at `snapshot_rv` when it sends initial events
    /// (live events after it are all newer), and never below `floor`.
    pub fn started(&mut self, snapshot_rv: Option<u64>, floor: u64) {
        if let Some(rv) = snapshot_rv {
            self.sent_rv = self.sent_rv.max(rv);
            self.floor = self.floor.max(rv);
        }
        self.floor = self.floor.max(floor);
    }

    /// An event at `rv` was written.
    pub fn sent(&mut self, rv: u64) {
        self.sent_rv = self.sent_rv.max(rv);
    }

    /// The RV a bookmark at `rv` carries: never below what the client already has (equal
    /// is allowed, as the cacheWatcher does).
    pub fn bookmark_rv(&self, rv: u64) -> u64 {
        rv.max(self.sent_rv).max(self.floor)
    }

    /// A backlog covering up to `seq` was written.
    pub fn covered(&mut self, seq: u64) {
        self.last_seq = self.last_seq.max(seq);
    }

    /// The watcher moved to another key, having been sent every event up to `after_rv`:
    /// the new key's sequence numbers start over, nothing at or below `after_rv` again.
    pub fn moved(&mut self, after_rv: u64) {
        self.last_seq = 0;
        self.floor = self.floor.max(after_rv);
        self.sent_rv = self.sent_rv.max(after_rv);
    }

    /// The RV to name in a 410 for this watcher.
    pub fn rv(&self) -> u64 {
        self.sent_rv.max(self.floor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use Effect as E;
    use Input as I;

    const T: Timing = Timing {
        block_ms: 3_000,
        sync_ms: 30_000,
        probe_interval_ms: 1_000,
    };

    fn synced_at(rv: u64) -> KeyMachine {
        let mut m = KeyMachine::new(T);
        m.apply(0, I::Listed { rv });
        m
    }

    #[test]
    fn lists_initialise_then_relist_and_stale_ones_are_dropped() {
        let mut m = KeyMachine::new(T);
        let cases: Vec<(Input, Vec<Effect>, u64)> = vec![
            // (input, effects, progress after)
            (I::Event { rv: 5 }, vec![E::Ignore], 0),
            (
                I::Listed { rv: 10 },
                vec![E::Init { rv: 10 }, E::Progressed { rv: 10 }],
                10,
            ),
            (I::Event { rv: 10 }, vec![E::Ignore], 10),
            (I::Event { rv: 12 }, vec![E::Apply], 12),
            (I::Listed { rv: 11 }, vec![E::Ignore], 12),
            (I::Listed { rv: 12 }, vec![E::Relist { rv: 12 }], 12),
            (
                I::Listed { rv: 20 },
                vec![E::Relist { rv: 20 }, E::Progressed { rv: 20 }],
                20,
            ),
            (I::Progress { rv: 15 }, vec![], 20),
            (I::Progress { rv: 25 }, vec![E::Progressed { rv: 25 }], 25),
            (I::Event { rv: 25 }, vec![E::Ignore], 25),
        ];
        for (input, want, progress) in cases {
            assert_eq!(m.apply(0, input), want, "{input:?}");
            assert_eq!(m.progress(), progress, "{input:?}");
        }
        assert!(m.synced());
    }

    #[test]
    fn reads_are_served_when_fresh_and_wait_otherwise() {
        // (progress, min_rv, effects)
        let cases: Vec<(u64, u64, Vec<Effect>)> = vec![
            (
                10,
                0,
                vec![E::Serve {
                    id: 1,
                    waited_ms: 0,
                }],
            ),
            (
                10,
                10,
                vec![E::Serve {
                    id: 1,
                    waited_ms: 0,
                }],
            ),
            (10, 11, vec![E::Probe]),
        ];
        for (progress, min_rv, want) in cases {
            let mut m = synced_at(progress);
            assert_eq!(
                m.apply(0, I::Wait { id: 1, min_rv }),
                want,
                "{progress} {min_rv}"
            );
        }
        // Not synced: every wait waits, and no probe (the first list is on its way).
        let mut m = KeyMachine::new(T);
        assert_eq!(m.apply(0, I::Wait { id: 1, min_rv: 0 }), vec![]);
        assert_eq!(
            m.apply(40, I::Listed { rv: 3 }),
            vec![
                E::Init { rv: 3 },
                E::Progressed { rv: 3 },
                E::Serve {
                    id: 1,
                    waited_ms: 40
                }
            ]
        );
    }

    #[test]
    fn waits_are_served_by_events_progress_and_probes() {
        for input in [
            I::Event { rv: 12 },
            I::Progress { rv: 12 },
            I::Listed { rv: 12 },
        ] {
            let mut m = synced_at(10);
            m.apply(100, I::Wait { id: 7, min_rv: 12 });
            let out = m.apply(150, input);
            assert!(
                out.contains(&E::Serve {
                    id: 7,
                    waited_ms: 50
                }),
                "{input:?}: {out:?}"
            );
        }
        // Not far enough: still waiting.
        let mut m = synced_at(10);
        m.apply(0, I::Wait { id: 7, min_rv: 20 });
        assert_eq!(m.apply(10, I::Event { rv: 15 }), vec![E::Apply]);
    }

    #[test]
    fn overdue_waits_fail_as_the_api_server_does() {
        let mut m = synced_at(10);
        m.apply(0, I::Wait { id: 1, min_rv: 11 });
        assert_eq!(m.apply(2_999, I::Tick), vec![]);
        assert_eq!(
            m.apply(3_000, I::Tick),
            vec![E::Fail {
                id: 1,
                failure: Failure::TooLargeResourceVersion {
                    requested: 11,
                    current: 10
                }
            }]
        );
        let mut m = KeyMachine::new(T);
        m.apply(0, I::Wait { id: 2, min_rv: 0 });
        assert_eq!(m.apply(29_999, I::Tick), vec![]);
        assert_eq!(
            m.apply(30_000, I::Tick),
            vec![E::Fail {
                id: 2,
                failure: Failure::NotSynced
            }]
        );
        // A read that waited for the first sync, of an RV the list did not reach, now
        // waits only the block timeout from the list.
        let mut m = KeyMachine::new(T);
        m.apply(0, I::Wait { id: 3, min_rv: 50 });
        assert_eq!(
            m.apply(1_000, I::Listed { rv: 10 }),
            vec![E::Init { rv: 10 }, E::Progressed { rv: 10 }, E::Probe]
        );
        assert_eq!(m.apply(3_999, I::Tick), vec![]);
        assert!(matches!(
            m.apply(4_000, I::Tick)[..],
            [E::Fail { id: 3, .. }]
        ));
        assert!(m.take_waits().is_empty());
    }

    #[test]
    fn probes_are_one_at_a_time_and_paced() {
        let mut m = synced_at(10);
        let cases: Vec<(u64, Input, Vec<Effect>)> = vec![
            (0, I::Wait { id: 1, min_rv: 11 }, vec![E::Probe]),
            // In flight: no second.
            (500, I::Wait { id: 2, min_rv: 11 }, vec![]),
            // The probe's list answers, not far enough: the next waits for the interval.
            (600, I::Listed { rv: 10 }, vec![E::Relist { rv: 10 }]),
            (999, I::Tick, vec![]),
            (1_000, I::Tick, vec![E::Probe]),
            // A refused probe does not count against the interval.
            (1_000, I::ProbeRefused, vec![]),
            (1_001, I::Tick, vec![E::Probe]),
            // A failing source loses the probe in flight; the interval still holds.
            (1_100, I::SourceUnhealthy, vec![]),
            (1_200, I::Tick, vec![]),
            (2_001, I::Tick, vec![E::Probe]),
        ];
        for (now, input, want) in cases {
            assert_eq!(m.apply(now, input), want, "{now}: {input:?}");
        }
        assert_eq!(m.take_waits(), vec![1, 2]);
    }

    #[test]
    fn watch_starts() {
        let cases = [
            (true, Ok(()), false, WatchStart::Initial),
            (true, Err(5), true, WatchStart::Initial),
            (false, Ok(()), true, WatchStart::Replay),
            (false, Err(5), true, WatchStart::Backfill),
            (false, Err(5), false, WatchStart::Expired { oldest: 5 }),
        ];
        for (initial, window, backfillable, want) in cases {
            assert_eq!(watch_start(initial, window, backfillable), want);
        }
    }

    #[test]
    fn watchers_continue_live_once_the_rest_fits() {
        let cases = [
            (None, 10, Continue::Expired),
            (Some(0), 0, Continue::Live),
            (Some(3), 4, Continue::Live),
            (Some(4), 4, Continue::Another),
            (Some(9), 4, Continue::Another),
        ];
        for (events, room, want) in cases {
            assert_eq!(continue_watcher(events, room), want, "{events:?} {room}");
        }
    }

    #[test]
    fn cursors_never_go_back() {
        let mut c = Cursor::new(10);
        // (seq, rv, admitted)
        let cases = [
            (1, 9, false),  // at or below the floor: the client has it
            (2, 10, false), // equal to the floor too
            (3, 11, true),
            (3, 11, false), // the same event again (replay and live overlap)
            (2, 12, false), // an older sequence number
            (0, 10, false), // backfilled, below the floor
            (0, 12, true),  // backfilled events do not move the sequence
            (4, 13, true),
        ];
        for (seq, rv, want) in cases {
            assert_eq!(c.admit(seq, rv, 0), want, "seq {seq} rv {rv}");
        }
        assert_eq!(c.last_seq, 4);
        assert_eq!(c.bookmark_rv(5), 10, "never below the floor");
        c.sent(13);
        assert_eq!(c.bookmark_rv(12), 13, "never below what was sent");
        assert_eq!(c.bookmark_rv(20), 20);
        c.sent(11);
        assert_eq!(c.sent_rv, 13);
        c.covered(2);
        assert_eq!(c.last_seq, 4);
        c.covered(9);
        assert!(!c.admit(9, 30, 0));
        assert_eq!(c.rv(), 13);
        // A start from a snapshot raises the floor and what the client has.
        let mut c = Cursor::new(5);
        c.started(Some(20), 7);
        assert_eq!((c.floor, c.sent_rv), (20, 20));
        assert!(!c.admit(1, 20, 0));
        let mut c = Cursor::new(5);
        c.started(None, 7);
        assert_eq!((c.floor, c.sent_rv), (7, 5));
    }
}
