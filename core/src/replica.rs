//! A router's replica of one vLLM engine's scheduler, for predicting first-token times.
//!
//! Under load a request's first token waits for the engine's running batch to free a slot,
//! KV blocks and step budget for it. Counters (queued requests, queued tokens) cannot say
//! when that happens: requests admitted together finish together, so the next free capacity
//! comes in waves, and which worker has a completion imminent decides the TTFT. The replica
//! rebuilds the engine's schedule from what the router itself knows — the requests it sent
//! (prompt length, cached prefix, output limit), when each one's first and last tokens came
//! back — and steps it in time with a learned step-cost model ([`CostLearner`]).
//!
//! The scheduler is vLLM V1's at token granularity: every step schedules the running
//! requests first (one decode token each, or the next chunk of an unfinished prefill), then
//! admits waiting requests in arrival order while the batch (`max_num_seqs`), the step's
//! token budget (`max_num_batched_tokens`) and free KV blocks allow (see below); when a running request
//! cannot get a block, the most recently admitted one is preempted and later recomputed.
//! Token ids are not modelled: a request's prefix hit is what the router's index said at
//! dispatch, and requests that share a cached prefix (same `prefix` key) hold its blocks once.
//!
//! Where the replica and the engine disagree, observations win: a first token seen makes a
//! lagging replica catch up to it, every relayed token sets the request's progress, a last
//! token seen drops the request. Observations are also samples for the cost learner: a first
//! token's wait against the step work the replica attributes to it, a stream's median
//! inter-token gap against one decode step of the batch it ran in.
//!
//! A replica admits a waiting request only once its whole prompt fits in the free blocks, where
//! vLLM admits it once its first chunk does: at the cache's edge the engine's rule can thrash
//! (admit, preempt at the next chunk, admit again), a state too sensitive to timing for a
//! prediction to follow; the replica predicts the schedule the engine settles into.
//!
//! Invariants: pure (times are the caller's milliseconds on one monotonic clock, never read
//! here); every call does bounded work ([`MAX_STEPS_PER_CALL`]); every figure returned is
//! finite and non-negative.

use std::collections::VecDeque;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::predictor::TtftPrediction;

/// Steps one call may simulate; beyond it the replica jumps its clock instead of stepping.
pub const MAX_STEPS_PER_CALL: usize = 20_000;
/// The shortest step the replica simulates, ms: a cost model learned as zero cannot stall it.
const MIN_STEP_MS: f64 = 1e-3;
/// Steps an observation may make a lagging replica catch up by.
const CATCH_UP_STEPS: usize = 4_096;
/// Requests the replica finished before the router saw them finish, kept for their samples.
const MAX_DONE: usize = 256;

/// Work of one or more scheduler steps: what a step's duration is a linear function of.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StepWork {
    /// Forward passes.
    pub steps: f64,
    /// Prompt tokens computed.
    pub prefill_tokens: f64,
    /// Sequences that decoded one token, summed over the steps.
    pub decode_seqs: f64,
    /// Thousands of context tokens attended to, summed over the steps.
    pub context_ktokens: f64,
}

impl StepWork {
    fn add(&mut self, other: &StepWork) {
        self.steps += other.steps;
        self.prefill_tokens += other.prefill_tokens;
        self.decode_seqs += other.decode_seqs;
        self.context_ktokens += other.context_ktokens;
    }

    fn scaled(&self, k: f64) -> StepWork {
        StepWork {
            steps: self.steps * k,
            prefill_tokens: self.prefill_tokens * k,
            decode_seqs: self.decode_seqs * k,
            context_ktokens: self.context_ktokens * k,
        }
    }
}

/// Cost of a forward step: a fixed part, prompt tokens, decoding sequences and attention over
/// the context; and the fixed cost a request pays outside the steps (network, the engine's
/// own tokenization) before its first token.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StepCost {
    /// Per step, ms.
    pub base_ms: f64,
    /// Per prompt token computed, ms.
    pub prefill_ms_per_token: f64,
    /// Per decoding sequence, ms.
    pub decode_ms_per_seq: f64,
    /// Per 1,000 context tokens attended to, ms.
    pub attention_ms_per_ktoken: f64,
    /// Per request, before its first token, ms.
    pub request_ms: f64,
}

impl StepCost {
    /// A prior from a prefill rate and a per-request overhead: the decode and attention terms
    /// start small and are learned.
    pub fn prior(prefill_tokens_per_sec: f64, base_ms: f64) -> StepCost {
        let rate = if prefill_tokens_per_sec.is_finite() && prefill_tokens_per_sec > 0.0 {
            prefill_tokens_per_sec
        } else {
            8_000.0
        };
        let prefill = 1_000.0 / rate;
        let base = if base_ms.is_finite() && base_ms > 0.0 { base_ms } else { 25.0 };
        StepCost {
            base_ms: base,
            prefill_ms_per_token: prefill,
            decode_ms_per_seq: base / 100.0,
            attention_ms_per_ktoken: prefill / 8.0,
            request_ms: base,
        }
    }

    /// Milliseconds of `work`.
    pub fn ms(&self, work: &StepWork) -> f64 {
        let ms = self.base_ms * work.steps
            + self.prefill_ms_per_token * work.prefill_tokens
            + self.decode_ms_per_seq * work.decode_seqs
            + self.attention_ms_per_ktoken * work.context_ktokens;
        if ms.is_finite() && ms > 0.0 { ms } else { 0.0 }
    }

    /// The same cost with prefill `factor` times as expensive.
    pub fn with_prefill_margin(mut self, factor: f64) -> StepCost {
        self.prefill_ms_per_token *= factor;
        self
    }
}

/// The engine's scheduler limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EngineShape {
    /// Tokens per KV block.
    pub block_size: u32,
    /// KV blocks on the engine.
    pub num_blocks: u32,
    /// `--max-num-seqs`.
    pub max_num_seqs: u32,
    /// `--max-num-batched-tokens`.
    pub max_num_batched_tokens: u32,
}

/// What the router sent: one request, as the replica needs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sent {
    /// The router's id for it, unique per replica.
    pub id: u64,
    /// Prompt tokens.
    pub prompt_tokens: u32,
    /// Of those, found in (or on their way to) the engine's prefix cache.
    pub cached_tokens: u32,
    /// Identifies the cached prefix, so requests sharing it hold its blocks once (0: none).
    pub prefix: u64,
    /// Output tokens at most.
    pub max_tokens: u32,
}

/// What the router saw of a request that completed.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Ended {
    /// Output tokens, when the engine reported them.
    pub output_tokens: Option<u32>,
    /// The median gap between consecutive streamed tokens, ms (none for a response that was
    /// not streamed or had fewer than three tokens).
    pub median_gap_ms: Option<f64>,
}

/// The median of `values` (none when fewer than two).
pub fn median(mut values: Vec<f64>) -> Option<f64> {
    if values.len() < 2 {
        return None;
    }
    values.sort_by(f64::total_cmp);
    Some(values[values.len() / 2])
}

/// One observation for the cost learner: `observed_ms` took `work` (plus the per-request
/// cost when `first_token`): a wait for a first token, or one typical decode step.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Sample {
    /// The step work attributed to the interval.
    pub work: StepWork,
    /// Whether the interval is dispatch → first token (it then includes the request cost); else
    /// it is one decode step.
    pub first_token: bool,
    /// Its observed length, ms.
    pub observed_ms: f64,
}

#[derive(Debug, Clone)]
struct Seq {
    sent: Sent,
    /// Prompt plus generated tokens computed.
    computed: u32,
    generated: u32,
    /// Blocks held beyond the shared prefix.
    own_blocks: u32,
    /// Whether it counts as a holder of its prefix's blocks.
    holds_prefix: bool,
    dispatched_ms: f64,
    /// When the router saw the first token.
    seen_first_ms: Option<f64>,
    /// Work of the steps from dispatch to the replica's first token.
    to_first: StepWork,
    /// Work of the steps after the replica's first token.
    after_first: StepWork,
}

impl Seq {
    fn known_tokens(&self) -> u32 {
        self.sent.prompt_tokens + self.generated
    }

    fn prefix_blocks(&self, bs: u32) -> u32 {
        self.sent.cached_tokens / bs
    }
}

/// A shared prefix's blocks and how many running requests hold them.
#[derive(Debug, Clone, Copy)]
struct Shared {
    prefix: u64,
    blocks: u32,
    holders: u32,
}

/// The replica of one engine.
#[derive(Debug, Clone)]
pub struct Replica {
    shape: EngineShape,
    cost: StepCost,
    /// When the next step starts, ms.
    next_step_ms: f64,
    waiting: VecDeque<Seq>,
    running: Vec<Seq>,
    /// Finished by the replica, not yet seen finishing.
    done: VecDeque<Seq>,
    shared: Vec<Shared>,
    own_blocks_used: u32,
}

impl Replica {
    /// An idle engine of `shape`, stepping with `cost`.
    pub fn new(shape: EngineShape, cost: StepCost) -> Replica {
        let shape = EngineShape {
            block_size: shape.block_size.max(1),
            num_blocks: shape.num_blocks.max(1),
            max_num_seqs: shape.max_num_seqs.max(1),
            max_num_batched_tokens: shape.max_num_batched_tokens.max(1),
        };
        Replica {
            shape,
            cost,
            next_step_ms: 0.0,
            waiting: VecDeque::new(),
            running: Vec::new(),
            done: VecDeque::new(),
            shared: Vec::new(),
            own_blocks_used: 0,
        }
    }

    /// The scheduler limits.
    pub fn shape(&self) -> EngineShape {
        self.shape
    }

    /// Replaces the step cost (a learner's new estimate) from the next step on.
    pub fn set_cost(&mut self, cost: StepCost) {
        self.cost = cost;
    }

    /// Replaces the scheduler limits (a scrape reported the engine's block count).
    pub fn set_num_blocks(&mut self, num_blocks: u32) {
        self.shape.num_blocks = num_blocks.max(1);
    }

    /// (waiting, running) requests in the replica.
    pub fn counts(&self) -> (usize, usize) {
        (self.waiting.len(), self.running.len())
    }

    /// Steps through every step that starts before `now_ms` (requests sent at the instant a
    /// step starts join it, as a burst does).
    pub fn advance(&mut self, now_ms: f64) {
        let mut steps = 0;
        while self.next_step_ms < now_ms && self.has_work() {
            if steps == MAX_STEPS_PER_CALL {
                self.next_step_ms = now_ms;
                break;
            }
            let (duration, _) = self.step(None);
            self.next_step_ms += duration;
            steps += 1;
        }
        if !self.has_work() {
            self.next_step_ms = self.next_step_ms.max(now_ms);
        }
    }

    /// The router sent `sent` at `now_ms`.
    pub fn dispatch(&mut self, sent: Sent, now_ms: f64) {
        self.advance(now_ms);
        let bs = self.shape.block_size;
        // The engine recomputes at least the last prompt token; hits are whole blocks.
        let cached = sent.cached_tokens.min(sent.prompt_tokens.saturating_sub(1)) / bs * bs;
        let sent = Sent { cached_tokens: cached, max_tokens: sent.max_tokens.max(1), ..sent };
        self.waiting.push_back(Seq {
            sent,
            computed: 0,
            generated: 0,
            own_blocks: 0,
            holds_prefix: false,
            dispatched_ms: now_ms,
            seen_first_ms: None,
            to_first: StepWork::default(),
            after_first: StepWork::default(),
        });
    }

    /// The router saw `id`'s first token at `now_ms`: the sample for the learner.
    pub fn started(&mut self, id: u64, now_ms: f64) -> Option<Sample> {
        self.advance(now_ms);
        // Lagging: the engine got here sooner, so the steps between are done already.
        self.catch_up(id, |s| s.generated > 0);
        let pending = self.pending_work();
        let budget = f64::from(self.shape.max_num_batched_tokens);
        let bs = self.shape.block_size;
        if let Some(pos) = self.waiting.iter().position(|s| s.sent.id == id) {
            // The replica has not admitted it yet: admit it now, blocks permitting.
            let mut seq = self.waiting.remove(pos)?;
            seq.computed = seq.sent.cached_tokens;
            self.hold_prefix(&mut seq);
            self.running.push(seq);
        }
        let seq = match self.running.iter_mut().find(|s| s.sent.id == id) {
            Some(seq) => seq,
            None => self.done.iter_mut().find(|s| s.sent.id == id)?,
        };
        if seq.seen_first_ms.is_some() {
            return None;
        }
        seq.seen_first_ms = Some(now_ms);
        if seq.generated == 0 {
            // Lagging: the rest of its prompt counts as computed, in the steps it would take.
            let left = f64::from(seq.sent.prompt_tokens.saturating_sub(seq.computed));
            let steps = (left / budget).ceil().max(1.0);
            let mut rest = pending.scaled(steps);
            rest.prefill_tokens = left;
            rest.steps = steps;
            seq.to_first.add(&rest);
            seq.computed = seq.sent.prompt_tokens;
            seq.generated = 1;
            let want = seq.computed.div_ceil(bs).saturating_sub(seq.prefix_blocks(bs));
            let grow = want.saturating_sub(seq.own_blocks);
            seq.own_blocks = want;
            self.own_blocks_used += grow;
        }
        let seq = self.find(id)?;
        Some(Sample { work: seq.to_first, first_token: true, observed_ms: now_ms - seq.dispatched_ms })
    }

    /// The router saw `id`'s last token at `now_ms`: the sample for the learner, a typical
    /// decode step of the batch it ran in, when the stream's inter-token gaps are known.
    pub fn finished(&mut self, id: u64, end: &Ended, now_ms: f64) -> Option<Sample> {
        self.advance(now_ms);
        if let Some(n) = end.output_tokens
            && let Some(s) = self.running.iter_mut().chain(self.waiting.iter_mut()).find(|s| s.sent.id == id)
        {
            s.sent.max_tokens = s.sent.max_tokens.min(n.max(s.generated).max(1));
        }
        self.catch_up(id, |s| s.generated >= s.sent.max_tokens);
        let pending = self.pending_work();
        let seq = if let Some(pos) = self.done.iter().position(|s| s.sent.id == id) {
            self.done.remove(pos)?
        } else {
            self.remove_live(id)?
        };
        // The median gap between streamed tokens is a step without a prompt chunk in it (those
        // are the minority of a stream's steps), whatever else the engine was doing: the
        // per-step terms are learned from it alone, free of the prefill they would otherwise be
        // confused with. The batch it ran with is the replica's, averaged over its steps.
        let gap = end.median_gap_ms.filter(|g| g.is_finite() && *g > 0.0)?;
        let batch =
            if seq.after_first.steps >= 1.0 { seq.after_first.scaled(1.0 / seq.after_first.steps) } else { pending };
        let work = StepWork { steps: 1.0, prefill_tokens: 0.0, ..batch };
        Some(Sample { work, first_token: false, observed_ms: gap })
    }

    /// The router has relayed `generated` of `id`'s tokens by `now_ms`: the replica takes the
    /// engine's progress as it is, ahead of its own or behind it, so the time left until the
    /// request finishes (and frees its slot and blocks) is counted from what is known.
    pub fn progress(&mut self, id: u64, generated: u32, now_ms: f64) {
        self.advance(now_ms);
        let bs = self.shape.block_size;
        let stray = if let Some(pos) = self.done.iter().position(|s| s.sent.id == id) {
            self.done.remove(pos)
        } else if let Some(pos) = self.waiting.iter().position(|s| s.sent.id == id && s.generated > 0) {
            self.waiting.remove(pos)
        } else {
            None
        };
        if let Some(mut seq) = stray {
            // Finished or preempted in the replica, still generating in the engine.
            self.hold_prefix(&mut seq);
            self.running.push(seq);
        }
        let Some(seq) = self.running.iter_mut().find(|s| s.sent.id == id && s.generated > 0) else { return };
        let generated = generated.max(1);
        seq.generated = generated;
        seq.sent.max_tokens = seq.sent.max_tokens.max(generated + 1);
        seq.computed = seq.sent.prompt_tokens + generated - 1;
        let want = seq.computed.div_ceil(bs).saturating_sub(seq.prefix_blocks(bs));
        self.own_blocks_used = (self.own_blocks_used + want).saturating_sub(seq.own_blocks);
        seq.own_blocks = want;
    }

    /// `id` ended without a usable observation (failed, cancelled): it is dropped.
    pub fn forget(&mut self, id: u64, now_ms: f64) {
        self.advance(now_ms);
        if self.remove_live(id).is_none() {
            self.done.retain(|s| s.sent.id != id);
        }
    }

    /// Milliseconds from `now_ms` until the first token of a request of `prompt_tokens` with
    /// `cached_tokens` cached, sent now with nothing else sent after it: the replica is cloned
    /// and stepped until that token, and the per-request cost added.
    pub fn predict_ttft_ms(&self, prompt_tokens: u32, cached_tokens: u32, prefix: u64, now_ms: f64) -> f64 {
        let mut sim = self.clone();
        sim.done.clear();
        sim.advance(now_ms);
        let probe = u64::MAX;
        sim.dispatch(Sent { id: probe, prompt_tokens, cached_tokens, prefix, max_tokens: 1 }, now_ms);
        let mut at = sim.next_step_ms.max(now_ms);
        for _ in 0..MAX_STEPS_PER_CALL {
            let (duration, first) = sim.step(Some(probe));
            at += duration;
            if first {
                break;
            }
        }
        let ms = at - now_ms + self.cost.request_ms;
        if ms.is_finite() && ms > 0.0 { ms } else { 0.0 }
    }

    /// The uncached prompt tokens of a request of `prompt_tokens` with `cached_tokens`
    /// cached, in ms of prefill at the current cost (what placing it costs the cache).
    pub fn prefill_ms(&self, prompt_tokens: u32, cached_tokens: u32) -> f64 {
        self.cost.ms(&StepWork {
            prefill_tokens: f64::from(prompt_tokens.saturating_sub(cached_tokens)),
            ..StepWork::default()
        })
    }

    /// Steps without moving the clock until `id` is `reached` (or finished), at most
    /// [`CATCH_UP_STEPS`] steps: a replica slower than its engine catches up at an observation
    /// by doing the work the engine has done, which the observed interval is then a sample of.
    fn catch_up(&mut self, id: u64, reached: impl Fn(&Seq) -> bool) {
        for _ in 0..CATCH_UP_STEPS {
            let live = self.running.iter().chain(self.waiting.iter()).find(|s| s.sent.id == id);
            if live.is_none_or(&reached) {
                return;
            }
            self.step(None);
        }
    }

    fn has_work(&self) -> bool {
        !self.waiting.is_empty() || !self.running.is_empty()
    }

    fn find(&self, id: u64) -> Option<&Seq> {
        self.running.iter().chain(self.waiting.iter()).chain(self.done.iter()).find(|s| s.sent.id == id)
    }

    /// The work of one step of the running batch's decodes: what each step still costs while
    /// a lagging request catches up.
    fn pending_work(&self) -> StepWork {
        let decoding = self.running.iter().filter(|s| s.generated > 0).count() as f64;
        let context: u64 = self.running.iter().map(|s| u64::from(s.computed)).sum();
        StepWork { steps: 1.0, prefill_tokens: 0.0, decode_seqs: decoding, context_ktokens: context as f64 / 1_000.0 }
    }

    fn free_blocks(&self) -> u32 {
        let shared: u32 = self.shared.iter().map(|s| s.blocks).sum();
        self.shape.num_blocks.saturating_sub(self.own_blocks_used + shared)
    }

    /// Blocks `seq` needs for its prefix on admission (none when another holder has them).
    fn prefix_blocks_needed(&self, seq: &Seq) -> u32 {
        let blocks = seq.prefix_blocks(self.shape.block_size);
        if seq.sent.prefix == 0 || blocks == 0 {
            return blocks;
        }
        match self.shared.iter().find(|s| s.prefix == seq.sent.prefix) {
            Some(s) => blocks.saturating_sub(s.blocks),
            None => blocks,
        }
    }

    fn hold_prefix(&mut self, seq: &mut Seq) {
        let blocks = seq.prefix_blocks(self.shape.block_size);
        if seq.holds_prefix || blocks == 0 {
            return;
        }
        seq.holds_prefix = true;
        let key = if seq.sent.prefix == 0 { seq.sent.id ^ (1 << 63) } else { seq.sent.prefix };
        match self.shared.iter_mut().find(|s| s.prefix == key) {
            Some(s) => {
                s.blocks = s.blocks.max(blocks);
                s.holders += 1;
            }
            None => self.shared.push(Shared { prefix: key, blocks, holders: 1 }),
        }
    }

    fn release(&mut self, seq: &mut Seq) {
        self.own_blocks_used = self.own_blocks_used.saturating_sub(seq.own_blocks);
        seq.own_blocks = 0;
        if seq.holds_prefix {
            seq.holds_prefix = false;
            let key = if seq.sent.prefix == 0 { seq.sent.id ^ (1 << 63) } else { seq.sent.prefix };
            if let Some(pos) = self.shared.iter().position(|s| s.prefix == key) {
                self.shared[pos].holders -= 1;
                if self.shared[pos].holders == 0 {
                    self.shared.swap_remove(pos);
                }
            }
        }
    }

    fn remove_live(&mut self, id: u64) -> Option<Seq> {
        let mut seq = if let Some(pos) = self.running.iter().position(|s| s.sent.id == id) {
            self.running.remove(pos)
        } else {
            let pos = self.waiting.iter().position(|s| s.sent.id == id)?;
            self.waiting.remove(pos)?
        };
        self.release(&mut seq);
        Some(seq)
    }

    /// Preempts the most recently admitted running request; returns whether it was `index`.
    fn preempt_last(&mut self) -> Option<u64> {
        let mut victim = self.running.pop()?;
        self.release(&mut victim);
        victim.computed = 0;
        let id = victim.sent.id;
        self.waiting.push_front(victim);
        Some(id)
    }

    /// One forward step: its duration, and whether `probe` got its first token in it.
    /// One forward step: its duration, and whether `probe` got its first token in it.
    fn step(&mut self, probe: Option<u64>) -> (f64, bool) {
        let bs = self.shape.block_size;
        let mut budget = self.shape.max_num_batched_tokens;
        // (index into running after scheduling, tokens) — running keeps its order, so the
        // scheduled requests are a prefix of it plus the newly admitted at its end.
        let mut scheduled: Vec<(u64, u32)> = Vec::with_capacity(self.running.len() + 4);
        let mut preempted = false;
        let mut i = 0;
        while i < self.running.len() && budget > 0 {
            let (id, n, want) = {
                let s = &self.running[i];
                let n = (s.known_tokens() - s.computed.min(s.known_tokens())).min(budget);
                let want = (s.computed + n).div_ceil(bs).saturating_sub(s.prefix_blocks(bs));
                (s.sent.id, n, want)
            };
            let grow = want.saturating_sub(self.running[i].own_blocks);
            if grow > self.free_blocks() {
                preempted = true;
                if self.preempt_last() == Some(id) {
                    break;
                }
                continue;
            }
            self.running[i].own_blocks += grow;
            self.own_blocks_used += grow;
            scheduled.push((id, n));
            budget -= n;
            i += 1;
        }
        while !preempted && budget > 0 && (self.running.len() as u32) < self.shape.max_num_seqs {
            let Some(seq) = self.waiting.front() else { break };
            let start = seq.sent.cached_tokens;
            let n = (seq.known_tokens() - start.min(seq.known_tokens())).min(budget);
            let want = (start + n).div_ceil(bs).saturating_sub(seq.prefix_blocks(bs));
            // The engine admits a request once its first chunk fits, and preempts it again at
            // the next chunk if the rest does not: at the cache's edge it can thrash for as
            // long as the batch runs, a state too sensitive to timing to predict. The replica
            // admits only what its whole prompt fits, so it predicts the schedule that the
            // engine settles into instead of one it may or may not fall into.
            let whole = seq.known_tokens().div_ceil(bs).saturating_sub(seq.prefix_blocks(bs));
            if whole + self.prefix_blocks_needed(seq) > self.free_blocks() {
                break;
            }
            let Some(mut seq) = self.waiting.pop_front() else { break };
            seq.computed = start;
            self.hold_prefix(&mut seq);
            seq.own_blocks = want;
            self.own_blocks_used += want;
            scheduled.push((seq.sent.id, n));
            budget -= n;
            self.running.push(seq);
        }
        if scheduled.is_empty() {
            // Nothing fits (a prompt larger than the whole cache): the engine rejects it.
            if let Some(mut seq) = self.waiting.pop_front() {
                self.release(&mut seq);
            }
            return (MIN_STEP_MS, false);
        }

        let mut work = StepWork { steps: 1.0, ..StepWork::default() };
        let mut probe_first = false;
        let mut finished: Vec<u64> = Vec::new();
        let mut first: Vec<u64> = Vec::new();
        for &(id, n) in &scheduled {
            let Some(s) = self.running.iter_mut().find(|s| s.sent.id == id) else { continue };
            if n == 1 && s.computed >= s.sent.prompt_tokens {
                work.decode_seqs += 1.0;
            } else {
                work.prefill_tokens += f64::from(n);
            }
            s.computed += n;
            work.context_ktokens += f64::from(s.computed) / 1_000.0;
            if s.computed >= s.known_tokens() {
                s.generated += 1;
                if s.generated == 1 {
                    first.push(id);
                }
                if s.generated >= s.sent.max_tokens {
                    finished.push(id);
                }
            }
        }
        let duration = self.cost.ms(&work).max(MIN_STEP_MS);
        // This step's work belongs to every request in the engine: until its first token it
        // is TTFT, after it inter-token time.
        for s in self.running.iter_mut().chain(self.waiting.iter_mut()) {
            let before_first = s.generated == 0 || first.contains(&s.sent.id);
            if before_first { s.to_first.add(&work) } else { s.after_first.add(&work) }
        }
        if let Some(p) = probe {
            probe_first = first.contains(&p);
        }
        for id in finished {
            if let Some(pos) = self.running.iter().position(|s| s.sent.id == id) {
                let mut seq = self.running.remove(pos);
                self.release(&mut seq);
                self.done.push_back(seq);
                if self.done.len() > MAX_DONE {
                    self.done.pop_front();
                }
            }
        }
        (duration, probe_first)
    }
}

/// A replica as of its last update, for the decisions made at `now_ms`: shared read-only (a
/// prediction steps its own copy), so one writer publishes it and any number of decisions
/// read it.
#[derive(Debug, Clone)]
pub struct Outlook {
    replica: Arc<Replica>,
    now_ms: f64,
}

impl PartialEq for Outlook {
    fn eq(&self, other: &Outlook) -> bool {
        Arc::ptr_eq(&self.replica, &other.replica) && self.now_ms == other.now_ms
    }
}

impl Outlook {
    /// `replica` seen at `now_ms`.
    pub fn new(replica: Arc<Replica>, now_ms: f64) -> Outlook {
        Outlook { replica, now_ms }
    }

    /// The predicted TTFT of a request of `prompt_tokens` with `cached_tokens` cached under
    /// `prefix`, with its own prefill (the uncached tokens at the learned rate) as a part.
    pub fn predict(&self, prompt_tokens: u32, cached_tokens: u32, prefix: u64) -> TtftPrediction {
        let total_ms = self.replica.predict_ttft_ms(prompt_tokens, cached_tokens, prefix, self.now_ms);
        let prefill_ms = self.replica.prefill_ms(prompt_tokens, cached_tokens).min(total_ms);
        let queue_ms = (total_ms - prefill_ms - self.replica.cost.request_ms).max(0.0);
        TtftPrediction { total_ms, queue_ms, prefill_ms }
    }
}

/// How much slower than learned a replica assumes prefill to be. Underestimating prefill
/// admits a request where the engine is still busy with the last one's prompt, which puts
/// prefills of one worker's requests together and makes the whole fleet's schedule bunch
/// into waves; overestimating it by as much costs little (the virtual-time calibrator's
/// twin rule: ×1.1 keeps the oracle's control figures, ×0.9 loses them).
pub const PREFILL_MARGIN: f64 = 1.1;

/// One engine as a router models it: the replica, and the learner of its step cost fed by
/// the replica's samples. The replica is shared copy-on-write: decisions hold [`Outlook`]s of
/// it while this, its one writer, applies what happens next.
#[derive(Debug, Clone)]
pub struct EngineModel {
    replica: Arc<Replica>,
    learner: CostLearner,
}

impl EngineModel {
    /// An idle engine of `shape` whose cost is first assumed to be `prior`.
    pub fn new(shape: EngineShape, prior: StepCost) -> EngineModel {
        let learner = CostLearner::new(prior);
        EngineModel { replica: Arc::new(Replica::new(shape, prior.with_prefill_margin(PREFILL_MARGIN))), learner }
    }

    /// The replica as of now, for decisions.
    pub fn outlook(&self, now_ms: f64) -> Outlook {
        Outlook::new(self.replica.clone(), now_ms)
    }

    /// The cost learner.
    pub fn learner(&self) -> &CostLearner {
        &self.learner
    }

    /// The replica.
    pub fn replica(&self) -> &Replica {
        &self.replica
    }

    /// See [`Replica::dispatch`].
    pub fn dispatch(&mut self, sent: Sent, now_ms: f64) {
        Arc::make_mut(&mut self.replica).dispatch(sent, now_ms);
    }

    /// See [`Replica::started`]; the sample is learned from.
    pub fn started(&mut self, id: u64, now_ms: f64) {
        let sample = Arc::make_mut(&mut self.replica).started(id, now_ms);
        self.learn(sample);
    }

    /// See [`Replica::finished`]; the sample is learned from.
    pub fn finished(&mut self, id: u64, end: &Ended, now_ms: f64) {
        let sample = Arc::make_mut(&mut self.replica).finished(id, end, now_ms);
        self.learn(sample);
    }

    /// See [`Replica::progress`].
    pub fn progress(&mut self, id: u64, generated: u32, now_ms: f64) {
        Arc::make_mut(&mut self.replica).progress(id, generated, now_ms);
    }

    /// See [`Replica::forget`].
    pub fn forget(&mut self, id: u64, now_ms: f64) {
        Arc::make_mut(&mut self.replica).forget(id, now_ms);
    }

    /// See [`Replica::set_num_blocks`].
    pub fn set_num_blocks(&mut self, num_blocks: u32) {
        if self.replica.shape.num_blocks != num_blocks.max(1) {
            Arc::make_mut(&mut self.replica).set_num_blocks(num_blocks);
        }
    }

    fn learn(&mut self, sample: Option<Sample>) {
        if let Some(sample) = sample {
            self.learner.observe(&sample);
            let cost = self.learner.cost().with_prefill_margin(PREFILL_MARGIN);
            Arc::make_mut(&mut self.replica).set_cost(cost);
        }
    }
}

/// Learns a [`StepCost`] from [`Sample`]s: least squares on relative errors over the most
/// recent [`WINDOW`] samples, kept above a floor.
///
/// Each sample says `observed ≈ cost · work` (+ the request cost for first tokens); dividing
/// the row by the observation weighs every sample by its relative error, so a 30-second TTFT
/// does not drown a 40-ms decode. Parameters are relative to the prior (1 = the prior), which
/// keeps the problem well conditioned across units. One joint fit of all five terms is
/// ill-posed on a steady workload: steps, decoding sequences and context grow together, and a
/// first token's wait mixes prefill with the steps of everything ahead of it, so a joint fit
/// trades prefill against decode. The fit is therefore split by what each kind of sample
/// measures best: typical decode steps (a stream's median inter-token gap) fix the per-step
/// terms (base, decode, attention), and the waits for first tokens fix prefill and the
/// per-request cost with the per-step terms held. Each part is solved exactly with every
/// parameter at least [`FLOOR`] (an active-set search, cheap at this size).
#[derive(Debug, Clone, PartialEq)]
pub struct CostLearner {
    prior: StepCost,
    /// Parameters relative to the prior.
    theta: [f64; 5],
    /// The window's rows, relative to their observations, and whether each is a first token.
    rows: VecDeque<([f64; 5], bool)>,
    samples: u64,
}

/// Samples a learner fits.
pub const WINDOW: usize = 256;
/// How far off the current fit a sample may pull it.
const OUTLIER_RATIO: f64 = 2.0;
/// Weight of the prior, in samples' worth per parameter.
const PRIOR_WEIGHT: f64 = 0.02;
/// The smallest a parameter may get, relative to the prior.
const FLOOR: f64 = 0.02;
/// The largest a parameter may get, relative to the prior.
const CEILING: f64 = 50.0;
/// The per-step terms (base, decode, attention) and the per-token and per-request ones.
const STEP_TERMS: [usize; 3] = [0, 2, 3];
const REQUEST_TERMS: [usize; 2] = [1, 4];

impl CostLearner {
    /// A learner starting from `prior`.
    pub fn new(prior: StepCost) -> CostLearner {
        CostLearner { prior, theta: [1.0; 5], rows: VecDeque::with_capacity(WINDOW), samples: 0 }
    }

    /// Samples learned from.
    pub fn samples(&self) -> u64 {
        self.samples
    }

    /// The current estimate.
    pub fn cost(&self) -> StepCost {
        let [a, b, c, d, e] = self.theta;
        StepCost {
            base_ms: self.prior.base_ms * a,
            prefill_ms_per_token: self.prior.prefill_ms_per_token * b,
            decode_ms_per_seq: self.prior.decode_ms_per_seq * c,
            attention_ms_per_ktoken: self.prior.attention_ms_per_ktoken * d,
            request_ms: self.prior.request_ms * e,
        }
    }

    /// Learns from one sample; samples with nothing to explain or no finite time are skipped.
    pub fn observe(&mut self, sample: &Sample) {
        let y = sample.observed_ms;
        let w = &sample.work;
        if !(y.is_finite() && y > 0.0) || w.steps <= 0.0 {
            return;
        }
        let row = [
            w.steps * self.prior.base_ms / y,
            w.prefill_tokens * self.prior.prefill_ms_per_token / y,
            w.decode_seqs * self.prior.decode_ms_per_seq / y,
            w.context_ktokens * self.prior.attention_ms_per_ktoken / y,
            if sample.first_token { self.prior.request_ms / y } else { 0.0 },
        ];
        if row.iter().any(|v| !v.is_finite() || *v < 0.0) {
            return;
        }
        // One sample moves the fit by at most a factor of OUTLIER_RATIO: an interval the
        // replica misattributed (a request it lost track of) cannot drag every term to a bound.
        let predicted: f64 = (0..5).map(|i| row[i] * self.theta[i]).sum();
        let row = if predicted > 0.0 && !(1.0 / OUTLIER_RATIO..=OUTLIER_RATIO).contains(&predicted) {
            let k = predicted.clamp(1.0 / OUTLIER_RATIO, OUTLIER_RATIO) / predicted;
            row.map(|v| v * k)
        } else {
            row
        };
        if self.rows.len() == WINDOW {
            self.rows.pop_front();
        }
        self.rows.push_back((row, sample.first_token));
        self.samples += 1;
        let decode_rows = self.rows.iter().filter(|(_, first)| !first).map(|(r, _)| r);
        if let Some(theta) = fit(decode_rows, &STEP_TERMS, &self.theta) {
            self.theta = theta;
        }
        let first_rows = self.rows.iter().filter(|(_, first)| *first).map(|(r, _)| r);
        if let Some(theta) = fit(first_rows, &REQUEST_TERMS, &self.theta) {
            self.theta = theta;
        }
    }
}

/// The least-squares fit of `rows · θ ≈ 1` over the parameters `free` (the rest held at
/// `theta`), pulled toward 1 with [`PRIOR_WEIGHT`] and each at least [`FLOOR`]; `None` without
/// rows. Every subset of `free` held at the floor is tried, the rest solved for, and the best
/// feasible solution kept.
fn fit<'a>(rows: impl Iterator<Item = &'a [f64; 5]>, free: &[usize], theta: &[f64; 5]) -> Option<[f64; 5]> {
    let n = free.len();
    let mut a = vec![vec![0.0; n]; n];
    let mut b = vec![PRIOR_WEIGHT; n];
    for (i, row) in a.iter_mut().enumerate() {
        row[i] = PRIOR_WEIGHT;
    }
    let mut any = false;
    for r in rows {
        any = true;
        let fixed: f64 = (0..5).filter(|j| !free.contains(j)).map(|j| r[j] * theta[j]).sum();
        let target = 1.0 - fixed;
        for (i, &fi) in free.iter().enumerate() {
            b[i] += r[fi] * target;
            for (k, &fk) in free.iter().enumerate() {
                a[i][k] += r[fi] * r[fk];
            }
        }
    }
    if !any {
        return None;
    }
    let objective =
        |t: &[f64]| (0..n).map(|i| t[i] * ((0..n).map(|k| a[i][k] * t[k]).sum::<f64>() - 2.0 * b[i])).sum::<f64>();
    let mut best: Option<(Vec<f64>, f64)> = None;
    for held in 0u32..(1 << n) {
        let open: Vec<usize> = (0..n).filter(|i| held & (1 << i) == 0).collect();
        let mut t = vec![FLOOR; n];
        if !open.is_empty() {
            let mut m = vec![vec![0.0; open.len() + 1]; open.len()];
            for (r, &i) in open.iter().enumerate() {
                for (c, &k) in open.iter().enumerate() {
                    m[r][c] = a[i][k];
                }
                let held_sum: f64 = (0..n).filter(|k| held & (1 << k) != 0).map(|k| a[i][k] * FLOOR).sum();
                m[r][open.len()] = b[i] - held_sum;
            }
            let Some(x) = solve(m) else { continue };
            if x.iter().any(|v| !v.is_finite() || *v < FLOOR) {
                continue;
            }
            for (k, &i) in open.iter().enumerate() {
                t[i] = x[k];
            }
        }
        let f = objective(&t);
        if best.as_ref().is_none_or(|(_, bf)| f < *bf) {
            best = Some((t, f));
        }
    }
    let (t, _) = best?;
    let mut out = *theta;
    for (k, &i) in free.iter().enumerate() {
        out[i] = t[k].min(CEILING);
    }
    Some(out)
}

/// Gaussian elimination with partial pivoting on an augmented `n × (n+1)` matrix.
fn solve(mut m: Vec<Vec<f64>>) -> Option<Vec<f64>> {
    let n = m.len();
    for col in 0..n {
        let pivot = (col..n).max_by(|&x, &y| m[x][col].abs().total_cmp(&m[y][col].abs()))?;
        if m[pivot][col].abs() < 1e-12 {
            return None;
        }
        m.swap(col, pivot);
        let (upper, lower) = m.split_at_mut(col + 1);
        let pivot_row = &upper[col];
        for row in lower.iter_mut() {
            let k = row[col] / pivot_row[col];
            for (v, p) in row.iter_mut().zip(pivot_row.iter()).skip(col) {
                *v -= k * p;
            }
        }
    }
    let mut x = vec![0.0; n];
    for r in (0..n).rev() {
        let s: f64 = (r + 1..n).map(|c| m[r][c] * x[c]).sum();
        x[r] = (m[r][n] - s) / m[r][r];
    }
    Some(x)
}

#[cfg(test)]
mod tests;
