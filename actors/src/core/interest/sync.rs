//! Receiving the fleet's interest: each replica's messages applied in order.
//!
//! A replica numbers its messages (`seq`) within an incarnation (`epoch`, drawn at
//! start). Its table arrives once in full, in consecutive parts, and then as changes:
//! a change is a token's new count, so applying it twice is harmless, but a lost one
//! leaves that token wrong until the next full table. So a receiver that sees a number
//! skipped, a part out of its run, or a replica's changes before its table, is **behind**
//! on it and asks for its table again (the caller names it in its next message); it
//! keeps applying changes meanwhile (the tokens they name are right), and a full table
//! drops what it no longer names. A new incarnation's records are dropped at once (its
//! table comes with its first message), and it is told to need everyone's table.

use std::collections::hash_map::Entry;
use std::collections::{HashMap, HashSet};

use super::{Interest, Kind};

/// One message of a replica's interest, as the fleet sends it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Batch {
    pub epoch: u64,
    pub seq: u64,
    /// Part `index` of a full table of `of` parts; `None`: changes since the last message.
    pub full: Option<Part>,
    pub refs: Vec<(String, u64)>,
    pub covered: Vec<(String, u64)>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Part {
    pub index: u32,
    pub of: u32,
}

/// What a message asks of the receiver.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Heard {
    /// The sender is new (or restarted): it needs this replica's full table.
    pub send_full: bool,
    /// This replica is behind on the sender and needs its full table.
    pub ask_full: bool,
}

#[derive(Debug)]
struct Peer {
    epoch: u64,
    next_seq: u64,
    state: State,
}

#[derive(Debug)]
enum State {
    Synced,
    Behind,
    /// Parts `0..next` of a full table of `of` parts applied; what they named.
    Staging {
        next: u32,
        of: u32,
        named: HashSet<(Kind, String)>,
    },
}

/// Where this replica stands with each other replica's messages.
#[derive(Debug, Default)]
pub struct Peers {
    peers: HashMap<String, Peer>,
}

impl Peers {
    /// Applies `batch` from `replica` to `table`, heard at `now_ms`.
    pub fn receive(
        &mut self,
        table: &mut Interest,
        replica: &str,
        batch: Batch,
        now_ms: u64,
    ) -> Heard {
        let mut heard = Heard::default();
        let peer = match self.peers.get_mut(replica) {
            Some(p) if p.epoch == batch.epoch => {
                if p.next_seq != batch.seq {
                    p.state = State::Behind;
                }
                p
            }
            known => {
                // A replica not heard before, or a new incarnation of one: what an older
                // one held is gone with it, and so is where this replica stood with it
                // (behind until the new one's table has come whole).
                if known.is_some() {
                    table.forget(replica);
                }
                heard.send_full = true;
                let fresh = Peer {
                    epoch: batch.epoch,
                    next_seq: batch.seq,
                    state: State::Behind,
                };
                match self.peers.entry(replica.to_string()) {
                    Entry::Occupied(mut e) => {
                        *e.get_mut() = fresh;
                        e.into_mut()
                    }
                    Entry::Vacant(e) => e.insert(fresh),
                }
            }
        };
        peer.next_seq = batch.seq.wrapping_add(1);
        table.heard(replica, now_ms);
        match (batch.full, &mut peer.state) {
            (None, State::Staging { .. }) => peer.state = State::Behind,
            (None, _) => {}
            (Some(Part { index: 0, of }), _) => {
                peer.state = State::Staging {
                    next: 0,
                    of,
                    named: HashSet::new(),
                }
            }
            (Some(part), State::Staging { next, of, .. })
                if part.index == *next && part.of == *of => {}
            (Some(_), _) => peer.state = State::Behind,
        }
        for (kind, records) in [(Kind::Refs, batch.refs), (Kind::Covered, batch.covered)] {
            for (token, n) in records {
                table.record(kind, replica, &token, n);
                if let State::Staging { named, .. } = &mut peer.state {
                    if n > 0 {
                        named.insert((kind, token));
                    }
                }
            }
        }
        if let State::Staging { next, of, named } = &mut peer.state {
            *next += 1;
            if *next >= *of {
                // The whole table arrived: what it does not name is gone.
                table.retain_records(replica, |kind, token| {
                    named.contains(&(kind, token.to_string()))
                });
                peer.state = State::Synced;
            }
        }
        heard.ask_full = matches!(peer.state, State::Behind);
        heard
    }

    /// The replicas whose full table this one needs.
    pub fn behind(&self) -> impl Iterator<Item = &str> + '_ {
        self.peers
            .iter()
            .filter(|(_, p)| matches!(p.state, State::Behind))
            .map(|(r, _)| r.as_str())
    }

    /// Forgets `replica` (it expired): if it comes back, it is new.
    pub fn forget(&mut self, replica: &str) {
        self.peers.remove(replica);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TTL: u64 = 3_000;

    fn delta(epoch: u64, seq: u64, refs: &[(&str, u64)]) -> Batch {
        Batch {
            epoch,
            seq,
            full: None,
            refs: refs.iter().map(|(t, n)| (t.to_string(), *n)).collect(),
            covered: Vec::new(),
        }
    }

    fn full(epoch: u64, seq: u64, (index, of): (u32, u32), refs: &[(&str, u64)]) -> Batch {
        Batch {
            full: Some(Part { index, of }),
            ..delta(epoch, seq, refs)
        }
    }

    fn refs(t: &Interest, token: &str) -> u64 {
        t.total(Kind::Refs, token, 0, TTL)
    }

    /// (message from replica "a", what it asks, a's count of tokens x, y, z after it)
    type Step = (Batch, Heard, [u64; 3]);

    fn run(steps: Vec<Step>) {
        let (mut peers, mut table) = (Peers::default(), Interest::default());
        for (n, (batch, asks, counts)) in steps.into_iter().enumerate() {
            let heard = peers.receive(&mut table, "a", batch, 0);
            assert_eq!(heard, asks, "step {n}");
            let now = [refs(&table, "x"), refs(&table, "y"), refs(&table, "z")];
            assert_eq!(now, counts, "step {n}");
            assert_eq!(
                peers.behind().count(),
                usize::from(asks.ask_full),
                "step {n}"
            );
        }
    }

    const NEW: Heard = Heard {
        send_full: true,
        ask_full: false,
    };
    const NEW_BEHIND: Heard = Heard {
        send_full: true,
        ask_full: true,
    };
    const OK: Heard = Heard {
        send_full: false,
        ask_full: false,
    };
    const BEHIND: Heard = Heard {
        send_full: false,
        ask_full: true,
    };

    #[test]
    fn a_table_then_its_changes_in_order() {
        run(vec![
            (full(7, 0, (0, 2), &[("x", 1)]), NEW, [1, 0, 0]),
            (full(7, 1, (1, 2), &[("y", 2)]), OK, [1, 2, 0]),
            (delta(7, 2, &[("x", 0), ("z", 4)]), OK, [0, 2, 4]),
            // A heartbeat: nothing changed.
            (delta(7, 3, &[]), OK, [0, 2, 4]),
        ]);
    }

    #[test]
    fn a_skipped_message_puts_the_receiver_behind_until_the_next_full_table() {
        run(vec![
            (full(7, 0, (0, 1), &[("x", 1), ("y", 1)]), NEW, [1, 1, 0]),
            // seq 1 (y withdrawn) was lost: the changes that came are applied anyway.
            (delta(7, 2, &[("z", 3)]), BEHIND, [1, 1, 3]),
            (delta(7, 3, &[]), BEHIND, [1, 1, 3]),
            // The table asked for: y, which it no longer names, is dropped.
            (full(7, 4, (0, 1), &[("x", 1), ("z", 3)]), OK, [1, 0, 3]),
        ]);
    }

    #[test]
    fn changes_before_the_table_and_a_part_out_of_its_run_are_behind() {
        run(vec![
            // Heard first mid-stream (this replica started after a's table went out).
            (delta(7, 40, &[("x", 2)]), NEW_BEHIND, [2, 0, 0]),
            (full(7, 41, (0, 3), &[("x", 2)]), OK, [2, 0, 0]),
            // Part 1 was lost.
            (full(7, 43, (2, 3), &[("y", 1)]), BEHIND, [2, 1, 0]),
            // Changes after an unfinished table.
            (full(7, 44, (0, 2), &[("x", 2)]), OK, [2, 1, 0]),
            (delta(7, 45, &[("z", 1)]), BEHIND, [2, 1, 1]),
            (full(7, 46, (0, 2), &[("z", 1)]), OK, [2, 1, 1]),
            (full(7, 47, (1, 2), &[]), OK, [0, 0, 1]),
        ]);
    }

    #[test]
    fn a_new_incarnation_drops_the_old_ones_records() {
        run(vec![
            (full(7, 0, (0, 1), &[("x", 1), ("y", 1)]), NEW, [1, 1, 0]),
            (delta(7, 1, &[("z", 1)]), OK, [1, 1, 1]),
            // Restarted (same name): its old references are gone with the old process.
            (full(9, 0, (0, 1), &[("y", 5)]), NEW, [0, 5, 0]),
            (delta(9, 1, &[]), OK, [0, 5, 0]),
        ]);
    }

    #[test]
    fn a_new_incarnation_heard_first_by_its_changes_is_asked_for_its_table() {
        // Found in review: the restarted replica's first message (its table) was lost,
        // and the receiver, still "synced" with the old incarnation, took its changes
        // for the whole story.
        run(vec![
            (full(7, 0, (0, 1), &[("x", 1), ("y", 1)]), NEW, [1, 1, 0]),
            (delta(9, 1, &[("z", 2)]), NEW_BEHIND, [0, 0, 2]),
            (delta(9, 2, &[]), BEHIND, [0, 0, 2]),
            (full(9, 3, (0, 1), &[("y", 3), ("z", 2)]), OK, [0, 3, 2]),
        ]);
        // Nor does an old incarnation's unfinished table carry over into the new one's.
        run(vec![
            (full(7, 0, (0, 2), &[("x", 1)]), NEW, [1, 0, 0]),
            (full(9, 1, (1, 2), &[("y", 1)]), NEW_BEHIND, [0, 1, 0]),
        ]);
    }

    #[test]
    fn forgetting_a_peer_makes_it_new_again() {
        let (mut peers, mut table) = (Peers::default(), Interest::default());
        assert_eq!(
            peers.receive(&mut table, "a", full(1, 0, (0, 1), &[("x", 1)]), 0),
            NEW
        );
        assert_eq!(
            peers.receive(&mut table, "b", delta(1, 5, &[]), 0),
            NEW_BEHIND
        );
        assert_eq!(peers.behind().collect::<Vec<_>>(), ["b"]);
        assert_eq!(table.expire(TTL + 1, TTL).len(), 2);
        peers.forget("a");
        assert_eq!(
            peers.receive(&mut table, "a", delta(1, 1, &[]), TTL + 1),
            NEW_BEHIND
        );
        // Covered names travel beside references and are applied the same way.
        let covered = Batch {
            covered: vec![("c".to_string(), 2)],
            ..full(1, 2, (0, 1), &[])
        };
        assert_eq!(peers.receive(&mut table, "a", covered, TTL + 1), OK);
        assert_eq!(table.total(Kind::Covered, "c", TTL + 1, TTL), 2);
    }
}
