//! Admission of watches: a cap per user and in total, so one client (or a storm of
//! reconnects) cannot exhaust the replica. Past a cap the answer is 429 with
//! `Retry-After`, instead of queueing. Each open watch holds a [`WatchPermit`]; dropping it
//! (when the watcher stops) frees the slot.

use kcache_actors::core::go_quote::go_quote;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::status::ApiError;

/// Watches refused with 429, by `reason` (`replica_limit`, `user_limit`).
pub const WATCHES_REJECTED: &str = "kcache_watches_rejected_total";

/// Describes the metric and registers it at zero for each reason, so an alert on refused
/// watches sees the first.
pub fn describe() {
    metrics::describe_counter!(
        WATCHES_REJECTED,
        "Watches refused with 429 by server.max_watches (replica_limit) or server.max_watches_per_user (user_limit)."
    );
    for reason in ["replica_limit", "user_limit"] {
        metrics::counter!(WATCHES_REJECTED, "reason" => reason).increment(0);
    }
}

#[derive(Default)]
struct Counts {
    total: usize,
    /// By user; each permit shares its user's name with this map (no copy per watch).
    per_user: HashMap<Arc<str>, usize>,
}

pub struct WatchLimits {
    max_total: usize,
    max_per_user: usize,
    // A std lock held for a few instructions, never across an await.
    counts: Arc<Mutex<Counts>>,
}

/// One admitted watch.
pub struct WatchPermit {
    user: Arc<str>,
    counts: Arc<Mutex<Counts>>,
}

impl Drop for WatchPermit {
    fn drop(&mut self) {
        if let Ok(mut c) = self.counts.lock() {
            c.total = c.total.saturating_sub(1);
            if let Some(n) = c.per_user.get_mut(&*self.user) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    c.per_user.remove(&*self.user);
                }
            }
        }
    }
}

/// The API server's 429: `TooManyRequests`, retry after 1 s (header and details).
pub fn too_many_requests(what: impl Into<String>) -> ApiError {
    let mut e = ApiError::new(429, "TooManyRequests", what);
    e.retry_after = Some(1);
    e.details = Some(serde_json::json!({"retryAfterSeconds": 1}));
    e
}

impl WatchLimits {
    /// 0 means no cap.
    pub fn new(max_total: usize, max_per_user: usize) -> Self {
        WatchLimits {
            max_total,
            max_per_user,
            counts: Arc::default(),
        }
    }

    pub fn admit(&self, user: &str) -> Result<WatchPermit, ApiError> {
        let mut c = self
            .counts
            .lock()
            .map_err(|_| ApiError::service_unavailable("watch admission unavailable"))?;
        let mine = c.per_user.get(user).copied().unwrap_or(0);
        let refuse = too_many_requests;
        if self.max_total > 0 && c.total >= self.max_total {
            metrics::counter!(WATCHES_REJECTED, "reason" => "replica_limit").increment(1);
            return Err(refuse(format!(
                "too many watches on this kcache replica (limit {})",
                self.max_total
            )));
        }
        if self.max_per_user > 0 && mine >= self.max_per_user {
            metrics::counter!(WATCHES_REJECTED, "reason" => "user_limit").increment(1);
            return Err(refuse(format!(
                "too many watches for user {} (limit {})",
                go_quote(user),
                self.max_per_user
            )));
        }
        c.total += 1;
        let user = match c.per_user.get_key_value(user) {
            Some((name, _)) => name.clone(),
            None => Arc::from(user),
        };
        *c.per_user.entry(user.clone()).or_default() += 1;
        Ok(WatchPermit {
            user,
            counts: self.counts.clone(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caps_per_user_and_total_and_frees_on_drop() {
        let l = WatchLimits::new(3, 2);
        let a1 = l.admit("a").expect("a1");
        let _a2 = l.admit("a").expect("a2");
        let e = l.admit("a").err().expect("a3 refused");
        assert_eq!((e.code, e.retry_after), (429, Some(1)));
        let _b1 = l.admit("b").expect("b1");
        assert_eq!(l.admit("c").err().expect("total cap").code, 429);
        drop(a1);
        let _c1 = l.admit("c").expect("slot freed");
    }

    #[test]
    fn zero_means_unlimited() {
        let l = WatchLimits::new(0, 0);
        let permits: Vec<_> = (0..1000).map(|_| l.admit("u").expect("admitted")).collect();
        assert_eq!(permits.len(), 1000);
    }
}
