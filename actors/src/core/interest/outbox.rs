//! Sending this replica's interest: its table once in full, then what changed.
//!
//! The registry hands over each count of its own that changed (`core::refs` names them);
//! every interval the outbox makes the messages: the full table (in numbered parts) when
//! one is due — the first message of an incarnation, or a peer asked — otherwise the
//! counts changed since the last message (0: withdrawn), the latest of each, and an
//! empty message when none did, so the replica is still heard. What interest costs the
//! fleet per interval is then the changes, not the names watched.

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
    /// Counts changed since the last message, the latest of each.
    pending: HashMap<(Kind, String), u64>,
    full_due: bool,
}

impl Outbox {
    /// An incarnation drawn `epoch` (random: a restarted replica must not be taken for
    /// its former self). Its first message is its full table.
    pub fn new(epoch: u64) -> Self {
        Outbox {
            epoch,
            seq: 0,
            pending: HashMap::new(),
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

    /// One of this replica's counts is now `n` (0: none): it goes with the next message.
    pub fn changed(&mut self, kind: Kind, token: String, n: u64) {
        self.pending.insert((kind, token), n);
    }

    /// This interval's messages: the full table when one is due (`table` is asked for it
    /// then only: every count above 0), else the changes.
    pub fn next(&mut self, table: impl FnOnce() -> Vec<(Kind, String, u64)>) -> Vec<Batch> {
        let pending = std::mem::take(&mut self.pending);
        let full = std::mem::take(&mut self.full_due);
        let records: Vec<(Kind, String, u64)> = if full {
            table().into_iter().filter(|(_, _, n)| *n > 0).collect()
        } else {
            pending.into_iter().map(|((k, t), n)| (k, t, n)).collect()
        };
        let parts = records.len().div_ceil(PER_MESSAGE).max(1);
        let mut chunks = records.chunks(PER_MESSAGE);
        (0..parts)
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
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::super::sync::Peers;
    use super::super::Interest;
    use super::*;
    use Kind::{Covered, Refs};

    fn sorted(v: &[(String, u64)]) -> Vec<(String, u64)> {
        let mut v = v.to_vec();
        v.sort();
        v
    }

    fn owned(v: &[(&str, u64)]) -> Vec<(String, u64)> {
        sorted(
            &v.iter()
                .map(|(t, n)| (t.to_string(), *n))
                .collect::<Vec<_>>(),
        )
    }

    type Counts = &'static [(&'static str, u64)];

    #[test]
    fn the_table_first_then_changes_then_heartbeats() {
        let mut o = Outbox::new(5);
        let table = || {
            vec![
                (Refs, "a".to_string(), 1),
                (Refs, "z".to_string(), 0),
                (Covered, "n".to_string(), 3),
            ]
        };
        // (changes before the interval, full?, refs sent, covered sent)
        type Changes = Vec<(Kind, &'static str, u64)>;
        let steps: Vec<(Changes, bool, Counts, Counts)> = vec![
            // Changes before the first message are in the table it sends.
            (vec![(Refs, "a", 1)], true, &[("a", 1)], &[("n", 3)]),
            (vec![], false, &[], &[]),
            (
                vec![
                    (Refs, "a", 2),
                    (Refs, "b", 1),
                    (Refs, "a", 3),
                    (Covered, "n", 0),
                ],
                false,
                &[("a", 3), ("b", 1)],
                &[("n", 0)],
            ),
            (vec![], false, &[], &[]),
        ];
        for (n, (changes, full, refs, covered)) in steps.into_iter().enumerate() {
            for (kind, token, count) in changes {
                o.changed(kind, token.to_string(), count);
            }
            let batches = o.next(table);
            let [batch] = batches.as_slice() else {
                panic!("step {n}: {batches:?}");
            };
            assert_eq!((batch.epoch, batch.seq), (5, n as u64), "step {n}");
            assert_eq!(batch.full.is_some(), full, "step {n}");
            assert_eq!(sorted(&batch.refs), owned(refs), "step {n}");
            assert_eq!(sorted(&batch.covered), owned(covered), "step {n}");
        }
    }

    #[test]
    fn a_big_table_goes_in_numbered_parts_and_a_peer_can_ask_for_it_again() {
        let mut o = Outbox::new(1);
        let table = || {
            (0..PER_MESSAGE * 2 + 1)
                .map(|i| (Refs, format!("t{i}"), 1))
                .chain([(Covered, "n".to_string(), 1)])
                .collect()
        };
        let batches = o.next(table);
        let parts: Vec<_> = batches.iter().map(|b| (b.seq, b.full)).collect();
        let part = |index, of| Some(Part { index, of });
        assert_eq!(parts, [(0, part(0, 3)), (1, part(1, 3)), (2, part(2, 3))]);
        assert!(batches
            .iter()
            .all(|b| b.refs.len() + b.covered.len() <= PER_MESSAGE));
        assert!(!o.full_due());
        assert_eq!(o.next(table).len(), 1);
        o.send_full();
        let again = o.next(table);
        assert_eq!(again.len(), 3);
        assert_eq!(again[0].seq, 4);
    }

    #[test]
    fn a_receiver_rebuilds_the_senders_table_exactly() {
        // The outbox's messages through `sync::Peers`, a message lost on the way, and
        // the full table asked for again: the receiver ends with the sender's counts.
        let (mut o, mut peers, mut table) = (Outbox::new(3), Peers::default(), Interest::default());
        let mut now: HashMap<String, u64> = HashMap::new();
        // (counts changed this round, delivered?)
        let rounds: Vec<(Counts, bool)> = vec![
            (&[("a", 1), ("b", 1)], true),
            (&[("a", 2)], true),
            // Lost on the way: b withdrawn.
            (&[("b", 0)], false),
            (&[("c", 1)], true),
            (&[], true),
        ];
        for (n, (changes, delivered)) in rounds.into_iter().enumerate() {
            for (t, c) in changes {
                now.insert(t.to_string(), *c);
                o.changed(Refs, t.to_string(), *c);
            }
            let full = || now.iter().map(|(t, c)| (Refs, t.clone(), *c)).collect();
            for b in o.next(full).into_iter().filter(|_| delivered) {
                if peers.receive(&mut table, "r", b, 0).ask_full {
                    o.send_full();
                }
            }
            let mut held: Vec<(String, u64)> = table
                .records_of(Refs, "r")
                .map(|(t, c)| (t.to_string(), c))
                .collect();
            held.sort();
            let mut want: Vec<(String, u64)> = now
                .iter()
                .filter(|(_, c)| **c > 0)
                .map(|(t, c)| (t.clone(), *c))
                .collect();
            want.sort();
            match n {
                // Not delivered, and then the round that found the gap: b is still
                // held until the full table, which goes with the next message.
                2 => assert_eq!(held, owned(&[("a", 2), ("b", 1)])),
                3 => assert_eq!(held, owned(&[("a", 2), ("b", 1), ("c", 1)])),
                _ => assert_eq!(held, want, "round {n}"),
            }
        }
    }
}
