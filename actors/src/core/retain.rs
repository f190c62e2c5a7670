//! Retention of each published key's recent events on the NATS side (issue 30.2): the
//! JetStream stream that keeps them, and the limits it is created with.
//!
//! An owner publishes every event of a key twice: live on `<prefix>.ev.<key>`, and first
//! on `<prefix>.log.<key>`, the subject the stream captures. Heartbeats are not retained:
//! one per key per second would crowd out the events a resuming subscriber needs, and cost
//! the NATS server a stored message per key per second. The stored message is the one sent
//! live, headers and body alike, so a sealed kind stays sealed at rest and a signed one
//! stays signed. A subscriber that comes back with its last `(epoch, seq)` replays the
//! key's log from there (`kcache-subscriber`), and only takes a snapshot when the log no
//! longer reaches back that far.

use serde_json::json;

use crate::config::NatsConfig;

/// Why a retention setting was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Error {
    #[error("nats.retain_stream {0:?}: a JetStream stream name is 1–255 of [A-Za-z0-9_-]")]
    StreamName(String),
    #[error("nats.retain_max_msgs_per_key must be at least 1")]
    NoMessages,
    #[error("nats.retain_max_age_secs must be at least 1")]
    NoAge,
    #[error("nats.retain_max_bytes must be at least 1 MiB")]
    NoBytes,
}

/// The limits a retention stream is created with, as configured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    pub stream: String,
    pub max_msgs_per_key: i64,
    pub max_bytes: i64,
    pub max_age_secs: u64,
    pub replicas: u32,
}

impl Limits {
    /// The configured limits, or `None` when retention is off.
    pub fn from_config(cfg: &NatsConfig) -> Result<Option<Limits>, Error> {
        if !cfg.retain {
            return Ok(None);
        }
        let name = &cfg.retain_stream;
        let name_ok = !name.is_empty()
            && name.len() <= 255
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
        if !name_ok {
            return Err(Error::StreamName(name.clone()));
        }
        if cfg.retain_max_msgs_per_key < 1 {
            return Err(Error::NoMessages);
        }
        if cfg.retain_max_age_secs < 1 {
            return Err(Error::NoAge);
        }
        if cfg.retain_max_bytes < 1 << 20 {
            return Err(Error::NoBytes);
        }
        Ok(Some(Limits {
            stream: name.clone(),
            max_msgs_per_key: cfg.retain_max_msgs_per_key,
            max_bytes: cfg.retain_max_bytes,
            max_age_secs: cfg.retain_max_age_secs,
            replicas: cfg.retain_replicas.clamp(1, 5),
        }))
    }

    /// `$JS.API.STREAM.CREATE.<stream>` (and `UPDATE`) body: every key's log subject,
    /// bounded per key, in all and by age; the oldest messages go first.
    pub fn stream_config(&self, all_logs: &str) -> serde_json::Value {
        json!({
            "name": self.stream,
            "description": "kcache: each published key's recent events, for subscribers to resume",
            "subjects": [all_logs],
            "retention": "limits",
            "max_consumers": -1,
            "max_msgs": -1,
            "max_bytes": self.max_bytes,
            "max_msgs_per_subject": self.max_msgs_per_key,
            "max_age": self.max_age_secs * 1_000_000_000,
            "max_msg_size": -1,
            "storage": "file",
            "discard": "old",
            "num_replicas": self.replicas,
            "duplicate_window": 0,
            // Read through consumers only: a consumer's create subject names its filter,
            // so NATS permissions scope who replays which keys; a direct get does not.
            "allow_direct": false,
            "deny_delete": true,
            "deny_purge": false,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(f: impl FnOnce(&mut NatsConfig)) -> NatsConfig {
        let mut c = NatsConfig {
            retain: true,
            ..NatsConfig::default()
        };
        f(&mut c);
        c
    }

    #[test]
    fn limits_table() {
        let cases: Vec<(&str, NatsConfig, Result<bool, Error>)> = vec![
            ("off", NatsConfig::default(), Ok(false)),
            ("defaults", cfg(|_| {}), Ok(true)),
            (
                "a dot in the name",
                cfg(|c| c.retain_stream = "kcache.events".into()),
                Err(Error::StreamName("kcache.events".into())),
            ),
            (
                "an empty name",
                cfg(|c| c.retain_stream = String::new()),
                Err(Error::StreamName(String::new())),
            ),
            (
                "no messages",
                cfg(|c| c.retain_max_msgs_per_key = 0),
                Err(Error::NoMessages),
            ),
            (
                "no age",
                cfg(|c| c.retain_max_age_secs = 0),
                Err(Error::NoAge),
            ),
            (
                "too few bytes",
                cfg(|c| c.retain_max_bytes = 1000),
                Err(Error::NoBytes),
            ),
        ];
        for (name, c, want) in cases {
            let got = Limits::from_config(&c).map(|l| l.is_some());
            assert_eq!(got, want, "{name}");
        }
    }

    #[test]
    fn the_stream_keeps_each_keys_log_bounded_and_drops_the_oldest() {
        let l = Limits::from_config(&cfg(|c| {
            c.retain_max_msgs_per_key = 500;
            c.retain_max_age_secs = 30;
            c.retain_replicas = 9;
        }))
        .expect("valid")
        .expect("on");
        let s = l.stream_config("kcache.log.>");
        assert_eq!(s["subjects"], json!(["kcache.log.>"]));
        assert_eq!(s["max_msgs_per_subject"], 500);
        assert_eq!(s["max_age"], 30_000_000_000u64);
        assert_eq!(s["discard"], "old");
        assert_eq!(s["num_replicas"], 5, "clamped to JetStream's most");
    }
}
