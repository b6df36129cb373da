//! `dynamo-kv-router`'s own vLLM decoder accepts the simulator's live KV events (both wire
//! forms), and its radix tree, fed only from those events, finds the request's prompt on the
//! worker that served it.

use std::path::Path;
use std::time::Duration;

use dynamo_kv_router::RadixTree;
use dynamo_kv_router::protocols::{BlockHashOptions, WorkerWithDpRank, compute_block_hash_for_seq};
use dynamo_kv_router::zmq_wire::{ZmqEventNormalizer, decode_event_batch};
use serde_json::{Value, json};
use switchyard_sim::wire::WireFormat;
use switchyard_sim::{Fleet, KvEventsConfig, SimConfig, profile};
use zeromq::{Socket, SocketRecv, SubSocket};

fn config(format: WireFormat) -> SimConfig {
    SimConfig {
        host: "127.0.0.1".into(),
        port: 0,
        workers: 1,
        served_model_name: "sim-model".into(),
        tokenizer_dir: Path::new(env!("CARGO_MANIFEST_DIR")).join("../tokenizer/files"),
        profile: profile::TINY.clone(),
        time_scale: 1.0,
        seed: 3,
        kv_events: Some(KvEventsConfig {
            enable_kv_cache_events: true,
            publisher: Some("zmq".into()),
            endpoint: "tcp://*:0".into(),
            replay_endpoint: None,
            buffer_steps: 100,
            topic: String::new(),
        }),
        wire_format: format,
        enable_prompt_tokens_details: true,
        prefix_caching_hash_algo: Default::default(),
    }
}

async fn check(format: WireFormat) {
    let fleet = Fleet::start(config(format)).await.expect("fleet starts");
    let w = fleet.workers[0].clone();
    let mut sub = SubSocket::new();
    sub.subscribe("").await.expect("subscribe");
    sub.connect(w.kv_events.as_deref().expect("kv events on")).await.expect("connect");
    tokio::time::sleep(Duration::from_millis(300)).await;

    let http = reqwest::Client::new();
    let base = format!("http://{}", w.http);
    let messages = json!([{"role": "system", "content": "Routers index the engine's own KV events. ".repeat(8)},
                          {"role": "user", "content": "Where is my prefix?"}]);
    let tokens: Vec<u32> = {
        let v: Value = http
            .post(format!("{base}/tokenize"))
            .json(&json!({"messages": messages}))
            .send()
            .await
            .expect("tokenize")
            .json()
            .await
            .expect("json");
        serde_json::from_value(v["tokens"].clone()).expect("tokens")
    };
    let r = http
        .post(format!("{base}/v1/chat/completions"))
        .json(&json!({"model": "sim-model", "messages": messages, "max_tokens": 2}))
        .send()
        .await
        .expect("chat");
    assert!(r.status().is_success());

    let worker = WorkerWithDpRank { worker_id: 42, dp_rank: 0 };
    let mut normalizer = ZmqEventNormalizer::new(16);
    let mut tree = RadixTree::new();
    let mut applied = 0;
    while let Ok(Ok(msg)) = tokio::time::timeout(Duration::from_millis(500), sub.recv()).await {
        let frames = msg.into_vec();
        assert_eq!(frames.len(), 3);
        let seq = u64::from_be_bytes(frames[1].as_ref().try_into().expect("8-byte seq"));
        let batch =
            decode_event_batch(&frames[2]).unwrap_or_else(|e| panic!("dynamo rejects batch {seq} ({format:?}): {e}"));
        assert_eq!(batch.data_parallel_rank, Some(0));
        for (i, raw) in batch.events.into_iter().enumerate() {
            let event = normalizer.normalize(raw, seq * 1000 + i as u64, worker).and_then(|p| p.into_router_event());
            if let Some(event) = event {
                tree.apply_event(event).expect("event applies");
                applied += 1;
            }
        }
    }
    assert!(applied > 0, "no events applied");
    let query = compute_block_hash_for_seq(&tokens, 16, BlockHashOptions::default());
    let overlap = tree.find_matches(query.clone(), false);
    let blocks = overlap.scores.get(&worker).copied().unwrap_or(0);
    assert_eq!(blocks as usize, query.len(), "the whole prompt ({} full blocks) is found on the worker", query.len());
    fleet.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dynamo_decodes_current_form() {
    check(WireFormat::Current).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dynamo_decodes_legacy_form() {
    check(WireFormat::Legacy).await;
}
