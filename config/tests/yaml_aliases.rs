//! Aliases through the whole loader: an ordinary aliased resource compiles, and a
//! "billion laughs" file is one E001 diagnostic at the offending alias, found in milliseconds.

use std::time::{Duration, Instant};

use switchyard_config::check_texts;
use switchyard_config::yaml::MAX_ALIAS_EXPANSION_NODES;

/// A worker set that reuses its labels and a rate through anchors.
const ALIASED: &str = "\
apiVersion: switchyard.dev/v1alpha1
kind: InferenceWorkerSet
metadata:
  name: aliased
  namespace: switchyard
  labels: &labels {team: inference, tier: gold}
spec:
  model: Qwen/Qwen3-8B
  cluster: gpu-east
  region: us-east-1
  labels: *labels
  endpoints:
    static:
    - {name: a-0, host: a-0.vllm.svc.cluster.local}
  kvBlockSize: 16
  capacity:
    prefillTokensPerSecond: &rate 4000
    decodeTokensPerSecond: *rate
  cost:
    gpuHourlyUsd: \"0.80\"
";

#[test]
fn an_ordinary_aliased_config_loads() {
    let c = check_texts([("aliased.yaml", ALIASED)]);
    let errors: Vec<String> = c.diagnostics.iter().filter(|d| d.is_error()).map(|d| d.to_string()).collect();
    assert!(errors.is_empty(), "{errors:#?}");
    let ws = &c.config.worker_sets["aliased"];
    assert_eq!(ws.decode_tokens_per_sec, 4000.0, "the value behind `*rate`");
}

#[test]
fn billion_laughs_is_one_diagnostic_at_the_alias() {
    let mut text = format!("{ALIASED}---\nlol0: &l0 [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]\n");
    for level in 1..=9 {
        let items = vec![format!("*l{}", level - 1); 10].join(", ");
        text.push_str(&format!("lol{level}: &l{level} [{items}]\n"));
    }
    let started = Instant::now();
    let c = check_texts([("bomb.yaml", text.as_str())]);
    assert!(started.elapsed() < Duration::from_secs(2), "took {:?}", started.elapsed());
    let errors: Vec<String> = c.diagnostics.iter().filter(|d| d.is_error()).map(|d| d.to_string()).collect();
    // The 7th alias of the bomb's fifth level (`lol4`) crosses the limit (the arithmetic is
    // in `yaml::tests`; the first document's 12 copied nodes do not change it), and the
    // first document is unaffected.
    let line = text.lines().position(|l| l.starts_with("lol4:")).expect("lol4") + 1;
    let col = text.lines().nth(line - 1).and_then(|l| l.match_indices("*l3").nth(6)).expect("7th alias").0 + 1;
    assert_eq!(
        errors,
        vec![format!("bomb.yaml:{line}:{col}: error[E001]: alias expansion exceeds {MAX_ALIAS_EXPANSION_NODES} nodes")]
    );
    assert!(c.config.worker_sets.contains_key("aliased"));
}
