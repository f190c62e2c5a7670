//! Sending this replica's interest: its table once in full, then what changed.
//!
//! Every interval the registry hands over its counts as they are now; the outbox
//! compares them with what it last sent and makes the messages: a full table (in parts)
//! when one is due — the first message of an incarnation, or a peer asked — otherwise
//! the tokens whose count changed (0: withdrawn), and an empty message when none did, so
//! the replica is still heard. What it costs the fleet per interval is then the changes,
//! not the names watched.

use std::collections::HashMap;

use super::sync::{Batch, Part};
use super::Kind;

/// At most this many records in one message: well under any `max_payload` with the
/// longest tokens (a 253-byte name in a 63-byte namespace).
pub const PER_MESSAGE: usize = 2_000;

#[derive(Debug)]
pub struct Outbox {
    epoch: u64,
    seq: u64,
    sent_refs: HashMap<String, u64>,
    sent_covered: HashMap<String, u64>,
    full_due: bool,
}

/// What one interval sends, and what changed in this replica's own records.
#[derive(Debug, Default, PartialEq)]
pub struct Sending {
    pub batches: Vec<Batch>,
    pub changes: Vec<(Kind, String, u64)>,
}

impl Outbox {
    /// An incarnation drawn `epoch` (random: a restarted replica must not be taken for
    /// its former self). Its first message is its full table.
    pub fn new(epoch: u64) -> Self {
        Outbox {
            epoch,
            seq: 0,
            sent_refs: HashMap::new(),
            sent_covered: HashMap::new(),
            full_due: true,
        }
    }

    /// The next message sends the full table (a peer is new or behind on this replica).
    pub fn send_full(&mut self) {
        self.full_due = true;
    }

    pub fn full_due(&self) -> bool {
        self.full_due
    }

    /// The messages for this interval, given the counts now (zeros count as absent).
    pub fn next(&mut self, refs: HashMap<String, u64>, covered: HashMap<String, u64>) -> Sending {
        let mut refs = refs;
        let mut covered = covered;
        refs.retain(|_, n| *n > 0);
        covered.retain(|_, n| *n > 0);
        let changes: Vec<(Kind, String, u64)> = changed(Kind::Refs, &self.sent_refs, &refs)
            .chain(changed(Kind::Covered, &self.sent_covered, &covered))
            .collect();
        let records: Vec<(Kind, String, u64)> = if self.full_due {
            let all = refs.iter().map(|(t, n)| (Kind::Refs, t, n));
            all.chain(covered.iter().map(|(t, n)| (Kind::Covered, t, n)))
                .map(|(k, t, n)| (k, t.clone(), *n))
                .collect()
        } else {
            changes.clone()
        };
        let full = std::mem::take(&mut self.full_due);
        let parts = records.len().div_ceil(PER_MESSAGE).max(1);
        let mut chunks = records.chunks(PER_MESSAGE);
        let batches = (0..parts)
            .map(|index| {
                let mut batch = Batch {
                    epoch: self.epoch,
                    seq: self.seq,
                    full: full.then_some(Part {
                        index: index as u32,
                        of: parts as u32,
                    }),
                    ..Batch::default()
                };
                self.seq = self.seq.wrapping_add(1);
                for (kind, token, n) in chunks.next().unwrap_or_default() {
                    match kind {
                        Kind::Refs => batch.refs.push((token.clone(), *n)),
                        Kind::Covered => batch.covered.push((token.clone(), *n)),
                    }
                }
                batch
            })
            .collect();
        self.sent_refs = refs;
        self.sent_covered = covered;
        Sending { batches, changes }
    }
}

/// The tokens whose count differs between `sent` and `now` (0: gone), of `kind`.
fn changed<'a>(
    kind: Kind,
    sent: &'a HashMap<String, u64>,
    now: &'a HashMap<String, u64>,
) -> impl Iterator<Item = (Kind, String, u64)> + 'a {
    let new = now
        .iter()
        .filter(|(t, n)| sent.get(*t) != Some(n))
        .map(move |(t, n)| (kind, t.clone(), *n));
    let gone = sent
        .keys()
        .filter(|t| !now.contains_key(*t))
        .map(move |t| (kind, t.clone(), 0));
    new.chain(gone)
}

#[cfg(test)]
mod tests {
    use super::super::sync::Peers;
    use super::super::Interest;
    use super::*;

    fn counts(pairs: &[(&str, u64)]) -> HashMap<String, u64> {
        pairs.iter().map(|(t, n)| (t.to_string(), *n)).collect()
    }

    fn sorted(mut v: Vec<(String, u64)>) -> Vec<(String, u64)> {
        v.sort();
        v
    }

    #[test]
    fn the_table_first_then_changes_then_heartbeats() {
        let mut o = Outbox::new(5);
        // (refs now, covered now, full?, refs sent, covered sent)
        type Counts = &'static [(&'static str, u64)];
        let steps: Vec<(Counts, Counts, bool, Counts, Counts)> = vec![
            (
                &[("a", 1), ("b", 2), ("z", 0)],
                &[("n", 3)],
                true,
                &[("a", 1), ("b", 2)],
                &[("n", 3)],
            ),
            (&[("a", 1), ("b", 2)], &[("n", 3)], false, &[], &[]),
            (
                &[("a", 2), ("c", 1)],
                &[],
                false,
                &[("a", 2), ("b", 0), ("c", 1)],
                &[("n", 0)],
            ),
            // A key in its grace period (0) is withdrawn like one gone.
            (&[("a", 0), ("c", 1)], &[], false, &[("a", 0)], &[]),
        ];
        for (n, (refs, covered, full, want_refs, want_covered)) in steps.into_iter().enumerate() {
            let s = o.next(counts(refs), counts(covered));
            let [batch] = s.batches.as_slice() else {
                panic!("step {n}: {:?}", s.batches);
            };
            assert_eq!((batch.epoch, batch.seq), (5, n as u64), "step {n}");
            assert_eq!(batch.full.is_some(), full, "step {n}");
            assert_eq!(
                sorted(batch.refs.clone()),
                sorted(counts(want_refs).into_iter().collect()),
                "step {n}"
            );
            assert_eq!(
                sorted(batch.covered.clone()),
                sorted(counts(want_covered).into_iter().collect()),
                "step {n}"
            );
        }
    }

    #[test]
    fn a_big_table_goes_in_numbered_parts_and_a_peer_can_ask_for_it_again() {
        let mut o = Outbox::new(1);
        let many: HashMap<String, u64> = (0..PER_MESSAGE * 2 + 1)
            .map(|i| (format!("t{i}"), 1))
            .collect();
        let s = o.next(many.clone(), counts(&[("n", 1)]));
        let parts: Vec<_> = s.batches.iter().map(|b| (b.seq, b.full)).collect();
        let part = |index, of| Some(Part { index, of });
        assert_eq!(parts, [(0, part(0, 3)), (1, part(1, 3)), (2, part(2, 3))]);
        assert!(s
            .batches
            .iter()
            .all(|b| b.refs.len() + b.covered.len() <= PER_MESSAGE));
        // Its own records changed by all of it (the registry records them as its own).
        assert_eq!(s.changes.len(), PER_MESSAGE * 2 + 2);
        assert!(!o.full_due());
        o.send_full();
        let again = o.next(many, counts(&[("n", 1)]));
        assert_eq!(again.batches.len(), 3);
        assert_eq!(again.batches[0].seq, 3);
        assert!(again.changes.is_empty());
    }

    #[test]
    fn a_receiver_rebuilds_the_senders_table_exactly() {
        // The outbox's messages through `sync::Peers`, a message lost on the way, and
        // the full table asked for again: the receiver ends with the sender's counts.
        let (mut o, mut peers, mut table) = (Outbox::new(3), Peers::default(), Interest::default());
        let rounds: Vec<(&[(&str, u64)], bool)> = vec![
            (&[("a", 1), ("b", 1)], true),
            (&[("a", 2), ("b", 1)], true),
            // Lost on the way: b withdrawn.
            (&[("a", 2)], false),
            (&[("a", 2), ("c", 1)], true),
            (&[("a", 2), ("c", 1)], true),
        ];
        for (n, (refs, delivered)) in rounds.into_iter().enumerate() {
            let s = o.next(counts(refs), HashMap::new());
            for b in s.batches.into_iter().filter(|_| delivered) {
                let heard = peers.receive(&mut table, "r", b, 0);
                if heard.ask_full {
                    o.send_full();
                }
            }
            let mut held: Vec<(String, u64)> = table
                .records_of(Kind::Refs, "r")
                .map(|(t, n)| (t.to_string(), n))
                .collect();
            held.sort();
            let want = sorted(counts(refs).into_iter().collect());
            // Right once delivered, except in the round that found the gap (the full
            // table goes with the next).
            if n == 2 {
                assert_eq!(held, [("a".to_string(), 2), ("b".to_string(), 1)]);
            } else if n != 3 {
                assert_eq!(held, want, "round {n}");
            } else {
                assert_eq!(
                    held,
                    [
                        ("a".to_string(), 2),
                        ("b".to_string(), 1),
                        ("c".to_string(), 1)
                    ]
                );
            }
        }
    }
}
