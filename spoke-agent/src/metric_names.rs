//! Every metric name the spoke exports, in one place.
//!
//! Grammar: `switchyard_spoke_<subsystem>_<name>[_<unit>][_total]`; `_total` only on counters.
//! Labels are low-cardinality and server-controlled: worker set, worker, outcome, mode.

/// Requests received at the front door, by route and status class.
pub const REQUESTS_TOTAL: &str = "switchyard_spoke_requests_total";
/// Routing decisions, by worker set, worker and outcome.
pub const DECISIONS_TOTAL: &str = "switchyard_spoke_decisions_total";
/// Decision latency, seconds.
pub const DECISION_SECONDS: &str = "switchyard_spoke_decision_seconds";
/// Observed time to first token through the spoke, seconds.
pub const TTFT_SECONDS: &str = "switchyard_spoke_ttft_seconds";
/// Absolute difference between the calibrated model's TTFT prediction and the observed TTFT.
pub const TTFT_PREDICTION_ERROR_SECONDS: &str = "switchyard_spoke_ttft_prediction_error_seconds";
/// Predicted cached prompt tokens of routed requests.
pub const PREDICTED_CACHED_TOKENS_TOTAL: &str = "switchyard_spoke_predicted_cached_tokens_total";
/// Cached prompt tokens the engines reported.
pub const ACTUAL_CACHED_TOKENS_TOTAL: &str = "switchyard_spoke_actual_cached_tokens_total";
/// Requests whose predicted prompt length differed from the engine's.
pub const PROMPT_TOKEN_MISMATCH_TOTAL: &str = "switchyard_spoke_prompt_token_mismatch_total";
/// Fidelity mode per worker set: 0 EXACT, 1 DEGRADED, 2 FALLBACK.
pub const FIDELITY_MODE: &str = "switchyard_spoke_fidelity_mode";
/// Blocks in the KV index, per worker.
pub const INDEX_BLOCKS: &str = "switchyard_spoke_kv_index_blocks";
/// KV event batches applied, per worker.
pub const KV_BATCHES_TOTAL: &str = "switchyard_spoke_kv_event_batches_total";
/// KV event sequence gaps detected, per worker.
pub const KV_GAPS_TOTAL: &str = "switchyard_spoke_kv_event_gaps_total";
/// Gaps filled by replay, per worker.
pub const KV_REPLAYS_TOTAL: &str = "switchyard_spoke_kv_event_replays_total";
/// Resynchronisations (worker entries cleared), per worker.
pub const KV_RESYNCS_TOTAL: &str = "switchyard_spoke_kv_event_resyncs_total";
/// Seconds since the last KV event batch, per worker.
pub const KV_EVENT_LAG_SECONDS: &str = "switchyard_spoke_kv_event_lag_seconds";
/// Worker health (1 healthy), per worker.
pub const WORKER_HEALTHY: &str = "switchyard_spoke_worker_healthy";
/// Requests in flight through the spoke, per worker.
pub const WORKER_INFLIGHT: &str = "switchyard_spoke_worker_inflight_requests";
