//! The Anthropic dialect: `/v1/messages` and `/v1/messages/count_tokens` bodies into
//! [`InferenceRequest`], typed events back into Messages JSON and SSE.
//!
//! Invariants the official SDK relies on (each a test below):
//! - every SSE event carries an `event:` line; `message_start` comes first, with
//!   `content: []` and a `usage` object;
//! - a `content_block_start` precedes the first delta of every block, and every started block
//!   is stopped before the next starts and before `message_delta`;
//! - `message_delta` carries `stop_reason` and cumulative `usage.output_tokens`;
//!   `message_stop` ends the stream;
//! - `input_tokens` excludes cached tokens, which are reported as `cache_read_input_tokens`.
//!
//! A Messages request becomes a chat conversation in the typed form (system first, tool
//! results as tool messages), so it reaches an engine through its chat endpoint and chat
//! template exactly as an OpenAI chat request with the same conversation would.

use serde_json::{Map, Value, json};

use crate::error::GatewayError;
use crate::event::{Collected, Event, FinishReason, Usage};
use crate::request::{
    Content, Dialect, InferenceRequest, Message, Part, Prompt, Role, Sampling, Tool, ToolCall, ToolChoice,
};

/// API versions this front door speaks.
pub const VERSIONS: &[&str] = &["2023-06-01", "2026-10-21"];

/// The version that removed `temperature`, `top_p` and `top_k` from Messages.
const NO_SAMPLING_VERSION: &str = "2026-10-21";

/// Which Messages endpoint a body was sent to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    /// `/v1/messages`.
    Messages,
    /// `/v1/messages/count_tokens` (no `max_tokens`, no `stream`).
    CountTokens,
}

/// Checks the `anthropic-version` header (absent means the oldest version).
pub fn check_version(version: Option<&str>) -> Result<&'static str, GatewayError> {
    match version {
        None => Ok(VERSIONS[0]),
        Some(v) => VERSIONS.iter().copied().find(|known| *known == v).ok_or_else(|| {
            GatewayError::invalid(format!("unsupported anthropic-version `{v}`; supported: {}", VERSIONS.join(", ")))
        }),
    }
}

/// Parses a Messages body sent with API `version`.
pub fn parse(endpoint: Endpoint, version: &str, body: Map<String, Value>) -> Result<InferenceRequest, GatewayError> {
    let model = match body.get("model") {
        Some(Value::String(m)) if !m.is_empty() => m.clone(),
        Some(_) => return Err(GatewayError::invalid_param("model", "model: must be a non-empty string")),
        None => return Err(GatewayError::invalid_param("model", "model: Field required")),
    };
    let max_tokens = match (endpoint, body.get("max_tokens")) {
        (Endpoint::CountTokens, _) => None,
        (Endpoint::Messages, None) => {
            return Err(GatewayError::invalid_param("max_tokens", "max_tokens: Field required"));
        }
        (Endpoint::Messages, Some(v)) => match v.as_u64() {
            Some(n) if n >= 1 => Some(u32::try_from(n).unwrap_or(u32::MAX)),
            _ => return Err(GatewayError::invalid_param("max_tokens", "max_tokens: must be a positive integer")),
        },
    };
    let mut messages = Vec::new();
    match body.get("system") {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) => messages.push(Message::text(Role::System, s.clone())),
        Some(Value::Array(blocks)) => {
            let mut text = String::new();
            for (i, b) in blocks.iter().enumerate() {
                match (b.get("type").and_then(Value::as_str), b.get("text").and_then(Value::as_str)) {
                    (Some("text"), Some(t)) => {
                        if !text.is_empty() {
                            text.push('\n');
                        }
                        text.push_str(t);
                    }
                    _ => {
                        return Err(GatewayError::invalid_param(
                            &format!("system.{i}"),
                            "system: only text blocks are allowed",
                        ));
                    }
                }
            }
            messages.push(Message::text(Role::System, text));
        }
        Some(_) => {
            return Err(GatewayError::invalid_param("system", "system: must be a string or a list of text blocks"));
        }
    }
    match body.get("messages") {
        Some(Value::Array(items)) if !items.is_empty() => {
            for (i, m) in items.iter().enumerate() {
                conversation_turn(i, m, &mut messages)?;
            }
        }
        Some(Value::Array(_)) => {
            return Err(GatewayError::invalid_param("messages", "messages: at least one message is required"));
        }
        Some(_) => return Err(GatewayError::invalid_param("messages", "messages: must be a list")),
        None => return Err(GatewayError::invalid_param("messages", "messages: Field required")),
    }
    let tools = match body.get("tools") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(items)) => items.iter().enumerate().map(|(i, t)| tool(i, t)).collect::<Result<_, _>>()?,
        Some(_) => return Err(GatewayError::invalid_param("tools", "tools: must be a list")),
    };
    let tool_choice = match body.get("tool_choice") {
        None | Some(Value::Null) => None,
        Some(v) => Some(match v.get("type").and_then(Value::as_str) {
            Some("auto") => ToolChoice::Auto,
            Some("any") => ToolChoice::Required,
            Some("none") => ToolChoice::None,
            Some("tool") => ToolChoice::Function(
                v.get("name")
                    .and_then(Value::as_str)
                    .ok_or_else(|| GatewayError::invalid_param("tool_choice.name", "tool_choice.name: Field required"))?
                    .to_owned(),
            ),
            _ => return Err(GatewayError::invalid_param("tool_choice", "tool_choice: unknown type")),
        }),
    };
    let sampling_keys = ["temperature", "top_p", "top_k"];
    if version == NO_SAMPLING_VERSION
        && let Some(k) = sampling_keys.iter().find(|k| body.get(**k).is_some_and(|v| !v.is_null()))
    {
        return Err(GatewayError::invalid_param(
            k,
            format!("{k}: not supported in anthropic-version {NO_SAMPLING_VERSION}"),
        ));
    }
    let num = |k: &str| -> Result<Option<f64>, GatewayError> {
        match body.get(k) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => {
                v.as_f64().map(Some).ok_or_else(|| GatewayError::invalid_param(k, format!("{k}: must be a number")))
            }
        }
    };
    let sampling = Sampling {
        temperature: num("temperature")?,
        top_p: num("top_p")?,
        top_k: match body.get("top_k") {
            None | Some(Value::Null) => None,
            Some(v) => {
                Some(v.as_i64().ok_or_else(|| GatewayError::invalid_param("top_k", "top_k: must be an integer"))?)
            }
        },
        seed: None,
    };
    let stop = match body.get("stop_sequences") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(items)) if items.iter().all(Value::is_string) => {
            items.iter().filter_map(Value::as_str).map(str::to_owned).collect()
        }
        Some(_) => {
            return Err(GatewayError::invalid_param("stop_sequences", "stop_sequences: must be a list of strings"));
        }
    };
    let stream = match (endpoint, body.get("stream")) {
        (Endpoint::CountTokens, _) | (_, None | Some(Value::Null)) => false,
        (_, Some(Value::Bool(b))) => *b,
        (_, Some(_)) => return Err(GatewayError::invalid_param("stream", "stream: must be a boolean")),
    };
    let mut req = InferenceRequest::new(Dialect::Anthropic, model, Prompt::Chat { messages, tools, tool_choice });
    req.sampling = sampling;
    req.stop = stop;
    req.max_tokens = max_tokens;
    req.stream = stream;
    Ok(req)
}

/// One Messages turn → typed messages: tool results become tool messages (placed first, as
/// they answer the preceding assistant turn), other blocks stay in one message.
fn conversation_turn(i: usize, v: &Value, out: &mut Vec<Message>) -> Result<(), GatewayError> {
    let param = format!("messages.{i}");
    let role = match v.get("role").and_then(Value::as_str) {
        Some("user") => Role::User,
        Some("assistant") => Role::Assistant,
        Some(other) => {
            return Err(GatewayError::invalid_param(
                &format!("{param}.role"),
                format!("{param}.role: unknown role `{other}`"),
            ));
        }
        None => {
            return Err(GatewayError::invalid_param(&format!("{param}.role"), format!("{param}.role: Field required")));
        }
    };
    let blocks = match v.get("content") {
        Some(Value::String(s)) => {
            out.push(Message::text(role, s.clone()));
            return Ok(());
        }
        Some(Value::Array(blocks)) => blocks,
        _ => {
            return Err(GatewayError::invalid_param(
                &format!("{param}.content"),
                format!("{param}.content: must be a string or a list of content blocks"),
            ));
        }
    };
    let mut parts = Vec::new();
    let mut calls = Vec::new();
    for (j, b) in blocks.iter().enumerate() {
        let bp = format!("{param}.content.{j}");
        match b.get("type").and_then(Value::as_str) {
            Some("text") => parts.push(Part::Text(
                b.get("text")
                    .and_then(Value::as_str)
                    .ok_or_else(|| GatewayError::invalid_param(&bp, format!("{bp}.text: Field required")))?
                    .to_owned(),
            )),
            Some("image") => {
                let src = b.get("source").unwrap_or(&Value::Null);
                let url = match src.get("type").and_then(Value::as_str) {
                    Some("base64") => format!(
                        "data:{};base64,{}",
                        src.get("media_type").and_then(Value::as_str).unwrap_or("image/png"),
                        src.get("data").and_then(Value::as_str).unwrap_or("")
                    ),
                    Some("url") => src.get("url").and_then(Value::as_str).unwrap_or("").to_owned(),
                    _ => {
                        return Err(GatewayError::invalid_param(&bp, format!("{bp}.source: unsupported image source")));
                    }
                };
                parts.push(Part::ImageUrl(url));
            }
            Some("tool_use") if role == Role::Assistant => {
                let id = b.get("id").and_then(Value::as_str).unwrap_or_default().to_owned();
                let name = b
                    .get("name")
                    .and_then(Value::as_str)
                    .ok_or_else(|| GatewayError::invalid_param(&bp, format!("{bp}.name: Field required")))?;
                let input = b.get("input").cloned().unwrap_or_else(|| json!({}));
                calls.push(ToolCall { id, name: name.to_owned(), arguments: input.to_string() });
            }
            Some("tool_result") if role == Role::User => {
                let id = b
                    .get("tool_use_id")
                    .and_then(Value::as_str)
                    .ok_or_else(|| GatewayError::invalid_param(&bp, format!("{bp}.tool_use_id: Field required")))?;
                let text = match b.get("content") {
                    None | Some(Value::Null) => String::new(),
                    Some(Value::String(s)) => s.clone(),
                    Some(Value::Array(inner)) => inner
                        .iter()
                        .filter(|x| x.get("type").and_then(Value::as_str) == Some("text"))
                        .filter_map(|x| x.get("text").and_then(Value::as_str))
                        .collect::<Vec<_>>()
                        .join("\n"),
                    Some(_) => {
                        return Err(GatewayError::invalid_param(
                            &bp,
                            format!("{bp}.content: must be a string or blocks"),
                        ));
                    }
                };
                out.push(Message {
                    role: Role::Tool,
                    content: Some(Content::Text(text)),
                    tool_calls: Vec::new(),
                    tool_call_id: Some(id.to_owned()),
                    name: None,
                });
            }
            // Thinking from earlier turns is not shown to open-weight engines.
            Some("thinking" | "redacted_thinking") => {}
            Some(other) => {
                return Err(GatewayError::invalid_param(
                    &bp,
                    format!("{bp}: unsupported content block type `{other}`"),
                ));
            }
            None => return Err(GatewayError::invalid_param(&bp, format!("{bp}.type: Field required"))),
        }
    }
    if !parts.is_empty() || !calls.is_empty() {
        // One text part is sent as a plain string: chat templates render it identically to an
        // OpenAI client's string content, so both dialects share cached prefixes.
        let content = match parts.as_slice() {
            [] => None,
            [Part::Text(t)] => Some(Content::Text(t.clone())),
            _ if parts.iter().all(|p| matches!(p, Part::Text(_))) => Some(Content::Text(
                parts.iter().filter_map(|p| if let Part::Text(t) = p { Some(t.as_str()) } else { None }).collect(),
            )),
            _ => Some(Content::Parts(parts)),
        };
        out.push(Message { role, content, tool_calls: calls, tool_call_id: None, name: None });
    }
    Ok(())
}

fn tool(i: usize, v: &Value) -> Result<Tool, GatewayError> {
    let p = format!("tools.{i}");
    let name = v
        .get("name")
        .and_then(Value::as_str)
        .filter(|n| !n.is_empty())
        .ok_or_else(|| GatewayError::invalid_param(&p, format!("{p}.name: Field required")))?;
    let schema = v
        .get("input_schema")
        .filter(|s| s.is_object())
        .ok_or_else(|| GatewayError::invalid_param(&p, format!("{p}.input_schema: Field required")))?;
    Ok(Tool {
        name: name.to_owned(),
        description: v.get("description").and_then(Value::as_str).map(str::to_owned),
        parameters: schema.clone(),
    })
}

/// Anthropic usage from engine usage: `input_tokens` excludes cache reads and writes, which
/// are reported apart.
pub fn usage_json(u: &Usage) -> Value {
    json!({
        "input_tokens": u.prompt_tokens.saturating_sub(u.cached_tokens).saturating_sub(u.cache_write_tokens),
        "output_tokens": u.completion_tokens,
        "cache_creation_input_tokens": u.cache_write_tokens,
        "cache_read_input_tokens": u.cached_tokens,
    })
}

/// The message id the client sees.
fn message_id(req: &InferenceRequest) -> String {
    format!("msg_{}", req.id)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Block {
    Text,
    Tool(u32),
}

/// Renders a streaming response as Messages SSE.
#[derive(Debug)]
pub struct StreamRenderer {
    id: String,
    model: String,
    predicted_input: u32,
    started: bool,
    open: Option<Block>,
    next_index: u32,
    finish: Option<FinishReason>,
    usage: Option<Usage>,
}

fn sse(out: &mut String, name: &str, data: &Value) {
    out.push_str("event: ");
    out.push_str(name);
    out.push_str("\ndata: ");
    out.push_str(&data.to_string());
    out.push_str("\n\n");
}

impl StreamRenderer {
    /// A renderer for one response; `predicted_input` is the router's prompt-token count,
    /// shown in `message_start` until the engine's usage arrives.
    pub fn new(req: &InferenceRequest, predicted_input: u32) -> StreamRenderer {
        StreamRenderer {
            id: message_id(req),
            model: req.model.clone(),
            predicted_input,
            started: false,
            open: None,
            next_index: 0,
            finish: None,
            usage: None,
        }
    }

    /// `message_start` and a first `ping` (sent as soon as the upstream answered).
    pub fn start(&mut self, out: &mut String) {
        if self.started {
            return;
        }
        self.started = true;
        sse(
            out,
            "message_start",
            &json!({"type": "message_start", "message": {
                "id": self.id, "type": "message", "role": "assistant", "model": self.model, "content": [],
                "stop_reason": null, "stop_sequence": null,
                "usage": {"input_tokens": self.predicted_input, "output_tokens": 0,
                          "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}}}),
        );
        sse(out, "ping", &json!({"type": "ping"}));
    }

    fn close_block(&mut self, out: &mut String) {
        if self.open.take().is_some() {
            sse(out, "content_block_stop", &json!({"type": "content_block_stop", "index": self.next_index - 1}));
        }
    }

    fn open_block(&mut self, block: Block, start: Value, out: &mut String) {
        self.close_block(out);
        self.open = Some(block);
        sse(
            out,
            "content_block_start",
            &json!({"type": "content_block_start", "index": self.next_index, "content_block": start}),
        );
        self.next_index += 1;
    }

    /// Renders one event.
    pub fn event(&mut self, event: &Event, out: &mut String) {
        self.start(out);
        match event {
            Event::Text(t) => {
                if self.open != Some(Block::Text) {
                    self.open_block(Block::Text, json!({"type": "text", "text": ""}), out);
                }
                // The per-token hot path, rendered without building a JSON tree.
                out.push_str("event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":");
                out.push_str(&(self.next_index - 1).to_string());
                out.push_str(",\"delta\":{\"type\":\"text_delta\",\"text\":");
                out.push_str(&serde_json::to_string(t).unwrap_or_else(|_| "\"\"".to_owned()));
                out.push_str("}}\n\n");
            }
            Event::ToolCall { index, id, name, arguments } => {
                if self.open != Some(Block::Tool(*index)) {
                    let id = id.clone().unwrap_or_else(|| format!("toolu_{index}"));
                    let start =
                        json!({"type": "tool_use", "id": id, "name": name.clone().unwrap_or_default(), "input": {}});
                    self.open_block(Block::Tool(*index), start, out);
                }
                if !arguments.is_empty() {
                    sse(
                        out,
                        "content_block_delta",
                        &json!({"type": "content_block_delta", "index": self.next_index - 1,
                                "delta": {"type": "input_json_delta", "partial_json": arguments}}),
                    );
                }
            }
            Event::Finish(f) => self.finish = Some(f.clone()),
            Event::Usage(u) => self.usage = Some(*u),
        }
    }

    /// Renders the end of a complete stream: close the open block, `message_delta` with the
    /// stop reason and cumulative usage, `message_stop`.
    pub fn finish(&mut self, out: &mut String) {
        self.start(out);
        self.close_block(out);
        let finish = self.finish.clone().unwrap_or(FinishReason::Stop);
        let stop_sequence = match &finish {
            FinishReason::StopSequence(s) => json!(s),
            _ => Value::Null,
        };
        let usage = self.usage.as_ref().map(usage_json).unwrap_or_else(|| json!({"output_tokens": 0}));
        sse(
            out,
            "message_delta",
            &json!({"type": "message_delta", "delta": {"stop_reason": finish.anthropic(), "stop_sequence": stop_sequence}, "usage": usage}),
        );
        sse(out, "message_stop", &json!({"type": "message_stop"}));
    }

    /// A keep-alive event.
    pub fn ping(out: &mut String) {
        sse(out, "ping", &json!({"type": "ping"}));
    }
}

/// Renders a whole (non-streaming) Message.
pub fn render_collected(req: &InferenceRequest, c: &Collected) -> Value {
    let mut content = Vec::new();
    if !c.text.is_empty() {
        content.push(json!({"type": "text", "text": c.text}));
    }
    for (id, name, args) in &c.tool_calls {
        let input: Value = serde_json::from_str(args).unwrap_or_else(|_| json!({}));
        content.push(json!({"type": "tool_use", "id": id, "name": name, "input": input}));
    }
    let finish = c.finish.clone().unwrap_or(FinishReason::Stop);
    let stop_sequence = match &finish {
        FinishReason::StopSequence(s) => json!(s),
        _ => Value::Null,
    };
    json!({
        "id": message_id(req), "type": "message", "role": "assistant", "model": req.model, "content": content,
        "stop_reason": finish.anthropic(), "stop_sequence": stop_sequence,
        "usage": usage_json(&c.usage.unwrap_or_default()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obj(v: Value) -> Map<String, Value> {
        v.as_object().cloned().unwrap_or_default()
    }

    #[test]
    fn messages_become_a_chat_conversation() {
        let body = obj(json!({
            "model": "m", "max_tokens": 10, "system": [{"type": "text", "text": "sys"}],
            "messages": [
                {"role": "user", "content": "what is 6*7?"},
                {"role": "assistant", "content": [{"type": "text", "text": "calling"}, {"type": "tool_use", "id": "t1", "name": "calc", "input": {"x": 6}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "42"}, {"type": "text", "text": "thanks"}]}],
            "tools": [{"name": "calc", "input_schema": {"type": "object"}}],
            "tool_choice": {"type": "any"}}));
        let req = parse(Endpoint::Messages, "2023-06-01", body).expect("valid");
        let Prompt::Chat { messages, tools, tool_choice } = &req.prompt else { panic!("chat") };
        let roles: Vec<Role> = messages.iter().map(|m| m.role).collect();
        assert_eq!(roles, [Role::System, Role::User, Role::Assistant, Role::Tool, Role::User]);
        assert_eq!(messages[2].tool_calls[0].arguments, r#"{"x":6}"#);
        assert_eq!(messages[3].tool_call_id.as_deref(), Some("t1"));
        assert_eq!(tools.len(), 1);
        assert_eq!(tool_choice, &Some(ToolChoice::Required));
    }

    #[test]
    fn version_2026_rejects_sampling_parameters() {
        let body =
            json!({"model": "m", "max_tokens": 1, "temperature": 0.5, "messages": [{"role": "user", "content": "x"}]});
        assert!(parse(Endpoint::Messages, "2023-06-01", obj(body.clone())).is_ok());
        let e = parse(Endpoint::Messages, "2026-10-21", obj(body)).expect_err("removed in 2026-10-21");
        assert_eq!(e.param.as_deref(), Some("temperature"));
        assert!(check_version(Some("2099-01-01")).is_err());
    }

    #[test]
    fn stream_events_follow_the_sdk_rules() {
        let req =
            InferenceRequest::new(Dialect::Anthropic, "m", Prompt::Text(crate::request::TextPrompt::Tokens(vec![])));
        let mut r = StreamRenderer::new(&req, 10);
        let mut out = String::new();
        for e in [
            Event::Text("Hel".into()),
            Event::Text("lo".into()),
            Event::ToolCall { index: 0, id: Some("t".into()), name: Some("f".into()), arguments: "{\"a\"".into() },
            Event::ToolCall { index: 0, id: None, name: None, arguments: ":1}".into() },
            Event::Finish(FinishReason::ToolCalls),
            Event::Usage(Usage { prompt_tokens: 10, completion_tokens: 4, cached_tokens: 6, ..Usage::default() }),
        ] {
            r.event(&e, &mut out);
        }
        r.finish(&mut out);
        let events: Vec<(String, Value)> = out
            .split("\n\n")
            .filter(|s| !s.is_empty())
            .map(|s| {
                let mut lines = s.lines();
                let name = lines.next().and_then(|l| l.strip_prefix("event: ")).expect("event line").to_owned();
                let data = lines.next().and_then(|l| l.strip_prefix("data: ")).expect("data line");
                (name, serde_json::from_str(data).expect("json"))
            })
            .collect();
        let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "message_start",
                "ping",
                "content_block_start",
                "content_block_delta",
                "content_block_delta",
                "content_block_stop",
                "content_block_start",
                "content_block_delta",
                "content_block_delta",
                "content_block_stop",
                "message_delta",
                "message_stop"
            ]
        );
        assert_eq!(events[0].1["message"]["content"], json!([]));
        assert_eq!(events[6].1["content_block"]["input"], json!({}));
        let delta = &events[10].1;
        assert_eq!(delta["delta"]["stop_reason"], "tool_use");
        assert_eq!(delta["usage"]["output_tokens"], 4);
        assert_eq!(delta["usage"]["input_tokens"], 4);
        assert_eq!(delta["usage"]["cache_read_input_tokens"], 6);
    }
}
