//! Every metric name the spoke exports, in one place, with its type and help text.
//!
//! Grammar: `switchyard_spoke_<subsystem>_<name>[_<unit>][_total]`; `_total` only on counters.
//! Labels are low-cardinality and server-controlled: worker set, worker, outcome, mode.
//!
//! The constants are the names exactly as exported (counters include `_total`).
//! [`CATALOGUE`] says how each is produced: [`Source::Recorded`] series are registered once
//! in [`crate::metrics::Metrics`] and updated on the request path; [`Source::Scraped`]
//! series are read from live state by the `/metrics` handler and passed to `render`.

/// Requests received at the front door, by route and status class.
pub const REQUESTS_TOTAL: &str = "switchyard_spoke_requests_total";
/// Routing decisions, by worker set, worker and outcome.
pub const DECISIONS_TOTAL: &str = "switchyard_spoke_decisions_total";
/// Requests spilled to external providers, by provider, model and outcome.
pub const PROVIDER_REQUESTS_TOTAL: &str = "switchyard_spoke_provider_requests_total";
/// Cost of spilled requests in US dollars, by provider and model (exact sums in `/status`).
pub const PROVIDER_COST_USD_TOTAL: &str = "switchyard_spoke_provider_cost_usd_total";
/// Decision latency, seconds.
pub const DECISION_SECONDS: &str = "switchyard_spoke_decision_seconds";
/// Tokenization of a request's prompt before its routing decision, seconds, per worker set.
pub const TOKENIZE_SECONDS: &str = "switchyard_spoke_tokenize_seconds";
/// Time a planned request waited at the spoke for its worker (dispatch pacing), seconds, per
/// worker set; 0 for a request sent at once.
pub const DISPATCH_HOLD_SECONDS: &str = "switchyard_spoke_dispatch_hold_seconds";
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
/// Requests held at the spoke by dispatch pacing now, per worker set.
pub const DISPATCH_HELD: &str = "switchyard_spoke_dispatch_held";
/// Blocks in the KV index, per worker.
pub const INDEX_BLOCKS: &str = "switchyard_spoke_kv_index_blocks";
/// KV event batches applied, per worker.
pub const KV_BATCHES_TOTAL: &str = "switchyard_spoke_kv_event_batches_total";
/// KV event sequence gaps detected, per worker.
pub const KV_GAPS_TOTAL: &str = "switchyard_spoke_kv_event_gaps_total";
/// Gaps filled by replay, per worker.
pub const KV_REPLAYS_TOTAL: &str = "switchyard_spoke_kv_event_replays_total";
/// Subscriptions that joined mid-stream and caught up from the replay buffer, per worker.
pub const KV_CATCH_UPS_TOTAL: &str = "switchyard_spoke_kv_event_catch_ups_total";
/// Resynchronisations (worker entries cleared), per worker.
pub const KV_RESYNCS_TOTAL: &str = "switchyard_spoke_kv_event_resyncs_total";
/// Seconds since the last KV event batch, per worker.
pub const KV_EVENT_LAG_SECONDS: &str = "switchyard_spoke_kv_event_lag_seconds";
/// Worker health (1 healthy), per worker.
pub const WORKER_HEALTHY: &str = "switchyard_spoke_worker_healthy";
/// Requests in flight through the spoke, per worker.
pub const WORKER_INFLIGHT: &str = "switchyard_spoke_worker_inflight_requests";

use switchyard_gateway::metrics::spec;
pub use switchyard_gateway::metrics::{Kind, Source, Spec};
use switchyard_providers::spill;

/// Every metric the spoke exports.
pub const CATALOGUE: &[Spec] = {
    use Kind::{Counter, Gauge, Histogram};
    use Source::{Recorded, Scraped};
    &[
        spec(REQUESTS_TOTAL, "Requests received at the front door, by route and status class", Counter, Recorded),
        spec(DECISIONS_TOTAL, "Routing decisions, by worker set and worker", Counter, Recorded),
        spec(PROVIDER_REQUESTS_TOTAL, spill::REQUESTS_TOTAL_HELP, Counter, Recorded),
        spec(PROVIDER_COST_USD_TOTAL, spill::COST_USD_TOTAL_HELP, Counter, Recorded),
        spec(DECISION_SECONDS, "Routing decision latency in seconds", Histogram, Recorded),
        spec(
            TOKENIZE_SECONDS,
            "Tokenization of a prompt before its routing decision in seconds, per worker set",
            Histogram,
            Recorded,
        ),
        spec(
            DISPATCH_HOLD_SECONDS,
            "Time a planned request waited at the spoke for its worker (dispatch pacing) in seconds, per worker set",
            Histogram,
            Recorded,
        ),
        spec(TTFT_SECONDS, "Observed time to first token through the spoke in seconds", Histogram, Recorded),
        spec(
            TTFT_PREDICTION_ERROR_SECONDS,
            "Absolute difference between the calibrated TTFT prediction and the observed TTFT in seconds",
            Histogram,
            Recorded,
        ),
        spec(PREDICTED_CACHED_TOKENS_TOTAL, "Predicted cached prompt tokens of routed requests", Counter, Recorded),
        spec(ACTUAL_CACHED_TOKENS_TOTAL, "Cached prompt tokens the engines reported", Counter, Recorded),
        spec(
            PROMPT_TOKEN_MISMATCH_TOTAL,
            "Requests whose predicted prompt length differed from the engine's",
            Counter,
            Recorded,
        ),
        spec(FIDELITY_MODE, "Fidelity mode per worker set: 0 EXACT, 1 DEGRADED, 2 FALLBACK", Gauge, Scraped),
        spec(DISPATCH_HELD, "Requests held at the spoke by dispatch pacing now, per worker set", Gauge, Scraped),
        spec(INDEX_BLOCKS, "Blocks in the KV index, per worker", Gauge, Scraped),
        spec(KV_BATCHES_TOTAL, "KV event batches applied, per worker", Counter, Scraped),
        spec(KV_GAPS_TOTAL, "KV event sequence gaps detected, per worker", Counter, Scraped),
        spec(KV_REPLAYS_TOTAL, "KV event gaps filled by replay, per worker", Counter, Scraped),
        spec(
            KV_CATCH_UPS_TOTAL,
            "KV event subscriptions that joined mid-stream and caught up by replay, per worker",
            Counter,
            Scraped,
        ),
        spec(KV_RESYNCS_TOTAL, "KV resynchronisations (worker entries cleared), per worker", Counter, Scraped),
        spec(KV_EVENT_LAG_SECONDS, "Seconds since the last KV event batch, per worker", Gauge, Scraped),
        spec(WORKER_HEALTHY, "Worker health (1 healthy), per worker", Gauge, Scraped),
        spec(WORKER_INFLIGHT, "Requests in flight through the spoke, per worker", Gauge, Scraped),
    ]
};

/// The catalogue entry of an exported name.
pub fn lookup(name: &str) -> Option<&'static Spec> {
    CATALOGUE.iter().find(|s| s.name == name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_the_grammar() {
        for (i, s) in CATALOGUE.iter().enumerate() {
            assert!(s.name.starts_with("switchyard_spoke_"), "{}", s.name);
            assert_eq!(s.kind == Kind::Counter, s.name.ends_with("_total"), "{}: `_total` only on counters", s.name);
            assert!(!s.help.is_empty() && !s.help.ends_with('.'), "{}: help", s.name);
            assert!(CATALOGUE[..i].iter().all(|o| o.name != s.name), "{} listed twice", s.name);
            assert_eq!(lookup(s.name), Some(s));
        }
        assert_eq!(lookup("switchyard_spoke_nope"), None);
    }

    #[test]
    fn every_name_constant_is_catalogued() {
        let names: Vec<&str> = include_str!("metric_names.rs")
            .lines()
            .filter_map(|l| l.strip_prefix("pub const ")?.split_once(": &str = \"")?.1.strip_suffix("\";"))
            .collect();
        assert_eq!(names.len(), CATALOGUE.len(), "{names:?}");
        for name in names {
            assert!(lookup(name).is_some(), "{name} is not in CATALOGUE");
        }
    }
}
