//! Which peers are alive, and which can reach the API server: fast failover and handover.
//!
//! Every replica publishes a beacon on `<prefix>.alive.<replica>` every `presence_ms`,
//! saying whether its upstream works, and answers requests on `<prefix>.presence.<replica>`.
//! A peer whose beacons stop for three periods is asked directly: NATS answers "no
//! responders" at once when the peer's connection is gone (a crashed process's socket is
//! closed), and then the peer is **gone** — its keys can be taken over without waiting for
//! their leases to expire. A peer that does not answer in time (paused, overloaded) is not
//! gone: its leases decide, so a live owner is never taken over this way.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_nats::client::RequestErrorKind;
use async_nats::Client;
use bytes::Bytes;
use futures::StreamExt;
use serde::{Deserialize, Serialize};

use super::codec;
use crate::core::sign::{Signer, Verifier};
use crate::core::subject::Subjects;
use crate::health::UpstreamHealth;
use crate::metrics as m;

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Beacon {
    upstream_ok: bool,
}

#[derive(Debug)]
struct Peer {
    last_beacon: Instant,
    upstream_ok: bool,
    gone: bool,
    probing: bool,
}

pub struct Presence {
    client: Client,
    subjects: Subjects,
    replica: String,
    /// `<inbox_prefix>.`: presence requests come from kcache replicas, whose answers go
    /// to the fleet's inbox prefix, and only there.
    inbox: String,
    period: Duration,
    health: Arc<UpstreamHealth>,
    /// The peers heard of: written by the beacon listener, read by every key's fleet task
    /// deciding a takeover (`core::role`). A mutex held for a lookup, not an actor: a
    /// task about to take a key over must not wait behind a mailbox of beacons.
    peers: Mutex<HashMap<String, Peer>>,
    /// Where the fleet signs: beacons are signed, and only signed ones heard (a forged
    /// beacon would keep a dead peer "alive" or vouch for an upstream).
    signing: Option<(Arc<Signer>, Arc<Verifier>)>,
}

/// A peer forgotten after this much silence (a replica scaled away).
const FORGET_AFTER: Duration = Duration::from_secs(300);

impl Presence {
    pub fn start(
        client: Client,
        subjects: Subjects,
        replica: String,
        inbox_prefix: &str,
        period: Duration,
        health: Arc<UpstreamHealth>,
        signing: Option<(Arc<Signer>, Arc<Verifier>)>,
    ) -> Arc<Self> {
        let p = Arc::new(Presence {
            client,
            subjects,
            replica,
            inbox: format!("{}.", inbox_prefix.trim_end_matches('.')),
            period,
            health,
            peers: Mutex::new(HashMap::new()),
            signing,
        });
        tokio::spawn(p.clone().beacon());
        tokio::spawn(p.clone().listen());
        tokio::spawn(p.clone().answer());
        p
    }

    /// The peers whose NATS connection is known to be gone.
    pub fn gone(&self) -> BTreeSet<String> {
        self.peers
            .lock()
            .map(|p| {
                p.iter()
                    .filter(|(_, p)| p.gone)
                    .map(|(r, _)| r.clone())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Another replica announced a working upstream within three periods.
    pub fn healthy_peer(&self) -> bool {
        let fresh = 3 * self.period;
        self.peers
            .lock()
            .map(|p| {
                p.values()
                    .any(|p| !p.gone && p.upstream_ok && p.last_beacon.elapsed() <= fresh)
            })
            .unwrap_or(false)
    }

    async fn beacon(self: Arc<Self>) {
        let subject = self.subjects.alive(&self.replica);
        let mut tick = tokio::time::interval(self.period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let beacon = Beacon {
                upstream_ok: !self.health.cut_off(),
            };
            let Ok(body) = serde_json::to_vec(&beacon) else {
                continue;
            };
            let signer = self.signing.as_ref().map(|(s, _)| &**s);
            let sent = match codec::control_headers(signer, &subject, &body) {
                Some(h) => {
                    self.client
                        .publish_with_headers(subject.clone(), h, Bytes::from(body))
                        .await
                }
                None => {
                    self.client
                        .publish(subject.clone(), Bytes::from(body))
                        .await
                }
            };
            if sent.is_ok() {
                metrics::counter!(m::NATS_OUT).increment(1);
            }
            self.probe_silent();
        }
    }

    async fn listen(self: Arc<Self>) {
        let Some(mut sub) = self.subscribe(self.subjects.all_alive()).await else {
            return;
        };
        while let Some(msg) = sub.next().await {
            metrics::counter!(m::NATS_IN).increment(1);
            let Some(replica) = self.subjects.replica_of_alive(&msg.subject) else {
                continue;
            };
            if replica == self.replica {
                continue;
            }
            if !codec::control_verified(self.signing.as_ref().map(|(_, v)| &**v), &msg) {
                continue;
            }
            let Ok(beacon) = serde_json::from_slice::<Beacon>(&msg.payload) else {
                metrics::counter!(m::FLEET_BAD_MESSAGES).increment(1);
                continue;
            };
            if let Ok(mut peers) = self.peers.lock() {
                let peer = peers.entry(replica).or_insert(Peer {
                    last_beacon: Instant::now(),
                    upstream_ok: false,
                    gone: false,
                    probing: false,
                });
                peer.last_beacon = Instant::now();
                peer.upstream_ok = beacon.upstream_ok;
                peer.gone = false;
            }
        }
    }

    /// Answers presence requests, only to subjects under the fleet's inbox prefix:
    /// anything else is a request kcache did not send (an empty message on a lease subject
    /// would be a lease write).
    async fn answer(self: Arc<Self>) {
        let Some(mut sub) = self.subscribe(self.subjects.presence(&self.replica)).await else {
            return;
        };
        while let Some(msg) = sub.next().await {
            metrics::counter!(m::NATS_IN).increment(1);
            let Some(reply) = msg.reply else { continue };
            if !reply.as_str().starts_with(&self.inbox) {
                metrics::counter!(m::FLEET_REJECTED, "reason" => "reply-subject").increment(1);
                continue;
            }
            if self.client.publish(reply, Bytes::new()).await.is_ok() {
                metrics::counter!(m::NATS_OUT).increment(1);
            }
        }
    }

    async fn subscribe(&self, subject: String) -> Option<async_nats::Subscriber> {
        loop {
            match self.client.subscribe(subject.clone()).await {
                Ok(s) => return Some(s),
                Err(error) => {
                    tracing::warn!(%error, %subject, "cannot subscribe; retrying");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        }
    }

    /// Asks every peer silent for three periods whether it is still connected.
    fn probe_silent(self: &Arc<Self>) {
        let silent = 3 * self.period;
        let mut ask = Vec::new();
        if let Ok(mut peers) = self.peers.lock() {
            peers.retain(|_, p| p.last_beacon.elapsed() < FORGET_AFTER);
            for (replica, p) in peers.iter_mut() {
                if !p.gone && !p.probing && p.last_beacon.elapsed() > silent {
                    p.probing = true;
                    ask.push(replica.clone());
                }
            }
        }
        for replica in ask {
            let me = self.clone();
            tokio::spawn(async move {
                let subject = me.subjects.presence(&replica);
                let answer = tokio::time::timeout(
                    Duration::from_secs(1),
                    me.client.request(subject, Bytes::new()),
                )
                .await;
                let gone =
                    matches!(&answer, Ok(Err(e)) if e.kind() == RequestErrorKind::NoResponders);
                if let Ok(mut peers) = me.peers.lock() {
                    if let Some(p) = peers.get_mut(&replica) {
                        p.probing = false;
                        // A beacon that arrived meanwhile wins.
                        if gone && p.last_beacon.elapsed() > silent {
                            p.gone = true;
                            metrics::counter!(m::FLEET_PEERS_GONE).increment(1);
                            tracing::warn!(peer = %replica, "peer's NATS connection is gone; its keys will be taken over");
                        }
                    }
                }
            });
        }
    }
}
