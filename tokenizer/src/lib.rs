//! Tokenization exactly like an engine configured with the same files.
//!
//! vLLM tokenizes a chat request by rendering the model's Jinja chat template (Hugging Face
//! `apply_chat_template` semantics: `trim_blocks` and `lstrip_blocks` on, the messages, the
//! special tokens and `add_generation_prompt` in the context) and encoding the result without
//! adding special tokens; a plain completion prompt is encoded with special tokens. This module
//! does the same with the `tokenizers` crate and `minijinja`.
//!
//! The project ships its own small byte-level BPE tokenizer (`tokenizer/files/`), trained by
//! [`train`] from text the project generates, in Hugging Face directory form so Python tools
//! (GuideLLM, `transformers`, the peer routers) load the very same files.
//!
//! Long prompts are tokenized incrementally and still exactly: [`chunk`] cuts them where the
//! two sides provably tokenize independently and caches each chunk's ids (bounded in bytes),
//! so a prompt repeating most of an earlier one costs little more than its new text, and the
//! work is linear in the prompt's length whatever it contains.

pub mod chunk;
pub mod conversation;
pub mod request;
pub mod train;

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use minijinja::{Environment, ErrorKind};
use serde_json::{Map, Value};
use tokenizers::{Encoding, Tokenizer};

/// The default tokenizer directory (committed in the repository), relative to the workspace.
pub const DEFAULT_TOKENIZER_DIR: &str = "tokenizer/files";

const TEMPLATE_NAME: &str = "chat";

/// Why a tokenizer could not be loaded or used.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    /// A file is missing or unreadable.
    #[error("{path}: {message}")]
    File {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        message: String,
    },
    /// The tokenizer has no chat template and a chat request came in.
    #[error("the tokenizer has no chat template")]
    NoChatTemplate,
    /// The chat template failed to render (e.g. it raised an exception).
    #[error("chat template error: {0}")]
    Template(String),
    /// Encoding or decoding failed.
    #[error("tokenizer error: {0}")]
    Encode(String),
    /// The messages cannot be parsed the way the engine parses them (a client error).
    #[error("{0}")]
    Conversation(String),
}

/// Prompts shorter than this (bytes) are encoded whole, without the chunk cache.
pub const SEGMENT_MIN_BYTES: usize = 1024;
/// Chunked encodes compared with a full encode (a safety net: any mismatch turns chunking
/// off for good, and the full encode is returned).
pub const SEGMENT_VERIFY: usize = 32;
/// Missing chunks are encoded in pieces of about this many bytes when the caller wants only
/// leading tokens ([`EngineTokenizer::encode_prompt_leading`]): about 32 tokens of prose.
const FINE_PIECE_BYTES: usize = 128;

/// Asked with the ids encoded so far whether more are wanted
/// ([`EngineTokenizer::encode_prompt_leading`]).
pub type WantsMore<'a> = &'a mut dyn FnMut(&[u32]) -> bool;

/// A prompt's first tokens, as far as the caller wanted them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeadingTokens {
    /// Exactly the first `ids.len()` ids of the prompt's full encode.
    pub ids: Vec<u32>,
    /// Bytes of the prompt text these ids encode (all of it when the encode went to the end).
    pub text_bytes: usize,
    /// Bytes of the prompt text.
    pub total_bytes: usize,
}

impl LeadingTokens {
    /// All of a prompt's ids (encoded to the end, or given as ids).
    pub fn whole(ids: Vec<u32>) -> LeadingTokens {
        LeadingTokens { ids, text_bytes: 0, total_bytes: 0 }
    }

    /// Whether these are all of the prompt's tokens.
    pub fn complete(&self) -> bool {
        self.text_bytes >= self.total_bytes
    }

    /// The prompt's token count: exact when complete; else the encoded part's count plus the
    /// rest of the text at the encoded part's bytes per token (4 when nothing was encoded).
    pub fn estimated_len(&self) -> usize {
        let rest = self.total_bytes.saturating_sub(self.text_bytes);
        if rest == 0 {
            return self.ids.len();
        }
        let per_token = if self.ids.is_empty() { 4.0 } else { self.text_bytes as f64 / self.ids.len() as f64 };
        self.ids.len() + (rest as f64 / per_token.max(1.0)).round() as usize
    }
}

/// Counters of the incremental (chunked) tokenization, for tests and monitoring.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Chunking scheme in use, or why prompts are encoded whole (`"off: ..."`).
    pub scheme: String,
    /// Prompts encoded through the chunked path.
    pub requests: u64,
    /// Long prompts encoded whole anyway (a stretch longer than [`chunk::MAX_SAFE_CHUNK`]
    /// without a valid cut).
    pub whole: u64,
    /// Chunks those prompts were cut into.
    pub chunks: u64,
    /// Chunks found in the cache.
    pub hits: u64,
    /// Chunks encoded (not in the cache).
    pub misses: u64,
    /// Bytes handed to the underlying encoder by the chunked path.
    pub encoded_bytes: u64,
    /// Candidate cut positions examined (at most one per prompt byte).
    pub scan_steps: u64,
    /// Leading-token encodes that stopped before the end of their prompt.
    pub stopped_early: u64,
    /// Chunked encodes compared with a full encode.
    pub verified: u64,
    /// Entries in the cache.
    pub entries: usize,
    /// Bytes the cache accounts for (texts, ids, bookkeeping).
    pub bytes: usize,
    /// Byte budget of the cache.
    pub budget: usize,
    /// Entries dropped to stay within the budget.
    pub evictions: u64,
}

/// The chunk cache and its counters.
struct ChunkState {
    cache: chunk::ChunkCache,
    enabled: bool,
    stats: CacheStats,
}

/// A loaded tokenizer with its chat template and special tokens.
pub struct EngineTokenizer {
    tokenizer: Tokenizer,
    env: Option<Environment<'static>>,
    bos_token: Option<String>,
    eos_token: Option<String>,
    /// Token ids generated outputs are drawn from: whole words that decode and re-encode to
    /// exactly one token each, so streamed text and token counts agree for every client.
    output_vocab: Arc<Vec<u32>>,
    eos_token_id: Option<u32>,
    /// How prompts are cut for the chunk cache, or why they are not.
    scheme: Result<chunk::Scheme, &'static str>,
    chunks: Mutex<ChunkState>,
}

impl std::fmt::Debug for EngineTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EngineTokenizer").field("vocab", &self.tokenizer.get_vocab_size(true)).finish()
    }
}

fn read_json(path: &Path) -> Result<Option<Value>, TokenizerError> {
    match fs::read_to_string(path) {
        Ok(text) => serde_json::from_str(&text)
            .map(Some)
            .map_err(|e| TokenizerError::File { path: path.to_owned(), message: e.to_string() }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(TokenizerError::File { path: path.to_owned(), message: e.to_string() }),
    }
}

/// `"<s>"` or `{"content": "<s>", ...}` as Hugging Face configs write special tokens.
fn token_string(v: Option<&Value>) -> Option<String> {
    match v? {
        Value::String(s) => Some(s.clone()),
        Value::Object(o) => o.get("content").and_then(Value::as_str).map(str::to_owned),
        _ => None,
    }
}

impl EngineTokenizer {
    /// Loads `tokenizer.json`, `tokenizer_config.json` and, when present, `chat_template.jinja`
    /// (which takes precedence, as in `transformers`) from a Hugging Face directory.
    pub fn from_dir(dir: &Path) -> Result<EngineTokenizer, TokenizerError> {
        let tok_path = dir.join("tokenizer.json");
        let tokenizer = Tokenizer::from_file(&tok_path)
            .map_err(|e| TokenizerError::File { path: tok_path.clone(), message: e.to_string() })?;
        let config = read_json(&dir.join("tokenizer_config.json"))?.unwrap_or(Value::Object(Map::new()));
        let jinja_path = dir.join("chat_template.jinja");
        let template = match fs::read_to_string(&jinja_path) {
            Ok(t) => Some(t),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => match config.get("chat_template") {
                Some(Value::String(s)) => Some(s.clone()),
                // A list of named templates: use the one named "default".
                Some(Value::Array(list)) => list
                    .iter()
                    .find(|t| t.get("name").and_then(Value::as_str) == Some("default"))
                    .and_then(|t| t.get("template").and_then(Value::as_str))
                    .map(str::to_owned),
                _ => None,
            },
            Err(e) => return Err(TokenizerError::File { path: jinja_path, message: e.to_string() }),
        };
        Self::new(tokenizer, template, token_string(config.get("bos_token")), token_string(config.get("eos_token")))
    }

    /// Builds from parts (used by tests and by [`train`]).
    pub fn new(
        tokenizer: Tokenizer,
        template: Option<String>,
        bos_token: Option<String>,
        eos_token: Option<String>,
    ) -> Result<EngineTokenizer, TokenizerError> {
        let env = match template {
            None => None,
            Some(t) => {
                let mut env = Environment::new();
                // Hugging Face renders chat templates with these Jinja settings.
                env.set_trim_blocks(true);
                env.set_lstrip_blocks(true);
                env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
                env.add_function("raise_exception", |msg: String| -> Result<String, minijinja::Error> {
                    Err(minijinja::Error::new(ErrorKind::InvalidOperation, msg))
                });
                env.add_template_owned(TEMPLATE_NAME, t).map_err(|e| TokenizerError::Template(e.to_string()))?;
                Some(env)
            }
        };
        let eos_token_id = eos_token.as_deref().and_then(|t| tokenizer.token_to_id(t));
        let output_vocab = Arc::new(word_tokens(&tokenizer));
        let scheme = chunk::Scheme::detect(&tokenizer);
        let stats = CacheStats {
            scheme: match &scheme {
                Ok(s) => s.name.to_owned(),
                Err(why) => format!("off: {why}"),
            },
            budget: chunk::DEFAULT_CACHE_BYTES,
            ..CacheStats::default()
        };
        let chunks = Mutex::new(ChunkState {
            cache: chunk::ChunkCache::new(chunk::DEFAULT_CACHE_BYTES),
            enabled: scheme.is_ok(),
            stats,
        });
        Ok(EngineTokenizer { tokenizer, env, bos_token, eos_token, output_vocab, eos_token_id, scheme, chunks })
    }

    /// The same tokenizer with another chat template (a worker set's `chatTemplate` override).
    pub fn with_chat_template(self, template: String) -> Result<EngineTokenizer, TokenizerError> {
        let budget = self.lock_chunks().cache.budget;
        EngineTokenizer::new(self.tokenizer, Some(template), self.bos_token, self.eos_token)
            .map(|t| t.with_cache_bytes(budget))
    }

    /// The same tokenizer with a chunk cache of `bytes` (0 turns caching off; prompts are
    /// still cut and encoded chunk by chunk). The default is [`chunk::DEFAULT_CACHE_BYTES`].
    pub fn with_cache_bytes(self, bytes: usize) -> EngineTokenizer {
        {
            let mut c = self.lock_chunks();
            c.cache.set_budget(bytes);
            c.stats.budget = bytes;
        }
        self
    }

    /// Counters of the chunked tokenization and the chunk cache.
    pub fn cache_stats(&self) -> CacheStats {
        let c = self.lock_chunks();
        CacheStats { entries: c.cache.len(), bytes: c.cache.bytes, evictions: c.cache.evictions, ..c.stats.clone() }
    }

    fn lock_chunks(&self) -> std::sync::MutexGuard<'_, ChunkState> {
        // The state stays consistent whatever panicked while holding the lock.
        self.chunks.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Encodes a completion prompt (special tokens added, as vLLM does for `/v1/completions`).
    ///
    /// Long prompts are cut into chunks at points where tokenizing each side separately
    /// provably gives the same ids (see [`chunk`]), and each chunk's ids come from
    /// (or go into) a byte-bounded cache, so a prompt sharing most of its text with an
    /// earlier one costs little more than its new part. The ids are exactly those of a full
    /// encode; tokenizer configurations the scheme cannot prove exact are encoded whole.
    pub fn encode_prompt(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>, TokenizerError> {
        let Ok(scheme) = &self.scheme else {
            return self.encode_full(text, add_special_tokens);
        };
        if text.len() < SEGMENT_MIN_BYTES || !self.lock_chunks().enabled {
            return self.encode_full(text, add_special_tokens);
        }
        let ids = self.encode_chunked(scheme, text, add_special_tokens)?;
        let verify = {
            let mut c = self.lock_chunks();
            let verify = c.stats.verified < SEGMENT_VERIFY as u64;
            c.stats.verified += u64::from(verify);
            verify
        };
        if verify {
            let full = self.encode_full(text, add_special_tokens)?;
            if full != ids {
                let mut c = self.lock_chunks();
                c.enabled = false;
                c.cache.clear();
                c.stats.scheme = "off: a chunked encode differed from the full encode".into();
            }
            return Ok(full);
        }
        Ok(ids)
    }

    fn encode_full(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>, TokenizerError> {
        self.tokenizer
            .encode(text, add_special_tokens)
            .map(|e| e.get_ids().to_vec())
            .map_err(|e| TokenizerError::Encode(e.to_string()))
    }

    /// Ids of one chunk (no special tokens added; offsets are not needed).
    fn encode_chunk(&self, text: &str) -> Result<Vec<u32>, TokenizerError> {
        self.tokenizer
            .encode_fast(text, false)
            .map(|e| e.get_ids().to_vec())
            .map_err(|e| TokenizerError::Encode(e.to_string()))
    }

    /// Cuts `text`, takes each chunk's ids from the cache or encodes it, and concatenates.
    fn encode_chunked(
        &self,
        scheme: &chunk::Scheme,
        text: &str,
        add_special_tokens: bool,
    ) -> Result<Vec<u32>, TokenizerError> {
        match self.encode_pieces(scheme, text, None)? {
            Some((ids, _)) => self.post_process(scheme, ids, add_special_tokens),
            None => self.encode_full(text, add_special_tokens),
        }
    }

    /// The chunk-by-chunk encode of `text` without special tokens: its ids and the bytes they
    /// cover, or `None` when `text` must be encoded whole (a stretch without a valid cut).
    ///
    /// With `more`, only as much as the caller wants is encoded: cached chunks are always
    /// taken (they cost a copy), and before any text is encoded `more` is asked, with the ids
    /// so far, whether more are wanted. Missing chunks are then encoded in small pieces cut
    /// at valid cuts too, so the stop falls close to where the caller's need ended. The ids
    /// are exactly the leading ids of the full encode of `text`, whatever `more` says.
    fn encode_pieces(
        &self,
        scheme: &chunk::Scheme,
        text: &str,
        mut more: Option<WantsMore<'_>>,
    ) -> Result<Option<(Vec<u32>, usize)>, TokenizerError> {
        let mut scan_steps = 0;
        let ends = scheme.cuts(text, &mut scan_steps);
        let starts: Vec<usize> = std::iter::once(0).chain(ends.iter().copied()).collect();
        let pieces: Vec<&str> = starts.iter().zip(&ends).map(|(&a, &b)| &text[a..b]).collect();
        if pieces.iter().any(|p| p.len() > chunk::MAX_SAFE_CHUNK) {
            let mut c = self.lock_chunks();
            c.stats.whole += 1;
            c.stats.scan_steps += scan_steps;
            return Ok(None);
        }
        let mut out = Vec::with_capacity(text.len() / 3);
        let (mut hits, mut misses, mut encoded_bytes) = (0u64, 0u64, 0u64);
        let keys: Vec<u64> = pieces.iter().map(|p| chunk::chunk_hash(p.as_bytes())).collect();
        let mut run: Vec<Arc<[u32]>> = Vec::new();
        let mut covered = text.len();
        let mut i = 0;
        'pieces: while i < pieces.len() {
            // Consecutive hits under one lock; their ids are copied out after it.
            {
                let mut c = self.lock_chunks();
                while let Some(&piece) = pieces.get(i) {
                    match c.cache.get(keys[i], piece) {
                        Some(ids) => run.push(ids),
                        None => break,
                    }
                    i += 1;
                }
            }
            hits += run.len() as u64;
            for ids in run.drain(..) {
                out.extend_from_slice(&ids);
            }
            let Some(&piece) = pieces.get(i) else { break };
            // A missing chunk: whole, or (when the caller may stop) in small exact pieces.
            let sub_ends = match more {
                None => vec![piece.len()],
                Some(_) => scheme.fine_cuts(piece, FINE_PIECE_BYTES, &mut scan_steps),
            };
            let mut ids = Vec::new();
            let mut from = 0;
            for end in sub_ends {
                if let Some(more) = more.as_mut()
                    && !more(&out)
                {
                    covered = starts[i] + from;
                    break 'pieces;
                }
                let sub = self.encode_chunk(&piece[from..end])?;
                out.extend_from_slice(&sub);
                if ids.is_empty() {
                    ids = sub;
                } else {
                    ids.extend_from_slice(&sub);
                }
                encoded_bytes += (end - from) as u64;
                from = end;
            }
            misses += 1;
            self.lock_chunks().cache.insert(keys[i], piece, ids.into());
            i += 1;
        }
        let mut c = self.lock_chunks();
        c.stats.requests += 1;
        c.stats.chunks += ends.len() as u64;
        c.stats.hits += hits;
        c.stats.misses += misses;
        c.stats.encoded_bytes += encoded_bytes;
        c.stats.scan_steps += scan_steps;
        c.stats.stopped_early += u64::from(covered < text.len());
        Ok(Some((out, covered)))
    }

    /// The post-processor's special tokens around chunked ids, when asked for.
    fn post_process(
        &self,
        scheme: &chunk::Scheme,
        ids: Vec<u32>,
        add_special_tokens: bool,
    ) -> Result<Vec<u32>, TokenizerError> {
        if !(add_special_tokens && scheme.post_process) {
            return Ok(ids);
        }
        // Shaped exactly as `encode_fast` hands a sequence to the post-processor.
        let enc: Encoding = ids.into_iter().map(|id| (id, String::new(), (0, 0), None, 0)).collect();
        let enc = self.tokenizer.post_process(enc, None, true).map_err(|e| TokenizerError::Encode(e.to_string()))?;
        Ok(enc.get_ids().to_vec())
    }

    /// A completion prompt's leading tokens, encoded only as far as `more` wants them: before
    /// encoding any text not in the chunk cache, `more` is asked with the ids so far. The ids
    /// are exactly the first ones [`EngineTokenizer::encode_prompt`] gives.
    ///
    /// For a router that looks a prompt up in a prefix index: the lookup cannot go past the
    /// first block no worker holds, and the text after it (a new prompt's whole text, the new
    /// turn of a conversation) need not be encoded to know that. Prompts the chunk scheme does
    /// not cover, short ones, the first verified encodes, and prompts whose post-processor adds
    /// tokens are encoded whole.
    pub fn encode_prompt_leading(
        &self,
        text: &str,
        add_special_tokens: bool,
        more: WantsMore<'_>,
    ) -> Result<LeadingTokens, TokenizerError> {
        let whole = LeadingTokens::whole;
        let Ok(scheme) = &self.scheme else {
            return self.encode_full(text, add_special_tokens).map(whole);
        };
        let lazy = {
            let c = self.lock_chunks();
            c.enabled && c.stats.verified >= SEGMENT_VERIFY as u64
        };
        if !lazy || text.len() < SEGMENT_MIN_BYTES || (add_special_tokens && scheme.post_process) {
            return self.encode_prompt(text, add_special_tokens).map(whole);
        }
        match self.encode_pieces(scheme, text, Some(more))? {
            Some((ids, text_bytes)) => Ok(LeadingTokens { ids, text_bytes, total_bytes: text.len() }),
            None => self.encode_full(text, add_special_tokens).map(whole),
        }
    }

    /// Renders the chat template for `messages` (OpenAI message objects).
    pub fn render_chat(
        &self,
        messages: &[Value],
        add_generation_prompt: bool,
        continue_final_message: bool,
        tools: Option<&Value>,
        template_kwargs: Option<&Map<String, Value>>,
    ) -> Result<String, TokenizerError> {
        let env = self.env.as_ref().ok_or(TokenizerError::NoChatTemplate)?;
        let mut ctx = Map::new();
        if let Some(kw) = template_kwargs {
            ctx.extend(kw.clone());
        }
        let parsed = conversation::conversation(messages).map_err(TokenizerError::Conversation)?;
        ctx.insert("messages".into(), Value::Array(parsed.iter().map(normalize_message).collect()));
        ctx.insert("add_generation_prompt".into(), Value::Bool(add_generation_prompt && !continue_final_message));
        ctx.insert("bos_token".into(), self.bos_token.clone().map_or(Value::String(String::new()), Value::String));
        ctx.insert("eos_token".into(), self.eos_token.clone().map_or(Value::String(String::new()), Value::String));
        if let Some(t) = tools {
            ctx.insert("tools".into(), t.clone());
        }
        let tmpl = env.get_template(TEMPLATE_NAME).map_err(|e| TokenizerError::Template(e.to_string()))?;
        let mut rendered =
            tmpl.render(minijinja::Value::from_serialize(&ctx)).map_err(|e| TokenizerError::Template(e.to_string()))?;
        if continue_final_message {
            // Cut after the final message's content, as transformers does.
            if let Some(last) = messages.last().and_then(|m| m.get("content")).map(content_text)
                && let Some(pos) = rendered.rfind(last.trim())
            {
                rendered.truncate(pos + last.trim().len());
            }
        }
        Ok(rendered)
    }

    /// Tokens of a chat request, exactly as the engine computes them.
    pub fn encode_chat(
        &self,
        messages: &[Value],
        add_generation_prompt: bool,
        continue_final_message: bool,
        tools: Option<&Value>,
        template_kwargs: Option<&Map<String, Value>>,
        add_special_tokens: bool,
    ) -> Result<Vec<u32>, TokenizerError> {
        let text = self.render_chat(messages, add_generation_prompt, continue_final_message, tools, template_kwargs)?;
        self.encode_prompt(&text, add_special_tokens)
    }

    /// Decodes tokens to text.
    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String, TokenizerError> {
        self.tokenizer.decode(ids, skip_special_tokens).map_err(|e| TokenizerError::Encode(e.to_string()))
    }

    /// The text of one token.
    pub fn token_text(&self, id: u32) -> String {
        self.tokenizer.decode(&[id], true).unwrap_or_default()
    }

    /// The string form of one token (vocabulary entry).
    pub fn token_str(&self, id: u32) -> String {
        self.tokenizer.id_to_token(id).unwrap_or_default()
    }

    /// Token ids outputs are drawn from.
    pub fn output_vocab(&self) -> Arc<Vec<u32>> {
        self.output_vocab.clone()
    }

    /// End-of-sequence token id, if the tokenizer declares one.
    pub fn eos_token_id(&self) -> Option<u32> {
        self.eos_token_id
    }
}

/// Content as a string: vLLM's "string" content format joins the text parts with newlines.
fn content_text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Array(parts) => parts
            .iter()
            .filter_map(|p| match p {
                Value::String(s) => Some(s.clone()),
                Value::Object(o) => o.get("text").and_then(Value::as_str).map(str::to_owned),
                _ => None,
            })
            .collect::<Vec<_>>()
            .join("\n"),
        _ => String::new(),
    }
}

fn normalize_message(m: &Value) -> Value {
    let mut m = m.clone();
    if let Some(obj) = m.as_object_mut()
        && let Some(c) = obj.get("content")
        && c.is_array()
    {
        let text = content_text(c);
        obj.insert("content".into(), Value::String(text));
    }
    m
}

/// Whole-word vocabulary entries (`Ġword` in byte-level BPE, or plain alphabetic words) that
/// re-encode to themselves.
fn word_tokens(tok: &Tokenizer) -> Vec<u32> {
    let mut ids: Vec<u32> = tok
        .get_vocab(false)
        .into_iter()
        .filter(|(s, _)| {
            let word = s.strip_prefix('Ġ').unwrap_or(s);
            s.starts_with('Ġ') && word.len() >= 2 && word.chars().all(|c| c.is_ascii_lowercase())
        })
        .filter(|(s, id)| {
            let text = format!(" {}", s.trim_start_matches('Ġ'));
            tok.encode(text.as_str(), false).map(|e| e.get_ids() == [*id]).unwrap_or(false)
        })
        .map(|(_, id)| id)
        .collect();
    ids.sort_unstable();
    ids
}

/// Finds the default tokenizer directory by walking up from `start` (the workspace root holds
/// `tokenizer/files`).
pub fn find_default_dir(start: &Path) -> Option<PathBuf> {
    start.ancestors().map(|a| a.join(DEFAULT_TOKENIZER_DIR)).find(|p| p.join("tokenizer.json").is_file())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn shipped() -> EngineTokenizer {
        EngineTokenizer::from_dir(&Path::new(env!("CARGO_MANIFEST_DIR")).join("files"))
            .expect("shipped tokenizer loads")
    }

    #[test]
    fn chat_rendering_uses_chatml_and_special_tokens() {
        let t = shipped();
        let msgs = [
            json!({"role": "system", "content": "Be brief."}),
            json!({"role": "user", "content": [{"type": "text", "text": "Hi"}, {"type": "text", "text": "there"}]}),
        ];
        let text = t.render_chat(&msgs, true, false, None, None).expect("renders");
        assert_eq!(
            text,
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi\nthere<|im_end|>\n<|im_start|>assistant\n"
        );
        let ids = t.encode_chat(&msgs, true, false, None, None, false).expect("encodes");
        let start = t.tokenizer.token_to_id("<|im_start|>").expect("special token");
        assert_eq!(ids[0], start);
        assert_eq!(ids.iter().filter(|&&i| i == start).count(), 3);
        assert_eq!(t.decode(&ids, false).expect("decodes"), text);
    }

    #[test]
    fn output_vocabulary_round_trips_one_token_per_word() {
        let t = shipped();
        let vocab = t.output_vocab();
        assert!(vocab.len() > 200, "{}", vocab.len());
        let text: String = vocab.iter().take(50).map(|&id| t.token_text(id)).collect();
        assert_eq!(t.encode_prompt(&text, false).expect("encodes"), vocab[..50].to_vec());
        assert_eq!(t.eos_token_id(), t.tokenizer.token_to_id("<|im_end|>"));
    }

    #[test]
    fn chat_prompts_reuse_cached_chunks_and_match_full_encoding() {
        let t = shipped();
        assert_eq!(t.cache_stats().scheme, "byte-level BPE, GPT-2 regex");
        let long: String = (0..900).map(|i| format!("word{} café 東京 {{\"k\": {i}}} ", i % 17)).collect();
        for i in 0..(SEGMENT_VERIFY + 10) {
            let msgs = [
                json!({"role": "system", "content": long}),
                json!({"role": "user", "content": format!("question {i} <|im_start|> inline")}),
            ];
            let text = t.render_chat(&msgs, true, false, None, None).expect("renders");
            let cached = t.encode_prompt(&text, false).expect("encodes");
            assert_eq!(cached, t.encode_full(&text, false).expect("encodes"), "request {i}");
        }
        let s = t.cache_stats();
        assert_eq!(s.verified, SEGMENT_VERIFY as u64);
        assert_eq!(s.scheme, "byte-level BPE, GPT-2 regex", "no mismatch turned chunking off");
        assert!(s.entries > 0 && s.hits > s.misses, "{s:?}");
    }

    #[test]
    fn template_errors_are_reported() {
        let tok = shipped().tokenizer;
        let t = EngineTokenizer::new(tok, Some("{{ raise_exception('no system role') }}".into()), None, None)
            .expect("compiles");
        let err =
            t.render_chat(&[json!({"role": "user", "content": "x"})], true, false, None, None).expect_err("raises");
        assert!(err.to_string().contains("no system role"), "{err}");
    }
}
