//! Proxy overhead: TTFT through the spoke minus TTFT direct to the same worker, with the
//! simulator's step time set to (almost) zero so only the HTTP path is measured.

use std::path::Path;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use futures::StreamExt;
use switchyard_sim::wire::WireFormat;
use switchyard_sim::{Fleet, KvEventsConfig, SimConfig, profile};
use switchyard_spoke::{Spoke, SpokeConfig};

async fn ttft(client: &reqwest::Client, url: &str, model: &str) -> f64 {
    let body = serde_json::json!({"model": model, "prompt": "hello world, the cache of model request token", "max_tokens": 2, "stream": true});
    let start = Instant::now();
    let r = client.post(format!("{url}/v1/completions")).json(&body).send().await.expect("send");
    let mut s = r.bytes_stream();
    while let Some(chunk) = s.next().await {
        if chunk.expect("chunk").windows(6).any(|w| w == b"\"text\"") {
            let t = start.elapsed().as_secs_f64() * 1e3;
            while s.next().await.is_some() {}
            return t;
        }
    }
    f64::NAN
}

fn percentile(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * p).round() as usize]
}

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    let tokenizer = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tokenizer/files");
    let (fleet, spoke, dir) = rt.block_on(async {
        let fleet = Fleet::start(SimConfig {
            host: "127.0.0.1".into(),
            port: 0,
            workers: 1,
            served_model_name: "sim-model".into(),
            tokenizer_dir: tokenizer.clone(),
            profile: profile::TINY.clone(),
            time_scale: 0.0,
            seed: 0,
            kv_events: Some(KvEventsConfig { enable_kv_cache_events: true, publisher: None, endpoint: "tcp://*:0".into(), replay_endpoint: None, buffer_steps: 100, topic: String::new() }),
            wire_format: WireFormat::Current,
            enable_prompt_tokens_details: true,
        })
        .await
        .expect("fleet");
        let w = &fleet.workers[0];
        let kv_port = w.kv_events.as_deref().and_then(|e| e.rsplit(':').next()).unwrap_or("1").to_owned();
        let dir = std::env::temp_dir().join(format!("spoke-bench-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        std::fs::write(
            dir.join("fleet.yaml"),
            format!(
                "apiVersion: switchyard.dev/v1alpha1\nkind: InferenceWorkerSet\nmetadata: {{name: s}}\nspec:\n  model: sim-model\n  cluster: c\n  endpoints:\n    static: [{{name: w, host: 127.0.0.1, httpPort: {}, kvEventsPort: {kv_port}}}]\n  tokenizer: {{source: Files, path: {}}}\n---\napiVersion: switchyard.dev/v1alpha1\nkind: InferencePool\nmetadata: {{name: p}}\nspec:\n  members: [{{workerSet: s}}]\n---\napiVersion: switchyard.dev/v1alpha1\nkind: GatewayBackend\nmetadata: {{name: g}}\nspec:\n  models: [{{name: sim-model, pool: p}}]\n",
                w.http.port(),
                tokenizer.display()
            ),
        )
        .expect("config");
        let spoke = Spoke::start(SpokeConfig { reload_interval: Duration::from_secs(60), ..SpokeConfig::loopback(vec![dir.clone()]) })
            .await
            .expect("spoke");
        tokio::time::sleep(Duration::from_millis(500)).await;
        (fleet, spoke, dir)
    });
    let direct = format!("http://{}", fleet.workers[0].http);
    let via = format!("http://{}", spoke.addr);
    let client = reqwest::Client::new();
    let (mut d, mut v) = rt.block_on(async {
        for _ in 0..50 {
            ttft(&client, &direct, "sim-model").await;
            ttft(&client, &via, "sim-model").await;
        }
        let (mut d, mut v) = (Vec::new(), Vec::new());
        for _ in 0..1_000 {
            d.push(ttft(&client, &direct, "sim-model").await);
            v.push(ttft(&client, &via, "sim-model").await);
        }
        (d, v)
    });
    let mut added: Vec<f64> = v.iter().zip(&d).map(|(a, b)| a - b).collect();
    println!(
        "TTFT direct p50 {:.3} ms p99 {:.3} ms; via spoke p50 {:.3} ms p99 {:.3} ms; added p50 {:.3} ms p99 {:.3} ms (1,000 interleaved pairs)",
        percentile(&mut d, 0.5),
        percentile(&mut d, 0.99),
        percentile(&mut v, 0.5),
        percentile(&mut v, 0.99),
        percentile(&mut added, 0.5),
        percentile(&mut added, 0.99)
    );
    c.bench_function("spoke/ttft-via-spoke", |b| b.iter(|| rt.block_on(ttft(&client, &via, "sim-model"))));
    c.bench_function("spoke/ttft-direct", |b| b.iter(|| rt.block_on(ttft(&client, &direct, "sim-model"))));
    rt.block_on(async {
        spoke.shutdown().await;
        fleet.shutdown().await;
    });
    let _ = std::fs::remove_dir_all(dir);
}

criterion_group!(benches, bench);
criterion_main!(benches);
