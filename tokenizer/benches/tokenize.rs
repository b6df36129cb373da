//! Tokenization CPU per prompt with the shipped tokenizer: a 16k-token raw `/v1/completions`
//! prompt cold and with its first 16,000 tokens repeating an earlier request, a chat request
//! with a long repeated system prompt, and a prompt of 500,000 special tokens. `reference`
//! rows are a plain `tokenizers` encode of the same text, for comparison.

use std::hint::black_box;
use std::path::Path;
use std::time::Duration;

use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
use serde_json::json;
use switchyard_tokenizer::EngineTokenizer;
use tokenizers::Tokenizer;

/// SplitMix64.
fn mix(z: &mut u64) -> u64 {
    *z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut x = *z;
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// Deterministic prose: words, numbers, punctuation, newlines and a little JSON.
fn prose(seed: u64, bytes: usize) -> String {
    const WORDS: &[&str] = &[
        "the",
        "request",
        "token",
        "cache",
        "worker",
        "cluster",
        "policy",
        "route",
        "queue",
        "prompt",
        "latency",
        "region",
        "provider",
        "tenant",
        "batch",
        "stream",
        "event",
        "block",
        "prefix",
        "engine",
        "model",
        "data",
        "because",
        "through",
        "between",
        "important",
        "development",
        "government",
    ];
    let mut z = seed;
    let mut s = String::with_capacity(bytes + 64);
    while s.len() < bytes {
        let r = mix(&mut z);
        match r % 23 {
            0 => s.push_str(".\n"),
            1 => s.push_str(", "),
            2 => s.push_str(&format!("{} ", r % 10_000)),
            3 => s.push_str(&format!("{{\"key_{}\": [{}, true]}} ", r % 97, r % 1000)),
            _ => {
                s.push_str(WORDS[(r >> 8) as usize % WORDS.len()]);
                s.push(' ');
            }
        }
    }
    s
}

/// Uses up the first chunked encodes, which are also checked against a full encode.
fn past_verification(t: EngineTokenizer) -> EngineTokenizer {
    for i in 0..=switchyard_tokenizer::SEGMENT_VERIFY as u64 {
        t.encode_prompt(&prose(u64::MAX - i, 2 * switchyard_tokenizer::SEGMENT_MIN_BYTES), true).expect("encodes");
    }
    t
}

fn bench(c: &mut Criterion) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("files");
    let reference = Tokenizer::from_file(dir.join("tokenizer.json")).expect("tokenizer");
    let load = || past_verification(EngineTokenizer::from_dir(&dir).expect("tokenizer"));
    let count = |text: &str| reference.encode(text, true).expect("encodes").len();

    // A 16,384-token raw prompt: 16,000 tokens shared with an earlier request, then a new tail.
    let long = prose(1, 120_000);
    let offsets = reference.encode(long.as_str(), true).expect("encodes").get_offsets().to_vec();
    let shared = long[..offsets[16_000].0].to_owned();
    let tail_bytes = offsets[16_384].0 - offsets[16_000].0;
    let prompt = |n: u64| format!("{shared}{}", prose(1000 + n, tail_bytes));
    eprintln!("raw prompt: {} tokens, {} bytes", count(&prompt(0)), prompt(0).len());

    {
        let mut g = c.benchmark_group("raw-16k");
        let text = prompt(0);
        g.bench_function("reference-full-encode", |b| b.iter(|| reference.encode(black_box(text.as_str()), true)));
        // Nothing cached: every chunk is encoded (the cost of a cold prompt).
        let cold = load().with_cache_bytes(0);
        g.bench_function("no-cache", |b| b.iter(|| cold.encode_prompt(black_box(&text), true).expect("encodes")));
        // The first 16,000 tokens as an earlier request; each measured prompt has a new tail.
        let warm = load();
        let before = warm.cache_stats();
        warm.encode_prompt(&prompt(0), true).expect("encodes");
        let after = warm.cache_stats();
        eprintln!(
            "raw prompt: {} chunks, {} candidate cut points examined",
            after.chunks - before.chunks,
            after.scan_steps - before.scan_steps
        );
        let mut n = 0;
        g.bench_function("repeated-prefix-new-384-token-tail", |b| {
            b.iter_batched(
                || {
                    n += 1;
                    prompt(n)
                },
                |p| warm.encode_prompt(&p, true).expect("encodes"),
                BatchSize::SmallInput,
            )
        });
        // As the spoke's front-door bench: the shared text, a space, a new 40-word tail.
        let short_tail_bytes = offsets[16_048].0 - offsets[16_000].0;
        g.bench_function("repeated-prefix-new-48-token-tail", |b| {
            b.iter_batched(
                || {
                    n += 1;
                    format!("{shared}{}", prose(1000 + n, short_tail_bytes))
                },
                |p| warm.encode_prompt(&p, true).expect("encodes"),
                BatchSize::SmallInput,
            )
        });
        g.bench_function("repeated-whole-prompt", |b| {
            b.iter(|| warm.encode_prompt(black_box(&text), true).expect("encodes"))
        });
        let s = warm.cache_stats();
        eprintln!("raw-16k cache: {} entries, {} KiB, {} hits, {} misses", s.entries, s.bytes / 1024, s.hits, s.misses);
        g.finish();
    }

    {
        // A ~16k-token system prompt shared by every request; a new short user turn each time.
        let mut g = c.benchmark_group("chat-16k-system");
        let system = shared.clone();
        let messages = |n: u64| {
            [json!({"role": "system", "content": system}), json!({"role": "user", "content": prose(5000 + n, 200)})]
        };
        let t = load();
        let rendered = t.render_chat(&messages(0), true, false, None, None).expect("renders");
        eprintln!("chat prompt: {} tokens", count(&rendered));
        g.bench_function("reference-full-encode", |b| b.iter(|| reference.encode(black_box(rendered.as_str()), false)));
        t.encode_chat(&messages(0), true, false, None, None, false).expect("encodes");
        let mut n = 0;
        g.bench_function("render-only", |b| {
            b.iter_batched(
                || {
                    n += 1;
                    messages(n)
                },
                |m| t.render_chat(&m, true, false, None, None).expect("renders"),
                BatchSize::SmallInput,
            )
        });
        g.bench_function("repeated-system-new-user-turn", |b| {
            b.iter_batched(
                || {
                    n += 1;
                    messages(n)
                },
                |m| t.encode_chat(&m, true, false, None, None, false).expect("encodes"),
                BatchSize::SmallInput,
            )
        });
        g.finish();
    }

    {
        // Linear: the 1M rows take twice the 500k rows (the old segment splitter was quadratic).
        let mut g = c.benchmark_group("special-tokens");
        g.sample_size(10).measurement_time(Duration::from_secs(5));
        let cold = load().with_cache_bytes(0);
        let t = load();
        for n in [500_000, 1_000_000] {
            let text = "<|im_start|>".repeat(n);
            if n == 500_000 {
                g.bench_function("500k-reference-full-encode", |b| {
                    b.iter(|| reference.encode(black_box(text.as_str()), true))
                });
            }
            let k = n / 1000;
            g.bench_function(format!("{k}k-no-cache"), |b| {
                b.iter(|| cold.encode_prompt(black_box(&text), true).expect("encodes"))
            });
            g.bench_function(format!("{k}k-cached"), |b| {
                b.iter(|| t.encode_prompt(black_box(&text), true).expect("encodes"))
            });
            let chat = "<|im_start|>user\nhi<|im_end|>\n".repeat(n);
            g.bench_function(format!("{k}k-chat-turns-cached"), |b| {
                b.iter(|| t.encode_prompt(black_box(&chat), true).expect("encodes"))
            });
        }
        g.finish();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
