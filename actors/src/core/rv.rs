//! resourceVersion rules of the reference kube-apiserver (1.37) with its watch cache:
//! parsing, `ListOptions` validation, and the serve-from-cache / wait / forward decisions
//! for lists and watches.
//!
//! Reproduces apimachinery's `ValidateListOptions` (messages included), `cacher.go`
//! `shouldDelegateList` and `Watch` (`getWatchCacheResourceVersion`,
//! `getAllEventsSinceLocked`), and `watch_cache.go` `waitUntilFreshAndBlock`, as plain
//! functions tested by tables.

use thiserror::Error;

use super::go_quote::go_quote;
use super::page::Continue;

#[derive(Debug, Error, PartialEq, Eq)]
pub enum Error {
    /// The storage layer's parse of a resourceVersion (`APIObjectVersioner`): a list
    /// answers it as 400 "invalid resource version: …", a watch as a 500 (both as the
    /// API server does).
    #[error("resourceVersion: Invalid value: {}: strconv.ParseUint: parsing {}: {}", go_quote(.0), go_quote(.0), if .0.bytes().all(|b| b.is_ascii_digit()) { "value out of range" } else { "invalid syntax" })]
    InvalidResourceVersion(String),
    /// `ValidateListOptions` failed: 422 Invalid, one or more field errors.
    #[error("{}", invalid_message(.0))]
    Invalid(Vec<FieldError>),
    #[error("invalid boolean {value:?} for {param}")]
    InvalidBool { param: &'static str, value: String },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// One field error of `ValidateListOptions`, printed as apimachinery's `field.Error`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FieldError {
    Forbidden {
        field: &'static str,
        detail: &'static str,
    },
    NotSupported {
        field: &'static str,
        value: String,
        supported: &'static [&'static str],
    },
}

impl FieldError {
    /// The field the error is about (`StatusCause.field`).
    pub fn field(&self) -> &'static str {
        match self {
            FieldError::Forbidden { field, .. } | FieldError::NotSupported { field, .. } => field,
        }
    }

    /// The cause's reason as the API server's `Status` names it (`StatusCause.reason`).
    pub fn reason(&self) -> &'static str {
        match self {
            FieldError::Forbidden { .. } => "FieldValueForbidden",
            FieldError::NotSupported { .. } => "FieldValueNotSupported",
        }
    }

    /// The error without its field (`field.Error.ErrorBody`, `StatusCause.message`).
    pub fn body(&self) -> String {
        match self {
            FieldError::Forbidden { detail, .. } => format!("Forbidden: {detail}"),
            FieldError::NotSupported {
                value, supported, ..
            } => {
                let list: Vec<String> = supported.iter().map(|s| go_quote(s)).collect();
                format!(
                    "Unsupported value: {}: supported values: {}",
                    go_quote(value),
                    list.join(", ")
                )
            }
        }
    }
}

impl std::fmt::Display for FieldError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.field(), self.body())
    }
}

/// apimachinery's `ErrorList.ToAggregate()` as `NewInvalid` prints it: one error alone,
/// several in brackets.
fn invalid_message(errs: &[FieldError]) -> String {
    match errs {
        [one] => one.to_string(),
        many => {
            let parts: Vec<String> = many.iter().map(ToString::to_string).collect();
            format!("[{}]", parts.join(", "))
        }
    }
}

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
    /// As the API server's `ParseResourceVersion` (Go's `ParseUint`, base 10: digits
    /// only, no sign, at most `u64::MAX`).
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

/// The `resourceVersionMatch` query parameter (after validation).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RvMatch {
    NotOlderThan,
    Exact,
}

impl RvMatch {
    /// A value [`validate`] accepted; anything else is `None`.
    pub fn parse(s: Option<&str>) -> Option<Self> {
        match s {
            Some("NotOlderThan") => Some(RvMatch::NotOlderThan),
            Some("Exact") => Some(RvMatch::Exact),
            _ => None,
        }
    }
}

/// The raw `ListOptions` fields [`validate`] reads, as the query carried them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ListOptions<'a> {
    pub watch: bool,
    pub resource_version: Option<&'a str>,
    pub resource_version_match: Option<&'a str>,
    pub has_continue: bool,
    pub send_initial_events: Option<bool>,
}

impl ListOptions<'_> {
    /// apimachinery's `SetListOptionsDefaults` with the WatchList feature on (the default
    /// of every supported version, 1.34+): a watch from the legacy starting points —
    /// resourceVersion unset or `0` — that says nothing of `sendInitialEvents` or
    /// `resourceVersionMatch` is a streaming list (`sendInitialEvents=true`,
    /// NotOlderThan). The API server validates and plans the defaulted options.
    #[must_use]
    pub fn defaulted(mut self) -> Self {
        let legacy = matches!(self.resource_version, None | Some("" | "0"));
        if self.watch
            && legacy
            && self.send_initial_events.is_none()
            && self.resource_version_match.is_none_or(str::is_empty)
        {
            self.send_initial_events = Some(true);
            self.resource_version_match = Some("NotOlderThan");
        }
        self
    }
}

const FIELD_MATCH: &str = "resourceVersionMatch";

/// apimachinery's `ValidateListOptions` with the WatchList feature on (the reference
/// version's default): every error at once, in its order, with its words.
pub fn validate(o: &ListOptions) -> Result<()> {
    let mut errs = Vec::new();
    let rv = o.resource_version.unwrap_or("");
    let m = o.resource_version_match.unwrap_or("");
    if o.watch {
        if o.send_initial_events.is_some() && m != "NotOlderThan" {
            errs.push(FieldError::Forbidden {
                field: FIELD_MATCH,
                detail: "sendInitialEvents requires setting resourceVersionMatch to NotOlderThan",
            });
        }
        if !m.is_empty() {
            if o.send_initial_events.is_none() {
                errs.push(FieldError::Forbidden {
                    field: FIELD_MATCH,
                    detail: "resourceVersionMatch is forbidden for watch unless sendInitialEvents is provided",
                });
            }
            if m != "NotOlderThan" {
                errs.push(FieldError::NotSupported {
                    field: FIELD_MATCH,
                    value: m.to_string(),
                    supported: &["NotOlderThan"],
                });
            }
            if o.has_continue {
                errs.push(FieldError::Forbidden {
                    field: FIELD_MATCH,
                    detail: "resourceVersionMatch is forbidden when continue is provided",
                });
            }
        }
    } else {
        if !m.is_empty() {
            if rv.is_empty() {
                errs.push(FieldError::Forbidden {
                    field: FIELD_MATCH,
                    detail: "resourceVersionMatch is forbidden unless resourceVersion is provided",
                });
            }
            if o.has_continue {
                errs.push(FieldError::Forbidden {
                    field: FIELD_MATCH,
                    detail: "resourceVersionMatch is forbidden when continue is provided",
                });
            }
            if m != "Exact" && m != "NotOlderThan" {
                errs.push(FieldError::NotSupported {
                    field: FIELD_MATCH,
                    value: m.to_string(),
                    supported: &["Exact", "NotOlderThan", ""],
                });
            }
            if m == "Exact" && rv == "0" {
                errs.push(FieldError::Forbidden {
                    field: FIELD_MATCH,
                    detail: "resourceVersionMatch \"exact\" is forbidden for resourceVersion \"0\"",
                });
            }
        }
        if o.send_initial_events.is_some() {
            errs.push(FieldError::Forbidden {
                field: "sendInitialEvents",
                detail: "sendInitialEvents is forbidden for list",
            });
        }
    }
    if errs.is_empty() {
        Ok(())
    } else {
        Err(Error::Invalid(errs))
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
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ListPlan {
    /// From the cache.
    Cache(ListRead),
    /// Forwarded to the API server unchanged.
    Upstream,
}

/// A list the cache serves: the state it reads and the page it cuts (`core::page`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListRead {
    pub at: At,
    /// At most this many objects (0: all); more follow with a continue token.
    pub limit: u64,
    /// Where a continued chain's page starts, relative to the list's scope.
    pub start: Option<String>,
}

/// The state a read is answered from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum At {
    /// The key's state once its progress is at least this (0: as soon as synced).
    NotOlderThan(u64),
    /// The key's state once proven at least as new as the upstream was when the request
    /// arrived (`core::fresh`): the resourceVersion was unset.
    Consistent,
    /// The key's state at exactly this resourceVersion (`core::history`).
    Exact(u64),
}

/// Where a [`validate`]d list is served, as the reference cacher serves it
/// (`ShouldDelegateList`, `computeListLimit`): `0` at once, ignoring any limit; `N` once
/// the key reached it (with a limit and no match, the legacy exact list at `N`); unset
/// once proven fresh; `Exact` and kcache's own continue tokens from the key's history.
/// Continue tokens that are not kcache's are the API server's to read.
pub fn plan_list(
    rv: Rv,
    rv_match: Option<RvMatch>,
    limit: Option<u64>,
    cont: Option<&Continue>,
) -> ListPlan {
    let limit = limit.unwrap_or(0);
    let read = |at, limit, start| ListPlan::Cache(ListRead { at, limit, start });
    match (cont, rv, rv_match) {
        (Some(Continue::Upstream), ..) => ListPlan::Upstream,
        // The chain's state (a token of the latest: a consistent read from its key on);
        // `0` lifts the limit, with a token too.
        (Some(Continue::Kcache(t)), rv, _) => {
            let at = t.rv.map_or(At::Consistent, At::Exact);
            let limit = if rv == Rv::Any { 0 } else { limit };
            read(at, limit, Some(t.start.clone()))
        }
        (None, Rv::Any, _) => read(At::NotOlderThan(0), 0, None),
        (None, Rv::Unset, _) => read(At::Consistent, limit, None),
        (None, Rv::At(n), Some(RvMatch::Exact)) => read(At::Exact(n), limit, None),
        (None, Rv::At(n), Some(RvMatch::NotOlderThan)) => read(At::NotOlderThan(n), limit, None),
        (None, Rv::At(n), None) if limit > 0 => read(At::Exact(n), limit, None),
        (None, Rv::At(n), None) => read(At::NotOlderThan(n), 0, None),
    }
}

/// Where a GET by name is served: at `0` or `N` from the cache once the key reached it
/// (`Some(min_rv)`); with the resourceVersion unset upstream (`None`) — the API server
/// reads one key from etcd, which no freshness proof of a cached key could make cheaper.
pub fn plan_get(rv: Rv) -> Option<u64> {
    match rv {
        Rv::Unset => None,
        _ => Some(rv.floor()),
    }
}

/// A [`validate`]d watch's start.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WatchPlan {
    /// Send the current state as ADDED events before live events.
    pub initial_events: bool,
    /// Close the initial events with a `k8s.io/initial-events-end` bookmark.
    pub initial_events_end_bookmark: bool,
    /// Deliver only events newer than this; for initial events, the state must be at least this fresh.
    pub from_rv: u64,
}

/// Picks a [`validate`]d watch's start as the reference cacher does
/// (`getAllEventsSinceLocked`): with `sendInitialEvents=true` the state as ADDED, then —
/// only when bookmarks are allowed (`isListWatchRequest`) — the initial-events-end
/// bookmark; without `sendInitialEvents`, RV unset and `0` send the state too (the legacy
/// behaviour) and RV=N replays what came after N; `sendInitialEvents=false` starts at
/// the RV given, or at the most recent one for unset and `0`.
pub fn plan_watch(rv: Rv, send_initial_events: Option<bool>, allow_bookmarks: bool) -> WatchPlan {
    match send_initial_events {
        None => WatchPlan {
            initial_events: !matches!(rv, Rv::At(_)),
            initial_events_end_bookmark: false,
            from_rv: rv.floor(),
        },
        Some(send) => WatchPlan {
            initial_events: send,
            initial_events_end_bookmark: send && allow_bookmarks,
            from_rv: rv.floor(),
        },
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
        assert_eq!(RvMatch::parse(None), None);
        assert_eq!(RvMatch::parse(Some("Exact")), Some(RvMatch::Exact));
        assert_eq!(
            RvMatch::parse(Some("NotOlderThan")),
            Some(RvMatch::NotOlderThan)
        );
        assert_eq!(RvMatch::parse(Some("notolderthan")), None);
        assert_eq!(parse_bool("watch", Some("1")), Ok(Some(true)));
        assert_eq!(parse_bool("watch", Some("False")), Ok(Some(false)));
        assert_eq!(parse_bool("watch", None), Ok(None));
        assert!(parse_bool("watch", Some("yes")).is_err());
    }

    #[test]
    fn resource_version_errors_read_as_go_prints_them() {
        // The reference API server's words (a list answers 400 "invalid resource
        // version: " + this; a watch, 500 with this).
        assert_eq!(
            Rv::parse(Some("abc")).unwrap_err().to_string(),
            r#"resourceVersion: Invalid value: "abc": strconv.ParseUint: parsing "abc": invalid syntax"#
        );
        assert_eq!(
            Rv::parse(Some("99999999999999999999999"))
                .unwrap_err()
                .to_string(),
            r#"resourceVersion: Invalid value: "99999999999999999999999": strconv.ParseUint: parsing "99999999999999999999999": value out of range"#
        );
    }

    /// `ValidateListOptions` of the reference version, message for message (each row's
    /// text is what kube-apiserver 1.37 answered for the same query).
    #[test]
    fn list_options_validation_matches_the_reference() {
        let o = |watch, rv, m, cont, sie| ListOptions {
            watch,
            resource_version: rv,
            resource_version_match: m,
            has_continue: cont,
            send_initial_events: sie,
        };
        let cases: &[(ListOptions, Option<&str>)] = &[
            (o(false, None, None, false, None), None),
            (o(false, Some("5"), Some("Exact"), false, None), None),
            (o(false, Some("5"), Some("NotOlderThan"), false, None), None),
            (o(false, None, Some("Exact"), false, None), Some("resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden unless resourceVersion is provided")),
            (o(false, Some("0"), Some("Exact"), false, None), Some(r#"resourceVersionMatch: Forbidden: resourceVersionMatch "exact" is forbidden for resourceVersion "0""#)),
            (o(false, Some("5"), Some("NotOlderThan"), true, None), Some("resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden when continue is provided")),
            (o(false, None, Some("Bogus"), false, None), Some(r#"[resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden unless resourceVersion is provided, resourceVersionMatch: Unsupported value: "Bogus": supported values: "Exact", "NotOlderThan", ""]"#)),
            (o(false, None, None, false, Some(true)), Some("sendInitialEvents: Forbidden: sendInitialEvents is forbidden for list")),
            (o(true, None, None, false, None), None),
            (o(true, Some("7"), None, false, None), None),
            (o(true, None, Some("NotOlderThan"), false, Some(true)), None),
            (o(true, None, Some("NotOlderThan"), false, Some(false)), None),
            (o(true, None, None, false, Some(true)), Some("resourceVersionMatch: Forbidden: sendInitialEvents requires setting resourceVersionMatch to NotOlderThan")),
            (o(true, Some("1"), Some("NotOlderThan"), false, None), Some("resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden for watch unless sendInitialEvents is provided")),
            (o(true, Some("1"), Some("Exact"), false, Some(true)), Some(r#"[resourceVersionMatch: Forbidden: sendInitialEvents requires setting resourceVersionMatch to NotOlderThan, resourceVersionMatch: Unsupported value: "Exact": supported values: "NotOlderThan"]"#)),
            (o(true, None, Some("NotOlderThan"), true, Some(true)), Some("resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden when continue is provided")),
        ];
        for (opts, want) in cases {
            let got = validate(opts).err().map(|e| e.to_string());
            assert_eq!(got.as_deref(), *want, "{opts:?}");
        }
    }

    #[test]
    fn legacy_watches_are_defaulted_to_streaming_lists() {
        let o = |watch, rv, m, cont, sie| ListOptions {
            watch,
            resource_version: rv,
            resource_version_match: m,
            has_continue: cont,
            send_initial_events: sie,
        };
        let streaming = |rv, cont| o(true, rv, Some("NotOlderThan"), cont, Some(true));
        let cases = [
            (o(true, None, None, false, None), streaming(None, false)),
            (
                o(true, Some(""), None, false, None),
                streaming(Some(""), false),
            ),
            (
                o(true, Some("0"), None, false, None),
                streaming(Some("0"), false),
            ),
            (o(true, None, None, true, None), streaming(None, true)),
            // Not legacy, or already explicit: unchanged.
            (
                o(true, Some("7"), None, false, None),
                o(true, Some("7"), None, false, None),
            ),
            (
                o(true, None, None, false, Some(false)),
                o(true, None, None, false, Some(false)),
            ),
            (
                o(true, Some("0"), Some("NotOlderThan"), false, None),
                o(true, Some("0"), Some("NotOlderThan"), false, None),
            ),
            (
                o(false, None, None, false, None),
                o(false, None, None, false, None),
            ),
        ];
        for (given, want) in cases {
            assert_eq!(given.defaulted(), want, "{given:?}");
        }
        // A legacy watch with `continue`: its defaulted match meets the continue rule, as
        // the reference API server answers.
        assert_eq!(
            validate(&o(true, None, None, true, None).defaulted())
                .unwrap_err()
                .to_string(),
            "resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden when continue is provided"
        );
    }

    #[test]
    fn list_plans() {
        use crate::core::page::Token;
        use RvMatch::*;
        let read = |at, limit, start: Option<&str>| {
            ListPlan::Cache(ListRead {
                at,
                limit,
                start: start.map(str::to_string),
            })
        };
        let ours = Continue::Kcache(Token {
            rv: Some(9),
            start: "a\0".into(),
        });
        let latest = Continue::Kcache(Token {
            rv: None,
            start: "a\0".into(),
        });
        let cases = [
            (
                Rv::Unset,
                None,
                Some(3),
                Some(&latest),
                read(At::Consistent, 3, Some("a\0")),
            ),
            (Rv::Unset, None, None, None, read(At::Consistent, 0, None)),
            (
                Rv::Unset,
                None,
                Some(0),
                None,
                read(At::Consistent, 0, None),
            ),
            (
                Rv::Unset,
                None,
                Some(500),
                None,
                read(At::Consistent, 500, None),
            ),
            (
                Rv::Any,
                None,
                None,
                None,
                read(At::NotOlderThan(0), 0, None),
            ),
            // `0` ignores the limit, as the API server's cache does.
            (
                Rv::Any,
                None,
                Some(500),
                None,
                read(At::NotOlderThan(0), 0, None),
            ),
            (
                Rv::At(5),
                None,
                None,
                None,
                read(At::NotOlderThan(5), 0, None),
            ),
            (
                Rv::At(5),
                Some(NotOlderThan),
                None,
                None,
                read(At::NotOlderThan(5), 0, None),
            ),
            (
                Rv::At(5),
                Some(NotOlderThan),
                Some(10),
                None,
                read(At::NotOlderThan(5), 10, None),
            ),
            (
                Rv::Any,
                Some(NotOlderThan),
                Some(10),
                None,
                read(At::NotOlderThan(0), 0, None),
            ),
            // A limit with `N` and no match: the legacy exact list.
            (
                Rv::At(5),
                None,
                Some(10),
                None,
                read(At::Exact(5), 10, None),
            ),
            (
                Rv::At(5),
                Some(Exact),
                None,
                None,
                read(At::Exact(5), 0, None),
            ),
            (
                Rv::At(5),
                Some(Exact),
                Some(3),
                None,
                read(At::Exact(5), 3, None),
            ),
            (
                Rv::Unset,
                None,
                Some(3),
                Some(&ours),
                read(At::Exact(9), 3, Some("a\0")),
            ),
            (
                Rv::Any,
                None,
                Some(3),
                Some(&ours),
                read(At::Exact(9), 0, Some("a\0")),
            ),
            (
                Rv::Unset,
                None,
                Some(3),
                Some(&Continue::Upstream),
                ListPlan::Upstream,
            ),
            (
                Rv::Any,
                None,
                None,
                Some(&Continue::Upstream),
                ListPlan::Upstream,
            ),
        ];
        for (rv, m, limit, cont, want) in cases {
            assert_eq!(
                plan_list(rv, m, limit, cont),
                want,
                "{rv:?} {m:?} {limit:?} {cont:?}"
            );
        }
    }

    #[test]
    fn get_plans() {
        assert_eq!(plan_get(Rv::Unset), None);
        assert_eq!(plan_get(Rv::Any), Some(0));
        assert_eq!(plan_get(Rv::At(7)), Some(7));
    }

    #[test]
    fn watch_plans() {
        let w = |initial, end, from| WatchPlan {
            initial_events: initial,
            initial_events_end_bookmark: end,
            from_rv: from,
        };
        let cases = [
            (Rv::Unset, None, false, w(true, false, 0)),
            (Rv::Any, None, false, w(true, false, 0)),
            (Rv::At(7), None, true, w(false, false, 7)),
            (Rv::Unset, Some(true), true, w(true, true, 0)),
            (Rv::At(7), Some(true), true, w(true, true, 7)),
            // Accepted without bookmarks since 1.3x: the state, but no end bookmark.
            (Rv::At(7), Some(true), false, w(true, false, 7)),
            (Rv::Unset, Some(true), false, w(true, false, 0)),
            (Rv::At(7), Some(false), false, w(false, false, 7)),
            (Rv::Unset, Some(false), false, w(false, false, 0)),
            (Rv::Any, Some(false), true, w(false, false, 0)),
        ];
        for (rv, sie, bm, want) in cases {
            assert_eq!(plan_watch(rv, sie, bm), want, "{rv:?} {sie:?} {bm}");
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
