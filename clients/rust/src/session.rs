//! One key's subscriber state, without NATS: messages in, [`Update`]s out. The decisions
//! are `core::mirror`'s; this adds what a subscriber must do around them — drop events it
//! already has before spending anything on them, reassemble chunks (live, resume and
//! snapshot answers apart), verify and open each message as the owner sealed and signed
//! it, take only the answers to its current request, and note a resume answer's end. The
//! task in `follow` carries the results out; the contract test (`clients/contract/`)
//! feeds it recorded messages, as the Go package's test feeds its own.

use async_nats::Message;
use bytes::Bytes;
use kcache_actors::core::mirror::{Input, Mirror, Output, Resync, Stamp};
use kcache_actors::core::wire::{self, Kind, Reassembler};
use kcache_actors::fleet::codec::{self, Opener};

use crate::{Position, Update};

/// Where a message came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Via {
    /// The key's events subject.
    Live,
    /// An answer to a resume request: the key's retained events (`fleet::resume`).
    Log,
    /// An answer to a snapshot request.
    Reply,
}

/// What one message led to.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Step {
    pub updates: Vec<Update>,
    /// A snapshot is needed (ask for one).
    pub resync: bool,
    /// A resume answer ended: `Ok(n)` messages were sent, or why none could be.
    pub end: Option<Result<u64, String>>,
}

pub struct Session {
    opener: Opener,
    mirror: Mirror<(Kind, Bytes)>,
    live_parts: Reassembler,
    /// The log's chunks apart from the live ones: a replay may end between two chunks of
    /// an event whose live copy then arrives whole.
    log_parts: Reassembler,
    reply_parts: Reassembler,
    /// The current snapshot request's number: answers to older ones are dropped.
    request: u64,
}

impl Session {
    /// `stale_after_ms`: how long a silent owner of the highest epoch keeps lower epochs
    /// fenced off; `buffer`: events held while a snapshot is on the way.
    pub fn new(opener: Opener, stale_after_ms: u64, buffer: usize) -> Session {
        Session {
            opener,
            mirror: Mirror::new(stale_after_ms, buffer),
            live_parts: Reassembler::default(),
            log_parts: Reassembler::default(),
            reply_parts: Reassembler::default(),
            request: 0,
        }
    }

    /// Continues from a kept position, with no snapshot (`Mirror::resume`).
    pub fn resume(&mut self, now_ms: u64, at: Position) {
        self.mirror.resume(now_ms, at.epoch, at.seq);
    }

    pub fn synced(&self) -> bool {
        self.mirror.synced()
    }

    pub fn seq(&self) -> Option<u64> {
        self.mirror.seq()
    }

    /// Gives up the position (a replay that could not be read): the next snapshot decides.
    pub fn restart(&mut self) {
        self.mirror.restart();
    }

    /// A new snapshot or resume request goes out: its number, the last token of its reply
    /// subject.
    pub fn ask(&mut self) -> u64 {
        self.reply_parts.reset();
        self.log_parts.reset();
        self.request += 1;
        self.request
    }

    /// Feeds one message.
    pub fn on(&mut self, now_ms: u64, msg: &Message, via: Via) -> Step {
        let mut step = Step::default();
        if msg.headers.is_none() || msg.status.is_some() {
            // "No responders": no owner yet (a snapshot request: the caller asks again), or
            // no replica retains events (a resume: take a snapshot).
            if via == Via::Log {
                step.end = Some(Err("no replica answers resume requests".into()));
            }
            return step;
        }
        if via != Via::Live && !self.answers_current_request(msg) {
            return step;
        }
        let header = |name: &str| {
            msg.headers
                .as_ref()
                .and_then(|h| h.get(name))
                .map(|v| v.to_string())
        };
        if via == Via::Log {
            if let Some(n) = header(wire::H_RESUME_END) {
                step.end = Some(
                    n.parse()
                        .map_err(|_| format!("a malformed {}: {n:?}", wire::H_RESUME_END)),
                );
                return step;
            }
            if let Some(why) = header(wire::H_RESUME_ERROR) {
                step.end = Some(Err(why));
                return step;
            }
        }
        let frame = match codec::frame(msg) {
            Ok(f) => f,
            Err(error) => return self.refuse(step, error.to_string()),
        };
        // An event already applied (a live copy of a resumed one, a repeat): dropped before
        // its chunks are collected or its signature and seal checked.
        let parts = match via {
            Via::Live => &mut self.live_parts,
            Via::Log => &mut self.log_parts,
            Via::Reply => &mut self.reply_parts,
        };
        if via != Via::Reply
            && frame.kind == Kind::Event
            && self.mirror.epoch() == frame.epoch
            && self.mirror.seq().is_some_and(|s| frame.seq <= s)
        {
            // A run whose first chunks were collected before a snapshot covered it: its
            // partial goes too, or the next message would find it broken.
            if frame.chunk.is_some() {
                parts.reset();
            }
            return step;
        }
        let opened = self
            .opener
            .body(&frame, msg, parts)
            .map(|body| (frame, body));
        let (frame, body) = match opened {
            Ok((frame, Some(body))) => (frame, body),
            Ok((_, None)) => return step,
            Err(error) => return self.refuse(step, error.to_string()),
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
            // The owner is not synced yet: the caller's retry asks again.
            (Kind::NotReady, Via::Reply) => return step,
            (kind, _) => {
                let why = format!("a {} message where none belongs", kind.as_str());
                step.updates.push(Update::Refused(why));
                return step;
            }
        };
        for out in self.mirror.on(now_ms, input) {
            step.updates.push(match out {
                Output::Snapshot(stamp, (_, list)) => Update::Snapshot { stamp, list },
                Output::Apply(stamp, (_, line)) => Update::Event {
                    stamp,
                    line,
                    replayed: via == Via::Log,
                },
                Output::Progress(rv) => Update::Progress { rv },
                Output::Resync(why) => {
                    step.resync = true;
                    Update::Resync(why)
                }
                Output::Stale(stamp) => {
                    tracing::debug!(epoch = stamp.epoch, "ignored a fenced-off owner's message");
                    continue;
                }
            });
        }
        step
    }

    /// A message that does not decode, verify or open: the stream cannot be trusted to
    /// continue, so a snapshot.
    fn refuse(&mut self, mut step: Step, why: String) -> Step {
        self.mirror.restart();
        step.updates.push(Update::Refused(why));
        step.updates.push(Update::Resync(Resync::Gap));
        step.resync = true;
        step
    }

    /// Whether a snapshot answer is arriving (chunks of it came, not its last): asking
    /// again now would throw it away.
    pub fn answer_arriving(&self) -> bool {
        self.reply_parts.collecting()
    }

    /// Answers to an earlier request (already retried) are not this one's.
    fn answers_current_request(&self, msg: &Message) -> bool {
        msg.subject
            .rsplit('.')
            .next()
            .and_then(|n| n.parse::<u64>().ok())
            == Some(self.request)
    }
}
