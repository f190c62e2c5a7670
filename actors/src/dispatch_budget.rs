//! Each resource's dispatch budget (`core::budget`, the cacher's `dispatchTimeoutBudget`),
//! shared by the resource's watchers across the HTTP workers' threads.
//!
//! Shared state beside the messages, on purpose: a watcher whose client's buffer is full
//! decides at once how long it may wait for room (the cacher holds its dispatch that
//! long); a message round trip to an actor owning the budget would cost more than many of
//! the waits it decides, while this mutex is held for a few arithmetic operations.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::core::budget::TimeBudget;
use crate::core::key::ResourceType;

/// One resource's budget.
#[derive(Debug)]
pub struct DispatchBudget {
    epoch: Instant,
    budget: Mutex<TimeBudget>,
}

impl Default for DispatchBudget {
    fn default() -> Self {
        DispatchBudget {
            epoch: Instant::now(),
            budget: Mutex::new(TimeBudget::new(0)),
        }
    }
}

impl DispatchBudget {
    /// A budget holding `available` now (a new one is empty, as the cacher's).
    pub fn with_available(available: Duration) -> Self {
        DispatchBudget {
            epoch: Instant::now(),
            budget: Mutex::new(TimeBudget::with_available(0, available.as_micros() as u64)),
        }
    }

    fn now_us(&self) -> u64 {
        self.epoch.elapsed().as_micros() as u64
    }

    /// Everything available now: how long a blocked event may wait.
    pub fn take(&self) -> Duration {
        let now = self.now_us();
        let mut b = self.budget.lock().unwrap_or_else(|e| e.into_inner());
        Duration::from_micros(b.take(now))
    }

    /// The part of a wait that was not needed.
    pub fn give_back(&self, unused: Duration) {
        let mut b = self.budget.lock().unwrap_or_else(|e| e.into_inner());
        b.give_back(unused.as_micros() as u64);
    }
}

/// The budgets by resource (group and plural name), made on first use.
#[derive(Debug, Default)]
pub struct DispatchBudgets {
    by_resource: Mutex<HashMap<(String, String), Arc<DispatchBudget>>>,
}

impl DispatchBudgets {
    pub fn of(&self, resource: &ResourceType) -> Arc<DispatchBudget> {
        let mut map = self.by_resource.lock().unwrap_or_else(|e| e.into_inner());
        map.entry((resource.group.clone(), resource.resource.clone()))
            .or_default()
            .clone()
    }
}
