//! The compiled fleet configuration.
//!
//! This is the validated form of the five custom resources: every reference resolves, every
//! threshold is in range, and policies are sorted in evaluation order (priority descending,
//! then name). It is built once per configuration change by `switchyard-config` and shared
//! read-only (behind an `Arc`) by every decision. Nothing in here changes at request time.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::Name;
use crate::money::MicroUsd;
use crate::predictor::TtftModel;
use crate::replica::{EngineModel, EngineShape, StepCost};
use crate::request::{Complexity, RequestClass, RequestFeatures};

/// Default output length assumed for cost estimates when a request does not say.
pub const DEFAULT_EXPECTED_OUTPUT_TOKENS: u32 = 256;

/// The whole fleet as the decision engine sees it.
#[derive(Debug, Clone, Default, Serialize)]
pub struct FleetConfig {
    /// vLLM worker sets by name.
    pub worker_sets: BTreeMap<String, WorkerSet>,
    /// External providers by name.
    pub providers: BTreeMap<String, Provider>,
    /// Pools by name.
    pub pools: BTreeMap<String, Pool>,
    /// Public model names (what tenants put in `model`) to the pool serving them.
    pub models: BTreeMap<String, PublicModel>,
    /// Aliases to the public models or aliases they stand for.
    pub aliases: BTreeMap<String, Alias>,
    /// Policies in evaluation order: priority descending, then name ascending.
    pub policies: Vec<Policy>,
}

/// A set of vLLM workers serving one model in one cluster.
#[derive(Debug, Clone, Serialize)]
pub struct WorkerSet {
    /// Resource name.
    pub name: Name,
    /// The model name the engines serve (`--served-model-name`).
    pub served_model: Name,
    /// Cluster the workers run in.
    pub cluster: String,
    /// Region of that cluster, if declared.
    pub region: Option<Name>,
    /// Names of the workers (static endpoints), in declaration order.
    pub workers: Vec<Name>,
    /// Tokens per KV-cache block on the engines.
    pub kv_block_size: u32,
    /// What one worker costs per hour (all of its GPUs).
    pub hourly_cost: MicroUsd,
    /// Aggregate decode throughput of one worker in tokens per second (a capacity hint).
    pub decode_tokens_per_sec: f64,
    /// Time-to-first-token model for these workers.
    pub ttft: TtftModel,
    /// The engines' scheduler limits, as far as configured.
    pub engine: EngineLimits,
    /// Whether the router keeps a replica of each engine to predict TTFT with.
    pub replicate_engines: bool,
    /// Whether dispatches to these workers are paced ([`crate::pacing`]).
    pub paced: bool,
}

/// What the configuration says of the engines' scheduler (vLLM's engine arguments and the
/// KV capacity it reports at start-up).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct EngineLimits {
    /// `--max-num-seqs`.
    pub max_num_seqs: Option<u32>,
    /// `--max-num-batched-tokens`.
    pub max_num_batched_tokens: Option<u32>,
    /// KV-cache capacity of one worker, tokens.
    pub kv_cache_tokens: Option<u64>,
}

/// vLLM's `--max-num-seqs` default for the OpenAI server.
pub const VLLM_DEFAULT_MAX_NUM_SEQS: u32 = 256;
/// vLLM's `--max-num-batched-tokens` default for the OpenAI server with chunked prefill.
pub const VLLM_DEFAULT_MAX_NUM_BATCHED_TOKENS: u32 = 2048;

impl WorkerSet {
    /// The engines' step token budget: configured, or vLLM's default.
    pub fn step_token_budget(&self) -> u32 {
        self.engine.max_num_batched_tokens.unwrap_or(VLLM_DEFAULT_MAX_NUM_BATCHED_TOKENS)
    }

    /// The scheduler shape a replica of these engines steps with, once the KV capacity is known
    /// (configured, or `scraped_blocks` from the engine's `vllm:cache_config_info`).
    pub fn engine_shape(&self, scraped_blocks: Option<u32>) -> Option<EngineShape> {
        let bs = self.kv_block_size.max(1);
        let configured = self.engine.kv_cache_tokens.map(|t| u32::try_from(t / u64::from(bs)).unwrap_or(u32::MAX));
        let num_blocks = scraped_blocks.or(configured).filter(|b| *b > 0)?;
        Some(EngineShape {
            block_size: bs,
            num_blocks,
            max_num_seqs: self.engine.max_num_seqs.unwrap_or(VLLM_DEFAULT_MAX_NUM_SEQS),
            max_num_batched_tokens: self.step_token_budget(),
        })
    }

    /// A router's model of one idle engine of this set ([`WorkerSet::engine_shape`]), its step
    /// cost first assumed from the configured prefill rate and overhead; `None` unless the set
    /// predicts TTFT with engine replicas.
    pub fn engine_model(&self, scraped_blocks: Option<u32>) -> Option<EngineModel> {
        if !self.replicate_engines {
            return None;
        }
        let prior = StepCost::prior(self.ttft.prefill_tokens_per_sec, self.ttft.base_ms);
        Some(EngineModel::new(self.engine_shape(scraped_blocks)?, prior))
    }
}

/// The kind of external provider.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum ProviderKind {
    /// AWS Bedrock (Converse API).
    Bedrock,
    /// Any OpenAI-compatible HTTP API.
    OpenAi,
}

/// An external inference provider.
#[derive(Debug, Clone, Serialize)]
pub struct Provider {
    /// Resource name.
    pub name: String,
    /// Which API it speaks.
    pub kind: ProviderKind,
    /// Whether requests sent here leave the organisation's own clusters.
    pub external: bool,
    /// Region the provider processes data in, if declared.
    pub region: Option<String>,
    /// Models offered, keyed by the fleet-side model name.
    pub models: BTreeMap<String, ProviderModel>,
    /// Typical time to first token, used as its predicted TTFT.
    pub expected_ttft_ms: f64,
    /// How to reach it: endpoint, credentials and client limits.
    pub connection: ProviderConnection,
}

/// How a provider is reached (the request path's client is built from this).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ProviderConnection {
    /// AWS region of a Bedrock provider.
    pub aws_region: Option<String>,
    /// Base URL: an OpenAI-compatible API's, or an override of Bedrock's regional endpoint
    /// (a VPC endpoint, or a local Bedrock-compatible endpoint).
    pub base_url: Option<String>,
    /// Where credentials come from.
    pub credentials: ProviderCredentials,
    /// Client-side limits.
    pub limits: ProviderLimits,
}

/// Where a provider's credentials come from.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(tag = "source", rename_all = "camelCase")]
pub enum ProviderCredentials {
    /// The platform's standard chain (AWS: environment, web identity / IRSA, EKS Pod
    /// Identity, profile, instance metadata); none for an OpenAI-compatible API.
    #[default]
    Ambient,
    /// A key of a Kubernetes Secret (an API key, or AWS keys as `AWS_ACCESS_KEY_ID=…` lines).
    #[serde(rename_all = "camelCase")]
    Secret {
        /// Secret name.
        name: String,
        /// Key in the Secret.
        key: String,
    },
    /// An IAM role assumed with the ambient credentials (Bedrock only).
    #[serde(rename_all = "camelCase")]
    AssumeRole {
        /// The role's ARN.
        role_arn: String,
    },
}

/// Client-side limits of one provider.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ProviderLimits {
    /// Requests in flight at most; beyond it the provider counts as unavailable.
    pub max_concurrency: u32,
    /// From sending a request to the provider's first event.
    pub first_byte_timeout_ms: u64,
    /// How long the circuit breaker stays open before a probe may close it.
    pub breaker_open_ms: u64,
}

impl Default for ProviderLimits {
    fn default() -> Self {
        ProviderLimits { max_concurrency: 64, first_byte_timeout_ms: 30_000, breaker_open_ms: 5_000 }
    }
}

/// One model a provider offers.
#[derive(Debug, Clone, Serialize)]
pub struct ProviderModel {
    /// The provider's own model id (e.g. a Bedrock model id).
    pub provider_model_id: String,
    /// Prices per million tokens.
    pub prices: TokenPrices,
}

/// Prices per million tokens.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct TokenPrices {
    /// Uncached input tokens.
    pub input_per_million: MicroUsd,
    /// Output tokens.
    pub output_per_million: MicroUsd,
    /// Input tokens served from the provider's prompt cache.
    pub cached_input_per_million: MicroUsd,
    /// Input tokens written to the provider's prompt cache.
    pub cache_write_input_per_million: MicroUsd,
}

/// A named set of worker sets and provider models that can serve one model.
#[derive(Debug, Clone, Serialize)]
pub struct Pool {
    /// Resource name.
    pub name: Name,
    /// Local worker sets, in declaration order.
    pub worker_sets: Vec<String>,
    /// Provider models used when local capacity is exhausted (spillover).
    pub providers: Vec<ProviderMember>,
}

/// A provider model that belongs to a pool.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ProviderMember {
    /// Provider resource name.
    pub provider: String,
    /// Fleet-side model name in that provider's model list.
    pub model: String,
}

/// A model name exposed at the front door.
#[derive(Debug, Clone, Serialize)]
pub struct PublicModel {
    /// The public name.
    pub name: Name,
    /// Pool that serves it.
    pub pool: String,
}

/// A fleet-wide alias such as `standard-model`.
#[derive(Debug, Clone, Serialize)]
pub struct Alias {
    /// The alias name.
    pub name: String,
    /// Public models or other aliases it expands to, in order.
    pub targets: Vec<String>,
}

/// A routing policy.
#[derive(Debug, Clone, Serialize)]
pub struct Policy {
    /// Resource name.
    pub name: String,
    /// Higher runs first.
    pub priority: i32,
    /// Which requests it applies to.
    pub matcher: Match,
    /// Ordered filters and preferences over local candidates.
    pub steps: Vec<Step>,
    /// How surviving candidates are ranked.
    pub minimize: Objective,
    /// What happens when no local candidate survives the steps.
    pub on_empty: OnEmpty,
}

/// A request matcher. Empty lists match anything.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Match {
    /// Requested model names (public names or aliases).
    pub models: Vec<String>,
    /// Tenant names.
    pub tenants: Vec<String>,
    /// Tags the request must all carry.
    pub tags: Vec<String>,
    /// Request class, if constrained.
    pub class: Option<RequestClass>,
    /// Complexity levels, if constrained.
    pub complexity: Vec<Complexity>,
}

/// One step of a policy.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "type")]
pub enum Step {
    /// Remove candidates that would send data outside the organisation.
    ExcludeExternal,
    /// Keep only candidates whose region is listed.
    RequireRegions {
        /// Allowed regions.
        regions: Vec<String>,
    },
    /// Skip local workers with more than `max` waiting requests.
    MaxWaitingRequests {
        /// Largest waiting queue still accepted.
        max: u32,
    },
    /// Keep only local workers whose KV-cache usage is below `percent`.
    KvCacheUsageBelow {
        /// Exclusive upper bound, 1..=100.
        percent: u32,
    },
    /// Prefer candidates serving `model`, unless another candidate has the prompt's prefix
    /// cached and is predicted to answer sooner.
    PreferModel {
        /// Public model name to prefer.
        model: String,
        /// Keep a cached, sooner candidate of another model instead.
        unless_cached_sooner: bool,
    },
}

/// Ranking objective.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Objective {
    /// Lowest predicted time to first token.
    PredictedTtft,
    /// Lowest estimated cost.
    Cost,
}

/// Behaviour when no local candidate survives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum OnEmpty {
    /// Refuse the request.
    Reject,
    /// Spill over to the pools' providers (still subject to residency).
    Fallback,
    /// Hold the request and decide again later.
    Queue,
}

// === impl Match ===

impl Match {
    /// Whether `req` falls under this matcher.
    pub fn matches(&self, req: &RequestFeatures) -> bool {
        (self.models.is_empty() || self.models.contains(&req.model))
            && (self.tenants.is_empty() || req.tenant.as_ref().is_some_and(|t| self.tenants.contains(t)))
            && self.tags.iter().all(|t| req.tags.contains(t))
            && self.class.is_none_or(|c| c == req.class)
            && (self.complexity.is_empty() || req.complexity.is_some_and(|c| self.complexity.contains(&c)))
    }

    /// Whether every request matched by `other` is also matched by `self`, assuming requests
    /// additionally carry every tag in `extra_tags`.
    pub fn covers(&self, other: &Match, extra_tags: &[String]) -> bool {
        let list_covers = |mine: &[String], theirs: &[String]| {
            mine.is_empty() || (!theirs.is_empty() && theirs.iter().all(|t| mine.contains(t)))
        };
        list_covers(&self.models, &other.models)
            && list_covers(&self.tenants, &other.tenants)
            && self.tags.iter().all(|t| other.tags.contains(t) || extra_tags.contains(t))
            && (self.class.is_none() || self.class == other.class)
            && (self.complexity.is_empty()
                || (!other.complexity.is_empty() && other.complexity.iter().all(|c| self.complexity.contains(c))))
    }
}

// === impl Policy ===

impl Policy {
    /// The policy applied when no configured policy matches a request.
    pub fn default_policy() -> Policy {
        Policy {
            name: "(default)".to_owned(),
            priority: i32::MIN,
            matcher: Match::default(),
            steps: Vec::new(),
            minimize: Objective::PredictedTtft,
            on_empty: OnEmpty::Fallback,
        }
    }

    /// Whether provider candidates survive this policy's steps at all (ignoring residency).
    pub fn excludes_external(&self) -> bool {
        self.steps.iter().any(|s| matches!(s, Step::ExcludeExternal))
    }
}

// === impl FleetConfig ===

impl FleetConfig {
    /// The first policy, in evaluation order, that matches `req`.
    pub fn policy_for(&self, req: &RequestFeatures) -> Option<&Policy> {
        self.policies.iter().find(|p| p.matcher.matches(req))
    }

    /// Sorts policies into evaluation order. Call after building `policies` by hand.
    pub fn sort_policies(&mut self) {
        self.policies.sort_by(|a, b| b.priority.cmp(&a.priority).then_with(|| a.name.cmp(&b.name)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(models: &[&str], tags: &[&str]) -> Match {
        Match {
            models: models.iter().map(|s| s.to_string()).collect(),
            tags: tags.iter().map(|s| s.to_string()).collect(),
            ..Match::default()
        }
    }

    #[test]
    fn coverage_is_set_inclusion() {
        let any = Match::default();
        let pii = m(&[], &["pii"]);
        let std_model = m(&["standard-model"], &[]);
        assert!(any.covers(&pii, &[]));
        assert!(!pii.covers(&any, &[]));
        assert!(pii.covers(&any, &["pii".to_owned()]));
        assert!(any.covers(&std_model, &[]));
        assert!(!std_model.covers(&any, &[]));
        assert!(m(&["a", "b"], &[]).covers(&m(&["a"], &["x"]), &[]));
    }
}
