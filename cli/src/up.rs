//! `switchyard spoke` and `switchyard up`.
//!
//! `up` is the one-command local fleet: vLLM workers — simulated by default, real ones with
//! `--engine vllm` — and a spoke in front of them, all on loopback, stopped together on Ctrl-C
//! or SIGTERM.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use anyhow::Context;
use switchyard_sim::wire::WireFormat;
use switchyard_sim::{Fleet, KvEventsConfig, SimConfig, profile};
use switchyard_spoke::cli_args::LimitArgs;
use switchyard_spoke::http::Limits;
use switchyard_spoke::{DEFAULT_RELOAD_INTERVAL, Spoke, SpokeConfig};
use switchyard_tokenizer::find_default_dir;

use crate::Exit;
use crate::loopback_fleet::LoopbackFleet;
use crate::vllm_fleet::{self, VllmFleet, VllmSpec};

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
    #[command(flatten)]
    limits: LimitArgs,
    /// Write the bound addresses as JSON to this file once listening.
    #[arg(long, value_name = "FILE")]
    ready_file: Option<PathBuf>,
}

/// Arguments of `switchyard up`.
#[derive(clap::Args, Debug)]
pub struct UpArgs {
    /// Front-door port on 127.0.0.1.
    #[arg(long, default_value_t = 8080)]
    port: u16,
    /// Admin port (status, metrics, decision traces) on 127.0.0.1.
    #[arg(long, default_value_t = 9090)]
    admin_port: u16,
    /// What runs the workers: the simulator, or real vLLM engines (CPU build; install it with
    /// `e2e/vllm/setup`).
    #[arg(long, value_enum, default_value_t = Engine::Sim)]
    engine: Engine,
    /// Number of workers [default: 3 simulated, 2 real].
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
        })
        .await?;
        println!("spoke listening on http://{} (admin http://{})", spoke.addr, spoke.admin_addr);
        if let Some(path) = &args.ready_file {
            let ready = serde_json::json!({"url": format!("http://{}", spoke.addr), "admin": format!("http://{}", spoke.admin_addr)});
            std::fs::write(path, ready.to_string())
                .with_context(|| format!("writing {}", path.display()))?;
        }
        crate::signals::wait_for_shutdown().await;
        spoke.shutdown().await;
        anyhow::Ok(())
    })?;
    Ok(Exit::Ok)
}

/// A worker of the local fleet, whatever runs it.
struct LocalWorker {
    index: u32,
    http: SocketAddr,
    kv_events: u16,
    kv_replay: u16,
}

/// The local fleet's configuration, as YAML.
fn local_config(engine: Engine, model: &str, tokenizer: &Path, block_size: u32, workers: &[LocalWorker]) -> String {
    let endpoints: Vec<String> = workers
        .iter()
        .map(|w| {
            format!(
                "{{name: worker-{}, host: 127.0.0.1, httpPort: {}, kvEventsPort: {}, kvReplayPort: {}}}",
                w.index,
                w.http.port(),
                w.kv_events,
                w.kv_replay
            )
        })
        .collect();
    let fleet = LoopbackFleet {
        name: "local",
        model,
        endpoints: &endpoints,
        block_size,
        worker_set_spec: &format!(
            "  region: local\n  tokenizer:\n    source: Files\n    path: {}\n",
            tokenizer.display()
        ),
        backend_spec: &format!("  aliases:\n  - {{name: standard-model, targets: [{model}]}}\n"),
    };
    let what = match engine {
        Engine::Sim => "simulated workers",
        Engine::Vllm => "real vLLM workers",
    };
    format!("# Generated by `switchyard up`: {what} on loopback.\n{}", fleet.yaml())
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
                    workers: args.workers.unwrap_or(3),
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
                let count = args.workers.unwrap_or(2);
                println!(
                    "Starting {count} vLLM worker(s); a cold start takes a minute or two (logs in {}).",
                    dir.display()
                );
                let fleet = VllmFleet::start(&spec, count, dir).await?;
                Ok((Workers::Vllm(fleet), vllm_fleet::BLOCK_SIZE))
            }
        }
    }

    fn list(&self) -> Vec<LocalWorker> {
        let port = |ep: &Option<String>| ep.as_deref().and_then(|e| e.rsplit(':').next()?.parse().ok()).unwrap_or(0);
        match self {
            Workers::Sim(f) => f
                .workers
                .iter()
                .map(|w| LocalWorker {
                    index: w.index,
                    http: w.http,
                    kv_events: port(&w.kv_events),
                    kv_replay: port(&w.kv_replay),
                })
                .collect(),
            Workers::Vllm(f) => f
                .workers
                .iter()
                .map(|w| LocalWorker { index: w.index, http: w.http, kv_events: w.kv_events, kv_replay: w.kv_replay })
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

/// Starts the workers and a spoke in front of them.
pub fn run_up(args: &UpArgs) -> anyhow::Result<Exit> {
    let here = std::env::current_dir().unwrap_or_default();
    let exe = std::env::current_exe().unwrap_or_default();
    let tokenizer = find_default_dir(&here)
        .or_else(|| find_default_dir(&exe))
        .context("cannot find tokenizer/files; run from the repository")?;
    let tokenizer = tokenizer.canonicalize().unwrap_or(tokenizer);
    let dir = std::env::temp_dir().join(format!("switchyard-up-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    // Claim the front door's ports before the engines start: a taken port fails at once, not
    // after a minute of engine start-up, and the engines' own ephemeral ports cannot land on
    // it meanwhile. Released just before the spoke binds them.
    let claimed = [args.port, args.admin_port]
        .into_iter()
        .map(|port| {
            let addr = SocketAddr::from(([127, 0, 0, 1], port));
            std::net::TcpListener::bind(addr).with_context(|| format!("cannot listen on {addr}"))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().context("starting the async runtime")?;
    let result = rt.block_on(async {
        let (workers, block_size) = Workers::start(args, &tokenizer, &dir).await?;
        drop(claimed);
        let config_dir = dir.join("config");
        let list = workers.list();
        let written = std::fs::create_dir_all(&config_dir).and_then(|()| {
            std::fs::write(config_dir.join("fleet.yaml"), local_config(args.engine, &args.model, &tokenizer, block_size, &list))
        });
        let spoke = match written.map_err(anyhow::Error::from) {
            Ok(()) => Spoke::start(SpokeConfig {
                listen: SocketAddr::from(([127, 0, 0, 1], args.port)),
                admin_listen: SocketAddr::from(([127, 0, 0, 1], args.admin_port)),
                config_paths: vec![config_dir],
                reload_interval: DEFAULT_RELOAD_INTERVAL,
                limits: Limits::default(),
            })
            .await
            .map_err(anyhow::Error::from),
            Err(e) => Err(e),
        };
        let spoke = match spoke {
            Ok(s) => s,
            Err(e) => {
                workers.shutdown().await;
                return Err(e);
            }
        };
        let url = format!("http://{}", spoke.addr);
        let admin = format!("http://{}", spoke.admin_addr);
        let what = match args.engine {
            Engine::Sim => "simulated",
            Engine::Vllm => "real vLLM",
        };
        println!("Switchyard local fleet: {} {what} worker(s) behind a spoke.", list.len());
        for w in &list {
            println!("  worker-{}  http://{}", w.index, w.http);
        }
        println!("\nFront door: {url}   (OpenAI /v1/chat/completions, Anthropic /v1/messages)");
        println!("Admin:      {admin}   (status: {admin}/status, metrics: {admin}/metrics)");
        println!(
            "Try:\n  curl -s {url}/v1/chat/completions -H 'content-type: application/json' \\\n    -d '{{\"model\": \"standard-model\", \"messages\": [{{\"role\": \"user\", \"content\": \"Hello!\"}}], \"max_tokens\": 16}}'\n"
        );
        println!("Ctrl-C stops everything.");
        crate::signals::wait_for_shutdown().await;
        spoke.shutdown().await;
        workers.shutdown().await;
        anyhow::Ok(())
    });
    let _ = std::fs::remove_dir_all(&dir);
    result?;
    Ok(Exit::Ok)
}
