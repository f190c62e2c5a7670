//! The subscriber's task: subscribe, resume (ask a replica for the retained events after
//! the kept position) or snapshot, then follow live. Every decision
//! is the [`Session`]'s; this module only moves messages between NATS and it.

use std::time::{Duration, Instant};

use async_nats::{Client, Message, Subscriber};
use futures::StreamExt;
use kcache_actors::core::subject::{parse_key_token, Subjects};
use kcache_actors::fleet::codec::Opener;
use tokio::sync::mpsc;

use crate::session::{Session, Via};
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
        // Closed first: a task waiting to hand out an update ends instead of waiting here.
        self.updates.close();
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
    match tokio::time::timeout(Duration::from_secs(10), client.flush()).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => return Err(Error::Publish(e.to_string())),
        Err(_) => return Err(Error::Publish("NATS did not answer a flush in 10 s".into())),
    }
    let (tx, updates) = mpsc::channel(opts.queue.max(1));
    let opener = Opener {
        token: opts.key.clone(),
        keyring: opts.keyring.clone(),
        verifier: opts.verifier.clone(),
    };
    let follower = Follower {
        session: Session::new(
            opener,
            10 * opts.snapshot_retry.as_millis() as u64,
            opts.buffer,
        ),
        started: Instant::now(),
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

pub(crate) struct Follower {
    pub(crate) session: Session,
    started: Instant,
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
            self.session.resume(now, pos);
            match self.resume(&mut replies, pos).await {
                Ok(Some(n)) if self.session.synced() => {
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
        let mut last_ask: Option<Instant> = None;
        loop {
            // Not while an answer is arriving, and not more than once a retry period: a
            // new request drops the answer in flight, so a stream of refused messages or a
            // slow chunked snapshot would otherwise never let one finish.
            let recent = last_ask.is_some_and(|t: Instant| t.elapsed() < period);
            if want_snapshot && !self.session.answer_arriving() && !recent {
                want_snapshot = false;
                last_ask = Some(Instant::now());
                self.ask_snapshot().await?;
            }
            let (msg, via) = tokio::select! {
                m = events.next() => (m.ok_or_else(|| Error::Closed(self.subjects.events(&self.opts.key)))?, Via::Live),
                m = replies.next() => (m.ok_or_else(|| Error::Closed(self.opts.key.clone()))?, Via::Reply),
                _ = retry.tick() => {
                    want_snapshot = !self.session.synced();
                    continue;
                }
            };
            match self.on_message(&msg, via).await {
                Ok(resync) => want_snapshot |= resync,
                Err(Gone) => return Ok(()),
            }
        }
    }

    fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    async fn emit(&self, update: Update) -> Result<(), Gone> {
        self.tx.send(update).await.map_err(|_| Gone)
    }

    async fn ask_snapshot(&mut self) -> Result<(), Error> {
        let n = self.session.ask();
        let reply = self.subjects.reply(&self.opts.key, &self.nonce, n);
        self.client
            .publish_with_reply(self.subjects.snapshot(&self.opts.key), reply, "{}".into())
            .await
            .map_err(|e| Error::Publish(e.to_string()))
    }

    /// Asks a replica for the key's retained events after `at` (`fleet::resume`) and
    /// applies them. `Some(n)`: the answer ended and the position held, `n` events
    /// applied; `None`: a snapshot is needed — no replica retains events (no responders),
    /// the log no longer reaches back, the key changed owner, or no answer in time.
    async fn resume(
        &mut self,
        replies: &mut Subscriber,
        at: Position,
    ) -> Result<Option<u64>, Gone> {
        let n = self.session.ask();
        let reply = self.subjects.reply(&self.opts.key, &self.nonce, n);
        let body = serde_json::json!({"epoch": at.epoch, "seq": at.seq}).to_string();
        let asked = self
            .client
            .publish_with_reply(self.subjects.resume(&self.opts.key), reply, body.into())
            .await;
        if asked.is_err() {
            self.session.restart();
            return Ok(None);
        }
        let mut applied = 0;
        loop {
            let msg = match tokio::time::timeout(self.opts.replay_timeout, replies.next()).await {
                Ok(Some(m)) => m,
                Ok(None) | Err(_) => {
                    tracing::debug!(key = %self.opts.key, "no resume answer in time; taking a snapshot");
                    self.session.restart();
                    return Ok(None);
                }
            };
            let now = self.now_ms();
            let step = self.session.on(now, &msg, Via::Log);
            for update in step.updates {
                applied += u64::from(matches!(update, Update::Event { .. }));
                self.emit(update).await?;
            }
            if step.resync {
                return Ok(None);
            }
            match step.end {
                Some(Ok(_)) => return Ok(Some(applied)),
                Some(Err(why)) => {
                    tracing::debug!(key = %self.opts.key, %why, "no resume from the log; taking a snapshot");
                    self.session.restart();
                    return Ok(None);
                }
                None => {}
            }
        }
    }

    /// Feeds one message to the session and hands out its updates; `true` when a
    /// snapshot is needed.
    pub(crate) async fn on_message(&mut self, msg: &Message, via: Via) -> Result<bool, Gone> {
        let now = self.now_ms();
        let step = self.session.on(now, msg, via);
        for update in step.updates {
            self.emit(update).await?;
        }
        Ok(step.resync)
    }
}
