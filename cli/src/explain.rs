//! `switchyard explain`: the engine's decision for one request on a given fleet state.
//!
//! Inputs are files a platform engineer can write by hand or capture from a running spoke:
//! the configuration directory, a request (JSON or YAML) and a fleet state (per worker:
//! queue, KV usage, and the prompt tokens that worker has cached for this request).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::json;
use switchyard_config::yaml;
use switchyard_core::engine::{Decision, Outcome, Target};
use switchyard_core::request::{Complexity, RequestClass, RequestFeatures, WorkerKey};
use switchyard_core::snapshot::{FleetSnapshot, ProviderState, WorkerState};
use switchyard_core::{FleetConfig, decide};

use crate::{Exit, Format};

/// Arguments of `switchyard explain`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Configuration files or directories.
    #[arg(long, required = true, value_name = "PATH")]
    config: Vec<PathBuf>,
    /// The request (JSON or YAML): model, tenant, tags, class, complexity, promptTokens or prompt.
    #[arg(long, value_name = "FILE")]
    request: PathBuf,
    /// Fleet state (JSON or YAML): workers with their queues, KV usage and cached prefix tokens.
    #[arg(long, value_name = "FILE")]
    state: PathBuf,
    /// Output format.
    #[arg(long, value_enum, default_value_t)]
    format: Format,
}

/// A request as written in an explain file.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RequestFile {
    model: String,
    #[serde(default)]
    tenant: Option<String>,
    #[serde(default)]
    tags: BTreeSet<String>,
    #[serde(default)]
    class: RequestClass,
    #[serde(default)]
    complexity: Option<Complexity>,
    /// Exact prompt length in tokens.
    #[serde(default)]
    prompt_tokens: Option<u32>,
    /// Prompt text; its length is estimated (4 bytes per token) when promptTokens is absent.
    #[serde(default)]
    prompt: Option<String>,
    #[serde(default)]
    max_tokens: Option<u32>,
    /// Seeds the tie-break between equal candidates.
    #[serde(default)]
    request_id: Option<String>,
}

/// Fleet state as written in an explain file.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct StateFile {
    #[serde(default)]
    workers: Vec<WorkerEntry>,
    #[serde(default)]
    providers: BTreeMap<String, ProviderState>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct WorkerEntry {
    worker_set: String,
    worker: String,
    #[serde(default = "yes")]
    healthy: bool,
    #[serde(default)]
    waiting_requests: u32,
    #[serde(default)]
    running_requests: u32,
    #[serde(default)]
    waiting_prefill_tokens: Option<u64>,
    #[serde(default)]
    kv_cache_usage_percent: f64,
    /// Prompt tokens of this request already cached on the worker.
    #[serde(default)]
    cached_prefix_tokens: u32,
}

fn yes() -> bool {
    true
}

/// Runs the engine once and prints the decision.
pub fn run(args: &Args) -> anyhow::Result<Exit> {
    let checked = switchyard_config::check_paths(&args.config)?;
    for d in &checked.diagnostics {
        eprintln!("{d}");
    }
    if checked.error_count() > 0 {
        eprintln!(
            "switchyard: the configuration has {} error(s); fix them first (see `switchyard validate`)",
            checked.error_count()
        );
        return Ok(Exit::Invalid);
    }
    let cfg = &checked.config;
    let request: RequestFile = read_doc(&args.request)?;
    let state: StateFile = read_doc(&args.state)?;
    let (snapshot, cached) = build_snapshot(cfg, &state, &args.state)?;
    let (features, estimated) = build_request(request, cached);
    let decision = decide(cfg, &snapshot, &features);
    match args.format {
        Format::Text => print!("{}", render_text(&features, estimated, &decision)),
        Format::Json => {
            let out = json!({ "request": features, "promptTokensEstimated": estimated, "decision": decision });
            println!("{}", serde_json::to_string_pretty(&out)?);
        }
    }
    Ok(Exit::Ok)
}

/// Reads one YAML or JSON document, reporting syntax errors with `file:line:col`.
fn read_doc<T: DeserializeOwned>(path: &Path) -> anyhow::Result<T> {
    let text = fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    let (mut docs, errors) = yaml::parse(&text);
    if let Some(e) = errors.first() {
        bail!("{}:{}:{}: {}", path.display(), e.pos.line, e.pos.col, e.message);
    }
    let Some(doc) = docs.pop() else { bail!("{}: empty document", path.display()) };
    serde_json::from_value(doc.value).with_context(|| format!("{}: invalid content", path.display()))
}

fn build_snapshot(
    cfg: &FleetConfig,
    state: &StateFile,
    path: &Path,
) -> anyhow::Result<(FleetSnapshot, BTreeMap<WorkerKey, u32>)> {
    let mut snapshot = FleetSnapshot::default();
    let mut cached = BTreeMap::new();
    for (i, w) in state.workers.iter().enumerate() {
        let known = cfg.worker_sets.get(&w.worker_set).is_some_and(|ws| ws.workers.iter().any(|n| **n == *w.worker));
        if !known {
            bail!(
                "{}: workers[{i}]: {}/{} is not a worker of any InferenceWorkerSet in the configuration",
                path.display(),
                w.worker_set,
                w.worker
            );
        }
        if !(0.0..=100.0).contains(&w.kv_cache_usage_percent) {
            bail!("{}: workers[{i}]: kvCacheUsagePercent must be within 0..=100", path.display());
        }
        let key = WorkerKey { worker_set: w.worker_set.as_str().into(), worker: w.worker.as_str().into() };
        snapshot.workers.insert(
            key.clone(),
            WorkerState {
                healthy: w.healthy,
                waiting_requests: w.waiting_requests,
                running_requests: w.running_requests,
                waiting_prefill_tokens: w.waiting_prefill_tokens,
                kv_cache_usage_percent: w.kv_cache_usage_percent,
                ttft: None,
                outlook: None,
                held_requests: 0,
            },
        );
        if w.cached_prefix_tokens > 0 {
            cached.insert(key, w.cached_prefix_tokens);
        }
    }
    for name in state.providers.keys() {
        if !cfg.providers.contains_key(name) {
            bail!("{}: providers.{name}: no such InferenceProvider in the configuration", path.display());
        }
    }
    snapshot.providers = state.providers.clone();
    Ok((snapshot, cached))
}

fn build_request(r: RequestFile, cached_tokens: BTreeMap<WorkerKey, u32>) -> (RequestFeatures, bool) {
    let (prompt_tokens, estimated) = match (r.prompt_tokens, &r.prompt) {
        (Some(n), _) => (n, false),
        (None, Some(text)) => (u32::try_from(text.len().div_ceil(4)).unwrap_or(u32::MAX), true),
        (None, None) => (0, true),
    };
    let tie_breaker = r.request_id.as_deref().map_or(0, |id| {
        id.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3))
    });
    let features = RequestFeatures {
        model: r.model,
        tenant: r.tenant,
        tags: r.tags,
        class: r.class,
        complexity: r.complexity,
        prompt_tokens,
        max_output_tokens: r.max_tokens,
        cached_tokens,
        tie_breaker,
        block_keys: Default::default(),
    };
    (features, estimated)
}

fn describe_target(t: &Target) -> String {
    match t {
        Target::Worker { worker_set, worker, served_model } => {
            format!("worker {worker_set}/{worker} (serves {served_model})")
        }
        Target::Provider { provider, model, provider_model_id } => {
            format!("provider {provider}/{model} ({provider_model_id})")
        }
    }
}

/// Renders a decision for a terminal. Stable: golden tests pin it.
pub fn render_text(req: &RequestFeatures, estimated: bool, d: &Decision) -> String {
    let mut s = String::new();
    let verdict = match &d.outcome {
        Outcome::Route { target } => format!("ROUTE to {}", describe_target(target)),
        Outcome::Reject { reason, message } => format!(
            "REJECT ({}): {message}",
            serde_json::to_value(reason).ok().and_then(|v| v.as_str().map(str::to_owned)).unwrap_or_default()
        ),
        Outcome::Queue { message } => format!("QUEUE: {message}"),
    };
    let _ = writeln!(s, "decision: {verdict}");
    let _ = writeln!(s, "policy:   {}", d.policy);
    let tags: Vec<&str> = req.tags.iter().map(String::as_str).collect();
    let _ = writeln!(
        s,
        "request:  model={} tenant={} tags=[{}] class={} complexity={} prompt={} tokens{}",
        req.model,
        req.tenant.as_deref().unwrap_or("-"),
        tags.join(","),
        match req.class {
            RequestClass::Interactive => "interactive",
            RequestClass::Batch => "batch",
        },
        match req.complexity {
            None => "-",
            Some(Complexity::Low) => "low",
            Some(Complexity::Medium) => "medium",
            Some(Complexity::High) => "high",
        },
        req.prompt_tokens,
        if estimated { " (estimated)" } else { "" }
    );
    let _ = writeln!(s, "\ntrace:");
    for (i, e) in d.trace.iter().enumerate() {
        let counts = match (e.before, e.after) {
            (Some(b), Some(a)) => format!("  [{b} -> {a}]"),
            (None, Some(a)) => format!("  [{a}]"),
            _ => String::new(),
        };
        let _ = writeln!(s, "  {:>2}. {:<28} {}{counts}", i + 1, e.stage, e.detail);
        for r in &e.removed {
            let _ = writeln!(s, "        - {}: {}", r.candidate, r.reason);
        }
    }
    if !d.alternatives.is_empty() {
        let _ = writeln!(s, "\nranked candidates (best first):");
        let _ = writeln!(
            s,
            "  {:<3} {:<38} {:<12} {:>9} {:>9} {:>10} {:>7} {:>7} {:>5} {:>10}",
            "#", "target", "model", "ttft_ms", "queue_ms", "prefill_ms", "cached", "waiting", "kv%", "cost_usd"
        );
        for (i, c) in d.alternatives.iter().enumerate() {
            let _ = writeln!(
                s,
                "  {:<3} {:<38} {:<12} {:>9.0} {:>9.0} {:>10.0} {:>7} {:>7} {:>5.0} {:>10.6}",
                i + 1,
                c.label(),
                c.public_model,
                c.predicted_ttft.total_ms,
                c.predicted_ttft.queue_ms,
                c.predicted_ttft.prefill_ms,
                c.cached_tokens,
                c.waiting_requests,
                c.kv_cache_usage_percent,
                c.estimated_cost_usd
            );
        }
    }
    s
}
