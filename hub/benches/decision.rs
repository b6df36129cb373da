//! The hub's cluster decision (BENCHMARK.md, issue 14): for one prompt, the prompt's engine
//! blocks hashed and re-blocked at the coarse grain, one walk of the cross-cluster prefix
//! index holding 1.048 × 10^6 (worker set, coarse block) entries over 64 cluster worker sets,
//! the snapshot of the 64 live sets, and the policy engine's decision — the functions
//! `HubBackend::plan_once` calls ([`route::cached_tokens`], [`route::snapshot`],
//! `plan::features`, `plan::plan`). The index is filled through [`PrefixIndex::apply`] with
//! the reports spokes would send.

use std::collections::HashMap;
use std::hint::black_box;
use std::time::Instant;

use criterion::{Criterion, criterion_group, criterion_main};
use dynamo_kv_router::protocols::{BlockHashOptions, compute_block_hash_for_seq};
use switchyard_core::engine::{Outcome, Target};
use switchyard_gateway::plan;
use switchyard_hub::fleet::LiveCluster;
use switchyard_hub::prefix::PrefixIndex;
use switchyard_hub::prompt::SetTokens;
use switchyard_hub::route::{cached_tokens, cluster_fleet, snapshot};
use switchyard_proto::coarse::{DEFAULT_FACTOR, chained, local_hashes};
use switchyard_proto::v1::{CoarseBlock, CoarseBlocks, CoarseReport, WorkerSetInfo, WorkerSetLoad};

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const SETS: usize = 64;
const BLOCK: u32 = 16;
/// 4,096 prefixes of 16 coarse blocks (4,096 tokens), each held by 16 of the 64 sets:
/// 4,096 × 16 × 16 = 1,048,576 entries.
const PREFIXES: u32 = 4_096;
const COARSE_PER_PREFIX: u32 = 16;
const HOLDERS: usize = 16;

fn prefix_tokens(p: u32) -> Vec<u32> {
    (0..COARSE_PER_PREFIX * DEFAULT_FACTOR * BLOCK).map(|i| p * 100_000 + i).collect()
}

fn coarse_chain(tokens: &[u32]) -> Vec<CoarseBlock> {
    let blocks: Vec<u64> =
        compute_block_hash_for_seq(tokens, BLOCK, BlockHashOptions::default()).into_iter().map(|h| h.0).collect();
    chained(&local_hashes(&blocks, DEFAULT_FACTOR))
}

fn fleet_yaml() -> String {
    let mut docs = Vec::new();
    for i in 0..SETS {
        docs.push(format!(
            "apiVersion: switchyard.dev/v1alpha1\nkind: InferenceWorkerSet\nmetadata: {{name: s{i}}}\n\
             spec: {{model: m, cluster: c{i}, kvBlockSize: {BLOCK}, endpoints: {{static: [{{name: w0, host: 127.0.0.1, httpPort: {}}}]}}}}\n",
            1000 + i
        ));
    }
    let members: Vec<String> = (0..SETS).map(|i| format!("{{workerSet: s{i}}}")).collect();
    docs.push(format!(
        "apiVersion: switchyard.dev/v1alpha1\nkind: InferencePool\nmetadata: {{name: p}}\nspec: {{members: [{}]}}\n",
        members.join(", ")
    ));
    docs.push(
        "apiVersion: switchyard.dev/v1alpha1\nkind: GatewayBackend\nmetadata: {name: b}\nspec: {models: [{name: m, pool: p}]}\n"
            .into(),
    );
    docs.join("---\n")
}

fn bench_decision(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let checked = switchyard_config::check_texts([("fleet.yaml", fleet_yaml().as_str())]);
    assert_eq!(checked.error_count(), 0, "{:?}", checked.diagnostics);
    let fleet = cluster_fleet(&checked.config);
    let live: Vec<LiveCluster> = (0..SETS)
        .map(|i| LiveCluster {
            cluster: format!("c{i}"),
            region: String::new(),
            worker_sets: vec![WorkerSetInfo {
                name: format!("s{i}"),
                served_model: "m".into(),
                kv_block_size: BLOCK,
                workers: 8,
                coarse_block_factor: DEFAULT_FACTOR,
            }],
            front_door_url: format!("http://127.0.0.1:{}", 2000 + i),
            load: vec![WorkerSetLoad {
                worker_set: format!("s{i}"),
                healthy_workers: 8,
                waiting_requests: (i % 5) as u32,
                running_requests: 8 + (i % 7) as u32,
                kv_usage_percent_mean: 40.0 + (i % 30) as f64,
                predicted_queue_wait_ms: 5.0 + (i % 11) as f64,
                prefill_tokens_per_second: 20_000.0,
                ..Default::default()
            }],
            reports: 1,
        })
        .collect();

    // Fill the index with the reports the 64 spokes would send.
    let index = PrefixIndex::new();
    let mut per_set: Vec<Vec<CoarseBlock>> = vec![Vec::new(); SETS];
    for p in 0..PREFIXES {
        let blocks = coarse_chain(&prefix_tokens(p));
        for k in 0..HOLDERS {
            per_set[(p as usize + k * (SETS / HOLDERS)) % SETS].extend(blocks.iter().cloned());
        }
    }
    let entries: usize = per_set.iter().map(Vec::len).sum();
    for (i, stored) in per_set.into_iter().enumerate() {
        let report = CoarseReport {
            worker_sets: vec![CoarseBlocks { worker_set: format!("s{i}"), reset: true, stored, removed: vec![] }],
        };
        rt.block_on(index.apply(&format!("c{i}"), &report));
    }

    // An 8,192-token prompt whose first 4,096 tokens are prefix 7 (held by 16 sets).
    let mut tokens = prefix_tokens(7);
    tokens.extend((0..4_096).map(|i| 900_000_000 + i));
    // Every set shares one tokenizer, so every set shares the prompt's tokens.
    let shared = std::sync::Arc::new(tokens.clone());
    let prompts: SetTokens = (0..SETS).map(|i| (format!("s{i}"), shared.clone())).collect();
    let holders = cached_tokens(&index, &live, &prompts);
    assert_eq!(holders.len(), HOLDERS, "{holders:?}");
    assert!(holders.values().all(|&n| n == 4_096), "{holders:?}");
    let sent = HashMap::new();
    let mut request_no = 0u64;
    let req = switchyard_gateway::InferenceRequest::new(
        switchyard_gateway::request::Dialect::OpenAi,
        "m",
        switchyard_gateway::request::Prompt::Text(switchyard_gateway::request::TextPrompt::Tokens(Vec::new())),
    );
    let mut decide = || {
        request_no += 1;
        let cached = cached_tokens(&index, &live, &prompts);
        let snap = snapshot(&fleet, &live, &sent);
        let features = plan::features(&req, tokens.len() as u32, cached, request_no);
        match plan::plan(&fleet, &snap, &features).outcome {
            Outcome::Route { target: Target::Worker { worker, .. } } => worker,
            other => panic!("{other:?}"),
        }
    };
    let chosen = decide();
    assert!(holders.keys().any(|k| k.worker == chosen), "a holder is chosen, not {chosen}");

    let warm_up = Instant::now();
    while warm_up.elapsed() < std::time::Duration::from_secs(3) {
        black_box(decide());
    }
    let mut samples: Vec<f64> = (0..20_000)
        .map(|_| {
            let t = Instant::now();
            black_box(decide());
            t.elapsed().as_secs_f64() * 1e6
        })
        .collect();
    samples.sort_by(f64::total_cmp);
    let q = |p: f64| samples[((samples.len() - 1) as f64 * p).round() as usize];
    println!(
        "hub decision with {entries} coarse entries over {SETS} cluster worker sets, 8,192-token prompt: \
         p50 {:.1} us, p90 {:.1} us, p99 {:.1} us, p99.9 {:.1} us",
        q(0.5),
        q(0.9),
        q(0.99),
        q(0.999)
    );
    c.bench_function("hub/decision-1e6-coarse-blocks-64-sets", |b| b.iter(&mut decide));
    // Its parts, to see where the time goes.
    c.bench_function("hub/decision-part-prefix-lookup", |b| b.iter(|| cached_tokens(&index, &live, &prompts)));
    c.bench_function("hub/decision-part-snapshot", |b| b.iter(|| snapshot(&fleet, &live, &sent)));
}

criterion_group!(benches, bench_decision);
criterion_main!(benches);
