//! The engine loop feeds vLLM's request-level metrics from what the simulated engine did:
//! token counts by source, per-request histograms, the lifecycle intervals and tokens per step.

use std::sync::Arc;

use switchyard_sim::engine::Engine;
use switchyard_sim::faults::Faults;
use switchyard_sim::metrics::{Hist, Metrics};
use switchyard_sim::profile::TINY;
use switchyard_sim::runtime::{self, Emitted, LoopDeps};
use tokio_util::sync::CancellationToken;

#[tokio::test]
async fn the_engine_loop_records_vllms_request_metrics() {
    let metrics = Arc::new(Metrics::new("m", &TINY, switchyard_sim::engine::hash::HashAlgo::Sha256));
    let shutdown = CancellationToken::new();
    let engine = Engine::new(TINY.clone(), 1, 1, Arc::new(vec![7, 8, 9]));
    let deps = LoopDeps {
        metrics: metrics.clone(),
        faults: Arc::new(Faults::default()),
        publisher: None,
        time_scale: 0.1,
        shutdown: shutdown.clone(),
    };
    let (worker, task) = runtime::spawn(engine, deps);
    // The same 40-token prompt twice: the second finds two 16-token blocks cached. The first
    // stops at `max_tokens`; the second stands for a chat request without one.
    let prompt: Vec<u32> = (1..=40).collect();
    for natural_stop in [false, true] {
        let mut rx = worker.submit(prompt.clone(), 5, natural_stop).expect("engine running");
        while let Some(Emitted::Token { finished, .. }) = rx.recv().await {
            if finished {
                break;
            }
        }
    }
    let v = metrics.values().expect("values");
    assert_eq!((v.prompt_tokens, v.prompt_tokens_computed, v.prompt_tokens_cached), (80, 48, 32));
    assert_eq!((v.prefix_cache_queries, v.prefix_cache_hits), (80, 32));
    assert_eq!((v.finished_length, v.finished_stop, v.generation_tokens), (1, 1, 10));
    assert_eq!(v.histogram(Hist::PromptTokens), (2, 80.0));
    assert_eq!(v.histogram(Hist::GenerationTokens), (2, 10.0));
    assert_eq!(v.histogram(Hist::MaxNumGenerationTokens), (2, 10.0));
    assert_eq!(v.histogram(Hist::ParamsN), (2, 2.0));
    // Without `max_tokens`, vLLM's parameter is the rest of the context.
    assert_eq!(v.histogram(Hist::ParamsMaxTokens), (2, f64::from(5 + TINY.max_model_len - 40)));
    assert_eq!(v.histogram(Hist::PrefillKvComputedTokens), (2, 48.0));
    assert_eq!(v.histogram(Hist::NumPreemptions), (2, 0.0));
    // Per step with output: computed prompt tokens of the prefills that completed, plus tokens.
    assert_eq!(v.histogram(Hist::IterationTokens).1, 58.0);
    assert_eq!(v.histogram(Hist::Ttft).0, 2);
    assert_eq!(v.histogram(Hist::Itl).0, 8);
    // queue + inference = e2e, prefill + decode = inference: one clock, vLLM's boundaries.
    let sum = |h| v.histogram(h).1;
    assert!((sum(Hist::QueueTime) + sum(Hist::InferenceTime) - sum(Hist::E2e)).abs() < 1e-9);
    assert!((sum(Hist::PrefillTime) + sum(Hist::DecodeTime) - sum(Hist::InferenceTime)).abs() < 1e-9);
    assert!(sum(Hist::DecodeTime) > 0.0 && sum(Hist::PrefillTime) > 0.0);
    let tpot = v.histogram(Hist::TimePerOutputToken);
    assert_eq!(tpot.0, 2);
    assert!((tpot.1 - sum(Hist::DecodeTime) / 4.0).abs() < 1e-9, "decode time over the 4 tokens after the first");
    let text = metrics.render();
    assert!(text.contains("vllm:request_prompt_tokens_bucket{engine=\"0\",le=\"50.0\",model_name=\"m\"} 2.0\n"));
    assert!(text.contains(
        "vllm:prompt_tokens_by_source_total{engine=\"0\",model_name=\"m\",source=\"local_cache_hit\"} 32.0\n"
    ));
    shutdown.cancel();
    task.await.expect("engine loop ends");
}
