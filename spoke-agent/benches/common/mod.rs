//! Loopback fleets behind a real spoke, shared by the spoke's benches.

use std::path::{Path, PathBuf};
use std::time::Duration;

use switchyard_sim::{Fleet, KvEventsConfig, SimConfig};
use switchyard_spoke::{Spoke, SpokeConfig};

/// The allocator the `switchyard` binary runs with: benches measure what ships.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// `workers` simulated workers (zero step time, KV events on when `kv_events`) in one worker
/// set `s` of model `sim-model` with 16-token blocks, and a spoke routing to them; every
/// worker has been scraped once this returns. Remove the returned directory when done.
#[allow(dead_code)] // Each bench is its own crate; the provider bench uses the other one.
pub async fn fleet_and_spoke(workers: u32, kv_events: bool) -> (Fleet, Spoke, PathBuf) {
    fleet_and_spoke_with(workers, kv_events, "", "", None).await
}

/// [`fleet_and_spoke`] with `pool_members` added to the pool (`, {provider: p, model: m}`),
/// `extra_documents` (each starting with `---\n`) added to the configuration, and the spoke
/// reading Secrets from `secrets_dir`.
#[allow(dead_code)] // Each bench is its own crate; not every one spills over.
pub async fn fleet_and_spoke_with(
    workers: u32,
    kv_events: bool,
    pool_members: &str,
    extra_documents: &str,
    secrets_dir: Option<PathBuf>,
) -> (Fleet, Spoke, PathBuf) {
    let tokenizer = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tokenizer/files");
    let fleet = Fleet::start(SimConfig {
        time_scale: 0.0,
        workers,
        kv_events: kv_events.then(|| KvEventsConfig {
            enable_kv_cache_events: true,
            publisher: None,
            endpoint: "tcp://*:0".into(),
            replay_endpoint: None,
            buffer_steps: 100,
            topic: String::new(),
        }),
        enable_prompt_tokens_details: true,
        ..SimConfig::loopback(tokenizer.clone())
    })
    .await
    .expect("fleet");
    let endpoints: Vec<String> = fleet
        .workers
        .iter()
        .enumerate()
        .map(|(i, w)| {
            let kv = w.kv_events.as_deref().and_then(|e| e.rsplit(':').next()).map(|p| format!(", kvEventsPort: {p}"));
            format!("{{name: w{i}, host: 127.0.0.1, httpPort: {}{}}}", w.http.port(), kv.unwrap_or_default())
        })
        .collect();
    let dir = std::env::temp_dir().join(format!("spoke-bench-{}-{}", std::process::id(), fleet.workers[0].http.port()));
    std::fs::create_dir_all(&dir).expect("dir");
    std::fs::write(
        dir.join("fleet.yaml"),
        format!(
            "apiVersion: switchyard.dev/v1alpha1\nkind: InferenceWorkerSet\nmetadata: {{name: s}}\nspec:\n  model: sim-model\n  cluster: c\n  endpoints:\n    static: [{}]\n  kvEvents: {{enabled: {kv_events}}}\n  kvBlockSize: 16\n  tokenizer: {{source: Files, path: {}}}\n---\napiVersion: switchyard.dev/v1alpha1\nkind: InferencePool\nmetadata: {{name: p}}\nspec:\n  members: [{{workerSet: s}}{pool_members}]\n---\napiVersion: switchyard.dev/v1alpha1\nkind: GatewayBackend\nmetadata: {{name: g}}\nspec:\n  models: [{{name: sim-model, pool: p}}]\n{extra_documents}",
            endpoints.join(", "),
            tokenizer.display()
        ),
    )
    .expect("config");
    let spoke = Spoke::start(SpokeConfig {
        reload_interval: Duration::from_secs(60),
        secrets_dir,
        ..SpokeConfig::loopback(vec![dir.clone()])
    })
    .await
    .expect("spoke");
    for _ in 0..200 {
        let live = spoke.app.registry.workers();
        if live.len() == workers as usize && live.iter().all(|w| w.load.healthy() && w.load.engine().1.is_some()) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    if kv_events {
        // Let the KV subscribers connect.
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    (fleet, spoke, dir)
}

/// The percentile line of interleaved (direct, via spoke) TTFT pairs in milliseconds.
#[allow(dead_code)] // Not every bench measures pairs.
pub fn added_ttft_report(what: &str, direct: &[f64], via: &[f64]) -> String {
    fn percentile(v: &[f64], p: f64) -> f64 {
        let mut v = v.to_vec();
        v.sort_by(f64::total_cmp);
        v[((v.len() - 1) as f64 * p).round() as usize]
    }
    let added: Vec<f64> = via.iter().zip(direct).map(|(a, b)| a - b).collect();
    format!(
        "{what} direct p50 {:.3} ms p99 {:.3} ms; via spoke p50 {:.3} ms p99 {:.3} ms; added p50 {:.3} ms p99 {:.3} ms ({} interleaved pairs)",
        percentile(direct, 0.5),
        percentile(direct, 0.99),
        percentile(via, 0.5),
        percentile(via, 0.99),
        percentile(&added, 0.5),
        percentile(&added, 0.99),
        added.len()
    )
}
