//! Virtual-time runs: the routing rules rank as they must on the reference profile, and goodput
//! counts only requests within the SLO.

use switchyard_sim::calibrate::{
    Arrival, Route, Routing, RunError, RunResult, RunSpec, TimingError, Twin, Workload, run,
};
use switchyard_sim::profile;

fn run_with(workload: Workload, mut routing: Routing) -> RunResult {
    let p = profile::by_name("l40s-27b-fp8").expect("reference profile");
    let arrival = Arrival::Concurrent { concurrency: 8, rampup_s: 0.0, think_s: 0.0 };
    let spec = RunSpec { engines: 3, workload, arrival, requests: 120, warmup: 24, output_tokens: 300, seed: 1 };
    run(p, &spec, &mut routing).expect("closed-loop run")
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

fn poisson(workload: Workload, rate_per_s: f64, mut routing: Routing) -> Result<RunResult, RunError> {
    let p = profile::by_name("l40s-27b-fp8").expect("reference profile");
    let arrival = Arrival::Poisson { rate_per_s };
    let spec = RunSpec { engines: 3, workload, arrival, requests: 200, warmup: 40, output_tokens: 300, seed: 1 };
    run(p, &spec, &mut routing)
}

#[test]
fn poisson_arrivals_offer_their_rate_whatever_the_routing() {
    // Open loop: the measured arrivals span ~200 / 0.5 s, so the offered rate is what the
    // run reports (within sampling noise of 200 exponential gaps), for a slow rule as for a
    // good one; the slow rule's queues grow instead.
    let random = poisson(Workload::SharedPrefix, 0.5, Routing::Random).expect("run");
    let oracle = poisson(Workload::SharedPrefix, 0.5, Routing::Oracle).expect("run");
    for r in [&random, &oracle] {
        assert!((r.requests_per_min - 30.0).abs() < 6.0, "{r:?}");
    }
    assert!(oracle.ttft_ms_p50 < random.ttft_ms_p50, "{oracle:?} vs {random:?}");
    assert!(oracle.goodput_per_min > random.goodput_per_min, "{oracle:?} vs {random:?}");
    // A rate the fleet cannot serve: queues grow without bound and the tail with them.
    let overload = poisson(Workload::Control, 2.0, Routing::RoundRobin).expect("run");
    let light = poisson(Workload::Control, 0.1, Routing::RoundRobin).expect("run");
    assert!(overload.ttft_ms_p95 > 5.0 * light.ttft_ms_p95, "{overload:?} vs {light:?}");
}

#[test]
fn open_loop_refuses_what_it_cannot_run() {
    assert_eq!(
        poisson(Workload::MultiTurn, 1.0, Routing::Random).expect_err("multi-turn is closed-loop"),
        RunError::MultiTurnNeedsClients
    );
    for rate in [0.0, -1.0, f64::NAN, f64::INFINITY] {
        assert_eq!(poisson(Workload::Control, rate, Routing::Random).expect_err("no arrivals"), RunError::NoArrivals);
    }
}

fn closed_loop(arrival: Arrival) -> Result<RunResult, RunError> {
    let p = profile::by_name("l40s-27b-fp8").expect("reference profile");
    let spec = RunSpec {
        engines: 3,
        workload: Workload::SharedPrefix,
        arrival,
        requests: 120,
        warmup: 24,
        output_tokens: 300,
        seed: 1,
    };
    run(p, &spec, &mut Routing::Oracle)
}

#[test]
fn a_client_think_time_lowers_the_closed_loop_rate() {
    // Two clients on three engines never queue: a request takes ~170 ms + 300 tokens of decode,
    // so a 5 s pause between a client's answer and its next request cuts the rate it offers.
    let at_once = closed_loop(Arrival::Concurrent { concurrency: 2, rampup_s: 0.0, think_s: 0.0 }).expect("run");
    let paused = closed_loop(Arrival::Concurrent { concurrency: 2, rampup_s: 0.0, think_s: 5.0 }).expect("run");
    assert!(paused.requests_per_min < 0.85 * at_once.requests_per_min, "{paused:?} vs {at_once:?}");
    // Ramped-up clients still complete every request.
    let ramped = closed_loop(Arrival::Concurrent { concurrency: 8, rampup_s: 40.0, think_s: 0.5 }).expect("run");
    assert!(ramped.requests_per_min > 0.0 && ramped.ttft_ms_p50 > 0.0, "{ramped:?}");
}

#[test]
fn negative_or_infinite_client_timings_are_refused() {
    for (rampup_s, think_s) in [(-1.0, 0.0), (0.0, -0.5), (f64::INFINITY, 0.0), (0.0, f64::NAN)] {
        let err = closed_loop(Arrival::Concurrent { concurrency: 4, rampup_s, think_s }).expect_err("refused");
        assert!(matches!(err, RunError::NoArrivals), "{rampup_s} {think_s}: {err:?}");
    }
}

fn control_with_turnaround(router: &mut dyn Route) -> RunResult {
    let p = profile::by_name("l40s-27b-fp8").expect("reference profile");
    let arrival = Arrival::Concurrent { concurrency: 24, rampup_s: 2.0, think_s: 0.5 };
    let spec = RunSpec {
        engines: 3,
        workload: Workload::Control,
        arrival,
        requests: 80,
        warmup: 16,
        output_tokens: 100,
        seed: 1,
    };
    run(p, &spec, router).expect("closed-loop run")
}

#[test]
fn a_replica_with_the_true_timing_decides_as_the_oracle_and_a_wrong_one_does_not() {
    // The twin sees only what a router knows (what it sent, first and last tokens); with the
    // engines' own timing it replicates them exactly here, so every decision is the oracle's.
    let oracle = control_with_turnaround(&mut Routing::Oracle);
    let p = profile::by_name("l40s-27b-fp8").expect("reference profile");
    let exact = control_with_turnaround(&mut Twin::new(p, 3, TimingError::default()));
    assert_eq!(exact, oracle);
    // Prefill nearly free and decoding slow: the replicas drift (corrected only where they lag) and decide otherwise.
    let wrong = TimingError { prefill: 0.1, decode: 5.0, ..TimingError::default() };
    let drifted = control_with_turnaround(&mut Twin::new(p, 3, wrong));
    assert_ne!(drifted, oracle);
    assert!(drifted.requests_per_min > 0.0, "{drifted:?}");
}
