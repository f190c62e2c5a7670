//! The dispatch time budget of the API server's cacher (`time_budget.go`), as plain data:
//! how long a live event may wait for room in a slow client's buffer before that watch is
//! closed. One budget per resource, shared by all its watchers: it refills at 50 ms per
//! second up to 100 ms, a wait takes everything available and gives back what it did not
//! use. A client that falls behind for a moment is waited for; clients that do not read
//! drain the budget and are closed at once, so they cannot slow the others down.
//!
//! Times are microseconds on the caller's clock.

/// The budget a second of time adds (the cacher's `refreshPerSecond`).
pub const REFILL_PER_SECOND_US: u64 = 50_000;
/// The most the budget holds (the cacher's `maxBudget`).
pub const MAX_US: u64 = 100_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimeBudget {
    available_us: u64,
    last_us: u64,
}

impl TimeBudget {
    /// An empty budget at `now_us` (the cacher's starts at zero too).
    pub fn new(now_us: u64) -> Self {
        TimeBudget {
            available_us: 0,
            last_us: now_us,
        }
    }

    /// A budget holding `available_us` at `now_us` (at most the maximum): tests start
    /// from a known budget.
    pub fn with_available(now_us: u64, available_us: u64) -> Self {
        TimeBudget {
            available_us: available_us.min(MAX_US),
            last_us: now_us,
        }
    }

    /// Refills for the time since the last access, then takes all that is available.
    pub fn take(&mut self, now_us: u64) -> u64 {
        let elapsed = now_us.saturating_sub(self.last_us);
        let refill = (elapsed as u128 * REFILL_PER_SECOND_US as u128 / 1_000_000) as u64;
        self.available_us = self.available_us.saturating_add(refill).min(MAX_US);
        // A clock that went back adds nothing, and does not move the last access back.
        self.last_us = self.last_us.max(now_us);
        std::mem::take(&mut self.available_us)
    }

    /// Gives back the part of a wait that was not used (never above the maximum).
    pub fn give_back(&mut self, unused_us: u64) {
        self.available_us = self.available_us.saturating_add(unused_us).min(MAX_US);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Clone, Copy)]
    enum Op {
        Take(u64),
        GiveBack(u64),
    }

    #[test]
    fn table() {
        use Op::*;
        // (name, operations at times in µs, what each take returns)
        let cases: Vec<(&str, Vec<Op>, Vec<u64>)> = vec![
            ("empty at first", vec![Take(0)], vec![0]),
            ("50 ms per second", vec![Take(1_000_000)], vec![50_000]),
            (
                "a take empties it",
                vec![Take(1_000_000), Take(1_000_000)],
                vec![50_000, 0],
            ),
            ("at most 100 ms", vec![Take(10_000_000)], vec![100_000]),
            (
                "refills between takes",
                vec![Take(1_000_000), Take(1_500_000)],
                vec![50_000, 25_000],
            ),
            (
                "unused time comes back",
                vec![Take(1_000_000), GiveBack(30_000), Take(1_000_000)],
                vec![50_000, 30_000],
            ),
            (
                "giving back never exceeds the maximum",
                vec![
                    Take(2_000_000),
                    GiveBack(100_000),
                    GiveBack(100_000),
                    Take(2_000_000),
                ],
                vec![100_000, 100_000],
            ),
            (
                "a clock going back adds nothing",
                vec![Take(1_000_000), Take(500_000), Take(1_000_000)],
                vec![50_000, 0, 0],
            ),
        ];
        for (name, ops, want) in cases {
            let mut b = TimeBudget::new(0);
            let mut got = Vec::new();
            for op in ops {
                match op {
                    Take(now) => got.push(b.take(now)),
                    GiveBack(us) => b.give_back(us),
                }
            }
            assert_eq!(got, want, "{name}");
        }
    }
}
