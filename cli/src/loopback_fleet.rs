//! The configuration of a fleet of simulated workers on loopback: one worker set, its pool, and
//! the backend serving its model. `switchyard up` runs such a fleet; `switchyard calibrate`
//! routes over one in virtual time.

/// A one-set fleet on 127.0.0.1.
pub struct LoopbackFleet<'a> {
    /// Name of the worker set, pool and backend, and the cluster they are in.
    pub name: &'a str,
    /// Served and public model name.
    pub model: &'a str,
    /// One YAML flow mapping per worker, e.g. `{name: w0, host: 127.0.0.1, httpPort: 8000}`.
    pub endpoints: &'a [String],
    /// Tokens per KV-cache block on the workers.
    pub block_size: u32,
    /// Further lines of the worker set's `spec`, each indented by two spaces.
    pub worker_set_spec: &'a str,
    /// Further lines of the backend's `spec`, each indented by two spaces.
    pub backend_spec: &'a str,
    /// Further members of the pool (e.g. `  - {provider: p, model: m}\n`).
    pub pool_members: &'a str,
    /// Further documents (providers, policies), each starting with `---`.
    pub extra_documents: &'a str,
}

impl LoopbackFleet<'_> {
    /// The worker set's document alone (what a hub's fleet-wide configuration lists).
    pub fn worker_set_yaml(&self) -> String {
        let LoopbackFleet { name, model, endpoints, block_size, worker_set_spec, .. } = self;
        let endpoints: String = endpoints.iter().map(|e| format!("    - {e}\n")).collect();
        format!(
            "apiVersion: switchyard.dev/v1alpha1
kind: InferenceWorkerSet
metadata:
  name: {name}
spec:
  model: {model}
  cluster: {name}
  endpoints:
    static:
{endpoints}  kvBlockSize: {block_size}
{worker_set_spec}"
        )
    }

    /// The three resources as one multi-document YAML text.
    pub fn yaml(&self) -> String {
        let LoopbackFleet { name, model, backend_spec, pool_members, extra_documents, .. } = self;
        format!(
            "{}---
apiVersion: switchyard.dev/v1alpha1
kind: InferencePool
metadata:
  name: {name}
spec:
  members:
  - workerSet: {name}
{pool_members}---
apiVersion: switchyard.dev/v1alpha1
kind: GatewayBackend
metadata:
  name: {name}
spec:
  models:
  - {{name: {model}, pool: {name}}}
{backend_spec}{extra_documents}",
            self.worker_set_yaml()
        )
    }
}
