//! Spillover overhead: time to first token through the spoke to the faithful Bedrock endpoint
//! minus time to first token from the endpoint direct, with the endpoint's latency model set
//! to zero so only the path is measured.
//!
//! Direct is the real `aws-sdk-bedrockruntime` client (the one the spoke uses) calling
//! `ConverseStream` until its first text delta; through the spoke is an OpenAI streamed chat
//! request until its first content chunk, routed to the provider by a policy that requires the
//! provider's region (so the local worker is never a candidate). Pairs are interleaved.

use std::time::Instant;

use aws_sdk_bedrockruntime::types::{ContentBlock, ContentBlockDelta, ConversationRole, ConverseStreamOutput, Message};
use criterion::{Criterion, criterion_group, criterion_main};
use futures::StreamExt;
use switchyard_core::fleet::{ProviderConnection, ProviderCredentials, ProviderLimits};
use switchyard_providers::SecretFiles;
use switchyard_sim::bedrock::{BedrockConfig, BedrockEndpoint, LatencyModel};

mod common;

const MODEL_ID: &str = "us.meta.llama3-3-70b-instruct-v1:0";

async fn ttft_direct(client: &aws_sdk_bedrockruntime::Client) -> f64 {
    let start = Instant::now();
    let message = Message::builder()
        .role(ConversationRole::User)
        .content(ContentBlock::Text("hello world, the cache of model request token".into()))
        .build()
        .expect("message");
    let mut out = client.converse_stream().model_id(MODEL_ID).messages(message).send().await.expect("converse-stream");
    let mut first = f64::NAN;
    while let Some(event) = out.stream.recv().await.expect("event") {
        if first.is_nan()
            && let ConverseStreamOutput::ContentBlockDelta(d) = &event
            && matches!(d.delta, Some(ContentBlockDelta::Text(_)))
        {
            first = start.elapsed().as_secs_f64() * 1e3;
        }
    }
    first
}

async fn ttft_via(client: &reqwest::Client, url: &str) -> f64 {
    let body = serde_json::json!({"model": "sim-model", "max_tokens": 8, "stream": true,
        "messages": [{"role": "user", "content": "hello world, the cache of model request token"}]});
    let start = Instant::now();
    let r = client.post(format!("{url}/v1/chat/completions")).json(&body).send().await.expect("send");
    assert!(r.headers().contains_key("x-switchyard-provider"), "the request must spill over");
    let mut s = r.bytes_stream();
    let mut first = f64::NAN;
    while let Some(chunk) = s.next().await {
        if first.is_nan() && chunk.expect("chunk").windows(10).any(|w| w == b"\"content\":") {
            first = start.elapsed().as_secs_f64() * 1e3;
        }
    }
    first
}

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    let endpoint = rt
        .block_on(BedrockEndpoint::start(BedrockConfig {
            models: vec![MODEL_ID.to_owned()],
            latency: LatencyModel { first_token_ms: 0.0, per_input_token_ms: 0.0, per_output_token_ms: 0.0 },
            ..BedrockConfig::default()
        }))
        .expect("endpoint");
    let secrets = std::env::temp_dir().join(format!("provider-bench-secrets-{}", std::process::id()));
    std::fs::create_dir_all(secrets.join("aws")).expect("secrets dir");
    std::fs::write(secrets.join("aws").join("keys"), "AWS_ACCESS_KEY_ID=AKIDBENCH\nAWS_SECRET_ACCESS_KEY=bench\n")
        .expect("secret");
    let documents = format!(
        "---\napiVersion: switchyard.dev/v1alpha1\nkind: InferenceProvider\nmetadata: {{name: bedrock}}\nspec:\n  type: Bedrock\n  region: us-east-1\n  baseUrl: {}\n  credentials: {{secretRef: {{name: aws, key: keys}}}}\n  residency: {{external: true, region: us-east-1}}\n  models: [{{name: sim-model, providerModelId: \"{MODEL_ID}\"}}]\n---\napiVersion: switchyard.dev/v1alpha1\nkind: InferencePolicy\nmetadata: {{name: cloud-only}}\nspec:\n  priority: 10\n  steps: [{{type: RequireRegions, requireRegions: [us-east-1]}}]\n  minimize: PredictedTTFT\n  onEmpty: Fallback\n---\napiVersion: switchyard.dev/v1alpha1\nkind: InferencePolicy\nmetadata: {{name: pii-residency}}\nspec:\n  priority: 1000\n  match: {{tags: [pii]}}\n  steps: [{{type: ExcludeExternal}}]\n  minimize: PredictedTTFT\n  onEmpty: Reject\n",
        endpoint.url()
    );
    let (fleet, spoke, dir) = rt.block_on(common::fleet_and_spoke_with(
        1,
        false,
        ", {provider: bedrock, model: sim-model}",
        &documents,
        Some(secrets.clone()),
    ));
    let conn = ProviderConnection {
        aws_region: Some("us-east-1".into()),
        base_url: Some(endpoint.url()),
        credentials: ProviderCredentials::Secret { name: "aws".into(), key: "keys".into() },
        limits: ProviderLimits::default(),
    };
    let sdk = rt
        .block_on(switchyard_providers::bedrock::client("bedrock", &conn, &SecretFiles { dir: Some(secrets.clone()) }))
        .expect("sdk client");
    let via = format!("http://{}", spoke.addr);
    let http = reqwest::Client::new();
    let (d, v) = rt.block_on(async {
        for _ in 0..50 {
            ttft_direct(&sdk).await;
            ttft_via(&http, &via).await;
        }
        let (mut d, mut v) = (Vec::new(), Vec::new());
        for _ in 0..1_000 {
            d.push(ttft_direct(&sdk).await);
            v.push(ttft_via(&http, &via).await);
        }
        (d, v)
    });
    println!("{}", common::added_ttft_report("Bedrock TTFT (direct: the SDK)", &d, &v));
    c.bench_function("spoke/bedrock-ttft-via-spoke", |b| b.iter(|| rt.block_on(ttft_via(&http, &via))));
    c.bench_function("spoke/bedrock-ttft-direct", |b| b.iter(|| rt.block_on(ttft_direct(&sdk))));
    rt.block_on(async {
        spoke.shutdown().await;
        fleet.shutdown().await;
        endpoint.shutdown().await;
    });
    let _ = std::fs::remove_dir_all(dir);
    let _ = std::fs::remove_dir_all(secrets);
}

criterion_group!(benches, bench);
criterion_main!(benches);
