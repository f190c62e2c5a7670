//! The pure list/watch core: no actix, tokio or network types, only decisions.
//!
//! Each module reproduces one piece of the API server's watch cache (see
//! `docs/architecture.md`); actors in the parent module are thin shells that feed these
//! functions messages and run the actions they return.

pub mod backfill;
pub mod bookmark;
pub mod budget;
pub mod coalesce;
pub mod cover;
pub mod dispatch_index;
pub mod event;
pub mod filter;
pub mod fresh;
pub mod go_quote;
pub mod history;
pub mod holds;
pub mod interest;
pub mod key;
pub mod key_machine;
pub mod lease;
pub mod lines;
pub mod list_stream;
pub mod mirror;
pub mod object;
pub mod page;
pub mod proto;
pub mod refs;
pub mod relist;
pub mod retain;
pub mod role;
pub mod rv;
pub mod seal;
pub mod selector;
pub mod sign;
pub mod store;
pub mod subject;
pub mod time;
pub mod upstream;
pub mod wants;
pub mod watchers;
pub mod window;
pub mod wire;
