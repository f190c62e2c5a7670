//! kcache's actors over a pure list/watch core.
//!
//! - [`core`]: store, event window, resourceVersion rules, selectors and filters, relist
//!   diff, bookmark schedule, the upstream state machine — plain Rust, unit-tested.
//! - [`registry::Registry`]: key → refcount; starts and (after a grace period) stops
//!   [`cached_object::CachedObject`]s.
//! - [`cached_object::CachedObject`]: one key's store + window, fed by a [`source`]; the
//!   messages, commands and status they share are in [`feed`].
//! - [`fleet`]: with `--nats`, ownership leases, event fan-out and mirroring across
//!   replicas; an owned key's publisher (`fleet::listener`) follows the key like a
//!   watcher.
//! - [`health`]: whether this replica reaches the API server (readiness, fleet handover).
//! - [`upstream_pool`]: lists and watches multiplexed over a few HTTP/2 connections.
//! - [`watcher::Watcher`]: one downstream watch with the API server's cacheWatcher semantics.
//!   [`body`] carries its lines to the HTTP response; [`watch_feed`] is what a key sends it.

pub mod cached_object;
pub mod config;
pub mod core;
pub mod dispatch_budget;
pub mod feed;
pub mod fleet;
pub mod health;
pub mod memory;
pub mod metrics;
pub mod registry;
pub mod source;
pub mod upstream_pool;
pub mod watch_feed;
pub mod watcher;
