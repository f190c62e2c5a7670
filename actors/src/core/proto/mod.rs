//! Protobuf from the cache: the built-in types as the API server encodes them for clients
//! that ask for `application/vnd.kubernetes.protobuf` (the kubelet, kube-proxy, the
//! controllers and schedulers all ask for it first).
//!
//! kcache keeps the upstream's JSON (`core::object`) and derives protobuf from it once per
//! object, when a protobuf client first needs it: [`schema`] knows every built-in message
//! (generated from the Kubernetes sources), [`encode`] turns one object's JSON into its
//! message, [`codec`] wraps messages as the API server's wire does — the `k8s\x00`
//! envelope around a `runtime.Unknown`, watch events as length-prefixed `WatchEvent`
//! frames, lists as one envelope. Custom resources have no schema and stay JSON, as on the
//! API server.

pub mod codec;
pub mod encode;
pub mod schema;

use thiserror::Error;

pub use codec::Codec;

#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum Error {
    /// The generated schema table is malformed (a build defect; tested).
    #[error("protobuf schema: {0}")]
    Schema(String),
    /// An object the schema cannot express: a field of a newer API server, a mistyped
    /// value. Served as JSON instead, never with the field dropped.
    #[error("cannot encode as protobuf: {0}")]
    Encode(String),
}
