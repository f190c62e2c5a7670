//! The writer: creates, updates and deletes the namespace's ConfigMaps `c0..cN` at a
//! steady rate, straight to the API server, choosing with its own seeded generator.
//!
//! Whether a write succeeded does not matter to the judge (the truth is what etcd
//! recorded); the writer only keeps a belief of which objects exist so that most
//! operations are valid, and corrects it from 404/409 answers.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::Api;
use serde::Serialize;
use serde_json::json;

use super::rng::Rng;

pub fn object_name(i: usize) -> String {
    format!("c{i}")
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct WriterStats {
    pub creates: u64,
    pub updates: u64,
    pub deletes: u64,
    /// Refused or unanswered (the API server down, a stale belief).
    pub failed: u64,
}

pub struct Writer {
    pub api: Api<ConfigMap>,
    pub objects: usize,
    pub per_sec: f64,
    /// Bytes of filler per object, so that a stalled reader fills its flow-control window.
    pub payload: usize,
    pub rng: Rng,
}

fn filler(rng: &mut Rng, n: usize) -> String {
    const A: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    (0..n).map(|_| A[rng.below(A.len())] as char).collect()
}

fn status(e: &kube::Error) -> u16 {
    match e {
        kube::Error::Api(s) => s.code,
        _ => 0,
    }
}

impl Writer {
    /// Writes until `stop` is set.
    pub async fn run(mut self, stop: Arc<AtomicBool>) -> WriterStats {
        let mut stats = WriterStats::default();
        let mut exists = vec![false; self.objects];
        let interval = Duration::from_secs_f64(1.0 / self.per_sec.max(0.1));
        let mut tick = tokio::time::interval(interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut seq: u64 = 0;
        while !stop.load(Ordering::Relaxed) {
            tick.tick().await;
            seq += 1;
            let i = self.rng.below(self.objects);
            let name = object_name(i);
            let roll = self.rng.below(100);
            let data = json!({"seq": seq.to_string(), "pad": filler(&mut self.rng, self.payload)});
            let op = async {
                if !exists[i] {
                    let cm: ConfigMap = serde_json::from_value(json!({
                        "metadata": {"name": name}, "data": data,
                    }))
                    .unwrap_or_default();
                    match self.api.create(&PostParams::default(), &cm).await {
                        Ok(_) => (0, true),
                        Err(e) => (1, status(&e) == 409),
                    }
                } else if roll < 15 {
                    match self.api.delete(&name, &DeleteParams::default()).await {
                        Ok(_) => (2, false),
                        Err(e) => (3, status(&e) != 404),
                    }
                } else {
                    let patch = Patch::Merge(json!({"data": data}));
                    match self.api.patch(&name, &PatchParams::default(), &patch).await {
                        Ok(_) => (4, true),
                        Err(e) => (5, status(&e) != 404),
                    }
                }
            };
            match tokio::time::timeout(Duration::from_secs(10), op).await {
                Ok((code, now_exists)) => {
                    match code {
                        0 => stats.creates += 1,
                        2 => stats.deletes += 1,
                        4 => stats.updates += 1,
                        _ => stats.failed += 1,
                    }
                    exists[i] = now_exists;
                }
                // Unanswered: whether it happened is unknown; etcd's history will say.
                Err(_) => stats.failed += 1,
            }
        }
        stats
    }
}
