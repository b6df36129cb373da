//! The example fleet is valid, and each kind of mistake in a copy of it is reported at the
//! right file, line and column with the right code.

use std::fs;
use std::path::{Path, PathBuf};

use switchyard_config::{Checked, check_texts};

fn examples_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/policies")
}

/// Every YAML file of the examples as (relative name, text).
fn example_files() -> Vec<(String, String)> {
    let root = examples_dir();
    let mut out = Vec::new();
    let mut dirs = vec![root.clone()];
    while let Some(dir) = dirs.pop() {
        for entry in fs::read_dir(&dir).expect("examples dir") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "yaml") {
                let rel = path.strip_prefix(&root).expect("under root").display().to_string();
                out.push((rel, fs::read_to_string(&path).expect("read")));
            }
        }
    }
    out.sort();
    out
}

/// Checks the examples with `edit` applied to the file named `file`.
fn check_with(file: &str, edit: impl Fn(&str) -> String) -> Checked {
    let files: Vec<(String, String)> = example_files()
        .into_iter()
        .map(|(name, text)| {
            let text = if name == file { edit(&text) } else { text };
            (name, text)
        })
        .collect();
    assert!(files.iter().any(|(n, _)| n == file), "no example file {file}");
    check_texts(files.iter().map(|(n, t)| (n.as_str(), t.as_str())))
}

fn line_of(text: &str, needle: &str) -> u32 {
    text.lines()
        .position(|l| l.contains(needle))
        .map(|i| i as u32 + 1)
        .unwrap_or_else(|| panic!("`{needle}` not found"))
}

fn errors(c: &Checked) -> Vec<String> {
    c.diagnostics.iter().filter(|d| d.is_error()).map(|d| d.to_string()).collect()
}

#[test]
fn the_examples_are_valid_and_complete() {
    let c = check_with("gateway.yaml", str::to_owned);
    assert!(c.diagnostics.is_empty(), "{:#?}", c.diagnostics);
    assert_eq!(c.config.worker_sets.len(), 3);
    assert_eq!(c.config.providers.len(), 1);
    assert_eq!(c.config.pools.len(), 2);
    assert_eq!(c.config.aliases["standard-model"].targets, vec!["qwen3-32b", "qwen3-8b"]);
    let order: Vec<&str> = c.config.policies.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(
        order,
        ["pii-residency", "batch-idle-capacity", "complexity-downgrade", "standard-model-alias", "cloud-spillover"]
    );
    assert_eq!(c.config.worker_sets["qwen3-32b-east"].hourly_cost.to_string(), "1.85");
    assert_eq!(
        c.config.providers["bedrock-us-east"].models["llama-3-3-70b"].prices.input_per_million.to_string(),
        "0.72"
    );
}

#[test]
fn yaml_syntax_error_names_file_and_line() {
    let file = "policies/2-cloud-spillover.yaml";
    let c = check_with(file, |t| t.replace("maxWaitingRequests: 2", "maxWaitingRequests: [2"));
    let errs = errors(&c);
    assert_eq!(errs.len(), 1, "{errs:#?}");
    let d = &c.diagnostics[0];
    assert_eq!((d.file.as_str(), d.code), (file, "E001"));
    // The parser notices the unclosed `[` on the next key, one line later.
    let broken =
        line_of(&example_files().into_iter().find(|(n, _)| n == file).expect("file").1, "maxWaitingRequests: 2");
    assert!(d.line == broken || d.line == broken + 1, "{d}");
}

#[test]
fn unknown_field_names_file_line_and_suggests() {
    let file = "worker-sets.yaml";
    let c = check_with(file, |t| t.replacen("  kvBlockSize: 16\n", "  kvBlokSize: 16\n", 1));
    let errs = errors(&c);
    // One error: the refused worker set is not reported again as a dangling reference.
    assert_eq!(errs.len(), 1, "{errs:#?}");
    let text = example_files().into_iter().find(|(n, _)| n == file).expect("file").1;
    let expected = format!(
        "{file}:{}:3: error[E010]: InferenceWorkerSet: unknown field `spec.kvBlokSize`; did you mean `kvBlockSize`?",
        line_of(&text, "kvBlockSize")
    );
    assert_eq!(errs[0], expected);
}

#[test]
fn dangling_reference_names_file_and_line() {
    let file = "pools.yaml";
    let c = check_with(file, |t| t.replace("workerSet: qwen3-32b-west", "workerSet: qwen3-32b-wets"));
    let errs = errors(&c);
    let text = example_files().into_iter().find(|(n, _)| n == file).expect("file").1;
    let line = line_of(&text, "workerSet: qwen3-32b-west");
    assert_eq!(
        errs,
        vec![format!("{file}:{line}:16: error[E021]: InferenceWorkerSet `qwen3-32b-wets` does not exist")]
    );
    // The now-unpooled worker set is a warning, not an error.
    assert!(c.diagnostics.iter().any(|d| d.code == "W003" && d.message.contains("qwen3-32b-west")));
}

#[test]
fn pii_unsafe_policy_names_file_and_line() {
    // Without the residency policy, the spillover policy can send pii requests to Bedrock.
    let file = "policies/3-pii-residency.yaml";
    let c = check_with(file, |t| t.replace("tags: [pii]", "tags: [pii-legacy]"));
    let errs: Vec<_> = c.diagnostics.iter().filter(|d| d.code == "E030").collect();
    let files: Vec<&str> = errs.iter().map(|d| d.file.as_str()).collect();
    assert_eq!(
        files,
        [
            "policies/1-complexity-downgrade.yaml",
            "policies/2-cloud-spillover.yaml",
            "policies/5-standard-model-alias.yaml"
        ]
    );
    let spill = example_files().into_iter().find(|(n, _)| n == "policies/2-cloud-spillover.yaml").expect("file").1;
    assert_eq!(errs[1].line, line_of(&spill, "onEmpty: Fallback"));
    assert!(errs[1].message.contains("bedrock-us-east"));
}

#[test]
fn pii_policy_that_spills_over_is_itself_unsafe() {
    let file = "policies/3-pii-residency.yaml";
    let c = check_with(file, |t| {
        t.replace("onEmpty: Reject", "onEmpty: Fallback")
            .replace("  - type: ExcludeExternal\n", "  - type: MaxWaitingRequests\n    maxWaitingRequests: 8\n")
    });
    let errs: Vec<String> = c.diagnostics.iter().filter(|d| d.code == "E030").map(|d| d.file.clone()).collect();
    assert!(errs.contains(&file.to_owned()), "{:#?}", c.diagnostics);
}

#[test]
fn cel_rules_are_enforced_offline() {
    let file = "policies/2-cloud-spillover.yaml";
    // A MaxWaitingRequests step without its parameter violates the CRD's CEL rule.
    let c = check_with(file, |t| t.replace("    maxWaitingRequests: 2\n", ""));
    let errs = errors(&c);
    assert_eq!(errs.len(), 1, "{errs:#?}");
    assert!(errs[0].contains("error[E014]") && errs[0].contains("maxWaitingRequests is required"), "{}", errs[0]);
    let text = example_files().into_iter().find(|(n, _)| n == file).expect("file").1;
    assert!(errs[0].starts_with(&format!("{file}:{}:5:", line_of(&text, "type: MaxWaitingRequests"))), "{}", errs[0]);
}

#[test]
fn range_and_enum_violations() {
    let c = check_with("policies/4-batch-idle-capacity.yaml", |t| {
        t.replace("kvCacheUsageBelow: 70", "kvCacheUsageBelow: 170").replace("minimize: Cost", "minimize: Cheapest")
    });
    let codes: Vec<&str> = c.diagnostics.iter().map(|d| d.code).collect();
    assert_eq!(codes, ["E013", "E013"], "{:#?}", c.diagnostics);
}

#[test]
fn alias_cycles_duplicates_and_collisions() {
    let c = check_with("gateway.yaml", |t| {
        t.replace("    targets: [qwen3-32b, qwen3-8b]\n", "    targets: [qwen3-32b, loop]\n  - name: loop\n    targets: [standard-model]\n  - name: qwen3-8b\n    targets: [qwen3-32b]\n")
    });
    let codes: Vec<&str> = c.diagnostics.iter().filter(|d| d.is_error()).map(|d| d.code).collect();
    assert_eq!(codes, ["E022", "E023"], "{:#?}", c.diagnostics);
    // The compiled config never contains a cycle.
    assert!(switchyard_core::resolve::find_alias_cycle(&c.config).is_none());
}

#[test]
fn unreachable_policy_is_a_warning() {
    let c = check_with("policies/5-standard-model-alias.yaml", |t| t.replace("priority: 100", "priority: 300"));
    // complexity-downgrade (200) now sits behind standard-model-alias (300), which matches
    // everything it matches.
    let w: Vec<_> = c.diagnostics.iter().filter(|d| d.code == "W001").collect();
    assert_eq!(w.len(), 1, "{:#?}", c.diagnostics);
    assert_eq!(w[0].file, "policies/1-complexity-downgrade.yaml");
    assert_eq!(c.error_count(), 0);
}

#[test]
fn bad_money_and_duplicates() {
    let c = check_with("providers.yaml", |t| t.replace("inputPerMillion: \"0.72\"", "inputPerMillion: \"0.7200001\""));
    // The CRD pattern already refuses 7 decimals; no second error from the money parser.
    assert_eq!(c.diagnostics.iter().filter(|d| d.is_error()).count(), 1, "{:#?}", c.diagnostics);
    let c = check_with("worker-sets.yaml", |t| t.replace("name: east-1,", "name: east-0,"));
    let errs = errors(&c);
    assert_eq!(errs.len(), 1);
    assert!(errs[0].contains("E025") && errs[0].contains("duplicate worker name `east-0`"));
}

#[test]
fn foreign_documents_are_skipped_and_garbage_is_an_error() {
    let c = check_with("gateway.yaml", |t| {
        format!(
            "{t}---\napiVersion: v1\nkind: ConfigMap\nmetadata: {{name: x}}\n---\n- just a list\n---\napiVersion: switchyard.dev/v1alpha1\nkind: InferencePolicyy\nmetadata: {{name: y}}\n"
        )
    });
    let codes: Vec<&str> = c.diagnostics.iter().map(|d| d.code).collect();
    assert_eq!(codes, ["W004", "E002", "E003"], "{:#?}", c.diagnostics);
    assert!(c.diagnostics[2].message.contains("did you mean `InferencePolicy`"));
}
