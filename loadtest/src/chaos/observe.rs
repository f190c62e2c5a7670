//! What one client saw, in order: its lists, the watch requests it made (and from which
//! resourceVersion), its events, and the 410s and errors it met. The judge reads this
//! log after the run; every entry carries the time since the soak began, so an
//! anomaly can be placed among the faults and in the servers' logs.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::Instant;

use serde::Serialize;

static EPOCH: OnceLock<Instant> = OnceLock::new();

/// Milliseconds since the soak began (the first call).
pub fn now_ms() -> u64 {
    EPOCH.get_or_init(Instant::now).elapsed().as_millis() as u64
}

/// An event's type as the client reports it. kube-rs's watcher folds `ADDED` and
/// `MODIFIED` into one `Apply`, so a reflector cannot tell them apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum SeenKind {
    Added,
    Modified,
    Applied,
    Deleted,
}

#[derive(Clone, Debug, Serialize)]
#[serde(tag = "obs", rename_all = "snake_case")]
pub enum Obs {
    /// A complete list: (name, resourceVersion) of each item. `rv` is the list's
    /// resourceVersion when the client knows it; kube-rs's watcher does not say, and then
    /// it is the `from` of the next [`Obs::Watch`] (the watcher watches from the list's
    /// resourceVersion).
    Listed {
        at_ms: u64,
        rv: Option<u64>,
        items: Vec<(String, u64)>,
    },
    /// A watch request was answered (`status`) by `replica`, starting at `from`.
    Watch {
        at_ms: u64,
        from: u64,
        replica: String,
        status: u16,
    },
    Event {
        at_ms: u64,
        kind: SeenKind,
        name: String,
        rv: u64,
    },
    /// A 410 Gone: the client must relist.
    Gone { at_ms: u64, how: String },
    /// A broken stream or a failed request (the client retries).
    Error { at_ms: u64, what: String },
}

/// A client's log, bounded: past `cap` entries it stops recording and says so (the judge
/// then refuses to judge that client rather than judge half a story).
pub struct Log {
    entries: Mutex<Vec<Obs>>,
    cap: usize,
    overflowed: AtomicBool,
}

impl Log {
    pub fn new(cap: usize) -> Log {
        Log {
            entries: Mutex::new(Vec::new()),
            cap,
            overflowed: AtomicBool::new(false),
        }
    }

    pub fn push(&self, obs: Obs) {
        let Ok(mut e) = self.entries.lock() else {
            return;
        };
        if e.len() >= self.cap {
            self.overflowed.store(true, Ordering::Relaxed);
            return;
        }
        e.push(obs);
    }

    pub fn overflowed(&self) -> bool {
        self.overflowed.load(Ordering::Relaxed)
    }

    pub fn snapshot(&self) -> Vec<Obs> {
        self.entries.lock().map(|e| e.clone()).unwrap_or_default()
    }

    /// Whether the client has completed at least one list.
    pub fn has_listed(&self) -> bool {
        self.entries
            .lock()
            .map(|e| e.iter().any(|o| matches!(o, Obs::Listed { .. })))
            .unwrap_or(false)
    }
}
