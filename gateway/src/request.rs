//! The typed internal request: what every dialect parses into and every upstream is sent.
//!
//! Invariants:
//! - A request is immutable once parsed; the planning step reads it, upstreams render it.
//! - Message content keeps the shape the client sent (one string or a list of parts), because
//!   chat templates render the two differently and the engine sees what the client sent.
//! - `passthrough` holds OpenAI fields the typed form does not model (e.g. vLLM's
//!   `chat_template_kwargs`); they reach an OpenAI-compatible upstream unchanged, so the
//!   tokens the router computes are the tokens the engine computes.

use std::collections::BTreeSet;

use serde_json::{Map, Value};
use switchyard_core::request::RequestClass;

/// Which API shape the client spoke.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Dialect {
    /// OpenAI `/v1/chat/completions`, `/v1/completions`, `/v1/models`.
    OpenAi,
    /// Anthropic `/v1/messages`.
    Anthropic,
}

/// What the model is asked to continue.
#[derive(Debug, Clone, PartialEq)]
pub enum Prompt {
    /// A conversation, rendered through the engine's chat template.
    Chat {
        /// The conversation, system prompt first when there is one.
        messages: Vec<Message>,
        /// Tools the model may call.
        tools: Vec<Tool>,
        /// Whether and which tool the model must call.
        tool_choice: Option<ToolChoice>,
    },
    /// A raw completion prompt (OpenAI `/v1/completions`).
    Text(TextPrompt),
}

/// A raw completion prompt.
#[derive(Debug, Clone, PartialEq)]
pub enum TextPrompt {
    /// A string, tokenized by the engine.
    String(String),
    /// Token ids, used as they are.
    Tokens(Vec<u32>),
}

/// Who wrote a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Instructions.
    System,
    /// The caller.
    User,
    /// The model.
    Assistant,
    /// A tool's result.
    Tool,
}

impl Role {
    /// The OpenAI name of the role.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::System => "system",
            Role::User => "user",
            Role::Assistant => "assistant",
            Role::Tool => "tool",
        }
    }
}

/// One message of a conversation.
#[derive(Debug, Clone, PartialEq)]
pub struct Message {
    /// Author.
    pub role: Role,
    /// Content; `None` for an assistant message that only calls tools.
    pub content: Option<Content>,
    /// Tool calls made by an assistant message.
    pub tool_calls: Vec<ToolCall>,
    /// For a tool message: the call it answers.
    pub tool_call_id: Option<String>,
    /// Optional participant name.
    pub name: Option<String>,
}

impl Message {
    /// A message with plain text content.
    pub fn text(role: Role, text: impl Into<String>) -> Message {
        Message {
            role,
            content: Some(Content::Text(text.into())),
            tool_calls: Vec::new(),
            tool_call_id: None,
            name: None,
        }
    }
}

/// Message content, in the shape the client sent it.
#[derive(Debug, Clone, PartialEq)]
pub enum Content {
    /// One string.
    Text(String),
    /// A list of parts.
    Parts(Vec<Part>),
}

impl Content {
    /// The text of every text part, joined.
    pub fn joined_text(&self) -> String {
        match self {
            Content::Text(t) => t.clone(),
            Content::Parts(parts) => parts
                .iter()
                .filter_map(|p| match p {
                    Part::Text(t) => Some(t.as_str()),
                    _ => None,
                })
                .collect(),
        }
    }
}

/// One content part.
#[derive(Debug, Clone, PartialEq)]
pub enum Part {
    /// Text.
    Text(String),
    /// An image, as a URL (`data:` URLs carry inline images).
    ImageUrl(String),
}

/// A tool definition.
#[derive(Debug, Clone, PartialEq)]
pub struct Tool {
    /// Function name.
    pub name: String,
    /// What it does.
    pub description: Option<String>,
    /// JSON schema of its arguments.
    pub parameters: Value,
}

/// Tool choice.
#[derive(Debug, Clone, PartialEq)]
pub enum ToolChoice {
    /// The model decides.
    Auto,
    /// No tool call.
    None,
    /// Some tool must be called.
    Required,
    /// This tool must be called.
    Function(String),
}

/// A tool call made by the model.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolCall {
    /// Call id, echoed by the tool result.
    pub id: String,
    /// Function name.
    pub name: String,
    /// Arguments as a JSON text.
    pub arguments: String,
}

/// Sampling parameters the typed form models; anything else stays in `passthrough`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Sampling {
    /// Temperature.
    pub temperature: Option<f64>,
    /// Nucleus sampling.
    pub top_p: Option<f64>,
    /// Top-k sampling.
    pub top_k: Option<i64>,
    /// Seed.
    pub seed: Option<i64>,
}

/// A request in the gateway's own terms.
#[derive(Debug, Clone, PartialEq)]
pub struct InferenceRequest {
    /// Unguessable id (also the decision id); see [`new_request_id`].
    pub id: String,
    /// The dialect the client spoke (responses and errors are rendered in it).
    pub dialect: Dialect,
    /// Requested model: a public name or an alias.
    pub model: String,
    /// What to continue.
    pub prompt: Prompt,
    /// Sampling.
    pub sampling: Sampling,
    /// Stop strings.
    pub stop: Vec<String>,
    /// Output token limit.
    pub max_tokens: Option<u32>,
    /// Stream the answer.
    pub stream: bool,
    /// OpenAI streaming: the client asked for a final usage chunk.
    pub stream_usage: bool,
    /// Authenticated tenant (set by admission, never by the client's body).
    pub tenant: Option<String>,
    /// Interactive or batch.
    pub class: RequestClass,
    /// Tags such as `pii`.
    pub tags: BTreeSet<String>,
    /// The worker set the caller pinned (`x-switchyard-worker-set`: the hub names the set it
    /// chose, and the spoke then picks the worker within it). It only narrows the choice:
    /// the spoke's policies still apply to the pinned set.
    pub worker_set: Option<String>,
    /// The hub's id for this request when a hub forwarded it (`x-switchyard-hub-request`),
    /// carried into the spoke's usage records.
    pub hub_request_id: Option<String>,
    /// OpenAI fields the typed form does not model, forwarded unchanged.
    pub passthrough: Map<String, Value>,
}

impl InferenceRequest {
    /// A request with defaults for everything but the prompt (tests, benches, calibrate).
    pub fn new(dialect: Dialect, model: impl Into<String>, prompt: Prompt) -> InferenceRequest {
        InferenceRequest {
            id: new_request_id(),
            dialect,
            model: model.into(),
            prompt,
            sampling: Sampling::default(),
            stop: Vec::new(),
            max_tokens: None,
            stream: false,
            stream_usage: false,
            tenant: None,
            class: RequestClass::Interactive,
            tags: BTreeSet::new(),
            worker_set: None,
            hub_request_id: None,
            passthrough: Map::new(),
        }
    }

    /// True for chat-shaped requests (they reach an engine's chat endpoint).
    pub fn is_chat(&self) -> bool {
        matches!(self.prompt, Prompt::Chat { .. })
    }
}

/// A fresh request id: 128 random bits, so ids name nothing about other requests.
pub fn new_request_id() -> String {
    uuid::Uuid::new_v4().simple().to_string()
}
