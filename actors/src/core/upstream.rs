//! The upstream list/watch loop as a pure state machine, plus its reconnect backoff.
//!
//! As kube-rs's `watcher` (`step_trampolined`): (state, what happened) → (next state, what
//! to do). No I/O here: the CachedObject's upstream source runs the returned action.
//! Transitions: a 410 on the watch relists from the last RV with NotOlderThan (never `0`,
//! which could go back in time); other errors keep the RV and back off; a watch that ends
//! (its `timeoutSeconds`) is re-opened from the last RV; an immutable object parks the key
//! (no watch) until a periodic verification list says otherwise, as the kubelet's manager
//! stops the reflector of immutable Secrets and ConfigMaps.

use std::time::Duration;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum State {
    /// Needs a list; `from` is the RV to relist at (NotOlderThan), `None` for a consistent list.
    Empty { from: Option<u64> },
    /// A watch from `rv` is open (or being opened).
    Watching { rv: u64 },
    /// Synced and immutable: no upstream watch; re-verified on a timer.
    Parked { rv: u64 },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Input {
    /// The source starts (or restarts after a failure).
    Start,
    /// A list succeeded at `rv`; `frozen` when every listed object is immutable and there
    /// is at least one (only name keys of Secrets/ConfigMaps ask for this).
    Listed { rv: u64, frozen: bool },
    /// An event or bookmark at `rv` arrived on the watch; `frozen` as for `Listed`.
    Progress { rv: u64, frozen: bool },
    /// The watch stream ended normally (timeoutSeconds elapsed, server closed it).
    WatchEnded,
    /// The watch (or its start) failed; `gone` for 410 Expired/Gone.
    WatchFailed { gone: bool },
    /// The list failed.
    ListFailed,
    /// A parked key's verification timer fired.
    Verify,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// List the key; `rv` `None` = consistent read, `Some(n)` = NotOlderThan n.
    List { rv: Option<u64> },
    /// Watch from `rv` with bookmarks and a timeout.
    Watch { rv: u64 },
    /// Wait out the backoff, then feed `Input::Start`-like retry of the state's action.
    Backoff,
    /// Close any open watch and verify after the configured interval.
    Park,
    /// Nothing to do (keep reading the stream).
    Continue,
}

impl State {
    pub fn rv(&self) -> Option<u64> {
        match *self {
            State::Empty { from } => from,
            State::Watching { rv } | State::Parked { rv } => Some(rv),
        }
    }

    /// The action that (re)starts this state after a backoff.
    pub fn resume(&self) -> Action {
        match *self {
            State::Empty { from } => Action::List { rv: from },
            State::Watching { rv } => Action::Watch { rv },
            State::Parked { .. } => Action::Park,
        }
    }
}

pub fn step(state: State, input: Input) -> (State, Action) {
    use Action as A;
    use Input as I;
    use State as S;
    match (state, input) {
        (s, I::Start) => (s, s.resume()),
        (_, I::Listed { rv, frozen: true }) => (S::Parked { rv }, A::Park),
        (_, I::Listed { rv, frozen: false }) => (S::Watching { rv }, A::Watch { rv }),
        (S::Watching { rv: old }, I::Progress { rv, frozen }) => {
            let rv = rv.max(old);
            if frozen {
                (S::Parked { rv }, A::Park)
            } else {
                (S::Watching { rv }, A::Continue)
            }
        }
        (s, I::Progress { .. }) => (s, A::Continue),
        (S::Watching { rv }, I::WatchEnded) => (S::Watching { rv }, A::Watch { rv }),
        (S::Watching { rv }, I::WatchFailed { gone: true }) => {
            let s = S::Empty { from: Some(rv) };
            (s, s.resume())
        }
        (s, I::WatchFailed { .. }) | (s, I::ListFailed) => (s, A::Backoff),
        (S::Parked { .. }, I::Verify) => {
            // A consistent read: a deleted-and-recreated immutable object must be noticed.
            let s = S::Empty { from: None };
            (s, s.resume())
        }
        (s, I::Verify) | (s, I::WatchEnded) => (s, A::Continue),
    }
}

/// Jittered exponential backoff with client-go's numbers: 800 ms doubling to 30 s, ±50%
/// jitter (the caller supplies the random factor so this stays deterministic), reset
/// after 120 s without failure.
#[derive(Clone, Debug)]
pub struct Backoff {
    failures: u32,
    last_failure_ms: Option<u64>,
}

pub const BACKOFF_INITIAL_MS: u64 = 800;
pub const BACKOFF_MAX_MS: u64 = 30_000;
pub const BACKOFF_RESET_MS: u64 = 120_000;

impl Default for Backoff {
    fn default() -> Self {
        Self::new()
    }
}

impl Backoff {
    pub fn new() -> Self {
        Backoff {
            failures: 0,
            last_failure_ms: None,
        }
    }

    /// The delay before the next attempt after a failure at `now_ms`. `jitter` in [0, 1).
    /// A server's `Retry-After` wins when longer.
    pub fn next(&mut self, now_ms: u64, jitter: f64, retry_after: Option<Duration>) -> Duration {
        if self
            .last_failure_ms
            .is_some_and(|t| now_ms.saturating_sub(t) > BACKOFF_RESET_MS)
        {
            self.failures = 0;
        }
        self.last_failure_ms = Some(now_ms);
        let base = BACKOFF_INITIAL_MS
            .saturating_mul(1u64 << self.failures.min(16))
            .min(BACKOFF_MAX_MS);
        self.failures = self.failures.saturating_add(1);
        let factor = 0.5 + jitter.clamp(0.0, 1.0);
        let delay = Duration::from_millis((base as f64 * factor) as u64);
        match retry_after {
            Some(ra) if ra > delay => ra,
            _ => delay,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_sync_then_watch() {
        let s = State::Empty { from: None };
        assert_eq!(step(s, Input::Start), (s, Action::List { rv: None }));
        let (s, a) = step(
            s,
            Input::Listed {
                rv: 10,
                frozen: false,
            },
        );
        assert_eq!(
            (s, a),
            (State::Watching { rv: 10 }, Action::Watch { rv: 10 })
        );
        let (s, a) = step(
            s,
            Input::Progress {
                rv: 12,
                frozen: false,
            },
        );
        assert_eq!((s, a), (State::Watching { rv: 12 }, Action::Continue));
        // RVs never go back, whatever arrives.
        let (s, _) = step(
            s,
            Input::Progress {
                rv: 11,
                frozen: false,
            },
        );
        assert_eq!(s, State::Watching { rv: 12 });
    }

    #[test]
    fn watch_end_rewatches_from_last_rv() {
        let s = State::Watching { rv: 12 };
        assert_eq!(step(s, Input::WatchEnded), (s, Action::Watch { rv: 12 }));
    }

    #[test]
    fn gone_relists_not_older_than_last_rv() {
        let (s, a) = step(
            State::Watching { rv: 12 },
            Input::WatchFailed { gone: true },
        );
        assert_eq!(s, State::Empty { from: Some(12) });
        assert_eq!(a, Action::List { rv: Some(12) });
    }

    #[test]
    fn other_failures_back_off_and_resume_the_same_state() {
        let s = State::Watching { rv: 12 };
        assert_eq!(
            step(s, Input::WatchFailed { gone: false }),
            (s, Action::Backoff)
        );
        assert_eq!(s.resume(), Action::Watch { rv: 12 });
        let e = State::Empty { from: Some(3) };
        assert_eq!(step(e, Input::ListFailed), (e, Action::Backoff));
        assert_eq!(e.resume(), Action::List { rv: Some(3) });
    }

    #[test]
    fn immutable_objects_park_and_verify_with_a_consistent_list() {
        let (s, a) = step(
            State::Empty { from: None },
            Input::Listed {
                rv: 5,
                frozen: true,
            },
        );
        assert_eq!((s, a), (State::Parked { rv: 5 }, Action::Park));
        let (s, a) = step(s, Input::Verify);
        assert_eq!(
            (s, a),
            (State::Empty { from: None }, Action::List { rv: None })
        );
        // Becoming immutable during a watch parks too.
        let (s, a) = step(
            State::Watching { rv: 5 },
            Input::Progress {
                rv: 6,
                frozen: true,
            },
        );
        assert_eq!((s, a), (State::Parked { rv: 6 }, Action::Park));
    }

    #[test]
    fn backoff_grows_caps_and_resets() {
        let mut b = Backoff::new();
        let ms = |d: Duration| d.as_millis() as u64;
        assert_eq!(ms(b.next(0, 0.5, None)), 800);
        assert_eq!(ms(b.next(1, 0.5, None)), 1_600);
        assert_eq!(ms(b.next(2, 0.5, None)), 3_200);
        for i in 0..10 {
            b.next(3 + i, 0.5, None);
        }
        assert_eq!(ms(b.next(20, 0.5, None)), 30_000);
        assert_eq!(ms(b.next(21, 0.0, None)), 15_000);
        // Quiet for over two minutes: back to the start.
        assert_eq!(ms(b.next(200_000, 0.5, None)), 800);
        // Retry-After longer than the backoff wins.
        assert_eq!(
            b.next(200_001, 0.5, Some(Duration::from_secs(5))),
            Duration::from_secs(5)
        );
    }
}
