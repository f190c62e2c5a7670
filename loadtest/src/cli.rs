//! Command-line flags of `kcache-bench`.
//!
//! Flags shared by every scenario come first; the others apply to the scenarios named in
//! their help. Scenario defaults differ (e.g. `--watches` is 1,000 for `slow` and 50,000
//! for `scale`), so those flags are `Option`s resolved by each scenario's `Params`.

use clap::{Parser, ValueEnum};

/// Which workload to run (see `scenario/`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ScenarioKind {
    /// Simulated nodes: single-object Secret/ConfigMap watches plus one pod watch per node.
    Kubelet,
    /// Namespace-wide list+watch clients under create/update/delete churn.
    Informer,
    /// Slow consumers (watches never read) mixed with normal, measured clients.
    Slow,
    /// One flooding client (another user, listing back to back) beside normal watches and
    /// readers.
    Flood,
    /// Many single-object watches on one replica (50,000 by default).
    Scale,
    /// RSS per cached object and whole-namespace lists of many ConfigMaps (100,000).
    Objects,
    /// Cluster-wide Endpoints watches, one per connection, as kube-proxies hold them.
    Kubeproxy,
    /// Kubelet-pattern watches while the API server is killed (-9) and restarted.
    Restart,
    /// Kubelet-pattern single-object watches over many namespaces, for kcache's adaptive
    /// coalescing (one target per run: `loadtest/coalesce.sh` runs the three).
    Coalesce,
    /// Controllers doing full consistent relists (`limit` pages, no resourceVersion,
    /// following `continue`), and one `kubectl get`-style Table list: what they cost the
    /// API server and etcd, directly and through kcache.
    Relist,
}

impl ScenarioKind {
    /// Default for `--open-timeout-secs`: kcache syncs keys at its upstream QPS (200/s),
    /// so 5,000 keys of the scale scenario alone take 25 s; one key of 100,000 objects is
    /// a list of ~140 MB, and 5,000 TLS handshakes on a shared core take minutes (restart:
    /// 10,000 lists and 10,000 watches on the generator's shared core).
    pub fn open_timeout_secs(self) -> u64 {
        match self {
            ScenarioKind::Scale | ScenarioKind::Kubeproxy | ScenarioKind::Restart => 300,
            ScenarioKind::Objects | ScenarioKind::Coalesce => 600,
            _ => 120,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            ScenarioKind::Kubelet => "kubelet",
            ScenarioKind::Informer => "informer",
            ScenarioKind::Slow => "slow",
            ScenarioKind::Flood => "flood",
            ScenarioKind::Scale => "scale",
            ScenarioKind::Objects => "objects",
            ScenarioKind::Kubeproxy => "kubeproxy",
            ScenarioKind::Restart => "restart",
            ScenarioKind::Coalesce => "coalesce",
            ScenarioKind::Relist => "relist",
        }
    }
}

/// Which servers to measure.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum TargetKind {
    /// The kube-apiserver directly.
    Apiserver,
    /// kcache in front of it.
    Kcache,
}

#[derive(Parser, Clone, Debug)]
#[command(
    name = "kcache-bench",
    about = "Runs one watch workload against the kube-apiserver and against kcache, same client, same run"
)]
pub struct Args {
    /// Workload to run.
    #[arg(long, value_enum, default_value_t = ScenarioKind::Kubelet)]
    pub scenario: ScenarioKind,
    /// API server URL (setup and writes always go here).
    #[arg(long)]
    pub apiserver: String,
    /// PID of the kube-apiserver process (RSS, CPU).
    #[arg(long)]
    pub apiserver_pid: u32,
    /// kcache URL.
    #[arg(long)]
    pub kcache: String,
    /// PID of the kcache process (RSS, CPU).
    #[arg(long)]
    pub kcache_pid: u32,
    /// More kcache replicas of the same fleet, behind one Service as far as the
    /// scenario goes: `URL=PID`, repeated (run.sh's `KCACHE_BENCH_FLEET`). The relist
    /// scenario sends each page to the next replica in turn and sums their CPU; the
    /// other scenarios use `--kcache` alone.
    #[arg(long = "kcache-replica", value_parser = parse_replica)]
    pub kcache_replicas: Vec<Replica>,
    /// PID of etcd (relist: its CPU seconds; run.sh passes it).
    #[arg(long)]
    pub etcd_pid: Option<u32>,
    /// Bearer token for every request, the API server's and kcache's alike (also reads
    /// both /metrics endpoints).
    #[arg(long, default_value = "admintoken")]
    pub token: String,
    /// Targets to measure, in this order.
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = [TargetKind::Apiserver, TargetKind::Kcache])]
    pub targets: Vec<TargetKind>,

    /// Watches per HTTP/2 connection. The reference API server allows 100 streams per
    /// connection (`--http2-max-streams-per-connection` unset: 100, client-go's initial
    /// limit; 1.20 allowed 250); a Go client opens another connection past it, hyper's
    /// would queue the watch, so the harness never asks for more.
    #[arg(long, default_value_t = 100)]
    pub per_connection: usize,
    /// Use HTTP/1.1 (one connection per watch) instead of HTTP/2.
    #[arg(long)]
    pub http1: bool,
    /// Spread client connections over source addresses 127.0.0.1..=127.0.0.N (only for
    /// loopback targets; for when ephemeral ports run out, e.g. with --http1).
    #[arg(long, default_value_t = 1)]
    pub source_addrs: u8,
    /// Child processes that hold one-connection-per-node watches (the `coalesce`
    /// scenario's) instead of this one. 0: as many as this process's open-file limit
    /// needs, none while its connections fit in it (see `workers`).
    #[arg(long, default_value_t = 0)]
    pub watch_workers: usize,

    /// Writes (or churn operations) per second, always sent to the API server.
    /// Default: 100 (informer: 60, kubeproxy, coalesce: 20).
    #[arg(long)]
    pub rate: Option<u64>,
    /// Seconds of writes per measured phase (relist: seconds of relists). Default: 20
    /// (slow: 15 per phase, relist: 120).
    #[arg(long)]
    pub seconds: Option<u64>,
    /// Watches are opened in this many steps; RSS is sampled after each (RSS-vs-watches plot).
    #[arg(long, default_value_t = 10)]
    pub steps: usize,
    /// Pause before each RSS sample, so allocations settle (milliseconds).
    #[arg(long, default_value_t = 1000)]
    pub settle_ms: u64,
    /// Longest wait for all watches of one target to be established (objects: for the
    /// target to hold every object) in seconds. Default: 120 (scale, kubeproxy: 300,
    /// objects: 600).
    #[arg(long)]
    pub open_timeout_secs: Option<u64>,
    /// Longest wait for the last deliveries after the writes stop (seconds).
    #[arg(long, default_value_t = 30)]
    pub drain_secs: u64,

    /// kubelet, restart, coalesce: simulated nodes (restart, coalesce: each node's watches
    /// share one HTTP/2 connection).
    #[arg(long, default_value_t = 100)]
    pub nodes: usize,
    /// coalesce: each simulated node with its own identity (`system:node:bench-node-<n>`,
    /// group `system:nodes`; `loadtest/run.sh` gives the API server their tokens) and its
    /// pods bound to it, mounting the Secrets and ConfigMaps it watches, so the API
    /// server's Node authorizer decides every watch, directly or through kcache's
    /// SubjectAccessReviews, as in a cluster. Without it every node uses the bench token.
    #[arg(long)]
    pub node_identities: bool,
    /// kubelet: single-object watches per node (half Secrets, half ConfigMaps); each node
    /// also holds one `spec.nodeName` pod watch. 100 nodes × (99 + 1) = 10,000 watches.
    /// coalesce: Secret and ConfigMap watches per node, besides one `kube-root-ca.crt`
    /// watch per namespace of the node. Default: kubelet 99, coalesce 30.
    #[arg(long)]
    pub watches_per_node: Option<usize>,
    /// kubelet, restart: Secrets the nodes' watches are spread over.
    #[arg(long, default_value_t = 500)]
    pub secrets: usize,
    /// kubelet, restart: ConfigMaps the nodes' watches are spread over.
    #[arg(long, default_value_t = 500)]
    pub configmaps: usize,
    /// kubelet: pods bound to each node (written to like the other objects).
    #[arg(long, default_value_t = 2)]
    pub pods_per_node: usize,
    /// kubelet: during the kcache run, this many Secrets/ConfigMaps also get one watch
    /// directly on the API server, so each of their events is timed on both paths at
    /// once (the paired added latency; 0 = skip).
    #[arg(long, default_value_t = 100)]
    pub paired_objects: usize,
    /// kubelet: 1 KiB ConfigMaps for the per-cached-object figure (0 = skip).
    #[arg(long, default_value_t = 2000)]
    pub cached_objects: usize,

    /// coalesce: Secrets in each namespace.
    #[arg(long, default_value_t = 20)]
    pub secrets_per_namespace: usize,
    /// coalesce: ConfigMaps in each namespace, besides its `kube-root-ca.crt`.
    #[arg(long, default_value_t = 20)]
    pub configmaps_per_namespace: usize,
    /// coalesce: share of each namespace's Secrets and of its ConfigMaps that some pod
    /// uses (the names the nodes' watches pick from); the rest are never watched.
    #[arg(long, default_value_t = 0.8)]
    pub used_fraction: f64,
    /// coalesce: namespaces each node has pods in (its watches are spread over them).
    #[arg(long, default_value_t = 3)]
    pub namespaces_per_node: usize,
    /// coalesce: seconds to wait after the last watch is established before reading RSS
    /// and watch counts, for every target alike: kcache's name keys that handed their
    /// watchers over stop after its `grace_period_secs` (30).
    #[arg(long, default_value_t = 45)]
    pub settle_secs: u64,
    /// coalesce: how often the API server's watches, kcache's upstream watches and both
    /// RSS are sampled while the watches open and settle (milliseconds; each sample
    /// scrapes the API server's /metrics, which costs it CPU).
    #[arg(long, default_value_t = 5000)]
    pub sample_every_ms: u64,
    /// coalesce: the `cache.coalesce_min_names` the kcache under test was started with
    /// (run.sh writes it into kcache's configuration; recorded in the results; 0 = off).
    #[arg(long, default_value_t = 0)]
    pub kcache_coalesce_min_names: usize,

    /// informer: list+watch clients; relist: controllers, each relisting the namespace
    /// every `--relist-period-secs`.
    #[arg(long, default_value_t = 50)]
    pub clients: usize,
    /// relist: seconds between one controller's relists (their starts are staggered over
    /// the period).
    #[arg(long, default_value_t = 30)]
    pub relist_period_secs: u64,
    /// relist: `limit` of each page of a relist and of the Table list.
    #[arg(long, default_value_t = 500)]
    pub page_limit: usize,
    /// relist: seconds of reads of one name each (a get, then a list by
    /// `metadata.name`, as kubectl and a reflector of one object read), by `--clients`
    /// readers, after the relists: through kcache the namespace's key serves them
    /// (covers them). 0: none.
    #[arg(long, default_value_t = 10)]
    pub name_reads_secs: u64,
    /// informer: namespaces the clients (round robin) and the churn are spread over;
    /// kubeproxy: namespaces the Services are spread over; coalesce: namespaces of
    /// Secrets and ConfigMaps. Default: informer 5, kubeproxy 10, coalesce 100.
    #[arg(long)]
    pub namespaces: Option<usize>,
    /// informer: ConfigMaps (1 KiB) in each namespace before the clients list.
    #[arg(long, default_value_t = 200)]
    pub objects_per_namespace: usize,

    /// slow, scale, kubeproxy, restart: watches in total (slow: normal + slow ones;
    /// kubeproxy: kube-proxies, each one connection with its two cluster-wide watches,
    /// EndpointSlices and Services; restart:
    /// single-object watches spread evenly over `--nodes`). Default: slow 1,000, scale
    /// 50,000, kubeproxy 5,000, restart 10,000.
    #[arg(long)]
    pub watches: Option<usize>,
    /// slow, scale: objects the single-object watches are spread over; objects:
    /// ConfigMaps (~1.4 KB of JSON each) in the one namespace; relist: ConfigMaps
    /// (`--payload-bytes` of data each) in the one namespace. Default: slow 100
    /// ConfigMaps, scale 5,000 Secrets, objects 100,000 ConfigMaps, relist 20,000.
    #[arg(long)]
    pub objects: Option<usize>,
    /// slow: fraction of the watches that are slow consumers (namespace-wide watches that
    /// never read their response body).
    #[arg(long, default_value_t = 0.1)]
    pub slow_fraction: f64,
    /// flood: normal readers, each reading one ConfigMap at resourceVersion 0 every 100 ms.
    #[arg(long, default_value_t = 20)]
    pub flood_readers: usize,
    /// flood: the flooding client's concurrent list loops.
    #[arg(long, default_value_t = 64)]
    pub flood_concurrency: usize,
    /// flood: the flooding client's bearer token (another user than `--token`'s).
    #[arg(long, default_value = "viewertoken")]
    pub flood_token: String,
    /// flood: the user `--flood-token` authenticates as (given a Role to read the
    /// scenario's ConfigMaps).
    #[arg(long, default_value = "viewer")]
    pub flood_user: String,
    /// slow, flood, relist: data bytes per ConfigMap (bigger events fill a stalled stream
    /// sooner). Default: slow, flood 4,096, relist 128.
    #[arg(long)]
    pub payload_bytes: Option<usize>,
    /// scale: at most this many watches against the API server directly (it holds about
    /// 100 KB per watch and a core's worth of CPU to open 10,000); the output says when
    /// it measured fewer than kcache.
    #[arg(long, default_value_t = 10_000)]
    pub apiserver_max_watches: usize,
    /// scale: how long kcache's watches sit idle after they open, for its idle CPU and
    /// write calls per second.
    #[arg(long, default_value_t = 10)]
    pub idle_secs: u64,

    /// objects: creates in flight while the ConfigMaps are made; restart: writes in flight
    /// when every watched object is written once after the API server is ready again.
    #[arg(long, default_value_t = 32)]
    pub create_concurrency: usize,
    /// objects: whole-namespace lists (`resourceVersion=0`) per target; the report gives
    /// each and the median.
    #[arg(long, default_value_t = 3)]
    pub lists: usize,
    /// kubeproxy: Services (headless), each with its own EndpointSlice.
    #[arg(long, default_value_t = 1000)]
    pub services: usize,
    /// kubeproxy: endpoints (one address each) in each EndpointSlice.
    #[arg(long, default_value_t = 3)]
    pub endpoint_addresses: usize,

    /// restart: a command (an executable's path, no arguments) that kills the
    /// kube-apiserver with SIGKILL and starts it again with the same flags, and prints the
    /// new process's pid on its last line of output (run.sh passes the
    /// `restart-apiserver.sh` that scripts/start-test-cluster.sh writes).
    #[arg(long, required_if_eq("scenario", "restart"))]
    pub apiserver_restart_cmd: Option<String>,
    /// restart: longest wait, from the API server's readiness after the restart, for every
    /// client to have the write made after the restart (seconds).
    #[arg(long, default_value_t = 180)]
    pub restart_wait_secs: u64,

    /// Where to write the JSON results; the PNG plots go beside it (`<stem>-*.png`).
    #[arg(long, default_value = "bench-results.json")]
    pub out: String,
    /// Do not draw PNG plots.
    #[arg(long)]
    pub no_plots: bool,
    /// No live progress display (it is off anyway when stderr is not a terminal).
    #[arg(long)]
    pub no_progress: bool,
    /// How the processes were pinned to cores (recorded in the JSON; set by run.sh).
    #[arg(long, default_value = "not pinned")]
    pub pinning: String,
}

/// One more process of a target (`--kcache-replica`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Replica {
    pub url: String,
    pub pid: u32,
}

/// `URL=PID`.
fn parse_replica(s: &str) -> Result<Replica, String> {
    let (url, pid) = s
        .rsplit_once('=')
        .ok_or_else(|| format!("{s:?}: expected URL=PID"))?;
    let pid = pid
        .parse()
        .map_err(|_| format!("{s:?}: {pid:?} is not a pid"))?;
    Ok(Replica {
        url: url.trim_end_matches('/').to_string(),
        pid,
    })
}

#[cfg(test)]
mod replica_tests {
    use super::*;

    #[test]
    fn replicas_read_as_url_and_pid() {
        assert_eq!(
            parse_replica("https://127.0.0.1:8443/=42"),
            Ok(Replica {
                url: "https://127.0.0.1:8443".into(),
                pid: 42
            })
        );
        assert!(parse_replica("https://127.0.0.1:8443").is_err());
        assert!(parse_replica("https://127.0.0.1:8443=x").is_err());
    }
}
