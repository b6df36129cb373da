//! The `switchyard` binary end to end: exit codes, diagnostics and golden explain output.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn switchyard(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_switchyard")).args(args).current_dir(repo()).output().expect("run switchyard")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// A fresh copy of `examples/policies` with `edit` applied to one file.
fn broken_copy(name: &str, file: &str, edit: impl Fn(&str) -> String) -> PathBuf {
    let dst = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("cli-{name}"));
    let _ = fs::remove_dir_all(&dst);
    let src = repo().join("examples/policies");
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        fs::create_dir_all(dst.join(&rel)).expect("mkdir");
        for entry in fs::read_dir(src.join(&rel)).expect("read dir") {
            let entry = entry.expect("entry");
            let rel_child = rel.join(entry.file_name());
            if entry.path().is_dir() {
                stack.push(rel_child);
            } else {
                let text = fs::read_to_string(entry.path()).expect("read");
                let text = if rel_child == Path::new(file) { edit(&text) } else { text };
                fs::write(dst.join(&rel_child), text).expect("write");
            }
        }
    }
    dst
}

#[test]
fn validate_accepts_the_examples() {
    let o = switchyard(&["validate", "examples/policies"]);
    assert_eq!(o.status.code(), Some(0), "{}", stdout(&o));
    assert_eq!(stdout(&o), "valid: 0 errors, 0 warnings in 9 files (12 resources)\n");
}

#[test]
fn validate_rejects_each_kind_of_mistake_with_file_and_line() {
    type Edit = fn(&str) -> String;
    let cases: [(&str, &str, Edit, &str); 4] = [
        (
            "syntax",
            "policies/2-cloud-spillover.yaml",
            |t| t.replace("maxWaitingRequests: 2", "maxWaitingRequests: [2"),
            "policies/2-cloud-spillover.yaml:16:11: error[E001]",
        ),
        (
            "unknown-field",
            "providers.yaml",
            |t| t.replace("  expectedTTFTMs: 900", "  expectedTTFT: 900"),
            "providers.yaml:15:3: error[E010]",
        ),
        (
            "dangling",
            "gateway.yaml",
            |t| t.replace("pool: qwen3-8b}", "pool: qwen3-8b-pool}"),
            "gateway.yaml:12:28: error[E021]",
        ),
        (
            "pii-unsafe",
            "policies/3-pii-residency.yaml",
            |t| t.replace("tags: [pii]", "tenants: [hr]"),
            "policies/2-cloud-spillover.yaml:17:12: error[E030]",
        ),
    ];
    for (name, file, edit, expected) in cases {
        let dir = broken_copy(name, file, edit);
        let o = switchyard(&["validate", dir.to_str().expect("utf-8 path")]);
        let out = stdout(&o);
        assert_eq!(o.status.code(), Some(1), "{name}: {out}");
        let want = format!("{}/{expected}", dir.display());
        assert!(
            out.lines().any(|l| l.starts_with(&want)),
            "{name}: expected a line starting with\n{want}\ngot:\n{out}"
        );
    }
}

#[test]
fn validate_json_and_usage_errors() {
    let o = switchyard(&["validate", "--format", "json", "examples/policies"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json output");
    assert_eq!(v["valid"], true);
    assert_eq!(v["resources"], 12);
    assert_eq!(switchyard(&["validate", "no/such/dir"]).status.code(), Some(2));
    assert_eq!(switchyard(&["validate"]).status.code(), Some(2));
    assert_eq!(switchyard(&["validate", "--format", "xml", "examples"]).status.code(), Some(2));
}

#[test]
fn crds_prints_the_committed_manifests() {
    let o = switchyard(&["crds"]);
    assert_eq!(o.status.code(), Some(0));
    let mut committed = String::new();
    for m in switchyard_crds::render_all() {
        committed.push_str(&fs::read_to_string(repo().join("crds").join(&m.file_name)).expect("committed manifest"));
    }
    assert_eq!(stdout(&o), committed);
}

/// `explain` for each example scenario, pinned by golden files. Regenerate with
/// `UPDATE_GOLDEN=1 cargo test -p switchyard-cli --test cli`.
#[test]
fn explain_matches_golden_files() {
    let scenarios_dir = repo().join("examples/explain");
    let mut scenarios: Vec<String> = fs::read_dir(&scenarios_dir)
        .expect("examples/explain")
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .collect();
    scenarios.sort();
    assert_eq!(scenarios.len(), 6);
    let golden = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden");
    let update = std::env::var_os("UPDATE_GOLDEN").is_some();
    let mut mismatches = Vec::new();
    for s in &scenarios {
        for (format, ext) in [("text", "txt"), ("json", "json")] {
            let request = format!("examples/explain/{s}/request.json");
            let state = format!("examples/explain/{s}/state.yaml");
            let o = switchyard(&[
                "explain",
                "--config",
                "examples/policies",
                "--request",
                &request,
                "--state",
                &state,
                "--format",
                format,
            ]);
            assert_eq!(o.status.code(), Some(0), "{s}: {}", String::from_utf8_lossy(&o.stderr));
            let path = golden.join(format!("{s}.{ext}"));
            if update {
                fs::write(&path, &o.stdout).expect("write golden");
            } else if fs::read(&path).ok().as_deref() != Some(o.stdout.as_slice()) {
                mismatches.push(format!("{}:\n{}", path.display(), stdout(&o)));
            }
        }
    }
    assert!(mismatches.is_empty(), "explain output differs from golden files:\n{}", mismatches.join("\n"));
}

/// The expected choice of each scenario, stated independently of the golden files.
#[test]
fn explain_makes_the_expected_choices() {
    let expected = [
        ("complexity-downgrade", "ROUTE to worker qwen3-8b-east/small-0"),
        ("complexity-downgrade-cached", "ROUTE to worker qwen3-32b-east/east-2"),
        ("cloud-spillover", "ROUTE to provider bedrock-us-east/llama-3-3-70b"),
        ("pii-residency", "REJECT (noLocalCapacity)"),
        ("batch-idle-capacity", "ROUTE to worker qwen3-32b-west/west-0"),
        ("standard-model-alias", "ROUTE to worker qwen3-32b-west/west-0"),
    ];
    for (s, verdict) in expected {
        let request = format!("examples/explain/{s}/request.json");
        let state = format!("examples/explain/{s}/state.yaml");
        let o = switchyard(&["explain", "--config", "examples/policies", "--request", &request, "--state", &state]);
        let out = stdout(&o);
        assert!(out.starts_with(&format!("decision: {verdict}")), "{s}: {out}");
    }
}

#[test]
fn explain_refuses_unknown_workers_and_bad_files() {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"));
    let state = dir.join("bad-state.yaml");
    fs::write(&state, "workers:\n- {workerSet: qwen3-32b-east, worker: east-9}\n").expect("write");
    let o = switchyard(&[
        "explain",
        "--config",
        "examples/policies",
        "--request",
        "examples/explain/cloud-spillover/request.json",
        "--state",
        state.to_str().expect("utf-8"),
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("east-9 is not a worker"));
    let request = dir.join("bad-request.json");
    fs::write(&request, "{\"model\": \"x\",\n \"promptTokens\": [}\n").expect("write");
    let o = switchyard(&[
        "explain",
        "--config",
        "examples/policies",
        "--request",
        request.to_str().expect("utf-8"),
        "--state",
        "examples/explain/cloud-spillover/state.yaml",
    ]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("bad-request.json:2:"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
}

#[test]
fn calibrate_runs_the_spokes_own_routing_in_virtual_time() {
    let out = switchyard(&[
        "calibrate",
        "--workload",
        "shared-prefix",
        "--routing",
        "random,switchyard",
        "--concurrency",
        "8",
        "--requests",
        "120",
        "--warmup",
        "24",
        "--format",
        "json",
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let result = |routing: &str| {
        v["runs"].as_array().expect("runs").iter().find(|r| r["routing"] == routing).expect("run")["result"].clone()
    };
    let (random, spoke) = (result("random"), result("switchyard"));
    let p50 = |r: &serde_json::Value| r["ttft_ms_p50"].as_f64().expect("p50");
    // The spoke keeps each prefix where it is cached: its median is one engine step, random's a
    // whole 16k-token prefill.
    assert!(p50(&spoke) * 10.0 < p50(&random), "{spoke} vs {random}");
    assert!(spoke["goodput_per_min"].as_f64() > random["goodput_per_min"].as_f64(), "{spoke} vs {random}");

    let bad = switchyard(&["calibrate", "--routing", "nearest", "--requests", "1", "--warmup", "0"]);
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("unknown routing `nearest`"));
}
