//! Online calibration of each worker's TTFT model from what the spoke observes.
//!
//! For every request the spoke knows, at dispatch, the prompt tokens queued ahead of it on
//! the worker (its own in-flight ledger) and the request's uncached tokens; at the first
//! token it knows the TTFT. With `ttft ≈ base + (queued + uncached) / rate × slowdown`, each
//! observation with enough work to measure gives a rate estimate; an exponentially weighted
//! average in log space (robust to the occasional outlier) tracks it. The base overhead is
//! tracked from observations with little work.

use switchyard_core::predictor::TtftModel;

/// Weight of a new observation.
const ALPHA: f64 = 0.2;
/// Observations with less prefill work than this inform the base, not the rate.
const MIN_TOKENS_FOR_RATE: f64 = 256.0;

/// A worker's calibrated model.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Calibrator {
    model: TtftModel,
    observations: u64,
}

impl Calibrator {
    /// Starts from the configured model.
    pub fn new(initial: TtftModel) -> Calibrator {
        Calibrator { model: initial, observations: 0 }
    }

    /// The current model.
    pub fn model(&self) -> TtftModel {
        self.model
    }

    /// Observations so far.
    pub fn observations(&self) -> u64 {
        self.observations
    }

    /// Records one TTFT: `work_tokens` = queued + uncached prompt tokens at dispatch.
    pub fn observe(&mut self, work_tokens: u64, running: u32, ttft_ms: f64) {
        if !(ttft_ms.is_finite() && ttft_ms > 0.0) {
            return;
        }
        self.observations += 1;
        let work = work_tokens as f64;
        let slowdown = 1.0 + self.model.decode_interference * f64::from(running);
        if work < MIN_TOKENS_FOR_RATE {
            self.model.base_ms = (1.0 - ALPHA) * self.model.base_ms + ALPHA * ttft_ms.min(10_000.0);
            return;
        }
        let compute_ms = (ttft_ms - self.model.base_ms).max(ttft_ms * 0.1);
        let rate = work * slowdown / compute_ms * 1000.0;
        if rate.is_finite() && rate > 0.0 {
            let log = (1.0 - ALPHA) * self.model.prefill_tokens_per_sec.ln() + ALPHA * rate.ln();
            self.model.prefill_tokens_per_sec = log.exp().clamp(10.0, 10_000_000.0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use switchyard_core::predictor::DEFAULT_TTFT_MODEL;

    #[test]
    fn converges_to_the_observed_rate() {
        let mut c = Calibrator::new(DEFAULT_TTFT_MODEL);
        let truth = TtftModel { prefill_tokens_per_sec: 2_400.0, base_ms: 40.0, ..DEFAULT_TTFT_MODEL };
        for i in 0..60 {
            let work = 1_000 + (i % 7) * 3_000;
            let ttft = truth.base_ms + work as f64 / truth.prefill_tokens_per_sec * 1000.0;
            c.observe(work, 0, ttft);
            c.observe(10, 0, truth.base_ms);
        }
        let m = c.model();
        assert!((m.prefill_tokens_per_sec / 2_400.0 - 1.0).abs() < 0.05, "{}", m.prefill_tokens_per_sec);
        assert!((m.base_ms - 40.0).abs() < 5.0, "{}", m.base_ms);
    }
}
