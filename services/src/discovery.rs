//! Which configured resources the cache serves, with their scope and kind as the
//! upstream's discovery documents state them (`/api/v1`, `/apis/{group}/{version}`).
//!
//! Scope decides which request paths exist (a cluster-scoped resource has no
//! `/namespaces/{ns}/` form) and how requests are authorized, so it is never taken from
//! configuration alone: a config that called Namespaces namespaced would let
//! `/api/v1/namespaces/foo/namespaces/bar` be authorized in `foo` and answered with `bar`.

use std::collections::HashMap;
use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::APIResourceList;
use kcache_actors::core::key::ResourceType;
use thiserror::Error;

#[derive(Debug, Error)]
pub enum Error {
    #[error("reading discovery for {group_version}: {source}")]
    DiscoveryFailed {
        group_version: String,
        #[source]
        source: kube::Error,
    },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The cached resources by `(group, version, resource)`.
pub type Resources = HashMap<(String, String, String), Arc<ResourceType>>;

/// The `Warning` headers the API server sends with every read of a resource (a deprecated
/// resource's, e.g. v1 Endpoints since 1.33), by `(group, version, resource)`: kcache sends
/// the same with its own answers.
pub type ReadWarnings = HashMap<(String, String, String), Vec<String>>;

/// The column definitions of each resource's Tables as the API server prints them, by
/// `(group, version, resource)`.
pub type TableColumns = HashMap<(String, String, String), serde_json::Value>;

/// What one small list of each resource (`limit=1`, asked for as a Table, kcache's own
/// identity) shows of how the API server answers reads of it: its read warnings, and its
/// Tables' column definitions. A resource whose list fails has neither recorded (logged):
/// its answers then lack what the API server would have warned, and its Tables are
/// forwarded (kcache cannot know its printer's columns are the upstream's).
pub async fn read_probe(
    client: &kube::Client,
    resources: &Resources,
) -> (ReadWarnings, TableColumns) {
    let mut warnings_of = ReadWarnings::new();
    let mut columns_of = TableColumns::new();
    for (id, r) in resources {
        let uri = format!("{}?limit=1", r.collection_path(None));
        let req = match http::Request::get(uri)
            .header(
                "Accept",
                "application/json;as=Table;v=v1;g=meta.k8s.io,application/json",
            )
            .body(kube::client::Body::empty())
        {
            Ok(req) => req,
            Err(e) => {
                tracing::warn!(error = %e, resource = %r.resource, "cannot build a read probe");
                continue;
            }
        };
        match client.send(req).await {
            Ok(resp) if resp.status().is_success() => {
                let warnings: Vec<String> = resp
                    .headers()
                    .get_all("warning")
                    .iter()
                    .filter_map(|v| v.to_str().ok().map(str::to_string))
                    .collect();
                if !warnings.is_empty() {
                    tracing::info!(resource = %r.resource, ?warnings, "the API server warns on reads of this resource; kcache's answers carry the same");
                    warnings_of.insert(id.clone(), warnings);
                }
                use http_body_util::BodyExt;
                let body = resp.into_body().collect().await.map(|b| b.to_bytes());
                let table: Option<serde_json::Value> =
                    body.ok().and_then(|b| serde_json::from_slice(&b).ok());
                match table {
                    Some(t) if t["kind"] == "Table" => {
                        let columns = t["columnDefinitions"].clone();
                        if crate::table::columns_for(&r.group, &r.resource, Some(&columns))
                            .is_none()
                        {
                            tracing::warn!(resource = %r.resource, "the API server prints this resource's Tables with other columns than kcache's printer; its Table reads are forwarded");
                        }
                        columns_of.insert(id.clone(), columns);
                    }
                    _ => {
                        tracing::warn!(resource = %r.resource, "the API server did not answer a Table; the resource's Table reads are forwarded")
                    }
                }
            }
            Ok(resp) => {
                tracing::warn!(resource = %r.resource, status = %resp.status(), "cannot probe reads of the resource")
            }
            Err(e) => {
                tracing::warn!(resource = %r.resource, error = %e, "cannot probe reads of the resource")
            }
        }
    }
    (warnings_of, columns_of)
}

/// Looks every wanted resource up in its group-version's discovery document. A resource
/// the upstream does not serve is left out (its requests are proxied) and logged; a
/// configured kind or scope that disagrees with discovery is overridden and logged.
pub async fn resolve(client: &kube::Client, wanted: &[ResourceType]) -> Result<Resources> {
    let mut lists: HashMap<String, APIResourceList> = HashMap::new();
    let mut out = Resources::new();
    for w in wanted {
        let gv = w.api_version();
        if !lists.contains_key(&gv) {
            let list = if w.group.is_empty() {
                client.list_core_api_resources(&w.version).await
            } else {
                client.list_api_group_resources(&gv).await
            };
            let list = match list {
                Ok(list) => list,
                // The group-version does not exist upstream: nothing of it is cached.
                Err(kube::Error::Api(s)) if s.code == 404 => APIResourceList {
                    group_version: gv.clone(),
                    resources: Vec::new(),
                },
                Err(source) => {
                    return Err(Error::DiscoveryFailed {
                        group_version: gv,
                        source,
                    })
                }
            };
            lists.insert(gv.clone(), list);
        }
        match lists.get(&gv).and_then(|l| pick(l, w)) {
            Some(found) => {
                out.insert(
                    (
                        found.group.clone(),
                        found.version.clone(),
                        found.resource.clone(),
                    ),
                    Arc::new(found),
                );
            }
            None => tracing::error!(
                resource = %format!("{gv}/{}", w.resource),
                "configured resource is not served by the API server (or cannot be listed and watched); its requests are proxied"
            ),
        }
    }
    Ok(out)
}

/// `wanted` as `list` describes it, if the list has it with the verbs the cache needs.
fn pick(list: &APIResourceList, wanted: &ResourceType) -> Option<ResourceType> {
    let r = list.resources.iter().find(|r| r.name == wanted.resource)?;
    if !["list", "watch"]
        .iter()
        .all(|v| r.verbs.iter().any(|have| have == v))
    {
        return None;
    }
    let found = ResourceType::new(
        &wanted.group,
        &wanted.version,
        &wanted.resource,
        &r.kind,
        r.namespaced,
    );
    if (!wanted.kind.is_empty() && wanted.kind != found.kind)
        || wanted.namespaced != found.namespaced
    {
        tracing::warn!(
            resource = %wanted.resource,
            configured_kind = %wanted.kind,
            configured_namespaced = wanted.namespaced,
            kind = %found.kind,
            namespaced = found.namespaced,
            "configured kind/scope differ from the API server's discovery; using discovery"
        );
    }
    Some(found)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::APIResource;

    fn res(name: &str, kind: &str, namespaced: bool, verbs: &[&str]) -> APIResource {
        APIResource {
            name: name.into(),
            kind: kind.into(),
            namespaced,
            verbs: verbs.iter().map(|v| v.to_string()).collect(),
            ..Default::default()
        }
    }

    #[test]
    fn scope_and_kind_come_from_discovery() {
        let list = APIResourceList {
            group_version: "v1".into(),
            resources: vec![
                res("namespaces", "Namespace", false, &["get", "list", "watch"]),
                res("secrets", "Secret", true, &["get", "list", "watch"]),
                res("bindings", "Binding", true, &["create"]),
            ],
        };
        // Configured as namespaced with no kind: discovery says cluster-scoped Namespace.
        let wanted = ResourceType::new("", "v1", "namespaces", "", true);
        let got = pick(&list, &wanted).expect("served");
        assert!(!got.namespaced);
        assert_eq!(got.kind, "Namespace");
        assert!(pick(
            &list,
            &ResourceType::new("", "v1", "secrets", "Secret", true)
        )
        .is_some_and(|r| r.namespaced));
        // Not listable and watchable, or absent: not cached.
        assert!(pick(&list, &ResourceType::new("", "v1", "bindings", "", true)).is_none());
        assert!(pick(&list, &ResourceType::new("", "v1", "widgets", "", true)).is_none());
    }
}
