//! Engine profiles: capacity and timing of one simulated worker.
//!
//! A profile fixes what a router can observe about an engine: how many KV blocks it has,
//! how large the running batch and the per-step token budget are, and how long a scheduler
//! step takes as a function of what it computes. Durations are at time scale 1; the runtime
//! multiplies them by `--time-scale`.
//!
//! The step time model (one forward pass over the scheduled tokens):
//!
//! ```text
//! step_ms = base_ms
//!         + prefill_ms_per_token * prefill_tokens      (compute-bound prompt processing)
//!         + decode_ms_per_seq    * decode_seqs         (per-sequence sampling/overhead)
//!         + attention_ms_per_ktoken * context_ktokens  (KV reads of every scheduled sequence)
//! ```
//!
//! `l40s-27b-fp8` is calibrated against the published 3 × L40S baseline; see
//! `sim/CALIBRATION.md` for the derivation and the calibration run.

use serde::Serialize;

/// Timing parameters of one forward step.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct StepTiming {
    /// Fixed cost of a step (weights read once per step on a memory-bound GPU), ms.
    pub base_ms: f64,
    /// Cost per prompt token computed in the step, ms.
    pub prefill_ms_per_token: f64,
    /// Cost per decoding sequence in the step, ms.
    pub decode_ms_per_seq: f64,
    /// Cost per 1,000 context tokens attended to by the step's sequences, ms.
    pub attention_ms_per_ktoken: f64,
}

/// Capacity and timing of a simulated engine.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Profile {
    /// Profile name.
    pub name: &'static str,
    /// KV-cache blocks on the GPU (`num_gpu_blocks`).
    pub num_gpu_blocks: u32,
    /// Tokens per block (`--block-size`).
    pub block_size: u32,
    /// Running-batch limit (`--max-num-seqs`).
    pub max_num_seqs: u32,
    /// Per-step token budget (`--max-num-batched-tokens`), with chunked prefill.
    pub max_num_batched_tokens: u32,
    /// Context limit (`--max-model-len`).
    pub max_model_len: u32,
    /// Step timing.
    pub timing: StepTiming,
    /// Output length when a request gives no `max_tokens` (the simulator does not model EOS
    /// probabilities; a fixed default keeps runs reproducible).
    pub default_max_tokens: u32,
}

impl StepTiming {
    /// Duration of a step in milliseconds at time scale 1.
    pub fn step_ms(&self, prefill_tokens: u32, decode_seqs: u32, context_tokens: u64) -> f64 {
        self.base_ms
            + self.prefill_ms_per_token * f64::from(prefill_tokens)
            + self.decode_ms_per_seq * f64::from(decode_seqs)
            + self.attention_ms_per_ktoken * context_tokens as f64 / 1000.0
    }
}

/// A small, fast engine for tests: 512 blocks of 16 tokens, millisecond steps.
pub const TINY: Profile = Profile {
    name: "tiny",
    num_gpu_blocks: 512,
    block_size: 16,
    max_num_seqs: 32,
    max_num_batched_tokens: 2048,
    max_model_len: 8192,
    timing: StepTiming {
        base_ms: 2.0,
        prefill_ms_per_token: 0.01,
        decode_ms_per_seq: 0.05,
        attention_ms_per_ktoken: 0.002,
    },
    default_max_tokens: 16,
};

/// One L40S (48 GB) serving a 27B FP8 model with vLLM, calibrated to the published
/// 3 × L40S baseline (random routing: median TTFT ≈ 6.9 s, median ITL ≈ 44 ms).
/// 11,000 blocks × 16 tokens = 176,000 tokens of KV cache: 11 of the benchmark's 16,000-token
/// prefixes, against 24 in the workload.
pub const L40S_27B_FP8: Profile = Profile {
    name: "l40s-27b-fp8",
    num_gpu_blocks: 11_000,
    block_size: 16,
    max_num_seqs: 64,
    max_num_batched_tokens: 8192,
    max_model_len: 32_768,
    timing: StepTiming {
        base_ms: 36.0,
        prefill_ms_per_token: 0.42,
        decode_ms_per_seq: 0.35,
        attention_ms_per_ktoken: 0.05,
    },
    default_max_tokens: 300,
};

/// Every built-in profile.
pub const PROFILES: [&Profile; 2] = [&TINY, &L40S_27B_FP8];

/// Looks a profile up by name.
pub fn by_name(name: &str) -> Option<&'static Profile> {
    PROFILES.into_iter().find(|p| p.name == name)
}
