//! Tool calling as `vllm serve --enable-auto-tool-choice --tool-call-parser …` answers it.
//!
//! **Request side.** `tools` and `tool_choice` are validated like vLLM's
//! `ChatCompletionRequest` (`check_tool_usage` and the pydantic field types), with vLLM's
//! messages; every failure is a 400. Messages go through vLLM's conversation parsing before the
//! chat template (`switchyard_tokenizer::conversation`, shared with the router): `content: null` becomes `""`, an assistant's `tool_calls`
//! keep their shape with `arguments` parsed from JSON text into objects (what tool-aware
//! templates expect), a tool message keeps `tool_call_id`, and other keys are dropped. `tools`
//! reach the template as pydantic dumps them ([`template_tools`]).
//!
//! **Output side.** With `tool_choice` naming a function, or `"required"`, vLLM forces the
//! output with structured outputs: the JSON schema of the named function's `parameters`, or an
//! array of `{"name", "parameters"}` objects for `"required"`. The simulator writes that JSON
//! ([`ForcedCall`]) deterministically from the schema and the prompt, in Python `json.dumps`
//! style (`", "` and `": "` separators, schema property order), and the engine then generates
//! exactly its tokens followed by the end-of-sequence token (see
//! [`crate::engine::Engine::add_request_with_output`]), so usage, KV blocks and timing all
//! describe the constrained text. With `"required"` the simulator calls one tool: the first
//! whose name appears in the last user message, else the first tool. With `tool_choice`
//! `"auto"` (or absent) the model answers in text, and with `"none"` it always does.
//!
//! Invariants: a forced output is complete JSON text valid for the schema's types (truncated
//! only by `max_tokens`); the concatenated streamed `arguments` of a call equal the
//! non-streamed `arguments`; `usage.completion_tokens` counts the JSON text's tokens plus the
//! end-of-sequence token.

use serde_json::{Map, Value, json};

use crate::engine::mix;

const NAMED_USAGE: &str = "Correct usage: `{\"type\": \"function\", \"function\": {\"name\": \"my_function\"}}`";

/// One function tool of a request.
#[derive(Debug, Clone, PartialEq)]
pub struct Tool {
    /// `function.name`.
    pub name: String,
    /// `function.parameters` (a JSON schema), if given.
    pub parameters: Option<Value>,
}

/// How the request wants tools used.
#[derive(Debug, Clone, PartialEq)]
pub enum ToolMode {
    /// Plain text generation (no tools, `"none"`, or `"auto"`).
    Text,
    /// `tool_choice: {"type": "function", "function": {"name": …}}`: index into the tools.
    Named(usize),
    /// `tool_choice: "required"` with at least one tool.
    Required,
}

/// The validated tool part of a chat request.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolRequest {
    /// The declared tools, in order.
    pub tools: Vec<Tool>,
    /// What to do with them.
    pub mode: ToolMode,
}

fn show(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

fn check_tools(raw: &Value) -> Result<Vec<Tool>, String> {
    let list = raw.as_array().ok_or("tools: Input should be a valid list")?;
    let mut tools = Vec::with_capacity(list.len());
    for (i, t) in list.iter().enumerate() {
        let t = t.as_object().ok_or_else(|| format!("tools.{i}: Input should be a valid dictionary or object"))?;
        match t.get("type") {
            None => {}
            Some(Value::String(s)) if s == "function" => {}
            Some(_) => return Err(format!("tools.{i}.type: Input should be 'function'")),
        }
        let f = match t.get("function") {
            None => return Err(format!("tools.{i}.function: Field required")),
            Some(Value::Object(f)) => f,
            Some(_) => return Err(format!("tools.{i}.function: Input should be a valid dictionary or object")),
        };
        let name = match f.get("name") {
            None => return Err(format!("tools.{i}.function.name: Field required")),
            Some(Value::String(s)) => s.clone(),
            Some(_) => return Err(format!("tools.{i}.function.name: Input should be a valid string")),
        };
        if !matches!(f.get("description"), None | Some(Value::Null | Value::String(_))) {
            return Err(format!("tools.{i}.function.description: Input should be a valid string"));
        }
        let parameters = match f.get("parameters") {
            None | Some(Value::Null) => None,
            Some(p @ Value::Object(_)) => Some(p.clone()),
            Some(_) => return Err(format!("tools.{i}.function.parameters: Input should be a valid dictionary")),
        };
        tools.push(Tool { name, parameters });
    }
    Ok(tools)
}

/// Validates the shape of `tools` alone (requests without `tool_choice`, like `/tokenize`).
pub fn validate_tools(body: &Map<String, Value>) -> Result<(), String> {
    body.get("tools").filter(|t| !t.is_null()).map(check_tools).transpose().map(drop)
}

/// Validates `tools` and `tool_choice` of a chat request; the error is the 400 message.
pub fn parse_request(body: &Map<String, Value>) -> Result<ToolRequest, String> {
    let raw_tools = body.get("tools").filter(|t| !t.is_null());
    let tools = raw_tools.map(check_tools).transpose()?;
    let choice = body.get("tool_choice").filter(|c| !c.is_null());
    let text = |tools: Option<Vec<Tool>>| Ok(ToolRequest { tools: tools.unwrap_or_default(), mode: ToolMode::Text });
    let Some(choice) = choice else { return text(tools) };
    if choice.as_str() == Some("none") {
        return text(tools);
    }
    let Some(tools) = tools else { return Err("When using `tool_choice`, `tools` must be set.".into()) };
    match choice {
        Value::String(s) if s == "auto" => text(Some(tools)),
        // vLLM (like OpenAI) treats "required" with an empty tool list as "none".
        Value::String(s) if s == "required" && tools.is_empty() => text(Some(tools)),
        Value::String(s) if s == "required" => Ok(ToolRequest { tools, mode: ToolMode::Required }),
        Value::Object(o) => {
            let function = o.get("function").unwrap_or(&Value::Null);
            let Some(f) = function.as_object() else {
                return Err(format!(
                    "Invalid value for `function`: `{}` in `tool_choice`! {NAMED_USAGE}",
                    if function.is_null() { "None".to_owned() } else { show(function) }
                ));
            };
            let Some(name) = f.get("name") else {
                return Err(format!("Expected field `name` in `function` in `tool_choice`! {NAMED_USAGE}"));
            };
            let name = match name.as_str() {
                Some(n) if !n.is_empty() => n,
                _ => {
                    return Err(format!(
                        "Invalid `name` in `function`: `{}` in `tool_choice`! {NAMED_USAGE}",
                        show(name)
                    ));
                }
            };
            let Some(index) = tools.iter().position(|t| t.name == name) else {
                return Err("The tool specified in `tool_choice` does not match any of the specified `tools`".into());
            };
            if !matches!(o.get("type"), None | Some(Value::String(_))) || o.get("type").is_some_and(|t| t != "function")
            {
                return Err("tool_choice.type: Input should be 'function'".into());
            }
            Ok(ToolRequest { tools, mode: ToolMode::Named(index) })
        }
        other => Err(format!(
            "Invalid value for `tool_choice`: {}! Only named tools, \"none\", \"auto\" or \"required\" are supported.",
            show(other)
        )),
    }
}

/// `tools` as vLLM hands them to the chat template: `tool.model_dump()` of each, so `type`,
/// `function.description` and `function.parameters` are always present (null when absent);
/// extra keys are kept after the declared ones.
pub fn template_tools(raw: Option<&Value>) -> Option<Value> {
    let list = raw?.as_array()?;
    Some(Value::Array(
        list.iter()
            .map(|t| {
                let empty = Map::new();
                let t = t.as_object().unwrap_or(&empty);
                let f = t.get("function").and_then(Value::as_object).unwrap_or(&empty);
                let mut function = Map::new();
                for key in ["name", "description", "parameters"] {
                    function.insert(key.into(), f.get(key).cloned().unwrap_or(Value::Null));
                }
                let extra: Vec<(String, Value)> =
                    f.iter().filter(|(k, _)| !function.contains_key(*k)).map(|(k, v)| (k.clone(), v.clone())).collect();
                function.extend(extra);
                let mut tool = Map::new();
                tool.insert("type".into(), json!("function"));
                tool.insert("function".into(), Value::Object(function));
                let extra: Vec<(String, Value)> =
                    t.iter().filter(|(k, _)| !tool.contains_key(*k)).map(|(k, v)| (k.clone(), v.clone())).collect();
                tool.extend(extra);
                Value::Object(tool)
            })
            .collect(),
    ))
}

/// Text of the last user message (tool selection under `"required"`).
fn last_user_text(messages: &[Value]) -> String {
    let Some(m) = messages.iter().rev().find(|m| m.get("role").and_then(Value::as_str) == Some("user")) else {
        return String::new();
    };
    match m.get("content") {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => parts
            .iter()
            .filter_map(|p| p.as_str().or_else(|| p.get("text").and_then(Value::as_str)))
            .collect::<Vec<_>>()
            .join("\n"),
        _ => String::new(),
    }
}

/// The constrained output of a forced tool call.
#[derive(Debug, Clone, PartialEq)]
pub struct ForcedCall {
    /// Called function.
    pub name: String,
    /// `arguments`: the JSON object text.
    pub arguments: String,
    /// What the model generates: `arguments` itself for a named function, or
    /// `[{"name": …, "parameters": …}]` for `"required"`.
    pub output: String,
    /// Whether this is a `"required"` call (array output, finish reason `tool_calls`).
    pub required: bool,
}

/// Writes the forced output of `req` (`None` for text mode). `seed` varies the values per
/// prompt; `word(k)` is the k-th pseudo-random word of the output vocabulary.
pub fn forced_call(
    req: &ToolRequest,
    messages: &[Value],
    seed: u64,
    word: &dyn Fn(u64) -> String,
) -> Option<ForcedCall> {
    let (tool, required) = match req.mode {
        ToolMode::Text => return None,
        ToolMode::Named(i) => (req.tools.get(i)?, false),
        ToolMode::Required => {
            let text = last_user_text(messages);
            let picked = req.tools.iter().find(|t| !t.name.is_empty() && text.contains(t.name.as_str()));
            (picked.or(req.tools.first())?, true)
        }
    };
    let empty = json!({"type": "object", "properties": {}});
    let schema = tool.parameters.as_ref().filter(|p| p.as_object().is_some_and(|o| !o.is_empty())).unwrap_or(&empty);
    let mut g = Gen { state: seed, word };
    let value = g.value(schema, schema, 0);
    // Structured outputs force an object for parameters; a non-object schema still gets one.
    let value = if value.is_object() { value } else { json!({}) };
    let arguments = python_json(&value);
    let output = if required {
        format!("[{{\"name\": {}, \"parameters\": {arguments}}}]", python_json(&json!(tool.name)))
    } else {
        arguments.clone()
    };
    Some(ForcedCall { name: tool.name.clone(), arguments, output, required })
}

/// JSON text as Python's `json.dumps(v, ensure_ascii=False)` writes it.
pub fn python_json(v: &Value) -> String {
    let mut out = String::new();
    write_python(v, &mut out);
    out
}

fn write_python(v: &Value, out: &mut String) {
    match v {
        Value::Object(o) => {
            out.push('{');
            for (i, (k, v)) in o.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                out.push_str(&Value::String(k.clone()).to_string());
                out.push_str(": ");
                write_python(v, out);
            }
            out.push('}');
        }
        Value::Array(a) => {
            out.push('[');
            for (i, v) in a.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_python(v, out);
            }
            out.push(']');
        }
        other => out.push_str(&other.to_string()),
    }
}

struct Gen<'a> {
    state: u64,
    word: &'a dyn Fn(u64) -> String,
}

const MAX_DEPTH: usize = 8;

impl Gen<'_> {
    fn next(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        mix(self.state)
    }

    fn words(&mut self, n: u64) -> String {
        (0..n).map(|_| (self.word)(self.next())).collect::<Vec<_>>().join(" ")
    }

    fn resolve<'s>(&self, root: &'s Value, schema: &'s Value) -> &'s Value {
        let Some(r) = schema.get("$ref").and_then(Value::as_str) else { return schema };
        r.strip_prefix('#').and_then(|p| root.pointer(p)).unwrap_or(&Value::Null)
    }

    fn value(&mut self, root: &Value, schema: &Value, depth: usize) -> Value {
        let schema = self.resolve(root, schema);
        if depth > MAX_DEPTH {
            return Value::Null;
        }
        let Some(s) = schema.as_object() else { return json!(self.words(1)) };
        if let Some(c) = s.get("const") {
            return c.clone();
        }
        if let Some(Value::Array(options)) = s.get("enum")
            && !options.is_empty()
        {
            let i = (self.next() % options.len() as u64) as usize;
            return options[i].clone();
        }
        for key in ["anyOf", "oneOf", "allOf"] {
            if let Some(Value::Array(alts)) = s.get(key) {
                let alt = alts.iter().find(|a| a.get("type").and_then(Value::as_str) != Some("null")).or(alts.first());
                if let Some(alt) = alt {
                    return self.value(root, alt, depth + 1);
                }
            }
        }
        let ty = match s.get("type") {
            Some(Value::String(t)) => t.as_str(),
            Some(Value::Array(ts)) => ts.iter().filter_map(Value::as_str).find(|t| *t != "null").unwrap_or("null"),
            _ if s.contains_key("properties") => "object",
            _ if s.contains_key("items") => "array",
            _ => "string",
        };
        match ty {
            "object" => {
                let mut out = Map::new();
                if let Some(Value::Object(props)) = s.get("properties") {
                    for (k, p) in props {
                        let v = self.value(root, p, depth + 1);
                        out.insert(k.clone(), v);
                    }
                }
                Value::Object(out)
            }
            "array" => {
                let min = s.get("minItems").and_then(Value::as_u64).unwrap_or(1).min(4);
                let max = s.get("maxItems").and_then(Value::as_u64).unwrap_or(2).max(min);
                let n = min + self.next() % (max - min + 1).min(3);
                let items = s.get("items").cloned().unwrap_or(json!({"type": "string"}));
                Value::Array((0..n).map(|_| self.value(root, &items, depth + 1)).collect())
            }
            "integer" => json!(self.integer(s)),
            "number" => {
                let whole = self.integer(s);
                let max = s.get("maximum").and_then(Value::as_f64);
                let tenths = (self.next() % 10) as i64;
                // One rounding from exact integers, so the text is the short decimal.
                let v = whole.saturating_mul(10).saturating_add(tenths) as f64 / 10.0;
                json!(if max.is_some_and(|m| v > m) { whole as f64 } else { v })
            }
            "boolean" => json!(self.next().is_multiple_of(2)),
            "null" => Value::Null,
            _ => json!(self.string(s)),
        }
    }

    fn integer(&mut self, s: &Map<String, Value>) -> i64 {
        let lo = s
            .get("minimum")
            .and_then(Value::as_f64)
            .map(|m| m.ceil())
            .or_else(|| s.get("exclusiveMinimum").and_then(Value::as_f64).map(|m| m.floor() + 1.0))
            .unwrap_or(0.0);
        let hi = s
            .get("maximum")
            .and_then(Value::as_f64)
            .map(|m| m.floor())
            .or_else(|| s.get("exclusiveMaximum").and_then(Value::as_f64).map(|m| m.ceil() - 1.0))
            .unwrap_or(lo + 99.0)
            .max(lo);
        let span = ((hi - lo).min(1e15) as u64).saturating_add(1);
        (lo.clamp(-1e15, 1e15) as i64).saturating_add((self.next() % span) as i64)
    }

    fn string(&mut self, s: &Map<String, Value>) -> String {
        let r = self.next();
        let mut text = match s.get("format").and_then(Value::as_str) {
            Some("date") => format!("2025-{:02}-{:02}", 1 + r % 12, 1 + (r >> 8) % 28),
            Some("date-time") => {
                format!("2025-{:02}-{:02}T{:02}:00:00Z", 1 + r % 12, 1 + (r >> 8) % 28, (r >> 16) % 24)
            }
            Some("time") => format!("{:02}:{:02}:00", r % 24, (r >> 8) % 60),
            Some("email") => format!("{}@example.com", self.words(1)),
            Some("uri" | "url") => format!("https://example.com/{}", self.words(1)),
            Some("uuid") => format!("{:08x}-0000-4000-8000-{:012x}", r as u32, (r >> 16) & 0xffff_ffff_ffff),
            _ => self.words(1 + r % 3),
        };
        let min = s.get("minLength").and_then(Value::as_u64).unwrap_or(0).min(256) as usize;
        while text.chars().count() < min {
            let w = self.words(1);
            text = if text.is_empty() { w } else { format!("{text} {w}") };
        }
        if let Some(max) = s.get("maxLength").and_then(Value::as_u64) {
            text = text.chars().take(max as usize).collect();
        }
        text
    }
}

/// Incremental state of one streamed forced call: turns each token's text into the
/// `delta.tool_calls` vLLM streams for it.
#[derive(Debug)]
pub struct ToolStream {
    id: String,
    name: String,
    required: bool,
    previous: String,
    name_returned: bool,
}

fn bracket_level(s: &str) -> i64 {
    s.chars().map(|c| i64::from(c == '{') - i64::from(c == '}')).sum()
}

/// vLLM's `_filter_delta_text`: drops what closes the outer `{"name", "parameters"}` object
/// (and anything after it at level 0) so only the parameters' text is streamed.
fn filter_delta(delta: &str, previous: &str) -> String {
    let mut level = bracket_level(previous);
    let mut out = String::new();
    for c in delta.chars() {
        match c {
            '{' => level += 1,
            '}' => level -= 1,
            _ => {}
        }
        if level != 0 {
            out.push(c);
        } else if c == ',' {
            break;
        }
    }
    out
}

impl ToolStream {
    /// A stream for `call`, whose tool call id is `id`.
    pub fn new(call: &ForcedCall, id: String) -> ToolStream {
        ToolStream {
            id,
            name: call.name.clone(),
            required: call.required,
            previous: String::new(),
            name_returned: false,
        }
    }

    /// The `delta` for the next piece of generated text, or `None` when vLLM sends no chunk
    /// for it (`"required"` before the parameters start, and the array's closing brackets).
    pub fn delta(&mut self, text: &str) -> Option<Value> {
        let previous = std::mem::take(&mut self.previous);
        let current = format!("{previous}{text}");
        let call = if !self.required {
            if self.name_returned {
                json!({"index": 0, "function": {"arguments": text}})
            } else {
                self.name_returned = true;
                json!({"id": self.id, "type": "function", "index": 0, "function": {"name": self.name, "arguments": text}})
            }
        } else if !self.name_returned {
            // The call appears once its parameters have started (partial JSON parsing sees a
            // `parameters` key); the first delta carries what is there of them so far.
            let started = current
                .rfind("\"parameters\":")
                .map(|p| current[p + "\"parameters\":".len()..].trim_start())
                .filter(|rest| !rest.is_empty());
            match started {
                Some(rest) => {
                    self.name_returned = true;
                    let arguments = filter_delta(rest, &previous);
                    json!({"id": self.id, "type": "function", "index": 0, "function": {"name": self.name, "arguments": arguments}})
                }
                None => {
                    self.previous = current;
                    return None;
                }
            }
        } else {
            let arguments = filter_delta(text, &previous);
            if arguments.is_empty() {
                self.previous = current;
                return None;
            }
            json!({"index": 0, "function": {"name": null, "arguments": arguments}})
        };
        self.previous = current;
        Some(json!({"tool_calls": [call]}))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn word(k: u64) -> String {
        ["alpha", "beta", "gamma", "delta"][(k % 4) as usize].to_owned()
    }

    fn body(v: Value) -> Map<String, Value> {
        v.as_object().cloned().unwrap_or_default()
    }

    #[test]
    fn python_style_json() {
        let v = json!({"a": "x", "b": [1, 2.5, true, null], "c": {}});
        assert_eq!(python_json(&v), r#"{"a": "x", "b": [1, 2.5, true, null], "c": {}}"#);
    }

    #[test]
    fn validation_messages_follow_vllm() {
        let tools = json!([{"type": "function", "function": {"name": "get_weather"}}]);
        let err = |b: Value| parse_request(&body(b)).expect_err("rejected");
        assert_eq!(err(json!({"tool_choice": "required"})), "When using `tool_choice`, `tools` must be set.");
        assert!(
            err(json!({"tools": tools, "tool_choice": "any"})).starts_with("Invalid value for `tool_choice`: any!")
        );
        assert_eq!(
            err(json!({"tools": tools, "tool_choice": {"type": "function", "function": {"name": "nope"}}})),
            "The tool specified in `tool_choice` does not match any of the specified `tools`"
        );
        assert!(
            err(json!({"tools": tools, "tool_choice": {"type": "function"}}))
                .starts_with("Invalid value for `function`")
        );
        assert!(err(json!({"tools": [{"type": "function"}]})).contains("tools.0.function"));
        assert!(err(json!({"tools": {"name": "x"}})).contains("valid list"));
        assert!(err(json!({"tools": [{"function": {"name": "x", "parameters": "{}"}}]})).contains("parameters"));
        let ok = |b: Value| parse_request(&body(b)).expect("accepted").mode;
        assert_eq!(ok(json!({"tools": tools})), ToolMode::Text);
        assert_eq!(ok(json!({"tools": tools, "tool_choice": "none"})), ToolMode::Text);
        assert_eq!(ok(json!({"tools": [], "tool_choice": "required"})), ToolMode::Text);
        assert_eq!(ok(json!({"tools": tools, "tool_choice": "required"})), ToolMode::Required);
        assert_eq!(
            ok(json!({"tools": tools, "tool_choice": {"function": {"name": "get_weather"}}})),
            ToolMode::Named(0)
        );
    }

    #[test]
    fn arguments_follow_the_schema() {
        let schema = json!({"type": "object", "properties": {
            "city": {"type": "string"}, "days": {"type": "integer", "minimum": 1, "maximum": 7},
            "unit": {"enum": ["c", "f"]}, "exact": {"type": "boolean"}, "temp": {"type": "number"},
            "tags": {"type": "array", "items": {"type": "string"}}, "at": {"$ref": "#/$defs/when"},
            "opt": {"type": ["null", "string"], "maxLength": 3}},
            "$defs": {"when": {"type": "string", "format": "date"}}});
        let req =
            ToolRequest { tools: vec![Tool { name: "f".into(), parameters: Some(schema) }], mode: ToolMode::Named(0) };
        let call = forced_call(&req, &[], 42, &word).expect("forced");
        let args: Value = serde_json::from_str(&call.arguments).expect("JSON");
        let keys: Vec<&str> = args.as_object().expect("object").keys().map(String::as_str).collect();
        assert_eq!(keys, ["city", "days", "unit", "exact", "temp", "tags", "at", "opt"]);
        assert!(args["city"].is_string() && args["exact"].is_boolean() && args["temp"].is_number());
        assert!((1..=7).contains(&args["days"].as_i64().expect("int")));
        assert!(args["unit"] == "c" || args["unit"] == "f");
        assert!(args["opt"].as_str().expect("string").len() <= 3);
        assert_eq!(call.output, call.arguments);
        assert_eq!(forced_call(&req, &[], 42, &word), Some(call), "deterministic");
    }

    #[test]
    fn required_picks_the_tool_the_user_names_and_streams_only_parameters() {
        let req = ToolRequest {
            tools: vec![
                Tool { name: "alpha_tool".into(), parameters: None },
                Tool { name: "lookup".into(), parameters: Some(json!({"properties": {"q": {"type": "string"}}})) },
            ],
            mode: ToolMode::Required,
        };
        let msgs = [json!({"role": "user", "content": "please lookup this"})];
        let call = forced_call(&req, &msgs, 1, &word).expect("forced");
        assert_eq!(call.name, "lookup");
        assert!(call.output.starts_with(r#"[{"name": "lookup", "parameters": {"q": "#), "{}", call.output);
        // Any split of the output into pieces streams exactly the arguments.
        for step in 1..6 {
            let mut s = ToolStream::new(&call, "chatcmpl-tool-1".into());
            let chars: Vec<char> = call.output.chars().collect();
            let mut args = String::new();
            let mut first = None;
            for piece in chars.chunks(step) {
                if let Some(d) = s.delta(&piece.iter().collect::<String>()) {
                    let c = &d["tool_calls"][0];
                    first.get_or_insert_with(|| c.clone());
                    args.push_str(c["function"]["arguments"].as_str().expect("arguments"));
                }
            }
            assert_eq!(args, call.arguments, "step {step}");
            let first = first.expect("a call was streamed");
            assert_eq!(first["id"], "chatcmpl-tool-1");
            assert_eq!(first["function"]["name"], "lookup");
        }
        let none = forced_call(&ToolRequest { mode: ToolMode::Required, ..req }, &[], 1, &word).expect("forced");
        assert_eq!(none.name, "alpha_tool");
        assert_eq!(none.arguments, "{}");
    }
}
