//! The front door: routes for both dialects over one request path, and the HTTP server with
//! its timeouts and graceful drain.
//!
//! One request: admission (before the body is read) → body read with size and time bounds →
//! parse (large bodies on the CPU pool) → authenticate → `Backend::route` (plan and book) →
//! [`crate::relay`] → the response in the caller's dialect. Errors from any stage are rendered
//! once, here. One `request` span covers the request from edge to upstream.
//!
//! Shutdown: [`serve`] stops accepting, lets in-flight requests finish until the drain
//! deadline, then ends the remaining streams with an explicit error event and returns.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use serde_json::{Map, Value, json};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::admission::{Admission, CpuPool};
use crate::backend::Backend;
use crate::error::{ErrorKind, GatewayError};
use crate::relay::{Api, RelayLimits, relay};
use crate::request::{Dialect, InferenceRequest, new_request_id};
use crate::{anthropic, openai};

/// Bodies larger than this are parsed on the CPU pool instead of an async thread.
const INLINE_PARSE_BYTES: usize = 64 * 1024;

/// Limits of the front door.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Largest request body.
    pub max_body_bytes: usize,
    /// Time for the client to send its whole body.
    pub body_read: Duration,
    /// Upstream and stream limits.
    pub relay: RelayLimits,
    /// Requests in flight at most.
    pub max_concurrent: usize,
    /// `Retry-After` for refused requests.
    pub retry_after: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_body_bytes: 32 * 1024 * 1024,
            body_read: Duration::from_secs(30),
            relay: RelayLimits::default(),
            max_concurrent: 1024,
            retry_after: Duration::from_secs(1),
        }
    }
}

/// A front door over a backend.
pub struct FrontDoor<B> {
    /// The deployable's side.
    pub backend: B,
    /// Concurrency bound.
    pub admission: Admission,
    /// CPU pool for parsing (the backend may share it for tokenization).
    pub cpu: CpuPool,
    /// Limits.
    pub limits: Limits,
    /// Cancelled when the drain deadline passes: remaining streams end with an error.
    pub expired: CancellationToken,
}

impl<B: Backend> FrontDoor<B> {
    /// A front door with `limits`.
    pub fn new(backend: B, cpu: CpuPool, limits: Limits) -> FrontDoor<B> {
        FrontDoor {
            backend,
            admission: Admission::new(limits.max_concurrent, limits.retry_after),
            cpu,
            limits,
            expired: CancellationToken::new(),
        }
    }
}

/// The API routes: OpenAI, Anthropic and liveness.
pub fn api_router<B: Backend>(fd: Arc<FrontDoor<B>>) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(|s, h, b| handle(s, h, b, Endpoint::Generate(Api::Chat))))
        .route("/v1/completions", post(|s, h, b| handle(s, h, b, Endpoint::Generate(Api::Completions))))
        .route("/v1/messages", post(|s, h, b| handle(s, h, b, Endpoint::Generate(Api::Messages))))
        .route("/v1/messages/count_tokens", post(|s, h, b| handle(s, h, b, Endpoint::CountTokens)))
        .route("/v1/models", get(models::<B>))
        .route("/readyz", get(readyz::<B>))
        .route("/healthz", get(|| async { StatusCode::OK }))
        // vLLM-compatible liveness path (load generators and peer routers probe it).
        .route("/health", get(|| async { StatusCode::OK }))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(fd)
}

async fn not_found(headers: HeaderMap) -> Response {
    let dialect = if headers.contains_key("anthropic-version") { Dialect::Anthropic } else { Dialect::OpenAi };
    let r = GatewayError::new(ErrorKind::NotFound, "not_found", "no such endpoint").into_response_for(dialect, None);
    closing_if_body_unread(&headers, r)
}

/// A fallback answers without reading the request's body; when one may follow the head, hyper
/// closes the connection after the answer, so the answer says so (a pooled client would
/// otherwise lose its next request on the closed connection).
fn closing_if_body_unread(headers: &HeaderMap, mut response: Response) -> Response {
    let declared_empty =
        headers.get(axum::http::header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).is_some_and(|v| v.trim() == "0");
    let may_have_body = headers.contains_key(axum::http::header::TRANSFER_ENCODING)
        || (headers.contains_key(axum::http::header::CONTENT_LENGTH) && !declared_empty);
    if may_have_body {
        response.headers_mut().insert(axum::http::header::CONNECTION, axum::http::HeaderValue::from_static("close"));
    }
    response
}

async fn method_not_allowed(headers: HeaderMap) -> Response {
    let dialect = if headers.contains_key("anthropic-version") { Dialect::Anthropic } else { Dialect::OpenAi };
    let mut e =
        GatewayError::new(ErrorKind::InvalidRequest, "method_not_allowed", "method not allowed on this endpoint");
    e.param = None;
    let mut r = e.into_response_for(dialect, None);
    *r.status_mut() = StatusCode::METHOD_NOT_ALLOWED;
    closing_if_body_unread(&headers, r)
}

async fn readyz<B: Backend>(State(fd): State<Arc<FrontDoor<B>>>) -> Response {
    if fd.backend.ready() {
        (StatusCode::OK, "ready").into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready").into_response()
    }
}

async fn models<B: Backend>(State(fd): State<Arc<FrontDoor<B>>>) -> Response {
    axum::Json(openai::models_json(&fd.backend.models())).into_response()
}

#[derive(Debug, Clone, Copy)]
enum Endpoint {
    Generate(Api),
    CountTokens,
}

impl Endpoint {
    fn dialect(self) -> Dialect {
        match self {
            Endpoint::Generate(api) => api.dialect(),
            Endpoint::CountTokens => Dialect::Anthropic,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Endpoint::Generate(Api::Chat) => "chat",
            Endpoint::Generate(Api::Completions) => "completions",
            Endpoint::Generate(Api::Messages) => "messages",
            Endpoint::CountTokens => "count_tokens",
        }
    }
}

async fn handle<B: Backend>(
    State(fd): State<Arc<FrontDoor<B>>>,
    headers: HeaderMap,
    body: Body,
    ep: Endpoint,
) -> Response {
    let dialect = ep.dialect();
    let id = new_request_id();
    let span = tracing::info_span!("request", %id, endpoint = ep.name(), model = tracing::field::Empty,
                                   target = tracing::field::Empty);
    // Set once the whole body has been read: an answer given before that leaves unread bytes on
    // the connection, so it must say `Connection: close` (hyper closes it after answering).
    let mut body_read = false;
    let response = async {
        let permit = fd.admission.try_admit()?;
        check_declared_length(&fd, &headers)?;
        let bytes = read_body(&fd, body).await?;
        body_read = true;
        let mut req = parse(&fd, ep, &headers, bytes).await?;
        req.id = id.clone();
        tracing::Span::current().record("model", req.model.as_str());
        req.tenant = fd.backend.authenticate(&headers)?;
        apply_routing_headers(&mut req, &headers);
        let req = Arc::new(req);
        match ep {
            Endpoint::CountTokens => {
                let n = fd.backend.count_tokens(req).await?;
                Ok(axum::Json(json!({"input_tokens": n})).into_response())
            }
            Endpoint::Generate(api) => {
                let routed = fd.backend.route(req.clone()).await?;
                relay(req, api, routed, fd.limits.relay, fd.expired.clone(), permit).await
            }
        }
    }
    .instrument(span)
    .await;
    let mut response = response.unwrap_or_else(|e: GatewayError| e.into_response_for(dialect, Some(&id)));
    if !body_read {
        response.headers_mut().insert(axum::http::header::CONNECTION, axum::http::HeaderValue::from_static("close"));
    }
    fd.backend.record(ep.name(), response.status().as_u16());
    response
}

/// Refuses a body whose declared length is over the limit before reading any of it.
fn check_declared_length<B: Backend>(fd: &FrontDoor<B>, headers: &HeaderMap) -> Result<(), GatewayError> {
    let declared = headers
        .get(axum::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    match declared {
        Some(n) if n > fd.limits.max_body_bytes as u64 => Err(GatewayError::new(
            ErrorKind::PayloadTooLarge,
            "body_too_large",
            format!("the request body exceeds {} bytes", fd.limits.max_body_bytes),
        )),
        _ => Ok(()),
    }
}

async fn read_body<B: Backend>(fd: &FrontDoor<B>, body: Body) -> Result<axum::body::Bytes, GatewayError> {
    let max = fd.limits.max_body_bytes;
    match tokio::time::timeout(fd.limits.body_read, axum::body::to_bytes(body, max)).await {
        Err(_) => Err(GatewayError::new(
            ErrorKind::RequestTimeout,
            "body_timeout",
            format!("the request body was not received within {} s", fd.limits.body_read.as_secs()),
        )),
        Ok(Err(e)) => {
            // An over-limit body shows up as http-body-util's length-limit error in the chain;
            // anything else is the connection failing mid-body.
            let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(&e);
            while let Some(c) = cause {
                if c.is::<http_body_util::LengthLimitError>() {
                    return Err(GatewayError::new(
                        ErrorKind::PayloadTooLarge,
                        "body_too_large",
                        format!("the request body exceeds {max} bytes"),
                    ));
                }
                cause = c.source();
            }
            Err(GatewayError::invalid(format!("the request body could not be read: {e}")))
        }
        Ok(Ok(b)) => Ok(b),
    }
}

fn parse_bytes(ep: Endpoint, version: Option<String>, bytes: &[u8]) -> Result<InferenceRequest, GatewayError> {
    let body: Map<String, Value> = match serde_json::from_slice(bytes) {
        Ok(Value::Object(m)) => m,
        Ok(_) => return Err(GatewayError::invalid("the request body must be a JSON object")),
        Err(e) => return Err(GatewayError::invalid(format!("the request body is not valid JSON: {e}"))),
    };
    match ep {
        Endpoint::Generate(Api::Chat) => openai::parse(openai::Endpoint::Chat, body),
        Endpoint::Generate(Api::Completions) => openai::parse(openai::Endpoint::Completions, body),
        Endpoint::Generate(Api::Messages) | Endpoint::CountTokens => {
            let version = anthropic::check_version(version.as_deref())?;
            let which = if matches!(ep, Endpoint::CountTokens) {
                anthropic::Endpoint::CountTokens
            } else {
                anthropic::Endpoint::Messages
            };
            anthropic::parse(which, version, body)
        }
    }
}

async fn parse<B: Backend>(
    fd: &FrontDoor<B>,
    ep: Endpoint,
    headers: &HeaderMap,
    bytes: axum::body::Bytes,
) -> Result<InferenceRequest, GatewayError> {
    let version = match headers.get("anthropic-version") {
        None => None,
        Some(v) => Some(
            v.to_str().map_err(|_| GatewayError::invalid("the anthropic-version header is not valid text"))?.to_owned(),
        ),
    };
    if bytes.len() <= INLINE_PARSE_BYTES {
        return parse_bytes(ep, version, &bytes);
    }
    fd.cpu.run(move || parse_bytes(ep, version, &bytes)).await?
}

/// Class and tags from the caller's routing headers (classifiers will add to them).
fn apply_routing_headers(req: &mut InferenceRequest, headers: &HeaderMap) {
    let get = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).map(str::trim).filter(|s| !s.is_empty());
    if let Some(tags) = get(TAGS_HEADER) {
        req.tags.extend(tags.split(',').map(|s| s.trim().to_owned()).filter(|s| !s.is_empty()));
    }
    if get(CLASS_HEADER) == Some("batch") {
        req.class = switchyard_core::request::RequestClass::Batch;
    }
    if let Some(set) = get(WORKER_SET_HEADER) {
        req.worker_set = Some(set.to_owned());
    }
    if let Some(id) = get(HUB_REQUEST_HEADER).filter(|id| id.len() <= MAX_HUB_REQUEST_ID) {
        req.hub_request_id = Some(id.to_owned());
    }
}

/// The hub's request id on a request it forwards to a spoke.
pub const HUB_REQUEST_HEADER: &str = "x-switchyard-hub-request";
/// Longest hub request id taken from the header (ids are 32 hex digits).
const MAX_HUB_REQUEST_ID: usize = 128;

/// The header that pins a request to one worker set (what the hub sends a spoke).
pub const WORKER_SET_HEADER: &str = "x-switchyard-worker-set";
/// Comma-separated request tags (`pii`, ...).
pub const TAGS_HEADER: &str = "x-switchyard-tags";
/// `batch` marks a batch-class request.
pub const CLASS_HEADER: &str = "x-switchyard-class";

/// Server settings.
#[derive(Debug, Clone, Copy)]
pub struct ServeConfig {
    /// Time for a client to send its request headers.
    pub header_read: Duration,
    /// How long in-flight requests may run after shutdown begins.
    pub drain: Duration,
}

impl Default for ServeConfig {
    fn default() -> Self {
        ServeConfig { header_read: Duration::from_secs(10), drain: Duration::from_secs(30) }
    }
}

/// Serves `router` on `listener` until `shutdown` is cancelled, then drains: no new
/// connections, in-flight requests run until `cfg.drain`, then `expired` is cancelled (streams
/// end with an error event) and remaining connections are closed.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    cfg: ServeConfig,
    shutdown: CancellationToken,
    expired: CancellationToken,
) {
    // HTTP/1 (what the OpenAI and Anthropic SDKs speak): hyper-util's auto builder sniffs for
    // an HTTP/2 preface with no timeout, so a client that sends part of one holds a connection
    // forever; hyper's HTTP/1 builder puts the header-read timeout on every byte it waits for.
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder.timer(TokioTimer::new()).header_read_timeout(cfg.header_read).keep_alive(true);
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let mut connections = tokio::task::JoinSet::new();
    loop {
        let accepted = tokio::select! {
            () = shutdown.cancelled() => break,
            accepted = listener.accept() => accepted,
            // Reap finished connection tasks so the set does not grow.
            Some(_) = connections.join_next(), if !connections.is_empty() => continue,
        };
        let (tcp, peer): (tokio::net::TcpStream, SocketAddr) = match accepted {
            Ok(a) => a,
            Err(e) => {
                // Out of file descriptors and the like: back off instead of spinning.
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        // Token-by-token streaming writes small frames; without TCP_NODELAY, Nagle's algorithm
        // holds them back until the peer's delayed ACK (~40 ms on Linux).
        let _ = tcp.set_nodelay(true);
        let service = TowerToHyperService::new(router.clone());
        let builder = builder.clone();
        let watcher = graceful.watcher();
        let header_read = cfg.header_read;
        connections.spawn(async move {
            // hyper's header-read timer starts with a request's first byte; a connection that
            // sends nothing at all is closed here instead of being held open forever.
            let mut first = [0u8; 1];
            match tokio::time::timeout(header_read, tcp.peek(&mut first)).await {
                Ok(Ok(n)) if n > 0 => {}
                _ => return,
            }
            let conn = builder.serve_connection(TokioIo::new(tcp), service);
            if let Err(e) = watcher.watch(conn).await {
                tracing::debug!(%peer, error = %e, "connection ended with an error");
            }
        });
    }
    drop(listener);
    let started = Instant::now();
    tokio::select! {
        () = graceful.shutdown() => {}
        () = tokio::time::sleep(cfg.drain) => {
            tracing::warn!("drain deadline reached; ending the remaining streams");
            expired.cancel();
            // Let the error events reach the clients before closing.
            let _ = tokio::time::timeout(Duration::from_secs(2), async {
                while connections.join_next().await.is_some() {}
            })
            .await;
        }
    }
    connections.abort_all();
    while connections.join_next().await.is_some() {}
    tracing::info!(drained_in_ms = started.elapsed().as_millis() as u64, "server stopped");
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request::{Dialect, Prompt, TextPrompt};

    fn routed(headers: &[(&str, &str)]) -> InferenceRequest {
        let mut map = HeaderMap::new();
        for (k, v) in headers {
            map.insert(axum::http::HeaderName::from_bytes(k.as_bytes()).expect("name"), v.parse().expect("value"));
        }
        let mut req = InferenceRequest::new(Dialect::OpenAi, "m", Prompt::Text(TextPrompt::Tokens(Vec::new())));
        apply_routing_headers(&mut req, &map);
        req
    }

    #[test]
    fn routing_headers_set_class_tags_worker_set_and_the_hubs_request_id_within_bounds() {
        let req = routed(&[
            (TAGS_HEADER, "pii, eu ,"),
            (CLASS_HEADER, "batch"),
            (WORKER_SET_HEADER, "east-set"),
            (HUB_REQUEST_HEADER, "0123abcd"),
        ]);
        assert_eq!(req.tags.iter().map(String::as_str).collect::<Vec<_>>(), ["eu", "pii"]);
        assert_eq!(req.class, switchyard_core::request::RequestClass::Batch);
        assert_eq!(req.worker_set.as_deref(), Some("east-set"));
        assert_eq!(req.hub_request_id.as_deref(), Some("0123abcd"));
        let long = "x".repeat(MAX_HUB_REQUEST_ID + 1);
        assert_eq!(routed(&[(HUB_REQUEST_HEADER, &long)]).hub_request_id, None, "an oversized id is ignored");
        assert_eq!(routed(&[]).hub_request_id, None);
    }
}
