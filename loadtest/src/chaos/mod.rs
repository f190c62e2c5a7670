//! `kcache-chaos`, the chaos soak (`loadtest/chaos.sh`): clients on every replica of a
//! kcache fleet, a writer, seeded faults, and a judge that checks every client's event
//! stream against the true history. One module per concept:
//!
//! - [`rng`]: the seeded generator everything random is drawn from;
//! - [`etcd`], [`truth`]: the reference watch (etcd, under the API server) and the
//!   history it records;
//! - [`transport`], [`clients`], [`observe`]: the clients under test, how they reach a
//!   live replica, and the log of what each saw;
//! - [`writer`]: the create/update/delete load;
//! - [`procs`], [`faults`]: the processes the soak controls and the faults it injects;
//! - [`counters`]: kcache's own counters of coalescing and covering, across restarts;
//! - [`judge`], [`report`]: the verdict.

pub mod clients;
pub mod counters;
pub mod etcd;
pub mod faults;
pub mod judge;
pub mod observe;
pub mod procs;
pub mod report;
pub mod rng;
pub mod transport;
pub mod truth;
pub mod writer;
