//! `switchyard hub` (run the hub) and `switchyard certs` (a development CA and the
//! federation's certificates).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use switchyard_hub::route::ClusterChoice;
use switchyard_hub::{Hub, HubConfig};
use switchyard_proto::tls::TlsFiles;

use crate::Exit;

/// Arguments of `switchyard hub`.
#[derive(clap::Args, Debug)]
pub struct HubArgs {
    /// Fleet configuration files or directories (every cluster's worker sets, pools, public
    /// models, aliases, policies).
    #[arg(long, value_name = "PATH")]
    config: Vec<PathBuf>,
    /// Front-door address (OpenAI and Anthropic APIs).
    #[arg(long, default_value = switchyard_hub::DEFAULT_API_LISTEN)]
    api_listen: SocketAddr,
    /// Federation (gRPC over mutual TLS) address spokes dial.
    #[arg(long, default_value = switchyard_hub::DEFAULT_LISTEN)]
    listen: SocketAddr,
    /// Admin address (status, metrics).
    #[arg(long, default_value = switchyard_hub::DEFAULT_ADMIN_LISTEN)]
    admin_listen: SocketAddr,
    /// Directory with the hub's `tls.crt`, `tls.key` and the spokes' `ca.crt` (a mounted
    /// cert-manager Secret); files are reloaded when they change.
    #[arg(long, value_name = "DIR")]
    tls_dir: PathBuf,
    /// This replica's name.
    #[arg(long, default_value = "hub")]
    name: String,
    /// Milliseconds between a spoke's load reports.
    #[arg(long, default_value_t = switchyard_hub::DEFAULT_LOAD_INTERVAL.as_millis() as u64)]
    load_interval_ms: u64,
    /// Milliseconds without a report after which a cluster is not chosen.
    #[arg(long, default_value_t = switchyard_hub::DEFAULT_LOST_AFTER.as_millis() as u64)]
    lost_after_ms: u64,
    /// Where Kubernetes Secrets referenced by providers are mounted (`DIR/NAME/KEY`).
    #[arg(long, value_name = "DIR")]
    secrets_dir: Option<PathBuf>,
    /// Seconds a queued batch request waits for capacity before it is refused.
    #[arg(long, default_value_t = switchyard_hub::DEFAULT_BATCH_MAX_WAIT.as_secs())]
    batch_max_wait_seconds: u64,
    /// Write the bound addresses as JSON to this file once listening.
    #[arg(long, value_name = "FILE")]
    ready_file: Option<PathBuf>,
    /// How clusters are chosen: by the policy engine with each cluster's cached prefix
    /// (cache-aware), or one of the federation benchmark's baselines.
    #[arg(long, value_enum, default_value_t = ClusterChoiceArg::CacheAware)]
    cluster_choice: ClusterChoiceArg,
}

/// `--cluster-choice`.
#[derive(clap::ValueEnum, Clone, Copy, Debug)]
enum ClusterChoiceArg {
    /// Predicted TTFT with the cross-cluster prefix index.
    CacheAware,
    /// Predicted TTFT from load alone (baseline).
    LeastLoaded,
    /// Uniformly among the admitted clusters (baseline).
    Random,
}

impl From<ClusterChoiceArg> for ClusterChoice {
    fn from(a: ClusterChoiceArg) -> ClusterChoice {
        match a {
            ClusterChoiceArg::CacheAware => ClusterChoice::CacheAware,
            ClusterChoiceArg::LeastLoaded => ClusterChoice::LeastLoaded,
            ClusterChoiceArg::Random => ClusterChoice::Random,
        }
    }
}

/// Runs the hub until Ctrl-C or SIGTERM.
pub fn run_hub(args: &HubArgs) -> anyhow::Result<Exit> {
    if args.load_interval_ms == 0 || args.lost_after_ms <= args.load_interval_ms {
        anyhow::bail!("--lost-after-ms must exceed --load-interval-ms, which must be positive");
    }
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().context("starting the async runtime")?;
    rt.block_on(async {
        let hub = Hub::start(HubConfig {
            name: args.name.clone(),
            api_listen: args.api_listen,
            config_paths: args.config.clone(),
            front: switchyard_gateway::server::Limits::default(),
            listen: args.listen,
            admin_listen: args.admin_listen,
            tls: TlsFiles::in_dir(&args.tls_dir),
            load_interval: Duration::from_millis(args.load_interval_ms),
            lost_after: Duration::from_millis(args.lost_after_ms),
            cert_reload_interval: switchyard_hub::CERT_RELOAD_INTERVAL,
            batch_max_wait: Duration::from_secs(args.batch_max_wait_seconds),
            secrets_dir: args.secrets_dir.clone(),
            cluster_choice: args.cluster_choice.into(),
        })
        .await?;
        println!(
            "hub listening on http://{} (federation https://{}, admin http://{})",
            hub.api_addr, hub.addr, hub.admin_addr
        );
        if let Some(path) = &args.ready_file {
            let ready = serde_json::json!({
                "url": format!("http://{}", hub.api_addr),
                "federation": format!("https://{}", hub.addr),
                "admin": format!("http://{}", hub.admin_addr),
            });
            crate::ready::write(path, &ready)?;
        }
        crate::signals::wait_for_shutdown().await;
        hub.shutdown().await;
        Ok(Exit::Ok)
    })
}

/// Arguments of `switchyard certs`.
#[derive(clap::Args, Debug)]
pub struct CertsArgs {
    /// Output directory: `ca/`, `hub/` and `clusters/<name>/` (an existing `ca/` is reused).
    #[arg(long, value_name = "DIR")]
    out: PathBuf,
    /// A cluster to issue a client certificate for (repeat for several).
    #[arg(long = "cluster", value_name = "NAME")]
    clusters: Vec<String>,
    /// A DNS name or IP address the hub's certificate covers (repeat for several).
    #[arg(long = "hub-host", value_name = "HOST", default_values_t = ["localhost".to_string(), "127.0.0.1".to_string()])]
    hub_hosts: Vec<String>,
}

/// Writes the development CA and certificates.
pub fn run_certs(args: &CertsArgs) -> anyhow::Result<Exit> {
    let issued = switchyard_proto::dev_certs::generate(&args.out, &args.hub_hosts, &args.clusters)?;
    let verb = if issued.ca_created { "created" } else { "reused" };
    println!("CA {verb}: {}", issued.ca_cert.display());
    println!("hub: {} (for {})", issued.hub.cert.display(), args.hub_hosts.join(", "));
    for (cluster, files) in &issued.clusters {
        println!("cluster {cluster}: {}", files.cert.display());
    }
    Ok(Exit::Ok)
}
