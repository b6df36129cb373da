//! The fleet-wide part of a configuration, as a hub pushes it to its spokes, and a spoke's
//! configuration composed from its own files and that push.
//!
//! Fleet-wide are policies, providers, pools and gateway backends: what models, aliases and
//! policies mean everywhere. Worker sets stay cluster-local: their endpoints and discovery
//! are only known in their own cluster, so a spoke's come from its files.
//!
//! A spoke's composed configuration is its own worker sets plus the pushed fleet-wide
//! resources narrowed to them: pool members naming a worker set the spoke does not have are
//! dropped, then pools left without members, public models served by a dropped pool, alias
//! targets that no longer name anything (and aliases left without targets), and backends left
//! empty. The spoke's own fleet-wide files are not used while a push is applied.
//!
//! Invariants: composing never invents a resource or a reference, only drops what cannot
//! apply in the spoke's cluster; the result is validated exactly as files are; the version
//! of a set of documents depends only on their content, so hub replicas with the same
//! configuration push the same version.

use std::collections::BTreeSet;
use std::path::PathBuf;

use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::load::{self, LoadError, Located, Resources};
use crate::{Checked, finish};

/// Fleet-wide resources as documents: (label, YAML text) pairs, one resource each, labelled
/// `hub:<Kind>/<name>` for the spoke's diagnostics; and their content's version.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FleetDocuments {
    /// The first 16 hex digits of the SHA-256 of the labels and texts.
    pub version: String,
    /// The documents, in kind then file order.
    pub documents: Vec<(String, String)>,
}

fn document<T: Serialize>(kind: &str, located: &Located<T>, name: Option<&String>) -> Option<(String, String)> {
    let mut value = serde_json::to_value(&located.object).ok()?;
    // Status is the API server's; the schema check refuses it in a spec document.
    if let Some(map) = value.as_object_mut() {
        map.remove("status");
    }
    // JSON is YAML: the spoke reads these with the same loader as files.
    let text = serde_json::to_string_pretty(&value).ok()?;
    Some((format!("hub:{kind}/{}", name.map_or("", String::as_str)), text))
}

/// The fleet-wide resources of `res` as documents.
pub fn fleet_documents(res: &Resources) -> FleetDocuments {
    let mut documents = Vec::new();
    documents
        .extend(res.policies.iter().filter_map(|r| document("InferencePolicy", r, r.object.metadata.name.as_ref())));
    documents
        .extend(res.providers.iter().filter_map(|r| document("InferenceProvider", r, r.object.metadata.name.as_ref())));
    documents.extend(res.pools.iter().filter_map(|r| document("InferencePool", r, r.object.metadata.name.as_ref())));
    documents
        .extend(res.backends.iter().filter_map(|r| document("GatewayBackend", r, r.object.metadata.name.as_ref())));
    FleetDocuments { version: version_of(&documents), documents }
}

/// The content version of `documents`.
pub fn version_of(documents: &[(String, String)]) -> String {
    let mut hash = Sha256::new();
    for (label, text) in documents {
        // Lengths first: no two different lists hash the same bytes.
        hash.update((label.len() as u64).to_le_bytes());
        hash.update(label.as_bytes());
        hash.update((text.len() as u64).to_le_bytes());
        hash.update(text.as_bytes());
    }
    hash.finalize().iter().take(8).map(|b| format!("{b:02x}")).collect()
}

/// `local`'s worker sets with `pushed`'s fleet-wide resources narrowed to them (see the
/// module docs).
pub fn compose(local: &Resources, pushed: &Resources) -> Resources {
    let sets: BTreeSet<&str> = local.worker_sets.iter().filter_map(|w| w.object.metadata.name.as_deref()).collect();
    let mut pools = pushed.pools.clone();
    for pool in &mut pools {
        pool.object.spec.members.retain(|m| m.worker_set.as_deref().is_none_or(|s| sets.contains(s)));
    }
    pools.retain(|p| !p.object.spec.members.is_empty());
    let pool_names: BTreeSet<String> = pools.iter().filter_map(|p| p.object.metadata.name.clone()).collect();
    let mut backends = pushed.backends.clone();
    for backend in &mut backends {
        backend.object.spec.models.retain(|m| pool_names.contains(&m.pool));
    }
    // Aliases may name aliases: drop dangling targets until nothing changes.
    loop {
        let names: BTreeSet<String> = backends
            .iter()
            .flat_map(|b| {
                b.object
                    .spec
                    .models
                    .iter()
                    .map(|m| m.name.clone())
                    .chain(b.object.spec.aliases.iter().map(|a| a.name.clone()))
            })
            .collect();
        let mut changed = false;
        for backend in &mut backends {
            for alias in &mut backend.object.spec.aliases {
                let before = alias.targets.len();
                alias.targets.retain(|t| names.contains(t));
                changed |= alias.targets.len() != before;
            }
            let before = backend.object.spec.aliases.len();
            backend.object.spec.aliases.retain(|a| !a.targets.is_empty());
            changed |= backend.object.spec.aliases.len() != before;
        }
        if !changed {
            break;
        }
    }
    backends.retain(|b| !(b.object.spec.models.is_empty() && b.object.spec.aliases.is_empty()));
    Resources {
        worker_sets: local.worker_sets.clone(),
        providers: pushed.providers.clone(),
        pools,
        policies: pushed.policies.clone(),
        backends,
        files: local.files + pushed.files,
        rejected: local.rejected.union(&pushed.rejected).cloned().collect(),
    }
}

/// Loads the files under `paths`, composes them with the pushed `documents` and validates
/// the result. Every diagnostic of both is kept (a pushed document's carry its label).
pub fn check_composed(paths: &[PathBuf], documents: &[(String, String)]) -> Result<Checked, LoadError> {
    let mut local = Resources::default();
    let mut diagnostics = Vec::new();
    load::load_paths(paths, &mut local, &mut diagnostics)?;
    let mut pushed = Resources::default();
    for (label, text) in documents {
        load::load_text(label, text, &mut pushed, &mut diagnostics);
    }
    Ok(finish(compose(&local, &pushed), diagnostics))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check_texts;

    const HUB: &str = "
apiVersion: switchyard.dev/v1alpha1
kind: InferenceWorkerSet
metadata: {name: east}
spec:
  model: m
  cluster: east
  region: us-east
  endpoints: {static: [{name: e0, host: 127.0.0.1, httpPort: 9000}]}
---
apiVersion: switchyard.dev/v1alpha1
kind: InferenceWorkerSet
metadata: {name: west}
spec:
  model: m
  cluster: west
  region: us-west
  endpoints: {static: [{name: w0, host: 127.0.0.1, httpPort: 9100}]}
---
apiVersion: switchyard.dev/v1alpha1
kind: InferencePool
metadata: {name: fleet}
spec: {members: [{workerSet: east}, {workerSet: west}]}
---
apiVersion: switchyard.dev/v1alpha1
kind: InferencePool
metadata: {name: east-only}
spec: {members: [{workerSet: east}]}
---
apiVersion: switchyard.dev/v1alpha1
kind: GatewayBackend
metadata: {name: fleet}
spec:
  models: [{name: m, pool: fleet}, {name: m-east, pool: east-only}]
  aliases:
  - {name: standard-model, targets: [m]}
  - {name: east-model, targets: [m-east]}
  - {name: via-alias, targets: [east-model]}
---
apiVersion: switchyard.dev/v1alpha1
kind: InferencePolicy
metadata: {name: pii}
spec:
  priority: 100
  match: {tags: [pii]}
  steps: [{type: RequireRegions, requireRegions: [us-east]}]
  onEmpty: Reject
";

    const WEST: &str = "
apiVersion: switchyard.dev/v1alpha1
kind: InferenceWorkerSet
metadata: {name: west}
spec:
  model: m
  cluster: west
  region: us-west
  endpoints: {static: [{name: w0, host: 127.0.0.1, httpPort: 9100}]}
---
apiVersion: switchyard.dev/v1alpha1
kind: InferencePool
metadata: {name: local}
spec: {members: [{workerSet: west}]}
---
apiVersion: switchyard.dev/v1alpha1
kind: GatewayBackend
metadata: {name: local}
spec: {models: [{name: local-model, pool: local}]}
";

    fn resources(label: &str, text: &str) -> Resources {
        let checked = check_texts([(label, text)]);
        assert_eq!(checked.error_count(), 0, "{:?}", checked.diagnostics);
        checked.resources
    }

    #[test]
    fn the_fleet_documents_leave_worker_sets_out_and_reload_as_the_same_resources() {
        let hub = resources("hub.yaml", HUB);
        let docs = fleet_documents(&hub);
        let labels: Vec<&str> = docs.documents.iter().map(|(l, _)| l.as_str()).collect();
        assert_eq!(
            labels,
            [
                "hub:InferencePolicy/pii",
                "hub:InferencePool/fleet",
                "hub:InferencePool/east-only",
                "hub:GatewayBackend/fleet"
            ]
        );
        let again = check_texts(docs.documents.iter().map(|(l, t)| (l.as_str(), t.as_str())));
        assert_eq!(again.resources.pools[0].object.spec, hub.pools[0].object.spec);
        assert_eq!(again.resources.policies[0].object.spec, hub.policies[0].object.spec);
        assert_eq!(again.resources.backends[0].object.spec, hub.backends[0].object.spec);
        assert_eq!(docs.version.len(), 16);
        assert_eq!(fleet_documents(&again.resources).version, docs.version, "the version depends on content only");
    }

    #[test]
    fn a_change_of_any_document_changes_the_version() {
        let docs = fleet_documents(&resources("hub.yaml", HUB));
        let changed = fleet_documents(&resources("hub.yaml", &HUB.replace("priority: 100", "priority: 101")));
        assert_ne!(docs.version, changed.version);
    }

    #[test]
    fn a_spoke_keeps_its_worker_sets_and_takes_the_pushed_resources_narrowed_to_them() {
        let hub = resources("hub.yaml", HUB);
        let west = resources("west.yaml", WEST);
        let composed = compose(&west, &hub);
        let checked = finish(composed, Vec::new());
        assert_eq!(checked.error_count(), 0, "{:?}", checked.diagnostics);
        let config = &checked.config;
        assert_eq!(config.worker_sets.keys().map(|k| k.as_str()).collect::<Vec<_>>(), ["west"]);
        // The fleet pool keeps west; east-only goes, and with it m-east and both aliases over it.
        assert_eq!(checked.resources.pools.len(), 1);
        assert_eq!(checked.resources.pools[0].object.spec.members.len(), 1);
        assert!(config.aliases.contains_key("standard-model"));
        assert!(!config.aliases.contains_key("east-model") && !config.aliases.contains_key("via-alias"));
        assert!(!config.models.contains_key("local-model"), "the spoke's own backend is replaced");
        assert!(config.models.contains_key("m"));
        assert_eq!(checked.resources.policies.len(), 1);
    }

    #[test]
    fn a_pushed_document_that_fails_its_schema_is_reported_under_its_label() {
        let docs = vec![(
            "hub:InferencePolicy/bad".to_owned(),
            "{\"apiVersion\": \"switchyard.dev/v1alpha1\", \"kind\": \"InferencePolicy\",\n \"metadata\": {\"name\": \"bad\"},\n \"spec\": {\"priority\": \"high\"}}".to_owned(),
        )];
        let dir = std::env::temp_dir().join(format!("switchyard-federated-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        std::fs::write(dir.join("west.yaml"), WEST).expect("write");
        let checked = check_composed(std::slice::from_ref(&dir), &docs).expect("loads");
        std::fs::remove_dir_all(&dir).ok();
        assert!(checked.error_count() > 0);
        let rendered: Vec<String> =
            checked.diagnostics.iter().filter(|d| d.is_error()).map(ToString::to_string).collect();
        assert!(rendered.iter().any(|d| d.starts_with("hub:InferencePolicy/bad:")), "{rendered:?}");
    }
}
