//! The committed manifests under `crds/` must equal what the Rust types generate.
//! Regenerate with `switchyard crds --out crds`.

use std::fs;
use std::path::Path;

#[test]
fn committed_manifests_match_the_types() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let generated = switchyard_crds::render_all();
    assert_eq!(generated.len(), switchyard_crds::KINDS.len());
    for m in &generated {
        let path = dir.join(&m.file_name);
        let committed = fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("{}: {e}; run `switchyard crds --out crds`", path.display()));
        assert!(
            committed == m.yaml,
            "{} drifted from the {} type; run `switchyard crds --out crds`",
            path.display(),
            m.kind
        );
    }
    let mut on_disk: Vec<String> = fs::read_dir(dir)
        .expect("crds dir")
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.ends_with(".yaml"))
        .collect();
    on_disk.sort();
    let mut expected: Vec<String> = generated.iter().map(|m| m.file_name.clone()).collect();
    expected.sort();
    assert_eq!(on_disk, expected, "stale or extra manifests in crds/");
}

#[test]
fn every_kind_has_status_subresource_and_printer_columns() {
    for m in switchyard_crds::render_all() {
        assert!(m.yaml.contains("subresources:\n      status: {}"), "{} lacks the status subresource", m.kind);
        assert!(m.yaml.contains("additionalPrinterColumns:"), "{} lacks printer columns", m.kind);
        assert!(m.yaml.contains("scope: Namespaced"), "{} is not namespaced", m.kind);
    }
}
