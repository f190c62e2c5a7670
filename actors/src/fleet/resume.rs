//! Answers subscribers' resume requests from the retention stream (`core::retain`).
//!
//! A subscriber that kept its `(epoch, seq)` asks on `<prefix>.resume.<key>` (queue group
//! `kcache-resume`: one replica answers), body `{"epoch": E, "seq": S}`, with a reply
//! subject in the key's reply space. The replica reads the key's log with its own
//! permissions and republishes each retained event after the position exactly as stored —
//! headers and body, so sealed and signed as the owner sent it — to that reply subject,
//! then an end marker (`Kcache-Resume-End: <n>`, or `Kcache-Resume-Error`).
//!
//! Why replicas read the stream, not the subscriber: whoever may create a consumer can
//! name any subject as its delivery subject (a push consumer), which NATS does not check
//! against the creator's publish permissions — a reader allowed one key's log could have
//! the server deliver it onto another key's event subject. Served here, a reader needs no
//! JetStream permission at all, and the answers go only where a key's reply space allows
//! (`Subjects::is_reply_for`), which NATS permissions do scope.

use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::consumer::{pull, DeliverPolicy};
use async_nats::{Client, HeaderMap, Message};
use bytes::Bytes;
use futures::StreamExt;
use serde::Deserialize;
use tokio::sync::Semaphore;

use crate::core::retain::Limits;
use crate::core::subject::{parse_key_token, Subjects};
use crate::core::wire::{self, Frame, Kind};
use crate::metrics as m;

/// Resume answers one replica gives at once; a request beyond is answered "busy" and
/// the subscriber takes a snapshot.
const IN_FLIGHT: usize = 16;
/// A stored message not delivered within this long ends the answer with an error.
const READ_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Deserialize)]
struct Request {
    epoch: u64,
    seq: u64,
}

/// Serves `<prefix>.resume.>` until the connection closes.
pub async fn serve(client: Client, subjects: Subjects, limits: Limits) {
    let mut requests = match client
        .queue_subscribe(subjects.all_resumes(), "kcache-resume".into())
        .await
    {
        Ok(s) => s,
        Err(error) => {
            tracing::warn!(%error, "cannot answer subscribers' resume requests");
            return;
        }
    };
    let permits = Arc::new(Semaphore::new(IN_FLIGHT));
    while let Some(req) = requests.next().await {
        let Some(reply) = req.reply.clone() else {
            continue;
        };
        let Some(token) = subjects.token_of_resume(&req.subject).map(str::to_string) else {
            continue;
        };
        if parse_key_token(&token).is_none() || !subjects.is_reply_for(&token, &reply) {
            // Never answer outside the key's reply space: that is what scopes who reads it.
            metrics::counter!(m::NATS_RESUMES, "result" => "refused").increment(1);
            tracing::debug!(subject = %req.subject, reply = %reply, "refused a resume request (not a key, or a reply subject outside its reply space)");
            continue;
        }
        let Ok(from) = serde_json::from_slice::<Request>(&req.payload) else {
            metrics::counter!(m::NATS_RESUMES, "result" => "refused").increment(1);
            end(
                &client,
                &reply,
                Err("the body is not {\"epoch\": E, \"seq\": S}"),
            )
            .await;
            continue;
        };
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            metrics::counter!(m::NATS_RESUMES, "result" => "busy").increment(1);
            end(&client, &reply, Err("busy: take a snapshot")).await;
            continue;
        };
        let (client, log, stream) = (client.clone(), subjects.log(&token), limits.stream.clone());
        tokio::spawn(async move {
            let _permit = permit;
            let res = answer(&client, &stream, &log, &reply, &from).await;
            let label = if res.is_ok() { "answered" } else { "failed" };
            metrics::counter!(m::NATS_RESUMES, "result" => label).increment(1);
            if let Err(error) = &res {
                tracing::debug!(subject = %log, %error, "a resume request could not be answered from the log");
            }
            end(
                &client,
                &reply,
                res.as_ref().map(|n| *n).map_err(String::as_str),
            )
            .await;
        });
    }
}

/// Republishes the key's retained events after `from`, as stored; how many.
async fn answer(
    client: &Client,
    stream: &str,
    log: &str,
    reply: &str,
    from: &Request,
) -> Result<u64, String> {
    let js = async_nats::jetstream::new(client.clone());
    let consumer = tokio::time::timeout(READ_TIMEOUT, async {
        js.get_stream_no_info(stream)
            .await
            .map_err(|e| e.to_string())?
            .create_consumer(pull::OrderedConfig {
                // Named, so its create subject names stream, consumer and filter — what
                // the replicas' permissions grant (`$JS.API.CONSUMER.CREATE.<stream>.>`).
                name: Some(format!("kcache-resume-{:016x}", rand::random::<u64>())),
                filter_subject: log.to_string(),
                deliver_policy: DeliverPolicy::All,
                ..Default::default()
            })
            .await
            .map_err(|e| e.to_string())
    })
    .await
    .map_err(|_| "timed out creating a consumer".to_string())??;
    // What is stored now (at most the key's retention), and no more: a hot key's newer
    // events reach the subscriber live, as it subscribed before asking.
    let stored = consumer.cached_info().num_pending;
    let mut messages = consumer.messages().await.map_err(|e| e.to_string())?;
    let mut sent = 0;
    for _ in 0..stored {
        let msg = match tokio::time::timeout(READ_TIMEOUT, messages.next()).await {
            Ok(Some(Ok(m))) => m,
            Ok(Some(Err(e))) => return Err(e.to_string()),
            Ok(None) => return Err("the consumer ended".into()),
            Err(_) => return Err("timed out reading the log".into()),
        };
        if covered(&msg.message, from) {
            continue;
        }
        let headers = msg.message.headers.clone().unwrap_or_default();
        client
            .publish_with_headers(reply.to_string(), headers, msg.message.payload.clone())
            .await
            .map_err(|e| e.to_string())?;
        metrics::counter!(m::NATS_OUT).increment(1);
        sent += 1;
    }
    Ok(sent)
}

/// An event the subscriber has (same epoch, seq at most its own), or of an owner before
/// its own (which it would fence off): not sent.
fn covered(msg: &Message, from: &Request) -> bool {
    let Some(h) = msg.headers.as_ref() else {
        return false;
    };
    Frame::parse(|n| h.get(n).map(|v| v.as_str())).is_ok_and(|f| {
        f.kind == Kind::Event
            && (f.epoch < from.epoch || (f.epoch == from.epoch && f.seq <= from.seq))
    })
}

async fn end(client: &Client, reply: &str, res: Result<u64, &str>) {
    let mut headers = HeaderMap::new();
    headers.insert(
        wire::H_CONTRACT,
        wire::CONTRACT_VERSION.to_string().as_str(),
    );
    match res {
        Ok(n) => headers.insert(wire::H_RESUME_END, n.to_string().as_str()),
        Err(why) => headers.insert(wire::H_RESUME_ERROR, why),
    }
    if client
        .publish_with_headers(reply.to_string(), headers, Bytes::new())
        .await
        .is_ok()
    {
        metrics::counter!(m::NATS_OUT).increment(1);
    }
}
