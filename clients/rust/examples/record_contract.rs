//! Writes the subject contract's shared test cases (`clients/contract/messages.json`):
//! messages made exactly as an owner makes them (`fleet::codec::encode`: sealed, signed,
//! chunked), each with the decisions a subscriber must take, written here by hand from
//! `docs/nats.md` — not computed by any subscriber. The Rust library
//! (`tests/contract.rs`) and the Go package (`clients/go`) each replay them; a change of
//! the contract is a change of this file and of both.
//!
//! ```sh
//! cargo run -p kcache-subscriber --example record_contract > clients/contract/messages.json
//! ```

use base64::Engine;
use bytes::Bytes;
use kcache_actors::core::seal::Keyring;
use kcache_actors::core::sign::Signer;
use kcache_actors::core::wire::{self, Frame, Kind};
use kcache_actors::fleet::codec;
use serde_json::{json, Value};

const PREFIX: &str = "kcache";
const CM: &str = "_.v1.configmaps.shop.all._";
const SECRETS: &str = "_.v1.secrets.shop.all._";
const NONCE: &str = "c0ntract";
const SEAL_KEY: [u8; 32] = [7; 32];
const SIGNING_SEED: [u8; 32] = [9; 32];
const OTHER_SEED: [u8; 32] = [11; 32];

fn b64(b: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(b)
}

/// How a message is made.
struct Make {
    key: &'static str,
    sealed: bool,
    signer: Option<&'static [u8; 32]>,
    chunk_max: usize,
}

const PLAIN: Make = Make {
    key: CM,
    sealed: false,
    signer: Some(&SIGNING_SEED),
    chunk_max: 1 << 20,
};

fn event_line(name: &str, rv: u64) -> Bytes {
    Bytes::from(format!(
        "{{\"type\":\"MODIFIED\",\"object\":{{\"kind\":\"ConfigMap\",\"apiVersion\":\"v1\",\"metadata\":{{\"name\":\"{name}\",\"namespace\":\"shop\",\"resourceVersion\":\"{rv}\"}}}}}}\n"
    ))
}

fn list(rv: u64) -> Bytes {
    Bytes::from(format!(
        "{{\"kind\":\"List\",\"apiVersion\":\"v1\",\"metadata\":{{\"resourceVersion\":\"{rv}\"}},\"items\":[]}}"
    ))
}

/// The messages of one body, each a step `{via, subject, headers, payload}`.
fn messages(
    make: &Make,
    via: &str,
    kind: Kind,
    (epoch, seq, rv): (u64, u64, u64),
    body: Bytes,
    request: u64,
) -> Vec<Value> {
    let frame = Frame {
        kind,
        epoch,
        seq,
        rv,
        owner: format!("replica-{epoch}"),
        chunk: None,
        key_id: None,
    };
    let ring = make
        .sealed
        .then(|| Keyring::new(vec![("k1".into(), SEAL_KEY.to_vec())], "k1").expect("keyring"));
    let signer = make.signer.map(|s| Signer::from_seed(s).expect("signer"));
    // Snapshot and resume answers come to the request's reply subject.
    let subject = match via {
        "live" => format!("{PREFIX}.ev.{}", make.key),
        _ => format!("{PREFIX}.reply.{}.{NONCE}.{request}", make.key),
    };
    codec::encode(
        frame,
        make.key,
        body,
        ring.as_ref(),
        signer.as_ref(),
        make.chunk_max,
    )
    .expect("encode")
    .into_iter()
    .map(|(headers, part)| {
        let mut hs: Vec<(String, String)> = headers
            .iter()
            .flat_map(|(n, vs)| vs.iter().map(move |v| (n.to_string(), v.to_string())))
            .collect();
        hs.sort();
        json!({"via": via, "subject": subject, "headers": hs, "payload": b64(&part), "want": []})
    })
    .collect()
}

/// One message expecting `want` (the last of a chunked run carries it).
fn step(mut msgs: Vec<Value>, want: &[&str]) -> Vec<Value> {
    if let Some(last) = msgs.last_mut() {
        last["want"] = json!(want);
    }
    msgs
}

fn ev(make: &Make, via: &str, epoch: u64, seq: u64, want: &[&str]) -> Vec<Value> {
    let rv = 100 * epoch + seq;
    // A resume answer ("log") answers request 1, the only request of those cases.
    step(
        messages(
            make,
            via,
            Kind::Event,
            (epoch, seq, rv),
            event_line("cm", rv),
            1,
        ),
        want,
    )
}

/// A resume answer's end marker (`fleet::resume`): `Ok(n)` sent, or why none.
fn end(key: &str, request: u64, res: Result<u64, &str>, want: &[&str]) -> Vec<Value> {
    let mut headers = vec![json!([
        wire::H_CONTRACT,
        wire::CONTRACT_VERSION.to_string()
    ])];
    headers.push(match res {
        Ok(n) => json!([wire::H_RESUME_END, n.to_string()]),
        Err(why) => json!([wire::H_RESUME_ERROR, why]),
    });
    vec![json!({
        "via": "log",
        "subject": format!("{PREFIX}.reply.{key}.{NONCE}.{request}"),
        "headers": headers,
        "payload": "",
        "want": want,
    })]
}

fn snap(make: &Make, request: u64, epoch: u64, seq: u64, want: &[&str]) -> Vec<Value> {
    let rv = 100 * epoch + seq;
    step(
        messages(
            make,
            "reply",
            Kind::Snapshot,
            (epoch, seq, rv),
            list(rv),
            request,
        ),
        want,
    )
}

fn hb(make: &Make, epoch: u64, seq: u64, rv: u64, want: &[&str]) -> Vec<Value> {
    step(
        messages(
            make,
            "live",
            Kind::Heartbeat,
            (epoch, seq, rv),
            Bytes::new(),
            0,
        ),
        want,
    )
}

fn ask() -> Vec<Value> {
    vec![json!({"ask": true})]
}

fn case(
    name: &str,
    key: &str,
    sealed: bool,
    resume: Option<(u64, u64)>,
    steps: Vec<Vec<Value>>,
) -> Value {
    json!({
        "name": name,
        "key": key,
        "sealed": sealed,
        "resume": resume.map(|(e, s)| json!({"epoch": e, "seq": s})),
        "steps": steps.concat(),
    })
}

fn main() {
    let p = &PLAIN;
    let sealed = &Make {
        key: SECRETS,
        sealed: true,
        ..PLAIN
    };
    let unsealed_on_sealed_key = &Make {
        key: SECRETS,
        sealed: false,
        ..PLAIN
    };
    let forged = &Make {
        signer: Some(&OTHER_SEED),
        ..PLAIN
    };
    let unsigned = &Make {
        signer: None,
        ..PLAIN
    };
    let chunked = &Make {
        chunk_max: 64,
        ..PLAIN
    };

    // A sealed event whose seq header is edited after sealing and signing.
    let mut edited = ev(sealed, "live", 5, 11, &["refused", "resync gap"]);
    for h in edited[0]["headers"].as_array_mut().expect("headers") {
        if h[0] == "Kcache-Seq" {
            h[1] = json!("12");
        }
    }
    // A message of a later contract version.
    let mut later = ev(p, "live", 5, 11, &["refused", "resync gap"]);
    for h in later[0]["headers"].as_array_mut().expect("headers") {
        if h[0] == "Kcache-Contract" {
            h[1] = json!("2");
        }
    }

    // The seq header written "+11": the same number (what a seal and a signature bind).
    let mut plus = ev(p, "live", 5, 11, &["apply 5:11"]);
    for h in plus[0]["headers"].as_array_mut().expect("headers") {
        if h[0] == "Kcache-Seq" {
            h[1] = json!("+11");
        }
    }
    // A key-id header with nothing in it, on a key that is not sealed.
    let mut empty_key_id = ev(p, "live", 5, 11, &["refused", "resync gap"]);
    empty_key_id[0]["headers"]
        .as_array_mut()
        .expect("headers")
        .push(json!(["Kcache-Key-Id", ""]));

    let cases = vec![
        case(
            "a snapshot, then events in order, a repeat dropped, a heartbeat's progress",
            CM,
            false,
            None,
            vec![
                ask(),
                snap(p, 1, 5, 10, &["snapshot 5:10"]),
                ev(p, "live", 5, 11, &["apply 5:11"]),
                ev(p, "live", 5, 12, &["apply 5:12"]),
                ev(p, "live", 5, 12, &[]),
                hb(p, 5, 12, 600, &["progress 600"]),
            ],
        ),
        case(
            "events before the snapshot are held and those after it applied",
            CM,
            false,
            None,
            vec![
                ask(),
                ev(p, "live", 5, 11, &[]),
                ev(p, "live", 5, 12, &[]),
                snap(p, 1, 5, 11, &["snapshot 5:11", "apply 5:12"]),
            ],
        ),
        case(
            "a skipped seq is a gap",
            CM,
            false,
            None,
            vec![
                ask(),
                snap(p, 1, 5, 10, &["snapshot 5:10"]),
                ev(p, "live", 5, 12, &["resync gap"]),
            ],
        ),
        case(
            "a heartbeat ahead of the last event is a gap",
            CM,
            false,
            None,
            vec![
                ask(),
                snap(p, 1, 5, 10, &["snapshot 5:10"]),
                hb(p, 5, 11, 511, &["resync gap"]),
            ],
        ),
        case(
            "a new owner's event asks for a snapshot",
            CM,
            false,
            None,
            vec![
                ask(),
                snap(p, 1, 5, 10, &["snapshot 5:10"]),
                ev(p, "live", 6, 1, &["resync new-epoch"]),
            ],
        ),
        case(
            "a fenced-off owner's event is ignored",
            CM,
            false,
            None,
            vec![
                ask(),
                snap(p, 1, 6, 3, &["snapshot 6:3"]),
                ev(p, "live", 5, 4, &[]),
            ],
        ),
        case(
            "a not-ready answer and an answer to an older request are ignored",
            CM,
            false,
            None,
            vec![
                ask(),
                step(
                    messages(p, "reply", Kind::NotReady, (5, 0, 0), Bytes::new(), 1),
                    &[],
                ),
                ask(),
                snap(p, 1, 5, 10, &[]),
                snap(p, 2, 5, 10, &["snapshot 5:10"]),
            ],
        ),
        case(
            "a chunked event is applied once, when whole",
            CM,
            false,
            None,
            vec![
                ask(),
                snap(chunked, 1, 5, 10, &["snapshot 5:10"]),
                ev(chunked, "live", 5, 11, &["apply 5:11"]),
            ],
        ),
        case(
            "a run half-collected when a snapshot covers it is dropped whole",
            CM,
            false,
            None,
            vec![
                ask(),
                ev(chunked, "live", 5, 11, &[])[..1].to_vec(),
                snap(p, 1, 5, 11, &["snapshot 5:11"]),
                ev(chunked, "live", 5, 11, &[])[1..].to_vec(),
                ev(p, "live", 5, 12, &["apply 5:12"]),
            ],
        ),
        case(
            "numbers read as the owner wrote them, a plus sign too",
            CM,
            false,
            None,
            vec![ask(), snap(p, 1, 5, 10, &["snapshot 5:10"]), plus],
        ),
        case(
            "an empty key id on an unsealed key is refused",
            CM,
            false,
            None,
            vec![ask(), snap(p, 1, 5, 10, &["snapshot 5:10"]), empty_key_id],
        ),
        case(
            "a sealed key's messages open; an unsealed one is refused",
            SECRETS,
            true,
            None,
            vec![
                ask(),
                snap(sealed, 1, 5, 10, &["snapshot 5:10"]),
                ev(sealed, "live", 5, 11, &["apply 5:11"]),
                ev(
                    unsealed_on_sealed_key,
                    "live",
                    5,
                    12,
                    &["refused", "resync gap"],
                ),
            ],
        ),
        case(
            "a header edited after sealing is refused",
            SECRETS,
            true,
            None,
            vec![ask(), snap(sealed, 1, 5, 10, &["snapshot 5:10"]), edited],
        ),
        case(
            "a message signed by another key is refused",
            CM,
            false,
            None,
            vec![
                ask(),
                snap(p, 1, 5, 10, &["snapshot 5:10"]),
                ev(forged, "live", 5, 11, &["refused", "resync gap"]),
            ],
        ),
        case(
            "an unsigned message is refused where the fleet signs",
            CM,
            false,
            None,
            vec![
                ask(),
                snap(p, 1, 5, 10, &["snapshot 5:10"]),
                ev(unsigned, "live", 5, 11, &["refused", "resync gap"]),
            ],
        ),
        case(
            "a later contract version is refused",
            CM,
            false,
            None,
            vec![ask(), snap(p, 1, 5, 10, &["snapshot 5:10"]), later],
        ),
        case(
            "resume: the log continues the position, then live goes on",
            CM,
            false,
            Some((5, 10)),
            vec![
                ask(),
                ev(p, "log", 5, 11, &["apply 5:11 replayed"]),
                ev(p, "log", 5, 12, &["apply 5:12 replayed"]),
                end(CM, 1, Ok(2), &["end 2"]),
                ev(p, "live", 5, 12, &[]),
                ev(p, "live", 5, 13, &["apply 5:13"]),
            ],
        ),
        case(
            "resume: an event already had is dropped, even a run's stray chunks",
            CM,
            false,
            Some((5, 10)),
            vec![
                ask(),
                ev(p, "log", 5, 10, &[]),
                // Live from between its first and second chunk: the rest of a run already had.
                ev(chunked, "live", 5, 10, &[])[1..].to_vec(),
                ev(p, "log", 5, 11, &["apply 5:11 replayed"]),
                end(CM, 1, Ok(2), &["end 2"]),
            ],
        ),
        case(
            "resume: the log no longer reaches back to the position",
            CM,
            false,
            Some((5, 10)),
            vec![ask(), ev(p, "log", 5, 14, &["resync gap"])],
        ),
        case(
            "resume: the key changed owner meanwhile",
            CM,
            false,
            Some((5, 10)),
            vec![ask(), ev(p, "log", 6, 1, &["resync new-epoch"])],
        ),
        case(
            "resume: a replica that cannot answer ends it, and a stale answer is ignored",
            CM,
            false,
            Some((5, 10)),
            vec![
                ask(),
                end(CM, 1, Err("busy: take a snapshot"), &["end error"]),
                ask(),
                ev(p, "log", 5, 11, &[]),
            ],
        ),
    ];
    let signer = Signer::from_seed(&SIGNING_SEED).expect("signer");
    let out = json!({
        "about": "kcache subject contract cases: messages as an owner makes them, and the decisions a subscriber must take (clients/contract/README.md)",
        "contract": kcache_actors::core::wire::CONTRACT_VERSION,
        "prefix": PREFIX,
        "nonce": NONCE,
        "sealKeys": [{"id": "k1", "key": b64(&SEAL_KEY)}],
        "verifyKeys": [b64(signer.public_key())],
        "cases": cases,
    });
    println!("{}", serde_json::to_string_pretty(&out).expect("json"));
}
