//! Request metrics, after the API server's `apiserver_request_total` and
//! `apiserver_request_duration_seconds`: every request on the API port is counted by
//! `verb`, `group`, `resource`, `code` and `served` (`cache` or `proxy`), and timed (until
//! its response starts) unless it is long-running (`WATCH`, `CONNECT`).
//!
//! Group and resource come from the client's path, so they are bounded: a pair is
//! admitted as a label only when it looks like a resource name and the answer was not a
//! 404, and at most [`MAX_RESOURCE_LABELS`] pairs are ever admitted; everything else is
//! counted as resource `_other`. A client cannot grow the metric set without bound.

use std::collections::HashSet;
use std::sync::{OnceLock, RwLock};
use std::time::Instant;

use actix_web::http::Method;

use crate::proxy::watch_requested;
use crate::request::NAMESPACE_SUBRESOURCES;

pub const REQUESTS: &str = "kcache_requests_total";
pub const REQUEST_DURATION: &str = "kcache_request_duration_seconds";

/// Most distinct (group, resource) label pairs.
pub const MAX_RESOURCE_LABELS: usize = 256;
const OTHER: &str = "_other";

/// Who answered a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ServedBy {
    Cache,
    Proxy,
}

impl ServedBy {
    fn label(self) -> &'static str {
        match self {
            ServedBy::Cache => "cache",
            ServedBy::Proxy => "proxy",
        }
    }
}

pub fn describe() {
    use metrics::{describe_counter, describe_histogram, Unit};
    describe_counter!(
        REQUESTS,
        "Requests on the API port by verb, group, resource, code and served (cache or proxy)."
    );
    describe_histogram!(
        REQUEST_DURATION,
        Unit::Seconds,
        "Time until a request's response started, by verb, group, resource and served; long-running requests (WATCH, CONNECT) are not timed."
    );
}

/// What a request's path and method say, as the API server's request info reads them.
#[derive(Debug, PartialEq, Eq)]
pub struct RequestLabels<'a> {
    pub verb: &'static str,
    pub group: &'a str,
    pub resource: &'a str,
}

/// Reads verb, group and resource from the raw path; a non-resource path (`/version`,
/// discovery, `/openapi/v2`) has empty group and resource.
pub fn request_labels<'a>(method: &Method, path: &'a str, query: &str) -> RequestLabels<'a> {
    let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let rest = match parts.first().copied() {
        Some("api") if parts.len() >= 3 => Some(("", &parts[2..])),
        Some("apis") if parts.len() >= 4 => Some((parts[1], &parts[3..])),
        _ => None,
    };
    let Some((group, mut rest)) = rest else {
        return RequestLabels {
            verb: if *method == Method::GET || *method == Method::HEAD {
                "GET"
            } else {
                method_verb(method)
            },
            group: "",
            resource: "",
        };
    };
    let mut watch_path = false;
    if rest.first() == Some(&"watch") {
        watch_path = true;
        rest = &rest[1..];
    }
    if rest.first() == Some(&"namespaces")
        && rest.len() > 2
        && !NAMESPACE_SUBRESOURCES.contains(&rest[2])
    {
        rest = &rest[2..];
    }
    let resource = rest.first().copied().unwrap_or("");
    let name = rest.get(1).copied().filter(|n| !n.is_empty());
    let subresource = rest.get(2).copied();
    // As the API server's request info: the old `/watch/` paths always, `?watch` only on a
    // collection (a named GET with it is a get), read as the proxy reads it.
    let watch = watch_path || (name.is_none() && watch_requested(query));
    let verb = match *method {
        Method::GET | Method::HEAD if watch => "WATCH",
        _ if matches!(
            subresource,
            Some("exec" | "attach" | "portforward" | "proxy")
        ) =>
        {
            "CONNECT"
        }
        Method::GET | Method::HEAD if name.is_some() => "GET",
        Method::GET | Method::HEAD => "LIST",
        Method::DELETE if name.is_none() => "DELETECOLLECTION",
        _ => method_verb(method),
    };
    RequestLabels {
        verb,
        group,
        resource,
    }
}

fn method_verb(method: &Method) -> &'static str {
    match *method {
        Method::POST => "CREATE",
        Method::PUT => "UPDATE",
        Method::PATCH => "PATCH",
        Method::DELETE => "DELETE",
        Method::GET | Method::HEAD => "GET",
        Method::OPTIONS => "OPTIONS",
        _ => "OTHER",
    }
}

/// Characters of a resource or group name as the API server has them.
fn label_worthy(s: &str) -> bool {
    s.len() <= 63
        && s.bytes()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-' || c == b'.')
}

/// The label pairs admitted so far.
fn admitted() -> &'static RwLock<HashSet<(String, String)>> {
    static SET: OnceLock<RwLock<HashSet<(String, String)>>> = OnceLock::new();
    SET.get_or_init(Default::default)
}

/// The (group, resource) labels a request is counted under.
fn resource_labels(group: &str, resource: &str, code: u16) -> (String, String) {
    let other = || (String::new(), OTHER.to_string());
    if group.is_empty() && resource.is_empty() {
        return (String::new(), String::new());
    }
    let key = (group.to_string(), resource.to_string());
    if let Ok(set) = admitted().read() {
        if set.contains(&key) {
            return key;
        }
    }
    if code == 404 || !label_worthy(group) || !label_worthy(resource) || resource.is_empty() {
        return other();
    }
    match admitted().write() {
        Ok(mut set) if set.len() < MAX_RESOURCE_LABELS => {
            set.insert(key.clone());
            key
        }
        _ => other(),
    }
}

/// Counts and times one request.
pub fn record(
    method: &Method,
    path: &str,
    query: &str,
    served: ServedBy,
    code: u16,
    started: Instant,
) {
    let l = request_labels(method, path, query);
    let (group, resource) = resource_labels(l.group, l.resource, code);
    metrics::counter!(
        REQUESTS,
        "verb" => l.verb,
        "group" => group.clone(),
        "resource" => resource.clone(),
        "code" => code.to_string(),
        "served" => served.label(),
    )
    .increment(1);
    if !matches!(l.verb, "WATCH" | "CONNECT") {
        metrics::histogram!(
            REQUEST_DURATION,
            "verb" => l.verb,
            "group" => group,
            "resource" => resource,
            "served" => served.label(),
        )
        .record(started.elapsed().as_secs_f64());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Method, path, query; verb, group, resource.
    type Case = (
        Method,
        &'static str,
        &'static str,
        (&'static str, &'static str, &'static str),
    );

    #[test]
    fn verbs_groups_and_resources_as_the_api_server_reads_them() {
        let cases: &[Case] = &[
            (
                Method::GET,
                "/api/v1/namespaces/a/secrets",
                "",
                ("LIST", "", "secrets"),
            ),
            (
                Method::GET,
                "/api/v1/namespaces/a/secrets",
                "watch=1",
                ("WATCH", "", "secrets"),
            ),
            (
                Method::GET,
                "/api/v1/namespaces/a/secrets",
                "watch=false",
                ("LIST", "", "secrets"),
            ),
            // apimachinery's bool: the first value, true unless 0 or false.
            (
                Method::GET,
                "/api/v1/namespaces/a/secrets",
                "watch=",
                ("WATCH", "", "secrets"),
            ),
            (
                Method::GET,
                "/api/v1/namespaces/a/secrets",
                "watch=yes",
                ("WATCH", "", "secrets"),
            ),
            (
                Method::GET,
                "/api/v1/namespaces/a/secrets",
                "watch=0&watch=1",
                ("LIST", "", "secrets"),
            ),
            // A named GET with ?watch is a get; the old watch path by name is a watch.
            (
                Method::GET,
                "/api/v1/namespaces/a/secrets/s",
                "watch=1",
                ("GET", "", "secrets"),
            ),
            (
                Method::GET,
                "/api/v1/watch/namespaces/a/secrets/s",
                "",
                ("WATCH", "", "secrets"),
            ),
            (
                Method::GET,
                "/api/v1/watch/namespaces/a/secrets",
                "",
                ("WATCH", "", "secrets"),
            ),
            (
                Method::GET,
                "/api/v1/namespaces/a/secrets/s",
                "",
                ("GET", "", "secrets"),
            ),
            (
                Method::GET,
                "/api/v1/namespaces/a",
                "",
                ("GET", "", "namespaces"),
            ),
            (
                Method::PUT,
                "/api/v1/namespaces/a/finalize",
                "",
                ("UPDATE", "", "namespaces"),
            ),
            (Method::GET, "/api/v1/nodes", "", ("LIST", "", "nodes")),
            (
                Method::PATCH,
                "/api/v1/nodes/n1/status",
                "",
                ("PATCH", "", "nodes"),
            ),
            (
                Method::POST,
                "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases",
                "",
                ("CREATE", "coordination.k8s.io", "leases"),
            ),
            (
                Method::DELETE,
                "/apis/apps/v1/namespaces/a/deployments",
                "",
                ("DELETECOLLECTION", "apps", "deployments"),
            ),
            (
                Method::DELETE,
                "/apis/apps/v1/namespaces/a/deployments/d",
                "",
                ("DELETE", "apps", "deployments"),
            ),
            (
                Method::POST,
                "/api/v1/namespaces/a/pods/p/exec",
                "",
                ("CONNECT", "", "pods"),
            ),
            (
                Method::GET,
                "/api/v1/namespaces/a/pods/p/log",
                "follow=true",
                ("GET", "", "pods"),
            ),
            (Method::GET, "/version", "", ("GET", "", "")),
            (Method::GET, "/apis", "", ("GET", "", "")),
            (Method::GET, "/apis/apps/v1", "", ("GET", "", "")),
        ];
        for (method, path, query, (verb, group, resource)) in cases {
            assert_eq!(
                request_labels(method, path, query),
                RequestLabels {
                    verb,
                    group,
                    resource
                },
                "{method} {path}?{query}"
            );
        }
    }

    #[test]
    fn client_chosen_resource_labels_are_bounded() {
        // 404s and names no resource has never become labels.
        assert_eq!(resource_labels("", "nosuch", 404).1, OTHER);
        assert_eq!(resource_labels("", "Bad%20Name", 200).1, OTHER);
        assert_eq!(resource_labels("x".repeat(64).as_str(), "r", 200).1, OTHER);
        assert_eq!(resource_labels("", "", 200), (String::new(), String::new()));
        assert_eq!(
            resource_labels("apps", "deployments", 200),
            ("apps".to_string(), "deployments".to_string())
        );
        // Once admitted, even a 404 (a missing object) keeps its resource label.
        assert_eq!(resource_labels("apps", "deployments", 404).1, "deployments");
        for i in 0..MAX_RESOURCE_LABELS + 10 {
            resource_labels("flood.example", &format!("r{i}"), 200);
        }
        let set = admitted().read().expect("not poisoned");
        assert!(set.len() <= MAX_RESOURCE_LABELS);
    }
}
