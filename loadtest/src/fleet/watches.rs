//! The fleet bench's clients: single-object watches on each replica that stamp every
//! delivered write with its arrival, the writes themselves (each carrying the time it was
//! made), and what the deliveries add up to.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use futures::StreamExt;
use serde_json::{json, Value};

use super::replica::Replica;

pub fn now_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0)
}

pub fn ms_between(from: u128, to: u128) -> f64 {
    to.saturating_sub(from) as f64 / 1e6
}

/// One delivered write: (replica index, key index, latency).
pub type Sample = (usize, usize, Duration);

/// One client watch.
pub struct WatchRec {
    pub replica: usize,
    pub key: usize,
    /// Its first event (the object's state) arrived.
    pub added_ns: Option<u128>,
    /// Its stream ended (or never opened).
    pub ended_ns: Option<u128>,
    /// (written, received) timestamps of each MODIFIED carrying a write's stamp.
    pub delivered: Vec<(u128, u128)>,
}

#[derive(Default)]
pub struct Collected {
    pub added: usize,
    pub samples: Vec<Sample>,
    pub watches: Vec<WatchRec>,
}

impl Collected {
    /// The earliest arrival, on a watch of `key` on one of `replicas`, of a write made
    /// after `after` (ns).
    pub fn first_after(&self, key: usize, replicas: &[usize], after: u128) -> Option<u128> {
        self.watches
            .iter()
            .filter(|w| w.key == key && replicas.contains(&w.replica))
            .flat_map(|w| w.delivered.iter())
            .filter(|(sent, _)| *sent > after)
            .map(|(_, received)| *received)
            .min()
    }

    /// Writes `written` (per key, when each was made) within `window` (ns, inclusive)
    /// that survivor watches of `keys` did not deliver: (missing, checked, ended). Only
    /// watches on `replicas` that had their object before the window count; one that
    /// ended during it is counted as ended, not checked.
    pub fn missing(
        &self,
        written: &HashMap<usize, Vec<u128>>,
        replicas: &[usize],
        keys: &[usize],
        window: (u128, u128),
    ) -> (usize, usize, usize) {
        let (from, to) = window;
        let (mut missing, mut checked, mut ended) = (0usize, 0usize, 0usize);
        for watch in self
            .watches
            .iter()
            .filter(|w| replicas.contains(&w.replica) && keys.contains(&w.key))
            .filter(|w| w.added_ns.is_some_and(|a| a < from))
        {
            match watch.ended_ns {
                Some(e) if e > from => {
                    ended += 1;
                    continue;
                }
                Some(_) => continue,
                None => {}
            }
            let got: HashSet<u128> = watch.delivered.iter().map(|(s, _)| *s).collect();
            for t in written.get(&watch.key).into_iter().flatten() {
                if (from..=to).contains(t) {
                    checked += 1;
                    if !got.contains(t) {
                        missing += 1;
                    }
                }
            }
        }
        (missing, checked, ended)
    }
}

/// The bench's objects on the API server, written through the load tests' write client
/// (`client::Api`, the bench token). Key indices: `0..secrets` are Secrets `s<i>`, then
/// ConfigMaps `fo<j>`.
#[derive(Clone)]
pub struct Api {
    pub server: crate::client::Api,
    pub namespace: String,
    pub secrets: usize,
}

impl Api {
    pub fn new(apiserver: &str, token: &str, namespace: &str, secrets: usize) -> Api {
        Api {
            server: crate::client::Api::new(apiserver, token),
            namespace: namespace.to_string(),
            secrets,
        }
    }

    pub fn token(&self) -> &str {
        &self.server.token
    }

    /// Creates the namespace (setup is idempotent: one that exists is fine).
    pub async fn create_namespace(&self) {
        let ns = json!({"metadata": {"name": self.namespace}});
        if let Err(e) = self.server.ensure("/api/v1/namespaces", &ns).await {
            eprintln!("namespace {}: {e}", self.namespace);
        }
    }

    /// Creates `key`'s object with its first stamp (one that exists is fine).
    pub async fn create(&self, key: usize) {
        let (collection, body) = if key < self.secrets {
            (
                "secrets",
                json!({"metadata": {"name": format!("s{key}")}, "stringData": {"t": "0"}}),
            )
        } else {
            (
                "configmaps",
                json!({"metadata": {"name": format!("fo{}", key - self.secrets)}, "data": {"t": "0"}}),
            )
        };
        let path = format!("/api/v1/namespaces/{}/{collection}", self.namespace);
        if let Err(e) = self.server.ensure(&path, &body).await {
            eprintln!("creating {}: {e}", self.path(key));
        }
    }

    pub fn path(&self, key: usize) -> String {
        if key < self.secrets {
            format!("/api/v1/namespaces/{}/secrets/s{key}", self.namespace)
        } else {
            format!(
                "/api/v1/namespaces/{}/configmaps/fo{}",
                self.namespace,
                key - self.secrets
            )
        }
    }

    pub fn watch_path(&self, key: usize) -> String {
        let (resource, name) = if key < self.secrets {
            ("secrets", format!("s{key}"))
        } else {
            ("configmaps", format!("fo{}", key - self.secrets))
        };
        format!(
            "/api/v1/namespaces/{}/{resource}?watch=1&resourceVersion=0&fieldSelector=metadata.name%3D{name}",
            self.namespace
        )
    }

    /// Writes the current time into the object; the time, if the API server took it
    /// within 10 s.
    pub async fn write(&self, key: usize) -> Option<u128> {
        let t = now_ns();
        let patch = if key < self.secrets {
            json!({"stringData": {"t": t.to_string()}})
        } else {
            json!({"data": {"t": t.to_string()}})
        };
        let path = self.path(key);
        let written = self.server.merge_patch(&path, &patch);
        match tokio::time::timeout(Duration::from_secs(10), written).await {
            Ok(Ok(())) => Some(t),
            _ => None,
        }
    }
}

pub fn spawn_watch(
    http: reqwest::Client,
    url: String,
    token: String,
    replica: usize,
    key: usize,
    base64: bool,
    sink: Arc<Mutex<Collected>>,
) {
    let id = {
        let mut c = sink.lock().expect("collected");
        c.watches.push(WatchRec {
            replica,
            key,
            added_ns: None,
            ended_ns: None,
            delivered: Vec::new(),
        });
        c.watches.len() - 1
    };
    tokio::spawn(async move {
        if let Ok(resp) = http.get(url).bearer_auth(token).send().await {
            let mut body = resp.bytes_stream();
            let mut buf = Vec::new();
            while let Some(Ok(chunk)) = body.next().await {
                buf.extend_from_slice(&chunk);
                while let Some(nl) = buf.iter().position(|b| *b == b'\n') {
                    let line: Vec<u8> = buf.drain(..=nl).collect();
                    let Ok(ev) = serde_json::from_slice::<Value>(&line) else {
                        continue;
                    };
                    let received = now_ns();
                    let mut c = sink.lock().expect("collected");
                    match ev["type"].as_str() {
                        Some("ADDED") => {
                            c.added += 1;
                            c.watches[id].added_ns.get_or_insert(received);
                        }
                        Some("MODIFIED") => {
                            let stamp = ev["object"]["data"]["t"].as_str();
                            let sent = if base64 {
                                stamp.and_then(decode_b64)
                            } else {
                                stamp.map(str::to_string)
                            }
                            .and_then(|s| s.parse::<u128>().ok());
                            if let Some(sent) = sent {
                                let lat =
                                    Duration::from_nanos(received.saturating_sub(sent) as u64);
                                c.samples.push((replica, key, lat));
                                c.watches[id].delivered.push((sent, received));
                            }
                        }
                        _ => {}
                    }
                }
            }
        }
        sink.lock().expect("collected").watches[id].ended_ns = Some(now_ns());
    });
}

pub fn open_watches(
    api: &Api,
    rep: &Replica,
    r: usize,
    keys: impl Iterator<Item = usize>,
    per_key: impl Fn(usize) -> usize,
    sink: &Arc<Mutex<Collected>>,
) -> usize {
    let mut n = 0;
    for key in keys {
        for _ in 0..per_key(key) {
            spawn_watch(
                rep.client.clone(),
                format!("{}{}", rep.url, api.watch_path(key)),
                api.token().to_string(),
                r,
                key,
                key < api.secrets,
                sink.clone(),
            );
            n += 1;
        }
    }
    n
}

/// A Secret's `data` value (standard base64) as UTF-8.
fn decode_b64(s: &str) -> Option<String> {
    let bytes = base64::engine::general_purpose::STANDARD.decode(s).ok()?;
    String::from_utf8(bytes).ok()
}

pub fn summary(mut v: Vec<Duration>) -> Value {
    v.sort();
    json!({
        "deliveries": v.len(),
        "p50_ms": percentile(&v, 0.50),
        "p99_ms": percentile(&v, 0.99),
        "max_ms": v.last().map_or(0.0, |d| d.as_secs_f64() * 1000.0),
    })
}

/// p50/p90/p99/max of milliseconds (nearest rank, as `percentile`).
pub fn distribution(ms: &[f64]) -> Value {
    let mut v: Vec<Duration> = ms
        .iter()
        .map(|m| Duration::from_secs_f64(m.max(0.0) / 1000.0))
        .collect();
    v.sort();
    json!({
        "n": v.len(),
        "p50_ms": percentile(&v, 0.50),
        "p90_ms": percentile(&v, 0.90),
        "p99_ms": percentile(&v, 0.99),
        "max_ms": v.last().map_or(0.0, |d| d.as_secs_f64() * 1000.0),
    })
}

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i].as_secs_f64() * 1000.0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn watch(
        replica: usize,
        key: usize,
        added: u128,
        ended: Option<u128>,
        got: &[u128],
    ) -> WatchRec {
        WatchRec {
            replica,
            key,
            added_ns: Some(added),
            ended_ns: ended,
            delivered: got.iter().map(|s| (*s, s + 5)).collect(),
        }
    }

    #[test]
    fn first_after_is_the_earliest_arrival_of_a_later_write_on_the_replicas_asked() {
        let c = Collected {
            added: 0,
            samples: Vec::new(),
            watches: vec![
                watch(0, 7, 1, None, &[10, 20, 30]),
                watch(1, 7, 1, None, &[20, 30]),
                watch(1, 8, 1, None, &[15]),
            ],
        };
        assert_eq!(c.first_after(7, &[1], 10), Some(25));
        assert_eq!(c.first_after(7, &[0, 1], 5), Some(15));
        assert_eq!(c.first_after(7, &[0, 1], 30), None);
        assert_eq!(c.first_after(8, &[0], 0), None);
    }

    #[test]
    fn missing_counts_writes_in_the_window_open_survivor_watches_lack() {
        let c = Collected {
            added: 0,
            samples: Vec::new(),
            watches: vec![
                // On a survivor, open before the window: 110 and 130 checked, 130 missing.
                watch(1, 7, 50, None, &[90, 110]),
                // Ended inside the window: counted as ended, not checked.
                watch(1, 7, 50, Some(120), &[]),
                // Ended before it: not counted at all.
                watch(1, 7, 50, Some(60), &[]),
                // Opened inside the window: not checked.
                watch(1, 7, 105, None, &[]),
                // On the victim, and a key not written: neither checked.
                watch(0, 7, 50, None, &[]),
                watch(1, 9, 50, None, &[]),
            ],
        };
        let written = HashMap::from([(7, vec![90, 110, 130, 200]), (9, vec![110])]);
        assert_eq!(c.missing(&written, &[1], &[7], (100, 150)), (1, 2, 1));
        assert_eq!(c.missing(&written, &[1], &[7, 9], (100, 150)), (2, 3, 1));
        assert_eq!(c.missing(&written, &[0, 1], &[7], (100, 150)), (3, 4, 1));
    }

    #[test]
    fn secret_stamps_are_read_through_base64() {
        assert_eq!(decode_b64("MTIzNDU="), Some("12345".to_string()));
        assert_eq!(decode_b64("not base64!"), None);
    }

    #[test]
    fn distribution_is_nearest_rank() {
        let d = distribution(&[1.0, 2.0, 3.0, 4.0, 100.0]);
        assert_eq!(d["n"], json!(5));
        assert_eq!(d["p50_ms"], json!(3.0));
        assert_eq!(d["max_ms"], json!(100.0));
        assert_eq!(distribution(&[])["p99_ms"], json!(0.0));
    }
}
