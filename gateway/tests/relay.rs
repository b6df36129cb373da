//! The relay against in-process upstreams: retry only on connect failures, bookings released on
//! failure and kept on success, every dispatch ended once, broken and stalled streams ended
//! with an error event in the caller's dialect.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use switchyard_gateway::admission::Admission;
use switchyard_gateway::observe::{Booking, Dispatch, Observer, Outcome, Release};
use switchyard_gateway::relay::{Api, RelayLimits, relay};
use switchyard_gateway::request::{Message, Prompt, Role};
use switchyard_gateway::upstream::{EventStream, SendError, Upstream, UpstreamTimeouts};
use switchyard_gateway::{
    Dialect, ErrorKind, Event, FinishReason, GatewayError, InferenceRequest, Routed, Target, Usage,
};
use tokio_util::sync::CancellationToken;

#[derive(Clone, Copy)]
enum Behaviour {
    Refuse,
    Fail,
    Complete,
    Truncate,
    Stall,
}

struct Fake(Behaviour);

impl Upstream for Fake {
    fn send<'a>(&'a self, _req: &'a InferenceRequest) -> BoxFuture<'a, Result<EventStream, SendError>> {
        let b = self.0;
        Box::pin(async move {
            let text = || Ok(Event::Text("hi".into()));
            match b {
                Behaviour::Refuse => Err(SendError::Connect("refused".into())),
                Behaviour::Fail => Err(SendError::Failed(GatewayError::upstream("boom"))),
                Behaviour::Complete => Ok(Box::pin(futures::stream::iter(vec![
                    text(),
                    Ok(Event::Finish(FinishReason::Stop)),
                    Ok(Event::Usage(Usage { prompt_tokens: 3, completion_tokens: 1, ..Usage::default() })),
                ])) as EventStream),
                Behaviour::Truncate => Ok(Box::pin(futures::stream::iter(vec![text()])) as EventStream),
                Behaviour::Stall => {
                    Ok(Box::pin(futures::stream::iter(vec![text()]).chain(futures::stream::pending())) as EventStream)
                }
            }
        })
    }
}

use futures::StreamExt;

#[derive(Default)]
struct Log {
    outcomes: Vec<(String, Outcome)>,
    released: Vec<String>,
}

struct Recorder(String, Arc<Mutex<Log>>);

impl Observer for Recorder {
    fn end(&mut self, outcome: Outcome) {
        self.1.lock().expect("log").outcomes.push((self.0.clone(), outcome));
    }
}

impl Release for Recorder {
    fn release(self: Box<Self>) {
        self.1.lock().expect("log").released.push(self.0.clone());
    }
}

struct FakeTarget {
    label: String,
    upstream: Fake,
    log: Arc<Mutex<Log>>,
}

impl Target for FakeTarget {
    fn label(&self) -> &str {
        &self.label
    }
    fn upstream(&self) -> &dyn Upstream {
        &self.upstream
    }
    fn dispatch(&self, _attempt: usize) -> Dispatch {
        Dispatch {
            booking: Booking::new(Box::new(Recorder(self.label.clone(), self.log.clone()))),
            observers: vec![Box::new(Recorder(self.label.clone(), self.log.clone()))],
        }
    }
}

fn routed(behaviours: &[Behaviour], log: &Arc<Mutex<Log>>) -> Routed {
    Routed {
        targets: behaviours
            .iter()
            .enumerate()
            .map(|(i, b)| {
                Box::new(FakeTarget { label: format!("t{i}"), upstream: Fake(*b), log: log.clone() }) as Box<dyn Target>
            })
            .collect(),
        prompt_tokens: Some(3),
        headers: Vec::new(),
    }
}

fn request(dialect: Dialect, stream: bool) -> Arc<InferenceRequest> {
    let prompt = Prompt::Chat { messages: vec![Message::text(Role::User, "hi")], tools: Vec::new(), tool_choice: None };
    let mut r = InferenceRequest::new(dialect, "m", prompt);
    r.stream = stream;
    Arc::new(r)
}

fn limits() -> RelayLimits {
    RelayLimits {
        timeouts: UpstreamTimeouts { first_byte: Duration::from_secs(5), idle: Duration::from_millis(300) },
        ping_interval: Duration::from_millis(100),
    }
}

async fn run(
    behaviours: &[Behaviour],
    dialect: Dialect,
    stream: bool,
    expired: CancellationToken,
) -> (Result<String, GatewayError>, Arc<Mutex<Log>>) {
    let log = Arc::new(Mutex::new(Log::default()));
    let api = if dialect == Dialect::Anthropic { Api::Messages } else { Api::Chat };
    let permit = Admission::new(4, Duration::from_secs(1)).try_admit().expect("permit");
    let result = relay(request(dialect, stream), api, routed(behaviours, &log), limits(), expired, permit).await;
    let body = match result {
        Ok(resp) => {
            let bytes = axum::body::to_bytes(resp.into_body(), usize::MAX).await.expect("body");
            Ok(String::from_utf8_lossy(&bytes).into_owned())
        }
        Err(e) => Err(e),
    };
    // Give the producer task's guard a moment to report its end.
    tokio::time::sleep(Duration::from_millis(20)).await;
    (body, log)
}

#[tokio::test]
async fn only_connect_failures_move_to_the_next_target_and_only_failures_release_bookings() {
    let (body, log) =
        run(&[Behaviour::Refuse, Behaviour::Complete], Dialect::OpenAi, false, CancellationToken::new()).await;
    let body = body.expect("second target answers");
    assert!(body.contains("\"finish_reason\":\"stop\""), "{body}");
    {
        let log = log.lock().expect("log");
        assert_eq!(log.outcomes, [("t0".to_owned(), Outcome::ConnectFailed), ("t1".to_owned(), Outcome::Completed)]);
        assert_eq!(log.released, ["t0"], "the refused target's booking is released; the served one is kept");
    }

    let (body, log) =
        run(&[Behaviour::Fail, Behaviour::Complete], Dialect::OpenAi, false, CancellationToken::new()).await;
    assert_eq!(body.expect_err("an upstream failure is final").kind, ErrorKind::UpstreamFailed);
    {
        let log = log.lock().expect("log");
        assert_eq!(log.outcomes, [("t0".to_owned(), Outcome::Failed)], "no retry after a non-connect failure");
        assert_eq!(log.released, ["t0"]);
    }

    let (body, _) =
        run(&[Behaviour::Refuse, Behaviour::Refuse], Dialect::Anthropic, false, CancellationToken::new()).await;
    assert_eq!(body.expect_err("nothing reachable").kind, ErrorKind::NoCapacity);
}

#[tokio::test]
async fn a_truncated_stream_ends_with_an_error_event_in_each_dialect() {
    let (body, log) = run(&[Behaviour::Truncate], Dialect::OpenAi, true, CancellationToken::new()).await;
    let body = body.expect("streaming response");
    assert!(body.contains("data: {\"error\""), "{body}");
    assert!(!body.contains("[DONE]"), "{body}");
    assert_eq!(log.lock().expect("log").released, ["t0"]);

    let (body, _) = run(&[Behaviour::Truncate], Dialect::Anthropic, true, CancellationToken::new()).await;
    let body = body.expect("streaming response");
    assert!(body.starts_with("event: message_start\n"), "{body}");
    assert!(body.contains("event: error\n") && !body.contains("event: message_stop"), "{body}");
}

#[tokio::test]
async fn a_stalled_stream_is_pinged_then_ended_by_the_idle_timeout() {
    let (body, log) = run(&[Behaviour::Stall], Dialect::Anthropic, true, CancellationToken::new()).await;
    let body = body.expect("streaming response");
    assert!(body.matches("event: ping").count() >= 2, "keep-alive pings while quiet: {body}");
    assert!(body.contains("\"upstream stopped sending\"") || body.contains("the upstream stopped sending"), "{body}");
    assert_eq!(log.lock().expect("log").outcomes, [("t0".to_owned(), Outcome::Failed)]);
}

#[tokio::test]
async fn the_drain_deadline_ends_open_streams_with_an_error() {
    let expired = CancellationToken::new();
    let cancel = expired.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(100)).await;
        cancel.cancel();
    });
    let (body, log) = run(&[Behaviour::Stall], Dialect::OpenAi, true, expired).await;
    let body = body.expect("streaming response");
    assert!(body.contains("shutting_down"), "{body}");
    assert_eq!(log.lock().expect("log").outcomes, [("t0".to_owned(), Outcome::Cancelled)]);
}

#[tokio::test]
async fn a_completed_stream_keeps_its_booking_and_renders_usage() {
    let (body, log) = run(&[Behaviour::Complete], Dialect::Anthropic, true, CancellationToken::new()).await;
    let body = body.expect("streaming response");
    assert!(body.contains("event: message_stop"), "{body}");
    assert!(body.contains("\"stop_reason\":\"end_turn\""), "{body}");
    let log = log.lock().expect("log");
    assert!(log.released.is_empty());
    assert_eq!(log.outcomes, [("t0".to_owned(), Outcome::Completed)]);
}
