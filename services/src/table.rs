//! `as=Table` answers for `kubectl get`: kcache's printers fill the cells as the reference
//! version's do, and the Table carries the column definitions the upstream itself prints;
//! a resource whose upstream columns are not the printer's (or were never learned) is not
//! printed here ([`columns_for`]: its Tables are forwarded).

use kcache_actors::core::time::format_rfc3339;
use serde_json::{json, Map, Value};
use thiserror::Error;

#[derive(Debug, Error, PartialEq, Eq)]
pub enum Error {
    /// The API server rejects any other `includeObject` with 400 and this text.
    #[error("unrecognized includeObject value: {0:?}")]
    UnrecognizedIncludeObject(String),
}

// ---------------------------------------------------------------------------
// Content negotiation
// ---------------------------------------------------------------------------

/// Which Table the client asked for, parsed from an Accept header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TableVersion {
    V1,
    V1Beta1,
}

impl TableVersion {
    fn api_version(self) -> &'static str {
        match self {
            TableVersion::V1 => "meta.k8s.io/v1",
            TableVersion::V1Beta1 => "meta.k8s.io/v1beta1",
        }
    }
}

/// What one media range lets kcache send.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Servable {
    Json,
    Table(TableVersion),
}

/// One media range of an Accept header. The type and parameter names are lower-cased
/// (HTTP makes them case-insensitive); values are kept as sent because the API server
/// compares `as`, `g` and `v` exactly.
struct MediaRange<'a> {
    ty: String,
    subtype: String,
    q: f32,
    params: Vec<(String, &'a str)>,
}

impl MediaRange<'_> {
    fn param(&self, name: &str) -> Option<&str> {
        // Last one wins, as in the Go map the API server builds.
        self.params
            .iter()
            .rev()
            .find(|(k, _)| k == name)
            .map(|(_, v)| *v)
    }

    /// 0 for `type/subtype`, 1 for `type/*`, 2 for `*/*`: more specific ranges are preferred.
    fn wildcards(&self) -> u8 {
        u8::from(self.ty == "*") + u8::from(self.subtype == "*")
    }

    fn servable(&self) -> Option<Servable> {
        // q=0 means "not acceptable" (RFC 9110 §12.4.2).
        if self.q <= 0.0 {
            return None;
        }
        // kcache encodes JSON only; a wildcard is answered with JSON as the API server does
        // (JSON is the first media type it offers).
        let json = matches!(
            (self.ty.as_str(), self.subtype.as_str()),
            ("application", "json") | ("application", "*") | ("*", "*")
        );
        if !json {
            return None;
        }
        // JSON has a stream serializer and the only stream schema a resource endpoint allows
        // is "watch".
        if self
            .param("stream")
            .is_some_and(|s| !s.is_empty() && s != "watch")
        {
            return None;
        }
        let (kind, group, version) = (self.param("as"), self.param("g"), self.param("v"));
        if kind.is_none() && group.is_none() && version.is_none() {
            return Some(Servable::Json);
        }
        // Any of as/g/v asks for a conversion; the only one kcache performs is to Table.
        // PartialObjectMetadata(List) is valid for the API server but not served here.
        match (kind, group, version) {
            (Some("Table"), Some("meta.k8s.io"), Some("v1")) => {
                Some(Servable::Table(TableVersion::V1))
            }
            (Some("Table"), Some("meta.k8s.io"), Some("v1beta1")) => {
                Some(Servable::Table(TableVersion::V1Beta1))
            }
            _ => None,
        }
    }
}

fn unquote(v: &str) -> &str {
    v.strip_prefix('"')
        .and_then(|v| v.strip_suffix('"'))
        .unwrap_or(v)
}

/// The header's media ranges, most preferred first.
fn media_ranges(accept: &str) -> Vec<MediaRange<'_>> {
    let mut ranges = Vec::new();
    for clause in accept.split(',') {
        let mut parts = clause.split(';');
        let range = parts.next().unwrap_or_default().trim().to_ascii_lowercase();
        let (ty, subtype) = match range.split_once('/') {
            Some((t, s)) => (t.trim().to_string(), s.trim().to_string()),
            // A bare "*" is sent by some clients for "*/*"; the API server's parser allows it.
            None if range == "*" => ("*".to_string(), "*".to_string()),
            None => continue,
        };
        if ty.is_empty() || subtype.is_empty() {
            continue;
        }
        let mut q = 1.0;
        let mut params = Vec::new();
        for p in parts {
            let Some((k, v)) = p.split_once('=') else {
                continue;
            };
            let k = k.trim().to_ascii_lowercase();
            let v = unquote(v.trim());
            if k == "q" {
                // An unparsable weight counts as 0, as in the API server's parser.
                q = v
                    .parse::<f32>()
                    .ok()
                    .filter(|q| q.is_finite())
                    .unwrap_or(0.0)
                    .clamp(0.0, 1.0);
            } else {
                params.push((k, v));
            }
        }
        ranges.push(MediaRange {
            ty,
            subtype,
            q,
            params,
        });
    }
    // Higher weight first, then more specific; the sort is stable so equal ranges keep the
    // client's order (kubectl lists Table v1, Table v1beta1, then plain JSON).
    ranges.sort_by(|a, b| {
        b.q.total_cmp(&a.q)
            .then_with(|| a.wildcards().cmp(&b.wildcards()))
    });
    ranges
}

/// What kcache does with a request's Accept header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Negotiated {
    /// Plain JSON.
    Json,
    /// A Table, as JSON.
    Table(TableVersion),
    /// Protobuf (`application/vnd.kubernetes.protobuf`), for a built-in kind.
    Protobuf,
    /// The API server would answer with something kcache does not produce: proxy it.
    Forward,
}

/// Reads an Accept header as the API server negotiates one: the most preferred media range
/// it can answer wins. kcache answers when that is JSON, a Table, or — for a built-in kind
/// (`protobuf`) — protobuf. A preferred encoding kcache lacks (YAML; protobuf for a custom
/// resource, as upstream) is passed over for a later JSON range, since it would carry the
/// same answer; anything else the API server may answer differently
/// (`as=PartialObjectMetadata`, any conversion or stream parameter kcache does not
/// perform) sends the request upstream, as does a header with no JSON at all. A type the
/// API server does not serve (`text/html`) is passed over, as it does.
pub fn negotiate(accept: &str, protobuf: bool) -> Negotiated {
    // A missing header means "anything"; the API server then answers with JSON.
    if accept.trim().is_empty() {
        return Negotiated::Json;
    }
    for range in media_ranges(accept) {
        if range.q <= 0.0 {
            continue;
        }
        match range.servable() {
            Some(Servable::Json) => return Negotiated::Json,
            Some(Servable::Table(v)) => return Negotiated::Table(v),
            None => {}
        }
        // What the API server serves at all: JSON, YAML and protobuf (and wildcards,
        // which `servable` answered). It passes over any other type, and so does kcache.
        let served_upstream = range.ty == "application"
            && matches!(
                range.subtype.as_str(),
                "json" | "yaml" | "vnd.kubernetes.protobuf"
            );
        if !served_upstream {
            continue;
        }
        // Protobuf has a stream serializer too (length-prefixed frames); a conversion
        // (`as=Table`…) is the API server's to answer.
        if protobuf
            && range.subtype == "vnd.kubernetes.protobuf"
            && range
                .params
                .iter()
                .all(|(k, v)| k == "charset" || (k == "stream" && (v.is_empty() || *v == "watch")))
        {
            return Negotiated::Protobuf;
        }
        let same_answer_encoded_otherwise =
            range.subtype != "json" && range.params.iter().all(|(k, _)| k == "charset");
        if !same_answer_encoded_otherwise {
            return Negotiated::Forward;
        }
    }
    Negotiated::Forward
}

/// includeObject as the API server's `?includeObject=` query parameter.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum IncludeObject {
    None,
    /// kubectl's default: each row carries the object's metadata.
    #[default]
    Metadata,
    Object,
}

impl IncludeObject {
    /// An absent or empty value means Metadata, as on the API server.
    pub fn parse(s: Option<&str>) -> Result<Self, Error> {
        match s {
            None | Some("") | Some("Metadata") => Ok(IncludeObject::Metadata),
            Some("None") => Ok(IncludeObject::None),
            Some("Object") => Ok(IncludeObject::Object),
            Some(other) => Err(Error::UnrecognizedIncludeObject(other.to_string())),
        }
    }
}

// ---------------------------------------------------------------------------
// Time
// ---------------------------------------------------------------------------

/// Go's zero `time.Time` (0001-01-01T00:00:00Z) in Unix seconds: what a missing
/// creationTimestamp decodes to, and what the printers treat as "unknown".
const ZERO_TIME: i64 = -62_135_596_800;

/// Unix seconds of an RFC 3339 timestamp as metav1.Time accepts it (`core::time`).
fn parse_rfc3339(s: &str) -> Option<i64> {
    kcache_actors::core::time::parse_rfc3339(s).map(|(secs, _)| secs)
}

/// The object's creationTimestamp, or None when it is missing, unreadable, or Go's zero time.
fn created_at(obj: &Value) -> Option<i64> {
    obj.pointer("/metadata/creationTimestamp")
        .and_then(Value::as_str)
        .and_then(parse_rfc3339)
        .filter(|&t| t != ZERO_TIME)
}

/// k8s.io/apimachinery/pkg/util/duration.HumanDuration for a whole number of seconds:
/// two or three significant figures, finer for recent times.
fn human_duration(secs: i64) -> String {
    // Up to a second in the future is tolerated as clock skew.
    if secs < -1 {
        return "<invalid>".to_string();
    }
    if secs < 0 {
        return "0s".to_string();
    }
    if secs < 2 * 60 {
        return format!("{secs}s");
    }
    let minutes = secs / 60;
    if minutes < 10 {
        return match secs % 60 {
            0 => format!("{minutes}m"),
            s => format!("{minutes}m{s}s"),
        };
    }
    if minutes < 3 * 60 {
        return format!("{minutes}m");
    }
    let hours = secs / 3600;
    if hours < 8 {
        return match minutes % 60 {
            0 => format!("{hours}h"),
            m => format!("{hours}h{m}m"),
        };
    }
    if hours < 48 {
        return format!("{hours}h");
    }
    let days = hours / 24;
    if hours < 24 * 8 {
        return match hours % 24 {
            0 => format!("{days}d"),
            h => format!("{days}d{h}h"),
        };
    }
    if hours < 24 * 365 * 2 {
        return format!("{days}d");
    }
    let years = days / 365;
    if hours < 24 * 365 * 8 {
        return match days % 365 {
            0 => format!("{years}y"),
            d => format!("{years}y{d}d"),
        };
    }
    format!("{years}y")
}

/// The printers' AGE cell (translateTimestampSince).
fn age(obj: &Value, now: i64) -> String {
    created_at(obj).map_or_else(
        || "<unknown>".to_string(),
        |t| human_duration(now.saturating_sub(t)),
    )
}

// ---------------------------------------------------------------------------
// Columns
// ---------------------------------------------------------------------------

/// A column kcache's printer fills: what the upstream's definition of it must say
/// (`Printer::agrees`); its description is the upstream's own.
struct Column {
    name: &'static str,
    ty: &'static str,
    format: &'static str,
    priority: i64,
}

/// A column shown by plain `kubectl get`.
const fn col(name: &'static str, ty: &'static str) -> Column {
    Column {
        name,
        ty,
        format: "",
        priority: 0,
    }
}

/// A column shown only by `kubectl get -o wide`.
const fn wide(name: &'static str) -> Column {
    Column {
        name,
        ty: "string",
        format: "",
        priority: 1,
    }
}

const NAME: Column = Column {
    name: "Name",
    ty: "string",
    format: "name",
    priority: 0,
};
const AGE: Column = col("Age", "string");

const SECRET_COLUMNS: &[Column] = &[NAME, col("Type", "string"), col("Data", "string"), AGE];
const CONFIGMAP_COLUMNS: &[Column] = &[NAME, col("Data", "string"), AGE];
const NAMESPACE_COLUMNS: &[Column] = &[NAME, col("Status", "string"), AGE];
const SERVICE_COLUMNS: &[Column] = &[
    NAME,
    col("Type", "string"),
    col("Cluster-IP", "string"),
    col("External-IP", "string"),
    col("Port(s)", "string"),
    AGE,
    wide("Selector"),
];
const ENDPOINTS_COLUMNS: &[Column] = &[NAME, col("Endpoints", "string"), AGE];
const POD_COLUMNS: &[Column] = &[
    NAME,
    col("Ready", "string"),
    col("Status", "string"),
    col("Restarts", "string"),
    AGE,
    wide("IP"),
    wide("Node"),
    wide("Nominated Node"),
    wide("Readiness Gates"),
];
/// `printEndpointSlice`'s columns (1.37).
const ENDPOINTSLICE_COLUMNS: &[Column] = &[
    NAME,
    col("AddressType", "string"),
    col("Ports", "string"),
    col("Endpoints", "string"),
    AGE,
];
/// The API server's default table convertor, for resources without a printer.
const DEFAULT_COLUMNS: &[Column] = &[NAME, col("Created At", "date")];

// ---------------------------------------------------------------------------
// Printers
// ---------------------------------------------------------------------------

/// The column definitions kcache prints a resource's Tables with: the upstream's, when
/// its printer prints the same columns; `None` when the upstream prints others, or when
/// they were never learned (a failed probe at start: kcache cannot know they agree), and
/// the request is forwarded.
pub fn columns_for<'a>(
    group: &str,
    resource: &str,
    upstream: Option<&'a Value>,
) -> Option<&'a Value> {
    match upstream {
        Some(c) if Printer::for_resource(group, resource).agrees(c) => Some(c),
        _ => None,
    }
}

/// Which printer renders a resource. The API server prints every column, wide ones
/// included (kubectl hides priority > 0 unless `-o wide`), so rows always fill every column.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Printer {
    Secret,
    ConfigMap,
    Namespace,
    Service,
    Endpoints,
    EndpointSlice,
    Pod,
    Default,
}

impl Printer {
    fn for_resource(group: &str, resource: &str) -> Self {
        match (group, resource) {
            ("", "secrets") => Printer::Secret,
            ("", "configmaps") => Printer::ConfigMap,
            ("", "namespaces") => Printer::Namespace,
            ("", "services") => Printer::Service,
            ("", "endpoints") => Printer::Endpoints,
            ("", "pods") => Printer::Pod,
            ("discovery.k8s.io", "endpointslices") => Printer::EndpointSlice,
            _ => Printer::Default,
        }
    }

    fn columns(self) -> &'static [Column] {
        match self {
            Printer::Secret => SECRET_COLUMNS,
            Printer::ConfigMap => CONFIGMAP_COLUMNS,
            Printer::Namespace => NAMESPACE_COLUMNS,
            Printer::Service => SERVICE_COLUMNS,
            Printer::Endpoints => ENDPOINTS_COLUMNS,
            Printer::EndpointSlice => ENDPOINTSLICE_COLUMNS,
            Printer::Pod => POD_COLUMNS,
            Printer::Default => DEFAULT_COLUMNS,
        }
    }

    /// Whether the upstream's column definitions for the resource (`upstream`, from one
    /// Table it printed) are this printer's: the same names, types, formats and
    /// priorities, in order. Descriptions may differ (they follow the API's docs).
    fn agrees(self, upstream: &Value) -> bool {
        let Some(theirs) = upstream.as_array() else {
            return false;
        };
        theirs.len() == self.columns().len()
            && theirs.iter().zip(self.columns()).all(|(t, c)| {
                t["name"] == c.name
                    && t["type"] == c.ty
                    && t["format"] == c.format
                    && t["priority"] == c.priority
            })
    }

    /// Definitions of this printer's columns, as an upstream that agrees prints them
    /// (less their descriptions).
    #[cfg(test)]
    fn column_definitions(self) -> Value {
        self.columns()
            .iter()
            .map(|c| {
                json!({
                    "name": c.name,
                    "type": c.ty,
                    "format": c.format,
                    "priority": c.priority,
                })
            })
            .collect()
    }

    /// The row's cells, and its conditions (only pods have any).
    fn print(self, obj: &Value, now: i64) -> (Vec<Value>, Option<Value>) {
        let name = json!(str_at(obj, "/metadata/name"));
        let cells = match self {
            Printer::Secret => vec![
                name,
                json!(str_at(obj, "/type")),
                json!(map_len(obj, "/data")),
                json!(age(obj, now)),
            ],
            Printer::ConfigMap => vec![
                name,
                json!(map_len(obj, "/data") + map_len(obj, "/binaryData")),
                json!(age(obj, now)),
            ],
            Printer::Namespace => vec![
                name,
                json!(str_at(obj, "/status/phase")),
                json!(age(obj, now)),
            ],
            Printer::Service => vec![
                name,
                json!(str_at(obj, "/spec/type")),
                json!(service_cluster_ip(obj)),
                json!(service_external_ip(obj)),
                json!(service_ports(obj)),
                json!(age(obj, now)),
                json!(format_labels(obj.pointer("/spec/selector"))),
            ],
            Printer::Endpoints => vec![name, json!(format_endpoints(obj)), json!(age(obj, now))],
            Printer::EndpointSlice => vec![
                name,
                json!(str_at(obj, "/addressType")),
                json!(slice_ports(obj)),
                json!(slice_endpoints(obj)),
                json!(age(obj, now)),
            ],
            Printer::Pod => return print_pod(obj, now),
            Printer::Default => vec![
                name,
                json!(format_rfc3339(created_at(obj).unwrap_or(ZERO_TIME))),
            ],
        };
        (cells, None)
    }
}

fn str_at<'a>(obj: &'a Value, ptr: &str) -> &'a str {
    obj.pointer(ptr).and_then(Value::as_str).unwrap_or_default()
}

fn array_at<'a>(obj: &'a Value, ptr: &str) -> &'a [Value] {
    obj.pointer(ptr)
        .and_then(Value::as_array)
        .map_or(&[], Vec::as_slice)
}

fn map_len(obj: &Value, ptr: &str) -> i64 {
    obj.pointer(ptr)
        .and_then(Value::as_object)
        .map_or(0, |m| i64::try_from(m.len()).unwrap_or(i64::MAX))
}

fn int_at(obj: &Value, key: &str) -> i64 {
    obj.get(key).and_then(Value::as_i64).unwrap_or_default()
}

fn or_none(s: &str) -> String {
    if s.is_empty() {
        "<none>".to_string()
    } else {
        s.to_string()
    }
}

/// labels.FormatLabels: `k=v` sorted by key, or `<none>`.
fn format_labels(labels: Option<&Value>) -> String {
    let Some(map) = labels.and_then(Value::as_object) else {
        return "<none>".to_string();
    };
    // serde_json's map is ordered by key already, but don't depend on its features.
    let mut pairs: Vec<String> = map
        .iter()
        .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default()))
        .collect();
    pairs.sort();
    or_none(&pairs.join(","))
}

/// The first cluster IP: dual-stack services list both families in clusterIPs.
fn service_cluster_ip(svc: &Value) -> String {
    let first = array_at(svc, "/spec/clusterIPs")
        .first()
        .and_then(Value::as_str)
        .unwrap_or_default();
    if first.is_empty() {
        or_none(str_at(svc, "/spec/clusterIP"))
    } else {
        first.to_string()
    }
}

fn service_external_ip(svc: &Value) -> String {
    let external: Vec<&str> = array_at(svc, "/spec/externalIPs")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    match str_at(svc, "/spec/type") {
        "ClusterIP" | "NodePort" if external.is_empty() => "<none>".to_string(),
        "ClusterIP" | "NodePort" => external.join(","),
        "LoadBalancer" => {
            // The load balancer's addresses (IP, else hostname) as a sorted set; the API
            // server prints wide, so they are never shortened.
            let mut lb: Vec<&str> = array_at(svc, "/status/loadBalancer/ingress")
                .iter()
                .filter_map(|i| {
                    let ip = i.get("ip").and_then(Value::as_str).unwrap_or_default();
                    let host = i
                        .get("hostname")
                        .and_then(Value::as_str)
                        .unwrap_or_default();
                    [ip, host].into_iter().find(|s| !s.is_empty())
                })
                .collect();
            lb.sort_unstable();
            lb.dedup();
            if lb.is_empty() && external.is_empty() {
                "<pending>".to_string()
            } else {
                lb.into_iter().chain(external).collect::<Vec<_>>().join(",")
            }
        }
        "ExternalName" => str_at(svc, "/spec/externalName").to_string(),
        _ => "<unknown>".to_string(),
    }
}

fn service_ports(svc: &Value) -> String {
    let ports: Vec<String> = array_at(svc, "/spec/ports")
        .iter()
        .map(|p| {
            let port = int_at(p, "port");
            let protocol = p
                .get("protocol")
                .and_then(Value::as_str)
                .unwrap_or_default();
            match int_at(p, "nodePort") {
                np if np > 0 => format!("{port}:{np}/{protocol}"),
                _ => format!("{port}/{protocol}"),
            }
        })
        .collect();
    or_none(&ports.join(","))
}

/// Up to three items joined, `+ N more...` past them, `<unset>` when that is empty
/// (`listWithMoreString`: an only port with an empty name and no number prints `<unset>`).
fn list_with_more(items: impl Iterator<Item = String>) -> String {
    let all: Vec<String> = items.collect();
    let shown = all.iter().take(3).cloned().collect::<Vec<_>>().join(",");
    match all.len() {
        n if n > 3 => format!("{shown} + {} more...", n - 3),
        _ if shown.is_empty() => "<unset>".to_string(),
        _ => shown,
    }
}

/// An EndpointSlice's ports: each number, else its name, else `*`.
fn slice_ports(slice: &Value) -> String {
    list_with_more(array_at(slice, "/ports").iter().map(|p| {
        match (
            p.get("port").and_then(Value::as_i64),
            p.get("name").and_then(Value::as_str),
        ) {
            (Some(n), _) => n.to_string(),
            (None, Some(name)) => name.to_string(),
            (None, None) => "*".to_string(),
        }
    }))
}

/// An EndpointSlice's addresses, every endpoint's in order.
fn slice_endpoints(slice: &Value) -> String {
    list_with_more(array_at(slice, "/endpoints").iter().flat_map(|e| {
        e.get("addresses")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|a| a.as_str().map(str::to_string))
    }))
}

/// Go's net.JoinHostPort: IPv6 hosts are bracketed.
fn join_host_port(host: &str, port: i64) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// The endpoints printer: the first three addresses (`ip:port`, port by port, or bare IPs
/// for a subset without ports), then ` + N more...`. Not-ready addresses are not shown.
fn format_endpoints(ep: &Value) -> String {
    const MAX: usize = 3;
    let subsets = array_at(ep, "/subsets");
    if subsets.is_empty() {
        return "<none>".to_string();
    }
    let mut shown: Vec<String> = Vec::with_capacity(MAX);
    let mut total = 0usize;
    let mut add = |entry: String| {
        if shown.len() < MAX {
            shown.push(entry);
        }
        total += 1;
    };
    for subset in subsets {
        let ips: Vec<&str> = array_at(subset, "/addresses")
            .iter()
            .map(|a| a.get("ip").and_then(Value::as_str).unwrap_or_default())
            .collect();
        let ports = array_at(subset, "/ports");
        if ports.is_empty() {
            // Headless services may have no ports.
            ips.iter().for_each(|ip| add((*ip).to_string()));
        } else {
            // Port-major, as the printer walks them.
            for port in ports {
                let port = int_at(port, "port");
                ips.iter().for_each(|ip| add(join_host_port(ip, port)));
            }
        }
    }
    let list = shown.join(",");
    if total > MAX {
        format!("{list} + {} more...", total - MAX)
    } else {
        list
    }
}

/// One of a container status' states, when present (Go's non-nil pointer).
fn state<'a>(status: &'a Value, which: &str) -> Option<&'a Map<String, Value>> {
    status.get("state")?.get(which)?.as_object()
}

fn text<'a>(m: &'a Map<String, Value>, key: &str) -> &'a str {
    m.get(key).and_then(Value::as_str).unwrap_or_default()
}

fn number(m: &Map<String, Value>, key: &str) -> i64 {
    m.get(key).and_then(Value::as_i64).unwrap_or_default()
}

/// A terminated container's reason, else its signal, else its exit code.
fn terminated_reason(t: &Map<String, Value>, prefix: &str) -> String {
    let reason = text(t, "reason");
    if !reason.is_empty() {
        return format!("{prefix}{reason}");
    }
    match number(t, "signal") {
        0 => format!("{prefix}ExitCode:{}", number(t, "exitCode")),
        signal => format!("{prefix}Signal:{signal}"),
    }
}

/// What the pod printer derives from a pod's status.
#[derive(Debug, PartialEq, Eq)]
struct PodSummary {
    ready: usize,
    total: usize,
    status: String,
    restarts: i64,
    /// When the last counted restart's container finished (Unix seconds), if any.
    last_restart: Option<i64>,
}

/// A restartable init container: a sidecar (`restartPolicy: Always`).
fn is_sidecar(c: Option<&Value>) -> bool {
    c.and_then(|c| c.get("restartPolicy"))
        .and_then(Value::as_str)
        == Some("Always")
}

/// When a container status's last termination finished (Unix seconds).
fn last_finished(c: &Value) -> Option<i64> {
    c.pointer("/lastState/terminated/finishedAt")
        .and_then(Value::as_str)
        .and_then(parse_rfc3339)
}

fn condition_true(pod: &Value, ty: &str) -> bool {
    // The first condition of the type decides, as Go's loops do.
    array_at(pod, "/status/conditions")
        .iter()
        .find(|c| c.get("type").and_then(Value::as_str) == Some(ty))
        .is_some_and(|c| c.get("status").and_then(Value::as_str) == Some("True"))
}

/// The reference version's pod printer (`printPod`, 1.37): READY, STATUS, RESTARTS —
/// sidecars (restartable init containers) counted among the containers, a scheduling gate
/// shown, the last restart's time kept for its age.
fn pod_summary(pod: &Value) -> PodSummary {
    let phase = str_at(pod, "/status/phase");
    let mut status = match str_at(pod, "/status/reason") {
        "" => phase.to_string(),
        reason => reason.to_string(),
    };
    if array_at(pod, "/status/conditions").iter().any(|c| {
        c.get("type").and_then(Value::as_str) == Some("PodScheduled")
            && c.get("reason").and_then(Value::as_str) == Some("SchedulingGated")
    }) {
        status = "SchedulingGated".to_string();
    }
    let init_specs = array_at(pod, "/spec/initContainers");
    let init_spec = |name: &str| {
        init_specs
            .iter()
            .find(|c| c.get("name").and_then(Value::as_str) == Some(name))
    };
    let mut total = array_at(pod, "/spec/containers").len();
    total += init_specs.iter().filter(|c| is_sidecar(Some(c))).count();
    let (mut restarts, mut sidecar_restarts) = (0, 0);
    let (mut last_restart, mut sidecar_last_restart): (Option<i64>, Option<i64>) = (None, None);
    let mut ready = 0;

    // The first init container that has not succeeded (and is no started sidecar)
    // decides the status.
    let mut initializing = false;
    for (i, c) in array_at(pod, "/status/initContainerStatuses")
        .iter()
        .enumerate()
    {
        restarts += int_at(c, "restartCount");
        last_restart = last_restart.max(last_finished(c));
        let name = c.get("name").and_then(Value::as_str).unwrap_or_default();
        let sidecar = is_sidecar(init_spec(name));
        if sidecar {
            sidecar_restarts += int_at(c, "restartCount");
            sidecar_last_restart = sidecar_last_restart.max(last_finished(c));
        }
        let terminated = state(c, "terminated");
        if terminated.is_some_and(|t| number(t, "exitCode") == 0) {
            continue;
        }
        if sidecar && c.get("started").and_then(Value::as_bool) == Some(true) {
            if c.get("ready").and_then(Value::as_bool) == Some(true) {
                ready += 1;
            }
            continue;
        }
        let waiting_reason = state(c, "waiting").map(|w| text(w, "reason"));
        status = match terminated {
            Some(t) => terminated_reason(t, "Init:"),
            // PodInitializing is the kubelet's placeholder, not worth showing.
            None => match waiting_reason {
                Some(r) if !r.is_empty() && r != "PodInitializing" => format!("Init:{r}"),
                _ => format!("Init:{i}/{}", init_specs.len()),
            },
        };
        initializing = true;
        break;
    }

    if !initializing || condition_true(pod, "Initialized") {
        // Once initialized only the app containers' and sidecars' restarts count.
        restarts = sidecar_restarts;
        last_restart = sidecar_last_restart;
        let mut has_running = false;
        let mut error_reason = String::new();
        // Walked last to first so the first container's state wins.
        for c in array_at(pod, "/status/containerStatuses").iter().rev() {
            restarts += int_at(c, "restartCount");
            last_restart = last_restart.max(last_finished(c));
            let waiting = state(c, "waiting")
                .map(|w| text(w, "reason"))
                .filter(|r| !r.is_empty());
            if let Some(reason) = waiting {
                status = reason.to_string();
            } else if let Some(t) = state(c, "terminated") {
                status = terminated_reason(t, "");
                if number(t, "exitCode") != 0 {
                    error_reason = status.clone();
                }
            } else if c.get("ready").and_then(Value::as_bool) == Some(true)
                && state(c, "running").is_some()
            {
                has_running = true;
                ready += 1;
            }
        }
        // A finished sidecar should not hide containers still serving.
        if status == "Completed" {
            if has_running && has_ready_condition(pod) {
                status = "Running".to_string();
            } else if !error_reason.is_empty() {
                status = error_reason;
            } else if has_running {
                status = "NotReady".to_string();
            }
        }
    }

    let deleting = pod
        .pointer("/metadata/deletionTimestamp")
        .is_some_and(|t| !t.is_null());
    if deleting && str_at(pod, "/status/reason") == "NodeLost" {
        // The node stopped reporting, so the pod's fate is unknown.
        status = "Unknown".to_string();
    } else if deleting && !matches!(phase, "Succeeded" | "Failed") {
        status = "Terminating".to_string();
    }

    PodSummary {
        ready,
        total,
        status,
        restarts,
        last_restart,
    }
}

fn has_ready_condition(pod: &Value) -> bool {
    array_at(pod, "/status/conditions").iter().any(|c| {
        c.get("type").and_then(Value::as_str) == Some("Ready")
            && c.get("status").and_then(Value::as_str) == Some("True")
    })
}

/// `true/total` readiness gates, each judged by the first condition of its type.
fn readiness_gates(pod: &Value) -> String {
    let gates = array_at(pod, "/spec/readinessGates");
    if gates.is_empty() {
        return "<none>".to_string();
    }
    let conditions = array_at(pod, "/status/conditions");
    let passed = gates
        .iter()
        .filter(|gate| {
            let ty = gate.get("conditionType");
            conditions
                .iter()
                .find(|c| c.get("type") == ty)
                .is_some_and(|c| c.get("status").and_then(Value::as_str) == Some("True"))
        })
        .count();
    format!("{passed}/{}", gates.len())
}

fn print_pod(pod: &Value, now: i64) -> (Vec<Value>, Option<Value>) {
    let summary = pod_summary(pod);
    // The first of podIPs; a v1 status with podIP alone converts to podIPs of that one.
    let ip = match array_at(pod, "/status/podIPs").first() {
        Some(first) => first.get("ip").and_then(Value::as_str).unwrap_or_default(),
        None => str_at(pod, "/status/podIP"),
    };
    let restarts = match summary.last_restart {
        Some(at) if summary.restarts != 0 && at != ZERO_TIME => {
            format!("{} ({} ago)", summary.restarts, human_duration(now - at))
        }
        _ => summary.restarts.to_string(),
    };
    let cells = vec![
        json!(str_at(pod, "/metadata/name")),
        json!(format!("{}/{}", summary.ready, summary.total)),
        json!(summary.status),
        json!(restarts),
        json!(age(pod, now)),
        json!(or_none(ip)),
        json!(or_none(str_at(pod, "/spec/nodeName"))),
        json!(or_none(str_at(pod, "/status/nominatedNodeName"))),
        json!(readiness_gates(pod)),
    ];
    // Row conditions let clients tell finished pods apart without parsing STATUS.
    let conditions = match str_at(pod, "/status/phase") {
        "Succeeded" => Some(json!([{
            "type": "Completed",
            "status": "True",
            "reason": "Succeeded",
            "message": "The pod has completed successfully.",
        }])),
        "Failed" => Some(json!([{
            "type": "Completed",
            "status": "True",
            "reason": "Failed",
            "message": "The pod failed.",
        }])),
        _ => None,
    };
    (cells, conditions)
}

// ---------------------------------------------------------------------------
// Table
// ---------------------------------------------------------------------------

fn row_object(obj: &Value, include: IncludeObject, version: TableVersion) -> Option<Value> {
    match include {
        IncludeObject::None => None,
        IncludeObject::Object => Some(obj.clone()),
        // The API server labels the partial object with the Table's own group version.
        IncludeObject::Metadata => Some(json!({
            "kind": "PartialObjectMetadata",
            "apiVersion": version.api_version(),
            "metadata": obj.get("metadata").cloned().unwrap_or_else(|| json!({})),
        })),
    }
}

/// Build the Table for `objects` of resource `resource` (plural, e.g. "secrets") in group
/// `group` ("" for core). `list_meta` (`{"resourceVersion": ..., "continue"?: ...}`) becomes
/// the Table's metadata; `now` (Unix seconds) dates the AGE columns. Each row has the
/// printer's cells and, per `include`, a PartialObjectMetadata, the whole object, or nothing.
#[allow(clippy::too_many_arguments)]
pub fn to_table(
    version: TableVersion,
    columns: &Value,
    group: &str,
    resource: &str,
    objects: &[&Value],
    list_meta: Value,
    include: IncludeObject,
    now: i64,
) -> Value {
    let printer = Printer::for_resource(group, resource);
    let rows: Vec<Value> = objects
        .iter()
        .map(|obj| {
            let (cells, conditions) = printer.print(obj, now);
            let mut row = Map::new();
            row.insert("cells".into(), Value::Array(cells));
            if let Some(c) = conditions {
                row.insert("conditions".into(), c);
            }
            if let Some(o) = row_object(obj, include, version) {
                row.insert("object".into(), o);
            }
            Value::Object(row)
        })
        .collect();
    // ListMeta is always an object on the wire.
    let metadata = if list_meta.is_object() {
        list_meta
    } else {
        json!({})
    };
    json!({
        "kind": "Table",
        "apiVersion": version.api_version(),
        "metadata": metadata,
        "columnDefinitions": columns.clone(),
        "rows": rows,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const KUBECTL: &str = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json";
    const PROTOBUF: &str = "application/vnd.kubernetes.protobuf";

    #[test]
    fn accept_headers() {
        use Negotiated::{Forward, Json, Table};
        use TableVersion::{V1Beta1, V1};
        let cases: &[(&str, Negotiated)] = &[
            (KUBECTL, Table(V1)),
            (
                "application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json",
                Table(V1Beta1),
            ),
            ("application/json", Json),
            ("application/json;charset=utf-8", Json),
            ("Application/JSON", Json),
            ("", Json),
            ("   ", Json),
            ("*/*", Json),
            ("*", Json),
            ("application/*", Json),
            // Types the API server does not serve are passed over, as there.
            ("text/html,application/xhtml+xml,*/*;q=0.8", Json),
            ("text/plain", Forward),
            ("garbage", Forward),
            // Nothing kcache encodes: the API server answers.
            (PROTOBUF, Forward),
            ("application/vnd.kubernetes.protobuf;as=Table;v=v1;g=meta.k8s.io", Forward),
            ("application/yaml", Forward),
            // Protobuf first: the same answer, so kcache skips to what it can encode.
            ("application/vnd.kubernetes.protobuf, application/json", Json),
            ("application/yaml;charset=utf-8, */*", Json),
            // A preferred conversion kcache does not perform is the API server's.
            (
                "application/vnd.kubernetes.protobuf;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io",
                Forward,
            ),
            ("application/json;as=PartialObjectMetadataList;v=v1;g=meta.k8s.io", Forward),
            (
                "application/json;as=PartialObjectMetadataList;v=v1;g=meta.k8s.io,application/json",
                Forward,
            ),
            ("application/json;as=Table;v=v2;g=meta.k8s.io", Forward),
            ("application/json;as=Table;v=v1", Forward),
            ("application/json;as=table;v=v1;g=meta.k8s.io", Forward),
            // A Table asked for through a wildcard is still JSON.
            ("*/*;as=Table;v=v1;g=meta.k8s.io", Table(V1)),
            // Preference: weight, then specificity, then order.
            ("*/*, application/json;as=Table;v=v1;g=meta.k8s.io", Table(V1)),
            ("application/json;q=0.5, application/json;as=Table;v=v1;g=meta.k8s.io", Table(V1)),
            ("application/json;as=Table;v=v1;g=meta.k8s.io;q=0.2, application/json;q=0.9", Json),
            ("application/json;as=Table;v=v1;g=meta.k8s.io;q=0, application/json", Json),
            ("application/json;q=0", Forward),
            ("application/json; as=Table ; v=\"v1\" ; g=meta.k8s.io", Table(V1)),
            ("application/json;stream=watch", Json),
            ("application/json;stream=other", Forward),
        ];
        for &(header, want) in cases {
            assert_eq!(negotiate(header, false), want, "{header:?}");
        }
    }

    #[test]
    fn protobuf_for_built_in_kinds() {
        use Negotiated::*;
        let cases: &[(&str, Negotiated, Negotiated)] = &[
            // (Accept, built-in kind, custom resource)
            ("application/vnd.kubernetes.protobuf", Protobuf, Forward),
            // client-go's default for protobuf clients.
            (
                "application/vnd.kubernetes.protobuf, application/json",
                Protobuf,
                Json,
            ),
            (
                "application/vnd.kubernetes.protobuf;stream=watch",
                Protobuf,
                Forward,
            ),
            (
                "application/json, application/vnd.kubernetes.protobuf",
                Json,
                Json,
            ),
            (
                "application/vnd.kubernetes.protobuf;q=0.5, application/json",
                Json,
                Json,
            ),
            (
                "application/vnd.kubernetes.protobuf;as=Table;v=v1;g=meta.k8s.io",
                Forward,
                Forward,
            ),
            (
                "application/vnd.kubernetes.protobuf;stream=other",
                Forward,
                Forward,
            ),
            (
                "application/vnd.kubernetes.protobuf;q=0, application/json",
                Json,
                Json,
            ),
            ("*/*", Json, Json),
        ];
        for &(header, builtin, custom) in cases {
            assert_eq!(negotiate(header, true), builtin, "{header:?}");
            assert_eq!(negotiate(header, false), custom, "{header:?}");
        }
    }

    #[test]
    fn include_object() {
        let cases: &[(Option<&str>, Result<IncludeObject, Error>)] = &[
            (None, Ok(IncludeObject::Metadata)),
            (Some(""), Ok(IncludeObject::Metadata)),
            (Some("Metadata"), Ok(IncludeObject::Metadata)),
            (Some("Object"), Ok(IncludeObject::Object)),
            (Some("None"), Ok(IncludeObject::None)),
            (
                Some("object"),
                Err(Error::UnrecognizedIncludeObject("object".into())),
            ),
        ];
        for (input, want) in cases {
            assert_eq!(&IncludeObject::parse(*input), want, "{input:?}");
        }
        assert_eq!(
            Error::UnrecognizedIncludeObject("Bogus".into()).to_string(),
            "unrecognized includeObject value: \"Bogus\""
        );
        assert_eq!(IncludeObject::default(), IncludeObject::Metadata);
    }

    #[test]
    fn human_durations() {
        const M: i64 = 60;
        const H: i64 = 3600;
        const D: i64 = 86_400;
        const Y: i64 = 365 * D;
        let cases: &[(i64, &str)] = &[
            (-2, "<invalid>"),
            (-1, "0s"),
            (0, "0s"),
            (59, "59s"),
            (2 * M - 1, "119s"),
            (2 * M, "2m"),
            (2 * M + 5, "2m5s"),
            (10 * M - 1, "9m59s"),
            (10 * M, "10m"),
            (10 * M + 59, "10m"),
            (3 * H - 1, "179m"),
            (3 * H, "3h"),
            (3 * H + 2 * M + 30, "3h2m"),
            (8 * H - 1, "7h59m"),
            (8 * H, "8h"),
            (48 * H - 1, "47h"),
            (48 * H, "2d"),
            (50 * H, "2d2h"),
            (8 * D - 1, "7d23h"),
            (8 * D, "8d"),
            (2 * Y - 1, "729d"),
            (2 * Y, "2y"),
            (2 * Y + D, "2y1d"),
            (8 * Y - 1, "7y364d"),
            (8 * Y, "8y"),
            (9 * Y + 100 * D, "9y"),
        ];
        for &(secs, want) in cases {
            assert_eq!(human_duration(secs), want, "{secs}s");
        }
    }

    #[test]
    fn timestamps() {
        let cases: &[(&str, Option<i64>)] = &[
            ("1970-01-01T00:00:00Z", Some(0)),
            ("2000-03-01T00:00:01Z", Some(951_868_801)),
            ("2021-01-13T13:18:24Z", Some(1_610_543_904)),
            ("2021-01-13T13:18:24.123456Z", Some(1_610_543_904)),
            ("2021-01-13T15:18:24+02:00", Some(1_610_543_904)),
            ("2021-01-13T08:48:24-04:30", Some(1_610_543_904)),
            ("2024-02-29T00:00:00Z", Some(1_709_164_800)),
            ("0001-01-01T00:00:00Z", Some(ZERO_TIME)),
            ("2023-02-29T00:00:00Z", None),
            ("2021-13-01T00:00:00Z", None),
            ("2021-01-13T24:00:00Z", None),
            ("2021-01-13 13:18:24Z", None),
            ("2021-01-13T13:18:24", None),
            ("2021-01-13T13:18:24.Z", None),
            ("2021-01-13T13:18:24+0200", None),
            ("2021-01-13T13:18:24Zjunk", None),
            ("+021-01-13T13:18:24Z", None),
            ("2021-01-13T13:18:2éZ", None),
            ("garbage", None),
            ("", None),
        ];
        for &(s, want) in cases {
            assert_eq!(parse_rfc3339(s), want, "{s:?}");
        }
        for s in [
            "0001-01-01T00:00:00Z",
            "1969-12-31T23:59:59Z",
            "1970-01-01T00:00:00Z",
            "2021-01-13T13:18:24Z",
            "2024-02-29T23:59:59Z",
            "9999-12-31T23:59:59Z",
        ] {
            let secs = parse_rfc3339(s).expect(s);
            assert_eq!(format_rfc3339(secs), s);
        }
    }

    const NOW: &str = "2021-01-20T12:00:00Z";
    const CREATED: &str = "2021-01-20T11:55:30Z"; // 4m30s before NOW

    fn now() -> i64 {
        parse_rfc3339(NOW).expect("NOW parses")
    }

    fn meta(name: &str) -> Value {
        json!({"name": name, "namespace": "default", "uid": "u-1", "resourceVersion": "7", "creationTimestamp": CREATED})
    }

    fn cells(group: &str, resource: &str, obj: &Value) -> Vec<Value> {
        Printer::for_resource(group, resource).print(obj, now()).0
    }

    #[test]
    fn simple_resource_cells() {
        let cases: Vec<(&str, &str, Value, Value)> = vec![
            (
                "",
                "secrets",
                json!({"metadata": meta("db-creds"), "type": "Opaque", "data": {"user": "YQ==", "pass": "Yg=="}}),
                json!(["db-creds", "Opaque", 2, "4m30s"]),
            ),
            (
                "",
                "secrets",
                json!({"metadata": meta("tls"), "type": "kubernetes.io/tls"}),
                json!(["tls", "kubernetes.io/tls", 0, "4m30s"]),
            ),
            (
                "",
                "configmaps",
                json!({"metadata": meta("cfg"), "data": {"a": "1", "b": "2"}, "binaryData": {"c": "Aw=="}}),
                json!(["cfg", 3, "4m30s"]),
            ),
            (
                "",
                "namespaces",
                json!({"metadata": {"name": "kube-system", "creationTimestamp": "2020-12-01T12:00:00Z"}, "status": {"phase": "Active"}}),
                json!(["kube-system", "Active", "50d"]),
            ),
            (
                "",
                "namespaces",
                json!({"metadata": {"name": "old", "deletionTimestamp": NOW}, "status": {"phase": "Terminating"}}),
                json!(["old", "Terminating", "<unknown>"]),
            ),
            // Everything else: the API server's default Name / Created At.
            (
                "apps",
                "deployments",
                json!({"metadata": meta("web")}),
                json!(["web", CREATED]),
            ),
            (
                "example.com",
                "widgets",
                json!({"metadata": {"name": "w", "creationTimestamp": "2021-01-20T13:55:30+02:00"}}),
                json!(["w", "2021-01-20T11:55:30Z"]),
            ),
            (
                "",
                "serviceaccounts",
                json!({"metadata": {"name": "default"}}),
                json!(["default", "0001-01-01T00:00:00Z"]),
            ),
        ];
        for (group, resource, obj, want) in cases {
            assert_eq!(
                json!(cells(group, resource, &obj)),
                want,
                "{group}/{resource} {obj}"
            );
        }
    }

    #[test]
    fn service_cells() {
        let svc = |spec: Value, status: Value| json!({"metadata": meta("web"), "spec": spec, "status": status});
        let cases: Vec<(Value, Value)> = vec![
            (
                svc(
                    json!({"type": "ClusterIP", "clusterIP": "10.96.0.10", "clusterIPs": ["10.96.0.10"], "ports": [{"name": "dns", "port": 53, "protocol": "UDP", "targetPort": 53}, {"name": "dns-tcp", "port": 53, "protocol": "TCP"}], "selector": {"k8s-app": "kube-dns", "app": "dns"}}),
                    json!({"loadBalancer": {}}),
                ),
                json!([
                    "web",
                    "ClusterIP",
                    "10.96.0.10",
                    "<none>",
                    "53/UDP,53/TCP",
                    "4m30s",
                    "app=dns,k8s-app=kube-dns"
                ]),
            ),
            (
                svc(
                    json!({"type": "NodePort", "clusterIP": "10.0.0.1", "externalIPs": ["1.2.3.4", "5.6.7.8"], "ports": [{"port": 80, "nodePort": 30080, "protocol": "TCP"}]}),
                    json!({}),
                ),
                json!([
                    "web",
                    "NodePort",
                    "10.0.0.1",
                    "1.2.3.4,5.6.7.8",
                    "80:30080/TCP",
                    "4m30s",
                    "<none>"
                ]),
            ),
            (
                svc(
                    json!({"type": "LoadBalancer", "clusterIP": "10.0.0.2", "ports": [{"port": 443, "nodePort": 31443, "protocol": "TCP"}], "selector": {"app": "web"}}),
                    json!({"loadBalancer": {}}),
                ),
                json!([
                    "web",
                    "LoadBalancer",
                    "10.0.0.2",
                    "<pending>",
                    "443:31443/TCP",
                    "4m30s",
                    "app=web"
                ]),
            ),
            (
                svc(
                    json!({"type": "LoadBalancer", "clusterIP": "10.0.0.3", "externalIPs": ["9.9.9.9"], "ports": [{"port": 443, "nodePort": 31443, "protocol": "TCP"}]}),
                    json!({"loadBalancer": {"ingress": [{"ip": "203.0.113.9"}, {"hostname": "lb.example.com"}, {"ip": "203.0.113.1"}, {"ip": "203.0.113.9"}]}}),
                ),
                json!([
                    "web",
                    "LoadBalancer",
                    "10.0.0.3",
                    "203.0.113.1,203.0.113.9,lb.example.com,9.9.9.9",
                    "443:31443/TCP",
                    "4m30s",
                    "<none>"
                ]),
            ),
            (
                svc(
                    json!({"type": "ExternalName", "externalName": "db.example.com"}),
                    json!({}),
                ),
                json!([
                    "web",
                    "ExternalName",
                    "<none>",
                    "db.example.com",
                    "<none>",
                    "4m30s",
                    "<none>"
                ]),
            ),
            (
                svc(
                    json!({"type": "ClusterIP", "clusterIP": "None", "clusterIPs": ["None"], "selector": {"app": "db"}}),
                    json!({}),
                ),
                json!([
                    "web",
                    "ClusterIP",
                    "None",
                    "<none>",
                    "<none>",
                    "4m30s",
                    "app=db"
                ]),
            ),
            (
                svc(
                    json!({"type": "ClusterIP", "clusterIP": "10.0.0.4", "clusterIPs": ["fd00::4", "10.0.0.4"], "ports": [{"port": 80, "protocol": "TCP"}]}),
                    json!({}),
                ),
                json!([
                    "web",
                    "ClusterIP",
                    "fd00::4",
                    "<none>",
                    "80/TCP",
                    "4m30s",
                    "<none>"
                ]),
            ),
            (
                json!({"metadata": {"name": "odd"}, "spec": {}}),
                json!([
                    "odd",
                    "",
                    "<none>",
                    "<unknown>",
                    "<none>",
                    "<unknown>",
                    "<none>"
                ]),
            ),
        ];
        for (obj, want) in cases {
            assert_eq!(json!(cells("", "services", &obj)), want, "{obj}");
        }
    }

    #[test]
    fn endpoints_cells() {
        let ep = |subsets: Value| json!({"metadata": meta("web"), "subsets": subsets});
        let cases: Vec<(Value, &str)> = vec![
            (
                ep(
                    json!([{"addresses": [{"ip": "10.244.0.5", "targetRef": {"kind": "Pod", "name": "web-1"}}], "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}]}]),
                ),
                "10.244.0.5:8080",
            ),
            // Port-major: every address on the first port, then the next port.
            (
                ep(
                    json!([{"addresses": [{"ip": "1.1.1.1"}, {"ip": "2.2.2.2"}], "ports": [{"port": 80}, {"port": 443}]}]),
                ),
                "1.1.1.1:80,2.2.2.2:80,1.1.1.1:443 + 1 more...",
            ),
            (
                ep(json!([
                    {"addresses": [{"ip": "1.1.1.1"}, {"ip": "2.2.2.2"}, {"ip": "3.3.3.3"}], "ports": [{"port": 80}]},
                    {"addresses": [{"ip": "4.4.4.4"}, {"ip": "5.5.5.5"}], "ports": [{"port": 81}]},
                ])),
                "1.1.1.1:80,2.2.2.2:80,3.3.3.3:80 + 2 more...",
            ),
            (
                ep(
                    json!([{"addresses": [{"ip": "1.1.1.1"}, {"ip": "2.2.2.2"}, {"ip": "3.3.3.3"}], "ports": [{"port": 80}]}]),
                ),
                "1.1.1.1:80,2.2.2.2:80,3.3.3.3:80",
            ),
            // Headless without ports: bare IPs.
            (
                ep(json!([{"addresses": [{"ip": "10.0.0.1"}, {"ip": "10.0.0.2"}]}])),
                "10.0.0.1,10.0.0.2",
            ),
            (
                ep(json!([{"addresses": [{"ip": "fd00::1"}], "ports": [{"port": 53}]}])),
                "[fd00::1]:53",
            ),
            // Only not-ready addresses: the printer shows nothing, not <none>.
            (
                ep(json!([{"notReadyAddresses": [{"ip": "10.0.0.9"}], "ports": [{"port": 80}]}])),
                "",
            ),
            (ep(json!([])), "<none>"),
            (json!({"metadata": meta("web")}), "<none>"),
        ];
        for (obj, want) in cases {
            assert_eq!(
                json!(cells("", "endpoints", &obj)),
                json!(["web", want, "4m30s"]),
                "{obj}"
            );
        }
    }

    fn running(name: &str, restarts: i64) -> Value {
        json!({"name": name, "ready": true, "restartCount": restarts, "state": {"running": {"startedAt": CREATED}}})
    }

    fn waiting(name: &str, reason: &str, restarts: i64) -> Value {
        json!({"name": name, "ready": false, "restartCount": restarts, "state": {"waiting": {"reason": reason}}})
    }

    fn terminated(name: &str, reason: &str, exit_code: i64, signal: i64) -> Value {
        json!({"name": name, "ready": false, "restartCount": 0, "state": {"terminated": {"reason": reason, "exitCode": exit_code, "signal": signal}}})
    }

    fn pod(containers: usize, status: Value) -> Value {
        let containers: Vec<Value> = (0..containers)
            .map(|i| json!({"name": format!("c{i}"), "image": "nginx"}))
            .collect();
        json!({"metadata": meta("web-0"), "spec": {"containers": containers}, "status": status})
    }

    fn with_init(mut p: Value, init: usize) -> Value {
        let init: Vec<Value> = (0..init)
            .map(|i| json!({"name": format!("i{i}")}))
            .collect();
        p["spec"]["initContainers"] = json!(init);
        p
    }

    #[test]
    fn pod_statuses() {
        let ready = json!([{"type": "Ready", "status": "True"}]);
        let unready = json!([{"type": "Ready", "status": "False"}]);
        // (case, pod, READY, STATUS, RESTARTS)
        let cases: Vec<(&str, Value, &str, &str, i64)> = vec![
            (
                "running",
                pod(
                    1,
                    json!({"phase": "Running", "conditions": ready, "containerStatuses": [running("c0", 0)]}),
                ),
                "1/1",
                "Running",
                0,
            ),
            (
                "scheduling",
                pod(1, json!({"phase": "Pending"})),
                "0/1",
                "Pending",
                0,
            ),
            (
                "creating",
                pod(
                    2,
                    json!({"phase": "Pending", "containerStatuses": [waiting("c0", "ContainerCreating", 0), waiting("c1", "ContainerCreating", 0)]}),
                ),
                "0/2",
                "ContainerCreating",
                0,
            ),
            (
                "crash loop",
                pod(
                    2,
                    json!({"phase": "Running", "containerStatuses": [running("c0", 1), waiting("c1", "CrashLoopBackOff", 5)]}),
                ),
                "1/2",
                "CrashLoopBackOff",
                6,
            ),
            (
                "first container's reason wins",
                pod(
                    2,
                    json!({"phase": "Pending", "containerStatuses": [waiting("c0", "ImagePullBackOff", 0), waiting("c1", "ErrImagePull", 0)]}),
                ),
                "0/2",
                "ImagePullBackOff",
                0,
            ),
            (
                "completed",
                pod(
                    1,
                    json!({"phase": "Succeeded", "containerStatuses": [terminated("c0", "Completed", 0, 0)]}),
                ),
                "0/1",
                "Completed",
                0,
            ),
            (
                "error",
                pod(
                    1,
                    json!({"phase": "Failed", "containerStatuses": [terminated("c0", "Error", 1, 0)]}),
                ),
                "0/1",
                "Error",
                0,
            ),
            (
                "oom",
                pod(
                    1,
                    json!({"phase": "Running", "containerStatuses": [terminated("c0", "OOMKilled", 137, 0)]}),
                ),
                "0/1",
                "OOMKilled",
                0,
            ),
            (
                "signal",
                pod(
                    1,
                    json!({"phase": "Running", "containerStatuses": [terminated("c0", "", 0, 9)]}),
                ),
                "0/1",
                "Signal:9",
                0,
            ),
            (
                "exit code",
                pod(
                    1,
                    json!({"phase": "Running", "containerStatuses": [terminated("c0", "", 2, 0)]}),
                ),
                "0/1",
                "ExitCode:2",
                0,
            ),
            (
                "sidecar done, pod ready",
                pod(
                    2,
                    json!({"phase": "Running", "conditions": ready, "containerStatuses": [running("c0", 0), terminated("c1", "Completed", 0, 0)]}),
                ),
                "1/2",
                "Running",
                0,
            ),
            (
                "sidecar done, pod not ready",
                pod(
                    2,
                    json!({"phase": "Running", "conditions": unready, "containerStatuses": [running("c0", 0), terminated("c1", "Completed", 0, 0)]}),
                ),
                "1/2",
                "NotReady",
                0,
            ),
            (
                "evicted",
                pod(
                    1,
                    json!({"phase": "Failed", "reason": "Evicted", "message": "The node was low on resource: memory."}),
                ),
                "0/1",
                "Evicted",
                0,
            ),
            (
                "terminating",
                {
                    let mut p = pod(
                        1,
                        json!({"phase": "Running", "conditions": ready, "containerStatuses": [running("c0", 2)]}),
                    );
                    p["metadata"]["deletionTimestamp"] = json!(NOW);
                    p
                },
                "1/1",
                "Terminating",
                2,
            ),
            (
                "node lost",
                {
                    let mut p = pod(
                        1,
                        json!({"phase": "Running", "reason": "NodeLost", "containerStatuses": [running("c0", 0)]}),
                    );
                    p["metadata"]["deletionTimestamp"] = json!(NOW);
                    p
                },
                "1/1",
                "Unknown",
                0,
            ),
            (
                "init running",
                with_init(
                    pod(
                        1,
                        json!({"phase": "Pending", "initContainerStatuses": [{"name": "i0", "restartCount": 0, "state": {"running": {}}}], "containerStatuses": [waiting("c0", "PodInitializing", 0)]}),
                    ),
                    1,
                ),
                "0/1",
                "Init:0/1",
                0,
            ),
            (
                "init waiting to initialize",
                with_init(
                    pod(
                        1,
                        json!({"phase": "Pending", "initContainerStatuses": [
                            {"name": "i0", "restartCount": 0, "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}},
                            {"name": "i1", "restartCount": 0, "state": {"waiting": {"reason": "PodInitializing"}}},
                        ]}),
                    ),
                    2,
                ),
                "0/1",
                "Init:1/2",
                0,
            ),
            (
                "init crash loop",
                with_init(
                    pod(
                        1,
                        json!({"phase": "Pending", "initContainerStatuses": [{"name": "i0", "restartCount": 3, "state": {"waiting": {"reason": "CrashLoopBackOff"}}}], "containerStatuses": [waiting("c0", "PodInitializing", 0)]}),
                    ),
                    1,
                ),
                "0/1",
                "Init:CrashLoopBackOff",
                3,
            ),
            (
                "init failed",
                with_init(
                    pod(
                        1,
                        json!({"phase": "Pending", "initContainerStatuses": [{"name": "i0", "restartCount": 1, "state": {"terminated": {"exitCode": 1, "reason": "Error"}}}]}),
                    ),
                    1,
                ),
                "0/1",
                "Init:Error",
                1,
            ),
            (
                "init exit code",
                with_init(
                    pod(
                        1,
                        json!({"phase": "Pending", "initContainerStatuses": [{"name": "i0", "restartCount": 0, "state": {"terminated": {"exitCode": 3}}}]}),
                    ),
                    1,
                ),
                "0/1",
                "Init:ExitCode:3",
                0,
            ),
            (
                "init signal",
                with_init(
                    pod(
                        1,
                        json!({"phase": "Pending", "initContainerStatuses": [{"name": "i0", "restartCount": 0, "state": {"terminated": {"exitCode": 137, "signal": 9}}}]}),
                    ),
                    1,
                ),
                "0/1",
                "Init:Signal:9",
                0,
            ),
            (
                "initialized: init restarts no longer count",
                with_init(
                    pod(
                        1,
                        json!({"phase": "Running", "conditions": ready, "initContainerStatuses": [{"name": "i0", "restartCount": 4, "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}}], "containerStatuses": [running("c0", 1)]}),
                    ),
                    1,
                ),
                "1/1",
                "Running",
                1,
            ),
            (
                "not ready yet",
                pod(
                    1,
                    json!({"phase": "Running", "conditions": unready, "containerStatuses": [{"name": "c0", "ready": false, "restartCount": 0, "state": {"running": {}}}]}),
                ),
                "0/1",
                "Running",
                0,
            ),
            ("empty", json!({}), "0/0", "", 0),
        ];
        for (case, p, ready, status, restarts) in cases {
            let cells = cells("", "pods", &p);
            assert_eq!(cells[1], json!(ready), "{case}: READY");
            assert_eq!(cells[2], json!(status), "{case}: STATUS");
            assert_eq!(cells[3], json!(restarts.to_string()), "{case}: RESTARTS");
        }
    }

    #[test]
    fn pod_cells() {
        let full = json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": meta("coredns-74ff55c5b-x2k8q"),
            "spec": {
                "containers": [{"name": "coredns", "image": "k8s.gcr.io/coredns:1.7.0"}],
                "nodeName": "kind-control-plane",
                "readinessGates": [{"conditionType": "example.com/lb"}, {"conditionType": "example.com/dns"}],
            },
            "status": {
                "phase": "Running",
                "podIP": "10.244.0.3",
                "podIPs": [{"ip": "10.244.0.3"}, {"ip": "fd00::3"}],
                "nominatedNodeName": "kind-worker",
                "conditions": [
                    {"type": "Ready", "status": "True"},
                    {"type": "example.com/lb", "status": "True"},
                    {"type": "example.com/dns", "status": "False"},
                    {"type": "example.com/lb", "status": "False"},
                ],
                "containerStatuses": [running("coredns", 1)],
            },
        });
        let bare = json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c"}]}, "status": {"phase": "Pending", "podIP": ""}});
        let legacy_ip = json!({"metadata": {"name": "p"}, "status": {"podIP": "10.1.1.1"}});
        let cases: Vec<(Value, Value)> = vec![
            (
                full,
                json!([
                    "coredns-74ff55c5b-x2k8q",
                    "1/1",
                    "Running",
                    "1",
                    "4m30s",
                    "10.244.0.3",
                    "kind-control-plane",
                    "kind-worker",
                    "1/2"
                ]),
            ),
            (
                bare,
                json!([
                    "p",
                    "0/1",
                    "Pending",
                    "0",
                    "<unknown>",
                    "<none>",
                    "<none>",
                    "<none>",
                    "<none>"
                ]),
            ),
            (
                legacy_ip,
                json!([
                    "p",
                    "0/0",
                    "",
                    "0",
                    "<unknown>",
                    "10.1.1.1",
                    "<none>",
                    "<none>",
                    "<none>"
                ]),
            ),
        ];
        for (obj, want) in cases {
            assert_eq!(json!(cells("", "pods", &obj)), want, "{obj}");
        }
    }

    #[test]
    fn columns() {
        /// (name, type, priority)
        type Col = (&'static str, &'static str, i64);
        let cases: &[(&str, &str, &[Col])] = &[
            (
                "",
                "secrets",
                &[
                    ("Name", "string", 0),
                    ("Type", "string", 0),
                    ("Data", "string", 0),
                    ("Age", "string", 0),
                ],
            ),
            (
                "",
                "configmaps",
                &[
                    ("Name", "string", 0),
                    ("Data", "string", 0),
                    ("Age", "string", 0),
                ],
            ),
            (
                "",
                "namespaces",
                &[
                    ("Name", "string", 0),
                    ("Status", "string", 0),
                    ("Age", "string", 0),
                ],
            ),
            (
                "",
                "services",
                &[
                    ("Name", "string", 0),
                    ("Type", "string", 0),
                    ("Cluster-IP", "string", 0),
                    ("External-IP", "string", 0),
                    ("Port(s)", "string", 0),
                    ("Age", "string", 0),
                    ("Selector", "string", 1),
                ],
            ),
            (
                "",
                "endpoints",
                &[
                    ("Name", "string", 0),
                    ("Endpoints", "string", 0),
                    ("Age", "string", 0),
                ],
            ),
            (
                "",
                "pods",
                &[
                    ("Name", "string", 0),
                    ("Ready", "string", 0),
                    ("Status", "string", 0),
                    ("Restarts", "string", 0),
                    ("Age", "string", 0),
                    ("IP", "string", 1),
                    ("Node", "string", 1),
                    ("Nominated Node", "string", 1),
                    ("Readiness Gates", "string", 1),
                ],
            ),
            (
                "apps",
                "deployments",
                &[("Name", "string", 0), ("Created At", "date", 0)],
            ),
            // Same plural in another group is not the core printer.
            (
                "example.com",
                "pods",
                &[("Name", "string", 0), ("Created At", "date", 0)],
            ),
        ];
        for &(group, resource, want) in cases {
            let printer = Printer::for_resource(group, resource);
            let defs = printer.column_definitions();
            let defs = defs.as_array().expect("array");
            let got: Vec<(&str, &str, i64)> = defs
                .iter()
                .map(|d| {
                    (
                        d["name"].as_str().unwrap_or_default(),
                        d["type"].as_str().unwrap_or_default(),
                        d["priority"].as_i64().unwrap_or(-1),
                    )
                })
                .collect();
            assert_eq!(got, want, "{group}/{resource}");
            for (i, d) in defs.iter().enumerate() {
                let format = if i == 0 { "name" } else { "" };
                assert_eq!(d["format"], format, "{group}/{resource} {}", d["name"]);
            }
            // Every row fills every column.
            let obj = json!({"metadata": meta("x")});
            assert_eq!(
                printer.print(&obj, now()).0.len(),
                defs.len(),
                "{group}/{resource}"
            );
        }
    }

    #[test]
    fn table_shape() {
        let secret =
            json!({"apiVersion": "v1", "kind": "Secret", "metadata": meta("s"), "type": "Opaque"});
        let list_meta = json!({"resourceVersion": "42", "continue": "tok"});
        let cases: &[(TableVersion, IncludeObject, Option<Value>)] = &[
            (
                TableVersion::V1,
                IncludeObject::Metadata,
                Some(
                    json!({"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": meta("s")}),
                ),
            ),
            (
                TableVersion::V1Beta1,
                IncludeObject::Metadata,
                Some(
                    json!({"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1beta1", "metadata": meta("s")}),
                ),
            ),
            (
                TableVersion::V1,
                IncludeObject::Object,
                Some(secret.clone()),
            ),
            (TableVersion::V1, IncludeObject::None, None),
        ];
        for (version, include, object) in cases {
            let t = to_table(
                *version,
                &Printer::for_resource("", "secrets").column_definitions(),
                "",
                "secrets",
                &[&secret],
                list_meta.clone(),
                *include,
                now(),
            );
            assert_eq!(t["kind"], "Table");
            assert_eq!(t["apiVersion"], version.api_version());
            assert_eq!(t["metadata"], list_meta);
            assert_eq!(t["columnDefinitions"].as_array().map(Vec::len), Some(4));
            assert_eq!(t["rows"][0]["cells"], json!(["s", "Opaque", 0, "4m30s"]));
            assert_eq!(
                t["rows"][0].get("object"),
                object.as_ref(),
                "{version:?} {include:?}"
            );
            assert!(t["rows"][0].get("conditions").is_none());
        }

        // An empty list is still a Table with its columns.
        let t = to_table(
            TableVersion::V1,
            &Printer::for_resource("", "pods").column_definitions(),
            "",
            "pods",
            &[],
            json!({"resourceVersion": "1"}),
            IncludeObject::Metadata,
            now(),
        );
        assert_eq!(t["rows"], json!([]));
        assert_eq!(t["columnDefinitions"].as_array().map(Vec::len), Some(9));
        let t = to_table(
            TableVersion::V1,
            &Printer::for_resource("", "pods").column_definitions(),
            "",
            "pods",
            &[],
            Value::Null,
            IncludeObject::None,
            now(),
        );
        assert_eq!(t["metadata"], json!({}));

        // Finished pods carry the printer's row conditions.
        let done = pod(
            1,
            json!({"phase": "Succeeded", "containerStatuses": [terminated("c0", "Completed", 0, 0)]}),
        );
        let failed = pod(1, json!({"phase": "Failed"}));
        let t = to_table(
            TableVersion::V1,
            &Printer::for_resource("", "pods").column_definitions(),
            "",
            "pods",
            &[&done, &failed],
            json!({}),
            IncludeObject::None,
            now(),
        );
        assert_eq!(
            t["rows"][0]["conditions"],
            json!([{"type": "Completed", "status": "True", "reason": "Succeeded", "message": "The pod has completed successfully."}])
        );
        assert_eq!(t["rows"][1]["conditions"][0]["reason"], "Failed");
        assert_eq!(t["rows"][1]["conditions"][0]["message"], "The pod failed.");
    }
}
