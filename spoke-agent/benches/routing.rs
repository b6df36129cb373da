//! Routing micro-benchmarks (BENCHMARK.md): the decision with 10^6 indexed blocks over 64
//! workers, and KV-event ingest (wire decode + index apply).

use std::collections::BTreeMap;
use std::hint::black_box;
use std::time::Instant;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use dynamo_kv_router::protocols::WorkerWithDpRank;
use dynamo_kv_router::zmq_wire::{ZmqEventNormalizer, decode_event_batch};
use switchyard_core::fleet::{FleetConfig, Pool, PublicModel, WorkerSet};
use switchyard_core::money::MicroUsd;
use switchyard_core::predictor::TtftModel;
use switchyard_core::request::WorkerKey;
use switchyard_core::snapshot::FleetSnapshot;
use switchyard_gateway::request::{Dialect, Prompt, TextPrompt};
use switchyard_gateway::{InferenceRequest, plan};
use switchyard_sim::engine::KvEvent;
use switchyard_sim::wire::{WireFormat, encode_batch};
use switchyard_spoke::index::KvIndex;

const WORKERS: u64 = 64;
const BLOCK: u32 = 16;
/// 1,024 sequences of 1,000 blocks (16,000 tokens) = 1.024 × 10^6 indexed blocks.
const SEQUENCES: u32 = 1_024;
const BLOCKS_PER_SEQ: u32 = 1_000;

fn seq_tokens(seq: u32) -> Vec<u32> {
    (0..BLOCKS_PER_SEQ * BLOCK).map(|i| seq * 100_000 + i).collect()
}

/// Fills an index through the real wire path: encode as vLLM would, decode, normalise, apply.
fn filled_index() -> KvIndex {
    let index = KvIndex::new(BLOCK);
    let mut normalizers: Vec<ZmqEventNormalizer> = (0..WORKERS).map(|_| ZmqEventNormalizer::new(BLOCK)).collect();
    let mut event_id = 0;
    for seq in 0..SEQUENCES {
        let worker = u64::from(seq) % WORKERS;
        let tokens = seq_tokens(seq);
        let hashes: Vec<u64> = (0..u64::from(BLOCKS_PER_SEQ)).map(|b| (u64::from(seq) << 20) | (b + 1)).collect();
        let ev = KvEvent::BlockStored {
            block_hashes: hashes,
            parent_block_hash: None,
            token_ids: tokens,
            block_size: BLOCK,
        };
        let payload = encode_batch(0.0, &[ev], 0, WireFormat::Current);
        let batch = decode_event_batch(&payload).expect("decodes");
        for raw in batch.events {
            event_id += 1;
            if let Some(e) = normalizers[worker as usize]
                .normalize(raw, event_id, WorkerWithDpRank::new(worker + 1, 0))
                .and_then(|p| p.into_router_event())
            {
                index.apply(e);
            }
        }
    }
    index
}

fn fleet() -> (FleetConfig, FleetSnapshot) {
    let mut cfg = FleetConfig::default();
    let workers: Vec<String> = (1..=WORKERS).map(|w| format!("w{w}")).collect();
    let views: Vec<(WorkerKey, plan::WorkerView)> = workers
        .iter()
        .enumerate()
        .map(|(i, w)| {
            let view = plan::WorkerView {
                healthy: true,
                engine_waiting: (i % 4) as u32,
                engine_running: (i % 9) as u32,
                kv_usage: (i % 80) as f64 / 100.0,
                ..plan::WorkerView::default()
            };
            (WorkerKey { worker_set: "set".into(), worker: w.clone() }, view)
        })
        .collect();
    let snap = plan::snapshot(views.iter().map(|(k, v)| (k.clone(), v)));
    cfg.worker_sets.insert(
        "set".into(),
        WorkerSet {
            name: "set".into(),
            served_model: "m".into(),
            cluster: "c".into(),
            region: None,
            workers,
            kv_block_size: BLOCK,
            hourly_cost: MicroUsd(1_000_000),
            decode_tokens_per_sec: 1000.0,
            ttft: TtftModel::default(),
        },
    );
    cfg.pools.insert("pool".into(), Pool { name: "pool".into(), worker_sets: vec!["set".into()], providers: vec![] });
    cfg.models.insert("m".into(), PublicModel { name: "m".into(), pool: "pool".into() });
    (cfg, snap)
}

/// One routing decision as the spoke makes it after tokenisation: block hashes, index lookup,
/// snapshot + cached tokens, policy engine.
fn route(
    index: &KvIndex,
    cfg: &FleetConfig,
    snap: &FleetSnapshot,
    req: &InferenceRequest,
    tokens: &[u32],
    n: u64,
) -> bool {
    let hashes = index.hashes(tokens);
    let overlaps = index.overlaps(&hashes);
    let cached: BTreeMap<WorkerKey, u32> = overlaps
        .iter()
        .map(|(w, b)| (WorkerKey { worker_set: "set".into(), worker: format!("w{w}") }, b * BLOCK))
        .collect();
    let features = plan::features(req, tokens.len() as u32, cached, n);
    matches!(plan::plan(cfg, snap, &features).outcome, switchyard_core::Outcome::Route { .. })
}

fn percentile(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * p).round() as usize]
}

fn bench_decision(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let index = filled_index();
    rt.block_on(index.flush());
    let (cfg, snap) = fleet();
    let req = InferenceRequest::new(Dialect::OpenAi, "m", Prompt::Text(TextPrompt::Tokens(Vec::new())));
    // A request sharing 700 of its 1,000 blocks with sequence 7 (on worker 8).
    let mut tokens = seq_tokens(7);
    for t in tokens.iter_mut().skip(700 * BLOCK as usize) {
        *t += 1;
    }
    assert!(route(&index, &cfg, &snap, &req, &tokens, 0));
    assert_eq!(index.indexed_overlap(8, &index.hashes(&tokens)), 700, "the index holds the sequence");
    // p50/p99 over individually timed decisions (criterion reports the mean distribution).
    let mut samples: Vec<f64> = (0..2_000)
        .map(|n| {
            let t = Instant::now();
            black_box(route(&index, &cfg, &snap, &req, &tokens, n));
            t.elapsed().as_secs_f64() * 1e6
        })
        .collect();
    println!(
        "decision with 1.024e6 indexed blocks over 64 workers, 16k-token request: p50 {:.1} us, p99 {:.1} us",
        percentile(&mut samples, 0.5),
        percentile(&mut samples, 0.99)
    );
    let mut n = 0;
    c.bench_function("spoke/decision-1e6-blocks-64-workers", |b| {
        b.iter(|| {
            n += 1;
            route(&index, &cfg, &snap, &req, &tokens, n)
        })
    });
}

fn bench_ingest(c: &mut Criterion) {
    // Batches shaped like a scheduler step: a few BlockStored events of 32 blocks and removals.
    let batches: Vec<Vec<u8>> = (0..200u32)
        .map(|i| {
            let mut events = Vec::new();
            for j in 0..4u32 {
                let s = i * 4 + j;
                let tokens: Vec<u32> = (0..32 * BLOCK).map(|t| s * 10_000 + t).collect();
                let hashes: Vec<u64> = (0..32u64).map(|b| (u64::from(s) << 16) | (b + 1)).collect();
                events.push(KvEvent::BlockStored {
                    block_hashes: hashes,
                    parent_block_hash: None,
                    token_ids: tokens,
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
    let events_per_pass: u64 = 200 * 4 + 199;
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let mut group = c.benchmark_group("spoke/kv-ingest");
    group.throughput(Throughput::Elements(events_per_pass));
    group.bench_function("decode+normalize+apply", |b| {
        b.iter(|| {
            let index = KvIndex::new(BLOCK);
            let mut normalizer = ZmqEventNormalizer::new(BLOCK);
            let mut id = 0;
            for p in &batches {
                let batch = decode_event_batch(p).expect("decodes");
                for raw in batch.events {
                    id += 1;
                    if let Some(e) =
                        normalizer.normalize(raw, id, WorkerWithDpRank::new(1, 0)).and_then(|p| p.into_router_event())
                    {
                        index.apply(e);
                    }
                }
            }
            rt.block_on(index.flush());
        })
    });
    group.finish();
}

criterion_group!(benches, bench_decision, bench_ingest);
criterion_main!(benches);
