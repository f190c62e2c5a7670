//! The lease client: one message per key in a JetStream stream, written compare-and-set
//! over the JetStream wire API (`core::lease` holds its formats; `docs/nats.md` why).
//!
//! Create (expected sequence 0) claims a key nobody holds; renewal and takeover write
//! over a known revision; release deletes this replica's own message.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_nats::Client;
use bytes::Bytes;

use crate::config::NatsConfig;
use crate::core::lease;
use crate::core::role::{Claimed, Renewed};

pub struct Leases {
    client: Client,
    cfg: Arc<NatsConfig>,
    replica: String,
    /// The lease stream exists (created or checked once); a flag every key's task reads
    /// before its first lease call, so they need not ask an owner of it.
    ready: AtomicBool,
}

impl Leases {
    pub fn new(client: Client, cfg: Arc<NatsConfig>, replica: String) -> Self {
        Leases {
            client,
            cfg,
            replica,
            ready: AtomicBool::new(false),
        }
    }

    fn stream(&self) -> String {
        lease::stream_name(&self.cfg.lease_bucket)
    }

    /// A JetStream API request with a deadline; the answer's body.
    async fn request(
        &self,
        subject: String,
        headers: Option<async_nats::HeaderMap>,
        body: Bytes,
    ) -> Result<Bytes, String> {
        super::conn::request(&self.client, subject, headers, body, Duration::from_secs(2)).await
    }

    /// Creates the lease stream once (again after an error: the server may have lost it).
    async fn ensure(&self) -> Result<(), String> {
        if self.ready.load(Ordering::Relaxed) {
            return Ok(());
        }
        let config = lease::stream_config(
            &self.cfg.lease_bucket,
            self.cfg.lease_ttl().as_millis() as u64,
            self.cfg.lease_replicas,
        );
        let subject = format!("$JS.API.STREAM.CREATE.{}", self.stream());
        let body = self
            .request(subject, None, Bytes::from(config.to_string()))
            .await?;
        match lease::api_result(&body) {
            Ok(()) => {}
            // It exists already (another replica made it first).
            Err(e) if e.err_code == lease::STREAM_NAME_IN_USE => {}
            Err(e) => return Err(format!("creating the lease stream: {}", e.description)),
        }
        self.ready.store(true, Ordering::Relaxed);
        Ok(())
    }

    /// Compare-and-set write of this replica's lease on `token` over revision `expected`.
    async fn write(&self, token: &str, expected: u64) -> Result<lease::Ack, String> {
        self.ensure().await?;
        let mut headers = async_nats::HeaderMap::new();
        headers.insert(
            lease::EXPECTED_LAST_SUBJECT_SEQ,
            expected.to_string().as_str(),
        );
        let subject = lease::lease_subject(&self.cfg.lease_bucket, token);
        match self
            .request(subject, Some(headers), Bytes::from(self.replica.clone()))
            .await
        {
            Ok(body) => Ok(lease::parse_ack(&body)),
            Err(e) => {
                self.ready.store(false, Ordering::Relaxed);
                Err(e)
            }
        }
    }

    fn claimed(ack: Result<lease::Ack, String>, token: &str) -> Claimed {
        match ack {
            Ok(lease::Ack::Written(epoch)) => Claimed::Won { epoch },
            Ok(lease::Ack::Conflict) => Claimed::Lost,
            Ok(lease::Ack::Failed(error)) | Err(error) => {
                tracing::debug!(token, %error, "cannot reach the lease bucket");
                Claimed::Failed
            }
        }
    }

    /// Tries to create the key's lease.
    pub async fn claim(&self, token: &str) -> Claimed {
        Self::claimed(self.write(token, 0).await, token)
    }

    /// Overwrites the lease of `owner`, whose NATS connection is gone, without waiting for
    /// it to expire: compare-and-set against its current revision, and only while it is
    /// still that owner's (another mirror may have taken it already).
    pub async fn take_over(&self, token: &str, owner: &str) -> Claimed {
        match self.current(token).await {
            Ok(Some((rev, holder))) if holder == owner => {
                Self::claimed(self.write(token, rev).await, token)
            }
            // Expired meanwhile: an ordinary create.
            Ok(None) => self.claim(token).await,
            Ok(Some(_)) => Claimed::Lost,
            Err(error) => {
                tracing::debug!(token, %error, "cannot read the lease");
                Claimed::Failed
            }
        }
    }

    /// The key's lease: its revision and holder, `None` when there is none.
    pub async fn current(&self, token: &str) -> Result<Option<(u64, String)>, String> {
        self.ensure().await?;
        let subject = format!("$JS.API.STREAM.MSG.GET.{}", self.stream());
        let body = serde_json::json!({
            "last_by_subj": lease::lease_subject(&self.cfg.lease_bucket, token)
        });
        let answer = self
            .request(subject, None, Bytes::from(body.to_string()))
            .await?;
        lease::parse_stored(&answer)
    }

    /// Renews the lease held at `rev`. A refused renewal is looked into: the lease may
    /// have aged out with nobody holding it (JetStream away for a TTL), or still be this
    /// replica's at a newer revision (a renewal whose answer was lost was written).
    pub async fn renew(&self, token: &str, rev: u64) -> Renewed {
        match self.write(token, rev).await {
            Ok(lease::Ack::Written(rev)) => Renewed::Ok { rev },
            Ok(lease::Ack::Conflict) => match self.current(token).await {
                Ok(None) => Renewed::Expired,
                Ok(Some((rev, holder))) if holder == self.replica => Renewed::Ok { rev },
                Ok(Some(_)) => Renewed::Lost,
                Err(error) => {
                    tracing::debug!(token, %error, "cannot read the lease after a refused renewal");
                    Renewed::Failed
                }
            },
            Ok(lease::Ack::Failed(error)) | Err(error) => {
                tracing::debug!(token, %error, "lease renewal failed");
                Renewed::Failed
            }
        }
    }

    /// Deletes the lease message at `rev` (only ours: a newer owner's message has another
    /// sequence), so the next claim succeeds without waiting for the TTL.
    pub async fn release(&self, token: &str, rev: u64) {
        let subject = format!("$JS.API.STREAM.MSG.DELETE.{}", self.stream());
        let body = serde_json::json!({ "seq": rev, "no_erase": true }).to_string();
        match self.request(subject, None, Bytes::from(body)).await {
            Ok(b) if lease::api_result(&b).is_ok() => tracing::debug!(token, "lease released"),
            _ => tracing::debug!(token, "lease not released; it will expire"),
        }
    }
}
