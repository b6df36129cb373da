//! `InferencePool`: the worker sets and provider models that can serve one model.

use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

use crate::common::ResourceStatus;

/// Worker sets (local) and provider models (spillover) that can serve one model.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "switchyard.dev",
    version = "v1alpha1",
    kind = "InferencePool",
    namespaced,
    cel,
    status = "ResourceStatus",
    shortname = "ipool",
    category = "switchyard",
    doc = "Worker sets and provider models that can serve one model.",
    printcolumn(name = "Ready", type_ = "string", json_path = ".status.conditions[?(@.type==\"Ready\")].status"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
pub struct InferencePoolSpec {
    /// Members, local worker sets first by convention.
    #[x_kube(validation = Rule::new("size(self) >= 1").message("a pool needs at least one member"))]
    pub members: Vec<PoolMember>,
}

/// One member: a worker set, or a provider model.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.workerSet) != has(self.provider)").message("set exactly one of workerSet or provider"))]
#[x_kube(validation = Rule::new("has(self.provider) == has(self.model)").message("provider members need model, and only they"))]
pub struct PoolMember {
    /// Name of an `InferenceWorkerSet`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worker_set: Option<String>,
    /// Name of an `InferenceProvider`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider: Option<String>,
    /// Model name in the provider's `spec.models`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
}
