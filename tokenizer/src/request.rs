//! The tokens of an OpenAI request body, as the engine serving it computes them.
//!
//! Shared by the spoke (which routes to a worker by these tokens) and the hub (which chooses
//! a cluster by them): both tokenize the very body the engine will be sent, with the same
//! files the engine loads, so their block hashes agree with the engine's KV events.

use std::path::Path;

use serde_json::{Map, Value};

use crate::EngineTokenizer;

/// Which OpenAI API a request uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    /// `/v1/chat/completions`.
    Chat,
    /// `/v1/completions`.
    Completion,
}

/// Why a request's tokens could not be computed.
#[derive(Debug, thiserror::Error)]
pub enum TokenizeError {
    /// The request itself is malformed (client error).
    #[error("{0}")]
    BadRequest(String),
    /// No tokenizer is available (configuration or engine problem).
    #[error("tokenizer unavailable: {0}")]
    Unavailable(String),
}

/// Loads a worker set's `Files` tokenizer: the Hugging Face directory, and the chat template
/// file that overrides the directory's when one is configured.
pub fn load_files(dir: &Path, chat_template: Option<&Path>) -> Result<EngineTokenizer, TokenizeError> {
    let mut t = EngineTokenizer::from_dir(dir).map_err(|e| TokenizeError::Unavailable(e.to_string()))?;
    if let Some(template) = chat_template {
        let text = std::fs::read_to_string(template)
            .map_err(|e| TokenizeError::Unavailable(format!("{}: {e}", template.display())))?;
        t = t.with_chat_template(text).map_err(|e| TokenizeError::Unavailable(e.to_string()))?;
    }
    Ok(t)
}

/// Tokens of `body` (CPU work: callers run it off the async threads).
pub fn body_tokens(t: &EngineTokenizer, api: Api, body: &Map<String, Value>) -> Result<Vec<u32>, TokenizeError> {
    let flag = |k: &str, default: bool| body.get(k).and_then(Value::as_bool).unwrap_or(default);
    match api {
        Api::Chat => {
            let messages = body
                .get("messages")
                .and_then(Value::as_array)
                .ok_or_else(|| TokenizeError::BadRequest("`messages` must be a list".into()))?;
            let kwargs = body.get("chat_template_kwargs").and_then(Value::as_object);
            t.encode_chat(
                messages,
                flag("add_generation_prompt", true),
                flag("continue_final_message", false),
                body.get("tools"),
                kwargs,
                flag("add_special_tokens", false),
            )
            .map_err(|e| TokenizeError::BadRequest(e.to_string()))
        }
        Api::Completion => match body.get("prompt") {
            Some(Value::String(text)) => t
                .encode_prompt(text, flag("add_special_tokens", true))
                .map_err(|e| TokenizeError::BadRequest(e.to_string())),
            Some(Value::Array(items)) if items.iter().all(Value::is_u64) => {
                Ok(items.iter().filter_map(Value::as_u64).map(|v| v as u32).collect())
            }
            _ => Err(TokenizeError::BadRequest("`prompt` must be a string or a list of token ids".into())),
        },
    }
}
