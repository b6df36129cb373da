//! Proxy overhead: TTFT through the spoke minus TTFT direct to the same worker, with the
//! simulator's step time set to (almost) zero so only the HTTP path is measured.

use std::time::Instant;

use criterion::{Criterion, criterion_group, criterion_main};
use futures::StreamExt;

mod common;

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

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    let (fleet, spoke, dir) = rt.block_on(common::fleet_and_spoke(1, true));
    let direct = format!("http://{}", fleet.workers[0].http);
    let via = format!("http://{}", spoke.addr);
    let client = reqwest::Client::new();
    let (d, v) = rt.block_on(async {
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
    println!("{}", common::added_ttft_report("TTFT", &d, &v));
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
