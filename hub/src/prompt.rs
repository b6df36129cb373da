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
//! A prompt is encoded only as far as the index can use it ([`Coverage`]): the chunk cache
//! gives the text the hub has seen before for a copy, and of new text only what completes
//! the coarse blocks some live pair may still hold is encoded. A lookup cannot go past the
//! first coarse block no pair holds, so the rest of a long prompt (a new conversation's
//! whole text, the new turn of a known one) cannot change where the prompt is cached, and
//! its length is estimated from the encoded part; the spoke counts it exactly.
//!
//! Invariants: encoding runs on the CPU pool, never on an async thread; tokenizers are
//! built once, when the configuration is loaded; the tokens handed on are exactly the
//! leading tokens of the engine's encode.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::Arc;

use dynamo_kv_router::protocols::{BlockHashOptions, compute_block_hash_for_seq};
use switchyard_config::Resources;
use switchyard_crds::TokenizerSource;
use switchyard_gateway::admission::CpuPool;
use switchyard_gateway::error::GatewayError;
use switchyard_gateway::openai;
use switchyard_gateway::request::InferenceRequest;
use switchyard_proto::coarse::local_hashes;
use switchyard_tokenizer::EngineTokenizer;
use switchyard_tokenizer::request::{Api, TokenizeError, body_leading_tokens, load_files};

use crate::batch::SetOfCluster;
use crate::fleet::LiveCluster;
use crate::prefix::PrefixIndex;

/// One prompt's leading tokens per worker set (sets sharing a tokenizer share the `Arc`).
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

    /// `req`'s prompt for each of `sets` that has a tokenizer, encoded once per distinct
    /// tokenizer on `cpu`, and only as far as the prefix index can use it: with `probe`,
    /// encoding stops once no live pair of `live` holds every coarse block of what is encoded
    /// so far (the lookup cannot go deeper, so the rest of the text cannot change where the
    /// prompt is cached); without it (choices blind to caches), at once. The text not encoded
    /// counts at the encoded part's bytes per token. A malformed request is the client's
    /// error; anything else leaves the sets out (they are chosen by load).
    pub async fn tokens(
        &self,
        req: &InferenceRequest,
        sets: &[String],
        live: &[LiveCluster],
        probe: Option<&Arc<PrefixIndex>>,
        cpu: &CpuPool,
    ) -> Result<SetPrompts, GatewayError> {
        let mut wanted: Vec<usize> = sets.iter().filter_map(|s| self.by_set.get(s).copied()).collect();
        wanted.sort_unstable();
        wanted.dedup();
        if wanted.is_empty() {
            return Ok(SetPrompts::default());
        }
        let api = if req.is_chat() { Api::Chat } else { Api::Completion };
        // The model name in the body does not change the rendering.
        let body = Arc::new(openai::upstream_body(req, &req.model));
        let mut encoded: HashMap<usize, Arc<Vec<u32>>> = HashMap::new();
        let mut length = 0usize;
        for index in wanted {
            let (t, body) = (self.tokenizers[index].clone(), body.clone());
            let mut cover = Coverage::new(probe.cloned(), self.grains(index, live));
            let job = move || body_leading_tokens(&t, api, &body, &mut |ids| cover.wants_more(ids));
            match cpu.run(job).await {
                Ok(Ok(leading)) => {
                    length = length.max(leading.estimated_len());
                    encoded.insert(index, Arc::new(leading.ids));
                }
                Ok(Err(TokenizeError::BadRequest(msg))) => return Err(GatewayError::invalid(msg)),
                Ok(Err(TokenizeError::Unavailable(msg))) => {
                    tracing::warn!(error = %msg, "tokenization unavailable at the hub; choosing by load");
                }
                Err(e) => tracing::warn!(error = %e.message, "tokenization unavailable at the hub; choosing by load"),
            }
        }
        let tokens = sets.iter().filter_map(|s| Some((s.clone(), encoded.get(self.by_set.get(s)?)?.clone()))).collect();
        Ok(SetPrompts { tokens, length: (!encoded.is_empty()).then(|| u32::try_from(length).unwrap_or(u32::MAX)) })
    }

    /// The (block size, coarse factor) grains of the live pairs whose set uses tokenizer
    /// `index`, each with its pairs.
    fn grains(&self, index: usize, live: &[LiveCluster]) -> Vec<Grain> {
        let mut out: Vec<Grain> = Vec::new();
        for c in live {
            for ws in &c.worker_sets {
                if ws.kv_block_size == 0 || ws.coarse_block_factor == 0 || self.by_set.get(&ws.name) != Some(&index) {
                    continue;
                }
                let pair = (c.cluster.clone(), ws.name.clone());
                match out.iter_mut().find(|g| (g.block_size, g.factor) == (ws.kv_block_size, ws.coarse_block_factor)) {
                    Some(g) => g.pairs.push(pair),
                    None => out.push(Grain::new(ws.kv_block_size, ws.coarse_block_factor, pair)),
                }
            }
        }
        out
    }
}

/// A prompt's tokens per worker set, and its length.
#[derive(Debug, Default)]
pub struct SetPrompts {
    /// The leading tokens per set (sets sharing a tokenizer share the `Arc`).
    pub tokens: SetTokens,
    /// The prompt's length in tokens: exact when encoded to the end, else estimated from the
    /// encoded part; `None` when no set could be tokenized.
    pub length: Option<u32>,
}

/// One grain of the prefix index a prompt is looked up at, and how far it matched.
struct Grain {
    block_size: u32,
    factor: u32,
    pairs: Vec<SetOfCluster>,
    /// Token hashes of the encoded ids' complete engine blocks.
    blocks: Vec<u64>,
    /// Local hashes of their complete coarse blocks.
    coarse: Vec<u64>,
    /// Coarse blocks the last lookup covered (every one was held by some pair).
    checked: usize,
    /// A lookup found no pair holding every coarse block: more ids cannot match deeper.
    settled: bool,
}

impl Grain {
    fn new(block_size: u32, factor: u32, pair: SetOfCluster) -> Grain {
        Grain {
            block_size,
            factor,
            pairs: vec![pair],
            blocks: Vec::new(),
            coarse: Vec::new(),
            checked: 0,
            settled: false,
        }
    }
}

/// Decides, as a prompt is encoded, whether more of its tokens could still match deeper in
/// the prefix index (see [`PromptTokenizers::tokens`]).
struct Coverage {
    index: Option<Arc<PrefixIndex>>,
    grains: Vec<Grain>,
}

impl Coverage {
    fn new(index: Option<Arc<PrefixIndex>>, grains: Vec<Grain>) -> Coverage {
        Coverage { index, grains }
    }

    /// Whether tokens past `ids` could be held deeper than `ids` by some pair. Looks up only
    /// when a coarse block has completed since the last lookup.
    fn wants_more(&mut self, ids: &[u32]) -> bool {
        let Some(index) = &self.index else { return false };
        let mut wanted = false;
        for g in self.grains.iter_mut().filter(|g| !g.settled) {
            let size = g.block_size as usize;
            let done = g.blocks.len() * size;
            let complete = ids.len() / size * size;
            if complete > done {
                let new = compute_block_hash_for_seq(&ids[done..complete], g.block_size, BlockHashOptions::default());
                g.blocks.extend(new.into_iter().map(|h| h.0));
            }
            let factor = g.factor as usize;
            let from = g.coarse.len() * factor;
            let to = g.blocks.len() / factor * factor;
            if to > from {
                g.coarse.extend(local_hashes(&g.blocks[from..to], g.factor));
            }
            if g.coarse.len() == g.checked {
                // Nothing new to look up: every coarse block so far is held somewhere.
                wanted = true;
                continue;
            }
            g.checked = g.coarse.len();
            let held = index.lookup(&g.coarse);
            let deepest = g.pairs.iter().filter_map(|p| held.get(p)).copied().max().unwrap_or(0);
            if deepest as usize >= g.coarse.len() {
                wanted = true;
            } else {
                g.settled = true;
            }
        }
        wanted
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use switchyard_proto::coarse::chained;
    use switchyard_proto::v1::{CoarseBlocks, CoarseReport};

    const BLOCK: u32 = 4;
    const FACTOR: u32 = 2;

    fn coarse_of(ids: &[u32]) -> Vec<u64> {
        let blocks: Vec<u64> =
            compute_block_hash_for_seq(ids, BLOCK, BlockHashOptions::default()).into_iter().map(|h| h.0).collect();
        local_hashes(&blocks, FACTOR)
    }

    /// Encoding goes on while some pair holds every coarse block so far, and stops at the first
    /// coarse block no pair holds; a pair of another grain or tokenizer does not count.
    #[tokio::test]
    async fn coverage_wants_tokens_until_the_lookup_cannot_go_deeper() {
        let index = Arc::new(PrefixIndex::new());
        let prompt: Vec<u32> = (0..64).collect();
        // East holds the first three coarse blocks (24 tokens); "other" holds all of it.
        let held = chained(&coarse_of(&prompt[..24]));
        let all = chained(&coarse_of(&prompt));
        for (cluster, set, stored) in [("east", "s", held), ("west", "other", all)] {
            let report = CoarseReport {
                worker_sets: vec![CoarseBlocks { worker_set: set.into(), reset: true, stored, removed: vec![] }],
            };
            index.apply(cluster, &report).await;
        }
        let grain = Grain::new(BLOCK, FACTOR, ("east".into(), "s".into()));
        let mut cover = Coverage::new(Some(index.clone()), vec![grain]);
        assert!(cover.wants_more(&prompt[..0]));
        assert!(cover.wants_more(&prompt[..7]), "no coarse block complete yet");
        assert!(cover.wants_more(&prompt[..8]), "block 1 is held");
        assert!(cover.wants_more(&prompt[..30]), "blocks 1-3 are held");
        assert!(!cover.wants_more(&prompt[..32]), "block 4 is not: nothing further can match");
        assert!(!cover.wants_more(&prompt), "settled");

        // A prompt east holds none of stops at its first coarse block; blind choices at once.
        let other: Vec<u32> = (1_000..1_064).collect();
        let mut cover = Coverage::new(Some(index), vec![Grain::new(BLOCK, FACTOR, ("east".into(), "s".into()))]);
        assert!(cover.wants_more(&other[..7]));
        assert!(!cover.wants_more(&other[..8]));
        assert!(!Coverage::new(None, Vec::new()).wants_more(&prompt[..8]));
    }
}
