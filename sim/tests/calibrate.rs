//! Virtual-time runs: the routing rules rank as they must on the reference profile, and goodput
//! counts only requests within the SLO.

use switchyard_sim::calibrate::{Routing, RunResult, RunSpec, Workload, run};
use switchyard_sim::profile;

fn run_with(workload: Workload, mut routing: Routing) -> RunResult {
    let p = profile::by_name("l40s-27b-fp8").expect("reference profile");
    let spec = RunSpec { engines: 3, workload, concurrency: 8, requests: 120, warmup: 24, output_tokens: 300, seed: 1 };
    run(p, &spec, &mut routing)
}

#[test]
fn oracle_routing_keeps_prefixes_cached_and_beats_random_on_goodput() {
    let random = run_with(Workload::SharedPrefix, Routing::Random);
    let oracle = run_with(Workload::SharedPrefix, Routing::Oracle);
    // Random finds a prefix on the chosen engine about as often as an engine holds it (11 of 24).
    assert!(random.cache_hit_rate > 0.3 && random.cache_hit_rate < 0.6, "{random:?}");
    assert!(random.ttft_ms_p50 > 5_000.0, "{random:?}");
    // The counters cover the whole run: the 24 first loads of 144 requests cap it near 0.83.
    assert!(oracle.cache_hit_rate > 0.7, "{oracle:?}");
    assert!(oracle.ttft_ms_p50 < 500.0, "{oracle:?}");
    assert!(oracle.goodput_per_min > 2.0 * random.goodput_per_min, "{oracle:?} vs {random:?}");
    for r in [&random, &oracle] {
        assert!(r.goodput_per_min <= r.requests_per_min + 1e-9, "{r:?}");
    }
    // Random's misses take a whole 16k-token prefill (~6.9 s), so some of them miss the 8 s SLO.
    assert!(random.goodput_per_min < random.requests_per_min, "{random:?}");
}

#[test]
fn oracle_routing_spreads_unique_prompts_better_than_random() {
    let random = run_with(Workload::Control, Routing::Random);
    let oracle = run_with(Workload::Control, Routing::Oracle);
    assert!(oracle.ttft_ms_p95 < random.ttft_ms_p95, "{oracle:?} vs {random:?}");
    assert!(oracle.ttft_ms_p50 <= random.ttft_ms_p50, "{oracle:?} vs {random:?}");
}

#[test]
fn multi_turn_conversations_reuse_their_history_where_they_stay() {
    let affinity = run_with(Workload::MultiTurn, Routing::PrefixAffinity);
    let random = run_with(Workload::MultiTurn, Routing::Random);
    // A turn's prompt is the last turn's prompt and answer plus 400 tokens: on the engine that
    // served the conversation nearly all of it is cached (the first turns are the misses).
    assert!(affinity.cache_hit_rate > 0.75, "{affinity:?}");
    assert!(random.cache_hit_rate < affinity.cache_hit_rate - 0.2, "{random:?} vs {affinity:?}");
    assert!(affinity.ttft_ms_p50 < random.ttft_ms_p50, "{affinity:?} vs {random:?}");
    assert_eq!(Workload::MultiTurn.slo_ms(), 4_000.0);
}

#[test]
fn round_robin_and_least_outstanding_place_every_request() {
    for routing in [Routing::RoundRobin, Routing::LeastOutstanding] {
        let r = run_with(Workload::Control, routing);
        assert!(r.requests_per_min > 0.0 && r.ttft_ms_p50 > 0.0, "{routing:?}: {r:?}");
        // Unique prompts: balancing beats random on the tail.
        let random = run_with(Workload::Control, Routing::Random);
        assert!(r.ttft_ms_p95 < random.ttft_ms_p95, "{routing:?}: {r:?} vs {random:?}");
    }
}
