//! The faults: what they are, the seeded schedule that picks them, and how each is done.
//!
//! The schedule is a sequence drawn from `--seed` alone: the n-th fault, its target and
//! how long it holds, and the pause before it, are the same in every run with that seed
//! (how many fit in `--duration` depends on how long each took). Kinds are drawn from a
//! shuffled bag holding each kind once, refilled when empty, so even a 60 s run meets
//! most kinds. Faults that take something down run one at a time and put it back before
//! the next, so the fleet never loses more than one replica, NATS node or API server at
//! once (a NATS cluster of three keeps its quorum); a slow client runs alongside.

use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use serde_json::Value;

use super::clients::Stall;
use super::etcd::Etcd;
use super::observe::now_ms;
use super::procs::{wait_ok, wait_tcp, Proc};
use super::rng::Rng;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// kill -9 a kcache replica, restart it after a while.
    KillReplica,
    /// kill -9 a NATS node, restart it (same store) after a while.
    KillNats,
    /// SIGSTOP the owner of a key past its lease (5 s), then SIGCONT.
    PauseOwner,
    /// kill -9 the API server and start it again (etcd stays up).
    RestartApiserver,
    /// Compact etcd to its current revision.
    CompactEtcd,
    /// A client stops reading its watch for a while.
    SlowClient,
}

impl Kind {
    pub const ALL: [Kind; 6] = [
        Kind::KillReplica,
        Kind::KillNats,
        Kind::PauseOwner,
        Kind::RestartApiserver,
        Kind::CompactEtcd,
        Kind::SlowClient,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Kind::KillReplica => "kill_replica",
            Kind::KillNats => "kill_nats",
            Kind::PauseOwner => "pause_owner",
            Kind::RestartApiserver => "restart_apiserver",
            Kind::CompactEtcd => "compact_etcd",
            Kind::SlowClient => "slow_client",
        }
    }
}

/// One planned fault. `target` indexes the replicas, NATS nodes, keys (0: the
/// namespace's, i + 1: object `ci`'s) or clients, by kind; `hold_ms` is how long the
/// thing stays down, paused or unread.
#[derive(Clone, Debug, Serialize)]
pub struct Fault {
    pub kind: Kind,
    pub target: usize,
    pub hold_ms: u64,
}

/// The sizes the schedule draws targets from.
#[derive(Clone, Copy, Debug)]
pub struct Sizes {
    pub replicas: usize,
    pub nats: usize,
    pub objects: usize,
    pub clients: usize,
}

pub struct Schedule {
    rng: Rng,
    bag: Vec<Kind>,
    sizes: Sizes,
}

impl Schedule {
    pub fn new(rng: Rng, sizes: Sizes) -> Schedule {
        Schedule {
            rng,
            bag: Vec::new(),
            sizes,
        }
    }

    /// The pause before the next fault (ms) and the fault.
    pub fn next_fault(&mut self) -> (u64, Fault) {
        if self.bag.is_empty() {
            self.bag = Kind::ALL.to_vec();
            self.rng.shuffle(&mut self.bag);
        }
        let kind = self.bag.pop().unwrap_or(Kind::CompactEtcd);
        let gap = self.rng.range(2_000, 6_000);
        let s = self.sizes;
        let (target, hold_ms) = match kind {
            Kind::KillReplica => (
                self.rng.below(s.replicas.max(1)),
                self.rng.range(1_000, 5_000),
            ),
            Kind::KillNats => (self.rng.below(s.nats.max(1)), self.rng.range(2_000, 8_000)),
            // Past the 5 s lease and the 3 s of silence before a mirror claims it.
            Kind::PauseOwner => (self.rng.below(s.objects + 1), self.rng.range(8_000, 12_000)),
            Kind::RestartApiserver | Kind::CompactEtcd => (0, 0),
            Kind::SlowClient => (
                self.rng.below(s.clients.max(1)),
                self.rng.range(10_000, 25_000),
            ),
        };
        (
            gap,
            Fault {
                kind,
                target,
                hold_ms,
            },
        )
    }
}

/// A fault as it was carried out.
#[derive(Clone, Debug, Serialize)]
pub struct Done {
    pub n: usize,
    pub kind: Kind,
    pub start_ms: u64,
    pub end_ms: u64,
    pub what: String,
    /// False when it could not be carried out as planned (said in `what`).
    pub ok: bool,
}

/// A kcache replica under the soak's control.
pub struct Replica {
    pub proc: Proc,
    pub url: String,
}

/// A NATS node under the soak's control.
pub struct NatsNode {
    pub proc: Proc,
    pub port: u16,
}

/// Everything a fault acts on.
pub struct Env {
    pub replicas: Vec<Replica>,
    pub nats: Vec<NatsNode>,
    pub http: reqwest::Client,
    pub token: String,
    pub apiserver: String,
    pub restart_apiserver: String,
    pub etcd: Etcd,
    pub namespace: String,
    /// (label, stall switch) of each client a slow-client fault may pick.
    pub stalls: Vec<(String, Arc<Stall>)>,
}

/// The `/debug/keys` key of schedule key index `i`.
pub fn key_path(ns: &str, i: usize) -> String {
    match i {
        0 => format!("/api/v1/namespaces/{ns}/configmaps"),
        i => format!(
            "/api/v1/namespaces/{ns}/configmaps/{}",
            super::writer::object_name(i - 1)
        ),
    }
}

impl Env {
    pub async fn replica_ready(&self, i: usize, timeout: Duration) -> bool {
        let url = format!("{}/readyz", self.replicas[i].url);
        wait_ok(&self.http, &url, &self.token, timeout).await
    }

    pub async fn apiserver_ready(&self, timeout: Duration) -> bool {
        let url = format!("{}/readyz", self.apiserver);
        wait_ok(&self.http, &url, &self.token, timeout).await
    }

    async fn debug_keys(&self, i: usize) -> Value {
        let r = self
            .http
            .get(format!("{}/debug/keys", self.replicas[i].url))
            .bearer_auth(&self.token)
            .timeout(Duration::from_secs(3))
            .send()
            .await;
        match r {
            Ok(r) => r.json().await.unwrap_or(Value::Null),
            Err(_) => Value::Null,
        }
    }

    /// The replica that says it owns `key` (the highest epoch if two do), else one that
    /// owns any key of the namespace: (replica, key).
    async fn find_owner(&self, key: &str) -> Option<(usize, String)> {
        let mut best: Option<(u64, usize, String)> = None;
        let mut any: Option<(usize, String)> = None;
        let prefix = key_path(&self.namespace, 0);
        for i in 0..self.replicas.len() {
            let keys = self.debug_keys(i).await;
            for k in keys["keys"].as_array().into_iter().flatten() {
                if k["role"].as_str() != Some("owner") {
                    continue;
                }
                let Some(name) = k["key"].as_str() else {
                    continue;
                };
                let epoch = k["epoch"].as_u64().unwrap_or(0);
                if name == key && best.as_ref().is_none_or(|(e, _, _)| epoch > *e) {
                    best = Some((epoch, i, name.to_string()));
                }
                if any.is_none() && name.starts_with(&prefix) {
                    any = Some((i, name.to_string()));
                }
            }
        }
        best.map(|(_, i, k)| (i, k)).or(any)
    }

    /// Carries out `f`, the `n`-th fault; returns when what it took down is back.
    pub async fn inject(&mut self, n: usize, f: &Fault) -> Done {
        let start_ms = now_ms();
        let hold = Duration::from_millis(f.hold_ms);
        let (what, ok) = match f.kind {
            Kind::KillReplica => {
                let i = f.target % self.replicas.len();
                let pid = self.replicas[i].proc.pid().unwrap_or(0);
                self.replicas[i].proc.kill9();
                tokio::time::sleep(hold).await;
                let started = self.replicas[i].proc.start();
                let ready = started.is_ok() && self.replica_ready(i, Duration::from_secs(60)).await;
                (
                    format!(
                        "kill -9 {} (pid {pid}), down {} ms, restarted{}",
                        self.replicas[i].proc.name,
                        f.hold_ms,
                        if ready {
                            ", ready"
                        } else {
                            ": NOT ready in 60 s"
                        }
                    ),
                    ready,
                )
            }
            Kind::KillNats => {
                let i = f.target % self.nats.len();
                let pid = self.nats[i].proc.pid().unwrap_or(0);
                self.nats[i].proc.kill9();
                tokio::time::sleep(hold).await;
                let started = self.nats[i].proc.start();
                let up =
                    started.is_ok() && wait_tcp(self.nats[i].port, Duration::from_secs(30)).await;
                (
                    format!(
                        "kill -9 NATS {} (pid {pid}), down {} ms, restarted{}",
                        self.nats[i].proc.name,
                        f.hold_ms,
                        if up {
                            ", listening"
                        } else {
                            ": NOT listening in 30 s"
                        }
                    ),
                    up,
                )
            }
            Kind::PauseOwner => {
                let key = key_path(&self.namespace, f.target);
                match self.find_owner(&key).await {
                    Some((i, owned)) => {
                        let p = &mut self.replicas[i].proc;
                        let pid = p.pid().unwrap_or(0);
                        let paused = p.pause();
                        tokio::time::sleep(hold).await;
                        let resumed = self.replicas[i].proc.resume();
                        let stand_in = if owned == key {
                            String::new()
                        } else {
                            format!(" (no owner of {key} found; this one owned {owned})")
                        };
                        (
                            format!(
                                "SIGSTOP {} (pid {pid}), owner of {owned}, for {} ms, SIGCONT{stand_in}",
                                self.replicas[i].proc.name, f.hold_ms
                            ),
                            paused && resumed,
                        )
                    }
                    None => (
                        format!("no replica owns {key} or any key: nothing paused"),
                        false,
                    ),
                }
            }
            Kind::RestartApiserver => {
                let out = tokio::process::Command::new(&self.restart_apiserver)
                    .stdin(std::process::Stdio::null())
                    .output()
                    .await;
                let pid = out
                    .as_ref()
                    .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
                    .unwrap_or_default();
                let ran = out.is_ok_and(|o| o.status.success());
                let ready = ran && self.apiserver_ready(Duration::from_secs(120)).await;
                (
                    format!(
                        "kill -9 the API server, started again (pid {pid}){}",
                        if ready {
                            ", ready"
                        } else {
                            ": NOT ready in 120 s"
                        }
                    ),
                    ready,
                )
            }
            Kind::CompactEtcd => match self.etcd.revision().await {
                Ok(rev) => match self.etcd.compact(rev).await {
                    Ok(()) => (format!("etcd compacted at revision {rev}"), true),
                    Err(e) => (format!("compaction at {rev} failed: {e}"), false),
                },
                Err(e) => (format!("etcd revision unknown: {e}"), false),
            },
            Kind::SlowClient => {
                let i = f.target % self.stalls.len().max(1);
                match self.stalls.get(i) {
                    Some((label, stall)) => {
                        stall.until(now_ms() + f.hold_ms);
                        (format!("{label} stops reading for {} ms", f.hold_ms), true)
                    }
                    None => ("no client to slow down".into(), false),
                }
            }
        };
        Done {
            n,
            kind: f.kind,
            start_ms,
            end_ms: now_ms(),
            what,
            ok,
        }
    }

    /// Puts everything back: resumes paused replicas, starts whatever is not running,
    /// waits for readiness. Returns what it had to do.
    pub async fn heal(&mut self) -> Vec<String> {
        let mut did = Vec::new();
        for r in &mut self.replicas {
            if r.proc.paused {
                r.proc.resume();
                did.push(format!("resumed {}", r.proc.name));
            }
            if !r.proc.alive() && r.proc.start().is_ok() {
                did.push(format!("started {}", r.proc.name));
            }
        }
        for n in &mut self.nats {
            if !n.proc.alive() && n.proc.start().is_ok() {
                did.push(format!("started NATS {}", n.proc.name));
            }
        }
        for n in &self.nats {
            if !wait_tcp(n.port, Duration::from_secs(30)).await {
                did.push(format!("NATS {} not listening", n.proc.name));
            }
        }
        if !self.apiserver_ready(Duration::from_secs(120)).await {
            did.push("the API server is not ready".into());
        }
        for i in 0..self.replicas.len() {
            if !self.replica_ready(i, Duration::from_secs(60)).await {
                did.push(format!("{} not ready", self.replicas[i].proc.name));
            }
        }
        for (_, s) in &self.stalls {
            s.until(0);
        }
        did
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sizes() -> Sizes {
        Sizes {
            replicas: 3,
            nats: 3,
            objects: 40,
            clients: 100,
        }
    }

    #[test]
    fn a_seed_replays_its_schedule() {
        let mut a = Schedule::new(Rng::new(9), sizes());
        let mut b = Schedule::new(Rng::new(9), sizes());
        for _ in 0..20 {
            let (ga, fa) = a.next_fault();
            let (gb, fb) = b.next_fault();
            assert_eq!(ga, gb);
            assert_eq!(
                (fa.kind, fa.target, fa.hold_ms),
                (fb.kind, fb.target, fb.hold_ms)
            );
        }
    }

    #[test]
    fn every_kind_comes_once_per_bag() {
        let mut s = Schedule::new(Rng::new(1), sizes());
        let mut kinds: Vec<Kind> = (0..6).map(|_| s.next_fault().1.kind).collect();
        kinds.sort();
        assert_eq!(kinds, Kind::ALL.to_vec());
    }

    #[test]
    fn key_paths_match_debug_keys() {
        assert_eq!(key_path("ns", 0), "/api/v1/namespaces/ns/configmaps");
        assert_eq!(key_path("ns", 3), "/api/v1/namespaces/ns/configmaps/c2");
    }
}
