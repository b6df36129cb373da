//! The hub's side of the request path: which cluster's worker set serves a request.
//!
//! The hub plans with the same pure policy engine as the spoke, one level up: in
//! [`cluster_fleet`], each worker set of the fleet configuration has one "worker", its
//! cluster, and the snapshot's state of that worker is the set's latest load report
//! ([`set_state`]). The engine's filters and objectives then apply to whole worker sets
//! (regions, waiting requests, KV usage, predicted TTFT), and the chosen set's spoke picks
//! the worker with its precise index: the request is forwarded to the spoke's front door
//! with the set named in `x-switchyard-worker-set` and the request's class and tags, so the
//! spoke's own policies apply too.
//!
//! The prompt is tokenized with each candidate set's tokenizer ([`crate::prompt`]), only as
//! far as the index could match it, and looked up in the cross-cluster prefix index
//! ([`cached_tokens`]): the cached tokens per pair go
//! into the policy engine's TTFT prediction, so a cluster that holds the prompt's prefix
//! wins over a shorter queue when the prefill it saves is worth more.
//!
//! A `batch` request its policy queues (`onEmpty: Queue`) waits in the hub's
//! [`BatchQueue`] and is planned again as the fleet view changes; any other request is
//! answered at once.
//!
//! When a policy's steps leave no cluster and it falls back, the request spills over to the
//! pool's providers through the providers crate, exactly as at a spoke.
//!
//! Invariants: only live clusters (an open session and a fresh report) whose hello lists the
//! worker set are candidates; planning never awaits; the decision depends only on the
//! configuration, the fleet view's state and the request.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use axum::http::{HeaderName, HeaderValue};
use dynamo_kv_router::protocols::{BlockHashOptions, compute_block_hash_for_seq};
use rustc_hash::{FxHashMap, FxHashSet};
use switchyard_core::engine::{Outcome, Target as DecidedTarget};
use switchyard_core::predictor::TtftModel;
use switchyard_core::request::{RequestClass, WorkerKey};
use switchyard_core::snapshot::WorkerState;
use switchyard_core::{FleetConfig, FleetSnapshot, resolve};
use switchyard_gateway::admission::CpuPool;
use switchyard_gateway::backend::{Backend, Routed, Target};
use switchyard_gateway::error::{ErrorKind, GatewayError};
use switchyard_gateway::observe::{Dispatch, Observer};
use switchyard_gateway::plan;
use switchyard_gateway::request::InferenceRequest;
use switchyard_gateway::upstream::{OpenAiUpstream, ResponseBounds, Upstream};
use switchyard_proto::v1::WorkerSetLoad;
use switchyard_providers::Providers;
use switchyard_providers::spill::{Spillover, spill_targets};

use crate::batch::{BatchQueue, SetOfCluster};
use crate::fleet::{FleetView, LiveCluster};
use crate::metric_names as m;
use crate::prefix::PrefixIndex;
use crate::prompt::{PromptTokenizers, SetPrompts, SetTokens};
use crate::sent::{Sent, SentObserver, SentSinceReport};
use switchyard_gateway::metrics::Metrics;

/// Clusters tried per request at most (the first choice and its alternatives).
const MAX_ATTEMPTS: usize = 3;
/// Characters per token assumed for the length of a prompt no worker set's tokenizer is
/// available for at the hub (it plans the cluster; the spoke counts exactly).
const CHARS_PER_TOKEN: usize = 4;

/// How the hub chooses among the clusters a request's policy admits. Only
/// [`ClusterChoice::CacheAware`] is for production; the others are the baselines the
/// federation benchmark measures it against (`e2e/bench/run --federation`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum ClusterChoice {
    /// The policy engine's ranking with each cluster's cached prefix from the prefix index.
    #[default]
    CacheAware,
    /// The same ranking blind to caches: load and queue only.
    LeastLoaded,
    /// Any admitted cluster, uniformly (the ranking's order is dropped).
    Random,
}

/// A well-mixed number from a request number (SplitMix64's finaliser), for
/// [`ClusterChoice::Random`]: reproducible for a given request order.
fn mixed(request_no: u64) -> u64 {
    let mut z = request_no.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The fleet configuration as the hub plans with it: every worker set's workers replaced by
/// one, named after its cluster.
pub fn cluster_fleet(fleet: &FleetConfig) -> FleetConfig {
    let mut out = fleet.clone();
    for ws in out.worker_sets.values_mut() {
        ws.workers = vec![ws.cluster.as_str().into()];
        // A spoke paces and replicates its engines; the hub sees whole sets.
        ws.replicate_engines = false;
        ws.paced = false;
    }
    out
}

/// A worker set's state as one candidate: per-worker averages for the waiting and running
/// queues (the `MaxWaitingRequests` filter is per worker), the mean KV usage, and a TTFT
/// model whose queue term is the spoke's own predicted wait of its least loaded worker.
///
/// What the hub `sent` since the report is added as running requests and as queued prefill
/// work spread over the healthy workers — not as waiting requests: whether the spoke can run
/// them at once is for its next report to say, and counting them as waiting would spill a
/// burst the cluster has room for.
pub fn set_state(load: &WorkerSetLoad, configured: TtftModel, sent: Sent) -> WorkerState {
    let workers = load.healthy_workers.max(1);
    let rate = if load.prefill_tokens_per_second > 0.0 {
        load.prefill_tokens_per_second
    } else {
        configured.prefill_tokens_per_sec
    };
    let wait_ms = if load.predicted_queue_wait_ms.is_finite() { load.predicted_queue_wait_ms.max(0.0) } else { 0.0 };
    WorkerState {
        healthy: load.healthy_workers > 0,
        waiting_requests: load.waiting_requests.div_ceil(workers),
        running_requests: (load.running_requests + sent.requests).div_ceil(workers),
        held_requests: 0,
        // The predictor turns queued prefill tokens into wait at `rate`: these many tokens
        // are the spoke's predicted wait, plus the prompts sent since.
        waiting_prefill_tokens: Some((wait_ms * rate / 1_000.0) as u64 + sent.prompt_tokens / u64::from(workers)),
        kv_cache_usage_percent: load.kv_usage_percent_mean,
        // The spoke's wait already includes decode interference.
        ttft: Some(TtftModel { prefill_tokens_per_sec: rate, decode_interference: 0.0, ..configured }),
        outlook: None,
    }
}

/// Prompt tokens each live (cluster, worker set) pair holds in its engines' caches, as the
/// prefix index knows them: the prompt's engine blocks at the set's block size (from the
/// set's own tokens in `prompts`), re-blocked at the set's coarse factor
/// ([`switchyard_proto::coarse`]), looked up once per distinct (tokens, block size, factor);
/// a pair holding `n` leading coarse blocks holds `n × factor × block size` tokens. Pairs
/// holding none, sets without a coarse copy and sets without tokens are left out.
pub fn cached_tokens(prefix: &PrefixIndex, live: &[LiveCluster], prompts: &SetTokens) -> BTreeMap<WorkerKey, u32> {
    // Sets sharing a tokenizer share the tokens' `Arc`: one lookup per (tokens, grain).
    type Grain = (*const Vec<u32>, u32, u32);
    type Pairs<'a> = (&'a [u32], Vec<(&'a str, &'a str)>);
    let mut by_grain: BTreeMap<Grain, Pairs<'_>> = BTreeMap::new();
    for c in live {
        for ws in c.worker_sets.iter().filter(|ws| ws.kv_block_size > 0 && ws.coarse_block_factor > 0) {
            let Some(tokens) = prompts.get(&ws.name) else { continue };
            by_grain
                .entry((Arc::as_ptr(tokens), ws.kv_block_size, ws.coarse_block_factor))
                .or_insert_with(|| (tokens.as_slice(), Vec::new()))
                .1
                .push((&c.cluster, &ws.name));
        }
    }
    let mut out = BTreeMap::new();
    for ((_, block_size, factor), (tokens, pairs)) in by_grain {
        let blocks: Vec<u64> = compute_block_hash_for_seq(tokens, block_size, BlockHashOptions::default())
            .into_iter()
            .map(|h| h.0)
            .collect();
        let held = prefix.lookup(&switchyard_proto::coarse::local_hashes(&blocks, factor));
        if held.is_empty() {
            continue;
        }
        // The few holders against the grain's pairs, by borrowed names (no key allocated per
        // live pair).
        let pairs: FxHashSet<(&str, &str)> = pairs.into_iter().collect();
        for ((cluster, set), n) in &held {
            if pairs.contains(&(cluster.as_str(), set.as_str())) {
                let key = WorkerKey { worker_set: set.as_str().into(), worker: cluster.as_str().into() };
                out.insert(key, n.saturating_mul(factor).saturating_mul(block_size));
            }
        }
    }
    out
}

/// The snapshot of `live` clusters' worker sets of `fleet`, keyed (set, cluster), with what
/// each was `sent` since its cluster's report.
pub fn snapshot(fleet: &FleetConfig, live: &[LiveCluster], sent: &HashMap<SetOfCluster, Sent>) -> FleetSnapshot {
    let mut snap = FleetSnapshot::default();
    snap.workers.reserve(live.iter().map(|c| c.load.len()).sum());
    // Looked up by borrowed names: no allocation per candidate on the request path.
    let sent: FxHashMap<(&str, &str), Sent> = sent.iter().map(|((c, s), n)| ((c.as_str(), s.as_str()), *n)).collect();
    for c in live {
        for load in &c.load {
            let Some(ws) = fleet.worker_sets.get(&load.worker_set).filter(|ws| ws.cluster == c.cluster) else {
                continue;
            };
            if !c.worker_sets.iter().any(|i| i.name == load.worker_set) {
                continue;
            }
            // The planning fleet's one "worker" of the set is its cluster's name: shared, not
            // allocated per request.
            let worker = ws.workers.first().cloned().unwrap_or_else(|| c.cluster.as_str().into());
            let key = WorkerKey { worker_set: ws.name.clone(), worker };
            let since = sent.get(&(c.cluster.as_str(), load.worker_set.as_str())).copied().unwrap_or_default();
            snap.workers.insert(key, set_state(load, ws.ttft, since));
        }
    }
    snap
}

/// The hub as a gateway backend.
pub struct HubBackend {
    /// The configuration as planned with ([`cluster_fleet`]).
    pub fleet: Arc<FleetConfig>,
    /// Live clusters.
    pub view: Arc<FleetView>,
    /// Client for the spokes' front doors.
    pub client: reqwest::Client,
    /// Bounds on what spokes send back.
    pub bounds: ResponseBounds,
    /// Tie breaking between equal candidates.
    pub requests: AtomicU64,
    /// Where queued batch requests wait.
    pub batch: Arc<BatchQueue>,
    /// Requests sent to each worker set since its cluster's last report.
    pub sent: Arc<SentSinceReport>,
    /// External providers of the configuration (spillover when every cluster is filtered out).
    pub providers: Arc<Providers>,
    /// The spillover ledger.
    pub spill: Arc<Spillover>,
    /// Which cluster holds which prompt prefix (the spokes' coarse reports).
    pub prefix: Arc<PrefixIndex>,
    /// The worker sets' tokenizers, to look prompts up in `prefix`.
    pub tokenizers: Arc<PromptTokenizers>,
    /// Where prompts are tokenized (off the async threads).
    pub cpu: CpuPool,
    /// How clusters are chosen.
    pub choice: ClusterChoice,
    /// Metrics.
    pub metrics: Arc<Metrics>,
}

struct ClusterTarget {
    label: String,
    metrics: Arc<Metrics>,
    upstream: OpenAiUpstream,
    /// Where its dispatch is counted: the pair, its cluster's report count when planned, and
    /// the prompt's tokens the pair does not hold (the prefill it queues there).
    ledger: Arc<SentSinceReport>,
    pair: SetOfCluster,
    reports: u64,
    prompt_tokens: u32,
}

/// Records when a spoke's first token arrived ([`m::UPSTREAM_TTFT_SECONDS`]).
struct UpstreamTtft {
    metrics: Arc<Metrics>,
    cluster: String,
}

impl Observer for UpstreamTtft {
    fn first_token(&mut self, elapsed: std::time::Duration) {
        self.metrics.observe(m::UPSTREAM_TTFT_SECONDS, &[("cluster", &self.cluster)], elapsed.as_secs_f64());
    }
}

impl Target for ClusterTarget {
    fn label(&self) -> &str {
        &self.label
    }

    fn upstream(&self) -> &dyn Upstream {
        &self.upstream
    }

    fn dispatch(&self, _attempt: usize) -> Dispatch {
        self.ledger.record(self.pair.clone(), self.reports, self.prompt_tokens);
        let mut dispatch = Dispatch::bare();
        dispatch.observers.push(Box::new(UpstreamTtft { metrics: self.metrics.clone(), cluster: self.pair.0.clone() }));
        dispatch.observers.push(Box::new(SentObserver {
            ledger: self.ledger.clone(),
            pair: self.pair.clone(),
            reports: self.reports,
            prompt_tokens: self.prompt_tokens,
        }));
        dispatch
    }
}

fn header(name: &'static str, value: &str) -> Option<(HeaderName, HeaderValue)> {
    Some((HeaderName::from_static(name), HeaderValue::from_str(value).ok()?))
}

/// A rough prompt length for planning: characters of text over [`CHARS_PER_TOKEN`].
fn estimated_tokens(req: &InferenceRequest) -> u32 {
    let body = switchyard_gateway::openai::upstream_body(req, &req.model);
    let chars: usize = ["messages", "prompt"].iter().filter_map(|k| body.get(*k)).map(|v| v.to_string().len()).sum();
    (chars / CHARS_PER_TOKEN) as u32
}

/// What planning knows of a request's prompt: its leading tokens per worker set the hub can
/// tokenize for, and its length (from the tokenizer when there is one, else estimated).
struct Prompt {
    tokens: SetTokens,
    length: u32,
}

impl Prompt {
    fn new(req: &InferenceRequest, prompts: SetPrompts) -> Prompt {
        let length = prompts.length.unwrap_or_else(|| estimated_tokens(req));
        Prompt { tokens: prompts.tokens, length }
    }
}

/// One planning pass.
enum Planned {
    /// Targets, and the first choice's (cluster, set) with its cluster's report count.
    Routed(Routed, Option<(SetOfCluster, u64)>),
    /// The policy queues the request.
    Queued { message: String, policy: String },
}

impl HubBackend {
    /// Plans `req` over `live`, leaving out the `excluded` (cluster, set) pairs.
    fn plan_once(
        &self,
        req: &InferenceRequest,
        prompt: &Prompt,
        live: &[LiveCluster],
        excluded: &BTreeSet<SetOfCluster>,
    ) -> Result<Planned, GatewayError> {
        let mut snap = snapshot(&self.fleet, live, &self.sent.since_reports(live));
        snap.workers.retain(|k, _| !excluded.contains(&(k.worker.to_string(), k.worker_set.to_string())));
        snap.providers = self.providers.states(Instant::now());
        let request_no = self.requests.fetch_add(1, Ordering::Relaxed) + 1;
        let prompt_tokens = prompt.length;
        let cached = match self.choice {
            ClusterChoice::CacheAware => cached_tokens(&self.prefix, live, &prompt.tokens),
            ClusterChoice::LeastLoaded | ClusterChoice::Random => BTreeMap::new(),
        };
        let features = plan::features(req, prompt_tokens, cached, request_no);
        let decision = plan::plan(&self.fleet, &snap, &features);
        match &decision.outcome {
            Outcome::Route { target: DecidedTarget::Worker { .. } } => {}
            Outcome::Route { target: DecidedTarget::Provider { .. } } => {
                // Every cluster was filtered out and the policy falls back: the decision's
                // provider candidates, in rank order (residency already applied: pii never
                // gets here), never a cluster the policy filtered out.
                let targets = spill_targets(&decision, &self.fleet, &self.providers, &self.spill, &req.id);
                if targets.is_empty() {
                    return Err(GatewayError::new(
                        ErrorKind::NoCapacity,
                        "no_capacity",
                        format!("policy {} spills over, but no provider client is usable", decision.policy),
                    ));
                }
                let headers =
                    [header("x-switchyard-route", "spillover"), header("x-switchyard-policy", &decision.policy)]
                        .into_iter()
                        .flatten()
                        .collect();
                return Ok(Planned::Routed(Routed { targets, prompt_tokens: None, headers }, None));
            }
            Outcome::Reject { reason, message } => return Err(plan::rejection(*reason, message.clone())),
            Outcome::Queue { message } => {
                return Ok(Planned::Queued { message: message.clone(), policy: decision.policy.clone() });
            }
        }
        let mut ranked = plan::ranked_workers(&decision, usize::MAX, |k| snap.workers.contains_key(k));
        if self.choice == ClusterChoice::Random && !ranked.is_empty() {
            let first = (mixed(request_no) % ranked.len() as u64) as usize;
            ranked.rotate_left(first);
        }
        ranked.truncate(MAX_ATTEMPTS);
        let mut first = None;
        let mut targets: Vec<Box<dyn Target>> = Vec::new();
        for (key, _) in &ranked {
            let Some(cluster) = live.iter().find(|c| *c.cluster == *key.worker) else { continue };
            let pair = (cluster.cluster.clone(), key.worker_set.to_string());
            first.get_or_insert((pair.clone(), cluster.reports));
            targets.push(Box::new(ClusterTarget {
                label: format!("{}/{}", key.worker, key.worker_set),
                metrics: self.metrics.clone(),
                ledger: self.sent.clone(),
                pair,
                reports: cluster.reports,
                prompt_tokens: prompt_tokens.saturating_sub(features.cached_tokens.get(key).copied().unwrap_or(0)),
                upstream: OpenAiUpstream {
                    client: self.client.clone(),
                    base_url: cluster.front_door_url.trim_end_matches('/').to_string(),
                    // The spoke resolves the name the client asked for with the same
                    // fleet-wide configuration.
                    served_model: req.model.clone(),
                    body: None,
                    bounds: self.bounds,
                    api_key: None,
                    spoke_worker_set: Some(Arc::from(&*key.worker_set)),
                },
            }));
        }
        if targets.is_empty() {
            return Err(GatewayError::new(
                ErrorKind::NoCapacity,
                "no_capacity",
                format!("policy {} left no live cluster for `{}`", decision.policy, req.model),
            ));
        }
        let headers = [header("x-switchyard-route", "cluster"), header("x-switchyard-policy", &decision.policy)]
            .into_iter()
            .flatten()
            .collect();
        Ok(Planned::Routed(Routed { targets, prompt_tokens: None, headers }, first))
    }

    /// A queued batch request: waits in [`BatchQueue`]'s line, planning again (when it is the
    /// oldest) on every change of the fleet view, until its policy admits a worker set or it
    /// has waited the queue's `max_wait`.
    async fn wait_in_line(&self, req: &InferenceRequest, prompt: &Prompt) -> Result<Routed, GatewayError> {
        let started = Instant::now();
        let deadline = started + self.batch.max_wait();
        let place = self.batch.join();
        let mut fleet_changes = self.view.changes();
        let mut line_moves = place.moved();
        loop {
            let mut last = None;
            if place.is_head() {
                let live = self.view.live(Instant::now());
                match self.plan_once(req, prompt, &live, &self.batch.taken(&live))? {
                    Planned::Routed(routed, first) => {
                        if let Some((pair, reports)) = first {
                            self.batch.take(pair, reports);
                        }
                        self.metrics.observe(m::BATCH_WAIT_SECONDS, &[], started.elapsed().as_secs_f64());
                        self.metrics.inc(m::BATCH_REQUESTS_TOTAL, &[("outcome", "dispatched")], 1.0);
                        return Ok(routed);
                    }
                    Planned::Queued { message, policy } => last = Some((message, policy)),
                }
            }
            let now = Instant::now();
            if now >= deadline {
                self.metrics.inc(m::BATCH_REQUESTS_TOTAL, &[("outcome", "timed_out")], 1.0);
                let (message, policy) = last.unwrap_or_default();
                return Err(GatewayError::new(
                    ErrorKind::NoCapacity,
                    "batch_timeout",
                    format!(
                        "the batch request waited {} s in the hub's queue and policy {policy} admitted no worker set: {message}",
                        self.batch.max_wait().as_secs()
                    ),
                ));
            }
            tokio::select! {
                _ = fleet_changes.changed() => {}
                _ = line_moves.changed() => {}
                () = tokio::time::sleep_until(deadline.into()) => {}
            }
        }
    }
}

impl Backend for HubBackend {
    fn models(&self) -> Vec<String> {
        self.fleet.models.keys().chain(self.fleet.aliases.keys()).cloned().collect()
    }

    async fn count_tokens(&self, _req: Arc<InferenceRequest>) -> Result<u32, GatewayError> {
        Err(GatewayError::new(
            ErrorKind::InvalidRequest,
            "not_supported",
            "token counting is served by the spokes' front doors, which tokenize as their engines do",
        ))
    }

    async fn route(&self, req: Arc<InferenceRequest>) -> Result<Routed, GatewayError> {
        let started = Instant::now();
        let sets =
            resolve::worker_sets(&self.fleet, &req.model).map_err(|e| GatewayError::model_not_found(e.to_string()))?;
        let live = self.view.live(Instant::now());
        let probe = (self.choice == ClusterChoice::CacheAware).then_some(&self.prefix);
        let prompt = Prompt::new(&req, self.tokenizers.tokens(&req, &sets, &live, probe, &self.cpu).await?);
        match self.plan_once(&req, &prompt, &live, &BTreeSet::new())? {
            Planned::Routed(routed, _) => {
                self.metrics.observe(m::ROUTE_SECONDS, &[], started.elapsed().as_secs_f64());
                Ok(routed)
            }
            Planned::Queued { .. } if req.class == RequestClass::Batch => self.wait_in_line(&req, &prompt).await,
            Planned::Queued { message, .. } => Err(GatewayError::new(ErrorKind::NoCapacity, "no_capacity", message)),
        }
    }

    fn ready(&self) -> bool {
        !self.view.live(Instant::now()).is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use switchyard_proto::v1::WorkerSetInfo;

    /// A worker set of model `m` with two workers and 16-token blocks, as a hello lists it.
    fn info(name: &str) -> WorkerSetInfo {
        WorkerSetInfo {
            name: name.into(),
            served_model: "m".into(),
            kv_block_size: 16,
            workers: 2,
            coarse_block_factor: 16,
        }
    }

    fn load(set: &str, healthy: u32, waiting: u32, wait_ms: f64) -> WorkerSetLoad {
        WorkerSetLoad {
            worker_set: set.into(),
            healthy_workers: healthy,
            waiting_requests: waiting,
            predicted_queue_wait_ms: wait_ms,
            prefill_tokens_per_second: 10_000.0,
            ..Default::default()
        }
    }

    #[test]
    fn a_sets_state_is_per_worker_and_its_queue_is_the_spokes_predicted_wait() {
        let s = set_state(&load("a", 3, 7, 250.0), TtftModel::default(), Sent::default());
        assert!(s.healthy);
        assert_eq!(s.waiting_requests, 3, "7 waiting over 3 workers is 3 per worker, rounded up");
        let ttft = s.ttft.expect("model");
        let p = ttft.predict(&switchyard_core::predictor::TtftInputs {
            prompt_tokens: 1000,
            waiting_prefill_tokens: s.waiting_prefill_tokens,
            running_requests: 10,
            ..Default::default()
        });
        assert!((p.queue_ms - 250.0).abs() < 0.5, "{p:?}");
        assert!((p.prefill_ms - 100.0).abs() < 0.5, "{p:?}");
        assert!(!set_state(&load("a", 0, 0, 0.0), TtftModel::default(), Sent::default()).healthy);
        // Six prompts of 500 tokens sent since the report: running, and 1000 more tokens
        // of prefill ahead on each of the three workers (100 ms at 10,000 tokens/s).
        let busier =
            set_state(&load("a", 3, 7, 250.0), TtftModel::default(), Sent { requests: 6, prompt_tokens: 3000 });
        assert_eq!(busier.waiting_requests, 3, "sends are not counted as waiting");
        assert_eq!(busier.running_requests, 2);
        let p = busier.ttft.expect("model").predict(&switchyard_core::predictor::TtftInputs {
            prompt_tokens: 1000,
            waiting_prefill_tokens: busier.waiting_prefill_tokens,
            ..Default::default()
        });
        assert!((p.queue_ms - 350.0).abs() < 0.5, "{p:?}");
    }

    #[test]
    fn only_sets_a_live_cluster_declared_and_reported_are_candidates() {
        let mut fleet = FleetConfig::default();
        let ws = |name: &str, cluster: &str| switchyard_core::fleet::WorkerSet {
            name: name.into(),
            served_model: "m".into(),
            cluster: cluster.into(),
            region: None,
            workers: vec!["w0".into(), "w1".into()],
            kv_block_size: 16,
            hourly_cost: Default::default(),
            decode_tokens_per_sec: 1.0,
            ttft: TtftModel::default(),
            engine: Default::default(),
            replicate_engines: true,
            paced: true,
        };
        for (n, c) in [("a", "east"), ("b", "east"), ("c", "west")] {
            fleet.worker_sets.insert(n.into(), ws(n, c));
        }
        let planned = cluster_fleet(&fleet);
        assert_eq!(planned.worker_sets["a"].workers, vec![switchyard_core::Name::from("east")]);
        assert!(!planned.worker_sets["a"].paced && !planned.worker_sets["a"].replicate_engines);
        let live = vec![
            // East declares a and reports a and b: b was not in its hello.
            LiveCluster {
                cluster: "east".into(),
                region: String::new(),
                worker_sets: vec![info("a")],
                front_door_url: "http://e".into(),
                load: vec![load("a", 2, 0, 0.0), load("b", 2, 0, 0.0)],
                reports: 1,
            },
            // West reports c, which the configuration puts in west, and a, which it does not.
            LiveCluster {
                cluster: "west".into(),
                region: String::new(),
                worker_sets: vec![info("c"), info("a")],
                front_door_url: "http://w".into(),
                load: vec![load("c", 2, 0, 0.0), load("a", 2, 0, 0.0)],
                reports: 1,
            },
        ];
        let snap = snapshot(&planned, &live, &HashMap::new());
        let mut keys: Vec<String> = snap.workers.keys().map(|k| format!("{}/{}", k.worker, k.worker_set)).collect();
        keys.sort();
        assert_eq!(keys, vec!["east/a", "west/c"]);
    }

    /// Two clusters, east and west, with one worker set of model `m` each (two workers);
    /// east reports a slightly shorter queue than west.
    fn two_clusters() -> (FleetConfig, Vec<LiveCluster>) {
        let yaml = "apiVersion: switchyard.dev/v1alpha1
kind: InferenceWorkerSet
metadata: {name: e}
spec: {model: m, cluster: east, kvBlockSize: 16, endpoints: {static: [{name: w0, host: 127.0.0.1, httpPort: 1}, {name: w1, host: 127.0.0.1, httpPort: 2}]}}
---
apiVersion: switchyard.dev/v1alpha1
kind: InferenceWorkerSet
metadata: {name: w}
spec: {model: m, cluster: west, kvBlockSize: 16, endpoints: {static: [{name: w0, host: 127.0.0.1, httpPort: 3}, {name: w1, host: 127.0.0.1, httpPort: 4}]}}
---
apiVersion: switchyard.dev/v1alpha1
kind: InferencePool
metadata: {name: p}
spec: {members: [{workerSet: e}, {workerSet: w}]}
---
apiVersion: switchyard.dev/v1alpha1
kind: GatewayBackend
metadata: {name: b}
spec: {models: [{name: m, pool: p}]}
";
        let checked = switchyard_config::check_texts([("fleet.yaml", yaml)]);
        assert_eq!(checked.error_count(), 0, "{:?}", checked.diagnostics);
        let fleet = cluster_fleet(&checked.config);
        let live = vec![
            LiveCluster {
                cluster: "east".into(),
                region: String::new(),
                worker_sets: vec![info("e")],
                front_door_url: "http://e".into(),
                load: vec![load("e", 2, 0, 10.0)],
                reports: 3,
            },
            LiveCluster {
                cluster: "west".into(),
                region: String::new(),
                worker_sets: vec![info("w")],
                front_door_url: "http://w".into(),
                load: vec![load("w", 2, 0, 30.0)],
                reports: 7,
            },
        ];
        (fleet, live)
    }

    #[test]
    fn a_burst_between_two_reports_spreads_over_equal_clusters_by_what_was_sent() {
        // On the reports alone, east wins every decision until the next report.
        let (fleet, live) = two_clusters();
        let burst = |ledger: Option<&SentSinceReport>| {
            let mut chosen = BTreeMap::<String, u32>::new();
            for i in 0..20u64 {
                let sent = ledger.map(|l| l.since_reports(&live)).unwrap_or_default();
                let features = switchyard_core::request::RequestFeatures {
                    model: "m".into(),
                    prompt_tokens: 2_000,
                    tie_breaker: i,
                    ..Default::default()
                };
                let decision = plan::plan(&fleet, &snapshot(&fleet, &live, &sent), &features);
                let Outcome::Route { target: DecidedTarget::Worker { worker, worker_set, .. } } = &decision.outcome
                else {
                    panic!("{decision:?}");
                };
                *chosen.entry(worker.to_string()).or_default() += 1;
                if let Some(l) = ledger {
                    let reports = live.iter().find(|c| *c.cluster == **worker).map(|c| c.reports).unwrap_or(0);
                    l.record((worker.to_string(), worker_set.to_string()), reports, 2_000);
                }
            }
            chosen
        };
        assert_eq!(burst(None), BTreeMap::from([("east".to_owned(), 20)]), "stale figures: a herd");
        let spread = burst(Some(&SentSinceReport::default()));
        assert!(spread.values().all(|&n| (9..=11).contains(&n)), "{spread:?}");
    }

    #[tokio::test]
    async fn the_cluster_holding_a_prompts_prefix_wins_over_a_shorter_queue() {
        let (fleet, live) = two_clusters();
        let prompt: Vec<u32> = (0..2_000).collect();
        // West's spoke reports the prompt's coarse blocks, as its coarse copy would.
        let blocks: Vec<u64> =
            compute_block_hash_for_seq(&prompt, 16, BlockHashOptions::default()).into_iter().map(|h| h.0).collect();
        let stored = switchyard_proto::coarse::chained(&switchyard_proto::coarse::local_hashes(&blocks, 16));
        assert_eq!(stored.len(), 7, "125 engine blocks make 7 coarse blocks of 16");
        let prefix = PrefixIndex::new();
        prefix
            .apply(
                "west",
                &switchyard_proto::v1::CoarseReport {
                    worker_sets: vec![switchyard_proto::v1::CoarseBlocks {
                        worker_set: "w".into(),
                        reset: true,
                        stored,
                        removed: vec![],
                    }],
                },
            )
            .await;
        let prompts = SetTokens::from([("e".to_owned(), Arc::new(prompt.clone())), ("w".to_owned(), Arc::new(prompt))]);
        let cached = cached_tokens(&prefix, &live, &prompts);
        let west = WorkerKey { worker_set: "w".into(), worker: "west".into() };
        assert_eq!(cached, BTreeMap::from([(west, 7 * 256)]));

        let decide = |cached: BTreeMap<WorkerKey, u32>| {
            let features = switchyard_core::request::RequestFeatures {
                model: "m".into(),
                prompt_tokens: 2_000,
                cached_tokens: cached,
                ..Default::default()
            };
            match plan::plan(&fleet, &snapshot(&fleet, &live, &HashMap::new()), &features).outcome {
                Outcome::Route { target: DecidedTarget::Worker { worker, .. } } => worker.to_string(),
                other => panic!("{other:?}"),
            }
        };
        assert_eq!(decide(BTreeMap::new()), "east", "blind: the shorter queue");
        assert_eq!(decide(cached), "west", "1,792 of 2,000 tokens cached outweigh 20 ms of queue");
    }
}
