//! A faithful AWS Bedrock Runtime endpoint for tests and the local fleet
//! (`switchyard sim --api bedrock`).
//!
//! To the real `aws-sdk-bedrockruntime` client it is the service: rest-json routes
//! `POST /model/{modelId}/converse`, `/converse-stream` and `/count-tokens` (the model id is one
//! percent-encoded path segment), `application/vnd.amazon.eventstream` frames for streams
//! (`messageStart`, `contentBlockStart` for tool use only, `contentBlockDelta`,
//! `contentBlockStop`, `messageStop`, then `metadata` with usage last), and errors the way the
//! SDK classifies them: the `x-amzn-ErrorType` header, the status of the modelled exception
//! and a `{"message": …}` body. The request id is in `x-amzn-requestid`.
//!
//! Behind the API sits a deterministic model, not a language model: the answer's words are a
//! function of the conversation, one output token per word; input tokens are one per four
//! bytes of text (Bedrock counts with each model's own tokenizer, which the SDK never sees).
//! Prompt caching follows `cachePoint` blocks: the text before the last cache point is written
//! on first sight (`cacheWriteInputTokens`) and read afterwards (`cacheReadInputTokens`);
//! `inputTokens` counts only the rest, as Bedrock reports it. Tools: with `toolChoice` `any`
//! or `tool`, or `auto` when the last user text names a tool, the answer is one `toolUse`
//! whose input fills the schema's properties; stop sequences and `maxTokens` end the text
//! with `stop_sequence` and `max_tokens`.
//!
//! Latency: the headers and `messageStart` go out at once, the first delta after
//! `first_token_ms + per_input_token_ms × inputTokens`, each later token after
//! `per_output_token_ms`, all times `time_scale`; a Converse answer comes when its stream would
//! have ended.
//!
//! Test surface: `GET /sim/requests` is the request log (operation, model id, the SDK's
//! attempt header, the SigV4 credential scope, status and error type, the request body);
//! `DELETE /sim/requests` clears it. `POST /sim/faults` arms faults by count — `throttle`
//! (429 `ThrottlingException`), `unavailable` (503 `ServiceUnavailableException`),
//! `internalErrors` (500 `InternalServerException`), `slowFirstByte: {count, ms}` and
//! `cutStreams: {count, afterDeltas}` (the body is aborted after that many content deltas:
//! no `messageStop`, no `metadata`, no terminating chunk) — and `{"clear": true}` disarms all;
//! `GET /sim/faults` shows what is armed. Faults count HTTP requests, so an SDK's retries
//! each take one.
//!
//! Invariants: every request is logged exactly once, with the status it got; no fault is
//! active unless armed; nothing outlives [`BedrockEndpoint::shutdown`] (stream producers
//! stop with the server's cancellation token).

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use aws_smithy_types::event_stream::{Header, HeaderValue, Message};
use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};
use sha2::{Digest, Sha256};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// How long the model takes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LatencyModel {
    /// Before the first token, whatever the prompt.
    pub first_token_ms: f64,
    /// Added to the first token per input token (prefill).
    pub per_input_token_ms: f64,
    /// Between two output tokens.
    pub per_output_token_ms: f64,
}

impl Default for LatencyModel {
    /// A hosted model's typical figures: 250 ms to the first token plus 20 µs per input
    /// token, then 10 ms per output token.
    fn default() -> Self {
        LatencyModel { first_token_ms: 250.0, per_input_token_ms: 0.02, per_output_token_ms: 10.0 }
    }
}

/// Configuration of one endpoint.
#[derive(Debug, Clone)]
pub struct BedrockConfig {
    /// Bind address.
    pub host: String,
    /// Port (0 = any free port).
    pub port: u16,
    /// Model ids it serves; empty serves any id.
    pub models: Vec<String>,
    /// Timing.
    pub latency: LatencyModel,
    /// Multiplier on every duration.
    pub time_scale: f64,
}

impl Default for BedrockConfig {
    fn default() -> Self {
        BedrockConfig {
            host: "127.0.0.1".to_owned(),
            port: 0,
            models: Vec::new(),
            latency: LatencyModel::default(),
            time_scale: 1.0,
        }
    }
}

/// One logged request.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LoggedRequest {
    /// Arrival order, from 1.
    pub seq: u64,
    /// `Converse`, `ConverseStream` or `CountTokens`.
    pub operation: &'static str,
    /// The decoded model id.
    pub model_id: String,
    /// The SDK's `amz-sdk-request` header (`attempt=1; max=3`).
    pub attempt: Option<String>,
    /// `sigv4`, `bearer` or `none`.
    pub auth: &'static str,
    /// SigV4 credential scope (`AKID/yyyymmdd/region/bedrock/aws4_request`).
    pub credential_scope: Option<String>,
    /// Whether `x-amz-date` was sent.
    pub amz_date: bool,
    /// The status answered (a stream cut later still logs 200).
    pub status: u16,
    /// The error type answered, if any.
    pub error_type: Option<String>,
    /// The request body as JSON.
    pub body: Value,
}

/// `POST /sim/faults` body; absent fields leave a knob unchanged.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BedrockFaults {
    /// Disarm everything first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clear: Option<bool>,
    /// The next N requests get 429 `ThrottlingException`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub throttle: Option<u32>,
    /// The next N requests get 503 `ServiceUnavailableException`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unavailable: Option<u32>,
    /// The next N requests get 500 `InternalServerException`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub internal_errors: Option<u32>,
    /// The next `count` requests wait `ms` more before their first byte.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slow_first_byte: Option<SlowFirstByte>,
    /// The next `count` streams are aborted after `afterDeltas` content deltas.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cut_streams: Option<CutStreams>,
}

/// See [`BedrockFaults::slow_first_byte`].
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SlowFirstByte {
    /// Requests affected.
    pub count: u32,
    /// Extra delay in milliseconds (not scaled).
    pub ms: u64,
}

/// See [`BedrockFaults::cut_streams`].
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CutStreams {
    /// Streams affected.
    pub count: u32,
    /// Content deltas sent before the cut.
    pub after_deltas: u32,
}

#[derive(Debug, Default, Clone, Copy, Serialize)]
#[serde(rename_all = "camelCase")]
struct Armed {
    throttle: u32,
    unavailable: u32,
    internal_errors: u32,
    slow_first_byte: SlowFirstByte,
    cut_streams: CutStreams,
}

/// What a request drew from the armed faults.
#[derive(Debug, Default, Clone, Copy)]
struct Drawn {
    error: Option<BedrockError>,
    extra_first_byte: Duration,
    cut_after: Option<u32>,
}

impl Armed {
    fn draw(&mut self, streaming: bool) -> Drawn {
        let take = |n: &mut u32| {
            let hit = *n > 0;
            *n = n.saturating_sub(1);
            hit
        };
        let mut drawn = Drawn::default();
        if take(&mut self.throttle) {
            drawn.error = Some(BedrockError::Throttling);
        } else if take(&mut self.unavailable) {
            drawn.error = Some(BedrockError::Unavailable);
        } else if take(&mut self.internal_errors) {
            drawn.error = Some(BedrockError::Internal);
        }
        if take(&mut self.slow_first_byte.count) {
            drawn.extra_first_byte = Duration::from_millis(self.slow_first_byte.ms);
        }
        if drawn.error.is_none() && streaming && take(&mut self.cut_streams.count) {
            drawn.cut_after = Some(self.cut_streams.after_deltas);
        }
        drawn
    }
}

/// The exceptions this endpoint answers, with the status and code Bedrock uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BedrockError {
    Throttling,
    Unavailable,
    Internal,
    Validation,
    NotFound,
    AccessDenied,
}

impl BedrockError {
    fn status(self) -> StatusCode {
        match self {
            BedrockError::Throttling => StatusCode::TOO_MANY_REQUESTS,
            BedrockError::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
            BedrockError::Internal => StatusCode::INTERNAL_SERVER_ERROR,
            BedrockError::Validation => StatusCode::BAD_REQUEST,
            BedrockError::NotFound => StatusCode::NOT_FOUND,
            BedrockError::AccessDenied => StatusCode::FORBIDDEN,
        }
    }

    fn code(self) -> &'static str {
        match self {
            BedrockError::Throttling => "ThrottlingException",
            BedrockError::Unavailable => "ServiceUnavailableException",
            BedrockError::Internal => "InternalServerException",
            BedrockError::Validation => "ValidationException",
            BedrockError::NotFound => "ResourceNotFoundException",
            BedrockError::AccessDenied => "AccessDeniedException",
        }
    }

    fn default_message(self) -> &'static str {
        match self {
            BedrockError::Throttling => "Too many requests, please wait before trying again.",
            BedrockError::Unavailable => "Bedrock is unable to process your request.",
            BedrockError::Internal => "The server encountered an internal error while processing the request.",
            _ => "",
        }
    }
}

struct Endpoint {
    cfg: BedrockConfig,
    log: Mutex<Vec<LoggedRequest>>,
    armed: Mutex<Armed>,
    cache: Mutex<HashSet<[u8; 32]>>,
    seq: AtomicU64,
    stop: CancellationToken,
}

type Shared = Arc<Endpoint>;

/// A running endpoint.
pub struct BedrockEndpoint {
    /// Where it listens.
    pub addr: SocketAddr,
    stop: CancellationToken,
    task: JoinHandle<()>,
}

impl BedrockEndpoint {
    /// Binds and serves until [`BedrockEndpoint::shutdown`].
    pub async fn start(cfg: BedrockConfig) -> std::io::Result<BedrockEndpoint> {
        let listener = TcpListener::bind((cfg.host.as_str(), cfg.port)).await?;
        let addr = listener.local_addr()?;
        let stop = CancellationToken::new();
        let state = Arc::new(Endpoint {
            cfg,
            log: Mutex::new(Vec::new()),
            armed: Mutex::new(Armed::default()),
            cache: Mutex::new(HashSet::new()),
            seq: AtomicU64::new(0),
            stop: stop.clone(),
        });
        let app = router(state);
        let until = stop.clone();
        let task = tokio::spawn(async move {
            let listener = axum::serve::ListenerExt::tap_io(listener, |tcp| {
                let _ = tcp.set_nodelay(true);
            });
            let _ = axum::serve(listener, app).with_graceful_shutdown(async move { until.cancelled().await }).await;
        });
        Ok(BedrockEndpoint { addr, stop, task })
    }

    /// The base URL to give a client as its endpoint.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Stops serving; open streams end.
    pub async fn shutdown(self) {
        self.stop.cancel();
        let _ = self.task.await;
    }
}

fn router(state: Shared) -> Router {
    Router::new()
        .route("/model/{model_id}/converse", post(converse))
        .route("/model/{model_id}/converse-stream", post(converse_stream))
        .route("/model/{model_id}/count-tokens", post(count_tokens))
        .route("/sim/requests", get(requests).delete(clear_requests))
        .route("/sim/faults", get(faults).post(arm_faults))
        .route("/ping", get(|| async { "ok" }))
        .with_state(state)
}

async fn requests(State(s): State<Shared>) -> Response {
    let log = s.log.lock().map(|l| l.clone()).unwrap_or_default();
    axum::Json(json!({ "requests": log })).into_response()
}

async fn clear_requests(State(s): State<Shared>) -> StatusCode {
    if let Ok(mut l) = s.log.lock() {
        l.clear();
    }
    StatusCode::NO_CONTENT
}

async fn faults(State(s): State<Shared>) -> Response {
    let armed = s.armed.lock().map(|a| *a).unwrap_or_default();
    axum::Json(armed).into_response()
}

async fn arm_faults(State(s): State<Shared>, body: Bytes) -> Response {
    let req: BedrockFaults = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => return (StatusCode::BAD_REQUEST, format!("invalid fault request: {e}")).into_response(),
    };
    let Ok(mut armed) = s.armed.lock() else { return StatusCode::INTERNAL_SERVER_ERROR.into_response() };
    if req.clear == Some(true) {
        *armed = Armed::default();
    }
    if let Some(n) = req.throttle {
        armed.throttle = n;
    }
    if let Some(n) = req.unavailable {
        armed.unavailable = n;
    }
    if let Some(n) = req.internal_errors {
        armed.internal_errors = n;
    }
    if let Some(v) = req.slow_first_byte {
        armed.slow_first_byte = v;
    }
    if let Some(v) = req.cut_streams {
        armed.cut_streams = v;
    }
    axum::Json(*armed).into_response()
}

/// Who signed the request, as the log records it.
fn auth_of(headers: &HeaderMap) -> (&'static str, Option<String>) {
    let Some(auth) = headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()) else { return ("none", None) };
    if let Some(rest) = auth.strip_prefix("AWS4-HMAC-SHA256 ") {
        let scope = rest.split(',').map(str::trim).find_map(|p| p.strip_prefix("Credential=")).map(str::to_owned);
        ("sigv4", scope)
    } else if auth.starts_with("Bearer ") {
        ("bearer", None)
    } else {
        ("none", None)
    }
}

impl Endpoint {
    fn scaled(&self, ms: f64) -> Duration {
        Duration::from_secs_f64((ms * self.cfg.time_scale).max(0.0) / 1_000.0)
    }

    fn log(
        &self,
        operation: &'static str,
        model_id: &str,
        headers: &HeaderMap,
        body: Value,
        status: u16,
        error: Option<&str>,
    ) {
        let (auth, credential_scope) = auth_of(headers);
        let entry = LoggedRequest {
            seq: self.seq.fetch_add(1, Ordering::Relaxed) + 1,
            operation,
            model_id: model_id.to_owned(),
            attempt: headers.get("amz-sdk-request").and_then(|v| v.to_str().ok()).map(str::to_owned),
            auth,
            credential_scope,
            amz_date: headers.contains_key("x-amz-date"),
            status,
            error_type: error.map(str::to_owned),
            body,
        };
        if let Ok(mut l) = self.log.lock() {
            l.push(entry);
        }
    }

    /// Validates and answers the parts every operation shares: auth, model, body, faults.
    fn admit(
        &self,
        operation: &'static str,
        model_id: &str,
        headers: &HeaderMap,
        body: &Bytes,
        streaming: bool,
    ) -> Result<(Value, Drawn), Box<Response>> {
        let parsed: Result<Value, _> = serde_json::from_slice(body);
        let logged = parsed.as_ref().map_or(Value::Null, Value::clone);
        let refuse = |err: BedrockError, message: String| {
            self.log(operation, model_id, headers, logged.clone(), err.status().as_u16(), Some(err.code()));
            Box::new(error_response(err, &message))
        };
        if auth_of(headers).0 == "none" {
            return Err(refuse(BedrockError::AccessDenied, "Missing Authentication Token".to_owned()));
        }
        if !self.cfg.models.is_empty() && !self.cfg.models.iter().any(|m| m == model_id) {
            return Err(refuse(
                BedrockError::NotFound,
                format!("The provided model identifier is invalid: {model_id}"),
            ));
        }
        let value = match parsed {
            Ok(v @ Value::Object(_)) => v,
            _ => return Err(refuse(BedrockError::Validation, "The request body is not a JSON object.".to_owned())),
        };
        let drawn = self.armed.lock().map(|mut a| a.draw(streaming)).unwrap_or_default();
        if let Some(err) = drawn.error {
            return Err(refuse(err, err.default_message().to_owned()));
        }
        Ok((value, drawn))
    }
}

fn error_response(err: BedrockError, message: &str) -> Response {
    let mut response = (err.status(), axum::Json(json!({ "message": message }))).into_response();
    let h = response.headers_mut();
    // What the service sends: the code, then a URL suffix the SDK cuts at the first `:`.
    if let Ok(v) = format!("{}:http://internal.amazon.com/coral/com.amazon.bedrock/", err.code()).parse() {
        h.insert("x-amzn-errortype", v);
    }
    if let Ok(v) = uuid_like().parse() {
        h.insert("x-amzn-requestid", v);
    }
    response
}

/// A request id shaped like AWS's (8-4-4-4-12 hex), unique per process.
fn uuid_like() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let h = Sha256::digest(n.to_le_bytes());
    let x: String = h.iter().take(16).map(|b| format!("{b:02x}")).collect();
    format!("{}-{}-{}-{}-{}", &x[0..8], &x[8..12], &x[12..16], &x[16..20], &x[20..32])
}

/// The answer the model gives to one conversation.
#[derive(Debug, Clone, PartialEq)]
struct Answer {
    /// Text tokens (each a word with its leading space, the first without).
    words: Vec<String>,
    /// A tool call: (id, name, input JSON).
    tool: Option<(String, String, Value)>,
    stop_reason: &'static str,
    usage: TokenUsage,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
struct TokenUsage {
    input: u32,
    output: u32,
    cache_read: u32,
    cache_write: u32,
}

impl TokenUsage {
    fn json(self) -> Value {
        json!({
            "inputTokens": self.input,
            "outputTokens": self.output,
            "totalTokens": self.input + self.output + self.cache_read + self.cache_write,
            "cacheReadInputTokens": self.cache_read,
            "cacheWriteInputTokens": self.cache_write,
        })
    }
}

const WORDS: [&str; 32] = [
    "the", "fleet", "routes", "each", "request", "to", "a", "worker", "with", "its", "prefix", "cached", "and",
    "spills", "over", "when", "local", "capacity", "runs", "out", "so", "answers", "arrive", "sooner", "than", "they",
    "would", "in", "line", "behind", "others", "today",
];

/// JSON text with object keys sorted: clients serialize documents from hash maps, so the same
/// request can arrive with its keys in any order, and the answer must not depend on it.
fn canonical(v: &Value) -> String {
    fn sorted(v: &Value) -> Value {
        match v {
            Value::Object(o) => {
                let mut keys: Vec<&String> = o.keys().collect();
                keys.sort();
                Value::Object(keys.into_iter().map(|k| (k.clone(), sorted(&o[k.as_str()]))).collect())
            }
            Value::Array(a) => Value::Array(a.iter().map(sorted).collect()),
            other => other.clone(),
        }
    }
    sorted(v).to_string()
}

/// Tokens of a text: one per four bytes, at least one for non-empty text.
fn tokens_of(text: &str) -> u32 {
    (text.len() as u32).div_ceil(4)
}

/// The text of content blocks (text, tool use input, tool results) in order, with the index of
/// the last cache point's position in that text.
fn flatten(blocks: &[Value], out: &mut String, cache_at: &mut Option<usize>) {
    for block in blocks {
        if let Some(t) = block.get("text").and_then(Value::as_str) {
            out.push_str(t);
        } else if let Some(tu) = block.get("toolUse") {
            out.push_str(&canonical(tu));
        } else if let Some(tr) = block.get("toolResult") {
            if let Some(content) = tr.get("content").and_then(Value::as_array) {
                flatten(content, out, cache_at);
            }
        } else if let Some(j) = block.get("json") {
            out.push_str(&canonical(j));
        } else if block.get("cachePoint").is_some() {
            *cache_at = Some(out.len());
        }
        out.push('\n');
    }
}

/// Checks a Converse request the way the service does and returns its prompt text and the
/// position of its last cache point.
fn validate(body: &Value) -> Result<(String, Option<usize>), String> {
    let messages = body.get("messages").and_then(Value::as_array).filter(|m| !m.is_empty());
    let Some(messages) = messages else {
        return Err("A conversation must start with a user message. Try again with a conversation that starts with a user message.".to_owned());
    };
    let mut expected = "user";
    for (i, m) in messages.iter().enumerate() {
        let role = m.get("role").and_then(Value::as_str).unwrap_or("");
        if i == 0 && role != "user" {
            return Err("A conversation must start with a user message. Try again with a conversation that starts with a user message.".to_owned());
        }
        if role != expected {
            return Err("A conversation must alternate between user and assistant roles. Make sure the conversation alternates between user and assistant roles and try again.".to_owned());
        }
        if m.get("content").and_then(Value::as_array).is_none_or(|c| c.is_empty()) {
            return Err(format!(
                "The content field in the Message object at messages.{i} is empty. Add a ContentBlock object to the content field and try again."
            ));
        }
        expected = if role == "user" { "assistant" } else { "user" };
    }
    if let Some(cfg) = body.get("inferenceConfig") {
        if cfg.get("maxTokens").and_then(Value::as_i64).is_some_and(|n| n < 1) {
            return Err("1 validation error detected: Value at 'inferenceConfig.maxTokens' failed to satisfy constraint: Member must have value greater than or equal to 1".to_owned());
        }
        for key in ["temperature", "topP"] {
            if cfg.get(key).and_then(Value::as_f64).is_some_and(|v| !(0.0..=1.0).contains(&v)) {
                return Err(format!(
                    "1 validation error detected: Value at 'inferenceConfig.{key}' failed to satisfy constraint: Member must have value less than or equal to 1"
                ));
            }
        }
    }
    let mut text = String::new();
    let mut cache_at = None;
    if let Some(system) = body.get("system").and_then(Value::as_array) {
        flatten(system, &mut text, &mut cache_at);
    }
    if let Some(tools) = body.pointer("/toolConfig/tools").and_then(Value::as_array) {
        for t in tools {
            if let Some(spec) = t.get("toolSpec") {
                text.push_str(&canonical(spec));
            } else if t.get("cachePoint").is_some() {
                cache_at = Some(text.len());
            }
        }
    }
    for m in messages {
        if let Some(content) = m.get("content").and_then(Value::as_array) {
            flatten(content, &mut text, &mut cache_at);
        }
    }
    Ok((text, cache_at))
}

/// Fills a JSON schema's properties with values of their types.
fn fill_schema(schema: &Value, seed: u64) -> Value {
    let mut out = Map::new();
    if let Some(props) = schema.get("properties").and_then(Value::as_object) {
        // In name order: the schema's own order depends on how the client serialized it.
        let mut props: Vec<(&String, &Value)> = props.iter().collect();
        props.sort_by(|a, b| a.0.cmp(b.0));
        for (i, (name, prop)) in props.into_iter().enumerate() {
            let n = seed.wrapping_add(i as u64);
            let v = match prop.get("type").and_then(Value::as_str) {
                Some("integer") => json!(n % 100),
                Some("number") => json!((n % 1000) as f64 / 10.0),
                Some("boolean") => json!(n.is_multiple_of(2)),
                Some("array") => json!([]),
                Some("object") => json!({}),
                _ => match prop.get("enum").and_then(Value::as_array).and_then(|e| e.first()) {
                    Some(first) => first.clone(),
                    None => json!(WORDS[(n % WORDS.len() as u64) as usize]),
                },
            };
            out.insert(name.clone(), v);
        }
    }
    Value::Object(out)
}

impl Endpoint {
    /// The model's answer to a validated request (records the cache prefix it writes).
    fn answer(&self, body: &Value, text: &str, cache_at: Option<usize>) -> Answer {
        let digest = Sha256::digest(text.as_bytes());
        let seed = u64::from_le_bytes([
            digest[0], digest[1], digest[2], digest[3], digest[4], digest[5], digest[6], digest[7],
        ]);
        let total_input = tokens_of(text).max(1);
        let mut usage = TokenUsage { input: total_input, ..TokenUsage::default() };
        if let Some(at) = cache_at.filter(|&at| at > 0) {
            let prefix: [u8; 32] = Sha256::digest(&text.as_bytes()[..at]).into();
            let cached = tokens_of(&text[..at]).min(total_input);
            let seen = self.cache.lock().map(|mut c| !c.insert(prefix)).unwrap_or(false);
            if seen {
                usage.cache_read = cached;
            } else {
                usage.cache_write = cached;
            }
            usage.input = total_input - cached;
        }
        let max_tokens = body.pointer("/inferenceConfig/maxTokens").and_then(Value::as_u64).unwrap_or(4096) as usize;
        let tools: Vec<&Value> = body
            .pointer("/toolConfig/tools")
            .and_then(Value::as_array)
            .map(|t| t.iter().filter_map(|t| t.get("toolSpec")).collect())
            .unwrap_or_default();
        let choice = body.pointer("/toolConfig/toolChoice");
        let last_user_text = body
            .get("messages")
            .and_then(Value::as_array)
            .and_then(|m| m.last())
            .and_then(|m| m.get("content"))
            .and_then(Value::as_array)
            .map(|c| c.iter().filter_map(|b| b.get("text").and_then(Value::as_str)).collect::<Vec<_>>().join(" "))
            .unwrap_or_default();
        let name_of = |t: &&Value| t.get("name").and_then(Value::as_str).unwrap_or("").to_owned();
        let called = match choice {
            Some(c) if c.get("tool").is_some() => {
                let wanted = c.pointer("/tool/name").and_then(Value::as_str).unwrap_or("");
                tools.iter().find(|t| name_of(t) == wanted).copied()
            }
            Some(c) if c.get("any").is_some() => {
                tools.iter().find(|t| last_user_text.contains(&name_of(t))).or(tools.first()).copied()
            }
            _ => tools.iter().find(|t| !name_of(t).is_empty() && last_user_text.contains(&name_of(t))).copied(),
        };
        if let Some(tool) = called {
            let input = fill_schema(tool.pointer("/inputSchema/json").unwrap_or(&Value::Null), seed);
            let id = format!("tooluse_{:016x}", seed);
            usage.output = tokens_of(&input.to_string()).max(1);
            return Answer {
                words: Vec::new(),
                tool: Some((id, name_of(&tool), input)),
                stop_reason: "tool_use",
                usage,
            };
        }
        let natural = 12 + (seed % 20) as usize;
        let stops: Vec<String> = body
            .pointer("/inferenceConfig/stopSequences")
            .and_then(Value::as_array)
            .map(|s| s.iter().filter_map(Value::as_str).map(str::to_owned).collect())
            .unwrap_or_default();
        let mut words = Vec::new();
        let mut so_far = String::new();
        let mut stop_reason = "end_turn";
        for i in 0..natural {
            if words.len() >= max_tokens {
                stop_reason = "max_tokens";
                break;
            }
            let w = WORDS[((seed >> (i % 8 * 8)).wrapping_add(i as u64 * 7) % WORDS.len() as u64) as usize];
            let token = if i == 0 { w.to_owned() } else { format!(" {w}") };
            let candidate = format!("{so_far}{token}");
            if let Some(at) = stops.iter().filter_map(|s| candidate.find(s.as_str())).min() {
                // The text ends before the stop sequence; the partial word is not sent.
                let kept = &candidate[so_far.len()..at.max(so_far.len())];
                if !kept.is_empty() {
                    words.push(kept.to_owned());
                }
                stop_reason = "stop_sequence";
                break;
            }
            so_far = candidate;
            words.push(token);
        }
        usage.output = words.len() as u32;
        Answer { words, tool: None, stop_reason, usage }
    }

    fn first_token_delay(&self, usage: &TokenUsage) -> Duration {
        let l = self.cfg.latency;
        self.scaled(l.first_token_ms + l.per_input_token_ms * f64::from(usage.input + usage.cache_write))
    }
}

impl Endpoint {
    /// Admits, validates and answers a Converse or ConverseStream request, logging it.
    fn generate(
        &self,
        operation: &'static str,
        model_id: &str,
        headers: &HeaderMap,
        body: &Bytes,
        streaming: bool,
    ) -> Result<(Answer, Drawn), Box<Response>> {
        let (value, drawn) = self.admit(operation, model_id, headers, body, streaming)?;
        match validate(&value) {
            Ok((text, cache_at)) => {
                let answer = self.answer(&value, &text, cache_at);
                self.log(operation, model_id, headers, value, 200, None);
                Ok((answer, drawn))
            }
            Err(message) => {
                self.log(operation, model_id, headers, value, 400, Some(BedrockError::Validation.code()));
                Err(Box::new(error_response(BedrockError::Validation, &message)))
            }
        }
    }
}

async fn converse(State(s): State<Shared>, Path(model_id): Path<String>, headers: HeaderMap, body: Bytes) -> Response {
    let started = Instant::now();
    let (answer, drawn) = match s.generate("Converse", &model_id, &headers, &body, false) {
        Ok(v) => v,
        Err(r) => return *r,
    };
    let total = drawn.extra_first_byte
        + s.first_token_delay(&answer.usage)
        + s.scaled(s.cfg.latency.per_output_token_ms * f64::from(answer.usage.output.saturating_sub(1)));
    tokio::select! {
        () = tokio::time::sleep(total) => {}
        () = s.stop.cancelled() => return StatusCode::SERVICE_UNAVAILABLE.into_response(),
    }
    let mut content = Vec::new();
    if !answer.words.is_empty() {
        content.push(json!({ "text": answer.words.concat() }));
    }
    if let Some((id, name, input)) = &answer.tool {
        content.push(json!({ "toolUse": { "toolUseId": id, "name": name, "input": input } }));
    }
    let out = json!({
        "output": { "message": { "role": "assistant", "content": content } },
        "stopReason": answer.stop_reason,
        "usage": answer.usage.json(),
        "metrics": { "latencyMs": started.elapsed().as_millis() as u64 },
    });
    let mut response = axum::Json(out).into_response();
    if let Ok(v) = uuid_like().parse() {
        response.headers_mut().insert("x-amzn-requestid", v);
    }
    response
}

/// One event-stream frame.
fn frame(event_type: &'static str, payload: &Value) -> Bytes {
    let message = Message::new(Bytes::from(payload.to_string()))
        .add_header(Header::new(":event-type", HeaderValue::String(event_type.into())))
        .add_header(Header::new(":content-type", HeaderValue::String("application/json".into())))
        .add_header(Header::new(":message-type", HeaderValue::String("event".into())));
    let mut buf = Vec::new();
    // Writing to a Vec fails only for headers or payloads beyond the format's limits, which
    // these small events never reach.
    let _ = aws_smithy_eventstream::frame::write_message_to(&message, &mut buf);
    Bytes::from(buf)
}

/// What the stream producer sends, in order, with the delay before each.
fn stream_plan(s: &Endpoint, answer: &Answer) -> Vec<(Duration, bool, Bytes)> {
    // (delay before, is a content delta, frame)
    let mut out = vec![(Duration::ZERO, false, frame("messageStart", &json!({ "role": "assistant" })))];
    let first = s.first_token_delay(&answer.usage);
    let gap = s.scaled(s.cfg.latency.per_output_token_ms);
    let mut block = 0u32;
    for (i, w) in answer.words.iter().enumerate() {
        let delay = if i == 0 { first } else { gap };
        out.push((delay, true, frame("contentBlockDelta", &json!({ "contentBlockIndex": 0, "delta": { "text": w } }))));
    }
    if !answer.words.is_empty() {
        out.push((Duration::ZERO, false, frame("contentBlockStop", &json!({ "contentBlockIndex": 0 }))));
        block = 1;
    }
    if let Some((id, name, input)) = &answer.tool {
        let delay = if answer.words.is_empty() { first } else { gap };
        out.push((
            delay,
            false,
            frame(
                "contentBlockStart",
                &json!({ "contentBlockIndex": block, "start": { "toolUse": { "toolUseId": id, "name": name } } }),
            ),
        ));
        let text = input.to_string();
        // The input streams as string fragments of its JSON text, split on char boundaries.
        let chars: Vec<char> = text.chars().collect();
        for chunk in chars.chunks(chars.len().div_ceil(3).max(1)) {
            let fragment: String = chunk.iter().collect();
            out.push((
                gap,
                true,
                frame(
                    "contentBlockDelta",
                    &json!({ "contentBlockIndex": block, "delta": { "toolUse": { "input": fragment } } }),
                ),
            ));
        }
        out.push((Duration::ZERO, false, frame("contentBlockStop", &json!({ "contentBlockIndex": block }))));
    }
    out.push((Duration::ZERO, false, frame("messageStop", &json!({ "stopReason": answer.stop_reason }))));
    out
}

async fn converse_stream(
    State(s): State<Shared>,
    Path(model_id): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let started = Instant::now();
    let (answer, drawn) = match s.generate("ConverseStream", &model_id, &headers, &body, true) {
        Ok(v) => v,
        Err(r) => return *r,
    };
    if !drawn.extra_first_byte.is_zero() {
        tokio::select! {
            () = tokio::time::sleep(drawn.extra_first_byte) => {}
            () = s.stop.cancelled() => return StatusCode::SERVICE_UNAVAILABLE.into_response(),
        }
    }
    let plan = stream_plan(&s, &answer);
    let usage = answer.usage;
    let stop = s.stop.clone();
    let cut_after = drawn.cut_after;
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(16);
    // The producer ends when the plan is sent, the client goes away (send fails) or the
    // endpoint stops.
    tokio::spawn(async move {
        let mut deltas = 0u32;
        for (delay, is_delta, bytes) in plan {
            if is_delta && cut_after.is_some_and(|n| deltas >= n) {
                let _ = tx.send(Err(std::io::Error::other("stream cut (fault)"))).await;
                return;
            }
            if !delay.is_zero() {
                tokio::select! {
                    () = tokio::time::sleep(delay) => {}
                    () = stop.cancelled() => return,
                }
            }
            if tx.send(Ok(bytes)).await.is_err() {
                return;
            }
            deltas += u32::from(is_delta);
        }
        if cut_after.is_some() {
            let _ = tx.send(Err(std::io::Error::other("stream cut (fault)"))).await;
            return;
        }
        let metadata =
            json!({ "usage": usage.json(), "metrics": { "latencyMs": started.elapsed().as_millis() as u64 } });
        let _ = tx.send(Ok(frame("metadata", &metadata))).await;
    });
    let body = Body::from_stream(tokio_stream::wrappers::ReceiverStream::new(rx));
    let mut response = Response::new(body);
    let h = response.headers_mut();
    h.insert(header::CONTENT_TYPE, header::HeaderValue::from_static("application/vnd.amazon.eventstream"));
    h.insert("x-amzn-bedrock-content-type", header::HeaderValue::from_static("application/json"));
    if let Ok(v) = uuid_like().parse() {
        h.insert("x-amzn-requestid", v);
    }
    response
}

async fn count_tokens(
    State(s): State<Shared>,
    Path(model_id): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let (value, _) = match s.admit("CountTokens", &model_id, &headers, &body, false) {
        Ok(v) => v,
        Err(r) => return *r,
    };
    let Some(converse) = value.pointer("/input/converse") else {
        s.log("CountTokens", &model_id, &headers, value, 400, Some(BedrockError::Validation.code()));
        return error_response(BedrockError::Validation, "The input must contain a converse request.");
    };
    match validate(converse) {
        Ok((text, _)) => {
            let n = tokens_of(&text).max(1);
            s.log("CountTokens", &model_id, &headers, value, 200, None);
            axum::Json(json!({ "inputTokens": n })).into_response()
        }
        Err(message) => {
            s.log("CountTokens", &model_id, &headers, value, 400, Some(BedrockError::Validation.code()));
            error_response(BedrockError::Validation, &message)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn endpoint() -> Endpoint {
        Endpoint {
            cfg: BedrockConfig::default(),
            log: Mutex::new(Vec::new()),
            armed: Mutex::new(Armed::default()),
            cache: Mutex::new(HashSet::new()),
            seq: AtomicU64::new(0),
            stop: CancellationToken::new(),
        }
    }

    fn user(text: &str) -> Value {
        json!({ "role": "user", "content": [{ "text": text }] })
    }

    #[test]
    fn conversations_are_validated_like_the_service() {
        assert!(validate(&json!({})).is_err_and(|m| m.contains("start with a user message")));
        let two_users = json!({ "messages": [user("a"), user("b")] });
        assert!(validate(&two_users).is_err_and(|m| m.contains("alternate")));
        let bad_max = json!({ "messages": [user("a")], "inferenceConfig": { "maxTokens": 0 } });
        assert!(validate(&bad_max).is_err_and(|m| m.contains("maxTokens")));
        assert!(validate(&json!({ "messages": [user("hello")] })).is_ok());
    }

    #[test]
    fn the_answer_is_deterministic_and_honours_max_tokens_and_stop_sequences() {
        let e = endpoint();
        let body = json!({ "messages": [user("tell me about routing")] });
        let (text, at) = validate(&body).unwrap_or_default();
        let a = e.answer(&body, &text, at);
        assert_eq!(a, e.answer(&body, &text, at));
        assert_eq!(a.stop_reason, "end_turn");
        assert_eq!(a.usage.output as usize, a.words.len());
        let limited = json!({ "messages": [user("tell me about routing")], "inferenceConfig": { "maxTokens": 3 } });
        let b = e.answer(&limited, &text, at);
        assert_eq!((b.words.len(), b.stop_reason), (3, "max_tokens"));
        let stop_word = a.words[4].trim().to_owned();
        let stopped =
            json!({ "messages": [user("tell me about routing")], "inferenceConfig": { "stopSequences": [stop_word] } });
        let c = e.answer(&stopped, &text, at);
        assert_eq!(c.stop_reason, "stop_sequence");
        assert!(!c.words.concat().contains(&stop_word), "{:?}", c.words);
    }

    #[test]
    fn a_cache_point_writes_once_then_reads() {
        let e = endpoint();
        let body = json!({
            "system": [{ "text": "a long shared system prompt ".repeat(20) }, { "cachePoint": { "type": "default" } }],
            "messages": [user("question one")],
        });
        let (text, at) = validate(&body).unwrap_or_default();
        let first = e.answer(&body, &text, at);
        assert!(first.usage.cache_write > 100 && first.usage.cache_read == 0, "{:?}", first.usage);
        let second = e.answer(&body, &text, at);
        assert_eq!((second.usage.cache_read, second.usage.cache_write), (first.usage.cache_write, 0));
        assert_eq!(second.usage.input, first.usage.input);
    }

    #[test]
    fn a_forced_tool_is_called_with_its_schema_filled() {
        let e = endpoint();
        let body = json!({
            "messages": [user("what is the weather")],
            "toolConfig": {
                "tools": [{ "toolSpec": { "name": "get_weather", "inputSchema": { "json": {
                    "type": "object", "properties": { "city": { "type": "string" }, "days": { "type": "integer" } } } } } }],
                "toolChoice": { "any": {} },
            },
        });
        let (text, at) = validate(&body).unwrap_or_default();
        let a = e.answer(&body, &text, at);
        let (_, name, input) = a.tool.unwrap_or_default();
        assert_eq!((name.as_str(), a.stop_reason), ("get_weather", "tool_use"));
        assert!(input["city"].is_string() && input["days"].is_u64(), "{input}");
    }

    #[test]
    fn faults_are_drawn_by_count_and_cut_only_streams() {
        let mut armed =
            Armed { throttle: 1, cut_streams: CutStreams { count: 1, after_deltas: 2 }, ..Armed::default() };
        assert_eq!(armed.draw(true).error, Some(BedrockError::Throttling));
        assert!(armed.draw(true).error.is_none());
        assert_eq!(armed.cut_streams.count, 0, "the second stream took the cut");
        let mut armed = Armed { cut_streams: CutStreams { count: 1, after_deltas: 2 }, ..Armed::default() };
        assert_eq!(armed.draw(false).cut_after, None);
        assert_eq!(armed.draw(true).cut_after, Some(2));
    }

    #[test]
    fn frames_decode_with_the_sdk_reader() {
        let bytes = frame("messageStart", &json!({ "role": "assistant" }));
        let message = aws_smithy_eventstream::frame::read_message_from(bytes);
        let message = message.ok();
        let event_type = message.as_ref().and_then(|m| {
            m.headers()
                .iter()
                .find(|h| h.name().as_str() == ":event-type")
                .and_then(|h| h.value().as_string().ok())
                .map(|s| s.as_str().to_owned())
        });
        assert_eq!(event_type.as_deref(), Some("messageStart"));
    }
}
