//! The HTTP API of one simulated worker, shaped like `vllm serve`'s OpenAI server.
//!
//! Routes: `GET /health`, `GET /v1/models`, `POST /v1/chat/completions`,
//! `POST /v1/completions`, `POST /tokenize`, `POST /detokenize`,
//! `POST /v1/chat/completions/render`, `POST /v1/completions/render`, `GET /metrics`, and the
//! simulator-only `POST /sim/oracle`, `GET /sim/state`, `POST /sim/faults`.
//!
//! Errors use vLLM's body `{"error": {"message", "type", "param", "code"}}`: 400 for malformed
//! JSON, invalid parameters (malformed `tools`, a `tool_choice` naming an unknown function, …)
//! or a context-length overflow, 404 for an unknown model, 500 for an injected failure. Prompt
//! text is never logged.
//!
//! Chat requests with `tool_choice` `"required"` or a named function answer with tool calls
//! the way vLLM does under structured outputs ([`crate::tools`]):
//!
//! - non-streamed: `message = {"role": "assistant", "content": "", "reasoning_content": null,
//!   "tool_calls": [{"id": "chatcmpl-tool-<32 hex>", "type": "function", "function": {"name",
//!   "arguments"}}]}`;
//! - streamed: the role chunk `{"role": "assistant", "content": ""}`, then `delta.tool_calls`
//!   deltas (no `content` key): the first with `index`, `id`, `type`, `function.name` and the
//!   first `function.arguments` text, the rest with `index` and `function.arguments` fragments (for `"required"` also
//!   `function.name: null`, and no chunk for the array's own brackets), then the finish chunk;
//! - `finish_reason`: `"tool_calls"` for `"required"`, `"stop"` for a named function (vLLM
//!   follows OpenAI here), `"length"` for either when `max_tokens` cut the JSON short (a cut
//!   `"required"` call parses to no calls, as vLLM's does).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use futures::StreamExt;
use serde_json::{Map, Value, json};
use tokio_stream::wrappers::UnboundedReceiverStream;

use crate::engine::mix;
use crate::faults::{FaultRequest, Faults};
use crate::metrics::Metrics;
use crate::runtime::{Emitted, WorkerHandle};
use crate::tools::{self, ForcedCall, ToolStream};
use crate::validation::{self, FieldError, Schema, lax_bool, lax_float, lax_int, py_float};
use switchyard_tokenizer::{EngineTokenizer, TokenizerError};
use tokio_util::sync::CancellationToken;

/// Shared state of one worker's HTTP server.
pub struct AppState {
    /// Engine handle.
    pub worker: WorkerHandle,
    /// Tokenizer and chat template.
    pub tokenizer: Arc<EngineTokenizer>,
    /// `--served-model-name`.
    pub model: String,
    /// `--max-model-len`.
    pub max_model_len: u32,
    /// Output length when `max_tokens` is absent.
    pub default_max_tokens: u32,
    /// Tokens per KV block.
    pub block_size: u32,
    /// `--enable-prompt-tokens-details`.
    pub prompt_tokens_details: bool,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// Fault knobs.
    pub faults: Arc<Faults>,
    /// Time scale (for oracle answers in wall-clock terms).
    pub time_scale: f64,
    /// Index of this worker in its fleet (response header `x-sim-worker`).
    pub worker_index: u32,
    /// Seeds response ids.
    pub seed: u64,
    /// Response id counter.
    pub next_id: AtomicU64,
    /// Fires when the fleet stops (ends stalled response bodies).
    pub shutdown: CancellationToken,
}

/// An error response in vLLM's shape.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    message: String,
    param: Option<String>,
    /// The body's `type`; derived from the status unless set.
    kind: Option<&'static str>,
}

impl ApiError {
    fn new(status: StatusCode, message: impl Into<String>) -> ApiError {
        ApiError { status, message: message.into(), param: None, kind: None }
    }

    fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, message)
    }

    /// A failed parameter check (vLLM's second layer), naming the parameter.
    fn bad_param(param: &str, message: impl Into<String>) -> ApiError {
        ApiError { param: Some(param.to_owned()), ..ApiError::bad_request(message) }
    }

    /// Failed request-model checks (vLLM's first layer).
    fn fields(errors: &[FieldError]) -> ApiError {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: validation::message(errors),
            param: errors.first().map(|e| e.loc.clone()),
            kind: Some("Bad Request"),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let kind = self.kind.unwrap_or(match self.status {
            StatusCode::BAD_REQUEST => "BadRequestError",
            StatusCode::NOT_FOUND => "NotFoundError",
            _ => "InternalServerError",
        });
        let body = json!({"error": {"message": self.message, "type": kind, "param": self.param, "code": self.status.as_u16()}});
        (self.status, axum::Json(body)).into_response()
    }
}

impl From<TokenizerError> for ApiError {
    fn from(e: TokenizerError) -> ApiError {
        ApiError::bad_request(e.to_string())
    }
}

type Shared = Arc<AppState>;

/// The router of one worker.
pub fn router(state: Shared) -> Router {
    let worker_header = HeaderValue::from(state.worker_index);
    Router::new()
        .route("/health", get(|| async { StatusCode::OK }))
        .route("/v1/models", get(models))
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/completions", post(completions))
        .route("/tokenize", post(tokenize))
        .route("/detokenize", post(detokenize))
        .route("/v1/chat/completions/render", post(render_chat))
        .route("/v1/completions/render", post(render_completion))
        .route("/metrics", get(metrics))
        .route("/sim/oracle", post(oracle))
        .route("/sim/state", get(sim_state))
        .route("/sim/faults", post(set_faults).get(get_faults))
        .layer(axum::middleware::map_response(move |mut r: Response| {
            let v = worker_header.clone();
            async move {
                r.headers_mut().insert("x-sim-worker", v);
                r
            }
        }))
        .layer(DefaultBodyLimit::max(64 * 1024 * 1024))
        .with_state(state)
}

fn now_secs() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

/// The body as a JSON object, checked against `schema`'s typed fields when one applies.
fn parse_body(body: &Bytes, schema: Option<Schema>) -> Result<Map<String, Value>, ApiError> {
    let map = match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(m)) => m,
        Ok(other) => return Err(ApiError::fields(&[validation::not_an_object(&other)])),
        Err(e) => return Err(ApiError::fields(&[validation::json_error(body, &e)])),
    };
    if let Some(schema) = schema {
        let errors = validation::check_fields(schema, &map);
        if !errors.is_empty() {
            return Err(ApiError::fields(&errors));
        }
    }
    Ok(map)
}

fn check_model(state: &AppState, body: &Map<String, Value>) -> Result<(), ApiError> {
    match body.get("model") {
        None | Some(Value::Null) => Ok(()),
        Some(Value::String(m)) if *m == state.model => Ok(()),
        Some(m) => Err(ApiError {
            param: Some("model".into()),
            ..ApiError::new(
                StatusCode::NOT_FOUND,
                format!("The model `{}` does not exist.", m.as_str().unwrap_or(&m.to_string())),
            )
        }),
    }
}

fn get_bool(body: &Map<String, Value>, key: &str, default: bool) -> Result<bool, ApiError> {
    match body.get(key) {
        None | Some(Value::Null) => Ok(default),
        Some(v) => lax_bool(v).map_err(|(kind, msg)| {
            ApiError::fields(&[FieldError { kind, loc: format!("body.{key}"), msg, input: validation::input_repr(v) }])
        }),
    }
}

fn get_int(body: &Map<String, Value>, key: &str) -> Result<Option<i64>, ApiError> {
    match body.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => lax_int(v).map(Some).map_err(|(kind, msg)| {
            ApiError::fields(&[FieldError { kind, loc: format!("body.{key}"), msg, input: validation::input_repr(v) }])
        }),
    }
}

/// vLLM's sampling-parameter checks.
fn check_sampling(body: &Map<String, Value>) -> Result<(), ApiError> {
    let float = |k: &str| body.get(k).filter(|v| !v.is_null()).and_then(|v| lax_float(v).ok());
    if let Some(t) = float("temperature").filter(|t| *t < 0.0) {
        let t = py_float(t);
        return Err(ApiError::bad_param(
            "temperature",
            format!("temperature must be non-negative, got {t}. (parameter=temperature, value={t})"),
        ));
    }
    if let Some(p) = float("top_p").filter(|p| !(*p > 0.0 && *p <= 1.0)) {
        let p = py_float(p);
        return Err(ApiError::bad_param(
            "top_p",
            format!("top_p must be in (0, 1], got {p}. (parameter=top_p, value={p})"),
        ));
    }
    Ok(())
}

/// Chat-template inputs of a chat request.
fn chat_tokens(state: &AppState, body: &Map<String, Value>, default_add_special: bool) -> Result<Vec<u32>, ApiError> {
    let messages = body
        .get("messages")
        .and_then(Value::as_array)
        .ok_or_else(|| ApiError::bad_request("`messages` must be a list of messages"))?;
    if messages.is_empty() {
        return Err(ApiError::bad_request(
            "Cannot apply chat template to an empty conversation. Provide at least one message.",
        ));
    }
    if messages.iter().any(|m| !m.is_object() || m.get("role").and_then(Value::as_str).is_none()) {
        return Err(ApiError::bad_request("every message needs a string `role`"));
    }
    let add_generation_prompt = get_bool(body, "add_generation_prompt", true)?;
    let continue_final = get_bool(body, "continue_final_message", false)?;
    if add_generation_prompt && continue_final && body.contains_key("add_generation_prompt") {
        return Err(ApiError::bad_request(
            "cannot set both `continue_final_message` and `add_generation_prompt` to true",
        ));
    }
    let kwargs = match body.get("chat_template_kwargs") {
        None | Some(Value::Null) => None,
        Some(Value::Object(o)) => Some(o),
        Some(_) => return Err(ApiError::bad_request("`chat_template_kwargs` must be an object")),
    };
    let add_special = get_bool(body, "add_special_tokens", default_add_special)?;
    tools::validate_tools(body).map_err(ApiError::bad_request)?;
    let tools = tools::template_tools(body.get("tools").filter(|t| !t.is_null()));
    Ok(state.tokenizer.encode_chat(
        messages,
        add_generation_prompt,
        continue_final,
        tools.as_ref(),
        kwargs,
        add_special,
    )?)
}

/// Prompt tokens of a completion request (`prompt` as text or token ids).
fn completion_tokens(state: &AppState, body: &Map<String, Value>) -> Result<Vec<u32>, ApiError> {
    let add_special = get_bool(body, "add_special_tokens", true)?;
    let missing = || {
        ApiError::bad_param(
            "prompt",
            "Either prompt or prompt_embeds must be provided and non-empty. (parameter=prompt)",
        )
    };
    match body.get("prompt") {
        None | Some(Value::Null) => Err(missing()),
        Some(Value::String(text)) if text.is_empty() => Err(missing()),
        Some(Value::Array(items)) if items.is_empty() => Err(missing()),
        Some(Value::String(text)) => Ok(state.tokenizer.encode_prompt(text, add_special)?),
        Some(Value::Array(items)) if items.len() == 1 && items[0].is_string() => {
            Ok(state.tokenizer.encode_prompt(items[0].as_str().unwrap_or_default(), add_special)?)
        }
        Some(Value::Array(items)) if items.iter().all(|v| v.is_u64()) => items
            .iter()
            .map(|v| {
                // As vLLM's input processor: an id the vocabulary does not have is a 400.
                v.as_u64()
                    .and_then(|n| u32::try_from(n).ok())
                    .filter(|id| !state.tokenizer.token_str(*id).is_empty())
                    .ok_or_else(|| ApiError::bad_request(format!("Token id {v} is out of vocabulary")))
            })
            .collect(),
        _ => Err(ApiError::bad_request("`prompt` must be a string or a list of token ids (one prompt per request)")),
    }
}

/// Output length and whether it stands for a natural stop, after the context-length check.
/// As vLLM: a prompt that fills the context is a 400; a `max_tokens` past the context is cut
/// to what is left. Without `max_tokens`, completions get OpenAI's default of 16 tokens
/// (finish `length`, as in vLLM); chat gets the profile's default length ending in a natural
/// stop — vLLM would generate to the end of the context, which no simulated workload wants.
fn output_budget(
    state: &AppState,
    body: &Map<String, Value>,
    prompt_len: usize,
    api: Api,
) -> Result<(u32, bool), ApiError> {
    let requested = match get_int(body, "max_completion_tokens")? {
        Some(n) => Some(n),
        None => get_int(body, "max_tokens")?,
    };
    if let Some(n) = requested.filter(|n| *n < 1) {
        return Err(ApiError::bad_param(
            "max_tokens",
            format!("max_tokens must be at least 1, got {n}. (parameter=max_tokens, value={n})"),
        ));
    }
    let limit = state.max_model_len as usize;
    if let Some(n) = requested.filter(|n| *n > limit as i64) {
        return Err(ApiError::bad_param(
            "max_tokens",
            format!(
                "max_tokens={n} cannot be greater than max_model_len={limit}. Please request fewer output tokens. (parameter=max_tokens, value={n})"
            ),
        ));
    }
    if prompt_len >= limit {
        // vLLM tokenizes at most limit + 1 tokens before it gives up.
        let seen = prompt_len.min(limit + 1);
        return Err(ApiError::bad_param(
            "input_tokens",
            format!(
                "This model's maximum context length is {limit} tokens. However, your prompt contains at least {seen} input tokens, which exceeds this limit even without any output tokens. Please reduce the length of the input prompt. (parameter=input_tokens, value={seen})"
            ),
        ));
    }
    let room = (limit - prompt_len) as u32;
    Ok(match (requested, api) {
        (Some(n), _) => (u32::try_from(n).unwrap_or(u32::MAX).min(room), false),
        (None, Api::Completion) => (COMPLETION_DEFAULT_MAX_TOKENS.min(room), false),
        (None, Api::Chat) => (state.default_max_tokens.min(room), true),
    })
}

/// `max_tokens` of a completion request that gives none (OpenAI's legacy default).
const COMPLETION_DEFAULT_MAX_TOKENS: u32 = 16;

fn check_n(body: &Map<String, Value>) -> Result<(), ApiError> {
    match get_int(body, "n")? {
        None | Some(1) => Ok(()),
        Some(n) if n < 1 => Err(ApiError::bad_request(format!("n must be at least 1, got {n}."))),
        Some(_) => Err(ApiError::bad_request("only n=1 is supported by the simulator")),
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Api {
    Chat,
    Completion,
}

struct Generation {
    api: Api,
    id: String,
    created: u64,
    prompt_len: u32,
    /// The output ends on its own (no `max_tokens` cut): finish reason `stop` (or `tool_calls`).
    natural_stop: bool,
    include_usage: bool,
    continuous_usage: bool,
    /// A forced tool call and its id.
    tool: Option<(ForcedCall, String)>,
    /// The request offered tools: a text answer then says so with `tool_calls: []`.
    offered_tools: bool,
}

impl Generation {
    /// `usage` as vLLM sends it: in a response body with `prompt_tokens_details` (null unless
    /// `--enable-prompt-tokens-details`) and `completion_tokens_details: null`; in a stream
    /// without either null. Chat reports the prompt tokens this request newly cached
    /// (`created_cache_tokens`), completions do not.
    fn usage(&self, state: &AppState, completion: u32, cached: u32, streamed: bool) -> Value {
        let mut usage = json!({
            "prompt_tokens": self.prompt_len,
            "total_tokens": self.prompt_len + completion,
            "completion_tokens": completion,
        });
        let created = (self.prompt_len / state.block_size.max(1) * state.block_size).saturating_sub(cached);
        let details = match (state.prompt_tokens_details, self.api, streamed) {
            (false, _, true) => None,
            (false, _, false) => Some(Value::Null),
            (true, Api::Chat, true) => Some(json!({"cached_tokens": cached, "created_cache_tokens": created})),
            (true, Api::Chat, false) => {
                Some(json!({"cached_tokens": cached, "created_cache_tokens": created, "multimodal_tokens": null}))
            }
            (true, Api::Completion, true) => Some(json!({"cached_tokens": cached})),
            (true, Api::Completion, false) => {
                Some(json!({"cached_tokens": cached, "created_cache_tokens": null, "multimodal_tokens": null}))
            }
        };
        if let Some(d) = details {
            usage["prompt_tokens_details"] = d;
        }
        if !streamed {
            usage["completion_tokens_details"] = Value::Null;
        }
        usage
    }

    fn finish_reason(&self, finished: bool) -> Value {
        let required = self.tool.as_ref().is_some_and(|(c, _)| c.required);
        match (finished, self.natural_stop) {
            (false, _) => Value::Null,
            (true, true) if required => json!("tool_calls"),
            (true, true) => json!("stop"),
            (true, false) => json!("length"),
        }
    }

    fn chunk_value(&self, model: &str, choice: Value, usage: Option<Value>) -> Value {
        let object = match self.api {
            Api::Chat => "chat.completion.chunk",
            Api::Completion => "text_completion",
        };
        let mut v =
            json!({"id": self.id, "object": object, "created": self.created, "model": model, "choices": [choice]});
        if let Some(u) = usage {
            v["usage"] = u;
        }
        v
    }
}

/// The assistant message of a chat response, with vLLM's always-present null fields.
fn assistant_message(content: Value, tool_calls: Option<Vec<Value>>) -> Value {
    let mut m = json!({"role": "assistant", "content": content, "refusal": null, "annotations": null, "audio": null,
                       "function_call": null, "reasoning": null});
    if let Some(calls) = tool_calls {
        m["tool_calls"] = Value::Array(calls);
    }
    m
}

/// vLLM's `system_fingerprint`: its version and a per-process random part (here, per worker).
fn system_fingerprint(state: &AppState) -> String {
    format!("vllm-0.32.0-{:08x}", mix(state.seed ^ u64::from(state.worker_index) ^ 0xf1_9e4) as u32)
}

/// Output tokens and budget of a forced tool call: the JSON text's tokens and the
/// end-of-sequence token, cut at `max_tokens` (or at the context when it is absent).
fn forced_output(
    state: &AppState,
    call: &ForcedCall,
    requested: bool,
    max_tokens: u32,
    prompt_len: usize,
) -> Result<(Arc<[u32]>, u32, bool), ApiError> {
    let mut ids = state.tokenizer.encode_prompt(&call.output, false)?;
    ids.extend(state.tokenizer.eos_token_id());
    let cap = if requested { max_tokens } else { (state.max_model_len as usize - prompt_len) as u32 };
    let natural = ids.len() <= cap as usize;
    Ok((ids.into(), cap, natural))
}

async fn generate(
    state: Shared,
    body: Map<String, Value>,
    prompt: Vec<u32>,
    api: Api,
    tool_request: Option<tools::ToolRequest>,
) -> Result<Response, ApiError> {
    check_n(&body)?;
    check_sampling(&body)?;
    let (max_tokens, natural_stop) = output_budget(&state, &body, prompt.len(), api)?;
    if state.faults.take_fail_request() {
        return Err(ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "injected failure"));
    }
    let stream = get_bool(&body, "stream", false)?;
    if let Some(guard) = state.faults.take_stall() {
        return Ok(stalled_response(&state, stream, guard));
    }
    let opts = body.get("stream_options");
    let include_usage = opts.and_then(|o| o.get("include_usage")).and_then(Value::as_bool).unwrap_or(false);
    let continuous_usage = opts.and_then(|o| o.get("continuous_usage_stats")).and_then(Value::as_bool).unwrap_or(false);
    let n = state.next_id.fetch_add(1, Ordering::Relaxed);
    let prefix = if api == Api::Chat { "chatcmpl" } else { "cmpl" };
    let id = format!("{prefix}-{:016x}{:016x}", mix(state.seed ^ n), mix(n.wrapping_add(0x51ed)));
    let forced = tool_request.as_ref().and_then(|req| {
        let messages = body.get("messages").and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default();
        let vocab = state.tokenizer.output_vocab();
        let word = |k: u64| match vocab.len() {
            0 => "word".to_owned(),
            len => state.tokenizer.token_text(vocab[(k % len as u64) as usize]).trim().to_owned(),
        };
        let seed = prompt.iter().fold(state.seed ^ 0x7001_5eed, |h, &t| mix(h ^ u64::from(t)));
        tools::forced_call(req, messages, seed, &word)
    });
    let (output, max_tokens, natural_stop, tool) = match forced {
        None => (None, max_tokens, natural_stop, None),
        Some(call) => {
            let (ids, cap, natural) = forced_output(&state, &call, !natural_stop, max_tokens, prompt.len())?;
            let call_id = format!("chatcmpl-tool-{:016x}{:016x}", mix(state.seed ^ n ^ 0x700c), mix(n ^ 0xca11));
            (Some(ids), cap, natural, Some((call, call_id)))
        }
    };
    let generation = Generation {
        api,
        id,
        created: now_secs(),
        prompt_len: prompt.len() as u32,
        natural_stop,
        include_usage,
        continuous_usage,
        tool,
        offered_tools: body.get("tools").is_some_and(Value::is_array),
    };
    let rx = state
        .worker
        .submit_with_output(prompt, max_tokens, natural_stop, output)
        .map_err(|e| ApiError::new(StatusCode::SERVICE_UNAVAILABLE, e.to_string()))?;
    if stream { Ok(stream_response(state, generation, rx)) } else { collect_response(state, generation, rx).await }
}

/// `200` with the usual headers, then a body that sends nothing until the client goes away
/// (hyper drops the body) or the simulator shuts down (the connection is aborted).
fn stalled_response(state: &AppState, stream: bool, guard: crate::faults::StallGuard) -> Response {
    let shutdown = state.shutdown.clone();
    let body = futures::stream::once(async move {
        let _open = guard;
        shutdown.cancelled().await;
        Err::<Bytes, _>(std::io::Error::other("simulator shut down"))
    });
    let mut resp = Response::new(Body::from_stream(body));
    let content_type = if stream { "text/event-stream; charset=utf-8" } else { "application/json" };
    resp.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    if stream {
        resp.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    }
    resp
}

async fn collect_response(
    state: Shared,
    generation: Generation,
    mut rx: tokio::sync::mpsc::UnboundedReceiver<Emitted>,
) -> Result<Response, ApiError> {
    let mut tokens = Vec::new();
    let mut cached = 0;
    let mut finished = false;
    while let Some(Emitted::Token { token, finished: f, cached_prompt_tokens, .. }) = rx.recv().await {
        tokens.push(token);
        cached = cached_prompt_tokens;
        if f {
            finished = true;
            break;
        }
    }
    if !finished {
        return Err(ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "generation aborted"));
    }
    let text = state.tokenizer.decode(&tokens, true)?;
    let usage = generation.usage(&state, tokens.len() as u32, cached, false);
    let message = match &generation.tool {
        None => assistant_message(json!(text), generation.offered_tools.then(Vec::new)),
        Some((call, call_id)) => {
            // vLLM parses the generated text: a named call's arguments are the text itself; a
            // "required" array that does not parse (cut by max_tokens) yields no calls.
            let arguments = match (call.required, generation.natural_stop) {
                (false, _) if text.trim().is_empty() => None,
                (false, _) => Some(text.clone()),
                (true, true) => Some(call.arguments.clone()),
                (true, false) => None,
            };
            let calls: Vec<Value> = arguments
                .map(|a| json!({"id": call_id, "type": "function", "function": {"name": call.name, "arguments": a}}))
                .into_iter()
                .collect();
            assistant_message(json!(""), Some(calls))
        }
    };
    let body = match generation.api {
        Api::Chat => json!({
            "id": generation.id, "object": "chat.completion", "created": generation.created, "model": state.model,
            "choices": [{"index": 0, "message": message, "logprobs": null, "finish_reason": generation.finish_reason(true),
                         "stop_reason": null, "token_ids": null, "routed_experts": null}],
            "service_tier": null, "system_fingerprint": system_fingerprint(&state), "usage": usage,
            "prompt_logprobs": null, "prompt_token_ids": null, "prompt_text": null,
            "kv_transfer_params": null, "ec_transfer_params": null, "metrics": null,
        }),
        Api::Completion => json!({
            "id": generation.id, "object": "text_completion", "created": generation.created, "model": state.model,
            "choices": [{"index": 0, "text": text, "logprobs": null, "finish_reason": generation.finish_reason(true), "stop_reason": null,
                         "token_ids": null, "prompt_logprobs": null, "prompt_token_ids": null, "routed_experts": null}],
            "service_tier": null, "system_fingerprint": system_fingerprint(&state), "usage": usage,
            "kv_transfer_params": null, "ec_transfer_params": null, "metrics": null,
        }),
    };
    Ok(axum::Json(body).into_response())
}

/// Text of a forced call's tokens as they arrive, decoded incrementally so a character split
/// across tokens is held back until it is whole (as vLLM's detokenizer does).
struct IncrementalText {
    ids: Vec<u32>,
    emitted: usize,
}

impl IncrementalText {
    fn push(&mut self, tokenizer: &EngineTokenizer, token: u32, last: bool) -> String {
        self.ids.push(token);
        let text = tokenizer.decode(&self.ids, true).unwrap_or_default();
        if !last && text.ends_with('\u{fffd}') {
            return String::new();
        }
        let delta = text.get(self.emitted..).unwrap_or_default().to_owned();
        self.emitted = text.len().max(self.emitted);
        delta
    }
}

fn stream_response(
    state: Shared,
    generation: Generation,
    rx: tokio::sync::mpsc::UnboundedReceiver<Emitted>,
) -> Response {
    let cut_after = state.faults.take_cut();
    let mut tool_stream = generation.tool.as_ref().map(|(call, id)| ToolStream::new(call, id.clone()));
    let mut decoded = IncrementalText { ids: Vec::new(), emitted: 0 };
    let generation = Arc::new(generation);
    let model = state.model.clone();
    let mut count: u32 = 0;
    let mut cut = false;
    let tokens = UnboundedReceiverStream::new(rx);
    let body = tokens
        .map(move |Emitted::Token { token, finished, cached_prompt_tokens, .. }| {
            count += 1;
            let mut frames: Vec<Result<Bytes, std::io::Error>> = Vec::new();
            if cut_after.is_some_and(|k| count > k) {
                // Injected cut: end the connection without a final event.
                if !cut {
                    cut = true;
                    frames.push(Err(std::io::Error::other("stream cut by fault injection")));
                }
                return futures::stream::iter(frames);
            }
            let usage = generation.continuous_usage.then(|| generation.usage(&state, count, cached_prompt_tokens, true));
            if count == 1 && generation.api == Api::Chat {
                let role = json!({"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": null, "finish_reason": null});
                let mut first = generation.chunk_value(&model, role, generation.continuous_usage.then(|| generation.usage(&state, 0, cached_prompt_tokens, true)));
                first["prompt_token_ids"] = Value::Null;
                first["prompt_text"] = Value::Null;
                frames.push(Ok(Bytes::from(format!("data: {first}\n\n"))));
            }
            let delta = match tool_stream.as_mut() {
                None => Some(json!({"content": state.tokenizer.token_text(token)})),
                Some(s) => s.delta(&decoded.push(&state.tokenizer, token, finished)),
            };
            // vLLM sends no chunk for text a forced call does not stream, except the last.
            let delta = match (delta, finished) {
                (Some(d), _) => Some(d),
                (None, true) => Some(json!({})),
                (None, false) => None,
            };
            if let Some(delta) = delta {
                let mut choice = match generation.api {
                    Api::Chat => json!({"index": 0, "delta": delta, "logprobs": null, "finish_reason": generation.finish_reason(finished)}),
                    Api::Completion => json!({"index": 0, "text": state.tokenizer.token_text(token), "logprobs": null, "finish_reason": generation.finish_reason(finished), "stop_reason": null, "prompt_token_ids": null}),
                };
                // As vLLM: every chunk's choice has `token_ids`; a chat choice gets
                // `stop_reason` only on the last.
                if finished && generation.api == Api::Chat {
                    choice["stop_reason"] = Value::Null;
                }
                choice["token_ids"] = Value::Null;
                let mut chunk = generation.chunk_value(&model, choice, usage);
                // The stream's last data chunk carries the fingerprint: this one, unless a
                // usage chunk follows.
                if finished && !generation.include_usage {
                    chunk["system_fingerprint"] = json!(system_fingerprint(&state));
                }
                frames.push(Ok(Bytes::from(format!("data: {chunk}\n\n"))));
            }
            if finished {
                if generation.include_usage {
                    let object = if generation.api == Api::Chat { "chat.completion.chunk" } else { "text_completion" };
                    let u = json!({"id": generation.id, "object": object, "created": generation.created, "model": model, "choices": [],
                                   "usage": generation.usage(&state, count, cached_prompt_tokens, true),
                                   "system_fingerprint": system_fingerprint(&state)});
                    frames.push(Ok(Bytes::from(format!("data: {u}\n\n"))));
                }
                frames.push(Ok(Bytes::from_static(b"data: [DONE]\n\n")));
            }
            futures::stream::iter(frames)
        })
        .flatten();
    let mut resp = Response::new(Body::from_stream(body));
    resp.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream; charset=utf-8"));
    resp.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    resp
}

async fn models(State(state): State<Shared>) -> Response {
    axum::Json(json!({"object": "list", "data": [{
        "id": state.model, "object": "model", "created": now_secs(), "owned_by": "vllm", "root": state.model,
        "parent": null, "max_model_len": state.max_model_len,
        "permission": [{
            "id": format!("modelperm-{:016x}", mix(state.seed ^ 0x9e12)), "object": "model_permission", "created": now_secs(),
            "allow_create_engine": false, "allow_sampling": true, "allow_logprobs": true, "allow_search_indices": false,
            "allow_view": true, "allow_fine_tuning": false, "organization": "*", "group": null, "is_blocking": false,
        }],
    }]}))
    .into_response()
}

async fn chat_completions(State(state): State<Shared>, body: Bytes) -> Result<Response, ApiError> {
    let body = parse_body(&body, Some(Schema::Chat))?;
    check_model(&state, &body)?;
    let tool_request = tools::parse_request(&body).map_err(ApiError::bad_request)?;
    let tokens = chat_tokens(&state, &body, false)?;
    generate(state, body, tokens, Api::Chat, Some(tool_request)).await
}

async fn completions(State(state): State<Shared>, body: Bytes) -> Result<Response, ApiError> {
    let body = parse_body(&body, Some(Schema::Completion))?;
    check_model(&state, &body)?;
    let tokens = completion_tokens(&state, &body)?;
    generate(state, body, tokens, Api::Completion, None).await
}

/// Tokens for `/tokenize`, `/render` and the oracle: `messages`, `prompt` or `token_ids`.
fn request_tokens(state: &AppState, body: &Map<String, Value>) -> Result<Vec<u32>, ApiError> {
    if body.contains_key("messages") {
        chat_tokens(state, body, false)
    } else if let Some(Value::Array(ids)) = body.get("token_ids") {
        ids.iter()
            .map(|v| {
                v.as_u64().and_then(|n| u32::try_from(n).ok()).ok_or_else(|| ApiError::bad_request("bad token id"))
            })
            .collect()
    } else {
        completion_tokens(state, body)
    }
}

async fn tokenize(State(state): State<Shared>, body: Bytes) -> Result<Response, ApiError> {
    let body = parse_body(&body, None)?;
    check_model(&state, &body)?;
    let tokens = request_tokens(&state, &body)?;
    let strs = get_bool(&body, "return_token_strs", false)?
        .then(|| tokens.iter().map(|t| state.tokenizer.token_str(*t)).collect::<Vec<_>>());
    Ok(axum::Json(
        json!({"count": tokens.len(), "max_model_len": state.max_model_len, "tokens": tokens, "token_strs": strs}),
    )
    .into_response())
}

async fn detokenize(State(state): State<Shared>, body: Bytes) -> Result<Response, ApiError> {
    let body = parse_body(&body, None)?;
    check_model(&state, &body)?;
    let ids: Vec<u32> = body
        .get("tokens")
        .and_then(Value::as_array)
        .ok_or_else(|| ApiError::bad_request("`tokens` must be a list of token ids"))?
        .iter()
        .map(|v| v.as_u64().and_then(|n| u32::try_from(n).ok()).ok_or_else(|| ApiError::bad_request("bad token id")))
        .collect::<Result<_, _>>()?;
    Ok(axum::Json(json!({"prompt": state.tokenizer.decode(&ids, false)?})).into_response())
}

/// A render answer as vLLM's: the tokens and the sampling parameters the engine would run
/// with. `max_tokens` is the request's, cut to the context; a chat without one gets the rest
/// of the context, a completion none (the engine applies its default later).
fn render_one(state: &AppState, body: &Map<String, Value>, tokens: Vec<u32>, api: Api) -> Result<Value, ApiError> {
    check_sampling(body)?;
    output_budget(state, body, tokens.len(), api)?;
    let room = state.max_model_len as i64 - tokens.len() as i64;
    let requested = match get_int(body, "max_completion_tokens")? {
        Some(n) => Some(n),
        None => get_int(body, "max_tokens")?,
    };
    let max_tokens = match (requested, api) {
        (Some(n), _) => Some(n.min(room)),
        (None, Api::Chat) => Some(room),
        (None, Api::Completion) => None,
    };
    let float = |k: &str, default: f64| body.get(k).and_then(|v| lax_float(v).ok()).unwrap_or(default);
    let temperature = float("temperature", 1.0);
    let mut sampling = Map::new();
    sampling.insert("presence_penalty".into(), json!(float("presence_penalty", 0.0)));
    sampling.insert("frequency_penalty".into(), json!(float("frequency_penalty", 0.0)));
    sampling.insert("repetition_penalty".into(), json!(float("repetition_penalty", 1.0)));
    sampling.insert("temperature".into(), json!(temperature));
    // Greedy sampling drops the nucleus parameters, as vLLM's SamplingParams does.
    if temperature > 0.0 {
        sampling.insert("top_p".into(), json!(float("top_p", 1.0)));
        sampling.insert("min_p".into(), json!(float("min_p", 0.0)));
    }
    if let Some(seed) = get_int(body, "seed")? {
        sampling.insert("seed".into(), json!(seed));
    }
    let stop = match body.get("stop") {
        Some(Value::String(s)) => json!([s]),
        Some(Value::Array(a)) => json!(a),
        _ => json!([]),
    };
    sampling.insert("stop".into(), stop);
    sampling.insert(
        "stop_token_ids".into(),
        body.get("stop_token_ids").filter(|v| v.is_array()).cloned().unwrap_or(json!([])),
    );
    if let Some(m) = max_tokens {
        sampling.insert("max_tokens".into(), json!(m));
    }
    let stream = get_bool(body, "stream", false)?;
    // vLLM's RequestOutputKind: DELTA for streams, FINAL_ONLY otherwise.
    sampling.insert("output_kind".into(), json!(if stream { 1 } else { 2 }));
    sampling.insert("skip_clone".into(), json!(true));
    sampling.insert("bad_words".into(), json!([]));
    sampling.insert("skip_reading_prefix_cache".into(), json!(false));
    let n = state.next_id.fetch_add(1, Ordering::Relaxed);
    let prefix = if api == Api::Chat { "chatcmpl" } else { "cmpl" };
    Ok(json!({
        "request_id": format!("{prefix}-{:016x}", mix(state.seed ^ n)),
        "token_ids": tokens, "token_offsets": null, "features": null, "content_parts": null,
        "sampling_params": sampling,
        "model": state.model, "reasoning_ended": null, "reasoning_parser_kwargs": null, "return_token_ids": null,
        "output_mode": "tokens", "stream": stream,
        "stream_options": body.get("stream_options").cloned().unwrap_or(Value::Null),
        "cache_salt": body.get("cache_salt").cloned().unwrap_or(Value::Null),
        "priority": get_int(body, "priority")?.unwrap_or(0),
        "kv_transfer_params": null, "ec_transfer_params": null,
    }))
}

async fn render_chat(State(state): State<Shared>, body: Bytes) -> Result<Response, ApiError> {
    let body = parse_body(&body, Some(Schema::Chat))?;
    check_model(&state, &body)?;
    tools::parse_request(&body).map_err(ApiError::bad_request)?;
    let tokens = chat_tokens(&state, &body, false)?;
    Ok(axum::Json(render_one(&state, &body, tokens, Api::Chat)?).into_response())
}

async fn render_completion(State(state): State<Shared>, body: Bytes) -> Result<Response, ApiError> {
    let body = parse_body(&body, Some(Schema::Completion))?;
    check_model(&state, &body)?;
    let tokens = completion_tokens(&state, &body)?;
    Ok(axum::Json(json!([render_one(&state, &body, tokens, Api::Completion)?])).into_response())
}

async fn metrics(State(state): State<Shared>) -> Response {
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], state.metrics.render()).into_response()
}

async fn oracle(State(state): State<Shared>, body: Bytes) -> Result<Response, ApiError> {
    let body = parse_body(&body, None)?;
    let tokens = request_tokens(&state, &body)?;
    let prompt_tokens = tokens.len();
    let a =
        state.worker.oracle(tokens).await.map_err(|e| ApiError::new(StatusCode::SERVICE_UNAVAILABLE, e.to_string()))?;
    Ok(axum::Json(json!({
        "promptTokens": prompt_tokens,
        "cachedPrefixTokens": a.cached_prefix_tokens,
        "predictedTtftMs": a.predicted_ttft_ms * state.time_scale,
        "predictedTtftMsAtScale1": a.predicted_ttft_ms,
        "waiting": a.stats.waiting,
        "running": a.stats.running,
        "waitingPrefillTokens": a.stats.waiting_prefill_tokens,
        "kvCacheUsage": a.stats.kv_usage,
    }))
    .into_response())
}

async fn sim_state(State(state): State<Shared>) -> Result<Response, ApiError> {
    let (s, c) =
        state.worker.state().await.map_err(|e| ApiError::new(StatusCode::SERVICE_UNAVAILABLE, e.to_string()))?;
    Ok(axum::Json(json!({
        "model": state.model, "worker": state.worker_index, "timeScale": state.time_scale,
        "waiting": s.waiting, "running": s.running, "kvCacheUsage": s.kv_usage, "cachedBlocks": s.cached_blocks,
        "waitingPrefillTokens": s.waiting_prefill_tokens,
        "prefixCacheQueries": c.prefix_cache_queries, "prefixCacheHits": c.prefix_cache_hits,
        "promptTokens": c.prompt_tokens, "generationTokens": c.generation_tokens,
        "preemptions": c.preemptions, "finished": c.finished,
        "stalledRequests": state.faults.stalled_open(),
    }))
    .into_response())
}

async fn set_faults(State(state): State<Shared>, body: Bytes) -> Result<Response, ApiError> {
    let req: FaultRequest =
        serde_json::from_slice(&body).map_err(|e| ApiError::bad_request(format!("invalid fault request: {e}")))?;
    state.faults.arm(&req);
    if req.restart_event_stream == Some(true) {
        state.worker.restart_events().map_err(|e| ApiError::new(StatusCode::SERVICE_UNAVAILABLE, e.to_string()))?;
    }
    Ok(axum::Json(state.faults.snapshot()).into_response())
}

async fn get_faults(State(state): State<Shared>) -> Response {
    axum::Json(state.faults.snapshot()).into_response()
}
