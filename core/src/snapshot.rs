//! An immutable view of fleet state at one instant.
//!
//! A snapshot is produced by a single writer (the spoke's metrics scraper and in-flight
//! accounting, or the hub's summary aggregator) and read by many decisions. Workers missing
//! from a snapshot are unknown and never chosen.

use std::collections::BTreeMap;

use rustc_hash::FxHashMap;
use serde::{Deserialize, Serialize};

use crate::predictor::TtftModel;
use crate::replica::Outlook;
use crate::request::WorkerKey;

/// State of the fleet as of one instant.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FleetSnapshot {
    /// Per-worker engine state. Probed once per candidate on every decision: FxHash, not a
    /// tree of string comparisons; nothing depends on its iteration order.
    pub workers: FxHashMap<WorkerKey, WorkerState>,
    /// Provider availability; providers not listed are assumed available.
    pub providers: BTreeMap<String, ProviderState>,
}

/// Engine state of one worker.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WorkerState {
    /// Whether the worker answers health checks.
    #[serde(default = "yes")]
    pub healthy: bool,
    /// Requests queued in the engine (plus those the router sent that the engine has not
    /// reported yet).
    #[serde(default)]
    pub waiting_requests: u32,
    /// Requests in the running batch.
    #[serde(default)]
    pub running_requests: u32,
    /// Requests the router holds back for this worker (dispatch pacing) and has not sent yet:
    /// waiting for it as much as the engine's own queue, so the `MaxWaitingRequests` filter
    /// counts them (the TTFT predictor does not: it models the engine).
    #[serde(default)]
    pub held_requests: u32,
    /// Prompt tokens waiting for prefill, when known (router in-flight accounting).
    #[serde(default)]
    pub waiting_prefill_tokens: Option<u64>,
    /// KV-cache usage in percent, 0..=100.
    #[serde(default)]
    pub kv_cache_usage_percent: f64,
    /// TTFT model calibrated online for this worker; the worker set's model when absent.
    #[serde(default)]
    pub ttft: Option<TtftModel>,
    /// The router's replica of the engine's scheduler: when present it predicts TTFT in place
    /// of `ttft` (live state only, never serialized).
    #[serde(skip)]
    pub outlook: Option<Outlook>,
}

/// Availability of one provider.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ProviderState {
    /// Whether the provider is currently usable (credentials valid, not rate limited).
    pub available: bool,
}

fn yes() -> bool {
    true
}

impl Default for WorkerState {
    fn default() -> Self {
        WorkerState {
            healthy: true,
            waiting_requests: 0,
            running_requests: 0,
            held_requests: 0,
            waiting_prefill_tokens: None,
            kv_cache_usage_percent: 0.0,
            ttft: None,
            outlook: None,
        }
    }
}

impl FleetSnapshot {
    /// State of one worker, if known.
    pub fn worker(&self, key: &WorkerKey) -> Option<&WorkerState> {
        self.workers.get(key)
    }

    /// Whether a provider may be used.
    pub fn provider_available(&self, name: &str) -> bool {
        self.providers.get(name).is_none_or(|p| p.available)
    }
}
