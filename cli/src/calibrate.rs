//! `switchyard calibrate`: virtual-time runs of simulated engines, for tuning profiles and
//! routing. Besides the simulator's built-in rules, `switchyard` routes with the spoke's own
//! decision function ([`switchyard_core::decide`]) and its online TTFT calibration, fed what
//! the spoke knows in production: engine load, its prefix index (exact here, booked at
//! dispatch) and its in-flight ledger, planned through the same `switchyard_gateway::plan`
//! functions the spoke uses. Time is virtual, so a comparison carries no noise.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use anyhow::Context;
use switchyard_core::pacing;
use switchyard_core::replica::{Ended, EngineModel, Sent, median};
use switchyard_core::request::WorkerKey;
use switchyard_core::{FleetConfig, Outcome, Target};
use switchyard_crds::{DispatchPacing, TtftPredictor};
use switchyard_gateway::request::{Dialect, Prompt, TextPrompt};
use switchyard_gateway::{InferenceRequest, plan};
use switchyard_sim::calibrate::{Arrival, Route, RouteContext, Routing, RunSpec, TimingError, Twin, Workload, run};
use switchyard_sim::engine::{EngineStats, RequestId};
use switchyard_sim::profile::{self, Profile};
use switchyard_spoke::calibration::Calibrator;

use crate::loopback_fleet::LoopbackFleet;
use crate::{Exit, Format};

/// Arguments of `switchyard calibrate`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Engine profile.
    #[arg(long, default_value = "l40s-27b-fp8")]
    profile: String,
    /// Engines in the fleet.
    #[arg(long, default_value_t = 3)]
    engines: u32,
    /// KV-cache blocks per engine instead of the profile's (how the figures depend on capacity).
    #[arg(long)]
    kv_blocks: Option<u32>,
    /// Workloads (control, shared-prefix, multi-turn).
    #[arg(long, value_delimiter = ',', default_value = "control,shared-prefix")]
    workload: Vec<String>,
    /// Routing rules (random, prefix-affinity, round-robin, least-outstanding, oracle,
    /// switchyard, twin, paced-oracle).
    #[arg(long, value_delimiter = ',', default_value = "random,prefix-affinity")]
    routing: Vec<String>,
    /// Concurrency levels (closed-loop clients).
    #[arg(long, value_delimiter = ',', default_value = "4,8,16,24,32")]
    concurrency: Vec<u32>,
    /// Seconds over which closed-loop clients start (GuideLLM's ramp-up), at time scale 1.
    #[arg(long, default_value_t = 0.0)]
    rampup: f64,
    /// Seconds from a closed-loop client's last token to its next request reaching the engine
    /// (what a live client, router and engine front end take in between), at time scale 1.
    #[arg(long, default_value_t = 0.0)]
    think: f64,
    /// Poisson arrival rates, requests per second, instead of concurrency levels.
    #[arg(long, value_delimiter = ',')]
    rate: Vec<f64>,
    /// Measured requests per run.
    #[arg(long, default_value_t = 240)]
    requests: u32,
    /// Requests completed before measuring.
    #[arg(long, default_value_t = 48)]
    warmup: u32,
    /// Output tokens per request.
    #[arg(long, default_value_t = 300)]
    output_tokens: u32,
    /// Seed.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// For `switchyard`: engine metrics as the spoke sees them, scraped every this many
    /// simulated milliseconds (0: exact at every decision).
    #[arg(long, default_value_t = 0.0)]
    scrape_ms: f64,
    /// For `switchyard`: the worker set's `ttftPredictor` (Queue or EngineReplica).
    #[arg(long, value_parser = parse_predictor, default_value = "Queue")]
    ttft_predictor: TtftPredictor,
    /// For `twin`: factors on the profile's step timing its replicas step with, as
    /// `prefill=F,decode=F,base=F,attention=F` (each 1 when left out).
    #[arg(long, value_parser = parse_timing_error, default_value = "prefill=1")]
    twin_timing: TimingError,
    /// For `switchyard`: the worker set's `dispatchPacing` (Paced or Immediate).
    #[arg(long, value_parser = parse_pacing, default_value = "Paced")]
    dispatch_pacing: DispatchPacing,
    /// Output format.
    #[arg(long, value_enum, default_value_t)]
    format: Format,
}

/// `Paced` or `Immediate`, as in the worker set's spec.
fn parse_pacing(text: &str) -> Result<DispatchPacing, String> {
    serde_json::from_value(serde_json::Value::String(text.to_owned()))
        .map_err(|_| format!("`{text}`: expected Paced or Immediate"))
}

/// `Queue` or `EngineReplica`, as in the worker set's spec.
fn parse_predictor(text: &str) -> Result<TtftPredictor, String> {
    serde_json::from_value(serde_json::Value::String(text.to_owned()))
        .map_err(|_| format!("`{text}` is not a TTFT predictor (Queue, EngineReplica)"))
}

/// `prefill=1.1,decode=0.8` → the factors, every other one 1.
fn parse_timing_error(text: &str) -> Result<TimingError, String> {
    let mut error = TimingError::default();
    for part in text.split(',').filter(|p| !p.is_empty()) {
        let (key, value) = part.split_once('=').ok_or_else(|| format!("`{part}`: expected KEY=FACTOR"))?;
        let factor: f64 = value.parse().map_err(|_| format!("`{part}`: `{value}` is not a number"))?;
        if !(factor.is_finite() && factor > 0.0) {
            return Err(format!("`{part}`: the factor must be positive"));
        }
        let slot = match key {
            "prefill" => &mut error.prefill,
            "decode" => &mut error.decode,
            "base" => &mut error.base,
            "attention" => &mut error.attention,
            other => return Err(format!("`{other}`: expected prefill, decode, base or attention")),
        };
        *slot = factor;
    }
    Ok(error)
}

/// Runs every combination and prints the figures (time scale 1).
pub fn run_all(args: &Args) -> anyhow::Result<Exit> {
    let mut p = profile::by_name(&args.profile).with_context(|| format!("unknown profile `{}`", args.profile))?.clone();
    if let Some(blocks) = args.kv_blocks {
        anyhow::ensure!(blocks > 0, "--kv-blocks must be positive");
        p.num_gpu_blocks = blocks;
    }
    let arrivals: Vec<Arrival> = if args.rate.is_empty() {
        args.concurrency
            .iter()
            .map(|&concurrency| Arrival::Concurrent { concurrency, rampup_s: args.rampup, think_s: args.think })
            .collect()
    } else {
        args.rate.iter().map(|&rate_per_s| Arrival::Poisson { rate_per_s }).collect()
    };
    let mut rows = Vec::new();
    for w in &args.workload {
        let workload = match w.as_str() {
            "control" => Workload::Control,
            "shared-prefix" => Workload::SharedPrefix,
            "multi-turn" => Workload::MultiTurn,
            other => anyhow::bail!("unknown workload `{other}`"),
        };
        for r in &args.routing {
            for &arrival in &arrivals {
                let mut router: Box<dyn Route> = match r.as_str() {
                    "random" => Box::new(Routing::Random),
                    "prefix-affinity" => Box::new(Routing::PrefixAffinity),
                    "round-robin" => Box::new(Routing::RoundRobin),
                    "least-outstanding" => Box::new(Routing::LeastOutstanding),
                    "oracle" => Box::new(Routing::Oracle),
                    "twin" => Box::new(Twin::new(&p, args.engines, args.twin_timing)),
                    "paced-oracle" => Box::new(PacedOracle::new(&p, args.engines)),
                    "switchyard" => Box::new(SpokeRoute::new(
                        &p,
                        args.engines,
                        args.output_tokens,
                        args.scrape_ms,
                        args.ttft_predictor,
                        args.dispatch_pacing,
                    )?),
                    other => anyhow::bail!("unknown routing `{other}`"),
                };
                let spec = RunSpec {
                    engines: args.engines,
                    workload,
                    arrival,
                    requests: args.requests,
                    warmup: args.warmup,
                    output_tokens: args.output_tokens,
                    seed: args.seed,
                };
                let result = run(&p, &spec, router.as_mut()).with_context(|| format!("{w} at {arrival:?}"))?;
                if args.format == Format::Text {
                    let load = match arrival {
                        Arrival::Concurrent { concurrency, .. } => format!("c={concurrency}"),
                        Arrival::Poisson { rate_per_s } => format!("rate={rate_per_s}/s"),
                    };
                    println!(
                        "{:<14} {:<16} {:<10} ttft p50 {:>8.0} ms  p95 {:>8.0} ms  itl p50 {:>5.1} ms  e2e p50 {:>6.1} s  {:>6.1} req/min  goodput {:>6.1}/min  hit {:>5.1}%  preempted/req {:.2}",
                        w,
                        r,
                        load,
                        result.ttft_ms_p50,
                        result.ttft_ms_p95,
                        result.itl_ms_p50,
                        result.e2e_s_p50,
                        result.requests_per_min,
                        result.goodput_per_min,
                        100.0 * result.cache_hit_rate,
                        result.preemptions_per_request
                    );
                }
                let twin_timing = (r == "twin").then_some(args.twin_timing);
                rows.push(serde_json::json!({"routing": r, "spec": spec, "twinTiming": twin_timing, "result": result}));
            }
        }
    }
    if args.format == Format::Json {
        println!("{}", serde_json::to_string_pretty(&serde_json::json!({"profile": p, "runs": rows}))?);
    }
    Ok(Exit::Ok)
}

/// The spoke's routing over virtual-time engines.
struct SpokeRoute {
    fleet: FleetConfig,
    workers: Vec<WorkerKey>,
    calibration: Calibrator,
    /// The request every decision plans for (the prompt length comes from the workload).
    request: InferenceRequest,
    requests: u64,
    scrape_ms: f64,
    /// Engine metrics as last scraped, and when.
    scraped: Option<(f64, Vec<EngineStats>)>,
    /// Per engine, the spoke's replica of it (when the fleet configures its capacity).
    models: Vec<EngineModel>,
    /// What the last decision knew of the request it placed, for its dispatch: per engine the
    /// cached tokens, and the prompt's block keys.
    placing: (Vec<u32>, Arc<[u64]>),
    /// Per streaming request, when its last token came and the gaps between its tokens.
    streams: HashMap<(usize, RequestId), (f64, Vec<f64>)>,
    /// Dispatch pacing, when the worker set paces.
    pacing: Option<Pacer>,
}

impl SpokeRoute {
    /// A fleet of `engines` workers in one worker set, configured as the benchmark configures
    /// the spoke: the profile's block size and prefill rate, nothing tuned per workload.
    fn new(
        profile: &Profile,
        engines: u32,
        output_tokens: u32,
        scrape_ms: f64,
        predictor: TtftPredictor,
        pacing: DispatchPacing,
    ) -> anyhow::Result<SpokeRoute> {
        let endpoints: Vec<String> =
            (0..engines).map(|i| format!("{{name: w{i}, host: 127.0.0.1, httpPort: {}}}", 8000 + i)).collect();
        let rate = (1000.0 / profile.timing.prefill_ms_per_token).round();
        // Configured as the benchmark configures the spoke (e2e/bench/harness.py).
        let yaml = LoopbackFleet {
            name: "sim",
            model: "sim-model",
            endpoints: &endpoints,
            block_size: profile.block_size,
            worker_set_spec: &format!(
                "  capacity: {{prefillTokensPerSecond: {rate}, maxNumSeqs: {}, maxNumBatchedTokens: {}, kvCacheTokens: {}}}\n  ttftPredictor: {}\n  dispatchPacing: {}\n",
                profile.max_num_seqs,
                profile.max_num_batched_tokens,
                u64::from(profile.num_gpu_blocks) * u64::from(profile.block_size),
                serde_json::to_value(predictor).ok().and_then(|v| v.as_str().map(str::to_owned)).unwrap_or_default(),
                serde_json::to_value(pacing).ok().and_then(|v| v.as_str().map(str::to_owned)).unwrap_or_default(),
            ),
            backend_spec: "",
            pool_members: "",
            extra_documents: "",
        }
        .yaml();
        let checked = switchyard_config::check_texts([("calibrate.yaml", yaml.as_str())]);
        if let Some(d) = checked.diagnostics.iter().find(|d| d.is_error()) {
            anyhow::bail!("the calibration fleet does not validate: {d}");
        }
        let set = checked.config.worker_sets.get("sim");
        let initial = set.map(|ws| ws.ttft).unwrap_or_default();
        let models = (0..engines).filter_map(|_| set.and_then(|ws| ws.engine_model(None))).collect();
        let pacing = set.filter(|ws| ws.paced).map(|ws| Pacer::new(engines, ws.step_token_budget()));
        let workers =
            (0..engines).map(|i| WorkerKey { worker_set: "sim".into(), worker: format!("w{i}").into() }).collect();
        Ok(SpokeRoute {
            fleet: checked.config,
            workers,
            calibration: Calibrator::new(initial),
            request: InferenceRequest {
                max_tokens: Some(output_tokens),
                ..InferenceRequest::new(Dialect::OpenAi, "sim-model", Prompt::Text(TextPrompt::Tokens(Vec::new())))
            },
            requests: 0,
            scrape_ms,
            scraped: None,
            models,
            placing: (vec![0; engines as usize], Arc::from(Vec::new())),
            streams: HashMap::new(),
            pacing,
        })
    }
}

impl Route for SpokeRoute {
    fn admit(&mut self, ctx: &RouteContext<'_>) -> bool {
        if self.pacing.is_none() {
            return true;
        }
        let best = self.choose(ctx);
        self.requests -= 1;
        self.pacing.as_ref().is_none_or(|p| p.takes(ctx, best))
    }

    fn choose(&mut self, ctx: &RouteContext<'_>) -> usize {
        self.requests += 1;
        let mut cached = BTreeMap::new();
        if self.scraped.as_ref().is_none_or(|(at, _)| ctx.now_ms - at >= self.scrape_ms) {
            self.scraped = Some((ctx.now_ms, ctx.engines.iter().map(|e| e.stats()).collect()));
        }
        let scraped = self.scraped.as_ref().map(|(_, s)| s.as_slice()).unwrap_or_default();
        let mut views = Vec::with_capacity(self.workers.len());
        for (i, key) in self.workers.iter().enumerate() {
            let stats = scraped[i];
            let (unstarted, unstarted_tokens) = ctx.ledger(i);
            views.push(plan::WorkerView {
                healthy: true,
                engine_waiting: stats.waiting,
                engine_running: stats.running,
                kv_usage: stats.kv_usage,
                unstarted_requests: unstarted,
                unstarted_prefill_tokens: unstarted_tokens,
                held_requests: 0,
                ttft: Some(self.calibration.model()),
                outlook: self.models.get(i).map(|m| m.outlook(ctx.now_ms)),
            });
            let tokens = ctx.cached_or_booked_tokens(i);
            self.placing.0[i] = tokens;
            if tokens > 0 {
                cached.insert(key.clone(), tokens);
            }
        }
        let snapshot = plan::snapshot(self.workers.iter().cloned().zip(views));
        let mut features = plan::features(&self.request, ctx.prompt.len() as u32, cached, self.requests);
        let bs = ctx.engines.first().map_or(16, |e| e.profile().block_size);
        features.block_keys = block_keys(ctx.prompt, bs);
        self.placing.1 = features.block_keys.clone();
        match plan::plan(&self.fleet, &snapshot, &features).outcome {
            Outcome::Route { target: Target::Worker { worker, .. } } => {
                self.workers.iter().position(|k| k.worker == worker).unwrap_or(0)
            }
            _ => 0,
        }
    }

    fn first_token(&mut self, _engine: usize, work_tokens: u64, running: u32, ttft_ms: f64) {
        self.calibration.observe(work_tokens, running, ttft_ms);
    }

    fn dispatched(&mut self, engine: usize, id: RequestId, prompt: &[u32], max_tokens: u32, now_ms: f64) {
        if let Some(pacer) = &mut self.pacing {
            pacer.dispatched(engine, id, now_ms);
        }
        let Some(model) = self.models.get_mut(engine) else { return };
        let cached_tokens = self.placing.0.get(engine).copied().unwrap_or(0);
        let bs = model.replica().shape().block_size;
        let prefix = (cached_tokens / bs).checked_sub(1).and_then(|i| self.placing.1.get(i as usize)).copied();
        let sent =
            Sent { id, prompt_tokens: prompt.len() as u32, cached_tokens, prefix: prefix.unwrap_or(0), max_tokens };
        model.dispatch(sent, now_ms);
    }

    fn started(&mut self, engine: usize, id: RequestId, now_ms: f64) {
        if let Some(pacer) = &mut self.pacing {
            pacer.started(engine, id, now_ms);
        }
        if let Some(model) = self.models.get_mut(engine) {
            model.started(id, now_ms);
            self.streams.insert((engine, id), (now_ms, Vec::new()));
        }
    }

    fn progress(&mut self, engine: usize, id: RequestId, generated: u32, now_ms: f64) {
        if let Some(model) = self.models.get_mut(engine) {
            model.progress(id, generated, now_ms);
            if let Some((last, gaps)) = self.streams.get_mut(&(engine, id)) {
                gaps.push(now_ms - *last);
                *last = now_ms;
            }
        }
    }

    fn finished(&mut self, engine: usize, id: RequestId, now_ms: f64) {
        if let Some(model) = self.models.get_mut(engine) {
            let gaps = self.streams.remove(&(engine, id)).map(|(_, g)| g).unwrap_or_default();
            model.finished(id, &Ended { output_tokens: None, median_gap_ms: median(gaps) }, now_ms);
        }
    }
}

/// Dispatch pacing as the spoke does it ([`switchyard_core::pacing`]), from what the calibrator's
/// ledger holds: the requests sent to each engine without a first token, and when each one's
/// first token came after how long a wait.
struct Pacer {
    step_token_budget: u32,
    reopens_at_ms: Vec<f64>,
    sent_ms: HashMap<(usize, RequestId), f64>,
}

impl Pacer {
    fn new(engines: u32, step_token_budget: u32) -> Pacer {
        Pacer { step_token_budget, reopens_at_ms: vec![0.0; engines as usize], sent_ms: HashMap::new() }
    }

    /// Whether engine `i` takes the request of `ctx` now.
    fn takes(&self, ctx: &RouteContext<'_>, i: usize) -> bool {
        let view = pacing::PacingView {
            queued_prefill_tokens: ctx.ledger(i).1,
            step_token_budget: self.step_token_budget,
            reopens_at_ms: self.reopens_at_ms[i],
        };
        let own = (ctx.prompt.len() as u64).saturating_sub(u64::from(ctx.cached_or_booked_tokens(i)));
        view.takes(own, ctx.now_ms)
    }

    fn dispatched(&mut self, engine: usize, id: RequestId, now_ms: f64) {
        self.sent_ms.insert((engine, id), now_ms);
    }

    fn started(&mut self, engine: usize, id: RequestId, now_ms: f64) {
        let wait = self.sent_ms.remove(&(engine, id)).map_or(0.0, |t| now_ms - t);
        self.reopens_at_ms[engine] = pacing::reopens_at_ms(now_ms, wait);
    }
}

/// The oracle's rule with the spoke's dispatch pacing: a request whose best engine does not
/// take it now waits.
struct PacedOracle(Pacer);

impl PacedOracle {
    fn new(profile: &Profile, engines: u32) -> PacedOracle {
        PacedOracle(Pacer::new(engines, profile.max_num_batched_tokens))
    }
}

impl Route for PacedOracle {
    fn admit(&mut self, ctx: &RouteContext<'_>) -> bool {
        let best = Routing::Oracle.choose(ctx);
        self.0.takes(ctx, best)
    }

    fn choose(&mut self, ctx: &RouteContext<'_>) -> usize {
        Routing::Oracle.choose(ctx)
    }

    fn dispatched(&mut self, engine: usize, id: RequestId, _prompt: &[u32], _max_tokens: u32, now_ms: f64) {
        self.0.dispatched(engine, id, now_ms);
    }

    fn started(&mut self, engine: usize, id: RequestId, now_ms: f64) {
        self.0.started(engine, id, now_ms);
    }
}

/// Block keys of `prompt` as a router's index would hash it: a chain over each full block.
fn block_keys(prompt: &[u32], block_size: u32) -> Arc<[u64]> {
    let mut h = 0u64;
    prompt
        .chunks_exact(block_size.max(1) as usize)
        .map(|block| {
            h = block.iter().fold(h, |h, &t| switchyard_sim::engine::mix(h ^ u64::from(t)));
            h
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timing_errors_parse_with_ones_for_the_factors_left_out() {
        let e = parse_timing_error("prefill=1.1,decode=0.8").expect("parses");
        assert_eq!(e, TimingError { prefill: 1.1, decode: 0.8, base: 1.0, attention: 1.0 });
        for bad in ["prefill", "prefill=x", "prefill=0", "prefill=-1", "speed=2", "decode=inf"] {
            assert!(parse_timing_error(bad).is_err(), "{bad}");
        }
    }
}
