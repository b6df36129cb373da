//! `GatewayBackend`: what the front door exposes.

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::common::ResourceStatus;

/// Public model names and aliases exposed by the front door, mapped onto pools.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[kube(
    group = "switchyard.dev",
    version = "v1alpha1",
    kind = "GatewayBackend",
    namespaced,
    cel,
    status = "ResourceStatus",
    shortname = "gwb",
    category = "switchyard",
    doc = "Public model names and aliases exposed by the front door.",
    printcolumn(name = "Ready", type_ = "string", json_path = ".status.conditions[?(@.type==\"Ready\")].status"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
pub struct GatewayBackendSpec {
    /// Public model names, each served by one pool.
    #[serde(default)]
    pub models: Vec<PublicModelSpec>,
    /// Aliases such as `standard-model`, each standing for public models or other aliases.
    #[serde(default)]
    pub aliases: Vec<AliasSpec>,
}

/// A public model name.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct PublicModelSpec {
    /// Name tenants put in `model`.
    #[schemars(length(min = 1))]
    pub name: String,
    /// Name of the `InferencePool` serving it.
    #[schemars(length(min = 1))]
    pub pool: String,
}

/// A fleet-wide alias.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct AliasSpec {
    /// Alias name tenants put in `model`.
    #[schemars(length(min = 1))]
    pub name: String,
    /// Public models or aliases it expands to, in preference order.
    #[schemars(length(min = 1))]
    pub targets: Vec<String>,
}
