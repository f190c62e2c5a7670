//! `as=Table` answers for `kubectl get`: the default columns kube-apiserver 1.20 prints
//! for the default cached resources, and Name/Created At for anything else.

use serde_json::{json, Value};
use thiserror::Error;

#[derive(Debug, Error, PartialEq, Eq)]
pub enum Error {
    #[error("invalid includeObject {0:?}: supported values: None, Metadata, Object")]
    InvalidIncludeObject(String),
}

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

/// One media range of an Accept header, lower-cased.
struct Range {
    mime: String,
    params: Vec<(String, String)>,
}

fn ranges(accept: &str) -> Vec<Range> {
    accept
        .split(',')
        .filter_map(|r| {
            let mut parts = r.split(';');
            let mime = parts.next()?.trim().to_ascii_lowercase();
            let params = parts
                .filter_map(|p| {
                    let (k, v) = p.split_once('=')?;
                    Some((k.trim().to_ascii_lowercase(), v.trim().to_string()))
                })
                .collect();
            (!mime.is_empty()).then_some(Range { mime, params })
        })
        .collect()
}

fn is_json_like(mime: &str) -> bool {
    matches!(mime, "application/json" | "*/*" | "application/*")
}

fn table_of(r: &Range) -> Option<Option<TableVersion>> {
    let get = |k: &str| {
        r.params
            .iter()
            .find(|(pk, _)| pk == k)
            .map(|(_, v)| v.as_str())
    };
    match get("as") {
        None => Some(None),
        Some("Table") if get("g") == Some("meta.k8s.io") => match get("v") {
            Some("v1") => Some(Some(TableVersion::V1)),
            Some("v1beta1") => Some(Some(TableVersion::V1Beta1)),
            _ => None,
        },
        // Other `as=` forms (PartialObjectMetadata…) are not served from the cache.
        Some(_) => None,
    }
}

/// The Table version asked for, when the first servable range is a Table.
pub fn table_version(accept: &str) -> Option<TableVersion> {
    ranges(accept)
        .iter()
        .filter(|r| is_json_like(&r.mime))
        .find_map(table_of)
        .flatten()
}

/// False only when the header allows nothing kcache can send (JSON or Table-as-JSON).
pub fn accepts_json(accept: &str) -> bool {
    if accept.trim().is_empty() {
        return true;
    }
    ranges(accept)
        .iter()
        .any(|r| is_json_like(&r.mime) && table_of(r).is_some())
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum IncludeObject {
    None,
    #[default]
    Metadata,
    Object,
}

impl IncludeObject {
    pub fn parse(s: Option<&str>) -> Result<Self, Error> {
        match s {
            None | Some("") | Some("Metadata") => Ok(IncludeObject::Metadata),
            Some("None") => Ok(IncludeObject::None),
            Some("Object") => Ok(IncludeObject::Object),
            Some(o) => Err(Error::InvalidIncludeObject(o.to_string())),
        }
    }
}

/// k8s.io/apimachinery's `duration.HumanDuration`.
pub fn human_duration(secs: i64) -> String {
    if secs < -1 {
        return "<invalid>".into();
    }
    let s = secs.max(0);
    if s < 60 * 2 {
        return format!("{s}s");
    }
    let m = s / 60;
    if m < 10 {
        let rem = s % 60;
        return if rem == 0 {
            format!("{m}m")
        } else {
            format!("{m}m{rem}s")
        };
    }
    if m < 60 * 3 {
        return format!("{m}m");
    }
    let h = s / 3600;
    if h < 8 {
        let rem = (s % 3600) / 60;
        return if rem == 0 {
            format!("{h}h")
        } else {
            format!("{h}h{rem}m")
        };
    }
    if h < 48 {
        return format!("{h}h");
    }
    if h < 24 * 8 {
        let d = h / 24;
        let rem = h % 24;
        return if rem == 0 {
            format!("{d}d")
        } else {
            format!("{d}d{rem}h")
        };
    }
    if h < 24 * 365 * 2 {
        return format!("{}d", h / 24);
    }
    if h < 24 * 365 * 8 {
        let y = h / (24 * 365);
        let d = (h / 24) % 365;
        return if d == 0 {
            format!("{y}y")
        } else {
            format!("{y}y{d}d")
        };
    }
    format!("{}y", h / (24 * 365))
}

/// Seconds since the Unix epoch of an RFC 3339 UTC timestamp (`2026-11-22T12:00:00Z`).
fn parse_time(s: &str) -> Option<i64> {
    let b = s.as_bytes();
    if b.len() < 20 {
        return None;
    }
    let n = |r: std::ops::Range<usize>| s.get(r)?.parse::<i64>().ok();
    let (y, mo, d, h, mi, se) = (
        n(0..4)?,
        n(5..7)?,
        n(8..10)?,
        n(11..13)?,
        n(14..16)?,
        n(17..19)?,
    );
    // Days from civil (Howard Hinnant's algorithm).
    let y2 = if mo <= 2 { y - 1 } else { y };
    let era = y2.div_euclid(400);
    let yoe = y2 - era * 400;
    let mp = (mo + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some(days * 86_400 + h * 3600 + mi * 60 + se)
}

fn age(obj: &Value, now: i64) -> String {
    obj.pointer("/metadata/creationTimestamp")
        .and_then(Value::as_str)
        .and_then(parse_time)
        .map(|t| human_duration(now - t))
        .unwrap_or_else(|| "<unknown>".into())
}

fn s<'a>(obj: &'a Value, ptr: &str) -> &'a str {
    obj.pointer(ptr).and_then(Value::as_str).unwrap_or("")
}

fn or_none(v: &str) -> String {
    if v.is_empty() {
        "<none>".into()
    } else {
        v.to_string()
    }
}

fn col(name: &str, ty: &str, format: &str, desc: &str, priority: i64) -> Value {
    json!({"name": name, "type": ty, "format": format, "description": desc, "priority": priority})
}

const NAME_DESC: &str = "Name must be unique within a namespace. Is required when creating resources, although some resources may allow a client to request the generation of an appropriate name automatically. Name is primarily intended for creation idempotence and configuration definition. Cannot be updated. More info: http://kubernetes.io/docs/user-guide/identifiers#names";
const AGE_DESC: &str = "CreationTimestamp is a timestamp representing the server time when this object was created. It is not guaranteed to be set in happens-before order across separate operations. Clients may not set this value. It is represented in RFC3339 form and is in UTC.\n\nPopulated by the system. Read-only. Null for lists. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#metadata";

fn columns(group: &str, resource: &str) -> Vec<Value> {
    let name = col("Name", "string", "name", NAME_DESC, 0);
    let age = col("Age", "string", "", AGE_DESC, 0);
    match (group, resource) {
        ("", "secrets") => vec![
            name,
            col("Type", "string", "", "Used to facilitate programmatic handling of secret data.", 0),
            col("Data", "string", "", "Data contains the secret data. Each key must consist of alphanumeric characters, '-', '_' or '.'. The serialized form of the secret data is a base64 encoded string, representing the arbitrary (possibly non-string) data value here. Described in https://tools.ietf.org/html/rfc4648#section-4", 0),
            age,
        ],
        ("", "configmaps") => vec![
            name,
            col("Data", "string", "", "Data contains the configuration data. Each key must consist of alphanumeric characters, '-', '_' or '.'. Values with non-UTF-8 byte sequences must use the BinaryData field. The keys stored in Data must not overlap with the keys in the BinaryData field, this is enforced during validation process.", 0),
            age,
        ],
        ("", "namespaces") => vec![
            name,
            col("Status", "string", "", "The status of the namespace", 0),
            age,
        ],
        ("", "services") => vec![
            name,
            col("Type", "string", "", "type determines how the Service is exposed. Defaults to ClusterIP. Valid options are ExternalName, ClusterIP, NodePort, and LoadBalancer.", 0),
            col("Cluster-IP", "string", "", "clusterIP is the IP address of the service and is usually assigned randomly by the master.", 0),
            col("External-IP", "string", "", "externalIPs is a list of IP addresses for which nodes in the cluster will also accept traffic for this service.", 0),
            col("Port(s)", "string", "", "The list of ports that are exposed by this service.", 0),
            age,
            col("Selector", "string", "", "Route service traffic to pods with label keys and values matching this selector.", 1),
        ],
        ("", "endpoints") => vec![
            name,
            col("Endpoints", "string", "", "Endpoints is the list of endpoints in the Endpoints object.", 0),
            age,
        ],
        ("", "pods") => vec![
            name,
            col("Ready", "string", "", "The aggregate readiness state of this pod for accepting traffic.", 0),
            col("Status", "string", "", "The aggregate status of the containers in this pod.", 0),
            col("Restarts", "integer", "", "The number of times the containers in this pod have been restarted.", 0),
            age,
            col("IP", "string", "", "IP address allocated to the pod. Routable at least within the cluster. Empty if not yet allocated.", 1),
            col("Node", "string", "", "Name of the Node the Pod is assigned to.", 1),
            col("Nominated Node", "string", "", "Name of the node this Pod is nominated to.", 1),
            col("Readiness Gates", "string", "", "Readiness Gates of the Pod.", 1),
        ],
        _ => vec![name, col("Created At", "date", "", AGE_DESC, 0)],
    }
}

fn count(obj: &Value, ptr: &str) -> i64 {
    obj.pointer(ptr)
        .and_then(Value::as_object)
        .map_or(0, |m| m.len() as i64)
}

fn service_ports(obj: &Value) -> String {
    let ports: Vec<String> = obj
        .pointer("/spec/ports")
        .and_then(Value::as_array)
        .map(|ps| {
            ps.iter()
                .map(|p| {
                    let port = p["port"].as_i64().unwrap_or(0);
                    let proto = p["protocol"].as_str().unwrap_or("TCP");
                    match p["nodePort"].as_i64() {
                        Some(np) if np != 0 => format!("{port}:{np}/{proto}"),
                        _ => format!("{port}/{proto}"),
                    }
                })
                .collect()
        })
        .unwrap_or_default();
    if ports.is_empty() {
        "<none>".into()
    } else {
        ports.join(",")
    }
}

fn endpoints(obj: &Value) -> String {
    let mut list = Vec::new();
    let mut total = 0;
    for subset in obj
        .pointer("/subsets")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let ports: Vec<i64> = subset["ports"]
            .as_array()
            .map(|p| p.iter().filter_map(|x| x["port"].as_i64()).collect())
            .unwrap_or_default();
        for addr in subset["addresses"].as_array().into_iter().flatten() {
            let ip = addr["ip"].as_str().unwrap_or("");
            if ports.is_empty() {
                total += 1;
                if list.len() < 3 {
                    list.push(ip.to_string());
                }
            }
            for p in &ports {
                total += 1;
                if list.len() < 3 {
                    list.push(format!("{ip}:{p}"));
                }
            }
        }
    }
    if list.is_empty() {
        return "<none>".into();
    }
    let mut out = list.join(",");
    if total > list.len() {
        out.push_str(&format!(" + {} more...", total - list.len()));
    }
    out
}

/// The Status column as the 1.20 pod printer derives it.
pub fn pod_status(pod: &Value) -> String {
    let mut reason = s(pod, "/status/reason").to_string();
    if reason.is_empty() {
        reason = s(pod, "/status/phase").to_string();
    }
    let inits = pod
        .pointer("/status/initContainerStatuses")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let n_init = pod
        .pointer("/spec/initContainers")
        .and_then(Value::as_array)
        .map_or(0, Vec::len);
    let mut initializing = false;
    for (i, c) in inits.iter().enumerate() {
        let term = &c["state"]["terminated"];
        let waiting = &c["state"]["waiting"];
        if term.is_object() && term["exitCode"].as_i64() == Some(0) {
            continue;
        }
        reason = if term.is_object() {
            match term["reason"].as_str() {
                Some(r) if !r.is_empty() => format!("Init:{r}"),
                _ => match term["signal"].as_i64() {
                    Some(sig) if sig != 0 => format!("Init:Signal:{sig}"),
                    _ => format!("Init:ExitCode:{}", term["exitCode"].as_i64().unwrap_or(0)),
                },
            }
        } else if waiting["reason"]
            .as_str()
            .is_some_and(|r| !r.is_empty() && r != "PodInitializing")
        {
            format!("Init:{}", waiting["reason"].as_str().unwrap_or(""))
        } else {
            format!("Init:{i}/{n_init}")
        };
        initializing = true;
        break;
    }
    if !initializing {
        let mut has_running = false;
        let statuses = pod
            .pointer("/status/containerStatuses")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        for c in statuses.iter().rev() {
            let st = &c["state"];
            if let Some(r) = st["waiting"]["reason"].as_str().filter(|r| !r.is_empty()) {
                reason = r.to_string();
            } else if st["terminated"].is_object() {
                reason = match st["terminated"]["reason"]
                    .as_str()
                    .filter(|r| !r.is_empty())
                {
                    Some(r) => r.to_string(),
                    None => match st["terminated"]["signal"].as_i64() {
                        Some(sig) if sig != 0 => format!("Signal:{sig}"),
                        _ => format!(
                            "ExitCode:{}",
                            st["terminated"]["exitCode"].as_i64().unwrap_or(0)
                        ),
                    },
                };
            } else if st["running"].is_object() && c["ready"].as_bool() == Some(true) {
                has_running = true;
            }
        }
        if reason == "Completed" && has_running {
            reason = "Running".into();
        }
    }
    if pod
        .pointer("/metadata/deletionTimestamp")
        .is_some_and(|v| !v.is_null())
    {
        reason = if s(pod, "/status/reason") == "NodeLost" {
            "Unknown".into()
        } else {
            "Terminating".into()
        };
    }
    reason
}

fn cells(group: &str, resource: &str, obj: &Value, now: i64) -> Vec<Value> {
    let name = json!(s(obj, "/metadata/name"));
    match (group, resource) {
        ("", "secrets") => vec![
            name,
            json!(s(obj, "/type")),
            json!(count(obj, "/data")),
            json!(age(obj, now)),
        ],
        ("", "configmaps") => vec![
            name,
            json!(count(obj, "/data") + count(obj, "/binaryData")),
            json!(age(obj, now)),
        ],
        ("", "namespaces") => vec![name, json!(s(obj, "/status/phase")), json!(age(obj, now))],
        ("", "services") => {
            let ty = s(obj, "/spec/type");
            let external: Vec<String> = obj
                .pointer("/spec/externalIPs")
                .and_then(Value::as_array)
                .map(|a| {
                    a.iter()
                        .filter_map(|v| v.as_str().map(str::to_string))
                        .collect()
                })
                .unwrap_or_default();
            let lb: Vec<String> = obj
                .pointer("/status/loadBalancer/ingress")
                .and_then(Value::as_array)
                .map(|a| {
                    a.iter()
                        .filter_map(|v| {
                            v["ip"]
                                .as_str()
                                .or(v["hostname"].as_str())
                                .map(str::to_string)
                        })
                        .collect()
                })
                .unwrap_or_default();
            let ext = match ty {
                "ExternalName" => s(obj, "/spec/externalName").to_string(),
                "LoadBalancer" if lb.is_empty() && external.is_empty() => "<pending>".into(),
                _ => {
                    let all: Vec<String> = lb.into_iter().chain(external).collect();
                    if all.is_empty() {
                        "<none>".into()
                    } else {
                        all.join(",")
                    }
                }
            };
            let selector = obj
                .pointer("/spec/selector")
                .and_then(Value::as_object)
                .map(|m| {
                    let mut v: Vec<String> = m
                        .iter()
                        .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or("")))
                        .collect();
                    v.sort();
                    v.join(",")
                })
                .filter(|s| !s.is_empty())
                .unwrap_or_else(|| "<none>".into());
            vec![
                name,
                json!(ty),
                json!(or_none(s(obj, "/spec/clusterIP"))),
                json!(ext),
                json!(service_ports(obj)),
                json!(age(obj, now)),
                json!(selector),
            ]
        }
        ("", "endpoints") => vec![name, json!(endpoints(obj)), json!(age(obj, now))],
        ("", "pods") => {
            let statuses = obj
                .pointer("/status/containerStatuses")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            let total = obj
                .pointer("/spec/containers")
                .and_then(Value::as_array)
                .map_or(0, Vec::len);
            let ready = statuses
                .iter()
                .filter(|c| c["ready"].as_bool() == Some(true))
                .count();
            let restarts: i64 = statuses
                .iter()
                .filter_map(|c| c["restartCount"].as_i64())
                .sum();
            let gates = obj
                .pointer("/spec/readinessGates")
                .and_then(Value::as_array)
                .map_or(0, Vec::len);
            let gates = if gates == 0 {
                "<none>".to_string()
            } else {
                let ok = obj
                    .pointer("/status/conditions")
                    .and_then(Value::as_array)
                    .map_or(0, |cs| {
                        cs.iter()
                            .filter(|c| {
                                c["status"] == "True"
                                    && obj["spec"]["readinessGates"].as_array().is_some_and(|g| {
                                        g.iter().any(|g| g["conditionType"] == c["type"])
                                    })
                            })
                            .count()
                    });
                format!("{ok}/{gates}")
            };
            vec![
                name,
                json!(format!("{ready}/{total}")),
                json!(pod_status(obj)),
                json!(restarts),
                json!(age(obj, now)),
                json!(or_none(s(obj, "/status/podIP"))),
                json!(or_none(s(obj, "/spec/nodeName"))),
                json!(or_none(s(obj, "/status/nominatedNodeName"))),
                json!(gates),
            ]
        }
        _ => vec![name, json!(s(obj, "/metadata/creationTimestamp"))],
    }
}

fn row_object(obj: &Value, include: IncludeObject) -> Option<Value> {
    match include {
        IncludeObject::None => None,
        IncludeObject::Object => Some(obj.clone()),
        IncludeObject::Metadata => Some(json!({
            "kind": "PartialObjectMetadata",
            "apiVersion": "meta.k8s.io/v1",
            "metadata": obj.get("metadata").cloned().unwrap_or(json!({})),
        })),
    }
}

pub fn to_table(
    version: TableVersion,
    group: &str,
    resource: &str,
    objects: &[&Value],
    list_meta: Value,
    include: IncludeObject,
    now: i64,
) -> Value {
    let rows: Vec<Value> = objects
        .iter()
        .map(|o| {
            let mut row = json!({ "cells": cells(group, resource, o, now) });
            if let Some(obj) = row_object(o, include) {
                row["object"] = obj;
            }
            row
        })
        .collect();
    json!({
        "kind": "Table",
        "apiVersion": version.api_version(),
        "metadata": list_meta,
        "columnDefinitions": columns(group, resource),
        "rows": rows,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const KUBECTL: &str = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json";

    #[test]
    fn accept_headers() {
        assert_eq!(table_version(KUBECTL), Some(TableVersion::V1));
        assert_eq!(
            table_version("application/json;as=Table;v=v1beta1;g=meta.k8s.io"),
            Some(TableVersion::V1Beta1)
        );
        assert_eq!(table_version("application/json"), None);
        assert_eq!(table_version(""), None);
        assert_eq!(table_version("*/*"), None);
        assert!(accepts_json(KUBECTL));
        assert!(accepts_json(""));
        assert!(accepts_json("*/*"));
        assert!(accepts_json(
            "application/vnd.kubernetes.protobuf, application/json"
        ));
        assert!(!accepts_json("application/vnd.kubernetes.protobuf"));
        assert!(!accepts_json(
            "application/json;as=PartialObjectMetadata;v=v1;g=meta.k8s.io"
        ));
    }

    #[test]
    fn human_durations() {
        let cases = [
            (0, "0s"),
            (119, "119s"),
            (120, "2m"),
            (125, "2m5s"),
            (600, "10m"),
            (3 * 3600 - 1, "179m"),
            (3 * 3600, "3h"),
            (3 * 3600 + 120, "3h2m"),
            (8 * 3600, "8h"),
            (47 * 3600, "47h"),
            (48 * 3600, "2d"),
            (50 * 3600, "2d2h"),
            (8 * 86400, "8d"),
            (2 * 365 * 86400, "2y"),
            (2 * 365 * 86400 + 86400, "2y1d"),
            (9 * 365 * 86400, "9y"),
            (-5, "<invalid>"),
        ];
        for (secs, want) in cases {
            assert_eq!(human_duration(secs), want, "{secs}");
        }
    }

    #[test]
    fn timestamps() {
        assert_eq!(parse_time("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(parse_time("2000-03-01T00:00:01Z"), Some(951_868_801));
        assert_eq!(parse_time("garbage"), None);
    }

    #[test]
    fn resource_cells() {
        let now = parse_time("2026-11-22T12:00:00Z").expect("time");
        let created = "2026-11-22T11:59:00Z";
        let secret = json!({"metadata": {"name": "s", "creationTimestamp": created}, "type": "Opaque", "data": {"a": "", "b": ""}});
        assert_eq!(
            cells("", "secrets", &secret, now),
            vec![json!("s"), json!("Opaque"), json!(2), json!("60s")]
        );
        let cm = json!({"metadata": {"name": "c", "creationTimestamp": created}, "data": {"a": ""}, "binaryData": {"b": ""}});
        assert_eq!(cells("", "configmaps", &cm, now)[1], json!(2));
        let ns = json!({"metadata": {"name": "n", "creationTimestamp": created}, "status": {"phase": "Active"}});
        assert_eq!(cells("", "namespaces", &ns, now)[1], json!("Active"));
        let svc = json!({"metadata": {"name": "k"}, "spec": {"type": "NodePort", "clusterIP": "10.0.0.1", "ports": [{"port": 80, "nodePort": 30080, "protocol": "TCP"}], "selector": {"app": "x"}}});
        let c = cells("", "services", &svc, now);
        assert_eq!(
            c[1..5],
            [
                json!("NodePort"),
                json!("10.0.0.1"),
                json!("<none>"),
                json!("80:30080/TCP")
            ]
        );
        assert_eq!(c[6], json!("app=x"));
        let ep = json!({"metadata": {"name": "e"}, "subsets": [{"addresses": [{"ip": "1.1.1.1"}, {"ip": "2.2.2.2"}], "ports": [{"port": 80}, {"port": 443}]}]});
        assert_eq!(
            cells("", "endpoints", &ep, now)[1],
            json!("1.1.1.1:80,1.1.1.1:443,2.2.2.2:80 + 1 more...")
        );
        let other = json!({"metadata": {"name": "d", "creationTimestamp": created}});
        assert_eq!(
            cells("apps", "deployments", &other, now),
            vec![json!("d"), json!(created)]
        );
    }

    #[test]
    fn pod_statuses() {
        let cases = [
            (
                json!({"status": {"phase": "Running", "containerStatuses": [{"ready": true, "state": {"running": {}}}]}}),
                "Running",
            ),
            (
                json!({"status": {"phase": "Pending", "containerStatuses": [{"state": {"waiting": {"reason": "ContainerCreating"}}}]}}),
                "ContainerCreating",
            ),
            (
                json!({"status": {"phase": "Running", "containerStatuses": [{"state": {"waiting": {"reason": "CrashLoopBackOff"}}}]}}),
                "CrashLoopBackOff",
            ),
            (
                json!({"status": {"phase": "Succeeded", "containerStatuses": [{"state": {"terminated": {"reason": "Completed", "exitCode": 0}}}]}}),
                "Completed",
            ),
            (
                json!({"metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z"}, "status": {"phase": "Running"}}),
                "Terminating",
            ),
            (
                json!({"spec": {"initContainers": [{}]}, "status": {"phase": "Pending", "initContainerStatuses": [{"state": {"running": {}}}]}}),
                "Init:0/1",
            ),
            (json!({"status": {"phase": "Pending"}}), "Pending"),
        ];
        for (pod, want) in cases {
            assert_eq!(pod_status(&pod), want, "{pod}");
        }
    }

    #[test]
    fn table_shape() {
        let o = json!({"metadata": {"name": "s", "uid": "u"}, "type": "Opaque"});
        let t = to_table(
            TableVersion::V1,
            "",
            "secrets",
            &[&o],
            json!({"resourceVersion": "5"}),
            IncludeObject::Metadata,
            0,
        );
        assert_eq!(t["kind"], "Table");
        assert_eq!(t["apiVersion"], "meta.k8s.io/v1");
        assert_eq!(t["metadata"]["resourceVersion"], "5");
        assert_eq!(t["columnDefinitions"][0]["format"], "name");
        assert_eq!(t["rows"][0]["object"]["kind"], "PartialObjectMetadata");
        assert_eq!(t["rows"][0]["object"]["metadata"]["uid"], "u");
        let t = to_table(
            TableVersion::V1Beta1,
            "",
            "secrets",
            &[&o],
            json!({}),
            IncludeObject::None,
            0,
        );
        assert!(t["rows"][0].get("object").is_none());
        assert_eq!(
            IncludeObject::parse(Some("Bogus")),
            Err(Error::InvalidIncludeObject("Bogus".into()))
        );
    }
}
