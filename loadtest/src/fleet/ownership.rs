//! Who owns which key, and how ownership changed: each replica's `/debug/keys` and its
//! `kcache_fleet_ownership_changes_total`, summed over the fleet across restarts (a killed
//! replica's counters as last read before its kill).

use std::time::Duration;

use serde_json::{json, Value};

use super::replica::{alive, debug_keys, Replica};
use crate::probe::{scrape, sum_where};

/// The keys a replica's `/debug/keys` says it owns.
pub fn owned_keys(keys: &Value) -> Vec<String> {
    keys["keys"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|k| k["role"].as_str() == Some("owner"))
        .filter_map(|k| k["key"].as_str().map(str::to_string))
        .collect()
}

/// The replicas whose `/debug/keys` say they own `target`, and what each owns.
pub async fn ownership(
    replicas: &[Replica],
    token: &str,
    target: &str,
) -> (Vec<usize>, Vec<Vec<String>>) {
    let mut owners = Vec::new();
    let mut owned = Vec::new();
    for (r, rep) in replicas.iter().enumerate() {
        let keys = owned_keys(&debug_keys(&rep.client, &rep.url, token).await);
        if keys.iter().any(|k| k == target) {
            owners.push(r);
        }
        owned.push(keys);
    }
    (owners, owned)
}

/// `kcache_fleet_ownership_changes_total` by `change`.
pub const CHANGES: [&str; 4] = ["acquired", "taken-over", "lost", "handed-over"];

pub type Changes = [f64; 4];

pub async fn changes(http: &reqwest::Client, base: &str, token: &str) -> Option<Changes> {
    for attempt in 0..5 {
        if attempt > 0 {
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        if let Some(text) = scrape(http, base, token).await {
            let mut c = [0.0; 4];
            for (slot, change) in c.iter_mut().zip(CHANGES) {
                *slot = sum_where(
                    &text,
                    "kcache_fleet_ownership_changes_total",
                    &[("change", change)],
                );
            }
            return Some(c);
        }
    }
    None
}

pub fn add(a: Changes, b: Changes) -> Changes {
    [a[0] + b[0], a[1] + b[1], a[2] + b[2], a[3] + b[3]]
}

pub fn sub(a: Changes, b: Changes) -> Changes {
    [a[0] - b[0], a[1] - b[1], a[2] - b[2], a[3] - b[3]]
}

pub fn changes_json(c: Changes) -> Value {
    json!({"acquired": c[0], "taken_over": c[1], "lost": c[2], "handed_over": c[3]})
}

/// Ownership counters of the whole fleet across restarts: each replica's counters as
/// last read, plus what its killed predecessors had counted when last read before their
/// kill.
pub struct Ledger {
    banked: Vec<Changes>,
    last: Vec<Changes>,
    pub scrape_failures: usize,
}

impl Ledger {
    pub fn new(replicas: usize) -> Ledger {
        Ledger {
            banked: vec![[0.0; 4]; replicas],
            last: vec![[0.0; 4]; replicas],
            scrape_failures: 0,
        }
    }

    pub async fn refresh(&mut self, replicas: &[Replica], token: &str, which: &[usize]) {
        for &r in which {
            if !alive(replicas[r].pid) {
                continue;
            }
            match changes(&replicas[r].client, &replicas[r].url, token).await {
                Some(c) => self.last[r] = c,
                None => self.scrape_failures += 1,
            }
        }
    }

    pub fn killed(&mut self, r: usize) {
        self.banked[r] = add(self.banked[r], self.last[r]);
        self.last[r] = [0.0; 4];
    }

    pub fn total(&self) -> Changes {
        self.banked
            .iter()
            .chain(self.last.iter())
            .fold([0.0; 4], |a, c| add(a, *c))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owned_keys_are_the_keys_whose_role_is_owner() {
        let keys = json!({"keys": [
            {"key": "/api/v1/namespaces/a/secrets/s0", "role": "owner"},
            {"key": "/api/v1/namespaces/a/secrets/s1", "role": "mirror"},
            {"key": "/api/v1/namespaces/a/secrets/s2"},
            {"key": "/api/v1/namespaces/a/secrets/s3", "role": "owner"},
        ]});
        assert_eq!(
            owned_keys(&keys),
            [
                "/api/v1/namespaces/a/secrets/s0",
                "/api/v1/namespaces/a/secrets/s3"
            ]
        );
        assert!(owned_keys(&Value::Null).is_empty());
    }

    #[test]
    fn the_ledger_keeps_a_killed_replicas_counts() {
        let mut l = Ledger::new(2);
        l.last = vec![[3.0, 1.0, 0.0, 0.0], [2.0, 0.0, 1.0, 0.0]];
        assert_eq!(l.total(), [5.0, 1.0, 1.0, 0.0]);
        // Replica 0 is killed; its successor starts counting from zero.
        l.killed(0);
        assert_eq!(l.total(), [5.0, 1.0, 1.0, 0.0]);
        l.last[0] = [1.0, 0.0, 0.0, 0.0];
        assert_eq!(l.total(), [6.0, 1.0, 1.0, 0.0]);
        assert_eq!(sub(l.total(), [5.0, 1.0, 1.0, 0.0]), [1.0, 0.0, 0.0, 0.0]);
        assert_eq!(
            changes_json(add([1.0; 4], [0.0; 4]))["taken_over"],
            json!(1.0)
        );
    }
}
