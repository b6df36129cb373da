//! The configuration texts of `switchyard up`'s federation on one machine: each cluster's
//! spoke configuration (its worker set, a pool, the model and its alias, spillover to the
//! local Bedrock endpoint), and the hub's fleet-wide one over every cluster's worker set.
//!
//! Invariants: the hub's configuration lists exactly the worker sets of the spokes'
//! configurations, each in its own cluster and region; at both levels `pii`-tagged requests
//! can never reach the external provider (`ExcludeExternal`, `onEmpty: Reject`), and at the
//! hub they are also kept in the first cluster's region.

use std::path::Path;

use crate::loopback_fleet::LoopbackFleet;

/// The Bedrock model id the local endpoint serves for the fleet's model.
pub const LOCAL_BEDROCK_MODEL_ID: &str = "switchyard.local-spillover-v1:0";

/// The provider's name in both configurations (and its Secret's).
pub const LOCAL_PROVIDER: &str = "local-bedrock";

/// A cluster of the local federation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalCluster {
    /// Its name (also its worker set's, pool's and certificate's).
    pub name: String,
    /// Its region.
    pub region: String,
}

/// The clusters `up` runs: east and west first (different regions), then more.
pub fn clusters(count: u32) -> Vec<LocalCluster> {
    const NAMED: [(&str, &str); 4] =
        [("east", "us-east"), ("west", "us-west"), ("north", "eu-north"), ("south", "eu-south")];
    (0..count as usize)
        .map(|i| match NAMED.get(i) {
            Some((name, region)) => LocalCluster { name: (*name).into(), region: (*region).into() },
            None => LocalCluster { name: format!("cluster-{}", i + 1), region: format!("region-{}", i + 1) },
        })
        .collect()
}

/// A worker's ports, whatever runs it.
#[derive(Debug, Clone, Copy)]
pub struct WorkerPorts {
    /// Its index in its cluster.
    pub index: u32,
    /// OpenAI-compatible HTTP.
    pub http: u16,
    /// KV events (ZMQ PUB).
    pub kv_events: u16,
    /// KV-event replay (ZMQ ROUTER).
    pub kv_replay: u16,
}

/// What every configuration shares: the model, its tokenizer and the workers' block size.
#[derive(Debug, Clone, Copy)]
pub struct Shared<'a> {
    /// Served (and public) model name; `standard-model` is its alias.
    pub model: &'a str,
    /// The tokenizer directory the worker sets name.
    pub tokenizer: &'a Path,
    /// Tokens per KV block on the workers.
    pub block_size: u32,
    /// The local Bedrock endpoint's URL.
    pub bedrock_url: &'a str,
    /// What runs the workers, for the header comment.
    pub engine: &'a str,
}

fn fleet<'a>(
    shared: &Shared<'a>,
    cluster: &'a LocalCluster,
    endpoints: &'a [String],
    extra: &'a str,
    spec: &'a str,
) -> LoopbackFleet<'a> {
    LoopbackFleet {
        name: &cluster.name,
        model: shared.model,
        endpoints,
        block_size: shared.block_size,
        worker_set_spec: spec,
        backend_spec: "",
        pool_members: "",
        extra_documents: extra,
    }
}

fn worker_set_spec(shared: &Shared<'_>, cluster: &LocalCluster) -> String {
    format!("  region: {}\n  tokenizer:\n    source: Files\n    path: {}\n", cluster.region, shared.tokenizer.display())
}

fn endpoints(workers: &[WorkerPorts]) -> Vec<String> {
    workers
        .iter()
        .map(|w| {
            format!(
                "{{name: worker-{}, host: 127.0.0.1, httpPort: {}, kvEventsPort: {}, kvReplayPort: {}}}",
                w.index, w.http, w.kv_events, w.kv_replay
            )
        })
        .collect()
}

/// The provider and the spillover policy, with `pii_steps` (more steps of `pii-residency`).
fn provider_and_policies(shared: &Shared<'_>, pii_steps: &str) -> String {
    let model = shared.model;
    let url = shared.bedrock_url;
    format!(
        "---
apiVersion: switchyard.dev/v1alpha1
kind: InferenceProvider
metadata:
  name: {LOCAL_PROVIDER}
spec:
  type: Bedrock
  region: us-east-1
  baseUrl: {url}
  credentials:
    secretRef: {{name: {LOCAL_PROVIDER}, key: credentials}}
  residency:
    external: true
  expectedTTFTMs: 300
  models:
  - name: {model}
    providerModelId: {LOCAL_BEDROCK_MODEL_ID}
    pricing: {{inputPerMillion: \"0.72\", outputPerMillion: \"0.72\", cachedInputPerMillion: \"0.072\"}}
---
apiVersion: switchyard.dev/v1alpha1
kind: InferencePolicy
metadata:
  name: cloud-spillover
spec:
  priority: 50
  match:
    models: [{model}, standard-model]
  steps:
  - type: MaxWaitingRequests
    maxWaitingRequests: 2
  minimize: PredictedTTFT
  onEmpty: Fallback
---
apiVersion: switchyard.dev/v1alpha1
kind: InferencePolicy
metadata:
  name: pii-residency
spec:
  priority: 1000
  match:
    tags: [pii]
  steps:
  - type: ExcludeExternal
{pii_steps}  minimize: PredictedTTFT
  onEmpty: Reject
"
    )
}

/// One cluster's spoke configuration: its worker set, a pool with the provider behind it,
/// the model with its alias, and the policies.
pub fn spoke_config(shared: &Shared<'_>, cluster: &LocalCluster, workers: &[WorkerPorts]) -> String {
    let endpoints = endpoints(workers);
    let spec = worker_set_spec(shared, cluster);
    let extra = provider_and_policies(shared, "");
    let mut f = fleet(shared, cluster, &endpoints, &extra, &spec);
    let alias = format!("  aliases:\n  - {{name: standard-model, targets: [{}]}}\n", shared.model);
    let members = format!("  - {{provider: {LOCAL_PROVIDER}, model: {}}}\n", shared.model);
    f.backend_spec = &alias;
    f.pool_members = &members;
    format!(
        "# Generated by `switchyard up`: cluster {}'s spoke, {} on loopback.\n{}",
        cluster.name,
        shared.engine,
        f.yaml()
    )
}

/// The hub's configuration: every cluster's worker set, one pool over them and the provider,
/// the model with its alias, and the policies (pii kept in the first cluster's region).
pub fn hub_config(shared: &Shared<'_>, clusters: &[(LocalCluster, Vec<WorkerPorts>)]) -> String {
    let model = shared.model;
    let mut sets = Vec::new();
    let mut members = String::new();
    for (cluster, workers) in clusters {
        let endpoints = endpoints(workers);
        let spec = worker_set_spec(shared, cluster);
        sets.push(fleet(shared, cluster, &endpoints, "", &spec).worker_set_yaml());
        members.push_str(&format!("  - {{workerSet: {}}}\n", cluster.name));
    }
    let home = clusters.first().map(|(c, _)| c.region.as_str()).unwrap_or("local");
    let pii_steps = format!("  - type: RequireRegions\n    requireRegions: [{home}]\n");
    format!(
        "# Generated by `switchyard up`: the hub over {} cluster(s).
{}---
apiVersion: switchyard.dev/v1alpha1
kind: InferencePool
metadata:
  name: fleet
spec:
  members:
{members}  - {{provider: {LOCAL_PROVIDER}, model: {model}}}
---
apiVersion: switchyard.dev/v1alpha1
kind: GatewayBackend
metadata:
  name: fleet
spec:
  models:
  - {{name: {model}, pool: fleet}}
  aliases:
  - {{name: standard-model, targets: [{model}]}}
{}",
        clusters.len(),
        sets.join("---\n"),
        provider_and_policies(shared, &pii_steps)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shared(tokenizer: &Path) -> Shared<'_> {
        Shared {
            model: "sim-model",
            tokenizer,
            block_size: 16,
            bedrock_url: "http://127.0.0.1:1",
            engine: "simulated workers",
        }
    }

    fn workers(first_port: u16) -> Vec<WorkerPorts> {
        (0..3)
            .map(|i| WorkerPorts {
                index: i,
                http: first_port + i as u16,
                kv_events: first_port + 10,
                kv_replay: first_port + 20,
            })
            .collect()
    }

    #[test]
    fn clusters_are_named_and_in_different_regions() {
        let c = clusters(5);
        let names: Vec<&str> = c.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["east", "west", "north", "south", "cluster-5"]);
        let mut regions: Vec<&str> = c.iter().map(|c| c.region.as_str()).collect();
        regions.dedup();
        assert_eq!(regions.len(), 5);
    }

    #[test]
    fn every_generated_configuration_is_valid_and_the_hub_lists_every_cluster() {
        let dir =
            switchyard_tokenizer::find_default_dir(Path::new(env!("CARGO_MANIFEST_DIR"))).expect("tokenizer files");
        let s = shared(&dir);
        let planned: Vec<(LocalCluster, Vec<WorkerPorts>)> =
            clusters(2).into_iter().zip([workers(9000), workers(9100)]).collect();
        for (cluster, w) in &planned {
            let text = spoke_config(&s, cluster, w);
            let checked = switchyard_config::check_texts([("spoke.yaml", text.as_str())]);
            assert_eq!(checked.error_count(), 0, "{:?}\n{text}", checked.diagnostics);
            assert_eq!(checked.config.worker_sets[cluster.name.as_str()].workers.len(), 3);
        }
        let text = hub_config(&s, &planned);
        let checked = switchyard_config::check_texts([("hub.yaml", text.as_str())]);
        assert_eq!(checked.error_count(), 0, "{:?}\n{text}", checked.diagnostics);
        let sets = &checked.config.worker_sets;
        assert_eq!(sets["east"].cluster.as_str(), "east");
        assert_eq!(sets["west"].region.as_deref(), Some("us-west"));
        assert!(text.contains("requireRegions: [us-east]"), "{text}");
        assert!(checked.config.aliases.contains_key("standard-model"));
    }
}
