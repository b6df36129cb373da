//! The decision engine: a pure function from (fleet config, fleet snapshot, request) to a
//! [`Decision`].
//!
//! Evaluation order, each stage recorded in the decision's trace:
//!
//! 1. **resolve** the requested name (alias or public model) to public models and pools;
//! 2. gather **candidates**: every known, healthy worker of the pools' worker sets (local) and
//!    every available provider model of the pools (spillover);
//! 3. pick the **policy**: the first configured policy whose match accepts the request, else
//!    the default policy (no steps, `minimize: PredictedTTFT`, `onEmpty: Fallback`);
//! 4. apply the policy's **steps**: filters in declared order, then preferences in declared
//!    order (a preference only chooses among candidates that pass every filter);
//! 5. apply the **residency guard**: a `pii`-tagged request loses every external candidate,
//!    whatever the policy says;
//! 6. if local candidates survive, **rank** them by the objective and route to the best;
//!    otherwise follow **onEmpty**: reject, queue, or rank the surviving providers.
//!
//! Invariants: no I/O, no clock, no randomness beyond the request's `tie_breaker`; the same
//! inputs always give the same decision; a provider is only chosen when no local candidate
//! survived; a `pii` request is never routed to an external provider.

use std::fmt::{self, Write as _};

use serde::Serialize;

use crate::Name;
use crate::fleet::{DEFAULT_EXPECTED_OUTPUT_TOKENS, FleetConfig, Objective, OnEmpty, Policy, Step};
use crate::predictor::{TtftInputs, TtftPrediction};
use crate::request::{RequestFeatures, WorkerKey};
use crate::resolve::{self, ResolveError};
use crate::snapshot::FleetSnapshot;

/// Cache footprint in the PredictedTTFT ranking. A placement that prefills `p` ms of uncached
/// tokens scores `ttft + p × (COLD_PLACEMENT_WEIGHT + KV_PRESSURE_WEIGHT × kv_usage)`: the
/// blocks it writes occupy cache (evicting what other requests would reuse, more so on a
/// fuller cache) and duplicate a prefix another worker may already hold. A request that is
/// mostly cached is nearly unaffected. Without this term, equal predicted TTFTs — common when
/// a prefix's first request is still prefilling on the worker that will cache it — send
/// copies of the same prefix to every momentarily idle worker, and new prefixes pile onto
/// whichever worker happens to be idle.
pub const COLD_PLACEMENT_WEIGHT: f64 = 0.2;
/// See [`COLD_PLACEMENT_WEIGHT`].
pub const KV_PRESSURE_WEIGHT: f64 = 0.5;

/// Where a request is sent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "camelCase")]
pub enum Target {
    /// One vLLM worker.
    #[serde(rename_all = "camelCase")]
    Worker {
        /// Worker set name.
        worker_set: Name,
        /// Worker name.
        worker: Name,
        /// Model name to put in the request sent to the engine.
        served_model: Name,
    },
    /// An external provider model.
    #[serde(rename_all = "camelCase")]
    Provider {
        /// Provider name.
        provider: String,
        /// Fleet-side model name.
        model: String,
        /// The provider's model id.
        provider_model_id: String,
    },
}

/// Why a request was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum RejectReason {
    /// The requested model or alias does not exist.
    ModelNotFound,
    /// An alias chain loops (only possible with an unvalidated config).
    AliasCycle,
    /// The policy's steps left no local candidate and `onEmpty` is `Reject`.
    NoLocalCapacity,
    /// Spillover was allowed but no provider candidate survived (residency, filters or
    /// availability).
    NoCandidate,
}

/// The verdict of one decision.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "outcome", rename_all = "camelCase")]
pub enum Outcome {
    /// Send the request to `target`.
    Route {
        /// Chosen target.
        target: Target,
    },
    /// Refuse the request.
    Reject {
        /// Machine-readable reason.
        reason: RejectReason,
        /// Operator-facing explanation (never contains prompt text).
        message: String,
    },
    /// Hold the request and decide again when capacity frees up.
    Queue {
        /// Why it waits.
        message: String,
    },
}

/// One candidate with everything the ranking used.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Candidate {
    /// Where it would send the request.
    pub target: Target,
    /// Public model through which it was reached.
    pub public_model: Name,
    /// Pool it belongs to.
    pub pool: Name,
    /// Whether data leaves the organisation.
    pub external: bool,
    /// Region, if known.
    pub region: Option<Name>,
    /// Waiting requests (workers only).
    pub waiting_requests: u32,
    /// Running requests (workers only).
    pub running_requests: u32,
    /// KV-cache usage in percent (workers only).
    pub kv_cache_usage_percent: f64,
    /// Prompt tokens cached on this candidate.
    pub cached_tokens: u32,
    /// Predicted time to first token.
    pub predicted_ttft: TtftPrediction,
    /// What `minimize: PredictedTTFT` ranks by: the predicted TTFT plus the cache footprint of
    /// the placement (see [`COLD_PLACEMENT_WEIGHT`]).
    pub score_ms: f64,
    /// Estimated cost of this request here, US dollars.
    pub estimated_cost_usd: f64,
}

/// One stage of the trace.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TraceEntry {
    /// Stage name (`resolve`, `candidates`, `policy`, `step 1: MaxWaitingRequests`, ...).
    pub stage: String,
    /// What happened, in words.
    pub detail: String,
    /// Candidate count before the stage, where candidates were filtered.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub before: Option<usize>,
    /// Candidate count after the stage.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub after: Option<usize>,
    /// Candidates removed, each with the reason.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub removed: Vec<Removal>,
}

/// A candidate removed by a stage.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Removal {
    /// Candidate label (`worker SET/NAME` or `provider NAME/MODEL`).
    pub candidate: String,
    /// Why.
    pub reason: String,
}

/// The result of [`decide`].
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Decision {
    /// The verdict.
    #[serde(flatten)]
    pub outcome: Outcome,
    /// Name of the policy applied.
    pub policy: String,
    /// Public models the requested name resolved to.
    pub resolved_models: Vec<String>,
    /// The final candidate set, best first (the chosen target is the first when routed).
    pub alternatives: Vec<Candidate>,
    /// Every stage, in order.
    pub trace: Vec<TraceEntry>,
}

// === impl Target ===

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Target::Worker { worker_set, worker, .. } => write!(f, "worker {worker_set}/{worker}"),
            Target::Provider { provider, model, .. } => write!(f, "provider {provider}/{model}"),
        }
    }
}

impl Candidate {
    /// Whether this is one of the organisation's own workers.
    pub fn is_local(&self) -> bool {
        matches!(self.target, Target::Worker { .. })
    }

    /// `worker SET/NAME` or `provider NAME/MODEL`.
    pub fn label(&self) -> String {
        self.target.to_string()
    }

    /// The pieces of [`Candidate::label`], without building the string.
    fn label_parts(&self) -> [&str; 4] {
        match &self.target {
            Target::Worker { worker_set, worker, .. } => ["worker ", worker_set, "/", worker],
            Target::Provider { provider, model, .. } => ["provider ", provider, "/", model],
        }
    }
}

/// Decides where `req` goes. Pure: see the module documentation for the stages.
pub fn decide(cfg: &FleetConfig, snapshot: &FleetSnapshot, req: &RequestFeatures) -> Decision {
    let mut trace = Vec::new();
    let default_policy;
    let policy = match cfg.policy_for(req) {
        Some(p) => p,
        None => {
            default_policy = Policy::default_policy();
            &default_policy
        }
    };

    let resolved = match resolve::expand(cfg, &req.model) {
        Ok(models) => models,
        Err(err) => {
            let reason = match err {
                ResolveError::Unknown(_) => RejectReason::ModelNotFound,
                ResolveError::Cycle(_) => RejectReason::AliasCycle,
            };
            trace.push(entry("resolve", err.to_string()));
            return Decision {
                outcome: Outcome::Reject { reason, message: err.to_string() },
                policy: policy.name.clone(),
                resolved_models: Vec::new(),
                alternatives: Vec::new(),
                trace,
            };
        }
    };
    trace.push(entry("resolve", format!("`{}` -> {}", req.model, resolved.join(", "))));

    let (mut local, mut spill) = gather(cfg, snapshot, req, &resolved, &mut trace);

    trace.push(entry(
        "policy",
        if policy.priority == i32::MIN {
            "no policy matches; default policy (minimize PredictedTTFT, onEmpty Fallback)".to_owned()
        } else {
            format!("{} (priority {})", policy.name, policy.priority)
        },
    ));

    // Filters first, then preferences: a preference only chooses among candidates that pass
    // every filter, so it can never be the reason a request spills over or is rejected.
    let (preferences, filters): (Vec<_>, Vec<_>) =
        policy.steps.iter().enumerate().partition(|(_, s)| matches!(s, Step::PreferModel { .. }));
    for (i, step) in filters.into_iter().chain(preferences) {
        let stage = format!("step {}: {}", i + 1, step_name(step));
        apply_step(step, &stage, &mut local, &mut spill, &mut trace);
    }

    if req.is_pii() {
        let before = spill.len();
        let removed = retain(&mut spill, |c| {
            if c.external {
                Err("request is tagged pii; external providers are never allowed".to_owned())
            } else {
                Ok(())
            }
        });
        trace.push(TraceEntry {
            stage: "residency".to_owned(),
            detail: "pii request: external providers removed".to_owned(),
            before: Some(before + local.len()),
            after: Some(spill.len() + local.len()),
            removed,
        });
    }

    let outcome_for = |ranked: &[Candidate]| match ranked.first() {
        Some(best) => Outcome::Route { target: best.target.clone() },
        None => Outcome::Reject {
            reason: RejectReason::NoCandidate,
            message: format!(
                "policy {} left no local worker and no eligible provider for this request{}",
                policy.name,
                if req.is_pii() { " (pii-tagged requests never go to external providers)" } else { "" }
            ),
        },
    };

    let (outcome, alternatives) = if !local.is_empty() {
        rank(&mut local, policy.minimize, req.tie_breaker);
        trace.push(rank_entry(&local, policy.minimize));
        (outcome_for(&local), local)
    } else {
        match policy.on_empty {
            OnEmpty::Reject => {
                trace.push(entry("onEmpty", "Reject: no local candidate remains".to_owned()));
                let message =
                    format!("policy {} left no local capacity and rejects instead of spilling over", policy.name);
                (Outcome::Reject { reason: RejectReason::NoLocalCapacity, message }, Vec::new())
            }
            OnEmpty::Queue => {
                trace.push(entry("onEmpty", "Queue: no local candidate remains; the request waits".to_owned()));
                let message = format!("policy {} holds the request until local capacity frees up", policy.name);
                (Outcome::Queue { message }, Vec::new())
            }
            OnEmpty::Fallback => {
                trace.push(entry("onEmpty", format!("Fallback: {} provider candidate(s)", spill.len())));
                rank_in_order(&mut spill, policy.minimize);
                if !spill.is_empty() {
                    trace.push(rank_entry(&spill, policy.minimize));
                }
                (outcome_for(&spill), spill)
            }
        }
    };

    Decision { outcome, policy: policy.name.clone(), resolved_models: resolved, alternatives, trace }
}

fn entry(stage: &str, detail: String) -> TraceEntry {
    TraceEntry { stage: stage.to_owned(), detail, before: None, after: None, removed: Vec::new() }
}

/// Builds local and spillover candidates for the resolved public models.
fn gather(
    cfg: &FleetConfig,
    snapshot: &FleetSnapshot,
    req: &RequestFeatures,
    resolved: &[String],
    trace: &mut Vec<TraceEntry>,
) -> (Vec<Candidate>, Vec<Candidate>) {
    let mut local: Vec<Candidate> = Vec::new();
    let mut spill: Vec<Candidate> = Vec::new();
    let mut removed = Vec::new();
    // A worker set reached through two public models is one set of candidates. Hashed: a
    // fleet-wide pool (the hub's) has one set per cluster, and a scan is quadratic in them.
    let mut seen_sets: rustc_hash::FxHashSet<&str> = rustc_hash::FxHashSet::default();
    let output_tokens = f64::from(req.max_output_tokens.unwrap_or(DEFAULT_EXPECTED_OUTPUT_TOKENS));

    for public in resolved {
        let Some((public, pool)) = cfg.models.get(public).and_then(|m| Some((&m.name, cfg.pools.get(&m.pool)?))) else {
            continue;
        };
        for ws_name in &pool.worker_sets {
            let Some(ws) = cfg.worker_sets.get(ws_name) else { continue };
            if !seen_sets.insert(&ws.name) {
                continue;
            }
            local.reserve(ws.workers.len());
            for worker in &ws.workers {
                let key = WorkerKey { worker_set: ws.name.clone(), worker: worker.clone() };
                let state = snapshot.worker(&key);
                let cached = req.cached_on(&key);
                let target = Target::Worker {
                    worker_set: key.worker_set,
                    worker: key.worker,
                    served_model: ws.served_model.clone(),
                };
                let Some(state) = state else {
                    removed.push(Removal { candidate: target.to_string(), reason: "no state known".to_owned() });
                    continue;
                };
                if !state.healthy {
                    removed.push(Removal { candidate: target.to_string(), reason: "unhealthy".to_owned() });
                    continue;
                }
                let predicted = match &state.outlook {
                    Some(outlook) => {
                        outlook.predict(req.prompt_tokens, cached, req.prefix_key(cached, ws.kv_block_size))
                    }
                    None => state.ttft.as_ref().unwrap_or(&ws.ttft).predict(&TtftInputs {
                        prompt_tokens: req.prompt_tokens,
                        cached_tokens: cached,
                        waiting_requests: state.waiting_requests,
                        waiting_prefill_tokens: state.waiting_prefill_tokens,
                        running_requests: state.running_requests,
                    }),
                };
                let decode_rate = if ws.decode_tokens_per_sec > 0.0 { ws.decode_tokens_per_sec } else { 1_000.0 };
                let busy_s = predicted.prefill_ms / 1_000.0 + output_tokens / decode_rate;
                let pressure = (state.kv_cache_usage_percent / 100.0).clamp(0.0, 1.0);
                let score_ms =
                    predicted.total_ms + predicted.prefill_ms * (COLD_PLACEMENT_WEIGHT + KV_PRESSURE_WEIGHT * pressure);
                local.push(Candidate {
                    target,
                    public_model: public.clone(),
                    pool: pool.name.clone(),
                    external: false,
                    region: ws.region.clone(),
                    waiting_requests: state.waiting_requests + state.held_requests,
                    running_requests: state.running_requests,
                    kv_cache_usage_percent: state.kv_cache_usage_percent,
                    cached_tokens: cached,
                    predicted_ttft: predicted,
                    score_ms,
                    estimated_cost_usd: ws.hourly_cost.as_usd_f64() * busy_s / 3_600.0,
                });
            }
        }
        for member in &pool.providers {
            let Some(provider) = cfg.providers.get(&member.provider) else { continue };
            let Some(model) = provider.models.get(&member.model) else { continue };
            let target = Target::Provider {
                provider: provider.name.clone(),
                model: member.model.clone(),
                provider_model_id: model.provider_model_id.clone(),
            };
            if spill.iter().any(|c| c.target == target) {
                continue;
            }
            if !snapshot.provider_available(&provider.name) {
                removed.push(Removal { candidate: target.to_string(), reason: "provider unavailable".to_owned() });
                continue;
            }
            let per_million = |price: crate::money::MicroUsd, tokens: f64| price.as_usd_f64() * tokens / 1_000_000.0;
            let ttft = provider.expected_ttft_ms.max(0.0);
            spill.push(Candidate {
                target,
                public_model: public.clone(),
                pool: pool.name.clone(),
                external: provider.external,
                region: provider.region.as_deref().map(Name::from),
                waiting_requests: 0,
                running_requests: 0,
                kv_cache_usage_percent: 0.0,
                cached_tokens: 0,
                predicted_ttft: TtftPrediction {
                    total_ms: if ttft.is_finite() { ttft } else { 0.0 },
                    queue_ms: 0.0,
                    prefill_ms: 0.0,
                },
                score_ms: if ttft.is_finite() { ttft } else { 0.0 },
                estimated_cost_usd: per_million(model.prices.input_per_million, f64::from(req.prompt_tokens))
                    + per_million(model.prices.output_per_million, output_tokens),
            });
        }
    }
    trace.push(TraceEntry {
        stage: "candidates".to_owned(),
        detail: format!("{} local worker(s), {} provider model(s) for spillover", local.len(), spill.len()),
        before: None,
        after: Some(local.len() + spill.len()),
        removed,
    });
    (local, spill)
}

fn step_name(step: &Step) -> &'static str {
    match step {
        Step::ExcludeExternal => "ExcludeExternal",
        Step::RequireRegions { .. } => "RequireRegions",
        Step::MaxWaitingRequests { .. } => "MaxWaitingRequests",
        Step::KvCacheUsageBelow { .. } => "KVCacheUsageBelow",
        Step::PreferModel { .. } => "PreferModel",
    }
}

/// Keeps the candidates `keep` accepts; returns the others with the reason `keep` gave.
fn retain(cands: &mut Vec<Candidate>, mut keep: impl FnMut(&Candidate) -> Result<(), String>) -> Vec<Removal> {
    let mut removed = Vec::new();
    cands.retain(|c| match keep(c) {
        Ok(()) => true,
        Err(reason) => {
            removed.push(Removal { candidate: c.label(), reason });
            false
        }
    });
    removed
}

fn apply_step(
    step: &Step,
    stage: &str,
    local: &mut Vec<Candidate>,
    spill: &mut Vec<Candidate>,
    trace: &mut Vec<TraceEntry>,
) {
    let before = local.len() + spill.len();
    let (detail, removed) = match step {
        Step::ExcludeExternal => {
            let removed = retain(spill, |c| if c.external { Err("external provider".to_owned()) } else { Ok(()) });
            ("external providers removed".to_owned(), removed)
        }
        Step::RequireRegions { regions } => {
            let check = |c: &Candidate| match &c.region {
                Some(r) if regions.iter().any(|allowed| **allowed == **r) => Ok(()),
                Some(r) => Err(format!("region {r} not in [{}]", regions.join(", "))),
                None => Err("region unknown".to_owned()),
            };
            let mut removed = retain(local, check);
            removed.extend(retain(spill, check));
            (format!("only regions [{}]", regions.join(", ")), removed)
        }
        Step::MaxWaitingRequests { max } => {
            let removed = retain(local, |c| {
                if c.waiting_requests > *max { Err(format!("{} waiting > {max}", c.waiting_requests)) } else { Ok(()) }
            });
            (format!("skip workers with more than {max} waiting"), removed)
        }
        Step::KvCacheUsageBelow { percent } => {
            let limit = f64::from(*percent);
            let removed = retain(local, |c| {
                if c.kv_cache_usage_percent < limit {
                    Ok(())
                } else {
                    Err(format!("KV usage {:.1}% >= {percent}%", c.kv_cache_usage_percent))
                }
            });
            (format!("keep workers with KV usage below {percent}%"), removed)
        }
        Step::PreferModel { model, unless_cached_sooner } => prefer_model(local, model, *unless_cached_sooner),
    };
    trace.push(TraceEntry {
        stage: stage.to_owned(),
        detail,
        before: Some(before),
        after: Some(local.len() + spill.len()),
        removed,
    });
}

fn prefer_model(local: &mut Vec<Candidate>, model: &str, unless_cached_sooner: bool) -> (String, Vec<Removal>) {
    let best_preferred =
        local.iter().filter(|c| &*c.public_model == model).map(|c| c.predicted_ttft.total_ms).min_by(f64::total_cmp);
    let Some(best_preferred) = best_preferred else {
        return (format!("no candidate serves {model}; all kept"), Vec::new());
    };
    let mut overridden = 0usize;
    let removed = retain(local, |c| {
        if &*c.public_model == model {
            Ok(())
        } else if unless_cached_sooner && c.cached_tokens > 0 && c.predicted_ttft.total_ms < best_preferred {
            overridden += 1;
            Ok(())
        } else if unless_cached_sooner && c.cached_tokens > 0 {
            Err(format!(
                "serves {}; {} cached tokens but predicted {:.0} ms >= {model}'s {:.0} ms",
                c.public_model, c.cached_tokens, c.predicted_ttft.total_ms, best_preferred
            ))
        } else {
            Err(format!("serves {}, {model} preferred", c.public_model))
        }
    });
    let detail = if overridden > 0 {
        format!("prefer {model}; kept {overridden} other candidate(s) with the prefix cached that answer sooner")
    } else {
        format!("prefer {model}")
    };
    (detail, removed)
}

/// Sorts best first: by the objective, then the other objective, then a per-request hash of
/// the label so equal candidates spread across requests; candidates equal in all three (a
/// hash collision) keep the configuration's order.
fn rank(cands: &mut [Candidate], objective: Objective, tie_breaker: u64) {
    // A key per candidate, computed once; the candidates themselves are permuted in place.
    cands.sort_by_cached_key(|c| {
        let (first, second) = match objective {
            Objective::PredictedTtft => (c.score_ms, c.estimated_cost_usd),
            Objective::Cost => (c.estimated_cost_usd, c.score_ms),
        };
        (total_order(first), total_order(second), mix(tie_breaker, c.label_parts()))
    });
}

/// Sorts best first by the objective, then the other objective; equal candidates keep the
/// configuration's order (spillover goes to a pool's providers in the order it lists them,
/// not spread like workers).
fn rank_in_order(cands: &mut [Candidate], objective: Objective) {
    cands.sort_by_cached_key(|c| {
        let (first, second) = match objective {
            Objective::PredictedTtft => (c.score_ms, c.estimated_cost_usd),
            Objective::Cost => (c.estimated_cost_usd, c.score_ms),
        };
        (total_order(first), total_order(second))
    });
}

/// `x` with `decimals` digits after the point, as `{:.N}` writes it (up to the last digit of a
/// value whose scaled product rounds apart from its decimal expansion), in integer arithmetic
/// for the values a trace shows (float formatting at fixed precision falls back to slow
/// exact arithmetic for many of them, on every routed request).
fn write_fixed(out: &mut String, x: f64, decimals: u32) {
    let scale = 10u64.pow(decimals);
    let scaled = (x * scale as f64).round_ties_even();
    if !(0.0..1e15).contains(&scaled) {
        let _ = write!(out, "{x:.prec$}", prec = decimals as usize);
        return;
    }
    let scaled = scaled as u64;
    let _ = write!(out, "{}", scaled / scale);
    if decimals > 0 {
        let _ = write!(out, ".{:0width$}", scaled % scale, width = decimals as usize);
    }
}

/// `x` as an integer whose order is [`f64::total_cmp`]'s.
fn total_order(x: f64) -> i64 {
    let bits = x.to_bits() as i64;
    bits ^ ((((bits >> 63) as u64) >> 1) as i64)
}

fn rank_entry(ranked: &[Candidate], objective: Objective) -> TraceEntry {
    let objective = match objective {
        Objective::PredictedTtft => "PredictedTTFT",
        Objective::Cost => "Cost",
    };
    // One string written in place: this runs on every routed request.
    let mut detail = format!("minimize {objective}: ");
    for (i, c) in ranked.iter().take(5).enumerate() {
        let sep = if i == 0 { "" } else { " > " };
        let _ = write!(detail, "{sep}{} (", c.target);
        write_fixed(&mut detail, c.predicted_ttft.total_ms, 0);
        detail.push_str(" ms, $");
        write_fixed(&mut detail, c.estimated_cost_usd, 6);
        let _ = write!(detail, ", {} cached)", c.cached_tokens);
    }
    if ranked.len() > 5 {
        let _ = write!(detail, ", ... {} more", ranked.len() - 5);
    }
    entry("rank", detail)
}

/// The label's hash under `seed`: a stable, cheap tie-break order per request. The label is
/// hashed a word at a time, then with the seed through a full-avalanche finaliser
/// (MurmurHash3's `fmix64`), so each request orders equal candidates independently.
fn mix(seed: u64, label: [&str; 4]) -> u64 {
    use std::hash::Hasher;
    let mut hasher = rustc_hash::FxHasher::default();
    for part in label {
        hasher.write(part.as_bytes());
    }
    let mut h = hasher.finish() ^ seed;
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 33)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An idle worker of set `set` whose predicted TTFT (and score) is `ttft_ms`.
    fn worker(set: &str, name: &str, ttft_ms: f64) -> Candidate {
        Candidate {
            target: Target::Worker { worker_set: set.into(), worker: name.into(), served_model: "m".into() },
            public_model: "m".into(),
            pool: "p".into(),
            external: false,
            region: None,
            waiting_requests: 0,
            running_requests: 0,
            kv_cache_usage_percent: 0.0,
            cached_tokens: 0,
            predicted_ttft: TtftPrediction { total_ms: ttft_ms, queue_ms: 0.0, prefill_ms: ttft_ms },
            score_ms: ttft_ms,
            estimated_cost_usd: 0.0,
        }
    }

    #[test]
    fn label_parts_are_the_label() {
        let worker = worker("gpu-a", "w-1", 0.0);
        let provider = Candidate {
            target: Target::Provider {
                provider: "bedrock".into(),
                model: "claude".into(),
                provider_model_id: "x".into(),
            },
            ..worker.clone()
        };
        for c in [&worker, &provider] {
            assert_eq!(c.label_parts().concat(), c.label());
        }
        assert_ne!(mix(7, worker.label_parts()), mix(8, worker.label_parts()));
        assert_ne!(mix(7, worker.label_parts()), mix(7, provider.label_parts()));
    }

    #[test]
    fn equal_providers_keep_the_pool_order_whatever_the_request() {
        let provider = |name: &str, ttft: f64| Candidate {
            target: Target::Provider { provider: name.into(), model: "m".into(), provider_model_id: "x".into() },
            ..worker("s", name, ttft)
        };
        let cands = vec![provider("b", 800.0), provider("a", 800.0), provider("c", 300.0)];
        for _ in 0..16 {
            let mut ranked = cands.clone();
            rank_in_order(&mut ranked, Objective::PredictedTtft);
            let order: Vec<String> = ranked.iter().map(|c| c.label()).collect();
            assert_eq!(order, ["provider c/m", "provider b/m", "provider a/m"]);
        }
    }

    #[test]
    fn the_ordering_key_orders_as_total_cmp() {
        let xs = [f64::NEG_INFINITY, -1e300, -2.5, -0.0, 0.0, 1e-300, 3.0, 7.25e9, f64::INFINITY, f64::NAN];
        for a in xs {
            for b in xs {
                assert_eq!(total_order(a).cmp(&total_order(b)), a.total_cmp(&b), "{a} vs {b}");
            }
        }
    }

    #[test]
    fn equal_candidates_take_turns_first_across_requests() {
        let cands: Vec<Candidate> = (0..8).map(|i| worker("s", &format!("w{i}"), 5.0)).collect();
        let seed = |request_no: u64| request_no.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        let mut firsts = std::collections::BTreeMap::<String, u32>::new();
        for request_no in 0..8_000u64 {
            let mut ranked = cands.clone();
            rank(&mut ranked, Objective::PredictedTtft, seed(request_no));
            *firsts.entry(ranked[0].label()).or_default() += 1;
            let mut again = cands.clone();
            rank(&mut again, Objective::PredictedTtft, seed(request_no));
            assert_eq!(ranked, again, "the same request ranks the same way");
        }
        // Each of 8 equal workers is first for about 1,000 of 8,000 requests.
        assert_eq!(firsts.len(), 8);
        assert!(firsts.values().all(|n| (850..1_150).contains(n)), "{firsts:?}");
        // A strictly better candidate is first whatever the seed.
        let mut better = cands.clone();
        better[5].score_ms = 4.0;
        for request_no in 0..100 {
            let mut ranked = better.clone();
            rank(&mut ranked, Objective::PredictedTtft, seed(request_no));
            assert_eq!(ranked[0].label(), "worker s/w5");
        }
    }

    #[test]
    fn fixed_point_writing_matches_the_formatter() {
        for x in [0.0, 0.4, 0.5, 0.6, 1.0, 2.5, 12.34e-6, 0.000_123_4, 2.718_4, 1_234.000_000_4, 98_765.432_1] {
            for decimals in [0, 6] {
                let mut out = String::new();
                write_fixed(&mut out, x, decimals);
                assert_eq!(out, format!("{x:.prec$}", prec = decimals as usize), "{x} at {decimals}");
            }
        }
        for x in [-2.5, f64::INFINITY, f64::NAN, 1e300] {
            let mut out = String::new();
            write_fixed(&mut out, x, 6);
            assert_eq!(out, format!("{x:.6}"));
        }
    }
}
