//! The soak's result: totals over the clients' verdicts, the faults as carried out, the
//! final-state comparison, and the verdict; printed for a person and written as JSON.

use std::collections::BTreeMap;

use serde::Serialize;

use super::faults::Done;
use super::judge::{Finding, Verdict};
use super::writer::WriterStats;

/// Sums over a set of clients.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Totals {
    pub clients: usize,
    pub clients_never_started: usize,
    pub events_judged: usize,
    pub events_delivered: usize,
    pub lost: usize,
    pub lost_superseded: usize,
    pub duplicated: usize,
    pub went_back: usize,
    pub phantom: usize,
    pub wrong_type: usize,
    pub relists_forced: usize,
    pub relists_unforced: usize,
    pub events_replaced_by_relist: usize,
    pub gone_410: usize,
    pub client_errors: usize,
    pub final_state_mismatches: usize,
}

impl Totals {
    pub fn add(&mut self, v: &Verdict, mismatch: bool) {
        self.clients += 1;
        self.clients_never_started += usize::from(!v.started);
        self.events_judged += v.judged;
        self.events_delivered += v.delivered;
        self.lost += v.lost;
        self.lost_superseded += v.lost_superseded;
        self.duplicated += v.duplicated;
        self.went_back += v.went_back;
        self.phantom += v.phantom;
        self.wrong_type += v.wrong_type;
        self.relists_forced += v.relists_forced;
        self.relists_unforced += v.relists_unforced;
        self.events_replaced_by_relist += v.replaced;
        self.gone_410 += v.gone;
        self.client_errors += v.errors;
        self.final_state_mismatches += usize::from(mismatch);
    }

    /// The judge's verdict on these clients.
    pub fn clean(&self) -> bool {
        self.lost == 0
            && self.duplicated == 0
            && self.went_back == 0
            && self.phantom == 0
            && self.final_state_mismatches == 0
    }
}

/// A client whose final view differs from the API server's.
#[derive(Clone, Debug, Serialize)]
pub struct Mismatch {
    pub client: String,
    /// object: (client's resourceVersion, API server's), `None` = absent.
    pub differences: BTreeMap<String, (Option<u64>, Option<u64>)>,
}

#[derive(Debug, Serialize)]
pub struct Report {
    pub seed: u64,
    pub duration_secs: u64,
    pub chaos_secs: f64,
    pub replicas: usize,
    pub nats_nodes: usize,
    pub faults: BTreeMap<&'static str, usize>,
    pub faults_not_carried_out: usize,
    /// Headline numbers: the clients of kcache.
    pub events_judged: usize,
    pub lost: usize,
    pub duplicated: usize,
    pub went_back: usize,
    pub relists_forced: usize,
    pub final_state_mismatches: usize,
    pub kcache_clients: Totals,
    /// The same clients straight to the API server, judged the same way: the judge's
    /// own check (they must come out clean).
    pub control_clients: Totals,
    pub true_events: usize,
    pub writes: WriterStats,
    pub settled: bool,
    pub settle_secs: f64,
    /// kcache's counters of coalescing and covering, summed over the replicas and their
    /// restarts (`counters`; lower bounds).
    pub kcache_counters: BTreeMap<&'static str, f64>,
    pub fault_log: Vec<Done>,
    pub heal: Vec<String>,
    pub mismatches: Vec<Mismatch>,
    pub examples: Vec<(String, Finding)>,
    pub harness_errors: Vec<String>,
    pub pass: bool,
}

impl Report {
    pub fn print(&self) {
        let faults: Vec<String> = self
            .faults
            .iter()
            .map(|(k, n)| format!("{k} {n}"))
            .collect();
        println!(
            "kcache chaos soak: seed {}, duration {} s ({:.0} s of faults), {} replicas, {} NATS nodes",
            self.seed, self.duration_secs, self.chaos_secs, self.replicas, self.nats_nodes
        );
        println!(
            "faults injected: {}{}",
            faults.join(", "),
            match self.faults_not_carried_out {
                0 => String::new(),
                n => format!(" ({n} not carried out as planned)"),
            }
        );
        let k = &self.kcache_clients;
        println!(
            "events judged {}, lost {}, duplicated {}, went back {}, relists forced {}, final-state mismatches {}",
            self.events_judged,
            self.lost,
            self.duplicated,
            self.went_back,
            self.relists_forced,
            self.final_state_mismatches
        );
        println!(
            "  {} kcache clients: {} events delivered, {} phantom, {} wrong type, {} replaced by relists, {} lost of which {} skipped to a newer state, {} 410s, {} errors retried",
            k.clients,
            k.events_delivered,
            k.phantom,
            k.wrong_type,
            k.events_replaced_by_relist,
            k.lost,
            k.lost_superseded,
            k.gone_410,
            k.client_errors
        );
        let counted: Vec<String> = self
            .kcache_counters
            .iter()
            .map(|(k, v)| format!("{} {v}", k.trim_start_matches("kcache_")))
            .collect();
        println!("  kcache counted: {}", counted.join(", "));
        let c = &self.control_clients;
        println!(
            "  control, {} clients straight to the API server: judged {}, lost {}, duplicated {}, went back {}, phantom {}, relists forced {}, mismatches {}",
            c.clients, c.events_judged, c.lost, c.duplicated, c.went_back, c.phantom, c.relists_forced, c.final_state_mismatches
        );
        println!(
            "  true events {}; writes: {} creates, {} updates, {} deletes, {} failed; settled: {} ({:.1} s)",
            self.true_events,
            self.writes.creates,
            self.writes.updates,
            self.writes.deletes,
            self.writes.failed,
            self.settled,
            self.settle_secs
        );
        for d in &self.fault_log {
            println!(
                "  fault {:>2} t={:>6.1}s..{:>6.1}s {:<17} {}{}",
                d.n,
                d.start_ms as f64 / 1000.0,
                d.end_ms as f64 / 1000.0,
                d.kind.name(),
                d.what,
                if d.ok { "" } else { " [not as planned]" }
            );
        }
        for (cat, f) in self.examples.iter().take(40) {
            println!(
                "  {cat}: {} {}@{} t={} ms: {}",
                f.client, f.object, f.rv, f.at_ms, f.detail
            );
        }
        for m in self.mismatches.iter().take(10) {
            println!("  final-state mismatch: {} {:?}", m.client, m.differences);
        }
        for e in &self.harness_errors {
            println!("  harness: {e}");
        }
        println!("{}", if self.pass { "PASS" } else { "FAIL" });
    }
}

/// The differences between a client's view and the expected state, over `names`.
pub fn diff(
    view: &BTreeMap<String, u64>,
    expected: &BTreeMap<String, u64>,
    covers: impl Fn(&str) -> bool,
) -> BTreeMap<String, (Option<u64>, Option<u64>)> {
    let mut out = BTreeMap::new();
    for name in view.keys().chain(expected.keys()) {
        if !covers(name) {
            continue;
        }
        let (a, b) = (view.get(name).copied(), expected.get(name).copied());
        if a != b {
            out.insert(name.clone(), (a, b));
        }
    }
    out
}
