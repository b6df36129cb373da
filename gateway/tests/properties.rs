//! Property tests (bounded fuzzing) of the dialect parsers and the upstream SSE relay: arbitrary
//! input never panics, errors name what is wrong, and valid input survives arbitrary chunking.

use bytes::Bytes;
use futures::StreamExt;
use proptest::prelude::*;
use serde_json::{Map, Value, json};
use switchyard_gateway::event::{Collected, Event};
use switchyard_gateway::upstream::sse_events;
use switchyard_gateway::{ErrorKind, anthropic, openai};

/// Arbitrary JSON values, nested a few levels.
fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        any::<f64>().prop_filter("finite", |f| f.is_finite()).prop_map(|f| json!(f)),
        ".{0,12}".prop_map(Value::String),
        prop_oneof![
            Just("user"),
            Just("assistant"),
            Just("system"),
            Just("tool"),
            Just("text"),
            Just("tool_use"),
            Just("tool_result"),
            Just("image"),
            Just("function"),
            Just("auto"),
            Just("any")
        ]
        .prop_map(|s| Value::String(s.to_owned())),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
            prop::collection::btree_map(
                prop_oneof![
                    Just("role"),
                    Just("content"),
                    Just("type"),
                    Just("text"),
                    Just("messages"),
                    Just("tools"),
                    Just("tool_calls"),
                    Just("function"),
                    Just("name"),
                    Just("input"),
                    Just("id"),
                    Just("tool_use_id"),
                    Just("max_tokens"),
                    Just("stream"),
                    Just("system"),
                    Just("source"),
                    Just("x")
                ]
                .prop_map(str::to_owned),
                inner,
                0..5
            )
            .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// A body that is mostly valid, with arbitrary values in its fields.
fn request_body() -> impl Strategy<Value = Map<String, Value>> {
    (json_value(), json_value(), json_value(), json_value(), any::<bool>()).prop_map(
        |(messages, tools, extra, max, valid_model)| {
            let mut m = Map::new();
            if valid_model {
                m.insert("model".into(), json!("m"));
            }
            m.insert("messages".into(), messages);
            m.insert("prompt".into(), extra.clone());
            m.insert("tools".into(), tools);
            m.insert("max_tokens".into(), max);
            m.insert("system".into(), extra);
            m
        },
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(3000))]

    #[test]
    fn dialect_parsers_never_panic_and_errors_are_invalid_requests(body in request_body()) {
        for result in [
            openai::parse(openai::Endpoint::Chat, body.clone()),
            openai::parse(openai::Endpoint::Completions, body.clone()),
            anthropic::parse(anthropic::Endpoint::Messages, "2023-06-01", body.clone()),
            anthropic::parse(anthropic::Endpoint::CountTokens, "2026-10-21", body.clone()),
        ] {
            match result {
                Ok(req) => {
                    // A parsed request always renders into an upstream body.
                    let up = openai::upstream_body(&req, "served");
                    prop_assert_eq!(up.get("model"), Some(&json!("served")));
                }
                Err(e) => {
                    prop_assert_eq!(e.kind, ErrorKind::InvalidRequest);
                    prop_assert!(!e.message.is_empty());
                }
            }
        }
    }

    #[test]
    fn arbitrary_bytes_through_the_sse_relay_never_panic(chunks in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..200), 0..12)) {
        let rt = tokio::runtime::Builder::new_current_thread().build().expect("runtime");
        rt.block_on(async {
            let body = futures::stream::iter(chunks.into_iter().map(|c| Ok::<_, reqwest::Error>(Bytes::from(c))));
            let events: Vec<_> = sse_events(body, 512).collect().await;
            // At most one event per input byte: nothing is invented.
            assert!(events.len() <= 12 * 200);
        });
    }

    #[test]
    fn a_valid_stream_gives_the_same_events_however_it_is_chunked(cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..20)) {
        let mut text = String::new();
        for i in 0..20 {
            text.push_str(&format!("data: {}\n\n", json!({"choices": [{"index": 0, "delta": {"content": format!("t{i} ")}, "finish_reason": null}]})));
        }
        text.push_str(&format!("data: {}\n\n", json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]})));
        text.push_str(&format!("data: {}\n\n", json!({"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 20}})));
        text.push_str("data: [DONE]\n\n");
        let bytes = text.into_bytes();
        let mut points: Vec<usize> = cuts.iter().map(|c| c.index(bytes.len())).collect();
        points.sort_unstable();
        points.dedup();
        let mut pieces = Vec::new();
        let mut start = 0;
        for p in points.into_iter().chain([bytes.len()]) {
            pieces.push(Bytes::copy_from_slice(&bytes[start..p]));
            start = p;
        }
        let rt = tokio::runtime::Builder::new_current_thread().build().expect("runtime");
        let collected = rt.block_on(async {
            let body = futures::stream::iter(pieces.into_iter().map(Ok::<_, reqwest::Error>));
            let mut c = Collected::default();
            let mut s = sse_events(body, 4096);
            while let Some(e) = s.next().await {
                c.push(e.expect("valid stream"));
            }
            c
        });
        let expected: String = (0..20).map(|i| format!("t{i} ")).collect();
        prop_assert_eq!(collected.text, expected);
        prop_assert_eq!(collected.usage.map(|u| u.completion_tokens), Some(20));
        prop_assert!(collected.finish.is_some());
    }
}

#[test]
fn deeply_nested_json_is_an_error_not_a_stack_overflow() {
    let deep = "[".repeat(100_000);
    assert!(serde_json::from_str::<Value>(&deep).is_err());
    let v: Value =
        json!({"model": "m", "messages": [{"role": "user", "content": [[[[[[[[[[{"type": "text"}]]]]]]]]]]}]});
    let e = openai::parse(openai::Endpoint::Chat, v.as_object().cloned().unwrap_or_default()).expect_err("invalid");
    assert_eq!(e.kind, ErrorKind::InvalidRequest);
    let _ = Event::Text(String::new());
}
