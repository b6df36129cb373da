//! Starting simulated workers: one engine task, one optional KV-event publisher and one HTTP
//! server per worker, all owned by a [`Fleet`] and stopped together.
//!
//! With several workers, worker `i` listens on HTTP port `port + i`; its KV-event endpoint
//! port is `endpoint port + 2i` and its replay port `replay port + 2i`, so the default pair
//! 5557/5558 becomes 5559/5560 for the next worker. Port 0 picks free ports (tests).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use serde::Deserialize;
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::engine::hash::{self, HashAlgo};
use crate::engine::{Engine, mix};
use crate::faults::Faults;
use crate::metrics::Metrics;
use crate::profile::Profile;
use crate::publisher::{Publisher, PublisherConfig, PublisherError};
use crate::runtime::{self, LoopDeps};
use crate::server::{AppState, router};
use crate::wire::WireFormat;
use switchyard_tokenizer::{EngineTokenizer, TokenizerError};

/// vLLM's `--kv-events-config` JSON (unknown keys are accepted and ignored, as vLLM's
/// config is a growing dataclass).
#[derive(Debug, Clone, Deserialize, PartialEq)]
pub struct KvEventsConfig {
    /// Turn events on.
    #[serde(default)]
    pub enable_kv_cache_events: bool,
    /// `"zmq"` or `"null"`; defaults to zmq when enabled.
    #[serde(default)]
    pub publisher: Option<String>,
    /// PUB endpoint.
    #[serde(default = "default_endpoint")]
    pub endpoint: String,
    /// ROUTER endpoint for replay.
    #[serde(default)]
    pub replay_endpoint: Option<String>,
    /// Batches kept for replay.
    #[serde(default = "default_buffer_steps")]
    pub buffer_steps: usize,
    /// Topic frame.
    #[serde(default)]
    pub topic: String,
}

fn default_endpoint() -> String {
    "tcp://*:5557".to_owned()
}
fn default_buffer_steps() -> usize {
    10_000
}

impl KvEventsConfig {
    /// Whether a ZMQ publisher should run.
    pub fn publishes(&self) -> bool {
        self.enable_kv_cache_events && self.publisher.as_deref().is_none_or(|p| p == "zmq")
    }
}

/// Configuration of one or more simulated workers.
#[derive(Debug, Clone)]
pub struct SimConfig {
    /// Bind address of the HTTP servers (and `*` in event endpoints).
    pub host: String,
    /// HTTP port of the first worker (0 = pick free ports).
    pub port: u16,
    /// Number of workers.
    pub workers: u32,
    /// `--served-model-name`.
    pub served_model_name: String,
    /// Hugging Face tokenizer directory.
    pub tokenizer_dir: PathBuf,
    /// Engine profile (with flag overrides applied).
    pub profile: Profile,
    /// Multiplier on every simulated duration.
    pub time_scale: f64,
    /// Seed for outputs and engine hashes.
    pub seed: u64,
    /// KV-event configuration.
    pub kv_events: Option<KvEventsConfig>,
    /// Event encoding.
    pub wire_format: WireFormat,
    /// Report `usage.prompt_tokens_details.cached_tokens` (vLLM `--enable-prompt-tokens-details`).
    pub enable_prompt_tokens_details: bool,
    /// `--prefix-caching-hash-algo`.
    pub prefix_caching_hash_algo: HashAlgo,
}

impl SimConfig {
    /// One worker on loopback with free ports, the tiny profile at time scale 1, no KV events
    /// (tests and benches override what they need).
    pub fn loopback(tokenizer_dir: PathBuf) -> SimConfig {
        SimConfig {
            host: "127.0.0.1".into(),
            port: 0,
            workers: 1,
            served_model_name: "sim-model".into(),
            tokenizer_dir,
            profile: crate::profile::TINY.clone(),
            time_scale: 1.0,
            seed: 0,
            kv_events: None,
            wire_format: WireFormat::default(),
            enable_prompt_tokens_details: false,
            prefix_caching_hash_algo: HashAlgo::default(),
        }
    }
}

/// Why the fleet could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// Tokenizer problem.
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
    /// Event socket problem.
    #[error(transparent)]
    Publisher(#[from] PublisherError),
    /// HTTP listener problem.
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        /// Address.
        addr: String,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// Invalid configuration.
    #[error("{0}")]
    Config(String),
}

/// Where one started worker listens.
#[derive(Debug, Clone)]
pub struct WorkerInfo {
    /// Index in the fleet.
    pub index: u32,
    /// HTTP address.
    pub http: SocketAddr,
    /// Bound or connected KV-event endpoint.
    pub kv_events: Option<String>,
    /// Bound replay endpoint.
    pub kv_replay: Option<String>,
}

/// Running workers. Dropping it does not stop them; call [`Fleet::shutdown`].
pub struct Fleet {
    /// The workers.
    pub workers: Vec<WorkerInfo>,
    shutdown: CancellationToken,
    tasks: Vec<JoinHandle<()>>,
}

fn offset_port(endpoint: &str, by: u16) -> Result<String, StartError> {
    if by == 0 {
        return Ok(endpoint.to_owned());
    }
    let (head, port) =
        endpoint.rsplit_once(':').ok_or_else(|| StartError::Config(format!("endpoint {endpoint} has no port")))?;
    let port: u16 = port.parse().map_err(|_| StartError::Config(format!("endpoint {endpoint} has no numeric port")))?;
    if port == 0 {
        return Ok(endpoint.to_owned());
    }
    Ok(format!("{head}:{}", port + by))
}

impl Fleet {
    /// Starts every worker; returns once all sockets are bound.
    pub async fn start(cfg: SimConfig) -> Result<Fleet, StartError> {
        if !(cfg.time_scale.is_finite() && cfg.time_scale >= 0.0) {
            return Err(StartError::Config("--time-scale must be a non-negative number".into()));
        }
        let tokenizer = Arc::new(EngineTokenizer::from_dir(&cfg.tokenizer_dir)?);
        let shutdown = CancellationToken::new();
        let mut workers = Vec::new();
        let mut tasks = Vec::new();
        for i in 0..cfg.workers.max(1) {
            let faults = Arc::new(Faults::default());
            let metrics = Arc::new(Metrics::new(&cfg.served_model_name, &cfg.profile, cfg.prefix_caching_hash_algo));
            let (publisher_tx, kv_events, kv_replay) = match cfg.kv_events.as_ref().filter(|k| k.publishes()) {
                Some(k) => {
                    let by = u16::try_from(2 * i).map_err(|_| StartError::Config("too many workers".into()))?;
                    let pcfg = PublisherConfig {
                        endpoint: offset_port(&k.endpoint, by)?,
                        replay_endpoint: k.replay_endpoint.as_deref().map(|r| offset_port(r, by)).transpose()?,
                        topic: k.topic.clone(),
                        buffer_steps: k.buffer_steps,
                        format: cfg.wire_format,
                        host: cfg.host.clone(),
                        dp_rank: 0,
                    };
                    let publisher = Publisher::start(pcfg).await?;
                    let (bound, replay) = (publisher.bound.clone(), publisher.replay_bound.clone());
                    let (tx, rx) = mpsc::unbounded_channel();
                    tasks.push(tokio::spawn(publisher.run(rx, faults.clone(), shutdown.clone())));
                    (Some(tx), Some(bound), replay)
                }
                None => (None, None, None),
            };
            // Engine hashes differ per worker and per start, like vLLM's random NONE_HASH.
            let salt = mix(cfg.seed ^ u64::from(i).wrapping_mul(0x9e37)) ^ mix(std::process::id().into());
            // As vLLM: PYTHONHASHSEED, when set, seeds sha256_cbor's NONE_HASH.
            let none_hash_seed =
                std::env::var("PYTHONHASHSEED").unwrap_or_else(|_| hash::DEFAULT_NONE_HASH_SEED.into());
            let engine = Engine::new(cfg.profile.clone(), salt, cfg.seed, tokenizer.output_vocab())
                .with_hash(cfg.prefix_caching_hash_algo, &none_hash_seed);
            let (handle, engine_task) = runtime::spawn(
                engine,
                LoopDeps {
                    metrics: metrics.clone(),
                    faults: faults.clone(),
                    publisher: publisher_tx,
                    time_scale: cfg.time_scale,
                    shutdown: shutdown.clone(),
                },
            );
            tasks.push(engine_task);
            let state = Arc::new(AppState {
                worker: handle,
                tokenizer: tokenizer.clone(),
                model: cfg.served_model_name.clone(),
                max_model_len: cfg.profile.max_model_len,
                default_max_tokens: cfg.profile.default_max_tokens,
                block_size: cfg.profile.block_size,
                prompt_tokens_details: cfg.enable_prompt_tokens_details,
                metrics,
                faults,
                time_scale: cfg.time_scale,
                worker_index: i,
                seed: cfg.seed ^ u64::from(i),
                next_id: AtomicU64::new(0),
                shutdown: shutdown.clone(),
            });
            let port = if cfg.port == 0 {
                0
            } else {
                cfg.port + u16::try_from(i).map_err(|_| StartError::Config("too many workers".into()))?
            };
            let addr = format!("{}:{port}", cfg.host);
            let listener =
                TcpListener::bind(&addr).await.map_err(|source| StartError::Listen { addr: addr.clone(), source })?;
            let http = listener.local_addr().map_err(|source| StartError::Listen { addr, source })?;
            let app = router(state);
            // Token-by-token streaming writes small frames; without TCP_NODELAY, Nagle's algorithm
            // holds them back until the peer's delayed ACK (~40 ms on Linux).
            let listener = axum::serve::ListenerExt::tap_io(listener, |tcp| {
                let _ = tcp.set_nodelay(true);
            });
            let stop = shutdown.clone();
            tasks.push(tokio::spawn(async move {
                let _ = axum::serve(listener, app).with_graceful_shutdown(async move { stop.cancelled().await }).await;
            }));
            workers.push(WorkerInfo { index: i, http, kv_events, kv_replay });
        }
        Ok(Fleet { workers, shutdown, tasks })
    }

    /// Stops every worker and waits for their tasks.
    pub async fn shutdown(self) {
        self.shutdown.cancel();
        for t in self.tasks {
            let _ = t.await;
        }
    }

    /// A token that stops the fleet when cancelled.
    pub fn shutdown_token(&self) -> CancellationToken {
        self.shutdown.clone()
    }
}
