//! The fidelity guard: does the router see the tokens the engine sees?
//!
//! Every response carries the engine's `usage.prompt_tokens` and, with prompt-token details,
//! `cached_tokens`. The guard compares them with what the router predicted for the worker it
//! chose. A request is a *mismatch* when the prompt lengths differ (the tokenization drifted:
//! template, special tokens, tokenizer files) or when the predicted cache hit exceeds what the
//! engine delivered by more than one block (the index believes in blocks the engine does not
//! have). Over the last [`WINDOW`] requests of a worker set:
//!
//! | mismatch share | mode | routing |
//! |---|---|---|
//! | ≤ 10 % | `EXACT` | cache overlap used as is |
//! | ≤ 50 % | `DEGRADED` | cache overlap halved |
//! | > 50 % | `FALLBACK` | load only (overlap ignored) |
//!
//! Predictions keep being computed in every mode, so the guard recovers by itself once the
//! signals agree again; a tokenizer configuration change starts a fresh window.

use std::collections::VecDeque;

use serde::Serialize;

/// Requests considered.
pub const WINDOW: usize = 20;
/// Requests needed before the mode may change.
const MIN_SAMPLES: usize = 5;

/// Routing mode of a worker set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum Mode {
    /// Signals agree.
    Exact,
    /// Some disagreement: cache signals down-weighted.
    Degraded,
    /// Sustained disagreement: load-aware routing only.
    Fallback,
}

impl Mode {
    /// Metric value: 0, 1, 2.
    pub fn as_gauge(self) -> u8 {
        match self {
            Mode::Exact => 0,
            Mode::Degraded => 1,
            Mode::Fallback => 2,
        }
    }

    /// Cached tokens to believe, given the index's figure.
    pub fn trusted_cached(self, predicted: u32) -> u32 {
        match self {
            Mode::Exact => predicted,
            Mode::Degraded => predicted / 2,
            Mode::Fallback => 0,
        }
    }
}

/// One observation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Sample {
    /// Prompt tokens the router computed.
    pub predicted_prompt: u32,
    /// Prompt tokens the engine reported.
    pub actual_prompt: u32,
    /// Cached tokens the router expected.
    pub predicted_cached: u32,
    /// Cached tokens the engine reported.
    pub actual_cached: u32,
}

/// The guard of one worker set.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Guard {
    mode: Mode,
    #[serde(skip)]
    window: VecDeque<bool>,
    block_size: u32,
    mismatches: u64,
    samples: u64,
    last: Option<Sample>,
}

impl Guard {
    /// A guard in `EXACT` mode.
    pub fn new(block_size: u32) -> Guard {
        Guard { mode: Mode::Exact, window: VecDeque::new(), block_size, mismatches: 0, samples: 0, last: None }
    }

    /// Current mode.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// Starts a fresh window (the tokenizer configuration changed); the mode stays until
    /// enough new samples arrive.
    pub fn reset_window(&mut self) {
        self.window.clear();
    }

    /// Whether `s` is a mismatch.
    pub fn is_mismatch(&self, s: &Sample) -> bool {
        s.predicted_prompt != s.actual_prompt || s.predicted_cached > s.actual_cached + self.block_size
    }

    /// Records one response and returns the (possibly new) mode.
    pub fn record(&mut self, s: Sample) -> Mode {
        let bad = self.is_mismatch(&s);
        self.samples += 1;
        self.mismatches += u64::from(bad);
        self.last = Some(s);
        self.window.push_back(bad);
        while self.window.len() > WINDOW {
            self.window.pop_front();
        }
        if self.window.len() >= MIN_SAMPLES {
            let share = self.window.iter().filter(|b| **b).count() as f64 / self.window.len() as f64;
            self.mode = if share <= 0.10 {
                Mode::Exact
            } else if share <= 0.5 {
                Mode::Degraded
            } else {
                Mode::Fallback
            };
        }
        self.mode
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(prompt_ok: bool) -> Sample {
        Sample {
            predicted_prompt: 100,
            actual_prompt: if prompt_ok { 100 } else { 104 },
            predicted_cached: 64,
            actual_cached: 64,
        }
    }

    #[test]
    fn drift_falls_back_and_recovers() {
        let mut g = Guard::new(16);
        for _ in 0..10 {
            assert_eq!(g.record(sample(true)), Mode::Exact);
        }
        let mut modes = Vec::new();
        for _ in 0..20 {
            modes.push(g.record(sample(false)));
        }
        assert!(modes.contains(&Mode::Degraded));
        assert_eq!(*modes.last().expect("modes"), Mode::Fallback);
        let first_fallback = modes.iter().position(|m| *m == Mode::Fallback).expect("falls back");
        assert!(first_fallback < 15, "falls back within a window");
        g.reset_window();
        let mut recovered = None;
        for i in 0..10 {
            if g.record(sample(true)) == Mode::Exact {
                recovered = Some(i);
                break;
            }
        }
        assert_eq!(recovered, Some(MIN_SAMPLES - 1));
    }

    #[test]
    fn undelivered_cache_hits_count_as_mismatch() {
        let g = Guard::new(16);
        assert!(g.is_mismatch(&Sample {
            predicted_prompt: 10,
            actual_prompt: 10,
            predicted_cached: 64,
            actual_cached: 32
        }));
        assert!(!g.is_mismatch(&Sample {
            predicted_prompt: 10,
            actual_prompt: 10,
            predicted_cached: 64,
            actual_cached: 48
        }));
        assert!(!g.is_mismatch(&Sample {
            predicted_prompt: 10,
            actual_prompt: 10,
            predicted_cached: 0,
            actual_cached: 64
        }));
        assert_eq!(Mode::Degraded.trusted_cached(64), 32);
        assert_eq!(Mode::Fallback.trusted_cached(64), 0);
    }
}
