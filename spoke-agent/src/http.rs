//! The spoke's side of the request path ([`switchyard_gateway`]): planning over the cluster's
//! vLLM workers, and the admin endpoints.
//!
//! One request (the gateway parses, admits and relays; this module plans and observes):
//! 1. [`SpokeBackend::route`] resolves the model to worker sets, renders the request into the
//!    exact body each set's engines will receive ([`openai::upstream_body`]) and tokenizes that
//!    body (local files on the CPU pool, or the engine's render endpoint with a timeout);
//! 2. [`SpokeBackend::place`], which never awaits, looks the prompt's blocks up in each set's
//!    KV index (one walk), builds the snapshot from live load and the in-flight ledger, and
//!    runs the pure planning step ([`plan`]);
//! 3. still inside `place`, books the first choice's blocks before anything else can await,
//!    and hands the relay the healthy alternatives in rank order, each with its observers:
//!    the load ledger, TTFT calibration, the fidelity guard and worker health. The decision
//!    trace goes into the log typed and is rendered only when asked for.
//!
//! Admin endpoints (`/status`, `/metrics`, `/readyz`, `/debug/decisions/{id}`) are served on
//! their own listener ([`admin_router`]), loopback by default. Decision ids are the request's
//! random 128-bit id, and traces carry counts, never prompt text.

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::{Path as AxPath, State};
use axum::http::{HeaderName, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use dynamo_kv_router::protocols::LocalBlockHash;
use rustc_hash::FxHashMap;
use serde_json::{Map, Value, json};
use switchyard_core::Name;
use switchyard_core::engine::{Outcome as Decided, Target as DecidedTarget};
use switchyard_core::fleet::{DEFAULT_EXPECTED_OUTPUT_TOKENS, WorkerSet};
use switchyard_core::pacing;
use switchyard_core::predictor::TtftModel;
use switchyard_core::replica::{Ended, EngineModel, Sent, median};
use switchyard_core::request::WorkerKey;
use switchyard_core::resolve;
use switchyard_gateway::admission::CpuPool;
use switchyard_gateway::observe::{Booking, Dispatch, Observer, Outcome, Release};
use switchyard_gateway::server::ServeConfig;
use switchyard_gateway::upstream::{OpenAiUpstream, ResponseBounds, Upstream};
use switchyard_gateway::{Backend, ErrorKind, GatewayError, InferenceRequest, Routed, Target, Usage, openai, plan};
use switchyard_proto::v1::UsageRecord;
use switchyard_providers::Providers;
use switchyard_providers::spill::{Spillover, spill_targets};
use tokio::sync::watch;

use crate::fidelity::{Mode, Sample};
use crate::index::KvIndex;
use crate::load;
use crate::metric_names as m;
use crate::metrics::{Metrics, labels};
use crate::registry::{Registry, WorkerRuntime};
use crate::source::SourceStatus;
use crate::tokenize::{Api, TokenizeError};
use crate::topology::Topology;

/// The longest a request waits at the spoke for dispatch pacing before it is sent to its
/// worker anyway: pacing reorders a backlog, it does not refuse one.
const MAX_HOLD: Duration = Duration::from_secs(60);
/// The oldest request held for a worker plans again at least this often, whatever it was
/// woken by (the pacing gap may end sooner).
const HOLD_RECHECK: Duration = Duration::from_millis(250);
/// Requests held behind it plan again when a sweep reaches them, and at least this often: a
/// safety net (see [`crate::hold`]), seldom enough not to overtake the oldest.
const HOLD_BEHIND_RECHECK: Duration = Duration::from_secs(1);

/// Decisions kept for `/debug/decisions/{id}`.
const DECISION_LOG: usize = 2048;
/// Workers tried when connections are refused (healthy alternatives only).
const MAX_ATTEMPTS: usize = 3;
/// Ranked alternatives a decision trace keeps (the rest are counted): a trace per request
/// of every worker of a large set would make the log itself the request path's cost.
const TRACE_ALTERNATIVES: usize = 8;

/// Limits of the spoke's request path.
#[derive(Debug, Clone)]
pub struct Limits {
    /// The gateway front door's limits (body, concurrency, upstream timeouts).
    pub front: switchyard_gateway::server::Limits,
    /// Server timeouts and drain.
    pub serve: ServeConfig,
    /// Time to connect to a worker.
    pub connect_timeout: Duration,
    /// Time for an engine's render endpoint to answer.
    pub render_timeout: Duration,
    /// Bounds on what workers send back.
    pub bounds: ResponseBounds,
    /// Threads for tokenization and large-body parsing (0: one per core).
    pub cpu_threads: usize,
    /// Largest KV-event message accepted from a worker (ZMQ frames are checked before the
    /// decoder allocates).
    pub max_kv_message_bytes: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            front: switchyard_gateway::server::Limits::default(),
            serve: ServeConfig::default(),
            connect_timeout: Duration::from_secs(2),
            render_timeout: Duration::from_secs(10),
            bounds: ResponseBounds::default(),
            cpu_threads: 0,
            max_kv_message_bytes: crate::kv_subscriber::DEFAULT_MAX_MESSAGE_BYTES,
        }
    }
}

/// Shared state of the spoke's request path.
pub struct App {
    /// Live workers and sets.
    pub registry: Arc<Registry>,
    /// Current configuration.
    pub topology: watch::Receiver<Arc<Topology>>,
    /// Client for workers.
    pub client: reqwest::Client,
    /// Counters and histograms.
    pub metrics: Arc<Metrics>,
    /// Recent decisions, by request id, with the fidelity mode of every set at the time.
    pub(crate) decisions: Mutex<VecDeque<DecisionTrace>>,
    /// Request counter (tie breaking only; never exposed).
    pub next_request: AtomicU64,
    /// Limits.
    pub limits: Limits,
    /// Configuration source status.
    pub source_status: Arc<Mutex<SourceStatus>>,
    /// CPU pool for tokenization.
    pub cpu: CpuPool,
    /// Requests held by dispatch pacing, in line per worker set; a worker's ledger change (a
    /// first token, an end) wakes the ones it concerns.
    pub holds: crate::hold::HoldLines,
    /// External providers of the current configuration (rebuilt when they change).
    pub providers: std::sync::RwLock<Arc<Providers>>,
    /// Spillover requests and their exact cost, per provider and model.
    pub spill: Arc<Spillover>,
    /// The hub link's state, when the spoke has a hub.
    pub hub: Option<Arc<Mutex<crate::hub_client::HubStatus>>>,
    /// Usage records for the hub (only with a hub).
    pub usage: Option<Arc<crate::usage::UsageOutbox>>,
}

impl App {
    /// The providers now.
    pub fn providers(&self) -> Arc<Providers> {
        self.providers.read().map(|p| p.clone()).unwrap_or_else(|_| Arc::new(Providers::none()))
    }
}

/// The spoke as a gateway backend.
#[derive(Clone)]
pub struct SpokeBackend(pub Arc<App>);

/// One worker set's view of the prompt, as the tokenization phase leaves it.
pub struct SetPrompt {
    /// The worker set.
    pub set: String,
    /// The prompt's tokens exactly as the set's engines will compute them.
    pub tokens: Vec<u32>,
    /// BLAKE3 of the token ids (little-endian u32s): lets a test or an operator compare the
    /// spoke's tokenization with the engine's `/tokenize` without the trace holding the prompt.
    pub digest: blake3::Hash,
    /// The body that was tokenized, sent as it is to the set's workers.
    pub body: Arc<Map<String, Value>>,
}

/// Per worker set, what the planning step keeps of the prompt.
struct SetTokens {
    tokens: usize,
    digest: blake3::Hash,
    hashes: Arc<Vec<LocalBlockHash>>,
    body: Arc<Map<String, Value>>,
}

impl App {
    /// Worker sets serving `model` (a public name or alias); only `pinned` when the request
    /// names one (the hub's choice), which must serve the model.
    fn worker_sets(&self, topo: &Topology, model: &str, pinned: Option<&str>) -> Result<Vec<String>, GatewayError> {
        let sets =
            resolve::worker_sets(&topo.fleet, model).map_err(|e| GatewayError::model_not_found(e.to_string()))?;
        match pinned {
            None => Ok(sets),
            Some(p) if sets.iter().any(|s| s == p) => Ok(vec![p.to_owned()]),
            Some(p) => Err(GatewayError::invalid(format!("worker set `{p}` does not serve model `{model}` here"))),
        }
    }

    /// Tokens of `req` as the engines of `set` will compute them, with the body they were
    /// computed from (`None`: no tokenizer).
    async fn tokens_for(
        &self,
        topo: &Topology,
        set: &str,
        req: &InferenceRequest,
    ) -> Result<Option<SetPrompt>, GatewayError> {
        let Some(rt) = self.registry.set(set) else { return Ok(None) };
        let Ok(tokenizer) = &rt.tokenizer else { return Ok(None) };
        let served = topo.fleet.worker_sets.get(set).map(|ws| &*ws.served_model).unwrap_or(req.model.as_str());
        // The very body the worker will be sent: what is tokenized is what the engine sees.
        let body = Arc::new(openai::upstream_body(req, served));
        let render_url = self
            .registry
            .workers()
            .into_iter()
            .find(|w| &*w.key.worker_set == set && w.load.healthy())
            .map(|w| w.endpoint.http_url.clone());
        let api = if req.is_chat() { Api::Chat } else { Api::Completion };
        let started = Instant::now();
        match tokenizer
            .tokens(api, body.clone(), &self.client, render_url.as_deref(), &self.cpu, self.limits.render_timeout)
            .await
        {
            Ok(tokens) => {
                // Time on the request path before the decision: a router's own turnaround,
                // which the engines' queues feel as a client's would (e2e/bench/README.md).
                self.metrics.observe(m::TOKENIZE_SECONDS, &[("worker_set", set)], started.elapsed().as_secs_f64());
                Ok(Some(SetPrompt { set: set.to_owned(), digest: token_digest(&tokens), tokens, body }))
            }
            Err(TokenizeError::BadRequest(msg)) => Err(GatewayError::invalid(msg)),
            Err(TokenizeError::Unavailable(msg)) => {
                tracing::warn!(worker_set = %set, error = %msg, "tokenization unavailable; routing this set by load");
                Ok(None)
            }
        }
    }
}

impl SpokeBackend {
    /// The planning half of routing, after tokenization: the KV-index lookup, the snapshot,
    /// the pure decision, the booking of the first choice and the ranked targets. It never
    /// awaits, so no request planned after it can miss its booking; it is what the routing
    /// benchmark times (`benches/routing.rs`). Never holds (see [`SpokeBackend::route`]).
    pub fn place(
        &self,
        topo: &Topology,
        req: &Arc<InferenceRequest>,
        sets: &[String],
        prompts: &[SetPrompt],
    ) -> Result<Routed, GatewayError> {
        match self.plan_dispatch(topo, req, sets, prompts, false)? {
            Placement::Send(routed) => Ok(routed),
            // Not reached: a request that may not be held is never held.
            Placement::Hold { .. } => Err(GatewayError::new(ErrorKind::Internal, "held", "the request was held")),
        }
    }

    /// [`SpokeBackend::place`], or, when `may_hold` and the first choice's worker set paces its
    /// dispatches and the worker does not take this prompt now ([`pacing`]), nothing booked
    /// and the time to plan again.
    fn plan_dispatch(
        &self,
        topo: &Topology,
        req: &Arc<InferenceRequest>,
        sets: &[String],
        prompts: &[SetPrompt],
        may_hold: bool,
    ) -> Result<Placement, GatewayError> {
        let app = &self.0;
        let request_no = app.next_request.fetch_add(1, Ordering::Relaxed) + 1;
        let workers: Vec<Arc<WorkerRuntime>> =
            app.registry.workers().into_iter().filter(|w| sets.iter().any(|s| **s == *w.key.worker_set)).collect();

        // Small maps probed once per worker: FxHash, not SipHash, on the request path.
        let mut per_set: FxHashMap<String, SetTokens> =
            FxHashMap::with_capacity_and_hasher(prompts.len(), Default::default());
        let mut cached = BTreeMap::new();
        let mut indexed_cached: FxHashMap<WorkerKey, u32> = FxHashMap::default();
        let mut prompt_tokens: Option<u32> = None;
        for prompt in prompts {
            let Some(set) = app.registry.set(&prompt.set) else { continue };
            prompt_tokens.get_or_insert(prompt.tokens.len() as u32);
            let hashes = set.index.hashes(&prompt.tokens);
            let overlaps = set.index.lookup(&hashes);
            let mode = set.guard.lock().map(|g| g.mode()).unwrap_or(Mode::Exact);
            let bs = set.index.block_size();
            for w in workers.iter().filter(|w| *w.key.worker_set == *prompt.set) {
                if let Some(&blocks) = overlaps.with_pending.get(&w.id) {
                    let trusted = mode.trusted_cached(blocks * bs);
                    if trusted > 0 {
                        cached.insert(w.key.clone(), trusted);
                    }
                }
                if let Some(&blocks) = overlaps.indexed.get(&w.id) {
                    indexed_cached.insert(w.key.clone(), blocks * bs);
                }
            }
            per_set.insert(
                prompt.set.clone(),
                SetTokens {
                    tokens: prompt.tokens.len(),
                    digest: prompt.digest,
                    hashes: Arc::new(hashes),
                    body: prompt.body.clone(),
                },
            );
        }

        let mut features = plan::features(req, prompt_tokens.unwrap_or(0), cached, request_no);
        // Only a replica's block accounting needs the hashes as keys.
        if let Some(t) = prompts
            .first()
            .filter(|p| topo.fleet.worker_sets.get(&p.set).is_some_and(|ws| ws.replicate_engines))
            .and_then(|p| per_set.get(&p.set))
        {
            features.block_keys = t.hashes.iter().map(|h| h.0).collect();
        }
        let now_ms = app.registry.now_ms();
        let cached = &features.cached_tokens;
        // Per worker set, once: its calibrated TTFT model and, if it replicates its engines, its
        // config (the replicas' shape).
        let set_models: FxHashMap<&str, (Option<TtftModel>, Option<&WorkerSet>)> = sets
            .iter()
            .map(|s| {
                let ttft = app.registry.set(s).and_then(|rt| rt.calibration.lock().ok().map(|c| c.model()));
                (s.as_str(), (ttft, topo.fleet.worker_sets.get(s).filter(|ws| ws.replicate_engines)))
            })
            .collect();
        let held = app.holds.held_for(sets);
        let mut snapshot = plan::snapshot(workers.iter().map(|w| {
            let (ttft, replicated) = set_models.get(&*w.key.worker_set).copied().unwrap_or((None, None));
            let held = held.get(&(w.key.worker_set.clone(), w.key.worker.clone())).copied().unwrap_or(0);
            (w.key.clone(), worker_view(w, replicated, ttft, now_ms, held))
        }));
        let providers = app.providers();
        snapshot.providers = providers.states(Instant::now());
        let started = Instant::now();
        let decision = plan::plan(&topo.fleet, &snapshot, &features);
        app.metrics.observe(m::DECISION_SECONDS, &[], started.elapsed().as_secs_f64());

        let trace = |mut decision: switchyard_core::Decision, targets| DecisionTrace {
            omitted_alternatives: decision.alternatives.len().saturating_sub(TRACE_ALTERNATIVES),
            decision: {
                decision.alternatives.truncate(TRACE_ALTERNATIVES);
                decision
            },
            id: req.id.clone(),
            modes: app
                .registry
                .sets()
                .iter()
                .map(|s| (s.config.name.clone(), s.guard.lock().map(|g| g.mode()).unwrap_or(Mode::Exact)))
                .collect(),
            targets,
            tokens: per_set.iter().map(|(s, t)| (s.clone(), t.tokens, t.hashes.len(), t.digest)).collect(),
            cached: cached.clone(),
            indexed: indexed_cached.clone(),
        };
        match &decision.outcome {
            Decided::Route { target: DecidedTarget::Worker { .. } } => {}
            Decided::Route { target: DecidedTarget::Provider { .. } } => {
                // Spillover: the decision's provider candidates, in rank order (already
                // filtered by the policy, residency and availability); never a worker.
                let targets = spill_targets(&decision, &topo.fleet, &providers, &app.spill, &req.id);
                let labels = targets.iter().map(|t| t.label().to_owned()).collect();
                let headers = [("x-switchyard-route", "spillover"), ("x-switchyard-policy", decision.policy.as_str())]
                    .into_iter()
                    .filter_map(|(k, v)| Some((HeaderName::from_static(k), HeaderValue::from_str(v).ok()?)))
                    .collect();
                app.log_decision(trace(decision, labels));
                return Ok(Placement::Send(Routed { targets, prompt_tokens, headers }));
            }
            Decided::Reject { reason, message } => {
                let err = plan::rejection(*reason, message.clone());
                app.log_decision(trace(decision, Vec::new()));
                return Err(err);
            }
            Decided::Queue { message } => {
                let err = GatewayError {
                    retry_after: Some(Duration::from_secs(1)),
                    ..GatewayError::new(ErrorKind::RateLimited, "queued", message.clone())
                };
                app.log_decision(trace(decision, Vec::new()));
                return Err(err);
            }
        }

        let healthy = |k: &WorkerKey| workers.iter().any(|w| w.key == *k && w.load.healthy());
        let ranked = plan::ranked_workers(&decision, MAX_ATTEMPTS, healthy);
        if may_hold
            && let Some((key, _)) = ranked.first()
            && let Some(ws) = topo.fleet.worker_sets.get(&*key.worker_set).filter(|ws| ws.paced)
            && let Some(worker) = workers.iter().find(|w| w.key == *key)
        {
            let view = pacing::PacingView {
                queued_prefill_tokens: worker.load.inflight_prefill_tokens.load(Ordering::Relaxed),
                step_token_budget: ws.step_token_budget(),
                reopens_at_ms: worker.load.reopens_at_ms(),
            };
            let own = per_set
                .get(&*key.worker_set)
                .map_or(0, |t| t.tokens as u64)
                .saturating_sub(u64::from(cached.get(key).copied().unwrap_or(0)));
            if !view.takes(own, now_ms) {
                // Held behind a prompt still waiting for its first token, it is woken by that
                // first token; only a hold for the gap alone ends by the clock.
                let recheck = if view.batches(own) {
                    let gap_left = Duration::from_secs_f64(((view.reopens_at_ms - now_ms) / 1_000.0).max(0.0));
                    gap_left.clamp(Duration::from_millis(1), HOLD_RECHECK)
                } else {
                    HOLD_RECHECK
                };
                return Ok(Placement::Hold { worker: key.clone(), recheck });
            }
        }
        let mut targets: Vec<Box<dyn Target>> = Vec::with_capacity(ranked.len());
        for (i, (key, served_model)) in ranked.into_iter().enumerate() {
            let (Some(worker), Some(set)) =
                (workers.iter().find(|w| w.key == key).cloned(), app.registry.set(&key.worker_set))
            else {
                continue;
            };
            let (tokens, hashes) = per_set
                .get(&*key.worker_set)
                .map(|t| (Some(t.tokens as u32), t.hashes.clone()))
                .unwrap_or((None, Arc::new(Vec::new())));
            // Book the first choice now, before anything else can await: a request with the
            // same prefix planned a moment later must already see it.
            let first_booking = (i == 0).then(|| book(&set.index, &worker, &hashes));
            targets.push(Box::new(WorkerTarget {
                label: format!("{}/{}", key.worker_set, key.worker),
                upstream: OpenAiUpstream {
                    client: app.client.clone(),
                    base_url: worker.endpoint.http_url.clone(),
                    served_model: served_model.to_string(),
                    body: per_set.get(&*key.worker_set).map(|t| t.body.clone()),
                    bounds: app.limits.bounds,
                    api_key: None,
                    spoke_worker_set: None,
                },
                app: app.clone(),
                index: set.index.clone(),
                worker,
                hashes,
                prompt_tokens: tokens,
                routed_cached: cached.get(&key).copied().unwrap_or(0),
                request_no,
                max_tokens: req.max_tokens.unwrap_or(DEFAULT_EXPECTED_OUTPUT_TOKENS),
                indexed_cached: indexed_cached.get(&key).copied().unwrap_or(0),
                first_booking: Mutex::new(first_booking),
                usage: app.usage.as_ref().map(|outbox| {
                    let record = UsageRecord {
                        request_id: req.id.clone(),
                        hub_request_id: req.hub_request_id.clone().unwrap_or_default(),
                        model: req.model.clone(),
                        worker_set: key.worker_set.to_string(),
                        worker: key.worker.to_string(),
                        ..UsageRecord::default()
                    };
                    (outbox.clone(), record)
                }),
            }));
        }
        let labels: Vec<String> = targets.iter().map(|t| t.label().to_owned()).collect();
        app.log_decision(trace(decision, labels));
        Ok(Placement::Send(Routed { targets, prompt_tokens, headers: Vec::new() }))
    }
}

/// What planning a request came to.
enum Placement {
    /// Send it to these targets (the first one booked).
    Send(Routed),
    /// Dispatch pacing holds it for `worker`: plan again when woken (see [`crate::hold`]), or
    /// after `recheck` if it is the oldest held for that worker.
    Hold { worker: WorkerKey, recheck: Duration },
}

impl Backend for SpokeBackend {
    fn models(&self) -> Vec<String> {
        let topo = self.0.topology.borrow().clone();
        topo.fleet.models.keys().chain(topo.fleet.aliases.keys()).cloned().collect()
    }

    async fn count_tokens(&self, req: Arc<InferenceRequest>) -> Result<u32, GatewayError> {
        let app = &self.0;
        let topo = app.topology.borrow().clone();
        for set in app.worker_sets(&topo, &req.model, req.worker_set.as_deref())? {
            if let Some(prompt) = app.tokens_for(&topo, &set, &req).await? {
                return Ok(prompt.tokens.len() as u32);
            }
        }
        Err(GatewayError::new(ErrorKind::NoCapacity, "no_tokenizer", "no tokenizer is available for this model"))
    }

    async fn route(&self, req: Arc<InferenceRequest>) -> Result<Routed, GatewayError> {
        let app = &self.0;
        let topo = app.topology.borrow().clone();
        let sets = app.worker_sets(&topo, &req.model, req.worker_set.as_deref())?;
        let mut prompts = Vec::with_capacity(sets.len());
        for name in &sets {
            if let Some(prompt) = app.tokens_for(&topo, name, &req).await? {
                prompts.push(prompt);
            }
        }
        // Dispatch pacing: plan, and while the chosen worker does not take the prompt, wait in
        // line for a change on it (or the pacing gap) and plan again, from fresh state.
        let held_since = Instant::now();
        let mut place: Option<crate::hold::HoldPlace<'_>> = None;
        let mut sweeps = Vec::new();
        loop {
            let may_hold = held_since.elapsed() < MAX_HOLD;
            match self.plan_dispatch(&topo, &req, &sets, &prompts, may_hold)? {
                Placement::Send(routed) => {
                    let held = if place.is_some() { held_since.elapsed().as_secs_f64() } else { 0.0 };
                    if let Some(place) = place {
                        place.leave(&sweeps);
                    }
                    if let Some(set) = routed.targets.first().and_then(|t| t.label().split_once('/')).map(|(s, _)| s) {
                        app.metrics.observe(m::DISPATCH_HOLD_SECONDS, &[("worker_set", set)], held);
                    }
                    return Ok(routed);
                }
                Placement::Hold { worker, recheck } => {
                    let place = place.get_or_insert_with(|| app.holds.place());
                    let oldest = place.hold_for(&worker.worker_set, &worker.worker, &sweeps);
                    sweeps = place.wait(if oldest { recheck } else { HOLD_BEHIND_RECHECK }).await;
                }
            }
        }
    }

    fn ready(&self) -> bool {
        self.0.registry.workers().iter().any(|w| w.load.healthy() && w.load.engine().1.is_some())
    }

    fn record(&self, endpoint: &'static str, status: u16) {
        let class = match status {
            200..=299 => "2xx",
            400..=499 => "4xx",
            _ => "5xx",
        };
        self.0.metrics.inc(m::REQUESTS_TOTAL, &[("route", endpoint), ("status", class)], 1.0);
    }
}

/// What the spoke knows about one worker when it plans.
fn worker_view(
    w: &WorkerRuntime,
    replicated: Option<&WorkerSet>,
    ttft: Option<TtftModel>,
    now_ms: f64,
    held_requests: u32,
) -> plan::WorkerView {
    let (engine, _) = w.load.engine();
    let outlook = replicated.and_then(|ws| {
        let mut model = w.model.lock().ok()?;
        if model.is_none() {
            // Once the engine has reported its KV capacity, the worker is replicated.
            *model = ws.engine_model(engine.num_gpu_blocks);
        }
        model.as_ref().map(|m| m.outlook(now_ms))
    });
    plan::WorkerView {
        healthy: w.load.healthy(),
        engine_waiting: engine.waiting,
        engine_running: engine.running,
        kv_usage: engine.kv_usage,
        unstarted_requests: w.load.inflight_unstarted.load(Ordering::Relaxed) as u32,
        unstarted_prefill_tokens: w.load.inflight_prefill_tokens.load(Ordering::Relaxed),
        held_requests,
        ttft,
        outlook,
    }
}

/// Books `hashes` as soon-to-be-cached on `worker`; released if the request fails.
fn book(index: &Arc<KvIndex>, worker: &WorkerRuntime, hashes: &Arc<Vec<LocalBlockHash>>) -> Booking {
    index.book(worker.id, hashes);
    Booking::new(Box::new(PendingBlocks { index: index.clone(), worker: worker.id, hashes: hashes.clone() }))
}

/// A booking of pending blocks in a worker set's index.
struct PendingBlocks {
    index: Arc<KvIndex>,
    worker: dynamo_kv_router::protocols::WorkerId,
    hashes: Arc<Vec<LocalBlockHash>>,
}

impl Release for PendingBlocks {
    fn release(self: Box<Self>) {
        self.index.unbook(self.worker, &self.hashes);
    }

    fn started(&self) {
        self.index.started(self.worker, &self.hashes);
    }
}

/// One vLLM worker as a relay target.
struct WorkerTarget {
    label: String,
    upstream: OpenAiUpstream,
    app: Arc<App>,
    index: Arc<KvIndex>,
    worker: Arc<WorkerRuntime>,
    hashes: Arc<Vec<LocalBlockHash>>,
    prompt_tokens: Option<u32>,
    routed_cached: u32,
    indexed_cached: u32,
    /// The request's number: its id in the worker's replica.
    request_no: u64,
    /// Output tokens the replica assumes until the engine reports them.
    max_tokens: u32,
    first_booking: Mutex<Option<Booking>>,
    /// The request's ids and model, for its usage record (with a hub).
    usage: Option<(Arc<crate::usage::UsageOutbox>, UsageRecord)>,
}

impl Target for WorkerTarget {
    fn label(&self) -> &str {
        &self.label
    }

    fn upstream(&self) -> &dyn Upstream {
        &self.upstream
    }

    fn dispatch(&self, _attempt: usize) -> Dispatch {
        let booking = match self.first_booking.lock().ok().and_then(|mut b| b.take()) {
            Some(b) => b,
            None => book(&self.index, &self.worker, &self.hashes),
        };
        let uncached = u64::from(self.prompt_tokens.unwrap_or(0).saturating_sub(self.routed_cached));
        let queued_ahead = self.worker.load.inflight_prefill_tokens.load(Ordering::Relaxed);
        let running = self.worker.load.engine().0.running;
        let ticket = load::dispatch(&self.worker.load, uncached);
        let replica = self.replicate().then(|| {
            Box::new(ReplicaObserver {
                app: self.app.clone(),
                worker: self.worker.clone(),
                id: self.request_no,
                output_tokens: None,
                last_token: None,
                gaps: Vec::new(),
            }) as Box<dyn Observer>
        });
        self.app.metrics.inc(
            m::DECISIONS_TOTAL,
            &[("worker_set", &self.worker.key.worker_set), ("worker", &self.worker.key.worker)],
            1.0,
        );
        Dispatch {
            booking,
            observers: [
                Box::new(LedgerObserver { app: self.app.clone(), ticket, worker: self.worker.clone() })
                    as Box<dyn Observer>,
                Box::new(CalibrationObserver {
                    app: self.app.clone(),
                    worker_set: self.worker.key.worker_set.clone(),
                    work_tokens: queued_ahead + uncached,
                    running,
                }),
                Box::new(FidelityObserver {
                    app: self.app.clone(),
                    worker_set: self.worker.key.worker_set.clone(),
                    predicted_prompt: self.prompt_tokens,
                    predicted_cached: self.indexed_cached,
                }),
            ]
            .into_iter()
            .chain(replica)
            .chain(self.usage.as_ref().map(|(outbox, record)| {
                Box::new(crate::usage::UsageObserver {
                    outbox: outbox.clone(),
                    record: record.clone(),
                    started: std::time::Instant::now(),
                    ttft: None,
                }) as Box<dyn Observer>
            }))
            .collect(),
        }
    }
}

impl WorkerTarget {
    /// Enters the dispatch in the worker's replica; false when the worker has none.
    fn replicate(&self) -> bool {
        let Ok(mut model) = self.worker.model.lock() else { return false };
        let Some(model) = model.as_mut() else { return false };
        let bs = model.replica().shape().block_size;
        let prefix =
            (self.routed_cached / bs).checked_sub(1).and_then(|i| self.hashes.get(i as usize)).map_or(0, |h| h.0);
        let sent = Sent {
            id: self.request_no,
            prompt_tokens: self.prompt_tokens.unwrap_or(0),
            cached_tokens: self.routed_cached,
            prefix,
            max_tokens: self.max_tokens,
        };
        let now = self.app.registry.now_ms();
        model.dispatch(sent, now);
        true
    }
}

/// Tells the worker's replica what became of a dispatch: its first token, its output length,
/// its end.
struct ReplicaObserver {
    app: Arc<App>,
    worker: Arc<WorkerRuntime>,
    /// The dispatch's id in the replica.
    id: u64,
    output_tokens: Option<u32>,
    /// When the last streamed token came, and the gaps between tokens so far (ms).
    last_token: Option<Instant>,
    gaps: Vec<f64>,
}

impl ReplicaObserver {
    fn with_model(&self, f: impl FnOnce(&mut EngineModel, u64, f64)) {
        let id = self.id;
        let now_ms = self.app.registry.now_ms();
        if let Ok(mut model) = self.worker.model.lock()
            && let Some(model) = model.as_mut()
        {
            f(model, id, now_ms);
        }
    }
}

impl Observer for ReplicaObserver {
    fn first_token(&mut self, _elapsed: Duration) {
        self.last_token = Some(Instant::now());
        self.with_model(|m, id, now| m.started(id, now));
    }

    fn progress(&mut self, generated: u32) {
        let now = Instant::now();
        if let Some(last) = self.last_token.replace(now) {
            self.gaps.push((now - last).as_secs_f64() * 1_000.0);
        }
        self.with_model(|m, id, now| m.progress(id, generated, now));
    }

    fn usage(&mut self, usage: &Usage) {
        self.output_tokens = Some(usage.completion_tokens);
    }

    fn end(&mut self, outcome: Outcome) {
        let output_tokens = self.output_tokens;
        match outcome {
            Outcome::Completed => {
                let end = Ended { output_tokens, median_gap_ms: median(std::mem::take(&mut self.gaps)) };
                self.with_model(|m, id, now| m.finished(id, &end, now));
            }
            Outcome::ConnectFailed | Outcome::Failed | Outcome::Cancelled => {
                self.with_model(|m, id, now| m.forget(id, now))
            }
        }
    }
}

/// The in-flight ledger entry, worker health and dispatch pacing.
struct LedgerObserver {
    app: Arc<App>,
    ticket: load::InflightTicket,
    worker: Arc<WorkerRuntime>,
}

impl Observer for LedgerObserver {
    fn first_token(&mut self, elapsed: Duration) {
        self.ticket.started();
        self.worker.load.record_first_token(self.app.registry.now_ms(), elapsed.as_secs_f64() * 1_000.0);
        self.app.holds.changed(&self.worker.key.worker_set, &self.worker.key.worker);
    }

    fn end(&mut self, outcome: Outcome) {
        self.ticket.finished();
        if outcome == Outcome::ConnectFailed {
            self.worker.load.mark_unhealthy();
        }
        self.app.holds.changed(&self.worker.key.worker_set, &self.worker.key.worker);
    }
}

/// Online TTFT calibration of the worker set.
struct CalibrationObserver {
    app: Arc<App>,
    worker_set: Name,
    work_tokens: u64,
    running: u32,
}

impl Observer for CalibrationObserver {
    fn first_token(&mut self, elapsed: Duration) {
        let ttft = elapsed.as_secs_f64();
        let set = &*self.worker_set;
        self.app.metrics.observe(m::TTFT_SECONDS, &[("worker_set", set)], ttft);
        let Some(set_rt) = self.app.registry.set(set) else { return };
        if let Ok(mut c) = set_rt.calibration.lock() {
            let predicted = c.model().predict(&switchyard_core::predictor::TtftInputs {
                prompt_tokens: self.work_tokens as u32,
                cached_tokens: 0,
                waiting_requests: 0,
                waiting_prefill_tokens: None,
                running_requests: self.running,
            });
            self.app.metrics.observe(
                m::TTFT_PREDICTION_ERROR_SECONDS,
                &[("worker_set", set)],
                (predicted.total_ms / 1000.0 - ttft).abs(),
            );
            c.observe(self.work_tokens, self.running, ttft * 1000.0);
        }
    }
}

/// The fidelity guard: predicted against reported prompt and cached tokens.
struct FidelityObserver {
    app: Arc<App>,
    worker_set: Name,
    predicted_prompt: Option<u32>,
    predicted_cached: u32,
}

impl Observer for FidelityObserver {
    fn usage(&mut self, usage: &Usage) {
        let Some(predicted_prompt) = self.predicted_prompt else { return };
        let sample = Sample {
            predicted_prompt,
            actual_prompt: usage.prompt_tokens,
            predicted_cached: self.predicted_cached,
            actual_cached: usage.cached_tokens,
        };
        let set = &*self.worker_set;
        let metrics = &self.app.metrics;
        metrics.inc(m::PREDICTED_CACHED_TOKENS_TOTAL, &[("worker_set", set)], f64::from(self.predicted_cached));
        metrics.inc(m::ACTUAL_CACHED_TOKENS_TOTAL, &[("worker_set", set)], f64::from(usage.cached_tokens));
        if sample.predicted_prompt != sample.actual_prompt {
            metrics.inc(m::PROMPT_TOKEN_MISMATCH_TOTAL, &[("worker_set", set)], 1.0);
        }
        if let Some(s) = self.app.registry.set(set)
            && let Ok(mut g) = s.guard.lock()
        {
            let before = g.mode();
            let after = g.record(sample);
            if before != after {
                tracing::warn!(worker_set = set, from = ?before, to = ?after, "fidelity mode changed");
            }
        }
    }
}

/// What `/debug/decisions/{id}` shows of one decision. Kept typed and rendered only when
/// asked for: the request path pays for a move into the log, not for JSON.
pub(crate) struct DecisionTrace {
    /// Ranked alternatives beyond the first [`TRACE_ALTERNATIVES`], not kept.
    omitted_alternatives: usize,
    /// The request's id.
    id: String,
    /// Every worker set's fidelity mode at the time.
    modes: Vec<(String, Mode)>,
    decision: switchyard_core::Decision,
    /// Labels of the targets handed to the relay, first choice first.
    targets: Vec<String>,
    /// Per worker set: prompt tokens, full blocks, token digest.
    tokens: Vec<(String, usize, usize, blake3::Hash)>,
    /// Cached tokens routing trusted (index, pending blocks and the fidelity guard).
    cached: BTreeMap<WorkerKey, u32>,
    /// Cached tokens the engines' events announced.
    indexed: FxHashMap<WorkerKey, u32>,
}

impl App {
    fn log_decision(&self, trace: DecisionTrace) {
        // The oldest trace is dropped after the lock is released: other requests wait only
        // for the push.
        let _evicted = self.decisions.lock().ok().and_then(|mut log| {
            log.push_back(trace);
            if log.len() > DECISION_LOG { log.pop_front() } else { None }
        });
    }
}

fn render_trace(t: &DecisionTrace) -> Value {
    let tokens: Map<String, Value> = t
        .tokens
        .iter()
        .map(|(set, tokens, blocks, digest)| {
            (
                set.clone(),
                json!({"promptTokens": tokens, "fullBlocks": blocks, "tokenDigest": digest.to_hex().as_str()}),
            )
        })
        .collect();
    let per_worker = |k: &WorkerKey, v: u32| json!({"workerSet": k.worker_set, "worker": k.worker, "cachedTokens": v});
    let mut indexed: Vec<(&WorkerKey, &u32)> = t.indexed.iter().collect();
    indexed.sort();
    json!({
        "id": t.id,
        "decision": t.decision,
        "omittedAlternatives": t.omitted_alternatives,
        "chosen": t.targets.first(),
        "attempts": t.targets,
        "tokens": tokens,
        "cachedTokens": t.cached.iter().map(|(k, v)| per_worker(k, *v)).collect::<Vec<_>>(),
        "indexedCachedTokens": indexed.into_iter().map(|(k, v)| per_worker(k, *v)).collect::<Vec<_>>(),
        "fidelityModes": t.modes.iter().map(|(s, m)| (s.clone(), json!(m))).collect::<Map<String, Value>>(),
    })
}

/// BLAKE3 over the token ids as little-endian u32s.
fn token_digest(tokens: &[u32]) -> blake3::Hash {
    let bytes: Vec<u8> = tokens.iter().flat_map(|t| t.to_le_bytes()).collect();
    blake3::hash(&bytes)
}

type Shared = Arc<App>;

/// The admin routes (served on their own listener).
pub fn admin_router(app: Shared) -> Router {
    Router::new()
        .route("/healthz", get(|| async { StatusCode::OK }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .route("/status", get(status))
        .route("/debug/decisions/{id}", get(debug_decision))
        .with_state(app)
}

async fn readyz(State(app): State<Shared>) -> Response {
    let ready = app.registry.workers().iter().any(|w| w.load.healthy() && w.load.engine().1.is_some());
    if ready {
        (StatusCode::OK, "ready").into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "no healthy worker yet").into_response()
    }
}

fn worker_status(w: &WorkerRuntime) -> Value {
    let (engine, scraped) = w.load.engine();
    let kv = &w.kv;
    json!({
        "workerSet": w.key.worker_set, "worker": w.key.worker, "url": w.endpoint.http_url,
        "healthy": w.load.healthy(), "scraped": scraped.is_some(),
        "waiting": engine.waiting, "running": engine.running, "kvCacheUsage": engine.kv_usage,
        "prefixCache": {"queries": engine.prefix_cache_queries, "hits": engine.prefix_cache_hits},
        "inflight": w.load.inflight_total.load(Ordering::Relaxed),
        "kvEvents": {
            "batches": kv.batches.load(Ordering::Relaxed), "gaps": kv.gaps.load(Ordering::Relaxed),
            "replays": kv.replays.load(Ordering::Relaxed),
            "catchUps": kv.catch_ups.load(Ordering::Relaxed), "resyncs": kv.resyncs.load(Ordering::Relaxed),
            "restarts": kv.restarts.load(Ordering::Relaxed), "decodeErrors": kv.decode_errors.load(Ordering::Relaxed),
            "duplicates": kv.duplicates.load(Ordering::Relaxed), "nextSeq": kv.next_seq.load(Ordering::Relaxed),
            "blocks": kv.blocks.load(Ordering::Relaxed), "bytes": kv.bytes.load(Ordering::Relaxed),
        },
        "replica": w.model.lock().ok().and_then(|m| m.as_ref().map(replica_status)),
    })
}

/// A worker's replica as the admin API shows it: what it believes the engine holds and the
/// step cost it has learned.
fn replica_status(model: &EngineModel) -> Value {
    let (waiting, running) = model.replica().counts();
    json!({
        "waiting": waiting, "running": running, "shape": model.replica().shape(),
        "learnedCost": model.learner().cost(), "samples": model.learner().samples(),
    })
}

async fn status(State(app): State<Shared>) -> Response {
    let mut workers: Vec<Value> = app.registry.workers().iter().map(|w| worker_status(w)).collect();
    workers.sort_by_key(|v| format!("{}/{}", v["workerSet"], v["worker"]));
    let sets: Map<String, Value> = app
        .registry
        .sets()
        .iter()
        .map(|s| {
            let guard = s.guard.lock().map(|g| json!(*g)).unwrap_or(Value::Null);
            let mode = s.guard.lock().map(|g| g.mode()).unwrap_or(Mode::Exact);
            let model = s.calibration.lock().map(|c| json!({"prefillTokensPerSec": c.model().prefill_tokens_per_sec, "baseMs": c.model().base_ms, "observations": c.observations()})).unwrap_or(Value::Null);
            let tokenizer = match &s.tokenizer {
                Ok(_) => json!("ok"),
                Err(e) => json!({"error": e}),
            };
            let coarse = json!({"factor": s.index.coarse().factor(), "held": s.index.coarse().held(), "orphans": s.index.coarse().orphans()});
            (s.config.name.clone(), json!({"mode": mode, "guard": guard, "tokenizer": tokenizer, "ttftModel": model, "coarse": coarse}))
        })
        .collect();
    let source = app.source_status.lock().map(|s| json!(*s)).unwrap_or(Value::Null);
    // Spillover by provider model, with its exact cost as a decimal string.
    let spillover = app.spill.status();
    axum::Json(json!({
        "generation": app.topology.borrow().generation,
        "config": source,
        "workerSets": sets,
        "workers": workers,
        "providers": app.providers().status(),
        "spillover": spillover,
        "hub": app.hub.as_ref().and_then(|h| h.lock().ok().map(|h| {
            let mut v = json!(*h);
            if let (Some(map), Some(usage)) = (v.as_object_mut(), &app.usage) {
                map.insert("usage".into(), json!(usage.status()));
            }
            v
        })),
    }))
    .into_response()
}

async fn debug_decision(State(app): State<Shared>, AxPath(id): AxPath<String>) -> Response {
    let found = app.decisions.lock().ok().and_then(|log| log.iter().rev().find(|t| t.id == id).map(render_trace));
    match found {
        Some(v) => axum::Json(v).into_response(),
        None => GatewayError::new(ErrorKind::NotFound, "not_found", "no such decision in the recent log")
            .into_response_for(switchyard_gateway::Dialect::OpenAi, None),
    }
}

async fn metrics(State(app): State<Shared>) -> Response {
    let mut gauges = Vec::new();
    let mut counters = Vec::new();
    let now_ms =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0);
    for w in app.registry.workers() {
        let l = labels(&[("worker_set", &w.key.worker_set), ("worker", &w.key.worker)]);
        gauges.push((m::WORKER_HEALTHY, l.clone(), if w.load.healthy() { 1.0 } else { 0.0 }));
        gauges.push((m::WORKER_INFLIGHT, l.clone(), w.load.inflight_total.load(Ordering::Relaxed) as f64));
        gauges.push((m::INDEX_BLOCKS, l.clone(), w.kv.blocks.load(Ordering::Relaxed) as f64));
        counters.push((m::KV_BATCHES_TOTAL, l.clone(), w.kv.batches.load(Ordering::Relaxed) as f64));
        counters.push((m::KV_GAPS_TOTAL, l.clone(), w.kv.gaps.load(Ordering::Relaxed) as f64));
        counters.push((m::KV_REPLAYS_TOTAL, l.clone(), w.kv.replays.load(Ordering::Relaxed) as f64));
        counters.push((m::KV_CATCH_UPS_TOTAL, l.clone(), w.kv.catch_ups.load(Ordering::Relaxed) as f64));
        counters.push((m::KV_RESYNCS_TOTAL, l.clone(), w.kv.resyncs.load(Ordering::Relaxed) as f64));
        let last = w.kv.last_batch_unix_ms.load(Ordering::Relaxed);
        if last > 0 {
            gauges.push((m::KV_EVENT_LAG_SECONDS, l, now_ms.saturating_sub(last) as f64 / 1000.0));
        }
    }
    let held = app.holds.held();
    for s in app.registry.sets() {
        let mode = s.guard.lock().map(|g| g.mode()).unwrap_or(Mode::Exact);
        let set = labels(&[("worker_set", &s.config.name)]);
        gauges.push((m::FIDELITY_MODE, set.clone(), f64::from(mode.as_gauge())));
        let held = held.iter().find(|(name, _)| **name == *s.config.name).map_or(0, |(_, n)| *n);
        gauges.push((m::DISPATCH_HELD, set, held as f64));
    }
    gauges.sort_by(|a, b| (a.0, &a.1).cmp(&(b.0, &b.1)));
    counters.sort_by(|a, b| (a.0, &a.1).cmp(&(b.0, &b.1)));
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], app.metrics.render(&counters, &gauges)).into_response()
}
