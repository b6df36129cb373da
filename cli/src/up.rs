//! `switchyard spoke` and `switchyard up`.
//!
//! `up` is the one-command local federation: a hub on the front-door ports over clusters
//! (east and west by default) of vLLM workers — simulated by default, real ones with
//! `--engine vllm` — each behind its own spoke dialing the hub over mutual TLS, and a local
//! Bedrock endpoint they spill over to; all on loopback, stopped together on Ctrl-C or
//! SIGTERM.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context;
use switchyard_sim::wire::WireFormat;
use switchyard_sim::{Fleet, KvEventsConfig, SimConfig, profile};
use switchyard_spoke::cli_args::LimitArgs;
use switchyard_spoke::http::Limits;
use switchyard_spoke::{DEFAULT_RELOAD_INTERVAL, Spoke, SpokeConfig};
use switchyard_tokenizer::find_default_dir;

use crate::Exit;
use crate::local_federation::{self, LOCAL_BEDROCK_MODEL_ID, LOCAL_PROVIDER, LocalCluster, Shared, WorkerPorts};
use crate::vllm_fleet::{self, VllmFleet, VllmSpec};
use switchyard_hub::{Hub, HubConfig};
use switchyard_sim::bedrock::{BedrockConfig, BedrockEndpoint};
use switchyard_spoke::hub_client::HubLink;

/// Arguments of `switchyard spoke`.
#[derive(clap::Args, Debug)]
pub struct SpokeArgs {
    /// Configuration files or directories.
    #[arg(long, required = true, value_name = "PATH")]
    config: Vec<PathBuf>,
    /// Front-door address.
    #[arg(long, default_value = switchyard_spoke::DEFAULT_LISTEN)]
    listen: SocketAddr,
    /// Admin address (status, metrics, decision traces).
    #[arg(long, default_value = switchyard_spoke::DEFAULT_ADMIN_LISTEN)]
    admin_listen: SocketAddr,
    /// Where Kubernetes Secrets referenced by providers are mounted (`DIR/NAME/KEY`).
    #[arg(long, value_name = "DIR")]
    secrets_dir: Option<PathBuf>,
    #[command(flatten)]
    hub: switchyard_spoke::hub_client::HubArgs,
    #[command(flatten)]
    limits: LimitArgs,
    /// Write the bound addresses as JSON to this file once listening.
    #[arg(long, value_name = "FILE")]
    ready_file: Option<PathBuf>,
}

/// Arguments of `switchyard up`.
#[derive(clap::Args, Debug)]
pub struct UpArgs {
    /// The hub's front-door port on 127.0.0.1.
    #[arg(long, default_value_t = 8080)]
    port: u16,
    /// The hub's admin port (status, metrics) on 127.0.0.1.
    #[arg(long, default_value_t = 9090)]
    admin_port: u16,
    /// What runs the workers: the simulator, or real vLLM engines (CPU build; install it with
    /// `e2e/vllm/setup`).
    #[arg(long, value_enum, default_value_t = Engine::Sim)]
    engine: Engine,
    /// Number of clusters, each a spoke over its own workers [default: 2 simulated, 1 real].
    #[arg(long)]
    clusters: Option<u32>,
    /// Workers per cluster [default: 3 simulated, 2 real].
    #[arg(long)]
    workers: Option<u32>,
    /// Simulator profile.
    #[arg(long, default_value = "tiny")]
    profile: String,
    /// Simulator time scale.
    #[arg(long, default_value_t = 1.0)]
    time_scale: f64,
    /// Model name the workers serve (also exposed as `standard-model`).
    #[arg(long, default_value = "sim-model")]
    model: String,
    /// The `vllm` executable, for `--engine vllm`.
    #[arg(long, env = "SWITCHYARD_VLLM", value_name = "PATH")]
    vllm: Option<PathBuf>,
    /// The model directory real workers serve, for `--engine vllm`.
    #[arg(long, env = "SWITCHYARD_VLLM_MODEL", value_name = "DIR")]
    vllm_model: Option<PathBuf>,
    /// KV-cache size of each real worker, GiB.
    #[arg(long, default_value_t = 1)]
    vllm_kv_cache_gib: u32,
}

/// What runs the workers of `switchyard up`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Engine {
    /// `switchyard sim` workers in this process.
    Sim,
    /// `vllm serve` child processes.
    Vllm,
}

impl Engine {
    /// Clusters and workers per cluster when not given: two clusters of three simulated
    /// workers; one of two real engines (each takes ~5 GB).
    fn defaults(self) -> (u32, u32) {
        match self {
            Engine::Sim => (2, 3),
            Engine::Vllm => (1, 2),
        }
    }
}

/// Most clusters `up` runs.
const MAX_CLUSTERS: u32 = 8;

/// Runs a spoke until Ctrl-C or SIGTERM.
pub fn run_spoke(args: &SpokeArgs) -> anyhow::Result<Exit> {
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().context("starting the async runtime")?;
    rt.block_on(async {
        let limits = args.limits.limits();
        let spoke = Spoke::start(SpokeConfig {
            listen: args.listen,
            admin_listen: args.admin_listen,
            config_paths: args.config.clone(),
            reload_interval: DEFAULT_RELOAD_INTERVAL,
            limits,
            secrets_dir: args.secrets_dir.clone(),
            hub: args.hub.link(),
        })
        .await?;
        println!("spoke listening on http://{} (admin http://{})", spoke.addr, spoke.admin_addr);
        if let Some(path) = &args.ready_file {
            let ready = serde_json::json!({"url": format!("http://{}", spoke.addr), "admin": format!("http://{}", spoke.admin_addr)});
            crate::ready::write(path, &ready)?;
        }
        crate::signals::wait_for_shutdown().await;
        spoke.shutdown().await;
        anyhow::Ok(())
    })?;
    Ok(Exit::Ok)
}

/// The running workers of `up`.
enum Workers {
    Sim(Fleet),
    Vllm(VllmFleet),
}

impl Workers {
    async fn start(args: &UpArgs, tokenizer: &Path, dir: &Path) -> anyhow::Result<(Workers, u32)> {
        match args.engine {
            Engine::Sim => {
                let p = profile::by_name(&args.profile)
                    .with_context(|| format!("unknown profile `{}`", args.profile))?
                    .clone();
                let block_size = p.block_size;
                let fleet = Fleet::start(SimConfig {
                    host: "127.0.0.1".into(),
                    port: 0,
                    workers: args.workers.unwrap_or(args.engine.defaults().1),
                    served_model_name: args.model.clone(),
                    tokenizer_dir: tokenizer.to_path_buf(),
                    profile: p,
                    time_scale: args.time_scale,
                    seed: 0,
                    kv_events: Some(KvEventsConfig {
                        enable_kv_cache_events: true,
                        publisher: Some("zmq".into()),
                        endpoint: "tcp://*:0".into(),
                        replay_endpoint: Some("tcp://*:0".into()),
                        buffer_steps: 10_000,
                        topic: String::new(),
                    }),
                    wire_format: WireFormat::Current,
                    enable_prompt_tokens_details: true,
                    prefix_caching_hash_algo: Default::default(),
                })
                .await?;
                Ok((Workers::Sim(fleet), block_size))
            }
            Engine::Vllm => {
                let spec = VllmSpec {
                    vllm: args
                        .vllm
                        .clone()
                        .context("--engine vllm needs --vllm or SWITCHYARD_VLLM (run e2e/vllm/setup)")?,
                    model: args
                        .vllm_model
                        .clone()
                        .context("--engine vllm needs --vllm-model or SWITCHYARD_VLLM_MODEL (run e2e/vllm/setup)")?,
                    served_model_name: args.model.clone(),
                    kv_cache_gib: args.vllm_kv_cache_gib,
                };
                let count = args.workers.unwrap_or(args.engine.defaults().1);
                println!(
                    "Starting {count} vLLM worker(s); a cold start takes a minute or two (logs in {}).",
                    dir.display()
                );
                let fleet = VllmFleet::start(&spec, count, dir).await?;
                Ok((Workers::Vllm(fleet), vllm_fleet::BLOCK_SIZE))
            }
        }
    }

    fn list(&self) -> Vec<WorkerPorts> {
        let port = |ep: &Option<String>| ep.as_deref().and_then(|e| e.rsplit(':').next()?.parse().ok()).unwrap_or(0);
        match self {
            Workers::Sim(f) => f
                .workers
                .iter()
                .map(|w| WorkerPorts {
                    index: w.index,
                    http: w.http.port(),
                    kv_events: port(&w.kv_events),
                    kv_replay: port(&w.kv_replay),
                })
                .collect(),
            Workers::Vllm(f) => f
                .workers
                .iter()
                .map(|w| WorkerPorts {
                    index: w.index,
                    http: w.http.port(),
                    kv_events: w.kv_events,
                    kv_replay: w.kv_replay,
                })
                .collect(),
        }
    }

    async fn shutdown(self) {
        match self {
            Workers::Sim(f) => f.shutdown().await,
            Workers::Vllm(mut f) => f.shutdown().await,
        }
    }
}

/// What `up` has started so far, stopped in reverse order whatever failed.
#[derive(Default)]
struct Running {
    workers: Vec<Workers>,
    bedrock: Option<BedrockEndpoint>,
    hub: Option<Hub>,
    spokes: Vec<Spoke>,
}

impl Running {
    async fn shutdown(self) {
        for spoke in self.spokes {
            spoke.shutdown().await;
        }
        if let Some(hub) = self.hub {
            hub.shutdown().await;
        }
        for workers in self.workers {
            workers.shutdown().await;
        }
        if let Some(bedrock) = self.bedrock {
            bedrock.shutdown().await;
        }
    }
}

/// How long `up` waits for every spoke to be live at the hub before it says it is ready.
const FEDERATION_READY_WITHIN: Duration = Duration::from_secs(15);

/// Starts the federation: every cluster's workers, the Bedrock endpoint, the hub on the
/// front-door ports (`claimed` until it binds them) and one spoke per cluster dialing it.
async fn start(
    args: &UpArgs,
    tokenizer: &Path,
    dir: &Path,
    claimed: Vec<std::net::TcpListener>,
    running: &mut Running,
) -> anyhow::Result<Vec<(LocalCluster, Vec<WorkerPorts>)>> {
    let (default_clusters, _) = args.engine.defaults();
    let clusters = local_federation::clusters(args.clusters.unwrap_or(default_clusters));
    let mut block_size = 0;
    let mut planned = Vec::new();
    for cluster in clusters {
        let logs = dir.join(&cluster.name);
        std::fs::create_dir_all(&logs)?;
        let (workers, size) = Workers::start(args, tokenizer, &logs).await?;
        block_size = size;
        planned.push((cluster, workers.list()));
        running.workers.push(workers);
    }
    // The spillover target: a local Bedrock Runtime endpoint, reached by the real AWS SDK with
    // keys from a mounted-Secret-shaped file, by the hub and by every spoke.
    let bedrock = BedrockEndpoint::start(BedrockConfig {
        models: vec![LOCAL_BEDROCK_MODEL_ID.to_owned()],
        time_scale: args.time_scale,
        ..BedrockConfig::default()
    })
    .await
    .context("starting the local Bedrock endpoint")?;
    let bedrock_url = bedrock.url();
    running.bedrock = Some(bedrock);

    let secrets = dir.join("secrets");
    std::fs::create_dir_all(secrets.join(LOCAL_PROVIDER))?;
    std::fs::write(
        secrets.join(LOCAL_PROVIDER).join("credentials"),
        "AWS_ACCESS_KEY_ID=AKIDLOCALFLEET\nAWS_SECRET_ACCESS_KEY=local-fleet-secret\n",
    )?;
    let names: Vec<String> = planned.iter().map(|(c, _)| c.name.clone()).collect();
    let issued = switchyard_proto::dev_certs::generate(&dir.join("certs"), &["127.0.0.1".to_owned()], &names)?;
    let engine = match args.engine {
        Engine::Sim => "simulated workers",
        Engine::Vllm => "real vLLM workers",
    };
    let shared = Shared { model: &args.model, tokenizer, block_size, bedrock_url: &bedrock_url, engine };
    let write_config = |name: &str, text: String| -> anyhow::Result<PathBuf> {
        let config_dir = dir.join(name).join("config");
        std::fs::create_dir_all(&config_dir)?;
        std::fs::write(config_dir.join("fleet.yaml"), text)?;
        Ok(config_dir)
    };
    let hub_config = write_config("hub", local_federation::hub_config(&shared, &planned))?;

    drop(claimed);
    let hub = Hub::start(HubConfig {
        api_listen: SocketAddr::from(([127, 0, 0, 1], args.port)),
        admin_listen: SocketAddr::from(([127, 0, 0, 1], args.admin_port)),
        config_paths: vec![hub_config],
        secrets_dir: Some(secrets.clone()),
        ..HubConfig::loopback(issued.hub.clone())
    })
    .await?;
    let federation = format!("https://{}", hub.addr);
    let view = hub.fleet.clone();
    running.hub = Some(hub);
    for ((cluster, workers), (_, tls)) in planned.iter().zip(&issued.clusters) {
        let config = write_config(&cluster.name, local_federation::spoke_config(&shared, cluster, workers))?;
        let spoke = Spoke::start(SpokeConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            admin_listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            config_paths: vec![config],
            reload_interval: DEFAULT_RELOAD_INTERVAL,
            limits: Limits::default(),
            secrets_dir: Some(secrets.clone()),
            hub: Some(HubLink {
                url: federation.clone(),
                server_name: None,
                cluster: cluster.name.clone(),
                tls: tls.clone(),
                front_door_url: None,
            }),
        })
        .await
        .with_context(|| format!("starting cluster {}'s spoke", cluster.name))?;
        running.spokes.push(spoke);
    }
    // Ready when the hub sees every cluster with all its workers healthy: the first request
    // printed below then finds the whole fleet.
    let deadline = Instant::now() + FEDERATION_READY_WITHIN;
    let whole = |live: &[switchyard_hub::fleet::LiveCluster]| {
        planned.iter().all(|(cluster, workers)| {
            live.iter().any(|c| {
                c.cluster == cluster.name
                    && !c.load.is_empty()
                    && c.load.iter().all(|l| l.healthy_workers as usize == workers.len())
            })
        })
    };
    while !whole(&view.live(Instant::now())) {
        if Instant::now() >= deadline {
            let live: Vec<String> = view.live(Instant::now()).into_iter().map(|c| c.cluster).collect();
            anyhow::bail!(
                "the fleet was not whole at the hub within {} s: live {live:?} of {names:?}",
                FEDERATION_READY_WITHIN.as_secs()
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(planned)
}

/// Prints where everything is.
fn print_ready(args: &UpArgs, planned: &[(LocalCluster, Vec<WorkerPorts>)], running: &Running) {
    let (Some(hub), Some(bedrock)) = (&running.hub, &running.bedrock) else { return };
    let what = match args.engine {
        Engine::Sim => "simulated",
        Engine::Vllm => "real vLLM",
    };
    let workers = planned.first().map(|(_, w)| w.len()).unwrap_or(0);
    println!(
        "Switchyard local federation: a hub over {} cluster(s) of {workers} {what} worker(s), each behind a KV-cache-aware spoke.",
        planned.len()
    );
    for ((cluster, workers), spoke) in planned.iter().zip(&running.spokes) {
        println!(
            "  cluster {} (region {}): spoke http://{} (admin http://{})",
            cluster.name, cluster.region, spoke.addr, spoke.admin_addr
        );
        for w in workers {
            println!("    worker-{}  http://127.0.0.1:{}", w.index, w.http);
        }
    }
    let home = planned.first().map(|(c, _)| c.region.as_str()).unwrap_or_default();
    println!(
        "  spillover: local Bedrock endpoint {} (policy cloud-spillover: workers with more than 2 waiting are skipped; pii-tagged requests never spill and stay in {home})",
        bedrock.url()
    );
    let url = format!("http://{}", hub.api_addr);
    let admin = format!("http://{}", hub.admin_addr);
    println!("\nFront door: {url}   (the hub: OpenAI /v1/chat/completions, Anthropic /v1/messages)");
    println!("Admin:      {admin}   (status: {admin}/status, metrics: {admin}/metrics)");
    println!(
        "Try:\n  curl -s {url}/v1/chat/completions -H 'content-type: application/json' \\\n    -d '{{\"model\": \"standard-model\", \"messages\": [{{\"role\": \"user\", \"content\": \"Hello!\"}}], \"max_tokens\": 16}}'\n"
    );
    println!("Ctrl-C stops everything.");
}

/// Starts the local federation and serves until Ctrl-C or SIGTERM.
pub fn run_up(args: &UpArgs) -> anyhow::Result<Exit> {
    let here = std::env::current_dir().unwrap_or_default();
    let exe = std::env::current_exe().unwrap_or_default();
    let tokenizer = find_default_dir(&here)
        .or_else(|| find_default_dir(&exe))
        .context("cannot find tokenizer/files; run from the repository")?;
    let tokenizer = tokenizer.canonicalize().unwrap_or(tokenizer);
    let clusters = args.clusters.unwrap_or(args.engine.defaults().0);
    if !(1..=MAX_CLUSTERS).contains(&clusters) {
        anyhow::bail!("--clusters must be between 1 and {MAX_CLUSTERS}");
    }
    let dir = std::env::temp_dir().join(format!("switchyard-up-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    // Claim the front door's ports before the engines start: a taken port fails at once, not
    // after a minute of engine start-up, and the engines' own ephemeral ports cannot land on
    // it meanwhile. Released just before the hub binds them.
    let claimed = [args.port, args.admin_port]
        .into_iter()
        .map(|port| {
            let addr = SocketAddr::from(([127, 0, 0, 1], port));
            std::net::TcpListener::bind(addr).with_context(|| format!("cannot listen on {addr}"))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().context("starting the async runtime")?;
    let result = rt.block_on(async {
        let mut running = Running::default();
        let started = start(args, &tokenizer, &dir, claimed, &mut running).await;
        if let Ok(planned) = &started {
            print_ready(args, planned, &running);
            crate::signals::wait_for_shutdown().await;
        }
        running.shutdown().await;
        started.map(|_| ())
    });
    let _ = std::fs::remove_dir_all(&dir);
    result?;
    Ok(Exit::Ok)
}
