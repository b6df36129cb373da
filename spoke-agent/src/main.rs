//! `spoke-agent`: the per-cluster routing agent.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context;
use clap::Parser;
use switchyard_spoke::cli_args::LimitArgs;
use switchyard_spoke::{DEFAULT_ADMIN_LISTEN, DEFAULT_LISTEN, DEFAULT_RELOAD_INTERVAL, Spoke, SpokeConfig};

/// mimalloc: the request path allocates many small, short-lived objects, which the system
/// allocator serves slowly (see `spoke-agent/README.md`, measured).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Precise KV-cache-aware routing over one cluster's vLLM workers.
#[derive(Parser, Debug)]
#[command(name = "spoke-agent", version)]
struct Args {
    /// Configuration files or directories (InferenceWorkerSet, InferencePool, InferencePolicy, GatewayBackend).
    #[arg(long, required = true, value_name = "PATH")]
    config: Vec<PathBuf>,
    /// Front-door address.
    #[arg(long, default_value = DEFAULT_LISTEN)]
    listen: SocketAddr,
    /// Admin address (status, metrics, decision traces).
    #[arg(long, default_value = DEFAULT_ADMIN_LISTEN)]
    admin_listen: SocketAddr,
    /// Where Kubernetes Secrets referenced by providers are mounted (`DIR/NAME/KEY`).
    #[arg(long, value_name = "DIR")]
    secrets_dir: Option<PathBuf>,
    #[command(flatten)]
    hub: switchyard_spoke::hub_client::HubArgs,
    #[command(flatten)]
    limits: LimitArgs,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let telemetry = switchyard_spoke::telemetry::init("info");
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().context("starting the async runtime")?;
    let result = rt.block_on(run(args));
    drop(rt);
    telemetry.shutdown();
    result
}

async fn run(args: Args) -> anyhow::Result<()> {
    let limits = args.limits.limits();
    let spoke = Spoke::start(SpokeConfig {
        listen: args.listen,
        admin_listen: args.admin_listen,
        config_paths: args.config,
        reload_interval: DEFAULT_RELOAD_INTERVAL,
        limits,
        secrets_dir: args.secrets_dir,
        hub: args.hub.link(),
    })
    .await
    .context("starting the spoke")?;
    tracing::info!(addr = %spoke.addr, admin = %spoke.admin_addr, "spoke listening");
    shutdown_signal().await;
    tracing::info!("shutting down: draining in-flight requests");
    spoke.shutdown().await;
    Ok(())
}

/// Ctrl-C or SIGTERM (what Kubernetes sends before killing a pod).
async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        if let Ok(mut term) = signal(SignalKind::terminate()) {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
            return;
        }
    }
    let _ = tokio::signal::ctrl_c().await;
}
