//! `spoke-agent`: the per-cluster routing agent.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context;
use clap::Parser;
use switchyard_spoke::http::Limits;
use switchyard_spoke::{DEFAULT_LISTEN, DEFAULT_RELOAD_INTERVAL, Spoke, SpokeConfig};

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
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("SWITCHYARD_LOG").unwrap_or_else(|_| "info".into()),
        )
        .init();
    let args = Args::parse();
    let spoke = Spoke::start(SpokeConfig {
        listen: args.listen,
        config_paths: args.config,
        reload_interval: DEFAULT_RELOAD_INTERVAL,
        limits: Limits::default(),
    })
    .await
    .context("starting the spoke")?;
    tracing::info!(addr = %spoke.addr, "spoke listening");
    tokio::signal::ctrl_c().await.context("waiting for Ctrl-C")?;
    spoke.shutdown().await;
    Ok(())
}
