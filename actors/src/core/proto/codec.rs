//! One resource's protobuf wire forms, as the API server writes them:
//!
//! - an object (a get): `k8s\x00` + `runtime.Unknown{typeMeta{apiVersion, kind}, raw:
//!   the object's message}`;
//! - a list: the same envelope around `<Kind>List{metadata: ListMeta, items}`, items being
//!   the objects' messages, written as they are produced;
//! - a watch event: a 4-byte big-endian length, then `metav1.WatchEvent{type, object:
//!   RawExtension{raw: the object's envelope}}` (the stream serializer writes the event
//!   bare, the embedded encoder the object with its envelope).

use bytes::{BufMut, Bytes, BytesMut};

use super::encode::{encode, put_bytes, put_varint};
use super::schema::{self, MsgId};
use super::Error;

/// The protobuf serializer's magic prefix.
pub const MAGIC: &[u8] = b"k8s\x00";

pub const CONTENT_TYPE: &str = "application/vnd.kubernetes.protobuf";
pub const WATCH_CONTENT_TYPE: &str = "application/vnd.kubernetes.protobuf;stream=watch";

/// The protobuf forms of one resource's objects.
#[derive(Debug, Clone)]
pub struct Codec {
    schema: &'static schema::Schema,
    msg: MsgId,
    status: MsgId,
    api_version: Box<str>,
    kind: Box<str>,
    /// `typeMeta` of the object's envelope and of its list's, pre-encoded.
    type_meta: Box<[u8]>,
    list_type_meta: Box<[u8]>,
}

impl Codec {
    /// The codec of a built-in kind; `None` for kinds the API server serves as JSON only
    /// (custom resources, aggregated APIs) and for lists without a message.
    pub fn for_kind(group: &str, version: &str, kind: &str) -> Option<Self> {
        let schema = schema::builtin().ok()?;
        let msg = schema.kind(group, version, kind)?;
        if schema.refused(msg) {
            return None;
        }
        schema.kind(group, version, &format!("{kind}List"))?;
        let status = schema.by_name("k8s.io.apimachinery.pkg.apis.meta.v1.Status")?;
        let api_version = if group.is_empty() {
            version.to_string()
        } else {
            format!("{group}/{version}")
        };
        let type_meta = |kind: &str| {
            let mut tm = Vec::new();
            put_bytes(&mut tm, 1, api_version.as_bytes());
            put_bytes(&mut tm, 2, kind.as_bytes());
            tm.into_boxed_slice()
        };
        Some(Codec {
            schema,
            msg,
            status,
            type_meta: type_meta(kind),
            list_type_meta: type_meta(&format!("{kind}List")),
            api_version: api_version.into(),
            kind: kind.into(),
        })
    }

    /// The object's message (no envelope) from its JSON.
    pub fn message(&self, json: &[u8]) -> Result<Bytes, Error> {
        encode(self.schema, self.msg, json).map(Bytes::from)
    }

    /// A get's body: the envelope around the object's message.
    pub fn envelope(&self, message: &[u8]) -> Bytes {
        let mut out = Vec::with_capacity(message.len() + self.type_meta.len() + 16);
        envelope_into(&mut out, &self.type_meta, message);
        Bytes::from(out)
    }

    /// A watch frame of an object event (`ADDED`, `MODIFIED`, `DELETED`).
    pub fn event(&self, kind: &str, message: &[u8]) -> Bytes {
        frame(kind, &self.type_meta, message)
    }

    /// A `BOOKMARK` frame of `object` (`core::bookmark::bookmark_object`: the kind
    /// carrying only an RV).
    pub fn bookmark(&self, object: &serde_json::Value) -> Result<Bytes, Error> {
        let msg = encode(self.schema, self.msg, object.to_string().as_bytes())?;
        Ok(self.event("BOOKMARK", &msg))
    }

    /// An `ERROR` frame carrying a `Status` (JSON, as kcache builds it).
    pub fn error(&self, status: &serde_json::Value) -> Result<Bytes, Error> {
        let msg = encode(self.schema, self.status, status.to_string().as_bytes())?;
        let mut tm = Vec::new();
        put_bytes(&mut tm, 1, b"v1");
        put_bytes(&mut tm, 2, b"Status");
        Ok(frame("ERROR", &tm, &msg))
    }

    /// Serve this kind as JSON from now on (one of its objects has no protobuf form).
    pub fn refuse(&self) {
        self.schema.refuse(self.msg);
    }

    pub fn api_version(&self) -> &str {
        &self.api_version
    }

    pub fn kind(&self) -> &str {
        &self.kind
    }

    /// A list's bytes around its items: the head (up to the first item) and the tail, for
    /// items whose messages have the given lengths. The body is
    /// `head, item_prefix(len) + item for each item, tail`.
    /// `more`: the continue token and the count of objects left, when more follow.
    pub fn list_head(
        &self,
        rv: u64,
        more: Option<(&str, Option<u64>)>,
        item_lens: impl Iterator<Item = usize>,
    ) -> (Bytes, Bytes) {
        let mut meta = Vec::new();
        put_bytes(&mut meta, 2, rv.to_string().as_bytes());
        if let Some((token, remaining)) = more {
            put_bytes(&mut meta, 3, token.as_bytes());
            if let Some(n) = remaining {
                // `remainingItemCount` (4), a varint.
                meta.push(0x20);
                put_varint(&mut meta, n);
            }
        }
        let mut list_meta = Vec::new();
        put_bytes(&mut list_meta, 1, &meta);
        let items: usize = item_lens.map(item_len).sum();
        let raw_len = list_meta.len() + items;
        let mut head = BytesMut::with_capacity(64 + list_meta.len());
        head.put_slice(MAGIC);
        let mut h = Vec::new();
        put_bytes(&mut h, 1, &self.list_type_meta);
        h.push(0x12);
        put_varint(&mut h, raw_len as u64);
        h.extend_from_slice(&list_meta);
        head.put_slice(&h);
        (head.freeze(), Bytes::from_static(UNKNOWN_TAIL))
    }
}

/// A list item's length in the list body: its field header and its message.
pub fn item_len(len: usize) -> usize {
    field_len(len)
}

/// A list item's field header: `items` (2), length-delimited.
pub fn item_prefix(len: usize, out: &mut Vec<u8>) {
    out.push(0x12);
    put_varint(out, len as u64);
}

/// `runtime.Unknown`'s `contentEncoding` (3) and `contentType` (4), empty, which Go
/// writes after `raw`.
const UNKNOWN_TAIL: &[u8] = &[0x1a, 0x00, 0x22, 0x00];

fn envelope_into(out: &mut Vec<u8>, type_meta: &[u8], message: &[u8]) {
    out.extend_from_slice(MAGIC);
    put_bytes(out, 1, type_meta);
    put_bytes(out, 2, message);
    out.extend_from_slice(UNKNOWN_TAIL);
}

/// A length-prefixed `WatchEvent{type, object: RawExtension{raw: envelope}}`, the
/// envelope around `message`; written once into a buffer of its exact size (every
/// nested length is known up front), as the object's bytes are the frame's bulk.
fn frame(kind: &str, type_meta: &[u8], message: &[u8]) -> Bytes {
    let env_len =
        MAGIC.len() + field_len(type_meta.len()) + field_len(message.len()) + UNKNOWN_TAIL.len();
    let raw_len = field_len(env_len);
    let ev_len = field_len(kind.len()) + field_len(raw_len);
    let mut out = Vec::with_capacity(4 + ev_len);
    out.extend_from_slice(&(ev_len as u32).to_be_bytes());
    put_bytes(&mut out, 1, kind.as_bytes());
    out.push(0x12);
    put_varint(&mut out, raw_len as u64);
    out.push(0x0a);
    put_varint(&mut out, env_len as u64);
    envelope_into(&mut out, type_meta, message);
    debug_assert_eq!(out.len(), 4 + ev_len);
    Bytes::from(out)
}

/// A length-delimited field of `len` bytes with a one-byte tag (field numbers below 16).
fn field_len(len: usize) -> usize {
    1 + varint_len(len as u64) + len
}

fn varint_len(v: u64) -> usize {
    let mut n = 1;
    let mut v = v >> 7;
    while v > 0 {
        n += 1;
        v >>= 7;
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_pb::api::apps::v1 as apps;
    use k8s_pb::api::core::v1 as core;
    use k8s_pb::apimachinery::pkg::apis::meta::v1 as meta;
    use k8s_pb::apimachinery::pkg::runtime::Unknown;
    use prost::Message as _;
    use serde_json::json;

    fn codec(g: &str, v: &str, k: &str) -> Codec {
        Codec::for_kind(g, v, k).expect("built-in kind")
    }

    /// Decodes an envelope as a client does: magic, Unknown, then the message.
    fn unwrap_envelope(b: &[u8]) -> Unknown {
        assert_eq!(&b[..4], MAGIC);
        Unknown::decode(&b[4..]).expect("Unknown")
    }

    const POD: &str = r#"{"kind":"Pod","apiVersion":"v1","metadata":{"name":"p","namespace":"ns","uid":"u1","resourceVersion":"42","generation":3,"creationTimestamp":"2021-01-15T10:20:30Z","deletionTimestamp":null,"labels":{"a":"1","b":"\u00e9\"x"},"annotations":{"note":"line\nbreak"},"ownerReferences":[{"apiVersion":"apps/v1","kind":"ReplicaSet","name":"rs","uid":"u0","controller":true}],"managedFields":[{"manager":"kubectl","operation":"Update","apiVersion":"v1","time":"2021-01-15T10:20:30Z","fieldsType":"FieldsV1","fieldsV1":{"f:metadata":{"f:labels":{".":{},"f:a":{}}}}}]},"spec":{"volumes":[{"name":"cfg","configMap":{"name":"cm","defaultMode":420,"items":[{"key":"k","path":"p"}]}},{"name":"sec","secret":{"secretName":"s","optional":false}}],"containers":[{"name":"c","image":"busybox","command":["sh","-c","sleep 1e9"],"ports":[{"containerPort":80,"protocol":"TCP"}],"env":[{"name":"X","valueFrom":{"secretKeyRef":{"name":"s","key":"k"}}}],"resources":{"limits":{"cpu":"500m","memory":"128Mi"},"requests":{"cpu":"1"}},"livenessProbe":{"httpGet":{"path":"/","port":8080,"scheme":"HTTP"},"initialDelaySeconds":5,"timeoutSeconds":1,"periodSeconds":10,"successThreshold":1,"failureThreshold":3},"readinessProbe":{"tcpSocket":{"port":"http"},"timeoutSeconds":1}}],"restartPolicy":"Always","terminationGracePeriodSeconds":30,"nodeName":"node-1","priority":-5,"enableServiceLinks":true,"tolerations":[{"key":"k","operator":"Exists","effect":"NoExecute","tolerationSeconds":300}]},"status":{"phase":"Running","podIP":"10.0.0.1","podIPs":[{"ip":"10.0.0.1"}],"startTime":"2021-01-15T10:20:31Z","conditions":[{"type":"Ready","status":"True","lastProbeTime":null,"lastTransitionTime":"2021-01-15T10:20:32Z"}]}}"#;

    #[test]
    fn a_pod_decodes_as_the_json_says() {
        let c = codec("", "v1", "Pod");
        let msg = c.message(POD.as_bytes()).expect("encodes");
        let env = c.envelope(&msg);
        let unk = unwrap_envelope(&env);
        let tm = unk.type_meta.expect("typeMeta");
        assert_eq!(tm.api_version.as_deref(), Some("v1"));
        assert_eq!(tm.kind.as_deref(), Some("Pod"));
        let pod = core::Pod::decode(unk.raw.as_deref().expect("raw")).expect("a Pod");
        let m = pod.metadata.expect("metadata");
        assert_eq!(m.name.as_deref(), Some("p"));
        assert_eq!(m.resource_version.as_deref(), Some("42"));
        assert_eq!(m.generation, Some(3));
        assert_eq!(
            m.creation_timestamp.and_then(|t| t.seconds),
            Some(1_610_706_030)
        );
        assert!(m.deletion_timestamp.is_none());
        assert_eq!(m.labels.get("b").map(String::as_str), Some("é\"x"));
        assert_eq!(m.annotations["note"], "line\nbreak");
        assert_eq!(m.owner_references[0].controller, Some(true));
        let mf = &m.managed_fields[0];
        // FieldsV1 carries the JSON text itself.
        assert_eq!(
            mf.fields_v1.as_ref().and_then(|f| f.raw.as_deref()),
            Some(&br#"{"f:metadata":{"f:labels":{".":{},"f:a":{}}}}"#[..])
        );
        let spec = pod.spec.expect("spec");
        // An inlined LocalObjectReference: `name` beside `key` in JSON, nested here.
        let env_from = spec.containers[0].env[0]
            .value_from
            .as_ref()
            .and_then(|v| v.secret_key_ref.as_ref())
            .expect("secretKeyRef");
        assert_eq!(
            env_from
                .local_object_reference
                .as_ref()
                .and_then(|r| r.name.as_deref()),
            Some("s")
        );
        assert_eq!(env_from.key.as_deref(), Some("k"));
        let cm = spec.volumes[0]
            .volume_source
            .as_ref()
            .and_then(|v| v.config_map.as_ref());
        assert_eq!(cm.and_then(|c| c.default_mode), Some(420));
        assert_eq!(spec.priority, Some(-5));
        assert_eq!(spec.node_name.as_deref(), Some("node-1"));
        let c0 = &spec.containers[0];
        assert_eq!(c0.command, ["sh", "-c", "sleep 1e9"]);
        let res = c0.resources.as_ref().expect("resources");
        assert_eq!(res.limits["cpu"].string.as_deref(), Some("500m"));
        // IntOrString, as an int and as a string; the probe's inlined handler.
        let live = c0.liveness_probe.as_ref().expect("liveness");
        let port = live
            .handler
            .as_ref()
            .and_then(|h| h.http_get.as_ref())
            .and_then(|g| g.port.as_ref())
            .expect("port");
        assert_eq!((port.r#type, port.int_val), (Some(0), Some(8080)));
        let ready = c0.readiness_probe.as_ref().expect("readiness");
        let port = ready
            .handler
            .as_ref()
            .and_then(|h| h.tcp_socket.as_ref())
            .and_then(|g| g.port.as_ref())
            .expect("port");
        assert_eq!(
            (port.r#type, port.str_val.as_deref()),
            (Some(1), Some("http"))
        );
        assert_eq!(spec.tolerations[0].toleration_seconds, Some(300));
        let st = pod.status.expect("status");
        assert_eq!(st.pod_ips[0].ip.as_deref(), Some("10.0.0.1"));
        assert!(st.conditions[0].last_probe_time.is_none());
    }

    #[test]
    fn fields_are_written_in_number_order() {
        // `immutable` (4) before `data` (2) in the JSON: Go writes 1, 2, 4.
        let c = codec("", "v1", "ConfigMap");
        let msg = c
            .message(br#"{"immutable":true,"data":{"k":"v"},"metadata":{"name":"a"}}"#)
            .unwrap();
        let mut want = Vec::new();
        put_bytes(&mut want, 1, &[0x0a, 1, b'a']);
        put_bytes(&mut want, 2, &[0x0a, 1, b'k', 0x12, 1, b'v']);
        want.extend_from_slice(&[0x20, 1]);
        assert_eq!(&msg[..], &want[..]);
    }

    #[test]
    fn secret_bytes_and_deployment_strategy() {
        let c = codec("", "v1", "Secret");
        let msg = c
            .message(br#"{"metadata":{"name":"s"},"type":"Opaque","data":{"k":"aGVsbG8="}}"#)
            .unwrap();
        let s = core::Secret::decode(&msg[..]).unwrap();
        assert_eq!(s.data["k"], b"hello");
        assert_eq!(s.r#type.as_deref(), Some("Opaque"));
        let d = codec("apps", "v1", "Deployment");
        let msg = d
            .message(br#"{"metadata":{"name":"d"},"spec":{"replicas":0,"selector":{"matchLabels":{"a":"b"}},"template":{"metadata":{"creationTimestamp":null},"spec":{"containers":[]}},"strategy":{"type":"RollingUpdate","rollingUpdate":{"maxUnavailable":"25%","maxSurge":1}}},"status":{}}"#)
            .unwrap();
        let dep = apps::Deployment::decode(&msg[..]).unwrap();
        let spec = dep.spec.unwrap();
        // A zero the JSON carries is written: `replicas: 0` is not `replicas` unset.
        assert_eq!(spec.replicas, Some(0));
        let ru = spec.strategy.unwrap().rolling_update.unwrap();
        assert_eq!(ru.max_unavailable.unwrap().str_val.as_deref(), Some("25%"));
        assert_eq!(ru.max_surge.unwrap().int_val, Some(1));
    }

    #[test]
    fn watch_frames_lists_bookmarks_and_errors() {
        let c = codec("", "v1", "ConfigMap");
        let msg = c
            .message(br#"{"metadata":{"name":"a","resourceVersion":"7"}}"#)
            .unwrap();
        let f = c.event("MODIFIED", &msg);
        let len = u32::from_be_bytes(f[..4].try_into().unwrap()) as usize;
        assert_eq!(len, f.len() - 4);
        let ev = meta::WatchEvent::decode(&f[4..]).unwrap();
        assert_eq!(ev.r#type.as_deref(), Some("MODIFIED"));
        let raw = ev.object.unwrap().raw.unwrap();
        let unk = unwrap_envelope(&raw);
        let cm = core::ConfigMap::decode(unk.raw.as_deref().unwrap()).unwrap();
        assert_eq!(cm.metadata.unwrap().resource_version.as_deref(), Some("7"));

        let b = c
            .bookmark(&json!({"kind":"ConfigMap","apiVersion":"v1","metadata":{"resourceVersion":"99","annotations":{"k8s.io/initial-events-end":"true"}}}))
            .unwrap();
        let ev = meta::WatchEvent::decode(&b[4..]).unwrap();
        assert_eq!(ev.r#type.as_deref(), Some("BOOKMARK"));
        let unk = unwrap_envelope(&ev.object.unwrap().raw.unwrap());
        let cm = core::ConfigMap::decode(unk.raw.as_deref().unwrap()).unwrap();
        let m = cm.metadata.unwrap();
        assert_eq!(m.resource_version.as_deref(), Some("99"));
        assert_eq!(m.annotations["k8s.io/initial-events-end"], "true");

        let e = c
            .error(&json!({"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"too old","reason":"Expired","code":410}))
            .unwrap();
        let ev = meta::WatchEvent::decode(&e[4..]).unwrap();
        assert_eq!(ev.r#type.as_deref(), Some("ERROR"));
        let unk = unwrap_envelope(&ev.object.unwrap().raw.unwrap());
        assert_eq!(unk.type_meta.unwrap().kind.as_deref(), Some("Status"));
        let st = meta::Status::decode(unk.raw.as_deref().unwrap()).unwrap();
        assert_eq!(
            (st.code, st.reason.as_deref()),
            (Some(410), Some("Expired"))
        );

        // A list of two, written as head + (prefix + item)* + tail.
        let items = [
            msg.clone(),
            c.message(br#"{"metadata":{"name":"b"}}"#).unwrap(),
        ];
        let (head, tail) = c.list_head(123, None, items.iter().map(|m| m.len()));
        let mut body = head.to_vec();
        for m in &items {
            item_prefix(m.len(), &mut body);
            body.extend_from_slice(m);
        }
        body.extend_from_slice(&tail);
        let unk = unwrap_envelope(&body);
        assert_eq!(
            unk.type_meta.unwrap().kind.as_deref(),
            Some("ConfigMapList")
        );
        let list = core::ConfigMapList::decode(unk.raw.as_deref().unwrap()).unwrap();
        assert_eq!(
            list.metadata.unwrap().resource_version.as_deref(),
            Some("123")
        );
        let names: Vec<_> = list
            .items
            .iter()
            .map(|i| i.metadata.as_ref().unwrap().name.clone().unwrap())
            .collect();
        assert_eq!(names, ["a", "b"]);
    }

    #[test]
    fn what_the_schema_cannot_express_is_refused_not_dropped() {
        let c = codec("", "v1", "ConfigMap");
        for bad in [
            // A field of a newer API server.
            &br#"{"metadata":{"name":"a"},"newField":1}"#[..],
            br#"{"metadata":{"name":"a","newMeta":"x"}}"#,
            // Mistyped values.
            br#"{"metadata":{"name":1}}"#,
            br#"{"metadata":{"generation":"1"}}"#,
            br#"{"metadata":{"generation":1.5}}"#,
            br#"{"metadata":{"creationTimestamp":"yesterday"}}"#,
            br#"{"binaryData":{"k":"not base64!"}}"#,
            br#"{"data":["a"]}"#,
            br#"[1]"#,
            br#"{"metadata":{"name":"a"}} trailing"#,
            br#"{"metadata":{"name":"a"}"#,
        ] {
            assert!(c.message(bad).is_err(), "{}", String::from_utf8_lossy(bad));
        }
        // Custom resources have no codec.
        assert!(Codec::for_kind("example.com", "v1", "Widget").is_none());
        // An inline within an inline (NamedRuleWithOperations inlines RuleWithOperations,
        // which inlines Rule) has no slot: its keys are refused, the rest encodes.
        let vap = codec(
            "admissionregistration.k8s.io",
            "v1",
            "ValidatingAdmissionPolicy",
        );
        let nested = br#"{"spec":{"matchConstraints":{"excludeResourceRules":[{"resourceNames":["x"],"operations":["CREATE"],"apiGroups":[""]}]}}}"#;
        assert!(vap.message(nested).is_err());
        let plain =
            br#"{"spec":{"matchConstraints":{"excludeResourceRules":[{"resourceNames":["x"]}]}}}"#;
        assert!(vap.message(plain).is_ok());
    }

    #[test]
    fn a_null_list_element_keeps_its_place() {
        // Go decodes `[null, {…}]` into a zero Container then the named one.
        let c = codec("", "v1", "Pod");
        let msg = c
            .message(br#"{"spec":{"containers":[null,{"name":"b"}]}}"#)
            .unwrap();
        let pod = core::Pod::decode(&msg[..]).unwrap();
        let names: Vec<_> = pod
            .spec
            .unwrap()
            .containers
            .iter()
            .map(|c| c.name.clone().unwrap_or_default())
            .collect();
        assert_eq!(names, ["", "b"]);
    }

    #[test]
    fn long_fields_get_multibyte_lengths() {
        let c = codec("", "v1", "ConfigMap");
        let big = "x".repeat(70_000);
        let json = format!(r#"{{"metadata":{{"name":"a"}},"data":{{"k":"{big}"}}}}"#);
        let msg = c.message(json.as_bytes()).unwrap();
        let cm = core::ConfigMap::decode(&msg[..]).unwrap();
        assert_eq!(cm.data["k"].len(), 70_000);
    }

    proptest::proptest! {
        /// Whatever the upstream sends, the encoder answers or refuses; it never panics.
        #[test]
        fn never_panics(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..256)) {
            let c = codec("", "v1", "Pod");
            let _ = c.message(&bytes);
        }

        /// Any names, labels and data (escapes, unicode, long values) decode back as sent.
        #[test]
        fn strings_survive(
            name in "\\PC{0,40}",
            labels in proptest::collection::btree_map("\\PC{0,20}", "\\PC{0,20}", 0..5),
            data in proptest::collection::btree_map("\\PC{0,20}", "\\PC{0,300}", 0..5),
            gen in proptest::prelude::any::<i64>(),
        ) {
            let c = codec("", "v1", "ConfigMap");
            let json = json!({"kind":"ConfigMap","apiVersion":"v1","metadata":{"name":name,"labels":labels,"generation":gen},"data":data});
            let msg = c.message(json.to_string().as_bytes()).unwrap();
            let cm = core::ConfigMap::decode(&msg[..]).unwrap();
            let m = cm.metadata.unwrap();
            proptest::prop_assert_eq!(m.name.unwrap_or_default(), name);
            proptest::prop_assert_eq!(m.generation, Some(gen));
            proptest::prop_assert_eq!(m.labels, labels);
            proptest::prop_assert_eq!(cm.data, data);
        }
    }
}
