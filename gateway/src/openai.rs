//! The OpenAI dialect: `/v1/chat/completions` and `/v1/completions` bodies into
//! [`InferenceRequest`], typed events back into OpenAI JSON and SSE chunks, and the request
//! body an OpenAI-compatible upstream (a vLLM worker) is sent.
//!
//! Invariants: parsing never panics and names the parameter at fault; fields the typed form
//! does not model are kept in `passthrough` and forwarded; the upstream body is a pure
//! function of the typed request and the served model name, so the tokens a router computes
//! from it are the tokens the engine computes.

use serde_json::{Map, Value, json};

use crate::error::GatewayError;
use crate::event::{Collected, Event, FinishReason, Usage};
use crate::request::{
    Content, Dialect, InferenceRequest, Message, Part, Prompt, Role, Sampling, TextPrompt, Tool, ToolCall, ToolChoice,
};

/// Which OpenAI endpoint a body was sent to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    /// `/v1/chat/completions`.
    Chat,
    /// `/v1/completions`.
    Completions,
}

/// Fields the typed form models (everything else is passthrough).
const MODELED: &[&str] = &[
    "model",
    "messages",
    "prompt",
    "tools",
    "tool_choice",
    "temperature",
    "top_p",
    "top_k",
    "seed",
    "stop",
    "max_tokens",
    "max_completion_tokens",
    "stream",
    "stream_options",
    "n",
];

/// Parses an OpenAI request body.
pub fn parse(endpoint: Endpoint, body: Map<String, Value>) -> Result<InferenceRequest, GatewayError> {
    let model = match body.get("model") {
        Some(Value::String(m)) if !m.is_empty() => m.clone(),
        Some(_) => return Err(GatewayError::invalid_param("model", "`model` must be a non-empty string")),
        None => return Err(GatewayError::invalid_param("model", "`model` is required")),
    };
    let prompt = match endpoint {
        Endpoint::Chat => {
            let messages = match body.get("messages") {
                Some(Value::Array(items)) if !items.is_empty() => {
                    items.iter().enumerate().map(|(i, m)| message(i, m)).collect::<Result<Vec<_>, _>>()?
                }
                Some(Value::Array(_)) => {
                    return Err(GatewayError::invalid_param("messages", "`messages` must not be empty"));
                }
                Some(_) => return Err(GatewayError::invalid_param("messages", "`messages` must be a list")),
                None => return Err(GatewayError::invalid_param("messages", "`messages` is required")),
            };
            let tools = match body.get("tools") {
                None | Some(Value::Null) => Vec::new(),
                Some(Value::Array(items)) => {
                    items.iter().enumerate().map(|(i, t)| tool(i, t)).collect::<Result<_, _>>()?
                }
                Some(_) => return Err(GatewayError::invalid_param("tools", "`tools` must be a list")),
            };
            let tool_choice = body.get("tool_choice").map(tool_choice).transpose()?;
            Prompt::Chat { messages, tools, tool_choice }
        }
        Endpoint::Completions => Prompt::Text(match body.get("prompt") {
            Some(Value::String(s)) => TextPrompt::String(s.clone()),
            Some(Value::Array(items)) if !items.is_empty() && items.iter().all(Value::is_u64) => {
                let ids: Option<Vec<u32>> =
                    items.iter().map(|v| v.as_u64().and_then(|n| u32::try_from(n).ok())).collect();
                TextPrompt::Tokens(
                    ids.ok_or_else(|| GatewayError::invalid_param("prompt", "a token id is out of range"))?,
                )
            }
            Some(Value::Array(items)) if items.len() == 1 && items[0].is_string() => {
                TextPrompt::String(items[0].as_str().unwrap_or_default().to_owned())
            }
            Some(_) => {
                return Err(GatewayError::invalid_param(
                    "prompt",
                    "`prompt` must be a string or a list of token ids (batched prompts are not supported)",
                ));
            }
            None => return Err(GatewayError::invalid_param("prompt", "`prompt` is required")),
        }),
    };
    if let Some(n) = body.get("n")
        && n.as_u64() != Some(1)
        && !n.is_null()
    {
        return Err(GatewayError::invalid_param("n", "only `n: 1` is supported"));
    }
    let sampling = Sampling {
        temperature: opt_f64(&body, "temperature")?,
        top_p: opt_f64(&body, "top_p")?,
        top_k: opt_i64(&body, "top_k")?,
        seed: opt_i64(&body, "seed")?,
    };
    let stop = match body.get("stop") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(items)) if items.iter().all(Value::is_string) => {
            items.iter().filter_map(Value::as_str).map(str::to_owned).collect()
        }
        Some(_) => return Err(GatewayError::invalid_param("stop", "`stop` must be a string or a list of strings")),
    };
    let max_tokens = match (opt_u32(&body, "max_completion_tokens")?, opt_u32(&body, "max_tokens")?) {
        (Some(a), _) => Some(a),
        (None, b) => b,
    };
    let stream = match body.get("stream") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(GatewayError::invalid_param("stream", "`stream` must be a boolean")),
    };
    let stream_usage = match body.get("stream_options") {
        None | Some(Value::Null) => false,
        Some(Value::Object(o)) => match o.get("include_usage") {
            None | Some(Value::Null) => false,
            Some(Value::Bool(b)) => *b,
            Some(_) => {
                return Err(GatewayError::invalid_param(
                    "stream_options.include_usage",
                    "`include_usage` must be a boolean",
                ));
            }
        },
        Some(_) => return Err(GatewayError::invalid_param("stream_options", "`stream_options` must be an object")),
    };
    let mut passthrough = body;
    passthrough.retain(|k, _| !MODELED.contains(&k.as_str()));
    let mut req = InferenceRequest::new(Dialect::OpenAi, model, prompt);
    req.sampling = sampling;
    req.stop = stop;
    req.max_tokens = max_tokens;
    req.stream = stream;
    req.stream_usage = stream_usage;
    req.passthrough = passthrough;
    Ok(req)
}

fn opt_f64(body: &Map<String, Value>, key: &str) -> Result<Option<f64>, GatewayError> {
    match body.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => {
            v.as_f64().map(Some).ok_or_else(|| GatewayError::invalid_param(key, format!("`{key}` must be a number")))
        }
    }
}

fn opt_i64(body: &Map<String, Value>, key: &str) -> Result<Option<i64>, GatewayError> {
    match body.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => {
            v.as_i64().map(Some).ok_or_else(|| GatewayError::invalid_param(key, format!("`{key}` must be an integer")))
        }
    }
}

fn opt_u32(body: &Map<String, Value>, key: &str) -> Result<Option<u32>, GatewayError> {
    match body.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => match v.as_u64() {
            Some(n) if n >= 1 => Ok(Some(u32::try_from(n).unwrap_or(u32::MAX))),
            _ => Err(GatewayError::invalid_param(key, format!("`{key}` must be a positive integer"))),
        },
    }
}

fn message(i: usize, v: &Value) -> Result<Message, GatewayError> {
    let param = format!("messages[{i}]");
    let o = v.as_object().ok_or_else(|| GatewayError::invalid_param(&param, format!("`{param}` must be an object")))?;
    let role = match o.get("role").and_then(Value::as_str) {
        Some("system" | "developer") => Role::System,
        Some("user") => Role::User,
        Some("assistant") => Role::Assistant,
        Some("tool") => Role::Tool,
        Some(other) => {
            return Err(GatewayError::invalid_param(&format!("{param}.role"), format!("unknown role `{other}`")));
        }
        None => return Err(GatewayError::invalid_param(&format!("{param}.role"), "`role` is required")),
    };
    let content = match o.get("content") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(Content::Text(s.clone())),
        Some(Value::Array(parts)) => Some(Content::Parts(
            parts
                .iter()
                .enumerate()
                .map(|(j, p)| part(&format!("{param}.content[{j}]"), p))
                .collect::<Result<_, _>>()?,
        )),
        Some(_) => {
            return Err(GatewayError::invalid_param(
                &format!("{param}.content"),
                "`content` must be a string or a list of parts",
            ));
        }
    };
    let tool_calls = match o.get("tool_calls") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(calls)) => calls
            .iter()
            .enumerate()
            .map(|(j, c)| {
                let p = format!("{param}.tool_calls[{j}]");
                let id = c.get("id").and_then(Value::as_str).unwrap_or_default().to_owned();
                let f = c.get("function").ok_or_else(|| GatewayError::invalid_param(&p, "`function` is required"))?;
                let name = f
                    .get("name")
                    .and_then(Value::as_str)
                    .ok_or_else(|| GatewayError::invalid_param(&p, "`function.name` must be a string"))?;
                let arguments = match f.get("arguments") {
                    Some(Value::String(s)) => s.clone(),
                    None | Some(Value::Null) => "{}".to_owned(),
                    Some(other) => other.to_string(),
                };
                Ok(ToolCall { id, name: name.to_owned(), arguments })
            })
            .collect::<Result<_, GatewayError>>()?,
        Some(_) => {
            return Err(GatewayError::invalid_param(&format!("{param}.tool_calls"), "`tool_calls` must be a list"));
        }
    };
    if content.is_none() && tool_calls.is_empty() && role != Role::Assistant {
        return Err(GatewayError::invalid_param(&format!("{param}.content"), "`content` is required"));
    }
    let text_field = |k: &str| -> Result<Option<String>, GatewayError> {
        match o.get(k) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(_) => Err(GatewayError::invalid_param(&format!("{param}.{k}"), format!("`{k}` must be a string"))),
        }
    };
    Ok(Message { role, content, tool_calls, tool_call_id: text_field("tool_call_id")?, name: text_field("name")? })
}

fn part(param: &str, v: &Value) -> Result<Part, GatewayError> {
    match v.get("type").and_then(Value::as_str) {
        Some("text") => v
            .get("text")
            .and_then(Value::as_str)
            .map(|t| Part::Text(t.to_owned()))
            .ok_or_else(|| GatewayError::invalid_param(param, "a text part needs a string `text`")),
        Some("image_url") => v
            .pointer("/image_url/url")
            .and_then(Value::as_str)
            .map(|u| Part::ImageUrl(u.to_owned()))
            .ok_or_else(|| GatewayError::invalid_param(param, "an image_url part needs `image_url.url`")),
        Some(other) => Err(GatewayError::invalid_param(param, format!("unsupported content part type `{other}`"))),
        None => Err(GatewayError::invalid_param(param, "a content part needs a `type`")),
    }
}

fn tool(i: usize, v: &Value) -> Result<Tool, GatewayError> {
    let param = format!("tools[{i}]");
    if v.get("type").and_then(Value::as_str) != Some("function") {
        return Err(GatewayError::invalid_param(&param, "only `function` tools are supported"));
    }
    let f = v
        .get("function")
        .and_then(Value::as_object)
        .ok_or_else(|| GatewayError::invalid_param(&param, "`function` must be an object"))?;
    let name = f
        .get("name")
        .and_then(Value::as_str)
        .filter(|n| !n.is_empty())
        .ok_or_else(|| GatewayError::invalid_param(&format!("{param}.function.name"), "`name` must be a string"))?;
    Ok(Tool {
        name: name.to_owned(),
        description: f.get("description").and_then(Value::as_str).map(str::to_owned),
        parameters: f.get("parameters").cloned().unwrap_or_else(|| json!({"type": "object", "properties": {}})),
    })
}

fn tool_choice(v: &Value) -> Result<ToolChoice, GatewayError> {
    match v {
        Value::String(s) => match s.as_str() {
            "auto" => Ok(ToolChoice::Auto),
            "none" => Ok(ToolChoice::None),
            "required" => Ok(ToolChoice::Required),
            other => Err(GatewayError::invalid_param("tool_choice", format!("unknown tool_choice `{other}`"))),
        },
        Value::Object(_) => v
            .pointer("/function/name")
            .and_then(Value::as_str)
            .map(|n| ToolChoice::Function(n.to_owned()))
            .ok_or_else(|| GatewayError::invalid_param("tool_choice", "`tool_choice.function.name` is required")),
        _ => Err(GatewayError::invalid_param("tool_choice", "`tool_choice` must be a string or an object")),
    }
}

/// The message list as OpenAI JSON (what chat templates render).
pub fn messages_json(messages: &[Message]) -> Vec<Value> {
    messages.iter().map(message_json).collect()
}

fn message_json(m: &Message) -> Value {
    let mut o = Map::new();
    o.insert("role".into(), json!(m.role.as_str()));
    o.insert(
        "content".into(),
        match &m.content {
            None => Value::Null,
            Some(Content::Text(t)) => json!(t),
            Some(Content::Parts(parts)) => Value::Array(
                parts
                    .iter()
                    .map(|p| match p {
                        Part::Text(t) => json!({"type": "text", "text": t}),
                        Part::ImageUrl(u) => json!({"type": "image_url", "image_url": {"url": u}}),
                    })
                    .collect(),
            ),
        },
    );
    if !m.tool_calls.is_empty() {
        o.insert(
            "tool_calls".into(),
            m.tool_calls
                .iter()
                .map(
                    |c| json!({"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}),
                )
                .collect(),
        );
    }
    if let Some(id) = &m.tool_call_id {
        o.insert("tool_call_id".into(), json!(id));
    }
    if let Some(n) = &m.name {
        o.insert("name".into(), json!(n));
    }
    Value::Object(o)
}

/// Tools as OpenAI JSON.
pub fn tools_json(tools: &[Tool]) -> Value {
    tools
        .iter()
        .map(|t| {
            let mut f = json!({"name": t.name, "parameters": t.parameters});
            if let Some(d) = &t.description {
                f["description"] = json!(d);
            }
            json!({"type": "function", "function": f})
        })
        .collect()
}

/// The body an OpenAI-compatible upstream is sent: always streaming with usage, so one relay
/// serves streaming and non-streaming clients and every response is metered.
pub fn upstream_body(req: &InferenceRequest, served_model: &str) -> Map<String, Value> {
    let mut b = req.passthrough.clone();
    b.insert("model".into(), json!(served_model));
    match &req.prompt {
        Prompt::Chat { messages, tools, tool_choice } => {
            b.insert("messages".into(), Value::Array(messages_json(messages)));
            if !tools.is_empty() {
                b.insert("tools".into(), tools_json(tools));
            }
            if let Some(c) = tool_choice {
                b.insert(
                    "tool_choice".into(),
                    match c {
                        ToolChoice::Auto => json!("auto"),
                        ToolChoice::None => json!("none"),
                        ToolChoice::Required => json!("required"),
                        ToolChoice::Function(n) => json!({"type": "function", "function": {"name": n}}),
                    },
                );
            }
        }
        Prompt::Text(TextPrompt::String(s)) => {
            b.insert("prompt".into(), json!(s));
        }
        Prompt::Text(TextPrompt::Tokens(t)) => {
            b.insert("prompt".into(), json!(t));
        }
    }
    let s = &req.sampling;
    for (k, v) in [("temperature", s.temperature.map(|v| json!(v))), ("top_p", s.top_p.map(|v| json!(v)))] {
        if let Some(v) = v {
            b.insert(k.into(), v);
        }
    }
    if let Some(k) = s.top_k {
        b.insert("top_k".into(), json!(k));
    }
    if let Some(seed) = s.seed {
        b.insert("seed".into(), json!(seed));
    }
    if !req.stop.is_empty() {
        b.insert("stop".into(), json!(req.stop));
    }
    if let Some(m) = req.max_tokens {
        b.insert("max_tokens".into(), json!(m));
    }
    b.insert("stream".into(), json!(true));
    b.insert("stream_options".into(), json!({"include_usage": true}));
    b
}

/// Parses one upstream SSE `data:` payload (an OpenAI chunk) into events.
pub fn upstream_chunk(data: &str, out: &mut Vec<Event>) -> Result<(), GatewayError> {
    let v: Value = serde_json::from_str(data)
        .map_err(|e| GatewayError::upstream(format!("the upstream sent a malformed event: {e}")))?;
    if let Some(err) = v.get("error") {
        let msg = err.get("message").and_then(Value::as_str).unwrap_or("the upstream reported an error");
        return Err(GatewayError::upstream(msg.to_owned()));
    }
    if let Some(choice) = v.get("choices").and_then(Value::as_array).and_then(|c| c.first()) {
        let delta = choice.get("delta");
        let text = delta.and_then(|d| d.get("content")).or_else(|| choice.get("text")).and_then(Value::as_str);
        if let Some(t) = text
            && !t.is_empty()
        {
            out.push(Event::Text(t.to_owned()));
        }
        if let Some(calls) = delta.and_then(|d| d.get("tool_calls")).and_then(Value::as_array) {
            for (pos, c) in calls.iter().enumerate() {
                let index = c.get("index").and_then(Value::as_u64).unwrap_or(pos as u64) as u32;
                let f = c.get("function");
                out.push(Event::ToolCall {
                    index,
                    id: c.get("id").and_then(Value::as_str).map(str::to_owned),
                    name: f.and_then(|f| f.get("name")).and_then(Value::as_str).map(str::to_owned),
                    arguments: f.and_then(|f| f.get("arguments")).and_then(Value::as_str).unwrap_or("").to_owned(),
                });
            }
        }
        if let Some(reason) = choice.get("finish_reason").and_then(Value::as_str) {
            out.push(Event::Finish(match reason {
                "stop" => match choice.get("stop_reason") {
                    Some(Value::String(s)) => FinishReason::StopSequence(Some(s.clone())),
                    _ => FinishReason::Stop,
                },
                "length" => FinishReason::Length,
                "tool_calls" => FinishReason::ToolCalls,
                "content_filter" => FinishReason::ContentFilter,
                other => FinishReason::Other(other.to_owned()),
            }));
        }
    }
    if let Some(u) = v.get("usage").filter(|u| !u.is_null()) {
        let n = |p: &str| u.pointer(p).and_then(Value::as_u64).map(|v| v.min(u64::from(u32::MAX)) as u32).unwrap_or(0);
        out.push(Event::Usage(Usage {
            prompt_tokens: n("/prompt_tokens"),
            completion_tokens: n("/completion_tokens"),
            cached_tokens: n("/prompt_tokens_details/cached_tokens"),
            cache_write_tokens: 0,
        }));
    }
    Ok(())
}

fn usage_json(u: &Usage) -> Value {
    json!({
        "prompt_tokens": u.prompt_tokens,
        "completion_tokens": u.completion_tokens,
        "total_tokens": u.prompt_tokens + u.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": u.cached_tokens},
    })
}

/// Renders a streaming response as OpenAI SSE, event by event.
#[derive(Debug)]
pub struct StreamRenderer {
    endpoint: Endpoint,
    id: String,
    model: String,
    created: u64,
    include_usage: bool,
    started: bool,
    tool_calls_seen: u32,
    /// `data: {"id":…,"object":…,"created":…,"model":…,"choices":[`, rendered once.
    prefix: String,
}

/// `s` as a JSON string literal.
fn json_str(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| "\"\"".to_owned())
}

impl StreamRenderer {
    /// A renderer for one response.
    pub fn new(endpoint: Endpoint, req: &InferenceRequest, created: u64) -> StreamRenderer {
        let id_prefix = if endpoint == Endpoint::Chat { "chatcmpl-" } else { "cmpl-" };
        let id = format!("{id_prefix}{}", req.id);
        let object = if endpoint == Endpoint::Chat { "chat.completion.chunk" } else { "text_completion" };
        let prefix = format!(
            "data: {{\"id\":{},\"object\":\"{object}\",\"created\":{created},\"model\":{},\"choices\":[",
            json_str(&id),
            json_str(&req.model)
        );
        StreamRenderer {
            endpoint,
            id,
            model: req.model.clone(),
            created,
            include_usage: req.stream_usage,
            started: false,
            tool_calls_seen: 0,
            prefix,
        }
    }

    /// A text delta, rendered without building a JSON tree (the per-token hot path).
    fn text_chunk(&self, text: &str, out: &mut String) {
        out.push_str(&self.prefix);
        match self.endpoint {
            Endpoint::Chat => out.push_str("{\"index\":0,\"delta\":{\"content\":"),
            Endpoint::Completions => out.push_str("{\"index\":0,\"text\":"),
        }
        out.push_str(&json_str(text));
        if self.endpoint == Endpoint::Chat {
            out.push('}');
        }
        out.push_str(",\"logprobs\":null,\"finish_reason\":null}]}\n\n");
    }

    fn chunk(&self, choice: Option<Value>, usage: Option<Value>, out: &mut String) {
        let object = if self.endpoint == Endpoint::Chat { "chat.completion.chunk" } else { "text_completion" };
        let mut v = json!({"id": self.id, "object": object, "created": self.created, "model": self.model,
                           "choices": choice.map(|c| vec![c]).unwrap_or_default()});
        if let Some(u) = usage {
            v["usage"] = u;
        }
        out.push_str("data: ");
        out.push_str(&v.to_string());
        out.push_str("\n\n");
    }

    fn choice(&self, delta: Value, finish: Option<&str>) -> Value {
        match self.endpoint {
            Endpoint::Chat => json!({"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish}),
            Endpoint::Completions => {
                json!({"index": 0, "text": delta.get("content").and_then(Value::as_str).unwrap_or(""),
                                            "logprobs": null, "finish_reason": finish})
            }
        }
    }

    fn ensure_started(&mut self, out: &mut String) {
        if !self.started {
            self.started = true;
            if self.endpoint == Endpoint::Chat {
                self.chunk(Some(self.choice(json!({"role": "assistant", "content": ""}), None)), None, out);
            }
        }
    }

    /// Renders one event.
    pub fn event(&mut self, event: &Event, out: &mut String) {
        self.ensure_started(out);
        match event {
            Event::Text(t) => self.text_chunk(t, out),
            Event::ToolCall { index, id, name, arguments } => {
                let mut call = json!({"index": index, "function": {"arguments": arguments}});
                if *index >= self.tool_calls_seen {
                    self.tool_calls_seen = index + 1;
                    call["id"] = json!(id.clone().unwrap_or_else(|| format!("call_{index}")));
                    call["type"] = json!("function");
                }
                if let Some(n) = name {
                    call["function"]["name"] = json!(n);
                }
                self.chunk(Some(self.choice(json!({"tool_calls": [call]}), None)), None, out);
            }
            Event::Finish(f) => self.chunk(Some(self.choice(json!({}), Some(f.openai()))), None, out),
            Event::Usage(u) => {
                if self.include_usage {
                    self.chunk(None, Some(usage_json(u)), out);
                }
            }
        }
    }

    /// Renders the end of a complete stream.
    pub fn finish(&mut self, out: &mut String) {
        self.ensure_started(out);
        out.push_str("data: [DONE]\n\n");
    }
}

/// Renders a whole (non-streaming) response.
pub fn render_collected(endpoint: Endpoint, req: &InferenceRequest, created: u64, c: &Collected) -> Value {
    let finish = c.finish.as_ref().map(FinishReason::openai).unwrap_or("stop");
    let usage = c.usage.as_ref().map(usage_json).unwrap_or(Value::Null);
    match endpoint {
        Endpoint::Chat => {
            let mut message = json!({"role": "assistant",
                                     "content": if c.text.is_empty() && !c.tool_calls.is_empty() { Value::Null } else { json!(c.text) }});
            if !c.tool_calls.is_empty() {
                message["tool_calls"] = c
                    .tool_calls
                    .iter()
                    .map(|(id, name, args)| json!({"id": id, "type": "function", "function": {"name": name, "arguments": args}}))
                    .collect();
            }
            json!({"id": format!("chatcmpl-{}", req.id), "object": "chat.completion", "created": created, "model": req.model,
                   "choices": [{"index": 0, "message": message, "logprobs": null, "finish_reason": finish}], "usage": usage})
        }
        Endpoint::Completions => json!({
            "id": format!("cmpl-{}", req.id), "object": "text_completion", "created": created, "model": req.model,
            "choices": [{"index": 0, "text": c.text, "logprobs": null, "finish_reason": finish}], "usage": usage}),
    }
}

/// The `/v1/models` list.
pub fn models_json(names: &[String]) -> Value {
    let data: Vec<Value> =
        names.iter().map(|n| json!({"id": n, "object": "model", "created": 0, "owned_by": "switchyard"})).collect();
    json!({"object": "list", "data": data})
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obj(v: Value) -> Map<String, Value> {
        v.as_object().cloned().unwrap_or_default()
    }

    #[test]
    fn chat_round_trips_into_the_upstream_body() {
        let body = obj(json!({
            "model": "m", "messages": [
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": [{"type": "text", "text": "hi"}]},
                {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{\"a\":1}"}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "42"}],
            "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
            "max_tokens": 5, "chat_template_kwargs": {"x": 1}, "stream": true}));
        let req = parse(Endpoint::Chat, body.clone()).expect("valid");
        assert!(req.stream);
        let up = upstream_body(&req, "served");
        assert_eq!(up["model"], "served");
        assert_eq!(up["messages"], body["messages"]);
        assert_eq!(up["chat_template_kwargs"], json!({"x": 1}));
        assert_eq!(up["stream_options"]["include_usage"], true);
    }

    #[test]
    fn wrong_types_name_the_parameter() {
        for (body, param) in [
            (json!({"model": 1, "messages": []}), "model"),
            (json!({"model": "m", "messages": "x"}), "messages"),
            (json!({"model": "m", "messages": [{"role": "user", "content": 3}]}), "messages[0].content"),
            (json!({"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": -1}), "max_tokens"),
            (json!({"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": "yes"}), "stream"),
        ] {
            let e = parse(Endpoint::Chat, obj(body)).expect_err("invalid");
            assert_eq!(e.param.as_deref(), Some(param));
        }
    }

    #[test]
    fn fast_text_chunks_equal_the_generic_rendering() {
        for endpoint in [Endpoint::Chat, Endpoint::Completions] {
            let req = InferenceRequest::new(Dialect::OpenAi, "m\"x", Prompt::Text(TextPrompt::String(String::new())));
            let mut r = StreamRenderer::new(endpoint, &req, 7);
            r.started = true;
            let (mut fast, mut slow) = (String::new(), String::new());
            r.text_chunk("a \"q\"\n\u{1F600}", &mut fast);
            r.chunk(Some(r.choice(json!({"content": "a \"q\"\n\u{1F600}"}), None)), None, &mut slow);
            let parse = |s: &str| serde_json::from_str::<Value>(s.trim().trim_start_matches("data: ")).expect("json");
            assert_eq!(parse(&fast), parse(&slow));
        }
    }

    #[test]
    fn upstream_chunks_become_events() {
        let mut ev = Vec::new();
        upstream_chunk(r#"{"choices":[{"index":0,"delta":{"content":"Hi"},"finish_reason":null}]}"#, &mut ev)
            .expect("ok");
        upstream_chunk(
            r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"t1","type":"function","function":{"name":"f","arguments":"{"}}]},"finish_reason":"tool_calls"}]}"#,
            &mut ev,
        )
        .expect("ok");
        upstream_chunk(r#"{"choices":[],"usage":{"prompt_tokens":10,"completion_tokens":2,"prompt_tokens_details":{"cached_tokens":8}}}"#, &mut ev)
            .expect("ok");
        assert_eq!(ev[0], Event::Text("Hi".into()));
        assert!(matches!(&ev[1], Event::ToolCall { index: 0, id: Some(i), .. } if i == "t1"));
        assert_eq!(ev[2], Event::Finish(FinishReason::ToolCalls));
        assert_eq!(
            ev[3],
            Event::Usage(Usage { prompt_tokens: 10, completion_tokens: 2, cached_tokens: 8, ..Usage::default() })
        );
    }
}
