//! NATS names of a key: subject tokens and KV lease keys (the contract in `docs/nats.md`).
//!
//! A key becomes six tokens — `group.version.resource.namespace.scope.value` — each
//! escaped so that any byte outside `[A-Za-z0-9-]` (dots in object names and API groups,
//! `*`, `>`, whitespace, `_`) becomes `=XX` (upper-case hex). `_` alone stands for "none"
//! (core group, no namespace, no value) and can never be an escaped token, so the mapping
//! is reversible. The same string is a valid JetStream KV key (`[-/_=.a-zA-Z0-9]+`), so
//! the lease of a key is named like its subjects.

use crate::core::key::{Key, Scope};

/// The placeholder token for an absent part.
pub const NONE: &str = "_";

/// Whether [`escape`] leaves a byte as it is.
fn literal(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'-'
}

/// Escapes one token: `[A-Za-z0-9-]` stays, every other byte becomes `=XX`.
pub fn escape(s: &str) -> String {
    if s.is_empty() {
        return NONE.to_string();
    }
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if literal(b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("={b:02X}"));
        }
    }
    out
}

/// Reverses [`escape`]; `None` for a malformed token. `_` is the empty string.
///
/// Only what `escape` writes is accepted (upper-case hex, no escaped literal, no empty
/// token): each string then has exactly one token, so an outside subscriber reading a
/// subject gets the key whose subject it is, and two subjects never name one key.
pub fn unescape(token: &str) -> Option<String> {
    if token == NONE {
        return Some(String::new());
    }
    if token.is_empty() {
        return None;
    }
    let bytes = token.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'=' => {
                let (hi, lo) = (hex(*bytes.get(i + 1)?)?, hex(*bytes.get(i + 2)?)?);
                let b = hi << 4 | lo;
                if literal(b) {
                    return None;
                }
                out.push(b);
                i += 3;
            }
            b if literal(b) => {
                out.push(b);
                i += 1;
            }
            _ => return None,
        }
    }
    String::from_utf8(out).ok()
}

/// One upper-case hex digit (`u8::from_str_radix` would also take `+` and lower case).
fn hex(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

/// The six escaped tokens of a key, joined by dots.
pub fn key_token(key: &Key) -> String {
    let r = &key.resource;
    let (ns, scope, value) = match &key.scope {
        Scope::Cluster => (None, "all", None),
        Scope::Namespace(ns) => (Some(ns.as_str()), "all", None),
        Scope::Name { namespace, name } => (namespace.as_deref(), "name", Some(name.as_str())),
        Scope::Node(node) => (None, "node", Some(node.as_str())),
    };
    format!(
        "{}.{}.{}.{}.{}.{}",
        escape(&r.group),
        escape(&r.version),
        escape(&r.resource),
        escape(ns.unwrap_or("")),
        scope,
        escape(value.unwrap_or(""))
    )
}

/// What the tokens of the small keys a big key coalesces start with: every name key of a
/// namespace key's namespace and resource, every node key of a cluster key's resource;
/// the small key's token without its last (name or node) token.
pub fn member_token_prefix(big: &Key) -> String {
    let scope = match &big.scope {
        Scope::Cluster => Scope::Node("x".to_string()),
        _ => Scope::Name {
            namespace: big.namespace().map(str::to_string),
            name: "x".to_string(),
        },
    };
    let token = key_token(&Key::new(big.resource.clone(), scope));
    // The name or node is the last token and `x` escapes to itself.
    token[..token.len() - 1].to_string()
}

/// The inverse of [`member_token_prefix`]: the prefix a small key's token shares with the
/// other members of its group (a namespaced name key's, a node key's), or `None` for a key
/// that coalesces into nothing. Lets the registry sort the fleet's tokens into groups in
/// one pass instead of scanning them once per group.
pub fn member_group(token: &str) -> Option<&str> {
    let last = token.rfind('.')?;
    let mut parts = token[..last].rsplit('.');
    let (scope, ns) = (parts.next()?, parts.next()?);
    // Escaped tokens hold no dots: a key token has exactly six.
    if parts.count() != 3 {
        return None;
    }
    match scope {
        "node" => Some(&token[..=last]),
        // `_` is the empty namespace: a cluster-scoped object's name key.
        "name" if ns != "_" => Some(&token[..=last]),
        _ => None,
    }
}

/// A key as an outside subscriber reads it back from a subject's last six tokens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedKey {
    pub group: String,
    pub version: String,
    pub resource: String,
    pub namespace: Option<String>,
    /// `all`, `name` or `node`.
    pub scope: String,
    pub value: Option<String>,
}

/// Parses the six key tokens (`group.version.resource.namespace.scope.value`).
pub fn parse_key_token(token: &str) -> Option<ParsedKey> {
    let parts: Vec<&str> = token.split('.').collect();
    let [g, v, r, ns, scope, value] = parts.as_slice() else {
        return None;
    };
    let opt = |t: &str| unescape(t).map(|s| (!s.is_empty()).then_some(s));
    if !matches!(*scope, "all" | "name" | "node") {
        return None;
    }
    Some(ParsedKey {
        group: unescape(g)?,
        version: unescape(v)?,
        resource: unescape(r)?,
        namespace: opt(ns)?,
        scope: scope.to_string(),
        value: opt(value)?,
    })
}

/// Every subject kcache uses, under one prefix (`kcache` by default).
#[derive(Debug, Clone)]
pub struct Subjects {
    prefix: String,
}

impl Subjects {
    pub fn new(prefix: &str) -> Self {
        Subjects {
            prefix: prefix.trim_end_matches('.').to_string(),
        }
    }

    /// Events and heartbeats of a key, published by its owner.
    pub fn events(&self, token: &str) -> String {
        format!("{}.ev.{token}", self.prefix)
    }

    /// Every key's events (what an outside subscriber of everything subscribes to).
    pub fn all_events(&self) -> String {
        format!("{}.ev.>", self.prefix)
    }

    /// A key's retained events (`core::retain`): each event again, before it goes live.
    pub fn log(&self, token: &str) -> String {
        format!("{}.log.{token}", self.prefix)
    }

    /// Every key's retained events: the retention stream's subjects.
    pub fn all_logs(&self) -> String {
        format!("{}.log.>", self.prefix)
    }

    /// Resume requests of a key (`fleet::resume`), answered by one replica from the log.
    pub fn resume(&self, token: &str) -> String {
        format!("{}.resume.{token}", self.prefix)
    }

    /// Every key's resume requests.
    pub fn all_resumes(&self) -> String {
        format!("{}.resume.>", self.prefix)
    }

    /// The key's part of a resume request's subject.
    pub fn token_of_resume<'a>(&self, subject: &'a str) -> Option<&'a str> {
        subject
            .strip_prefix(self.prefix.as_str())?
            .strip_prefix(".resume.")
    }

    /// Snapshot requests of a key, answered by its owner to the request's reply inbox.
    pub fn snapshot(&self, token: &str) -> String {
        format!("{}.snap.{token}", self.prefix)
    }

    /// Control requests of a key to its owner (a freshness probe).
    pub fn control(&self, token: &str) -> String {
        format!("{}.ctl.{token}", self.prefix)
    }

    /// A replica's interest heartbeat (its refcounts).
    pub fn interest(&self, replica: &str) -> String {
        format!("{}.interest.{}", self.prefix, escape(replica))
    }

    pub fn all_interest(&self) -> String {
        format!("{}.interest.*", self.prefix)
    }

    /// Where an owner sends its answer to one snapshot request of a key: kcache's own reply
    /// space, per key, so that NATS permissions scope who may read the answers (a reader
    /// of one namespace's keys subscribes `<prefix>.reply.<those keys>.>`) and a requester
    /// cannot point an owner at any other subject. `nonce` is the requester's (one token),
    /// `n` its request number.
    pub fn reply(&self, token: &str, nonce: &str, n: u64) -> String {
        format!("{}.reply.{token}.{nonce}.{n}", self.prefix)
    }

    /// What a requester subscribes to for the answers to all its requests of a key.
    pub fn replies(&self, token: &str, nonce: &str) -> String {
        format!("{}.reply.{token}.{nonce}.*", self.prefix)
    }

    /// Whether `reply` is a reply subject of the key `token` ([`Subjects::reply`]): the
    /// key's reply space followed by exactly two tokens of `[A-Za-z0-9_-]`, at most 64
    /// bytes each (no wildcard, no further token). An owner answers nothing else.
    pub fn is_reply_for(&self, token: &str, reply: &str) -> bool {
        let Some(rest) = reply
            .strip_prefix(self.prefix.as_str())
            .and_then(|r| r.strip_prefix(".reply."))
            .and_then(|r| r.strip_prefix(token))
            .and_then(|r| r.strip_prefix('.'))
        else {
            return false;
        };
        let mut parts = rest.split('.');
        let ok = |p: Option<&str>| {
            p.is_some_and(|p| {
                !p.is_empty()
                    && p.len() <= 64
                    && p.bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
            })
        };
        ok(parts.next()) && ok(parts.next()) && parts.next().is_none()
    }

    /// A replica's presence beacon (published every `presence_ms`).
    pub fn alive(&self, replica: &str) -> String {
        format!("{}.alive.{}", self.prefix, escape(replica))
    }

    pub fn all_alive(&self) -> String {
        format!("{}.alive.*", self.prefix)
    }

    /// The replica id of a presence beacon's subject.
    pub fn replica_of_alive(&self, subject: &str) -> Option<String> {
        let token = subject
            .strip_prefix(self.prefix.as_str())?
            .strip_prefix(".alive.")?;
        unescape(token)
    }

    /// A replica's presence request subject: NATS answers "no responders" once its
    /// connection is gone.
    pub fn presence(&self, replica: &str) -> String {
        format!("{}.presence.{}", self.prefix, escape(replica))
    }

    /// The key's part of an event subject, or `None` when the subject is not an event subject.
    pub fn token_of_event<'a>(&self, subject: &'a str) -> Option<&'a str> {
        subject
            .strip_prefix(self.prefix.as_str())?
            .strip_prefix(".ev.")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::key::ResourceType;
    use std::sync::Arc;

    fn secrets() -> Arc<ResourceType> {
        Arc::new(ResourceType::new("", "v1", "secrets", "Secret", true))
    }

    fn pods() -> Arc<ResourceType> {
        Arc::new(ResourceType::new("", "v1", "pods", "Pod", true))
    }

    #[test]
    fn only_the_keys_own_reply_space_is_a_reply_subject() {
        let s = Subjects::new("kcache");
        let t = "_.v1.configmaps.team-a.name.cm";
        let good = s.reply(t, "n0nce", 3);
        assert_eq!(good, "kcache.reply._.v1.configmaps.team-a.name.cm.n0nce.3");
        assert!(s.is_reply_for(t, &good));
        for bad in [
            // The attacks a reply subject made possible: a lease, an event subject,
            // another key's replies, an inbox anyone may read.
            "$KV.kcache-leases._.v1.configmaps.team-a.name.cm",
            "kcache.ev._.v1.configmaps.team-a.name.cm",
            "kcache.reply._.v1.configmaps.team-b.name.cm.n0nce.3",
            "_INBOX.abc",
            // Malformed tails.
            "kcache.reply._.v1.configmaps.team-a.name.cm.n0nce",
            "kcache.reply._.v1.configmaps.team-a.name.cm.n0nce.3.4",
            "kcache.reply._.v1.configmaps.team-a.name.cm.*.3",
            "kcache.reply._.v1.configmaps.team-a.name.cm.>",
            "kcache.reply._.v1.configmaps.team-a.name.cm..3",
            "kcache.reply._.v1.configmaps.team-a.name.cmx.n.3",
            "kcache.reply._.v1.configmaps.team-a.name.cm.n.3 x",
        ] {
            assert!(!s.is_reply_for(t, bad), "{bad}");
        }
        assert!(!s.is_reply_for(t, &format!("kcache.reply.{t}.{}.1", "a".repeat(65))));
        assert_eq!(
            s.replies(t, "n0nce"),
            "kcache.reply._.v1.configmaps.team-a.name.cm.n0nce.*"
        );
    }

    #[test]
    fn presence_subjects_round_trip_replica_ids() {
        let s = Subjects::new("kcache");
        assert_eq!(s.alive("a.b"), "kcache.alive.a=2Eb");
        assert_eq!(
            s.replica_of_alive("kcache.alive.a=2Eb").as_deref(),
            Some("a.b")
        );
        assert_eq!(s.replica_of_alive("kcache.interest.a"), None);
        assert_eq!(s.presence("r1"), "kcache.presence.r1");
    }

    #[test]
    fn dots_and_wildcards_are_escaped_reversibly() {
        for s in [
            "a.b.c",
            "x*y>z",
            "with space",
            "under_score",
            "=eq",
            "plain-name",
            "ünï",
        ] {
            let t = escape(s);
            assert!(!t.contains('.') && !t.contains('*') && !t.contains('>') && !t.contains(' '));
            assert!(t
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'='));
            assert_eq!(unescape(&t).as_deref(), Some(s));
        }
        assert_eq!(escape("a.b"), "a=2Eb");
        assert_eq!(escape(""), "_");
        assert_eq!(unescape("_").as_deref(), Some(""));
        assert_eq!(unescape("=2"), None);
        assert_eq!(unescape("a.b"), None);
        assert_eq!(unescape("=ZZ"), None);
    }

    #[test]
    fn only_the_tokens_escape_writes_are_unescaped() {
        // Each of these was accepted and decoded to a string whose own token is another,
        // so two subjects could name one key. Fuzzing (actors/tests/fuzz_parsers.rs)
        // found the empty token (`a..b`; the empty string's token is `_`); the others
        // are the same flaw in the hex escapes.
        for t in [
            "",    // the empty string is `_`
            "=+F", // `from_str_radix` takes a sign: "\x0f"
            "=2e", // lower case: "."
            "=41", // an escaped literal: "A"
            "=2D", // "-"
        ] {
            assert_eq!(unescape(t), None, "{t:?}");
        }
        // Malformed escapes stay refused.
        for t in ["a=2", "=", "=\u{e9}A", "=C3"] {
            assert_eq!(unescape(t), None, "{t:?}");
        }
        assert_eq!(parse_key_token("....all.all"), None);
        assert_eq!(
            parse_key_token("_._._._.all._"),
            Some(ParsedKey {
                group: String::new(),
                version: String::new(),
                resource: String::new(),
                namespace: None,
                scope: "all".into(),
                value: None,
            })
        );
        assert_eq!(unescape("=5F").as_deref(), Some("_"));
        assert_eq!(unescape("=3D=2E").as_deref(), Some("=."));
        assert_eq!(unescape("=C3=BC").as_deref(), Some("ü"));
    }

    #[test]
    fn name_keys_of_a_namespace_share_the_prefix_and_nothing_else_does() {
        let ns = Key::new(secrets(), Scope::Namespace("ns1".into()));
        let prefix = member_token_prefix(&ns);
        assert_eq!(prefix, "_.v1.secrets.ns1.name.");
        assert_eq!(
            member_token_prefix(&Key::new(secrets(), Scope::Cluster)),
            "_.v1.secrets._.node."
        );
        let name = |ns: &str, n: &str| {
            key_token(&Key::new(
                secrets(),
                Scope::Name {
                    namespace: Some(ns.into()),
                    name: n.into(),
                },
            ))
        };
        assert!(name("ns1", "a.b").starts_with(&prefix));
        assert!(!name("ns10", "a").starts_with(&prefix));
        assert!(!key_token(&ns).starts_with(&prefix));
    }

    #[test]
    fn a_members_group_is_the_prefix_its_big_key_gives() {
        let nodes = Key::new(pods(), Scope::Cluster);
        let cases = [
            (
                Scope::Name {
                    namespace: Some("ns1".into()),
                    name: "a.b".into(),
                },
                true,
            ),
            (
                Scope::Name {
                    namespace: Some("_".into()),
                    name: "x".into(),
                },
                true,
            ),
            (Scope::Node("node-1.example".into()), true),
            (
                Scope::Name {
                    namespace: None,
                    name: "a".into(),
                },
                false,
            ),
            (Scope::Namespace("ns1".into()), false),
            (Scope::Cluster, false),
        ];
        for (scope, member) in cases {
            let key = Key::new(
                if matches!(scope, Scope::Node(_)) {
                    pods()
                } else {
                    secrets()
                },
                scope,
            );
            let token = key_token(&key);
            let big = match &key.scope {
                Scope::Node(_) => Some(nodes.clone()),
                Scope::Name {
                    namespace: Some(ns),
                    ..
                } => Some(Key::new(secrets(), Scope::Namespace(ns.clone()))),
                _ => None,
            };
            assert_eq!(member_group(&token).is_some(), member, "{token}");
            if let (true, Some(big)) = (member, big) {
                assert_eq!(
                    member_group(&token),
                    Some(member_token_prefix(&big).as_str()),
                    "{token}"
                );
            }
        }
        for bad in ["", "a.b", "a.b.c.d.name.e.f", ".....", "a.b.c.d.name."] {
            // Never a panic; only a six-token name or node token is a member.
            let _ = member_group(bad);
        }
        assert_eq!(member_group("a.b.c.d.name.e.f"), None);
        assert_eq!(member_group("a.b.c.d.name."), Some("a.b.c.d.name."));
    }

    #[test]
    fn key_tokens_round_trip() {
        let k = Key::new(
            secrets(),
            Scope::Name {
                namespace: Some("ns1".into()),
                name: "my.secret".into(),
            },
        );
        let t = key_token(&k);
        assert_eq!(t, "_.v1.secrets.ns1.name.my=2Esecret");
        let p = parse_key_token(&t).unwrap();
        assert_eq!(p.namespace.as_deref(), Some("ns1"));
        assert_eq!(p.value.as_deref(), Some("my.secret"));
        assert_eq!(p.group, "");

        let deploy = Arc::new(ResourceType::new(
            "apps",
            "v1",
            "deployments",
            "Deployment",
            true,
        ));
        let t = key_token(&Key::new(deploy, Scope::Cluster));
        assert_eq!(t, "apps.v1.deployments._.all._");
        let ing = Arc::new(ResourceType::new(
            "networking.k8s.io",
            "v1",
            "ingresses",
            "Ingress",
            true,
        ));
        let t = key_token(&Key::new(ing, Scope::Namespace("n".into())));
        assert_eq!(t.split('.').count(), 6);
        assert_eq!(parse_key_token(&t).unwrap().group, "networking.k8s.io");
        let pods = Arc::new(ResourceType::new("", "v1", "pods", "Pod", true));
        let t = key_token(&Key::new(pods, Scope::Node("node-1.example".into())));
        assert_eq!(t, "_.v1.pods._.node.node-1=2Eexample");
        assert_eq!(parse_key_token("a.b.c"), None);
        assert_eq!(parse_key_token("_.v1.secrets._.bogus._"), None);
    }

    #[test]
    fn subjects_share_a_prefix() {
        let s = Subjects::new("kcache");
        assert_eq!(s.events("T"), "kcache.ev.T");
        assert_eq!(s.token_of_event("kcache.ev.a.b"), Some("a.b"));
        assert_eq!(s.token_of_event("kcache.snap.a.b"), None);
        assert_eq!(s.interest("replica.a"), "kcache.interest.replica=2Ea");
    }
}
