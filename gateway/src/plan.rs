//! The one I/O-free planning step: what the router knows about each worker and the request →
//! the pure policy engine's ranked decision. The spoke, `switchyard calibrate` and the benches
//! all plan through these functions, so what is measured offline is what runs live.
//!
//! Invariants: nothing here awaits, reads a clock or draws a random number; equal inputs give
//! equal decisions (the tie breaker comes from the caller's request counter).

use std::collections::BTreeMap;

use switchyard_core::engine::{Decision, RejectReason, Target};
use switchyard_core::predictor::TtftModel;
use switchyard_core::replica::Outlook;
use switchyard_core::request::{RequestFeatures, WorkerKey};
use switchyard_core::snapshot::WorkerState;
use switchyard_core::{FleetConfig, FleetSnapshot, Name, decide};

use crate::error::{ErrorKind, GatewayError};
use crate::request::InferenceRequest;

/// What the router knows about one worker when it plans.
#[derive(Debug, Clone, Default)]
pub struct WorkerView {
    /// Health checks pass.
    pub healthy: bool,
    /// Waiting requests, as the engine last reported.
    pub engine_waiting: u32,
    /// Running requests, as the engine last reported.
    pub engine_running: u32,
    /// KV-cache usage as a fraction, 0..=1.
    pub kv_usage: f64,
    /// Requests this router sent that have not produced a first token yet.
    pub unstarted_requests: u32,
    /// Their uncached prompt tokens.
    pub unstarted_prefill_tokens: u64,
    /// Requests this router holds back for the worker (dispatch pacing), not yet sent.
    pub held_requests: u32,
    /// The worker set's calibrated TTFT model.
    pub ttft: Option<TtftModel>,
    /// The router's replica of the engine, when it keeps one: it predicts in place of `ttft`.
    pub outlook: Option<Outlook>,
}

/// The snapshot entry of a worker: the engine's queue, or the router's own in-flight count
/// when that is larger (the engine's metrics lag the router's dispatches).
pub fn worker_state(v: &WorkerView) -> WorkerState {
    WorkerState {
        healthy: v.healthy,
        waiting_requests: v.engine_waiting.max(v.unstarted_requests),
        running_requests: v.engine_running,
        held_requests: v.held_requests,
        waiting_prefill_tokens: Some(v.unstarted_prefill_tokens),
        kv_cache_usage_percent: v.kv_usage * 100.0,
        ttft: v.ttft,
        outlook: v.outlook.clone(),
    }
}

/// A snapshot of `workers`.
pub fn snapshot(workers: impl IntoIterator<Item = (WorkerKey, WorkerView)>) -> FleetSnapshot {
    FleetSnapshot {
        workers: workers.into_iter().map(|(key, view)| (key, worker_state(&view))).collect(),
        ..FleetSnapshot::default()
    }
}

/// Spreads equal candidates across requests while keeping each decision reproducible.
pub fn tie_breaker(request_no: u64) -> u64 {
    request_no.wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

/// The request's features for the policy engine.
pub fn features(
    req: &InferenceRequest,
    prompt_tokens: u32,
    cached_tokens: BTreeMap<WorkerKey, u32>,
    request_no: u64,
) -> RequestFeatures {
    RequestFeatures {
        model: req.model.clone(),
        tenant: req.tenant.clone(),
        tags: req.tags.clone(),
        class: req.class,
        complexity: None,
        prompt_tokens,
        max_output_tokens: req.max_tokens,
        cached_tokens,
        tie_breaker: tie_breaker(request_no),
        block_keys: Default::default(),
    }
}

/// The planning step: the policy engine's decision over the snapshot.
pub fn plan(fleet: &FleetConfig, snapshot: &FleetSnapshot, features: &RequestFeatures) -> Decision {
    decide(fleet, snapshot, features)
}

/// Local workers to try, best first: the decision's ranking, at most `max`, only those
/// `healthy` admits (the retry budget counts only healthy alternatives).
pub fn ranked_workers(decision: &Decision, max: usize, healthy: impl Fn(&WorkerKey) -> bool) -> Vec<(WorkerKey, Name)> {
    decision
        .alternatives
        .iter()
        .filter_map(|c| match &c.target {
            Target::Worker { worker_set, worker, served_model } => {
                Some((WorkerKey { worker_set: worker_set.clone(), worker: worker.clone() }, served_model.clone()))
            }
            Target::Provider { .. } => None,
        })
        .filter(|(k, _)| healthy(k))
        .take(max)
        .collect()
}

/// The error a rejecting decision answers with, in the catalogue.
pub fn rejection(reason: RejectReason, message: String) -> GatewayError {
    match reason {
        RejectReason::ModelNotFound | RejectReason::AliasCycle => GatewayError::model_not_found(message),
        RejectReason::NoLocalCapacity | RejectReason::NoCandidate => {
            GatewayError::new(ErrorKind::NoCapacity, "no_capacity", message)
        }
    }
}
