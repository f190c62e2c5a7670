//! Result types and output: one [`TargetReport`] per target, the side-by-side comparison
//! (`kcache_over_apiserver` ratios), the JSON file, and the table printed at the end.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Serialize;
use serde_json::{json, Map, Value};

use crate::probe::Cpu;

/// Write→delivery latency summary of one set of deliveries.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct Latency {
    pub samples: usize,
    pub p50_ms: Option<f64>,
    pub p90_ms: Option<f64>,
    pub p99_ms: Option<f64>,
    pub max_ms: Option<f64>,
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Nearest-rank percentile of sorted samples.
pub fn percentile(sorted: &[Duration], p: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len());
    Some(ms(sorted[rank - 1]))
}

impl Latency {
    pub fn of(sorted: &[Duration]) -> Latency {
        Latency {
            samples: sorted.len(),
            p50_ms: percentile(sorted, 0.50),
            p90_ms: percentile(sorted, 0.90),
            p99_ms: percentile(sorted, 0.99),
            max_ms: sorted.last().copied().map(ms),
        }
    }
}

/// RSS after one step of opening watches.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct RssStep {
    /// Watches established at the time of the sample.
    pub watches: usize,
    pub target_rss_kib: u64,
    pub apiserver_rss_kib: u64,
}

/// Watch counters from the servers' own /metrics.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ServerWatches {
    /// `apiserver_longrunning_requests{verb="WATCH"}` (all resources) with the watches open, minus before:
    /// the watches the API server holds for this target's clients.
    pub apiserver_watches_added: Option<f64>,
    /// kcache only: `kcache_registered_watchers` with the watches open.
    pub kcache_registered_watchers: Option<f64>,
    /// kcache only: `kcache_upstream_watches` with the watches open.
    pub kcache_upstream_watches: Option<f64>,
    /// Watches the target closed as unresponsive during the run (kcache:
    /// `kcache_terminated_watchers_total`, API server: `apiserver_terminated_watchers_total`).
    pub terminated_watchers: Option<f64>,
}

/// Everything measured for one target in one scenario.
#[derive(Clone, Debug, Default, Serialize)]
pub struct TargetReport {
    pub target: String,
    pub url: String,
    /// Watches the clients asked for.
    pub client_watches: usize,
    /// Watches established (first event, or headers for watches from a list RV).
    pub watches_established: usize,
    /// HTTP connections the watches were spread over.
    pub connections: usize,
    pub rss_before_kib: u64,
    pub rss_after_kib: u64,
    /// Target RSS growth while the watches were opened, per client watch.
    pub rss_growth_per_watch_bytes: f64,
    pub apiserver_rss_before_kib: u64,
    /// The API server's RSS growth over the same time (for kcache: its upstream cost).
    pub apiserver_rss_growth_kib: i64,
    /// For kcache, target + API server growth per client watch (direct: same as above).
    pub rss_growth_per_watch_incl_upstream_bytes: f64,
    /// RSS growth per watch opened after every key already had one (kubelet): what one
    /// more idle watch costs, without the per-key cost (kcache's cached object and
    /// upstream watch) that the first watch of a key carries.
    pub rss_marginal_per_watch_bytes: Option<f64>,
    pub rss_steps: Vec<RssStep>,
    /// Objects the per-cached-object figure is based on, and how it was measured.
    pub cached_objects: Option<usize>,
    pub rss_growth_per_cached_object_bytes: Option<f64>,
    pub cached_objects_method: Option<String>,
    pub writes: usize,
    pub write_errors: usize,
    pub expected_deliveries: usize,
    pub deliveries: usize,
    /// Write→delivery latency of the measured phase.
    pub latency: Latency,
    pub write_phase_seconds: f64,
    pub deliveries_per_second: f64,
    /// Deliveries per CPU-second of the target in the write phase (= per second per
    /// fully busy core).
    pub deliveries_per_target_cpu_second: Option<f64>,
    /// The same counting the API server's CPU too (for kcache: target + upstream; for the
    /// direct run the target is the API server).
    pub deliveries_per_cpu_second_incl_apiserver: Option<f64>,
    /// CPU seconds while opening the watches: target, API server, generator.
    pub cpu_open: Cpu,
    /// CPU seconds during the write phase(s), including the final drain.
    pub cpu_write: Cpu,
    pub server_watches: ServerWatches,
    /// Errors counted by the clients (failed watch requests, failed writes, broken
    /// streams, ERROR events), and watch streams that ended early.
    pub errors: usize,
    pub watch_streams_ended: usize,
    pub error_reasons: BTreeMap<String, usize>,
    pub notes: Vec<String>,
    /// Scenario-specific figures.
    pub extra: Value,
    /// Figures compared side by side instead of the watch figures below, for a scenario
    /// that measures no watch workload (`objects`); their values are in `extra` too.
    /// Every report of a run has the same names in the same order.
    #[serde(skip)]
    pub own_figures: Option<Vec<(&'static str, Option<f64>)>>,
}

impl TargetReport {
    /// The figures compared side by side, by name.
    fn figures(&self) -> Vec<(&'static str, Option<f64>)> {
        if let Some(own) = &self.own_figures {
            return own.clone();
        }
        let f = |v: usize| Some(v as f64);
        vec![
            ("client_watches", f(self.client_watches)),
            ("watches_established", f(self.watches_established)),
            (
                "rss_growth_per_watch_bytes",
                Some(self.rss_growth_per_watch_bytes),
            ),
            (
                "rss_growth_per_watch_incl_upstream_bytes",
                Some(self.rss_growth_per_watch_incl_upstream_bytes),
            ),
            (
                "rss_marginal_per_watch_bytes",
                self.rss_marginal_per_watch_bytes,
            ),
            (
                "rss_growth_per_cached_object_bytes",
                self.rss_growth_per_cached_object_bytes,
            ),
            ("expected_deliveries", f(self.expected_deliveries)),
            ("deliveries", f(self.deliveries)),
            ("latency_p50_ms", self.latency.p50_ms),
            ("latency_p99_ms", self.latency.p99_ms),
            ("latency_max_ms", self.latency.max_ms),
            (
                "deliveries_per_target_cpu_second",
                self.deliveries_per_target_cpu_second,
            ),
            (
                "deliveries_per_cpu_second_incl_apiserver",
                self.deliveries_per_cpu_second_incl_apiserver,
            ),
            ("target_cpu_seconds_open", Some(self.cpu_open.target)),
            ("target_cpu_seconds_write", Some(self.cpu_write.target)),
            ("apiserver_cpu_seconds_open", Some(self.cpu_open.apiserver)),
            (
                "apiserver_cpu_seconds_write",
                Some(self.cpu_write.apiserver),
            ),
            ("generator_cpu_seconds_open", Some(self.cpu_open.generator)),
            (
                "generator_cpu_seconds_write",
                Some(self.cpu_write.generator),
            ),
            (
                "apiserver_watches_added",
                self.server_watches.apiserver_watches_added,
            ),
            (
                "terminated_watchers",
                self.server_watches.terminated_watchers,
            ),
            ("errors", f(self.errors)),
        ]
    }
}

/// `{figure: {<target>: value, ..., "kcache_over_apiserver": ratio}}` for the reports given.
pub fn side_by_side(reports: &[TargetReport]) -> Value {
    let mut out = Map::new();
    let Some(first) = reports.first() else {
        return Value::Object(out);
    };
    for (i, (name, _)) in first.figures().iter().enumerate() {
        let mut row = Map::new();
        let mut direct = None;
        let mut cached = None;
        for r in reports {
            let v = r.figures().get(i).and_then(|(_, v)| *v);
            row.insert(r.target.clone(), json!(v));
            match r.target.as_str() {
                "kube-apiserver" => direct = v,
                "kcache" => cached = v,
                _ => {}
            }
        }
        if let (Some(d), Some(c)) = (direct, cached) {
            if d != 0.0 && d.is_finite() && c.is_finite() {
                row.insert("kcache_over_apiserver".into(), json!(c / d));
            }
        }
        out.insert((*name).to_string(), Value::Object(row));
    }
    Value::Object(out)
}

/// The side-by-side figures as a text table.
pub fn table(reports: &[TargetReport]) -> String {
    let mut s = format!("{:<44}", "");
    for r in reports {
        s += &format!("{:>18}", r.target);
    }
    s.push('\n');
    let Some(first) = reports.first() else {
        return s;
    };
    for (i, (name, _)) in first.figures().iter().enumerate() {
        s += &format!("{name:<44}");
        for r in reports {
            let cell = match r.figures().get(i).and_then(|(_, v)| *v) {
                Some(v) if v.fract() == 0.0 && v.abs() < 1e12 => format!("{v:.0}"),
                Some(v) => format!("{v:.2}"),
                None => "-".into(),
            };
            s += &format!("{cell:>18}");
        }
        s.push('\n');
    }
    s
}

/// Up to `points` (latency ms, fraction ≤) pairs of a sorted sample set, for replotting.
pub fn cdf_points(sorted: &[Duration], points: usize) -> Vec<(f64, f64)> {
    let n = sorted.len();
    if n == 0 {
        return Vec::new();
    }
    let step = n.div_ceil(points.max(1)).max(1);
    let mut v: Vec<(f64, f64)> = (0..n)
        .step_by(step)
        .map(|i| (ms(sorted[i]), (i + 1) as f64 / n as f64))
        .collect();
    if v.last().is_some_and(|(_, f)| *f < 1.0) {
        v.push((ms(sorted[n - 1]), 1.0));
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(ms: u64) -> Duration {
        Duration::from_millis(ms)
    }

    #[test]
    fn percentiles_are_nearest_rank() {
        let v: Vec<Duration> = (1..=100).map(d).collect();
        let l = Latency::of(&v);
        assert_eq!(l.p50_ms, Some(50.0));
        assert_eq!(l.p99_ms, Some(99.0));
        assert_eq!(l.max_ms, Some(100.0));
        assert_eq!(Latency::of(&[]).p50_ms, None);
        let c = cdf_points(&v, 10);
        assert_eq!(c.first(), Some(&(1.0, 0.01)));
        assert_eq!(c.last(), Some(&(100.0, 1.0)));
    }

    #[test]
    fn ratios_compare_kcache_to_the_apiserver() {
        let a = TargetReport {
            target: "kube-apiserver".into(),
            rss_growth_per_watch_bytes: 100_000.0,
            ..Default::default()
        };
        let k = TargetReport {
            target: "kcache".into(),
            rss_growth_per_watch_bytes: 15_000.0,
            ..Default::default()
        };
        let s = side_by_side(&[a.clone(), k.clone()]);
        assert_eq!(
            s["rss_growth_per_watch_bytes"]["kcache_over_apiserver"],
            json!(0.15)
        );
        assert!(table(&[a, k]).contains("rss_growth_per_watch_bytes"));
    }
}
