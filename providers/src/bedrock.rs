//! AWS Bedrock through the real `aws-sdk-bedrockruntime` client: `Converse` for clients that
//! do not stream, `ConverseStream` for those that do.
//!
//! Translation, request side: system messages become `system` blocks; user and assistant
//! messages keep their order, with an assistant's tool calls as `toolUse` blocks (arguments
//! parsed from JSON text) and tool messages as `toolResult` blocks of a user message; adjacent
//! messages of one role merge, because Bedrock requires the roles to alternate. Tools become a
//! `toolConfig` (`auto`, `any` for "required", `tool` for a named function; Bedrock has no
//! "none", so "none" sends the tools with `auto`). `maxTokens`, `temperature`, `topP` and
//! `stopSequences` go in `inferenceConfig`; `top_k` goes in `additionalModelRequestFields`.
//! Image parts and token-id prompts are refused with a clear error: the provider cannot take
//! them as sent.
//!
//! Response side: text deltas, tool calls (`contentBlockStart` gives id and name, deltas the
//! input's JSON text) numbered in order, the stop reason at `messageStop`, and usage at
//! `metadata` (prompt tokens = `inputTokens` + `cacheReadInputTokens` +
//! `cacheWriteInputTokens`, since Bedrock's `inputTokens` excludes both).
//!
//! Invariants:
//! - `send` resolves after the stream's first event (or the whole Converse answer): every
//!   failure before it is a [`SendError`], classified so the relay can try the next provider
//!   (throttling, server errors, timeouts, no connection, a refused credential or model) or
//!   stop (the caller's own validation error);
//! - the SDK retries only before a response exists, so a stream is never retried after its
//!   first event; nothing here retries at all;
//! - the request holds its [`Pass`] until its stream ends or is dropped.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use aws_sdk_bedrockruntime::Client;
use aws_sdk_bedrockruntime::config::{
    BehaviorVersion, Credentials, Region, retry::RetryConfig, timeout::TimeoutConfig,
};
use aws_sdk_bedrockruntime::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_bedrockruntime::types::{
    AnyToolChoice, AutoToolChoice, ContentBlock, ContentBlockDelta, ContentBlockStart, ConversationRole,
    ConverseStreamOutput, InferenceConfiguration, Message as BedrockMessage, SpecificToolChoice, StopReason,
    SystemContentBlock, Tool as BedrockTool, ToolChoice as BedrockToolChoice, ToolConfiguration, ToolInputSchema,
    ToolResultBlock, ToolResultContentBlock, ToolSpecification, ToolUseBlock,
};
use aws_smithy_types::{Document, Number};
use futures::StreamExt;
use futures::future::BoxFuture;
use serde_json::Value;
use switchyard_core::fleet::{ProviderConnection, ProviderCredentials};
use switchyard_gateway::error::{ErrorKind, GatewayError};
use switchyard_gateway::event::{Event, FinishReason, Usage};
use switchyard_gateway::request::{Content, InferenceRequest, Part, Prompt, Role, ToolChoice};
use switchyard_gateway::upstream::{EventStream, SendError, Upstream};

use crate::guard::{Guard, Pass, Verdict};
use crate::secrets::SecretFiles;
use crate::{ProviderError, refusal_error};

/// Builds the SDK client for a Bedrock provider: rustls on ring, the resource's region and
/// endpoint, and credentials from the standard AWS chain, an assumed role or a Secret.
pub async fn client(name: &str, conn: &ProviderConnection, secrets: &SecretFiles) -> Result<Client, ProviderError> {
    use aws_smithy_http_client::{Builder as HttpBuilder, tls};
    let http =
        HttpBuilder::new().tls_provider(tls::Provider::Rustls(tls::rustls_provider::CryptoMode::Ring)).build_https();
    let region = conn
        .aws_region
        .clone()
        .ok_or_else(|| ProviderError::Config(format!("Bedrock provider `{name}` has no region")))?;
    let timeouts = TimeoutConfig::builder().connect_timeout(Duration::from_secs(3)).build();
    // The standard retry strategy: 3 attempts, throttling and 5xx retried with backoff, all
    // before a response exists.
    let mut builder = aws_sdk_bedrockruntime::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new(region.clone()))
        .http_client(http.clone())
        .retry_config(RetryConfig::standard().with_max_attempts(3))
        .timeout_config(timeouts);
    if let Some(url) = &conn.base_url {
        builder = builder.endpoint_url(url.trim_end_matches('/'));
    }
    builder = match &conn.credentials {
        ProviderCredentials::Secret { name: secret, key } => {
            let text = secrets.read(secret, key)?;
            builder.credentials_provider(static_credentials(&text).ok_or_else(|| {
                ProviderError::Config(format!(
                    "Secret `{secret}` key `{key}` does not hold AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY lines"
                ))
            })?)
        }
        ProviderCredentials::Ambient | ProviderCredentials::AssumeRole { .. } => {
            // The default chain: environment, web identity (IRSA), EKS Pod Identity, profile,
            // instance metadata — resolved lazily, on the first request.
            let base = aws_config::defaults(aws_config::BehaviorVersion::latest())
                .region(Region::new(region.clone()))
                .http_client(http)
                .load()
                .await;
            let chain = base
                .credentials_provider()
                .ok_or_else(|| ProviderError::Config("no AWS credentials provider is available".to_owned()))?;
            match &conn.credentials {
                ProviderCredentials::AssumeRole { role_arn } => builder.credentials_provider(
                    aws_config::sts::AssumeRoleProvider::builder(role_arn)
                        .session_name(format!("switchyard-{name}"))
                        .configure(&base)
                        .build_from_provider(chain)
                        .await,
                ),
                _ => builder.credentials_provider(chain),
            }
        }
    };
    Ok(Client::from_conf(builder.build()))
}

/// AWS keys from `KEY=value` lines (the shape of an env file mounted from a Secret).
fn static_credentials(text: &str) -> Option<Credentials> {
    let mut vars: HashMap<&str, &str> = HashMap::new();
    for line in text.lines() {
        if let Some((k, v)) = line.split_once('=') {
            vars.insert(k.trim(), v.trim());
        }
    }
    Some(Credentials::new(
        *vars.get("AWS_ACCESS_KEY_ID")?,
        *vars.get("AWS_SECRET_ACCESS_KEY")?,
        vars.get("AWS_SESSION_TOKEN").map(|s| (*s).to_owned()),
        None,
        "switchyard-secret",
    ))
}

/// One Bedrock model behind the upstream seam.
pub struct BedrockUpstream {
    /// The provider's resource name (for errors and logs).
    pub provider: String,
    /// The shared SDK client of the provider.
    pub client: Client,
    /// The Bedrock model id.
    pub model_id: String,
    /// The provider's breaker and cap.
    pub guard: Arc<Guard>,
    /// From sending to the first event.
    pub first_byte_timeout: Duration,
}

/// The request in Converse terms.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ConverseParts {
    /// The conversation.
    pub messages: Vec<BedrockMessage>,
    /// System blocks.
    pub system: Vec<SystemContentBlock>,
    /// Sampling and limits.
    pub inference: Option<InferenceConfiguration>,
    /// Tools.
    pub tools: Option<ToolConfiguration>,
    /// Model-specific fields (`top_k`).
    pub additional: Option<Document>,
}

/// JSON to a smithy document.
pub fn document(v: &Value) -> Document {
    match v {
        Value::Null => Document::Null,
        Value::Bool(b) => Document::Bool(*b),
        Value::Number(n) => Document::Number(match (n.as_u64(), n.as_i64()) {
            (Some(u), _) => Number::PosInt(u),
            (None, Some(i)) => Number::NegInt(i),
            _ => Number::Float(n.as_f64().unwrap_or(0.0)),
        }),
        Value::String(s) => Document::String(s.clone()),
        Value::Array(a) => Document::Array(a.iter().map(document).collect()),
        Value::Object(o) => Document::Object(o.iter().map(|(k, v)| (k.clone(), document(v))).collect()),
    }
}

/// A smithy document to JSON (object keys sorted, for a stable text).
pub fn json(d: &Document) -> Value {
    match d {
        Document::Null => Value::Null,
        Document::Bool(b) => Value::Bool(*b),
        Document::Number(Number::PosInt(u)) => Value::from(*u),
        Document::Number(Number::NegInt(i)) => Value::from(*i),
        Document::Number(Number::Float(f)) => serde_json::Number::from_f64(*f).map_or(Value::Null, Value::Number),
        Document::String(s) => Value::String(s.clone()),
        Document::Array(a) => Value::Array(a.iter().map(json).collect()),
        Document::Object(o) => {
            let mut keys: Vec<&String> = o.keys().collect();
            keys.sort();
            Value::Object(keys.into_iter().map(|k| (k.clone(), o.get(k).map_or(Value::Null, json))).collect())
        }
    }
}

fn invalid(message: impl Into<String>) -> GatewayError {
    GatewayError::invalid(message)
}

fn built<T, E: std::fmt::Display>(r: Result<T, E>) -> Result<T, GatewayError> {
    r.map_err(|e| {
        GatewayError::new(ErrorKind::Internal, "provider_request", format!("building the provider request: {e}"))
    })
}

fn text_blocks(content: &Option<Content>) -> Result<Vec<String>, GatewayError> {
    match content {
        None => Ok(Vec::new()),
        Some(Content::Text(t)) => Ok(if t.is_empty() { Vec::new() } else { vec![t.clone()] }),
        Some(Content::Parts(parts)) => parts
            .iter()
            .filter_map(|p| match p {
                Part::Text(t) if t.is_empty() => None,
                Part::Text(t) => Some(Ok(t.clone())),
                Part::ImageUrl(_) => Some(Err(invalid("image content cannot be sent to this provider"))),
            })
            .collect(),
    }
}

/// Translates a typed request into Converse terms.
pub fn converse_parts(req: &InferenceRequest) -> Result<ConverseParts, GatewayError> {
    let mut parts = ConverseParts::default();
    // (role, blocks) runs, merged by role.
    let mut turns: Vec<(ConversationRole, Vec<ContentBlock>)> = Vec::new();
    let mut push = |role: ConversationRole, blocks: Vec<ContentBlock>| {
        if blocks.is_empty() {
            return;
        }
        match turns.last_mut() {
            Some((r, b)) if *r == role => b.extend(blocks),
            _ => turns.push((role, blocks)),
        }
    };
    let (tools, tool_choice) = match &req.prompt {
        Prompt::Chat { messages, tools, tool_choice } => {
            for m in messages {
                match m.role {
                    Role::System => {
                        parts.system.extend(text_blocks(&m.content)?.into_iter().map(SystemContentBlock::Text))
                    }
                    Role::User => push(
                        ConversationRole::User,
                        text_blocks(&m.content)?.into_iter().map(ContentBlock::Text).collect(),
                    ),
                    Role::Assistant => {
                        let mut blocks: Vec<ContentBlock> =
                            text_blocks(&m.content)?.into_iter().map(ContentBlock::Text).collect();
                        for call in &m.tool_calls {
                            let input: Value = serde_json::from_str(&call.arguments).map_err(|_| {
                                invalid(format!("the arguments of tool call `{}` are not JSON", call.id))
                            })?;
                            blocks.push(ContentBlock::ToolUse(built(
                                ToolUseBlock::builder()
                                    .tool_use_id(&call.id)
                                    .name(&call.name)
                                    .input(document(&input))
                                    .build(),
                            )?));
                        }
                        push(ConversationRole::Assistant, blocks);
                    }
                    Role::Tool => {
                        let id = m.tool_call_id.clone().ok_or_else(|| invalid("a tool message needs tool_call_id"))?;
                        let text = m.content.as_ref().map(Content::joined_text).unwrap_or_default();
                        let result = built(
                            ToolResultBlock::builder()
                                .tool_use_id(id)
                                .content(ToolResultContentBlock::Text(text))
                                .build(),
                        )?;
                        push(ConversationRole::User, vec![ContentBlock::ToolResult(result)]);
                    }
                }
            }
            (tools.as_slice(), tool_choice.as_ref())
        }
        Prompt::Text(switchyard_gateway::request::TextPrompt::String(s)) => {
            push(ConversationRole::User, vec![ContentBlock::Text(s.clone())]);
            (&[][..], None)
        }
        Prompt::Text(switchyard_gateway::request::TextPrompt::Tokens(_)) => {
            return Err(invalid("a prompt of token ids cannot be sent to this provider"));
        }
    };
    for (role, blocks) in turns {
        parts.messages.push(built(BedrockMessage::builder().role(role).set_content(Some(blocks)).build())?);
    }
    if !tools.is_empty() {
        let mut cfg = ToolConfiguration::builder();
        for t in tools {
            let spec = ToolSpecification::builder()
                .name(&t.name)
                .set_description(t.description.clone())
                .input_schema(ToolInputSchema::Json(document(&t.parameters)))
                .build();
            cfg = cfg.tools(BedrockTool::ToolSpec(built(spec)?));
        }
        let choice = match tool_choice {
            Some(ToolChoice::Required) => BedrockToolChoice::Any(AnyToolChoice::builder().build()),
            Some(ToolChoice::Function(name)) => {
                BedrockToolChoice::Tool(built(SpecificToolChoice::builder().name(name).build())?)
            }
            _ => BedrockToolChoice::Auto(AutoToolChoice::builder().build()),
        };
        parts.tools = Some(built(cfg.tool_choice(choice).build())?);
    }
    let s = &req.sampling;
    if req.max_tokens.is_some() || s.temperature.is_some() || s.top_p.is_some() || !req.stop.is_empty() {
        parts.inference = Some(
            InferenceConfiguration::builder()
                .set_max_tokens(req.max_tokens.map(|n| n.min(i32::MAX as u32) as i32))
                .set_temperature(s.temperature.map(|t| t as f32))
                .set_top_p(s.top_p.map(|t| t as f32))
                .set_stop_sequences((!req.stop.is_empty()).then(|| req.stop.clone()))
                .build(),
        );
    }
    if let Some(k) = s.top_k {
        parts.additional = Some(document(&serde_json::json!({ "top_k": k })));
    }
    Ok(parts)
}

/// The typed finish reason of a Bedrock stop reason.
pub fn finish_reason(stop: &StopReason) -> FinishReason {
    match stop.as_str() {
        "end_turn" => FinishReason::Stop,
        "tool_use" => FinishReason::ToolCalls,
        "max_tokens" | "model_context_window_exceeded" => FinishReason::Length,
        "stop_sequence" => FinishReason::StopSequence(None),
        "guardrail_intervened" | "content_filtered" => FinishReason::ContentFilter,
        other => FinishReason::Other(other.to_owned()),
    }
}

/// Typed usage from Bedrock's: `inputTokens` excludes cache reads and writes.
pub fn usage(u: &aws_sdk_bedrockruntime::types::TokenUsage) -> Usage {
    let n = |v: i32| v.max(0) as u32;
    let read = n(u.cache_read_input_tokens.unwrap_or(0));
    let write = n(u.cache_write_input_tokens.unwrap_or(0));
    Usage {
        prompt_tokens: n(u.input_tokens).saturating_add(read).saturating_add(write),
        completion_tokens: n(u.output_tokens),
        cached_tokens: read,
        cache_write_tokens: write,
    }
}

/// How a failed call counts: its effect on the breaker and what the relay does next.
fn classify<E, R>(provider: &str, err: &SdkError<E, R>) -> (Verdict, SendError)
where
    E: ProvideErrorMetadata + std::error::Error + 'static,
    R: std::fmt::Debug,
{
    let unavailable = |kind: ErrorKind, code: &'static str, message: String| {
        (Verdict::Unhealthy, SendError::Unavailable(GatewayError::new(kind, code, message)))
    };
    match err {
        SdkError::DispatchFailure(_) => unavailable(
            ErrorKind::NoCapacity,
            "provider_unreachable",
            format!("provider `{provider}` could not be reached"),
        ),
        SdkError::TimeoutError(_) => unavailable(
            ErrorKind::UpstreamTimeout,
            "provider_timeout",
            format!("provider `{provider}` did not answer in time"),
        ),
        SdkError::ServiceError(se) => {
            let code = se.err().code().unwrap_or("");
            let message = se.err().message().unwrap_or("").to_owned();
            match code {
                "ThrottlingException" | "ModelNotReadyException" => unavailable(
                    ErrorKind::NoCapacity,
                    "provider_throttled",
                    format!("provider `{provider}` is throttling requests"),
                ),
                "ValidationException" => (
                    Verdict::Neutral,
                    SendError::Failed(GatewayError::new(
                        ErrorKind::InvalidRequest,
                        "provider_validation",
                        format!("provider `{provider}` refused the request: {message}"),
                    )),
                ),
                "AccessDeniedException" | "ResourceNotFoundException" | "UnrecognizedClientException" => unavailable(
                    ErrorKind::UpstreamFailed,
                    "provider_refused",
                    format!("provider `{provider}` refused Switchyard's credentials or model id ({code})"),
                ),
                _ => unavailable(
                    ErrorKind::UpstreamFailed,
                    "provider_failed",
                    format!("provider `{provider}` failed ({})", if code.is_empty() { "no error code" } else { code }),
                ),
            }
        }
        SdkError::ResponseError(_) => unavailable(
            ErrorKind::UpstreamFailed,
            "provider_failed",
            format!("provider `{provider}` sent a malformed response"),
        ),
        _ => (
            Verdict::Neutral,
            SendError::Failed(GatewayError::new(
                ErrorKind::Internal,
                "provider_request",
                format!("the request to provider `{provider}` could not be built"),
            )),
        ),
    }
}

/// Typed events of one stream event; `tools` maps content-block indices to call numbers.
fn translate(event: ConverseStreamOutput, tools: &mut Vec<i32>, out: &mut Vec<Event>) {
    let ordinal = |tools: &Vec<i32>, block: i32| tools.iter().position(|b| *b == block).map(|i| i as u32);
    match event {
        ConverseStreamOutput::ContentBlockStart(start) => {
            if let Some(ContentBlockStart::ToolUse(tu)) = start.start {
                tools.push(start.content_block_index);
                out.push(Event::ToolCall {
                    index: (tools.len() - 1) as u32,
                    id: Some(tu.tool_use_id),
                    name: Some(tu.name),
                    arguments: String::new(),
                });
            }
        }
        ConverseStreamOutput::ContentBlockDelta(delta) => match delta.delta {
            Some(ContentBlockDelta::Text(t)) if !t.is_empty() => out.push(Event::Text(t)),
            Some(ContentBlockDelta::ToolUse(tu)) => {
                if let Some(index) = ordinal(tools, delta.content_block_index) {
                    out.push(Event::ToolCall { index, id: None, name: None, arguments: tu.input });
                }
            }
            _ => {}
        },
        ConverseStreamOutput::MessageStop(stop) => out.push(Event::Finish(finish_reason(&stop.stop_reason))),
        ConverseStreamOutput::Metadata(meta) => {
            if let Some(u) = meta.usage {
                out.push(Event::Usage(usage(&u)));
            }
        }
        _ => {}
    }
}

/// Events of a whole Converse answer.
fn converse_events(output: aws_sdk_bedrockruntime::operation::converse::ConverseOutput) -> Vec<Event> {
    let mut events = Vec::new();
    let mut calls = 0u32;
    if let Some(aws_sdk_bedrockruntime::types::ConverseOutput::Message(m)) = output.output {
        for block in m.content {
            match block {
                ContentBlock::Text(t) => events.push(Event::Text(t)),
                ContentBlock::ToolUse(tu) => {
                    events.push(Event::ToolCall {
                        index: calls,
                        id: Some(tu.tool_use_id),
                        name: Some(tu.name),
                        arguments: json(&tu.input).to_string(),
                    });
                    calls += 1;
                }
                _ => {}
            }
        }
    }
    events.push(Event::Finish(finish_reason(&output.stop_reason)));
    if let Some(u) = output.usage {
        events.push(Event::Usage(usage(&u)));
    }
    events
}

/// A stream's reading state.
struct Reading {
    rx: aws_sdk_bedrockruntime::primitives::event_stream::EventReceiver<
        ConverseStreamOutput,
        aws_sdk_bedrockruntime::types::error::ConverseStreamOutputError,
    >,
    tools: Vec<i32>,
    guard: Arc<Guard>,
    pass: Pass,
    provider: String,
    done: bool,
}

/// Sets the request's parts on a Converse or ConverseStream builder (two generated types with
/// the same setters).
macro_rules! with_parts {
    ($builder:expr, $parts:expr) => {{
        let parts = $parts;
        $builder
            .set_messages(Some(parts.messages))
            .set_system((!parts.system.is_empty()).then_some(parts.system))
            .set_inference_config(parts.inference)
            .set_tool_config(parts.tools)
            .set_additional_model_request_fields(parts.additional)
    }};
}

impl Upstream for BedrockUpstream {
    fn send<'a>(&'a self, req: &'a InferenceRequest) -> BoxFuture<'a, Result<EventStream, SendError>> {
        Box::pin(async move {
            let parts = converse_parts(req).map_err(SendError::Failed)?;
            let pass = self
                .guard
                .enter(Instant::now())
                .map_err(|r| SendError::Unavailable(refusal_error(&self.provider, r)))?;
            let timed_out = || {
                SendError::Unavailable(GatewayError::new(
                    ErrorKind::UpstreamTimeout,
                    "provider_timeout",
                    format!("provider `{}` sent nothing in time", self.provider),
                ))
            };
            if !req.stream {
                let call = with_parts!(self.client.converse().model_id(&self.model_id), parts).send();
                let result = match tokio::time::timeout(self.first_byte_timeout, call).await {
                    Ok(r) => r,
                    Err(_) => {
                        self.guard.record(&pass, Verdict::Unhealthy, Instant::now());
                        return Err(timed_out());
                    }
                };
                return match result {
                    Ok(output) => {
                        self.guard.record(&pass, Verdict::Healthy, Instant::now());
                        let events = converse_events(output);
                        Ok(futures::stream::iter(events.into_iter().map(Ok)).boxed())
                    }
                    Err(e) => {
                        let (verdict, err) = classify(&self.provider, &e);
                        self.guard.record(&pass, verdict, Instant::now());
                        Err(err)
                    }
                };
            }
            let first = async {
                let mut output = with_parts!(self.client.converse_stream().model_id(&self.model_id), parts)
                    .send()
                    .await
                    .map_err(|e| classify(&self.provider, &e))?;
                let first = output.stream.recv().await.map_err(|e| classify(&self.provider, &e))?;
                Ok::<_, (Verdict, SendError)>((output.stream, first))
            };
            let (rx, first) = match tokio::time::timeout(self.first_byte_timeout, first).await {
                Ok(Ok(v)) => v,
                Ok(Err((verdict, err))) => {
                    self.guard.record(&pass, verdict, Instant::now());
                    return Err(err);
                }
                Err(_) => {
                    self.guard.record(&pass, Verdict::Unhealthy, Instant::now());
                    return Err(timed_out());
                }
            };
            let mut reading = Reading {
                rx,
                tools: Vec::new(),
                guard: self.guard.clone(),
                pass,
                provider: self.provider.clone(),
                done: false,
            };
            let mut initial = Vec::new();
            match first {
                Some(event) => translate(event, &mut reading.tools, &mut initial),
                None => reading.done = true,
            }
            let head = futures::stream::iter(initial.into_iter().map(Ok));
            let tail = futures::stream::unfold(reading, |mut r| async move {
                loop {
                    if r.done {
                        return None;
                    }
                    match r.rx.recv().await {
                        Ok(Some(event)) => {
                            let mut out = Vec::new();
                            translate(event, &mut r.tools, &mut out);
                            if !out.is_empty() {
                                return Some((futures::stream::iter(out.into_iter().map(Ok).collect::<Vec<_>>()), r));
                            }
                        }
                        Ok(None) => {
                            r.guard.record(&r.pass, Verdict::Healthy, Instant::now());
                            return None;
                        }
                        Err(e) => {
                            r.done = true;
                            r.guard.record(&r.pass, Verdict::Unhealthy, Instant::now());
                            let detail = match &e {
                                SdkError::ServiceError(se) => se.err().code().unwrap_or("stream error").to_owned(),
                                _ => "the stream broke".to_owned(),
                            };
                            let err = GatewayError::upstream(format!(
                                "provider `{}` failed mid-stream ({detail})",
                                r.provider
                            ));
                            return Some((futures::stream::iter(vec![Err(err)]), r));
                        }
                    }
                }
            })
            .flatten();
            Ok(head.chain(tail).boxed())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use switchyard_gateway::request::{Dialect, Message, Tool, ToolCall};

    #[test]
    fn documents_round_trip_json() {
        let v = serde_json::json!({"a": [1, -2, 2.5, "x", null, true], "b": {"c": {}}});
        assert_eq!(json(&document(&v)), v);
    }

    #[test]
    fn a_tool_conversation_becomes_alternating_converse_turns() {
        let mut assistant = Message::text(Role::Assistant, "");
        assistant.content = None;
        assistant.tool_calls = vec![ToolCall { id: "t1".into(), name: "calc".into(), arguments: "{\"x\":1}".into() }];
        let mut tool = Message::text(Role::Tool, "42");
        tool.tool_call_id = Some("t1".into());
        let req = InferenceRequest::new(
            Dialect::OpenAi,
            "m",
            Prompt::Chat {
                messages: vec![
                    Message::text(Role::System, "be brief"),
                    Message::text(Role::User, "add"),
                    Message::text(Role::User, "one"),
                    assistant,
                    tool,
                ],
                tools: vec![Tool {
                    name: "calc".into(),
                    description: None,
                    parameters: serde_json::json!({"type": "object"}),
                }],
                tool_choice: Some(ToolChoice::Required),
            },
        );
        let parts = converse_parts(&req).expect("translatable");
        assert_eq!(parts.system, vec![SystemContentBlock::Text("be brief".into())]);
        let roles: Vec<_> = parts.messages.iter().map(|m| m.role.clone()).collect();
        assert_eq!(roles, vec![ConversationRole::User, ConversationRole::Assistant, ConversationRole::User]);
        assert_eq!(parts.messages[0].content.len(), 2, "adjacent user messages merge");
        assert!(matches!(&parts.messages[1].content[0], ContentBlock::ToolUse(t) if t.tool_use_id == "t1"));
        assert!(matches!(&parts.messages[2].content[0], ContentBlock::ToolResult(r) if r.tool_use_id == "t1"));
        assert!(matches!(parts.tools.and_then(|t| t.tool_choice), Some(BedrockToolChoice::Any(_))));
    }

    #[test]
    fn usage_adds_cache_reads_and_writes_to_the_prompt() {
        let u = aws_sdk_bedrockruntime::types::TokenUsage::builder()
            .input_tokens(10)
            .output_tokens(5)
            .total_tokens(45)
            .cache_read_input_tokens(20)
            .cache_write_input_tokens(10)
            .build()
            .expect("complete usage");
        assert_eq!(
            usage(&u),
            Usage { prompt_tokens: 40, completion_tokens: 5, cached_tokens: 20, cache_write_tokens: 10 }
        );
    }

    #[test]
    fn secret_files_give_static_keys() {
        assert!(static_credentials("AWS_ACCESS_KEY_ID=AKID\nAWS_SECRET_ACCESS_KEY=s\n").is_some());
        assert!(static_credentials("AWS_ACCESS_KEY_ID=AKID\n").is_none());
    }
}
