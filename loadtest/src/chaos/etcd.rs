//! etcd's v3 HTTP gateway (JSON over plain HTTP on the client port): the current
//! revision, compaction (the fault that makes the upstream answer 410), a prefix range,
//! and a prefix watch — the source of the true event history ([`super::truth`]).
//!
//! Keys and values are base64 in this API; 64-bit integers are JSON strings.

use std::time::Duration;

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use futures::StreamExt;
use serde_json::{json, Value};

#[derive(Debug, thiserror::Error)]
pub enum EtcdError {
    #[error("etcd request: {0}")]
    Http(#[from] reqwest::Error),
    #[error("etcd answered HTTP {0}: {1}")]
    Status(u16, String),
    #[error("etcd answer without {0}")]
    Shape(&'static str),
    #[error(
        "etcd watch cancelled (compact_revision {0}): history from the asked revision is gone"
    )]
    Compacted(u64),
}

/// One change to a key under the watched prefix.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyEvent {
    pub key: String,
    /// The revision of the change: etcd's mod_revision (for a deletion, the revision of
    /// the delete), which the API server reports as the event's resourceVersion.
    pub rev: u64,
    /// 1 for a creation.
    pub version: u64,
    pub deleted: bool,
}

#[derive(Clone)]
pub struct Etcd {
    http: reqwest::Client,
    base: String,
}

fn num(v: &Value) -> u64 {
    match v {
        Value::String(s) => s.parse().unwrap_or(0),
        Value::Number(n) => n.as_u64().unwrap_or(0),
        _ => 0,
    }
}

/// The end of the range that holds every key starting with `prefix`.
fn prefix_end(prefix: &str) -> Vec<u8> {
    let mut end = prefix.as_bytes().to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

impl Etcd {
    pub fn new(base: &str) -> Etcd {
        Etcd {
            http: crate::client::insecure_client(Duration::from_secs(5), None),
            base: base.trim_end_matches('/').to_string(),
        }
    }

    async fn post(&self, path: &str, body: &Value) -> Result<Value, EtcdError> {
        let resp = self
            .http
            .post(format!("{}{path}", self.base))
            .timeout(Duration::from_secs(10))
            .json(body)
            .send()
            .await?;
        let status = resp.status();
        let text = resp.text().await?;
        if !status.is_success() {
            return Err(EtcdError::Status(status.as_u16(), text));
        }
        serde_json::from_str(&text).map_err(|_| EtcdError::Shape("JSON"))
    }

    /// The store's current revision.
    pub async fn revision(&self) -> Result<u64, EtcdError> {
        let v = self
            .post(
                "/v3/kv/range",
                &json!({"key": B64.encode([0u8]), "limit": 1}),
            )
            .await?;
        match num(&v["header"]["revision"]) {
            0 => Err(EtcdError::Shape("header.revision")),
            r => Ok(r),
        }
    }

    /// Compacts history up to `rev`: watches and lists from older revisions get 410.
    pub async fn compact(&self, rev: u64) -> Result<(), EtcdError> {
        self.post("/v3/kv/compaction", &json!({"revision": rev}))
            .await
            .map(drop)
    }

    /// Every key under `prefix` now: (revision of the read, [(key, mod_revision)]).
    pub async fn range_prefix(&self, prefix: &str) -> Result<(u64, Vec<(String, u64)>), EtcdError> {
        let v = self
            .post(
                "/v3/kv/range",
                &json!({"key": B64.encode(prefix), "range_end": B64.encode(prefix_end(prefix)), "keys_only": true}),
            )
            .await?;
        let rev = num(&v["header"]["revision"]);
        let kvs = v["kvs"].as_array().cloned().unwrap_or_default();
        let items = kvs
            .iter()
            .filter_map(|kv| Some((decode_key(&kv["key"])?, num(&kv["mod_revision"]))))
            .collect();
        Ok((rev, items))
    }

    /// Watches `prefix` from revision `from` and hands each change to `on_event`, until the
    /// stream ends (`Ok`) or fails. A cancellation for compaction is an error: the history
    /// asked for no longer exists.
    pub async fn watch_prefix(
        &self,
        prefix: &str,
        from: u64,
        mut on_event: impl FnMut(KeyEvent),
    ) -> Result<(), EtcdError> {
        let body = json!({"create_request": {
            "key": B64.encode(prefix),
            "range_end": B64.encode(prefix_end(prefix)),
            "start_revision": from,
        }});
        let resp = self
            .http
            .post(format!("{}/v3/watch", self.base))
            .json(&body)
            .send()
            .await?;
        if !resp.status().is_success() {
            let status = resp.status().as_u16();
            return Err(EtcdError::Status(
                status,
                resp.text().await.unwrap_or_default(),
            ));
        }
        let mut body = resp.bytes_stream();
        let mut buf: Vec<u8> = Vec::new();
        while let Some(chunk) = body.next().await {
            buf.extend_from_slice(&chunk?);
            // The gateway writes one JSON object per message; read every complete one and
            // keep a partial tail for the next chunk.
            let mut values = serde_json::Deserializer::from_slice(&buf).into_iter::<Value>();
            let mut consumed = 0;
            loop {
                match values.next() {
                    Some(Ok(v)) => {
                        consumed = values.byte_offset();
                        let result = &v["result"];
                        let compacted = num(&result["compact_revision"]);
                        if compacted > 0 || result["canceled"].as_bool() == Some(true) {
                            return Err(EtcdError::Compacted(compacted));
                        }
                        for ev in result["events"].as_array().into_iter().flatten() {
                            let kv = &ev["kv"];
                            let Some(key) = decode_key(&kv["key"]) else {
                                continue;
                            };
                            on_event(KeyEvent {
                                key,
                                rev: num(&kv["mod_revision"]),
                                version: num(&kv["version"]),
                                deleted: ev["type"].as_str() == Some("DELETE"),
                            });
                        }
                    }
                    Some(Err(e)) if e.is_eof() => break,
                    Some(Err(_)) => return Err(EtcdError::Shape("a JSON watch message")),
                    None => break,
                }
            }
            buf.drain(..consumed);
            // A runaway message (never seen: a watch result is a handful of events) must
            // not grow the buffer without bound.
            if buf.len() > 64 << 20 {
                return Err(EtcdError::Shape("a watch message under 64 MiB"));
            }
        }
        Ok(())
    }
}

fn decode_key(v: &Value) -> Option<String> {
    let bytes = B64.decode(v.as_str()?).ok()?;
    String::from_utf8(bytes).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_end_is_the_next_key() {
        assert_eq!(prefix_end("/a/"), b"/a0".to_vec());
        assert_eq!(prefix_end(""), vec![0]);
    }
}
