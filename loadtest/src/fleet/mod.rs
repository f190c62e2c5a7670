//! The fleet benchmark (`kcache-fleet-bench`, `loadtest/fleet.sh`): a fleet's replicas
//! and their processes ([`replica`]), the watches and writes whose deliveries are timed
//! ([`watches`]), who owns which key and how that changed ([`ownership`]), and the phase
//! that kills owners ([`failover`]).

pub mod failover;
pub mod ownership;
pub mod replica;
pub mod watches;
