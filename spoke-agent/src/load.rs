//! Engine load as the router sees it: the engine's own metrics, scraped often, plus what the
//! spoke itself has sent that the engine has not started yet.
//!
//! Scraped numbers lag by up to one interval; a burst routed inside that interval would all
//! land on the worker that looked idle. The in-flight ledger closes the gap: a request counts
//! as queued (with its uncached prompt tokens) from dispatch until its first token arrives.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

/// How often `/metrics` is scraped.
pub const SCRAPE_INTERVAL: Duration = Duration::from_millis(200);
/// How long one scrape may take before it counts as failed. Much longer than the interval: a
/// busy engine's API server answers `/metrics` late (seen on real vLLM: seconds, while it
/// streams), and a late answer is still the engine's load, whereas failing it would mark a
/// worker unhealthy exactly when it is busiest. Scrapes never overlap (the next tick waits),
/// and an engine that refuses connections still fails at once.
pub const SCRAPE_TIMEOUT: Duration = Duration::from_secs(5);
/// Consecutive failed scrapes before a worker is marked unhealthy.
const FAILURES_BEFORE_UNHEALTHY: u32 = 2;

/// Engine-reported load.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct EngineLoad {
    /// `vllm:num_requests_waiting`.
    pub waiting: u32,
    /// `vllm:num_requests_running`.
    pub running: u32,
    /// `vllm:kv_cache_usage_perc` as a fraction 0–1.
    pub kv_usage: f64,
    /// `vllm:prefix_cache_queries_total`: prompt tokens looked up in the prefix cache.
    pub prefix_cache_queries: u64,
    /// `vllm:prefix_cache_hits_total`: of those, tokens found cached.
    pub prefix_cache_hits: u64,
    /// The `num_gpu_blocks` label of `vllm:cache_config_info`: the engine's KV capacity.
    pub num_gpu_blocks: Option<u32>,
}

/// Live load state of one worker.
#[derive(Debug)]
pub struct WorkerLoad {
    engine: Mutex<(EngineLoad, Option<Instant>)>,
    healthy: AtomicBool,
    failures: AtomicU64,
    /// Requests dispatched that have not produced a first token.
    pub inflight_unstarted: AtomicU64,
    /// Uncached prompt tokens of those requests.
    pub inflight_prefill_tokens: AtomicU64,
    /// Requests dispatched and not finished.
    pub inflight_total: AtomicU64,
    /// Dispatch pacing: the registry time (ms, as f64 bits) before which the worker takes no
    /// long prefill ([`switchyard_core::pacing::reopens_at_ms`] of its last first token).
    reopens_at_ms: AtomicU64,
}

impl Default for WorkerLoad {
    fn default() -> Self {
        WorkerLoad {
            engine: Mutex::new((EngineLoad::default(), None)),
            // Unknown until the first scrape: optimistic, so a fresh fleet can serve at once.
            healthy: AtomicBool::new(true),
            failures: AtomicU64::new(0),
            inflight_unstarted: AtomicU64::new(0),
            inflight_prefill_tokens: AtomicU64::new(0),
            inflight_total: AtomicU64::new(0),
            reopens_at_ms: AtomicU64::new(0f64.to_bits()),
        }
    }
}

/// Marks a dispatched request's place in the ledger; releasing it (explicitly or on drop)
/// updates the counters exactly once.
#[derive(Debug)]
pub struct InflightTicket {
    load: Arc<WorkerLoad>,
    prefill_tokens: u64,
    started: bool,
    finished: bool,
}

impl WorkerLoad {
    /// Last scraped load and when it was scraped.
    pub fn engine(&self) -> (EngineLoad, Option<Instant>) {
        self.engine.lock().map(|g| *g).unwrap_or_default()
    }

    /// Whether the worker is believed healthy.
    pub fn healthy(&self) -> bool {
        self.healthy.load(Ordering::Relaxed)
    }

    /// Dispatch pacing: when the worker takes the next long prefill (registry ms).
    pub fn reopens_at_ms(&self) -> f64 {
        f64::from_bits(self.reopens_at_ms.load(Ordering::Relaxed))
    }

    /// Records a first token at `now_ms` that came `wait_ms` after its dispatch.
    pub fn record_first_token(&self, now_ms: f64, wait_ms: f64) {
        let at = switchyard_core::pacing::reopens_at_ms(now_ms, wait_ms);
        self.reopens_at_ms.store(at.to_bits(), Ordering::Relaxed);
    }

    /// Marks the worker down at once (a refused connection while proxying).
    pub fn mark_unhealthy(&self) {
        self.healthy.store(false, Ordering::Relaxed);
        self.failures.store(u64::from(FAILURES_BEFORE_UNHEALTHY), Ordering::Relaxed);
    }

    fn record_scrape(&self, result: Option<EngineLoad>) {
        match result {
            Some(l) => {
                if let Ok(mut g) = self.engine.lock() {
                    *g = (l, Some(Instant::now()));
                }
                self.failures.store(0, Ordering::Relaxed);
                self.healthy.store(true, Ordering::Relaxed);
            }
            None => {
                let n = self.failures.fetch_add(1, Ordering::Relaxed) + 1;
                if n >= u64::from(FAILURES_BEFORE_UNHEALTHY) {
                    self.healthy.store(false, Ordering::Relaxed);
                }
            }
        }
    }
}

/// Opens a ledger entry for a request about to be sent to the worker behind `load`.
pub fn dispatch(load: &Arc<WorkerLoad>, prefill_tokens: u64) -> InflightTicket {
    load.inflight_unstarted.fetch_add(1, Ordering::Relaxed);
    load.inflight_prefill_tokens.fetch_add(prefill_tokens, Ordering::Relaxed);
    load.inflight_total.fetch_add(1, Ordering::Relaxed);
    InflightTicket { load: load.clone(), prefill_tokens, started: false, finished: false }
}

impl InflightTicket {
    /// The first token arrived: the prefill is done.
    pub fn started(&mut self) {
        if !self.started {
            self.started = true;
            self.load.inflight_unstarted.fetch_sub(1, Ordering::Relaxed);
            self.load.inflight_prefill_tokens.fetch_sub(self.prefill_tokens, Ordering::Relaxed);
        }
    }

    /// The request ended (normally or not).
    pub fn finished(&mut self) {
        self.started();
        if !self.finished {
            self.finished = true;
            self.load.inflight_total.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

impl Drop for InflightTicket {
    fn drop(&mut self) {
        self.finished();
    }
}

/// Parses the few vLLM series the router needs from a Prometheus text exposition. Accepts
/// the current and the deprecated KV-usage names and sums over label sets (DP engines).
/// Counter samples are `_total` only (the `_created` series are timestamps).
pub fn parse_engine_metrics(text: &str) -> Option<EngineLoad> {
    let mut load = EngineLoad::default();
    let mut seen = false;
    let mut kv_new: Option<f64> = None;
    let mut kv_old: Option<f64> = None;
    for line in text.lines() {
        if line.starts_with('#') || line.is_empty() {
            continue;
        }
        let name_end = line.find(['{', ' ']).unwrap_or(line.len());
        let name = &line[..name_end];
        let Some(value) = line.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()) else { continue };
        match name {
            "vllm:num_requests_waiting" => {
                load.waiting += value as u32;
                seen = true;
            }
            "vllm:num_requests_running" => {
                load.running += value as u32;
                seen = true;
            }
            "vllm:kv_cache_usage_perc" => kv_new = Some(kv_new.unwrap_or(0.0).max(value)),
            "vllm:gpu_cache_usage_perc" => kv_old = Some(kv_old.unwrap_or(0.0).max(value)),
            "vllm:prefix_cache_queries_total" => load.prefix_cache_queries += value as u64,
            "vllm:prefix_cache_hits_total" => load.prefix_cache_hits += value as u64,
            "vllm:cache_config_info" => {
                let blocks = label(line, "num_gpu_blocks").and_then(|v| v.parse::<u32>().ok());
                load.num_gpu_blocks = load.num_gpu_blocks.max(blocks);
            }
            _ => {}
        }
    }
    load.kv_usage = kv_new.or(kv_old).unwrap_or(0.0).clamp(0.0, 1.0);
    seen.then_some(load)
}

/// The value of label `name` in an exposition line (`metric{a="1",name="v"} 1`).
fn label<'a>(line: &'a str, name: &str) -> Option<&'a str> {
    // `get`, not indexing: a malformed line (a `}` before the `{`) is skipped, not a panic.
    let labels = line.get(line.find('{')? + 1..line.rfind('}')?)?;
    labels.split(',').find_map(|pair| {
        let (k, v) = pair.split_once('=')?;
        (k.trim() == name).then(|| v.trim().trim_matches('"'))
    })
}

/// Scrapes `base_url/metrics` every [`SCRAPE_INTERVAL`] until `shutdown`.
pub async fn run_scraper(
    client: reqwest::Client,
    base_url: String,
    load: Arc<WorkerLoad>,
    shutdown: CancellationToken,
) {
    let url = format!("{base_url}/metrics");
    let mut tick = tokio::time::interval(SCRAPE_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            () = shutdown.cancelled() => return,
        }
        let result = async {
            let r = client.get(&url).timeout(SCRAPE_TIMEOUT).send().await.ok()?;
            if !r.status().is_success() {
                return None;
            }
            parse_engine_metrics(&r.text().await.ok()?)
        }
        .await;
        load.record_scrape(result);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_vllm_gauges() {
        let text = "# HELP x\nvllm:num_requests_running{engine=\"0\",model_name=\"m\"} 3.0\nvllm:num_requests_waiting{engine=\"0\",model_name=\"m\"} 2.0\n\
                    vllm:num_requests_waiting{engine=\"1\",model_name=\"m\"} 1.0\nvllm:gpu_cache_usage_perc{} 0.9\nvllm:kv_cache_usage_perc{engine=\"0\"} 0.25\n\
                    vllm:prefix_cache_queries_total{engine=\"0\"} 1127.0\nvllm:prefix_cache_queries_created{engine=\"0\"} 1.79e+09\n\
                    vllm:prefix_cache_hits_total{engine=\"0\"} 288.0\nvllm:prefix_cache_hits_total{engine=\"1\"} 2.0\n";
        assert_eq!(
            parse_engine_metrics(text),
            Some(EngineLoad {
                waiting: 3,
                running: 3,
                kv_usage: 0.25,
                prefix_cache_queries: 1127,
                prefix_cache_hits: 290,
                num_gpu_blocks: None,
            })
        );
        assert_eq!(
            parse_engine_metrics("vllm:num_requests_running 1\nvllm:gpu_cache_usage_perc 0.5"),
            Some(EngineLoad { waiting: 0, running: 1, kv_usage: 0.5, ..EngineLoad::default() })
        );
        assert_eq!(parse_engine_metrics("garbage"), None);
        let info = "vllm:num_requests_running 0\nvllm:cache_config_info{block_size=\"16\",engine=\"0\",num_gpu_blocks=\"11000\",num_gpu_blocks_override=\"None\"} 1.0\n";
        assert_eq!(parse_engine_metrics(info).and_then(|l| l.num_gpu_blocks), Some(11_000));
        let malformed = "vllm:num_requests_running 0\nvllm:cache_config_info }{num_gpu_blocks=\"9\" 1.0\n";
        assert_eq!(parse_engine_metrics(malformed).map(|l| l.num_gpu_blocks), Some(None));
    }

    #[test]
    fn tickets_release_exactly_once() {
        let load = Arc::new(WorkerLoad::default());
        {
            let mut t = dispatch(&load, 100);
            assert_eq!(load.inflight_prefill_tokens.load(Ordering::Relaxed), 100);
            t.started();
            t.started();
            assert_eq!(load.inflight_unstarted.load(Ordering::Relaxed), 0);
            assert_eq!(load.inflight_total.load(Ordering::Relaxed), 1);
        }
        assert_eq!(load.inflight_total.load(Ordering::Relaxed), 0);
        let t = dispatch(&load, 5);
        drop(t);
        assert_eq!(load.inflight_prefill_tokens.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn health_needs_repeated_failures_or_a_refusal() {
        let load = WorkerLoad::default();
        load.record_scrape(None);
        assert!(load.healthy());
        load.record_scrape(None);
        assert!(!load.healthy());
        load.record_scrape(Some(EngineLoad::default()));
        assert!(load.healthy());
        load.mark_unhealthy();
        assert!(!load.healthy());
    }
}
