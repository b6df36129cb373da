//! A one-worker loopback fleet behind a real spoke, shared by the spoke's benches.

use std::path::{Path, PathBuf};
use std::time::Duration;

use switchyard_sim::{Fleet, KvEventsConfig, SimConfig};
use switchyard_spoke::{Spoke, SpokeConfig};

/// A simulated worker (zero step time, KV events on) and a spoke routing to it; the spoke's
/// worker has been scraped once this returns. Remove the returned directory when done.
pub async fn fleet_and_spoke() -> (Fleet, Spoke, PathBuf) {
    let tokenizer = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tokenizer/files");
    let fleet = Fleet::start(SimConfig {
        time_scale: 0.0,
        kv_events: Some(KvEventsConfig {
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
    let w = &fleet.workers[0];
    let kv_port = w.kv_events.as_deref().and_then(|e| e.rsplit(':').next()).unwrap_or("1").to_owned();
    let dir = std::env::temp_dir().join(format!("spoke-bench-{}-{}", std::process::id(), w.http.port()));
    std::fs::create_dir_all(&dir).expect("dir");
    std::fs::write(
        dir.join("fleet.yaml"),
        format!(
            "apiVersion: switchyard.dev/v1alpha1\nkind: InferenceWorkerSet\nmetadata: {{name: s}}\nspec:\n  model: sim-model\n  cluster: c\n  endpoints:\n    static: [{{name: w, host: 127.0.0.1, httpPort: {}, kvEventsPort: {kv_port}}}]\n  kvBlockSize: 16\n  tokenizer: {{source: Files, path: {}}}\n---\napiVersion: switchyard.dev/v1alpha1\nkind: InferencePool\nmetadata: {{name: p}}\nspec:\n  members: [{{workerSet: s}}]\n---\napiVersion: switchyard.dev/v1alpha1\nkind: GatewayBackend\nmetadata: {{name: g}}\nspec:\n  models: [{{name: sim-model, pool: p}}]\n",
            w.http.port(),
            tokenizer.display()
        ),
    )
    .expect("config");
    let spoke = Spoke::start(SpokeConfig {
        reload_interval: Duration::from_secs(60),
        ..SpokeConfig::loopback(vec![dir.clone()])
    })
    .await
    .expect("spoke");
    for _ in 0..100 {
        if spoke.app.registry.workers().iter().all(|w| w.load.engine().1.is_some()) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Let the KV subscriber connect.
    tokio::time::sleep(Duration::from_millis(300)).await;
    (fleet, spoke, dir)
}
