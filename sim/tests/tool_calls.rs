//! Forced tool calls (`tool_choice` naming a function or `"required"`) come back shaped like
//! vLLM's structured-output tool calls, streamed and not, with usage counting the generated
//! JSON; malformed tools are 400s with vLLM's error body; tool-role conversations render.

use std::path::Path;

use serde_json::{Value, json};
use switchyard_sim::{Fleet, SimConfig};

fn config() -> SimConfig {
    SimConfig {
        time_scale: 0.1,
        seed: 5,
        ..SimConfig::loopback(Path::new(env!("CARGO_MANIFEST_DIR")).join("../tokenizer/files"))
    }
}

struct Sim {
    fleet: Fleet,
    base: String,
    http: reqwest::Client,
}

impl Sim {
    async fn start() -> Sim {
        let fleet = Fleet::start(config()).await.expect("fleet starts");
        let base = format!("http://{}", fleet.workers[0].http);
        Sim { fleet, base, http: reqwest::Client::new() }
    }

    async fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        let r = self.http.post(format!("{}{path}", self.base)).json(body).send().await.expect("request");
        let status = r.status().as_u16();
        (status, r.json().await.expect("JSON body"))
    }

    /// `data:` payloads of a streamed request, in order (`[DONE]` included).
    async fn stream(&self, body: &Value) -> Vec<String> {
        let r = self.http.post(format!("{}/v1/chat/completions", self.base)).json(body).send().await.expect("request");
        assert_eq!(r.status(), 200);
        let text = r.text().await.expect("whole body");
        text.split("\n\n").filter_map(|e| e.strip_prefix("data: ")).map(str::to_owned).collect()
    }

    async fn token_count(&self, text: &str) -> u64 {
        let (status, v) = self.post("/tokenize", &json!({"prompt": text, "add_special_tokens": false})).await;
        assert_eq!(status, 200);
        v["count"].as_u64().expect("count")
    }
}

fn weather_tools() -> Value {
    json!([
        {"type": "function", "function": {"name": "get_time", "description": "Current time", "parameters": {"type": "object", "properties": {}}}},
        {"type": "function", "function": {"name": "get_weather", "description": "Weather for a place", "parameters": {
            "type": "object",
            "properties": {
                "location": {"type": "string", "description": "City"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                "days": {"type": "integer", "minimum": 1, "maximum": 5},
                "detailed": {"type": "boolean"}
            },
            "required": ["location"]
        }}}
    ])
}

fn request(tool_choice: Value, stream: bool) -> Value {
    json!({
        "model": "sim-model",
        "messages": [{"role": "system", "content": "You can call tools."},
                     {"role": "user", "content": "What is the weather in Paris? Use get_weather."}],
        "tools": weather_tools(),
        "tool_choice": tool_choice,
        "stream": stream,
        "stream_options": if stream { json!({"include_usage": true}) } else { Value::Null },
    })
}

fn named() -> Value {
    json!({"type": "function", "function": {"name": "get_weather"}})
}

const PROPERTIES: [&str; 4] = ["location", "unit", "days", "detailed"];

fn assert_weather_arguments(arguments: &str) {
    let args: Value = serde_json::from_str(arguments).unwrap_or_else(|e| panic!("arguments {arguments:?}: {e}"));
    let keys: Vec<&str> = args.as_object().expect("an object").keys().map(String::as_str).collect();
    assert_eq!(keys, PROPERTIES, "{arguments}");
    assert!(args["location"].as_str().is_some_and(|s| !s.is_empty()));
    assert!(args["unit"] == "celsius" || args["unit"] == "fahrenheit");
    assert!((1..=5).contains(&args["days"].as_i64().expect("integer")));
    assert!(args["detailed"].is_boolean());
}

fn assert_call_id(id: &Value) {
    let id = id.as_str().expect("string id");
    let hex = id.strip_prefix("chatcmpl-tool-").unwrap_or_else(|| panic!("vLLM-style id: {id}"));
    assert!(hex.len() == 32 && hex.chars().all(|c| c.is_ascii_hexdigit()), "{id}");
}

#[tokio::test]
async fn named_and_required_tool_calls_non_streamed() {
    let sim = Sim::start().await;

    let (status, v) = sim.post("/v1/chat/completions", &request(named(), false)).await;
    assert_eq!(status, 200, "{v}");
    let choice = &v["choices"][0];
    assert_eq!(choice["finish_reason"], "stop", "named tool choice finishes like vLLM: stop");
    let message = &choice["message"];
    assert_eq!(message["role"], "assistant");
    assert_eq!(message["content"], "");
    let calls = message["tool_calls"].as_array().expect("tool_calls");
    assert_eq!(calls.len(), 1);
    assert_call_id(&calls[0]["id"]);
    assert_eq!(calls[0]["type"], "function");
    assert_eq!(calls[0]["function"]["name"], "get_weather");
    let arguments = calls[0]["function"]["arguments"].as_str().expect("arguments string");
    assert_weather_arguments(arguments);
    // The engine generated the arguments' tokens and the end-of-sequence token.
    let usage = &v["usage"];
    assert_eq!(usage["completion_tokens"].as_u64(), Some(sim.token_count(arguments).await + 1), "{usage}");
    assert_eq!(
        usage["total_tokens"].as_u64(),
        Some(usage["prompt_tokens"].as_u64().expect("prompt") + usage["completion_tokens"].as_u64().expect("compl"))
    );

    // Same prompt, same arguments (outputs are deterministic per prompt).
    let (_, again) = sim.post("/v1/chat/completions", &request(named(), false)).await;
    assert_eq!(again["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"], arguments);
    assert_ne!(again["choices"][0]["message"]["tool_calls"][0]["id"], calls[0]["id"]);

    // "required": the model emits [{"name", "parameters"}]; the user named get_weather.
    let (status, v) = sim.post("/v1/chat/completions", &request(json!("required"), false)).await;
    assert_eq!(status, 200, "{v}");
    let choice = &v["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls");
    assert_eq!(choice["message"]["content"], "");
    let call = &choice["message"]["tool_calls"][0];
    assert_call_id(&call["id"]);
    assert_eq!(call["function"]["name"], "get_weather");
    let arguments = call["function"]["arguments"].as_str().expect("arguments");
    assert_weather_arguments(arguments);
    let generated = format!("[{{\"name\": \"get_weather\", \"parameters\": {arguments}}}]");
    assert_eq!(v["usage"]["completion_tokens"].as_u64(), Some(sim.token_count(&generated).await + 1));

    // A tool without parameters gets "{}".
    let mut body = request(json!({"type": "function", "function": {"name": "get_time"}}), false);
    body["messages"][1]["content"] = json!("What time is it?");
    let (_, v) = sim.post("/v1/chat/completions", &body).await;
    assert_eq!(v["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"], "{}");

    // "auto" (and no tool_choice): the model answers in text.
    for choice in [json!("auto"), Value::Null] {
        let (status, v) = sim.post("/v1/chat/completions", &request(choice, false)).await;
        assert_eq!(status, 200);
        assert_eq!(v["choices"][0]["message"]["tool_calls"], json!([]));
        assert!(v["choices"][0]["message"]["content"].as_str().is_some_and(|c| !c.is_empty()));
        assert_eq!(v["choices"][0]["finish_reason"], "stop");
    }
    sim.fleet.shutdown().await;
}

#[tokio::test]
async fn max_tokens_cuts_a_forced_call_short() {
    let sim = Sim::start().await;
    let (_, full) = sim.post("/v1/chat/completions", &request(named(), false)).await;
    let full_args = full["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"].as_str().expect("args");

    let mut body = request(named(), false);
    body["max_tokens"] = json!(3);
    let (status, v) = sim.post("/v1/chat/completions", &body).await;
    assert_eq!(status, 200);
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    assert_eq!(v["usage"]["completion_tokens"], 3);
    let cut = v["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"].as_str().expect("args");
    assert!(full_args.starts_with(cut) && cut.len() < full_args.len(), "{cut:?} vs {full_args:?}");

    // Exactly the JSON's tokens but no room for the end of sequence: still cut by the limit.
    let json_tokens = sim.token_count(full_args).await;
    body["max_tokens"] = json!(json_tokens);
    let (_, v) = sim.post("/v1/chat/completions", &body).await;
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    assert_eq!(v["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"], full_args);

    // A cut "required" array does not parse: no calls.
    let mut body = request(json!("required"), false);
    body["max_tokens"] = json!(4);
    let (_, v) = sim.post("/v1/chat/completions", &body).await;
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    assert_eq!(v["choices"][0]["message"]["tool_calls"], json!([]));
    assert_eq!(v["usage"]["completion_tokens"], 4);

    // Streamed, the cut "required" call still streams what there is of it.
    let mut body = request(json!("required"), true);
    body["max_tokens"] = json!(12);
    let events = sim.stream(&body).await;
    let last = events.iter().rev().find(|e| e.contains("finish_reason\":\"")).expect("finish chunk");
    assert!(last.contains("\"finish_reason\":\"length\""), "{last}");
    sim.fleet.shutdown().await;
}

/// (first tool-call delta, concatenated arguments, finish reason, usage, role chunk seen)
fn collect_stream(events: &[String]) -> (Value, String, String, Value) {
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    let chunks: Vec<Value> =
        events[..events.len() - 1].iter().map(|e| serde_json::from_str(e).expect("chunk JSON")).collect();
    assert_eq!(chunks[0]["choices"][0]["delta"], json!({"role": "assistant", "content": ""}));
    let mut first = None;
    let mut arguments = String::new();
    let mut finish = String::new();
    let mut usage = Value::Null;
    for c in &chunks[1..] {
        assert_eq!(c["object"], "chat.completion.chunk");
        if let Some(u) = c.get("usage") {
            usage = u.clone();
        }
        let Some(choice) = c["choices"].get(0) else { continue };
        let delta = &choice["delta"];
        assert!(delta.get("content").is_none(), "no content in tool deltas: {delta}");
        if let Some(calls) = delta.get("tool_calls") {
            let call = &calls[0];
            assert_eq!(call["index"], 0);
            if first.is_none() {
                first = Some(call.clone());
            } else {
                assert!(call.get("id").is_none() && call.get("type").is_none(), "{call}");
            }
            arguments.push_str(call["function"]["arguments"].as_str().expect("arguments fragment"));
        }
        if let Some(f) = choice["finish_reason"].as_str() {
            finish = f.to_owned();
        }
    }
    (first.expect("a tool call was streamed"), arguments, finish, usage)
}

#[tokio::test]
async fn tool_calls_stream_as_vllm_deltas() {
    let sim = Sim::start().await;
    for (choice, finish) in [(named(), "stop"), (json!("required"), "tool_calls")] {
        let (_, whole) = sim.post("/v1/chat/completions", &request(choice.clone(), false)).await;
        let want = whole["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"].as_str().expect("args");

        let events = sim.stream(&request(choice.clone(), true)).await;
        let (first, arguments, got_finish, usage) = collect_stream(&events);
        assert_call_id(&first["id"]);
        assert_eq!(first["type"], "function");
        assert_eq!(first["function"]["name"], "get_weather");
        assert_eq!(arguments, want, "streamed arguments join to the non-streamed ones ({choice})");
        assert_weather_arguments(&arguments);
        assert_eq!(got_finish, finish);
        assert_eq!(usage["completion_tokens"], whole["usage"]["completion_tokens"], "{choice}");
    }
    sim.fleet.shutdown().await;
}

#[tokio::test]
async fn malformed_tools_are_rejected_like_vllm() {
    let sim = Sim::start().await;
    let cases = [
        (json!({"tools": {"type": "function"}}), "tools"),
        (json!({"tools": [{"type": "function"}]}), "function"),
        (json!({"tools": [{"type": "function", "function": {"description": "no name"}}]}), "name"),
        (json!({"tools": [{"type": "retrieval", "function": {"name": "x"}}]}), "type"),
        (json!({"tools": [{"function": {"name": "x", "parameters": "{}"}}]}), "parameters"),
        (json!({"tool_choice": "required"}), "When using `tool_choice`, `tools` must be set."),
        (json!({"tools": weather_tools(), "tool_choice": "any"}), "Invalid value for `tool_choice`"),
        (
            json!({"tools": weather_tools(), "tool_choice": {"type": "function", "function": {"name": "get_stock"}}}),
            "The tool specified in `tool_choice` does not match any of the specified `tools`",
        ),
        (json!({"tools": weather_tools(), "tool_choice": {"type": "function"}}), "Invalid value for `function`"),
    ];
    for (extra, needle) in cases {
        let mut body = json!({"model": "sim-model", "messages": [{"role": "user", "content": "hi"}]});
        for (k, v) in extra.as_object().expect("object") {
            body[k] = v.clone();
        }
        for path in ["/v1/chat/completions", "/v1/chat/completions/render"] {
            let (status, v) = sim.post(path, &body).await;
            assert_eq!(status, 400, "{path} {body}: {v}");
            let err = &v["error"];
            assert_eq!(err["type"], "BadRequestError");
            assert_eq!(err["code"], 400);
            assert!(err["message"].as_str().is_some_and(|m| m.contains(needle)), "{needle:?} in {err}");
        }
        // `/tokenize` checks the shape of `tools` too (it has no `tool_choice`).
        if extra.get("tool_choice").is_none() {
            let (status, v) = sim.post("/tokenize", &body).await;
            assert_eq!(status, 400, "/tokenize {body}: {v}");
        }
    }
    // "required" with an empty tool list behaves as "none".
    let body = json!({"model": "sim-model", "messages": [{"role": "user", "content": "hi"}], "tools": [],
                      "tool_choice": "required", "max_tokens": 3});
    let (status, v) = sim.post("/v1/chat/completions", &body).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["choices"][0]["message"]["tool_calls"], json!([]));
    sim.fleet.shutdown().await;
}

#[tokio::test]
async fn tool_turns_render_through_the_chat_template() {
    let sim = Sim::start().await;
    let history = json!([
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": null, "tool_calls": [
            {"id": "chatcmpl-tool-1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"location\": \"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "chatcmpl-tool-1", "content": "18 degrees, sunny"},
        {"role": "tool", "tool_call_id": "chatcmpl-tool-2", "content": [{"type": "text", "text": "part one"}, {"type": "text", "text": "part two"}]},
    ]);
    let (status, v) = sim.post("/tokenize", &json!({"messages": history})).await;
    assert_eq!(status, 200, "{v}");
    // The shipped ChatML template renders role and content only; vLLM passes a null
    // assistant content as "" and joins text parts with newlines.
    let plain = json!([
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": ""},
        {"role": "tool", "content": "18 degrees, sunny"},
        {"role": "tool", "content": "part one\npart two"},
    ]);
    let (_, want) = sim.post("/tokenize", &json!({"messages": plain})).await;
    assert_eq!(v["tokens"], want["tokens"]);
    let (_, text) = sim.post("/detokenize", &json!({"tokens": v["tokens"]})).await;
    assert!(
        text["prompt"].as_str().is_some_and(|p| p.contains(
            "<|im_start|>assistant\n<|im_end|>\n<|im_start|>tool\n18 degrees, sunny<|im_end|>\n<|im_start|>tool\npart one\npart two<|im_end|>\n<|im_start|>assistant\n"
        )),
        "{text}"
    );

    let mut body = json!({"model": "sim-model", "messages": history, "tools": weather_tools(), "max_tokens": 4});
    let (status, v) = sim.post("/v1/chat/completions", &body).await;
    assert_eq!(status, 200, "{v}");
    let (status, r) = sim.post("/v1/chat/completions/render", &body).await;
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["token_ids"].as_array().map(Vec::len), v["usage"]["prompt_tokens"].as_u64().map(|n| n as usize));

    // Arguments that are not JSON are a 400, as in vLLM (it parses them for the template).
    body["messages"][1]["tool_calls"][0]["function"]["arguments"] = json!("{not json");
    let (status, v) = sim.post("/v1/chat/completions", &body).await;
    assert_eq!(status, 400, "{v}");
    sim.fleet.shutdown().await;
}
