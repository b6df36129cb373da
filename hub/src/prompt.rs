//! A request's prompt tokens at the hub, per candidate worker set, so the cross-cluster
//! prefix index ([`crate::prefix`]) can say which cluster holds its prefix.
//!
//! The hub tokenizes exactly as the spokes do: the body the engine will be sent
//! (`openai::upstream_body`), with the worker set's `Files` tokenizer
//! ([`switchyard_tokenizer::request`]). Worker sets that share tokenizer files share one
//! tokenizer (and its chunk cache), and a prompt is encoded once per distinct tokenizer.
//! A set whose tokenizer is the engine's render endpoint (`source: Engine`) cannot be
//! tokenized here — the hub does not reach engines — and is chosen by load alone; so is
//! every set when tokenization is unavailable. Only a malformed request is an error.
//!
//! Invariants: encoding runs on the CPU pool, never on an async thread; tokenizers are
//! built once, when the configuration is loaded.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::Arc;

use switchyard_config::Resources;
use switchyard_crds::TokenizerSource;
use switchyard_gateway::admission::CpuPool;
use switchyard_gateway::error::GatewayError;
use switchyard_gateway::openai;
use switchyard_gateway::request::InferenceRequest;
use switchyard_tokenizer::EngineTokenizer;
use switchyard_tokenizer::request::{Api, TokenizeError, body_tokens, load_files};

/// One prompt's tokens per worker set (sets sharing a tokenizer share the `Arc`).
pub type SetTokens = HashMap<String, Arc<Vec<u32>>>;

/// The worker sets' tokenizers.
#[derive(Default)]
pub struct PromptTokenizers {
    /// Index into `tokenizers` per worker set that has one.
    by_set: HashMap<String, usize>,
    tokenizers: Vec<Arc<EngineTokenizer>>,
}

impl PromptTokenizers {
    /// Loads every `Files` tokenizer the worker sets of `resources` name. A set whose files
    /// cannot be loaded is left out (chosen by load) and reported in the returned list.
    pub fn load(resources: &Resources) -> (PromptTokenizers, Vec<(String, String)>) {
        let mut out = PromptTokenizers::default();
        let mut by_files: BTreeMap<(PathBuf, Option<PathBuf>), usize> = BTreeMap::new();
        let mut failures = Vec::new();
        for ws in &resources.worker_sets {
            let name = ws.object.metadata.name.clone().unwrap_or_default();
            let spec = &ws.object.spec.tokenizer;
            let (TokenizerSource::Files, Some(dir)) = (spec.source, spec.path.as_deref()) else { continue };
            let files = (PathBuf::from(dir), spec.chat_template.as_deref().map(PathBuf::from));
            let index = match by_files.get(&files) {
                Some(i) => *i,
                None => match load_files(&files.0, files.1.as_deref()) {
                    Ok(t) => {
                        out.tokenizers.push(Arc::new(t));
                        by_files.insert(files, out.tokenizers.len() - 1);
                        out.tokenizers.len() - 1
                    }
                    Err(e) => {
                        failures.push((name, e.to_string()));
                        continue;
                    }
                },
            };
            out.by_set.insert(name, index);
        }
        (out, failures)
    }

    /// Whether any of `sets` can be tokenized here.
    pub fn covers(&self, sets: &[String]) -> bool {
        sets.iter().any(|s| self.by_set.contains_key(s))
    }

    /// `req`'s tokens for each of `sets` that has a tokenizer, encoded once per distinct
    /// tokenizer on `cpu`. A malformed request is the client's error; anything else leaves
    /// the sets out (they are chosen by load).
    pub async fn tokens(
        &self,
        req: &InferenceRequest,
        sets: &[String],
        cpu: &CpuPool,
    ) -> Result<SetTokens, GatewayError> {
        let mut wanted: Vec<usize> = sets.iter().filter_map(|s| self.by_set.get(s).copied()).collect();
        wanted.sort_unstable();
        wanted.dedup();
        if wanted.is_empty() {
            return Ok(SetTokens::new());
        }
        let api = if req.is_chat() { Api::Chat } else { Api::Completion };
        // The model name in the body does not change the rendering.
        let body = Arc::new(openai::upstream_body(req, &req.model));
        let mut encoded: HashMap<usize, Arc<Vec<u32>>> = HashMap::new();
        for index in wanted {
            let (t, body) = (self.tokenizers[index].clone(), body.clone());
            match cpu.run(move || body_tokens(&t, api, &body)).await {
                Ok(Ok(tokens)) => {
                    encoded.insert(index, Arc::new(tokens));
                }
                Ok(Err(TokenizeError::BadRequest(msg))) => return Err(GatewayError::invalid(msg)),
                Ok(Err(TokenizeError::Unavailable(msg))) => {
                    tracing::warn!(error = %msg, "tokenization unavailable at the hub; choosing by load");
                }
                Err(e) => tracing::warn!(error = %e.message, "tokenization unavailable at the hub; choosing by load"),
            }
        }
        Ok(sets.iter().filter_map(|s| Some((s.clone(), encoded.get(self.by_set.get(s)?)?.clone()))).collect())
    }
}
