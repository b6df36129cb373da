//! vLLM's conversation parsing, applied before the chat template by the engine and therefore
//! by every router that must compute the engine's tokens: `content: null` becomes `""`, an
//! assistant's `tool_calls` arguments are parsed from JSON text into objects (templates render
//! them as objects), `tool_call_id` is kept on tool messages, and other keys are dropped.
//! The function is idempotent, so applying it to an already parsed conversation changes nothing.

use serde_json::{Map, Value, json};

/// vLLM's conversation parsing ("string" content format) before the chat template: keeps
/// `role`, `content` (`null` → `""`; text parts are joined later by the tokenizer), `name`,
/// an assistant's `tool_calls` (with JSON-text `arguments` parsed into values, empty ones as
/// `{}`) and `reasoning`, and a tool message's `tool_call_id`. Invalid `arguments` JSON is a
/// 400, as in vLLM.
pub fn conversation(messages: &[Value]) -> Result<Vec<Value>, String> {
    messages
        .iter()
        .map(|m| {
            let role = m.get("role").and_then(Value::as_str).unwrap_or_default();
            let mut out = Map::new();
            out.insert("role".into(), json!(role));
            let content = match m.get("content") {
                None | Some(Value::Null) => json!(""),
                Some(c) => c.clone(),
            };
            out.insert("content".into(), content);
            match role {
                "assistant" => {
                    if let Some(calls) = m.get("tool_calls").filter(|c| !c.is_null()) {
                        let calls = calls.as_array().ok_or("`tool_calls` must be a list of tool calls")?;
                        out.insert(
                            "tool_calls".into(),
                            Value::Array(calls.iter().map(tool_call).collect::<Result<_, _>>()?),
                        );
                    }
                    if let Some(r) = m.get("reasoning").or_else(|| m.get("reasoning_content")).filter(|r| !r.is_null())
                    {
                        out.insert("reasoning".into(), r.clone());
                        out.insert("reasoning_content".into(), r.clone());
                    }
                }
                "tool" => {
                    if let Some(id) = m.get("tool_call_id") {
                        out.insert("tool_call_id".into(), id.clone());
                    }
                }
                _ => {}
            }
            if let Some(name) = m.get("name").filter(|n| n.is_string()) {
                out.insert("name".into(), name.clone());
            }
            Ok(Value::Object(out))
        })
        .collect()
}

fn tool_call(call: &Value) -> Result<Value, String> {
    let mut call = call.clone();
    let function =
        call.get_mut("function").and_then(Value::as_object_mut).ok_or("every tool call needs a `function` object")?;
    let parsed = match function.get("arguments") {
        Some(Value::String(s)) if !s.is_empty() => {
            serde_json::from_str(s).map_err(|e| format!("invalid JSON in tool call `arguments`: {e}"))?
        }
        Some(v @ (Value::Object(_) | Value::Array(_))) => v.clone(),
        _ => json!({}),
    };
    function.insert("arguments".into(), parsed);
    Ok(call)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conversation_normalizes_like_vllm() {
        let msgs = [
            json!({"role": "assistant", "content": null, "extra": 1,
                   "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{\"x\": 1}"}}]}),
            json!({"role": "tool", "tool_call_id": "c1", "content": "42"}),
        ];
        let conv = conversation(&msgs).expect("parses");
        assert_eq!(conv[0]["content"], "");
        assert!(conv[0].get("extra").is_none());
        assert_eq!(conv[0]["tool_calls"][0]["function"]["arguments"], json!({"x": 1}));
        assert_eq!(conv[1]["tool_call_id"], "c1");
        let bad = [json!({"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{"}}]})];
        assert!(conversation(&bad).is_err());
    }

    #[test]
    fn parsing_twice_changes_nothing() {
        let msgs = [json!({"role": "assistant", "content": null,
                           "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{\"x\": 1}"}}]})];
        let once = conversation(&msgs).expect("parses");
        assert_eq!(conversation(&once).expect("parses again"), once);
    }
}
