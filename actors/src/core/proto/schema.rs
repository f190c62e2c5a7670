//! The protobuf schema of the built-in Kubernetes types: every message's fields by JSON
//! name and by number, and which message an API group, version and kind is.
//!
//! The table (`k8s.schema`) is generated from the reference Kubernetes version's sources
//! (its first lines name it) by `scripts/k8s/gen-proto-schema.sh` and
//! `scripts/gen-proto-schema.py` — the `generated.proto` files, with JSON names and inlined
//! structs read from the Go types' tags — and parsed once, at first use. Types whose JSON
//! form is hand-written in Go (Time, Quantity, IntOrString, RawExtension …) are marked
//! [`Special`] here and encoded by `encode`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::LazyLock;

use super::Error;

/// The generated table, in `scripts/gen-proto-schema.py`'s line format.
const TABLE: &str = include_str!("k8s.schema");

/// A message's index in the schema.
pub type MsgId = u32;

/// The wire-relevant proto scalar types the Kubernetes protos use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scalar {
    String,
    Int32,
    Int64,
    Bool,
    Bytes,
    Double,
}

/// Messages whose JSON form is not their fields' (Go types with their own JSON methods).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Special {
    /// `metav1.Time`: an RFC 3339 string, seconds in protobuf.
    Time,
    /// `metav1.MicroTime`: an RFC 3339 string with microseconds.
    MicroTime,
    /// `metav1.Duration`: a Go duration string, nanoseconds in protobuf.
    Duration,
    /// `resource.Quantity`: a string (or number) kept as its text.
    Quantity,
    /// `intstr.IntOrString`: a number or a string.
    IntOrString,
    /// `runtime.RawExtension`, `metav1.FieldsV1`: any JSON, carried as its bytes.
    Raw,
    /// A Go `[]string` type (`ExtraValue`, `Verbs`): a JSON array, repeated `items`.
    Strings,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ty {
    Scalar(Scalar),
    Message(MsgId),
    Special(Special),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Label {
    Optional,
    Repeated,
    /// `map<string, ty>`.
    Map,
    /// A Go struct embedded with `json:",inline"`: its fields are its parent's in JSON.
    Inline,
}

#[derive(Debug)]
pub struct Field {
    pub number: u32,
    pub json: Box<str>,
    pub label: Label,
    pub ty: Ty,
}

/// Where a JSON key of a message goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Slot {
    /// The message's own field (an index into `fields`).
    Field(u16),
    /// A field of an inline field's message: (the inline field, its field).
    Inline(u16, u16),
}

#[derive(Debug)]
pub struct Message {
    pub name: Box<str>,
    /// By number, as a message is written.
    pub fields: Vec<Field>,
    /// JSON names, sorted, with inline fields' names resolved.
    keys: Vec<(Box<str>, Slot)>,
}

impl Message {
    /// The field a JSON key names.
    pub fn slot(&self, key: &str) -> Option<Slot> {
        self.keys
            .binary_search_by(|(k, _)| (**k).cmp(key))
            .ok()
            .map(|i| self.keys[i].1)
    }
}

#[derive(Debug)]
pub struct Schema {
    messages: Vec<Message>,
    by_name: HashMap<Box<str>, MsgId>,
    /// (group, version, kind) → message, for the packages that serve an API group.
    kinds: HashMap<Gvk, MsgId>,
    /// Kinds an object of which could not be encoded: served as JSON from then on.
    refused: Vec<AtomicBool>,
}

/// (group, version, kind).
type Gvk = (Box<str>, Box<str>, Box<str>);

static SCHEMA: LazyLock<Result<Schema, Error>> = LazyLock::new(|| Schema::parse(TABLE));

/// The built-in types' schema; `Err` only if the generated table is broken, which
/// `the_generated_table_parses` guards.
pub fn builtin() -> Result<&'static Schema, Error> {
    SCHEMA.as_ref().map_err(Clone::clone)
}

impl Schema {
    pub fn message(&self, id: MsgId) -> &Message {
        &self.messages[id as usize]
    }

    pub fn by_name(&self, name: &str) -> Option<MsgId> {
        self.by_name.get(name).copied()
    }

    /// The message of a built-in kind; `None` for custom resources and aggregated APIs,
    /// which the API server serves as JSON only.
    pub fn kind(&self, group: &str, version: &str, kind: &str) -> Option<MsgId> {
        self.kinds
            .get(&(Box::from(group), Box::from(version), Box::from(kind)))
            .copied()
    }

    /// Serve `id` as JSON from now on: one of its objects has no protobuf form here.
    pub fn refuse(&self, id: MsgId) {
        self.refused[id as usize].store(true, Ordering::Relaxed);
    }

    pub fn refused(&self, id: MsgId) -> bool {
        self.refused[id as usize].load(Ordering::Relaxed)
    }

    pub fn parse(text: &str) -> Result<Self, Error> {
        let bad = |n: usize, why: &str| Error::Schema(format!("line {}: {why}", n + 1));
        // First pass: names, so fields can refer to messages declared later.
        struct RawField<'a> {
            number: u32,
            json: &'a str,
            label: Label,
            ty: &'a str,
        }
        struct RawMsg<'a> {
            name: String,
            array: bool,
            fields: Vec<RawField<'a>>,
        }
        let mut raw: Vec<RawMsg> = Vec::new();
        let mut kinds = HashMap::new();
        let mut package: Option<(&str, Option<&str>, &str)> = None;
        for (n, line) in text.lines().enumerate() {
            let mut parts = line.split(' ');
            match parts.next() {
                Some("#") | Some("") | None => {}
                Some("P") => {
                    let (Some(pkg), Some(group), Some(version)) =
                        (parts.next(), parts.next(), parts.next())
                    else {
                        return Err(bad(n, "P needs package, group, version"));
                    };
                    let group = match group {
                        "-" => None,
                        "\"\"" => Some(""),
                        g => Some(g),
                    };
                    package = Some((pkg, group, version));
                }
                Some("M") => {
                    let Some((pkg, group, version)) = package else {
                        return Err(bad(n, "M before P"));
                    };
                    let name = parts.next().ok_or_else(|| bad(n, "M needs a name"))?;
                    let array = parts.next() == Some("[]");
                    if let Some(group) = group {
                        kinds.insert(
                            (Box::from(group), Box::from(version), Box::from(name)),
                            raw.len() as MsgId,
                        );
                    }
                    raw.push(RawMsg {
                        name: format!("{pkg}.{name}"),
                        array,
                        fields: Vec::new(),
                    });
                }
                Some("F") => {
                    let (Some(number), Some(json), Some(label), Some(ty)) =
                        (parts.next(), parts.next(), parts.next(), parts.next())
                    else {
                        return Err(bad(n, "F needs number, name, label, type"));
                    };
                    let number: u32 = number.parse().map_err(|_| bad(n, "bad number"))?;
                    let label = match label {
                        "o" => Label::Optional,
                        "r" => Label::Repeated,
                        "m" => Label::Map,
                        "i" => Label::Inline,
                        _ => return Err(bad(n, "bad label")),
                    };
                    let msg = raw.last_mut().ok_or_else(|| bad(n, "F before M"))?;
                    msg.fields.push(RawField {
                        number,
                        json,
                        label,
                        ty,
                    });
                }
                Some(_) => return Err(bad(n, "unknown record")),
            }
        }
        let by_name: HashMap<Box<str>, MsgId> = raw
            .iter()
            .enumerate()
            .map(|(i, m)| (Box::from(m.name.as_str()), i as MsgId))
            .collect();
        let specials = |id: MsgId, array: bool| -> Option<Special> {
            if array {
                return Some(Special::Strings);
            }
            Some(match raw[id as usize].name.as_str() {
                "k8s.io.apimachinery.pkg.apis.meta.v1.Time" => Special::Time,
                "k8s.io.apimachinery.pkg.apis.meta.v1.MicroTime" => Special::MicroTime,
                "k8s.io.apimachinery.pkg.apis.meta.v1.Duration" => Special::Duration,
                "k8s.io.apimachinery.pkg.apis.meta.v1.FieldsV1" => Special::Raw,
                "k8s.io.apimachinery.pkg.runtime.RawExtension" => Special::Raw,
                "k8s.io.apimachinery.pkg.api.resource.Quantity" => Special::Quantity,
                "k8s.io.apimachinery.pkg.util.intstr.IntOrString" => Special::IntOrString,
                _ => return None,
            })
        };
        let mut messages = Vec::with_capacity(raw.len());
        for m in &raw {
            let mut fields = Vec::with_capacity(m.fields.len());
            for f in &m.fields {
                let ty = match f.ty {
                    "string" => Ty::Scalar(Scalar::String),
                    "int32" => Ty::Scalar(Scalar::Int32),
                    "int64" => Ty::Scalar(Scalar::Int64),
                    "bool" => Ty::Scalar(Scalar::Bool),
                    "bytes" => Ty::Scalar(Scalar::Bytes),
                    "double" => Ty::Scalar(Scalar::Double),
                    name => {
                        let id = *by_name.get(name).ok_or_else(|| {
                            Error::Schema(format!("{}: unknown type {name}", m.name))
                        })?;
                        match specials(id, raw[id as usize].array) {
                            Some(s) => Ty::Special(s),
                            None => Ty::Message(id),
                        }
                    }
                };
                fields.push(Field {
                    number: f.number,
                    json: Box::from(f.json),
                    label: f.label,
                    ty,
                });
            }
            fields.sort_by_key(|f| f.number);
            messages.push(Message {
                name: Box::from(m.name.as_str()),
                fields,
                keys: Vec::new(),
            });
        }
        // JSON keys, with an inline field's keys lifted into its parent.
        for i in 0..messages.len() {
            let mut keys: Vec<(Box<str>, Slot)> = Vec::new();
            for (fi, f) in messages[i].fields.iter().enumerate() {
                match (f.label, f.ty) {
                    (Label::Inline, Ty::Message(inner)) => {
                        for (ii, g) in messages[inner as usize].fields.iter().enumerate() {
                            // An inline within an inline (admissionregistration's
                            // NamedRuleWithOperations, since 1.26) has no slot here: its
                            // JSON keys stay unknown, so an object that carries them fails
                            // to encode and its kind is served as JSON — refused, never
                            // dropped.
                            if g.label == Label::Inline {
                                continue;
                            }
                            keys.push((g.json.clone(), Slot::Inline(fi as u16, ii as u16)));
                        }
                    }
                    (Label::Inline, _) => {
                        return Err(Error::Schema(format!(
                            "{}: inline {} is not a message",
                            messages[i].name, f.json
                        )))
                    }
                    _ => keys.push((f.json.clone(), Slot::Field(fi as u16))),
                }
            }
            keys.sort_by(|a, b| a.0.cmp(&b.0));
            if let Some(w) = keys.windows(2).find(|w| w[0].0 == w[1].0) {
                return Err(Error::Schema(format!(
                    "{}: JSON name {} twice",
                    messages[i].name, w[0].0
                )));
            }
            messages[i].keys = keys;
        }
        Ok(Schema {
            refused: messages.iter().map(|_| AtomicBool::new(false)).collect(),
            messages,
            by_name,
            kinds,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_generated_table_parses() {
        let s = builtin().expect("k8s.schema parses");
        let cm = s.kind("", "v1", "ConfigMap").expect("ConfigMap");
        let m = s.message(cm);
        assert_eq!(&*m.name, "k8s.io.api.core.v1.ConfigMap");
        assert!(matches!(m.slot("data"), Some(Slot::Field(_))));
        assert_eq!(m.slot("kind"), None);
        // Groups by their register.go name, not their proto package.
        assert!(s
            .kind("rbac.authorization.k8s.io", "v1", "ClusterRole")
            .is_some());
        assert!(s.kind("apps", "v1", "Deployment").is_some());
        assert!(s.kind("", "v1", "PodList").is_some());
        // Machinery types are not kinds of any group.
        assert!(s.kind("", "v1", "ObjectMeta").is_none());
        assert!(s
            .by_name("k8s.io.apimachinery.pkg.apis.meta.v1.Status")
            .is_some());
        // Custom resources have no schema.
        assert!(s.kind("example.com", "v1", "Widget").is_none());
    }

    #[test]
    fn inline_fields_answer_for_their_parent() {
        let s = builtin().unwrap();
        let m = s.message(s.by_name("k8s.io.api.core.v1.SecretKeySelector").unwrap());
        // `name` is LocalObjectReference's, inlined; `key` the selector's own.
        let Some(Slot::Inline(f, _)) = m.slot("name") else {
            panic!("name is inline: {:?}", m.slot("name"));
        };
        assert_eq!(m.fields[f as usize].number, 1);
        assert!(matches!(m.slot("key"), Some(Slot::Field(_))));
        assert_eq!(m.slot("localObjectReference"), None);
    }

    #[test]
    fn json_names_come_from_the_go_tags() {
        let s = builtin().unwrap();
        let m = s.message(
            s.kind(
                "admissionregistration.k8s.io",
                "v1",
                "MutatingWebhookConfiguration",
            )
            .unwrap(),
        );
        assert!(m.slot("webhooks").is_some());
        assert!(m.slot("Webhooks").is_none());
        let meta = s.message(
            s.by_name("k8s.io.apimachinery.pkg.apis.meta.v1.ObjectMeta")
                .unwrap(),
        );
        let Some(Slot::Field(i)) = meta.slot("creationTimestamp") else {
            panic!()
        };
        assert_eq!(meta.fields[i as usize].ty, Ty::Special(Special::Time));
    }

    #[test]
    fn broken_tables_are_refused() {
        for bad in [
            "M X",
            "P p \"\" v1\nF 1 a o string",
            "P p \"\" v1\nM X\nF 1 a o Nope",
            "P p \"\" v1\nM X\nF x a o string",
            "P p \"\" v1\nM X\nF 1 a z string",
            "P p \"\" v1\nM X\nF 1 a o string\nF 2 a o string",
            "Q",
        ] {
            assert!(Schema::parse(bad).is_err(), "{bad}");
        }
    }
}
