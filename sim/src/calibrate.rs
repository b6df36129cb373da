//! Virtual-time fleet runs for calibrating profiles.
//!
//! Several [`Engine`]s run in simulated time (no sleeping) behind a chosen routing rule, driven
//! by closed-loop clients (`concurrency` clients each send a request, wait for its last token,
//! and send the next) or by open-loop Poisson arrivals ([`Arrival`]). Because the engine model is deterministic and time is virtual, a
//! run at time scale 1 over hundreds of 16k-token requests takes seconds of CPU. The figures
//! (median/p95 TTFT, median ITL, median E2E, requests and goodput per minute, prefix-cache hit
//! rate) are what the benchmark measures through the real HTTP stack, minus network and
//! tokenisation overhead. With no wall clock in the loop they carry no measurement noise, which
//! makes them the reference for what a routing rule can reach on a profile at all.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use serde::Serialize;

use crate::engine::{Engine, RequestId, mix};
use crate::profile::Profile;

/// A benchmark workload, at token level.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Workload {
    /// 16,256 unique prompt tokens per request.
    Control,
    /// One of 24 shared 16,000-token prefixes plus 256 unique tokens.
    SharedPrefix,
    /// Conversations of [`TURNS`] turns: a first turn of [`FIRST_TURN_TOKENS`] unique tokens,
    /// then each turn's prompt is the previous prompt, the engine's answer to it and
    /// [`TURN_TOKENS`] new tokens (GuideLLM keeps the history). A client runs one
    /// conversation to its end, then starts the next.
    MultiTurn,
}

/// Multi-turn: unique tokens of a conversation's first turn.
pub const FIRST_TURN_TOKENS: u32 = 8_000;
/// Multi-turn: new tokens of every later turn.
pub const TURN_TOKENS: u32 = 400;
/// Multi-turn: turns per conversation.
pub const TURNS: u32 = 8;

impl Workload {
    /// The benchmark's TTFT objective for goodput (BENCHMARK.md), ms at time scale 1.
    pub fn slo_ms(self) -> f64 {
        match self {
            Workload::Control | Workload::SharedPrefix => 8_000.0,
            Workload::MultiTurn => 4_000.0,
        }
    }
}

/// The built-in routing rules.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Routing {
    /// Uniformly random (kube-proxy).
    Random,
    /// Each prefix (multi-turn: each conversation) always on the same engine (ideal cache
    /// affinity).
    PrefixAffinity,
    /// Engines in turn.
    RoundRobin,
    /// The engine with the fewest requests (running and waiting), ties to the lowest index:
    /// what a load-balancing router does when no prefix matches.
    LeastOutstanding,
    /// The engine with the lowest true TTFT for this request: each engine cloned and stepped
    /// until the request's first token, plus the rest of its step in progress. Greedy: it does
    /// not see later arrivals.
    Oracle,
}

/// A routing rule under test. The run calls [`Route::choose`] for every request and reports
/// every first token back, so a rule that learns online (as the spoke's TTFT calibration
/// does) learns here from the same observations.
pub trait Route {
    /// The engine (index into `ctx.engines`) the request goes to.
    fn choose(&mut self, ctx: &RouteContext<'_>) -> usize;

    /// Whether the request is placed now; a request held is offered again (oldest first) after
    /// every step end and arrival, and placed anyway once no engine has work left.
    fn admit(&mut self, _ctx: &RouteContext<'_>) -> bool {
        true
    }

    /// A first token on `engine`: `work_tokens` were queued or uncached on it when the request
    /// was dispatched (the dispatcher's own ledger plus the request's uncached tokens), while
    /// `running` requests were in its batch.
    fn first_token(&mut self, _engine: usize, _work_tokens: u64, _running: u32, _ttft_ms: f64) {}

    /// The request just placed on `engine` (the one [`Route::choose`] returned) is `id` there:
    /// what a router knows of what it sent (tokens, output limit, time).
    fn dispatched(&mut self, _engine: usize, _id: RequestId, _prompt: &[u32], _max_tokens: u32, _now_ms: f64) {}

    /// `id`'s first token reached the client at `now_ms` (a router relaying the stream sees it).
    fn started(&mut self, _engine: usize, _id: RequestId, _now_ms: f64) {}

    /// `id`'s token number `generated` (1 = the first) reached the client at `now_ms`; called
    /// for every token after the first.
    fn progress(&mut self, _engine: usize, _id: RequestId, _generated: u32, _now_ms: f64) {}

    /// `id`'s last token reached the client at `now_ms`.
    fn finished(&mut self, _engine: usize, _id: RequestId, _now_ms: f64) {}
}

/// The token ids a virtual-time engine (or its replica) draws outputs from.
fn output_vocab() -> Arc<Vec<u32>> {
    Arc::new((1000..1400).collect())
}

/// Factors on the profile's step timing that a [`Twin`] steps with: 1 everywhere is a replica
/// with the true timing model, which in this deterministic simulator decides as the oracle does.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TimingError {
    /// On the cost per prompt token.
    pub prefill: f64,
    /// On the cost per decoding sequence.
    pub decode: f64,
    /// On the fixed cost of a step.
    pub base: f64,
    /// On the cost per 1,000 context tokens attended to.
    pub attention: f64,
}

impl Default for TimingError {
    fn default() -> Self {
        TimingError { prefill: 1.0, decode: 1.0, base: 1.0, attention: 1.0 }
    }
}

/// A router that keeps a replica of every engine built only from what a router can know — the
/// requests it sent (their tokens and output limits), when each one's first and last tokens
/// came back — stepped in time with its own, possibly wrong, timing model, and that places a
/// request where the replica, cloned and stepped, gives it the earliest first token. Where the
/// replica lags (its timing too slow), a first token seen marks the prompt computed and a last
/// token seen drops the request; where it runs ahead it is not corrected. What it measures is
/// how exact a router's model of the engines must be for the oracle's decisions.
pub struct Twin {
    replicas: Vec<Engine>,
    /// Per replica, when its next step starts (virtual ms).
    next_step_ms: Vec<f64>,
    /// Per engine, the engine's request id → the replica's.
    ids: Vec<HashMap<RequestId, RequestId>>,
}

impl Twin {
    /// Replicas of `engines` engines of `profile`, stepping with `error` on its timing.
    pub fn new(profile: &Profile, engines: u32, error: TimingError) -> Twin {
        let mut p = profile.clone();
        p.timing.prefill_ms_per_token *= error.prefill;
        p.timing.decode_ms_per_seq *= error.decode;
        p.timing.base_ms *= error.base;
        p.timing.attention_ms_per_ktoken *= error.attention;
        let vocab = output_vocab();
        Twin {
            replicas: (0..engines).map(|i| Engine::new(p.clone(), mix(u64::from(i) + 99), 7, vocab.clone())).collect(),
            next_step_ms: vec![0.0; engines as usize],
            ids: (0..engines).map(|_| HashMap::new()).collect(),
        }
    }

    /// Steps replica `i` through every step that starts by `now_ms`.
    fn advance(&mut self, i: usize, now_ms: f64) {
        let replica = &mut self.replicas[i];
        while self.next_step_ms[i] <= now_ms
            && let Some(out) = replica.step()
        {
            self.next_step_ms[i] += out.duration_ms;
        }
        if !replica.has_work() {
            self.next_step_ms[i] = self.next_step_ms[i].max(now_ms);
        }
    }
}

impl Route for Twin {
    fn choose(&mut self, ctx: &RouteContext<'_>) -> usize {
        let mut best = (0, f64::INFINITY);
        for i in 0..self.replicas.len() {
            self.advance(i, ctx.now_ms);
            let rest_of_step = (self.next_step_ms[i] - ctx.now_ms).max(0.0);
            let ttft = rest_of_step + self.replicas[i].predict_ttft_ms(ctx.prompt);
            if ttft < best.1 {
                best = (i, ttft);
            }
        }
        best.0
    }

    fn dispatched(&mut self, engine: usize, id: RequestId, prompt: &[u32], max_tokens: u32, now_ms: f64) {
        self.advance(engine, now_ms);
        let replica_id = self.replicas[engine].add_request(prompt.to_vec(), max_tokens);
        self.ids[engine].insert(id, replica_id);
    }

    fn started(&mut self, engine: usize, id: RequestId, now_ms: f64) {
        self.advance(engine, now_ms);
        if let Some(&replica_id) = self.ids[engine].get(&id) {
            self.replicas[engine].mark_prefilled(replica_id);
        }
    }

    fn finished(&mut self, engine: usize, id: RequestId, now_ms: f64) {
        self.advance(engine, now_ms);
        if let Some(replica_id) = self.ids[engine].remove(&id)
            && self.replicas[engine].contains(replica_id)
        {
            self.replicas[engine].abort(replica_id);
        }
    }
}

/// A request dispatched to an engine that has not produced its first token: what a router
/// knows of its own traffic (the spoke's in-flight ledger).
#[derive(Debug, Clone)]
pub struct Dispatched {
    id: RequestId,
    prompt: Arc<Vec<u32>>,
    /// Prompt tokens neither cached on the engine nor booked by an unstarted request at
    /// dispatch.
    pub uncached_tokens: u64,
    work_tokens: u64,
    running: u32,
}

/// What a routing rule sees when it places one request.
pub struct RouteContext<'a> {
    /// The request's prompt.
    pub prompt: &'a [u32],
    /// Which of the workload's shared prefixes (multi-turn: which conversation) it carries,
    /// for affinity rules.
    pub prefix: u32,
    /// Requests placed before this one.
    pub placed: u64,
    /// The engines, in their true current state.
    pub engines: &'a [Engine],
    /// Milliseconds left of each engine's step in progress (0 when idle).
    pub rest_of_step_ms: Vec<f64>,
    /// Per engine, the requests dispatched to it without a first token yet.
    pub unstarted: &'a [Vec<Dispatched>],
    /// A fresh random number.
    pub random: u64,
    /// Virtual time of the decision, ms since the run started.
    pub now_ms: f64,
}

impl RouteContext<'_> {
    /// Prompt tokens a router that books its placements would count as cached on `engine`:
    /// what the engine's prefix cache holds, or the block-aligned common prefix with a request
    /// already dispatched there and not yet started (whose blocks are on their way).
    pub fn cached_or_booked_tokens(&self, engine: usize) -> u32 {
        let engine_ref = &self.engines[engine];
        let bs = engine_ref.profile().block_size as usize;
        let booked = self.unstarted[engine]
            .iter()
            .map(|d| d.prompt.iter().zip(self.prompt).take_while(|(a, b)| a == b).count() / bs * bs)
            .max()
            .unwrap_or(0);
        engine_ref.cached_prefix_tokens(self.prompt).max(booked as u32)
    }

    /// (requests, uncached prompt tokens) dispatched to `engine` without a first token yet.
    pub fn ledger(&self, engine: usize) -> (u32, u64) {
        let list = &self.unstarted[engine];
        (list.len() as u32, list.iter().map(|d| d.uncached_tokens).sum())
    }
}

impl Route for Routing {
    fn choose(&mut self, ctx: &RouteContext<'_>) -> usize {
        let n = ctx.engines.len();
        match self {
            Routing::Random => (ctx.random % n as u64) as usize,
            Routing::PrefixAffinity => ctx.prefix as usize % n,
            Routing::RoundRobin => (ctx.placed % n as u64) as usize,
            Routing::LeastOutstanding => (0..n)
                .min_by_key(|&i| {
                    let s = ctx.engines[i].stats();
                    (s.running + s.waiting, i)
                })
                .unwrap_or(0),
            Routing::Oracle => (0..n)
                .map(|i| (i, ctx.rest_of_step_ms[i] + ctx.engines[i].predict_ttft_ms(ctx.prompt)))
                .min_by(|a, b| a.1.total_cmp(&b.1))
                .map_or(0, |(i, _)| i),
        }
    }
}

/// How requests arrive.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum Arrival {
    /// Closed-loop clients, each sending its next request when the last one finished.
    #[serde(rename_all = "camelCase")]
    Concurrent {
        /// Clients.
        concurrency: u32,
        /// Seconds over which the clients start, evenly spaced (GuideLLM's
        /// `rampup_duration`); 0 starts them all at once.
        rampup_s: f64,
        /// Seconds from a client's last token to its next request reaching the engine: what a
        /// live client, router and engine front end take in between (0: at once).
        think_s: f64,
    },
    /// Open-loop arrivals with exponential gaps (GuideLLM's `poisson` profile), whatever the
    /// fleet's state. Every arrival is one request, so multi-turn (whose turns wait for the
    /// previous answer) needs closed-loop clients; [`run`] refuses it.
    #[serde(rename_all = "camelCase")]
    Poisson {
        /// Requests per second of virtual time.
        rate_per_s: f64,
    },
}

/// Parameters of one run.
#[derive(Debug, Clone, Serialize)]
pub struct RunSpec {
    /// Engines in the fleet.
    pub engines: u32,
    /// Workload.
    pub workload: Workload,
    /// How requests arrive.
    pub arrival: Arrival,
    /// Requests measured (after warm-up).
    pub requests: u32,
    /// Requests before measuring starts: closed loop, the first to complete; open loop, the
    /// first to arrive.
    pub warmup: u32,
    /// Output tokens per request.
    pub output_tokens: u32,
    /// Seed.
    pub seed: u64,
}

/// Figures of one run, at time scale 1.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RunResult {
    /// Median TTFT, ms.
    pub ttft_ms_p50: f64,
    /// 95th percentile TTFT, ms.
    pub ttft_ms_p95: f64,
    /// Median inter-token latency, ms.
    pub itl_ms_p50: f64,
    /// Median end-to-end latency, s.
    pub e2e_s_p50: f64,
    /// Completed requests per minute.
    pub requests_per_min: f64,
    /// Completed requests per minute whose TTFT met [`Workload::slo_ms`].
    pub goodput_per_min: f64,
    /// Fleet prefix-cache hit rate (hit tokens / queried tokens).
    pub cache_hit_rate: f64,
    /// Engine preemptions (KV cache exhausted, a running request's work recomputed) per
    /// completed request, over the whole run.
    pub preemptions_per_request: f64,
}

/// A multi-turn client's conversation.
#[derive(Debug, Clone)]
struct Conversation {
    id: u32,
    turns: u32,
    /// The last turn's prompt (the answer to it is appended when the next turn starts).
    history: Vec<u32>,
}

/// A request that arrived, before it is placed.
struct Held {
    client: usize,
    prompt: Vec<u32>,
    prefix: u32,
    arrived: f64,
}

struct Pending {
    client: usize,
    /// Generated tokens (multi-turn only: the next turn's prompt carries them).
    answer: Vec<u32>,
    arrived: f64,
    first: Option<f64>,
    last: f64,
    itls: Vec<f64>,
}

fn percentile(v: &mut [f64], p: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    let idx = ((v.len() - 1) as f64 * p).round() as usize;
    v[idx]
}

/// Why a run cannot start.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RunError {
    /// Multi-turn conversations need closed-loop clients.
    #[error("multi-turn needs concurrent arrivals: every turn waits for the previous answer")]
    MultiTurnNeedsClients,
    /// The arrival rate or concurrency cannot drive a run.
    #[error(
        "arrivals need a positive concurrency with finite, non-negative ramp-up and think times, or a positive, finite rate"
    )]
    NoArrivals,
}

/// Runs one experiment in virtual time with `router` placing every request.
pub fn run(profile: &Profile, spec: &RunSpec, router: &mut dyn Route) -> Result<RunResult, RunError> {
    let clients = match spec.arrival {
        Arrival::Concurrent { concurrency, rampup_s, think_s }
            if concurrency > 0 && [rampup_s, think_s].iter().all(|s| *s >= 0.0 && s.is_finite()) =>
        {
            concurrency as usize
        }
        Arrival::Poisson { rate_per_s } if rate_per_s > 0.0 && rate_per_s.is_finite() => {
            if spec.workload == Workload::MultiTurn {
                return Err(RunError::MultiTurnNeedsClients);
            }
            0
        }
        _ => return Err(RunError::NoArrivals),
    };
    let vocab = output_vocab();
    let mut engines: Vec<Engine> = (0..spec.engines)
        .map(|i| Engine::new(profile.clone(), mix(u64::from(i) + 17), spec.seed, vocab.clone()))
        .collect();
    let mut busy_until: Vec<Option<(f64, crate::engine::StepOutput)>> = (0..spec.engines).map(|_| None).collect();
    let mut unstarted: Vec<Vec<Dispatched>> = (0..spec.engines).map(|_| Vec::new()).collect();
    let mut pending: HashMap<(usize, RequestId), Pending> = HashMap::new();
    let mut rng = spec.seed ^ 0xabcd;
    let mut next_rand = move || {
        rng = mix(rng);
        rng
    };
    let mut unique_counter: u32 = 0;
    let mut unique_tokens = |n: u32| -> Vec<u32> {
        unique_counter += 1;
        (0..n).map(|i| 1_000_000 + unique_counter * 20_000 + i).collect()
    };
    // Per client, the conversation in progress (multi-turn): its number, the turns done and
    // the prompt and answer of the last turn.
    let mut conversations: Vec<Option<Conversation>> = vec![None; clients];
    let mut conversation_counter: u32 = 0;
    let mut next_prompt = |client: usize, answer: Vec<u32>, next_rand: &mut dyn FnMut() -> u64| -> (Vec<u32>, u32) {
        match spec.workload {
            Workload::Control => (unique_tokens(16_256), 0),
            Workload::SharedPrefix => {
                let prefix = (next_rand() % 24) as u32;
                let mut prompt: Vec<u32> = (0..16_000).map(|i| 50_000 + prefix * 16_000 + i).collect();
                prompt.extend(unique_tokens(256));
                (prompt, prefix)
            }
            Workload::MultiTurn => {
                let conv = &mut conversations[client];
                match conv.take().filter(|c| c.turns < TURNS) {
                    Some(mut c) => {
                        c.history.extend(answer);
                        c.history.extend(unique_tokens(TURN_TOKENS));
                        c.turns += 1;
                        let out = (c.history.clone(), c.id);
                        *conv = Some(c);
                        out
                    }
                    None => {
                        conversation_counter += 1;
                        let history = unique_tokens(FIRST_TURN_TOKENS);
                        let id = conversation_counter;
                        *conv = Some(Conversation { id, turns: 1, history: history.clone() });
                        (history, id)
                    }
                }
            }
        }
    };
    let mut now = 0.0;
    let mut placed = 0u64;
    let (mut done, mut measured_start) = (0u32, None::<f64>);
    let (mut ttfts, mut itls, mut e2es) = (Vec::new(), Vec::new(), Vec::new());
    let mut submit = |held: &Held,
                      engines: &mut Vec<Engine>,
                      unstarted: &mut Vec<Vec<Dispatched>>,
                      pending: &mut HashMap<(usize, RequestId), Pending>,
                      busy_until: &[Option<(f64, crate::engine::StepOutput)>],
                      router: &mut dyn Route,
                      now: f64,
                      next_rand: &mut dyn FnMut() -> u64|
     -> bool {
        let prompt = &held.prompt;
        let ctx = RouteContext {
            prompt,
            prefix: held.prefix,
            placed,
            engines: engines.as_slice(),
            rest_of_step_ms: busy_until.iter().map(|b| b.as_ref().map_or(0.0, |(t, _)| t - now)).collect(),
            unstarted: unstarted.as_slice(),
            random: next_rand(),
            now_ms: now,
        };
        let idle = engines.iter().all(|e| !e.has_work());
        if !router.admit(&ctx) && !idle {
            return false;
        }
        let e = router.choose(&ctx).min(engines.len() - 1);
        placed += 1;
        // The ledger counts what the router itself would count (the spoke's booking): blocks a
        // request dispatched earlier will write are not this request's prefill work.
        let uncached = (prompt.len() as u32).saturating_sub(ctx.cached_or_booked_tokens(e));
        let queued: u64 = unstarted[e].iter().map(|d| d.uncached_tokens).sum();
        let running = engines[e].stats().running;
        let prompt = Arc::new(prompt.clone());
        let id = engines[e].add_request(prompt.to_vec(), spec.output_tokens);
        router.dispatched(e, id, &prompt, spec.output_tokens, now);
        let uncached_tokens = u64::from(uncached);
        unstarted[e].push(Dispatched { id, prompt, uncached_tokens, work_tokens: queued + uncached_tokens, running });
        pending.insert(
            (e, id),
            Pending {
                client: held.client,
                answer: Vec::new(),
                arrived: held.arrived,
                first: None,
                last: now,
                itls: Vec::new(),
            },
        );
        true
    };
    // Requests arrived and not placed yet (a rule that paces its dispatches holds them),
    // oldest first.
    let mut held: VecDeque<Held> = VecDeque::new();
    // Every submission places one request with the same state; only the client and the
    // answer its next prompt carries differ.
    macro_rules! drain {
        () => {
            while held.front().is_some_and(|h| {
                submit(h, &mut engines, &mut unstarted, &mut pending, &busy_until, router, now, &mut next_rand)
            }) {
                held.pop_front();
            }
        };
    }
    macro_rules! submit {
        ($client:expr, $answer:expr) => {{
            let (prompt, prefix) = next_prompt($client, $answer, &mut next_rand);
            held.push_back(Held { client: $client, prompt, prefix, arrived: now });
            drain!();
        }};
    }
    // Closed loop: each client's next request, due at a time (in time order: ramp-up starts,
    // then answers plus a constant think time), with the answer its prompt carries.
    let (rampup_ms, think_ms) = match spec.arrival {
        Arrival::Concurrent { rampup_s, think_s, .. } => (rampup_s * 1_000.0, think_s * 1_000.0),
        Arrival::Poisson { .. } => (0.0, 0.0),
    };
    let mut client_next: std::collections::VecDeque<(f64, usize, Vec<u32>)> =
        (0..clients).map(|c| (rampup_ms * c as f64 / clients as f64, c, Vec::new())).collect();
    // Clients that start together are all queued before the first step, as a burst is.
    while client_next.front().is_some_and(|(at, _, _)| *at <= now) {
        let Some((_, client, answer)) = client_next.pop_front() else { break };
        submit!(client, answer);
    }
    let total = spec.requests + spec.warmup;
    // Open loop: the next arrival's time and index (the index stands in for the client).
    let gap_ms = |rate_per_s: f64, next_rand: &mut dyn FnMut() -> u64| {
        let uniform = ((next_rand() >> 11) as f64 + 1.0) / (1u64 << 53) as f64;
        -uniform.ln() / rate_per_s * 1_000.0
    };
    let mut next_arrival = match spec.arrival {
        Arrival::Poisson { .. } => Some((0.0, 0usize)),
        Arrival::Concurrent { .. } => None,
    };
    let (mut first_measured_arrival, mut last_arrival) = (None::<f64>, 0.0);
    while done < total {
        // Start a step on every idle engine with work.
        for (i, e) in engines.iter_mut().enumerate() {
            if busy_until[i].is_none()
                && let Some(out) = e.step()
            {
                busy_until[i] = Some((now + out.duration_ms, out));
            }
        }
        let step_end = busy_until
            .iter()
            .enumerate()
            .filter_map(|(i, b)| b.as_ref().map(|(t, _)| (i, *t)))
            .min_by(|a, b| a.1.total_cmp(&b.1));
        // A client's next request, or an arrival, due before the earliest step end is placed first.
        if let Some(&(at, _, _)) = client_next.front()
            && step_end.is_none_or(|(_, t)| at <= t)
        {
            let Some((_, client, answer)) = client_next.pop_front() else { break };
            now = at;
            submit!(client, answer);
            continue;
        }
        if let (Some((at, index)), Arrival::Poisson { rate_per_s }) = (next_arrival, spec.arrival)
            && step_end.is_none_or(|(_, t)| at <= t)
        {
            now = at;
            last_arrival = at;
            if index >= spec.warmup as usize {
                first_measured_arrival.get_or_insert(at);
            }
            submit!(index, Vec::new());
            next_arrival = (index + 1 < total as usize).then(|| (at + gap_ms(rate_per_s, &mut next_rand), index + 1));
            continue;
        }
        // Advance to the earliest step end.
        let Some((i, _)) = step_end else {
            break;
        };
        let Some((t, out)) = busy_until[i].take() else { break };
        now = t;
        for tok in &out.tokens {
            let key = (i, tok.request);
            let Some(p) = pending.get_mut(&key) else { continue };
            if p.first.is_none() {
                p.first = Some(now);
                if let Some(pos) = unstarted[i].iter().position(|d| d.id == tok.request) {
                    let d = unstarted[i].swap_remove(pos);
                    router.first_token(i, d.work_tokens, d.running, now - p.arrived);
                }
                router.started(i, tok.request, now);
            } else {
                p.itls.push(now - p.last);
                router.progress(i, tok.request, tok.index + 1, now);
            }
            p.last = now;
            if spec.workload == Workload::MultiTurn {
                p.answer.push(tok.token);
            }
            if tok.finished
                && let Some(p) = pending.remove(&key)
            {
                router.finished(i, tok.request, now);
                done += 1;
                let measured = match spec.arrival {
                    Arrival::Concurrent { .. } => done > spec.warmup,
                    Arrival::Poisson { .. } => p.client >= spec.warmup as usize,
                };
                if measured {
                    measured_start.get_or_insert(p.arrived);
                    ttfts.push(p.first.unwrap_or(now) - p.arrived);
                    itls.extend(p.itls);
                    e2es.push((now - p.arrived) / 1000.0);
                }
                if done < total && matches!(spec.arrival, Arrival::Concurrent { .. }) {
                    if think_ms > 0.0 {
                        // Kept in time order: a ramp-up start may still be due later.
                        let due = now + think_ms;
                        let pos = client_next.partition_point(|(at, _, _)| *at <= due);
                        client_next.insert(pos, (due, p.client, p.answer));
                    } else {
                        submit!(p.client, p.answer);
                    }
                }
            }
        }
        // A step ended: a request held for pacing may go now.
        drain!();
    }
    let (q, h, preemptions) = engines.iter().map(|e| e.counters()).fold((0u64, 0u64, 0u64), |(q, h, p), c| {
        (q + c.prefix_cache_queries, h + c.prefix_cache_hits, p + c.preemptions)
    });
    // Closed loop: from the first measured request's arrival to the end. Open loop: the measured
    // arrivals' span, so that requests per minute is the arrival rate the fleet was offered.
    let span_ms = match spec.arrival {
        Arrival::Concurrent { .. } => now - measured_start.unwrap_or(0.0),
        Arrival::Poisson { .. } => last_arrival - first_measured_arrival.unwrap_or(0.0),
    };
    let span_min = span_ms.max(1.0) / 60_000.0;
    Ok(RunResult {
        ttft_ms_p50: percentile(&mut ttfts.clone(), 0.5),
        ttft_ms_p95: percentile(&mut ttfts, 0.95),
        itl_ms_p50: percentile(&mut itls, 0.5),
        e2e_s_p50: percentile(&mut e2es, 0.5),
        requests_per_min: f64::from(spec.requests) / span_min,
        goodput_per_min: ttfts.iter().filter(|&&t| t <= spec.workload.slo_ms()).count() as f64 / span_min,
        cache_hit_rate: if q == 0 { 0.0 } else { h as f64 / q as f64 },
        preemptions_per_request: preemptions as f64 / f64::from(done.max(1)),
    })
}
