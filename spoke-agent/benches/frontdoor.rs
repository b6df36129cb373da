//! Front-door CPU per request through the whole library path — parse, tokenize (exactly as
//! the engine), KV-index lookup, plan, book, relay and render — to an in-process upstream that
//! streams 300 tokens. The prompt is 16k tokens whose first 16,000 repeat an earlier request,
//! for chat, Messages and a raw `/v1/completions` prompt string.
//!
//! The spoke runs for real (its registry, index and scrapers over one simulated worker that
//! is never sent a request); only the upstream is replaced, so no socket time is measured.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
use futures::future::BoxFuture;
use serde_json::{Map, Value};
use switchyard_gateway::admission::Admission;
use switchyard_gateway::observe::Dispatch;
use switchyard_gateway::relay::{Api, RelayLimits, relay};
use switchyard_gateway::upstream::{EventStream, SendError, Upstream};
use switchyard_gateway::{Backend, Event, FinishReason, InferenceRequest, Routed, Target, Usage, anthropic, openai};
use switchyard_spoke::http::SpokeBackend;
use tokio_util::sync::CancellationToken;

mod common;

const OUTPUT_TOKENS: u32 = 300;

/// Streams 300 one-token text events, a finish and usage, from memory.
struct MemoryUpstream;

impl Upstream for MemoryUpstream {
    fn send<'a>(&'a self, _req: &'a InferenceRequest) -> BoxFuture<'a, Result<EventStream, SendError>> {
        Box::pin(async {
            let mut events: Vec<Result<Event, _>> =
                (0..OUTPUT_TOKENS).map(|_| Ok(Event::Text(" token".into()))).collect();
            events.push(Ok(Event::Finish(FinishReason::Length)));
            events.push(Ok(Event::Usage(Usage {
                prompt_tokens: 16_000,
                completion_tokens: OUTPUT_TOKENS,
                cached_tokens: 15_984,
                cache_write_tokens: 0,
            })));
            Ok(Box::pin(futures::stream::iter(events)) as EventStream)
        })
    }
}

struct MemoryTarget(MemoryUpstream);

impl Target for MemoryTarget {
    fn label(&self) -> &str {
        "memory"
    }
    fn upstream(&self) -> &dyn Upstream {
        &self.0
    }
    fn dispatch(&self, _attempt: usize) -> Dispatch {
        Dispatch::bare()
    }
}

fn words(seed: u64, n: usize) -> String {
    const WORDS: &[&str] =
        &["model", "cache", "request", "token", "worker", "cluster", "policy", "route", "queue", "prompt"];
    let mut x = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
    (0..n)
        .map(|_| {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            WORDS[(x >> 33) as usize % WORDS.len()]
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// One request through parse → route (tokenize, plan, book) → relay → rendered body.
async fn one(backend: &SpokeBackend, admission: &Admission, api: Api, body: &Bytes) -> usize {
    let map: Map<String, Value> = serde_json::from_slice(body).expect("json");
    let req = match api {
        Api::Chat => openai::parse(openai::Endpoint::Chat, map),
        Api::Completions => openai::parse(openai::Endpoint::Completions, map),
        Api::Messages => anthropic::parse(anthropic::Endpoint::Messages, "2023-06-01", map),
    }
    .expect("valid request");
    let req = Arc::new(req);
    let routed = backend.route(req.clone()).await.expect("routed");
    let routed = Routed { targets: vec![Box::new(MemoryTarget(MemoryUpstream))], ..routed };
    let permit = admission.try_admit().expect("admitted");
    let resp =
        relay(req, api, routed, RelayLimits::default(), CancellationToken::new(), permit).await.expect("relayed");
    axum::body::to_bytes(resp.into_body(), usize::MAX).await.expect("body").len()
}

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    let (fleet, spoke, dir) = rt.block_on(common::fleet_and_spoke(1, true));
    let backend = SpokeBackend(spoke.app.clone());
    let admission = Admission::new(1024, Duration::from_secs(1));
    // ~16,000 tokens of shared text, then a new tail per request. Bodies are built from
    // pre-rendered halves so that making one costs little next to what is measured.
    let shared = serde_json::to_string(&words(1, 15_600)).expect("json");
    let shared = &shared[1..shared.len() - 1];
    let mut n = 0u64;
    let mut bodies = |api: Api| {
        n += 1;
        let tail = words(1000 + n, 40);
        let body = match api {
            Api::Chat => format!(
                r#"{{"model":"sim-model","max_tokens":{OUTPUT_TOKENS},"stream":true,"messages":[{{"role":"system","content":"{shared}"}},{{"role":"user","content":"{tail}"}}]}}"#
            ),
            Api::Messages => format!(
                r#"{{"model":"sim-model","max_tokens":{OUTPUT_TOKENS},"stream":true,"system":"{shared}","messages":[{{"role":"user","content":"{tail}"}}]}}"#
            ),
            Api::Completions => {
                format!(
                    r#"{{"model":"sim-model","max_tokens":{OUTPUT_TOKENS},"stream":true,"prompt":"{shared} {tail}"}}"#
                )
            }
        };
        Bytes::from(body)
    };
    for (name, api) in [("chat", Api::Chat), ("messages", Api::Messages), ("completions", Api::Completions)] {
        // Warm the caches with the shared prefix, as the earlier request did.
        let first = bodies(api);
        rt.block_on(one(&backend, &admission, api, &first));
        // Every measured request has a new tail (built outside the measurement).
        c.bench_function(&format!("frontdoor/{name}-16k-repeated-prefix-300-tokens"), |b| {
            b.iter_batched(
                || bodies(api),
                |body| rt.block_on(one(&backend, &admission, api, &body)),
                BatchSize::SmallInput,
            )
        });
    }
    rt.block_on(async {
        spoke.shutdown().await;
        fleet.shutdown().await;
    });
    let _ = std::fs::remove_dir_all(dir);
}

criterion_group!(benches, bench);
criterion_main!(benches);
