//! The relay: sends a planned request to its targets in order and carries the typed events
//! back, rendered in the caller's dialect.
//!
//! Invariants:
//! - only a connect failure or a provider's refusal before any work
//!   ([`SendError::Unavailable`]) moves on to the next target; any other failure is final (the
//!   request may already be running upstream); when every target refused, the last refusal
//!   is the answer;
//! - every dispatch ends exactly once with its outcome (observers, booking release), also when
//!   the client goes away: the stream's producer task is owned by the response body and
//!   aborted with it, which drops the upstream request and cancels it in the engine;
//! - a stream that the upstream cuts short, stalls past the idle timeout, or that the server
//!   ends while draining, ends with an explicit error event in the caller's dialect, never
//!   as a normal end;
//! - no per-event work grows with the prompt: events are rendered as they arrive.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures::{FutureExt, StreamExt};
use tokio_util::sync::CancellationToken;

use crate::admission::Permit;
use crate::anthropic;
use crate::backend::Routed;
use crate::error::{ErrorKind, GatewayError};
use crate::event::{Collected, Event};
use crate::observe::{DispatchGuard, Outcome};
use crate::openai;
use crate::request::{Dialect, InferenceRequest};
use crate::upstream::{EventStream, SendError, UpstreamTimeouts};

/// Which front-door endpoint a request came in on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    /// OpenAI chat completions.
    Chat,
    /// OpenAI completions.
    Completions,
    /// Anthropic messages.
    Messages,
}

impl Api {
    /// The dialect of this endpoint.
    pub fn dialect(self) -> Dialect {
        match self {
            Api::Chat | Api::Completions => Dialect::OpenAi,
            Api::Messages => Dialect::Anthropic,
        }
    }
}

/// Time limits of the relay.
#[derive(Debug, Clone, Copy)]
pub struct RelayLimits {
    /// Upstream first byte and idle timeouts.
    pub timeouts: UpstreamTimeouts,
    /// Keep-alive `ping` interval on quiet Anthropic streams.
    pub ping_interval: Duration,
}

impl Default for RelayLimits {
    fn default() -> Self {
        RelayLimits { timeouts: UpstreamTimeouts::default(), ping_interval: Duration::from_secs(10) }
    }
}

/// A write carries at most about this many bytes of events that were ready together.
const COALESCE_BYTES: usize = 16 * 1024;

fn unix_now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

/// Sends `req` to the first reachable target and answers the client.
pub async fn relay(
    req: Arc<InferenceRequest>,
    api: Api,
    routed: Routed,
    limits: RelayLimits,
    expired: CancellationToken,
    permit: Permit,
) -> Result<Response, GatewayError> {
    let Routed { targets, prompt_tokens, headers } = routed;
    let mut unreachable = 0usize;
    let mut refused: Option<GatewayError> = None;
    for (attempt, target) in targets.iter().enumerate() {
        let mut dispatch = DispatchGuard(Some(target.dispatch(attempt)));
        let started = Instant::now();
        let sent = tokio::time::timeout(limits.timeouts.first_byte, target.upstream().answer(&req)).await;
        let (stream, choice) = match sent {
            Ok(Ok(answer)) => (answer.events, answer.headers),
            Ok(Err(SendError::Connect(reason))) => {
                tracing::warn!(target = target.label(), %reason, "target unreachable; trying the next one");
                dispatch.end(Outcome::ConnectFailed);
                unreachable += 1;
                continue;
            }
            Ok(Err(SendError::Unavailable(e))) => {
                tracing::warn!(target = target.label(), reason = %e.message, "target refused; trying the next one");
                dispatch.end(Outcome::ConnectFailed);
                refused = Some(e);
                continue;
            }
            Ok(Err(SendError::Failed(e))) => {
                dispatch.end(Outcome::Failed);
                return Err(e);
            }
            Err(_) => {
                dispatch.end(Outcome::Failed);
                return Err(GatewayError::new(
                    ErrorKind::UpstreamTimeout,
                    "upstream_timeout",
                    "the upstream did not answer in time",
                ));
            }
        };
        tracing::Span::current().record("target", target.label());
        let request_id = HeaderValue::from_str(&req.id).ok();
        let target_label = HeaderValue::from_str(target.label()).ok();
        let provider = target.provider().and_then(|p| HeaderValue::from_str(p).ok());
        let pump = Pump {
            stream,
            dispatch,
            started,
            first: true,
            content_events: 0,
            finished: false,
            last_event: tokio::time::Instant::now(),
            limits,
            expired,
        };
        let mut response = if req.stream {
            stream_response(req, api, pump, prompt_tokens.unwrap_or(0), permit)
        } else {
            collected_response(&req, api, pump).await?
        };
        response.headers_mut().extend(headers);
        response.headers_mut().extend(choice);
        if let Some(v) = request_id {
            response.headers_mut().insert("request-id", v);
        }
        if let Some(v) = target_label {
            response.headers_mut().insert("x-switchyard-target", v);
        }
        if let Some(v) = provider {
            response.headers_mut().insert("x-switchyard-provider", v);
        }
        return Ok(response);
    }
    if let Some(e) = refused {
        return Err(e);
    }
    Err(GatewayError::new(
        ErrorKind::NoCapacity,
        "no_target_reachable",
        if unreachable == 0 { "no target is available for this request" } else { "no target could be reached" },
    ))
}

/// What the pump yields.
enum Step {
    Event(Event),
    Ping,
    Done,
    Failed(GatewayError),
}

/// Reads one upstream stream with its timeouts, feeding the dispatch's observers.
struct Pump {
    stream: EventStream,
    dispatch: DispatchGuard,
    started: Instant,
    first: bool,
    /// Content events so far (the progress observers are told of).
    content_events: u32,
    finished: bool,
    /// When the last event arrived (pings do not reset the idle timeout).
    last_event: tokio::time::Instant,
    limits: RelayLimits,
    expired: CancellationToken,
}

impl Pump {
    /// The next step, waiting for it (with the idle timeout, pings and the drain deadline).
    async fn next(&mut self, ping: bool) -> Step {
        // Fast path: an event that is already there costs no timer and no wake-up.
        if let Some(item) = self.stream.next().now_or_never() {
            return self.on_item(item);
        }
        let idle_deadline = self.last_event + self.limits.timeouts.idle;
        let wait = if ping {
            idle_deadline.min(tokio::time::Instant::now() + self.limits.ping_interval)
        } else {
            idle_deadline
        };
        let next = tokio::select! {
            biased;
            () = self.expired.cancelled() => {
                self.dispatch.end(Outcome::Cancelled);
                return Step::Failed(GatewayError::new(ErrorKind::Overloaded, "shutting_down",
                    "the server is shutting down; the response was ended"));
            }
            next = tokio::time::timeout_at(wait, self.stream.next()) => next,
        };
        match next {
            Err(_) if tokio::time::Instant::now() < idle_deadline => Step::Ping,
            Err(_) => {
                self.dispatch.end(Outcome::Failed);
                Step::Failed(GatewayError::new(
                    ErrorKind::UpstreamTimeout,
                    "upstream_idle",
                    "the upstream stopped sending",
                ))
            }
            Ok(item) => self.on_item(item),
        }
    }

    /// A step that is ready now, if any (events the upstream delivered together are rendered
    /// into one write).
    fn ready(&mut self) -> Option<Step> {
        if self.expired.is_cancelled() {
            return None;
        }
        self.stream.next().now_or_never().map(|item| self.on_item(item))
    }

    fn on_item(&mut self, item: Option<Result<Event, GatewayError>>) -> Step {
        match item {
            None if self.finished => {
                self.dispatch.end(Outcome::Completed);
                Step::Done
            }
            None => {
                self.dispatch.end(Outcome::Failed);
                Step::Failed(GatewayError::upstream("the upstream ended the stream before completion"))
            }
            Some(Err(e)) => {
                self.dispatch.end(Outcome::Failed);
                Step::Failed(e)
            }
            Some(Ok(event)) => {
                self.last_event = tokio::time::Instant::now();
                if let Some(d) = self.dispatch.get() {
                    match &event {
                        Event::Usage(u) => d.usage(u),
                        _ if self.first => {
                            self.first = false;
                            self.content_events = 1;
                            d.first_token(self.started.elapsed());
                        }
                        Event::Text(_) | Event::ToolCall { .. } => {
                            self.content_events += 1;
                            d.progress(self.content_events);
                        }
                        Event::Finish(_) => {}
                    }
                }
                if matches!(event, Event::Finish(_)) {
                    self.finished = true;
                }
                Step::Event(event)
            }
        }
    }
}

async fn collected_response(req: &InferenceRequest, api: Api, mut pump: Pump) -> Result<Response, GatewayError> {
    let mut c = Collected::default();
    loop {
        match pump.next(false).await {
            Step::Event(e) => c.push(e),
            Step::Ping => {}
            Step::Done => break,
            Step::Failed(e) => return Err(e),
        }
    }
    let created = unix_now();
    let body = match api {
        Api::Chat => openai::render_collected(openai::Endpoint::Chat, req, created, &c),
        Api::Completions => openai::render_collected(openai::Endpoint::Completions, req, created, &c),
        Api::Messages => anthropic::render_collected(req, &c),
    };
    Ok((StatusCode::OK, axum::Json(body)).into_response())
}

enum Renderer {
    OpenAi(openai::StreamRenderer),
    Anthropic(anthropic::StreamRenderer),
}

impl Renderer {
    fn event(&mut self, e: &Event, out: &mut String) {
        match self {
            Renderer::OpenAi(r) => r.event(e, out),
            Renderer::Anthropic(r) => r.event(e, out),
        }
    }

    fn finish(&mut self, out: &mut String) {
        match self {
            Renderer::OpenAi(r) => r.finish(out),
            Renderer::Anthropic(r) => r.finish(out),
        }
    }
}

fn stream_response(
    req: Arc<InferenceRequest>,
    api: Api,
    mut pump: Pump,
    prompt_tokens: u32,
    permit: Permit,
) -> Response {
    let dialect = api.dialect();
    let mut renderer = match api {
        Api::Chat => Renderer::OpenAi(openai::StreamRenderer::new(openai::Endpoint::Chat, &req, unix_now())),
        Api::Completions => {
            Renderer::OpenAi(openai::StreamRenderer::new(openai::Endpoint::Completions, &req, unix_now()))
        }
        Api::Messages => Renderer::Anthropic(anthropic::StreamRenderer::new(&req, prompt_tokens)),
    };
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::convert::Infallible>>(32);
    let task = tokio::spawn(async move {
        // The permit counts this stream against the concurrency bound until it ends.
        let _permit = permit;
        let mut out = String::new();
        if let Renderer::Anthropic(r) = &mut renderer {
            r.start(&mut out);
        }
        let mut step = Some(pump.next(dialect == Dialect::Anthropic).await);
        loop {
            let mut ended = false;
            // Render the awaited step and every step that is ready right behind it into one write.
            while let Some(s) = step.take() {
                ended = match s {
                    Step::Event(e) => {
                        renderer.event(&e, &mut out);
                        false
                    }
                    Step::Ping => {
                        anthropic::StreamRenderer::ping(&mut out);
                        false
                    }
                    Step::Done => {
                        renderer.finish(&mut out);
                        true
                    }
                    Step::Failed(e) => {
                        tracing::warn!(error = %e, "stream ended with an error");
                        out.push_str(&e.sse_event(dialect));
                        true
                    }
                };
                if ended || out.len() >= COALESCE_BYTES {
                    break;
                }
                step = pump.ready();
            }
            if !out.is_empty() && tx.send(Ok(Bytes::from(std::mem::take(&mut out)))).await.is_err() {
                // The client went away; dropping the pump cancels the upstream request.
                return;
            }
            if ended {
                return;
            }
            step = Some(pump.next(dialect == Dialect::Anthropic).await);
        }
    });
    let guard = AbortOnDrop(task);
    let body = futures::stream::unfold((rx, guard), |(mut rx, guard)| async move {
        rx.recv().await.map(|item| (item, (rx, guard)))
    });
    let mut r = Response::new(Body::from_stream(body));
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    r.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    r
}

/// Aborts the stream's producer when the response body is dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
