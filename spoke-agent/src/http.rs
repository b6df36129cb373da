//! The spoke's front door: the OpenAI API in, the chosen vLLM worker out.
//!
//! One request, edge to engine (all inside one `request` span):
//! 1. read the body (size-limited) and parse it; errors are OpenAI-style JSON;
//! 2. [`plan`]: resolve the model, tokenize per candidate worker set exactly as its engines
//!    will, look the prompt's blocks up in each set's KV index, build a fleet snapshot from
//!    live load, and let the pure policy engine decide;
//! 3. book the choice (in-flight ledger, pending blocks) and forward; a refused connection
//!    marks the worker down and moves to the next-ranked worker;
//! 4. stream the engine's SSE through event by event; the first token releases the ledger
//!    entry and calibrates the worker's TTFT model; the usage the spoke asked for feeds the
//!    fidelity guard and is stripped again if the client did not ask for it. A worker that
//!    dies mid-stream yields an explicit error event. A client that goes away drops the
//!    upstream request, which cancels it in the engine.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Path as AxPath, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use dynamo_kv_router::protocols::LocalBlockHash;
use futures::StreamExt;
use serde_json::{Map, Value, json};
use switchyard_core::engine::{Decision, Outcome, RejectReason, Target};
use switchyard_core::request::{RequestClass, RequestFeatures, WorkerKey};
use switchyard_core::snapshot::{FleetSnapshot, WorkerState};
use switchyard_core::{decide, resolve};
use tokio::sync::watch;
use tracing::Instrument;

use crate::fidelity::{Mode, Sample};
use crate::load;
use crate::metric_names as m;
use crate::metrics::{Metrics, labels};
use crate::registry::{Registry, WorkerRuntime};
use crate::source::SourceStatus;
use crate::tokenize::{Api, TokenizeError};
use crate::topology::Topology;

/// Decisions kept for `/debug/decisions/{id}`.
const DECISION_LOG: usize = 2048;
/// Attempts on different workers when connections are refused.
const MAX_ATTEMPTS: usize = 3;

/// Limits of the front door.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Largest request body, bytes.
    pub max_body_bytes: usize,
    /// Time to connect to a worker.
    pub connect_timeout: Duration,
    /// Time for a worker to answer with headers (queueing included).
    pub response_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_body_bytes: 32 * 1024 * 1024,
            connect_timeout: Duration::from_secs(2),
            response_timeout: Duration::from_secs(600),
        }
    }
}

/// Shared state of the front door.
pub struct App {
    /// Live workers and sets.
    pub registry: Arc<Registry>,
    /// Current configuration.
    pub topology: watch::Receiver<Arc<Topology>>,
    /// Client for workers.
    pub client: reqwest::Client,
    /// Counters and histograms.
    pub metrics: Metrics,
    /// Recent decisions.
    pub decisions: Mutex<VecDeque<(String, Value)>>,
    /// Request counter.
    pub next_request: AtomicU64,
    /// Limits.
    pub limits: Limits,
    /// Configuration source status.
    pub source_status: Arc<Mutex<SourceStatus>>,
}

/// An OpenAI-style error response.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    kind: &'static str,
    code: &'static str,
    message: String,
}

impl ApiError {
    fn new(status: StatusCode, kind: &'static str, code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError { status, kind, code, message: message.into() }
    }
    fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, "invalid_request_error", "invalid_request", message)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = json!({"error": {"message": self.message, "type": self.kind, "param": null, "code": self.code}});
        (self.status, axum::Json(body)).into_response()
    }
}

type Shared = Arc<App>;

/// The front door's routes.
pub fn router(app: Shared) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(|s, h, r| generate(s, h, r, Api::Chat)))
        .route("/v1/completions", post(|s, h, r| generate(s, h, r, Api::Completion)))
        .route("/v1/models", get(models))
        .route("/healthz", get(|| async { StatusCode::OK }))
        // vLLM-compatible liveness path (load generators and peer routers probe it).
        .route("/health", get(|| async { StatusCode::OK }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .route("/status", get(status))
        .route("/debug/decisions/{id}", get(debug_decision))
        .with_state(app)
}

/// What [`plan`] computed for one request.
struct Plan {
    decision: Decision,
    decision_id: String,
    /// Per worker set: tokens (when a tokenizer answered) and block hashes.
    tokens: HashMap<String, (Vec<u32>, Vec<LocalBlockHash>)>,
    /// Per worker: cached tokens the index (without pending entries) confirms.
    indexed_cached: HashMap<WorkerKey, u32>,
    /// Per worker: cached tokens used for routing (index + pending, trusted by mode).
    cached: BTreeMap<WorkerKey, u32>,
}

fn header_str<'a>(h: &'a HeaderMap, name: &str) -> Option<&'a str> {
    h.get(name).and_then(|v| v.to_str().ok()).map(str::trim).filter(|s| !s.is_empty())
}

/// Decides where a request goes. Errors are client-facing.
async fn plan(
    app: &App,
    api: Api,
    headers: &HeaderMap,
    body: &Map<String, Value>,
    request_no: u64,
) -> Result<Plan, ApiError> {
    let model =
        body.get("model").and_then(Value::as_str).ok_or_else(|| ApiError::bad_request("`model` is required"))?;
    let topo = app.topology.borrow().clone();
    let models = resolve::expand(&topo.fleet, model)
        .map_err(|e| ApiError::new(StatusCode::NOT_FOUND, "invalid_request_error", "model_not_found", e.to_string()))?;
    let mut sets: Vec<String> = Vec::new();
    for pm in &models {
        if let Some(pool) = topo.fleet.models.get(pm).and_then(|p| topo.fleet.pools.get(&p.pool)) {
            for ws in &pool.worker_sets {
                if !sets.contains(ws) {
                    sets.push(ws.clone());
                }
            }
        }
    }

    let mut tokens = HashMap::new();
    let mut cached = BTreeMap::new();
    let mut indexed_cached = HashMap::new();
    let mut prompt_tokens: Option<u32> = None;
    for name in &sets {
        let Some(set) = app.registry.set(name) else { continue };
        let Ok(tokenizer) = &set.tokenizer else { continue };
        let render_url = app
            .registry
            .workers()
            .into_iter()
            .find(|w| w.key.worker_set == *name && w.load.healthy())
            .map(|w| w.endpoint.http_url.clone());
        // Engines know their served model name, not the public name or alias; only the render
        // path sends the body on, so only it pays for the copy.
        let set_body = match (tokenizer, topo.fleet.worker_sets.get(name)) {
            (crate::tokenize::Tokenizer::Engine, Some(ws)) => {
                let mut b = body.clone();
                b.insert("model".into(), Value::String(ws.served_model.clone()));
                std::borrow::Cow::Owned(b)
            }
            _ => std::borrow::Cow::Borrowed(body),
        };
        let toks = match tokenizer.tokens(api, &set_body, &app.client, render_url.as_deref()).await {
            Ok(t) => t,
            Err(TokenizeError::BadRequest(msg)) => return Err(ApiError::bad_request(msg)),
            Err(TokenizeError::Unavailable(msg)) => {
                tracing::warn!(worker_set = %name, error = %msg, "tokenization unavailable; routing this set by load");
                continue;
            }
        };
        prompt_tokens.get_or_insert(toks.len() as u32);
        let hashes = set.index.hashes(&toks);
        let overlaps = set.index.overlaps(&hashes);
        let mode = set.guard.lock().map(|g| g.mode()).unwrap_or(Mode::Exact);
        let bs = set.index.block_size();
        for w in app.registry.workers().into_iter().filter(|w| w.key.worker_set == *name) {
            let trusted = mode.trusted_cached(overlaps.get(&w.id).copied().unwrap_or(0) * bs);
            if trusted > 0 {
                cached.insert(w.key.clone(), trusted);
            }
            let confirmed = set.index.indexed_overlap(w.id, &hashes) * bs;
            indexed_cached.insert(w.key.clone(), confirmed);
        }
        tokens.insert(name.clone(), (toks, hashes));
    }

    let tags: BTreeSet<String> = header_str(headers, "x-switchyard-tags")
        .map(|t| t.split(',').map(|s| s.trim().to_owned()).filter(|s| !s.is_empty()).collect())
        .unwrap_or_default();
    let class = match header_str(headers, "x-switchyard-class") {
        Some("batch") => RequestClass::Batch,
        _ => RequestClass::Interactive,
    };
    let max_output =
        body.get("max_completion_tokens").or_else(|| body.get("max_tokens")).and_then(Value::as_u64).map(|v| v as u32);
    let features = RequestFeatures {
        model: model.to_owned(),
        tenant: header_str(headers, "x-switchyard-tenant").map(str::to_owned),
        tags,
        class,
        complexity: None,
        prompt_tokens: prompt_tokens.unwrap_or(0),
        max_output_tokens: max_output,
        cached_tokens: cached.clone(),
        tie_breaker: request_no.wrapping_mul(0x9e37_79b9_7f4a_7c15),
    };
    let snapshot = snapshot(&app.registry, &sets);
    let started = Instant::now();
    let decision = decide(&topo.fleet, &snapshot, &features);
    app.metrics.observe(m::DECISION_SECONDS, &[], started.elapsed().as_secs_f64());
    let decision_id = format!("d-{request_no:x}");
    // Book the chosen worker's blocks now, before anything else can await: a request with the
    // same prefix planned a moment later must already see them.
    if let Outcome::Route { target: Target::Worker { worker_set, worker, .. } } = &decision.outcome
        && let (Some(set), Some((_, hashes))) = (app.registry.set(worker_set), tokens.get(worker_set))
        && let Some(w) = app.registry.worker(&WorkerKey { worker_set: worker_set.clone(), worker: worker.clone() })
    {
        set.index.book(w.id, hashes);
    }
    Ok(Plan { decision, decision_id, tokens, indexed_cached, cached })
}

/// The fleet state the engine decides on: engine metrics combined with the spoke's ledger.
fn snapshot(registry: &Registry, sets: &[String]) -> FleetSnapshot {
    let mut snap = FleetSnapshot::default();
    for w in registry.workers().into_iter().filter(|w| sets.contains(&w.key.worker_set)) {
        let (engine, _) = w.load.engine();
        let unstarted = w.load.inflight_unstarted.load(Ordering::Relaxed) as u32;
        let pending_tokens = w.load.inflight_prefill_tokens.load(Ordering::Relaxed);
        let model = registry.set(&w.key.worker_set).and_then(|s| s.calibration.lock().ok().map(|c| c.model()));
        snap.workers.insert(
            w.key.clone(),
            WorkerState {
                healthy: w.load.healthy(),
                waiting_requests: engine.waiting.max(unstarted),
                running_requests: engine.running,
                waiting_prefill_tokens: Some(pending_tokens),
                kv_cache_usage_percent: engine.kv_usage * 100.0,
                ttft: model,
            },
        );
    }
    snap
}

fn reject_error(reason: RejectReason, message: String) -> ApiError {
    match reason {
        RejectReason::ModelNotFound | RejectReason::AliasCycle => {
            ApiError::new(StatusCode::NOT_FOUND, "invalid_request_error", "model_not_found", message)
        }
        RejectReason::NoLocalCapacity | RejectReason::NoCandidate => {
            ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "service_unavailable", "no_capacity", message)
        }
    }
}

async fn generate(State(app): State<Shared>, headers: HeaderMap, req: Request, api: Api) -> Response {
    let request_no = app.next_request.fetch_add(1, Ordering::Relaxed) + 1;
    let span = tracing::info_span!("request", id = request_no, api = ?api, model = tracing::field::Empty, worker = tracing::field::Empty, decision = tracing::field::Empty);
    let route = if api == Api::Chat { "chat" } else { "completions" };
    let resp = async {
        let bytes = axum::body::to_bytes(req.into_body(), app.limits.max_body_bytes).await.map_err(|_| {
            ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "invalid_request_error",
                "body_too_large",
                format!("request body exceeds {} bytes", app.limits.max_body_bytes),
            )
        })?;
        let body: Map<String, Value> = match serde_json::from_slice(&bytes) {
            Ok(Value::Object(m)) => m,
            Ok(_) => return Err(ApiError::bad_request("request body must be a JSON object")),
            Err(e) => return Err(ApiError::bad_request(format!("malformed JSON: {e}"))),
        };
        if let Some(model) = body.get("model").and_then(Value::as_str) {
            tracing::Span::current().record("model", model);
        }
        let plan = plan(&app, api, &headers, &body, request_no).await?;
        tracing::Span::current().record("decision", plan.decision_id.as_str());
        forward(&app, api, body, plan).await
    }
    .instrument(span)
    .await;
    let resp = resp.unwrap_or_else(IntoResponse::into_response);
    let class = match resp.status().as_u16() {
        200..=299 => "2xx",
        400..=499 => "4xx",
        _ => "5xx",
    };
    app.metrics.inc(m::REQUESTS_TOTAL, &[("route", route), ("status", class)], 1.0);
    resp
}

fn log_decision(app: &App, plan: &Plan, chosen: Option<&WorkerKey>, attempts: &[String]) {
    let tokens: Map<String, Value> = plan
        .tokens
        .iter()
        .map(|(set, (t, h))| (set.clone(), json!({"promptTokens": t.len(), "fullBlocks": h.len()})))
        .collect();
    let cached: Vec<Value> = plan
        .cached
        .iter()
        .map(|(k, v)| json!({"workerSet": k.worker_set, "worker": k.worker, "cachedTokens": v}))
        .collect();
    let modes: Map<String, Value> = app
        .registry
        .sets()
        .iter()
        .map(|s| (s.config.name.clone(), json!(s.guard.lock().map(|g| g.mode()).unwrap_or(Mode::Exact))))
        .collect();
    let entry = json!({
        "id": plan.decision_id,
        "decision": plan.decision,
        "chosen": chosen.map(|k| format!("{}/{}", k.worker_set, k.worker)),
        "attempts": attempts,
        "tokens": tokens,
        "cachedTokens": cached,
        "indexedCachedTokens": plan.indexed_cached.iter().filter(|(_, v)| **v > 0).map(|(k, v)| json!({"workerSet": k.worker_set, "worker": k.worker, "cachedTokens": v})).collect::<Vec<_>>(),
        "fidelityModes": modes,
    });
    if let Ok(mut log) = app.decisions.lock() {
        log.push_back((plan.decision_id.clone(), entry));
        while log.len() > DECISION_LOG {
            log.pop_front();
        }
    }
}

/// Workers to try, best first: the decision's ranking, healthy ones only.
fn attempt_order(plan: &Plan) -> Vec<(WorkerKey, String)> {
    plan.decision
        .alternatives
        .iter()
        .filter_map(|c| match &c.target {
            Target::Worker { worker_set, worker, served_model } => {
                Some((WorkerKey { worker_set: worker_set.clone(), worker: worker.clone() }, served_model.clone()))
            }
            Target::Provider { .. } => None,
        })
        .take(MAX_ATTEMPTS)
        .collect()
}

async fn forward(app: &Shared, api: Api, mut body: Map<String, Value>, plan: Plan) -> Result<Response, ApiError> {
    match &plan.decision.outcome {
        Outcome::Route { target: Target::Worker { .. } } => {}
        Outcome::Route { target: Target::Provider { provider, .. } } => {
            log_decision(app, &plan, None, &[]);
            return Err(ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "service_unavailable",
                "spillover_unavailable",
                format!("no local worker is available and spillover to `{provider}` is handled by the hub"),
            ));
        }
        Outcome::Reject { reason, message } => {
            log_decision(app, &plan, None, &[]);
            return Err(reject_error(*reason, message.clone()));
        }
        Outcome::Queue { message } => {
            log_decision(app, &plan, None, &[]);
            return Err(ApiError::new(StatusCode::TOO_MANY_REQUESTS, "rate_limit_error", "queued", message.clone()));
        }
    }
    let stream = body.get("stream").and_then(Value::as_bool).unwrap_or(false);
    let client_wants_usage =
        body.get("stream_options").and_then(|o| o.get("include_usage")).and_then(Value::as_bool).unwrap_or(false);
    if stream {
        // Ask the engine for usage even when the client did not; it is stripped again below.
        let opts = body.entry("stream_options").or_insert_with(|| json!({}));
        if let Some(o) = opts.as_object_mut() {
            o.insert("include_usage".into(), Value::Bool(true));
        }
    }
    let mut attempts = Vec::new();
    for (key, served_model) in attempt_order(&plan) {
        let Some(worker) = app.registry.worker(&key) else { continue };
        if !worker.load.healthy() {
            continue;
        }
        attempts.push(format!("{}/{}", key.worker_set, key.worker));
        let (tokens_len, hashes) = plan
            .tokens
            .get(&key.worker_set)
            .map(|(t, h)| (Some(t.len() as u32), h.clone()))
            .unwrap_or((None, Vec::new()));
        let predicted_cached = plan.cached.get(&key).copied().unwrap_or(0);
        let uncached = u64::from(tokens_len.unwrap_or(0).saturating_sub(predicted_cached));
        let queued_ahead = worker.load.inflight_prefill_tokens.load(Ordering::Relaxed);
        let running = worker.load.engine().0.running;
        let set = app.registry.set(&key.worker_set);
        if let Some(set) = &set
            && attempts.len() > 1
        {
            // A retry: the first choice was booked in `plan`.
            set.index.book(worker.id, &hashes);
        }
        let mut ticket = load::dispatch(&worker.load, uncached);
        body.insert("model".into(), Value::String(served_model.clone()));
        let path = if api == Api::Chat { "/v1/chat/completions" } else { "/v1/completions" };
        let started = Instant::now();
        let sent = tokio::time::timeout(
            app.limits.response_timeout,
            app.client.post(format!("{}{path}", worker.endpoint.http_url)).json(&body).send(),
        )
        .await;
        let response = match sent {
            Ok(Ok(r)) => r,
            Ok(Err(e)) => {
                tracing::warn!(worker = %attempts.last().map(String::as_str).unwrap_or(""), error = %e, "worker unreachable; trying the next one");
                if e.is_connect() {
                    worker.load.mark_unhealthy();
                }
                if let Some(set) = &set {
                    set.index.unbook(worker.id, &hashes);
                }
                ticket.finished();
                continue;
            }
            Err(_) => {
                ticket.finished();
                log_decision(app, &plan, Some(&key), &attempts);
                return Err(ApiError::new(
                    StatusCode::GATEWAY_TIMEOUT,
                    "api_error",
                    "upstream_timeout",
                    "the worker did not answer in time",
                ));
            }
        };
        tracing::Span::current().record("worker", attempts.last().map(String::as_str).unwrap_or(""));
        app.metrics.inc(m::DECISIONS_TOTAL, &[("worker_set", &key.worker_set), ("worker", &key.worker)], 1.0);
        log_decision(app, &plan, Some(&key), &attempts);
        let ctx = Completion {
            app: app.clone(),
            worker: worker.clone(),
            predicted_prompt: tokens_len,
            predicted_cached: plan.indexed_cached.get(&key).copied().unwrap_or(0),
            work_tokens: queued_ahead + uncached,
            running,
            started,
            ttft_recorded: false,
        };
        let mut headers = HeaderMap::new();
        if let Ok(v) = HeaderValue::from_str(&format!("{}/{}", key.worker_set, key.worker)) {
            headers.insert("x-switchyard-worker", v);
        }
        if let Ok(v) = HeaderValue::from_str(&plan.decision_id) {
            headers.insert("x-switchyard-decision-id", v);
        }
        let status = StatusCode::from_u16(response.status().as_u16()).unwrap_or(StatusCode::BAD_GATEWAY);
        if !status.is_success() {
            let bytes = response.bytes().await.unwrap_or_default();
            ticket.finished();
            let mut r = (status, bytes).into_response();
            r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
            r.headers_mut().extend(headers);
            return Ok(r);
        }
        return Ok(if stream {
            stream_through(ctx, ticket, response, client_wants_usage, headers)
        } else {
            buffered(ctx, ticket, response, headers).await
        });
    }
    log_decision(app, &plan, None, &attempts);
    Err(ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "service_unavailable",
        "no_worker_reachable",
        "no worker could be reached",
    ))
}

/// What the response path needs to meter a completion.
struct Completion {
    app: Shared,
    worker: Arc<WorkerRuntime>,
    predicted_prompt: Option<u32>,
    predicted_cached: u32,
    work_tokens: u64,
    running: u32,
    started: Instant,
    ttft_recorded: bool,
}

impl Completion {
    fn first_token(&mut self, ticket: &mut load::InflightTicket) {
        if self.ttft_recorded {
            return;
        }
        self.ttft_recorded = true;
        ticket.started();
        let ttft = self.started.elapsed().as_secs_f64();
        let set = self.worker.key.worker_set.as_str();
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

    fn usage(&self, usage: &Value) {
        let (Some(prompt), Some(predicted_prompt)) =
            (usage.get("prompt_tokens").and_then(Value::as_u64), self.predicted_prompt)
        else {
            return;
        };
        let actual_cached =
            usage.pointer("/prompt_tokens_details/cached_tokens").and_then(Value::as_u64).unwrap_or(0) as u32;
        let sample = Sample {
            predicted_prompt,
            actual_prompt: prompt as u32,
            predicted_cached: self.predicted_cached,
            actual_cached,
        };
        let set = self.worker.key.worker_set.as_str();
        self.app.metrics.inc(
            m::PREDICTED_CACHED_TOKENS_TOTAL,
            &[("worker_set", set)],
            f64::from(self.predicted_cached),
        );
        self.app.metrics.inc(m::ACTUAL_CACHED_TOKENS_TOTAL, &[("worker_set", set)], f64::from(actual_cached));
        if sample.predicted_prompt != sample.actual_prompt {
            self.app.metrics.inc(m::PROMPT_TOKEN_MISMATCH_TOTAL, &[("worker_set", set)], 1.0);
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

async fn buffered(
    mut ctx: Completion,
    mut ticket: load::InflightTicket,
    response: reqwest::Response,
    headers: HeaderMap,
) -> Response {
    match response.bytes().await {
        Ok(bytes) => {
            ctx.first_token(&mut ticket);
            ticket.finished();
            if let Ok(v) = serde_json::from_slice::<Value>(&bytes)
                && let Some(u) = v.get("usage")
            {
                ctx.usage(u);
            }
            let mut r = (StatusCode::OK, bytes).into_response();
            r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
            r.headers_mut().extend(headers);
            r
        }
        Err(e) => {
            ticket.finished();
            ctx.worker.load.mark_unhealthy();
            ApiError::new(
                StatusCode::BAD_GATEWAY,
                "api_error",
                "upstream_failed",
                format!("the worker failed mid-response: {e}"),
            )
            .into_response()
        }
    }
}

fn sse_error(message: &str) -> Bytes {
    let v = json!({"error": {"message": message, "type": "api_error", "param": null, "code": "upstream_failed"}});
    Bytes::from(format!("data: {v}\n\n"))
}

fn stream_through(
    mut ctx: Completion,
    mut ticket: load::InflightTicket,
    response: reqwest::Response,
    client_wants_usage: bool,
    headers: HeaderMap,
) -> Response {
    let mut upstream = response.bytes_stream();
    let mut buf: Vec<u8> = Vec::new();
    let body = async_stream(move |tx| async move {
        let mut done = false;
        let mut failed = false;
        while let Some(chunk) = upstream.next().await {
            match chunk {
                Ok(bytes) => {
                    buf.extend_from_slice(&bytes);
                    // Forward every complete SSE event as soon as it is complete.
                    while let Some(pos) = find_event_end(&buf) {
                        let event: Vec<u8> = buf.drain(..pos).collect();
                        let text = String::from_utf8_lossy(&event);
                        let data = text.lines().find_map(|l| l.strip_prefix("data: ")).unwrap_or("");
                        if data == "[DONE]" {
                            done = true;
                        } else if let Ok(v) = serde_json::from_str::<Value>(data) {
                            let usage_only = v.get("choices").and_then(Value::as_array).is_some_and(Vec::is_empty)
                                && v.get("usage").is_some_and(|u| !u.is_null());
                            if usage_only {
                                ctx.usage(&v["usage"]);
                                if !client_wants_usage {
                                    continue;
                                }
                            } else if v.get("choices").is_some() {
                                ctx.first_token(&mut ticket);
                            }
                        }
                        if tx.send(Ok(Bytes::from(event))).await.is_err() {
                            // The client went away: dropping the upstream cancels the request.
                            return;
                        }
                    }
                }
                Err(e) => {
                    ctx.worker.load.mark_unhealthy();
                    let _ = tx.send(Ok(sse_error(&format!("the worker failed mid-stream: {e}")))).await;
                    failed = true;
                    break;
                }
            }
        }
        if !done && !failed {
            if !buf.is_empty() {
                let _ = tx.send(Ok(Bytes::from(std::mem::take(&mut buf)))).await;
            }
            let _ = tx.send(Ok(sse_error("the worker ended the stream before completion"))).await;
        }
        ticket.finished();
    });
    let mut r = Response::new(body);
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    r.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    r.headers_mut().extend(headers);
    r
}

/// End of the first complete SSE event in `buf` (after its blank line).
fn find_event_end(buf: &[u8]) -> Option<usize> {
    buf.windows(2).position(|w| w == b"\n\n").map(|p| p + 2)
}

/// A body fed by a producer task; the task is dropped (and with it the upstream request)
/// when the client disconnects and the body is dropped.
fn async_stream<F, Fut>(producer: F) -> Body
where
    F: FnOnce(tokio::sync::mpsc::Sender<Result<Bytes, std::io::Error>>) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let (tx, rx) = tokio::sync::mpsc::channel(16);
    let task = tokio::spawn(producer(tx));
    let guard = AbortOnDrop(task);
    let stream = tokio_stream_from(rx).map(move |item| {
        let _keep = &guard;
        item
    });
    Body::from_stream(stream)
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

fn tokio_stream_from<T: Send + 'static>(
    mut rx: tokio::sync::mpsc::Receiver<T>,
) -> impl futures::Stream<Item = T> + Send {
    futures::stream::poll_fn(move |cx| rx.poll_recv(cx))
}

async fn models(State(app): State<Shared>) -> Response {
    let topo = app.topology.borrow().clone();
    let data: Vec<Value> = topo
        .fleet
        .models
        .keys()
        .chain(topo.fleet.aliases.keys())
        .map(|name| json!({"id": name, "object": "model", "created": 0, "owned_by": "switchyard"}))
        .collect();
    axum::Json(json!({"object": "list", "data": data})).into_response()
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
        "inflight": w.load.inflight_total.load(Ordering::Relaxed),
        "kvEvents": {
            "batches": kv.batches.load(Ordering::Relaxed), "gaps": kv.gaps.load(Ordering::Relaxed),
            "replays": kv.replays.load(Ordering::Relaxed), "resyncs": kv.resyncs.load(Ordering::Relaxed),
            "restarts": kv.restarts.load(Ordering::Relaxed), "decodeErrors": kv.decode_errors.load(Ordering::Relaxed),
            "duplicates": kv.duplicates.load(Ordering::Relaxed), "nextSeq": kv.next_seq.load(Ordering::Relaxed),
            "blocks": kv.blocks.load(Ordering::Relaxed),
        },
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
            (s.config.name.clone(), json!({"mode": mode, "guard": guard, "tokenizer": tokenizer, "ttftModel": model}))
        })
        .collect();
    let source = app.source_status.lock().map(|s| json!(*s)).unwrap_or(Value::Null);
    axum::Json(json!({"generation": app.topology.borrow().generation, "config": source, "workerSets": sets, "workers": workers})).into_response()
}

async fn debug_decision(State(app): State<Shared>, AxPath(id): AxPath<String>) -> Response {
    let found =
        app.decisions.lock().ok().and_then(|log| log.iter().rev().find(|(k, _)| *k == id).map(|(_, v)| v.clone()));
    match found {
        Some(v) => axum::Json(v).into_response(),
        None => ApiError::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            "not_found",
            format!("no decision `{id}` in the recent log"),
        )
        .into_response(),
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
        counters.push((m::KV_RESYNCS_TOTAL, l.clone(), w.kv.resyncs.load(Ordering::Relaxed) as f64));
        let last = w.kv.last_batch_unix_ms.load(Ordering::Relaxed);
        if last > 0 {
            gauges.push((m::KV_EVENT_LAG_SECONDS, l, now_ms.saturating_sub(last) as f64 / 1000.0));
        }
    }
    for s in app.registry.sets() {
        let mode = s.guard.lock().map(|g| g.mode()).unwrap_or(Mode::Exact);
        gauges.push((m::FIDELITY_MODE, labels(&[("worker_set", &s.config.name)]), f64::from(mode.as_gauge())));
    }
    gauges.sort_by(|a, b| (a.0, &a.1).cmp(&(b.0, &b.1)));
    counters.sort_by(|a, b| (a.0, &a.1).cmp(&(b.0, &b.1)));
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], app.metrics.render(&counters, &gauges)).into_response()
}
