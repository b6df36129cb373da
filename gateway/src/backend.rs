//! What a deployable plugs into the request path: the [`Backend`] decides and books, the
//! front door parses, admits, relays and renders.
//!
//! Invariants: `route` is where planning happens (tokenize on the CPU pool, look up caches,
//! run the pure [`crate::plan`] step over an immutable snapshot) and where the first choice is
//! booked, before anything else can await; the targets it returns are healthy alternatives in
//! rank order, and only they count against the retry budget.

use std::future::Future;
use std::sync::Arc;

use axum::http::{HeaderMap, HeaderName, HeaderValue};

use crate::error::GatewayError;
use crate::observe::Dispatch;
use crate::request::InferenceRequest;
use crate::upstream::Upstream;

/// One place a request may be sent.
pub trait Target: Send + Sync {
    /// Human-readable name (`worker-set/worker`, `provider/model`), for traces.
    fn label(&self) -> &str;
    /// Where the request goes.
    fn upstream(&self) -> &dyn Upstream;
    /// The external provider behind this target, if it is one (named in the response's
    /// `x-switchyard-provider` header).
    fn provider(&self) -> Option<&str> {
        None
    }
    /// Called right before the request is sent here: returns what to book and observe.
    /// `attempt` is 0 for the first choice (already booked during planning).
    fn dispatch(&self, attempt: usize) -> Dispatch;
}

/// The outcome of planning: targets to try in order.
pub struct Routed {
    /// Healthy alternatives, best first.
    pub targets: Vec<Box<dyn Target>>,
    /// The router's prompt-token count (shown before the engine's usage arrives).
    pub prompt_tokens: Option<u32>,
    /// Headers to add to the response (e.g. which worker served it).
    pub headers: Vec<(HeaderName, HeaderValue)>,
}

/// The deployable's side of the request path.
pub trait Backend: Send + Sync + 'static {
    /// Public model names and aliases served here.
    fn models(&self) -> Vec<String>;

    /// The tenant of a request, from its credentials (`None`: anonymous, when allowed).
    fn authenticate(&self, _headers: &HeaderMap) -> Result<Option<String>, GatewayError> {
        Ok(None)
    }

    /// Plans `req` and books the first choice.
    fn route(&self, req: Arc<InferenceRequest>) -> impl Future<Output = Result<Routed, GatewayError>> + Send;

    /// Prompt tokens of `req` as the engine would count them.
    fn count_tokens(&self, req: Arc<InferenceRequest>) -> impl Future<Output = Result<u32, GatewayError>> + Send;

    /// Whether the backend can serve requests now (`/readyz`).
    fn ready(&self) -> bool {
        true
    }

    /// Records a finished request for metrics (route, HTTP status).
    fn record(&self, _endpoint: &'static str, _status: u16) {}
}
