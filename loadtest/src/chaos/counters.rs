//! kcache's own counters of what the soak made it do (coalescings, watchers moved, covered
//! requests), summed over the replicas across their restarts: each replica's `/metrics`
//! is read every couple of seconds, and a counter lower than its last reading means the
//! replica was restarted (kill -9) and counts from zero again. What a replica counted
//! between its last reading and its death is missed, so the totals are lower bounds.
//! They say whether the faults met the path under test at all: a soak that never
//! coalesced judged nothing of coalescing (`--require-coalescing`).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::probe::{scrape, sum_samples};

/// The counters read, by their metric name.
pub const COUNTERS: [&str; 4] = [
    "kcache_coalescings_total",
    "kcache_coalesce_splits_total",
    "kcache_coalesce_moved_watchers_total",
    "kcache_covered_requests_total",
];

/// How often every replica is read.
const EVERY: Duration = Duration::from_secs(2);

/// One replica's counters: the last reading and the total before it.
#[derive(Debug, Default, Clone)]
struct Replica {
    last: BTreeMap<&'static str, f64>,
    total: BTreeMap<&'static str, f64>,
}

impl Replica {
    /// Takes a reading: what grew since the last one is added; a counter that went down
    /// started again from zero, so all of it is new.
    fn read(&mut self, now: &BTreeMap<&'static str, f64>) {
        for (name, v) in now {
            let last = self.last.get(name).copied().unwrap_or(0.0);
            let grew = if *v >= last { v - last } else { *v };
            *self.total.entry(name).or_default() += grew;
            self.last.insert(name, *v);
        }
    }
}

/// Reads the replicas in the background until stopped.
pub struct Counters {
    replicas: Arc<Mutex<Vec<Replica>>>,
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl Counters {
    /// `http` should time out its requests: a paused replica accepts the connection and
    /// never answers, and the next reading must not wait for it.
    pub fn start(http: reqwest::Client, urls: Vec<String>, token: String) -> Counters {
        let replicas = Arc::new(Mutex::new(vec![Replica::default(); urls.len()]));
        let stop = Arc::new(AtomicBool::new(false));
        let (r, s) = (replicas.clone(), stop.clone());
        let task = tokio::spawn(async move {
            while !s.load(Ordering::Relaxed) {
                for (i, url) in urls.iter().enumerate() {
                    // A replica that is down or paused is read next time.
                    let Some(text) = scrape(&http, url, &token).await else {
                        continue;
                    };
                    let now = COUNTERS
                        .iter()
                        .map(|n| (*n, sum_samples(&text, n).unwrap_or(0.0)))
                        .collect();
                    if let Ok(mut r) = r.lock() {
                        r[i].read(&now);
                    }
                }
                tokio::time::sleep(EVERY).await;
            }
        });
        Counters {
            replicas,
            stop,
            task,
        }
    }

    /// A last reading of every replica, then the totals over all of them.
    pub async fn finish(self) -> BTreeMap<&'static str, f64> {
        self.stop.store(true, Ordering::Relaxed);
        let _ = tokio::time::timeout(EVERY * 10, self.task).await;
        let mut sum = BTreeMap::new();
        if let Ok(r) = self.replicas.lock() {
            for rep in r.iter() {
                for (name, v) in &rep.total {
                    *sum.entry(*name).or_default() += v;
                }
            }
        }
        sum
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_restart_keeps_what_was_counted_before_it() {
        let mut r = Replica::default();
        let at = |v: f64| BTreeMap::from([("c", v)]);
        r.read(&at(3.0));
        r.read(&at(5.0));
        // kill -9: the new process counts from zero.
        r.read(&at(1.0));
        r.read(&at(4.0));
        // 5 before the restart, 4 after it.
        assert_eq!(r.total["c"], 9.0);
    }
}
