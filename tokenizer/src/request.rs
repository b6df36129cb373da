//! The tokens of an OpenAI request body, as the engine serving it computes them.
//!
//! Shared by the spoke (which routes to a worker by these tokens) and the hub (which chooses
//! a cluster by them): both tokenize the very body the engine will be sent, with the same
//! files the engine loads, so their block hashes agree with the engine's KV events.

use std::path::Path;

use serde_json::{Map, Value};

use crate::{EngineTokenizer, LeadingTokens, WantsMore};

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
    encode_body(t, api, body, None).map(|l| l.ids)
}

/// The leading tokens of `body`, encoded only as far as `more` wants them
/// ([`EngineTokenizer::encode_prompt_leading`]); CPU work, like [`body_tokens`].
pub fn body_leading_tokens(
    t: &EngineTokenizer,
    api: Api,
    body: &Map<String, Value>,
    more: WantsMore<'_>,
) -> Result<LeadingTokens, TokenizeError> {
    encode_body(t, api, body, Some(more))
}

fn encode_body(
    t: &EngineTokenizer,
    api: Api,
    body: &Map<String, Value>,
    more: Option<WantsMore<'_>>,
) -> Result<LeadingTokens, TokenizeError> {
    let flag = |k: &str, default: bool| body.get(k).and_then(Value::as_bool).unwrap_or(default);
    let whole = LeadingTokens::whole;
    let encoded = match api {
        Api::Chat => {
            let messages = body
                .get("messages")
                .and_then(Value::as_array)
                .ok_or_else(|| TokenizeError::BadRequest("`messages` must be a list".into()))?;
            let kwargs = body.get("chat_template_kwargs").and_then(Value::as_object);
            let (generation, continued) = (flag("add_generation_prompt", true), flag("continue_final_message", false));
            let special = flag("add_special_tokens", false);
            match more {
                None => t.encode_chat(messages, generation, continued, body.get("tools"), kwargs, special).map(whole),
                Some(more) => t
                    .render_chat(messages, generation, continued, body.get("tools"), kwargs)
                    .and_then(|text| t.encode_prompt_leading(&text, special, more)),
            }
        }
        Api::Completion => match body.get("prompt") {
            Some(Value::String(text)) => {
                let special = flag("add_special_tokens", true);
                match more {
                    None => t.encode_prompt(text, special).map(whole),
                    Some(more) => t.encode_prompt_leading(text, special, more),
                }
            }
            Some(Value::Array(items)) if items.iter().all(Value::is_u64) => {
                return Ok(whole(items.iter().filter_map(Value::as_u64).map(|v| v as u32).collect()));
            }
            _ => return Err(TokenizeError::BadRequest("`prompt` must be a string or a list of token ids".into())),
        },
    };
    encoded.map_err(|e| TokenizeError::BadRequest(e.to_string()))
}
