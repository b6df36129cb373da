//! CRD manifest rendering.
//!
//! Manifests are rendered as YAML with keys in the order serde emits them, so the output is
//! byte-stable across runs and the committed copies can be compared exactly.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::core::CustomResourceExt;
use serde_json::Value;

use crate::{GatewayBackend, InferencePolicy, InferencePool, InferenceProvider, InferenceWorkerSet};

/// One generated manifest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ManifestFile {
    /// File name under `crds/`, e.g. `inferencepolicies.switchyard.dev.yaml`.
    pub file_name: String,
    /// Kind it defines.
    pub kind: String,
    /// YAML text.
    pub yaml: String,
}

fn crds() -> Vec<CustomResourceDefinition> {
    vec![
        GatewayBackend::crd(),
        InferencePolicy::crd(),
        InferencePool::crd(),
        InferenceProvider::crd(),
        InferenceWorkerSet::crd(),
    ]
}

/// Every CRD, rendered.
pub fn render_all() -> Vec<ManifestFile> {
    crds()
        .into_iter()
        .map(|crd| {
            let file_name = format!("{}.yaml", crd.metadata.name.clone().unwrap_or_default());
            let kind = crd.spec.names.kind.clone();
            let value = serde_json::to_value(&crd).unwrap_or(Value::Null);
            ManifestFile { file_name, kind, yaml: to_yaml(&value) }
        })
        .collect()
}

/// The `openAPIV3Schema` of `kind`, as JSON.
pub fn crd_schema(kind: &str) -> Option<Value> {
    let crd = crds().into_iter().find(|c| c.spec.names.kind == kind)?;
    let schema = crd.spec.versions.first()?.schema.as_ref()?.open_api_v3_schema.as_ref()?;
    serde_json::to_value(schema).ok()
}

/// Renders a JSON value as block-style YAML (2-space indent, document start marker).
pub fn to_yaml(value: &Value) -> String {
    let mut out = String::from("---\n");
    emit(value, 0, &mut out, Context::Top);
    out
}

#[derive(Clone, Copy, PartialEq)]
enum Context {
    Top,
    MapValue,
    ListItem,
}

fn emit(value: &Value, indent: usize, out: &mut String, ctx: Context) {
    let pad = " ".repeat(indent);
    match value {
        Value::Object(map) if !map.is_empty() => {
            if ctx == Context::MapValue {
                out.push('\n');
            }
            for (i, (k, v)) in map.iter().enumerate() {
                if !(ctx == Context::ListItem && i == 0) {
                    out.push_str(&pad);
                }
                out.push_str(&scalar_string(k));
                out.push(':');
                emit(v, indent + 2, out, Context::MapValue);
            }
        }
        Value::Array(items) if !items.is_empty() => {
            if ctx == Context::MapValue {
                out.push('\n');
            }
            // Sequences under a mapping key are indented by the key's indent (compact style).
            let item_indent = if ctx == Context::MapValue { indent - 2 } else { indent };
            let item_pad = " ".repeat(item_indent);
            for (i, item) in items.iter().enumerate() {
                if !(ctx == Context::ListItem && i == 0) {
                    out.push_str(&item_pad);
                }
                out.push_str("- ");
                emit(item, item_indent + 2, out, Context::ListItem);
            }
        }
        other => {
            if ctx == Context::MapValue {
                out.push(' ');
            }
            out.push_str(&scalar(other));
            out.push('\n');
        }
    }
}

fn scalar(value: &Value) -> String {
    match value {
        Value::Null => "null".to_owned(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        Value::String(s) => scalar_string(s),
        Value::Object(_) => "{}".to_owned(),
        Value::Array(_) => "[]".to_owned(),
    }
}

/// Plain when unambiguous, otherwise a JSON (double-quoted) string, which YAML accepts.
fn scalar_string(s: &str) -> String {
    let plain_safe = !s.is_empty()
        && s.chars().all(|c| c.is_ascii_alphanumeric() || "-_./".contains(c))
        && !s.starts_with(['-', '.', '/'])
        && s.parse::<f64>().is_err()
        && !matches!(
            s.to_ascii_lowercase().as_str(),
            "true" | "false" | "yes" | "no" | "on" | "off" | "null" | "y" | "n" | "~"
        );
    if plain_safe { s.to_owned() } else { serde_json::to_string(s).unwrap_or_default() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn yaml_quotes_ambiguous_scalars() {
        let v = serde_json::json!({"a": "true", "b": "1.5", "c": "plain-text", "d": "has: colon", "e": [], "f": {"g": [1, {"h": null}]}});
        assert_eq!(
            to_yaml(&v),
            "---\na: \"true\"\nb: \"1.5\"\nc: plain-text\nd: \"has: colon\"\ne: []\nf:\n  g:\n  - 1\n  - h: null\n"
        );
    }
}
