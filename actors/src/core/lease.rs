//! Ownership leases in a JetStream stream, spoken in the JetStream wire API directly.
//!
//! One stream (`KV_<bucket>`, subjects `$KV.<bucket>.>`, one message per subject,
//! `max_age` = the lease TTL) holds a message per owned key; its stream sequence is the
//! lease's **revision**, and the revision at which an owner created its lease is its
//! **epoch**, which only grows. Every write is a compare-and-set through the
//! `Nats-Expected-Last-Subject-Sequence` header: 0 to create (the key has no live
//! message: never owned, expired by `max_age`, or released), the current revision to
//! renew. Releasing deletes the message, so the next create succeeds at once.
//! (The Debian nats-server 2.9 has neither per-message TTLs nor the response shapes
//! newer clients expect, hence this small, explicit protocol.)

use serde::Deserialize;
use serde_json::json;

/// JetStream's error code for a failed `Nats-Expected-Last-Subject-Sequence` check.
pub const WRONG_LAST_SEQUENCE: u64 = 10071;
/// JetStream's error code for "stream name already in use" (with another config).
pub const STREAM_NAME_IN_USE: u64 = 10058;

pub const EXPECTED_LAST_SUBJECT_SEQ: &str = "Nats-Expected-Last-Subject-Sequence";

pub fn stream_name(bucket: &str) -> String {
    format!("KV_{bucket}")
}

/// The subject a key's lease is written to.
pub fn lease_subject(bucket: &str, token: &str) -> String {
    format!("$KV.{bucket}.{token}")
}

/// `$JS.API.STREAM.CREATE.<stream>` body.
pub fn stream_config(bucket: &str, ttl_ms: u64, replicas: u32) -> serde_json::Value {
    json!({
        "name": stream_name(bucket),
        "description": "kcache ownership leases, one message per key",
        "subjects": [format!("$KV.{bucket}.>")],
        "retention": "limits",
        "max_consumers": -1,
        "max_msgs": -1,
        "max_bytes": -1,
        "max_msgs_per_subject": 1,
        "max_age": ttl_ms * 1_000_000,
        "max_msg_size": -1,
        "storage": "file",
        "discard": "new",
        "num_replicas": replicas.clamp(1, 5),
        "duplicate_window": 0,
        "allow_direct": true,
        "deny_delete": false,
        "deny_purge": false,
    })
}

#[derive(Debug, PartialEq, Eq)]
pub enum Ack {
    /// Written at this stream sequence (the new revision).
    Written(u64),
    /// The compare-and-set failed: someone else's lease is there, or ours moved on.
    Conflict,
    /// Any other JetStream error (no stream, storage, …).
    Failed(String),
}

#[derive(Deserialize)]
struct RawAck {
    seq: Option<u64>,
    error: Option<ApiError>,
}

#[derive(Deserialize)]
pub struct ApiError {
    #[serde(default)]
    pub code: u64,
    #[serde(default)]
    pub err_code: u64,
    #[serde(default)]
    pub description: String,
}

/// Reads a publish acknowledgement.
pub fn parse_ack(body: &[u8]) -> Ack {
    match serde_json::from_slice::<RawAck>(body) {
        Ok(RawAck { error: Some(e), .. }) if e.err_code == WRONG_LAST_SEQUENCE => Ack::Conflict,
        Ok(RawAck { error: Some(e), .. }) => {
            Ack::Failed(format!("{} ({})", e.description, e.err_code))
        }
        Ok(RawAck { seq: Some(seq), .. }) => Ack::Written(seq),
        _ => Ack::Failed(format!(
            "unexpected acknowledgement: {}",
            String::from_utf8_lossy(body)
        )),
    }
}

/// Reads the answer to `$JS.API.STREAM.MSG.GET` with `last_by_subj`: the lease's
/// revision and holder (the message body, a replica id), `None` when there is none.
pub fn parse_stored(body: &[u8]) -> Result<Option<(u64, String)>, String> {
    use base64::Engine;
    #[derive(Deserialize)]
    struct Stored {
        seq: u64,
        #[serde(default)]
        data: String,
    }
    #[derive(Deserialize)]
    struct Answer {
        message: Option<Stored>,
        error: Option<ApiError>,
    }
    let answer: Answer = serde_json::from_slice(body).map_err(|e| e.to_string())?;
    match (answer.message, answer.error) {
        (Some(m), _) => {
            let holder = base64::engine::general_purpose::STANDARD
                .decode(m.data.as_bytes())
                .map_err(|e| e.to_string())?;
            Ok(Some((m.seq, String::from_utf8_lossy(&holder).into_owned())))
        }
        (None, Some(e)) if e.code == 404 => Ok(None),
        (None, Some(e)) => Err(format!("{} ({})", e.description, e.err_code)),
        (None, None) => Err("empty answer".into()),
    }
}

/// Reads any JetStream API answer: `Err` with its error when it carries one.
pub fn api_result(body: &[u8]) -> Result<(), ApiError> {
    #[derive(Deserialize)]
    struct Raw {
        error: Option<ApiError>,
    }
    match serde_json::from_slice::<Raw>(body) {
        Ok(Raw { error: Some(e) }) => Err(e),
        Ok(_) => Ok(()),
        Err(e) => Err(ApiError {
            code: 0,
            err_code: 0,
            description: format!("unreadable answer: {e}"),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_a_stored_lease_or_its_absence() {
        // nats-server 2.9's answers.
        let found = br#"{"type":"io.nats.jetstream.api.v1.stream_msg_get_response","message":{"subject":"$KV.b.t","seq":42,"data":"cjE=","time":"2026-11-24T00:00:00Z"}}"#;
        assert_eq!(parse_stored(found), Ok(Some((42, "r1".to_string()))));
        let missing = br#"{"type":"io.nats.jetstream.api.v1.stream_msg_get_response","error":{"code":404,"err_code":10037,"description":"no message found"}}"#;
        assert_eq!(parse_stored(missing), Ok(None));
        let other = br#"{"error":{"code":503,"err_code":10008,"description":"JetStream system temporarily unavailable"}}"#;
        assert!(parse_stored(other).is_err());
        assert!(parse_stored(b"not json").is_err());
    }

    #[test]
    fn acks_are_read() {
        assert_eq!(
            parse_ack(br#"{"stream":"KV_l","seq":42}"#),
            Ack::Written(42)
        );
        assert_eq!(
            parse_ack(
                br#"{"error":{"code":400,"err_code":10071,"description":"wrong last sequence: 41"}}"#
            ),
            Ack::Conflict
        );
        assert!(matches!(
            parse_ack(br#"{"error":{"code":503,"err_code":10039,"description":"no storage"}}"#),
            Ack::Failed(d) if d.contains("no storage")
        ));
        assert!(matches!(parse_ack(b"garbage"), Ack::Failed(_)));
        assert!(api_result(br#"{"type":"x","config":{}}"#).is_ok());
        assert_eq!(
            api_result(br#"{"error":{"code":400,"err_code":10058,"description":"in use"}}"#)
                .map_err(|e| e.err_code),
            Err(STREAM_NAME_IN_USE)
        );
    }

    #[test]
    fn names_and_config() {
        assert_eq!(
            lease_subject("b", "_.v1.secrets.n.name.x"),
            "$KV.b._.v1.secrets.n.name.x"
        );
        let c = stream_config("b", 5_000, 1);
        assert_eq!(c["name"], "KV_b");
        assert_eq!(c["max_age"], 5_000_000_000u64);
        assert_eq!(c["max_msgs_per_subject"], 1);
    }
}
