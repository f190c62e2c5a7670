//! kcache's load tests as a library: the measuring steps, clients and readers the
//! binaries share, each binary (`main.rs`: `kcache-bench`; `bin/`: the chaos soak, the
//! fleet bench, the codec bench, the coalescing report) a thin driver over it.
//!
//! - [`cli`]: `kcache-bench`'s flags; `--scenario kubelet|informer|slow|…`.
//! - [`scenario`]: the shared measuring steps ([`scenario::Session`]) and one module per
//!   scenario, each documenting its workload.
//! - [`watch`]: one client watch (and the slow consumer that never reads).
//! - [`workers`]: child processes holding watch connections past one process's
//!   open-file limit.
//! - [`record`]: counters and write→delivery latency matching.
//! - [`client`]: the connection model and the API server write client.
//! - [`probe`]: RSS/CPU from `/proc`, and the one reader of Prometheus `/metrics` text.
//! - [`report`]: result types, side-by-side ratios, the printed table.
//! - [`plot`]: latency CDF and RSS-vs-watches PNGs.
//! - [`progress`]: the live progress line (only on a terminal).
//! - [`fleet`]: the fleet bench's replicas, timed watches and writes, ownership, failover.
//! - [`chaos`]: the fleet chaos soak's faults, clients, reference history and judge.

pub mod chaos;
pub mod cli;
pub mod client;
pub mod fleet;
pub mod plot;
pub mod probe;
pub mod progress;
pub mod record;
pub mod report;
pub mod scenario;
pub mod watch;
pub mod workers;
