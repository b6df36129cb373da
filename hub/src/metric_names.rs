//! Every metric name the hub exports, in one place, with its type and help text.
//!
//! Grammar: `switchyard_hub_<subsystem>_<name>[_<unit>][_total]`; `_total` only on counters.
//! Labels are low-cardinality and server-controlled: cluster (from certificates the hub's CA
//! signed), state, reason.

use switchyard_gateway::metrics::{Kind, Source, Spec, spec};
use switchyard_providers::spill;

/// Spoke streams accepted (hello checked), by cluster.
pub const SESSIONS_TOTAL: &str = "switchyard_hub_spoke_sessions_total";
/// Spoke connections refused, by reason: `tls` (handshake: no certificate, another CA,
/// expired), `identity` (no cluster in the certificate), `cluster_mismatch` (the hello claims
/// another cluster), `protocol` (no hello first, or a malformed one).
pub const REFUSED_TOTAL: &str = "switchyard_hub_spoke_refused_total";
/// Load reports applied, by cluster.
pub const LOAD_REPORTS_TOTAL: &str = "switchyard_hub_load_reports_total";
/// Coarse reports applied, by cluster.
pub const COARSE_REPORTS_TOTAL: &str = "switchyard_hub_coarse_reports_total";
/// Encoded bytes of the coarse reports applied, by cluster (the link's cost of the prefix index).
pub const COARSE_BYTES_TOTAL: &str = "switchyard_hub_coarse_bytes_total";
/// Coarse blocks the prefix index holds now, by cluster and worker set.
pub const PREFIX_BLOCKS: &str = "switchyard_hub_prefix_blocks";
/// Clusters now, by state: `live` (choosable), `connected` (stream open, live or silent).
pub const CLUSTERS: &str = "switchyard_hub_clusters";
/// Requests the hub spilled to external providers, by provider, model and outcome.
pub const PROVIDER_REQUESTS_TOTAL: &str = "switchyard_hub_provider_requests_total";
/// Cost of requests the hub spilled, in US dollars, by provider and model (exact in `/status`).
pub const PROVIDER_COST_USD_TOTAL: &str = "switchyard_hub_provider_cost_usd_total";
/// Batch requests waiting in the hub's queue now.
pub const BATCH_QUEUE_DEPTH: &str = "switchyard_hub_batch_queue_depth";
/// Time a batch request waited in the hub's queue before it was dispatched, seconds.
pub const BATCH_WAIT_SECONDS: &str = "switchyard_hub_batch_wait_seconds";
/// Queued batch requests by outcome: `dispatched`, `timed_out`.
pub const BATCH_REQUESTS_TOTAL: &str = "switchyard_hub_batch_requests_total";
/// Time the hub spent on a request before sending it to a spoke (tokenization, the prefix
/// lookup, planning; a batch request's wait in the queue is not included).
pub const ROUTE_SECONDS: &str = "switchyard_hub_route_seconds";
/// Time from sending a request to a spoke until its first token reached the hub.
pub const UPSTREAM_TTFT_SECONDS: &str = "switchyard_hub_upstream_ttft_seconds";
/// Spokes' answers to the hub's configuration, by cluster and outcome (`applied`, `refused`).
pub const CONFIG_ACKS_TOTAL: &str = "switchyard_hub_config_acks_total";
/// Usage records applied from the spokes, by cluster, origin (`hub`: forwarded by the hub;
/// `spoke`: the spoke's own clients) and outcome.
pub const USAGE_RECORDS_TOTAL: &str = "switchyard_hub_usage_records_total";
/// Tokens of the usage records applied, by cluster, origin and kind (`prompt`, `cached`,
/// `completion`).
pub const USAGE_TOKENS_TOTAL: &str = "switchyard_hub_usage_tokens_total";
/// Usage records received again after they were applied (a spoke resending after a broken
/// stream), by cluster.
pub const USAGE_DUPLICATES_TOTAL: &str = "switchyard_hub_usage_duplicates_total";

/// Every metric the hub exports.
pub const CATALOGUE: &[Spec] = {
    use Kind::{Counter, Gauge, Histogram};
    use Source::{Recorded, Scraped};
    &[
        spec(SESSIONS_TOTAL, "Spoke streams accepted, by cluster", Counter, Recorded),
        spec(REFUSED_TOTAL, "Spoke connections refused, by reason", Counter, Recorded),
        spec(LOAD_REPORTS_TOTAL, "Load reports applied, by cluster", Counter, Recorded),
        spec(COARSE_REPORTS_TOTAL, "Coarse cache reports applied, by cluster", Counter, Recorded),
        spec(
            CONFIG_ACKS_TOTAL,
            "Spokes' answers to the hub's configuration, by cluster and outcome",
            Counter,
            Recorded,
        ),
        spec(
            USAGE_RECORDS_TOTAL,
            "Usage records applied from the spokes, by cluster, origin and outcome",
            Counter,
            Recorded,
        ),
        spec(USAGE_TOKENS_TOTAL, "Tokens of the applied usage records, by cluster, origin and kind", Counter, Recorded),
        spec(
            USAGE_DUPLICATES_TOTAL,
            "Usage records received again after they were applied, by cluster",
            Counter,
            Recorded,
        ),
        spec(COARSE_BYTES_TOTAL, "Encoded bytes of the coarse cache reports applied, by cluster", Counter, Recorded),
        spec(PREFIX_BLOCKS, "Coarse blocks the prefix index holds, by cluster and worker set", Gauge, Scraped),
        spec(CLUSTERS, "Clusters by state: live (choosable) or connected", Gauge, Scraped),
        spec(PROVIDER_REQUESTS_TOTAL, spill::REQUESTS_TOTAL_HELP, Counter, Recorded),
        spec(PROVIDER_COST_USD_TOTAL, spill::COST_USD_TOTAL_HELP, Counter, Recorded),
        spec(BATCH_QUEUE_DEPTH, "Batch requests waiting in the hub's queue now", Gauge, Scraped),
        spec(
            BATCH_WAIT_SECONDS,
            "Time a batch request waited in the hub's queue before dispatch in seconds",
            Histogram,
            Recorded,
        ),
        spec(BATCH_REQUESTS_TOTAL, "Queued batch requests by outcome", Counter, Recorded),
        spec(
            ROUTE_SECONDS,
            "Time spent on a request before it was sent to a spoke (tokenization, prefix lookup, planning) in seconds",
            Histogram,
            Recorded,
        ),
        spec(
            UPSTREAM_TTFT_SECONDS,
            "Time from sending a request to a spoke until its first token arrived in seconds, by cluster",
            Histogram,
            Recorded,
        ),
    ]
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_the_grammar() {
        for (i, s) in CATALOGUE.iter().enumerate() {
            assert!(s.name.starts_with("switchyard_hub_"), "{}", s.name);
            assert_eq!(s.kind == Kind::Counter, s.name.ends_with("_total"), "{}: `_total` only on counters", s.name);
            assert!(CATALOGUE[..i].iter().all(|o| o.name != s.name), "{} listed twice", s.name);
        }
    }
}
