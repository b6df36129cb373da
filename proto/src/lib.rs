//! The hub ↔ spoke protocol and the mutual TLS it runs over.
//!
//! - [`v1`]: messages and the `Federation` service generated from
//!   `proto/switchyard/federation/v1/federation.proto` (the wire contract; read it first).
//! - [`tls`]: certificate files, the cluster identity a client certificate carries, the hub's
//!   server configuration (reloaded when its files change) and the spoke's client one.
//! - [`coarse`]: the coarse block hashes a spoke announces its caches in and the hub
//!   looks prompts up by.
//! - [`dev_certs`]: a development CA and certificates in the layout cert-manager writes
//!   (`switchyard certs`).
//!
//! Invariant: a cluster's identity is read from its verified client certificate only, never
//! from what the spoke says; [`tls::cluster_of`] is the one place that reads it.

pub mod coarse;
pub mod dev_certs;
pub mod tls;

/// Generated protocol, version 1.
#[allow(clippy::all, missing_docs, rust_2018_idioms)]
pub mod v1 {
    tonic::include_proto!("switchyard.federation.v1");
}
