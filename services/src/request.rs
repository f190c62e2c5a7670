//! One canonical parse of a request: its path as the API server's request-info derives it,
//! and its query with the first value winning for a repeated parameter (Go's
//! `url.Values.Get`), so what is validated is exactly what is served.

use kcache_actors::core::rv::{Rv, RvMatch};
use percent_encoding::percent_decode_str;

use crate::status::ApiError;

/// A resource request path: `/api/v1/...` or `/apis/{group}/{version}/...`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResourcePath {
    pub group: String,
    pub version: String,
    pub namespace: Option<String>,
    pub resource: String,
    pub name: Option<String>,
    pub subresource: Option<String>,
    /// The resource came after a `namespaces/{ns}/` prefix (`/api/v1/namespaces/a/secrets`),
    /// as opposed to a namespace's own path (`/api/v1/namespaces/a`), whose namespace is
    /// its name. A cluster-scoped resource under such a prefix is not a route the API
    /// server has.
    pub namespace_prefix: bool,
}

/// The namespace subresources the request-info parser keeps on the namespace itself.
pub const NAMESPACE_SUBRESOURCES: [&str; 2] = ["status", "finalize"];

/// Longest object name kcache keeps a key for: the API server's limit for the names of
/// nearly every resource (a DNS-1123 subdomain). Longer names cannot exist there; a GET of
/// one is proxied instead of becoming a key, a NATS subject and an upstream watch.
pub const MAX_NAME_BYTES: usize = 253;

/// Parses a path as the API server's `RequestInfoFactory` reads it, for requests the cache
/// may serve; `None` for everything else, which is proxied and answered by the API server
/// itself with the caller's own credentials.
///
/// The API server splits the *decoded* path (Go's `URL.Path`) on `/`, so `%2F` inside a
/// segment is a separator there; decoding first and splitting second gives the same
/// segments. Anything kcache would read differently from the API server, or could not use
/// as a key verbatim, is `None`: a path that is not in canonical form (empty segments, a
/// trailing slash, invalid UTF-8), a namespace that is not a DNS-1123 label, a name that
/// is not a valid path segment ([`is_keyable_name`]). Proxying such a request is always
/// safe: kcache never reads with its own identity for it.
pub fn parse_path(path: &str) -> Option<ResourcePath> {
    let decoded = percent_decode_str(path).decode_utf8().ok()?;
    let parts: Vec<&str> = decoded.strip_prefix('/')?.split('/').collect();
    if parts.iter().any(|p| p.is_empty()) {
        return None;
    }
    let (group, version, rest) = match parts.first().copied() {
        Some("api") if parts.len() >= 3 => ("", parts[1], &parts[2..]),
        Some("apis") if parts.len() >= 4 => (parts[1], parts[2], &parts[3..]),
        _ => return None,
    };
    if rest[0] == "watch" {
        return None;
    }
    let mut rest = rest;
    let mut namespace = None;
    let mut namespace_prefix = false;
    if rest[0] == "namespaces" && rest.len() > 1 {
        namespace = Some(rest[1]);
        if rest.len() > 2 && !NAMESPACE_SUBRESOURCES.contains(&rest[2]) {
            rest = &rest[2..];
            namespace_prefix = true;
        }
    }
    if rest.len() > 3 {
        return None;
    }
    let resource = rest[0];
    let name = rest.get(1).copied();
    let subresource = rest.get(2).copied();
    // `/api/v1/namespaces` lists namespaces: no namespace in scope.
    if resource == "namespaces" && name.is_none() {
        namespace = None;
    }
    if namespace.is_some_and(|ns| !is_dns1123_label(ns))
        || name.is_some_and(|n| !is_keyable_name(n))
    {
        return None;
    }
    Some(ResourcePath {
        group: group.to_string(),
        version: version.to_string(),
        namespace: namespace.map(str::to_string),
        resource: resource.to_string(),
        name: name.map(str::to_string),
        subresource: subresource.map(str::to_string),
        namespace_prefix,
    })
}

/// A DNS-1123 label, the API server's rule for namespace names: at most 63 of `[a-z0-9-]`,
/// starting and ending with an alphanumeric.
pub fn is_dns1123_label(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[0] != b'-'
        && b[b.len() - 1] != b'-'
}

/// A name kcache may keep a key for: a valid path segment for the API server
/// (`IsValidPathSegmentName`: not `.` or `..`, no `/` or `%`), at most [`MAX_NAME_BYTES`],
/// and only printable ASCII without the characters that are syntax in a field selector
/// (`,` `=` `!` `\`) or a URL (`?` `#` `&` `+`, space), so the name reaches the upstream
/// `metadata.name=` selector and NATS subjects verbatim. Object names of every built-in
/// resource fit; a request for any other name is proxied.
pub fn is_keyable_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= MAX_NAME_BYTES
        && s != "."
        && s != ".."
        && s.bytes().all(|c| {
            c.is_ascii_graphic()
                && !matches!(
                    c,
                    b'/' | b'%' | b',' | b'=' | b'!' | b'\\' | b'?' | b'#' | b'&' | b'+'
                )
        })
}

/// The query parameters kcache acts on, each as its first raw value (Go's
/// `url.Values.Get`). They are converted where they are used, as the API server converts
/// them: a GET by name decodes only `resourceVersion`, a list or watch its `ListOptions`.
#[derive(Debug, Clone, Default)]
pub struct Query {
    watch: Option<String>,
    pub resource_version: Option<String>,
    pub resource_version_match: Option<String>,
    allow_watch_bookmarks: Option<String>,
    send_initial_events: Option<String>,
    timeout_seconds: Option<String>,
    pub label_selector: String,
    pub field_selector: String,
    limit: Option<String>,
    pub continue_token: Option<String>,
    pub include_object: Option<String>,
    /// kcache cannot be sure to read this query exactly as the API server does (a value
    /// that is not UTF-8, a boolean that is not ASCII, an oversized query): the request is
    /// proxied, and the API server answers it with the caller's own credentials.
    pub opaque: bool,
}

/// Query strings longer than this are proxied without being read.
pub const MAX_QUERY_BYTES: usize = 16 * 1024;

/// Splits a raw query as Go's `url.ParseQuery` (Go 1.17 and later), which the API server
/// reads every request with: pairs are separated by `&` only; a pair containing `;`, or
/// with a malformed percent escape, is dropped; `+` is a space. `None` when a kept key or
/// value does not decode to UTF-8 (Go keeps such bytes; kcache cannot compare them).
fn go_parse_query(q: &str) -> Option<Vec<(String, String)>> {
    let mut out = Vec::new();
    for pair in q.split('&') {
        if pair.is_empty() || pair.contains(';') {
            continue;
        }
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let (Some(k), Some(v)) = (go_query_unescape(k), go_query_unescape(v)) else {
            continue;
        };
        out.push((String::from_utf8(k).ok()?, String::from_utf8(v).ok()?));
    }
    Some(out)
}

/// Go's `url.QueryUnescape`: `None` for a `%` not followed by two hex digits.
fn go_query_unescape(s: &str) -> Option<Vec<u8>> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' => {
                let hex = |c: u8| (c as char).to_digit(16);
                let hi = b.get(i + 1).copied().and_then(hex)?;
                let lo = b.get(i + 2).copied().and_then(hex)?;
                out.push((hi * 16 + lo) as u8);
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            c => {
                out.push(c);
                i += 1;
            }
        }
    }
    Some(out)
}

/// A boolean parameter as the API server converts one (`Convert_Slice_string_To_bool`):
/// absent is false; `0` and `false` in any case are false; anything else, the empty
/// string included, is true. `None` for a value that is not ASCII, whose case folding
/// kcache does not try to match.
fn go_bool(v: Option<&str>) -> Option<bool> {
    match v {
        None => Some(false),
        Some(v) if !v.is_ascii() => None,
        Some(v) => Some(!(v == "0" || v.eq_ignore_ascii_case("false"))),
    }
}

/// An integer parameter as the API server converts one (`strconv.ParseInt(v, 10, 64)`:
/// an optional sign and decimal digits; empty is an error).
/// As Go's `strconv.ParseInt(v, 10, 64)`, whose error is the API server's whole message
/// for a query integer that does not decode (400).
fn go_int(v: &str) -> Result<i64, ApiError> {
    v.parse::<i64>().map_err(|e| {
        let why = match e.kind() {
            std::num::IntErrorKind::PosOverflow | std::num::IntErrorKind::NegOverflow => {
                "value out of range"
            }
            _ => "invalid syntax",
        };
        ApiError::bad_request(format!(
            "strconv.ParseInt: parsing {}: {why}",
            kcache_actors::core::go_quote::go_quote(v)
        ))
    })
}

pub fn parse_query(q: &str) -> Query {
    let mut out = Query::default();
    if q.len() > MAX_QUERY_BYTES {
        out.opaque = true;
        return out;
    }
    // Go 1.17 and later drop a pair containing `;`; the Go 1.15 that official 1.20
    // binaries are built with splits on it. Either way kcache cannot be sure: proxied.
    if q.contains(';') {
        out.opaque = true;
        return out;
    }
    let Some(pairs) = go_parse_query(q) else {
        out.opaque = true;
        return out;
    };
    let mut seen = std::collections::HashSet::new();
    for (k, v) in &pairs {
        // First value wins, as Go's url.Values.Get.
        if !seen.insert(k.as_str()) {
            continue;
        }
        let slot = match k.as_str() {
            "watch" => &mut out.watch,
            "resourceVersion" => &mut out.resource_version,
            "resourceVersionMatch" => &mut out.resource_version_match,
            "allowWatchBookmarks" => &mut out.allow_watch_bookmarks,
            "sendInitialEvents" => &mut out.send_initial_events,
            "timeoutSeconds" => &mut out.timeout_seconds,
            "labelSelector" => {
                out.label_selector = v.clone();
                continue;
            }
            "fieldSelector" => {
                out.field_selector = v.clone();
                continue;
            }
            "limit" => &mut out.limit,
            "continue" => &mut out.continue_token,
            "includeObject" => &mut out.include_object,
            _ => continue,
        };
        *slot = Some(v.clone());
    }
    for b in [
        &out.watch,
        &out.allow_watch_bookmarks,
        &out.send_initial_events,
    ] {
        if go_bool(b.as_deref()).is_none() {
            out.opaque = true;
        }
    }
    // A resourceVersion with leading zeros ("00", "01") means the same number to the
    // cacher's parser but not to its string comparisons (`"0"`): proxied.
    if out
        .resource_version
        .as_deref()
        .is_some_and(|v| v.len() > 1 && v.starts_with('0'))
    {
        out.opaque = true;
    }
    out.continue_token = out.continue_token.filter(|c| !c.is_empty());
    out
}

impl Query {
    /// `watch`, which turns a list into a watch (a GET by name ignores it).
    pub fn watch(&self) -> bool {
        go_bool(self.watch.as_deref()).unwrap_or(false)
    }

    pub fn allow_watch_bookmarks(&self) -> bool {
        go_bool(self.allow_watch_bookmarks.as_deref()).unwrap_or(false)
    }

    /// `sendInitialEvents` when present. Kubernetes 1.20 has no such parameter; kcache
    /// reads it as 1.27 and later do (streaming lists for kube-rs and client-go).
    pub fn send_initial_events(&self) -> Option<bool> {
        self.send_initial_events
            .as_deref()
            .map(|v| go_bool(Some(v)).unwrap_or(false))
    }

    /// `timeoutSeconds`; any 64-bit value is accepted, as upstream (what a negative or
    /// zero one means is the watch's to decide).
    pub fn timeout_seconds(&self) -> Result<Option<i64>, ApiError> {
        self.timeout_seconds.as_deref().map(go_int).transpose()
    }

    /// `limit`; zero or negative means no limit, as upstream.
    pub fn limit(&self) -> Result<Option<u64>, ApiError> {
        match self.limit.as_deref() {
            None => Ok(None),
            Some(v) => Ok(u64::try_from(go_int(v)?).ok().filter(|l| *l > 0)),
        }
    }

    /// Whether the API server's `ListOptions` decoding of this query succeeds. When it
    /// fails, its request-info ignores the query (no name from a field selector) and the
    /// handler answers 400.
    pub fn list_options_decode(&self) -> bool {
        self.timeout_seconds().is_ok()
            && self.limit().is_ok()
            && kcache_actors::core::selector::LabelSelector::parse(&self.label_selector).is_ok()
            && kcache_actors::core::selector::FieldSelector::parse(&self.field_selector).is_ok()
    }

    /// `resourceVersion` as a list reads it: a value that does not parse is the API
    /// server's 400 "invalid resource version".
    pub fn list_rv(&self) -> Result<Rv, ApiError> {
        Rv::parse(self.resource_version.as_deref())
            .map_err(|e| ApiError::bad_request(format!("invalid resource version: {e}")))
    }

    /// `resourceVersion` as a watch or a get by name reads it: a value that does not
    /// parse is the API server's 500 (its storage error, with no reason).
    pub fn watch_or_get_rv(&self) -> Result<Rv, ApiError> {
        Rv::parse(self.resource_version.as_deref()).map_err(|e| ApiError::internal(e.to_string()))
    }

    /// `resourceVersionMatch` once [`Query::validate_list_options`] accepted it.
    pub fn rv_match(&self) -> Option<RvMatch> {
        RvMatch::parse(self.resource_version_match.as_deref())
    }

    /// This query's `ListOptions` as the API server reads them for a list (`watch` false)
    /// or a watch: decoded, then defaulted (`SetListOptionsDefaults`: a legacy watch is a
    /// streaming list).
    pub fn list_options(&self, watch: bool) -> kcache_actors::core::rv::ListOptions<'_> {
        kcache_actors::core::rv::ListOptions {
            watch,
            resource_version: self.resource_version.as_deref(),
            resource_version_match: self.resource_version_match.as_deref(),
            has_continue: self.continue_token.is_some(),
            send_initial_events: self.send_initial_events(),
        }
        .defaulted()
    }

    /// The API server's `ValidateListOptions` of this query's defaulted options as a list
    /// (`watch` false) or a watch: 422 Invalid with its messages.
    pub fn validate_list_options(&self, watch: bool) -> Result<(), ApiError> {
        kcache_actors::core::rv::validate(&self.list_options(watch))
            .map_err(ApiError::invalid_list_options)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rp(
        ns: Option<&str>,
        res: &str,
        name: Option<&str>,
        sub: Option<&str>,
    ) -> Option<ResourcePath> {
        Some(ResourcePath {
            group: String::new(),
            version: "v1".into(),
            namespace: ns.map(Into::into),
            resource: res.into(),
            name: name.map(Into::into),
            subresource: sub.map(Into::into),
            namespace_prefix: ns.is_some() && res != "namespaces",
        })
    }

    #[test]
    fn request_info_paths() {
        assert_eq!(
            parse_path("/api/v1/secrets"),
            rp(None, "secrets", None, None)
        );
        assert_eq!(
            parse_path("/api/v1/namespaces/a/secrets"),
            rp(Some("a"), "secrets", None, None)
        );
        assert_eq!(
            parse_path("/api/v1/namespaces/a/secrets/s"),
            rp(Some("a"), "secrets", Some("s"), None)
        );
        assert_eq!(
            parse_path("/api/v1/namespaces/a/pods/p/log"),
            rp(Some("a"), "pods", Some("p"), Some("log"))
        );
        assert_eq!(
            parse_path("/api/v1/namespaces"),
            rp(None, "namespaces", None, None)
        );
        assert_eq!(
            parse_path("/api/v1/namespaces/a"),
            rp(Some("a"), "namespaces", Some("a"), None)
        );
        assert_eq!(
            parse_path("/api/v1/namespaces/a/status"),
            rp(Some("a"), "namespaces", Some("a"), Some("status"))
        );
        let d = parse_path("/apis/apps/v1/namespaces/a/deployments/d").expect("resource");
        assert_eq!(
            (d.group.as_str(), d.resource.as_str(), d.name.as_deref()),
            ("apps", "deployments", Some("d"))
        );
        for other in [
            "/api",
            "/api/v1",
            "/apis",
            "/apis/apps/v1",
            "/version",
            "/api/v1/watch/secrets",
            "/healthz",
            "/api/v1/namespaces/a/pods/p/x/y",
            "/api/v1//secrets",
        ] {
            assert_eq!(parse_path(other), None, "{other}");
        }
        assert_eq!(
            parse_path("/api/v1/namespaces/a/secrets/s%2Ex"),
            rp(Some("a"), "secrets", Some("s.x"), None)
        );
    }

    #[test]
    fn encoded_separators_split_as_the_api_server_splits_them() {
        // `%2F` is a `/` in the API server's URL.Path: the namespace is `kube-system` and
        // the resource `secrets?x=`, never a ConfigMaps list in an odd namespace.
        let p = parse_path("/api/v1/namespaces/kube-system%2Fsecrets%3Fx%3D/configmaps");
        assert!(
            p.as_ref().is_none_or(|p| p.resource != "configmaps"),
            "{p:?}"
        );
        assert_eq!(
            parse_path("/api/v1/namespaces/a%2Fsecrets/s"),
            rp(Some("a"), "secrets", Some("s"), None).map(|mut p| {
                p.namespace_prefix = true;
                p
            })
        );
    }

    #[test]
    fn segments_the_cache_cannot_serve_verbatim_are_proxied() {
        for path in [
            // Not DNS-1123 labels.
            "/api/v1/namespaces/Kube-System/configmaps",
            "/api/v1/namespaces/a_b/configmaps",
            "/api/v1/namespaces/-a/configmaps",
            "/api/v1/namespaces/a%3Fx/configmaps",
            "/api/v1/namespaces/a%00/configmaps",
            // Invalid path segment names (`IsValidPathSegmentName`) or selector syntax.
            "/api/v1/namespaces/a/configmaps/..",
            "/api/v1/namespaces/a/configmaps/.",
            "/api/v1/namespaces/a/configmaps/%2E%2E",
            "/api/v1/namespaces/a/configmaps/x%25y",
            "/api/v1/namespaces/a/configmaps/x,metadata.namespace=b",
            "/api/v1/namespaces/a/configmaps/x%3Dy",
            "/api/v1/namespaces/a/configmaps/x%20y",
            "/api/v1/namespaces/a/configmaps/%C3%A9",
            // Not canonical.
            "/api/v1/namespaces/a/configmaps/",
            "/api/v1/namespaces/a/configmaps/x/",
            "//api/v1/configmaps",
            "/api/v1/namespaces/a/configmaps/%FF",
        ] {
            assert_eq!(parse_path(path), None, "{path}");
        }
        let long = "n".repeat(MAX_NAME_BYTES);
        assert!(parse_path(&format!("/api/v1/namespaces/a/secrets/{long}")).is_some());
        assert_eq!(
            parse_path(&format!("/api/v1/namespaces/a/secrets/{long}n")),
            None
        );
        assert_eq!(
            parse_path(&format!("/api/v1/namespaces/{}/secrets", "a".repeat(64))),
            None
        );
        assert!(parse_path("/api/v1/namespaces/a-1/secrets/x.y-z_w:v@u").is_some());
    }

    #[test]
    fn namespace_prefix_tells_a_namespace_from_a_resource_inside_one() {
        let own = parse_path("/api/v1/namespaces/foo").expect("namespace");
        assert!(!own.namespace_prefix);
        let nested = parse_path("/api/v1/namespaces/foo/namespaces/foo").expect("parsed");
        assert!(nested.namespace_prefix);
        assert!(parse_path("/api/v1/namespaces/foo/status").is_some_and(|p| !p.namespace_prefix));
        assert!(parse_path("/api/v1/namespaces/foo/secrets").is_some_and(|p| p.namespace_prefix));
    }

    #[test]
    fn first_value_wins() {
        let q = parse_query(
            "fieldSelector=metadata.name%3Ds1&fieldSelector=metadata.name%3Ds2&watch=1",
        );
        assert!(!q.opaque);
        assert_eq!(q.field_selector, "metadata.name=s1");
        assert!(q.watch());
        let q = parse_query("watch=true&watch=false");
        assert!(q.watch());
        // Keys are unescaped too.
        assert!(parse_query("%77atch=1").watch());
    }

    #[test]
    fn pairs_are_split_and_dropped_as_go_does() {
        // `;` splits pairs for the Go that builds official 1.20 binaries and drops them for
        // later ones: either way kcache does not read the query.
        assert!(parse_query("watch=1;fieldSelector=metadata.name%3Dx&limit=5").opaque);
        assert!(!parse_query("a=%3B").opaque);
        assert!(parse_query("resourceVersion=01").opaque);
        assert!(parse_query("resourceVersion=00").opaque);
        assert!(!parse_query("resourceVersion=0").opaque);
        assert!(!parse_query("resourceVersion=10").opaque);
        // A malformed escape drops its pair only, so a later duplicate can win.
        let q = parse_query("labelSelector=a%zz&labelSelector=b&watch=%");
        assert_eq!(q.label_selector, "b");
        assert!(!q.watch());
        assert_eq!(parse_query("labelSelector=a+b").label_selector, "a b");
        // Bytes that are not UTF-8: kcache does not read it.
        assert!(parse_query("labelSelector=%ff").opaque);
        assert!(parse_query(&"a".repeat(MAX_QUERY_BYTES + 1)).opaque);
    }

    #[test]
    fn parameters_convert_as_the_api_server_converts_them() {
        for (v, want) in [
            ("", true),
            ("1", true),
            ("yes", true),
            ("maybe", true),
            ("0", false),
            ("false", false),
            ("FaLsE", false),
            ("00", true),
        ] {
            assert_eq!(parse_query(&format!("watch={v}")).watch(), want, "{v:?}");
            let q = parse_query(&format!("allowWatchBookmarks={v}"));
            assert_eq!(q.allow_watch_bookmarks(), want, "{v:?}");
        }
        assert!(!parse_query("").watch());
        assert_eq!(parse_query("").send_initial_events(), None);
        assert_eq!(
            parse_query("sendInitialEvents=").send_initial_events(),
            Some(true)
        );
        assert!(parse_query("watch=f%C3%A4lse").opaque);
        // Any 64-bit integer; zero and negative limits mean no limit.
        assert_eq!(parse_query("limit=-3").limit(), Ok(None));
        assert_eq!(parse_query("limit=0").limit(), Ok(None));
        assert_eq!(parse_query("limit=%2B7").limit(), Ok(Some(7)));
        assert_eq!(
            parse_query("timeoutSeconds=-4").timeout_seconds(),
            Ok(Some(-4))
        );
        for bad in [
            "limit=abc",
            "limit=",
            "timeoutSeconds=x",
            "timeoutSeconds=1.5",
        ] {
            let q = parse_query(bad);
            assert!(!q.list_options_decode(), "{bad}");
            let e = q.limit().and(q.timeout_seconds().map(|_| None::<u8>));
            assert_eq!(e.expect_err(bad).code, 400, "{bad}");
        }
        assert!(!parse_query("labelSelector=a%20in%20(").list_options_decode());
        assert!(parse_query("labelSelector=a&watch=maybe").list_options_decode());
        let q = parse_query("resourceVersion=abc");
        assert_eq!(q.list_rv().expect_err("bad rv").code, 400);
        assert_eq!(q.watch_or_get_rv().expect_err("bad rv").code, 500);
        let q = parse_query("resourceVersion=5&resourceVersionMatch=Sometimes");
        assert_eq!(
            q.validate_list_options(false).expect_err("bad match").code,
            422
        );
        assert_eq!(q.rv_match(), None);
    }
}
