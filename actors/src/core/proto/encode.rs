//! JSON → protobuf for one object, driven by the schema: the upstream's JSON is read once,
//! as it streams through serde, and written as the Go types' protobuf encoding would be.
//!
//! Fields are written by number (as gogo-protobuf writes them), maps in the JSON's order
//! (the API server's JSON sorts map keys, as gogo does), repeated scalars unpacked. A zero
//! value the JSON omits is omitted here too; Go writes some of them, and a decoder reads
//! both the same. Anything the schema does not know — a field of a newer API server, a
//! value of the wrong type — is an error, never dropped: the caller then serves JSON.

use std::borrow::Cow;
use std::fmt;

use serde::de::{self, DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::value::RawValue;
use smallvec::SmallVec;

use super::schema::{Field, Label, Message, MsgId, Scalar, Schema, Slot, Special, Ty};
use super::Error;

const VARINT: u32 = 0;
const I64: u32 = 1;
const LEN: u32 = 2;

pub fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

pub fn put_tag(out: &mut Vec<u8>, number: u32, wire: u32) {
    put_varint(out, u64::from(number << 3 | wire));
}

pub fn put_bytes(out: &mut Vec<u8>, number: u32, b: &[u8]) {
    put_tag(out, number, LEN);
    put_varint(out, b.len() as u64);
    out.extend_from_slice(b);
}

/// Starts a length-delimited field whose length is not known yet; [`end_len`] writes it.
fn begin_len(out: &mut Vec<u8>, number: u32) -> usize {
    put_tag(out, number, LEN);
    out.push(0);
    out.len()
}

/// Writes the length of the field [`begin_len`] started, moving its body when the length
/// needs more than the one byte reserved.
fn end_len(out: &mut Vec<u8>, body: usize) {
    let len = out.len() - body;
    let (mut v, mut n, mut x) = ([0u8; 10], 0, len as u64);
    while x >= 0x80 {
        v[n] = (x as u8) | 0x80;
        x >>= 7;
        n += 1;
    }
    v[n] = x as u8;
    n += 1;
    if n == 1 {
        out[body - 1] = v[0];
        return;
    }
    let extra = n - 1;
    out.resize(out.len() + extra, 0);
    out.copy_within(body..body + len, body + extra);
    out[body - 1..body - 1 + n].copy_from_slice(&v[..n]);
}

/// The protobuf encoding of `json` (one object of message `msg`), without the envelope.
/// Top-level `kind` and `apiVersion` are the envelope's, not the message's.
pub fn encode(schema: &Schema, msg: MsgId, json: &[u8]) -> Result<Vec<u8>, Error> {
    let mut out = Vec::with_capacity(json.len());
    let mut de = serde_json::Deserializer::from_slice(json);
    MessageSeed {
        schema,
        msg: schema.message(msg),
        out: &mut out,
        number: None,
        top: true,
        keep_zero: false,
    }
    .deserialize(&mut de)
    .map_err(|e| Error::Encode(e.to_string()))?;
    de.end().map_err(|e| Error::Encode(e.to_string()))?;
    Ok(out)
}

/// One message: written bare (`number: None`, the top level) or as field `number`.
struct MessageSeed<'a> {
    schema: &'a Schema,
    msg: &'a Message,
    out: &'a mut Vec<u8>,
    number: Option<u32>,
    top: bool,
    /// A `null` list element or map value: written as an empty message (its position
    /// counts), as Go decodes it to the zero struct.
    keep_zero: bool,
}

impl<'de> DeserializeSeed<'de> for MessageSeed<'_> {
    type Value = ();
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for MessageSeed<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "an object of {}", self.msg.name)
    }

    /// `null`: Go leaves the field zero; nothing is written (but see `keep_zero`).
    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        if let (true, Some(n)) = (self.keep_zero, self.number) {
            put_bytes(self.out, n, &[]);
        }
        Ok(())
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let MessageSeed {
            schema,
            msg,
            out,
            number,
            top,
            ..
        } = self;
        let body = number.map(|n| begin_len(out, n));
        let base = out.len();
        // (field number, start) of each field written, to put them in number order.
        let mut segments: SmallVec<[(u32, usize); 16]> = SmallVec::new();
        let mut inline: Vec<(u16, Vec<u8>)> = Vec::new();
        while let Some(key) = map.next_key_seed(KeySeed)? {
            match msg.slot(&key) {
                Some(Slot::Field(i)) => {
                    let f = &msg.fields[i as usize];
                    let start = out.len();
                    map.next_value_seed(FieldSeed { schema, f, out })?;
                    if out.len() > start {
                        segments.push((f.number, start));
                    }
                }
                Some(Slot::Inline(i, j)) => {
                    let inner = schema.message(match msg.fields[i as usize].ty {
                        Ty::Message(id) => id,
                        _ => return Err(de::Error::custom("inline field is not a message")),
                    });
                    let at = match inline.iter().position(|(k, _)| *k == i) {
                        Some(at) => at,
                        None => {
                            inline.push((i, Vec::new()));
                            inline.len() - 1
                        }
                    };
                    let f = &inner.fields[j as usize];
                    map.next_value_seed(FieldSeed {
                        schema,
                        f,
                        out: &mut inline[at].1,
                    })?;
                }
                None if top && (key == "kind" || key == "apiVersion") => {
                    map.next_value::<IgnoredAny>()?;
                }
                None => {
                    return Err(de::Error::custom(format_args!(
                        "{} has no field {key:?}",
                        msg.name
                    )))
                }
            }
        }
        for (i, bytes) in inline {
            let start = out.len();
            put_bytes(out, msg.fields[i as usize].number, &bytes);
            segments.push((msg.fields[i as usize].number, start));
        }
        order_by_number(out, base, &mut segments);
        if let Some(body) = body {
            end_len(out, body);
        }
        Ok(())
    }
}

/// Puts the fields written since `base` in field-number order, as Go writes them.
fn order_by_number(out: &mut Vec<u8>, base: usize, segments: &mut [(u32, usize)]) {
    if segments.windows(2).all(|w| w[0].0 <= w[1].0) {
        return;
    }
    let end = out.len();
    let mut spans: Vec<(u32, usize, usize)> = segments
        .iter()
        .enumerate()
        .map(|(k, &(n, s))| (n, s, segments.get(k + 1).map_or(end, |x| x.1)))
        .collect();
    spans.sort_by_key(|s| s.0);
    let mut sorted = Vec::with_capacity(end - base);
    for (_, s, e) in spans {
        sorted.extend_from_slice(&out[s..e]);
    }
    out.truncate(base);
    out.extend_from_slice(&sorted);
}

/// A JSON key, borrowed when it has no escapes.
struct KeySeed;

impl<'de> DeserializeSeed<'de> for KeySeed {
    type Value = Cow<'de, str>;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for KeySeed {
    type Value = Cow<'de, str>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a key")
    }
    fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Self::Value, E> {
        Ok(Cow::Borrowed(v))
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
        Ok(Cow::Owned(v.to_owned()))
    }
    fn visit_string<E: de::Error>(self, v: String) -> Result<Self::Value, E> {
        Ok(Cow::Owned(v))
    }
}

/// One field of a message, by its label.
struct FieldSeed<'a> {
    schema: &'a Schema,
    f: &'a Field,
    out: &'a mut Vec<u8>,
}

impl<'de> DeserializeSeed<'de> for FieldSeed<'_> {
    type Value = ();
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        match self.f.label {
            Label::Optional | Label::Inline => ValueSeed {
                schema: self.schema,
                ty: self.f.ty,
                number: self.f.number,
                out: self.out,
                keep_zero: false,
            }
            .deserialize(d),
            Label::Repeated | Label::Map => d.deserialize_any(self),
        }
    }
}

impl<'de> Visitor<'de> for FieldSeed<'_> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "{} for {}", self.f.label_name(), self.f.json)
    }
    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        Ok(())
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        if self.f.label != Label::Repeated {
            return Err(de::Error::custom(format_args!(
                "{} is not a list",
                self.f.json
            )));
        }
        // An element is written even when zero: its position counts.
        while seq
            .next_element_seed(ValueSeed {
                schema: self.schema,
                ty: self.f.ty,
                number: self.f.number,
                out: self.out,
                keep_zero: true,
            })?
            .is_some()
        {}
        Ok(())
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        if self.f.label != Label::Map {
            return Err(de::Error::custom(format_args!(
                "{} is not a map",
                self.f.json
            )));
        }
        while let Some(key) = map.next_key_seed(KeySeed)? {
            let body = begin_len(self.out, self.f.number);
            put_bytes(self.out, 1, key.as_bytes());
            map.next_value_seed(ValueSeed {
                schema: self.schema,
                ty: self.f.ty,
                number: 2,
                out: self.out,
                keep_zero: true,
            })?;
            end_len(self.out, body);
        }
        Ok(())
    }
}

impl Field {
    fn label_name(&self) -> &'static str {
        match self.label {
            Label::Repeated => "a list",
            Label::Map => "a map",
            _ => "a value",
        }
    }
}

/// One value, written as field `number`. `keep_zero`: a `null` is written as the type's
/// zero value (a list element or map value, whose presence matters) instead of nothing.
struct ValueSeed<'a> {
    schema: &'a Schema,
    ty: Ty,
    number: u32,
    out: &'a mut Vec<u8>,
    keep_zero: bool,
}

impl<'de> DeserializeSeed<'de> for ValueSeed<'_> {
    type Value = ();
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        match self.ty {
            Ty::Message(id) => MessageSeed {
                schema: self.schema,
                msg: self.schema.message(id),
                out: self.out,
                number: Some(self.number),
                top: false,
                keep_zero: self.keep_zero,
            }
            .deserialize(d),
            Ty::Special(Special::Raw) => {
                let raw: &'de RawValue = de::Deserialize::deserialize(d)?;
                if raw.get() != "null" {
                    let body = begin_len(self.out, self.number);
                    put_bytes(self.out, 1, raw.get().as_bytes());
                    end_len(self.out, body);
                } else if self.keep_zero {
                    put_bytes(self.out, self.number, &[]);
                }
                Ok(())
            }
            _ => d.deserialize_any(self),
        }
    }
}

impl ValueSeed<'_> {
    fn int<E: de::Error>(self, v: i128) -> Result<(), E> {
        match self.ty {
            Ty::Scalar(Scalar::Int32) if i32::try_from(v).is_ok() => {
                put_tag(self.out, self.number, VARINT);
                // Negative int32s are sign-extended to 64 bits on the wire.
                put_varint(self.out, v as i64 as u64);
            }
            Ty::Scalar(Scalar::Int64) if i64::try_from(v).is_ok() => {
                put_tag(self.out, self.number, VARINT);
                put_varint(self.out, v as i64 as u64);
            }
            Ty::Scalar(Scalar::Double) => self.double(v as f64),
            Ty::Special(Special::IntOrString) if i32::try_from(v).is_ok() => {
                let body = begin_len(self.out, self.number);
                put_tag(self.out, 1, VARINT);
                put_varint(self.out, 0);
                put_tag(self.out, 2, VARINT);
                put_varint(self.out, v as i64 as u64);
                put_bytes(self.out, 3, b"");
                end_len(self.out, body);
            }
            Ty::Special(Special::Quantity) => self.quantity(&v.to_string()),
            _ => return Err(de::Error::custom(format_args!("unexpected number {v}"))),
        }
        Ok(())
    }

    fn double(self, v: f64) {
        put_tag(self.out, self.number, I64);
        self.out.extend_from_slice(&v.to_le_bytes());
    }

    fn quantity(self, s: &str) {
        let body = begin_len(self.out, self.number);
        put_bytes(self.out, 1, s.as_bytes());
        end_len(self.out, body);
    }

    fn timestamp<E: de::Error>(self, s: &str, micro: bool) -> Result<(), E> {
        let (secs, nanos) = crate::core::time::parse_rfc3339(s)
            .ok_or_else(|| de::Error::custom(format_args!("invalid time {s:?}")))?;
        let body = begin_len(self.out, self.number);
        put_tag(self.out, 1, VARINT);
        put_varint(self.out, secs as u64);
        put_tag(self.out, 2, VARINT);
        // Time keeps whole seconds in protobuf (Go's `Time.ProtoTime`); MicroTime its
        // microseconds.
        put_varint(self.out, if micro { u64::from(nanos) } else { 0 });
        end_len(self.out, body);
        Ok(())
    }
}

impl<'de> Visitor<'de> for ValueSeed<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "a value of type {:?}", self.ty)
    }

    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        if !self.keep_zero {
            return Ok(());
        }
        match self.ty {
            Ty::Scalar(Scalar::String | Scalar::Bytes) | Ty::Special(_) | Ty::Message(_) => {
                put_bytes(self.out, self.number, &[])
            }
            Ty::Scalar(Scalar::Double) => self.double(0.0),
            Ty::Scalar(_) => {
                put_tag(self.out, self.number, VARINT);
                put_varint(self.out, 0);
            }
        }
        Ok(())
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<(), E> {
        if self.ty != Ty::Scalar(Scalar::Bool) {
            return Err(de::Error::custom("unexpected boolean"));
        }
        put_tag(self.out, self.number, VARINT);
        put_varint(self.out, u64::from(v));
        Ok(())
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<(), E> {
        self.int(i128::from(v))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<(), E> {
        self.int(i128::from(v))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<(), E> {
        match self.ty {
            Ty::Scalar(Scalar::Double) => {
                self.double(v);
                Ok(())
            }
            Ty::Special(Special::Quantity) => {
                self.quantity(&v.to_string());
                Ok(())
            }
            // Go refuses a fraction or an exponent for an integer field.
            _ => Err(de::Error::custom(format_args!("unexpected number {v}"))),
        }
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<(), E> {
        match self.ty {
            Ty::Scalar(Scalar::String) => put_bytes(self.out, self.number, v.as_bytes()),
            Ty::Scalar(Scalar::Bytes) => {
                use base64::Engine as _;
                let b = base64::engine::general_purpose::STANDARD
                    .decode(v)
                    .map_err(|e| de::Error::custom(format_args!("invalid base64: {e}")))?;
                put_bytes(self.out, self.number, &b);
            }
            Ty::Special(Special::Time) => return self.timestamp(v, false),
            Ty::Special(Special::MicroTime) => return self.timestamp(v, true),
            Ty::Special(Special::Duration) => {
                let nanos = crate::core::time::parse_go_duration(v)
                    .ok_or_else(|| de::Error::custom(format_args!("invalid duration {v:?}")))?;
                let body = begin_len(self.out, self.number);
                put_tag(self.out, 1, VARINT);
                put_varint(self.out, nanos as u64);
                end_len(self.out, body);
            }
            Ty::Special(Special::Quantity) => self.quantity(v),
            Ty::Special(Special::IntOrString) => {
                let body = begin_len(self.out, self.number);
                put_tag(self.out, 1, VARINT);
                put_varint(self.out, 1);
                put_tag(self.out, 2, VARINT);
                put_varint(self.out, 0);
                put_bytes(self.out, 3, v.as_bytes());
                end_len(self.out, body);
            }
            _ => return Err(de::Error::custom(format_args!("unexpected string {v:?}"))),
        }
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        if self.ty != Ty::Special(Special::Strings) {
            return Err(de::Error::custom("unexpected list"));
        }
        let body = begin_len(self.out, self.number);
        while let Some(s) = seq.next_element::<Option<Cow<'de, str>>>()? {
            put_bytes(self.out, 1, s.as_deref().unwrap_or("").as_bytes());
        }
        end_len(self.out, body);
        Ok(())
    }

    fn visit_map<A: MapAccess<'de>>(self, _map: A) -> Result<(), A::Error> {
        Err(de::Error::custom(format_args!(
            "unexpected object for {:?}",
            self.ty
        )))
    }
}
