//! The worker runtime: owns one [`Engine`] in a task and paces it in real time.
//!
//! The loop admits new requests between steps (as vLLM's engine core does), runs a step,
//! sleeps for the step's duration × time scale, then delivers the step's tokens to each
//! request's channel and hands the step's KV events to the publisher as one batch. A request
//! whose receiver is gone (client disconnected) is aborted before the next step, so it stops
//! consuming cache and compute. Oracle queries are answered from the engine's true state.

use std::collections::HashMap;
use std::sync::Arc;

use tokio::sync::{mpsc, oneshot};
use tokio::time::{Instant, sleep_until};
use tokio_util::sync::CancellationToken;

use crate::engine::{Engine, EngineCounters, EngineStats, RequestId, TokenOut};
use crate::faults::Faults;
use crate::metrics::{Hist, Metrics, Values};
use crate::publisher::PublisherCommand;

/// What a request's receiver gets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Emitted {
    /// A generated token.
    Token {
        /// Token id.
        token: u32,
        /// Output position from 0.
        index: u32,
        /// Last token.
        finished: bool,
        /// Prompt tokens served from the prefix cache.
        cached_prompt_tokens: u32,
    },
}

/// The engine's answer to an oracle query.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct OracleAnswer {
    /// Prompt tokens cached right now.
    pub cached_prefix_tokens: u32,
    /// Exact TTFT if the request arrived now and nothing after it, at time scale 1, ms.
    pub predicted_ttft_ms: f64,
    /// Engine state.
    pub stats: EngineStats,
}

enum Command {
    Add {
        prompt: Vec<u32>,
        max_tokens: u32,
        out: mpsc::UnboundedSender<Emitted>,
        natural_stop: bool,
        forced: Option<Arc<[u32]>>,
    },
    Oracle {
        tokens: Vec<u32>,
        reply: oneshot::Sender<OracleAnswer>,
    },
    State {
        reply: oneshot::Sender<(EngineStats, EngineCounters)>,
    },
    RestartEvents,
}

/// Sends work to a running worker. Cheap to clone.
#[derive(Clone, Debug)]
pub struct WorkerHandle {
    tx: mpsc::UnboundedSender<Command>,
}

/// The worker stopped.
#[derive(Debug, thiserror::Error)]
#[error("the simulated engine has stopped")]
pub struct EngineStopped;

impl WorkerHandle {
    /// Submits a request; tokens arrive on the returned receiver. `natural_stop` marks a
    /// request without `max_tokens` (finish reason `stop` instead of `length`).
    pub fn submit(
        &self,
        prompt: Vec<u32>,
        max_tokens: u32,
        natural_stop: bool,
    ) -> Result<mpsc::UnboundedReceiver<Emitted>, EngineStopped> {
        self.submit_with_output(prompt, max_tokens, natural_stop, None)
    }

    /// Submits a request whose output tokens are fixed in advance (constrained decoding, see
    /// [`Engine::add_request_with_output`]); `natural_stop` tells the metrics whether the
    /// output ends before `max_tokens`.
    pub fn submit_with_output(
        &self,
        prompt: Vec<u32>,
        max_tokens: u32,
        natural_stop: bool,
        forced: Option<Arc<[u32]>>,
    ) -> Result<mpsc::UnboundedReceiver<Emitted>, EngineStopped> {
        let (out, rx) = mpsc::unbounded_channel();
        self.tx.send(Command::Add { prompt, max_tokens, out, natural_stop, forced }).map_err(|_| EngineStopped)?;
        Ok(rx)
    }

    /// Asks the engine about `tokens`.
    pub async fn oracle(&self, tokens: Vec<u32>) -> Result<OracleAnswer, EngineStopped> {
        let (reply, rx) = oneshot::channel();
        self.tx.send(Command::Oracle { tokens, reply }).map_err(|_| EngineStopped)?;
        rx.await.map_err(|_| EngineStopped)
    }

    /// Simulates an engine restart for event consumers: the prefix cache is cleared and the
    /// event stream restarts at sequence 0 with `AllBlocksCleared`.
    pub fn restart_events(&self) -> Result<(), EngineStopped> {
        self.tx.send(Command::RestartEvents).map_err(|_| EngineStopped)
    }

    /// Current state and counters.
    pub async fn state(&self) -> Result<(EngineStats, EngineCounters), EngineStopped> {
        let (reply, rx) = oneshot::channel();
        self.tx.send(Command::State { reply }).map_err(|_| EngineStopped)?;
        rx.await.map_err(|_| EngineStopped)
    }
}

/// A request in the engine, with what its metrics need (vLLM's request lifecycle: arrival,
/// first scheduled, first token, last token).
struct Live {
    out: mpsc::UnboundedSender<Emitted>,
    arrived: Instant,
    /// Start of the step that first scheduled it (resumptions after preemption do not count).
    scheduled: Option<Instant>,
    first_token: Option<Instant>,
    last_token: Option<Instant>,
    natural_stop: bool,
    prompt_len: u32,
    /// `max_tokens` as vLLM's sampling parameters would carry it.
    max_tokens_param: u32,
    generated: u32,
    preemptions: u32,
}

impl Live {
    /// Records the request-level histograms and the finish reason of a request that produced
    /// its last token at `now`.
    fn finished(self, now: Instant, cached_prompt_tokens: u32, m: &mut Values) {
        let secs = |from: Instant, to: Instant| to.saturating_duration_since(from).as_secs_f64();
        let scheduled = self.scheduled.unwrap_or(self.arrived);
        let first_token = self.first_token.unwrap_or(now);
        let decode = secs(first_token, now);
        m.observe(Hist::E2e, secs(self.arrived, now));
        m.observe(Hist::QueueTime, secs(self.arrived, scheduled));
        m.observe(Hist::PrefillTime, secs(scheduled, first_token));
        m.observe(Hist::DecodeTime, decode);
        m.observe(Hist::InferenceTime, secs(scheduled, now));
        // The first token belongs to the prefill.
        let tpot = if self.generated > 1 { decode / f64::from(self.generated - 1) } else { 0.0 };
        m.observe(Hist::TimePerOutputToken, tpot);
        m.observe(Hist::PromptTokens, f64::from(self.prompt_len));
        m.observe(Hist::GenerationTokens, f64::from(self.generated));
        m.observe(Hist::MaxNumGenerationTokens, f64::from(self.generated));
        m.observe(Hist::ParamsN, 1.0);
        m.observe(Hist::ParamsMaxTokens, f64::from(self.max_tokens_param));
        m.observe(Hist::NumPreemptions, f64::from(self.preemptions));
        m.observe(Hist::PrefillKvComputedTokens, f64::from(self.prompt_len.saturating_sub(cached_prompt_tokens)));
        if self.natural_stop {
            m.finished_stop += 1;
        } else {
            m.finished_length += 1;
        }
    }
}

/// Everything the loop needs besides the engine.
pub struct LoopDeps {
    /// Metrics to keep current.
    pub metrics: Arc<Metrics>,
    /// Fault knobs.
    pub faults: Arc<Faults>,
    /// Publisher input, when KV events are enabled.
    pub publisher: Option<mpsc::UnboundedSender<PublisherCommand>>,
    /// Multiplier on every step duration.
    pub time_scale: f64,
    /// Stops the loop.
    pub shutdown: CancellationToken,
}

/// Spawns the engine loop; the returned handle submits work, the join handle ends when
/// `deps.shutdown` fires.
pub fn spawn(engine: Engine, deps: LoopDeps) -> (WorkerHandle, tokio::task::JoinHandle<()>) {
    let (tx, rx) = mpsc::unbounded_channel();
    let task = tokio::spawn(run(engine, rx, deps));
    (WorkerHandle { tx }, task)
}

async fn run(mut engine: Engine, mut rx: mpsc::UnboundedReceiver<Command>, deps: LoopDeps) {
    let mut live: HashMap<RequestId, Live> = HashMap::new();
    let mut next_deadline = Instant::now();
    loop {
        if !engine.has_work() {
            let cmd = tokio::select! {
                c = rx.recv() => c,
                () = deps.shutdown.cancelled() => None,
            };
            let Some(cmd) = cmd else { return };
            handle(&mut engine, &mut live, cmd, &deps, Instant::now());
            next_deadline = Instant::now();
        }
        while let Ok(cmd) = rx.try_recv() {
            handle(&mut engine, &mut live, cmd, &deps, Instant::now());
        }
        let gone: Vec<RequestId> = live.iter().filter(|(_, l)| l.out.is_closed()).map(|(id, _)| *id).collect();
        for id in gone {
            engine.abort(id);
            live.remove(&id);
            deps.metrics.update(|v| v.finished_abort += 1);
        }
        let Some(out) = engine.step() else { continue };

        // Pace in real time; keep the cadence when steps run back to back.
        let scaled_ms = out.duration_ms * deps.time_scale * deps.faults.slowdown();
        let now = Instant::now();
        if now > next_deadline {
            let behind = (now - next_deadline).as_secs_f64();
            deps.metrics.update(|v| v.behind_schedule_seconds += behind);
        }
        let start = next_deadline.max(now);
        next_deadline = start + std::time::Duration::from_secs_f64(scaled_ms.max(0.0) / 1000.0);
        for id in &out.admitted {
            if let Some(l) = live.get_mut(id) {
                l.scheduled.get_or_insert(start);
            }
        }
        for id in &out.preempted_requests {
            if let Some(l) = live.get_mut(id) {
                l.preemptions += 1;
            }
        }
        loop {
            tokio::select! {
                () = sleep_until(next_deadline) => break,
                c = rx.recv() => match c {
                    Some(cmd) => handle(&mut engine, &mut live, cmd, &deps, next_deadline),
                    None => return,
                },
                () = deps.shutdown.cancelled() => return,
            }
        }

        if !out.events.is_empty()
            && let Some(publisher) = &deps.publisher
        {
            let _ = publisher.send(PublisherCommand::Batch(out.events));
        }
        let now = Instant::now();
        let stats = engine.stats();
        let c = engine.counters();
        deps.metrics.update(|v| {
            deliver(&out.tokens, &mut live, now, v);
            v.running = stats.running;
            v.waiting = stats.waiting;
            v.kv_usage = stats.kv_usage;
            v.prefix_cache_queries = c.prefix_cache_queries;
            v.prefix_cache_hits = c.prefix_cache_hits;
            v.generation_tokens = c.generation_tokens;
            v.preemptions = c.preemptions;
        });
    }
}

/// Hands a step's tokens to their requests and records the token-level metrics, and the
/// request-level ones of the requests that finished.
fn deliver(tokens: &[TokenOut], live: &mut HashMap<RequestId, Live>, now: Instant, m: &mut Values) {
    if tokens.is_empty() {
        return;
    }
    // vLLM's tokens per iteration: the generated tokens, plus the computed prompt tokens of
    // the requests whose prefill completed in it.
    let mut iteration_tokens = tokens.len() as u64;
    for t in tokens {
        let Some(l) = live.get_mut(&t.request) else { continue };
        match l.last_token {
            None => {
                m.observe(Hist::Ttft, now.saturating_duration_since(l.arrived).as_secs_f64());
                let cached = t.cached_prompt_tokens.min(l.prompt_len);
                let computed = l.prompt_len - cached;
                iteration_tokens += u64::from(computed);
                m.prompt_tokens += u64::from(l.prompt_len);
                m.prompt_tokens_computed += u64::from(computed);
                m.prompt_tokens_cached += u64::from(cached);
                l.first_token = Some(now);
            }
            Some(prev) => m.observe(Hist::Itl, now.saturating_duration_since(prev).as_secs_f64()),
        }
        l.last_token = Some(now);
        l.generated += 1;
        let _ = l.out.send(Emitted::Token {
            token: t.token,
            index: t.index,
            finished: t.finished,
            cached_prompt_tokens: t.cached_prompt_tokens,
        });
        if t.finished
            && let Some(l) = live.remove(&t.request)
        {
            l.finished(now, t.cached_prompt_tokens, m);
        }
    }
    m.observe(Hist::IterationTokens, iteration_tokens as f64);
}

/// Applies one command. `step_ends_at` is when the step in progress releases its tokens
/// (now when the engine is between steps): a request added now is first scheduled after it.
fn handle(
    engine: &mut Engine,
    live: &mut HashMap<RequestId, Live>,
    cmd: Command,
    deps: &LoopDeps,
    step_ends_at: Instant,
) {
    match cmd {
        Command::Add { prompt, max_tokens, out, natural_stop, forced } => {
            let prompt_len = prompt.len() as u32;
            // vLLM fills in an absent `max_tokens` with the rest of the context; the simulator
            // then stops at its fixed default instead (a forced output's budget is already
            // the parameter's value).
            let max_tokens_param = if natural_stop && forced.is_none() {
                engine.profile().max_model_len.saturating_sub(prompt_len)
            } else {
                max_tokens
            };
            let id = engine.add_request_with_output(prompt, max_tokens, forced);
            live.insert(
                id,
                Live {
                    out,
                    arrived: Instant::now(),
                    scheduled: None,
                    first_token: None,
                    last_token: None,
                    natural_stop,
                    prompt_len,
                    max_tokens_param,
                    generated: 0,
                    preemptions: 0,
                },
            );
        }
        Command::Oracle { tokens, reply } => {
            // Only the clone happens here; stepping the copy runs on a blocking thread so an
            // oracle query never delays the live engine it describes.
            let snapshot = engine.clone();
            let stats = engine.stats();
            let scale = deps.time_scale * deps.faults.slowdown();
            let rest_of_step_ms = if scale > 0.0 {
                step_ends_at.saturating_duration_since(Instant::now()).as_secs_f64() * 1000.0 / scale
            } else {
                0.0
            };
            tokio::task::spawn_blocking(move || {
                let cached_prefix_tokens = snapshot.cached_prefix_tokens(&tokens);
                let predicted_ttft_ms = rest_of_step_ms + snapshot.into_predicted_ttft_ms(&tokens);
                let _ = reply.send(OracleAnswer { cached_prefix_tokens, predicted_ttft_ms, stats });
            });
        }
        Command::State { reply } => {
            let _ = reply.send((engine.stats(), engine.counters()));
        }
        Command::RestartEvents => {
            let cleared = engine.reset_prefix_cache();
            if let Some(publisher) = &deps.publisher {
                let _ = publisher.send(PublisherCommand::Restart(vec![cleared]));
            }
        }
    }
}
