//! A cached object: the JSON bytes the upstream sent, kept as they are, and a small
//! header parsed once from them — everything kcache itself reads of an object.
//!
//! The API server's `cachingObject` serialises an object once per encoding and shares the
//! bytes with every watcher. kcache goes one step further: it never re-serialises an object
//! at all. Stores, windows, lists, initial events, gets and NATS messages hold and
//! concatenate these bytes; filters, selectors, relist diffs and store keys read the
//! header (namespace, name, uid, resourceVersion, labels, the resource's selectable
//! fields). Only a `Table` response parses an object again.
//!
//! The header is read strictly where kcache makes decisions on it. An object in which any
//! key the header reads appears twice, or has the wrong type, is refused: clients would
//! read such an object differently from one another (Go keeps the last value or merges,
//! serde refuses it), so kcache must not decide for them which reading a filter sees. The
//! API server never sends one; a hostile upstream could. Everything the header does not
//! read is only checked to be JSON and forwarded byte for byte (numbers in exponent form,
//! escapes and unicode stay exactly as sent).

use std::borrow::Cow;
use std::sync::OnceLock;

use bytes::{BufMut, Bytes, BytesMut};
use serde::de::{self, Deserialize, Deserializer, MapAccess, Visitor};
use serde::Deserialize as DeriveDeserialize;
use serde_json::value::RawValue;
use serde_json::Value;
use thiserror::Error;

use crate::core::list_stream::ListSplitter;

#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum Error {
    /// Not JSON, not a JSON object, a duplicated or mistyped header field.
    #[error("invalid object: {0}")]
    Invalid(String),
    /// Offsets are kept as `u32`; etcd's limit is 1.5 MiB per object.
    #[error("object of {0} bytes is larger than kcache handles")]
    TooLarge(usize),
    /// A watch line that is not `{"type":…,"object":…}`.
    #[error("invalid watch event: {0}")]
    Line(String),
    /// A list body without `metadata.resourceVersion` or `items` of objects.
    #[error("invalid list: {0}")]
    List(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Which selectable fields a resource's objects carry, beyond `metadata.name` and
/// `metadata.namespace` (kube-apiserver 1.20's field label conversion functions for the
/// resources kcache serves field selectors of, see `selector::label_support`). Other
/// resources are read for their metadata only, so nothing in their `spec` or `status`
/// can make kcache refuse an object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Schema {
    Generic,
    Pod,
    Secret,
    ConfigMap,
    Namespace,
}

impl Schema {
    pub fn of(group: &str, resource: &str) -> Self {
        match (group, resource) {
            ("", "pods") => Schema::Pod,
            ("", "secrets") => Schema::Secret,
            ("", "configmaps") => Schema::ConfigMap,
            ("", "namespaces") => Schema::Namespace,
            _ => Schema::Generic,
        }
    }
}

/// A selectable field kept in the header (`metadata.*` are the header's own).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Field {
    NodeName,
    RestartPolicy,
    SchedulerName,
    ServiceAccountName,
    Phase,
    PodIp,
    NominatedNodeName,
    Type,
}

impl Field {
    fn from_label(label: &str) -> Option<Self> {
        Some(match label {
            "spec.nodeName" => Field::NodeName,
            "spec.restartPolicy" => Field::RestartPolicy,
            "spec.schedulerName" => Field::SchedulerName,
            "spec.serviceAccountName" => Field::ServiceAccountName,
            "status.phase" => Field::Phase,
            "status.podIP" => Field::PodIp,
            "status.nominatedNodeName" => Field::NominatedNodeName,
            "type" => Field::Type,
            _ => return None,
        })
    }
}

/// One object. Cheap to share behind an `Arc`; the bytes are shared, never copied, when
/// an object is listed, sent or published.
#[derive(Clone, PartialEq, Eq)]
pub struct Object {
    json: Bytes,
    /// Namespace, name and UID in one allocation (an object is held per cached object:
    /// three small allocations would cost more than the strings).
    ids: Box<str>,
    namespace_len: u32,
    name_len: u32,
    rv: u64,
    labels: Labels,
    /// Non-empty selectable field values, sorted by field.
    fields: Box<[(Field, Box<str>)]>,
    /// Where `metadata.resourceVersion`'s JSON value sits in `json` (start, end), to
    /// rewrite it without parsing the object again ([`Object::with_rv`]).
    rv_span: Option<(u32, u32)>,
    immutable: bool,
    proto: ProtoCache,
}

/// The object's protobuf message, encoded when a protobuf client first needs it and kept
/// for every later one (`None`: the schema cannot express this object). Empty for the
/// objects no protobuf client asks for: one pointer's worth of space.
#[derive(Clone, Default)]
struct ProtoCache(OnceLock<Box<Option<Bytes>>>);

/// A cache of the content, not part of it.
impl PartialEq for ProtoCache {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}
impl Eq for ProtoCache {}

impl std::fmt::Debug for Object {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Object")
            .field("namespace", &self.namespace())
            .field("name", &self.name())
            .field("uid", &self.uid())
            .field("rv", &self.rv)
            .field("bytes", &self.json.len())
            .finish()
    }
}

/// The prefixes of a JSON watch line, `{"type":T,"object":`; the line ends with `}\n`.
/// The API server's JSON watch encoder frames events exactly so.
pub const ADDED_PREFIX: &[u8] = b"{\"type\":\"ADDED\",\"object\":";
pub const MODIFIED_PREFIX: &[u8] = b"{\"type\":\"MODIFIED\",\"object\":";
pub const DELETED_PREFIX: &[u8] = b"{\"type\":\"DELETED\",\"object\":";
pub const LINE_SUFFIX: &[u8] = b"}\n";

impl Object {
    /// Parses the header of `json` (one JSON object) for a resource of `schema`; the
    /// bytes are kept as given.
    pub fn parse(json: Bytes, schema: Schema) -> Result<Self> {
        let header = Header::read(&json, schema)?;
        Ok(header.into_object(json))
    }

    /// As [`Object::parse`] for an object taken out of a larger buffer (a list body, a
    /// watch line, a NATS message): the bytes are copied, so the buffer is not kept alive
    /// by the one object. A list item lacks `kind` and `apiVersion`, which watch events
    /// carry; they are inserted (first, as the API server writes them) when missing.
    pub fn parse_copy(raw: &[u8], schema: Schema, kind: &str, api_version: &str) -> Result<Self> {
        let header = Header::read(raw, schema)?;
        let mut insert = Vec::new();
        if !header.has_kind && !kind.is_empty() {
            insert.extend_from_slice(b"\"kind\":");
            write_json_str(&mut insert, kind);
            insert.push(b',');
        }
        if !header.has_api_version && !api_version.is_empty() {
            insert.extend_from_slice(b"\"apiVersion\":");
            write_json_str(&mut insert, api_version);
            insert.push(b',');
        }
        if insert.is_empty() {
            return Ok(header.into_object(Bytes::copy_from_slice(raw)));
        }
        // `raw` is a JSON object (the header parsed it): its first non-blank byte is `{`.
        let open = raw
            .iter()
            .position(|b| *b == b'{')
            .ok_or_else(|| Error::Invalid("not a JSON object".into()))?;
        let rest = &raw[open + 1..];
        if rest.iter().all(|b| b.is_ascii_whitespace() || *b == b'}') {
            // `{}`: no member follows the inserted ones.
            insert.pop();
        }
        let mut out = Vec::with_capacity(raw.len() + insert.len());
        out.extend_from_slice(&raw[..=open]);
        out.extend_from_slice(&insert);
        out.extend_from_slice(rest);
        let shift = insert.len() as u32;
        let mut header = header;
        header.rv_span = header.rv_span.map(|(s, e)| (s + shift, e + shift));
        Ok(header.into_object(Bytes::from(out)))
    }

    /// An object built from a `serde_json::Value` (tests, and objects kcache makes).
    pub fn from_value(schema: Schema, value: &Value) -> Result<Self> {
        let json = serde_json::to_vec(value).map_err(|e| Error::Invalid(e.to_string()))?;
        Self::parse(Bytes::from(json), schema)
    }

    /// The object's JSON, as the upstream sent it.
    pub fn json(&self) -> &Bytes {
        &self.json
    }

    /// The object parsed as a `Value` (a `Table` response reads its columns from it).
    pub fn to_value(&self) -> Value {
        // The bytes parsed as JSON when the header was read.
        serde_json::from_slice(&self.json).unwrap_or(Value::Null)
    }

    pub fn name(&self) -> &str {
        let start = self.namespace_len as usize;
        self.ids
            .get(start..start + self.name_len as usize)
            .unwrap_or("")
    }

    /// "" for a cluster-scoped object.
    pub fn namespace(&self) -> &str {
        self.ids.get(..self.namespace_len as usize).unwrap_or("")
    }

    pub fn uid(&self) -> &str {
        let start = (self.namespace_len + self.name_len) as usize;
        self.ids.get(start..).unwrap_or("")
    }

    /// `metadata.resourceVersion` as a number; 0 when missing or not a number (the API
    /// server's RVs are etcd revisions, decimal integers).
    pub fn rv(&self) -> u64 {
        self.rv
    }

    /// `namespace/name` (or `name` for cluster-scoped objects): the store key, as
    /// client-go's `MetaNamespaceKeyFunc`.
    pub fn key(&self) -> String {
        if self.namespace().is_empty() {
            self.name().to_string()
        } else {
            format!("{}/{}", self.namespace(), self.name())
        }
    }

    /// The label under `key`, `None` when the object has no such label.
    pub fn label(&self, key: &str) -> Option<&str> {
        self.labels.get(key)
    }

    /// Whether the object has any labels (a selector test of an unlabelled object).
    pub fn has_labels(&self) -> bool {
        !self.labels.ends.is_empty()
    }

    /// The value of field label `field` as the API server's field set holds it: "" for an
    /// unset field, and for a label the resource does not have.
    pub fn field(&self, field: &str) -> &str {
        match field {
            "metadata.name" => self.name(),
            "metadata.namespace" => self.namespace(),
            other => match Field::from_label(other) {
                Some(f) => self
                    .fields
                    .binary_search_by(|(k, _)| k.cmp(&f))
                    .ok()
                    .map(|i| self.fields[i].1.as_ref())
                    .unwrap_or(""),
                None => "",
            },
        }
    }

    /// `immutable: true` (ConfigMaps and Secrets).
    pub fn immutable(&self) -> bool {
        self.immutable
    }

    /// A copy with `metadata.resourceVersion` set to `rv`, as the cacheWatcher does for a
    /// DELETED it synthesises when an object leaves a watcher's filter. The bytes around
    /// the value are kept; an object without one gets it added to its metadata.
    /// This object's protobuf message (no envelope) in `codec`'s resource, encoded once;
    /// `None` when the schema cannot express it (a field of a newer API server), in which
    /// case the caller serves JSON or ends the watch, never drops the field.
    pub fn proto(&self, codec: &crate::core::proto::Codec) -> Option<Bytes> {
        let cached = self.proto.0.get_or_init(|| {
            Box::new(match codec.message(&self.json) {
                Ok(m) => Some(m),
                Err(e) => {
                    tracing::warn!(
                        namespace = self.namespace(),
                        name = self.name(),
                        kind = codec.kind(),
                        error = %e,
                        "object cannot be served as protobuf; its resource is served as JSON"
                    );
                    codec.refuse();
                    None
                }
            })
        });
        (**cached).clone()
    }

    pub fn with_rv(&self, rv: u64) -> Object {
        let value = format!("\"{rv}\"");
        let mut copy = self.clone();
        copy.rv = rv;
        copy.proto = ProtoCache::default();
        match self.rv_span {
            Some((start, end)) => {
                let (start, end) = (start as usize, end as usize);
                let mut out = Vec::with_capacity(self.json.len() + value.len());
                out.extend_from_slice(&self.json[..start]);
                out.extend_from_slice(value.as_bytes());
                out.extend_from_slice(&self.json[end..]);
                copy.rv_span = Some((start as u32, (start + value.len()) as u32));
                copy.json = Bytes::from(out);
            }
            None => {
                // Rare (objects always carry their RV): edit the parsed form.
                let mut v = self.to_value();
                if let Some(obj) = v.as_object_mut() {
                    let meta = obj
                        .entry("metadata")
                        .or_insert_with(|| Value::Object(Default::default()));
                    if let Some(meta) = meta.as_object_mut() {
                        meta.insert("resourceVersion".into(), Value::String(rv.to_string()));
                    }
                }
                if let Ok(o) = Object::from_value(Schema::Generic, &v) {
                    copy.json = o.json;
                    copy.rv_span = o.rv_span;
                }
            }
        }
        copy
    }

    /// `{"type":T,"object":…}\n`: one watch line, the object's bytes framed.
    pub fn line(&self, prefix: &[u8]) -> Bytes {
        let mut out = BytesMut::with_capacity(prefix.len() + self.json.len() + LINE_SUFFIX.len());
        out.put_slice(prefix);
        out.put_slice(&self.json);
        out.put_slice(LINE_SUFFIX);
        out.freeze()
    }

    /// Rebinds the object to `line`, a line [`Object::line`] made of it, so the two share
    /// one allocation (the event's line and the stored object are the same bytes).
    pub fn share_line(&mut self, line: &Bytes, prefix_len: usize) {
        // `line` was framed from these bytes: its length is enough to find them again.
        if line.len() == prefix_len + self.json.len() + LINE_SUFFIX.len() {
            self.json = line.slice(prefix_len..line.len() - LINE_SUFFIX.len());
        }
    }
}

/// Writes `s` as a JSON string.
fn write_json_str(out: &mut Vec<u8>, s: &str) {
    // Serialising a &str into a Vec cannot fail.
    let _ = serde_json::to_writer(out, s);
}

// The documents below are read with serde's derive, which refuses a known key seen twice
// ("duplicate field") and a value of the wrong type, skips unknown keys (checking they are
// JSON), and reads `null` as absent, as Go does.

/// A JSON object read as `T`. serde's derive also accepts a JSON array of the members in
/// order (`["a","n"]` as a name and namespace), which no Kubernetes client would: only an
/// object is read.
struct Obj<T>(T);

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Obj<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<T>(std::marker::PhantomData<T>);
        impl<'de, T: Deserialize<'de>> Visitor<'de> for V<T> {
            type Value = T;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<T, A::Error> {
                T::deserialize(de::value::MapAccessDeserializer::new(map))
            }
        }
        d.deserialize_map(V(std::marker::PhantomData)).map(Obj)
    }
}

#[derive(DeriveDeserialize, Default)]
struct Meta<'a> {
    name: Option<String>,
    namespace: Option<String>,
    uid: Option<String>,
    #[serde(rename = "resourceVersion", borrow, default)]
    resource_version: Option<&'a RawValue>,
    labels: Option<Labels>,
}

/// The top-level members every schema reads.
struct Top<'a> {
    metadata: Option<Obj<Meta<'a>>>,
    kind: Option<&'a RawValue>,
    api_version: Option<&'a RawValue>,
}

macro_rules! doc {
    ($name:ident { $($field:ident : $ty:ty $(as $rename:literal)?),* $(,)? }) => {
        #[derive(DeriveDeserialize)]
        struct $name<'a> {
            #[serde(borrow, default)]
            metadata: Option<Obj<Meta<'a>>>,
            #[serde(borrow, default)]
            kind: Option<&'a RawValue>,
            #[serde(rename = "apiVersion", borrow, default)]
            api_version: Option<&'a RawValue>,
            $( $(#[serde(rename = $rename)])? #[serde(default)] $field: $ty, )*
        }
    };
}

doc!(GenericDoc {});

/// The members every schema reads, moved out of its document.
macro_rules! top {
    ($d:ident) => {
        Top {
            metadata: $d.metadata,
            kind: $d.kind,
            api_version: $d.api_version,
        }
    };
}
doc!(ConfigMapDoc { immutable: Option<bool> });
doc!(SecretDoc { immutable: Option<bool>, r#type: Option<String> as "type" });
doc!(NamespaceDoc { status: Option<Obj<NamespaceStatus>> });
doc!(PodDoc { spec: Option<Obj<PodSpec>>, status: Option<Obj<PodStatus>> });

#[derive(DeriveDeserialize)]
struct NamespaceStatus {
    phase: Option<String>,
}

#[derive(DeriveDeserialize)]
struct PodSpec {
    #[serde(rename = "nodeName")]
    node_name: Option<String>,
    #[serde(rename = "restartPolicy")]
    restart_policy: Option<String>,
    #[serde(rename = "schedulerName")]
    scheduler_name: Option<String>,
    #[serde(rename = "serviceAccountName")]
    service_account_name: Option<String>,
    #[serde(rename = "serviceAccount")]
    service_account: Option<String>,
}

#[derive(DeriveDeserialize)]
struct PodStatus {
    phase: Option<String>,
    #[serde(rename = "podIP")]
    pod_ip: Option<String>,
    #[serde(rename = "podIPs")]
    pod_ips: Option<Vec<Option<Obj<PodIp>>>>,
    #[serde(rename = "nominatedNodeName")]
    nominated_node_name: Option<String>,
}

#[derive(DeriveDeserialize)]
struct PodIp {
    ip: Option<String>,
}

/// What [`Header::read`] found before the bytes are attached.
struct Header {
    name: Box<str>,
    namespace: Box<str>,
    uid: Box<str>,
    rv: u64,
    labels: Labels,
    fields: Vec<(Field, Box<str>)>,
    rv_span: Option<(u32, u32)>,
    immutable: bool,
    has_kind: bool,
    has_api_version: bool,
}

impl Header {
    fn read(json: &[u8], schema: Schema) -> Result<Header> {
        if json.len() > u32::MAX as usize {
            return Err(Error::TooLarge(json.len()));
        }
        let invalid = |e: serde_json::Error| Error::Invalid(e.to_string());
        let mut fields = Vec::new();
        let mut immutable = false;
        let top: Top<'_> = match schema {
            Schema::Generic => {
                let Obj::<GenericDoc>(d) = serde_json::from_slice(json).map_err(invalid)?;
                top!(d)
            }
            Schema::ConfigMap => {
                let Obj::<ConfigMapDoc>(d) = serde_json::from_slice(json).map_err(invalid)?;
                immutable = d.immutable == Some(true);
                top!(d)
            }
            Schema::Secret => {
                let Obj::<SecretDoc>(d) = serde_json::from_slice(json).map_err(invalid)?;
                immutable = d.immutable == Some(true);
                push(&mut fields, Field::Type, d.r#type);
                top!(d)
            }
            Schema::Namespace => {
                let Obj::<NamespaceDoc>(d) = serde_json::from_slice(json).map_err(invalid)?;
                push(&mut fields, Field::Phase, d.status.and_then(|s| s.0.phase));
                top!(d)
            }
            Schema::Pod => {
                let Obj::<PodDoc>(d) = serde_json::from_slice(json).map_err(invalid)?;
                if let Some(Obj(spec)) = d.spec {
                    push(&mut fields, Field::NodeName, spec.node_name);
                    push(&mut fields, Field::RestartPolicy, spec.restart_policy);
                    push(&mut fields, Field::SchedulerName, spec.scheduler_name);
                    // The API server reads the internal pod, whose conversion falls back
                    // to the deprecated `serviceAccount` when `serviceAccountName` is unset.
                    let sa = spec
                        .service_account_name
                        .filter(|v| !v.is_empty())
                        .or(spec.service_account);
                    push(&mut fields, Field::ServiceAccountName, sa);
                }
                if let Some(Obj(status)) = d.status {
                    push(&mut fields, Field::Phase, status.phase);
                    // Likewise the internal pod keeps only `podIPs`, whose first entry is
                    // `podIP` when that is set and `podIPs[0].ip` otherwise.
                    let ip = status.pod_ip.filter(|v| !v.is_empty()).or_else(|| {
                        status
                            .pod_ips
                            .and_then(|ips| ips.into_iter().next())
                            .and_then(|ip| ip.and_then(|ip| ip.0.ip))
                    });
                    push(&mut fields, Field::PodIp, ip);
                    push(
                        &mut fields,
                        Field::NominatedNodeName,
                        status.nominated_node_name,
                    );
                }
                top!(d)
            }
        };
        fields.sort_by_key(|(f, _)| *f);
        let meta = top.metadata.map(|m| m.0).unwrap_or_default();
        let (rv, rv_span) = match meta.resource_version {
            None => (0, None),
            Some(raw) => {
                let text = raw.get();
                let start = text.as_ptr() as usize - json.as_ptr() as usize;
                let span = (start as u32, (start + text.len()) as u32);
                match serde_json::from_str::<Option<Cow<'_, str>>>(text) {
                    Ok(Some(s)) => (s.parse().unwrap_or(0), Some(span)),
                    Ok(None) => (0, Some(span)),
                    Err(_) => {
                        return Err(Error::Invalid(
                            "metadata.resourceVersion is not a string".into(),
                        ))
                    }
                }
            }
        };
        Ok(Header {
            name: boxed(meta.name),
            namespace: boxed(meta.namespace),
            uid: boxed(meta.uid),
            rv,
            labels: meta.labels.unwrap_or_default(),
            fields,
            rv_span,
            immutable,
            has_kind: top.kind.is_some(),
            has_api_version: top.api_version.is_some(),
        })
    }

    fn into_object(self, json: Bytes) -> Object {
        let ids = [&*self.namespace, &*self.name, &*self.uid].concat();
        Object {
            json,
            ids: ids.into_boxed_str(),
            // Offsets fit: the strings come from an object of at most 4 GiB (`read`).
            namespace_len: self.namespace.len() as u32,
            name_len: self.name.len() as u32,
            rv: self.rv,
            labels: self.labels,
            fields: self.fields.into_boxed_slice(),
            rv_span: self.rv_span,
            immutable: self.immutable,
            proto: ProtoCache::default(),
        }
    }
}

fn boxed(s: Option<String>) -> Box<str> {
    s.unwrap_or_default().into_boxed_str()
}

fn push(fields: &mut Vec<(Field, Box<str>)>, field: Field, value: Option<String>) {
    if let Some(v) = value.filter(|v| !v.is_empty()) {
        fields.push((field, v.into_boxed_str()));
    }
}

/// `metadata.labels`: string values only, each key once, sorted by key; kept as one
/// string of every key and value and their end offsets (two allocations, not two per
/// label).
#[derive(Clone, PartialEq, Eq, Default)]
struct Labels {
    text: Box<str>,
    /// (end of key, end of value) of each label in `text`.
    ends: Box<[(u32, u32)]>,
}

impl Labels {
    fn pair(&self, i: usize) -> (&str, &str) {
        let start = match i {
            0 => 0,
            _ => self.ends[i - 1].1 as usize,
        };
        let (k, v) = self.ends[i];
        (
            self.text.get(start..k as usize).unwrap_or(""),
            self.text.get(k as usize..v as usize).unwrap_or(""),
        )
    }

    fn get(&self, key: &str) -> Option<&str> {
        let (mut lo, mut hi) = (0, self.ends.len());
        while lo < hi {
            let mid = (lo + hi) / 2;
            let (k, v) = self.pair(mid);
            match k.cmp(key) {
                std::cmp::Ordering::Equal => return Some(v),
                std::cmp::Ordering::Less => lo = mid + 1,
                std::cmp::Ordering::Greater => hi = mid,
            }
        }
        None
    }
}

impl<'de> Deserialize<'de> for Labels {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Labels;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a map of string labels")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Labels, A::Error> {
                let mut out: Vec<(String, String)> = Vec::new();
                while let Some(k) = map.next_key::<String>()? {
                    let v = map.next_value::<Option<String>>()?.unwrap_or_default();
                    out.push((k, v));
                }
                out.sort_by(|a, b| a.0.cmp(&b.0));
                if let Some(w) = out.windows(2).find(|w| w[0].0 == w[1].0) {
                    return Err(de::Error::custom(format_args!(
                        "duplicate label `{}`",
                        w[0].0
                    )));
                }
                let mut text = String::new();
                let mut ends = Vec::with_capacity(out.len());
                for (k, v) in &out {
                    text.push_str(k);
                    let key_end = text.len();
                    text.push_str(v);
                    if text.len() > u32::MAX as usize {
                        return Err(de::Error::custom("labels too large"));
                    }
                    ends.push((key_end as u32, text.len() as u32));
                }
                Ok(Labels {
                    text: text.into_boxed_str(),
                    ends: ends.into_boxed_slice(),
                })
            }
        }
        d.deserialize_map(V)
    }
}

/// The type of a watch event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventType {
    Added,
    Modified,
    Deleted,
}

impl EventType {
    /// The `type` of the event on the wire.
    pub fn as_str(&self) -> &'static str {
        match self {
            EventType::Added => "ADDED",
            EventType::Modified => "MODIFIED",
            EventType::Deleted => "DELETED",
        }
    }

    /// Reads a wire `type`; `None` for anything but the three object events.
    pub fn from_wire(s: &str) -> Option<Self> {
        match s {
            "ADDED" => Some(EventType::Added),
            "MODIFIED" => Some(EventType::Modified),
            "DELETED" => Some(EventType::Deleted),
            _ => None,
        }
    }
}

/// One line of an upstream JSON watch stream.
#[derive(Debug)]
pub enum WireEvent {
    Object {
        kind: EventType,
        object: Object,
    },
    /// A BOOKMARK: the resourceVersion it carries, and whether it ends a streaming list's
    /// initial events (annotated `k8s.io/initial-events-end: "true"`).
    Bookmark {
        rv: u64,
        initial_events_end: bool,
    },
    /// An ERROR: the `Status` object's JSON.
    Error(Bytes),
}

#[derive(DeriveDeserialize)]
struct LineDoc<'a> {
    #[serde(rename = "type", borrow)]
    kind: Cow<'a, str>,
    #[serde(borrow)]
    object: &'a RawValue,
}

/// Reads one watch line `{"type":T,"object":O}`; the object's bytes are copied out of the
/// line ([`Object::parse_copy`]).
pub fn parse_line(line: &[u8], schema: Schema) -> Result<WireEvent> {
    let Obj::<LineDoc>(doc) =
        serde_json::from_slice(line).map_err(|e| Error::Line(e.to_string()))?;
    let raw = doc.object.get().as_bytes();
    let kind = match doc.kind.as_ref() {
        "ADDED" => EventType::Added,
        "MODIFIED" => EventType::Modified,
        "DELETED" => EventType::Deleted,
        "BOOKMARK" => {
            let header = Header::read(raw, Schema::Generic)?;
            return Ok(WireEvent::Bookmark {
                rv: header.rv,
                initial_events_end: ends_initial_events(raw),
            });
        }
        "ERROR" => return Ok(WireEvent::Error(Bytes::copy_from_slice(raw))),
        other => return Err(Error::Line(format!("unknown event type {other:?}"))),
    };
    let object = Object::parse_copy(raw, schema, "", "")?;
    Ok(WireEvent::Object { kind, object })
}

/// Whether a bookmark's object carries `k8s.io/initial-events-end: "true"`: a bookmark
/// is small, so it is read as a tree.
fn ends_initial_events(raw: &[u8]) -> bool {
    #[derive(serde::Deserialize)]
    struct Bookmark {
        metadata: Option<Meta>,
    }
    #[derive(serde::Deserialize)]
    struct Meta {
        annotations: Option<std::collections::HashMap<String, String>>,
    }
    serde_json::from_slice::<Bookmark>(raw).is_ok_and(|b| {
        b.metadata
            .and_then(|m| m.annotations)
            .is_some_and(|a| a.get(INITIAL_EVENTS_END).is_some_and(|v| v == "true"))
    })
}

/// The annotation a streaming list's last initial bookmark carries.
pub const INITIAL_EVENTS_END: &str = "k8s.io/initial-events-end";

/// Reads a whole list body (a fleet snapshot): its items (each copied out, with `kind`
/// and `apiVersion` added when missing) and `metadata.resourceVersion` (`None` when
/// missing or not a number). The same splitter as an upstream list read as it arrives
/// (`core::list_stream`), fed the body as one frame.
pub fn parse_list(
    body: Bytes,
    schema: Schema,
    kind: &str,
    api_version: &str,
) -> Result<(Vec<Object>, Option<u64>)> {
    let mut splitter = ListSplitter::new(body.len().max(1));
    let mut raw = Vec::new();
    let list_error = |e: crate::core::list_stream::Error| Error::List(e.to_string());
    splitter.push(body, &mut raw).map_err(list_error)?;
    let rv = splitter.finish().map_err(list_error)?;
    let items = raw
        .iter()
        .map(|item| Object::parse_copy(item, schema, kind, api_version))
        .collect::<Result<Vec<_>>>()?;
    Ok((items, rv))
}

/// Writes `{"kind":K,"apiVersion":V,"metadata":{"resourceVersion":"RV"},"items":[` — the
/// head of a list whose items follow as their bytes, comma-separated, then [`LIST_TAIL`].
pub fn list_head(kind: &str, api_version: &str, rv: u64) -> Bytes {
    list_page_head(kind, api_version, rv, None)
}

/// A page's list head: [`list_head`] with, when more follow, the continue token and — for
/// a list without selectors — the count of objects left (`ListMeta` in Go's order).
pub fn list_page_head(
    kind: &str,
    api_version: &str,
    rv: u64,
    more: Option<(&str, Option<u64>)>,
) -> Bytes {
    let mut out = Vec::with_capacity(96);
    out.extend_from_slice(b"{\"kind\":");
    write_json_str(&mut out, kind);
    out.extend_from_slice(b",\"apiVersion\":");
    write_json_str(&mut out, api_version);
    out.extend_from_slice(b",\"metadata\":{\"resourceVersion\":\"");
    out.extend_from_slice(rv.to_string().as_bytes());
    out.push(b'"');
    if let Some((token, remaining)) = more {
        out.extend_from_slice(b",\"continue\":");
        write_json_str(&mut out, token);
        if let Some(n) = remaining {
            out.extend_from_slice(b",\"remainingItemCount\":");
            out.extend_from_slice(n.to_string().as_bytes());
        }
    }
    out.extend_from_slice(b"},\"items\":[");
    Bytes::from(out)
}

/// The end of a list started by [`list_head`].
pub const LIST_TAIL: &[u8] = b"]}";

/// An object as the API server writes it in a list of a built-in kind: without its leading
/// `kind` and `apiVersion`, which such lists leave to the list (a custom resource's items
/// keep theirs). The bytes after those two members, to follow a `{`; `None` when the
/// object does not start with exactly them (it is then written whole).
pub fn after_type_meta(json: &[u8]) -> Option<&[u8]> {
    /// The end of the JSON string starting at `at` (just past its closing quote).
    fn string_end(json: &[u8], at: usize) -> Option<usize> {
        let mut i = at.checked_add(1)?;
        if json.get(at) != Some(&b'"') {
            return None;
        }
        while let Some(&b) = json.get(i) {
            match b {
                b'\\' => i += 2,
                b'"' => return Some(i + 1),
                _ => i += 1,
            }
        }
        None
    }
    let rest = json.strip_prefix(b"{\"kind\":")?;
    let at = json.len() - rest.len();
    let end = string_end(json, at)?;
    let rest = json.get(end..)?.strip_prefix(b",\"apiVersion\":")?;
    let at = json.len() - rest.len();
    let end = string_end(json, at)?;
    match json.get(end)? {
        b',' => json.get(end + 1..),
        // Nothing but the two: `{}`.
        b'}' => json.get(end..),
        _ => None,
    }
}

/// A list item's length as [`ListWriter::push_item`] writes it.
pub fn list_item_len(json: &[u8], strip_type_meta: bool) -> usize {
    match strip_type_meta.then(|| after_type_meta(json)).flatten() {
        Some(rest) => 1 + rest.len(),
        None => json.len(),
    }
}

/// Appends items to a list body, comma-separated, in chunks of about `chunk` bytes: a
/// list is written as it is produced, never built whole.
pub struct ListWriter {
    buf: BytesMut,
    chunk: usize,
    first: bool,
}

impl ListWriter {
    pub fn new(chunk: usize) -> Self {
        ListWriter {
            buf: BytesMut::new(),
            chunk,
            first: true,
        }
    }

    /// Adds one item; returns a chunk when one is full.
    pub fn push(&mut self, json: &[u8]) -> Option<Bytes> {
        self.push_item(json, false)
    }

    /// Adds one item, without its `kind` and `apiVersion` when `strip_type_meta` (a list
    /// of a built-in kind: [`after_type_meta`]); returns a chunk when one is full.
    pub fn push_item(&mut self, json: &[u8], strip_type_meta: bool) -> Option<Bytes> {
        if !self.first {
            self.buf.put_u8(b',');
        }
        self.first = false;
        match strip_type_meta.then(|| after_type_meta(json)).flatten() {
            Some(rest) => {
                self.buf.put_u8(b'{');
                self.buf.put_slice(rest);
            }
            None => self.buf.put_slice(json),
        }
        if self.buf.len() < self.chunk {
            return None;
        }
        let full = self.buf.split().freeze();
        // The next chunk in one allocation of its final size, not one grown by doubling
        // from nothing (a 140 MB list would leave a trail of every size in the heap).
        self.buf.reserve(self.chunk + json.len());
        Some(full)
    }

    /// The rest, ending the list.
    pub fn finish(mut self) -> Bytes {
        self.buf.put_slice(LIST_TAIL);
        self.buf.freeze()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse(s: &str, schema: Schema) -> Result<Object> {
        Object::parse(Bytes::copy_from_slice(s.as_bytes()), schema)
    }

    #[test]
    fn list_items_of_built_in_kinds_leave_type_meta_to_the_list() {
        let cases: &[(&str, Option<&str>)] = &[
            (
                r#"{"kind":"Secret","apiVersion":"v1","metadata":{"name":"a"}}"#,
                Some(r#""metadata":{"name":"a"}}"#),
            ),
            (
                r#"{"kind":"Deployment","apiVersion":"apps/v1","spec":{}}"#,
                Some(r#""spec":{}}"#),
            ),
            (r#"{"kind":"X","apiVersion":"v1"}"#, Some("}")),
            (
                r#"{"kind":"A\"B","apiVersion":"v1","x":1}"#,
                Some(r#""x":1}"#),
            ),
            // Any other shape is written whole.
            (r#"{"apiVersion":"v1","kind":"Secret","x":1}"#, None),
            (r#"{"metadata":{},"kind":"Secret","apiVersion":"v1"}"#, None),
            (r#"{ "kind":"Secret","apiVersion":"v1","x":1}"#, None),
            (r#"{"kind":"Secret","x":1}"#, None),
            (r#"{"kind":"Secret"#, None),
            (r#"{"kind":1,"apiVersion":"v1","x":1}"#, None),
        ];
        for (json, want) in cases {
            let got =
                after_type_meta(json.as_bytes()).map(|b| String::from_utf8_lossy(b).to_string());
            assert_eq!(got.as_deref(), *want, "{json}");
            let whole = match want {
                Some(rest) => format!("{{{rest}"),
                None => json.to_string(),
            };
            assert_eq!(list_item_len(json.as_bytes(), true), whole.len());
            let mut w = ListWriter::new(1 << 20);
            assert!(w.push_item(json.as_bytes(), true).is_none());
            assert_eq!(w.finish(), format!("{whole}]}}").as_bytes());
        }
    }

    #[test]
    fn an_object_stays_small() {
        // Held once per cached object beside its bytes: a regression guard on its layout
        // (128 B, plus 16 for the protobuf message's slot since issue 14's protobuf).
        assert!(
            std::mem::size_of::<Object>() <= 144,
            "{}",
            std::mem::size_of::<Object>()
        );
    }

    #[test]
    fn header_reads_metadata_and_keeps_bytes() {
        let s = r#"{"kind":"ConfigMap","apiVersion":"v1","metadata":{"name":"a","namespace":"n","uid":"u-1","resourceVersion":"42","labels":{"b":"2","a":"1"}},"data":{"x":1e5,"y":"\u00e9\"q"}}"#;
        let o = parse(s, Schema::ConfigMap).unwrap();
        assert_eq!(o.name(), "a");
        assert_eq!(o.namespace(), "n");
        assert_eq!(o.uid(), "u-1");
        assert_eq!(o.rv(), 42);
        assert_eq!(o.key(), "n/a");
        assert_eq!(o.label("a"), Some("1"));
        assert_eq!(o.label("b"), Some("2"));
        assert_eq!(o.label("c"), None);
        assert_eq!(o.json().as_ref(), s.as_bytes(), "bytes kept exactly");
        assert!(!o.immutable());
    }

    #[test]
    fn odd_but_valid_json() {
        let cases: Vec<(&str, &str, &str, u64)> = vec![
            // Escaped strings in the header are unescaped.
            (
                r#"{"metadata":{"name":"a\u002db","namespace":"n\/s","resourceVersion":"\u0037"}}"#,
                "a-b",
                "n/s",
                7,
            ),
            // Unicode names (not valid Kubernetes names, but JSON).
            (
                r#"{"metadata":{"name":"日本","namespace":"n","resourceVersion":"1"}}"#,
                "日本",
                "n",
                1,
            ),
            // Whitespace everywhere, numbers in exponent form in the body.
            (
                "{ \"spec\" : { \"n\" : -1.5E+3 , \"m\": 0e0 } ,\n\t\"metadata\" : { \"name\" : \"a\" } }",
                "a",
                "",
                0,
            ),
            // null metadata members read as unset.
            (
                r#"{"metadata":{"name":"a","namespace":null,"labels":null,"resourceVersion":null}}"#,
                "a",
                "",
                0,
            ),
            // A non-numeric RV reads as 0 (as `object_rv` always did).
            (
                r#"{"metadata":{"name":"a","resourceVersion":"x"}}"#,
                "a",
                "",
                0,
            ),
            // Duplicate keys the header does not read are the client's business.
            (
                r#"{"metadata":{"name":"a","annotations":{"k":"1","k":"2"}},"data":1,"data":2}"#,
                "a",
                "",
                0,
            ),
        ];
        for (s, name, ns, rv) in cases {
            let o = parse(s, Schema::Generic).unwrap_or_else(|e| panic!("{s}: {e}"));
            assert_eq!((o.name(), o.namespace(), o.rv()), (name, ns, rv), "{s}");
            assert_eq!(o.json().as_ref(), s.as_bytes());
        }
    }

    #[test]
    fn refuses_what_clients_would_read_differently() {
        let cases = [
            r#"{"metadata":{"name":"a"},"metadata":{"name":"b"}}"#,
            r#"{"metadata":{"name":"a","name":"b"}}"#,
            r#"{"metadata":{"name":"a","labels":{"x":"1","x":"2"}}}"#,
            r#"{"metadata":{"name":"a","resourceVersion":"1","resourceVersion":"2"}}"#,
            r#"{"kind":"A","kind":"B","metadata":{"name":"a"}}"#,
            r#"{"metadata":{"name":5}}"#,
            r#"{"metadata":{"name":"a","labels":{"x":1}}}"#,
            r#"{"metadata":{"name":"a","labels":["x"]}}"#,
            r#"{"metadata":{"name":"a","resourceVersion":7}}"#,
            r#"{"metadata":[]}"#,
            r#"{"metadata":["a","n"]}"#,
            r#"[]"#,
            r#""x""#,
            r#"{"metadata":{"name":"a"}"#,
            r#"{"metadata":{"name":"a"}} x"#,
            "",
        ];
        for s in cases {
            assert!(parse(s, Schema::Generic).is_err(), "{s}");
        }
        // Per schema: a pod's selectable fields, a secret's type, immutable.
        let typed = [
            (r#"{"spec":{"nodeName":"a","nodeName":"b"}}"#, Schema::Pod),
            (r#"{"spec":{"nodeName":1}}"#, Schema::Pod),
            (r#"{"spec":["n1"]}"#, Schema::Pod),
            (
                r#"{"status":{"podIPs":[{"ip":"a","ip":"b"}]}}"#,
                Schema::Pod,
            ),
            (r#"{"type":"a","type":"b"}"#, Schema::Secret),
            (r#"{"immutable":"yes"}"#, Schema::ConfigMap),
            (r#"{"status":{"phase":1}}"#, Schema::Namespace),
        ];
        for (s, schema) in typed {
            assert!(parse(s, schema).is_err(), "{s}");
            // Other resources do not read those members: nothing to refuse there.
            assert!(parse(s, Schema::Generic).is_ok(), "{s}");
        }
    }

    #[test]
    fn every_selectable_field_of_every_served_resource() {
        let pod = json!({
            "metadata": {"name": "p", "namespace": "ns"},
            "spec": {"nodeName": "n1", "restartPolicy": "Always", "schedulerName": "default-scheduler",
                     "serviceAccountName": "sa"},
            "status": {"phase": "Running", "podIP": "10.0.0.1", "podIPs": [{"ip": "10.0.0.1"}],
                       "nominatedNodeName": "n2"}
        });
        let legacy_pod = json!({
            "metadata": {"name": "old"},
            "spec": {"serviceAccount": "legacy", "serviceAccountName": ""},
            "status": {"podIPs": [{"ip": "fd00::1"}, {"ip": "10.0.0.9"}]}
        });
        let secret = json!({"metadata": {"name": "s", "namespace": "ns"}, "type": "kubernetes.io/tls", "immutable": true});
        let cm =
            json!({"metadata": {"name": "c", "namespace": "ns"}, "immutable": true, "type": "x"});
        let namespace = json!({"metadata": {"name": "ns"}, "status": {"phase": "Terminating"}});
        let event = json!({"metadata": {"name": "e", "namespace": "ns"}, "type": "Warning"});
        let o = |schema, v: &Value| Object::from_value(schema, v).unwrap();
        let (pod, legacy_pod) = (o(Schema::Pod, &pod), o(Schema::Pod, &legacy_pod));
        let (secret, cm) = (o(Schema::Secret, &secret), o(Schema::ConfigMap, &cm));
        let namespace = o(Schema::Namespace, &namespace);
        let event = o(Schema::of("", "events"), &event);
        let cases: Vec<(&Object, &str, &str)> = vec![
            (&pod, "metadata.name", "p"),
            (&pod, "metadata.namespace", "ns"),
            (&pod, "spec.nodeName", "n1"),
            (&pod, "spec.restartPolicy", "Always"),
            (&pod, "spec.schedulerName", "default-scheduler"),
            (&pod, "spec.serviceAccountName", "sa"),
            (&pod, "status.phase", "Running"),
            (&pod, "status.podIP", "10.0.0.1"),
            (&pod, "status.nominatedNodeName", "n2"),
            (&pod, "type", ""),
            (&pod, "spec.host", ""),
            (&pod, "metadata", ""),
            (&legacy_pod, "spec.serviceAccountName", "legacy"),
            (&legacy_pod, "status.podIP", "fd00::1"),
            (&legacy_pod, "spec.nodeName", ""),
            (&legacy_pod, "metadata.namespace", ""),
            (&secret, "type", "kubernetes.io/tls"),
            (&secret, "metadata.name", "s"),
            (&secret, "status.phase", ""),
            // A ConfigMap has no `type` field label; an Event's is not modelled.
            (&cm, "type", ""),
            (&event, "type", ""),
            (&namespace, "status.phase", "Terminating"),
            (&namespace, "metadata.namespace", ""),
        ];
        for (obj, field, want) in cases {
            assert_eq!(obj.field(field), want, "{field} of {obj:?}");
        }
        assert!(secret.immutable() && cm.immutable() && !pod.immutable());
    }

    #[test]
    fn list_items_get_kind_and_api_version() {
        let body = br#"{"kind":"ConfigMapList","apiVersion":"v1","metadata":{"resourceVersion":"9"},"items":[{"metadata":{"name":"a","namespace":"n","resourceVersion":"3"},"data":{"k":"v"}},{},{"kind":"ConfigMap","apiVersion":"v1","metadata":{"name":"b"}}]}"#;
        let (items, rv) = parse_list(
            Bytes::from_static(body),
            Schema::ConfigMap,
            "ConfigMap",
            "v1",
        )
        .unwrap();
        assert_eq!(rv, Some(9));
        assert_eq!(
            items[0].json().as_ref(),
            br#"{"kind":"ConfigMap","apiVersion":"v1","metadata":{"name":"a","namespace":"n","resourceVersion":"3"},"data":{"k":"v"}}"#
        );
        assert_eq!(
            items[1].json().as_ref(),
            br#"{"kind":"ConfigMap","apiVersion":"v1"}"#
        );
        assert_eq!(
            items[2].json().as_ref(),
            br#"{"kind":"ConfigMap","apiVersion":"v1","metadata":{"name":"b"}}"#
        );
        // The RV's place moved with the insertion.
        let moved = items[0].with_rv(12);
        assert_eq!(
            moved.json().as_ref(),
            br#"{"kind":"ConfigMap","apiVersion":"v1","metadata":{"name":"a","namespace":"n","resourceVersion":"12"},"data":{"k":"v"}}"#
        );
        assert_eq!(moved.rv(), 12);
        for bad in [&br#"{"items":[1]}"#[..], b"{", br#"{"items":{}}"#] {
            assert!(parse_list(Bytes::from_static(bad), Schema::Generic, "X", "v1").is_err());
        }
        let (none, rv) = parse_list(
            Bytes::from_static(br#"{"metadata":{}}"#),
            Schema::Generic,
            "X",
            "v1",
        )
        .unwrap();
        assert!(none.is_empty() && rv.is_none());
    }

    #[test]
    fn with_rv_rewrites_only_the_resource_version() {
        let s = r#"{"metadata":{"name":"a","resourceVersion":"1"},"data":{"k":"v"}}"#;
        let o = parse(s, Schema::Generic).unwrap();
        let c = o.with_rv(9);
        assert_eq!(
            c.json().as_ref(),
            br#"{"metadata":{"name":"a","resourceVersion":"9"},"data":{"k":"v"}}"#
        );
        assert_eq!(c.rv(), 9);
        assert_eq!(c.with_rv(10).rv(), 10);
        let bare = parse(r#"{"metadata":{"name":"a"}}"#, Schema::Generic).unwrap();
        let c = bare.with_rv(5);
        assert_eq!(c.to_value()["metadata"]["resourceVersion"], "5");
    }

    #[test]
    fn watch_lines() {
        let line = br#"{"type":"MODIFIED","object":{"kind":"Secret","metadata":{"name":"s","namespace":"n","resourceVersion":"5"},"type":"Opaque"}}"#;
        match parse_line(line, Schema::Secret).unwrap() {
            WireEvent::Object { kind, object } => {
                assert_eq!(kind, EventType::Modified);
                assert_eq!(object.rv(), 5);
                assert_eq!(object.field("type"), "Opaque");
                assert_eq!(
                    object.line(MODIFIED_PREFIX).as_ref(),
                    [&line[..], b"\n"].concat().as_slice()
                );
            }
            other => panic!("{other:?}"),
        }
        let bm = br#"{"type":"BOOKMARK","object":{"kind":"Secret","metadata":{"resourceVersion":"77"}}}"#;
        assert!(matches!(
            parse_line(bm, Schema::Secret).unwrap(),
            WireEvent::Bookmark {
                rv: 77,
                initial_events_end: false
            }
        ));
        let end = br#"{"type":"BOOKMARK","object":{"kind":"Secret","metadata":{"resourceVersion":"78","annotations":{"k8s.io/initial-events-end":"true"}}}}"#;
        assert!(matches!(
            parse_line(end, Schema::Secret).unwrap(),
            WireEvent::Bookmark {
                rv: 78,
                initial_events_end: true
            }
        ));
        let err = br#"{"type":"ERROR","object":{"kind":"Status","code":410}}"#;
        match parse_line(err, Schema::Secret).unwrap() {
            WireEvent::Error(b) => assert_eq!(b.as_ref(), br#"{"kind":"Status","code":410}"#),
            other => panic!("{other:?}"),
        }
        for bad in [
            &br#"{"type":"WHAT","object":{}}"#[..],
            br#"{"type":"ADDED"}"#,
            br#"{"type":"ADDED","object":{},"type":"DELETED"}"#,
            br#"{"type":"ADDED","object":[]}"#,
            b"nope",
        ] {
            assert!(parse_line(bad, Schema::Generic).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn shared_line_and_lists_are_the_objects_bytes() {
        let mut o = parse(r#"{"metadata":{"name":"a"}}"#, Schema::Generic).unwrap();
        let line = o.line(ADDED_PREFIX);
        o.share_line(&line, ADDED_PREFIX.len());
        assert_eq!(o.json().as_ref(), br#"{"metadata":{"name":"a"}}"#);
        assert_eq!(
            o.json().as_ptr(),
            line[ADDED_PREFIX.len()..].as_ptr(),
            "one allocation"
        );
        let mut body = list_head("ConfigMapList", "v1", 7).to_vec();
        let mut w = ListWriter::new(16);
        for _ in 0..3 {
            if let Some(chunk) = w.push(o.json()) {
                body.extend_from_slice(&chunk);
            }
        }
        body.extend_from_slice(&w.finish());
        let v: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["metadata"]["resourceVersion"], "7");
        assert_eq!(v["items"].as_array().unwrap().len(), 3);
        let empty = [
            list_head("XList", "v1", 1).to_vec(),
            ListWriter::new(16).finish().to_vec(),
        ]
        .concat();
        let v: Value = serde_json::from_slice(&empty).unwrap();
        assert_eq!(v["items"], json!([]));
    }
}
