//! The subject contract's shared cases (`clients/contract/messages.json`, made by
//! `examples/record_contract.rs`): each recorded message fed to a [`Session`], the
//! decisions compared with the ones the case states. The Go package replays the same file.

use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use kcache_actors::core::mirror::Resync;
use kcache_actors::core::seal::Keyring;
use kcache_actors::core::sign::Verifier;
use kcache_actors::fleet::codec::Opener;
use kcache_subscriber::{Position, Session, Update, Via};
use serde_json::Value;

fn b64(s: &str) -> Vec<u8> {
    base64::engine::general_purpose::STANDARD
        .decode(s)
        .expect("base64 in the cases")
}

/// An update as the cases name decisions.
fn decision(u: &Update) -> Option<String> {
    Some(match u {
        Update::Snapshot { stamp, .. } => format!("snapshot {}:{}", stamp.epoch, stamp.seq),
        Update::Event {
            stamp, replayed, ..
        } => format!(
            "apply {}:{}{}",
            stamp.epoch,
            stamp.seq,
            if *replayed { " replayed" } else { "" }
        ),
        Update::Progress { rv } => format!("progress {rv}"),
        Update::Resync(Resync::Gap) => "resync gap".into(),
        Update::Resync(Resync::NewEpoch) => "resync new-epoch".into(),
        Update::Resync(Resync::Start) => "resync start".into(),
        Update::Resync(Resync::Retry) => "resync retry".into(),
        Update::Refused(_) => "refused".into(),
        Update::Resumed { .. } => return None,
    })
}

fn message(step: &Value) -> async_nats::Message {
    let mut headers = async_nats::HeaderMap::new();
    for h in step["headers"].as_array().expect("headers") {
        headers.append(
            h[0].as_str().expect("a header name"),
            h[1].as_str().expect("a header value"),
        );
    }
    let payload = bytes::Bytes::from(b64(step["payload"].as_str().expect("payload")));
    async_nats::Message {
        subject: step["subject"].as_str().expect("subject").into(),
        reply: None,
        length: payload.len(),
        payload,
        headers: Some(headers),
        status: None,
        description: None,
    }
}

#[test]
fn every_recorded_case_leads_to_its_decisions() {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../contract/messages.json"
    ))
    .expect("clients/contract/messages.json");
    let file: Value = serde_json::from_str(&text).expect("the cases parse");
    assert_eq!(
        file["contract"],
        kcache_actors::core::wire::CONTRACT_VERSION,
        "the cases are of this contract version"
    );
    let seal_keys: Vec<(String, Vec<u8>)> = file["sealKeys"]
        .as_array()
        .expect("sealKeys")
        .iter()
        .map(|k| {
            (
                k["id"].as_str().expect("id").to_string(),
                b64(k["key"].as_str().expect("key")),
            )
        })
        .collect();
    let verifier = Arc::new(
        Verifier::new(
            file["verifyKeys"]
                .as_array()
                .expect("verifyKeys")
                .iter()
                .map(|k| b64(k.as_str().expect("a key")))
                .collect(),
        )
        .expect("verifier"),
    );
    let cases = file["cases"].as_array().expect("cases");
    assert!(cases.len() >= 10, "the recorded cases are all there");
    for case in cases {
        let name = case["name"].as_str().expect("name");
        let keyring = (case["sealed"] == true)
            .then(|| Arc::new(Keyring::new(seal_keys.clone(), &seal_keys[0].0).expect("keyring")));
        let opener = Opener {
            token: case["key"].as_str().expect("key").to_string(),
            keyring,
            verifier: Some(verifier.clone()),
        };
        let stale = Duration::from_secs(20).as_millis() as u64;
        let mut session = Session::new(opener, stale, 100);
        if let Some(r) = case["resume"].as_object() {
            let at = Position {
                epoch: r["epoch"].as_u64().expect("epoch"),
                seq: r["seq"].as_u64().expect("seq"),
            };
            session.resume(0, at);
        }
        for (i, step) in case["steps"].as_array().expect("steps").iter().enumerate() {
            if step["ask"] == true {
                session.ask();
                continue;
            }
            let via = match step["via"].as_str() {
                Some("live") => Via::Live,
                Some("log") => Via::Log,
                Some("reply") => Via::Reply,
                other => panic!("{name}: step {i}: via {other:?}"),
            };
            let out = session.on(1 + i as u64, &message(step), via);
            let mut got: Vec<String> = out.updates.iter().filter_map(decision).collect();
            match out.end {
                Some(Ok(n)) => got.push(format!("end {n}")),
                Some(Err(_)) => got.push("end error".into()),
                None => {}
            }
            let want: Vec<String> = step["want"]
                .as_array()
                .expect("want")
                .iter()
                .map(|w| w.as_str().expect("a decision").to_string())
                .collect();
            assert_eq!(got, want, "{name}: step {i}");
        }
    }
}
