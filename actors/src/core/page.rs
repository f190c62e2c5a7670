//! Pages of a list served from the cache (`limit`, `continue`) and kcache's own continue
//! tokens.
//!
//! A page is cut as the reference cacher cuts it (`Cacher.GetList`): from the list's
//! scope at the chain's resourceVersion (`core::history`), in key order, starting after
//! the last key sent; without selectors the first `limit` objects, more following when
//! any are left (and how many is said: `remainingItemCount`); with selectors the first
//! `limit` that match, more following when any candidate is left, matching or not (the
//! API server does not look ahead either).
//!
//! A token says what the API server's says (`storage.EncodeContinue`): the chain's
//! resourceVersion and the last key sent relative to the list's scope, with a NUL so the
//! next page starts strictly after it. Its version is kcache's own, `kcache.io/v1`: a
//! request carrying anything else — the API server's tokens above all — is the API
//! server's to answer, and a token kcache made is never read as the API server's. It holds
//! no replica's state: any replica whose window reaches its resourceVersion continues the
//! chain, and a request kcache forwards carries it in the API server's version
//! (`upstream_form`): the same resourceVersion and start, which the API server reads
//! exactly as kcache did — nothing a client could not have sent it itself.

use std::sync::Arc;

use base64::Engine;
use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::core::object::Object;

/// The version field of kcache's tokens.
pub const TOKEN_VERSION: &str = "kcache.io/v1";

/// The version field of the API server's tokens (`storage.EncodeContinue`).
pub const UPSTREAM_VERSION: &str = "meta.k8s.io/v1";

/// A kcache token the API server's decoder would refuse as well, with its words (the
/// version it names is the API server's own constant).
#[derive(Debug, Error, PartialEq, Eq)]
pub enum Error {
    #[error(
        "continue key is not valid: incorrect encoded start resourceVersion (version meta.k8s.io/v1)"
    )]
    StartRv,
    #[error("continue key is not valid: encoded start key empty (version meta.k8s.io/v1)")]
    EmptyStart,
    #[error("continue key is not valid: {0}")]
    Key(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A request's `continue` parameter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Continue {
    /// A token kcache made.
    Kcache(Token),
    /// Anything else: the API server's tokens, and values that are no token at all.
    Upstream,
}

/// Where a page chain continues.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Token {
    /// The resourceVersion every page of the chain is read at; `None`: the latest, a
    /// consistent read (the API server's "inconsistent continue" token, `rv` −1).
    pub rv: Option<u64>,
    /// The next page's first key relative to the list's scope, cleaned as the API server
    /// cleans it: `name\0`, or `namespace/name\0` for a cluster-wide list.
    pub start: String,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Wire {
    v: String,
    rv: i64,
    start: String,
}

impl Continue {
    /// Reads a `continue` value: a well-formed kcache token, or the API server's.
    pub fn read(value: &str) -> Result<Continue> {
        let Some(wire) = Wire::ours(value) else {
            return Ok(Continue::Upstream);
        };
        // As `storage.DecodeContinue`: 0 is invalid, a negative one asks for the latest.
        let rv = match wire.rv {
            0 => return Err(Error::StartRv),
            rv => u64::try_from(rv).ok(),
        };
        if wire.start.is_empty() {
            return Err(Error::EmptyStart);
        }
        let rooted = if wire.start.starts_with('/') {
            wire.start.clone()
        } else {
            format!("/{}", wire.start)
        };
        if !is_clean(&rooted) {
            return Err(Error::Key(wire.start));
        }
        Ok(Continue::Kcache(Token {
            rv,
            start: rooted[1..].to_string(),
        }))
    }
}

impl Wire {
    /// `value` when it is a kcache token, well-formed or not.
    fn ours(value: &str) -> Option<Wire> {
        let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(value)
            .ok()?;
        let wire = serde_json::from_slice::<Wire>(&bytes).ok()?;
        (wire.v == TOKEN_VERSION).then_some(wire)
    }

    fn encode(&self) -> String {
        let json = serde_json::to_vec(self).unwrap_or_default();
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(json)
    }
}

/// A `continue` value as it goes to the API server: kcache's token (well-formed or not)
/// in the API server's version with the same resourceVersion and start — so a forwarded
/// page continues the chain there as kcache read it, or fails with the API server's own
/// words — and `None` for anything else, which goes as it came.
pub fn upstream_form(value: &str) -> Option<String> {
    let mut wire = Wire::ours(value)?;
    wire.v = UPSTREAM_VERSION.to_string();
    Some(wire.encode())
}

impl Token {
    /// The token continuing after `last` (relative to the list's scope) at `rv`.
    pub fn after(rv: u64, last: &str) -> Token {
        Token {
            rv: Some(rv),
            start: format!("{last}\0"),
        }
    }

    pub fn encode(&self) -> String {
        Wire {
            v: TOKEN_VERSION.to_string(),
            rv: self
                .rv
                .map_or(-1, |rv| i64::try_from(rv).unwrap_or(i64::MAX)),
            start: self.start.clone(),
        }
        .encode()
    }
}

/// Whether Go's `path.Clean` leaves a rooted path unchanged: no empty, `.` or `..`
/// segment, no trailing slash (but for `/` itself).
fn is_clean(rooted: &str) -> bool {
    if rooted == "/" {
        return true;
    }
    rooted[1..]
        .split('/')
        .all(|seg| !seg.is_empty() && seg != "." && seg != "..")
}

/// Whether `o`'s store key (`namespace/name`, or `name`) sorts before `key` — byte-wise,
/// as the API server orders its keys — without building the key.
pub fn key_before(o: &Object, key: &str) -> bool {
    let sep: &[u8] = if o.namespace().is_empty() { b"" } else { b"/" };
    o.namespace()
        .bytes()
        .chain(sep.iter().copied())
        .chain(o.name().bytes())
        .lt(key.bytes())
}

/// A page cut from a list's candidates.
#[derive(Debug)]
pub struct Page {
    pub items: Vec<Arc<Object>>,
    /// More follow: the store key of the last item sent, and — for a list without
    /// selectors — how many objects are left.
    pub more: Option<More>,
}

#[derive(Debug, PartialEq, Eq)]
pub struct More {
    pub last: String,
    pub remaining: Option<u64>,
}

/// Cuts one page of at most `limit` (0: no limit) from `candidates` — the list's scope in
/// key order from the page's start — keeping those `matches` accepts; `selectors`: the
/// request has a label or field selector.
pub fn cut<'a>(
    candidates: impl Iterator<Item = &'a Arc<Object>>,
    matches: impl Fn(&Object) -> bool,
    limit: u64,
    selectors: bool,
) -> Page {
    let mut items = Vec::new();
    let mut candidates = candidates.peekable();
    while let Some(o) = candidates.next() {
        if !matches(o) {
            continue;
        }
        items.push(o.clone());
        if limit > 0 && items.len() as u64 >= limit {
            if candidates.peek().is_none() {
                break;
            }
            let remaining = (!selectors).then(|| candidates.filter(|o| matches(o)).count() as u64);
            // Without selectors every candidate counts: none left that match means none
            // left, and no next page.
            if remaining == Some(0) {
                break;
            }
            let last = o.key();
            return Page {
                items,
                more: Some(More { last, remaining }),
            };
        }
    }
    Page { items, more: None }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::store::fixtures::obj;

    fn token(json: &str) -> String {
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(json)
    }

    #[test]
    fn tokens_read_as_the_api_servers_decoder_reads_them() {
        let ours = |rv, start: &str| {
            Ok(Continue::Kcache(Token {
                rv: Some(rv),
                start: start.to_string(),
            }))
        };
        let cases: Vec<(String, Result<Continue>)> = vec![
            (
                token(r#"{"v":"kcache.io/v1","rv":12,"start":"a\u0000"}"#),
                ours(12, "a\0"),
            ),
            (
                token(r#"{"v":"kcache.io/v1","rv":12,"start":"/ns/a\u0000"}"#),
                ours(12, "ns/a\0"),
            ),
            (
                token(r#"{"v":"kcache.io/v1","rv":12,"start":"/"}"#),
                ours(12, ""),
            ),
            // The API server's own tokens, and what is no token, are the API server's.
            (
                token(r#"{"v":"meta.k8s.io/v1","rv":12,"start":"a\u0000"}"#),
                Ok(Continue::Upstream),
            ),
            ("x!".to_string(), Ok(Continue::Upstream)),
            (
                format!("{}=", token(r#"{"v":"kcache.io/v1","rv":12,"start":"a"}"#)),
                Ok(Continue::Upstream),
            ),
            (
                token(r#"{"v":"kcache.io/v1","rv":"12","start":"a"}"#),
                Ok(Continue::Upstream),
            ),
            (
                token(r#"{"v":"kcache.io/v1","rv":12,"start":"a","x":1}"#),
                Ok(Continue::Upstream),
            ),
            // Ours, refused as the API server refuses its own.
            (
                token(r#"{"v":"kcache.io/v1","rv":0,"start":"a"}"#),
                Err(Error::StartRv),
            ),
            // −1: the latest state, from the key on (the API server's inconsistent token).
            (
                token(r#"{"v":"kcache.io/v1","rv":-1,"start":"a"}"#),
                Ok(Continue::Kcache(Token {
                    rv: None,
                    start: "a".into(),
                })),
            ),
            (
                token(r#"{"v":"kcache.io/v1","rv":3,"start":""}"#),
                Err(Error::EmptyStart),
            ),
            (
                token(r#"{"v":"kcache.io/v1","rv":3,"start":"../b"}"#),
                Err(Error::Key("../b".into())),
            ),
            (
                token(r#"{"v":"kcache.io/v1","rv":3,"start":"a//b"}"#),
                Err(Error::Key("a//b".into())),
            ),
            (
                token(r#"{"v":"kcache.io/v1","rv":3,"start":"a/"}"#),
                Err(Error::Key("a/".into())),
            ),
            (
                token(r#"{"v":"kcache.io/v1","rv":3,"start":"a/./b"}"#),
                Err(Error::Key("a/./b".into())),
            ),
        ];
        for (value, want) in cases {
            assert_eq!(Continue::read(&value), want, "{value}");
        }
        // What kcache writes reads back.
        let t = Token::after(77, "ns/name");
        assert_eq!(Continue::read(&t.encode()), Ok(Continue::Kcache(t)));
        assert_eq!(
            Error::StartRv.to_string(),
            "continue key is not valid: incorrect encoded start resourceVersion (version meta.k8s.io/v1)"
        );
    }

    #[test]
    fn kcache_tokens_go_upstream_in_the_api_servers_version_and_nothing_else_changes() {
        let cases = [
            (
                token(r#"{"v":"kcache.io/v1","rv":12,"start":"ns/a\u0000"}"#),
                Some(token(
                    r#"{"v":"meta.k8s.io/v1","rv":12,"start":"ns/a\u0000"}"#,
                )),
            ),
            // Malformed ones too, so the API server refuses them in its own words.
            (
                token(r#"{"v":"kcache.io/v1","rv":0,"start":"../b"}"#),
                Some(token(r#"{"v":"meta.k8s.io/v1","rv":0,"start":"../b"}"#)),
            ),
            (
                token(r#"{"v":"kcache.io/v1","rv":-1,"start":"a"}"#),
                Some(token(r#"{"v":"meta.k8s.io/v1","rv":-1,"start":"a"}"#)),
            ),
            // Not kcache's (kcache reads them as the API server's): unchanged.
            (token(r#"{"v":"meta.k8s.io/v1","rv":12,"start":"a"}"#), None),
            (
                token(r#"{"v":"kcache.io/v1","rv":12,"start":"a","x":1}"#),
                None,
            ),
            ("x!".to_string(), None),
        ];
        for (value, want) in cases {
            assert_eq!(upstream_form(&value), want, "{value}");
        }
        let t = Token::after(77, "ns/name");
        assert_eq!(
            upstream_form(&t.encode()),
            Some(token(
                r#"{"v":"meta.k8s.io/v1","rv":77,"start":"ns/name\u0000"}"#
            ))
        );
    }

    #[test]
    fn keys_order_byte_wise() {
        use crate::core::store::fixtures::o;
        use serde_json::json;
        let in_ns = |ns: &str, name: &str| o(json!({"metadata": {"name": name, "namespace": ns}}));
        let cluster = |name: &str| o(json!({"metadata": {"name": name}}));
        // `a-b/x` sorts before `a/x`: '-' < '/', as in the API server's keys.
        assert!(key_before(&in_ns("a-b", "x"), "a/x"));
        assert!(!key_before(&in_ns("a", "x"), "a-b/x"));
        assert!(key_before(&in_ns("a", "x"), "a/x\0"));
        assert!(!key_before(&in_ns("a", "x"), "a/x"));
        assert!(key_before(&in_ns("a", "x"), "a/y"));
        assert!(!key_before(&in_ns("a", "x"), "a/"));
        assert!(key_before(&cluster("node1"), "node2"));
        assert!(!key_before(&cluster("node1"), ""));
    }

    #[test]
    fn pages_are_cut_as_the_cacher_cuts_them() {
        let objs: Vec<Arc<Object>> = ["a", "b", "c", "d", "e"]
            .iter()
            .enumerate()
            .map(|(i, n)| Arc::new(obj(n, n, i as u64 + 1)))
            .collect();
        let names = |p: &Page| {
            p.items
                .iter()
                .map(|o| o.name().to_string())
                .collect::<Vec<_>>()
        };
        let odd = |o: &Object| ["a", "c", "e"].contains(&o.name());
        let only_a = |o: &Object| o.name() == "a";
        let more = |last: &str, remaining| {
            Some(More {
                last: format!("n/{last}"),
                remaining,
            })
        };
        // (limit, selective filter, want items, want more)
        type Case<'a> = (
            u64,
            Option<&'a dyn Fn(&Object) -> bool>,
            Vec<&'a str>,
            Option<More>,
        );
        let cases: Vec<Case> = vec![
            (0, None, vec!["a", "b", "c", "d", "e"], None),
            (2, None, vec!["a", "b"], more("b", Some(3))),
            (4, None, vec!["a", "b", "c", "d"], more("d", Some(1))),
            (5, None, vec!["a", "b", "c", "d", "e"], None),
            (9, None, vec!["a", "b", "c", "d", "e"], None),
            (2, Some(&odd), vec!["a", "c"], more("c", None)),
            // The last match is the last candidate: nothing follows.
            (3, Some(&odd), vec!["a", "c", "e"], None),
            // Candidates follow the limit's last match, none of them matching: the API
            // server says more follow, and so does kcache.
            (1, Some(&only_a), vec!["a"], more("a", None)),
            (0, Some(&odd), vec!["a", "c", "e"], None),
        ];
        for (limit, filter, want, want_more) in cases {
            let p = match filter {
                Some(f) => cut(objs.iter(), f, limit, true),
                None => cut(objs.iter(), |_| true, limit, false),
            };
            assert_eq!(names(&p), want, "limit {limit}");
            assert_eq!(p.more, want_more, "limit {limit}");
        }
    }
}
