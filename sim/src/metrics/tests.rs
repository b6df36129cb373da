use super::*;
use crate::profile::TINY;

/// Families copied verbatim from vLLM 0.32.0's `/metrics` (CPU build, block size 32, 16,384
/// KV blocks, `--max-model-len 4096`, served model `sim-model`).
const VLLM_EXCERPT: &str = include_str!("vllm-0.32-excerpt.txt");

/// Every `# TYPE` line of vLLM 0.32.0's `vllm:` families, in order, less the families the
/// simulator does not model (multimodal and external caches, sleep mode, GPU roofline
/// estimates).
const VLLM_TYPES: &[(&str, &str)] = &[
    ("vllm:num_requests_running", "gauge"),
    ("vllm:num_requests_waiting", "gauge"),
    ("vllm:num_requests_waiting_by_reason", "gauge"),
    ("vllm:kv_cache_usage_perc", "gauge"),
    ("vllm:prefix_cache_queries_total", "counter"),
    ("vllm:prefix_cache_queries_created", "gauge"),
    ("vllm:prefix_cache_hits_total", "counter"),
    ("vllm:prefix_cache_hits_created", "gauge"),
    ("vllm:num_preemptions_total", "counter"),
    ("vllm:num_preemptions_created", "gauge"),
    ("vllm:prompt_tokens_total", "counter"),
    ("vllm:prompt_tokens_created", "gauge"),
    ("vllm:prompt_tokens_by_source_total", "counter"),
    ("vllm:prompt_tokens_by_source_created", "gauge"),
    ("vllm:prompt_tokens_cached_total", "counter"),
    ("vllm:prompt_tokens_cached_created", "gauge"),
    ("vllm:prompt_tokens_cached_by_source_total", "counter"),
    ("vllm:prompt_tokens_cached_by_source_created", "gauge"),
    ("vllm:generation_tokens_total", "counter"),
    ("vllm:generation_tokens_created", "gauge"),
    ("vllm:request_success_total", "counter"),
    ("vllm:request_success_created", "gauge"),
    ("vllm:admission_rejections_total", "counter"),
    ("vllm:admission_rejections_created", "gauge"),
    ("vllm:request_prompt_tokens", "histogram"),
    ("vllm:request_prompt_tokens_created", "gauge"),
    ("vllm:request_generation_tokens", "histogram"),
    ("vllm:request_generation_tokens_created", "gauge"),
    ("vllm:iteration_tokens_total", "histogram"),
    ("vllm:iteration_tokens_total_created", "gauge"),
    ("vllm:request_max_num_generation_tokens", "histogram"),
    ("vllm:request_max_num_generation_tokens_created", "gauge"),
    ("vllm:request_params_n", "histogram"),
    ("vllm:request_params_n_created", "gauge"),
    ("vllm:request_params_max_tokens", "histogram"),
    ("vllm:request_params_max_tokens_created", "gauge"),
    ("vllm:time_to_first_token_seconds", "histogram"),
    ("vllm:time_to_first_token_seconds_created", "gauge"),
    ("vllm:inter_token_latency_seconds", "histogram"),
    ("vllm:inter_token_latency_seconds_created", "gauge"),
    ("vllm:request_time_per_output_token_seconds", "histogram"),
    ("vllm:request_time_per_output_token_seconds_created", "gauge"),
    ("vllm:e2e_request_latency_seconds", "histogram"),
    ("vllm:e2e_request_latency_seconds_created", "gauge"),
    ("vllm:request_queue_time_seconds", "histogram"),
    ("vllm:request_queue_time_seconds_created", "gauge"),
    ("vllm:request_inference_time_seconds", "histogram"),
    ("vllm:request_inference_time_seconds_created", "gauge"),
    ("vllm:request_prefill_time_seconds", "histogram"),
    ("vllm:request_prefill_time_seconds_created", "gauge"),
    ("vllm:request_decode_time_seconds", "histogram"),
    ("vllm:request_decode_time_seconds_created", "gauge"),
    ("vllm:request_num_preemptions", "histogram"),
    ("vllm:request_num_preemptions_created", "gauge"),
    ("vllm:request_prefill_kv_computed_tokens", "histogram"),
    ("vllm:request_prefill_kv_computed_tokens_created", "gauge"),
    ("vllm:cache_config_info", "gauge"),
];

/// The engine the excerpt was captured from.
fn captured() -> Metrics {
    let profile = Profile { num_gpu_blocks: 16_384, block_size: 32, max_model_len: 4096, ..TINY };
    Metrics::new("sim-model", &profile, HashAlgo::Sha256)
}

/// Each line without its value: comment lines whole, samples as name and labels.
fn shape(text: &str) -> Vec<&str> {
    text.lines().map(|l| if l.starts_with('#') { l } else { l.rsplit_once(' ').map_or(l, |(s, _)| s) }).collect()
}

fn value_of<'a>(text: &'a str, sample: &str) -> Option<&'a str> {
    text.lines().find_map(|l| l.strip_prefix(sample)?.strip_prefix(' '))
}

#[test]
fn families_and_types_are_vllms_in_vllms_order() {
    let text = captured().render();
    let types: Vec<(&str, &str)> =
        text.lines().filter_map(|l| l.strip_prefix("# TYPE vllm:")).filter_map(|l| l.split_once(' ')).collect();
    let expected: Vec<(&str, &str)> =
        VLLM_TYPES.iter().map(|(n, k)| (n.strip_prefix("vllm:").unwrap_or(n), *k)).collect();
    assert_eq!(types, expected);
    // Every `# TYPE` has its `# HELP` right before it; the simulator's own family is `sim:`.
    let lines: Vec<&str> = text.lines().collect();
    for (i, l) in lines.iter().enumerate().filter(|(_, l)| l.starts_with("# TYPE ")) {
        let name = l.split(' ').nth(2).unwrap_or_default();
        assert!(i > 0 && lines[i - 1].starts_with(&format!("# HELP {name} ")), "{l}");
        assert!(name.starts_with("vllm:") || name.starts_with("sim:"), "{name}");
    }
    assert!(text.contains("# TYPE sim:behind_schedule_seconds_total counter\n"));
}

#[test]
fn headers_labels_and_buckets_match_the_captured_engine() {
    let ours = captured().render();
    let ours = shape(&ours);
    let theirs = shape(VLLM_EXCERPT);
    // Family by family (a block starts at `# HELP`), the same lines in the same order.
    let starts: Vec<usize> = (0..theirs.len()).filter(|i| theirs[*i].starts_with("# HELP ")).collect();
    for (k, &start) in starts.iter().enumerate() {
        let block = &theirs[start..starts.get(k + 1).copied().unwrap_or(theirs.len())];
        assert!(
            ours.windows(block.len()).any(|w| w == block),
            "not exported as vLLM does:\n{}\n--- ours:\n{}",
            block.join("\n"),
            ours.iter()
                .filter(|l| l.contains(block[0].split(' ').nth(2).unwrap_or("?")))
                .cloned()
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
    assert!(starts.len() >= 10, "the excerpt covers gauges, counters, histograms and the info gauge");
}

#[test]
fn every_series_starts_at_zero_with_a_creation_time() {
    let before = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0);
    let text = captured().render();
    for l in text.lines().filter(|l| !l.starts_with('#')) {
        let (sample, value) = l.rsplit_once(' ').expect("a sample has a value");
        let value: f64 = value.parse().expect("a number");
        if sample.contains("_created{") {
            assert!((value - before).abs() < 60.0, "{l}");
        } else if sample.starts_with(CACHE_CONFIG_INFO) {
            assert_eq!(value, 1.0);
        } else {
            assert_eq!(value, 0.0, "{l}");
        }
    }
    assert_eq!(
        value_of(&text, "vllm:request_success_total{engine=\"0\",finished_reason=\"stop\",model_name=\"sim-model\"}"),
        Some("0.0")
    );
}

#[test]
fn values_reach_their_series() {
    let m = captured();
    m.update(|v| {
        v.running = 2;
        v.waiting = 3;
        v.prompt_tokens = 949;
        v.prompt_tokens_computed = 373;
        v.prompt_tokens_cached = 576;
        v.prefix_cache_hits = 576;
        v.finished_length = 9;
        for x in [0.5, 20.0, 3000.0, 5000.0] {
            v.observe(Hist::PromptTokens, x);
        }
        v.observe(Hist::Ttft, 0.03);
    });
    let text = m.render();
    let at = |s: &str| value_of(&text, s).unwrap_or_else(|| panic!("no sample {s}"));
    let l = "engine=\"0\",model_name=\"sim-model\"";
    assert_eq!(at(&format!("vllm:num_requests_running{{{l}}}")), "2.0");
    assert_eq!(at(&format!("vllm:num_requests_waiting_by_reason{{{l},reason=\"capacity\"}}")), "3.0");
    assert_eq!(at(&format!("vllm:num_requests_waiting_by_reason{{{l},reason=\"deferred\"}}")), "0.0");
    assert_eq!(at(&format!("vllm:prompt_tokens_total{{{l}}}")), "949.0");
    assert_eq!(at(&format!("vllm:prompt_tokens_by_source_total{{{l},source=\"local_compute\"}}")), "373.0");
    assert_eq!(at(&format!("vllm:prompt_tokens_by_source_total{{{l},source=\"local_cache_hit\"}}")), "576.0");
    assert_eq!(at(&format!("vllm:prompt_tokens_cached_total{{{l}}}")), "576.0");
    assert_eq!(at(&format!("vllm:prompt_tokens_cached_by_source_total{{{l},source=\"device\"}}")), "576.0");
    assert_eq!(
        at("vllm:request_success_total{engine=\"0\",finished_reason=\"length\",model_name=\"sim-model\"}"),
        "9.0"
    );
    let bucket = |le: &str| {
        at(&format!("vllm:request_prompt_tokens_bucket{{engine=\"0\",le=\"{le}\",model_name=\"sim-model\"}}"))
            .to_owned()
    };
    assert_eq!([bucket("1.0"), bucket("20.0"), bucket("2000.0"), bucket("+Inf")], ["1.0", "2.0", "2.0", "4.0"]);
    assert_eq!(at(&format!("vllm:request_prompt_tokens_count{{{l}}}")), "4.0");
    assert_eq!(at(&format!("vllm:request_prompt_tokens_sum{{{l}}}")), "8020.5");
    let ttft = |le: &str| {
        at(&format!("vllm:time_to_first_token_seconds_bucket{{engine=\"0\",le=\"{le}\",model_name=\"sim-model\"}}"))
            .to_owned()
    };
    assert_eq!([ttft("0.02"), ttft("0.04"), ttft("2560.0")], ["0.0", "1.0", "1.0"]);
}

#[test]
fn token_buckets_follow_max_model_len_like_vllm() {
    assert_eq!(
        Hist::PromptTokens.buckets(4096),
        &[1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 2000.0]
    );
    assert_eq!(Hist::PrefillKvComputedTokens.buckets(32_768).last(), Some(&20_000.0));
    assert_eq!(Hist::ParamsMaxTokens.buckets(5000).last(), Some(&5000.0));
    assert_eq!(Hist::ParamsN.buckets(4096), &[1.0, 2.0, 5.0, 10.0, 20.0]);
    assert!(Hist::ALL.iter().enumerate().all(|(i, h)| *h as usize == i));
    assert!(Hist::ALL.iter().all(|h| h.buckets(u32::MAX).len() <= MAX_BUCKETS));
}

#[test]
fn cache_config_follows_the_profile() {
    let profile = Profile { num_gpu_blocks: 11_000, block_size: 16, max_model_len: 32_768, ..TINY };
    let text = Metrics::new("m", &profile, HashAlgo::Sha256).render();
    let line = text.lines().find(|l| l.starts_with("vllm:cache_config_info{")).expect("info gauge");
    for label in [
        "block_size=\"16\"",
        "effective_attention_block_size=\"16\"",
        "num_gpu_blocks=\"11000\"",
        "kv_cache_size_tokens=\"176000\"",
        "kv_cache_max_concurrency=\"5.37109375\"",
        "kv_cache_memory_bytes=\"360448000\"",
        "enable_prefix_caching=\"True\"",
        "prefix_caching_hash_algo=\"sha256\"",
    ] {
        assert!(line.contains(label), "{label} in {line}");
    }
    assert!(!line.contains("model_name"));
}

#[test]
fn model_names_are_escaped() {
    let text = Metrics::new("a\"b\\c", &TINY, HashAlgo::Sha256).render();
    assert!(text.contains("vllm:num_requests_running{engine=\"0\",model_name=\"a\\\"b\\\\c\"} 0.0\n"));
}

#[test]
fn floats_print_as_prometheus_client_prints_them() {
    let print = |v: f64| {
        let mut s = String::from("x");
        push_float(&mut s, v);
        s.split_off(1)
    };
    assert_eq!(print(949.0), "949.0");
    assert_eq!(print(0.0), "0.0");
    assert_eq!(print(0.001), "0.001");
    assert_eq!(print(0.273693323135376), "0.273693323135376");
    assert_eq!(print(16384.0), "16384.0");
    assert_eq!(print(123456.0), "123456.0");
    assert_eq!(print(1_000_000.0), "1e+06");
    assert_eq!(print(1_234_567.5), "1.2345675e+06");
    assert_eq!(print(1_796_126_123.673_535_6), "1.7961261236735356e+09");
    assert_eq!(print(f64::INFINITY), "+Inf");
    assert_eq!(print(-2.5), "-2.5");
}
