//! Plain HTTP against either server, for differential tests: the same path with the same
//! token to the API server and to kcache, answers and watch events in a form that compares.

use std::time::Duration;

use serde_json::{json, Value};

use super::ADMIN_TOKEN;

/// A watch's events, parsed, as they arrive ([`super::event_channel`]).
pub type Events = tokio::sync::mpsc::UnboundedReceiver<Value>;

/// One server's base URL and a client that trusts its test certificate.
pub struct Http {
    base: String,
    client: reqwest::Client,
}

/// A GET's answer ([`Http::reply`]).
#[derive(Debug)]
pub struct Reply {
    pub code: u16,
    pub retry_after: Option<String>,
    /// `Null` when it is not JSON.
    pub body: Value,
    pub took: Duration,
}

impl Http {
    pub fn new(base: &str) -> Self {
        Http {
            base: base.to_string(),
            client: super::insecure_http(),
        }
    }

    /// A GET's status and body (`Null` when it is not JSON), with `token` if given.
    pub async fn get(&self, path: &str, token: Option<&str>) -> (u16, Value) {
        let r = self.reply(path, token).await;
        (r.code, r.body)
    }

    /// A GET's whole answer as a refusal is judged: status, `Retry-After`, body, and how
    /// long it took.
    pub async fn reply(&self, path: &str, token: Option<&str>) -> Reply {
        let started = std::time::Instant::now();
        let mut req = self.client.get(format!("{}{}", self.base, path));
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        let resp = req.send().await.expect("request");
        let code = resp.status().as_u16();
        let retry_after = resp
            .headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let body = resp.bytes().await.expect("body");
        Reply {
            code,
            retry_after,
            body: serde_json::from_slice(&body).unwrap_or(Value::Null),
            took: started.elapsed(),
        }
    }

    /// A GET as the cluster admin.
    pub async fn get_admin(&self, path: &str) -> (u16, Value) {
        self.get(path, Some(ADMIN_TOKEN)).await
    }

    /// Opens a watch as the cluster admin: its status and its events.
    pub async fn watch(&self, path: &str) -> (u16, Events) {
        let resp = self
            .client
            .get(format!("{}{}", self.base, path))
            .bearer_auth(ADMIN_TOKEN)
            .send()
            .await
            .expect("watch request");
        (resp.status().as_u16(), super::event_channel(resp))
    }

    /// Opens a watch that must answer 200.
    pub async fn watch_ok(&self, path: &str) -> Events {
        let (code, rx) = self.watch(path).await;
        assert_eq!(code, 200, "{path}");
        rx
    }
}

/// An object as `ns/name@rv`.
pub fn object_ref(obj: &Value) -> String {
    let m = &obj["metadata"];
    format!(
        "{}/{}@{}",
        m["namespace"].as_str().unwrap_or(""),
        m["name"].as_str().unwrap_or(""),
        m["resourceVersion"].as_str().unwrap_or("")
    )
}

/// An object event as `TYPE ns/name@rv`; `None` for a bookmark.
pub fn event_line(ev: &Value) -> Option<String> {
    if ev["type"] == "BOOKMARK" {
        return None;
    }
    Some(format!(
        "{} {}",
        ev["type"].as_str().unwrap_or(""),
        object_ref(&ev["object"])
    ))
}

/// The next `n` object events of a watch ([`event_line`]), bookmarks skipped; panics if
/// they do not come within 20 s each or the stream ends first.
pub async fn next_events(rx: &mut Events, n: usize) -> Vec<String> {
    let mut out = Vec::new();
    while out.len() < n {
        let ev = tokio::time::timeout(Duration::from_secs(20), rx.recv())
            .await
            .unwrap_or_else(|_| panic!("{n} events within 20 s; got {out:?}"))
            .unwrap_or_else(|| panic!("stream ended after {out:?}"));
        out.extend(event_line(&ev));
    }
    out
}

/// A watch's object events ([`event_line`]) until it has been quiet for `quiet`.
pub async fn events_until_quiet(rx: &mut Events, quiet: Duration) -> Vec<String> {
    let mut out = Vec::new();
    while let Ok(Some(ev)) = tokio::time::timeout(quiet, rx.recv()).await {
        out.extend(event_line(&ev));
    }
    out
}

/// Creates or updates Secret `ns/name` with data `v: value` (server-side apply); its RV.
pub async fn put_secret(client: &kube::Client, ns: &str, name: &str, value: &str) -> String {
    use k8s_openapi::api::core::v1::Secret;
    let api: kube::Api<Secret> = kube::Api::namespaced(client.clone(), ns);
    let obj: Secret = serde_json::from_value(json!({
        "metadata": {"name": name},
        "stringData": {"v": value},
    }))
    .expect("secret");
    let pp = kube::api::PatchParams::apply("test").force();
    let out = api
        .patch(name, &pp, &kube::api::Patch::Apply(&obj))
        .await
        .expect("apply secret");
    out.metadata.resource_version.expect("rv")
}

/// Deletes Secret `ns/name`.
pub async fn delete_secret(client: &kube::Client, ns: &str, name: &str) {
    use k8s_openapi::api::core::v1::Secret;
    let api: kube::Api<Secret> = kube::Api::namespaced(client.clone(), ns);
    api.delete(name, &Default::default())
        .await
        .expect("delete secret");
}

/// Creates or updates ConfigMap `ns/name` with `data.v = value` and the label `round=any`.
pub async fn put_configmap(client: &kube::Client, ns: &str, name: &str, value: &str) -> String {
    use k8s_openapi::api::core::v1::ConfigMap;
    let api: kube::Api<ConfigMap> = kube::Api::namespaced(client.clone(), ns);
    let obj: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"round": "any"}},
        "data": {"v": value},
    }))
    .expect("configmap");
    let pp = kube::api::PatchParams::apply("test").force();
    let out = api
        .patch(name, &pp, &kube::api::Patch::Apply(&obj))
        .await
        .expect("apply configmap");
    out.metadata.resource_version.expect("rv")
}

/// Deletes ConfigMap `ns/name`.
pub async fn delete_configmap(client: &kube::Client, ns: &str, name: &str) {
    use k8s_openapi::api::core::v1::ConfigMap;
    let api: kube::Api<ConfigMap> = kube::Api::namespaced(client.clone(), ns);
    api.delete(name, &Default::default())
        .await
        .expect("delete configmap");
}

/// Server-side apply of `body` at `path` on `base` as the cluster admin (field manager
/// `test`, conflicts forced): the answer's status, `None` when the request did not get an
/// answer (e.g. during an API server restart).
pub async fn apply(base: &str, path: &str, body: &Value) -> Option<u16> {
    let resp = super::insecure_http()
        .patch(format!("{base}{path}?fieldManager=test&force=true"))
        .bearer_auth(ADMIN_TOKEN)
        .header("Content-Type", "application/apply-patch+yaml")
        .body(body.to_string())
        .send()
        .await
        .ok()?;
    let code = resp.status().as_u16();
    let _ = resp.bytes().await;
    Some(code)
}
