//! The subscriber's task: subscribe, resume or snapshot, then follow live; every decision
//! is the mirror's (`core::mirror`), this module only moves messages.

use std::time::{Duration, Instant};

use async_nats::{Client, Message, Subscriber};
use bytes::Bytes;
use futures::StreamExt;
use kcache_actors::core::mirror::{Input, Mirror, Output, Resync, Stamp};
use kcache_actors::core::subject::{parse_key_token, Subjects};
use kcache_actors::core::wire::{Kind, Reassembler};
use kcache_actors::fleet::codec::{self, Opener};
use tokio::sync::mpsc;

use crate::replay;
use crate::{Error, Options, Position, Update};

/// A key being followed: its updates, in order.
pub struct Subscription {
    updates: mpsc::Receiver<Update>,
    task: Option<tokio::task::JoinHandle<Result<(), Error>>>,
}

impl Subscription {
    /// The next update; `None` once the task has ended ([`Subscription::error`] says why).
    pub async fn next(&mut self) -> Option<Update> {
        self.updates.recv().await
    }

    /// Why the task ended, once [`Subscription::next`] returned `None`.
    pub async fn error(mut self) -> Option<Error> {
        let task = self.task.take()?;
        match task.await {
            Ok(Err(e)) => Some(e),
            _ => None,
        }
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        if let Some(task) = &self.task {
            task.abort();
        }
    }
}

/// Follows `opts.key` on `client`, from `from` when given (a position kept from earlier),
/// else from a snapshot.
pub async fn follow(
    client: Client,
    opts: Options,
    from: Option<Position>,
) -> Result<Subscription, Error> {
    if parse_key_token(&opts.key).is_none() {
        return Err(Error::BadKey(opts.key.clone()));
    }
    let subjects = Subjects::new(&opts.prefix);
    // Answers come to the key's own reply space (a reader's permissions name it), under a
    // nonce of this subscriber's.
    let nonce = format!("{:016x}", rand::random::<u64>());
    let events = subscribe(&client, subjects.events(&opts.key)).await?;
    let replies = subscribe(&client, subjects.replies(&opts.key, &nonce)).await?;
    // Both subscriptions are in place at the server before the log is read: an event is
    // in the log (published first) or arrives live, or both.
    client
        .flush()
        .await
        .map_err(|e| Error::Publish(e.to_string()))?;
    let (tx, updates) = mpsc::channel(opts.queue.max(1));
    let follower = Follower {
        opener: Opener {
            token: opts.key.clone(),
            keyring: opts.keyring.clone(),
            verifier: opts.verifier.clone(),
        },
        mirror: Mirror::new(10 * opts.snapshot_retry.as_millis() as u64, opts.buffer),
        ev_parts: Reassembler::default(),
        log_parts: Reassembler::default(),
        snap_parts: Reassembler::default(),
        started: Instant::now(),
        request: 0,
        client,
        subjects,
        nonce,
        opts,
        tx,
    };
    let task = tokio::spawn(follower.run(events, replies, from));
    Ok(Subscription {
        updates,
        task: Some(task),
    })
}

async fn subscribe(client: &Client, subject: String) -> Result<Subscriber, Error> {
    client
        .subscribe(subject.clone())
        .await
        .map_err(|source| Error::Subscribe { subject, source })
}

/// Where a message came from.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Via {
    Live,
    Log,
    Reply,
}

pub(crate) struct Follower {
    pub(crate) opener: Opener,
    pub(crate) mirror: Mirror<(Kind, Bytes)>,
    ev_parts: Reassembler,
    /// The log's chunks apart from the live ones: a replay may end between two chunks
    /// of an event whose live copy then arrives whole.
    log_parts: Reassembler,
    snap_parts: Reassembler,
    started: Instant,
    request: u64,
    client: Client,
    pub(crate) subjects: Subjects,
    pub(crate) nonce: String,
    pub(crate) opts: Options,
    tx: mpsc::Sender<Update>,
}

/// The caller dropped its [`Subscription`].
pub(crate) struct Gone;

impl Follower {
    async fn run(
        mut self,
        mut events: Subscriber,
        mut replies: Subscriber,
        from: Option<Position>,
    ) -> Result<(), Error> {
        let mut want_snapshot = true;
        if let Some(pos) = from {
            let now = self.now_ms();
            self.mirror.resume(now, pos.epoch, pos.seq);
            let replayed = match self.opts.retain_stream.clone() {
                Some(stream) => replay::log(&mut self, stream).await,
                None => Ok(Some(0)),
            };
            match replayed {
                Ok(Some(n)) if self.mirror.synced() => {
                    want_snapshot = false;
                    if self.emit(Update::Resumed { replayed: n }).await.is_err() {
                        return Ok(());
                    }
                }
                Ok(_) => {}
                Err(Gone) => return Ok(()),
            }
        }
        let period = self.opts.snapshot_retry.max(Duration::from_millis(50));
        let mut retry = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
        loop {
            if want_snapshot {
                want_snapshot = false;
                self.ask_snapshot().await?;
            }
            let (msg, via) = tokio::select! {
                m = events.next() => (m.ok_or_else(|| Error::Closed(self.subjects.events(&self.opts.key)))?, Via::Live),
                m = replies.next() => (m.ok_or_else(|| Error::Closed(self.opts.key.clone()))?, Via::Reply),
                _ = retry.tick() => {
                    want_snapshot = !self.mirror.synced();
                    continue;
                }
            };
            match self.on_message(&msg, via).await {
                Ok(resync) => want_snapshot |= resync,
                Err(Gone) => return Ok(()),
            }
        }
    }

    pub(crate) fn client(&self) -> Client {
        self.client.clone()
    }

    fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    async fn emit(&self, update: Update) -> Result<(), Gone> {
        self.tx.send(update).await.map_err(|_| Gone)
    }

    async fn ask_snapshot(&mut self) -> Result<(), Error> {
        self.snap_parts.reset();
        self.request += 1;
        let reply = self
            .subjects
            .reply(&self.opts.key, &self.nonce, self.request);
        self.client
            .publish_with_reply(self.subjects.snapshot(&self.opts.key), reply, "{}".into())
            .await
            .map_err(|e| Error::Publish(e.to_string()))
    }

    /// Feeds one message to the mirror and hands out what it decides; `true` when a
    /// snapshot is needed.
    pub(crate) async fn on_message(&mut self, msg: &Message, via: Via) -> Result<bool, Gone> {
        if msg.headers.is_none() {
            // "No responders" to a snapshot request: no owner yet; the retry asks again.
            return Ok(false);
        }
        if via == Via::Reply && !self.answers_current_request(msg) {
            return Ok(false);
        }
        let parts = match via {
            Via::Reply => &mut self.snap_parts,
            Via::Live => &mut self.ev_parts,
            Via::Log => &mut self.log_parts,
        };
        let opened = codec::frame(msg).and_then(|frame| {
            let body = self.opener.body(&frame, msg, parts)?;
            Ok((frame, body))
        });
        let (frame, body) = match opened {
            Ok((frame, Some(body))) => (frame, body),
            Ok((_, None)) => return Ok(false),
            Err(error) => {
                self.emit(Update::Refused(error.to_string())).await?;
                self.mirror.restart();
                self.emit(Update::Resync(Resync::Gap)).await?;
                return Ok(true);
            }
        };
        let stamp = Stamp {
            epoch: frame.epoch,
            seq: frame.seq,
            rv: frame.rv,
        };
        let input = match (frame.kind, via) {
            (Kind::Heartbeat, Via::Live) => Input::Heartbeat(stamp),
            (Kind::Event, Via::Live | Via::Log) => Input::Event(stamp, (Kind::Event, body)),
            (Kind::Snapshot, Via::Reply) => Input::Snapshot(stamp, (Kind::Snapshot, body)),
            // The owner is not synced yet: the retry asks again.
            (Kind::NotReady, Via::Reply) => return Ok(false),
            (kind, _) => {
                let why = format!("a {} message where none belongs", kind.as_str());
                self.emit(Update::Refused(why)).await?;
                return Ok(false);
            }
        };
        let mut resync = false;
        let now = self.now_ms();
        for out in self.mirror.on(now, input) {
            let update = match out {
                Output::Snapshot(stamp, (_, list)) => Update::Snapshot { stamp, list },
                Output::Apply(stamp, (_, line)) => Update::Event {
                    stamp,
                    line,
                    replayed: via == Via::Log,
                },
                Output::Progress(rv) => Update::Progress { rv },
                Output::Resync(why) => {
                    resync = true;
                    Update::Resync(why)
                }
                Output::Stale(stamp) => {
                    tracing::debug!(epoch = stamp.epoch, "ignored a fenced-off owner's message");
                    continue;
                }
            };
            self.emit(update).await?;
        }
        Ok(resync)
    }

    /// Answers to an earlier request (already retried) are not this snapshot's chunks.
    fn answers_current_request(&self, msg: &Message) -> bool {
        msg.subject
            .rsplit('.')
            .next()
            .and_then(|n| n.parse::<u64>().ok())
            == Some(self.request)
    }
}
