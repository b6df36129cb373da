//! `spoke-agent`: the per-cluster routing agent.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use switchyard_spoke::http::Limits;
use switchyard_spoke::{DEFAULT_ADMIN_LISTEN, DEFAULT_LISTEN, DEFAULT_RELOAD_INTERVAL, Spoke, SpokeConfig};

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
    /// Requests in flight at most; beyond it requests get 503 (OpenAI) / 529 (Anthropic).
    #[arg(long, default_value_t = 1024)]
    max_concurrent: usize,
    /// Largest request body, bytes.
    #[arg(long, default_value_t = 32 * 1024 * 1024)]
    max_body_bytes: usize,
    /// Seconds in-flight streams may run after SIGTERM before they are ended.
    #[arg(long, default_value_t = 30)]
    drain_seconds: u64,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("SWITCHYARD_LOG").unwrap_or_else(|_| "info".into()),
        )
        .init();
    let args = Args::parse();
    let mut limits = Limits::default();
    limits.front.max_concurrent = args.max_concurrent;
    limits.front.max_body_bytes = args.max_body_bytes;
    limits.serve.drain = Duration::from_secs(args.drain_seconds);
    let spoke = Spoke::start(SpokeConfig {
        listen: args.listen,
        admin_listen: args.admin_listen,
        config_paths: args.config,
        reload_interval: DEFAULT_RELOAD_INTERVAL,
        limits,
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
