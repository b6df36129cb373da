//! Property tests of the decision engine over random fleets, policies, states and requests.
//!
//! Each case is built from a proptest-chosen seed by a small deterministic generator, so a
//! failure prints the seed that reproduces it. The properties are checked against an
//! independent re-statement of the filters, not against the engine's own trace.

use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;
use switchyard_core::engine::{Outcome, Target};
use switchyard_core::fleet::{
    Alias, FleetConfig, Match, Objective, OnEmpty, Policy, Pool, Provider, ProviderKind, ProviderMember, ProviderModel,
    PublicModel, Step, TokenPrices, WorkerSet,
};
use switchyard_core::money::MicroUsd;
use switchyard_core::predictor::TtftModel;
use switchyard_core::replica::{EngineShape, Outlook, Replica, Sent, StepCost};
use switchyard_core::request::{Complexity, PII_TAG, RequestClass, RequestFeatures, WorkerKey};
use switchyard_core::snapshot::{FleetSnapshot, ProviderState, WorkerState};
use switchyard_core::{Decision, decide};

/// SplitMix64: a tiny deterministic generator driven by the proptest seed.
struct Gen(u64);

impl Gen {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len() as u64) as usize]
    }
    fn subset(&mut self, items: &[String], percent: u64) -> Vec<String> {
        items.iter().filter(|_| self.chance(percent)).cloned().collect()
    }
}

const REGIONS: [&str; 3] = ["us-east-1", "us-west-2", "eu-west-1"];

struct Case {
    cfg: FleetConfig,
    snapshot: FleetSnapshot,
    req: RequestFeatures,
}

fn build(seed: u64) -> Case {
    let mut g = Gen(seed);
    let mut cfg = FleetConfig::default();
    for s in 0..1 + g.below(4) {
        let name = format!("ws{s}");
        let workers = (0..1 + g.below(4)).map(|w| format!("w{w}").into()).collect();
        cfg.worker_sets.insert(
            name.clone(),
            WorkerSet {
                name: name.into(),
                served_model: format!("engine-model-{}", g.below(3)).into(),
                cluster: format!("c{}", g.below(2)),
                region: g.chance(80).then(|| (*g.pick(&REGIONS)).into()),
                workers,
                kv_block_size: 16,
                hourly_cost: MicroUsd(g.below(5_000_000)),
                decode_tokens_per_sec: 500.0 + g.below(4000) as f64,
                ttft: TtftModel {
                    prefill_tokens_per_sec: 1000.0 + g.below(20_000) as f64,
                    base_ms: g.below(50) as f64,
                    queued_request_ms: g.below(500) as f64,
                    decode_interference: g.below(10) as f64 / 100.0,
                },
                engine: Default::default(),
                replicate_engines: false,
                paced: false,
            },
        );
    }
    for p in 0..g.below(4) {
        let name = format!("prov{p}");
        let models = (0..1 + g.below(2))
            .map(|m| {
                let prices = TokenPrices {
                    input_per_million: MicroUsd(g.below(3_000_000)),
                    output_per_million: MicroUsd(g.below(9_000_000)),
                    cached_input_per_million: MicroUsd::ZERO,
                    cache_write_input_per_million: MicroUsd::ZERO,
                };
                (format!("pm{m}"), ProviderModel { provider_model_id: format!("id-{m}"), prices })
            })
            .collect();
        cfg.providers.insert(
            name.clone(),
            Provider {
                name,
                kind: if g.chance(50) { ProviderKind::Bedrock } else { ProviderKind::OpenAi },
                external: g.chance(75),
                region: g.chance(80).then(|| g.pick(&REGIONS).to_string()),
                models,
                expected_ttft_ms: g.below(3000) as f64,
                connection: Default::default(),
            },
        );
    }
    let ws_names: Vec<String> = cfg.worker_sets.keys().cloned().collect();
    let provider_members: Vec<ProviderMember> = cfg
        .providers
        .values()
        .flat_map(|p| p.models.keys().map(|m| ProviderMember { provider: p.name.clone(), model: m.clone() }))
        .collect();
    let mut public = Vec::new();
    for m in 0..1 + g.below(3) {
        let pool_name = format!("pool{m}");
        let mut worker_sets = g.subset(&ws_names, 50);
        if worker_sets.is_empty() && g.chance(80) {
            worker_sets.push(g.pick(&ws_names).clone());
        }
        let providers = provider_members.iter().filter(|_| g.chance(50)).cloned().collect();
        cfg.pools.insert(pool_name.clone(), Pool { name: pool_name.as_str().into(), worker_sets, providers });
        let model = format!("model{m}");
        cfg.models.insert(model.clone(), PublicModel { name: model.as_str().into(), pool: pool_name });
        public.push(model);
    }
    let mut alias_targets = g.subset(&public, 60);
    if alias_targets.is_empty() {
        alias_targets.push(public[0].clone());
    }
    cfg.aliases.insert("alias".into(), Alias { name: "alias".into(), targets: alias_targets });
    let mut requestable = public.clone();
    requestable.push("alias".into());

    let tags = vec![PII_TAG.to_owned(), "x".to_owned()];
    for p in 0..g.below(5) {
        let steps = (0..g.below(4))
            .map(|_| match g.below(5) {
                0 => Step::ExcludeExternal,
                1 => Step::RequireRegions { regions: g.subset(&REGIONS.map(String::from), 60) },
                2 => Step::MaxWaitingRequests { max: g.below(5) as u32 },
                3 => Step::KvCacheUsageBelow { percent: 1 + g.below(100) as u32 },
                _ => Step::PreferModel { model: g.pick(&public).clone(), unless_cached_sooner: g.chance(50) },
            })
            .collect();
        cfg.policies.push(Policy {
            name: format!("pol{p}"),
            priority: g.below(5) as i32,
            matcher: Match {
                models: g.subset(&requestable, 30),
                tenants: if g.chance(20) { vec!["t0".into()] } else { vec![] },
                tags: g.subset(&tags, 30),
                class: match g.below(3) {
                    0 => Some(RequestClass::Batch),
                    1 => Some(RequestClass::Interactive),
                    _ => None,
                },
                complexity: if g.chance(30) { vec![Complexity::Low] } else { vec![] },
            },
            steps,
            minimize: if g.chance(50) { Objective::PredictedTtft } else { Objective::Cost },
            on_empty: *g.pick(&[OnEmpty::Reject, OnEmpty::Fallback, OnEmpty::Queue]),
        });
    }
    cfg.sort_policies();

    let mut snapshot = FleetSnapshot::default();
    let mut cached = BTreeMap::new();
    let prompt_tokens = g.below(20_000) as u32;
    for ws in cfg.worker_sets.values() {
        for w in &ws.workers {
            let key = WorkerKey { worker_set: ws.name.clone(), worker: w.clone() };
            if g.chance(10) {
                continue; // unknown worker
            }
            snapshot.workers.insert(
                key.clone(),
                WorkerState {
                    healthy: g.chance(85),
                    waiting_requests: g.below(8) as u32,
                    running_requests: g.below(40) as u32,
                    waiting_prefill_tokens: g.chance(30).then(|| g.below(50_000)),
                    kv_cache_usage_percent: g.below(1001) as f64 / 10.0,
                    ttft: None,
                    outlook: g.chance(50).then(|| replica_outlook(&mut g)),
                    held_requests: 0,
                },
            );
            if g.chance(40) {
                cached.insert(key, g.below(u64::from(prompt_tokens) + 100) as u32);
            }
        }
    }
    for p in cfg.providers.keys() {
        if g.chance(30) {
            snapshot.providers.insert(p.clone(), ProviderState { available: g.chance(50) });
        }
    }
    let model = if g.chance(5) { "unknown-model".to_owned() } else { g.pick(&requestable).clone() };
    let req = RequestFeatures {
        model,
        tenant: g.chance(50).then(|| format!("t{}", g.below(2))),
        tags: g.subset(&tags, 40).into_iter().collect::<BTreeSet<_>>(),
        class: if g.chance(40) { RequestClass::Batch } else { RequestClass::Interactive },
        complexity: match g.below(4) {
            0 => Some(Complexity::Low),
            1 => Some(Complexity::Medium),
            2 => Some(Complexity::High),
            _ => None,
        },
        prompt_tokens,
        max_output_tokens: g.chance(50).then(|| g.below(2000) as u32),
        cached_tokens: cached,
        tie_breaker: g.next(),
        block_keys: (0..g.below(1_300)).map(|_| g.below(4)).collect(),
    };
    Case { cfg, snapshot, req }
}

/// A replica with a random load and cost, some of it degenerate.
fn replica_outlook(g: &mut Gen) -> Outlook {
    let shape = EngineShape {
        block_size: 16,
        num_blocks: 1 + g.below(12_000) as u32,
        max_num_seqs: 1 + g.below(64) as u32,
        max_num_batched_tokens: 1 + g.below(8_192) as u32,
    };
    let cost = StepCost {
        base_ms: g.below(50) as f64,
        prefill_ms_per_token: g.below(100) as f64 / 100.0,
        decode_ms_per_seq: if g.chance(5) { f64::NAN } else { g.below(100) as f64 / 100.0 },
        attention_ms_per_ktoken: g.below(10) as f64 / 100.0,
        request_ms: g.below(100) as f64,
    };
    let mut replica = Replica::new(shape, cost);
    let mut now = 0.0;
    for id in 0..g.below(12) {
        now += g.below(2_000) as f64;
        let prompt_tokens = g.below(20_000) as u32;
        let sent = Sent {
            id,
            prompt_tokens,
            cached_tokens: g.below(u64::from(prompt_tokens) + 1) as u32,
            prefix: g.below(4),
            max_tokens: 1 + g.below(400) as u32,
        };
        replica.dispatch(sent, now);
    }
    Outlook::new(std::sync::Arc::new(replica), now + g.below(5_000) as f64)
}

/// Local workers that an independent reading of the policy's filters lets through.
fn surviving_local_workers(case: &Case, policy: Option<&Policy>) -> Vec<WorkerKey> {
    let Case { cfg, snapshot, req } = case;
    let Ok(models) = switchyard_core::resolve::expand(cfg, &req.model) else { return Vec::new() };
    let mut out = Vec::new();
    for m in models {
        let pool = &cfg.pools[&cfg.models[&m].pool];
        for ws_name in &pool.worker_sets {
            let ws = &cfg.worker_sets[ws_name];
            for w in &ws.workers {
                let key = WorkerKey { worker_set: ws.name.clone(), worker: w.clone() };
                let Some(st) = snapshot.workers.get(&key) else { continue };
                let passes = st.healthy
                    && policy.is_none_or(|p| {
                        p.steps.iter().all(|s| match s {
                            Step::MaxWaitingRequests { max } => st.waiting_requests <= *max,
                            Step::KvCacheUsageBelow { percent } => st.kv_cache_usage_percent < f64::from(*percent),
                            Step::RequireRegions { regions } => {
                                ws.region.as_ref().is_some_and(|r| regions.iter().any(|allowed| **allowed == **r))
                            }
                            Step::ExcludeExternal | Step::PreferModel { .. } => true,
                        })
                    });
                if passes && !out.contains(&key) {
                    out.push(key);
                }
            }
        }
    }
    out
}

fn check(case: &Case) -> Result<Decision, TestCaseError> {
    let d = decide(&case.cfg, &case.snapshot, &case.req);
    prop_assert_eq!(&d, &decide(&case.cfg, &case.snapshot, &case.req), "decisions must be deterministic");
    let policy = case.cfg.policy_for(&case.req);
    let survivors = surviving_local_workers(case, policy);

    if let Outcome::Route { target: Target::Provider { provider, .. } } = &d.outcome {
        // 1. A pii request never goes to an external provider.
        prop_assert!(
            !(case.req.is_pii() && case.cfg.providers[provider].external),
            "pii request sent to external {provider}"
        );
        // 2. Spillover happens only when every local candidate was filtered out.
        prop_assert!(survivors.is_empty(), "spilled to {provider} while local workers {survivors:?} survived");
        prop_assert!(policy.is_none_or(
            |p| p.on_empty == OnEmpty::Fallback && !p.excludes_external() || !case.cfg.providers[provider].external
        ));
    }
    if let Outcome::Route { target: Target::Worker { worker_set, worker, .. } } = &d.outcome {
        let key = WorkerKey { worker_set: worker_set.clone(), worker: worker.clone() };
        prop_assert!(survivors.contains(&key), "routed to {key:?}, which the filters exclude");
        // 3. A batch request never lands at or above its policy's KV threshold.
        if case.req.class == RequestClass::Batch {
            let usage = case.snapshot.workers[&key].kv_cache_usage_percent;
            for s in policy.map(|p| p.steps.as_slice()).unwrap_or_default() {
                if let Step::KvCacheUsageBelow { percent } = s {
                    prop_assert!(usage < f64::from(*percent), "batch request on a worker at {usage}% >= {percent}%");
                }
            }
        }
    } else {
        // Any non-worker outcome means no local worker survived, unless the model is unknown.
        prop_assert!(survivors.is_empty(), "{:?} although {survivors:?} survived", d.outcome);
    }
    // 4. With onEmpty: Reject and no local candidate, the decision is a rejection.
    if policy.is_some_and(|p| p.on_empty == OnEmpty::Reject) && survivors.is_empty() {
        prop_assert!(matches!(d.outcome, Outcome::Reject { .. }), "expected a rejection, got {:?}", d.outcome);
    }
    Ok(d)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(4096))]

    #[test]
    fn engine_invariants_hold(seed in any::<u64>()) {
        check(&build(seed))?;
    }

    /// The same fleet with the request forced to carry `pii`: never external.
    #[test]
    fn pii_requests_never_leave(seed in any::<u64>()) {
        let mut case = build(seed);
        case.req.tags.insert(PII_TAG.to_owned());
        let d = check(&case)?;
        if let Outcome::Route { target: Target::Provider { provider, .. } } = &d.outcome {
            prop_assert!(!case.cfg.providers[provider].external);
        }
    }
}

/// The generator reaches every outcome, so the properties above are not vacuous.
#[test]
fn generator_covers_every_outcome() {
    let (mut worker, mut internal_provider, mut external_provider, mut reject, mut queue) = (0, 0, 0, 0, 0);
    for seed in 0..4000 {
        let case = build(seed);
        match decide(&case.cfg, &case.snapshot, &case.req).outcome {
            Outcome::Route { target: Target::Worker { .. } } => worker += 1,
            Outcome::Route { target: Target::Provider { provider, .. } } => {
                if case.cfg.providers[&provider].external {
                    external_provider += 1
                } else {
                    internal_provider += 1
                }
            }
            Outcome::Reject { .. } => reject += 1,
            Outcome::Queue { .. } => queue += 1,
        }
    }
    for (name, n) in [
        ("worker", worker),
        ("internal provider", internal_provider),
        ("external provider", external_provider),
        ("reject", reject),
        ("queue", queue),
    ] {
        assert!(n >= 40, "only {n} {name} outcomes in 4000 cases");
    }
}
