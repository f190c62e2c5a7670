//! Resume: the key's retained log (`core::retain`), read through an ordered consumer
//! filtered on the key's log subject — its create subject names the filter, so NATS
//! permissions decide who may replay which keys — from the oldest retained event up to
//! the last one stored when the consumer was made.

use async_nats::jetstream::consumer::{pull, DeliverPolicy};
use futures::StreamExt;

use crate::follow::{Follower, Gone, Via};

/// Replays the log into the mirror, which was resumed at the kept position: events up to
/// it are dropped, the rest applied in order. `Some(n)`: the log was read to its end, `n`
/// events past the position; `None`: it could not be read, or it stopped fitting (the
/// mirror asked for a snapshot). Read errors fall back to a snapshot, with a log line.
pub(crate) async fn log(f: &mut Follower, stream: String) -> Result<Option<u64>, Gone> {
    let filter = f.subjects.log(&f.opts.key);
    let js = async_nats::jetstream::new(f.client());
    let consumer = async {
        js.get_stream_no_info(&stream)
            .await
            .map_err(|e| e.to_string())?
            .create_consumer(pull::OrderedConfig {
                name: Some(format!("kcache-resume-{}", f.nonce)),
                filter_subject: filter.clone(),
                deliver_policy: DeliverPolicy::All,
                ..Default::default()
            })
            .await
            .map_err(|e| e.to_string())
    };
    let consumer = match tokio::time::timeout(f.opts.replay_timeout, consumer).await {
        Ok(Ok(c)) => c,
        Ok(Err(error)) => return Ok(give_up(f, &filter, &error)),
        Err(_) => return Ok(give_up(f, &filter, "timed out")),
    };
    let mut pending = consumer.cached_info().num_pending;
    let mut replayed = 0;
    if pending == 0 {
        return Ok(Some(0));
    }
    let mut messages = match consumer.messages().await {
        Ok(m) => m,
        Err(error) => return Ok(give_up(f, &filter, &error.to_string())),
    };
    while pending > 0 {
        let msg = match tokio::time::timeout(f.opts.replay_timeout, messages.next()).await {
            Ok(Some(Ok(m))) => m,
            Ok(Some(Err(error))) => return Ok(give_up(f, &filter, &error.to_string())),
            Ok(None) => return Ok(give_up(f, &filter, "the consumer ended")),
            Err(_) => return Ok(give_up(f, &filter, "timed out")),
        };
        pending = msg.info().map(|i| i.pending).unwrap_or(0);
        let before = f.mirror.seq();
        if f.on_message(&msg.message, Via::Log).await? {
            return Ok(None);
        }
        if f.mirror.seq() != before {
            replayed += 1;
        }
    }
    Ok(Some(replayed))
}

fn give_up(f: &mut Follower, filter: &str, error: &str) -> Option<u64> {
    tracing::warn!(%filter, %error, "cannot replay the key's retained events; taking a snapshot");
    f.mirror.restart();
    None
}
