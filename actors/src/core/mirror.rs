//! A mirror's view of its owner's event stream: fencing by epoch, ordering and gap
//! detection by per-key sequence number, resynchronisation by snapshot.
//!
//! Every message from an owner carries `(epoch, seq, rv)`. The epoch only grows from one
//! owner to the next (it is the KV revision at which the owner created its lease), so a
//! message with a lower epoch than the highest one accepted comes from a fenced-off owner
//! (paused, partitioned, or its buffered publishes flushed after a reconnect) and is
//! rejected. Within an epoch `seq` must grow by exactly one: a repeat is dropped, a jump
//! is a gap, and a heartbeat whose `seq` is ahead of ours reveals a lost last event. A gap,
//! a new epoch or a join all lead to the same place: buffer what arrives, ask for a
//! snapshot, apply it, then the buffered events after the snapshot's `seq`.
//!
//! If the owner of the highest epoch falls silent for longer than `stale_after_ms` (it
//! died), a lower epoch is accepted again: this only matters if the lease bucket was lost
//! and revisions restarted, and without it the key could never resume.
//!
//! A higher epoch fences off the current owner, so it is taken only once the lease stream
//! confirms it ([`EpochGate`]): the key's lease is held by the message's owner and its
//! revision has reached the epoch. A publisher that may write on the key's subjects but
//! holds no lease (a misconfigured NATS account; a replica whose lease moved on) cannot
//! fence off the real owner.

use std::collections::VecDeque;

/// What an owner stamps on each message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stamp {
    pub epoch: u64,
    pub seq: u64,
    pub rv: u64,
}

#[derive(Debug)]
pub enum Input<T> {
    Event(Stamp, T),
    /// `seq` is the owner's last seq, `rv` its progress.
    Heartbeat(Stamp),
    /// The owner's state at `seq` (and `rv`).
    Snapshot(Stamp, T),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resync {
    /// Nothing applied yet (join, restart, reconnect).
    Start,
    /// A sequence number was skipped, or a heartbeat was ahead of the last event.
    Gap,
    /// A new owner (higher epoch) took the key over.
    NewEpoch,
    /// A snapshot was refused (stale epoch); ask again.
    Retry,
}

#[derive(Debug, PartialEq, Eq)]
pub enum Output<T> {
    /// Apply this event (in this order).
    Apply(Stamp, T),
    /// Replace the state with this snapshot (the caller diffs it against what it has).
    Snapshot(Stamp, T),
    /// The key is complete up to this RV.
    Progress(u64),
    /// Request a snapshot (once per resync; the caller retries on timeout).
    Resync(Resync),
    /// A message from a fenced-off owner was dropped.
    Stale(Stamp),
}

#[derive(Debug)]
pub struct Mirror<T> {
    /// Highest epoch accepted.
    epoch: u64,
    /// Last seq applied in `epoch`; `None` while resynchronising.
    seq: Option<u64>,
    /// When a message of `epoch` was last heard.
    heard_ms: u64,
    stale_after_ms: u64,
    buffer: VecDeque<(Stamp, T)>,
    max_buffer: usize,
}

impl<T> Mirror<T> {
    pub fn new(stale_after_ms: u64, max_buffer: usize) -> Self {
        Mirror {
            epoch: 0,
            seq: None,
            heard_ms: 0,
            stale_after_ms,
            buffer: VecDeque::new(),
            max_buffer: max_buffer.max(1),
        }
    }

    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// The last seq applied, `None` while waiting for a snapshot.
    pub fn seq(&self) -> Option<u64> {
        self.seq
    }

    pub fn synced(&self) -> bool {
        self.seq.is_some()
    }

    /// Forget the stream position (NATS reconnected, or the mirror restarts): the next
    /// snapshot decides. The epoch floor stays, so stale owners remain fenced.
    pub fn restart(&mut self) {
        self.seq = None;
        self.buffer.clear();
    }

    /// Continues from a position kept by an earlier run (a subscriber that was away):
    /// synced at `seq` of `epoch` with no snapshot. The next event must be `seq + 1` of that
    /// epoch; a jump, a heartbeat ahead or a new epoch asks for a snapshot as usual. A
    /// position below the epoch already accepted is ignored (its owner is fenced off).
    pub fn resume(&mut self, now_ms: u64, epoch: u64, seq: u64) {
        if epoch < self.epoch {
            return;
        }
        self.epoch = epoch;
        self.seq = Some(seq);
        self.heard_ms = now_ms;
        self.buffer.clear();
    }

    /// Feeds one message.
    pub fn on(&mut self, now_ms: u64, input: Input<T>) -> Vec<Output<T>> {
        let mut out = Vec::new();
        let stamp = match &input {
            Input::Event(s, _) | Input::Heartbeat(s) | Input::Snapshot(s, _) => *s,
        };
        if stamp.epoch < self.epoch {
            let silent = now_ms.saturating_sub(self.heard_ms) > self.stale_after_ms;
            if !silent {
                out.push(Output::Stale(stamp));
                if matches!(input, Input::Snapshot(..)) {
                    out.push(Output::Resync(Resync::Retry));
                }
                return out;
            }
            // The owner of the higher epoch is gone: start over from this one.
            self.epoch = stamp.epoch;
            self.seq = None;
            self.buffer.clear();
            if !matches!(input, Input::Snapshot(..)) {
                out.push(Output::Resync(Resync::NewEpoch));
            }
        } else if stamp.epoch > self.epoch {
            self.epoch = stamp.epoch;
            let was_synced = self.seq.take().is_some();
            self.buffer.clear();
            if was_synced && !matches!(input, Input::Snapshot(..)) {
                out.push(Output::Resync(Resync::NewEpoch));
            }
        }
        self.heard_ms = now_ms;
        match input {
            Input::Snapshot(s, body) => {
                self.seq = Some(s.seq);
                out.push(Output::Snapshot(s, body));
                self.drain(&mut out);
            }
            Input::Event(s, body) => match self.seq {
                None => self.hold(s, body),
                Some(last) if s.seq <= last => {}
                Some(last) if s.seq == last + 1 => {
                    self.seq = Some(s.seq);
                    out.push(Output::Apply(s, body));
                }
                Some(_) => {
                    self.seq = None;
                    self.hold(s, body);
                    out.push(Output::Resync(Resync::Gap));
                }
            },
            Input::Heartbeat(s) => match self.seq {
                Some(last) if s.seq == last => out.push(Output::Progress(s.rv)),
                Some(last) if s.seq > last => {
                    self.seq = None;
                    out.push(Output::Resync(Resync::Gap));
                }
                _ => {}
            },
        }
        out
    }

    fn hold(&mut self, s: Stamp, body: T) {
        if self.buffer.len() == self.max_buffer {
            // The snapshot will cover what is dropped here: it is taken after these.
            self.buffer.pop_front();
        }
        self.buffer.push_back((s, body));
    }

    /// After a snapshot: the buffered events that follow it, while they are contiguous.
    fn drain(&mut self, out: &mut Vec<Output<T>>) {
        while let Some((s, body)) = self.buffer.pop_front() {
            let Some(last) = self.seq else { break };
            if s.epoch != self.epoch || s.seq <= last {
                continue;
            }
            if s.seq == last + 1 {
                self.seq = Some(s.seq);
                out.push(Output::Apply(s, body));
            } else {
                self.seq = None;
                self.buffer.clear();
                out.push(Output::Resync(Resync::Gap));
                break;
            }
        }
    }
}

/// What to do with a message of some epoch before the mirror sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gate {
    /// Confirmed already (or not higher than what was): feed it to the mirror.
    Pass,
    /// Read the key's lease, then [`EpochGate::settle`].
    Check,
    /// This epoch failed a check a moment ago: drop the message (counted) until the next
    /// check is due.
    Refuse,
}

/// Confirms higher epochs against the lease stream, once per epoch; a failed check is
/// tried again after `recheck_ms` (a lease read that lags, or a lease written a moment
/// after the message was read), never more often.
#[derive(Debug)]
pub struct EpochGate {
    /// The highest epoch the lease stream confirmed.
    confirmed: u64,
    /// The last failed check: its epoch and when.
    failed: Option<(u64, u64)>,
    recheck_ms: u64,
}

impl EpochGate {
    pub fn new(recheck_ms: u64) -> Self {
        EpochGate {
            confirmed: 0,
            failed: None,
            recheck_ms,
        }
    }

    pub fn admit(&self, epoch: u64, now_ms: u64) -> Gate {
        if epoch <= self.confirmed {
            return Gate::Pass;
        }
        match self.failed {
            Some((e, at)) if e == epoch && now_ms.saturating_sub(at) < self.recheck_ms => {
                Gate::Refuse
            }
            _ => Gate::Check,
        }
    }

    /// The lease read for `epoch`, claimed by `owner`: `lease` is its revision and holder
    /// (`None`: no lease; `Err`: unreadable). Confirmed when the holder is the owner and
    /// the revision has reached the epoch (renewals only raise it).
    pub fn settle(
        &mut self,
        epoch: u64,
        owner: &str,
        lease: Result<Option<(u64, &str)>, ()>,
        now_ms: u64,
    ) -> bool {
        let confirmed = matches!(lease, Ok(Some((rev, holder))) if holder == owner && !owner.is_empty() && rev >= epoch);
        if confirmed {
            self.confirmed = self.confirmed.max(epoch);
            self.failed = None;
        } else {
            self.failed = Some((epoch, now_ms));
        }
        confirmed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn higher_epochs_pass_only_once_the_lease_stream_confirms_them() {
        // (epoch, owner, lease, confirmed)
        type Case = (
            u64,
            &'static str,
            Result<Option<(u64, &'static str)>, ()>,
            bool,
        );
        let table: &[Case] = &[
            (5, "r1", Ok(Some((5, "r1"))), true),
            // Renewed since: the revision only grows.
            (5, "r1", Ok(Some((9, "r1"))), true),
            // Another replica holds the lease.
            (5, "r1", Ok(Some((9, "r2"))), false),
            // An epoch the stream has not reached: forged or from a lost bucket's past.
            (50, "r1", Ok(Some((9, "r1"))), false),
            // No lease, an unreadable one, an unnamed owner.
            (5, "r1", Ok(None), false),
            (5, "r1", Err(()), false),
            (5, "", Ok(Some((5, ""))), false),
        ];
        for (epoch, owner, lease, want) in table {
            let mut gate = EpochGate::new(500);
            assert_eq!(gate.admit(*epoch, 0), Gate::Check);
            assert_eq!(
                gate.settle(*epoch, owner, *lease, 0),
                *want,
                "{epoch} {owner} {lease:?}"
            );
            let after = if *want { Gate::Pass } else { Gate::Refuse };
            assert_eq!(gate.admit(*epoch, 1), after, "{epoch} {owner} {lease:?}");
        }
    }

    #[test]
    fn a_confirmed_epoch_passes_lower_ones_and_a_failed_check_is_retried_later() {
        let mut gate = EpochGate::new(500);
        assert!(gate.settle(7, "r1", Ok(Some((7, "r1"))), 0));
        // Lower and equal epochs are the mirror's to fence, not the gate's.
        assert_eq!(gate.admit(3, 0), Gate::Pass);
        assert_eq!(gate.admit(7, 0), Gate::Pass);
        assert_eq!(gate.admit(8, 0), Gate::Check);
        assert!(!gate.settle(8, "r2", Ok(Some((7, "r1"))), 1_000));
        assert_eq!(gate.admit(8, 1_499), Gate::Refuse);
        // Another epoch is checked at once; the failed one again once due.
        assert_eq!(gate.admit(9, 1_100), Gate::Check);
        assert_eq!(gate.admit(8, 1_500), Gate::Check);
        assert!(gate.settle(8, "r2", Ok(Some((8, "r2"))), 1_500));
        assert_eq!(gate.admit(8, 1_501), Gate::Pass);
    }

    #[test]
    fn a_resumed_position_continues_without_a_snapshot_until_it_does_not_fit() {
        // (what follows a resume at epoch 3 seq 10, what the mirror says)
        type Case = (&'static str, Input<u8>, Vec<Output<u8>>);
        let table: Vec<Case> = vec![
            (
                "the next event",
                Input::Event(st(3, 11), 1),
                vec![Output::Apply(st(3, 11), 1)],
            ),
            ("an event already had", Input::Event(st(3, 10), 1), vec![]),
            (
                "a jump",
                Input::Event(st(3, 12), 1),
                vec![Output::Resync(Resync::Gap)],
            ),
            (
                "a heartbeat at the position",
                Input::Heartbeat(st(3, 10)),
                vec![Output::Progress(310)],
            ),
            (
                "a heartbeat ahead",
                Input::Heartbeat(st(3, 12)),
                vec![Output::Resync(Resync::Gap)],
            ),
            (
                "a new owner",
                Input::Event(st(4, 1), 1),
                vec![Output::Resync(Resync::NewEpoch)],
            ),
        ];
        for (name, input, want) in table {
            let mut m: Mirror<u8> = Mirror::new(10_000, 10);
            m.resume(0, 3, 10);
            assert!(m.synced(), "{name}");
            assert_eq!(m.on(1, input), want, "{name}");
        }
        // A position of a fenced-off owner is not taken.
        let mut m: Mirror<u8> = Mirror::new(10_000, 10);
        m.on(0, Input::Snapshot(st(5, 1), 0));
        m.resume(1, 3, 10);
        assert_eq!((m.epoch(), m.seq()), (5, Some(1)));
    }

    fn st(epoch: u64, seq: u64) -> Stamp {
        Stamp {
            epoch,
            seq,
            rv: 100 * epoch + seq,
        }
    }
    fn ev(epoch: u64, seq: u64) -> Input<u64> {
        Input::Event(st(epoch, seq), seq)
    }
    fn applied(out: &[Output<u64>]) -> Vec<u64> {
        out.iter()
            .filter_map(|o| match o {
                Output::Apply(_, v) => Some(*v),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn join_buffers_until_the_snapshot_then_applies_what_follows() {
        let mut m = Mirror::new(10_000, 100);
        assert!(m.on(0, ev(5, 3)).is_empty());
        assert!(m.on(1, ev(5, 4)).is_empty());
        assert!(m.on(2, ev(5, 5)).is_empty());
        // The snapshot was taken at seq 3: events 4 and 5 follow it.
        let out = m.on(3, Input::Snapshot(st(5, 3), 0));
        assert!(matches!(out[0], Output::Snapshot(s, _) if s.seq == 3));
        assert_eq!(applied(&out), vec![4, 5]);
        assert_eq!(applied(&m.on(4, ev(5, 6))), vec![6]);
        assert_eq!(m.seq(), Some(6));
    }

    #[test]
    fn duplicates_are_dropped_and_gaps_resync() {
        let mut m = Mirror::new(10_000, 100);
        m.on(0, Input::Snapshot(st(1, 10), 0));
        assert_eq!(applied(&m.on(1, ev(1, 11))), vec![11]);
        assert!(m.on(2, ev(1, 11)).is_empty());
        assert!(m.on(2, ev(1, 9)).is_empty());
        let out = m.on(3, ev(1, 13));
        assert_eq!(out, vec![Output::Resync(Resync::Gap)]);
        assert!(!m.synced());
        assert!(m.on(4, ev(1, 14)).is_empty());
        // The snapshot covers 12 and 13; 14 follows from the buffer.
        let out = m.on(5, Input::Snapshot(st(1, 13), 0));
        assert_eq!(applied(&out), vec![14]);
    }

    #[test]
    fn a_gap_inside_the_buffer_asks_again() {
        let mut m = Mirror::new(10_000, 100);
        m.on(0, ev(1, 5));
        m.on(0, ev(1, 7));
        let out = m.on(0, Input::Snapshot(st(1, 4), 0));
        assert_eq!(applied(&out), vec![5]);
        assert_eq!(out.last(), Some(&Output::Resync(Resync::Gap)));
    }

    #[test]
    fn a_heartbeat_ahead_reveals_a_lost_last_event() {
        let mut m = Mirror::new(10_000, 100);
        m.on(0, Input::Snapshot(st(1, 10), 0));
        assert_eq!(
            m.on(1, Input::Heartbeat(st(1, 10))),
            vec![Output::Progress(110)]
        );
        assert_eq!(
            m.on(2, Input::Heartbeat(st(1, 11))),
            vec![Output::Resync(Resync::Gap)]
        );
        // While resynchronising, heartbeats say nothing.
        assert!(m.on(3, Input::Heartbeat(st(1, 11))).is_empty());
    }

    #[test]
    fn stale_epochs_are_fenced_off() {
        let mut m = Mirror::new(10_000, 100);
        m.on(0, Input::Snapshot(st(2, 1), 0));
        assert_eq!(m.on(1, ev(1, 2)), vec![Output::Stale(st(1, 2))]);
        assert_eq!(
            m.on(1, Input::Heartbeat(st(1, 9))),
            vec![Output::Stale(st(1, 9))]
        );
        let out = m.on(1, Input::Snapshot(st(1, 9), 0));
        assert_eq!(
            out,
            vec![Output::Stale(st(1, 9)), Output::Resync(Resync::Retry)]
        );
        assert_eq!(m.seq(), Some(1));
        assert_eq!(applied(&m.on(2, ev(2, 2))), vec![2]);
    }

    #[test]
    fn a_new_owner_means_a_resync() {
        let mut m = Mirror::new(10_000, 100);
        m.on(0, Input::Snapshot(st(1, 5), 0));
        // The new owner's seq numbering is its own.
        let out = m.on(1, ev(3, 40));
        assert_eq!(out, vec![Output::Resync(Resync::NewEpoch)]);
        assert_eq!(m.epoch(), 3);
        let out = m.on(2, Input::Snapshot(st(3, 39), 0));
        assert_eq!(applied(&out), vec![40]);
        // The old owner, late: fenced.
        assert!(matches!(m.on(3, ev(1, 6))[0], Output::Stale(_)));
    }

    #[test]
    fn a_silent_higher_epoch_stops_fencing_after_the_bound() {
        let mut m = Mirror::new(1_000, 100);
        m.on(0, Input::Snapshot(st(9, 1), 0));
        assert!(matches!(m.on(500, ev(2, 1))[0], Output::Stale(_)));
        let out = m.on(2_000, ev(2, 2));
        assert_eq!(out, vec![Output::Resync(Resync::NewEpoch)]);
        assert_eq!(m.epoch(), 2);
        let out = m.on(2_001, Input::Snapshot(st(2, 1), 0));
        assert_eq!(applied(&out), vec![2]);
    }

    #[test]
    fn the_buffer_is_bounded() {
        let mut m = Mirror::new(10_000, 3);
        for s in 1..=10 {
            m.on(0, ev(1, s));
        }
        let out = m.on(0, Input::Snapshot(st(1, 7), 0));
        assert_eq!(applied(&out), vec![8, 9, 10]);
        m.restart();
        assert!(!m.synced());
        assert_eq!(m.epoch(), 1);
    }
}
