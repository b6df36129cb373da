//! `InferencePolicy`: which requests a policy matches and how it places them.

use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::common::ResourceStatus;

/// A routing policy: a request matcher, ordered steps over the candidates, an objective and
/// what to do when no local candidate is left.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "switchyard.dev",
    version = "v1alpha1",
    kind = "InferencePolicy",
    namespaced,
    cel,
    status = "ResourceStatus",
    shortname = "ipol",
    category = "switchyard",
    doc = "Matches requests and places them: ordered steps, an objective and onEmpty.",
    printcolumn(name = "Priority", type_ = "integer", json_path = ".spec.priority"),
    printcolumn(name = "Minimize", type_ = "string", json_path = ".spec.minimize"),
    printcolumn(name = "OnEmpty", type_ = "string", json_path = ".spec.onEmpty"),
    printcolumn(name = "Ready", type_ = "string", json_path = ".status.conditions[?(@.type==\"Ready\")].status"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
pub struct InferencePolicySpec {
    /// Policies are tried from the highest priority down; the first that matches applies.
    /// Ties are broken by name.
    #[serde(default)]
    #[schemars(range(min = -1000000, max = 1000000))]
    pub priority: i32,
    /// Which requests the policy applies to; an empty matcher matches every request.
    #[serde(default, rename = "match")]
    pub matcher: MatchSpec,
    /// Filters and preferences, applied in order to the local candidates.
    #[serde(default)]
    #[x_kube(validation = Rule::new("size(self) <= 32").message("at most 32 steps"))]
    pub steps: Vec<PolicyStep>,
    /// How the surviving candidates are ranked.
    #[serde(default)]
    pub minimize: Minimize,
    /// What happens when no local candidate survives the steps.
    #[serde(default)]
    pub on_empty: OnEmpty,
}

/// Request matcher. Every listed dimension must match; an empty list matches anything.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MatchSpec {
    /// Requested model names (public names or aliases).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub models: Vec<String>,
    /// Tenants.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tenants: Vec<String>,
    /// Tags the request must all carry (e.g. `pii`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tags: Vec<String>,
    /// Request class.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub class: Option<RequestClass>,
    /// Complexity levels from the classifier.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub complexity: Vec<Complexity>,
}

/// Request class.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum RequestClass {
    /// Someone is waiting.
    Interactive,
    /// Throughput work that may wait for idle capacity.
    Batch,
}

/// Prompt complexity.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Complexity {
    /// Simple.
    Low,
    /// Ordinary.
    Medium,
    /// Hard.
    High,
}

/// The kinds of step.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum StepType {
    /// Drop external providers from the spillover candidates.
    ExcludeExternal,
    /// Keep only candidates in the regions listed in `requireRegions`.
    RequireRegions,
    /// Skip workers with more waiting requests than `maxWaitingRequests`.
    MaxWaitingRequests,
    /// Keep only workers whose KV-cache usage is below `kvCacheUsageBelow` percent.
    #[serde(rename = "KVCacheUsageBelow")]
    KvCacheUsageBelow,
    /// Prefer candidates of `preferModel.model`.
    PreferModel,
}

/// One step. `type` names the step; the field of the same name carries its parameter.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.requireRegions) == (self.type == 'RequireRegions')").message("requireRegions is required for, and only for, type RequireRegions"))]
#[x_kube(validation = Rule::new("has(self.maxWaitingRequests) == (self.type == 'MaxWaitingRequests')").message("maxWaitingRequests is required for, and only for, type MaxWaitingRequests"))]
#[x_kube(validation = Rule::new("has(self.kvCacheUsageBelow) == (self.type == 'KVCacheUsageBelow')").message("kvCacheUsageBelow is required for, and only for, type KVCacheUsageBelow"))]
#[x_kube(validation = Rule::new("has(self.preferModel) == (self.type == 'PreferModel')").message("preferModel is required for, and only for, type PreferModel"))]
pub struct PolicyStep {
    /// Step kind.
    #[serde(rename = "type")]
    pub type_: StepType,
    /// Allowed regions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1))]
    pub require_regions: Option<Vec<String>>,
    /// Largest waiting queue still accepted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 100000))]
    pub max_waiting_requests: Option<u32>,
    /// Exclusive KV-cache usage ceiling in percent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 100))]
    pub kv_cache_usage_below: Option<u32>,
    /// Model preference.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefer_model: Option<PreferModelSpec>,
}

/// Parameters of `PreferModel`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PreferModelSpec {
    /// Public model name to prefer.
    #[schemars(length(min = 1))]
    pub model: String,
    /// Keep candidates of other models that have the prompt's prefix cached and are
    /// predicted to answer sooner.
    #[serde(default)]
    pub unless_cached_sooner: bool,
}

/// Ranking objective.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum Minimize {
    /// Lowest predicted time to first token (queue wait plus uncached prefill).
    #[default]
    PredictedTTFT,
    /// Lowest estimated cost.
    Cost,
}

/// Behaviour when no local candidate survives.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum OnEmpty {
    /// Refuse the request (never spill over).
    Reject,
    /// Spill over to the pools' providers, subject to residency.
    #[default]
    Fallback,
    /// Hold the request until local capacity frees up.
    Queue,
}
