//! Time-to-first-token prediction.
//!
//! A vLLM engine answers a request's first token after (a) the work queued ahead of it has
//! been prefilled and (b) its own uncached prompt tokens have been prefilled. Under continuous
//! batching with chunked prefill every scheduler step also carries the running sequences'
//! decode tokens, which slows prefill roughly in proportion to the running batch. The model:
//!
//! ```text
//! slowdown   = 1 + decode_interference * running_requests
//! queue_ms   = waiting_prefill_tokens / prefill_rate * slowdown          (when the backlog is known)
//!            | waiting_requests * queued_request_ms * slowdown           (otherwise)
//! prefill_ms = (prompt_tokens - cached_tokens) / prefill_rate * slowdown
//! ttft_ms    = base_ms + queue_ms + prefill_ms
//! ```
//!
//! The parameters are per worker set; later components calibrate them online from observed
//! TTFTs. The function is pure and total: every input yields a finite, non-negative figure.

use serde::{Deserialize, Serialize};

/// Parameters of the TTFT model for one worker set.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TtftModel {
    /// Prefill throughput of one idle worker, tokens per second.
    pub prefill_tokens_per_sec: f64,
    /// Fixed overhead per request (scheduling, first decode step, network), milliseconds.
    pub base_ms: f64,
    /// Queue cost of one waiting request when the backlog in tokens is unknown, milliseconds.
    pub queued_request_ms: f64,
    /// Fractional prefill slowdown per running sequence.
    pub decode_interference: f64,
}

/// Inputs for one (request, worker) pair.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct TtftInputs {
    /// Prompt length in tokens.
    pub prompt_tokens: u32,
    /// Prompt tokens already in the worker's prefix cache.
    pub cached_tokens: u32,
    /// Requests waiting in the engine.
    pub waiting_requests: u32,
    /// Prompt tokens waiting for prefill, when known.
    pub waiting_prefill_tokens: Option<u64>,
    /// Requests in the running batch.
    pub running_requests: u32,
}

/// A prediction with its parts, for traces.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TtftPrediction {
    /// Total predicted TTFT.
    pub total_ms: f64,
    /// Waiting for work ahead in the queue.
    pub queue_ms: f64,
    /// Prefill of this request's uncached tokens.
    pub prefill_ms: f64,
}

/// Defaults for a mid-size model on one datacenter GPU; calibration replaces them.
pub const DEFAULT_TTFT_MODEL: TtftModel =
    TtftModel { prefill_tokens_per_sec: 8_000.0, base_ms: 25.0, queued_request_ms: 250.0, decode_interference: 0.02 };

impl Default for TtftModel {
    fn default() -> Self {
        DEFAULT_TTFT_MODEL
    }
}

impl TtftModel {
    /// Predicts TTFT for one request on one worker.
    pub fn predict(&self, inputs: &TtftInputs) -> TtftPrediction {
        let rate = if self.prefill_tokens_per_sec.is_finite() && self.prefill_tokens_per_sec > 0.0 {
            self.prefill_tokens_per_sec
        } else {
            DEFAULT_TTFT_MODEL.prefill_tokens_per_sec
        };
        let nonneg = |x: f64| if x.is_finite() && x > 0.0 { x } else { 0.0 };
        let slowdown = 1.0 + nonneg(self.decode_interference) * f64::from(inputs.running_requests);
        let ms_for = |tokens: f64| tokens / rate * 1_000.0 * slowdown;
        let queue_ms = match inputs.waiting_prefill_tokens {
            Some(tokens) => ms_for(tokens as f64),
            None => f64::from(inputs.waiting_requests) * nonneg(self.queued_request_ms) * slowdown,
        };
        let uncached = inputs.prompt_tokens.saturating_sub(inputs.cached_tokens);
        let prefill_ms = ms_for(f64::from(uncached));
        TtftPrediction { total_ms: nonneg(self.base_ms) + queue_ms + prefill_ms, queue_ms, prefill_ms }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cached_tokens_shorten_prefill() {
        let m = TtftModel {
            prefill_tokens_per_sec: 1000.0,
            base_ms: 10.0,
            queued_request_ms: 100.0,
            decode_interference: 0.0,
        };
        let cold = m.predict(&TtftInputs { prompt_tokens: 2000, ..Default::default() });
        let warm = m.predict(&TtftInputs { prompt_tokens: 2000, cached_tokens: 1500, ..Default::default() });
        assert_eq!(cold.total_ms, 2010.0);
        assert_eq!(warm.total_ms, 510.0);
    }

    #[test]
    fn queue_and_running_batch_add_delay() {
        let m = TtftModel {
            prefill_tokens_per_sec: 1000.0,
            base_ms: 0.0,
            queued_request_ms: 100.0,
            decode_interference: 0.5,
        };
        let p = m.predict(&TtftInputs {
            prompt_tokens: 1000,
            waiting_requests: 3,
            running_requests: 2,
            ..Default::default()
        });
        assert_eq!(p.queue_ms, 600.0);
        assert_eq!(p.prefill_ms, 2000.0);
        let known = m.predict(&TtftInputs {
            prompt_tokens: 0,
            waiting_prefill_tokens: Some(500),
            waiting_requests: 9,
            ..Default::default()
        });
        assert_eq!(known.queue_ms, 500.0);
    }

    #[test]
    fn degenerate_parameters_stay_finite() {
        let m = TtftModel {
            prefill_tokens_per_sec: 0.0,
            base_ms: f64::NAN,
            queued_request_ms: -1.0,
            decode_interference: f64::INFINITY,
        };
        let p = m.predict(&TtftInputs {
            prompt_tokens: u32::MAX,
            cached_tokens: 0,
            waiting_requests: u32::MAX,
            waiting_prefill_tokens: None,
            running_requests: u32::MAX,
        });
        assert!(p.total_ms.is_finite() && p.total_ms >= 0.0);
    }
}
