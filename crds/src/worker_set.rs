//! `InferenceWorkerSet`: the vLLM workers serving one model in one cluster.

use std::collections::BTreeMap;

use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::common::Condition;

/// The vLLM workers serving one model in one cluster.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "switchyard.dev",
    version = "v1alpha1",
    kind = "InferenceWorkerSet",
    namespaced,
    cel,
    status = "WorkerSetStatus",
    shortname = "iws",
    category = "switchyard",
    doc = "vLLM workers serving one model in one cluster.",
    printcolumn(name = "Model", type_ = "string", json_path = ".spec.model"),
    printcolumn(name = "Cluster", type_ = "string", json_path = ".spec.cluster"),
    printcolumn(name = "Region", type_ = "string", json_path = ".spec.region"),
    printcolumn(name = "Ready", type_ = "integer", json_path = ".status.readyWorkers"),
    printcolumn(name = "Mode", type_ = "string", json_path = ".status.routingMode"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
pub struct InferenceWorkerSetSpec {
    /// Model name the engines serve (vLLM `--served-model-name`).
    #[x_kube(validation = Rule::new("self != ''").message("model must not be empty"))]
    pub model: String,
    /// Cluster the workers run in; reported to the hub and used in cost reports.
    pub cluster: String,
    /// Region of the cluster, for residency rules.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region: Option<String>,
    /// Free-form labels (zone, GPU type, ...), copied onto metrics.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// How workers are found.
    pub endpoints: EndpointsSpec,
    /// Default ports of every worker.
    #[serde(default)]
    pub ports: PortsSpec,
    /// vLLM KV-cache event stream settings.
    #[serde(default)]
    pub kv_events: KvEventsSpec,
    /// Tokens per KV-cache block on the engines (vLLM `--block-size`).
    #[serde(default = "default_block_size")]
    #[schemars(range(min = 1, max = 1024))]
    pub kv_block_size: u32,
    /// How the router tokenizes requests exactly as the engines do.
    #[serde(default)]
    pub tokenizer: TokenizerSpec,
    /// Capacity hints used before online calibration has data.
    #[serde(default)]
    pub capacity: CapacitySpec,
    /// How the router predicts a request's time to first token on each worker.
    #[serde(default)]
    pub ttft_predictor: TtftPredictor,
    /// When a request chosen for a worker is sent to it.
    #[serde(default)]
    pub dispatch_pacing: DispatchPacing,
    /// What the workers cost, for cost reports and `minimize: Cost`.
    #[serde(default)]
    pub cost: CostSpec,
}

/// How workers are discovered. Exactly one of `static` or `podSelector`.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.static) != has(self.podSelector)").message("set exactly one of static or podSelector"))]
pub struct EndpointsSpec {
    /// A fixed list of workers.
    #[serde(default, rename = "static", skip_serializing_if = "Option::is_none")]
    pub static_: Option<Vec<StaticEndpoint>>,
    /// Label selector for worker pods (discovered by the spoke's controller).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_selector: Option<BTreeMap<String, String>>,
}

/// One statically configured worker.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StaticEndpoint {
    /// Worker name, unique within the set.
    #[schemars(length(min = 1, max = 63))]
    pub name: String,
    /// Host name or IP address.
    #[schemars(length(min = 1))]
    pub host: String,
    /// HTTP port, overriding `spec.ports.http`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 65535))]
    pub http_port: Option<u16>,
    /// KV-event PUB port, overriding `spec.ports.kvEvents`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 65535))]
    pub kv_events_port: Option<u16>,
    /// KV-event replay ROUTER port, overriding `spec.ports.kvReplay`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 65535))]
    pub kv_replay_port: Option<u16>,
}

/// Default ports of every worker in the set.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PortsSpec {
    /// vLLM HTTP port.
    #[serde(default = "default_http_port")]
    #[schemars(range(min = 1, max = 65535))]
    pub http: u16,
    /// KV-event PUB port (`--kv-events-config` `endpoint`).
    #[serde(default = "default_kv_events_port")]
    #[schemars(range(min = 1, max = 65535))]
    pub kv_events: u16,
    /// KV-event replay port (`replay_endpoint`).
    #[serde(default = "default_kv_replay_port")]
    #[schemars(range(min = 1, max = 65535))]
    pub kv_replay: u16,
}

/// vLLM KV-cache event settings.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KvEventsSpec {
    /// Subscribe to the engines' KV events (precise routing). When false the spoke routes
    /// by load only.
    #[serde(default = "default_true")]
    pub enabled: bool,
    /// ZMQ topic the engines publish on (vLLM default: empty).
    #[serde(default)]
    pub topic: String,
}

/// How the router predicts time to first token.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum TtftPredictor {
    /// From the engine's queue (reported and in flight) and a calibrated prefill rate.
    #[default]
    Queue,
    /// From a replica of each engine's scheduler, rebuilt from the requests the router sent
    /// and the tokens it relayed, with a step-cost model learned online. Needs the KV
    /// capacity (`capacity.kvCacheTokens`, or the engine's `vllm:cache_config_info`);
    /// `capacity.maxNumSeqs` and `capacity.maxNumBatchedTokens` default to vLLM's defaults.
    EngineReplica,
}

/// When the router sends a request to the worker it chose.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum DispatchPacing {
    /// A long prompt waits at the router while the worker still has a prompt of the router's
    /// waiting for its first token that the two would not fit one step with
    /// (`capacity.maxNumBatchedTokens`), and for a short gap after each first token
    /// (8 % of that request's wait); it is planned again when either ends, so it can go to
    /// whichever worker frees first. Short prompts batch and are not held.
    #[default]
    Paced,
    /// Every request is sent as soon as it is planned.
    Immediate,
}

/// Where the router gets the engine's tokenizer.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum TokenizerSource {
    /// Ask the engine (`/v1/chat/completions/render`, `/tokenize`).
    #[default]
    Engine,
    /// Load `tokenizer.json` and the chat template from a directory.
    Files,
}

/// Tokenizer configuration.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("self.source != 'Files' || has(self.path)").message("source Files needs path"))]
pub struct TokenizerSpec {
    /// Where tokens come from.
    #[serde(default)]
    pub source: TokenizerSource,
    /// Hugging Face tokenizer directory (tokenizer.json, tokenizer_config.json) for `Files`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// Chat template file overriding the one in `path`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chat_template: Option<String>,
}

/// Capacity hints.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CapacitySpec {
    /// vLLM `--max-num-seqs`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub max_num_seqs: Option<u32>,
    /// vLLM `--max-num-batched-tokens`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub max_num_batched_tokens: Option<u32>,
    /// KV-cache capacity of one worker in tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub kv_cache_tokens: Option<u64>,
    /// Prefill throughput of one idle worker, tokens per second.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub prefill_tokens_per_second: Option<u32>,
    /// Aggregate decode throughput of one worker, tokens per second.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub decode_tokens_per_second: Option<u32>,
}

/// What the workers cost.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CostSpec {
    /// Price of one GPU-hour in US dollars, as a decimal string (e.g. "1.85").
    #[serde(default = "zero_usd")]
    #[schemars(regex(pattern = r"^[0-9]{1,9}(\.[0-9]{1,6})?$"))]
    pub gpu_hourly_usd: String,
    /// GPUs per worker (tensor parallel size).
    #[serde(default = "default_one")]
    #[schemars(range(min = 1, max = 64))]
    pub gpus_per_worker: u32,
}

/// Routing mode of a worker set as judged by the fidelity guard.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "UPPERCASE")]
pub enum RoutingMode {
    /// Predicted cache hits match the engines' reports.
    Exact,
    /// Some mismatch; cache signals are down-weighted.
    Degraded,
    /// Sustained mismatch; routing by load only.
    Fallback,
}

/// Observed state of a worker set.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WorkerSetStatus {
    /// The generation last processed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Workers currently healthy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_workers: Option<u32>,
    /// Fidelity-guard routing mode.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub routing_mode: Option<RoutingMode>,
    /// Current conditions (`Ready`, `KVEventsFlowing`, `TokenizerFidelity`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

fn default_block_size() -> u32 {
    16
}
fn default_http_port() -> u16 {
    8000
}
fn default_kv_events_port() -> u16 {
    5557
}
fn default_kv_replay_port() -> u16 {
    5558
}
fn default_true() -> bool {
    true
}
fn default_one() -> u32 {
    1
}
fn zero_usd() -> String {
    "0".to_owned()
}

impl Default for PortsSpec {
    fn default() -> Self {
        PortsSpec {
            http: default_http_port(),
            kv_events: default_kv_events_port(),
            kv_replay: default_kv_replay_port(),
        }
    }
}

impl Default for KvEventsSpec {
    fn default() -> Self {
        KvEventsSpec { enabled: true, topic: String::new() }
    }
}

impl Default for CostSpec {
    fn default() -> Self {
        CostSpec { gpu_hourly_usd: zero_usd(), gpus_per_worker: 1 }
    }
}
