//! One canonical parse of a request: its path as the API server's request-info derives it,
//! and its query with the first value winning for a repeated parameter (Go's
//! `url.Values.Get`), so what is validated is exactly what is served.

use kcache_actors::core::rv::{self, Rv, RvMatch};
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
const NAMESPACE_SUBRESOURCES: [&str; 2] = ["status", "finalize"];

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

/// The list/watch query parameters kcache acts on.
#[derive(Debug, Clone, Default)]
pub struct Query {
    pub watch: bool,
    pub resource_version: Option<String>,
    pub resource_version_match: Option<String>,
    pub allow_watch_bookmarks: bool,
    pub send_initial_events: Option<bool>,
    pub timeout_seconds: Option<u64>,
    pub label_selector: String,
    pub field_selector: String,
    pub limit: Option<u64>,
    pub continue_token: Option<String>,
    pub include_object: Option<String>,
    /// The first malformed parameter. Parsing never stops at it, so the request can be
    /// authorized before it is validated (a forbidden request is a 403, not a 400).
    pub invalid: Option<ApiError>,
}

/// Query strings longer than this are refused before parsing.
pub const MAX_QUERY_BYTES: usize = 16 * 1024;

fn invalid(name: &str, value: &str, why: &str) -> ApiError {
    ApiError::bad_request(format!("invalid value {value:?} for {name}: {why}"))
}

pub fn parse_query(q: &str) -> Query {
    let mut out = Query::default();
    if q.len() > MAX_QUERY_BYTES {
        out.invalid = Some(ApiError::new(
            414,
            "RequestURITooLong",
            format!("query string longer than {MAX_QUERY_BYTES} bytes"),
        ));
        return out;
    }
    let mut seen: Vec<String> = Vec::new();
    for (k, v) in url::form_urlencoded::parse(q.as_bytes()) {
        // First value wins, as Go's url.Values.Get.
        if seen.iter().any(|s| *s == k) {
            continue;
        }
        seen.push(k.to_string());
        let v = v.as_ref();
        if let Err(e) = out.set(k.as_ref(), v) {
            out.invalid.get_or_insert(e);
        }
    }
    out
}

impl Query {
    fn set(&mut self, k: &str, v: &str) -> Result<(), ApiError> {
        let out = self;
        let bool_of = |name: &'static str| {
            rv::parse_bool(name, Some(v)).map_err(|e| ApiError::bad_request(e.to_string()))
        };
        match k {
            "watch" => out.watch = bool_of("watch")?.unwrap_or(false),
            "resourceVersion" => out.resource_version = Some(v.to_string()),
            "resourceVersionMatch" => out.resource_version_match = Some(v.to_string()),
            "allowWatchBookmarks" => {
                out.allow_watch_bookmarks = bool_of("allowWatchBookmarks")?.unwrap_or(false)
            }
            "sendInitialEvents" => out.send_initial_events = bool_of("sendInitialEvents")?,
            "timeoutSeconds" => {
                out.timeout_seconds = Some(
                    v.parse()
                        .map_err(|_| invalid("timeoutSeconds", v, "not a non-negative integer"))?,
                )
            }
            "labelSelector" => out.label_selector = v.to_string(),
            "fieldSelector" => out.field_selector = v.to_string(),
            "limit" => {
                out.limit = Some(
                    v.parse()
                        .map_err(|_| invalid("limit", v, "not a non-negative integer"))?,
                )
            }
            "continue" => out.continue_token = Some(v.to_string()).filter(|c| !c.is_empty()),
            "includeObject" => out.include_object = Some(v.to_string()),
            _ => {}
        }
        Ok(())
    }

    pub fn rv(&self) -> Result<Rv, ApiError> {
        Rv::parse(self.resource_version.as_deref())
            .map_err(|e| ApiError::bad_request(e.to_string()))
    }

    pub fn rv_match(&self) -> Result<Option<RvMatch>, ApiError> {
        RvMatch::parse(self.resource_version_match.as_deref())
            .map_err(|e| ApiError::bad_request(e.to_string()))
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
        assert!(q.invalid.is_none());
        assert_eq!(q.field_selector, "metadata.name=s1");
        assert!(q.watch);
        let q = parse_query("watch=true&watch=false");
        assert!(q.watch);
    }

    #[test]
    fn malformed_parameters_are_400s() {
        for bad in [
            "watch=yes",
            "timeoutSeconds=-1",
            "timeoutSeconds=x",
            "limit=abc",
            "allowWatchBookmarks=2",
        ] {
            let e = parse_query(bad).invalid.expect(bad);
            assert_eq!(e.code, 400, "{bad}");
        }
        // The first error is kept and later parameters are still parsed, so the request
        // can be authorized before it is rejected.
        let q = parse_query("watch=maybe&fieldSelector=metadata.name%3Dx&limit=x");
        assert_eq!(q.field_selector, "metadata.name=x");
        assert!(q
            .invalid
            .as_ref()
            .is_some_and(|e| e.message.contains("watch")));
        assert_eq!(
            parse_query(&"a".repeat(MAX_QUERY_BYTES + 1))
                .invalid
                .expect("long")
                .code,
            414
        );
        let q = parse_query("resourceVersion=abc");
        assert_eq!(q.rv().expect_err("bad rv").code, 400);
        let q = parse_query("resourceVersion=5&resourceVersionMatch=Sometimes");
        assert_eq!(q.rv_match().expect_err("bad match").code, 400);
    }
}
