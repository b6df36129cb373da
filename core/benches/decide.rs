//! One decision over 64 workers (4 worker sets × 16) and 4 provider models, through an
//! alias that spans every pool and a policy with a filter and a preference.

use std::collections::BTreeMap;
use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use switchyard_core::Name;
use switchyard_core::decide;
use switchyard_core::fleet::{
    Alias, FleetConfig, Match, Objective, OnEmpty, Policy, Pool, Provider, ProviderKind, ProviderMember, ProviderModel,
    PublicModel, Step, TokenPrices, WorkerSet,
};
use switchyard_core::money::MicroUsd;
use switchyard_core::predictor::TtftModel;
use switchyard_core::request::{RequestFeatures, WorkerKey};
use switchyard_core::snapshot::{FleetSnapshot, WorkerState};

fn fleet() -> (FleetConfig, FleetSnapshot, RequestFeatures) {
    let mut cfg = FleetConfig::default();
    let mut snapshot = FleetSnapshot::default();
    let mut cached = BTreeMap::new();
    for s in 0..4u32 {
        let ws = format!("set-{s}");
        let provider = format!("provider-{s}");
        let workers: Vec<Name> = (0..16).map(|w| format!("worker-{w}").into()).collect();
        for (i, w) in workers.iter().enumerate() {
            let key = WorkerKey { worker_set: ws.as_str().into(), worker: w.clone() };
            let i = i as u32;
            snapshot.workers.insert(
                key.clone(),
                WorkerState {
                    healthy: true,
                    waiting_requests: (i * 7 + s) % 5,
                    running_requests: (i * 13 + s) % 40,
                    waiting_prefill_tokens: None,
                    kv_cache_usage_percent: f64::from((i * 17 + s * 3) % 100),
                    ttft: None,
                    outlook: None,
                    held_requests: 0,
                },
            );
            if i.is_multiple_of(3) {
                cached.insert(key, 1024 * (i % 8));
            }
        }
        cfg.worker_sets.insert(
            ws.clone(),
            WorkerSet {
                name: ws.as_str().into(),
                served_model: format!("engine-{s}").into(),
                cluster: format!("cluster-{}", s % 2),
                region: Some("us-east-1".into()),
                workers,
                kv_block_size: 16,
                hourly_cost: MicroUsd(1_850_000),
                decode_tokens_per_sec: 1500.0,
                ttft: TtftModel::default(),
                engine: Default::default(),
                replicate_engines: false,
                paced: false,
            },
        );
        let models =
            [("m".to_owned(), ProviderModel { provider_model_id: format!("id-{s}"), prices: TokenPrices::default() })]
                .into_iter()
                .collect();
        cfg.providers.insert(
            provider.clone(),
            Provider {
                name: provider.clone(),
                kind: ProviderKind::Bedrock,
                external: true,
                region: None,
                models,
                expected_ttft_ms: 900.0,
                connection: Default::default(),
            },
        );
        let pool = format!("pool-{s}");
        cfg.pools.insert(
            pool.clone(),
            Pool {
                name: pool.as_str().into(),
                worker_sets: vec![ws],
                providers: vec![ProviderMember { provider, model: "m".into() }],
            },
        );
        cfg.models.insert(format!("model-{s}"), PublicModel { name: format!("model-{s}").into(), pool });
    }
    cfg.aliases.insert(
        "standard-model".into(),
        Alias { name: "standard-model".into(), targets: (0..4).map(|s| format!("model-{s}")).collect() },
    );
    cfg.policies.push(Policy {
        name: "bench".into(),
        priority: 0,
        matcher: Match { models: vec!["standard-model".into()], ..Match::default() },
        steps: vec![
            Step::MaxWaitingRequests { max: 3 },
            Step::KvCacheUsageBelow { percent: 90 },
            Step::PreferModel { model: "model-1".into(), unless_cached_sooner: true },
        ],
        minimize: Objective::PredictedTtft,
        on_empty: OnEmpty::Fallback,
    });
    let req = RequestFeatures {
        model: "standard-model".into(),
        prompt_tokens: 8192,
        cached_tokens: cached,
        tie_breaker: 42,
        ..RequestFeatures::default()
    };
    (cfg, snapshot, req)
}

fn bench(c: &mut Criterion) {
    let (cfg, snapshot, req) = fleet();
    let d = decide(&cfg, &snapshot, &req);
    assert!(matches!(d.outcome, switchyard_core::Outcome::Route { .. }));
    c.bench_function("decide/64-workers-4-providers", |b| {
        b.iter(|| decide(black_box(&cfg), black_box(&snapshot), black_box(&req)))
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
