//! `InferenceProvider`: an external inference API used for spillover.

use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::common::ResourceStatus;

/// An external provider (AWS Bedrock or an OpenAI-compatible API).
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "switchyard.dev",
    version = "v1alpha1",
    kind = "InferenceProvider",
    namespaced,
    cel,
    status = "ResourceStatus",
    shortname = "iprov",
    category = "switchyard",
    doc = "An external inference provider used for spillover.",
    printcolumn(name = "Type", type_ = "string", json_path = ".spec.type"),
    printcolumn(name = "Region", type_ = "string", json_path = ".spec.region"),
    printcolumn(name = "External", type_ = "boolean", json_path = ".spec.residency.external"),
    printcolumn(name = "Ready", type_ = "string", json_path = ".status.conditions[?(@.type==\"Ready\")].status"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("self.type != 'Bedrock' || has(self.region)").message("Bedrock providers need region"))]
#[x_kube(validation = Rule::new("self.type != 'OpenAI' || has(self.baseUrl)").message("OpenAI providers need baseUrl"))]
pub struct InferenceProviderSpec {
    /// Which API the provider speaks.
    #[serde(rename = "type")]
    pub type_: ProviderType,
    /// AWS region (Bedrock) or the region the provider processes data in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region: Option<String>,
    /// Base URL of an OpenAI-compatible API, e.g. `https://api.example.com/v1`; for Bedrock,
    /// an override of the regional endpoint (a VPC endpoint, or a local Bedrock-compatible one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self.startsWith('https://') || self.startsWith('http://')").message("baseUrl must be an http(s) URL"))]
    pub base_url: Option<String>,
    /// Where credentials come from; absent means the platform default chain (IRSA, instance role).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credentials: Option<CredentialsSpec>,
    /// Data-residency labels used by PII rules.
    pub residency: ResidencySpec,
    /// Typical time to first token in milliseconds, used as the provider's predicted TTFT.
    #[serde(default = "default_expected_ttft_ms", rename = "expectedTTFTMs")]
    #[schemars(range(min = 1, max = 600000))]
    pub expected_ttft_ms: u32,
    /// Models offered, with the provider's ids and prices.
    #[schemars(length(min = 1))]
    pub models: Vec<ProviderModelSpec>,
    /// Client-side limits: concurrency, first-byte timeout, circuit breaker.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<ProviderLimitsSpec>,
}

/// Client-side limits of a provider; each has a default.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProviderLimitsSpec {
    /// Requests in flight at most (default 64); beyond it the provider is skipped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 100000))]
    pub max_concurrency: Option<u32>,
    /// Seconds from sending a request to its first event (default 30).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 600))]
    pub first_byte_timeout_seconds: Option<u32>,
    /// Seconds the circuit breaker stays open after throttling or a server error before a
    /// probe request may close it (default 5).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 3600))]
    pub breaker_open_seconds: Option<u32>,
}

/// Provider API family.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum ProviderType {
    /// AWS Bedrock Converse / ConverseStream.
    Bedrock,
    /// Any OpenAI-compatible chat-completions API.
    OpenAI,
}

/// Credentials reference. Secrets are never inlined.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!(has(self.secretRef) && has(self.roleArn))").message("set at most one of secretRef or roleArn"))]
pub struct CredentialsSpec {
    /// Secret holding an API key (OpenAI-compatible) or AWS keys.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_ref: Option<SecretKeyRef>,
    /// IAM role to assume (Bedrock).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self.startsWith('arn:')").message("roleArn must be an ARN"))]
    pub role_arn: Option<String>,
}

/// A key in a Secret in the same namespace.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct SecretKeyRef {
    /// Secret name.
    #[schemars(length(min = 1))]
    pub name: String,
    /// Key within the secret.
    #[schemars(length(min = 1))]
    pub key: String,
}

/// Residency labels.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ResidencySpec {
    /// True when requests sent here leave the organisation's own clusters. PII-tagged
    /// requests never go to external providers.
    pub external: bool,
    /// Region data is processed in (defaults to `spec.region`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region: Option<String>,
}

/// One model offered by the provider.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProviderModelSpec {
    /// Fleet-side model name, referenced by pools.
    #[schemars(length(min = 1))]
    pub name: String,
    /// The provider's own model id (e.g. `meta.llama3-3-70b-instruct-v1:0`).
    #[schemars(length(min = 1))]
    pub provider_model_id: String,
    /// Prices per million tokens.
    #[serde(default)]
    pub pricing: ProviderPricing,
}

/// Prices per million tokens, in US dollars as decimal strings.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProviderPricing {
    /// Uncached input tokens.
    #[serde(default = "zero")]
    #[schemars(regex(pattern = r"^[0-9]{1,9}(\.[0-9]{1,6})?$"))]
    pub input_per_million: String,
    /// Output tokens.
    #[serde(default = "zero")]
    #[schemars(regex(pattern = r"^[0-9]{1,9}(\.[0-9]{1,6})?$"))]
    pub output_per_million: String,
    /// Input tokens read from the provider's prompt cache.
    #[serde(default = "zero")]
    #[schemars(regex(pattern = r"^[0-9]{1,9}(\.[0-9]{1,6})?$"))]
    pub cached_input_per_million: String,
    /// USD per million input tokens written to the provider's prompt cache (default: the
    /// input price).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[0-9]{1,9}(\.[0-9]{1,6})?$"))]
    pub cache_write_input_per_million: Option<String>,
}

fn zero() -> String {
    "0".to_owned()
}

fn default_expected_ttft_ms() -> u32 {
    800
}

impl Default for ProviderPricing {
    fn default() -> Self {
        ProviderPricing {
            input_per_million: zero(),
            output_per_million: zero(),
            cached_input_per_million: zero(),
            cache_write_input_per_million: None,
        }
    }
}
