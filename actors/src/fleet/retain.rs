//! Keeps the retention stream (`core::retain`) in place: created when a replica starts,
//! updated to this replica's limits when it exists with others (every replica of a fleet
//! must be configured alike), tried every 5 s until that succeeds — the NATS server may
//! be down, or JetStream not yet ready, at start — and checked every 30 s after, so a
//! stream deleted or lost with a NATS node's store comes back.
//!
//! Owners publish their events' copies on the log subjects whether or not the stream is
//! there: NATS drops what no stream captures, and a subscriber that resumes across such a
//! time sees the gap and takes a snapshot.

use std::time::Duration;

use async_nats::Client;
use bytes::Bytes;

use crate::core::lease;
use crate::core::retain::Limits;

const RETRY: Duration = Duration::from_secs(5);
const RECHECK: Duration = Duration::from_secs(30);

/// Creates or updates the stream, and keeps it so.
pub async fn keep(client: Client, limits: Limits, all_logs: String) {
    let mut warned = false;
    let mut in_place = false;
    loop {
        match ensure(&client, &limits, &all_logs).await {
            Ok(()) => {
                if !in_place {
                    tracing::info!(stream = %limits.stream, subjects = %all_logs, "events are retained for resuming subscribers");
                }
                in_place = true;
                warned = false;
            }
            Err(error) => {
                in_place = false;
                // Once at warn: a NATS server that comes up late is not news every 5 s.
                if !warned {
                    tracing::warn!(stream = %limits.stream, %error, "cannot set up the event retention stream yet; subscribers resume from snapshots until it is");
                    warned = true;
                } else {
                    tracing::debug!(stream = %limits.stream, %error, "retention stream still not set up");
                }
            }
        }
        tokio::time::sleep(if in_place { RECHECK } else { RETRY }).await;
    }
}

async fn ensure(client: &Client, limits: &Limits, all_logs: &str) -> Result<(), String> {
    let body = Bytes::from(limits.stream_config(all_logs).to_string());
    let create = format!("$JS.API.STREAM.CREATE.{}", limits.stream);
    match lease::api_result(&request(client, create, body.clone()).await?) {
        Ok(()) => Ok(()),
        // It exists (another replica made it, or with other limits): make it ours.
        Err(e) if e.err_code == lease::STREAM_NAME_IN_USE => {
            let update = format!("$JS.API.STREAM.UPDATE.{}", limits.stream);
            lease::api_result(&request(client, update, body).await?)
                .map_err(|e| format!("updating the stream: {}", e.description))
        }
        Err(e) => Err(format!("creating the stream: {}", e.description)),
    }
}

async fn request(client: &Client, subject: String, body: Bytes) -> Result<Bytes, String> {
    super::conn::request(client, subject, None, body, Duration::from_secs(5)).await
}
