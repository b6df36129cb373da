//! Prometheus metrics with vLLM's names, types, labels, help texts and buckets.
//!
//! The exposition is, family for family, the one vLLM 0.32 serves through `prometheus_client`:
//! counters are exported as `<name>_total`, every counter and histogram series has a
//! `<name>_created` gauge holding the Unix time it was created, label names are in
//! alphabetical order, and every series vLLM creates up front (each finish reason, waiting
//! reason and token source) exists from the start at 0. Samples carry `engine="0"` and
//! `model_name` (`vllm:admission_rejections` has no `engine`, `vllm:cache_config_info` no
//! `model_name`), as in vLLM.
//!
//! Left out, because the simulator models none of them: the multimodal cache
//! (`vllm:mm_cache_*`), the KV connector's external cache (`vllm:external_prefix_cache_*`),
//! sleep mode (`vllm:engine_sleep_state`) and the roofline estimates of a real GPU
//! (`vllm:estimated_*_per_gpu`). Series the simulator has no source for (external token
//! sources, admission rejections, deferred waiting, the `error` and `repetition` finish
//! reasons) are exported at 0. Simulator-only families use the `sim:` prefix.
//!
//! [`FAMILIES`] lists every family in exposition order. The text around the values is laid
//! out once per worker ([`Metrics::new`]); a scrape copies the values out under the lock (a
//! fixed-size copy, no allocation) and writes them into that layout.

use crate::engine::hash::HashAlgo;
use std::fmt::Write as _;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::profile::Profile;

/// `vllm:num_requests_running`.
pub const NUM_REQUESTS_RUNNING: &str = "vllm:num_requests_running";
/// `vllm:num_requests_waiting`.
pub const NUM_REQUESTS_WAITING: &str = "vllm:num_requests_waiting";
/// `vllm:num_requests_waiting_by_reason` (label `reason`, [`WAITING_REASONS`]).
pub const NUM_REQUESTS_WAITING_BY_REASON: &str = "vllm:num_requests_waiting_by_reason";
/// `vllm:kv_cache_usage_perc` (a fraction, 0–1, despite the name).
pub const KV_CACHE_USAGE_PERC: &str = "vllm:kv_cache_usage_perc";
/// `vllm:prefix_cache_queries` (tokens).
pub const PREFIX_CACHE_QUERIES: &str = "vllm:prefix_cache_queries";
/// `vllm:prefix_cache_hits` (tokens).
pub const PREFIX_CACHE_HITS: &str = "vllm:prefix_cache_hits";
/// `vllm:num_preemptions`.
pub const NUM_PREEMPTIONS: &str = "vllm:num_preemptions";
/// `vllm:prompt_tokens`.
pub const PROMPT_TOKENS: &str = "vllm:prompt_tokens";
/// `vllm:prompt_tokens_by_source` (label `source`, [`PROMPT_TOKEN_SOURCES`]).
pub const PROMPT_TOKENS_BY_SOURCE: &str = "vllm:prompt_tokens_by_source";
/// `vllm:prompt_tokens_cached`.
pub const PROMPT_TOKENS_CACHED: &str = "vllm:prompt_tokens_cached";
/// `vllm:prompt_tokens_cached_by_source` (label `source`, [`CACHED_TOKEN_SOURCES`]).
pub const PROMPT_TOKENS_CACHED_BY_SOURCE: &str = "vllm:prompt_tokens_cached_by_source";
/// `vllm:generation_tokens`.
pub const GENERATION_TOKENS: &str = "vllm:generation_tokens";
/// `vllm:request_success` (label `finished_reason`, [`FINISHED_REASONS`]).
pub const REQUEST_SUCCESS: &str = "vllm:request_success";
/// `vllm:admission_rejections` (label `reason`, [`REJECTION_REASONS`]; no `engine` label).
pub const ADMISSION_REJECTIONS: &str = "vllm:admission_rejections";
/// `vllm:request_prompt_tokens`.
pub const REQUEST_PROMPT_TOKENS: &str = "vllm:request_prompt_tokens";
/// `vllm:request_generation_tokens`.
pub const REQUEST_GENERATION_TOKENS: &str = "vllm:request_generation_tokens";
/// `vllm:iteration_tokens_total` (a histogram, despite the suffix).
pub const ITERATION_TOKENS: &str = "vllm:iteration_tokens_total";
/// `vllm:request_max_num_generation_tokens`.
pub const REQUEST_MAX_NUM_GENERATION_TOKENS: &str = "vllm:request_max_num_generation_tokens";
/// `vllm:request_params_n`.
pub const REQUEST_PARAMS_N: &str = "vllm:request_params_n";
/// `vllm:request_params_max_tokens`.
pub const REQUEST_PARAMS_MAX_TOKENS: &str = "vllm:request_params_max_tokens";
/// `vllm:time_to_first_token_seconds`.
pub const TTFT_SECONDS: &str = "vllm:time_to_first_token_seconds";
/// `vllm:inter_token_latency_seconds`.
pub const ITL_SECONDS: &str = "vllm:inter_token_latency_seconds";
/// `vllm:request_time_per_output_token_seconds`.
pub const TPOT_SECONDS: &str = "vllm:request_time_per_output_token_seconds";
/// `vllm:e2e_request_latency_seconds`.
pub const E2E_SECONDS: &str = "vllm:e2e_request_latency_seconds";
/// `vllm:request_queue_time_seconds`.
pub const QUEUE_TIME_SECONDS: &str = "vllm:request_queue_time_seconds";
/// `vllm:request_inference_time_seconds`.
pub const INFERENCE_TIME_SECONDS: &str = "vllm:request_inference_time_seconds";
/// `vllm:request_prefill_time_seconds`.
pub const PREFILL_TIME_SECONDS: &str = "vllm:request_prefill_time_seconds";
/// `vllm:request_decode_time_seconds`.
pub const DECODE_TIME_SECONDS: &str = "vllm:request_decode_time_seconds";
/// `vllm:request_num_preemptions`.
pub const REQUEST_NUM_PREEMPTIONS: &str = "vllm:request_num_preemptions";
/// `vllm:request_prefill_kv_computed_tokens`.
pub const REQUEST_PREFILL_KV_COMPUTED_TOKENS: &str = "vllm:request_prefill_kv_computed_tokens";
/// `vllm:cache_config_info`.
pub const CACHE_CONFIG_INFO: &str = "vllm:cache_config_info";
/// Simulator only: wall seconds by which the engine loop started its steps later than the
/// timing model scheduled them (a busy machine, or step computation itself). Divided by the
/// elapsed wall time it says how far the fleet fell behind the model it stands for.
pub const BEHIND_SCHEDULE_SECONDS: &str = "sim:behind_schedule_seconds";

/// `finished_reason` values of [`REQUEST_SUCCESS`].
pub const FINISHED_REASONS: [&str; 5] = ["stop", "length", "abort", "error", "repetition"];
/// `reason` values of [`NUM_REQUESTS_WAITING_BY_REASON`].
pub const WAITING_REASONS: [&str; 2] = ["capacity", "deferred"];
/// `source` values of [`PROMPT_TOKENS_BY_SOURCE`].
pub const PROMPT_TOKEN_SOURCES: [&str; 3] = ["local_compute", "local_cache_hit", "external_kv_transfer"];
/// `source` values of [`PROMPT_TOKENS_CACHED_BY_SOURCE`].
pub const CACHED_TOKEN_SOURCES: [&str; 5] = ["device", "host", "p2p", "disk", "external_unspecified"];
/// `reason` values of [`ADMISSION_REJECTIONS`].
pub const REJECTION_REASONS: [&str; 2] = ["max_num_queued_reqs", "max_num_queued_tokens"];

/// KV-cache bytes per token reported in `kv_cache_memory_bytes` (the captured engine's ratio).
const KV_BYTES_PER_TOKEN: u64 = 2048;

const TTFT_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
    160.0, 640.0, 2560.0,
];
/// Inter-token latency and per-request time per output token.
const ITL_BUCKETS: &[f64] =
    &[0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0];
/// End-to-end latency and the queue, prefill, decode and inference phases.
const REQUEST_LATENCY_BUCKETS: &[f64] = &[
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0,
    1920.0, 7680.0,
];
/// vLLM's default when no CUDA graph capture sizes apply (CPU, eager).
const ITERATION_TOKENS_BUCKETS: &[f64] =
    &[1.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0, 16384.0];
const PARAMS_N_BUCKETS: &[f64] = &[1.0, 2.0, 5.0, 10.0, 20.0];
const NUM_PREEMPTIONS_BUCKETS: &[f64] = &[1.0, 2.0, 3.0, 4.0, 5.0, 10.0, 20.0];
/// 1, 2, 5, 10, 20, 50, …: token-count histograms use the prefix up to `max_model_len`.
const ONE_TWO_FIVE: [f64; 30] = [
    1.0, 2.0, 5.0, 1e1, 2e1, 5e1, 1e2, 2e2, 5e2, 1e3, 2e3, 5e3, 1e4, 2e4, 5e4, 1e5, 2e5, 5e5, 1e6, 2e6, 5e6, 1e7, 2e7,
    5e7, 1e8, 2e8, 5e8, 1e9, 2e9, 5e9,
];
/// Room for the longest bucket list.
const MAX_BUCKETS: usize = ONE_TWO_FIVE.len();

/// The histograms, in exposition order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hist {
    /// [`REQUEST_PROMPT_TOKENS`]: prompt length of each finished request.
    PromptTokens,
    /// [`REQUEST_GENERATION_TOKENS`]: output length of each finished request.
    GenerationTokens,
    /// [`ITERATION_TOKENS`]: per step with output, the prompt tokens computed for the
    /// requests whose prefill completed plus the tokens generated.
    IterationTokens,
    /// [`REQUEST_MAX_NUM_GENERATION_TOKENS`]: the longest output among a request's `n`
    /// sequences (its output length: `n` is always 1).
    MaxNumGenerationTokens,
    /// [`REQUEST_PARAMS_N`]: the `n` parameter.
    ParamsN,
    /// [`REQUEST_PARAMS_MAX_TOKENS`]: the effective `max_tokens` parameter.
    ParamsMaxTokens,
    /// [`TTFT_SECONDS`]: arrival to first token.
    Ttft,
    /// [`ITL_SECONDS`]: between consecutive tokens of a request.
    Itl,
    /// [`TPOT_SECONDS`]: decode time over output tokens after the first, per request.
    TimePerOutputToken,
    /// [`E2E_SECONDS`]: arrival to last token.
    E2e,
    /// [`QUEUE_TIME_SECONDS`]: arrival to first scheduled.
    QueueTime,
    /// [`INFERENCE_TIME_SECONDS`]: first scheduled to last token.
    InferenceTime,
    /// [`PREFILL_TIME_SECONDS`]: first scheduled to first token.
    PrefillTime,
    /// [`DECODE_TIME_SECONDS`]: first token to last token.
    DecodeTime,
    /// [`REQUEST_NUM_PREEMPTIONS`]: preemptions of each finished request.
    NumPreemptions,
    /// [`REQUEST_PREFILL_KV_COMPUTED_TOKENS`]: prompt tokens computed, not served from cache.
    PrefillKvComputedTokens,
}

const NUM_HISTS: usize = 16;

impl Hist {
    /// Every histogram, indexed by `self as usize`.
    pub const ALL: [Hist; NUM_HISTS] = [
        Hist::PromptTokens,
        Hist::GenerationTokens,
        Hist::IterationTokens,
        Hist::MaxNumGenerationTokens,
        Hist::ParamsN,
        Hist::ParamsMaxTokens,
        Hist::Ttft,
        Hist::Itl,
        Hist::TimePerOutputToken,
        Hist::E2e,
        Hist::QueueTime,
        Hist::InferenceTime,
        Hist::PrefillTime,
        Hist::DecodeTime,
        Hist::NumPreemptions,
        Hist::PrefillKvComputedTokens,
    ];

    /// Bucket upper bounds (without `+Inf`) for an engine with `max_model_len`.
    pub fn buckets(self, max_model_len: u32) -> &'static [f64] {
        match self {
            Hist::PromptTokens
            | Hist::GenerationTokens
            | Hist::MaxNumGenerationTokens
            | Hist::ParamsMaxTokens
            | Hist::PrefillKvComputedTokens => {
                let n = ONE_TWO_FIVE.iter().take_while(|b| **b <= f64::from(max_model_len)).count();
                &ONE_TWO_FIVE[..n]
            }
            Hist::IterationTokens => ITERATION_TOKENS_BUCKETS,
            Hist::ParamsN => PARAMS_N_BUCKETS,
            Hist::Ttft => TTFT_BUCKETS,
            Hist::Itl | Hist::TimePerOutputToken => ITL_BUCKETS,
            Hist::E2e | Hist::QueueTime | Hist::InferenceTime | Hist::PrefillTime | Hist::DecodeTime => {
                REQUEST_LATENCY_BUCKETS
            }
            Hist::NumPreemptions => NUM_PREEMPTIONS_BUCKETS,
        }
    }
}

/// One histogram's state: cumulative bucket counts, as exposed.
#[derive(Debug, Clone, Copy)]
struct HistData {
    buckets: &'static [f64],
    cumulative: [u64; MAX_BUCKETS],
    sum: f64,
    count: u64,
}

impl HistData {
    fn new(buckets: &'static [f64]) -> HistData {
        HistData { buckets, cumulative: [0; MAX_BUCKETS], sum: 0.0, count: 0 }
    }

    fn observe(&mut self, v: f64) {
        let first = self.buckets.partition_point(|b| *b < v);
        for c in &mut self.cumulative[first..self.buckets.len()] {
            *c += 1;
        }
        self.sum += v;
        self.count += 1;
    }
}

/// Values the engine loop keeps up to date.
#[derive(Debug, Clone, Copy)]
pub struct Values {
    /// Gauge.
    pub running: u32,
    /// Gauge (all waiting for capacity: the simulator defers nothing).
    pub waiting: u32,
    /// Gauge, 0–1.
    pub kv_usage: f64,
    /// Counter, tokens looked up in the prefix cache at admission.
    pub prefix_cache_queries: u64,
    /// Counter, tokens found there (all from the device tier).
    pub prefix_cache_hits: u64,
    /// Counter: prompt tokens of the requests whose prefill completed (a prompt counts once,
    /// at its first token, cached part included).
    pub prompt_tokens: u64,
    /// Counter: of those, the tokens computed (`source="local_compute"`).
    pub prompt_tokens_computed: u64,
    /// Counter: of those, the tokens served from the prefix cache (`source="local_cache_hit"`).
    pub prompt_tokens_cached: u64,
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
    hists: [HistData; NUM_HISTS],
}

impl Values {
    fn new(max_model_len: u32) -> Values {
        Values {
            running: 0,
            waiting: 0,
            kv_usage: 0.0,
            prefix_cache_queries: 0,
            prefix_cache_hits: 0,
            prompt_tokens: 0,
            prompt_tokens_computed: 0,
            prompt_tokens_cached: 0,
            generation_tokens: 0,
            preemptions: 0,
            finished_length: 0,
            finished_stop: 0,
            finished_abort: 0,
            behind_schedule_seconds: 0.0,
            hists: Hist::ALL.map(|h| HistData::new(h.buckets(max_model_len))),
        }
    }

    /// Records one observation of `h`.
    pub fn observe(&mut self, h: Hist, v: f64) {
        self.hists[h as usize].observe(v);
    }

    /// Number and sum of the observations of `h`.
    pub fn histogram(&self, h: Hist) -> (u64, f64) {
        let d = &self.hists[h as usize];
        (d.count, d.sum)
    }

    fn get(&self, s: Series) -> f64 {
        match s {
            Series::Zero => 0.0,
            Series::Running => f64::from(self.running),
            Series::Waiting => f64::from(self.waiting),
            Series::KvUsage => self.kv_usage,
            Series::PrefixCacheQueries => self.prefix_cache_queries as f64,
            Series::PrefixCacheHits => self.prefix_cache_hits as f64,
            Series::Preemptions => self.preemptions as f64,
            Series::PromptTokens => self.prompt_tokens as f64,
            Series::PromptTokensComputed => self.prompt_tokens_computed as f64,
            Series::PromptTokensCached => self.prompt_tokens_cached as f64,
            Series::GenerationTokens => self.generation_tokens as f64,
            Series::FinishedStop => self.finished_stop as f64,
            Series::FinishedLength => self.finished_length as f64,
            Series::FinishedAbort => self.finished_abort as f64,
            Series::BehindSchedule => self.behind_schedule_seconds,
        }
    }
}

/// Where a sample's value comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Series {
    /// Nothing in the simulator produces it.
    Zero,
    Running,
    Waiting,
    KvUsage,
    PrefixCacheQueries,
    PrefixCacheHits,
    Preemptions,
    PromptTokens,
    PromptTokensComputed,
    PromptTokensCached,
    GenerationTokens,
    FinishedStop,
    FinishedLength,
    FinishedAbort,
    BehindSchedule,
}

/// A family's Prometheus type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A value that goes up and down.
    Gauge,
    /// Monotonic; exported as `<name>_total`, with `<name>_created`.
    Counter,
    /// Buckets, count and sum, with `<name>_created`.
    Histogram(Hist),
    /// A gauge fixed at 1 whose labels carry the information.
    Info,
}

/// One exported family.
#[derive(Debug, Clone, Copy)]
pub struct Family {
    /// The family name (counters without `_total`).
    pub name: &'static str,
    /// `# HELP` text, exactly as vLLM's.
    pub help: &'static str,
    /// The type.
    pub kind: Kind,
    /// Whether samples carry `engine="0"`.
    pub engine: bool,
    /// The family's own label (empty when it has none) …
    pub label: &'static str,
    /// … with, for each of its values, where the sample's value comes from. One entry with an
    /// empty value for families without a label; empty for histograms and info.
    series: &'static [(&'static str, Series)],
}

const fn plain(
    name: &'static str,
    help: &'static str,
    kind: Kind,
    series: &'static [(&'static str, Series)],
) -> Family {
    Family { name, help, kind, engine: true, label: "", series }
}

const fn histogram(name: &'static str, help: &'static str, h: Hist) -> Family {
    Family { name, help, kind: Kind::Histogram(h), engine: true, label: "", series: &[] }
}

/// Every exported family, in vLLM's exposition order (the simulator's own last).
pub const FAMILIES: &[Family] = &[
    plain(
        NUM_REQUESTS_RUNNING,
        "Number of requests in model execution batches.",
        Kind::Gauge,
        &[("", Series::Running)],
    ),
    plain(NUM_REQUESTS_WAITING, "Number of requests waiting to be processed.", Kind::Gauge, &[("", Series::Waiting)]),
    Family {
        name: NUM_REQUESTS_WAITING_BY_REASON,
        help: "Number of waiting requests by reason. Reason labels: 'capacity' = waiting for scheduling capacity; \
               'deferred' = deferred by transient constraints (LoRA budget, KV transfer, blocked status). Sum of all \
               reasons equals vllm:num_requests_waiting.",
        kind: Kind::Gauge,
        engine: true,
        label: "reason",
        series: &[("capacity", Series::Waiting), ("deferred", Series::Zero)],
    },
    plain(KV_CACHE_USAGE_PERC, "KV-cache usage. 1 means 100 percent usage.", Kind::Gauge, &[("", Series::KvUsage)]),
    plain(
        PREFIX_CACHE_QUERIES,
        "Prefix cache queries, in terms of number of queried tokens.",
        Kind::Counter,
        &[("", Series::PrefixCacheQueries)],
    ),
    plain(
        PREFIX_CACHE_HITS,
        "Prefix cache hits, in terms of number of cached tokens.",
        Kind::Counter,
        &[("", Series::PrefixCacheHits)],
    ),
    plain(
        NUM_PREEMPTIONS,
        "Cumulative number of preemption from the engine.",
        Kind::Counter,
        &[("", Series::Preemptions)],
    ),
    plain(PROMPT_TOKENS, "Number of prefill tokens processed.", Kind::Counter, &[("", Series::PromptTokens)]),
    Family {
        name: PROMPT_TOKENS_BY_SOURCE,
        help: "Number of prompt tokens by source.",
        kind: Kind::Counter,
        engine: true,
        label: "source",
        series: &[
            ("local_compute", Series::PromptTokensComputed),
            ("local_cache_hit", Series::PromptTokensCached),
            ("external_kv_transfer", Series::Zero),
        ],
    },
    plain(
        PROMPT_TOKENS_CACHED,
        "Number of cached prompt tokens (local + external).",
        Kind::Counter,
        &[("", Series::PromptTokensCached)],
    ),
    Family {
        name: PROMPT_TOKENS_CACHED_BY_SOURCE,
        help: "Prefix-cache hit tokens by the cache tier that supplied them: device (local HBM), host (offloaded to \
               DRAM), disk, p2p (transferred from another vLLM instance) or external_unspecified. Counted at \
               admission; sums to vllm:prefix_cache_hits + vllm:external_prefix_cache_hits.",
        kind: Kind::Counter,
        engine: true,
        label: "source",
        series: &[
            ("device", Series::PrefixCacheHits),
            ("host", Series::Zero),
            ("p2p", Series::Zero),
            ("disk", Series::Zero),
            ("external_unspecified", Series::Zero),
        ],
    },
    plain(
        GENERATION_TOKENS,
        "Number of generation tokens processed.",
        Kind::Counter,
        &[("", Series::GenerationTokens)],
    ),
    Family {
        name: REQUEST_SUCCESS,
        help: "Count of successfully processed requests.",
        kind: Kind::Counter,
        engine: true,
        label: "finished_reason",
        series: &[
            ("stop", Series::FinishedStop),
            ("length", Series::FinishedLength),
            ("abort", Series::FinishedAbort),
            ("error", Series::Zero),
            ("repetition", Series::Zero),
        ],
    },
    Family {
        name: ADMISSION_REJECTIONS,
        help: "Number of admission attempts rejected by a queue limit, by reason.",
        kind: Kind::Counter,
        engine: false,
        label: "reason",
        series: &[("max_num_queued_reqs", Series::Zero), ("max_num_queued_tokens", Series::Zero)],
    },
    histogram(REQUEST_PROMPT_TOKENS, "Number of prefill tokens processed.", Hist::PromptTokens),
    histogram(REQUEST_GENERATION_TOKENS, "Number of generation tokens processed.", Hist::GenerationTokens),
    histogram(ITERATION_TOKENS, "Histogram of number of tokens per engine_step.", Hist::IterationTokens),
    histogram(
        REQUEST_MAX_NUM_GENERATION_TOKENS,
        "Histogram of maximum number of requested generation tokens.",
        Hist::MaxNumGenerationTokens,
    ),
    histogram(REQUEST_PARAMS_N, "Histogram of the n request parameter.", Hist::ParamsN),
    histogram(REQUEST_PARAMS_MAX_TOKENS, "Histogram of the max_tokens request parameter.", Hist::ParamsMaxTokens),
    histogram(TTFT_SECONDS, "Histogram of time to first token in seconds.", Hist::Ttft),
    histogram(ITL_SECONDS, "Histogram of inter-token latency in seconds.", Hist::Itl),
    histogram(TPOT_SECONDS, "Histogram of time_per_output_token_seconds per request.", Hist::TimePerOutputToken),
    histogram(E2E_SECONDS, "Histogram of e2e request latency in seconds.", Hist::E2e),
    histogram(QUEUE_TIME_SECONDS, "Histogram of time spent in WAITING phase for request.", Hist::QueueTime),
    histogram(INFERENCE_TIME_SECONDS, "Histogram of time spent in RUNNING phase for request.", Hist::InferenceTime),
    histogram(PREFILL_TIME_SECONDS, "Histogram of time spent in PREFILL phase for request.", Hist::PrefillTime),
    histogram(DECODE_TIME_SECONDS, "Histogram of time spent in DECODE phase for request.", Hist::DecodeTime),
    histogram(
        REQUEST_NUM_PREEMPTIONS,
        "Histogram of the number of times a request was preempted.",
        Hist::NumPreemptions,
    ),
    histogram(
        REQUEST_PREFILL_KV_COMPUTED_TOKENS,
        "Histogram of new KV tokens computed during prefill (excluding cached tokens).",
        Hist::PrefillKvComputedTokens,
    ),
    Family {
        name: CACHE_CONFIG_INFO,
        help: "Information of the LLMEngine CacheConfig",
        kind: Kind::Info,
        engine: true,
        label: "",
        series: &[],
    },
    plain(
        BEHIND_SCHEDULE_SECONDS,
        "Wall seconds the engine loop started steps later than its timing model.",
        Kind::Counter,
        &[("", Series::BehindSchedule)],
    ),
];

/// The labels of `vllm:cache_config_info`: the simulated engine's cache configuration, with
/// vLLM's values for everything the simulator does not vary.
fn cache_config_labels(profile: &Profile, hash_algo: HashAlgo) -> Vec<(&'static str, String)> {
    let size_tokens = u64::from(profile.num_gpu_blocks) * u64::from(profile.block_size);
    let concurrency = size_tokens as f64 / f64::from(profile.max_model_len.max(1));
    let fixed = [
        ("_block_size_resolved", "True"),
        ("cache_dtype", "auto"),
        ("cache_hit_alignment_tokens", "None"),
        ("enable_mamba_shared_prefix_checkpoint", "False"),
        ("enable_prefix_caching", "True"),
        ("engine", "0"),
        ("gpu_memory_utilization", "0.92"),
        ("hash_block_size", "None"),
        ("is_attention_free", "False"),
        ("kv_cache_dtype_skip_layers", "[]"),
        ("kv_cache_layout", "None"),
        ("kv_offloading_backend", "native"),
        ("kv_offloading_size", "None"),
        ("kv_sharing_fast_prefill", "False"),
        ("mamba_block_size", "None"),
        ("mamba_cache_dtype", "auto"),
        ("mamba_cache_mode", "none"),
        ("mamba_page_size_padded", "None"),
        ("mamba_ssm_cache_dtype", "auto"),
        ("num_cpu_blocks", "None"),
        ("num_gpu_blocks_override", "None"),
        ("prefix_cache_retention_interval", "0"),
        ("prefix_match_unit", "None"),
        ("replayssm_buffer_len", "16"),
        ("skip_page_size_padded", "None"),
        ("sliding_window", "None"),
        ("swa_bounded_replay", "True"),
        ("use_kda_recoverssm", "False"),
        ("use_replayssm", "False"),
        ("user_specified_block_size", "True"),
    ];
    let mut labels: Vec<(&'static str, String)> = fixed.iter().map(|(k, v)| (*k, (*v).to_owned())).collect();
    labels.extend([
        ("block_size", profile.block_size.to_string()),
        ("effective_attention_block_size", profile.block_size.to_string()),
        ("num_gpu_blocks", profile.num_gpu_blocks.to_string()),
        ("kv_cache_size_tokens", size_tokens.to_string()),
        // Python's `str(float)`: `128.0`, `5.37109375`.
        ("kv_cache_max_concurrency", format!("{concurrency:?}")),
        ("kv_cache_memory_bytes", (size_tokens * KV_BYTES_PER_TOKEN).to_string()),
        ("prefix_caching_hash_algo", hash_algo.as_str().to_owned()),
    ]);
    labels
}

/// One piece of the exposition: fixed text, or a value followed by a newline.
#[derive(Debug)]
enum Op {
    Text(String),
    Value(Series),
    Bucket(Hist, usize),
    Count(Hist),
    Sum(Hist),
}

/// The exposition with holes for the values, built once.
#[derive(Debug, Default)]
struct Layout {
    ops: Vec<Op>,
    /// Text since the last value.
    text: String,
}

impl Layout {
    fn sample(&mut self, name: &str, suffix: &str, labels: &str, value: Op) {
        let _ = write!(self.text, "{name}{suffix}{labels} ");
        self.ops.push(Op::Text(std::mem::take(&mut self.text)));
        self.ops.push(value);
    }

    fn header(&mut self, name: &str, suffix: &str, help: &str, kind: &str) {
        let _ = write!(self.text, "# HELP {name}{suffix} {help}\n# TYPE {name}{suffix} {kind}\n");
    }

    /// The `_created` gauge of a counter or histogram: one sample per series, all created
    /// with the worker.
    fn created(&mut self, f: &Family, labels: impl Iterator<Item = String>, created: &str) {
        self.header(f.name, "_created", f.help, "gauge");
        for l in labels {
            let _ = writeln!(self.text, "{}_created{l} {created}", f.name);
        }
    }

    fn build(model_name: &str, profile: &Profile, hash_algo: HashAlgo, created: f64) -> Vec<Op> {
        let mut layout = Layout::default();
        let mut created_at = String::new();
        push_float(&mut created_at, created);
        for f in FAMILIES {
            let labels = |extra: Option<(&str, &str)>| {
                let mut pairs = vec![("model_name", model_name)];
                if f.engine {
                    pairs.push(("engine", "0"));
                }
                pairs.extend(extra);
                label_set(&pairs)
            };
            let own = |value: &'static str| labels((!f.label.is_empty()).then_some((f.label, value)));
            match f.kind {
                Kind::Gauge => {
                    layout.header(f.name, "", f.help, "gauge");
                    for &(value, s) in f.series {
                        layout.sample(f.name, "", &own(value), Op::Value(s));
                    }
                }
                Kind::Counter => {
                    layout.header(f.name, "_total", f.help, "counter");
                    for &(value, s) in f.series {
                        layout.sample(f.name, "_total", &own(value), Op::Value(s));
                    }
                    layout.created(f, f.series.iter().map(|&(value, _)| own(value)), &created_at);
                }
                Kind::Histogram(h) => {
                    layout.header(f.name, "", f.help, "histogram");
                    let mut le = String::new();
                    for (i, b) in h.buckets(profile.max_model_len).iter().enumerate() {
                        le.clear();
                        push_float(&mut le, *b);
                        layout.sample(f.name, "_bucket", &labels(Some(("le", &le))), Op::Bucket(h, i));
                    }
                    layout.sample(f.name, "_bucket", &labels(Some(("le", "+Inf"))), Op::Count(h));
                    layout.sample(f.name, "_count", &labels(None), Op::Count(h));
                    layout.sample(f.name, "_sum", &labels(None), Op::Sum(h));
                    layout.created(f, std::iter::once(labels(None)), &created_at);
                }
                Kind::Info => {
                    layout.header(f.name, "", f.help, "gauge");
                    let config = cache_config_labels(profile, hash_algo);
                    let pairs: Vec<(&str, &str)> = config.iter().map(|(k, v)| (*k, v.as_str())).collect();
                    let _ = writeln!(layout.text, "{}{} 1.0", f.name, label_set(&pairs));
                }
            }
        }
        if !layout.text.is_empty() {
            layout.ops.push(Op::Text(layout.text));
        }
        layout.ops
    }
}

/// `{k="v",…}` with the keys in alphabetical order (as `prometheus_client` prints them) and
/// the values escaped.
fn label_set(pairs: &[(&str, &str)]) -> String {
    let mut pairs = pairs.to_vec();
    pairs.sort_by_key(|(k, _)| *k);
    let mut out = String::from("{");
    for (i, (k, v)) in pairs.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        let _ = write!(out, "{k}=\"");
        for c in v.chars() {
            match c {
                '\\' => out.push_str("\\\\"),
                '"' => out.push_str("\\\""),
                '\n' => out.push_str("\\n"),
                c => out.push(c),
            }
        }
        out.push('"');
    }
    out.push('}');
    out
}

/// Appends `v` as `prometheus_client` prints floats: Python's shortest round-trip form
/// (`949.0`, `0.25`), switching to Go's exponent form once seven or more digits precede the
/// point (`1.7961261236735356e+09`). Allocates nothing.
fn push_float(out: &mut String, v: f64) {
    if v.is_nan() {
        return out.push_str("NaN");
    }
    if v.is_infinite() {
        return out.push_str(if v > 0.0 { "+Inf" } else { "-Inf" });
    }
    let start = out.len();
    let _ = write!(out, "{v:?}");
    let Some(dot) = out[start..].find('.') else { return };
    if v <= 0.0 || dot <= 6 || out.len() - start > 32 {
        return;
    }
    // At most 17 significant digits and the point: below 1e16 `{:?}` has no exponent.
    let mut digits = [0u8; 32];
    let mut n = 0;
    for b in out[start..].bytes().filter(|b| *b != b'.') {
        digits[n] = b;
        n += 1;
    }
    while n > 1 && digits[n - 1] == b'0' {
        n -= 1;
    }
    out.truncate(start);
    out.push(char::from(digits[0]));
    if n > 1 {
        out.push('.');
        digits[1..n].iter().for_each(|b| out.push(char::from(*b)));
    }
    let _ = write!(out, "e+0{}", dot - 1);
}

/// Metrics of one worker.
#[derive(Debug)]
pub struct Metrics {
    values: Mutex<Values>,
    /// The exposition's text and the values to fill in, in order.
    layout: Vec<Op>,
    /// Length of the last exposition, to size the next one.
    last_len: AtomicUsize,
}

impl Metrics {
    /// Empty metrics for a worker serving `model_name` with `profile`; every series is
    /// created now.
    pub fn new(model_name: &str, profile: &Profile, hash_algo: HashAlgo) -> Metrics {
        let created = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0);
        Metrics {
            values: Mutex::new(Values::new(profile.max_model_len)),
            layout: Layout::build(model_name, profile, hash_algo, created),
            last_len: AtomicUsize::new(0),
        }
    }

    /// Runs `f` on the values (short critical sections only; never across an await).
    pub fn update(&self, f: impl FnOnce(&mut Values)) {
        if let Ok(mut v) = self.values.lock() {
            f(&mut v);
        }
    }

    /// Records one observation of `h`.
    pub fn observe(&self, h: Hist, v: f64) {
        self.update(|m| m.observe(h, v));
    }

    /// A copy of the current values.
    pub fn values(&self) -> Option<Values> {
        self.values.lock().ok().map(|v| *v)
    }

    /// The Prometheus text exposition (format 0.0.4).
    pub fn render(&self) -> String {
        let Some(v) = self.values() else { return String::new() };
        let mut out = String::with_capacity(self.last_len.load(Ordering::Relaxed) + 1024);
        for op in &self.layout {
            let value = match op {
                Op::Text(t) => {
                    out.push_str(t);
                    continue;
                }
                Op::Value(s) => v.get(*s),
                Op::Bucket(h, i) => v.hists[*h as usize].cumulative[*i] as f64,
                Op::Count(h) => v.hists[*h as usize].count as f64,
                Op::Sum(h) => v.hists[*h as usize].sum,
            };
            push_float(&mut out, value);
            out.push('\n');
        }
        self.last_len.store(out.len(), Ordering::Relaxed);
        out
    }
}

#[cfg(test)]
mod tests;
