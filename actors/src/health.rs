//! Whether this replica can reach the API server: what its upstream reads saw, kept
//! current by a light probe (`GET /version`) so a replica with no keys knows too.
//!
//! Readiness and the fleet use it: a replica whose upstream has failed for longer than
//! `cutoff` can serve nothing fresh of its own, so it hands its keys to a peer that can
//! (`core::role`) and `/readyz` says so unless NATS still brings it a healthy owner's events.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::metrics as m;
use crate::upstream_pool::UpstreamClients;

/// `failing_since_ms` when nothing is failing.
const NONE: u64 = u64::MAX;

/// Shared beside the messages, on purpose: every upstream read (on every arbiter),
/// `/readyz` and each key's fleet task report to it or read it on their own hot paths;
/// one atomic answers all of them without a mailbox any of them could wait on.
#[derive(Debug)]
pub struct UpstreamHealth {
    started: Instant,
    cutoff: Duration,
    /// Since when (ms after `started`) every upstream request failed; `NONE` while the last
    /// one worked.
    failing_since_ms: AtomicU64,
}

impl UpstreamHealth {
    pub fn new(cutoff: Duration) -> Self {
        UpstreamHealth {
            started: Instant::now(),
            cutoff,
            failing_since_ms: AtomicU64::new(NONE),
        }
    }

    fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    /// An upstream request worked.
    pub fn ok(&self) {
        if self.failing_since_ms.swap(NONE, Ordering::Relaxed) != NONE {
            tracing::info!("upstream API server reachable again");
        }
        metrics::gauge!(m::UPSTREAM_CUT_OFF).set(0.0);
    }

    /// An upstream request failed.
    pub fn failed(&self) {
        let _ = self.failing_since_ms.compare_exchange(
            NONE,
            self.now_ms(),
            Ordering::Relaxed,
            Ordering::Relaxed,
        );
        if self.cut_off() {
            metrics::gauge!(m::UPSTREAM_CUT_OFF).set(1.0);
        }
    }

    /// How long every upstream request has been failing, if the last one failed.
    pub fn failing_for(&self) -> Option<Duration> {
        match self.failing_since_ms.load(Ordering::Relaxed) {
            NONE => None,
            since => Some(Duration::from_millis(self.now_ms().saturating_sub(since))),
        }
    }

    /// The upstream has failed for at least the cutoff.
    pub fn cut_off(&self) -> bool {
        self.failing_for().is_some_and(|d| d >= self.cutoff)
    }

    /// Probes the API server every `interval` for as long as the runtime lives.
    pub fn spawn_probe(self: &Arc<Self>, clients: Arc<UpstreamClients>, interval: Duration) {
        let health = self.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(interval);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let conn = clients.checkout();
                let probe = conn.client().apiserver_version();
                match tokio::time::timeout(interval.max(Duration::from_secs(2)), probe).await {
                    Ok(Ok(_)) => health.ok(),
                    Ok(Err(error)) => {
                        tracing::debug!(%error, "upstream probe failed");
                        health.failed();
                    }
                    Err(_) => {
                        tracing::debug!("upstream probe timed out");
                        health.failed();
                    }
                }
                // The cutoff passes between failures too.
                metrics::gauge!(m::UPSTREAM_CUT_OFF).set(if health.cut_off() { 1.0 } else { 0.0 });
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cut_off_only_after_failing_for_the_cutoff_and_ok_resets() {
        let h = UpstreamHealth::new(Duration::from_millis(30));
        assert!(!h.cut_off());
        assert_eq!(h.failing_for(), None);
        h.failed();
        assert!(!h.cut_off());
        std::thread::sleep(Duration::from_millis(40));
        // A later failure does not move the start.
        h.failed();
        assert!(h.cut_off());
        h.ok();
        assert!(!h.cut_off());
        assert_eq!(h.failing_for(), None);
    }
}
