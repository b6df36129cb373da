//! Dispatch pacing: when a request chosen for a worker is sent there, or waits at the router.
//!
//! A worker's engine computes prompts in arrival order, at most one step's token budget
//! (`--max-num-batched-tokens`) per step. Two long prompts sent to it together are computed one
//! after the other whatever the router does next, so the second's first token waits for the
//! whole of the first's prefill; held at the router instead, it can still go to whichever worker
//! frees first. Worse, requests admitted back to back finish together: while an engine prefills,
//! its running requests gain one token per (long) step, so requests whose prefills followed each
//! other have nearly the same number of tokens when the prefills end and reach their last token
//! within a few short decode steps of each other. Their clients then come back together, and
//! the fleet's schedule settles into waves of simultaneous prefills (issue 12's tuning log,
//! "Pacing"). A short gap after each first token, while the engine only decodes, spreads those
//! ends apart again.
//!
//! Invariants:
//! - a request whose prompt fits one step together with the prompts still waiting for their
//!   first token on the worker is never held by the first rule (short prefills batch into one
//!   step; holding them would only add steps);
//! - the gap is a fixed fraction ([`GAP_FRACTION`]) of the last request's own wait for its first
//!   token on that worker, so it scales with the prompts the worker is serving: milliseconds
//!   behind cached prompts, a fraction of a second behind 16k-token ones;
//! - the rule reads only what the router itself knows (its in-flight ledger, first-token
//!   times, the configured step budget); the caller bounds how long a request can be held.

/// The gap after a first token, as a fraction of that request's wait for it, before the worker
/// takes the next long prefill. The virtual-time calibrator's control workload (c = 32, think
/// 0 / 0.4 / 0.8 s, mean over four ramp-ups, queue predictor) gives p50 / p95: 0 → 10.4 / 23.7,
/// 10.0 / 20.9, 11.4 / 23.4 s; 0.04 → 9.7 / 18.8 and 9.9 / 15.3 s at 0.4 / 0.8; 0.08 → 11.0 /
/// 17.3, 10.7 / 16.1, 9.8 / 14.6 s; 0.12 → 11.1 / 14.7, 10.5 / 14.7 s; 0.2 → 15.8 / 15.9 s (the
/// gaps cost more prefill capacity than they save).
pub const GAP_FRACTION: f64 = 0.08;

/// What pacing needs to know of one worker, all from the router's own ledger.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PacingView {
    /// Uncached prompt tokens of the requests sent to the worker that have no first token yet.
    pub queued_prefill_tokens: u64,
    /// The worker's step token budget (`--max-num-batched-tokens`).
    pub step_token_budget: u32,
    /// Not before this (the router's clock, ms) does the worker take a long prefill:
    /// [`reopens_at_ms`] of its last first token.
    pub reopens_at_ms: f64,
}

impl PacingView {
    /// Whether a request with `own_prefill_tokens` uncached prompt tokens is sent to the worker
    /// at `now_ms` (otherwise it waits at the router and is planned again).
    pub fn takes(&self, own_prefill_tokens: u64, now_ms: f64) -> bool {
        self.batches(own_prefill_tokens) && now_ms >= self.reopens_at_ms
    }

    /// Whether the prompt would batch with the ones still waiting for their first token on the
    /// worker (the first rule). A request held while this is false waits for a first token on
    /// the worker, not for the clock: only then can the answer change.
    pub fn batches(&self, own_prefill_tokens: u64) -> bool {
        self.queued_prefill_tokens == 0
            || self.queued_prefill_tokens + own_prefill_tokens <= u64::from(self.step_token_budget)
    }
}

/// When a worker whose request got its first token at `first_token_ms`, after waiting
/// `wait_ms` since it was sent, takes the next long prefill.
pub fn reopens_at_ms(first_token_ms: f64, wait_ms: f64) -> f64 {
    first_token_ms + GAP_FRACTION * wait_ms.max(0.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    const BUDGET: u32 = 8192;

    fn view(queued: u64, reopens_at_ms: f64) -> PacingView {
        PacingView { queued_prefill_tokens: queued, step_token_budget: BUDGET, reopens_at_ms }
    }

    #[test]
    fn an_idle_worker_takes_any_prompt_and_a_busy_one_only_what_batches() {
        assert!(view(0, 0.0).takes(16_256, 10.0));
        // A 16k-token prompt still waiting: the next long one waits, a short one batches.
        assert!(!view(16_256, 0.0).takes(16_256, 10.0));
        assert!(!view(16_256, 0.0).takes(256, 10.0));
        assert!(view(700, 0.0).takes(256, 10.0));
        assert!(view(4096, 0.0).takes(4096, 10.0));
        assert!(!view(4096, 0.0).takes(4097, 10.0));
    }

    #[test]
    fn a_hold_says_whether_it_waits_for_a_first_token_or_for_the_clock() {
        // Behind a long prompt, only its first token can release the next long one.
        assert!(!view(16_256, 0.0).batches(16_256));
        // In the gap alone, the prompt batches and the clock releases it.
        let in_gap = view(0, 500.0);
        assert!(in_gap.batches(16_256) && !in_gap.takes(16_256, 499.0) && in_gap.takes(16_256, 500.0));
    }

    #[test]
    fn the_gap_after_a_first_token_scales_with_its_wait() {
        let at = reopens_at_ms(1_000.0, 10_000.0);
        assert_eq!(at, 1_000.0 + GAP_FRACTION * 10_000.0);
        assert!(!view(0, at).takes(256, at - 1.0));
        assert!(view(0, at).takes(256, at));
        // A short request's gap is short; a negative wait (clock skew) adds none.
        assert!(reopens_at_ms(1_000.0, 150.0) - 1_000.0 < 15.0);
        assert_eq!(reopens_at_ms(1_000.0, -5.0), 1_000.0);
    }
}
