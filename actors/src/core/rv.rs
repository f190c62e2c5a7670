//! resourceVersion rules of kube-apiserver 1.20 with its watch cache: parsing, validation,
//! and the serve-from-cache / wait / forward decisions for lists and watches.
//!
//! Reproduces `cacher.go` `shouldDelegateList`, `ValidateListOptions` and
//! `watch_cache.go` `waitUntilFreshAndBlock`, as plain functions tested by tables.

use thiserror::Error;

/// Errors are client errors (HTTP 400) unless said otherwise.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum Error {
    /// 1.20 answers a non-numeric RV with a 500; kcache says what is wrong with a 400.
    #[error("invalid resourceVersion {0:?}: must be a non-negative integer")]
    InvalidResourceVersion(String),
    #[error("invalid resourceVersionMatch {0:?}: supported values: \"Exact\", \"NotOlderThan\"")]
    InvalidMatch(String),
    #[error("resourceVersionMatch is forbidden unless resourceVersion is provided")]
    MatchWithoutResourceVersion,
    #[error("resourceVersionMatch \"Exact\" is forbidden for resourceVersion \"0\"")]
    ExactZero,
    #[error("resourceVersionMatch is forbidden when continue is provided")]
    MatchWithContinue,
    #[error("resourceVersionMatch is forbidden for watch unless sendInitialEvents is provided")]
    MatchOnWatch,
    #[error("sendInitialEvents is forbidden for list")]
    SendInitialEventsOnList,
    #[error("sendInitialEvents=true requires resourceVersionMatch=NotOlderThan and allowWatchBookmarks=true")]
    SendInitialEventsNeedsNotOlderThan,
    #[error("invalid boolean {value:?} for {param}")]
    InvalidBool { param: &'static str, value: String },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The `resourceVersion` query parameter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rv {
    /// Absent or empty: a consistent read for lists; "start at most recent" for watches.
    Unset,
    /// `0`: any version, served from the cache.
    Any,
    /// A specific version.
    At(u64),
}

impl Rv {
    pub fn parse(s: Option<&str>) -> Result<Self> {
        match s {
            None | Some("") => Ok(Rv::Unset),
            // Digits only, as Go's ParseUint (Rust's parse would take a leading `+`).
            Some(v) if !v.bytes().all(|b| b.is_ascii_digit()) => {
                Err(Error::InvalidResourceVersion(v.to_string()))
            }
            Some(v) => match v.parse::<u64>() {
                Ok(0) => Ok(Rv::Any),
                Ok(n) => Ok(Rv::At(n)),
                Err(_) => Err(Error::InvalidResourceVersion(v.to_string())),
            },
        }
    }

    /// The numeric floor: what the client already has (0 for unset and `0`).
    pub fn floor(self) -> u64 {
        match self {
            Rv::At(n) => n,
            Rv::Unset | Rv::Any => 0,
        }
    }
}

/// The `resourceVersionMatch` query parameter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RvMatch {
    NotOlderThan,
    Exact,
}

impl RvMatch {
    pub fn parse(s: Option<&str>) -> Result<Option<Self>> {
        match s {
            None | Some("") => Ok(None),
            Some("NotOlderThan") => Ok(Some(RvMatch::NotOlderThan)),
            Some("Exact") => Ok(Some(RvMatch::Exact)),
            Some(other) => Err(Error::InvalidMatch(other.to_string())),
        }
    }
}

/// Parses a boolean query parameter as Go's `strconv.ParseBool` (which the API server's
/// query decoding uses): 1, t, T, TRUE, true, True, 0, f, F, FALSE, false, False.
pub fn parse_bool(param: &'static str, s: Option<&str>) -> Result<Option<bool>> {
    match s {
        None | Some("") => Ok(None),
        Some("1" | "t" | "T" | "TRUE" | "true" | "True") => Ok(Some(true)),
        Some("0" | "f" | "F" | "FALSE" | "false" | "False") => Ok(Some(false)),
        Some(v) => Err(Error::InvalidBool {
            param,
            value: v.to_string(),
        }),
    }
}

/// How a list or get is answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ListPlan {
    /// From the cache once the key's progress is at least `min_rv` (0: as soon as synced).
    Cache { min_rv: u64 },
    /// Forwarded to the API server unchanged, as 1.20's cacher delegates to etcd.
    Upstream,
}

/// Validates a list's options and decides where it is served, as 1.20's
/// `ValidateListOptions` + `shouldDelegateList`: RV unset (a consistent read), `Exact`,
/// `continue`, and `limit` with an RV other than `0` go to storage; `0` and NotOlderThan
/// are the cache's (`limit` is then ignored, as 1.20 does).
pub fn plan_list(
    rv: Rv,
    rv_match: Option<RvMatch>,
    limit: Option<u64>,
    has_continue: bool,
) -> Result<ListPlan> {
    match (rv, rv_match) {
        (Rv::Unset, Some(_)) => return Err(Error::MatchWithoutResourceVersion),
        (Rv::Any, Some(RvMatch::Exact)) => return Err(Error::ExactZero),
        _ => {}
    }
    if has_continue && rv_match.is_some() {
        return Err(Error::MatchWithContinue);
    }
    let has_limit = limit.is_some_and(|l| l > 0);
    if rv == Rv::Unset
        || has_continue
        || (has_limit && rv != Rv::Any)
        || rv_match == Some(RvMatch::Exact)
    {
        return Ok(ListPlan::Upstream);
    }
    Ok(ListPlan::Cache { min_rv: rv.floor() })
}

/// A validated watch request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WatchPlan {
    /// Send the current state as ADDED events before live events.
    pub initial_events: bool,
    /// Close the initial events with a `k8s.io/initial-events-end` bookmark.
    pub initial_events_end_bookmark: bool,
    /// Deliver only events newer than this; for initial events, the state must be at least this fresh.
    pub from_rv: u64,
}

/// Validates a watch and picks its start, as the 1.20 cacher does (RV unset and `0` send
/// the current state as ADDED, RV=N replays what came after N) plus the 1.27 streaming
/// list (`sendInitialEvents=true` requires NotOlderThan and bookmarks).
pub fn plan_watch(
    rv: Rv,
    rv_match: Option<RvMatch>,
    send_initial_events: Option<bool>,
    allow_bookmarks: bool,
) -> Result<WatchPlan> {
    match send_initial_events {
        None if rv_match.is_some() => Err(Error::MatchOnWatch),
        None => Ok(WatchPlan {
            initial_events: !matches!(rv, Rv::At(_)),
            initial_events_end_bookmark: false,
            from_rv: rv.floor(),
        }),
        Some(send) => {
            if rv_match != Some(RvMatch::NotOlderThan) || (send && !allow_bookmarks) {
                return Err(Error::SendInitialEventsNeedsNotOlderThan);
            }
            if rv == Rv::Unset && !send {
                // 1.27: sendInitialEvents=false with RV unset is "start at most recent".
                return Ok(WatchPlan {
                    initial_events: false,
                    initial_events_end_bookmark: false,
                    from_rv: 0,
                });
            }
            Ok(WatchPlan {
                initial_events: send,
                initial_events_end_bookmark: send,
                from_rv: rv.floor(),
            })
        }
    }
}

/// Where a watch from `from_rv` (with no initial events) starts in a key's window.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WatchStart {
    /// Replay buffered events newer than the RV, then continue live.
    Replay,
    /// The RV is older than anything the key can replay: an in-stream 410 `Expired`.
    Expired { oldest: u64 },
}

/// As `getAllEventsSinceLocked`: an RV below `oldest − 1` is Expired; anything at or above
/// it (including RVs newer than the key's progress, which 1.20 accepts and then waits on)
/// replays from the window.
pub fn watch_start(from_rv: u64, oldest_replayable: u64) -> WatchStart {
    if from_rv < oldest_replayable.saturating_sub(1) {
        WatchStart::Expired {
            oldest: oldest_replayable,
        }
    } else {
        WatchStart::Replay
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_resource_version() {
        assert_eq!(Rv::parse(None), Ok(Rv::Unset));
        assert_eq!(Rv::parse(Some("")), Ok(Rv::Unset));
        assert_eq!(Rv::parse(Some("0")), Ok(Rv::Any));
        assert_eq!(Rv::parse(Some("17")), Ok(Rv::At(17)));
        for bad in [
            "abc",
            "-1",
            "1.5",
            " 1",
            "99999999999999999999999",
            "+5",
            "٣",
        ] {
            assert!(
                matches!(Rv::parse(Some(bad)), Err(Error::InvalidResourceVersion(_))),
                "{bad}"
            );
        }
    }

    #[test]
    fn parse_match_and_bool() {
        assert_eq!(RvMatch::parse(None), Ok(None));
        assert_eq!(RvMatch::parse(Some("Exact")), Ok(Some(RvMatch::Exact)));
        assert_eq!(
            RvMatch::parse(Some("NotOlderThan")),
            Ok(Some(RvMatch::NotOlderThan))
        );
        assert!(RvMatch::parse(Some("notolderthan")).is_err());
        assert_eq!(parse_bool("watch", Some("1")), Ok(Some(true)));
        assert_eq!(parse_bool("watch", Some("False")), Ok(Some(false)));
        assert_eq!(parse_bool("watch", None), Ok(None));
        assert!(parse_bool("watch", Some("yes")).is_err());
    }

    #[test]
    fn list_plans_match_1_20() {
        use ListPlan::*;
        use RvMatch::*;
        let cases = [
            (Rv::Unset, None, None, false, Ok(Upstream)),
            (Rv::Unset, None, Some(500), false, Ok(Upstream)),
            (Rv::Any, None, None, false, Ok(Cache { min_rv: 0 })),
            (Rv::Any, None, Some(500), false, Ok(Cache { min_rv: 0 })),
            (Rv::At(5), None, None, false, Ok(Cache { min_rv: 5 })),
            (
                Rv::At(5),
                Some(NotOlderThan),
                None,
                false,
                Ok(Cache { min_rv: 5 }),
            ),
            (
                Rv::Any,
                Some(NotOlderThan),
                None,
                false,
                Ok(Cache { min_rv: 0 }),
            ),
            (Rv::At(5), None, Some(10), false, Ok(Upstream)),
            (Rv::At(5), Some(Exact), None, false, Ok(Upstream)),
            (Rv::Unset, None, None, true, Ok(Upstream)),
            (
                Rv::Unset,
                Some(Exact),
                None,
                false,
                Err(Error::MatchWithoutResourceVersion),
            ),
            (Rv::Any, Some(Exact), None, false, Err(Error::ExactZero)),
            (
                Rv::At(5),
                Some(NotOlderThan),
                None,
                true,
                Err(Error::MatchWithContinue),
            ),
        ];
        for (rv, m, limit, cont, want) in cases {
            assert_eq!(
                plan_list(rv, m, limit, cont),
                want,
                "{rv:?} {m:?} {limit:?} {cont}"
            );
        }
    }

    #[test]
    fn watch_plans() {
        use RvMatch::*;
        let w = |initial, end, from| {
            Ok(WatchPlan {
                initial_events: initial,
                initial_events_end_bookmark: end,
                from_rv: from,
            })
        };
        let cases = [
            (Rv::Unset, None, None, false, w(true, false, 0)),
            (Rv::Any, None, None, false, w(true, false, 0)),
            (Rv::At(7), None, None, true, w(false, false, 7)),
            (
                Rv::At(7),
                Some(NotOlderThan),
                None,
                true,
                Err(Error::MatchOnWatch),
            ),
            (Rv::At(7), Some(Exact), None, true, Err(Error::MatchOnWatch)),
            (
                Rv::Unset,
                Some(NotOlderThan),
                Some(true),
                true,
                w(true, true, 0),
            ),
            (
                Rv::At(7),
                Some(NotOlderThan),
                Some(true),
                true,
                w(true, true, 7),
            ),
            (
                Rv::At(7),
                Some(NotOlderThan),
                Some(true),
                false,
                Err(Error::SendInitialEventsNeedsNotOlderThan),
            ),
            (
                Rv::At(7),
                None,
                Some(true),
                true,
                Err(Error::SendInitialEventsNeedsNotOlderThan),
            ),
            (
                Rv::At(7),
                Some(Exact),
                Some(true),
                true,
                Err(Error::SendInitialEventsNeedsNotOlderThan),
            ),
            (
                Rv::At(7),
                Some(NotOlderThan),
                Some(false),
                false,
                w(false, false, 7),
            ),
            (
                Rv::Unset,
                Some(NotOlderThan),
                Some(false),
                false,
                w(false, false, 0),
            ),
        ];
        for (rv, m, sie, bm, want) in cases {
            assert_eq!(
                plan_watch(rv, m, sie, bm),
                want,
                "{rv:?} {m:?} {sie:?} {bm}"
            );
        }
    }

    #[test]
    fn watch_start_boundaries() {
        // Oldest replayable 10: a client at 9 has seen everything before 10, so it may resume.
        assert_eq!(watch_start(9, 10), WatchStart::Replay);
        assert_eq!(watch_start(8, 10), WatchStart::Expired { oldest: 10 });
        assert_eq!(watch_start(100, 10), WatchStart::Replay);
        assert_eq!(watch_start(0, 1), WatchStart::Replay);
    }
}
