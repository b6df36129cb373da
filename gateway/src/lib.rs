//! The request path shared by the spoke and the hub.
//!
//! ```text
//! dialect (openai | anthropic) ── parse ──► InferenceRequest (request)
//!   → admit (admission: concurrency bound, before any body work)
//!   → Backend::route: tokenize on the CPU pool, plan (pure, plan) over a snapshot, book
//!   → relay: Upstream::send (upstream) — worker now; provider, cluster next
//!   → typed events (event) rendered back in the caller's dialect
//!   → observers (observe): calibration, fidelity, load ledger; next the limiter and ledger
//! ```
//!
//! Errors come from one catalogue ([`error`]) and are rendered once, in [`server`].

pub mod admission;
pub mod anthropic;
pub mod backend;
pub mod error;
pub mod event;
pub mod metrics;
pub mod observe;
pub mod openai;
pub mod plan;
pub mod relay;
pub mod request;
pub mod server;
pub mod upstream;

pub use backend::{Backend, Routed, Target};
pub use error::{ErrorKind, GatewayError};
pub use event::{Event, FinishReason, Usage};
pub use request::{Dialect, InferenceRequest};
