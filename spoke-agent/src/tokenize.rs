//! Turning a request into exactly the tokens the engine will compute.
//!
//! Two sources, per worker set: `Files` renders the chat template and encodes locally with
//! the same Hugging Face files the engine loads; `Engine` asks a worker's own
//! `/v1/chat/completions/render` (or `/v1/completions/render`) with the raw request body, so
//! fields a local renderer might drop (tools, template kwargs) cannot cause drift.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Map, Value};
use switchyard_crds::TokenizerSource;
use switchyard_gateway::admission::CpuPool;
use switchyard_tokenizer::EngineTokenizer;
use switchyard_tokenizer::request::{body_tokens, load_files};

use crate::topology::TokenizerConfig;

pub use switchyard_tokenizer::request::{Api, TokenizeError};

/// The tokenizer of one worker set.
#[derive(Clone, Debug)]
pub enum Tokenizer {
    /// Local files.
    Local(Arc<EngineTokenizer>),
    /// The engines' render endpoints.
    Engine,
}

impl Tokenizer {
    /// Builds the tokenizer a worker set's configuration asks for.
    pub fn from_config(cfg: &TokenizerConfig) -> Result<Tokenizer, TokenizeError> {
        match cfg.source {
            TokenizerSource::Engine => Ok(Tokenizer::Engine),
            TokenizerSource::Files => {
                let dir = cfg
                    .path
                    .as_deref()
                    .ok_or_else(|| TokenizeError::Unavailable("tokenizer.path is not set".into()))?;
                let t = load_files(Path::new(dir), cfg.chat_template.as_deref().map(Path::new))?;
                Ok(Tokenizer::Local(Arc::new(t)))
            }
        }
    }

    /// Tokens of `body` (the OpenAI request the engine will be sent). Local files encode on
    /// the CPU pool, never on an async thread; the `Engine` source asks `render_url` (a worker
    /// base URL) and gives up after `render_timeout`.
    pub async fn tokens(
        &self,
        api: Api,
        body: Arc<Map<String, Value>>,
        client: &reqwest::Client,
        render_url: Option<&str>,
        cpu: &CpuPool,
        render_timeout: Duration,
    ) -> Result<Vec<u32>, TokenizeError> {
        match self {
            Tokenizer::Local(t) => {
                let t = t.clone();
                cpu.run(move || body_tokens(&t, api, &body)).await.map_err(|e| TokenizeError::Unavailable(e.message))?
            }
            Tokenizer::Engine => {
                let base =
                    render_url.ok_or_else(|| TokenizeError::Unavailable("no healthy worker to render with".into()))?;
                tokio::time::timeout(render_timeout, render(client, base, api, &body))
                    .await
                    .map_err(|_| TokenizeError::Unavailable(format!("render: no answer within {render_timeout:?}")))?
            }
        }
    }
}

async fn render(
    client: &reqwest::Client,
    base: &str,
    api: Api,
    body: &Map<String, Value>,
) -> Result<Vec<u32>, TokenizeError> {
    let path = match api {
        Api::Chat => "/v1/chat/completions/render",
        Api::Completion => "/v1/completions/render",
    };
    let r = client
        .post(format!("{base}{path}"))
        .json(body)
        .send()
        .await
        .map_err(|e| TokenizeError::Unavailable(format!("render: {e}")))?;
    let status = r.status();
    let v: Value = r.json().await.map_err(|e| TokenizeError::Unavailable(format!("render: {e}")))?;
    if status.is_client_error() {
        let msg = v.pointer("/error/message").and_then(Value::as_str).unwrap_or("invalid request").to_owned();
        return Err(TokenizeError::BadRequest(msg));
    }
    // Chat render answers one object, completions render a list of them.
    let obj = if v.is_array() { v.get(0).cloned().unwrap_or(Value::Null) } else { v };
    serde_json::from_value(obj.get("token_ids").cloned().unwrap_or(Value::Null))
        .map_err(|_| TokenizeError::Unavailable("render returned no token_ids".into()))
}
