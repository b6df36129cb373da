//! Stream faults for hostile-input tests: `cutStreams` truncates a stream (some chunks, then
//! the connection drops without `[DONE]`), and `stallAfterHeaders` answers 200 with headers
//! and then nothing, until the client leaves or the simulator shuts down.

use std::path::Path;
use std::time::Duration;

use futures::StreamExt;
use serde_json::{Value, json};
use switchyard_sim::{Fleet, SimConfig};

fn config() -> SimConfig {
    SimConfig {
        time_scale: 0.1,
        seed: 9,
        ..SimConfig::loopback(Path::new(env!("CARGO_MANIFEST_DIR")).join("../tokenizer/files"))
    }
}

fn chat(stream: bool) -> Value {
    json!({"model": "sim-model", "messages": [{"role": "user", "content": "Tell me a story."}],
           "max_tokens": 8, "stream": stream})
}

async fn faults(http: &reqwest::Client, base: &str, body: Value) -> Value {
    let r = http.post(format!("{base}/sim/faults")).json(&body).send().await.expect("arm");
    assert_eq!(r.status(), 200);
    r.json().await.expect("snapshot")
}

async fn stalled(http: &reqwest::Client, base: &str) -> u64 {
    let v: Value = http.get(format!("{base}/sim/state")).send().await.expect("state").json().await.expect("json");
    v["stalledRequests"].as_u64().expect("stalledRequests")
}

#[tokio::test]
async fn cut_streams_truncate_without_done() {
    let fleet = Fleet::start(config()).await.expect("fleet starts");
    let base = format!("http://{}", fleet.workers[0].http);
    let http = reqwest::Client::new();
    let armed = faults(&http, &base, json!({"cutStreams": {"count": 1, "afterTokens": 3}})).await;
    assert_eq!(armed["cutStreams"], json!({"count": 1, "afterTokens": 3}));

    let r = http.post(format!("{base}/v1/chat/completions")).json(&chat(true)).send().await.expect("send");
    assert_eq!(r.status(), 200);
    let mut body = r.bytes_stream();
    let mut text = String::new();
    let mut failed = false;
    while let Some(piece) = body.next().await {
        match piece {
            Ok(b) => text.push_str(std::str::from_utf8(&b).expect("utf-8")),
            Err(_) => {
                failed = true;
                break;
            }
        }
    }
    assert!(failed, "the body ends in an error (truncated chunked body), got {text:?}");
    let events: Vec<&str> = text.split("\n\n").filter_map(|e| e.strip_prefix("data: ")).collect();
    assert_eq!(events.len(), 4, "role chunk + 3 token chunks: {events:?}");
    assert!(!text.contains("[DONE]") && !text.contains("finish_reason\":\"length"), "{text}");
    for e in &events {
        serde_json::from_str::<Value>(e).expect("every delivered event is whole JSON");
    }

    // Disarmed again: the next stream is whole.
    let armed = faults(&http, &base, json!({})).await;
    assert_eq!(armed["cutStreams"]["count"], 0);
    let r = http.post(format!("{base}/v1/chat/completions")).json(&chat(true)).send().await.expect("send");
    assert!(r.text().await.expect("whole body").ends_with("data: [DONE]\n\n"));
    fleet.shutdown().await;
}

#[tokio::test]
async fn stall_after_headers_sends_headers_then_nothing() {
    let fleet = Fleet::start(config()).await.expect("fleet starts");
    let base = format!("http://{}", fleet.workers[0].http);
    let http = reqwest::Client::new();
    let armed = faults(&http, &base, json!({"stallAfterHeaders": 2})).await;
    assert_eq!(armed["stallAfterHeaders"], 2);

    // Streamed: 200 and SSE headers arrive, then no byte.
    let url = format!("{base}/v1/chat/completions");
    let r = tokio::time::timeout(Duration::from_secs(5), http.post(&url).json(&chat(true)).send())
        .await
        .expect("headers arrive")
        .expect("response");
    assert_eq!(r.status(), 200);
    assert!(r.headers()[reqwest::header::CONTENT_TYPE].to_str().is_ok_and(|c| c.starts_with("text/event-stream")));
    let mut body = r.bytes_stream();
    assert!(tokio::time::timeout(Duration::from_millis(500), body.next()).await.is_err(), "nothing after headers");
    assert_eq!(stalled(&http, &base).await, 1);

    // The client goes away: the stalled body is dropped on the server too.
    drop(body);
    let mut open = 1;
    for _ in 0..50 {
        open = stalled(&http, &base).await;
        if open == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(open, 0, "a client that leaves frees its stalled request");

    // Not streamed: 200 and JSON headers, then no body.
    let r = tokio::time::timeout(Duration::from_secs(5), http.post(&url).json(&chat(false)).send())
        .await
        .expect("headers arrive")
        .expect("response");
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()[reqwest::header::CONTENT_TYPE], "application/json");
    assert!(r.headers().get(reqwest::header::CONTENT_LENGTH).is_none());
    let mut body = r.bytes_stream();
    assert!(tokio::time::timeout(Duration::from_millis(300), body.next()).await.is_err(), "no body");
    assert_eq!(stalled(&http, &base).await, 1);

    // Both stalls used: the next request is served normally.
    let after = faults(&http, &base, json!({})).await;
    assert_eq!(after["stallAfterHeaders"], 0);
    let r = http.post(&url).json(&chat(false)).send().await.expect("send");
    let v: Value = r.json().await.expect("a normal answer");
    assert_eq!(v["usage"]["completion_tokens"], 8);

    // Shutdown ends the still-open stalled body instead of waiting for it forever.
    tokio::time::timeout(Duration::from_secs(5), fleet.shutdown()).await.expect("shutdown does not hang");
    let end = tokio::time::timeout(Duration::from_secs(5), body.next()).await.expect("the body ends");
    assert!(!matches!(end, Some(Ok(_))), "no data, only the end: {end:?}");
}
