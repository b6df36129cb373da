//! The spoke's view of its configuration: the compiled fleet plus what it needs to reach
//! every worker. Produced by [`crate::source`] from the same YAML `switchyard validate`
//! checks, and replaced whole on every change (readers hold an `Arc` snapshot).

use std::collections::BTreeMap;
use std::sync::Arc;

use switchyard_config::Resources;
use switchyard_core::FleetConfig;
use switchyard_crds::TokenizerSource;

/// How the spoke reaches one worker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerEndpoint {
    /// Worker set name.
    pub worker_set: String,
    /// Worker name.
    pub worker: String,
    /// Base URL of the vLLM HTTP server.
    pub http_url: String,
    /// ZMQ KV-event PUB endpoint, when events are enabled.
    pub kv_events: Option<String>,
    /// ZMQ replay ROUTER endpoint.
    pub kv_replay: Option<String>,
    /// Topic the engine publishes on.
    pub topic: String,
}

/// Tokenizer settings of a worker set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenizerConfig {
    /// Local files or the engine's render endpoint.
    pub source: TokenizerSource,
    /// Hugging Face tokenizer directory.
    pub path: Option<String>,
    /// Chat template file overriding the directory's.
    pub chat_template: Option<String>,
}

/// Runtime settings of one worker set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerSetRuntime {
    /// Name.
    pub name: String,
    /// Tokens per KV block.
    pub block_size: u32,
    /// Tokenizer settings.
    pub tokenizer: TokenizerConfig,
    /// Workers.
    pub workers: Vec<WorkerEndpoint>,
}

/// One configuration generation.
#[derive(Debug, Clone, Default)]
pub struct Topology {
    /// Increases with every accepted change.
    pub generation: u64,
    /// The compiled fleet (policies, pools, models, aliases).
    pub fleet: Arc<FleetConfig>,
    /// Worker sets by name.
    pub worker_sets: BTreeMap<String, WorkerSetRuntime>,
}

impl Topology {
    /// Builds the runtime view from validated resources.
    pub fn build(generation: u64, fleet: FleetConfig, resources: &Resources) -> Topology {
        let mut worker_sets = BTreeMap::new();
        for ws in &resources.worker_sets {
            let name = ws.object.metadata.name.clone().unwrap_or_default();
            let spec = &ws.object.spec;
            let workers = spec
                .endpoints
                .static_
                .iter()
                .flatten()
                .map(|ep| {
                    let http_port = ep.http_port.unwrap_or(spec.ports.http);
                    let kv_port = ep.kv_events_port.unwrap_or(spec.ports.kv_events);
                    let replay_port = ep.kv_replay_port.unwrap_or(spec.ports.kv_replay);
                    WorkerEndpoint {
                        worker_set: name.clone(),
                        worker: ep.name.clone(),
                        http_url: format!("http://{}:{http_port}", ep.host),
                        kv_events: spec.kv_events.enabled.then(|| format!("tcp://{}:{kv_port}", ep.host)),
                        kv_replay: spec.kv_events.enabled.then(|| format!("tcp://{}:{replay_port}", ep.host)),
                        topic: spec.kv_events.topic.clone(),
                    }
                })
                .collect();
            worker_sets.insert(
                name.clone(),
                WorkerSetRuntime {
                    name,
                    block_size: spec.kv_block_size,
                    tokenizer: TokenizerConfig {
                        source: spec.tokenizer.source,
                        path: spec.tokenizer.path.clone(),
                        chat_template: spec.tokenizer.chat_template.clone(),
                    },
                    workers,
                },
            );
        }
        Topology { generation, fleet: Arc::new(fleet), worker_sets }
    }
}
