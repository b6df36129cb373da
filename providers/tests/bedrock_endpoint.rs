//! The Bedrock provider through the real `aws-sdk-bedrockruntime` client against the faithful
//! endpoint (`switchyard_sim::bedrock`) over a real socket: translation both ways, SigV4,
//! the SDK's retries, the breaker, and a stream cut mid-way.

use std::time::Duration;

use futures::StreamExt;
use serde_json::{Value, json};
use switchyard_core::fleet::{ProviderConnection, ProviderCredentials, ProviderLimits};
use switchyard_gateway::error::ErrorKind;
use switchyard_gateway::event::{Collected, Event, FinishReason};
use switchyard_gateway::request::{Dialect, InferenceRequest, Message, Prompt, Role, Tool, ToolChoice};
use switchyard_gateway::upstream::{SendError, Upstream};
use switchyard_providers::bedrock::{self, BedrockUpstream};
use switchyard_providers::guard::{BreakerState, Guard};
use switchyard_providers::secrets::SecretFiles;
use switchyard_sim::bedrock::{BedrockConfig, BedrockEndpoint, LatencyModel};

const MODEL_ID: &str = "us.meta.llama3-3-70b-instruct-v1:0";

async fn endpoint() -> BedrockEndpoint {
    let cfg = BedrockConfig {
        models: vec![MODEL_ID.to_owned()],
        latency: LatencyModel { first_token_ms: 5.0, per_input_token_ms: 0.0, per_output_token_ms: 1.0 },
        ..BedrockConfig::default()
    };
    BedrockEndpoint::start(cfg).await.expect("the endpoint binds")
}

/// A client with static keys from a mounted Secret, pointed at `url`.
async fn upstream(url: &str, guard: std::sync::Arc<Guard>) -> BedrockUpstream {
    let dir =
        std::env::temp_dir().join(format!("switchyard-bedrock-test-{}-{}", std::process::id(), guard.in_flight()));
    std::fs::create_dir_all(dir.join("aws")).expect("temp dir");
    std::fs::write(dir.join("aws").join("keys"), "AWS_ACCESS_KEY_ID=AKIDTEST\nAWS_SECRET_ACCESS_KEY=secret\n")
        .expect("secret file");
    let conn = ProviderConnection {
        aws_region: Some("us-east-1".to_owned()),
        base_url: Some(url.to_owned()),
        credentials: ProviderCredentials::Secret { name: "aws".into(), key: "keys".into() },
        limits: ProviderLimits::default(),
    };
    let client = bedrock::client("bedrock", &conn, &SecretFiles { dir: Some(dir) }).await.expect("client");
    BedrockUpstream {
        provider: "bedrock".into(),
        client,
        model_id: MODEL_ID.into(),
        guard,
        first_byte_timeout: Duration::from_secs(10),
    }
}

fn chat(text: &str, stream: bool) -> InferenceRequest {
    let mut req = InferenceRequest::new(
        Dialect::OpenAi,
        "m",
        Prompt::Chat {
            messages: vec![Message::text(Role::System, "be brief"), Message::text(Role::User, text)],
            tools: Vec::new(),
            tool_choice: None,
        },
    );
    req.stream = stream;
    req.max_tokens = Some(64);
    req
}

async fn log(url: &str) -> Vec<Value> {
    let v: Value = reqwest::get(format!("{url}/sim/requests")).await.expect("log").json().await.expect("json");
    v["requests"].as_array().cloned().unwrap_or_default()
}

async fn arm(url: &str, faults: Value) {
    reqwest::Client::new().post(format!("{url}/sim/faults")).json(&faults).send().await.expect("armed");
}

async fn collect(s: switchyard_gateway::upstream::EventStream) -> (Collected, Vec<Event>, Option<String>) {
    let mut all = Vec::new();
    let mut c = Collected::default();
    let mut error = None;
    let mut s = s;
    while let Some(item) = s.next().await {
        match item {
            Ok(e) => {
                all.push(e.clone());
                c.push(e);
            }
            Err(e) => error = Some(e.message),
        }
    }
    (c, all, error)
}

#[tokio::test]
async fn a_stream_arrives_event_by_event_with_usage_and_sigv4() {
    let ep = endpoint().await;
    let up = upstream(&ep.url(), std::sync::Arc::new(Guard::new(8, Duration::from_secs(5)))).await;
    let stream = up.send(&chat("tell me about routing", true)).await.expect("stream");
    let (c, events, error) = collect(stream).await;
    assert_eq!(error, None);
    let texts = events.iter().filter(|e| matches!(e, Event::Text(_))).count();
    assert!(texts > 5, "one event per token: {events:?}");
    assert_eq!(c.finish, Some(FinishReason::Stop));
    let usage = c.usage.expect("usage from metadata");
    assert_eq!(usage.completion_tokens as usize, texts);
    assert!(usage.prompt_tokens > 0);
    let log = log(&ep.url()).await;
    assert_eq!(log.len(), 1);
    let call = &log[0];
    assert_eq!(call["operation"], "ConverseStream");
    assert_eq!(call["modelId"], MODEL_ID, "the percent-encoded id is decoded");
    assert_eq!(call["auth"], "sigv4");
    let scope = call["credentialScope"].as_str().unwrap_or("");
    assert!(scope.starts_with("AKIDTEST/") && scope.ends_with("/us-east-1/bedrock/aws4_request"), "{scope}");
    assert_eq!(call["attempt"], "attempt=1; max=3");
    assert_eq!(call["body"]["system"], json!([{"text": "be brief"}]));
    assert_eq!(call["body"]["inferenceConfig"]["maxTokens"], 64);
    ep.shutdown().await;
}

#[tokio::test]
async fn converse_answers_a_forced_tool_call_and_the_stream_agrees() {
    let ep = endpoint().await;
    let up = upstream(&ep.url(), std::sync::Arc::new(Guard::new(8, Duration::from_secs(5)))).await;
    let mut req = chat("weather please", false);
    req.prompt = Prompt::Chat {
        messages: vec![Message::text(Role::User, "weather please")],
        tools: vec![Tool {
            name: "get_weather".into(),
            description: Some("Weather for a city".into()),
            parameters: json!({"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}),
        }],
        tool_choice: Some(ToolChoice::Function("get_weather".into())),
    };
    let whole = collect(up.send(&req).await.expect("converse")).await.0;
    assert_eq!(whole.finish, Some(FinishReason::ToolCalls));
    assert_eq!(whole.tool_calls.len(), 1);
    let (id, name, args) = &whole.tool_calls[0];
    assert!(id.starts_with("tooluse_") && name == "get_weather");
    let args: Value = serde_json::from_str(args).expect("arguments are JSON");
    assert!(args["city"].is_string() && args["days"].is_u64(), "{args}");
    req.stream = true;
    let streamed = collect(up.send(&req).await.expect("stream")).await.0;
    assert_eq!(streamed.tool_calls, whole.tool_calls, "streamed fragments concatenate to the same call");
    let ops: Vec<Value> = log(&ep.url()).await.iter().map(|c| c["operation"].clone()).collect();
    assert_eq!(ops, vec![json!("Converse"), json!("ConverseStream")]);
    ep.shutdown().await;
}

#[tokio::test]
async fn throttling_is_retried_by_the_sdk_then_opens_the_breaker() {
    let ep = endpoint().await;
    let guard = std::sync::Arc::new(Guard::new(8, Duration::from_secs(60)));
    let up = upstream(&ep.url(), guard.clone()).await;
    arm(&ep.url(), json!({"throttle": 3})).await;
    let err = match up.send(&chat("hello", true)).await {
        Err(SendError::Unavailable(e)) => e,
        Err(other) => panic!("expected a refusal the relay can move past, got {other:?}"),
        Ok(_) => panic!("expected a refusal, got a stream"),
    };
    assert_eq!(err.code, "provider_throttled");
    let attempts: Vec<Value> = log(&ep.url()).await.iter().map(|c| c["attempt"].clone()).collect();
    assert_eq!(attempts, vec![json!("attempt=1; max=3"), json!("attempt=2; max=3"), json!("attempt=3; max=3")]);
    assert!(matches!(guard.state(), BreakerState::Open { .. }));
    // While open, nothing reaches the endpoint.
    assert!(
        matches!(up.send(&chat("hello", true)).await, Err(SendError::Unavailable(e)) if e.code == "provider_breaker_open")
    );
    assert_eq!(log(&ep.url()).await.len(), 3);
    ep.shutdown().await;
}

#[tokio::test]
async fn a_cut_stream_ends_with_an_error_and_a_validation_error_is_final() {
    let ep = endpoint().await;
    let guard = std::sync::Arc::new(Guard::new(8, Duration::from_secs(60)));
    let up = upstream(&ep.url(), guard.clone()).await;
    arm(&ep.url(), json!({"cutStreams": {"count": 1, "afterDeltas": 3}})).await;
    let (c, _, error) = collect(up.send(&chat("tell me about routing", true)).await.expect("stream")).await;
    assert_eq!(c.finish, None, "no finish after a cut");
    assert!(error.is_some_and(|m| m.contains("mid-stream")));
    assert!(c.text.split(' ').count() <= 3, "{:?}", c.text);
    // A caller's error says nothing about the provider.
    let fresh = std::sync::Arc::new(Guard::new(8, Duration::from_secs(60)));
    let up = upstream(&ep.url(), fresh.clone()).await;
    let mut bad = chat("hi", false);
    bad.prompt =
        Prompt::Chat { messages: vec![Message::text(Role::Assistant, "first")], tools: Vec::new(), tool_choice: None };
    match up.send(&bad).await {
        Err(SendError::Failed(e)) => {
            assert_eq!(e.kind, ErrorKind::InvalidRequest);
            assert!(e.message.contains("must start with a user message"), "{}", e.message);
        }
        _ => panic!("a validation error is final"),
    }
    assert_eq!(fresh.state(), BreakerState::Closed);
    ep.shutdown().await;
}
