//! Structural validation of a resource against its CRD's `openAPIV3Schema`, and defaulting.
//!
//! This mirrors what the API server does before admission: unknown fields are rejected
//! (strict field validation), types, required fields, enums, ranges and lengths are checked,
//! and schema defaults are filled in so that CEL rules see the same object the API server's
//! rules would. `apiVersion`, `kind` and `metadata` at the root are handled by the loader.

use serde_json::{Map, Value};

use crate::yaml::{join_index, join_key};

/// What kind of schema violation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ViolationKind {
    /// A field the schema does not define.
    UnknownField,
    /// Wrong JSON type.
    WrongType,
    /// Required field missing.
    Missing,
    /// Enum, range or length violated.
    OutOfRange,
}

/// One schema violation at a field path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// Field path (`spec.steps[0].type`).
    pub path: String,
    /// Kind.
    pub kind: ViolationKind,
    /// Message, kubectl style.
    pub message: String,
}

const ROOT_FIELDS: [&str; 3] = ["apiVersion", "kind", "metadata"];

/// Validates `value` against `schema` and fills in defaults. Returns every violation.
pub fn check_and_default(schema: &Value, value: &mut Value) -> Vec<Violation> {
    let mut out = Vec::new();
    walk(schema, value, "", true, &mut out);
    out
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn type_ok(expected: &str, v: &Value) -> bool {
    match expected {
        "object" => v.is_object(),
        "array" => v.is_array(),
        "string" => v.is_string(),
        "boolean" => v.is_boolean(),
        "integer" => v.is_i64() || v.is_u64(),
        "number" => v.is_number(),
        _ => true,
    }
}

fn walk(schema: &Value, value: &mut Value, path: &str, root: bool, out: &mut Vec<Violation>) {
    let shown = |p: &str| if p.is_empty() { "<root>".to_owned() } else { p.to_owned() };
    if value.is_null() && schema.get("nullable").and_then(Value::as_bool) == Some(true) {
        return;
    }
    let int_or_string = schema.get("x-kubernetes-int-or-string").and_then(Value::as_bool) == Some(true);
    if let Some(expected) = schema.get("type").and_then(Value::as_str) {
        let ok = type_ok(expected, value) || (int_or_string && (value.is_string() || value.is_i64() || value.is_u64()));
        if !ok {
            out.push(Violation {
                path: path.to_owned(),
                kind: ViolationKind::WrongType,
                message: format!("{}: expected {expected}, found {}", shown(path), type_name(value)),
            });
            return;
        }
    }
    if let Some(allowed) = schema.get("enum").and_then(Value::as_array)
        && !allowed.contains(value)
    {
        let list: Vec<String> = allowed.iter().map(|v| v.to_string()).collect();
        out.push(Violation {
            path: path.to_owned(),
            kind: ViolationKind::OutOfRange,
            message: format!("{}: unsupported value {}; supported values: {}", shown(path), value, list.join(", ")),
        });
    }
    check_bounds(schema, value, path, out);
    match value {
        Value::Object(map) => walk_object(schema, map, path, root, out),
        Value::Array(items) => {
            if let Some(item_schema) = schema.get("items") {
                for (i, item) in items.iter_mut().enumerate() {
                    walk(item_schema, item, &join_index(path, i), false, out);
                }
            }
        }
        _ => {}
    }
}

fn walk_object(schema: &Value, map: &mut Map<String, Value>, path: &str, root: bool, out: &mut Vec<Violation>) {
    let preserve = schema.get("x-kubernetes-preserve-unknown-fields").and_then(Value::as_bool) == Some(true);
    let empty = Map::new();
    let props = schema.get("properties").and_then(Value::as_object).unwrap_or(&empty);
    let additional = schema.get("additionalProperties");

    // Defaults first, so required checks and CEL see the defaulted object.
    for (name, prop) in props {
        if !map.contains_key(name)
            && let Some(default) = prop.get("default")
        {
            map.insert(name.clone(), default.clone());
        }
    }
    if let Some(required) = schema.get("required").and_then(Value::as_array) {
        for name in required.iter().filter_map(Value::as_str) {
            if !map.contains_key(name) {
                out.push(Violation {
                    path: path.to_owned(),
                    kind: ViolationKind::Missing,
                    message: format!(
                        "{}: required field `{name}` is missing",
                        if path.is_empty() { "<root>" } else { path }
                    ),
                });
            }
        }
    }
    for (key, child) in map.iter_mut() {
        let child_path = join_key(path, key);
        if let Some(prop) = props.get(key) {
            walk(prop, child, &child_path, false, out);
        } else if root && ROOT_FIELDS.contains(&key.as_str()) {
            // Handled by the loader.
        } else if let Some(add) = additional.filter(|a| a.is_object()) {
            walk(add, child, &child_path, false, out);
        } else if preserve || additional.and_then(Value::as_bool) == Some(true) {
            // Free-form.
        } else {
            let known: Vec<&str> = props.keys().map(String::as_str).collect();
            let hint = closest(key, &known).map(|k| format!("; did you mean `{k}`?")).unwrap_or_default();
            out.push(Violation {
                path: child_path.clone(),
                kind: ViolationKind::UnknownField,
                message: format!("unknown field `{child_path}`{hint}"),
            });
        }
    }
}

fn check_bounds(schema: &Value, value: &Value, path: &str, out: &mut Vec<Violation>) {
    let num = |k: &str| schema.get(k).and_then(Value::as_f64);
    let count = |k: &str| schema.get(k).and_then(Value::as_u64);
    let mut fail =
        |message: String| out.push(Violation { path: path.to_owned(), kind: ViolationKind::OutOfRange, message });
    if let Some(x) = value.as_f64() {
        if let Some(min) = num("minimum")
            && x < min
        {
            fail(format!("{path}: {x} is below the minimum {min}"));
        }
        if let Some(max) = num("maximum")
            && x > max
        {
            fail(format!("{path}: {x} is above the maximum {max}"));
        }
    }
    if let Some(s) = value.as_str() {
        let len = s.chars().count() as u64;
        if let Some(min) = count("minLength")
            && len < min
        {
            fail(format!("{path}: must be at least {min} character(s) long"));
        }
        if let Some(max) = count("maxLength")
            && len > max
        {
            fail(format!("{path}: must be at most {max} characters long"));
        }
    }
    if let Some(items) = value.as_array() {
        let len = items.len() as u64;
        if let Some(min) = count("minItems")
            && len < min
        {
            fail(format!("{path}: must have at least {min} item(s)"));
        }
        if let Some(max) = count("maxItems")
            && len > max
        {
            fail(format!("{path}: must have at most {max} items"));
        }
    }
}

/// The known name closest to `key` by edit distance, if reasonably close.
pub fn closest<'a>(key: &str, known: &[&'a str]) -> Option<&'a str> {
    known
        .iter()
        .map(|k| (edit_distance(&key.to_ascii_lowercase(), &k.to_ascii_lowercase()), *k))
        .filter(|(d, k)| *d <= 2.max(k.len() / 3))
        .min()
        .map(|(_, k)| k)
}

fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1; b.len() + 1];
        for (j, cb) in b.iter().enumerate() {
            cur[j + 1] = (prev[j] + usize::from(ca != *cb)).min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        prev = cur;
    }
    prev[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn schema() -> Value {
        json!({"type": "object", "properties": {"spec": {"type": "object", "required": ["model"], "properties": {
            "model": {"type": "string", "minLength": 1},
            "size": {"type": "integer", "minimum": 1, "maximum": 100, "default": 16},
            "mode": {"type": "string", "enum": ["A", "B"]},
            "labels": {"type": "object", "additionalProperties": {"type": "string"}},
            "list": {"type": "array", "items": {"type": "object", "properties": {"n": {"type": "integer"}}}}
        }}}, "required": ["spec"]})
    }

    #[test]
    fn defaults_and_accepts_valid_objects() {
        let mut v = json!({"apiVersion": "x", "kind": "Y", "metadata": {"name": "a"}, "spec": {"model": "m", "labels": {"a": "b"}, "list": [{"n": 1}]}});
        assert!(check_and_default(&schema(), &mut v).is_empty());
        assert_eq!(v["spec"]["size"], 16);
    }

    #[test]
    fn reports_each_violation_at_its_path() {
        let mut v = json!({"spec": {"modle": "m", "size": 0, "mode": "C", "labels": {"a": 1}, "list": [{"n": "x"}]}});
        let got: Vec<(String, ViolationKind)> =
            check_and_default(&schema(), &mut v).into_iter().map(|v| (v.path, v.kind)).collect();
        let want = vec![
            ("spec".to_owned(), ViolationKind::Missing),
            ("spec.labels.a".to_owned(), ViolationKind::WrongType),
            ("spec.list[0].n".to_owned(), ViolationKind::WrongType),
            ("spec.mode".to_owned(), ViolationKind::OutOfRange),
            ("spec.modle".to_owned(), ViolationKind::UnknownField),
            ("spec.size".to_owned(), ViolationKind::OutOfRange),
        ];
        let mut got_sorted = got.clone();
        got_sorted.sort_by(|a, b| a.0.cmp(&b.0));
        assert_eq!(got_sorted, want);
    }

    #[test]
    fn suggests_close_names() {
        assert_eq!(closest("modle", &["model", "size"]), Some("model"));
        assert_eq!(closest("zzzzzz", &["model", "size"]), None);
    }
}
