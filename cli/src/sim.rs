//! `switchyard sim`: run simulated vLLM workers (flags mirror `vllm serve` where they
//! overlap), or with `--api bedrock` a faithful AWS Bedrock Runtime endpoint.

use std::path::PathBuf;
use switchyard_sim::engine::hash::HashAlgo;

use anyhow::{Context, bail};
use serde_json::json;
use switchyard_sim::bedrock::{BedrockConfig, BedrockEndpoint, LatencyModel};
use switchyard_sim::profile;
use switchyard_sim::wire::WireFormat;
use switchyard_sim::{Fleet, KvEventsConfig, SimConfig};
use switchyard_tokenizer::find_default_dir;

use crate::Exit;

/// Arguments of `switchyard sim`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Model name (as `vllm serve MODEL`); the default for --served-model-name.
    #[arg(value_name = "MODEL")]
    model: Option<String>,
    /// Bind address.
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// HTTP port of the first worker; worker i listens on port + i (0 = any free port).
    #[arg(long, default_value_t = 8000)]
    port: u16,
    /// Number of workers to run in this process.
    #[arg(long, default_value_t = 1)]
    workers: u32,
    /// Model name reported by the API and required in requests.
    #[arg(long)]
    served_model_name: Option<String>,
    /// Hugging Face tokenizer directory (tokenizer.json, tokenizer_config.json); defaults to
    /// the project's `tokenizer/files`.
    #[arg(long, value_name = "DIR")]
    tokenizer: Option<PathBuf>,
    /// Engine profile: `tiny` (fast tests) or `l40s-27b-fp8` (the benchmark's reference).
    #[arg(long, default_value = "tiny")]
    profile: String,
    /// Multiplier on every simulated duration (0.1 = ten times faster than real).
    #[arg(long, default_value_t = 1.0)]
    time_scale: f64,
    /// Tokens per KV-cache block.
    #[arg(long)]
    block_size: Option<u32>,
    /// Running-batch limit.
    #[arg(long)]
    max_num_seqs: Option<u32>,
    /// Per-step token budget (chunked prefill).
    #[arg(long)]
    max_num_batched_tokens: Option<u32>,
    /// KV-cache size in blocks.
    #[arg(long)]
    num_gpu_blocks_override: Option<u32>,
    /// Context limit.
    #[arg(long)]
    max_model_len: Option<u32>,
    /// vLLM's KV-event configuration JSON, e.g.
    /// '{"enable_kv_cache_events":true,"publisher":"zmq","endpoint":"tcp://*:5557","replay_endpoint":"tcp://*:5558"}'.
    #[arg(long, value_name = "JSON")]
    kv_events_config: Option<String>,
    /// KV-event encoding: `current` (maps, vLLM ≥ 0.26) or `legacy` (positional arrays).
    #[arg(long, default_value = "current")]
    kv_events_format: WireFormat,
    /// Report usage.prompt_tokens_details.cached_tokens.
    #[arg(long)]
    enable_prompt_tokens_details: bool,
    /// Block hashes: `sha256` (the simulator's own stand-in for vLLM's pickle-based default) or
    /// `sha256_cbor` (vLLM's, bit for bit; NONE_HASH from PYTHONHASHSEED when set).
    #[arg(long, default_value = "sha256", value_parser = ["sha256", "sha256_cbor"])]
    prefix_caching_hash_algo: String,
    /// Seed for generated tokens.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Write the workers' addresses as JSON to this file once they listen.
    #[arg(long, value_name = "FILE")]
    ready_file: Option<PathBuf>,
    /// Which API to serve: `vllm` workers, or one `bedrock` Runtime endpoint (Converse,
    /// ConverseStream, CountTokens; MODEL, when given, is the only model id it serves).
    #[arg(long, default_value = "vllm", value_parser = ["vllm", "bedrock"])]
    api: String,
    /// Bedrock: milliseconds before the first token (plus 0.02 ms per input token).
    #[arg(long, default_value_t = 250.0)]
    first_token_ms: f64,
    /// Bedrock: milliseconds between output tokens.
    #[arg(long, default_value_t = 10.0)]
    per_output_token_ms: f64,
}

/// Builds the simulator configuration from flags (pure apart from locating the tokenizer).
pub fn config(args: &Args) -> anyhow::Result<SimConfig> {
    let mut p = profile::by_name(&args.profile)
        .with_context(|| format!("unknown profile `{}` (known: tiny, l40s-27b-fp8)", args.profile))?
        .clone();
    if let Some(v) = args.block_size {
        p.block_size = v;
    }
    if let Some(v) = args.max_num_seqs {
        p.max_num_seqs = v;
    }
    if let Some(v) = args.max_num_batched_tokens {
        p.max_num_batched_tokens = v;
    }
    if let Some(v) = args.num_gpu_blocks_override {
        p.num_gpu_blocks = v;
    }
    if let Some(v) = args.max_model_len {
        p.max_model_len = v;
    }
    if p.block_size == 0 || p.max_num_seqs == 0 || p.max_num_batched_tokens == 0 || p.num_gpu_blocks == 0 {
        bail!("block size, max-num-seqs, max-num-batched-tokens and the block count must be positive");
    }
    let kv_events = match &args.kv_events_config {
        None => None,
        Some(text) => Some(
            serde_json::from_str::<KvEventsConfig>(text)
                .context("--kv-events-config is not valid JSON for KVEventsConfig")?,
        ),
    };
    let tokenizer_dir = match &args.tokenizer {
        Some(d) => d.clone(),
        None => {
            let here = std::env::current_dir().unwrap_or_default();
            let exe = std::env::current_exe().unwrap_or_default();
            find_default_dir(&here)
                .or_else(|| find_default_dir(&exe))
                .context("no tokenizer found: pass --tokenizer DIR (a Hugging Face tokenizer directory)")?
        }
    };
    Ok(SimConfig {
        host: args.host.clone(),
        port: args.port,
        workers: args.workers,
        served_model_name: args
            .served_model_name
            .clone()
            .or_else(|| args.model.clone())
            .unwrap_or_else(|| "sim-model".to_owned()),
        tokenizer_dir,
        profile: p,
        time_scale: args.time_scale,
        seed: args.seed,
        kv_events,
        wire_format: args.kv_events_format,
        enable_prompt_tokens_details: args.enable_prompt_tokens_details,
        prefix_caching_hash_algo: match args.prefix_caching_hash_algo.as_str() {
            "sha256_cbor" => HashAlgo::Sha256Cbor,
            _ => HashAlgo::Sha256,
        },
    })
}

/// Runs the workers (or the Bedrock endpoint) until Ctrl-C or SIGTERM.
pub fn run(args: &Args) -> anyhow::Result<Exit> {
    if args.api == "bedrock" {
        return run_bedrock(args);
    }
    let cfg = config(args)?;
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().context("starting the async runtime")?;
    rt.block_on(async move {
        let fleet = Fleet::start(cfg.clone()).await?;
        let mut ready = Vec::new();
        for w in &fleet.workers {
            println!(
                "worker {}: http://{}  kv-events {}  replay {}",
                w.index,
                w.http,
                w.kv_events.as_deref().unwrap_or("-"),
                w.kv_replay.as_deref().unwrap_or("-")
            );
            ready.push(json!({"index": w.index, "url": format!("http://{}", w.http), "kvEvents": w.kv_events, "kvReplay": w.kv_replay}));
        }
        println!("model {} · profile {} · time scale {}", cfg.served_model_name, cfg.profile.name, cfg.time_scale);
        if let Some(path) = &args.ready_file {
            crate::ready::write(path, &json!({"model": cfg.served_model_name, "workers": ready}))?;
        }
        crate::signals::wait_for_shutdown().await;
        fleet.shutdown().await;
        anyhow::Ok(())
    })?;
    Ok(Exit::Ok)
}

/// The Bedrock endpoint's configuration from flags.
pub fn bedrock_config(args: &Args) -> anyhow::Result<BedrockConfig> {
    if !(args.first_token_ms >= 0.0 && args.per_output_token_ms >= 0.0 && args.time_scale > 0.0) {
        bail!("--first-token-ms and --per-output-token-ms must be non-negative and --time-scale positive");
    }
    Ok(BedrockConfig {
        host: args.host.clone(),
        port: args.port,
        models: args.model.iter().cloned().collect(),
        latency: LatencyModel {
            first_token_ms: args.first_token_ms,
            per_output_token_ms: args.per_output_token_ms,
            ..LatencyModel::default()
        },
        time_scale: args.time_scale,
    })
}

fn run_bedrock(args: &Args) -> anyhow::Result<Exit> {
    let cfg = bedrock_config(args)?;
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().context("starting the async runtime")?;
    rt.block_on(async move {
        let endpoint = BedrockEndpoint::start(cfg.clone())
            .await
            .with_context(|| format!("cannot listen on {}:{}", cfg.host, cfg.port))?;
        println!(
            "bedrock runtime endpoint: {}  (models: {})",
            endpoint.url(),
            if cfg.models.is_empty() { "any".to_owned() } else { cfg.models.join(", ") }
        );
        if let Some(path) = &args.ready_file {
            crate::ready::write(path, &json!({"api": "bedrock", "url": endpoint.url()}))?;
        }
        crate::signals::wait_for_shutdown().await;
        endpoint.shutdown().await;
        anyhow::Ok(())
    })?;
    Ok(Exit::Ok)
}
