//! The upstream seam: the relay sends a typed request and reads typed events, without knowing
//! what is behind it (a vLLM worker now; external providers and remote clusters next).
//!
//! Invariants:
//! - `send` resolves when the upstream has answered with headers (an external provider: with
//!   its first event); a refused or failed connection (or one closed before any answer) is [`SendError::Connect`], and a
//!   provider that refused before doing any work (throttled, unavailable, its breaker open or
//!   its concurrency cap reached) is [`SendError::Unavailable`]: the only failures the relay
//!   retries elsewhere, because nothing of the request has run;
//! - an upstream's error answer becomes a catalogue error carrying the upstream's status
//!   class and message, bounded in size;
//! - no single SSE event may exceed the configured size: a peer that sends an endless line
//!   ends its stream with an error instead of growing a buffer.

use std::sync::Arc;
use std::time::Duration;

use axum::http::{HeaderName, HeaderValue};
use bytes::Bytes;
use eventsource_stream::Eventsource;
use futures::future::BoxFuture;
use futures::stream::BoxStream;
use futures::{Stream, StreamExt};
use serde_json::{Map, Value};

use crate::error::{ErrorKind, GatewayError};
use crate::event::Event;
use crate::openai;
use crate::request::InferenceRequest;

/// Events of one response; ends after the last event, or with an error.
pub type EventStream = BoxStream<'static, Result<Event, GatewayError>>;

/// Why a send failed.
#[derive(Debug)]
pub enum SendError {
    /// No connection could be made: another target may be tried.
    Connect(String),
    /// The upstream refused before doing any work: another target may be tried; when none
    /// is left, this is the answer.
    Unavailable(GatewayError),
    /// The upstream answered with an error, or failed after connecting: final.
    Failed(GatewayError),
}

/// What an upstream answered: its events, and the headers naming the choice it made itself
/// (a spoke's front door names the worker it picked), for the client's response.
pub struct Answer {
    /// The response's events.
    pub events: EventStream,
    /// `x-switchyard-*` headers the upstream's own routing adds.
    pub headers: Vec<(HeaderName, HeaderValue)>,
}

/// Something a request can be sent to.
pub trait Upstream: Send + Sync {
    /// Sends `req`; resolves once the upstream has answered with headers.
    fn send<'a>(&'a self, req: &'a InferenceRequest) -> BoxFuture<'a, Result<EventStream, SendError>>;

    /// As [`Upstream::send`], with the headers of the upstream's own choice (none unless
    /// the upstream routes again).
    fn answer<'a>(&'a self, req: &'a InferenceRequest) -> BoxFuture<'a, Result<Answer, SendError>> {
        Box::pin(async move { self.send(req).await.map(|events| Answer { events, headers: Vec::new() }) })
    }
}

/// The response header in which a spoke names the worker it chose (`set/worker`).
const SPOKE_TARGET_HEADER: &str = "x-switchyard-target";
/// The header naming the worker a spoke chose, in the hub's response.
pub const WORKER_HEADER: &str = "x-switchyard-worker";
/// The header naming the external provider a spoke spilled to.
const PROVIDER_HEADER: &str = "x-switchyard-provider";

/// The headers of a spoke's answer the hub shows its client: the spoke's worker (its own
/// target's last segment, `set/worker`) or, when the spoke spilled over, its provider.
fn spoke_choice(headers: &reqwest::header::HeaderMap) -> Vec<(HeaderName, HeaderValue)> {
    let mut out = Vec::new();
    if let Some(provider) = headers.get(PROVIDER_HEADER) {
        out.push((HeaderName::from_static(PROVIDER_HEADER), provider.clone()));
    } else if let Some(worker) = headers
        .get(SPOKE_TARGET_HEADER)
        .and_then(|v| v.to_str().ok())
        .and_then(|t| t.rsplit('/').next())
        .and_then(|w| HeaderValue::from_str(w).ok())
    {
        out.push((HeaderName::from_static(WORKER_HEADER), worker));
    }
    out
}

/// Size bounds for what an upstream sends back.
#[derive(Debug, Clone, Copy)]
pub struct ResponseBounds {
    /// Largest SSE event.
    pub max_event_bytes: usize,
    /// Largest error body read from an upstream.
    pub max_error_bytes: usize,
}

impl Default for ResponseBounds {
    fn default() -> Self {
        ResponseBounds { max_event_bytes: 4 * 1024 * 1024, max_error_bytes: 64 * 1024 }
    }
}

/// An OpenAI-compatible HTTP upstream (a vLLM worker's `/v1/chat/completions` and
/// `/v1/completions`), always asked to stream with usage.
#[derive(Debug, Clone)]
pub struct OpenAiUpstream {
    /// Shared HTTP client (connect timeout configured on it).
    pub client: reqwest::Client,
    /// Base URL, e.g. `http://127.0.0.1:8000`.
    pub base_url: String,
    /// The model name the engine serves.
    pub served_model: String,
    /// The body already rendered for this upstream (`upstream_body(req, served_model)`), when
    /// the planner tokenized it: sending that very body keeps what was tokenized and what the
    /// engine receives identical, and saves rendering it twice.
    pub body: Option<Arc<Map<String, Value>>>,
    /// Response bounds.
    pub bounds: ResponseBounds,
    /// A bearer API key (an external OpenAI-compatible provider; vLLM workers have none).
    pub api_key: Option<Arc<str>>,
    /// Set when this is a spoke's front door (the hub's upstream): the worker set the hub
    /// chose, sent as `x-switchyard-worker-set` together with the request's class, tags and
    /// id (`x-switchyard-hub-request`),
    /// so the spoke's own policies see what the hub's saw. Never set for an engine or an
    /// external provider, which must not receive routing metadata.
    pub spoke_worker_set: Option<Arc<str>>,
}

impl Upstream for OpenAiUpstream {
    fn send<'a>(&'a self, req: &'a InferenceRequest) -> BoxFuture<'a, Result<EventStream, SendError>> {
        Box::pin(async move { self.answer(req).await.map(|a| a.events) })
    }

    fn answer<'a>(&'a self, req: &'a InferenceRequest) -> BoxFuture<'a, Result<Answer, SendError>> {
        Box::pin(async move {
            let path = if req.is_chat() { "/v1/chat/completions" } else { "/v1/completions" };
            let body = match &self.body {
                Some(b) => b.clone(),
                None => Arc::new(openai::upstream_body(req, &self.served_model)),
            };
            let mut post = self.client.post(format!("{}{path}", self.base_url)).json(&*body);
            if let Some(key) = &self.api_key {
                post = post.bearer_auth(key);
            }
            if let Some(set) = &self.spoke_worker_set {
                post = post.header(crate::server::WORKER_SET_HEADER, &**set);
                post = post.header(crate::server::HUB_REQUEST_HEADER, &req.id);
                if !req.tags.is_empty() {
                    post = post.header(
                        crate::server::TAGS_HEADER,
                        req.tags.iter().map(String::as_str).collect::<Vec<_>>().join(","),
                    );
                }
                if req.class == switchyard_core::request::RequestClass::Batch {
                    post = post.header(crate::server::CLASS_HEADER, "batch");
                }
            }
            let response = post.send().await.map_err(|e| {
                if e.is_connect() || closed_before_answering(&e) {
                    SendError::Connect(e.to_string())
                } else {
                    SendError::Failed(GatewayError::upstream(format!("the worker failed: {e}")))
                }
            })?;
            let status = response.status();
            if !status.is_success() {
                let body = read_bounded(response, self.bounds.max_error_bytes).await;
                return Err(SendError::Failed(error_from_upstream(status.as_u16(), &body)));
            }
            let headers = if self.spoke_worker_set.is_some() { spoke_choice(response.headers()) } else { Vec::new() };
            Ok(Answer { events: sse_events(response.bytes_stream(), self.bounds.max_event_bytes), headers })
        })
    }
}

/// Whether the peer closed or reset the connection before answering anything: a kept-alive
/// connection to a process that has just died. Nothing of the request can be running there
/// (the process is gone), so, like a refused connection, another target may be tried.
fn closed_before_answering(e: &reqwest::Error) -> bool {
    use std::io::ErrorKind as Io;
    let mut source: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(e);
    while let Some(s) = source {
        if s.downcast_ref::<hyper::Error>().is_some_and(|h| h.is_incomplete_message()) {
            return true;
        }
        if let Some(io) = s.downcast_ref::<std::io::Error>()
            && matches!(io.kind(), Io::ConnectionReset | Io::ConnectionAborted | Io::BrokenPipe)
        {
            return true;
        }
        source = s.source();
    }
    false
}

/// Reads at most `max` bytes of a response body.
async fn read_bounded(response: reqwest::Response, max: usize) -> Vec<u8> {
    let mut out = Vec::new();
    let mut s = response.bytes_stream();
    while let Some(Ok(chunk)) = s.next().await {
        let room = max.saturating_sub(out.len());
        out.extend_from_slice(&chunk[..chunk.len().min(room)]);
        if out.len() >= max {
            break;
        }
    }
    out
}

/// Maps an upstream's error answer into the catalogue: client errors keep their class and the
/// engine's message (they describe the caller's request); anything else is an upstream failure.
pub fn error_from_upstream(status: u16, body: &[u8]) -> GatewayError {
    let message = serde_json::from_slice::<Value>(body)
        .ok()
        .and_then(|v| {
            v.pointer("/error/message").or_else(|| v.get("message")).and_then(Value::as_str).map(str::to_owned)
        })
        .unwrap_or_else(|| format!("the upstream answered {status}"));
    let kind = match status {
        400 | 422 => ErrorKind::InvalidRequest,
        404 => ErrorKind::NotFound,
        413 => ErrorKind::PayloadTooLarge,
        429 => ErrorKind::RateLimited,
        503 => ErrorKind::NoCapacity,
        504 => ErrorKind::UpstreamTimeout,
        _ => ErrorKind::UpstreamFailed,
    };
    GatewayError::new(kind, "upstream_error", message)
}

/// Bounds the bytes between SSE event boundaries: past `max`, the stream ends with an error.
fn bounded<S>(inner: S, max: usize) -> impl Stream<Item = Result<Bytes, GatewayError>> + Send
where
    S: Stream<Item = Result<Bytes, reqwest::Error>> + Send,
{
    let mut since_boundary = 0usize;
    let mut last = 0u8;
    inner.map(move |chunk| {
        let bytes = chunk.map_err(|e| GatewayError::upstream(format!("the worker failed mid-stream: {e}")))?;
        // A boundary is a blank line: "\n\n" (possibly split across chunks).
        let mut prev = last;
        for &b in bytes.iter() {
            since_boundary += 1;
            if b == b'\n' && prev == b'\n' {
                since_boundary = 0;
            }
            prev = b;
        }
        last = prev;
        if since_boundary > max {
            return Err(GatewayError::upstream(format!("the worker sent an event larger than {max} bytes")));
        }
        Ok(bytes)
    })
}

/// Parses an OpenAI-compatible SSE body into typed events, with bounded event size. The
/// stream ends after `[DONE]`.
pub fn sse_events<S>(body: S, max_event_bytes: usize) -> EventStream
where
    S: Stream<Item = Result<Bytes, reqwest::Error>> + Send + 'static,
{
    // `None` marks `[DONE]`: the stream ends there, whatever follows.
    bounded(body, max_event_bytes)
        .eventsource()
        .flat_map(|item| {
            let out: Vec<Option<Result<Event, GatewayError>>> = match item {
                Err(eventsource_stream::EventStreamError::Transport(e)) => vec![Some(Err(e))],
                Err(e) => vec![Some(Err(GatewayError::upstream(format!("the worker sent a malformed stream: {e}"))))],
                Ok(ev) if ev.data == "[DONE]" => vec![None],
                Ok(ev) if ev.data.is_empty() => Vec::new(),
                Ok(ev) => {
                    let mut events = Vec::new();
                    match openai::upstream_chunk(&ev.data, &mut events) {
                        Ok(()) => events.into_iter().map(|e| Some(Ok(e))).collect(),
                        Err(e) => vec![Some(Err(e))],
                    }
                }
            };
            futures::stream::iter(out)
        })
        .take_while(|item| futures::future::ready(item.is_some()))
        .filter_map(futures::future::ready)
        .boxed()
}

/// Time limits of one upstream exchange.
#[derive(Debug, Clone, Copy)]
pub struct UpstreamTimeouts {
    /// From sending the request to the upstream's headers (queueing in the engine included).
    pub first_byte: Duration,
    /// Longest silence between two events of a stream.
    pub idle: Duration,
}

impl Default for UpstreamTimeouts {
    fn default() -> Self {
        UpstreamTimeouts { first_byte: Duration::from_secs(600), idle: Duration::from_secs(120) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(chunks: Vec<&'static str>) -> impl Stream<Item = Result<Bytes, reqwest::Error>> + Send + 'static {
        futures::stream::iter(chunks.into_iter().map(|c| Ok(Bytes::from_static(c.as_bytes()))))
    }

    #[tokio::test]
    async fn events_split_across_chunks_are_parsed_and_done_ends_the_stream() {
        let s = sse_events(
            body(vec![
                "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n",
                "\ndata: {\"choices\":[{\"delta\":{\"content\":\"b\"},\"finish_reason\":\"stop\"}]}\n\n",
                "data: [DONE]\n\n",
                "data: {\"choices\":[{\"delta\":{\"content\":\"after done\"}}]}\n\n",
            ]),
            1024,
        );
        let events: Vec<_> = s.collect().await;
        assert_eq!(events.len(), 3);
        assert_eq!(events[0].as_ref().ok(), Some(&Event::Text("a".into())));
    }

    #[tokio::test]
    async fn an_oversized_event_ends_the_stream_with_an_error() {
        let long: &'static str = Box::leak("x".repeat(5000).into_boxed_str());
        let s = sse_events(body(vec!["data: ", long, long]), 4096);
        let events: Vec<_> = s.collect().await;
        assert!(events.last().is_some_and(|e| e.as_ref().is_err_and(|e| e.message.contains("larger than"))));
    }

    #[test]
    fn upstream_client_errors_keep_their_class() {
        let e = error_from_upstream(400, br#"{"error":{"message":"max_tokens too large"}}"#);
        assert_eq!(e.kind, ErrorKind::InvalidRequest);
        assert_eq!(e.message, "max_tokens too large");
        assert_eq!(error_from_upstream(500, b"boom").kind, ErrorKind::UpstreamFailed);
    }
}
