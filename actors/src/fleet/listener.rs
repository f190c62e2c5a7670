//! The owner's publisher of one key: the informer's `processorListener`, bounded.
//!
//! The Listener follows the key it publishes (`feed::Follower`): the CachedObject
//! `try_send`s it every event and a periodic bookmark (published as the heartbeat), and
//! never waits on NATS. The Listener publishes in order, one message at a time; while NATS
//! is slow or away its mailbox fills, further events are dropped and counted
//! (`kcache_fleet_listener_dropped_events_total`), and the mirrors, seeing the sequence
//! jump, resynchronise from a snapshot — a resync rather than an unbounded queue.

use std::sync::Arc;

use actix::prelude::*;
use bytes::Bytes;

use crate::core::seal::Keyring;
use crate::core::sign::Signer;
use crate::core::wire::{Frame, Kind};
use crate::feed::Follow;
use crate::fleet::codec;
use crate::metrics as m;

/// How an owner writes a key's messages: subject, stamp, sealing and chunking.
#[derive(Clone)]
pub struct Outlet {
    pub client: async_nats::Client,
    pub subject: String,
    /// The key's token: the associated data of sealed payloads.
    pub token: String,
    pub owner: String,
    pub epoch: u64,
    pub keyring: Option<Arc<Keyring>>,
    /// The fleet's signing key: every message is signed when set (`core::sign`).
    pub signer: Option<Arc<Signer>>,
    pub chunk_max: usize,
    /// The key's retained-events subject, when the fleet retains them (`core::retain`).
    pub log_subject: Option<String>,
}

impl Outlet {
    /// Publishes one body as `codec::encode` makes it: sealed, signed and chunked as the
    /// key and the fleet require. An event's messages go to the key's log first, when it
    /// has one.
    pub async fn send(
        &self,
        subject: &str,
        kind: Kind,
        seq: u64,
        rv: u64,
        body: Bytes,
    ) -> Result<(), String> {
        let frame = Frame {
            kind,
            epoch: self.epoch,
            seq,
            rv,
            owner: self.owner.clone(),
            chunk: None,
            key_id: None,
        };
        let messages = codec::encode(
            frame,
            &self.token,
            body,
            self.keyring.as_deref(),
            self.signer.as_deref(),
            self.chunk_max,
        )
        .map_err(|e| e.to_string())?;
        for (headers, part) in messages {
            // The retained copy goes first: a subscriber that subscribes live and then
            // replays the log finds every event in one of the two.
            if let (Kind::Event, Some(log)) = (kind, &self.log_subject) {
                self.client
                    .publish_with_headers(log.clone(), headers.clone(), part.clone())
                    .await
                    .map_err(|e| e.to_string())?;
                metrics::counter!(m::NATS_OUT).increment(1);
            }
            self.client
                .publish_with_headers(subject.to_string(), headers, part)
                .await
                .map_err(|e| e.to_string())?;
            metrics::counter!(m::NATS_OUT).increment(1);
        }
        Ok(())
    }
}

pub struct Listener {
    outlet: Outlet,
    capacity: usize,
}

impl Listener {
    pub fn new(outlet: Outlet, capacity: usize) -> Self {
        Listener { outlet, capacity }
    }
}

impl Actor for Listener {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        ctx.set_mailbox_capacity(self.capacity.max(1));
    }
}

impl Handler<Follow> for Listener {
    type Result = ();

    fn handle(&mut self, msg: Follow, ctx: &mut Self::Context) {
        let outlet = self.outlet.clone();
        let subject = outlet.subject.clone();
        // `wait` holds the mailbox until this publish is handed to the client: order is
        // kept and a stuck connection backs up into the bounded mailbox, not into memory.
        ctx.wait(
            async move {
                let res = match msg {
                    Follow::Event(ev) => {
                        outlet
                            .send(&subject, Kind::Event, ev.seq, ev.rv, ev.line.clone())
                            .await
                    }
                    Follow::Bookmark { seq, rv } => {
                        outlet
                            .send(&subject, Kind::Heartbeat, seq, rv, Bytes::new())
                            .await
                    }
                };
                if let Err(error) = res {
                    tracing::warn!(subject = %subject, %error, "publishing to NATS failed");
                }
            }
            .into_actor(self),
        );
    }
}
