//! Delegated authorization: every cache-served request is checked with a
//! SubjectAccessReview against the upstream, with the request's attributes as the API
//! server's request-info derives them, as aggregated API servers do. Decisions are cached
//! briefly (separate allow and deny TTLs, bounded).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::authorization::v1::{
    FieldSelectorAttributes, LabelSelectorAttributes, NonResourceAttributes, ResourceAttributes,
    SubjectAccessReview, SubjectAccessReviewSpec,
};
use kcache_actors::core::go_quote::go_quote;
use thiserror::Error;

use crate::auth::UserInfo;
use crate::status::ApiError;
use crate::ttl_cache::{record_review, TtlCache};

#[derive(Debug, Error)]
pub enum Error {
    #[error("SubjectAccessReview request failed: {0}")]
    ReviewFailed(#[source] kube::Error),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What is being done, as the API server's `RequestInfo` describes it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Attributes {
    Resource {
        verb: String,
        group: String,
        version: String,
        resource: String,
        subresource: String,
        namespace: String,
        /// For list/watch with `fieldSelector=metadata.name=X`, X: what lets the Node
        /// authorizer allow a kubelet to watch exactly the Secrets its pods mount.
        name: String,
        /// For list and watch, the request's raw `fieldSelector` and `labelSelector` (first
        /// values; empty when absent), sent in the review as `rawSelector`s: the reference
        /// API server authorizes with selectors (`AuthorizeWithSelectors`, GA 1.34; the
        /// Node authorizer lets `system:node:X` list its pods only with
        /// `spec.nodeName=X`), and parses them as it parses the request's own.
        field_selector: String,
        label_selector: String,
    },
    NonResource {
        verb: String,
        path: String,
    },
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    pub allowed: bool,
    pub reason: String,
}

/// The whole user (name, uid, groups and `extra`: a scoped or bound token of one user may be
/// allowed less than another) and what they do.
type CacheKey = (UserInfo, Attributes);

/// Allowing answers live `allow_ttl`, denying ones `deny_ttl` (zero: not cached).
fn decision_cache(
    allow_ttl: Duration,
    deny_ttl: Duration,
    capacity: usize,
) -> TtlCache<CacheKey, Decision> {
    let capacity = if allow_ttl.is_zero() && deny_ttl.is_zero() {
        0
    } else {
        capacity
    };
    TtlCache::new("authz", capacity, move |d: &Decision| {
        if d.allowed {
            allow_ttl
        } else {
            deny_ttl
        }
    })
}

pub struct Authorizer {
    client: kube::Client,
    /// Allowing and denying answers live `authz_allow_ttl_secs` / `authz_deny_ttl_secs`.
    cache: TtlCache<CacheKey, Decision>,
}

impl Authorizer {
    pub fn new(
        client: kube::Client,
        allow_ttl: Duration,
        deny_ttl: Duration,
        capacity: usize,
    ) -> Self {
        Authorizer {
            client,
            cache: decision_cache(allow_ttl, deny_ttl, capacity),
        }
    }

    pub async fn authorize(&self, user: &UserInfo, attrs: &Attributes) -> Result<Decision> {
        self.cache
            .get_or_fetch((user.clone(), attrs.clone()), || self.review(user, attrs))
            .await
    }

    async fn review(&self, user: &UserInfo, attrs: &Attributes) -> Result<Decision> {
        let (resource_attributes, non_resource_attributes) = match attrs.clone() {
            Attributes::Resource {
                verb,
                group,
                version,
                resource,
                subresource,
                namespace,
                name,
                field_selector,
                label_selector,
            } => (
                Some(ResourceAttributes {
                    field_selector: Some(field_selector).filter(|s| !s.is_empty()).map(|raw| {
                        FieldSelectorAttributes {
                            raw_selector: Some(raw),
                            requirements: None,
                        }
                    }),
                    label_selector: Some(label_selector).filter(|s| !s.is_empty()).map(|raw| {
                        LabelSelectorAttributes {
                            raw_selector: Some(raw),
                            requirements: None,
                        }
                    }),
                    verb: Some(verb),
                    group: Some(group),
                    version: Some(version),
                    resource: Some(resource),
                    subresource: Some(subresource).filter(|s| !s.is_empty()),
                    namespace: Some(namespace).filter(|s| !s.is_empty()),
                    name: Some(name).filter(|s| !s.is_empty()),
                }),
                None,
            ),
            Attributes::NonResource { verb, path } => (
                None,
                Some(NonResourceAttributes {
                    verb: Some(verb),
                    path: Some(path),
                }),
            ),
        };
        let sar = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: Some(user.username.clone()),
                groups: Some(user.groups.clone()),
                uid: Some(user.uid.clone()).filter(|u| !u.is_empty()),
                extra: Some(user.extra.clone()).filter(|e: &BTreeMap<_, _>| !e.is_empty()),
                resource_attributes,
                non_resource_attributes,
            },
            ..Default::default()
        };
        let api: kube::Api<SubjectAccessReview> = kube::Api::all(self.client.clone());
        let started = Instant::now();
        let out = api.create(&Default::default(), &sar).await;
        let decision = out.map(|out| {
            let status = out.status.unwrap_or_default();
            Decision {
                allowed: status.allowed && status.denied != Some(true),
                reason: status.reason.unwrap_or_default(),
            }
        });
        let result = match &decision {
            Ok(d) if d.allowed => "allowed",
            Ok(_) => "denied",
            Err(_) => "error",
        };
        record_review("SubjectAccessReview", result, started.elapsed());
        decision.map_err(Error::ReviewFailed)
    }
}

/// The API server's 403 for a denied request (`responsewriters.ForbiddenStatusError` and
/// `apierrors.NewForbidden`): every name printed as Go's `%q` prints it, `&`, `<` and `>`
/// of the "User … cannot …" part escaped as HTML entities (the API server's sanitizer; the
/// reason is not), and the subject qualified by its group (`endpointslices.discovery.k8s.io
/// "x" is forbidden`).
pub fn forbidden(user: &UserInfo, attrs: &Attributes, reason: &str) -> ApiError {
    let sanitize = |s: String| {
        s.replace('&', "&amp;")
            .replace('<', "&lt;")
            .replace('>', "&gt;")
    };
    let mut msg = match attrs {
        Attributes::Resource {
            verb,
            group,
            resource,
            subresource,
            namespace,
            name,
            ..
        } => {
            let full = if subresource.is_empty() {
                resource.clone()
            } else {
                format!("{resource}/{subresource}")
            };
            let qualified = if group.is_empty() {
                resource.clone()
            } else {
                format!("{resource}.{group}")
            };
            let subject = if name.is_empty() {
                qualified
            } else {
                format!("{qualified} {}", go_quote(name))
            };
            let scope = if namespace.is_empty() {
                "at the cluster scope".to_string()
            } else {
                format!("in the namespace {}", go_quote(namespace))
            };
            let why = format!(
                "User {} cannot {verb} resource {} in API group {} {scope}",
                go_quote(&user.username),
                go_quote(&full),
                go_quote(group),
            );
            format!("{subject} is forbidden: {}", sanitize(why))
        }
        Attributes::NonResource { verb, path } => format!(
            "forbidden: {}",
            sanitize(format!(
                "User {} cannot {verb} path {}",
                go_quote(&user.username),
                go_quote(path),
            ))
        ),
    };
    if !reason.is_empty() {
        msg.push_str(": ");
        msg.push_str(reason);
    }
    let mut e = ApiError::new(403, "Forbidden", msg);
    if let Attributes::Resource {
        group,
        resource,
        name,
        ..
    } = attrs
    {
        // As the API server's Status: empty fields are omitted (Go's `omitempty`).
        let mut details = serde_json::json!({"kind": resource});
        if !group.is_empty() {
            details["group"] = serde_json::json!(group);
        }
        if !name.is_empty() {
            details["name"] = serde_json::json!(name);
        }
        e.details = Some(details);
    }
    e
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ttl_cache::tests::Counted;

    fn user() -> UserInfo {
        UserInfo {
            username: "viewer".into(),
            uid: String::new(),
            groups: vec![],
            extra: BTreeMap::new(),
        }
    }

    fn res(verb: &str, ns: &str, name: &str) -> Attributes {
        Attributes::Resource {
            verb: verb.into(),
            group: String::new(),
            version: "v1".into(),
            resource: "secrets".into(),
            subresource: String::new(),
            namespace: ns.into(),
            name: name.into(),
            field_selector: String::new(),
            label_selector: String::new(),
        }
    }

    /// Looks `user` up in `c`, answering `allowed` on a miss (counted by `f`).
    async fn decide(
        c: &TtlCache<CacheKey, Decision>,
        user: &UserInfo,
        f: &Counted,
        allowed: bool,
    ) -> bool {
        let d = Decision {
            allowed,
            reason: String::new(),
        };
        let Ok(d) = c
            .get_or_fetch((user.clone(), res("get", "ns", "s")), || f.fetch(d.clone()))
            .await;
        d.allowed
    }

    #[tokio::test]
    async fn users_differing_only_in_extra_or_uid_do_not_share_decisions() {
        let c = decision_cache(Duration::from_secs(60), Duration::from_secs(60), 100);
        let bound_to = |pod: &str| {
            let mut u = user();
            u.extra.insert(
                "authentication.kubernetes.io/pod-name".into(),
                vec![pod.into()],
            );
            u
        };
        let other_uid = UserInfo {
            uid: "another".into(),
            ..user()
        };
        let f = Counted::new();
        assert!(decide(&c, &bound_to("p1"), &f, true).await);
        // Same name, uid and groups: a separate review, and its own (deny) answer.
        assert!(!decide(&c, &bound_to("p2"), &f, false).await);
        assert!(!decide(&c, &other_uid, &f, false).await);
        assert!(!decide(&c, &user(), &f, false).await);
        assert_eq!(f.calls(), 4);
        // Each is cached under its own key.
        assert!(decide(&c, &bound_to("p1"), &f, false).await);
        assert!(!decide(&c, &bound_to("p2"), &f, true).await);
        assert_eq!(f.calls(), 4);
    }

    #[tokio::test]
    async fn allow_and_deny_answers_have_their_own_ttls() {
        // Denials not cached, allowances are.
        let c = decision_cache(Duration::from_secs(60), Duration::ZERO, 100);
        let viewer = user();
        let admin = UserInfo {
            username: "admin".into(),
            ..user()
        };
        let (allow, deny) = (Counted::new(), Counted::new());
        for _ in 0..3 {
            assert!(decide(&c, &admin, &allow, true).await);
            assert!(!decide(&c, &viewer, &deny, false).await);
        }
        assert_eq!(allow.calls(), 1);
        assert_eq!(deny.calls(), 3);
    }

    #[test]
    fn forbidden_messages_match_the_api_server() {
        let cases = [
            (res("list", "default", ""), "", "secrets is forbidden: User \"viewer\" cannot list resource \"secrets\" in API group \"\" in the namespace \"default\""),
            (res("get", "default", "s1"), "", "secrets \"s1\" is forbidden: User \"viewer\" cannot get resource \"secrets\" in API group \"\" in the namespace \"default\""),
            (res("watch", "", ""), "", "secrets is forbidden: User \"viewer\" cannot watch resource \"secrets\" in API group \"\" at the cluster scope"),
            (res("get", "n", "s"), "no relationship found", "secrets \"s\" is forbidden: User \"viewer\" cannot get resource \"secrets\" in API group \"\" in the namespace \"n\": no relationship found"),
            (Attributes::NonResource { verb: "get".into(), path: "/metrics".into() }, "", "forbidden: User \"viewer\" cannot get path \"/metrics\""),
            // A group qualifies the subject, not the resource named after "cannot".
            (Attributes::Resource { verb: "list".into(), group: "discovery.k8s.io".into(), version: "v1".into(), resource: "endpointslices".into(), subresource: String::new(), namespace: "n".into(), name: "e<1>".into(), field_selector: String::new(), label_selector: String::new() }, "a<b", "endpointslices.discovery.k8s.io \"e<1>\" is forbidden: User \"viewer\" cannot list resource \"endpointslices\" in API group \"discovery.k8s.io\" in the namespace \"n\": a<b"),
        ];
        for (attrs, reason, want) in cases {
            let e = forbidden(&user(), &attrs, reason);
            assert_eq!(e.code, 403);
            assert_eq!(e.message, want);
        }
        // Names as Go's %q prints them; the HTML sanitizer on the user's part only.
        let odd = UserInfo {
            username: "a&b<\n".into(),
            ..user()
        };
        assert_eq!(
            forbidden(&odd, &res("get", "n", "s\u{0}"), "").message,
            "secrets \"s\\x00\" is forbidden: User \"a&amp;b&lt;\\n\" cannot get resource \"secrets\" in API group \"\" in the namespace \"n\""
        );
    }
}
