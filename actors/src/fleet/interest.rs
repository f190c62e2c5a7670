//! Fleet-wide interest on the wire: each replica publishes its refcount per key on
//! `<prefix>.interest.<replica>` and hears the others'; and, apart, the names its
//! coalesced namespace keys serve (`core::coalesce` counts names fleet-wide, and those
//! must not keep a name key's owner watching it). The Registry owns the table
//! (`core::interest`) beside its own refcounts; this module only carries messages.

use actix::{Message, Recipient};
use async_nats::Client;
use futures::StreamExt;
use serde::{Deserialize, Serialize};

use std::sync::Arc;

use super::codec;
use crate::core::sign::{Signer, Verifier};
use crate::core::subject::Subjects;
use crate::metrics as m;

/// One replica's refcounts, as heard on NATS (for the Registry).
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct RemoteInterest {
    pub replica: String,
    pub keys: Vec<(String, u64)>,
    pub covered: Vec<(String, u64)>,
}

#[derive(Serialize, Deserialize)]
struct InterestMsg {
    replica: String,
    /// `[token, refcount]` pairs; a replica may split its keys over several messages.
    keys: Vec<(String, u64)>,
    /// `[token, refcount]` of the names a covering key serves on the replica (older
    /// replicas send none).
    #[serde(default)]
    covered: Vec<(String, u64)>,
}

/// Publishes this replica's refcounts and forwards the others' to the Registry.
#[derive(Clone)]
pub struct Gossip {
    client: Client,
    subjects: Subjects,
    replica: String,
    /// Where the fleet signs: interest is signed, and only signed interest is heard (a
    /// forged refcount would keep a key's upstream watch alive).
    signing: Option<(Arc<Signer>, Arc<Verifier>)>,
}

impl Gossip {
    pub fn new(
        client: Client,
        subjects: Subjects,
        replica: String,
        signing: Option<(Arc<Signer>, Arc<Verifier>)>,
    ) -> Self {
        Gossip {
            client,
            subjects,
            replica,
            signing,
        }
    }

    pub fn replica(&self) -> &str {
        &self.replica
    }

    /// Publishes refcounts and covered names, in batches well under any `max_payload`.
    pub async fn publish(&self, keys: Vec<(String, u64)>, covered: Vec<(String, u64)>) {
        let batches = keys
            .chunks(2_000)
            .map(|b| (b.to_vec(), Vec::new()))
            .chain(covered.chunks(2_000).map(|b| (Vec::new(), b.to_vec())));
        for (keys, covered) in batches {
            let msg = InterestMsg {
                replica: self.replica.clone(),
                keys,
                covered,
            };
            let Ok(body) = serde_json::to_vec(&msg) else {
                continue;
            };
            let subject = self.subjects.interest(&self.replica);
            let signer = self.signing.as_ref().map(|(s, _)| &**s);
            let sent = match codec::control_headers(signer, &subject, &body) {
                Some(h) => {
                    self.client
                        .publish_with_headers(subject, h, body.into())
                        .await
                }
                None => self.client.publish(subject, body.into()).await,
            };
            if sent.is_ok() {
                metrics::counter!(m::NATS_OUT).increment(1);
            }
        }
    }

    /// Sends every other replica's refcounts to `to` until the connection or `to` is gone.
    pub fn spawn_follow(&self, to: Recipient<RemoteInterest>) {
        let me = self.clone();
        actix::spawn(async move {
            let mut sub = loop {
                match me.client.subscribe(me.subjects.all_interest()).await {
                    Ok(s) => break s,
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot subscribe to fleet interest; retrying");
                        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                    }
                }
            };
            while let Some(msg) = sub.next().await {
                metrics::counter!(m::NATS_IN).increment(1);
                if !codec::control_verified(me.signing.as_ref().map(|(_, v)| &**v), &msg) {
                    continue;
                }
                let Ok(im) = serde_json::from_slice::<InterestMsg>(&msg.payload) else {
                    metrics::counter!(m::FLEET_BAD_MESSAGES).increment(1);
                    continue;
                };
                if im.replica == me.replica {
                    continue;
                }
                let remote = RemoteInterest {
                    replica: im.replica,
                    keys: im.keys,
                    covered: im.covered,
                };
                // One message per replica and interval: the Registry's mailbox cannot grow
                // past that, and a dropped one would expire a replica's interest.
                if !to.connected() {
                    return;
                }
                to.do_send(remote);
            }
        });
    }
}
