//! Routing micro-benchmarks (BENCHMARK.md), on the spoke's own code:
//! - the decision: [`SpokeBackend::place`] — block hashes, one KV-index walk, the snapshot of
//!   64 live workers, the policy engine, the booking and the ranked targets — with
//!   1.024 × 10^6 indexed blocks, for a 16k-token prompt (tokenization is timed by the
//!   tokenizer's and the front door's benches);
//! - KV-event ingest: the subscriber's [`Applier`] (wire decode, normalise, count, apply) on
//!   batches shaped like vLLM's, until the index has applied every event.

use std::hint::black_box;
use std::sync::Arc;
use std::time::Instant;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use serde_json::Map;
use switchyard_gateway::InferenceRequest;
use switchyard_gateway::request::{Dialect, Prompt, TextPrompt};
use switchyard_sim::engine::KvEvent;
use switchyard_sim::wire::{WireFormat, encode_batch};
use switchyard_spoke::http::{SetPrompt, SpokeBackend};
use switchyard_spoke::index::KvIndex;
use switchyard_spoke::kv_subscriber::{Applier, KvStats, SubscriberSpec};

mod common;

const WORKERS: u32 = 64;
const BLOCK: u32 = 16;
/// 1,024 sequences of 1,000 blocks (16,000 tokens) = 1.024 × 10^6 indexed blocks.
const SEQUENCES: u32 = 1_024;
const BLOCKS_PER_SEQ: u32 = 1_000;

fn seq_tokens(seq: u32) -> Vec<u32> {
    (0..BLOCKS_PER_SEQ * BLOCK).map(|i| seq * 100_000 + i).collect()
}

fn applier(worker_id: u64, index: Arc<KvIndex>) -> Applier {
    let spec = SubscriberSpec {
        worker_id,
        endpoint: String::new(),
        replay: None,
        topic: String::new(),
        max_message_bytes: u64::MAX,
    };
    Applier::new(spec, index, Arc::new(KvStats::default()))
}

fn percentile(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * p).round() as usize]
}

fn bench_decision(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    let (fleet, spoke, dir) = rt.block_on(common::fleet_and_spoke(WORKERS, false));
    let backend = SpokeBackend(spoke.app.clone());
    let set = spoke.app.registry.set("s").expect("worker set");
    let mut ids: Vec<(switchyard_core::Name, u64)> =
        spoke.app.registry.workers().iter().map(|w| (w.key.worker.clone(), w.id)).collect();
    ids.sort_by_key(|(name, _)| name[1..].parse::<u32>().unwrap_or(0));
    assert_eq!(ids.len(), WORKERS as usize);

    // Fill the index through the subscriber's path, as the workers' events would.
    let mut appliers: Vec<Applier> = ids.iter().map(|(_, id)| applier(*id, set.index.clone())).collect();
    for seq in 0..SEQUENCES {
        let w = (seq % WORKERS) as usize;
        let ev = KvEvent::BlockStored {
            block_hashes: (0..u64::from(BLOCKS_PER_SEQ)).map(|b| (u64::from(seq) << 20) | (b + 1)).collect(),
            parent_block_hash: None,
            token_ids: seq_tokens(seq),
            block_size: BLOCK,
        };
        assert!(appliers[w].apply(u64::from(seq / WORKERS), &encode_batch(0.0, &[ev], 0, WireFormat::Current)));
    }
    rt.block_on(set.index.flush());

    // A request sharing 700 of its 1,000 blocks with sequence 7 (on w7).
    let mut tokens = seq_tokens(7);
    for t in tokens.iter_mut().skip(700 * BLOCK as usize) {
        *t += 1;
    }
    let holder = ids[7].1;
    assert_eq!(set.index.lookup(&set.index.hashes(&tokens)).indexed.get(&holder), Some(&700), "the index holds it");
    let topo = spoke.app.topology.borrow().clone();
    let sets = vec!["s".to_owned()];
    let prompts =
        vec![SetPrompt { set: "s".into(), digest: blake3::hash(b"not timed"), tokens, body: Arc::new(Map::new()) }];
    let req =
        Arc::new(InferenceRequest::new(Dialect::OpenAi, "sim-model", Prompt::Text(TextPrompt::Tokens(Vec::new()))));
    let place = || {
        let routed = backend.place(&topo, &req, &sets, &prompts).expect("routed");
        // Dropping the targets releases the booking, as a request that never dispatched.
        routed.targets.first().map(|t| t.label() == "s/w7").unwrap_or(false)
    };
    assert!(place(), "the holder is chosen");

    // p50/p99 over individually timed decisions (criterion reports the mean's distribution),
    // after criterion's own warm-up time: a spoke routes in its steady state, once the heap
    // and caches have settled after the index was filled.
    let warm_up = Instant::now();
    while warm_up.elapsed() < std::time::Duration::from_secs(3) {
        black_box(place());
    }
    let mut samples: Vec<f64> = (0..20_000)
        .map(|_| {
            let t = Instant::now();
            black_box(place());
            t.elapsed().as_secs_f64() * 1e6
        })
        .collect();
    println!(
        "decision (SpokeBackend::place) with 1.024e6 indexed blocks over 64 workers, 16k-token prompt: \
         p50 {:.1} us, p90 {:.1} us, p99 {:.1} us, p99.9 {:.1} us",
        percentile(&mut samples, 0.5),
        percentile(&mut samples, 0.9),
        percentile(&mut samples, 0.99),
        percentile(&mut samples, 0.999)
    );
    c.bench_function("spoke/decision-1e6-blocks-64-workers", |b| b.iter(place));
    rt.block_on(async {
        spoke.shutdown().await;
        fleet.shutdown().await;
    });
    let _ = std::fs::remove_dir_all(dir);
}

fn bench_ingest(c: &mut Criterion) {
    // Batches shaped like a scheduler step: four BlockStored events of 32 blocks each and,
    // after the first, a removal of 8 blocks.
    let batches: Vec<Vec<u8>> = (0..200u32)
        .map(|i| {
            let mut events = Vec::new();
            for j in 0..4u32 {
                let s = i * 4 + j;
                events.push(KvEvent::BlockStored {
                    block_hashes: (0..32u64).map(|b| (u64::from(s) << 16) | (b + 1)).collect(),
                    parent_block_hash: None,
                    token_ids: (0..32 * BLOCK).map(|t| s * 10_000 + t).collect(),
                    block_size: BLOCK,
                });
            }
            if i > 0 {
                events.push(KvEvent::BlockRemoved {
                    block_hashes: (0..8u64).map(|b| (u64::from((i - 1) * 4) << 16) | (b + 1)).collect(),
                });
            }
            encode_batch(0.0, &events, 0, WireFormat::Current)
        })
        .collect();
    let block_events_per_pass: u64 = 200 * 4 * 32 + 199 * 8;
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let mut group = c.benchmark_group("spoke/kv-ingest");
    group.throughput(Throughput::Elements(block_events_per_pass));
    group.bench_function("applier-block-events", |b| {
        b.iter(|| {
            let index = Arc::new(KvIndex::new(BLOCK));
            let mut applier = applier(1, index.clone());
            for (seq, p) in batches.iter().enumerate() {
                assert!(applier.apply(seq as u64, p));
            }
            rt.block_on(index.flush());
        })
    });
    group.finish();
}

criterion_group!(benches, bench_decision, bench_ingest);
criterion_main!(benches);
