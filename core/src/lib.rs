//! Switchyard's pure policy core.
//!
//! Everything that decides where a request goes lives here, free of I/O: no sockets, no files,
//! no clock reads, no async runtime. The crate holds
//!
//! * [`fleet`]: the compiled, validated fleet configuration (worker sets, providers, pools,
//!   public models, aliases and policies) that the config loader produces from CRDs;
//! * [`request`]: the features of one request that policies match on;
//! * [`snapshot`]: an immutable view of fleet state (queues, KV usage, health) at one instant;
//! * [`predictor`]: the time-to-first-token model used by `minimize: PredictedTTFT`;
//! * [`replica`]: a router's replica of one vLLM engine's scheduler and the online learner of
//!   its step cost, the alternative TTFT predictor (`ttftPredictor: EngineReplica`);
//! * [`pacing`]: whether a request chosen for a worker is sent now or waits at the router
//!   (`dispatchPacing: Paced`);
//! * [`engine`]: [`engine::decide`], a pure function from (config, snapshot, request) to a
//!   [`engine::Decision`] with the ranked alternatives and a step-by-step trace.
//!
//! Invariants the engine upholds for every input (property-tested in `tests/properties.rs`):
//! a request tagged [`request::PII_TAG`] is never routed to an external provider; a provider is
//! chosen only when every local candidate was filtered out; a policy with `onEmpty: Reject`
//! and no local candidate yields a rejection.

pub mod engine;
pub mod fleet;
pub mod money;
pub mod pacing;
pub mod predictor;
pub mod replica;
pub mod request;
pub mod resolve;
pub mod snapshot;

pub use engine::{Decision, Outcome, Target, decide};
pub use fleet::FleetConfig;
pub use request::RequestFeatures;
pub use snapshot::FleetSnapshot;

/// The name of a worker set, worker, served model, pool or public model: shared and immutable.
/// A decision copies dozens of names into its candidates and its snapshot; cloning a `Name`
/// bumps a reference count instead of allocating.
pub type Name = std::sync::Arc<str>;
