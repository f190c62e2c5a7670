//! Differential check: seeded, generated GET requests (encoded and odd path segments,
//! scopes, names, selectors, resourceVersions, watch flags, repeated parameters) are sent
//! byte for byte to the API server and to kcache as five identities. For each request
//! kcache must answer with the API server's status class, the same in-stream errors, and
//! never show an object the API server did not show for that request. Nothing writes
//! while they are compared, so both serve the same seeded store. A difference is
//! allowed only for the documented reasons ([`Allowed`]); objects kcache leaves
//! out are reported but do not fail the check (see [`Difference::omitted`]).
//!
//! Knobs (all optional): `KCACHE_DIFF_SEED` replays a run (the seed is printed at the start
//! and in every failure), `KCACHE_DIFF_ONLY=<index>` replays one request,
//! `KCACHE_DIFF_REQUESTS` is how many requests each identity sends (default 2,000),
//! `KCACHE_DIFF_SECS` bounds the comparison's wall time (default 480),
//! `KCACHE_DIFF_REPORT` is how many differences are listed in full (default 20).
//!
//! Requests go through a kube-rs client without credentials of its own (the bearer token
//! is set per request) rather than reqwest, because reqwest's URL parser normalises
//! paths (`%2E%2E` and `..` segments are resolved) and the point is to send odd paths as
//! written. Only JSON is asked for: protobuf answers are judged by `protobuf.rs` (decoded,
//! against the API server's own), and kcache forwards YAML and every other Accept it does
//! not serve, so those headers would compare the API server with itself.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::io::Write;
use std::time::{Duration, Instant};

use futures::StreamExt;
use http_body_util::BodyExt;
use serde_json::{json, Value};
use support::kcache::Kcache;
use support::rng::Rng;
use support::{eventually, insecure_http, TestCluster, ADMIN_TOKEN};

/// Requests per identity unless `KCACHE_DIFF_REQUESTS` says otherwise.
const DEFAULT_REQUESTS: u64 = 2_000;
/// Wall-time budget of the comparison unless `KCACHE_DIFF_SECS` says otherwise; cases not
/// started by then are skipped (and counted in the summary).
const DEFAULT_BUDGET_SECS: u64 = 480;
/// Cases in flight at once (each sends one request to either server, concurrently).
const PARALLELISM: usize = 8;
/// One exchange, head and body. Generated watches end by `timeoutSeconds=1`; a list with
/// a too-large resourceVersion waits 3 s on the API server before its 504.
const EXCHANGE_TIMEOUT: Duration = Duration::from_secs(10);
/// Bodies are read up to this size; the seeded store's largest list is a few KiB.
const MAX_BODY: usize = 4 << 20;
/// Findings listed in full in the failure message, unless `KCACHE_DIFF_REPORT` says
/// otherwise.
const REPORTED: usize = 20;

struct Identity {
    name: &'static str,
    token: Option<&'static str>,
}

/// Who sends each request. `reader` may read ConfigMaps in namespace `a` and everything
/// but Secrets in `b` (the rules of `system:aggregate-to-view`: `view` itself is empty
/// without a controller-manager to aggregate it); `node1` may read what its pod uses
/// (Node authorizer); `unbound` has no bindings; `anonymous` sends no credentials (the
/// test API server and kcache both run with anonymous authentication on, their default).
const IDENTITIES: [Identity; 5] = [
    Identity {
        name: "admin",
        token: Some(ADMIN_TOKEN),
    },
    Identity {
        name: "reader",
        token: Some("viewertoken"),
    },
    Identity {
        name: "node1",
        token: Some("node1token"),
    },
    Identity {
        name: "unbound",
        token: Some("nobodytoken"),
    },
    Identity {
        name: "anonymous",
        token: None,
    },
];

// ---------------------------------------------------------------------------------------
// Seeded generation
// ---------------------------------------------------------------------------------------

/// One generated request: a raw path and query as sent on the wire, and an Accept header.
#[derive(Clone)]
struct Request {
    target: String,
    /// What kcache is sent instead, when the request continues a page chain: the same
    /// continue token in kcache's own format (`kcache.io/v1`) where the API server gets
    /// its own (`meta.k8s.io/v1`), fields alike, so both read the same token.
    kcache_target: Option<String>,
    accept: Option<&'static str>,
}

impl Request {
    /// What kcache is sent.
    fn to_kcache(&self) -> Request {
        Request {
            target: self.kcache_target.as_ref().unwrap_or(&self.target).clone(),
            kcache_target: None,
            accept: self.accept,
        }
    }
}

impl fmt::Display for Request {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "GET {}", self.target)?;
        if let Some(kcache) = &self.kcache_target {
            write!(f, " (to kcache: {kcache})")?;
        }
        if let Some(accept) = self.accept {
            write!(f, " [Accept: {accept}]")?;
        }
        Ok(())
    }
}

/// The resources kcache caches by default, then ones it proxies (one uncached, one that
/// does not exist, two misspellings).
const CACHED: [&str; 6] = [
    "secrets",
    "configmaps",
    "pods",
    "services",
    "endpoints",
    "namespaces",
];
const UNCACHED: [&str; 4] = ["serviceaccounts", "frobs", "Secrets", "secret"];
const NAMESPACES: [&str; 5] = ["a", "b", "default", "kube-system", "missing"];
const NAMES: [&str; 11] = [
    "s1",
    "s2",
    "s3",
    "shared",
    "cm-a",
    "cm-b",
    "p1",
    "web",
    "kubernetes",
    "a",
    "missing",
];
const SUBRESOURCES: [&str; 3] = ["status", "x", ""];
/// Path segments as written on the wire: encoded separators and query characters, dot
/// segments (encoded and not), escapes of ordinary and invalid bytes, unicode, names that
/// are not DNS names, empty segments.
const ODD_SEGMENTS: [&str; 33] = [
    "a%2Fb",
    "a%2fsecrets",
    "s1%2F",
    "%2E%2E",
    "%2e",
    "..",
    ".",
    "",
    "s1%3Fwatch%3Dtrue",
    "s1%23x",
    "s1%25",
    "%25",
    "%zz",
    "%",
    "s%31",
    "caf%C3%A9",
    "%C3%A9",
    "%FF",
    "S1",
    "A",
    "s1%20",
    "%20",
    "s1.",
    "-s1",
    "s1%00",
    "s1;x",
    "s1%3B",
    "s1+x",
    "~",
    "s1@x",
    "a,b",
    "*",
    "s1:x",
];
/// Lengths around the limits of names (63 for labels, 253 for subdomains) and beyond.
const LONG: [usize; 6] = [63, 64, 253, 254, 300, 5000];

const WATCH_VALUES: [&str; 8] = ["true", "1", "false", "0", "t", "TRUE", "yes", ""];
const RV_GARBAGE: [&str; 7] = [
    "abc",
    "-1",
    " 0",
    "0x10",
    "01",
    "1.5",
    "18446744073709551616",
];
/// Far ahead of any store: lists wait for it (the API server's 3 s freshness wait).
const HUGE_RV: &str = "999999999999";
const RV_MATCHES: [&str; 4] = ["NotOlderThan", "Exact", "notolderthan", ""];
const LIMITS: [&str; 6] = ["0", "1", "2", "500", "-1", "x"];
const CONTINUES: [&str; 2] = ["abc", ""];
const LABEL_SELECTORS: [&str; 16] = [
    "app=web",
    "app==web",
    "app!=web",
    "app in (web,db)",
    "app notin (web)",
    "!app",
    "app",
    "tier=backend,app=db",
    "app=",
    "==",
    "a in (",
    "app=web=x",
    "App=web",
    "app=%",
    ",",
    "app in ()",
];
const FIELD_SELECTORS: [&str; 19] = [
    "metadata.name=s1",
    "metadata.name==s1",
    "metadata.name!=s1",
    "metadata.name=cm-a",
    "metadata.name=p1",
    "metadata.name=web",
    "metadata.name=",
    "metadata.namespace=a",
    "metadata.namespace!=a",
    "metadata.namespace=b",
    "spec.nodeName=node1",
    "status.phase=Pending",
    "type=Opaque",
    "metadata.name=s1,metadata.namespace=a",
    "metadata.name=s1,metadata.name=s2",
    "bogus",
    "metadata.name",
    "metadata.uid=x",
    "metadata.name=a/b",
];
const INCLUDE_OBJECTS: [&str; 4] = ["None", "Metadata", "Object", "bogus"];
const BOOLS: [&str; 3] = ["true", "false", "x"];
const TIMEOUTS: [&str; 3] = ["x", "-1", "5"];
const ACCEPTS: [&str; 6] = [
    "application/json",
    "application/json;as=Table;v=v1;g=meta.k8s.io,application/json",
    "application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json",
    "application/json;as=Table;v=v1;g=meta.k8s.io",
    "application/json;as=PartialObjectMetadataList;v=v1;g=meta.k8s.io,application/json",
    "*/*",
];

/// The generator's view of the store: the resourceVersion each cached resource's list
/// had after seeding (its watch cache's RV on the API server), so `resourceVersion=<it>`
/// is a current, servable version for that resource.
struct Store {
    list_rvs: BTreeMap<&'static str, String>,
}

impl Store {
    fn current_rv(&self, resource: &str) -> String {
        self.list_rvs
            .get(resource)
            .or_else(|| self.list_rvs.get("secrets"))
            .cloned()
            .unwrap_or_else(|| "0".into())
    }
}

fn generate(seed: u64, index: u64, store: &Store) -> Request {
    let mut rng = Rng::for_case(seed, index);
    let resource = if rng.chance(85) {
        rng.pick(&CACHED)
    } else {
        rng.pick(&UNCACHED)
    };
    let path = path(&mut rng, resource);
    // The query twice from the same draws: continue tokens in each server's format.
    let mut same = rng.clone();
    let query_to =
        |rng: &mut Rng, format| query(rng, path.resource, store, path.deprecated_watch, format);
    let query = query_to(&mut rng, API_TOKENS);
    let kcache_query = query_to(&mut same, KCACHE_TOKENS);
    let accept = if rng.chance(20) {
        Some(rng.pick(&ACCEPTS))
    } else {
        None
    };
    let with = |q: Option<String>| match q {
        Some(q) => format!("{}?{q}", path.text),
        None => path.text.clone(),
    };
    let (target, kcache_target) = (with(query), with(kcache_query));
    Request {
        kcache_target: (kcache_target != target).then_some(kcache_target),
        target,
        accept,
    }
}

/// A namespace or name segment: mostly one that exists or plausibly could, else odd.
fn segment(rng: &mut Rng, plausible: &[&str]) -> String {
    if rng.chance(75) {
        return rng.pick(plausible).to_string();
    }
    if rng.chance(10) {
        return "x".repeat(LONG[rng.below(LONG.len())]);
    }
    rng.pick(&ODD_SEGMENTS).to_string()
}

/// An optional `/name` or `/name/subresource`.
fn tail(rng: &mut Rng) -> String {
    if !rng.chance(45) {
        return String::new();
    }
    let name = segment(rng, &NAMES);
    if rng.chance(8) {
        format!("/{name}/{}", rng.pick(&SUBRESOURCES))
    } else {
        format!("/{name}")
    }
}

/// A generated path.
struct Path {
    text: String,
    /// The resource the path names (for a current resourceVersion of the right store).
    resource: &'static str,
    /// A deprecated `/api/v1/watch/...` path: a watch without `watch=`.
    deprecated_watch: bool,
}

fn path(rng: &mut Rng, resource: &'static str) -> Path {
    let mut named = resource;
    let mut text = match rng.below(100) {
        0..=44 => {
            let ns = segment(rng, &NAMESPACES);
            format!("/api/v1/namespaces/{ns}/{resource}{}", tail(rng))
        }
        45..=74 => format!("/api/v1/{resource}{}", tail(rng)),
        75..=82 => {
            named = "namespaces";
            let ns = segment(rng, &NAMESPACES);
            let sub = if rng.chance(20) {
                format!("/{}", rng.pick(&SUBRESOURCES))
            } else {
                String::new()
            };
            format!("/api/v1/namespaces/{ns}{sub}")
        }
        // A cluster-scoped resource through a namespaced path: the API server has no such
        // route.
        83..=87 => {
            named = "namespaces";
            let ns = segment(rng, &NAMESPACES);
            format!("/api/v1/namespaces/{ns}/namespaces{}", tail(rng))
        }
        88..=91 => {
            let name = tail(rng);
            let text = if rng.chance(50) {
                let ns = segment(rng, &NAMESPACES);
                format!("/api/v1/watch/namespaces/{ns}/{resource}{name}")
            } else {
                format!("/api/v1/watch/{resource}{name}")
            };
            return Path {
                text,
                resource,
                deprecated_watch: true,
            };
        }
        _ => odd_path(rng, resource),
    };
    if rng.chance(3) {
        text.push('/');
    }
    Path {
        text,
        resource: named,
        deprecated_watch: false,
    }
}

/// Paths with empty or dot segments, too many segments, encoded separators, the wrong
/// group prefix, or no resource at all.
fn odd_path(rng: &mut Rng, resource: &str) -> String {
    let ns = segment(rng, &NAMESPACES);
    let name = segment(rng, &NAMES);
    match rng.below(8) {
        0 => format!("/api/v1//{resource}"),
        1 => format!("/api/v1/namespaces/{ns}//{resource}/{name}"),
        2 => format!("/api/v1/namespaces/{ns}/../{resource}"),
        3 => format!("/api/v1/namespaces/{ns}/{resource}/./{name}"),
        4 => format!("/api/v1/namespaces/{ns}/{resource}/{name}/status/x"),
        5 => format!("/api/v1/namespaces/{ns}/{resource}%2F{name}"),
        6 => format!("/apis/core/v1/{resource}"),
        _ => rng
            .pick(&["/api/v1", "/api/v1/", "/api", "//api/v1/secrets"])
            .into(),
    }
}

/// The `v` of the continue tokens a server reads as its own.
const API_TOKENS: &str = "meta.k8s.io/v1";
const KCACHE_TOKENS: &str = "kcache.io/v1";

/// A continue token in `format` (a server's version field): the resource's current
/// resourceVersion or an old, zero or "latest" one, from a plausible or an invalid key.
fn continue_token(rng: &mut Rng, resource: &str, store: &Store, format: &str) -> String {
    use base64::Engine;
    let rv: i64 = match rng.below(4) {
        0 => store.current_rv(resource).parse().unwrap_or(1),
        1 => 1,
        2 => 0,
        _ => -1,
    };
    let start = rng.pick(&["cm1\\u0000", "s1\\u0000", "/", "", "../x", "a/"]);
    let json = format!(r#"{{"v":"{format}","rv":{rv},"start":"{start}"}}"#);
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(json)
}

/// A value for query parameter `key` from its pool; continue tokens in `format`.
fn value_for(rng: &mut Rng, key: &str, resource: &str, store: &Store, format: &str) -> String {
    let v = match key {
        "watch" => rng.pick(&WATCH_VALUES),
        "resourceVersion" => {
            return match rng.below(100) {
                0..=49 => "0".into(),
                50..=74 => store.current_rv(resource),
                75..=79 => "1".into(),
                80..=82 => HUGE_RV.into(),
                83..=89 => String::new(),
                _ => rng.pick(&RV_GARBAGE).into(),
            }
        }
        "resourceVersionMatch" => rng.pick(&RV_MATCHES),
        "limit" => rng.pick(&LIMITS),
        "continue" if rng.chance(70) => return continue_token(rng, resource, store, format),
        "continue" => rng.pick(&CONTINUES),
        "labelSelector" => rng.pick(&LABEL_SELECTORS),
        "fieldSelector" => rng.pick(&FIELD_SELECTORS),
        "includeObject" => rng.pick(&INCLUDE_OBJECTS),
        "timeoutSeconds" => rng.pick(&TIMEOUTS),
        "allowWatchBookmarks" | "sendInitialEvents" | "pretty" => rng.pick(&BOOLS),
        _ => "1",
    };
    v.to_string()
}

/// `key=value`, encoded as clients variously do: form encoding (`+` for space), strict
/// percent-encoding, or left raw when that is still a valid URI; rarely with the key's
/// first character percent-encoded too.
fn encode_pair(rng: &mut Rng, key: &str, value: &str) -> String {
    let key = if rng.chance(3) {
        let (first, rest) = key.split_at(1);
        format!("%{:02X}{rest}", first.as_bytes()[0])
    } else {
        key.to_string()
    };
    let raw_ok = value
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"=,.!-".contains(&b));
    let value = match rng.below(10) {
        0..=5 => url::form_urlencoded::byte_serialize(value.as_bytes()).collect(),
        6..=7 if raw_ok => value.to_string(),
        _ => percent_encoding::utf8_percent_encode(value, percent_encoding::NON_ALPHANUMERIC)
            .to_string(),
    };
    format!("{key}={value}")
}

/// The query string (`None`: no `?` at all).
fn query(
    rng: &mut Rng,
    resource: &str,
    store: &Store,
    deprecated_watch: bool,
    format: &str,
) -> Option<String> {
    let watch = deprecated_watch || rng.chance(12);
    let mut keys: Vec<&str> = Vec::new();
    if watch && !deprecated_watch {
        keys.push("watch");
    }
    let optional: [(&str, usize); 11] = [
        ("resourceVersion", 85),
        ("resourceVersionMatch", 10),
        ("limit", 10),
        ("continue", 6),
        ("labelSelector", 20),
        ("fieldSelector", 20),
        ("includeObject", 5),
        ("allowWatchBookmarks", if watch { 30 } else { 3 }),
        ("sendInitialEvents", 3),
        ("pretty", 3),
        ("x", 3),
    ];
    for (key, percent) in optional {
        if rng.chance(percent) {
            keys.push(key);
        }
    }
    if !watch && rng.chance(3) {
        keys.push("timeoutSeconds");
    }
    for i in (1..keys.len()).rev() {
        let j = rng.below(i + 1);
        keys.swap(i, j);
    }
    // A repeated parameter with another value: the first must win on both servers.
    if !keys.is_empty() && rng.chance(15) {
        let key = keys[rng.below(keys.len())];
        keys.push(key);
    }
    let mut pairs: Vec<(&str, String)> = keys
        .into_iter()
        .map(|k| (k, value_for(rng, k, resource, store, format)))
        .collect();
    // Watches end by themselves, ahead of any other timeoutSeconds (the first wins).
    if watch {
        pairs.insert(0, ("timeoutSeconds", "1".into()));
    }
    if pairs.is_empty() {
        return rng.chance(5).then(String::new);
    }
    let mut q = String::new();
    for (i, (key, value)) in pairs.iter().enumerate() {
        if i > 0 {
            // Rarely `;`, which Go's query parser (the API server's) does not split on
            // since Go 1.17: it drops the pair. Never right after timeoutSeconds=1, which
            // must survive for the watch to end.
            q.push(if i > 1 && rng.chance(2) { ';' } else { '&' });
        }
        q.push_str(&encode_pair(rng, key, value));
    }
    if rng.chance(2) {
        q.push_str(rng.pick(&["&", "&&", "&=x"]));
    }
    Some(q)
}

// ---------------------------------------------------------------------------------------
// Exchanges and what an answer shows
// ---------------------------------------------------------------------------------------

/// An object as a response shows it. Table rows without an object carry only a name.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct ObjRef {
    namespace: Option<String>,
    name: String,
    uid: Option<String>,
}

impl ObjRef {
    /// The same object, as far as both references know.
    fn matches(&self, other: &ObjRef) -> bool {
        fn agree(a: &Option<String>, b: &Option<String>) -> bool {
            a.is_none() || b.is_none() || a == b
        }
        self.name == other.name
            && agree(&self.namespace, &other.namespace)
            && agree(&self.uid, &other.uid)
    }
}

impl fmt::Display for ObjRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}/{}",
            self.namespace.as_deref().unwrap_or("?"),
            self.name
        )?;
        if let Some(uid) = &self.uid {
            write!(f, " (uid {uid})")?;
        }
        Ok(())
    }
}

/// What one server answered.
#[derive(Debug, Default)]
struct Answer {
    /// The HTTP status; 0 when no response head arrived (transport error, timeout, or a
    /// target the HTTP client cannot send).
    code: u16,
    /// The objects shown: list items, a got object, Table rows, watch event objects.
    objects: Vec<ObjRef>,
    /// The codes of in-stream ERROR events.
    stream_errors: BTreeSet<u16>,
    /// A Status's reason and message, or the transport error, for the report.
    note: String,
    /// From sending the request to the end of the body (or giving up on it).
    elapsed: Duration,
}

impl Answer {
    fn class(&self) -> u16 {
        self.code / 100
    }
}

impl fmt::Display for Answer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} after {:.1} s", self.code, self.elapsed.as_secs_f64())?;
        if !self.objects.is_empty() {
            write!(f, ", {} objects", self.objects.len())?;
        }
        if !self.stream_errors.is_empty() {
            write!(f, ", in-stream errors {:?}", self.stream_errors)?;
        }
        if !self.note.is_empty() {
            let note: String = self.note.chars().take(160).collect();
            write!(f, " ({note})")?;
        }
        Ok(())
    }
}

/// A kube-rs client for `url` with no credentials of its own and no retries: the bearer
/// token is set per request, and every answer is the server's first.
fn raw_client(url: &str) -> kube::Client {
    let mut cfg = kube::Config::new(url.parse().expect("server url is a URI"));
    cfg.accept_invalid_certs = true;
    cfg.default_retry = false;
    kube::Client::try_from(cfg).expect("build a raw kube client")
}

async fn exchange(client: &kube::Client, req: &Request, token: Option<&str>) -> Answer {
    let started = Instant::now();
    let answer = send(client, req, token).await;
    Answer {
        elapsed: started.elapsed(),
        ..answer
    }
}

async fn send(client: &kube::Client, req: &Request, token: Option<&str>) -> Answer {
    let mut builder = http::Request::get(req.target.as_str());
    if let Some(t) = token {
        builder = builder.header("authorization", format!("Bearer {t}"));
    }
    if let Some(accept) = req.accept {
        builder = builder.header("accept", accept);
    }
    let request = match builder.body(kube::client::Body::from(Vec::new())) {
        Ok(r) => r,
        Err(e) => {
            return Answer {
                note: format!("unsendable: {e}"),
                ..Answer::default()
            }
        }
    };
    let deadline = tokio::time::Instant::now() + EXCHANGE_TIMEOUT;
    let resp = match tokio::time::timeout_at(deadline, client.send(request)).await {
        Ok(Ok(resp)) => resp,
        Ok(Err(e)) => {
            return Answer {
                note: format!("transport: {e}"),
                ..Answer::default()
            }
        }
        Err(_) => {
            return Answer {
                note: "no response head in time".into(),
                ..Answer::default()
            }
        }
    };
    let code = resp.status().as_u16();
    let mut body = resp.into_body();
    let mut bytes = Vec::new();
    // A body cut short (timeout, reset) still shows what it showed so far.
    while bytes.len() < MAX_BODY {
        match tokio::time::timeout_at(deadline, body.frame()).await {
            Ok(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    bytes.extend_from_slice(data);
                }
            }
            Ok(Some(Err(_))) | Ok(None) | Err(_) => break,
        }
    }
    read_answer(code, &bytes)
}

/// Parses a body: one JSON document or a stream of watch events (concatenated JSON).
fn read_answer(code: u16, body: &[u8]) -> Answer {
    let mut answer = Answer {
        code,
        ..Answer::default()
    };
    for value in serde_json::Deserializer::from_slice(body).into_iter::<Value>() {
        let Ok(v) = value else { break };
        let is_event =
            v.get("kind").is_none() && v["type"].is_string() && v.get("object").is_some();
        if !is_event {
            if v["kind"] == "Status" {
                answer.note = format!(
                    "{}: {}",
                    v["reason"].as_str().unwrap_or(""),
                    v["message"].as_str().unwrap_or("")
                );
            }
            collect(&v, &mut answer.objects);
            continue;
        }
        match v["type"].as_str() {
            Some("ERROR") => {
                let code = v["object"]["code"].as_u64().unwrap_or(0);
                answer
                    .stream_errors
                    .insert(u16::try_from(code).unwrap_or(u16::MAX));
            }
            Some("BOOKMARK") => {}
            _ => collect(&v["object"], &mut answer.objects),
        }
    }
    answer
}

/// The objects `o` shows: itself, a list's items, or a Table's rows.
fn collect(o: &Value, out: &mut Vec<ObjRef>) {
    if o["kind"] == "Status" {
        return;
    }
    let text = |v: &Value| v.as_str().map(str::to_string);
    if let Some(rows) = o["rows"].as_array() {
        for row in rows {
            let meta = &row["object"]["metadata"];
            if let Some(name) = meta["name"].as_str() {
                out.push(ObjRef {
                    namespace: Some(text(&meta["namespace"]).unwrap_or_default()),
                    name: name.to_string(),
                    uid: text(&meta["uid"]),
                });
            } else if let Some(name) = row["cells"][0].as_str() {
                out.push(ObjRef {
                    namespace: None,
                    name: name.to_string(),
                    uid: None,
                });
            }
        }
        return;
    }
    if let Some(items) = o["items"].as_array() {
        for item in items {
            collect(item, out);
        }
        return;
    }
    let meta = &o["metadata"];
    if let Some(name) = meta["name"].as_str() {
        out.push(ObjRef {
            namespace: Some(text(&meta["namespace"]).unwrap_or_default()),
            name: name.to_string(),
            uid: text(&meta["uid"]),
        });
    }
}

// ---------------------------------------------------------------------------------------
// Comparison
// ---------------------------------------------------------------------------------------

/// How kcache's answer to one request differs from the API server's.
#[derive(Debug, Default)]
struct Difference {
    /// The status classes differ (2xx/4xx/5xx; 0 for no answer at all). Exact codes
    /// within a class may differ: e.g. both refuse a malformed request, one with 400,
    /// the other with 404, or a 503 where the other times out with 504.
    status: bool,
    /// Objects kcache showed that the API server did not show for the same request.
    extra: Vec<ObjRef>,
    /// Both streamed, but ended with different in-stream errors (e.g. a 410 on one side).
    stream_errors: bool,
    /// The answers differ in one of the documented ways.
    allowed: Option<Allowed>,
    /// Objects the API server showed and kcache did not. Not a failure: the issue's rule
    /// is one-way, and a short watch can end before a new cache key's first sync. Counted
    /// and reported so a stale read does not go unseen.
    omitted: usize,
}

impl Difference {
    fn fails(&self) -> bool {
        self.status || !self.extra.is_empty() || self.stream_errors
    }
}

/// Why a difference is allowed: each is a documented, deliberate departure (docs/security.md,
/// "Differences from the API server"), recognised narrowly by the exact answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Allowed {
    /// A read of a resourceVersion newer than any event of its resource: an API server's
    /// watch cache may wait for progress on that resource and answer 504 "Too large
    /// resource version"; kcache establishes progress with a consistent list, reaches the
    /// RV and answers what the API server would answer at it. (A malformed
    /// resourceVersion and streaming-list parameters are no longer allowed differences:
    /// kcache answers them as the reference version does.)
    FresherThanTheWatchCache,
}

fn allowed(api: &Answer, kcache: &Answer) -> Option<Allowed> {
    if api.code == 504
        && api.note.contains("Too large resource version")
        && (kcache.class() == 2 || kcache.code == 404)
    {
        return Some(Allowed::FresherThanTheWatchCache);
    }
    None
}

fn compare(api: &Answer, kcache: &Answer) -> Difference {
    let both_ok = api.class() == 2 && kcache.class() == 2;
    let allowed = allowed(api, kcache);
    Difference {
        status: api.class() != kcache.class() && allowed.is_none(),
        allowed,
        extra: kcache
            .objects
            .iter()
            .filter(|k| !api.objects.iter().any(|a| k.matches(a)))
            .cloned()
            .collect(),
        stream_errors: both_ok && api.stream_errors != kcache.stream_errors && allowed.is_none(),
        omitted: if both_ok {
            api.objects
                .iter()
                .filter(|a| !kcache.objects.iter().any(|k| k.matches(a)))
                .count()
        } else {
            0
        },
    }
}

/// One request sent as one identity, and the two answers.
struct Case {
    index: u64,
    identity: &'static str,
    request: Request,
    api: Answer,
    kcache: Answer,
    difference: Difference,
}

impl Case {
    /// The kind of failure, for grouping the report: exact codes for a status
    /// difference, else what differs.
    fn group(&self) -> String {
        let d = &self.difference;
        if d.status {
            format!(
                "status: API server {} / kcache {}",
                self.api.code, self.kcache.code
            )
        } else if !d.extra.is_empty() {
            format!(
                "objects the API server did not show (both {})",
                self.api.code
            )
        } else {
            format!(
                "in-stream errors: API server {:?} / kcache {:?}",
                self.api.stream_errors, self.kcache.stream_errors
            )
        }
    }

    fn describe(&self, seed: u64) -> String {
        let mut s = format!(
            "#{} as {}: {}\n    API server: {}\n    kcache:     {}",
            self.index, self.identity, self.request, self.api, self.kcache
        );
        if !self.difference.extra.is_empty() {
            let extra: Vec<String> = self
                .difference
                .extra
                .iter()
                .take(5)
                .map(ToString::to_string)
                .collect();
            s.push_str(&format!(
                "\n    kcache showed, the API server did not: {}",
                extra.join(", ")
            ));
        }
        s.push_str(&format!(
            "\n    replay: KCACHE_DIFF_SEED={seed} KCACHE_DIFF_ONLY={} cargo test -p kcache --test differential",
            self.index
        ));
        s
    }
}

// ---------------------------------------------------------------------------------------
// The seeded store
// ---------------------------------------------------------------------------------------

async fn status_of(cluster: &TestCluster, path: &str, token: &str) -> u16 {
    insecure_http()
        .get(format!("{}{}", cluster.url, path))
        .bearer_auth(token)
        .send()
        .await
        .map(|r| r.status().as_u16())
        .unwrap_or(0)
}

/// Namespaces `a` and `b` with labelled Secrets, ConfigMaps, a Service with Endpoints and
/// pods (p1 on node1, mounting Secret s1 and ConfigMap cm-a); a Secret and a ConfigMap
/// share the name `shared`. RBAC as [`IDENTITIES`] describes. Returns once both
/// authorizers apply it.
async fn seed_store(cluster: &TestCluster) {
    for ns in ["a", "b"] {
        support::create_as_admin(
            cluster,
            "/api/v1/namespaces",
            json!({"metadata": {"name": ns, "labels": {"app": "web"}}}),
        )
        .await;
        let base = format!("/api/v1/namespaces/{ns}");
        support::create_as_admin(
            cluster,
            &format!("{base}/serviceaccounts"),
            json!({"metadata": {"name": "default"}}),
        )
        .await;
        support::create_as_admin(
            cluster,
            &format!("{base}/services"),
            json!({
                "metadata": {"name": "web", "labels": {"app": "web"}},
                "spec": {"ports": [{"port": 80}]},
            }),
        )
        .await;
        support::create_as_admin(
            cluster,
            &format!("{base}/endpoints"),
            json!({
                "metadata": {"name": "web", "labels": {"app": "web"}},
                "subsets": [{"addresses": [{"ip": "10.1.2.3"}], "ports": [{"port": 80}]}],
            }),
        )
        .await;
    }
    let labelled =
        |name: &str, labels: Value| json!({"metadata": {"name": name, "labels": labels}});
    for (ns, name, labels) in [
        ("a", "s1", json!({"app": "web"})),
        ("a", "s2", json!({"app": "db", "tier": "backend"})),
        ("a", "shared", json!({})),
        ("b", "s3", json!({"app": "web"})),
    ] {
        support::create_as_admin(
            cluster,
            &format!("/api/v1/namespaces/{ns}/secrets"),
            labelled(name, labels),
        )
        .await;
    }
    for (ns, name, labels) in [
        ("a", "cm-a", json!({"app": "web"})),
        ("a", "shared", json!({"app": "db"})),
        ("b", "cm-b", json!({})),
    ] {
        support::create_as_admin(
            cluster,
            &format!("/api/v1/namespaces/{ns}/configmaps"),
            labelled(name, labels),
        )
        .await;
    }
    for (ns, name, node) in [("a", "p1", Some("node1")), ("b", "p2", None)] {
        support::create_as_admin(
            cluster,
            &format!("/api/v1/namespaces/{ns}/pods"),
            json!({
                "metadata": {"name": name, "labels": {"app": "web"}},
                "spec": {
                    "nodeName": node,
                    "automountServiceAccountToken": false,
                    "containers": [{"name": "c", "image": "busybox"}],
                    "volumes": [
                        {"name": "s", "secret": {"secretName": "s1"}},
                        {"name": "c", "configMap": {"name": "cm-a"}},
                    ],
                },
            }),
        )
        .await;
    }
    let rbac = "/apis/rbac.authorization.k8s.io/v1/namespaces";
    support::create_as_admin(cluster,
        &format!("{rbac}/a/roles"),
        json!({
            "metadata": {"name": "cm-reader"},
            "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list", "watch"]}],
        }),
    )
    .await;
    let viewer =
        json!([{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "viewer"}]);
    support::create_as_admin(cluster,
        &format!("{rbac}/a/rolebindings"),
        json!({
            "metadata": {"name": "cm-reader"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "cm-reader"},
            "subjects": viewer,
        }),
    )
    .await;
    support::create_as_admin(cluster,
        &format!("{rbac}/b/rolebindings"),
        json!({
            "metadata": {"name": "view"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "system:aggregate-to-view"},
            "subjects": viewer,
        }),
    )
    .await;
    for (path, token) in [
        ("/api/v1/namespaces/a/secrets/s1", "node1token"),
        ("/api/v1/namespaces/a/configmaps/cm-a", "node1token"),
        ("/api/v1/namespaces/a/configmaps", "viewertoken"),
        ("/api/v1/namespaces/b/services", "viewertoken"),
    ] {
        eventually(
            &format!("the API server lets {token} GET {path}"),
            Duration::from_secs(30),
            || async { status_of(cluster, path, token).await == 200 },
        )
        .await;
    }
}

/// Each cached resource's list resourceVersion from the API server's watch cache.
async fn list_rvs(cluster: &TestCluster) -> BTreeMap<&'static str, String> {
    let mut rvs = BTreeMap::new();
    for resource in CACHED {
        let list: Value = insecure_http()
            .get(format!(
                "{}/api/v1/{resource}?resourceVersion=0",
                cluster.url
            ))
            .bearer_auth(ADMIN_TOKEN)
            .send()
            .await
            .expect("list")
            .json()
            .await
            .expect("list json");
        let rv = list["metadata"]["resourceVersion"]
            .as_str()
            .unwrap_or_else(|| panic!("{resource} list without a resourceVersion: {list}"));
        rvs.insert(resource, rv.to_string());
    }
    rvs
}

// ---------------------------------------------------------------------------------------
// The check
// ---------------------------------------------------------------------------------------

fn env_u64(name: &str) -> Option<u64> {
    let v = std::env::var(name).ok()?;
    Some(
        v.trim()
            .parse()
            .unwrap_or_else(|_| panic!("{name}={v:?} is not a number")),
    )
}

/// Straight to stderr: libtest captures `eprintln!` of passing tests, and the seed and
/// summary should be in every CI log.
fn log(line: &str) {
    let _ = writeln!(std::io::stderr(), "{line}");
}

#[derive(Clone, Default)]
struct Tally {
    cases: usize,
    classes: BTreeMap<u16, usize>,
    with_objects: usize,
    failures: usize,
    omitted: usize,
    allowed: usize,
    unsendable: usize,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kcache_answers_generated_requests_as_the_api_server_does() {
    let seed = env_u64("KCACHE_DIFF_SEED").unwrap_or_else(rand::random);
    let only = env_u64("KCACHE_DIFF_ONLY");
    let count = env_u64("KCACHE_DIFF_REQUESTS").unwrap_or(DEFAULT_REQUESTS);
    let budget = Duration::from_secs(env_u64("KCACHE_DIFF_SECS").unwrap_or(DEFAULT_BUDGET_SECS));
    let reported = env_u64("KCACHE_DIFF_REPORT").map_or(REPORTED, |n| n as usize);
    log(&format!(
        "differential: KCACHE_DIFF_SEED={seed}, {count} requests per identity, budget {budget:?}"
    ));

    let cluster = TestCluster::start().await;
    seed_store(&cluster).await;
    // Started after the RBAC is in force, so no decision cached before it can linger.
    let kcache = Kcache::start(&cluster, "").await;
    let store = Store {
        list_rvs: list_rvs(&cluster).await,
    };

    let indices: Vec<u64> = match only {
        Some(i) => vec![i],
        None => (0..count).collect(),
    };
    let cases: Vec<(u64, &Identity, Request)> = indices
        .iter()
        .flat_map(|&i| {
            let request = generate(seed, i, &store);
            IDENTITIES.iter().map(move |id| (i, id, request.clone()))
        })
        .collect();
    let total = cases.len();
    let (api, kc) = (raw_client(&cluster.url), raw_client(&kcache.url));
    let deadline = Instant::now() + budget;
    let started = Instant::now();
    let done: Vec<Case> = futures::stream::iter(cases)
        .map(|(index, identity, request)| {
            let (api, kc) = (&api, &kc);
            async move {
                if Instant::now() > deadline {
                    return None;
                }
                let to_kcache = request.to_kcache();
                let (a, k) = tokio::join!(
                    exchange(api, &request, identity.token),
                    exchange(kc, &to_kcache, identity.token)
                );
                let difference = compare(&a, &k);
                Some(Case {
                    index,
                    identity: identity.name,
                    request,
                    api: a,
                    kcache: k,
                    difference,
                })
            }
        })
        .buffer_unordered(PARALLELISM)
        .filter_map(|c| async move { c })
        .collect()
        .await;

    let mut tallies: BTreeMap<&str, Tally> = BTreeMap::new();
    let mut groups: BTreeMap<String, Vec<&Case>> = BTreeMap::new();
    let mut omissions: Vec<&Case> = Vec::new();
    for case in &done {
        // A replay shows every answer, differing or not.
        if only.is_some() {
            log(&case.describe(seed));
        }
        let t = tallies.entry(case.identity).or_default();
        t.cases += 1;
        *t.classes.entry(case.api.class()).or_default() += 1;
        t.with_objects += usize::from(case.api.class() == 2 && !case.api.objects.is_empty());
        t.unsendable += usize::from(case.api.note.starts_with("unsendable"));
        t.allowed += usize::from(case.difference.allowed.is_some());
        if case.difference.omitted > 0 {
            t.omitted += 1;
            omissions.push(case);
        }
        if case.difference.fails() {
            t.failures += 1;
            groups.entry(case.group()).or_default().push(case);
        }
    }
    let mut summary = format!(
        "differential: seed {seed}: {} of {total} cases in {:?}{}",
        done.len(),
        started.elapsed(),
        if done.len() < total {
            " (wall-time budget spent: the rest were skipped)"
        } else {
            ""
        }
    );
    for id in &IDENTITIES {
        let t = tallies.get(id.name).cloned().unwrap_or_default();
        let classes: Vec<String> = t
            .classes
            .iter()
            .map(|(c, n)| format!("{c}xx {n}"))
            .collect();
        summary.push_str(&format!(
            "\n  {:<9} {} requests (API server: {}; {} with objects), {} differ, {} allowed (documented differences), {} where kcache omitted objects, {} unsendable",
            id.name,
            t.cases,
            classes.join(", "),
            t.with_objects,
            t.failures,
            t.allowed,
            t.omitted,
            t.unsendable
        ));
    }
    log(&summary);
    if let Some(first) = omissions.first() {
        log(&format!(
            "differential: {} answers where kcache omitted objects the API server showed (not a failure), e.g.\n  {}",
            omissions.len(),
            first.describe(seed)
        ));
    }

    // A generator that stopped reaching real objects would make this check vacuous.
    if only.is_none() && done.len() == total && count >= 200 {
        let admin = &tallies["admin"];
        assert!(
            admin.with_objects * 10 >= admin.cases,
            "seed {seed}: only {} of admin's {} requests showed objects: the generator no longer reaches the store",
            admin.with_objects,
            admin.cases
        );
    }

    if groups.is_empty() {
        return;
    }
    let mut report = format!(
        "seed {seed}: kcache answered {} of {} cases differently from the API server\n\nBy kind (count, identities, first example):",
        tallies.values().map(|t| t.failures).sum::<usize>(),
        done.len()
    );
    for (group, cases) in &groups {
        let mut by_identity: BTreeMap<&str, usize> = BTreeMap::new();
        for c in cases {
            *by_identity.entry(c.identity).or_default() += 1;
        }
        report.push_str(&format!(
            "\n\n[{} x] {group} {by_identity:?}\n  {}",
            cases.len(),
            cases[0].describe(seed)
        ));
    }
    let mut all: Vec<&Case> = groups.values().flatten().copied().collect();
    all.sort_by_key(|c| c.index);
    report.push_str(&format!(
        "\n\nFirst {} by request index:",
        reported.min(all.len())
    ));
    for c in all.iter().take(reported) {
        report.push_str(&format!("\n  {}", c.describe(seed)));
    }
    panic!("{report}");
}
