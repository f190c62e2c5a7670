//! Property-based fuzzing of everything a client or NATS controls in the core: selectors,
//! resourceVersion rules, and the NATS decoders (message headers, chunk reassembly,
//! subject tokens, sealed payloads, JetStream answers, the mirror's stamps) must never
//! panic, whatever the input, and keep their invariants.
//! Runs as an ordinary test (so in CI); `PROPTEST_CASES=100000 cargo test --test
//! fuzz_parsers` runs longer.

use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;
use kcache_actors::core::interest::sync::{Batch, Part, Peers};
use kcache_actors::core::interest::{self as interest, Interest};
use kcache_actors::core::key::{Key, ResourceType, Scope};
use kcache_actors::core::lease;
use kcache_actors::core::mirror::{Input, Mirror, Output, Resync, Stamp};
use kcache_actors::core::object::{self, Object, Schema};
use kcache_actors::core::page::Continue;
use kcache_actors::core::rv::{self, plan_list, plan_watch, Rv, RvMatch};
use kcache_actors::core::seal::Keyring;
use kcache_actors::core::selector::{FieldSelector, LabelSelector, MAX_REQUIREMENTS};
use kcache_actors::core::subject::{self, escape, key_token, parse_key_token, unescape, Subjects};
use kcache_actors::core::wire::{self, Frame, Kind, Reassembler};
use proptest::prelude::*;
use serde_json::json;

/// Strings biased towards selector syntax, so the parsers' deep branches are reached.
fn selectorish() -> impl Strategy<Value = String> {
    let atom = prop_oneof![
        Just("a".to_string()),
        Just("app".to_string()),
        Just("example.com/x".to_string()),
        Just("=".to_string()),
        Just("==".to_string()),
        Just("!=".to_string()),
        Just("!".to_string()),
        Just(",".to_string()),
        Just(" in ".to_string()),
        Just(" notin ".to_string()),
        Just("(".to_string()),
        Just(")".to_string()),
        Just(">".to_string()),
        Just("<".to_string()),
        Just("\\".to_string()),
        Just("5".to_string()),
        Just("metadata.name".to_string()),
        Just("spec.nodeName".to_string()),
        "[ -~]{0,4}",
        "\\PC{0,3}",
    ];
    prop::collection::vec(atom, 0..24).prop_map(|v| v.concat())
}

/// Header values biased towards what `Frame::parse` reads: numbers, `i/n`, kinds.
fn header_value() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<u64>().prop_map(|n| n.to_string()),
        any::<u32>().prop_map(|n| n.to_string()),
        (any::<u32>(), any::<u32>()).prop_map(|(i, n)| format!("{i}/{n}")),
        (0u32..4, 0u32..4).prop_map(|(i, n)| format!("{i}/{n}")),
        Just("event".to_string()),
        Just("heartbeat".to_string()),
        Just("snapshot".to_string()),
        Just("replay".to_string()),
        Just("not-ready".to_string()),
        Just("18446744073709551616".to_string()),
        Just("4294967296".to_string()),
        "[ +/0-9-]{0,12}",
        "\\PC{0,8}",
    ]
}

fn kind() -> impl Strategy<Value = Kind> {
    prop_oneof![
        Just(Kind::Event),
        Just(Kind::Heartbeat),
        Just(Kind::Snapshot),
        Just(Kind::Replay),
        Just(Kind::NotReady),
    ]
}

/// Subject tokens biased towards escapes: `=`, hex digits of both cases, signs, `_`.
fn tokenish() -> impl Strategy<Value = String> {
    let atom = prop_oneof![
        Just("=".to_string()),
        Just("_".to_string()),
        Just("+".to_string()),
        Just(".".to_string()),
        "[0-9A-Fa-f]{1,2}",
        "[A-Za-z0-9-]{1,3}",
        "\\PC{0,2}",
    ];
    prop::collection::vec(atom, 0..10).prop_map(|v| v.concat())
}

/// One message as an owner sends it: its headers and its chunks.
#[derive(Debug, Clone)]
struct Sent {
    frame: Frame,
    body: Bytes,
    chunks: Vec<Bytes>,
}

/// Messages with distinct stamps (as a publisher's are), some of two owners sharing a
/// seq, each split at its own chunk size.
fn sent_messages() -> impl Strategy<Value = Vec<Sent>> {
    prop::collection::vec(
        (
            prop::collection::vec(any::<u8>(), 0..200),
            1usize..64,
            prop_oneof![Just(Kind::Event), Just(Kind::Snapshot), Just(Kind::Replay)],
            any::<bool>(),
        ),
        1..6,
    )
    .prop_map(|v| {
        v.into_iter()
            .enumerate()
            .map(|(i, (body, max, kind, sealed))| {
                let body = Bytes::from(body);
                let chunks = wire::split(body.clone(), max);
                let frame = Frame {
                    kind,
                    // Pairs of owners (one fenced off) publishing the same seq.
                    epoch: 1 + (i % 2) as u64,
                    seq: (i / 2) as u64,
                    rv: 7,
                    owner: format!("r{}", i % 2),
                    chunk: None,
                    key_id: sealed.then(|| "k1".to_string()),
                };
                Sent {
                    frame,
                    body,
                    chunks,
                }
            })
            .collect()
    })
}

/// The frame of chunk `i` (0-based) of a message.
fn chunk_frame(m: &Sent, i: usize) -> Frame {
    let n = m.chunks.len() as u32;
    let mut f = m.frame.clone();
    f.chunk = (n > 1).then_some((i as u32 + 1, n));
    f
}

/// Feeds frames, checking every body the reassembler yields is the whole body of the
/// message the frame belongs to, and within the limit.
fn feed_checked(
    r: &mut Reassembler,
    msgs: &[Sent],
    order: impl IntoIterator<Item = (usize, usize)>,
) -> Result<Vec<wire::Result<Option<Bytes>>>, TestCaseError> {
    let mut out = Vec::new();
    for (m, i) in order {
        let frame = chunk_frame(&msgs[m], i);
        let res = r.feed(&frame, msgs[m].chunks[i].clone());
        if let Ok(Some(body)) = &res {
            prop_assert_eq!(body, &msgs[m].body, "a wrong body for message {}", m);
            prop_assert!(body.len() <= r.limit(frame.kind));
        }
        out.push(res);
    }
    Ok(out)
}

/// Whether `escape` leaves a byte as it is.
fn literal(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'-'
}

proptest! {
    #![proptest_config(ProptestConfig { cases: std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(2000), failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn label_selectors_never_panic(s in selectorish()) {
        if let Ok(sel) = LabelSelector::parse(&s) {
            // A parsed selector evaluates on any object.
            for labels in [json!({"app": "web", "a": "5"}), json!(null)] {
                let o = Object::from_value(Schema::Generic, &json!({"metadata": {"labels": labels}}));
                let _ = sel.matches(&o.expect("valid object"));
            }
        }
    }

    #[test]
    fn field_selectors_never_panic(s in selectorish()) {
        if let Ok(sel) = FieldSelector::parse(&s) {
            prop_assert!(sel.requirements().len() <= MAX_REQUIREMENTS);
            let _ = sel.validate_for("", "pods", true);
            let pod = json!({"metadata": {"name": "a"}, "spec": {"nodeName": "n"}});
            let _ = sel.matches(&Object::from_value(Schema::Pod, &pod).expect("valid pod"));
        }
    }

    #[test]
    fn object_parsers_never_panic(b in proptest::collection::vec(any::<u8>(), 0..256), s in "\\PC{0,96}") {
        for schema in [Schema::Generic, Schema::Pod, Schema::Secret, Schema::ConfigMap, Schema::Namespace] {
            for input in [&b[..], s.as_bytes()] {
                let _ = Object::parse(Bytes::copy_from_slice(input), schema);
                let _ = Object::parse_copy(input, schema, "K", "v1");
                let _ = object::parse_line(input, schema);
                let _ = object::parse_list(Bytes::copy_from_slice(input), schema, "K", "v1");
            }
        }
    }

    #[test]
    fn objects_keep_their_bytes_and_edits_stay_json(
        name in "[a-z0-9\\\\\"é\\u{1F600} ]{0,12}",
        labels in proptest::collection::btree_map("[a-z]{1,4}", "[a-z0-9\\\\\" ]{0,6}", 0..4),
        rv in any::<u64>(),
        data in proptest::collection::vec(any::<f64>(), 0..4),
        with_kind in any::<bool>(),
        new_rv in any::<u64>(),
    ) {
        let mut v = json!({"metadata": {"name": name, "labels": labels, "resourceVersion": rv.to_string()}, "data": data});
        if with_kind {
            v["kind"] = json!("ConfigMap");
        }
        let text = serde_json::to_vec(&v).expect("json");
        let o = Object::parse_copy(&text, Schema::ConfigMap, "ConfigMap", "v1").expect("valid object");
        prop_assert_eq!(o.name(), name.as_str());
        prop_assert_eq!(o.rv(), rv);
        for (k, val) in &labels {
            prop_assert_eq!(o.label(k), Some(val.as_str()));
        }
        // Only `kind`/`apiVersion` were added: the object reads back equal otherwise.
        let mut back: serde_json::Value = serde_json::from_slice(o.json()).expect("still JSON");
        prop_assert_eq!(back["kind"].clone(), json!("ConfigMap"));
        prop_assert_eq!(back["apiVersion"].clone(), json!("v1"));
        if let Some(m) = back.as_object_mut() {
            m.remove("apiVersion");
            if !with_kind {
                m.remove("kind");
            }
        }
        // Compared with the text parsed the same way (float digits read back identically).
        let v: serde_json::Value = serde_json::from_slice(&text).expect("json");
        prop_assert_eq!(&back, &v);
        // An RV edit changes that member only.
        let edited = o.with_rv(new_rv);
        let mut after: serde_json::Value = serde_json::from_slice(edited.json()).expect("still JSON");
        prop_assert_eq!(after["metadata"]["resourceVersion"].clone(), json!(new_rv.to_string()));
        after["metadata"]["resourceVersion"] = json!(rv.to_string());
        let mut before: serde_json::Value = serde_json::from_slice(o.json()).expect("JSON");
        before["metadata"]["resourceVersion"] = json!(rv.to_string());
        prop_assert_eq!(after, before);
    }

    #[test]
    fn arbitrary_text_never_panics(s in "\\PC{0,64}") {
        let _ = LabelSelector::parse(&s);
        let _ = FieldSelector::parse(&s);
        let _ = Rv::parse(Some(&s));
        let _ = RvMatch::parse(Some(&s));
        let _ = rv::parse_bool("watch", Some(&s));
    }

    #[test]
    fn resource_versions_parse_exactly_the_decimal_integers(n in any::<u64>(), junk in "[^0-9]{1,4}") {
        let expected = if n == 0 { Rv::Any } else { Rv::At(n) };
        prop_assert_eq!(Rv::parse(Some(&n.to_string())), Ok(expected));
        let bad = format!("{n}{junk}");
        prop_assert!(Rv::parse(Some(&bad)).is_err());
    }

    #[test]
    fn plans_never_panic_and_continue_or_exact_go_upstream(
        rv_s in prop_oneof![Just(None), Just(Some("0".to_string())), "[0-9]{1,6}".prop_map(Some), "\\PC{0,4}".prop_map(Some)],
        m in prop_oneof![Just(None), Just(Some("Exact")), Just(Some("NotOlderThan")), Just(Some("bogus"))],
        limit in prop::option::of(0u64..1000),
        cont in any::<bool>(),
        sie in prop::option::of(any::<bool>()),
        bookmarks in any::<bool>(),
    ) {
        let Ok(rv) = Rv::parse(rv_s.as_deref()) else { return Ok(()) };
        // A resourceVersion with leading zeros ("00") is not "0" to the API server's list
        // storage (it compares the string); kcache's request parser forwards such queries
        // before any plan (`services::request`), so the core never plans them.
        if rv == Rv::Any && rv_s.as_deref() != Some("0") {
            return Ok(());
        }
        for watch in [false, true] {
            let opts = rv::ListOptions {
                watch,
                resource_version: rv_s.as_deref(),
                resource_version_match: m,
                has_continue: cont,
                send_initial_events: sie,
            };
            if rv::validate(&opts).is_err() {
                continue;
            }
            let parsed = RvMatch::parse(m);
            if watch {
                // What validation lets through: no match, or NotOlderThan with sendInitialEvents.
                prop_assert!(parsed.is_none() || (parsed == Some(RvMatch::NotOlderThan) && sie.is_some()));
                let w = plan_watch(rv, sie, bookmarks);
                // The initial-events-end bookmark is only ever promised with bookmarks allowed.
                prop_assert!(!w.initial_events_end_bookmark || bookmarks);
                prop_assert_eq!(w.from_rv, rv.floor());
            } else {
                prop_assert!(sie.is_none());
                // A token that is not kcache's is never read by kcache.
                let plan = plan_list(rv, parsed, limit, cont.then_some(&Continue::Upstream));
                if cont {
                    prop_assert_eq!(plan, rv::ListPlan::Upstream);
                } else {
                    let rv::ListPlan::Cache(read) = plan else {
                        return Err(TestCaseError::fail("a list without a token is the cache's"));
                    };
                    // A read with the resourceVersion unset is never served unproven,
                    // an exact one never from the current state.
                    prop_assert_eq!(read.at == rv::At::Consistent, rv == Rv::Unset);
                    if parsed == Some(RvMatch::Exact) {
                        prop_assert_eq!(read.at, rv::At::Exact(rv.floor()));
                    }
                }
            }
        }
    }

    #[test]
    fn frame_headers_never_panic_and_what_parses_round_trips(
        values in prop::collection::vec(prop::option::of(header_value()), 7),
    ) {
        let names = [wire::H_TYPE, wire::H_EPOCH, wire::H_SEQ, wire::H_RV, wire::H_OWNER, wire::H_CHUNK, wire::H_KEY_ID];
        let map: HashMap<&str, String> = names
            .iter()
            .zip(values)
            .filter_map(|(n, v)| v.map(|v| (*n, v)))
            .collect();
        if let Ok(frame) = Frame::parse(|n| map.get(n).map(String::as_str)) {
            if let Some((i, n)) = frame.chunk {
                prop_assert!(i >= 1 && i <= n && n >= 2);
            }
            let again: HashMap<&str, String> = frame.headers().into_iter().collect();
            prop_assert_eq!(Frame::parse(|n| again.get(n).map(String::as_str)), Ok(frame));
        }
    }

    #[test]
    fn frames_round_trip_through_headers(
        kind in kind(),
        epoch in any::<u64>(),
        seq in any::<u64>(),
        rv in any::<u64>(),
        owner in "\\PC{0,12}",
        chunk in prop::option::of((1u32.., 2u32..).prop_map(|(i, n)| (i.min(n), n))),
        key_id in prop::option::of("[a-z0-9-]{1,8}"),
    ) {
        let frame = Frame { kind, epoch, seq, rv, owner, chunk, key_id };
        let map: HashMap<&str, String> = frame.headers().into_iter().collect();
        prop_assert_eq!(Frame::parse(|n| map.get(n).map(String::as_str)), Ok(frame));
    }

    #[test]
    fn split_then_reassemble_reproduces_any_body(
        body in prop::collection::vec(any::<u8>(), 0..3000),
        max in 0usize..1500,
        limit in 0usize..4000,
        kind in prop_oneof![Just(Kind::Event), Just(Kind::Snapshot), Just(Kind::Replay)],
    ) {
        let body = Bytes::from(body);
        let chunks = wire::split(body.clone(), max);
        let n = chunks.len();
        prop_assert_eq!(n, body.len().div_ceil(max.max(1)).max(1));
        prop_assert!(chunks.iter().all(|c| c.len() <= max.max(1)));
        prop_assert!(n == 1 || chunks.iter().all(|c| !c.is_empty()));
        prop_assert_eq!(chunks.concat(), body.to_vec());
        let msg = Sent {
            frame: Frame { kind, epoch: 1, seq: 1, rv: 1, owner: "a".into(), chunk: None, key_id: None },
            body: body.clone(),
            chunks,
        };
        let mut r = Reassembler::new(limit);
        let out = feed_checked(&mut r, std::slice::from_ref(&msg), (0..n).map(|i| (0, i)))?;
        let errors = out.iter().filter(|o| o.is_err()).count();
        if body.len() <= limit {
            prop_assert_eq!(out.last(), Some(&Ok(Some(body))));
            prop_assert_eq!(errors, 0);
        } else {
            // Refused once, whole, with the typed error; the rest of its run is quiet.
            prop_assert_eq!(errors, 1, "{:?}", out);
            let refused = out.iter().any(|o| matches!(o, Err(wire::Error::TooLarge { .. })));
            prop_assert!(refused, "{:?}", out);
            prop_assert!(out.iter().all(|o| !matches!(o, Ok(Some(_)))));
        }
    }

    #[test]
    fn runs_in_order_are_each_reassembled_once(msgs in sent_messages(), limit in 0usize..300) {
        let order: Vec<_> = msgs
            .iter()
            .enumerate()
            .flat_map(|(m, s)| (0..s.chunks.len()).map(move |i| (m, i)))
            .collect();
        let mut r = Reassembler::new(limit);
        let out = feed_checked(&mut r, &msgs, order.iter().copied())?;
        let whole: Vec<&Bytes> = out.iter().filter_map(|o| o.as_ref().ok().and_then(Option::as_ref)).collect();
        let fitting: Vec<&Bytes> = msgs.iter().filter(|m| m.body.len() <= limit).map(|m| &m.body).collect();
        prop_assert_eq!(whole, fitting);
        let errors = out.iter().filter(|o| o.is_err()).count();
        prop_assert_eq!(errors, msgs.len() - msgs.iter().filter(|m| m.body.len() <= limit).count());
    }

    #[test]
    fn any_order_of_chunks_never_yields_a_wrong_body(
        msgs in sent_messages(),
        picks in prop::collection::vec((any::<prop::sample::Index>(), any::<prop::sample::Index>()), 0..60),
        limit in 0usize..300,
        resets in prop::collection::vec(any::<bool>(), 60),
    ) {
        let mut r = Reassembler::new(limit);
        for (k, (m, i)) in picks.iter().enumerate() {
            let m = m.index(msgs.len());
            let i = i.index(msgs[m].chunks.len());
            feed_checked(&mut r, &msgs, [(m, i)])?;
            if resets[k] && k % 7 == 0 {
                r.reset();
            }
        }
    }

    #[test]
    fn lost_duplicated_or_swapped_chunks_never_yield_a_wrong_body(
        msgs in sent_messages(),
        damage in prop::collection::vec((0u8..3, any::<prop::sample::Index>()), 0..4),
        limit in 0usize..300,
    ) {
        let mut order: Vec<(usize, usize)> = msgs
            .iter()
            .enumerate()
            .flat_map(|(m, s)| (0..s.chunks.len()).map(move |i| (m, i)))
            .collect();
        for (what, at) in damage {
            let at = at.index(order.len());
            match what {
                0 => { order.remove(at); }
                1 => order.insert(at, order[at]),
                _ => if at + 1 < order.len() { order.swap(at, at + 1) },
            }
            if order.is_empty() {
                break;
            }
        }
        let mut r = Reassembler::new(limit);
        feed_checked(&mut r, &msgs, order)?;
    }

    #[test]
    fn hostile_chunk_headers_never_panic(
        chunks in prop::collection::vec((0u32..4, prop_oneof![0u32..4, Just(u32::MAX)], 0usize..40, 0u64..3), 0..40),
        limit in prop_oneof![0usize..100, Just(usize::MAX)],
    ) {
        let mut r = Reassembler::new(limit);
        for (i, n, len, seq) in chunks {
            let i = if n == u32::MAX && i == 3 { u32::MAX } else { i };
            let frame = Frame { kind: Kind::Snapshot, epoch: 1, seq, rv: 1, owner: String::new(), chunk: Some((i, n)), key_id: None };
            if let Ok(Some(body)) = r.feed(&frame, Bytes::from(vec![b'x'; len])) {
                prop_assert!(body.len() <= limit);
            }
        }
    }

    #[test]
    fn escape_is_reversed_by_unescape(s in any::<String>()) {
        let t = escape(&s);
        prop_assert!(t == subject::NONE || t.bytes().all(|b| literal(b) || b == b'='));
        prop_assert_eq!(unescape(&t), Some(s));
    }

    #[test]
    fn unescape_accepts_only_what_escape_writes(t in prop_oneof![tokenish(), "\\PC{0,12}"]) {
        // One string, one token: a subject names exactly one key.
        if let Some(s) = unescape(&t) {
            prop_assert_eq!(escape(&s), t);
        }
    }

    #[test]
    fn key_tokens_never_panic_and_parse_back_to_themselves(
        parts in prop::collection::vec(prop_oneof![tokenish(), Just("all".to_string()), Just("name".to_string()), Just("node".to_string())], 0..8),
    ) {
        let token = parts.join(".");
        if let Some(p) = parse_key_token(&token) {
            let again = format!(
                "{}.{}.{}.{}.{}.{}",
                escape(&p.group),
                escape(&p.version),
                escape(&p.resource),
                escape(p.namespace.as_deref().unwrap_or("")),
                p.scope,
                escape(p.value.as_deref().unwrap_or("")),
            );
            prop_assert_eq!(again, token);
        }
    }

    #[test]
    fn keys_survive_their_subject_token(
        group in "\\PC{0,10}",
        version in "\\PC{1,5}",
        resource in "\\PC{1,10}",
        namespace in prop::option::of("\\PC{1,10}"),
        value in "\\PC{1,10}",
        scope in 0u8..4,
        prefix in "[a-z.]{1,8}",
    ) {
        let rt = Arc::new(ResourceType::new(&group, &version, &resource, "Kind", true));
        let scope = match scope {
            0 => Scope::Cluster,
            1 => Scope::Namespace(value.clone()),
            2 => Scope::Name { namespace: namespace.clone(), name: value.clone() },
            _ => Scope::Node(value.clone()),
        };
        let key = Key::new(rt, scope.clone());
        let token = key_token(&key);
        let p = parse_key_token(&token).expect("a key's token parses");
        prop_assert_eq!(&p.group, &group);
        prop_assert_eq!(&p.version, &version);
        prop_assert_eq!(&p.resource, &resource);
        let (ns, value) = match scope {
            Scope::Cluster => (None, None),
            Scope::Namespace(ns) => (Some(ns), None),
            Scope::Name { namespace, name } => (namespace, Some(name)),
            Scope::Node(node) => (None, Some(node)),
        };
        prop_assert_eq!(p.namespace, ns);
        prop_assert_eq!(p.value, value);
        let subjects = Subjects::new(&prefix);
        let (events, snapshot) = (subjects.events(&token), subjects.snapshot(&token));
        prop_assert_eq!(subjects.token_of_event(&events), Some(token.as_str()));
        prop_assert_eq!(subjects.token_of_event(&snapshot), None);
    }

    #[test]
    fn subjects_of_anything_never_panic(prefix in "\\PC{0,8}", subject in "\\PC{0,24}") {
        let _ = Subjects::new(&prefix).token_of_event(&subject);
        let _ = parse_key_token(&subject);
        let _ = unescape(&subject);
    }

    #[test]
    fn payloads_from_nats_never_panic(body in prop::collection::vec(any::<u8>(), 0..200), id in "[a-z0-9]{0,3}") {
        let _ = lease::parse_ack(&body);
        let _ = lease::api_result(&body);
        let ring = Keyring::new(vec![("k1".to_string(), vec![7; 32])], "k1").expect("a valid key");
        prop_assert!(ring.open(&id, &body, b"token").is_err());
        let (kid, sealed) = ring.seal(&body, b"token").expect("seals");
        prop_assert_eq!(ring.open(kid, &sealed, b"token").ok(), Some(body.clone()));
        prop_assert!(ring.open(kid, &sealed, b"other").is_err());
        if !sealed.is_empty() {
            let mut tampered = sealed.clone();
            tampered[body.len() % sealed.len()] ^= 1;
            prop_assert!(ring.open(kid, &tampered, b"token").is_err());
        }
    }

    #[test]
    fn interest_messages_from_nats_never_panic_and_keep_the_group_index(
        msgs in prop::collection::vec((
            0u8..3,
            0u64..3,
            0u64..6,
            prop::option::of((0u32..3, 0u32..3)),
            prop::collection::vec((0u8..4, prop_oneof![0u64..3, Just(u64::MAX)]), 0..4),
            prop::collection::vec((0u8..4, 0u64..3), 0..3),
            0u64..100,
        ), 0..40),
        now in 0u64..200,
    ) {
        const GROUP: &str = "_.v1.secrets.ns.name.";
        let token = |t: &u8| format!("{GROUP}t{t}");
        let (mut peers, mut table) = (Peers::default(), Interest::default());
        for (replica, epoch, seq, full, refs, covered, at) in &msgs {
            let batch = Batch {
                epoch: *epoch,
                seq: *seq,
                full: full.map(|(index, of)| Part { index, of }),
                refs: refs.iter().map(|(t, n)| (token(t), *n)).collect(),
                covered: covered.iter().map(|(t, n)| (token(t), *n)).collect(),
            };
            peers.receive(&mut table, &format!("r{replica}"), batch, *at);
        }
        let mut named = std::collections::HashSet::new();
        for t in 0..4u8 {
            let token = token(&t);
            let total = table.total(interest::Kind::Refs, &token, now, 50);
            prop_assert!(table.others(interest::Kind::Refs, &token, "r0", now, 50) <= total);
        }
        for r in ["r0", "r1", "r2"] {
            for kind in [interest::Kind::Refs, interest::Kind::Covered] {
                named.extend(table.records_of(kind, r).map(|(t, _)| t.to_string()));
            }
        }
        // The group index names exactly the tokens some record names.
        prop_assert_eq!(table.group_len(GROUP), named.len());
        for gone in table.expire(now, 50) {
            peers.forget(&gone);
        }
        // Whatever came before, a whole table leaves the receiver with exactly it.
        for r in ["r0", "r1", "r2"] {
            let table_of = Batch {
                epoch: 5,
                seq: 1_000,
                full: Some(Part { index: 0, of: 1 }),
                refs: vec![(token(&0), 1), (token(&2), 3)],
                covered: vec![(token(&1), 2)],
            };
            let heard = peers.receive(&mut table, r, table_of, now);
            prop_assert!(!heard.ask_full);
            let mut refs: Vec<(String, u64)> = table
                .records_of(interest::Kind::Refs, r)
                .map(|(t, n)| (t.to_string(), n))
                .collect();
            refs.sort();
            prop_assert_eq!(refs, vec![(token(&0), 1), (token(&2), 3)]);
            let covered: Vec<(String, u64)> = table
                .records_of(interest::Kind::Covered, r)
                .map(|(t, n)| (t.to_string(), n))
                .collect();
            prop_assert_eq!(covered, vec![(token(&1), 2)]);
        }
        prop_assert_eq!(peers.behind().count(), 0);
        prop_assert_eq!(table.group_len(GROUP), 3);
    }

    #[test]
    fn the_mirror_applies_only_contiguous_events_of_one_epoch(
        inputs in prop::collection::vec((0u8..3, 0u64..4, 0u64..8, 0u64..50), 0..60),
        buffer in 1usize..6,
    ) {
        let mut m: Mirror<u64> = Mirror::new(20, buffer);
        // What the outputs say the mirror holds: (epoch, last seq) once synced.
        let mut at: Option<(u64, u64)> = None;
        for (n, (what, epoch, seq, now)) in inputs.into_iter().enumerate() {
            let stamp = Stamp { epoch, seq, rv: seq };
            let input = match what {
                0 => Input::Event(stamp, n as u64),
                1 => Input::Heartbeat(stamp),
                _ => Input::Snapshot(stamp, n as u64),
            };
            for out in m.on(now * 3, input) {
                match out {
                    Output::Snapshot(s, _) => at = Some((s.epoch, s.seq)),
                    Output::Apply(s, _) => {
                        prop_assert_eq!(at, Some((s.epoch, s.seq - 1)), "applied out of order");
                        at = Some((s.epoch, s.seq));
                    }
                    // A refused stale snapshot asks again but keeps the state.
                    Output::Resync(Resync::Retry) => {}
                    Output::Resync(_) => at = None,
                    Output::Progress(_) | Output::Stale(_) => {}
                }
            }
        }
    }
}
