//! Fleet-wide interest on the wire: each replica publishes its refcount per key, and
//! apart the names its covering keys serve (`core::coalesce` counts names fleet-wide,
//! and those must not keep a name key's owner watching it), on
//! `<prefix>.interest.<replica>`, and hears the others'. The Registry owns the table
//! (`core::interest`) and decides what to send (`core::interest::outbox`, a full table
//! once, then changes); this module only carries messages, in order.

use actix::{Message, Recipient};
use async_nats::Client;
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

use std::sync::Arc;

use super::codec;
use crate::core::interest::sync::{Batch, Part};
use crate::core::sign::{Signer, Verifier};
use crate::core::subject::Subjects;
use crate::metrics as m;

/// One message of another replica's interest, as heard on NATS (for the Registry).
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct RemoteInterest {
    pub replica: String,
    pub batch: Batch,
    /// The replicas whose full table the sender needs.
    pub resync: Vec<String>,
}

/// The body of an interest message (`docs/nats.md`).
#[derive(Serialize, Deserialize)]
struct InterestMsg {
    replica: String,
    /// The sender's incarnation, drawn at start.
    epoch: u64,
    /// The message's number within the incarnation: one more than the last.
    seq: u64,
    /// `[part, of]`: this message is part of the sender's full table; absent: what
    /// changed since its last message (a count of 0 withdraws a record).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    full: Option<(u32, u32)>,
    /// `[token, refcount]` pairs.
    #[serde(default)]
    keys: Vec<(String, u64)>,
    /// `[token, refcount]` of the names a covering key serves on the replica.
    #[serde(default)]
    covered: Vec<(String, u64)>,
    /// Replicas whose full table the sender needs (it missed one of their messages).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    resync: Vec<String>,
}

/// How many intervals' messages may wait to be published: past that an interval's are
/// dropped (counted), and the peers, seeing a number skipped, ask for the table again.
const QUEUED: usize = 4;

/// Publishes this replica's interest and forwards the others' to the Registry.
#[derive(Clone)]
pub struct Gossip {
    client: Client,
    subjects: Subjects,
    replica: String,
    /// Where the fleet signs: interest is signed, and only signed interest is heard (a
    /// forged refcount would keep a key's upstream watch alive).
    signing: Option<(Arc<Signer>, Arc<Verifier>)>,
}

/// The queue to this replica's publishing task: one interval's messages per item, sent
/// in order (the receivers number them).
pub struct Publisher {
    queue: mpsc::Sender<(Vec<Batch>, Vec<String>)>,
}

impl Publisher {
    /// Queues one interval's messages; `resync` goes with the first.
    pub fn send(&self, batches: Vec<Batch>, resync: Vec<String>) {
        if self.queue.try_send((batches, resync)).is_err() {
            metrics::counter!(m::FLEET_INTEREST_DROPPED).increment(1);
        }
    }
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

    /// Starts the task that publishes what the [`Publisher`] queues, in order.
    pub fn spawn_publisher(&self) -> Publisher {
        let (queue, mut rx) = mpsc::channel::<(Vec<Batch>, Vec<String>)>(QUEUED);
        let me = self.clone();
        actix::spawn(async move {
            while let Some((batches, mut resync)) = rx.recv().await {
                for batch in batches {
                    me.publish(batch, std::mem::take(&mut resync)).await;
                }
            }
        });
        Publisher { queue }
    }

    async fn publish(&self, batch: Batch, resync: Vec<String>) {
        let msg = InterestMsg {
            replica: self.replica.clone(),
            epoch: batch.epoch,
            seq: batch.seq,
            full: batch.full.map(|p| (p.index, p.of)),
            keys: batch.refs,
            covered: batch.covered,
            resync,
        };
        let Ok(body) = serde_json::to_vec(&msg) else {
            return;
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

    /// Sends every other replica's interest to `to` until the connection or `to` is gone.
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
                    // Also the format of kcache before interest was sent as changes (no
                    // epoch or seq): a fleet runs one version (docs/operations.md, "Mixed
                    // versions in a fleet").
                    metrics::counter!(m::FLEET_BAD_MESSAGES).increment(1);
                    continue;
                };
                if im.replica == me.replica {
                    continue;
                }
                // A replica speaks for itself only: its name in the body is the one its
                // subject carries (else one member could withdraw another's references).
                if msg.subject.as_str() != me.subjects.interest(&im.replica) {
                    metrics::counter!(m::FLEET_BAD_MESSAGES).increment(1);
                    continue;
                }
                let remote = RemoteInterest {
                    replica: im.replica,
                    batch: Batch {
                        epoch: im.epoch,
                        seq: im.seq,
                        full: im.full.map(|(index, of)| Part { index, of }),
                        refs: im.keys,
                        covered: im.covered,
                    },
                    resync: im.resync,
                };
                // A few messages per replica and interval (a full table's parts when one
                // joins): the Registry's mailbox cannot grow past that.
                if !to.connected() {
                    return;
                }
                to.do_send(remote);
            }
        });
    }
}
