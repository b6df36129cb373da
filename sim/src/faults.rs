//! Fault knobs for reliability tests, set at run time through `POST /sim/faults`.
//!
//! Every knob is a counter or factor read by the component it affects, so a test can arm
//! exactly N failures and observe them. Nothing here is active unless armed; `GET /sim/faults`
//! shows what is still armed.
//!
//! | knob | effect |
//! |---|---|
//! | `dropEventBatches: N` | the next N KV-event batches are not sent on PUB (still replayable) |
//! | `loseEventBatches: N` | the next N batches are neither sent nor replayable (a gap) |
//! | `duplicateEventBatches: N` | the next N batches are sent twice (same sequence number) |
//! | `restartEventStream: true` | engine restart for event consumers (cache cleared, seq 0) |
//! | `slowdown: f` | every step takes f × its modelled time |
//! | `failRequests: N` | the next N generation requests get HTTP 500 (vLLM's error body) |
//! | `cutStreams: {count, afterTokens}` | the next `count` *streamed* generations send the chunks of their first `afterTokens` tokens (for chat, after the role chunk), and when the next token is due the connection is aborted: no finish chunk, no usage chunk, no `data: [DONE]`, and the chunked body never gets its terminating chunk, so the client sees a truncated body (a stream with at most `afterTokens` tokens ends normally; non-streamed requests are not affected) |
//! | `stallAfterHeaders: N` | the next N generation requests (streamed or not) get `200` with their usual headers (`text/event-stream` or `application/json`) and then nothing: the body stays open and empty until the client goes away or the simulator shuts down, and the request never reaches the engine |
//!
//! Order for one generation request, after validation: `failRequests`, then
//! `stallAfterHeaders`, then `cutStreams` (streams only). A stalled body ends (connection
//! aborted) when the simulator shuts down, so no task outlives [`crate::Fleet::shutdown`];
//! `GET /sim/state` reports how many stalled bodies are open (`stalledRequests`).

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};

/// Armed faults of one worker.
#[derive(Debug, Default)]
pub struct Faults {
    drop_event_batches: AtomicU32,
    lose_event_batches: AtomicU32,
    duplicate_event_batches: AtomicU32,
    slowdown_bits: AtomicU64,
    fail_requests: AtomicU32,
    cut_streams: Mutex<(u32, u32)>,
    stall_after_headers: AtomicU32,
    stalled_open: Arc<AtomicU32>,
}

/// `POST /sim/faults` body; absent fields leave a knob unchanged.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FaultRequest {
    /// Skip sending the next N event batches on the PUB socket (they stay replayable), like a
    /// subscriber falling behind the high-water mark.
    #[serde(default)]
    pub drop_event_batches: Option<u32>,
    /// Skip the next N event batches entirely (not sent, not replayable): a gap replay cannot
    /// fill.
    #[serde(default)]
    pub lose_event_batches: Option<u32>,
    /// Send the next N event batches twice.
    #[serde(default)]
    pub duplicate_event_batches: Option<u32>,
    /// Restart the event stream now, as an engine restart does: the prefix cache is cleared
    /// (`AllBlocksCleared`), the sequence goes back to 0 and the replay buffer is emptied.
    #[serde(default)]
    pub restart_event_stream: Option<bool>,
    /// Multiply every step's duration by this factor (1 = normal).
    #[serde(default)]
    pub slowdown: Option<f64>,
    /// Answer the next N generation requests with HTTP 500.
    #[serde(default)]
    pub fail_requests: Option<u32>,
    /// Cut the next `count` streams after `after_tokens` tokens without a final event.
    #[serde(default)]
    pub cut_streams: Option<CutStreams>,
    /// Answer the next N generation requests with `200` and headers, then send nothing.
    #[serde(default)]
    pub stall_after_headers: Option<u32>,
}

/// Parameters of a stream cut.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CutStreams {
    /// How many streams to cut.
    pub count: u32,
    /// Tokens delivered before the cut.
    pub after_tokens: u32,
}

fn take(counter: &AtomicU32) -> bool {
    counter.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)).is_ok()
}

impl Faults {
    /// Applies a request.
    pub fn arm(&self, r: &FaultRequest) {
        if let Some(n) = r.drop_event_batches {
            self.drop_event_batches.store(n, Ordering::SeqCst);
        }
        if let Some(n) = r.lose_event_batches {
            self.lose_event_batches.store(n, Ordering::SeqCst);
        }
        if let Some(n) = r.duplicate_event_batches {
            self.duplicate_event_batches.store(n, Ordering::SeqCst);
        }
        if let Some(f) = r.slowdown {
            self.slowdown_bits.store(f.to_bits(), Ordering::SeqCst);
        }
        if let Some(n) = r.fail_requests {
            self.fail_requests.store(n, Ordering::SeqCst);
        }
        if let Some(c) = r.cut_streams
            && let Ok(mut g) = self.cut_streams.lock()
        {
            *g = (c.count, c.after_tokens);
        }
        if let Some(n) = r.stall_after_headers {
            self.stall_after_headers.store(n, Ordering::SeqCst);
        }
    }

    /// Current knob values.
    pub fn snapshot(&self) -> FaultRequest {
        let cut = self.cut_streams.lock().map(|g| *g).unwrap_or_default();
        FaultRequest {
            drop_event_batches: Some(self.drop_event_batches.load(Ordering::SeqCst)),
            lose_event_batches: Some(self.lose_event_batches.load(Ordering::SeqCst)),
            duplicate_event_batches: Some(self.duplicate_event_batches.load(Ordering::SeqCst)),
            restart_event_stream: Some(false),
            slowdown: Some(self.slowdown()),
            fail_requests: Some(self.fail_requests.load(Ordering::SeqCst)),
            cut_streams: Some(CutStreams { count: cut.0, after_tokens: cut.1 }),
            stall_after_headers: Some(self.stall_after_headers.load(Ordering::SeqCst)),
        }
    }

    /// Consumes one armed PUB-side drop.
    pub fn take_drop(&self) -> bool {
        take(&self.drop_event_batches)
    }

    /// Consumes one armed loss.
    pub fn take_lose(&self) -> bool {
        take(&self.lose_event_batches)
    }

    /// Consumes one armed duplicate.
    pub fn take_duplicate(&self) -> bool {
        take(&self.duplicate_event_batches)
    }

    /// Step-duration factor.
    pub fn slowdown(&self) -> f64 {
        let f = f64::from_bits(self.slowdown_bits.load(Ordering::SeqCst));
        if f.is_finite() && f > 0.0 { f } else { 1.0 }
    }

    /// Consumes one armed request failure.
    pub fn take_fail_request(&self) -> bool {
        take(&self.fail_requests)
    }

    /// Consumes one armed stream cut, returning after how many tokens to cut.
    pub fn take_cut(&self) -> Option<u32> {
        let mut g = self.cut_streams.lock().ok()?;
        if g.0 == 0 {
            return None;
        }
        g.0 -= 1;
        Some(g.1)
    }
}

/// Held by a stalled response body for as long as it is open.
#[derive(Debug)]
pub struct StallGuard(Arc<AtomicU32>);

impl Drop for StallGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Faults {
    /// Consumes one armed stall, returning the guard the stalled body holds.
    pub fn take_stall(&self) -> Option<StallGuard> {
        if !take(&self.stall_after_headers) {
            return None;
        }
        self.stalled_open.fetch_add(1, Ordering::SeqCst);
        Some(StallGuard(self.stalled_open.clone()))
    }

    /// Stalled response bodies still open.
    pub fn stalled_open(&self) -> u32 {
        self.stalled_open.load(Ordering::SeqCst)
    }
}
