//! One client watch: sends the request (retrying connection failures and 429/5xx a few
//! times, as a real client would), then reads newline-delimited JSON events and hands
//! each event's write key to the [`Recorder`]. Also the slow consumer: a watch whose body
//! is never read.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use serde::Deserialize;
use tokio::task::JoinHandle;

use crate::record::{delete_key, Counters, Recorder, SEQ_ANNOTATION};

/// When a watch counts as established.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ready {
    /// At its first event (watches from resourceVersion=0 start with `ADDED` events).
    FirstEvent,
    /// When the response headers arrive (watches from a list's resourceVersion).
    Headers,
}

/// One watch request.
pub struct WatchReq {
    pub client: reqwest::Client,
    /// Full URL including `watch=1` and the selectors.
    pub url: String,
    pub token: String,
}

/// Attempts per watch request before it counts as failed.
const ATTEMPTS: u32 = 3;
/// Longest wait for a watch's response headers before the request is tried again (kcache
/// answers once the key is synced, in at most its `sync_timeout_secs`, 30).
const HEADERS_TIMEOUT: Duration = Duration::from_secs(60);

/// The part of a watch event the harness reads; everything else is skipped unparsed.
#[derive(Deserialize)]
struct Event {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    object: Object,
}

#[derive(Deserialize, Default)]
struct Object {
    #[serde(default)]
    metadata: Meta,
    /// An `ERROR` event's Status: its code and reason, for the failure's reason.
    #[serde(default)]
    code: Option<u16>,
    #[serde(default)]
    reason: Option<String>,
}

#[derive(Deserialize, Default)]
struct Meta {
    #[serde(default)]
    name: String,
    #[serde(default)]
    namespace: String,
    #[serde(default)]
    annotations: Option<HashMap<String, String>>,
}

/// Sends the watch request; `None` (counted in `errors` and the recorder's failure
/// reasons) if it did not get a 2xx after [`ATTEMPTS`] tries.
async fn open(req: &WatchReq, rec: &Recorder) -> Option<reqwest::Response> {
    Counters::inc(&rec.counters.opened);
    for attempt in 1..=ATTEMPTS {
        let sent = req.client.get(&req.url).bearer_auth(&req.token).send();
        let reason = match tokio::time::timeout(HEADERS_TIMEOUT, sent).await {
            Err(_) => {
                if attempt == ATTEMPTS {
                    rec.failure("watch headers timeout".into());
                    Counters::inc(&rec.counters.failed);
                    return None;
                }
                "watch headers timeout (retried)".to_string()
            }
            Ok(Ok(resp)) if resp.status().is_success() => return Some(resp),
            Ok(Ok(resp)) => {
                let status = resp.status();
                let retry = status.as_u16() == 429 || status.is_server_error();
                if !retry || attempt == ATTEMPTS {
                    rec.failure(format!("watch HTTP {}", status.as_u16()));
                    Counters::inc(&rec.counters.failed);
                    return None;
                }
                format!("watch HTTP {} (retried)", status.as_u16())
            }
            Ok(Err(e)) => {
                let kind = if e.is_connect() {
                    "connect"
                } else if e.is_timeout() {
                    "timeout"
                } else {
                    "request"
                };
                if attempt == ATTEMPTS {
                    rec.failure(format!("watch {kind} error"));
                    Counters::inc(&rec.counters.failed);
                    return None;
                }
                format!("watch {kind} error (retried)")
            }
        };
        rec.note(reason);
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    None
}

/// Handles one line of a watch body; returns true if it was an event (not blank).
fn on_line(line: &[u8], at: Instant, rec: &Recorder) -> bool {
    if line.iter().all(u8::is_ascii_whitespace) {
        return false; // kcache's keepalive newline
    }
    let Ok(ev) = serde_json::from_slice::<Event>(line) else {
        rec.failure("unparsable watch line".into());
        return true;
    };
    match ev.kind.as_str() {
        "ADDED" | "MODIFIED" => {
            let key = ev
                .object
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(SEQ_ANNOTATION));
            if let Some(key) = key {
                rec.delivered(key, at);
            }
        }
        "DELETED" => {
            let m = &ev.object.metadata;
            rec.delivered(&delete_key(&m.namespace, &m.name), at);
        }
        "BOOKMARK" => return false,
        "ERROR" => rec.failure(format!(
            "watch event ERROR {} {}",
            ev.object.code.map_or("-".into(), |c| c.to_string()),
            ev.object.reason.as_deref().unwrap_or("-")
        )),
        _ => rec.failure(format!("watch event {}", ev.kind)),
    }
    true
}

/// How one watch stream ended.
enum End {
    /// After its first event (or, for [`Ready::Headers`], once established).
    Established,
    /// Before it was established: the server or the connection went away first.
    Early,
}

/// Opens and reads one watch until its stream ends or the task is aborted. A stream that
/// ends before it is established (its connection closed under it: a busy API server
/// closes a new HTTP/2 connection whose SETTINGS it did not read in time) is opened
/// again, as a client would, up to [`ATTEMPTS`] times; then it counts as failed, so that
/// nothing waits for it.
pub fn spawn(req: WatchReq, ready: Ready, rec: Arc<Recorder>) -> JoinHandle<()> {
    tokio::spawn(async move {
        for attempt in 1..=ATTEMPTS {
            let Some(resp) = open(&req, &rec).await else {
                return;
            };
            match read(resp, ready, &rec).await {
                End::Established => return,
                End::Early if attempt < ATTEMPTS => {
                    rec.note("watch ended before established (retried)".into());
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
                End::Early => {
                    rec.failure("watch ended before established".into());
                    Counters::inc(&rec.counters.failed);
                }
            }
        }
    })
}

/// Reads a watch's events until its stream ends.
async fn read(resp: reqwest::Response, ready: Ready, rec: &Recorder) -> End {
    if ready == Ready::Headers {
        Counters::inc(&rec.counters.ready);
    }
    let mut seen_event = ready == Ready::Headers;
    let ended = |seen: bool| {
        if seen {
            Counters::inc(&rec.counters.ended);
            End::Established
        } else {
            End::Early
        }
    };
    let mut body = resp.bytes_stream();
    let mut buf: Vec<u8> = Vec::new();
    loop {
        let chunk = match body.next().await {
            Some(Ok(chunk)) => chunk,
            Some(Err(_)) => {
                if seen_event {
                    rec.failure("watch stream error".into());
                }
                return ended(seen_event);
            }
            None => return ended(seen_event),
        };
        let at = Instant::now();
        buf.extend_from_slice(&chunk);
        let mut start = 0;
        while let Some(nl) = buf[start..].iter().position(|b| *b == b'\n') {
            let event = on_line(&buf[start..start + nl], at, rec);
            start += nl + 1;
            if event && !seen_event {
                seen_event = true;
                Counters::inc(&rec.counters.ready);
            }
        }
        buf.drain(..start);
    }
}

/// A slow consumer: opens the watch and holds the response without ever reading it.
pub fn spawn_unread(req: WatchReq, rec: Arc<Recorder>) -> JoinHandle<Option<reqwest::Response>> {
    tokio::spawn(async move { open(&req, &rec).await })
}

/// Reads each held response until it ends or `wait` passes; returns how many had been
/// closed by the server (their stream ended or broke).
pub async fn count_closed(responses: Vec<reqwest::Response>, wait: Duration) -> usize {
    let tasks: Vec<_> = responses
        .into_iter()
        .map(|resp| {
            tokio::spawn(async move {
                let mut body = resp.bytes_stream();
                let drained = tokio::time::timeout(wait, async {
                    while let Some(item) = body.next().await {
                        if item.is_err() {
                            break;
                        }
                    }
                })
                .await;
                drained.is_ok()
            })
        })
        .collect();
    let mut closed = 0;
    for t in tasks {
        if matches!(t.await, Ok(true)) {
            closed += 1;
        }
    }
    closed
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::next_seq_key;

    #[test]
    fn events_are_matched_by_annotation_or_delete_key() {
        let rec = Recorder::new(1);
        let k = next_seq_key();
        rec.mark_sent(k.clone(), 0);
        rec.mark_sent(delete_key("ns", "gone"), 0);
        let now = Instant::now();
        let modified = format!(
            r#"{{"type":"MODIFIED","object":{{"metadata":{{"name":"a","annotations":{{"bench-seq":"{k}"}}}},"data":{{"v":"x"}}}}}}"#
        );
        assert!(on_line(modified.as_bytes(), now, &rec));
        let deleted =
            br#"{"type":"DELETED","object":{"metadata":{"name":"gone","namespace":"ns"}}}"#;
        assert!(on_line(deleted, now, &rec));
        assert!(!on_line(b"  ", now, &rec));
        assert!(!on_line(
            br#"{"type":"BOOKMARK","object":{"metadata":{"resourceVersion":"5"}}}"#,
            now,
            &rec
        ));
        assert!(on_line(
            br#"{"type":"ERROR","object":{"code":410}}"#,
            now,
            &rec
        ));
        assert!(on_line(b"{not json", now, &rec));
        assert_eq!(rec.count(0), 2);
        assert_eq!(Counters::get(&rec.counters.errors), 2);
        assert_eq!(rec.reasons()["watch event ERROR 410 -"], 1);
    }
}
