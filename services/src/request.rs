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
}

/// The namespace subresources the request-info parser keeps on the namespace itself.
const NAMESPACE_SUBRESOURCES: [&str; 2] = ["status", "finalize"];

/// Parses a path as the API server's `RequestInfoFactory`; `None` for non-resource paths
/// (discovery, `/version`, deprecated `/watch/` prefixes, health), which are proxied.
pub fn parse_path(path: &str) -> Option<ResourcePath> {
    let parts: Vec<String> = path
        .trim_matches('/')
        .split('/')
        .map(|p| percent_decode_str(p).decode_utf8_lossy().into_owned())
        .collect();
    let (group, version, rest) = match parts.first().map(String::as_str) {
        Some("api") if parts.len() >= 3 => (String::new(), parts[1].clone(), &parts[2..]),
        Some("apis") if parts.len() >= 4 => (parts[1].clone(), parts[2].clone(), &parts[3..]),
        _ => return None,
    };
    if rest.is_empty() || rest[0] == "watch" || rest.iter().any(String::is_empty) {
        return None;
    }
    let mut rest = rest;
    let mut namespace = None;
    if rest[0] == "namespaces" && rest.len() > 1 {
        namespace = Some(rest[1].clone());
        if rest.len() > 2 && !NAMESPACE_SUBRESOURCES.contains(&rest[2].as_str()) {
            rest = &rest[2..];
        }
    }
    if rest.len() > 3 {
        return None;
    }
    let resource = rest[0].clone();
    let name = rest.get(1).cloned();
    let subresource = rest.get(2).cloned();
    // `/api/v1/namespaces` lists namespaces: no namespace in scope.
    if resource == "namespaces" && name.is_none() {
        namespace = None;
    }
    Some(ResourcePath {
        group,
        version,
        namespace,
        resource,
        name,
        subresource,
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
