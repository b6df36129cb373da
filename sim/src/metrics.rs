//! Prometheus metrics with vLLM's names, labels and buckets.
//!
//! Names follow vLLM's `PrometheusStatLogger` as exposed by `prometheus_client`: counters get a
//! `_total` suffix in the exposition. Every sample carries `model_name` and `engine` labels.

use std::fmt::Write as _;
use std::sync::Mutex;

/// `vllm:num_requests_running`.
pub const NUM_REQUESTS_RUNNING: &str = "vllm:num_requests_running";
/// `vllm:num_requests_waiting`.
pub const NUM_REQUESTS_WAITING: &str = "vllm:num_requests_waiting";
/// `vllm:kv_cache_usage_perc` (a fraction, 0–1, despite the name).
pub const KV_CACHE_USAGE_PERC: &str = "vllm:kv_cache_usage_perc";
/// `vllm:prefix_cache_queries` (tokens).
pub const PREFIX_CACHE_QUERIES: &str = "vllm:prefix_cache_queries";
/// `vllm:prefix_cache_hits` (tokens).
pub const PREFIX_CACHE_HITS: &str = "vllm:prefix_cache_hits";
/// `vllm:prompt_tokens`.
pub const PROMPT_TOKENS: &str = "vllm:prompt_tokens";
/// `vllm:generation_tokens`.
pub const GENERATION_TOKENS: &str = "vllm:generation_tokens";
/// `vllm:num_preemptions`.
pub const NUM_PREEMPTIONS: &str = "vllm:num_preemptions";
/// `vllm:request_success` (label `finished_reason`).
pub const REQUEST_SUCCESS: &str = "vllm:request_success";
/// `vllm:time_to_first_token_seconds`.
pub const TTFT_SECONDS: &str = "vllm:time_to_first_token_seconds";
/// `vllm:inter_token_latency_seconds`.
pub const ITL_SECONDS: &str = "vllm:inter_token_latency_seconds";
/// `vllm:e2e_request_latency_seconds`.
pub const E2E_SECONDS: &str = "vllm:e2e_request_latency_seconds";
/// `vllm:cache_config_info`.
pub const CACHE_CONFIG_INFO: &str = "vllm:cache_config_info";
/// Simulator only: wall seconds by which the engine loop started its steps later than the
/// timing model scheduled them (a busy machine, or step computation itself). Divided by the
/// elapsed wall time it says how far the fleet fell behind the model it stands for.
pub const BEHIND_SCHEDULE_SECONDS: &str = "sim:behind_schedule_seconds";

const TTFT_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
    160.0, 640.0, 2560.0,
];
const ITL_BUCKETS: &[f64] =
    &[0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0];
const E2E_BUCKETS: &[f64] = &[
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0,
    1920.0, 7680.0,
];

#[derive(Debug, Clone)]
struct Histogram {
    buckets: &'static [f64],
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

impl Histogram {
    fn new(buckets: &'static [f64]) -> Histogram {
        Histogram { buckets, counts: vec![0; buckets.len()], sum: 0.0, count: 0 }
    }

    fn observe(&mut self, v: f64) {
        for (i, b) in self.buckets.iter().enumerate() {
            if v <= *b {
                self.counts[i] += 1;
            }
        }
        self.sum += v;
        self.count += 1;
    }
}

/// Values the engine loop keeps up to date.
#[derive(Debug, Clone)]
pub struct Values {
    /// Gauge.
    pub running: u32,
    /// Gauge.
    pub waiting: u32,
    /// Gauge, 0–1.
    pub kv_usage: f64,
    /// Counter.
    pub prefix_cache_queries: u64,
    /// Counter.
    pub prefix_cache_hits: u64,
    /// Counter.
    pub prompt_tokens: u64,
    /// Counter.
    pub generation_tokens: u64,
    /// Counter.
    pub preemptions: u64,
    /// Counter: requests finished because they reached `max_tokens`.
    pub finished_length: u64,
    /// Counter: requests finished at a natural stop.
    pub finished_stop: u64,
    /// Counter: requests aborted (client gone).
    pub finished_abort: u64,
    /// Counter, wall seconds (see [`BEHIND_SCHEDULE_SECONDS`]).
    pub behind_schedule_seconds: f64,
    ttft: Histogram,
    itl: Histogram,
    e2e: Histogram,
}

/// Metrics of one worker.
#[derive(Debug)]
pub struct Metrics {
    model_name: String,
    block_size: u32,
    num_gpu_blocks: u32,
    values: Mutex<Values>,
}

impl Metrics {
    /// Empty metrics for a worker serving `model_name`.
    pub fn new(model_name: &str, block_size: u32, num_gpu_blocks: u32) -> Metrics {
        Metrics {
            model_name: model_name.to_owned(),
            block_size,
            num_gpu_blocks,
            values: Mutex::new(Values {
                running: 0,
                waiting: 0,
                kv_usage: 0.0,
                prefix_cache_queries: 0,
                prefix_cache_hits: 0,
                prompt_tokens: 0,
                generation_tokens: 0,
                preemptions: 0,
                finished_length: 0,
                finished_stop: 0,
                finished_abort: 0,
                behind_schedule_seconds: 0.0,
                ttft: Histogram::new(TTFT_BUCKETS),
                itl: Histogram::new(ITL_BUCKETS),
                e2e: Histogram::new(E2E_BUCKETS),
            }),
        }
    }

    /// Runs `f` on the values (short critical sections only; never across an await).
    pub fn update(&self, f: impl FnOnce(&mut Values)) {
        if let Ok(mut v) = self.values.lock() {
            f(&mut v);
        }
    }

    /// Records a time to first token, seconds.
    pub fn observe_ttft(&self, s: f64) {
        self.update(|v| v.ttft.observe(s));
    }

    /// Records an inter-token latency, seconds.
    pub fn observe_itl(&self, s: f64) {
        self.update(|v| v.itl.observe(s));
    }

    /// Records an end-to-end latency, seconds.
    pub fn observe_e2e(&self, s: f64) {
        self.update(|v| v.e2e.observe(s));
    }

    /// A copy of the current values.
    pub fn values(&self) -> Option<Values> {
        self.values.lock().ok().map(|v| v.clone())
    }

    /// The Prometheus text exposition (format 0.0.4).
    pub fn render(&self) -> String {
        let Some(v) = self.values() else { return String::new() };
        let labels = format!("engine=\"0\",model_name=\"{}\"", self.model_name.replace('"', "\\\""));
        let mut out = String::new();
        let mut gauge = |name: &str, help: &str, value: f64| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge\n{name}{{{labels}}} {value}");
        };
        gauge(NUM_REQUESTS_RUNNING, "Number of requests in model execution batches.", f64::from(v.running));
        gauge(NUM_REQUESTS_WAITING, "Number of requests waiting to be processed.", f64::from(v.waiting));
        gauge(KV_CACHE_USAGE_PERC, "KV-cache usage. 1 means 100 percent usage.", v.kv_usage);
        let mut counter = |name: &str, help: &str, value: u64| {
            let _ = writeln!(
                out,
                "# HELP {name}_total {help}\n# TYPE {name}_total counter\n{name}_total{{{labels}}} {value}.0"
            );
        };
        counter(
            PREFIX_CACHE_QUERIES,
            "Prefix cache queries, in terms of number of queried tokens.",
            v.prefix_cache_queries,
        );
        counter(PREFIX_CACHE_HITS, "Prefix cache hits, in terms of number of cached tokens.", v.prefix_cache_hits);
        counter(PROMPT_TOKENS, "Number of prefill tokens processed.", v.prompt_tokens);
        counter(GENERATION_TOKENS, "Number of generation tokens processed.", v.generation_tokens);
        counter(NUM_PREEMPTIONS, "Cumulative number of preemption from the engine.", v.preemptions);
        let _ = writeln!(
            out,
            "# HELP {REQUEST_SUCCESS}_total Count of successfully processed requests.\n# TYPE {REQUEST_SUCCESS}_total counter"
        );
        for (reason, n) in [("length", v.finished_length), ("stop", v.finished_stop), ("abort", v.finished_abort)] {
            let _ = writeln!(out, "{REQUEST_SUCCESS}_total{{{labels},finished_reason=\"{reason}\"}} {n}.0");
        }
        let _ = writeln!(
            out,
            "# HELP {BEHIND_SCHEDULE_SECONDS}_total Wall seconds the engine loop started steps later than its timing model.\n\
             # TYPE {BEHIND_SCHEDULE_SECONDS}_total counter\n{BEHIND_SCHEDULE_SECONDS}_total{{{labels}}} {}",
            v.behind_schedule_seconds
        );
        let mut hist = |name: &str, help: &str, h: &Histogram| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
            for (b, c) in h.buckets.iter().zip(&h.counts) {
                let _ = writeln!(out, "{name}_bucket{{{labels},le=\"{b:?}\"}} {c}.0");
            }
            let _ = writeln!(out, "{name}_bucket{{{labels},le=\"+Inf\"}} {}.0", h.count);
            let _ = writeln!(out, "{name}_count{{{labels}}} {}.0\n{name}_sum{{{labels}}} {}", h.count, h.sum);
        };
        hist(TTFT_SECONDS, "Histogram of time to first token in seconds.", &v.ttft);
        hist(ITL_SECONDS, "Histogram of inter-token latency in seconds.", &v.itl);
        hist(E2E_SECONDS, "Histogram of e2e request latency in seconds.", &v.e2e);
        let _ = writeln!(
            out,
            "# HELP {CACHE_CONFIG_INFO} Information of the LLMEngine CacheConfig\n# TYPE {CACHE_CONFIG_INFO} gauge\n\
             {CACHE_CONFIG_INFO}{{block_size=\"{}\",enable_prefix_caching=\"True\",engine=\"0\",num_gpu_blocks=\"{}\",prefix_caching_hash_algo=\"sha256\"}} 1.0",
            self.block_size, self.num_gpu_blocks
        );
        out
    }
}
