//! Request validation with vLLM's own errors, in vLLM's two layers:
//!
//! 1. The request model (pydantic, lax mode): `"5"` is a valid `max_tokens`, `"yes"` a valid
//!    `stream`, `2.5` is not an integer. A failure is a 400 whose `type` is `"Bad Request"`,
//!    whose `param` is the first failing location (`body.temperature`, `body.14` for malformed
//!    JSON at character 14, `body` for a body that is not an object) and whose message lists
//!    every error as `{'type': …, 'loc': …, 'msg': …, 'input': …}`.
//! 2. vLLM's parameter checks (`max_tokens` ≥ 1, `temperature` ≥ 0, `top_p` in (0, 1], a
//!    non-empty prompt, the context length): `"type": "BadRequestError"` with `param` set to
//!    the parameter and the message ending `(parameter=…, value=…)`.
//!
//! Invariant: everything a handler later reads with [`lax_int`], [`lax_float`] or
//! [`lax_bool`] has passed [`check_fields`], so those reads cannot fail on a field it covers.

use serde_json::{Map, Value};

/// One failed field check of layer 1.
#[derive(Debug, Clone, PartialEq)]
pub struct FieldError {
    /// Pydantic's error type, e.g. `float_parsing`.
    pub kind: &'static str,
    /// Location, e.g. `body.temperature`.
    pub loc: String,
    /// Pydantic's message.
    pub msg: &'static str,
    /// The offending input as vLLM prints it.
    pub input: String,
}

/// The message vLLM renders for a list of field errors.
pub fn message(errors: &[FieldError]) -> String {
    let mut out = format!("{} validation error{}:", errors.len(), if errors.len() == 1 { "" } else { "s" });
    for e in errors {
        out.push_str(&format!(
            "\n  {{'type': '{}', 'loc': '{}', 'msg': '{}', 'input': '{}'}}",
            e.kind, e.loc, e.msg, e.input
        ));
    }
    out
}

/// How vLLM prints an input value in a field error.
pub fn input_repr(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Object(o) => format!("<dict of {} items>", o.len()),
        Value::Array(a) => format!("<list of {} items>", a.len()),
        other => other.to_string(),
    }
}

type Failure = (&'static str, &'static str);

/// An integer in pydantic's lax mode: integers, integral floats, numeric strings, booleans.
pub fn lax_int(v: &Value) -> Result<i64, Failure> {
    const FRACTION: Failure =
        ("int_from_float", "Input should be a valid integer, got a number with a fractional part");
    match v {
        Value::Number(n) => match (n.as_i64(), n.as_f64()) {
            (Some(i), _) => Ok(i),
            (None, Some(f)) if f.fract() == 0.0 && f.abs() < 9.0e15 => Ok(f as i64),
            _ => Err(FRACTION),
        },
        Value::String(s) => s
            .trim()
            .parse::<i64>()
            .map_err(|_| ("int_parsing", "Input should be a valid integer, unable to parse string as an integer")),
        Value::Bool(b) => Ok(i64::from(*b)),
        _ => Err(("int_type", "Input should be a valid integer")),
    }
}

/// A float in pydantic's lax mode: numbers, numeric strings, booleans.
pub fn lax_float(v: &Value) -> Result<f64, Failure> {
    match v {
        Value::Number(n) => n.as_f64().ok_or(("float_type", "Input should be a valid number")),
        Value::String(s) => s
            .trim()
            .parse::<f64>()
            .map_err(|_| ("float_parsing", "Input should be a valid number, unable to parse string as a number")),
        Value::Bool(b) => Ok(f64::from(u8::from(*b))),
        _ => Err(("float_type", "Input should be a valid number")),
    }
}

/// A boolean in pydantic's lax mode: booleans, 0 and 1, and the usual words.
pub fn lax_bool(v: &Value) -> Result<bool, Failure> {
    const UNREADABLE: Failure = ("bool_parsing", "Input should be a valid boolean, unable to interpret input");
    match v {
        Value::Bool(b) => Ok(*b),
        Value::Number(n) => match n.as_f64() {
            Some(0.0) => Ok(false),
            Some(1.0) => Ok(true),
            _ => Err(UNREADABLE),
        },
        Value::String(s) => match s.to_ascii_lowercase().as_str() {
            "0" | "off" | "f" | "false" | "n" | "no" => Ok(false),
            "1" | "on" | "t" | "true" | "y" | "yes" => Ok(true),
            _ => Err(UNREADABLE),
        },
        _ => Err(("bool_type", "Input should be a valid boolean")),
    }
}

/// Which request model a body is checked against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Schema {
    /// `/v1/chat/completions` (and its render).
    Chat,
    /// `/v1/completions` (and its render).
    Completion,
}

const INT_FIELDS: &[&str] = &["max_tokens", "n", "seed", "top_k", "min_tokens", "priority"];
const FLOAT_FIELDS: &[&str] =
    &["temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty", "length_penalty"];
const BOOL_FIELDS: &[&str] = &[
    "stream",
    "ignore_eos",
    "add_special_tokens",
    "skip_special_tokens",
    "include_stop_str_in_output",
    "spaces_between_special_tokens",
];

/// Layer 1: the typed fields of the request model, in its field order.
pub fn check_fields(schema: Schema, body: &Map<String, Value>) -> Vec<FieldError> {
    let mut errors = Vec::new();
    let mut field = |name: &str, check: fn(&Value) -> Result<(), Failure>| {
        if let Some(v) = body.get(name).filter(|v| !v.is_null())
            && let Err((kind, msg)) = check(v)
        {
            errors.push(FieldError { kind, loc: format!("body.{name}"), msg, input: input_repr(v) });
        }
    };
    if schema == Schema::Chat {
        match body.get("messages") {
            None => {
                return vec![FieldError {
                    kind: "missing",
                    loc: "body.messages".into(),
                    msg: "Field required",
                    input: input_repr(&Value::Object(body.clone())),
                }];
            }
            Some(Value::Array(msgs)) => {
                for (i, m) in msgs.iter().enumerate() {
                    if m.get("role").is_none() {
                        // The first member of the message union, as pydantic reports it.
                        return vec![FieldError {
                            kind: "missing",
                            loc: format!("body.messages.{i}.ChatCompletionDeveloperMessageParam.role"),
                            msg: "Field required",
                            input: input_repr(m),
                        }];
                    }
                }
            }
            Some(other) => {
                return vec![FieldError {
                    kind: "list_type",
                    loc: "body.messages".into(),
                    msg: "Input should be a valid list",
                    input: input_repr(other),
                }];
            }
        }
        field("max_completion_tokens", |v| lax_int(v).map(drop));
        field("add_generation_prompt", |v| lax_bool(v).map(drop));
        field("continue_final_message", |v| lax_bool(v).map(drop));
        field("logprobs", |v| lax_bool(v).map(drop));
        field("top_logprobs", |v| lax_int(v).map(drop));
    } else {
        field("echo", |v| lax_bool(v).map(drop));
        field("logprobs", |v| lax_int(v).map(drop));
    }
    for name in INT_FIELDS {
        field(name, |v| lax_int(v).map(drop));
    }
    for name in FLOAT_FIELDS {
        field(name, |v| lax_float(v).map(drop));
    }
    for name in BOOL_FIELDS {
        field(name, |v| lax_bool(v).map(drop));
    }
    errors
}

/// The error for a body that is not valid JSON: pydantic's `json_invalid` at the character
/// position where Python's decoder stopped (its error names the same place serde's does, as a
/// 0-based offset; at the end of the input it is the input's length).
pub fn json_error(body: &[u8], e: &serde_json::Error) -> FieldError {
    let text = String::from_utf8_lossy(body);
    let pos = if e.classify() == serde_json::error::Category::Eof {
        text.chars().count()
    } else {
        let before: usize =
            text.split_inclusive('\n').take(e.line().saturating_sub(1)).map(|l| l.chars().count()).sum();
        before + e.column().saturating_sub(1)
    };
    FieldError {
        kind: "json_invalid",
        loc: format!("body.{pos}"),
        msg: "JSON decode error",
        input: "<dict of 0 items>".into(),
    }
}

/// The error for a body that is JSON but not an object.
pub fn not_an_object(v: &Value) -> FieldError {
    FieldError {
        kind: "model_attributes_type",
        loc: "body".into(),
        msg: "Input should be a valid dictionary or object to extract fields from",
        input: input_repr(v),
    }
}

/// A float as Python prints it (`-1.0`, `0.5`).
pub fn py_float(f: f64) -> String {
    if f.fract() == 0.0 && f.abs() < 1e16 { format!("{f:.1}") } else { format!("{f}") }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn body(v: Value) -> Map<String, Value> {
        v.as_object().cloned().unwrap_or_default()
    }

    #[test]
    fn lax_coercions_follow_pydantic() {
        assert_eq!(lax_int(&json!("5")), Ok(5));
        assert_eq!(lax_int(&json!(2.0)), Ok(2));
        assert_eq!(lax_int(&json!(true)), Ok(1));
        assert_eq!(lax_int(&json!(2.5)).map_err(|e| e.0), Err("int_from_float"));
        assert_eq!(lax_int(&json!("abc")).map_err(|e| e.0), Err("int_parsing"));
        assert_eq!(lax_float(&json!("0.5")), Ok(0.5));
        assert_eq!(lax_float(&json!("hot")).map_err(|e| e.0), Err("float_parsing"));
        assert_eq!(lax_bool(&json!("yes")), Ok(true));
        assert_eq!(lax_bool(&json!([1])).map_err(|e| e.0), Err("bool_type"));
    }

    #[test]
    fn field_errors_name_the_location() {
        let errs = check_fields(Schema::Chat, &body(json!({"model": "m"})));
        assert_eq!(errs[0].loc, "body.messages");
        assert_eq!(errs[0].kind, "missing");
        let errs = check_fields(Schema::Chat, &body(json!({"messages": [], "temperature": "hot", "stream": [1]})));
        let locs: Vec<_> = errs.iter().map(|e| e.loc.as_str()).collect();
        assert_eq!(locs, ["body.temperature", "body.stream"]);
        assert!(
            message(&errs).starts_with("2 validation errors:\n  {'type': 'float_parsing', 'loc': 'body.temperature'")
        );
        assert!(
            check_fields(Schema::Completion, &body(json!({"prompt": "x", "max_tokens": "5", "stream": "no"})))
                .is_empty()
        );
    }

    #[test]
    fn json_errors_point_where_python_does() {
        for (text, loc) in [(&b"{"[..], "body.1"), (br#"{"model": "x",, }"#, "body.14"), (b"{\n  \"a\": ,", "body.9")] {
            let e = serde_json::from_slice::<Value>(text).expect_err("malformed");
            assert_eq!(json_error(text, &e).loc, loc, "{}", String::from_utf8_lossy(text));
        }
        assert_eq!(py_float(-1.0), "-1.0");
        assert_eq!(py_float(0.25), "0.25");
    }
}
