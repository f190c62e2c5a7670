//! NATS subscribers asking for keys: a request on `<prefix>.want.<key>` (the key's six
//! tokens, as on its events subject) keeps that key cached — in a fleet owned and
//! published — for `ttlSecs` after the last ask (`docs/nats.md`, "A plain NATS
//! subscriber"). A replica cannot see who publishes a message, so NATS's own publish
//! permissions on `<prefix>.want.…` decide who may ask for which keys; the replicas answer
//! in a queue group, one replica per ask.
//!
//! An ask is refused, answered with `{"error": …}` and counted, when its key names no
//! cached resource or scope, when its asker (the reply inbox) or the replica already
//! holds as many asks as allowed (`nats.want_per_asker`, `nats.want_total`), or when the
//! key budget refuses the key. An ask whose reply subject is one of kcache's own
//! (`<prefix>.…`, `$…`) is dropped unanswered: an answer must never be published into a
//! key's subjects. Accepted: `{"key": <token>, "ttlSecs": n}`.

use std::sync::Arc;
use std::time::Duration;

use actix::Addr;
use futures::StreamExt;
use kcache_actors::config::NatsConfig;
use kcache_actors::core::subject::{parse_key_token, ParsedKey};
use kcache_actors::registry::{Registry, Want, WantError, WantLimits};
use serde::Deserialize;
use serde_json::json;
use thiserror::Error;

use crate::declared::PublishEntry;
use crate::discovery::Resources;

/// Asks answered, by `result` (`accepted`, `refused`, `not_ready`, `bad_reply`).
pub const WANTS: &str = "kcache_nats_wants_total";

/// The queue group the replicas answer asks in.
const QUEUE: &str = "kcache-want";

/// Why an ask is refused.
#[derive(Debug, Error)]
pub enum Error {
    #[error("no key in the subject: want <prefix>.want.<group>.<version>.<resource>.<namespace>.<scope>.<value>")]
    BadKey,
    #[error("{0}")]
    Key(#[from] crate::declared::Error),
    #[error("{0}")]
    Refused(#[from] WantError),
    #[error("the body is not JSON of the form {{\"ttlSecs\": n}}")]
    BadBody,
    #[error("kcache has not read the API server's discovery yet; ask again")]
    NotReady,
    #[error("the registry is gone")]
    Gone,
}

pub fn describe() {
    metrics::describe_counter!(
        WANTS,
        "NATS subscribers' asks to keep a key published, by result: accepted, refused (bad key, bounds, key budget), not_ready (before discovery), bad_reply (no reply subject, or one of kcache's own: dropped unanswered)."
    );
    for result in ["accepted", "refused", "not_ready", "bad_reply"] {
        metrics::counter!(WANTS, "result" => result).increment(0);
    }
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Ask {
    ttl_secs: Option<u64>,
}

/// Answers asks until the subscription ends (the connection closed for good).
pub async fn serve(
    client: async_nats::Client,
    cfg: Arc<NatsConfig>,
    resources: impl Fn() -> Option<Resources> + Send + 'static,
    registry: Addr<Registry>,
) {
    describe();
    let prefix = format!("{}.want.", cfg.subject_prefix);
    let mut asks = match client
        .queue_subscribe(format!("{prefix}>"), QUEUE.into())
        .await
    {
        Ok(s) => s,
        Err(error) => {
            tracing::error!(%error, "cannot subscribe to NATS subscribers' asks; none will be answered");
            return;
        }
    };
    while let Some(msg) = asks.next().await {
        let Some(reply) = msg.reply.as_ref().filter(|r| reply_allowed(r, &cfg)) else {
            metrics::counter!(WANTS, "result" => "bad_reply").increment(1);
            tracing::debug!(subject = %msg.subject, "an ask with no reply subject, or one of kcache's own: dropped");
            continue;
        };
        let token = msg.subject.as_str().strip_prefix(&prefix).unwrap_or("");
        let answer = match resources() {
            None => Err(Error::NotReady),
            Some(r) => ask(token, &msg.payload, reply, &r, &cfg, &registry).await,
        };
        let (result, body) = match answer {
            Ok(ttl) => ("accepted", json!({"key": token, "ttlSecs": ttl.as_secs()})),
            Err(Error::NotReady) => ("not_ready", json!({"error": Error::NotReady.to_string()})),
            Err(e) => ("refused", json!({"error": e.to_string()})),
        };
        metrics::counter!(WANTS, "result" => result).increment(1);
        if let Err(error) = client.publish(reply.clone(), body.to_string().into()).await {
            tracing::debug!(%error, "cannot answer an ask");
        }
    }
}

/// One ask: its key, kept by the registry for the ask's time to live.
async fn ask(
    token: &str,
    payload: &[u8],
    reply: &str,
    resources: &Resources,
    cfg: &NatsConfig,
    registry: &Addr<Registry>,
) -> Result<Duration, Error> {
    let parsed = parse_key_token(token).ok_or(Error::BadKey)?;
    let key = crate::declared::key(&entry(parsed), resources)?;
    let ask: Ask = if payload.iter().all(u8::is_ascii_whitespace) {
        Ask::default()
    } else {
        serde_json::from_slice(payload).map_err(|_| Error::BadBody)?
    };
    let ttl = Duration::from_secs(
        ask.ttl_secs
            .unwrap_or(cfg.want_ttl_secs)
            .clamp(1, cfg.want_ttl_max_secs.max(1)),
    );
    let want = Want {
        key,
        asker: asker(reply).to_string(),
        ttl,
        limits: WantLimits {
            per_asker: cfg.want_per_asker,
            total: cfg.want_total,
        },
    };
    registry.send(want).await.map_err(|_| Error::Gone)??;
    Ok(ttl)
}

/// A parsed key token as the `[[publish]]` entry it names.
fn entry(k: ParsedKey) -> PublishEntry {
    let (name, node) = match k.scope.as_str() {
        "name" => (k.value, None),
        "node" => (None, k.value),
        _ => (None, None),
    };
    PublishEntry {
        group: k.group,
        version: k.version,
        resource: k.resource,
        namespace: k.namespace,
        name,
        node,
    }
}

/// Who asks: the reply subject's first two tokens (a NATS client's inbox prefix,
/// `_INBOX.<nuid>`, one per connection).
fn asker(reply: &str) -> &str {
    match reply.match_indices('.').nth(1) {
        Some((i, _)) => &reply[..i],
        None => reply,
    }
}

/// Whether an answer may be published on `reply`: never into kcache's own subjects (a
/// forged reply subject would otherwise make a replica publish into a key's events) nor
/// the server's (`$JS`, `$KV`, `$SYS`).
fn reply_allowed(reply: &str, cfg: &NatsConfig) -> bool {
    let own = format!("{}.", cfg.subject_prefix);
    !reply.is_empty()
        && !reply.starts_with(&own)
        && !reply.starts_with('$')
        && !reply.starts_with(&cfg.inbox_prefix)
        && !reply.contains(['*', '>', ' '])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_go_only_to_subscribers_inboxes() {
        let cfg = NatsConfig::default();
        let cases = [
            ("_INBOX.abc.1", true),
            ("my.inbox.7", true),
            ("kcache.ev._.v1.configmaps.a.all._", false),
            ("kcache.want._.v1.configmaps.a.all._", false),
            ("$KV.kcache-leases.x", false),
            ("$JS.API.STREAM.DELETE.x", false),
            // The replicas' own inbox (snapshot answers, presence).
            ("_KCACHE_INBOX.r1.x", false),
            ("_INBOX.*", false),
            ("", false),
        ];
        for (reply, want) in cases {
            assert_eq!(reply_allowed(reply, &cfg), want, "{reply}");
        }
    }

    #[test]
    fn an_asker_is_its_inbox_prefix() {
        assert_eq!(asker("_INBOX.abc.17"), "_INBOX.abc");
        assert_eq!(asker("_INBOX.abc.17.3"), "_INBOX.abc");
        assert_eq!(asker("single"), "single");
        assert_eq!(asker("a.b"), "a.b");
    }

    #[test]
    fn key_tokens_name_publish_entries() {
        let e = |t: &str| parse_key_token(t).map(entry);
        let got = e("_.v1.configmaps.team-a.name.app=2Econfig").expect("name key");
        assert_eq!(
            (got.namespace.as_deref(), got.name.as_deref(), got.node),
            (Some("team-a"), Some("app.config"), None)
        );
        let got = e("_.v1.pods._.node.n1").expect("node key");
        assert_eq!((got.namespace, got.node.as_deref()), (None, Some("n1")));
        let got = e("apps.v1.deployments._.all._").expect("cluster key");
        assert_eq!(
            (got.group.as_str(), got.namespace, got.name),
            ("apps", None, None)
        );
        assert!(e("_.v1.configmaps.a.everything._").is_none());
        assert!(e("_.v1.configmaps").is_none());
    }
}
