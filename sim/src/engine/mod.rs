//! The engine model: a deterministic, virtual-time imitation of vLLM's V1 scheduler.
//!
//! Each [`Engine::step`] is one forward pass: running requests are scheduled first (decodes
//! and unfinished chunked prefills), then waiting requests in arrival order while the
//! running batch (`max_num_seqs`) and the token budget (`max_num_batched_tokens`) allow. A
//! new request first reuses the longest chain of cached blocks of its tokens (prefix
//! caching; the last prompt token is always recomputed, as in vLLM). When blocks run out the
//! most recently admitted running request is preempted and later recomputed. Blocks that
//! become full are hashed into the prefix cache and announced as `BlockStored`; reused
//! free blocks that still carried a hash are announced as `BlockRemoved`.
//!
//! The engine has no clock: a step reports its duration from the profile's timing model and
//! the caller decides how long to sleep. Same inputs, same seed → same outputs, events and
//! durations.
//!
//! Generated tokens are drawn from the output vocabulary, seeded by the prompt, unless the
//! request carries a forced output ([`Engine::add_request_with_output`]): then the engine
//! emits exactly those tokens, in order, and finishes after the last one (or at `max_tokens`,
//! whichever comes first). The server forces outputs where vLLM constrains decoding
//! (structured outputs for forced tool calls), so the constrained text is what the engine
//! computes, caches and counts.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

pub mod hash;

use self::hash::{HashAlgo, Hasher, Link};
use crate::kv_cache::{BlockId, BlockPool};
use crate::profile::Profile;

/// Identifies a request inside one engine.
pub type RequestId = u64;

/// A KV-cache event, as vLLM's block pool emits them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KvEvent {
    /// Newly cached full blocks of one sequence, in chain order.
    BlockStored {
        /// Engine hashes of the blocks.
        block_hashes: Vec<u64>,
        /// Hash of the block before the first one; `None` at the start of a sequence.
        parent_block_hash: Option<u64>,
        /// The blocks' tokens, concatenated.
        token_ids: Vec<u32>,
        /// Tokens per block.
        block_size: u32,
    },
    /// Cached blocks evicted from the prefix cache.
    BlockRemoved {
        /// Engine hashes of the evicted blocks.
        block_hashes: Vec<u64>,
    },
    /// The whole prefix cache was reset.
    AllBlocksCleared,
}

/// One generated token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenOut {
    /// Request it belongs to.
    pub request: RequestId,
    /// Token id.
    pub token: u32,
    /// Position in the output, from 0 (0 = the first token, which ends TTFT).
    pub index: u32,
    /// Whether this was the last token.
    pub finished: bool,
    /// Prompt tokens served from the prefix cache when the request was admitted.
    pub cached_prompt_tokens: u32,
}

/// What one step did.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StepOutput {
    /// Duration of the step at time scale 1, milliseconds.
    pub duration_ms: f64,
    /// Tokens produced at the end of the step.
    pub tokens: Vec<TokenOut>,
    /// KV events of the step (published as one batch).
    pub events: Vec<KvEvent>,
    /// Prompt tokens computed in the step.
    pub prefill_tokens: u32,
    /// Sequences that decoded one token.
    pub decode_seqs: u32,
    /// Requests preempted in the step.
    pub preempted: u32,
    /// The requests preempted in the step, in order.
    pub preempted_requests: Vec<RequestId>,
    /// Requests moved from waiting to running in the step: first admissions and resumptions
    /// after a preemption.
    pub admitted: Vec<RequestId>,
}

/// Observable state (what `/metrics` reports).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct EngineStats {
    /// Requests waiting for admission.
    pub waiting: u32,
    /// Requests in the running batch.
    pub running: u32,
    /// Fraction of KV blocks in use.
    pub kv_usage: f64,
    /// Prompt tokens of waiting requests not yet computed.
    pub waiting_prefill_tokens: u64,
    /// Blocks registered in the prefix cache.
    pub cached_blocks: u64,
}

/// Monotonic counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EngineCounters {
    /// Prompt tokens looked up in the prefix cache.
    pub prefix_cache_queries: u64,
    /// Prompt tokens found in the prefix cache.
    pub prefix_cache_hits: u64,
    /// Prompt tokens computed (prefill work).
    pub prompt_tokens: u64,
    /// Output tokens generated.
    pub generation_tokens: u64,
    /// Preemptions.
    pub preemptions: u64,
    /// Requests finished normally.
    pub finished: u64,
}

#[derive(Debug, Clone)]
struct Req {
    tokens: Vec<u32>,
    prompt_len: u32,
    max_tokens: u32,
    num_computed: u32,
    blocks: Vec<BlockId>,
    /// Chain hashes of the full blocks of `tokens`, extended lazily.
    hashes: Vec<u64>,
    /// The chain state after the last of `hashes`.
    link: Link,
    /// Leading blocks already registered in the prefix cache (by us or found there).
    num_registered: usize,
    /// Prompt tokens served from the prefix cache when first admitted.
    cached_prompt_tokens: u32,
    fingerprint: u64,
    /// Tokens to emit instead of sampled ones (constrained decoding).
    forced: Option<Arc<[u32]>>,
}

/// The simulated engine of one worker.
#[derive(Debug, Clone)]
pub struct Engine {
    profile: Profile,
    pool: BlockPool,
    waiting: VecDeque<RequestId>,
    running: Vec<RequestId>,
    reqs: HashMap<RequestId, Req>,
    next_id: RequestId,
    /// Computes block hashes ([`hash`]).
    hasher: Hasher,
    seed: u64,
    output_vocab: Arc<Vec<u32>>,
    counters: EngineCounters,
}

impl Engine {
    /// A new engine. `salt` varies engine hashes between workers and restarts; `seed` drives
    /// the generated tokens; `output_vocab` lists the token ids outputs are drawn from.
    pub fn new(profile: Profile, salt: u64, seed: u64, output_vocab: Arc<Vec<u32>>) -> Engine {
        let pool = BlockPool::new(profile.num_gpu_blocks);
        Engine {
            profile,
            pool,
            waiting: VecDeque::new(),
            running: Vec::new(),
            reqs: HashMap::new(),
            next_id: 1,
            hasher: Hasher::new(HashAlgo::Sha256, salt, hash::DEFAULT_NONE_HASH_SEED),
            seed,
            output_vocab,
            counters: EngineCounters::default(),
        }
    }

    /// The engine with `algo` block hashes; `seed` derives `sha256_cbor`'s `NONE_HASH` (the
    /// salted default keeps the salt given to [`Engine::new`]).
    pub fn with_hash(mut self, algo: HashAlgo, seed: &str) -> Engine {
        if algo == HashAlgo::Sha256Cbor {
            self.hasher = Hasher::new(algo, 0, seed);
        }
        self
    }

    /// The profile in use.
    pub fn profile(&self) -> &Profile {
        &self.profile
    }

    /// Queues a request; it is admitted by a later step.
    pub fn add_request(&mut self, prompt: Vec<u32>, max_tokens: u32) -> RequestId {
        self.add_request_with_output(prompt, max_tokens, None)
    }

    /// Queues a request whose output is `forced` (when given): the engine emits those tokens
    /// in order and stops after the last one or at `max_tokens`, whichever comes first.
    pub fn add_request_with_output(
        &mut self,
        prompt: Vec<u32>,
        max_tokens: u32,
        forced: Option<Arc<[u32]>>,
    ) -> RequestId {
        let max_tokens = match &forced {
            Some(f) if !f.is_empty() => max_tokens.min(f.len() as u32),
            _ => max_tokens,
        };
        let id = self.next_id;
        self.next_id += 1;
        let fingerprint = prompt.iter().fold(self.seed ^ 0x9e37_79b9_7f4a_7c15, |h, &t| mix(h ^ u64::from(t)));
        let prompt_len = prompt.len() as u32;
        self.reqs.insert(
            id,
            Req {
                tokens: prompt,
                prompt_len,
                max_tokens: max_tokens.max(1),
                num_computed: 0,
                blocks: Vec::new(),
                hashes: Vec::new(),
                link: Link::Start,
                num_registered: 0,
                cached_prompt_tokens: 0,
                fingerprint,
                forced: forced.filter(|f| !f.is_empty()),
            },
        );
        self.waiting.push_back(id);
        id
    }

    /// Drops a request (client went away); its blocks return to the pool.
    pub fn abort(&mut self, id: RequestId) {
        if let Some(req) = self.reqs.remove(&id) {
            self.pool.free(&req.blocks);
            self.waiting.retain(|r| *r != id);
            self.running.retain(|r| *r != id);
        }
    }

    /// Whether a step would do anything.
    pub fn has_work(&self) -> bool {
        !self.waiting.is_empty() || !self.running.is_empty()
    }

    /// Prompt tokens served from the prefix cache when `id` was admitted.
    pub fn cached_prompt_tokens(&self, id: RequestId) -> Option<u32> {
        self.reqs.get(&id).map(|r| r.cached_prompt_tokens)
    }

    /// Current observable state.
    pub fn stats(&self) -> EngineStats {
        let waiting_prefill_tokens = self
            .waiting
            .iter()
            .filter_map(|id| self.reqs.get(id))
            .map(|r| u64::from(r.prompt_len - r.num_computed.min(r.prompt_len)))
            .sum();
        EngineStats {
            waiting: self.waiting.len() as u32,
            running: self.running.len() as u32,
            kv_usage: self.pool.usage(),
            waiting_prefill_tokens,
            cached_blocks: self.pool.num_cached() as u64,
        }
    }

    /// What a replica of this engine does when its router sees `id`'s first token: the prompt
    /// counts as computed from now on (if `id` is running and its blocks can grow), so a
    /// replica whose timing model runs slow catches up with the engine it mirrors.
    pub fn mark_prefilled(&mut self, id: RequestId) {
        let Some(r) = self.reqs.get(&id) else { return };
        let target = r.prompt_len;
        if r.num_computed >= target || !self.running.contains(&id) {
            return;
        }
        let mut events = Vec::new();
        if self.grow(id, target, &mut events)
            && let Some(r) = self.reqs.get_mut(&id)
        {
            r.num_computed = target;
        }
    }

    /// Whether `id` is queued or running (a finished or aborted request is forgotten).
    pub fn contains(&self, id: RequestId) -> bool {
        self.reqs.contains_key(&id)
    }

    /// Monotonic counters.
    pub fn counters(&self) -> EngineCounters {
        self.counters
    }

    /// Prompt tokens of `tokens` a new request would find in the prefix cache right now.
    pub fn cached_prefix_tokens(&self, tokens: &[u32]) -> u32 {
        let bs = self.profile.block_size as usize;
        let max_blocks = tokens.len().saturating_sub(1) / bs;
        let mut link = Link::Start;
        let mut hits = 0;
        for chunk in tokens.chunks_exact(bs).take(max_blocks) {
            let (h, next) = self.hasher.next(link, chunk);
            if self.pool.lookup(h).is_none() {
                break;
            }
            hits += 1;
            link = next;
        }
        (hits * bs) as u32
    }

    /// The exact TTFT a request with `tokens` would see if it arrived now and nothing else
    /// arrived after it: the engine is cloned and stepped until the request's first token.
    pub fn predict_ttft_ms(&self, tokens: &[u32]) -> f64 {
        self.clone().into_predicted_ttft_ms(tokens)
    }

    /// [`Engine::predict_ttft_ms`] on an engine the caller has already cloned (the runtime
    /// clones on its own task and steps the copy elsewhere, so the live engine never waits).
    pub fn into_predicted_ttft_ms(self, tokens: &[u32]) -> f64 {
        let mut sim = self;
        let id = sim.add_request(tokens.to_vec(), 1);
        let mut elapsed = 0.0;
        // Bounded: every step makes progress on the request at the head of the queue.
        for _ in 0..1_000_000 {
            let Some(out) = sim.step() else { break };
            elapsed += out.duration_ms;
            if out.tokens.iter().any(|t| t.request == id) {
                return elapsed;
            }
        }
        elapsed
    }

    /// Forgets the prefix cache (vLLM `reset_prefix_cache`), returning `AllBlocksCleared`.
    pub fn reset_prefix_cache(&mut self) -> KvEvent {
        self.pool.clear_cache();
        for r in self.reqs.values_mut() {
            r.num_registered = 0;
            r.hashes.clear();
            r.link = Link::Start;
        }
        KvEvent::AllBlocksCleared
    }

    fn ensure_hashes(&mut self, id: RequestId) {
        let bs = self.profile.block_size as usize;
        let hasher = self.hasher;
        let Some(r) = self.reqs.get_mut(&id) else { return };
        let full = r.tokens.len() / bs;
        while r.hashes.len() < full {
            let i = r.hashes.len();
            let (h, link) = hasher.next(r.link, &r.tokens[i * bs..(i + 1) * bs]);
            r.hashes.push(h);
            r.link = link;
        }
    }

    /// Gives `id` enough blocks for `total_tokens`, evicting cached blocks; false if the pool
    /// cannot.
    fn grow(&mut self, id: RequestId, total_tokens: u32, events: &mut Vec<KvEvent>) -> bool {
        let bs = self.profile.block_size;
        let Some(r) = self.reqs.get(&id) else { return false };
        let need = total_tokens.div_ceil(bs).saturating_sub(r.blocks.len() as u32);
        if need == 0 {
            return true;
        }
        let mut evicted = Vec::new();
        let Some(new_blocks) = self.pool.allocate(need, &mut evicted) else { return false };
        // One event per evicted block, as vLLM's block pool announces them.
        events.extend(evicted.into_iter().map(|h| KvEvent::BlockRemoved { block_hashes: vec![h] }));
        if let Some(r) = self.reqs.get_mut(&id) {
            r.blocks.extend(new_blocks);
        }
        true
    }

    fn preempt(&mut self, id: RequestId) {
        self.running.retain(|r| *r != id);
        if let Some(r) = self.reqs.get_mut(&id) {
            let blocks = std::mem::take(&mut r.blocks);
            r.num_computed = 0;
            r.num_registered = 0;
            self.pool.free(&blocks);
        }
        self.waiting.push_front(id);
        self.counters.preemptions += 1;
    }

    /// Admits a waiting request: reuses its cached prefix. Returns false (changing nothing)
    /// if its next chunk cannot get blocks.
    fn admit(&mut self, id: RequestId, budget: u32, events: &mut Vec<KvEvent>) -> Option<u32> {
        self.ensure_hashes(id);
        let bs = self.profile.block_size;
        let r = self.reqs.get(&id)?;
        let len = r.tokens.len() as u32;
        let max_hit_blocks = (len.saturating_sub(1) / bs) as usize;
        let hits: Vec<BlockId> = r.hashes.iter().take(max_hit_blocks).map_while(|h| self.pool.lookup(*h)).collect();
        let hit_tokens = hits.len() as u32 * bs;
        let n = (len - hit_tokens).min(budget);
        let total_blocks_needed = (hit_tokens + n).div_ceil(bs);
        let fresh = total_blocks_needed.saturating_sub(hits.len() as u32);
        // Count free blocks excluding the hit blocks that are themselves free (touching
        // them takes them off the free list).
        let hits_on_free = hits.iter().filter(|b| self.pool_block_is_free(**b)).count() as u32;
        if self.pool.num_free().saturating_sub(hits_on_free) < fresh {
            return None;
        }
        for b in &hits {
            self.pool.touch(*b);
        }
        let first_admission = r.num_computed == 0 && r.tokens.len() as u32 == r.prompt_len;
        let r = self.reqs.get_mut(&id)?;
        r.blocks = hits.clone();
        r.num_registered = hits.len();
        r.num_computed = hit_tokens;
        if first_admission {
            r.cached_prompt_tokens = hit_tokens;
        }
        self.counters.prefix_cache_queries += u64::from(len);
        self.counters.prefix_cache_hits += u64::from(hit_tokens);
        if !self.grow(id, hit_tokens + n, events) {
            return None;
        }
        Some(n)
    }

    fn pool_block_is_free(&self, id: BlockId) -> bool {
        self.pool.is_free(id)
    }

    /// Runs one forward step; `None` when there is nothing to do.
    pub fn step(&mut self) -> Option<StepOutput> {
        if !self.has_work() {
            return None;
        }
        let mut out = StepOutput::default();
        let mut budget = self.profile.max_num_batched_tokens;
        let mut scheduled: Vec<(RequestId, u32)> = Vec::new();
        let mut preempted_this_step = false;

        // 1. Running requests, in admission order.
        let mut i = 0;
        while i < self.running.len() && budget > 0 {
            let id = self.running[i];
            let Some(r) = self.reqs.get(&id) else {
                i += 1;
                continue;
            };
            let n = (r.tokens.len() as u32 - r.num_computed).min(budget);
            let target = r.num_computed + n;
            let mut ok = self.grow(id, target, &mut out.events);
            while !ok {
                let Some(&victim) = self.running.last() else { break };
                self.preempt(victim);
                out.preempted += 1;
                out.preempted_requests.push(victim);
                preempted_this_step = true;
                if victim == id {
                    break;
                }
                ok = self.grow(id, target, &mut out.events);
            }
            if ok {
                scheduled.push((id, n));
                budget -= n;
                i += 1;
            }
        }

        // 2. Waiting requests, in order, unless this step already had to preempt.
        while !preempted_this_step
            && budget > 0
            && (self.running.len() as u32) < self.profile.max_num_seqs
            && let Some(&id) = self.waiting.front()
        {
            let Some(n) = self.admit(id, budget, &mut out.events) else { break };
            self.waiting.pop_front();
            self.running.push(id);
            out.admitted.push(id);
            scheduled.push((id, n));
            budget -= n;
        }

        if scheduled.is_empty() {
            // Nothing fits (a request larger than the whole cache): drop the head so the
            // engine cannot stall; vLLM rejects such prompts up front.
            if let Some(id) = self.waiting.pop_front() {
                self.reqs.remove(&id);
            }
            return Some(out);
        }

        // 3. Compute: advance each scheduled request, register full blocks, sample tokens.
        let mut context_tokens: u64 = 0;
        let bs = self.profile.block_size;
        for &(id, n) in &scheduled {
            self.ensure_hashes(id);
            let vocab = self.output_vocab.clone();
            let Some(r) = self.reqs.get_mut(&id) else { continue };
            let decode = n == 1 && r.tokens.len() as u32 > r.prompt_len;
            if decode {
                out.decode_seqs += 1;
            } else {
                out.prefill_tokens += n;
                self.counters.prompt_tokens += u64::from(n);
            }
            r.num_computed += n;
            context_tokens += u64::from(r.num_computed);

            // Newly full blocks enter the prefix cache.
            let full = (r.num_computed / bs) as usize;
            let mut group: Option<KvEvent> = None;
            while r.num_registered < full {
                let i = r.num_registered;
                let (block, hash) = (r.blocks[i], r.hashes[i]);
                if self.pool.register(block, hash) {
                    let tokens = &r.tokens[i * bs as usize..(i + 1) * bs as usize];
                    match &mut group {
                        Some(KvEvent::BlockStored { block_hashes, token_ids, .. }) => {
                            block_hashes.push(hash);
                            token_ids.extend_from_slice(tokens);
                        }
                        _ => {
                            group = Some(KvEvent::BlockStored {
                                block_hashes: vec![hash],
                                parent_block_hash: i.checked_sub(1).map(|p| r.hashes[p]),
                                token_ids: tokens.to_vec(),
                                block_size: bs,
                            });
                        }
                    }
                } else if let Some(g) = group.take() {
                    out.events.push(g);
                }
                r.num_registered += 1;
            }
            if let Some(g) = group {
                out.events.push(g);
            }

            // All known tokens computed: sample the next one.
            if r.num_computed as usize == r.tokens.len() {
                let index = r.tokens.len() as u32 - r.prompt_len;
                let token = if let Some(t) = r.forced.as_ref().and_then(|f| f.get(index as usize)) {
                    *t
                } else if vocab.is_empty() {
                    0
                } else {
                    vocab[(mix(r.fingerprint ^ u64::from(index)) % vocab.len() as u64) as usize]
                };
                let finished = index + 1 >= r.max_tokens;
                r.tokens.push(token);
                out.tokens.push(TokenOut {
                    request: id,
                    token,
                    index,
                    finished,
                    cached_prompt_tokens: r.cached_prompt_tokens,
                });
                self.counters.generation_tokens += 1;
            }
        }
        for t in out.tokens.iter().filter(|t| t.finished) {
            if let Some(r) = self.reqs.remove(&t.request) {
                self.pool.free(&r.blocks);
                self.counters.finished += 1;
            }
            self.running.retain(|id| *id != t.request);
        }
        out.duration_ms = self.profile.timing.step_ms(out.prefill_tokens, out.decode_seqs, context_tokens);
        Some(out)
    }
}

/// SplitMix64 finaliser: a fast, well-distributed 64-bit mix.
pub fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests;
