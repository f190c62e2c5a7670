//! SplitMix64 for the generated (class) tests: the same sequence for a seed on every
//! platform and crate version, so a printed seed replays a run.

/// SplitMix64's output function.
pub fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[derive(Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    /// Case `index`'s own stream: it does not depend on how many cases came before, so a
    /// single case regenerates alone.
    pub fn for_case(seed: u64, index: u64) -> Rng {
        Rng(mix(seed ^ mix(index.wrapping_add(1))))
    }

    /// The seed in `var` if set (a replay), else a fresh one; printed to stderr either way
    /// (libtest shows it with a failure) with the variable that replays it.
    pub fn seed_from_env(var: &str, class: &str) -> u64 {
        let seed = match std::env::var(var) {
            Ok(v) => v
                .trim()
                .parse()
                .unwrap_or_else(|_| panic!("{var}={v:?} is not a number")),
            Err(_) => std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64),
        };
        eprintln!("{class}: {var}={seed}");
        seed
    }

    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        mix(self.0)
    }

    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }

    pub fn chance(&mut self, percent: usize) -> bool {
        self.below(100) < percent
    }

    pub fn pick<'a, T: ?Sized>(&mut self, items: &[&'a T]) -> &'a T {
        items[self.below(items.len())]
    }
}
